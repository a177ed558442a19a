//! Arbitrary bytes as /proc/self/mountinfo, read for the cgroup v2 mount that names the
//! cgroup ids samples record. Must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    scorch::labels::cgroup_ids::fuzz_one(data);
});
