//! Arbitrary bytes as an ELF file: parse, load DWARF, resolve addresses. Must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    scorch::symbolize::elf::fuzz_one(data);
});
