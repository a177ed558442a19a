//! What real hosts run, against `perf record -g` recorded side by side: Node.js with its perf
//! map under the default unwinder, and a build host's stream of short-lived processes, with
//! their binaries on disk or deleted as soon as they start.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use scorch_tests::*;

/// `perf record -g` of `target` (`-p PID` or `-a`) at `hz` for `seconds`, into `output`.
fn start_perf(target: &[&str], hz: u32, seconds: u32, output: &Path) -> Result<Child> {
    let child = Command::new("perf")
        .args(["record", "-g", "-F", &hz.to_string()])
        .args(target)
        .arg("-o")
        .arg(output)
        .args(["--", "sleep", &seconds.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting perf record")?;
    // perf opens its events within a few hundred milliseconds; both tools then cover the
    // same seconds.
    std::thread::sleep(Duration::from_millis(700));
    Ok(child)
}

/// perf's samples of threads named `comm`: each a list of frame names, leaf first.
fn perf_stacks(perf_data: &Path, comm: &str) -> Result<Vec<Vec<String>>> {
    let output = Command::new("perf")
        .args(["script", "-F", "comm,ip,sym", "-i"])
        .arg(perf_data)
        .output()
        .context("running perf script")?;
    ensure!(output.status.success(), "perf script failed");
    let text = String::from_utf8_lossy(&output.stdout);
    let mut stacks = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let mut lines = block.lines();
        if lines.next().map(str::trim) != Some(comm) {
            continue;
        }
        let frames = lines
            .filter_map(|line| {
                let (_, name) = line.trim().split_once(char::is_whitespace)?;
                let name = name.trim();
                let name = name.strip_suffix(" (inlined)").unwrap_or(name);
                Some(name.rsplit_once("+0x").map_or(name, |(n, _)| n).to_string())
            })
            .collect();
        stacks.push(frames);
    }
    Ok(stacks)
}

/// The share of perf's and of scorch's samples of `comm` that satisfy `wanted`, and scorch's
/// sample count.
fn shares(
    samples: &[NamedSample],
    perf: &[Vec<String>],
    comm: &str,
    wanted: impl Fn(&[String]) -> bool,
) -> (f64, f64, i64) {
    let ours: Vec<&NamedSample> = samples.iter().filter(|s| s.comm == comm).collect();
    let total: i64 = ours.iter().map(|s| s.count).sum();
    let with: i64 = ours
        .iter()
        .filter(|s| wanted(&s.frames))
        .map(|s| s.count)
        .sum();
    let perf_with = perf.iter().filter(|f| wanted(f)).count();
    (
        with as f64 / total.max(1) as f64,
        perf_with as f64 / perf.len().max(1) as f64,
        total,
    )
}

fn show(samples: &[NamedSample], comm: &str) -> String {
    let mut ours: Vec<&NamedSample> = samples.iter().filter(|s| s.comm == comm).collect();
    ours.sort_by_key(|s| std::cmp::Reverse(s.count));
    ours.iter()
        .take(8)
        .map(|s| format!("{} {}", s.count, s.frames.join(" <- ")))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A JavaScript function of tests/workloads/calltree.js, as V8's perf map names it:
/// `JS:*main /path/calltree.js:23:14` (`*` optimised, `~` interpreted).
fn is_js(frame: &str, function: &str) -> bool {
    frame.contains("calltree.js")
        && frame.split_whitespace().next().is_some_and(|kind| {
            kind.ends_with(&format!("*{function}")) || kind.ends_with(&format!("~{function}"))
        })
}

/// Node.js's builtins are generated code inside the node binary's text, without FDEs but with
/// frame pointers: with V8's walk off (`--node off`: the JIT's frames named from the perf
/// map, as before it), the native walk steps through them by frame pointer and the
/// JavaScript callers stay on the stack, as in perf's frame-pointer walk.
#[test]
fn node_with_a_perf_map_keeps_its_javascript_callers_like_perf() -> Result<()> {
    let node = Path::new("/usr/bin/node");
    ensure!(
        node.exists(),
        "/usr/bin/node is missing (cargo xtask setup installs nodejs)"
    );
    let script = workload_source("calltree.js");
    let script = script.to_str().context("workload path is not UTF-8")?;
    // --perf-basic-prof also turns on V8's log, which goes to `isolate-*-v8.log` in the
    // working directory unless told otherwise.
    let v8_log = work_dir().join("node-v8.log");
    let logfile = format!("--logfile={}", v8_log.display());
    let workload = Workload::start(
        node,
        &[
            "--perf-basic-prof",
            "--no-logfile-per-isolate",
            &logfile,
            script,
            "30",
        ],
    )?;
    // Past start-up, into main.
    std::thread::sleep(Duration::from_millis(1500));
    let pid = workload.pid();
    let perf_data = work_dir().join("node.perf.data");
    let path = work_dir().join("node.pb.gz");
    let mut perf = start_perf(&["-p", &pid.to_string()], 199, 8, &perf_data)?;
    let output = record_pid_to(pid, 7, &path, &["--node", "off"])?;
    let perf_ok = perf.wait()?.success();
    drop(workload);
    ensure!(perf_ok, "perf record failed");
    let summary = parse_record_output(&output)?.summary;
    println!("{summary}");
    let samples = named_samples(&read_pprof(&path)?);
    // perf names JIT frames from the map when it reads its data.
    let perf = perf_stacks(&perf_data, "node");
    let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    let perf = perf?;
    let reach_main = |frames: &[String]| frames.iter().any(|f| is_js(f, "main"));
    let (share, perf_share, total) = shares(&samples, &perf, "node", reach_main);
    println!("node's main thread samples reaching JS main: scorch {share:.3} of {total}, perf {perf_share:.3} of {}", perf.len());
    ensure!(
        total > 300,
        "only {total} samples of node's main thread: {summary}"
    );
    ensure!(
        share >= 0.95 && share >= perf_share - 0.03,
        "{share:.3} of node's samples reach main (perf {perf_share:.3}): {summary}\n{}",
        show(&samples, "node")
    );
    Ok(())
}

/// Runs `program 20` over and over for `seconds` (about 20 ms of work each, as a build host
/// runs compilers and scripts), each run from a fresh copy when `delete` is set, unlinked right
/// after it starts (a test binary, a compiler's temporary). Returns the number of runs.
fn run_short_lived(program: &Path, seconds: u64, delete: bool) -> Result<u32> {
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut runs = 0;
    while Instant::now() < end {
        let binary: PathBuf = if delete {
            // Same name, so the same comm, in a directory of its own.
            let dir = work_dir().join(format!("deleted-{runs}"));
            std::fs::create_dir_all(&dir)?;
            let copy = dir.join("shortlived");
            std::fs::copy(program, &copy)?;
            copy
        } else {
            program.to_path_buf()
        };
        // `spawn` returns once the child has exec'd: the binary is mapped, and may go.
        let mut child = Command::new(&binary).arg("20").spawn()?;
        if delete {
            std::fs::remove_file(&binary)?;
            let _ = std::fs::remove_dir(binary.parent().context("a copy has a directory")?);
        }
        ensure!(child.wait()?.success(), "{} failed", binary.display());
        runs += 1;
    }
    Ok(runs)
}

/// A loop of short-lived processes recorded system-wide by scorch and by `perf record -g -a`
/// side by side, at 49 Hz over 10 s: the shares of their samples that name the program's own
/// function.
fn record_short_lived(program: &Path, delete: bool) -> Result<(f64, f64, i64, String)> {
    let tag = if delete { "deleted" } else { "kept" };
    let path = work_dir().join(format!("shortlived-{tag}.pb.gz"));
    let perf_data = work_dir().join(format!("shortlived-{tag}.perf.data"));
    // A host always has long-lived processes on the same libc, whose table walks teach the
    // daemon the frames below glibc's start code (see below). A CI machine may have none on
    // CPU during these 12 s, so one is run here, under another name, from before the
    // recording (`spawn` returns once it has exec'd) into its first seconds, so the
    // recording's start-up scan reads it. It used to go wholly unnamed: it exits seconds before
    // this test reaps it, and its empty maps as a zombie replaced those of its life (fixed:
    // see `ProcessMaps::read`).
    let long_lived = work_dir().join("longlived");
    std::fs::copy(program, &long_lived)?;
    let mut long = Command::new(&long_lived).arg("5000").spawn()?;
    let recording = BackgroundRecording::start(&[
        "record",
        "-F",
        "49",
        "--duration",
        "12s",
        "-o",
        path.to_str().context("work directory is not UTF-8")?,
    ])?;
    let mut perf = start_perf(&["-a"], 49, 11, &perf_data)?;
    let runs = run_short_lived(program, 10, delete)?;
    ensure!(long.wait()?.success(), "{} failed", long_lived.display());
    let perf_ok = perf.wait()?.success();
    let output = recording.finish()?;
    ensure!(perf_ok, "perf record failed");
    let summary = parse_record_output(&output)?.summary;
    println!("{runs} runs ({tag}): {summary}");
    let samples = named_samples(&read_pprof(&path)?);
    let perf = perf_stacks(&perf_data, "shortlived")?;
    let own = |frames: &[String]| frames.iter().any(|f| f == "short_spin");
    let (share, perf_share, total) = shares(&samples, &perf, "shortlived", own);
    println!(
        "samples naming short_spin ({tag}): scorch {share:.3} of {total}, perf {perf_share:.3} of {}",
        perf.len()
    );
    ensure!(
        total > 150,
        "only {total} samples of shortlived over {runs} runs: {summary}"
    );
    // The first samples of each process are walked by frame pointers alone, which end in
    // glibc's start code (built without them); a table walk goes on to `_start`. Both must
    // end the same, or a flame graph splits the program into two towers.
    let bottoms = |bottom: &str| -> i64 {
        samples
            .iter()
            .filter(|s| s.comm == "shortlived" && s.frames.iter().any(|f| f == "main"))
            .filter(|s| s.frames.last().is_some_and(|f| f == bottom))
            .map(|s| s.count)
            .sum()
    };
    let (stopped, whole) = (bottoms("__libc_start_call_main"), bottoms("_start"));
    println!(
        "samples through main ({tag}): {whole} end at _start, {stopped} in glibc's start code"
    );
    // A few cannot be completed (no table walk through that place of libc seen yet, or the
    // process's maps not read in time): at most 1%.
    ensure!(
        whole > 0 && stopped * 100 <= whole,
        "{stopped} samples through main end at __libc_start_call_main, {whole} at _start \
         ({summary}):\n{}",
        show(&samples, "shortlived")
    );
    Ok((share, perf_share, total, show(&samples, "shortlived")))
}

/// Short-lived processes keep their names: their maps are captured at exec, with the mapped
/// files held open, and kept until their window is symbolised. With the binary deleted, perf
/// can no longer name it afterwards; scorch must still match perf's share with it on disk.
#[test]
fn short_lived_processes_are_named_as_often_as_perf_names_them() -> Result<()> {
    let program = build_workload("shortlived", &["-O2", "-fno-omit-frame-pointer", "-g"])?;
    let (kept, perf_kept, _, stacks) = record_short_lived(&program, false)?;
    ensure!(
        (kept - perf_kept).abs() <= 0.10,
        "scorch names short_spin in {kept:.3} of the samples, perf in {perf_kept:.3}:\n{stacks}"
    );
    let (deleted, _, _, stacks) = record_short_lived(&program, true)?;
    ensure!(
        deleted >= perf_kept - 0.10,
        "with the binary deleted, scorch names short_spin in {deleted:.3} of the samples, \
         perf (binary on disk) in {perf_kept:.3}:\n{stacks}"
    );
    Ok(())
}
