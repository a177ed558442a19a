//! Java frames of HotSpot JVMs, walked in BPF through the code cache and named from the JVM's
//! memory, against JFR (the JDK's own profiler) as the reference.
//!
//! `CallTree.java` spends known shares of its CPU time in four methods (parse 1, matmul 3,
//! reduce 2, digest 1 parts of 7), set by the thread's clock. Each JVM runs it under JFR's
//! `jdk.ExecutionSample` while scorch records it: each method's share within 3 points of
//! JFR's, the stacks whole from the leaf through `CallTree.run` and the JVM's `call_helper`
//! to the thread's start, and names as JFR gives them (class, method, file, line). The JVM
//! runs as it is tuned by default (both JIT compilers), with `-Xint` (the interpreter only)
//! and with `-XX:TieredStopAtLevel=1` (C1 only).

use std::{collections::HashMap, path::PathBuf, process::Command};

use anyhow::{ensure, Result};
use scorch_tests::{debian::root_filesystem, run_tool, work_dir, DetailedSample, KillOnDrop};

/// The call tree's methods whose shares are compared.
const METHODS: [&str; 4] = [
    "CallTree.parse",
    "CallTree.matmul",
    "CallTree.reduce",
    "CallTree.digest",
];

/// A JDK: its `java` and `jfr`, on this host or in a Debian root.
struct Jdk {
    /// `/usr/lib/jvm/...` (inside `root` when there is one).
    home: &'static str,
    root: Option<PathBuf>,
    /// The root's `/proc`, mounted while the JDK is in use.
    _proc: Option<ProcMount>,
}

/// `/proc` mounted in a root: the `java` launcher finds its own home (and its `libjli.so`)
/// through `/proc/self/exe`. Unmounted on drop when this mounted it.
struct ProcMount(Option<PathBuf>);

impl ProcMount {
    fn in_root(root: &std::path::Path) -> Result<ProcMount> {
        let proc = root.join("proc");
        if proc.join("self").exists() {
            return Ok(ProcMount(None));
        }
        std::fs::create_dir_all(&proc)?;
        run_tool(
            Command::new("mount")
                .args(["-t", "proc", "proc"])
                .arg(&proc),
        )?;
        Ok(ProcMount(Some(proc)))
    }
}

impl Drop for ProcMount {
    fn drop(&mut self) {
        if let Some(proc) = &self.0 {
            let _ = Command::new("umount").arg("-l").arg(proc).status();
        }
    }
}

impl Jdk {
    /// Debian 12's own OpenJDK 17, on this host.
    fn host17() -> Jdk {
        Jdk {
            home: "/usr/lib/jvm/java-17-openjdk-amd64",
            root: None,
            _proc: None,
        }
    }

    /// Debian 13's OpenJDK 21, in a root of that release.
    fn trixie21() -> Result<Jdk> {
        let root = root_filesystem("trixie", &["openjdk-21-jdk-headless"])?;
        Ok(Jdk {
            home: "/usr/lib/jvm/java-21-openjdk-amd64",
            _proc: Some(ProcMount::in_root(&root)?),
            root: Some(root),
        })
    }

    /// A tool of the JDK's `bin`, run in its root (chroot(8) execs it: the PID is the JVM's).
    fn command(&self, tool: &str) -> Command {
        let binary = format!("{}/bin/{tool}", self.home);
        match &self.root {
            None => Command::new(binary),
            Some(root) => {
                let mut command = Command::new("chroot");
                command.arg(root).arg(binary);
                command
            }
        }
    }

    /// A directory both this test and the JVM see: its path here, and the JVM's.
    fn shared_dir(&self, tag: &str) -> Result<(PathBuf, String)> {
        let inside = format!("/tmp/scorch-jvm-{tag}");
        let here = match &self.root {
            None => PathBuf::from(&inside),
            Some(root) => root.join(inside.trim_start_matches('/')),
        };
        let _ = std::fs::remove_dir_all(&here);
        std::fs::create_dir_all(&here)?;
        Ok((here, inside))
    }
}

/// One of JFR's execution samples: its thread's name, and its frames, leaf first, as
/// `Class.method` with its line.
type JfrSample = (String, Vec<(String, u32)>);

/// JFR's execution samples of `recording` (in the JVM's view, `inside`).
fn jfr_samples(jdk: &Jdk, inside: &str) -> Result<Vec<JfrSample>> {
    let output = run_tool(
        jdk.command("jfr")
            .args([
                "print",
                "--stack-depth",
                "64",
                "--events",
                "jdk.ExecutionSample",
            ])
            .arg(inside),
    )?;
    Ok(parse_jfr(&String::from_utf8_lossy(&output.stdout)))
}

/// `jfr print`'s text: an event per `jdk.ExecutionSample {`, its thread on a
/// `sampledThread = "name" (...)` line and its frames as `Class.method(args) line: N`.
fn parse_jfr(text: &str) -> Vec<JfrSample> {
    let mut samples = Vec::new();
    let mut current: Option<JfrSample> = None;
    for line in text.lines().map(str::trim) {
        if line.starts_with("jdk.ExecutionSample") {
            if let Some(sample) = current.take() {
                samples.push(sample);
            }
            current = Some((String::new(), Vec::new()));
        } else if let Some(sample) = current.as_mut() {
            if let Some(thread) = line.strip_prefix("sampledThread = \"") {
                sample.0 = thread.split('"').next().unwrap_or("").to_owned();
            } else if let Some((method, rest)) = line.split_once('(') {
                if method.contains('.') && !method.contains(' ') {
                    let number = rest
                        .rsplit_once("line: ")
                        .and_then(|(_, n)| n.split_whitespace().next()?.parse().ok())
                        .unwrap_or(0);
                    sample.1.push((method.to_owned(), number));
                }
            }
        }
    }
    samples.extend(current);
    samples
}

/// The Java method names of a scorch sample's frames, leaf first (a compiled frame's inlined
/// methods each).
fn functions(sample: &DetailedSample) -> Vec<&str> {
    sample
        .frames
        .iter()
        .flat_map(|f| f.lines.iter())
        .map(|l| l.function.as_str())
        .collect()
}

/// The JVM runs the call tree in two threads under JFR while scorch records it; see the
/// module documentation.
fn call_tree_like_jfr(jdk: &Jdk, tag: &str, flags: &[&str]) -> Result<()> {
    let (here, inside) = jdk.shared_dir(tag)?;
    std::fs::copy(
        scorch_tests::workload_source("CallTree.java"),
        here.join("CallTree.java"),
    )?;
    run_tool(
        jdk.command("javac")
            .args(["-g", "-d", &inside])
            .arg(format!("{inside}/CallTree.java")),
    )?;
    let recording = format!("{inside}/calltree.jfr");
    let mut java = jdk
        .command("java")
        .args(flags)
        .arg(format!(
            "-XX:StartFlightRecording=filename={recording},settings=profile"
        ))
        .args(["-cp", &inside, "CallTree", "24", "2"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let _kill = KillOnDrop(java.id());
    // Past the JVM's start and the first compilations.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let path = work_dir().join(format!("jvm-calltree-{tag}.pb.gz"));
    let output = scorch_tests::record_pid_to(java.id(), 16, &path, &[])?;
    let report = scorch_tests::parse_record_output(&output)?;
    ensure!(java.wait()?.success(), "the JVM failed");
    println!("scorch: {}", report.summary);

    let profile = scorch_tests::read_pprof(&path)?;
    let samples: Vec<DetailedSample> = scorch_tests::detailed_samples(&profile)
        .into_iter()
        .filter(|s| s.comm == "java")
        .collect();
    // The workers' samples: those under CallTree.run, or any stopped short of it in a worker
    // (JFR's workers are told by their thread's name, which scorch's pprof keeps per sample
    // too, but the share is of the call tree's samples either way).
    let in_tree = |s: &DetailedSample| functions(s).contains(&"CallTree.run");
    let total: i64 = samples.iter().filter(|s| in_tree(s)).map(|s| s.count).sum();
    ensure!(
        total > 300,
        "only {total} samples in the call tree: {}",
        report.summary
    );
    let share = |name: &str| -> f64 {
        samples
            .iter()
            .filter(|s| in_tree(s) && functions(s).contains(&name))
            .map(|s| s.count)
            .sum::<i64>() as f64
            / total as f64
    };

    let jfr = jfr_samples(jdk, &recording)?;
    let jfr: Vec<_> = jfr
        .into_iter()
        .filter(|(_, frames)| frames.iter().any(|(m, _)| m == "CallTree.run"))
        .collect();
    let jfr_total = jfr.len();
    ensure!(
        jfr_total > 300,
        "JFR took only {jfr_total} samples of the call tree"
    );
    let jfr_share = |name: &str| -> f64 {
        jfr.iter()
            .filter(|(_, frames)| frames.iter().any(|(m, _)| m == name))
            .count() as f64
            / jfr_total as f64
    };
    let mut table = String::new();
    for name in METHODS {
        table += &format!(
            "{name}: scorch {:.3}, JFR {:.3}\n",
            share(name),
            jfr_share(name)
        );
    }
    println!("{table}");
    for name in METHODS {
        ensure!(
            (share(name) - jfr_share(name)).abs() <= 0.03,
            "{name}'s share differs from JFR's by more than 3 points:\n{table}"
        );
    }

    // Whole stacks: the worker's samples reach the call tree and the JVM's thread start
    // (libjvm's `thread_native_entry`: Debian 13's libc has no symbols to name
    // `start_thread`); a sample stopped in the code cache would show neither.
    let all: i64 = samples.iter().map(|s| s.count).sum();
    let whole: i64 = samples
        .iter()
        .filter(|s| {
            let names = functions(s);
            names.contains(&"CallTree.run")
                && names
                    .iter()
                    .any(|n| n.starts_with("JavaCalls::call_helper"))
                && names.iter().any(|n| n.starts_with("thread_native_entry"))
        })
        .map(|s| s.count)
        .sum();
    let workers: i64 = samples
        .iter()
        .filter(|s| {
            functions(s)
                .iter()
                .any(|n| n.starts_with("CallTree.lambda$main"))
        })
        .map(|s| s.count)
        .sum();
    ensure!(
        whole as f64 >= 0.95 * workers as f64,
        "{whole} of the workers' {workers} samples ({all} of the JVM's) reach CallTree.run, \
         call_helper and thread_native_entry: {}",
        report.summary
    );

    // Each worker's samples under its own thread name, about half each (the pool's threads
    // run the same tree).
    let threads = tree_threads(&profile);
    for worker in ["worker-0", "worker-1"] {
        let share = threads.get(worker).copied().unwrap_or(0) as f64 / total as f64;
        ensure!(
            (0.35..=0.65).contains(&share),
            "{worker} has {share:.3} of the tree's samples: {threads:?}"
        );
    }

    // Names as JFR gives them: the call tree's file, and lines within its methods.
    let source = std::fs::read_to_string(scorch_tests::workload_source("CallTree.java"))?;
    let spin_lines = method_lines(&source, "static long spin(");
    let mut leaf_lines: HashMap<u32, i64> = HashMap::new();
    for sample in samples.iter().filter(|s| in_tree(s)) {
        let Some(line) = sample
            .frames
            .iter()
            .flat_map(|f| f.lines.iter())
            .find(|l| l.function.starts_with("CallTree."))
        else {
            continue;
        };
        ensure!(
            line.file.ends_with("CallTree.java"),
            "{} named in {:?}",
            line.function,
            line.file
        );
        if line.function == "CallTree.spin" {
            *leaf_lines.entry(line.line as u32).or_default() += sample.count;
        }
    }
    let spin: i64 = leaf_lines.values().sum();
    let in_body: i64 = leaf_lines
        .iter()
        .filter(|(l, _)| spin_lines.contains(l))
        .map(|(_, n)| n)
        .sum();
    ensure!(
        spin > 0 && in_body as f64 >= 0.95 * spin as f64,
        "CallTree.spin's lines {leaf_lines:?}, its body {spin_lines:?}"
    );
    let jfr_spin = jfr
        .iter()
        .filter_map(|(_, frames)| frames.first())
        .filter(|(m, _)| m == "CallTree.spin")
        .count();
    ensure!(
        jfr_spin as f64 >= 0.5 * jfr_total as f64,
        "JFR: only {jfr_spin} of {jfr_total} samples in CallTree.spin"
    );
    Ok(())
}

/// The call tree's samples (those under `CallTree.run`) by their `thread` label.
fn tree_threads(profile: &scorch::pprof::Profile) -> HashMap<String, i64> {
    let strings = &profile.string_table;
    let in_tree: std::collections::HashSet<u64> = profile
        .location
        .iter()
        .filter(|l| {
            l.line.iter().any(|line| {
                profile
                    .function
                    .iter()
                    .find(|f| f.id == line.function_id)
                    .is_some_and(|f| strings[f.name as usize] == "CallTree.run")
            })
        })
        .map(|l| l.id)
        .collect();
    let mut threads = HashMap::new();
    for sample in &profile.sample {
        if !sample.location_id.iter().any(|id| in_tree.contains(id)) {
            continue;
        }
        let thread = sample
            .label
            .iter()
            .find(|l| strings[l.key as usize] == "thread")
            .map(|l| strings[l.str as usize].clone())
            .unwrap_or_default();
        *threads.entry(thread).or_default() += sample.value[0];
    }
    threads
}

/// The lines of the method whose declaration starts with `declaration` in `source`: from it
/// to its closing brace (at the declaration's indent).
fn method_lines(source: &str, declaration: &str) -> std::ops::RangeInclusive<u32> {
    let lines: Vec<&str> = source.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim_start().starts_with(declaration))
        .expect("the declaration");
    let indent = lines[start].len() - lines[start].trim_start().len();
    let closing = format!("{}}}", " ".repeat(indent));
    let end = (start + 1..lines.len())
        .find(|&i| lines[i] == closing)
        .expect("the closing brace");
    (start as u32 + 1)..=(end as u32 + 1)
}

#[test]
fn jdk17_call_tree_is_named_like_jfr() -> Result<()> {
    call_tree_like_jfr(&Jdk::host17(), "17", &[])
}

#[test]
fn jdk17_interpreted_call_tree_is_named_like_jfr() -> Result<()> {
    call_tree_like_jfr(&Jdk::host17(), "17-int", &["-Xint"])
}

#[test]
fn jdk17_c1_call_tree_is_named_like_jfr() -> Result<()> {
    call_tree_like_jfr(&Jdk::host17(), "17-c1", &["-XX:TieredStopAtLevel=1"])
}

#[test]
fn jdk21_call_tree_is_named_like_jfr() -> Result<()> {
    call_tree_like_jfr(&Jdk::trixie21()?, "21", &[])
}

/// A Java thread blocking in `Blocker.nap` (sleep, 3 ms) and `Blocker.park` (park, 1 ms) in
/// turn, recorded off-CPU: the time under `Blocker.run` goes three quarters to nap and one
/// to park, the Java frames named above the JVM's native ones as on-CPU.
#[test]
fn jdk17_off_cpu_stacks_name_the_java_frames() -> Result<()> {
    let jdk = Jdk::host17();
    let (here, inside) = jdk.shared_dir("17-off-cpu")?;
    std::fs::copy(
        scorch_tests::workload_source("Blocker.java"),
        here.join("Blocker.java"),
    )?;
    run_tool(
        jdk.command("javac")
            .args(["-g", "-d", &inside])
            .arg(format!("{inside}/Blocker.java")),
    )?;
    let mut java = jdk
        .command("java")
        .args(["-cp", &inside, "Blocker", "16"])
        .spawn()?;
    let _kill = KillOnDrop(java.id());
    std::thread::sleep(std::time::Duration::from_secs(3));
    let path = work_dir().join("jvm-off-cpu-17.pb.gz");
    let output =
        scorch_tests::record_pid_to(java.id(), 8, &path, &["--off-cpu", "--off-cpu-mean", "1ms"])?;
    let report = scorch_tests::parse_record_output(&output)?;
    ensure!(java.wait()?.success(), "the JVM failed");
    println!("scorch: {}", report.summary);
    let samples = scorch_tests::off_cpu_samples(&scorch_tests::read_pprof(&path)?);
    let under = |name: &str| -> i64 {
        samples
            .iter()
            .filter(|s| {
                s.frames.iter().any(|f| f == "Blocker.run") && s.frames.iter().any(|f| f == name)
            })
            .map(|s| s.value)
            .sum()
    };
    let run = under("Blocker.run");
    ensure!(
        run > 0,
        "no off-CPU time under Blocker.run: {}",
        report.summary
    );
    let (nap, park) = (
        under("Blocker.nap") as f64 / run as f64,
        under("Blocker.park") as f64 / run as f64,
    );
    println!("nap {nap:.3}, park {park:.3} of {run} ns");
    ensure!(
        (0.6..=0.9).contains(&nap) && (0.1..=0.4).contains(&park),
        "nap {nap:.3}, park {park:.3} of the time under Blocker.run"
    );
    // Whole stacks: from the blocking call through the Java frames to `Blocker.main` and the
    // JVM's native code that called it.
    let whole: i64 = samples
        .iter()
        .filter(|s| s.frames.iter().any(|f| f == "Blocker.run"))
        .filter(|s| {
            s.frames.iter().any(|f| f == "Blocker.main")
                && s.frames
                    .iter()
                    .any(|f| f.starts_with("JavaCalls::call_helper"))
        })
        .map(|s| s.value)
        .sum();
    ensure!(
        whole as f64 >= 0.95 * run as f64,
        "{whole} ns of the {run} under Blocker.run reach Blocker.main and call_helper"
    );
    Ok(())
}

#[test]
fn jfr_text_is_read_per_event() {
    let text = r#"
jdk.ExecutionSample {
  startTime = 15:01:02.345 (2026-12-06)
  sampledThread = "worker-0" (javaThreadId = 25)
  state = "STATE_RUNNABLE"
  stackTrace = [
    CallTree.spin(int) line: 28
    CallTree.parse(long) line: 37
    java.lang.Thread.run() line: 833
  ]
}

jdk.ExecutionSample {
  sampledThread = "main" (javaThreadId = 1)
  stackTrace = [
    CallTree.main(String[]) line: 97
  ]
}
"#;
    let samples = parse_jfr(text);
    assert_eq!(samples.len(), 2);
    assert_eq!(samples[0].0, "worker-0");
    assert_eq!(
        samples[0].1,
        [
            ("CallTree.spin".to_owned(), 28),
            ("CallTree.parse".to_owned(), 37),
            ("java.lang.Thread.run".to_owned(), 833)
        ]
    );
    assert_eq!(samples[1].1, [("CallTree.main".to_owned(), 97)]);
}
