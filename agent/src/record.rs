//! `scorch record`: sample for a while, then write one profile.
//!
//! sampler -> (every window) drain -> aggregate, capturing process maps while processes live
//! -> (at the end) symbolize -> encode -> file.

use std::{
    collections::{HashMap, HashSet},
    io::{self, Write},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use tokio::signal::unix::{signal, SignalKind};

use crate::{
    aggregate::Aggregated,
    cli::RecordArgs,
    drain::{DrainError, Drainer, Losses, RawWindow},
    encode::{self, Format},
    privileges::{missing_privileges_message, Capabilities},
    sampler::{Sampler, SamplerConfig, SamplerError},
    symbolize::{self, kernel::KernelSymbolizer, user::UserSymbolizer},
};

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{0}")]
    Privileges(String),
    #[error("cannot write the output {path}: {reason}")]
    Output { path: PathBuf, reason: String },
    #[error(transparent)]
    Sampler(#[from] SamplerError),
    #[error("draining the sampler's maps: {0}")]
    Drain(#[from] DrainError),
    #[error("symbolizing kernel frames: {0}")]
    Kallsyms(#[from] symbolize::kernel::KallsymsError),
    #[error(transparent)]
    Svg(#[from] encode::svg::SvgError),
    #[error("waiting for signals: {0}")]
    Signals(io::Error),
}

/// What a recording produced, for the one-line summary.
#[derive(Debug, Clone)]
pub struct RecordSummary {
    pub samples: u64,
    pub processes: usize,
    pub windows: Vec<u64>,
    pub losses: Losses,
    pub output: PathBuf,
    pub format: Format,
    pub duration: Duration,
    /// Mean BPF run time per sample, when kernel.bpf_stats_enabled was on.
    pub bpf_ns_per_run: Option<f64>,
    /// User frames left unnamed, by reason, and names found by a fallback, by reason.
    pub unnamed_frames: Vec<(&'static str, u64)>,
}

impl std::fmt::Display for RecordSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "scorch: {} samples from {} processes in {:.2}s ({} windows); lost: {}; wrote {} ({})",
            self.samples,
            self.processes,
            self.duration.as_secs_f64(),
            self.windows.len(),
            self.losses.describe(),
            self.output.display(),
            match self.format {
                Format::Pprof => "pprof",
                Format::Folded => "folded",
                Format::Svg => "svg",
                Format::Top => "top",
            }
        )?;
        if !self.unnamed_frames.is_empty() {
            let parts: Vec<String> = self
                .unnamed_frames
                .iter()
                .map(|(reason, n)| format!("{reason}: {n}"))
                .collect();
            write!(f, "; unnamed user frames: {}", parts.join(", "))?;
        }
        if let Some(ns) = self.bpf_ns_per_run {
            write!(f, "; BPF {ns:.0} ns/sample")?;
        }
        Ok(())
    }
}

/// Checks everything that can be checked before loading BPF.
pub fn preflight(args: &RecordArgs) -> Result<(), RecordError> {
    check_output_writable(&args.output)?;
    let caps = Capabilities::effective();
    if !caps.can_profile() {
        return Err(RecordError::Privileges(missing_privileges_message(caps)));
    }
    Ok(())
}

/// Runs a recording to completion (duration elapsed or SIGINT/SIGTERM).
pub async fn record(args: &RecordArgs) -> Result<RecordSummary, RecordError> {
    preflight(args)?;
    let config = SamplerConfig {
        frequency_hz: args.frequency,
        pids: args.pid.clone(),
        include_idle: args.include_idle,
        window_secs: args.window.as_secs().max(1),
        deny_list: false,
    };
    let mut sigint = signal(SignalKind::interrupt()).map_err(RecordError::Signals)?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(RecordError::Signals)?;

    let (mut sampler, maps, control) = Sampler::start(&config)?;
    tracing::info!(
        cpus = sampler.cpus().len(),
        frequency_hz = args.frequency,
        "sampling for {:?}",
        args.duration
    );
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + args.duration;
    let mut drainer = Drainer::new(maps, control);
    let mut session = Session::new(UserSymbolizer::new(
        args.symbolize,
        (args.symbol_cache_mb as usize) << 20,
    ));
    let mut ticker =
        tokio::time::interval_at(tokio::time::Instant::now() + args.window, args.window);
    let mut discover = tokio::time::interval(DISCOVERY_INTERVAL);
    discover.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            // Checked in order: at the deadline the final drain below takes the last window,
            // rather than a tick draining it and leaving an empty one behind.
            biased;
            _ = tokio::time::sleep_until(deadline) => break,
            _ = sigint.recv() => { tracing::info!("interrupted: writing what was sampled"); break }
            _ = sigterm.recv() => { tracing::info!("terminated: writing what was sampled"); break }
            _ = ticker.tick() => {
                session.add(drainer.drain_window()?);
                sampler.flush_logs();
            }
            _ = discover.tick() => {
                session.discover(drainer.active_pids()?);
            }
        }
    }
    session.add(drainer.drain_window()?);
    sampler.flush_logs();
    let bpf_ns_per_run = sampler
        .run_stats()
        .filter(|(_, runs)| *runs > 0)
        .map(|(time, runs)| time.as_nanos() as f64 / runs as f64);
    drop(sampler);
    let duration = started.elapsed();

    let profile = symbolize::symbolize(
        &session.aggregated,
        &mut KernelSymbolizer::default(),
        &mut session.user,
        1_000_000_000 / args.frequency,
        |pid| session.proc_comms.get(&pid).cloned(),
    )?;
    for hint in symbolize::frame_pointer_hints(&session.aggregated, &session.user) {
        tracing::warn!("{hint}");
    }
    let unnamed_frames = session
        .user
        .misses
        .iter()
        .map(|(miss, n)| (miss.name(), *n))
        .chain(session.user.fallbacks.iter().map(|(f, n)| (f.name(), *n)))
        .collect();
    let format = args.output_format();
    let bytes = match format {
        Format::Pprof => encode::pprof::encode(&profile),
        Format::Folded => encode::folded::encode(&profile).into_bytes(),
        Format::Svg => {
            let title = format!(
                "scorch on {}: {:.0}s, {} samples",
                hostname(),
                duration.as_secs_f64(),
                profile.total_samples()
            );
            encode::svg::encode(&profile, &title)?
        }
        Format::Top => encode::top::encode(&profile).into_bytes(),
    };
    write_atomically(&args.output, &bytes)?;
    let aggregated = &session.aggregated;
    Ok(RecordSummary {
        samples: aggregated.total_samples(),
        processes: aggregated.processes(),
        windows: aggregated.windows.iter().map(|w| w.samples).collect(),
        losses: aggregated.losses,
        output: args.output.clone(),
        format,
        duration,
        bpf_ns_per_run,
        unnamed_frames,
    })
}

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
        self.aggregated.add(window);
    }
}

pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown host".to_owned())
}

/// Fails early, before any BPF is loaded, when the output cannot be written.
pub fn check_output_writable(path: &Path) -> Result<(), RecordError> {
    let err = |reason: String| RecordError::Output {
        path: path.to_owned(),
        reason,
    };
    if path.is_dir() {
        return Err(err("it is a directory; name a file".into()));
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        return Err(err(format!(
            "directory {} does not exist",
            parent.display()
        )));
    }
    // Creating a probe file proves the directory is writable for real (read-only mounts,
    // ACLs and permissions all show up), which access(2) would not for root.
    let probe = parent.join(format!(".scorch-probe-{}", std::process::id()));
    match std::fs::File::create(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
        }
        Err(e) => {
            return Err(err(format!(
                "directory {} is not writable: {e}",
                parent.display()
            )))
        }
    }
    if path.exists() {
        std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|e| err(format!("{e}")))?;
    }
    Ok(())
}

/// Writes through a temporary file and a rename, so a reader never sees half a profile and an
/// interrupted write leaves any earlier file intact.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), RecordError> {
    let err = |e: io::Error| RecordError::Output {
        path: path.to_owned(),
        reason: e.to_string(),
    };
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temporary = path.with_file_name(format!(".{file_name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result.map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_checks() {
        let dir = std::env::temp_dir().join(format!("scorch-out-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(check_output_writable(&dir.join("x.pb.gz")).is_ok());
        let e = check_output_writable(&dir).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
        let e = check_output_writable(&dir.join("missing/x.svg"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not exist"), "{e}");
        write_atomically(&dir.join("y.txt"), b"abc").unwrap();
        assert_eq!(std::fs::read(dir.join("y.txt")).unwrap(), b"abc");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
