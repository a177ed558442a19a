//! Helpers the store's unit tests share.

use std::{
    collections::BTreeMap,
    time::{Duration, UNIX_EPOCH},
};

use super::TimeRange;
use crate::profile::{sample_profile, Profile};
use crate::sys::time::from_unix_ns;

/// Now, in whole seconds since the epoch, for windows written "a minute ago".
pub(super) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A range that holds every window.
pub(super) fn everything() -> TimeRange {
    TimeRange {
        from: UNIX_EPOCH,
        to: from_unix_ns(i64::MAX),
    }
}

/// The profile's samples as comparable (pid, comm, frame names, count), merged and sorted.
pub(super) fn named(profile: &Profile) -> Vec<(u32, String, Vec<Vec<String>>, u64)> {
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

pub(super) fn window_at(seconds: u64) -> Profile {
    let mut profile = sample_profile();
    profile.start = UNIX_EPOCH + Duration::from_secs(seconds);
    profile
}
