//! CPython interpreters as the distributions ship them: Debian 12's python3.11 (the host's),
//! Debian 13's python3.13 and unstable's python3.14, recognised from their binaries with
//! what the BPF walk needs.

use anyhow::{ensure, Context, Result};
use scorch::runtimes::{
    image::Image,
    python::{interpreter, EntryMark},
};
use scorch_tests::debian::unpacked_package;

struct Expected {
    minor: u8,
    /// FRAME_OWNED_BY_CSTACK and where `owner` is (3.11 marks entry frames otherwise).
    entry: EntryMark,
    code_tag_bits: u64,
}

fn check(binary: &std::path::Path, expected: Expected) -> Result<()> {
    let data = std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    let image = Image::parse(&data)?;
    let found = interpreter(&image)
        .with_context(|| format!("{}", binary.display()))?
        .with_context(|| format!("{} is not recognised as CPython", binary.display()))?;
    println!("{}: {found:x?}", binary.display());
    ensure!(
        found.version.major == 3 && found.version.minor == expected.minor,
        "{found:?}"
    );
    ensure!(found.offsets.entry == expected.entry, "{found:?}");
    ensure!(
        found.offsets.code_tag_bits == expected.code_tag_bits,
        "{found:?}"
    );
    let runtime = found.runtime.address..found.runtime.address + found.runtime.size;
    ensure!(runtime.contains(&found.thread_key), "{found:x?}");
    // The eval loop and the part GCC split off it: on 3.14 that part is most of the loop.
    let eval = image
        .symbol("_PyEval_EvalFrameDefault")
        .context("eval symbol")?;
    ensure!(found.eval.len() == 2, "{:x?}", found.eval);
    ensure!(
        found
            .eval
            .contains(&(eval.address..eval.address + eval.size)),
        "{:x?}",
        found.eval
    );
    let split: u64 = found
        .eval
        .iter()
        .filter(|r| r.start != eval.address)
        .map(|r| r.end - r.start)
        .sum();
    ensure!(split > 2048, "{:x?}", found.eval);
    Ok(())
}

#[test]
fn distribution_interpreters_are_recognised_from_their_binaries() -> Result<()> {
    check(
        std::path::Path::new("/usr/bin/python3.11"),
        Expected {
            minor: 11,
            entry: EntryMark::IsEntry(68),
            code_tag_bits: 0,
        },
    )?;
    let trixie = unpacked_package("trixie", "python3.13-minimal")?;
    check(
        &trixie.join("usr/bin/python3.13"),
        Expected {
            minor: 13,
            entry: EntryMark::CStackOwner {
                offset: 70,
                value: 3,
            },
            code_tag_bits: 0,
        },
    )?;
    let sid = unpacked_package("sid", "python3.14-minimal")?;
    check(
        &sid.join("usr/bin/python3.14"),
        Expected {
            minor: 14,
            entry: EntryMark::CStackOwner {
                offset: 74,
                value: 4,
            },
            code_tag_bits: 7,
        },
    )?;
    Ok(())
}

/// The Python functions of `tests/workloads/calltree.py`.
const FUNCTIONS: [&str; 7] = [
    "main", "run", "parse", "compute", "matmul", "reduce", "digest",
];

/// py-spy's raw (collapsed) stacks: `<module> (calltree.py:58);main (calltree.py:54);... 12`,
/// root first, as (function names leaf first, count).
fn py_spy_stacks(text: &str) -> Vec<(Vec<String>, u64)> {
    text.lines()
        .filter_map(|line| {
            let (stack, count) = line.rsplit_once(' ')?;
            let frames = stack
                .split(';')
                .map(|frame| frame.split(" (").next().unwrap_or(frame).to_owned())
                .rev()
                .collect();
            Some((frames, count.parse().ok()?))
        })
        .collect()
}

/// Debian 12's python3.11 running the call tree, recorded by scorch and by py-spy side by side:
/// each function's share of samples within 3 points of py-spy's, stacks whole from the leaf to
/// `<module>` and the interpreter's start, and the hottest line the same.
#[test]
fn python_call_tree_is_named_like_py_spy() -> Result<()> {
    let script = scorch_tests::workload_source("calltree.py");
    let py_spy = scorch_tests::debian::py_spy()?;
    let mut python = std::process::Command::new("/usr/bin/python3.11")
        .arg(&script)
        .arg("26")
        .spawn()?;
    let _kill = scorch_tests::KillOnDrop(python.id());
    std::thread::sleep(std::time::Duration::from_millis(500));
    let pid = python.id();
    let raw = scorch_tests::work_dir().join("py-spy-calltree.txt");
    let mut spy = std::process::Command::new(&py_spy)
        .args([
            "record",
            "--nonblocking",
            "--format",
            "raw",
            "--rate",
            "250",
            "--duration",
            "20",
        ])
        .arg("-o")
        .arg(&raw)
        .args(["--pid", &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let path = scorch_tests::work_dir().join("python-calltree.pb.gz");
    let output = scorch_tests::record_pid_to(pid, 20, &path, &[])?;
    let report = scorch_tests::parse_record_output(&output)?;
    let profile = scorch_tests::read_pprof(&path)?;
    ensure!(spy.wait()?.success(), "py-spy failed");
    let _ = python.wait();
    println!("scorch: {}", report.summary);
    let samples = scorch_tests::detailed_samples(&profile);
    let total: i64 = samples.iter().map(|s| s.count).sum();
    ensure!(total > 2000, "only {total} samples: {}", report.summary);
    let has = |s: &scorch_tests::DetailedSample, name: &str| {
        s.frames.iter().any(|f| f.function() == Some(name))
    };
    let share = |name: &str| -> f64 {
        samples
            .iter()
            .filter(|s| has(s, name))
            .map(|s| s.count)
            .sum::<i64>() as f64
            / total as f64
    };
    let spy = py_spy_stacks(&std::fs::read_to_string(&raw)?);
    let spy_total: u64 = spy.iter().map(|(_, n)| n).sum();
    ensure!(spy_total > 2000, "py-spy took only {spy_total} samples");
    let spy_share = |name: &str| -> f64 {
        spy.iter()
            .filter(|(f, _)| f.iter().any(|n| n == name))
            .map(|(_, n)| n)
            .sum::<u64>() as f64
            / spy_total as f64
    };
    let mut table = String::new();
    for name in FUNCTIONS {
        table += &format!(
            "{name}: scorch {:.3}, py-spy {:.3}\n",
            share(name),
            spy_share(name)
        );
    }
    println!("{table}");
    for name in FUNCTIONS {
        ensure!(
            (share(name) - spy_share(name)).abs() <= 0.03,
            "{name}'s share differs by more than 3 points:\n{table}"
        );
    }
    // Whole stacks: the module, then the interpreter's C frames down to its start.
    let whole: i64 = samples
        .iter()
        .filter(|s| has(s, "<module>") && has(s, "Py_BytesMain") && has(s, "_start"))
        .map(|s| s.count)
        .sum();
    ensure!(
        whole as f64 >= 0.95 * total as f64,
        "{whole} of {total} samples reach <module> and the interpreter's start: {}",
        report.summary
    );
    // The hottest Python line, as py-spy's.
    let mut lines: std::collections::HashMap<(String, i64), i64> = Default::default();
    for sample in &samples {
        if let Some(line) = sample
            .frames
            .iter()
            .flat_map(|f| f.lines.iter())
            .find(|l| l.file.ends_with("calltree.py"))
        {
            *lines.entry((line.function.clone(), line.line)).or_default() += sample.count;
        }
    }
    let hottest = lines
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(k, _)| k.clone());
    let mut spy_lines: std::collections::HashMap<(String, i64), u64> = Default::default();
    for line in std::fs::read_to_string(&raw)?.lines() {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            continue;
        };
        let Some(leaf) = stack.split(';').next_back() else {
            continue;
        };
        let Some((function, at)) = leaf.split_once(" (") else {
            continue;
        };
        let number = at
            .trim_end_matches(')')
            .rsplit(':')
            .next()
            .and_then(|n| n.parse().ok());
        if let (Some(number), Ok(count)) = (number, count.parse::<u64>()) {
            *spy_lines.entry((function.to_owned(), number)).or_default() += count;
        }
    }
    let spy_hottest = spy_lines
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(k, _)| k.clone());
    ensure!(
        hottest == spy_hottest,
        "hottest line: scorch {hottest:?}, py-spy {spy_hottest:?}"
    );
    Ok(())
}
