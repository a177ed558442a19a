//! Arbitrary bytes as an ELF image: the one parse every reader of a file shares
//! (`binary::elf`), its segments, a mapping's load bias, build ids and debug link. Must never
//! panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    scorch::binary::elf::fuzz_one(data);
});
