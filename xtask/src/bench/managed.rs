//! What walking a managed runtime's frames in BPF costs (`cargo xtask bench --only jvm`,
//! `--only node`), the one bench both runs: the runtime comes as a [`Subject`] (its flag,
//! its workloads, its names in the summary and `/metrics`), the measurement and the report
//! are the same.
//!
//! - **BPF per sample.** The runtime's deep workload, [`DEPTH`] frames of its own language
//!   deep (each level a frame of its own under the runtime's default flags), a fresh process
//!   for each recording, recorded after a warm-up by `scorch record --pid P -F 999` with the
//!   walk on and off (the native walk of the same process); beside them
//!   `tests/workloads/deeprec.c` 50 native frames deep, built without frame pointers (the
//!   native walk through unwind tables), on one stack throughout and on a new one each round
//!   (`deeprec ... vary`). Where the workload can keep one stack throughout
//!   ([`Subject::steady`]), it is recorded so too, the walk on: every sample of the others
//!   is a stack not seen before, whose store costs any walk the same kind of extra, and this
//!   row shows the walk without it. The IRQ work interrupts over each recording show the
//!   store's part (the allocator's refills). The order turns by run. BPF ns per sample from
//!   `bpf_stats` (scorch's summary), the runtime's frames per sample the BPF walk emitted
//!   (the summary's `RUNTIME: N frames`), and the workload's own frames per sample in the
//!   profile written, which show the depth was walked and named.
//! - **Daemon with 5 processes and with none.** A fresh `scorch run` at 19 Hz beside 5 fresh
//!   processes of the runtime (one busy thread each) with the walk on, the same with it off,
//!   and on with none running, the order turning by run: after a warm-up, the daemon's CPU
//!   over the measured span (its own cgroup), its median RSS (`VmRSS` once a second), its BPF
//!   maps, the memory its names took in the last window (`scorch_runtime_names_bytes`) and
//!   the frames it walked (`/metrics`).

use std::{
    fmt::Write as _,
    path::Path,
    process::{Child, Command},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::{
    bench::{
        harness::{start_daemon, stop},
        measure::{
            command_output, folded_user_stacks, irq_work_interrupts, load_average, median,
            metric_value, metrics_text, path_str, sample_rss, summary_bpf_ns, summary_samples,
            verdict, with_bpf_stats, CpuAccount, Processes,
        },
        report::table_markdown,
        results::{BenchResult, Cell, Table},
        Bench,
    },
    run_command,
};

/// Frames of the deep stacks, the runtime's and native.
pub const DEPTH: usize = 50;
const RECORDING: &str = "10s";
const PROCESSES: usize = 5;
const WARM_UP: Duration = Duration::from_secs(20);
const SPAN: Duration = Duration::from_secs(60);
/// Target: the BPF cost of a sample of a 50-frame stack of the runtime's.
const TARGET_NS: f64 = 5000.0;

/// A runtime the bench measures.
pub struct Subject {
    pub bench: Bench,
    /// The agent's switch for its walk (`--jvm`).
    pub flag: &'static str,
    /// Its name in scorch's summary (`hotspot: N frames`) and `/metrics` labels.
    pub runtime: &'static str,
    /// Its language, and what a process of it is called, one and several (`Java`, `JVM`,
    /// `JVMs`).
    pub language: &'static str,
    pub process: &'static str,
    pub processes: &'static str,
    /// The runtime's version, for the report.
    pub version: String,
    /// `127.0.0.1:PORT` for the daemons.
    pub address: &'static str,
    /// Starts the deep workload: `DEPTH` frames of the runtime's, for `seconds`; with one
    /// stack throughout when the third argument says (and [`Subject::steady`]).
    pub deep: Box<dyn Fn(usize, u64, bool) -> Result<Child>>,
    /// Whether the deep workload can keep one stack throughout.
    pub steady: bool,
    /// From its start to its recording: its levels compiled by then.
    pub deep_warm_up: Duration,
    /// Whether a frame of the profile is one of the deep workload's own.
    pub ours: fn(&str) -> bool,
    /// Starts a process of one busy thread, for `seconds`.
    pub busy: Box<dyn Fn(u64) -> Result<Child>>,
    /// From the busy processes' start to the daemon's.
    pub busy_warm_up: Duration,
    /// What the walk table's note says of the deep workload.
    pub deep_note: &'static str,
    /// What the daemon table's note says of the busy processes.
    pub busy_note: &'static str,
}

pub fn managed(
    subject: &Subject,
    root: &Path,
    scorch: &Path,
    runs: usize,
    command: String,
) -> Result<BenchResult> {
    let dir = std::env::temp_dir().join(format!("scorch-bench-{}", subject.bench.name()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let deeprec = dir.join("deeprec");
    run_command(
        Command::new("gcc")
            .args(["-O2", "-fomit-frame-pointer", "-g", "-o"])
            .arg(&deeprec)
            .arg(root.join("tests/workloads/deeprec.c")),
    )?;
    let load_before = load_average();
    let (costs, daemons) = with_bpf_stats(|| {
        let costs = walk_costs(subject, scorch, &deeprec, &dir, runs.max(5))?;
        let daemons = daemon_costs(subject, scorch, &dir, runs)?;
        Ok((costs, daemons))
    })?;
    let load_after = load_average();

    let walk = walk_table(subject, &costs);
    let daemon = daemon_table(subject, &daemons);
    let mut out = String::new();
    let commit = command_output("git", &["rev-parse", "--short", "HEAD"]);
    writeln!(out, "# {} walk cost, commit {commit}\n", subject.language)?;
    writeln!(
        out,
        "`cargo xtask bench --only {}`: medians of fresh processes, [min-max]; {}; load \
         average {load_before} at the start, {load_after} at the end.\n",
        subject.bench.name(),
        subject.version,
    )?;
    out += &markdown(&walk);
    let of = |kind: Kind, f: &dyn Fn(&WalkCost) -> f64| {
        median(costs.iter().filter(|c| c.kind == kind).map(f).collect())
    };
    let on = of(Kind::On, &|c| c.ns);
    let per_frame = (on - of(Kind::Off, &|c| c.ns)) / of(Kind::On, &|c| c.frames);
    writeln!(
        out,
        "\nTarget, at most 5 us a sample on a {DEPTH}-frame {} stack: {}. The walk costs \
         {per_frame:.0} ns a frame (`{} auto` less `{} off`, over the frames it walked); the \
         native walk through unwind tables {:.0} ns a frame.\n",
        subject.language,
        verdict(on <= TARGET_NS, "5 us"),
        subject.flag,
        subject.flag,
        of(Kind::Native, &|c| c.ns) / of(Kind::Native, &|c| c.profile_frames),
    )?;
    let new_stack = |new: Kind, steady: Kind| of(new, &|c| c.ns) - of(steady, &|c| c.ns);
    if subject.steady {
        writeln!(
            out,
            "A new stack each sample costs {} {:+.0} ns a sample against one stack throughout, \
             and the native walk {:+.0} ns: the store of a stack not seen before, whose map \
             takes a new element, and the IRQ work the kernel's allocator raises to refill \
             its cache ({:.2} and {:.2} a sample).\n",
            subject.language,
            new_stack(Kind::On, Kind::Steady),
            new_stack(Kind::NativeNew, Kind::Native),
            of(Kind::On, &|c| c.irq_work),
            of(Kind::NativeNew, &|c| c.irq_work),
        )?;
    }
    out += &markdown(&daemon);
    let of = |mode: Mode, f: &dyn Fn(&DaemonCost) -> f64| {
        median(daemons.iter().filter(|d| d.mode == mode).map(f).collect())
    };
    let footprint = |d: &DaemonCost| d.rss_mib + d.maps_mib;
    writeln!(
        out,
        "\nWith {PROCESSES} {} walked, against none running: {:+.2}% of a core, {:+.1} MiB of \
         RSS + maps. Against `{} off` beside the same processes: {:+.2}% of a core, {:+.1} MiB \
         of RSS, {:+.1} MiB of BPF maps. The names of a window take {:.0} KiB \
         (`scorch_runtime_names_bytes`, at the window's end).",
        subject.processes,
        of(Mode::On, &|d| d.core_percent) - of(Mode::None, &|d| d.core_percent),
        of(Mode::On, &footprint) - of(Mode::None, &footprint),
        subject.flag,
        of(Mode::On, &|d| d.core_percent) - of(Mode::Off, &|d| d.core_percent),
        of(Mode::On, &|d| d.rss_mib) - of(Mode::Off, &|d| d.rss_mib),
        of(Mode::On, &|d| d.maps_mib) - of(Mode::Off, &|d| d.maps_mib),
        of(Mode::On, &|d| d.names_kib),
    )?;
    let path = root.join(format!("target/bench/{}.md", subject.bench.name()));
    std::fs::create_dir_all(path.parent().context("bench dir")?)?;
    std::fs::write(&path, &out)?;
    print!("{out}");
    eprintln!("bench: report written to {}", path.display());

    let mut result = BenchResult::new(subject.bench, command);
    result.tables = vec![walk, daemon];
    Ok(result)
}

/// A table as the report's markdown: its title, then the table as `docs/benchmarks.md` has
/// it.
fn markdown(table: &Table) -> String {
    let mut out = format!("## {}\n\n", table.title);
    table_markdown(&mut out, table);
    out
}

fn walk_table(subject: &Subject, costs: &[WalkCost]) -> Table {
    let language = subject.language;
    let mut walk = Table::new(
        "walk",
        &format!(
            "BPF per sample, {DEPTH} frames deep, `scorch record --pid P -F 999 --duration \
             {RECORDING}`"
        ),
        "stack, walk",
        &[
            "BPF ns/sample",
            &format!("{language} frames/sample (BPF walk)"),
            "its frames/sample (profile)",
            "IRQ work/sample",
        ],
    )
    .with_note(subject.deep_note);
    for kind in Kind::ALL {
        let rows: Vec<&WalkCost> = costs.iter().filter(|c| c.kind == kind).collect();
        if rows.is_empty() {
            continue;
        }
        let column = |f: &dyn Fn(&WalkCost) -> f64, decimals| {
            Cell::of(&rows.iter().map(|c| f(c)).collect::<Vec<_>>(), decimals)
        };
        walk.row(
            kind.label(subject),
            vec![
                column(&|c| c.ns, 0),
                if matches!(kind, Kind::Native | Kind::NativeNew) {
                    Cell::Missing
                } else {
                    column(&|c| c.frames, 1)
                },
                column(&|c| c.profile_frames, 1),
                column(&|c| c.irq_work, 2),
            ],
        );
    }
    walk
}

fn daemon_table(subject: &Subject, daemons: &[DaemonCost]) -> Table {
    let mut daemon = Table::new(
        "daemon",
        &format!(
            "The daemon at 19 Hz beside {PROCESSES} {} and beside none, {} s measured after {} s",
            subject.processes,
            SPAN.as_secs(),
            WARM_UP.as_secs()
        ),
        "",
        &[
            "CPU, % of a core",
            "RSS MiB",
            "BPF maps MiB",
            "RSS + maps MiB",
            &format!("{} names KiB", subject.language),
            &format!("{} frames/s", subject.language),
            &format!("{} walked", subject.processes),
        ],
    )
    .with_note(subject.busy_note);
    for mode in Mode::ALL {
        let rows: Vec<&DaemonCost> = daemons.iter().filter(|d| d.mode == mode).collect();
        let column = |f: &dyn Fn(&DaemonCost) -> f64, decimals| {
            Cell::of(&rows.iter().map(|d| f(d)).collect::<Vec<_>>(), decimals)
        };
        daemon.row(
            mode.label(subject),
            vec![
                column(&|d| d.core_percent, 2),
                column(&|d| d.rss_mib, 1),
                column(&|d| d.maps_mib, 1),
                column(&|d| d.rss_mib + d.maps_mib, 1),
                column(&|d| d.names_kib, 0),
                column(&|d| d.frames, 0),
                column(&|d| d.walked, 0),
            ],
        );
    }
    daemon
}

/// What a daemon of the second part runs beside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The processes, walked.
    On,
    /// The processes, not walked (the flag `off`).
    Off,
    /// None running (the walk on).
    None,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::On, Mode::Off, Mode::None];

    fn label(self, subject: &Subject) -> String {
        match self {
            Mode::On => format!("scorch `{} auto`, 5 {}", subject.flag, subject.processes),
            Mode::Off => format!("scorch `{} off`, 5 {}", subject.flag, subject.processes),
            Mode::None => format!("scorch `{} auto`, no {}", subject.flag, subject.process),
        }
    }

    fn value(self) -> &'static str {
        match self {
            Mode::On | Mode::None => "auto",
            Mode::Off => "off",
        }
    }
}

/// What one recording of the first part walks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The deep workload, the walk on.
    On,
    /// The deep workload with one stack throughout, the walk on.
    Steady,
    /// The deep workload, the walk off.
    Off,
    /// deeprec, through unwind tables.
    Native,
    /// deeprec drawing a new stack each round (`vary`), through unwind tables: what storing
    /// a new stack each sample costs a walk that is not the runtime's.
    NativeNew,
}

impl Kind {
    const ALL: [Kind; 5] = [
        Kind::On,
        Kind::Steady,
        Kind::Off,
        Kind::Native,
        Kind::NativeNew,
    ];

    fn label(self, subject: &Subject) -> String {
        match self {
            Kind::On => format!("{}, `{} auto`", subject.language, subject.flag),
            Kind::Steady => format!(
                "{}, `{} auto`, one stack throughout",
                subject.language, subject.flag
            ),
            Kind::Off => format!("{}, `{} off`", subject.language, subject.flag),
            Kind::Native => "native (C, unwind tables), one stack throughout".into(),
            Kind::NativeNew => "native (C, unwind tables)".into(),
        }
    }

    /// Whether a frame of the profile is one of the workload's own.
    fn ours(self, subject: &Subject, frame: &str) -> bool {
        match self {
            Kind::On | Kind::Steady | Kind::Off => (subject.ours)(frame),
            Kind::Native => matches!(frame, "main" | "descend" | "spin"),
            Kind::NativeNew => matches!(frame, "main" | "vary") || frame.starts_with("step_"),
        }
    }
}

struct WalkCost {
    kind: Kind,
    ns: f64,
    /// The runtime's frames the BPF walk emitted a sample.
    frames: f64,
    /// The workload's own frames a sample in the profile written (inlined functions each).
    profile_frames: f64,
    /// IRQ work interrupts on all CPUs over the recording, a sample: the kernel's allocator
    /// raises them as a map that is not preallocated takes new elements (a stack not seen
    /// before), and each is an interrupt the sampler's run pays for (a VM exit on a guest
    /// without posted interrupts). NaN where `/proc/interrupts` has no such line.
    irq_work: f64,
}

/// The frames a summary says runtime `runtime`'s walk emitted.
fn summary_runtime_frames(summary: &str, runtime: &str) -> f64 {
    summary
        .split(&format!("{runtime}: "))
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// The mean count a sample in folded text of the user frames `ours` takes.
fn frames_per_sample(folded: &str, ours: impl Fn(&str) -> bool) -> f64 {
    let (mut frames, mut samples) = (0u64, 0u64);
    for (_, user, count) in folded_user_stacks(folded) {
        frames += user.iter().filter(|f| ours(f)).count() as u64 * count;
        samples += count;
    }
    frames as f64 / samples.max(1) as f64
}

fn walk_costs(
    subject: &Subject,
    scorch: &Path,
    deeprec: &Path,
    dir: &Path,
    runs: usize,
) -> Result<Vec<WalkCost>> {
    let mut costs = Vec::new();
    let seconds = subject.deep_warm_up.as_secs() + 60;
    for run in 0..runs {
        let mut order = Kind::ALL;
        order.rotate_left(run % Kind::ALL.len());
        for kind in order {
            if kind == Kind::Steady && !subject.steady {
                continue;
            }
            let (process, warm_up) = match kind {
                Kind::On | Kind::Off | Kind::Steady => (
                    (subject.deep)(DEPTH, seconds, kind == Kind::Steady)?,
                    subject.deep_warm_up,
                ),
                // main + DEPTH - 2 descend + spin (`deeprec N` descends N + 1 times), or
                // main + vary + DEPTH - 2 steps.
                Kind::Native | Kind::NativeNew => {
                    let new = kind == Kind::NativeNew;
                    let depth = if new { DEPTH - 2 } else { DEPTH - 3 };
                    (
                        Command::new(deeprec)
                            .args([depth.to_string(), seconds.to_string()])
                            .args(new.then_some("vary"))
                            .spawn()
                            .context("starting deeprec")?,
                        Duration::from_millis(500),
                    )
                }
            };
            let process = Processes(vec![process]);
            std::thread::sleep(warm_up);
            let pid = process.0[0].id().to_string();
            let mode = if kind == Kind::Off { "off" } else { "auto" };
            let folded = dir.join("walk.folded");
            let irq_work_before = irq_work_interrupts();
            let output = Command::new(scorch)
                .args([
                    "record",
                    "--pid",
                    &pid,
                    "-F",
                    "999",
                    "--duration",
                    RECORDING,
                ])
                .args([subject.flag, mode, "-o", path_str(&folded)?])
                .stderr(std::process::Stdio::null())
                .output()
                .context("running scorch record")?;
            let irq_work = irq_work_interrupts()
                .zip(irq_work_before)
                .map(|(after, before)| after.saturating_sub(before));
            drop(process);
            let summary = String::from_utf8_lossy(&output.stdout).trim().to_owned();
            if !output.status.success() {
                bail!(
                    "scorch record ({}) exited with {}",
                    kind.label(subject),
                    output.status
                );
            }
            let samples = summary_samples(&summary).max(1) as f64;
            let ns = summary_bpf_ns(&summary)
                .with_context(|| format!("no BPF cost in scorch's summary: {summary}"))?;
            let frames = summary_runtime_frames(&summary, subject.runtime) / samples;
            let irq_work = irq_work.map_or(f64::NAN, |n| n as f64 / samples);
            let profile_frames = frames_per_sample(&std::fs::read_to_string(&folded)?, |f| {
                kind.ours(subject, f)
            });
            eprintln!(
                "bench: {} walk, {}: {ns:.0} ns/sample, {frames:.1} frames/sample walked, \
                 {profile_frames:.1} of its frames/sample in the profile, {irq_work:.2} IRQ \
                 work interrupts/sample; {summary}",
                subject.bench.name(),
                kind.label(subject)
            );
            costs.push(WalkCost {
                kind,
                ns,
                frames,
                profile_frames,
                irq_work,
            });
        }
    }
    Ok(costs)
}

struct DaemonCost {
    mode: Mode,
    core_percent: f64,
    rss_mib: f64,
    maps_mib: f64,
    /// The names of the last window (`/metrics`).
    names_kib: f64,
    /// Frames walked a second, and processes walked (`/metrics`): the path measured.
    frames: f64,
    walked: f64,
}

fn daemon_costs(
    subject: &Subject,
    scorch: &Path,
    dir: &Path,
    runs: usize,
) -> Result<Vec<DaemonCost>> {
    // Long enough for one daemon, with a minute to spare: the processes stop by themselves.
    let seconds = (subject.busy_warm_up + WARM_UP + SPAN + Duration::from_secs(60)).as_secs();
    let mut daemons = Vec::new();
    for run in 0..runs {
        let mut order = Mode::ALL;
        order.rotate_left(run % Mode::ALL.len());
        for mode in order {
            let processes = if mode == Mode::None {
                Processes(Vec::new())
            } else {
                let processes = Processes(
                    (0..PROCESSES)
                        .map(|_| (subject.busy)(seconds))
                        .collect::<Result<_>>()?,
                );
                // Past their start and their first compilations.
                std::thread::sleep(subject.busy_warm_up);
                processes
            };
            let store = dir.join(format!("store-{run}-{}", mode.value()));
            let cost = daemon_run(subject, scorch, &store, mode)?;
            drop(processes);
            let _ = std::fs::remove_dir_all(&store);
            eprintln!(
                "bench: daemon, {}: {:.2}% of a core, RSS {:.1} MiB, maps {:.1} MiB, names \
                 {:.0} KiB, {:.0} frames/s from {} processes",
                mode.label(subject),
                cost.core_percent,
                cost.rss_mib,
                cost.maps_mib,
                cost.names_kib,
                cost.frames,
                cost.walked
            );
            daemons.push(cost);
        }
    }
    Ok(daemons)
}

fn daemon_run(subject: &Subject, scorch: &Path, store: &Path, mode: Mode) -> Result<DaemonCost> {
    let daemon = start_daemon(
        scorch,
        store,
        19,
        subject.address,
        &[subject.flag, mode.value()],
    )?;
    let pid = daemon.0[0].id();
    let account = CpuAccount::of_process(pid)?;
    std::thread::sleep(WARM_UP);
    let before = account.cpu_seconds()?;
    let started = Instant::now();
    let rss = sample_rss(pid, SPAN, Duration::from_secs(1))?;
    let cpu = account.cpu_seconds()? - before;
    let elapsed = started.elapsed().as_secs_f64();
    let metrics = metrics_text(subject.address)?;
    let maps = metric_value(&metrics, "scorch_bpf_map_memory_bytes")
        .context("no scorch_bpf_map_memory_bytes in /metrics")?
        / (1 << 20) as f64;
    // With the walk off the daemon has no counters of the runtime's at all.
    let counter = |name: &str| {
        metric_value(
            &metrics,
            &format!(r#"{name}{{runtime="{}"}}"#, subject.runtime),
        )
        .unwrap_or(0.0)
    };
    let frames = counter("scorch_runtime_frames_total") / (WARM_UP + SPAN).as_secs_f64();
    let names_kib = counter("scorch_runtime_names_bytes") / 1024.0;
    let walked = metric_value(&metrics, "scorch_runtime_processes").unwrap_or(0.0);
    stop(daemon).with_context(|| format!("scorch run, {}", mode.label(subject)))?;
    drop(account);
    Ok(DaemonCost {
        mode,
        core_percent: cpu / elapsed * 100.0,
        rss_mib: median(rss),
        maps_mib: maps,
        names_kib,
        frames,
        walked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_and_folded_text_give_frames_per_sample() {
        let summary = "scorch: 9990 samples from 1 processes in 10.00s (1 windows); lost: none; \
                       hotspot: 489510 frames, stops: none; BPF 3100 ns/sample";
        assert_eq!(summary_runtime_frames(summary, "hotspot"), 489_510.0);
        assert_eq!(summary_runtime_frames(summary, "v8"), 0.0);
        assert_eq!(
            summary_runtime_frames("scorch: 3 samples; lost: none", "hotspot"),
            0.0
        );
        let folded = "java;start_thread;JavaDepth.main;JavaDepth.run;JavaDepth$A.down 3\n\
                      java;start_thread;JavaDepth.main;read_[k] 1\nnot a line\n";
        let java = |f: &str| f.starts_with("JavaDepth");
        assert_eq!(frames_per_sample(folded, java), 2.5);
        assert_eq!(frames_per_sample("", java), 0.0);
    }
}
