//! Off-CPU time in the daemon (`off-cpu = true`): stored beside the CPU samples as its own
//! profile type, queried with `--type off-cpu` and `type=off-cpu`, labelled and relabelled as
//! CPU samples are, and sent to Pyroscope, Parca and OTLP typed `off_cpu`/`nanoseconds`.

use std::{
    collections::HashMap,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{ensure, Context, Result};
use prost::Message as _;
use scorch::pprof;
use scorch_tests::{
    build_workload,
    fake_remote::{FakeRemote, Protocol, Received},
    go_pprof, http_get, off_cpu_samples, read_pprof, run_scorch, url_encode, Daemon, OffCpuSample,
    Workload,
};

use crate::remote::{fresh_dir, wait_until};

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
    let value =
        |series: &str| -> f64 { scorch_tests::series_value(&metrics, series).unwrap_or(-1.0) };
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
    let samples = off_cpu_samples(&profile);
    ensure!(!samples.is_empty(), "no off-CPU samples stored");
    for OffCpuSample { frames, labels, .. } in &samples {
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
            .filter(|s| s.frames.iter().any(|f| f == function))
            .map(|s| s.value as f64)
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
        off_cpu_samples(&cpu)
            .iter()
            .all(|s| !s.labels.contains_key("state")),
        "off-CPU samples in the CPU profile"
    );
    Ok(())
}

/// The profiles a fake received, decoded, with their labels.
fn received_profiles(fake: &FakeRemote) -> Result<Vec<(Received, pprof::Profile)>> {
    fake.received()
        .into_iter()
        .filter(|r| r.accepted)
        .map(|r| {
            let plain = if r.pprof.starts_with(&[0x1f, 0x8b]) {
                let mut out = Vec::new();
                std::io::Read::read_to_end(
                    &mut flate2::read::GzDecoder::new(&r.pprof[..]),
                    &mut out,
                )?;
                out
            } else {
                r.pprof.clone()
            };
            let profile = pprof::Profile::decode(&plain[..])?;
            Ok((r, profile))
        })
        .collect()
}

/// A daemon with off-CPU on sends to `protocol`'s fake: off-CPU windows arrive typed
/// `off_cpu`/`nanoseconds` under the name the server files them by, beside the CPU windows,
/// and `go tool pprof` reads them.
fn off_cpu_reaches(name: &str, protocol: Protocol, names: Option<(&str, &str)>) -> Result<()> {
    let dir = fresh_dir(name)?;
    let fake = FakeRemote::start(protocol)?;
    let protocol_name = match protocol {
        Protocol::Pyroscope => "pyroscope",
        Protocol::Parca => "parca",
        Protocol::Otlp => "otlp",
        Protocol::OtlpHttp => "otlp-http",
    };
    let mut workload = blocker(6)?;
    let store = dir.join("store");
    let url = match protocol {
        Protocol::Parca => fake.address.to_string(),
        _ => fake.url(),
    };
    let daemon = Daemon::start(
        &store,
        &[
            "--window",
            "1s",
            "--off-cpu",
            "--off-cpu-mean",
            "1ms",
            "--remote-url",
            &url,
            "--remote-insecure",
            "--remote-protocol",
            protocol_name,
        ],
    )?;
    let blocker_pid = workload.pid().to_string();
    let from_blocker = |r: &Received| {
        r.labels.get("pid") == Some(&blocker_pid)
            || r.labels.get("process.pid") == Some(&blocker_pid)
    };
    // The blocker sleeps nearly all the time: its CPU samples at 19 Hz may be none at all, so
    // the CPU profiles looked for are anyone's.
    wait_until(
        Duration::from_secs(40),
        "off-CPU profiles of the blocker, and CPU profiles",
        || {
            let profiles = received_profiles(&fake)?;
            let off = profiles
                .iter()
                .any(|(r, p)| is_off_cpu(p) && from_blocker(r));
            let on = profiles.iter().any(|(_, p)| !is_off_cpu(p));
            Ok(off && on)
        },
    )?;
    blocker_truth(&mut workload)?;
    fake.stop_sender(daemon)?;
    let profiles = received_profiles(&fake)?;
    let mut off_cpu_file = None;
    for (i, (received, profile)) in profiles.iter().enumerate() {
        let off = is_off_cpu(profile);
        if let Some((cpu_name, off_cpu_name)) = names {
            let want = if off { off_cpu_name } else { cpu_name };
            ensure!(
                received.labels.get("__name__").map(String::as_str) == Some(want),
                "an {} profile named {:?}",
                if off { "off-CPU" } else { "CPU" },
                received.labels.get("__name__")
            );
        }
        if off {
            ensure!(
                profile.period == 1_000_000,
                "off-CPU period {}",
                profile.period
            );
            let labelled = off_cpu_samples(profile)
                .iter()
                .all(|s| s.labels.contains_key("state") && s.labels.contains_key("thread"))
                || (received.labels.contains_key("state")
                    && received.labels.contains_key("thread"));
            ensure!(labelled, "off-CPU samples without state and thread");
            if off_cpu_file.is_none() && from_blocker(received) {
                let path = dir.join(format!("off-cpu-{i}.pb"));
                std::fs::write(&path, &received.pprof)?;
                off_cpu_file = Some(path);
            }
        } else {
            ensure!(
                sample_types(profile).first().map(|t| t.0.as_str()) == Some("samples"),
                "a CPU profile typed {:?}",
                sample_types(profile)
            );
        }
    }
    let path = off_cpu_file.context("no off-CPU profile of the blocker")?;
    let top = go_pprof(&["-top"], Path::new(&path))?;
    ensure!(top.contains("Type: off_cpu"), "go tool pprof -top:\n{top}");
    Ok(())
}

#[test]
fn off_cpu_windows_reach_pyroscope_typed() -> Result<()> {
    off_cpu_reaches(
        "off-cpu-pyroscope",
        Protocol::Pyroscope,
        Some(("process_cpu", "off_cpu")),
    )
}

#[test]
fn off_cpu_windows_reach_parca_typed() -> Result<()> {
    off_cpu_reaches(
        "off-cpu-parca",
        Protocol::Parca,
        Some(("parca_agent_cpu", "parca_agent_off_cpu")),
    )
}

#[test]
fn off_cpu_windows_reach_otlp_as_their_own_profile() -> Result<()> {
    off_cpu_reaches("off-cpu-otlp", Protocol::Otlp, None)
}

/// The UI's Profile switch: off-CPU in the flame graph, the table and the status line, the
/// chosen type stacked on the timeline and the other drawn as a line, the choice kept in the
/// address; and back.
#[test]
fn the_ui_switches_between_on_and_off_cpu() -> Result<()> {
    use crate::ui::{chromium, eval, wait_until as page_until, GRAPH};

    let dir = fresh_dir("off-cpu-ui")?;
    let _workload = blocker(60)?;
    let daemon = Daemon::start(
        &dir.join("store"),
        &["--window", "1s", "--off-cpu", "--off-cpu-mean", "1ms"],
    )?;
    // Off-CPU windows of the blocker stored: the page has something to show.
    let selector = url_encode(r#"{comm="blocker"}"#);
    wait_until(
        Duration::from_secs(30),
        "off-CPU windows of the blocker",
        || {
            let (status, body) = http_get(
                &daemon.address,
                &format!("/api/v1/profile?type=off-cpu&format=folded&match={selector}"),
            )?;
            Ok(status == 200 && String::from_utf8_lossy(&body).contains("sleep_in_nanosleep"))
        },
    )?;
    std::thread::sleep(Duration::from_secs(2));

    let browser = chromium(1400, 1100)?;
    let tab = browser.new_tab()?;
    tab.navigate_to(&format!("http://{}/", daemon.address))?
        .wait_until_navigated()?;
    page_until(
        &tab,
        "document.getElementById('status').textContent.includes('of CPU')",
        "the on-CPU view",
    )?;
    // On-CPU first: off-CPU's total is the dashed line.
    page_until(
        &tab,
        "!!document.querySelector('#timeline path.other-kind[data-kind=\"off-cpu\"]')",
        "the off-CPU line on the on-CPU timeline",
    )?;
    eval(
        &tab,
        "(() => { const s = document.getElementById('kind'); s.value = 'off-cpu'; \
         s.dispatchEvent(new Event('change')); return true; })()",
    )?;
    page_until(
        &tab,
        "document.getElementById('status').textContent.startsWith('off-CPU: ')",
        "the off-CPU status line",
    )?;
    page_until(
        &tab,
        &format!(
            "(() => {{ const d = {GRAPH}; const f = d && d.getElementById('frames'); \
             return !!f && [...f.querySelectorAll('title')] \
               .some(t => t.textContent.startsWith('sleep_in_nanosleep ')); }})()"
        ),
        "the off-CPU flame graph to show sleep_in_nanosleep",
    )?;
    page_until(
        &tab,
        "[...document.querySelectorAll('#top td.fn')].some(td => td.textContent === 'sleep_in_nanosleep')",
        "the top table to list sleep_in_nanosleep",
    )?;
    page_until(
        &tab,
        "!!document.querySelector('#timeline path.other-kind[data-kind=\"cpu\"]') && \
         document.getElementById('legend').textContent.includes('threads off-CPU') && \
         document.querySelectorAll('#timeline g[data-series] rect').length > 0",
        "the off-CPU timeline with the CPU line",
    )?;
    let flame = eval(&tab, "document.getElementById('flame').getAttribute('src')")?;
    ensure!(flame.contains("type=off-cpu"), "flame graph source {flame}");
    // A baseline: the off-CPU diff, its status line in blocked time.
    eval(
        &tab,
        "(() => { state.base = { from: span.from, to: span.to - 1 }; showRanges(); \
         showProfile(); return true; })()",
    )?;
    page_until(
        &tab,
        "document.getElementById('status').textContent.startsWith('comparing off-CPU: ') && \
         document.getElementById('flame').getAttribute('src').includes('/api/v1/diff?') && \
         document.getElementById('flame').getAttribute('src').includes('type=off-cpu')",
        "the off-CPU diff",
    )?;
    eval(
        &tab,
        "(() => { state.base = null; showRanges(); showProfile(); return true; })()",
    )?;
    page_until(
        &tab,
        "document.getElementById('status').textContent.startsWith('off-CPU: ')",
        "the off-CPU view again",
    )?;
    let address = eval(&tab, "location.search")?;
    ensure!(address.contains("type=off-cpu"), "the address {address}");
    // A reload of that address comes back to off-CPU.
    tab.reload(false, None)?.wait_until_navigated()?;
    page_until(
        &tab,
        "document.getElementById('kind').value === 'off-cpu' && \
         document.getElementById('status').textContent.startsWith('off-CPU: ')",
        "off-CPU after a reload",
    )?;
    eval(
        &tab,
        "(() => { const s = document.getElementById('kind'); s.value = 'cpu'; \
         s.dispatchEvent(new Event('change')); return true; })()",
    )?;
    page_until(
        &tab,
        "document.getElementById('status').textContent.includes('of CPU') && \
         !location.search.includes('type=')",
        "back to on-CPU",
    )?;
    Ok(())
}

/// A storm of context switches (two threads ping-ponging over pipes, hundreds of thousands a
/// second) beside a busy worker with a known call tree: the daemon keeps writing its windows,
/// the per-CPU cap counts the blocks over it, and the worker's on-CPU shares are what they are
/// without the storm.
#[test]
fn a_storm_of_context_switches_keeps_windows_coming_and_on_cpu_shares() -> Result<()> {
    const LEAVES: [&str; 3] = ["leaf_a", "leaf_b", "leaf_c"];
    const EXPECTED: [f64; 3] = [0.6, 0.3, 0.1];
    let dir = fresh_dir("off-cpu-storm")?;
    let pingpong = build_workload("pingpong", &["-O2"])?;
    let calltree = build_workload("calltree", &["-O2", "-fno-omit-frame-pointer", "-g"])?;
    let store = dir.join("store");
    // A mean of 20 us keeps most microsecond blocks, far over a cap of 100 a second.
    let daemon = Daemon::start(
        &store,
        &[
            "--window",
            "2s",
            "--frequency",
            "199",
            "--off-cpu",
            "--off-cpu-mean",
            "20us",
            "--off-cpu-max-events",
            "100",
        ],
    )?;
    let written_before = scorch_tests::metric(&daemon.address, "scorch_windows_written_total")?;
    // Cycles of about 130 ms, many sampling periods (see known_call_tree).
    let worker = Workload::start(&calltree, &["1", "14", "10"])?;
    let storm = Workload::start(&pingpong, &["12"])?;
    std::thread::sleep(Duration::from_secs(12));
    let written = scorch_tests::metric(&daemon.address, "scorch_windows_written_total")?;
    let (_, metrics) = http_get(&daemon.address, "/metrics")?;
    let metrics = String::from_utf8(metrics)?;
    let over_cap = scorch_tests::series_value(
        &metrics,
        r#"scorch_off_cpu_blocks_total{outcome="over_cap"}"#,
    )
    .context("no over-cap count in /metrics")?;
    let worker_pid = worker.pid();
    drop(storm);
    drop(worker);
    let (status, _, stderr) = daemon.stop()?;
    ensure!(
        status.success(),
        "scorch run exited with {status}:\n{stderr}"
    );
    // The counter counts written profiles: a window writes a CPU one and an off-CPU one.
    let windows = (written - written_before) / 2.0;
    println!("{windows} windows written in the storm's 12 s; {over_cap} blocks over the cap");
    // A window every 2 s (5 or 6 in 12 s, by phase): the drain and the store kept up.
    ensure!(
        windows >= 4.0,
        "only {windows} windows written in the storm's 12 s:\n{stderr}"
    );
    ensure!(
        over_cap > 1_000.0,
        "only {over_cap} blocks counted over the cap"
    );

    let path = dir.join("storm_cpu.pb.gz");
    run_scorch(&[
        "query",
        "--store",
        &store.to_string_lossy(),
        "--from",
        "0",
        "--match",
        &format!(r#"{{pid="{worker_pid}"}}"#),
        "--output",
        &path.to_string_lossy(),
    ])?;
    let samples = scorch_tests::named_samples(&read_pprof(&path)?);
    let total: i64 = samples.iter().map(|s| s.count).sum();
    ensure!(total > 1_000, "only {total} on-CPU samples of the worker");
    let shares = scorch_tests::leaf_shares(&samples, i64::from(worker_pid), &LEAVES);
    println!("the worker's shares beside the storm: {shares:.3?} of {total} samples");
    for i in 0..3 {
        ensure!(
            (shares[i] - EXPECTED[i]).abs() < 0.05,
            "{}: {:.3} beside the storm, {:.3} known",
            LEAVES[i],
            shares[i],
            EXPECTED[i]
        );
    }
    Ok(())
}
