//! arm64 (AArch64): pc, sp and x29 of `user_pt_regs`; the exception level in `pstate`; the
//! pointer-authentication bits of a return address; the kernel's `rt_sigframe`.
//!
//! The frame record `{x29, x30}` that x29 points at is read as x86-64's `{rbp, return
//! address}`: the frame-pointer step is the same. What differs in the rows (the return
//! address still in x30, the record anywhere in the frame) has kinds of its own
//! (`FpKind::Record`, `RaKind::LinkRegister`), which the walk reads when [`LINK_REGISTER`].

use aya_ebpf::{bindings::pt_regs, programs::PerfEventContext};

use crate::shared::stack::UserRegs;

/// `pstate`'s mode field, and the mode of a task at EL0 using SP_EL0 (`PSR_MODE_EL0t`).
const PSR_MODE_MASK: u64 = 0xf;
const PSR_MODE_EL0T: u64 = 0;
/// `pstate`: an AArch32 task (a 32-bit compat process), whose registers are not these.
const PSR_MODE32_BIT: u64 = 0x10;

/// The bits of a user return address below its pointer-authentication code, set by the
/// agent from the running kernel's mask (`NT_ARM_PAC_MASK`): the code sits above the user
/// address, from bit 48 or 52 (the kernel's address size) to 54. The kernel's own
/// frame-pointer walk strips the same bits (`ptrauth_strip_user_insn_pac`). Unset, the 48
/// bits every kernel gives user space unless a process asks `mmap` for more.
#[unsafe(no_mangle)]
static RETURN_ADDRESS_MASK: u64 = (1 << 48) - 1;

/// The frame pointer, x29, the link register, x30, and HotSpot's bytecode pointer register,
/// x22 (`rbcp`).
const FP: usize = 29;
const LR: usize = 30;
const BCP: usize = 22;

/// arm64's `bl` leaves the return address in x30: rows may say it is still there.
pub const LINK_REGISTER: bool = true;

/// Whether saved registers are user mode's (EL0, AArch64). A kernel thread's saved
/// `pstate` says EL1.
#[inline(always)]
fn is_user(regs: &pt_regs) -> bool {
    // SAFETY: a plain read of a field of a valid reference; volatile as in `user_regs`.
    let pstate = unsafe { core::ptr::read_volatile(&regs.pstate) };
    pstate & (PSR_MODE_MASK | PSR_MODE32_BIT) == PSR_MODE_EL0T
}

/// True when the sample interrupted user mode.
#[inline(always)]
pub fn interrupted_user_mode(ctx: &PerfEventContext) -> bool {
    // SAFETY: `ctx.ctx` is the kernel's bpf_perf_event_data for this run; perf_event
    // programs may read the saved registers.
    is_user(unsafe { &(*ctx.ctx).regs })
}

/// The registers the sample interrupted (user mode's, when [`interrupted_user_mode`]).
#[inline(always)]
pub fn sample_regs(ctx: &PerfEventContext) -> UserRegs {
    // SAFETY: as above.
    let regs = unsafe { &(*ctx.ctx).regs };
    UserRegs {
        pc: regs.pc,
        sp: regs.sp,
        fp: regs.regs[FP],
        bcp: regs.regs[BCP],
        lr: regs.regs[LR],
    }
}

/// A task's saved registers, when they are user mode's (a kernel thread's are not). The
/// kernel's `struct pt_regs` starts with `user_pt_regs`, which is all that is read.
///
/// Volatile reads: `regs` is a map value and [`sample_regs`]' a context, and the compiler
/// would merge the two's loads of the same offsets into one instruction, which the verifier
/// refuses ("same insn cannot be used with different pointers").
#[inline(always)]
pub fn user_regs(regs: &pt_regs) -> Option<UserRegs> {
    // SAFETY: plain reads of fields of a valid reference.
    let read = |field: &u64| unsafe { core::ptr::read_volatile(field) };
    is_user(regs).then(|| UserRegs {
        pc: read(&regs.pc),
        sp: read(&regs.sp),
        fp: read(&regs.regs[FP]),
        bcp: read(&regs.regs[BCP]),
        lr: read(&regs.regs[LR]),
    })
}

/// A return address read from a frame, without the pointer-authentication code a function
/// built with `-mbranch-protection` signed it with (`paciasp`).
#[inline(always)]
pub fn return_address(address: u64) -> u64 {
    // SAFETY: a plain value the agent set before load (read volatile: the loader rewrites it).
    address & unsafe { core::ptr::read_volatile(&RETURN_ADDRESS_MASK) }
}

/// Where the signal frame keeps the interrupted sp and pc, from the stack pointer plus the
/// row's offset (which points at `uc_mcontext`'s sp): pc follows sp in `struct sigcontext`
/// (`regs[31]`, `sp`, `pc`), as on x86-64 rip follows rsp.
#[inline(always)]
pub const fn signal_frame(sp: u64, offset: u64) -> (u64, u64) {
    let at = sp.wrapping_add(offset);
    (at, at.wrapping_add(8))
}

/// Where the signal frame keeps the interrupted x30, from [`signal_frame`]'s sp slot: it is
/// `regs[30]`, just below.
#[inline(always)]
pub const fn signal_link_register(sp_at: u64) -> u64 {
    sp_at.wrapping_sub(8)
}

/// arm64's PLT stubs push nothing (they jump through x16 and x17): the CFA stays at
/// `sp + offset`.
#[inline(always)]
pub const fn plt_cfa(sp: u64, offset: u64, _pc: u64, _threshold: i8) -> u64 {
    sp.wrapping_add(offset)
}
