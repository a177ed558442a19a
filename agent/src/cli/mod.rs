//! Command-line interface: argument definitions and the parsers that reject bad input before
//! anything touches the kernel.

use std::{
    path::PathBuf,
    time::{Duration, SystemTime},
};

use clap::{Args, Parser, Subcommand};

use crate::{
    cmd::{
        query::{QueryConfig, QueryError, DEFAULT_SPAN},
        record::RecordConfig,
    },
    parse::{duration, selector::Selector, timespec::parse_range},
    pipeline::{off_cpu::OffCpuSettings, sampler::UnwindMode},
    profile::{
        encode::{svg::Orientation, Format},
        SampleKind,
    },
    runtimes::{hotspot::JvmMode, python::PythonMode, v8::NodeMode},
    symbolize::user::SymbolizeMode,
};

pub mod config;
pub mod docs;

/// Highest sampling frequency accepted. Beyond this the profiler's own cost stops being
/// negligible and `perf` users expect `perf`.
pub const MAX_FREQUENCY_HZ: u64 = 1000;

#[derive(Debug, Parser)]
#[command(
    name = "scorch",
    version,
    about = "System-wide CPU profiler for Linux, on eBPF"
)]
pub struct Cli {
    /// Log filter (e.g. `info`, `debug`, `scorch=debug`); `RUST_LOG` overrides it.
    #[arg(long, global = true, default_value = "info")]
    pub log_level: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Sample every CPU for a while and write one profile (like `perf record -a -g`).
    Record(RecordArgs),
    /// Profile continuously: store a profile every window, serve the UI, API and metrics.
    Run(Box<crate::cli::config::RunArgs>),
    /// Merge stored windows into one profile (pprof, folded, SVG, or a top table).
    Query(QueryArgs),
    /// Check that this machine and this user can profile; one line per requirement.
    Check,
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages into DIR (used by `cargo xtask package`).
    #[command(hide = true)]
    Man { dir: PathBuf },
}

#[derive(Debug, Clone, Args)]
pub struct RecordArgs {
    /// How long to sample (e.g. `10s`, `1m`, `500ms`; a bare number is seconds). Ctrl-C or
    /// SIGTERM ends the recording early and still writes the output.
    #[arg(long, default_value = "10s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub duration: Duration,
    /// Samples per second on each CPU. A prime (the default, 19) never beats against periodic
    /// work.
    #[arg(
        long,
        short = 'F',
        default_value_t = 19,
        value_parser = parse_frequency,
        allow_hyphen_values = true
    )]
    pub frequency: u64,
    /// Only sample this process (repeatable). Enforced in the kernel before any stack is walked.
    #[arg(long, short = 'p', value_parser = parse_pid)]
    pub pid: Vec<u32>,
    /// Keep samples of idle CPUs (the swapper task, pid 0).
    #[arg(long)]
    pub include_idle: bool,
    /// Where to write the profile.
    #[arg(long, short = 'o', default_value = "scorch.pb.gz")]
    pub output: PathBuf,
    /// Output format; by default inferred from the output's extension: `.svg`, `.folded` or
    /// `.txt`, anything else pprof.
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Which way a flame graph (`svg`) grows: `icicle`, the root on top (deep stacks never
    /// push it off the first screen), or `classic`, the root at the bottom.
    #[arg(long, value_enum, default_value = "icicle")]
    pub orientation: Orientation,
    /// How often the kernel maps are drained while recording, so they never fill up.
    #[arg(long, default_value = "10s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub window: Duration,
    /// `local`: name user frames here (DWARF, inline frames, file:line); `none`: keep
    /// addresses, mappings and build ids for a server that symbolises later.
    #[arg(long, value_enum, default_value = "local")]
    pub symbolize: SymbolizeMode,
    /// Memory budget, in MiB, for parsed binaries and debug info; the least recently used are
    /// evicted beyond it.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub symbol_cache_mb: u64,
    /// `auto`: walk user stacks with the binaries' unwind tables (`.eh_frame`) where loaded,
    /// frame pointers elsewhere; `fp`: frame pointers only.
    #[arg(long, value_enum, default_value = "auto")]
    pub unwind: UnwindMode,
    /// Processes the unwinder describes to the BPF program at once (2.5 KiB of kernel memory
    /// each); the others walk by frame pointers [default: twice those running, at least 1024,
    /// at most 8192; with --pid, at least 16].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub unwind_processes: Option<u32>,
    /// Ceiling on the unwind tables' BPF row pools, in MiB: pools are added as the tables of
    /// the processes sampled need them, and past the ceiling the least recently used tables
    /// are evicted (counted; their code walks by frame pointers).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub unwind_pool_mib: u32,
    /// Ceiling on each of the two stack-trace maps, in entries (about 1 KiB of kernel memory
    /// each): a map grows from a quarter of a window's samples as the distinct stacks stored
    /// need, to this at most; past it stacks are lost as collisions, counted.
    #[arg(long, default_value_t = 65_536, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub stack_map_entries: u32,
    /// `auto`: name the Python functions of CPython 3.11 to 3.15 processes, walked in place of
    /// the interpreter's eval loop; `off`: show the interpreter's C frames only.
    #[arg(long, value_enum, default_value = "auto")]
    pub python: PythonMode,
    /// `auto`: name the Java frames of HotSpot JVMs (JDK 8 to 26), walked in BPF through
    /// their code cache; `off`: leave them unnamed addresses.
    #[arg(long, value_enum, default_value = "auto")]
    pub jvm: JvmMode,
    /// `auto`: name the JavaScript frames of Node.js processes (V8 10 to 13, Node 18 to 24),
    /// walked in BPF through V8's code; `off`: leave them unnamed addresses.
    #[arg(long, value_enum, default_value = "auto")]
    pub node: NodeMode,
    /// Record off-CPU time instead of CPU samples: where threads wait (sleep, I/O, locks,
    /// preemption) and for how long, from the scheduler's `sched_switch`. The profile's values
    /// are nanoseconds blocked, labelled `state` (sleeping, disk, preempted) and `thread`.
    #[arg(long)]
    pub off_cpu: bool,
    /// Label each sample with its thread's id (`thread_id`) besides its name (`thread`), and
    /// keep threads of one name apart: one series per thread, so off by default.
    #[arg(long)]
    pub thread_ids: bool,
    /// Off-CPU sampling: a block of d is recorded with probability 1 - exp(-d / this), and
    /// counts d divided by that probability (so totals are unbiased estimates): about one
    /// event per this much blocked time.
    #[arg(long, default_value = "10ms", value_parser = parse_duration, requires = "off_cpu")]
    pub off_cpu_mean: Duration,
    /// Off-CPU: blocks shorter than this are left out entirely (0: none).
    #[arg(long, default_value = "0s", value_parser = parse_block_time, requires = "off_cpu")]
    pub off_cpu_min: Duration,
    /// Off-CPU: most blocks the kernel side sends per second, and half the user stacks it may
    /// walk a second; the rest are counted in the summary with their blocked time, never
    /// silently dropped.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000), requires = "off_cpu")]
    pub off_cpu_max_events: u32,
}

impl RecordArgs {
    /// The format to write: the explicit `--format`, else what the file name implies.
    pub fn output_format(&self) -> Format {
        self.format
            .unwrap_or_else(|| Format::from_path(&self.output))
    }

    /// The recording these arguments ask for.
    pub fn resolve(&self) -> RecordConfig {
        RecordConfig {
            duration: self.duration,
            frequency: self.frequency,
            pids: self.pid.clone(),
            include_idle: self.include_idle,
            output: self.output.clone(),
            format: self.output_format(),
            orientation: self.orientation,
            window: self.window,
            symbolize: self.symbolize,
            symbol_cache_bytes: (self.symbol_cache_mb as usize) << 20,
            unwind: self.unwind,
            unwind_processes: self.unwind_processes,
            unwind_pool_mib: self.unwind_pool_mib,
            stack_map_entries: self.stack_map_entries,
            python: self.python,
            jvm: self.jvm,
            node: self.node,
            off_cpu: self.off_cpu.then_some(OffCpuSettings {
                mean: self.off_cpu_mean,
                min: self.off_cpu_min,
                max_events_per_second: self.off_cpu_max_events,
            }),
            thread_ids: self.thread_ids,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct QueryArgs {
    /// Directory of the profile store.
    #[arg(long, default_value = "/var/lib/scorch")]
    pub store: PathBuf,
    /// The last span of time, e.g. `15m`, `1h`, `2d` [default: 1h].
    #[arg(long, conflicts_with = "from")]
    pub since: Option<String>,
    /// Start: RFC 3339, Unix seconds, or `now-2h`.
    #[arg(long)]
    pub from: Option<String>,
    /// End: RFC 3339, Unix seconds, or `now-1h` [default: now].
    #[arg(long)]
    pub to: Option<String>,
    /// Series selector in Prometheus syntax, e.g. `{comm="nginx", pid!="1"}`.
    #[arg(long = "match", default_value = "{}")]
    pub selector: String,
    /// Where to write the result; without it, standard output.
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// Output format; by default from the output's extension, or `top` on standard output.
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Which way a flame graph (`svg`) grows: `icicle`, the root on top (deep stacks never
    /// push it off the first screen), or `classic`, the root at the bottom.
    #[arg(long, value_enum, default_value = "icicle")]
    pub orientation: Orientation,
    /// Compare with this baseline range (start), and write what changed from it to the range
    /// above: a differential flame graph (svg), `go tool pprof -diff_base`'s profile (pprof),
    /// each function's change in share (top), or `stack base target` lines (folded).
    #[arg(long, requires = "base_to")]
    pub base_from: Option<String>,
    /// End of the baseline range.
    #[arg(long, requires = "base_from")]
    pub base_to: Option<String>,
    /// `cpu` (CPU samples) or `off-cpu` (time threads spent blocked, in nanoseconds, from a
    /// daemon run with `off-cpu = true`).
    #[arg(long = "type", default_value = "cpu", value_parser = SampleKind::parse)]
    pub kind: SampleKind,
}

impl QueryArgs {
    /// The query these arguments ask for, its range read against `now`.
    pub fn resolve_at(&self, now: SystemTime) -> Result<QueryConfig, QueryError> {
        let selector = Selector::parse(&self.selector)?;
        let range = parse_range(
            self.from.as_deref(),
            self.to.as_deref(),
            self.since.as_deref(),
            now,
            DEFAULT_SPAN,
        )?;
        let format = match (&self.format, &self.output) {
            (Some(format), _) => *format,
            (None, Some(path)) => Format::from_path(path),
            (None, None) => Format::Top,
        };
        let base = match (&self.base_from, &self.base_to) {
            (Some(from), Some(to)) => {
                Some(parse_range(Some(from), Some(to), None, now, DEFAULT_SPAN)?)
            }
            _ => None,
        };
        Ok(QueryConfig {
            store: self.store.clone(),
            range,
            base,
            selector,
            selector_text: self.selector.clone(),
            output: self.output.clone(),
            format,
            orientation: self.orientation,
            kind: self.kind,
        })
    }

    /// [`QueryArgs::resolve_at`] now.
    pub fn resolve(&self) -> Result<QueryConfig, QueryError> {
        self.resolve_at(SystemTime::now())
    }
}

/// A block length: a duration, zero allowed.
pub fn parse_block_time(text: &str) -> Result<Duration, String> {
    duration::parse_duration(text)
}

/// A window or a recording's length: the one duration grammar
/// ([`parse::duration`](crate::parse::duration)), longer than zero and at most a year. Zero is
/// refused: a profile of nothing is always a mistake.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = duration::parse_duration(text)?;
    if duration.is_zero() {
        return Err(format!(
            "duration must be greater than zero, got `{}`",
            text.trim()
        ));
    }
    if duration > Duration::from_secs(365 * 24 * 3600) {
        return Err(format!("duration `{}` is longer than a year", text.trim()));
    }
    Ok(duration)
}

/// Parses a sampling frequency in Hz, 1 to [`MAX_FREQUENCY_HZ`].
pub fn parse_frequency(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let text = text
        .strip_suffix("Hz")
        .or_else(|| text.strip_suffix("hz"))
        .unwrap_or(text);
    if text.starts_with('-') {
        return Err(format!(
            "frequency must be between 1 and {MAX_FREQUENCY_HZ} Hz, got `{text}`"
        ));
    }
    let hz: u64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a whole number of Hz (e.g. 19, 99)"))?;
    if hz == 0 || hz > MAX_FREQUENCY_HZ {
        return Err(format!(
            "frequency must be between 1 and {MAX_FREQUENCY_HZ} Hz, got {hz}"
        ));
    }
    Ok(hz)
}

/// Parses a PID and checks that the process exists now.
pub fn parse_pid(text: &str) -> Result<u32, String> {
    let pid: u32 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a process id"))?;
    if pid == 0 {
        return Err("PID 0 is the idle task; use --include-idle instead".into());
    }
    if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        return Err(format!("no process with PID {pid} (is it still running?)"));
    }
    Ok(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        for bad in ["0", "0s", "-5s", "abc", "", "10x", "s"] {
            assert!(parse_duration(bad).is_err(), "{bad} accepted");
        }
        assert!(parse_duration("-5s").unwrap_err().contains("negative"));
        assert!(parse_duration("0s")
            .unwrap_err()
            .contains("greater than zero"));
        assert!(parse_duration("ten")
            .unwrap_err()
            .contains("`ten` is not a duration"));
    }

    #[test]
    fn frequencies() {
        assert_eq!(parse_frequency("19"), Ok(19));
        assert_eq!(parse_frequency("99Hz"), Ok(99));
        assert_eq!(parse_frequency("1000"), Ok(1000));
        for bad in ["0", "1001", "-19", "fast", "19.5"] {
            assert!(parse_frequency(bad).is_err(), "{bad} accepted");
        }
        assert!(parse_frequency("5000")
            .unwrap_err()
            .contains("between 1 and 1000"));
    }

    #[test]
    fn pids() {
        assert_eq!(
            parse_pid(&std::process::id().to_string()),
            Ok(std::process::id())
        );
        assert!(parse_pid("0").is_err());
        assert!(parse_pid("abc").unwrap_err().contains("not a process id"));
        // PIDs above pid_max (at most 2^22) cannot exist.
        assert!(parse_pid("4194305")
            .unwrap_err()
            .contains("no process with PID 4194305"));
    }

    #[test]
    fn query_base_range() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_714_564_800);
        let parse = |args: &[&str]| {
            let mut line = vec!["scorch", "query"];
            line.extend_from_slice(args);
            match Cli::try_parse_from(line)?.command {
                Command::Query(args) => Ok::<_, clap::Error>(args),
                _ => panic!("not query"),
            }
        };
        let args = parse(&[
            "--since",
            "1h",
            "--base-from",
            "now-2h",
            "--base-to",
            "now-1h",
        ])
        .unwrap();
        let config = args.resolve_at(now).unwrap();
        let base = config.base.unwrap();
        assert_eq!(base.from, now - Duration::from_secs(7200));
        assert_eq!(base.to, now - Duration::from_secs(3600));
        assert_eq!(config.range.from, now - Duration::from_secs(3600));
        assert!(parse(&[]).unwrap().resolve_at(now).unwrap().base.is_none());
        // One end alone is refused by clap, a bad time by the resolver.
        assert!(parse(&["--base-from", "now-2h"]).is_err());
        assert!(parse(&["--base-to", "now-2h"]).is_err());
        let bad = parse(&["--base-from", "later", "--base-to", "now"]).unwrap();
        assert!(bad.resolve_at(now).is_err());
    }

    #[test]
    fn full_command_lines() {
        let cli =
            Cli::try_parse_from(["scorch", "record", "--duration", "3s", "-o", "x.svg"]).unwrap();
        let Command::Record(args) = cli.command else {
            panic!("not record")
        };
        assert_eq!(args.duration, Duration::from_secs(3));
        assert_eq!(args.frequency, 19);
        assert_eq!(args.output_format(), Format::Svg);

        let err = Cli::try_parse_from(["scorch", "record", "--frequency", "5000"]).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("--frequency") && text.contains("between 1 and 1000"),
            "{text}"
        );

        let cli =
            Cli::try_parse_from(["scorch", "record", "-o", "x.svg", "--format", "pprof"]).unwrap();
        let Command::Record(args) = cli.command else {
            panic!("not record")
        };
        assert_eq!(args.output_format(), Format::Pprof);
    }

    #[test]
    fn flame_graphs_are_icicles_unless_classic_is_asked_for() {
        let record = |extra: &[&str]| {
            let line = [&["scorch", "record", "-o", "x.svg"], extra].concat();
            match Cli::try_parse_from(line).unwrap().command {
                Command::Record(args) => args.resolve().orientation,
                _ => panic!("not record"),
            }
        };
        assert_eq!(record(&[]), Orientation::Icicle);
        assert_eq!(record(&["--orientation", "classic"]), Orientation::Classic);
        let query = |extra: &[&str]| {
            let line = [&["scorch", "query", "-o", "x.svg"], extra].concat();
            match Cli::try_parse_from(line).unwrap().command {
                Command::Query(args) => args.resolve().unwrap().orientation,
                _ => panic!("not query"),
            }
        };
        assert_eq!(query(&[]), Orientation::Icicle);
        assert_eq!(query(&["--orientation", "classic"]), Orientation::Classic);
        assert!(Cli::try_parse_from(["scorch", "query", "--orientation", "sideways"]).is_err());
    }
}
