//! Naming the pcs of a stripped Go binary from its `.gopclntab`, beside naming the same pcs of
//! the same program built with DWARF.
//!
//! `tests/workloads/goservice.go` (net/http, encoding/json, gzip, sha256, regexp, templates:
//! several megabytes and thousands of functions) is built twice by the host's `go`: plainly
//! (DWARF, compressed as Go writes it, and `.symtab`) and with `-ldflags=-s -w` (only
//! `.gopclntab` names it). `-s -w` drops sections after the code and moves no function; the
//! bench checks that `.text` lies at the same addresses in both, so one set of pcs serves both.
//! 10,000 pcs are taken from the plain build's `.symtab`: every function in turn, at an offset
//! that varies from one pass over the functions to the next.
//!
//! Each measurement is a fresh process (this executable again, with `SCORCH_BENCH_GOSYM_CHILD`):
//! `ElfFile::open`, a first pass naming all 10,000 pcs (cold: nothing parsed yet), a second
//! pass (warm), and the growth of the process's RSS (`VmRSS`, and its peak `VmHWM` reset
//! before the open) from /proc/self/status. Five runs of each build, the order alternating,
//! medians with [min-max]. The files are in the page cache throughout (they were just built
//! and are read on every run), as a running program's binary is: "cold" is the parse, not the
//! disk.
//!
//! The path is checked, not assumed: the stripped file must say `has_dwarf() == false` and
//! `has_go_table() == true`, the plain one `has_dwarf() == true`; at least 99% of the pcs must
//! get a name from each; and the outermost frame's function must be the same name in both for
//! at least 99% of the pcs (the differences are printed).
//!
//! Run with `cargo bench -p scorch --bench gosym` (`cargo xtask bench --only go` runs it). It
//! prints a markdown table on standard output and its progress on standard error.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};
use scorch::{binary::address::ElfAddress, symbolize::elf::ElfFile};

const PCS: usize = 10_000;
const RUNS: usize = 5;
/// Shares of the pcs that must be named, and named alike by both builds.
const MIN_NAMED: f64 = 0.99;
const MIN_AGREED: f64 = 0.99;

fn main() {
    if let Some(path) = std::env::var_os("SCORCH_BENCH_GOSYM_CHILD") {
        child(Path::new(&path));
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the agent crate is in the workspace");
    let dir = std::env::var_os("SCORCH_BENCH_GOSYM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/bench/gosym"));
    std::fs::create_dir_all(&dir).expect("creating the bench's directory");
    let source = root.join("tests/workloads/goservice.go");
    let plain = go_build(&source, &dir, "goservice-plain", &[]);
    let stripped = go_build(&source, &dir, "goservice-stripped", &["-ldflags=-s -w"]);
    let (plain_text, stripped_text) = (text_section(&plain), text_section(&stripped));
    assert_eq!(
        plain_text, stripped_text,
        ".text (address, size) differs between the plain and the stripped build: \
         the pcs of one are not the pcs of the other"
    );
    let (pcs, functions) = spread_pcs(&plain);
    let pcs_path = dir.join("pcs.txt");
    let listing: String = pcs.iter().map(|pc| format!("{pc:x}\n")).collect();
    std::fs::write(&pcs_path, listing).expect("writing the pcs");

    let builds = [
        ("DWARF (plain build)", &plain),
        ("`.gopclntab` (`-s -w`)", &stripped),
    ];
    let mut runs: Vec<Vec<ChildRun>> = vec![Vec::new(), Vec::new()];
    let mut names: Vec<Vec<String>> = vec![Vec::new(), Vec::new()];
    for run in 0..RUNS {
        let order = if run % 2 == 0 { [0, 1] } else { [1, 0] };
        for index in order {
            let (label, path) = builds[index];
            let names_path = dir.join(format!("names-{index}.txt"));
            let result = run_child(path, &pcs_path, &names_path);
            eprintln!(
                "gosym: run {} {label}: open {:.1} ms, cold {:.1} ms, warm {:.1} ms, \
                 RSS +{:.1} MiB (peak +{:.1}), {} of {} named",
                run + 1,
                result.open_ms,
                result.cold_ms,
                result.warm_ms,
                result.rss_growth_mib,
                result.peak_growth_mib,
                result.named,
                result.pcs,
            );
            names[index] = std::fs::read_to_string(&names_path)
                .expect("reading the names a child wrote")
                .lines()
                .map(str::to_owned)
                .collect();
            runs[index].push(result);
        }
    }

    // The path measured is the one claimed.
    let [dwarf_runs, go_runs] = &runs[..] else {
        unreachable!("two builds")
    };
    assert!(
        dwarf_runs.iter().all(|r| r.has_dwarf),
        "the plain build has no DWARF scorch reads"
    );
    assert!(
        go_runs.iter().all(|r| !r.has_dwarf && r.has_go_table),
        "the stripped build is not named from its .gopclntab alone"
    );
    for (index, (label, _)) in builds.iter().enumerate() {
        let named = runs[index][0].named as f64 / PCS as f64;
        assert!(
            named >= MIN_NAMED,
            "{label}: {:.2}% of the pcs named, under {:.0}%",
            named * 100.0,
            MIN_NAMED * 100.0
        );
    }
    let disagreements: Vec<(u64, &str, &str)> = pcs
        .iter()
        .zip(names[0].iter().zip(&names[1]))
        .filter(|(_, (dwarf, go))| dwarf != go)
        .map(|(&pc, (dwarf, go))| (pc, dwarf.as_str(), go.as_str()))
        .collect();
    let agreed = 1.0 - disagreements.len() as f64 / PCS as f64;

    println!(
        "### Naming {PCS} pcs of `tests/workloads/goservice.go` ({functions} functions), \
         built by {}\n",
        go_version()
    );
    println!(
        "Fresh process per run, {RUNS} runs per build in alternating order: medians [min-max]. \
         Cold = the first pass after `ElfFile::open` (nothing parsed yet; the file in the page \
         cache); warm = the second pass. RSS growth from `VmRSS` before the open to after the \
         warm pass (heap: `RssAnon`; the rest is mapped file pages, of the binary and of the \
         DWARF sections inflated to temporary files); peak from `VmHWM`.\n"
    );
    println!(
        "| named through | file, MB | open, ms | cold pass, ms | open + cold, ms | warm pass, ms | \
         warm, ns/pc | RSS growth, MiB | of which heap, MiB | heap after open, MiB | peak growth, \
         MiB | named |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (index, (label, path)) in builds.iter().enumerate() {
        let rows = &runs[index];
        let column = |f: fn(&ChildRun) -> f64| rows.iter().map(f).collect::<Vec<_>>();
        let megabytes = std::fs::metadata(path).map_or(0.0, |m| m.len() as f64 / 1e6);
        println!(
            "| {label} | {megabytes:.1} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} of {PCS} |",
            spread(&column(|r| r.open_ms), 2),
            spread(&column(|r| r.cold_ms), 1),
            spread(&column(|r| r.open_ms + r.cold_ms), 1),
            spread(&column(|r| r.warm_ms), 1),
            spread(&column(|r| r.warm_ms * 1e6 / r.pcs as f64), 0),
            spread(&column(|r| r.rss_growth_mib), 1),
            spread(&column(|r| r.anon_growth_mib), 1),
            spread(&column(|r| r.anon_open_mib), 1),
            spread(&column(|r| r.peak_growth_mib), 1),
            rows[0].named,
        );
    }
    println!(
        "\nBoth builds' `.text` at {:#x}, {} bytes: the same pcs in each. The outermost frame's \
         function is the same name from DWARF and from `.gopclntab` for {} of {PCS} pcs \
         ({:.2}%).",
        plain_text.0,
        plain_text.1,
        PCS - disagreements.len(),
        agreed * 100.0
    );
    // Go's linker (1.18+) writes names into `.gopclntab` with whatever stands between their
    // first `[` and last `]` cut to `[...]`: a generic instantiation's type arguments, and by
    // the same rule an array length in `type..eq.[5]T`. DWARF keeps the full name: the same
    // function, as each table names it.
    let (generic, other): (Vec<_>, Vec<_>) = disagreements
        .iter()
        .partition(|(_, dwarf, go)| as_in_pclntab(dwarf) == *go);
    if !disagreements.is_empty() {
        println!(
            "\nOf the {} that differ, {} are the same function, whose bracketed part (a \
             generic's type arguments, an array length in `type..eq.[N]T`) Go's linker writes \
             into `.gopclntab` as `[...]`; {} are other differences.",
            disagreements.len(),
            generic.len(),
            other.len()
        );
        // Every other difference, then six of the expected kind, spread over the functions.
        let expected = kinds(&generic);
        let step = expected.len().div_ceil(6).max(1);
        let examples: Vec<(u64, usize, &str, &str)> = kinds(&other)
            .into_iter()
            .chain(expected.into_iter().step_by(step))
            .collect();
        println!("\n| pc (first of its kind) | pcs | DWARF says | `.gopclntab` says |");
        println!("|---|---|---|---|");
        for (pc, count, dwarf, go) in examples.iter().take(20) {
            println!("| {pc:#x} | {count} | `{dwarf}` | `{go}` |");
        }
        if examples.len() > 20 {
            println!("| | | ... {} more pairs | |", examples.len() - 20);
        }
    }
    assert!(
        agreed >= MIN_AGREED,
        "DWARF and .gopclntab agree on {:.2}% of the pcs, under {:.0}%",
        agreed * 100.0,
        MIN_AGREED * 100.0
    );
}

/// The distinct (DWARF name, `.gopclntab` name) pairs among `pairs`, each with its first pc
/// and its count, in pc order.
fn kinds<'a>(pairs: &[&(u64, &'a str, &'a str)]) -> Vec<(u64, usize, &'a str, &'a str)> {
    let mut kinds: BTreeMap<(&str, &str), (usize, u64)> = BTreeMap::new();
    for &&(pc, dwarf, go) in pairs {
        kinds.entry((dwarf, go)).or_insert((0, pc)).0 += 1;
    }
    let mut kinds: Vec<(u64, usize, &str, &str)> = kinds
        .into_iter()
        .map(|((dwarf, go), (count, pc))| (pc, count, dwarf, go))
        .collect();
    kinds.sort_unstable();
    kinds
}

/// A name as Go's linker writes it into `.gopclntab`: from its first `[` to its last `]`
/// replaced by `[...]`.
fn as_in_pclntab(name: &str) -> String {
    match (name.find('['), name.rfind(']')) {
        (Some(open), Some(close)) if open < close => {
            format!("{}[...]{}", &name[..open], &name[close + 1..])
        }
        _ => name.to_owned(),
    }
}

/// `go build` of `source` into `dir/name` with a build cache in `dir`, so the bench neither
/// needs nor fills the user's.
fn go_build(source: &Path, dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let output = dir.join(name);
    let status = Command::new("go")
        .arg("build")
        .arg("-o")
        .arg(&output)
        .args(flags)
        .arg(source)
        .env("GOCACHE", dir.join("go-cache"))
        .env("GOFLAGS", "")
        .env("CGO_ENABLED", "0")
        .status()
        .expect("running `go build` (install golang-go)");
    assert!(status.success(), "go build {name}: {status}");
    output
}

fn go_version() -> String {
    Command::new("go")
        .arg("version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// The (address, size) of a file's `.text`.
fn text_section(path: &Path) -> (u64, u64) {
    let data = std::fs::read(path).expect("reading a Go build");
    let file = object::File::parse(&*data).expect("parsing a Go build");
    let text = file
        .section_by_name(".text")
        .expect("a Go build without .text");
    (text.address(), text.size())
}

/// [`PCS`] pcs over the functions of the plain build's `.symtab`, and how many functions
/// there are: function `i % n` at an offset that changes with each pass over them (a stride
/// of 41 bytes a pass, wrapped within the function), so that no two passes ask the same pc.
fn spread_pcs(plain: &Path) -> (Vec<u64>, usize) {
    let data = std::fs::read(plain).expect("reading the plain build");
    let file = object::File::parse(&*data).expect("parsing the plain build");
    let mut functions: Vec<(u64, u64)> = file
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0)
        .map(|s| (s.address(), s.size()))
        .collect();
    functions.sort_unstable();
    functions.dedup_by_key(|f| f.0);
    assert!(
        functions.len() >= 1000,
        "{} functions in {}: not the service-sized binary the bench wants",
        functions.len(),
        plain.display()
    );
    let pcs = (0..PCS)
        .map(|i| {
            let (start, size) = functions[i % functions.len()];
            let pass = (i / functions.len()) as u64;
            start + (1 + pass * 41) % size
        })
        .collect();
    (pcs, functions.len())
}

/// What one child process measured.
struct ChildRun {
    open_ms: f64,
    cold_ms: f64,
    warm_ms: f64,
    rss_growth_mib: f64,
    peak_growth_mib: f64,
    /// The part of the RSS growth that is heap (`RssAnon`); the rest is mapped file pages.
    anon_growth_mib: f64,
    /// The heap that `ElfFile::open` alone took.
    anon_open_mib: f64,
    pcs: usize,
    named: usize,
    has_dwarf: bool,
    has_go_table: bool,
}

fn run_child(binary: &Path, pcs: &Path, names: &Path) -> ChildRun {
    let exe = std::env::current_exe().expect("finding this benchmark's executable");
    let output = Command::new(exe)
        .env("SCORCH_BENCH_GOSYM_CHILD", binary)
        .env("SCORCH_BENCH_GOSYM_PCS", pcs)
        .env("SCORCH_BENCH_GOSYM_NAMES", names)
        .output()
        .expect("running a child");
    assert!(
        output.status.success(),
        "child for {} failed: {}\n{}",
        binary.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let fields: BTreeMap<&str, f64> = stdout
        .split_whitespace()
        .filter_map(|pair| {
            let (key, value) = pair.split_once('=')?;
            Some((key, value.parse().ok()?))
        })
        .collect();
    let field = |name: &str| -> f64 {
        *fields
            .get(name)
            .unwrap_or_else(|| panic!("no {name} in the child's output: {stdout}"))
    };
    ChildRun {
        open_ms: field("open_ms"),
        cold_ms: field("cold_ms"),
        warm_ms: field("warm_ms"),
        rss_growth_mib: (field("rss_after_kib") - field("rss_before_kib")) / 1024.0,
        peak_growth_mib: (field("hwm_kib") - field("rss_before_kib")) / 1024.0,
        anon_growth_mib: (field("anon_after_kib") - field("anon_before_kib")) / 1024.0,
        anon_open_mib: (field("anon_open_kib") - field("anon_before_kib")) / 1024.0,
        pcs: field("pcs") as usize,
        named: field("named") as usize,
        has_dwarf: field("has_dwarf") == 1.0,
        has_go_table: field("has_go_table") == 1.0,
    }
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("reading /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("field in /proc/self/status")
}

/// One measurement, in this fresh process: open, a cold pass, a warm pass, RSS around them;
/// then, with the figures taken, the outermost names for the parent to compare.
fn child(binary: &Path) {
    let pcs_path = std::env::var_os("SCORCH_BENCH_GOSYM_PCS").expect("SCORCH_BENCH_GOSYM_PCS");
    let names_path =
        std::env::var_os("SCORCH_BENCH_GOSYM_NAMES").expect("SCORCH_BENCH_GOSYM_NAMES");
    let pcs: Vec<u64> = std::fs::read_to_string(&pcs_path)
        .expect("reading the pcs")
        .lines()
        .map(|l| u64::from_str_radix(l, 16).expect("a pc in hex"))
        .collect();
    // Reset the peak (VmHWM) so it measures only what follows.
    std::fs::write("/proc/self/clear_refs", "5").expect("resetting VmHWM (needs Linux 4.0+)");
    let rss_before = status_kib("VmRSS:");
    let anon_before = status_kib("RssAnon:");

    let start = Instant::now();
    let file = ElfFile::open(binary).expect("opening the Go build");
    let open = start.elapsed();
    let anon_open = status_kib("RssAnon:");
    let start = Instant::now();
    let mut named = 0;
    for &pc in &pcs {
        named += usize::from(std::hint::black_box(file.resolve(ElfAddress(pc))).is_ok());
    }
    let cold = start.elapsed();
    let start = Instant::now();
    for &pc in &pcs {
        let _ = std::hint::black_box(file.resolve(ElfAddress(pc)));
    }
    let warm = start.elapsed();
    let rss_after = status_kib("VmRSS:");
    let hwm = status_kib("VmHWM:");
    let anon_after = status_kib("RssAnon:");

    // Outermost frame: `resolve` lists the inlined functions first, their caller last.
    let names: String = pcs
        .iter()
        .map(|&pc| match file.resolve(ElfAddress(pc)) {
            Ok(frames) => {
                let outer = frames.last().map_or("", |f| f.function.as_str());
                format!("{outer}\n")
            }
            Err(miss) => format!("<{miss:?}>\n"),
        })
        .collect();
    std::fs::write(&names_path, names).expect("writing the names");
    println!(
        "open_ms={} cold_ms={} warm_ms={} rss_before_kib={rss_before} rss_after_kib={rss_after} \
         hwm_kib={hwm} anon_before_kib={anon_before} anon_open_kib={anon_open} anon_after_kib={anon_after} pcs={} named={named} has_dwarf={} has_go_table={} go_errors={}",
        open.as_secs_f64() * 1e3,
        cold.as_secs_f64() * 1e3,
        warm.as_secs_f64() * 1e3,
        pcs.len(),
        u8::from(file.has_dwarf()),
        u8::from(file.has_go_table()),
        file.go_errors(),
    );
}

/// `median [min-max]` with `digits` decimals.
fn spread(values: &[f64], digits: usize) -> String {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    format!(
        "{:.digits$} [{:.digits$}-{:.digits$}]",
        sorted[sorted.len() / 2],
        sorted[0],
        sorted[sorted.len() - 1]
    )
}
