//! x86-64's side of the conversion: its DWARF register numbers, where its return address is,
//! and the two DWARF expressions the BPF walk knows (the `.plt`'s CFA, and the signal
//! trampoline's registers in the `ucontext`), recognised by their exact operations. arm64's
//! twin (`aarch64.rs`) will name its registers (sp 31, x29, x30) and its own rows.

use gimli::{Expression, Operation, Register, RegisterRule, UnwindExpression};

use super::{operations, Slice};
use crate::unwind::row::Cfa;

/// DWARF register numbers (System V psABI, "DWARF Register Number Mapping"): rbp, the frame
/// pointer, and rsp, the stack pointer.
pub(super) const FP: Register = Register(6);
pub(super) const SP: Register = Register(7);
/// The return address column (rip).
pub(super) const RA: Register = Register(16);

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
