//! What the benches share to run what they measure: a daemon started and stopped, a profiler
//! started, waited for until it samples and stopped, the order of rounds, and the process
//! churn and kernel work several benches put the daemon under. The measurements themselves
//! are in [`super::measure`].

use std::{
    net::TcpListener,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};

use crate::{
    bench::measure::{first_child, holds_bpf_program, path_str, Processes},
    run_command,
};

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

/// A local address no one listens on now.
pub fn free_address() -> Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.to_string())
}

/// Waits until the daemon started by [`start_daemon_logging`] with its log at `log` samples:
/// its HTTP server answers before its BPF program is attached, and the log says when it is.
pub fn wait_until_profiling(daemon: &mut Processes, log: &Path) -> Result<()> {
    let ready = Instant::now();
    while !std::fs::read_to_string(log).is_ok_and(|text| text.contains(" profiling; ")) {
        if let Some(status) = daemon.0[0].try_wait()? {
            bail!("scorch run exited with {status}; see {}", log.display());
        }
        ensure!(
            ready.elapsed() < Duration::from_secs(60),
            "scorch run did not start sampling within a minute; see {}",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
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

/// Longest a profiler may take to start sampling.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The order of `n` profilers in `round`: a different stride through them each round, so
/// each follows a different one (a rotation keeps every profiler after the same neighbour:
/// scorch always ran after perf's DWARF run, whose hundreds of megabytes had just pushed
/// the binaries scorch reads out of the page cache).
pub(crate) fn round_order(n: usize, round: usize) -> Vec<usize> {
    let strides: Vec<usize> = (1..n.max(2)).filter(|&k| gcd(k, n) == 1).collect();
    let stride = strides[round % strides.len()];
    (0..n).map(|i| (i * stride + round) % n).collect()
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// What [`under_profiler`] gives back.
pub(crate) struct Profiled<T> {
    /// What the work returned.
    pub result: T,
    /// The profiler's output.
    pub output: std::process::Output,
    /// The profiler's user + system seconds once it was ready, before the work began.
    pub start_cpu: f64,
    /// The profiler's user + system seconds while `work` ran.
    pub during_cpu: f64,
}

/// Clock ticks a second in `/proc/PID/stat`: `USER_HZ`, fixed at 100 by the x86-64 ABI
/// whatever the kernel's own `HZ`.
const USER_HZ: f64 = 100.0;

/// Runs `work` under the profiler `command` (under `/usr/bin/time -v`, its stderr piped
/// here): starts it, waits until it samples and has settled, runs `work`, stops it with SIGINT,
/// and checks it ended well. Returns `work`'s result, the profiler's output, the CPU time it
/// had used when `work` began, and what it used while `work` ran.
pub(crate) fn under_profiler<T>(
    mut command: Command,
    name: &str,
    cpus: usize,
    work: impl FnOnce() -> Result<T>,
) -> Result<Profiled<T>> {
    command.stderr(Stdio::piped());
    let child = command
        .spawn()
        .with_context(|| format!("starting {name} (cargo xtask setup installs it)"))?;
    let mut guard = Processes(vec![child]);
    let pid = wait_ready(&mut guard.0[0], cpus)?;
    let start_cpu = cpu_ticks(pid) as f64 / USER_HZ;
    let result = work()?;
    let during_cpu = cpu_ticks(pid) as f64 / USER_HZ - start_cpu;
    interrupt(pid)?;
    let child = guard.0.remove(0);
    let output = child.wait_with_output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    // perf writes its file on SIGINT, then dies of the signal it caught, to tell its caller.
    ensure!(
        output.status.success() || stderr.contains("Command terminated by signal 2"),
        "{name} failed: {stderr}"
    );
    Ok(Profiled {
        result,
        output,
        start_cpu,
        during_cpu,
    })
}

/// Waits until the profiler under `wrapper` (`/usr/bin/time` or strace) samples, and its
/// start-up work is done: its perf events open on every CPU (perf) or its BPF program loaded
/// (scorch), then its CPU use settled (scorch builds the unwind tables of every running
/// process after it attaches, perf reads every process's mappings: a cost of starting, not of
/// sampling, which the workers should not be measured against). Returns the profiler's pid.
pub(crate) fn wait_ready(wrapper: &mut Child, cpus: usize) -> Result<u32> {
    let started = Instant::now();
    while started.elapsed() < READY_TIMEOUT {
        if let Some(status) = wrapper.try_wait()? {
            bail!("the profiler exited before it sampled: {status}");
        }
        if let Some(pid) = first_child(wrapper.id()) {
            if perf_events(pid) >= cpus || holds_bpf_program(pid) {
                wait_settled(pid);
                return Ok(pid);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("the profiler did not start sampling within {READY_TIMEOUT:?}")
}

/// Waits (up to [`READY_TIMEOUT`]) until `pid` uses under a tenth of a CPU over a quarter
/// second, twice in a row.
fn wait_settled(pid: u32) {
    const STEP: Duration = Duration::from_millis(250);
    let started = Instant::now();
    let mut quiet = 0;
    let mut before = cpu_ticks(pid);
    while quiet < 2 && started.elapsed() < READY_TIMEOUT {
        std::thread::sleep(STEP);
        let now = cpu_ticks(pid);
        // Ticks are 10 ms: at most two in 250 ms is under a tenth of a CPU.
        quiet = if now.saturating_sub(before) <= 2 {
            quiet + 1
        } else {
            0
        };
        before = now;
    }
}

/// `pid`'s user + system time in clock ticks, from `/proc/PID/stat`; 0 once it is gone.
fn cpu_ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // Fields after the command name, which may hold spaces, ends with the last ')'.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are the 14th and 15th fields; `rest` starts at the 3rd.
    [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum()
}

/// perf event descriptors `pid` holds.
fn perf_events(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |entries| {
        entries
            .flatten()
            .filter(|entry| {
                std::fs::read_link(entry.path())
                    .is_ok_and(|target| target.as_os_str() == "anon_inode:[perf_event]")
            })
            .count()
    })
}

pub(crate) fn interrupt(pid: u32) -> Result<()> {
    run_command(Command::new("kill").args(["-INT", &pid.to_string()]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_change_who_follows_whom() {
        // Five profilers over three rounds; six (with a baseline) have two strides, and so
        // two neighbours before scorch.
        for (n, rounds, neighbours) in [(5, 3, 3), (6, 2, 2)] {
            let mut predecessors = std::collections::BTreeSet::new();
            for round in 0..rounds {
                let order = round_order(n, round);
                let mut sorted = order.clone();
                sorted.sort();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "{order:?}");
                let at = order.iter().position(|&p| p == 3).unwrap();
                predecessors.insert(order[(at + n - 1) % n]);
            }
            // Profiler 3 (scorch) followed a different one each round.
            assert_eq!(predecessors.len(), neighbours, "n {n}: {predecessors:?}");
        }
    }
}
