//! What sampling gathers and symbolising needs, shared by `record` (all windows, one profile at
//! the end) and `run` (one profile per window).

use std::{
    collections::{HashMap, HashSet},
    path::Path,
    time::Duration,
};

use crate::{
    pipeline::{aggregate::Aggregated, drain::RawWindow},
    symbolize::user::UserSymbolizer,
};

/// How often the current window's new processes are looked for, to read their maps while they
/// still run.
pub(crate) const DISCOVERY_INTERVAL: Duration = Duration::from_millis(200);

/// State gathered while sampling, shared by `record` (all windows, one profile at the end) and
/// `run` (one profile per window).
pub(crate) struct Session {
    pub(crate) aggregated: Aggregated,
    pub(crate) user: UserSymbolizer,
    /// Process names read from /proc while the processes were alive: the process's own name,
    /// where the BPF program could only see the sampled thread's.
    pub(crate) proc_comms: HashMap<u32, String>,
    /// Processes whose maps were read in the current window.
    seen_this_window: HashSet<u32>,
    /// Windows drained so far, for the log.
    windows: u64,
}

impl Session {
    pub(crate) fn new(user: UserSymbolizer) -> Self {
        Session {
            aggregated: Aggregated::default(),
            user,
            proc_comms: HashMap::new(),
            seen_this_window: HashSet::new(),
            windows: 0,
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
            if let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) {
                self.proc_comms.insert(pid, comm.trim_end().to_owned());
            }
        }
    }

    pub(crate) fn add(&mut self, window: RawWindow) {
        let mut pids: Vec<u32> = window.samples.iter().map(|s| s.tgid).collect();
        pids.sort_unstable();
        pids.dedup();
        // Read maps again at the end of the window: libraries loaded since discovery count.
        // A process that exited keeps what discovery captured.
        self.capture(&pids);
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
