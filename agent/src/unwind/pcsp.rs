//! A Go binary's `pcsp` tables to rows: the stack-pointer delta Go's `.gopclntab` keeps for
//! every pc, which its own runtime unwinds with, turned into the rules `.eh_frame` gives other
//! code. A stripped Go binary has no CFI at all, and its frameless leaves push no frame
//! pointer: without these rows a frame-pointer walk skips each leaf's caller.
//!
//! Where the delta puts the CFA, the return address and the caller's frame pointer is the
//! architecture's (`convert::go_frame`). Functions that start a stack (`runtime.goexit` under every goroutine, `runtime.mstart`, `runtime.rt0_go`)
//! end the walk; those that switch stacks or write the stack pointer in ways the delta does not describe
//! (`runtime.systemstack`, `runtime.mcall`, `runtime.morestack`, and whatever Go flags
//! `SPWRITE`) stop it, as unsupported, rather than walk into another stack's words.

use crate::binary::gopclntab::{GoFunc, Pclntab};

use super::{
    convert::{go_frame, go_stack_bottom, Converted, FdeCounts, Function, MAX_ROWS},
    row::{self, Cfa, FpRule},
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

/// Which of a table's functions [`convert`] takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Which {
    /// Those that start or switch stacks: they take precedence over CFI, which describes them
    /// as ordinary frames.
    Stops,
    /// The others, where no CFI describes them.
    Rest,
}

/// Appends the rows of each function of `table` of the kind `which` says that `claimed` (pcs
/// already covered) leaves, each followed by an end-of-function marker. A function whose
/// entry or pc table is corrupt is left out and counted as skipped; its code gets no row.
pub(super) fn convert(
    table: &Pclntab,
    data: &[u8],
    code: &Code,
    claimed: &[(u32, u32)],
    which: Which,
    converted: &mut Converted,
) -> FdeCounts {
    let mut counts = FdeCounts::default();
    for func in table.funcs(data) {
        let Ok(func) = func else {
            // Counted once, with the other functions.
            counts.skipped += usize::from(which == Which::Rest);
            continue;
        };
        if (stop_of(&func).is_some()) != (which == Which::Stops) {
            continue;
        }
        if func.entry >= func.end || !code.covers(func.entry, func.end) {
            counts.skipped += 1;
            continue;
        }
        let (start, end) = (code.pc(func.entry), code.pc(func.end));
        if super::convert::overlaps(claimed, start, end) {
            counts.claimed += 1;
            continue;
        }
        let first_row = converted.rows.len();
        if !rows_of(table, data, &func, code, &mut converted.rows) {
            converted.rows.truncate(first_row);
            counts.skipped += 1;
            continue;
        }
        converted.rows.push(row::no_row(end));
        converted.functions.push(Function {
            start,
            end,
            first_row,
            end_row: converted.rows.len(),
        });
        counts.converted += 1;
    }
    counts
}

/// Pushes `func`'s rows; false when its pc table cannot be read or the rows would pass
/// [`MAX_ROWS`].
fn rows_of(
    table: &Pclntab,
    data: &[u8],
    func: &GoFunc,
    code: &Code,
    rows: &mut Vec<scorch_common::UnwindRow>,
) -> bool {
    if let Some((cfa, rbp)) = stop_of(func) {
        rows.push(row::narrow(code.pc(func.entry), cfa, rbp));
        return true;
    }
    let Ok(deltas) = table.sp_deltas(data, func) else {
        return false;
    };
    for (pc, delta) in deltas {
        if rows.len() >= MAX_ROWS || pc < func.entry || pc >= func.end {
            return false;
        }
        let (cfa, rbp) = go_frame(delta);
        rows.push(row::narrow(code.pc(pc), cfa, rbp));
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
