//! `cargo xtask bench --only scale`: how the daemon's cost grows with the work a host holds,
//! written to `target/bench/scale.md`.
//!
//! - **The work.** 100, 500 and 1,000 processes of `tests/workloads/dozer.c`, asleep most of the
//!   time, each waking about once a second for half a millisecond of CPU through a few
//!   functions and libc's qsort, built without frame pointers so that every walk needs tables;
//!   among them 10, 100 and 300 distinct binaries: the same object linked again with a build
//!   id of its own (`-Wl,--build-id=0x...`, checked with `readelf -n`), each a file of its own,
//!   so no table, parse or page cache is shared between two of them. Process `i` runs binary
//!   `i % binaries`; combinations with more binaries than processes are skipped. Once, the 100
//!   processes of 10 binaries run beside `tests/workloads/llvmwork.c`, which loads the nightly
//!   toolchain's libLLVM (about 190 MB) and compiles small functions in it, so its samples need
//!   that library's table.
//! - **The daemon.** A fresh `scorch run` per cell at 19 Hz (its own store, a free port),
//!   keeping only the workload's processes: a `[[relabel]]` rule on comm, so whatever else the
//!   host runs (on a shared machine, a parallel build most of all) is excluded in the kernel
//!   and neither builds tables nor fills the symbol cache. Once the daemon samples (its log
//!   says `profiling`: its HTTP server answers before its BPF program is attached), the
//!   processes start one every [`START_EVERY`], each with [`BURST_MS`] of work first under
//!   `SCHED_FIFO`, alone on its CPU for more than the 52.6 ms between two samples of a CPU at
//!   19 Hz: the daemon meets each one as it starts, as one that has run for a while has met
//!   every process of its host. (Without it, on this 2-CPU machine beside a parallel build, the
//!   bursts were cut into slices and a third to four fifths of the processes went unsampled;
//!   at a wake a second, a dozer is sampled about once a minute.) Then [`WARM_UP`], then
//!   [`SPAN`] measured.
//! - **The figures.** The daemon's CPU over the span (its own cgroup, see [`CpuAccount`]) and
//!   its BPF programs' (`bpf_stats`: they run in the sampled tasks); its RSS once a second
//!   (median) and at its peak (`VmHWM`, start-up included); from `/metrics` at the end of the
//!   span its BPF map memory, tables loaded and evicted, row pools and processes described, and
//!   over the span the walks' outcomes. The store then gives the workload's samples of the
//!   span's windows: with `-fomit-frame-pointer` a walk without a table stops within a frame or
//!   two, so a stack that reaches `main` was walked with tables. A process first sampled during
//!   the span has its first walk without one (the walk reports the process, which is then
//!   described): the processes described during the span are shown beside the stacks that were
//!   not whole. One process in 500 to 1,000 is never described: sampled between the spawn's
//!   fork and its exec, it was labelled with the spawner's comm, dropped by the keep rule and
//!   excluded in the kernel for its life (the labels are cached per pid and start time, which
//!   an exec keeps); it never shows in the store either.
//!
//! With `--runs N` every cell runs N times, the order reversed on every other run, and the
//! report gives medians [min-max].

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{ensure, Context, Result};

use crate::{
    bench::{
        harness::{free_address, start_daemon_logging, stop, wait_until_profiling},
        measure::{
            bpf_run_seconds, command_output, load_average, load_one_minute, median, metric_value,
            metrics_text, path_str, sample_rss, status_kib, verdict, with_bpf_stats, CpuAccount,
            Processes,
        },
        results::{self, BenchResult, Host, Table},
        Bench,
    },
    run_command,
};

/// Processes the host holds, by cell.
const PROCESSES: [usize; 3] = [100, 500, 1000];
/// Distinct binaries among them.
const BINARIES: [usize; 3] = [10, 100, 300];
/// The cell the target is judged on, and the target.
const TARGET: Cell = Cell {
    processes: 1000,
    binaries: 300,
    llvm: false,
};
const TARGET_MIB: f64 = 160.0;
const TARGET_CORE_PERCENT: f64 = 2.0;
/// A dozer's rhythm: a sleep of 0.5 to 1.5 times this, then [`WORK_US`] of CPU time. 1,000 of
/// them take half a core, so the 2-CPU machine the figures come from stays mostly idle and
/// the daemon is not measured starved.
const PERIOD_MS: u64 = 1000;
const WORK_US: u64 = 500;
/// Work a process does as it starts, so that a sample finds it (see the module doc).
const BURST_MS: u64 = 60;
/// Between two processes' starts: one burst at a time, so the bursts under `SCHED_FIFO` hold
/// one CPU and leave the other to the daemon and the rest of the host.
const START_EVERY: Duration = Duration::from_millis(BURST_MS);
/// libLLVM's process: 20 ms of compiling every 200 ms or so, a tenth of a core, about two
/// samples a second at 19 Hz.
const LLVM_PERIOD_MS: u64 = 200;
const LLVM_WORK_US: u64 = 20_000;
/// After the last process started: tables load within a poll of a process's first sample
/// (libLLVM's within half a second), and the first window after a binary's first samples
/// parses it to name them; two windows leave both behind the measured span.
const WARM_UP: Duration = Duration::from_secs(20);
/// Four 10 s windows, each with its drain. At 19 Hz the daemon spends tens of milliseconds a
/// window, and over two windows runs of the overhead bench disagreed severalfold; four average
/// more of that noise, and the grid still runs in about a quarter of an hour.
const SPAN: Duration = Duration::from_secs(40);
/// The daemon's window (its default): the store is queried for the windows that ended in the
/// span, which started a window earlier.
const WINDOW: Duration = Duration::from_secs(10);
/// What a cell takes besides its processes' starts, warm-up and span: the daemon's start (its
/// BPF load), its stop, the store's query and the processes' end.
const CELL_OVERHEAD: Duration = Duration::from_secs(8);
/// The comm of every workload process, for the daemon's keep rule and the store's query.
const WORKLOAD_COMMS: &str = "dozer-[0-9]+|llvmwork";

/// One point of the grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cell {
    processes: usize,
    binaries: usize,
    /// With the libLLVM process beside the dozers.
    llvm: bool,
}

impl Cell {
    fn name(self) -> String {
        format!(
            "{} processes, {} binaries{}",
            thousands(self.processes),
            self.binaries,
            if self.llvm { " + libLLVM" } else { "" }
        )
    }

    /// A short name for files.
    fn tag(self) -> String {
        format!(
            "{}p-{}b{}",
            self.processes,
            self.binaries,
            if self.llvm { "-llvm" } else { "" }
        )
    }

    /// About how long the cell runs.
    fn duration(self) -> Duration {
        START_EVERY * self.processes as u32 + WARM_UP + SPAN + CELL_OVERHEAD
    }
}

/// Every cell: processes by binaries, none with more binaries than processes, then libLLVM's.
fn grid() -> Vec<Cell> {
    let mut cells: Vec<Cell> = PROCESSES
        .iter()
        .flat_map(|&processes| {
            BINARIES
                .iter()
                .filter(move |&&binaries| binaries <= processes)
                .map(move |&binaries| Cell {
                    processes,
                    binaries,
                    llvm: false,
                })
        })
        .collect();
    cells.push(Cell {
        processes: PROCESSES[0],
        binaries: BINARIES[0],
        llvm: true,
    });
    cells
}

/// What the cells run.
struct Workload {
    /// The dozer copies, each with its own build id.
    dozers: Vec<PathBuf>,
    llvmwork: PathBuf,
    libllvm: PathBuf,
    /// The daemon's configuration: keep the workload's processes only.
    keep: PathBuf,
}

/// How the walks of a span ended, from the daemon's `scorch_unwind_walks_total`: every walk
/// counts one end, and at most once each fallback to frame pointers for some frame.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Walks {
    walks: f64,
    /// Some frame was in no known mapping: a process not described yet, or new code.
    no_mapping: f64,
    /// Some frame was in a mapping whose table was still being built.
    not_loaded: f64,
}

/// The ends of a walk, `UnwindOutcome::name` in agent-common: each walk counts one of them.
const WALK_ENDS: [&str; 5] = [
    "completed",
    "no row",
    "unsupported CFA",
    "read fault",
    "frame limit",
];

impl Walks {
    /// The walks counted between two `/metrics` pages.
    fn between(before: &str, after: &str) -> Walks {
        let delta = |outcome: &str| {
            let name = format!("scorch_unwind_walks_total{{outcome=\"{outcome}\"}}");
            metric_value(after, &name).unwrap_or(0.0) - metric_value(before, &name).unwrap_or(0.0)
        };
        Walks {
            walks: WALK_ENDS.iter().map(|end| delta(end)).sum(),
            no_mapping: delta("no mapping"),
            not_loaded: delta("table not loaded"),
        }
    }
}

/// The workload's samples the store holds for a span, and how far their walks went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Stored {
    /// The dozers' samples, and those whose stack reaches `main`.
    samples: u64,
    whole: u64,
    /// libLLVM's process: its samples, those that reach `main`, and those with a frame in
    /// libLLVM.
    llvm_samples: u64,
    llvm_whole: u64,
    llvm_in_library: u64,
}

impl Stored {
    /// Reads `scorch query --format folded` lines: `comm;frame;...;leaf count`, kernel frames
    /// marked `_[k]`.
    fn from_folded(folded: &str) -> Stored {
        let mut stored = Stored::default();
        for (comm, user, count) in crate::bench::measure::folded_user_stacks(folded) {
            let whole = user.contains(&"main");
            if comm == "llvmwork" {
                stored.llvm_samples += count;
                stored.llvm_whole += count * u64::from(whole);
                let in_library = user
                    .iter()
                    .any(|f| f.starts_with("LLVM") || f.contains("llvm::"));
                stored.llvm_in_library += count * u64::from(in_library);
            } else {
                stored.samples += count;
                stored.whole += count * u64::from(whole);
            }
        }
        stored
    }
}

/// One run of one cell.
#[derive(Debug, Clone, Default)]
struct Figures {
    /// The daemon's CPU over the span, % of a core.
    core_percent: f64,
    /// Its BPF programs', % of a core.
    bpf_percent: f64,
    steady_rss_mib: f64,
    peak_rss_mib: f64,
    maps_mib: f64,
    symbol_cache_mib: f64,
    tables_loaded: f64,
    tables_evicted: f64,
    pools_mib: f64,
    tables_mib: f64,
    /// Processes the unwinder described at the start and end of the span.
    described_before: f64,
    described_after: f64,
    walks: Walks,
    stored: Stored,
    /// The host's 1-minute load average as the span started.
    load: f64,
}

impl Figures {
    /// Peak RSS plus BPF map memory: what a memory limit must allow.
    fn footprint_mib(&self) -> f64 {
        self.peak_rss_mib + self.maps_mib
    }

    /// Of the workload's stored samples, the share walked whole, %.
    fn whole_percent(&self) -> f64 {
        let samples = self.stored.samples + self.stored.llvm_samples;
        let whole = self.stored.whole + self.stored.llvm_whole;
        100.0 * whole as f64 / samples.max(1) as f64
    }

    fn summary(&self) -> String {
        format!(
            "{:.2}% of a core (BPF {:.2}%), RSS {:.1} MiB (peak {:.1}), maps {:.1} MiB, {} \
             tables ({} evicted, pools {:.1} MiB), {} processes described, {} of {} stacks \
             whole, load {:.2}",
            self.core_percent,
            self.bpf_percent,
            self.steady_rss_mib,
            self.peak_rss_mib,
            self.maps_mib,
            self.tables_loaded,
            self.tables_evicted,
            self.pools_mib,
            self.described_after,
            self.stored.whole + self.stored.llvm_whole,
            self.stored.samples + self.stored.llvm_samples,
            self.load,
        )
    }
}

pub fn scale(root: &Path, scorch: &Path, runs: usize, command: String) -> Result<BenchResult> {
    let runs = runs.max(1);
    let dir = root.join("target/bench/scale");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // A copy of its own: a `cargo build` in the same tree during the quarter of an hour the
    // grid runs would otherwise swap the binary under test between cells.
    let pinned = dir.join("scorch");
    std::fs::copy(scorch, &pinned)
        .with_context(|| format!("copying {} to {}", scorch.display(), pinned.display()))?;
    let cells = grid();
    let estimate: Duration = cells.iter().map(|c| c.duration()).sum::<Duration>() * runs as u32;
    eprintln!(
        "scale: {} cells, {runs} run(s) each: about {} minutes, after building {} binaries",
        cells.len(),
        estimate.as_secs().div_ceil(60),
        BINARIES[BINARIES.len() - 1]
    );
    let workload = build_workload(root, &dir)?;
    let load_before = load_average();
    let started = Instant::now();
    let results = with_bpf_stats(|| {
        let mut results = Vec::new();
        let mut order = cells.clone();
        for run in 0..runs {
            // Each run goes the other way round: each cell by turns early and late.
            if run > 0 {
                order.reverse();
            }
            for &cell in &order {
                eprintln!("scale: run {} of {runs}: {}", run + 1, cell.name());
                let figures = measure_cell(&pinned, cell, &workload, &dir, run)
                    .with_context(|| format!("measuring {}", cell.name()))?;
                eprintln!("scale:   {}", figures.summary());
                results.push((cell, figures));
            }
        }
        Ok(results)
    })?;
    let header = Header {
        runs,
        load_before,
        load_after: load_average(),
        minutes: started.elapsed().as_secs_f64() / 60.0,
        libllvm: workload.libllvm.clone(),
        libllvm_mb: std::fs::metadata(&workload.libllvm).map_or(0.0, |m| m.len() as f64 / 1e6),
    };
    let report = render(&header, &cells, &results)?;
    let path = root.join("target/bench/scale.md");
    std::fs::write(&path, &report).with_context(|| format!("writing {}", path.display()))?;
    print!("{report}");
    eprintln!("scale: report written to {}", path.display());
    let mut result = BenchResult::new(Bench::Scale, command);
    result.tables.push(cells_table(&cells, &results));
    Ok(result)
}

/// Every cell as data: the daemon's cost and what its unwinder did.
fn cells_table(cells: &[Cell], results: &[(Cell, Figures)]) -> Table {
    let mut table = Table::new(
        "cells",
        &format!(
            "`scorch run` at 19 Hz keeping only the workload's processes, {} s measured after \
             {} s of warm-up",
            SPAN.as_secs(),
            WARM_UP.as_secs()
        ),
        "processes, distinct binaries",
        &[
            "daemon CPU, % of a core",
            "its BPF programs, % of a core",
            "RSS MiB",
            "peak RSS MiB",
            "BPF maps MiB",
            "peak RSS + maps MiB",
            "tables loaded",
            "evicted",
            "stacks walked whole %",
        ],
    )
    .with_note(
        "Each process sleeps 0.5 to 1.5 s, then works half a millisecond through libc's qsort; \
         built without frame pointers, so only a walk with tables reaches `main` (whole). \
         RSS: the median of one reading a second; peak RSS includes start-up.",
    );
    for (cell, runs) in by_cell(cells, results) {
        let of = |f: &dyn Fn(&Figures) -> f64, decimals| {
            results::Cell::of(&runs.iter().map(|r| f(r)).collect::<Vec<_>>(), decimals)
        };
        table.row(
            cell.name(),
            vec![
                of(&|f| f.core_percent, 2),
                of(&|f| f.bpf_percent, 2),
                of(&|f| f.steady_rss_mib, 1),
                of(&|f| f.peak_rss_mib, 1),
                of(&|f| f.maps_mib, 1),
                of(&|f| f.footprint_mib(), 1),
                of(&|f| f.tables_loaded, 0),
                of(&|f| f.tables_evicted, 0),
                of(&|f| f.whole_percent(), 1),
            ],
        );
    }
    table
}

/// Builds the dozer copies and libLLVM's process, and writes the daemon's keep rule.
fn build_workload(root: &Path, dir: &Path) -> Result<Workload> {
    let libllvm = crate::setup::nightly_llvm()
        .context("the libLLVM case profiles the nightly toolchain's libLLVM, and found none")?;
    let size = std::fs::metadata(&libllvm)
        .with_context(|| format!("reading {}", libllvm.display()))?
        .len();
    ensure!(
        size > 50_000_000,
        "{} is {size} bytes: not the library itself (a linker script?)",
        libllvm.display()
    );
    let workloads = root.join("tests/workloads");
    let llvmwork = dir.join("llvmwork");
    run_command(
        Command::new("gcc")
            .args(["-O2", "-fomit-frame-pointer", "-o"])
            .arg(&llvmwork)
            .arg(workloads.join("llvmwork.c"))
            .arg("-ldl"),
    )?;
    let dozers = build_dozers(
        &workloads.join("dozer.c"),
        dir,
        BINARIES[BINARIES.len() - 1],
    )?;
    let keep = dir.join("keep-workload.toml");
    std::fs::write(
        &keep,
        format!(
            "[[relabel]]\nsource_labels = [\"comm\"]\nregex = \"{WORKLOAD_COMMS}\"\naction = \
             \"keep\"\n"
        ),
    )
    .with_context(|| format!("writing {}", keep.display()))?;
    Ok(Workload {
        dozers,
        llvmwork,
        libllvm,
        keep,
    })
}

/// `count` links of dozer.c's object, each with its own build id and inode, checked.
fn build_dozers(source: &Path, dir: &Path, count: usize) -> Result<Vec<PathBuf>> {
    let bin = dir.join("bin");
    // Fresh files: a copy left from an earlier run is not reused under another's name.
    let _ = std::fs::remove_dir_all(&bin);
    std::fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
    let object = dir.join("dozer.o");
    run_command(
        Command::new("gcc")
            .args(["-O2", "-fomit-frame-pointer", "-c", "-o"])
            .arg(&object)
            .arg(source),
    )?;
    let mut binaries = Vec::with_capacity(count);
    let (mut ids, mut inodes) = (BTreeSet::new(), BTreeSet::new());
    for index in 0..count {
        // The name is the process's comm, which the keep rule and the query match.
        let binary = bin.join(format!("dozer-{index:03}"));
        run_command(
            Command::new("gcc")
                .arg(&object)
                .arg("-o")
                .arg(&binary)
                .arg(format!("-Wl,--build-id=0x{}", dozer_build_id(index))),
        )?;
        let notes = command_output("readelf", &["-n", path_str(&binary)?]);
        let id = build_id(&notes)
            .with_context(|| format!("no build id in {}:\n{notes}", binary.display()))?;
        ids.insert(id.to_owned());
        inodes.insert(std::fs::metadata(&binary)?.ino());
        binaries.push(binary);
    }
    ensure!(
        ids.len() == count && inodes.len() == count,
        "{count} dozer copies have {} distinct build ids and {} inodes",
        ids.len(),
        inodes.len()
    );
    eprintln!("scale: {count} dozer copies, {count} distinct build ids (readelf -n)");
    Ok(binaries)
}

/// The build id of dozer copy `index`: 20 bytes, as GNU ld's sha1 style gives.
fn dozer_build_id(index: usize) -> String {
    format!("5ca1e{index:035x}")
}

/// The `Build ID:` of `readelf -n`'s output.
fn build_id(notes: &str) -> Option<&str> {
    notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID:"))
        .map(str::trim)
        .filter(|id| !id.is_empty())
}

fn unix_seconds(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn measure_cell(
    scorch: &Path,
    cell: Cell,
    workload: &Workload,
    dir: &Path,
    run: usize,
) -> Result<Figures> {
    let tag = format!("{}-run{}", cell.tag(), run + 1);
    let store = dir.join("stores").join(&tag);
    let _ = std::fs::remove_dir_all(&store);
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let log_path = logs.join(format!("{tag}.log"));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let address = free_address()?;
    let keep = ["--config", path_str(&workload.keep)?];
    let mut daemon = start_daemon_logging(scorch, &store, 19, &address, &keep, log.into())?;
    let pid = daemon.0[0].id();
    let account = CpuAccount::of_process(pid)?;
    wait_until_profiling(&mut daemon, &log_path)?;

    // They outlive the cell by a minute if nothing kills them; dropping `processes` does.
    let lifetime = (cell.duration() + Duration::from_secs(60))
        .as_secs()
        .to_string();
    let mut processes = Processes(Vec::with_capacity(cell.processes + 1));
    if cell.llvm {
        processes.0.push(
            Command::new(&workload.llvmwork)
                .arg(&workload.libllvm)
                .args([LLVM_PERIOD_MS, LLVM_WORK_US].map(|n| n.to_string()))
                .args([&lifetime, &BURST_MS.to_string()])
                .stdout(Stdio::null())
                .spawn()
                .context("starting llvmwork")?,
        );
    }
    for index in 0..cell.processes {
        let binary = &workload.dozers[index % cell.binaries];
        processes.0.push(
            Command::new(binary)
                .args([PERIOD_MS, WORK_US].map(|n| n.to_string()))
                .args([&lifetime, &BURST_MS.to_string()])
                .stdout(Stdio::null())
                .spawn()
                .with_context(|| format!("starting {}", binary.display()))?,
        );
        std::thread::sleep(START_EVERY);
    }
    std::thread::sleep(WARM_UP);

    let before = metrics_text(&address)?;
    let load = load_one_minute();
    let cpu_before = account.cpu_seconds()?;
    let bpf_before = bpf_run_seconds(pid)?;
    let (from, started) = (SystemTime::now(), Instant::now());
    let rss = sample_rss(pid, SPAN, Duration::from_secs(1))?;
    let after = metrics_text(&address)?;
    let cpu = account.cpu_seconds()? - cpu_before;
    let bpf = bpf_run_seconds(pid)? - bpf_before;
    let (to, elapsed) = (SystemTime::now(), started.elapsed().as_secs_f64());
    let peak = status_kib(pid, "VmHWM:")? as f64 / 1024.0;
    stop(daemon).with_context(|| format!("stopping scorch run; see {}", log_path.display()))?;
    drop(processes);
    drop(account);

    let value = |name: &str| -> Result<f64> {
        metric_value(&after, name).with_context(|| format!("no {name} in /metrics"))
    };
    let mib = |name: &str| -> Result<f64> { Ok(value(name)? / (1 << 20) as f64) };
    let described = "scorch_unwind_processes";
    // The windows that ended in the span started a window before it.
    let span_windows = (unix_seconds(from - WINDOW), unix_seconds(to - WINDOW));
    Ok(Figures {
        core_percent: 100.0 * cpu / elapsed,
        bpf_percent: 100.0 * bpf / elapsed,
        steady_rss_mib: median(rss),
        peak_rss_mib: peak,
        maps_mib: mib("scorch_bpf_map_memory_bytes")?,
        symbol_cache_mib: mib("scorch_symbol_cache_bytes")?,
        tables_loaded: value("scorch_unwind_tables_loaded")?,
        tables_evicted: value("scorch_unwind_tables_evicted_total")?,
        pools_mib: mib("scorch_unwind_row_pools_bytes")?,
        tables_mib: mib("scorch_unwind_tables_bytes")?,
        described_before: metric_value(&before, described).unwrap_or(f64::NAN),
        described_after: value(described)?,
        walks: Walks::between(&before, &after),
        stored: query_store(scorch, &store, span_windows)?,
        load,
    })
}

/// The workload's samples in the windows of `store` that start in `[from, to)` (Unix
/// seconds).
fn query_store(scorch: &Path, store: &Path, (from, to): (u64, u64)) -> Result<Stored> {
    let output = Command::new(scorch)
        .args(["query", "--format", "folded"])
        .args(["--from", &from.to_string(), "--to", &to.to_string()])
        .args(["--match", &format!("{{comm=~\"{WORKLOAD_COMMS}\"}}")])
        .arg("--store")
        .arg(store)
        .stderr(Stdio::null())
        .output()
        .context("running scorch query")?;
    ensure!(
        output.status.success(),
        "scorch query on {} exited with {}",
        store.display(),
        output.status
    );
    Ok(Stored::from_folded(&String::from_utf8_lossy(
        &output.stdout,
    )))
}

/// What the report says of the machine and the run.
struct Header {
    runs: usize,
    load_before: String,
    load_after: String,
    minutes: f64,
    libllvm: PathBuf,
    libllvm_mb: f64,
}

/// `1000` -> `1,000`.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// A figure over runs: the value of one run, or the median [min-max] of several.
fn figure(values: &[f64], digits: usize) -> String {
    match values {
        [] => "n/a".to_owned(),
        [one] => format!("{one:.digits$}"),
        _ => crate::bench::measure::spread(values, digits),
    }
}

/// The runs of each cell, in the grid's order.
fn by_cell<'a>(cells: &[Cell], results: &'a [(Cell, Figures)]) -> Vec<(Cell, Vec<&'a Figures>)> {
    cells
        .iter()
        .map(|&cell| {
            let runs = results
                .iter()
                .filter(|(c, _)| *c == cell)
                .map(|(_, f)| f)
                .collect();
            (cell, runs)
        })
        .collect()
}

/// The median of one figure over a cell's runs.
fn median_of(runs: &[&Figures], f: impl Fn(&Figures) -> f64) -> f64 {
    median(runs.iter().map(|r| f(r)).collect())
}

fn render(header: &Header, cells: &[Cell], results: &[(Cell, Figures)]) -> Result<String> {
    let cells = by_cell(cells, results);
    let find = |processes: usize, binaries: usize, llvm: bool| {
        cells.iter().find(|(c, _)| {
            *c == Cell {
                processes,
                binaries,
                llvm,
            }
        })
    };
    let mut out = String::new();
    let host = Host::current();
    let (cpus, cpu_model, memory) = (host.cpus, &host.cpu_model, host.memory_gib);
    writeln!(
        out,
        "# Scale: the daemon as the host's work grows, commit {}, {}\n",
        host.commit, host.date,
    )?;
    writeln!(
        out,
        "`cargo xtask bench --only scale --runs {}` on {cpus} CPUs ({cpu_model}), {memory:.0} \
         GiB, kernel {}; load average {} at the start, {} at the end; {:.0} minutes. {}\n",
        header.runs,
        host.kernel,
        header.load_before,
        header.load_after,
        header.minutes,
        if header.runs > 1 {
            "Medians of the runs [min-max], each a fresh daemon, the cells' order reversed on \
             every other run."
        } else {
            "One run of each cell, each a fresh daemon."
        }
    )?;
    writeln!(
        out,
        "Each process of `tests/workloads/dozer.c` (`-O2 -fomit-frame-pointer`) sleeps 0.5 to \
         1.5 s, then works {WORK_US} us of CPU through libc's qsort; copies of it linked with \
         distinct build ids are the distinct binaries. `scorch run` at 19 Hz keeps only these \
         processes (a relabel rule on comm): the rest of the host is excluded in the kernel. \
         Measured over {} s after the processes started and {} s of warm-up: the daemon's CPU \
         (its cgroup) and its BPF programs' (`bpf_stats`), its RSS (median of one a second) and \
         peak (`VmHWM`, start-up included), and from `/metrics` its BPF maps and unwind tables. \
         \"Whole\" stacks reach `main`: without frame pointers, only a walk with tables gets \
         there.\n",
        SPAN.as_secs(),
        WARM_UP.as_secs()
    )?;
    let columns = "| daemon CPU, % of a core | BPF programs, % of a core | RSS, MiB | peak RSS, \
                   MiB | BPF maps, MiB | peak RSS + maps, MiB | tables loaded | evicted | row \
                   pools, MiB | stacks whole |";
    let row = |runs: &[&Figures]| -> String {
        let of = |f: &dyn Fn(&Figures) -> f64| runs.iter().map(|r| f(r)).collect::<Vec<_>>();
        format!(
            "{} | {} | {} | {} | {} | {} | {} | {} | {} | {}% |",
            figure(&of(&|f| f.core_percent), 2),
            figure(&of(&|f| f.bpf_percent), 2),
            figure(&of(&|f| f.steady_rss_mib), 1),
            figure(&of(&|f| f.peak_rss_mib), 1),
            figure(&of(&|f| f.maps_mib), 1),
            figure(&of(&|f| f.footprint_mib()), 1),
            figure(&of(&|f| f.tables_loaded), 0),
            figure(&of(&|f| f.tables_evicted), 0),
            figure(&of(&|f| f.pools_mib), 1),
            figure(&of(&|f| f.whole_percent()), 1),
        )
    };

    let fixed_binaries = BINARIES[0];
    writeln!(
        out,
        "## Cost against processes ({fixed_binaries} distinct binaries)\n"
    )?;
    writeln!(out, "| processes {columns}")?;
    writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|")?;
    for processes in PROCESSES {
        if let Some((_, runs)) = find(processes, fixed_binaries, false) {
            writeln!(out, "| {} | {}", thousands(processes), row(runs))?;
        }
    }
    let (first, last) = (PROCESSES[0], PROCESSES[PROCESSES.len() - 1]);
    if let (Some((_, small)), Some((_, large))) = (
        find(first, fixed_binaries, false),
        find(last, fixed_binaries, false),
    ) {
        writeln!(
            out,
            "\n{}",
            growth(
                small,
                large,
                last - first,
                "process",
                &format!("processes ({} to {})", thousands(first), thousands(last))
            )
        )?;
    }

    let fixed_processes = TARGET.processes;
    writeln!(
        out,
        "\n## Cost against distinct binaries ({} processes)\n",
        thousands(fixed_processes)
    )?;
    writeln!(out, "| binaries {columns}")?;
    writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|")?;
    for binaries in BINARIES {
        if let Some((_, runs)) = find(fixed_processes, binaries, false) {
            writeln!(out, "| {binaries} | {}", row(runs))?;
        }
    }
    let (first, last) = (BINARIES[0], BINARIES[BINARIES.len() - 1]);
    if let (Some((_, small)), Some((_, large))) = (
        find(fixed_processes, first, false),
        find(fixed_processes, last, false),
    ) {
        writeln!(
            out,
            "\n{}",
            growth(
                small,
                large,
                last - first,
                "binary",
                &format!("binaries ({first} to {last})")
            )
        )?;
    }

    writeln!(out, "\n## Every cell\n")?;
    writeln!(out, "| cell {columns}")?;
    writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|")?;
    for (cell, runs) in &cells {
        writeln!(out, "| {} | {}", cell.name(), row(runs))?;
    }
    writeln!(out, "\n## The unwinder in each cell\n")?;
    writeln!(
        out,
        "Processes described: by the unwinder, at the start and the end of the span (the \
         workload's, plus libLLVM's process). Stacks: the workload's samples in the span's \
         windows, from the store; those not whole beside the processes first described during \
         the span, whose first walk has no table. Walks: every walk of the host's samples in \
         the span (the excluded processes' too, before their exclusion), and those that fell \
         back to frame pointers for some frame.\n"
    )?;
    writeln!(
        out,
        "| cell | processes described | stacks | whole | not whole | described during the \
         span | walks | no mapping | table not loaded | unwind tables, MiB | symbol cache, MiB \
         | load average |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|")?;
    for (cell, runs) in &cells {
        let of = |f: &dyn Fn(&Figures) -> f64| runs.iter().map(|r| f(r)).collect::<Vec<_>>();
        let samples = |f: &Figures| (f.stored.samples + f.stored.llvm_samples) as f64;
        let whole = |f: &Figures| (f.stored.whole + f.stored.llvm_whole) as f64;
        writeln!(
            out,
            "| {} | {} to {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            cell.name(),
            figure(&of(&|f| f.described_before), 0),
            figure(&of(&|f| f.described_after), 0),
            figure(&of(&samples), 0),
            figure(&of(&whole), 0),
            figure(&of(&|f| samples(f) - whole(f)), 0),
            figure(&of(&|f| f.described_after - f.described_before), 0),
            figure(&of(&|f| f.walks.walks), 0),
            figure(&of(&|f| f.walks.no_mapping), 0),
            figure(&of(&|f| f.walks.not_loaded), 0),
            figure(&of(&|f| f.tables_mib), 1),
            figure(&of(&|f| f.symbol_cache_mib), 1),
            figure(&of(&|f| f.load), 2),
        )?;
    }

    if let (Some((_, llvm)), Some((_, plain))) = (
        find(PROCESSES[0], BINARIES[0], true),
        find(PROCESSES[0], BINARIES[0], false),
    ) {
        let delta = |f: fn(&Figures) -> f64| median_of(llvm, f) - median_of(plain, f);
        writeln!(
            out,
            "\nlibLLVM (`{}`, {:.0} MB) beside the {} processes of {} binaries, against them \
             alone: row pools {:+.1} MiB, BPF maps {:+.1} MiB, peak RSS {:+.1} MiB, RSS {:+.1} \
             MiB, symbol cache {:+.1} MiB, CPU {:+.2}% of a core. Its process's samples in the \
             span: {:.0}, {:.0} of them whole, {:.0} with a frame in libLLVM.",
            header.libllvm.display(),
            header.libllvm_mb,
            PROCESSES[0],
            BINARIES[0],
            delta(|f| f.pools_mib),
            delta(|f| f.maps_mib),
            delta(|f| f.peak_rss_mib),
            delta(|f| f.steady_rss_mib),
            delta(|f| f.symbol_cache_mib),
            delta(|f| f.core_percent),
            median_of(llvm, |f| f.stored.llvm_samples as f64),
            median_of(llvm, |f| f.stored.llvm_whole as f64),
            median_of(llvm, |f| f.stored.llvm_in_library as f64),
        )?;
    }

    if let Some((_, target)) = find(TARGET.processes, TARGET.binaries, false) {
        let footprint = median_of(target, Figures::footprint_mib);
        let steady = median_of(target, |f| f.steady_rss_mib + f.maps_mib);
        let core = median_of(target, |f| f.core_percent);
        writeln!(
            out,
            "\n**Target, {}:** peak RSS + BPF maps {footprint:.1} MiB ({}), {steady:.1} MiB \
             steady; daemon CPU {core:.2}% of a core ({}).",
            TARGET.name(),
            verdict(
                footprint <= TARGET_MIB,
                &format!("target: at most {TARGET_MIB:.0} MiB")
            ),
            verdict(
                core <= TARGET_CORE_PERCENT,
                &format!("target: at most {TARGET_CORE_PERCENT:.0}% of a core")
            ),
        )?;
    }
    Ok(out)
}

/// How the medians grew from `small` to `large`, `added` more units of work (processes or
/// binaries) between them.
fn growth(small: &[&Figures], large: &[&Figures], added: usize, unit: &str, what: &str) -> String {
    let of = |runs: &[&Figures], f: fn(&Figures) -> f64| median_of(runs, f);
    let per_unit_kib =
        |f: fn(&Figures) -> f64| (of(large, f) - of(small, f)) * 1024.0 / added as f64;
    format!(
        "From the fewest {what}: daemon CPU {:.2}% to {:.2}% of a core, RSS {:+.1} MiB ({:.1} \
         KiB a {unit}), peak RSS {:+.1} MiB, BPF maps {:+.1} MiB ({:.1} KiB a {unit}), tables \
         loaded {:.0} to {:.0}.",
        of(small, |f| f.core_percent),
        of(large, |f| f.core_percent),
        of(large, |f| f.steady_rss_mib) - of(small, |f| f.steady_rss_mib),
        per_unit_kib(|f| f.steady_rss_mib),
        of(large, |f| f.peak_rss_mib) - of(small, |f| f.peak_rss_mib),
        of(large, |f| f.maps_mib) - of(small, |f| f.maps_mib),
        per_unit_kib(|f| f.maps_mib),
        of(small, |f| f.tables_loaded),
        of(large, |f| f.tables_loaded),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_skips_more_binaries_than_processes_and_holds_the_target() {
        let cells = grid();
        assert_eq!(cells.len(), 9);
        assert!(cells.contains(&TARGET));
        assert!(!cells.iter().any(|c| c.binaries > c.processes));
        assert_eq!(cells.iter().filter(|c| c.llvm).count(), 1);
        assert_eq!(TARGET.name(), "1,000 processes, 300 binaries");
        assert_eq!(cells[cells.len() - 1].tag(), "100p-10b-llvm");
    }

    #[test]
    fn dozer_build_ids_are_twenty_distinct_bytes() {
        let ids: BTreeSet<String> = (0..300).map(dozer_build_id).collect();
        assert_eq!(ids.len(), 300);
        assert!(ids.iter().all(|id| id.len() == 40));
        let notes = "Displaying notes found in: .note.gnu.build-id\n  Owner  Data size \
                     Description\n  GNU  0x00000014  NT_GNU_BUILD_ID (unique build ID \
                     bitstring)\n    Build ID: 5ca1e00000000000000000000000000000000001\n";
        assert_eq!(
            build_id(notes),
            Some("5ca1e00000000000000000000000000000000001")
        );
        assert_eq!(build_id("Displaying notes found in: .note.ABI-tag\n"), None);
    }

    #[test]
    fn walks_are_counted_by_their_ends_and_fallbacks() {
        let page = |completed: u64, fault: u64, no_mapping: u64| {
            format!(
                "scorch_unwind_walks_total{{outcome=\"completed\"}} {completed}\n\
                 scorch_unwind_walks_total{{outcome=\"no mapping\"}} {no_mapping}\n\
                 scorch_unwind_walks_total{{outcome=\"read fault\"}} {fault}\n\
                 scorch_unwind_walks_total{{outcome=\"table not loaded\"}} 2\n"
            )
        };
        let walks = Walks::between(&page(10, 5, 3), &page(70, 9, 7));
        assert_eq!(
            walks,
            Walks {
                walks: 64.0,
                no_mapping: 4.0,
                not_loaded: 0.0
            }
        );
    }

    #[test]
    fn stored_stacks_are_whole_when_they_reach_main() {
        let folded = "\
dozer-001;_start;__libc_start_main_impl;__libc_start_call_main;main;wake;__GI___qsort_r;compare 3
dozer-007;compare 2
dozer-009;compare;asm_sysvec_apic_timer_interrupt_[k];irqentry_exit_to_user_mode_[k] 1
llvmwork;_start;main;doze;wake;compile_round;LLVMRunPasses;llvm::PassManager::run 4
llvmwork;llvm::Value::getName 1
not a folded line
";
        assert_eq!(
            Stored::from_folded(folded),
            Stored {
                samples: 6,
                whole: 3,
                llvm_samples: 5,
                llvm_whole: 4,
                llvm_in_library: 5,
            }
        );
    }

    #[test]
    fn figures_read_one_run_alone_and_several_as_a_spread() {
        assert_eq!(figure(&[], 1), "n/a");
        assert_eq!(figure(&[1.25], 1), "1.2");
        assert_eq!(figure(&[3.0, 1.0, 2.0], 0), "2 [1-3]");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(100), "100");
        assert_eq!(thousands(1234567), "1,234,567");
    }

    #[test]
    fn the_report_has_both_axes_and_the_target_verdict() {
        let figures = |processes: usize, binaries: usize| Figures {
            core_percent: processes as f64 / 1000.0,
            steady_rss_mib: 20.0 + processes as f64 / 100.0,
            peak_rss_mib: 30.0 + binaries as f64 / 10.0,
            maps_mib: 24.0,
            tables_loaded: binaries as f64 + 3.0,
            stored: Stored {
                samples: 10,
                whole: 9,
                ..Stored::default()
            },
            ..Figures::default()
        };
        let cells = grid();
        let results: Vec<(Cell, Figures)> = cells
            .iter()
            .map(|&c| (c, figures(c.processes, c.binaries)))
            .collect();
        let header = Header {
            runs: 1,
            load_before: "0.1 0.1 0.1".into(),
            load_after: "0.2 0.2 0.2".into(),
            minutes: 12.0,
            libllvm: PathBuf::from("/x/libLLVM.so.22.1"),
            libllvm_mb: 199.5,
        };
        let report = render(&header, &cells, &results).unwrap();
        assert!(report.contains("## Cost against processes (10 distinct binaries)"));
        assert!(report.contains("| 1,000 | 1.00 | 0.00 | 30.0 | 31.0 | 24.0 | 55.0 | 13 | 0 |"));
        assert!(report.contains("## Cost against distinct binaries (1,000 processes)"));
        assert!(report.contains("| 300 | 1.00 | 0.00 | 30.0 | 60.0 | 24.0 | 84.0 | 303 |"));
        assert!(report.contains("RSS +9.0 MiB (10.2 KiB a process)"));
        assert!(report.contains("| 100 processes, 10 binaries + libLLVM |"));
        assert!(report.contains("90.0% |"));
        assert!(report.contains(
            "peak RSS + BPF maps 84.0 MiB (meets target: at most 160 MiB), 54.0 MiB steady; \
             daemon CPU 1.00% of a core (meets target: at most 2% of a core)"
        ));
    }
}
