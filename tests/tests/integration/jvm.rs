//! Java frames of HotSpot JVMs, walked in BPF through the code cache and named from the JVM's
//! memory, against JFR (the JDK's own profiler) as the reference.
//!
//! `CallTree.java` spends known shares of its CPU time in four methods (parse 1, matmul 3,
//! reduce 2, digest 1 parts of 7), set by the thread's clock. Each JVM runs it under JFR's
//! `jdk.ExecutionSample` while scorch records it: each method's share within 3 points of
//! JFR's, the stacks whole from the leaf through `CallTree.run` and the JVM's `call_helper`
//! to the thread's start, and names as JFR gives them (class, method, file, line). The JVM
//! runs as it is tuned by default (both JIT compilers), with `-Xint` (the interpreter only)
//! and with `-XX:TieredStopAtLevel=1` (C1 only); Debian 13's JDK 21 and 25 run in debootstrap
//! roots.

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

    /// Debian 13's OpenJDK 25, in a root of that release: 23+'s layout (code offsets, the
    /// immutable data) and 25's mutable data.
    fn trixie25() -> Result<Jdk> {
        let root = root_filesystem("trixie", &["openjdk-25-jdk-headless"])?;
        Ok(Jdk {
            home: "/usr/lib/jvm/java-25-openjdk-amd64",
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

#[test]
fn jdk25_call_tree_is_named_like_jfr() -> Result<()> {
    call_tree_like_jfr(&Jdk::trixie25()?, "25", &[])
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

/// A JVM defining a class per generation under a class loader of its own, running its method
/// for 3 ms and dropping it, with a collection every 16 generations: the classes are unloaded
/// and their methods' memory reused while scorch records. Every Java frame of a generated class
/// is named with a generation that existed, its class's number and its method's the same (a
/// freed `Method*` or symbol read again would mix them, or name one that never ran), and a
/// good part of the samples are named.
#[test]
fn unloaded_classes_are_never_misnamed() -> Result<()> {
    let jdk = Jdk::host17();
    let (here, inside) = jdk.shared_dir("17-churn")?;
    for file in ["Churn.java", "GenXXXXXX.java"] {
        std::fs::copy(scorch_tests::workload_source(file), here.join(file))?;
    }
    run_tool(
        jdk.command("javac")
            .args(["-g", "-d", &inside])
            .arg(format!("{inside}/GenXXXXXX.java"))
            .arg(format!("{inside}/Churn.java")),
    )?;
    let java = jdk
        .command("java")
        .args(["-cp", &inside, "Churn", "16"])
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let _kill = KillOnDrop(java.id());
    std::thread::sleep(std::time::Duration::from_secs(2));
    let path = work_dir().join("jvm-churn-17.pb.gz");
    let output = scorch_tests::record_pid_to(java.id(), 12, &path, &[])?;
    let report = scorch_tests::parse_record_output(&output)?;
    let printed = java.wait_with_output()?;
    ensure!(printed.status.success(), "the JVM failed");
    let printed = String::from_utf8_lossy(&printed.stdout);
    println!("scorch: {}\nChurn: {printed}", report.summary);
    let words: Vec<&str> = printed.split_whitespace().collect();
    let generations: u32 = words.get(1).and_then(|n| n.parse().ok()).unwrap_or(0);
    let unloaded: u32 = words.get(3).and_then(|n| n.parse().ok()).unwrap_or(0);
    ensure!(
        generations > 200 && unloaded > 100,
        "the churn ran {generations} generations and unloaded {unloaded} classes"
    );
    let samples = scorch_tests::detailed_samples(&scorch_tests::read_pprof(&path)?);
    let (mut named, mut in_churn) = (0i64, 0i64);
    for sample in &samples {
        let names = functions(sample);
        if !names.contains(&"Churn.main") {
            continue;
        }
        in_churn += sample.count;
        for name in names.iter().filter(|n| n.starts_with("Gen")) {
            let (class, method) = name.split_once(".work").unwrap_or((name, ""));
            let class = class.trim_start_matches("Gen");
            let number: Option<u32> = class.parse().ok();
            ensure!(
                class == method && number.is_some_and(|n| n < generations),
                "{name}: a method that never ran ({generations} generations)"
            );
            named += sample.count;
        }
    }
    println!("{named} of {in_churn} samples under Churn.main in a generated class");
    // Frames sampled across a collection are left unknown, and this JVM collects every 50 ms
    // or so: a good part, not most, is named.
    ensure!(
        named >= 50 && named as f64 >= 0.2 * in_churn as f64,
        "only {named} of {in_churn} samples under Churn.main named in a generated class"
    );
    Ok(())
}

/// Processes that export a JVM's `gHotSpotVMStructs` and lie about it (tables at garbage, a
/// terabyte stride, no end, names without one, names that are the table): the daemon counts
/// each as a JVM it will not walk, walks their native frames as any process's, and stays up,
/// its CPU and memory those of a quiet host.
#[test]
fn lying_jvms_are_refused_and_cost_the_daemon_nothing() -> Result<()> {
    const MODES: [&str; 5] = ["garbage", "stride", "endless", "longname", "selfref"];
    let program = scorch_tests::build_workload("fakejvm", &["-O2", "-rdynamic", "-g"])?;
    let store = work_dir().join("jvm-lying-store");
    let _ = std::fs::remove_dir_all(&store);
    let daemon = scorch_tests::Daemon::start(&store, &["--window", "1s", "--frequency", "49"])?;
    let (pid, address) = (daemon.pid(), daemon.address.clone());
    let mut fakes = Vec::new();
    for mode in MODES {
        fakes.push(scorch_tests::Workload::start(&program, &[mode, "20"])?);
    }
    let cpu_before = cpu_seconds(pid)?;
    let started = std::time::Instant::now();
    scorch_tests::wait_for(
        "the lying processes to be refused",
        std::time::Duration::from_secs(15),
        &|| Ok(scorch_tests::metric(&address, "scorch_runtime_processes_refused")? >= 5.0),
    )?;
    std::thread::sleep(std::time::Duration::from_secs(8));
    let cpu = (cpu_seconds(pid)? - cpu_before) / started.elapsed().as_secs_f64();
    let peak = scorch_tests::status_kib(pid, "VmHWM:")? as f64 / 1024.0;
    let (status, body) = scorch_tests::http_get(&address, "/healthz")?;
    for mut fake in fakes {
        ensure!(fake.child.wait()?.success(), "fakejvm failed");
    }
    let (stopped, _, stderr) = daemon.stop()?;
    ensure!(stopped.success(), "{stderr}");
    println!("daemon: {cpu:.3} of a CPU, peak RSS {peak:.1} MiB; /healthz {status}");
    ensure!(
        status == 200,
        "/healthz answered {status}: {}",
        String::from_utf8_lossy(&body)
    );
    // A quiet host's daemon at 49 Hz: well under a tenth of a CPU, and tens of MiB.
    ensure!(
        cpu < 0.15,
        "the daemon took {cpu:.3} of a CPU beside the lying processes"
    );
    ensure!(peak < 120.0, "the daemon's RSS peaked at {peak:.1} MiB");
    // Their own frames are walked and named as any native process's.
    let folded = scorch_tests::query_folded(&store, &[], r#"{comm="fakejvm"}"#)?;
    let spins: u64 = folded
        .lines()
        .filter(|l| l.contains("main;fake_spin"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum();
    ensure!(spins > 100, "fake_spin named in {spins} samples:\n{folded}");
    // None of them was walked as a JVM.
    ensure!(
        !folded.contains("[jvm"),
        "a lying process has JVM frames:\n{folded}"
    );
    Ok(())
}

/// User plus system CPU seconds of `pid`, from `/proc/PID/stat`.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    // USER_HZ, the unit of /proc's clock ticks, is 100 in Linux's ABI.
    Ok(ticks / 100.0)
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
