//! The timeline: CPU (or, for off-CPU windows, blocked) seconds per step of a range, one
//! series per value of a label, read from
//! each window's per-series totals (`window_totals`) without touching a stack. A day of 10 s
//! windows is 8,640 short blobs. [`bucket`] is the pure part: windows' totals in, the top
//! series and "other" out.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use super::codec::{decode_rows, for_each_total, totals_of_rows};
use super::reader::{QueryLimits, Reader};
use super::{Labels, SampleKind, Store, StoreError, TimeRange};
use crate::sys::time::unix_ns;

/// What a timeline covers and how it is cut.
#[derive(Debug, Clone)]
pub struct TimelineRequest {
    pub range: TimeRange,
    /// Nanoseconds per point; the caller bounds the number of steps.
    pub step_ns: i64,
    /// The label whose values name the series; `None` for one series of everything.
    pub group_by: Option<String>,
    /// Series kept by total CPU; the rest are summed into one series, "other".
    pub limit: usize,
    /// Which windows: CPU samples, or off-CPU time (whose values are blocked seconds).
    pub kind: SampleKind,
}

/// The answer: `points` are `[unix_seconds, cpu_seconds]`, one per step, in every series.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timeline {
    pub from: f64,
    pub to: f64,
    pub step: f64,
    pub group_by: Option<String>,
    /// Largest total first; "other", when there is one, last.
    pub series: Vec<TimelineSeries>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimelineSeries {
    /// The label's value; empty for series that lack the label (or, without `group_by`, for
    /// the one series).
    pub name: String,
    /// The sum of the series beyond the limit.
    pub other: bool,
    /// CPU seconds over the whole range.
    pub total: f64,
    pub points: Vec<(f64, f64)>,
}

/// One window's contribution to one group: (group, window start, CPU nanoseconds).
pub type Contribution = (usize, i64, u64);

/// Cuts `contributions` into the request's steps and keeps the `limit` groups of most CPU
/// (ties by name), summing the others into "other". `names[group]` names each group.
pub fn bucket(
    request: &TimelineRequest,
    names: &[String],
    contributions: impl IntoIterator<Item = Contribution>,
) -> Timeline {
    let from = unix_ns(request.range.from);
    let to = unix_ns(request.range.to);
    let step = request.step_ns.max(1);
    let steps = usize::try_from((to - from + step - 1) / step)
        .unwrap_or(0)
        .max(1);
    // Sparse per group, since most groups (processes) live for a few steps of a day.
    let mut per_group: Vec<Vec<(usize, u64)>> = vec![Vec::new(); names.len()];
    let mut totals = vec![0u64; names.len()];
    for (group, start, cpu_ns) in contributions {
        if start < from || start >= to || group >= names.len() {
            continue;
        }
        let index = ((start - from) / step) as usize;
        totals[group] = totals[group].saturating_add(cpu_ns);
        let points = &mut per_group[group];
        match points.last_mut() {
            Some((last, sum)) if *last == index => *sum = sum.saturating_add(cpu_ns),
            _ => points.push((index, cpu_ns)),
        }
    }
    let mut order: Vec<usize> = (0..names.len()).filter(|&g| totals[g] > 0).collect();
    order.sort_by(|&a, &b| {
        totals[b]
            .cmp(&totals[a])
            .then_with(|| names[a].cmp(&names[b]))
    });
    let seconds = |ns: u64| ns as f64 / 1e9;
    let dense = |groups: &[usize]| {
        let mut values = vec![0u64; steps];
        for &group in groups {
            for &(index, cpu_ns) in &per_group[group] {
                values[index] = values[index].saturating_add(cpu_ns);
            }
        }
        values
            .into_iter()
            .enumerate()
            .map(|(i, v)| (seconds((from + i as i64 * step) as u64), seconds(v)))
            .collect::<Vec<_>>()
    };
    let kept = order.len().min(request.limit);
    let mut series: Vec<TimelineSeries> = order[..kept]
        .iter()
        .map(|&group| TimelineSeries {
            name: names[group].clone(),
            other: false,
            total: seconds(totals[group]),
            points: dense(&[group]),
        })
        .collect();
    let rest = &order[kept..];
    if !rest.is_empty() {
        series.push(TimelineSeries {
            name: "other".into(),
            other: true,
            total: seconds(rest.iter().map(|&g| totals[g]).sum()),
            points: dense(rest),
        });
    }
    Timeline {
        from: from as f64 / 1e9,
        to: to as f64 / 1e9,
        step: step as f64 / 1e9,
        group_by: request.group_by.clone(),
        series,
    }
}

impl Store {
    /// Whether the store has per-window totals: a store of schema 2 read before a daemon
    /// upgraded it has not, and its timeline sums the sample rows instead.
    pub(super) fn has_totals(&self) -> Result<bool, StoreError> {
        self.connection
            .query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'window_totals'",
                [],
                |row| row.get::<_, i64>(0),
            )
            .map(|n| n > 0)
            .map_err(|e| self.sqlite(e))
    }

    /// Calls `each(window start, period, series, samples)` for every series of every window
    /// starting in `range`, oldest window first.
    fn for_each_total_in(
        &self,
        range: TimeRange,
        kind: SampleKind,
        limits: QueryLimits,
        mut each: impl FnMut(i64, i64, i64, u64) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let err = |e| self.sqlite(e);
        let totals = self.has_totals()?;
        let condition = self.kind_condition(kind);
        let sql = if totals {
            format!(
                "SELECT w.id, w.start_ns, w.period_ns, t.totals FROM windows w
                 JOIN window_totals t ON t.window = w.id
                 WHERE w.start_ns >= ?1 AND w.start_ns < ?2 AND {condition} ORDER BY w.start_ns"
            )
        } else {
            format!(
                "SELECT w.id, w.start_ns, w.period_ns, s.rows FROM windows w
                 JOIN window_samples s ON s.window = w.id
                 WHERE w.start_ns >= ?1 AND w.start_ns < ?2 AND {condition} ORDER BY w.start_ns"
            )
        };
        let _read = self.connection.unchecked_transaction().map_err(err)?;
        let mut statement = self.connection.prepare_cached(&sql).map_err(err)?;
        let mut rows = statement
            .query([unix_ns(range.from), unix_ns(range.to)])
            .map_err(err)?;
        let damaged = |window: i64| StoreError::Damaged {
            path: self.path.clone(),
            reason: format!("window {window}: its totals do not decode"),
        };
        while let Some(row) = rows.next().map_err(err)? {
            limits.check_time()?;
            let (window, start, period): (i64, i64, i64) = (
                row.get(0).map_err(err)?,
                row.get(1).map_err(err)?,
                row.get(2).map_err(err)?,
            );
            let blob = row
                .get_ref(3)
                .map_err(err)?
                .as_blob()
                .map_err(|e| err(e.into()))?;
            let mut result = Ok(());
            if totals {
                let decoded = for_each_total(blob, |series, value| {
                    if result.is_ok() {
                        result = each(start, period, series, value);
                    }
                });
                if !decoded {
                    return Err(damaged(window));
                }
            } else {
                let decoded = decode_rows(blob).ok_or_else(|| damaged(window))?;
                for (series, value) in totals_of_rows(&decoded) {
                    result = result.and_then(|()| each(start, period, series, value));
                }
            }
            result?;
        }
        Ok(())
    }

    /// The CPU timeline of the series `matches` accepts, per the request.
    pub fn timeline(
        &self,
        request: &TimelineRequest,
        matches: &dyn Fn(&Labels) -> bool,
        limits: QueryLimits,
    ) -> Result<Timeline, StoreError> {
        let mut reader = Reader::new(&self.connection, &self.path, self.shape);
        // Series id -> group index, or None when the selector drops it. Looked up once per
        // window and series (432,000 times for a day of 50 processes): a fast hasher.
        let mut group_of: HashMap<i64, Option<usize>, foldhash::fast::RandomState> =
            HashMap::default();
        let mut index_of: HashMap<String, usize> = HashMap::new();
        let mut names: Vec<String> = Vec::new();
        let mut contributions: Vec<Contribution> = Vec::new();
        self.for_each_total_in(
            request.range,
            request.kind,
            limits,
            |start, period, series, value| {
                let group = match group_of.get(&series) {
                    Some(&group) => group,
                    None => {
                        let group = reader.series(series)?.filter(|l| matches(l)).map(|labels| {
                            let name = match &request.group_by {
                                Some(label) => labels.get(label).cloned().unwrap_or_default(),
                                None => String::new(),
                            };
                            *index_of.entry(name.clone()).or_insert_with(|| {
                                names.push(name);
                                names.len() - 1
                            })
                        });
                        group_of.insert(series, group);
                        group
                    }
                };
                if let Some(group) = group {
                    let cpu_ns = value.saturating_mul(period.max(0) as u64);
                    contributions.push((group, start, cpu_ns));
                }
                Ok(())
            },
        )?;
        Ok(bucket(request, &names, contributions))
    }

    /// The label names of the series with samples in windows of `kind` starting in `range`,
    /// sorted.
    pub fn label_names(
        &self,
        range: TimeRange,
        kind: SampleKind,
        limits: QueryLimits,
    ) -> Result<Vec<String>, StoreError> {
        let mut ids = HashSet::new();
        self.for_each_total_in(range, kind, limits, |_, _, series, _| {
            ids.insert(series);
            Ok(())
        })?;
        let mut reader = Reader::new(&self.connection, &self.path, self.shape);
        let mut names = std::collections::BTreeSet::new();
        for id in ids {
            if let Some(labels) = reader.series(id)? {
                names.extend(labels.keys().cloned());
            }
        }
        Ok(names.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::Arc,
        time::{Duration, UNIX_EPOCH},
    };

    use rusqlite::Connection;

    use super::*;
    use crate::store::fixtures::window_at;
    use crate::store::{Retention, DATABASE_FILE};

    fn request(
        from: u64,
        to: u64,
        step: u64,
        group_by: Option<&str>,
        limit: usize,
    ) -> TimelineRequest {
        TimelineRequest {
            range: TimeRange {
                from: UNIX_EPOCH + Duration::from_secs(from),
                to: UNIX_EPOCH + Duration::from_secs(to),
            },
            step_ns: step as i64 * 1_000_000_000,
            group_by: group_by.map(str::to_owned),
            limit,
            kind: SampleKind::Cpu,
        }
    }

    const S: u64 = 1_000_000_000;

    #[test]
    fn bucketing_sums_steps_and_keeps_the_top_series() {
        let names: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let at = |s: i64| s * S as i64;
        let contributions = vec![
            (0, at(100), 2 * S),
            (0, at(105), S), // same 10 s step as the one before
            (1, at(110), 5 * S),
            (2, at(120), S),
            (2, at(95), 7 * S),  // before the range: ignored
            (2, at(130), 7 * S), // at `to`: ignored
        ];
        let timeline = bucket(
            &request(100, 130, 10, Some("comm"), 2),
            &names,
            contributions,
        );
        assert_eq!(timeline.step, 10.0);
        let got: Vec<_> = timeline
            .series
            .iter()
            .map(|s| (s.name.as_str(), s.other, s.total, s.points.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "b",
                    false,
                    5.0,
                    vec![(100.0, 0.0), (110.0, 5.0), (120.0, 0.0)]
                ),
                (
                    "a",
                    false,
                    3.0,
                    vec![(100.0, 3.0), (110.0, 0.0), (120.0, 0.0)]
                ),
                (
                    "other",
                    true,
                    1.0,
                    vec![(100.0, 0.0), (110.0, 0.0), (120.0, 1.0)]
                ),
            ]
        );
        // A range that is not a whole number of steps gets a last, partial step; nothing
        // seen, no series.
        let empty = bucket(&request(100, 125, 10, None, 5), &names, vec![]);
        assert!(empty.series.is_empty());
        let one = bucket(
            &request(100, 125, 10, None, 5),
            &names,
            vec![(1, at(121), S)],
        );
        assert_eq!(one.series[0].points.len(), 3);
    }

    fn labelled(seconds: u64, comm: &str, pid: u32) -> crate::profile::Profile {
        let mut profile = window_at(seconds);
        for sample in &mut profile.samples {
            sample.comm = comm.into();
            sample.pid = pid;
            sample.labels = Arc::new(Labels::from([
                ("comm".to_owned(), comm.to_owned()),
                ("pid".to_owned(), pid.to_string()),
                ("unit".to_owned(), "u.service".to_owned()),
            ]));
        }
        profile
    }

    #[test]
    fn each_kind_has_its_own_timeline() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path(), Retention::default()).unwrap();
        let now = crate::store::fixtures::now_secs() / 10 * 10;
        let cpu = labelled(now - 50, "a", 1);
        let mut off_cpu = labelled(now - 50, "a", 1);
        off_cpu.sample_type = crate::profile::SampleType::OffCpu {
            mean_ns: 1_000_000,
            min_ns: 0,
        };
        off_cpu.period_ns = 1;
        for sample in &mut off_cpu.samples {
            sample.count = 250_000_000;
        }
        store.write_window(&cpu).unwrap();
        store.write_window(&off_cpu).unwrap();
        let mut request = request(now - 100, now, 10, Some("comm"), 10);
        let cpu_timeline = store
            .timeline(&request, &|_| true, QueryLimits::NONE)
            .unwrap();
        let cpu_seconds = cpu.total_samples() as f64 * cpu.period_ns as f64 / 1e9;
        assert_eq!(cpu_timeline.series.len(), 1);
        assert!((cpu_timeline.series[0].total - cpu_seconds).abs() < 1e-9);
        request.kind = SampleKind::OffCpu;
        let off_timeline = store
            .timeline(&request, &|_| true, QueryLimits::NONE)
            .unwrap();
        // Blocked seconds: the values are nanoseconds, the period 1.
        let blocked = off_cpu.total_samples() as f64 / 1e9;
        assert!((off_timeline.series[0].total - blocked).abs() < 1e-9);
        let names = |kind| {
            store
                .label_names(request.range, kind, QueryLimits::NONE)
                .unwrap()
        };
        assert_eq!(names(SampleKind::OffCpu), names(SampleKind::Cpu));
    }

    #[test]
    fn timeline_reads_totals_by_label() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path(), Retention::default()).unwrap();
        let now = crate::store::fixtures::now_secs() / 10 * 10;
        // "a" for three windows, then "b" for two: one after the other.
        for i in 0..3 {
            store
                .write_window(&labelled(now - 100 + i * 10, "a", 1))
                .unwrap();
        }
        for i in 3..5 {
            store
                .write_window(&labelled(now - 100 + i * 10, "b", 2))
                .unwrap();
        }
        let per_window = window_at(0);
        let cpu = per_window.total_samples() as f64 * per_window.period_ns as f64 / 1e9;
        let timeline = store
            .timeline(
                &request(now - 100, now - 50, 10, Some("comm"), 10),
                &|_| true,
                QueryLimits::NONE,
            )
            .unwrap();
        let a = &timeline.series[0];
        let b = &timeline.series[1];
        assert_eq!((a.name.as_str(), b.name.as_str()), ("a", "b"));
        let values = |s: &TimelineSeries| s.points.iter().map(|p| p.1).collect::<Vec<_>>();
        assert_eq!(values(a), vec![cpu, cpu, cpu, 0.0, 0.0]);
        assert_eq!(values(b), vec![0.0, 0.0, 0.0, cpu, cpu]);
        // A selector, and no grouping: one series.
        let only_b = store
            .timeline(
                &request(now - 100, now - 50, 50, None, 10),
                &|l| l.get("comm").map(String::as_str) == Some("b"),
                QueryLimits::NONE,
            )
            .unwrap();
        assert_eq!(only_b.series.len(), 1);
        assert!((only_b.series[0].total - 2.0 * cpu).abs() < 1e-9);
        assert_eq!(
            store
                .label_names(
                    request(now - 100, now, 10, None, 1).range,
                    SampleKind::Cpu,
                    QueryLimits::NONE
                )
                .unwrap(),
            vec!["comm", "pid", "unit"]
        );
    }

    /// A store written before `window_totals` existed: its reader sums the rows, and the next
    /// writable open fills the totals from them, losing nothing.
    #[test]
    fn schema_2_stores_are_read_and_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let now = crate::store::fixtures::now_secs() / 10 * 10;
        {
            let mut store = Store::open(dir.path(), Retention::default()).unwrap();
            for i in 0..4 {
                let comm = if i < 2 { "a" } else { "b" };
                store
                    .write_window(&labelled(now - 100 + i * 10, comm, 1))
                    .unwrap();
            }
        }
        let all = || request(now - 100, now, 10, Some("comm"), 10);
        let expected = {
            let store = Store::open_read_only(dir.path()).unwrap();
            (
                store
                    .timeline(&all(), &|_| true, QueryLimits::NONE)
                    .unwrap(),
                store.query(all().range, &|_| true).unwrap(),
            )
        };
        // Back to what schema 2 was: no totals table, version 2.
        let path = dir.path().join(DATABASE_FILE);
        Connection::open(&path)
            .unwrap()
            .execute_batch(
                "DROP TABLE window_totals; PRAGMA user_version = 2; PRAGMA wal_checkpoint(TRUNCATE);",
            )
            .unwrap();
        let old = Store::open_read_only(dir.path()).unwrap();
        assert!(!old.has_totals().unwrap());
        assert_eq!(
            old.timeline(&all(), &|_| true, QueryLimits::NONE).unwrap(),
            expected.0
        );
        drop(old);
        let mut store = Store::open(dir.path(), Retention::default()).unwrap();
        assert!(store.has_totals().unwrap());
        assert_eq!(store.verify().unwrap(), 4);
        assert_eq!(
            store
                .timeline(&all(), &|_| true, QueryLimits::NONE)
                .unwrap(),
            expected.0
        );
        assert_eq!(store.query(all().range, &|_| true).unwrap(), expected.1);
        // Written after the upgrade, read with the rest.
        store.write_window(&labelled(now - 60, "b", 1)).unwrap();
        let after = store
            .timeline(&all(), &|_| true, QueryLimits::NONE)
            .unwrap();
        assert_eq!(after.series[0].name, "b");
        assert_eq!(
            after.series[0].points.iter().filter(|p| p.1 > 0.0).count(),
            3
        );
        let header: i32 = Connection::open(&path)
            .unwrap()
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .unwrap();
        assert_eq!(header, super::super::schema::SCHEMA_VERSION);
    }
}
