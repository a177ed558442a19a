//! What a bench measured, as data: each bench writes one [`BenchResult`] to
//! `target/bench/<name>.json` beside its markdown report, and `report` renders every result
//! there into `docs/benchmarks.md`. Figures keep their runs' median and range; the machine and
//! commit travel with them, so a result read later still says where it came from.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::bench::{
    measure::{command_output, median, status_field},
    Bench,
};

/// Where a bench ran: what `docs/benchmarks.md`'s header and each section's line give.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Host {
    /// UTC, `YYYY-MM-DDTHH:MMZ`: sorts as it reads, so the newest result heads the file.
    pub date: String,
    /// The short commit hash, `-dirty` when tracked files differed from it.
    pub commit: String,
    pub cpu_model: String,
    pub cpus: usize,
    pub memory_gib: f64,
    /// `uname -r`.
    pub kernel: String,
}

impl Host {
    /// This machine, now.
    pub fn current() -> Host {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|c| {
                c.lines()
                    .find_map(|l| l.strip_prefix("model name"))
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
            })
            .unwrap_or_default();
        let memory_kib = status_field("/proc/meminfo", "MemTotal:").unwrap_or(0);
        let mut commit = command_output("git", &["rev-parse", "--short", "HEAD"]);
        let clean = std::process::Command::new("git")
            .args(["diff", "--quiet", "HEAD", "--"])
            .status()
            .is_ok_and(|s| s.success());
        if !clean && !commit.is_empty() {
            commit.push_str("-dirty");
        }
        Host {
            date: command_output("date", &["-u", "+%Y-%m-%dT%H:%MZ"]),
            commit,
            cpu_model,
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            memory_gib: memory_kib as f64 / (1 << 20) as f64,
            kernel: command_output("uname", &["-r"]),
        }
    }

    /// The machine alone, without the date and commit: `2 × Xeon ..., 24 GiB, kernel 6.18`.
    pub fn machine(&self) -> String {
        format!(
            "{} × {}, {:.0} GiB, kernel {}",
            self.cpus, self.cpu_model, self.memory_gib, self.kernel
        )
    }
}

/// One bench's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    pub bench: Bench,
    pub host: Host,
    /// The command that measured them, e.g. `cargo xtask bench --only overhead --runs 3`.
    pub command: String,
    pub tables: Vec<Table>,
    /// Lines another program printed with its figures (the agent's own benches, heaptrack),
    /// kept as it wrote them.
    #[serde(default)]
    pub lines: Vec<String>,
}

impl BenchResult {
    /// A result measured on this machine now.
    pub fn new(bench: Bench, command: String) -> BenchResult {
        BenchResult {
            bench,
            host: Host::current(),
            command,
            tables: Vec::new(),
            lines: Vec::new(),
        }
    }

    /// The table with this id.
    pub fn table(&self, id: &str) -> Option<&Table> {
        self.tables.iter().find(|t| t.id == id)
    }

    /// Writes `target/bench/<bench>.json` under `root`.
    pub fn save(&self, root: &Path) -> Result<PathBuf> {
        let path = path_of(root, self.bench);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("bench: results written to {}", path.display());
        Ok(path)
    }

    /// Reads `bench`'s results under `root`, `None` when it has written none.
    pub fn load(root: &Path, bench: Bench) -> Result<Option<BenchResult>> {
        let path = path_of(root, bench);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let result = serde_json::from_str(&text)
            .with_context(|| format!("{}: not results this xtask reads", path.display()))?;
        Ok(Some(result))
    }
}

fn path_of(root: &Path, bench: Bench) -> PathBuf {
    root.join("target/bench")
        .join(format!("{}.json", bench.name()))
}

/// A table of figures: one row per thing measured, one column per figure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table {
    /// A name for lookups (`capture`), never shown.
    pub id: String,
    pub title: String,
    /// The heading of the row labels' column.
    pub label: String,
    /// The figures' headings, with their units.
    pub columns: Vec<String>,
    pub rows: Vec<Row>,
    /// What the table's figures are, in words: how they were measured, never a figure.
    #[serde(default)]
    pub note: String,
}

impl Table {
    pub fn new(id: &str, title: &str, label: &str, columns: &[&str]) -> Table {
        Table {
            id: id.to_owned(),
            title: title.to_owned(),
            label: label.to_owned(),
            columns: columns.iter().map(|c| (*c).to_owned()).collect(),
            rows: Vec::new(),
            note: String::new(),
        }
    }

    pub fn with_note(mut self, note: &str) -> Table {
        self.note = note.to_owned();
        self
    }

    pub fn row(&mut self, label: impl Into<String>, cells: Vec<Cell>) {
        self.rows.push(Row {
            label: label.into(),
            cells,
        });
    }

    /// The cell of the row labelled `row` under the column named `column`.
    pub fn cell(&self, row: &str, column: &str) -> Option<&Cell> {
        let at = self.columns.iter().position(|c| c == column)?;
        self.rows.iter().find(|r| r.label == row)?.cells.get(at)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub label: String,
    pub cells: Vec<Cell>,
}

/// One figure over the runs that measured it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// Runs with a value.
    pub runs: usize,
    /// Decimals to show.
    pub decimals: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Cell {
    Figure(Figure),
    Text {
        text: String,
    },
    /// Nothing measured here (perf holds no BPF maps).
    Missing,
}

impl Cell {
    /// The figure of `values` (NaN, a figure a run could not read, left out), or
    /// [`Cell::Missing`] when none has one.
    pub fn of(values: &[f64], decimals: usize) -> Cell {
        let mut kept: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        if kept.is_empty() {
            return Cell::Missing;
        }
        kept.sort_by(f64::total_cmp);
        Cell::Figure(Figure {
            median: median(kept.clone()),
            min: kept[0],
            max: kept[kept.len() - 1],
            runs: kept.len(),
            decimals,
        })
    }

    /// One value, measured once.
    pub fn one(value: f64, decimals: usize) -> Cell {
        Cell::of(&[value], decimals)
    }

    pub fn text(text: impl Into<String>) -> Cell {
        Cell::Text { text: text.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_keeps_the_median_and_range_of_the_finite_values() {
        assert_eq!(
            Cell::of(&[3.0, f64::NAN, 1.0, 2.0], 1),
            Cell::Figure(Figure {
                median: 2.0,
                min: 1.0,
                max: 3.0,
                runs: 3,
                decimals: 1
            })
        );
        assert_eq!(Cell::of(&[f64::NAN], 1), Cell::Missing);
        assert_eq!(Cell::of(&[], 0), Cell::Missing);
    }

    #[test]
    fn results_read_back_as_written() {
        let mut table = Table::new("capture", "Capture", "tool", &["CPU s", "maps MiB"]);
        table.row("perf", vec![Cell::of(&[0.2, 0.3], 2), Cell::Missing]);
        table.row("note", vec![Cell::text("n/a"), Cell::one(4.0, 0)]);
        let result = BenchResult {
            bench: Bench::Overhead,
            host: Host {
                date: "2026-12-05".into(),
                commit: "9dc4898".into(),
                cpu_model: "Xeon".into(),
                cpus: 2,
                memory_gib: 24.0,
                kernel: "6.18.44".into(),
            },
            command: "cargo xtask bench --only overhead".into(),
            tables: vec![table],
            lines: vec!["unwind: x".into()],
        };
        let text = serde_json::to_string(&result).unwrap();
        let back: BenchResult = serde_json::from_str(&text).unwrap();
        assert_eq!(back, result);
        assert_eq!(
            back.table("capture").unwrap().cell("perf", "maps MiB"),
            Some(&Cell::Missing)
        );
        assert!(matches!(
            back.table("capture").unwrap().cell("perf", "CPU s"),
            Some(Cell::Figure(f)) if f.median == 0.3 && f.min == 0.2
        ));
    }
}
