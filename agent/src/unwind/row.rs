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

/// Where the caller's frame pointer is, and the return address when the architecture keeps
/// it apart from the CFA (arm64), as DWARF said it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FpRule {
    Unchanged,
    CfaOffset(i64),
    AtSp(i64),
    Unsupported,
    ReturnAddressUndefined,
    /// A frame record `{caller's FP, return address}` at CFA + the offset.
    Record(i64),
    /// FP unchanged, the return address at CFA + the offset.
    ReturnAddressAt(i64),
}

/// The row for `pc` (an offset from the table's base), its return address in the link
/// register when `ra` says so. A rule whose numbers do not fit the row's fields becomes
/// unsupported: the BPF side stops there instead of going wrong.
pub(super) fn narrow(pc: u32, cfa: Cfa, rbp: FpRule, ra: RaKind) -> UnwindRow {
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
        FpRule::Record(offset) => match in_words(FpKind::Record, offset) {
            // Too far from the CFA: from the CFA's register instead, `cfa_offset` below it.
            (FpKind::Unsupported, _) => in_words(
                FpKind::RecordFromBase,
                offset.saturating_add(i64::from(cfa_offset)),
            ),
            near => near,
        },
        FpRule::ReturnAddressAt(offset) => in_words(FpKind::ReturnAddressAt, offset),
    };
    // The PLT kind borrows the rbp offset for its threshold; its rbp is always unchanged (the
    // stubs touch no register but rsp), and any other rbp rule leaves nowhere to put it.
    let (cfa_kind, fp_offset) = match plt_threshold {
        Some(threshold) if fp_kind == FpKind::Unchanged => (cfa_kind, threshold),
        Some(_) => (CfaKind::Unsupported, fp_offset),
        None => (cfa_kind, fp_offset),
    };
    // A record's kind says where the return address is; a return address in the link
    // register goes with a frame pointer that is not in memory.
    let cfa_kind = match (ra, fp_kind) {
        (RaKind::CfaMinus8, _) => cfa_kind,
        (RaKind::LinkRegister, FpKind::Unchanged | FpKind::ReturnAddressUndefined) => cfa_kind,
        (RaKind::LinkRegister, _) => CfaKind::Unsupported,
    };
    UnwindRow::new(pc, cfa_kind, cfa_offset, fp_kind, fp_offset).with_return_address(ra)
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
        let row = narrow(0x40, Cfa::Sp(16), FpRule::CfaOffset(-16), RaKind::CfaMinus8);
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
            RaKind::CfaMinus8,
        );
        assert_eq!(
            (plt.cfa_kind(), plt.cfa_offset, plt.fp_offset),
            (CfaKind::Plt, 8, 11)
        );
        let signal = narrow(
            0,
            Cfa::Signal { rsp_at: 160 },
            FpRule::AtSp(120),
            RaKind::CfaMinus8,
        );
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
            narrow(0, Cfa::Sp(1 << 16), FpRule::Unchanged, RaKind::CfaMinus8).cfa_kind(),
            CfaKind::Unsupported
        );
        assert_eq!(
            narrow(0, Cfa::Fp(-8), FpRule::Unchanged, RaKind::CfaMinus8).cfa_kind(),
            CfaKind::Unsupported
        );
        for offset in [-12, -1032, 1024] {
            assert_eq!(
                narrow(0, Cfa::Sp(8), FpRule::CfaOffset(offset), RaKind::CfaMinus8).fp_kind(),
                FpKind::Unsupported,
                "{offset}"
            );
        }
        let plt = |threshold, rbp| {
            narrow(0, Cfa::Plt { base: 8, threshold }, rbp, RaKind::CfaMinus8).cfa_kind()
        };
        assert_eq!(plt(16, FpRule::Unchanged), CfaKind::Unsupported);
        assert_eq!(plt(11, FpRule::CfaOffset(-16)), CfaKind::Unsupported);
    }

    #[test]
    fn kinds_share_a_byte_and_unknown_nibbles_read_as_unsupported() {
        let row = narrow(
            0,
            Cfa::Fp(16),
            FpRule::ReturnAddressUndefined,
            RaKind::CfaMinus8,
        );
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

    #[test]
    fn frame_records_near_the_cfa_or_near_its_register() {
        let lr = |cfa, fp| narrow(0, cfa, fp, RaKind::LinkRegister);
        let record = |cfa, fp| narrow(0, cfa, fp, RaKind::CfaMinus8);
        // `stp x29, x30, [sp, #-48]!`: the record at the bottom of the frame.
        let row = record(Cfa::Sp(48), FpRule::Record(-48));
        assert_eq!((row.fp_kind(), row.fp_offset), (FpKind::Record, -6));
        // A 33,392-byte frame whose record is at sp: out of an i8's reach from the CFA.
        let row = record(Cfa::Sp(33_392), FpRule::Record(-33_392));
        assert_eq!((row.cfa_kind(), row.cfa_offset), (CfaKind::Sp, 33_392));
        assert_eq!((row.fp_kind(), row.fp_offset), (FpKind::RecordFromBase, 0));
        let row = record(Cfa::Sp(8_192), FpRule::Record(-8_192 + 64));
        assert_eq!((row.fp_kind(), row.fp_offset), (FpKind::RecordFromBase, 8));
        assert_eq!(
            record(Cfa::Sp(8_192), FpRule::Record(-4_096)).fp_kind(),
            FpKind::Unsupported
        );
        // `str x30, [sp, #-16]!`.
        let row = record(Cfa::Sp(16), FpRule::ReturnAddressAt(-16));
        assert_eq!(
            (row.fp_kind(), row.fp_offset),
            (FpKind::ReturnAddressAt, -2)
        );
        // At a function's entry, and in a PLT stub.
        let row = lr(Cfa::Sp(0), FpRule::Unchanged);
        assert_eq!(
            (row.cfa_kind(), row.fp_kind(), row.ra_kind()),
            (CfaKind::Sp, FpKind::Unchanged, RaKind::LinkRegister)
        );
        // x29 saved while x30 is not: nowhere the walk reads both.
        assert_eq!(
            lr(Cfa::Sp(16), FpRule::CfaOffset(-16)).cfa_kind(),
            CfaKind::Unsupported
        );
    }
}
