//! The OTLP sink against the fake OTLP receiver (`scorch_tests::fake_otlp`, generated from the
//! pinned upstream protos), over gRPC and over HTTP: down at start, a wait asked for (503 with
//! `Retry-After`, or UNAVAILABLE with a RetryInfo), a partial success, then up; every window
//! arrives once, the dictionaries are well formed (the receiver checks every request), the
//! resource attributes of a systemd unit's process and of a container's name them, and the
//! function shares `go tool pprof` reads from what arrived are those of the local store.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{ensure, Context, Result};
use scorch::{
    export,
    profile::encode,
    store::{Store, WindowId},
};
use scorch_tests::{
    build_workload,
    fake_remote::{FakeRemote, Fault, Protocol, Received},
    go_pprof, metric, Cgroup, Daemon, Workload,
};

use crate::remote::{cursor_of, fresh_dir, start_ns, wait_drained, wait_until, wait_windows};

const CONTAINER: &str = "7e2d4c1b0a9f8e7d6c5b4a3928170615f4e3d2c1b0a9f8e7d6c5b4a392817061";

/// The delivered windows (id, start) up to the sink's cursor.
fn delivered_windows(store_dir: &Path, fake: &FakeRemote) -> Result<Vec<(WindowId, i64)>> {
    let store = Store::open_read_only(store_dir)?;
    let cursor = store.cursor(&cursor_of(fake)?)?;
    Ok(store
        .windows_after(WindowId::NONE, 1 << 20)?
        .into_iter()
        .filter(|(id, _)| *id <= cursor)
        .map(|(id, range)| (id, start_ns(range.from)))
        .collect())
}

/// Every series of every delivered window reached the receiver exactly once (by window start
/// and `process.pid`); returns the windows checked.
///
/// A request whose answer the sink did not see in time (`timeouts`, its count of failures by
/// timeout) is sent again, and the receiver may then hold two copies: delivery is at least
/// once, as the OTLP exporters' is. Without a timeout, every window arrives exactly once.
fn check_every_window_once(store_dir: &Path, fake: &FakeRemote, timeouts: f64) -> Result<usize> {
    let store = Store::open_read_only(store_dir)?;
    let mut copies: BTreeMap<(i64, String), usize> = BTreeMap::new();
    for r in fake.received().iter().filter(|r| r.accepted) {
        let pid = r.labels.get("process.pid").cloned().unwrap_or_default();
        *copies.entry((r.start_ns, pid)).or_default() += 1;
    }
    let windows = delivered_windows(store_dir, fake)?;
    // A process can be several series of one window (one that exec'd has a comm and an
    // executable before and after): each is a profile of its own, sent once.
    let mut series_of: BTreeMap<(i64, String), usize> = BTreeMap::new();
    for &(id, start) in &windows {
        let profile = store
            .window_profile(id)?
            .with_context(|| format!("window {id} gone from the store"))?;
        for series in export::split_by_series(&profile) {
            let pid = series.labels.get("pid").cloned().unwrap_or_default();
            *series_of.entry((start, pid)).or_default() += 1;
        }
    }
    for ((start, pid), &expected) in &series_of {
        let n = copies.get(&(*start, pid.clone())).copied().unwrap_or(0);
        ensure!(
            n == expected || (n > expected && timeouts > 0.0),
            "window start {start}, pid {pid}: {n} profiles reached the receiver for {expected} \
             series in the store, and the sink counted no timeout; the requests: {:?}",
            fake.requests()
                .iter()
                .map(|r| (r.at, r.answer.clone()))
                .collect::<Vec<_>>()
        );
    }
    ensure!(
        fake.protocol_errors().is_empty(),
        "{:?}",
        fake.protocol_errors()
    );
    Ok(windows.len())
}

/// The requests the daemon's sink gave up waiting for (`reason="timeout"`).
fn timeouts(address: &str) -> Result<f64> {
    let (status, body) = scorch_tests::http_get(address, "/metrics")?;
    ensure!(status == 200, "/metrics answered {status}");
    let text = String::from_utf8(body)?;
    Ok(text
        .lines()
        .filter_map(|line| line.strip_prefix(r#"scorch_remote_failures_total{reason="timeout"} "#))
        .filter_map(|value| value.parse::<f64>().ok())
        .sum())
}

/// `go tool pprof -top`'s flat samples per function of `files`.
fn flat_by_function(files: &[PathBuf]) -> Result<BTreeMap<String, i64>> {
    let (last, rest) = files.split_last().context("no profiles")?;
    let mut args = vec![
        "-top",
        "-nodecount=1000",
        "-symbolize=none",
        "-sample_index=samples",
    ];
    let rest: Vec<String> = rest
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    args.extend(rest.iter().map(String::as_str));
    let top = go_pprof(&args, last)?;
    let mut flat = BTreeMap::new();
    let mut table = false;
    for line in top.lines() {
        if line.trim_start().starts_with("flat") {
            table = true;
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        if !table || words.len() < 6 {
            continue;
        }
        let samples: i64 = words[0].parse().with_context(|| format!("{line:?}"))?;
        flat.insert(words[5..].join(" "), samples);
    }
    ensure!(!flat.is_empty(), "no functions in:\n{top}");
    Ok(flat)
}

/// The function shares of `pid`'s profiles as received equal those of the same windows read
/// from the local store, both as `go tool pprof` reads them.
fn shares_match_the_store(store_dir: &Path, fake: &FakeRemote, pid: u32, dir: &Path) -> Result<()> {
    let windows = delivered_windows(store_dir, fake)?;
    let starts: BTreeSet<i64> = windows.iter().map(|w| w.1).collect();
    let store = Store::open_read_only(store_dir)?;
    let (mut local, mut received) = (Vec::new(), Vec::new());
    for &(id, start) in &windows {
        let profile = store.window_profile(id)?.context("window gone")?;
        for series in export::split_by_series(&profile) {
            if series.labels.get("pid") == Some(&pid.to_string()) {
                let path = dir.join(format!("local-{start}.pb"));
                std::fs::write(
                    &path,
                    encode::pprof::encode_samples(&profile, &series.samples),
                )?;
                local.push(path);
            }
        }
    }
    let pid_text = pid.to_string();
    for (i, r) in fake
        .received()
        .iter()
        .filter(|r| r.accepted && starts.contains(&r.start_ns))
        .filter(|r| r.labels.get("process.pid") == Some(&pid_text))
        .enumerate()
    {
        let path = dir.join(format!("received-{i}.pb"));
        std::fs::write(&path, &r.pprof)?;
        received.push(path);
    }
    ensure!(
        local.len() == received.len() && local.len() >= 4,
        "{} windows of pid {pid} in the store, {} received",
        local.len(),
        received.len()
    );
    let (local, received) = (flat_by_function(&local)?, flat_by_function(&received)?);
    ensure!(
        local == received,
        "flat samples by function differ:\nstore    {local:?}\nreceived {received:?}"
    );
    ensure!(
        local.keys().any(|f| f.starts_with("leaf_")),
        "the workload's functions are missing: {local:?}"
    );
    Ok(())
}

/// The resource of `pid`'s profiles (the same in every window).
fn resource_of(fake: &FakeRemote, pid: u32) -> Result<BTreeMap<String, String>> {
    let pid = pid.to_string();
    let received: Vec<Received> = fake
        .received()
        .into_iter()
        .filter(|r| r.labels.get("process.pid") == Some(&pid))
        .collect();
    let first = received.first().context("no profile of the process")?;
    ensure!(
        received.iter().all(|r| r.labels == first.labels),
        "the resource of pid {pid} changed between windows"
    );
    Ok(first.labels.clone())
}

fn otlp_delivers(name: &str, protocol: Protocol) -> Result<()> {
    let unified = Path::new("/sys/fs/cgroup/unified");
    let systemd_v1 = Path::new("/sys/fs/cgroup/systemd");
    ensure!(
        unified.join("cgroup.procs").exists() && systemd_v1.join("cgroup.procs").exists(),
        "this test needs the hybrid cgroup layout (v2 at {} and the v1 name=systemd hierarchy)",
        unified.display()
    );
    let dir = fresh_dir(name)?;
    let secret = dir.join("api-key");
    std::fs::write(&secret, "otlp-key-4242\n")?;
    // A process in a systemd service's cgroup and one in a docker container's.
    let program = build_workload("calltree", &["-O2", "-fno-omit-frame-pointer", "-g"])?;
    let (svc_bin, dock_bin) = (dir.join("otlpsvc"), dir.join("otlpdock"));
    std::fs::copy(&program, &svc_bin)?;
    std::fs::copy(&program, &dock_bin)?;
    let svc = Workload::start(&svc_bin, &["1", "120"])?;
    let dock = Workload::start(&dock_bin, &["1", "120"])?;
    let unit = format!("scorch-{name}.service");
    let service_cgroup = Cgroup::create(unified, &format!("/system.slice/{unit}"))?;
    service_cgroup.add(svc.pid())?;
    let docker_cgroup = Cgroup::create(
        systemd_v1,
        &format!("/system.slice/docker-{CONTAINER}.scope"),
    )?;
    docker_cgroup.add(dock.pid())?;

    // Down at start.
    let port = FakeRemote::free_port()?;
    let mut fake = FakeRemote::down_on(protocol, port)?;
    let (protocol_name, compression) = match protocol {
        Protocol::Otlp => ("otlp", "gzip"),
        _ => ("otlp-http", "none"),
    };
    let store = dir.join("store");
    let daemon = Daemon::start(
        &store,
        &[
            "--window",
            "1s",
            "--remote-url",
            &fake.url(),
            "--remote-protocol",
            protocol_name,
            "--remote-compression",
            compression,
            "--remote-timeout",
            "1s",
            "--remote-header",
            "x-team=payments",
            "--remote-header-file",
            &format!("api-key={}", secret.display()),
        ],
    )?;
    let written = wait_windows(&daemon, 0.0, 3.0)?;
    ensure!(metric(&daemon.address, "scorch_remote_windows_sent_total")? == 0.0);
    // Then up, asking first for a wait (503 with Retry-After, or UNAVAILABLE with a
    // RetryInfo), then keeping a request in part.
    fake.inject([Fault::RetryAfter(2), Fault::Partial(1)]);
    fake.up()?;
    wait_until(Duration::from_secs(30), "the faults to be used", || {
        Ok(fake.faults_left() == 0)
    })?;
    // Three more than were written while it was down: six at least are checked below.
    wait_windows(&daemon, written, 3.0)?;
    wait_drained(&daemon, &fake, Duration::from_secs(40))?;
    ensure!(metric(&daemon.address, "scorch_remote_profiles_rejected_total")? == 1.0);
    ensure!(metric(&daemon.address, "scorch_remote_windows_rejected_total")? == 0.0);
    let timeouts = timeouts(&daemon.address)?;
    let (status, _, stderr) = daemon.stop()?;
    ensure!(
        status.success(),
        "scorch run exited with {status}:\n{stderr}"
    );
    ensure!(
        !stderr.contains("otlp-key-4242"),
        "the secret header shows in the log"
    );
    ensure!(
        stderr.contains("rejected 1 profiles") && stderr.contains("rejecting profiles on purpose"),
        "the partial success was not logged:\n{stderr}"
    );

    let requests = fake.requests();
    for request in &requests {
        let header = |name: &str| request.headers.get(name).and_then(|v| v.to_str().ok());
        ensure!(
            header("api-key") == Some("otlp-key-4242"),
            "api-key {:?}",
            header("api-key")
        );
        ensure!(
            header("x-team") == Some("payments"),
            "x-team {:?}",
            header("x-team")
        );
    }
    let asked = match protocol {
        Protocol::Otlp => "grpc 14",
        _ => "503",
    };
    let throttled = requests
        .iter()
        .position(|r| r.answer == asked)
        .with_context(|| format!("no {asked} answered"))?;
    let waited = requests[throttled + 1].at - requests[throttled].at;
    ensure!(
        waited >= Duration::from_millis(1900),
        "retried {waited:?} after being asked to wait 2 s"
    );

    let checked = check_every_window_once(&store, &fake, timeouts)?;
    ensure!(checked >= 6, "only {checked} windows checked");

    let service = resource_of(&fake, svc.pid())?;
    let get = |r: &BTreeMap<String, String>, key: &str| r.get(key).cloned().unwrap_or_default();
    ensure!(get(&service, "service.name") == unit, "{service:?}");
    ensure!(get(&service, "systemd_unit") == unit, "{service:?}");
    ensure!(!service.contains_key("container.id"), "{service:?}");
    ensure!(
        get(&service, "process.executable.path").ends_with("/otlpsvc")
            && get(&service, "process.executable.name") == "otlpsvc",
        "{service:?}"
    );
    ensure!(!get(&service, "host.name").is_empty(), "{service:?}");
    let container = resource_of(&fake, dock.pid())?;
    ensure!(
        get(&container, "container.id") == CONTAINER,
        "{container:?}"
    );
    // No pod and no unit: the service is named by the conventions' fallback, or the comm
    // scorch's labels default to.
    ensure!(!get(&container, "service.name").is_empty(), "{container:?}");

    shares_match_the_store(&store, &fake, svc.pid(), &dir)?;
    Ok(())
}

#[test]
fn otlp_grpc_receives_every_window_with_its_resource() -> Result<()> {
    otlp_delivers("otlp-grpc", Protocol::Otlp)
}

#[test]
fn otlp_http_receives_every_window_with_its_resource() -> Result<()> {
    otlp_delivers("otlp-http", Protocol::OtlpHttp)
}

/// The sink alone, without BPF: windows written to a store after it started reach the receiver
/// once each, with every sample of every series.
fn stored_windows_arrive(name: &str, protocol: Protocol) -> Result<()> {
    let dir = fresh_dir(name)?;
    let store_dir = dir.join("store");
    let mut store = Store::open(&store_dir, scorch::store::Retention::default())?;
    let fake = FakeRemote::start(protocol)?;
    let config = export::RemoteConfig {
        url: Some(fake.url()),
        protocol: match protocol {
            Protocol::Otlp => export::RemoteProtocol::Otlp,
            _ => export::RemoteProtocol::OtlpHttp,
        },
        timeout: Duration::from_secs(5),
        ..export::RemoteConfig::default()
    };
    let mut registry = scorch::metrics::Registry::new();
    let metrics = std::sync::Arc::new(export::RemoteMetrics::register(&mut registry));
    let handle = export::spawn(
        &config,
        &store_dir,
        scorch::store::Retention::default(),
        metrics,
        None,
    )?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let mut expected: BTreeMap<(i64, String), u64> = BTreeMap::new();
    for i in 0..5 {
        let window = scorch::store::fixtures::synthetic_window(now - 60 + i * 10, 10, 6, 12);
        store.write_window(&window)?;
        for sample in &window.samples {
            *expected
                .entry((start_ns(window.start), sample.pid.to_string()))
                .or_default() += sample.count;
        }
    }
    wait_until(Duration::from_secs(30), "the windows to arrive", || {
        let errors = fake.protocol_errors();
        ensure!(
            errors.is_empty(),
            "the receiver refused requests: {errors:?}"
        );
        Ok(fake.received().len() >= expected.len())
    })?;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(handle.stop(Duration::from_secs(5)));
    let mut got: BTreeMap<(i64, String), u64> = BTreeMap::new();
    for r in fake.received() {
        ensure!(r.accepted, "a request was refused: {}", r.answer);
        let pid = r.labels.get("process.pid").cloned().unwrap_or_default();
        let profile = <scorch::pprof::Profile as prost::Message>::decode(&r.pprof[..])?;
        let samples: i64 = profile.sample.iter().map(|s| s.value[0]).sum();
        ensure!(
            got.insert((r.start_ns, pid.clone()), samples as u64)
                .is_none(),
            "window {} of pid {pid} arrived twice",
            r.start_ns
        );
    }
    ensure!(
        fake.protocol_errors().is_empty(),
        "{:?}",
        fake.protocol_errors()
    );
    ensure!(got == expected, "received {got:?}\nstored {expected:?}");
    Ok(())
}

#[test]
fn otlp_grpc_sink_sends_stored_windows() -> Result<()> {
    stored_windows_arrive("otlp-grpc-stored", Protocol::Otlp)
}

#[test]
fn otlp_http_sink_sends_stored_windows() -> Result<()> {
    stored_windows_arrive("otlp-http-stored", Protocol::OtlpHttp)
}

/// Each frame name of `pid`'s profiles as received, with the `profile.frame.type`s it
/// arrived with (the receiver turns each into scorch's pprof field: 0 native, 1 kernel,
/// 2 cpython, 3 go, 4 jvm).
fn frame_types_of(fake: &FakeRemote, pid: u32) -> Result<BTreeMap<String, BTreeSet<u32>>> {
    use prost::Message as _;
    let pid = pid.to_string();
    let mut types: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    for received in fake.received() {
        if !received.accepted || received.labels.get("process.pid") != Some(&pid) {
            continue;
        }
        let profile = scorch::pprof::Profile::decode(&received.pprof[..])?;
        for sample in scorch_tests::named_samples(&profile) {
            for (frame, kind) in sample.frames.iter().zip(&sample.kinds) {
                types.entry(frame.clone()).or_default().insert(*kind);
            }
        }
    }
    ensure!(!types.is_empty(), "no profile of pid {pid} arrived");
    Ok(types)
}

/// Python, Go, C and kernel frames arrive with the `profile.frame.type` the semantic
/// conventions give them: `cpython`, `go`, `native` and `kernel`, each frame the type of its
/// kind as the walk and the symbolizer said it, none guessed from its shape.
#[test]
fn otlp_frames_arrive_with_their_types() -> Result<()> {
    let dir = fresh_dir("otlp-frame-types")?;
    let reader = build_workload("readzero", &["-O2", "-fno-omit-frame-pointer"])?;
    let reader = Workload::start(&reader, &["40"])?;
    let go = crate::go::Go::Host.build("gotree", "otlp", &[])?;
    let go = Workload::start(&go, &["40"])?;
    let python = std::process::Command::new("/usr/bin/python3.11")
        .arg(scorch_tests::workload_source("calltree.py"))
        .arg("40")
        .spawn()?;
    let _python = scorch_tests::KillOnDrop(python.id());
    let fake = FakeRemote::start(Protocol::OtlpHttp)?;
    let daemon = Daemon::start(
        &dir.join("store"),
        &[
            "--window",
            "1s",
            "--remote-url",
            &fake.url(),
            "--remote-protocol",
            "otlp-http",
            "--remote-compression",
            "none",
        ],
    )?;
    wait_windows(&daemon, 0.0, 5.0)?;
    wait_drained(&daemon, &fake, Duration::from_secs(40))?;
    fake.stop_sender(daemon)?;

    let only = |types: &BTreeMap<String, BTreeSet<u32>>, frame: &str, kind: u32| {
        let found = types.get(frame);
        ensure!(
            found == Some(&BTreeSet::from([kind])),
            "{frame}: types {found:?}, not only {kind}, among {types:?}"
        );
        Ok(())
    };
    // C: its own code native, the reads it asks for the kernel's.
    let c = frame_types_of(&fake, reader.pid())?;
    only(&c, "main", 0)?;
    ensure!(
        c.iter()
            .any(|(frame, kinds)| frame.contains("read") && kinds == &BTreeSet::from([1])),
        "no kernel read frame: {c:?}"
    );
    // Go: its functions and its runtime are Go's; nothing of it is guessed native.
    let go = frame_types_of(&fake, go.pid())?;
    for function in ["main.main", "main.run", "main.compute"] {
        only(&go, function, 3)?;
    }
    // Python: its functions are CPython's; the interpreter's own C stays native.
    let python = frame_types_of(&fake, python.id())?;
    for function in ["run", "compute", "<module>"] {
        only(&python, function, 2)?;
    }
    // The eval loop's own frames are replaced by the Python frames they run, so the C that
    // calls it stands for the interpreter: it is on every Python stack, and native.
    only(&python, "PyEval_EvalCode", 0)?;
    for (frame, kinds) in &python {
        ensure!(
            !frame.contains("_PyEval_EvalFrame") || kinds == &BTreeSet::from([0]),
            "{frame}: types {kinds:?}, the eval loop's C is native"
        );
    }
    Ok(())
}
