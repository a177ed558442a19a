//! A Go binary's `pcsp` tables to rows: the stack-pointer delta Go's `.gopclntab` keeps for
//! every pc, which its own runtime unwinds with, turned into the rules `.eh_frame` gives other
//! code. A stripped Go binary has no CFI at all, and its frameless leaves push no frame
//! pointer: without these rows a frame-pointer walk skips each leaf's caller.
//!
//! Where the delta puts the CFA, the return address and the caller's frame pointer is the
//! architecture's (`convert::Arch::go_frame`). Functions that start a stack (`runtime.goexit` under
//! every goroutine, `runtime.mstart`, `runtime.rt0_go`) end the walk; those that switch
//! stacks or write the stack pointer in ways the delta does not describe
//! (`runtime.systemstack`, `runtime.mcall`, `runtime.morestack`, and whatever Go flags
//! `SPWRITE`) stop it, as unsupported, rather than walk into another stack's words.

use crate::binary::gopclntab::{GoFunc, Pclntab};

use super::{
    convert::{go_stack_bottom, Arch, FdeCounts},
    index::{overlaps, Entry, FunctionIndex, Source},
    row::{self, Cfa, FpRule, RaKind},
    Code,
};

/// Functions at the bottom of a stack: the walk is complete when it reaches one.
const OUTERMOST: [&str; 4] = [
    "runtime.goexit",
    "runtime.mstart",
    "runtime.rt0_go",
    "runtime.goexit1",
];

/// Functions that switch stacks: past them, the words above the stack pointer are another
/// stack's.
const STACK_SWITCHES: [&str; 5] = [
    "runtime.systemstack",
    "runtime.systemstack_switch",
    "runtime.mcall",
    "runtime.morestack",
    "runtime.asmcgocall",
];

/// Which of a table's functions [`index`] takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Which {
    /// Those that start or switch stacks: they take precedence over CFI, which describes them
    /// as ordinary frames.
    Stops,
    /// The others, where no CFI describes them.
    Rest,
}

/// The first pass: adds each function of `table` of the kind `which` says that `claimed`
/// (pcs already covered) leaves to `index`. A function whose entry is corrupt is left out and
/// counted as skipped; its code gets no row.
pub(super) fn index(
    table: &Pclntab,
    data: &[u8],
    code: &Code,
    claimed: &[(u32, u32)],
    which: Which,
    index: &mut FunctionIndex,
) -> FdeCounts {
    let mut counts = FdeCounts::default();
    for (at, func) in table.funcs(data).enumerate() {
        let Ok(func) = func else {
            // Counted once, with the other functions.
            counts.skipped += usize::from(which == Which::Rest);
            continue;
        };
        if (stop_of(&func).is_some()) != (which == Which::Stops) {
            continue;
        }
        let (true, Ok(at)) = (
            func.entry < func.end && code.covers(func.entry, func.end),
            u32::try_from(at),
        ) else {
            counts.skipped += 1;
            continue;
        };
        let (start, end) = (code.pc(func.entry), code.pc(func.end));
        if overlaps(claimed, start, end) {
            counts.claimed += 1;
            continue;
        }
        index.push(Entry {
            start,
            end,
            at,
            source: match which {
                Which::Stops => Source::GoStops,
                Which::Rest => Source::GoRest,
            },
        });
        counts.converted += 1;
    }
    counts
}

/// The second pass: appends the rows of function `at` of `table` (one [`index`] took), then
/// its end-of-function marker, to `rows`; false, with `rows` as it was, when its pc table
/// cannot be read or it would hold more than `room` rows.
pub(super) fn rows(
    table: &Pclntab,
    data: &[u8],
    at: u32,
    arch: Arch,
    code: &Code,
    rows: &mut Vec<scorch_common::UnwindRow>,
    room: usize,
) -> bool {
    let first_row = rows.len();
    let Ok(func) = table.func(data, u64::from(at)) else {
        return false;
    };
    if !rows_of(table, data, &func, arch, code, rows, room) {
        rows.truncate(first_row);
        return false;
    }
    rows.push(row::no_row(code.pc(func.end)));
    true
}

/// Pushes `func`'s rows; false when its pc table cannot be read or `rows` would pass `room`.
fn rows_of(
    table: &Pclntab,
    data: &[u8],
    func: &GoFunc,
    arch: Arch,
    code: &Code,
    rows: &mut Vec<scorch_common::UnwindRow>,
    room: usize,
) -> bool {
    if let Some((cfa, rbp)) = stop_of(func) {
        rows.push(row::narrow(
            code.pc(func.entry),
            cfa,
            rbp,
            RaKind::CfaMinus8,
        ));
        return true;
    }
    let Ok(deltas) = table.sp_deltas(data, func) else {
        return false;
    };
    for (pc, delta) in deltas {
        if rows.len() >= room || pc < func.entry || pc >= func.end {
            return false;
        }
        let (cfa, rbp, ra) = arch.go_frame(delta);
        rows.push(row::narrow(code.pc(pc), cfa, rbp, ra));
    }
    true
}

/// The one rule of a function the walk stops at: complete at the bottom of a stack,
/// unsupported where it would leave this stack; `None` for the others.
fn stop_of(func: &GoFunc) -> Option<(Cfa, FpRule)> {
    if func.top_frame || OUTERMOST.contains(&func.name) {
        Some(go_stack_bottom())
    } else if func.spwrite || STACK_SWITCHES.contains(&func.name) {
        Some((Cfa::Unsupported, FpRule::Unsupported))
    } else {
        None
    }
}
