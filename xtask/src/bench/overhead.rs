//! `cargo xtask bench --only overhead`: what scorch costs a host, beside its peers, written as
//! one markdown table (`target/bench/overhead.md`) with the machine, kernel and commit.
//!
//! Each run is made of fresh processes, and the runs alternate which tool starts first:
//!
//! - **Capture.** `scorch record`, `perf record -F 19 -a -g` and bpftrace's `profile:hz:19`
//!   equivalent each record the same seconds while a workload keeps every CPU busy, one after
//!   another, so each profiles the workload alone: side by side (as `--only record` runs
//!   them), scorch also unwinds and names bpftrace's start-up, LLVM compiling its program, in
//!   the runs where it samples it, and its figures follow that rather than its own cost.
//!   CPU time (user + system) and peak RSS from `/usr/bin/time -v`; BPF ns per sample from the
//!   kernel's `bpf_stats` (scorch prints its own; bpftrace's is read from its fdinfo).
//! - **Daemon under process churn.** A fresh `scorch run` with the busy workload: after a
//!   warm-up (with a second of kernel work, so its kernel symbols are loaded as on any host),
//!   its quiet steady RSS (median of one sample a second); then a shell loop starts
//!   `python3 -c pass` and `/bin/true` as fast as it can, and the daemon's CPU over the churn
//!   (from a cgroup of its own, to the microsecond: see [`CpuAccount`]) and its peak RSS
//!   (`VmHWM`, reset as the churn starts, so the start-up's peak is reported apart) are
//!   taken; then the churn stops, and the RSS a minute later says whether the memory went
//!   back. BPF map memory comes from the
//!   daemon's own `/metrics`.
//! - **Frequency.** The daemon at 19, 99 and 999 Hz on the busy workload: CPU per second of
//!   wall time (from its cgroup, as in the churn) and its BPF programs' run time, to show how
//!   cost scales with the sampling rate. A minute per rate: at 19 Hz the daemon spends tens of
//!   milliseconds a window, and over two windows the runs disagreed severalfold.

use std::{
    fmt::Write as _,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use crate::bench::{
    capture::{capture, summary_tables, CaptureRun, Together},
    harness::{kernel_work, run_churn, start_daemon, stop},
    measure::{
        bpf_run_seconds, busy_workload, cargo_bench, command_output, daemon_metric, median,
        sample_rss, spread, status_kib, with_bpf_stats, CpuAccount, Processes, Usage,
    },
    results::{BenchResult, Cell, Host, Table},
    Bench,
};

/// The daemon's HTTP address during the bench (a port the tests do not use).
const ADDRESS: &str = "127.0.0.1:17093";

/// How long each phase of the daemon runs, in seconds.
#[derive(Debug, Clone, Copy)]
pub struct Phases {
    pub capture: u64,
    pub warm_up: u64,
    pub quiet: u64,
    pub churn: u64,
    pub after: u64,
    pub per_frequency: u64,
}

impl Phases {
    /// The figures: 60 s of churn after warm-up, RSS a minute after it stops.
    pub fn standard(capture: u64) -> Phases {
        Phases {
            capture,
            warm_up: 20,
            quiet: 20,
            churn: 60,
            after: 60,
            per_frequency: 60,
        }
    }
}

#[derive(Debug, Default, Clone)]
struct ChurnRun {
    quiet_rss: f64,
    /// The peak before the churn: start-up and warm-up.
    start_peak_rss: f64,
    /// The peak during the churn alone (VmHWM reset as it starts).
    peak_rss: f64,
    churn_core_percent: f64,
    /// Processes whose maps the daemon read and described (`scorch_unwind_processes_read`)
    /// during the churn, a second; NaN for a build without the counter.
    reads_per_second: f64,
    /// The daemon's CPU over the churn per process read, in µs: what a capture costs it,
    /// with everything else it did meanwhile.
    cpu_us_per_read: f64,
    /// Its BPF programs over the churn (run in the sampled tasks, not in its own CPU time).
    churn_bpf_percent: f64,
    after_rss: f64,
    /// The parsed binaries and debug info the daemon held as the churn ended
    /// (`scorch_symbol_cache_bytes`): what naming the churned programs' frames keeps.
    symbol_cache_mib: f64,
    map_memory_mib: f64,
    /// Of the maps, the unwinder's row pools (NaN for a build without the gauge): the part
    /// that grows with the distinct binaries the churn runs.
    row_pools_mib: f64,
    processes_started: u64,
}

pub fn overhead(
    root: &Path,
    scorch: &Path,
    runs: usize,
    phases: Phases,
    command: String,
) -> Result<BenchResult> {
    let dir = root.join("target/bench");
    let busy = busy_workload(root, &dir)?;
    let cpus = std::thread::available_parallelism()?.get();
    let (captures, churns, frequencies) = with_bpf_stats(|| {
        let mut captures = Vec::new();
        let mut churns = Vec::new();
        let mut frequencies: Vec<Vec<RateCost>> = Vec::new();
        for run in 0..runs {
            eprintln!("overhead: run {} of {runs}", run + 1);
            captures.push(capture(
                scorch,
                &busy,
                cpus,
                &dir,
                run,
                phases.capture,
                Together::InTurn,
            )?);
            churns.push(churn(scorch, &[], &busy, cpus, &dir, phases)?);
            frequencies.push(frequency_curve(scorch, &busy, cpus, &dir, run, phases)?);
        }
        Ok((captures, churns, frequencies))
    })?;
    let mut report = render(cpus, runs, phases, &captures, &churns, &frequencies)?;
    report.push_str(&footprint(root, scorch));
    let path = dir.join("overhead.md");
    std::fs::write(&path, &report)?;
    print!("{report}");
    eprintln!("overhead: report written to {}", path.display());

    let mut result = BenchResult::new(Bench::Overhead, command);
    result.tables = vec![
        capture_table(phases, &captures),
        churn_results(phases, &[("`scorch run`", &churns)]),
        frequency_table(phases, &frequencies),
        disk_table(root),
    ];
    Ok(result)
}

/// The capture as data: each tool's CPU, memory and BPF cost, alone with the workload.
fn capture_table(phases: Phases, captures: &[CaptureRun]) -> Table {
    let mut table = Table::new(
        "capture",
        &format!(
            "Recording {} s at 19 Hz, every CPU busy, each tool alone in turn",
            phases.capture
        ),
        "tool",
        &[
            "CPU s",
            "peak RSS MiB",
            "peak RSS after the BPF load MiB",
            "BPF maps MiB",
            "peak RSS + maps MiB",
            "BPF ns/sample",
        ],
    )
    .with_note(
        "CPU time (user + system) and peak RSS from `/usr/bin/time -v`. BPF maps: the kernel \
         memory of the maps each tool held a second before it stopped (`memlock` in its \
         fdinfo), which no RSS counts and its memory cgroup is charged for; RSS + maps adds \
         them run by run. BPF ns/sample from the kernel's `bpf_stats`.",
    );
    let values = |f: &dyn Fn(&CaptureRun) -> Option<f64>| -> Vec<f64> {
        captures.iter().map(|c| f(c).unwrap_or(f64::NAN)).collect()
    };
    let usage = |tool: fn(&CaptureRun) -> Usage| {
        (
            Cell::of(&values(&|c| Some(tool(c).cpu_seconds)), 2),
            Cell::of(&values(&|c| Some(tool(c).max_rss_mib)), 1),
        )
    };
    let (cpu, rss) = usage(|c| c.scorch);
    table.row(
        "`scorch record`",
        vec![
            cpu,
            rss,
            Cell::of(&values(&|c| c.scorch_after_load_rss), 1),
            Cell::of(&values(&|c| c.scorch_maps), 1),
            Cell::of(&values(&|c| Some(c.scorch.max_rss_mib + c.scorch_maps?)), 1),
            Cell::of(&values(&|c| c.scorch_bpf_ns), 0),
        ],
    );
    // perf holds no BPF maps: its footprint is its RSS.
    let (cpu, rss) = usage(|c| c.perf);
    table.row(
        "`perf record -g`",
        vec![
            cpu,
            rss.clone(),
            Cell::Missing,
            Cell::text("none"),
            rss,
            Cell::Missing,
        ],
    );
    let (cpu, rss) = usage(|c| c.bpftrace);
    table.row(
        "bpftrace `profile:hz:19`",
        vec![
            cpu,
            rss,
            Cell::Missing,
            Cell::of(&values(&|c| c.bpftrace_maps), 1),
            Cell::of(
                &values(&|c| Some(c.bpftrace.max_rss_mib + c.bpftrace_maps?)),
                1,
            ),
            Cell::of(&values(&|c| c.bpftrace_bpf_ns), 0),
        ],
    );
    table
}

/// The churn as data, a row per daemon.
fn churn_results(phases: Phases, rows: &[(&str, &[ChurnRun])]) -> Table {
    let mut table = Table::new(
        "churn",
        &format!(
            "`scorch run` at 19 Hz under {} s of `python3 -c pass` and `/bin/true` in a loop, \
             every CPU busy",
            phases.churn
        ),
        "daemon",
        &[
            "quiet RSS MiB",
            "peak RSS during the churn MiB",
            "CPU during the churn, % of a core",
            "its BPF programs, % of a core",
            "BPF maps MiB",
            "RSS a minute after MiB",
            "processes started",
        ],
    )
    .with_note(
        "The daemon's CPU from a cgroup of its own; its BPF programs' from `bpf_stats` (they run \
         in the sampled tasks). The peak RSS (VmHWM) is reset as the churn starts, so start-up \
         is not in it. BPF maps from its `/metrics` at the churn's end.",
    );
    for (label, churns) in rows {
        let of = |f: fn(&ChurnRun) -> f64, decimals| {
            Cell::of(&churns.iter().map(f).collect::<Vec<_>>(), decimals)
        };
        table.row(
            *label,
            vec![
                of(|c| c.quiet_rss, 1),
                of(|c| c.peak_rss, 1),
                of(|c| c.churn_core_percent, 2),
                of(|c| c.churn_bpf_percent, 2),
                of(|c| c.map_memory_mib, 1),
                of(|c| c.after_rss, 1),
                of(|c| c.processes_started as f64, 0),
            ],
        );
    }
    table
}

/// The daemon's CPU by sampling rate as data.
fn frequency_table(phases: Phases, frequencies: &[Vec<RateCost>]) -> Table {
    let mut table = Table::new(
        "frequency",
        &format!(
            "`scorch run` CPU by sampling rate, {} s per rate, every CPU busy",
            phases.per_frequency
        ),
        "Hz",
        &[
            "daemon, % of a core",
            "its BPF programs, % of a core",
            "together",
        ],
    );
    for hz in [19, 99, 999] {
        let of = |part: fn(&RateCost) -> f64| -> Cell {
            let values: Vec<f64> = frequencies
                .iter()
                .filter_map(|curve| curve.iter().find(|c| c.hz == hz).map(part))
                .collect();
            Cell::of(&values, 2)
        };
        table.row(
            hz.to_string(),
            vec![of(|c| c.daemon), of(|c| c.bpf), of(|c| c.daemon + c.bpf)],
        );
    }
    table
}

/// The pair `cargo xtask build` ships, by size on disk.
fn disk_table(root: &Path) -> Table {
    let mut table = Table::new("disk", "On disk", "file", &["MB"]).with_note(
        "`scorch.debug` is the debug info, compressed, found through `.gnu_debuglink` when it \
         lies beside the binary.",
    );
    for (file, what) in [
        ("scorch", "`target/dist/scorch` (stripped)"),
        ("scorch.debug", "`target/dist/scorch.debug`"),
    ] {
        let size = std::fs::metadata(root.join("target/dist").join(file))
            .map_or(f64::NAN, |m| m.len() as f64 / 1e6);
        table.row(what, vec![Cell::one(size, 1)]);
    }
    table
}

/// The churn phase alone, for a change that touches the daemon's bookkeeping: `runs` runs of
/// `scorch`, each followed by one of `baseline` (a daemon built from an earlier commit) when
/// given, and, with `off_cpu`, by one of `scorch run --off-cpu`, so all see the same machine
/// state; the first to run changes each round. Medians side by side in
/// `target/bench/churn.md`.
pub fn churn_ab(
    root: &Path,
    scorch: &Path,
    baseline: Option<&Path>,
    off_cpu: bool,
    runs: usize,
    phases: Phases,
    command: String,
) -> Result<BenchResult> {
    let dir = root.join("target/bench");
    let busy = busy_workload(root, &dir)?;
    let cpus = std::thread::available_parallelism()?.get();
    let mut daemons: Vec<(String, &Path, &[&str])> =
        vec![(format!("`{}`", scorch.display()), scorch, &[])];
    if off_cpu {
        daemons.push((
            format!("`{}` with `--off-cpu`", scorch.display()),
            scorch,
            &["--off-cpu"],
        ));
    }
    if let Some(b) = baseline {
        daemons.push((format!("baseline `{}`", b.display()), b, &[]));
    }
    let figures = with_bpf_stats(|| {
        let mut figures: Vec<Vec<ChurnRun>> = vec![Vec::new(); daemons.len()];
        for run in 0..runs {
            // Rotate who goes first, so none always meets another's leftovers.
            for i in 0..daemons.len() {
                let d = (i + run) % daemons.len();
                let (label, binary, extra) = &daemons[d];
                eprintln!("churn: run {} of {runs}, {label}", run + 1);
                figures[d].push(churn(binary, extra, &busy, cpus, &dir, phases)?);
            }
        }
        Ok(figures)
    })?;
    let mut out = String::new();
    writeln!(
        out,
        "# `scorch run` under process churn: {} s, commit {}, {}",
        phases.churn,
        command_output("git", &["rev-parse", "--short", "HEAD"]),
        command_output("date", &["-u", "+%Y-%m-%d"]),
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "Medians of {runs} runs of fresh processes, {} (`cargo xtask bench --only churn{}{}`).",
        if daemons.len() > 1 {
            "the daemons in turn, the first changing each round"
        } else {
            "one daemon"
        },
        if off_cpu { " --off-cpu" } else { "" },
        if baseline.is_some() {
            " --baseline ..."
        } else {
            ""
        },
    )?;
    writeln!(out)?;
    let rows: Vec<(&str, &[ChurnRun])> = daemons
        .iter()
        .zip(&figures)
        .map(|((label, _, _), runs)| (label.as_str(), runs.as_slice()))
        .collect();
    churn_table(&mut out, phases, &rows)?;
    let baseline_runs = baseline.and(figures.last());
    capture_floor_note(root, &mut out, &figures[0], baseline_runs)?;
    let path = dir.join("churn.md");
    std::fs::write(&path, &out)?;
    print!("{out}");
    eprintln!("churn: report written to {}", path.display());
    let mut result = BenchResult::new(Bench::Churn, command);
    result.tables.push(churn_results(phases, &rows));
    Ok(result)
}

/// The least a capture costs, from `agent/benches/capture.rs`: `/proc/PID/maps` opened and
/// closed, and the daemon's own read of a process's code mappings, each on processes seen
/// for the first time. Its `capture:` lines.
fn capture_floor(root: &Path) -> Result<Vec<String>> {
    Ok(cargo_bench(root, "capture", |_| {})?
        .lines()
        .filter_map(|line| line.strip_prefix("capture: "))
        .map(str::to_owned)
        .collect())
}

/// The churn target of issue 25 (CPU within 10% of a daemon that captured nothing) as a
/// budget per process read of `current`, beside [`capture_floor`]'s figures.
fn capture_floor_note(
    root: &Path,
    out: &mut String,
    current: &[ChurnRun],
    baseline: Option<&Vec<ChurnRun>>,
) -> Result<()> {
    let floor = capture_floor(root)?;
    let reads = median(current.iter().map(|c| c.reads_per_second).collect());
    let own = median(current.iter().map(|c| c.cpu_us_per_read).collect());
    writeln!(
        out,
        "What one process read costs at least (`cargo bench -p scorch --bench capture`, \
         processes seen for the first time): {}. Over the churn the daemon spent {own:.0} µs of \
         CPU per process read, everything it did included, at {reads:.1} reads a second.",
        floor.join("; ")
    )?;
    if let Some(baseline) = baseline {
        let base = median(baseline.iter().map(|c| c.churn_core_percent).collect());
        // 10% of the baseline's CPU, in µs a second, shared among the reads of a second.
        let budget = base * 0.1 / 100.0 * 1e6 / reads;
        writeln!(
            out,
            "\nWithin 10% of the baseline's {base:.2}% of a core, a process read may cost \
             {budget:.1} µs."
        )?;
    }
    writeln!(out)?;
    Ok(())
}

fn churn(
    scorch: &Path,
    extra: &[&str],
    busy: &Path,
    cpus: usize,
    dir: &Path,
    phases: Phases,
) -> Result<ChurnRun> {
    let total = phases.warm_up + phases.quiet + phases.churn + phases.after + 30;
    let _workload = Processes(vec![Command::new(busy)
        .args([cpus.to_string(), total.to_string()])
        .spawn()?]);
    let store = dir.join("overhead-store");
    let _ = std::fs::remove_dir_all(&store);
    let daemon = start_daemon(scorch, &store, 19, ADDRESS, extra)?;
    let pid = daemon.0[0].id();
    let account = CpuAccount::of_process(pid)?;
    // The busy workload never enters the kernel, and the kernel's symbol table (about 5 MiB)
    // is read at the first kernel frame: without this, a run whose warm-up sampled none had a
    // quiet figure 9 MiB low, and the churn, full of kernel frames, seemed to leave that
    // behind. Any host's daemon names kernel frames; a second of reads from /dev/zero early in
    // the warm-up gives this one some.
    std::thread::sleep(Duration::from_secs(2));
    kernel_work()?;
    std::thread::sleep(Duration::from_secs(phases.warm_up.saturating_sub(2)));
    let quiet = sample_rss(
        pid,
        Duration::from_secs(phases.quiet),
        Duration::from_secs(1),
    )?;

    let counter = dir.join("overhead-churn-count");
    // The peak so far is the start-up's and the warm-up's: read it, then reset VmHWM so the
    // peak read after the churn is the churn's.
    let start_peak = status_kib(pid, "VmHWM:")? as f64 / 1024.0;
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .with_context(|| format!("resetting the peak RSS of {pid}"))?;
    // Read again after the quiet minute below: the counter moves when a window ends, and the
    // churn's last reads show in the window after it.
    let reads_before = daemon_metric(ADDRESS, READS).unwrap_or(f64::NAN);
    let cpu_before = account.cpu_seconds()?;
    let bpf_before = bpf_run_seconds(pid)?;
    let started = Instant::now();
    run_churn(phases.churn, &counter)?;
    let churn_cpu = account.cpu_seconds()? - cpu_before;
    let churn_bpf = bpf_run_seconds(pid)? - bpf_before;
    let churn_seconds = started.elapsed().as_secs_f64();
    let peak = status_kib(pid, "VmHWM:")? as f64 / 1024.0;
    let symbol_cache =
        daemon_metric(ADDRESS, "scorch_symbol_cache_bytes").unwrap_or(f64::NAN) / (1 << 20) as f64;
    std::thread::sleep(Duration::from_secs(phases.after.saturating_sub(5)));
    let after = sample_rss(pid, Duration::from_secs(5), Duration::from_secs(1))?;
    let map_memory = daemon_metric(ADDRESS, "scorch_bpf_map_memory_bytes").unwrap_or(f64::NAN);
    let reads = daemon_metric(ADDRESS, READS).unwrap_or(f64::NAN) - reads_before;
    let row_pools = daemon_metric(ADDRESS, "scorch_unwind_row_pools_bytes").unwrap_or(f64::NAN);
    stop(daemon)?;
    Ok(ChurnRun {
        quiet_rss: median(quiet),
        start_peak_rss: start_peak,
        peak_rss: peak,
        churn_core_percent: 100.0 * churn_cpu / churn_seconds,
        reads_per_second: reads / churn_seconds,
        cpu_us_per_read: 1e6 * churn_cpu / reads,
        churn_bpf_percent: 100.0 * churn_bpf / churn_seconds,
        after_rss: median(after),
        symbol_cache_mib: symbol_cache,
        map_memory_mib: map_memory / (1 << 20) as f64,
        row_pools_mib: row_pools / (1 << 20) as f64,
        processes_started: std::fs::read_to_string(&counter)?.trim().parse()?,
    })
}

/// The daemon's count of processes whose maps it read (first samples, libraries loading,
/// asked again).
const READS: &str = "scorch_unwind_processes_read_total";

/// What the daemon costs at one sampling rate, in % of one core.
#[derive(Debug, Clone, Copy)]
struct RateCost {
    hz: u64,
    /// The daemon's own threads: draining, naming, storing.
    daemon: f64,
    /// Its BPF programs, which run in the sampled tasks and so in no process's CPU time.
    bpf: f64,
}

/// The daemon's cost at 19, 99 and 999 Hz, in an order that rotates by run.
fn frequency_curve(
    scorch: &Path,
    busy: &Path,
    cpus: usize,
    dir: &Path,
    run: usize,
    phases: Phases,
) -> Result<Vec<RateCost>> {
    let mut rates = vec![19, 99, 999];
    rates.rotate_left(run % 3);
    let mut curve = Vec::new();
    for hz in rates {
        let seconds = phases.per_frequency;
        let _workload = Processes(vec![Command::new(busy)
            .args([cpus.to_string(), (seconds + 30).to_string()])
            .spawn()?]);
        let store = dir.join(format!("overhead-store-{hz}"));
        let _ = std::fs::remove_dir_all(&store);
        let daemon = start_daemon(scorch, &store, hz, ADDRESS, &[])?;
        let pid = daemon.0[0].id();
        let account = CpuAccount::of_process(pid)?;
        // One window of warm-up: the first parses the binaries. The measured seconds then hold
        // whole windows, each with its drain.
        std::thread::sleep(Duration::from_secs(11));
        let before = account.cpu_seconds()?;
        let bpf_before = bpf_run_seconds(pid)?;
        let started = Instant::now();
        std::thread::sleep(Duration::from_secs(seconds));
        let cpu = account.cpu_seconds()? - before;
        let bpf = bpf_run_seconds(pid)? - bpf_before;
        let elapsed = started.elapsed().as_secs_f64();
        curve.push(RateCost {
            hz,
            daemon: 100.0 * cpu / elapsed,
            bpf: 100.0 * bpf / elapsed,
        });
        stop(daemon)?;
    }
    curve.sort_by_key(|cost| cost.hz);
    Ok(curve)
}

/// The binaries' size on disk: the one measured, and the pair `cargo xtask build` ships.
fn footprint(root: &Path, scorch: &Path) -> String {
    let megabytes = |path: &Path| {
        std::fs::metadata(path).map_or_else(
            |_| "missing".to_owned(),
            |m| format!("{:.1} MB", m.len() as f64 / 1e6),
        )
    };
    let dist = root.join("target/dist");
    format!(
        "\n## On disk\n\nMeasured: `{}` ({}, with its line tables). Shipped: `target/dist/scorch` \
         {} (stripped) and `target/dist/scorch.debug` {} beside it (its debug info, compressed, \
         found through `.gnu_debuglink`).\n",
        scorch.strip_prefix(root).unwrap_or(scorch).display(),
        megabytes(scorch),
        megabytes(&dist.join("scorch")),
        megabytes(&dist.join("scorch.debug")),
    )
}

/// A capture table row: the tool, its usage, BPF ns/sample, peak RSS after the load, maps.
type CaptureRow = (
    &'static str,
    fn(&CaptureRun) -> Usage,
    fn(&CaptureRun) -> Option<f64>,
    fn(&CaptureRun) -> Option<f64>,
    fn(&CaptureRun) -> Option<f64>,
);

fn render(
    cpus: usize,
    runs: usize,
    phases: Phases,
    captures: &[CaptureRun],
    churns: &[ChurnRun],
    frequencies: &[Vec<RateCost>],
) -> Result<String> {
    let mut out = String::new();
    let host = Host::current();
    writeln!(
        out,
        "# Overhead: {cpus} CPUs ({}), {:.0} GiB, kernel {}, commit {}, {}",
        host.cpu_model, host.memory_gib, host.kernel, host.commit, host.date,
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "Medians of {runs} interleaved runs of fresh processes, with the range in brackets \
         (`cargo xtask bench --only overhead`)."
    )?;
    writeln!(out)?;
    // Debug info decides what naming libc costs; `cargo xtask setup` installs it.
    let libc_debug = command_output(
        "dpkg-query",
        &["-W", "-f=${Status}|${Version}", "libc6-dbg"],
    );
    writeln!(
        out,
        "libc debug info: {}.",
        match libc_debug.split_once('|') {
            Some(("install ok installed", version)) => {
                format!("libc6-dbg {version}")
            }
            _ => "not installed".to_owned(),
        }
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "## Capture: {} s at 19 Hz, every CPU busy, each tool alone in turn",
        phases.capture
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "| tool | CPU s | peak RSS MiB | peak RSS after the BPF load MiB | BPF maps MiB | peak \
         RSS + maps MiB | BPF ns/sample |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|")?;
    let rows: [CaptureRow; 3] = [
        (
            "`scorch record`",
            |c| c.scorch,
            |c| c.scorch_bpf_ns,
            |c| c.scorch_after_load_rss,
            |c| c.scorch_maps,
        ),
        ("`perf record -g`", |c| c.perf, |_| None, |_| None, |_| None),
        (
            "bpftrace `profile:hz:19`",
            |c| c.bpftrace,
            |c| c.bpftrace_bpf_ns,
            |_| None,
            |c| c.bpftrace_maps,
        ),
    ];
    let spread_or_na = |values: Vec<f64>, decimals| {
        if values.is_empty() {
            "n/a".to_owned()
        } else {
            spread(&values, decimals)
        }
    };
    for (name, usage, ns, after_load, maps) in rows {
        let cpu: Vec<f64> = captures.iter().map(|c| usage(c).cpu_seconds).collect();
        let rss: Vec<f64> = captures.iter().map(|c| usage(c).max_rss_mib).collect();
        let after_load: Vec<f64> = captures.iter().filter_map(after_load).collect();
        let ns: Vec<f64> = captures.iter().filter_map(ns).collect();
        // Per run, so the sum's median is of sums: the RSS and the maps peak at different times,
        // which makes the sum an upper bound of the footprint.
        let whole: Vec<f64> = captures
            .iter()
            .filter_map(|c| maps(c).map(|m| usage(c).max_rss_mib + m))
            .collect();
        let maps: Vec<f64> = captures.iter().filter_map(maps).collect();
        writeln!(
            out,
            "| {name} | {} | {} | {} | {} | {} | {} |",
            spread(&cpu, 2),
            spread(&rss, 1),
            spread_or_na(after_load, 1),
            spread_or_na(maps, 1),
            spread_or_na(whole, 1),
            spread_or_na(ns, 0),
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "scorch's peak after the BPF load: its peak RSS (VmHWM) is reset once it holds its \
         first BPF program, so this is what sampling and symbolising cost, without the start-up \
         (before aya 0.14 was patched, its parse of the whole kernel BTF in `EbpfLoader::new` \
         was the whole run's peak: third_party/aya/SCORCH-PATCH.md)."
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "BPF maps: the kernel memory of the maps each tool held a second before it stopped \
         (`memlock:` in its fdinfo, each map once; perf has none), which no RSS counts and the \
         tool's memory cgroup is charged for; RSS + maps adds it to the peak RSS, run by run."
    )?;
    writeln!(out)?;
    // What scorch built in each run: its CPU follows the unwind tables of whatever else the
    // machine ran while it recorded.
    let per_run: Vec<String> = captures
        .iter()
        .map(|c| {
            format!(
                "{:.2} s and {:.1} MiB ({} after the load) with {}",
                c.scorch.cpu_seconds,
                c.scorch.max_rss_mib,
                c.scorch_after_load_rss
                    .map_or_else(|| "n/a".to_owned(), |m| format!("{m:.1}")),
                summary_tables(&c.scorch_summary).unwrap_or_else(|| "no tables".to_owned())
            )
        })
        .collect();
    writeln!(
        out,
        "`scorch record` in each run, with the unwind tables it built: {}.",
        per_run.join("; ")
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "## `scorch run` under process churn: {} s of `python3 -c pass` and `/bin/true` in a \
         loop, every CPU busy",
        phases.churn
    )?;
    writeln!(out)?;
    churn_table(&mut out, phases, &[("", churns)])?;
    writeln!(
        out,
        "## `scorch run` CPU by sampling rate ({} s per rate, every CPU busy)",
        phases.per_frequency
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "| Hz | daemon CPU, % of a core | BPF programs, % of a core | together |"
    )?;
    writeln!(out, "|---|---|---|---|")?;
    for hz in [19, 99, 999] {
        let of = |part: fn(&RateCost) -> f64| -> Vec<f64> {
            frequencies
                .iter()
                .filter_map(|curve| curve.iter().find(|c| c.hz == hz).map(part))
                .collect()
        };
        writeln!(
            out,
            "| {hz} | {} | {} | {} |",
            spread(&of(|c| c.daemon), 2),
            spread(&of(|c| c.bpf), 2),
            spread(&of(|c| c.daemon + c.bpf), 2),
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "The daemon's CPU comes from a cgroup of its own (to the microsecond); its BPF programs' \
         from the kernel's `bpf_stats` (`run_time_ns` in their fdinfo), as they run in the \
         sampled tasks and are in no process's CPU time."
    )?;
    Ok(out)
}

/// The churn table, one row per (label, runs) and each run's RSS figures below it.
fn churn_table(out: &mut String, phases: Phases, rows: &[(&str, &[ChurnRun])]) -> Result<()> {
    let labelled = rows.iter().any(|(label, _)| !label.is_empty());
    let (head, rule) = if labelled {
        ("| daemon ", "|---")
    } else {
        ("", "")
    };
    writeln!(
        out,
        "{head}| quiet RSS MiB | start-up peak MiB | peak RSS during churn MiB (VmHWM) | parsed binaries held at its end MiB (`scorch_symbol_cache_bytes`) | CPU during churn, % of a core | processes read a second | its CPU per process read, µs | its BPF programs, % of a core | RSS {} s after MiB | BPF maps MiB | of which unwind row pools MiB | processes started |",
        phases.after
    )?;
    writeln!(
        out,
        "{rule}|---|---|---|---|---|---|---|---|---|---|---|---|"
    )?;
    for (label, churns) in rows {
        let column = |f: fn(&ChurnRun) -> f64| -> Vec<f64> { churns.iter().map(f).collect() };
        let label = if labelled {
            format!("| {label} ")
        } else {
            String::new()
        };
        writeln!(
            out,
            "{label}| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            spread(&column(|c| c.quiet_rss), 1),
            spread(&column(|c| c.start_peak_rss), 1),
            spread(&column(|c| c.peak_rss), 1),
            spread(&column(|c| c.symbol_cache_mib), 1),
            spread(&column(|c| c.churn_core_percent), 2),
            spread(&column(|c| c.reads_per_second), 1),
            spread(&column(|c| c.cpu_us_per_read), 0),
            spread(&column(|c| c.churn_bpf_percent), 2),
            spread(&column(|c| c.after_rss), 1),
            spread(&column(|c| c.map_memory_mib), 1),
            spread(&column(|c| c.row_pools_mib), 1),
            spread(&column(|c| c.processes_started as f64), 0),
        )?;
    }
    writeln!(out)?;
    for (label, churns) in rows {
        let per_run: Vec<String> = churns
            .iter()
            .map(|c| {
                format!(
                    "quiet {:.1}, start-up {:.1}, churn {:.1}, after {:.1}",
                    c.quiet_rss, c.start_peak_rss, c.peak_rss, c.after_rss
                )
            })
            .collect();
        let whose = if label.is_empty() {
            String::new()
        } else {
            format!(" of {label}")
        };
        writeln!(
            out,
            "Each run{whose} (MiB): {}. The start-up peak covers start-up and warm-up; VmHWM is \
             reset as the churn starts, so the churn's peak is its own.",
            per_run.join("; ")
        )?;
        writeln!(out)?;
    }
    Ok(())
}
