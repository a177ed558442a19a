//! Arbitrary bytes as the memory a V8 string is read from (`runtimes::v8::fuzz_strings`):
//! the input's first word is the string's tagged pointer, and its maps, types, lengths and
//! links are wherever in the input they point. Must never panic, and ends within the
//! reader's bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    scorch::runtimes::v8::fuzz_strings(data);
});
