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
//!   milliseconds a window, and over 20 s (two windows) one run read 0.10% and the next two
//!   0.29%.

use std::{
    fmt::Write as _,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::{
    measure::{
        bpf_map_memory_mib, bpf_ns_per_run, bpf_run_seconds, busy_workload, cargo_bench,
        command_output, daemon_metric, first_child, holds_bpf_program, median, path_str,
        sample_rss, spread, status_field, status_kib, summary_bpf_ns, summary_samples, time_usage,
        timed, with_bpf_stats, CpuAccount, Processes, Usage,
    },
    run_command,
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
    /// The issue's figures: 60 s of churn after warm-up, RSS a minute after it stops.
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

/// One capture run of the three tools, side by side or in turn (see [`Together`]).
#[derive(Debug, Default)]
pub struct CaptureRun {
    pub scorch: Usage,
    pub perf: Usage,
    pub bpftrace: Usage,
    pub scorch_bpf_ns: Option<f64>,
    pub bpftrace_bpf_ns: Option<f64>,
    pub scorch_samples: u64,
    /// scorch's one-line summary.
    pub scorch_summary: String,
    /// scorch's peak RSS from its first BPF program on (see [`reset_peak_after_load`]), MiB.
    pub scorch_after_load_rss: Option<f64>,
    /// Kernel memory of each tool's BPF maps a second before it stops, MiB (see
    /// [`read_before_the_end`]); perf has none.
    pub scorch_maps: Option<f64>,
    pub bpftrace_maps: Option<f64>,
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

pub fn overhead(root: &Path, scorch: &Path, runs: usize, phases: Phases) -> Result<String> {
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
    eprintln!("overhead: report written to {}", path.display());
    Ok(report)
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
) -> Result<String> {
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
    eprintln!("churn: report written to {}", path.display());
    Ok(out)
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

/// How a capture run puts the three tools beside each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Together {
    /// All three at once: each also samples (and scorch and bpftrace symbolise) the others,
    /// bpftrace's start-up included, LLVM compiling its program.
    SideBySide,
    /// One after another, each alone with the workload: what each costs by itself.
    InTurn,
}

/// `scorch record`, `perf record -g` and bpftrace for `seconds` each while every CPU is busy,
/// side by side or in turn; `run` rotates who starts first. Needs [`with_bpf_stats`] for the
/// BPF figures.
pub fn capture(
    scorch: &Path,
    busy: &Path,
    cpus: usize,
    dir: &Path,
    run: usize,
    seconds: u64,
    together: Together,
) -> Result<CaptureRun> {
    let _workload = Processes(vec![Command::new(busy)
        .args([cpus.to_string(), (3 * seconds + 30).to_string()])
        .spawn()
        .context("starting the workload")?]);
    std::thread::sleep(Duration::from_millis(500));
    let scorch_out = dir.join(format!("overhead-scorch-{run}.pb.gz"));
    let perf_out = dir.join(format!("overhead-perf-{run}.data"));
    let scorch_cmd = timed(
        scorch,
        &[
            "record",
            "--duration",
            &format!("{seconds}s"),
            "--output",
            path_str(&scorch_out)?,
        ],
    );
    let perf_cmd = timed(
        Path::new("perf"),
        &[
            "record",
            "-F",
            "19",
            "-a",
            "-g",
            "-o",
            path_str(&perf_out)?,
            "--",
            "sleep",
            &seconds.to_string(),
        ],
    );
    let program = format!(
        "profile:hz:19 {{ @[kstack, ustack, pid] = count(); }} interval:s:{seconds} {{ exit(); }}"
    );
    let bpftrace_cmd = timed(Path::new("bpftrace"), &["-e", &program]);
    // Rotate who starts first, so none always pays for another's start-up.
    let mut commands = vec![
        ("scorch", scorch_cmd),
        ("perf", perf_cmd),
        ("bpftrace", bpftrace_cmd),
    ];
    commands.rotate_left(run % 3);
    let mut result = CaptureRun::default();
    match together {
        Together::SideBySide => {
            let mut children = Vec::new();
            for (name, command) in commands {
                children.push((name, start_tool(name, command, &mut result)?));
            }
            std::thread::sleep(Duration::from_secs(seconds.saturating_sub(1).max(1)));
            for (name, child) in &children {
                read_before_the_end(&mut result, name, child);
            }
            for (name, child) in children {
                finish_tool(&mut result, name, child)?;
            }
        }
        Together::InTurn => {
            for (name, command) in commands {
                let child = start_tool(name, command, &mut result)?;
                if name != "perf" {
                    std::thread::sleep(Duration::from_secs(seconds.saturating_sub(1).max(1)));
                    read_before_the_end(&mut result, name, &child);
                }
                finish_tool(&mut result, name, child)?;
            }
        }
    }
    Ok(result)
}

/// Starts a tool; for scorch, also splits its peak RSS at the end of its BPF load.
fn start_tool(
    name: &str,
    mut command: Command,
    result: &mut CaptureRun,
) -> Result<std::process::Child> {
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = command
        .spawn()
        .with_context(|| format!("starting {name} (cargo xtask setup installs it)"))?;
    if name == "scorch" {
        result.scorch_after_load_rss = reset_peak_after_load(&child);
    }
    Ok(child)
}

/// What a tool holds a second before it stops, while it still holds it: its BPF maps' kernel
/// memory, and bpftrace's program cost. Read once, not polled: a bench process that woke
/// through the recording was sampled by `scorch record`, which then named its frames from this
/// debug build's DWARF and reported that as its own memory and CPU. The maps are read after
/// the last full window, so scorch's stack maps and row pools have their recording's sizes.
fn read_before_the_end(result: &mut CaptureRun, name: &str, child: &std::process::Child) {
    // The child is `/usr/bin/time`; the tool is its child.
    let maps = first_child(child.id()).and_then(bpf_map_memory_mib);
    match name {
        "scorch" => result.scorch_maps = maps,
        "bpftrace" => {
            result.bpftrace_maps = maps;
            result.bpftrace_bpf_ns = bpftrace_bpf_ns(child);
        }
        _ => {}
    }
}

/// scorch's memory could peak twice: while loading its BPF program (unpatched aya 0.14 parsed
/// all of /sys/kernel/btf/vmlinux then) and while the profile is symbolised at the end. To show
/// each, this waits until scorch holds its first BPF program (the loader is gone by then),
/// reads its peak so far (VmHWM) and resets it (`5` to `/proc/PID/clear_refs`): the peak
/// `/usr/bin/time` then reports is the one after the load, and the whole process's is the
/// larger of the two. Returns the peak before the reset, in MiB; `None` (and nothing reset)
/// when no program appeared within 10 s.
fn reset_peak_after_load(child: &std::process::Child) -> Option<f64> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        // The child is `/usr/bin/time`; scorch is its child.
        if let Some(pid) = first_child(child.id()) {
            if holds_bpf_program(pid) {
                let before = status_kib(pid, "VmHWM:").ok()? as f64 / 1024.0;
                std::fs::write(format!("/proc/{pid}/clear_refs"), "5").ok()?;
                return Some(before);
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

/// bpftrace's BPF ns per run: the child is `/usr/bin/time`; bpftrace is its child, and holds
/// the program.
fn bpftrace_bpf_ns(child: &std::process::Child) -> Option<f64> {
    bpf_ns_per_run(first_child(child.id())?)
}

/// Waits for a tool and puts its usage (and scorch's summary) in `result`.
fn finish_tool(result: &mut CaptureRun, name: &str, child: std::process::Child) -> Result<()> {
    let output = child.wait_with_output()?;
    if !output.status.success() {
        bail!("{name} failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    let usage = time_usage(&String::from_utf8_lossy(&output.stderr))?;
    match name {
        "scorch" => {
            let summary = String::from_utf8_lossy(&output.stdout).trim().to_owned();
            result.scorch_bpf_ns = summary_bpf_ns(&summary);
            result.scorch_samples = summary_samples(&summary);
            result.scorch_summary = summary;
            result.scorch = usage;
            // `/usr/bin/time` saw the peak after the reset; the whole run's includes the load.
            if let Some(before) = result.scorch_after_load_rss {
                result.scorch_after_load_rss = Some(usage.max_rss_mib);
                result.scorch.max_rss_mib = usage.max_rss_mib.max(before);
            }
        }
        "perf" => result.perf = usage,
        _ => result.bpftrace = usage,
    }
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

/// Starts short-lived processes back to back for `seconds` (`python3 -c pass`, then
/// `/bin/true`, as a build host or CI runner does), and writes how many to `counter`.
///
/// The distribution's interpreter, by its path: `python3` from `PATH` was, on these machines,
/// a pyenv shim (a bash script that starts three more processes, then a libpython built with
/// line tables that took 3.7 MiB of the daemon's heap to name its frames), so the same bench
/// measured a different workload on each machine.
pub fn run_churn(seconds: u64, counter: &Path) -> Result<()> {
    let script = format!(
        "n=0; end=$(( $(date +%s) + {seconds} )); while [ $(date +%s) -lt $end ]; do \
         /usr/bin/python3 -c pass; /bin/true; n=$((n + 2)); done; echo $n > {}",
        path_str(counter)?
    );
    let status = Command::new("sh").args(["-c", &script]).status()?;
    if !status.success() {
        bail!("the churn loop exited with {status}");
    }
    Ok(())
}

/// A second of reads from /dev/zero, so the daemon names kernel frames (and loads the kernel's
/// symbol table) during its warm-up, as on any host: the busy workload never enters the kernel.
pub fn kernel_work() -> Result<()> {
    run_command(Command::new("dd").args([
        "if=/dev/zero",
        "of=/dev/null",
        "bs=64k",
        "count=400000",
        "status=none",
    ]))
}

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

/// A fresh `scorch run` at `hz` into `store`, listening on `address`, with `extra` arguments.
pub fn start_daemon(
    scorch: &Path,
    store: &Path,
    hz: u64,
    address: &str,
    extra: &[&str],
) -> Result<Processes> {
    start_daemon_logging(scorch, store, hz, address, extra, Stdio::null())
}

/// As [`start_daemon`], with the daemon's log (its standard error) going to `log`.
pub fn start_daemon_logging(
    scorch: &Path,
    store: &Path,
    hz: u64,
    address: &str,
    extra: &[&str],
    log: Stdio,
) -> Result<Processes> {
    let child = Command::new(scorch)
        .args([
            "run",
            "--frequency",
            &hz.to_string(),
            "--http-address",
            address,
        ])
        .args(extra)
        .arg("--store")
        .arg(store)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("starting scorch run")?;
    Ok(Processes(vec![child]))
}

/// SIGTERM, so the daemon flushes and closes its store, and a check that it exited cleanly.
pub fn stop(mut daemon: Processes) -> Result<()> {
    let pid = daemon.0[0].id();
    run_command(Command::new("kill").args(["-TERM", &pid.to_string()]))?;
    let status = daemon.0[0].wait()?;
    if !status.success() {
        bail!("scorch run exited with {status}");
    }
    Ok(())
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

/// "N tables, K KiB" from a `scorch record` summary's `unwind tables: N, K KiB`.
fn summary_tables(summary: &str) -> Option<String> {
    let (_, rest) = summary.split_once("unwind tables: ")?;
    let (count, rest) = rest.split_once(", ")?;
    let kib = rest.split_whitespace().next()?;
    Some(format!("{count} tables, {kib} KiB"))
}

fn render(
    cpus: usize,
    runs: usize,
    phases: Phases,
    captures: &[CaptureRun],
    churns: &[ChurnRun],
    frequencies: &[Vec<RateCost>],
) -> Result<String> {
    let mut out = String::new();
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let memory = status_field("/proc/meminfo", "MemTotal:").unwrap_or(0) as f64 / (1 << 20) as f64;
    writeln!(
        out,
        "# Overhead: {cpus} CPUs ({cpu_model}), {memory:.0} GiB, kernel {}, commit {}, {}",
        command_output("uname", &["-r"]),
        command_output("git", &["rev-parse", "--short", "HEAD"]),
        command_output("date", &["-u", "+%Y-%m-%d"]),
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

#[cfg(test)]
mod tests {
    use super::summary_tables;

    #[test]
    fn reads_the_tables_from_a_record_summary() {
        let summary = "scorch: 2275 samples from 7 processes in 60.00s (6 windows); lost: none; \
                       unwind: completed: 2267; wrote x.pb.gz (pprof); unwind tables: 38, 13483 \
                       KiB; BPF 5609 ns/sample";
        assert_eq!(
            summary_tables(summary).as_deref(),
            Some("38 tables, 13483 KiB")
        );
        assert_eq!(summary_tables("scorch: 1 samples; lost: none"), None);
    }
}
