//! From the rows of each function, given in pc order one function at a time, to the table
//! the BPF side searches: sorted by pc, one row per pc, no row repeating the rule before it.
//! Each row is merged into the table as it comes, so the rows are held once, in the table's
//! own storage; only a function's rows, or a cluster of overlapping ones, wait to be merged.

use super::{
    convert::{Converted, Function},
    row::{same_rule, CfaKind, UnwindRow},
};

/// Rows (32 KiB) the table's storage grows by at least: a small table in one or two steps.
const MIN_GROWTH: usize = 4096;

/// The table being merged, and the functions that may still overlap the next one.
#[derive(Debug, Default)]
pub(super) struct Merger {
    /// The table so far: sorted, merged, every function before [`Merger::cluster`].
    rows: Vec<UnwindRow>,
    /// Functions whose pcs the next function may still share (broken or duplicated input):
    /// they are sorted row by row together. Usually the one function before the next.
    cluster: Converted,
    /// The furthest end of the cluster's functions.
    reach: u32,
    /// Rows given, end-of-function markers included, before merging.
    given: usize,
}

impl Merger {
    /// Rows given so far, before merging: what [`super::convert::MAX_ROWS`] caps.
    pub fn given(&self) -> usize {
        self.given
    }

    /// Adds the function `[start, end)` and its rows (sorted by pc, its end-of-function
    /// marker last). Functions come in order of their start; rows outside their function are
    /// dropped, as they would break that order.
    pub fn add(&mut self, start: u32, end: u32, rows: &[UnwindRow]) {
        self.given += rows.len();
        if !self.cluster.functions.is_empty() && start >= self.reach {
            self.flush();
        }
        let first_row = self.cluster.rows.len();
        let inside = rows.iter().filter(|row| start <= row.pc && row.pc <= end);
        self.cluster.rows.extend(inside);
        self.cluster.functions.push(Function {
            start,
            end,
            first_row,
            end_row: self.cluster.rows.len(),
        });
        self.reach = if self.cluster.functions.len() == 1 {
            end
        } else {
            self.reach.max(end)
        };
    }

    /// The table.
    pub fn finish(mut self) -> Vec<UnwindRow> {
        self.flush();
        self.rows.shrink_to_fit();
        self.rows
    }

    /// Merges the cluster into the table. At a pc where one function ends and the next begins,
    /// the next function's row wins over the end-of-function marker, so markers remain only
    /// before gaps. Where two functions claim the same pc, the one earlier in the section wins.
    fn flush(&mut self) {
        let Converted { rows, functions } = &mut self.cluster;
        // Stable, so functions starting at the same pc keep their section order; the index
        // gives them in this order already.
        functions.sort_by_key(|function| function.start);
        if let [function] = functions.as_slice() {
            for &row in &rows[function.first_row..function.end_row] {
                push(&mut self.rows, row);
            }
        } else {
            let mut sorted = Vec::with_capacity(rows.len());
            for function in functions.iter() {
                sorted.extend_from_slice(&rows[function.first_row..function.end_row]);
            }
            // Overlapping functions interleave: only then sort the rows.
            if !sorted.is_sorted_by_key(|row| row.pc) {
                sorted.sort_by_key(|row| (row.pc, row.cfa_kind() == CfaKind::NoRow));
            }
            for row in sorted {
                push(&mut self.rows, row);
            }
        }
        rows.clear();
        functions.clear();
    }
}

/// Appends `row` to `rows` (sorted by pc, merged), keeping one row per pc (a function's row
/// over a marker, else the first) and dropping a row whose rule the row before it already
/// gives.
fn push(rows: &mut Vec<UnwindRow>, row: UnwindRow) {
    if let Some(&last) = rows.last() {
        if last.pc == row.pc {
            if last.cfa_kind() == CfaKind::NoRow && row.cfa_kind() != CfaKind::NoRow {
                rows.pop();
                // The marker it replaces may have parted two rows with the same rule.
                if rows.last().is_some_and(|before| same_rule(before, &row)) {
                    return;
                }
                rows.push(row);
            }
            return;
        }
        if same_rule(&last, &row) {
            return;
        }
    }
    // Grown by an eighth, not doubled: the table is the largest block of its build, and an
    // eighth bounds what it holds beyond its rows.
    if rows.len() == rows.capacity() {
        rows.reserve_exact((rows.len() / 8).max(MIN_GROWTH));
    }
    rows.push(row);
}

/// All the functions of `converted` merged at once, in any order: the whole-table merge the
/// tests state the rules with, one cluster of every function.
#[cfg(test)]
pub(super) fn optimize(converted: Converted) -> Vec<UnwindRow> {
    let mut merger = Merger {
        cluster: converted,
        ..Merger::default()
    };
    merger.flush();
    merger.finish()
}

#[cfg(test)]
mod tests {
    use super::super::{
        convert::Function,
        row::{narrow, no_row, Cfa, FpRule, RaKind},
    };
    use super::*;

    fn rsp(pc: u32, offset: i64) -> UnwindRow {
        narrow(pc, Cfa::Sp(offset), FpRule::Unchanged, RaKind::CfaMinus8)
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

    #[test]
    fn functions_merged_one_at_a_time_give_the_whole_table_merge() {
        let functions: [&[UnwindRow]; 5] = [
            &[rsp(0x10, 8), rsp(0x11, 16), no_row(0x20)],
            // Overlaps the first: the two are sorted row by row together.
            &[rsp(0x18, 24), rsp(0x1c, 32), no_row(0x28)],
            // Starts where the cluster ends, with the rule before its marker.
            &[rsp(0x28, 32), rsp(0x2a, 8), no_row(0x30)],
            &[rsp(0x40, 8), no_row(0x48)],
            &[rsp(0x48, 16), no_row(0x50)],
        ];
        let mut merger = Merger::default();
        for rows in functions {
            merger.add(rows[0].pc, rows[rows.len() - 1].pc, rows);
        }
        assert_eq!(merger.given(), 13);
        assert_eq!(merger.finish(), optimize(converted(&functions)));
    }

    #[test]
    fn rows_outside_their_function_are_dropped() {
        let mut merger = Merger::default();
        merger.add(0x10, 0x20, &[rsp(0x10, 8), rsp(0x30, 16), no_row(0x20)]);
        merger.add(0x20, 0x28, &[rsp(0x20, 24), rsp(0x08, 32), no_row(0x28)]);
        assert_eq!(
            merger.finish(),
            vec![rsp(0x10, 8), rsp(0x20, 24), no_row(0x28)]
        );
    }
}
