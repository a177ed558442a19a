//! Process-map writes: each process's executable mappings in `UNWIND_PROCS`, described by
//! where their tables stand. A full map grows, up to its ceiling; a process that finds no room
//! walks by frame pointers until exits make room.

use scorch_common::{
    ProcMappings, UnwindMapping, MAPPING_NO_TABLE, MAPPING_TABLE_EVICTED, MAPPING_TABLE_LOADED,
    MAPPING_TABLE_PENDING, MAX_PROC_MAPPINGS, PROCS_NO_MAPPINGS,
};

use crate::binary::elf::load_bias;

use super::{
    super::{kernel_maps::is_full, owned::mark_owned},
    runtimes::Attachments,
    FileState, LoaderError, LoaderMaps, ProcMapping, Unwinder,
};

/// How often a full `UNWIND_PROCS` is reported in the log.
const FULL_REPORT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

impl<M: LoaderMaps> Unwinder<M> {
    /// Runs `describe`, which writes `pid`'s mappings to `UNWIND_PROCS`. When the map has no
    /// room, that one process walks by frame pointers, and the others go on: an error here
    /// used to end the whole poll, so with the map full no finished table was ever installed.
    pub(super) fn placed(
        &mut self,
        describe: impl FnOnce(&mut Self) -> Result<bool, LoaderError>,
    ) -> Result<bool, LoaderError> {
        match describe(self) {
            Err(LoaderError::Procs { pid, source }) => {
                self.procs.remove(&pid);
                self.without_room.insert(pid);
                self.without_room_total += 1;
                let now = std::time::Instant::now();
                if self
                    .reported_full
                    .is_none_or(|at| now.duration_since(at) >= FULL_REPORT_INTERVAL)
                {
                    self.reported_full = Some(now);
                    tracing::warn!(
                        "BPF map UNWIND_PROCS has no room for process {pid} ({source}; {} \
                         processes hold it, {} found it full so far): such processes walk by \
                         frame pointers until exits make room",
                        self.procs.len(),
                        self.without_room_total
                    );
                }
                Ok(false)
            }
            other => other,
        }
    }

    /// Writes a process's mappings, as far as its tables are known, to `UNWIND_PROCS`.
    pub(super) fn write(&mut self, pid: u32) -> Result<(), LoaderError> {
        // The entry of the processes the map does not hold, which no process may overwrite.
        if pid == PROCS_NO_MAPPINGS {
            return Ok(());
        }
        let Some(mappings) = self.procs.get(&pid) else {
            return Ok(());
        };
        let mut value = ProcMappings {
            count: 0,
            _reserved: 0,
            mappings: [UnwindMapping::default(); MAX_PROC_MAPPINGS],
        };
        // Mappings with a table first: when a process has more than the BPF side holds, the
        // ones left out fall back to frame pointers either way.
        let Attachments {
            attached: attachments,
            refused,
            later,
        } = self.attachments(pid);
        let mut chosen: Vec<UnwindMapping> = mappings.iter().map(|m| self.describe(m)).collect();
        // The walk hands a frame in a runtime's code to that runtime's walk when its mapping
        // says so.
        for (id, attachment) in &attachments {
            let mut ranges: Vec<(u64, u64)> = attachment
                .owned
                .iter()
                .map(|range| (range.start, range.end))
                .collect();
            // A JIT's code: every anonymous executable mapping, as the process has them now
            // (a new one holds a pc no mapping does, which has the process looked at again).
            if attachment.anonymous_code {
                ranges.extend(
                    mappings
                        .iter()
                        .filter(|m| m.key.is_none())
                        .map(|m| (m.start, m.end)),
                );
            }
            chosen = mark_owned(chosen, &ranges, *id);
        }
        self.note_attach_later(pid, later);
        self.note_refused(pid, refused);
        chosen.sort_by_key(|m| (m.state == MAPPING_NO_TABLE && m.runtime == 0, m.start));
        chosen.truncate(MAX_PROC_MAPPINGS);
        chosen.sort_by_key(|m| m.start);
        value.count = chosen.len() as u32;
        value.mappings[..chosen.len()].copy_from_slice(&chosen);
        let mut inserted = self.maps.insert_process(pid, &value);
        // Full: a map twice as large, up to the ceiling, and again.
        let ceiling = self.maps.process_ceiling();
        if inserted.as_ref().is_err_and(is_full) && self.maps.process_entries() < ceiling {
            let entries = self.maps.process_entries().saturating_mul(2).min(ceiling);
            // A map the kernel will not create leaves this one, full: the process finds no
            // room, as at the ceiling.
            match self.maps.grow_processes(entries) {
                Ok(()) => inserted = self.maps.insert_process(pid, &value),
                Err(error) => tracing::warn!("{error}"),
            }
        }
        inserted.map_err(|source| LoaderError::Procs { pid, source })?;
        self.write_attachments(pid, attachments);
        Ok(())
    }

    fn describe(&self, mapping: &ProcMapping) -> UnwindMapping {
        let mut described = UnwindMapping {
            start: mapping.start,
            end: mapping.end,
            ..UnwindMapping::default()
        };
        let state = mapping.key.and_then(|key| self.files.get(&key));
        let table = match state {
            Some(FileState::Loaded(table)) => self.tables.get(table),
            _ => None,
        };
        match state {
            Some(FileState::Building) => described.state = MAPPING_TABLE_PENDING,
            Some(FileState::Evicted) => described.state = MAPPING_TABLE_EVICTED,
            _ => {}
        }
        if let Some(table) = table {
            // pc minus the load bias is the ELF address; minus the base is the row pc.
            if let Some(bias) = load_bias(&table.segments, mapping.start, mapping.offset) {
                described.bias = bias.wrapping_add(table.base);
                described.pool = table.pool;
                described.first_row = table.first_row;
                described.rows = table.rows;
                described.state = MAPPING_TABLE_LOADED;
            }
        }
        described
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::super::memory_maps::{built, file, process, unwinder, MemoryMaps, Op, PID};
    use super::*;

    /// An unwinder over `maps` with binary 1's table loaded.
    fn loaded(maps: MemoryMaps) -> Unwinder<MemoryMaps> {
        let (mut unwinder, _) = unwinder(maps, 1 << 20);
        unwinder
            .install(file(1), Some(built(100, 1)), &mut HashSet::new())
            .unwrap();
        unwinder
    }

    /// Reads and describes `pids`, each mapping binary 1.
    fn scan(unwinder: &mut Unwinder<MemoryMaps>, pids: &[u32]) {
        unwinder.scan_all(pids, |_| Ok(process(&[1]))).unwrap();
    }

    #[test]
    fn a_full_process_map_grows_twice_as_large_up_to_its_ceiling() {
        let mut unwinder = loaded(MemoryMaps::new(2, 5));
        scan(&mut unwinder, &[PID, PID + 1, PID + 2, PID + 3, PID + 4]);
        let grown: Vec<Op> = unwinder
            .maps
            .ops
            .iter()
            .copied()
            .filter(|op| matches!(op, Op::GrowProcesses(_)))
            .collect();
        assert_eq!(grown, [Op::GrowProcesses(4), Op::GrowProcesses(5)]);
        assert_eq!(unwinder.stats().processes, 5);
        assert_eq!(unwinder.stats().processes_without_room, 0);

        // At the ceiling: no room.
        scan(&mut unwinder, &[PID + 5]);
        assert_eq!(unwinder.maps.entries, 5);
        assert!(!unwinder.maps.procs.contains_key(&(PID + 5)));
        assert_eq!(unwinder.stats().processes_without_room, 1);
    }

    #[test]
    fn a_process_without_room_walks_by_frame_pointers_until_an_exit_makes_room() {
        let mut unwinder = loaded(MemoryMaps::new(2, 2));
        scan(&mut unwinder, &[PID, PID + 1, PID + 2]);
        // The third found the map full: not described, and not read again at its next asks.
        assert!(!unwinder.maps.procs.contains_key(&(PID + 2)));
        assert!(!unwinder.procs.contains_key(&(PID + 2)));
        assert_eq!(unwinder.stats().processes_without_room, 1);
        let now = std::time::Instant::now();
        let asked = || HashSet::from([PID + 2]);
        assert!(unwinder.reads_due(asked(), |_| true, now).is_empty());
        // No process the map holds exited: still no room.
        unwinder.forget(|_| true);
        assert!(unwinder.reads_due(asked(), |_| true, now).is_empty());

        unwinder.forget(|pid| pid != PID);

        assert!(!unwinder.maps.procs.contains_key(&PID));
        assert_eq!(unwinder.reads_due(asked(), |_| true, now), [PID + 2]);
        scan(&mut unwinder, &[PID + 2]);
        assert_eq!(
            unwinder.maps.procs[&(PID + 2)].mappings[0].state,
            MAPPING_TABLE_LOADED
        );
        assert_eq!(unwinder.stats().processes_without_room, 1);
    }

    #[test]
    fn a_process_without_room_that_exits_is_forgotten() {
        let mut unwinder = loaded(MemoryMaps::new(1, 1));
        scan(&mut unwinder, &[PID, PID + 1]);
        assert!(unwinder.without_room.contains(&(PID + 1)));
        // Its pid may come back as another process's.
        unwinder.forget(|pid| pid != PID + 1);
        assert!(unwinder.without_room.is_empty());
        assert!(unwinder.maps.procs.contains_key(&PID));
    }

    #[test]
    fn a_map_the_kernel_will_not_grow_leaves_the_process_without_room() {
        let mut maps = MemoryMaps::new(1, 8);
        maps.refuse_growth = true;
        let mut unwinder = loaded(maps);
        scan(&mut unwinder, &[PID, PID + 1]);
        assert_eq!(unwinder.maps.entries, 1);
        assert!(unwinder.maps.procs.contains_key(&PID));
        assert!(!unwinder.maps.procs.contains_key(&(PID + 1)));
        assert_eq!(unwinder.stats().processes_without_room, 1);
    }

    #[test]
    fn mappings_are_described_as_their_tables_stand() {
        let mut unwinder = loaded(MemoryMaps::new(16, 16));
        unwinder.files.insert(file(2), FileState::Building);
        unwinder.files.insert(file(3), FileState::Evicted);
        unwinder.files.insert(file(4), FileState::Unavailable);
        let mapping = |inode: Option<u64>| ProcMapping {
            start: 0x7f00_0000_0000,
            end: 0x7f00_0001_0000,
            offset: 0x1000,
            key: inode.map(file),
        };
        let loaded = unwinder.describe(&mapping(Some(1)));
        assert_eq!(loaded.state, MAPPING_TABLE_LOADED);
        // Its segment's file offset and ELF address are the same: the bias is where the
        // file is mapped.
        assert_eq!(loaded.bias, 0x7f00_0000_0000 - 0x1000);
        assert_eq!((loaded.first_row, loaded.rows), (0, 100));
        let states: Vec<u16> = [Some(2), Some(3), Some(4), None, Some(5)]
            .into_iter()
            .map(|inode| unwinder.describe(&mapping(inode)).state)
            .collect();
        assert_eq!(
            states,
            [
                MAPPING_TABLE_PENDING,
                MAPPING_TABLE_EVICTED,
                MAPPING_NO_TABLE,
                MAPPING_NO_TABLE,
                MAPPING_NO_TABLE
            ]
        );
    }

    #[test]
    fn the_walks_entry_for_processes_the_map_does_not_hold_is_never_written() {
        let mut unwinder = loaded(MemoryMaps::new(16, 16));
        unwinder.procs.insert(PROCS_NO_MAPPINGS, Vec::new());
        unwinder.write(PROCS_NO_MAPPINGS).unwrap();
        assert!(!unwinder
            .maps
            .ops
            .contains(&Op::InsertProcess(PROCS_NO_MAPPINGS)));
    }
}
