//! Batched map reads (`scorch::sys::bpf_batch`) against a real kernel hash map: every entry
//! read once, the map left empty by a take and untouched by a lookup, and buckets larger than
//! the buffer (`ENOSPC`) met by growing it.

use aya::maps::{HashMap, MapData};
use scorch::sys::bpf_batch;

/// Entries in the test map: most of its 4,096 buckets, so many hold two or more.
const ENTRIES: u32 = 4_000;

#[test]
fn batch_drain_takes_every_entry_once_and_grows_for_big_buckets() -> anyhow::Result<()> {
    let mut map: HashMap<MapData, u32, u64> = HashMap::create(4_096, 0)?;
    for key in 0..ENTRIES {
        map.insert(key, u64::from(key) * 3, 0)?;
    }

    // A lookup leaves the map as it was. Room for one entry a call: any bucket of two or
    // more is refused with ENOSPC until the buffer grows.
    let mut seen = vec![0u32; ENTRIES as usize];
    bpf_batch::lookup(&map, 1, |key, value| {
        assert_eq!(value, u64::from(key) * 3);
        seen[key as usize] += 1;
    })?;
    assert!(
        seen.iter().all(|&n| n == 1),
        "lookup saw some keys other than once"
    );
    assert_eq!(
        map.keys().collect::<Result<Vec<_>, _>>()?.len(),
        ENTRIES as usize
    );

    // A take with room for 1,000 entries needs several calls, the last one ending in ENOENT
    // with entries still in it.
    let mut taken = vec![0u32; ENTRIES as usize];
    bpf_batch::take(&mut map, 1_000, |key, value| {
        assert_eq!(value, u64::from(key) * 3);
        taken[key as usize] += 1;
    })?;
    assert!(
        taken.iter().all(|&n| n == 1),
        "take saw some keys other than once"
    );
    assert_eq!(
        map.keys().collect::<Result<Vec<_>, _>>()?.len(),
        0,
        "entries left after a take"
    );

    // An empty map: one call, ENOENT, nothing.
    let mut calls = 0;
    bpf_batch::take(&mut map, 1, |_, _| calls += 1)?;
    assert_eq!(calls, 0);
    Ok(())
}
