//! The database's layout: its tables, and the header fields that tell a scorch store from any
//! other SQLite file. A change to the tables bumps [`SCHEMA_VERSION`], so that a scorch that
//! does not know them refuses the store rather than misreads it, and adds a step to
//! [`migrate`], so that a store an earlier release wrote keeps its windows.

use rusqlite::{Connection, OptionalExtension};

use super::codec::{decode_rows, encode_totals, location_hash, totals_of_rows, varints};
use crate::{
    profile::{FrameKind, Line, Location, SampleType},
    runtimes::python::UNKNOWN_CODE,
};

/// `PRAGMA application_id` of a scorch store ("SCOR"): how a SQLite file says what it is.
pub(super) const APPLICATION_ID: i32 = 0x5343_4f52;
/// `PRAGMA user_version`: the schema below.
pub(super) const SCHEMA_VERSION: i32 = 6;
/// The oldest schema [`migrate`] upgrades (and readers still read): 2 lacks `window_totals`,
/// 2 and 3 lack the windows' `kind` (all their windows are CPU samples), 2 to 4 keep a
/// location's `kernel` flag where 5 keeps its frame `kind`, 2 to 5 lack the lines' `columns`.
pub(super) const OLDEST_MIGRATED: i32 = 2;

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
    kind INTEGER NOT NULL,    -- FrameKind::code: 0 native, 1 kernel, 2 Python, 3 Go, 4 JVM
    lines BLOB NOT NULL,      -- varint (functions.id, line) pairs, innermost first
    last_window INTEGER NOT NULL,
    columns BLOB NOT NULL DEFAULT x'' -- LINE_COLUMNS
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
    period_ns INTEGER NOT NULL,
    kind INTEGER NOT NULL DEFAULT 0,            -- 0 CPU samples, 1 off-CPU nanoseconds
    off_cpu_mean_ns INTEGER NOT NULL DEFAULT 0, -- off-CPU's sampling rule (see SampleType)
    off_cpu_min_ns INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX windows_by_start ON windows (start_ns);
-- One row per window: its (series, stack, value) rows, sorted and delta-encoded as varints
-- (see encode_rows). A few bytes per row, where a table row would cost ~15.
CREATE TABLE window_samples (
    window INTEGER PRIMARY KEY, -- windows.id
    rows BLOB NOT NULL
);
";

/// Schema 3: each window's samples per series, so the timeline reads a few bytes per window
/// and series instead of decoding and summing every (series, stack) row of a day.
const WINDOW_TOTALS: &str = "
CREATE TABLE IF NOT EXISTS window_totals (
    window INTEGER PRIMARY KEY, -- windows.id
    totals BLOB NOT NULL        -- varint (series delta, samples) pairs, series ascending
);
";

/// Schema 4: what each window's values measure. A window holds one kind of profile; the
/// daemon writes a CPU window and, with off-CPU on, an off-CPU window for the same time.
/// Existing windows were all CPU samples: the defaults say so.
const WINDOW_KINDS: &str = "
ALTER TABLE windows ADD COLUMN kind INTEGER NOT NULL DEFAULT 0;
ALTER TABLE windows ADD COLUMN off_cpu_mean_ns INTEGER NOT NULL DEFAULT 0;
ALTER TABLE windows ADD COLUMN off_cpu_min_ns INTEGER NOT NULL DEFAULT 0;
";

/// Schema 5: each location's frame kind where its `kernel` flag was. The flag's values are the
/// kinds' codes for native (0) and kernel (1) frames; Python frames, stored as native, are
/// found by [`legacy_kind`] and rehashed (the hash covers the kind).
const FRAME_KINDS: &str = "ALTER TABLE locations RENAME COLUMN kernel TO kind;";

/// Schema 6: the column of each of a location's lines, as varints in the lines' order, or
/// empty when none is known (most frames: DWARF's columns are not kept, and only V8 gives
/// them). Apart from `lines` so that a location without columns keeps its schema 5 blob and
/// hash: the migration adds the column and touches no row.
const LINE_COLUMNS: &str = "ALTER TABLE locations ADD COLUMN columns BLOB NOT NULL DEFAULT x'';";

/// Creates a new store's tables in an empty database.
pub(super) fn create(connection: &Connection) -> rusqlite::Result<()> {
    // auto_vacuum must be chosen before the first table exists. The schema and the header
    // fields that identify the file are committed before the switch to WAL, so they are in the
    // main file (where `identify` reads them), not only in the WAL.
    connection.execute_batch(&format!(
        "PRAGMA auto_vacuum = INCREMENTAL;
         BEGIN;
         {SCHEMA}
         {WINDOW_TOTALS}
         PRAGMA application_id = {APPLICATION_ID};
         PRAGMA user_version = {SCHEMA_VERSION};
         COMMIT;"
    ))
}

/// Sets up every connection that writes. The cursors table is created here rather than in
/// [`SCHEMA`] so that stores made before it existed gain it on their next open.
pub(super) fn configure(connection: &Connection) -> rusqlite::Result<()> {
    connection.execute_batch(
        // NORMAL in WAL mode: a committed window survives a crash of this process; only a
        // power loss can take the newest transactions back.
        "PRAGMA journal_mode = WAL;
         PRAGMA synchronous = NORMAL;
         PRAGMA journal_size_limit = 8388608;
         PRAGMA foreign_keys = OFF;
         CREATE TABLE IF NOT EXISTS cursors (
             name TEXT PRIMARY KEY,    -- a remote sink
             window INTEGER NOT NULL   -- the newest window it has delivered
         );",
    )
}

/// Brings a store of schema `found` (at least [`OLDEST_MIGRATED`]) to [`SCHEMA_VERSION`] in one
/// transaction: on failure it is left as it was. Returns the windows backfilled.
///
/// 2 -> 3: `window_totals`, filled from every stored window's rows (nothing is dropped; the
/// rows themselves are untouched). 3 -> 4: the windows' `kind` columns, every existing window
/// a CPU one. 4 -> 5: the locations' frame kinds ([`FRAME_KINDS`]). 5 -> 6: their lines'
/// columns ([`LINE_COLUMNS`]), none known for the rows already there.
pub(super) fn migrate(connection: &Connection, found: i32) -> rusqlite::Result<usize> {
    if found >= SCHEMA_VERSION {
        return Ok(0);
    }
    let tx = connection.unchecked_transaction()?;
    if !windows_have_kinds(&tx)? {
        tx.execute_batch(WINDOW_KINDS)?;
    }
    if !locations_have_kinds(&tx)? {
        tx.execute_batch(FRAME_KINDS)?;
        mark_python_locations(&tx)?;
    }
    if !locations_have_columns(&tx)? {
        tx.execute_batch(LINE_COLUMNS)?;
    }
    tx.execute_batch(WINDOW_TOTALS)?;
    let mut backfilled = 0;
    {
        let mut select = tx.prepare(
            "SELECT window, rows FROM window_samples
             WHERE window NOT IN (SELECT window FROM window_totals)",
        )?;
        let mut insert =
            tx.prepare("INSERT INTO window_totals (window, totals) VALUES (?1, ?2)")?;
        let mut rows = select.query([])?;
        while let Some(row) = rows.next()? {
            let window: i64 = row.get(0)?;
            let blob: Vec<u8> = row.get(1)?;
            // A window whose rows do not decode gets no totals (the timeline then skips it);
            // `verify` reports it, as before.
            let Some(decoded) = decode_rows(&blob) else {
                tracing::warn!("store: window {window}'s rows do not decode; no totals for it");
                continue;
            };
            insert.execute(rusqlite::params![
                window,
                encode_totals(&totals_of_rows(&decoded))
            ])?;
            backfilled += 1;
        }
    }
    tx.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION};"))?;
    tx.commit()?;
    Ok(backfilled)
}

/// Whether the windows table says each window's kind (schema 4); before it, every window was
/// a CPU one. Asked of the table rather than the version so a reader opening an older store
/// read-only knows, as the migration does.
pub(super) fn windows_have_kinds(connection: &Connection) -> rusqlite::Result<bool> {
    connection.query_row(
        "SELECT COUNT(*) FROM pragma_table_info('windows') WHERE name = 'kind'",
        [],
        |row| row.get::<_, i64>(0).map(|n| n > 0),
    )
}

/// Whether the locations table says each frame's kind (schema 5); before it, a `kernel` flag.
pub(super) fn locations_have_kinds(connection: &Connection) -> rusqlite::Result<bool> {
    connection.query_row(
        "SELECT COUNT(*) FROM pragma_table_info('locations') WHERE name = 'kind'",
        [],
        |row| row.get::<_, i64>(0).map(|n| n > 0),
    )
}

/// Whether the locations keep their lines' columns (schema 6).
pub(super) fn locations_have_columns(connection: &Connection) -> rusqlite::Result<bool> {
    connection.query_row(
        "SELECT COUNT(*) FROM pragma_table_info('locations') WHERE name = 'columns'",
        [],
        |row| row.get::<_, i64>(0).map(|n| n > 0),
    )
}

/// The kind of a location a store before schema 5 kept, from its `kernel` flag and its shape:
/// a Python frame was the only user frame with neither a mapping nor an address, and it had a
/// source file or the unknown-code name (a lost stack's placeholder has neither). Go frames
/// were not told apart: they stay native.
pub(super) fn legacy_kind(location: &Location) -> FrameKind {
    if location.kind.is_kernel() {
        return FrameKind::Kernel;
    }
    let python = location.mapping.is_none()
        && location.address == 0
        && location
            .lines
            .first()
            .is_some_and(|line| line.file.is_some() || line.function == UNKNOWN_CODE);
    if python {
        FrameKind::Python
    } else {
        FrameKind::Native
    }
}

/// Marks the Python locations of a store migrated to schema 5 (see [`legacy_kind`]) and
/// rehashes them, so a window written after the migration finds them.
fn mark_python_locations(tx: &Connection) -> rusqlite::Result<()> {
    let mut candidates = Vec::new();
    {
        let mut select = tx.prepare(
            "SELECT id, lines FROM locations WHERE kind = 0 AND mapping = 0 AND address = 0",
        )?;
        let mut rows = select.query([])?;
        while let Some(row) = rows.next()? {
            candidates.push((row.get::<_, i64>(0)?, row.get::<_, Vec<u8>>(1)?));
        }
    }
    let mut function = tx.prepare(
        "SELECT s.value, f.file FROM functions f JOIN strings s ON s.id = f.name WHERE f.id = ?1",
    )?;
    let mut update = tx.prepare("UPDATE locations SET kind = ?1, hash = ?2 WHERE id = ?3")?;
    for (id, lines) in candidates {
        let Some(&first) = varints(&lines).as_ref().and_then(|v| v.first()) else {
            continue;
        };
        let Some((name, file)) = function
            .query_row([first as i64], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
            })
            .optional()?
        else {
            continue;
        };
        let location = Location {
            mapping: None,
            address: 0,
            lines: vec![Line {
                file: (file != 0).then(String::new),
                ..Line::named(name)
            }],
            kind: FrameKind::Native,
        };
        let kind = legacy_kind(&location);
        if kind == FrameKind::Python {
            let hash = location_hash(0, 0, kind.code(), &lines, &[]);
            update.execute(rusqlite::params![kind.code(), hash, id])?;
        }
    }
    Ok(())
}

/// A window's `kind`, `off_cpu_mean_ns` and `off_cpu_min_ns` columns as the profile's sample
/// type. An unknown kind (a newer scorch's, in a store it migrated) reads as CPU, never as
/// off-CPU nanoseconds.
pub(super) fn sample_type_of(kind: i64, mean_ns: i64, min_ns: i64) -> SampleType {
    match kind {
        1 => SampleType::OffCpu {
            mean_ns: mean_ns.max(0) as u64,
            min_ns: min_ns.max(0) as u64,
        },
        _ => SampleType::Cpu,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        profile::Profile,
        store::{
            fixtures::{everything, now_secs, window_at},
            Retention, Store, DATABASE_FILE,
        },
    };

    /// The sample window, its first stack under a Python frame, a Python frame of an unknown
    /// code object and a Go frame.
    fn with_every_kind(seconds: u64) -> Profile {
        let mut window = window_at(seconds);
        let first = window.locations.len();
        window.locations.extend([
            Location {
                mapping: None,
                address: 0,
                lines: vec![Line {
                    file: Some("/srv/app.py".into()),
                    line: 12,
                    ..Line::named("handler")
                }],
                kind: FrameKind::Python,
            },
            Location {
                mapping: None,
                address: 0,
                lines: vec![Line::named(UNKNOWN_CODE)],
                kind: FrameKind::Python,
            },
            Location {
                mapping: Some(1),
                address: 0x5400,
                lines: vec![Line::named("main.serve")],
                kind: FrameKind::Go,
            },
        ]);
        window.samples[0]
            .locations
            .splice(0..0, [first, first + 1, first + 2]);
        window
    }

    fn locations_of_kind(store: &Store, kind: FrameKind) -> i64 {
        store
            .connection
            .query_row(
                "SELECT COUNT(*) FROM locations WHERE kind = ?1",
                [kind.code()],
                |row| row.get(0),
            )
            .unwrap()
    }

    /// A store of schema 4 (a `kernel` flag per location; Python and Go frames stored as
    /// native, hashed so): read as it is with its Python frames told by their shape, then
    /// migrated by the next writable open, which keeps every kind it could tell and rehashes
    /// the Python rows so that later windows find them.
    #[test]
    fn schema_4_stores_keep_their_frames_and_learn_their_kinds() {
        let dir = tempfile::tempdir().unwrap();
        let now = now_secs();
        let all = |_: &crate::profile::Labels| true;
        let written = {
            let mut store = Store::open(dir.path(), Retention::default()).unwrap();
            store.write_window(&with_every_kind(now - 30)).unwrap();
            store.query(everything(), &all).unwrap()
        };
        assert!(written.locations.iter().any(|l| l.kind == FrameKind::Go));
        // What schema 4 wrote: the flag, and the hashes of rows whose flag was 0.
        let connection = Connection::open(dir.path().join(DATABASE_FILE)).unwrap();
        connection
            .execute_batch(
                "ALTER TABLE locations RENAME COLUMN kind TO kernel;
                 UPDATE locations SET kernel = 0 WHERE kernel > 1;",
            )
            .unwrap();
        let rows: Vec<(i64, i64, i64, i64, Vec<u8>)> = connection
            .prepare("SELECT id, mapping, address, kernel, lines FROM locations")
            .unwrap()
            .query_map([], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        for (id, mapping, address, kernel, lines) in rows {
            let hash = location_hash(mapping, address, kernel as u8, &lines, &[]);
            connection
                .execute(
                    "UPDATE locations SET hash = ?1 WHERE id = ?2",
                    rusqlite::params![hash, id],
                )
                .unwrap();
        }
        connection
            .execute_batch("PRAGMA user_version = 4; PRAGMA wal_checkpoint(TRUNCATE);")
            .unwrap();
        drop(connection);
        // Schema 4 could not tell Go code from other native code.
        let mut expected = written.clone();
        for location in &mut expected.locations {
            if location.kind == FrameKind::Go {
                location.kind = FrameKind::Native;
            }
        }
        let old = Store::open_read_only(dir.path()).unwrap();
        assert!(!old.shape.frame_kinds);
        assert_eq!(old.query(everything(), &all).unwrap(), expected);
        drop(old);

        let mut store = Store::open(dir.path(), Retention::default()).unwrap();
        assert!(store.shape.frame_kinds);
        assert_eq!(store.verify().unwrap(), 1);
        assert_eq!(store.query(everything(), &all).unwrap(), expected);
        assert_eq!(locations_of_kind(&store, FrameKind::Python), 2);
        assert_eq!(locations_of_kind(&store, FrameKind::Kernel), 1);
        // A window written now finds the migrated Python rows: it adds only its Go row.
        store.write_window(&with_every_kind(now - 20)).unwrap();
        assert_eq!(locations_of_kind(&store, FrameKind::Python), 2);
        assert_eq!(locations_of_kind(&store, FrameKind::Go), 1);
        let both = store.query(everything(), &all).unwrap();
        let kinds = |p: &Profile| {
            let mut kinds: Vec<FrameKind> = p.locations.iter().map(|l| l.kind).collect();
            kinds.sort();
            kinds.dedup();
            kinds
        };
        assert_eq!(
            kinds(&both),
            [
                FrameKind::Native,
                FrameKind::Kernel,
                FrameKind::Python,
                FrameKind::Go
            ]
        );
        // And the query path's pprof says them, in scorch's own location field.
        let pprof = crate::profile::encode::pprof::to_message(&both);
        let mut codes: Vec<u32> = pprof.location.iter().map(|l| l.scorch_frame_kind).collect();
        codes.sort();
        codes.dedup();
        assert_eq!(codes, [0, 1, 2, 3]);
    }

    /// The sample window with a JavaScript frame of two lines, the inlined one's column
    /// known, its caller's not.
    fn with_columns(seconds: u64) -> Profile {
        let mut window = window_at(seconds);
        let at = window.locations.len();
        let line = |name: &str, line, column| Line {
            file: Some("/srv/app.js".into()),
            line,
            column,
            ..Line::named(name)
        };
        window.locations.push(Location {
            mapping: None,
            address: 0,
            lines: vec![line("parse", 14, 9), line("run", 40, 0)],
            kind: FrameKind::V8js,
        });
        window.samples[0].locations.insert(0, at);
        window
    }

    fn location_rows(store: &Store) -> i64 {
        store
            .connection
            .query_row("SELECT COUNT(*) FROM locations", [], |row| row.get(0))
            .unwrap()
    }

    /// Columns are kept and read back, and a store of schema 5 (no `columns`) is read as it
    /// is, then migrated without a row touched: the locations it holds are found again by the
    /// windows written after, and those with columns added beside them.
    #[test]
    fn columns_are_kept_and_schema_5_stores_gain_them() {
        let dir = tempfile::tempdir().unwrap();
        let now = now_secs();
        let all = |_: &crate::profile::Labels| true;
        let with = with_columns(now - 40);
        let written = {
            let mut store = Store::open(dir.path(), Retention::default()).unwrap();
            store.write_window(&with).unwrap();
            store.query(everything(), &all).unwrap()
        };
        let javascript = |p: &Profile| {
            p.locations
                .iter()
                .find(|l| l.kind == FrameKind::V8js)
                .map(|l| {
                    l.lines
                        .iter()
                        .map(|l| (l.line, l.column))
                        .collect::<Vec<_>>()
                })
        };
        assert_eq!(javascript(&written), Some(vec![(14, 9), (40, 0)]));

        // A schema 5 store: the rows of a window without columns.
        std::fs::remove_dir_all(dir.path()).unwrap();
        {
            let mut store = Store::open(dir.path(), Retention::default()).unwrap();
            store.write_window(&window_at(now - 30)).unwrap();
        }
        let connection = Connection::open(dir.path().join(DATABASE_FILE)).unwrap();
        connection
            .execute_batch(
                "ALTER TABLE locations DROP COLUMN columns;
                 PRAGMA user_version = 5; PRAGMA wal_checkpoint(TRUNCATE);",
            )
            .unwrap();
        drop(connection);
        let old = Store::open_read_only(dir.path()).unwrap();
        assert!(!old.shape.line_columns);
        let before = old.query(everything(), &all).unwrap();
        let rows = location_rows(&old);
        drop(old);

        let mut store = Store::open(dir.path(), Retention::default()).unwrap();
        assert!(store.shape.line_columns);
        assert_eq!(store.query(everything(), &all).unwrap(), before);
        // The same window again adds no location; one with a JavaScript frame adds it alone.
        store.write_window(&window_at(now - 20)).unwrap();
        assert_eq!(location_rows(&store), rows);
        store.write_window(&with_columns(now - 10)).unwrap();
        assert_eq!(location_rows(&store), rows + 1);
        let after = store.query(everything(), &all).unwrap();
        assert_eq!(javascript(&after), Some(vec![(14, 9), (40, 0)]));
        // A damaged column blob is an error naming the location, never a misread.
        store
            .connection
            .execute(
                "UPDATE locations SET columns = x'09' WHERE length(columns) > 0",
                [],
            )
            .unwrap();
        let err = store.query(everything(), &all).unwrap_err().to_string();
        assert!(err.contains("bad columns"), "{err}");
    }

    #[test]
    fn frame_kind_codes_round_trip() {
        for kind in FrameKind::ALL {
            assert_eq!(FrameKind::from_code(i64::from(kind.code())), kind);
        }
        // A newer scorch's kind reads as native, never as the kernel's.
        assert_eq!(FrameKind::from_code(200), FrameKind::Native);
    }
}
