//! x86-64's side of the conversion: its DWARF register numbers, where its return address is,
//! and the two DWARF expressions the BPF walk knows (the `.plt`'s CFA, and the signal
//! trampoline's registers in the `ucontext`), recognised by their exact operations. arm64's
//! twin is `aarch64.rs`.

use gimli::{
    CfaRule, Expression, Operation, Register, RegisterRule, UnwindExpression, UnwindSection,
    UnwindTableRow,
};

use super::{operations, RuleStorage, Slice};
use crate::unwind::row::{Cfa, FpRule, RaKind};

/// DWARF register numbers (System V psABI, "DWARF Register Number Mapping"): rbp, the frame
/// pointer, and rsp, the stack pointer.
pub(super) const FP: Register = Register(6);
pub(super) const SP: Register = Register(7);
/// The return address column (rip).
pub(super) const RA: Register = Register(16);

/// The CFA and rbp rules of one DWARF row; the return address is always at CFA - 8 (or
/// in a signal frame's `ucontext`).
pub(super) fn rule_of<'data, S>(
    dwarf_row: &UnwindTableRow<usize, RuleStorage>,
    section: &S,
    encoding: gimli::Encoding,
    signal: bool,
    ra_is_rip: bool,
) -> (Cfa, FpRule, RaKind)
where
    S: UnwindSection<Slice<'data>>,
{
    let expression = |expression: &gimli::UnwindExpression<usize>| expression.get(section).ok();
    let ra = dwarf_row.register(RA);
    let cfa = match dwarf_row.cfa() {
        CfaRule::RegisterAndOffset {
            register: SP,
            offset,
        } => Cfa::Sp(*offset),
        CfaRule::RegisterAndOffset {
            register: FP,
            offset,
        } => Cfa::Fp(*offset),
        CfaRule::RegisterAndOffset { .. } => Cfa::Unsupported,
        CfaRule::Expression(cfa) => match expression(cfa) {
            Some(cfa) if signal => signal_cfa(cfa, encoding).unwrap_or(Cfa::Unsupported),
            Some(cfa) => plt_cfa(cfa, encoding).unwrap_or(Cfa::Unsupported),
            None => Cfa::Unsupported,
        },
    };
    // The BPF side reads the return address where these kinds put it; a row that keeps it
    // anywhere else (`setcontext`'s, `__start_context`'s) is one it cannot unwind. An
    // undefined one ends the walk (below), and the CFA stays as DWARF gives it.
    let ra_where_expected = ra == RegisterRule::Undefined
        || ra_is_rip && return_address_where_read(&ra, cfa, expression, encoding);
    let cfa = if ra_where_expected {
        cfa
    } else {
        Cfa::Unsupported
    };
    let rbp = match dwarf_row.register(FP) {
        // gimli reports a register without a rule as undefined; rbp is callee-saved, so no
        // rule means the caller's value is still in it.
        RegisterRule::Undefined | RegisterRule::SameValue => FpRule::Unchanged,
        RegisterRule::Offset(offset) => FpRule::CfaOffset(offset),
        RegisterRule::Expression(at) => {
            match expression(&at).and_then(|at| sp_offset(at, encoding)) {
                Some(offset) => FpRule::AtSp(offset),
                None => FpRule::Unsupported,
            }
        }
        _ => FpRule::Unsupported,
    };
    // Checked first by the unwinder: the outermost frame ends the walk, whatever else it says.
    let rbp = if ra == RegisterRule::Undefined {
        FpRule::ReturnAddressUndefined
    } else {
        rbp
    };
    (cfa, rbp, RaKind::CfaMinus8)
}

/// Whether the return address `ra` is where the BPF walk reads it for `cfa`: at CFA - 8
/// (`RaKind::CfaMinus8`, where `call` pushed it), or for a signal frame, in the `ucontext`
/// right after the interrupted rsp. `expression` reads a rule's expression.
pub(super) fn return_address_where_read<'data>(
    ra: &RegisterRule<usize>,
    cfa: Cfa,
    expression: impl Fn(&UnwindExpression<usize>) -> Option<Expression<Slice<'data>>>,
    encoding: gimli::Encoding,
) -> bool {
    match cfa {
        Cfa::Signal { rsp_at } => match ra {
            RegisterRule::Expression(ra) => expression(ra)
                .and_then(|ra| sp_offset(ra, encoding))
                .is_some_and(|at| Some(at) == rsp_at.checked_add(8)),
            _ => false,
        },
        _ => *ra == RegisterRule::Offset(-8),
    }
}

/// `DW_OP_breg7 (rsp) N` alone: the address rsp + N.
pub(super) fn sp_offset(
    expression: Expression<Slice<'_>>,
    encoding: gimli::Encoding,
) -> Option<i64> {
    match operations(expression, encoding)?.as_slice() {
        [Operation::RegisterOffset {
            register: SP,
            offset,
            ..
        }] => Some(*offset),
        _ => None,
    }
}

/// The CFA of a signal trampoline: `DW_OP_breg7 (rsp) N; DW_OP_deref`, the interrupted rsp
/// that the kernel saved in the `ucontext` on the stack.
pub(super) fn signal_cfa(
    expression: Expression<Slice<'_>>,
    encoding: gimli::Encoding,
) -> Option<Cfa> {
    match operations(expression, encoding)?.as_slice() {
        [Operation::RegisterOffset {
            register: SP,
            offset,
            ..
        }, Operation::Deref {
            size: 8,
            space: false,
            ..
        }] => Some(Cfa::Signal { rsp_at: *offset }),
        _ => None,
    }
}

/// The CFA the linker gives a whole `.plt`:
/// `DW_OP_breg7 (rsp) N; DW_OP_breg16 (rip) 0; DW_OP_lit15; DW_OP_and; DW_OP_litK; DW_OP_ge;
/// DW_OP_lit3; DW_OP_shl; DW_OP_plus`, that is rsp + N, plus 8 from byte K of each 16-byte
/// stub on, once the stub has pushed its relocation index (K is 11 in the classic layout).
pub(super) fn plt_cfa(expression: Expression<Slice<'_>>, encoding: gimli::Encoding) -> Option<Cfa> {
    match operations(expression, encoding)?.as_slice() {
        [Operation::RegisterOffset {
            register: SP,
            offset: base,
            ..
        }, Operation::RegisterOffset {
            register: RA,
            offset: 0,
            ..
        }, Operation::UnsignedConstant { value: 15 }, Operation::And, Operation::UnsignedConstant { value: threshold }, Operation::Ge, Operation::UnsignedConstant { value: 3 }, Operation::Shl, Operation::Plus] => {
            Some(Cfa::Plt {
                base: *base,
                threshold: *threshold,
            })
        }
        _ => None,
    }
}

/// A Go function's rule where it has moved rsp `delta` bytes below its entry (its `pcsp`
/// table): the CFA is rsp plus the delta plus the return address's 8 bytes. Once the function
/// has a frame, its caller's rbp is saved just below the return address (`PUSHQ BP` since Go
/// 1.21, `MOVQ BP, framesize-8(SP)` before): at CFA - 16. A function that has not moved rsp
/// has not touched rbp.
pub(super) fn go_frame(delta: i32) -> (Cfa, FpRule) {
    if delta < 0 {
        return (Cfa::Unsupported, FpRule::Unsupported);
    }
    let cfa = Cfa::Sp(i64::from(delta) + 8);
    let rbp = if delta >= 8 {
        FpRule::CfaOffset(-16)
    } else {
        FpRule::Unchanged
    };
    (cfa, rbp)
}

/// The rule of a Go function at the bottom of a stack: at its entry, no caller.
pub(in crate::unwind) fn go_stack_bottom() -> (Cfa, FpRule) {
    (Cfa::Sp(8), FpRule::ReturnAddressUndefined)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_deltas_become_rsp_rules_with_the_saved_rbp_below_the_return_address() {
        assert_eq!(go_frame(0), (Cfa::Sp(8), FpRule::Unchanged));
        assert_eq!(go_frame(8), (Cfa::Sp(16), FpRule::CfaOffset(-16)));
        assert_eq!(go_frame(0x58), (Cfa::Sp(0x60), FpRule::CfaOffset(-16)));
        assert_eq!(go_frame(-8), (Cfa::Unsupported, FpRule::Unsupported));
    }
}
