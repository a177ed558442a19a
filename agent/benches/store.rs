//! The store's size against the pprofs it replaces.
//!
//! `cargo bench -p scorch --bench store -- SOURCE_STORE OUTPUT_STORE WINDOWS` reads the windows
//! a real daemon wrote to SOURCE_STORE (`cargo xtask bench --only daemon` runs one on a busy
//! machine), then writes WINDOWS windows into a fresh OUTPUT_STORE by cycling through them, 10 s
//! apart and ending now (360 = one hour). It prints the store's bytes on disk next to the sum of
//! the same windows' gzipped pprofs, as the daemon's encoder would write them.

use std::{
    path::PathBuf,
    time::{Duration, Instant, SystemTime},
};

use scorch::{
    export,
    profile::encode,
    store::{Retention, Store},
};

fn main() {
    // `cargo bench` passes `--bench`; the operands are what is left.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let [source, output, windows] = args.as_slice() else {
        println!("store: skipped, needs SOURCE_STORE OUTPUT_STORE WINDOWS (cargo xtask bench --only daemon)");
        return;
    };
    let windows: usize = windows.parse().expect("WINDOWS is a number");
    let source = Store::open_read_only(&PathBuf::from(source)).expect("opening the source store");
    let real: Vec<_> = source
        .window_ranges()
        .expect("listing windows")
        .into_iter()
        .map(|range| source.query(range, &|_| true).expect("reading a window"))
        .filter(|profile| !profile.samples.is_empty())
        .collect();
    assert!(!real.is_empty(), "the source store has no windows");

    let output = PathBuf::from(output);
    let _ = std::fs::remove_dir_all(&output);
    let mut store = Store::open(&output, Retention::default()).expect("creating the output store");
    let now = SystemTime::now();
    let mut pprof_bytes = 0usize;
    let mut series_pprof_bytes = 0usize;
    let mut write_time = Duration::ZERO;
    for i in 0..windows {
        let mut profile = real[i % real.len()].clone();
        profile.start = now - Duration::from_secs(10 * (windows - i) as u64);
        profile.duration = Duration::from_secs(10);
        pprof_bytes += encode::pprof::encode(&profile).len();
        series_pprof_bytes += export::split_by_series(&profile)
            .iter()
            .map(|series| encode::pprof::encode_samples(&profile, &series.samples).len())
            .sum::<usize>();
        let started = Instant::now();
        store.write_window(&profile).expect("writing a window");
        write_time += started.elapsed();
    }
    store.checkpoint().expect("checkpointing");
    let store_bytes = store.disk_bytes();
    let samples: u64 = real.iter().map(|p| p.total_samples()).sum::<u64>() / real.len() as u64;
    let rows: usize = real.iter().map(|p| p.samples.len()).sum::<usize>() / real.len();
    println!(
        "store: {windows} windows (cycling {} real windows of ~{samples} samples and ~{rows} \
         series-stacks each): store {:.2} MiB on disk; the daemon's gzipped pprofs, one per \
         series per window, {:.2} MiB: ratio 1/{:.1} (target at most 1/5); one gzipped pprof \
         per window with every series in it, {:.2} MiB: ratio 1/{:.1}; mean write {:.2} \
         ms/window",
        real.len(),
        store_bytes as f64 / (1 << 20) as f64,
        series_pprof_bytes as f64 / (1 << 20) as f64,
        series_pprof_bytes as f64 / store_bytes as f64,
        pprof_bytes as f64 / (1 << 20) as f64,
        pprof_bytes as f64 / store_bytes as f64,
        write_time.as_secs_f64() * 1e3 / windows as f64,
    );
}
