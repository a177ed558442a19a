//! Off-CPU time (`record --off-cpu`): threads that block in known functions for shares of the
//! time they measure themselves, recorded from the scheduler's `sched_switch`.

use std::{
    collections::{BTreeSet, HashMap},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{ensure, Context};
use scorch_tests::*;

/// Seconds the recording ran, from its summary (`... in 5.00s (...`).
fn recorded_seconds(summary: &str) -> anyhow::Result<f64> {
    let after = summary.split(" in ").nth(1).context("no duration")?;
    let number = after.split('s').next().context("no duration")?;
    Ok(number.parse()?)
}

#[test]
fn off_cpu_time_goes_to_each_blocking_function_in_its_share() -> anyhow::Result<()> {
    let program = build_workload("blocker", &["-O2", "-g"])?;
    let child = Command::new(&program)
        .arg("9")
        .stdout(Stdio::piped())
        .spawn()
        .context("starting blocker")?;
    let mut workload = Workload { child };
    std::thread::sleep(Duration::from_millis(300));
    let path = work_dir().join("off_cpu.pb.gz");
    let output = record_pid_to(
        workload.pid(),
        6,
        &path,
        &["--off-cpu", "--off-cpu-mean", "1ms"],
    )?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("scorch: "))
        .context("no summary")?;
    println!("{summary}");
    let seconds = recorded_seconds(summary)?;
    // The workload's own measure of the time each function spent blocked, and its length.
    let status = workload.child.wait()?;
    ensure!(status.success(), "blocker failed: {status}");
    let mut truth_text = String::new();
    std::io::Read::read_to_string(
        workload.child.stdout.as_mut().context("no stdout")?,
        &mut truth_text,
    )?;
    let truth: HashMap<&str, f64> = truth_text
        .lines()
        .filter_map(|l| {
            let (name, ns) = l.split_once(' ')?;
            Some((name, ns.parse().ok()?))
        })
        .collect();
    let wall = truth["wall"];

    let profile = read_pprof(&path)?;
    let strings = &profile.string_table;
    let sample_type = &profile.sample_type[0];
    ensure!(
        profile.sample_type.len() == 1
            && strings[sample_type.r#type as usize] == "off_cpu"
            && strings[sample_type.unit as usize] == "nanoseconds",
        "sample types: {:?}",
        profile.sample_type
    );
    ensure!(profile.period == 1_000_000, "period {}", profile.period);
    ensure!(
        profile
            .comment
            .iter()
            .any(|&c| strings[c as usize].contains("1 - exp(-d / 1000000)")),
        "no note of the sampling in the profile"
    );
    let samples = off_cpu_samples(&profile);
    let with = |function: &str| -> Vec<&OffCpuSample> {
        samples
            .iter()
            .filter(|s| s.frames.iter().any(|f| f == function))
            .collect()
    };
    let cpus = std::thread::available_parallelism()?.get();
    let mut checked = vec![
        ("sleep_in_nanosleep", "do_nanosleep", "sleeper"),
        ("read_from_pipe", "pipe_read", "reader"),
        ("wait_for_mutex", "futex_wait", "waiter"),
    ];
    // The thread that sleeps on CPU 0 and wakes on CPU 1.
    if cpus >= 2 {
        checked.push(("sleep_across_cpus", "do_nanosleep", "mover"));
    }
    for (function, kernel, thread) in checked {
        let found = with(function);
        ensure!(!found.is_empty(), "no off-CPU samples in {function}");
        let recorded: f64 = found.iter().map(|s| s.value as f64).sum();
        // Blocked nanoseconds per second of the recording, against the workload's own.
        let got = recorded / seconds / 1e9;
        let want = truth[function] / wall;
        println!("{function}: {got:.4} s/s blocked, the workload measured {want:.4}");
        ensure!(
            (got - want).abs() <= want * 0.10,
            "{function}: {got:.4} s/s off-CPU, the workload measured {want:.4} s/s"
        );
        let sleeping: f64 = found
            .iter()
            .filter(|s| s.labels.get("state").map(String::as_str) == Some("sleeping"))
            .map(|s| s.value as f64)
            .sum();
        ensure!(
            sleeping >= recorded * 0.99,
            "{function}: {:.4} of its off-CPU time is labelled sleeping:\n{:#?}",
            sleeping / recorded,
            found
                .iter()
                .filter(|s| s.labels.get("state").map(String::as_str) != Some("sleeping"))
                .take(5)
                .collect::<Vec<_>>()
        );
        for sample in &found {
            ensure!(
                sample.frames.first().map(String::as_str) == Some("__schedule"),
                "{function}: the kernel stack starts at {:?}, not at __schedule",
                sample.frames.first()
            );
            // A preempted thread waited for a CPU wherever it was (on the way back to user
            // space, say), not in the call it blocks in.
            let preempted = sample.labels.get("state").map(String::as_str) == Some("preempted");
            ensure!(
                preempted || sample.frames.iter().any(|f| f.contains(kernel)),
                "{function}: no {kernel} in {:?}",
                sample.frames
            );
            // A thread can be preempted on its way into the wait or out of it (a timer tick
            // in pipe_read's copy); the time it waits is the sleep's.
            ensure!(
                matches!(
                    sample.labels.get("state").map(String::as_str),
                    Some("sleeping" | "preempted")
                ),
                "{function}: state {:?}",
                sample.labels.get("state")
            );
            ensure!(
                sample.labels.get("thread").map(String::as_str) == Some(thread),
                "{function}: thread {:?}",
                sample.labels.get("thread")
            );
        }
    }

    // One 2 s block among thousands of 100 us ones: there, with its whole weight (a block
    // 32 times the mean is always recorded, at its duration).
    let long: f64 = with("sleep_long").iter().map(|s| s.value as f64).sum();
    let want = truth["sleep_long"];
    ensure!(
        (long - want).abs() <= want * 0.01,
        "the 2 s block weighs {long} ns, it lasted {want} ns"
    );
    ensure!(!with("sleep_short").is_empty(), "no short blocks at all");

    // Threads blocking in the same function are told apart by their names.
    let resting: BTreeSet<&str> = with("rest")
        .iter()
        .filter_map(|s| s.labels.get("thread").map(String::as_str))
        .collect();
    ensure!(
        ["sleeper", "reader", "waiter", "holder", "feeder"]
            .iter()
            .all(|t| resting.contains(t)),
        "threads resting: {resting:?}"
    );

    let top = go_pprof(&["-top"], &path)?;
    ensure!(top.contains("Type: off_cpu"), "go tool pprof -top:\n{top}");
    Ok(())
}

/// A number in the summary just before `words` (`... 123 over the cap ...`).
fn count_before(summary: &str, words: &str) -> anyhow::Result<u64> {
    let before = summary
        .split(words)
        .next()
        .filter(|b| b.len() < summary.len())
        .with_context(|| format!("no {words:?} in {summary:?}"))?;
    let number = before.split_whitespace().last().context("no number")?;
    Ok(number.parse()?)
}

#[test]
fn a_storm_of_context_switches_is_capped_and_the_excess_counted() -> anyhow::Result<()> {
    let program = build_workload("pingpong", &["-O2"])?;
    let workload = Workload::start(&program, &["30"])?;
    std::thread::sleep(Duration::from_millis(300));
    let path = work_dir().join("off_cpu_storm.pb.gz");
    // Two threads ping-ponging over pipes switch hundreds of thousands of times a second;
    // with N = 20 us most of their microsecond blocks would be kept, far over 100 a second.
    let output = record_pid_to(
        workload.pid(),
        4,
        &path,
        &[
            "--off-cpu",
            "--off-cpu-mean",
            "20us",
            "--off-cpu-max-events",
            "100",
        ],
    )?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("scorch: "))
        .context("no summary")?;
    println!("{summary}");
    let over = count_before(summary, " over the cap")?;
    let recorded = count_before(summary, " blocks recorded")?;
    let seconds = recorded_seconds(summary)?;
    ensure!(over > 1_000, "only {over} blocks counted over the cap");
    // The cap is per CPU per second, rounded up: at most 100 a second in all, and the
    // seconds the program was loaded before and after the recording.
    ensure!(
        (recorded as f64) <= 100.0 * (seconds + 3.0),
        "{recorded} blocks sent in {seconds}s under a cap of 100 a second"
    );
    ensure!(
        !read_pprof(&path)?.sample.is_empty(),
        "no blocks in the profile"
    );
    Ok(())
}
