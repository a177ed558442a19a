//! Off-CPU time in the daemon (`off-cpu = true`): stored beside the CPU samples as its own
//! profile type, queried with `--type off-cpu` and `type=off-cpu`, labelled and relabelled as
//! CPU samples are.

use std::{
    collections::HashMap,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{ensure, Context, Result};
use scorch::pprof;
use scorch_tests::{
    build_workload, go_pprof, http_get, read_pprof, run_scorch, url_encode, Daemon, Workload,
};

use crate::remote::fresh_dir;

/// The blocker workload, run for `seconds`, its stdout kept for its own measures.
fn blocker(seconds: u32) -> Result<Workload> {
    let program = build_workload("blocker", &["-O2", "-g"])?;
    let child = Command::new(&program)
        .arg(seconds.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting blocker")?;
    Ok(Workload { child })
}

/// Waits for the blocker to finish; its measures: `FUNCTION -> nanoseconds`, and `wall`.
fn blocker_truth(workload: &mut Workload) -> Result<HashMap<String, f64>> {
    let status = workload.child.wait()?;
    ensure!(status.success(), "blocker failed: {status}");
    let mut text = String::new();
    std::io::Read::read_to_string(
        workload.child.stdout.as_mut().context("no stdout")?,
        &mut text,
    )?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let (name, ns) = l.split_once(' ')?;
            Some((name.to_owned(), ns.parse().ok()?))
        })
        .collect())
}

/// A pprof's samples: (value, function names leaf first, string labels).
fn samples_of(profile: &pprof::Profile) -> Vec<(i64, Vec<String>, HashMap<String, String>)> {
    let strings = &profile.string_table;
    let functions: HashMap<u64, &str> = profile
        .function
        .iter()
        .map(|f| (f.id, strings[f.name as usize].as_str()))
        .collect();
    let locations: HashMap<u64, Vec<String>> = profile
        .location
        .iter()
        .map(|l| {
            let names = l
                .line
                .iter()
                .map(|line| functions.get(&line.function_id).copied().unwrap_or("?"))
                .map(str::to_owned)
                .collect();
            (l.id, names)
        })
        .collect();
    profile
        .sample
        .iter()
        .map(|s| {
            let frames = s
                .location_id
                .iter()
                .flat_map(|id| locations.get(id).cloned().unwrap_or_default())
                .collect();
            let labels = s
                .label
                .iter()
                .filter(|l| l.str != 0)
                .map(|l| {
                    (
                        strings[l.key as usize].clone(),
                        strings[l.str as usize].clone(),
                    )
                })
                .collect();
            (s.value[0], frames, labels)
        })
        .collect()
}

/// The (type, unit) of each of a pprof's sample types.
fn sample_types(profile: &pprof::Profile) -> Vec<(String, String)> {
    let strings = &profile.string_table;
    profile
        .sample_type
        .iter()
        .map(|t| {
            (
                strings[t.r#type as usize].clone(),
                strings[t.unit as usize].clone(),
            )
        })
        .collect()
}

fn is_off_cpu(profile: &pprof::Profile) -> bool {
    sample_types(profile) == [("off_cpu".to_owned(), "nanoseconds".to_owned())]
}

#[test]
fn the_daemon_stores_off_cpu_time_beside_cpu_samples() -> Result<()> {
    let dir = fresh_dir("off-cpu-run")?;
    let config = dir.join("scorch.toml");
    // The keep rule puts every other process in the BPF deny list: the off-CPU hook skips
    // them as the CPU sampler does. The replace rule labels the series kept.
    std::fs::write(
        &config,
        r#"
off-cpu = true
off-cpu-mean = "1ms"

[[relabel]]
source_labels = ["comm"]
regex = "blocker"
action = "keep"

[[relabel]]
source_labels = ["comm"]
regex = "blocker"
target_label = "team"
replacement = "storage"
"#,
    )?;
    let store = dir.join("store");
    let daemon = Daemon::start(
        &store,
        &["--window", "2s", "--config", &config.to_string_lossy()],
    )?;
    let mut workload = blocker(8)?;
    let truth = blocker_truth(&mut workload)?;
    // The blocks that ended as the workload exited are in the next window.
    std::thread::sleep(Duration::from_secs(3));
    let (_, metrics) = http_get(&daemon.address, "/metrics")?;
    let metrics = String::from_utf8(metrics)?;
    let value = |series: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(-1.0)
    };
    let recorded = value(r#"scorch_off_cpu_blocks_total{outcome="recorded"}"#);
    ensure!(recorded > 100.0, "recorded blocks: {recorded}:\n{metrics}");
    ensure!(
        value(r#"scorch_off_cpu_blocks_total{outcome="over_cap"}"#) >= 0.0
            && value("scorch_off_cpu_over_cap_seconds_total") >= 0.0,
        "no over-cap metrics:\n{metrics}"
    );
    ensure!(
        value("scorch_processes_excluded") >= 1.0,
        "the keep rule excluded nothing in BPF:\n{metrics}"
    );

    // The HTTP API's off-CPU profile, read by go tool pprof.
    let selector = url_encode(r#"{comm="blocker"}"#);
    let (status, body) = http_get(
        &daemon.address,
        &format!("/api/v1/profile?type=off-cpu&from=0&match={selector}"),
    )?;
    ensure!(status == 200, "type=off-cpu answered {status}");
    let served = dir.join("served.pb.gz");
    std::fs::write(&served, &body)?;
    let top = go_pprof(&["-top"], &served)?;
    ensure!(top.contains("Type: off_cpu"), "go tool pprof -top:\n{top}");
    let (status, body) = http_get(&daemon.address, "/api/v1/profile?type=wall")?;
    ensure!(
        status == 400 && String::from_utf8_lossy(&body).contains("type"),
        "type=wall answered {status}: {}",
        String::from_utf8_lossy(&body)
    );
    let (status, _, stderr) = daemon.stop()?;
    ensure!(
        status.success(),
        "scorch run exited with {status}:\n{stderr}"
    );

    // The store, queried as a user would.
    let path = dir.join("off_cpu.pb.gz");
    let store_arg = store.to_string_lossy().into_owned();
    let path_arg = path.to_string_lossy().into_owned();
    run_scorch(&[
        "query", "--store", &store_arg, "--type", "off-cpu", "--from", "0", "--output", &path_arg,
    ])?;
    let profile = read_pprof(&path)?;
    ensure!(
        is_off_cpu(&profile),
        "sample types {:?}",
        sample_types(&profile)
    );
    ensure!(profile.period == 1_000_000, "period {}", profile.period);
    let strings = &profile.string_table;
    ensure!(
        profile
            .comment
            .iter()
            .any(|&c| strings[c as usize].contains("1 - exp(-d / 1000000)")),
        "no note of the sampling in the stored profile"
    );
    let samples = samples_of(&profile);
    ensure!(!samples.is_empty(), "no off-CPU samples stored");
    for (_, frames, labels) in &samples {
        ensure!(
            labels.get("comm").map(String::as_str) == Some("blocker"),
            "a process the keep rule dropped was stored: {labels:?} {frames:?}"
        );
        ensure!(
            labels.get("team").map(String::as_str) == Some("storage"),
            "the relabel rule did not apply: {labels:?}"
        );
        ensure!(
            labels.contains_key("state") && labels.contains_key("thread"),
            "no state or thread: {labels:?}"
        );
    }
    // The daemon ran before the workload started and after it ended: each function's stored
    // time is the time the workload measured in it.
    let wall = truth["wall"];
    let cpus = std::thread::available_parallelism()?.get();
    let mut functions = vec!["sleep_in_nanosleep", "read_from_pipe", "wait_for_mutex"];
    if cpus >= 2 {
        functions.push("sleep_across_cpus");
    }
    for function in functions {
        let stored: f64 = samples
            .iter()
            .filter(|(_, frames, _)| frames.iter().any(|f| f == function))
            .map(|(value, _, _)| *value as f64)
            .sum();
        let (got, want) = (stored / wall, truth[function] / wall);
        println!("{function}: {got:.4} of the wall time off-CPU, the workload measured {want:.4}");
        ensure!(
            (got - want).abs() <= want * 0.10,
            "{function}: {got:.4} s/s stored, the workload measured {want:.4} s/s"
        );
    }
    // The CPU windows are still CPU samples, and the default type.
    let cpu_path = dir.join("cpu.pb.gz");
    run_scorch(&[
        "query",
        "--store",
        &store_arg,
        "--from",
        "0",
        "--output",
        &cpu_path.to_string_lossy(),
    ])?;
    let cpu = read_pprof(&cpu_path)?;
    ensure!(
        sample_types(&cpu)
            == [
                ("samples".to_owned(), "count".to_owned()),
                ("cpu".to_owned(), "nanoseconds".to_owned())
            ],
        "CPU query: {:?}",
        sample_types(&cpu)
    );
    ensure!(
        samples_of(&cpu)
            .iter()
            .all(|(_, _, l)| !l.contains_key("state")),
        "off-CPU samples in the CPU profile"
    );
    Ok(())
}
