//! Which rows of the BPF row pools (`UNWIND_ROWS`) are free, and when to add or give back a
//! pool: every loaded table holds one contiguous range of one pool, so the BPF side needs only
//! a pool, a first row and a length per mapping.
//!
//! Within a pool, first fit over a sorted free list, neighbours merged on release: tables come
//! and go in sizes from a few rows to millions, and a first fit keeps the low end packed.
//!
//! Pools are added as tables need room, each as large as all before it (from
//! `MIN_POOL_ROWS`, or the table's own size when larger), so a quiet host holds one small pool
//! and a busy one reaches its tables' size in a few steps, never more than twice what they
//! took; the sum stays under a ceiling. A pool left mostly empty once the tables that filled
//! it are gone (a build's compilers exited) is shrunk: the loader moves its few tables to the
//! other pools' free rows, or to a pool sized for them, and gives it back
//! after a grace period ([`RowPools::sparse_pool`], [`RowPools::smaller_pool`]). This is the pure half: the loader
//! creates the maps and moves the rows.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

/// Rows are 8 bytes and pools are whole pages: a pool's rows are a multiple of 512.
const PAGE_ROWS: u32 = 512;

/// A pool is worth shrinking when at most this part of it is used (1 in 4): its tables then
/// fit in the others' free rows or in a pool a quarter of its size. A pool more used than
/// that stays, so a table that comes and goes does not move its neighbours back and forth.
const SPARSE: u64 = 4;

/// The free ranges of a pool of `capacity` rows.
#[derive(Debug)]
pub struct RowPool {
    /// Free ranges, first row -> length; never adjacent (merged on release).
    free: BTreeMap<u32, u32>,
    capacity: u32,
    used: u32,
    /// Since when the pool has been sparse ([`RowPools::sparse_pool`]), as last looked at.
    sparse_since: Option<Instant>,
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
            sparse_since: None,
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

/// The pools, by their index in the BPF outer array, and the ceiling on their rows.
#[derive(Debug)]
pub struct RowPools {
    pools: Vec<Option<RowPool>>,
    /// Rows all pools may hold together.
    ceiling: u64,
    min_rows: u32,
}

impl RowPools {
    /// No pool yet; at most `slots` at once, `ceiling` rows together, none under `min_rows`.
    pub fn new(slots: u32, ceiling: u32, min_rows: u32) -> Self {
        RowPools {
            pools: (0..slots).map(|_| None).collect(),
            ceiling: u64::from(ceiling),
            min_rows: min_rows.max(1),
        }
    }

    /// Rows in use, in all pools.
    pub fn used(&self) -> u64 {
        self.live().map(|(_, pool)| u64::from(pool.used())).sum()
    }

    /// Rows the pools hold, used or not: what their maps cost.
    pub fn capacity(&self) -> u64 {
        self.live()
            .map(|(_, pool)| u64::from(pool.capacity()))
            .sum()
    }

    pub fn ceiling(&self) -> u64 {
        self.ceiling
    }

    /// Rows pool `index` holds, used or not; 0 when it does not exist.
    pub fn capacity_of(&self, index: u32) -> u32 {
        self.pools
            .get(index as usize)
            .and_then(Option::as_ref)
            .map_or(0, RowPool::capacity)
    }

    /// Pools that exist.
    pub fn count(&self) -> usize {
        self.live().count()
    }

    fn live(&self) -> impl Iterator<Item = (u32, &RowPool)> {
        self.pools
            .iter()
            .enumerate()
            .filter_map(|(i, pool)| Some((i as u32, pool.as_ref()?)))
    }

    /// Rows `len` in a pool that exists: (pool, first row); `None` when none has room.
    /// Lower pools first, so the later ones empty out and can be given back.
    pub fn allocate(&mut self, len: u32) -> Option<(u32, u32)> {
        self.allocate_outside(len, None)
    }

    /// As [`RowPools::allocate`], in any pool but `except`.
    pub fn allocate_outside(&mut self, len: u32, except: Option<u32>) -> Option<(u32, u32)> {
        self.pools
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| Some(*i as u32) != except)
            .find_map(|(i, pool)| Some((i as u32, pool.as_mut()?.allocate(len)?)))
    }

    /// The pool to shrink: the largest that is larger than the smallest pool size and has
    /// been at most a quarter used for `grace` (as seen by the calls up to `now`). Its tables
    /// are then moved out and it is given back. The grace keeps a pool just added, as large
    /// as all before it and nearly empty while the tables that needed it load, from being
    /// shrunk at once and added again.
    pub fn sparse_pool(&mut self, now: Instant, grace: Duration) -> Option<u32> {
        let min_rows = self.min_rows;
        let mut chosen: Option<(u32, u32)> = None;
        for (index, slot) in self.pools.iter_mut().enumerate() {
            let Some(pool) = slot else { continue };
            let sparse = pool.capacity > min_rows
                && u64::from(pool.used) * SPARSE <= u64::from(pool.capacity);
            if !sparse {
                pool.sparse_since = None;
                continue;
            }
            let since = *pool.sparse_since.get_or_insert(now);
            if now.duration_since(since) >= grace
                && chosen.is_none_or(|(_, capacity)| pool.capacity >= capacity)
            {
                chosen = Some((index as u32, pool.capacity));
            }
        }
        chosen.map(|(index, _)| index)
    }

    /// A pool for `len` rows moved out of pool `sparse`, (index, rows): `len` in whole pages,
    /// at least the smallest pool size, and smaller than `sparse` by half at least, so that
    /// moving is worth it; `None` when no slot is free or it would not be smaller.
    pub fn smaller_pool(&self, sparse: u32, len: u32) -> Option<(u32, u32)> {
        let slot = self.pools.iter().position(Option::is_none)? as u32;
        let old = self.pools.get(sparse as usize)?.as_ref()?.capacity();
        let rows =
            u64::from(len.max(self.min_rows)).div_ceil(u64::from(PAGE_ROWS)) * u64::from(PAGE_ROWS);
        (len > 0 && rows * 2 <= u64::from(old)).then_some((slot, rows as u32))
    }

    /// The pool to add for a table of `len` rows, (index, rows): as large as all pools
    /// together, at least `min_rows` and `len`, in whole pages, within the ceiling. `None` when
    /// the ceiling or the outer array leaves no room for it: then tables are evicted instead.
    pub fn next_pool(&self, len: u32) -> Option<(u32, u32)> {
        let slot = self.pools.iter().position(Option::is_none)? as u32;
        let room = self.ceiling.saturating_sub(self.capacity());
        let wanted = self
            .capacity()
            .max(u64::from(self.min_rows))
            .max(u64::from(len))
            .div_ceil(u64::from(PAGE_ROWS))
            * u64::from(PAGE_ROWS);
        let rows = wanted
            .min(room)
            .min(u64::from(u32::MAX / PAGE_ROWS * PAGE_ROWS));
        (len > 0 && rows >= u64::from(len)).then_some((slot, rows as u32))
    }

    /// Pool `index` now exists with `rows` rows (its map was created).
    pub fn add(&mut self, index: u32, rows: u32) {
        if let Some(slot) = self.pools.get_mut(index as usize) {
            *slot = Some(RowPool::new(rows));
        }
    }

    /// Gives back a range [`RowPools::allocate`] returned. Returns whether its pool is now
    /// empty, for the caller to give the pool back too.
    pub fn release(&mut self, index: u32, start: u32, len: u32) -> bool {
        match self.pools.get_mut(index as usize).and_then(Option::as_mut) {
            Some(pool) => {
                pool.release(start, len);
                pool.used() == 0
            }
            None => false,
        }
    }

    /// Pool `index` is gone (its map was removed from the outer array).
    pub fn remove(&mut self, index: u32) {
        if let Some(slot) = self.pools.get_mut(index as usize) {
            *slot = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mostly_empty_pool_is_found_and_a_smaller_one_offered() {
        let mut pools = RowPools::new(4, 1 << 20, 1024);
        pools.add(0, 1024);
        pools.add(1, 8192);
        // The smallest size is never shrunk, however empty; a full large pool is not either.
        pools.pools[0].as_mut().unwrap().allocate(10);
        pools.pools[1].as_mut().unwrap().allocate(8000);
        let start = Instant::now();
        let grace = Duration::from_secs(30);
        assert_eq!(pools.sparse_pool(start, grace), None);
        // A quarter used: worth shrinking once it has been so for the grace period.
        pools.pools[1].as_mut().unwrap().release(2048, 8000 - 2048);
        assert_eq!(pools.sparse_pool(start, grace), None);
        assert_eq!(pools.sparse_pool(start + grace / 2, grace), None);
        assert_eq!(pools.sparse_pool(start + grace, grace), Some(1));
        // Used again in between: the grace starts over.
        pools.pools[1].as_mut().unwrap().allocate(4000);
        assert_eq!(pools.sparse_pool(start + grace * 2, grace), None);
        pools.pools[1].as_mut().unwrap().release(2048, 4000);
        assert_eq!(pools.sparse_pool(start + grace * 3, grace), None);
        assert_eq!(pools.sparse_pool(start + grace * 4, grace), Some(1));
        // Its 2048 rows fit in pool 0's free ones? No: 1014 free. A pool of 2048 rows, in the
        // first free slot, is half its size.
        assert_eq!(pools.allocate_outside(2048, Some(1)), None);
        assert_eq!(pools.smaller_pool(1, 2048), Some((2, 2048)));
        // Rows that would need a pool more than half the old one's size: not worth it.
        assert_eq!(pools.smaller_pool(1, 4097), None);
        // A few rows: the smallest pool size.
        assert_eq!(pools.smaller_pool(1, 10), Some((2, 1024)));
        // Allocation outside a pool skips it even where it has room.
        assert_eq!(pools.allocate_outside(100, Some(0)), Some((1, 2048)));
    }

    #[test]
    fn pools_double_from_the_smallest_and_stop_at_the_ceiling() {
        let mut pools = RowPools::new(4, 10_000, 1000);
        assert_eq!(pools.allocate(10), None);
        // The first pool: the smallest, in whole pages.
        assert_eq!(pools.next_pool(10), Some((0, 1024)));
        pools.add(0, 1024);
        assert_eq!(pools.allocate(1000), Some((0, 0)));
        // The next is as large as all before it.
        assert_eq!(pools.next_pool(100), Some((1, 1024)));
        pools.add(1, 1024);
        // 24 rows are left in the first: the second takes it.
        assert_eq!(pools.allocate(100), Some((1, 0)));
        // A table larger than that gets a pool of its own size.
        assert_eq!(pools.next_pool(5000), Some((2, 5120)));
        pools.add(2, 5120);
        assert_eq!(pools.capacity(), 7168);
        // Only 2832 rows are left under the ceiling.
        assert_eq!(pools.next_pool(3000), None);
        assert_eq!(pools.next_pool(2000), Some((3, 2832)));
        pools.add(3, 2832);
        // No slot is left.
        assert_eq!(pools.next_pool(1), None);
        assert_eq!(pools.count(), 4);
        assert_eq!(pools.used(), 1100);
    }

    #[test]
    fn an_emptied_pool_is_reported_and_its_slot_reused() {
        let mut pools = RowPools::new(2, 1 << 20, 512);
        pools.add(0, 512);
        pools.add(1, 512);
        let (a, first_a) = pools.allocate(300).unwrap();
        let (a2, first_a2) = pools.allocate(200).unwrap();
        let (b, first_b) = pools.allocate(300).unwrap();
        assert_eq!((a, a2, b), (0, 0, 1));
        // Pool 0 still holds a table.
        assert!(!pools.release(a, first_a, 300));
        assert!(pools.release(a2, first_a2, 200));
        assert!(pools.release(b, first_b, 300));
        pools.remove(b);
        assert_eq!(pools.count(), 1);
        assert_eq!(pools.capacity(), 512);
        assert_eq!(pools.used(), 0);
        assert_eq!(pools.next_pool(600), Some((1, 1024)));
        // A pool that does not exist frees nothing.
        assert!(!pools.release(1, 0, 1));
    }

    #[test]
    fn no_pool_for_an_empty_table() {
        let pools = RowPools::new(2, 1 << 20, 512);
        assert_eq!(pools.next_pool(0), None);
    }

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
