//! Unwind-table build time, measured against the target: libc's table in at most 20 ms.
//!
//! Each run builds a table from nothing, as the agent will when a process maps a library it
//! has not seen: the file is mapped again, the CFI parsed, the rows sorted and merged. The
//! file's pages stay in the page cache between runs (as they do for a library every process
//! maps). Median and max over the runs, and the table's rows and bytes; ld.so, libstdc++ and
//! libLLVM (bpftrace's: a 110 MB library with 5 MB of `.eh_frame`, the largest on these
//! machines) beside libc when they are installed.
//!
//! Run with `cargo xtask bench --only unwind` (or `cargo bench -p scorch --bench unwind`).

use std::{path::Path, time::Instant};

use scorch::{symbolize::elf::FileData, unwind::UnwindTable};

const RUNS: usize = 20;
const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";
/// libc's build time target, in ms.
const TARGET_MS: f64 = 20.0;

fn main() {
    let libraries = [
        LIBC,
        "/lib64/ld-linux-x86-64.so.2",
        "/lib/x86_64-linux-gnu/libstdc++.so.6",
        "/lib/x86_64-linux-gnu/libLLVM-14.so.1",
    ];
    for path in libraries {
        let path = Path::new(path);
        if !path.exists() {
            assert_ne!(path, Path::new(LIBC), "{LIBC} is missing");
            println!("unwind: {}: skipped, not installed", path.display());
            continue;
        }
        let mut times = Vec::with_capacity(RUNS);
        let mut last = None;
        for _ in 0..RUNS {
            let start = Instant::now();
            let data = FileData::map(path).expect("mapping the library");
            let table = UnwindTable::build(path, data.bytes()).expect("building its table");
            times.push(start.elapsed().as_secs_f64() * 1e3);
            last = Some(std::hint::black_box(table));
        }
        let table = last.expect("at least one run");
        // The first build also pays for the process's first touch of the file and the heap.
        let first = times[0];
        times.sort_by(f64::total_cmp);
        let (median, max) = (times[RUNS / 2], times[RUNS - 1]);
        let stats = table.stats();
        let verdict = if path != Path::new(LIBC) {
            String::new()
        } else if max <= TARGET_MS {
            format!(" (meets the target: at most {TARGET_MS} ms)")
        } else {
            format!(" (MISSES the target: at most {TARGET_MS} ms)")
        };
        println!(
            "unwind: {}: {} rows ({} end-of-function markers, {} before merging), {} bytes, \
             {} FDEs, {} unsupported CFA rows; build median {median:.2} ms, max {max:.2} ms \
             over {RUNS} runs (the first {first:.2} ms){verdict}",
            path.display(),
            stats.rows,
            stats.end_markers,
            stats.rows_before_merging,
            table.size_bytes(),
            stats.eh_frame_fdes + stats.debug_frame_fdes,
            stats.unsupported_cfa,
        );
    }
}
