//! Writing a window: one transaction that adds the window, finds or inserts the deduplicated
//! rows its content needs, and stores its encoded sample rows. The id caches keep a window
//! in the steady state down to the rows that are new or whose `last_window` is due a refresh.

use std::{collections::HashMap, sync::Arc, time::SystemTime};

use rusqlite::{params, Connection};

use super::codec::{
    content_hash, encode_rows, encode_totals, labels_json, location_hash, put_varint,
    totals_of_rows,
};
use super::{Store, StoreError, TOUCH_EVERY};
use crate::profile::{Labels, Line, Location, Mapping, Profile, SampleType};
use crate::sys::time::unix_ns;

/// Rows kept in the writer's id caches before they are dropped and refilled from the database.
const MAX_CACHED_ROWS: usize = 1 << 20;

/// What one window's write did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteStats {
    /// `(series, stack, value)` rows written.
    pub rows: usize,
    /// Windows deleted by retention afterwards.
    pub windows_expired: usize,
}

/// Row ids by content, with the `last_window` each row has in the database.
#[derive(Default)]
pub(super) struct IdCache {
    strings: HashMap<String, (i64, i64)>,
    mappings: HashMap<MappingKey, (i64, i64)>,
    functions: HashMap<(i64, i64, i64), (i64, i64)>,
    locations: HashMap<LocationKey, (i64, i64)>,
    stacks: HashMap<Vec<u8>, (i64, i64)>,
    series: HashMap<String, (i64, i64)>,
}

impl IdCache {
    fn rows(&self) -> usize {
        self.strings.len()
            + self.mappings.len()
            + self.functions.len()
            + self.locations.len()
            + self.stacks.len()
            + self.series.len()
    }

    /// Forgets rows the database no longer has (their `last_window` is below `threshold`).
    pub(super) fn retain_from(&mut self, threshold: i64) {
        let keep = |(_, last): &(i64, i64)| *last >= threshold;
        self.strings.retain(|_, v| keep(v));
        self.mappings.retain(|_, v| keep(v));
        self.functions.retain(|_, v| keep(v));
        self.locations.retain(|_, v| keep(v));
        self.stacks.retain(|_, v| keep(v));
        self.series.retain(|_, v| keep(v));
    }
}

type MappingKey = (i64, i64, i64, i64, i64, i64);
/// (mapping id, address, frame kind's code, encoded lines, encoded columns).
type LocationKey = (i64, i64, u8, Vec<u8>, Vec<u8>);

impl Store {
    /// Writes one window's profile: one series per label set its samples carry. Then applies
    /// retention. On error nothing of the window is kept and the store is as it was.
    pub fn write_window(&mut self, profile: &Profile) -> Result<WriteStats, StoreError> {
        let result = self.write_window_transaction(profile);
        if result.is_err() {
            // Ids handed out inside the rolled-back transaction no longer exist.
            self.cache = IdCache::default();
            let _ = self.connection.execute_batch("ROLLBACK");
            return result;
        }
        if self.cache.rows() > MAX_CACHED_ROWS {
            self.cache = IdCache::default();
        }
        let mut stats = result?;
        stats.windows_expired = self.enforce_retention(SystemTime::now())?;
        Ok(stats)
    }

    fn write_window_transaction(&mut self, profile: &Profile) -> Result<WriteStats, StoreError> {
        let connection = &self.connection;
        let path = &self.path;
        let err = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        connection.execute_batch("BEGIN IMMEDIATE").map_err(err)?;
        let (kind, mean_ns, min_ns) = match profile.sample_type {
            SampleType::Cpu => (0, 0, 0),
            SampleType::OffCpu { mean_ns, min_ns } => (1, mean_ns as i64, min_ns as i64),
        };
        connection
            .execute(
                "INSERT INTO windows (start_ns, duration_ns, period_ns, kind, off_cpu_mean_ns,
                     off_cpu_min_ns) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    unix_ns(profile.start),
                    profile.duration.as_nanos() as i64,
                    profile.period_ns as i64,
                    kind,
                    mean_ns,
                    min_ns
                ],
            )
            .map_err(err)?;
        let window = connection.last_insert_rowid();
        let mut writer = Writer {
            connection,
            cache: &mut self.cache,
            window,
        };
        let mapping_ids = profile
            .mappings
            .iter()
            .map(|m| writer.mapping(m))
            .collect::<rusqlite::Result<Vec<i64>>>()
            .map_err(err)?;
        let mut location_ids = Vec::with_capacity(profile.locations.len());
        for location in &profile.locations {
            location_ids.push(writer.location(location, &mapping_ids).map_err(err)?);
        }
        let mut rows: HashMap<(i64, i64), u64> = HashMap::new();
        // The daemon gives all samples of a process one shared label set: look its series up
        // once, not once per sample.
        let mut series_of: HashMap<*const Labels, i64> = HashMap::new();
        for sample in &profile.samples {
            let shared = Arc::as_ptr(&sample.labels);
            let series = match series_of.get(&shared) {
                Some(&series) if !sample.labels.is_empty() => series,
                _ => {
                    let series = writer.series(&sample.series_labels()).map_err(err)?;
                    series_of.insert(shared, series);
                    series
                }
            };
            let ids: Vec<i64> = sample.locations.iter().map(|&l| location_ids[l]).collect();
            let stack = writer.stack(&ids).map_err(err)?;
            *rows.entry((series, stack)).or_insert(0) += sample.count;
        }
        let mut sorted: Vec<(i64, i64, u64)> = rows.iter().map(|(&(a, b), &v)| (a, b, v)).collect();
        sorted.sort_unstable();
        connection
            .prepare_cached("INSERT INTO window_samples (window, rows) VALUES (?1, ?2)")
            .and_then(|mut insert| insert.execute(params![window, encode_rows(&sorted)]))
            .map_err(err)?;
        // The timeline's per-series totals, in the same transaction: a window has both or
        // neither.
        connection
            .prepare_cached("INSERT INTO window_totals (window, totals) VALUES (?1, ?2)")
            .and_then(|mut insert| {
                insert.execute(params![window, encode_totals(&totals_of_rows(&sorted))])
            })
            .map_err(err)?;
        connection.execute_batch("COMMIT").map_err(err)?;
        Ok(WriteStats {
            rows: rows.len(),
            windows_expired: 0,
        })
    }
}

/// Hands out row ids for a window's content, inserting what the store lacks.
struct Writer<'a> {
    connection: &'a Connection,
    cache: &'a mut IdCache,
    window: i64,
}

impl Writer<'_> {
    /// The id for a row: from the cache (refreshing its `last_window` when stale), else by an
    /// upsert that returns the existing or new id.
    fn id<K: std::hash::Hash + Eq>(
        connection: &Connection,
        window: i64,
        cache: &mut HashMap<K, (i64, i64)>,
        key: K,
        table: &str,
        upsert: impl FnOnce() -> rusqlite::Result<i64>,
    ) -> rusqlite::Result<i64> {
        if let Some((id, last)) = cache.get_mut(&key) {
            if *last + TOUCH_EVERY <= window {
                connection
                    .prepare_cached(&format!(
                        "UPDATE {table} SET last_window = ?1 WHERE id = ?2"
                    ))?
                    .execute([window, *id])?;
                *last = window;
            }
            return Ok(*id);
        }
        let id = upsert()?;
        cache.insert(key, (id, window));
        Ok(id)
    }

    fn string(&mut self, value: &str) -> rusqlite::Result<i64> {
        // The common case, a fresh cache hit, answered by `&str` before `Self::id` needs an
        // owned key: strings are looked up several times per location per window.
        if let Some(&(id, last)) = self.cache.strings.get(value) {
            if last + TOUCH_EVERY > self.window {
                return Ok(id);
            }
        }
        let (connection, window) = (self.connection, self.window);
        Self::id(
            connection,
            window,
            &mut self.cache.strings,
            value.to_owned(),
            "strings",
            || {
                let hash = content_hash(value.as_bytes());
                find_or_insert(
                    connection,
                    "strings",
                    "value",
                    hash,
                    window,
                    |candidate| candidate.as_str() == Ok(value),
                    "INSERT INTO strings (hash, value, last_window) VALUES (?1, ?2, ?3)",
                    params![hash, value, window],
                )
            },
        )
    }

    fn optional_string(&mut self, value: Option<&str>) -> rusqlite::Result<i64> {
        value.map_or(Ok(0), |v| self.string(v))
    }

    fn mapping(&mut self, mapping: &Mapping) -> rusqlite::Result<i64> {
        let path = self.string(&mapping.path)?;
        let build_id = self.optional_string(mapping.build_id.as_deref())?;
        let flags = i64::from(mapping.has_functions)
            | i64::from(mapping.has_filenames) << 1
            | i64::from(mapping.has_line_numbers) << 2
            | i64::from(mapping.has_inline_frames) << 3;
        let key = (
            mapping.start as i64,
            mapping.limit as i64,
            mapping.file_offset as i64,
            path,
            build_id,
            flags,
        );
        let (connection, window) = (self.connection, self.window);
        Self::id(
            connection,
            window,
            &mut self.cache.mappings,
            key,
            "mappings",
            || {
                connection
                .prepare_cached(
                    "INSERT INTO mappings (start, limit_, file_offset, path, build_id, flags, last_window)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                     ON CONFLICT (start, limit_, file_offset, path, build_id, flags)
                     DO UPDATE SET last_window = excluded.last_window
                     RETURNING id",
                )?
                .query_row(
                    params![key.0, key.1, key.2, key.3, key.4, key.5, window],
                    |row| row.get(0),
                )
            },
        )
    }

    fn function(&mut self, line: &Line) -> rusqlite::Result<i64> {
        let key = (
            self.string(&line.function)?,
            self.string(&line.system_name)?,
            self.optional_string(line.file.as_deref())?,
        );
        let (connection, window) = (self.connection, self.window);
        Self::id(
            connection,
            window,
            &mut self.cache.functions,
            key,
            "functions",
            || {
                connection
                    .prepare_cached(
                        "INSERT INTO functions (name, system_name, file, last_window)
                     VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (name, system_name, file)
                     DO UPDATE SET last_window = excluded.last_window
                     RETURNING id",
                    )?
                    .query_row(params![key.0, key.1, key.2, window], |row| row.get(0))
            },
        )
    }

    fn location(&mut self, location: &Location, mapping_ids: &[i64]) -> rusqlite::Result<i64> {
        let mut lines = Vec::new();
        for line in &location.lines {
            put_varint(&mut lines, self.function(line)? as u64);
            put_varint(&mut lines, u64::from(line.line));
        }
        let mut columns = Vec::new();
        if location.lines.iter().any(|line| line.column != 0) {
            for line in &location.lines {
                put_varint(&mut columns, u64::from(line.column));
            }
        }
        let mapping = location.mapping.map_or(0, |m| mapping_ids[m]);
        let key = (
            mapping,
            location.address as i64,
            location.kind.code(),
            lines,
            columns,
        );
        let (connection, window) = (self.connection, self.window);
        let k = key.clone();
        Self::id(
            connection,
            window,
            &mut self.cache.locations,
            key,
            "locations",
            || {
                let hash = location_hash(k.0, k.1, k.2, &k.3, &k.4);
                let mut select = connection.prepare_cached(
                    "SELECT id, mapping, address, kind, lines, columns FROM locations
                     WHERE hash = ?1",
                )?;
                let mut rows = select.query([hash])?;
                while let Some(row) = rows.next()? {
                    let same = row.get::<_, i64>(1)? == k.0
                        && row.get::<_, i64>(2)? == k.1
                        && row.get::<_, i64>(3)? == i64::from(k.2)
                        && row.get_ref(4)?.as_blob()? == k.3.as_slice()
                        && row.get_ref(5)?.as_blob()? == k.4.as_slice();
                    if same {
                        let id: i64 = row.get(0)?;
                        touch(connection, "locations", id, window)?;
                        return Ok(id);
                    }
                }
                connection
                    .prepare_cached(
                        "INSERT INTO locations
                         (hash, mapping, address, kind, lines, columns, last_window)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    )?
                    .execute(params![hash, k.0, k.1, k.2, k.3, k.4, window])?;
                Ok(connection.last_insert_rowid())
            },
        )
    }

    fn stack(&mut self, location_ids: &[i64]) -> rusqlite::Result<i64> {
        let mut blob = Vec::with_capacity(location_ids.len() * 3);
        for &id in location_ids {
            put_varint(&mut blob, id as u64);
        }
        let (connection, window) = (self.connection, self.window);
        let insert_blob = blob.clone();
        Self::id(
            connection,
            window,
            &mut self.cache.stacks,
            blob,
            "stacks",
            || {
                let hash = content_hash(&insert_blob);
                find_or_insert(
                    connection,
                    "stacks",
                    "locations",
                    hash,
                    window,
                    |candidate| candidate.as_blob() == Ok(insert_blob.as_slice()),
                    "INSERT INTO stacks (hash, locations, last_window) VALUES (?1, ?2, ?3)",
                    params![hash, insert_blob, window],
                )
            },
        )
    }

    fn series(&mut self, labels: &Labels) -> rusqlite::Result<i64> {
        let text = labels_json(labels);
        let (connection, window) = (self.connection, self.window);
        let insert_text = text.clone();
        Self::id(
            connection,
            window,
            &mut self.cache.series,
            text,
            "series",
            || {
                connection
                    .prepare_cached(
                        "INSERT INTO series (labels, last_window) VALUES (?1, ?2)
                     ON CONFLICT (labels) DO UPDATE SET last_window = excluded.last_window
                     RETURNING id",
                    )?
                    .query_row(params![insert_text, window], |row| row.get(0))
            },
        )
    }
}

/// The id of the row of `table` whose `column` `same` accepts among those with `hash`
/// (refreshing its `last_window`), or of the row `insert` adds.
#[allow(clippy::too_many_arguments)]
fn find_or_insert(
    connection: &Connection,
    table: &str,
    column: &str,
    hash: i64,
    window: i64,
    same: impl Fn(rusqlite::types::ValueRef<'_>) -> bool,
    insert: &str,
    insert_params: &[&dyn rusqlite::ToSql],
) -> rusqlite::Result<i64> {
    let mut select =
        connection.prepare_cached(&format!("SELECT id, {column} FROM {table} WHERE hash = ?1"))?;
    let mut rows = select.query([hash])?;
    while let Some(row) = rows.next()? {
        if same(row.get_ref(1)?) {
            let id: i64 = row.get(0)?;
            touch(connection, table, id, window)?;
            return Ok(id);
        }
    }
    connection.prepare_cached(insert)?.execute(insert_params)?;
    Ok(connection.last_insert_rowid())
}

fn touch(connection: &Connection, table: &str, id: i64, window: i64) -> rusqlite::Result<()> {
    connection
        .prepare_cached(&format!(
            "UPDATE {table} SET last_window = ?1 WHERE id = ?2 AND last_window < ?1"
        ))?
        .execute([window, id])
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::profile::sample_profile;
    use crate::store::{fixtures::window_at, Retention};

    #[test]
    fn reopening_keeps_ids_consistent() {
        let dir = tempfile::tempdir().unwrap();
        let now = crate::store::fixtures::now_secs();
        Store::open(dir.path(), Retention::default())
            .unwrap()
            .write_window(&window_at(now - 20))
            .unwrap();
        // A new writer starts with empty caches and must find the existing rows.
        Store::open(dir.path(), Retention::default())
            .unwrap()
            .write_window(&window_at(now - 10))
            .unwrap();
        let read = Store::open_read_only(dir.path()).unwrap();
        let stacks: i64 = read
            .connection
            .query_row("SELECT COUNT(*) FROM stacks", [], |r| r.get(0))
            .unwrap();
        let distinct_stacks: HashSet<_> = sample_profile()
            .samples
            .iter()
            .map(|s| s.locations.clone())
            .collect();
        assert_eq!(stacks as usize, distinct_stacks.len());
        assert_eq!(read.verify().unwrap(), 2);
    }
}
