//! Labels from real cgroups (a unified v2 tree and a v1 hierarchy, as this machine's hybrid
//! layout has), relabelling from the config file, and targeting: a process a rule drops is
//! excluded in the kernel.

use std::{path::Path, time::Duration};

use anyhow::{ensure, Context, Result};
use scorch::store::{Store, TimeRange};
use scorch_tests::{build_workload, http_get, work_dir, Cgroup, Daemon, Workload};

const CONTAINER: &str = "5f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";
const POD_UID: &str = "0e1d2c3b-4a59-4867-9786-a5b4c3d2e1f0";

pub fn all_series(store: &Path) -> Result<Vec<scorch::profile::Labels>> {
    let range = TimeRange {
        from: std::time::UNIX_EPOCH,
        to: std::time::SystemTime::now() + Duration::from_secs(60),
    };
    Ok(Store::open_read_only(store)?.series(range, scorch::store::SampleKind::Cpu)?)
}

#[test]
fn cgroups_name_units_containers_and_pods() -> Result<()> {
    let unified = Path::new("/sys/fs/cgroup/unified");
    let systemd_v1 = Path::new("/sys/fs/cgroup/systemd");
    ensure!(
        unified.join("cgroup.procs").exists() && systemd_v1.join("cgroup.procs").exists(),
        "this test needs the hybrid cgroup layout (v2 at {} and the v1 name=systemd hierarchy)",
        unified.display()
    );
    let program = build_workload("calltree", &["-O2", "-fno-omit-frame-pointer"])?;
    let dir = work_dir().join("cgroup-workloads");
    std::fs::create_dir_all(&dir)?;
    // Different command names, so each series is easy to find.
    let mut workloads = Vec::new();
    for name in ["svcwork", "dockwork", "podwork"] {
        let copy = dir.join(name);
        std::fs::copy(&program, &copy)?;
        workloads.push(Workload::start(&copy, &["1", "60"])?);
    }
    // A systemd service in the v2 tree, a docker container in the v1 systemd hierarchy, a
    // kubelet pod container (systemd cgroup driver) in the v2 tree.
    let service = Cgroup::create(unified, "/system.slice/scorch-test-svc.service")?;
    service.add(workloads[0].pid())?;
    let docker = Cgroup::create(
        systemd_v1,
        &format!("/system.slice/docker-{CONTAINER}.scope"),
    )?;
    docker.add(workloads[1].pid())?;
    let pod = Cgroup::create(
        unified,
        &format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CONTAINER}.scope",
            POD_UID.replace('-', "_")
        ),
    )?;
    pod.add(workloads[2].pid())?;

    let store = work_dir().join("labels-store");
    let _ = std::fs::remove_dir_all(&store);
    let daemon = Daemon::start(
        &store,
        &["--window", "1s", "--external-label", "cluster=test"],
    )?;
    std::thread::sleep(Duration::from_secs(4));
    let (status, _, stderr) = daemon.stop()?;
    ensure!(status.success(), "{stderr}");
    let pids: Vec<String> = workloads.iter().map(|w| w.pid().to_string()).collect();
    drop(workloads);

    let series = all_series(&store)?;
    let find = |pid: &str| {
        series
            .iter()
            .find(|l| l.get("pid").map(String::as_str) == Some(pid))
            .cloned()
            .with_context(|| format!("no series for pid {pid} in {series:?}"))
    };
    let svc = find(&pids[0])?;
    ensure!(svc["systemd_unit"] == "scorch-test-svc.service", "{svc:?}");
    ensure!(svc["service_name"] == "scorch-test-svc.service", "{svc:?}");
    ensure!(
        svc["cgroup"] == "/system.slice/scorch-test-svc.service",
        "{svc:?}"
    );
    ensure!(
        svc["comm"] == "svcwork" && svc["cluster"] == "test",
        "{svc:?}"
    );
    ensure!(svc.get("node").is_some_and(|n| !n.is_empty()), "{svc:?}");
    ensure!(svc["executable"].ends_with("/svcwork"), "{svc:?}");
    ensure!(
        svc.keys().all(|k| !k.starts_with("__")),
        "meta labels kept: {svc:?}"
    );
    let dock = find(&pids[1])?;
    ensure!(dock["container_id"] == CONTAINER, "{dock:?}");
    ensure!(
        !dock.contains_key("systemd_unit"),
        "a container scope is no unit: {dock:?}"
    );
    let podded = find(&pids[2])?;
    ensure!(podded["container_id"] == CONTAINER, "{podded:?}");
    ensure!(
        podded["cgroup"].contains(&POD_UID.replace('-', "_")),
        "{podded:?}"
    );

    // A query by unit selects exactly the service's process.
    let folded = scorch_tests::query_folded(
        &store,
        &["--since", "1h"],
        r#"{systemd_unit="scorch-test-svc.service"}"#,
    )?;
    ensure!(folded.contains("leaf_a"), "{folded}");
    ensure!(
        folded.lines().all(|l| l.starts_with("svcwork")),
        "other processes matched the unit selector:\n{folded}"
    );
    Ok(())
}

#[test]
fn a_keep_rule_excludes_other_processes_in_the_kernel() -> Result<()> {
    let program = build_workload("calltree", &["-O2", "-fno-omit-frame-pointer"])?;
    let dir = work_dir().join("targeting");
    std::fs::create_dir_all(&dir)?;
    let kept = dir.join("keepme");
    let dropped = dir.join("dropme");
    std::fs::copy(&program, &kept)?;
    std::fs::copy(&program, &dropped)?;
    let _kept = Workload::start(&kept, &["1", "60"])?;
    let dropped_workload = Workload::start(&dropped, &["1", "60"])?;
    let config = dir.join("scorch.toml");
    std::fs::write(
        &config,
        r#"
[[relabel]]
source_labels = ["comm"]
regex = "keepme"
action = "keep"

[[relabel]]
regex = "executable|cgroup"
action = "labeldrop"
"#,
    )?;
    let store = work_dir().join("targeting-store");
    let _ = std::fs::remove_dir_all(&store);
    let daemon = Daemon::start(
        &store,
        &["--window", "1s", "--config", &config.to_string_lossy()],
    )?;
    std::thread::sleep(Duration::from_secs(4));
    let (_, metrics) = http_get(&daemon.address, "/metrics")?;
    let metrics = String::from_utf8(metrics)?;
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(-1.0)
    };
    let (status, _, stderr) = daemon.stop()?;
    ensure!(status.success(), "{stderr}");
    let series = all_series(&store)?;
    ensure!(!series.is_empty(), "nothing stored");
    ensure!(
        series
            .iter()
            .all(|l| l.get("comm").map(String::as_str) == Some("keepme")),
        "processes other than keepme were stored: {series:?}"
    );
    ensure!(
        series
            .iter()
            .all(|l| !l.contains_key("executable") && !l.contains_key("cgroup")),
        "labeldrop did not apply: {series:?}"
    );
    // The dropped busy process was excluded in BPF: its samples were counted as filtered (one
    // CPU's worth, ~19 per second) instead of being stack-walked.
    let filtered = value("scorch_samples_filtered_total");
    let excluded = value("scorch_processes_excluded");
    ensure!(
        filtered >= 19.0 && excluded >= 1.0,
        "filtered {filtered}, excluded {excluded}:\n{metrics}"
    );
    drop(dropped_workload);
    Ok(())
}

#[test]
fn a_bad_rule_stops_startup_naming_it() -> Result<()> {
    let config = work_dir().join("bad-relabel.toml");
    std::fs::write(
        &config,
        "[[relabel]]\nsource_labels = [\"comm\"]\nregex = \"(\"\naction = \"keep\"\n",
    )?;
    let output = std::process::Command::new(scorch_tests::scorch_bin())
        .args(["run", "--store"])
        .arg(work_dir().join("bad-relabel-store"))
        .arg("--config")
        .arg(&config)
        .output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(!output.status.success());
    ensure!(stderr.contains("relabel rule 1: field `regex`"), "{stderr}");
    Ok(())
}
