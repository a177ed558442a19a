//! What every bench measures with: the workload that keeps the CPUs busy, `/usr/bin/time -v`,
//! `/proc/PID/status`, a cgroup per measured daemon, the kernel's `bpf_stats`, medians and ranges.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

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

/// What `program args` prints, trimmed; empty when it cannot run (for report headers).
pub fn command_output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
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
    /// System alone: where `bpf(2)` calls show, apart from the user-space work.
    pub system_seconds: f64,
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
    let system_seconds = field("System time (seconds):")?;
    Ok(Usage {
        cpu_seconds: field("User time (seconds):")? + system_seconds,
        system_seconds,
        max_rss_mib: field("Maximum resident set size (kbytes):")? / 1024.0,
    })
}

/// (run_time_ns, run_cnt) of each BPF program `pid` holds, from its fdinfo (the kernel counts
/// them only under [`with_bpf_stats`]).
fn bpf_program_stats(pid: u32) -> std::io::Result<Vec<(f64, f64)>> {
    Ok(fdinfo_texts(pid)?
        .iter()
        .filter_map(|info| {
            Some((
                fdinfo_field(info, "run_time_ns:")?,
                fdinfo_field(info, "run_cnt:")?,
            ))
        })
        .collect())
}

/// The fdinfo texts of `pid`'s descriptors; one closed between the listing and the read is
/// simply gone.
fn fdinfo_texts(pid: u32) -> std::io::Result<Vec<String>> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fdinfo"))?
        .flatten()
        .filter_map(|entry| std::fs::read_to_string(entry.path()).ok())
        .collect())
}

/// The number after `name` (e.g. `memlock:`) in one fdinfo text.
fn fdinfo_field<T: std::str::FromStr>(info: &str, name: &str) -> Option<T> {
    info.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().parse().ok())
}

/// True when one of `pid`'s descriptors is a BPF program.
pub fn holds_bpf_program(pid: u32) -> bool {
    fdinfo_texts(pid).is_ok_and(|texts| {
        texts
            .iter()
            .any(|info| info.lines().any(|l| l.starts_with("prog_type:")))
    })
}

/// Mean run time of the busiest BPF program `pid` holds (needs [`with_bpf_stats`]).
pub fn bpf_ns_per_run(pid: u32) -> Option<f64> {
    bpf_program_stats(pid)
        .ok()?
        .into_iter()
        .filter(|&(_, runs)| runs > 0.0)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(time, runs)| time / runs)
}

/// Seconds the BPF programs `pid` holds have run in all (needs [`with_bpf_stats`]). The kernel
/// runs them in whatever task a sample interrupts, so this CPU is in no process's own figures.
pub fn bpf_run_seconds(pid: u32) -> Result<f64> {
    let stats = bpf_program_stats(pid)
        .with_context(|| format!("reading the BPF programs of {pid} from its fdinfo"))?;
    Ok(stats.iter().map(|&(time, _)| time).sum::<f64>() / 1e9)
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

/// A cgroup (v2) of one process's own, to read its CPU time to the microsecond.
///
/// `/proc/PID/stat` counts in 10 ms ticks: a daemon that uses 0.3% of a core spends 60 ms in
/// 20 s, so a tick either way moved the figure by a sixth, and 99 Hz once read cheaper than
/// 19 Hz. The cgroup's `cpu.stat` counts every thread the process ever ran, exited ones too.
pub struct CpuAccount {
    root: PathBuf,
    dir: PathBuf,
}

impl CpuAccount {
    /// Moves `pid` (with its threads, and the processes and threads it starts later) into a
    /// new cgroup under the cgroup2 mount.
    pub fn of_process(pid: u32) -> Result<CpuAccount> {
        let mounts = std::fs::read_to_string("/proc/self/mounts")?;
        let root = mounts
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|fields| fields.get(2) == Some(&"cgroup2"))
            .and_then(|fields| fields.get(1).map(PathBuf::from))
            .context("no cgroup2 file system mounted (looked in /proc/self/mounts)")?;
        let dir = root.join(format!("scorch-bench-{pid}"));
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let account = CpuAccount { root, dir };
        std::fs::write(account.dir.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("moving {pid} into {}", account.dir.display()))?;
        Ok(account)
    }

    /// CPU seconds (user + system) the cgroup's tasks have used since it was made.
    pub fn cpu_seconds(&self) -> Result<f64> {
        let path = self.dir.join("cpu.stat");
        let usec = status_field(path_str(&path)?, "usage_usec")
            .with_context(|| format!("no usage_usec in {}", path.display()))?;
        Ok(usec as f64 / 1e6)
    }
}

impl Drop for CpuAccount {
    /// Removes the cgroup, first moving back to the root any process still in it (a cgroup
    /// with tasks cannot be removed), as when a failed bench drops this before the daemon.
    fn drop(&mut self) {
        if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = std::fs::write(self.root.join("cgroup.procs"), pid);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
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

/// `/proc/loadavg`'s three averages: on a shared machine, how busy the others kept it.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// IRQ work interrupts taken on all CPUs since boot (`/proc/interrupts`); None where the
/// file cannot be read or has no such line.
pub fn irq_work_interrupts() -> Option<u64> {
    parse_irq_work(&std::fs::read_to_string("/proc/interrupts").ok()?)
}

/// The sum over CPUs of `/proc/interrupts`'s IRQ work line: x86's `IWI`, an `IPIn` on arm64,
/// found by its description rather than its name.
fn parse_irq_work(interrupts: &str) -> Option<u64> {
    let line = interrupts
        .lines()
        .find(|l| l.trim_end().ends_with("IRQ work interrupts"))?;
    let counts = line.split_once(':')?.1;
    Some(
        counts
            .split_whitespace()
            .map_while(|field| field.parse::<u64>().ok())
            .sum(),
    )
}

/// The 1-minute load average alone; NaN when `/proc/loadavg` cannot be read.
pub fn load_one_minute() -> f64 {
    load_average()
        .split_whitespace()
        .next()
        .and_then(|l| l.parse().ok())
        .unwrap_or(f64::NAN)
}

/// The lines of `scorch query --format folded` output (`comm;frame;...;leaf count`, kernel
/// frames marked `_[k]`): each line's comm, its user frames root first, and its count; lines
/// that are not one are skipped.
pub fn folded_user_stacks(text: &str) -> impl Iterator<Item = (&str, Vec<&str>, u64)> {
    text.lines().filter_map(|line| {
        let (stack, count) = line.rsplit_once(' ')?;
        let count = count.parse::<u64>().ok()?;
        let mut frames = stack.split(';');
        let comm = frames.next().unwrap_or_default();
        let user = frames.filter(|f| !f.ends_with("_[k]")).collect();
        Some((comm, user, count))
    })
}

pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Runs `cargo bench --package scorch --bench NAME` (a harness-less bench of the agent's,
/// `configure` adding its arguments or environment) from `root`, its progress on this
/// terminal; returns what it printed.
pub fn cargo_bench(
    root: &Path,
    name: &str,
    configure: impl FnOnce(&mut Command),
) -> Result<String> {
    let mut command = Command::new("cargo");
    command
        .current_dir(root)
        .args(["bench", "--package", "scorch", "--bench", name]);
    configure(&mut command);
    let output = command
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running the {name} bench"))?;
    if !output.status.success() {
        bail!("the {name} bench failed");
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The lines of a bench's output that start with `prefix`, each ending in a newline.
pub fn lines_starting(output: &str, prefix: &str) -> String {
    output
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// `median [min-max]` with `digits` decimals.
pub fn spread(values: &[f64], digits: usize) -> String {
    // NaN: a figure the build measured lacks (an earlier commit's missing metric).
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    if sorted.is_empty() {
        return "n/a".to_owned();
    }
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

/// A metric's value from the `/metrics` of the daemon listening on `address`.
pub fn daemon_metric(address: &str, name: &str) -> Result<f64> {
    metric_value(&metrics_text(address)?, name).with_context(|| format!("no {name} in /metrics"))
}

/// The `/metrics` page of the daemon listening on `address`, headers included.
pub fn metrics_text(address: &str) -> Result<String> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(address)
        .with_context(|| format!("connecting to the daemon's /metrics on {address}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    Ok(text)
}

/// The value of the first line of `text` (a `/metrics` page) that starts with `name`, which
/// may carry labels: `scorch_unwind_walks_total{outcome="no mapping"}`.
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

/// The first child of `pid`.
pub fn first_child(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Kernel memory charged to the BPF maps `pid` holds, in MiB: the sum of `memlock:` over the
/// map descriptors in its fdinfo, each map once however many descriptors refer to it (what
/// `bpftool map show` reports as `memlock`, and how scorch's `scorch_bpf_map_memory_bytes`
/// counts its own). A map that only an outer map refers to, its descriptor closed, is not
/// seen: scorch keeps one for each inner map it creates. `None` when
/// the fdinfo cannot be listed (the process is gone).
pub fn bpf_map_memory_mib(pid: u32) -> Option<f64> {
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    for info in fdinfo_texts(pid).ok()? {
        if !info.lines().any(|l| l.starts_with("map_type:")) {
            continue;
        }
        let id: Option<u64> = fdinfo_field(&info, "map_id:");
        if let (Some(id), Some(memlock)) = (id, fdinfo_field::<u64>(&info, "memlock:")) {
            if seen.insert(id) {
                total += memlock;
            }
        }
    }
    Some(total as f64 / (1 << 20) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn irq_work_is_summed_over_cpus_on_either_architecture() {
        let x86 = "           CPU0       CPU1\n  0:         34          0   IO-APIC    2-edge      timer\n\
                   LOC:    1000000     900000   Local timer interrupts\n\
                   IWI:       3700         12   IRQ work interrupts\n\
                   RTR:          0          0   APIC ICR read retries\n";
        assert_eq!(parse_irq_work(x86), Some(3712));
        let arm64 = "           CPU0       CPU1\n\
                     IPI4:          0          0       Timer broadcast interrupts\n\
                     IPI5:         40          2       IRQ work interrupts\n";
        assert_eq!(parse_irq_work(arm64), Some(42));
        assert_eq!(parse_irq_work("LOC: 5 6 Local timer interrupts\n"), None);
    }

    #[test]
    fn reads_a_number_from_an_fdinfo_text() {
        let info = "pos:\t0\nflags:\t02000002\nmap_type:\t1\nmemlock:\t2228224\nmap_id:\t77\n";
        assert_eq!(fdinfo_field::<u64>(info, "memlock:"), Some(2_228_224));
        assert_eq!(fdinfo_field::<u64>(info, "map_id:"), Some(77));
        assert_eq!(fdinfo_field::<u64>(info, "run_cnt:"), None);
    }

    #[test]
    fn folded_lines_give_comm_user_frames_and_count() {
        let text = "work;main;read;vfs_read_[k] 7\nnot a line\nwork;main;spin x\nsh;main 2\n";
        let lines: Vec<_> = folded_user_stacks(text).collect();
        assert_eq!(
            lines,
            [("work", vec!["main", "read"], 7), ("sh", vec!["main"], 2)]
        );
    }

    #[test]
    fn time_output_and_summaries_parse() {
        let stderr = "\tUser time (seconds): 0.12\n\tSystem time (seconds): 0.05\n\t\
                      Maximum resident set size (kbytes): 25600\n";
        let usage = time_usage(stderr).unwrap();
        assert!((usage.cpu_seconds - 0.17).abs() < 1e-9);
        assert!((usage.system_seconds - 0.05).abs() < 1e-9);
        assert_eq!(usage.max_rss_mib, 25.0);
        assert!(time_usage("nothing").is_err());
        let summary = "scorch: 380 samples from 3 processes in 10.00s (1 windows); lost: none; \
                       wrote x (pprof); BPF 1782 ns/sample";
        assert_eq!(summary_bpf_ns(summary), Some(1782.0));
        assert_eq!(summary_samples(summary), 380);
        assert_eq!(spread(&[3.0, 1.0, 2.0], 1), "2.0 [1.0-3.0]");
        assert_eq!(spread(&[], 1), "n/a");
    }

    #[test]
    fn metric_values_are_read_with_their_labels() {
        let text = "HTTP/1.1 200 OK\r\n\r\n# HELP scorch_samples Samples.\n\
                    scorch_samples_total 156\n\
                    scorch_unwind_walks_total{outcome=\"no mapping\"} 90\n\
                    scorch_unwind_walks_total{outcome=\"completed\"} 77\n";
        assert_eq!(metric_value(text, "scorch_samples_total"), Some(156.0));
        let completed = "scorch_unwind_walks_total{outcome=\"completed\"}";
        assert_eq!(metric_value(text, completed), Some(77.0));
        assert_eq!(metric_value(text, "scorch_unwind_walks_total"), None);
        assert_eq!(metric_value(text, "scorch_missing"), None);
    }
}
