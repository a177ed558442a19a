//! Arbitrary bytes as a V8 build's post-mortem constants: a version, then pairs of a
//! constant (chosen among those the layout reads) and its value (`runtimes::v8`). Makes the
//! layout; must never panic, whatever the values.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    scorch::runtimes::v8::fuzz_one(data);
});
