//! A Rust workload whose hot functions sit in nested modules, one of them generic: scorch must
//! show `rustwork::outer::inner::spin` and `rustwork::outer::inner::spin_generic`, demangled
//! and without the `::h<hash>` suffix. Built by the tests with rustc (the crate is named after
//! this file).
//! Each round asks both functions for the same CPU time, so their shares stay even on any CPU:
//! the thread's CPU clock times each call from outside it, and the next call's count follows
//! the rate measured (as tests/workloads/pace.h does for the C workloads).
//! Usage: rustwork [seconds [microseconds]]: rounds of `microseconds` (1,000 by default) of CPU
//! time per function. Exits by itself after `seconds`.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// `struct timespec` of the C library, which every Rust program on Linux links.
#[repr(C)]
struct Timespec {
    seconds: i64,
    nanoseconds: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, time: *mut Timespec) -> i32;
}

/// Nanoseconds of CPU time this thread has run (`CLOCK_THREAD_CPUTIME_ID`, 3 on Linux).
fn thread_cpu_ns() -> i64 {
    let mut time = Timespec {
        seconds: 0,
        nanoseconds: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { clock_gettime(3, &mut time) };
    time.seconds * 1_000_000_000 + time.nanoseconds
}

/// Turns a length of CPU time into an iteration count for one function, from the rate its
/// calls have shown, carrying the time still owed (the C workloads' `struct pace`).
#[derive(Default)]
struct Pace {
    per_ns: f64,
    owed_ns: i64,
}

impl Pace {
    /// Runs `work` (given a count) for about `asked_ns` of this thread's CPU time.
    fn run(&mut self, asked_ns: i64, mut work: impl FnMut(u64) -> u64) {
        if self.per_ns <= 0.0 {
            let mut count = 10_000u64;
            loop {
                let start = thread_cpu_ns();
                black_box(work(count));
                let spent = thread_cpu_ns() - start;
                if spent >= 100_000 || count > 1 << 40 {
                    self.per_ns = count as f64 / spent.max(1) as f64;
                    break;
                }
                count *= 4;
            }
        }
        let want = (asked_ns + self.owed_ns).clamp(0, 2 * asked_ns);
        let count = ((want as f64 * self.per_ns) as u64).max(1);
        let start = thread_cpu_ns();
        black_box(work(count));
        let spent = thread_cpu_ns() - start;
        self.owed_ns = (self.owed_ns + asked_ns - spent).clamp(-4 * asked_ns, 4 * asked_ns);
        if spent > 0 {
            self.per_ns = 0.75 * self.per_ns + 0.25 * (count as f64 / spent as f64);
        }
    }
}

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
    let microseconds: u64 = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000);
    let end = Instant::now() + Duration::from_secs(seconds);
    // Each round's length is drawn at random between half and one and a half of the asked
    // length, the same for both functions, so their shares stay even: rounds of one fixed
    // length make a fixed cycle, and a cycle near a multiple of the sampling period aliases
    // with it, each profiler seeing other shares at its own phase.
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(std::process::id());
    let (mut spin, mut generic) = (Pace::default(), Pace::default());
    while Instant::now() < end {
        // xorshift64: cheap, and no crate for a workload rustc builds alone.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let asked = (microseconds * 1_000 / 2 + state % (microseconds * 1_000).max(1)) as i64;
        spin.run(asked, outer::inner::spin);
        generic.run(asked, |count| {
            outer::inner::spin_generic(u32::try_from(count).unwrap_or(u32::MAX))
        });
    }
}
