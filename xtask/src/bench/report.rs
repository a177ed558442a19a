//! `docs/benchmarks.md` and the README's cost table, rendered from the benches' results.
//!
//! [`render`] and [`readme_cost_table`] are pure: results in, markdown out. [`write`] is the
//! edge that reads `target/bench/*.json` and writes the two files; `cargo xtask bench` calls it
//! after every bench, and `cargo xtask bench --render-only` alone. The first line of the file
//! is [`MARKER`] and the header's fields start with [`HEADER_FIELDS`]: `cargo xtask lint` checks
//! both, so a file edited by hand or written by an older renderer fails CI.

use std::{fmt::Write as _, path::Path};

use anyhow::{Context, Result};

use crate::bench::{
    results::{BenchResult, Cell, Figure, Host, Table},
    Bench,
};

/// The first line of `docs/benchmarks.md`. Its format number goes up when the file's layout
/// changes, so the lint refuses a file the previous renderer wrote.
pub const MARKER: &str =
    "<!-- Written by `cargo xtask bench` (format 1) from target/bench/*.json: do not edit. -->";

/// The header's lines, each followed by its value.
pub const HEADER_FIELDS: [&str; 5] = [
    "- Date: ",
    "- Commit: ",
    "- CPU: ",
    "- Memory: ",
    "- Kernel: ",
];

/// Where the README's cost table starts and ends; the renderer replaces what is between.
pub const README_BEGIN: &str =
    "<!-- cost table: written by `cargo xtask bench --only overhead`; do not edit -->";
pub const README_END: &str = "<!-- end of cost table -->";

/// The heading of `bench`'s section.
pub fn section_heading(bench: Bench) -> String {
    format!("## {} (`--only {}`)", bench.title(), bench.name())
}

/// The whole of `docs/benchmarks.md` from the results there are; `fallback` is this machine,
/// for the header when no bench has written results.
pub fn render(results: &[BenchResult], fallback: &Host, earlier: &str) -> String {
    let kept = earlier_sections(earlier);
    // The newest result's machine heads the file; a section measured elsewhere or at another
    // commit says so on its own line.
    let header = results
        .iter()
        .max_by(|a, b| a.host.date.cmp(&b.host.date))
        .map_or(fallback, |r| &r.host);
    let mut out = String::new();
    out.push_str(MARKER);
    out.push_str("\n\n# Benchmarks\n\n");
    out.push_str(
        "What scorch costs the host it profiles, beside `perf` and `bpftrace`, as measured by \
         `cargo xtask bench` (as root; see `cargo xtask bench --help` for each bench and its \
         options). The bench writes this file: each figure is the median of the runs, with the \
         least and the most in brackets. Figures from a shared or virtual machine move from \
         day to day; compare tools within one run, and earlier figures in this file's git \
         history.\n\n",
    );
    if results.is_empty() {
        out.push_str("No bench has written results here yet. The machine that rendered it:\n\n");
    }
    let _ = writeln!(out, "{}{}", HEADER_FIELDS[0], header.date);
    let _ = writeln!(out, "{}{}", HEADER_FIELDS[1], header.commit);
    let _ = writeln!(
        out,
        "{}{} × {}",
        HEADER_FIELDS[2], header.cpus, header.cpu_model
    );
    let _ = writeln!(out, "{}{:.0} GiB", HEADER_FIELDS[3], header.memory_gib);
    let _ = writeln!(out, "{}{}", HEADER_FIELDS[4], header.kernel);
    for bench in Bench::ALL {
        let _ = write!(out, "\n{}\n\n{}\n\n", section_heading(bench), bench.about());
        match results.iter().find(|r| r.bench == bench) {
            Some(result) => section(&mut out, result, header),
            // Measured before, on a machine whose results are not here: kept as it was.
            None => match kept
                .iter()
                .find(|(heading, _)| *heading == section_heading(bench))
            {
                Some((_, body)) => out.push_str(body),
                None => {
                    let _ = writeln!(
                        out,
                        "Not run: `cargo xtask bench --only {}` writes this section.",
                        bench.name()
                    );
                }
            },
        }
    }
    out
}

/// The measured sections of an earlier rendering, by heading: each one's text from its
/// "Measured by" line to the next section, that line given the earlier header's date, commit
/// and machine where it had none of its own (it was measured then and there, and the new
/// header will be another's).
fn earlier_sections(text: &str) -> Vec<(String, String)> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or("")
            .to_owned()
    };
    let (date, commit) = (field(HEADER_FIELDS[0]), field(HEADER_FIELDS[1]));
    // As `Host::machine` writes it.
    let machine = format!(
        "{}, {}, kernel {}",
        field(HEADER_FIELDS[2]),
        field(HEADER_FIELDS[3]),
        field(HEADER_FIELDS[4])
    );
    let mut sections = Vec::new();
    for part in text.split("\n## ").skip(1) {
        let (heading, rest) = part.split_once('\n').unwrap_or((part, ""));
        let Some(at) = rest.find("Measured by ") else {
            continue;
        };
        let mut body = rest[at..].trim_end().to_owned() + "\n";
        let first = body.lines().next().unwrap_or("").to_owned();
        if let Some(stem) = first.strip_suffix('.') {
            let mut line = stem.to_owned();
            if !line.contains(" at commit ") {
                line += &format!(", {date} at commit {commit}");
            }
            if !line.contains(", on ") {
                line += &format!(", on {machine}");
            }
            body = body.replacen(&first, &format!("{line}."), 1);
        }
        sections.push((format!("## {heading}"), body));
    }
    sections
}

/// One bench's measured section: where and when, its tables, the lines it kept.
fn section(out: &mut String, result: &BenchResult, header: &Host) {
    let host = &result.host;
    let mut when = format!("`{}`", result.command);
    if host.date != header.date || host.commit != header.commit {
        let _ = write!(when, ", {} at commit {}", host.date, host.commit);
    }
    if host.machine() != header.machine() {
        let _ = write!(when, ", on {}", host.machine());
    }
    let _ = writeln!(out, "Measured by {when}.");
    for table in &result.tables {
        let _ = write!(out, "\n### {}\n\n", table.title);
        table_markdown(out, table);
        if !table.note.is_empty() {
            let _ = write!(out, "\n{}\n", table.note);
        }
    }
    if !result.lines.is_empty() {
        out.push_str("\nAs printed by the bench:\n\n```text\n");
        for line in &result.lines {
            let _ = writeln!(out, "{line}");
        }
        out.push_str("```\n");
    }
}

/// `table`'s header and rows as a markdown table.
pub fn table_markdown(out: &mut String, table: &Table) {
    let _ = writeln!(out, "| {} | {} |", table.label, table.columns.join(" | "));
    let _ = writeln!(out, "|---{}|", "|---".repeat(table.columns.len()));
    for row in &table.rows {
        let cells: Vec<String> = (0..table.columns.len())
            .map(|i| row.cells.get(i).map_or_else(String::new, cell_text))
            .collect();
        let _ = writeln!(out, "| {} | {} |", row.label, cells.join(" | "));
    }
}

/// A cell as the tables show it: `median [min-max]`, or the value alone when one run measured
/// it or every run read the same.
pub fn cell_text(cell: &Cell) -> String {
    match cell {
        Cell::Figure(Figure {
            median,
            min,
            max,
            runs,
            decimals,
        }) => {
            let d = *decimals;
            let shown = |v: f64| format!("{v:.d$}");
            if *runs <= 1 || shown(*min) == shown(*max) {
                shown(*median)
            } else {
                format!("{} [{}-{}]", shown(*median), shown(*min), shown(*max))
            }
        }
        Cell::Text { text } => text.clone(),
        Cell::Missing => "n/a".to_owned(),
    }
}

/// The columns of the overhead bench's capture table the README shows.
const README_COLUMNS: [&str; 4] = [
    "CPU s",
    "peak RSS MiB",
    "BPF maps MiB",
    "peak RSS + maps MiB",
];

/// The README's cost table, from the overhead bench's capture table; `None` when the result
/// has none.
pub fn readme_cost_table(overhead: &BenchResult) -> Option<String> {
    let capture = overhead.table("capture")?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| {} | CPU time | peak RSS | BPF maps | footprint (RSS + maps) |",
        capture.label
    );
    out.push_str("|---|---|---|---|---|\n");
    for row in &capture.rows {
        let cells: Vec<String> = README_COLUMNS
            .iter()
            .zip(["s", "MiB", "MiB", "MiB"])
            .map(|(column, unit)| match capture.cell(&row.label, column) {
                Some(cell @ Cell::Figure(_)) => format!("{} {unit}", cell_text(cell)),
                Some(Cell::Text { text }) => text.clone(),
                _ => "none".to_owned(),
            })
            .collect();
        let _ = writeln!(out, "| {} | {} |", row.label, cells.join(" | "));
    }
    let host = &overhead.host;
    let _ = write!(
        out,
        "\n{}; medians of the runs, [least-most]. Measured by `{}` on {} at commit {}, {}.\n",
        capture.title,
        overhead.command,
        host.machine(),
        host.commit,
        host.date
    );
    Some(out)
}

/// `text` with what lies between [`README_BEGIN`] and [`README_END`] replaced by `table`;
/// `None` when the markers are missing.
pub fn splice_readme(text: &str, table: &str) -> Option<String> {
    let begin = text.find(README_BEGIN)? + README_BEGIN.len();
    let end = begin + text[begin..].find(README_END)?;
    Some(format!("{}\n{}{}", &text[..begin], table, &text[end..]))
}

/// Renders `docs/benchmarks.md` from the results under `root`'s `target/bench/`, and the
/// README's cost table when the overhead bench has results.
pub fn write(root: &Path) -> Result<()> {
    let mut results = Vec::new();
    for bench in Bench::ALL {
        if let Some(result) = BenchResult::load(root, bench)? {
            results.push(result);
        }
    }
    let path = root.join("docs/benchmarks.md");
    // The sections of benches whose results are not on this machine stay as they were.
    let earlier = std::fs::read_to_string(&path).unwrap_or_default();
    std::fs::write(&path, render(&results, &Host::current(), &earlier))
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!(
        "bench: {} written from {} bench results",
        path.display(),
        results.len()
    );
    let overhead = results.iter().find(|r| r.bench == Bench::Overhead);
    if let Some(table) = overhead.and_then(readme_cost_table) {
        let readme = root.join("README.md");
        let text = std::fs::read_to_string(&readme)
            .with_context(|| format!("reading {}", readme.display()))?;
        let spliced = splice_readme(&text, &table).with_context(|| {
            format!(
                "{}: no cost table markers ({README_BEGIN})",
                readme.display()
            )
        })?;
        std::fs::write(&readme, spliced)
            .with_context(|| format!("writing {}", readme.display()))?;
        eprintln!("bench: the cost table in {} rewritten", readme.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(date: &str, commit: &str) -> Host {
        Host {
            date: date.into(),
            commit: commit.into(),
            cpu_model: "Intel Xeon".into(),
            cpus: 2,
            memory_gib: 24.0,
            kernel: "6.18.44".into(),
        }
    }

    fn overhead() -> BenchResult {
        let mut capture = Table::new(
            "capture",
            "Capture: 60 s at 19 Hz, every CPU busy",
            "tool",
            &[
                "CPU s",
                "peak RSS MiB",
                "BPF maps MiB",
                "peak RSS + maps MiB",
            ],
        )
        .with_note("BPF maps: the kernel memory of the maps each tool held.");
        capture.row(
            "`scorch record`",
            vec![
                Cell::of(&[0.36, 0.22, 0.47], 2),
                Cell::of(&[20.5, 20.3, 28.0], 1),
                Cell::of(&[6.0, 6.0, 9.5], 1),
                Cell::of(&[26.5, 26.3, 37.5], 1),
            ],
        );
        capture.row(
            "`perf record -g`",
            vec![
                Cell::of(&[0.26, 0.19, 0.27], 2),
                Cell::of(&[26.0, 25.9, 26.1], 1),
                Cell::Missing,
                Cell::Missing,
            ],
        );
        BenchResult {
            bench: Bench::Overhead,
            host: host("2026-12-05", "abc1234"),
            command: "cargo xtask bench --only overhead --runs 3".into(),
            tables: vec![capture],
            lines: Vec::new(),
        }
    }

    #[test]
    fn cells_show_the_median_and_the_range() {
        assert_eq!(
            cell_text(&Cell::of(&[0.36, 0.22, 0.47], 2)),
            "0.36 [0.22-0.47]"
        );
        assert_eq!(cell_text(&Cell::one(5.0, 1)), "5.0");
        assert_eq!(cell_text(&Cell::of(&[2.0, 2.01], 1)), "2.0");
        assert_eq!(cell_text(&Cell::Missing), "n/a");
        assert_eq!(cell_text(&Cell::text("none")), "none");
    }

    #[test]
    fn the_file_has_the_marker_the_header_and_a_section_per_bench() {
        let text = render(&[overhead()], &host("2027-01-01", "fffffff"), "");
        assert!(text.starts_with(MARKER));
        // The header is the results' machine, not the one rendering.
        assert!(text.contains("- Date: 2026-12-05\n- Commit: abc1234\n- CPU: 2 × Intel Xeon\n"));
        assert!(text.contains("- Memory: 24 GiB\n- Kernel: 6.18.44\n"));
        for bench in Bench::ALL {
            assert!(text.contains(&section_heading(bench)), "{bench:?}");
        }
        assert!(text.contains("Measured by `cargo xtask bench --only overhead --runs 3`.\n"));
        assert!(text.contains(
            "| tool | CPU s | peak RSS MiB | BPF maps MiB | peak RSS + maps MiB |\n\
             |---|---|---|---|---|\n\
             | `scorch record` | 0.36 [0.22-0.47] | 20.5 [20.3-28.0] | 6.0 [6.0-9.5] | 26.5 [26.3-37.5] |\n\
             | `perf record -g` | 0.26 [0.19-0.27] | 26.0 [25.9-26.1] | n/a | n/a |\n"
        ));
        assert!(text.contains("\nBPF maps: the kernel memory of the maps each tool held.\n"));
        assert!(text.contains("Not run: `cargo xtask bench --only slowdown` writes this section."));
    }

    #[test]
    fn without_results_the_header_is_the_rendering_machine_and_every_section_is_not_run() {
        let text = render(&[], &host("2027-01-01", "fffffff"), "");
        assert!(text.contains("No bench has written results here yet."));
        assert!(text.contains("- Commit: fffffff\n"));
        assert_eq!(
            text.matches("Not run: ").count(),
            Bench::ALL.len(),
            "{text}"
        );
    }

    #[test]
    fn a_section_measured_elsewhere_says_where_and_when() {
        let mut older = overhead();
        older.bench = Bench::Walk;
        older.host = Host {
            kernel: "6.1.0".into(),
            ..host("2026-11-01", "0123456")
        };
        older.lines = vec!["walk: 1 ns".into()];
        let text = render(&[overhead(), older], &host("2027-01-01", "fffffff"), "");
        assert!(text.contains(
            "Measured by `cargo xtask bench --only overhead --runs 3`, 2026-11-01 at commit \
             0123456, on 2 × Intel Xeon, 24 GiB, kernel 6.1.0."
        ));
        assert!(text.contains("```text\nwalk: 1 ns\n```\n"));
    }

    #[test]
    fn sections_measured_on_another_machine_are_kept_with_their_date() {
        let first = render(&[overhead()], &host("2027-01-01", "fffffff"), "");
        let mut walk = overhead();
        walk.bench = Bench::Walk;
        walk.command = "cargo xtask bench --only walk".into();
        walk.host = host("2027-02-01", "1111111");
        let second = render(&[walk], &host("2027-03-01", "2222222"), &first);
        // The new result heads the file; the overhead section, measured at the first file's
        // header, says when.
        assert!(second.contains("- Date: 2027-02-01\n- Commit: 1111111\n"));
        assert!(second.contains(
            "Measured by `cargo xtask bench --only overhead --runs 3`, 2026-12-05 at commit \
             abc1234, on 2 × Intel Xeon, 24 GiB, kernel 6.18.44.\n"
        ));
        assert!(second.contains("| `perf record -g` | 0.26 [0.19-0.27] |"));
        assert!(second.contains("Measured by `cargo xtask bench --only walk`.\n"));
        assert!(second.contains("Not run: `cargo xtask bench --only slowdown`"));
        // Rendered again from the second, nothing moves.
        let mut walk = overhead();
        walk.bench = Bench::Walk;
        walk.command = "cargo xtask bench --only walk".into();
        walk.host = host("2027-02-01", "1111111");
        assert_eq!(
            render(&[walk], &host("2027-03-01", "2222222"), &second),
            second
        );
    }

    #[test]
    fn the_readme_table_takes_the_capture_tables_footprint_columns() {
        let table = readme_cost_table(&overhead()).unwrap();
        assert!(table.contains(
            "| `scorch record` | 0.36 [0.22-0.47] s | 20.5 [20.3-28.0] MiB | 6.0 [6.0-9.5] MiB \
             | 26.5 [26.3-37.5] MiB |\n"
        ));
        assert!(table.contains(
            "| `perf record -g` | 0.26 [0.19-0.27] s | 26.0 [25.9-26.1] MiB | none | none |\n"
        ));
        assert!(table.contains("at commit abc1234, 2026-12-05."));
        let mut without = overhead();
        without.tables.clear();
        assert_eq!(readme_cost_table(&without), None);
    }

    #[test]
    fn the_readme_table_replaces_what_is_between_the_markers() {
        let readme = format!("# x\n\n{README_BEGIN}\nold\n{README_END}\n\nrest\n");
        assert_eq!(
            splice_readme(&readme, "new\n").unwrap(),
            format!("# x\n\n{README_BEGIN}\nnew\n{README_END}\n\nrest\n")
        );
        assert_eq!(splice_readme("# x\n", "new\n"), None);
    }
}
