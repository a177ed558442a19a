//! How large each generation's stack maps are: sized by the distinct stacks the windows
//! store, not by the samples they could hold.
//!
//! Pure: the drain hands over each window's fill and losses, and creates the maps this
//! returns (see `sys::inner_maps`).
//!
//! - The stack-trace map: `bpf_get_stackid` hashes a stack to one bucket and keeps no chain,
//!   so a stack whose bucket holds another is lost, counted as a collision. With `d` distinct
//!   stacks in `m` buckets about `d / 2m` of them are lost: the map is grown to 64 buckets a
//!   stack (under 1% lost), and at once on a collision. It was sized from the samples a window
//!   can hold, eight times over, which on a quiet host is a hundred times the few dozen
//!   distinct kernel stacks its windows store, and grows with the rate. Stack-trace maps are always preallocated, so their size is their kernel memory.
//! - A user-stack map (one per size class: 256-frame stacks of 2 KiB, and stacks of up to 48
//!   frames of 400 bytes, each sized on its own), a hash map, holds a window's
//!   samples: a Python stack carries each frame's instruction offset, so nearly every sample
//!   is a stack of its own, and a map sized by the distinct stacks of quiet windows lost a
//!   third of a 199 Hz recording's Python samples in its first window. It is not
//!   preallocated, so its kernel memory is the stacks it holds (and 16 bytes a bucket): it
//!   starts at a window's samples and never goes below them, and doubles when a stack found
//!   it full (a window can run long). Preallocated, it held its ceiling's worth of 2 KiB
//!   stacks however few distinct stacks a window had.

/// The smallest map: 1,024 entries.
pub const MIN_STACK_ENTRIES: u32 = 1024;

/// The default ceiling (`--stack-map-entries`): 65,536 entries, about 66 MiB for a
/// stack-trace map and 130 MiB for a user-stack map.
pub const DEFAULT_MAX_STACK_ENTRIES: u32 = 65_536;

/// Stack-trace map buckets wanted per distinct stack.
const BUCKETS_PER_STACK: u64 = 64;

/// User-stack map entries wanted per distinct stack.
const ENTRIES_PER_USER_STACK: u64 = 2;

/// Windows in a row that need a quarter of a map or less before it shrinks: five minutes of
/// 10 s windows, so a burst that comes back now and then keeps its room.
const SHRINK_AFTER_WINDOWS: u32 = 30;

/// The two generations' sizes and how long each has had more room than it needed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackSizing {
    ceiling: u32,
    per_stack: u64,
    /// The least a map is shrunk to.
    floor: u32,
    entries: [u32; 2],
    roomy_windows: [u32; 2],
}

impl StackSizing {
    /// A stack-trace map's: at first a quarter of the samples one window can take (a one-shot
    /// recording has no time to grow), within [`MIN_STACK_ENTRIES`] and `ceiling`.
    pub fn stack_trace(samples_per_window: u64, ceiling: u32) -> StackSizing {
        let mut sizing = StackSizing::new(samples_per_window / 4, ceiling, BUCKETS_PER_STACK);
        sizing.floor = MIN_STACK_ENTRIES.min(sizing.ceiling);
        sizing
    }

    /// A user-stack map's: the samples one window can take, and never less.
    pub fn user_stacks(samples_per_window: u64, ceiling: u32) -> StackSizing {
        StackSizing::new(samples_per_window, ceiling, ENTRIES_PER_USER_STACK)
    }

    fn new(first: u64, ceiling: u32, per_stack: u64) -> StackSizing {
        let ceiling = ceiling.max(1);
        let first = power_of_two(first).max(MIN_STACK_ENTRIES).min(ceiling);
        StackSizing {
            ceiling,
            per_stack,
            floor: first,
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

    /// After a window of `generation` stored `used` distinct stacks and lost `lost` for want
    /// of room (collisions, or a full map):
    /// the size its map should have for its next window. Grows at once, to the ceiling at
    /// most; shrinks only after [`SHRINK_AFTER_WINDOWS`] windows in a row that needed a
    /// quarter of it or less.
    pub fn after_window(&mut self, generation: usize, used: u32, lost: u64) -> u32 {
        let g = generation & 1;
        let current = self.entries[g];
        let mut wanted = power_of_two(u64::from(used) * self.per_stack)
            .max(self.floor)
            .min(self.ceiling);
        if lost > 0 {
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
        assert_eq!(StackSizing::stack_trace(380, 65_536).entries(0), 1024);
        // At 999 Hz: 19,980 samples, 8,192 entries (it was 262,144).
        assert_eq!(StackSizing::stack_trace(19_980, 65_536).entries(1), 8192);
        // 256 CPUs at 999 Hz: the ceiling.
        assert_eq!(
            StackSizing::stack_trace(2_557_440, 65_536).entries(0),
            65_536
        );
        // A ceiling below the floor is the ceiling.
        assert_eq!(StackSizing::stack_trace(380, 256).entries(0), 256);
    }

    #[test]
    fn grows_to_64_buckets_a_stack_and_doubles_on_a_collision() {
        let mut sizing = StackSizing::stack_trace(380, 65_536);
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
    fn user_stacks_hold_a_windows_samples_and_double_when_full() {
        // 999 Hz on 2 CPUs: 19,980 samples, each possibly a stack of its own.
        let mut sizing = StackSizing::user_stacks(19_980, 65_536);
        assert_eq!(sizing.entries(0), 32_768);
        // 551 distinct stacks a window never shrink it below the samples, however long.
        for _ in 0..SHRINK_AFTER_WINDOWS * 2 {
            assert_eq!(sizing.after_window(0, 551, 0), 32_768);
        }
        // 2 CPUs at 19 Hz: the floor of 1,024.
        let mut sizing = StackSizing::user_stacks(380, 65_536);
        assert_eq!(sizing.entries(1), 1024);
        assert_eq!(sizing.after_window(1, 900, 0), 2048);
        // A stack that found the map full doubles it.
        assert_eq!(sizing.after_window(1, 1000, 3), 4096);
        // Within the ceiling (1 without tables).
        assert_eq!(StackSizing::user_stacks(19_980, 1).entries(0), 1);
    }

    #[test]
    fn shrinks_only_after_five_minutes_of_room() {
        let mut sizing = StackSizing::stack_trace(380, 65_536);
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
