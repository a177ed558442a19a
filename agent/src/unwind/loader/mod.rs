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

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::mpsc,
};

use aya::maps::{MapData, MapError};
use object::{Object, ObjectSegment, SegmentFlags};
use scorch_common::{
    ProcMappings, RuntimeId, ShortUserStack, UnwindEvent, UnwindMapping, UnwindRow, UserStack,
    WalkedStack, EVENT_RUNTIME_STACK, MAPPING_NO_TABLE, MAPPING_TABLE_EVICTED,
    MAPPING_TABLE_LOADED, MAPPING_TABLE_PENDING, MAX_PROC_MAPPINGS, MAX_ROW_POOLS, MIN_POOL_ROWS,
    PROCS_NO_MAPPINGS, SHORT_USER_STACK_ID,
};

mod runtimes;

use super::{
    kernel_maps::{initial_process_entries, is_full, PoolMaps, ProcMap},
    owned::mark_owned,
    pool::RowPools,
    UnwindTable,
};
use crate::sys::inner_maps::inner_map;
use crate::{
    pipeline::maps::UnwindMaps,
    process::maps::{own_vdso, MapEntry, ProcessMaps},
    process::open::open_mapped,
    runtimes::Registry,
    symbolize::elf::FileData,
};
use runtimes::{runtime, FileRuntime};

#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
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

/// An executable `PT_LOAD` segment: where the file's bytes go in the ELF address space.
#[derive(Debug, Clone, Copy)]
struct Segment {
    offset: u64,
    address: u64,
    file_size: u64,
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

/// How long a table no process maps stays loaded: long enough that a binary run again and
/// again (a build, a cron job, a shell loop) keeps its table between runs.
const IDLE_TABLE_AGE: std::time::Duration = std::time::Duration::from_secs(300);

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
    pub events: u64,
    /// Times a process's maps were read and described: at its first sample, while its
    /// libraries load, and after an exec or a new mapping made the BPF side ask again.
    pub processes_read: u64,
    /// Times a process's mappings found no room in `UNWIND_PROCS` (full): it walks by frame
    /// pointers until exits make room.
    pub processes_without_room: u64,
    /// Processes with a runtime the BPF side walks (one per runtime a process runs).
    pub runtime_processes: usize,
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

/// Longest [`Unwinder::poll`] waits for tables it has just asked for.
const BUILD_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

type BuildRequest = (FileKey, std::fs::File, PathBuf);

/// What the worker sends back for a file: first what it is to the runtime walks, then its
/// table.
enum BuildResult {
    Runtime(FileKey, Option<FileRuntime>),
    Table(FileKey, Option<Built>),
}

/// Keeps the BPF unwinder's maps current; see the module documentation.
pub struct Unwinder {
    maps: UnwindMaps,
    /// The process map the BPF side reads through `UNWIND_PROCS`.
    procs_map: ProcMap,
    pool_maps: PoolMaps,
    pools: RowPools,
    files: HashMap<FileKey, FileState>,
    tables: HashMap<TableKey, Table>,
    procs: HashMap<u32, Vec<ProcMapping>>,
    requests: mpsc::Sender<BuildRequest>,
    results: mpsc::Receiver<BuildResult>,
    /// Advances on every [`Unwinder::poll`]: the LRU's time.
    clock: u64,
    /// What `ROW_EPOCH` holds: how many times rows were freed.
    row_epoch: u64,
    evicted: u64,
    /// Tables dropped as idle.
    idle: u64,
    events: u64,
    /// The vDSO image's length, when its table is loaded: a process's `[vdso]` mapping of
    /// another length is not the same image (a 32-bit process's) and walks by frame pointers.
    vdso_len: Option<u64>,
    /// Processes `UNWIND_PROCS` had no room for. Their samples ask again every 250 ms; each
    /// ask would read their maps again and fail again, so they are not read until an exit
    /// makes room.
    without_room: HashSet<u32>,
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
    /// Runtime frames of new stacks (process, word), for the symbolizer to read while their
    /// processes run.
    runtime_words: HashSet<(u32, u64)>,
    /// Processes whose maps were read while their dynamic loader was starting them
    /// ([`still_loading`]), with when they were first and last read: read again at a poll
    /// [`LOADING_REREAD`] after the last read until their libraries show, for
    /// [`LOADING_RECHECK`] at most, and forgotten once their maps cannot be read. Described
    /// from those maps alone, every walk through a library fell back to frame pointers until a sample met its pc after the BPF side's
    /// 250 ms between two reports of a process: in a process waking once a second, minutes.
    loading: HashMap<u32, Loading>,
}

/// How often a full `UNWIND_PROCS` is reported in the log.
const FULL_REPORT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// How long the maps of a process caught in its dynamic loader's start-up are read again
/// (every [`LOADING_REREAD`] at most), until they show its libraries: mapping them takes
/// milliseconds, tens of them from a cold page cache.
const LOADING_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// The least time between two reads of a loading process's maps. Polls come at every event
/// the BPF side sends, tens a second on a host starting processes: rereading at each one read
/// a loader's maps dozens of times in its last second, most of them after it had exited (the
/// churn bench's `python3 -c pass`s), a large share of the daemon's CPU under churn.
const LOADING_REREAD: std::time::Duration = std::time::Duration::from_millis(50);

/// A process caught in its dynamic loader's start-up ([`Unwinder::loading`]).
#[derive(Clone, Copy, Debug)]
struct Loading {
    since: std::time::Instant,
    read: std::time::Instant,
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
                    let data = FileData::map_file(&file, &path)
                        .map_err(|err| {
                            tracing::debug!("unwind table for {}: {err}", path.display())
                        })
                        .ok();
                    let runtime = data
                        .as_ref()
                        .and_then(|data| runtime(&registry, data.bytes(), &path));
                    if outbox.send(BuildResult::Runtime(key, runtime)).is_err() {
                        break;
                    }
                    let built = data.and_then(|data| build_from(data.bytes(), &path));
                    if outbox.send(BuildResult::Table(key, built)).is_err() {
                        break;
                    }
                }
            })
            .map_err(LoaderError::Worker)?;
        let entries = initial_process_entries(crate::sys::running_processes(), maps.processes);
        let procs_map = ProcMap::create(&maps.procs, entries)?;
        let mut unwinder = Unwinder {
            procs_map,
            pools: RowPools::new(MAX_ROW_POOLS, maps.pool_rows, MIN_POOL_ROWS),
            pool_maps: PoolMaps::new(),
            maps,
            files: HashMap::new(),
            tables: HashMap::new(),
            procs: HashMap::new(),
            row_epoch: 0,
            requests,
            results,
            clock: 0,
            evicted: 0,
            idle: 0,
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
        };
        unwinder.load_vdso()?;
        Ok(unwinder)
    }

    /// Loads the vDSO's table (a few hundred rows, from the image in this process's memory)
    /// for good: every process maps it, and a sample in `clock_gettime` is common.
    fn load_vdso(&mut self) -> Result<(), LoaderError> {
        let Some(image) = own_vdso() else {
            return Ok(());
        };
        let built = build_from(&image, Path::new("[vdso]"));
        self.install(VDSO, built, &mut HashSet::new())?;
        if matches!(self.files.get(&VDSO), Some(FileState::Loaded(_))) {
            self.vdso_len = Some(image.len() as u64);
        }
        Ok(())
    }

    /// Reads the BPF side's events, describes the processes they name when `wanted` says so
    /// (the daemon's relabelling drops some: they get no tables), and loads the tables the
    /// worker finished. Returns the maps it read, one capture per process, for the symbolizer
    /// to keep at once: for a process that lives a few milliseconds this is the only read
    /// there is, and its files must be opened before it exits. Then call
    /// [`Unwinder::install_tables`]. Cheap when nothing happened; call it when
    /// [`Unwinder::events_fd`] is readable, and every 200 ms.
    pub fn poll(
        &mut self,
        mut wanted: impl FnMut(u32) -> bool,
    ) -> Result<Vec<(u32, ProcessMaps)>, LoaderError> {
        self.clock += 1;
        let mut pids = HashSet::new();
        let mut runtime_stacks = HashSet::new();
        while let Some(item) = self.maps.events.next() {
            if item.len() >= std::mem::size_of::<UnwindEvent>() {
                // SAFETY: the program writes whole `UnwindEvent`s; the length was checked,
                // and read_unaligned needs no alignment.
                let event: UnwindEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
                if event.kind == EVENT_RUNTIME_STACK {
                    runtime_stacks.insert((event.tgid, event.pc));
                } else {
                    pids.insert(event.tgid);
                    self.events += 1;
                }
            }
        }
        self.read_runtime_stacks(runtime_stacks);
        let now = std::time::Instant::now();
        self.loading
            .retain(|_, loading| now.duration_since(loading.since) < LOADING_RECHECK);
        pids.extend(
            self.loading
                .iter()
                .filter(|(_, loading)| now.duration_since(loading.read) >= LOADING_REREAD)
                .map(|(&pid, _)| pid),
        );
        let pids: Vec<u32> = pids
            .into_iter()
            .filter(|pid| !self.without_room.contains(pid) && wanted(*pid))
            .collect();
        self.scan_all(&pids)
    }

    /// Describes `pids` now, before the BPF side asks (`record --pid`), so their first samples
    /// find their tables. Returns the maps read, as [`Unwinder::poll`] does.
    pub fn watch(&mut self, pids: &[u32]) -> Result<Vec<(u32, ProcessMaps)>, LoaderError> {
        let captured = self.scan_all(pids)?;
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

    /// Reads each process's maps and describes it; the tables it asks for are installed by
    /// [`Unwinder::install_tables`].
    fn scan_all(&mut self, pids: &[u32]) -> Result<Vec<(u32, ProcessMaps)>, LoaderError> {
        let mut captured = Vec::with_capacity(pids.len());
        for &pid in pids {
            // A process that is gone, or whose maps cannot be read, keeps frame pointers.
            let Ok(maps) = ProcessMaps::read(pid) else {
                // Gone (or unreadable): nothing will show its libraries.
                self.loading.remove(&pid);
                continue;
            };
            self.processes_read += 1;
            let requested = self.placed(|unwinder| unwinder.scan(pid, &maps))?;
            self.requested |= requested;
            captured.push((pid, maps));
        }
        Ok(captured)
    }

    /// Runs `describe`, which writes `pid`'s mappings to `UNWIND_PROCS`. When the map has no
    /// room, that one process walks by frame pointers, and the others go on: an error here
    /// used to end the whole poll, so with the map full no finished table was ever installed.
    fn placed(
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

    /// Installs the tables the worker finished, and rewrites the processes that use them.
    fn install_built(&mut self, requested: bool) -> Result<(), LoaderError> {
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
            let pids: Vec<u32> = self
                .procs
                .iter()
                .filter(|(_, mappings)| {
                    mappings
                        .iter()
                        .any(|m| m.key.is_some_and(|k| changed.contains(&k)))
                })
                .map(|(&pid, _)| pid)
                .collect();
            for pid in pids {
                self.placed(|unwinder| unwinder.write(pid).map(|()| false))?;
            }
        }
        Ok(())
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

    /// Tables the worker has not finished.
    fn building(&self) -> usize {
        self.files
            .values()
            .filter(|state| **state == FileState::Building)
            .count()
    }

    /// Forgets processes that have exited, in the agent and in the BPF map.
    pub fn forget_exited(&mut self) {
        let gone: Vec<u32> = self
            .procs
            .keys()
            .copied()
            .filter(|pid| !Path::new(&format!("/proc/{pid}")).exists())
            .collect();
        if gone.is_empty() {
            // No room made; forget the ones that exited, whose pids may come back as others.
            self.without_room
                .retain(|pid| Path::new(&format!("/proc/{pid}")).exists());
        } else {
            // Room is made: the processes that found none are read at their next sample.
            self.without_room.clear();
        }
        for pid in gone {
            self.procs.remove(&pid);
            if pid != PROCS_NO_MAPPINGS {
                let _ = self.procs_map.map.remove(&pid);
            }
            self.detach_all(pid);
        }
        self.evict_idle(std::time::Instant::now());
        // An evicted file no process maps any more is forgotten: the next one builds it.
        let mapped: HashSet<FileKey> = self
            .procs
            .values()
            .flatten()
            .filter_map(|mapping| mapping.key)
            .collect();
        self.files
            .retain(|file, state| *state != FileState::Evicted || mapped.contains(file));
    }

    /// Evicts the tables no process has mapped for [`IDLE_TABLE_AGE`] (never the vDSO's), so
    /// the pools follow what the processes running need, not the most they ever needed.
    fn evict_idle(&mut self, now: std::time::Instant) {
        let mapped: HashSet<&TableKey> = self
            .procs
            .values()
            .flatten()
            .filter_map(|mapping| match self.files.get(&mapping.key?) {
                Some(FileState::Loaded(table)) => Some(table),
                _ => None,
            })
            .collect();
        let mut idle = Vec::new();
        for (key, table) in &mut self.tables {
            if mapped.contains(key) || *key == TableKey::File(VDSO) {
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
            events: self.events,
            processes_read: self.processes_read,
            processes_without_room: self.without_room_total,
            runtime_processes: self.attached.len(),
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

    /// Asks for the tables a process's maps lack, and describes it to BPF. Returns whether a
    /// table was asked for.
    fn scan(&mut self, pid: u32, maps: &ProcessMaps) -> Result<bool, LoaderError> {
        let mut requested = false;
        let mut mappings = Vec::new();
        // The agent itself keeps frame-pointer walks (its mappings are described without
        // tables, so it sends no events): whole stacks of itself would cost its own table (the
        // largest on the host) and the DWARF symbolisation of its deep stacks, more memory and
        // CPU than the rest of a recording, for the few samples it takes of itself.
        let agent = pid == std::process::id();
        for entry in maps.entries().iter().filter(|e| e.executable) {
            let key = if agent {
                None
            } else if entry.is_file() {
                Some(FileKey {
                    dev: entry.dev,
                    inode: entry.inode,
                })
            } else {
                let len = entry.end - entry.start;
                (entry.path == "[vdso]" && self.vdso_len == Some(len)).then_some(VDSO)
            };
            if let Some(key) = key.filter(|&key| key != VDSO) {
                requested |= self.request(pid, key, entry);
            }
            mappings.push(ProcMapping {
                start: entry.start,
                end: entry.end,
                offset: entry.offset,
                key,
            });
        }
        self.procs.insert(pid, mappings);
        if still_loading(maps) {
            let now = std::time::Instant::now();
            self.loading
                .entry(pid)
                .and_modify(|loading| loading.read = now)
                .or_insert(Loading {
                    since: now,
                    read: now,
                });
        } else {
            self.loading.remove(&pid);
        }
        self.write(pid)?;
        Ok(requested)
    }

    /// Marks a table used, or asks the worker for it; returns whether it was asked for.
    fn request(&mut self, pid: u32, key: FileKey, entry: &MapEntry) -> bool {
        match self.files.get(&key) {
            Some(FileState::Loaded(table)) => {
                if let Some(table) = self.tables.get_mut(table) {
                    table.last_used = self.clock;
                }
                false
            }
            Some(FileState::Building | FileState::Unavailable) => false,
            Some(FileState::Evicted) | None => {
                let sent = open_mapped(pid, entry)
                    .ok()
                    .is_some_and(|(file, path, _)| self.requests.send((key, file, path)).is_ok());
                let state = if sent {
                    FileState::Building
                } else {
                    FileState::Unavailable
                };
                self.files.insert(key, state);
                sent
            }
        }
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
    fn install(
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
                match self.pool_maps.create(&self.maps.rows, index, rows) {
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
        if let Err(error) = self.pool_maps.write(pool, first_row, &built.rows) {
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

    /// The table to evict next; never the vDSO's, which every process shares and nothing
    /// would load again.
    fn least_recently_used(&self) -> Option<TableKey> {
        self.tables
            .iter()
            .filter(|(key, _)| **key != TableKey::File(VDSO))
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
        let loaded = FileState::Loaded(key);
        let files: HashSet<FileKey> = self
            .files
            .iter()
            .filter(|(_, state)| **state == loaded)
            .map(|(file, _)| *file)
            .collect();
        if for_room {
            for file in &files {
                self.files.insert(*file, FileState::Evicted);
            }
        } else {
            self.files.retain(|file, _| !files.contains(file));
        }
        let users: Vec<u32> = self
            .procs
            .iter()
            .filter(|(_, mappings)| {
                mappings
                    .iter()
                    .any(|m| m.key.is_some_and(|k| files.contains(&k)))
            })
            .map(|(&pid, _)| pid)
            .collect();
        for pid in users {
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
    fn release(&mut self, pool: u32, first_row: u32, rows: u32) {
        self.row_epoch += 1;
        if let Err(error) = self.maps.row_epoch.set(0, self.row_epoch, 0) {
            // Not expected of a one-entry array; the rows stay taken, as a table no longer
            // used, rather than be reused under rows the program may still hold.
            tracing::warn!("writing BPF map ROW_EPOCH: {error}; {rows} unwind rows not reused");
            return;
        }
        if self.pools.release(pool, first_row, rows) {
            self.pool_maps.remove(&self.maps.rows, pool);
            self.pools.remove(pool);
        }
    }

    /// Writes a process's mappings, as far as its tables are known, to `UNWIND_PROCS`.
    fn write(&mut self, pid: u32) -> Result<(), LoaderError> {
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
        let attachments = self.attachments(pid);
        let mut chosen: Vec<UnwindMapping> = mappings.iter().map(|m| self.describe(m)).collect();
        // The walk hands a frame in a runtime's code to that runtime's walk when its mapping
        // says so.
        for (id, attachment) in &attachments {
            let ranges: Vec<(u64, u64)> = attachment
                .owned
                .iter()
                .map(|range| (range.start, range.end))
                .collect();
            chosen = mark_owned(chosen, &ranges, *id);
        }
        chosen.sort_by_key(|m| (m.state == MAPPING_NO_TABLE && m.runtime == 0, m.start));
        chosen.truncate(MAX_PROC_MAPPINGS);
        chosen.sort_by_key(|m| m.start);
        value.count = chosen.len() as u32;
        value.mappings[..chosen.len()].copy_from_slice(&chosen);
        let mut inserted = self.procs_map.map.insert(pid, value, 0);
        // Full: a map twice as large, up to the ceiling, and again.
        if inserted.as_ref().is_err_and(is_full) && self.procs_map.entries < self.maps.processes {
            let entries = self
                .procs_map
                .entries
                .saturating_mul(2)
                .min(self.maps.processes);
            // A map the kernel will not create leaves this one, full: the process finds no
            // room, as at the ceiling.
            match self.procs_map.replaced(&self.maps.procs, entries) {
                Ok(grown) => {
                    self.procs_map = grown;
                    inserted = self.procs_map.map.insert(pid, value, 0);
                }
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
            if let Some(bias) = load_bias(mapping, &table.segments) {
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

/// Builds one table, on the worker thread, from an ELF image in memory. `None` when the
/// binary has none the BPF side can use; why is logged, as it is data about the binary, not a
/// fault of the agent.
fn build_from(bytes: &[u8], path: &Path) -> Option<Built> {
    let table = UnwindTable::build(path, bytes)
        .map_err(|err| tracing::debug!("unwind table for {}: {err}", path.display()))
        .ok()?;
    let elf = object::File::parse(bytes).ok()?;
    let segments = executable_segments(&elf);
    tracing::debug!(
        "unwind table for {}: {} rows",
        path.display(),
        table.rows().len()
    );
    Some(Built {
        rows: table.rows().to_vec(),
        base: table.base(),
        segments,
        // A Go binary without a GNU build id is keyed by its Go one.
        build_id: match elf.build_id() {
            Ok(Some(id)) => Some(Box::from(id)),
            _ => crate::binary::gopclntab::build_id(&elf, bytes).map(|id| Box::from(id.as_bytes())),
        },
    })
}

/// The executable `PT_LOAD` segments of `elf`.
fn executable_segments(elf: &object::File) -> Vec<Segment> {
    elf.segments()
        .filter(|s| matches!(s.flags(), SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0))
        .map(|s| {
            let (offset, file_size) = s.file_range();
            Segment {
                offset,
                address: s.address(),
                file_size,
            }
        })
        .collect()
}

/// Whether `maps` were read while the dynamic loader was starting the process: code from two
/// files only, the program's and the loader's the kernel mapped, and no library yet. A static
/// program maps code from one file; a dynamic one, once loaded, from its libraries too. (A
/// musl program, whose loader is its libc, looks loading: its maps are read a few more times.)
fn still_loading(maps: &ProcessMaps) -> bool {
    let files: HashSet<(u64, u64)> = maps
        .entries()
        .iter()
        .filter(|entry| entry.executable && entry.is_file())
        .map(|entry| (entry.dev, entry.inode))
        .collect();
    files.len() == 2
}

/// What the process adds to a binary's ELF addresses: its load bias, from the executable
/// segment one of its mappings holds.
fn load_bias(mapping: &ProcMapping, segments: &[Segment]) -> Option<u64> {
    let segment = segments
        .iter()
        .find(|s| s.offset & !0xfff <= mapping.offset && mapping.offset < s.offset + s.file_size)?;
    Some(
        mapping
            .start
            .wrapping_sub(mapping.offset)
            .wrapping_add(segment.offset)
            .wrapping_sub(segment.address),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::maps::parse_maps;

    fn maps(text: &str) -> ProcessMaps {
        ProcessMaps::from_entries(parse_maps(text, Path::new("maps")).unwrap())
    }

    /// A dozer of `cargo xtask bench --only scale` sampled in ld.so's `init_cpu_features`:
    /// the kernel has mapped the program and its loader, the loader no library yet.
    const STARTING: &str = "\
55d0c5a4e000-55d0c5a4f000 r--p 00000000 fe:00 1310804 /scale/bin/dozer-073
55d0c5a4f000-55d0c5a50000 r-xp 00001000 fe:00 1310804 /scale/bin/dozer-073
55d0c5a50000-55d0c5a51000 r--p 00002000 fe:00 1310804 /scale/bin/dozer-073
7f1efe424000-7f1efe428000 r--p 00000000 00:00 0 [vvar]
7f1efe42a000-7f1efe42c000 r-xp 00000000 00:00 0 [vdso]
7f1efe42c000-7f1efe42d000 r--p 00000000 fe:00 325843 /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
7f1efe42d000-7f1efe453000 r-xp 00001000 fe:00 325843 /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
7fff0dbdf000-7fff0dc00000 rw-p 00000000 00:00 0 [stack]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]
";

    const LIBC: &str = "\
7f1efe203000-7f1efe229000 r--p 00000000 fe:00 326279 /usr/lib/x86_64-linux-gnu/libc.so.6
7f1efe229000-7f1efe37f000 r-xp 00026000 fe:00 326279 /usr/lib/x86_64-linux-gnu/libc.so.6
";

    #[test]
    fn a_process_whose_loader_has_mapped_no_library_yet_is_still_loading() {
        assert!(still_loading(&maps(STARTING)));
        // `from_entries` sorts the lines by address.
        assert!(!still_loading(&maps(&format!("{STARTING}{LIBC}"))));
        // A static program: code from one file.
        let lines: Vec<&str> = STARTING
            .lines()
            .filter(|l| !l.contains("ld-linux"))
            .collect();
        assert!(!still_loading(&maps(&lines.join("\n"))));
    }
}
