//! What naming a process's frames needs, captured while it runs: its maps (each version its
//! samples may still need, [`MapsHistory`]) and open handles on the files it maps.
//!
//! A process on a build or CI host may live 20 ms, less than one look of the agent's periodic
//! discovery; it is captured when first seen instead (at its first sample, which the BPF side
//! reports at once through the unwinder's events), and the capture outlives it until the
//! window holding its samples has been named. A handle keeps the mapped inode readable after the process exits, even when
//! the binary was deleted (a test binary, a compiler's temporary).
//!
//! Captures of exited processes are bounded three ways, oldest exit first, each counted by
//! reason when it drops one whose samples may not be named yet: how many, how many bytes, and
//! how long since the exit. Open handles are bounded by count. A process that exited without a
//! sample needs nothing and is dropped at once, uncounted.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use super::maps::{MapEntry, MapsHistory, ProcessMaps};

/// Bounds on what is kept for processes that have exited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptureLimits {
    /// Exited processes whose captures are kept.
    pub exited: usize,
    /// Estimated bytes of all captured maps, live processes' included.
    pub bytes: usize,
    /// How long a capture outlives its process.
    pub after_exit: Duration,
    /// Open handles on mapped files.
    pub files: usize,
}

impl Default for CaptureLimits {
    /// A 10 s recording of a build host starting 500 processes a second fits: about 5,000
    /// exited captures of 1 to 3 KiB. A daemon drops them after each window anyway.
    fn default() -> Self {
        CaptureLimits {
            exited: 16_384,
            bytes: 48 << 20,
            after_exit: Duration::from_secs(600),
            files: 2048,
        }
    }
}

/// Why a capture, or a file handle, went before its samples were named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CaptureDrop {
    /// More exited processes than [`CaptureLimits::exited`].
    Count,
    /// Captured maps over [`CaptureLimits::bytes`].
    Bytes,
    /// Exited longer ago than [`CaptureLimits::after_exit`].
    Age,
    /// A file not held open: [`CaptureLimits::files`] handles were open already.
    Files,
}

impl CaptureDrop {
    pub const ALL: [CaptureDrop; 4] = [
        CaptureDrop::Count,
        CaptureDrop::Bytes,
        CaptureDrop::Age,
        CaptureDrop::Files,
    ];

    /// Short name, for the summary and the `reason` label in `/metrics`.
    pub fn as_str(self) -> &'static str {
        match self {
            CaptureDrop::Count => "count",
            CaptureDrop::Bytes => "bytes",
            CaptureDrop::Age => "age",
            CaptureDrop::Files => "files",
        }
    }
}

/// What the captures hold, for `/metrics` and the summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaptureStats {
    /// Processes with a capture, alive or not.
    pub processes: usize,
    /// Of those, the ones that have exited.
    pub exited: usize,
    /// Estimated bytes of their maps.
    pub bytes: usize,
    /// Open handles on mapped files.
    pub files: usize,
    /// Dropped early, by reason, since start.
    pub dropped: BTreeMap<CaptureDrop, u64>,
}

/// An open handle on a mapped file: the file, the path it was opened by (for logs), its
/// modification time.
pub type HeldFile = (std::fs::File, PathBuf, i64);

/// One process's capture.
struct Capture {
    history: MapsHistory,
    /// [`history_bytes`] of `history`, kept to update the total.
    bytes: usize,
    /// When its exit was noticed.
    exited: Option<Instant>,
    /// Whether a drained window held samples of it: only then is it kept after its exit.
    sampled: bool,
}

/// A file handle, and what decides when it is let go.
struct Held {
    file: HeldFile,
    /// The process it was opened through: once that exited and its samples were named, the
    /// handle has done its work.
    pid: u32,
}

/// The captures of every process seen; see the module documentation.
pub struct Captures {
    processes: HashMap<u32, Capture>,
    /// Exited processes, oldest exit first; an entry whose process is gone from `processes`
    /// (or came back under the same pid) is skipped.
    exits: VecDeque<(u32, Instant)>,
    bytes: usize,
    held: HashMap<(u64, u64), Held>,
    limits: CaptureLimits,
    dropped: BTreeMap<CaptureDrop, u64>,
}

impl Default for Captures {
    fn default() -> Self {
        Captures::new(CaptureLimits::default())
    }
}

impl Captures {
    pub fn new(limits: CaptureLimits) -> Self {
        Captures {
            processes: HashMap::new(),
            exits: VecDeque::new(),
            bytes: 0,
            held: HashMap::new(),
            limits,
            dropped: BTreeMap::new(),
        }
    }

    /// Adds a capture of `pid`'s maps. Returns true when it started a new version of them (see
    /// [`MapsHistory`]).
    pub fn insert(&mut self, pid: u32, maps: ProcessMaps) -> bool {
        use std::collections::hash_map::Entry;
        let (capture, new_version) = match self.processes.entry(pid) {
            Entry::Vacant(slot) => {
                let capture = slot.insert(Capture {
                    history: MapsHistory::new(maps),
                    bytes: 0,
                    exited: None,
                    sampled: false,
                });
                (capture, false)
            }
            Entry::Occupied(slot) => {
                let capture = slot.into_mut();
                // A pid that came back as another process (its exit noted, the capture not
                // dropped yet): the new maps are a version of their own unless they hold the
                // same code at the same places, so the old samples keep their names.
                capture.exited = None;
                let new_version = capture.history.capture(maps);
                (capture, new_version)
            }
        };
        let bytes = history_bytes(&capture.history);
        self.bytes = self.bytes - capture.bytes + bytes;
        capture.bytes = bytes;
        new_version
    }

    /// Whether a handle on the file behind `entry` should be opened: not held yet, and room.
    /// A refusal for room is counted.
    pub fn wants_file(&mut self, entry: &MapEntry) -> bool {
        if self.held.contains_key(&(entry.dev, entry.inode)) {
            return false;
        }
        if self.held.len() >= self.limits.files {
            *self.dropped.entry(CaptureDrop::Files).or_insert(0) += 1;
            return false;
        }
        true
    }

    /// Keeps a handle on the file behind `entry`, opened through process `pid`.
    pub fn hold_file(&mut self, pid: u32, entry: &MapEntry, file: HeldFile) {
        self.held
            .entry((entry.dev, entry.inode))
            .or_insert(Held { file, pid });
    }

    /// The held handle on file (`dev`, `inode`), handed over: the caller parses it and keeps
    /// what it needs.
    pub fn take_file(&mut self, dev: u64, inode: u64) -> Option<HeldFile> {
        self.held.remove(&(dev, inode)).map(|held| held.file)
    }

    pub fn history(&self, pid: u32) -> Option<&MapsHistory> {
        self.processes.get(&pid).map(|capture| &capture.history)
    }

    /// Marks `pids` as having samples in a drained window.
    pub fn mark_sampled(&mut self, pids: &[u32]) {
        for pid in pids {
            if let Some(capture) = self.processes.get_mut(pid) {
                capture.sampled = true;
            }
        }
    }

    /// Notes which captured processes have exited (`alive` says), as of `now`; drops at once
    /// those never sampled, then enforces the limits on the rest.
    pub fn note_exits(&mut self, now: Instant, mut alive: impl FnMut(u32) -> bool) {
        let mut unneeded = Vec::new();
        for (&pid, capture) in &mut self.processes {
            if capture.exited.is_some() || alive(pid) {
                continue;
            }
            if capture.sampled {
                capture.exited = Some(now);
                self.exits.push_back((pid, now));
            } else {
                unneeded.push(pid);
            }
        }
        for pid in unneeded {
            self.remove(pid);
        }
        self.enforce_limits(now);
    }

    /// Drops the oldest exited captures while a limit is exceeded, counting each by the first
    /// limit it broke.
    fn enforce_limits(&mut self, now: Instant) {
        while let Some(&(pid, at)) = self.exits.front() {
            if self.processes.get(&pid).and_then(|c| c.exited) != Some(at) {
                self.exits.pop_front();
                continue;
            }
            let reason = if now.duration_since(at) > self.limits.after_exit {
                CaptureDrop::Age
            } else if self.exits.len() > self.limits.exited {
                CaptureDrop::Count
            } else if self.bytes > self.limits.bytes {
                CaptureDrop::Bytes
            } else {
                break;
            };
            self.exits.pop_front();
            self.remove(pid);
            *self.dropped.entry(reason).or_insert(0) += 1;
        }
    }

    /// Forgets the processes that have exited, whose windows were all named (the daemon calls
    /// it after each window), and the handles opened through them; keeps only the latest
    /// version of the others' maps.
    pub fn forget_exited(&mut self, mut alive: impl FnMut(u32) -> bool) {
        let gone: Vec<u32> = self
            .processes
            .keys()
            .copied()
            .filter(|&pid| !alive(pid))
            .collect();
        for pid in gone {
            self.remove(pid);
        }
        self.exits.clear();
        for capture in self.processes.values_mut() {
            capture.history.forget_earlier();
            capture.sampled = false;
            let bytes = history_bytes(&capture.history);
            self.bytes = self.bytes - capture.bytes + bytes;
            capture.bytes = bytes;
        }
        let processes = &self.processes;
        self.held
            .retain(|_, held| processes.contains_key(&held.pid));
    }

    /// The files (device, inode) the captured processes map: after [`Captures::forget_exited`],
    /// those of processes alive.
    pub fn mapped_files(&self) -> std::collections::HashSet<(u64, u64)> {
        self.processes
            .values()
            .flat_map(|capture| capture.history.versions())
            .flat_map(|maps| maps.entries())
            .filter(|entry| entry.is_file())
            .map(|entry| (entry.dev, entry.inode))
            .collect()
    }

    fn remove(&mut self, pid: u32) {
        if let Some(capture) = self.processes.remove(&pid) {
            self.bytes -= capture.bytes;
        }
        self.held.retain(|_, held| held.pid != pid);
    }

    pub fn stats(&self) -> CaptureStats {
        CaptureStats {
            processes: self.processes.len(),
            exited: self
                .processes
                .values()
                .filter(|capture| capture.exited.is_some())
                .count(),
            bytes: self.bytes,
            files: self.held.len(),
            dropped: self.dropped.clone(),
        }
    }
}

/// Whether `/proc/PID` exists: the process has not been reaped.
pub fn process_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// An estimate of what a history holds on the heap: its entries and their paths.
fn history_bytes(history: &MapsHistory) -> usize {
    history
        .versions()
        .iter()
        .map(|maps| {
            maps.entries()
                .iter()
                .map(|e| std::mem::size_of::<MapEntry>() + e.path.capacity())
                .sum::<usize>()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn maps(path: &str, inode: u64) -> ProcessMaps {
        ProcessMaps::from_entries(vec![MapEntry {
            start: 0x1000,
            end: 0x2000,
            offset: 0,
            executable: true,
            dev: 1,
            inode,
            path: path.to_owned(),
        }])
    }

    fn limits() -> CaptureLimits {
        CaptureLimits {
            exited: 2,
            bytes: 1 << 20,
            after_exit: Duration::from_secs(60),
            files: 1,
        }
    }

    #[test]
    fn exited_processes_keep_their_capture_only_when_sampled() {
        let mut captures = Captures::new(limits());
        captures.insert(10, maps("/usr/bin/a", 1));
        captures.insert(11, maps("/usr/bin/b", 2));
        captures.mark_sampled(&[10]);
        captures.note_exits(Instant::now(), |_| false);
        assert!(captures.history(10).is_some(), "sampled: kept after exit");
        assert!(
            captures.history(11).is_none(),
            "never sampled: nothing to name"
        );
        let stats = captures.stats();
        assert_eq!((stats.processes, stats.exited), (1, 1));
        assert!(stats.dropped.is_empty(), "{:?}", stats.dropped);
    }

    #[test]
    fn the_oldest_exits_go_first_and_are_counted_by_reason() {
        let mut captures = Captures::new(limits());
        let start = Instant::now();
        for pid in 1..=3 {
            captures.insert(pid, maps("/usr/bin/a", 1));
            captures.mark_sampled(&[pid]);
            captures.note_exits(start + Duration::from_secs(u64::from(pid)), |p| p > pid);
        }
        // Three exited, two kept: the first to exit went.
        assert!(captures.history(1).is_none());
        assert!(captures.history(2).is_some() && captures.history(3).is_some());
        assert_eq!(captures.stats().dropped.get(&CaptureDrop::Count), Some(&1));
        // A minute after the last exit, all are too old.
        captures.note_exits(start + Duration::from_secs(64), |_| false);
        assert_eq!(captures.stats().processes, 0);
        assert_eq!(captures.stats().dropped.get(&CaptureDrop::Age), Some(&2));
        assert_eq!(captures.stats().bytes, 0, "bytes follow removals");
    }

    #[test]
    fn bytes_bound_the_exited_captures() {
        let mut captures = Captures::new(CaptureLimits {
            bytes: 2 * (std::mem::size_of::<MapEntry>() + 64),
            exited: 100,
            ..limits()
        });
        let long = "/x".repeat(32);
        for pid in 1..=3 {
            captures.insert(pid, maps(&long, pid.into()));
        }
        captures.mark_sampled(&[1, 2, 3]);
        captures.note_exits(Instant::now(), |_| false);
        assert_eq!(captures.stats().processes, 2);
        assert_eq!(captures.stats().dropped.get(&CaptureDrop::Bytes), Some(&1));
    }

    #[test]
    fn a_pid_that_comes_back_keeps_the_old_processs_version() {
        let mut captures = Captures::new(limits());
        captures.insert(7, maps("/usr/bin/a", 1));
        captures.mark_sampled(&[7]);
        captures.note_exits(Instant::now(), |_| false);
        assert!(
            captures.insert(7, maps("/usr/bin/b", 2)),
            "other code: a version of its own"
        );
        let history = captures.history(7).expect("captured");
        assert_eq!(
            history.at(0).entries()[0].path,
            "/usr/bin/a",
            "old samples' names"
        );
        assert_eq!(history.latest().entries()[0].path, "/usr/bin/b");
        assert_eq!(captures.stats().exited, 0, "alive again");
    }

    #[test]
    fn file_handles_are_bounded_and_follow_their_process() {
        let mut captures = Captures::new(limits());
        let file = |name: &str| -> HeldFile {
            (
                std::fs::File::open("/proc/self/stat").expect("opens"),
                PathBuf::from(name),
                0,
            )
        };
        let a = maps("/usr/bin/a", 1);
        let b = maps("/usr/bin/b", 2);
        captures.insert(1, a.clone());
        assert!(captures.wants_file(&a.entries()[0]));
        captures.hold_file(1, &a.entries()[0], file("a"));
        assert!(!captures.wants_file(&a.entries()[0]), "held already");
        assert!(!captures.wants_file(&b.entries()[0]), "no room");
        assert_eq!(captures.stats().dropped.get(&CaptureDrop::Files), Some(&1));
        // Its process exited and its window was named: the handle goes with it.
        captures.forget_exited(|_| false);
        assert_eq!(captures.stats().files, 0);
        assert!(captures.take_file(1, 1).is_none());
    }
}
