//! Retention: what the store keeps and how it gives the rest back. Age is cheap: delete the old
//! windows, then the rows whose `last_window` lags behind the oldest window left. Size cannot
//! wait for that lag, so it deletes the oldest windows and sweeps, exactly, every row no
//! remaining window reaches.

use std::{
    collections::HashSet,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use super::codec::{decode_rows, varints};
use super::writer::IdCache;
use super::{Store, StoreError, TOUCH_EVERY};
use crate::sys::time::unix_ns;

/// A retention pass deletes by age at most 1/this of the stored windows...
const AGE_SHARE_PER_PASS: i64 = 50;
/// ...or this many, whichever is more (a daemon back from a short stop catches up at once).
const MIN_AGE_DELETIONS_PER_PASS: i64 = 16;

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

impl Store {
    /// Deletes windows older than the age limit, then the oldest ones while the store is over
    /// its size limit, then the rows no window uses any more. Returns the windows deleted.
    pub fn enforce_retention(&mut self, now: SystemTime) -> Result<usize, StoreError> {
        let oldest_kept_ns = unix_ns(
            now.checked_sub(self.retention.max_age)
                .unwrap_or(UNIX_EPOCH),
        );
        // In steady state one window ages out per window written. Many at once means the
        // daemon was away longer than the retention age, or the wall clock jumped forward;
        // on a jump, deleting by age would wipe the history in one pass. So a pass deletes at
        // most a small share of the store, and a real backlog of old windows still goes, a
        // pass at a time.
        let (stored, expirable): (i64, i64) = self
            .connection
            .query_row(
                "SELECT COUNT(*), COUNT(*) FILTER (WHERE start_ns < ?1) FROM windows",
                [oldest_kept_ns],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .map_err(|e| self.sqlite(e))?;
        let allowed = (stored / AGE_SHARE_PER_PASS).max(MIN_AGE_DELETIONS_PER_PASS);
        if expirable > allowed {
            tracing::warn!(
                "store: {expirable} of {stored} windows are older than the retention age; \
                 deleting {allowed} now (has the clock jumped forward?)"
            );
        }
        let mut expired = self
            .delete_windows(
                "id IN (SELECT id FROM windows WHERE start_ns < ?1 ORDER BY id LIMIT ?2)",
                &[oldest_kept_ns, allowed],
            )
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
                .delete_windows("id < ?1", &[oldest + batch])
                .map_err(|e| self.sqlite(e))?;
            self.sweep()?;
        }
        Ok(expired)
    }

    fn delete_windows(&self, condition: &str, values: &[i64]) -> rusqlite::Result<usize> {
        let tx = self.connection.unchecked_transaction()?;
        for table in ["window_samples", "window_totals"] {
            tx.execute(
                &format!(
                    "DELETE FROM {table} WHERE window IN (SELECT id FROM windows WHERE {condition})"
                ),
                rusqlite::params_from_iter(values),
            )?;
        }
        let deleted = tx.execute(
            &format!("DELETE FROM windows WHERE {condition}"),
            rusqlite::params_from_iter(values),
        )?;
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::fixtures::{everything, window_at};

    /// A fresh store keeping one hour, its retention, and the fixtures' `now` in seconds.
    fn hour_store() -> (tempfile::TempDir, Store, Retention, u64) {
        let dir = tempfile::tempdir().unwrap();
        let retention = Retention {
            max_age: Duration::from_secs(3600),
            ..Retention::default()
        };
        let store = Store::open(dir.path(), retention).unwrap();
        (dir, store, retention, crate::store::fixtures::now_secs())
    }

    #[test]
    fn retention_by_age_drops_old_windows_and_their_rows() {
        let (_dir, mut store, retention, now) = hour_store();
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
    fn a_clock_jumped_forward_deletes_only_a_share_per_pass() {
        let (_dir, mut store, _, now) = hour_store();
        for i in 0..100 {
            store.write_window(&window_at(now - 1000 + i)).unwrap();
        }
        // A year later by the wall clock: every window is past the age limit.
        let jumped = UNIX_EPOCH + Duration::from_secs(now + 365 * 24 * 3600);
        let deleted = store.enforce_retention(jumped).unwrap();
        assert_eq!(deleted, MIN_AGE_DELETIONS_PER_PASS as usize);
        assert_eq!(store.windows().unwrap().0, 100 - deleted as u64);
        // Size retention is unaffected: it is not a matter of the clock.
        assert_eq!(store.verify().unwrap(), 100 - deleted as u64);
    }

    #[test]
    fn garbage_is_collected_once_unused() {
        let (_dir, mut store, _, now) = hour_store();
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
        // A pass deletes a bounded share by age (see `a_clock_jumped_forward_...`): as the
        // daemon would, pass after pass until nothing more is old.
        while store
            .enforce_retention(UNIX_EPOCH + Duration::from_secs(now))
            .unwrap()
            > 0
        {}
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
        let now = crate::store::fixtures::now_secs();
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
}
