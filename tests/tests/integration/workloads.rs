//! Each test workload's own promise, checked without scorch: the share of its time a workload
//! says it spends in a function, measured by perf (`perf record -e cpu-clock` without call
//! graphs: each sample's function from its pc alone), py-spy, or the kernel's accounting of
//! its CPU time. A machine on which a workload does not do what its profiler tests assume
//! fails here, naming the workload and the share, not in a profiler assertion.
//!
//! The workloads spend time, not counts of iterations (tests/workloads/pace.h), so the shares
//! hold on any CPU. The checks of calltree and sighandler run again with a busy neighbour
//! pinned to the workload's CPU, which gets it half the CPU: a share that mixed the thread's
//! CPU time with the wall clock (a spin against a sleep, a count against a timer) would move.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{ensure, Context, Result};

use scorch_tests::*;

/// The share of perf's samples of a run whose pc is in each function, as perf names them.
struct SelfShares {
    shares: HashMap<String, f64>,
    samples: u64,
}

impl SelfShares {
    /// The share of `function` (0 when perf never saw it).
    fn of(&self, function: &str) -> f64 {
        self.shares.get(function).copied().unwrap_or(0.0)
    }

    /// `function`'s share among the samples of `among` (which holds it).
    fn within(&self, function: &str, among: &[&str]) -> f64 {
        let total: f64 = among.iter().map(|f| self.of(f)).sum();
        self.of(function) / total.max(f64::MIN_POSITIVE)
    }

    /// Fails unless `function`'s share among `among` is `promised` within `tolerance`.
    fn ensure(
        &self,
        workload: &str,
        function: &str,
        among: &[&str],
        promised: f64,
        tolerance: f64,
    ) -> Result<()> {
        let share = self.within(function, among);
        ensure!(
            (share - promised).abs() <= tolerance,
            "the workload {workload} spent {:.1}% of its time in {function} (of {among:?}, {} \
             samples), it promises {:.1}% (within {:.1} points)",
            100.0 * share,
            self.samples,
            100.0 * promised,
            100.0 * tolerance
        );
        Ok(())
    }
}

/// Runs `command` (a workload that exits by itself) under `perf record -e cpu-clock -F 999`,
/// pinned to CPU 0 beside a busy loop of its own when `shared`, and reads each function's share
/// of the samples from `perf report`.
fn perf_self_shares(name: &str, program: &Path, args: &[&str], shared: bool) -> Result<SelfShares> {
    let data = work_dir().join(format!("workload-{name}.perf.data"));
    let _neighbour = if shared {
        let child = Command::new("taskset")
            .args(["-c", "0", "sh", "-c", "while :; do :; done"])
            .spawn()
            .context("starting the busy neighbour")?;
        Some(KillOnDrop(child.id()))
    } else {
        None
    };
    let mut perf = Command::new("perf");
    perf.args(["record", "-q", "-e", "cpu-clock", "-F", "999", "-o"])
        .arg(&data)
        .arg("--");
    if shared {
        perf.args(["taskset", "-c", "0"]);
    }
    // The workloads end by SIGALRM, so perf's status is the signal's: the data is checked.
    perf.arg(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("running perf record")?;
    let report = run_tool(
        Command::new("perf")
            .args([
                "report",
                "--stdio",
                "--sort",
                "sym",
                "-q",
                "-n",
                "--percent-limit",
                "0",
            ])
            .arg("-i")
            .arg(&data),
    )?;
    // `    59.59%          2384  [.] leaf_a`
    let mut counts: HashMap<String, u64> = HashMap::new();
    for line in String::from_utf8_lossy(&report.stdout).lines() {
        let mut fields = line.split_whitespace();
        let (Some(_percent), Some(count), Some(_kind)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let Ok(count) = count.parse::<u64>() else {
            continue;
        };
        *counts
            .entry(fields.collect::<Vec<_>>().join(" "))
            .or_default() += count;
    }
    let samples: u64 = counts.values().sum();
    let shares: HashMap<String, f64> = counts
        .into_iter()
        .map(|(symbol, n)| (symbol, n as f64 / samples.max(1) as f64))
        .collect();
    ensure!(
        !shares.is_empty(),
        "perf recorded nothing of {}",
        program.display()
    );
    Ok(SelfShares { shares, samples })
}

/// The known call tree: 60%, 30% and 10% of its leaves' time in leaf_a, leaf_b and leaf_c,
/// and nearly all its time in them.
fn calltree(shared: bool) -> Result<()> {
    let program = build_workload("calltree", &["-O2", "-fno-omit-frame-pointer", "-g"])?;
    let shares = perf_self_shares("calltree", &program, &["1", "5"], shared)?;
    let leaves = ["leaf_a", "leaf_b", "leaf_c"];
    for (leaf, promised) in leaves.iter().zip([0.6, 0.3, 0.1]) {
        shares.ensure("calltree", leaf, &leaves, promised, 0.04)?;
    }
    let in_leaves: f64 = leaves.iter().map(|l| shares.of(l)).sum();
    ensure!(
        in_leaves >= 0.95,
        "the workload calltree spent {:.1}% of its time in its leaves, it promises nearly all",
        100.0 * in_leaves
    );
    Ok(())
}

#[test]
fn calltree_spends_its_promised_shares() -> Result<()> {
    calltree(false)
}

#[test]
fn calltree_spends_its_promised_shares_sharing_its_cpu() -> Result<()> {
    calltree(true)
}

/// The hot signal handler: about half its time in handler_work, the rest in the loop it
/// interrupts.
fn sighandler(shared: bool) -> Result<()> {
    let program = build_workload("sighandler", &["-O2", "-fomit-frame-pointer", "-g"])?;
    let shares = perf_self_shares("sighandler", &program, &["5"], shared)?;
    shares.ensure(
        "sighandler",
        "handler_work",
        &["handler_work", "interrupted_loop"],
        0.5,
        0.1,
    )
}

#[test]
fn sighandler_spends_its_promised_shares() -> Result<()> {
    sighandler(false)
}

#[test]
fn sighandler_spends_its_promised_shares_sharing_its_cpu() -> Result<()> {
    sighandler(true)
}

/// Two C++ methods, half the time each.
#[test]
fn cppwork_spends_half_its_time_in_each_method() -> Result<()> {
    let program = build_cpp_workload("cppwork", &["-O2", "-fno-omit-frame-pointer", "-g"])?;
    let shares = perf_self_shares("cppwork", &program, &["4"], false)?;
    let methods = [
        "scorch_cpp::Spinner::spin",
        "scorch_cpp::Accumulator<unsigned long>::run",
    ];
    shares.ensure("cppwork", methods[0], &methods, 0.5, 0.05)
}

/// Two Rust functions, half the time each, in rounds of a tenth of a millisecond (as the
/// unwinder's test runs it).
#[test]
fn rustwork_spends_half_its_time_in_each_function() -> Result<()> {
    let program = build_rust_workload("rustwork")?;
    let shares = perf_self_shares("rustwork", &program, &["4", "100"], false)?;
    let functions = [
        "rustwork::outer::inner::spin",
        "rustwork::outer::inner::spin_generic",
    ];
    shares.ensure("rustwork", functions[0], &functions, 0.5, 0.05)
}

/// The Go call tree: one unit of eight in digest (checksum inlined), the other seven in spin
/// (under parse, matmul and reduce, which perf without call graphs cannot tell apart; the
/// three call the same paced spin, each for its own units).
#[test]
fn gotree_spends_its_promised_shares() -> Result<()> {
    let program = crate::go::Go::Host.build("gotree", "workload-check", &[])?;
    let shares = perf_self_shares("gotree", &program, &["5"], false)?;
    shares.ensure(
        "gotree",
        "main.digest",
        &["main.digest", "main.spin"],
        0.125,
        0.03,
    )
}

/// The Python call tree, by py-spy: parse 1, matmul 3, reduce 2 and digest 1 parts of 7.
#[test]
fn calltree_py_spends_its_promised_shares() -> Result<()> {
    let py_spy = scorch_tests::debian::py_spy()?;
    let raw = work_dir().join("workload-calltree-py.txt");
    let status = Command::new(&py_spy)
        .args(["record", "--format", "raw", "--rate", "250", "-o"])
        .arg(&raw)
        .args(["--", "/usr/bin/python3.11"])
        .arg(workload_source("calltree.py"))
        .arg("8")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("running py-spy")?;
    ensure!(status.success(), "py-spy failed: {status}");
    let stacks = crate::python::py_spy_stacks(&std::fs::read_to_string(&raw)?);
    let total: u64 = stacks.iter().map(|(_, n)| n).sum();
    ensure!(total > 1000, "py-spy took only {total} samples");
    for (function, parts) in [
        ("parse", 1.0),
        ("matmul", 3.0),
        ("reduce", 2.0),
        ("digest", 1.0),
    ] {
        let hits: u64 = stacks
            .iter()
            .filter(|(frames, _)| frames.iter().any(|f| f == function))
            .map(|(_, n)| n)
            .sum();
        let share = hits as f64 / total as f64;
        let promised = parts / 7.0;
        ensure!(
            (share - promised).abs() <= 0.04,
            "the workload calltree.py spent {:.1}% of its time in {function} ({total} py-spy \
             samples), it promises {:.1}%",
            100.0 * share,
            100.0 * promised
        );
    }
    Ok(())
}

/// napper's children: each spins 100 us of its CPU time every 100 ms, 1 ms a second, so
/// CHILDREN of them over SECONDS use CHILDREN x SECONDS ms of CPU, as the kernel counts it
/// (getrusage, which napper prints). Forks, exits and wakes add a little.
#[test]
fn napper_children_spin_their_promised_time() -> Result<()> {
    let program = build_workload("napper", &["-O2", "-fomit-frame-pointer", "-g"])?;
    let (children, seconds) = (40u32, 3u32);
    let output =
        run_tool(Command::new(&program).args([&children.to_string(), "0", &seconds.to_string()]))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let spent_ns: f64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("children_cpu_ns "))
        .and_then(|n| n.trim().parse().ok())
        .with_context(|| format!("napper printed no children_cpu_ns: {stdout:?}"))?;
    let promised_ns = f64::from(children * seconds) * 1e6;
    ensure!(
        spent_ns >= 0.8 * promised_ns && spent_ns <= 1.6 * promised_ns,
        "the workload napper's {children} children used {:.0} ms of CPU in {seconds} s, it \
         promises about {:.0} ms (1 ms a second each)",
        spent_ns / 1e6,
        promised_ns / 1e6
    );
    Ok(())
}
