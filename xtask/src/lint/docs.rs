//! The documents' promises to their readers, checked:
//!
//! - README.md stays a README: at most [`README_MAX_BYTES`], its first commands the two a
//!   newcomer runs (`cargo xtask run -- record ...`, then `cargo xtask test`), the markers the
//!   bench writes its cost table between, and no relative link to a file that is not there.
//! - `.ci/run` runs `cargo xtask test`, the second of those commands.
//! - docs/benchmarks.md was written by the current `cargo xtask bench`: the renderer's marker,
//!   the header's fields, and a section for every bench.

use std::path::Path;

use anyhow::{Context, Result};

use crate::bench::{report, Bench};

/// The README's size limit: what a reader takes in at one sitting. The rest goes in docs/.
pub const README_MAX_BYTES: usize = 15_000;

/// The first command the README shows starts with this; the second is [`TEST_COMMAND`].
pub const RECORD_COMMAND: &str = "cargo xtask run -- record";
pub const TEST_COMMAND: &str = "cargo xtask test";

/// Every problem with the documents under `root`, each naming its file.
pub fn check(root: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    if let Some(readme) = read(root, "README.md", &mut problems)? {
        problems.extend(readme_problems(&readme));
        let targets: std::collections::BTreeSet<String> =
            relative_links(&readme).into_iter().collect();
        for target in targets {
            if !root.join(&target).exists() {
                problems.push(format!(
                    "README.md: links to {target}, which does not exist"
                ));
            }
        }
    }
    if let Some(ci) = read(root, ".ci/run", &mut problems)? {
        problems.extend(ci_problems(&ci));
    }
    if let Some(benchmarks) = read(root, "docs/benchmarks.md", &mut problems)? {
        problems.extend(benchmarks_problems(&benchmarks));
    }
    Ok(problems)
}

/// The file at `path` under `root`; a missing one is a problem, not an error.
fn read(root: &Path, path: &str, problems: &mut Vec<String>) -> Result<Option<String>> {
    match std::fs::read_to_string(root.join(path)) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            problems.push(format!("{path} is missing"));
            Ok(None)
        }
        Err(e) => Err(e).with_context(|| format!("reading {path}")),
    }
}

/// What is wrong with the README's text.
pub fn readme_problems(text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if text.len() > README_MAX_BYTES {
        problems.push(format!(
            "README.md: {} bytes (limit {README_MAX_BYTES}): move the detail to docs/",
            text.len()
        ));
    }
    let commands = shown_commands(text);
    let first = commands.first().map(String::as_str);
    if !first.is_some_and(|c| c.starts_with(RECORD_COMMAND)) {
        problems.push(format!(
            "README.md: the first command shown must be `{RECORD_COMMAND} ...`, not {first:?}"
        ));
    }
    let second = commands.get(1).map(String::as_str);
    if second != Some(TEST_COMMAND) {
        problems.push(format!(
            "README.md: the second command shown must be `{TEST_COMMAND}`, not {second:?}"
        ));
    }
    let begin = text.find(report::README_BEGIN);
    let end = text.find(report::README_END);
    if !matches!((begin, end), (Some(b), Some(e)) if b < e) {
        problems.push(format!(
            "README.md: the cost table's markers are missing (`{}` then `{}`): `cargo xtask \
             bench` writes the table between them",
            report::README_BEGIN,
            report::README_END
        ));
    }
    problems
}

/// The commands of the fenced code blocks, in order: each line that is not blank nor a
/// comment, without a trailing `# comment`.
pub fn shown_commands(text: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            inside = !inside;
            continue;
        }
        let line = line.trim();
        if !inside || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let command = line.split(" #").next().unwrap_or(line).trim_end();
        commands.push(command.to_owned());
    }
    commands
}

/// The files the text links to by a relative path: `[text](docs/x.md#part)` gives
/// `docs/x.md`; addresses and anchors alone are left out.
pub fn relative_links(text: &str) -> Vec<String> {
    let mut links = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split('#').next().unwrap_or("").trim();
        let external = target.contains("://") || target.starts_with("mailto:");
        if !target.is_empty() && !external && !target.contains(' ') {
            links.push(target.to_owned());
        }
    }
    links
}

/// What is wrong with `.ci/run`: it must run the README's second command.
pub fn ci_problems(text: &str) -> Vec<String> {
    let runs_tests = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .any(|l| l == TEST_COMMAND || l.starts_with(&format!("{TEST_COMMAND} ")));
    if runs_tests {
        Vec::new()
    } else {
        vec![format!(".ci/run: does not run `{TEST_COMMAND}`")]
    }
}

/// What is wrong with docs/benchmarks.md: anything that says the current renderer did not
/// write it.
pub fn benchmarks_problems(text: &str) -> Vec<String> {
    let why = "not written by the current `cargo xtask bench` (run `cargo xtask bench \
               --render-only` after a bench)";
    let mut problems = Vec::new();
    if text.lines().next() != Some(report::MARKER) {
        problems.push(format!(
            "docs/benchmarks.md: {why}: its first line is not `{}`",
            report::MARKER
        ));
    }
    for field in report::HEADER_FIELDS {
        let filled = text
            .lines()
            .any(|l| l.strip_prefix(field).is_some_and(|v| !v.trim().is_empty()));
        if !filled {
            problems.push(format!(
                "docs/benchmarks.md: {why}: the header has no `{}` line",
                field.trim()
            ));
        }
    }
    for bench in Bench::ALL {
        let heading = report::section_heading(bench);
        if !text.lines().any(|l| l == heading) {
            problems.push(format!("docs/benchmarks.md: {why}: no section `{heading}`"));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::{README_BEGIN, README_END};

    fn readme(commands: &str, padding: usize) -> String {
        format!(
            "# scorch\n\nWhat it is.\n\n```sh\n{commands}```\n\n{README_BEGIN}\n| t |\n{README_END}\n{}",
            "x".repeat(padding)
        )
    }

    const GOOD: &str = "cargo xtask run -- record --duration 10s --output flame.svg   # a flame graph\n\
                        cargo xtask test                                              # every test\n";

    #[test]
    fn a_readme_with_the_two_commands_first_passes() {
        assert_eq!(readme_problems(&readme(GOOD, 0)), Vec::<String>::new());
        // The two may also come in two blocks, with comments and blank lines around.
        let split = format!(
            "# x\n\n```sh\n# first\ncargo xtask run -- record -o a.svg\n```\n\ntext\n\n```\n\n\
             cargo xtask test\n```\n{README_BEGIN}\n{README_END}\n"
        );
        assert_eq!(readme_problems(&split), Vec::<String>::new());
    }

    #[test]
    fn a_readme_over_the_limit_fails() {
        let problems = readme_problems(&readme(GOOD, README_MAX_BYTES));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("(limit 15000)"), "{problems:?}");
    }

    #[test]
    fn the_two_commands_must_come_first_and_in_order() {
        let swapped = "cargo xtask test\ncargo xtask run -- record\n";
        assert_eq!(readme_problems(&readme(swapped, 0)).len(), 2);
        let other_first = format!("sudo dpkg -i scorch.deb\n{GOOD}");
        let problems = readme_problems(&readme(&other_first, 0));
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("first command"), "{problems:?}");
        let renamed = "cargo xtask run -- record\ncargo xtask test-all\n";
        let problems = readme_problems(&readme(renamed, 0));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("second command"), "{problems:?}");
        assert_eq!(
            readme_problems("no code at all").len(),
            3,
            "two commands and the markers"
        );
    }

    #[test]
    fn the_cost_table_markers_must_be_there_in_order() {
        let text = format!("```\n{GOOD}```\n{README_END}\n{README_BEGIN}\n");
        let problems = readme_problems(&text);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("markers"), "{problems:?}");
    }

    #[test]
    fn relative_links_are_found_and_addresses_left_out() {
        let text = "[a](docs/kernels.md#bpf) [b](https://x.org/y) [c](#top) [d](LICENSE) \
                    ![ui](docs/ui.png) [e](mailto:x@y)";
        assert_eq!(
            relative_links(text),
            ["docs/kernels.md", "LICENSE", "docs/ui.png"]
        );
    }

    #[test]
    fn ci_must_run_the_tests() {
        assert!(ci_problems("#!/bin/sh\nset -e\ncargo xtask test\n").is_empty());
        assert!(ci_problems("cargo xtask test integration\n").is_empty());
        assert_eq!(ci_problems("# cargo xtask test\ncargo test\n").len(), 1);
    }

    #[test]
    fn benchmarks_written_by_the_renderer_pass_and_others_fail() {
        let host = crate::bench::results::Host {
            date: "2026-12-05".into(),
            commit: "9dc4898".into(),
            cpu_model: "Xeon".into(),
            cpus: 2,
            memory_gib: 24.0,
            kernel: "6.18.44".into(),
        };
        let rendered = report::render(&[], &host, "");
        assert_eq!(benchmarks_problems(&rendered), Vec::<String>::new());
        // By hand: no marker, no header.
        let by_hand = "# Benchmarks\n\n| tool | CPU |\n";
        let problems = benchmarks_problems(by_hand);
        assert_eq!(
            problems.len(),
            1 + report::HEADER_FIELDS.len() + Bench::ALL.len(),
            "{problems:?}"
        );
        // An older renderer's: another marker.
        let older = rendered.replacen("(format 1)", "(format 0)", 1);
        assert_eq!(benchmarks_problems(&older).len(), 1);
        // A field left empty, a section gone.
        let emptied = rendered.replace("- Kernel: 6.18.44", "- Kernel: ");
        assert_eq!(benchmarks_problems(&emptied).len(), 1);
        let cut = rendered.replace(&report::section_heading(Bench::Scale), "## Scale");
        assert_eq!(benchmarks_problems(&cut).len(), 1);
    }
}
