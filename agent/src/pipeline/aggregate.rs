//! Aggregate: merge drained windows into one set of distinct stacks with counts.
//!
//! Pure: no BPF, no I/O. Stack ids are per generation and reused, so windows are merged on the
//! resolved frames, never on ids.

use std::{collections::HashMap, time::SystemTime};

use scorch_common::UnwindOutcome;

use crate::pipeline::{
    drain::{Losses, RawWindow, Stack, StackMapFill},
    off_cpu::{Block, BlockState},
};

/// What tells off-CPU samples of one process apart besides their stacks: the `thread` and
/// `state` labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockTag {
    /// The thread's name.
    pub thread: String,
    pub state: BlockState,
}

/// The identity of a sampled stack: which process, which user frames, which kernel frames.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackSample {
    pub tgid: u32,
    /// Which capture of the process's maps names its user frames: the version latest when
    /// the sample was drained (see `symbolize::maps::MapsHistory`), so a library unloaded
    /// later is still named, and another loaded at its address does not take its samples.
    pub maps_version: u32,
    pub user: Stack,
    pub kernel: Stack,
    /// For off-CPU time: the thread and the state it blocked in; `None` for CPU samples.
    pub block: Option<BlockTag>,
}

/// Per-window totals, kept so a run can show that its windows add up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowTotal {
    pub start: SystemTime,
    pub end: SystemTime,
    pub samples: u64,
}

/// Windows merged so far.
#[derive(Debug, Clone, Default)]
pub struct Aggregated {
    pub stacks: HashMap<StackSample, u64>,
    /// Samples whose table walk stopped early, by (process, maps version, last pc found,
    /// reason).
    pub walk_stops: HashMap<(u32, u32, u64, UnwindOutcome), u64>,
    /// Process names as the BPF program recorded them.
    pub comms: HashMap<u32, String>,
    pub losses: Losses,
    pub windows: Vec<WindowTotal>,
    /// The fullest any window left the stack maps.
    pub stack_maps: StackMapFill,
}

impl Aggregated {
    /// Adds one window's samples; `maps_version` gives each process's current maps version.
    pub fn add(&mut self, window: RawWindow, maps_version: impl Fn(u32) -> u32) {
        self.windows.push(WindowTotal {
            start: window.start,
            end: window.end,
            samples: window.total_samples(),
        });
        for sample in window.samples {
            *self
                .stacks
                .entry(StackSample {
                    tgid: sample.tgid,
                    maps_version: maps_version(sample.tgid),
                    user: sample.user,
                    kernel: sample.kernel,
                    block: None,
                })
                .or_insert(0) += sample.count;
        }
        for stop in window.walk_stops {
            *self
                .walk_stops
                .entry((stop.tgid, maps_version(stop.tgid), stop.pc, stop.reason))
                .or_insert(0) += stop.count;
        }
        for (tgid, comm) in window.comms {
            self.comms.entry(tgid).or_insert(comm);
        }
        self.losses.add(&window.losses);
        self.stack_maps = self.stack_maps.max(window.stack_maps);
    }

    /// Adds recorded off-CPU blocks read between `start` and `end`; each counts its weight in
    /// nanoseconds. Their process names are the thread names' processes', from `comms`.
    pub fn add_blocks(
        &mut self,
        start: SystemTime,
        end: SystemTime,
        blocks: Vec<Block>,
        maps_version: impl Fn(u32) -> u32,
    ) {
        self.windows.push(WindowTotal {
            start,
            end,
            samples: blocks.len() as u64,
        });
        for block in blocks {
            *self
                .stacks
                .entry(StackSample {
                    tgid: block.tgid,
                    maps_version: maps_version(block.tgid),
                    user: block.user,
                    kernel: block.kernel,
                    block: Some(BlockTag {
                        thread: block.thread,
                        state: block.state,
                    }),
                })
                .or_insert(0) += block.weight_ns;
        }
    }

    pub fn total_samples(&self) -> u64 {
        self.stacks.values().sum()
    }

    /// Distinct processes sampled.
    pub fn processes(&self) -> usize {
        let mut pids: Vec<u32> = self.stacks.keys().map(|s| s.tgid).collect();
        pids.sort_unstable();
        pids.dedup();
        pids.len()
    }

    pub fn start(&self) -> Option<SystemTime> {
        self.windows.first().map(|w| w.start)
    }

    pub fn end(&self) -> Option<SystemTime> {
        self.windows.last().map(|w| w.end)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::pipeline::drain::RawSample;

    fn window(at: u64, samples: Vec<RawSample>) -> RawWindow {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(at);
        let mut losses = Losses::default();
        losses.by_kind[0] = 1;
        RawWindow {
            start,
            end: start + Duration::from_secs(10),
            samples,
            walk_stops: Vec::new(),
            comms: HashMap::from([(7, "work".to_owned())]),
            losses,
            stack_maps: StackMapFill::default(),
        }
    }

    fn sample(tgid: u32, user: &[u64], count: u64) -> RawSample {
        RawSample {
            tgid,
            user: Stack::Frames(user.to_vec()),
            kernel: Stack::Absent,
            count,
        }
    }

    #[test]
    fn the_fullest_window_is_the_stack_maps_fill() {
        use crate::pipeline::maps::StackEntries;
        let entries = |stacks, user_stacks| StackEntries {
            stacks,
            user_stacks,
        };
        let capacity = entries(8192, 1024);
        let mut agg = Aggregated::default();
        assert_eq!(agg.stack_maps.describe(), None);
        for used in [entries(40, 300), entries(75, 120), entries(10, 10)] {
            let mut raw = window(0, Vec::new());
            raw.stack_maps = StackMapFill { used, capacity };
            agg.add(raw, |_| 0);
        }
        assert_eq!(
            agg.stack_maps.describe().as_deref(),
            Some("stacks 75 of 8192 entries, user stacks 300 of 1024")
        );
        // Under --unwind fp no user-stack map is used, and none is mentioned.
        let fp = StackMapFill {
            used: entries(75, 0),
            capacity: entries(8192, 0),
        };
        assert_eq!(fp.describe().as_deref(), Some("stacks 75 of 8192 entries"));
    }

    #[test]
    fn blocks_add_their_weight_by_thread_and_state() {
        let block = |thread: &str, state, weight_ns| Block {
            tgid: 7,
            tid: 8,
            thread: thread.to_owned(),
            state,
            kernel: Stack::Frames(vec![0xffff_ffff_8100_0000]),
            user: Stack::Frames(vec![1, 2]),
            weight_ns,
            duration_ns: weight_ns / 2,
        };
        let mut agg = Aggregated::default();
        let at = SystemTime::UNIX_EPOCH;
        agg.add_blocks(
            at,
            at + Duration::from_secs(1),
            vec![
                block("a", BlockState::Sleeping, 100),
                block("a", BlockState::Sleeping, 50),
                block("b", BlockState::Sleeping, 7),
                block("a", BlockState::Disk, 3),
            ],
            |_| 0,
        );
        assert_eq!(agg.total_samples(), 160);
        assert_eq!(agg.stacks.len(), 3);
        let a = agg
            .stacks
            .iter()
            .find(|(k, _)| {
                k.block
                    == Some(BlockTag {
                        thread: "a".to_owned(),
                        state: BlockState::Sleeping,
                    })
            })
            .map(|(_, &v)| v);
        assert_eq!(a, Some(150));
        assert_eq!(agg.windows.len(), 1);
    }

    #[test]
    fn merges_equal_stacks_across_windows() {
        let mut agg = Aggregated::default();
        agg.add(
            window(0, vec![sample(7, &[1, 2], 3), sample(7, &[1, 3], 1)]),
            |_| 0,
        );
        agg.add(
            window(10, vec![sample(7, &[1, 2], 4), sample(8, &[1, 2], 2)]),
            |_| 0,
        );
        assert_eq!(agg.total_samples(), 10);
        assert_eq!(agg.stacks.len(), 3);
        let key = StackSample {
            tgid: 7,
            maps_version: 0,
            user: Stack::Frames(vec![1, 2]),
            kernel: Stack::Absent,
            block: None,
        };
        assert_eq!(agg.stacks[&key], 7);
        assert_eq!(agg.processes(), 2);
        assert_eq!(
            agg.windows.iter().map(|w| w.samples).collect::<Vec<_>>(),
            [4, 6]
        );
        assert_eq!(agg.losses.by_kind[0], 2);
        assert_eq!(
            agg.end().unwrap() - Duration::from_secs(20),
            agg.start().unwrap()
        );
    }
}
