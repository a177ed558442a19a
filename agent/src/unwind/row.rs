//! The rows a table is made of. [`UnwindRow`] itself is shared with the BPF program and lives
//! in `scorch_common`, where its byte layout is documented; this file narrows DWARF's rules,
//! whose offsets are any i64, into it, and decides what does not fit.

pub use scorch_common::{CfaKind, FpKind, RaKind, UnwindRow};

/// How to find the CFA, as DWARF said it, before it is narrowed into a row. SP and FP are the
/// stack and frame pointers (x86-64's rsp and rbp, `convert/x86_64.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Cfa {
    Sp(i64),
    Fp(i64),
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

/// Where the caller's frame pointer is, as DWARF said it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FpRule {
    Unchanged,
    CfaOffset(i64),
    AtSp(i64),
    Unsupported,
    ReturnAddressUndefined,
}

/// The row for `pc` (an offset from the table's base). A rule whose numbers do not fit the
/// row's fields becomes unsupported: the BPF side stops there instead of going wrong.
pub(super) fn narrow(pc: u32, cfa: Cfa, rbp: FpRule) -> UnwindRow {
    let (cfa_kind, cfa_offset, plt_threshold) = match cfa {
        Cfa::Sp(offset) => with_offset(CfaKind::Sp, offset),
        Cfa::Fp(offset) => with_offset(CfaKind::Fp, offset),
        Cfa::Signal { rsp_at } => with_offset(CfaKind::Signal, rsp_at),
        Cfa::Plt { base, threshold } => match (u16::try_from(base), i8::try_from(threshold)) {
            // `rip & 15` is at most 15: a threshold above it would mean the stub never pushes.
            (Ok(base), Ok(threshold)) if threshold <= 15 => (CfaKind::Plt, base, Some(threshold)),
            _ => (CfaKind::Unsupported, 0, None),
        },
        Cfa::Unsupported => (CfaKind::Unsupported, 0, None),
    };
    let (fp_kind, fp_offset) = match rbp {
        FpRule::Unchanged => (FpKind::Unchanged, 0),
        FpRule::CfaOffset(offset) => in_words(FpKind::CfaOffset, offset),
        FpRule::AtSp(offset) => in_words(FpKind::AtSp, offset),
        FpRule::Unsupported => (FpKind::Unsupported, 0),
        FpRule::ReturnAddressUndefined => (FpKind::ReturnAddressUndefined, 0),
    };
    // The PLT kind borrows the rbp offset for its threshold; its rbp is always unchanged (the
    // stubs touch no register but rsp), and any other rbp rule leaves nowhere to put it.
    let (cfa_kind, fp_offset) = match plt_threshold {
        Some(threshold) if fp_kind == FpKind::Unchanged => (cfa_kind, threshold),
        Some(_) => (CfaKind::Unsupported, fp_offset),
        None => (cfa_kind, fp_offset),
    };
    UnwindRow::new(pc, cfa_kind, cfa_offset, fp_kind, fp_offset)
}

/// The end-of-function marker at `pc`: from here on no rule applies until the next function.
pub(super) fn no_row(pc: u32) -> UnwindRow {
    UnwindRow::new(pc, CfaKind::NoRow, 0, FpKind::Unchanged, 0)
}

/// True when two rows give the same rule (whatever their pcs): the second adds nothing.
pub(super) fn same_rule(a: &UnwindRow, b: &UnwindRow) -> bool {
    (a.kinds, a.cfa_offset, a.fp_offset) == (b.kinds, b.cfa_offset, b.fp_offset)
}

fn with_offset(kind: CfaKind, offset: i64) -> (CfaKind, u16, Option<i8>) {
    match u16::try_from(offset) {
        Ok(offset) => (kind, offset, None),
        Err(_) => (CfaKind::Unsupported, 0, None),
    }
}

/// An offset in units of 8 bytes, as the row keeps rbp's.
fn in_words(kind: FpKind, offset: i64) -> (FpKind, i8) {
    if offset % 8 != 0 {
        return (FpKind::Unsupported, 0);
    }
    match i8::try_from(offset / 8) {
        Ok(words) => (kind, words),
        Err(_) => (FpKind::Unsupported, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_that_fit_keep_their_numbers() {
        let row = narrow(0x40, Cfa::Sp(16), FpRule::CfaOffset(-16));
        assert_eq!(
            (row.pc, row.cfa_kind(), row.cfa_offset),
            (0x40, CfaKind::Sp, 16)
        );
        assert_eq!((row.fp_kind(), row.fp_offset), (FpKind::CfaOffset, -2));
        let plt = narrow(
            0,
            Cfa::Plt {
                base: 8,
                threshold: 11,
            },
            FpRule::Unchanged,
        );
        assert_eq!(
            (plt.cfa_kind(), plt.cfa_offset, plt.fp_offset),
            (CfaKind::Plt, 8, 11)
        );
        let signal = narrow(0, Cfa::Signal { rsp_at: 160 }, FpRule::AtSp(120));
        assert_eq!(
            (signal.cfa_kind(), signal.cfa_offset),
            (CfaKind::Signal, 160)
        );
        assert_eq!((signal.fp_kind(), signal.fp_offset), (FpKind::AtSp, 15));
        assert_eq!(std::mem::size_of::<UnwindRow>(), 8);
    }

    #[test]
    fn rules_that_do_not_fit_become_unsupported() {
        assert_eq!(
            narrow(0, Cfa::Sp(1 << 16), FpRule::Unchanged).cfa_kind(),
            CfaKind::Unsupported
        );
        assert_eq!(
            narrow(0, Cfa::Fp(-8), FpRule::Unchanged).cfa_kind(),
            CfaKind::Unsupported
        );
        for offset in [-12, -1032, 1024] {
            assert_eq!(
                narrow(0, Cfa::Sp(8), FpRule::CfaOffset(offset)).fp_kind(),
                FpKind::Unsupported,
                "{offset}"
            );
        }
        let plt = |threshold, rbp| narrow(0, Cfa::Plt { base: 8, threshold }, rbp).cfa_kind();
        assert_eq!(plt(16, FpRule::Unchanged), CfaKind::Unsupported);
        assert_eq!(plt(11, FpRule::CfaOffset(-16)), CfaKind::Unsupported);
    }

    #[test]
    fn kinds_share_a_byte_and_unknown_nibbles_read_as_unsupported() {
        let row = narrow(0, Cfa::Fp(16), FpRule::ReturnAddressUndefined);
        assert_eq!(row.kinds, 0x42);
        let garbage = UnwindRow { kinds: 0xff, ..row };
        assert_eq!(garbage.cfa_kind(), CfaKind::Unsupported);
        assert_eq!(garbage.fp_kind(), FpKind::Unsupported);
        // The return address's bit is apart from the CFA's kind.
        assert_eq!(row.ra_kind(), RaKind::CfaMinus8);
        assert_eq!(garbage.ra_kind(), RaKind::LinkRegister);
        let in_link_register = row.with_return_address(RaKind::LinkRegister);
        assert_eq!(in_link_register.kinds, 0x4a);
        assert_eq!(in_link_register.cfa_kind(), CfaKind::Fp);
        assert_eq!(in_link_register.ra_kind(), RaKind::LinkRegister);
        assert_eq!(in_link_register.with_return_address(RaKind::CfaMinus8), row);
        assert!(same_rule(&no_row(1), &no_row(2)));
        assert!(!same_rule(&row, &no_row(0)));
    }
}
