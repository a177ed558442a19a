//! Arbitrary bytes as a label selector (`scorch query --match`, the HTTP API's `match=`):
//! parse, print, parse again, match. Must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    scorch::parse::selector::fuzz_one(data);
});
