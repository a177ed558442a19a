//! Arbitrary bytes as what naming a HotSpot frame reads (`runtimes::hotspot::fuzz_names`):
//! UNSIGNED5 values, a line number stream, scope chains, and a Method and nmethod whose
//! pointers are the input's words. Must never panic, and ends within the readers' bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    scorch::runtimes::hotspot::fuzz_names(data);
});
