//! What sampling gathers and symbolising needs, shared by `record` (all windows, one profile at
//! the end) and `run` (one profile per window).

use std::{
    collections::{HashMap, HashSet},
    os::fd::OwnedFd,
    path::Path,
    time::Duration,
};

use tokio::io::unix::AsyncFd;

use crate::{
    pipeline::{aggregate::Aggregated, drain::RawWindow},
    process::maps::ProcessMaps,
    symbolize::user::UserSymbolizer,
    unwind::loader::Unwinder,
};

/// How often the current window's new processes are looked for, to read their maps while they
/// still run.
pub(crate) const DISCOVERY_INTERVAL: Duration = Duration::from_millis(200);

/// State gathered while sampling, shared by `record` (all windows, one profile at the end) and
/// `run` (one profile per window).
pub(crate) struct Session {
    pub(crate) aggregated: Aggregated,
    /// Off-CPU blocks (`record --off-cpu`, `run` with `off-cpu = true`), merged as they are
    /// read; `run` takes them every window.
    pub(crate) blocks: Aggregated,
    pub(crate) user: UserSymbolizer,
    /// Process names read from /proc while the processes were alive: the process's own name,
    /// where the BPF program could only see the sampled thread's.
    pub(crate) proc_comms: HashMap<u32, String>,
    /// Processes whose maps were read in the current window.
    seen_this_window: HashSet<u32>,
    /// Windows drained so far, for the log.
    windows: u64,
    /// Whether blocks keep their thread ids (`thread-ids`; CPU samples get theirs, or not,
    /// from the BPF side).
    thread_ids: bool,
}

impl Session {
    pub(crate) fn new(user: UserSymbolizer, thread_ids: bool) -> Self {
        Session {
            aggregated: Aggregated::default(),
            blocks: Aggregated::default(),
            user,
            proc_comms: HashMap::new(),
            seen_this_window: HashSet::new(),
            windows: 0,
            thread_ids,
        }
    }

    /// Drops what is kept about processes that have exited: a daemon would otherwise remember
    /// every process it ever saw.
    pub(crate) fn forget_exited(&mut self) {
        self.user.forget_exited();
        self.proc_comms
            .retain(|pid, _| Path::new(&format!("/proc/{pid}")).exists());
    }

    /// Reads the maps and name of processes first seen in this window; returns them.
    pub(crate) fn discover(&mut self, pids: Vec<u32>) -> Vec<u32> {
        let new: Vec<u32> = pids
            .into_iter()
            .filter(|pid| self.seen_this_window.insert(*pid))
            .collect();
        self.capture(&new);
        new
    }

    fn capture(&mut self, pids: &[u32]) {
        self.user.capture(pids.iter().copied());
        for &pid in pids {
            self.read_comm(pid);
        }
    }

    /// Keeps the maps the unwinder read when a process was first sampled (or asked again): for a
    /// process that lives a few milliseconds, the only capture there is.
    /// Returns their pids.
    pub(crate) fn keep_captures(&mut self, captured: Vec<(u32, ProcessMaps)>) -> Vec<u32> {
        let mut pids = Vec::with_capacity(captured.len());
        for (pid, maps) in captured {
            self.user.keep_capture(pid, maps);
            self.read_comm(pid);
            self.seen_this_window.insert(pid);
            pids.push(pid);
        }
        pids
    }

    /// Hands the symbolizer the processes whose runtime frames the unwinder walks, or no
    /// longer does, and has it read what the new stacks' runtime frames point at now.
    pub(crate) fn take_runtimes(&mut self, unwinder: &mut Unwinder) {
        let names = self.user.runtimes();
        for (pid, runtime, process) in unwinder.take_attachments() {
            names.attach(pid, runtime, process);
        }
        // After the processes: a new one's first stacks come with it.
        for (pid, word, more) in unwinder.take_runtime_words() {
            names.capture(pid, word, more);
        }
    }

    fn read_comm(&mut self, pid: u32) {
        if let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) {
            self.proc_comms.insert(pid, comm.trim_end().to_owned());
        }
    }

    pub(crate) fn add(&mut self, window: RawWindow) {
        let mut pids: Vec<u32> = window.samples.iter().map(|s| s.tgid).collect();
        pids.sort_unstable();
        pids.dedup();
        // Read maps again at the end of the window: libraries loaded since discovery count.
        // A process that exited keeps what discovery captured, until its samples are named;
        // one that exited unsampled is forgotten now.
        self.capture(&pids);
        self.user.mark_sampled(&pids);
        self.user.note_exits();
        self.seen_this_window.clear();
        self.windows += 1;
        tracing::info!(
            "window {}: {} samples from {} processes; lost: {}",
            self.windows,
            window.total_samples(),
            pids.len(),
            window.losses.describe()
        );
        // After the capture above: a library unloaded in this window still names the earlier
        // windows' samples, and these take the maps read now, as the daemon's windows do.
        let user = &self.user;
        self.aggregated.add(window, |tgid| user.maps_version(tgid));
    }
}

impl Session {
    /// Adds off-CPU blocks read between `start` and `end`; their processes' maps are read now
    /// if this window has not read them yet (a thread that only sleeps is never sampled on
    /// the CPU).
    pub(crate) fn add_blocks(
        &mut self,
        start: std::time::SystemTime,
        end: std::time::SystemTime,
        blocks: Vec<crate::pipeline::off_cpu::Block>,
    ) {
        let mut pids: Vec<u32> = blocks.iter().map(|b| b.tgid).collect();
        pids.sort_unstable();
        pids.dedup();
        let new: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|pid| self.seen_this_window.insert(*pid))
            .collect();
        self.capture(&new);
        self.user.mark_sampled(&pids);
        let user = &self.user;
        self.blocks
            .add_blocks(start, end, blocks, self.thread_ids, |tgid| {
                user.maps_version(tgid)
            });
    }
}

/// A BPF ring buffer as something to await: the unwinder's events, readable as soon as a
/// process is first sampled, so its maps are read while it runs rather than at the next
/// discovery tick, which a 20 ms process does not live to see; the walked stacks' ring,
/// readable when the program finds it filling.
pub(crate) struct ReadyFd(Option<AsyncFd<OwnedFd>>);

impl ReadyFd {
    /// Waits on `fd` (`None`: never ready); `what` names it in the warning when it cannot be
    /// waited on, and the 200 ms discovery reads it instead.
    pub(crate) fn new(fd: Option<std::io::Result<OwnedFd>>, what: &str) -> Self {
        let fd = fd.and_then(|fd| {
            fd.and_then(|fd| {
                // SAFETY: an `OwnedFd` is open and returns the same descriptor from
                // `as_raw_fd` until the `AsyncFd` that owns it drops it.
                unsafe { AsyncFd::register(fd) }.map_err(std::io::Error::from)
            })
            .map_err(|err| tracing::warn!("waiting on {what}: {err}"))
            .ok()
        });
        ReadyFd(fd)
    }

    /// Waits until a record is there to read (forever without a ring). The caller then reads
    /// every record queued, so the readiness is cleared here.
    pub(crate) async fn ready(&self) {
        match &self.0 {
            Some(fd) => match fd.readable().await {
                Ok(mut guard) => guard.clear_ready(),
                Err(_) => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    }
}
