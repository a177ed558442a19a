//! `go tool pprof URL` on the daemon's whole-machine profile, which holds frames nothing can
//! name: a JIT's anonymous code without a perf map. pprof asks `/symbolz` on the daemon for
//! every mapping not marked `has_functions` that holds unnamed addresses, and gives up on the
//! whole profile (exit 1) unless that answers; so the profile marks what scorch already tried to
//! name, and the daemon answers `/symbolz` from its store.

use std::{
    io::Read,
    os::unix::process::CommandExt as _,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{ensure, Context, Result};
use prost::Message;
use scorch::pprof;
use scorch_tests::{
    build_workload, detailed_samples, go_pprof, http_get, http_request, work_dir, Daemon,
    DetailedSample, Workload,
};

const C_FLAGS: &[&str] = &["-O2", "-fno-omit-frame-pointer", "-g"];
const LEAVES: [&str; 3] = ["leaf_a", "leaf_b", "leaf_c"];

/// The daemon's pprof for `path`, decoded.
fn served_profile(address: &str, path: &str) -> Result<pprof::Profile> {
    let (status, body) = http_get(address, path)?;
    ensure!(
        status == 200,
        "{path}: {status} {}",
        String::from_utf8_lossy(&body)
    );
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&body[..])
        .read_to_end(&mut raw)
        .context("the profile is not gzip")?;
    pprof::Profile::decode(&raw[..]).context("the profile is not a pprof")
}

/// Samples of `pid` whose leaf is unnamed and whose caller is `call_jit`: the generated code.
fn unnamed_jit_samples(samples: &[DetailedSample], pid: u32) -> Vec<&DetailedSample> {
    samples
        .iter()
        .filter(|s| s.pid == i64::from(pid))
        .filter(|s| s.leaf().is_some_and(|f| f.lines.is_empty()))
        .filter(|s| s.frames.get(1).and_then(|f| f.function()) == Some("call_jit"))
        .collect()
}

/// A `go tool pprof -http` the test started in a process group of its own: the group killed
/// (`go` and the `pprof` it runs) and `go` reaped when dropped.
struct WebUi(Child);

impl Drop for WebUi {
    fn drop(&mut self) {
        scorch_tests::kill_process_group(self.0.id());
        let _ = self.0.wait();
    }
}

/// POSTs `body` to the daemon's `/symbolz`: status and body text.
fn post_symbolz(address: &str, body: &str) -> Result<(u16, String)> {
    let request = format!(
        "POST /symbolz HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/octet-stream\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let response = http_request(address, &request, Duration::from_secs(30))?;
    Ok((
        response.status,
        String::from_utf8_lossy(&response.body).into_owned(),
    ))
}

#[test]
fn go_tool_pprof_reads_a_profile_with_unnamed_jit_frames() -> Result<()> {
    let calltree = build_workload("calltree", C_FLAGS)?;
    let _calltree = Workload::start(&calltree, &["2", "120"])?;
    let jit = build_workload("jit", C_FLAGS)?;
    // `none`: no perf map, so nothing can name the generated code.
    let jit = Workload::start(&jit, &["120", "1000000", "none"])?;
    let store = work_dir().join("pprof-url-jit-store");
    let _ = std::fs::remove_dir_all(&store);
    let daemon = Daemon::start(&store, &["--window", "2s", "--frequency", "49"])?;

    // The whole machine, as `go tool pprof URL` is most often pointed at.
    let path = "/api/v1/profile?from=now-5m";
    let deadline = Instant::now() + Duration::from_secs(40);
    let profile = loop {
        let profile = served_profile(&daemon.address, path)?;
        let samples = detailed_samples(&profile);
        let names: Vec<&str> = samples
            .iter()
            .flat_map(|s| s.frames.iter().filter_map(|f| f.function()))
            .collect();
        if !unnamed_jit_samples(&samples, jit.pid()).is_empty()
            && LEAVES.iter().all(|leaf| names.contains(leaf))
        {
            break profile;
        }
        ensure!(
            Instant::now() < deadline,
            "after 40 s the store lacks the JIT's unnamed frames or the call tree's leaves"
        );
        std::thread::sleep(Duration::from_millis(500));
    };

    // What scorch looked at is marked so: the anonymous code (nothing could name it) and the
    // call tree's binary (its ELF was read) both have has_functions.
    let samples = detailed_samples(&profile);
    let jit_samples = unnamed_jit_samples(&samples, jit.pid());
    let jit_mapping = jit_samples[0].frames[0]
        .mapping
        .as_ref()
        .context("the JIT frame has no mapping")?;
    ensure!(
        jit_mapping.has_functions && !jit_mapping.has_filenames,
        "the JIT's anonymous mapping is not marked as tried: {jit_mapping:?}"
    );
    let calltree_path = calltree.to_string_lossy();
    let leaf_frame = samples
        .iter()
        .filter_map(|s| s.leaf())
        .find(|f| f.mapping_file() == calltree_path && f.function() == Some("leaf_a"))
        .context("no leaf_a frame in the call tree's binary")?;
    let calltree_mapping = leaf_frame.mapping.as_ref().context("leaf_a's mapping")?;
    ensure!(
        calltree_mapping.has_functions && calltree_mapping.has_line_numbers,
        "{calltree_mapping:?}"
    );

    let url = format!("http://{}{path}", daemon.address);
    let top = go_pprof(&["-top"], std::path::Path::new(&url))?;
    for leaf in LEAVES {
        ensure!(
            top.contains(leaf),
            "go tool pprof -top {url} lacks {leaf}:\n{top}"
        );
    }
    let traces = go_pprof(&["-traces"], std::path::Path::new(&url))?;
    for function in ["leaf_a", "dispatch", "call_jit"] {
        ensure!(
            traces.contains(function),
            "go tool pprof -traces {url} lacks {function}:\n{traces}"
        );
    }
    // Made to ask the symbol service for every unnamed address (the JIT's among them), pprof
    // still reads the profile: the daemon's `/symbolz` answers.
    let forced = go_pprof(
        &["-symbolize=remote:force", "-top"],
        std::path::Path::new(&url),
    )?;
    ensure!(forced.contains("leaf_a"), "{forced}");

    // The symbol service itself: a name the store holds comes back in pprof's format; the
    // JIT's address, which nothing named, does not; a word that is not an address is a 400.
    let jit_address = jit_samples[0].frames[0].address;
    let asked = format!("{:#x}+{jit_address:#x}", leaf_frame.address);
    let (status, answer) = post_symbolz(&daemon.address, &asked)?;
    ensure!(status == 200, "/symbolz {asked}: {status} {answer}");
    let expected = format!(
        "{:#x} {}",
        leaf_frame.address,
        leaf_frame.innermost().unwrap_or_default()
    );
    ensure!(
        answer.starts_with("num_symbols: 1\n") && answer.lines().any(|l| l == expected),
        "/symbolz {asked} answered {answer:?}, not {expected:?}"
    );
    ensure!(
        !answer.contains(&format!("{jit_address:#x} ")),
        "/symbolz named the JIT's anonymous code: {answer:?}"
    );
    let (status, answer) = post_symbolz(&daemon.address, "0x10+/etc/shadow")?;
    ensure!(
        status == 400 && answer.contains("\"/etc/shadow\", is not an address"),
        "{status} {answer}"
    );
    let (status, answer) = http_get(&daemon.address, "/symbolz")?;
    ensure!(
        status == 200 && answer.starts_with(b"num_symbols: 1\n"),
        "GET /symbolz: {status} {}",
        String::from_utf8_lossy(&answer)
    );

    // The web UI, headless: its top table names the call tree's functions.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let web = format!("127.0.0.1:{port}");
    let _web_ui = WebUi(
        Command::new("go")
            .args([
                "tool",
                "pprof",
                "-no_browser",
                &format!("-http={web}"),
                &url,
            ])
            .env("HOME", work_dir())
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("running go tool pprof -http (cargo xtask setup installs golang-go)")?,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let page = loop {
        if let Ok((200, body)) = http_get(&web, "/ui/top") {
            break String::from_utf8_lossy(&body).into_owned();
        }
        ensure!(
            Instant::now() < deadline,
            "go tool pprof -http={web} {url} served no /ui/top within 60 s"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    for leaf in LEAVES {
        ensure!(page.contains(leaf), "pprof's web top page lacks {leaf}");
    }
    drop(daemon);
    Ok(())
}
