//! `cargo xtask bench --only jvm`: what walking HotSpot's Java frames costs, written to
//! `target/bench/jvm.md` (the bench is `managed`'s).
//!
//! - **BPF per sample**: OpenJDK 17 running `tests/workloads/JavaDepth.java` 50 Java frames
//!   deep (each level a compiled frame of its own under the JVM's default flags), recorded
//!   after a warm-up that lets C2 compile the levels, with `--jvm auto` and `--jvm off`.
//! - **Daemon with 5 JVMs and with none**: 5 `java CallTree` processes, one busy thread each.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context, Result};

use crate::{
    bench::{
        managed::{managed, Subject},
        measure::{command_output, path_str},
        results::BenchResult,
        Bench,
    },
    run_command,
};

/// Debian 12's own OpenJDK, the one the JVM tests run on this host.
const JDK: &str = "/usr/lib/jvm/java-17-openjdk-amd64";

pub fn jvm(root: &Path, scorch: &Path, runs: usize, command: String) -> Result<BenchResult> {
    let classes = std::env::temp_dir().join("scorch-bench-jvm-classes");
    let _ = std::fs::remove_dir_all(&classes);
    let workloads = root.join("tests/workloads");
    run_command(
        Command::new(format!("{JDK}/bin/javac"))
            .args(["-g", "-d", path_str(&classes)?])
            .arg(workloads.join("JavaDepth.java"))
            .arg(workloads.join("CallTree.java")),
    )?;
    let java = move |args: Vec<String>| {
        Command::new(format!("{JDK}/bin/java"))
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .context("starting java")
    };
    let path = path_str(&classes)?.to_owned();
    let deep_path = path.clone();
    // JavaDepth draws its receivers afresh each round: no steady form.
    let deep = move |depth: usize, seconds: u64, _steady: bool| {
        java(vec![
            "-cp".into(),
            deep_path.clone(),
            "JavaDepth".into(),
            depth.to_string(),
            seconds.to_string(),
        ])
    };
    let busy = move |seconds: u64| {
        java(vec![
            "-cp".into(),
            path.clone(),
            "CallTree".into(),
            seconds.to_string(),
            "1".into(),
        ])
    };
    let subject = Subject {
        bench: Bench::Jvm,
        flag: "--jvm",
        runtime: "hotspot",
        language: "Java",
        process: "JVM",
        processes: "JVMs",
        version: command_output(&format!("{JDK}/bin/java"), &["--version"])
            .lines()
            .next()
            .unwrap_or("OpenJDK 17")
            .to_owned(),
        address: "127.0.0.1:17096",
        deep: Box::new(deep),
        steady: false,
        // C2 has compiled JavaDepth's levels by then.
        deep_warm_up: Duration::from_secs(5),
        ours: |frame| frame.starts_with("JavaDepth"),
        busy: Box::new(busy),
        busy_warm_up: Duration::from_secs(5),
        deep_note: "Java: `JavaDepth` on OpenJDK 17's default flags, each level a C2-compiled \
                    frame, recorded after 5 s; `--jvm off` walks the same JVM natively, and \
                    stops in its code cache. Native: `deeprec` built without frame \
                    pointers, walked through unwind tables (`vary`: a new stack each \
                    round). Its frames: the workload's own in the \
                    profile written (JavaDepth's methods, deeprec's functions), each inlined \
                    method one. Target: at most 5 us a sample on the Java stack.",
        busy_note: "Each JVM runs `CallTree` in one busy thread, started afresh for each \
                    daemon. Java names: `scorch_runtime_names_bytes{runtime=\"hotspot\"}`, \
                    what the last window's names took before it ended.",
    };
    managed(&subject, root, scorch, runs, command)
}
