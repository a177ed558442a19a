//! `cargo xtask bench --only offcpu`: what a context switch costs with scorch's off-CPU hook
//! on, against off, written to `target/bench/offcpu.md`.
//!
//! - **Workload.** `tests/workloads/pingpong.c`: two threads bounce a byte over a pair of
//!   pipes for a fixed time, both pinned to CPU 0, every round trip two context switches, as
//!   many as the machine can do, and print the switches per second. A scheduler hook's cost is the switches not
//!   done.
//! - **Profilers.** None; `scorch record` (on-CPU only, its default 19 Hz); `scorch record
//!   --off-cpu` (the `sched_switch` program on every switch, a user-stack walk at every
//!   switch-out); `perf record -e sched:sched_switch -a -g` (a record and a frame-pointer stack
//!   at every switch, what a tool that records every block pays). Each is started and waited
//!   for as the slowdown bench does (sampling, start-up settled), then the workload runs, then
//!   the profiler is stopped with SIGINT; its CPU time (start and writing included) comes from
//!   `/usr/bin/time -v`.
//! - **Rounds.** Every round runs each profiler once, fresh processes each time, the order
//!   changed between rounds; medians are reported. The added time per switch is
//!   `1/rate - 1/rate_none`: the workload is a chain of switches, each waiting for the last.

use std::{
    fmt::Write as _,
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{ensure, Context, Result};

use crate::{
    bench::{
        harness::{round_order, under_profiler, Profiled},
        measure::{command_output, load_average, median, path_str, time_usage, timed},
        results::{BenchResult, Cell, Table},
        Bench,
    },
    run_command,
};

/// Seconds the workload runs for.
const WORK_SECONDS: u64 = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Profiler {
    None,
    ScorchCpu,
    ScorchOffCpu,
    PerfSchedSwitch,
}

const PROFILERS: [Profiler; 4] = [
    Profiler::None,
    Profiler::ScorchCpu,
    Profiler::ScorchOffCpu,
    Profiler::PerfSchedSwitch,
];

impl Profiler {
    fn name(self) -> &'static str {
        match self {
            Profiler::None => "none",
            Profiler::ScorchCpu => "`scorch record` (on-CPU only)",
            Profiler::ScorchOffCpu => "`scorch record --off-cpu`",
            Profiler::PerfSchedSwitch => "`perf record -e sched:sched_switch -a -g`",
        }
    }

    fn command(self, scorch: &Path, dir: &Path) -> Result<Option<Command>> {
        let output = dir.join("out.pb.gz");
        let output = path_str(&output)?;
        let record = ["record", "--duration", "10m", "--output", output];
        Ok(match self {
            Profiler::None => None,
            Profiler::ScorchCpu => Some(timed(scorch, &record)),
            Profiler::ScorchOffCpu => {
                let mut args = record.to_vec();
                args.push("--off-cpu");
                Some(timed(scorch, &args))
            }
            Profiler::PerfSchedSwitch => {
                let data = dir.join("perf.data");
                Some(timed(
                    Path::new("perf"),
                    &[
                        "record",
                        "-q",
                        "-e",
                        "sched:sched_switch",
                        "-a",
                        "-g",
                        "-o",
                        path_str(&data)?,
                    ],
                ))
            }
        })
    }
}

/// One run's figures.
#[derive(Debug, Clone, Default)]
struct Run {
    switches_per_second: f64,
    profiler_cpu: f64,
    /// scorch's off-CPU summary (`off-CPU: N blocks recorded, ...`), when it printed one.
    summary: Option<String>,
}

pub fn offcpu(root: &Path, scorch: &Path, runs: usize, command: String) -> Result<BenchResult> {
    let dir = root.join("target/bench/offcpu");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // A copy of its own, as the slowdown bench keeps: a build meanwhile cannot swap it.
    let pinned = dir.join("scorch");
    std::fs::copy(scorch, &pinned)
        .with_context(|| format!("copying {} to {}", scorch.display(), pinned.display()))?;
    let workload = dir.join("pingpong");
    run_command(
        Command::new("gcc")
            .args(["-O2", "-pthread", "-o"])
            .arg(&workload)
            .arg(root.join("tests/workloads/pingpong.c")),
    )?;
    let cpus = std::thread::available_parallelism()?.get();
    let load_before = load_average();
    let mut results: Vec<Vec<Run>> = vec![Vec::new(); PROFILERS.len()];
    for round in 0..runs {
        for p in round_order(PROFILERS.len(), round) {
            eprintln!(
                "offcpu: round {} of {runs}, {}",
                round + 1,
                PROFILERS[p].name()
            );
            results[p].push(one_run(PROFILERS[p], &pinned, &workload, &dir, cpus)?);
        }
    }
    let load_after = load_average();

    let mut out = String::new();
    writeln!(
        out,
        "# A context switch's cost with the off-CPU hook, commit {}, {}\n",
        command_output("git", &["rev-parse", "--short", "HEAD"]),
        command_output("date", &["-u", "+%Y-%m-%d"]),
    )?;
    writeln!(
        out,
        "`cargo xtask bench --only offcpu --runs {runs}`: `tests/workloads/pingpong.c` (two \
         threads pinned to CPU 0, a byte over two pipes) for {WORK_SECONDS} s under each profiler; medians of \
         {runs} rounds of fresh processes. {cpus} CPUs, {}; load average {load_before} at the \
         start, {load_after} at the end.\n",
        command_output("uname", &["-r"]),
    )?;
    writeln!(
        out,
        "| profiler | switches a second | slowdown vs none | added per switch (ns) | \
         profiler CPU (s) |"
    )?;
    writeln!(out, "|---|---|---|---|---|")?;
    let none = median(
        results[0]
            .iter()
            .map(|run| run.switches_per_second)
            .collect(),
    );
    for (p, profiler) in PROFILERS.iter().enumerate() {
        let rate = median(
            results[p]
                .iter()
                .map(|run| run.switches_per_second)
                .collect(),
        );
        let cpu = median(results[p].iter().map(|run| run.profiler_cpu).collect());
        let (slowdown, added, cpu) = if *profiler == Profiler::None {
            Default::default()
        } else {
            (
                format!("{:.1}%", 100.0 * (none - rate) / none),
                format!("{:.0}", 1e9 / rate - 1e9 / none),
                format!("{cpu:.2}"),
            )
        };
        writeln!(
            out,
            "| {} | {rate:.0} | {slowdown} | {added} | {cpu} |",
            profiler.name()
        )?;
    }
    writeln!(
        out,
        "\n`scorch record --off-cpu`'s own count of each run (blocks sent, the excess over \
         the cap, user-stack walks):\n"
    )?;
    for run in &results[2] {
        writeln!(
            out,
            "- {}",
            run.summary.as_deref().unwrap_or("(no summary)")
        )?;
    }
    let path = root.join("target/bench/offcpu.md");
    std::fs::write(&path, &out).with_context(|| format!("writing {}", path.display()))?;
    print!("{out}");
    eprintln!("bench: report written to {}", path.display());

    let mut table = Table::new(
        "switches",
        &format!("Two threads on one CPU bouncing a byte over pipes for {WORK_SECONDS} s"),
        "profiler",
        &[
            "switches a second",
            "slowdown vs none %",
            "added per switch ns",
            "profiler CPU s",
        ],
    )
    .with_note(
        "Each run against the median of the runs without a profiler. The added time per switch \
         is 1/rate - 1/rate without: the workload is a chain of switches, each waiting for the \
         last.",
    );
    for (p, profiler) in PROFILERS.iter().enumerate() {
        let rates: Vec<f64> = results[p].iter().map(|r| r.switches_per_second).collect();
        let cells = if *profiler == Profiler::None {
            vec![
                Cell::of(&rates, 0),
                Cell::Missing,
                Cell::Missing,
                Cell::Missing,
            ]
        } else {
            let slowdown: Vec<f64> = rates.iter().map(|r| 100.0 * (none - r) / none).collect();
            let added: Vec<f64> = rates.iter().map(|r| 1e9 / r - 1e9 / none).collect();
            let cpu: Vec<f64> = results[p].iter().map(|r| r.profiler_cpu).collect();
            vec![
                Cell::of(&rates, 0),
                Cell::of(&slowdown, 1),
                Cell::of(&added, 0),
                Cell::of(&cpu, 2),
            ]
        };
        table.row(profiler.name(), cells);
    }
    let mut result = BenchResult::new(Bench::Offcpu, command);
    result.tables.push(table);
    Ok(result)
}

fn one_run(
    profiler: Profiler,
    scorch: &Path,
    workload: &Path,
    dir: &Path,
    cpus: usize,
) -> Result<Run> {
    let scratch = dir.join("run");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)?;
    let Some(mut command) = profiler.command(scorch, &scratch)? else {
        return Ok(Run {
            switches_per_second: run_workload(workload)?,
            ..Run::default()
        });
    };
    // record prints its summary on stdout.
    command.stdout(Stdio::piped());
    let Profiled {
        result: switches_per_second,
        output,
        ..
    } = under_profiler(command, profiler.name(), cpus, || run_workload(workload))?;
    // Deleted, then what is left written back now, not during the next run.
    let _ = std::fs::remove_dir_all(&scratch);
    run_command(&mut Command::new("sync"))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    Ok(Run {
        switches_per_second,
        profiler_cpu: time_usage(&stderr)?.cpu_seconds,
        summary: off_cpu_summary(&String::from_utf8_lossy(&output.stdout)),
    })
}

/// The `off-CPU: ...` part of record's summary line.
fn off_cpu_summary(stdout: &str) -> Option<String> {
    let line = stdout.lines().find(|l| l.contains("off-CPU: "))?;
    let start = line.find("off-CPU: ")?;
    Some(line[start..].to_owned())
}

/// Runs the workload and returns the switches a second it printed.
fn run_workload(workload: &Path) -> Result<f64> {
    // Both threads on one CPU: every round trip is two switches on that CPU, not wake-ups
    // across CPUs whose cost depends on where the scheduler put each thread (unpinned, runs
    // beside an on-CPU-only profiler went 30% faster than alone).
    let output = Command::new("taskset")
        .args(["-c", "0"])
        .arg(workload)
        .arg(WORK_SECONDS.to_string())
        .output()
        .with_context(|| format!("running {}", workload.display()))?;
    ensure!(
        output.status.success(),
        "pingpong failed: {}",
        output.status
    );
    let text = String::from_utf8_lossy(&output.stdout);
    switches(&text).with_context(|| format!("pingpong printed {text:?}"))
}

/// `S` from pingpong's `round_trips N switches_per_second S`.
fn switches(text: &str) -> Option<f64> {
    let mut words = text.split_whitespace();
    words.find(|&w| w == "switches_per_second")?;
    words.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pingpong_output_parses() {
        assert_eq!(
            switches("round_trips 120000 switches_per_second 48000\n"),
            Some(48000.0)
        );
        assert_eq!(switches("round_trips 1\n"), None);
    }

    #[test]
    fn the_summary_is_found() {
        let stdout = "scorch: 10 samples ...; off-CPU: 5 blocks recorded, 0 over the cap\n";
        assert_eq!(
            off_cpu_summary(stdout).as_deref(),
            Some("off-CPU: 5 blocks recorded, 0 over the cap")
        );
    }
}
