//! What the kernel and the daemon's own read take for one process seen for the first time,
//! the part of a capture no bookkeeping can remove: the churn bench (`cargo xtask bench --only
//! churn`) sets it beside the budget its target leaves a capture.
//!
//! [`GROUP`] sleeping `python3` (the churn's own program) per figure, each process read once,
//! as the daemon meets a new one, so no figure reads a `/proc/PID` another warmed:
//!
//! - `/proc/PID/maps` opened and closed: the least any capture does;
//! - `ProcessMaps::read`: the daemon's read of a process's code mappings (`PROCMAP_QUERY` where
//!   the kernel has it, else the text).
//!
//! Run with `cargo bench -p scorch --bench capture`; prints `capture:` lines.

use std::{
    process::{Child, Command},
    time::{Duration, Instant},
};

use scorch::process::maps::ProcessMaps;

/// Processes per figure.
const GROUP: usize = 80;

struct Sleepers(Vec<Child>);

impl Drop for Sleepers {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn main() {
    let mut sleepers = Sleepers(Vec::new());
    for _ in 0..2 * GROUP {
        sleepers.0.push(
            Command::new("/usr/bin/python3")
                .args(["-c", "import time; time.sleep(120)"])
                .spawn()
                .expect("starts /usr/bin/python3"),
        );
    }
    // Until each has mapped its libraries and sleeps.
    std::thread::sleep(Duration::from_secs(3));
    let pids: Vec<u32> = sleepers.0.iter().map(Child::id).collect();
    let (first, second) = pids.split_at(GROUP);

    let open_close = time_each(first, |pid| {
        let path = format!("/proc/{pid}/maps");
        drop(std::fs::File::open(&path).unwrap_or_else(|e| panic!("opening {path}: {e}")));
    });
    let mut mappings = Vec::new();
    let read = time_each(second, |pid| {
        let maps = ProcessMaps::read(pid).unwrap_or_else(|e| panic!("reading {pid}'s maps: {e}"));
        mappings.push(maps.entries().len() as f64);
    });
    println!(
        "capture: /proc/PID/maps opened and closed: median {:.1} us ({GROUP} processes)",
        median(open_close)
    );
    println!(
        "capture: ProcessMaps::read: median {:.1} us, {:.0} code mappings ({GROUP} processes)",
        median(read),
        median(mappings)
    );
}

/// Microseconds `work` took for each pid.
fn time_each(pids: &[u32], mut work: impl FnMut(u32)) -> Vec<f64> {
    pids.iter()
        .map(|&pid| {
            let started = Instant::now();
            work(pid);
            started.elapsed().as_secs_f64() * 1e6
        })
        .collect()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
