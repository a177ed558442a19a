//! Counting: with both CPUs busy, scorch takes frequency x CPUs x seconds samples, and the
//! windows it drains add up to exactly that total: nothing lost or counted twice at a window
//! boundary.

use scorch_tests::*;

#[test]
fn samples_add_up_across_windows() -> anyhow::Result<()> {
    let cpus = std::thread::available_parallelism()?.get();
    let program = build_workload("calltree", &["-O2", "-fno-omit-frame-pointer"])?;
    // One spinning thread per CPU keeps every CPU busy, so no sample falls on idle.
    let workload = Workload::start(&program, &[&cpus.to_string(), "40"])?;
    std::thread::sleep(std::time::Duration::from_millis(300));
    let frequency = 97.0;
    let path = work_dir().join("counting.pb.gz");
    let output = run_scorch(&[
        "record",
        "-F",
        "97",
        "--duration",
        "9s",
        "--window",
        "2s",
        "-o",
        path.to_str().unwrap(),
    ])?;
    let report = parse_record_output(&output)?;
    println!("{}; windows {:?}", report.summary, report.windows);

    let expected = frequency * cpus as f64 * report.seconds;
    let ratio = report.samples as f64 / expected;
    assert!(
        (0.95..=1.05).contains(&ratio),
        "{} samples, expected {expected:.0} ({frequency} Hz x {cpus} CPUs x {:.2} s)",
        report.samples,
        report.seconds
    );
    // Several windows were drained while sampling, and they add up to the total.
    assert!(report.windows.len() >= 4, "windows: {:?}", report.windows);
    assert_eq!(report.windows.iter().sum::<u64>(), report.samples);
    // Each full window holds its share: a window drained twice or dropped would stand out.
    let per_full_window = frequency * cpus as f64 * 2.0;
    for &w in &report.windows[..report.windows.len() - 1] {
        let r = w as f64 / per_full_window;
        assert!(
            (0.9..=1.1).contains(&r),
            "window of {w}, expected ~{per_full_window:.0}"
        );
    }
    // The file holds the same total.
    let profile = read_pprof(&path)?;
    let in_file: i64 = named_samples(&profile).iter().map(|s| s.count).sum();
    assert_eq!(in_file as u64, report.samples);
    let burner: i64 = named_samples(&profile)
        .iter()
        .filter(|s| s.pid == i64::from(workload.pid()))
        .map(|s| s.count)
        .sum();
    assert!(
        burner as f64 > 0.9 * expected,
        "workload got {burner} of {expected:.0}"
    );
    Ok(())
}
