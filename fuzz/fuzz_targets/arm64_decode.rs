//! Arbitrary bytes as AArch64 code read by the runtime readers' four decoders
//! (`first_argument`, `returned_thread_local`, `jumps_out`, `pthread_specific`). Must never
//! panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    scorch::arch::aarch64::decode::fuzz_one(data);
});
