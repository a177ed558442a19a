//! Reading windows back: the merge of a time range into one `Profile`, the series a range
//! holds, and the list of windows. [`Reader`] rebuilds profile parts from rows, caching each
//! row it reads so a stack shared by many samples costs one lookup.

use std::{
    collections::{HashMap, HashSet},
    path::Path,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

/// Where x86-64's kernel half of the address space starts: no offset from `_text` reaches it.
const KERNEL_HALF: u64 = 0xffff_8000_0000_0000;

use rusqlite::{Connection, OptionalExtension};

use super::codec::{decode_rows, parse_labels, varints};
use super::schema::sample_type_of;
use super::{Labels, SampleKind, Store, StoreError, TimeRange};
use crate::profile::{FrameKind, Line, Location, Mapping, Profile, Sample, SampleType};
use crate::sys::time::{from_unix_ns, unix_ns};

impl Store {
    /// Merges the CPU windows that start in `range` and the series whose labels `matches`
    /// accepts into one profile (samples carry `pid` and `comm`).
    pub fn query(
        &self,
        range: TimeRange,
        matches: &dyn Fn(&Labels) -> bool,
    ) -> Result<Profile, StoreError> {
        self.query_within(range, SampleKind::Cpu, matches, QueryLimits::NONE)
    }

    /// [`Store::query`] of the windows of `kind`, within `limits`: a query from the network
    /// must not hold a blocking thread, or memory, without bound (`from=0` over a week of
    /// windows).
    pub fn query_within(
        &self,
        range: TimeRange,
        kind: SampleKind,
        matches: &dyn Fn(&Labels) -> bool,
        limits: QueryLimits,
    ) -> Result<Profile, StoreError> {
        let err = |e| self.sqlite(e);
        // One read transaction for every row read (see `window_profile`).
        let _read = self.connection.unchecked_transaction().map_err(err)?;
        let (from, to) = (unix_ns(range.from), unix_ns(range.to));
        let condition = self.kind_condition(kind);
        type Summary = (i64, Option<i64>, Option<i64>, Option<i64>, [Option<i64>; 3]);
        let (windows, first, last_end, period, [kind_column, mean, min]): Summary = self
            .connection
            .query_row(
                &format!(
                    "SELECT COUNT(*), MIN(start_ns), MAX(start_ns + duration_ns), MAX(period_ns),
                         {}
                     FROM windows WHERE start_ns >= ?1 AND start_ns < ?2 AND {condition}",
                    // The newest sampling rule of the range, when settings changed inside it.
                    match self.kinds {
                        true => "MAX(kind), MAX(off_cpu_mean_ns), MAX(off_cpu_min_ns)",
                        false => "0, 0, 0",
                    }
                ),
                [from, to],
                |row| {
                    Ok((
                        row.get(0)?,
                        row.get(1)?,
                        row.get(2)?,
                        row.get(3)?,
                        [row.get(4)?, row.get(5)?, row.get(6)?],
                    ))
                },
            )
            .map_err(err)?;
        let start = first.unwrap_or(from);
        let mut profile = Profile {
            start: from_unix_ns(start),
            duration: Duration::from_nanos(last_end.unwrap_or(start).saturating_sub(start) as u64),
            period_ns: period.unwrap_or(0) as u64,
            sample_type: match kind {
                SampleKind::Cpu => SampleType::Cpu,
                SampleKind::OffCpu => sample_type_of(
                    kind_column.unwrap_or(1),
                    mean.unwrap_or(0),
                    min.unwrap_or(0),
                ),
            },
            mappings: Vec::new(),
            locations: Vec::new(),
            samples: Vec::new(),
        };
        if windows == 0 {
            return Ok(profile);
        }
        let mut merged: HashMap<(i64, i64), u64> = HashMap::new();
        self.for_each_window_rows(
            &format!(
                "window IN (SELECT id FROM windows WHERE start_ns >= ?1 AND start_ns < ?2 \
                 AND {condition})"
            ),
            &[from, to],
            |series, stack, value| {
                *merged.entry((series, stack)).or_insert(0) += value;
                limits.check_stacks(merged.len())
            },
            limits,
        )?;
        let mut merged: Vec<_> = merged.into_iter().collect();
        // Stable output: the same store and range give the same profile.
        merged.sort_unstable();
        let mut reader = Reader::new(&self.connection, &self.path, self.shape);
        for (done, ((series, stack), value)) in merged.into_iter().enumerate() {
            if done % 1024 == 0 {
                limits.check_time()?;
            }
            let Some(labels) = reader.series(series)? else {
                continue;
            };
            if !matches(&labels) {
                continue;
            }
            let locations = reader.stack(stack, &mut profile)?;
            profile
                .samples
                .push(sample_of(&labels, locations, value as i64));
        }
        Ok(profile)
    }

    /// Calls `each(series, stack, value)` for every row of the windows `condition` (SQL over
    /// `window_samples.window`, with `params`) selects.
    pub(super) fn for_each_window_rows(
        &self,
        condition: &str,
        params: &[i64],
        mut each: impl FnMut(i64, i64, u64) -> Result<(), StoreError>,
        limits: QueryLimits,
    ) -> Result<(), StoreError> {
        let err = |e| self.sqlite(e);
        let mut statement = self
            .connection
            .prepare_cached(&format!(
                "SELECT window, rows FROM window_samples WHERE {condition}"
            ))
            .map_err(err)?;
        let mut rows = statement
            .query(rusqlite::params_from_iter(params))
            .map_err(err)?;
        while let Some(row) = rows.next().map_err(err)? {
            limits.check_time()?;
            let window: i64 = row.get(0).map_err(err)?;
            let blob: Vec<u8> = row.get(1).map_err(err)?;
            let decoded = decode_rows(&blob).ok_or_else(|| StoreError::Damaged {
                path: self.path.clone(),
                reason: format!("window {window}: its sample rows do not decode"),
            })?;
            for (series, stack, value) in decoded {
                each(series, stack, value)?;
            }
        }
        Ok(())
    }

    /// The label sets of series with samples in windows of `kind` starting in `range`.
    pub fn series(&self, range: TimeRange, kind: SampleKind) -> Result<Vec<Labels>, StoreError> {
        let mut ids = HashSet::new();
        self.for_each_window_rows(
            &format!(
                "window IN (SELECT id FROM windows WHERE start_ns >= ?1 AND start_ns < ?2 \
                 AND {})",
                self.kind_condition(kind)
            ),
            &[unix_ns(range.from), unix_ns(range.to)],
            |series, _, _| {
                ids.insert(series);
                Ok(())
            },
            QueryLimits::NONE,
        )?;
        let mut reader = Reader::new(&self.connection, &self.path, self.shape);
        let mut series = Vec::new();
        for id in ids {
            let labels = reader.series(id)?.ok_or_else(|| StoreError::Damaged {
                path: self.path.clone(),
                reason: format!("series {id}: labels are not a JSON object of strings"),
            })?;
            series.push(Arc::unwrap_or_clone(labels));
        }
        series.sort();
        Ok(series)
    }

    /// Windows stored: `(count, oldest start, newest start)`.
    pub fn windows(&self) -> Result<(u64, Option<SystemTime>, Option<SystemTime>), StoreError> {
        self.connection
            .query_row(
                "SELECT COUNT(*), MIN(start_ns), MAX(start_ns) FROM windows",
                [],
                |row| {
                    Ok((
                        row.get::<_, i64>(0)? as u64,
                        row.get::<_, Option<i64>>(1)?.map(from_unix_ns),
                        row.get::<_, Option<i64>>(2)?.map(from_unix_ns),
                    ))
                },
            )
            .map_err(|e| self.sqlite(e))
    }

    /// The time range of every stored window, oldest first.
    pub fn window_ranges(&self) -> Result<Vec<TimeRange>, StoreError> {
        let err = |e| self.sqlite(e);
        let mut statement = self
            .connection
            .prepare("SELECT start_ns, duration_ns FROM windows ORDER BY id")
            .map_err(err)?;
        let rows = statement
            .query_map([], |row| Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?)))
            .map_err(err)?;
        let mut ranges = Vec::new();
        for row in rows {
            let (start, duration) = row.map_err(err)?;
            ranges.push(TimeRange {
                from: from_unix_ns(start),
                to: from_unix_ns(start.saturating_add(duration.max(1))),
            });
        }
        Ok(ranges)
    }
}

/// Rebuilds profile parts from rows, each row read once per query.
pub(super) struct Reader<'a> {
    connection: &'a Connection,
    path: &'a Path,
    /// Shared by every sample of the series: encoders and sinks group samples by the `Arc`.
    series: HashMap<i64, Option<Arc<Labels>>>,
    strings: HashMap<i64, String>,
    functions: HashMap<i64, (String, String, Option<String>)>,
    /// Database mapping id -> index in the profile's mappings.
    mappings: HashMap<i64, usize>,
    /// Database location id -> index in the profile's locations.
    locations: HashMap<i64, usize>,
    shape: Shape,
}

/// A `locations` row: mapping, address, kind (or `kernel` flag), lines, columns.
type LocationRow = (i64, i64, i64, Vec<u8>, Vec<u8>);

/// What a store's locations table holds, by the schema that made it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Shape {
    /// Frame kinds (schema 5), or a `kernel` flag.
    pub frame_kinds: bool,
    /// The lines' columns (schema 6).
    pub line_columns: bool,
}

impl<'a> Reader<'a> {
    pub(super) fn new(connection: &'a Connection, path: &'a Path, shape: Shape) -> Self {
        Reader {
            connection,
            path,
            series: HashMap::new(),
            strings: HashMap::new(),
            functions: HashMap::new(),
            mappings: HashMap::new(),
            locations: HashMap::new(),
            shape,
        }
    }

    fn sqlite(&self, source: rusqlite::Error) -> StoreError {
        StoreError::Sqlite {
            path: self.path.to_owned(),
            source,
        }
    }

    fn damaged(&self, reason: String) -> StoreError {
        StoreError::Damaged {
            path: self.path.to_owned(),
            reason,
        }
    }

    pub(super) fn series(&mut self, id: i64) -> Result<Option<Arc<Labels>>, StoreError> {
        if let Some(labels) = self.series.get(&id) {
            return Ok(labels.clone());
        }
        let text: Option<String> = self
            .connection
            .prepare_cached("SELECT labels FROM series WHERE id = ?1")
            .and_then(|mut s| s.query_row([id], |row| row.get(0)).optional())
            .map_err(|e| self.sqlite(e))?;
        let text = text.ok_or_else(|| self.damaged(format!("series {id} is missing")))?;
        let labels = parse_labels(&text).map(Arc::new);
        self.series.insert(id, labels.clone());
        Ok(labels)
    }

    fn string(&mut self, id: i64) -> Result<String, StoreError> {
        if let Some(s) = self.strings.get(&id) {
            return Ok(s.clone());
        }
        let value: Option<String> = self
            .connection
            .prepare_cached("SELECT value FROM strings WHERE id = ?1")
            .and_then(|mut s| s.query_row([id], |row| row.get(0)).optional())
            .map_err(|e| self.sqlite(e))?;
        let value = value.ok_or_else(|| self.damaged(format!("string {id} is missing")))?;
        self.strings.insert(id, value.clone());
        Ok(value)
    }

    fn optional_string(&mut self, id: i64) -> Result<Option<String>, StoreError> {
        if id == 0 {
            return Ok(None);
        }
        self.string(id).map(Some)
    }

    pub(super) fn function(
        &mut self,
        id: i64,
    ) -> Result<(String, String, Option<String>), StoreError> {
        if let Some(f) = self.functions.get(&id) {
            return Ok(f.clone());
        }
        let row: Option<(i64, i64, i64)> = self
            .connection
            .prepare_cached("SELECT name, system_name, file FROM functions WHERE id = ?1")
            .and_then(|mut s| {
                s.query_row([id], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
                    .optional()
            })
            .map_err(|e| self.sqlite(e))?;
        let (name, system_name, file) =
            row.ok_or_else(|| self.damaged(format!("function {id} is missing")))?;
        let function = (
            self.string(name)?,
            self.string(system_name)?,
            self.optional_string(file)?,
        );
        self.functions.insert(id, function.clone());
        Ok(function)
    }

    fn mapping(&mut self, id: i64, profile: &mut Profile) -> Result<Option<usize>, StoreError> {
        if id == 0 {
            return Ok(None);
        }
        if let Some(&index) = self.mappings.get(&id) {
            return Ok(Some(index));
        }
        type Row = (i64, i64, i64, i64, i64, i64);
        let row: Option<Row> = self
            .connection
            .prepare_cached(
                "SELECT start, limit_, file_offset, path, build_id, flags FROM mappings WHERE id = ?1",
            )
            .and_then(|mut s| {
                s.query_row([id], |row| Row::try_from(row))
                .optional()
            })
            .map_err(|e| self.sqlite(e))?;
        let (start, limit, file_offset, path, build_id, flags) =
            row.ok_or_else(|| self.damaged(format!("mapping {id} is missing")))?;
        let mapping = Mapping {
            start: start as u64,
            limit: limit as u64,
            file_offset: file_offset as u64,
            path: self.string(path)?,
            build_id: self.optional_string(build_id)?,
            has_functions: flags & 1 != 0,
            has_filenames: flags & 2 != 0,
            has_line_numbers: flags & 4 != 0,
            has_inline_frames: flags & 8 != 0,
        };
        profile.mappings.push(mapping);
        let index = profile.mappings.len() - 1;
        self.mappings.insert(id, index);
        Ok(Some(index))
    }

    fn location(&mut self, id: i64, profile: &mut Profile) -> Result<usize, StoreError> {
        if let Some(&index) = self.locations.get(&id) {
            return Ok(index);
        }
        // Before schema 5 the column was the `kernel` flag, whose 0 and 1 are the codes of
        // native and kernel frames.
        let sql = match (self.shape.frame_kinds, self.shape.line_columns) {
            (true, true) => {
                "SELECT mapping, address, kind, lines, columns FROM locations WHERE id = ?1"
            }
            (true, false) => {
                "SELECT mapping, address, kind, lines, x'' FROM locations WHERE id = ?1"
            }
            (false, _) => {
                "SELECT mapping, address, kernel, lines, x'' FROM locations WHERE id = ?1"
            }
        };
        let row: Option<LocationRow> = self
            .connection
            .prepare_cached(sql)
            .and_then(|mut s| {
                s.query_row([id], |row| LocationRow::try_from(row))
                    .optional()
            })
            .map_err(|e| self.sqlite(e))?;
        let (mapping, address, kind, blob, column_blob) =
            row.ok_or_else(|| self.damaged(format!("location {id} is missing")))?;
        let numbers =
            varints(&blob).ok_or_else(|| self.damaged(format!("location {id}: bad lines")))?;
        let columns = varints(&column_blob)
            .filter(|c| c.is_empty() || c.len() == numbers.len() / 2)
            .ok_or_else(|| self.damaged(format!("location {id}: bad columns")))?;
        let mut lines = Vec::with_capacity(numbers.len() / 2);
        for (i, pair) in numbers.chunks_exact(2).enumerate() {
            let (function, system_name, file) = self.function(pair[0] as i64)?;
            lines.push(Line {
                function,
                system_name,
                file,
                line: pair[1] as u32,
                column: columns.get(i).map_or(0, |&c| c as u32),
            });
        }
        let mapping = self.mapping(mapping, profile)?;
        let kind = FrameKind::from_code(kind);
        let kernel = kind.is_kernel();
        // Stores written before kernel frames became offsets from `_text` hold absolute kernel
        // addresses. They leave without them (the names stay), so no old window reveals the
        // kernel's randomised base either.
        let address = match address as u64 {
            absolute if kernel && absolute >= KERNEL_HALF => 0,
            address => address,
        };
        let mut location = Location {
            mapping,
            address,
            lines,
            kind,
        };
        if !self.shape.frame_kinds {
            location.kind = super::schema::legacy_kind(&location);
        }
        profile.locations.push(location);
        let index = profile.locations.len() - 1;
        self.locations.insert(id, index);
        Ok(index)
    }

    pub(super) fn stack(
        &mut self,
        id: i64,
        profile: &mut Profile,
    ) -> Result<Vec<usize>, StoreError> {
        let blob: Option<Vec<u8>> = self
            .connection
            .prepare_cached("SELECT locations FROM stacks WHERE id = ?1")
            .and_then(|mut s| s.query_row([id], |row| row.get(0)).optional())
            .map_err(|e| self.sqlite(e))?;
        let blob = blob.ok_or_else(|| self.damaged(format!("stack {id} is missing")))?;
        let ids = varints(&blob).ok_or_else(|| self.damaged(format!("stack {id}: bad list")))?;
        ids.into_iter()
            .map(|location| self.location(location as i64, profile))
            .collect()
    }
}

/// A sample of the series with `labels`.
/// Bounds on one query's work.
#[derive(Debug, Clone, Copy)]
pub struct QueryLimits {
    /// Distinct (series, stack) pairs merged, at most: what the merge holds in memory.
    pub max_stacks: usize,
    /// When to give up.
    pub deadline: Option<(Instant, Duration)>,
}

impl QueryLimits {
    /// No bound: the command line's own queries.
    pub const NONE: QueryLimits = QueryLimits {
        max_stacks: usize::MAX,
        deadline: None,
    };

    /// At most `max_stacks` pairs, and `timeout` from now.
    pub fn new(max_stacks: usize, timeout: Duration) -> QueryLimits {
        QueryLimits {
            max_stacks,
            deadline: Some((Instant::now() + timeout, timeout)),
        }
    }

    pub(super) fn check_stacks(&self, stacks: usize) -> Result<(), StoreError> {
        if stacks > self.max_stacks {
            return Err(StoreError::TooLarge {
                limit: self.max_stacks,
            });
        }
        Ok(())
    }

    pub(super) fn check_time(&self) -> Result<(), StoreError> {
        match self.deadline {
            Some((at, timeout)) if Instant::now() > at => Err(StoreError::TimedOut {
                seconds: timeout.as_secs(),
            }),
            _ => Ok(()),
        }
    }
}

pub(super) fn sample_of(labels: &Arc<Labels>, locations: Vec<usize>, value: i64) -> Sample {
    Sample {
        pid: labels.get("pid").and_then(|p| p.parse().ok()).unwrap_or(0),
        comm: labels.get("comm").cloned().unwrap_or_default(),
        labels: labels.clone(),
        locations,
        count: value.max(0) as u64,
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;
    use crate::profile::sample_profile;
    use crate::store::{
        fixtures::{everything, named, window_at},
        Retention,
    };

    /// An off-CPU window of the same time as `window_at(seconds)`: nanoseconds, period 1.
    fn off_cpu_window_at(seconds: u64) -> Profile {
        let mut window = window_at(seconds);
        window.sample_type = SampleType::OffCpu {
            mean_ns: 10_000_000,
            min_ns: 1_000,
        };
        window.period_ns = 1;
        for sample in &mut window.samples {
            sample.count *= 7_000_000;
        }
        window
    }

    #[test]
    fn cpu_and_off_cpu_windows_are_kept_apart() {
        let dir = tempfile::tempdir().unwrap();
        let now = crate::store::fixtures::now_secs();
        let mut store = Store::open(dir.path(), Retention::default()).unwrap();
        let (cpu, off_cpu) = (window_at(now - 20), off_cpu_window_at(now - 20));
        store.write_window(&cpu).unwrap();
        store.write_window(&off_cpu).unwrap();
        let read = Store::open_read_only(dir.path()).unwrap();
        let all = |_: &Labels| true;
        let got_cpu = read.query(everything(), &all).unwrap();
        assert_eq!(got_cpu.sample_type, SampleType::Cpu);
        assert_eq!(got_cpu.period_ns, cpu.period_ns);
        assert_eq!(named(&got_cpu), named(&cpu));
        let got_off = read
            .query_within(everything(), SampleKind::OffCpu, &all, QueryLimits::NONE)
            .unwrap();
        assert_eq!(got_off.sample_type, off_cpu.sample_type);
        assert_eq!(got_off.period_ns, 1);
        assert_eq!(named(&got_off), named(&off_cpu));
        // Each window read back for the sinks says its own type.
        let windows = read
            .windows_after(crate::store::WindowId::NONE, 10)
            .unwrap();
        let types: Vec<SampleType> = windows
            .iter()
            .map(|(id, _)| read.window_profile(*id).unwrap().unwrap().sample_type)
            .collect();
        assert_eq!(types, [SampleType::Cpu, off_cpu.sample_type]);
        assert_eq!(
            read.series(everything(), SampleKind::OffCpu).unwrap().len(),
            1
        );
    }

    /// A store of schema 3 (windows without a kind): read as it is, every window CPU, and
    /// upgraded by the next writable open, losing nothing.
    #[test]
    fn schema_3_stores_are_read_and_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let now = crate::store::fixtures::now_secs();
        let all = |_: &Labels| true;
        let expected = {
            let mut store = Store::open(dir.path(), Retention::default()).unwrap();
            store.write_window(&window_at(now - 30)).unwrap();
            store.write_window(&window_at(now - 20)).unwrap();
            store.query(everything(), &all).unwrap()
        };
        let path = dir.path().join(crate::store::DATABASE_FILE);
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch(
                "ALTER TABLE windows DROP COLUMN kind;
                 ALTER TABLE windows DROP COLUMN off_cpu_mean_ns;
                 ALTER TABLE windows DROP COLUMN off_cpu_min_ns;
                 PRAGMA user_version = 3; PRAGMA wal_checkpoint(TRUNCATE);",
            )
            .unwrap();
        let old = Store::open_read_only(dir.path()).unwrap();
        assert!(!old.kinds);
        assert_eq!(old.query(everything(), &all).unwrap(), expected);
        let off = old
            .query_within(everything(), SampleKind::OffCpu, &all, QueryLimits::NONE)
            .unwrap();
        assert!(off.samples.is_empty());
        let first = old.windows_after(crate::store::WindowId::NONE, 1).unwrap()[0].0;
        assert_eq!(
            old.window_profile(first).unwrap().unwrap().sample_type,
            SampleType::Cpu
        );
        drop(old);
        let mut store = Store::open(dir.path(), Retention::default()).unwrap();
        assert_eq!(store.verify().unwrap(), 2);
        assert_eq!(store.query(everything(), &all).unwrap(), expected);
        store.write_window(&off_cpu_window_at(now - 10)).unwrap();
        drop(store);
        let read = Store::open_read_only(dir.path()).unwrap();
        assert!(read.kinds);
        assert_eq!(read.query(everything(), &all).unwrap(), expected);
        let off = read
            .query_within(everything(), SampleKind::OffCpu, &all, QueryLimits::NONE)
            .unwrap();
        assert_eq!(named(&off), named(&off_cpu_window_at(now - 10)));
    }

    #[test]
    fn old_absolute_kernel_addresses_are_not_served() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path(), Retention::default()).unwrap();
        let mut window = window_at(crate::store::fixtures::now_secs() - 10);
        let kernel = window
            .locations
            .iter()
            .position(|l| l.kind.is_kernel())
            .expect("the sample profile has a kernel frame");
        // As a scorch before offsets from `_text` stored it.
        window.locations[kernel].address = 0xffff_ffff_8123_4567;
        store.write_window(&window).unwrap();
        let profile = store.query(everything(), &|_| true).unwrap();
        let kernel: Vec<_> = profile
            .locations
            .iter()
            .filter(|l| l.kind.is_kernel())
            .collect();
        assert!(!kernel.is_empty());
        assert!(kernel.iter().all(|l| l.address < KERNEL_HALF), "{kernel:?}");
        assert!(kernel.iter().all(|l| !l.lines.is_empty()), "names kept");
        // Offsets pass unchanged.
        assert_eq!(named(&profile), named(&window));
    }

    #[test]
    fn network_queries_stop_at_their_limits() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path(), Retention::default()).unwrap();
        let now = crate::store::fixtures::now_secs();
        for i in 0..3 {
            store.write_window(&window_at(now - 100 + i * 10)).unwrap();
        }
        let all = |_: &Labels| true;
        let too_many = store
            .query_within(
                everything(),
                SampleKind::Cpu,
                &all,
                QueryLimits::new(0, Duration::from_secs(60)),
            )
            .unwrap_err();
        assert!(
            matches!(too_many, StoreError::TooLarge { limit: 0 }),
            "{too_many}"
        );
        let late = store
            .query_within(
                everything(),
                SampleKind::Cpu,
                &all,
                QueryLimits::new(usize::MAX, Duration::ZERO),
            )
            .unwrap_err();
        assert!(matches!(late, StoreError::TimedOut { .. }), "{late}");
        // Within limits, the same answer as without.
        let bounded = store
            .query_within(
                everything(),
                SampleKind::Cpu,
                &all,
                QueryLimits::new(1000, Duration::from_secs(60)),
            )
            .unwrap();
        assert_eq!(bounded, store.query(everything(), &all).unwrap());
    }

    #[test]
    fn round_trip_merges_windows() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path(), Retention::default()).unwrap();
        let now = crate::store::fixtures::now_secs();
        for i in 0..3 {
            store.write_window(&window_at(now - 100 + i * 10)).unwrap();
        }
        let read = Store::open_read_only(dir.path()).unwrap();
        let merged = read.query(everything(), &|_| true).unwrap();
        let one = named(&sample_profile());
        let expected: Vec<_> = one
            .into_iter()
            .map(|(p, c, f, n)| (p, c, f, n * 3))
            .collect();
        assert_eq!(named(&merged), expected);
        assert_eq!(merged.mappings.len(), sample_profile().mappings.len());
        // A range holding only the second window, and a selector.
        let second = TimeRange {
            from: UNIX_EPOCH + Duration::from_secs(now - 90),
            to: UNIX_EPOCH + Duration::from_secs(now - 85),
        };
        let single = read.query(second, &|_| true).unwrap();
        assert_eq!(single.total_samples(), sample_profile().total_samples());
        let comm = &sample_profile().samples[0].comm;
        let filtered = read
            .query(everything(), &|l| l.get("comm") != Some(comm))
            .unwrap();
        assert!(filtered.samples.iter().all(|s| &s.comm != comm));
        let series = read.series(everything(), SampleKind::Cpu).unwrap();
        assert!(series.iter().any(|l| l.get("comm") == Some(comm)));
        assert_eq!(read.verify().unwrap(), 3);
    }
}
