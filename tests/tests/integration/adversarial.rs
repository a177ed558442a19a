//! The adversarial suite: one test per attack on a running daemon by someone who controls a
//! profiled process, the files it maps, or a connection to the HTTP API.
//!
//! Every attack runs while a daemon (`--window 1s`) profiles the `calltree` workload, and each
//! test checks what applies of:
//!
//! - windows keep being written (`scorch_windows_written_total` grows) during and after it;
//! - SIGTERM still stops the daemon within 5 s, with a clean exit and no panic;
//! - the daemon's memory (`VmRSS`, and `VmHWM` for the peak) stays under 150 MiB;
//! - nothing of a host file (a marker planted in it) reaches a profile, the log or the store;
//! - the attacking request gets a 4xx or 503, quickly; every read has a timeout, so a hang
//!   fails the test rather than blocking it.
//!
//! The daemon keeps (relabels) only the tests' own programs, so that its memory measures the
//! attack and not whatever else the machine runs. The workloads share the test's root file
//! system, so a "host file" here is one the attacker could read itself: what the perf map and
//! debug link tests show is that the daemon follows no symlink and no `..` to reach it.
//!
//! Each test prints an `ATTACK` line with what it measured.

use std::{
    collections::HashMap,
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, ensure, Context, Result};
use prost::Message;
use scorch::pprof;
use scorch_tests::*;

/// Optimised, with frame pointers, so every stack unwinds.
const C_FLAGS: &[&str] = &["-O2", "-fno-omit-frame-pointer"];

/// The daemon's memory must stay under this, whatever it is fed.
const MAX_MEMORY_KIB: u64 = 150 << 10;

/// SIGTERM must stop the daemon within this.
const STOP_LIMIT: Duration = Duration::from_secs(5);

/// How long any one HTTP exchange may take before the test calls it a hang.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// The daemon's memory, from `/proc/PID/status`.
#[derive(Debug, Clone, Copy)]
struct Memory {
    /// `VmRSS`, KiB.
    rss: u64,
    /// `VmHWM`: the peak RSS over the process's life, KiB.
    peak: u64,
}

impl Memory {
    fn of(pid: u32) -> Result<Memory> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("reading /proc/{pid}/status"))?;
        let field = |name: &str| -> Result<u64> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
                .with_context(|| format!("no {name} in /proc/{pid}/status"))
        };
        Ok(Memory {
            rss: field("VmRSS:")?,
            peak: field("VmHWM:")?,
        })
    }
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RSS {:.1} MiB (peak {:.1} MiB)",
            self.rss as f64 / 1024.0,
            self.peak as f64 / 1024.0
        )
    }
}

/// `GET path` with this server's address as `Host`, and `headers` (lines ending in `\r\n`).
fn get_with(address: &str, path: &str, headers: &str) -> Result<HttpResponse> {
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {address}\r\n{headers}Connection: close\r\n\r\n");
    http_request(address, &request, HTTP_TIMEOUT).with_context(|| format!("GET {path}"))
}

fn get(address: &str, path: &str) -> Result<HttpResponse> {
    get_with(address, path, "")
}

/// Where the tests watch the daemon from: a loopback address of its own, so attacks from
/// 127.0.0.1 (which the per-peer connection cap answers) do not blind the observer.
const OBSERVER: &str = "127.0.0.9";

/// A metric's value, summed over its label sets, asked from [`OBSERVER`].
fn metric(address: &str, name: &str) -> Result<f64> {
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    let response = http_exchange(connect_from(OBSERVER, address)?, &request, HTTP_TIMEOUT)
        .context("GET /metrics")?;
    ensure!(
        response.status == 200,
        "/metrics answered {}",
        response.status
    );
    metric_total(&String::from_utf8(response.body)?, name)
}

/// A name no file, profile or log holds unless this run put it there.
fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{prefix}_{:x}_{nanos:x}", std::process::id())
}

fn fresh_dir(name: &str) -> Result<PathBuf> {
    let dir = work_dir().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn decode_pprof(gzipped: &[u8]) -> Result<pprof::Profile> {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(gzipped)
        .read_to_end(&mut raw)
        .context("the pprof is not gzip")?;
    pprof::Profile::decode(&raw[..]).context("not a pprof")
}

/// True when the bytes contain `needle`.
fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// A config file whose relabelling keeps only processes running a program under
/// [`work_dir`]: the workloads and the attackers. The daemon profiles the whole machine
/// otherwise, and its memory then measures whatever else runs (a parallel build's compilers
/// fill the symbol cache towards its 256 MiB budget, by design) rather than the attack.
fn keep_only_test_programs() -> Result<PathBuf> {
    let dir = work_dir().to_str().context("non-UTF-8 work directory")?;
    let escaped: String = dir
        .chars()
        .flat_map(|c| {
            let special = "\\.+*?()|[]{}^$".contains(c);
            special.then_some('\\').into_iter().chain([c])
        })
        .collect();
    let path = work_dir().join("adv-keep-test-programs.toml");
    std::fs::write(
        &path,
        format!(
            "[[relabel]]\nsource_labels = [\"executable\"]\nregex = '{escaped}/.*'\naction = \"keep\"\n"
        ),
    )?;
    Ok(path)
}

/// The scene of every attack: a daemon with one-second windows profiling `calltree` (and only
/// the tests' own programs, see [`keep_only_test_programs`]).
struct Scene {
    name: &'static str,
    daemon: Daemon,
    store: PathBuf,
    _workload: Workload,
}

impl Scene {
    /// Starts the workload, then the daemon on a fresh store with `args`, and waits for its
    /// first window.
    fn start(name: &'static str, args: &[&str]) -> Result<Scene> {
        let store = work_dir().join(format!("adv-{name}-store"));
        let _ = std::fs::remove_dir_all(&store);
        Scene::start_on(name, &store, args, &[])
    }

    /// [`Scene::start`] on `store` as it is, with `env` for the daemon.
    fn start_on(
        name: &'static str,
        store: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Scene> {
        let program = build_workload("calltree", C_FLAGS)?;
        let workload = Workload::start(&program, &["1", "120"])?;
        let config = keep_only_test_programs()?;
        let config = config.to_str().context("non-UTF-8 path")?;
        let mut all = vec!["--window", "1s", "--config", config];
        all.extend_from_slice(args);
        let daemon = Daemon::start_with_env(store, &all, env)?;
        let scene = Scene {
            name,
            daemon,
            store: store.to_owned(),
            _workload: workload,
        };
        scene.expect_windows(1, "at start")?;
        Ok(scene)
    }

    fn address(&self) -> &str {
        &self.daemon.address
    }

    fn windows(&self) -> Result<u64> {
        Ok(metric(self.address(), "scorch_windows_written_total")? as u64)
    }

    /// The daemon's memory now, failing when it is over the limit.
    fn memory(&self) -> Result<Memory> {
        let memory = Memory::of(self.daemon.pid())?;
        ensure!(
            memory.rss < MAX_MEMORY_KIB && memory.peak < MAX_MEMORY_KIB,
            "{}: the daemon's memory went over {} MiB: {memory}",
            self.name,
            MAX_MEMORY_KIB >> 10
        );
        Ok(memory)
    }

    /// Waits until `more` windows beyond those written so far are written, checking the
    /// daemon's memory all along; fails when they take much longer than `more` seconds.
    fn expect_windows(&self, more: u64, when: &str) -> Result<Duration> {
        let started = Instant::now();
        let first = self.windows()?;
        let limit = Duration::from_secs(more * 3 + 10);
        loop {
            self.memory()?;
            let now = self.windows()?;
            if now >= first + more {
                return Ok(started.elapsed());
            }
            ensure!(
                started.elapsed() < limit,
                "{}: {} of {more} windows written {when} in {limit:?}",
                self.name,
                now - first
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The merged profile of everything stored, restricted by `selector`.
    fn profile(&self, selector: &str) -> Result<pprof::Profile> {
        let path = format!(
            "/api/v1/profile?from=0&format=pprof&match={}",
            url_encode(selector)
        );
        let response = get(self.address(), &path)?;
        ensure!(
            response.status == 200,
            "{path}: {} {}",
            response.status,
            String::from_utf8_lossy(&response.body)
        );
        decode_pprof(&response.body)
    }

    /// The samples of process `pid`, every frame with its lines.
    fn samples_of(&self, pid: u32) -> Result<Vec<DetailedSample>> {
        let profile = self.profile(&format!("{{pid=\"{pid}\"}}"))?;
        Ok(detailed_samples(&profile)
            .into_iter()
            .filter(|s| s.pid == i64::from(pid))
            .collect())
    }

    /// [`Scene::samples_of`] once at least `min` samples are stored, waiting up to 8 more
    /// windows: a workload starved of CPU by a busy machine reaches the count later, not never.
    fn samples_at_least(&self, pid: u32, min: i64) -> Result<Vec<DetailedSample>> {
        for _ in 0..8 {
            let samples = self.samples_of(pid)?;
            if samples.iter().map(|s| s.count).sum::<i64>() >= min {
                return Ok(samples);
            }
            self.expect_windows(1, "for more samples")?;
        }
        self.samples_of(pid)
    }

    /// Everything stored, as folded stacks.
    fn folded(&self) -> Result<String> {
        let response = get(self.address(), "/api/v1/profile?from=0&format=folded")?;
        ensure!(response.status == 200, "folded: {}", response.status);
        Ok(String::from_utf8_lossy(&response.body).into_owned())
    }

    /// Stops the daemon with SIGTERM and checks how it went: memory under the limit up to
    /// the end, a clean exit within [`STOP_LIMIT`], no panic, and none of `secrets` in its
    /// log or its store. Prints and returns the memory and the time SIGTERM took, and returns
    /// the log.
    fn finish(self, secrets: &[&str]) -> Result<(Memory, Duration, String)> {
        let memory = self.memory()?;
        let windows = self.windows()?;
        let (status, elapsed, stderr) = self.daemon.stop_within(STOP_LIMIT)?;
        ensure!(
            status.success(),
            "{}: the daemon exited with {status}:\n{stderr}",
            self.name
        );
        ensure!(
            !stderr.contains("panicked"),
            "{}: the daemon panicked:\n{stderr}",
            self.name
        );
        let mut stored = Vec::new();
        for entry in std::fs::read_dir(&self.store)? {
            stored.extend(std::fs::read(entry?.path())?);
        }
        // Names are stored as text: a marker that got into the store would be found.
        ensure!(
            secrets.is_empty() || contains(&stored, "leaf_a"),
            "{}: the store does not hold calltree's function names as text",
            self.name
        );
        for secret in secrets {
            ensure!(
                !stderr.contains(secret),
                "{}: {secret:?} is in the daemon's log:\n{stderr}",
                self.name
            );
            ensure!(
                !contains(&stored, secret),
                "{}: {secret:?} is in the store",
                self.name
            );
        }
        println!(
            "ATTACK {}: daemon {memory} at the end, {windows} windows written, stopped by \
             SIGTERM in {elapsed:.2?}",
            self.name
        );
        Ok((memory, elapsed, stderr))
    }
}

/// Removes `/tmp/perf-PID.map` (whatever it is) when dropped.
struct PerfMapPath(PathBuf);

impl PerfMapPath {
    fn of(pid: u32) -> PerfMapPath {
        PerfMapPath(PathBuf::from(format!("/tmp/perf-{pid}.map")))
    }

    /// Waits until the workload has put something at the path.
    fn wait_present(&self) -> Result<std::fs::Metadata> {
        let started = Instant::now();
        loop {
            if let Ok(meta) = std::fs::symlink_metadata(&self.0) {
                return Ok(meta);
            }
            ensure!(
                started.elapsed() < Duration::from_secs(10),
                "{} never appeared",
                self.0.display()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for PerfMapPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Samples whose leaf is in the JIT workload's generated code: no name (only a perf map could
/// give one), called from `call_jit`.
fn unnamed_jit_samples(samples: &[DetailedSample]) -> i64 {
    samples
        .iter()
        .filter(|s| s.leaf().is_some_and(|f| f.lines.is_empty()))
        .filter(|s| s.frames.get(1).and_then(Frame::function) == Some("call_jit"))
        .map(|s| s.count)
        .sum()
}

/// Starts the JIT workload with `map` as what it puts at its perf map path (see jit.c).
fn start_jit(map: &str) -> Result<(Workload, PerfMapPath)> {
    let program = build_workload("jit", C_FLAGS)?;
    let workload = Workload::start(&program, &["60", "1000000", map])?;
    let path = PerfMapPath::of(workload.pid());
    Ok((workload, path))
}

/// Checks that the daemon met the attacker's JIT code (so it did look for its perf map): some
/// of its samples end in the generated code, unnamed.
fn expect_unnamed_jit_frames(scene: &Scene, pid: u32) -> Result<i64> {
    let samples = scene.samples_of(pid)?;
    let jit = unnamed_jit_samples(&samples);
    ensure!(
        jit > 0,
        "no sample of pid {pid} in its generated code; heaviest stacks:\n{}",
        describe_stacks(&samples, 5)
    );
    Ok(jit)
}

/// Attack 1: a process runs code in anonymous executable memory, which only a perf map could
/// name, and puts a FIFO at `/tmp/perf-PID.map`. Opening or reading it would block the window
/// loop for good: no window written, SIGTERM unanswered.
#[test]
fn a_fifo_as_perf_map_blocks_nothing() -> Result<()> {
    let scene = Scene::start("fifo-perf-map", &["--frequency", "49"])?;
    let (attacker, map) = start_jit("fifo")?;
    let meta = map.wait_present()?;
    ensure!(
        std::os::unix::fs::FileTypeExt::is_fifo(&meta.file_type()),
        "{} is not a FIFO",
        map.0.display()
    );
    let waited = scene.expect_windows(4, "with a FIFO as the perf map")?;
    let jit = expect_unnamed_jit_frames(&scene, attacker.pid())?;
    println!("ATTACK fifo-perf-map: 4 windows in {waited:.2?}; {jit} samples in the JIT code");
    drop(attacker);
    scene.finish(&[])?;
    Ok(())
}

/// Attack 2: the perf map is a symlink to `/dev/zero`, a read without end: followed and read
/// whole, it would take all the memory there is.
#[test]
fn a_dev_zero_perf_map_is_not_read() -> Result<()> {
    let scene = Scene::start("dev-zero-perf-map", &["--frequency", "49"])?;
    let (attacker, map) = start_jit("link:/dev/zero")?;
    let meta = map.wait_present()?;
    ensure!(meta.file_type().is_symlink());
    let waited = scene.expect_windows(4, "with /dev/zero as the perf map")?;
    let jit = expect_unnamed_jit_frames(&scene, attacker.pid())?;
    // Not even the 64 MiB a perf map may hold was read: the daemon's peak is still the
    // 30 MiB of loading BPF.
    let memory = scene.memory()?;
    ensure!(
        memory.peak < 60 << 10,
        "the daemon read from /dev/zero: {memory}"
    );
    println!("ATTACK dev-zero-perf-map: 4 windows in {waited:.2?}; {jit} samples in the JIT code");
    drop(attacker);
    scene.finish(&[])?;
    Ok(())
}

/// Attack 3: the perf map is a symlink to a file the process should not be able to show the
/// daemon: one holding a marker, laid out as a perf map covering every address. Followed, the
/// marker would name the attacker's JIT frames. A JIT with an honest perf map beside it shows
/// that perf maps are read at all.
#[test]
fn a_symlinked_perf_map_is_not_followed() -> Result<()> {
    let marker = unique("host_secret_marker");
    let dir = fresh_dir("adv-host-only")?;
    let secret = dir.join("secret.map");
    std::fs::write(&secret, format!("0 ffffffffffffffff {marker}\n"))?;
    let scene = Scene::start("symlinked-perf-map", &["--frequency", "49"])?;
    let (attacker, map) = start_jit(&format!("link:{}", secret.display()))?;
    ensure!(map.wait_present()?.file_type().is_symlink());
    let (honest, honest_map) = start_jit("write")?;
    honest_map.wait_present()?;
    let waited = scene.expect_windows(4, "with a symlinked perf map")?;

    let named = scene
        .samples_of(honest.pid())?
        .iter()
        .filter(|s| s.leaf().and_then(Frame::innermost) == Some("jit_hot_loop"))
        .map(|s| s.count)
        .sum::<i64>();
    ensure!(named > 0, "the honest JIT's perf map named nothing");
    let jit = expect_unnamed_jit_frames(&scene, attacker.pid())?;
    let folded = scene.folded()?;
    ensure!(
        !folded.contains(&marker),
        "the host file named frames:\n{folded}"
    );
    let metrics = get(scene.address(), "/metrics")?;
    ensure!(!contains(&metrics.body, &marker));
    println!(
        "ATTACK symlinked-perf-map: 4 windows in {waited:.2?}; {jit} attacker samples in JIT \
         code, unnamed; {named} honest samples named jit_hot_loop"
    );
    drop((attacker, honest));
    scene.finish(&[&marker])?;
    drop((map, honest_map));
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// Attack 4: requests a browser makes for a page elsewhere: DNS rebinding (`Host` names the
/// attacker's domain), a cross-site fetch (`Sec-Fetch-Site`), a foreign `Origin`. Each gets a
/// 403 without a byte of profile; the same requests from a plain client are answered.
#[test]
fn foreign_hosts_and_origins_get_403() -> Result<()> {
    let scene = Scene::start("foreign-host", &[])?;
    scene.expect_windows(1, "before the requests")?;
    let address = scene.address().to_owned();
    let port = address.rsplit_once(':').map_or("", |(_, p)| p).to_owned();
    let paths = [
        "/api/v1/profile?from=0&format=folded",
        "/api/v1/top?from=0",
        "/api/v1/series?from=0",
        "/metrics",
        "/healthz",
        "/",
    ];
    let refused = [
        format!("Host: evil.example:{port}\r\n"),
        "Host: evil.example\r\n".to_owned(),
        format!("Host: localhost.evil.example:{port}\r\n"),
        format!("Host: 127.0.0.1.evil.example:{port}\r\n"),
        format!("Host: {address}\r\nOrigin: https://evil.example\r\n"),
        format!("Host: {address}\r\nOrigin: null\r\n"),
        format!("Host: {address}\r\nSec-Fetch-Site: cross-site\r\n"),
    ];
    let mut slowest = Duration::ZERO;
    for path in paths {
        for headers in &refused {
            let request = format!("GET {path} HTTP/1.1\r\n{headers}Connection: close\r\n\r\n");
            let started = Instant::now();
            let response = http_request(&address, &request, HTTP_TIMEOUT)?;
            slowest = slowest.max(started.elapsed());
            ensure!(
                response.status == 403,
                "{path} with {headers:?}: {} {}",
                response.status,
                String::from_utf8_lossy(&response.body)
            );
            ensure!(
                !contains(&response.body, "leaf_a") && !contains(&response.body, "scorch_"),
                "{path} with {headers:?} answered data: {}",
                String::from_utf8_lossy(&response.body)
            );
        }
        // No Host at all (HTTP/1.0 allows that): refused too.
        let request = format!("GET {path} HTTP/1.0\r\n\r\n");
        let response = http_request(&address, &request, HTTP_TIMEOUT)?;
        ensure!(
            (400..500).contains(&response.status),
            "{path} without Host: {}",
            response.status
        );
        // What the daemon's own UI and command-line clients send.
        for headers in [
            String::new(),
            format!("Origin: http://{address}\r\nSec-Fetch-Site: same-origin\r\n"),
        ] {
            let response = get_with(&address, path, &headers)?;
            ensure!(
                response.status == 200,
                "{path} with {headers:?}: {}",
                response.status
            );
        }
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: localhost:{port}\r\nConnection: close\r\n\r\n");
        ensure!(http_request(&address, &request, HTTP_TIMEOUT)?.status == 200);
    }
    let folded = get(&address, "/api/v1/profile?from=0&format=folded")?;
    ensure!(
        contains(&folded.body, "leaf_a"),
        "the allowed request has no calltree frames"
    );
    println!(
        "ATTACK foreign-host: {} refused requests, each 403 within {slowest:.2?}",
        paths.len() * refused.len()
    );
    scene.expect_windows(1, "after the requests")?;
    scene.finish(&[])?;
    Ok(())
}

/// `_text`, the kernel's randomised base, from `/proc/kallsyms`; 0 when it is hidden.
fn kernel_text_start() -> Result<u64> {
    let kallsyms = std::fs::read_to_string("/proc/kallsyms")?;
    Ok(kallsyms
        .lines()
        .find(|l| l.ends_with(" _text"))
        .and_then(|l| u64::from_str_radix(l.split_whitespace().next()?, 16).ok())
        .unwrap_or(0))
}

/// `/proc/kallsyms` text symbols sorted by address, for naming an absolute address.
fn kernel_symbols() -> Result<Vec<(u64, String)>> {
    let kallsyms = std::fs::read_to_string("/proc/kallsyms")?;
    let mut symbols: Vec<(u64, String)> = kallsyms
        .lines()
        .filter_map(|l| {
            let mut fields = l.split_whitespace();
            let address = u64::from_str_radix(fields.next()?, 16).ok()?;
            let kind = fields.next()?;
            let name = fields.next()?;
            matches!(kind, "t" | "T").then(|| (address, name.to_owned()))
        })
        .collect();
    symbols.sort();
    Ok(symbols)
}

/// The lowest address in the kernel's half of the address space (x86-64 and arm64, 48 bits).
const KERNEL_SPACE: u64 = 0xffff_8000_0000_0000;

/// Attack 5 (an information leak rather than an attack): a kernel-heavy workload fills the
/// profiles with kernel frames. Their addresses must be offsets from `_text`: an absolute
/// kernel address, served to anyone who reaches the API, would give away the KASLR base the
/// daemon reads with CAP_SYSLOG.
#[test]
fn kernel_frames_carry_no_absolute_address() -> Result<()> {
    let program = build_workload("readzero", C_FLAGS)?;
    let scene = Scene::start("kernel-addresses", &["--frequency", "49"])?;
    let worker = Workload::start(&program, &["60"])?;
    scene.expect_windows(4, "while the kernel-heavy workload runs")?;
    let text = kernel_text_start()?;
    let symbols = kernel_symbols()?;

    let profile = scene.profile(&format!("{{pid=\"{}\"}}", worker.pid()))?;
    let strings = &profile.string_table;
    let kernel: Vec<&pprof::Mapping> = profile
        .mapping
        .iter()
        .filter(|m| {
            strings.get(m.filename as usize).map(String::as_str) == Some("[kernel.kallsyms]")
        })
        .collect();
    ensure!(kernel.len() == 1, "{} kernel mappings", kernel.len());
    let mapping = kernel[0];
    ensure!(
        mapping.memory_start < KERNEL_SPACE,
        "the kernel mapping starts at {:#x}",
        mapping.memory_start
    );
    let functions: HashMap<u64, &str> = profile
        .function
        .iter()
        .map(|f| (f.id, strings[f.name as usize].as_str()))
        .collect();
    let (mut frames, mut named, mut placed) = (0, 0, 0);
    for location in &profile.location {
        ensure!(
            location.address < KERNEL_SPACE,
            "location {} has the absolute address {:#x}",
            location.id,
            location.address
        );
        if location.mapping_id != mapping.id {
            continue;
        }
        frames += 1;
        let Some(name) = location
            .line
            .last()
            .and_then(|l| functions.get(&l.function_id))
        else {
            continue;
        };
        named += 1;
        // The offset lands in the function it is named after, seen from /proc/kallsyms: an
        // offset from `_text`, not an address with its top bits cut.
        let name = name.split(" [").next().unwrap_or(name);
        let in_function = |address: u64| {
            let index = symbols.partition_point(|(start, _)| *start <= address);
            index > 0 && symbols[index - 1].1 == name
        };
        let absolute = text.wrapping_add(location.address);
        if text != 0 && (in_function(absolute) || in_function(absolute.wrapping_sub(1))) {
            placed += 1;
        }
    }
    // readzero's kernel path is a handful of functions (read, the zeroing, the syscall
    // entry), each a distinct location.
    ensure!(
        frames >= 5 && named >= 3,
        "only {frames} kernel frames, {named} named"
    );
    if text == 0 {
        println!("/proc/kallsyms hides _text here: the offsets cannot be placed");
    } else {
        ensure!(
            placed * 10 >= named * 9,
            "only {placed} of {named} named kernel frames are offsets into their function"
        );
    }

    // The store holds offsets too, not just what is served.
    let range = scorch::store::TimeRange {
        from: UNIX_EPOCH,
        to: SystemTime::now() + Duration::from_secs(60),
    };
    let stored = scorch::store::Store::open_read_only(&scene.store)?.query(range, &|_| true)?;
    let kernel_locations = stored
        .locations
        .iter()
        .filter(|l| l.kind.is_kernel())
        .count();
    ensure!(kernel_locations > 0);
    if let Some(l) = stored
        .locations
        .iter()
        .find(|l| l.kind.is_kernel() && l.address >= KERNEL_SPACE)
    {
        bail!("the store holds the kernel address {:#x}", l.address);
    }
    let folded = scene.folded()?;
    ensure!(!folded.contains("0xffff"), "{folded}");
    let metrics = get(scene.address(), "/metrics")?;
    let base = format!("{text:x}");
    ensure!(text == 0 || !contains(&metrics.body, &base));
    println!(
        "ATTACK kernel-addresses: {frames} kernel frames served, {named} named, {placed} placed \
         in their function from _text; {kernel_locations} stored kernel locations, all offsets"
    );
    drop(worker);
    let secrets: &[&str] = if text == 0 { &[] } else { &[&base] };
    scene.finish(secrets)?;
    Ok(())
}

/// Attack 6: selectors built to cost the server seconds and hundreds of MiB: 60 matchers of
/// a large Unicode class repeated 150 times (3 KB; `\w{150}` once did, when `\w` was Unicode),
/// 32 of them (within the matcher cap, each regex beyond the compiled size cap), and one longer
/// than 4 KiB. Each is a quick 400. `\w` is ASCII, as in Prometheus, so 32 matchers of
/// `\w{150}` are now an ordinary, quick query.
#[test]
fn selector_bombs_get_400_quickly() -> Result<()> {
    let scene = Scene::start("selector-bomb", &[])?;
    scene.expect_windows(2, "before the bombs")?;
    let regexes = |n: usize, class: &str| -> String {
        let matchers: Vec<String> = (0..n)
            .map(|i| format!(r#"a{i}=~"{class}{{150}}""#))
            .collect();
        format!("{{{}}}", matchers.join(","))
    };
    let bombs = [
        ("60 matchers of \\pL{150}", regexes(60, r"\\pL")),
        ("32 matchers of \\pL{150}", regexes(32, r"\\pL")),
        ("one matcher of \\pL{150}", regexes(1, r"\\pL")),
        (
            "one matcher of (\\w{150}){50}",
            r#"{a=~"(\\w{150}){50}"}"#.to_owned(),
        ),
        (
            "a 5000-byte selector",
            format!(r#"{{a="{}"}}"#, "x".repeat(5000)),
        ),
    ];
    let mut report = Vec::new();
    for (what, selector) in &bombs {
        for route in [
            "/api/v1/profile?from=0&format=svg",
            "/api/v1/top?from=0",
            "/api/v1/series?from=0",
        ] {
            let path = format!("{route}&match={}", url_encode(selector));
            let started = Instant::now();
            let response = get(scene.address(), &path)?;
            let took = started.elapsed();
            let body = String::from_utf8_lossy(&response.body);
            ensure!(
                response.status == 400,
                "{what} on {route}: {} {body}",
                response.status
            );
            ensure!(body.starts_with("parameter match:"), "{what}: {body}");
            ensure!(
                took < Duration::from_secs(1),
                "{what} on {route} took {took:?}"
            );
            report.push(format!(
                "{what} ({} bytes, {} URL-encoded) on {route}: 400 in {took:.2?}",
                selector.len(),
                url_encode(selector).len()
            ));
        }
        scene.memory()?;
    }
    // ASCII classes are cheap: the matcher cap's worth of `\w{150}` is answered, quickly.
    let ascii = url_encode(&regexes(32, r"\\w"));
    let started = Instant::now();
    let response = get(
        scene.address(),
        &format!("/api/v1/top?from=0&match={ascii}"),
    )?;
    let took = started.elapsed();
    ensure!(
        response.status == 200 && took < Duration::from_secs(1),
        "32 matchers of \\w{{150}}: {} in {took:?}: {}",
        response.status,
        String::from_utf8_lossy(&response.body)
    );
    report.push(format!(
        "32 matchers of \\w{{150}} (ASCII, as in Prometheus): 200 in {took:.2?}"
    ));
    // A selector of the same shape within the bounds is answered.
    let fine = url_encode(r#"{comm=~"call[a-z]{4}",a0!~"\\w{3}"}"#);
    let response = get(scene.address(), &format!("/api/v1/top?from=0&match={fine}"))?;
    ensure!(
        response.status == 200 && contains(&response.body, "leaf_a"),
        "a sane selector: {} {}",
        response.status,
        String::from_utf8_lossy(&response.body)
    );
    let memory = scene.memory()?;
    for line in report {
        println!("ATTACK selector-bomb: {line}");
    }
    println!("ATTACK selector-bomb: daemon {memory} after the bombs");
    scene.expect_windows(1, "after the bombs")?;
    scene.finish(&[])?;
    Ok(())
}

/// Writes `windows` synthetic one-second windows ending now into a fresh store at `dir`: 16
/// processes, `stacks` distinct 24-frame stacks each window drawn from 4,000 functions, so a
/// query over all of them merges `windows * stacks` stacks.
fn fill_store(dir: &Path, windows: u64, stacks: u64) -> Result<()> {
    use scorch::profile::{FrameKind, Line, Location, Mapping, Profile, Sample};
    let mut store = scorch::store::Store::open(dir, scorch::store::Retention::default())?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    const FUNCTIONS: u64 = 4000;
    let mapping = Mapping {
        start: 0x40_0000,
        limit: 0x80_0000,
        file_offset: 0,
        path: "/usr/bin/synthetic".to_owned(),
        build_id: None,
        has_functions: true,
        has_filenames: false,
        has_line_numbers: false,
        has_inline_frames: false,
    };
    let locations: Vec<Location> = (0..FUNCTIONS)
        .map(|f| Location {
            mapping: Some(0),
            address: 0x40_0000 + f * 0x40,
            lines: vec![Line::named(format!(
                "synthetic::module_{}::function_{f}_with_a_long_enough_name",
                f / 100
            ))],
            kind: FrameKind::Native,
        })
        .collect();
    // A cheap deterministic mix, so stacks differ between windows.
    let mix = |x: u64| x.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29) ^ x;
    for w in 0..windows {
        let samples = (0..stacks)
            .map(|s| {
                let seed = mix(w * 1_000_003 + s);
                Sample {
                    pid: 1000 + (s % 16) as u32,
                    comm: format!("synthetic{}", s % 16),
                    labels: Arc::default(),
                    locations: (0..24u64)
                        .map(|d| (mix(seed + d * 7919) % FUNCTIONS) as usize)
                        .collect(),
                    count: 1 + seed % 5,
                }
            })
            .collect();
        let profile = Profile {
            start: UNIX_EPOCH + Duration::from_secs(now - windows + w),
            duration: Duration::from_secs(1),
            period_ns: 1_000_000_000 / 19,
            sample_type: scorch::profile::SampleType::Cpu,
            mappings: vec![mapping.clone()],
            locations: locations.clone(),
            samples,
        };
        store.write_window(&profile)?;
    }
    Ok(())
}

/// The latencies of repeated requests: how many, the median and the slowest.
#[derive(Debug, Default)]
struct Latencies(Vec<Duration>);

impl Latencies {
    fn slowest(&self) -> Duration {
        self.0.iter().copied().max().unwrap_or_default()
    }
}

impl std::fmt::Display for Latencies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut sorted = self.0.clone();
        sorted.sort();
        let median = sorted.get(sorted.len() / 2).copied().unwrap_or_default();
        write!(
            f,
            "{} requests, median {median:.1?}, slowest {:.1?}",
            sorted.len(),
            self.slowest()
        )
    }
}

/// The synthetic store of attack 7: 48,000 distinct stacks over 60 windows, just under the
/// 50,000 a query may merge (`MAX_QUERY_STACKS`). Drawn whole, 60,000 such stacks took 300 MiB
/// of the daemon's memory; the server draws the heaviest 8,000 (`MAX_DRAWN_STACKS`) and sums
/// the rest, so two such queries at a time fit the 150 MiB bound.
const WINDOWS: u64 = 60;
const STACKS: u64 = 800;

/// Attack 7: four heavy queries at once over a store of many windows. At most two run at a
/// time; the others wait their turn or, after 2 s, get a 503 with `Retry-After`. None hangs,
/// and `/healthz` and `/metrics` keep answering within a second meanwhile.
#[test]
fn concurrent_heavy_queries_leave_health_and_metrics_responsive() -> Result<()> {
    let store = work_dir().join("adv-heavy-queries-store");
    let _ = std::fs::remove_dir_all(&store);
    let started = Instant::now();
    fill_store(&store, WINDOWS, STACKS)?;
    let filled = started.elapsed();
    let size: u64 = std::fs::read_dir(&store)?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    println!(
        "ATTACK heavy-queries: store of {WINDOWS} synthetic windows of {STACKS} stacks ({:.1} MiB) \
         written in {filled:.1?}",
        size as f64 / (1 << 20) as f64
    );
    let scene = Scene::start_on("heavy-queries", &store, &[], &[])?;
    let address = scene.address().to_owned();
    let idle = scene.memory()?;

    let queries = [
        "/api/v1/profile?from=0&format=svg",
        "/api/v1/profile?from=0&format=pprof",
        "/api/v1/profile?from=0&format=svg",
        "/api/v1/top?from=0",
    ];
    let done = Arc::new(AtomicU64::new(0));
    let results = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = queries
        .iter()
        .map(|&path| {
            let (address, done, results) = (address.clone(), done.clone(), results.clone());
            std::thread::spawn(move || {
                let request =
                    format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
                let started = Instant::now();
                let response = http_request(&address, &request, Duration::from_secs(60));
                let took = started.elapsed();
                if let Ok(mut results) = results.lock() {
                    results.push((path, response.map_err(|e| format!("{e:#}")), took));
                }
                done.fetch_add(1, Ordering::SeqCst);
            })
        })
        .collect();
    let (mut health, mut metrics) = (Latencies::default(), Latencies::default());
    let mut peak = idle;
    while done.load(Ordering::SeqCst) < queries.len() as u64 {
        for (path, latencies) in [("/healthz", &mut health), ("/metrics", &mut metrics)] {
            let started = Instant::now();
            let response = get(&address, path)?;
            latencies.0.push(started.elapsed());
            ensure!(response.status == 200, "{path}: {}", response.status);
        }
        let now = scene.memory()?;
        peak = Memory {
            rss: peak.rss.max(now.rss),
            peak: now.peak,
        };
        std::thread::sleep(Duration::from_millis(100));
    }
    for thread in threads {
        thread
            .join()
            .map_err(|_| anyhow::anyhow!("a query thread panicked"))?;
    }
    let results = results.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    let mut answered = 0;
    for (path, response, took) in results.iter() {
        let response = match response {
            Ok(response) => response,
            Err(error) => bail!("{path}: no answer after {took:?}: {error}"),
        };
        match response.status {
            200 => answered += 1,
            503 => ensure!(
                response.head.to_ascii_lowercase().contains("retry-after:"),
                "{path}: 503 without Retry-After:\n{}",
                response.head
            ),
            other => bail!(
                "{path}: {other} {}",
                String::from_utf8_lossy(&response.body)
            ),
        }
        println!(
            "ATTACK heavy-queries: {path}: {} ({} KiB) in {took:.2?}",
            response.status,
            response.body.len() >> 10
        );
    }
    ensure!(answered >= 1, "no query was answered");
    println!("ATTACK heavy-queries: /healthz during the queries: {health}");
    println!("ATTACK heavy-queries: /metrics during the queries: {metrics}");
    println!(
        "ATTACK heavy-queries: daemon RSS {:.1} MiB idle, {:.1} MiB at most during the queries, \
         peak (VmHWM) {:.1} MiB",
        idle.rss as f64 / 1024.0,
        peak.rss as f64 / 1024.0,
        peak.peak as f64 / 1024.0
    );
    ensure!(
        health.slowest() < Duration::from_secs(1) && metrics.slowest() < Duration::from_secs(1),
        "/healthz ({health}) or /metrics ({metrics}) took a second or more"
    );
    scene.expect_windows(1, "after the queries")?;
    scene.finish(&[])?;
    Ok(())
}

/// Opens a TCP connection to `address` from the loopback address `source`.
fn connect_from(source: &str, address: &str) -> Result<TcpStream> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    let source: SocketAddr = format!("{source}:0").parse()?;
    socket.bind(&source.into())?;
    let target: SocketAddr = address.parse()?;
    socket.connect_timeout(&target.into(), Duration::from_secs(5))?;
    Ok(socket.into())
}

/// What became of a connection: still open (a read timed out), or closed by the server.
fn closed_within(stream: &mut TcpStream, wait: Duration) -> Result<Option<Vec<u8>>> {
    stream.set_read_timeout(Some(wait))?;
    let mut received = Vec::new();
    let mut buffer = [0u8; 1024];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return Ok(Some(received)),
            Ok(n) => received.extend_from_slice(&buffer[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(None)
            }
            // A reset is a close too.
            Err(_) => return Ok(Some(received)),
        }
    }
}

/// Attack 8: slowloris. 40 connections from one address send part of a request line (or
/// nothing) and then wait. The 32-per-peer cap closes the ones beyond it at once, the others
/// hold a slot only until the 10 s header timeout, `/healthz` from another address answers
/// all along, and a SIGTERM with such connections open still stops the daemon in time.
#[test]
fn slowloris_connections_are_capped_and_timed_out() -> Result<()> {
    let scene = Scene::start("slowloris", &[])?;
    let address = scene.address().to_owned();
    let mut slow = Vec::new();
    for i in 0..40 {
        let mut stream = connect_from("127.0.0.1", &address)?;
        // Three in four send a partial request line; the rest send nothing.
        if i % 4 != 3 {
            stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127")?;
        }
        slow.push(stream);
    }
    let opened = Instant::now();
    // The server has accepted (and judged) them all once a later connection is answered.
    let started = Instant::now();
    let response = http_exchange(
        connect_from("127.0.0.2", &address)?,
        &format!("GET /healthz HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"),
        HTTP_TIMEOUT,
    )?;
    let other_peer = started.elapsed();
    ensure!(
        response.status == 200,
        "/healthz from 127.0.0.2: {}",
        response.status
    );
    ensure!(
        other_peer < Duration::from_secs(1),
        "/healthz from 127.0.0.2 took {other_peer:?}"
    );
    let mut closed_at_once = 0;
    let mut open = Vec::new();
    for mut stream in slow {
        match closed_within(&mut stream, Duration::from_millis(200))? {
            Some(_) => closed_at_once += 1,
            None => open.push(stream),
        }
    }
    ensure!(
        closed_at_once == 8 && open.len() == 32,
        "{closed_at_once} of 40 connections closed at once, {} left open (32 per peer allowed)",
        open.len()
    );
    // A 41st connection from the same address is closed rather than left hanging.
    let started = Instant::now();
    let mut extra = connect_from("127.0.0.1", &address)?;
    let _ = extra.write_all(
        format!("GET /healthz HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    ensure!(
        closed_within(&mut extra, Duration::from_secs(2))?.is_some(),
        "a connection beyond the per-peer cap was left open"
    );
    let refused_in = started.elapsed();
    scene.expect_windows(2, "while the slow connections are open")?;

    // The header timeout frees every slot the slow connections held.
    let mut closed_after = Vec::new();
    for mut stream in open {
        let left = (opened + Duration::from_secs(14)).saturating_duration_since(Instant::now());
        let Some(received) = closed_within(&mut stream, left.max(Duration::from_millis(10)))?
        else {
            bail!(
                "a slow connection was still open {:?} after it was made",
                opened.elapsed()
            );
        };
        let text = String::from_utf8_lossy(&received);
        ensure!(
            received.is_empty() || text.starts_with("HTTP/1.1 408"),
            "a slow connection was answered {text:?}"
        );
        closed_after.push(opened.elapsed());
    }
    let last_closed = closed_after.iter().copied().max().unwrap_or_default();
    let first_closed = closed_after.iter().copied().min().unwrap_or_default();
    let response = get(&address, "/healthz")?;
    ensure!(
        response.status == 200,
        "/healthz from 127.0.0.1 afterwards: {}",
        response.status
    );
    println!(
        "ATTACK slowloris: 40 slow connections from 127.0.0.1: 8 closed at once (per-peer cap), \
         32 closed by the header timeout after {first_closed:.1?}..{last_closed:.1?}; the 41st \
         closed in {refused_in:.2?}; /healthz from 127.0.0.2 answered in {other_peer:.2?}"
    );

    // SIGTERM with slow connections open.
    let mut lingering = Vec::new();
    for _ in 0..20 {
        let mut stream = connect_from("127.0.0.3", &address)?;
        stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127")?;
        lingering.push(stream);
    }
    std::thread::sleep(Duration::from_millis(200));
    scene.finish(&[])?;
    drop(lingering);
    Ok(())
}

/// The end of the last `PT_LOAD` segment's bytes in an ELF file (`readelf -l`): truncating the
/// file there keeps what the loader mapped and drops what comes after (debug sections, the
/// symbol table, the section headers).
fn loaded_end(file: &Path) -> Result<u64> {
    let output = run_tool(Command::new("readelf").args(["-l", "-W"]).arg(file))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16);
    let mut end = 0;
    for line in text
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("LOAD "))
    {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (offset, size) = (hex(fields[1])?, hex(fields[4])?);
        end = end.max(offset + size);
    }
    ensure!(end > 0, "no LOAD segment in {}:\n{text}", file.display());
    Ok(end)
}

/// Attack 9: a library the daemon has mapped (to name a workload's frames in it) shrinks
/// under the mapping, so the daemon's next read of a page past the new end raises SIGBUS,
/// which would kill it. First the library loses what lies past its loaded segments (its debug
/// info and symbols; the workload runs on), then everything (the workload dies of SIGBUS
/// itself, probably).
#[test]
fn a_mapped_library_that_shrinks_kills_nothing_but_its_user() -> Result<()> {
    let dir = fresh_dir("adv-sigbus")?;
    let build = dir.join("build");
    let run = dir.join("run");
    std::fs::create_dir_all(&build)?;
    std::fs::create_dir_all(&run)?;
    let built = compile(
        "gcc",
        &workload_source("libwork.c"),
        &build.join("libwork.so"),
        // -g3: macro info makes the debug sections pages long, so most of them (the names
        // lookups read among them) lie in whole pages past the loaded segments.
        &["-shared", "-fPIC", "-O2", "-fno-omit-frame-pointer", "-g3"],
        &[],
    )?;
    let library_dir = build.to_str().context("non-UTF-8 path")?;
    let program = compile(
        "gcc",
        &workload_source("uselib.c"),
        &dir.join("uselib"),
        &["-O2", "-fno-omit-frame-pointer"],
        &[&format!("-L{library_dir}"), "-lwork"],
    )?;
    let library = run.join("libwork.so");
    std::fs::copy(&built, &library)?;
    // A page boundary: bytes past the end within the last page read as zeros; only whole
    // pages past it raise SIGBUS.
    let end = loaded_end(&library)?.next_multiple_of(4096);
    let size = std::fs::metadata(&library)?.len();
    ensure!(
        end + 4096 <= size,
        "libwork.so has less than a page past its loaded segments ({end} of {size} bytes)"
    );

    let scene = Scene::start("sigbus", &["--frequency", "49"])?;
    let child = Command::new(&program)
        .arg("60")
        .env("LD_LIBRARY_PATH", &run)
        .stdout(Stdio::null())
        .spawn()
        .context("starting uselib")?;
    let mut workload = Workload { child };
    let pid = workload.pid();
    let maps_copy = || {
        std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .is_ok_and(|m| m.contains(&library.display().to_string()))
    };
    let started = Instant::now();
    while !maps_copy() {
        ensure!(
            started.elapsed() < Duration::from_secs(5),
            "uselib does not map {}",
            library.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The daemon has named the library's frames: it has the library mapped.
    let started = Instant::now();
    loop {
        scene.expect_windows(1, "before the library shrinks")?;
        let named = scene
            .samples_of(pid)?
            .iter()
            .any(|s| s.leaf().and_then(Frame::function) == Some("libwork_spin"));
        if named {
            break;
        }
        ensure!(
            started.elapsed() < Duration::from_secs(15),
            "libwork_spin was never named"
        );
    }

    let faults = || metric(scene.address(), "scorch_mapped_file_faults_total");
    ensure!(faults()? == 0.0);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&library)?
        .set_len(end)?;
    scene.expect_windows(3, "after the library lost its debug info")?;
    let survived = workload.child.try_wait()?.is_none();
    let cut_faults = faults()?;
    // The daemon did read past the new end (the names in .debug_str), and lived.
    ensure!(
        cut_faults > 0.0,
        "the daemon read nothing past the end of the shrunk library: the attack missed"
    );
    std::fs::OpenOptions::new()
        .write(true)
        .open(&library)?
        .set_len(0)?;
    scene.expect_windows(3, "after the library was emptied")?;
    let status = workload.child.try_wait()?;
    let emptied_faults = faults()?;
    println!(
        "ATTACK sigbus: libwork.so cut from {size} to {end} bytes (the workload {}; {cut_faults} \
         pages read as zeros), then to 0 (the workload {}; {emptied_faults} pages in all)",
        if survived { "ran on" } else { "died" },
        match status {
            Some(status) => format!("ended: {status}"),
            None => "ran on".to_owned(),
        }
    );
    drop(workload);
    scene.finish(&[])?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// A build id both twins claim.
const SHARED_BUILD_ID: &str = "0x5c0c0c5c0123456789abcdef0123456789abcdef";

/// Builds `twin.c` as `dir/name` with its functions named `SPIN` and `CALLER`.
fn build_twin(dir: &Path, name: &str, spin: &str, caller: &str, flags: &[&str]) -> Result<PathBuf> {
    let spin = format!("-DSPIN={spin}");
    let caller = format!("-DCALLER={caller}");
    let build_id = format!("-Wl,--build-id={SHARED_BUILD_ID}");
    let mut all = vec![spin.as_str(), caller.as_str(), build_id.as_str()];
    all.extend_from_slice(C_FLAGS);
    all.extend_from_slice(flags);
    compile(
        "gcc",
        &workload_source("twin.c"),
        &dir.join(name),
        &all,
        &[],
    )
}

/// The samples of `pid`, with the function names of all its frames.
fn frame_names(samples: &[DetailedSample]) -> Vec<String> {
    samples
        .iter()
        .flat_map(|s| &s.frames)
        .flat_map(|f| &f.lines)
        .map(|l| l.function.clone())
        .collect()
}

/// Attack 10: build id cache poisoning. Two binaries claim one build id; their code is the
/// same, their symbols name it differently. Each process's frames must be named from its own
/// binary, though the first one parsed would otherwise be taken for both.
#[test]
fn a_shared_build_id_lends_no_names() -> Result<()> {
    let dir = fresh_dir("adv-twins")?;
    let alpha = build_twin(
        &dir,
        "twin_alpha",
        "alpha_twin_spin",
        "alpha_twin_loop",
        &[],
    )?;
    let gamma = build_twin(
        &dir,
        "twin_gamma",
        "gamma_twin_spin",
        "gamma_twin_loop",
        &[],
    )?;
    let id = gnu_build_id(&alpha)?;
    ensure!(
        id == gnu_build_id(&gamma)? && SHARED_BUILD_ID.ends_with(&id),
        "{id}"
    );

    let scene = Scene::start("build-id-poisoning", &["--frequency", "49"])?;
    // Alpha first, so its parse is the one cached when gamma's frames come.
    let first = Workload::start(&alpha, &["60"])?;
    scene.expect_windows(2, "with the first twin")?;
    let second = Workload::start(&gamma, &["60"])?;
    scene.expect_windows(3, "with both twins")?;
    for (workload, own, other) in [(&first, "alpha_", "gamma_"), (&second, "gamma_", "alpha_")] {
        let samples = scene.samples_at_least(workload.pid(), 21)?;
        let names = frame_names(&samples);
        ensure!(
            !names.iter().any(|n| n.starts_with(other)),
            "pid {} is named from its twin's binary:\n{}",
            workload.pid(),
            describe_stacks(&samples, 5)
        );
        let spin = format!("{own}twin_spin");
        let (hits, total) = count_where(&samples, |s| {
            s.leaf().and_then(Frame::function) == Some(spin.as_str())
        });
        ensure!(
            total > 20 && hits * 2 > total,
            "{hits} of {total} samples of pid {} in {spin}:\n{}",
            workload.pid(),
            describe_stacks(&samples, 5)
        );
        println!("ATTACK build-id-poisoning: {hits} of {total} samples of {own}twin named {spin}");
    }
    drop((first, second));
    scene.finish(&[])?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// The contents of a `.gnu_debuglink` section: the name, NUL-padded to 4 bytes, then the CRC-32
/// of the debug file.
fn debuglink_section(name: &str, debug_file: &Path) -> Result<Vec<u8>> {
    let mut section = name.as_bytes().to_vec();
    section.push(0);
    while !section.len().is_multiple_of(4) {
        section.push(0);
    }
    let mut crc = flate2::Crc::new();
    crc.update(&std::fs::read(debug_file)?);
    section.extend_from_slice(&crc.sum().to_le_bytes());
    Ok(section)
}

/// Attack 11: a stripped binary's `.gnu_debuglink` climbs out of its directory
/// (`../../../../<dir>/secret.debug`) to a debug file elsewhere whose symbols carry a marker;
/// a second binary's debug link is a plain name, but the file of that name beside it is a
/// symlink to the same secret. Neither is followed: the marker names no frame.
#[test]
fn debug_links_reach_no_file_outside() -> Result<()> {
    let dir = fresh_dir("adv-debuglink")?;
    let (bin, bin2, secret_dir) = (dir.join("bin"), dir.join("bin2"), dir.join("secret"));
    for d in [&bin, &bin2, &secret_dir] {
        std::fs::create_dir_all(d)?;
    }
    let marker = unique("secret_marker");
    let spin = format!("{marker}_spin");
    // The secret: debug info naming the same code with the marker.
    let full = build_twin(
        &secret_dir,
        "full",
        &spin,
        &format!("{marker}_loop"),
        &["-g"],
    )?;
    let secret = secret_dir.join("secret.debug");
    run_tool(
        Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(&full)
            .arg(&secret),
    )?;
    std::fs::remove_file(&full)?;

    // One victim, stripped, whose debug link climbs to the secret.
    let victim = build_twin(
        &bin,
        "victim_dl",
        "victim_dl_spin",
        "victim_dl_loop",
        &["-g"],
    )?;
    run_tool(Command::new("strip").arg("--strip-all").arg(&victim))?;
    let other = bin2.join("victim_dl2");
    std::fs::copy(&victim, &other)?;
    let depth = bin.components().count();
    let climb = format!(
        "{}{}",
        "../".repeat(depth + 2),
        secret.strip_prefix("/")?.display()
    );
    ensure!(climb.len() < 255, "the debug link {climb} is too long");
    let section = dir.join("debuglink.bin");
    std::fs::write(&section, debuglink_section(&climb, &secret)?)?;
    let mut add = std::ffi::OsString::from(".gnu_debuglink=");
    add.push(&section);
    run_tool(
        Command::new("objcopy")
            .arg("--add-section")
            .arg(add)
            .args(["--set-section-flags", ".gnu_debuglink=readonly"])
            .arg(&victim),
    )?;
    // The other: a plain name, and a symlink of that name to the secret.
    let mut link = std::ffi::OsString::from("--add-gnu-debuglink=");
    link.push(&secret);
    run_tool(Command::new("objcopy").arg(link).arg(&other))?;
    std::os::unix::fs::symlink(&secret, bin2.join("secret.debug"))?;
    for binary in [&victim, &other] {
        let sections = section_names(binary)?;
        ensure!(
            sections.iter().any(|s| s == ".gnu_debuglink")
                && !sections
                    .iter()
                    .any(|s| s == ".symtab" || s == ".debug_info"),
            "{}: {sections:?}",
            binary.display()
        );
    }

    let scene = Scene::start("debuglink-traversal", &["--frequency", "49"])?;
    let climber = Workload::start(&victim, &["60"])?;
    let linker = Workload::start(&other, &["60"])?;
    scene.expect_windows(4, "with the debug links")?;
    for workload in [&climber, &linker] {
        let samples = scene.samples_at_least(workload.pid(), 21)?;
        let total: i64 = samples.iter().map(|s| s.count).sum();
        ensure!(total > 20, "only {total} samples of pid {}", workload.pid());
        let names = frame_names(&samples);
        ensure!(
            !names.iter().any(|n| n.contains(&marker)),
            "the secret debug file named pid {}'s frames:\n{}",
            workload.pid(),
            describe_stacks(&samples, 5)
        );
        println!(
            "ATTACK debuglink-traversal: {total} samples of pid {}, none named from the secret",
            workload.pid()
        );
    }
    ensure!(!scene.folded()?.contains(&marker));
    drop((climber, linker));
    scene.finish(&[&marker])?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// The writable cgroup v2 tree: `/sys/fs/cgroup` on a unified host, `/sys/fs/cgroup/unified`
/// on a hybrid one.
fn cgroup_v2_root() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            (fields.get(2) == Some(&"cgroup2")
                && fields.get(3).is_some_and(|o| o.starts_with("rw")))
            .then(|| PathBuf::from(fields[1]))
        })
        .find(|p| p.starts_with("/sys/fs/cgroup"))
}

/// Attack 12: a process with a delegated cgroup subtree (a unit's, a container's) nests
/// cgroups named like another workload's (`sshd.service`, another container's scope) to wear
/// its labels. The outermost unit and container are the ones that count.
#[test]
fn nested_cgroups_take_no_other_identity() -> Result<()> {
    let Some(root) = cgroup_v2_root() else {
        println!("SKIPPED nested_cgroups_take_no_other_identity: no writable cgroup v2 hierarchy");
        return Ok(());
    };
    const OUTER: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
    const INNER: &str = "aaaabbbbccccddddeeeeffff00001111aaaabbbbccccddddeeeeffff00001111";
    let unit = Cgroup::create(
        &root,
        "/scorch-adv.slice/scorch-adv-tenant.service/sshd.service",
    )?;
    let container = Cgroup::create(
        &root,
        &format!("/scorch-adv.slice/docker-{OUTER}.scope/docker-{INNER}.scope"),
    )?;
    let program = build_workload("calltree", C_FLAGS)?;
    let dir = fresh_dir("adv-cgroups")?;
    let (unit_copy, container_copy) = (dir.join("cgunit"), dir.join("cgcontainer"));
    std::fs::copy(&program, &unit_copy)?;
    std::fs::copy(&program, &container_copy)?;
    let in_unit = Workload::start(&unit_copy, &["1", "60"])?;
    let in_container = Workload::start(&container_copy, &["1", "60"])?;
    unit.add(in_unit.pid())?;
    container.add(in_container.pid())?;

    let scene = Scene::start("cgroup-spoofing", &[])?;
    scene.expect_windows(3, "with the nested cgroups")?;
    let series = get(scene.address(), "/api/v1/series?from=0")?;
    ensure!(series.status == 200);
    let series: Vec<HashMap<String, String>> = serde_json::from_slice(&series.body)?;
    let find = |pid: u32| {
        series
            .iter()
            .find(|l| l.get("pid") == Some(&pid.to_string()))
            .cloned()
            .with_context(|| format!("no series of pid {pid} in {series:?}"))
    };
    let unit_labels = find(in_unit.pid())?;
    ensure!(
        unit_labels.get("systemd_unit").map(String::as_str) == Some("scorch-adv-tenant.service")
            && unit_labels.get("service_name").map(String::as_str)
                == Some("scorch-adv-tenant.service"),
        "{unit_labels:?}"
    );
    let container_labels = find(in_container.pid())?;
    ensure!(
        container_labels.get("container_id").map(String::as_str) == Some(OUTER),
        "{container_labels:?}"
    );
    let spoofed = url_encode(r#"{systemd_unit="sshd.service"}"#);
    let response = get(
        scene.address(),
        &format!("/api/v1/series?from=0&match={spoofed}"),
    )?;
    let as_sshd: Vec<HashMap<String, String>> = serde_json::from_slice(&response.body)?;
    ensure!(
        as_sshd.is_empty(),
        "series claiming sshd.service: {as_sshd:?}"
    );
    println!(
        "ATTACK cgroup-spoofing: .../scorch-adv-tenant.service/sshd.service is {:?}; \
         .../docker-OUTER.scope/docker-INNER.scope is container {}",
        unit_labels["systemd_unit"],
        &container_labels["container_id"][..12]
    );
    drop((in_unit, in_container));
    scene.finish(&[])?;
    // Cgroups go once their processes are reaped (the workloads were dropped above).
    std::thread::sleep(Duration::from_millis(100));
    drop((unit, container));
    ensure!(
        !root.join("scorch-adv.slice").exists(),
        "{} was not removed",
        root.join("scorch-adv.slice").display()
    );
    Ok(())
}

/// Attack 13 (a misconfiguration rather than an attack): `WATCHDOG_USEC=1`, a watchdog too
/// short to honour. The daemon pings as often as it can (every millisecond), writes its
/// windows, and stops on SIGTERM; a zero ping period once made it panic. Then the manager stops
/// reading its socket for a while: the queue fills, and a blocking send would stop the window
/// loop (and SIGTERM with it) until it reads again.
#[test]
fn a_one_microsecond_watchdog_is_survived() -> Result<()> {
    let socket_path = work_dir().join("adv-notify.sock");
    let _ = std::fs::remove_file(&socket_path);
    let socket = std::os::unix::net::UnixDatagram::bind(&socket_path)?;
    socket.set_read_timeout(Some(Duration::from_millis(100)))?;
    let stop = Arc::new(AtomicBool::new(false));
    let paused = Arc::new(AtomicBool::new(false));
    let pings = Arc::new(AtomicU64::new(0));
    let other = Arc::new(Mutex::new(Vec::<String>::new()));
    let reader = {
        let (stop, paused) = (stop.clone(), paused.clone());
        let (pings, other) = (pings.clone(), other.clone());
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while !stop.load(Ordering::SeqCst) {
                if paused.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                let Ok(n) = socket.recv(&mut buffer) else {
                    continue;
                };
                let message = String::from_utf8_lossy(&buffer[..n]).into_owned();
                if message == "WATCHDOG=1" {
                    pings.fetch_add(1, Ordering::SeqCst);
                } else if let Ok(mut other) = other.lock() {
                    other.push(message);
                }
            }
        })
    };
    let path = socket_path.to_str().context("non-UTF-8 path")?.to_owned();
    let store = work_dir().join("adv-watchdog-store");
    let _ = std::fs::remove_dir_all(&store);
    let scene = Scene::start_on(
        "watchdog",
        &store,
        &[],
        &[("NOTIFY_SOCKET", &path), ("WATCHDOG_USEC", "1")],
    )?;
    let before = pings.load(Ordering::SeqCst);
    let waited = scene.expect_windows(3, "with WATCHDOG_USEC=1")?;
    let during = pings.load(Ordering::SeqCst) - before;
    let rate = during as f64 / waited.as_secs_f64();
    ensure!(rate > 50.0, "only {rate:.0} pings a second");

    paused.store(true, Ordering::SeqCst);
    let deaf = scene.expect_windows(3, "while the manager reads nothing")?;
    paused.store(false, Ordering::SeqCst);
    let resumed = pings.load(Ordering::SeqCst);
    let started = Instant::now();
    while pings.load(Ordering::SeqCst) < resumed + 100 {
        ensure!(
            started.elapsed() < Duration::from_secs(5),
            "the pings did not resume"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let (_, _, stderr) = scene.finish(&[])?;
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::SeqCst);
    reader
        .join()
        .map_err(|_| anyhow::anyhow!("the notify reader panicked"))?;
    let _ = std::fs::remove_file(&socket_path);
    let other = other.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    ensure!(
        other.iter().any(|m| m.starts_with("READY=1")),
        "no READY=1: {other:?}"
    );
    ensure!(
        other.iter().any(|m| m.starts_with("STOPPING=1")),
        "no STOPPING=1: {other:?}"
    );
    // The full queue is told once, not once a millisecond.
    let complaints = stderr.lines().filter(|l| l.contains("to systemd")).count();
    ensure!(
        (1..=3).contains(&complaints),
        "{complaints} log lines about failed notifications:\n{stderr}"
    );
    println!(
        "ATTACK watchdog: {during} pings in {waited:.1?} ({rate:.0}/s) while 3 windows were \
         written; 3 more windows in {deaf:.1?} while the socket was not read ({complaints} \
         warning logged)"
    );
    Ok(())
}
