//! Marks the code a runtime owns in a process's mappings for the BPF walk: each range becomes
//! an entry of its own with [`UnwindMapping::runtime`] set, sharing its mapping's table, so the
//! walk learns from the mapping it finds for a pc (one search it makes anyway) which runtime's
//! walk the frame goes to, and never checks a runtime's ranges itself.

use scorch_common::{RuntimeId, UnwindMapping};

/// `mappings` (sorted by start, disjoint) with each of `ranges` (`[start, end)`, absolute)
/// cut out of the mapping holding it as an entry owned by `runtime`. Ranges outside every
/// mapping, or empty, mark nothing; the parts of a mapping around a range keep its owner.
pub fn mark_owned(
    mappings: Vec<UnwindMapping>,
    ranges: &[(u64, u64)],
    runtime: RuntimeId,
) -> Vec<UnwindMapping> {
    let mut ranges: Vec<(u64, u64)> = ranges.iter().copied().filter(|(s, e)| s < e).collect();
    ranges.sort_unstable();
    let mut marked = Vec::with_capacity(mappings.len() + 2 * ranges.len());
    for mapping in mappings {
        let mut at = mapping.start;
        for &(start, end) in &ranges {
            let (start, end) = (start.max(at), end.min(mapping.end));
            if start >= end {
                continue;
            }
            if at < start {
                marked.push(UnwindMapping {
                    start: at,
                    end: start,
                    ..mapping
                });
            }
            marked.push(UnwindMapping {
                start,
                end,
                runtime: runtime as u16,
                ..mapping
            });
            at = end;
        }
        if at < mapping.end {
            marked.push(UnwindMapping {
                start: at,
                ..mapping
            });
        }
    }
    marked
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(start: u64, end: u64) -> UnwindMapping {
        UnwindMapping {
            start,
            end,
            bias: 7,
            first_row: 3,
            rows: 9,
            state: scorch_common::MAPPING_TABLE_LOADED,
            runtime: 0,
            pool: 2,
        }
    }

    fn spans(marked: &[UnwindMapping]) -> Vec<(u64, u64, u16)> {
        marked.iter().map(|m| (m.start, m.end, m.runtime)).collect()
    }

    #[test]
    fn a_range_inside_a_mapping_splits_it_in_three_sharing_its_table() {
        let marked = mark_owned(
            vec![mapping(0x1000, 0x2000), mapping(0x3000, 0x4000)],
            &[(0x3400, 0x3500)],
            RuntimeId::Python,
        );
        assert_eq!(
            spans(&marked),
            vec![
                (0x1000, 0x2000, 0),
                (0x3000, 0x3400, 0),
                (0x3400, 0x3500, RuntimeId::Python as u16),
                (0x3500, 0x4000, 0),
            ]
        );
        assert!(marked
            .iter()
            .all(|m| m.bias == 7 && m.first_row == 3 && m.pool == 2));
    }

    #[test]
    fn ranges_at_the_edges_and_unsorted_leave_no_empty_entry() {
        let marked = mark_owned(
            vec![mapping(0x1000, 0x2000)],
            &[(0x1800, 0x2000), (0x1000, 0x1100)],
            RuntimeId::Python,
        );
        assert_eq!(
            spans(&marked),
            vec![
                (0x1000, 0x1100, 1),
                (0x1100, 0x1800, 0),
                (0x1800, 0x2000, 1)
            ]
        );
    }

    #[test]
    fn a_range_past_its_mapping_is_clipped_and_one_outside_marks_nothing() {
        let marked = mark_owned(
            vec![mapping(0x1000, 0x2000)],
            &[(0x1f00, 0x2400), (0x5000, 0x6000), (0x1200, 0x1200)],
            RuntimeId::Python,
        );
        assert_eq!(
            spans(&marked),
            vec![(0x1000, 0x1f00, 0), (0x1f00, 0x2000, 1)]
        );
    }
}
