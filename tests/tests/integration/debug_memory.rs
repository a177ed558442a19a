//! A binary with tens of megabytes of DWARF, sampled all over: naming its frames (inlined
//! functions and lines, from every compilation unit) holds the daemon's memory under a bound
//! however much of the DWARF the lookups reach, and the daemon gives that memory back once the
//! process is gone and its file idle.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{ensure, Result};
use scorch_tests::{query_folded, run_tool, status_kib, wait_for, work_dir, Daemon, Workload};

/// Compilation units, functions in each, and inlined calls in each function: about 30 MB of
/// `.debug_info` and `.debug_line` at -O0, where every call of the `always_inline` helper is
/// an inlined-subroutine entry and a run of line rows.
const UNITS: usize = 48;
const FUNCTIONS: usize = 60;
const INLINED_CALLS: usize = 80;
/// Struct types in each unit, and members in each: type entries every lookup in the unit
/// parses past, as a large C++ program's headers give each unit.
const TYPES: usize = 100;
const MEMBERS: usize = 80;

/// The least DWARF the binary must carry for the test to mean anything.
const LEAST_DWARF: u64 = 20 << 20;

/// What naming the binary's frames may add to the daemon's peak RSS, besides its own code
/// (see [`own_code_mib`]). Its parsed DWARF is bounded (`MAX_PARSED_DWARF`, 8 MiB of
/// sections), its unit index is a few hundred kilobytes, and the mapped sections' pages are
/// let go as lookups go on. Without the parse bound the lookups parse all of it.
const PEAK_BOUND_MIB: f64 = 24.0;
/// And what may remain once the process has exited and its file been idle past the cache's
/// window: allocator slack and the daemon's other growth over the same minute.
const AFTER_BOUND_MIB: f64 = 4.0;
/// Windows after which the symbol cache has let go of a file: past its idle window (six
/// windows unused, two once no process maps it).
const FILE_IDLE_WINDOWS: f64 = 8.0;
/// How long after the process exits its last samples are drained and named: two windows of
/// 1 s, and one more for the naming.
const LAST_WINDOWS: Duration = Duration::from_secs(3);

fn unit_source(unit: usize) -> Result<String> {
    let mut source = format!("volatile unsigned long sink_{unit};\n");
    for t in 0..TYPES {
        writeln!(source, "struct unit{unit}_type{t} {{")?;
        for m in 0..MEMBERS {
            writeln!(source, "    unsigned long field_number_{m}_of_type_{t};")?;
        }
        source.push_str("};\n");
    }
    writeln!(
        source,
        "static inline __attribute__((always_inline)) unsigned long mix{unit}(unsigned long x, \
         unsigned long i) {{\n    x ^= x << 7;\n    x += i * 0x9e3779b97f4a7c15UL;\n    \
         return x ^ (x >> 9);\n}}"
    )?;
    for f in 0..FUNCTIONS {
        writeln!(
            source,
            "__attribute__((noinline)) unsigned long unit{unit}_fn{f}(unsigned long n) {{\n    \
             unsigned long x = n;\n    for (unsigned long i = 0; i < n; i++) {{"
        )?;
        for call in 0..INLINED_CALLS {
            writeln!(source, "        x = mix{unit}(x, i + {call});")?;
        }
        source.push_str("    }\n    return x;\n}\n");
    }
    writeln!(
        source,
        "void unit{unit}_run(unsigned long n) {{\n    unsigned long x = 0;"
    )?;
    for f in 0..FUNCTIONS {
        writeln!(source, "    x += unit{unit}_fn{f}(n);")?;
    }
    writeln!(source, "    sink_{unit} = x;\n}}")?;
    Ok(source)
}

/// `main`: every unit's functions in turn, for the seconds its argument gives.
fn main_source() -> Result<String> {
    let mut source = String::from("#include <stdlib.h>\n#include <time.h>\n");
    for unit in 0..UNITS {
        writeln!(source, "void unit{unit}_run(unsigned long n);")?;
    }
    source.push_str(
        "int main(int argc, char **argv) {\n    double seconds = argc > 1 ? atof(argv[1]) : \
         10;\n    struct timespec start, now;\n    clock_gettime(CLOCK_MONOTONIC, &start);\n    \
         for (;;) {\n",
    );
    for unit in 0..UNITS {
        writeln!(source, "        unit{unit}_run(20);")?;
    }
    source.push_str(
        "        clock_gettime(CLOCK_MONOTONIC, &now);\n        if (now.tv_sec - start.tv_sec \
         + (now.tv_nsec - start.tv_nsec) / 1e9 > seconds) return 0;\n    }\n}\n",
    );
    Ok(source)
}

/// Writes and builds the binary, two compilers at a time.
fn big_dwarf_binary() -> Result<PathBuf> {
    let dir = work_dir().join("bigdwarf");
    std::fs::create_dir_all(&dir)?;
    let mut sources = vec![dir.join("main.c")];
    std::fs::write(&sources[0], main_source()?)?;
    for unit in 0..UNITS {
        let path = dir.join(format!("unit{unit}.c"));
        std::fs::write(&path, unit_source(unit)?)?;
        sources.push(path);
    }
    let objects: Vec<PathBuf> = sources.iter().map(|s| s.with_extension("o")).collect();
    let halves: Vec<Vec<(PathBuf, PathBuf)>> = (0..2)
        .map(|half| {
            sources
                .iter()
                .cloned()
                .zip(objects.iter().cloned())
                .skip(half)
                .step_by(2)
                .collect()
        })
        .collect();
    std::thread::scope(|scope| -> Result<()> {
        let jobs: Vec<_> = halves
            .iter()
            .map(|half| {
                scope.spawn(move || -> Result<()> {
                    for (source, object) in half {
                        compile_object(source, object)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for job in jobs {
            job.join().expect("a compiler thread panicked")?;
        }
        Ok(())
    })?;
    let binary = dir.join("bigdwarf");
    let mut link = Command::new("gcc");
    link.arg("-o").arg(&binary).args(&objects);
    run_tool(&mut link)?;
    Ok(binary)
}

fn compile_object(source: &Path, object: &Path) -> Result<()> {
    let mut gcc = Command::new("gcc");
    gcc.args(["-O0", "-g", "-fno-eliminate-unused-debug-types", "-c"])
        .arg(source)
        .arg("-o")
        .arg(object);
    run_tool(&mut gcc).map(|_| ())
}

/// Bytes of the binary's `.debug_*` sections.
fn dwarf_bytes(binary: &Path) -> Result<u64> {
    use object::{Object, ObjectSection};
    let data = std::fs::read(binary)?;
    let file = object::File::parse(&*data)?;
    Ok(file
        .sections()
        .filter(|s| s.name().is_ok_and(|n| n.starts_with(".debug_")))
        .map(|s| s.size())
        .sum())
}

/// The daemon's own code: the executable mappings of its binary, in MiB. The baseline may
/// hold few of those pages (this host's DAMON reclaim takes idle ones back) and naming
/// faults them in again, so the peak may exceed the baseline by that much more, whatever
/// the DWARF costs.
fn own_code_mib(pid: u32) -> Result<f64> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))?;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let mut bytes = 0u64;
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 6 || !fields[1].contains('x') || Path::new(fields[5]) != exe {
            continue;
        }
        if let Some((start, end)) = fields[0].split_once('-') {
            bytes += u64::from_str_radix(end, 16)? - u64::from_str_radix(start, 16)?;
        }
    }
    ensure!(
        bytes > 0,
        "no executable mapping of {} in the daemon",
        exe.display()
    );
    Ok(bytes as f64 / 1048576.0)
}

/// A `/proc/PID/status` field in MiB.
fn status_mib(pid: u32, field: &str) -> Result<f64> {
    Ok(status_kib(pid, field)? as f64 / 1024.0)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[test]
fn naming_a_binary_with_large_dwarf_holds_the_rss_and_gives_it_back() -> Result<()> {
    let binary = big_dwarf_binary()?;
    let dwarf = dwarf_bytes(&binary)?;
    ensure!(
        dwarf >= LEAST_DWARF,
        "{} has only {dwarf} bytes of DWARF",
        binary.display()
    );
    let store = work_dir().join("debug-memory-store");
    let _ = std::fs::remove_dir_all(&store);
    let daemon = Daemon::start(&store, &["--window", "1s", "--frequency", "99"])?;
    let (pid, address) = (daemon.pid(), daemon.address.clone());
    // Drained windows, not written ones: a window without samples is never written, and an
    // idle host gives many of those at 1 s.
    let windows = || scorch_tests::metric(&address, "scorch_drain_duration_seconds_count");
    // Settled: the host's processes named, their files cached and the idle ones let go.
    wait_for(
        "the daemon's first windows",
        Duration::from_secs(30),
        &|| Ok(windows()? >= 10.0),
    )?;
    // A short run first, forgotten before the measured one: what stays resident after it is
    // not this binary's DWARF but the daemon's own code that names DWARF (its text pages
    // fault in on first use) and the files of the other processes sampled meanwhile, among
    // them this test's own. Without it the peak counts those too, and they vary from run to
    // run by more than the parse's bound.
    let mut warm_up = Workload::start(&binary, &["3"])?;
    ensure!(warm_up.child.wait()?.success(), "bigdwarf failed");
    let warmed = windows()?;
    wait_for(
        "the warm-up's file to be let go",
        Duration::from_secs(30),
        &|| Ok(windows()? >= warmed + FILE_IDLE_WINDOWS),
    )?;
    // Read before the RSS readings, so that this request's own samples are named by then.
    let started = windows()?;
    let mut readings = Vec::new();
    for _ in 0..5 {
        readings.push(status_mib(pid, "VmRSS:")?);
        std::thread::sleep(Duration::from_millis(500));
    }
    let before = median(readings);
    // Resets VmHWM to the current RSS, so the peak read later is this test's.
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")?;
    let from = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)?
        .as_secs();

    // From here to the peak's reading this test stays off the CPU (it waits and sleeps, no
    // request to the daemon): its own samples would be named from its own binary, a debug
    // build with hundreds of megabytes of DWARF, and that parse would count in the peak.
    let mut workload = Workload::start(&binary, &["15"])?;
    ensure!(workload.child.wait()?.success(), "bigdwarf failed");
    std::thread::sleep(LAST_WINDOWS);
    let peak = status_mib(pid, "VmHWM:")?;
    let code = own_code_mib(pid)?;
    // Its last windows were named before the peak was read: the run's fifteen, and two more.
    let drained = windows()? - started;
    ensure!(
        drained >= 17.0,
        "{drained} windows drained from the process's start to the peak's reading, not 17"
    );
    let ended = Instant::now();

    // Back once the file has been idle past the cache's window (six windows).
    let mut after = status_mib(pid, "VmRSS:")?;
    while after > before + AFTER_BOUND_MIB && ended.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(500));
        after = status_mib(pid, "VmRSS:")?;
    }
    let back_after = ended.elapsed();
    let (status, _, stderr) = daemon.stop()?;
    ensure!(status.success(), "{stderr}");

    // The lookups reached the DWARF of most units: the inlined helper is named in them.
    let folded = query_folded(
        &store,
        &["--from", &from.to_string()],
        r#"{comm="bigdwarf"}"#,
    )?;
    let samples: u64 = folded
        .lines()
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum();
    let units_named = (0..UNITS)
        .filter(|unit| {
            folded.lines().any(|l| {
                l.contains(&format!(";unit{unit}_fn")) && l.contains(&format!(";mix{unit}"))
            })
        })
        .count();
    println!(
        "{:.1} MiB of DWARF in {UNITS} units, {samples} samples, the inlined helper named in \
         {units_named} units; daemon RSS {before:.1} MiB before, peak {peak:.1} MiB, \
         {after:.1} MiB {:.0} s after the process exited; its code {code:.1} MiB",
        dwarf as f64 / 1048576.0,
        back_after.as_secs_f64()
    );
    ensure!(
        units_named >= UNITS * 3 / 4,
        "the inlined helper is named in only {units_named} of {UNITS} units:\n{folded}"
    );
    ensure!(
        peak - before <= PEAK_BOUND_MIB + code,
        "naming the binary's frames took the daemon's RSS from {before:.1} to {peak:.1} MiB, \
         over {PEAK_BOUND_MIB} MiB and its {code:.1} MiB of code more"
    );
    ensure!(
        after - before <= AFTER_BOUND_MIB,
        "the daemon's RSS is {after:.1} MiB a minute after the process exited, {before:.1} \
         MiB before it"
    );
    Ok(())
}
