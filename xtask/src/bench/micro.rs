//! The agent's own benches (`cargo bench -p scorch --bench NAME`), run for `--only unwind`,
//! `views`, `remote` and `symbolize`. Each prints its figures as lines, which the report keeps
//! as printed, under `target/bench/<name>-report.md` and in the results.

use std::{path::Path, process::Command};

use anyhow::{Context, Result};

use crate::{
    bench::{
        measure::{cargo_bench, lines_starting},
        results::BenchResult,
        Bench,
    },
    run_command,
};

/// Unwind-table build time, heap and size for libc, ld.so, libstdc++ and rustc's largest
/// libraries. Needs no scorch binary and no privileges, so it runs without the setup and
/// release build the other benches need.
pub fn unwind(root: &Path, command: String) -> Result<BenchResult> {
    let report = lines_starting(&cargo_bench(root, "unwind", |_| {})?, "unwind:");
    keep(root, Bench::Unwind, "unwind-report.md", &report, command)
}

/// The UI views' query times over a synthetic day; like the unwind bench, it needs no scorch
/// binary and no privileges.
pub fn views(root: &Path, command: String) -> Result<BenchResult> {
    let report = views_lines(root)?;
    keep(root, Bench::Views, "views-report.md", &report, command)
}

/// The `views` bench's lines: the timeline over 24 h and a diff of two 1 h ranges.
pub fn views_lines(root: &Path) -> Result<String> {
    Ok(lines_starting(
        &cargo_bench(root, "views", |_| {})?,
        "views:",
    ))
}

/// The remote sinks: encoding and sending a window of 100 series, the RSS with the server
/// down and an hour queued, and how fast that backlog drains.
pub fn remote(root: &Path, scorch: &Path, command: String) -> Result<BenchResult> {
    let dir = root.join("target/bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let output = cargo_bench(root, "remote", |command| {
        command.arg("--").arg(scorch).arg(&dir);
    })?;
    let report = lines_starting(&output, "remote:");
    keep(root, Bench::Remote, "remote-report.md", &report, command)
}

/// User symbolisation, warm and cold. The cold case needs a binary with a lot of DWARF: scorch
/// itself built as release with full debug info (inline records included), more inlining, and
/// its own crate split into 256 codegen units (each repeats the type information it uses): about
/// 110 MiB of DWARF. In its own target directory so it never replaces the binary under test.
pub fn symbolize(root: &Path, command: String) -> Result<BenchResult> {
    let target_dir = root.join("target/bigdwarf");
    run_command(
        Command::new("cargo")
            .current_dir(root)
            .env("CARGO_PROFILE_RELEASE_DEBUG", "2")
            // Inlining more (LLVM's threshold is 225) multiplies the inline records and
            // location lists, and takes the DWARF past 100 MB: the size of a large C++
            // service's debug info, where a parse that holds it all would show.
            .env("RUSTFLAGS", "-C llvm-args=-inline-threshold=1000")
            .env("CARGO_PROFILE_RELEASE_STRIP", "none")
            .args(["build", "--release", "--package", "scorch"])
            .args([
                "--config",
                "profile.release.package.scorch.codegen-units=256",
            ])
            .arg("--target-dir")
            .arg(&target_dir),
    )?;
    let output = cargo_bench(root, "symbolize", |command| {
        command.env("SCORCH_BIG_DWARF_BINARY", target_dir.join("release/scorch"));
    })?;
    let report: String = output
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| format!("{l}\n"))
        .collect();
    keep(
        root,
        Bench::Symbolize,
        "symbolize-report.md",
        &report,
        command,
    )
}

/// Prints a bench's lines, writes them to `target/bench/<file>`, and returns them as its
/// results.
fn keep(
    root: &Path,
    bench: Bench,
    file: &str,
    report: &str,
    command: String,
) -> Result<BenchResult> {
    let dir = root.join("target/bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    print!("{report}");
    let path = dir.join(file);
    std::fs::write(&path, report).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("bench: report written to {}", path.display());
    let mut result = BenchResult::new(bench, command);
    result.lines = report.lines().map(str::to_owned).collect();
    Ok(result)
}
