//! What the remote sinks read: the store is their spool. Each sink keeps a cursor, the newest
//! window it has delivered, in the store itself so a restart resumes where it stopped; window
//! ids only grow, so what is left to send is every window after it.

use std::time::Duration;

use rusqlite::{params, OptionalExtension};

use super::reader::{sample_of, Reader};
use super::{Store, StoreError, TimeRange, WindowId};
use crate::profile::Profile;
use crate::sys::time::from_unix_ns;

impl Store {
    /// The newest window the sink `name` has delivered (0 for none).
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
            Ok(value) => Ok(value.map_or(WindowId::NONE, WindowId::new)),
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
                params![name, window.get()],
            )
            .map(|_| ())
            .map_err(|e| self.sqlite(e))
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
            .query_map(params![after.get(), limit as i64], |row| {
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
                WindowId::new(id),
                TimeRange {
                    from: from_unix_ns(start),
                    to: from_unix_ns(start.saturating_add(duration.max(1))),
                },
            ));
        }
        Ok(windows)
    }

    /// How many windows come after `after`, and the oldest one's range: a sink's queue, counted
    /// without reading the windows themselves.
    pub fn backlog_after(&self, after: WindowId) -> Result<(u64, Option<TimeRange>), StoreError> {
        let err = |e| self.sqlite(e);
        let count: i64 = self
            .connection
            .prepare_cached("SELECT COUNT(*) FROM windows WHERE id > ?1")
            .and_then(|mut s| s.query_row(params![after.get()], |row| row.get(0)))
            .map_err(err)?;
        let oldest = self
            .windows_after(after, 1)?
            .first()
            .map(|&(_, range)| range);
        Ok((u64::try_from(count).unwrap_or(0), oldest))
    }

    /// The profile of one window (all its series; each sample's labels say which), or `None`
    /// when retention has deleted it.
    pub fn window_profile(&self, id: WindowId) -> Result<Option<Profile>, StoreError> {
        let id = id.get();
        let err = |e| self.sqlite(e);
        // One read transaction for the hundreds of row reads below: without it each one takes
        // and releases the database's file locks. Dropping it ends it (nothing was written).
        let _read = self.connection.unchecked_transaction().map_err(err)?;
        let window: Option<(i64, i64, i64, [i64; 3])> = self
            .connection
            .query_row(
                &format!(
                    "SELECT start_ns, duration_ns, period_ns, {} FROM windows WHERE id = ?1",
                    self.kind_columns()
                ),
                [id],
                |row| {
                    Ok((
                        row.get(0)?,
                        row.get(1)?,
                        row.get(2)?,
                        [row.get(3)?, row.get(4)?, row.get(5)?],
                    ))
                },
            )
            .optional()
            .map_err(err)?;
        let Some((start, duration, period, [kind, mean_ns, min_ns])) = window else {
            return Ok(None);
        };
        let mut profile = Profile {
            start: from_unix_ns(start),
            duration: Duration::from_nanos(duration.max(0) as u64),
            period_ns: period.max(0) as u64,
            sample_type: super::schema::sample_type_of(kind, mean_ns, min_ns),
            mappings: Vec::new(),
            locations: Vec::new(),
            samples: Vec::new(),
        };
        let mut rows = Vec::new();
        self.for_each_window_rows(
            "window = ?1",
            &[id],
            |series, stack, value| {
                rows.push((series, stack, value));
                Ok(())
            },
            super::QueryLimits::NONE,
        )?;
        let mut reader = Reader::new(&self.connection, &self.path, self.shape);
        for (series, stack, value) in rows {
            let labels = reader.series(series)?.unwrap_or_default();
            let locations = reader.stack(stack, &mut profile)?;
            profile
                .samples
                .push(sample_of(&labels, locations, value as i64));
        }
        Ok(Some(profile))
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::profile::sample_profile;
    use crate::store::{
        fixtures::{named, window_at},
        Retention,
    };

    #[test]
    fn sinks_find_undelivered_windows_after_their_cursor() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path(), Retention::default()).unwrap();
        let now = crate::store::fixtures::now_secs();
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
}
