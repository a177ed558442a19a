//! The symbolizer's cache of parsed ELF files: bounded by an estimated byte budget, least
//! recently used and idle files evicted, and the files whose DWARF went over its limits
//! remembered.

use super::*;

/// Identity of a cached file: where it lives on disk, with its build id when it has one.
///
/// Never the build id alone: a build id is only bytes in a note, and any container can write
/// another binary's into a file of its own. Were the first parse of a build id shared by every
/// process, that container would name other processes' frames.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum CacheKey {
    BuildId { id: String, dev: u64, inode: u64 },
    Inode { dev: u64, inode: u64, mtime: i64 },
}

impl CacheKey {
    /// The (device, inode) of the file.
    pub(super) fn file(&self) -> (u64, u64) {
        match *self {
            CacheKey::BuildId { dev, inode, .. } | CacheKey::Inode { dev, inode, .. } => {
                (dev, inode)
            }
        }
    }
}

pub(super) struct CacheEntry {
    /// `None` remembers a file that could not be used, so it is not retried every window.
    pub(super) file: Option<Rc<ElfFile>>,
    pub(super) cost: usize,
    pub(super) last_used: u64,
    /// The window of the last lookup or insertion (see [`ElfCache::evict_idle`]).
    pub(super) last_window: u64,
    /// The file's modification time when it was opened.
    pub(super) mtime: i64,
}

/// Parsed ELF files, bounded by an estimated byte budget, least recently used evicted first.
pub(super) struct ElfCache {
    pub(super) budget: usize,
    pub(super) used: usize,
    pub(super) clock: u64,
    /// Windows ended so far.
    pub(super) window: u64,
    pub(super) entries: HashMap<CacheKey, CacheEntry>,
    /// Which entry a mapped (device, inode) resolved to.
    pub(super) by_inode: HashMap<(u64, u64), CacheKey>,
}

impl ElfCache {
    pub(super) fn new(budget: usize) -> Self {
        ElfCache {
            budget,
            used: 0,
            clock: 0,
            window: 0,
            entries: HashMap::new(),
            by_inode: HashMap::new(),
        }
    }

    pub(super) fn get(&mut self, dev: u64, inode: u64) -> Option<Option<Rc<ElfFile>>> {
        let key = self.by_inode.get(&(dev, inode))?;
        let entry = self.entries.get_mut(key)?;
        self.clock += 1;
        entry.last_used = self.clock;
        entry.last_window = self.window;
        Some(entry.file.clone())
    }

    pub(super) fn insert(
        &mut self,
        dev: u64,
        inode: u64,
        mtime: i64,
        key: CacheKey,
        file: Option<Rc<ElfFile>>,
    ) -> Option<Rc<ElfFile>> {
        self.clock += 1;
        // The same file seen again (another process mapping it): keep the first parse.
        if let Some(existing) = self.entries.get_mut(&key) {
            existing.last_used = self.clock;
            existing.last_window = self.window;
            self.by_inode.insert((dev, inode), key);
            return existing.file.clone();
        }
        let cost = file.as_ref().map_or(64, |f| f.cost());
        self.used += cost;
        self.entries.insert(
            key.clone(),
            CacheEntry {
                file: file.clone(),
                cost,
                last_used: self.clock,
                last_window: self.window,
                mtime,
            },
        );
        self.by_inode.insert((dev, inode), key);
        file
    }

    /// The modification time the file behind (device, inode) had when it was opened.
    pub(super) fn mtime(&self, dev: u64, inode: u64) -> Option<i64> {
        let key = self.by_inode.get(&(dev, inode))?;
        Some(self.entries.get(key)?.mtime)
    }

    /// Drops the DWARF (and inflated sections) of the cached file behind (device, inode), when
    /// nothing else holds the file, and charges its entry what is left.
    pub(super) fn forget_dwarf(&mut self, dev: u64, inode: u64) {
        let Some(entry) = self
            .by_inode
            .get(&(dev, inode))
            .and_then(|key| self.entries.get_mut(key))
        else {
            return;
        };
        let Some(file) = entry.file.as_mut().and_then(Rc::get_mut) else {
            return;
        };
        file.forget_dwarf();
        let cost = file.cost();
        self.used = self.used - entry.cost + cost;
        entry.cost = cost;
    }

    /// Ends a window, and evicts the files no lookup used in the last [`IDLE_WINDOWS`], or in
    /// the last [`UNMAPPED_IDLE_WINDOWS`] when no captured process maps them (`mapped` says):
    /// the binaries of processes that came and went (a build's compilers, a burst of scripts)
    /// would otherwise stay parsed, within the budget but for good, and the daemon's memory
    /// would not go back to what it was before them. Returns the bytes released.
    pub(super) fn evict_idle(&mut self, mapped: &dyn Fn(u64, u64) -> bool) -> usize {
        self.window += 1;
        let window = self.window;
        let idle: Vec<CacheKey> = self
            .entries
            .iter()
            .filter(|(key, e)| {
                let unused = window - e.last_window;
                let (dev, inode) = key.file();
                unused > IDLE_WINDOWS || (unused > UNMAPPED_IDLE_WINDOWS && !mapped(dev, inode))
            })
            .map(|(k, _)| k.clone())
            .collect();
        let mut released = 0;
        for key in &idle {
            if let Some(entry) = self.entries.remove(key) {
                self.used -= entry.cost;
                released += entry.cost;
            }
        }
        if !idle.is_empty() {
            self.by_inode
                .retain(|_, key| self.entries.contains_key(key));
        }
        released
    }

    /// Evicts least recently used entries until the estimate fits the budget. Returns the
    /// bytes released.
    pub(super) fn enforce_budget(&mut self) -> usize {
        let mut released = 0;
        while self.used > self.budget {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(entry) = self.entries.remove(&oldest) {
                self.used -= entry.cost;
                released += entry.cost;
            }
            self.by_inode.retain(|_, key| *key != oldest);
        }
        released
    }
}

/// How many lookups may touch mapped DWARF before its pages are released from this process's
/// RSS: often enough that a large binary's debug info never all counts at once, rarely enough
/// that refaulting from the page cache costs little.
pub(super) const RELEASE_PAGES_EVERY: u64 = 256;

/// Windows a cached file may go unused before it is evicted: a minute of the daemon's default
/// 10 s windows. A binary that runs again soon after (the same script every few seconds) stays.
pub(super) const IDLE_WINDOWS: u64 = 6;

/// Windows a cached file that no captured process maps any more may go unused before it is
/// evicted: the window its last process's samples were named in, and one more, for a binary
/// started again at once (a script run in a loop).
pub(super) const UNMAPPED_IDLE_WINDOWS: u64 = 1;

/// Default budget for parsed binaries and their debug info.
pub const DEFAULT_CACHE_BYTES: usize = 256 << 20;

/// Most files remembered as over their DWARF limits. More than the binaries and libraries a
/// busy host maps, at about 50 bytes each; past it the oldest is forgotten, and costs its
/// refusal (bounded by the limits) once more if it is opened again.
pub(super) const MAX_OVER_BUDGET_FILES: usize = 4096;

/// Files whose DWARF went over its limits, by (device, inode) and modification time, so that
/// opening one again after an eviction reads no DWARF: neither the inflation nor the index is
/// paid twice. A file rewritten in place has a new modification time, and gets another try.
#[derive(Default)]
pub(super) struct OverBudgetFiles {
    pub(super) mtimes: HashMap<(u64, u64), i64>,
    /// Oldest first.
    pub(super) order: VecDeque<(u64, u64)>,
}

impl OverBudgetFiles {
    pub(super) fn contains(&self, id: (u64, u64), mtime: i64) -> bool {
        self.mtimes.get(&id) == Some(&mtime)
    }

    pub(super) fn insert(&mut self, id: (u64, u64), mtime: i64) {
        if self.mtimes.insert(id, mtime).is_some() {
            return;
        }
        self.order.push_back(id);
        if self.order.len() > MAX_OVER_BUDGET_FILES {
            if let Some(oldest) = self.order.pop_front() {
                self.mtimes.remove(&oldest);
            }
        }
    }
}
