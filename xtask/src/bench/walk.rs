//! `cargo xtask bench --only walk`: the BPF unwinder's walk. `tests/workloads/deepsort.cpp`
//! built `-O2 -fomit-frame-pointer` (about 30 frames through libc's qsort, libstdc++ mapped),
//! profiled by `scorch record --pid P -F 499` with `--unwind auto` and `--unwind fp` in
//! alternating order, fresh processes: BPF ns per sample from `bpf_stats`, the tables' map
//! memory, and how the walks ended (the summary's outcomes show the tables were used). Report:
//! `target/bench/walk-report.md`.

use std::{
    fmt::Write as _,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{bail, Context, Result};

use crate::{
    bench::{
        measure::{
            median, path_str, summary_bpf_ns, summary_samples, verdict, with_bpf_stats, Processes,
        },
        results::{BenchResult, Cell, Table},
        Bench,
    },
    run_command,
};

/// The BPF unwinder's cost per sample on deep stacks through libc, beside frame pointers on
/// the same process, and its tables' map memory. Targets: mean at most 3 us per sample; the
/// tables of exe + libc + ld.so + libstdc++ (+ libm, libgcc_s) at most 1 MiB.
/// With `baseline` (a scorch of an earlier commit), its `--unwind auto` runs in turn with the
/// others: the walk's cost before and after a change, in the same fresh processes.
pub fn walk(
    root: &Path,
    scorch: &Path,
    baseline: Option<&Path>,
    runs: usize,
    command: String,
) -> Result<BenchResult> {
    let dir = root.join("target/bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let workload = dir.join("deepsort");
    run_command(
        Command::new("g++")
            .args(["-O2", "-fomit-frame-pointer", "-o"])
            .arg(&workload)
            .arg(root.join("tests/workloads/deepsort.cpp")),
    )?;
    let out = dir.join("walk.pb.gz");
    let mut report = String::from(
        "| run | mode | BPF ns/sample | samples | unwind tables, map memory | how the walks ended |\n\
         |---|---|---|---|---|---|\n",
    );
    // (mode, binary, label, ns per sample)
    let mut by_mode: Vec<(&str, &Path, &str, Vec<f64>)> = vec![
        ("auto", scorch, "", Vec::new()),
        ("fp", scorch, "", Vec::new()),
    ];
    if let Some(baseline) = baseline {
        by_mode.push(("auto", baseline, " (baseline)", Vec::new()));
    }
    let mut table_kib = Vec::new();
    with_bpf_stats(|| {
        for run in 0..runs {
            let _process = Processes(vec![Command::new(&workload)
                .arg("60")
                .spawn()
                .context("starting deepsort")?]);
            let pid = _process.0[0].id().to_string();
            std::thread::sleep(Duration::from_millis(500));
            let mut modes: Vec<usize> = (0..by_mode.len()).collect();
            let turn = run % modes.len();
            modes.rotate_left(turn);
            for mode in modes {
                let (name, binary, label) = (by_mode[mode].0, by_mode[mode].1, by_mode[mode].2);
                let output = Command::new(binary)
                    .args(["record", "--unwind", name, "--pid", &pid, "-F", "499"])
                    .args(["--duration", "5s", "--output", path_str(&out)?])
                    .stderr(Stdio::null())
                    .output()
                    .context("running scorch record")?;
                let summary = String::from_utf8_lossy(&output.stdout).trim().to_owned();
                if !output.status.success() {
                    bail!("scorch record --unwind {name} failed: {summary}");
                }
                let ns = summary_bpf_ns(&summary)
                    .with_context(|| format!("no BPF figure in: {summary}"))?;
                by_mode[mode].3.push(ns);
                let field = |prefix: &str| {
                    summary
                        .split("; ")
                        .find_map(|part| part.strip_prefix(prefix))
                        .unwrap_or("")
                        .to_owned()
                };
                let tables = field("unwind tables: ");
                if let Some(kib) = tables
                    .split(", ")
                    .nth(1)
                    .and_then(|k| k.strip_suffix(" KiB")?.parse::<f64>().ok())
                {
                    table_kib.push(kib);
                }
                writeln!(
                    report,
                    "| {} | `--unwind {name}`{label} | {ns:.0} | {} | {tables} | {} |",
                    run + 1,
                    summary_samples(&summary),
                    field("unwind: ")
                )?;
            }
        }
        Ok(())
    })?;
    let auto = median(by_mode[0].3.clone());
    let fp = median(by_mode[1].3.clone());
    let kib = median(table_kib.clone());
    writeln!(
        report,
        "\nwalk: medians of {runs} runs: BPF {auto:.0} ns/sample with tables ({}), {fp:.0} ns \
         with frame pointers; tables of exe + libc + ld.so + libstdc++ + libm + libgcc_s \
         {kib:.0} KiB ({})",
        verdict(auto <= 3000.0, "target: at most 3000 ns"),
        verdict(kib <= 1024.0, "target: at most 1 MiB"),
    )?;
    if let Some((_, binary, _, ns)) = by_mode.get(2) {
        writeln!(
            report,
            "baseline {}: BPF {:.0} ns/sample with tables",
            binary.display(),
            median(ns.clone())
        )?;
    }
    print!("{report}");
    let path = dir.join("walk-report.md");
    std::fs::write(&path, &report)?;
    eprintln!("bench: report written to {}", path.display());

    let mut table = Table::new(
        "walk",
        "`scorch record --pid P -F 499` of deepsort (about 30 frames through libc)",
        "walk",
        &["BPF ns/sample", "unwind tables KiB"],
    )
    .with_note(
        "The tables are those of the program, libc, ld.so, libstdc++, libm and libgcc_s, as \
         `record`'s summary gives them; `--unwind fp` loads none.",
    );
    for (i, (mode, _, label, ns)) in by_mode.iter().enumerate() {
        let tables = if i == 0 {
            Cell::of(&table_kib, 0)
        } else {
            Cell::Missing
        };
        table.row(
            format!("`--unwind {mode}`{label}"),
            vec![Cell::of(ns, 0), tables],
        );
    }
    let mut result = BenchResult::new(Bench::Walk, command);
    result.tables.push(table);
    Ok(result)
}
