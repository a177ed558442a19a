//! Table install and eviction: the tables the worker finished go into the row pools, which
//! grow within their ceiling; at the ceiling the least recently used tables go, after the
//! mappings that point at them have been rewritten, and so do the tables no process has
//! mapped for a while. Freed rows are reused only once the row epoch has moved on.

use std::collections::HashSet;

use super::{
    BuildResult, Built, FileKey, FileState, LoaderError, LoaderMaps, Table, TableKey, Unwinder,
    VDSO,
};

/// How long a table no process maps stays loaded: long enough that a binary run again and
/// again (a build's compilers, a shell loop) keeps its table between runs, short enough that
/// the pools a build grew are given back within a minute of its end (with
/// [`Unwinder::shrink_pools`]). A cron job's binary, run less often, is built again each run.
const IDLE_TABLE_AGE: std::time::Duration = std::time::Duration::from_secs(30);

/// Bytes of an unwind row.
const ROW_BYTES: u64 = std::mem::size_of::<scorch_common::UnwindRow>() as u64;

/// Longest [`Unwinder::poll`] waits for tables it has just asked for.
const BUILD_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

impl<M: LoaderMaps> Unwinder<M> {
    /// Installs the tables the worker finished, and rewrites the processes that use them.
    pub(super) fn install_built(&mut self, requested: bool) -> Result<(), LoaderError> {
        let mut changed = HashSet::new();
        // Tables take milliseconds to build (libc: 1.5 ms): when some were just asked for, wait
        // for them a little, so their processes get whole stacks one poll sooner. Bounded far
        // below a window.
        let deadline = std::time::Instant::now() + BUILD_WAIT;
        while requested && self.building() > 0 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.results.recv_timeout(left) {
                Ok(result) => self.finished(result, &mut changed)?,
                Err(_) => break,
            }
        }
        while let Ok(result) = self.results.try_recv() {
            self.finished(result, &mut changed)?;
        }
        if !changed.is_empty() {
            for pid in self.users_of(&changed) {
                self.placed(|unwinder| unwinder.write(pid).map(|()| false))?;
            }
        }
        Ok(())
    }

    /// The files whose table is `key`'s.
    pub(super) fn files_of(&self, key: &TableKey) -> HashSet<FileKey> {
        let loaded = FileState::Loaded(key.clone());
        self.files
            .iter()
            .filter(|(_, state)| **state == loaded)
            .map(|(file, _)| *file)
            .collect()
    }

    /// The processes that map any of `files`: whose process-map entries name their tables.
    pub(super) fn users_of(&self, files: &HashSet<FileKey>) -> Vec<u32> {
        self.procs
            .iter()
            .filter(|(_, mappings)| {
                mappings
                    .iter()
                    .any(|m| m.key.is_some_and(|k| files.contains(&k)))
            })
            .map(|(&pid, _)| pid)
            .collect()
    }

    /// Tables the worker has not finished.
    pub(super) fn building(&self) -> usize {
        self.files
            .values()
            .filter(|state| **state == FileState::Building)
            .count()
    }

    /// Takes what the worker sent for a file.
    fn finished(
        &mut self,
        result: BuildResult,
        changed: &mut HashSet<FileKey>,
    ) -> Result<(), LoaderError> {
        match result {
            BuildResult::Runtime(file, runtime) => {
                if let Some(runtime) = runtime {
                    self.runtimes.insert(file, runtime);
                    changed.insert(file);
                }
                Ok(())
            }
            BuildResult::Table(file, built) => self.install(file, built, changed),
        }
    }

    /// Puts a finished table in the pool, evicting the least recently used ones for room; or,
    /// when a table of the same build id is there already, points the file at it.
    pub(super) fn install(
        &mut self,
        file: FileKey,
        built: Option<Built>,
        changed: &mut HashSet<FileKey>,
    ) -> Result<(), LoaderError> {
        changed.insert(file);
        let Some(built) = built else {
            self.files.insert(file, FileState::Unavailable);
            return Ok(());
        };
        let key = match built.build_id {
            Some(id) => TableKey::BuildId(id),
            None => TableKey::File(file),
        };
        if let Some(table) = self.tables.get_mut(&key) {
            table.last_used = self.clock;
            self.files.insert(file, FileState::Loaded(key));
            return Ok(());
        }
        let len = u32::try_from(built.rows.len()).unwrap_or(u32::MAX);
        if len == 0 || u64::from(len) > self.pools.ceiling() {
            self.files.insert(file, FileState::Unavailable);
            return Ok(());
        }
        // Room in a pool; else a new pool, within the ceiling; else the least recently used
        // tables go until there is room.
        // A pool the kernel refused is not asked for again in this install.
        let mut may_grow = true;
        let (pool, first_row) = loop {
            if let Some(place) = self.pools.allocate(len) {
                break place;
            }
            if let Some((index, rows)) = self.pools.next_pool(len).filter(|_| may_grow) {
                match self.maps.create_pool(index, rows) {
                    Ok(()) => {
                        self.pools.add(index, rows);
                        continue;
                    }
                    // The kernel's memory limits refuse it: evict instead, as at the ceiling.
                    Err(error) if self.pools.count() > 0 => {
                        tracing::warn!("{error}; evicting unwind tables for room instead");
                        may_grow = false;
                    }
                    Err(error) => {
                        self.files.insert(file, FileState::Unavailable);
                        return Err(error);
                    }
                }
            }
            let Some(victim) = self.least_recently_used() else {
                self.files.insert(file, FileState::Unavailable);
                return Ok(());
            };
            self.evict(victim, true)?;
        };
        if let Err(error) = self.maps.write_rows(pool, first_row, &built.rows) {
            // The range goes back; the file walks with frame pointers (counted) meanwhile.
            self.release(pool, first_row, len);
            self.files.insert(file, FileState::Unavailable);
            return Err(error);
        }
        self.tables.insert(
            key.clone(),
            Table {
                pool,
                first_row,
                rows: len,
                base: built.base,
                segments: built.segments,
                last_used: self.clock,
                unused_since: None,
            },
        );
        self.files.insert(file, FileState::Loaded(key));
        Ok(())
    }

    /// The vDSO's table, which is never evicted. It is keyed by the image's build id (a
    /// kernel's vDSO has one), not by the file key the vDSO is known by.
    fn vdso_table(&self) -> Option<&TableKey> {
        match self.files.get(&VDSO) {
            Some(FileState::Loaded(key)) => Some(key),
            _ => None,
        }
    }

    /// The table to evict next; never the vDSO's, which every process shares and nothing
    /// would load again.
    fn least_recently_used(&self) -> Option<TableKey> {
        let vdso = self.vdso_table();
        self.tables
            .iter()
            .filter(|(key, _)| Some(*key) != vdso)
            .min_by_key(|(key, table)| (table.last_used, *key))
            .map(|(key, _)| key.clone())
    }

    /// Drops a table, `for_room` at the pools' ceiling (counted as evicted) or as idle: first
    /// the mappings that use it fall back to frame pointers, then its rows are freed for
    /// another table, and a pool it leaves empty is given back.
    fn evict(&mut self, key: TableKey, for_room: bool) -> Result<(), LoaderError> {
        let Some(table) = self.tables.remove(&key) else {
            return Ok(());
        };
        self.evicted += u64::from(for_room);
        // Its files are built again by the next process that maps one. Evicted for room, the
        // processes mapping them now count their walks through it; idle, none maps them.
        let files = self.files_of(&key);
        if for_room {
            for file in &files {
                self.files.insert(*file, FileState::Evicted);
            }
        } else {
            self.files.retain(|file, _| !files.contains(file));
        }
        for pid in self.users_of(&files) {
            self.write(pid)?;
        }
        self.release(table.pool, table.first_row, table.rows);
        Ok(())
    }

    /// Frees a table's rows; a pool left empty is given back, with its memory. Before any
    /// other table can take them, the row epoch moves on: the program's cache of found rows
    /// (`ROW_CACHE`) holds rows by their place in a pool, which from now on may be another
    /// table's. The mappings that used the rows were rewritten first, so a walk that reads the
    /// new epoch also reads mappings that no longer point here.
    pub(super) fn release(&mut self, pool: u32, first_row: u32, rows: u32) {
        self.row_epoch += 1;
        if let Err(error) = self.maps.set_row_epoch(self.row_epoch) {
            // Not expected of a one-entry array; the rows stay taken, as a table no longer
            // used, rather than be reused under rows the program may still hold.
            tracing::warn!("writing BPF map ROW_EPOCH: {error}; {rows} unwind rows not reused");
            return;
        }
        if self.pools.release(pool, first_row, rows) {
            let bytes = u64::from(self.pools.capacity_of(pool)) * ROW_BYTES;
            self.maps.remove_pool(pool);
            self.pools.remove(pool);
            self.pools_given_back += 1;
            self.pool_bytes_given_back += bytes;
        }
    }

    /// Evicts the tables no process has mapped for [`IDLE_TABLE_AGE`] (never the vDSO's), so
    /// the pools follow what the processes running need, not the most they ever needed.
    pub(super) fn evict_idle(&mut self, now: std::time::Instant) {
        let mapped: HashSet<&TableKey> = self
            .procs
            .values()
            .flatten()
            .filter_map(|mapping| match self.files.get(&mapping.key?) {
                Some(FileState::Loaded(table)) => Some(table),
                _ => None,
            })
            .collect();
        let vdso = self.vdso_table().cloned();
        let mut idle = Vec::new();
        for (key, table) in &mut self.tables {
            if mapped.contains(key) || Some(key) == vdso.as_ref() {
                table.unused_since = None;
                continue;
            }
            let since = *table.unused_since.get_or_insert(now);
            if now.duration_since(since) >= IDLE_TABLE_AGE {
                idle.push(key.clone());
            }
        }
        for key in idle {
            // No process maps it, so no process map is rewritten: this cannot fail.
            self.idle += 1;
            if let Err(error) = self.evict(key, false) {
                tracing::debug!("evicting an idle unwind table: {error}");
            }
        }
        self.shrink_pools(now);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use scorch_common::{MAPPING_TABLE_EVICTED, MAPPING_TABLE_LOADED};

    use super::super::memory_maps::{built, file, process, unwinder, MemoryMaps, Op, PID};
    use super::*;

    /// Hands `unwinder` the table of binary `inode` (its build id the same number), as the
    /// worker would, and installs it.
    fn finish(
        unwinder: &mut Unwinder<MemoryMaps>,
        outbox: &mpsc::Sender<BuildResult>,
        inode: u64,
        rows: usize,
    ) {
        let table = built(rows, inode as u8);
        outbox
            .send(BuildResult::Table(file(inode), Some(table)))
            .unwrap();
        unwinder.install_built(false).unwrap();
    }

    /// Describes process `pid`, whose code is in `inodes`.
    fn scan(unwinder: &mut Unwinder<MemoryMaps>, pid: u32, inodes: &[u64]) {
        unwinder.scan_all(&[pid], |_| Ok(process(inodes))).unwrap();
    }

    fn state(unwinder: &Unwinder<MemoryMaps>, pid: u32) -> u16 {
        unwinder.maps.procs[&pid].mappings[0].state
    }

    #[test]
    fn at_the_ceiling_the_least_recently_used_table_goes_after_its_processes() {
        // Two pools of 512 rows reach the ceiling.
        let (mut unwinder, outbox) = unwinder(MemoryMaps::new(16, 16), 1024);
        unwinder.clock = 1;
        finish(&mut unwinder, &outbox, 1, 300);
        unwinder.clock = 2;
        finish(&mut unwinder, &outbox, 2, 300);
        assert_eq!(unwinder.maps.pools.len(), 2);
        // Mapped since, the first one later than the second.
        unwinder.clock = 3;
        scan(&mut unwinder, PID + 2, &[2]);
        unwinder.clock = 4;
        scan(&mut unwinder, PID + 1, &[1]);
        let before = unwinder.maps.ops.len();

        unwinder.clock = 5;
        finish(&mut unwinder, &outbox, 3, 300);

        assert_eq!(unwinder.files[&file(2)], FileState::Evicted);
        assert!(matches!(unwinder.files[&file(1)], FileState::Loaded(_)));
        assert!(matches!(unwinder.files[&file(3)], FileState::Loaded(_)));
        assert_eq!(state(&unwinder, PID + 2), MAPPING_TABLE_EVICTED);
        assert_eq!(state(&unwinder, PID + 1), MAPPING_TABLE_LOADED);
        // Its process first, then the epoch, then its pool, empty, given back and made again
        // for the new table.
        assert_eq!(
            unwinder.maps.ops[before..],
            [
                Op::InsertProcess(PID + 2),
                Op::RowEpoch(1),
                Op::RemovePool(1),
                Op::CreatePool {
                    index: 1,
                    rows: 512
                },
            ]
        );
        let stats = unwinder.stats();
        assert_eq!((stats.tables_loaded, stats.tables_evicted), (2, 1));
        assert_eq!(stats.rows_used, 600);
    }

    #[test]
    fn a_pool_the_kernel_refuses_makes_room_by_eviction_instead() {
        let mut maps = MemoryMaps::new(16, 16);
        maps.pools_allowed = Some(1);
        let (mut unwinder, outbox) = unwinder(maps, 1 << 20);
        unwinder.clock = 1;
        finish(&mut unwinder, &outbox, 1, 200);
        unwinder.clock = 2;
        finish(&mut unwinder, &outbox, 2, 200);
        unwinder.clock = 3;
        // 112 rows left in the one pool the kernel allows.
        finish(&mut unwinder, &outbox, 3, 150);
        assert_eq!(unwinder.maps.pools.len(), 1);
        assert_eq!(unwinder.files[&file(1)], FileState::Evicted);
        assert!(matches!(unwinder.files[&file(3)], FileState::Loaded(_)));
        assert_eq!(unwinder.stats().tables_evicted, 1);
    }

    #[test]
    fn a_first_pool_the_kernel_refuses_leaves_the_table_unavailable() {
        let mut maps = MemoryMaps::new(16, 16);
        maps.pools_allowed = Some(0);
        let (mut unwinder, _) = unwinder(maps, 1 << 20);
        let error = unwinder.install(file(1), Some(built(100, 1)), &mut HashSet::new());
        assert!(matches!(error, Err(LoaderError::AddPool { index: 0, .. })));
        assert_eq!(unwinder.files[&file(1)], FileState::Unavailable);
    }

    #[test]
    fn a_table_no_process_maps_goes_once_idle_and_its_empty_pool_with_it() {
        let (mut unwinder, outbox) = unwinder(MemoryMaps::new(16, 16), 1 << 20);
        finish(&mut unwinder, &outbox, 1, 300);
        finish(&mut unwinder, &outbox, 2, 300);
        scan(&mut unwinder, PID, &[1]);
        let start = std::time::Instant::now();
        unwinder.evict_idle(start);
        unwinder.evict_idle(start + IDLE_TABLE_AGE - std::time::Duration::from_secs(1));
        assert_eq!(unwinder.stats().tables_loaded, 2);
        let before = unwinder.maps.ops.len();

        unwinder.evict_idle(start + IDLE_TABLE_AGE);

        // Forgotten, not evicted: no process maps it, and the next one builds it again.
        assert!(!unwinder.files.contains_key(&file(2)));
        assert_eq!(
            unwinder.maps.ops[before..],
            [Op::RowEpoch(1), Op::RemovePool(1)]
        );
        assert_eq!(state(&unwinder, PID), MAPPING_TABLE_LOADED);
        let stats = unwinder.stats();
        assert_eq!((stats.tables_loaded, stats.tables_idle), (1, 1));
        assert_eq!(stats.tables_evicted, 0);
    }

    /// The vDSO's table is keyed by its image's build id, as any table with one: it stays
    /// through idle eviction and eviction for room, though no process's maps asked for it.
    #[test]
    fn the_vdso_table_is_never_evicted() {
        let (mut unwinder, outbox) = unwinder(MemoryMaps::new(16, 16), 1024);
        unwinder
            .install(VDSO, Some(built(300, 0xd5)), &mut HashSet::new())
            .unwrap();
        assert!(matches!(
            &unwinder.files[&VDSO],
            FileState::Loaded(TableKey::BuildId(_))
        ));
        let start = std::time::Instant::now();
        unwinder.evict_idle(start);
        unwinder.evict_idle(start + IDLE_TABLE_AGE);
        assert!(matches!(unwinder.files[&VDSO], FileState::Loaded(_)));
        // At the ceiling, the other table goes.
        unwinder.clock = 1;
        finish(&mut unwinder, &outbox, 1, 300);
        unwinder.clock = 2;
        finish(&mut unwinder, &outbox, 2, 300);
        assert!(matches!(unwinder.files[&VDSO], FileState::Loaded(_)));
        assert!(!matches!(unwinder.files[&file(1)], FileState::Loaded(_)));
        assert_eq!(unwinder.stats().tables_evicted, 1);
    }

    #[test]
    fn a_table_mapped_again_is_idle_from_scratch() {
        let (mut unwinder, outbox) = unwinder(MemoryMaps::new(16, 16), 1 << 20);
        finish(&mut unwinder, &outbox, 1, 300);
        let start = std::time::Instant::now();
        unwinder.evict_idle(start);
        scan(&mut unwinder, PID, &[1]);
        unwinder.evict_idle(start + IDLE_TABLE_AGE / 2);
        unwinder.procs.remove(&PID);
        // Unmapped since `IDLE_TABLE_AGE` only.
        unwinder.evict_idle(start + IDLE_TABLE_AGE);
        unwinder.evict_idle(start + IDLE_TABLE_AGE * 2 - std::time::Duration::from_secs(1));
        assert_eq!(unwinder.stats().tables_loaded, 1);
        unwinder.evict_idle(start + IDLE_TABLE_AGE * 2);
        assert_eq!(unwinder.stats().tables_loaded, 0);
    }

    #[test]
    fn rows_stay_taken_when_the_row_epoch_cannot_move() {
        let mut maps = MemoryMaps::new(16, 16);
        maps.refuse_epoch = true;
        let (mut unwinder, outbox) = unwinder(maps, 1 << 20);
        finish(&mut unwinder, &outbox, 1, 300);
        let start = std::time::Instant::now();
        unwinder.evict_idle(start);
        unwinder.evict_idle(start + IDLE_TABLE_AGE);
        let stats = unwinder.stats();
        assert_eq!((stats.tables_loaded, stats.rows_used), (0, 300));
        assert_eq!(unwinder.maps.pools.len(), 1);
    }
}
