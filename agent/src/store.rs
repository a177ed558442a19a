//! The local sink: an embedded profile store that `scorch run` writes one window at a time and
//! `scorch query` and the HTTP API read.
//!
//! One SQLite database (`scorch.db` in the store directory, WAL journal). What repeats from
//! window to window is stored once, the way profile databases deduplicate symbols: strings,
//! functions, mappings, locations, stacks (a location-id list) and series (a label set). A window
//! then costs one `windows` row and one `(window, series, stack, value)` row per distinct stack
//! and series, in a table keyed by window so retention deletes a contiguous range.
//!
//! Durability: each window is one transaction, so a kill -9 loses at most the window being
//! written and the WAL rolls the rest back on the next open. A failed write (a full disk) rolls
//! back and leaves the store as it was; the caller keeps the window and retries.
//!
//! Garbage: every deduplicated row carries the newest window that used it (`last_window`,
//! refreshed at most every [`TOUCH_EVERY`] windows to keep writes small). When retention drops
//! windows, rows whose `last_window` is older than the oldest window left, minus that lag, are
//! unused by any window and are deleted.

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension};

use crate::profile::{Line, Location, Mapping, Profile, Sample};
use crate::sys::time::{from_unix_ns, unix_ns};

pub use crate::profile::Labels;

/// The file name of the database inside the store directory.
pub const DATABASE_FILE: &str = "scorch.db";

/// `PRAGMA application_id` of a scorch store ("SCOR"): how a SQLite file says what it is.
const APPLICATION_ID: i32 = 0x5343_4f52;
/// `PRAGMA user_version`: the schema below.
const SCHEMA_VERSION: i32 = 2;

/// How stale a row's `last_window` may get before a window that uses it refreshes it.
const TOUCH_EVERY: i64 = 32;

/// Rows kept in the writer's id caches before they are dropped and refilled from the database.
const MAX_CACHED_ROWS: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path} is not a scorch store: {reason}; scorch leaves it untouched")]
    Foreign { path: PathBuf, reason: String },
    #[error(
        "{path} was written by a newer scorch (schema {found}, this one reads {SCHEMA_VERSION})"
    )]
    NewerSchema { path: PathBuf, found: i32 },
    #[error(
        "{path} was written by an earlier development build (schema {found}, this one reads \
         {SCHEMA_VERSION}); move it away to start a new store"
    )]
    OlderSchema { path: PathBuf, found: i32 },
    #[error("creating the store directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no store at {path} (scorch run creates it)")]
    Missing { path: PathBuf },
    #[error("store {path}: {source}")]
    Sqlite {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("store {path} is damaged: {reason}")]
    Damaged { path: PathBuf, reason: String },
}

impl StoreError {
    pub fn reason(&self) -> ErrorReason {
        match self {
            StoreError::Sqlite { source, .. } => match source.sqlite_error_code() {
                Some(ErrorCode::DiskFull) => ErrorReason::DiskFull,
                Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => ErrorReason::Busy,
                _ => ErrorReason::Other,
            },
            _ => ErrorReason::Other,
        }
    }
}

/// What a [`StoreError`] comes down to, for metrics: a few fixed values, since each becomes a
/// series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorReason {
    DiskFull,
    /// Another connection held the database past the busy timeout.
    Busy,
    Other,
}

impl ErrorReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorReason::DiskFull => "disk_full",
            ErrorReason::Busy => "busy",
            ErrorReason::Other => "other",
        }
    }
}

/// A window's id in the store. Ids only grow, by one per window written, so a sink's cursor
/// (the last window it delivered) says what is left to send, and a gap says what retention
/// deleted first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WindowId(i64);

impl WindowId {
    /// Before the first window: the cursor of a sink that delivered nothing.
    pub const NONE: WindowId = WindowId(0);

    pub const fn new(id: i64) -> WindowId {
        WindowId(id)
    }

    pub const fn get(self) -> i64 {
        self.0
    }
}

impl std::fmt::Display for WindowId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

pub use crate::parse::timespec::TimeRange;

/// How long and how much the store keeps; whichever limit is reached first applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub max_age: Duration,
    pub max_bytes: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            max_age: Duration::from_secs(7 * 24 * 3600),
            max_bytes: 1 << 30,
        }
    }
}

/// What one window's write did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteStats {
    /// `(series, stack, value)` rows written.
    pub rows: usize,
    /// Windows deleted by retention afterwards.
    pub windows_expired: usize,
}

/// An open store.
pub struct Store {
    connection: Connection,
    /// The database file, for errors.
    path: PathBuf,
    retention: Retention,
    /// Ids of rows written before, so a window only talks to SQLite about what is new.
    cache: IdCache,
}

/// Row ids by content, with the `last_window` each row has in the database.
#[derive(Default)]
struct IdCache {
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
    fn retain_from(&mut self, threshold: i64) {
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
/// (mapping id, address, kernel, encoded lines).
type LocationKey = (i64, i64, bool, Vec<u8>);

const SCHEMA: &str = "
CREATE TABLE strings (
    id INTEGER PRIMARY KEY,
    hash INTEGER NOT NULL, -- content_hash(value): looked up by it, compared on value
    value TEXT NOT NULL,
    last_window INTEGER NOT NULL
);
CREATE INDEX strings_by_hash ON strings (hash);
CREATE TABLE mappings (
    id INTEGER PRIMARY KEY,
    start INTEGER NOT NULL,
    limit_ INTEGER NOT NULL,
    file_offset INTEGER NOT NULL,
    path INTEGER NOT NULL,     -- strings.id
    build_id INTEGER NOT NULL, -- strings.id, 0 for none
    flags INTEGER NOT NULL,    -- has_functions | has_filenames << 1 | has_line_numbers << 2 | has_inline_frames << 3
    last_window INTEGER NOT NULL,
    UNIQUE (start, limit_, file_offset, path, build_id, flags)
);
CREATE TABLE functions (
    id INTEGER PRIMARY KEY,
    name INTEGER NOT NULL,        -- strings.id
    system_name INTEGER NOT NULL, -- strings.id
    file INTEGER NOT NULL,        -- strings.id, 0 for none
    last_window INTEGER NOT NULL,
    UNIQUE (name, system_name, file)
);
CREATE TABLE locations (
    id INTEGER PRIMARY KEY,
    hash INTEGER NOT NULL,    -- content_hash of the other columns
    mapping INTEGER NOT NULL, -- mappings.id, 0 for none
    address INTEGER NOT NULL,
    kernel INTEGER NOT NULL,
    lines BLOB NOT NULL,      -- varint (functions.id, line) pairs, innermost first
    last_window INTEGER NOT NULL
);
CREATE INDEX locations_by_hash ON locations (hash);
CREATE TABLE stacks (
    id INTEGER PRIMARY KEY,
    hash INTEGER NOT NULL,    -- content_hash(locations)
    locations BLOB NOT NULL,  -- varint locations.id list, leaf first
    last_window INTEGER NOT NULL
);
CREATE INDEX stacks_by_hash ON stacks (hash);
CREATE TABLE series (
    id INTEGER PRIMARY KEY,
    labels TEXT NOT NULL UNIQUE, -- JSON object, keys sorted
    last_window INTEGER NOT NULL
);
CREATE TABLE windows (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    start_ns INTEGER NOT NULL,
    duration_ns INTEGER NOT NULL,
    period_ns INTEGER NOT NULL
);
CREATE INDEX windows_by_start ON windows (start_ns);
-- One row per window: its (series, stack, value) rows, sorted and delta-encoded as varints
-- (see encode_rows). A few bytes per row, where a table row would cost ~15.
CREATE TABLE window_samples (
    window INTEGER PRIMARY KEY, -- windows.id
    rows BLOB NOT NULL
);
";

impl Store {
    /// Opens the store in `dir` for writing, creating it (and the directory) when absent.
    /// A file in the way that is not a scorch store is an error and is left untouched.
    pub fn open(dir: &Path, retention: Retention) -> Result<Store, StoreError> {
        let path = dir.join(DATABASE_FILE);
        if dir.exists() && !dir.is_dir() {
            return Err(StoreError::Foreign {
                path: dir.to_owned(),
                reason: "it is a file, and the store is a directory".into(),
            });
        }
        std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
            path: dir.to_owned(),
            source,
        })?;
        let sqlite = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        // Check what is there before anything could write to it.
        let fresh = match std::fs::metadata(&path) {
            Ok(meta) => meta.len() == 0,
            Err(_) => true,
        };
        if !fresh {
            identify(&path)?;
        }
        let connection = Connection::open(&path).map_err(sqlite)?;
        connection
            .busy_timeout(Duration::from_secs(5))
            .map_err(sqlite)?;
        if fresh {
            // auto_vacuum must be chosen before the first table exists. The schema and the
            // header fields that identify the file are committed before the switch to WAL, so
            // they are in the main file (where `identify` reads them), not only in the WAL.
            connection
                .execute_batch(&format!(
                    "PRAGMA auto_vacuum = INCREMENTAL;
                     BEGIN;
                     {SCHEMA}
                     PRAGMA application_id = {APPLICATION_ID};
                     PRAGMA user_version = {SCHEMA_VERSION};
                     COMMIT;"
                ))
                .map_err(sqlite)?;
        }
        connection
            .execute_batch(
                // NORMAL in WAL mode: a committed window survives a crash of this process; only
                // a power loss can take the newest transactions back.
                "PRAGMA journal_mode = WAL;
                 PRAGMA synchronous = NORMAL;
                 PRAGMA journal_size_limit = 8388608;
                 PRAGMA foreign_keys = OFF;
                 CREATE TABLE IF NOT EXISTS cursors (
                     name TEXT PRIMARY KEY,    -- a remote sink
                     window INTEGER NOT NULL   -- the newest window it has delivered
                 );",
            )
            .map_err(sqlite)?;
        Ok(Store {
            connection,
            path,
            retention,
            cache: IdCache::default(),
        })
    }

    /// Opens the store in `dir` read-only, for queries. Works while a daemon writes to it.
    pub fn open_read_only(dir: &Path) -> Result<Store, StoreError> {
        let path = dir.join(DATABASE_FILE);
        if !path.exists() {
            if dir.exists() && !dir.is_dir() {
                return Err(StoreError::Foreign {
                    path: dir.to_owned(),
                    reason: "it is a file, and the store is a directory".into(),
                });
            }
            return Err(StoreError::Missing { path });
        }
        identify(&path)?;
        let connection = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|source| StoreError::Sqlite {
            path: path.clone(),
            source,
        })?;
        connection
            .busy_timeout(Duration::from_secs(5))
            .map_err(|source| StoreError::Sqlite {
                path: path.clone(),
                source,
            })?;
        Ok(Store {
            connection,
            path,
            retention: Retention::default(),
            cache: IdCache::default(),
        })
    }

    fn sqlite(&self, source: rusqlite::Error) -> StoreError {
        StoreError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    /// Bytes of the database's pages in use: what retention bounds. The WAL comes on top; it
    /// is checkpointed every 1000 pages and truncated to 8 MiB.
    pub fn size_bytes(&self) -> Result<u64, StoreError> {
        let pragma = |name: &str| -> Result<i64, StoreError> {
            self.connection
                .query_row(&format!("PRAGMA {name}"), [], |row| row.get(0))
                .map_err(|e| self.sqlite(e))
        };
        let used = (pragma("page_count")? - pragma("freelist_count")?).max(0) as u64;
        Ok(used * pragma("page_size")? as u64)
    }

    /// Bytes the store takes on disk: the database file and its WAL.
    pub fn disk_bytes(&self) -> u64 {
        let size = |path: &Path| std::fs::metadata(path).map_or(0, |m| m.len());
        size(&self.path) + size(&self.path.with_extension("db-wal"))
    }

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
        connection
            .execute(
                "INSERT INTO windows (start_ns, duration_ns, period_ns) VALUES (?1, ?2, ?3)",
                params![
                    unix_ns(profile.start),
                    profile.duration.as_nanos() as i64,
                    profile.period_ns as i64
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
        connection.execute_batch("COMMIT").map_err(err)?;
        Ok(WriteStats {
            rows: rows.len(),
            windows_expired: 0,
        })
    }

    /// Deletes windows older than the age limit, then the oldest ones while the store is over
    /// its size limit, then the rows no window uses any more. Returns the windows deleted.
    pub fn enforce_retention(&mut self, now: SystemTime) -> Result<usize, StoreError> {
        let oldest_kept_ns = unix_ns(
            now.checked_sub(self.retention.max_age)
                .unwrap_or(UNIX_EPOCH),
        );
        let mut expired = self
            .delete_windows("start_ns < ?1", oldest_kept_ns)
            .map_err(|e| self.sqlite(e))?;
        if expired > 0 {
            self.collect_garbage()?;
        }
        if self.size_bytes()? <= self.retention.max_bytes {
            return Ok(expired);
        }
        // Size: drop the oldest tenth of the windows at a time until under the limit.
        while self.size_bytes()? > self.retention.max_bytes {
            let (count, oldest): (i64, Option<i64>) = self
                .connection
                .query_row("SELECT COUNT(*), MIN(id) FROM windows", [], |row| {
                    Ok((row.get(0)?, row.get(1)?))
                })
                .map_err(|e| self.sqlite(e))?;
            let Some(oldest) = oldest.filter(|_| count > 1) else {
                break; // never delete the window just written
            };
            let batch = (count / 10).max(1);
            expired += self
                .delete_windows("id < ?1", oldest + batch)
                .map_err(|e| self.sqlite(e))?;
            self.sweep()?;
        }
        Ok(expired)
    }

    fn delete_windows(&self, condition: &str, value: i64) -> rusqlite::Result<usize> {
        let tx = self.connection.unchecked_transaction()?;
        tx.execute(
            &format!(
                "DELETE FROM window_samples WHERE window IN (SELECT id FROM windows WHERE {condition})"
            ),
            [value],
        )?;
        let deleted = tx.execute(&format!("DELETE FROM windows WHERE {condition}"), [value])?;
        tx.commit()?;
        Ok(deleted)
    }

    /// Deletes deduplicated rows that no remaining window uses, and gives the space back to
    /// the file system.
    fn collect_garbage(&mut self) -> Result<(), StoreError> {
        let oldest: Option<i64> = self
            .connection
            .query_row("SELECT MIN(id) FROM windows", [], |row| row.get(0))
            .map_err(|e| self.sqlite(e))?;
        let oldest = match oldest {
            Some(id) => id,
            // No window left: everything is garbage.
            None => i64::MAX - TOUCH_EVERY,
        };
        let threshold = oldest - TOUCH_EVERY;
        let tx = self
            .connection
            .unchecked_transaction()
            .map_err(|e| self.sqlite(e))?;
        for table in [
            "stacks",
            "series",
            "locations",
            "functions",
            "mappings",
            "strings",
        ] {
            tx.execute(
                &format!("DELETE FROM {table} WHERE last_window < ?1"),
                [threshold],
            )
            .map_err(|e| self.sqlite(e))?;
        }
        tx.commit().map_err(|e| self.sqlite(e))?;
        self.cache.retain_from(threshold);
        self.connection
            .execute_batch("PRAGMA incremental_vacuum; PRAGMA wal_checkpoint(TRUNCATE);")
            .map_err(|e| self.sqlite(e))?;
        Ok(())
    }

    /// Deletes every deduplicated row no remaining window reaches, exactly (not with the
    /// `last_window` lag [`collect_garbage`](Self::collect_garbage) allows): what frees space
    /// when the store is over its size limit. Costs a pass over the stacks and locations.
    fn sweep(&mut self) -> Result<(), StoreError> {
        let result = self.sweep_transaction();
        // Cached ids may name deleted rows now.
        self.cache = IdCache::default();
        result?;
        self.connection
            .execute_batch("PRAGMA incremental_vacuum; PRAGMA wal_checkpoint(TRUNCATE);")
            .map_err(|e| self.sqlite(e))
    }

    fn sweep_transaction(&self) -> Result<(), StoreError> {
        let err = |e| self.sqlite(e);
        let damaged = |what: &str, id: i64| StoreError::Damaged {
            path: self.path.clone(),
            reason: format!("{what} {id} does not decode"),
        };
        let tx = self.connection.unchecked_transaction().map_err(err)?;
        tx.execute_batch(
            "CREATE TEMP TABLE IF NOT EXISTS live (id INTEGER PRIMARY KEY);
             DELETE FROM temp.live;",
        )
        .map_err(err)?;
        let keep_only = |table: &str, live: HashSet<u64>| -> Result<(), StoreError> {
            let mut insert = tx
                .prepare("INSERT INTO temp.live (id) VALUES (?1)")
                .map_err(err)?;
            for id in live {
                insert.execute([id as i64]).map_err(err)?;
            }
            tx.execute_batch(&format!(
                "DELETE FROM {table} WHERE id NOT IN (SELECT id FROM temp.live);
                 DELETE FROM temp.live;"
            ))
            .map_err(err)
        };
        // The series and stacks the remaining windows use.
        let (mut series, mut stacks) = (HashSet::new(), HashSet::new());
        {
            let mut select = tx
                .prepare("SELECT window, rows FROM window_samples")
                .map_err(err)?;
            let mut rows = select.query([]).map_err(err)?;
            while let Some(row) = rows.next().map_err(err)? {
                let (window, blob): (i64, Vec<u8>) =
                    (row.get(0).map_err(err)?, row.get(1).map_err(err)?);
                for (one_series, stack, _) in
                    decode_rows(&blob).ok_or_else(|| damaged("window", window))?
                {
                    series.insert(one_series as u64);
                    stacks.insert(stack as u64);
                }
            }
        }
        keep_only("series", series)?;
        keep_only("stacks", stacks)?;
        let decode = |sql: &str, what: &str, step: usize| -> Result<HashSet<u64>, StoreError> {
            let mut live = HashSet::new();
            let mut select = tx.prepare(sql).map_err(err)?;
            let mut rows = select.query([]).map_err(err)?;
            while let Some(row) = rows.next().map_err(err)? {
                let (id, blob): (i64, Vec<u8>) =
                    (row.get(0).map_err(err)?, row.get(1).map_err(err)?);
                let ids = varints(&blob).ok_or_else(|| damaged(what, id))?;
                live.extend(ids.into_iter().step_by(step));
            }
            Ok(live)
        };
        keep_only(
            "locations",
            decode("SELECT id, locations FROM stacks", "stack", 1)?,
        )?;
        // Lines are (function, line) pairs: every other number is a function id.
        keep_only(
            "functions",
            decode("SELECT id, lines FROM locations", "location", 2)?,
        )?;
        tx.execute_batch(
            "DELETE FROM mappings WHERE id NOT IN (SELECT DISTINCT mapping FROM locations);
             DELETE FROM strings WHERE id NOT IN (
                 SELECT name FROM functions UNION SELECT system_name FROM functions
                 UNION SELECT file FROM functions UNION SELECT path FROM mappings
                 UNION SELECT build_id FROM mappings);",
        )
        .map_err(err)?;
        tx.commit().map_err(err)
    }

    /// Up to `limit` windows after window id `after`, oldest first: `(id, range)`. Window ids
    /// only grow, so a sink that remembers the last id it delivered finds what is left here.
    pub fn windows_after(
        &self,
        after: WindowId,
        limit: usize,
    ) -> Result<Vec<(WindowId, TimeRange)>, StoreError> {
        let err = |e| self.sqlite(e);
        let mut statement = self
            .connection
            .prepare_cached(
                "SELECT id, start_ns, duration_ns FROM windows WHERE id > ?1 ORDER BY id LIMIT ?2",
            )
            .map_err(err)?;
        let rows = statement
            .query_map(params![after.0, limit as i64], |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, i64>(1)?,
                    row.get::<_, i64>(2)?,
                ))
            })
            .map_err(err)?;
        let mut windows = Vec::new();
        for row in rows {
            let (id, start, duration) = row.map_err(err)?;
            windows.push((
                WindowId(id),
                TimeRange {
                    from: from_unix_ns(start),
                    to: from_unix_ns(start.saturating_add(duration.max(1))),
                },
            ));
        }
        Ok(windows)
    }

    /// The profile of one window (all its series; each sample's labels say which), or `None`
    /// when retention has deleted it.
    pub fn window_profile(&self, id: WindowId) -> Result<Option<Profile>, StoreError> {
        let id = id.0;
        let err = |e| self.sqlite(e);
        // One read transaction for the hundreds of row reads below: without it each one takes
        // and releases the database's file locks. Dropping it ends it (nothing was written).
        let _read = self.connection.unchecked_transaction().map_err(err)?;
        let window: Option<(i64, i64, i64)> = self
            .connection
            .query_row(
                "SELECT start_ns, duration_ns, period_ns FROM windows WHERE id = ?1",
                [id],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
            )
            .optional()
            .map_err(err)?;
        let Some((start, duration, period)) = window else {
            return Ok(None);
        };
        let mut profile = Profile {
            start: from_unix_ns(start),
            duration: Duration::from_nanos(duration.max(0) as u64),
            period_ns: period.max(0) as u64,
            mappings: Vec::new(),
            locations: Vec::new(),
            samples: Vec::new(),
        };
        let mut rows = Vec::new();
        self.for_each_window_rows("window = ?1", &[id], |series, stack, value| {
            rows.push((series, stack, value))
        })?;
        let mut reader = Reader::new(&self.connection, &self.path);
        for (series, stack, value) in rows {
            let labels = reader.series(series)?.unwrap_or_default();
            let locations = reader.stack(stack, &mut profile)?;
            profile
                .samples
                .push(sample_of(&labels, locations, value as i64));
        }
        Ok(Some(profile))
    }

    /// The newest window the sink `name` has delivered ([`WindowId::NONE`] for none).
    pub fn cursor(&self, name: &str) -> Result<WindowId, StoreError> {
        let value: rusqlite::Result<Option<i64>> = self
            .connection
            .query_row(
                "SELECT window FROM cursors WHERE name = ?1",
                [name],
                |row| row.get(0),
            )
            .optional();
        match value {
            Ok(value) => Ok(value.map_or(WindowId::NONE, WindowId)),
            // A store written before cursors existed, opened read-only.
            Err(rusqlite::Error::SqliteFailure(_, Some(message)))
                if message.contains("no such table") =>
            {
                Ok(WindowId::NONE)
            }
            Err(e) => Err(self.sqlite(e)),
        }
    }

    /// Records that the sink `name` has delivered every window up to `window`. Needs a store
    /// opened with [`Store::open`].
    pub fn set_cursor(&self, name: &str, window: WindowId) -> Result<(), StoreError> {
        self.connection
            .execute(
                "INSERT INTO cursors (name, window) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET window = excluded.window",
                params![name, window.0],
            )
            .map(|_| ())
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

    /// Moves the WAL's content into the database file and truncates the WAL, so the file's
    /// size is the store's size.
    pub fn checkpoint(&self) -> Result<(), StoreError> {
        self.connection
            .execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
            .map_err(|e| self.sqlite(e))
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

    /// Merges the windows that start in `range` and the series whose labels `matches` accepts
    /// into one profile (samples carry `pid` and `comm`).
    pub fn query(
        &self,
        range: TimeRange,
        matches: &dyn Fn(&Labels) -> bool,
    ) -> Result<Profile, StoreError> {
        let err = |e| self.sqlite(e);
        // One read transaction for every row read (see `window_profile`).
        let _read = self.connection.unchecked_transaction().map_err(err)?;
        let (from, to) = (unix_ns(range.from), unix_ns(range.to));
        let (windows, first, last_end, period): (i64, Option<i64>, Option<i64>, Option<i64>) = self
            .connection
            .query_row(
                "SELECT COUNT(*), MIN(start_ns), MAX(start_ns + duration_ns), MAX(period_ns)
                     FROM windows WHERE start_ns >= ?1 AND start_ns < ?2",
                [from, to],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
            )
            .map_err(err)?;
        let start = first.unwrap_or(from);
        let mut profile = Profile {
            start: from_unix_ns(start),
            duration: Duration::from_nanos(last_end.unwrap_or(start).saturating_sub(start) as u64),
            period_ns: period.unwrap_or(0) as u64,
            mappings: Vec::new(),
            locations: Vec::new(),
            samples: Vec::new(),
        };
        if windows == 0 {
            return Ok(profile);
        }
        let mut merged: HashMap<(i64, i64), u64> = HashMap::new();
        self.for_each_window_rows(
            "window IN (SELECT id FROM windows WHERE start_ns >= ?1 AND start_ns < ?2)",
            &[from, to],
            |series, stack, value| *merged.entry((series, stack)).or_insert(0) += value,
        )?;
        let mut merged: Vec<_> = merged.into_iter().collect();
        // Stable output: the same store and range give the same profile.
        merged.sort_unstable();
        let mut reader = Reader::new(&self.connection, &self.path);
        for ((series, stack), value) in merged {
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
    fn for_each_window_rows(
        &self,
        condition: &str,
        params: &[i64],
        mut each: impl FnMut(i64, i64, u64),
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
            let window: i64 = row.get(0).map_err(err)?;
            let blob: Vec<u8> = row.get(1).map_err(err)?;
            let decoded = decode_rows(&blob).ok_or_else(|| StoreError::Damaged {
                path: self.path.clone(),
                reason: format!("window {window}: its sample rows do not decode"),
            })?;
            for (series, stack, value) in decoded {
                each(series, stack, value);
            }
        }
        Ok(())
    }

    /// The label sets of series with samples in windows starting in `range`.
    pub fn series(&self, range: TimeRange) -> Result<Vec<Labels>, StoreError> {
        let mut ids = HashSet::new();
        self.for_each_window_rows(
            "window IN (SELECT id FROM windows WHERE start_ns >= ?1 AND start_ns < ?2)",
            &[unix_ns(range.from), unix_ns(range.to)],
            |series, _, _| {
                ids.insert(series);
            },
        )?;
        let mut reader = Reader::new(&self.connection, &self.path);
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

    /// Checks every window's rows refer to existing series and stacks, and every stack to
    /// existing locations: what a crash must never break. Returns the windows checked.
    pub fn verify(&self) -> Result<u64, StoreError> {
        let err = |e| self.sqlite(e);
        let check: String = self
            .connection
            .query_row("PRAGMA integrity_check", [], |row| row.get(0))
            .map_err(err)?;
        if check != "ok" {
            return Err(StoreError::Damaged {
                path: self.path.clone(),
                reason: check,
            });
        }
        let orphans: i64 = self
            .connection
            .query_row(
                "SELECT COUNT(*) FROM window_samples WHERE window NOT IN (SELECT id FROM windows)",
                [],
                |row| row.get(0),
            )
            .map_err(err)?;
        if orphans > 0 {
            return Err(StoreError::Damaged {
                path: self.path.clone(),
                reason: format!("{orphans} windows' sample rows have no window"),
            });
        }
        // Every stack a window uses must decode into existing locations, functions, strings.
        let everything = TimeRange {
            from: UNIX_EPOCH,
            to: from_unix_ns(i64::MAX),
        };
        self.query(everything, &|_| true)?;
        Ok(self.windows()?.0)
    }
}

/// Reads the first bytes of `path` and its SQLite header fields without opening it for
/// writing: a file that is not ours is refused before anything could change it.
fn identify(path: &Path) -> Result<(), StoreError> {
    let foreign = |reason: String| StoreError::Foreign {
        path: path.to_owned(),
        reason,
    };
    let mut header = [0u8; 100];
    let read = std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read(&mut f, &mut header))
        .map_err(|e| foreign(format!("cannot read it: {e}")))?;
    if read < 100 || &header[..16] != b"SQLite format 3\0" {
        return Err(foreign("it is not a SQLite database".into()));
    }
    // Header offsets 60 (user_version) and 68 (application_id), big-endian.
    let user_version = i32::from_be_bytes([header[60], header[61], header[62], header[63]]);
    let application_id = i32::from_be_bytes([header[68], header[69], header[70], header[71]]);
    if application_id != APPLICATION_ID {
        return Err(foreign(format!(
            "it is a SQLite database of another application (application_id {application_id:#x})"
        )));
    }
    if user_version > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            path: path.to_owned(),
            found: user_version,
        });
    }
    if user_version < SCHEMA_VERSION {
        return Err(StoreError::OlderSchema {
            path: path.to_owned(),
            found: user_version,
        });
    }
    Ok(())
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
        let mapping = location.mapping.map_or(0, |m| mapping_ids[m]);
        let key = (mapping, location.address as i64, location.kernel, lines);
        let (connection, window) = (self.connection, self.window);
        let k = key.clone();
        Self::id(
            connection,
            window,
            &mut self.cache.locations,
            key,
            "locations",
            || {
                // The row's content, as one byte string, is what is hashed.
                let mut content = Vec::with_capacity(k.3.len() + 24);
                put_varint(&mut content, k.0 as u64);
                put_varint(&mut content, k.1 as u64);
                content.push(u8::from(k.2));
                content.extend_from_slice(&k.3);
                let hash = content_hash(&content);
                let mut select = connection.prepare_cached(
                    "SELECT id, mapping, address, kernel, lines FROM locations WHERE hash = ?1",
                )?;
                let mut rows = select.query([hash])?;
                while let Some(row) = rows.next()? {
                    let same = row.get::<_, i64>(1)? == k.0
                        && row.get::<_, i64>(2)? == k.1
                        && row.get::<_, bool>(3)? == k.2
                        && row.get_ref(4)?.as_blob()? == k.3.as_slice();
                    if same {
                        let id: i64 = row.get(0)?;
                        touch(connection, "locations", id, window)?;
                        return Ok(id);
                    }
                }
                connection
                    .prepare_cached(
                        "INSERT INTO locations (hash, mapping, address, kernel, lines, last_window)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    )?
                    .execute(params![hash, k.0, k.1, k.2, k.3, window])?;
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

/// FNV-1a, 64 bits: a stable hash (the store keeps it on disk, so it must not change between
/// builds, as std's hasher may). Collisions are harmless: lookups compare the content.
fn content_hash(bytes: &[u8]) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash as i64
}

/// A window's `(series, stack, value)` rows, sorted: series as deltas from the previous row's,
/// stack as a delta from the previous row's within the same series (from 0 when the series
/// changes), value as is; all varints.
fn encode_rows(rows: &[(i64, i64, u64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows.len() * 4);
    let (mut last_series, mut last_stack) = (0i64, 0i64);
    for &(series, stack, value) in rows {
        if series != last_series {
            last_stack = 0;
        }
        put_varint(&mut out, (series - last_series) as u64);
        put_varint(&mut out, (stack - last_stack) as u64);
        put_varint(&mut out, value);
        (last_series, last_stack) = (series, stack);
    }
    out
}

fn decode_rows(bytes: &[u8]) -> Option<Vec<(i64, i64, u64)>> {
    let numbers = varints(bytes)?;
    if numbers.len() % 3 != 0 {
        return None;
    }
    let (mut series, mut stack) = (0i64, 0i64);
    let mut rows = Vec::with_capacity(numbers.len() / 3);
    for triple in numbers.chunks_exact(3) {
        let next_series = series.checked_add(i64::try_from(triple[0]).ok()?)?;
        if next_series != series {
            stack = 0;
        }
        series = next_series;
        stack = stack.checked_add(i64::try_from(triple[1]).ok()?)?;
        rows.push((series, stack, triple[2]));
    }
    Some(rows)
}

/// Rebuilds profile parts from rows, each row read once per query.
struct Reader<'a> {
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
}

impl<'a> Reader<'a> {
    fn new(connection: &'a Connection, path: &'a Path) -> Self {
        Reader {
            connection,
            path,
            series: HashMap::new(),
            strings: HashMap::new(),
            functions: HashMap::new(),
            mappings: HashMap::new(),
            locations: HashMap::new(),
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

    fn series(&mut self, id: i64) -> Result<Option<Arc<Labels>>, StoreError> {
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

    fn function(&mut self, id: i64) -> Result<(String, String, Option<String>), StoreError> {
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
                s.query_row([id], |row| {
                    Ok((
                        row.get(0)?,
                        row.get(1)?,
                        row.get(2)?,
                        row.get(3)?,
                        row.get(4)?,
                        row.get(5)?,
                    ))
                })
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
        let row: Option<(i64, i64, bool, Vec<u8>)> = self
            .connection
            .prepare_cached("SELECT mapping, address, kernel, lines FROM locations WHERE id = ?1")
            .and_then(|mut s| {
                s.query_row([id], |row| {
                    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
                })
                .optional()
            })
            .map_err(|e| self.sqlite(e))?;
        let (mapping, address, kernel, blob) =
            row.ok_or_else(|| self.damaged(format!("location {id} is missing")))?;
        let numbers =
            varints(&blob).ok_or_else(|| self.damaged(format!("location {id}: bad lines")))?;
        let mut lines = Vec::with_capacity(numbers.len() / 2);
        for pair in numbers.chunks_exact(2) {
            let (function, system_name, file) = self.function(pair[0] as i64)?;
            lines.push(Line {
                function,
                system_name,
                file,
                line: pair[1] as u32,
            });
        }
        let mapping = self.mapping(mapping, profile)?;
        profile.locations.push(Location {
            mapping,
            address: address as u64,
            lines,
            kernel,
        });
        let index = profile.locations.len() - 1;
        self.locations.insert(id, index);
        Ok(index)
    }

    fn stack(&mut self, id: i64, profile: &mut Profile) -> Result<Vec<usize>, StoreError> {
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
fn sample_of(labels: &Arc<Labels>, locations: Vec<usize>, value: i64) -> Sample {
    Sample {
        pid: labels.get("pid").and_then(|p| p.parse().ok()).unwrap_or(0),
        comm: labels.get("comm").cloned().unwrap_or_default(),
        labels: labels.clone(),
        locations,
        count: value.max(0) as u64,
    }
}

fn labels_json(labels: &Labels) -> String {
    serde_json::to_string(labels).unwrap_or_else(|_| "{}".to_owned())
}

fn parse_labels(text: &str) -> Option<Labels> {
    serde_json::from_str(text).ok()
}

/// LEB128, as protobuf writes it: ids are small, most take one or two bytes.
fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn varints(mut bytes: &[u8]) -> Option<Vec<u64>> {
    let mut values = Vec::new();
    while !bytes.is_empty() {
        let mut value = 0u64;
        let mut shift = 0;
        loop {
            let (&byte, rest) = bytes.split_first()?;
            bytes = rest;
            if shift > 63 {
                return None;
            }
            value |= u64::from(byte & 0x7f) << shift;
            shift += 7;
            if byte & 0x80 == 0 {
                break;
            }
        }
        values.push(value);
    }
    Some(values)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::profile::sample_profile;

    fn everything() -> TimeRange {
        TimeRange {
            from: UNIX_EPOCH,
            to: from_unix_ns(i64::MAX),
        }
    }

    /// The profile's samples as comparable (pid, comm, frame names, count), merged and sorted.
    fn named(profile: &Profile) -> Vec<(u32, String, Vec<Vec<String>>, u64)> {
        let mut merged: BTreeMap<(u32, String, Vec<Vec<String>>), u64> = BTreeMap::new();
        for s in &profile.samples {
            let frames = s
                .locations
                .iter()
                .map(|&l| profile.location_names(l))
                .collect();
            *merged.entry((s.pid, s.comm.clone(), frames)).or_insert(0) += s.count;
        }
        merged
            .into_iter()
            .map(|((p, c, f), n)| (p, c, f, n))
            .collect()
    }

    fn window_at(seconds: u64) -> Profile {
        let mut profile = sample_profile();
        profile.start = UNIX_EPOCH + Duration::from_secs(seconds);
        profile
    }

    #[test]
    fn round_trip_merges_windows() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path(), Retention::default()).unwrap();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
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
        let series = read.series(everything()).unwrap();
        assert!(series.iter().any(|l| l.get("comm") == Some(comm)));
        assert_eq!(read.verify().unwrap(), 3);
    }

    #[test]
    fn reopening_keeps_ids_consistent() {
        let dir = tempfile::tempdir().unwrap();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
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

    #[test]
    fn retention_by_age_drops_old_windows_and_their_rows() {
        let dir = tempfile::tempdir().unwrap();
        let retention = Retention {
            max_age: Duration::from_secs(3600),
            ..Retention::default()
        };
        let mut store = Store::open(dir.path(), retention).unwrap();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let mut old = window_at(now - 7200);
        old.samples[0].comm = "only-in-old-window".into();
        // Written with a longer retention, then aged out by the next write.
        store.retention.max_age = Duration::from_secs(10_000);
        store.write_window(&old).unwrap();
        store.retention = retention;
        let stats = store.write_window(&window_at(now - 10)).unwrap();
        assert_eq!(stats.windows_expired, 1);
        assert_eq!(store.windows().unwrap().0, 1);
        // The expired window's own rows may outlive it by TOUCH_EVERY windows; no query
        // reaches them.
        let profile = store.query(everything(), &|_| true).unwrap();
        assert!(profile
            .samples
            .iter()
            .all(|s| s.comm != "only-in-old-window"));
        assert_eq!(store.verify().unwrap(), 1);
    }

    #[test]
    fn garbage_is_collected_once_unused() {
        let dir = tempfile::tempdir().unwrap();
        let retention = Retention {
            max_age: Duration::from_secs(3600),
            ..Retention::default()
        };
        let mut store = Store::open(dir.path(), retention).unwrap();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let mut old = window_at(now - 7200);
        old.samples[0].comm = "only-in-old-window".into();
        store.write_window(&old).unwrap();
        for i in 0..(TOUCH_EVERY as u64 + 2) {
            store.write_window(&window_at(now - 100 + i)).unwrap();
        }
        // Keep the newest window only: the old window's rows are then more than TOUCH_EVERY
        // windows older than the oldest one kept.
        // An exact `now` (the windows start whole seconds before it), so the cut falls between
        // the last two windows whatever the clock's fraction of a second.
        store.retention.max_age =
            Duration::from_millis((100 - TOUCH_EVERY as u64 - 1) * 1000 + 500);
        store
            .enforce_retention(UNIX_EPOCH + Duration::from_secs(now))
            .unwrap();
        assert_eq!(store.windows().unwrap().0, 1);
        let series: Vec<String> = store
            .connection
            .prepare("SELECT labels FROM series")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert!(
            series.iter().all(|l| !l.contains("only-in-old-window")),
            "{series:?}"
        );
        assert!(store.verify().unwrap() >= 1);
        // What is still used survived: a new window and a query work.
        store.write_window(&window_at(now - 1)).unwrap();
        assert!(
            store
                .query(everything(), &|_| true)
                .unwrap()
                .total_samples()
                > 0
        );
        assert!(store.verify().is_ok());
    }

    #[test]
    fn retention_by_size_keeps_the_store_under_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let retention = Retention {
            max_age: Duration::from_secs(365 * 24 * 3600),
            max_bytes: 256 << 10,
        };
        let mut store = Store::open(dir.path(), retention).unwrap();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        // Windows with many distinct stacks, so the store outgrows 256 KiB.
        for w in 0..60u64 {
            let mut profile = window_at(now - 1000 + w);
            let template = profile.samples[0].clone();
            for i in 0..200u64 {
                let mut location = profile.locations[1].clone();
                location.address = 0x6000 + w * 1000 + i;
                location.lines[0].function = format!("function_{w}_{i}");
                profile.locations.push(location);
                let mut sample = template.clone();
                sample.locations = vec![profile.locations.len() - 1, 2];
                profile.samples.push(sample);
            }
            store.write_window(&profile).unwrap();
            assert!(
                store.size_bytes().unwrap() <= retention.max_bytes,
                "window {w}: {} bytes",
                store.size_bytes().unwrap()
            );
        }
        let (count, _, newest) = store.windows().unwrap();
        assert!(count < 60, "{count} windows kept");
        assert_eq!(
            newest,
            Some(UNIX_EPOCH + Duration::from_secs(now - 1000 + 59))
        );
        assert!(store.verify().is_ok());
    }

    #[test]
    fn foreign_files_are_refused_and_untouched() {
        let dir = tempfile::tempdir().unwrap();
        // Not SQLite at all.
        let path = dir.path().join(DATABASE_FILE);
        std::fs::write(&path, b"my precious notes, not a database\n".repeat(10)).unwrap();
        let before = std::fs::read(&path).unwrap();
        let err = Store::open(dir.path(), Retention::default()).err().unwrap();
        assert!(err.to_string().contains("is not a scorch store"), "{err}");
        assert!(err.to_string().contains("not a SQLite database"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), before);
        // Another application's SQLite database.
        std::fs::remove_file(&path).unwrap();
        Connection::open(&path)
            .unwrap()
            .execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
            .unwrap();
        let before = std::fs::read(&path).unwrap();
        let err = Store::open(dir.path(), Retention::default()).err().unwrap();
        assert!(err.to_string().contains("another application"), "{err}");
        assert!(Store::open_read_only(dir.path()).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), before);
        // A file where the directory should be.
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let err = Store::open(&file, Retention::default()).err().unwrap();
        assert!(err.to_string().contains("is a file"), "{err}");
    }

    #[test]
    fn sinks_find_undelivered_windows_after_their_cursor() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path(), Retention::default()).unwrap();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        for i in 0..3 {
            store.write_window(&window_at(now - 30 + i * 10)).unwrap();
        }
        assert_eq!(store.cursor("parca").unwrap(), WindowId::NONE);
        let pending = store.windows_after(WindowId::NONE, 10).unwrap();
        assert_eq!(pending.len(), 3);
        let first = store.window_profile(pending[0].0).unwrap().unwrap();
        assert_eq!(named(&first), named(&sample_profile()));
        assert_eq!(first.start, UNIX_EPOCH + Duration::from_secs(now - 30));
        store.set_cursor("parca", pending[1].0).unwrap();
        // A restart finds the cursor where it was left.
        drop(store);
        let store = Store::open(dir.path(), Retention::default()).unwrap();
        let after = store.cursor("parca").unwrap();
        assert_eq!(after, pending[1].0);
        assert_eq!(store.windows_after(after, 10).unwrap(), vec![pending[2]]);
        assert!(store
            .window_profile(WindowId::new(12345))
            .unwrap()
            .is_none());
    }

    #[test]
    fn varints_round_trip_and_reject_truncation() {
        let values = [0u64, 1, 127, 128, 300, 1 << 40, u64::MAX];
        let mut bytes = Vec::new();
        for &v in &values {
            put_varint(&mut bytes, v);
        }
        assert_eq!(varints(&bytes).unwrap(), values);
        assert!(varints(&[0x80]).is_none());
        let rows = vec![(1, 5, 3), (1, 9, 1), (4, 2, 7), (4, 2000, 1), (300, 1, 1)];
        assert_eq!(decode_rows(&encode_rows(&rows)).unwrap(), rows);
        assert!(decode_rows(&[1, 2]).is_none());
    }
}
