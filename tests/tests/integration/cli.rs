//! Bad input is refused with a one-line error naming the input, before any BPF is loaded;
//! `scorch check` tells what works.

use std::process::Command;

use scorch_tests::*;

fn scorch(args: &[&str]) -> std::process::Output {
    Command::new(scorch_bin())
        .args(args)
        .output()
        .expect("running scorch")
}

/// Runs scorch as `nobody` with no capabilities.
fn scorch_unprivileged(args: &[&str]) -> std::process::Output {
    Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(scorch_bin())
        .args(args)
        .output()
        .expect("running setpriv (util-linux)")
}

fn one_line_error(output: &std::process::Output) -> String {
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        lines
            .iter()
            .filter(|l| l.contains("error") || l.starts_with("scorch:"))
            .count()
            == 1,
        "expected one error line, got:\n{stderr}"
    );
    stderr.into_owned()
}

#[test]
fn bad_arguments_are_refused_clearly() {
    for (args, expect) in [
        (vec!["record", "--duration", "0"], "greater than zero"),
        (vec!["record", "--duration", "-5s"], "negative"),
        (vec!["record", "--duration", "soon"], "not a duration"),
        (vec!["record", "--frequency", "5000"], "between 1 and 1000"),
        (vec!["record", "--frequency", "0"], "between 1 and 1000"),
        (vec!["record", "--frequency", "fast"], "not a whole number"),
        (
            vec!["record", "--pid", "4194305"],
            "no process with PID 4194305",
        ),
        (
            vec!["record", "--output", "/nonexistent-dir/x.pb.gz"],
            "does not exist",
        ),
        (vec!["record", "--output", "/proc"], "is a directory"),
    ] {
        let output = scorch(&args);
        let stderr = one_line_error(&output);
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
    }
}

#[test]
fn missing_privileges_are_named_before_loading() {
    let out = work_dir().join("unprivileged.pb.gz");
    let output = scorch_unprivileged(&["record", "--duration", "1s", "-o", out.to_str().unwrap()]);
    let stderr = one_line_error(&output);
    assert!(
        stderr.contains("CAP_BPF") && stderr.contains("CAP_PERFMON"),
        "{stderr}"
    );
    assert!(!out.exists());
}

#[test]
fn check_reports_every_item() {
    let output = scorch(&["check"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{stdout}");
    assert!(output.status.success(), "check failed as root:\n{stdout}");
    for item in [
        "kernel version",
        "BTF",
        "privileges",
        "perf_event_paranoid",
        "kptr_restrict",
        "BPF program loads",
        "perf event opens",
    ] {
        let line = stdout
            .lines()
            .find(|l| l.contains(item))
            .unwrap_or_else(|| panic!("no {item} line"));
        assert!(line.starts_with("OK") || line.starts_with("WARN"), "{line}");
    }

    let output = scorch_unprivileged(&["check"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        !output.status.success(),
        "check passed without privileges:\n{stdout}"
    );
    let privileges = stdout.lines().find(|l| l.contains("privileges")).unwrap();
    assert!(
        privileges.starts_with("FAIL") && privileges.contains("sudo"),
        "{privileges}"
    );
}

#[test]
fn sigint_and_sigterm_stop_early_and_still_write() -> anyhow::Result<()> {
    let program = build_workload("calltree", &["-O2", "-fno-omit-frame-pointer"])?;
    let workload = Workload::start(&program, &["1", "30"])?;
    for signal in ["INT", "TERM"] {
        let path = work_dir().join(format!("signal-{signal}.pb.gz"));
        let started = std::time::Instant::now();
        let child = Command::new(scorch_bin())
            .args([
                "record",
                "--duration",
                "60s",
                "--pid",
                &workload.pid().to_string(),
                "-o",
            ])
            .arg(&path)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        std::thread::sleep(std::time::Duration::from_secs(2));
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()?;
        assert!(status.success());
        let output = child.wait_with_output()?;
        assert!(
            output.status.success(),
            "SIG{signal}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            started.elapsed().as_secs() < 20,
            "SIG{signal} did not stop the recording"
        );
        let report = parse_record_output(&output)?;
        assert!(report.samples > 10, "SIG{signal}: {}", report.summary);
        let in_file: i64 = named_samples(&read_pprof(&path)?)
            .iter()
            .map(|s| s.count)
            .sum();
        assert_eq!(in_file as u64, report.samples);
    }
    Ok(())
}
