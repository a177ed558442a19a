//! Unwind-table build time and heap, measured against the target: libc's table in at
//! most 20 ms.
//!
//! Each run builds a table from nothing, as the agent will when a process maps a library it
//! has not seen: the file is mapped again, the CFI parsed, the rows sorted and merged. The
//! file's pages stay in the page cache between runs (as they do for a library every process
//! maps). Median and max over the runs, and the table's rows and bytes; ld.so, libstdc++ and
//! libLLVM (bpftrace's: a 110 MB library with 5 MB of `.eh_frame`) beside libc when they are
//! installed, then the libraries of the `rustc` on the PATH, the largest a build host maps
//! (its `librustc_driver` and `libLLVM`, each over a million rows), with fewer runs.
//!
//! The heap is the most the build held at once, the table itself included, counted by this
//! bench's allocator: the daemon's peak while a build host's tables are built.
//!
//! Run with `cargo xtask bench --only unwind` (or `cargo bench -p scorch --bench unwind`).

use std::{
    alloc::{GlobalAlloc, Layout, System},
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicIsize, Ordering},
    time::Instant,
};

use scorch::{symbolize::elf::FileData, unwind::UnwindTable};

const RUNS: usize = 20;
/// Runs for the toolchain's libraries, each build of which takes far longer than libc's.
const LARGE_RUNS: usize = 5;
const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";
/// libc's build time target, in ms.
const TARGET_MS: f64 = 20.0;

/// Counts the heap held, and the most held since [`Counting::reset`]. The bench has one
/// thread, so one count is the build's.
struct Counting;

static HELD: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

#[global_allocator]
static ALLOCATOR: Counting = Counting;

impl Counting {
    fn count(delta: isize) {
        let held = HELD.fetch_add(delta, Ordering::Relaxed) + delta;
        PEAK.fetch_max(held, Ordering::Relaxed);
    }

    /// From now on, the peak is counted from what is held now.
    fn reset() {
        PEAK.store(HELD.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// The most held since [`Counting::reset`], above what was held then.
    fn peak_since(held_then: isize) -> usize {
        (PEAK.load(Ordering::Relaxed) - held_then).max(0) as usize
    }
}

// SAFETY: every call goes to the system allocator unchanged; counting only reads sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as the caller's contract for `alloc`.
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            Counting::count(layout.size() as isize);
        }
        pointer
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as the caller's contract for `alloc_zeroed`.
        let pointer = unsafe { System.alloc_zeroed(layout) };
        if !pointer.is_null() {
            Counting::count(layout.size() as isize);
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: as the caller's contract for `dealloc`.
        unsafe { System.dealloc(pointer, layout) };
        Counting::count(-(layout.size() as isize));
    }

    /// Counted as the change of size: glibc moves a block above its mmap threshold with
    /// `mremap`, never holding both.
    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as the caller's contract for `realloc`.
        let moved = unsafe { System.realloc(pointer, layout, new_size) };
        if !moved.is_null() {
            Counting::count(new_size as isize - layout.size() as isize);
        }
        moved
    }
}

/// `librustc_driver` and `libLLVM` of the `rustc` on the PATH; none when it cannot say where
/// its sysroot is.
fn toolchain_libraries() -> Vec<PathBuf> {
    let Ok(output) = Command::new("rustc").args(["--print", "sysroot"]).output() else {
        return Vec::new();
    };
    let lib = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()).join("lib");
    let Ok(entries) = std::fs::read_dir(&lib) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            name.starts_with("librustc_driver-") || name.starts_with("libLLVM.so")
        })
        .collect();
    found.sort();
    found
}

fn main() {
    let libraries = [
        LIBC,
        "/lib64/ld-linux-x86-64.so.2",
        "/lib/x86_64-linux-gnu/libstdc++.so.6",
        "/lib/x86_64-linux-gnu/libLLVM-14.so.1",
    ]
    .map(|path| (PathBuf::from(path), RUNS));
    let toolchain = toolchain_libraries()
        .into_iter()
        .map(|path| (path, LARGE_RUNS));
    for (path, runs) in libraries.into_iter().chain(toolchain) {
        let path = path.as_path();
        if !path.exists() {
            assert_ne!(path, Path::new(LIBC), "{LIBC} is missing");
            println!("unwind: {}: skipped, not installed", path.display());
            continue;
        }
        let mut times = Vec::with_capacity(runs);
        let mut peak = 0;
        let mut last = None;
        for _ in 0..runs {
            // The table of the run before is dropped first, as the loader's is once in its pool.
            drop(last.take());
            let held = HELD.load(Ordering::Relaxed);
            Counting::reset();
            let start = Instant::now();
            let data = FileData::map(path).expect("mapping the library");
            let table = UnwindTable::build(path, data.bytes()).expect("building its table");
            times.push(start.elapsed().as_secs_f64() * 1e3);
            peak = peak.max(Counting::peak_since(held));
            last = Some(std::hint::black_box(table));
        }
        let table = last.expect("at least one run");
        // The first build also pays for the process's first touch of the file and the heap.
        let first = times[0];
        times.sort_by(f64::total_cmp);
        let (median, max) = (times[runs / 2], times[runs - 1]);
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
             over {runs} runs (the first {first:.2} ms){verdict}; heap at most {:.2} MB while \
             building, {:.1} times the table",
            path.display(),
            stats.rows,
            stats.end_markers,
            stats.rows_before_merging,
            table.size_bytes(),
            stats.eh_frame_fdes + stats.debug_frame_fdes,
            stats.unsupported_cfa,
            peak as f64 / 1e6,
            peak as f64 / table.size_bytes().max(1) as f64,
        );
    }
}
