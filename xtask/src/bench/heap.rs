//! `cargo xtask bench --only heap`: where the daemon's heap stands at its peak under process
//! churn, from heaptrack, written to `target/bench/heap.md`.
//!
//! A fresh `scorch run` starts under `heaptrack` with the busy workload; after the overhead
//! bench's warm-up (with its second of kernel work), the same churn loop runs for a minute, and
//! the daemon is stopped with SIGTERM. `heaptrack_print --print-peaks` then lists the call sites
//! holding the most heap at the moment the heap peaked, each named by the allocating library
//! frame and the first frames of scorch's own code above it.
//!
//! heaptrack sees the heap only: the RSS figures of `--only overhead` also hold the mapped
//! files and the binary's own pages. Its interposition slows every allocation, so this reports
//! where the bytes are, not what they cost in time.

use std::{
    fmt::Write as _,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::{
    bench::{
        harness::{kernel_work, run_churn},
        measure::{busy_workload, command_output, path_str, Processes},
        results::{BenchResult, Cell, Table},
        Bench,
    },
    run_command,
};

/// The daemon's HTTP address during this bench (one no other bench or test uses).
const ADDRESS: &str = "127.0.0.1:17094";
const WARM_UP: u64 = 20;
const CHURN: u64 = 60;
/// Call sites listed.
const SITES: usize = 8;

/// Runs the bench, prints and writes its report (`target/bench/heap.md`), and returns the
/// call sites as data.
pub fn heap(root: &Path, scorch: &Path, command: String) -> Result<BenchResult> {
    let (report, printed) = heap_report(root, scorch)?;
    print!("{report}");
    let path = root.join("target/bench/heap.md");
    std::fs::write(&path, &report).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("bench: report written to {}", path.display());
    let mut table = Table::new(
        "peak",
        &format!("What held the heap when it peaked, {CHURN} s of churn"),
        "held",
        &["calls", "allocated in", "from scorch's"],
    )
    .with_note("From `heaptrack_print --print-peaks`: the heap only, not the mapped files.");
    for site in peak_sites(&printed) {
        table.row(
            site.peak,
            vec![
                Cell::one(site.calls as f64, 0),
                Cell::text(site.allocator.unwrap_or_else(|| "?".to_owned())),
                Cell::text(if site.scorch.is_empty() {
                    "-".to_owned()
                } else {
                    site.scorch.join(" < ")
                }),
            ],
        );
    }
    let mut result = BenchResult::new(Bench::Heap, command);
    result.tables.push(table);
    result.lines = printed
        .lines()
        .filter(|l| l.starts_with("peak heap memory") || l.starts_with("peak RSS"))
        .map(str::to_owned)
        .collect();
    Ok(result)
}

/// The report, and what `heaptrack_print` printed.
fn heap_report(root: &Path, scorch: &Path) -> Result<(String, String)> {
    let dir = root.join("target/bench");
    let busy = busy_workload(root, &dir)?;
    let cpus = std::thread::available_parallelism()?.get();
    let _workload = Processes(vec![Command::new(&busy)
        .args([cpus.to_string(), (WARM_UP + CHURN + 60).to_string()])
        .spawn()?]);
    let store = dir.join("heap-store");
    let _ = std::fs::remove_dir_all(&store);
    let output = dir.join("heap-churn");
    let data = dir.join("heap-churn.zst");
    let _ = std::fs::remove_file(&data);
    let mut heaptrack = Processes(vec![Command::new("heaptrack")
        .arg("-o")
        .arg(&output)
        .arg(scorch)
        .args(["run", "--http-address", ADDRESS, "--store"])
        .arg(&store)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting heaptrack (installed by `cargo xtask setup`)")?]);
    let pid = scorch_under(heaptrack.0[0].id())?;

    std::thread::sleep(Duration::from_secs(2));
    kernel_work()?;
    std::thread::sleep(Duration::from_secs(WARM_UP - 2));
    let counter = dir.join("heap-churn-count");
    run_churn(CHURN, &counter)?;
    let processes: u64 = std::fs::read_to_string(&counter)?.trim().parse()?;
    std::thread::sleep(Duration::from_secs(5));
    run_command(Command::new("kill").args(["-TERM", &pid.to_string()]))?;
    // heaptrack exits once the daemon has and its data is written.
    let status = heaptrack.0[0].wait()?;
    heaptrack.0.clear();
    if !status.success() {
        bail!("heaptrack (or scorch run under it) exited with {status}");
    }

    let printed = Command::new("heaptrack_print")
        .arg("-f")
        .arg(&data)
        .args([
            "--print-peaks",
            "1",
            "--print-allocators",
            "0",
            "--print-temporary",
            "0",
            "--print-leaks",
            "0",
            "--merge-backtraces",
            "0",
            "--peak-limit",
            &SITES.to_string(),
            "--sub-peak-limit",
            "0",
        ])
        .output()
        .context("running heaptrack_print")?;
    if !printed.status.success() {
        bail!(
            "heaptrack_print failed on {}: {}",
            data.display(),
            String::from_utf8_lossy(&printed.stderr)
        );
    }
    let printed = String::from_utf8_lossy(&printed.stdout).into_owned();
    let report = render(&printed, processes, path_str(&data)?)?;
    Ok((report, printed))
}

/// The scorch process heaptrack started (its script also starts a compressor).
fn scorch_under(heaptrack: u32) -> Result<u32> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        let children =
            std::fs::read_to_string(format!("/proc/{heaptrack}/task/{heaptrack}/children"))
                .unwrap_or_default();
        for child in children
            .split_whitespace()
            .filter_map(|c| c.parse::<u32>().ok())
        {
            let comm = std::fs::read_to_string(format!("/proc/{child}/comm")).unwrap_or_default();
            if comm.trim() == "scorch" {
                return Ok(child);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("heaptrack ({heaptrack}) started no scorch process within 10 s")
}

/// One call site of `heaptrack_print --print-peaks`.
#[derive(Debug, PartialEq)]
struct Site {
    /// "3.11M", as heaptrack prints it.
    peak: String,
    calls: u64,
    /// The frame that allocated, outside the standard library: a library's or scorch's.
    allocator: Option<String>,
    /// The first frames in scorch's own code, innermost first.
    scorch: Vec<String>,
}

/// The sites in `heaptrack_print --print-peaks` output: a line `SIZE peak memory consumed over
/// N calls from`, then frames, each a function name and, when known, an `at FILE:LINE` line.
fn peak_sites(printed: &str) -> Vec<Site> {
    let mut sites = Vec::new();
    let mut function = "";
    for line in printed.lines() {
        if let Some((peak, rest)) = line.split_once(" peak memory consumed over ") {
            sites.push(Site {
                peak: peak.trim().to_owned(),
                calls: rest
                    .split_whitespace()
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0),
                allocator: None,
                scorch: Vec::new(),
            });
            continue;
        }
        let Some(site) = sites.last_mut() else {
            continue;
        };
        let trimmed = line.trim();
        if let Some(location) = trimmed.strip_prefix("at ") {
            // Registry paths keep only the crate and file: `gimli-0.32.3/src/read/abbrev.rs:270`.
            let short = location
                .split_once("/registry/src/")
                .and_then(|(_, rest)| rest.split_once('/').map(|(_, path)| path))
                .unwrap_or(location);
            if location.starts_with("/rustc/") {
                continue;
            }
            let frame = format!("`{function}` ({short})");
            if location.starts_with("agent/src/") && site.scorch.len() < 3 {
                site.scorch.push(frame.clone());
            }
            site.allocator.get_or_insert(frame);
        } else if !trimmed.starts_with("in ") && !trimmed.starts_with("and ") {
            function = trimmed;
        }
    }
    sites
}

fn render(printed: &str, processes: u64, data: &str) -> Result<String> {
    let summary = |name: &str| -> String {
        printed
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
            .unwrap_or_else(|| "n/a".to_owned())
    };
    let sites = peak_sites(printed);
    if sites.is_empty() {
        bail!("no peak call sites in heaptrack_print's output for {data}");
    }
    let mut out = String::new();
    writeln!(
        out,
        "# Heap of `scorch run` under process churn (heaptrack), commit {}",
        command_output("git", &["rev-parse", "--short", "HEAD"])
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "{WARM_UP} s of warm-up, then {CHURN} s of churn ({processes} processes started), every \
         CPU busy (`cargo xtask bench --only heap`; data in `{data}`, for `heaptrack --analyze`)."
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "Peak heap: {}; peak RSS with heaptrack's own: {}.",
        summary("peak heap memory consumption:"),
        summary("peak RSS (including heaptrack overhead):")
    )?;
    writeln!(out)?;
    writeln!(out, "What held the heap when it peaked, by call site:")?;
    writeln!(out)?;
    writeln!(out, "| held | calls | allocated in | from scorch's |")?;
    writeln!(out, "|---|---|---|---|")?;
    for site in sites {
        writeln!(
            out,
            "| {} | {} | {} | {} |",
            site.peak,
            site.calls,
            site.allocator.as_deref().unwrap_or("?"),
            if site.scorch.is_empty() {
                "-".to_owned()
            } else {
                site.scorch.join(" < ")
            }
        )?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_sites_name_the_allocating_library_and_scorchs_frames() {
        let printed = "\
PEAK MEMORY CONSUMERS
2.60M peak memory consumed over 69 calls from
realloc
  at /rustc/5980/library/alloc/src/alloc.rs:135
  in /work/main/target/release/scorch
parse<>
  at /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/addr2line-0.25.1/src/line.rs:64
find_frames<>
  at /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/addr2line-0.25.1/src/lib.rs:239
lookup
  at agent/src/symbolize/elf/dwarf.rs:250
symbolize
  at agent/src/symbolize/mod.rs:179
window
  at agent/src/cmd/run.rs:532
main
  at agent/src/main.rs:10
  and 2.60M from 3 other places

506.00K peak memory consumed over 13110 calls from
sqlite3MemMalloc
  at sqlite3/sqlite3.c:27279
  in /work/main/target/release/scorch
";
        let sites = peak_sites(printed);
        assert_eq!(
            sites,
            vec![
                Site {
                    peak: "2.60M".into(),
                    calls: 69,
                    allocator: Some("`parse<>` (addr2line-0.25.1/src/line.rs:64)".into()),
                    scorch: vec![
                        "`lookup` (agent/src/symbolize/elf/dwarf.rs:250)".into(),
                        "`symbolize` (agent/src/symbolize/mod.rs:179)".into(),
                        "`window` (agent/src/cmd/run.rs:532)".into(),
                    ],
                },
                Site {
                    peak: "506.00K".into(),
                    calls: 13110,
                    allocator: Some("`sqlite3MemMalloc` (sqlite3/sqlite3.c:27279)".into()),
                    scorch: vec![],
                },
            ]
        );
        assert!(render("nothing", 0, "x").is_err());
    }
}
