//! User symbolisation, measured against the targets the README publishes:
//!
//! - warm: 10,000 distinct addresses across 20 shared libraries loaded into this process,
//!   resolved through the full path (maps -> file offset -> ELF address -> DWARF/symbols) with
//!   the cache already populated; median of 5 passes;
//! - cold: a binary with a lot of DWARF (`SCORCH_BIG_DWARF_BINARY`, built by `cargo xtask
//!   bench`) mapped into this process: how much 2,000 lookups add to peak RSS, and where RSS
//!   lands once its cache entry is evicted. RSS and peak come from /proc/self/status.
//!
//! - c-dwarf: the heap that lookups in a C library's DWARF hold (libc's separate debug file
//!   when libc6-dbg is installed), with a parse per unit, as scorch does, and through one
//!   addr2line context for the whole file; each in a fresh process.
//!
//! Run with `cargo bench -p scorch --bench symbolize` (`cargo xtask bench` runs it with a big
//! binary).

use std::{
    collections::BTreeSet, ffi::CString, os::unix::ffi::OsStrExt, path::Path, time::Instant,
};

use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};
use scorch::process::maps::ProcessMaps;
use scorch::symbolize::user::{SymbolizeMode, UserSymbolizer};

const LIBRARIES: usize = 20;
const ADDRESSES_PER_LIBRARY: usize = 500;

fn main() {
    // The cold case runs in a fresh process of its own, so nothing the warm case loaded or
    // freed is in its RSS figures.
    if let Some(path) = std::env::var_os("SCORCH_BENCH_COLD_ONLY") {
        cold(Path::new(&path));
        return;
    }
    if let Some(mode) = std::env::var_os("SCORCH_BENCH_C_DWARF_ONLY") {
        c_dwarf(mode == "whole-file");
        return;
    }
    warm();
    for mode in ["by-unit", "whole-file"] {
        let exe = std::env::current_exe().expect("finding this benchmark's executable");
        let status = std::process::Command::new(exe)
            .env("SCORCH_BENCH_C_DWARF_ONLY", mode)
            .status()
            .expect("running the c-dwarf case");
        assert!(status.success(), "c-dwarf case failed: {status}");
    }
    match std::env::var_os("SCORCH_BIG_DWARF_BINARY") {
        Some(path) => {
            let exe = std::env::current_exe().expect("finding this benchmark's executable");
            let status = std::process::Command::new(exe)
                .env("SCORCH_BENCH_COLD_ONLY", path)
                .status()
                .expect("running the cold case");
            assert!(status.success(), "cold case failed: {status}");
        }
        None => {
            println!("cold: skipped, set SCORCH_BIG_DWARF_BINARY to a binary with 100+ MB of DWARF")
        }
    }
}

/// Text symbols of an ELF file as file offsets (what a mapping translates from).
fn text_symbol_offsets(path: &Path) -> Vec<u64> {
    // Mapped, not read: a heap copy of a 100 MB binary would sit in the RSS being measured.
    let Ok(handle) = std::fs::File::open(path) else {
        return Vec::new();
    };
    // SAFETY: read-only private map of a file nothing writes to during the bench.
    let Ok(data) = (unsafe { memmap2::Mmap::map(&handle) }) else {
        return Vec::new();
    };
    let Ok(file) = object::File::parse(&*data) else {
        return Vec::new();
    };
    let segments: Vec<(u64, u64, u64)> = file
        .segments()
        .map(|s| (s.address(), s.file_range().0, s.file_range().1))
        .collect();
    let mut offsets = BTreeSet::new();
    for symbol in file.symbols().chain(file.dynamic_symbols()) {
        if symbol.kind() != SymbolKind::Text || symbol.address() == 0 || symbol.size() < 2 {
            continue;
        }
        let address = symbol.address() + 1;
        if let Some((vaddr, offset, _)) = segments
            .iter()
            .find(|(vaddr, _, size)| address >= *vaddr && address < vaddr + size)
        {
            offsets.insert(address - vaddr + offset);
        }
    }
    offsets.into_iter().collect()
}

/// Absolute addresses in this process for file offsets of `path`, through /proc/self/maps.
fn absolute(maps: &ProcessMaps, path: &Path, offsets: &[u64]) -> Vec<u64> {
    let path = path.to_string_lossy();
    offsets
        .iter()
        .filter_map(|&offset| {
            maps.entries()
                .iter()
                .find(|e| {
                    e.file_path() == path
                        && offset >= e.offset
                        && offset < e.offset + (e.end - e.start)
                })
                .map(|e| e.start + offset - e.offset)
        })
        .collect()
}

fn warm() {
    let mut candidates: Vec<_> = std::fs::read_dir("/usr/lib/x86_64-linux-gnu")
        .expect("listing /usr/lib/x86_64-linux-gnu")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().contains(".so.") && !p.is_symlink())
        // Libraries that take over the process when loaded (sanitizer runtimes, malloc
        // debuggers) are no workload to symbolise.
        .filter(|p| {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            ![
                "libasan",
                "libtsan",
                "liblsan",
                "libubsan",
                "libhwasan",
                "libmemusage",
                "libpcprofile",
                "libSegFault",
                "libc_malloc_debug",
                "libpthread",
                "libc.so",
            ]
            .iter()
            .any(|bad| name.starts_with(bad))
        })
        .collect();
    candidates.sort();
    let mut addresses = Vec::new();
    let mut libraries = Vec::new();
    for path in candidates {
        if libraries.len() == LIBRARIES {
            break;
        }
        let offsets = text_symbol_offsets(&path);
        if offsets.len() < ADDRESSES_PER_LIBRARY {
            continue;
        }
        let c_path = CString::new(path.as_os_str().as_bytes()).expect("path without NUL");
        // SAFETY: loading a system library; its constructors run, as in any program using it.
        let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
        if handle.is_null() {
            continue;
        }
        let maps = ProcessMaps::read(std::process::id()).expect("reading own maps");
        let step = offsets.len() / ADDRESSES_PER_LIBRARY;
        let picked: Vec<u64> = offsets
            .iter()
            .step_by(step)
            .take(ADDRESSES_PER_LIBRARY)
            .copied()
            .collect();
        let found = absolute(&maps, &path, &picked);
        if found.len() == ADDRESSES_PER_LIBRARY {
            addresses.extend(found);
            libraries.push(path);
        }
    }
    assert_eq!(
        libraries.len(),
        LIBRARIES,
        "not enough libraries with {ADDRESSES_PER_LIBRARY} functions"
    );
    let pid = std::process::id();
    let mut symbolizer = UserSymbolizer::new(SymbolizeMode::Local, 512 << 20);
    symbolizer.capture([pid]);
    let named = addresses
        .iter()
        .filter(|&&a| symbolizer.symbolize(pid, a, false).frames.is_ok())
        .count();
    let mut times = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        for &address in &addresses {
            std::hint::black_box(symbolizer.symbolize(pid, address, false));
        }
        times.push(start.elapsed());
    }
    times.sort();
    println!(
        "warm: {} distinct addresses across {} binaries ({named} named): median {:.1} ms (min {:.1}, max {:.1}); target 50 ms",
        addresses.len(),
        libraries.len(),
        times[2].as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3,
        times[4].as_secs_f64() * 1e3,
    );
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("reading /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("field in /proc/self/status")
}

fn cold(path: &Path) {
    let file = std::fs::File::open(path).expect("opening the big binary");
    // Map it into this process so /proc/self/maps shows it, like a running program's binary.
    // SAFETY: read-only private map of a file nothing writes to during the bench.
    let map = unsafe { memmap2::Mmap::map(&file) }.expect("mapping the big binary");
    let offsets = text_symbol_offsets(path);
    let step = (offsets.len() / 2000).max(1);
    let picked: Vec<u64> = offsets.iter().step_by(step).take(2000).copied().collect();
    let pid = std::process::id();
    let maps = ProcessMaps::read(pid).expect("reading own maps");
    let addresses = absolute(&maps, path, &picked);
    let dwarf_mib = dwarf_bytes(path) as f64 / (1 << 20) as f64;

    let mut symbolizer = UserSymbolizer::new(SymbolizeMode::Local, 1 << 30);
    symbolizer.capture([pid]);
    // Run the lookup path once on another file (this benchmark's own executable, which has
    // line tables), as an agent that has been running for a window has: the first lookup
    // faults in the symboliser's own code and the allocator's first arenas, which are no
    // cache memory and would otherwise be counted as not returned after eviction.
    let own = std::env::current_exe().expect("finding this benchmark's executable");
    let own_offsets = text_symbol_offsets(&own);
    for &address in absolute(&maps, &own, &own_offsets).iter().step_by(64) {
        let _ = symbolizer.symbolize(pid, address, false);
    }
    // Then evict everything (the warm-up's file, and libc's debug info, which capturing
    // opened) so the figures below are the big binary's alone.
    symbolizer.set_cache_budget(0);
    symbolizer.enforce_budget();
    symbolizer.set_cache_budget(1 << 30);
    // Reset the peak (VmHWM) so it measures only what follows.
    std::fs::write("/proc/self/clear_refs", "5").expect("resetting VmHWM (needs Linux 4.0+)");
    let before = status_kib("VmRSS:");
    let (anon_before, file_before) = (status_kib("RssAnon:"), status_kib("RssFile:"));
    let start = Instant::now();
    let mut with_lines = 0;
    for &address in &addresses {
        if let Ok(frames) = symbolizer.symbolize(pid, address, false).frames {
            with_lines += usize::from(frames.iter().any(|f| f.line > 0));
        }
    }
    let elapsed = start.elapsed();
    let peak = status_kib("VmHWM:");
    let after = status_kib("VmRSS:");
    let (anon, file) = (status_kib("RssAnon:"), status_kib("RssFile:"));
    symbolizer.set_cache_budget(0);
    symbolizer.enforce_budget();
    let evicted = status_kib("VmRSS:");
    let (anon_evicted, file_evicted) = (status_kib("RssAnon:"), status_kib("RssFile:"));
    drop(map);
    println!(
        "cold: {} ({dwarf_mib:.0} MiB of DWARF): {} addresses, {with_lines} with file:line, in {:.0} ms; \
         RSS {:.1} MiB before, peak +{:.1} MiB (target at most 64), {:.1} MiB after lookups, \
         {:.1} MiB after eviction ({:+.1}% of before; target within 10%); heap (RssAnon) / \
         mapped files (RssFile) in MiB: before {:.1} / {:.1}, after lookups {:.1} / {:.1}, \
         after eviction {:.1} / {:.1}",
        path.display(),
        addresses.len(),
        elapsed.as_secs_f64() * 1e3,
        before as f64 / 1024.0,
        peak.saturating_sub(before) as f64 / 1024.0,
        after as f64 / 1024.0,
        evicted as f64 / 1024.0,
        100.0 * (evicted as f64 - before as f64) / before as f64,
        anon_before as f64 / 1024.0,
        file_before as f64 / 1024.0,
        anon as f64 / 1024.0,
        file as f64 / 1024.0,
        anon_evicted as f64 / 1024.0,
        file_evicted as f64 / 1024.0,
    );
}

/// Bytes allocated on the heap, mmapped blocks included.
fn heap_bytes() -> u64 {
    // SAFETY: mallinfo2 only reads the allocator's statistics.
    let info = unsafe { libc::mallinfo2() };
    (info.uordblks + info.hblkhd) as u64
}

/// 500 lookups spread over libc's separate debug file, and the heap they leave held.
fn c_dwarf(whole_file: bool) {
    let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    let build_id = std::fs::read(libc)
        .ok()
        .and_then(|data| {
            let file = object::File::parse(&*data).ok()?;
            Some(file.build_id().ok()??.to_vec())
        })
        .map(|id| id.iter().map(|b| format!("{b:02x}")).collect::<String>());
    let Some(id) = build_id else {
        println!("c-dwarf: skipped, libc has no build id");
        return;
    };
    let debug = format!("/usr/lib/debug/.build-id/{}/{}.debug", &id[..2], &id[2..]);
    let debug = Path::new(&debug);
    if !debug.exists() {
        println!(
            "c-dwarf: skipped, no {} (install libc6-dbg)",
            debug.display()
        );
        return;
    }
    let mut addresses = Vec::new();
    if let Ok(data) = std::fs::read(debug) {
        if let Ok(file) = object::File::parse(&*data) {
            addresses = file
                .symbols()
                .filter(|s| s.kind() == SymbolKind::Text && s.size() > 1)
                .map(|s| s.address() + 1)
                .collect();
        }
    }
    addresses.sort_unstable();
    addresses.dedup();
    let step = (addresses.len() / 500).max(1);
    let elf = scorch::symbolize::elf::ElfFile::open(debug).expect("opening libc's debug file");
    if whole_file {
        elf.use_whole_file_dwarf();
    }
    let before = heap_bytes();
    let mut with_lines = 0;
    let mut lookups = 0;
    for &address in addresses.iter().step_by(step).take(500) {
        lookups += 1;
        if let Ok(frames) = elf.resolve(scorch::binary::address::ElfAddress(address)) {
            with_lines += usize::from(frames.iter().any(|f| f.line > 0));
        }
    }
    let held = heap_bytes().saturating_sub(before);
    println!(
        "c-dwarf: {} ({:.1} MiB of DWARF), {lookups} lookups ({with_lines} with file:line) \
         through {}: heap held {:.1} MiB",
        debug.display(),
        dwarf_bytes(debug) as f64 / (1 << 20) as f64,
        if whole_file {
            "one addr2line context for the whole file"
        } else {
            "a parse per unit (scorch)"
        },
        held as f64 / (1 << 20) as f64,
    );
}

fn dwarf_bytes(path: &Path) -> u64 {
    use object::ObjectSection;
    let handle = std::fs::File::open(path).expect("opening the big binary");
    // SAFETY: read-only private map of a file nothing writes to during the bench.
    let data = unsafe { memmap2::Mmap::map(&handle) }.expect("mapping the big binary");
    let file = object::File::parse(&*data).expect("parsing the big binary");
    file.sections()
        .filter(|s| s.name().is_ok_and(|n| n.starts_with(".debug_")))
        .map(|s| s.size())
        .sum()
}
