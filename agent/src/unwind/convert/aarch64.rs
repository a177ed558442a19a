//! arm64's side of the conversion: its DWARF register numbers, its rules (the frame record,
//! the return address still in x30), and the rows it needs where no CFI is: the `.plt` and the
//! vDSO's signal trampoline.
//!
//! An arm64 prologue saves x29 and x30 as a pair, the frame record, most often at the bottom
//! of the frame (`stp x29, x30, [sp, #-N]!`): its rows say where the record is
//! ([`FpRule::Record`]), not "the return address at CFA - 8" as on x86-64. Before the
//! prologue, in a leaf that never saves x30 and in a PLT stub, the return address is still in
//! x30 ([`RaKind::LinkRegister`]). The pointer-authentication state a signed prologue records
//! (`DW_CFA_AARCH64_negate_ra_state`) is ignored: the BPF walk strips the code from every
//! return address it reads.

use gimli::{
    BaseAddresses, CallFrameInstruction, CfaRule, FrameDescriptionEntry, Register, RegisterRule,
    UnwindSection, UnwindTableRow,
};
use object::{Object, ObjectSection, ObjectSymbol};

use super::{Generated, RuleStorage, Slice};
use crate::unwind::{
    row::{self, Cfa, FpRule, RaKind},
    Code,
};

/// DWARF register numbers (AArch64 DWARF ABI, "DWARF register names"): x29, the frame
/// pointer; x30, the link register and the return address column; sp.
pub(super) const FP: Register = Register(29);
pub(super) const LR: Register = Register(30);
pub(super) const SP: Register = Register(31);

/// Where the kernel's `rt_sigframe` keeps the interrupted registers, from the stack pointer
/// at the signal trampoline (`&frame->info`): `siginfo` (128 bytes), then the `ucontext`,
/// whose `uc_mcontext` (a `struct sigcontext`: `fault_address`, `regs[31]`, `sp`, `pc`) is
/// 176 bytes in. arch/arm64/include/uapi/asm/sigcontext.h and ucontext.h.
const SIGCONTEXT_REGS: i64 = 128 + 176 + 8;
/// The interrupted sp (`regs[31]` is sp's slot; pc follows it, as the walk expects).
const SIGNAL_SP: i64 = SIGCONTEXT_REGS + 31 * 8;
/// The interrupted x29.
const SIGNAL_FP: i64 = SIGCONTEXT_REGS + 29 * 8;

/// The rule of one DWARF row: the CFA from sp or x29; x29 and x30 as a frame record, x30
/// alone, or x30 not saved (still in the link register). `return_address` is the CIE's
/// return address column (x30 in every toolchain's output); `outermost` says the FDE made
/// x30 undefined at or before this row ([`outermost_from`]).
pub(super) fn rule_of(
    dwarf_row: &UnwindTableRow<usize, RuleStorage>,
    return_address: Register,
    outermost: bool,
) -> (Cfa, FpRule, RaKind) {
    let cfa = match dwarf_row.cfa() {
        CfaRule::RegisterAndOffset {
            register: SP,
            offset,
        } => Cfa::Sp(*offset),
        CfaRule::RegisterAndOffset {
            register: FP,
            offset,
        } => Cfa::Fp(*offset),
        _ => Cfa::Unsupported,
    };
    if return_address != LR {
        return (Cfa::Unsupported, FpRule::Unsupported, RaKind::CfaMinus8);
    }
    // gimli reports a register without a rule as undefined: x29 and x30 are callee-saved, so
    // no rule means the value is still in the register.
    let unsaved = |rule: &RegisterRule<usize>| {
        matches!(rule, RegisterRule::Undefined | RegisterRule::SameValue)
    };
    let (fp, ra) = (dwarf_row.register(FP), dwarf_row.register(LR));
    if outermost && ra == RegisterRule::Undefined {
        return (cfa, FpRule::ReturnAddressUndefined, RaKind::CfaMinus8);
    }
    match (fp, ra) {
        (fp, ra) if unsaved(&fp) && unsaved(&ra) => (cfa, FpRule::Unchanged, RaKind::LinkRegister),
        (RegisterRule::Offset(fp), RegisterRule::Offset(ra)) if fp.checked_add(8) == Some(ra) => {
            (cfa, FpRule::Record(fp), RaKind::CfaMinus8)
        }
        (fp, RegisterRule::Offset(ra)) if unsaved(&fp) => {
            (cfa, FpRule::ReturnAddressAt(ra), RaKind::CfaMinus8)
        }
        _ => (Cfa::Unsupported, FpRule::Unsupported, RaKind::CfaMinus8),
    }
}

/// A Go function's rule where it has moved sp `delta` bytes below its entry (its `pcsp`
/// table). Go's arm64 prologue stores x30 at the new sp (`MOVD.W R30, -size(RSP)`) and x29
/// just below it: a frame record at sp - 8, the CFA at sp + delta. A function that has not
/// moved sp has saved nothing: its return address is still in x30.
pub(super) fn go_frame(delta: i32) -> (Cfa, FpRule, RaKind) {
    match delta {
        0 => (Cfa::Sp(0), FpRule::Unchanged, RaKind::LinkRegister),
        1.. => {
            let delta = i64::from(delta);
            (
                Cfa::Sp(delta),
                FpRule::Record(-delta - 8),
                RaKind::CfaMinus8,
            )
        }
        _ => (Cfa::Unsupported, FpRule::Unsupported, RaKind::CfaMinus8),
    }
}

/// Most CFI instructions read from one FDE looking for [`outermost_from`]: an FDE's program
/// is as long as its section allows, and a thread's first function is short.
const MAX_INSTRUCTIONS: usize = 4096;

/// The first address from which `fde` (or its CIE) makes x30 undefined
/// (`.cfi_undefined x30`, the outermost frame of a thread: glibc's `thread_start` and
/// `_start`). gimli keeps no rule for an undefined register, as for one never saved, so the
/// two are told apart here, by the instruction itself.
pub(super) fn outermost_from<'data, S>(
    fde: &FrameDescriptionEntry<Slice<'data>>,
    section: &S,
    bases: &BaseAddresses,
) -> Option<u64>
where
    S: UnwindSection<Slice<'data>>,
{
    let undefines = |instruction: &CallFrameInstruction<usize>| {
        matches!(
            instruction,
            CallFrameInstruction::Undefined { register: LR }
        )
    };
    let cie = fde.cie();
    let mut initial = cie.instructions(section, bases);
    for _ in 0..MAX_INSTRUCTIONS {
        match initial.next() {
            Ok(Some(instruction)) if undefines(&instruction) => return Some(fde.initial_address()),
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    let alignment = cie.code_alignment_factor();
    let mut address = fde.initial_address();
    let mut instructions = fde.instructions(section, bases);
    for _ in 0..MAX_INSTRUCTIONS {
        match instructions.next() {
            Ok(Some(CallFrameInstruction::AdvanceLoc { delta })) => {
                address = address.wrapping_add(u64::from(delta).wrapping_mul(alignment));
            }
            Ok(Some(CallFrameInstruction::SetLoc { address: at })) => address = at,
            Ok(Some(instruction)) if undefines(&instruction) => return Some(address),
            Ok(Some(_)) => {}
            _ => return None,
        }
    }
    None
}

/// The rows of code without CFI whose rule is known:
/// - each `.plt` stub jumps through x16 and x17 and touches neither sp nor x29 nor x30: the
///   CFA is sp, the return address in x30 (the linker writes no FDE for it, unlike x86-64's);
/// - the vDSO's `__kernel_rt_sigreturn`, where a signal handler returns to (glibc sets no
///   restorer on arm64), has no CFI either: the Debian kernels' vDSO carries no `.eh_frame`.
///   Its row reads the interrupted registers from the `rt_sigframe`, from the `nop` before it
///   on (a return address is looked up at pc - 1).
pub(super) fn generated(file: &object::File<'_>, code: &Code) -> Vec<Generated> {
    let mut generated = Vec::new();
    let mut add = |start: u64, end: u64, cfa: Cfa, fp: FpRule, ra: RaKind| {
        if start < end && code.covers(start, end) {
            let (start, end) = (code.pc(start), code.pc(end));
            generated.push(Generated {
                start,
                end,
                rows: vec![row::narrow(start, cfa, fp, ra), row::no_row(end)],
            });
        }
    };
    for plt in file.sections().filter(|s| s.name() == Ok(".plt")) {
        let (start, size) = (plt.address(), plt.size());
        add(
            start,
            start.saturating_add(size),
            Cfa::Sp(0),
            FpRule::Unchanged,
            RaKind::LinkRegister,
        );
    }
    let sigreturn = file
        .dynamic_symbols()
        .chain(file.symbols())
        .find(|symbol| symbol.name() == Ok("__kernel_rt_sigreturn"));
    if let Some(symbol) = sigreturn {
        // `mov x8, #139; svc #0`: 8 bytes, whatever size the symbol says.
        let start = symbol.address();
        add(
            start.saturating_sub(4),
            start.saturating_add(8),
            Cfa::Signal { rsp_at: SIGNAL_SP },
            FpRule::AtSp(SIGNAL_FP),
            RaKind::CfaMinus8,
        );
    }
    generated
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unwind::row::FpKind;

    #[test]
    fn go_frames_keep_their_record_just_below_the_return_address() {
        assert_eq!(
            go_frame(0),
            (Cfa::Sp(0), FpRule::Unchanged, RaKind::LinkRegister)
        );
        assert_eq!(
            go_frame(32),
            (Cfa::Sp(32), FpRule::Record(-40), RaKind::CfaMinus8)
        );
        let (cfa, fp, ra) = go_frame(32);
        let row = row::narrow(0, cfa, fp, ra);
        assert_eq!((row.fp_kind(), row.fp_offset), (FpKind::Record, -5));
        // A large frame: the record is one word below sp, the CFA's register.
        let (cfa, fp, ra) = go_frame(4096);
        let row = row::narrow(0, cfa, fp, ra);
        assert_eq!((row.fp_kind(), row.fp_offset), (FpKind::RecordFromBase, -1));
        assert_eq!(go_frame(-8).0, Cfa::Unsupported);
    }

    #[test]
    fn the_signal_frame_s_registers() {
        // OTel and the kernel agree: `regs[0]` is 312 bytes above sp at the trampoline.
        assert_eq!(SIGCONTEXT_REGS, 312);
        assert_eq!((SIGNAL_FP, SIGNAL_SP), (544, 560));
    }
}
