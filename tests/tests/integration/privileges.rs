//! Least privilege, proven: scorch run as `nobody` holding only the capabilities the systemd
//! unit and the DaemonSet grant (CAP_BPF, CAP_PERFMON, CAP_SYSLOG, CAP_SYS_PTRACE) profiles
//! root's processes completely, a container-like one included; without CAP_SYS_PTRACE or
//! CAP_SYSLOG the frames they name are lost; and without each one `scorch check` names it.
//!
//! What this proves precisely: the workloads run as root, another user than scorch's, which is
//! the hard case (the same user's processes need no capability to be read). One lives in a
//! mount namespace of its own with its binary on a private tmpfs, so the only way to it is
//! /proc/PID/root, as for a binary inside a container; the other spends its time in the kernel.

use std::{path::Path, process::Command};

use anyhow::Context;

use scorch_tests::*;

/// The documented set, as setpriv spells them.
const DOCUMENTED: [&str; 4] = ["bpf", "perfmon", "syslog", "sys_ptrace"];

/// `scorch ARGS` as uid/gid 65534 (nobody) with exactly `caps`: inheritable, ambient and
/// bounding sets all cleared but for them, so nothing else can come back.
fn scorch_as_nobody_with(caps: &[&str], args: &[&str]) -> Command {
    let list: String = std::iter::once("-all".to_owned())
        .chain(caps.iter().map(|c| format!("+{c}")))
        .collect::<Vec<_>>()
        .join(",");
    let mut command = Command::new("setpriv");
    command
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(format!("--inh-caps={list}"))
        .arg(format!("--ambient-caps={list}"))
        .arg(format!("--bounding-set={list}"))
        .arg(scorch_bin())
        .args(args);
    command
}

fn without(cap: &str) -> Vec<&'static str> {
    DOCUMENTED.iter().copied().filter(|&c| c != cap).collect()
}

/// CAP_BPF and CAP_PERFMON exist from Linux 5.8; before, only root can profile.
fn kernel_has_split_capabilities() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    match scorch::cmd::check::parse_kernel_version(release.trim()) {
        Some(version) if version >= (5, 8) => true,
        _ => {
            println!("skipped: kernel {release:?} has no CAP_BPF/CAP_PERFMON (Linux 5.8+)");
            false
        }
    }
}

/// Whether /proc/kallsyms shows zeros to a process without CAP_SYSLOG (kptr_restrict >= 1, or
/// 0 with perf_event_paranoid >= 2): only then is CAP_SYSLOG needed at all.
fn kallsyms_hidden_without_syslog() -> bool {
    let sysctl = |name: &str| {
        std::fs::read_to_string(format!("/proc/sys/kernel/{name}"))
            .ok()
            .and_then(|v| v.trim().parse::<i64>().ok())
            .unwrap_or(2)
    };
    sysctl("kptr_restrict") >= 1 || sysctl("perf_event_paranoid") >= 2
}

/// Starts calltree as root in a mount namespace of its own, run from a tmpfs mounted only
/// there: from the host the directory is empty.
fn start_contained_calltree(calltree: &Path) -> anyhow::Result<Workload> {
    let private = work_dir().join("private-root");
    std::fs::create_dir_all(&private)?;
    let script = format!(
        "mount -t tmpfs scorch-private {dir} && cp {bin} {dir}/calltree && exec {dir}/calltree 1 40",
        dir = private.display(),
        bin = calltree.display()
    );
    let unshare = Path::new("/usr/bin/unshare");
    let workload = Workload::start(
        unshare,
        &["--mount", "--propagation", "private", "sh", "-c", &script],
    )?;
    // Running from the tmpfs: its own /proc/PID/exe shows the private path.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let exe = std::fs::read_link(format!("/proc/{}/exe", workload.pid()));
        if exe.is_ok_and(|e| e.starts_with(&private)) {
            break;
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the contained calltree did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    anyhow::ensure!(
        std::fs::read_dir(&private)?.next().is_none(),
        "the private tmpfs is visible from the host: the test would prove nothing"
    );
    Ok(workload)
}

/// Records both workloads as nobody with `caps`; returns the samples of each.
fn record_as_nobody(
    caps: &[&str],
    contained: u32,
    kernel_heavy: u32,
    name: &str,
) -> anyhow::Result<(Vec<NamedSample>, Vec<NamedSample>)> {
    let path = work_dir().join(format!("{name}.pb.gz"));
    let _ = std::fs::remove_file(&path);
    let output_path = path.to_str().context("work directory is not UTF-8")?;
    let output = scorch_as_nobody_with(
        caps,
        &[
            "record",
            "--pid",
            &contained.to_string(),
            "--pid",
            &kernel_heavy.to_string(),
            "-F",
            "199",
            "--duration",
            "3s",
            "-o",
            output_path,
        ],
    )
    .output()?;
    anyhow::ensure!(
        output.status.success(),
        "scorch record as nobody with {caps:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{caps:?}: {}", parse_record_output(&output)?.summary);
    let samples = named_samples(&read_pprof(&path)?);
    let of = |pid: u32| -> Vec<NamedSample> {
        samples
            .iter()
            .filter(|s| s.pid == i64::from(pid))
            .cloned()
            .collect()
    };
    Ok((of(contained), of(kernel_heavy)))
}

fn count(samples: &[NamedSample], wanted: impl Fn(&NamedSample) -> bool) -> i64 {
    samples.iter().filter(|s| wanted(s)).map(|s| s.count).sum()
}

/// The five heaviest stacks, leaf first, for failure messages.
fn show(samples: &[NamedSample]) -> String {
    let mut sorted: Vec<&NamedSample> = samples.iter().collect();
    sorted.sort_by_key(|s| std::cmp::Reverse(s.count));
    sorted
        .iter()
        .take(5)
        .map(|s| format!("{:>6} {}", s.count, s.frames.join(" <- ")))
        .collect::<Vec<_>>()
        .join("\n")
}

fn total(samples: &[NamedSample]) -> i64 {
    count(samples, |_| true)
}

/// The call tree, leaf first, as calltree's hottest stack holds it.
fn has_calltree_stack(s: &NamedSample) -> bool {
    s.frames
        .iter()
        .map(String::as_str)
        .take(4)
        .eq(["leaf_a", "run_a", "dispatch", "main"])
}

fn kernel_frames_named(samples: &[NamedSample]) -> (usize, usize) {
    let kernel: Vec<&String> = samples
        .iter()
        .flat_map(|s| s.frames.iter().zip(&s.kernel))
        .filter(|(_, &k)| k)
        .map(|(f, _)| f)
        .collect();
    let named = kernel.iter().filter(|f| !f.starts_with("0x")).count();
    (named, kernel.len())
}

#[test]
fn documented_capabilities_profile_completely() -> anyhow::Result<()> {
    if !kernel_has_split_capabilities() {
        return Ok(());
    }
    let calltree = build_workload("calltree", &["-O2", "-fno-omit-frame-pointer"])?;
    let readzero = build_workload("readzero", &["-O2", "-fno-omit-frame-pointer"])?;
    let contained = start_contained_calltree(&calltree)?;
    let kernel_heavy = Workload::start(&readzero, &["40"])?;

    // Everything documented: both workloads complete, user and kernel frames named.
    let (tree, reads) = record_as_nobody(
        &DOCUMENTED,
        contained.pid(),
        kernel_heavy.pid(),
        "least-privilege",
    )?;
    assert!(total(&tree) > 200, "only {} calltree samples", total(&tree));
    let with_stack = count(&tree, has_calltree_stack);
    assert!(
        with_stack * 2 > total(&tree),
        "leaf_a <- run_a <- dispatch <- main in {with_stack} of {} samples:\n{}",
        total(&tree),
        show(&tree)
    );
    let unnamed = count(&tree, |s| s.frames.iter().any(|f| f.starts_with("0x")));
    assert!(
        unnamed * 100 <= total(&tree),
        "{unnamed} of {} calltree samples have unnamed frames:\n{}",
        total(&tree),
        show(&tree)
    );
    assert!(
        total(&reads) > 200,
        "only {} readzero samples",
        total(&reads)
    );
    let (named, all) = kernel_frames_named(&reads);
    assert!(
        all > 0 && named * 100 >= all * 99,
        "{named} of {all} kernel frames named"
    );
    // Below the kernel's read path, the user frames are named too (glibc's, read through
    // the host path: readzero's main is skipped because libc's read() keeps no frame pointer).
    let read_path = count(&reads, |s| {
        s.frames.iter().any(|f| f == "vfs_read" || f == "ksys_read")
            && s.frames.iter().any(|f| f == "__libc_start_call_main")
            && !s.frames.iter().any(|f| f.starts_with("0x"))
    });
    assert!(
        read_path * 2 > total(&reads),
        "vfs_read under named user frames in {read_path} of {}:\n{}",
        total(&reads),
        show(&reads)
    );

    // Each of the two that only name frames is needed: without it, its frames are lost.
    let (tree, _) = record_as_nobody(
        &without("sys_ptrace"),
        contained.pid(),
        kernel_heavy.pid(),
        "no-sys-ptrace",
    )?;
    let named_tree = count(&tree, |s| s.frames.iter().any(|f| f == "leaf_a"));
    assert!(
        total(&tree) > 200 && named_tree == 0,
        "without CAP_SYS_PTRACE the contained binary was still read ({named_tree} of {} named)",
        total(&tree)
    );
    if kallsyms_hidden_without_syslog() {
        let (_, reads) = record_as_nobody(
            &without("syslog"),
            contained.pid(),
            kernel_heavy.pid(),
            "no-syslog",
        )?;
        let (named, all) = kernel_frames_named(&reads);
        assert!(
            all > 0 && named == 0,
            "without CAP_SYSLOG {named} of {all} kernel frames were named"
        );
    } else {
        println!("CAP_SYSLOG not exercised: this kernel shows kallsyms addresses to everyone");
    }
    Ok(())
}

#[test]
fn check_names_each_missing_capability() -> anyhow::Result<()> {
    if !kernel_has_split_capabilities() {
        return Ok(());
    }
    let check = |caps: &[&str]| -> anyhow::Result<(bool, String)> {
        let output = scorch_as_nobody_with(caps, &["check"]).output()?;
        Ok((
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        ))
    };

    let (passed, report) = check(&DOCUMENTED)?;
    assert!(passed, "check failed with the documented set:\n{report}");
    for line in report.lines() {
        assert!(!line.starts_with("FAIL"), "{line}\n{report}");
        for cap in ["CAP_BPF", "CAP_PERFMON", "CAP_SYSLOG", "CAP_SYS_PTRACE"] {
            assert!(
                !(line.starts_with("WARN") && line.contains(&format!("grant {cap}"))),
                "asks for {cap} although it is held:\n{report}"
            );
        }
    }

    for cap in DOCUMENTED {
        let name = format!("CAP_{}", cap.to_uppercase());
        if cap == "syslog" && !kallsyms_hidden_without_syslog() {
            println!("{name} not checked: this kernel shows kallsyms addresses to everyone");
            continue;
        }
        let (passed, report) = check(&without(cap))?;
        let naming: Vec<&str> = report
            .lines()
            .filter(|l| (l.starts_with("FAIL") || l.starts_with("WARN")) && l.contains(&name))
            .collect();
        println!("without {name}: {naming:?}");
        assert!(
            !naming.is_empty(),
            "no FAIL/WARN line names {name}:\n{report}"
        );
        // Without either of the two that load and attach the program, nothing can profile.
        let essential = matches!(cap, "bpf" | "perfmon");
        assert_eq!(
            passed, !essential,
            "check's verdict without {name}:\n{report}"
        );
    }
    Ok(())
}
