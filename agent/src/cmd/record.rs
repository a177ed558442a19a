//! `scorch record`: sample for a while, then write one profile.
//!
//! sampler -> (every window) drain -> aggregate, capturing process maps while processes live
//! -> (at the end) symbolize -> encode -> file.

use std::{
    io,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use scorch_common::OffCpuCount;

use crate::{
    cmd::sampling::{self, shutdown_signals, Consumer, Drained, Sampling, StartError},
    pipeline::aggregate::{ThreadsFolded, MAX_THREADS_PER_PROCESS, OTHER_THREADS},
    pipeline::drain::{DrainError, Losses},
    pipeline::off_cpu::{OffCpuCounts, OffCpuError, OffCpuReader, OffCpuSettings},
    pipeline::sampler::{SamplerConfig, UnwindCapacity, UnwindMode},
    profile::{
        encode::{self, svg::Orientation, EncodeOptions, Format},
        SampleType,
    },
    runtimes::{hotspot::JvmMode, python::PythonMode, v8::NodeMode, Registry, RuntimeConfig},
    symbolize::{
        self,
        elf::SectionCache,
        kernel::KernelSymbolizer,
        user::{SymbolizeMode, UserSymbolizer},
    },
    sys::fs,
    sys::privileges::{missing_privileges_message, Capabilities},
};

/// What to record and where to write it, resolved from the command line.
#[derive(Debug, Clone)]
pub struct RecordConfig {
    /// How long to sample; a signal ends the recording earlier.
    pub duration: Duration,
    /// Samples per second on each CPU.
    pub frequency: u64,
    /// Only these processes, when not empty (filtered in the kernel).
    pub pids: Vec<u32>,
    /// Keep samples of idle CPUs.
    pub include_idle: bool,
    /// Where the profile goes.
    pub output: PathBuf,
    /// In which format.
    pub format: Format,
    /// Which way a flame graph grows ([`Format::Svg`]).
    pub orientation: Orientation,
    /// How often the kernel maps are drained.
    pub window: Duration,
    /// Name user frames here, or leave that to a server.
    pub symbolize: SymbolizeMode,
    /// Memory budget for parsed binaries and debug info.
    pub symbol_cache_bytes: usize,
    /// How user stacks are walked.
    pub unwind: UnwindMode,
    /// Processes the unwinder holds at once, when not sized from those running.
    pub unwind_processes: Option<u32>,
    /// Ceiling on the unwind tables' row pools, in MiB.
    pub unwind_pool_mib: u32,
    /// Ceiling on each stack-trace map's entries (`--stack-map-entries`).
    pub stack_map_entries: u32,
    /// Whether interpreters' Python frames are walked.
    pub python: PythonMode,
    /// Whether JVMs' Java frames are walked.
    pub jvm: JvmMode,
    pub node: NodeMode,
    /// Record off-CPU time, sampled so, instead of CPU samples.
    pub off_cpu: Option<OffCpuSettings>,
    /// Label samples with their thread's id too (`--thread-ids`).
    pub thread_ids: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{0}")]
    Privileges(String),
    #[error("cannot write the output {path}: {reason}")]
    Output { path: PathBuf, reason: String },
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("draining the sampler's maps: {0}")]
    Drain(#[from] DrainError),
    #[error("symbolizing kernel frames: {0}")]
    Kallsyms(#[from] symbolize::kernel::KallsymsError),
    #[error(transparent)]
    Svg(#[from] encode::svg::SvgError),
    #[error("waiting for signals: {0}")]
    Signals(io::Error),
    #[error("reading off-CPU counters: {0}")]
    OffCpu(#[from] OffCpuError),
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
    /// Unwind tables loaded for the BPF unwinder (`--unwind auto`): how many (one per build
    /// id), and the bytes of map memory they took.
    pub unwind_tables: Option<(usize, u64)>,
    /// Captures of exited processes dropped before their samples were named, by reason.
    pub captures_dropped: Vec<(&'static str, u64)>,
    /// Samples whose frame-pointer walk ended in glibc's start code and got the frames a
    /// table walk found below it.
    pub start_completed: u64,
    /// Runtime frame locations shown unknown (Python's `[python: unknown code object]`: its
    /// code object could not be read, its process gone before it was, or not a code object),
    /// by runtime.
    pub runtime_unnamed: Vec<(&'static str, u64)>,
    /// The fullest any window left the stack maps: `stacks N of M entries, ...`.
    pub stack_maps: Option<String>,
    /// With `--off-cpu`: what became of the blocks seen, and the off-CPU program's mean run
    /// time when kernel.bpf_stats_enabled was on.
    pub off_cpu: Option<(OffCpuCounts, Option<f64>)>,
    /// Threads beyond the cap per process, folded into one `thread` value.
    pub threads_folded: ThreadsFolded,
}

impl std::fmt::Display for RecordSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Off-CPU values are nanoseconds, not samples: the blocks, and the time they add up to.
        let counted = match &self.off_cpu {
            Some((counts, _)) => format!(
                "{} off-CPU blocks ({:.3}s blocked, estimated)",
                counts.get(OffCpuCount::Recorded),
                self.samples as f64 / 1e9
            ),
            None => format!("{} samples", self.samples),
        };
        write!(
            f,
            "scorch: {counted} from {} processes in {:.2}s ({} windows); lost: {}; wrote {} ({})",
            self.processes,
            self.duration.as_secs_f64(),
            self.windows.len(),
            self.losses.describe(),
            self.output.display(),
            self.format.name()
        )?;
        if !self.unnamed_frames.is_empty() {
            let parts: Vec<String> = self
                .unnamed_frames
                .iter()
                .map(|(reason, n)| format!("{reason}: {n}"))
                .collect();
            write!(f, "; unnamed user frames: {}", parts.join(", "))?;
        }
        if !self.captures_dropped.is_empty() {
            let parts: Vec<String> = self
                .captures_dropped
                .iter()
                .map(|(reason, n)| format!("{reason}: {n}"))
                .collect();
            write!(f, "; process captures dropped early: {}", parts.join(", "))?;
        }
        for (runtime, unnamed) in &self.runtime_unnamed {
            if *unnamed > 0 {
                write!(f, "; {runtime} frame locations left unknown: {unnamed}")?;
            }
        }
        if self.start_completed > 0 {
            write!(
                f,
                "; start frames completed from table walks: {}",
                self.start_completed
            )?;
        }
        if let Some((tables, bytes)) = self.unwind_tables {
            write!(f, "; unwind tables: {tables}, {} KiB", bytes.div_ceil(1024))?;
        }
        if self.threads_folded.threads > 0 {
            write!(
                f,
                "; threads folded into \"{OTHER_THREADS}\" past {MAX_THREADS_PER_PROCESS} a \
                 process: {} in {} processes",
                self.threads_folded.threads, self.threads_folded.processes
            )?;
        }
        if let Some(fill) = &self.stack_maps {
            write!(f, "; stack maps at their fullest: {fill}")?;
        }
        if let Some(ns) = self.bpf_ns_per_run {
            write!(f, "; BPF {ns:.0} ns/sample")?;
        }
        if let Some((counts, ns)) = &self.off_cpu {
            write!(f, "; off-CPU: {}", counts.describe())?;
            if let Some(ns) = ns {
                write!(f, "; off-CPU BPF {ns:.0} ns/switch")?;
            }
        }
        Ok(())
    }
}

/// Checks everything that can be checked before loading BPF.
pub fn preflight(args: &RecordConfig) -> Result<(), RecordError> {
    check_output_writable(&args.output)?;
    let caps = Capabilities::effective();
    if !caps.can_profile() {
        return Err(RecordError::Privileges(missing_privileges_message(caps)));
    }
    Ok(())
}

/// Runs a recording to completion (duration elapsed or SIGINT/SIGTERM).
pub async fn record(args: &RecordConfig) -> Result<RecordSummary, RecordError> {
    preflight(args)?;
    let config = SamplerConfig {
        frequency_hz: args.frequency,
        pids: args.pids.clone(),
        include_idle: args.include_idle,
        window_secs: args.window.as_secs().max(1),
        deny_list: false,
        unwind: args.unwind,
        unwind_capacity: UnwindCapacity::capture(&args.pids, crate::sys::running_processes())
            .with_processes(args.unwind_processes)
            .with_pool_mib(args.unwind_pool_mib),
        stack_entries_ceiling: args.stack_map_entries,
        off_cpu: args.off_cpu,
        thread_ids: args.thread_ids,
        // Its profiles carry `comm` and `pid` only.
        exec_files: false,
        // Set from the runtimes' registry by `Sampling::start`.
        runtime_maps: Vec::new(),
        runtime_counters: Vec::new(),
    };
    let shutdown = shutdown_signals().map_err(RecordError::Signals)?;
    let mut symbolizer = UserSymbolizer::new(args.symbolize, args.symbol_cache_bytes);
    // Each run would inflate the same libraries' compressed DWARF again (libc6-dbg's: 8 MB).
    match SectionCache::system() {
        Ok(cache) => symbolizer.set_section_cache(cache),
        Err(error) => tracing::debug!("no cache of inflated debug sections: {error}"),
    }
    let registry = Registry::new(RuntimeConfig {
        python: args.python,
        jvm: args.jvm,
        node: args.node,
    });
    let mut sampling = Sampling::start(&config, registry, symbolizer)?;
    tracing::info!(
        cpus = sampling.sampler.cpus().len(),
        frequency_hz = args.frequency,
        "sampling for {:?}",
        args.duration
    );
    // `--pid`: their tables are built now, not after their first samples ask for them, and
    // the recording starts once they are loaded.
    sampling.watch(&args.pids, WATCHED_TABLES_WAIT)?;
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + args.duration;
    sampling::drive(
        &mut sampling,
        &mut KeepAll,
        args.window,
        Some(deadline),
        async {
            let why = shutdown.await;
            tracing::info!("{why}: writing what was sampled");
        },
    )
    .await?;
    sampling.drain()?;
    let off_cpu_counts = sampling.off_cpu().map(OffCpuReader::counts).transpose()?;
    let sampler = &mut sampling.sampler;
    let off_cpu_ns_per_run = sampler
        .off_cpu_run_stats()
        .filter(|(_, runs)| *runs > 0)
        .map(|(time, runs)| time.as_nanos() as f64 / runs as f64);
    sampler.flush_logs();
    let bpf_ns_per_run = sampler
        .run_stats()
        .filter(|(_, runs)| *runs > 0)
        .map(|(time, runs)| time.as_nanos() as f64 / runs as f64);
    let unwind_tables = sampling.unwinder.as_ref().map(|unwinder| {
        let stats = unwinder.stats();
        tracing::info!("unwind tables: {stats}");
        (stats.tables_loaded, stats.table_bytes)
    });
    let mut session = sampling.stop();
    let duration = started.elapsed();

    // With --off-cpu the profile is the blocks' (the CPU samples only fed the unwinder). The
    // recording is one profile: its threads are capped once, over all of it.
    let (threads_folded, aggregated, period_ns) = match args.off_cpu {
        Some(_) => (
            session.blocks.fold_threads(MAX_THREADS_PER_PROCESS),
            &session.blocks,
            1,
        ),
        None => (
            session.aggregated.fold_threads(MAX_THREADS_PER_PROCESS),
            &session.aggregated,
            1_000_000_000 / args.frequency,
        ),
    };
    let mut profile = symbolize::symbolize(
        aggregated,
        &mut KernelSymbolizer::one_profile(),
        &mut session.user,
        period_ns,
        |pid| session.proc_comms.get(&pid).cloned(),
    )?;
    if let Some(settings) = args.off_cpu {
        let control = settings.control(1, 0);
        profile.sample_type = SampleType::OffCpu {
            mean_ns: control.mean_ns,
            min_ns: control.min_ns,
        };
    }
    for hint in symbolize::hints::stack_hints(aggregated, &session.user) {
        tracing::warn!("{hint}");
    }
    let unnamed_frames = session
        .user
        .misses
        .iter()
        .map(|(miss, n)| (miss.as_str(), *n))
        .chain(session.user.fallbacks.iter().map(|(f, n)| (f.as_str(), *n)))
        .collect();
    let captures_dropped = session
        .user
        .capture_stats()
        .dropped
        .iter()
        .map(|(reason, n)| (reason.as_str(), *n))
        .collect();
    let format = args.format;
    let title = match args.off_cpu {
        Some(_) => format!(
            "scorch off-CPU on {}: {:.0}s, {:.3}s blocked (estimated)",
            fs::hostname(),
            duration.as_secs_f64(),
            profile.total_samples() as f64 / 1e9
        ),
        None => format!(
            "scorch on {}: {:.0}s, {} samples",
            fs::hostname(),
            duration.as_secs_f64(),
            profile.total_samples()
        ),
    };
    let options = EncodeOptions {
        title: &title,
        top_limit: None,
        max_stacks: None,
        orientation: args.orientation,
    };
    let bytes = encode::encode(format, &profile, options)?;
    write_output(&args.output, &bytes)?;
    Ok(RecordSummary {
        samples: aggregated.total_samples(),
        processes: aggregated.processes(),
        windows: session
            .aggregated
            .windows
            .iter()
            .map(|w| w.samples)
            .collect(),
        losses: aggregated.losses.clone(),
        output: args.output.clone(),
        format,
        duration,
        bpf_ns_per_run,
        unnamed_frames,
        unwind_tables,
        captures_dropped,
        start_completed: session.user.entry_completions(),
        runtime_unnamed: session
            .user
            .runtime_counts()
            .into_iter()
            .map(|(runtime, (_, unknown))| (runtime, unknown))
            .collect(),
        stack_maps: aggregated.stack_maps.describe(),
        off_cpu: off_cpu_counts.map(|counts| (counts, off_cpu_ns_per_run)),
        threads_folded,
    })
}

/// `record`'s consumer: every window stays in the session, for one profile at the end.
struct KeepAll;

impl Consumer for KeepAll {
    type Error = DrainError;

    fn window(&mut self, _: &mut Sampling, _: Drained) -> Result<(), DrainError> {
        Ok(())
    }
}

/// Longest `record --pid` waits for the watched processes' tables before it starts: long
/// enough for an interpreter's (a tenth of a second when warm), short enough that a recording
/// asked to start now does not miss what the process does in its first seconds.
const WATCHED_TABLES_WAIT: Duration = Duration::from_secs(1);

/// Fails early, before any BPF is loaded, when the output cannot be written.
pub fn check_output_writable(path: &Path) -> Result<(), RecordError> {
    fs::check_output_writable(path).map_err(|reason| RecordError::Output {
        path: path.to_owned(),
        reason,
    })
}

fn write_output(path: &Path, bytes: &[u8]) -> Result<(), RecordError> {
    fs::write_atomically(path, bytes).map_err(|e| RecordError::Output {
        path: path.to_owned(),
        reason: e.to_string(),
    })
}
