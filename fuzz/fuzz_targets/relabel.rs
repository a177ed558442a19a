//! Arbitrary bytes as `[[relabel]]` rules in TOML, compiled and applied to a label set. Must
//! never panic nor take time or memory out of proportion to the input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    scorch::labels::relabel::fuzz_one(data);
});
