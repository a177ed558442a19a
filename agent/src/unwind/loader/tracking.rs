//! Process tracking: the processes the BPF side reports (its events), read and described;
//! those caught in their dynamic loader's start-up read again until their libraries show;
//! those that exited forgotten, which makes room for the ones that found none.

use std::collections::HashSet;

use scorch_common::{UnwindEvent, PROCS_NO_MAPPINGS};

use super::{FileKey, FileState, LoaderError, LoaderMaps, ProcMapping, Unwinder, VDSO};
use crate::process::{
    maps::{MapEntry, MapsError, ProcessMaps},
    open::open_mapped,
};

/// How long the maps of a process caught in its dynamic loader's start-up are read again
/// (every [`LOADING_REREAD`] at most), until they show its libraries: mapping them takes
/// milliseconds, tens of them from a cold page cache.
pub(super) const LOADING_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// The least time between two reads of a loading process's maps. Polls come at every event
/// the BPF side sends, tens a second on a host starting processes: rereading at each one read
/// a loader's maps dozens of times in its last second, most of them after it had exited (the
/// churn bench's `python3 -c pass`s), a large share of the daemon's CPU under churn.
pub(super) const LOADING_REREAD: std::time::Duration = std::time::Duration::from_millis(50);

/// How long a process whose runtime was met setting itself up is described again: a JVM sets
/// its code cache up in its first tens of milliseconds, seconds on a loaded host.
pub(super) const ATTACH_RETRY: std::time::Duration = std::time::Duration::from_secs(30);

/// The least time between two descriptions of a process a runtime attaches later.
pub(super) const ATTACH_REREAD: std::time::Duration = std::time::Duration::from_millis(200);

/// A process caught in its dynamic loader's start-up ([`Unwinder::loading`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Loading {
    /// When its maps were first read: it is read again for [`LOADING_RECHECK`] at most.
    since: std::time::Instant,
    /// When its maps were last read: read again [`LOADING_REREAD`] after.
    read: std::time::Instant,
}

impl Unwinder {
    /// Reads the BPF side's events, describes the processes they name when `wanted` says so
    /// (the daemon's relabelling drops some: they get no tables), and loads the tables the
    /// worker finished. Returns the maps it read, one capture per process, for the symbolizer
    /// to keep at once: for a process that lives a few milliseconds this is the only read
    /// there is, and its files must be opened before it exits. Then call
    /// [`Unwinder::install_tables`]. Cheap when nothing happened; call it when
    /// [`Unwinder::events_fd`] is readable, and every 200 ms.
    pub fn poll(
        &mut self,
        wanted: impl FnMut(u32) -> bool,
    ) -> Result<Vec<(u32, ProcessMaps)>, LoaderError> {
        self.clock += 1;
        let mut pids = HashSet::new();
        while let Some(item) = self.maps.events.next() {
            if item.len() >= std::mem::size_of::<UnwindEvent>() {
                // SAFETY: the program writes whole `UnwindEvent`s; the length was checked,
                // and read_unaligned needs no alignment.
                let event: UnwindEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
                pids.insert(event.tgid);
                self.events += 1;
            }
        }
        let pids = self.reads_due(pids, wanted, std::time::Instant::now());
        self.scan_all(&pids, ProcessMaps::read)
    }
}

impl<M: LoaderMaps> Unwinder<M> {
    /// Notes whether a runtime of `pid` asked to be attached later (see
    /// [`Unwinder::attach_later`]).
    pub(super) fn note_attach_later(&mut self, pid: u32, later: bool) {
        if !later {
            self.attach_later.remove(&pid);
            return;
        }
        let now = std::time::Instant::now();
        self.attach_later
            .entry(pid)
            .and_modify(|later| later.read = now)
            .or_insert(Loading {
                since: now,
                read: now,
            });
    }

    /// The processes to read at a poll at `now`: those the events named (`pids`) and the
    /// loading ones due a read again, less those that found no room and those `wanted`
    /// drops.
    pub(super) fn reads_due(
        &mut self,
        mut pids: HashSet<u32>,
        mut wanted: impl FnMut(u32) -> bool,
        now: std::time::Instant,
    ) -> Vec<u32> {
        self.loading
            .retain(|_, loading| now.duration_since(loading.since) < LOADING_RECHECK);
        pids.extend(
            self.loading
                .iter()
                .filter(|(_, loading)| now.duration_since(loading.read) >= LOADING_REREAD)
                .map(|(&pid, _)| pid),
        );
        self.attach_later
            .retain(|_, later| now.duration_since(later.since) < ATTACH_RETRY);
        pids.extend(
            self.attach_later
                .iter()
                .filter(|(_, later)| now.duration_since(later.read) >= ATTACH_REREAD)
                .map(|(&pid, _)| pid),
        );
        pids.into_iter()
            .filter(|pid| !self.without_room.contains(pid) && wanted(*pid))
            .collect()
    }

    /// Reads each process's maps (with `read`: [`ProcessMaps::read`] but in the unit tests)
    /// and describes it; the tables it asks for are installed by [`Unwinder::install_tables`].
    pub(super) fn scan_all(
        &mut self,
        pids: &[u32],
        read: impl Fn(u32) -> Result<ProcessMaps, MapsError>,
    ) -> Result<Vec<(u32, ProcessMaps)>, LoaderError> {
        let mut captured = Vec::with_capacity(pids.len());
        for &pid in pids {
            // A process that is gone, or whose maps cannot be read, keeps frame pointers.
            let Ok(maps) = read(pid) else {
                // Gone (or unreadable): nothing will show its libraries.
                self.loading.remove(&pid);
                self.attach_later.remove(&pid);
                continue;
            };
            self.processes_read += 1;
            let requested = self.placed(|unwinder| unwinder.scan(pid, &maps))?;
            self.requested |= requested;
            captured.push((pid, maps));
        }
        Ok(captured)
    }

    /// Forgets the processes that have exited (those `alive` says are not), in the agent and
    /// in the BPF maps ([`Unwinder::forget_exited`]).
    pub(super) fn forget(&mut self, alive: impl Fn(u32) -> bool) {
        let gone: Vec<u32> = self
            .procs
            .keys()
            .copied()
            .filter(|&pid| !alive(pid))
            .collect();
        if gone.is_empty() {
            // No room made; forget the ones that exited, whose pids may come back as others.
            self.without_room.retain(|&pid| alive(pid));
        } else {
            // Room is made: the processes that found none are read at their next sample.
            self.without_room.clear();
        }
        for pid in gone {
            self.procs.remove(&pid);
            if pid != PROCS_NO_MAPPINGS {
                let _ = self.maps.remove_process(pid);
            }
            // Out of the runtimes' maps too, and the symbolizer told, when it ran one.
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
}

/// Whether `maps` were read while the dynamic loader was starting the process: code from two
/// files only, the program's and the loader's the kernel mapped, and no library yet. A static
/// program maps code from one file; a dynamic one, once loaded, from its libraries too. (A
/// musl program, whose loader is its libc, looks loading: its maps are read a few more times.)
pub(super) fn still_loading(maps: &ProcessMaps) -> bool {
    let files: HashSet<(u64, u64)> = maps
        .entries()
        .iter()
        .filter(|entry| entry.executable && entry.is_file())
        .map(|entry| (entry.dev, entry.inode))
        .collect();
    files.len() == 2
}

#[cfg(test)]
mod tests {
    use std::path::Path;

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
