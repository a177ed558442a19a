//! Shrinking the row pools: a pool grown for tables that are gone (a build's compilers exited,
//! their tables idle) is left mostly empty, its few remaining tables (libc, the vDSO) holding
//! it whole. Those tables move to the other pools' free rows, or to a pool sized for them, and
//! the emptied pool is given back, so the pools follow what the running processes need. A
//! pool is shrunk only once it has been sparse for a grace period: one just added is nearly
//! empty while the tables that needed it load.
//!
//! A move is an eviction's protocol with the rows kept: the rows are copied first, then every
//! process mapping that used them is rewritten to the new place, and only then are the old
//! rows freed (the row epoch moves on, and the emptied pool goes).

use super::{LoaderError, LoaderMaps, TableKey, Unwinder};

/// How long a pool stays sparse before it is shrunk: long enough that a pool added for a
/// burst of tables (a build starting its compilers) is not shrunk while they load, and so
/// pools are shrunk and added again at most this often; short enough that, after the idle
/// tables' own 30 s, what a build grew goes within a minute of its end.
const SPARSE_POOL_AGE: std::time::Duration = std::time::Duration::from_secs(10);

impl<M: LoaderMaps> Unwinder<M> {
    /// Shrinks the sparsest large pool (`RowPools::sparse_pool`): its tables, largest first,
    /// go to the other pools' free rows; the first that fits nowhere has a pool made for it and
    /// those after it, when that pool would be half the old one's size at most. A table that
    /// cannot move stays, and so does its pool.
    pub(super) fn shrink_pools(&mut self, now: std::time::Instant) {
        let Some(sparse) = self.pools.sparse_pool(now, SPARSE_POOL_AGE) else {
            return;
        };
        let mut moving: Vec<(TableKey, u32)> = self
            .tables
            .iter()
            .filter(|(_, table)| table.pool == sparse)
            .map(|(key, table)| (key.clone(), table.rows))
            .collect();
        moving.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let mut left: u32 = moving.iter().map(|(_, rows)| rows).sum();
        let mut created = false;
        for (key, rows) in moving {
            let mut place = self.pools.allocate_outside(rows, Some(sparse));
            if place.is_none() && !created {
                created = true;
                if let Some((index, pool_rows)) = self.pools.smaller_pool(sparse, left) {
                    match self.maps.create_pool(index, pool_rows) {
                        Ok(()) => {
                            self.pools.add(index, pool_rows);
                            place = self.pools.allocate_outside(rows, Some(sparse));
                        }
                        Err(error) => tracing::debug!("shrinking row pool {sparse}: {error}"),
                    }
                }
            }
            left -= rows;
            let Some(place) = place else {
                continue;
            };
            if let Err(error) = self.move_table(&key, place) {
                tracing::warn!("moving an unwind table out of row pool {sparse}: {error}");
            }
        }
    }

    /// Moves table `key` to the rows `to` allocated for it: copy, rewrite its users, free the
    /// old rows. When the copy fails, the new rows go back and the table stays; when a user
    /// cannot be rewritten, the old rows stay taken (that process may still point at them).
    fn move_table(&mut self, key: &TableKey, to: (u32, u32)) -> Result<(), LoaderError> {
        let Some(table) = self.tables.get(key) else {
            return Ok(());
        };
        let (from, rows) = ((table.pool, table.first_row), table.rows);
        if let Err(error) = self.maps.copy_rows(from, to, rows) {
            self.pools.release(to.0, to.1, rows);
            return Err(error);
        }
        if let Some(table) = self.tables.get_mut(key) {
            (table.pool, table.first_row) = to;
        }
        for pid in self.users_of(&self.files_of(key)) {
            self.write(pid)?;
        }
        self.moved += 1;
        self.release(from.0, from.1, rows);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use scorch_common::UnwindRow;

    use super::super::memory_maps::{built, file, process, unwinder, MemoryMaps, Op, PID};
    use super::super::{BuildResult, Built};
    use super::*;

    /// A table of `rows` rows whose pcs count up from `pc`: moved rows can be told apart.
    fn numbered(rows: u32, pc: u32, id: u8) -> Built {
        Built {
            rows: (0..rows)
                .map(|i| UnwindRow {
                    pc: pc + i,
                    ..UnwindRow::default()
                })
                .collect(),
            ..built(0, id)
        }
    }

    fn finish(
        unwinder: &mut Unwinder<MemoryMaps>,
        outbox: &std::sync::mpsc::Sender<BuildResult>,
        inode: u64,
        table: Built,
    ) {
        outbox
            .send(BuildResult::Table(file(inode), Some(table)))
            .unwrap();
        unwinder.install_built(false).unwrap();
    }

    /// Where process `pid`'s mapping of its `index`th binary points: (pool, first row, rows).
    fn place(unwinder: &Unwinder<MemoryMaps>, pid: u32, index: usize) -> (u32, u32, u32) {
        let mapping = unwinder.maps.procs[&pid].mappings[index];
        (mapping.pool, mapping.first_row, mapping.rows)
    }

    /// A build's compiler grew a large pool, and a small library loaded after it landed in
    /// that pool's free end. Once the compiler's table is idle, the small one moves to a pool
    /// of its size, its process is rewritten before the old rows are freed, and the large pool
    /// is given back; the other process's table is not touched.
    #[test]
    fn a_pool_left_mostly_empty_is_given_back_and_its_tables_moved() {
        let (mut unwinder, outbox) = unwinder(MemoryMaps::new(16, 16), 1 << 20);
        finish(&mut unwinder, &outbox, 1, numbered(512, 0, 1));
        finish(&mut unwinder, &outbox, 2, numbered(5000, 10_000, 2));
        finish(&mut unwinder, &outbox, 3, numbered(100, 20_000, 3));
        unwinder.scan_all(&[PID], |_| Ok(process(&[1, 3]))).unwrap();
        unwinder
            .scan_all(&[PID + 1], |_| Ok(process(&[2])))
            .unwrap();
        assert_eq!(place(&unwinder, PID, 0), (0, 0, 512));
        assert_eq!(place(&unwinder, PID, 1), (1, 5000, 100));
        assert_eq!(unwinder.maps.pools[&1].len(), 5120);

        // The compiler exits; its table idles out.
        unwinder.procs.remove(&(PID + 1));
        let start = std::time::Instant::now();
        unwinder.evict_idle(start);
        let idle = start + std::time::Duration::from_secs(3600);
        let before = unwinder.maps.ops.len();
        unwinder.evict_idle(idle);
        // Sparse from now on; shrunk once it has been so for its grace period.
        assert_eq!(unwinder.maps.ops[before..], [Op::RowEpoch(1)]);
        unwinder.evict_idle(idle + SPARSE_POOL_AGE);

        assert_eq!(
            unwinder.maps.ops[before..],
            [
                Op::RowEpoch(1),
                Op::CreatePool {
                    index: 2,
                    rows: 512
                },
                Op::CopyRows {
                    from: 1,
                    to: 2,
                    rows: 100
                },
                Op::InsertProcess(PID),
                Op::RowEpoch(2),
                Op::RemovePool(1),
            ]
        );
        assert_eq!(place(&unwinder, PID, 0), (0, 0, 512));
        assert_eq!(place(&unwinder, PID, 1), (2, 0, 100));
        let moved: Vec<u32> = unwinder.maps.pools[&2][..100]
            .iter()
            .map(|r| r.pc)
            .collect();
        assert_eq!(moved, (20_000..20_100).collect::<Vec<_>>());
        let kept: Vec<u32> = unwinder.maps.pools[&0].iter().map(|r| r.pc).collect();
        assert_eq!(kept, (0..512).collect::<Vec<_>>());
        let stats = unwinder.stats();
        assert_eq!((stats.tables_moved, stats.pools_given_back), (1, 1));
        assert_eq!(stats.pool_bytes_given_back, 5120 * 8);
        assert_eq!(stats.pool_bytes, (512 + 512) * 8);

        // Nothing more to do: the pools are as small as their tables allow.
        let before = unwinder.maps.ops.len();
        unwinder.shrink_pools(idle + SPARSE_POOL_AGE * 3);
        assert_eq!(unwinder.maps.ops.len(), before);
    }

    /// Room in another pool takes the tables without a new one; a pool more than a quarter
    /// used stays.
    #[test]
    fn tables_move_to_free_rows_elsewhere_and_busy_pools_stay() {
        let (mut unwinder, outbox) = unwinder(MemoryMaps::new(16, 16), 1 << 20);
        finish(&mut unwinder, &outbox, 1, numbered(300, 0, 1));
        finish(&mut unwinder, &outbox, 4, numbered(200, 1000, 4));
        finish(&mut unwinder, &outbox, 2, numbered(5000, 10_000, 2));
        // The first pool has 12 rows free: this one goes after the big one.
        finish(&mut unwinder, &outbox, 3, numbered(100, 20_000, 3));
        unwinder.scan_all(&[PID], |_| Ok(process(&[1]))).unwrap();
        unwinder
            .scan_all(&[PID + 1], |_| Ok(process(&[2, 4])))
            .unwrap();
        unwinder
            .scan_all(&[PID + 2], |_| Ok(process(&[3])))
            .unwrap();
        assert_eq!(place(&unwinder, PID + 2, 0), (1, 5000, 100));
        // Busy: nothing moves.
        let start = std::time::Instant::now();
        unwinder.shrink_pools(start);
        unwinder.shrink_pools(start + SPARSE_POOL_AGE * 2);
        assert_eq!(unwinder.stats().tables_moved, 0);

        // The compiler's tables go, leaving 212 rows free in the first pool.
        unwinder.procs.remove(&(PID + 1));
        unwinder.evict_idle(start);
        let idle = start + std::time::Duration::from_secs(3600);
        unwinder.evict_idle(idle);
        unwinder.evict_idle(idle + SPARSE_POOL_AGE);
        assert_eq!(place(&unwinder, PID + 2, 0), (0, 300, 100));
        assert_eq!(place(&unwinder, PID, 0), (0, 0, 300));
        assert_eq!(unwinder.maps.pools.keys().copied().collect::<Vec<_>>(), [0]);
        let moved: Vec<u32> = unwinder.maps.pools[&0][300..400]
            .iter()
            .map(|r| r.pc)
            .collect();
        assert_eq!(moved, (20_000..20_100).collect::<Vec<_>>());
        let stats = unwinder.stats();
        assert_eq!((stats.tables_moved, stats.pools_given_back), (1, 1));
    }
}
