//! Which rows of the BPF row pool (`UNWIND_ROWS`) are free: every loaded table holds one
//! contiguous range, so the BPF side needs only a first row and a length per mapping.
//!
//! First fit over a sorted free list, neighbours merged on release: tables come and go in
//! sizes from a few rows to millions, and a first fit keeps the low end of the pool packed.

use std::collections::BTreeMap;

/// The free ranges of a pool of `capacity` rows.
#[derive(Debug)]
pub struct RowPool {
    /// Free ranges, first row -> length; never adjacent (merged on release).
    free: BTreeMap<u32, u32>,
    capacity: u32,
    used: u32,
}

impl RowPool {
    pub fn new(capacity: u32) -> Self {
        let mut free = BTreeMap::new();
        if capacity > 0 {
            free.insert(0, capacity);
        }
        RowPool {
            free,
            capacity,
            used: 0,
        }
    }

    /// Rows in use.
    pub fn used(&self) -> u32 {
        self.used
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The first row of a free range of `len` rows, now taken; `None` when no range is
    /// long enough (the caller evicts and tries again).
    pub fn allocate(&mut self, len: u32) -> Option<u32> {
        if len == 0 {
            return None;
        }
        let (&start, &free_len) = self.free.iter().find(|(_, &free)| free >= len)?;
        self.free.remove(&start);
        if free_len > len {
            self.free.insert(start + len, free_len - len);
        }
        self.used += len;
        Some(start)
    }

    /// Gives back the range `[start, start + len)` that [`RowPool::allocate`] returned.
    pub fn release(&mut self, start: u32, len: u32) {
        if len == 0 {
            return;
        }
        debug_assert!(start
            .checked_add(len)
            .is_some_and(|end| end <= self.capacity));
        self.used -= len;
        let mut start = start;
        let mut len = len;
        if let Some((&before, &before_len)) = self.free.range(..start).next_back() {
            if before + before_len == start {
                self.free.remove(&before);
                start = before;
                len += before_len;
            }
        }
        if let Some(&after_len) = self.free.get(&(start + len)) {
            self.free.remove(&(start + len));
            len += after_len;
        }
        self.free.insert(start, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_first_fit_and_merges_on_release() {
        let mut pool = RowPool::new(100);
        let a = pool.allocate(30).unwrap();
        let b = pool.allocate(30).unwrap();
        let c = pool.allocate(30).unwrap();
        assert_eq!((a, b, c), (0, 30, 60));
        assert_eq!(pool.allocate(11), None);
        assert_eq!(pool.used(), 90);
        pool.release(b, 30);
        // The hole is reused before the tail.
        assert_eq!(pool.allocate(10), Some(30));
        pool.release(30, 10);
        pool.release(a, 30);
        // a and b's ranges merged: 60 rows from 0.
        assert_eq!(pool.allocate(60), Some(0));
        pool.release(0, 60);
        pool.release(c, 30);
        assert_eq!(pool.used(), 0);
        assert_eq!(pool.allocate(100), Some(0));
        assert_eq!(pool.allocate(1), None);
    }

    #[test]
    fn refuses_empty_and_oversized_requests() {
        let mut pool = RowPool::new(8);
        assert_eq!(pool.allocate(0), None);
        assert_eq!(pool.allocate(9), None);
        assert_eq!(pool.capacity(), 8);
        assert_eq!(RowPool::new(0).allocate(1), None);
    }
}
