//! From the rows of every FDE, in section order, to the table the BPF side searches: sorted by
//! pc, one row per pc, no row repeating the rule before it.

use super::{
    convert::Converted,
    row::{same_rule, CfaKind, UnwindRow},
};

/// The sorted, merged rows. At a pc where one function ends and the next begins, the next
/// function's row wins over the end-of-function marker, so markers remain only before gaps.
/// Where two FDEs claim the same pc (broken or duplicated input), the one earlier in the
/// section wins.
pub(super) fn optimize(converted: Converted) -> Vec<UnwindRow> {
    let Converted {
        rows,
        mut functions,
    } = converted;
    // Each function's rows are already in order, so ordering the few thousand functions
    // orders the rows: sorting rows themselves was a third of libc's build time. Stable, so
    // functions starting at the same pc keep their section order.
    functions.sort_by_key(|function| function.start);
    let mut sorted = Vec::with_capacity(rows.len());
    for function in &functions {
        sorted.extend_from_slice(&rows[function.first_row..function.end_row]);
    }
    drop(rows);
    // Overlapping functions (broken input) interleave: only then sort the rows.
    if !sorted.is_sorted_by_key(|row| row.pc) {
        sorted.sort_by_key(|row| (row.pc, row.cfa_kind() == CfaKind::NoRow));
    }
    compact(&mut sorted);
    sorted.shrink_to_fit();
    sorted
}

/// Keeps one row per pc (a function's row over a marker, else the first) and drops each row
/// whose rule the row before it already gives. `rows` is sorted by pc.
fn compact(rows: &mut Vec<UnwindRow>) {
    let mut kept = 0;
    for index in 0..rows.len() {
        let row = rows[index];
        if kept > 0 {
            let last = rows[kept - 1];
            if last.pc == row.pc {
                if last.cfa_kind() == CfaKind::NoRow && row.cfa_kind() != CfaKind::NoRow {
                    rows[kept - 1] = row;
                    // The marker it replaces may have parted two rows with the same rule.
                    if kept >= 2 && same_rule(&rows[kept - 2], &row) {
                        kept -= 1;
                    }
                }
                continue;
            }
            if same_rule(&last, &row) {
                continue;
            }
        }
        rows[kept] = row;
        kept += 1;
    }
    rows.truncate(kept);
}

#[cfg(test)]
mod tests {
    use super::super::{
        convert::Function,
        row::{narrow, no_row, Cfa, FpRule},
    };
    use super::*;

    fn rsp(pc: u32, offset: i64) -> UnwindRow {
        narrow(pc, Cfa::Sp(offset), FpRule::Unchanged)
    }

    /// Converted rows from functions given as their rows, in section order.
    fn converted(functions: &[&[UnwindRow]]) -> Converted {
        let mut converted = Converted::default();
        for rows in functions {
            let first_row = converted.rows.len();
            converted.rows.extend_from_slice(rows);
            converted.functions.push(Function {
                start: rows[0].pc,
                end: rows[rows.len() - 1].pc,
                first_row,
                end_row: converted.rows.len(),
            });
        }
        converted
    }

    #[test]
    fn markers_stay_only_before_gaps_and_repeats_merge() {
        let rows = optimize(converted(&[
            // Second function, listed first; it starts where the first ends.
            &[rsp(0x20, 8), rsp(0x21, 16), no_row(0x30)],
            // First function: ends at 0x20, where the second starts.
            &[rsp(0x10, 8), rsp(0x11, 16), rsp(0x18, 16), no_row(0x20)],
            // Third, after a gap of padding.
            &[rsp(0x40, 8), no_row(0x48)],
            // Fourth, right after the third and with the same rule: one row covers both.
            &[rsp(0x48, 8), no_row(0x50)],
        ]));
        assert_eq!(
            rows,
            vec![
                rsp(0x10, 8),
                rsp(0x11, 16),
                rsp(0x20, 8),
                rsp(0x21, 16),
                no_row(0x30),
                rsp(0x40, 8),
                no_row(0x50),
            ]
        );
    }

    #[test]
    fn overlapping_functions_are_sorted_row_by_row_and_the_earlier_wins_a_contested_pc() {
        let rows = optimize(converted(&[
            &[rsp(0x10, 8), rsp(0x14, 16), no_row(0x20)],
            &[rsp(0x10, 24), rsp(0x12, 32), no_row(0x18)],
        ]));
        // The markers at 0x18 and 0x20 say the same: the second goes.
        assert_eq!(
            rows,
            vec![rsp(0x10, 8), rsp(0x12, 32), rsp(0x14, 16), no_row(0x18)]
        );
    }
}
