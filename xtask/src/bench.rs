//! `cargo xtask bench`: the figures the closing notes quote, measured the way a reviewer can
//! believe them.
//!
//! - scorch record and `perf record -F 19 -a -g` run side by side for the same seconds, in fresh
//!   processes, while a workload keeps every CPU busy; the start order alternates between runs.
//!   CPU time (user + system) and peak RSS come from `/usr/bin/time -v`. Medians are reported.
//! - BPF cost per sample: with `kernel.bpf_stats_enabled=1`, the program's run_time_ns /
//!   run_cnt as the kernel counts them (scorch prints it in its summary). bpftrace runs the
//!   equivalent program (`profile:hz:19 { @[kstack, ustack, pid] = count(); }`) in the same
//!   seconds as a peer, read from its program's fdinfo.
//! - kallsyms load and lookup: the criterion bench `agent/benches/kallsyms.rs`.
//! - Remote sink (`--only remote`): `agent/benches/remote.rs`, given the scorch binary: CPU to
//!   encode and send a window of 100 series, RSS with the server down and an hour queued, and
//!   how fast that backlog drains.
//! - UI views (`--only views`, and within `daemon`): `agent/benches/views.rs`, the timeline
//!   over 24 h of windows and a diff of two 1 h ranges.
//! - Unwind tables (`--only unwind`): `agent/benches/unwind.rs`, the time to build libc's (and
//!   ld.so's, libstdc++'s) table from its file, median and max of 20 fresh builds, and its size.

use std::{
    fmt::Write as _,
    path::Path,
    process::{Child, Command, Output, Stdio},
    time::Duration,
};

use anyhow::{bail, Context, Result};

use crate::run_command;

/// What `/usr/bin/time -v` says about one process.
#[derive(Debug, Clone, Copy)]
struct Usage {
    cpu_seconds: f64,
    max_rss_kib: u64,
}

#[derive(Debug)]
struct Run {
    scorch: Usage,
    perf: Usage,
    bpf_ns_per_sample: Option<f64>,
    bpftrace_ns_per_sample: Option<f64>,
    scorch_samples: u64,
}

pub fn bench(
    root: &Path,
    scorch: &Path,
    seconds: u64,
    runs: usize,
    only: Option<&str>,
    daemon_windows: u64,
) -> Result<()> {
    match only {
        None => {
            record_bench(root, scorch, seconds, runs)?;
            symbolize_bench(root)?;
            daemon_report(root, scorch, daemon_windows)?;
            remote_report(root, scorch)?;
            unwind_report(root)
        }
        Some("record") => record_bench(root, scorch, seconds, runs),
        Some("symbolize") => symbolize_bench(root),
        Some("daemon") => daemon_report(root, scorch, daemon_windows),
        Some("remote") => remote_report(root, scorch),
        Some("unwind") => unwind_report(root),
        Some("views") => views_report(root),
        Some("overhead") => {
            let phases = crate::bench_overhead::Phases::standard(seconds);
            let report = crate::bench_overhead::overhead(root, scorch, runs, phases)?;
            print!("{report}");
            Ok(())
        }
        Some(other) => {
            bail!(
                "--only {other:?}: expected record, symbolize, daemon, remote, unwind, views or \
                 overhead"
            )
        }
    }
}

/// Unwind-table build time and size; needs no scorch binary and no privileges, so `main`
/// runs it without the setup and release build the other parts need.
pub fn unwind_report(root: &Path) -> Result<()> {
    let dir = root.join("target/bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let output = Command::new("cargo")
        .current_dir(root)
        .args(["bench", "--package", "scorch", "--bench", "unwind"])
        .stderr(Stdio::inherit())
        .output()
        .context("running the unwind bench")?;
    if !output.status.success() {
        bail!("the unwind bench failed");
    }
    let report: String = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| l.starts_with("unwind:"))
        .map(|l| format!("{l}\n"))
        .collect();
    print!("{report}");
    let path = dir.join("unwind-report.md");
    std::fs::write(&path, &report)?;
    eprintln!("bench: report written to {}", path.display());
    Ok(())
}

/// The UI views' query times over a synthetic day; like the unwind report, it needs no scorch
/// binary and no privileges.
pub fn views_report(root: &Path) -> Result<()> {
    let dir = root.join("target/bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let report = crate::bench_daemon::views_bench(root)?;
    print!("{report}");
    let path = dir.join("views-report.md");
    std::fs::write(&path, &report)?;
    eprintln!("bench: report written to {}", path.display());
    Ok(())
}

fn remote_report(root: &Path, scorch: &Path) -> Result<()> {
    let dir = root.join("target/bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let output = Command::new("cargo")
        .current_dir(root)
        .args(["bench", "--package", "scorch", "--bench", "remote", "--"])
        .arg(scorch)
        .arg(&dir)
        .stderr(Stdio::inherit())
        .output()
        .context("running the remote bench")?;
    if !output.status.success() {
        bail!("the remote bench failed");
    }
    let report: String = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| l.starts_with("remote:"))
        .map(|l| format!("{l}\n"))
        .collect();
    print!("{report}");
    let path = dir.join("remote-report.md");
    std::fs::write(&path, &report)?;
    eprintln!("bench: report written to {}", path.display());
    Ok(())
}

fn daemon_report(root: &Path, scorch: &Path, windows: u64) -> Result<()> {
    let report = crate::bench_daemon::daemon_bench(root, scorch, windows)?;
    print!("{report}");
    let path = root.join("target/bench/daemon-report.md");
    std::fs::write(&path, &report)?;
    eprintln!("bench: report written to {}", path.display());
    Ok(())
}

fn record_bench(root: &Path, scorch: &Path, seconds: u64, runs: usize) -> Result<()> {
    let dir = root.join("target/bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let workload = dir.join("calltree");
    run_command(
        Command::new("gcc")
            .args(["-O2", "-fno-omit-frame-pointer", "-o"])
            .arg(&workload)
            .arg(root.join("tests/workloads/calltree.c"))
            .arg("-lpthread"),
    )?;
    let cpus = std::thread::available_parallelism()?.get();

    let stats_path = "/proc/sys/kernel/bpf_stats_enabled";
    let previous_stats = std::fs::read_to_string(stats_path).unwrap_or_else(|_| "0".into());
    std::fs::write(stats_path, "1")
        .with_context(|| format!("enabling {stats_path} (needs root)"))?;
    let result = (|| -> Result<Vec<Run>> {
        let mut results = Vec::new();
        for run in 0..runs {
            eprintln!(
                "bench: run {} of {runs}: scorch and perf side by side for {seconds} s",
                run + 1
            );
            let mut burner = Command::new(&workload)
                .args([cpus.to_string(), (seconds + 60).to_string()])
                .spawn()
                .context("starting the workload")?;
            std::thread::sleep(Duration::from_millis(500));
            let mut bpftrace = Command::new("bpftrace")
                .args(["-e", "profile:hz:19 { @[kstack, ustack, pid] = count(); }"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting bpftrace (cargo xtask setup installs it)")?;
            let scorch_out = dir.join(format!("scorch-{run}.pb.gz"));
            let perf_out = dir.join(format!("perf-{run}.data"));
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
            // Alternate who starts first so neither always pays for the other's start-up.
            let (scorch_out, perf_out) = if run % 2 == 0 {
                let s = spawn(scorch_cmd)?;
                let p = spawn(perf_cmd)?;
                (wait(s)?, wait(p)?)
            } else {
                let p = spawn(perf_cmd)?;
                let s = spawn(scorch_cmd)?;
                (wait(s)?, wait(p)?)
            };
            let bpftrace_ns_per_sample = bpf_prog_ns_per_run(bpftrace.id());
            let _ = bpftrace.kill();
            let _ = bpftrace.wait();
            let _ = burner.kill();
            let _ = burner.wait();
            let summary = String::from_utf8_lossy(&scorch_out.stdout).into_owned();
            eprintln!("bench:   {}", summary.trim());
            results.push(Run {
                scorch: parse_time(&scorch_out)?,
                perf: parse_time(&perf_out)?,
                bpf_ns_per_sample: parse_bpf_ns(&summary),
                bpftrace_ns_per_sample,
                scorch_samples: summary
                    .split_whitespace()
                    .nth(1)
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0),
            });
        }
        Ok(results)
    })();
    let warm = match &result {
        Ok(_) => warm_bpf_cost(scorch, &workload, cpus, &dir),
        Err(_) => Ok(String::new()),
    };
    let _ = std::fs::write(stats_path, previous_stats.trim());
    let results = result?;
    let warm = warm?;

    let mut report = String::new();
    writeln!(
        report,
        "# scorch record vs perf record -F 19 -a -g, {seconds} s, {cpus} busy CPUs"
    )?;
    writeln!(report)?;
    writeln!(report, "| run | scorch CPU s | perf CPU s | scorch max RSS MiB | perf max RSS MiB | scorch BPF ns/sample | bpftrace BPF ns/sample | samples |")?;
    writeln!(report, "|---|---|---|---|---|---|---|---|")?;
    for (i, r) in results.iter().enumerate() {
        writeln!(
            report,
            "| {} | {:.3} | {:.3} | {:.1} | {:.1} | {} | {} | {} |",
            i + 1,
            r.scorch.cpu_seconds,
            r.perf.cpu_seconds,
            r.scorch.max_rss_kib as f64 / 1024.0,
            r.perf.max_rss_kib as f64 / 1024.0,
            r.bpf_ns_per_sample
                .map_or("n/a".into(), |n| format!("{n:.0}")),
            r.bpftrace_ns_per_sample
                .map_or("n/a".into(), |n| format!("{n:.0}")),
            r.scorch_samples,
        )?;
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let scorch_cpu = median(results.iter().map(|r| r.scorch.cpu_seconds).collect());
    let perf_cpu = median(results.iter().map(|r| r.perf.cpu_seconds).collect());
    let scorch_rss = median(
        results
            .iter()
            .map(|r| r.scorch.max_rss_kib as f64 / 1024.0)
            .collect(),
    );
    let perf_rss = median(
        results
            .iter()
            .map(|r| r.perf.max_rss_kib as f64 / 1024.0)
            .collect(),
    );
    let bpf = median(results.iter().filter_map(|r| r.bpf_ns_per_sample).collect());
    let bpftrace = median(
        results
            .iter()
            .filter_map(|r| r.bpftrace_ns_per_sample)
            .collect(),
    );
    writeln!(report)?;
    writeln!(
        report,
        "medians: scorch {scorch_cpu:.3} CPU s vs perf {perf_cpu:.3} ({}); scorch max RSS {scorch_rss:.1} MiB ({}), perf {perf_rss:.1} MiB; BPF {bpf:.0} ns/sample ({}; bpftrace's equivalent program {bpftrace:.0} ns)",
        // `time` reports 10 ms steps; sums of its figures carry float noise.
        verdict(scorch_cpu <= perf_cpu + 1e-6, "target: no more than perf"),
        verdict(scorch_rss <= 20.0, "target: at most 20 MiB"),
        verdict(bpf <= 2000.0, "target: at most 2000 ns"),
    )?;
    writeln!(report)?;
    writeln!(report, "{warm}")?;
    print!("{report}");
    let report_path = dir.join("report.md");
    std::fs::write(&report_path, &report)?;
    eprintln!("bench: report written to {}", report_path.display());

    // kallsyms load and lookup, with criterion.
    run_command(Command::new("cargo").current_dir(root).args([
        "bench",
        "--package",
        "scorch",
        "--bench",
        "kallsyms",
    ]))
}

/// User symbolisation, warm and cold. The cold case needs a binary with a lot of DWARF: scorch
/// itself built as release with full debug info (inline records included), more inlining, and
/// its own crate split into 256 codegen units (each repeats the type information it uses): about
/// 110 MiB of DWARF. In its own target directory so it never replaces the binary under test.
fn symbolize_bench(root: &Path) -> Result<()> {
    let target_dir = root.join("target/bigdwarf");
    run_command(
        Command::new("cargo")
            .current_dir(root)
            .env("CARGO_PROFILE_RELEASE_DEBUG", "2")
            // Inlining more (LLVM's threshold is 225) multiplies the inline records and
            // location lists, and takes the DWARF past 100 MB: the size of a large C++ service's debug info, where a
            // parse that holds it all would show.
            .env("RUSTFLAGS", "-C llvm-args=-inline-threshold=1000")
            .env("CARGO_PROFILE_RELEASE_STRIP", "none")
            .args(["build", "--release", "--package", "scorch"])
            .args([
                "--config",
                "profile.release.package.scorch.codegen-units=256",
            ])
            .arg("--target-dir")
            .arg(&target_dir),
    )?;
    run_command(
        Command::new("cargo")
            .current_dir(root)
            .env("SCORCH_BIG_DWARF_BINARY", target_dir.join("release/scorch"))
            .args(["bench", "--package", "scorch", "--bench", "symbolize"]),
    )
}

/// BPF cost per sample at 997 Hz, where the program and its maps stay in cache between
/// samples: the program's own cost, next to bpftrace's equivalent in the same seconds. At 19 Hz
/// every sample starts cold, and the cold misses dominate.
fn warm_bpf_cost(scorch: &Path, workload: &Path, cpus: usize, dir: &Path) -> Result<String> {
    let mut burner = Command::new(workload)
        .args([cpus.to_string(), "40".to_string()])
        .spawn()
        .context("starting the workload")?;
    std::thread::sleep(Duration::from_millis(500));
    let mut bpftrace = Command::new("bpftrace")
        .args(["-e", "profile:hz:997 { @[kstack, ustack, pid] = count(); }"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting bpftrace")?;
    let out = dir.join("scorch-997hz.pb.gz");
    let scorch_run = Command::new(scorch)
        .args([
            "record",
            "-F",
            "997",
            "--duration",
            "10s",
            "--output",
            path_str(&out)?,
        ])
        .stderr(Stdio::null())
        .output();
    let peer = bpf_prog_ns_per_run(bpftrace.id());
    let _ = bpftrace.kill();
    let _ = bpftrace.wait();
    let _ = burner.kill();
    let _ = burner.wait();
    let summary = String::from_utf8_lossy(&scorch_run?.stdout).into_owned();
    Ok(format!(
        "at 997 Hz (warm caches): scorch BPF {} ns/sample, bpftrace {} ns/sample ({})",
        parse_bpf_ns(&summary).map_or("n/a".into(), |n| format!("{n:.0}")),
        peer.map_or("n/a".into(), |n| format!("{n:.0}")),
        summary.trim()
    ))
}

fn verdict(ok: bool, target: &str) -> String {
    format!("{} {target}", if ok { "meets" } else { "MISSES" })
}

fn path_str(path: &Path) -> Result<&str> {
    path.to_str()
        .with_context(|| format!("non-UTF-8 path {}", path.display()))
}

fn timed(program: &Path, args: &[&str]) -> Command {
    let mut command = Command::new("/usr/bin/time");
    command.arg("-v").arg(program).args(args);
    command
}

fn spawn(mut command: Command) -> Result<Child> {
    command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {command:?} (cargo xtask setup installs `time`)"))
}

fn wait(child: Child) -> Result<Output> {
    let output = child.wait_with_output()?;
    if !output.status.success() {
        bail!(
            "benchmark command failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(output)
}

fn parse_time(output: &Output) -> Result<Usage> {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let field = |name: &str| -> Result<f64> {
        stderr
            .lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("no `{name}` in /usr/bin/time output:\n{stderr}"))
    };
    Ok(Usage {
        cpu_seconds: field("User time (seconds):")? + field("System time (seconds):")?,
        max_rss_kib: field("Maximum resident set size (kbytes):")? as u64,
    })
}

/// Mean run time of the busiest BPF program `pid` holds, from its fdinfo (needs
/// kernel.bpf_stats_enabled).
fn bpf_prog_ns_per_run(pid: u32) -> Option<f64> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/fdinfo")).ok()?;
    dir.flatten()
        .filter_map(|entry| std::fs::read_to_string(entry.path()).ok())
        .filter_map(|info| {
            let field = |name: &str| -> Option<f64> {
                info.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .and_then(|v| v.trim().parse().ok())
            };
            Some((field("run_time_ns:")?, field("run_cnt:")?))
        })
        .filter(|&(_, runs)| runs > 0.0)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(time, runs)| time / runs)
}

fn parse_bpf_ns(summary: &str) -> Option<f64> {
    let (_, rest) = summary.split_once("BPF ")?;
    rest.split_whitespace().next()?.parse().ok()
}
