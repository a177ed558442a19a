//! The seam of the loader's roles: the BPF maps they write ([`LoaderMaps`]), runtime walks'
//! maps of processes included. It is public in a private module:
//! nothing outside `unwind` names it, and the roles' generic code may still be reached from
//! the public [`Unwinder`].
//!
//! [`Unwinder`]: super::Unwinder

use aya::maps::MapError;
use scorch_common::{ProcMappings, RuntimeId, UnwindRow};

use super::LoaderError;

/// The BPF maps the loader writes: the row pools in `UNWIND_ROWS`, the process map in
/// `UNWIND_PROCS`, and `ROW_EPOCH`. [`KernelMaps`] are the kernel's; the unit tests use an
/// in-memory double, so that eviction, the process map's growth and a process finding no room
/// are tested without BPF.
///
/// [`KernelMaps`]: super::super::kernel_maps::KernelMaps
pub trait LoaderMaps {
    /// Creates row pool `index`, of `rows` rows, in its slot of `UNWIND_ROWS`.
    fn create_pool(&mut self, index: u32, rows: u32) -> Result<(), LoaderError>;
    /// Copies `rows` into pool `pool` from `first_row` on, inside the pool.
    fn write_rows(
        &mut self,
        pool: u32,
        first_row: u32,
        rows: &[UnwindRow],
    ) -> Result<(), LoaderError>;
    /// Copies `rows` rows from `(pool, first_row)` to another place in the pools, whose
    /// ranges do not overlap: a table moved out of a pool being shrunk.
    fn copy_rows(&mut self, from: (u32, u32), to: (u32, u32), rows: u32)
        -> Result<(), LoaderError>;
    /// Takes pool `index` out of `UNWIND_ROWS`, which frees its memory.
    fn remove_pool(&mut self, index: u32);
    /// Sets `ROW_EPOCH`, which drops the rows the program's walks hold in their cache.
    fn set_row_epoch(&mut self, epoch: u64) -> Result<(), MapError>;
    /// Writes `pid`'s mappings to the process map; the error [`is_full`] names when the map
    /// has no room.
    ///
    /// [`is_full`]: super::super::kernel_maps::is_full
    fn insert_process(&mut self, pid: u32, mappings: &ProcMappings) -> Result<(), MapError>;
    /// Removes `pid` from the process map.
    fn remove_process(&mut self, pid: u32) -> Result<(), MapError>;
    /// Processes the process map holds at most now.
    fn process_entries(&self) -> u32;
    /// Processes the process map may grow to hold: the ceiling.
    fn process_ceiling(&self) -> u32;
    /// Puts a process map of `entries` processes, holding this one's, in its place.
    fn grow_processes(&mut self, entries: u32) -> Result<(), LoaderError>;
    /// Writes `pid`'s entry in runtime `id`'s map of processes: the value the runtime laid
    /// out, as bytes.
    fn insert_runtime_entry(
        &mut self,
        id: RuntimeId,
        pid: u32,
        entry: &[u8],
    ) -> Result<(), LoaderError>;
    /// Removes `pid`'s entry from runtime `id`'s map; one not there is no error.
    fn remove_runtime_entry(&mut self, id: RuntimeId, pid: u32);
}
