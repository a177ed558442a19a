//! Support for scorch's integration tests: build the C workloads, run `scorch` and `perf`, and
//! read what they wrote. The tests themselves are in `tests/integration/`.

use std::{
    collections::HashMap,
    io::Read,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::OnceLock,
};

use anyhow::{bail, ensure, Context, Result};
use prost::Message;
use scorch::pprof;

/// The scorch binary under test: `SCORCH_BIN`, which `cargo xtask test` sets to the release
/// build it just made.
pub fn scorch_bin() -> PathBuf {
    match std::env::var_os("SCORCH_BIN") {
        Some(path) => PathBuf::from(path),
        None => panic!("SCORCH_BIN is not set: run the integration tests with `cargo xtask test`"),
    }
}

/// A scratch directory for this test run, under the workspace's target directory.
pub fn work_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target/integration")
            .join(std::process::id().to_string());
        std::fs::create_dir_all(&dir).expect("creating the test work directory");
        // Readable by the unprivileged user some tests run scorch as.
        let _ = Command::new("chmod")
            .args(["-R", "a+rwx"])
            .arg(&dir)
            .status();
        dir
    })
}

/// Compiles `tests/workloads/<name>.c` with gcc and `flags`; returns the executable.
pub fn build_workload(name: &str, flags: &[&str]) -> Result<PathBuf> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("workloads")
        .join(format!("{name}.c"));
    let output = work_dir().join(name);
    let result = Command::new("gcc")
        .args(flags)
        .arg("-o")
        .arg(&output)
        .arg(&source)
        .arg("-lpthread")
        .output()
        .context("running gcc (cargo xtask setup installs it)")?;
    ensure!(
        result.status.success(),
        "gcc {}: {}",
        source.display(),
        String::from_utf8_lossy(&result.stderr)
    );
    Ok(output)
}

/// A running workload, killed when dropped so a failing test leaves nothing behind.
pub struct Workload {
    pub child: Child,
}

impl Workload {
    pub fn start(program: &Path, args: &[&str]) -> Result<Workload> {
        let child = Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        Ok(Workload { child })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs scorch with `args` and returns its output, failing with its stderr when it fails.
pub fn run_scorch(args: &[&str]) -> Result<Output> {
    let output = Command::new(scorch_bin())
        .args(args)
        .output()
        .context("running scorch")?;
    if !output.status.success() {
        bail!(
            "scorch {} failed ({}):\n{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(output)
}

/// Reads a gzipped pprof file.
pub fn read_pprof(path: &Path) -> Result<pprof::Profile> {
    let gz = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut raw)
        .with_context(|| format!("{} is not gzip", path.display()))?;
    pprof::Profile::decode(&raw[..]).with_context(|| format!("{} is not a pprof", path.display()))
}

/// One sample of a decoded pprof, with names resolved.
#[derive(Debug, Clone)]
pub struct NamedSample {
    /// Function names, leaf first; an unnamed location is `0x<address>`.
    pub frames: Vec<String>,
    /// True per frame when its mapping is the kernel's.
    pub kernel: Vec<bool>,
    pub count: i64,
    pub pid: i64,
    pub comm: String,
}

/// Flattens a pprof into named samples.
pub fn named_samples(profile: &pprof::Profile) -> Vec<NamedSample> {
    let strings = &profile.string_table;
    let functions: HashMap<u64, &str> = profile
        .function
        .iter()
        .map(|f| (f.id, strings[f.name as usize].as_str()))
        .collect();
    let kernel_mappings: Vec<u64> = profile
        .mapping
        .iter()
        .filter(|m| strings[m.filename as usize] == "[kernel.kallsyms]")
        .map(|m| m.id)
        .collect();
    let locations: HashMap<u64, (String, bool)> = profile
        .location
        .iter()
        .map(|l| {
            let name = l
                .line
                .last()
                .and_then(|line| functions.get(&line.function_id))
                .map_or_else(|| format!("{:#x}", l.address), |n| (*n).to_owned());
            (l.id, (name, kernel_mappings.contains(&l.mapping_id)))
        })
        .collect();
    profile
        .sample
        .iter()
        .map(|s| {
            let label = |key: &str| s.label.iter().find(|l| strings[l.key as usize] == key);
            NamedSample {
                frames: s
                    .location_id
                    .iter()
                    .map(|id| locations[id].0.clone())
                    .collect(),
                kernel: s.location_id.iter().map(|id| locations[id].1).collect(),
                count: s.value[0],
                pid: label("pid").map_or(-1, |l| l.num),
                comm: label("comm").map_or_else(String::new, |l| strings[l.str as usize].clone()),
            }
        })
        .collect()
}

/// Share of samples (0..1) whose leaf frame is each of `names`, among samples of `pid`.
pub fn leaf_shares(samples: &[NamedSample], pid: i64, names: &[&str]) -> Vec<f64> {
    let of_pid: Vec<&NamedSample> = samples.iter().filter(|s| s.pid == pid).collect();
    let total: i64 = of_pid.iter().map(|s| s.count).sum();
    names
        .iter()
        .map(|name| {
            let hits: i64 = of_pid
                .iter()
                .filter(|s| s.frames.first().map(String::as_str) == Some(name))
                .map(|s| s.count)
                .sum();
            hits as f64 / total.max(1) as f64
        })
        .collect()
}

/// Leaf function shares (0..1) in a `perf record -g` file, from `perf script`.
pub fn perf_leaf_shares(perf_data: &Path, names: &[&str]) -> Result<(Vec<f64>, u64)> {
    let output = Command::new("perf")
        .args(["script", "-F", "ip,sym", "-i"])
        .arg(perf_data)
        .output()
        .context("running perf script")?;
    ensure!(
        output.status.success(),
        "perf script: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout);
    // One block per sample, blank-line separated; the first line of a block is the leaf.
    let mut counts = vec![0u64; names.len()];
    let mut total = 0u64;
    for block in text.split("\n\n") {
        let Some(leaf) = block.lines().map(str::trim).find(|l| !l.is_empty()) else {
            continue;
        };
        total += 1;
        let symbol = leaf.split_whitespace().nth(1).unwrap_or("");
        let symbol = symbol.split('+').next().unwrap_or(symbol);
        if let Some(i) = names.iter().position(|n| *n == symbol) {
            counts[i] += 1;
        }
    }
    ensure!(total > 0, "perf script printed no samples");
    Ok((
        counts.iter().map(|&c| c as f64 / total as f64).collect(),
        total,
    ))
}

/// Runs `go tool pprof` with `args` on `file` and returns its stdout.
pub fn go_pprof(args: &[&str], file: &Path) -> Result<String> {
    let output = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        .env("HOME", work_dir())
        .output()
        .context("running go tool pprof (cargo xtask setup installs golang-go)")?;
    ensure!(
        output.status.success(),
        "go tool pprof {args:?} {}: {}",
        file.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The `N samples` figure and the per-window figures scorch printed.
#[derive(Debug)]
pub struct RecordReport {
    pub samples: u64,
    pub seconds: f64,
    pub windows: Vec<u64>,
    pub summary: String,
}

/// Parses scorch record's summary (stdout) and window log lines (stderr).
pub fn parse_record_output(output: &Output) -> Result<RecordReport> {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("scorch: "))
        .context("no summary line")?
        .to_owned();
    let words: Vec<&str> = summary.split_whitespace().collect();
    let samples = words
        .get(1)
        .and_then(|w| w.parse().ok())
        .with_context(|| format!("no sample count in {summary:?}"))?;
    let seconds = words
        .iter()
        .position(|&w| w == "in")
        .and_then(|i| words.get(i + 1))
        .and_then(|w| w.trim_end_matches('s').parse().ok())
        .with_context(|| format!("no duration in {summary:?}"))?;
    let windows = stderr
        .lines()
        .filter_map(|l| l.split_once("window ").map(|(_, rest)| rest))
        .filter_map(|rest| rest.split_once(": ").map(|(_, rest)| rest))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect();
    Ok(RecordReport {
        samples,
        seconds,
        windows,
        summary,
    })
}
