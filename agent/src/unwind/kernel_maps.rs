//! The unwinder's BPF maps that the agent creates while it runs, behind the outer arrays the
//! program holds: the row pools the tables go in (`UNWIND_ROWS`) and the process map
//! (`UNWIND_PROCS`). Creating them as the work needs them, instead of at their ceilings when
//! the program loads, is what keeps a quiet host's map memory small. [`KernelMaps`] holds them
//! with the program's own, and is how the loader writes them ([`LoaderMaps`]).

use aya::maps::{Array, MapData, MapError, RingBuf};
use scorch_common::{
    ProcMappings, RuntimeId, UnwindMapping, UnwindRow, MAX_PROC_MAPPINGS, MAX_ROW_POOLS,
    PROCS_NO_MAPPINGS,
};

use super::loader::{LoaderError, LoaderMaps};
use crate::pipeline::maps::UnwindMaps;
use crate::sys::inner_maps::{
    clear_inner, create_inner, set_inner, AsFdRaw, BytesMap, InnerMapError, BPF_MAP_TYPE_ARRAY,
    BPF_MAP_TYPE_HASH,
};

/// The unwinder's BPF maps: the sampler's ([`UnwindMaps`], whose fields these are) and the
/// ones the agent creates behind their outer arrays. The loader writes the pools, the process
/// map and the row epoch through [`LoaderMaps`]; the rest it reads and writes itself.
pub struct KernelMaps {
    /// The row pools' outer array (`UNWIND_ROWS`), which the pools are put in.
    rows: MapData,
    /// The row pools in `rows`.
    pools: PoolMaps,
    /// The process map's outer array (`UNWIND_PROCS`, one slot).
    procs: MapData,
    /// The process map in `procs`'s slot, which the BPF side reads.
    procs_map: ProcMap,
    /// Processes the process map may grow to hold: the ceiling.
    processes: u32,
    /// `ROW_EPOCH`: bumped whenever rows are freed, so the program's per-CPU cache of found
    /// rows drops every row it holds.
    row_epoch: Array<MapData, u64>,
    /// Unknown processes and pcs, from the program.
    pub(super) events: RingBuf<MapData>,
    /// Each walked runtime's map of processes (`PYTHON_PROCS`), written as bytes.
    runtime_procs: Vec<(RuntimeId, BytesMap)>,
}

impl KernelMaps {
    /// Takes over the sampler's maps, and puts a process map in `UNWIND_PROCS` sized for the
    /// processes running.
    pub(super) fn new(maps: UnwindMaps) -> Result<Self, LoaderError> {
        let UnwindMaps {
            rows,
            // The pools' bookkeeping (`RowPools`) takes it.
            pool_rows: _,
            procs,
            processes,
            events,
            row_epoch,
            runtime_procs,
        } = maps;
        let entries = initial_process_entries(crate::sys::running_processes(), processes);
        let procs_map = ProcMap::create(&procs, entries)?;
        Ok(KernelMaps {
            rows,
            pools: PoolMaps::new(),
            procs,
            procs_map,
            processes,
            row_epoch,
            events,
            runtime_procs,
        })
    }
}

impl LoaderMaps for KernelMaps {
    fn create_pool(&mut self, index: u32, rows: u32) -> Result<(), LoaderError> {
        self.pools.create(&self.rows, index, rows)
    }

    fn write_rows(
        &mut self,
        pool: u32,
        first_row: u32,
        rows: &[UnwindRow],
    ) -> Result<(), LoaderError> {
        self.pools.write(pool, first_row, rows)
    }

    fn copy_rows(
        &mut self,
        from: (u32, u32),
        to: (u32, u32),
        rows: u32,
    ) -> Result<(), LoaderError> {
        self.pools.copy(from, to, rows)
    }

    fn remove_pool(&mut self, index: u32) {
        self.pools.remove(&self.rows, index);
    }

    fn set_row_epoch(&mut self, epoch: u64) -> Result<(), MapError> {
        self.row_epoch.set(0, epoch, 0)
    }

    fn insert_process(&mut self, pid: u32, mappings: &ProcMappings) -> Result<(), MapError> {
        self.procs_map.map.insert(pid, mappings, 0)
    }

    fn remove_process(&mut self, pid: u32) -> Result<(), MapError> {
        self.procs_map.map.remove(&pid)
    }

    fn process_entries(&self) -> u32 {
        self.procs_map.entries
    }

    fn process_ceiling(&self) -> u32 {
        self.processes
    }

    fn grow_processes(&mut self, entries: u32) -> Result<(), LoaderError> {
        self.procs_map = self.procs_map.replaced(&self.procs, entries)?;
        Ok(())
    }

    fn insert_runtime_entry(
        &mut self,
        id: RuntimeId,
        pid: u32,
        entry: &[u8],
    ) -> Result<(), LoaderError> {
        let (_, map) = self
            .runtime_procs
            .iter()
            .find(|(runtime, _)| *runtime == id)
            .ok_or(LoaderError::NoRuntimeMap(id))?;
        map.insert(pid, entry)
            .map_err(|source| LoaderError::RuntimeEntry {
                pid,
                runtime: id,
                source,
            })
    }

    fn remove_runtime_entry(&mut self, id: RuntimeId, pid: u32) {
        if let Some((_, map)) = self
            .runtime_procs
            .iter()
            .find(|(runtime, _)| *runtime == id)
        {
            // Gone already is fine; any other failure leaves an entry the walk finds no
            // mapping marked for, so it is never entered.
            let _ = map.remove(pid);
        }
    }
}

/// The row pools' maps: each a `BPF_F_MMAPABLE` array the agent creates when the tables need
/// room, puts in `UNWIND_ROWS` (the outer array, beside this in [`KernelMaps`]) and removes
/// when its last table goes, which frees its memory.
///
/// Only the pages a table is written to are mapped into the agent, and only while it is
/// written: the kernel maps every page of a mapping of a BPF array at `mmap` time, so a
/// mapping of a whole pool kept open would count it in the daemon's RSS, although the memory
/// is the map's own (kernel memory, counted once in `scorch_bpf_map_memory_bytes`).
pub(super) struct PoolMaps {
    /// Each pool's map and its rows, by its index in `UNWIND_ROWS`.
    maps: Vec<Option<(MapData, u32)>>,
}

/// A pool's `map_flags`: `BPF_F_MMAPABLE | BPF_F_INNER_MAP`, as the BPF side's template
/// declares them (the kernel refuses an inner map whose flags differ).
const POOL_FLAGS: u32 = (1 << 10) | (1 << 12);

impl PoolMaps {
    fn new() -> Self {
        PoolMaps {
            maps: (0..MAX_ROW_POOLS).map(|_| None).collect(),
        }
    }

    /// Creates pool `index` with `rows` rows and puts it in the outer array.
    fn create(&mut self, outer: &MapData, index: u32, rows: u32) -> Result<(), LoaderError> {
        let map = create_inner(
            BPF_MAP_TYPE_ARRAY,
            std::mem::size_of::<UnwindRow>() as u32,
            rows,
            POOL_FLAGS,
            &format!("scorch_rows_{index}"),
        )
        .map_err(|source| LoaderError::CreatePool { rows, source })?;
        set_inner(outer.fd(), index, map.fd())
            .map_err(|source| LoaderError::AddPool { index, source })?;
        if let Some(slot) = self.maps.get_mut(index as usize) {
            *slot = Some((map, rows));
        }
        Ok(())
    }

    /// Takes pool `index` out of the outer array and closes it. A walk that looked the pool up
    /// before keeps it until the walk ends (the kernel frees an inner map after an RCU grace
    /// period); no mapping points at it by then, as its tables were evicted first.
    fn remove(&mut self, outer: &MapData, index: u32) {
        if let Err(source) = clear_inner(outer.fd(), index) {
            tracing::debug!("removing row pool {index} from UNWIND_ROWS: {source}");
        }
        if let Some(slot) = self.maps.get_mut(index as usize) {
            *slot = None;
        }
    }

    fn write(&mut self, pool: u32, first_row: u32, rows: &[UnwindRow]) -> Result<(), LoaderError> {
        let len = u32::try_from(rows.len()).map_err(|_| LoaderError::NoPool(pool))?;
        let target = self.mapped(pool, first_row, len, true)?;
        // SAFETY: `target` maps `rows.len()` rows of the pool, writable; the BPF side reads
        // these rows only once a process mapping points at them, which is written after this.
        unsafe { std::ptr::copy_nonoverlapping(rows.as_ptr(), target.rows, rows.len()) };
        Ok(())
    }

    /// Copies `len` rows from pool `from` at `from_row` to pool `to` at `to_row`, page by
    /// page through the two maps' own memory: a table moved while the pools shrink is never
    /// held whole in the agent's heap.
    fn copy(
        &mut self,
        (from, from_row): (u32, u32),
        (to, to_row): (u32, u32),
        len: u32,
    ) -> Result<(), LoaderError> {
        let source = self.mapped(from, from_row, len, false)?;
        let target = self.mapped(to, to_row, len, true)?;
        if from == to {
            // Distinct ranges of one pool, mapped twice: they do not overlap as rows do not.
            assert!(
                from_row.abs_diff(to_row) >= len,
                "overlapping row ranges in one pool"
            );
        }
        // SAFETY: both map `len` rows of their pools; the target's rows are read by the BPF
        // side only once a process mapping points at them, which is written after this.
        unsafe { std::ptr::copy_nonoverlapping(source.rows, target.rows, len as usize) };
        Ok(())
    }

    /// `len` rows of pool `pool` from `first_row`, mapped into the agent until the value
    /// is dropped.
    fn mapped(
        &self,
        pool: u32,
        first_row: u32,
        len: u32,
        writable: bool,
    ) -> Result<MappedRows, LoaderError> {
        let Some(Some((map, pool_len))) = self.maps.get(pool as usize) else {
            return Err(LoaderError::NoPool(pool));
        };
        assert!(
            u64::from(first_row) + u64::from(len) <= u64::from(*pool_len),
            "row range outside the pool"
        );
        let row = std::mem::size_of::<UnwindRow>();
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let start = first_row as usize * row;
        let end = (first_row as usize + len as usize) * row;
        let map_start = start / page * page;
        let map_len = end.div_ceil(page).max(1) * page - map_start;
        let protection = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh shared mapping of whole pages of the map's fd, inside the pool (the
        // kernel refuses a range past the map's size); nothing else in this process writes
        // these pages while it is mapped.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                protection,
                libc::MAP_SHARED,
                map.fd().as_fd_raw(),
                map_start as libc::off_t,
            )
        };
        if address == libc::MAP_FAILED {
            return Err(LoaderError::MapPool {
                bytes: map_len,
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(MappedRows {
            address,
            len: map_len,
            // SAFETY: `start - map_start` is inside the mapping.
            rows: unsafe {
                address
                    .cast::<u8>()
                    .add(start - map_start)
                    .cast::<UnwindRow>()
            },
        })
    }
}

/// Rows of a pool mapped into the agent, unmapped when dropped.
struct MappedRows {
    address: *mut libc::c_void,
    len: usize,
    rows: *mut UnwindRow,
}

impl Drop for MappedRows {
    fn drop(&mut self) {
        // SAFETY: the mapping `mapped` made, unmapped once.
        unsafe { libc::munmap(self.address, self.len) };
    }
}

/// The process map: a preallocated hash of [`ProcMappings`] by process, in `UNWIND_PROCS`'s one
/// slot.
pub(super) struct ProcMap {
    /// The map the BPF side reads, once in place.
    map: aya::maps::HashMap<MapData, u32, ProcMappings>,
    /// Processes it holds at most, not counting the walks' entry for the others.
    entries: u32,
}

impl ProcMap {
    /// An empty map of `entries` processes, not in place yet.
    fn new(entries: u32) -> Result<Self, LoaderError> {
        let failed = |source| LoaderError::CreateProcs { entries, source };
        // One more entry: the walks' entry for processes the map does not hold.
        let data = create_inner(
            BPF_MAP_TYPE_HASH,
            std::mem::size_of::<ProcMappings>() as u32,
            entries.saturating_add(1),
            0,
            "scorch_procs",
        )
        .map_err(failed)?;
        let mut map = aya::maps::HashMap::try_from(aya::maps::Map::HashMap(data))
            .map_err(|source| failed(InnerMapError::Wrap(source)))?;
        let none = ProcMappings {
            count: 0,
            _reserved: 0,
            mappings: [UnwindMapping::default(); MAX_PROC_MAPPINGS],
        };
        map.insert(PROCS_NO_MAPPINGS, none, 0)
            .map_err(|source| LoaderError::NoMappingsEntry { source })?;
        Ok(ProcMap { map, entries })
    }

    /// Puts this map in `outer`'s slot: the BPF side reads it from its next lookup on.
    fn put_in(&self, outer: &MapData) -> Result<(), LoaderError> {
        set_inner(outer.fd(), 0, aya::maps::IterableMap::map(&self.map).fd())
            .map_err(|source| LoaderError::AddProcs { source })
    }

    /// An empty map of `entries` processes, in `outer`'s slot.
    fn create(outer: &MapData, entries: u32) -> Result<Self, LoaderError> {
        let created = ProcMap::new(entries)?;
        created.put_in(outer)?;
        Ok(created)
    }

    /// A map of `entries` processes holding this one's, in its place. A process the BPF side
    /// forgets while the entries are copied (an exec, a library mapped over its code) is
    /// deleted from the old map; it is deleted from the new one too once the new one is in
    /// place, so no process keeps mappings the BPF side dropped.
    fn replaced(&self, outer: &MapData, entries: u32) -> Result<Self, LoaderError> {
        let mut created = ProcMap::new(entries)?;
        let pids: Vec<u32> = self.map.keys().filter_map(Result::ok).collect();
        for &pid in &pids {
            if let Ok(value) = self.map.get(&pid, 0) {
                let _ = created.map.insert(pid, value, 0);
            }
        }
        created.put_in(outer)?;
        for pid in pids {
            if self.map.get(&pid, 0).is_err() {
                let _ = created.map.remove(&pid);
            }
        }
        tracing::info!(
            "BPF process map grown from {} to {entries} processes",
            self.entries
        );
        Ok(created)
    }
}

/// The process map's first size: room for the processes running twice over, at least 512
/// (1.25 MiB), within the ceiling.
pub fn initial_process_entries(running: usize, ceiling: u32) -> u32 {
    let wanted = u32::try_from(running.saturating_mul(2))
        .unwrap_or(u32::MAX)
        .max(512)
        .checked_next_power_of_two()
        .unwrap_or(u32::MAX);
    wanted.min(ceiling).max(1)
}

/// Whether a map insert failed for want of room.
pub(super) fn is_full(error: &MapError) -> bool {
    matches!(error, MapError::SyscallError(aya::sys::SyscallError { io_error, .. })
        if io_error.raw_os_error() == Some(libc::E2BIG))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_map_starts_at_twice_the_running_within_the_ceiling() {
        // A quiet host: the floor.
        assert_eq!(initial_process_entries(150, 8192), 512);
        // 700 running: 1400, to a power of two.
        assert_eq!(initial_process_entries(700, 8192), 2048);
        assert_eq!(initial_process_entries(100_000, 8192), 8192);
        // `--unwind-processes 1`.
        assert_eq!(initial_process_entries(150, 1), 1);
    }

    #[test]
    fn only_e2big_means_full() {
        let error = |code| {
            MapError::SyscallError(aya::sys::SyscallError {
                call: "bpf_map_update_elem",
                io_error: std::io::Error::from_raw_os_error(code),
            })
        };
        assert!(is_full(&error(libc::E2BIG)));
        assert!(!is_full(&error(libc::ENOMEM)));
        assert!(!is_full(&MapError::KeyNotFound));
    }
}
