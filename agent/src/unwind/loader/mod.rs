//! Feeds the BPF unwinder: the tables of the binaries processes run, in the shared row pool,
//! and each process's executable mappings, in `UNWIND_PROCS`.
//!
//! The BPF program reports processes and pcs it does not know through a ring buffer
//! ([`Unwinder::poll`] reads it); the agent then reads `/proc/PID/maps`, asks a worker thread
//! to build the tables it lacks, and describes the process's mappings at once: those whose
//! table is not built yet are marked pending, and the BPF side walks them with frame pointers
//! (counted) until the table arrives. Building never runs on the caller's thread, so a window
//! is never late because of it.
//!
//! Tables are keyed by build id (by file identity, device and inode, when a binary has none):
//! every process mapping the same library shares one table, including copies of it under
//! other paths, devices or containers' overlays. The vDSO's table is built once, at start, from the image in the
//! agent's own memory (the kernel maps the same image into every 64-bit process), and is
//! never evicted. When the pool is full the least recently used tables go, after
//! the mappings that point at them have been rewritten.
//!
//! A process is forgotten when it exits ([`Unwinder::forget_exited`]) and when it execs (the
//! BPF side's exec tracepoint deletes its entry, and its next sample reports it again).
//!
//! This file holds the [`Unwinder`], its start (and the worker's build) and its public API;
//! the roles are beside it: `tables.rs` installs and evicts tables, `process_map.rs` writes
//! processes to `UNWIND_PROCS` and grows it, `tracking.rs` follows the processes (events,
//! loaders starting, exits), and `runtimes.rs` is the runtime walks' part. The maps they write
//! are behind [`LoaderMaps`], so the unit tests run them on an in-memory double.

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::mpsc,
};

use aya::maps::MapError;
use scorch_common::{RuntimeId, UnwindRow, MAX_ROW_POOLS, MIN_POOL_ROWS};

mod maps;
mod process_map;
mod runtimes;
mod shrink;
mod tables;
mod tracking;

#[cfg(test)]
mod memory_maps;

use super::{kernel_maps::KernelMaps, pool::RowPools, UnwindTable};
use crate::{
    binary::elf::{Elf, Segment},
    pipeline::maps::UnwindMaps,
    process::maps::{own_vdso, ProcessMaps},
    runtimes::Registry,
    symbolize::elf::FileData,
};
pub(in crate::unwind) use maps::LoaderMaps;
use runtimes::{runtime, FileRuntime};
use tracking::Loading;

#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    #[error("no BPF map of processes for runtime {0:?}")]
    NoRuntimeMap(scorch_common::RuntimeId),
    #[error("writing process {pid}'s entry for runtime {runtime:?}: {source}")]
    RuntimeEntry {
        pid: u32,
        runtime: scorch_common::RuntimeId,
        source: crate::sys::inner_maps::BytesMapError,
    },
    #[error("mapping a BPF row pool ({bytes} bytes) into memory: {source}")]
    MapPool {
        bytes: usize,
        source: std::io::Error,
    },
    #[error("creating a BPF row pool of {rows} rows: {source}")]
    CreatePool {
        rows: u32,
        source: crate::sys::inner_maps::InnerMapError,
    },
    #[error("putting row pool {index} in BPF map UNWIND_ROWS: {source}")]
    AddPool { index: u32, source: std::io::Error },
    #[error("row pool {0} does not exist")]
    NoPool(u32),
    #[error("creating the BPF process map for {entries} processes: {source}")]
    CreateProcs {
        entries: u32,
        source: crate::sys::inner_maps::InnerMapError,
    },
    #[error(
        "writing the entry of processes without mappings (tgid 0) to a new process map: {source}"
    )]
    NoMappingsEntry { source: MapError },
    #[error("putting the process map in BPF map UNWIND_PROCS: {source}")]
    AddProcs { source: std::io::Error },
    #[error("starting the unwind table builder thread: {0}")]
    Worker(std::io::Error),
    #[error("writing process {pid}'s mappings to BPF map UNWIND_PROCS: {source}")]
    Procs { pid: u32, source: MapError },
}

/// A binary, as the tables know it: the same inode on the same device is the same table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct FileKey {
    dev: u64,
    inode: u64,
}

/// The vDSO: no file has inode 0.
const VDSO: FileKey = FileKey { dev: 0, inode: 0 };

/// A table's identity: the binary's build id, so the same binary under other paths, devices
/// or containers' overlays shares one table; its file identity when it has none.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum TableKey {
    BuildId(Box<[u8]>),
    File(FileKey),
}

/// A built table, on its way from the worker.
struct Built {
    rows: Vec<UnwindRow>,
    base: u64,
    segments: Vec<Segment>,
    build_id: Option<Box<[u8]>>,
}

/// Where a file's table stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum FileState {
    /// Sent to the worker.
    Building,
    /// Cannot be built (no `.eh_frame`, not x86_64, unreadable) or does not fit the pool:
    /// frame pointers for its code.
    Unavailable,
    /// In the pool, under this key (shared with every file of the same build id).
    Loaded(TableKey),
    /// Evicted at the pools' ceiling: the processes mapping it walk its code by frame
    /// pointers, counted; the next process that maps it has it built again.
    Evicted,
}

/// A table in a pool.
struct Table {
    pool: u32,
    first_row: u32,
    rows: u32,
    base: u64,
    segments: Vec<Segment>,
    /// [`Unwinder::clock`] when a process last mapped it.
    last_used: u64,
    /// Since when no process known maps it: after [`IDLE_TABLE_AGE`] it is evicted, and a
    /// pool it leaves empty is given back.
    unused_since: Option<std::time::Instant>,
}

/// A process's executable mapping, with the table it needs.
struct ProcMapping {
    start: u64,
    end: u64,
    offset: u64,
    key: Option<FileKey>,
}

/// What the unwinder holds, for `/metrics` and the summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoaderStats {
    pub tables_loaded: usize,
    pub tables_unavailable: usize,
    pub rows_used: u64,
    /// Bytes of BPF map memory the loaded tables take.
    pub table_bytes: u64,
    /// Bytes of the row pools, used or not.
    pub pool_bytes: u64,
    /// Row pools that exist.
    pub pools: usize,
    pub processes: usize,
    /// Tables evicted for room at the pools' ceiling.
    pub tables_evicted: u64,
    /// Tables dropped after no process mapped them for a while.
    pub tables_idle: u64,
    /// Tables moved out of a mostly empty row pool, so that it could be given back.
    pub tables_moved: u64,
    /// Row pools given back (emptied by idle or evicted tables, or by moves), and their bytes.
    pub pools_given_back: u64,
    pub pool_bytes_given_back: u64,
    pub events: u64,
    /// Times a process's maps were read and described: at its first sample, while its
    /// libraries load, and after an exec or a new mapping made the BPF side ask again.
    pub processes_read: u64,
    /// Times a process's mappings found no room in `UNWIND_PROCS` (full): it walks by frame
    /// pointers until exits make room.
    pub processes_without_room: u64,
    /// Processes with a runtime the BPF side walks (one per runtime a process runs).
    pub runtime_processes: usize,
    /// Processes a runtime's binary is mapped in that the runtime cannot walk.
    pub runtime_processes_refused: usize,
}

impl std::fmt::Display for LoaderStats {
    /// In words, as the recording's summary line: `3 tables loaded (241 KiB), 1 unavailable,
    /// 12 processes, 0 evicted, 40 events`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} tables loaded ({} KiB, {} rows, in {} row pools of {} KiB), {} unavailable, \
             {} evicted; {} processes described, {} events",
            self.tables_loaded,
            self.table_bytes.div_ceil(1024),
            self.rows_used,
            self.pools,
            self.pool_bytes.div_ceil(1024),
            self.tables_unavailable,
            self.tables_evicted,
            self.processes,
            self.events
        )?;
        if self.tables_idle > 0 {
            write!(f, ", {} dropped as idle", self.tables_idle)?;
        }
        if self.processes_without_room > 0 {
            write!(f, ", {} found no room", self.processes_without_room)?;
        }
        Ok(())
    }
}

type BuildRequest = (FileKey, std::fs::File, PathBuf);

/// What the worker sends back for a file: first what it is to the runtime walks, then its
/// table.
enum BuildResult {
    Runtime(FileKey, Option<FileRuntime>),
    Table(FileKey, Option<Built>),
}

/// Keeps the BPF unwinder's maps current; see the module documentation. `M` is the kernel's
/// maps but in the unit tests.
pub struct Unwinder<M = KernelMaps> {
    /// The BPF maps: the pools, the process map and the row epoch the loader writes through
    /// [`LoaderMaps`], and the event ring buffer and the runtime walks' maps.
    maps: M,
    /// Which rows of the pools are free, and when to add or give back a pool.
    pools: RowPools,
    /// Where each file's table stands.
    files: HashMap<FileKey, FileState>,
    /// The tables in the pools.
    tables: HashMap<TableKey, Table>,
    /// Each process's executable mappings, as written to the process map.
    procs: HashMap<u32, Vec<ProcMapping>>,
    /// The worker's inbox: files whose tables to build.
    requests: mpsc::Sender<BuildRequest>,
    /// What the worker finished.
    results: mpsc::Receiver<BuildResult>,
    /// Advances on every [`Unwinder::poll`]: the LRU's time.
    clock: u64,
    /// What `ROW_EPOCH` holds: how many times rows were freed.
    row_epoch: u64,
    /// [`LoaderStats::tables_evicted`].
    evicted: u64,
    /// Tables dropped as idle.
    idle: u64,
    /// [`LoaderStats::tables_moved`].
    moved: u64,
    /// [`LoaderStats::pools_given_back`].
    pools_given_back: u64,
    /// [`LoaderStats::pool_bytes_given_back`].
    pool_bytes_given_back: u64,
    /// [`LoaderStats::events`].
    events: u64,
    /// The vDSO image's length, when its table is loaded: a process's `[vdso]` mapping of
    /// another length is not the same image (a 32-bit process's) and walks by frame pointers.
    vdso_len: Option<u64>,
    /// Processes `UNWIND_PROCS` had no room for. Their samples ask again every 250 ms; each
    /// ask would read their maps again and fail again, so they are not read until an exit
    /// makes room.
    without_room: HashSet<u32>,
    /// [`LoaderStats::processes_without_room`].
    without_room_total: u64,
    /// [`LoaderStats::processes_read`].
    processes_read: u64,
    /// When the full map was last reported: once a minute at most, not on every poll.
    reported_full: Option<std::time::Instant>,
    /// Whether tables were asked for since the last [`Unwinder::install_tables`].
    requested: bool,
    /// The binaries that are a runtime's, or support one (glibc).
    runtimes: HashMap<FileKey, FileRuntime>,
    /// Each process's entry in each runtime's BPF map, as last written: a rewrite that
    /// changes nothing is not a change for the symbolizer.
    attached: HashMap<(u32, RuntimeId), Vec<u8>>,
    /// Changes to `attached` the symbolizer has not taken yet.
    attachment_changes: Vec<runtimes::AttachmentChange>,
    /// Runtime frames of new stacks (process, word, continuation's payload), for the
    /// symbolizer to read while their processes run.
    runtime_words: HashSet<(u32, u64, u64)>,
    /// Processes whose maps were read while their dynamic loader was starting them
    /// ([`still_loading`]), with when they were first and last read: read again at a poll
    /// [`LOADING_REREAD`] after the last read until their libraries show, for
    /// [`LOADING_RECHECK`] at most, and forgotten once their maps cannot be read. Described
    /// from those maps alone, every walk through a library fell back to frame pointers until a sample met its pc after the BPF side's
    /// 250 ms between two reports of a process: in a process waking once a second, minutes.
    ///
    /// [`still_loading`]: tracking::still_loading
    /// [`LOADING_REREAD`]: tracking::LOADING_REREAD
    /// [`LOADING_RECHECK`]: tracking::LOADING_RECHECK
    loading: HashMap<u32, Loading>,
    /// Processes a runtime could not attach yet, as they were setting it up
    /// ([`crate::runtimes::Attach::Later`]: a JVM's code cache), with when that was first and
    /// last found: described again [`ATTACH_REREAD`] after the last time, for
    /// [`ATTACH_RETRY`] at most.
    ///
    /// [`ATTACH_REREAD`]: tracking::ATTACH_REREAD
    /// [`ATTACH_RETRY`]: tracking::ATTACH_RETRY
    attach_later: HashMap<u32, Loading>,
    /// The (process, runtime) pairs a runtime's binary is mapped in but whose runtime refused
    /// to walk them (`Attach::Unsupported`): a JVM whose tables are not what the walk reads,
    /// one that lies about them. Counted in `scorch_runtime_processes_refused`.
    refused: HashSet<(u32, RuntimeId)>,
}

impl Unwinder {
    /// Takes over the maps and starts the table builder thread, which asks `registry`'s
    /// runtimes about each binary (none with an empty registry: no runtime frame is walked).
    pub fn start(maps: UnwindMaps, registry: Registry) -> Result<Self, LoaderError> {
        let (requests, inbox) = mpsc::channel::<BuildRequest>();
        let (outbox, results) = mpsc::channel();
        std::thread::Builder::new()
            .name("scorch-unwind".into())
            .spawn(move || {
                // Ends when the unwinder (the sender) is dropped.
                for (key, file, path) in inbox {
                    let unreadable = |err: &dyn std::fmt::Display| {
                        tracing::debug!("unwind table for {}: {err}", path.display())
                    };
                    let data = FileData::map_file(&file, &path)
                        .map_err(|err| unreadable(&err))
                        .ok();
                    // The file's one parse: the runtimes, the table and its key all read it.
                    let elf = data.as_ref().and_then(|data| {
                        Elf::parse(data.bytes())
                            .map_err(|err| unreadable(&err))
                            .ok()
                    });
                    let runtime = elf.as_ref().and_then(|elf| runtime(&registry, elf, &path));
                    if outbox.send(BuildResult::Runtime(key, runtime)).is_err() {
                        break;
                    }
                    let built = elf.as_ref().and_then(|elf| build_from(elf, &path));
                    if outbox.send(BuildResult::Table(key, built)).is_err() {
                        break;
                    }
                }
            })
            .map_err(LoaderError::Worker)?;
        let pools = RowPools::new(MAX_ROW_POOLS, maps.pool_rows, MIN_POOL_ROWS);
        let mut unwinder = Unwinder::new(KernelMaps::new(maps)?, pools, requests, results);
        unwinder.load_vdso()?;
        Ok(unwinder)
    }

    /// Loads the vDSO's table (a few hundred rows, from the image in this process's memory)
    /// for good: every process maps it, and a sample in `clock_gettime` is common.
    fn load_vdso(&mut self) -> Result<(), LoaderError> {
        let Some(image) = own_vdso() else {
            return Ok(());
        };
        let path = Path::new("[vdso]");
        let built = match Elf::parse(&image) {
            Ok(elf) => build_from(&elf, path),
            Err(err) => {
                tracing::debug!("unwind table for {}: {err}", path.display());
                None
            }
        };
        self.install(VDSO, built, &mut HashSet::new())?;
        if matches!(self.files.get(&VDSO), Some(FileState::Loaded(_))) {
            self.vdso_len = Some(image.len() as u64);
        }
        Ok(())
    }

    /// Describes `pids` now, before the BPF side asks (`record --pid`), so their first samples
    /// find their tables. Returns the maps read, as [`Unwinder::poll`] does.
    pub fn watch(&mut self, pids: &[u32]) -> Result<Vec<(u32, ProcessMaps)>, LoaderError> {
        let captured = self.scan_all(pids, ProcessMaps::read)?;
        self.install_tables(true)?;
        Ok(captured)
    }

    /// Installs the tables the worker finished, and rewrites the processes that use them.
    /// With `wait`, when tables were asked for since the last install, waits for them a
    /// little (at most 20 ms), so their processes get whole stacks one poll sooner; the poll
    /// an event wakes does not wait, so the next event's process is read without delay.
    pub fn install_tables(&mut self, wait: bool) -> Result<(), LoaderError> {
        // Without `wait`, the flag stays for the next poll that waits.
        let requested = wait && std::mem::take(&mut self.requested);
        self.install_built(requested)
    }

    /// A descriptor of the event ring buffer, readable when the BPF side has written an event:
    /// the caller polls as soon as a process is first sampled, not at its next tick.
    pub fn events_fd(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        std::os::fd::AsFd::as_fd(&self.maps.events).try_clone_to_owned()
    }

    /// Installs tables as the worker finishes them until none is being built, or `limit`
    /// has passed.
    pub fn wait_for_tables(&mut self, limit: std::time::Duration) -> Result<(), LoaderError> {
        let deadline = std::time::Instant::now() + limit;
        while self.building() > 0 && std::time::Instant::now() < deadline {
            // Waits up to `BUILD_WAIT` for a result.
            self.install_built(true)?;
        }
        Ok(())
    }

    /// Forgets processes that have exited, in the agent and in the BPF map.
    pub fn forget_exited(&mut self) {
        self.forget(|pid| Path::new(&format!("/proc/{pid}")).exists());
    }
}

impl<M> Unwinder<M> {
    /// An unwinder over `maps` and `pools`, its worker reached through `requests` and
    /// `results`: nothing known yet.
    fn new(
        maps: M,
        pools: RowPools,
        requests: mpsc::Sender<BuildRequest>,
        results: mpsc::Receiver<BuildResult>,
    ) -> Self {
        Unwinder {
            maps,
            pools,
            files: HashMap::new(),
            tables: HashMap::new(),
            procs: HashMap::new(),
            row_epoch: 0,
            requests,
            results,
            clock: 0,
            evicted: 0,
            idle: 0,
            moved: 0,
            pools_given_back: 0,
            pool_bytes_given_back: 0,
            events: 0,
            vdso_len: None,
            without_room: HashSet::new(),
            without_room_total: 0,
            processes_read: 0,
            reported_full: None,
            requested: false,
            runtimes: HashMap::new(),
            attached: HashMap::new(),
            attachment_changes: Vec::new(),
            runtime_words: HashSet::new(),
            loading: HashMap::new(),
            attach_later: HashMap::new(),
            refused: HashSet::new(),
        }
    }

    pub fn stats(&self) -> LoaderStats {
        let mut stats = LoaderStats {
            processes: self.procs.len(),
            rows_used: self.pools.used(),
            table_bytes: self.pools.used() * std::mem::size_of::<UnwindRow>() as u64,
            pool_bytes: self.pools.capacity() * std::mem::size_of::<UnwindRow>() as u64,
            pools: self.pools.count(),
            tables_evicted: self.evicted,
            tables_idle: self.idle,
            tables_moved: self.moved,
            pools_given_back: self.pools_given_back,
            pool_bytes_given_back: self.pool_bytes_given_back,
            events: self.events,
            processes_read: self.processes_read,
            processes_without_room: self.without_room_total,
            runtime_processes: self.attached.len(),
            runtime_processes_refused: self.refused.len(),
            ..LoaderStats::default()
        };
        stats.tables_loaded = self.tables.len();
        stats.tables_unavailable = self
            .files
            .values()
            .filter(|state| **state == FileState::Unavailable)
            .count();
        stats
    }
}

/// Builds one table, on the worker thread, from an ELF image in memory. `None` when the
/// binary has none the BPF side can use; why is logged, as it is data about the binary, not a
/// fault of the agent.
fn build_from(elf: &Elf<'_>, path: &Path) -> Option<Built> {
    // The walk evaluates rows for this machine's registers: another architecture's code (an
    // emulator such as qemu-user maps it) gets no table, rather than rules naming others.
    let architecture = object::Object::architecture(elf.object());
    if architecture != crate::arch::native::ARCHITECTURE {
        tracing::debug!(
            "no unwind table for {}: {architecture:?} code, not this machine's",
            path.display()
        );
        return None;
    }
    let table = UnwindTable::of(path, elf)
        .map_err(|err| tracing::debug!("unwind table for {}: {err}", path.display()))
        .ok()?;
    let segments = elf.executable_segments();
    tracing::debug!(
        "unwind table for {}: {} rows",
        path.display(),
        table.rows().len()
    );
    let base = table.base();
    Some(Built {
        // Moved, not copied: a second copy of a library's table would be the build's peak.
        rows: table.into_rows(),
        base,
        segments,
        // A Go binary without a GNU build id is keyed by its Go one.
        build_id: elf.build_id().map(|id| Box::from(&*id)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host's libc: keyed by its GNU build id, its rows counted from its text segment,
    /// which is the segment a mapping's bias is taken from.
    #[test]
    fn a_library_is_keyed_by_its_gnu_build_id() {
        let path = Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6");
        let data = std::fs::read(path).unwrap();
        let elf = Elf::parse(&data).unwrap();
        let built = build_from(&elf, path).expect("libc's table");
        let object = object::File::parse(&*data).unwrap();
        let gnu = object::Object::build_id(&object).unwrap().unwrap();
        assert_eq!(built.build_id.as_deref(), Some(gnu));
        assert_eq!(built.segments.len(), 1);
        assert!(built.segments[0].is_executable());
        assert_eq!(built.base, built.segments[0].address);
        assert!(!built.rows.is_empty());
    }

    /// Another architecture's library gets no table, though its rows could be read.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn another_architecture_s_library_gets_no_table() {
        let path = Path::new("/usr/aarch64-linux-gnu/lib/libc.so.6");
        let data = std::fs::read(path).expect("libc6-arm64-cross (cargo xtask setup)");
        let elf = Elf::parse(&data).unwrap();
        assert!(UnwindTable::of(path, &elf).is_ok());
        assert!(build_from(&elf, path).is_none());
    }

    /// A Go toolchain binary without a GNU build id is keyed by its Go one, as the symbolizer
    /// keys it.
    #[test]
    fn a_go_binary_without_a_gnu_build_id_is_keyed_by_its_go_one() {
        let found = ["/usr/lib/go/bin/gofmt", "/usr/lib/go-1.19/bin/gofmt"]
            .into_iter()
            .map(Path::new)
            .find(|path| path.exists());
        let Some(path) = found else {
            eprintln!("skipped: no Go toolchain binary on this machine");
            return;
        };
        let data = std::fs::read(path).unwrap();
        let elf = Elf::parse(&data).unwrap();
        if elf.gnu_build_id().is_some() {
            eprintln!("skipped: {} has a GNU build id", path.display());
            return;
        }
        let go = elf
            .go_build_id()
            .expect("a Go build id")
            .as_bytes()
            .to_vec();
        let built = build_from(&elf, path).expect("a table from .gopclntab");
        assert_eq!(built.build_id.as_deref(), Some(&go[..]));
        let symbolizer = crate::symbolize::elf::ElfFile::open(path).unwrap().build_id;
        assert_eq!(symbolizer, Some(crate::sys::hex::to_hex(&go)));
    }
}
