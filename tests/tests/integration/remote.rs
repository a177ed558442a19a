//! The remote sink against fake Pyroscope and Parca servers on loopback (see
//! `scorch_tests::fake_remote`): every window the daemon stored reaches the server through
//! faults (down at start, down in the middle, 5xx, 429 with Retry-After, answers slower than
//! the timeout, connection resets, a refused request) and a restart with a backlog; duplicates
//! only where the server can discard them (Pyroscope: the same RawSample ID). With
//! `--symbolize none`, the debug info of the profiled binary reaches the Parca fake once, and
//! names the frames the profiles left as addresses.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{ensure, Context, Result};
use scorch::{
    export::{self, RemoteProtocol},
    store::{Store, WindowId},
};
use scorch_tests::{
    build_workload,
    fake_remote::{FakeRemote, Fault, Protocol, Received},
    gnu_build_id, go_pprof, http_get, metric, run_tool, section_names, work_dir, Daemon, Workload,
};

pub(crate) fn fresh_dir(name: &str) -> Result<PathBuf> {
    let dir = work_dir().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Waits until `condition` holds, polling; fails after `limit` with `what`.
pub(crate) fn wait_until(
    limit: Duration,
    what: &str,
    mut condition: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if condition()? {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until the daemon has written `windows` more windows than `from`.
pub(crate) fn wait_windows(daemon: &Daemon, from: f64, windows: f64) -> Result<f64> {
    let mut now = 0.0;
    wait_until(Duration::from_secs(30), "windows to be written", || {
        now = metric(&daemon.address, "scorch_windows_written_total")?;
        Ok(now >= from + windows)
    })?;
    Ok(now)
}

/// Waits until the sink has nothing queued and the server has taken everything written.
/// Waits until the sink's cursor in the store has reached the newest window: everything
/// written so far was delivered (the queue gauge alone can lag a window just written).
pub(crate) fn wait_drained(daemon: &Daemon, fake: &FakeRemote, limit: Duration) -> Result<()> {
    let name = cursor_of(fake)?;
    wait_until(limit, "the remote queue to drain", || {
        let store = Store::open_read_only(&daemon.store)?;
        let newest = store
            .windows_after(WindowId::NONE, 1 << 20)?
            .last()
            .map_or(WindowId::NONE, |w| w.0);
        Ok(newest > WindowId::NONE && store.cursor(&name)? >= newest)
    })
}

/// The sink's cursor name for `fake`.
pub(crate) fn cursor_of(fake: &FakeRemote) -> Result<String> {
    let protocol = match fake.protocol {
        Protocol::Pyroscope => RemoteProtocol::Pyroscope,
        Protocol::Parca => RemoteProtocol::Parca,
        Protocol::Otlp => RemoteProtocol::Otlp,
        Protocol::OtlpHttp => RemoteProtocol::OtlpHttp,
    };
    Ok(export::cursor_name(
        protocol,
        &export::endpoint(&fake.url(), false)?,
    ))
}

pub(crate) fn start_ns(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// Every window in the store up to the sink's cursor reached the server with every one of its
/// series, except those in `refused`; duplicates only with the same ID (Pyroscope) or none
/// (Parca). Returns the windows checked.
fn check_delivery(store_dir: &Path, fake: &FakeRemote, refused: &BTreeSet<i64>) -> Result<usize> {
    let store = Store::open_read_only(store_dir)?;
    let cursor = store.cursor(&cursor_of(fake)?)?;
    let windows = store.windows_after(WindowId::NONE, 1 << 20)?;
    let newest = windows.last().map_or(WindowId::NONE, |w| w.0);
    // The partial window flushed at exit may still wait, for the next start.
    ensure!(
        cursor.get() >= newest.get() - 1,
        "the sink's cursor is at {cursor}, the store's newest window {newest}"
    );

    let received: Vec<Received> = fake.received().into_iter().filter(|r| r.accepted).collect();
    let mut by_series: BTreeMap<(i64, BTreeMap<String, String>), Vec<&Received>> = BTreeMap::new();
    for r in &received {
        let mut key_labels = r.labels.clone();
        // The labels scorch adds for the server, not the series' own.
        key_labels.remove("__name__");
        key_labels.remove("service_name");
        by_series
            .entry((r.start_ns, key_labels))
            .or_default()
            .push(r);
    }
    for (key, copies) in &by_series {
        if copies.len() > 1 {
            ensure!(
                fake.protocol == Protocol::Pyroscope,
                "{} copies of {key:?} reached Parca, which cannot discard duplicates",
                copies.len()
            );
            ensure!(
                copies.iter().all(|c| c.id == copies[0].id),
                "copies of {key:?} carry different IDs: the server cannot discard them"
            );
        }
    }

    let mut checked = 0;
    for &(id, range) in windows.iter().filter(|(id, _)| *id <= cursor) {
        let start = start_ns(range.from);
        if refused.contains(&start) {
            continue;
        }
        let profile = store
            .window_profile(id)?
            .with_context(|| format!("window {id} gone from the store"))?;
        for series in export::split_by_series(&profile) {
            let mut labels = series.labels.clone();
            labels.remove("service_name");
            ensure!(
                by_series.contains_key(&(start, labels.clone())),
                "window {id} (start {start}), series {labels:?} never reached the server; \
                 it got {} profiles",
                received.len()
            );
        }
        checked += 1;
    }
    ensure!(
        fake.protocol_errors().is_empty(),
        "{:?}",
        fake.protocol_errors()
    );
    Ok(checked)
}

/// Every profile received goes through `go tool pprof` (all at once: it reads each file).
fn pprof_reads_everything(fake: &FakeRemote, dir: &Path) -> Result<()> {
    let mut files = Vec::new();
    for (i, r) in fake.received().iter().enumerate() {
        let path = dir.join(format!("received-{i}.pb"));
        std::fs::write(&path, &r.pprof)?;
        files.push(path.to_string_lossy().into_owned());
    }
    ensure!(!files.is_empty(), "nothing received");
    let (last, rest) = files.split_last().context("no files")?;
    let mut args = vec!["-top"];
    args.extend(rest.iter().map(String::as_str));
    let top = go_pprof(&args, Path::new(last))?;
    ensure!(top.contains("calltree") || top.contains("flat"), "{top}");
    Ok(())
}

/// The windows (starts) of the requests answered `answer`.
fn refused_windows(fake: &FakeRemote, answer: &str) -> BTreeSet<i64> {
    fake.received()
        .iter()
        .filter(|r| r.answer == answer)
        .map(|r| r.start_ns)
        .collect()
}

pub(crate) fn calltree() -> Result<Workload> {
    let program = build_workload("calltree", &["-O2", "-fno-omit-frame-pointer", "-g"])?;
    Workload::start(&program, &["1", "120"])
}

#[test]
fn pyroscope_receives_every_window_through_faults() -> Result<()> {
    let dir = fresh_dir("remote-pyroscope")?;
    let password = dir.join("password");
    std::fs::write(&password, "hunter2-secret\n")?;
    let _workload = calltree()?;
    // Down at start: nobody listens on the port the daemon is given.
    let port = FakeRemote::free_port()?;
    let mut fake = FakeRemote::down_on(Protocol::Pyroscope, port)?;
    let url = fake.url();
    let store = dir.join("store");
    let daemon = Daemon::start(
        &store,
        &[
            "--window",
            "1s",
            "--remote-url",
            &url,
            "--remote-protocol",
            "pyroscope",
            "--remote-timeout",
            "1s",
            "--remote-basic-auth-user",
            "scorch-user",
            "--remote-basic-auth-password-file",
            password.to_str().context("path")?,
            "--remote-tenant",
            "team-a",
        ],
    )?;
    let written = wait_windows(&daemon, 0.0, 3.0)?;
    ensure!(metric(&daemon.address, "scorch_remote_windows_sent_total")? == 0.0);
    ensure!(metric(&daemon.address, "scorch_remote_queue_windows")? >= 1.0);
    fake.up()?;
    wait_drained(&daemon, &fake, Duration::from_secs(40))?;

    // Failing answers of every kind, in a row, then a refused request.
    fake.inject([
        Fault::Status(500),
        Fault::Status(503),
        Fault::RetryAfter(2),
        Fault::Slow(Duration::from_millis(2500)),
        Fault::Reset,
        Fault::Status(400),
    ]);
    wait_until(Duration::from_secs(60), "the faults to be used", || {
        Ok(fake.faults_left() == 0)
    })?;
    let written = wait_windows(&daemon, written, 2.0)?;
    wait_drained(&daemon, &fake, Duration::from_secs(30))?;

    // Down for a while in the middle, connections reset.
    fake.down();
    let written = wait_windows(&daemon, written, 6.0)?;
    ensure!(metric(&daemon.address, "scorch_remote_queue_windows")? >= 3.0);
    fake.up()?;
    wait_windows(&daemon, written, 1.0)?;
    wait_drained(&daemon, &fake, Duration::from_secs(40))?;

    let metrics_text = String::from_utf8(http_get(&daemon.address, "/metrics")?.1)?;
    ensure!(metric(&daemon.address, "scorch_remote_retries_total")? >= 5.0);
    ensure!(metric(&daemon.address, "scorch_remote_windows_rejected_total")? == 1.0);
    ensure!(metric(&daemon.address, "scorch_remote_sent_bytes_total")? > 0.0);
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", daemon.pid()))?;
    let (status, _, stderr) = daemon.stop()?;
    ensure!(
        status.success(),
        "scorch run exited with {status}:\n{stderr}"
    );

    // The secret shows nowhere: not in the log, /metrics or the process list.
    for (place, text) in [
        ("the log", stderr.as_bytes()),
        ("/metrics", metrics_text.as_bytes()),
        ("the command line", &cmdline[..]),
    ] {
        ensure!(
            !String::from_utf8_lossy(text).contains("hunter2"),
            "the password shows in {place}"
        );
    }
    // The refusal was logged with the server's message.
    ensure!(stderr.contains("this profile is refused"), "{stderr}");

    let requests = fake.requests();
    // Credentials and tenant on every request.
    for request in &requests {
        let auth = request
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        // base64("scorch-user:hunter2-secret")
        ensure!(
            auth == Some("Basic c2NvcmNoLXVzZXI6aHVudGVyMi1zZWNyZXQ="),
            "authorization {auth:?}"
        );
        ensure!(request
            .headers
            .get("x-scope-orgid")
            .is_some_and(|v| v == "team-a"));
    }
    // Retry-After: 2 was honoured.
    let throttled = requests
        .iter()
        .position(|r| r.answer == "429")
        .context("no 429 answered")?;
    let waited = requests[throttled + 1].at - requests[throttled].at;
    ensure!(
        waited >= Duration::from_millis(1900),
        "retried {waited:?} after a 429 asking 2 s"
    );

    let refused = refused_windows(&fake, "400");
    ensure!(refused.len() == 1, "refused windows {refused:?}");
    let checked = check_delivery(&store, &fake, &refused)?;
    ensure!(checked >= 12, "only {checked} windows checked");
    pprof_reads_everything(&fake, &dir)?;
    Ok(())
}

#[test]
fn parca_receives_every_window_through_faults() -> Result<()> {
    let dir = fresh_dir("remote-parca")?;
    let token = dir.join("token");
    std::fs::write(&token, "parca-token-123\n")?;
    let _workload = calltree()?;
    let port = FakeRemote::free_port()?;
    let mut fake = FakeRemote::down_on(Protocol::Parca, port)?;
    let store = dir.join("store");
    let address = fake.address.to_string();
    let daemon = Daemon::start(
        &store,
        &[
            "--window",
            "1s",
            // host:port with remote-insecure: plaintext gRPC, as Parca is often run.
            "--remote-url",
            &address,
            "--remote-insecure",
            "--remote-protocol",
            "parca",
            "--remote-timeout",
            "1s",
            "--remote-bearer-token-file",
            token.to_str().context("path")?,
        ],
    )?;
    let written = wait_windows(&daemon, 0.0, 3.0)?;
    fake.up()?;
    wait_drained(&daemon, &fake, Duration::from_secs(40))?;

    fake.inject([
        Fault::Status(14), // UNAVAILABLE
        Fault::Status(13), // INTERNAL
        Fault::RetryAfter(2),
        Fault::Slow(Duration::from_millis(2500)),
        Fault::Reset,
        Fault::Status(3), // INVALID_ARGUMENT: not retried
    ]);
    wait_until(Duration::from_secs(60), "the faults to be used", || {
        Ok(fake.faults_left() == 0)
    })?;
    let written = wait_windows(&daemon, written, 2.0)?;
    wait_drained(&daemon, &fake, Duration::from_secs(30))?;

    fake.down();
    let written = wait_windows(&daemon, written, 6.0)?;
    fake.up()?;
    wait_windows(&daemon, written, 1.0)?;
    wait_drained(&daemon, &fake, Duration::from_secs(40))?;
    ensure!(metric(&daemon.address, "scorch_remote_windows_rejected_total")? == 1.0);
    let (status, _, stderr) = daemon.stop()?;
    ensure!(
        status.success(),
        "scorch run exited with {status}:\n{stderr}"
    );
    ensure!(
        !stderr.contains("parca-token-123"),
        "the token shows in the log"
    );

    let requests = fake.requests();
    for request in &requests {
        let auth = request
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        ensure!(
            auth == Some("Bearer parca-token-123"),
            "authorization {auth:?}"
        );
    }
    let throttled = requests
        .iter()
        .position(|r| r.answer == "grpc 8")
        .context("no RESOURCE_EXHAUSTED answered")?;
    let waited = requests[throttled + 1].at - requests[throttled].at;
    ensure!(
        waited >= Duration::from_millis(1900),
        "retried {waited:?} after asking 2 s"
    );

    let refused = refused_windows(&fake, "grpc 3");
    ensure!(refused.len() == 1, "refused windows {refused:?}");
    // The answer slower than the deadline was abandoned (by the server past grpc-timeout, or
    // dropped with the cancelled stream) and the window sent again: check_delivery below
    // finds it exactly once.
    let checked = check_delivery(&store, &fake, &refused)?;
    ensure!(checked >= 12, "only {checked} windows checked");
    pprof_reads_everything(&fake, &dir)?;
    Ok(())
}

#[test]
fn a_restart_with_a_backlog_loses_nothing() -> Result<()> {
    let dir = fresh_dir("remote-restart")?;
    let _workload = calltree()?;
    let port = FakeRemote::free_port()?;
    let mut fake = FakeRemote::down_on(Protocol::Pyroscope, port)?;
    let url = fake.url();
    let store = dir.join("store");
    let args = [
        "--window",
        "1s",
        "--remote-url",
        &url,
        "--remote-timeout",
        "1s",
    ];
    // The server is away for the whole first run: its windows are the backlog.
    let daemon = Daemon::start(&store, &args)?;
    wait_windows(&daemon, 0.0, 4.0)?;
    let (status, _, stderr) = daemon.stop()?;
    ensure!(
        status.success(),
        "scorch run exited with {status}:\n{stderr}"
    );
    let backlog = Store::open_read_only(&store)?
        .windows_after(WindowId::NONE, 1 << 20)?
        .len();
    ensure!(backlog >= 4, "{backlog} windows in the backlog");

    fake.up()?;
    let daemon = Daemon::start(&store, &args)?;
    wait_until(Duration::from_secs(30), "the backlog to be sent", || {
        Ok(metric(&daemon.address, "scorch_remote_windows_sent_total")? >= backlog as f64)
    })?;
    wait_windows(&daemon, 0.0, 2.0)?;
    wait_drained(&daemon, &fake, Duration::from_secs(30))?;
    let (status, _, stderr) = daemon.stop()?;
    ensure!(
        status.success(),
        "scorch run exited with {status}:\n{stderr}"
    );
    let checked = check_delivery(&store, &fake, &BTreeSet::new())?;
    ensure!(
        checked >= backlog + 2,
        "only {checked} windows checked, backlog {backlog}:\n{stderr}"
    );
    Ok(())
}

/// The value of one exact series (`name{label="value"}`) in the daemon's /metrics.
fn metric_series(address: &str, series: &str) -> Result<f64> {
    let (status, body) = http_get(address, "/metrics")?;
    ensure!(status == 200, "/metrics answered {status}");
    let text = String::from_utf8(body)?;
    let line = text
        .lines()
        .find(|l| l.rsplit_once(' ').is_some_and(|(s, _)| s == series))
        .with_context(|| format!("no {series} in /metrics"))?;
    Ok(line.rsplit_once(' ').context("no value")?.1.parse()?)
}

/// The `PT_LOAD` segments of an ELF file (`readelf -l`): (offset, virtual address, file size).
fn load_segments(file: &Path) -> Result<Vec<(u64, u64, u64)>> {
    let output = run_tool(
        std::process::Command::new("readelf")
            .args(["-lW"])
            .arg(file),
    )?;
    let hex = |field: &str| u64::from_str_radix(field.trim_start_matches("0x"), 16);
    let mut segments = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.first() == Some(&"LOAD") && fields.len() >= 5 {
            segments.push((hex(fields[1])?, hex(fields[2])?, hex(fields[4])?));
        }
    }
    ensure!(!segments.is_empty(), "{} has no PT_LOAD", file.display());
    Ok(segments)
}

/// The ELF virtual addresses of the frames the received profiles left unnamed in the mapping
/// of `build_id`: sampled address -> file offset (the mapping's start and offset) -> address
/// (the segment holding that offset), as a symbolising server does. Return addresses are
/// moved back into their call instruction.
fn unnamed_addresses(
    fake: &FakeRemote,
    build_id: &str,
    segments: &[(u64, u64, u64)],
) -> Result<BTreeSet<u64>> {
    use prost::Message as _;
    let mut addresses = BTreeSet::new();
    for received in fake.received().iter().filter(|r| r.accepted) {
        let mut raw = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::GzDecoder::new(&received.pprof[..]),
            &mut raw,
        )?;
        let profile = scorch::pprof::Profile::decode(&raw[..])?;
        let string = |i: i64| {
            profile
                .string_table
                .get(i as usize)
                .cloned()
                .unwrap_or_default()
        };
        let Some(mapping) = profile
            .mapping
            .iter()
            .find(|m| string(m.build_id) == build_id)
        else {
            continue;
        };
        for sample in &profile.sample {
            for (depth, id) in sample.location_id.iter().enumerate() {
                let location = profile
                    .location
                    .iter()
                    .find(|l| l.id == *id)
                    .context("a sample's location is missing")?;
                if location.mapping_id != mapping.id {
                    continue;
                }
                ensure!(
                    location.line.is_empty(),
                    "--symbolize none named a frame of the workload: {location:?}"
                );
                let address = location.address - u64::from(depth > 0);
                let offset = address - mapping.memory_start + mapping.file_offset;
                let &(start, vaddr, _) = segments
                    .iter()
                    .find(|(start, _, size)| (*start..start + size).contains(&offset))
                    .with_context(|| format!("file offset {offset:#x} is in no PT_LOAD"))?;
                addresses.insert(offset - start + vaddr);
            }
        }
    }
    Ok(addresses)
}

/// `scorch run --symbolize none` against the Parca fake: the workload's debug info is uploaded
/// once however many windows name it, holds the debug sections and not the code, and names,
/// with binutils, the frames the profiles carry as addresses.
fn debug_info_reaches_parca(name: &str, signed_urls: bool) -> Result<()> {
    let dir = fresh_dir(name)?;
    let program = build_workload("calltree", &["-O2", "-fno-omit-frame-pointer", "-g"])?;
    let build_id = gnu_build_id(&program)?;
    let _workload = Workload::start(&program, &["1", "120"])?;
    let fake = FakeRemote::start(Protocol::Parca)?;
    if signed_urls {
        fake.use_signed_urls()?;
    }
    let address = fake.address.to_string();
    let store = dir.join("store");
    let daemon = Daemon::start(
        &store,
        &[
            "--window",
            "1s",
            "--symbolize",
            "none",
            "--remote-url",
            &address,
            "--remote-insecure",
            "--remote-protocol",
            "parca",
            "--remote-timeout",
            "5s",
        ],
    )?;
    wait_until(
        Duration::from_secs(60),
        "the workload's debug info to be uploaded",
        || Ok(fake.debuginfo().get(&build_id).is_some_and(|u| u.finished)),
    )?;
    // Windows after the upload name the binary again; it must not be sent again.
    let written = metric(&daemon.address, "scorch_windows_written_total")?;
    wait_windows(&daemon, written, 3.0)?;
    wait_drained(&daemon, &fake, Duration::from_secs(30))?;
    // An upload may still be under way: the counter and the server's view are compared once
    // they have settled (the counter moves when the server has finished an upload).
    let finished_uploads = || fake.debuginfo().values().filter(|u| u.finished).count() as f64;
    let settle = Instant::now() + Duration::from_secs(15);
    let (uploaded, finished) = loop {
        let uploaded = metric_series(
            &daemon.address,
            r#"scorch_debuginfo_uploads_total{result="uploaded"}"#,
        )?;
        let finished = finished_uploads();
        if (uploaded >= 1.0 && uploaded == finished) || Instant::now() > settle {
            break (uploaded, finished);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let bytes = metric(&daemon.address, "scorch_debuginfo_uploaded_bytes_total")?;
    fake.stop_sender(daemon)?;

    // Each build id once: asked about once, and uploaded at most once.
    let calls = fake.debuginfo_calls();
    let count = |method: &str, id: &str| {
        calls
            .iter()
            .filter(|c| c.method == method && c.build_id == id)
            .count()
    };
    let transfer = if signed_urls { "PUT" } else { "Upload" };
    for method in [
        "ShouldInitiateUpload",
        "InitiateUpload",
        transfer,
        "MarkUploadFinished",
    ] {
        ensure!(
            count(method, &build_id) == 1,
            "{method} for the workload {} times: {calls:?}",
            count(method, &build_id)
        );
    }
    let ids: BTreeSet<&str> = calls.iter().map(|c| c.build_id.as_str()).collect();
    for id in &ids {
        ensure!(
            count("ShouldInitiateUpload", id) == 1,
            "{id} asked about {} times",
            count("ShouldInitiateUpload", id)
        );
    }
    let uploads = fake.debuginfo();
    ensure!(
        uploaded >= 1.0 && uploaded == finished,
        "scorch counts {uploaded} uploads, the server finished {finished}"
    );
    let sizes: i64 = uploads
        .values()
        .filter(|u| u.finished)
        .map(|u| u.size)
        .sum();
    ensure!(
        bytes == sizes as f64,
        "{bytes} bytes counted, {sizes} uploaded"
    );

    // The file: the binary's build id, its symbols and DWARF, its code as headers only.
    let upload = &uploads[&build_id];
    ensure!(
        upload.via == if signed_urls { "signed_url" } else { "grpc" },
        "uploaded via {}",
        upload.via
    );
    ensure!(!upload.hash.is_empty(), "InitiateUpload without a hash");
    let file = dir.join("uploaded.debug");
    std::fs::write(&file, &upload.bytes)?;
    ensure!(
        gnu_build_id(&file)? == build_id,
        "another build id uploaded"
    );
    let sections = section_names(&file)?;
    for wanted in [".debug_info", ".debug_line", ".symtab", ".strtab"] {
        ensure!(
            sections.iter().any(|s| s == wanted),
            "no {wanted} in {sections:?}"
        );
    }
    let headers = run_tool(std::process::Command::new("readelf").arg("-SW").arg(&file))?;
    let headers = String::from_utf8_lossy(&headers.stdout);
    let text = headers
        .lines()
        .find(|l| l.split_whitespace().any(|w| w == ".text"))
        .context("no .text header")?;
    ensure!(text.contains("NOBITS"), "{text}");
    let binary_size = std::fs::metadata(&program)?.len();
    ensure!(
        (upload.bytes.len() as u64) < binary_size,
        "{} bytes uploaded for a binary of {binary_size}",
        upload.bytes.len()
    );

    // What the server does with it: the profiles' addresses name the workload's functions.
    let addresses = unnamed_addresses(&fake, &build_id, &load_segments(&file)?)?;
    ensure!(!addresses.is_empty(), "no frames in the workload's mapping");
    let mut command = std::process::Command::new("addr2line");
    command.args(["-f", "-e"]).arg(&file);
    command.args(addresses.iter().map(|a| format!("{a:#x}")));
    let output = run_tool(&mut command)?;
    let output = String::from_utf8_lossy(&output.stdout);
    let functions: BTreeSet<&str> = output.lines().step_by(2).collect();
    let lines: Vec<&str> = output.lines().skip(1).step_by(2).collect();
    for function in ["leaf_a", "leaf_b", "run_a", "dispatch"] {
        ensure!(
            functions.contains(function),
            "{function} not among {functions:?}"
        );
    }
    ensure!(
        lines.iter().any(|l| l.contains("calltree.c:")),
        "no file:line from the uploaded DWARF: {lines:?}"
    );
    Ok(())
}

#[test]
fn parca_gets_debug_info_once_and_names_frames_from_it() -> Result<()> {
    debug_info_reaches_parca("remote-parca-debuginfo", false)
}

#[test]
fn parca_debug_info_through_a_signed_url() -> Result<()> {
    debug_info_reaches_parca("remote-parca-debuginfo-signed", true)
}

/// The TOML block of the README's "Sending to Pyroscope or Parca" section that sets
/// `remote-protocol = "PROTOCOL"`, its `remote-url` pointed at `url` (in the block's own form).
fn readme_config(protocol: &str, url: &str) -> Result<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))?;
    let block = readme
        .split("```toml\n")
        .skip(1)
        .filter_map(|rest| rest.split_once("\n```").map(|(block, _)| block))
        .find(|block| block.contains(&format!("remote-protocol = \"{protocol}\"")))
        .with_context(|| format!("README.md has no toml block for {protocol}"))?;
    let mut replaced = false;
    let config = block
        .lines()
        .map(|line| {
            if line.starts_with("remote-url = ") {
                replaced = true;
                format!("remote-url = \"{url}\"")
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    ensure!(
        replaced,
        "the {protocol} block sets no remote-url:\n{block}"
    );
    Ok(config)
}

/// The README's configurations, as printed (only the server's address changed), deliver.
#[test]
fn the_readme_configs_deliver() -> Result<()> {
    let dir = fresh_dir("remote-readme")?;
    let program = build_workload("calltree", &["-O2", "-fno-omit-frame-pointer", "-g"])?;
    let build_id = gnu_build_id(&program)?;
    let _workload = Workload::start(&program, &["1", "120"])?;
    for (protocol, fake_protocol) in [
        ("pyroscope", Protocol::Pyroscope),
        ("parca", Protocol::Parca),
        ("otlp", Protocol::Otlp),
        ("otlp-http", Protocol::OtlpHttp),
    ] {
        let fake = FakeRemote::start(fake_protocol)?;
        // Pyroscope's block has a scheme; Parca's is `host:port` with remote-insecure.
        let url = match fake_protocol {
            Protocol::Pyroscope | Protocol::Otlp | Protocol::OtlpHttp => fake.url(),
            Protocol::Parca => fake.address.to_string(),
        };
        let config = dir.join(format!("{protocol}.toml"));
        std::fs::write(&config, readme_config(protocol, &url)?)?;
        let daemon = Daemon::start(
            &dir.join(format!("store-{protocol}")),
            &[
                "--config",
                config.to_str().context("path")?,
                "--window",
                "1s",
            ],
        )?;
        wait_until(
            Duration::from_secs(30),
            "the calltree workload's profiles to arrive",
            || {
                Ok(fake.received().iter().any(|r| {
                    r.accepted && r.labels.get("comm").map(String::as_str) == Some("calltree")
                }))
            },
        )?;
        if protocol == "parca" {
            // The block sets `symbolize = "none"`: the workload's debug info goes up too.
            wait_until(
                Duration::from_secs(60),
                "the workload's debug info to be uploaded",
                || Ok(fake.debuginfo().get(&build_id).is_some_and(|u| u.finished)),
            )?;
        }
        let (status, _, stderr) = daemon.stop()?;
        ensure!(
            status.success(),
            "scorch run with the README's {protocol} config exited with {status}:\n{stderr}"
        );
        ensure!(
            fake.protocol_errors().is_empty(),
            "{protocol}: {:?}",
            fake.protocol_errors()
        );
    }
    Ok(())
}
