//! `cargo xtask bench`: what scorch costs, measured beside `perf` and `bpftrace` in fresh
//! processes, with medians and ranges over interleaved runs.
//!
//! Each bench is a module here, built on the same parts: `harness` (starting and stopping the
//! daemon and the profilers, the process churn, the order of rounds), `measure`
//! (`/usr/bin/time`, `/proc`, cgroups, `bpf_stats`, medians) and `capture` (the three tools side
//! by side or in turn). Each bench writes its markdown report under `target/bench/` as before,
//! and its figures as data to `target/bench/<name>.json` (`results`); `report` renders every
//! result there into `docs/benchmarks.md`, and the overhead bench's capture table into the
//! README's cost table. [`Bench::about`] says what each bench measures; the module of each
//! says how.

mod buildhost;
mod capture;
mod daemon;
mod go;
mod harness;
mod heap;
mod jvm;
mod managed;
pub mod measure;
mod micro;
mod node;
mod offcpu;
mod overhead;
mod python;
mod record;
pub mod report;
pub mod results;
mod scale;
mod slowdown;
mod walk;

use std::path::{Path, PathBuf};

use anyhow::{ensure, Result};
use serde::{Deserialize, Serialize};

use crate::bench::results::BenchResult;

/// One bench: `cargo xtask bench --only NAME`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Bench {
    /// scorch record, perf and bpftrace in turn; the daemon under churn; CPU by rate.
    Overhead,
    /// The work two no-frame-pointer workers lose under each profiler at 19, 99, 999 Hz.
    Slowdown,
    /// The daemon with 100 to 1,000 processes of 10 to 300 distinct binaries, and libLLVM.
    Scale,
    /// The daemon beside `cargo build --release`: its peak, and the memory it gives back.
    Buildhost,
    /// The daemon under process churn alone (`--baseline`, `--off-cpu` to compare).
    Churn,
    /// scorch record, perf and bpftrace side by side; BPF cost per sample; kallsyms.
    Record,
    /// The BPF unwinder's cost per sample on deep stacks, beside frame pointers.
    Walk,
    /// The Python walk's cost, and the daemon with 20 interpreters beside py-spy.
    Python,
    /// The Java walk's cost beside the native walk's, and the daemon with 5 JVMs.
    Jvm,
    /// The JavaScript walk's cost beside the native walk's, and the daemon with 5 nodes.
    Node,
    /// Stripped Go binaries named from .gopclntab, and the daemon with 20 of them.
    Go,
    /// A context switch's cost with `record --off-cpu`, beside perf on sched_switch.
    Offcpu,
    /// scorch run in steady state, its store's size and a query of an hour.
    Daemon,
    /// The UI's timeline over 24 h and a diff of two 1 h ranges (no root needed).
    Views,
    /// The remote sinks: encoding, sending, backlog (agent/benches/remote.rs).
    Remote,
    /// Unwind-table build time and size for libc, ld.so, libstdc++ (no root needed).
    Unwind,
    /// What holds the daemon's heap at its peak under churn (heaptrack).
    Heap,
    /// User symbolisation, warm and cold, on a binary with 100+ MB of DWARF.
    Symbolize,
}

impl Bench {
    /// Every bench, in the order `docs/benchmarks.md` gives them.
    pub const ALL: [Bench; 18] = [
        Bench::Overhead,
        Bench::Slowdown,
        Bench::Scale,
        Bench::Buildhost,
        Bench::Churn,
        Bench::Record,
        Bench::Walk,
        Bench::Python,
        Bench::Jvm,
        Bench::Node,
        Bench::Go,
        Bench::Offcpu,
        Bench::Daemon,
        Bench::Views,
        Bench::Remote,
        Bench::Unwind,
        Bench::Heap,
        Bench::Symbolize,
    ];

    /// What `--only` takes, and the name of its results file.
    pub fn name(self) -> &'static str {
        match self {
            Bench::Overhead => "overhead",
            Bench::Slowdown => "slowdown",
            Bench::Scale => "scale",
            Bench::Buildhost => "buildhost",
            Bench::Churn => "churn",
            Bench::Record => "record",
            Bench::Walk => "walk",
            Bench::Python => "python",
            Bench::Jvm => "jvm",
            Bench::Node => "node",
            Bench::Go => "go",
            Bench::Offcpu => "offcpu",
            Bench::Daemon => "daemon",
            Bench::Views => "views",
            Bench::Remote => "remote",
            Bench::Unwind => "unwind",
            Bench::Heap => "heap",
            Bench::Symbolize => "symbolize",
        }
    }

    /// Its section's heading in `docs/benchmarks.md`.
    pub fn title(self) -> &'static str {
        match self {
            Bench::Overhead => "Overhead: scorch beside perf and bpftrace",
            Bench::Slowdown => "The workload's slowdown",
            Bench::Scale => "The daemon as the host's work grows",
            Bench::Buildhost => "A build host",
            Bench::Churn => "The daemon under process churn",
            Bench::Record => "Recording side by side",
            Bench::Walk => "The BPF unwinder's walk",
            Bench::Python => "Python frames",
            Bench::Jvm => "Java frames",
            Bench::Node => "JavaScript frames",
            Bench::Go => "Stripped Go binaries",
            Bench::Offcpu => "Off-CPU: a context switch's cost",
            Bench::Daemon => "The daemon in steady state",
            Bench::Views => "The UI's queries",
            Bench::Remote => "Remote sinks",
            Bench::Unwind => "Unwind tables",
            Bench::Heap => "The daemon's heap",
            Bench::Symbolize => "Symbolisation",
        }
    }

    /// What the bench measures, for its section: the method, never a figure.
    pub fn about(self) -> &'static str {
        match self {
            Bench::Overhead => {
                "`scorch record`, `perf record -F 19 -a -g` and bpftrace's `profile:hz:19` \
                 equivalent each record the same seconds in turn while a workload keeps every \
                 CPU busy: CPU time and peak RSS from `/usr/bin/time -v`, the kernel memory of \
                 each tool's BPF maps, and the BPF cost per sample from the kernel's \
                 `bpf_stats`. Then `scorch run` under a churn of short-lived processes, and \
                 the daemon's CPU at 19, 99 and 999 Hz, read from a cgroup of its own."
            }
            Bench::Slowdown => {
                "Two qsort workers built without frame pointers run under no profiler, \
                 `perf record -a -g`, `perf record -a --call-graph dwarf`, `scorch record` and \
                 `scorch record --unwind fp`, in rounds whose order changes: the share of their \
                 time they lost to interruptions (read from their own clock), each profiler's \
                 CPU, scorch's `bpf` system calls, and the workers' samples whose stack reaches \
                 `main`."
            }
            Bench::Scale => {
                "A fresh `scorch run` at 19 Hz while the host holds 100, 500 and 1,000 sleepy \
                 processes built without frame pointers, among 10, 100 and 300 distinct \
                 binaries, and once beside a process compiling in libLLVM: the daemon's CPU, \
                 RSS, BPF maps, unwind tables loaded and evicted, and the share of stacks \
                 walked whole."
            }
            Bench::Buildhost => {
                "A fresh `scorch run` at 19 Hz, profiling the whole host, beside `cargo build \
                 --release -p xtask --offline` of this repository into an empty target \
                 directory (each rustc maps librustc_driver and libLLVM): the daemon's peak RSS \
                 and footprint (RSS + BPF maps) during the build, and how long after it the \
                 footprint is back within 12 MiB of its level before."
            }
            Bench::Churn => {
                "The overhead bench's churn alone: `scorch run` while a loop starts \
                 `python3 -c pass` and `/bin/true` back to back, interleaved with an earlier \
                 build (`--baseline`) or a daemon with `--off-cpu`."
            }
            Bench::Record => {
                "`scorch record`, `perf record -F 19 -a -g` and bpftrace run at once, each \
                 also sampling the others; the BPF cost per sample at 19 Hz and at 997 Hz, \
                 where caches stay warm; the kallsyms criterion bench."
            }
            Bench::Walk => {
                "`tests/workloads/deepsort.cpp` (about 30 frames through libc, no frame \
                 pointers) recorded with `--unwind auto` and `--unwind fp` in turn: BPF ns per \
                 sample and the unwind tables' map memory."
            }
            Bench::Python => {
                "`python3.11` 50 Python frames deep recorded at 999 Hz with `--python auto` \
                 and `--python off`; then `scorch run` beside 20 interpreters, walking on and \
                 off, and 20 `py-spy record` processes on the same interpreters."
            }
            Bench::Jvm => {
                "OpenJDK 17 50 Java frames deep, each a compiled frame, recorded at 999 Hz \
                 with `--jvm auto` and `--jvm off`, beside a C program 50 native frames deep \
                 walked through unwind tables; then `scorch run` beside 5 JVMs, walking on and \
                 off."
            }
            Bench::Node => {
                "Node 20 50 JavaScript frames deep, each a frame of its own, recorded at 999 Hz \
                 with `--node auto` and `--node off`, beside a C program 50 native frames deep \
                 walked through unwind tables; then `scorch run` beside 5 node processes, \
                 walking on and off."
            }
            Bench::Go => {
                "10,000 pcs of a stripped Go service named from `.gopclntab` beside DWARF \
                 (`agent/benches/gosym.rs`); `scorch run` with 20 distinct stripped Go \
                 binaries running and without, keeping only them and profiling the whole host."
            }
            Bench::Offcpu => {
                "Two threads pinned to one CPU bounce a byte over pipes under no profiler, \
                 `scorch record`, `scorch record --off-cpu` and `perf record -e \
                 sched:sched_switch -a -g`: the switches a second each leaves, and its CPU."
            }
            Bench::Daemon => {
                "`scorch run` for 30 windows beside about 100 processes: its CPU and RSS; the \
                 store's size for an hour of those windows against their gzipped pprofs; \
                 `scorch query` of that hour into a flame graph; the UI's queries."
            }
            Bench::Views => {
                "A synthetic day of 10 s windows (50 processes, 20 stacks each) written to a \
                 store, then the UI's timeline over 24 h and a diff of two 1 h ranges."
            }
            Bench::Remote => {
                "`agent/benches/remote.rs`: synthetic windows encoded as the Pyroscope and \
                 Parca sinks send them and as OTLP, sent to a local server, and an hour's \
                 backlog drained after the server comes back."
            }
            Bench::Unwind => {
                "`agent/benches/unwind.rs`: the unwind tables of libc, ld.so and libstdc++ \
                 built from their files, 20 fresh builds each, then those of rustc's \
                 librustc_driver and libLLVM, 5 each: rows, bytes, build time, and the most \
                 heap a build held (the table included)."
            }
            Bench::Heap => {
                "`scorch run` under the overhead bench's churn, run under heaptrack: what held \
                 its heap when the heap peaked, by call site."
            }
            Bench::Symbolize => {
                "`agent/benches/symbolize.rs`: user frames named warm and cold, the cold case \
                 on scorch itself built with 100+ MB of DWARF."
            }
        }
    }

    /// Whether it needs the release build, root and the setup's packages; the others run on
    /// any development machine.
    fn needs_setup(self) -> bool {
        !matches!(self, Bench::Unwind | Bench::Views)
    }
}

/// What `cargo xtask bench` was asked for.
#[derive(Debug, Clone)]
pub struct Options {
    pub seconds: u64,
    pub runs: Option<usize>,
    pub only: Option<Bench>,
    pub daemon_windows: u64,
    pub baseline: Option<PathBuf>,
    pub rates: Vec<u64>,
    pub off_cpu: bool,
    pub render_only: bool,
}

impl Options {
    /// The command line that runs `bench` as asked, for its results.
    fn command(&self, bench: Bench) -> String {
        let mut command = format!("cargo xtask bench --only {}", bench.name());
        if let Some(runs) = self.runs {
            command.push_str(&format!(" --runs {runs}"));
        }
        if matches!(bench, Bench::Overhead | Bench::Record) && self.seconds != 60 {
            command.push_str(&format!(" --seconds {}", self.seconds));
        }
        if bench == Bench::Daemon && self.daemon_windows != 30 {
            command.push_str(&format!(" --daemon-windows {}", self.daemon_windows));
        }
        for hz in &self.rates {
            command.push_str(&format!(" --rate {hz}"));
        }
        if self.off_cpu {
            command.push_str(" --off-cpu");
        }
        if self.baseline.is_some() {
            command.push_str(" --baseline BIN");
        }
        command
    }
}

/// Runs the benches asked for, then renders `docs/benchmarks.md` from every result there is.
pub fn run(root: &Path, options: &Options) -> Result<()> {
    if options.render_only {
        return report::write(root);
    }
    let only = options.only;
    ensure!(
        options.rates.is_empty() || only == Some(Bench::Slowdown),
        "--rate is for --only slowdown"
    );
    ensure!(
        !options.off_cpu || only == Some(Bench::Churn),
        "--off-cpu is for --only churn"
    );
    ensure!(
        options.baseline.is_none()
            || matches!(only, Some(Bench::Churn | Bench::Slowdown | Bench::Walk)),
        "--baseline is for --only churn, slowdown or walk"
    );
    let benches = match only {
        Some(bench) => vec![bench],
        // The default set: what a change to the agent should be checked against.
        None => vec![
            Bench::Record,
            Bench::Symbolize,
            Bench::Daemon,
            Bench::Remote,
            Bench::Unwind,
            Bench::Walk,
        ],
    };
    let scorch = if benches.iter().any(|b| b.needs_setup()) {
        crate::setup::setup()?;
        Some(crate::build(root)?)
    } else {
        None
    };
    for bench in benches {
        let result = measure(root, scorch.as_deref(), bench, options)?;
        result.save(root)?;
    }
    report::write(root)
}

/// Runs one bench: it prints and writes its report, and returns its figures.
fn measure(
    root: &Path,
    scorch: Option<&Path>,
    bench: Bench,
    options: &Options,
) -> Result<BenchResult> {
    let command = options.command(bench);
    let runs = |default: usize| options.runs.unwrap_or(default);
    let baseline = options.baseline.as_deref();
    let scorch =
        || scorch.ok_or_else(|| anyhow::anyhow!("{} needs the release build", bench.name()));
    let phases = overhead::Phases::standard(options.seconds);
    match bench {
        Bench::Unwind => micro::unwind(root, command),
        Bench::Views => micro::views(root, command),
        Bench::Remote => micro::remote(root, scorch()?, command),
        Bench::Symbolize => micro::symbolize(root, command),
        Bench::Record => record::record(root, scorch()?, options.seconds, runs(3), command),
        Bench::Walk => walk::walk(root, scorch()?, baseline, runs(3), command),
        Bench::Daemon => daemon::daemon(root, scorch()?, options.daemon_windows, command),
        Bench::Heap => heap::heap(root, scorch()?, command),
        Bench::Python => python::python(root, scorch()?, runs(3), command),
        Bench::Jvm => jvm::jvm(root, scorch()?, runs(3), command),
        Bench::Node => node::node(root, scorch()?, runs(3), command),
        Bench::Go => go::go(root, scorch()?, runs(3), command),
        Bench::Overhead => overhead::overhead(root, scorch()?, runs(3), phases, command),
        Bench::Churn => overhead::churn_ab(
            root,
            scorch()?,
            baseline,
            options.off_cpu,
            runs(3),
            phases,
            command,
        ),
        Bench::Slowdown => {
            let rates = if options.rates.is_empty() {
                slowdown::RATES.to_vec()
            } else {
                options.rates.clone()
            };
            slowdown::slowdown(root, scorch()?, baseline, runs(5), &rates, command)
        }
        Bench::Offcpu => offcpu::offcpu(root, scorch()?, runs(5), command),
        Bench::Scale => scale::scale(root, scorch()?, runs(1), command),
        Bench::Buildhost => buildhost::buildhost(root, scorch()?, runs(3), command),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bench_has_its_own_name_and_is_listed_once() {
        let names: std::collections::BTreeSet<&str> = Bench::ALL.iter().map(|b| b.name()).collect();
        assert_eq!(names.len(), Bench::ALL.len());
        for bench in Bench::ALL {
            // clap and serde spell it as `--only` and the results file do.
            let value = clap::ValueEnum::to_possible_value(&bench).unwrap();
            assert_eq!(value.get_name(), bench.name());
            assert_eq!(
                serde_json::to_string(&bench).unwrap(),
                format!("\"{}\"", bench.name())
            );
            assert!(!bench.about().is_empty() && !bench.title().is_empty());
        }
    }

    #[test]
    fn the_command_names_what_was_asked() {
        let options = Options {
            seconds: 60,
            runs: Some(5),
            only: Some(Bench::Slowdown),
            daemon_windows: 30,
            baseline: None,
            rates: vec![999],
            off_cpu: false,
            render_only: false,
        };
        assert_eq!(
            options.command(Bench::Slowdown),
            "cargo xtask bench --only slowdown --runs 5 --rate 999"
        );
    }
}
