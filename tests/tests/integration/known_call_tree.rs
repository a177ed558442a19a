//! A workload with a known call tree: scorch's function shares match the known ratios and a
//! `perf record -g` run of the same seconds.

use std::process::Command;

use scorch_tests::*;

const LEAVES: [&str; 3] = ["leaf_a", "leaf_b", "leaf_c"];
const EXPECTED: [f64; 3] = [0.6, 0.3, 0.1];

#[test]
fn function_shares_match_known_ratios_and_perf() -> anyhow::Result<()> {
    let program = build_workload("calltree", &["-O2", "-fno-omit-frame-pointer", "-g"])?;
    // Cycles of about 130 ms, 26 sampling periods: at the default 13 ms the cycle aliased
    // with 199 Hz, and scorch and perf, sampling the same seconds, read leaf_a as 0.646 and
    // 0.567 in one CI run.
    let workload = Workload::start(&program, &["1", "40", "10"])?;
    let pid = workload.pid().to_string();
    let dir = work_dir();
    let pprof_path = dir.join("calltree.pb.gz");
    let perf_data = dir.join("calltree.perf.data");

    // perf records the same process over the same seconds, beside scorch.
    let mut perf = Command::new("perf")
        .args(["record", "-g", "-F", "199", "-p", &pid, "-o"])
        .arg(&perf_data)
        .args(["--", "sleep", "8"])
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let output = run_scorch(&[
        "record",
        "--pid",
        &pid,
        "--frequency",
        "199",
        "--duration",
        "8s",
        "--output",
        pprof_path.to_str().unwrap(),
    ])?;
    assert!(perf.wait()?.success(), "perf record failed");
    let report = parse_record_output(&output)?;
    println!("{}", report.summary);

    let profile = read_pprof(&pprof_path)?;
    let samples = named_samples(&profile);
    let pid: i64 = pid.parse()?;
    assert!(
        samples.iter().all(|s| s.pid == pid),
        "--pid let other processes through"
    );
    let total: i64 = samples.iter().map(|s| s.count).sum();
    assert!(total > 1000, "only {total} samples at 199 Hz over 8 s");
    let shares = leaf_shares(&samples, pid, &LEAVES);
    let (perf_shares, perf_total) = perf_leaf_shares(&perf_data, &LEAVES)?;
    println!("scorch shares {shares:.3?} of {total}; perf {perf_shares:.3?} of {perf_total}");
    for i in 0..3 {
        assert!(
            (shares[i] - EXPECTED[i]).abs() < 0.05,
            "{}: scorch {:.3} vs known {:.3}",
            LEAVES[i],
            shares[i],
            EXPECTED[i]
        );
        assert!(
            (shares[i] - perf_shares[i]).abs() < 0.05,
            "{}: scorch {:.3} vs perf {:.3}",
            LEAVES[i],
            shares[i],
            perf_shares[i]
        );
    }

    // The call tree itself: leaf_a is called by run_a, called by dispatch, called by main.
    let leaf_a: Vec<&NamedSample> = samples
        .iter()
        .filter(|s| s.frames.first().map(String::as_str) == Some("leaf_a"))
        .collect();
    let a_total: i64 = leaf_a.iter().map(|s| s.count).sum();
    let full_chain: i64 = leaf_a
        .iter()
        .filter(|s| s.frames.get(1..4) == Some(&["run_a".into(), "dispatch".into(), "main".into()]))
        .map(|s| s.count)
        .sum();
    assert!(
        full_chain as f64 >= 0.95 * a_total as f64,
        "only {full_chain} of {a_total} leaf_a samples unwind through run_a <- dispatch <- main"
    );
    // And every sample carries the process name.
    assert!(samples.iter().all(|s| s.comm == "calltree"));

    // The reference reader accepts the file and sees the same functions.
    let traces = go_pprof(&["-traces"], &pprof_path)?;
    assert!(
        traces.contains("leaf_a") && traces.contains("dispatch"),
        "{traces}"
    );
    let top = go_pprof(&["-top"], &pprof_path)?;
    assert!(top.contains("leaf_b") && top.contains("leaf_c"), "{top}");

    // Folded and SVG outputs of a fresh recording name the same functions.
    let folded_path = dir.join("calltree.folded");
    record_pid_to(pid as u32, 2, &folded_path, &[])?;
    let folded = std::fs::read_to_string(&folded_path)?;
    assert!(
        folded
            .lines()
            .any(|l| l.starts_with("calltree;") && l.contains(";main;dispatch;run_a;leaf_a ")),
        "{folded}"
    );
    let svg_path = dir.join("calltree.svg");
    record_pid_to(pid as u32, 2, &svg_path, &[])?;
    let svg = std::fs::read_to_string(&svg_path)?;
    assert!(svg.contains("<svg") && svg.contains("leaf_a") && svg.contains("samples"));
    drop(workload);
    Ok(())
}
