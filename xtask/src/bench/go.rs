//! `cargo xtask bench --only go`: what stripped Go binaries cost scorch, written to
//! `target/bench/go.md`.
//!
//! - **Naming.** `agent/benches/gosym.rs`: 10,000 pcs of `tests/workloads/goservice.go` (a
//!   JSON service, thousands of functions) named from the `.gopclntab` of its `-ldflags=-s -w`
//!   build, beside the same pcs named from the DWARF of its plain build: open + first pass,
//!   second pass, RSS growth, each in a fresh process, and whether the two name them alike.
//! - **Daemon with 20 stripped Go binaries.** `tests/workloads/govariant.go` built 20 times
//!   with `-ldflags="-s -w -X main.variant=N"`, so each is a distinct file with its own Go
//!   build id (checked with `go tool buildid`) and the daemon parses and caches 20 binaries,
//!   not one. Each wakes every 50 ms for about a millisecond of work, so at 19 Hz the daemon
//!   catches all of them while the CPUs stay mostly idle. A fresh `scorch run` at 19 Hz with
//!   the 20 running, and one with none running (the baseline), the order alternating by run:
//!   after a warm-up, the daemon's CPU over the measured span (its own cgroup), its median RSS
//!   (`VmRSS` once a second), its BPF maps, symbol cache and unwind tables (`/metrics`).
//!   Each pair runs twice: with a relabel rule keeping only the govariant processes (the
//!   others excluded in the kernel), which isolates what the Go binaries cost from whatever
//!   else the machine runs, and profiling the whole host, which is what a deployment sees but
//!   on a shared machine also measures the other processes (a parallel build's compilers fill
//!   the symbol cache towards its budget). The path is shown, not assumed: the store of each
//!   run with the Go processes is queried for their samples, which must be named with
//!   govariant.go's own functions.

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{ensure, Context, Result};

use crate::{
    bench::{
        harness::{start_daemon, stop},
        measure::{
            cargo_bench, command_output, daemon_metric, load_average, median, path_str, sample_rss,
            spread, status_kib, CpuAccount, Processes,
        },
        results::{BenchResult, Cell, Table},
        Bench,
    },
    run_command,
};

const ADDRESS: &str = "127.0.0.1:17095";
const PROCESSES: usize = 20;
const WARM_UP: Duration = Duration::from_secs(20);
const SPAN: Duration = Duration::from_secs(40);
/// The functions of `tests/workloads/govariant.go` that do its work.
const GOVARIANT_FUNCTIONS: [&str; 4] = ["main.work", "main.mix", "main.render", "main.tally"];

pub fn go(root: &Path, scorch: &Path, runs: usize, command: String) -> Result<BenchResult> {
    let runs = runs.max(3);
    let load_before = load_average();
    let dir = root.join("target/bench/go");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // A copy of its own: the bench runs for a quarter of an hour, and a `cargo build` in the
    // same tree meanwhile would otherwise swap the binary under test between runs.
    let pinned = dir.join("scorch");
    std::fs::copy(scorch, &pinned)
        .with_context(|| format!("copying {} to {}", scorch.display(), pinned.display()))?;
    let scorch = pinned.as_path();
    let naming = naming_bench(root)?;
    let binaries = build_variants(root, &dir)?;
    let daemons = daemon_costs(scorch, &binaries, &dir, runs)?;
    let load_after = load_average();

    let mut out = String::new();
    let commit = command_output("git", &["rev-parse", "--short", "HEAD"]);
    writeln!(out, "# Stripped Go binaries, commit {commit}\n")?;
    writeln!(
        out,
        "`cargo xtask bench --only go --runs {runs}`; {}; load average {load_before} at the start, \
         {load_after} at the end ({} CPUs).\n",
        command_output("go", &["version"]),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    )?;
    writeln!(out, "## Naming pcs: `.gopclntab` beside DWARF\n")?;
    writeln!(out, "{}", naming.trim_end())?;
    for scope in [Scope::Kept, Scope::Host] {
        daemon_section(&mut out, scope, &daemons, runs)?;
    }
    writeln!(
        out,
        "\nWhat the store of each run with the Go processes holds of them (`scorch query --match \
         '{{comm=~\"govariant-.*\"}}' --format folded`), the path measured:\n"
    )?;
    writeln!(
        out,
        "| daemon | run | samples | with a govariant.go function (`{}`) | every user frame \
         named | processes sampled, named |",
        GOVARIANT_FUNCTIONS.join("`, `")
    )?;
    writeln!(out, "|---|---|---|---|---|---|")?;
    for scope in [Scope::Kept, Scope::Host] {
        let named = daemons
            .iter()
            .filter(|d| d.scope == scope)
            .filter_map(|d| d.named.as_ref());
        for (run, named) in named.enumerate() {
            let share = |n: u64| 100.0 * n as f64 / named.samples.max(1) as f64;
            writeln!(
                out,
                "| {} | {} | {} | {} ({:.1}%) | {} ({:.1}%) | {}, {} |",
                scope.name(),
                run + 1,
                named.samples,
                named.in_govariant,
                share(named.in_govariant),
                named.all_named,
                share(named.all_named),
                named.processes,
                named.processes_named,
            )?;
        }
    }
    let path = root.join("target/bench/go.md");
    std::fs::write(&path, &out).with_context(|| format!("writing {}", path.display()))?;
    print!("{out}");
    eprintln!("bench: report written to {}", path.display());

    let mut result = BenchResult::new(Bench::Go, command);
    for scope in [Scope::Kept, Scope::Host] {
        let mut table = Table::new(
            match scope {
                Scope::Kept => "kept",
                Scope::Host => "host",
            },
            &format!(
                "The daemon at 19 Hz, {}, {} s measured after {} s",
                scope.name(),
                SPAN.as_secs(),
                WARM_UP.as_secs()
            ),
            "",
            &[
                "CPU, % of a core",
                "RSS MiB",
                "BPF maps MiB",
                "RSS + maps MiB",
                "symbol cache MiB",
                "unwind tables MiB",
            ],
        )
        .with_note(scope.why());
        for with_go in [true, false] {
            let runs: Vec<&DaemonCost> = daemons
                .iter()
                .filter(|d| d.scope == scope && d.with_go == with_go)
                .collect();
            let column = |f: &dyn Fn(&DaemonCost) -> f64, decimals| {
                Cell::of(&runs.iter().map(|d| f(d)).collect::<Vec<_>>(), decimals)
            };
            table.row(
                if with_go {
                    format!("with {PROCESSES} stripped Go binaries running")
                } else {
                    "without them".to_owned()
                },
                vec![
                    column(&|d| d.core_percent, 2),
                    column(&|d| d.rss_mib, 1),
                    column(&|d| d.maps_mib, 1),
                    column(&|d| d.rss_mib + d.maps_mib, 1),
                    column(&|d| d.symbol_cache_mib, 1),
                    column(&|d| d.unwind_tables_mib, 1),
                ],
            );
        }
        result.tables.push(table);
    }
    result.lines = naming.lines().map(str::to_owned).collect();
    Ok(result)
}

/// One scope's table: the daemon with the Go processes and without, and the difference.
fn daemon_section(
    out: &mut String,
    scope: Scope,
    daemons: &[DaemonCost],
    runs: usize,
) -> Result<()> {
    writeln!(
        out,
        "\n## Daemon at 19 Hz, {}, with {PROCESSES} distinct stripped Go binaries running and \
         without, {} s measured after {} s\n",
        scope.name(),
        SPAN.as_secs(),
        WARM_UP.as_secs()
    )?;
    writeln!(
        out,
        "{} Fresh `scorch run` each time, {runs} runs of each in alternating order: medians \
         [min-max]. The load average is the host's (1 min) at the start of the measured span.\n",
        scope.why()
    )?;
    writeln!(
        out,
        "| | CPU, % of a core | RSS, MiB | RSS at the end: heap / files, MiB | BPF maps, MiB \
         | RSS + maps, MiB | symbol cache, MiB | unwind tables, MiB | samples/s | load average |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|---|---|---|")?;
    let rows = |with_go: bool| {
        daemons
            .iter()
            .filter(move |d| d.scope == scope && d.with_go == with_go)
    };
    for with_go in [true, false] {
        let column = |f: &dyn Fn(&DaemonCost) -> f64| rows(with_go).map(f).collect::<Vec<_>>();
        writeln!(
            out,
            "| {} | {} | {} | {} / {} | {} | {} | {} | {} | {} | {} |",
            if with_go {
                format!("with the {PROCESSES} Go processes")
            } else {
                "without them (baseline)".to_owned()
            },
            spread(&column(&|d| d.core_percent), 2),
            spread(&column(&|d| d.rss_mib), 1),
            spread(&column(&|d| d.anon_mib), 1),
            spread(&column(&|d| d.file_mib), 1),
            spread(&column(&|d| d.maps_mib), 1),
            spread(&column(&|d| d.rss_mib + d.maps_mib), 1),
            spread(&column(&|d| d.symbol_cache_mib), 1),
            spread(&column(&|d| d.unwind_tables_mib), 1),
            spread(&column(&|d| d.samples_per_second), 1),
            spread(&column(&|d| d.load), 2),
        )?;
    }
    let of = |with_go: bool, f: &dyn Fn(&DaemonCost) -> f64| median(rows(with_go).map(f).collect());
    writeln!(
        out,
        "\nWith the {PROCESSES} Go processes, against without: RSS {:+.1} MiB, RSS + maps {:+.1} \
         MiB, symbol cache {:+.1} MiB, CPU {:+.2}% of a core (medians).",
        of(true, &|d| d.rss_mib) - of(false, &|d| d.rss_mib),
        of(true, &|d| d.rss_mib + d.maps_mib) - of(false, &|d| d.rss_mib + d.maps_mib),
        of(true, &|d| d.symbol_cache_mib) - of(false, &|d| d.symbol_cache_mib),
        of(true, &|d| d.core_percent) - of(false, &|d| d.core_percent),
    )?;
    Ok(())
}

/// The gosym bench's markdown (its progress goes to this terminal).
fn naming_bench(root: &Path) -> Result<String> {
    let stdout = cargo_bench(root, "gosym", |command| {
        command.env("SCORCH_BENCH_GOSYM_DIR", root.join("target/bench/gosym"));
    })?;
    // cargo's harness-less bench prints only what the bench does; keep from its heading on.
    let start = stdout
        .find("### ")
        .context("no table in the gosym bench's output")?;
    Ok(stdout[start..].to_owned())
}

/// `go build` with a build cache under `dir`, so the bench neither needs nor fills the user's.
fn go_build(dir: &Path) -> Command {
    let mut command = Command::new("go");
    command
        .arg("build")
        .env("GOCACHE", dir.join("go-cache"))
        .env("GOFLAGS", "")
        .env("CGO_ENABLED", "0");
    command
}

/// The 20 stripped builds of govariant.go, each with its own variant, checked stripped and
/// with 20 distinct Go build ids.
fn build_variants(root: &Path, dir: &Path) -> Result<Vec<PathBuf>> {
    let source = root.join("tests/workloads/govariant.go");
    let mut binaries = Vec::new();
    let mut ids = BTreeSet::new();
    for variant in 0..PROCESSES {
        // The name is the process's comm, which the store's series are labelled with.
        let binary = dir.join(format!("govariant-{variant:02}"));
        run_command(
            go_build(dir)
                .arg("-o")
                .arg(&binary)
                .arg(format!("-ldflags=-s -w -X main.variant={variant}"))
                .arg(&source),
        )?;
        let sections = command_output("readelf", &["-S", "-W", path_str(&binary)?]);
        ensure!(
            sections.contains(".gopclntab")
                && !sections.contains(".symtab")
                && !sections.contains("debug_"),
            "{} is not a stripped Go binary:\n{sections}",
            binary.display()
        );
        let id = command_output("go", &["tool", "buildid", path_str(&binary)?]);
        ensure!(!id.is_empty(), "no Go build id in {}", binary.display());
        ids.insert(id);
        binaries.push(binary);
    }
    ensure!(
        ids.len() == PROCESSES,
        "{PROCESSES} builds of govariant.go have only {} distinct Go build ids",
        ids.len()
    );
    eprintln!("bench: {PROCESSES} stripped govariant builds, {PROCESSES} distinct Go build ids");
    Ok(binaries)
}

/// What a store holds of the Go processes' samples.
struct Named {
    samples: u64,
    /// Samples with a frame of govariant.go's own functions.
    in_govariant: u64,
    /// Samples none of whose user frames is a placeholder (`[govariant-03]`, `[unknown]`).
    all_named: u64,
    /// Distinct processes (by comm) sampled, and those with a govariant.go frame.
    processes: usize,
    processes_named: usize,
}

/// What the daemon profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// Only the govariant processes: a relabel rule keeps them, the rest is excluded in the
    /// kernel.
    Kept,
    /// Every process on the host.
    Host,
}

impl Scope {
    fn name(self) -> &'static str {
        match self {
            Scope::Kept => "keeping only the Go processes",
            Scope::Host => "profiling the whole host",
        }
    }

    fn why(self) -> &'static str {
        match self {
            Scope::Kept => {
                "A `[[relabel]]` rule keeps only processes whose comm is `govariant-N`: the \
                 difference below is what the Go binaries cost, whatever else the host runs. \
                 The baseline's few samples a second are of other new processes, taken before \
                 the daemon labelled and excluded them; its store holds none."
            }
            Scope::Host => {
                "What a deployment runs. On a shared machine the figures also measure whatever \
                 else runs (other processes' binaries fill the symbol cache towards its 256 MiB \
                 budget), so the difference is only as steady as the host's other load."
            }
        }
    }
}

struct DaemonCost {
    scope: Scope,
    with_go: bool,
    core_percent: f64,
    rss_mib: f64,
    /// The RSS at the end of the span split: heap (`RssAnon`) and mapped files (`RssFile`).
    anon_mib: f64,
    file_mib: f64,
    maps_mib: f64,
    symbol_cache_mib: f64,
    unwind_tables_mib: f64,
    samples_per_second: f64,
    /// The host's 1-minute load average as the measured span starts: how noisy it was.
    load: f64,
    /// Only for runs with the Go processes.
    named: Option<Named>,
}

fn daemon_costs(
    scorch: &Path,
    binaries: &[PathBuf],
    dir: &Path,
    runs: usize,
) -> Result<Vec<DaemonCost>> {
    let stores = dir.join("stores");
    let _ = std::fs::remove_dir_all(&stores);
    std::fs::create_dir_all(&stores)?;
    let keep = dir.join("keep-govariant.toml");
    std::fs::write(
        &keep,
        "[[relabel]]\nsource_labels = [\"comm\"]\nregex = \"govariant-[0-9]+\"\naction = \"keep\"\n",
    )
    .with_context(|| format!("writing {}", keep.display()))?;
    let mut order = [
        (Scope::Kept, true),
        (Scope::Kept, false),
        (Scope::Host, true),
        (Scope::Host, false),
    ];
    let mut daemons = Vec::new();
    for run in 0..runs {
        // Each run goes the other way round: each case by turns early and late.
        if run > 0 {
            order.reverse();
        }
        for (scope, with_go) in order {
            let store = stores.join(format!("store-{run}-{scope:?}-{with_go}"));
            // Started for this run and stopped after it, so the baseline runs without them and
            // each daemon meets them as new processes, as it would at a restart.
            let processes = if with_go {
                let children = binaries
                    .iter()
                    .map(|binary| {
                        Command::new(binary)
                            .arg("600")
                            .stdout(Stdio::null())
                            .spawn()
                            .with_context(|| format!("starting {}", binary.display()))
                    })
                    .collect::<Result<Vec<_>>>()?;
                Some(Processes(children))
            } else {
                None
            };
            let config = match scope {
                Scope::Kept => vec!["--config", path_str(&keep)?],
                Scope::Host => Vec::new(),
            };
            let mut cost = daemon_run(scorch, &store, scope, with_go, &config)?;
            drop(processes);
            if with_go {
                cost.named = Some(query_named(scorch, &store)?);
            }
            eprintln!(
                "bench: run {}, daemon {}, {} the Go processes: {:.2}% of a core, RSS {:.1} MiB \
                 (heap {:.1}, files {:.1} at the end), maps {:.1} MiB, symbol cache {:.1} MiB, unwind tables {:.1} MiB, load {:.2}{}",
                run + 1,
                scope.name(),
                if with_go { "with" } else { "without" },
                cost.core_percent,
                cost.rss_mib,
                cost.anon_mib,
                cost.file_mib,
                cost.maps_mib,
                cost.symbol_cache_mib,
                cost.unwind_tables_mib,
                cost.load,
                cost.named.as_ref().map_or(String::new(), |n| format!(
                    "; {} Go samples stored, {} with a govariant.go function, from {} of {} \
                     processes",
                    n.samples, n.in_govariant, n.processes_named, n.processes
                )),
            );
            daemons.push(cost);
        }
    }
    Ok(daemons)
}

fn daemon_run(
    scorch: &Path,
    store: &Path,
    scope: Scope,
    with_go: bool,
    extra: &[&str],
) -> Result<DaemonCost> {
    let daemon = start_daemon(scorch, store, 19, ADDRESS, extra)?;
    let pid = daemon.0[0].id();
    let account = CpuAccount::of_process(pid)?;
    std::thread::sleep(WARM_UP);
    let load = load_average()
        .split_whitespace()
        .next()
        .and_then(|l| l.parse().ok())
        .unwrap_or(f64::NAN);
    let before = account.cpu_seconds()?;
    let samples_before = daemon_metric(ADDRESS, "scorch_samples_total")?;
    let started = Instant::now();
    let rss = sample_rss(pid, SPAN, Duration::from_secs(1))?;
    let cpu = account.cpu_seconds()? - before;
    let elapsed = started.elapsed().as_secs_f64();
    let (anon, file) = (status_kib(pid, "RssAnon:")?, status_kib(pid, "RssFile:")?);
    let mib = |name: &str| -> Result<f64> { Ok(daemon_metric(ADDRESS, name)? / (1 << 20) as f64) };
    let cost = DaemonCost {
        scope,
        with_go,
        core_percent: cpu / elapsed * 100.0,
        rss_mib: median(rss),
        anon_mib: anon as f64 / 1024.0,
        file_mib: file as f64 / 1024.0,
        maps_mib: mib("scorch_bpf_map_memory_bytes")?,
        symbol_cache_mib: mib("scorch_symbol_cache_bytes")?,
        unwind_tables_mib: mib("scorch_unwind_tables_bytes")?,
        samples_per_second: (daemon_metric(ADDRESS, "scorch_samples_total")? - samples_before)
            / elapsed,
        load,
        named: None,
    };
    stop(daemon).with_context(|| {
        format!(
            "scorch run {}, {} the Go processes",
            scope.name(),
            if with_go { "with" } else { "without" }
        )
    })?;
    drop(account);
    Ok(cost)
}

/// The Go processes' samples in `store`, and how they were named.
fn query_named(scorch: &Path, store: &Path) -> Result<Named> {
    let output = Command::new(scorch)
        .args(["query", "--since", "1h", "--format", "folded"])
        .args(["--match", r#"{comm=~"govariant-.*"}"#, "--store"])
        .arg(store)
        .stderr(Stdio::null())
        .output()
        .context("running scorch query")?;
    ensure!(
        output.status.success(),
        "scorch query on {} exited with {}",
        store.display(),
        output.status
    );
    let text = String::from_utf8_lossy(&output.stdout);
    let mut named = Named {
        samples: 0,
        in_govariant: 0,
        all_named: 0,
        processes: 0,
        processes_named: 0,
    };
    let (mut processes, mut processes_named) = (BTreeSet::new(), BTreeSet::new());
    for (comm, user, count) in crate::bench::measure::folded_user_stacks(&text) {
        named.samples += count;
        processes.insert(comm.to_owned());
        if user.iter().any(|f| GOVARIANT_FUNCTIONS.contains(f)) {
            named.in_govariant += count;
            processes_named.insert(comm.to_owned());
        }
        if !user.iter().any(|f| f.starts_with('[')) {
            named.all_named += count;
        }
    }
    named.processes = processes.len();
    named.processes_named = processes_named.len();
    ensure!(
        named.samples > 0 && named.in_govariant > 0,
        "the store {} holds {} samples of the Go processes, {} of them with a govariant.go \
         function: the Go table named nothing",
        store.display(),
        named.samples,
        named.in_govariant
    );
    Ok(named)
}
