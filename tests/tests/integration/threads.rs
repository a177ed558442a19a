//! Threads: two named threads of one process that run and block in the same function are told
//! apart by the `thread` label, on-CPU and off-CPU; a relabel rule reading `__meta_thread`
//! drops one of them and keeps the other, without putting their process in the deny list.

use std::{
    collections::{BTreeSet, HashMap},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{ensure, Context, Result};
use scorch_tests::{
    build_workload, go_pprof, http_get, metric, off_cpu_samples, read_pprof, record_pid_to,
    url_encode, work_dir, Daemon, OffCpuSample, Workload,
};

use crate::remote::fresh_dir;

/// The namedpair workload, run for `seconds`, its stdout kept for its own measures.
fn namedpair(seconds: u32) -> Result<Workload> {
    let program = build_workload("namedpair", &["-O2", "-g"])?;
    let child = Command::new(&program)
        .arg(seconds.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting namedpair")?;
    Ok(Workload { child })
}

/// Waits for the workload to finish; its measures: `alpha_cpu`, `beta_blocked`, ... and
/// `wall`, in nanoseconds (and `*_tid`).
fn truth(workload: &mut Workload) -> Result<HashMap<String, f64>> {
    let status = workload.child.wait()?;
    ensure!(status.success(), "namedpair failed: {status}");
    let mut text = String::new();
    std::io::Read::read_to_string(
        workload.child.stdout.as_mut().context("no stdout")?,
        &mut text,
    )?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let (name, value) = l.split_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect())
}

/// Seconds a recording ran, from its summary line (`scorch: ... in 5.00s (...`).
fn recorded_seconds(stdout: &[u8]) -> Result<f64> {
    let stdout = String::from_utf8_lossy(stdout);
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("scorch: "))
        .context("no summary")?;
    println!("{summary}");
    let after = summary.split(" in ").nth(1).context("no duration")?;
    Ok(after.split('s').next().context("no duration")?.parse()?)
}

/// The samples through `cycle`, summed by their `thread` label.
fn per_thread_in_cycle(
    samples: &[OffCpuSample],
    keep: impl Fn(&OffCpuSample) -> bool,
) -> HashMap<&str, f64> {
    let mut totals = HashMap::new();
    for sample in samples
        .iter()
        .filter(|s| s.frames.iter().any(|f| f == "cycle") && keep(s))
    {
        let thread = sample.labels.get("thread").map_or("", String::as_str);
        *totals.entry(thread).or_insert(0.0) += sample.value as f64;
    }
    totals
}

#[test]
fn record_tells_named_threads_apart_on_and_off_cpu() -> Result<()> {
    let mut workload = namedpair(15)?;
    std::thread::sleep(Duration::from_millis(300));
    let pid = workload.pid();

    // On-CPU, with thread ids: each thread's samples in `cycle` are its CPU share.
    let cpu_path = work_dir().join("threads_cpu.pb.gz");
    let output = record_pid_to(pid, 6, &cpu_path, &["--thread-ids"])?;
    let cpu_seconds = recorded_seconds(&output.stdout)?;
    // Off-CPU: each thread's time blocked in `cycle`.
    let off_path = work_dir().join("threads_off_cpu.pb.gz");
    let output = record_pid_to(pid, 6, &off_path, &["--off-cpu", "--off-cpu-mean", "1ms"])?;
    let off_seconds = recorded_seconds(&output.stdout)?;
    let truth = truth(&mut workload)?;
    let wall = truth["wall"];

    let cpu = off_cpu_samples(&read_pprof(&cpu_path)?);
    ensure!(!cpu.is_empty(), "no CPU samples");
    let samples_per_thread = per_thread_in_cycle(&cpu, |_| true);
    // 199 Hz: each sample stands for 1/199 s of CPU.
    for (thread, want_share) in [("alpha", 0.6), ("beta", 0.2)] {
        let samples = samples_per_thread.get(thread).copied().unwrap_or(0.0);
        let got = samples / 199.0 / cpu_seconds;
        let want = truth[&format!("{thread}_cpu")] / wall;
        println!("{thread}: {got:.3} of a CPU in cycle, the workload measured {want:.3}");
        ensure!(
            (want - want_share).abs() < want_share * 0.25,
            "{thread} ran {want:.3} of a CPU, not about {want_share}: the machine is too busy"
        );
        ensure!(
            (got - want).abs() <= want * 0.15,
            "{thread}: {got:.3} of a CPU sampled in cycle, the workload measured {want:.3} \
             (samples by thread: {samples_per_thread:?})"
        );
        // `--thread-ids`: its samples carry its own id, and only it.
        let ids: BTreeSet<&str> = cpu
            .iter()
            .filter(|s| s.labels.get("thread").map(String::as_str) == Some(thread))
            .filter_map(|s| s.labels.get("thread_id").map(String::as_str))
            .collect();
        let tid = truth[&format!("{thread}_tid")].to_string();
        ensure!(
            ids == BTreeSet::from([tid.as_str()]),
            "{thread} (tid {tid}): thread_id labels {ids:?}"
        );
    }
    ensure!(
        cpu.iter().all(|s| s.labels.contains_key("thread")),
        "CPU samples without a thread label"
    );
    // As a user reads them: pprof's tags list both threads under `thread`.
    let tags = go_pprof(&["-tags"], &cpu_path)?;
    let thread_tags = tags
        .split("thread:")
        .nth(1)
        .with_context(|| format!("no thread tag in go tool pprof -tags:\n{tags}"))?;
    ensure!(
        thread_tags.contains("alpha") && thread_tags.contains("beta"),
        "go tool pprof -tags:\n{tags}"
    );

    let off = off_cpu_samples(&read_pprof(&off_path)?);
    ensure!(!off.is_empty(), "no off-CPU samples");
    let blocked = per_thread_in_cycle(&off, |s| {
        s.labels.get("state").map(String::as_str) == Some("sleeping")
    });
    for (thread, want_share) in [("alpha", 0.4), ("beta", 0.8)] {
        let got = blocked.get(thread).copied().unwrap_or(0.0) / 1e9 / off_seconds;
        let want = truth[&format!("{thread}_blocked")] / wall;
        println!("{thread}: {got:.3} s/s blocked in cycle, the workload measured {want:.3}");
        ensure!(
            (want - want_share).abs() < want_share * 0.25,
            "{thread} blocked {want:.3} s/s, not about {want_share}: the machine is too busy"
        );
        ensure!(
            (got - want).abs() <= want * 0.10,
            "{thread}: {got:.3} s/s off-CPU in cycle, the workload measured {want:.3} \
             (by thread: {blocked:?})"
        );
    }
    // Without `--thread-ids`, no ids.
    ensure!(
        off.iter().all(|s| !s.labels.contains_key("thread_id")),
        "off-CPU samples with thread ids, not asked for"
    );
    Ok(())
}

/// The threads a profile's samples through `cycle` carry.
fn threads_in_cycle(samples: &[OffCpuSample]) -> BTreeSet<String> {
    samples
        .iter()
        .filter(|s| s.frames.iter().any(|f| f == "cycle"))
        .filter_map(|s| s.labels.get("thread").cloned())
        .collect()
}

#[test]
fn a_relabel_rule_drops_one_thread_of_a_process() -> Result<()> {
    let dir = fresh_dir("threads-relabel")?;
    let config = dir.join("scorch.toml");
    // The first rule is a process-level one: every other process goes in the BPF deny list.
    // The second reads the thread: `beta` is dropped, its process stays sampled.
    std::fs::write(
        &config,
        r#"
off-cpu = true
off-cpu-mean = "1ms"

[[relabel]]
source_labels = ["comm"]
regex = "namedpair"
action = "keep"

[[relabel]]
source_labels = ["__meta_thread"]
regex = "beta"
action = "drop"
"#,
    )?;
    let store = dir.join("store");
    let daemon = Daemon::start(
        &store,
        &[
            "--window",
            "1s",
            "-F",
            "99",
            "--config",
            &config.to_string_lossy(),
        ],
    )?;
    let mut workload = namedpair(6)?;
    let truth = truth(&mut workload)?;
    // The blocks and samples of its last second are in the next window.
    std::thread::sleep(Duration::from_secs(3));
    let excluded = metric(&daemon.address, "scorch_processes_excluded")?;
    ensure!(
        excluded >= 1.0,
        "the process-level keep rule excluded nothing in BPF"
    );

    let selector = url_encode(r#"{comm="namedpair"}"#);
    let mut stored = HashMap::new();
    for kind in ["cpu", "off-cpu"] {
        let (status, body) = http_get(
            &daemon.address,
            &format!("/api/v1/profile?type={kind}&from=0&match={selector}"),
        )?;
        ensure!(status == 200, "type={kind} answered {status}");
        let path = dir.join(format!("{kind}.pb.gz"));
        std::fs::write(&path, &body)?;
        let samples = off_cpu_samples(&read_pprof(&path)?);
        let threads = threads_in_cycle(&samples);
        println!("{kind}: threads in cycle {threads:?}");
        ensure!(
            !samples
                .iter()
                .any(|s| s.labels.get("thread").map(String::as_str) == Some("beta")),
            "{kind}: beta's samples were stored, the rule drops them"
        );
        let alpha: f64 = per_thread_in_cycle(&samples, |s| {
            s.labels
                .get("state")
                .is_none_or(|state| state == "sleeping")
        })
        .get("alpha")
        .copied()
        .unwrap_or(0.0);
        stored.insert(kind, alpha);
    }
    let (status, _, stderr) = daemon.stop()?;
    ensure!(
        status.success(),
        "scorch run exited with {status}:\n{stderr}"
    );
    // alpha was sampled all along: its process never went into the deny list for beta. The
    // daemon ran before the workload started and after it ended, at 99 Hz.
    let cpu_want = truth["alpha_cpu"] / 1e9 * 99.0;
    let cpu_got = stored["cpu"];
    println!("alpha: {cpu_got} CPU samples in cycle stored, {cpu_want:.0} expected");
    ensure!(
        (cpu_got - cpu_want).abs() <= cpu_want * 0.2,
        "alpha: {cpu_got} CPU samples stored, its CPU time makes {cpu_want:.0}"
    );
    let off_want = truth["alpha_blocked"];
    let off_got = stored["off-cpu"];
    println!("alpha: {off_got:.0} ns off-CPU in cycle stored, it measured {off_want:.0}");
    ensure!(
        (off_got - off_want).abs() <= off_want * 0.10,
        "alpha: {off_got:.0} ns off-CPU stored, it measured {off_want:.0}"
    );
    Ok(())
}
