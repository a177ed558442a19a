//! Aggregate: merge drained windows into one set of distinct stacks with counts.
//!
//! Pure: no BPF, no I/O. Stack ids are per generation and reused, so windows are merged on the
//! resolved frames, never on ids.

use std::{collections::HashMap, time::SystemTime};

use scorch_common::UnwindOutcome;

use crate::pipeline::{
    drain::{Losses, Origin, RawWindow, Stack, StackMapFill, ThreadTag},
    off_cpu::{Block, BlockState},
};

/// Most distinct threads (names, or names and ids with `thread-ids`) of one process an
/// aggregate keeps apart: a window's in the daemon, the whole recording's in `record`. The
/// rest are folded into [`OTHER_THREADS`], counted. Each thread is a series in the store and
/// in every sink, per window: a server that names a thread after each connection or job
/// (`conn-48213`) would otherwise add a series per connection. 32 keeps the named pools of
/// ordinary services apart (a JVM's GC, JIT and a few executors; runtimes such as Go's or
/// tokio's name all their workers alike), and the busiest threads are the ones kept.
pub const MAX_THREADS_PER_PROCESS: usize = 32;

/// The `thread` value of the threads folded beyond [`MAX_THREADS_PER_PROCESS`].
pub const OTHER_THREADS: &str = "(other threads)";

/// The identity of a sampled stack: which process and thread, which user frames, which
/// kernel frames.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackSample {
    pub tgid: u32,
    /// Which capture of the process's maps names its user frames: the version latest when
    /// the sample was drained (see `process::maps::MapsHistory`), so a library unloaded
    /// later is still named, and another loaded at its address does not take its samples.
    pub maps_version: u32,
    pub user: Stack,
    pub kernel: Stack,
    /// The thread sampled, or that blocked: the `thread` (and `thread_id`) labels.
    pub thread: ThreadTag,
    /// For off-CPU time: the state the thread blocked in (the `state` label); `None` for CPU
    /// samples.
    pub block: Option<BlockState>,
}

/// What [`Aggregated::fold_threads`] folded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadsFolded {
    /// Threads folded into [`OTHER_THREADS`], summed over processes.
    pub threads: u64,
    /// Processes that had more threads than the cap.
    pub processes: u64,
}

impl ThreadsFolded {
    pub fn add(&mut self, other: ThreadsFolded) {
        self.threads += other.threads;
        self.processes += other.processes;
    }
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
    /// Processes' cgroups and starts as the BPF program recorded them.
    pub origins: HashMap<u32, Origin>,
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
                    thread: sample.thread,
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
        for (tgid, origin) in window.origins {
            self.origins.entry(tgid).or_insert(origin);
        }
        self.losses.add(&window.losses);
        self.stack_maps = self.stack_maps.max(window.stack_maps);
    }

    /// Adds recorded off-CPU blocks read between `start` and `end`; each counts its weight in
    /// nanoseconds. Their thread ids are kept with `thread_ids`.
    pub fn add_blocks(
        &mut self,
        start: SystemTime,
        end: SystemTime,
        blocks: Vec<Block>,
        thread_ids: bool,
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
                    thread: ThreadTag {
                        name: block.thread,
                        id: thread_ids.then_some(block.tid),
                    },
                    block: Some(block.state),
                })
                .or_insert(0) += block.weight_ns;
        }
    }

    pub fn total_samples(&self) -> u64 {
        self.stacks.values().sum()
    }

    /// Keeps the `cap` busiest threads of each process apart and folds the rest into one,
    /// [`OTHER_THREADS`] without an id, so a process adds at most `cap + 1` threads to the
    /// series. Ties go to the name that sorts first, so the same input folds the same way.
    pub fn fold_threads(&mut self, cap: usize) -> ThreadsFolded {
        let mut per_process: HashMap<u32, HashMap<&ThreadTag, u64>> = HashMap::new();
        for (stack, count) in &self.stacks {
            *per_process
                .entry(stack.tgid)
                .or_default()
                .entry(&stack.thread)
                .or_insert(0) += count;
        }
        let mut folded = ThreadsFolded::default();
        let mut fold: HashMap<u32, std::collections::HashSet<ThreadTag>> = HashMap::new();
        for (tgid, threads) in per_process {
            if threads.len() <= cap {
                continue;
            }
            let mut busiest: Vec<(&ThreadTag, u64)> = threads.into_iter().collect();
            busiest.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
            let beyond: std::collections::HashSet<ThreadTag> = busiest[cap..]
                .iter()
                .map(|(tag, _)| (*tag).clone())
                .collect();
            folded.threads += beyond.len() as u64;
            folded.processes += 1;
            fold.insert(tgid, beyond);
        }
        if fold.is_empty() {
            return folded;
        }
        let other = ThreadTag {
            name: OTHER_THREADS.to_owned(),
            id: None,
        };
        let stacks = std::mem::take(&mut self.stacks);
        for (mut stack, count) in stacks {
            if fold
                .get(&stack.tgid)
                .is_some_and(|beyond| beyond.contains(&stack.thread))
            {
                stack.thread = other.clone();
            }
            *self.stacks.entry(stack).or_insert(0) += count;
        }
        folded
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
    use crate::pipeline::frames::{from_pcs, Frame};

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
            origins: HashMap::new(),
            losses,
            stack_maps: StackMapFill::default(),
        }
    }

    fn sample(tgid: u32, user: &[u64], count: u64) -> RawSample {
        RawSample {
            tgid,
            thread: ThreadTag::default(),
            user: Stack::Frames(from_pcs(user, false)),
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
            kernel: Stack::Frames(vec![Frame::Kernel(0xffff_ffff_8100_0000)]),
            user: Stack::Frames(vec![Frame::Native(1), Frame::Native(2)]),
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
            false,
            |_| 0,
        );
        assert_eq!(agg.total_samples(), 160);
        assert_eq!(agg.stacks.len(), 3);
        let a = agg
            .stacks
            .iter()
            .find(|(k, _)| k.thread.name == "a" && k.block == Some(BlockState::Sleeping))
            .map(|(_, &v)| v);
        assert_eq!(a, Some(150));
        assert_eq!(agg.windows.len(), 1);
        // Without `thread-ids` no block keeps its id.
        assert!(agg.stacks.keys().all(|k| k.thread.id.is_none()));
        agg.add_blocks(at, at, vec![block("a", BlockState::Disk, 1)], true, |_| 0);
        assert!(agg.stacks.keys().any(|k| k.thread.id == Some(8)));
    }

    fn threaded(tgid: u32, thread: &str, user: &[u64], count: u64) -> RawSample {
        RawSample {
            thread: ThreadTag {
                name: thread.to_owned(),
                id: None,
            },
            ..sample(tgid, user, count)
        }
    }

    /// Threads per process beyond the cap become one, the busiest kept; other processes and
    /// the total are untouched.
    #[test]
    fn threads_beyond_the_cap_are_folded_into_one() {
        let mut agg = Aggregated::default();
        let mut samples = vec![threaded(8, "solo", &[1], 5)];
        for (i, name) in ["w1", "w2", "w3", "w4", "w5"].iter().enumerate() {
            // w1 busiest (50), w5 least (10); two stacks each.
            let count = 50 - 10 * i as u64;
            samples.push(threaded(7, name, &[1, 2], count - 1));
            samples.push(threaded(7, name, &[1, 3], 1));
        }
        agg.add(window(0, samples), |_| 0);
        let before = agg.total_samples();
        let folded = agg.fold_threads(3);
        assert_eq!(
            folded,
            ThreadsFolded {
                threads: 2,
                processes: 1
            }
        );
        assert_eq!(agg.total_samples(), before);
        let per_thread = |tgid: u32, name: &str| -> u64 {
            agg.stacks
                .iter()
                .filter(|(k, _)| k.tgid == tgid && k.thread.name == name)
                .map(|(_, &v)| v)
                .sum()
        };
        assert_eq!(per_thread(7, "w1"), 50);
        assert_eq!(per_thread(7, "w3"), 30);
        assert_eq!(per_thread(7, "w4"), 0);
        assert_eq!(per_thread(7, OTHER_THREADS), 20 + 10);
        // The folded threads' equal stacks merged: two keys, not four.
        assert_eq!(
            agg.stacks
                .keys()
                .filter(|k| k.thread.name == OTHER_THREADS)
                .count(),
            2
        );
        assert_eq!(per_thread(8, "solo"), 5);
        // At or under the cap nothing changes.
        assert_eq!(agg.fold_threads(4), ThreadsFolded::default());
    }

    /// With ids, two threads of one name are two threads for the cap.
    #[test]
    fn thread_ids_count_against_the_cap() {
        let mut agg = Aggregated::default();
        let with_id = |id, count| RawSample {
            thread: ThreadTag {
                name: "pool".to_owned(),
                id: Some(id),
            },
            ..sample(7, &[1], count)
        };
        agg.add(window(0, vec![with_id(10, 3), with_id(11, 2)]), |_| 0);
        assert_eq!(agg.fold_threads(1).threads, 1);
        let other = agg
            .stacks
            .iter()
            .find(|(k, _)| k.thread.name == OTHER_THREADS)
            .map(|(k, &v)| (k.thread.id, v));
        assert_eq!(other, Some((None, 2)));
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
            user: Stack::Frames(vec![Frame::Native(1), Frame::Native(2)]),
            kernel: Stack::Absent,
            thread: ThreadTag::default(),
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
