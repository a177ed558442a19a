//! Project automation: `cargo xtask setup | build | run | test | vm-test | bench | package`.
//!
//! Everything a fresh Debian/Ubuntu machine needs is installed by `setup`, which every other
//! command that needs it runs first, so `cargo xtask test` works from a clean clone.

mod bench;
mod bench_daemon;
mod bench_go;
mod bench_heap;
mod bench_overhead;
mod bench_python;
mod bench_scale;
mod bench_offcpu;
mod bench_slowdown;
mod lint;
mod measure;
mod package;
mod setup;
mod vmtest;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, ensure, Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the toolchain pieces and Debian packages (idempotent).
    Setup,
    /// Build the scorch binary (release) with its embedded BPF program, then the pair to copy
    /// to other machines: `target/dist/scorch` (stripped) and `target/dist/scorch.debug`.
    Build,
    /// Build, then run `scorch ARGS` (through sudo when not root).
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build the .deb (target/debian/): binary, systemd unit, config, man pages, completions.
    Package {
        /// Then run the packaging checks `test` runs: the unit, the manifests, and the .deb's
        /// install, run and purge (as root).
        #[arg(long)]
        check: bool,
    },
    /// Check that the agent's modules import only downward (the order lib.rs declares) and
    /// that no file has more than 1,000 lines of non-test code.
    Lint,
    /// Setup, lints, unit tests, packaging checks, the BPF integration tests one at a time,
    /// then the kernel matrix (`vm-test`).
    Test {
        /// Only run integration tests whose name contains this.
        filter: Option<String>,
    },
    /// Boot Debian's kernels under qemu (TCG) with the release build in an initramfs, and
    /// run the same checks there and on the host: `scorch check`, a recording of a known call
    /// tree, kernel stacks, `scorch run` + `query` + /healthz. Report in target/vm-test/.
    VmTest {
        /// Kernel version to boot, repeatable: `6.1`, `6.12` (the newest Debian cloud build
        /// apt knows), or an exact ABI such as `6.1.0-57`; `:FLAVOUR` for another Debian
        /// flavour than cloud-amd64 (`6.1:rt-amd64`). Default: 6.1 and 6.12.
        #[arg(long = "kernel")]
        kernels: Vec<String>,
        /// Skip the host kernel's row.
        #[arg(long)]
        no_host: bool,
    },
    /// Measure BPF cost per sample, CPU time and RSS beside `perf record`, and kallsyms speed.
    Bench {
        /// Seconds per recording (the README's published figures use 60).
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Recordings, each with scorch and perf side by side (default 3; `slowdown` and `offcpu`: rounds,
        /// default 5; `scale`: runs of each cell, default 1).
        #[arg(long)]
        runs: Option<usize>,
        /// Run only one part: `record` (scorch record vs perf, BPF cost, kallsyms),
        /// `symbolize`, `daemon` (scorch run steady state, store size, query time),
        /// `remote` (encode+send CPU, RSS with the server down, backlog drain speed),
        /// `unwind` (unwind-table build time and size for libc, ld.so, libstdc++),
        /// `walk` (the BPF unwinder's ns per sample and table memory on deep stacks), or
        /// `views` (the UI's timeline over 24 h and a diff of two 1 h ranges), or
        /// `overhead` (record vs perf vs bpftrace, the daemon under process churn, CPU by
        /// sampling rate: `target/bench/overhead.md`), or `heap` (what holds the daemon's
        /// heap at its peak under process churn, from heaptrack: `target/bench/heap.md`), or
        /// `churn` (the daemon under process churn alone, beside `--baseline`:
        /// `target/bench/churn.md`), or `python` (the Python walk's cost:
        /// `target/bench/python.md`), or `go` (stripped Go binaries named from `.gopclntab`
        /// beside DWARF, and the daemon with 20 of them running: `target/bench/go.md`), or
        /// `slowdown` (the work two no-frame-pointer workers lose under perf -g, perf's DWARF
        /// unwinding and scorch at 19, 99 and 999 Hz, and scorch's bpf calls:
        /// `target/bench/slowdown.md`), or `offcpu` (a context switch's cost with `record
        /// --off-cpu` against without, and against perf recording every switch:
        /// `target/bench/offcpu.md`), or `scale` (the daemon with 100 to 1,000 processes of
        /// 10 to 300 distinct binaries, and with libLLVM: `target/bench/scale.md`).
        #[arg(long)]
        only: Option<String>,
        /// Windows of 10 s the daemon bench measures.
        #[arg(long, default_value_t = 30)]
        daemon_windows: u64,
        /// With `--only churn` or `slowdown`: a scorch binary built from an earlier commit, run
        /// in turn with this one (e.g. from `git worktree add /tmp/base REV && cd /tmp/base && cargo xtask
        /// build`: `/tmp/base/target/release/scorch`).
        #[arg(long)]
        baseline: Option<PathBuf>,
        /// With `--only slowdown`: compare only at this sampling rate (repeatable; default 19,
        /// 99 and 999 Hz).
        #[arg(long = "rate")]
        rates: Vec<u64>,
        /// With `--only churn`: also a daemon with `--off-cpu`, in the same rounds.
        #[arg(long)]
        off_cpu: bool,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = workspace_root();
    match cli.command {
        Task::Setup => setup::setup(),
        Task::Lint => lint::lint(&root),
        Task::Build => {
            let scorch = build(&root)?;
            package::dist(&root, &scorch).map(|_| ())
        }
        Task::Run { args } => run(&root, &args),
        Task::Test { filter } => test(&root, filter.as_deref()),
        Task::VmTest { kernels, no_host } => {
            setup::setup()?;
            let scorch = build(&root)?;
            let kernels = if kernels.is_empty() {
                vmtest::DEFAULT_KERNELS
                    .iter()
                    .map(|k| k.to_string())
                    .collect()
            } else {
                kernels
            };
            vmtest::vm_test(&root, &scorch, &kernels, !no_host)
        }
        Task::Package { check } => {
            setup::setup()?;
            let scorch = build(&root)?;
            if check {
                check_packaging(&root, &scorch)
            } else {
                package::package(&root, &scorch).map(|_| ())
            }
        }
        Task::Bench {
            seconds,
            runs,
            only,
            daemon_windows,
            baseline,
            rates,
            off_cpu,
        } => {
            if only.as_deref() == Some("unwind") {
                return bench::unwind_report(&root);
            }
            if only.as_deref() == Some("views") {
                return bench::views_report(&root);
            }
            ensure!(
                rates.is_empty() || only.as_deref() == Some("slowdown"),
                "--rate is for --only slowdown"
            );
            setup::setup()?;
            let scorch = build(&root)?;
            if only.as_deref() == Some("slowdown") {
                let rates = if rates.is_empty() {
                    bench_slowdown::RATES.to_vec()
                } else {
                    rates
                };
                let report = bench_slowdown::slowdown_report(
                    &root,
                    &scorch,
                    baseline.as_deref(),
                    runs.unwrap_or(5),
                    &rates,
                )?;
                print!("{report}");
                return Ok(());
            }
            if only.as_deref() == Some("churn") {
                let runs = runs.unwrap_or(3);
                let phases = bench_overhead::Phases::standard(seconds);
                let report = bench_overhead::churn_ab(
                    &root,
                    &scorch,
                    baseline.as_deref(),
                    off_cpu,
                    runs,
                    phases,
                )?;
                print!("{report}");
                return Ok(());
            }
            ensure!(!off_cpu, "--off-cpu is for --only churn");
            ensure!(
                baseline.is_none() || matches!(only.as_deref(), Some("slowdown" | "walk")),
                "--baseline is for --only churn, slowdown or walk"
            );
            bench::bench(
                &root,
                &scorch,
                seconds,
                runs,
                only.as_deref(),
                daemon_windows,
                baseline.as_deref(),
            )
        }
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Runs a command, failing with its command line when it fails.
pub fn run_command(command: &mut Command) -> Result<()> {
    let status = command
        .status()
        .with_context(|| format!("starting {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed: {status}");
    }
    Ok(())
}

/// Builds the release binary and returns its path.
fn build(root: &Path) -> Result<PathBuf> {
    setup::ensure_bpf_toolchain()?;
    run_command(Command::new("cargo").current_dir(root).args([
        "build",
        "--release",
        "--package",
        "scorch",
    ]))?;
    Ok(root.join("target/release/scorch"))
}

fn run(root: &Path, args: &[String]) -> Result<()> {
    let scorch = build(root)?;
    let mut command = if effective_uid() == 0 {
        Command::new(&scorch)
    } else {
        let mut sudo = Command::new("sudo");
        sudo.arg("-E").arg(&scorch);
        sudo
    };
    command.args(args);
    let status = command
        .status()
        .with_context(|| format!("starting {command:?}"))?;
    std::process::exit(status.code().unwrap_or(1));
}

fn test(root: &Path, filter: Option<&str>) -> Result<()> {
    setup::setup()?;
    let cargo = |args: &[&str]| run_command(Command::new("cargo").current_dir(root).args(args));
    cargo(&["fmt", "--all", "--check"])?;
    lint::lint(root)?;
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ])?;
    // Unit tests: pure stages, parsers, encoders. No BPF.
    cargo(&["test", "--workspace", "--exclude", "scorch-tests"])?;
    let scorch = build(root)?;
    // Packaging: the unit, the manifests, the .deb's install-run-purge cycle. Skipped when
    // only some integration tests are asked for.
    if filter.is_none() {
        check_packaging(root, &scorch)?;
    }
    // Integration tests load the real BPF program and profile workloads they build. They run
    // one at a time: each one samples the whole machine, so two at once would see each other.
    let mut command = Command::new("cargo");
    command
        .current_dir(root)
        .env("SCORCH_BIN", &scorch)
        // A failing test's error, not a backtrace of where it was returned, is what the end
        // of a long log must show; panics keep theirs (RUST_BACKTRACE).
        .env("RUST_LIB_BACKTRACE", "0")
        .args(["test", "--package", "scorch-tests", "--"])
        .args(["--test-threads=1", "--nocapture"]);
    if let Some(filter) = filter {
        command.arg(filter);
    }
    run_command(&mut command)?;
    // The kernel matrix: the same build on Debian's 6.1 and 6.12 under qemu, and the host.
    if filter.is_none() {
        let kernels: Vec<String> = vmtest::DEFAULT_KERNELS
            .iter()
            .map(|k| k.to_string())
            .collect();
        vmtest::vm_test(root, &scorch, &kernels, true)?;
    }
    Ok(())
}

/// The unit, the manifests, then the .deb built from `scorch`, installed, run and purged.
fn check_packaging(root: &Path, scorch: &Path) -> Result<()> {
    package::check_dist(&package::dist(root, scorch)?)?;
    package::check_unit(root, scorch)?;
    package::validate_manifests(root)?;
    let deb = package::package(root, scorch)?;
    package::test_deb(&deb)
}

fn effective_uid() -> u32 {
    // /proc/self/status avoids a libc dependency for one call.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).and_then(|e| e.parse().ok()))
        })
        .unwrap_or(u32::MAX)
}
