//! Flat and cumulative CPU per function, like `go tool pprof -top`: the text `scorch query
//! --format top` prints and the rows of the web UI's table (as JSON).
//!
//! Flat is the samples whose innermost frame is the function (inlined functions count as
//! frames of their own, as in pprof); cum is the samples with the function anywhere on the
//! stack, counted once per sample however often a recursive function appears.

use std::{
    cmp::Reverse,
    collections::HashMap,
    fmt::Write,
    time::{Duration, SystemTime},
};

use serde::Serialize;

use crate::profile::Profile;

/// The table for a whole profile, heaviest flat first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Top {
    /// All samples in the profile, the denominator of every percentage.
    pub total_samples: u64,
    /// CPU nanoseconds one sample stands for.
    pub period_ns: u64,
    /// When the profile starts; the text header shows it.
    #[serde(skip)]
    pub start: SystemTime,
    /// The wall-clock span the profile covers; the text header shows it.
    #[serde(skip)]
    pub duration: Duration,
    pub rows: Vec<TopRow>,
}

/// One function's line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopRow {
    /// Display name; unnamed frames are `[binary]` or `[unknown]`, as in the flame graph.
    pub function: String,
    /// True when the function was seen in kernel frames.
    pub kernel: bool,
    /// Samples with this function innermost.
    pub flat: u64,
    pub flat_percent: f64,
    /// Running total of `flat_percent` down the table, this row included.
    pub sum_percent: f64,
    /// Samples with this function anywhere on the stack.
    pub cum: u64,
    pub cum_percent: f64,
}

/// Computes the table.
pub fn top(profile: &Profile) -> Top {
    // Functions are interned so a sample's "seen already" check is on small integers.
    let mut ids: HashMap<String, usize> = HashMap::new();
    let mut rows: Vec<TopRow> = Vec::new();
    let location_functions: Vec<Vec<usize>> = (0..profile.locations.len())
        .map(|index| {
            let kernel = profile.locations[index].kind.is_kernel();
            profile
                .location_names(index)
                .into_iter()
                .map(|name| {
                    let id = *ids.entry(name.clone()).or_insert_with(|| {
                        rows.push(TopRow {
                            function: name,
                            kernel: false,
                            flat: 0,
                            flat_percent: 0.0,
                            sum_percent: 0.0,
                            cum: 0,
                            cum_percent: 0.0,
                        });
                        rows.len() - 1
                    });
                    rows[id].kernel |= kernel;
                    id
                })
                .collect()
        })
        .collect();

    let mut seen: Vec<usize> = Vec::new();
    for sample in &profile.samples {
        let functions = sample
            .locations
            .iter()
            .filter_map(|&l| location_functions.get(l))
            .flatten();
        seen.clear();
        for &id in functions {
            if !seen.contains(&id) {
                seen.push(id);
                rows[id].cum += sample.count;
            }
        }
        // The innermost line of the leaf location: an inlined callee, when there is one.
        let leaf = sample
            .locations
            .first()
            .and_then(|&l| location_functions.get(l))
            .and_then(|functions| functions.first());
        if let Some(&id) = leaf {
            rows[id].flat += sample.count;
        }
    }

    let total = profile.total_samples();
    rows.retain(|row| row.cum > 0);
    rows.sort_by(|a, b| {
        (Reverse(a.flat), Reverse(a.cum), &a.function).cmp(&(
            Reverse(b.flat),
            Reverse(b.cum),
            &b.function,
        ))
    });
    let percent = |value: u64| {
        if total == 0 {
            0.0
        } else {
            value as f64 * 100.0 / total as f64
        }
    };
    let mut sum = 0;
    for row in &mut rows {
        sum += row.flat;
        row.flat_percent = percent(row.flat);
        row.sum_percent = percent(sum);
        row.cum_percent = percent(row.cum);
    }
    Top {
        total_samples: total,
        period_ns: profile.period_ns,
        start: profile.start,
        duration: profile.duration,
        rows,
    }
}

/// The pprof-style text for the whole profile, every function listed.
pub fn encode(profile: &Profile) -> String {
    render(&top(profile), None)
}

/// The pprof-style text: a header, then one line per function (at most `limit`), values as
/// CPU time.
pub fn render(top: &Top, limit: Option<usize>) -> String {
    let time = |samples: u64| format_cpu_time(samples.saturating_mul(top.period_ns));
    let total = top.total_samples;
    let shown = &top.rows[..limit.map_or(top.rows.len(), |l| l.min(top.rows.len()))];
    let shown_flat: u64 = shown.iter().map(|r| r.flat).sum();
    let busy = if top.duration.is_zero() {
        0.0
    } else {
        total.saturating_mul(top.period_ns) as f64 * 100.0 / top.duration.as_nanos() as f64
    };

    let mut text = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(text, "Type: cpu");
    let _ = writeln!(
        text,
        "Time: {}",
        humantime::format_rfc3339_seconds(top.start)
    );
    let _ = writeln!(
        text,
        "Duration: {}, Total samples = {} ({busy:5.2}%)",
        humantime::format_duration(Duration::from_secs(top.duration.as_secs())),
        time(total)
    );
    let _ = writeln!(
        text,
        "Showing nodes accounting for {}, {} of {} total",
        time(shown_flat),
        format_percent(shown_flat, total),
        time(total)
    );
    if shown.len() < top.rows.len() {
        let _ = writeln!(
            text,
            "Showing top {} nodes out of {}",
            shown.len(),
            top.rows.len()
        );
    }
    let _ = writeln!(
        text,
        "{:>10} {:>6} {:>6} {:>10} {:>6}",
        "flat", "flat%", "sum%", "cum", "cum%"
    );
    let mut sum = 0;
    for row in shown {
        sum += row.flat;
        let _ = writeln!(
            text,
            "{:>10} {:>6} {:>6} {:>10} {:>6}  {}",
            time(row.flat),
            format_percent(row.flat, total),
            format_percent(sum, total),
            time(row.cum),
            format_percent(row.cum, total),
            row.function
        );
    }
    text
}

/// pprof's way: `0`, `850ms`, `12.34s`.
fn format_cpu_time(nanos: u64) -> String {
    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;
    match nanos {
        0 => "0".to_owned(),
        n if n < MS => format!("{:.2}us", n as f64 / 1e3),
        n if n < S => format!("{}ms", (n + MS / 2) / MS),
        n => format!("{:.2}s", n as f64 / 1e9),
    }
}

/// `45.00%`, `100%` (pprof's form, which fits the 6-wide column).
fn format_percent(value: u64, total: u64) -> String {
    if total == 0 {
        return "0%".to_owned();
    }
    let ratio = value as f64 * 100.0 / total as f64;
    if (99.995..=100.005).contains(&ratio) {
        "100%".to_owned()
    } else {
        format!("{ratio:.2}%")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{sample_profile, FrameKind, Line, Location, Sample};

    fn row<'a>(top: &'a Top, function: &str) -> &'a TopRow {
        top.rows
            .iter()
            .find(|r| r.function == function)
            .unwrap_or_else(|| panic!("no row for {function}: {:?}", top.rows))
    }

    #[test]
    fn flat_and_cum_per_function() {
        let top = top(&sample_profile());
        assert_eq!(top.total_samples, 4);
        let table: Vec<(&str, u64, u64, bool)> = top
            .rows
            .iter()
            .map(|r| (r.function.as_str(), r.flat, r.cum, r.kernel))
            .collect();
        // Flat descending, then cum descending.
        assert_eq!(
            table,
            [
                ("vfs_read", 3, 3, true),
                ("[work]", 1, 1, false),
                ("main", 0, 4, false),
                ("leaf", 0, 3, false),
            ]
        );
        let vfs = row(&top, "vfs_read");
        assert_eq!(vfs.flat_percent, 75.0);
        assert_eq!(vfs.sum_percent, 75.0);
        assert_eq!(row(&top, "[work]").sum_percent, 100.0);
        assert_eq!(row(&top, "main").cum_percent, 100.0);
        assert_eq!(row(&top, "leaf").sum_percent, 100.0);
    }

    #[test]
    fn recursion_counts_once_in_cum() {
        let mut profile = sample_profile();
        // main -> main -> leaf: main is on the stack twice but the sample is one.
        profile.samples.push(Sample {
            pid: 42,
            comm: "work".into(),
            labels: std::sync::Arc::default(),
            locations: vec![1, 2, 2],
            count: 2,
        });
        let top = top(&profile);
        assert_eq!(top.total_samples, 6);
        assert_eq!(row(&top, "main").cum, 6);
        assert_eq!(row(&top, "leaf").flat, 2);
        assert_eq!(row(&top, "leaf").cum, 5);
    }

    #[test]
    fn inlined_functions_are_frames() {
        let mut profile = sample_profile();
        // `leaf`'s location also holds an inlined `helper`, innermost.
        profile.locations[1].lines.insert(0, Line::named("helper"));
        profile.samples[0].locations = vec![1, 2];
        let top = top(&profile);
        assert_eq!(row(&top, "helper").flat, 3);
        assert_eq!(row(&top, "helper").cum, 3);
        assert_eq!(row(&top, "leaf").flat, 0);
        assert_eq!(row(&top, "leaf").cum, 3);
        // Both levels of one location share a name with nothing else: no double count.
        profile.locations.push(Location {
            mapping: Some(1),
            address: 0x5400,
            lines: vec![Line::named("main"), Line::named("main")],
            kind: FrameKind::Native,
        });
        profile.samples[1].locations = vec![4, 2];
        assert_eq!(row(&super::top(&profile), "main").cum, 4);
    }

    #[test]
    fn functions_only_in_unsampled_locations_are_left_out() {
        let mut profile = sample_profile();
        profile.samples.remove(1);
        let top = top(&profile);
        assert!(top.rows.iter().all(|r| r.function != "[work]"));
    }

    #[test]
    fn empty_profile() {
        let mut profile = sample_profile();
        profile.samples.clear();
        let top = top(&profile);
        assert!(top.rows.is_empty());
        let text = render(&top, None);
        assert!(
            text.contains("Showing nodes accounting for 0, 0% of 0 total"),
            "{text}"
        );
    }

    #[test]
    fn text_looks_like_pprof() {
        let text = encode(&sample_profile());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "Type: cpu");
        assert_eq!(lines[1], "Time: 2023-11-14T22:13:20Z");
        // 4 samples at 52.6 ms: 211 ms of CPU in 10 s.
        assert_eq!(lines[2], "Duration: 10s, Total samples = 211ms ( 2.11%)");
        assert_eq!(
            lines[3],
            "Showing nodes accounting for 211ms, 100% of 211ms total"
        );
        assert_eq!(lines[4], "      flat  flat%   sum%        cum   cum%");
        assert_eq!(
            lines[5],
            "     158ms 75.00% 75.00%      158ms 75.00%  vfs_read"
        );
        assert_eq!(lines[7], "         0  0.00%   100%      211ms   100%  main");
        assert_eq!(lines.len(), 9);

        let limited = render(&top(&sample_profile()), Some(1));
        assert!(limited.contains("Showing nodes accounting for 158ms, 75.00% of 211ms total"));
        assert!(
            limited.contains("Showing top 1 nodes out of 4"),
            "{limited}"
        );
        assert!(!limited.contains("main"));
    }

    #[test]
    fn json_rows() {
        let json = serde_json::to_value(top(&sample_profile())).unwrap();
        assert_eq!(json["total_samples"], 4);
        assert_eq!(json["rows"][0]["function"], "vfs_read");
        assert_eq!(json["rows"][0]["flat"], 3);
        assert_eq!(json["rows"][0]["kernel"], true);
        assert_eq!(json["rows"][2]["cum_percent"], 100.0);
        assert!(json.get("start").is_none());
    }

    #[test]
    fn cpu_time_units() {
        assert_eq!(format_cpu_time(0), "0");
        assert_eq!(format_cpu_time(500), "0.50us");
        assert_eq!(format_cpu_time(52_631_578), "53ms");
        assert_eq!(format_cpu_time(1_234_000_000), "1.23s");
    }
}
