//! The first pass of a table's build: which functions the table will hold, from which
//! section, and where each one's rules are, read from the FDE headers and Go's function table
//! alone. Sorted by pc, it lets the second pass convert one function at a time, in the order
//! the rows end up in, so no whole table of unsorted rows is ever held: the index costs a
//! few words a function, where the rows cost tens of bytes.

/// Where a function's rules are, in the order the sections are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// A Go function that starts or switches stacks (`pcsp::Which::Stops`).
    GoStops,
    EhFrame,
    /// The binary's `.debug_frame`, or its debug file's.
    DebugFrame,
    /// Any other Go function (`pcsp::Which::Rest`).
    GoRest,
    /// Rows the architecture writes for code without CFI (`convert::Generated`).
    Generated,
}

/// How many [`Source`]s there are.
pub(super) const SOURCES: usize = 5;

/// One function the table will hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Entry {
    /// Its first and past-the-end pcs (offsets from the table's base).
    pub start: u32,
    pub end: u32,
    /// The FDE's offset in its section, or the Go function's index in `.gopclntab`.
    pub at: u32,
    pub source: Source,
}

/// The functions found so far, in the order their sections were read, then sorted by pc.
#[derive(Debug, Default)]
pub(super) struct FunctionIndex {
    entries: Vec<Entry>,
}

impl FunctionIndex {
    pub fn push(&mut self, entry: Entry) {
        self.entries.push(entry);
    }

    /// The pcs the functions so far cover, sorted and disjoint: what a later section may not
    /// claim again.
    pub fn covered(&self) -> Vec<(u32, u32)> {
        let mut ranges: Vec<(u32, u32)> = self.entries.iter().map(|f| (f.start, f.end)).collect();
        ranges.sort_unstable();
        ranges.dedup_by(|range, previous| {
            if range.0 <= previous.1 {
                previous.1 = previous.1.max(range.1);
                true
            } else {
                false
            }
        });
        ranges
    }

    /// The functions by pc. Stable: functions starting at the same pc keep their section
    /// order, and the earlier one wins a contested pc.
    pub fn into_sorted(mut self) -> Vec<Entry> {
        self.entries.sort_by_key(|entry| entry.start);
        self.entries.shrink_to_fit();
        self.entries
    }
}

/// True when `[start, end)` meets any of `ranges` (sorted, disjoint).
pub(super) fn overlaps(ranges: &[(u32, u32)], start: u32, end: u32) -> bool {
    // The last range starting before `end` is also the one reaching furthest.
    let before_end = ranges.partition_point(|range| range.0 < end);
    before_end > 0 && ranges[before_end - 1].1 > start
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(start: u32, end: u32, at: u32) -> Entry {
        Entry {
            start,
            end,
            at,
            source: Source::EhFrame,
        }
    }

    #[test]
    fn covered_ranges_merge_and_overlaps_finds_any_meeting() {
        let mut index = FunctionIndex::default();
        for (start, end) in [(0x40, 0x50), (0x10, 0x20), (0x20, 0x28), (0x44, 0x60)] {
            index.push(entry(start, end, 0));
        }
        let covered = index.covered();
        assert_eq!(covered, vec![(0x10, 0x28), (0x40, 0x60)]);
        assert!(overlaps(&covered, 0x27, 0x30));
        assert!(!overlaps(&covered, 0x28, 0x40));
        assert!(overlaps(&covered, 0x00, 0x100));
        assert!(!overlaps(&[], 0, 1));
    }

    #[test]
    fn sorting_keeps_section_order_at_the_same_pc() {
        let mut index = FunctionIndex::default();
        index.push(entry(0x30, 0x40, 0));
        index.push(entry(0x10, 0x20, 1));
        index.push(entry(0x10, 0x18, 2));
        let order: Vec<u32> = index.into_sorted().iter().map(|e| e.at).collect();
        assert_eq!(order, vec![1, 2, 0]);
    }
}
