//! `cargo xtask bench --only node`: what walking V8's JavaScript frames costs, written to
//! `target/bench/node.md` (the bench is `managed`'s).
//!
//! - **BPF per sample**: the host's Node 20 running `tests/workloads/v8_depth.js` 50
//!   JavaScript frames deep (each level a frame of its own: the calls between levels are
//!   megamorphic, so TurboFan inlines none), recorded after a warm-up that lets TurboFan
//!   compile the levels, with `--node auto` and `--node off`.
//! - **Daemon with 5 node processes and with none**: 5 `node v8_calltree.js` processes, one
//!   busy thread each.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context, Result};

use crate::bench::{
    managed::{managed, Subject},
    measure::{command_output, path_str},
    results::BenchResult,
    Bench,
};

/// NodeSource's static Node 20, the one the V8 tests run on this host.
const NODE: &str = "/usr/bin/node";

pub fn node(root: &Path, scorch: &Path, runs: usize, command: String) -> Result<BenchResult> {
    let workloads = root.join("tests/workloads");
    let depth_script = path_str(&workloads.join("v8_depth.js"))?.to_owned();
    let tree_script = path_str(&workloads.join("v8_calltree.js"))?.to_owned();
    let node = |args: Vec<String>| {
        Command::new(NODE)
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .context("starting node")
    };
    let deep = move |depth: usize, seconds: u64, steady: bool| {
        let mut args = vec![depth_script.clone(), depth.to_string(), seconds.to_string()];
        if steady {
            args.push("steady".into());
        }
        node(args)
    };
    let busy = move |seconds: u64| node(vec![tree_script.clone(), seconds.to_string()]);
    let subject = Subject {
        bench: Bench::Node,
        flag: "--node",
        runtime: "v8",
        language: "JavaScript",
        process: "node process",
        processes: "node processes",
        version: format!("Node {}", command_output(NODE, &["--version"]).trim()),
        address: "127.0.0.1:17097",
        deep: Box::new(deep),
        steady: true,
        // TurboFan has compiled the levels by then.
        deep_warm_up: Duration::from_secs(5),
        ours: |frame| matches!(frame, "main" | "run" | "spin") || frame.starts_with("down"),
        busy: Box::new(busy),
        busy_warm_up: Duration::from_secs(3),
        deep_note: "JavaScript: `v8_depth.js` on the host's Node 20, each level a frame of its \
                    own (megamorphic calls, none inlined), recorded after 5 s; `--node off` \
                    walks the same process natively (V8's builtins and JIT code by frame \
                    pointer, unnamed). Native: `deeprec` built without frame pointers, walked \
                    through unwind tables, on one stack throughout and with `vary` on a new \
                    one each round. Its frames: the workload's own in the profile \
                    written (main, run, the levels, spin; under `vary`, main, vary and the \
                    steps). Target: at most 5 us a sample on \
                    the JavaScript stack. One stack throughout: `v8_depth.js ... steady`, \
                    its levels' order drawn once, so that no sample sends a new stack.",
        busy_note: "Each node process runs `v8_calltree.js` in one busy thread, started afresh \
                    for each daemon. JavaScript names: \
                    `scorch_runtime_names_bytes{runtime=\"v8\"}`, what the last window's names \
                    took before it ended.",
    };
    managed(&subject, root, scorch, runs, command)
}
