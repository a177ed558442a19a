//! The remote sink's costs: `cargo bench -p scorch --bench remote -- SCORCH_BIN WORK_DIR`
//! (`cargo xtask bench --only remote` runs it as root and keeps its `remote:` lines).
//!
//! - Encode and send: one window of 100 series (synthetic: 100 processes, 40 stacks of 24
//!   frames each over shared and per-process binaries), split, pprof-encoded and pushed to a
//!   Pyroscope stand-in on loopback that answers 200, on a single-threaded runtime so all of
//!   the client's work lands on the measured thread; thread CPU time, median of 30.
//! - A server-down hour: a store already holding an hour of such windows (360 of 10 s) as the
//!   sink's backlog; the real `scorch run` (its own sampling included) runs against a port
//!   nobody listens on for DOWN_SECONDS, its RSS read every second. Then the stand-in starts
//!   and the time until the queue is empty gives the drain speed against real time.
//!
//! - OTLP against pprof: the same windows as OTLP export requests (one dictionary per request)
//!   and as the pprofs the other sinks send (one per series): bytes per window plain and
//!   gzipped, and the thread CPU time to encode (and gzip), median of 30.
//!
//! Without arguments (plain `cargo bench`) only the first and last figures are measured.

use std::{
    path::Path,
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant, SystemTime},
};

use scorch::{
    export::{self, otlp, pyroscope, ClientSettings, RemoteConfig, RemoteProtocol},
    profile::{encode, FrameKind, Labels, Line, Location, Mapping, Profile, Sample, SampleKind},
    store::{Retention, Store, WindowId},
};

const SERIES: usize = 100;
/// Heavy: 4000 distinct stacks need at least 4000 samples in the window, a fully busy host of
/// 21 CPUs at 19 Hz for 10 s: ten times what this 2-CPU machine can produce.
const STACKS_PER_SERIES: usize = 40;
/// Typical: most of 100 processes on a host are idle-ish, a few stacks each.
const TYPICAL_STACKS_PER_SERIES: usize = 8;
const DEPTH: usize = 24;
/// An hour of 10 s windows.
const BACKLOG_WINDOWS: usize = 360;
const DOWN_SECONDS: u64 = 60;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let server = StandIn::start();
    server.listen();
    encode_and_send(&server, STACKS_PER_SERIES);
    encode_and_send(&server, TYPICAL_STACKS_PER_SERIES);
    otlp_against_pprof(STACKS_PER_SERIES);
    otlp_against_pprof(TYPICAL_STACKS_PER_SERIES);
    let [scorch, work] = args.as_slice() else {
        println!(
            "remote: server-down hour skipped, needs SCORCH_BIN WORK_DIR (cargo xtask bench --only remote)"
        );
        return;
    };
    server_down_hour(Path::new(scorch), Path::new(work), server);
}

/// A window of `SERIES` processes, deterministic for a given `seed`.
fn synthetic_window(start: SystemTime, seed: u64, stacks_per_series: usize) -> Profile {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut mappings = vec![
        Mapping {
            start: 0xffff_ffff_8100_0000,
            limit: u64::MAX,
            file_offset: 0,
            path: "[kernel.kallsyms]".into(),
            build_id: None,
            has_functions: true,
            has_filenames: false,
            has_line_numbers: false,
            has_inline_frames: false,
        },
        Mapping {
            start: 0x7f00_0000_0000,
            limit: 0x7f00_0020_0000,
            file_offset: 0,
            path: "/usr/lib/x86_64-linux-gnu/libc.so.6".into(),
            build_id: Some("89c3cb85f9e55046776471fed05ec441581d1969".into()),
            has_functions: true,
            has_filenames: false,
            has_line_numbers: false,
            has_inline_frames: false,
        },
    ];
    let mut locations = Vec::new();
    // 200 kernel and 300 libc functions shared by everyone.
    for i in 0..200u64 {
        locations.push(Location {
            mapping: Some(0),
            address: 0xffff_ffff_8100_0000 + i * 0x40,
            lines: vec![Line::named(format!("kernel_function_{i}"))],
            kind: FrameKind::Kernel,
        });
    }
    for i in 0..300u64 {
        locations.push(Location {
            mapping: Some(1),
            address: 0x7f00_0000_1000 + i * 0x40,
            lines: vec![Line::named(format!("libc_function_{i}"))],
            kind: FrameKind::Native,
        });
    }
    let mut samples = Vec::new();
    for process in 0..SERIES {
        let mapping = mappings.len();
        mappings.push(Mapping {
            start: 0x5555_0000_0000,
            limit: 0x5555_0100_0000,
            file_offset: 0,
            path: format!("/usr/bin/service-{process}"),
            build_id: Some(format!("{process:040x}")),
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
        });
        // 150 functions of its own, with file:line and an inlined level.
        let first = locations.len();
        for i in 0..150u64 {
            locations.push(Location {
                mapping: Some(mapping),
                address: 0x5555_0000_1000 + i * 0x80,
                lines: vec![
                    Line {
                        function: format!("service_{process}::module::inlined_helper_{i}"),
                        system_name: format!("_ZN9service{process}6module15inlined_helper{i}E"),
                        file: Some(format!("src/module_{}.rs", i % 12)),
                        line: 10 + i as u32,
                        column: 0,
                    },
                    Line {
                        function: format!("service_{process}::module::function_{i}"),
                        system_name: format!("_ZN9service{process}6module8function{i}E"),
                        file: Some(format!("src/module_{}.rs", i % 12)),
                        line: 200 + i as u32,
                        column: 0,
                    },
                ],
                kind: FrameKind::Native,
            });
        }
        let labels = Arc::new(Labels::from([
            (
                "service_name".to_owned(),
                format!("service-{}", process % 20),
            ),
            ("comm".to_owned(), format!("service-{process}")),
            ("pid".to_owned(), (1000 + process).to_string()),
        ]));
        for _ in 0..stacks_per_series {
            let mut stack = Vec::with_capacity(DEPTH);
            if rng.bool() {
                for _ in 0..4 {
                    stack.push(rng.usize(0..200));
                }
            }
            for _ in 0..3 {
                stack.push(200 + rng.usize(0..300));
            }
            while stack.len() < DEPTH {
                stack.push(first + rng.usize(0..150));
            }
            samples.push(Sample {
                pid: 1000 + process as u32,
                comm: format!("service-{process}"),
                labels: labels.clone(),
                locations: stack,
                count: 1 + rng.u64(0..20),
            });
        }
    }
    Profile {
        start,
        duration: Duration::from_secs(10),
        period_ns: 52_631_578,
        sample_type: scorch::profile::SampleType::Cpu,
        mappings,
        locations,
        samples,
    }
}

/// A Pyroscope stand-in: answers every push 200 and counts bytes.
struct StandIn {
    port: u16,
    runtime: tokio::runtime::Runtime,
    bytes: Arc<AtomicU64>,
    pushes: Arc<AtomicU64>,
}

impl StandIn {
    fn start() -> StandIn {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        StandIn {
            port,
            runtime,
            bytes: Arc::default(),
            pushes: Arc::default(),
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn listen(&self) {
        let listener = self
            .runtime
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", self.port)))
            .expect("binding the stand-in");
        let (bytes, pushes) = (self.bytes.clone(), self.pushes.clone());
        let app = axum::Router::new().route(
            "/push.v1.PusherService/Push",
            axum::routing::post(move |body: axum::body::Bytes| {
                bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
                pushes.fetch_add(1, Ordering::Relaxed);
                async { "" }
            }),
        );
        self.runtime.spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
    }
}

/// Bytes allocated on the heap, mmapped blocks included.
fn heap_bytes() -> i64 {
    // SAFETY: mallinfo2 only reads the allocator's statistics.
    let info = unsafe { libc::mallinfo2() };
    (info.uordblks + info.hblkhd) as i64
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn encode_and_send(server: &StandIn, stacks_per_series: usize) {
    let settings = ClientSettings::new(&RemoteConfig {
        url: Some(server.url()),
        ..RemoteConfig::default()
    })
    .expect("settings");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let client = pyroscope::Client::new(&settings).expect("a client");
    let mut cpu = Vec::new();
    let mut wire = 0;
    for i in 0..31 {
        let profile = synthetic_window(SystemTime::now(), i, stacks_per_series);
        assert_eq!(export::split_by_series(&profile).len(), SERIES);
        let started = thread_cpu();
        let start_ns = profile
            .start
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_nanos() as i64;
        let requests = export::encode_window(&profile, || {
            pyroscope::PushBuilder::new(start_ns, SampleKind::Cpu)
        });
        for request in &requests {
            wire = runtime.block_on(client.send(request)).expect("sending");
        }
        // The first one warms the connection and the allocator.
        if i > 0 {
            cpu.push(thread_cpu() - started);
        }
    }
    cpu.sort();
    let median = cpu[cpu.len() / 2];
    println!(
        "remote: encode and send one window of {SERIES} series ({} stacks of {DEPTH} frames, \
         {:.0} KiB pushed): median {:.1} ms CPU of {} (min {:.1}, max {:.1}) ({}: at most 50 ms)",
        SERIES * stacks_per_series,
        wire as f64 / 1024.0,
        median.as_secs_f64() * 1e3,
        cpu.len(),
        cpu[0].as_secs_f64() * 1e3,
        cpu[cpu.len() - 1].as_secs_f64() * 1e3,
        verdict(median <= Duration::from_millis(50)),
    );
}

/// What one encoding of a window costs: bytes plain and gzipped, CPU to encode and to gzip.
#[derive(Default)]
struct Encoded {
    plain: usize,
    gzipped: usize,
    encode: Duration,
    gzip: Duration,
}

/// The pprofs the Pyroscope and Parca sinks send: one per series.
fn encode_pprof(profile: &Profile) -> Encoded {
    let mut out = Encoded::default();
    let started = thread_cpu();
    let plain: Vec<Vec<u8>> = export::split_by_series(profile)
        .iter()
        .map(|series| {
            prost::Message::encode_to_vec(&encode::pprof::samples_message(profile, &series.samples))
        })
        .collect();
    out.encode = thread_cpu() - started;
    let started = thread_cpu();
    for bytes in &plain {
        out.plain += bytes.len();
        out.gzipped += encode::pprof::gzip_fast(bytes).len();
    }
    out.gzip = thread_cpu() - started;
    out
}

/// The OTLP sink's requests, gzipped at the same level as the pprofs.
fn encode_otlp(profile: &Profile) -> Encoded {
    let options = otlp::convert::ConvertOptions {
        host_name: "bench-host".into(),
        max_bytes: 2 << 20,
    };
    let mut out = Encoded::default();
    let started = thread_cpu();
    let plain: Vec<Vec<u8>> = otlp::convert::window_requests(profile, &options)
        .iter()
        .map(prost::Message::encode_to_vec)
        .collect();
    out.encode = thread_cpu() - started;
    let started = thread_cpu();
    for bytes in &plain {
        out.plain += bytes.len();
        out.gzipped += encode::pprof::gzip_fast(bytes).len();
    }
    out.gzip = thread_cpu() - started;
    out
}

fn otlp_against_pprof(stacks_per_series: usize) {
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1e3
    };
    let (mut pprof, mut otlp) = (Vec::new(), Vec::new());
    for i in 0..31 {
        let profile = synthetic_window(SystemTime::now(), i, stacks_per_series);
        // The first of each warms the allocator.
        let (p, o) = (encode_pprof(&profile), encode_otlp(&profile));
        if i > 0 {
            pprof.push(p);
            otlp.push(o);
        }
    }
    let line = |name: &str, runs: Vec<Encoded>| {
        format!(
            "{name} {:.0} KiB plain, {:.0} KiB gzipped, encode {:.1} ms + gzip {:.1} ms",
            runs[0].plain as f64 / 1024.0,
            runs[0].gzipped as f64 / 1024.0,
            median(runs.iter().map(|r| r.encode).collect()),
            median(runs.iter().map(|r| r.gzip).collect()),
        )
    };
    println!(
        "remote: OTLP against pprof, one window of {SERIES} series ({} stacks of {DEPTH} \
         frames), median CPU of 30: {}; {}",
        SERIES * stacks_per_series,
        line("pprof per series", pprof),
        line("OTLP", otlp),
    );
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "meets target"
    } else {
        "MISSES target"
    }
}

/// The daemon's HTTP address for the bench.
const HTTP_ADDRESS: &str = "127.0.0.1:17072";

fn server_down_hour(scorch: &Path, work: &Path, server: StandIn) {
    let store_dir = work.join("remote-backlog-store");
    let _ = std::fs::remove_dir_all(&store_dir);
    // The port of a stand-in that is not listening yet: the server is down.
    let down = StandIn::start();
    let url = down.url();
    {
        let mut store = Store::open(&store_dir, Retention::default()).expect("a store");
        let now = SystemTime::now();
        for i in 0..BACKLOG_WINDOWS {
            let start = now - Duration::from_secs(10 * (BACKLOG_WINDOWS - i) as u64);
            store
                .write_window(&synthetic_window(start, i as u64 % 8, STACKS_PER_SERIES))
                .expect("writing a window");
        }
        // A sink that has been running and delivered none of them.
        let name = export::cursor_name(
            RemoteProtocol::Pyroscope,
            &export::endpoint(&url, false).expect("url"),
        );
        store.set_cursor(&name, WindowId::NONE).expect("cursor");
        store
            .set_cursor(&format!("{name}#started"), WindowId::new(1))
            .expect("cursor");
        store.checkpoint().expect("checkpoint");
        println!(
            "remote: backlog store of {BACKLOG_WINDOWS} windows x {SERIES} series: {:.1} MiB",
            store.disk_bytes() as f64 / (1 << 20) as f64
        );
        // What the sender's heap holds for one window, at its two stages.
        let before = heap_bytes();
        let profile = store
            .window_profile(WindowId::new(BACKLOG_WINDOWS as i64))
            .expect("reading a window")
            .expect("the last window");
        let read = heap_bytes();
        let requests =
            export::encode_window(&profile, || pyroscope::PushBuilder::new(0, SampleKind::Cpu));
        let encoded = heap_bytes();
        drop(profile);
        let kept = heap_bytes();
        println!(
            "remote: heap for one window: {:.1} MiB read from the store, {:.1} MiB more at the \
             end of encoding ({} requests), {:.1} MiB once the window is dropped",
            (read - before) as f64 / (1 << 20) as f64,
            (encoded - read) as f64 / (1 << 20) as f64,
            requests.len(),
            (kept - before) as f64 / (1 << 20) as f64,
        );
    }
    drop(server);

    // The baseline: the same daemon on the same machine, with no remote, for as long.
    let baseline = {
        let mut daemon = Command::new(scorch)
            .args(["run", "--http-address", HTTP_ADDRESS])
            .arg("--store")
            .arg(work.join("remote-baseline-store"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting scorch run");
        let guard = KillOnDrop(daemon.id());
        let rss = watch_rss(daemon.id(), DOWN_SECONDS);
        drop(guard);
        let _ = daemon.wait();
        let _ = std::fs::remove_dir_all(work.join("remote-baseline-store"));
        rss
    };

    let mut daemon = Command::new(scorch)
        .args(["run", "--http-address", HTTP_ADDRESS, "--remote-url", &url])
        .arg("--store")
        .arg(&store_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting scorch run");
    let pid = daemon.id();
    let guard = KillOnDrop(pid);
    let rss = watch_rss(pid, DOWN_SECONDS);
    let queued = metric("scorch_remote_queue_windows");
    let retries = metric("scorch_remote_retries_total");
    let max = rss.max.rss;
    println!(
        "remote: server down {DOWN_SECONDS} s with an hour ({BACKLOG_WINDOWS} windows) queued: \
         RSS median {}, max {} ({}: under 40 MB); {queued:.0} windows queued, {retries:.0} \
         retries; the same daemon without a remote just before: RSS median {}, max {}",
        rss.median,
        rss.max,
        verdict(max as f64 * 1024.0 < 40e6),
        baseline.median,
        baseline.max,
    );

    // The server comes back.
    down.listen();
    let back = Instant::now();
    let mut peak = 0u64;
    loop {
        std::thread::sleep(Duration::from_millis(100));
        peak = peak.max(rss_kib(pid));
        if metric("scorch_remote_queue_windows") == 0.0 || back.elapsed() > Duration::from_secs(600)
        {
            break;
        }
    }
    let drain = back.elapsed().as_secs_f64();
    let sent = metric("scorch_remote_windows_sent_total");
    let covered = sent * 10.0;
    println!(
        "remote: backlog drained: {sent:.0} windows ({covered:.0} s of profiles, {:.1} MiB \
         pushed) in {drain:.1} s = {:.0}x real time ({}: at least 10x); RSS max while draining \
         {:.1} MiB",
        down.bytes.load(Ordering::Relaxed) as f64 / (1 << 20) as f64,
        covered / drain,
        verdict(covered / drain >= 10.0),
        peak as f64 / 1024.0,
    );
    drop(guard);
    let _ = daemon.wait();
}

struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the daemon this bench started.
        unsafe { libc::kill(self.0 as i32, libc::SIGTERM) };
    }
}

/// Resident memory in KiB: all of it, and the heap (anonymous) part.
#[derive(Debug, Clone, Copy, Default)]
struct Rss {
    rss: u64,
    anon: u64,
}

impl std::fmt::Display for Rss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.1} MiB ({:.1} MiB heap)",
            self.rss as f64 / 1024.0,
            self.anon as f64 / 1024.0
        )
    }
}

struct RssSummary {
    median: Rss,
    max: Rss,
}

/// `pid`'s RSS read every second for `seconds`: the median and the maximum (by total RSS).
fn watch_rss(pid: u32, seconds: u64) -> RssSummary {
    let started = Instant::now();
    let mut samples = Vec::new();
    while started.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_secs(1));
        samples.push(Rss {
            rss: status_kib(pid, "VmRSS:"),
            anon: status_kib(pid, "RssAnon:"),
        });
    }
    samples.sort_by_key(|s| s.rss);
    RssSummary {
        median: samples[samples.len() / 2],
        max: samples[samples.len() - 1],
    }
}

fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// A metric of the daemon (summed over labels); 0 when it cannot be read.
fn metric(name: &str) -> f64 {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(HTTP_ADDRESS) else {
        return 0.0;
    };
    let _ = write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    );
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| series.split('{').next() == Some(name))
        .filter_map(|(_, value)| value.parse::<f64>().ok())
        .sum()
}
