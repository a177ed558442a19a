//! Arbitrary bytes as a HotSpot JVM's memory: its eleven `gHotSpotVM*` table globals are the
//! input's first words, and the tables, names, version string and code heaps they lead to are
//! wherever in the input they point (`runtimes::hotspot`). Reads the tables, the layout and
//! the code cache; must never panic, and ends within the readers' bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    scorch::runtimes::hotspot::fuzz_one(data);
});
