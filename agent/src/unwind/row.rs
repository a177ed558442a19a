//! The rows a table is made of. [`UnwindRow`] itself is shared with the BPF program and lives
//! in `scorch_common`, where its byte layout is documented; this file narrows DWARF's rules,
//! whose offsets are any i64, into it, and decides what does not fit.

pub use scorch_common::{CfaKind, RbpKind, UnwindRow};

/// How to find the CFA, as DWARF said it, before it is narrowed into a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Cfa {
    Rsp(i64),
    Rbp(i64),
    /// The `.plt` expression: rsp + `base`, plus 8 once `rip & 15` reaches `threshold`.
    Plt {
        base: i64,
        threshold: u64,
    },
    /// A signal trampoline: the interrupted rsp is saved at rsp + `rsp_at`, rip just after it.
    Signal {
        rsp_at: i64,
    },
    Unsupported,
}

/// Where the caller's rbp is, as DWARF said it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Rbp {
    Unchanged,
    CfaOffset(i64),
    AtRsp(i64),
    Unsupported,
    ReturnAddressUndefined,
}

/// The row for `pc` (an offset from the table's base). A rule whose numbers do not fit the
/// row's fields becomes unsupported: the BPF side stops there instead of going wrong.
pub(super) fn narrow(pc: u32, cfa: Cfa, rbp: Rbp) -> UnwindRow {
    let (cfa_kind, cfa_offset, plt_threshold) = match cfa {
        Cfa::Rsp(offset) => with_offset(CfaKind::Rsp, offset),
        Cfa::Rbp(offset) => with_offset(CfaKind::Rbp, offset),
        Cfa::Signal { rsp_at } => with_offset(CfaKind::Signal, rsp_at),
        Cfa::Plt { base, threshold } => match (u16::try_from(base), i8::try_from(threshold)) {
            // `rip & 15` is at most 15: a threshold above it would mean the stub never pushes.
            (Ok(base), Ok(threshold)) if threshold <= 15 => (CfaKind::Plt, base, Some(threshold)),
            _ => (CfaKind::Unsupported, 0, None),
        },
        Cfa::Unsupported => (CfaKind::Unsupported, 0, None),
    };
    let (rbp_kind, rbp_offset) = match rbp {
        Rbp::Unchanged => (RbpKind::Unchanged, 0),
        Rbp::CfaOffset(offset) => in_words(RbpKind::CfaOffset, offset),
        Rbp::AtRsp(offset) => in_words(RbpKind::AtRsp, offset),
        Rbp::Unsupported => (RbpKind::Unsupported, 0),
        Rbp::ReturnAddressUndefined => (RbpKind::ReturnAddressUndefined, 0),
    };
    // The PLT kind borrows the rbp offset for its threshold; its rbp is always unchanged (the
    // stubs touch no register but rsp), and any other rbp rule leaves nowhere to put it.
    let (cfa_kind, rbp_offset) = match plt_threshold {
        Some(threshold) if rbp_kind == RbpKind::Unchanged => (cfa_kind, threshold),
        Some(_) => (CfaKind::Unsupported, rbp_offset),
        None => (cfa_kind, rbp_offset),
    };
    UnwindRow::new(pc, cfa_kind, cfa_offset, rbp_kind, rbp_offset)
}

/// The end-of-function marker at `pc`: from here on no rule applies until the next function.
pub(super) fn no_row(pc: u32) -> UnwindRow {
    UnwindRow::new(pc, CfaKind::NoRow, 0, RbpKind::Unchanged, 0)
}

/// True when two rows give the same rule (whatever their pcs): the second adds nothing.
pub(super) fn same_rule(a: &UnwindRow, b: &UnwindRow) -> bool {
    (a.kinds, a.cfa_offset, a.rbp_offset) == (b.kinds, b.cfa_offset, b.rbp_offset)
}

fn with_offset(kind: CfaKind, offset: i64) -> (CfaKind, u16, Option<i8>) {
    match u16::try_from(offset) {
        Ok(offset) => (kind, offset, None),
        Err(_) => (CfaKind::Unsupported, 0, None),
    }
}

/// An offset in units of 8 bytes, as the row keeps rbp's.
fn in_words(kind: RbpKind, offset: i64) -> (RbpKind, i8) {
    if offset % 8 != 0 {
        return (RbpKind::Unsupported, 0);
    }
    match i8::try_from(offset / 8) {
        Ok(words) => (kind, words),
        Err(_) => (RbpKind::Unsupported, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_that_fit_keep_their_numbers() {
        let row = narrow(0x40, Cfa::Rsp(16), Rbp::CfaOffset(-16));
        assert_eq!(
            (row.pc, row.cfa_kind(), row.cfa_offset),
            (0x40, CfaKind::Rsp, 16)
        );
        assert_eq!((row.rbp_kind(), row.rbp_offset), (RbpKind::CfaOffset, -2));
        let plt = narrow(
            0,
            Cfa::Plt {
                base: 8,
                threshold: 11,
            },
            Rbp::Unchanged,
        );
        assert_eq!(
            (plt.cfa_kind(), plt.cfa_offset, plt.rbp_offset),
            (CfaKind::Plt, 8, 11)
        );
        let signal = narrow(0, Cfa::Signal { rsp_at: 160 }, Rbp::AtRsp(120));
        assert_eq!(
            (signal.cfa_kind(), signal.cfa_offset),
            (CfaKind::Signal, 160)
        );
        assert_eq!((signal.rbp_kind(), signal.rbp_offset), (RbpKind::AtRsp, 15));
        assert_eq!(std::mem::size_of::<UnwindRow>(), 8);
    }

    #[test]
    fn rules_that_do_not_fit_become_unsupported() {
        assert_eq!(
            narrow(0, Cfa::Rsp(1 << 16), Rbp::Unchanged).cfa_kind(),
            CfaKind::Unsupported
        );
        assert_eq!(
            narrow(0, Cfa::Rbp(-8), Rbp::Unchanged).cfa_kind(),
            CfaKind::Unsupported
        );
        for offset in [-12, -1032, 1024] {
            assert_eq!(
                narrow(0, Cfa::Rsp(8), Rbp::CfaOffset(offset)).rbp_kind(),
                RbpKind::Unsupported,
                "{offset}"
            );
        }
        let plt = |threshold, rbp| narrow(0, Cfa::Plt { base: 8, threshold }, rbp).cfa_kind();
        assert_eq!(plt(16, Rbp::Unchanged), CfaKind::Unsupported);
        assert_eq!(plt(11, Rbp::CfaOffset(-16)), CfaKind::Unsupported);
    }

    #[test]
    fn kinds_share_a_byte_and_unknown_nibbles_read_as_unsupported() {
        let row = narrow(0, Cfa::Rbp(16), Rbp::ReturnAddressUndefined);
        assert_eq!(row.kinds, 0x42);
        let garbage = UnwindRow { kinds: 0xff, ..row };
        assert_eq!(garbage.cfa_kind(), CfaKind::Unsupported);
        assert_eq!(garbage.rbp_kind(), RbpKind::Unsupported);
        assert!(same_rule(&no_row(1), &no_row(2)));
        assert!(!same_rule(&row, &no_row(0)));
    }
}
