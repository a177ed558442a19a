//! Short-lived processes keep their labels. A build host's loop (`/bin/true`, `python3 -c`
//! and an `sh -c` counting loop, back to back, each living milliseconds) runs in a systemd
//! service's cgroup under `scorch run` sending to the OTLP receiver, then in a container's
//! cgroup sending to the Parca test server: nearly every sample of it arrives, in the store and
//! at the receiver, with its process's name, executable, cgroup and service, as a long-lived
//! process's would, and a selector on the name finds them.

use std::{
    collections::{BTreeMap, HashSet},
    io::{Read, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{ensure, Context, Result};
use prost::Message;
use scorch::store::{Store, TimeRange};
use scorch_tests::{
    fake_remote::{FakeRemote, Protocol, Received},
    metric, read_pprof, run_scorch, Cgroup, Daemon, KillOnDrop,
};

use crate::remote::{fresh_dir, wait_drained, wait_windows};

const CONTAINER: &str = "9a8b7c6d5e4f30211f2e3d4c5b6a79880a1b2c3d4e5f60718293a4b5c6d7e8f9";

/// The loop, as `bash -c LOOP bash SECONDS PIDS`: waits for a line on its input (sent once it
/// is in its cgroup, so every child is born there), then runs the three commands back to back
/// for SECONDS, appending each child's pid to PIDS.
const LOOP: &str = r#"read -r _
end=$((SECONDS + $1))
while [ "$SECONDS" -lt "$end" ]; do
  /bin/true & echo $! >> "$2"; wait
  python3 -c 'sum(range(300000))' & echo $! >> "$2"; wait
  sh -c 'i=0; while [ $i -lt 5000 ]; do i=$((i+1)); done' & echo $! >> "$2"; wait
done
"#;

/// How long the loop runs under each daemon.
const LOOP_SECONDS: u64 = 20;

/// The share of the loop's samples that must carry every label.
const LABELLED: f64 = 0.99;

/// The labels a sample must carry, as the store and Parca name them.
const LABELS: [&str; 4] = ["comm", "executable", "cgroup", "service_name"];

/// The loop's processes, once it ended: the shell's pid and each child's.
struct Loop {
    pids: HashSet<i64>,
    /// CPU time the cgroup used (its v2 `cpu.stat`), in seconds.
    cpu_seconds: f64,
}

/// Runs the loop for [`LOOP_SECONDS`] in `cgroup`.
fn run_loop(dir: &Path, cgroup: &Cgroup, cgroup_dir: &Path) -> Result<Loop> {
    let pids_file = dir.join("loop-pids");
    let _ = std::fs::remove_file(&pids_file);
    let usage = |dir: &Path| -> Result<f64> {
        let text = std::fs::read_to_string(dir.join("cpu.stat"))?;
        let usec: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("usage_usec "))
            .and_then(|v| v.trim().parse().ok())
            .context("no usage_usec in cpu.stat")?;
        Ok(usec / 1e6)
    };
    let before = usage(cgroup_dir)?;
    let mut shell = Command::new("bash")
        .args(["-c", LOOP, "bash", &LOOP_SECONDS.to_string()])
        .arg(&pids_file)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .context("starting the loop")?;
    let _kill = KillOnDrop(shell.id());
    cgroup.add(shell.id())?;
    shell
        .stdin
        .take()
        .context("the loop's input")?
        .write_all(b"go\n")?;
    let status = shell.wait()?;
    ensure!(status.success(), "the loop failed: {status}");
    let cpu_seconds = usage(cgroup_dir)? - before;
    let mut pids: HashSet<i64> = std::fs::read_to_string(&pids_file)?
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    ensure!(
        pids.len() > 30,
        "the loop started only {} processes",
        pids.len()
    );
    pids.insert(i64::from(shell.id()));
    Ok(Loop { pids, cpu_seconds })
}

/// Samples of the loop's processes, and those carrying every one of `labels` (non-empty).
#[derive(Debug, Default)]
struct Tally {
    samples: i64,
    labelled: i64,
    /// The first few label sets lacking one, to show.
    lacking: Vec<BTreeMap<String, String>>,
}

impl Tally {
    fn add(&mut self, labels: BTreeMap<String, String>, count: i64, wanted: &[&str]) {
        self.samples += count;
        if wanted
            .iter()
            .all(|name| labels.get(*name).is_some_and(|v| !v.is_empty()))
        {
            self.labelled += count;
        } else if self.lacking.len() < 5 {
            self.lacking.push(labels);
        }
    }

    /// Fails unless at least [`LABELLED`] of more than `floor` samples carry every label.
    fn ensure(&self, what: &str, floor: i64) -> Result<()> {
        ensure!(
            self.samples > floor,
            "{what}: only {} samples of the loop's processes (more than {floor} expected from \
             the CPU time its cgroup used)",
            self.samples
        );
        ensure!(
            self.labelled as f64 >= LABELLED * self.samples as f64,
            "{what}: {} of {} samples of the loop's processes carry their labels; lacking: {:#?}",
            self.labelled,
            self.samples,
            self.lacking
        );
        println!(
            "{what}: {} of {} samples labelled",
            self.labelled, self.samples
        );
        Ok(())
    }
}

/// Every CPU sample the store holds, with its series' labels.
fn stored(store: &Path) -> Result<scorch::profile::Profile> {
    let range = TimeRange {
        from: std::time::UNIX_EPOCH,
        to: std::time::SystemTime::now() + Duration::from_secs(60),
    };
    Ok(Store::open_read_only(store)?.query(range, &|_| true)?)
}

/// The store's samples of `pids`, by their series' labels.
fn store_tally(store: &Path, pids: &HashSet<i64>) -> Result<Tally> {
    let profile = stored(store)?;
    let mut tally = Tally::default();
    for sample in &profile.samples {
        if pids.contains(&i64::from(sample.pid)) {
            let labels = sample.labels.iter().map(|(k, v)| (k.clone(), v.clone()));
            tally.add(labels.collect(), sample.count as i64, &LABELS);
        }
    }
    Ok(tally)
}

/// Samples in a received pprof (gzipped or not).
fn pprof_samples(received: &Received) -> Result<i64> {
    let mut raw = Vec::new();
    let bytes = if received.pprof.starts_with(&[0x1f, 0x8b]) {
        flate2::read::GzDecoder::new(&received.pprof[..]).read_to_end(&mut raw)?;
        &raw[..]
    } else {
        &received.pprof[..]
    };
    let profile = scorch::pprof::Profile::decode(bytes)?;
    Ok(profile
        .sample
        .iter()
        .map(|s| s.value.first().copied().unwrap_or(0))
        .sum())
}

/// What the fake received of `pids`: the labels it keys a process by (`pid_key`), those it
/// must carry (`wanted`).
fn received_tally(
    fake: &FakeRemote,
    pids: &HashSet<i64>,
    pid_key: &str,
    wanted: &[&str],
) -> Result<Tally> {
    let mut tally = Tally::default();
    for received in fake.received().iter().filter(|r| r.accepted) {
        let Some(pid) = received.labels.get(pid_key).and_then(|p| p.parse().ok()) else {
            continue;
        };
        if pids.contains(&pid) {
            tally.add(received.labels.clone(), pprof_samples(received)?, wanted);
        }
    }
    Ok(tally)
}

/// Samples a selector on `comm` finds of `pids`, read back from `scorch query`'s pprof, and
/// those the store holds under that name.
fn selector_finds(store: &Path, dir: &Path, comm: &str, pids: &HashSet<i64>) -> Result<()> {
    let output = dir.join(format!("query-{comm}.pb.gz"));
    run_scorch(&[
        "query",
        "--store",
        &store.to_string_lossy(),
        "--since",
        "1h",
        "--match",
        &format!(r#"{{comm="{comm}"}}"#),
        "-o",
        &output.to_string_lossy(),
    ])?;
    let found: i64 = scorch_tests::named_samples(&read_pprof(&output)?)
        .iter()
        .filter(|s| pids.contains(&s.pid))
        .map(|s| s.count)
        .sum();
    let profile = stored(store)?;
    let named: i64 = profile
        .samples
        .iter()
        .filter(|s| pids.contains(&i64::from(s.pid)) && s.comm == comm)
        .map(|s| s.count as i64)
        .sum();
    ensure!(
        found > 0 && found == named,
        "{{comm=\"{comm}\"}} found {found} samples of the loop, the store holds {named} under \
         that name"
    );
    Ok(())
}

/// The loop in a cgroup made at `cgroup_path` in the v2 tree, under a daemon sending to a
/// fake `protocol` server; checks the store and the server.
fn loop_keeps_its_labels(name: &str, protocol: Protocol, cgroup_path: &str) -> Result<Loop> {
    let unified = Path::new("/sys/fs/cgroup/unified");
    ensure!(
        unified.join("cgroup.procs").exists(),
        "this test needs the v2 cgroup tree at {}",
        unified.display()
    );
    let dir = fresh_dir(name)?;
    let cgroup = Cgroup::create(unified, cgroup_path)?;
    let cgroup_dir: PathBuf = unified.join(cgroup_path.trim_start_matches('/'));
    let fake = FakeRemote::start(protocol)?;
    let store = dir.join("store");
    let protocol_name = match protocol {
        Protocol::Otlp => "otlp",
        Protocol::Parca => "parca",
        _ => anyhow::bail!("no such protocol here"),
    };
    let daemon = Daemon::start(
        &store,
        &[
            "--window",
            "5s",
            "--remote-url",
            &fake.url(),
            "--remote-protocol",
            protocol_name,
        ],
    )?;
    std::thread::sleep(Duration::from_millis(1500));
    let run = run_loop(&dir, &cgroup, &cgroup_dir)?;
    // The window holding the loop's last samples, then its delivery.
    let written = metric(&daemon.address, "scorch_windows_written_total")?;
    wait_windows(&daemon, written, 1.0)?;
    wait_drained(&daemon, &fake, Duration::from_secs(30))?;
    let unlabelled = metric(&daemon.address, "scorch_samples_unlabelled_total")?;
    let (status, _, stderr) = daemon.stop()?;
    ensure!(
        status.success(),
        "scorch run exited with {status}:\n{stderr}"
    );
    println!(
        "{name}: {} processes, {:.2} s of CPU; samples without labels (all processes): \
         {unlabelled}",
        run.pids.len(),
        run.cpu_seconds
    );

    // At the daemon's 19 Hz, a third of what the cgroup's CPU time gives is a floor that only
    // a loop that did not run, or samples lost, falls under (the share is the test; the floor
    // keeps it from being read off a handful of samples).
    let floor = (run.cpu_seconds * 19.0 / 3.0) as i64;
    store_tally(&store, &run.pids)?.ensure(&format!("{name}: the store"), floor)?;
    let (pid_key, wanted): (&str, &[&str]) = match protocol {
        Protocol::Otlp => (
            "process.pid",
            &["comm", "process.executable.path", "cgroup", "service.name"],
        ),
        _ => ("pid", &LABELS),
    };
    let received = received_tally(&fake, &run.pids, pid_key, wanted)?;
    if protocol == Protocol::Otlp {
        // `service.name` is required, so an unlabelled process gets `unknown_service:...`.
        let unknown = fake
            .received()
            .iter()
            .filter(|r| {
                r.labels
                    .get(pid_key)
                    .and_then(|p| p.parse().ok())
                    .is_some_and(|p: i64| run.pids.contains(&p))
                    && r.labels
                        .get("service.name")
                        .is_some_and(|s| s.starts_with("unknown_service"))
            })
            .count();
        ensure!(
            unknown as f64 <= (1.0 - LABELLED) * fake.received().len() as f64,
            "{unknown} profiles of the loop's processes arrived as unknown_service"
        );
    }
    received.ensure(&format!("{name}: the {protocol_name} server"), floor)?;
    // The name an exec of /usr/bin/python3 gives the process, whatever the link leads to.
    selector_finds(&store, &dir, "python3", &run.pids)?;
    Ok(run)
}

#[test]
fn short_lived_processes_of_a_service_keep_their_labels_in_the_store_and_otlp() -> Result<()> {
    let unit = "scorch-churn-labels.service";
    loop_keeps_its_labels(
        "labels-churn-otlp",
        Protocol::Otlp,
        &format!("/system.slice/{unit}"),
    )?;
    Ok(())
}

#[test]
fn short_lived_processes_of_a_container_keep_its_labels_in_the_store_and_parca() -> Result<()> {
    let path = format!("/system.slice/docker-{CONTAINER}.scope");
    let run = loop_keeps_its_labels("labels-churn-parca", Protocol::Parca, &path)?;
    // Every sample of the loop names the container.
    let store = scorch_tests::work_dir().join("labels-churn-parca/store");
    let tally = store_tally(&store, &run.pids)?;
    let profile = stored(&store)?;
    let in_container: i64 = profile
        .samples
        .iter()
        .filter(|s| {
            run.pids.contains(&i64::from(s.pid))
                && s.labels.get("container_id").map(String::as_str) == Some(CONTAINER)
        })
        .map(|s| s.count as i64)
        .sum();
    // The others, by process and the cgroup they were labelled with: where they came from.
    let mut elsewhere: BTreeMap<(u32, String, String), i64> = BTreeMap::new();
    for s in &profile.samples {
        if run.pids.contains(&i64::from(s.pid))
            && s.labels.get("container_id").map(String::as_str) != Some(CONTAINER)
        {
            let label = |name: &str| s.labels.get(name).cloned().unwrap_or_default();
            *elsewhere
                .entry((s.pid, label("comm"), label("cgroup")))
                .or_default() += s.count as i64;
        }
    }
    ensure!(
        in_container as f64 >= LABELLED * tally.samples as f64,
        "{in_container} of {} samples of the loop name its container; the others (pid, comm, \
         cgroup): {elsewhere:?}",
        tally.samples
    );
    Ok(())
}
