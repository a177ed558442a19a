//! Project automation: `cargo xtask setup | build | run | test | vm-test | bench | package`.
//!
//! Everything a fresh Debian/Ubuntu machine needs is installed by `setup`, which every other
//! command that needs it runs first, so `cargo xtask test` works from a clean clone.

mod bench;
mod cross;
mod image;
mod lint;
mod machine;
mod package;
mod setup;
mod vmtest;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};
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
    Build {
        /// Cross-build for this target (`aarch64-unknown-linux-gnu`): the binary where cargo
        /// puts it (`target/TARGET/release/scorch`), the pair in `target/dist/TARGET/`.
        #[arg(long)]
        target: Option<String>,
    },
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
        /// Package a cross build for this target (`aarch64-unknown-linux-gnu`): the .deb of
        /// its architecture, checked to hold a binary for it.
        #[arg(long, conflicts_with = "check")]
        target: Option<String>,
    },
    /// Build the container image for x86-64 and arm64 (scorch cross-built): one OCI image
    /// index, tagged with the version, in the OCI image layout target/image/, written without
    /// a container engine. Push both platforms under one tag with `skopeo copy --all
    /// oci:target/image:VERSION docker://REGISTRY/scorch:VERSION`.
    Image {
        /// Then read it back with skopeo and umoci, and run this machine's platform from its
        /// root filesystem: `scorch check` and a recording (as root).
        #[arg(long)]
        check: bool,
    },
    /// Check that the agent's modules import only downward (the order lib.rs declares), that
    /// no file has more than 800 lines of non-test code, and that the README (size, first
    /// commands), .ci/run and docs/benchmarks.md (written by the bench) are as promised.
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
        /// Boot this architecture's kernels (`arm64`: Debian's cloud-arm64 builds under
        /// qemu-system-aarch64, with scorch cross-built for it); the host's row is x86-64's
        /// and is left out.
        #[arg(long, default_value = "amd64")]
        arch: String,
    },
    /// Measure what scorch costs beside perf and bpftrace; write the figures to
    /// target/bench/ (a markdown report and a JSON file per bench) and docs/benchmarks.md.
    Bench {
        /// Seconds each recording of `record` and `overhead`'s capture lasts.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Runs of each measurement (default 3; `slowdown` and `offcpu`: rounds, default 5;
        /// `scale`: runs of each cell, default 1; `python`, `jvm` and `node` record at least 5 times).
        #[arg(long)]
        runs: Option<usize>,
        /// Run only this bench (default: record, symbolize, daemon, remote, unwind, walk).
        #[arg(long, value_enum)]
        only: Option<bench::Bench>,
        /// Windows of 10 s the daemon bench measures.
        #[arg(long, default_value_t = 30)]
        daemon_windows: u64,
        /// With `--only churn`, `slowdown` or `walk`: a scorch binary built from an earlier
        /// commit, run in turn with this one (e.g. from `git worktree add /tmp/base REV && cd
        /// /tmp/base && cargo xtask build`: `/tmp/base/target/release/scorch`).
        #[arg(long)]
        baseline: Option<PathBuf>,
        /// With `--only slowdown`: compare only at this sampling rate (repeatable; default 19,
        /// 99 and 999 Hz).
        #[arg(long = "rate")]
        rates: Vec<u64>,
        /// With `--only churn`: also a daemon with `--off-cpu`, in the same rounds.
        #[arg(long)]
        off_cpu: bool,
        /// Run no bench: only write docs/benchmarks.md (and the README's cost table) from the
        /// results already under target/bench/.
        #[arg(long, conflicts_with = "only")]
        render_only: bool,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = workspace_root();
    match cli.command {
        Task::Setup => setup::setup(),
        Task::Lint => lint::lint(&root),
        Task::Build { target: None } => {
            let scorch = build(&root)?;
            package::dist(&root, &scorch).map(|_| ())
        }
        Task::Build {
            target: Some(target),
        } => {
            let cross = cross::Target::named(&target)?;
            let scorch = cross::build(&root, cross)?;
            package::dist_for(&root, &scorch, Some(cross)).map(|_| ())
        }
        Task::Run { args } => run(&root, &args),
        Task::Test { filter } => test(&root, filter.as_deref()),
        Task::VmTest {
            kernels,
            no_host,
            arch,
        } => {
            setup::setup()?;
            let machine = machine::Machine::named(&arch)?;
            let scorch = if machine.debian == machine::ARM64.debian {
                cross::build(&root, cross::Target::named(ARM64_TRIPLE)?)?
            } else {
                build(&root)?
            };
            let kernels = if kernels.is_empty() {
                vmtest::DEFAULT_KERNELS
                    .iter()
                    .map(|k| k.to_string())
                    .collect()
            } else {
                kernels
            };
            let host = !no_host && machine.debian == machine::X86_64.debian;
            vmtest::vm_test(&root, &scorch, &kernels, host, machine)
        }
        Task::Image { check } => {
            setup::setup()?;
            let host = build(&root)?;
            let arm64 = cross::build(&root, cross::Target::named(ARM64_TRIPLE)?)?;
            image(&root, &host, &arm64, check)
        }
        Task::Package {
            target: Some(target),
            ..
        } => {
            setup::setup()?;
            let cross = cross::Target::named(&target)?;
            // The man pages and completions come from the CLI, which this machine's build
            // runs; the packaged binary is the target's.
            let host = build(&root)?;
            let scorch = cross::build(&root, cross)?;
            let deb = package::package_for(&root, &host, Some(cross), None)?;
            package::check_foreign_deb(&deb, &scorch, cross)
        }
        Task::Package { check, .. } => {
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
            render_only,
        } => bench::run(
            &root,
            &bench::Options {
                seconds,
                runs,
                only,
                daemon_windows,
                baseline,
                rates,
                off_cpu,
                render_only,
            },
        ),
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

/// Builds the release binary and returns its path: under `CARGO_TARGET_DIR` when it is set
/// (relative to the workspace, as cargo takes it), else under `target/`.
fn build(root: &Path) -> Result<PathBuf> {
    setup::ensure_bpf_toolchain()?;
    run_command(Command::new("cargo").current_dir(root).args([
        "build",
        "--release",
        "--package",
        "scorch",
    ]))?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|dir| !dir.is_empty())
        .map_or_else(|| root.join("target"), |dir| root.join(dir));
    Ok(target.join("release/scorch"))
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
        vmtest::vm_test(root, &scorch, &kernels, true, &machine::X86_64)?;
        // arm64: the same checks on Debian's arm64 kernels, scorch cross-built for them.
        let arm64 = cross::build_in(
            root,
            cross::Target::named(ARM64_TRIPLE)?,
            Some(Path::new(CROSS_TARGET_DIR)),
        )?;
        vmtest::vm_test(root, &arm64, &kernels, false, &machine::ARM64)?;
        // And its .deb: arm64's, holding that build.
        let cross_dir = Path::new(CROSS_TARGET_DIR);
        let target = cross::Target::named(ARM64_TRIPLE)?;
        let deb = package::package_for(root, &scorch, Some(target), Some(cross_dir))?;
        package::check_foreign_deb(&deb, &arm64, target)?;
        // The container image of both builds, read back and run.
        image(root, &scorch, &arm64, true)?;
    }
    Ok(())
}

const ARM64_TRIPLE: &str = "aarch64-unknown-linux-gnu";

/// Writes the multi-platform image of the `host` (x86-64) and `arm64` builds to target/image/,
/// and checks it when asked.
fn image(root: &Path, host: &Path, arm64: &Path, check: bool) -> Result<()> {
    let builds = [(&machine::X86_64, host), (&machine::ARM64, arm64)];
    let layout = root.join("target/image");
    image::build(root, &builds, &layout)?;
    eprintln!(
        "xtask: image written to {} (tag {}); push it with `skopeo copy --all oci:{}:{} docker://REGISTRY/scorch:{}`",
        layout.display(),
        image::tag(),
        layout.display(),
        image::tag(),
        image::tag(),
    );
    if check {
        image::check(root, &layout, &builds)?;
    }
    Ok(())
}

/// The cross build's target directory in `cargo xtask test`, beside the kernels and roots the
/// tests cache outside the clone: a clean clone then rebuilds only what changed.
const CROSS_TARGET_DIR: &str = "/var/cache/scorch-tests/target-cross";

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
