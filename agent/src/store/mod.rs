//! The store: an embedded profile database that `scorch run` writes one window at a time and
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
//!
//! The parts: `schema` (tables, and the header fields that say a file is a store), `writer`
//! (a window's transaction and the id caches that keep it small), `reader` (merging windows
//! back into a `Profile`), `timeline` (CPU per step and label from each window's per-series
//! totals, no stack read), `retention` (age, size, garbage), `cursor` (what the remote
//! sinks read back), `names` (the names stored for user addresses, which the symbol service
//! answers from) and `codec` (the byte formats inside rows). This file opens a store and
//! refuses what is not one.

mod codec;
mod cursor;
#[doc(hidden)]
pub mod fixtures;
mod names;
mod reader;
mod retention;
mod schema;
mod timeline;
mod writer;

use std::{
    path::{Path, PathBuf},
    time::{Duration, UNIX_EPOCH},
};

use rusqlite::{Connection, ErrorCode, OpenFlags};

use crate::sys::time::from_unix_ns;
use schema::{APPLICATION_ID, OLDEST_MIGRATED, SCHEMA_VERSION};
use writer::IdCache;

pub use crate::parse::timespec::TimeRange;
pub use crate::profile::{Labels, SampleKind};
pub use reader::QueryLimits;
pub use retention::Retention;
pub use timeline::{Timeline, TimelineRequest, TimelineSeries};
pub use writer::WriteStats;

/// The file name of the database inside the store directory.
pub const DATABASE_FILE: &str = "scorch.db";

/// How stale a row's `last_window` may get before a window that uses it refreshes it.
const TOUCH_EVERY: i64 = 32;

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
    #[error(
        "the query covers more than {limit} distinct stacks; narrow the range or the selector"
    )]
    TooLarge { limit: usize },
    #[error("the query ran longer than {seconds} s; narrow the range or the selector")]
    TimedOut { seconds: u64 },
}

impl StoreError {
    /// A short reason for metrics: `disk_full`, `busy`, or `other`.
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

/// An open store.
pub struct Store {
    connection: Connection,
    /// The database file, for errors.
    path: PathBuf,
    retention: Retention,
    /// Ids of rows written before, so a window only talks to SQLite about what is new.
    cache: IdCache,
    /// Whether the windows say their kind (schema 4): a store of an earlier release, opened
    /// read-only, has CPU windows only.
    kinds: bool,
    /// What the locations table holds: a store of an earlier release, opened read-only, has
    /// a `kernel` flag ([`schema::legacy_kind`] reads it) before schema 5, and no columns
    /// before schema 6.
    shape: reader::Shape,
}

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
            schema::create(&connection).map_err(sqlite)?;
        }
        schema::configure(&connection).map_err(sqlite)?;
        // The header `identify` read may predate a migration still in the WAL: ask SQLite.
        let found: i32 = connection
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .map_err(sqlite)?;
        if found < SCHEMA_VERSION {
            let started = std::time::Instant::now();
            let backfilled = schema::migrate(&connection, found).map_err(sqlite)?;
            tracing::info!(
                "store: upgraded {} from schema {found} to {SCHEMA_VERSION} \
                 ({backfilled} windows' totals in {:.1?})",
                path.display(),
                started.elapsed()
            );
            // So that `identify` (which reads the main file's header) sees the new version.
            connection
                .execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
                .map_err(sqlite)?;
        }
        Ok(Store {
            connection,
            path,
            retention,
            cache: IdCache::default(),
            kinds: true,
            shape: reader::Shape {
                frame_kinds: true,
                line_columns: true,
            },
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
        let sqlite = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        let kinds = schema::windows_have_kinds(&connection).map_err(sqlite)?;
        let frame_kinds = schema::locations_have_kinds(&connection).map_err(sqlite)?;
        let line_columns = schema::locations_have_columns(&connection).map_err(sqlite)?;
        Ok(Store {
            connection,
            path,
            retention: Retention::default(),
            cache: IdCache::default(),
            kinds,
            shape: reader::Shape {
                frame_kinds,
                line_columns,
            },
        })
    }

    /// SQL over the `windows` table that keeps the windows of `kind` (a store without kinds
    /// holds CPU windows only).
    pub(super) fn kind_condition(&self, kind: SampleKind) -> &'static str {
        match (self.kinds, kind) {
            (true, SampleKind::Cpu) => "kind = 0",
            (true, SampleKind::OffCpu) => "kind = 1",
            (false, SampleKind::Cpu) => "1",
            (false, SampleKind::OffCpu) => "0",
        }
    }

    /// SQL over the `locations` table that keeps user-space locations (all but the kernel's).
    pub(super) fn user_location_condition(&self) -> String {
        if self.shape.frame_kinds {
            format!("kind != {}", crate::profile::FrameKind::Kernel.code())
        } else {
            "kernel = 0".to_owned()
        }
    }

    /// The columns a window's sample type is read from ([`schema::sample_type_of`]).
    pub(super) fn kind_columns(&self) -> &'static str {
        if self.kinds {
            "kind, off_cpu_mean_ns, off_cpu_min_ns"
        } else {
            "0, 0, 0"
        }
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

    /// Moves the WAL's content into the database file and truncates the WAL, so the file's
    /// size is the store's size.
    pub fn checkpoint(&self) -> Result<(), StoreError> {
        self.connection
            .execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
            .map_err(|e| self.sqlite(e))
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
        if self.has_totals()? {
            let (orphans, missing): (i64, i64) = self
                .connection
                .query_row(
                    "SELECT
                       (SELECT COUNT(*) FROM window_totals WHERE window NOT IN (SELECT id FROM windows)),
                       (SELECT COUNT(*) FROM window_samples WHERE window NOT IN (SELECT window FROM window_totals))",
                    [],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .map_err(err)?;
            if orphans > 0 || missing > 0 {
                return Err(StoreError::Damaged {
                    path: self.path.clone(),
                    reason: format!(
                        "{orphans} windows' totals have no window, {missing} windows have no totals"
                    ),
                });
            }
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
    // A store of an earlier release: `open` migrates it; a reader reads it as it is.
    if user_version < OLDEST_MIGRATED {
        return Err(StoreError::OlderSchema {
            path: path.to_owned(),
            found: user_version,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
