//! `cargo xtask bench --only jvm`: what walking HotSpot's Java frames costs, written to
//! `target/bench/jvm.md`.
//!
//! - **BPF per sample.** OpenJDK 17 running `tests/workloads/JavaDepth.java` 50 Java frames
//!   deep (each level a compiled frame of its own under the JVM's default flags), a fresh JVM
//!   for each recording, recorded after a warm-up that lets C2 compile the levels by `scorch
//!   record --pid P -F 999` with `--jvm auto` and with `--jvm off` (the native walk of the same
//!   process, which stops in the code cache); beside them `tests/workloads/deeprec.c` 50
//!   native frames deep, built without frame pointers (the native walk through unwind
//!   tables). The order turns by run. BPF ns per sample from `bpf_stats` (scorch's summary),
//!   the Java frames per sample the BPF walk emitted (the summary's `hotspot: N frames`), and
//!   the workload's own frames per sample in the profile written (JavaDepth's methods,
//!   deeprec's functions), which show the depth was walked and named.
//! - **Daemon with 5 JVMs and with none.** A fresh `scorch run` at 19 Hz beside 5 fresh
//!   `java CallTree` processes (one busy thread each) with `--jvm auto`, the same with `--jvm
//!   off`, and `--jvm auto` with no JVM running, the order turning by run: after a warm-up,
//!   the daemon's CPU over the measured span (its own cgroup), its median RSS (`VmRSS` once a
//!   second), its BPF maps, the memory its Java names took in the last window
//!   (`scorch_runtime_names_bytes`) and the Java frames it walked (`/metrics`).

use std::{
    fmt::Write as _,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::{
    bench::{
        harness::{start_daemon, stop},
        measure::{
            command_output, folded_user_stacks, load_average, median, metric_value, metrics_text,
            path_str, sample_rss, spread, summary_bpf_ns, summary_samples, verdict, with_bpf_stats,
            CpuAccount, Processes,
        },
        results::{BenchResult, Cell, Table},
        Bench,
    },
    run_command,
};

const ADDRESS: &str = "127.0.0.1:17096";
/// Debian 12's own OpenJDK, the one the JVM tests run on this host.
const JDK: &str = "/usr/lib/jvm/java-17-openjdk-amd64";
/// Frames of the deep stacks, Java and native.
const DEPTH: usize = 50;
/// From a JVM's start to its recording: C2 has compiled JavaDepth's levels by then.
const JVM_WARM_UP: Duration = Duration::from_secs(5);
const RECORDING: &str = "10s";
const PROCESSES: usize = 5;
const WARM_UP: Duration = Duration::from_secs(20);
const SPAN: Duration = Duration::from_secs(60);
/// Target: the BPF cost of a sample of a 50-frame Java stack.
const TARGET_NS: f64 = 5000.0;

pub fn jvm(root: &Path, scorch: &Path, runs: usize, command: String) -> Result<BenchResult> {
    let dir = std::env::temp_dir().join("scorch-bench-jvm");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let workloads = root.join("tests/workloads");
    let classes = dir.join("classes");
    run_command(
        Command::new(format!("{JDK}/bin/javac"))
            .args(["-g", "-d", path_str(&classes)?])
            .arg(workloads.join("JavaDepth.java"))
            .arg(workloads.join("CallTree.java")),
    )?;
    let deeprec = dir.join("deeprec");
    run_command(
        Command::new("gcc")
            .args(["-O2", "-fomit-frame-pointer", "-g", "-o"])
            .arg(&deeprec)
            .arg(workloads.join("deeprec.c")),
    )?;
    let load_before = load_average();
    let (costs, daemons) = with_bpf_stats(|| {
        let costs = walk_costs(scorch, &classes, &deeprec, &dir, runs.max(5))?;
        let daemons = daemon_costs(scorch, &classes, &dir, runs)?;
        Ok((costs, daemons))
    })?;
    let load_after = load_average();

    let mut out = String::new();
    let commit = command_output("git", &["rev-parse", "--short", "HEAD"]);
    writeln!(out, "# Java walk cost, commit {commit}\n")?;
    writeln!(
        out,
        "`cargo xtask bench --only jvm`: medians of fresh processes, [min-max]; {}; load \
         average {load_before} at the start, {load_after} at the end.\n",
        command_output(&format!("{JDK}/bin/java"), &["--version"])
            .lines()
            .next()
            .unwrap_or("OpenJDK 17"),
    )?;
    writeln!(
        out,
        "## BPF per sample, {DEPTH} frames deep, `scorch record --pid P -F 999 --duration \
         {RECORDING}`\n"
    )?;
    writeln!(
        out,
        "| stack, walk | BPF ns/sample | Java frames/sample (BPF walk) | its frames/sample \
         (profile) | runs |"
    )?;
    writeln!(out, "|---|---|---|---|---|")?;
    for kind in Kind::ALL {
        let rows: Vec<&WalkCost> = costs.iter().filter(|c| c.kind == kind).collect();
        let column = |f: &dyn Fn(&WalkCost) -> f64| rows.iter().map(|c| f(c)).collect::<Vec<_>>();
        writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            kind.label(),
            spread(&column(&|c| c.ns), 0),
            spread(&column(&|c| c.java_frames), 1),
            spread(&column(&|c| c.profile_frames), 1),
            rows.len()
        )?;
    }
    let of = |kind: Kind, f: &dyn Fn(&WalkCost) -> f64| {
        median(costs.iter().filter(|c| c.kind == kind).map(f).collect())
    };
    let java = of(Kind::Java, &|c| c.ns);
    let per_frame = (java - of(Kind::JavaOff, &|c| c.ns)) / of(Kind::Java, &|c| c.java_frames);
    writeln!(
        out,
        "\nTarget, at most 5 us a sample on a {DEPTH}-frame Java stack: {}. The Java walk costs \
         {per_frame:.0} ns a Java frame (`--jvm auto` less `--jvm off`, over the frames it \
         walked); the native walk through unwind tables {:.0} ns a frame.\n",
        verdict(java <= TARGET_NS, "5 us"),
        of(Kind::Native, &|c| c.ns) / of(Kind::Native, &|c| c.profile_frames),
    )?;
    writeln!(
        out,
        "## Daemon at 19 Hz with {PROCESSES} JVMs and with none, {} s measured after {} s\n",
        SPAN.as_secs(),
        WARM_UP.as_secs()
    )?;
    writeln!(
        out,
        "| | CPU, % of a core | RSS, MiB | BPF maps, MiB | RSS + maps, MiB | Java names, KiB \
         | Java frames/s, JVMs walked |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|")?;
    for mode in Mode::ALL {
        let rows: Vec<&DaemonCost> = daemons.iter().filter(|d| d.mode == mode).collect();
        let column = |f: &dyn Fn(&DaemonCost) -> f64| rows.iter().map(|d| f(d)).collect::<Vec<_>>();
        writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {}, {} |",
            mode.label(),
            spread(&column(&|d| d.core_percent), 2),
            spread(&column(&|d| d.rss_mib), 1),
            spread(&column(&|d| d.maps_mib), 1),
            spread(&column(&|d| d.rss_mib + d.maps_mib), 1),
            spread(&column(&|d| d.names_kib), 0),
            spread(&column(&|d| d.java_frames), 0),
            spread(&column(&|d| d.jvms), 0),
        )?;
    }
    let of = |mode: Mode, f: &dyn Fn(&DaemonCost) -> f64| {
        median(daemons.iter().filter(|d| d.mode == mode).map(f).collect())
    };
    let footprint = |d: &DaemonCost| d.rss_mib + d.maps_mib;
    writeln!(
        out,
        "\nWith {PROCESSES} JVMs walked, against no JVM running: {:+.2}% of a core, {:+.1} MiB \
         of RSS + maps. Against `--jvm off` beside the same JVMs: {:+.2}% of a core, {:+.1} MiB \
         of RSS, {:+.1} MiB of BPF maps. The Java names of a window take {:.0} KiB \
         (`scorch_runtime_names_bytes`, at the window's end).",
        of(Mode::Auto, &|d| d.core_percent) - of(Mode::NoJvm, &|d| d.core_percent),
        of(Mode::Auto, &footprint) - of(Mode::NoJvm, &footprint),
        of(Mode::Auto, &|d| d.core_percent) - of(Mode::Off, &|d| d.core_percent),
        of(Mode::Auto, &|d| d.rss_mib) - of(Mode::Off, &|d| d.rss_mib),
        of(Mode::Auto, &|d| d.maps_mib) - of(Mode::Off, &|d| d.maps_mib),
        of(Mode::Auto, &|d| d.names_kib),
    )?;
    let path = root.join("target/bench/jvm.md");
    std::fs::create_dir_all(path.parent().context("bench dir")?)?;
    std::fs::write(&path, &out)?;
    print!("{out}");
    eprintln!("bench: report written to {}", path.display());

    let mut result = BenchResult::new(Bench::Jvm, command);
    result.tables = vec![walk_table(&costs), daemon_table(&daemons)];
    Ok(result)
}

fn walk_table(costs: &[WalkCost]) -> Table {
    let mut walk = Table::new(
        "walk",
        &format!(
            "BPF per sample, {DEPTH} frames deep, `scorch record --pid P -F 999 --duration \
             {RECORDING}`"
        ),
        "stack, walk",
        &[
            "BPF ns/sample",
            "Java frames/sample (BPF walk)",
            "its frames/sample (profile)",
        ],
    )
    .with_note(
        "Java: `JavaDepth` on OpenJDK 17's default flags, each level a C2-compiled frame, \
         recorded after 5 s; `--jvm off` walks the same JVM natively, and stops in its code \
         cache. Native: `deeprec` built without frame pointers, walked through unwind tables. \
         Its frames: the workload's own in the profile written (JavaDepth's methods, deeprec's \
         functions), each inlined method one. Target: at most 5 us a sample on the Java \
         stack.",
    );
    for kind in Kind::ALL {
        let rows: Vec<&WalkCost> = costs.iter().filter(|c| c.kind == kind).collect();
        let column = |f: &dyn Fn(&WalkCost) -> f64, decimals| {
            Cell::of(&rows.iter().map(|c| f(c)).collect::<Vec<_>>(), decimals)
        };
        walk.row(
            kind.label(),
            vec![
                column(&|c| c.ns, 0),
                if kind == Kind::Native {
                    Cell::Missing
                } else {
                    column(&|c| c.java_frames, 1)
                },
                column(&|c| c.profile_frames, 1),
            ],
        );
    }
    walk
}

fn daemon_table(daemons: &[DaemonCost]) -> Table {
    let mut daemon = Table::new(
        "daemon",
        &format!(
            "The daemon at 19 Hz beside {PROCESSES} JVMs and beside none, {} s measured after {} s",
            SPAN.as_secs(),
            WARM_UP.as_secs()
        ),
        "",
        &[
            "CPU, % of a core",
            "RSS MiB",
            "BPF maps MiB",
            "RSS + maps MiB",
            "Java names KiB",
            "Java frames/s",
            "JVMs walked",
        ],
    )
    .with_note(
        "Each JVM runs `CallTree` in one busy thread, started afresh for each daemon. Java \
         names: `scorch_runtime_names_bytes{runtime=\"hotspot\"}`, what the last window's \
         names took before it ended.",
    );
    for mode in Mode::ALL {
        let rows: Vec<&DaemonCost> = daemons.iter().filter(|d| d.mode == mode).collect();
        let column = |f: &dyn Fn(&DaemonCost) -> f64, decimals| {
            Cell::of(&rows.iter().map(|d| f(d)).collect::<Vec<_>>(), decimals)
        };
        daemon.row(
            mode.label().to_owned(),
            vec![
                column(&|d| d.core_percent, 2),
                column(&|d| d.rss_mib, 1),
                column(&|d| d.maps_mib, 1),
                column(&|d| d.rss_mib + d.maps_mib, 1),
                column(&|d| d.names_kib, 0),
                column(&|d| d.java_frames, 0),
                column(&|d| d.jvms, 0),
            ],
        );
    }
    daemon
}

/// What a daemon of the second part runs beside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The JVMs, walked.
    Auto,
    /// The JVMs, not walked (`--jvm off`).
    Off,
    /// No JVM running (`--jvm auto`).
    NoJvm,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Auto, Mode::Off, Mode::NoJvm];

    fn label(self) -> &'static str {
        match self {
            Mode::Auto => "scorch `--jvm auto`, 5 JVMs",
            Mode::Off => "scorch `--jvm off`, 5 JVMs",
            Mode::NoJvm => "scorch `--jvm auto`, no JVM",
        }
    }

    fn flag(self) -> &'static str {
        match self {
            Mode::Auto | Mode::NoJvm => "auto",
            Mode::Off => "off",
        }
    }
}

/// What one recording of the first part walks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// JavaDepth with `--jvm auto`.
    Java,
    /// JavaDepth with `--jvm off`.
    JavaOff,
    /// deeprec, through unwind tables.
    Native,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Java, Kind::JavaOff, Kind::Native];

    fn label(self) -> &'static str {
        match self {
            Kind::Java => "Java, `--jvm auto`",
            Kind::JavaOff => "Java, `--jvm off`",
            Kind::Native => "native (C, unwind tables)",
        }
    }
}

struct WalkCost {
    kind: Kind,
    ns: f64,
    /// Java frames the BPF walk emitted a sample.
    java_frames: f64,
    /// The workload's own frames a sample in the profile written (inlined methods each).
    profile_frames: f64,
}

/// The Java frames a summary says the walk emitted.
fn summary_hotspot_frames(summary: &str) -> f64 {
    summary
        .split("hotspot: ")
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

impl Kind {
    /// Whether a frame of the profile is one of the workload's own.
    fn ours(self, frame: &str) -> bool {
        match self {
            Kind::Java | Kind::JavaOff => frame.starts_with("JavaDepth"),
            Kind::Native => matches!(frame, "main" | "descend" | "spin"),
        }
    }
}

fn walk_costs(
    scorch: &Path,
    classes: &Path,
    deeprec: &Path,
    dir: &Path,
    runs: usize,
) -> Result<Vec<WalkCost>> {
    let mut costs = Vec::new();
    let seconds = (JVM_WARM_UP.as_secs() + 60).to_string();
    for run in 0..runs {
        let mut order = Kind::ALL;
        order.rotate_left(run % Kind::ALL.len());
        for kind in order {
            let (process, warm_up) = match kind {
                Kind::Java | Kind::JavaOff => (
                    Command::new(format!("{JDK}/bin/java"))
                        .args(["-cp", path_str(classes)?, "JavaDepth"])
                        .args([&DEPTH.to_string(), &seconds])
                        .stdout(Stdio::null())
                        .spawn()
                        .context("starting java")?,
                    JVM_WARM_UP,
                ),
                // main + DEPTH - 2 descend + spin.
                Kind::Native => (
                    Command::new(deeprec)
                        .args([&(DEPTH - 3).to_string(), &seconds])
                        .spawn()
                        .context("starting deeprec")?,
                    Duration::from_millis(500),
                ),
            };
            let process = Processes(vec![process]);
            std::thread::sleep(warm_up);
            let pid = process.0[0].id().to_string();
            let mode = if kind == Kind::Java { "auto" } else { "off" };
            let folded = dir.join("walk.folded");
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
                .args(["--jvm", mode, "-o", path_str(&folded)?])
                .stderr(Stdio::null())
                .output()
                .context("running scorch record")?;
            drop(process);
            let summary = String::from_utf8_lossy(&output.stdout).trim().to_owned();
            if !output.status.success() {
                bail!(
                    "scorch record ({}) exited with {}",
                    kind.label(),
                    output.status
                );
            }
            let samples = summary_samples(&summary).max(1) as f64;
            let ns = summary_bpf_ns(&summary)
                .with_context(|| format!("no BPF cost in scorch's summary: {summary}"))?;
            let java_frames = summary_hotspot_frames(&summary) / samples;
            let profile_frames =
                frames_per_sample(&std::fs::read_to_string(&folded)?, |f| kind.ours(f));
            eprintln!(
                "bench: jvm walk, {}: {ns:.0} ns/sample, {java_frames:.1} Java frames/sample \
                 walked, {profile_frames:.1} of its frames/sample in the profile; {summary}",
                kind.label()
            );
            costs.push(WalkCost {
                kind,
                ns,
                java_frames,
                profile_frames,
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
    /// The Java names of the last window (`/metrics`).
    names_kib: f64,
    /// Java frames walked a second, and JVMs walked (`/metrics`): the path measured.
    java_frames: f64,
    jvms: f64,
}

fn daemon_costs(scorch: &Path, classes: &Path, dir: &Path, runs: usize) -> Result<Vec<DaemonCost>> {
    // Long enough for one daemon, with a minute to spare: the JVMs stop by themselves.
    let seconds = (JVM_WARM_UP + WARM_UP + SPAN + Duration::from_secs(60))
        .as_secs()
        .to_string();
    let mut daemons = Vec::new();
    for run in 0..runs {
        let mut order = Mode::ALL;
        order.rotate_left(run % Mode::ALL.len());
        for mode in order {
            let jvms = if mode == Mode::NoJvm {
                Processes(Vec::new())
            } else {
                let jvms = Processes(
                    (0..PROCESSES)
                        .map(|_| {
                            Command::new(format!("{JDK}/bin/java"))
                                .args(["-cp", path_str(classes)?, "CallTree", &seconds, "1"])
                                .stdout(Stdio::null())
                                .spawn()
                                .context("starting java")
                        })
                        .collect::<Result<_>>()?,
                );
                // Past the JVMs' start and their first compilations.
                std::thread::sleep(JVM_WARM_UP);
                jvms
            };
            let store = dir.join(format!("store-{run}-{}", mode.flag()));
            let cost = daemon_run(scorch, &store, mode)?;
            drop(jvms);
            let _ = std::fs::remove_dir_all(&store);
            eprintln!(
                "bench: daemon, {}: {:.2}% of a core, RSS {:.1} MiB, maps {:.1} MiB, Java \
                 names {:.0} KiB, {:.0} Java frames/s from {} JVMs",
                mode.label(),
                cost.core_percent,
                cost.rss_mib,
                cost.maps_mib,
                cost.names_kib,
                cost.java_frames,
                cost.jvms
            );
            daemons.push(cost);
        }
    }
    Ok(daemons)
}

fn daemon_run(scorch: &Path, store: &Path, mode: Mode) -> Result<DaemonCost> {
    let daemon = start_daemon(scorch, store, 19, ADDRESS, &["--jvm", mode.flag()])?;
    let pid = daemon.0[0].id();
    let account = CpuAccount::of_process(pid)?;
    std::thread::sleep(WARM_UP);
    let before = account.cpu_seconds()?;
    let started = Instant::now();
    let rss = sample_rss(pid, SPAN, Duration::from_secs(1))?;
    let cpu = account.cpu_seconds()? - before;
    let elapsed = started.elapsed().as_secs_f64();
    let metrics = metrics_text(ADDRESS)?;
    let maps = metric_value(&metrics, "scorch_bpf_map_memory_bytes")
        .context("no scorch_bpf_map_memory_bytes in /metrics")?
        / (1 << 20) as f64;
    // With `--jvm off` the daemon has no HotSpot counters at all.
    let hotspot = |name: &str| {
        metric_value(&metrics, &format!(r#"{name}{{runtime="hotspot"}}"#)).unwrap_or(0.0)
    };
    let java_frames = hotspot("scorch_runtime_frames_total") / (WARM_UP + SPAN).as_secs_f64();
    let names_kib = hotspot("scorch_runtime_names_bytes") / 1024.0;
    let jvms = metric_value(&metrics, "scorch_runtime_processes").unwrap_or(0.0);
    stop(daemon).with_context(|| format!("scorch run, {}", mode.label()))?;
    drop(account);
    Ok(DaemonCost {
        mode,
        core_percent: cpu / elapsed * 100.0,
        rss_mib: median(rss),
        maps_mib: maps,
        names_kib,
        java_frames,
        jvms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_and_folded_text_give_frames_per_sample() {
        let summary = "scorch: 9990 samples from 1 processes in 10.00s (1 windows); lost: none; \
                       hotspot: 489510 frames, stops: none; BPF 3100 ns/sample";
        assert_eq!(summary_hotspot_frames(summary), 489_510.0);
        assert_eq!(summary_hotspot_frames("scorch: 3 samples; lost: none"), 0.0);
        let folded = "java;start_thread;JavaDepth.main;JavaDepth.run;JavaDepth$A.down 3\n\
                      java;start_thread;JavaDepth.main;read_[k] 1\nnot a line\n";
        let java = |f: &str| Kind::Java.ours(f);
        assert_eq!(frames_per_sample(folded, java), 2.5);
        assert_eq!(frames_per_sample("", java), 0.0);
        assert!(Kind::Native.ours("descend") && !Kind::Native.ours("JavaDepth.main"));
    }
}
