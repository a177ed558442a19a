//! Arbitrary bytes as what naming a V8 frame reads (`runtimes::v8::fuzz_frames`): source
//! position and inlining tables, a script's source, the builtins' accessors, and a process's
//! memory whose objects, maps, tables and links are wherever the input's words point. Must
//! never panic, and ends within the readers' bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    scorch::runtimes::v8::fuzz_frames(data);
});
