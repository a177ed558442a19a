//! `cargo xtask bench --only python`: what walking Python frames costs, written to
//! `target/bench/python.md`.
//!
//! - **BPF per sample.** Debian 12's `python3.11` running `tests/workloads/pydepth.py` 50
//!   frames deep, recorded by `scorch record --pid P -F 999` with `--python auto` and with
//!   `--python off` (the native walk of the same process), a fresh interpreter for each
//!   recording and the order alternating by run: BPF ns per sample from `bpf_stats` (scorch's
//!   summary), and the Python frames per sample, which show the walk ran.
//! - **Daemon with 20 interpreters.** 20 `python3.11 calltree.py` processes; a fresh `scorch
//!   run` at 19 Hz with `--python auto`, then one with `--python off`, alternating by run: after
//!   a warm-up, the daemon's CPU over the measured span (its own cgroup), its median RSS
//!   (`VmRSS` once a second) and its BPF maps (`scorch_bpf_map_memory_bytes` from `/metrics`).
//! - **py-spy alongside.** On the same 20 processes, 20 `py-spy record --rate 19
//!   --nonblocking` (one per process, as py-spy takes one) for the same span: their CPU and
//!   peak RSS summed, from `/usr/bin/time`.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::bench::{
    harness::{start_daemon, stop},
    measure::{
        command_output, daemon_metric, median, path_str, sample_rss, spread, summary_bpf_ns,
        summary_samples, verdict, with_bpf_stats, CpuAccount, Processes,
    },
    results::{BenchResult, Cell, Table},
    Bench,
};

const ADDRESS: &str = "127.0.0.1:17094";
const INTERPRETER: &str = "/usr/bin/python3.11";
const PROCESSES: usize = 20;
const WARM_UP: Duration = Duration::from_secs(20);
const SPAN: Duration = Duration::from_secs(60);
/// py-spy's release the tests use, cached where they cache it.
const PY_SPY_VERSION: &str = "0.4.3";

pub fn python(root: &Path, scorch: &Path, runs: usize, command: String) -> Result<BenchResult> {
    let workloads = root.join("tests/workloads");
    let (costs, daemons, spies) = with_bpf_stats(|| {
        let costs = walk_costs(scorch, &workloads.join("pydepth.py"), runs.max(5))?;
        let (daemons, spies) = daemon_costs(scorch, &workloads.join("calltree.py"), runs)?;
        Ok((costs, daemons, spies))
    })?;
    let mut out = String::new();
    let commit = command_output("git", &["rev-parse", "--short", "HEAD"]);
    writeln!(out, "# Python walk cost, commit {commit}\n")?;
    writeln!(
        out,
        "`cargo xtask bench --only python`: medians of fresh processes, [min-max].\n"
    )?;
    writeln!(
        out,
        "## BPF per sample, {INTERPRETER} 50 Python frames deep, `scorch record -F 999`\n"
    )?;
    writeln!(
        out,
        "| `--python` | BPF ns/sample | Python frames/sample | runs |"
    )?;
    writeln!(out, "|---|---|---|---|")?;
    for mode in ["auto", "off"] {
        let rows: Vec<&WalkCost> = costs.iter().filter(|c| c.mode == mode).collect();
        writeln!(
            out,
            "| {mode} | {} | {} | {} |",
            spread(&rows.iter().map(|c| c.ns).collect::<Vec<_>>(), 0),
            spread(&rows.iter().map(|c| c.frames).collect::<Vec<_>>(), 1),
            rows.len()
        )?;
    }
    let auto = median(
        costs
            .iter()
            .filter(|c| c.mode == "auto")
            .map(|c| c.ns)
            .collect(),
    );
    writeln!(
        out,
        "\nTarget, at most 5 us a sample on a 50-frame Python stack: {}\n",
        verdict(auto <= 5000.0, "5 us")
    )?;
    writeln!(
        out,
        "## Daemon at 19 Hz with {PROCESSES} interpreters, {} s measured after {} s\n",
        SPAN.as_secs(),
        WARM_UP.as_secs()
    )?;
    writeln!(
        out,
        "| | CPU, % of a core | RSS, MiB | BPF maps, MiB | RSS + maps, MiB | Python frames/s, \
         processes walked |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|")?;
    for mode in ["auto", "off"] {
        let rows: Vec<&DaemonCost> = daemons.iter().filter(|d| d.mode == mode).collect();
        let column = |f: &dyn Fn(&DaemonCost) -> f64| rows.iter().map(|d| f(d)).collect::<Vec<_>>();
        writeln!(
            out,
            "| scorch `--python {mode}` | {} | {} | {} | {} | {}, {} |",
            spread(&column(&|d| d.core_percent), 2),
            spread(&column(&|d| d.rss_mib), 1),
            spread(&column(&|d| d.maps_mib), 1),
            spread(&column(&|d| d.rss_mib + d.maps_mib), 1),
            spread(&column(&|d| d.python_frames), 0),
            spread(&column(&|d| d.python_processes), 0),
        )?;
    }
    writeln!(
        out,
        "| {PROCESSES} py-spy at 19 Hz, summed | {} | {} (peak, summed) | | | |",
        spread(&spies.iter().map(|s| s.core_percent).collect::<Vec<_>>(), 2),
        spread(&spies.iter().map(|s| s.rss_mib).collect::<Vec<_>>(), 1),
    )?;
    let of = |mode: &str, f: &dyn Fn(&DaemonCost) -> f64| {
        median(daemons.iter().filter(|d| d.mode == mode).map(f).collect())
    };
    let cpu = of("auto", &|d| d.core_percent) - of("off", &|d| d.core_percent);
    let memory = of("auto", &|d| d.rss_mib + d.maps_mib) - of("off", &|d| d.rss_mib + d.maps_mib);
    writeln!(
        out,
        "\nPython walking on, against off: {cpu:+.2}% of a core ({}), {memory:+.1} MiB of RSS \
         and maps ({}).",
        verdict(cpu <= 0.3, "+0.3%"),
        verdict(memory <= 10.0, "+10 MiB")
    )?;
    let path = root.join("target/bench/python.md");
    std::fs::create_dir_all(path.parent().context("bench dir")?)?;
    std::fs::write(&path, &out)?;
    print!("{out}");
    eprintln!("bench: report written to {}", path.display());

    let mut walk = Table::new(
        "walk",
        &format!("BPF per sample, {INTERPRETER} 50 Python frames deep, `scorch record -F 999`"),
        "`--python`",
        &["BPF ns/sample", "Python frames/sample"],
    );
    for mode in ["auto", "off"] {
        let rows: Vec<&WalkCost> = costs.iter().filter(|c| c.mode == mode).collect();
        walk.row(
            mode,
            vec![
                Cell::of(&rows.iter().map(|c| c.ns).collect::<Vec<_>>(), 0),
                Cell::of(&rows.iter().map(|c| c.frames).collect::<Vec<_>>(), 1),
            ],
        );
    }
    let mut daemon = Table::new(
        "daemon",
        &format!(
            "The daemon at 19 Hz beside {PROCESSES} interpreters, {} s measured after {} s",
            SPAN.as_secs(),
            WARM_UP.as_secs()
        ),
        "",
        &[
            "CPU, % of a core",
            "RSS MiB",
            "BPF maps MiB",
            "RSS + maps MiB",
            "Python frames/s",
        ],
    )
    .with_note("py-spy: one `py-spy record --rate 19 --nonblocking` per process, summed; its RSS is each one's peak, summed.");
    for mode in ["auto", "off"] {
        let rows: Vec<&DaemonCost> = daemons.iter().filter(|d| d.mode == mode).collect();
        let column = |f: &dyn Fn(&DaemonCost) -> f64, decimals| {
            Cell::of(&rows.iter().map(|d| f(d)).collect::<Vec<_>>(), decimals)
        };
        daemon.row(
            format!("`scorch run --python {mode}`"),
            vec![
                column(&|d| d.core_percent, 2),
                column(&|d| d.rss_mib, 1),
                column(&|d| d.maps_mib, 1),
                column(&|d| d.rss_mib + d.maps_mib, 1),
                column(&|d| d.python_frames, 0),
            ],
        );
    }
    daemon.row(
        format!("{PROCESSES} `py-spy record`"),
        vec![
            Cell::of(&spies.iter().map(|s| s.core_percent).collect::<Vec<_>>(), 2),
            Cell::of(&spies.iter().map(|s| s.rss_mib).collect::<Vec<_>>(), 1),
            Cell::Missing,
            Cell::Missing,
            Cell::Missing,
        ],
    );
    let mut result = BenchResult::new(Bench::Python, command);
    result.tables = vec![walk, daemon];
    Ok(result)
}

/// Walking on and off, in an order that alternates by run.
fn modes(run: usize) -> [&'static str; 2] {
    if run.is_multiple_of(2) {
        ["auto", "off"]
    } else {
        ["off", "auto"]
    }
}

struct WalkCost {
    mode: &'static str,
    ns: f64,
    frames: f64,
}

/// The Python frames a summary says the walk emitted.
fn summary_python_frames(summary: &str) -> f64 {
    summary
        .split("python: ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

fn walk_costs(scorch: &Path, script: &Path, runs: usize) -> Result<Vec<WalkCost>> {
    let mut costs = Vec::new();
    for run in 0..runs {
        for mode in modes(run) {
            let python = Processes(vec![Command::new(INTERPRETER)
                .arg(script)
                .args(["50", "12"])
                .spawn()
                .context("starting python3.11")?]);
            std::thread::sleep(Duration::from_millis(500));
            let pid = python.0[0].id().to_string();
            let folded = std::env::temp_dir().join("scorch-bench-python-walk.folded");
            let output = Command::new(scorch)
                .args([
                    "record",
                    "--pid",
                    &pid,
                    "-F",
                    "999",
                    "--duration",
                    "5s",
                    "--python",
                    mode,
                    "-o",
                ])
                .arg(&folded)
                .stderr(Stdio::null())
                .output()
                .context("running scorch record")?;
            if !output.status.success() {
                bail!(
                    "scorch record --python {mode} exited with {}",
                    output.status
                );
            }
            let summary = String::from_utf8_lossy(&output.stdout).into_owned();
            let samples = summary_samples(&summary).max(1) as f64;
            let ns = summary_bpf_ns(&summary)
                .with_context(|| format!("no BPF cost in scorch's summary: {summary}"))?;
            let frames = summary_python_frames(&summary) / samples;
            eprintln!("bench: python walk, --python {mode}: {ns:.0} ns/sample, {frames:.1} Python frames/sample");
            costs.push(WalkCost { mode, ns, frames });
        }
    }
    Ok(costs)
}

struct DaemonCost {
    mode: &'static str,
    core_percent: f64,
    rss_mib: f64,
    maps_mib: f64,
    /// Python frames walked a second, and processes walked (`/metrics`): the path measured.
    python_frames: f64,
    python_processes: f64,
}

struct SpyCost {
    core_percent: f64,
    rss_mib: f64,
}

fn daemon_costs(
    scorch: &Path,
    script: &Path,
    runs: usize,
) -> Result<(Vec<DaemonCost>, Vec<SpyCost>)> {
    let interpreters = Processes(
        (0..PROCESSES)
            .map(|_| {
                Command::new(INTERPRETER)
                    .arg(script)
                    .arg("100000")
                    .spawn()
                    .context("starting python3.11")
            })
            .collect::<Result<_>>()?,
    );
    let pids: Vec<u32> = interpreters.0.iter().map(|c| c.id()).collect();
    let py_spy = py_spy()?;
    let dir = std::env::temp_dir().join("scorch-bench-python");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let mut daemons = Vec::new();
    let mut spies = Vec::new();
    for run in 0..runs {
        for mode in modes(run) {
            daemons.push(daemon_run(
                scorch,
                &dir.join(format!("store-{run}-{mode}")),
                mode,
            )?);
            let last = daemons.last().expect("pushed");
            eprintln!(
                "bench: daemon --python {mode}: {:.2}% of a core, RSS {:.1} MiB, maps {:.1} MiB, \
                 {:.0} Python frames/s from {} processes",
                last.core_percent,
                last.rss_mib,
                last.maps_mib,
                last.python_frames,
                last.python_processes
            );
        }
        spies.push(py_spy_run(&py_spy, &pids, &dir, run)?);
    }
    drop(interpreters);
    Ok((daemons, spies))
}

fn daemon_run(scorch: &Path, store: &Path, mode: &'static str) -> Result<DaemonCost> {
    let daemon = start_daemon(scorch, store, 19, ADDRESS, &["--python", mode])?;
    let pid = daemon.0[0].id();
    let account = CpuAccount::of_process(pid)?;
    std::thread::sleep(WARM_UP);
    let before = account.cpu_seconds()?;
    let started = Instant::now();
    let rss = sample_rss(pid, SPAN, Duration::from_secs(1))?;
    let cpu = account.cpu_seconds()? - before;
    let elapsed = started.elapsed().as_secs_f64();
    let maps = daemon_metric(ADDRESS, "scorch_bpf_map_memory_bytes")? / (1 << 20) as f64;
    let python_frames = daemon_metric(ADDRESS, r#"scorch_runtime_frames_total{runtime="python"}"#)?
        / (WARM_UP + SPAN).as_secs_f64();
    let python_processes = daemon_metric(ADDRESS, "scorch_runtime_processes")?;
    stop(daemon).with_context(|| format!("scorch run --python {mode}"))?;
    drop(account);
    Ok(DaemonCost {
        mode,
        core_percent: cpu / elapsed * 100.0,
        rss_mib: median(rss),
        maps_mib: maps,
        python_frames,
        python_processes,
    })
}

fn py_spy_run(py_spy: &Path, pids: &[u32], dir: &Path, run: usize) -> Result<SpyCost> {
    let mut children = Vec::new();
    for (i, pid) in pids.iter().enumerate() {
        let usage = dir.join(format!("py-spy-{run}-{i}.time"));
        children.push((
            usage.clone(),
            Command::new("/usr/bin/time")
                .args(["-f", "%U %S %M", "-o", path_str(&usage)?])
                .arg(py_spy)
                .args(["record", "--rate", "19", "--nonblocking", "--format", "raw"])
                .args(["--duration", &SPAN.as_secs().to_string()])
                .args(["--pid", &pid.to_string(), "-o"])
                .arg(dir.join(format!("py-spy-{run}-{i}.txt")))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting py-spy")?,
        ));
    }
    let (mut seconds, mut kib) = (0.0, 0.0);
    for (usage, mut child) in children {
        let status = child.wait()?;
        if !status.success() {
            bail!("py-spy exited with {status}");
        }
        let text = std::fs::read_to_string(&usage)?;
        let fields: Vec<f64> = text
            .split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect();
        let [user, system, peak] = fields[..] else {
            bail!("{}: {text:?}", usage.display());
        };
        seconds += user + system;
        kib += peak;
    }
    let cost = SpyCost {
        core_percent: seconds / SPAN.as_secs_f64() * 100.0,
        rss_mib: kib / 1024.0,
    };
    eprintln!(
        "bench: {} py-spy: {:.2}% of a core, {:.1} MiB peak RSS summed",
        pids.len(),
        cost.core_percent,
        cost.rss_mib
    );
    Ok(cost)
}

/// py-spy's static binary from its PyPI wheel, in the tests' cache.
fn py_spy() -> Result<PathBuf> {
    let dir = Path::new("/var/cache/scorch-tests/py-spy").join(PY_SPY_VERSION);
    let binary = dir.join("py-spy");
    if !binary.exists() {
        bail!(
            "{} is missing: `cargo xtask test` (its Python tests) fetches it",
            binary.display()
        );
    }
    Ok(binary)
}
