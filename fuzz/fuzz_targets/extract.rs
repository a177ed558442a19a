//! Arbitrary bytes as an ELF file reduced to its debug-only copy (the Parca debug-info
//! upload), into a bounded sink. Must never panic, nor pad or copy without bound.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    scorch::symbolize::elf::extract::fuzz_one(data);
});
