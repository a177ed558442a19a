//! One capture of the three tools the overhead benches compare: `scorch record`, `perf record
//! -F 19 -a -g` and bpftrace's `profile:hz:19` equivalent, side by side or in turn, each under
//! `/usr/bin/time -v`, with scorch's peak split at its BPF load and each tool's BPF maps read
//! while it still holds them. Used by `--only record` (side by side) and `--only overhead` (in
//! turn).

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::bench::measure::{
    bpf_map_memory_mib, bpf_ns_per_run, first_child, holds_bpf_program, path_str, status_kib,
    summary_bpf_ns, summary_samples, time_usage, timed, Processes, Usage,
};

/// One capture run of the three tools, side by side or in turn (see [`Together`]).
#[derive(Debug, Default)]
pub struct CaptureRun {
    pub scorch: Usage,
    pub perf: Usage,
    pub bpftrace: Usage,
    pub scorch_bpf_ns: Option<f64>,
    pub bpftrace_bpf_ns: Option<f64>,
    pub scorch_samples: u64,
    /// scorch's one-line summary.
    pub scorch_summary: String,
    /// scorch's peak RSS from its first BPF program on (see [`reset_peak_after_load`]), MiB.
    pub scorch_after_load_rss: Option<f64>,
    /// Kernel memory of each tool's BPF maps a second before it stops, MiB (see
    /// [`read_before_the_end`]); perf has none.
    pub scorch_maps: Option<f64>,
    pub bpftrace_maps: Option<f64>,
}

/// How a capture run puts the three tools beside each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Together {
    /// All three at once: each also samples (and scorch and bpftrace symbolise) the others,
    /// bpftrace's start-up included, LLVM compiling its program.
    SideBySide,
    /// One after another, each alone with the workload: what each costs by itself.
    InTurn,
}

/// `scorch record`, `perf record -g` and bpftrace for `seconds` each while every CPU is busy,
/// side by side or in turn; `run` rotates who starts first. Needs [`with_bpf_stats`] for the
/// BPF figures.
pub fn capture(
    scorch: &Path,
    busy: &Path,
    cpus: usize,
    dir: &Path,
    run: usize,
    seconds: u64,
    together: Together,
) -> Result<CaptureRun> {
    let _workload = Processes(vec![Command::new(busy)
        .args([cpus.to_string(), (3 * seconds + 30).to_string()])
        .spawn()
        .context("starting the workload")?]);
    std::thread::sleep(Duration::from_millis(500));
    let scorch_out = dir.join(format!("overhead-scorch-{run}.pb.gz"));
    let perf_out = dir.join(format!("overhead-perf-{run}.data"));
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
    let program = format!(
        "profile:hz:19 {{ @[kstack, ustack, pid] = count(); }} interval:s:{seconds} {{ exit(); }}"
    );
    let bpftrace_cmd = timed(Path::new("bpftrace"), &["-e", &program]);
    // Rotate who starts first, so none always pays for another's start-up.
    let mut commands = vec![
        ("scorch", scorch_cmd),
        ("perf", perf_cmd),
        ("bpftrace", bpftrace_cmd),
    ];
    commands.rotate_left(run % 3);
    let mut result = CaptureRun::default();
    match together {
        Together::SideBySide => {
            let mut children = Vec::new();
            for (name, command) in commands {
                children.push((name, start_tool(name, command, &mut result)?));
            }
            std::thread::sleep(Duration::from_secs(seconds.saturating_sub(1).max(1)));
            for (name, child) in &children {
                read_before_the_end(&mut result, name, child);
            }
            for (name, child) in children {
                finish_tool(&mut result, name, child)?;
            }
        }
        Together::InTurn => {
            for (name, command) in commands {
                let child = start_tool(name, command, &mut result)?;
                if name != "perf" {
                    std::thread::sleep(Duration::from_secs(seconds.saturating_sub(1).max(1)));
                    read_before_the_end(&mut result, name, &child);
                }
                finish_tool(&mut result, name, child)?;
            }
        }
    }
    Ok(result)
}

/// Starts a tool; for scorch, also splits its peak RSS at the end of its BPF load.
fn start_tool(
    name: &str,
    mut command: Command,
    result: &mut CaptureRun,
) -> Result<std::process::Child> {
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = command
        .spawn()
        .with_context(|| format!("starting {name} (cargo xtask setup installs it)"))?;
    if name == "scorch" {
        result.scorch_after_load_rss = reset_peak_after_load(&child);
    }
    Ok(child)
}

/// What a tool holds a second before it stops, while it still holds it: its BPF maps' kernel
/// memory, and bpftrace's program cost. Read once, not polled: a bench process that woke
/// through the recording was sampled by `scorch record`, which then named its frames from this
/// debug build's DWARF and reported that as its own memory and CPU. The maps are read after
/// the last full window, so scorch's stack maps and row pools have their recording's sizes.
fn read_before_the_end(result: &mut CaptureRun, name: &str, child: &std::process::Child) {
    // The child is `/usr/bin/time`; the tool is its child.
    let maps = first_child(child.id()).and_then(bpf_map_memory_mib);
    match name {
        "scorch" => result.scorch_maps = maps,
        "bpftrace" => {
            result.bpftrace_maps = maps;
            result.bpftrace_bpf_ns = bpftrace_bpf_ns(child);
        }
        _ => {}
    }
}

/// scorch's memory could peak twice: while loading its BPF program (unpatched aya 0.14 parsed
/// all of /sys/kernel/btf/vmlinux then) and while the profile is symbolised at the end. To show
/// each, this waits until scorch holds its first BPF program (the loader is gone by then),
/// reads its peak so far (VmHWM) and resets it (`5` to `/proc/PID/clear_refs`): the peak
/// `/usr/bin/time` then reports is the one after the load, and the whole process's is the
/// larger of the two. Returns the peak before the reset, in MiB; `None` (and nothing reset)
/// when no program appeared within 10 s.
fn reset_peak_after_load(child: &std::process::Child) -> Option<f64> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        // The child is `/usr/bin/time`; scorch is its child.
        if let Some(pid) = first_child(child.id()) {
            if holds_bpf_program(pid) {
                let before = status_kib(pid, "VmHWM:").ok()? as f64 / 1024.0;
                std::fs::write(format!("/proc/{pid}/clear_refs"), "5").ok()?;
                return Some(before);
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

/// bpftrace's BPF ns per run: the child is `/usr/bin/time`; bpftrace is its child, and holds
/// the program.
fn bpftrace_bpf_ns(child: &std::process::Child) -> Option<f64> {
    bpf_ns_per_run(first_child(child.id())?)
}

/// Waits for a tool and puts its usage (and scorch's summary) in `result`.
fn finish_tool(result: &mut CaptureRun, name: &str, child: std::process::Child) -> Result<()> {
    let output = child.wait_with_output()?;
    if !output.status.success() {
        bail!("{name} failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    let usage = time_usage(&String::from_utf8_lossy(&output.stderr))?;
    match name {
        "scorch" => {
            let summary = String::from_utf8_lossy(&output.stdout).trim().to_owned();
            result.scorch_bpf_ns = summary_bpf_ns(&summary);
            result.scorch_samples = summary_samples(&summary);
            result.scorch_summary = summary;
            result.scorch = usage;
            // `/usr/bin/time` saw the peak after the reset; the whole run's includes the load.
            if let Some(before) = result.scorch_after_load_rss {
                result.scorch_after_load_rss = Some(usage.max_rss_mib);
                result.scorch.max_rss_mib = usage.max_rss_mib.max(before);
            }
        }
        "perf" => result.perf = usage,
        _ => result.bpftrace = usage,
    }
    Ok(())
}

/// "N tables, K KiB" from a `scorch record` summary's `unwind tables: N, K KiB`.
pub(crate) fn summary_tables(summary: &str) -> Option<String> {
    let (_, rest) = summary.split_once("unwind tables: ")?;
    let (count, rest) = rest.split_once(", ")?;
    let kib = rest.split_whitespace().next()?;
    Some(format!("{count} tables, {kib} KiB"))
}

#[cfg(test)]
mod tests {
    use super::summary_tables;

    #[test]
    fn reads_the_tables_from_a_record_summary() {
        let summary = "scorch: 2275 samples from 7 processes in 60.00s (6 windows); lost: none; \
                       unwind: completed: 2267; wrote x.pb.gz (pprof); unwind tables: 38, 13483 \
                       KiB; BPF 5609 ns/sample";
        assert_eq!(
            summary_tables(summary).as_deref(),
            Some("38 tables, 13483 KiB")
        );
        assert_eq!(summary_tables("scorch: 1 samples; lost: none"), None);
    }
}
