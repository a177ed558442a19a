//! The UI's views over a day of windows: the timeline (per-window totals, no stack read) and a
//! diff of two one-hour ranges (two merges and the differential flame graph, icicle and
//! classic), as the HTTP routes run them.
//!
//! `cargo bench -p scorch --bench views [-- DIR]` writes 24 h of 10 s windows (8,640, from
//! `store::fixtures::synthetic_window`: 50 processes of 20 stacks each per window, replaced
//! hourly) into DIR (default `target/bench/views-store`, reused when it already holds them),
//! then times each query 7 times in a fresh read-only open and prints the median and max.
//! `cargo xtask bench --only views` (and the daemon bench) run it.

use std::{
    path::PathBuf,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use scorch::{
    profile::{diff, encode::svg::Orientation},
    serve::http::{MAX_DRAWN_STACKS, MAX_QUERY_STACKS},
    store::{
        fixtures::synthetic_window, QueryLimits, Retention, SampleKind, Store, TimeRange,
        TimelineRequest,
    },
};

const WINDOW_SECONDS: u64 = 10;
const WINDOWS: u64 = 24 * 360;
const PROCESSES: u32 = 50;
const STACKS: u32 = 20;
const RUNS: usize = 7;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let dir = args.first().map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench/views-store"),
        PathBuf::from,
    );
    // Windows end at a fixed, whole hour, so a reused store answers the same queries.
    let end = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_secs()
        / 3600
        * 3600;
    let start = end - WINDOWS * WINDOW_SECONDS;
    let retention = Retention {
        max_age: Duration::from_secs(30 * 24 * 3600),
        max_bytes: 8 << 30,
    };
    let existing = Store::open_read_only(&dir)
        .ok()
        .and_then(|s| s.windows().ok())
        .map_or(0, |w| w.0);
    let first = UNIX_EPOCH + Duration::from_secs(start);
    let fresh = existing != WINDOWS
        || Store::open_read_only(&dir)
            .ok()
            .and_then(|s| s.windows().ok())
            .and_then(|w| w.1)
            != Some(first);
    if fresh {
        let _ = std::fs::remove_dir_all(&dir);
        let mut store = Store::open(&dir, retention).expect("creating the store");
        let started = Instant::now();
        for i in 0..WINDOWS {
            let window = synthetic_window(
                start + i * WINDOW_SECONDS,
                WINDOW_SECONDS,
                PROCESSES,
                STACKS,
            );
            store.write_window(&window).expect("writing a window");
        }
        store.checkpoint().expect("checkpoint");
        eprintln!(
            "views: wrote {WINDOWS} windows in {:.1?} ({} MiB)",
            started.elapsed(),
            store.disk_bytes() >> 20
        );
    }
    let at = |s: u64| UNIX_EPOCH + Duration::from_secs(s);
    let day = TimeRange {
        from: at(start),
        to: at(end),
    };
    let time = |what: &mut dyn FnMut() -> usize| -> (f64, f64, usize) {
        let mut times = Vec::new();
        let mut size = 0;
        for _ in 0..RUNS {
            let started = Instant::now();
            size = what();
            times.push(started.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        (times[RUNS / 2], times[RUNS - 1], size)
    };
    let verdict = |ok: bool| if ok { "ok" } else { "MISSED" };

    let (median, max, series) = time(&mut || {
        let store = Store::open_read_only(&dir).expect("opening the store");
        let request = TimelineRequest {
            range: day,
            step_ns: 360 * 1_000_000_000, // 240 points, the UI's default
            group_by: Some("comm".into()),
            limit: 10,
            kind: SampleKind::Cpu,
        };
        let timeline = store
            .timeline(
                &request,
                &|_| true,
                QueryLimits::new(MAX_QUERY_STACKS, Duration::from_secs(20)),
            )
            .expect("the timeline");
        assert!(timeline.series.iter().any(|s| s.total > 0.0));
        timeline.series.len()
    });
    println!(
        "views: timeline of 24 h ({WINDOWS} windows of {WINDOW_SECONDS} s, {PROCESSES} processes \
         x {STACKS} stacks each, group_by=comm, 240 steps, {series} series): median {median:.1} ms \
         of {RUNS}, max {max:.1} ms ({}: at most 50 ms)",
        verdict(median <= 50.0)
    );

    let hour = |h: u64| TimeRange {
        from: at(end - h * 3600),
        to: at(end - (h - 1) * 3600),
    };
    // The store opened fresh and the two hours merged, as the server does per request: its
    // stack cap, and the flame graph of the heaviest stacks.
    let two_hours = || {
        let store = Store::open_read_only(&dir).expect("opening the store");
        let limits = || QueryLimits::new(MAX_QUERY_STACKS, Duration::from_secs(20));
        let base = store
            .query_within(hour(2), SampleKind::Cpu, &|_| true, limits())
            .expect("merging an hour");
        let target = store
            .query_within(hour(1), SampleKind::Cpu, &|_| true, limits())
            .expect("merging an hour");
        (base, target)
    };
    // Both orientations: the icicle is the default, the classic was the only one before it;
    // the drawing differs only in where each row goes, so the two should cost the same.
    for orientation in [Orientation::Icicle, Orientation::Classic] {
        let (median, max, bytes) = time(&mut || {
            let (base, target) = two_hours();
            diff::svg(&base, &target, "bench", Some(MAX_DRAWN_STACKS), orientation)
                .expect("drawing")
                .len()
        });
        println!(
            "views: diff of two 1 h ranges (360 windows each, merged, differential flame graph SVG \
             of {} KiB, {}): median {median:.0} ms of {RUNS}, max {max:.0} ms ({}: at most 300 ms)",
            bytes >> 10,
            format!("{orientation:?}").to_lowercase(),
            verdict(median <= 300.0)
        );
    }
    let (median, max, _) = time(&mut || {
        let (base, target) = two_hours();
        diff::pprof(&base, &target).len()
    });
    println!(
        "views: diff of two 1 h ranges as pprof (-diff_base): median {median:.0} ms of {RUNS}, \
         max {max:.0} ms ({}: at most 300 ms)",
        verdict(median <= 300.0)
    );
}
