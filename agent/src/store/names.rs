//! Names the store already holds for user-space addresses: what the HTTP API's symbol service
//! (`/symbolz`, which `go tool pprof` asks for the addresses a profile left unnamed) answers
//! from. Nothing here reads a process or a file: only rows earlier windows wrote.
//!
//! The symbol protocol sends bare addresses, with no process or binary, and the same address
//! means different code in different binaries (every non-PIE executable starts at 0x400000).
//! So an address is named only when every stored location at it lies in one binary (one
//! mapped path, and at most one build id among them) and every named one gives the same
//! innermost function: a file replaced under its path with a new build id, or two binaries
//! sharing the address, leave it unnamed rather than named wrongly.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::codec::varints;
use super::reader::{QueryLimits, Reader};
use super::{Store, StoreError};

/// What the stored locations at one asked-for address agree on so far.
#[derive(Debug, Default)]
struct AtAddress {
    /// `strings.id` of the mapped path of the first location seen.
    path: i64,
    /// `strings.id` of the first build id seen; 0 while none.
    build_id: i64,
    /// `functions.id` of each named location's innermost function.
    functions: BTreeSet<i64>,
    /// Two binaries hold the address: it stays unnamed.
    conflict: bool,
}

impl Store {
    /// The innermost function name the store holds for each of `addresses` (absolute user-space
    /// addresses), for those it can name one way only (see the module's documentation).
    /// Kernel locations are left out: they hold offsets from `_text`, which a user address
    /// could equal. One pass over the locations, checked against `limits`' deadline.
    pub fn names_at(
        &self,
        addresses: &BTreeSet<u64>,
        limits: QueryLimits,
    ) -> Result<BTreeMap<u64, String>, StoreError> {
        let err = |e| self.sqlite(e);
        if addresses.is_empty() {
            return Ok(BTreeMap::new());
        }
        let _read = self.connection.unchecked_transaction().map_err(err)?;
        let mut seen: HashMap<u64, AtAddress> = HashMap::new();
        {
            // No index on the address: one scan, the asked-for set checked here, costs the same
            // for one address as for thousands.
            let mut statement = self
                .connection
                .prepare_cached(&format!(
                    "SELECT l.address, l.lines, m.path, m.build_id
                     FROM locations l JOIN mappings m ON m.id = l.mapping
                     WHERE l.{}",
                    self.user_location_condition()
                ))
                .map_err(err)?;
            let mut rows = statement.query([]).map_err(err)?;
            let mut scanned = 0u64;
            while let Some(row) = rows.next().map_err(err)? {
                scanned += 1;
                if scanned.is_multiple_of(4096) {
                    limits.check_time()?;
                }
                let address = row.get::<_, i64>(0).map_err(err)? as u64;
                if !addresses.contains(&address) {
                    continue;
                }
                let lines: Vec<u8> = row.get(1).map_err(err)?;
                let (path, build_id): (i64, i64) =
                    (row.get(2).map_err(err)?, row.get(3).map_err(err)?);
                let at = seen.entry(address).or_insert_with(|| AtAddress {
                    path,
                    ..AtAddress::default()
                });
                if at.path != path || (build_id != 0 && at.build_id != 0 && at.build_id != build_id)
                {
                    at.conflict = true;
                }
                if at.build_id == 0 {
                    at.build_id = build_id;
                }
                let numbers = varints(&lines).ok_or_else(|| StoreError::Damaged {
                    path: self.path.clone(),
                    reason: format!("a location at {address:#x}: bad lines"),
                })?;
                if let Some(&function) = numbers.first() {
                    at.functions.insert(function as i64);
                }
            }
        }
        let mut reader = Reader::new(&self.connection, &self.path, self.shape);
        let mut names = BTreeMap::new();
        for (address, at) in seen {
            if at.conflict || at.functions.is_empty() {
                continue;
            }
            let mut distinct = BTreeSet::new();
            for &function in &at.functions {
                distinct.insert(reader.function(function)?.0);
            }
            if distinct.len() == 1 {
                names.extend(distinct.into_iter().map(|name| (address, name)));
            }
        }
        Ok(names)
    }

    /// Whether the store names any user-space location: the symbol service's `num_symbols`.
    pub fn has_user_names(&self) -> Result<bool, StoreError> {
        self.connection
            .query_row(
                &format!(
                    "SELECT EXISTS (SELECT 1 FROM locations WHERE {} AND mapping != 0
                         AND length(lines) > 0)",
                    self.user_location_condition()
                ),
                [],
                |row| row.get(0),
            )
            .map_err(|e| self.sqlite(e))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::profile::{sample_profile, FrameKind, Line, Location, Mapping};
    use crate::store::{fixtures::now_secs, Retention};

    /// A store with `profiles` as its windows, 10 s apart and recent (retention keeps them).
    fn store_with(profiles: &[crate::profile::Profile]) -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path(), Retention::default()).unwrap();
        let first = now_secs() - 10 * profiles.len() as u64;
        for (i, profile) in profiles.iter().enumerate() {
            let mut window = profile.clone();
            window.start =
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(first + 10 * i as u64);
            store.write_window(&window).unwrap();
        }
        assert_eq!(store.windows().unwrap().0, profiles.len() as u64);
        (dir, store)
    }

    fn ask(store: &Store, addresses: &[u64]) -> BTreeMap<u64, String> {
        let set: BTreeSet<u64> = addresses.iter().copied().collect();
        store.names_at(&set, QueryLimits::NONE).unwrap()
    }

    #[test]
    fn names_user_addresses_the_store_named() {
        let profile = sample_profile();
        let (_dir, store) = store_with(&[profile]);
        assert!(store.has_user_names().unwrap());
        // 0x5100 leaf, 0x5200 main; 0x5300 is stored unnamed; 0x9999 was never seen.
        let names = ask(&store, &[0x5100, 0x5200, 0x5300, 0x9999]);
        assert_eq!(
            names,
            BTreeMap::from([(0x5100, "leaf".to_owned()), (0x5200, "main".to_owned())])
        );
        // The kernel location's offset is not a user address.
        let kernel = sample_profile().locations[0].address;
        assert!(ask(&store, &[kernel]).is_empty());
        assert!(ask(&store, &[]).is_empty());
    }

    #[test]
    fn an_address_named_earlier_in_the_same_binary_is_named_now() {
        // An earlier window named 0x5300 (the binary was readable then); the window at hand
        // left it unnamed. Same path, same build id: the earlier name stands.
        let mut earlier = sample_profile();
        earlier.locations[3].lines = vec![Line::named("helper")];
        let (_dir, store) = store_with(&[earlier, sample_profile()]);
        assert_eq!(ask(&store, &[0x5300]).get(&0x5300).unwrap(), "helper");
    }

    #[test]
    fn an_address_two_binaries_hold_stays_unnamed() {
        // The same address in another executable (non-PIE binaries share 0x400000 and up).
        let mut other = sample_profile();
        other.mappings[1] = Mapping {
            path: "/usr/bin/other".into(),
            build_id: Some("123456".into()),
            ..other.mappings[1].clone()
        };
        other.locations[1].lines = vec![Line::named("other_leaf")];
        let (_dir, store) = store_with(&[sample_profile(), other]);
        assert!(!ask(&store, &[0x5100]).contains_key(&0x5100));
        // Two names for one address in one binary (a replaced file, same build id): unnamed.
        let mut renamed = sample_profile();
        renamed.locations[2].lines = vec![Line::named("not_main")];
        let (_dir, store) = store_with(&[sample_profile(), renamed]);
        let names = ask(&store, &[0x5100, 0x5200]);
        assert_eq!(names.keys().collect::<Vec<_>>(), [&0x5100], "{names:?}");
        // The same path under a new build id: another binary.
        let mut rebuilt = sample_profile();
        rebuilt.mappings[1].build_id = Some("fedcba".into());
        rebuilt.locations.push(Location {
            mapping: Some(1),
            address: 0x5400,
            lines: vec![],
            kind: FrameKind::Native,
        });
        rebuilt.samples[1].locations.push(4);
        let mut first = sample_profile();
        first.locations.push(Location {
            mapping: Some(1),
            address: 0x5400,
            lines: vec![Line::named("old_code")],
            kind: FrameKind::Native,
        });
        first.samples[1].locations.push(4);
        let (_dir, store) = store_with(&[first, rebuilt]);
        assert!(ask(&store, &[0x5400]).is_empty());
    }

    #[test]
    fn an_empty_store_names_nothing() {
        let (_dir, store) = store_with(&[]);
        assert!(!store.has_user_names().unwrap());
        assert!(ask(&store, &[0x5100]).is_empty());
    }
}
