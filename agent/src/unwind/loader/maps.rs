//! The seams of the loader's roles: the BPF maps they write ([`LoaderMaps`]) and the runtime
//! walks' part of a process's write ([`RuntimeWalks`]). Both are public in a private module:
//! nothing outside `unwind` names them, and the roles' generic code may still be reached from
//! the public [`Unwinder`].
//!
//! [`Unwinder`]: super::Unwinder

use aya::maps::MapError;
use scorch_common::{ProcMappings, PythonProc, UnwindRow};

use super::LoaderError;
use crate::symbolize::python::PythonProcess;

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
}

/// What the runtime walks (`runtimes.rs`) add to a process's write: the roles are written once
/// for any [`LoaderMaps`], and the unit tests' in-memory maps have no runtime walks.
pub trait RuntimeWalks {
    /// `pid`'s interpreter as the BPF side and the symbolizer need it.
    fn python_proc(&self, pid: u32) -> Option<(PythonProc, PythonProcess)>;
    /// Writes (or removes) `pid`'s interpreter in `PYTHON_PROCS`.
    fn write_python(&mut self, pid: u32, described: Option<(PythonProc, PythonProcess)>);
}
