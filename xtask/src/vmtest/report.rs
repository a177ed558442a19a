//! Judges the files checks.sh leaves, one row per kernel, and renders the table.

use std::path::Path;

/// The known call tree's leaves and their CPU shares (tests/workloads/calltree.c).
const LEAVES: [&str; 3] = ["leaf_a", "leaf_b", "leaf_c"];
const EXPECTED: [f64; 3] = [0.6, 0.3, 0.1];
/// The same tolerance as the integration test on the host.
const TOLERANCE: f64 = 0.05;
/// 199 Hz for 10 s is ~1,990 samples; fewer than this means sampling is broken, not slow.
const MIN_SAMPLES: u64 = 500;

/// The columns, in order.
pub const CHECKS: [&str; 10] = [
    "scorch check",
    "record: call tree",
    "no frame pointers",
    "Go, stripped",
    "Python 3.11",
    "off-CPU",
    "map ceilings",
    "kernel stacks",
    "run + query",
    "/healthz",
];

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Pass(String),
    Fail(String),
    /// The kernel lacks what the check needs: said, never counted as a pass.
    Skip(String),
}

impl Outcome {
    fn cell(&self) -> String {
        match self {
            Outcome::Pass(d) if d.is_empty() => "PASS".to_owned(),
            Outcome::Pass(d) => format!("PASS ({d})"),
            Outcome::Fail(_) => "**FAIL**".to_owned(),
            Outcome::Skip(_) => "SKIP".to_owned(),
        }
    }
}

pub struct Row {
    /// The package, or `host`.
    pub label: String,
    /// `uname -r` inside the VM.
    pub kernel: String,
    pub outcomes: Vec<Outcome>,
    /// Wall time of the VM, boot to power-off (of the whole script on the host).
    pub seconds: f64,
    /// A failure before any check ran (download, boot, timeout).
    pub error: Option<String>,
}

impl Row {
    pub fn failed(label: &str, error: String) -> Row {
        Row {
            label: label.to_owned(),
            kernel: "?".to_owned(),
            outcomes: Vec::new(),
            seconds: 0.0,
            error: Some(error),
        }
    }

    pub fn failed_any(&self) -> bool {
        self.error.is_some() || self.outcomes.iter().any(|o| matches!(o, Outcome::Fail(_)))
    }

    pub fn summary(&self) -> String {
        if let Some(error) = &self.error {
            return format!("ERROR {error}");
        }
        let count = |f: fn(&Outcome) -> bool| self.outcomes.iter().filter(|o| f(o)).count();
        format!(
            "{} passed, {} failed, {} skipped",
            count(|o| matches!(o, Outcome::Pass(_))),
            count(|o| matches!(o, Outcome::Fail(_))),
            count(|o| matches!(o, Outcome::Skip(_)))
        )
    }
}

/// The markdown table, then each failure's and skip's reason.
pub fn table(rows: &[Row]) -> String {
    let mut out = format!("| kernel | {} | time |\n", CHECKS.join(" | "));
    out.push_str(&format!("|---|{}---|\n", "---|".repeat(CHECKS.len())));
    let mut notes = Vec::new();
    for row in rows {
        let kernel = if row.label == "host" {
            format!("{} (host)", row.kernel)
        } else {
            row.kernel.clone()
        };
        out.push_str(&format!("| {kernel} |"));
        if let Some(error) = &row.error {
            out.push_str(&format!(" **ERROR** |{}", " |".repeat(CHECKS.len() - 1)));
            notes.push(format!("- {}: {error}", row.label));
        } else {
            for (check, outcome) in CHECKS.iter().zip(&row.outcomes) {
                out.push_str(&format!(" {} |", outcome.cell()));
                match outcome {
                    Outcome::Fail(why) => notes.push(format!("- {kernel}, {check}: FAIL {why}")),
                    Outcome::Skip(why) => notes.push(format!("- {kernel}, {check}: SKIP {why}")),
                    Outcome::Pass(_) => {}
                }
            }
        }
        out.push_str(&format!(" {:.0} s |\n", row.seconds));
    }
    if !notes.is_empty() {
        out.push('\n');
        out.push_str(&notes.join("\n"));
        out.push('\n');
    }
    out
}

/// Reads the results directory checks.sh filled. `config` is the kernel's build config, when
/// known: it is what can justify a warning or a skip.
pub fn judge(label: &str, results: &Path, config: Option<&str>) -> Row {
    let read = |name: &str| std::fs::read_to_string(results.join(name)).unwrap_or_default();
    let status = |name: &str| read(&format!("{name}.rc")).trim().parse::<i32>().ok();
    let shown = |name: &str| results.join(name).display().to_string();
    let kernel = read("uname").trim().to_owned();
    let mut outcomes = Vec::new();

    // What the kernel was built without. Only then may a check be skipped.
    let missing: Vec<&str> = config
        .map(|c| {
            [
                "CONFIG_BPF_SYSCALL",
                "CONFIG_BPF_EVENTS",
                "CONFIG_PERF_EVENTS",
            ]
            .into_iter()
            .filter(|option| !c.lines().any(|l| l == format!("{option}=y")))
            .collect()
        })
        .unwrap_or_default();
    let no_btf = config.is_some_and(|c| !c.lines().any(|l| l == "CONFIG_DEBUG_INFO_BTF=y"));

    outcomes.push(judge_check(&read("check.out"), status("check"), no_btf));
    if !missing.is_empty() {
        let why = format!("kernel built without {}", missing.join(", "));
        outcomes.extend((1..CHECKS.len()).map(|_| Outcome::Skip(why.clone())));
        return Row {
            label: label.to_owned(),
            kernel,
            outcomes,
            seconds: 0.0,
            error: None,
        };
    }

    outcomes.push(match status("record") {
        Some(0) => judge_call_tree(&read("calltree.folded")),
        _ => Outcome::Fail(format!(
            "scorch record failed: {} (in {})",
            last_line(&read("record.out")),
            shown("record.out")
        )),
    });

    // Judged like the call tree: the shares, and leaf_a's stacks through run_a and dispatch to
    // main, which without frame pointers only the unwind tables can give.
    let record_nofp = read("record-nofp.out");
    outcomes.push(match status("record-nofp") {
        Some(0) if record_nofp.contains("does not pass this kernel's verifier") => {
            Outcome::Skip(format!(
                "this kernel's verifier refuses the BPF unwinder, so frame pointers walk: {}",
                record_nofp
                    .lines()
                    .find(|l| l.contains("does not pass this kernel's verifier"))
                    .unwrap_or_default()
                    .trim()
            ))
        }
        Some(0) => judge_call_tree(&read("calltree_nofp.folded")),
        _ => Outcome::Fail(format!(
            "scorch record failed: {} (in {})",
            last_line(&read("record-nofp.out")),
            shown("record-nofp.out")
        )),
    });

    outcomes.push(match status("record-go") {
        Some(0) => judge_go_tree(&read("gotree.folded")),
        _ => Outcome::Fail(format!(
            "scorch record failed: {} (in {})",
            last_line(&read("record-go.out")),
            shown("record-go.out")
        )),
    });

    outcomes.push(match status("record-python") {
        Some(0) => judge_python_tree(&read("calltree-py.folded")),
        _ => Outcome::Fail(format!(
            "scorch record failed: {} (in {})",
            last_line(&read("record-python.out")),
            shown("record-python.out")
        )),
    });

    outcomes.push(match status("off-cpu") {
        Some(0) => judge_off_cpu(&read("off-cpu.folded")),
        _ => Outcome::Fail(format!(
            "scorch record --off-cpu failed: {} (in {})",
            last_line(&read("off-cpu.out")),
            shown("off-cpu.out")
        )),
    });

    outcomes.push(match status("ceilings") {
        Some(0) => judge_ceilings(&read("ceilings.out")),
        _ => Outcome::Fail(format!(
            "scorch record at the least ceilings failed: {} (in {})",
            last_line(&read("ceilings.out")),
            shown("ceilings.out")
        )),
    });

    outcomes.push(match status("query-readzero") {
        Some(0) => judge_kernel_stacks(&read("query-readzero.folded")),
        _ => Outcome::Fail(format!("query failed, see {}", shown("query-readzero.out"))),
    });

    let calltree = read("query-calltree.folded");
    outcomes.push(match (status("run"), status("query-calltree")) {
        (Some(0), Some(0)) if calltree.contains(";leaf_a ") => Outcome::Pass(format!(
            "{} samples",
            folded(&calltree).iter().map(|(_, c)| c).sum::<u64>()
        )),
        (Some(0), Some(0)) => Outcome::Fail(format!(
            "the stored windows hold no leaf_a: {}",
            shown("query-calltree.folded")
        )),
        (Some(0), _) => Outcome::Fail(format!(
            "scorch query failed: {}",
            shown("query-calltree.out")
        )),
        _ => Outcome::Fail(format!(
            "scorch run did not stop cleanly: {} (in {})",
            last_line(&read("run.out")),
            shown("run.out")
        )),
    });

    let health = read("healthz.out");
    outcomes.push(if status("healthz") == Some(0) && health.trim() == "ok" {
        Outcome::Pass(String::new())
    } else {
        Outcome::Fail(format!("/healthz answered {:?}", health.trim()))
    });

    Row {
        label: label.to_owned(),
        kernel,
        outcomes,
        seconds: 0.0,
        error: None,
    }
}

/// `scorch check` passes with every line OK. A WARN fails it unless the kernel's config
/// explains it (then it is a skip with that reason); no FAIL may appear.
fn judge_check(output: &str, status: Option<i32>, no_btf: bool) -> Outcome {
    let mut unjustified = Vec::new();
    let mut justified = Vec::new();
    for line in output.lines() {
        if line.starts_with("FAIL") {
            return Outcome::Fail(line.to_owned());
        }
        if line.starts_with("WARN") {
            if no_btf && line.starts_with("WARN BTF") {
                justified.push("kernel built without CONFIG_DEBUG_INFO_BTF".to_owned());
            } else if line.starts_with("WARN BPF unwinder") && line.contains("verifier refuses") {
                // The kernel's verifier, not scorch's setup: said in the row, never a pass.
                justified.push(format!(
                    "this kernel's verifier refuses the BPF unwinder: {line}"
                ));
            } else {
                unjustified.push(line.to_owned());
            }
        }
    }
    let lines = output.lines().filter(|l| l.starts_with("OK  ")).count();
    if status != Some(0) {
        return Outcome::Fail(format!("exit status {status:?}: {}", last_line(output)));
    }
    if lines == 0 {
        return Outcome::Fail("no check lines".to_owned());
    }
    if !unjustified.is_empty() {
        return Outcome::Fail(unjustified.join("; "));
    }
    if !justified.is_empty() {
        return Outcome::Skip(justified.join("; "));
    }
    // What the kernel's verifier walked of the sampler's unwinder: the margin to its limit.
    let verified = output
        .lines()
        .find(|l| l.contains("BPF unwinder"))
        .and_then(|l| l.split("the verifier walked ").nth(1))
        .and_then(|rest| rest.split(' ').next());
    match verified {
        Some(n) => Outcome::Pass(format!("{lines} OK; unwinder verified in {n} instructions")),
        None => Outcome::Pass(format!("{lines} OK")),
    }
}

/// A recording whose maps all sat at their least ceilings: it sampled, its stack maps held
/// one entry each, and the stacks that found no room were counted as lost, not dropped.
fn judge_ceilings(output: &str) -> Outcome {
    let Some(summary) = output.lines().rev().find(|l| l.starts_with("scorch: ")) else {
        return Outcome::Fail(format!("no summary line: {}", last_line(output)));
    };
    let number_after = |label: &str| -> u64 {
        summary
            .split(label)
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let samples = number_after("scorch: ");
    let full = number_after("user stack error: ");
    if samples < 100 {
        return Outcome::Fail(format!("only {samples} samples: {summary}"));
    }
    // `stack maps at their fullest: stacks 1 of 1 entries, user stacks 1 of 1`.
    let fill = summary
        .split("stack maps at their fullest: ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .unwrap_or_default();
    let capacities: Vec<&str> = fill
        .split(", ")
        .filter_map(|part| part.split(" of ").nth(1))
        .collect();
    if capacities != ["1 entries", "1"] {
        return Outcome::Fail(format!(
            "the stack maps were not held to one entry: {summary}"
        ));
    }
    if full == 0 {
        return Outcome::Fail(format!(
            "a one-entry user-stack map lost no stack, or did not count it: {summary}"
        ));
    }
    Outcome::Pass(format!("{full} of {samples} user stacks counted lost"))
}

/// The leaves' shares against 6:3:1, and leaf_a's stacks reaching main.
fn judge_call_tree(text: &str) -> Outcome {
    let stacks = folded(text);
    let total: u64 = stacks.iter().map(|(_, c)| c).sum();
    if total < MIN_SAMPLES {
        return Outcome::Fail(format!("only {total} samples at 199 Hz over 10 s"));
    }
    let mut shares = [0.0; 3];
    for (i, leaf) in LEAVES.iter().enumerate() {
        let count: u64 = stacks
            .iter()
            .filter(|(frames, _)| frames.last().map(String::as_str) == Some(*leaf))
            .map(|(_, c)| c)
            .sum();
        shares[i] = count as f64 / total as f64;
    }
    let leaf_a: u64 = stacks
        .iter()
        .filter(|(f, _)| f.last().map(String::as_str) == Some("leaf_a"))
        .map(|(_, c)| c)
        .sum();
    let chain: u64 = stacks
        .iter()
        .filter(|(f, _)| f.ends_with(&["main", "dispatch", "run_a", "leaf_a"].map(String::from)))
        .map(|(_, c)| c)
        .sum();
    let shown = format!(
        "{:.2}/{:.2}/{:.2} of {total}",
        shares[0], shares[1], shares[2]
    );
    if let Some(i) = (0..3).find(|&i| (shares[i] - EXPECTED[i]).abs() > TOLERANCE) {
        return Outcome::Fail(format!(
            "{} has {:.3} of the samples, expected {:.2} ± {TOLERANCE}: shares {shown}",
            LEAVES[i], shares[i], EXPECTED[i]
        ));
    }
    if (chain as f64) < 0.9 * leaf_a as f64 {
        return Outcome::Fail(format!(
            "only {chain} of {leaf_a} leaf_a stacks are main;dispatch;run_a;leaf_a"
        ));
    }
    Outcome::Pass(shown)
}

/// The functions of tests/workloads/gotree.go and their shares of the samples under
/// `main.run`.
const GO_SHARES: [(&str, f64); 5] = [
    ("main.compute", 0.75),
    ("main.matmul", 0.5),
    ("main.reduce", 0.25),
    ("main.parse", 0.125),
    ("main.digest", 0.125),
];

/// The stripped Go call tree: each function's share within [`TOLERANCE`], nearly every sample
/// under `main.main` (a walk that loses its way in Go code ends short of it), and the
/// frameless leaf `spin` under the function that called it, which only its pc table's
/// stack-pointer deltas give (a frame-pointer walk skips that caller).
fn judge_go_tree(text: &str) -> Outcome {
    let stacks = folded(text);
    let total: u64 = stacks.iter().map(|(_, c)| c).sum();
    if total < MIN_SAMPLES {
        return Outcome::Fail(format!("only {total} samples at 199 Hz over 10 s"));
    }
    let count = |test: &dyn Fn(&[String]) -> bool| -> u64 {
        stacks
            .iter()
            .filter(|(frames, _)| test(frames))
            .map(|(_, c)| c)
            .sum()
    };
    let has = |frames: &[String], function: &str| frames.iter().any(|f| f == function);
    let in_main = count(&|f| has(f, "main.main"));
    if (in_main as f64) < 0.9 * total as f64 {
        return Outcome::Fail(format!("only {in_main} of {total} samples reach main.main"));
    }
    let run = count(&|f| has(f, "main.run"));
    let mut shown = Vec::new();
    for (function, expected) in GO_SHARES {
        let share = count(&|f| has(f, function)) as f64 / run.max(1) as f64;
        if (share - expected).abs() > TOLERANCE {
            return Outcome::Fail(format!(
                "{function} has {share:.3} of main.run's samples, expected {expected} ± \
                 {TOLERANCE}"
            ));
        }
        shown.push(format!("{share:.2}"));
    }
    let spin = count(&|f| f.last().is_some_and(|leaf| leaf == "main.spin"));
    let spin_under_caller = count(&|f| {
        f.len() >= 2
            && f[f.len() - 1] == "main.spin"
            && ["main.parse", "main.matmul", "main.reduce"].contains(&f[f.len() - 2].as_str())
    });
    if (spin_under_caller as f64) < 0.95 * spin as f64 {
        return Outcome::Fail(format!(
            "only {spin_under_caller} of {spin} main.spin stacks are under its caller"
        ));
    }
    Outcome::Pass(format!("{} of {total}", shown.join("/")))
}

/// The functions of tests/workloads/calltree.py and their shares of the samples under `run`:
/// parse 1, matmul 3, reduce 2 and digest 1 part of 7.
const PYTHON_SHARES: [(&str, f64); 4] = [
    ("parse", 1.0 / 7.0),
    ("matmul", 3.0 / 7.0),
    ("reduce", 2.0 / 7.0),
    ("digest", 1.0 / 7.0),
];

/// Python's shares are held to 4 points, as issue 50 asks of the arm64 guests.
const PYTHON_TOLERANCE: f64 = 0.04;

/// The Python call tree: its functions named from the interpreter's memory, each one's share
/// of `run`'s samples within [`PYTHON_TOLERANCE`], and `run` under `main` in nearly all of
/// the process's samples.
fn judge_python_tree(text: &str) -> Outcome {
    let stacks = folded(text);
    let total: u64 = stacks.iter().map(|(_, c)| c).sum();
    if total < MIN_SAMPLES {
        return Outcome::Fail(format!("only {total} samples at 199 Hz over 10 s"));
    }
    let count = |function: &str| -> u64 {
        stacks
            .iter()
            .filter(|(frames, _)| frames.iter().any(|f| f == function))
            .map(|(_, c)| c)
            .sum()
    };
    let run = count("run");
    if (run as f64) < 0.9 * total as f64 {
        return Outcome::Fail(format!(
            "only {run} of {total} samples are under the Python function run"
        ));
    }
    let mut shown = Vec::new();
    for (function, expected) in PYTHON_SHARES {
        let share = count(function) as f64 / run as f64;
        if (share - expected).abs() > PYTHON_TOLERANCE {
            return Outcome::Fail(format!(
                "{function} has {share:.3} of run's samples, expected {expected:.3} ± \
                 {PYTHON_TOLERANCE}"
            ));
        }
        shown.push(format!("{share:.2}"));
    }
    Outcome::Pass(format!("{} of {total}", shown.join("/")))
}

/// The blocking functions of tests/workloads/blocker.c and their shares of the time the three
/// spend blocked together: 6 ms, 3 ms and 1 ms of each 10 ms.
const BLOCKERS: [(&str, f64); 3] = [
    ("sleep_in_nanosleep", 0.6),
    ("read_from_pipe", 0.3),
    ("wait_for_mutex", 0.1),
];

/// Each blocking function's share of the off-CPU time of the three, within 0.1 (an emulated
/// machine keeps the workload's 10 ms schedule loosely; the host's integration test holds
/// each function to 10% of the time the workload measured), under the kernel's sleep.
fn judge_off_cpu(text: &str) -> Outcome {
    let stacks = folded(text);
    let blocked = |function: &str| -> u64 {
        stacks
            .iter()
            .filter(|(f, _)| f.iter().any(|frame| frame == function))
            .map(|(_, c)| c)
            .sum()
    };
    let times = BLOCKERS.map(|(function, _)| blocked(function));
    let total: u64 = times.iter().sum();
    if total == 0 {
        return Outcome::Fail("no off-CPU time in the blocking functions".to_owned());
    }
    let shares = times.map(|t| t as f64 / total as f64);
    let shown = format!("{:.2}/{:.2}/{:.2}", shares[0], shares[1], shares[2]);
    if let Some(i) = (0..3).find(|&i| (shares[i] - BLOCKERS[i].1).abs() > 0.1) {
        return Outcome::Fail(format!(
            "{} has {:.3} of the blocked time, expected {:.2}: shares {shown}",
            BLOCKERS[i].0, shares[i], BLOCKERS[i].1
        ));
    }
    let asleep = stacks
        .iter()
        .any(|(f, _)| f.iter().any(|frame| frame == "do_nanosleep_[k]"));
    if !asleep {
        return Outcome::Fail("no do_nanosleep kernel frame under the sleeps".to_owned());
    }
    Outcome::Pass(shown)
}

/// Most of the /dev/zero reader's samples pass through a named kernel read path.
fn judge_kernel_stacks(text: &str) -> Outcome {
    let stacks = folded(text);
    let total: u64 = stacks.iter().map(|(_, c)| c).sum();
    let named: u64 = stacks
        .iter()
        .filter(|(f, _)| f.iter().any(|frame| frame == "vfs_read_[k]"))
        .map(|(_, c)| c)
        .sum();
    if total == 0 {
        return Outcome::Fail("no samples of readzero stored".to_owned());
    }
    let share = named as f64 / total as f64;
    if share < 0.5 {
        return Outcome::Fail(format!(
            "only {named} of {total} readzero samples pass through vfs_read_[k]"
        ));
    }
    Outcome::Pass(format!("{:.0}% vfs_read", share * 100.0))
}

/// `comm;f1;f2 count` lines -> (frames, count).
fn folded(text: &str) -> Vec<(Vec<String>, u64)> {
    text.lines()
        .filter_map(|line| {
            let (stack, count) = line.rsplit_once(' ')?;
            Some((
                stack.split(';').map(str::to_owned).collect(),
                count.parse().ok()?,
            ))
        })
        .collect()
}

fn last_line(text: &str) -> &str {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_warnings_fail_unless_the_kernel_explains_them() {
        let ok = "OK   kernel version         6.1.0\nOK   BTF                    present\n";
        assert_eq!(
            judge_check(ok, Some(0), false),
            Outcome::Pass("2 OK".into())
        );
        let unwinder = format!(
            "{ok}OK   BPF unwinder           user stacks walked with .eh_frame tables (--unwind \
             auto); the verifier walked 54505 instructions of its 1,000,000\n"
        );
        assert_eq!(
            judge_check(&unwinder, Some(0), false),
            Outcome::Pass("3 OK; unwinder verified in 54505 instructions".into())
        );
        let warn = format!("{ok}WARN kptr_restrict          0: hides addresses\n");
        assert!(matches!(
            judge_check(&warn, Some(0), false),
            Outcome::Fail(_)
        ));
        let btf = "OK   kernel version         5.4\nWARN BTF                    missing\n";
        assert!(matches!(judge_check(btf, Some(0), false), Outcome::Fail(_)));
        assert!(matches!(judge_check(btf, Some(0), true), Outcome::Skip(_)));
        let fail = "FAIL BPF program loads      verifier said no\n";
        assert!(matches!(
            judge_check(fail, Some(1), false),
            Outcome::Fail(_)
        ));
        assert!(matches!(judge_check(ok, Some(1), false), Outcome::Fail(_)));
        let refused =
            format!("{ok}WARN BPF unwinder           this kernel's verifier refuses it\n");
        assert!(matches!(
            judge_check(&refused, Some(0), false),
            Outcome::Skip(_)
        ));
        // The unwinder loads, but a tracepoint it needs is missing: scorch's own gap.
        let no_hook = format!(
            "{ok}WARN BPF unwinder           user stacks walked with .eh_frame tables; but the \
             vm_unmapped_area tracepoint cannot be attached (not found)\n"
        );
        assert!(matches!(
            judge_check(&no_hook, Some(0), false),
            Outcome::Fail(_)
        ));
    }

    #[test]
    fn ceilings_need_one_entry_maps_and_counted_losses() {
        let summary = |lost: &str, fill: &str| {
            format!(
                "INFO profiling\nscorch: 1180 samples from 9 processes in 6.00s (1 windows); \
                 lost: {lost}; unwind: completed: 40; wrote x (folded); stack maps at their \
                 fullest: {fill}; BPF 900 ns/sample\n"
            )
        };
        let one = "stacks 1 of 1 entries, user stacks 1 of 1";
        assert_eq!(
            judge_ceilings(&summary(
                "user stack error: 1100, kernel stack collision: 9",
                one
            )),
            Outcome::Pass("1100 of 1180 user stacks counted lost".into())
        );
        // Nothing counted lost, or maps larger than the ceiling asked.
        assert!(matches!(
            judge_ceilings(&summary("none", one)),
            Outcome::Fail(_)
        ));
        assert!(matches!(
            judge_ceilings(&summary(
                "user stack error: 3",
                "stacks 1 of 1024 entries, user stacks 1 of 1"
            )),
            Outcome::Fail(_)
        ));
        assert!(matches!(judge_ceilings("error: no"), Outcome::Fail(_)));
    }

    #[test]
    fn call_tree_shares_are_judged() {
        let good = "calltree;main;dispatch;run_a;leaf_a 600\n\
                    calltree;main;dispatch;run_b;leaf_b 300\n\
                    calltree;main;dispatch;run_c;leaf_c 100\n";
        assert!(matches!(judge_call_tree(good), Outcome::Pass(_)));
        let skewed = "calltree;main;dispatch;run_a;leaf_a 300\n\
                      calltree;main;dispatch;run_b;leaf_b 600\n\
                      calltree;main;dispatch;run_c;leaf_c 100\n";
        assert!(matches!(judge_call_tree(skewed), Outcome::Fail(_)));
        let broken_chain = "calltree;leaf_a 600\ncalltree;leaf_b 300\ncalltree;leaf_c 100\n";
        assert!(matches!(judge_call_tree(broken_chain), Outcome::Fail(_)));
        assert!(matches!(
            judge_call_tree("calltree;main;dispatch;run_a;leaf_a 6\n"),
            Outcome::Fail(_)
        ));
    }

    #[test]
    fn kernel_stacks_need_named_frames() {
        let blocked = "blocker;sleep_in_nanosleep;do_nanosleep_[k] 600\n\
                       blocker;read_from_pipe;pipe_read_[k] 300\n\
                       blocker;wait_for_mutex;futex_wait_[k] 100\n";
        assert!(matches!(judge_off_cpu(blocked), Outcome::Pass(_)));
        let skewed = blocked.replace(" 300", " 600");
        assert!(matches!(judge_off_cpu(&skewed), Outcome::Fail(_)));
        assert!(matches!(judge_off_cpu(""), Outcome::Fail(_)));
        let named = "readzero;main;read;entry_SYSCALL_64_[k];vfs_read_[k];read_iter_zero_[k] 90\n\
                     readzero;main 10\n";
        assert!(matches!(judge_kernel_stacks(named), Outcome::Pass(_)));
        let unnamed = "readzero;main;read;0xffffffff81234567_[k] 90\n";
        assert!(matches!(judge_kernel_stacks(unnamed), Outcome::Fail(_)));
        assert!(matches!(judge_kernel_stacks(""), Outcome::Fail(_)));
    }
}
