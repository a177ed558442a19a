//! Off-CPU time: what the `sched_switch` program (`agent-ebpf/src/off_cpu.rs`) recorded,
//! read from its ring buffer into [`Block`]s: one blocked stretch of a thread, its stacks at
//! switch-out, its state and its weight (the blocked time divided by the probability it was
//! recorded with, so the totals are unbiased).
//!
//! The pure parts (the state's decoding, the scaling) are functions of their own, tested
//! without BPF.

use std::time::Duration;

use aya::maps::{MapData, MapError, PerCpuArray, RingBuf};
use scorch_common::{
    OffCpuCount, OffCpuEvent, MAX_USER_STACK_DEPTH, OFF_CPU_COUNTS, OFF_CPU_KERNEL_DEPTH,
    OFF_CPU_PREEMPTED,
};

use super::{
    drain::{comm_name, Stack},
    frames::{decode_user, from_pcs, Frame},
};

#[derive(Debug, thiserror::Error)]
pub enum OffCpuError {
    #[error("reading BPF map OFF_CPU_COUNTS_MAP: {0}")]
    Counts(MapError),
}

/// How off-CPU time is sampled (`--off-cpu-*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffCpuSettings {
    /// The sampling parameter N: a block of d is recorded with probability 1 - exp(-d / N),
    /// and weighs d / p. About one event per N of blocked time, however it is split.
    pub mean: Duration,
    /// Blocks shorter than this are not recorded at all (their time is missing from the
    /// totals: a filter, not a sampling).
    pub min: Duration,
    /// Most events the kernel side sends per second, over all CPUs; blocks over it are
    /// counted and their time reported, not sent.
    pub max_events_per_second: u32,
}

impl Default for OffCpuSettings {
    fn default() -> Self {
        OffCpuSettings {
            mean: Duration::from_millis(10),
            min: Duration::ZERO,
            max_events_per_second: 10_000,
        }
    }
}

impl OffCpuSettings {
    /// The control the BPF side reads, with the cap split over `cpus` CPUs (each CPU counts
    /// its own, so no CPU waits on another's counter).
    pub fn control(&self, cpus: usize, agent_tgid: u32) -> scorch_common::OffCpuControl {
        let cpus = u32::try_from(cpus.max(1)).unwrap_or(u32::MAX);
        scorch_common::OffCpuControl {
            mean_ns: (self.mean.as_nanos() as u64).clamp(1, scorch_common::MAX_OFF_CPU_MEAN_NS),
            min_ns: self.min.as_nanos().min(u128::from(u64::MAX)) as u64,
            events_per_cpu_second: self.max_events_per_second.div_ceil(cpus).max(1),
            agent_tgid,
        }
    }
}

/// The state a thread switched out in: the `state` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockState {
    /// Waiting for an event, interruptibly (`TASK_INTERRUPTIBLE`, and `TASK_IDLE`: kernel
    /// workers waiting for work, uninterruptible only so as not to be woken by signals).
    Sleeping,
    /// Waiting uninterruptibly (`TASK_UNINTERRUPTIBLE`): disk and other I/O, some locks.
    Disk,
    /// Still runnable: the scheduler took the CPU away.
    Preempted,
}

/// `TASK_UNINTERRUPTIBLE`.
const TASK_UNINTERRUPTIBLE: u32 = 0x2;
/// `TASK_NOLOAD`: with `TASK_UNINTERRUPTIBLE`, `TASK_IDLE`, which does not count as load.
const TASK_NOLOAD: u32 = 0x400;

impl BlockState {
    /// The state from the program's word: the task's `__state` as `sched_switch` passed it,
    /// with `OFF_CPU_PREEMPTED` set when the switch was a preemption (a preempted task's
    /// `__state` may still say it was about to sleep).
    pub fn decode(raw: u32) -> BlockState {
        let state = raw & !OFF_CPU_PREEMPTED;
        if raw & OFF_CPU_PREEMPTED != 0 || state == 0 {
            BlockState::Preempted
        } else if state & TASK_UNINTERRUPTIBLE != 0 && state & TASK_NOLOAD == 0 {
            BlockState::Disk
        } else {
            BlockState::Sleeping
        }
    }

    /// The `state` label's value.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockState::Sleeping => "sleeping",
            BlockState::Disk => "disk",
            BlockState::Preempted => "preempted",
        }
    }
}

/// The weight of a recorded block: its duration divided by the probability it was recorded
/// with (units of 2^-32), so that the expected sum over all blocks, recorded or not, is their
/// blocked time.
pub fn scaled_ns(duration_ns: u64, probability: u64) -> u64 {
    if probability == 0 {
        return 0;
    }
    let scaled = (u128::from(duration_ns) << 32) / u128::from(probability);
    u64::try_from(scaled).unwrap_or(u64::MAX)
}

/// One recorded block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub tgid: u32,
    pub tid: u32,
    /// The thread's name.
    pub thread: String,
    pub state: BlockState,
    /// Where it blocked in the kernel, leaf first.
    pub kernel: Stack,
    /// Its user stack (native and Python frames, decoded from the words the walk wrote).
    pub user: Stack,
    /// Nanoseconds this block stands for ([`scaled_ns`]).
    pub weight_ns: u64,
    /// The blocked time itself.
    pub duration_ns: u64,
}

/// The block an event describes.
pub fn decode_event(event: &OffCpuEvent) -> Block {
    let kernel_len = (event.kernel_len as usize).min(OFF_CPU_KERNEL_DEPTH);
    let user_len = (event.user.len as usize).min(MAX_USER_STACK_DEPTH);
    let frames = |frames: Vec<Frame>| {
        if frames.is_empty() {
            Stack::Absent
        } else {
            Stack::Frames(frames)
        }
    };
    let (user, kernel) = Stack::at_least_one(
        frames(decode_user(&event.user.pcs[..user_len])),
        frames(from_pcs(&event.kernel[..kernel_len], true)),
    );
    Block {
        tgid: event.tgid,
        tid: event.tid,
        thread: comm_name(&event.comm),
        state: BlockState::decode(event.state),
        kernel,
        user,
        weight_ns: scaled_ns(event.duration_ns, event.probability),
        duration_ns: event.duration_ns,
    }
}

/// What became of the blocks the program saw, over some interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OffCpuCounts {
    pub by_kind: [u64; OFF_CPU_COUNTS as usize],
}

impl OffCpuCounts {
    pub fn get(&self, kind: OffCpuCount) -> u64 {
        self.by_kind[kind as usize]
    }

    /// What became of blocks, each by the name `scorch_off_cpu_blocks_total` gives it in
    /// its `outcome` label.
    pub const OUTCOMES: [(OffCpuCount, &'static str); 6] = [
        (OffCpuCount::Recorded, "recorded"),
        (OffCpuCount::OverCap, "over_cap"),
        (OffCpuCount::RingFull, "ring_full"),
        (OffCpuCount::ThreadsFull, "threads_full"),
        (OffCpuCount::UserStackEvicted, "user_stack_evicted"),
        (OffCpuCount::BelowMinimum, "below_minimum"),
    ];

    /// For the summary: what was not recorded, and why.
    pub fn describe(&self) -> String {
        format!(
            "{} blocks recorded, {} over the cap ({:.3}s blocked), {} lost to a full ring \
             buffer, {} switch-outs with no room in the thread map, {} user stacks gone, {} \
             below the minimum; {} user stack walks",
            self.get(OffCpuCount::Recorded),
            self.get(OffCpuCount::OverCap),
            self.get(OffCpuCount::OverCapNs) as f64 / 1e9,
            self.get(OffCpuCount::RingFull),
            self.get(OffCpuCount::ThreadsFull),
            self.get(OffCpuCount::UserStackEvicted),
            self.get(OffCpuCount::BelowMinimum),
            self.get(OffCpuCount::Walks),
        )
    }
}

/// The off-CPU program's maps, taken out of the loaded object.
pub struct OffCpuMaps {
    pub events: RingBuf<MapData>,
    pub counts: PerCpuArray<MapData, u64>,
}

/// Reads recorded blocks and counters.
pub struct OffCpuReader {
    maps: OffCpuMaps,
}

impl OffCpuReader {
    pub fn new(maps: OffCpuMaps) -> OffCpuReader {
        OffCpuReader { maps }
    }

    /// Every block sent since the last call.
    pub fn read(&mut self) -> Vec<Block> {
        let mut blocks = Vec::new();
        while let Some(item) = self.maps.events.next() {
            if item.len() < std::mem::size_of::<OffCpuEvent>() {
                continue;
            }
            // SAFETY: the record is at least an `OffCpuEvent`'s size, and every bit pattern
            // is a valid `OffCpuEvent` (plain integers); the read is unaligned.
            let event: OffCpuEvent =
                unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<OffCpuEvent>()) };
            blocks.push(decode_event(&event));
        }
        blocks
    }

    /// The counters since the program was loaded, summed over CPUs.
    pub fn counts(&self) -> Result<OffCpuCounts, OffCpuError> {
        let mut counts = OffCpuCounts::default();
        for (i, total) in counts.by_kind.iter_mut().enumerate() {
            let values = self
                .maps
                .counts
                .get(&(i as u32), 0)
                .map_err(OffCpuError::Counts)?;
            *total = values.iter().sum();
        }
        Ok(counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use scorch_common::off_cpu_probability;

    const ONE: f64 = (1u64 << 32) as f64;

    #[test]
    fn the_probability_follows_one_minus_exp() {
        let mean = 10_000_000;
        for d in [
            1_000u64,
            100_000,
            1_000_000,
            5_000_000,
            10_000_000,
            30_000_000,
            100_000_000,
        ] {
            let got = off_cpu_probability(d, mean) as f64 / ONE;
            let want = 1.0 - (-(d as f64) / mean as f64).exp();
            assert!(
                (got - want).abs() <= want * 0.002 + 1e-9,
                "d={d}: {got} against {want}"
            );
        }
        assert_eq!(off_cpu_probability(320_000_000, mean), 1 << 32);
        assert_eq!(off_cpu_probability(u64::MAX / 2, mean), 1 << 32);
        assert_eq!(off_cpu_probability(5, 0), 1 << 32);
        assert!(off_cpu_probability(d_below(mean), mean) < 1 << 20);
    }

    fn d_below(mean: u64) -> u64 {
        mean / 10_000
    }

    #[test]
    fn the_probability_grows_with_the_duration() {
        let mean = 1_000_000;
        let mut last = 0;
        for d in (0..40_000_000).step_by(7_919) {
            let p = off_cpu_probability(d, mean);
            assert!(p >= last, "d={d}: {p} < {last}");
            last = p;
        }
    }

    #[test]
    fn scaled_values_are_unbiased() {
        // The expectation of the recorded weight, p * d / p, is d for every duration.
        let mean = 1_000_000;
        for d in [10_000u64, 500_000, 2_000_000, 90_000_000] {
            let p = off_cpu_probability(d, mean);
            let expected = p as f64 / ONE * scaled_ns(d, p) as f64;
            assert!((expected - d as f64).abs() <= 1.0, "{d}: {expected}");
        }
        assert_eq!(scaled_ns(7, 0), 0);
        assert_eq!(scaled_ns(1_000, 1 << 32), 1_000);
        assert_eq!(scaled_ns(1_000, 1 << 31), 2_000);
    }

    #[test]
    fn states_decode_as_the_scheduler_left_them() {
        assert_eq!(BlockState::decode(0x1), BlockState::Sleeping);
        assert_eq!(BlockState::decode(0x2), BlockState::Disk);
        // TASK_IDLE: a worker waiting for work, not I/O.
        assert_eq!(BlockState::decode(0x402), BlockState::Sleeping);
        assert_eq!(BlockState::decode(0x0), BlockState::Preempted);
        assert_eq!(
            BlockState::decode(0x1 | OFF_CPU_PREEMPTED),
            BlockState::Preempted
        );
        // TASK_KILLABLE (uninterruptible, woken by fatal signals): I/O waits.
        assert_eq!(BlockState::decode(0x102), BlockState::Disk);
        assert_eq!(BlockState::Disk.as_str(), "disk");
    }

    #[test]
    fn the_cap_is_split_over_cpus_and_the_mean_clamped() {
        let settings = OffCpuSettings {
            mean: Duration::from_secs(100_000),
            min: Duration::from_micros(5),
            max_events_per_second: 1_001,
        };
        let control = settings.control(2, 42);
        assert_eq!(control.events_per_cpu_second, 501);
        assert_eq!(control.mean_ns, scorch_common::MAX_OFF_CPU_MEAN_NS);
        assert_eq!(control.min_ns, 5_000);
        assert_eq!(control.agent_tgid, 42);
        assert_eq!(settings.control(0, 1).events_per_cpu_second, 1_001);
    }

    #[test]
    fn events_decode_into_blocks() {
        let mut event = OffCpuEvent {
            tgid: 10,
            tid: 11,
            state: 1,
            kernel_len: 2,
            duration_ns: 4_000,
            probability: 1 << 31,
            comm: *b"worker-1\0\0\0\0\0\0\0\0",
            kernel: [0; OFF_CPU_KERNEL_DEPTH],
            user: scorch_common::UserStack {
                hash: 0,
                len: 0,
                outcome: 0,
                tgid: 0,
                flags: 0,
                pcs: [0; MAX_USER_STACK_DEPTH],
            },
        };
        event.kernel[0] = 0xffff_ffff_8100_0000;
        event.kernel[1] = 0xffff_ffff_8100_0100;
        let block = decode_event(&event);
        assert_eq!(block.thread, "worker-1");
        assert_eq!(block.state, BlockState::Sleeping);
        assert_eq!(block.weight_ns, 8_000);
        assert_eq!(block.user, Stack::Absent);
        assert_eq!(
            block.kernel,
            Stack::Frames(vec![
                Frame::Kernel(0xffff_ffff_8100_0000),
                Frame::Kernel(0xffff_ffff_8100_0100)
            ])
        );
        // A length past the arrays is cut to them.
        event.kernel_len = 1_000;
        assert_eq!(
            decode_event(&event).kernel,
            Stack::Frames(from_pcs(&event.kernel, true))
        );
        // A block the kernel gave no stack for, of a thread with no user stack: lost, not a
        // block of nothing.
        event.kernel_len = 0;
        let block = decode_event(&event);
        assert_eq!((block.user, block.kernel), (Stack::Lost, Stack::Absent));
    }
}
