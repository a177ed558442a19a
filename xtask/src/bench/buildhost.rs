//! `cargo xtask bench --only buildhost`: the daemon on a host that builds Rust (issue 55).
//!
//! - **The daemon.** A fresh `scorch run` at 19 Hz per run (its own store, a free port),
//!   profiling the whole host as a new user's does. Once it samples (its log says so), a
//!   second of kernel work (so it has loaded the kernel's symbols, as a daemon that has run a
//!   while has: otherwise the build would pay for them and they would stay after it), then
//!   [`SETTLE`]; its footprint before the build is the median of [`BEFORE_READINGS`]
//!   readings of `scorch_footprint_bytes` a second apart.
//! - **The build.** `cargo build --release -p xtask --offline --locked` of this repository
//!   into an empty target directory, deleted after the run: the crate the issue measured with,
//!   whose dependencies are all in the registry cache that the daemon's own build filled, so it
//!   needs no network. Each rustc maps librustc_driver and libLLVM, each over a million unwind
//!   rows, and there are dozens of them, one after another and side by side.
//! - **The figures.** From the build's start, once a second: the daemon's RSS, and from its
//!   `/metrics` its footprint (RSS + BPF map memory), BPF maps, row pools and symbol cache.
//!   VmHWM is reset as the build starts and read at the last reading, so the peak RSS includes
//!   moments between readings. After the build ends the readings go on until the footprint is
//!   back within [`BACK_WITHIN_MIB`] of its level before and [`AFTER_AT_LEAST`] has passed
//!   (the figure a minute after the build), or until [`AFTER_AT_MOST`]. The daemon's
//!   counters of tables moved and dropped as idle, and of pool memory given back, are taken
//!   over the same span: that the pools grew and then shrank shows the code path ran.
//!
//! The daemon profiles every process of the host: on a shared machine others' compilers are
//! profiled too and slow the build, so each run gives the load average as its build started.

use std::{
    fmt::Write as _,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{ensure, Context, Result};

use crate::bench::{
    harness::{free_address, kernel_work, start_daemon_logging, stop, wait_until_profiling},
    measure::{
        load_one_minute, median, metric_value, metrics_text, status_kib, verdict, Processes,
    },
    results::{BenchResult, Cell, Table},
    Bench,
};

/// After the daemon samples: its first windows read the maps of every running process and
/// build their tables, and the footprint gauge needs a window's map memory.
const SETTLE: Duration = Duration::from_secs(20);
const BEFORE_READINGS: usize = 5;
const EVERY: Duration = Duration::from_secs(1);
/// The targets.
const BACK_WITHIN_MIB: f64 = 12.0;
const TARGET_BACK_SECONDS: f64 = 60.0;
const TARGET_PEAK_RSS_MIB: f64 = 64.0;
const TARGET_FOOTPRINT_MIB: f64 = 96.0;
/// Readings after the build go on at least this long, for the footprint a minute after it.
const AFTER_AT_LEAST: Duration = Duration::from_secs(60);
/// And at most this long: a footprint not back by then is reported as not back.
const AFTER_AT_MOST: Duration = Duration::from_secs(180);
const MIB: f64 = (1 << 20) as f64;

/// One reading of the daemon, MiB; NaN for a metric `/metrics` did not give.
#[derive(Debug, Clone, Copy)]
struct Reading {
    rss: f64,
    footprint: f64,
    maps: f64,
    pools: f64,
    symbol_cache: f64,
}

impl Reading {
    fn take(pid: u32, address: &str) -> Result<Reading> {
        let page = metrics_text(address)?;
        let mib = |name: &str| metric_value(&page, name).map_or(f64::NAN, |v| v / MIB);
        Ok(Reading {
            rss: status_kib(pid, "VmRSS:")? as f64 / 1024.0,
            footprint: mib("scorch_footprint_bytes"),
            maps: mib("scorch_bpf_map_memory_bytes"),
            pools: mib("scorch_unwind_row_pools_bytes"),
            symbol_cache: mib("scorch_symbol_cache_bytes"),
        })
    }
}

/// One run's figures, MiB unless named otherwise.
#[derive(Debug, Clone, Default)]
struct Run {
    build_seconds: f64,
    /// The host's 1-minute load average as the build started.
    load: f64,
    footprint_before: f64,
    rss_before: f64,
    peak_rss: f64,
    peak_footprint: f64,
    peak_maps: f64,
    peak_pools: f64,
    peak_symbol_cache: f64,
    /// At the first reading [`AFTER_AT_LEAST`] after the build's end.
    footprint_a_minute_after: f64,
    rss_a_minute_after: f64,
    pools_at_end: f64,
    /// Seconds from the build's end to the first reading back within [`BACK_WITHIN_MIB`] of
    /// before; `None` when none was within [`AFTER_AT_MOST`].
    back_after: Option<f64>,
    tables_moved: f64,
    tables_idle: f64,
    pools_given_back: f64,
}

impl Run {
    fn summary(&self) -> String {
        format!(
            "build {:.0} s (load {:.2}); footprint {:.1} MiB before, peak {:.1} (RSS peak {:.1}, \
             maps {:.1}, row pools {:.1}, symbol cache {:.1}), {:.1} a minute after; back \
             within {BACK_WITHIN_MIB} MiB {}; {} tables moved, {} idle, {:.1} MiB of pools \
             given back",
            self.build_seconds,
            self.load,
            self.footprint_before,
            self.peak_footprint,
            self.peak_rss,
            self.peak_maps,
            self.peak_pools,
            self.peak_symbol_cache,
            self.footprint_a_minute_after,
            back_text(self.back_after),
            self.tables_moved,
            self.tables_idle,
            self.pools_given_back,
        )
    }
}

fn back_text(back: Option<f64>) -> String {
    match back {
        Some(seconds) => format!("after {seconds:.0} s"),
        None => format!("not within {} s", AFTER_AT_MOST.as_secs()),
    }
}

/// The median of the runs' times back, a run never back counting as the longest.
fn median_back(runs: &[Run]) -> Option<f64> {
    let backs = runs
        .iter()
        .map(|r| r.back_after.unwrap_or(f64::INFINITY))
        .collect();
    Some(median(backs)).filter(|s| s.is_finite())
}

pub fn buildhost(root: &Path, scorch: &Path, runs: usize, command: String) -> Result<BenchResult> {
    let dir = root.join("target/bench/buildhost");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut measured = Vec::new();
    for run in 0..runs.max(1) {
        eprintln!("buildhost: run {} of {runs}", run + 1);
        let figures =
            measure_run(root, scorch, &dir, run).with_context(|| format!("run {}", run + 1))?;
        eprintln!("buildhost:   {}", figures.summary());
        measured.push(figures);
    }
    let result = result(&measured, command);
    let report = render(&result, &measured);
    let path = root.join("target/bench/buildhost.md");
    std::fs::write(&path, &report).with_context(|| format!("writing {}", path.display()))?;
    print!("{report}");
    eprintln!("buildhost: report written to {}", path.display());
    Ok(result)
}

fn measure_run(root: &Path, scorch: &Path, dir: &Path, run: usize) -> Result<Run> {
    let tag = format!("run{}", run + 1);
    let store = dir.join(format!("store-{tag}"));
    let target = dir.join(format!("target-{tag}"));
    for fresh in [&store, &target] {
        let _ = std::fs::remove_dir_all(fresh);
    }
    let log_path = dir.join(format!("daemon-{tag}.log"));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let address = free_address()?;
    let mut daemon = start_daemon_logging(scorch, &store, 19, &address, &[], log.into())?;
    let pid = daemon.0[0].id();
    wait_until_profiling(&mut daemon, &log_path)?;
    kernel_work()?;
    std::thread::sleep(SETTLE);
    let mut before = Vec::new();
    for _ in 0..BEFORE_READINGS {
        before.push(Reading::take(pid, &address)?);
        std::thread::sleep(EVERY);
    }
    let footprint_before = median(before.iter().map(|r| r.footprint).collect());
    let rss_before = median(before.iter().map(|r| r.rss).collect());
    ensure!(
        footprint_before.is_finite(),
        "no scorch_footprint_bytes in the daemon's /metrics after {SETTLE:?}"
    );
    let counters_before = metrics_text(&address)?;
    let load = load_one_minute();

    // The peak so far is the start-up's: reset it, so the one read at the end is the build's.
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .with_context(|| format!("resetting the peak RSS of {pid}"))?;
    let build_log_path = dir.join(format!("build-{tag}.log"));
    let build_log = std::fs::File::create(&build_log_path)
        .with_context(|| format!("creating {}", build_log_path.display()))?;
    let started = Instant::now();
    let mut build = Processes(vec![Command::new("cargo")
        .current_dir(root)
        .args([
            "build",
            "--release",
            "--offline",
            "--locked",
            "--package",
            "xtask",
            "--target-dir",
        ])
        .arg(&target)
        .stdout(Stdio::null())
        .stderr(build_log)
        .spawn()
        .context("starting cargo build")?]);
    let mut readings = Vec::new();
    let status = loop {
        readings.push(Reading::take(pid, &address)?);
        if let Some(status) = build.0[0].try_wait()? {
            break status;
        }
        std::thread::sleep(EVERY);
    };
    ensure!(
        status.success(),
        "the build exited with {status}; see {}",
        build_log_path.display()
    );
    let build_seconds = started.elapsed().as_secs_f64();
    drop(build);

    let ended = Instant::now();
    let (mut back_after, mut a_minute_after) = (None, None);
    loop {
        let reading = Reading::take(pid, &address)?;
        let since = ended.elapsed();
        readings.push(reading);
        if back_after.is_none() && reading.footprint <= footprint_before + BACK_WITHIN_MIB {
            back_after = Some(since.as_secs_f64());
        }
        if since >= AFTER_AT_LEAST && a_minute_after.is_none() {
            a_minute_after = Some(reading);
        }
        if (back_after.is_some() && since >= AFTER_AT_LEAST) || since >= AFTER_AT_MOST {
            break;
        }
        std::thread::sleep(EVERY);
    }
    let peak_rss = status_kib(pid, "VmHWM:")? as f64 / 1024.0;
    let counters_after = metrics_text(&address)?;
    stop(daemon).with_context(|| format!("stopping scorch run; see {}", log_path.display()))?;
    // The build's output is hundreds of megabytes; the store is the daemon's, not measured.
    for done in [&target, &store] {
        std::fs::remove_dir_all(done).with_context(|| format!("removing {}", done.display()))?;
    }

    let delta = |name: &str| {
        metric_value(&counters_after, name).unwrap_or(f64::NAN)
            - metric_value(&counters_before, name).unwrap_or(f64::NAN)
    };
    let peak = |f: fn(&Reading) -> f64| readings.iter().map(f).fold(f64::NAN, f64::max);
    Ok(Run {
        build_seconds,
        load,
        footprint_before,
        rss_before,
        peak_rss,
        peak_footprint: peak(|r| r.footprint),
        peak_maps: peak(|r| r.maps),
        peak_pools: peak(|r| r.pools),
        peak_symbol_cache: peak(|r| r.symbol_cache),
        footprint_a_minute_after: a_minute_after.map_or(f64::NAN, |r| r.footprint),
        rss_a_minute_after: a_minute_after.map_or(f64::NAN, |r| r.rss),
        pools_at_end: readings.last().map_or(f64::NAN, |r| r.pools),
        back_after,
        tables_moved: delta("scorch_unwind_tables_moved_total"),
        tables_idle: delta("scorch_unwind_tables_idle_total"),
        pools_given_back: delta("scorch_unwind_row_pools_given_back_bytes_total") / MIB,
    })
}

/// The runs' figures as tables: each run, their medians, and the targets.
fn result(runs: &[Run], command: String) -> BenchResult {
    let mut table = Table::new(
        "runs",
        "`scorch run` at 19 Hz beside `cargo build --release -p xtask` into an empty target \
         directory",
        "run",
        &[
            "build s",
            "load",
            "footprint before MiB",
            "RSS before MiB",
            "peak RSS MiB",
            "peak footprint MiB",
            "peak BPF maps MiB",
            "peak row pools MiB",
            "row pools at the end MiB",
            "peak symbol cache MiB",
            "footprint a minute after MiB",
            "RSS a minute after MiB",
            "back within 12 MiB after s",
            "tables moved",
            "tables idle",
            "pools given back MiB",
        ],
    )
    .with_note(&format!(
        "A fresh daemon each run, profiling the whole host. Footprint: `scorch_footprint_bytes` \
         (RSS + BPF map memory); before: the median of {BEFORE_READINGS} readings after the \
         warm-up. Peaks: the largest of the readings taken once a second from the build's \
         start to the last reading, but peak RSS is VmHWM, reset as the build starts. The \
         readings go on after the build until the footprint is back within {BACK_WITHIN_MIB} \
         MiB of before and {} s have passed, or for {} s; back after: seconds from the build's \
         end to the first reading within. Tables moved and idle, pools given back: the \
         daemon's counters over that span. Load: the host's 1-minute load average as the build \
         started: the daemon also profiles what else the host runs.",
        AFTER_AT_LEAST.as_secs(),
        AFTER_AT_MOST.as_secs(),
    ));
    let back_cell =
        |back: Option<f64>| back.map_or_else(|| Cell::text(back_text(None)), |s| Cell::one(s, 0));
    let cells = |of: &dyn Fn(&Run) -> f64, decimals: usize| -> Cell {
        Cell::of(&runs.iter().map(of).collect::<Vec<_>>(), decimals)
    };
    type Column = (fn(&Run) -> f64, usize);
    let columns: [Column; 12] = [
        (|r| r.build_seconds, 0),
        (|r| r.load, 2),
        (|r| r.footprint_before, 1),
        (|r| r.rss_before, 1),
        (|r| r.peak_rss, 1),
        (|r| r.peak_footprint, 1),
        (|r| r.peak_maps, 1),
        (|r| r.peak_pools, 1),
        (|r| r.pools_at_end, 1),
        (|r| r.peak_symbol_cache, 1),
        (|r| r.footprint_a_minute_after, 1),
        (|r| r.rss_a_minute_after, 1),
    ];
    let counters: [Column; 3] = [
        (|r| r.tables_moved, 0),
        (|r| r.tables_idle, 0),
        (|r| r.pools_given_back, 1),
    ];
    for (index, run) in runs.iter().enumerate() {
        let mut row: Vec<Cell> = columns.iter().map(|(f, d)| Cell::one(f(run), *d)).collect();
        row.push(back_cell(run.back_after));
        row.extend(counters.iter().map(|(f, d)| Cell::one(f(run), *d)));
        table.row(format!("run {}", index + 1), row);
    }
    let mut row: Vec<Cell> = columns.iter().map(|(f, d)| cells(f, *d)).collect();
    row.push(if runs.iter().all(|r| r.back_after.is_some()) {
        cells(&|r| r.back_after.unwrap_or(f64::NAN), 0)
    } else {
        back_cell(median_back(runs))
    });
    row.extend(counters.iter().map(|(f, d)| cells(f, *d)));
    table.row("median [least-most]", row);

    let mut targets = Table::new(
        "targets",
        "The issue's targets, on the medians",
        "target",
        &["median", "verdict"],
    );
    let of = |f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
    let (peak_rss, footprint) = (of(|r| r.peak_rss), of(|r| r.peak_footprint));
    let back = median_back(runs);
    let mut target = |name: String, value: String, ok: bool| {
        let word = if ok { "met" } else { "missed" };
        targets.row(name, vec![Cell::text(value), Cell::text(word)]);
    };
    target(
        format!("peak RSS at most {TARGET_PEAK_RSS_MIB:.0} MiB"),
        format!("{peak_rss:.1} MiB"),
        peak_rss <= TARGET_PEAK_RSS_MIB,
    );
    target(
        format!("peak footprint at most {TARGET_FOOTPRINT_MIB:.0} MiB"),
        format!("{footprint:.1} MiB"),
        footprint <= TARGET_FOOTPRINT_MIB,
    );
    target(
        format!(
            "footprint back within {BACK_WITHIN_MIB:.0} MiB of before, within \
             {TARGET_BACK_SECONDS:.0} s of the build's end"
        ),
        back.map_or_else(|| back_text(None), |s| format!("{s:.0} s")),
        back.is_some_and(|s| s <= TARGET_BACK_SECONDS),
    );
    let mut result = BenchResult::new(Bench::Buildhost, command);
    result.tables = vec![table, targets];
    result
}

/// `target/bench/buildhost.md`: each run's line and the verdicts.
fn render(result: &BenchResult, runs: &[Run]) -> String {
    let mut out = format!(
        "# Build host: `scorch run` beside `cargo build --release -p xtask`, commit {}, {}\n\n\
         `{}` on {}.\n\n",
        result.host.commit,
        result.host.date,
        result.command,
        result.host.machine()
    );
    for (index, run) in runs.iter().enumerate() {
        let _ = writeln!(out, "- run {}: {}", index + 1, run.summary());
    }
    out.push('\n');
    if let Some(targets) = result.table("targets") {
        for row in &targets.rows {
            let cell = |i: usize| match row.cells.get(i) {
                Some(Cell::Text { text }) => text.clone(),
                _ => String::new(),
            };
            let _ = writeln!(
                out,
                "{} ({})",
                cell(0),
                verdict(cell(1) == "met", &format!("target: {}", row.label))
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(peak_rss: f64, peak_footprint: f64, back_after: Option<f64>) -> Run {
        Run {
            build_seconds: 100.0,
            footprint_before: 30.0,
            peak_rss,
            peak_footprint,
            back_after,
            ..Run::default()
        }
    }

    #[test]
    fn a_run_never_back_counts_as_the_longest() {
        let runs = [
            run(1.0, 1.0, Some(40.0)),
            run(1.0, 1.0, None),
            run(1.0, 1.0, Some(20.0)),
        ];
        assert_eq!(median_back(&runs), Some(40.0));
        let runs = [
            run(1.0, 1.0, None),
            run(1.0, 1.0, None),
            run(1.0, 1.0, Some(20.0)),
        ];
        assert_eq!(median_back(&runs), None);
        assert_eq!(median_back(&runs[2..]), Some(20.0));
    }

    #[test]
    fn the_targets_are_judged_on_the_medians() {
        let verdicts = |runs: &[Run]| -> Vec<Cell> {
            let result = result(runs, "cargo xtask bench --only buildhost".into());
            let targets = result.table("targets").unwrap();
            targets.rows.iter().map(|r| r.cells[1].clone()).collect()
        };
        let runs = [
            run(60.0, 90.0, Some(30.0)),
            run(70.0, 100.0, None),
            run(50.0, 95.0, Some(50.0)),
        ];
        assert_eq!(verdicts(&runs), vec![Cell::text("met"); 3]);
        let result = result(&runs, "cargo xtask bench --only buildhost".into());
        let targets = result.table("targets").unwrap();
        assert_eq!(targets.rows[2].cells[0], Cell::text("50 s"));
        let table = result.table("runs").unwrap();
        assert_eq!(table.rows.len(), 4);
        assert_eq!(
            table.cell("run 2", "back within 12 MiB after s"),
            Some(&Cell::text("not within 180 s"))
        );
        assert_eq!(
            table.cell("median [least-most]", "back within 12 MiB after s"),
            Some(&Cell::one(50.0, 0))
        );
        assert_eq!(
            table.cell("median [least-most]", "peak RSS MiB"),
            Some(&Cell::of(&[60.0, 70.0, 50.0], 1))
        );
        let report = render(&result, &runs);
        assert!(report.contains("60.0 MiB (meets target: peak RSS at most 64 MiB)"));

        let runs = vec![run(65.0, 97.0, Some(61.0)); 3];
        assert_eq!(verdicts(&runs), vec![Cell::text("missed"); 3]);
    }
}
