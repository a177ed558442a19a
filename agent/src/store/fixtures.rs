//! Windows for the store's unit tests and benches: the tests' helpers, and
//! [`synthetic_window`], a day's worth of which the `views` bench writes.

#[cfg(test)]
use std::collections::BTreeMap;
use std::{
    sync::Arc,
    time::{Duration, UNIX_EPOCH},
};

#[cfg(test)]
use super::TimeRange;
#[cfg(test)]
use crate::profile::sample_profile;
use crate::profile::{FrameKind, Labels, Line, Location, Mapping, Profile, Sample};
#[cfg(test)]
use crate::sys::time::from_unix_ns;

/// A window of `processes` processes with `stacks` distinct stacks each, starting at `start`
/// (Unix seconds) and lasting `seconds`. Processes are named after one of 20 programs and
/// replaced every 360 windows (an hour of 10 s windows), so a day holds the churn of a busy
/// host: about 1,200 series. Stacks are 8 to 15 frames deep over a shared pool of 500
/// functions. The same arguments give the same window.
pub fn synthetic_window(start: u64, seconds: u64, processes: u32, stacks: u32) -> Profile {
    let epoch = (start / (seconds * 360)) as u32;
    let mapping = Mapping {
        start: 0x40_0000,
        limit: 0x80_0000,
        file_offset: 0,
        path: "/usr/bin/synthetic".into(),
        build_id: Some("5ca1ab1e".into()),
        has_functions: true,
        has_filenames: false,
        has_line_numbers: false,
        has_inline_frames: false,
    };
    let locations: Vec<Location> = (0..500u64)
        .map(|f| Location {
            mapping: Some(0),
            address: 0x40_1000 + f * 0x40,
            lines: vec![Line::named(format!("function_{f}"))],
            kind: FrameKind::Native,
        })
        .collect();
    let mut samples = Vec::new();
    for p in 0..processes {
        let pid = 1000 + epoch * processes + p;
        let comm = format!("program_{}", p % 20);
        let labels = Arc::new(Labels::from([
            ("comm".to_owned(), comm.clone()),
            ("pid".to_owned(), pid.to_string()),
            ("unit".to_owned(), format!("unit_{}.service", p % 7)),
        ]));
        for s in 0..stacks {
            // A small deterministic mix, so stacks differ between processes and depths vary.
            let seed = u64::from(p) * 7919 + u64::from(s) * 104_729;
            let depth = 8 + (seed % 8) as usize;
            let locations = (0..depth)
                .map(|d| ((seed / 3 + d as u64 * 37 + u64::from(s)) % 500) as usize)
                .collect();
            samples.push(Sample {
                pid,
                comm: comm.clone(),
                labels: labels.clone(),
                locations,
                count: 1 + (seed % 5),
            });
        }
    }
    Profile {
        start: UNIX_EPOCH + Duration::from_secs(start),
        duration: Duration::from_secs(seconds),
        period_ns: 52_631_578,
        sample_type: crate::profile::SampleType::Cpu,
        mappings: vec![mapping],
        locations,
        samples,
    }
}

#[cfg(test)]
/// Now, in whole seconds since the epoch, for windows written "a minute ago".
pub(super) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[cfg(test)]
/// A range that holds every window.
pub(super) fn everything() -> TimeRange {
    TimeRange {
        from: UNIX_EPOCH,
        to: from_unix_ns(i64::MAX),
    }
}

#[cfg(test)]
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

#[cfg(test)]
pub(super) fn window_at(seconds: u64) -> Profile {
    let mut profile = sample_profile();
    profile.start = UNIX_EPOCH + Duration::from_secs(seconds);
    profile
}
