//! User frame names: absolute address -> mapping in `/proc/PID/maps` -> file offset -> ELF
//! virtual address -> function levels from DWARF or the symbol tables ([`super::elf`]).
//!
//! Each step changes the address space, so each has its own type ([`FileOffset`],
//! [`ElfAddress`](crate::binary::address::ElfAddress)): mixing an absolute address with an ELF address
//! is the classic profiler bug (wrong names for every PIE binary and shared library), and here
//! it does not compile.
//!
//! Binaries are opened through `/proc/PID/map_files` (the mapped inode itself, even deleted) or
//! `/proc/PID/root` (the process's own view of the file system), so a binary that exists only in
//! a container's mount namespace is found. Mappings are captured at every drain while the
//! process is alive, so a process that exits before the profile is written is still named.
//! Parsed files are cached by build id within a byte budget. A file whose DWARF went over its
//! limits is remembered, so that opening it again after an eviction reads its symbol tables
//! only.

mod cache;
mod debug_file;
mod upload;

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    rc::Rc,
    sync::Arc,
    time::Instant,
};

use super::elf::{
    DwarfLimits, DwarfOptions, ElfFile, ElfMiss, FileData, OverBudget, ResolvedFrame, SectionCache,
};
use super::entry::{EntryChains, ProcessFrames, Spot};
use crate::pipeline::aggregate::StackSample;
use crate::process::captures::{process_alive, CaptureStats, Captures};
use crate::process::maps::{own_vdso, MapEntry, MapsHistory, ProcessMaps};
use crate::process::open::{open_mapped, OpenError};
use crate::process::perf_map::PerfMap;
use crate::profile::{FrameKind, Line};
use crate::runtimes::{Registry, RuntimeNames};
use crate::sys::allocator::release_free_memory;
use crate::sys::hex::to_hex;
use crate::sys::untrusted;
pub use cache::DEFAULT_CACHE_BYTES;
use cache::*;
pub use upload::NewBinary;

/// Why a user frame has no function name. A miss is data, reported in the profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum UserMiss {
    /// No maps were ever captured for the process (it exited before the first drain).
    NoMaps,
    /// The address is in no mapping.
    Unmapped,
    /// Anonymous executable memory (JIT code) that no perf map names.
    Anonymous,
    /// The file could not be opened or parsed.
    UnreadableFile,
    /// The file at the mapped path is no longer the one that was mapped.
    BinaryReplaced,
    /// The file offset is outside every loaded segment.
    NotLoaded,
    /// Neither DWARF nor the symbol tables cover the address.
    NoSymbol,
    /// A Go binary whose `.gopclntab`, the only table that could name the address, is corrupt.
    CorruptGoTable,
    /// `--symbolize none`: left for the server.
    NotSymbolized,
}

impl From<OpenError> for UserMiss {
    fn from(error: OpenError) -> UserMiss {
        match error {
            OpenError::Replaced => UserMiss::BinaryReplaced,
            OpenError::Unreadable => UserMiss::UnreadableFile,
        }
    }
}

impl UserMiss {
    /// True when the symboliser looked and nothing else could do better: the ELF file was
    /// read and holds no name for the address, or the code is anonymous memory no perf map
    /// names. False when it could not look (a file unreadable or replaced, `--symbolize none`,
    /// no maps), so a reader such as pprof may still ask a symbol server.
    pub fn is_conclusive(self) -> bool {
        match self {
            UserMiss::Anonymous
            | UserMiss::NotLoaded
            | UserMiss::NoSymbol
            | UserMiss::CorruptGoTable => true,
            UserMiss::NoMaps
            | UserMiss::Unmapped
            | UserMiss::UnreadableFile
            | UserMiss::BinaryReplaced
            | UserMiss::NotSymbolized => false,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            UserMiss::NoMaps => "process gone before its maps were read",
            UserMiss::Unmapped => "address not mapped",
            UserMiss::Anonymous => "anonymous code without a perf map",
            UserMiss::UnreadableFile => "binary unreadable or corrupt",
            UserMiss::BinaryReplaced => "binary replaced on disk",
            UserMiss::NotLoaded => "offset outside loaded segments",
            UserMiss::NoSymbol => "no symbol",
            UserMiss::CorruptGoTable => "corrupt Go symbol table (.gopclntab)",
            UserMiss::NotSymbolized => "not symbolized (--symbolize none)",
        }
    }
}

/// Things that went wrong but still gave a name (a fallback), counted for the summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fallback {
    /// A debug link pointed at a file whose CRC does not match.
    DebugLinkCrcMismatch,
    /// A separate debug file was found but could not be parsed.
    BadDebugFile,
    /// DWARF in a file could not be read; the symbol table named its frames.
    BadDwarf,
    /// DWARF in a file would have cost more than a file may (inflated sections, units, ranges):
    /// refused, once per file, and the symbol table named its frames.
    DwarfOverBudget,
    /// A Go binary's `.gopclntab` failed a lookup; the symbol table named the frame.
    BadGoTable,
}

impl Fallback {
    pub fn as_str(self) -> &'static str {
        match self {
            Fallback::DebugLinkCrcMismatch => "debug link CRC mismatch",
            Fallback::BadDebugFile => "unreadable debug file",
            Fallback::BadDwarf => "corrupt DWARF",
            Fallback::DwarfOverBudget => "DWARF over its size limits",
            Fallback::BadGoTable => "corrupt Go symbol table entry",
        }
    }
}

/// How much to resolve in the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SymbolizeMode {
    /// Names, inline frames and file:line from the binaries and their debug files.
    #[default]
    Local,
    /// Addresses, mappings and build ids only, for a server that symbolises later. Kernel
    /// frames are still named: no server has this machine's kallsyms.
    None,
}

/// A user frame: its mapping and what it resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserFrame {
    /// Index of the mapping in the process's captured maps, when the address is mapped.
    pub mapping: Option<usize>,
    /// Function levels, innermost first, or why there are none.
    pub frames: Result<Vec<ResolvedFrame>, UserMiss>,
}

// Parsed files are shared with `Rc`: addr2line parses lazily through cells, so a file is not
// `Sync`; the symboliser lives on one thread.

/// Process maps, perf maps and ELF files, kept across windows within a byte budget.
pub struct UserSymbolizer {
    mode: SymbolizeMode,
    /// Maps captured per process, each version its samples may still need, and handles on
    /// the files they map, kept past the process's exit until its samples are named.
    captures: Captures,
    /// JIT symbol maps per process (`/tmp/perf-PID.map`), read on first need.
    perf_maps: HashMap<u32, Option<PerfMap>>,
    cache: ElfCache,
    /// The vdso image, identical in every process of this kernel, read from our own memory.
    vdso: Option<Option<Rc<ElfFile>>>,
    /// Lookups so far; every [`RELEASE_PAGES_EVERY`] the mapped pages they touched are let go.
    lookups: u64,
    /// Build ids by mapped file, for `--symbolize none`, which parses nothing else.
    build_ids: HashMap<(u64, u64), Option<String>>,
    /// With `--symbolize none` and a Parca remote: files whose build id was read since the last
    /// [`UserSymbolizer::take_new_binaries`], at most this many (`None`: not collected).
    collect_binaries: Option<usize>,
    new_binaries: Vec<NewBinary>,
    /// Files left out because `new_binaries` was full (the taker is never waited on).
    new_binaries_dropped: u64,
    /// Frames left unnamed, by reason.
    pub misses: BTreeMap<UserMiss, u64>,
    /// Names found by a fallback path, by reason.
    pub fallbacks: BTreeMap<Fallback, u64>,
    /// File lookups the cache answered, and those that had to open and parse the file.
    cache_hits: u64,
    cache_misses: u64,
    /// How files' DWARF is read: its limits, where compressed sections are inflated.
    dwarf: DwarfOptions,
    over_budget: OverBudgetFiles,
    /// Files opened without their DWARF because it had gone over its limits before.
    dwarf_skips: u64,
    /// The agent's own executable, by (`dev_t`, inode): named from its symbol table only.
    own_executable: Option<(u64, u64)>,
    /// The frames below glibc's start code, learned from table walks (see `entry`).
    entry_chains: EntryChains,
    /// Runtimes' frames' names (CPython's), from the processes' memory (see `runtimes`).
    runtimes: RuntimeNames,
    /// Frames named since the window began, by file place (device, inode, offset): the
    /// processes of one binary (a churn of short-lived `python3`s, a pool of workers) map it
    /// at different addresses, and each asked the same file's DWARF about the same code.
    resolved: HashMap<(u64, u64, u64), Vec<ResolvedFrame>>,
}

/// Most file places [`UserSymbolizer`] remembers the frames of within a window; past it, it
/// starts again.
const MAX_RESOLVED: usize = 16_384;

/// The ELF cache's footprint and effectiveness, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    /// Estimated bytes the cached files hold (see `ElfFile::cost`), what the cache's budget
    /// bounds.
    pub bytes: u64,
    /// Of `bytes`, the debug sections read in place from their files (`ElfFile::
    /// file_backed_bytes`): mapped, not allocated; the rest is heap and inflated sections.
    pub file_backed: u64,
    pub hits: u64,
    pub misses: u64,
}

impl Default for UserSymbolizer {
    fn default() -> Self {
        UserSymbolizer::new(SymbolizeMode::Local, DEFAULT_CACHE_BYTES)
    }
}

impl UserSymbolizer {
    pub fn new(mode: SymbolizeMode, cache_bytes: usize) -> Self {
        UserSymbolizer {
            mode,
            captures: Captures::default(),
            perf_maps: HashMap::new(),
            cache: ElfCache::new(cache_bytes),
            vdso: None,
            build_ids: HashMap::new(),
            collect_binaries: None,
            new_binaries: Vec::new(),
            new_binaries_dropped: 0,
            lookups: 0,
            misses: BTreeMap::new(),
            fallbacks: BTreeMap::new(),
            cache_hits: 0,
            cache_misses: 0,
            dwarf: DwarfOptions::default(),
            over_budget: OverBudgetFiles::default(),
            own_executable: std::fs::metadata("/proc/self/exe")
                .ok()
                .map(|meta| (meta.dev(), meta.ino())),
            dwarf_skips: 0,
            entry_chains: EntryChains::default(),
            resolved: HashMap::new(),
            runtimes: RuntimeNames::default(),
        }
    }

    /// Inflates compressed debug sections into `dir` instead of `$TMPDIR`, which may be memory
    /// (tmpfs): a directory the daemon owns, on disk, where their size is accounted to it.
    pub fn set_scratch_dir(&mut self, dir: impl Into<PathBuf>) {
        self.dwarf.scratch_dir = Some(dir.into());
    }

    /// Keeps inflated debug sections in `cache` and maps them from there the next time
    /// (`record`, whose every run would inflate libc's DWARF again).
    pub fn set_section_cache(&mut self, cache: SectionCache) {
        self.dwarf.section_cache = Some(cache);
    }

    /// Changes what one file's DWARF may cost before it is refused.
    pub fn set_dwarf_limits(&mut self, limits: DwarfLimits) {
        self.dwarf.limits = limits;
    }

    /// Files opened without reading their DWARF, because it had gone over its limits before.
    pub fn dwarf_skips(&self) -> u64 {
        self.dwarf_skips
    }

    /// How to read a file's DWARF. Inflated sections count against the cache: a file whose
    /// sections alone would fill it is evicted at the next window and inflated again at the
    /// next lookup, so that is the most a file may inflate.
    fn dwarf_options(&self, skip: bool) -> DwarfOptions {
        let mut options = self.dwarf.clone();
        options.skip = skip;
        options.limits.inflated_bytes = options
            .limits
            .inflated_bytes
            .min(u64::try_from(self.cache.budget).unwrap_or(u64::MAX));
        options
    }

    /// Counts, logs and remembers a file whose DWARF was refused, so it is not read again.
    fn remember_over_budget(&mut self, id: (u64, u64), mtime: i64, over: OverBudget, path: &str) {
        self.over_budget.insert(id, mtime);
        *self.fallbacks.entry(Fallback::DwarfOverBudget).or_insert(0) += 1;
        tracing::debug!("{path}: DWARF not used, {over}; its symbol table names its frames");
    }

    pub fn cache_stats(&self) -> CacheStats {
        let file_backed = self
            .cache
            .entries
            .values()
            .filter_map(|entry| entry.file.as_ref())
            .map(|file| file.file_backed_bytes() as u64)
            .sum();
        CacheStats {
            bytes: self.cache.used as u64,
            file_backed,
            hits: self.cache_hits,
            misses: self.cache_misses,
        }
    }

    pub fn mode(&self) -> SymbolizeMode {
        self.mode
    }

    /// Captures the maps of `pids` the first time each is seen, while it is alive, and again
    /// later so libraries loaded since are known. A process that has exited keeps its capture.
    pub fn capture(&mut self, pids: impl IntoIterator<Item = u32>) {
        for pid in pids {
            if pid == 0 {
                continue;
            }
            match ProcessMaps::read(pid) {
                Ok(maps) => self.keep_capture(pid, maps),
                Err(err) => tracing::debug!("{err}"),
            }
        }
    }

    /// Keeps maps of `pid` read just now (by [`UserSymbolizer::capture`], or by the unwinder
    /// when the process exec'd or was first sampled), and opens the files they map.
    pub fn keep_capture(&mut self, pid: u32, maps: ProcessMaps) {
        // Open (not parse) the code files now, while /proc/PID/map_files and /proc/PID/root
        // still lead to them: a short-lived process may be gone by the time its samples are
        // symbolised. Only the files its samples turn out to hit are parsed, later.
        if self.mode == SymbolizeMode::Local {
            for entry in maps
                .entries()
                .iter()
                .filter(|e| e.executable && e.is_file())
            {
                self.hold_file(pid, entry);
            }
        }
        if self.captures.insert(pid, maps) {
            tracing::debug!(pid, "code unmapped: a new version of its maps");
        }
    }

    /// Marks the processes a drained window sampled: their captures outlive them.
    pub fn mark_sampled(&mut self, pids: &[u32]) {
        self.captures.mark_sampled(pids);
    }

    /// Notes the captured processes that exited, drops those never sampled, and keeps the
    /// others within their bounds ([`CaptureLimits`](crate::process::captures::CaptureLimits)). For a recording, which names its
    /// samples at the end: call once a window.
    pub fn note_exits(&mut self) {
        self.captures.note_exits(Instant::now(), process_alive);
    }

    /// What the captures hold and what they dropped early.
    pub fn capture_stats(&self) -> CaptureStats {
        self.captures.stats()
    }

    /// Forgets processes that no longer exist (their maps, perf maps and file handles) and the
    /// earlier versions of the maps of those that do. Call after their samples were
    /// symbolised.
    pub fn forget_exited(&mut self) {
        self.captures.forget_exited(process_alive);
        self.runtimes.end_window(&process_alive);
        self.perf_maps.retain(|pid, _| process_alive(*pid));
    }

    /// Changes the byte budget for parsed files; takes effect at the next `enforce_budget`.
    pub fn set_cache_budget(&mut self, bytes: usize) {
        self.cache.budget = bytes;
    }

    /// Ends a window: evicts parsed files unused for [`IDLE_WINDOWS`] windows and those beyond
    /// the byte budget, and gives the freed memory back to the OS.
    pub fn enforce_budget(&mut self) {
        // The files may go, or be replaced under the same inode once their processes exit.
        self.resolved = HashMap::new();
        let mapped = self.captures.mapped_files();
        let idle = self
            .cache
            .evict_idle(&|dev, inode| mapped.contains(&(dev, inode)));
        if idle + self.cache.enforce_budget() > 0 {
            release_free_memory();
        }
        self.release_resident_pages();
    }

    /// Drops the DWARF parse of cached files no lookup used since the last call (see
    /// [`ElfFile::release_idle_parse`]); their mappings and symbol tables stay.
    pub fn release_idle_parses(&self) {
        let mut released = false;
        for entry in self.cache.entries.values() {
            if let Some(file) = &entry.file {
                released |= file.release_idle_parse();
            }
        }
        if released {
            release_free_memory();
        }
    }

    /// Drops the mapped file pages that lookups made resident, in every cached file.
    pub fn release_resident_pages(&self) {
        for entry in self.cache.entries.values() {
            if let Some(file) = &entry.file {
                file.release_resident_pages();
            }
        }
    }

    /// Keeps an open handle on the file behind `entry`, unless it is cached or held already.
    fn hold_file(&mut self, pid: u32, entry: &MapEntry) {
        if self.cache.by_inode.contains_key(&(entry.dev, entry.inode))
            || !self.captures.wants_file(entry)
        {
            return;
        }
        if let Ok(file) = open_mapped(pid, entry) {
            self.captures.hold_file(pid, entry, file);
        }
    }

    /// The latest captured maps of `pid`.
    pub fn maps(&self, pid: u32) -> Option<&ProcessMaps> {
        self.captures.history(pid).map(MapsHistory::latest)
    }

    /// The maps of `pid` that were latest at `version` (see [`MapsHistory`]).
    pub fn maps_at(&self, pid: u32, version: u32) -> Option<&ProcessMaps> {
        self.captures
            .history(pid)
            .map(|history| history.at(version))
    }

    /// `stacks` with the frames below glibc's start code given to walks that stopped there,
    /// merged (see [`super::entry`]).
    pub fn complete_entry_chains<'a>(
        &mut self,
        stacks: impl IntoIterator<Item = (&'a StackSample, u64)>,
    ) -> Vec<(std::borrow::Cow<'a, StackSample>, u64)> {
        let mut chains = std::mem::take(&mut self.entry_chains);
        let completed = chains.complete(stacks, self);
        self.entry_chains = chains;
        completed
    }

    /// Names the frames of `registry`'s runtimes from now on (none are named before).
    pub fn set_runtimes(&mut self, registry: &Registry) {
        self.runtimes = RuntimeNames::new(registry);
    }

    /// The runtimes' namers: the loader's attachments and code captures go to them.
    pub fn runtimes(&mut self) -> &mut RuntimeNames {
        &mut self.runtimes
    }

    /// The lines and kind of the runtime frame (`word`, `more`) of `pid` ([`RuntimeNames::lines`]).
    pub fn runtime_lines(&mut self, pid: u32, word: u64, more: u64) -> (Vec<Line>, FrameKind) {
        self.runtimes.lines(pid, word, more)
    }

    /// Each runtime's frames named and left unknown since start, by its name.
    pub fn runtime_counts(&self) -> Vec<(&'static str, (u64, u64))> {
        self.runtimes.counts().collect()
    }

    /// Each runtime's names' memory in the last window, by its name.
    pub fn runtime_window_bytes(&self) -> Vec<(&'static str, usize)> {
        self.runtimes.window_bytes().collect()
    }

    /// Samples whose stacks got the frames below glibc's start code, since start.
    pub fn entry_completions(&self) -> u64 {
        self.entry_chains.completed
    }

    /// The version of the latest captured maps of `pid`: what its samples drained now keep.
    pub fn maps_version(&self, pid: u32) -> u32 {
        self.captures.history(pid).map_or(0, MapsHistory::version)
    }

    /// A process's maps as if discovered, for tests of what reads them.
    #[cfg(test)]
    pub(crate) fn insert_maps(&mut self, pid: u32, maps: ProcessMaps) {
        self.captures.insert(pid, maps);
    }

    /// The parsed file behind `entry` of process `pid`, from the cache or opened now.
    pub fn elf(&mut self, pid: u32, entry: &MapEntry) -> Result<Rc<ElfFile>, UserMiss> {
        if entry.path == "[vdso]" {
            return self.vdso().ok_or(UserMiss::UnreadableFile);
        }
        if !entry.is_file() {
            return Err(UserMiss::Anonymous);
        }
        if let Some(cached) = self.cache.get(entry.dev, entry.inode) {
            self.cache_hits += 1;
            return cached.ok_or(UserMiss::UnreadableFile);
        }
        self.cache_misses += 1;
        let (file, key, mtime) = match self.open_mapped_file(pid, entry) {
            Ok(opened) => opened,
            Err(miss) => {
                if miss == UserMiss::BinaryReplaced {
                    // Not cached: the process may be replaced too, and then the path is right.
                    return Err(miss);
                }
                let key = CacheKey::Inode {
                    dev: entry.dev,
                    inode: entry.inode,
                    mtime: 0,
                };
                self.cache.insert(entry.dev, entry.inode, 0, key, None);
                return Err(miss);
            }
        };
        self.cache
            .insert(entry.dev, entry.inode, mtime, key, Some(Rc::new(file)))
            .ok_or(UserMiss::UnreadableFile)
    }

    /// Opens the exact file a mapping holds: through `/proc/PID/map_files` (the mapped inode
    /// itself, even if deleted or replaced), else through the process's root with an inode
    /// check. Then looks for separate debug info, unless the file's DWARF went over its limits
    /// (now or before). Returns the file's modification time too.
    fn open_mapped_file(
        &mut self,
        pid: u32,
        entry: &MapEntry,
    ) -> Result<(ElfFile, CacheKey, i64), UserMiss> {
        let id = (entry.dev, entry.inode);
        let (handle, path, mtime) = match self.captures.take_file(entry.dev, entry.inode) {
            Some(held) => held,
            None => open_mapped(pid, entry).map_err(UserMiss::from)?,
        };
        let over_budget = self.over_budget.contains(id, mtime);
        self.dwarf_skips += u64::from(over_budget);
        // The agent samples itself in every window it works in, and its own binary carries
        // the most DWARF on the host (its release build's line tables): naming its pcs from it
        // would take more memory than the rest of the agent (`cargo bench --bench symbolize`,
        // cold case, measures it). Its frames are named from its symbol table instead (its
        // debug file's, when stripped): function names, without inline frames or lines.
        let own = self.own_executable == Some((entry.dev_t(), entry.inode));
        let skip_dwarf = over_budget || own;
        let options = self.dwarf_options(skip_dwarf);
        let data = FileData::map_file(&handle, &path);
        let root = PathBuf::from(format!("/proc/{pid}/root"));
        let mut file = data
            .and_then(|data| ElfFile::parse_with(Arc::new(data), &path, &options))
            .map_err(|err| {
                tracing::debug!("{err}");
                UserMiss::UnreadableFile
            })?;
        if file.dwarf_errors() > 0 {
            *self.fallbacks.entry(Fallback::BadDwarf).or_insert(0) += 1;
        }
        if !over_budget && !file.has_dwarf() && file.dwarf_refused().is_none() {
            if let Some(debug) = self.find_debug_file(&root, entry.file_path(), &file, own) {
                file.attach_debug(debug);
            }
        }
        if let Some(over) = file.dwarf_refused() {
            self.remember_over_budget(id, mtime, over, entry.file_path());
        }
        // Indexing the DWARF read every unit header; those pages are not needed again soon.
        file.release_resident_pages();
        let key = match &file.build_id {
            Some(id) => CacheKey::BuildId {
                id: id.clone(),
                dev: entry.dev,
                inode: entry.inode,
            },
            None => CacheKey::Inode {
                dev: entry.dev,
                inode: entry.inode,
                mtime,
            },
        };
        Ok((file, key, mtime))
    }

    /// The vdso, parsed once from this process's own copy (the kernel maps the same image into
    /// every process).
    fn vdso(&mut self) -> Option<Rc<ElfFile>> {
        self.vdso
            .get_or_insert_with(|| {
                let data = Arc::new(FileData::Owned(own_vdso()?));
                ElfFile::parse(data, Path::new("[vdso]")).ok().map(Rc::new)
            })
            .clone()
    }

    fn perf_map(&mut self, pid: u32) -> Option<&PerfMap> {
        self.perf_maps
            .entry(pid)
            .or_insert_with(|| PerfMap::read(pid))
            .as_ref()
    }

    /// Names `address` in process `pid`, with its latest maps. `is_return_address` is true for
    /// every frame but the leaf: those point after a call, possibly past the end of the calling
    /// function.
    pub fn symbolize(&mut self, pid: u32, address: u64, is_return_address: bool) -> UserFrame {
        let version = self.maps_version(pid);
        self.symbolize_at(pid, version, address, is_return_address)
    }

    /// Names `address` in process `pid` with the maps that were latest at `maps_version`.
    pub fn symbolize_at(
        &mut self,
        pid: u32,
        maps_version: u32,
        address: u64,
        is_return_address: bool,
    ) -> UserFrame {
        let frame = self.resolve(pid, maps_version, address, is_return_address);
        if let Err(miss) = &frame.frames {
            *self.misses.entry(*miss).or_insert(0) += 1;
        }
        frame
    }

    fn resolve(
        &mut self,
        pid: u32,
        version: u32,
        address: u64,
        is_return_address: bool,
    ) -> UserFrame {
        let Some(maps) = self
            .captures
            .history(pid)
            .map(|history| history.at(version))
        else {
            return UserFrame {
                mapping: None,
                frames: Err(UserMiss::NoMaps),
            };
        };
        let Some((index, entry)) = maps.find(address) else {
            // JIT code can live outside any mapping the kernel names; the perf map may know.
            return UserFrame {
                mapping: None,
                frames: self.jit_frame(pid, address).ok_or(UserMiss::Unmapped),
            };
        };
        let mapping = Some(index);
        if self.mode == SymbolizeMode::None {
            return UserFrame {
                mapping,
                frames: Err(UserMiss::NotSymbolized),
            };
        }
        let lookup_address = if is_return_address {
            address.saturating_sub(1).max(entry.start)
        } else {
            address
        };
        let file_offset = entry.file_offset(lookup_address);
        let vdso = entry.path == "[vdso]";
        if !entry.is_file() && !vdso {
            return UserFrame {
                mapping,
                frames: self.jit_frame(pid, address).ok_or(UserMiss::Anonymous),
            };
        }
        let place = (!vdso).then_some((entry.dev, entry.inode, file_offset.0));
        if let Some(frames) = place.and_then(|place| self.resolved.get(&place)) {
            return UserFrame {
                mapping,
                frames: Ok(frames.clone()),
            };
        }
        // Counted where a lookup reads the file's mapped pages: a remembered place reads none.
        self.lookups += 1;
        if self.lookups.is_multiple_of(RELEASE_PAGES_EVERY) {
            self.release_resident_pages();
        }
        // The hot path is a cache hit, which needs only the mapping's identity; the entry is
        // copied only to open a file not seen before.
        let cached = if vdso {
            None
        } else {
            self.cache.get(entry.dev, entry.inode)
        };
        let elf = match cached {
            Some(hit) => hit.ok_or(UserMiss::UnreadableFile),
            None => {
                let entry = entry.clone();
                self.elf(pid, &entry)
            }
        };
        // The unit index, built by a file's first lookup, may refuse its DWARF too.
        let mut refused = None;
        let mut clean = false;
        let frames = elf.and_then(|elf| {
            let before = (elf.dwarf_errors(), elf.go_errors());
            let elf_address = elf.elf_address(file_offset).ok_or(UserMiss::NotLoaded)?;
            let result = elf.resolve(elf_address).map_err(|miss| match miss {
                ElfMiss::NotLoaded => UserMiss::NotLoaded,
                ElfMiss::NoSymbol => UserMiss::NoSymbol,
                ElfMiss::CorruptGoTable => UserMiss::CorruptGoTable,
            });
            if elf.dwarf_errors() > before.0 {
                *self.fallbacks.entry(Fallback::BadDwarf).or_insert(0) += 1;
            }
            if elf.go_errors() > before.1 && result.is_ok() {
                *self.fallbacks.entry(Fallback::BadGoTable).or_insert(0) += 1;
            }
            if elf.has_dwarf() {
                refused = elf.dwarf_refused();
            }
            clean = (elf.dwarf_errors(), elf.go_errors()) == before;
            result
        });
        if let (Some(over), false) = (refused, vdso) {
            self.refused_by_index(pid, version, address, over);
        }
        // Only a plain answer is remembered: a lookup that met corrupt debug info, or whose
        // DWARF was refused, is asked again, and counted again.
        if let (Some(place), Ok(found), None, true) = (place, &frames, refused, clean) {
            if self.resolved.len() >= MAX_RESOLVED {
                self.resolved.clear();
            }
            self.resolved.insert(place, found.clone());
        }
        UserFrame { mapping, frames }
    }

    /// Remembers a file whose unit index refused its DWARF at a lookup of `address` in `pid`,
    /// and drops that DWARF from its cache entry: the inflated sections go now, not at the
    /// file's eviction.
    fn refused_by_index(&mut self, pid: u32, version: u32, address: u64, over: OverBudget) {
        let Some((_, entry)) = self
            .maps_at(pid, version)
            .and_then(|maps| maps.find(address))
        else {
            return;
        };
        let (id, path) = ((entry.dev, entry.inode), entry.file_path().to_owned());
        let mtime = self.cache.mtime(id.0, id.1).unwrap_or(0);
        // Once per file: a file something else still held keeps its DWARF, refused, until then.
        if !self.over_budget.contains(id, mtime) {
            self.remember_over_budget(id, mtime, over, &path);
        }
        self.cache.forget_dwarf(id.0, id.1);
    }

    fn jit_frame(&mut self, pid: u32, address: u64) -> Option<Vec<ResolvedFrame>> {
        let name = self.perf_map(pid)?.lookup(address)?.to_owned();
        Some(vec![ResolvedFrame {
            function: name.clone(),
            system_name: name,
            file: None,
            line: 0,
            go: false,
        }])
    }
}

/// What [`EntryChains`] needs, from the captured maps and the files they name.
impl ProcessFrames for UserSymbolizer {
    fn spot(&self, pid: u32, version: u32, address: u64) -> Option<Spot> {
        let (_, entry) = self.maps_at(pid, version)?.find(address)?;
        (entry.is_file() && entry.executable)
            .then(|| (entry.dev, entry.inode, entry.file_offset(address).0))
    }

    fn entry(&mut self, pid: u32, version: u32) -> Option<Spot> {
        // The executable's code is the first file code mapped: the kernel maps it before the
        // loader, and the loader maps libraries above both.
        let entry = self
            .maps_at(pid, version)?
            .entries()
            .iter()
            .find(|e| e.is_file())?
            .clone();
        let elf = self.elf(pid, &entry).ok()?;
        Some((entry.dev, entry.inode, elf.entry_offset()?.0))
    }

    fn address(&self, pid: u32, version: u32, (dev, inode, offset): Spot) -> Option<u64> {
        self.maps_at(pid, version)?
            .entries()
            .iter()
            .find(|e| {
                e.executable
                    && (e.dev, e.inode) == (dev, inode)
                    && (e.offset..e.offset + (e.end - e.start)).contains(&offset)
            })
            .map(|e| e.start + (offset - e.offset))
    }

    fn function(&mut self, pid: u32, version: u32, address: u64) -> Option<String> {
        // Not `symbolize_at`: a place asked about here is named again, and counted, when
        // its location is built.
        let frames = self.resolve(pid, version, address, true).frames.ok()?;
        frames.into_iter().last().map(|frame| frame.function)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_evicts_files_idle_for_a_minute_of_windows() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let file = Rc::new(ElfFile::open(&exe).unwrap());
        let cost = file.cost();
        let mut cache = ElfCache::new(usize::MAX);
        let key = |i: u64| CacheKey::Inode {
            dev: 1,
            inode: i,
            mtime: 0,
        };
        cache.insert(1, 1, 0, key(1), Some(file.clone()));
        cache.insert(1, 2, 0, key(2), Some(file.clone()));
        for _ in 0..IDLE_WINDOWS {
            // Inode 1 is looked up every window; inode 2 never again.
            assert!(cache.get(1, 1).is_some());
            assert_eq!(cache.evict_idle(&|_, _| true), 0);
        }
        assert!(cache.get(1, 1).is_some());
        assert_eq!(cache.evict_idle(&|_, _| true), cost);
        assert!(cache.get(1, 2).is_none(), "the idle file is gone");
        assert!(cache.get(1, 1).is_some(), "the busy file stays");
        assert_eq!(cache.used, cost);
    }

    /// A file no process maps any more goes after two windows unused, not six: a build's
    /// compilers are gone, and so is what naming their frames took.
    #[test]
    fn cache_evicts_files_no_process_maps_after_two_idle_windows() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let file = Rc::new(ElfFile::open(&exe).unwrap());
        let cost = file.cost();
        let mut cache = ElfCache::new(usize::MAX);
        let key = |i: u64| CacheKey::Inode {
            dev: 1,
            inode: i,
            mtime: 0,
        };
        cache.insert(1, 1, 0, key(1), Some(file.clone()));
        cache.insert(1, 2, 0, key(2), Some(file.clone()));
        cache.insert(1, 3, 0, key(3), Some(file.clone()));
        // Inode 2 is mapped by a live process, inode 3 by none; 1 by none but looked up.
        let mapped = |_: u64, inode: u64| inode == 2;
        for _ in 0..UNMAPPED_IDLE_WINDOWS {
            assert!(cache.get(1, 1).is_some());
            assert_eq!(cache.evict_idle(&mapped), 0);
        }
        assert_eq!(cache.evict_idle(&mapped), 2 * cost);
        assert!(cache.get(1, 3).is_none(), "the unmapped idle file is gone");
        assert!(cache.get(1, 2).is_some(), "the mapped one stays");
    }

    #[test]
    fn cache_evicts_least_recently_used_beyond_budget() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let file = Rc::new(ElfFile::open(&exe).unwrap());
        let cost = file.cost();
        let mut cache = ElfCache::new(cost * 2 + cost / 2);
        let key = |i: u64| CacheKey::Inode {
            dev: 1,
            inode: i,
            mtime: 0,
        };
        for inode in 1..=3 {
            cache.insert(1, inode, 0, key(inode), Some(file.clone()));
        }
        assert!(cache.get(1, 1).is_some());
        assert_eq!(cache.enforce_budget(), cost);
        // Inode 2 was the least recently used: 1 was read after the inserts.
        assert!(cache.get(1, 2).is_none());
        assert!(cache.get(1, 1).is_some() && cache.get(1, 3).is_some());
        // The same build id in two files is two entries: a file claiming another's build id
        // must not lend its symbols to the other's processes.
        let mut cache = ElfCache::new(usize::MAX);
        let key = |dev, inode| CacheKey::BuildId {
            id: "ab".into(),
            dev,
            inode,
        };
        cache.insert(1, 10, 0, key(1, 10), Some(file.clone()));
        cache.insert(2, 20, 0, key(2, 20), Some(file.clone()));
        assert_eq!(cache.entries.len(), 2);
        assert_eq!(cache.used, 2 * cost);
        // The same file through another mapping is one entry.
        cache.insert(1, 10, 0, key(1, 10), Some(file.clone()));
        assert_eq!(cache.entries.len(), 2);
    }

    /// The cache's estimate counts the debug sections read in place whole, and says which
    /// part of it they are: file-backed pages, not heap.
    #[test]
    fn the_cache_says_what_of_its_estimate_is_file_backed() {
        let pid = std::process::id();
        let mut symbolizer = UserSymbolizer {
            own_executable: None,
            ..UserSymbolizer::default()
        };
        symbolizer.capture([pid]);
        let address = the_cache_says_what_of_its_estimate_is_file_backed as *const () as u64;
        let frames = symbolizer.symbolize(pid, address, false).frames.unwrap();
        assert!(frames.iter().any(|f| f.line > 0), "{frames:?}");
        let stats = symbolizer.cache_stats();
        // This test binary's DWARF is tens of MB, uncompressed, read in place.
        assert!(
            stats.file_backed > 1 << 20 && stats.file_backed < stats.bytes,
            "{stats:?}"
        );
    }

    #[test]
    fn files_over_their_dwarf_limits_are_remembered_and_opened_again_without_it() {
        let pid = std::process::id();
        // The agent names itself without DWARF; this test's subject is its own binary's.
        let mut symbolizer = UserSymbolizer {
            own_executable: None,
            ..UserSymbolizer::default()
        };
        // This test binary has hundreds of units: its unit index goes over a cap of 8.
        symbolizer.set_dwarf_limits(DwarfLimits {
            units: 8,
            ..DwarfLimits::default()
        });
        symbolizer.capture([pid]);
        let address = files_over_their_dwarf_limits_are_remembered_and_opened_again_without_it
            as *const () as u64;
        let name = |symbolizer: &mut UserSymbolizer| {
            let frames = symbolizer.symbolize(pid, address, false).frames.unwrap();
            assert!(frames.len() == 1 && frames[0].line == 0, "{frames:?}");
            frames[0].function.clone()
        };
        let refused = |symbolizer: &UserSymbolizer| {
            symbolizer
                .fallbacks
                .get(&Fallback::DwarfOverBudget)
                .copied()
        };
        assert!(name(&mut symbolizer).contains("opened_again_without_it"));
        assert_eq!(refused(&symbolizer), Some(1));
        assert_eq!(symbolizer.dwarf_skips(), 0);
        // The refused DWARF left the cache at once, not at the file's eviction.
        assert!(symbolizer.cache_stats().bytes < 32 << 20);

        symbolizer.set_cache_budget(0);
        symbolizer.enforce_budget();
        assert_eq!(symbolizer.cache_stats().bytes, 0);
        symbolizer.set_cache_budget(DEFAULT_CACHE_BYTES);
        // Opened again, the file is read without DWARF: nothing to refuse, nothing counted.
        assert!(name(&mut symbolizer).contains("opened_again_without_it"));
        assert_eq!(symbolizer.dwarf_skips(), 1);
        assert_eq!(refused(&symbolizer), Some(1));
    }

    #[test]
    fn over_budget_memory_is_bounded_and_knows_rewritten_files() {
        let mut memory = OverBudgetFiles::default();
        for inode in 0..=MAX_OVER_BUDGET_FILES as u64 {
            memory.insert((1, inode), 7);
        }
        assert_eq!(memory.mtimes.len(), MAX_OVER_BUDGET_FILES);
        assert!(!memory.contains((1, 0), 7), "the oldest is forgotten");
        assert!(memory.contains((1, 1), 7));
        assert!(
            !memory.contains((1, 1), 8),
            "a file rewritten in place gets another try"
        );
        memory.insert((1, 1), 8);
        assert!(memory.contains((1, 1), 8));
        assert_eq!(memory.order.len(), MAX_OVER_BUDGET_FILES);
    }

    #[test]
    fn the_agents_own_frames_are_named_from_its_symbol_table_without_dwarf() {
        let pid = std::process::id();
        let address =
            the_agents_own_frames_are_named_from_its_symbol_table_without_dwarf as *const () as u64;
        let frames = |own: bool| {
            let mut symbolizer = UserSymbolizer::default();
            if !own {
                symbolizer = UserSymbolizer {
                    own_executable: None,
                    ..symbolizer
                };
            }
            symbolizer.capture([pid]);
            symbolizer.symbolize(pid, address, false).frames.unwrap()
        };
        let own = frames(true);
        assert!(
            own.len() == 1 && own[0].line == 0 && own[0].file.is_none(),
            "{own:?}"
        );
        assert!(
            own[0].function.contains("named_from_its_symbol_table"),
            "{own:?}"
        );
        // The same pc in another binary (this one, were it not the agent) has its line.
        let other = frames(false);
        assert!(other.last().is_some_and(|f| f.line > 0), "{other:?}");
    }

    #[test]
    fn symbolizes_own_test_binary() {
        // This test binary is a real PIE ELF with a symbol table: resolve one of its own
        // functions through its live mapping, the full absolute -> offset -> ELF path.
        let pid = std::process::id();
        let mut symbolizer = UserSymbolizer::default();
        symbolizer.capture([pid]);
        let address = symbolizes_own_test_binary as *const () as u64;
        let frame = symbolizer.symbolize(pid, address, false);
        let frames = frame.frames.unwrap();
        let name = &frames.last().unwrap().function;
        assert!(name.contains("symbolizes_own_test_binary"), "{name}");
        let (_, entry) = symbolizer.maps(pid).unwrap().find(address).unwrap();
        let entry = entry.clone();
        let build_id = symbolizer.build_id(pid, &entry);
        assert!(
            build_id.is_some_and(|id| id.len() >= 16 && id.chars().all(|c| c.is_ascii_hexdigit()))
        );
    }
}
