//! How large each generation's stack-trace map is: sized by the distinct stacks the windows
//! store, not by the samples they could hold.
//!
//! Pure: the drain hands over each window's fill and collisions, and creates the map this
//! returns (see `sys::inner_maps`).
//!
//! `bpf_get_stackid` hashes a stack to one bucket and keeps no chain: a stack whose bucket
//! holds another is lost, counted as a collision. With `d` distinct stacks in `m` buckets
//! about `d / 2m` of them are lost, so a map is grown to 64 buckets a stack (under 1% lost)
//! and at once on a collision. It was sized from the samples a window can hold, eight times
//! over: 8,192 entries (8 MiB a map) on a quiet 2-CPU host whose windows stored 9 to 60
//! distinct kernel stacks, and 262,144 (256 MiB a map) for the same host at 999 Hz.

/// Each entry: a 127-frame value and the kernel's bucket header, about 1 KiB.
pub const STACK_ENTRY_BYTES: u64 = 127 * 8 + 24;

/// The smallest map: 1,024 entries (about 1 MiB), room for 16 distinct stacks a window.
pub const MIN_STACK_ENTRIES: u32 = 1024;

/// The default ceiling (`--stack-map-entries`): 65,536 entries, about 66 MiB a map.
pub const DEFAULT_MAX_STACK_ENTRIES: u32 = 65_536;

/// Buckets wanted per distinct stack.
const BUCKETS_PER_STACK: u64 = 64;

/// Windows in a row that need a quarter of a map or less before it shrinks: five minutes of
/// 10 s windows, so a burst that comes back now and then keeps its room.
const SHRINK_AFTER_WINDOWS: u32 = 30;

/// The two generations' sizes and how long each has had more room than it needed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackSizing {
    ceiling: u32,
    entries: [u32; 2],
    roomy_windows: [u32; 2],
}

impl StackSizing {
    /// The first size, before any window: a quarter of the samples one window can take (a
    /// one-shot recording has no time to grow), within [`MIN_STACK_ENTRIES`] and `ceiling`.
    pub fn new(samples_per_window: u64, ceiling: u32) -> StackSizing {
        let ceiling = ceiling.max(1);
        let first = power_of_two(samples_per_window / 4)
            .max(MIN_STACK_ENTRIES)
            .min(ceiling);
        StackSizing {
            ceiling,
            entries: [first; 2],
            roomy_windows: [0; 2],
        }
    }

    /// The entries generation `generation`'s map has now.
    pub fn entries(&self, generation: usize) -> u32 {
        self.entries[generation & 1]
    }

    /// Generation `generation`'s map stays at `entries`: the kernel would not create the size
    /// [`StackSizing::after_window`] asked for.
    pub fn keep(&mut self, generation: usize, entries: u32) {
        self.entries[generation & 1] = entries;
    }

    /// After a window of `generation` stored `used` distinct stacks and lost `collisions`:
    /// the size its map should have for its next window. Grows at once, to the ceiling at
    /// most; shrinks only after [`SHRINK_AFTER_WINDOWS`] windows in a row that needed a
    /// quarter of it or less.
    pub fn after_window(&mut self, generation: usize, used: u32, collisions: u64) -> u32 {
        let g = generation & 1;
        let current = self.entries[g];
        let mut wanted = power_of_two(u64::from(used) * BUCKETS_PER_STACK)
            .max(MIN_STACK_ENTRIES)
            .min(self.ceiling);
        if collisions > 0 {
            wanted = wanted.max(current.saturating_mul(2)).min(self.ceiling);
        }
        if wanted > current {
            self.entries[g] = wanted;
            self.roomy_windows[g] = 0;
        } else if wanted <= current / 4 {
            self.roomy_windows[g] += 1;
            if self.roomy_windows[g] >= SHRINK_AFTER_WINDOWS {
                self.entries[g] = wanted;
                self.roomy_windows[g] = 0;
            }
        } else {
            self.roomy_windows[g] = 0;
        }
        self.entries[g]
    }
}

/// `n` up to a power of two, within `u32`.
fn power_of_two(n: u64) -> u32 {
    u32::try_from(n.max(1).next_power_of_two()).unwrap_or(1 << 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_from_a_quarter_of_a_windows_samples() {
        // 2 CPUs at 19 Hz: 380 samples a window; the floor.
        assert_eq!(StackSizing::new(380, 65_536).entries(0), 1024);
        // At 999 Hz: 19,980 samples, 8,192 entries (it was 262,144).
        assert_eq!(StackSizing::new(19_980, 65_536).entries(1), 8192);
        // 256 CPUs at 999 Hz: the ceiling.
        assert_eq!(StackSizing::new(2_557_440, 65_536).entries(0), 65_536);
        // A ceiling below the floor is the ceiling.
        assert_eq!(StackSizing::new(380, 256).entries(0), 256);
    }

    #[test]
    fn grows_to_64_buckets_a_stack_and_doubles_on_a_collision() {
        let mut sizing = StackSizing::new(380, 65_536);
        // 10 stacks fit; 60 want 4,096.
        assert_eq!(sizing.after_window(0, 10, 0), 1024);
        assert_eq!(sizing.after_window(0, 60, 0), 4096);
        // The other generation is sized on its own windows.
        assert_eq!(sizing.entries(1), 1024);
        // A collision doubles even a map that seemed large enough.
        assert_eq!(sizing.after_window(0, 20, 1), 8192);
        // Never past the ceiling.
        assert_eq!(sizing.after_window(0, 100_000, 5), 65_536);
        assert_eq!(sizing.after_window(0, 100_000, 5), 65_536);
    }

    #[test]
    fn shrinks_only_after_five_minutes_of_room() {
        let mut sizing = StackSizing::new(380, 65_536);
        assert_eq!(sizing.after_window(1, 200, 0), 16_384);
        for _ in 1..SHRINK_AFTER_WINDOWS {
            assert_eq!(sizing.after_window(1, 5, 0), 16_384);
        }
        // A window that needs more than a quarter starts the count again.
        assert_eq!(sizing.after_window(1, 100, 0), 16_384);
        for _ in 1..SHRINK_AFTER_WINDOWS {
            assert_eq!(sizing.after_window(1, 5, 0), 16_384);
        }
        assert_eq!(sizing.after_window(1, 5, 0), 1024);
    }
}
