//! `cargo xtask bench --only daemon`: `scorch run` in steady state, and its store.
//!
//! - Steady state: the daemon runs for WINDOWS windows of 10 s at 19 Hz while 2 threads keep
//!   both CPUs busy and 98 light processes wake every 200 ms (about 100 processes in all). After
//!   two windows of warm-up, its CPU time comes from a cgroup of its own (`CpuAccount`) over the
//!   measured windows, and its RSS from /proc/PID/status every second (median and maximum).
//! - Store size: the real windows it stored are cycled into 360 windows (one hour) by the
//!   `store` bench, which compares the store's bytes with the windows' gzipped pprofs.
//! - Query: `scorch query --since 1h --format svg` on that hour, 5 fresh processes, median
//!   wall time.
//! - Views (also `--only views`, which needs no privileges): `agent/benches/views.rs` writes a
//!   day of synthetic 10 s windows (`store::fixtures::synthetic_window`) and times the UI's
//!   timeline over the 24 h and a diff of two 1 h ranges.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::{
    bench::{
        measure::{busy_workload, status_kib, verdict, CpuAccount, Processes},
        micro::views_lines,
        results::{BenchResult, Cell, Table},
        Bench,
    },
    run_command,
};

const LIGHT_PROCESSES: usize = 98;

/// A process that does ~1 ms of work every 200 ms: the long tail of a real host.
const LIGHT_WORKLOAD: &str = r#"
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
volatile unsigned long sink;
__attribute__((noinline)) void tick_work(void) {
    for (unsigned long i = 0; i < 300000; i++) sink += i * i;
}
int main(int argc, char **argv) {
    alarm(argc > 1 ? atoi(argv[1]) : 60);
    for (;;) { tick_work(); usleep(200000); }
}
"#;

pub fn daemon(root: &Path, scorch: &Path, windows: u64, command: String) -> Result<BenchResult> {
    let dir = root.join("target/bench");
    let busy = busy_workload(root, &dir)?;
    let light_source = dir.join("light.c");
    std::fs::write(&light_source, LIGHT_WORKLOAD)?;
    let light = dir.join("light");
    run_command(
        Command::new("gcc")
            .args(["-O2", "-fno-omit-frame-pointer", "-o"])
            .arg(&light)
            .arg(&light_source),
    )?;
    let seconds = (windows + 3) * 10 + 30;
    let mut workloads = Processes(Vec::new());
    workloads.0.push(
        Command::new(&busy)
            .args(["2", &seconds.to_string()])
            .spawn()?,
    );
    for _ in 0..LIGHT_PROCESSES {
        workloads
            .0
            .push(Command::new(&light).arg(seconds.to_string()).spawn()?);
    }

    let store = dir.join("daemon-store");
    let _ = std::fs::remove_dir_all(&store);
    let mut daemon = Processes(vec![Command::new(scorch)
        .args([
            "run",
            "--window",
            "10s",
            "--http-address",
            "127.0.0.1:17071",
            "--store",
        ])
        .arg(&store)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting scorch run")?]);
    let pid = daemon.0[0].id();
    let account = CpuAccount::of_process(pid)?;
    eprintln!("daemon bench: warming up for 2 windows");
    std::thread::sleep(Duration::from_secs(21));
    let cpu_before = account.cpu_seconds()?;
    let started = Instant::now();
    let mut rss = Vec::new();
    while started.elapsed() < Duration::from_secs(windows * 10) {
        rss.push(status_kib(pid, "VmRSS:")?);
        std::thread::sleep(Duration::from_secs(1));
    }
    let cpu = account.cpu_seconds()? - cpu_before;
    let elapsed = started.elapsed().as_secs_f64();
    // SIGTERM, so the daemon flushes and closes its store.
    run_command(Command::new("kill").args(["-TERM", &pid.to_string()]))?;
    let status = daemon.0[0].wait()?;
    if !status.success() {
        bail!("scorch run exited with {status}");
    }
    drop(workloads);
    rss.sort_unstable();
    let core_percent = 100.0 * cpu / elapsed;
    let rss_median = rss[rss.len() / 2] as f64 / 1024.0;
    let rss_max = rss[rss.len() - 1] as f64 / 1024.0;
    let mut report = format!(
        "daemon steady state ({windows} windows of 10 s at 19 Hz, 2 busy CPUs, {} processes): \
         {cpu:.2} CPU s in {elapsed:.0} s = {core_percent:.2}% of one core ({}); \
         RSS median {rss_median:.1} MiB, max {rss_max:.1} MiB ({})\n",
        LIGHT_PROCESSES + 1,
        verdict(core_percent <= 0.5, "target: at most 0.5%"),
        verdict(rss_max * 1.048_576 <= 30.0, "target: at most 30 MB"),
    );

    let replay = dir.join("replay-store");
    let output = Command::new("cargo")
        .current_dir(root)
        .args(["bench", "--package", "scorch", "--bench", "store", "--"])
        .arg(&store)
        .arg(&replay)
        .arg("360")
        .stderr(Stdio::inherit())
        .output()?;
    if !output.status.success() {
        bail!("the store bench failed");
    }
    let store_line = String::from_utf8_lossy(&output.stdout)
        .lines()
        .find(|l| l.starts_with("store:"))
        .unwrap_or("store: no figure")
        .to_owned();
    report.push_str(&store_line);
    report.push('\n');

    let svg = dir.join("query-1h.svg");
    let mut times = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        run_command(
            Command::new(scorch)
                .args(["query", "--since", "1h", "--format", "svg", "--store"])
                .arg(&replay)
                .arg("-o")
                .arg(&svg)
                .stderr(Stdio::null()),
        )?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    report.push_str(&format!(
        "query: merge 360 windows into a flame graph (scorch query --since 1h --format svg, \
         fresh process): median {:.0} ms of 5 (min {:.0}, max {:.0}) ({})\n",
        times[2],
        times[0],
        times[4],
        verdict(times[2] <= 200.0, "target: at most 200 ms")
    ));
    let views = views_lines(root)?;
    report.push_str(&views);
    print!("{report}");
    let path = root.join("target/bench/daemon-report.md");
    std::fs::write(&path, &report)?;
    eprintln!("bench: report written to {}", path.display());

    let mut steady = Table::new(
        "steady",
        &format!(
            "`scorch run` at 19 Hz for {windows} windows of 10 s, 2 busy CPUs, {} processes",
            LIGHT_PROCESSES + 1
        ),
        "",
        &["CPU, % of a core", "RSS MiB"],
    )
    .with_note("CPU from the daemon's own cgroup; RSS read once a second (median [least-most]).");
    let rss_mib: Vec<f64> = rss.iter().map(|&kib| kib as f64 / 1024.0).collect();
    steady.row(
        "`scorch run`",
        vec![Cell::one(core_percent, 2), Cell::of(&rss_mib, 1)],
    );
    let mut query = Table::new(
        "query",
        "`scorch query --since 1h --format svg` of 360 stored windows, fresh processes",
        "",
        &["wall time ms"],
    );
    query.row("merge into a flame graph", vec![Cell::of(&times, 0)]);
    let mut result = BenchResult::new(Bench::Daemon, command);
    result.tables = vec![steady, query];
    result.lines = store_line
        .lines()
        .chain(views.lines())
        .map(str::to_owned)
        .collect();
    Ok(result)
}
