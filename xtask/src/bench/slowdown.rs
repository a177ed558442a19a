//! `cargo xtask bench --only slowdown`: the cost a profiler's workload feels, at 19, 99 and
//! 999 Hz, beside perf's, written to `target/bench/slowdown.md`.
//!
//! - **Workload.** Two processes of `tests/workloads/qsortunits.c`, built `-O2
//!   -fomit-frame-pointer`, each sorting through libc's qsort for a fixed 8 s and printing
//!   the sorts it finished: the work a profiler took from them is the work not done.
//! - **Time lost.** Work done moves by several percent from run to run on a shared machine,
//!   whose CPUs' speed follows the neighbours': more than any profiler here costs. So each
//!   worker also reads the clock every few comparisons and reports the intervals longer than a
//!   microsecond: the time it did not run, to an interrupt (a profiler's sample is one) or to
//!   another task on its CPU (the profiler's own threads among them). Their sum over the time
//!   read is the share of the workers' time lost, counted in time whatever the CPU's speed;
//!   their median is what one interruption costs, the sample's handler included.
//! - **Profilers.** None; `perf record -a -g`; `perf record -a --call-graph dwarf`; `scorch
//!   record` (system-wide, to a file); `scorch record --unwind fp`, the walk `perf -g` does
//!   with scorch's counting, so the two scorch rows split the table walk's cost from the rest;
//!   with `--baseline`, a second scorch built from an earlier commit. Each is started first and waited for until it samples (its perf events
//!   open on every CPU, or scorch's BPF program loaded) and its start-up work is done (its
//!   CPU use settled: scorch builds the unwind tables of each process at its first sample,
//!   and at 999 Hz every process on a CPU is sampled within milliseconds of the start), then
//!   the workers run, then it is stopped with SIGINT and writes its file into a temporary
//!   directory. Its CPU time (user + system, start-up and writing included) comes from
//!   `/usr/bin/time -v`; what it had used as the workers started (`/proc/PID/stat`) is
//!   reported apart as its start: scorch's start is mostly the kernel verifying its BPF
//!   unwinder, and on some kernel builds that is as much CPU as perf uses over the whole 8 s:
//!   a cost a recording pays once however long it runs.
//! - **Rounds.** Every round runs each rate with each profiler once, fresh processes every
//!   time, the profilers' order changed between rounds (a different stride through them) so
//!   none always follows another's leftovers; each run's files are deleted and synced before the
//!   next. Medians are reported, the slowdown against the no-profiler runs of the same
//!   rate.
//! - **bpf(2) calls.** One more run of each scorch at 999 Hz under `strace -f -c -e
//!   trace=bpf`, counting its `bpf` system calls, load included: what the map reads cost in
//!   calls, apart from their time.
//! - **Whole stacks.** One more run at the highest rate of each profiler but perf's DWARF mode
//!   (its data takes `perf script` minutes), counting the workers' samples whose stack reaches
//!   `main`: what each walk gives for what it costs (a frame-pointer walk of these workers
//!   stops within a frame or two).
//!
//! System-wide, scorch also builds unwind tables for whatever else the machine runs (a shared
//! machine's compilers too), in user time; its system time is where the drain's `bpf` calls
//! show, so the table gives both.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{ensure, Context, Result};

use crate::{
    bench::{
        harness::{interrupt, round_order, under_profiler, wait_ready, Profiled},
        measure::{command_output, load_average, median, path_str, time_usage, timed, Processes},
        results::{BenchResult, Cell, Table},
        Bench,
    },
    run_command,
};

/// Seconds each worker sorts for.
const WORK_SECONDS: u64 = 8;
const WORKERS: usize = 2;
/// The sampling rates compared when none is asked for.
pub const RATES: [u64; 3] = [19, 99, 999];
/// One way of running the workload.
#[derive(Debug, Clone)]
enum Profiler {
    None,
    PerfFramePointers,
    PerfDwarf,
    /// `scorch record` with `extra` arguments after the common ones.
    Scorch {
        binary: PathBuf,
        name: String,
        extra: Vec<&'static str>,
    },
}

impl Profiler {
    fn name(&self) -> String {
        match self {
            Profiler::None => "none".to_owned(),
            Profiler::PerfFramePointers => "`perf record -a -g`".to_owned(),
            Profiler::PerfDwarf => "`perf record -a --call-graph dwarf`".to_owned(),
            Profiler::Scorch { name, .. } => name.clone(),
        }
    }

    /// The profiler's command under `/usr/bin/time -v`, writing into `dir` (scorch to
    /// `scorch_output`, its format by the extension); `None` for none.
    fn command(&self, hz: u64, dir: &Path, scorch_output: &str) -> Result<Option<Command>> {
        let hz = hz.to_string();
        let perf_data = dir.join("perf.data");
        let perf = |call_graph: &[&str]| -> Result<Command> {
            let mut args = vec!["record", "-q", "-a", "-F", &hz];
            args.extend_from_slice(call_graph);
            args.extend_from_slice(&["-o", path_str(&perf_data)?]);
            Ok(timed(Path::new("perf"), &args))
        };
        Ok(match self {
            Profiler::None => None,
            Profiler::PerfFramePointers => Some(perf(&["-g"])?),
            Profiler::PerfDwarf => Some(perf(&["--call-graph", "dwarf"])?),
            Profiler::Scorch { binary, extra, .. } => {
                let output = dir.join(scorch_output);
                let mut args = scorch_args(&hz, path_str(&output)?).to_vec();
                args.extend_from_slice(extra);
                Some(timed(binary, &args))
            }
        })
    }
}

/// What the workers report of the time they did not run (see `tests/workloads/qsortunits.c`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Lost {
    /// Intervals between two clock reads longer than a microsecond.
    gaps: u64,
    /// Their sum.
    gap_ns: u64,
    /// The sum of all intervals: the time the clock was read over.
    covered_ns: u64,
    /// The workers' median gaps, averaged.
    median_gap_ns: f64,
}

impl Lost {
    /// Percent of the time read that went in gaps.
    fn percent(&self) -> f64 {
        if self.covered_ns == 0 {
            return f64::NAN;
        }
        100.0 * self.gap_ns as f64 / self.covered_ns as f64
    }
}

/// A worker's line: `sorts=N gaps=N gap_ns=N covered_ns=N median_gap_ns=N`.
fn parse_worker(line: &str) -> Result<(f64, Lost)> {
    let field = |name: &str| -> Result<u64> {
        line.split_whitespace()
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            .with_context(|| format!("a worker printed {line:?}, without {name}="))?
            .parse()
            .with_context(|| format!("a worker printed {line:?}: {name} is not a count"))
    };
    Ok((
        field("sorts")? as f64,
        Lost {
            gaps: field("gaps")?,
            gap_ns: field("gap_ns")?,
            covered_ns: field("covered_ns")?,
            median_gap_ns: field("median_gap_ns")? as f64,
        },
    ))
}

/// `scorch record` at `hz`, longer than any run: SIGINT ends it.
fn scorch_args<'a>(hz: &'a str, output: &'a str) -> [&'a str; 7] {
    ["record", "-F", hz, "--duration", "10m", "--output", output]
}

/// One run's figures.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// Sorts done by all workers.
    work: f64,
    /// The workers' time lost to interruptions.
    lost: Lost,
    /// The profiler's user + system seconds; 0 without one.
    profiler_cpu: f64,
    /// The profiler's system seconds alone.
    profiler_system: f64,
    /// The profiler's user + system seconds before the workers started: its start (a BPF
    /// program's verification, perf's reading of every process's mappings), paid once per
    /// run whatever its length.
    profiler_start: f64,
    /// The profiler's user + system seconds while the workers ran: what it took from their
    /// CPUs as it sampled, apart from its start and its end (perf writes its file, scorch
    /// symbolises and writes its profile, once the workers are done).
    profiler_during: f64,
}

pub fn slowdown(
    root: &Path,
    scorch: &Path,
    baseline: Option<&Path>,
    runs: usize,
    rates: &[u64],
    command: String,
) -> Result<BenchResult> {
    ensure!(!rates.is_empty(), "no sampling rate to compare");
    let dir = root.join("target/bench/slowdown");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // Copies of their own: a `cargo build` in the tree meanwhile would otherwise swap the
    // binary under test between rounds.
    let pin = |binary: &Path, name: &str| -> Result<PathBuf> {
        let pinned = dir.join(name);
        std::fs::copy(binary, &pinned)
            .with_context(|| format!("copying {} to {}", binary.display(), pinned.display()))?;
        Ok(pinned)
    };
    let pinned = pin(scorch, "scorch")?;
    let mut profilers = vec![
        Profiler::None,
        Profiler::PerfFramePointers,
        Profiler::PerfDwarf,
        Profiler::Scorch {
            binary: pinned.clone(),
            name: "`scorch record`".to_owned(),
            extra: Vec::new(),
        },
        // The walk `perf -g` does (the kernel's, by frame pointers), with scorch's counting:
        // beside the row above, what the table walk costs, and beside perf's, the rest.
        Profiler::Scorch {
            binary: pinned,
            name: "`scorch record --unwind fp`".to_owned(),
            extra: vec!["--unwind", "fp"],
        },
    ];
    if let Some(baseline) = baseline {
        profilers.push(Profiler::Scorch {
            binary: pin(baseline, "scorch-baseline")?,
            name: "`scorch record`, baseline".to_owned(),
            extra: Vec::new(),
        });
    }
    let worker = dir.join("qsortunits");
    run_command(
        Command::new("gcc")
            .args(["-O2", "-fomit-frame-pointer", "-o"])
            .arg(&worker)
            .arg(root.join("tests/workloads/qsortunits.c")),
    )?;
    let cpus = std::thread::available_parallelism()?.get();
    let load_before = load_average();

    // results[rate][profiler]: one entry per round.
    let mut results = vec![vec![Vec::new(); profilers.len()]; rates.len()];
    for round in 0..runs {
        let order = round_order(profilers.len(), round);
        for (r, &hz) in rates.iter().enumerate() {
            for &p in &order {
                eprintln!(
                    "slowdown: round {} of {runs}, {hz} Hz, {}",
                    round + 1,
                    profilers[p].name()
                );
                results[r][p].push(one_run(&profilers[p], hz, &worker, &dir, cpus)?);
            }
        }
    }
    let mut calls = Vec::new();
    for profiler in &profilers {
        if let Profiler::Scorch {
            binary,
            name,
            extra,
        } = profiler
        {
            if !extra.is_empty() {
                continue;
            }
            eprintln!("slowdown: counting {name}'s bpf calls at 999 Hz");
            calls.push((name.clone(), bpf_calls(binary, 999, &worker, &dir, cpus)?));
        }
    }
    // What each walk gives for that cost: one more run at the highest rate.
    let top = rates.iter().copied().max().unwrap_or(999);
    let mut stacks = Vec::new();
    for profiler in &profilers {
        if matches!(profiler, Profiler::None | Profiler::PerfDwarf) {
            continue;
        }
        eprintln!("slowdown: the stacks {} gives at {top} Hz", profiler.name());
        stacks.push((
            profiler.name(),
            whole_stacks(profiler, top, &worker, &dir, cpus)?,
        ));
    }
    let load_after = load_average();

    let mut out = String::new();
    writeln!(
        out,
        "# The workload's slowdown under each profiler, commit {}, {}\n",
        command_output("git", &["rev-parse", "--short", "HEAD"]),
        command_output("date", &["-u", "+%Y-%m-%d"]),
    )?;
    writeln!(
        out,
        "`cargo xtask bench --only slowdown --runs {runs}{}{}`: {WORKERS} workers \
         (`tests/workloads/qsortunits.c`, `-O2 -fomit-frame-pointer`) sorting for {WORK_SECONDS} s \
         under each profiler; medians of {runs} rounds of fresh processes. {cpus} CPUs, {}; load \
         average {load_before} at the start, {load_after} at the end (a shared machine: the \
         load is the other users').\n",
        if baseline.is_some() {
            " --baseline ..."
        } else {
            ""
        },
        if rates == RATES {
            String::new()
        } else {
            rates.iter().map(|hz| format!(" --rate {hz}")).collect()
        },
        command_output("uname", &["-r"]),
    )?;
    writeln!(
        out,
        "| Hz | profiler | sorts done | slowdown vs none | time lost | added to none's | \
         median interruption | interruptions /s | profiler CPU (s) | of which system | \
         of which its start | of which during the work |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|")?;
    for (r, hz) in rates.iter().enumerate() {
        let none = median(results[r][0].iter().map(|run| run.work).collect());
        let none_lost = median(results[r][0].iter().map(|run| run.lost.percent()).collect());
        for (p, profiler) in profilers.iter().enumerate() {
            let lost = median(results[r][p].iter().map(|run| run.lost.percent()).collect());
            let added = match profiler {
                Profiler::None => String::new(),
                _ => format!("{:+.2} pt", lost - none_lost),
            };
            let gap_us = median(
                results[r][p]
                    .iter()
                    .map(|run| run.lost.median_gap_ns / 1e3)
                    .collect(),
            );
            let per_second = median(
                results[r][p]
                    .iter()
                    .map(|run| run.lost.gaps as f64 / (WORKERS as u64 * WORK_SECONDS) as f64)
                    .collect(),
            );
            let work = median(results[r][p].iter().map(|run| run.work).collect());
            let cpu = median(results[r][p].iter().map(|run| run.profiler_cpu).collect());
            let system = median(
                results[r][p]
                    .iter()
                    .map(|run| run.profiler_system)
                    .collect(),
            );
            let start = median(results[r][p].iter().map(|run| run.profiler_start).collect());
            let during = median(
                results[r][p]
                    .iter()
                    .map(|run| run.profiler_during)
                    .collect(),
            );
            let (slowdown, cpu, system, start, during) = match profiler {
                Profiler::None => Default::default(),
                _ => (
                    format!("{:.1}%", slowdown_percent(none, work)),
                    format!("{cpu:.2}"),
                    format!("{system:.2}"),
                    format!("{start:.2}"),
                    format!("{during:.2}"),
                ),
            };
            writeln!(
                out,
                "| {hz} | {} | {work:.0} | {slowdown} | {lost:.2}% | {added} | {gap_us:.1} us | \
                 {per_second:.0} | {cpu} | {system} | {start} | {during} |",
                profiler.name()
            )?;
        }
    }
    writeln!(
        out,
        "\nTime lost: the share of the workers' time (the clock read every 8 comparisons) that \
         went in intervals over a microsecond, to interrupts and other tasks on their CPUs; \
         interruptions per second are per worker. A profiler's CPU is its whole run's (`/usr/bin/time`); \
         \"of which its start\" is what it had used when the workers started (`/proc/PID/stat`, \
         10 ms ticks): scorch's BPF verification, perf's reading of every process's mappings, \
         paid once however long the recording; \"during the work\" is what it used while \
         the workers ran, the part of its CPU they compete with. Each profiler's time lost minus perf -g's, \
         paired in each round (median [least, most]):\n"
    )?;
    writeln!(out, "| Hz | profiler | time lost minus perf -g's |")?;
    writeln!(out, "|---|---|---|")?;
    for (r, hz) in rates.iter().enumerate() {
        // `profilers` starts with none, then `perf -g`.
        let perf = &results[r][1];
        for (p, profiler) in profilers.iter().enumerate().skip(2) {
            let mut differences: Vec<f64> = results[r][p]
                .iter()
                .zip(perf)
                .map(|(run, perf)| run.lost.percent() - perf.lost.percent())
                .collect();
            differences.sort_by(f64::total_cmp);
            writeln!(
                out,
                "| {hz} | {} | {:+.2} pt [{:+.2}, {:+.2}] |",
                profiler.name(),
                median(differences.clone()),
                differences.first().copied().unwrap_or(f64::NAN),
                differences.last().copied().unwrap_or(f64::NAN),
            )?;
        }
    }
    writeln!(
        out,
        "\n`bpf` system calls of one more run at 999 Hz under `strace -f -c -e trace=bpf` (the \
         program's load included; per second of the {WORK_SECONDS} s the workers ran):\n"
    )?;
    writeln!(out, "| profiler | bpf calls | per second |")?;
    writeln!(out, "|---|---|---|")?;
    for (name, count) in &calls {
        writeln!(
            out,
            "| {name} | {count} | {:.0} |",
            *count as f64 / WORK_SECONDS as f64
        )?;
    }
    writeln!(
        out,
        "\nWhat each walk gives for its cost: one more run at {top} Hz, the workers' samples and \
         those whose stack reaches `main`, as every one of theirs does (a new worker's first \
         samples, before its tables load, are walked by frame pointers); perf DWARF's run is \
         left out, its {top} Hz data takes `perf script` minutes:\n"
    )?;
    writeln!(out, "| profiler | workers' samples | reaching `main` |")?;
    writeln!(out, "|---|---|---|")?;
    for (name, whole) in &stacks {
        writeln!(
            out,
            "| {name} | {} | {} ({:.1}%) |",
            whole.samples,
            whole.reaching_main,
            100.0 * whole.reaching_main as f64 / whole.samples.max(1) as f64
        )?;
    }
    let path = root.join("target/bench/slowdown.md");
    std::fs::write(&path, &out).with_context(|| format!("writing {}", path.display()))?;
    print!("{out}");
    eprintln!("bench: report written to {}", path.display());
    Ok(results_of(
        command, rates, &profilers, &results, &calls, &stacks, top,
    ))
}

/// The rounds' figures as data: what each profiler cost the workers and itself, per rate.
fn results_of(
    command: String,
    rates: &[u64],
    profilers: &[Profiler],
    results: &[Vec<Vec<Run>>],
    calls: &[(String, u64)],
    stacks: &[(String, WholeStacks)],
    top: u64,
) -> BenchResult {
    let mut lost = Table::new(
        "lost",
        &format!(
            "{WORKERS} qsort workers (`-O2 -fomit-frame-pointer`) for {WORK_SECONDS} s under each \
             profiler"
        ),
        "Hz, profiler",
        &[
            "time lost %",
            "time lost minus perf -g's, pt",
            "median interruption us",
            "profiler CPU s",
            "of which its start",
            "of which during the work",
        ],
    )
    .with_note(
        "Time lost: the share of the workers' time (their clock read every 8 comparisons) that \
         went in intervals over a microsecond, to interrupts and other tasks on their CPUs. \
         Minus perf -g's: paired in each round. A profiler's CPU is its whole run's \
         (`/usr/bin/time`); its start is what it had used when the workers started (scorch's \
         BPF verification, perf's reading of every process's mappings), paid once per \
         recording; during the work is the part the workers compete with.",
    );
    for (r, hz) in rates.iter().enumerate() {
        for (p, profiler) in profilers.iter().enumerate() {
            let runs = &results[r][p];
            let of = |f: &dyn Fn(&Run) -> f64, decimals| {
                Cell::of(&runs.iter().map(f).collect::<Vec<_>>(), decimals)
            };
            // `profilers` starts with none, then `perf -g`.
            let versus_perf = if p >= 2 {
                let differences: Vec<f64> = runs
                    .iter()
                    .zip(&results[r][1])
                    .map(|(run, perf)| run.lost.percent() - perf.lost.percent())
                    .collect();
                Cell::of(&differences, 2)
            } else {
                Cell::Missing
            };
            let profiled = |cell: Cell| match profiler {
                Profiler::None => Cell::Missing,
                _ => cell,
            };
            lost.row(
                format!("{hz} Hz, {}", profiler.name()),
                vec![
                    of(&|run| run.lost.percent(), 2),
                    versus_perf,
                    of(&|run| run.lost.median_gap_ns / 1e3, 1),
                    profiled(of(&|run| run.profiler_cpu, 2)),
                    profiled(of(&|run| run.profiler_start, 2)),
                    profiled(of(&|run| run.profiler_during, 2)),
                ],
            );
        }
    }
    let mut bpf = Table::new(
        "bpf-calls",
        "`bpf` system calls of one run at 999 Hz, load included (`strace -f -c`)",
        "profiler",
        &["bpf calls", "per second of work"],
    );
    for (name, count) in calls {
        bpf.row(
            name.clone(),
            vec![
                Cell::one(*count as f64, 0),
                Cell::one(*count as f64 / WORK_SECONDS as f64, 0),
            ],
        );
    }
    let mut whole = Table::new(
        "whole-stacks",
        &format!("The workers' samples whose stack reaches `main`, one run at {top} Hz"),
        "profiler",
        &["workers' samples", "reaching `main` %"],
    )
    .with_note(
        "A frame-pointer walk of these workers stops within a frame or two; a new worker's \
         first samples, before its tables load, are walked by frame pointers. perf's DWARF \
         mode is left out: its data takes `perf script` minutes.",
    );
    for (name, stacks) in stacks {
        whole.row(
            name.clone(),
            vec![
                Cell::one(stacks.samples as f64, 0),
                Cell::one(
                    100.0 * stacks.reaching_main as f64 / stacks.samples.max(1) as f64,
                    1,
                ),
            ],
        );
    }
    let mut result = BenchResult::new(Bench::Slowdown, command);
    result.tables = vec![lost, bpf, whole];
    result
}

/// The workers' samples in one profile, and how many of them have a whole stack.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct WholeStacks {
    samples: u64,
    /// Samples whose stack reaches `main` (`sort_round` is inlined into it).
    reaching_main: u64,
}

impl WholeStacks {
    /// Counts one sample of the workers, its frames leaf first or root first.
    fn add<'a>(&mut self, mut frames: impl Iterator<Item = &'a str>, count: u64) {
        self.samples += count;
        if frames.any(|frame| frame == "main") {
            self.reaching_main += count;
        }
    }
}

/// The name the workers run under (`comm`).
const WORKER_COMM: &str = "qsortunits";

/// Runs the workers once under `profiler` at `hz` and counts their samples with whole stacks:
/// from `perf script` for perf, from `scorch record`'s folded output for scorch.
fn whole_stacks(
    profiler: &Profiler,
    hz: u64,
    worker: &Path,
    dir: &Path,
    cpus: usize,
) -> Result<WholeStacks> {
    let scratch = dir.join("stacks");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)?;
    let folded = scratch.join("scorch.folded");
    let mut command = profiler
        .command(hz, &scratch, "scorch.folded")?
        .context("no profiler to count the stacks of")?;
    command.stdout(Stdio::null());
    under_profiler(command, &profiler.name(), cpus, || run_workers(worker))?;
    let whole = match profiler {
        Profiler::Scorch { .. } => {
            let text = std::fs::read_to_string(&folded)
                .with_context(|| format!("reading {}", folded.display()))?;
            folded_whole_stacks(&text)
        }
        _ => {
            let data = scratch.join("perf.data");
            let output = Command::new("perf")
                .args(["script", "-F", "comm,ip,sym", "-i", path_str(&data)?])
                .stderr(Stdio::null())
                .output()
                .context("running perf script")?;
            ensure!(output.status.success(), "perf script failed");
            perf_script_whole_stacks(&String::from_utf8_lossy(&output.stdout))
        }
    };
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(whole)
}

/// From folded stacks (`process;root;...;leaf count`, one line per stack).
fn folded_whole_stacks(text: &str) -> WholeStacks {
    let mut whole = WholeStacks::default();
    for line in text.lines() {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(count) = count.parse::<u64>() else {
            continue;
        };
        let mut frames = stack.split(';');
        if frames
            .next()
            .is_some_and(|process| process.starts_with(WORKER_COMM))
        {
            whole.add(frames, count);
        }
    }
    whole
}

/// From `perf script -F comm,ip,sym`: a line with the task's name, then a line per frame
/// (`address symbol`), leaf first, and a blank line after each sample.
fn perf_script_whole_stacks(text: &str) -> WholeStacks {
    let mut whole = WholeStacks::default();
    for sample in text.split("\n\n") {
        let mut lines = sample.lines().filter(|line| !line.trim().is_empty());
        let Some(comm) = lines.next() else {
            continue;
        };
        if comm.trim() != WORKER_COMM {
            continue;
        }
        let frames = lines.map(|line| {
            let line = line.trim();
            let symbol = line.split_once(char::is_whitespace).map_or("", |(_, s)| s);
            // `sym (dso)` when perf adds the object.
            symbol.split(" (").next().unwrap_or(symbol).trim()
        });
        whole.add(frames, 1);
    }
    whole
}

/// Percent of `none`'s work that `work` did not do.
fn slowdown_percent(none: f64, work: f64) -> f64 {
    if none > 0.0 {
        100.0 * (none - work) / none
    } else {
        f64::NAN
    }
}

/// The workers alone, or under `profiler` at `hz`.
fn one_run(profiler: &Profiler, hz: u64, worker: &Path, dir: &Path, cpus: usize) -> Result<Run> {
    let scratch = dir.join("run");
    // What the previous run wrote: perf's DWARF data at 999 Hz is hundreds of megabytes.
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)?;
    let Some(mut command) = profiler.command(hz, &scratch, "scorch.pb.gz")? else {
        let (work, lost) = run_workers(worker)?;
        return Ok(Run {
            work,
            lost,
            profiler_cpu: 0.0,
            profiler_system: 0.0,
            profiler_start: 0.0,
            profiler_during: 0.0,
        });
    };
    command.stdout(Stdio::null());
    let Profiled {
        result: (work, lost),
        output,
        start_cpu,
        during_cpu,
    } = under_profiler(command, &profiler.name(), cpus, || run_workers(worker))?;
    // Deleted, then what is left written back now, not during the next run.
    let _ = std::fs::remove_dir_all(&scratch);
    run_command(&mut Command::new("sync"))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let usage = time_usage(&stderr)?;
    Ok(Run {
        work,
        lost,
        profiler_cpu: usage.cpu_seconds,
        profiler_system: usage.system_seconds,
        profiler_start: start_cpu,
        profiler_during: during_cpu,
    })
}

/// Starts the workers together and returns the sorts they did and the time they lost, in all.
fn run_workers(worker: &Path) -> Result<(f64, Lost)> {
    let mut workers = Processes(Vec::new());
    for _ in 0..WORKERS {
        workers.0.push(
            Command::new(worker)
                .arg(WORK_SECONDS.to_string())
                .stdout(Stdio::piped())
                .spawn()
                .with_context(|| format!("starting {}", worker.display()))?,
        );
    }
    let mut total = 0.0;
    let mut lost = Lost::default();
    for child in std::mem::take(&mut workers.0) {
        let output = child.wait_with_output()?;
        ensure!(
            output.status.success(),
            "a worker failed: {}",
            output.status
        );
        let (work, worker_lost) = parse_worker(String::from_utf8_lossy(&output.stdout).trim())?;
        total += work;
        lost.gaps += worker_lost.gaps;
        lost.gap_ns += worker_lost.gap_ns;
        lost.covered_ns += worker_lost.covered_ns;
        lost.median_gap_ns += worker_lost.median_gap_ns / WORKERS as f64;
    }
    Ok((total, lost))
}

/// scorch's `bpf` calls over one run at `hz`, counted by strace.
fn bpf_calls(scorch: &Path, hz: u64, worker: &Path, dir: &Path, cpus: usize) -> Result<u64> {
    let scratch = dir.join("strace");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)?;
    let counts = scratch.join("counts");
    let output = scratch.join("scorch.pb.gz");
    let hz = hz.to_string();
    let child = Command::new("strace")
        .args(["-f", "-c", "-e", "trace=bpf", "-o", path_str(&counts)?])
        .arg(scorch)
        .args(scorch_args(&hz, path_str(&output)?))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting strace (apt-get install strace)")?;
    let mut guard = Processes(vec![child]);
    let pid = wait_ready(&mut guard.0[0], cpus)?;
    run_workers(worker)?;
    interrupt(pid)?;
    let child = guard.0.remove(0);
    let result = child.wait_with_output()?;
    ensure!(
        result.status.success(),
        "strace scorch failed: {}",
        String::from_utf8_lossy(&result.stderr)
    );
    let summary = std::fs::read_to_string(&counts)
        .with_context(|| format!("reading {}", counts.display()))?;
    let calls = strace_calls(&summary, "bpf")
        .with_context(|| format!("no bpf line in strace's summary:\n{summary}"))?;
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(calls)
}

/// The `calls` column of `syscall`'s line in a `strace -c` summary.
fn strace_calls(summary: &str, syscall: &str) -> Option<u64> {
    summary.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.last() != Some(&syscall) || fields.len() < 5 {
            return None;
        }
        fields[3].parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strace_summary_parses() {
        let summary = "% time     seconds  usecs/call     calls    errors syscall\n\
                       ------ ----------- ----------- --------- --------- ----------------\n\
                       100.00    1.218534          41     29720        12 bpf\n\
                       ------ ----------- ----------- --------- --------- ----------------\n\
                       100.00    1.218534          41     29720        12 total\n";
        assert_eq!(strace_calls(summary, "bpf"), Some(29720));
        let no_errors = "100.00    0.000310           3        97           bpf\n";
        assert_eq!(strace_calls(no_errors, "bpf"), Some(97));
        assert_eq!(strace_calls(summary, "read"), None);
    }

    #[test]
    fn whole_stacks_are_counted_from_folded_lines_and_perf_script() {
        let folded = "qsortunits;_start;main;sort_round;qsort;msort;cmp 7\n\
                      qsortunits;cmp 2\n\
                      other;main 5\n\
                      not a line\n";
        assert_eq!(
            folded_whole_stacks(folded),
            WholeStacks {
                samples: 9,
                reaching_main: 7
            }
        );
        let script =
            "qsortunits \n\t    55d0c0 cmp (/w/qsortunits)\n\t    7f00 msort_with_tmp.part.0 \
                      (/usr/lib/libc.so.6)\n\t    55d2 main \
                      (/w/qsortunits)\n\nqsortunits \n\t    55d0c0 cmp (/w/qsortunits)\n\t    \
                      7f00 [unknown] ([unknown])\n\nsshd \n\t    1 main (/usr/sbin/sshd)\n\t    \
                      2 start (/x)\n";
        assert_eq!(
            perf_script_whole_stacks(script),
            WholeStacks {
                samples: 2,
                reaching_main: 1
            }
        );
    }

    #[test]
    fn worker_lines_parse_and_time_lost_is_their_gaps_share() {
        let (work, lost) = parse_worker(
            "sorts=17909 gaps=1453 gap_ns=30292806 covered_ns=2976471185 median_gap_ns=21477",
        )
        .unwrap();
        assert_eq!(work, 17909.0);
        assert_eq!(lost.gaps, 1453);
        assert_eq!(lost.median_gap_ns, 21477.0);
        assert!((lost.percent() - 1.0177).abs() < 1e-3, "{}", lost.percent());
        // The old worker's bare count, a missing field or a word where a count goes.
        assert!(parse_worker("95618").is_err());
        assert!(parse_worker("sorts=1 gaps=2 gap_ns=3 covered_ns=4").is_err());
        assert!(parse_worker("sorts=1 gaps=x gap_ns=3 covered_ns=4 median_gap_ns=5").is_err());
        assert!(Lost::default().percent().is_nan());
    }

    #[test]
    fn slowdown_is_work_lost() {
        assert!((slowdown_percent(1000.0, 905.0) - 9.5).abs() < 1e-9);
        assert!(slowdown_percent(0.0, 1.0).is_nan());
    }
}
