//! A Rust workload whose hot functions sit in nested modules, one of them generic: scorch must
//! show `rustwork::outer::inner::spin` and `rustwork::outer::inner::spin_generic`, demangled
//! and without the `::h<hash>` suffix. Built by the tests with rustc (the crate is named after
//! this file).
//! Usage: rustwork [seconds]. Exits by itself after `seconds`.

use std::hint::black_box;
use std::time::{Duration, Instant};

pub mod outer {
    pub mod inner {
        use std::hint::black_box;

        #[inline(never)]
        pub fn spin(n: u64) -> u64 {
            let mut x = 1u64;
            for i in 0..black_box(n) {
                x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
            }
            x
        }

        #[inline(never)]
        pub fn spin_generic<T: Into<u64> + Copy>(n: T) -> u64 {
            let mut x = 3u64;
            for i in 0..black_box(n.into()) {
                x = black_box(x.wrapping_mul(2862933555777941757).wrapping_add(i));
            }
            x
        }
    }
}

fn main() {
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let n: u32 = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let end = Instant::now() + Duration::from_secs(seconds);
    // Each round's length is drawn at random between n/2 and 3n/2, the same for both
    // functions, so their shares stay even: rounds of one fixed length make a fixed cycle,
    // and a cycle near a multiple of the sampling period aliases with it (a CI run at 999 Hz
    // gave scorch 0.525 of `spin` and perf, sampling the same process at its own phase,
    // 0.470). Each round is about a millisecond at the default n, so the clock check costs
    // nothing measurable.
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(std::process::id());
    let n = n.max(2);
    while Instant::now() < end {
        // xorshift64: cheap, and no crate for a workload rustc builds alone.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let round = n / 2 + (state % u64::from(n)) as u32;
        black_box(outer::inner::spin(u64::from(round)));
        black_box(outer::inner::spin_generic(round));
    }
}
