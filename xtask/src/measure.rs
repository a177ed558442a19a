//! What every bench measures with: the workload that keeps the CPUs busy, `/usr/bin/time -v`,
//! `/proc/PID/{stat,status}`, the kernel's `bpf_stats`, medians and ranges.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use crate::run_command;

/// Kills the processes it holds when dropped, so a failed bench leaves nothing running.
pub struct Processes(pub Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Builds the known call tree (`tests/workloads/calltree.c`, with frame pointers) into `dir`:
/// `calltree THREADS SECONDS` keeps THREADS CPUs busy.
pub fn busy_workload(root: &Path, dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let busy = dir.join("calltree");
    run_command(
        Command::new("gcc")
            .args(["-O2", "-fno-omit-frame-pointer", "-o"])
            .arg(&busy)
            .arg(root.join("tests/workloads/calltree.c"))
            .arg("-lpthread"),
    )?;
    Ok(busy)
}

/// Runs `measure` with `kernel.bpf_stats_enabled` on (the kernel then counts each program's
/// run time), and puts the setting back whatever happens.
pub fn with_bpf_stats<T>(measure: impl FnOnce() -> Result<T>) -> Result<T> {
    let path = "/proc/sys/kernel/bpf_stats_enabled";
    let previous = std::fs::read_to_string(path).unwrap_or_else(|_| "0".into());
    std::fs::write(path, "1").with_context(|| format!("enabling {path} (needs root)"))?;
    let result = measure();
    let _ = std::fs::write(path, previous.trim());
    result
}

/// `program args` under `/usr/bin/time -v`.
pub fn timed(program: &Path, args: &[&str]) -> Command {
    let mut command = Command::new("/usr/bin/time");
    command.arg("-v").arg(program).args(args);
    command
}

/// What `/usr/bin/time -v` says about one process.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// User + system.
    pub cpu_seconds: f64,
    pub max_rss_mib: f64,
}

pub fn time_usage(stderr: &str) -> Result<Usage> {
    let field = |name: &str| -> Result<f64> {
        stderr
            .lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("no `{name}` in /usr/bin/time output:\n{stderr}"))
    };
    Ok(Usage {
        cpu_seconds: field("User time (seconds):")? + field("System time (seconds):")?,
        max_rss_mib: field("Maximum resident set size (kbytes):")? / 1024.0,
    })
}

/// Mean run time of the busiest BPF program `pid` holds, from its fdinfo (needs
/// [`with_bpf_stats`]).
pub fn bpf_ns_per_run(pid: u32) -> Option<f64> {
    std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .ok()?
        .flatten()
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

/// The `BPF N ns/sample` of a `scorch record` summary.
pub fn summary_bpf_ns(summary: &str) -> Option<f64> {
    let (_, rest) = summary.split_once("BPF ")?;
    rest.split_whitespace().next()?.parse().ok()
}

/// The sample count a `scorch record` summary starts with.
pub fn summary_samples(summary: &str) -> u64 {
    summary
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// User + system CPU seconds `pid` has used, from `/proc/PID/stat`.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start at the state.
    let rest = stat.rsplit_once(')').context("odd /proc/PID/stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Result<f64> { Ok(fields.get(i).context("short stat")?.parse()?) };
    // utime and stime: fields 14 and 15 of stat, 11 and 12 counting from the state; USER_HZ 100.
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

/// A `/proc/PID/status` field in KiB (`VmRSS:`, `VmHWM:`).
pub fn status_kib(pid: u32, field: &str) -> Result<u64> {
    status_field(&format!("/proc/{pid}/status"), field)
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

/// The first number after `field` in a `/proc` file of `name: value` lines.
pub fn status_field(path: &str, field: &str) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// `pid`'s RSS in MiB every `every` for `length`.
pub fn sample_rss(pid: u32, length: Duration, every: Duration) -> Result<Vec<f64>> {
    let started = Instant::now();
    let mut samples = Vec::new();
    while started.elapsed() < length {
        samples.push(status_kib(pid, "VmRSS:")? as f64 / 1024.0);
        std::thread::sleep(every);
    }
    Ok(samples)
}

pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// `median [min-max]` with `digits` decimals.
pub fn spread(values: &[f64], digits: usize) -> String {
    if values.is_empty() {
        return "n/a".to_owned();
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    format!(
        "{:.digits$} [{:.digits$}-{:.digits$}]",
        median(sorted.clone()),
        sorted[0],
        sorted[sorted.len() - 1]
    )
}

pub fn verdict(ok: bool, target: &str) -> String {
    format!("{} {target}", if ok { "meets" } else { "MISSES" })
}

pub fn path_str(path: &Path) -> Result<&str> {
    path.to_str()
        .with_context(|| format!("non-UTF-8 path {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_output_and_summaries_parse() {
        let stderr = "\tUser time (seconds): 0.12\n\tSystem time (seconds): 0.05\n\t\
                      Maximum resident set size (kbytes): 25600\n";
        let usage = time_usage(stderr).unwrap();
        assert!((usage.cpu_seconds - 0.17).abs() < 1e-9);
        assert_eq!(usage.max_rss_mib, 25.0);
        assert!(time_usage("nothing").is_err());
        let summary = "scorch: 380 samples from 3 processes in 10.00s (1 windows); lost: none; \
                       wrote x (pprof); BPF 1782 ns/sample";
        assert_eq!(summary_bpf_ns(summary), Some(1782.0));
        assert_eq!(summary_samples(summary), 380);
        assert_eq!(spread(&[3.0, 1.0, 2.0], 1), "2.0 [1.0-3.0]");
        assert_eq!(spread(&[], 1), "n/a");
    }
}
