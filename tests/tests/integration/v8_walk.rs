//! JavaScript frames of Node processes run without flags, walked in BPF through V8's code
//! and named from its heap, against what the program is built to spend and against
//! `node --cpu-prof` (V8's own profiler) on a twin process.
//!
//! `v8_calltree.js` spends known shares of its CPU time in four functions (parse 1, matmul 4,
//! reduce 2, digest 1 units of 8), set by the process's clock. Each Node runs it while scorch
//! records it, and a twin runs it under `--cpu-prof`: each function's share within 3 points
//! of its built share and of V8's profiler's; the stacks whole from the leaf through `run`
//! and V8's entry into node's own `node::Start`; the functions named with their script and a
//! line within their body. TurboFan inlines the small leaves into their callers: the shares
//! hold only because the inlined functions come out as their own frames.
//!
//! Node 20 is the host's (NodeSource's static `node`); Node 18, 20 and 24 are Debian's
//! (libnode108, 115 and 137) in debootstrap roots of bookworm, trixie and sid. Node 24's
//! shares are held to the built ones alone (see [`Reference::Built`]).

use std::{collections::HashMap, process::Stdio};

use anyhow::{bail, ensure, Context, Result};
use scorch_tests::{work_dir, DetailedSample, KillOnDrop};

use super::v8_layout::Node;

/// The call tree's leaves and the share of the tree's time each is built to take.
const LEAVES: [(&str, f64); 4] = [
    ("parse", 0.125),
    ("matmul", 0.5),
    ("reduce", 0.25),
    ("digest", 0.125),
];

/// The functions of a scorch sample's frames, leaf first (an optimised frame's inlined
/// functions each).
fn functions(sample: &DetailedSample) -> Vec<&str> {
    sample
        .frames
        .iter()
        .flat_map(|f| f.lines.iter())
        .map(|l| l.function.as_str())
        .collect()
}

/// Each function's inclusive share of the samples under `run` in a `.cpuprofile` (V8's
/// profile: its call tree's nodes, each with its function and children, and the samples as
/// the nodes they hit), and how many samples that is.
fn cpu_prof_shares(profile: &serde_json::Value) -> Result<(HashMap<String, f64>, usize)> {
    let nodes = profile["nodes"].as_array().context("no nodes")?;
    let mut parent: HashMap<u64, u64> = HashMap::new();
    let mut name: HashMap<u64, String> = HashMap::new();
    for node in nodes {
        let id = node["id"].as_u64().context("a node without an id")?;
        name.insert(
            id,
            node["callFrame"]["functionName"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
        for child in node["children"].as_array().into_iter().flatten() {
            parent.insert(child.as_u64().context("a child id")?, id);
        }
    }
    let mut counts: HashMap<String, usize> = HashMap::new();
    let mut total = 0;
    for sample in profile["samples"].as_array().context("no samples")? {
        let mut id = sample.as_u64().context("a sample's node")?;
        let mut stack = vec![name.get(&id).cloned().unwrap_or_default()];
        while let Some(&up) = parent.get(&id) {
            id = up;
            stack.push(name.get(&id).cloned().unwrap_or_default());
        }
        if !stack.iter().any(|n| n == "run") {
            continue;
        }
        total += 1;
        stack.sort();
        stack.dedup();
        for function in stack {
            *counts.entry(function).or_default() += 1;
        }
    }
    let shares = counts
        .into_iter()
        .map(|(f, n)| (f, n as f64 / total.max(1) as f64))
        .collect();
    Ok((shares, total))
}

/// The 1-based lines of the function declared as `function NAME(` in `source`, to its
/// closing brace at column 0.
fn body_lines(source: &str, name: &str) -> std::ops::RangeInclusive<u32> {
    let lines: Vec<&str> = source.lines().collect();
    let declaration = format!("function {name}(");
    let start = lines
        .iter()
        .position(|l| l.starts_with(&declaration))
        .expect("the declaration");
    let end = (start..lines.len())
        .find(|&i| lines[i] == "}")
        .expect("the closing brace");
    (start as u32 + 1)..=(end as u32 + 1)
}

/// What the shares are held to besides what the program is built to spend.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reference {
    /// `--cpu-prof`'s on a twin process.
    CpuProf,
    /// None: V8 13's profiler folds the inlined functions into their callers (Node 24's
    /// `--cpu-prof` gives parse and digest 4% each instead of 12.5%), and scorch should not.
    Built,
}

/// The call tree on `node`, recorded by scorch and, on a twin, by `--cpu-prof` where it is
/// the `reference`; see the module documentation.
fn call_tree_like_cpu_prof(node: &Node, tag: &str, reference: Reference) -> Result<()> {
    let (here, inside) = node.shared_dir_named(tag)?;
    std::fs::copy(
        scorch_tests::workload_source("v8_calltree.js"),
        here.join("v8_calltree.js"),
    )?;
    let script = format!("{inside}/v8_calltree.js");
    let child = node
        .command()
        .args([&script, "22"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let _kill = KillOnDrop(child.id());
    let mut twin = match reference {
        Reference::CpuProf => Some(
            node.command()
                .args(["--cpu-prof", "--cpu-prof-dir", &inside, &script, "18"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?,
        ),
        Reference::Built => None,
    };
    let _kill_twin = twin.as_ref().map(|twin| KillOnDrop(twin.id()));
    // Past node's start and the first optimisations.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let path = work_dir().join(format!("v8-calltree-{tag}.pb.gz"));
    let output = scorch_tests::record_pid_to(child.id(), 14, &path, &[])?;
    let summary = scorch_tests::parse_record_output(&output)?.summary;
    println!("scorch: {summary}");
    if let Some(twin) = twin.as_mut() {
        ensure!(twin.wait()?.success(), "node --cpu-prof failed");
    }

    let profile = scorch_tests::read_pprof(&path)?;
    let samples: Vec<DetailedSample> = scorch_tests::detailed_samples(&profile)
        .into_iter()
        .filter(|s| s.pid == i64::from(child.id()))
        .collect();
    let in_tree = |s: &DetailedSample| functions(s).contains(&"run");
    let all: i64 = samples.iter().map(|s| s.count).sum();
    let total: i64 = samples.iter().filter(|s| in_tree(s)).map(|s| s.count).sum();
    ensure!(
        total > 300,
        "only {total} of {all} samples in the call tree: {}",
        summary
    );
    let share = |name: &str| -> f64 {
        samples
            .iter()
            .filter(|s| in_tree(s) && functions(s).contains(&name))
            .map(|s| s.count)
            .sum::<i64>() as f64
            / total as f64
    };

    let reference = match reference {
        Reference::CpuProf => {
            let cpu_prof = std::fs::read_dir(&here)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .find(|p| p.extension().is_some_and(|e| e == "cpuprofile"))
                .context("node --cpu-prof wrote no profile")?;
            let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&cpu_prof)?)?;
            let (reference, reference_total) = cpu_prof_shares(&json)?;
            ensure!(
                reference_total > 300,
                "--cpu-prof took only {reference_total} samples of the call tree"
            );
            Some(reference)
        }
        Reference::Built => None,
    };
    let mut table = String::new();
    for (name, built) in LEAVES {
        table += &format!("{name}: scorch {:.3}, built {built:.3}", share(name));
        if let Some(reference) = &reference {
            let cpu_prof = reference.get(name).copied().unwrap_or(0.0);
            table += &format!(", --cpu-prof {cpu_prof:.3}");
        }
        table += "\n";
    }
    println!("{table}");
    for (name, built) in LEAVES {
        let cpu_prof = reference
            .as_ref()
            .map_or(built, |r| r.get(name).copied().unwrap_or(0.0));
        ensure!(
            (share(name) - built).abs() <= 0.03 && (share(name) - cpu_prof).abs() <= 0.03,
            "{name}'s share is more than 3 points from its built share or --cpu-prof's:\n{table}"
        );
    }

    // Whole stacks: nearly every sample reaches `run`, and below it V8's entry and node's
    // own start.
    let whole: i64 = samples
        .iter()
        .filter(|s| {
            let names = functions(s);
            names.contains(&"run") && names.iter().any(|n| n.starts_with("node::Start"))
        })
        .map(|s| s.count)
        .sum();
    ensure!(
        whole as f64 >= 0.95 * all as f64,
        "{whole} of {all} samples reach run and node::Start: {}",
        summary
    );

    lines_and_columns(&samples)
}

/// The call tree's frames named with their script, each leaf's lines within its body, with
/// a column at an expression (V8's positions are its expressions' starts: never a blank,
/// never past the line), and `compute`'s calls told apart by their columns.
fn lines_and_columns(samples: &[DetailedSample]) -> Result<()> {
    let source = std::fs::read_to_string(scorch_tests::workload_source("v8_calltree.js"))?;
    let source_lines: Vec<&str> = source.lines().collect();
    for (name, _) in LEAVES {
        let body = body_lines(&source, name);
        let mut lines: HashMap<u32, i64> = HashMap::new();
        let (mut at_expression, mut elsewhere) = (0, Vec::new());
        for sample in samples {
            for line in sample.frames.iter().flat_map(|f| f.lines.iter()) {
                if line.function == name {
                    ensure!(
                        line.file.ends_with("v8_calltree.js"),
                        "{name} named in {:?}",
                        line.file
                    );
                    *lines.entry(line.line as u32).or_default() += sample.count;
                    let character = source_lines
                        .get((line.line as usize).wrapping_sub(1))
                        .and_then(|text| text.chars().nth((line.column as usize).wrapping_sub(1)));
                    match character {
                        Some(c) if !c.is_whitespace() => at_expression += sample.count,
                        _ if elsewhere.len() < 20 => elsewhere.push((line.line, line.column)),
                        _ => {}
                    }
                }
            }
        }
        let named: i64 = lines.values().sum();
        ensure!(
            at_expression as f64 >= 0.9 * named as f64,
            "{name}: {at_expression} of {named} samples' columns at an expression; the others \
             at (line, column) {elsewhere:?}"
        );
        let in_body: i64 = lines
            .iter()
            .filter(|(l, _)| body.contains(l))
            .map(|(_, n)| n)
            .sum();
        if named == 0 || (in_body as f64) < 0.9 * named as f64 {
            bail!("{name}'s lines {lines:?}, its body {body:?}");
        }
    }
    call_sites_by_column(samples, &source_lines)
}

/// `compute` calls `matmul` four times on one line and `reduce` twice on the next: only
/// columns tell the calls apart. Each call of a callee takes as long, so `compute`'s frames
/// above it must be at the columns where the calls start (as Node's stack traces give them),
/// each call's column with its share of the callee's samples.
fn call_sites_by_column(samples: &[DetailedSample], source: &[&str]) -> Result<()> {
    for (callee, calls) in [("matmul", 4), ("reduce", 2)] {
        let call = format!("{callee}(unit)");
        let (line, text) = source
            .iter()
            .enumerate()
            .find(|(_, text)| text.contains(&call) && !text.contains("function"))
            .with_context(|| format!("no call of {callee} in the source"))?;
        let expected: Vec<(i64, i64)> = text
            .match_indices(&call)
            .map(|(at, _)| (line as i64 + 1, at as i64 + 1))
            .collect();
        ensure!(expected.len() == calls, "{callee}'s calls: {expected:?}");
        let mut sites: HashMap<(i64, i64), i64> = HashMap::new();
        for sample in samples {
            let lines: Vec<_> = sample.frames.iter().flat_map(|f| f.lines.iter()).collect();
            // Leaf first: the caller's line follows its callee's.
            if let Some(pair) = lines
                .windows(2)
                .find(|pair| pair[0].function == callee && pair[1].function == "compute")
            {
                *sites.entry((pair[1].line, pair[1].column)).or_default() += sample.count;
            }
        }
        let all: i64 = sites.values().sum();
        let share = |site| sites.get(site).copied().unwrap_or(0) as f64 / all.max(1) as f64;
        let even = 1.0 / calls as f64;
        ensure!(
            all > 0
                && expected
                    .iter()
                    .all(|site| (share(site) - even).abs() <= 0.6 * even),
            "compute's calls of {callee}, (line, column): samples {sites:?}; the calls are at \
             {expected:?}, each about {even:.2} of them"
        );
    }
    Ok(())
}

#[test]
fn host_node_20_javascript_is_named_like_cpu_prof() -> Result<()> {
    call_tree_like_cpu_prof(&Node::host(), "host20", Reference::CpuProf)
}

#[test]
fn debian_node_18_javascript_is_named_like_cpu_prof() -> Result<()> {
    call_tree_like_cpu_prof(&Node::debian("bookworm")?, "bookworm18", Reference::CpuProf)
}

#[test]
fn debian_node_20_javascript_is_named_like_cpu_prof() -> Result<()> {
    call_tree_like_cpu_prof(&Node::debian("trixie")?, "trixie20", Reference::CpuProf)
}

/// A recording of `script` (a workload of tests/workloads) run by `node` for `runs` seconds:
/// after `warm_up`, scorch records it for `seconds`. Its samples, and scorch's summary.
fn record_script(
    node: &Node,
    tag: &str,
    script: &str,
    flags: &[&str],
    (runs, warm_up, seconds): (u32, u64, u32),
) -> Result<(Vec<DetailedSample>, String)> {
    let (here, inside) = node.shared_dir_named(tag)?;
    std::fs::copy(scorch_tests::workload_source(script), here.join(script))?;
    let child = node
        .command()
        .args(flags)
        .args([format!("{inside}/{script}"), runs.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let _kill = KillOnDrop(child.id());
    std::thread::sleep(std::time::Duration::from_secs(warm_up));
    let path = work_dir().join(format!("v8-{tag}.pb.gz"));
    let output = scorch_tests::record_pid_to(child.id(), seconds, &path, &[])?;
    let summary = scorch_tests::parse_record_output(&output)?.summary;
    println!("scorch: {summary}");
    let samples = scorch_tests::detailed_samples(&scorch_tests::read_pprof(&path)?)
        .into_iter()
        .filter(|s| s.pid == i64::from(child.id()))
        .collect();
    Ok((samples, summary))
}

/// An async service and a worker thread (`v8_async.js`) on the host's Node: every thread's
/// JavaScript is named. The main thread's time is in `fetchRecord` (resumed from the
/// microtask queue at each `await`) and the worker's in `workerLoop`, each through `busy` to
/// `spin`; each takes about half the process's samples, nearly all of them named to `spin`.
#[test]
fn async_functions_and_worker_threads_are_named() -> Result<()> {
    let (samples, summary) = record_script(&Node::host(), "async", "v8_async.js", &[], (14, 2, 8))?;
    let all: i64 = samples.iter().map(|s| s.count).sum();
    ensure!(all > 300, "only {all} samples: {}", summary);
    for root in ["fetchRecord", "workerLoop"] {
        let under = |s: &&DetailedSample| functions(s).contains(&root);
        let count: i64 = samples.iter().filter(under).map(|s| s.count).sum();
        let named: i64 = samples
            .iter()
            .filter(under)
            .filter(|s| {
                let names = functions(s);
                let at = |f: &str| names.iter().position(|n| *n == f);
                // Leaf first: spin, then busy, then the root.
                matches!((at("spin"), at("busy"), at(root)), (Some(a), Some(b), Some(c)) if a < b && b < c)
            })
            .map(|s| s.count)
            .sum();
        let share = count as f64 / all as f64;
        ensure!(
            (0.35..=0.65).contains(&share) && named as f64 >= 0.9 * count as f64,
            "{root}: {count} of {all} samples, {named} of them through busy to spin: {}",
            summary
        );
    }
    Ok(())
}

/// A copy of the host's `node` whose post-mortem constants say `lies` (name, value): V8
/// itself never reads them, so the process runs as before, and only a reader of them is
/// misled.
fn lying_node(lies: &[(&str, i32)], tag: &str) -> Result<std::path::PathBuf> {
    use object::{Object, ObjectSection, ObjectSymbol};
    let mut bytes = std::fs::read("/usr/bin/node")?;
    let mut patches = Vec::new();
    {
        let elf = object::File::parse(&*bytes)?;
        for &(name, value) in lies {
            let symbol = elf
                .dynamic_symbols()
                .find(|s| s.name() == Ok(name))
                .with_context(|| format!("no {name} in node"))?;
            let section =
                elf.section_by_index(symbol.section_index().context("an undefined symbol")?)?;
            let (file_offset, _) = section.file_range().context("a section without data")?;
            let at = (file_offset + symbol.address() - section.address()) as usize;
            patches.push((at, value));
        }
    }
    for (at, value) in patches {
        bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
    }
    let path = work_dir().join(format!("node-{tag}"));
    std::fs::write(&path, &bytes)?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    Ok(path)
}

/// Nodes whose `v8dbg_*` constants lie: the function's instance type (no frame's function
/// is one), and the names' fields moved (a function's name read from its map, a script's
/// from its source). The recording completes with every sample, the walk's refusals
/// are counted, and no name passes the namer's bound.
#[test]
fn nodes_whose_constants_lie_are_bounded_and_counted() -> Result<()> {
    let cases: [(&str, &[(&str, i32)]); 2] = [
        ("types", &[("v8dbg_type_JSFunction__JS_FUNCTION_TYPE", 1)]),
        (
            "names",
            &[
                (
                    "v8dbg_class_SharedFunctionInfo__name_or_scope_info__Object",
                    0,
                ),
                ("v8dbg_class_Script__name__Object", 8),
            ],
        ),
    ];
    for (tag, lies) in cases {
        let node = lying_node(lies, tag)?;
        let child = std::process::Command::new(&node)
            .arg(scorch_tests::workload_source("v8_calltree.js"))
            .arg("12")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let _kill = KillOnDrop(child.id());
        std::thread::sleep(std::time::Duration::from_secs(2));
        let path = work_dir().join(format!("v8-lies-{tag}.pb.gz"));
        let output = scorch_tests::record_pid_to(child.id(), 6, &path, &[])?;
        let summary = scorch_tests::parse_record_output(&output)?.summary;
        println!("{tag}: {summary}");
        let samples: Vec<DetailedSample> =
            scorch_tests::detailed_samples(&scorch_tests::read_pprof(&path)?)
                .into_iter()
                .filter(|s| s.pid == i64::from(child.id()))
                .collect();
        let all: i64 = samples.iter().map(|s| s.count).sum();
        ensure!(all > 600, "{tag}: only {all} samples: {}", summary);
        let longest = samples
            .iter()
            .flat_map(|s| s.frames.iter().flat_map(|f| f.lines.iter()))
            .map(|l| l.function.len().max(l.file.len()))
            .max()
            .unwrap_or(0);
        ensure!(
            longest <= scorch::runtimes::window::MAX_NAME,
            "{tag}: a name of {longest} bytes"
        );
        match tag {
            // No frame's function is of the function types: refused, and counted.
            "types" => ensure!(
                summary.contains("invalid function")
                    && !samples.iter().any(|s| functions(s).contains(&"run")),
                "{tag}: {}",
                summary
            ),
            // The functions are still walked; their names are whatever the lies lead to.
            _ => ensure!(summary.contains("v8: "), "{tag}: no V8 frames: {}", summary),
        }
    }
    Ok(())
}

/// Debian's Node 24 (V8 13, libnode137, in a sid root): its builtins found from its CFI
/// (the accessor is hidden), its functions' code through leaptiering's dispatch table, found
/// in the process. The shares are held to the built ones alone: V8's own profiler folds the
/// functions TurboFan inlined into their callers, which scorch names as their own frames.
#[test]
fn debian_node_24_javascript_is_named_with_its_inlined_functions() -> Result<()> {
    call_tree_like_cpu_prof(&Node::debian("sid")?, "sid24", Reference::Built)
}

/// The call tree with its functions held at Sparkplug's baseline code (compiled at once, and
/// no optimising tier), as a service's warm but not hot functions run: every JavaScript
/// frame is baseline code's, whose line comes from the pc's bytecode (its code's bytecode
/// offset table walked beside the bytecodes, sized by the binary's own table of bytecode
/// sizes). The same names, lines and columns as the call tree's.
fn baseline_lines_and_columns(node: &Node, tag: &str, flags: &[&str]) -> Result<()> {
    let (samples, summary) = record_script(node, tag, "v8_calltree.js", flags, (16, 2, 10))?;
    let in_tree: i64 = samples
        .iter()
        .filter(|s| functions(s).contains(&"run"))
        .map(|s| s.count)
        .sum();
    ensure!(
        in_tree > 300,
        "only {in_tree} samples in the call tree: {summary}"
    );
    lines_and_columns(&samples)
}

/// No optimising tier on V8 11 and 13 (TurboFan, Maglev); V8 10 has no Maglev to turn off.
const BASELINE_ONLY: [&str; 3] = ["--always-sparkplug", "--no-opt", "--no-maglev"];

#[test]
fn host_node_20_baseline_frames_have_their_lines() -> Result<()> {
    baseline_lines_and_columns(&Node::host(), "baseline-host20", &BASELINE_ONLY)
}

#[test]
fn debian_node_18_baseline_frames_have_their_lines() -> Result<()> {
    baseline_lines_and_columns(
        &Node::debian("bookworm")?,
        "baseline-bookworm18",
        &BASELINE_ONLY[..2],
    )
}

#[test]
fn debian_node_20_baseline_frames_have_their_lines() -> Result<()> {
    baseline_lines_and_columns(
        &Node::debian("trixie")?,
        "baseline-trixie20",
        &BASELINE_ONLY,
    )
}

#[test]
fn debian_node_24_baseline_frames_have_their_lines() -> Result<()> {
    baseline_lines_and_columns(&Node::debian("sid")?, "baseline-sid24", &BASELINE_ONLY)
}
