//! Arbitrary bytes as a Go binary: find its `.gopclntab`, name pcs, read stack-pointer deltas.
//! Must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    scorch::binary::gopclntab::fuzz_one(data);
});
