//! Differential profiles: what changed between a base range and a target range, in three
//! forms, all pure functions of the two merged profiles.
//!
//! - [`folded`] / [`svg`]: a differential flame graph. The two ranges are normalised to the
//!   same total first, so an hour compares with ten minutes. inferno draws a frame as wide as
//!   its second count and colours the leaf of each line by second minus first; each line is
//!   written `stack 2b b+t` so that a frame is as wide as both ranges together (what vanished
//!   stays visible) and its colour is `t - b`: red grew, blue shrank.
//! - [`top`]: each function's share of the base and of the target, and the change, in points.
//! - [`pprof`]: what `go tool pprof -diff_base base target` builds: the target's samples and the
//!   base's with negated values, the latter labelled `pprof::base=true` (so pprof takes its
//!   percentages of the base's total, as it does for `-diff_base`).

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write,
    sync::Arc,
};

use serde::Serialize;

use super::encode::{
    folded::fold,
    pprof as encode_pprof,
    svg::{inferno_options, Orientation, SvgError},
    top::top as top_table,
};
use super::{Labels, Profile, Sample};
use crate::pprof as pb;

/// The label pprof puts on a `-diff_base` profile's samples.
pub const BASE_LABEL: &str = "pprof::base";

/// Folded stacks and their counts.
fn counts(profile: &Profile) -> BTreeMap<String, u64> {
    fold(profile)
        .into_iter()
        .filter_map(|line| {
            let (stack, count) = line.rsplit_once(' ')?;
            Some((stack.to_owned(), count.parse().ok()?))
        })
        .collect()
}

/// Each stack's base and target samples, scaled so both ranges total the larger of their
/// totals; by stack.
fn normalised(base: &Profile, target: &Profile) -> BTreeMap<String, (u64, u64)> {
    let (base, target) = (counts(base), counts(target));
    let base_total: u64 = base.values().sum();
    let target_total: u64 = target.values().sum();
    let common = base_total.max(target_total) as f64;
    let scale = |count: u64, total: u64| -> u64 {
        if total == 0 {
            0
        } else {
            (count as f64 * common / total as f64).round() as u64
        }
    };
    let mut stacks: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (stack, count) in base {
        stacks.entry(stack).or_default().0 = scale(count, base_total);
    }
    for (stack, count) in target {
        stacks.entry(stack).or_default().1 = scale(count, target_total);
    }
    stacks
}

/// `stack base target` lines, normalised ([`normalised`]), sorted: the format of
/// `inferno-diff-folded` and FlameGraph's `difffolded.pl`, for other tools.
pub fn pairs(base: &Profile, target: &Profile) -> Vec<String> {
    normalised(base, target)
        .into_iter()
        .filter(|(_, (b, t))| b + t > 0)
        .map(|(stack, (b, t))| format!("{stack} {b} {t}"))
        .collect()
}

/// The lines [`svg`] draws: `stack 2b b+t` with `b` and `t` as in [`pairs`], so that inferno
/// (width: the second count; colour: second minus first) draws both ranges' width and the
/// change's colour.
pub fn folded(base: &Profile, target: &Profile) -> Vec<String> {
    normalised(base, target)
        .into_iter()
        .filter(|(_, (b, t))| b + t > 0)
        .map(|(stack, (b, t))| format!("{stack} {} {}", 2 * b, b + t))
        .collect()
}

/// [`folded`] of at most `max_stacks` stacks, the heaviest in both ranges together; the others
/// are summed into one `[N lighter stacks]` line, as the server bounds every flame graph (see
/// [`super::encode::folded::fold_heaviest`]).
pub fn folded_heaviest(base: &Profile, target: &Profile, max_stacks: usize) -> Vec<String> {
    let mut lines: Vec<(String, (u64, u64))> = normalised(base, target)
        .into_iter()
        .filter(|(_, (b, t))| b + t > 0)
        .collect();
    if lines.len() > max_stacks {
        lines.select_nth_unstable_by(max_stacks, |a, b| (b.1 .0 + b.1 .1).cmp(&(a.1 .0 + a.1 .1)));
        let rest = lines.split_off(max_stacks);
        let (b, t) = rest
            .iter()
            .fold((0, 0), |(b, t), (_, (rb, rt))| (b + rb, t + rt));
        lines.push((format!("[{} lighter stacks]", rest.len()), (b, t)));
        lines.sort_unstable();
    }
    lines
        .into_iter()
        .map(|(stack, (b, t))| format!("{stack} {} {}", 2 * b, b + t))
        .collect()
}

/// The differential flame graph, titled `title`, of at most `max_stacks` stacks when given
/// ([`folded_heaviest`]), growing as `orientation` says.
pub fn svg(
    base: &Profile,
    target: &Profile,
    title: &str,
    max_stacks: Option<usize>,
    orientation: Orientation,
) -> Result<Vec<u8>, SvgError> {
    let lines = match max_stacks {
        Some(max) => folded_heaviest(base, target, max),
        None => folded(base, target),
    };
    if lines.is_empty() {
        return super::encode::svg::encode(target, title, max_stacks, orientation);
    }
    let mut options = inferno_options(title, orientation, "samples (both ranges, normalised)");
    options.subtitle =
        Some("width: both ranges, each normalised to the same total; red grew, blue shrank".into());
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut svg)
        .map_err(|e| SvgError::new(e.to_string()))?;
    Ok(svg)
}

/// Each function's share of both ranges.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiffTop {
    pub base_total_samples: u64,
    pub total_samples: u64,
    pub period_ns: u64,
    /// Largest change of flat share first (either way), then of cum share.
    pub rows: Vec<DiffRow>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiffRow {
    pub function: String,
    pub kernel: bool,
    /// Percent of the range's samples with the function innermost, in the base and target.
    pub base_flat_percent: f64,
    pub flat_percent: f64,
    /// `flat_percent - base_flat_percent`: percentage points.
    pub flat_change: f64,
    /// Percent of the range's samples with the function anywhere on the stack.
    pub base_cum_percent: f64,
    pub cum_percent: f64,
    pub cum_change: f64,
}

/// The table of changes in share.
pub fn top(base: &Profile, target: &Profile) -> DiffTop {
    let (before, after) = (top_table(base), top_table(target));
    let mut rows: HashMap<&str, DiffRow> = HashMap::new();
    let blank = |function: &str, kernel: bool| DiffRow {
        function: function.to_owned(),
        kernel,
        base_flat_percent: 0.0,
        flat_percent: 0.0,
        flat_change: 0.0,
        base_cum_percent: 0.0,
        cum_percent: 0.0,
        cum_change: 0.0,
    };
    for row in &before.rows {
        let entry = rows
            .entry(&row.function)
            .or_insert_with(|| blank(&row.function, row.kernel));
        entry.base_flat_percent = row.flat_percent;
        entry.base_cum_percent = row.cum_percent;
    }
    for row in &after.rows {
        let entry = rows
            .entry(&row.function)
            .or_insert_with(|| blank(&row.function, row.kernel));
        entry.kernel |= row.kernel;
        entry.flat_percent = row.flat_percent;
        entry.cum_percent = row.cum_percent;
    }
    let mut rows: Vec<DiffRow> = rows
        .into_values()
        .map(|mut row| {
            row.flat_change = row.flat_percent - row.base_flat_percent;
            row.cum_change = row.cum_percent - row.base_cum_percent;
            row
        })
        .collect();
    rows.sort_by(|a, b| {
        b.flat_change
            .abs()
            .total_cmp(&a.flat_change.abs())
            .then_with(|| b.cum_change.abs().total_cmp(&a.cum_change.abs()))
            .then_with(|| a.function.cmp(&b.function))
    });
    DiffTop {
        base_total_samples: before.total_samples,
        total_samples: after.total_samples,
        period_ns: after.period_ns.max(before.period_ns),
        rows,
    }
}

/// The table as text, at most `limit` rows.
pub fn render_top(table: &DiffTop, limit: Option<usize>) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "Type: cpu, change in share: base {} samples, target {} samples",
        table.base_total_samples, table.total_samples
    );
    let _ = writeln!(
        text,
        "{:>7} {:>7} {:>8} {:>7} {:>7} {:>8}  function",
        "flat%0", "flat%", "change", "cum%0", "cum%", "change"
    );
    let shown = limit.unwrap_or(table.rows.len()).min(table.rows.len());
    for row in &table.rows[..shown] {
        let _ = writeln!(
            text,
            "{:>6.2}% {:>6.2}% {:>+7.2}pp {:>6.2}% {:>6.2}% {:>+7.2}pp  {}{}",
            row.base_flat_percent,
            row.flat_percent,
            row.flat_change,
            row.base_cum_percent,
            row.cum_percent,
            row.cum_change,
            row.function,
            if row.kernel { " [k]" } else { "" }
        );
    }
    text
}

/// The comparison profile, gzipped: `go tool pprof -diff_base`'s merge of the two.
pub fn pprof(base: &Profile, target: &Profile) -> Vec<u8> {
    encode_pprof::encode_message(&pprof_message(base, target))
}

/// [`pprof`] before encoding.
pub fn pprof_message(base: &Profile, target: &Profile) -> pb::Profile {
    let mut both = target.clone();
    let mappings = both.mappings.len();
    let locations = both.locations.len();
    both.mappings.extend(base.mappings.iter().cloned());
    both.locations.extend(base.locations.iter().map(|l| {
        let mut location = l.clone();
        location.mapping = location.mapping.map(|m| m + mappings);
        location
    }));
    // One marked label set per base label set, shared as the samples share theirs.
    let mut marked: HashMap<*const Labels, Arc<Labels>> = HashMap::new();
    for sample in &base.samples {
        let labels = marked
            .entry(Arc::as_ptr(&sample.labels))
            .or_insert_with(|| {
                let mut labels = sample.series_labels();
                labels.insert(BASE_LABEL.to_owned(), "true".to_owned());
                Arc::new(labels)
            })
            .clone();
        both.samples.push(Sample {
            labels,
            locations: sample.locations.iter().map(|&l| l + locations).collect(),
            ..sample.clone()
        });
    }
    both.period_ns = target.period_ns.max(base.period_ns);
    let mut message = encode_pprof::to_message(&both);
    let Some(key) = message.string_table.iter().position(|s| s == BASE_LABEL) else {
        return message; // no base samples
    };
    for sample in &mut message.sample {
        if sample.label.iter().any(|l| l.key == key as i64) {
            for value in &mut sample.value {
                *value = -*value;
            }
        }
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{encode::svg::layout, sample_profile};

    /// The sample profile with every sample's process renamed and counts multiplied.
    fn process(comm: &str, times: u64) -> Profile {
        let mut profile = sample_profile();
        for sample in &mut profile.samples {
            sample.comm = comm.into();
            sample.count *= times;
        }
        profile
    }

    #[test]
    fn folded_normalises_and_keeps_what_vanished() {
        // "a" only in the base (8 samples), "b" only in the target (4 samples): each range
        // scaled to 8; a's lines shrink to 0, b's grow from 0.
        let base = process("a", 2);
        let target = process("b", 1);
        let lines = folded(&base, &target);
        assert!(lines.iter().any(|l| l.starts_with("a;")), "{lines:?}");
        assert!(lines.iter().any(|l| l.starts_with("b;")), "{lines:?}");
        // Whatever the exact frames, a's lines have delta -width and b's +width.
        for line in &lines {
            let mut fields = line.rsplitn(3, ' ');
            let width: i64 = fields.next().unwrap().parse().unwrap();
            let first: i64 = fields.next().unwrap().parse().unwrap();
            let delta = width - first;
            if line.starts_with("a;") {
                assert_eq!(delta, -width, "{line}");
            } else {
                assert_eq!(delta, width, "{line}");
            }
        }
        let total = |prefix: &str| -> i64 {
            lines
                .iter()
                .filter(|l| l.starts_with(prefix))
                .map(|l| l.rsplit(' ').next().unwrap().parse::<i64>().unwrap())
                .sum()
        };
        assert_eq!(total("a;"), total("b;"), "both ranges scaled to one total");
        // The plain pairs: a's base counts scaled 8 -> 8, b's target 4 -> 8.
        let pairs = pairs(&base, &target);
        let sum = |prefix: &str, field: usize| -> u64 {
            pairs
                .iter()
                .filter(|l| l.starts_with(prefix))
                .map(|l| l.rsplit(' ').nth(field).unwrap().parse::<u64>().unwrap())
                .sum()
        };
        assert_eq!((sum("a;", 1), sum("a;", 0)), (8, 0), "{pairs:?}");
        assert_eq!((sum("b;", 1), sum("b;", 0)), (0, 8), "{pairs:?}");
        // The same profile twice: no change anywhere.
        for line in folded(&base, &base) {
            let mut fields = line.rsplitn(3, ' ');
            let width: i64 = fields.next().unwrap().parse().unwrap();
            let first: i64 = fields.next().unwrap().parse().unwrap();
            assert_eq!(width, first, "{line}");
        }
    }

    #[test]
    fn svg_colours_growth_red_and_shrinkage_blue() {
        let draw = |orientation| {
            let svg = svg(&process("a", 2), &process("b", 1), "t", None, orientation);
            String::from_utf8(svg.unwrap()).unwrap()
        };
        let svg = draw(Orientation::Icicle);
        // Bounded to one stack, the others are summed into the lighter-stacks line: the
        // totals of both ranges stay.
        let (base, target) = (process("a", 2), process("b", 1));
        let sums = |lines: &[String]| -> (u64, u64) {
            lines.iter().fold((0, 0), |(b, t), line| {
                let mut numbers = line.rsplitn(3, ' ');
                let second: u64 = numbers.next().unwrap().parse().unwrap();
                let first: u64 = numbers.next().unwrap().parse().unwrap();
                (b + first, t + second)
            })
        };
        let all = folded(&base, &target);
        let bounded = folded_heaviest(&base, &target, 1);
        assert_eq!(bounded.len(), 2, "{bounded:?}");
        let rest = format!("[{} lighter stacks] ", all.len() - 1);
        assert!(bounded.iter().any(|l| l.starts_with(&rest)), "{bounded:?}");
        assert_eq!(sums(&bounded), sums(&all));
        assert!(svg.contains("red grew, blue shrank"));
        // inferno writes each frame's fill as rgb(r,g,b): pure blue hue and pure red hue.
        assert!(svg.contains("rgb(100,100,255)"), "no shrinking frame");
        assert!(svg.contains("rgb(255,100,100)"), "no growing frame");
    }

    #[test]
    fn svg_grows_down_from_the_root_unless_classic() {
        let draw = |orientation| {
            let svg = svg(&process("a", 2), &process("b", 1), "t", None, orientation);
            String::from_utf8(svg.unwrap()).unwrap()
        };
        let icicle = draw(Orientation::Icicle);
        let root = layout::y_of(&icicle, "all");
        // Under the title, the subtitle and the details line; the processes one row below.
        assert!(root < 120.0, "root at {root}");
        assert_eq!(layout::y_of(&icicle, "a"), root + 16.0);
        let classic = draw(Orientation::Classic);
        let root = layout::y_of(&classic, "all");
        assert!(layout::height(&classic) - root < 60.0, "root at {root}");
        assert_eq!(layout::y_of(&classic, "b"), root - 16.0);
    }

    #[test]
    fn top_reports_change_in_share() {
        let mut target = sample_profile();
        // Half the samples in a new process with another leaf.
        let mut extra = target.samples[0].clone();
        extra.comm = "new".into();
        extra.locations = vec![3];
        extra.count = target.total_samples();
        target.samples.push(extra);
        let table = top(&sample_profile(), &target);
        assert_eq!(table.base_total_samples, 4);
        assert_eq!(table.total_samples, 8);
        let row = |name: &str| table.rows.iter().find(|r| r.function == name).unwrap();
        // vfs_read: 3 of 4 samples before, 3 of 8 after.
        assert_eq!(row("vfs_read").base_flat_percent, 75.0);
        assert_eq!(row("vfs_read").flat_percent, 37.5);
        assert_eq!(row("vfs_read").flat_change, -37.5);
        assert!(row("vfs_read").kernel);
        // [work] (the unnamed location): 1 of 4, then 5 of 8.
        assert_eq!(row("[work]").flat_change, 37.5);
        assert_eq!(table.rows[0].flat_change.abs(), 37.5);
        let text = render_top(&table, Some(1));
        assert!(
            text.contains("-37.50pp") || text.contains("+37.50pp"),
            "{text}"
        );
        assert_eq!(text.lines().count(), 3);
    }

    #[test]
    fn pprof_negates_the_base_and_labels_it() {
        let message = pprof_message(&process("a", 2), &process("b", 1));
        let key = message
            .string_table
            .iter()
            .position(|s| s == BASE_LABEL)
            .unwrap() as i64;
        let (mut base, mut target) = (0i64, 0i64);
        for sample in &message.sample {
            if sample.label.iter().any(|l| l.key == key) {
                assert!(sample.value.iter().all(|&v| v < 0));
                base += sample.value[0];
            } else {
                target += sample.value[0];
            }
        }
        assert_eq!((base, target), (-8, 4));
        // Without a base, the target as it is.
        let plain = pprof_message(
            &Profile {
                samples: vec![],
                ..sample_profile()
            },
            &process("b", 1),
        );
        assert!(plain.sample.iter().all(|s| s.value[0] > 0));
    }
}
