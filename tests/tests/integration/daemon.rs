//! `scorch run` and `scorch query`: windows stored by the daemon come back out of the store,
//! a SIGTERM flushes and exits in time, and kill -9 at any moment never damages the store.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use scorch::store::Store;
use scorch_tests::{
    build_workload, go_pprof, http_get, metric, run_scorch, work_dir, Daemon, Workload,
};

/// Polls `condition` every 200 ms for up to 20 s.
fn wait_for(what: &str, condition: &dyn Fn() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !condition()? {
        ensure!(Instant::now() < deadline, "waited 20 s for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

fn fresh_store(name: &str) -> Result<std::path::PathBuf> {
    let dir = work_dir().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(dir)
}

#[test]
fn daemon_stores_windows_that_query_merges() -> Result<()> {
    let program = build_workload("calltree", &["-O2", "-fno-omit-frame-pointer", "-g"])?;
    let workload = Workload::start(&program, &["2", "60"])?;
    let store = fresh_store("daemon-store")?;
    let daemon = Daemon::start(&store, &["--window", "1s"])?;
    let address = daemon.address.clone();
    // Three full windows, then stop in the middle of the fourth.
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(&address, "scorch_windows_written_total")? < 3.0 {
        ensure!(
            Instant::now() < deadline,
            "fewer than 3 windows written in 20 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (status, body) = http_get(&address, "/healthz")?;
    ensure!(
        status == 200,
        "/healthz: {status} {}",
        String::from_utf8_lossy(&body)
    );
    ensure!(metric(&address, "scorch_samples_total")? > 0.0);
    std::thread::sleep(Duration::from_millis(500));
    let (status, elapsed, stderr) = daemon.stop()?;
    ensure!(
        status.success(),
        "scorch run exited with {status}:\n{stderr}"
    );
    ensure!(
        elapsed < Duration::from_secs(5),
        "SIGTERM took {elapsed:?} to stop the daemon"
    );
    drop(workload);

    // The store is whole, and holds the flushed partial window too.
    let (windows, _, _) = Store::open_read_only(&store)?.windows()?;
    ensure!(
        windows >= 4,
        "{windows} windows stored, expected the 3 full ones and the partial one"
    );
    Store::open_read_only(&store)?.verify()?;

    // top on standard output, then pprof read by go tool pprof.
    let store_arg = store.to_string_lossy().into_owned();
    let top = run_scorch(&[
        "query",
        "--store",
        &store_arg,
        "--since",
        "1h",
        "--match",
        r#"{comm="calltree"}"#,
    ])?;
    let top = String::from_utf8(top.stdout)?;
    ensure!(
        top.contains("leaf_a") && top.contains("leaf_b"),
        "top:\n{top}"
    );
    let output = work_dir().join("daemon-query.pb.gz");
    run_scorch(&[
        "query",
        "--store",
        &store_arg,
        "--since",
        "1h",
        "--match",
        r#"{comm=~"call.*"}"#,
        "-o",
        &output.to_string_lossy(),
    ])?;
    let pprof_top = go_pprof(&["-top"], &output)?;
    ensure!(
        pprof_top.contains("leaf_a"),
        "go tool pprof -top:\n{pprof_top}"
    );
    // A selector that excludes the workload.
    let others = scorch_tests::query_folded(&store, &["--since", "1h"], r#"{comm!="calltree"}"#)?;
    ensure!(!others.contains("leaf_a"));
    Ok(())
}

/// `kernel.bpf_stats_enabled` for the life of a test, restored when dropped.
struct BpfStats(String);

impl BpfStats {
    fn enable() -> Result<BpfStats> {
        let path = "/proc/sys/kernel/bpf_stats_enabled";
        let before = std::fs::read_to_string(path)?.trim().to_owned();
        std::fs::write(path, "1")?;
        Ok(BpfStats(before))
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", &self.0);
    }
}

#[test]
fn metrics_report_what_the_bpf_side_costs() -> Result<()> {
    let program = build_workload("calltree", &["-O2", "-fno-omit-frame-pointer", "-g"])?;
    let workload = Workload::start(&program, &["2", "60"])?;
    let stats = BpfStats::enable()?;
    let store = fresh_store("daemon-bpf-cost")?;
    let daemon = Daemon::start(&store, &["--window", "1s", "--frequency", "99"])?;
    let address = daemon.address.clone();
    wait_for("two windows", &|| {
        Ok(metric(&address, "scorch_windows_written_total")? >= 2.0)
    })?;
    let runs = metric(&address, "scorch_bpf_run_count_total")?;
    let seconds = metric(&address, "scorch_bpf_run_time_seconds_total")?;
    let maps = metric(&address, "scorch_bpf_map_memory_bytes")?;
    let samples = metric(&address, "scorch_samples_total")?;
    // Every sample is a run of the program; some runs keep no sample (idle CPUs, filtered
    // processes), and the latest window's runs are not drained yet.
    ensure!(
        runs > 0.0 && seconds > 0.0,
        "runs {runs}, seconds {seconds}"
    );
    ensure!(
        runs + 1.0 >= samples * 0.5,
        "runs {runs} for {samples} samples"
    );
    let per_run = seconds / runs;
    ensure!(per_run < 1e-3, "{per_run} s per run");
    // The counts and stack maps of both generations, at least.
    ensure!(maps > 1e6, "{maps} bytes of BPF maps");
    // The footprint is the daemon's RSS, read from /proc here, plus the maps.
    let footprint = metric(&address, "scorch_footprint_bytes")?;
    let rss = scorch_tests::status_kib(daemon.pid(), "VmRSS:")? as f64 * 1024.0;
    ensure!(
        (footprint - maps - rss).abs() < 0.25 * rss,
        "footprint {footprint} is not maps {maps} + RSS {rss}"
    );
    println!(
        "bpf cost: {runs} runs, {:.0} ns each; {:.1} MiB of maps",
        per_run * 1e9,
        maps / (1 << 20) as f64
    );
    drop(stats);
    let (status, _, stderr) = daemon.stop()?;
    ensure!(status.success(), "{stderr}");
    drop(workload);
    Ok(())
}

#[test]
fn kill_dash_nine_never_damages_the_store() -> Result<()> {
    let program = build_workload("calltree", &["-O2", "-fno-omit-frame-pointer"])?;
    let _workload = Workload::start(&program, &["1", "120"])?;
    let store = fresh_store("crash-store")?;
    let mut stored = 0;
    // Kill at different moments of the window cycle: while idle, while draining, while
    // writing. The offsets step through a 1 s window in 170 ms strides.
    for round in 0..8u64 {
        let daemon = Daemon::start(&store, &["--window", "1s"])?;
        std::thread::sleep(Duration::from_millis(1500 + round * 170));
        let written = metric(&daemon.address, "scorch_windows_written_total")? as u64;
        let mut daemon = daemon;
        daemon.child.kill()?; // SIGKILL
        daemon.child.wait()?;
        let reader = Store::open_read_only(&store)
            .with_context(|| format!("reopening after kill -9 number {}", round + 1))?;
        reader
            .verify()
            .with_context(|| format!("store after kill -9 number {}", round + 1))?;
        let (windows, _, _) = reader.windows()?;
        // Every window the daemon reported written survived; at most the one being written
        // when the kill came is missing (and may or may not have made it).
        ensure!(
            windows >= stored + written,
            "round {round}: {windows} windows stored, but {stored} before and {written} reported written"
        );
        ensure!(
            windows <= stored + written + 1,
            "round {round}: more windows than written"
        );
        stored = windows;
    }
    // And a daemon starts cleanly on it afterwards.
    let daemon = Daemon::start(&store, &["--window", "1s"])?;
    let (status, _, stderr) = daemon.stop()?;
    ensure!(status.success(), "{stderr}");
    Ok(())
}

#[test]
fn a_foreign_file_at_the_store_path_is_refused_untouched() -> Result<()> {
    let dir = fresh_store("foreign-store")?;
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("scorch.db");
    std::fs::write(&file, "not a database, and precious\n".repeat(20))?;
    let before = std::fs::read(&file)?;
    let output = std::process::Command::new(scorch_tests::scorch_bin())
        .args(["run", "--store"])
        .arg(&dir)
        .output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        !output.status.success(),
        "scorch run accepted a foreign store"
    );
    ensure!(
        stderr.contains("is not a scorch store") && stderr.contains("scorch.db"),
        "{stderr}"
    );
    ensure!(
        std::fs::read(&file)? == before,
        "the foreign file was modified"
    );
    Ok(())
}

/// Unmounts the small file system when the test ends, however it ends.
struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn a_full_disk_pauses_writes_and_sampling_goes_on() -> Result<()> {
    let program = build_workload("calltree", &["-O2", "-fno-omit-frame-pointer"])?;
    let _workload = Workload::start(&program, &["1", "90"])?;
    let mount_point = work_dir().join("small-fs");
    std::fs::create_dir_all(&mount_point)?;
    // A mount left behind by an interrupted run.
    let _ = std::process::Command::new("umount")
        .arg("-l")
        .arg(&mount_point)
        .stderr(std::process::Stdio::null())
        .status();
    scorch_tests::run_tool(
        std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"])
            .arg(&mount_point),
    )?;
    let _mount = Mount(mount_point.clone());
    let store = mount_point.join("store");
    let daemon = Daemon::start(&store, &["--window", "1s"])?;
    let address = daemon.address.clone();
    wait_for("a first window", &|| {
        Ok(metric(&address, "scorch_windows_written_total")? >= 1.0)
    })?;

    // Fill the file system to the last byte.
    let filler = mount_point.join("filler");
    {
        use std::io::Write;
        let mut file = std::fs::File::create(&filler)?;
        let chunk = vec![0xa5u8; 4096];
        while file.write_all(&chunk).and_then(|()| file.flush()).is_ok() {}
        let _ = file.sync_all();
    }
    wait_for("a disk-full write error", &|| {
        let (_, body) = http_get(&address, "/metrics")?;
        Ok(String::from_utf8_lossy(&body).contains("reason=\"disk_full\""))
    })?;
    let (status, body) = http_get(&address, "/healthz")?;
    ensure!(
        status == 503,
        "/healthz with a full disk: {status} {}",
        String::from_utf8_lossy(&body)
    );
    // Sampling goes on.
    let samples = metric(&address, "scorch_samples_total")?;
    wait_for("more samples while the disk is full", &|| {
        Ok(metric(&address, "scorch_samples_total")? > samples)
    })?;
    ensure!(metric(&address, "scorch_windows_buffered")? >= 1.0);

    // Space comes back: the buffered windows are written and health recovers.
    let written = metric(&address, "scorch_windows_written_total")?;
    std::fs::remove_file(&filler)?;
    wait_for("writes to resume", &|| {
        Ok(
            metric(&address, "scorch_windows_written_total")? > written + 1.0
                && metric(&address, "scorch_windows_buffered")? == 0.0,
        )
    })?;
    let (status, _) = http_get(&address, "/healthz")?;
    ensure!(status == 200, "/healthz after space came back: {status}");
    let (status, _, stderr) = daemon.stop()?;
    ensure!(status.success(), "{stderr}");
    ensure!(
        stderr.contains("writing to the store failed") && stderr.contains("accepts writes again"),
        "{stderr}"
    );
    Store::open_read_only(&store)?.verify()?;
    Ok(())
}
