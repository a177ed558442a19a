//! x86-64: rip, rsp and rbp; the privilege level in the saved CS; the kernel's `rt_sigframe`;
//! the PLT's push.

use aya_ebpf::{bindings::pt_regs, programs::PerfEventContext};

use crate::shared::stack::UserRegs;

/// Whether saved registers are user mode's: the low two bits of CS are the privilege level.
#[inline(always)]
fn is_user(regs: &pt_regs) -> bool {
    // SAFETY: a plain read of a field of a valid reference; volatile as in `user_regs`.
    (unsafe { core::ptr::read_volatile(&regs.cs) }) & 3 == 3
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
        pc: regs.rip,
        sp: regs.rsp,
        fp: regs.rbp,
        bcp: regs.r13,
        lr: 0,
    }
}

/// A task's saved registers, when they are user mode's (a kernel thread's are not).
///
/// Volatile reads: `regs` is a map value and [`sample_regs`]' a context, and the compiler
/// would merge the two's loads of the same offsets into one instruction, which the verifier
/// refuses ("same insn cannot be used with different pointers").
#[inline(always)]
pub fn user_regs(regs: &pt_regs) -> Option<UserRegs> {
    // SAFETY: plain reads of fields of a valid reference.
    let read = |field: &u64| unsafe { core::ptr::read_volatile(field) };
    is_user(regs).then(|| UserRegs {
        pc: read(&regs.rip),
        sp: read(&regs.rsp),
        fp: read(&regs.rbp),
        bcp: read(&regs.r13),
        lr: 0,
    })
}

/// x86-64 has no link register: `call` pushes the return address, and no row keeps it in a
/// register (`RaKind::LinkRegister`, the frame-record kinds).
pub const LINK_REGISTER: bool = false;

/// A return address read from a frame: x86-64 signs none.
#[inline(always)]
pub const fn return_address(address: u64) -> u64 {
    address
}

/// Where a signal trampoline's frame keeps the interrupted stack pointer and pc, from the
/// stack pointer plus the row's offset (which points at `uc_mcontext`'s rsp): rip follows
/// rsp in `struct sigcontext`.
#[inline(always)]
pub const fn signal_frame(sp: u64, offset: u64) -> (u64, u64) {
    let at = sp.wrapping_add(offset);
    (at, at.wrapping_add(8))
}

/// Where the signal frame keeps the interrupted link register, from [`signal_frame`]'s sp
/// slot: x86-64 has none ([`LINK_REGISTER`] is false, so this is never read).
#[inline(always)]
pub const fn signal_link_register(sp_at: u64) -> u64 {
    sp_at
}

/// The CFA in a PLT stub: the stub pushes once, at a fixed place in its 16 bytes, from
/// `threshold` on (`CfaKind::Plt`).
#[inline(always)]
pub const fn plt_cfa(sp: u64, offset: u64, pc: u64, threshold: i8) -> u64 {
    let pushed = (pc & 15) >= threshold as u64;
    sp.wrapping_add(offset)
        .wrapping_add(if pushed { 8 } else { 0 })
}
