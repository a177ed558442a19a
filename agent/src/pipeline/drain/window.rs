//! What the drain hands the next stage: a window's samples with their stacks resolved to
//! frames ([`RawWindow`]), what the window lost ([`Losses`]), and how full it left its stack
//! maps ([`StackMapFill`]). Data only: the drain's protocol fills it, the aggregation merges it.

use std::{collections::HashMap, time::SystemTime};

use scorch_common::{Loss, UnwindOutcome, LOSS_KINDS, UNWIND_OUTCOMES};

use crate::pipeline::{frames::Frame, maps::StackEntries};

/// A stack as recorded for one sample.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stack {
    /// Frames, leaf first, decoded once from the words the kernel or the BPF walk wrote.
    Frames(Vec<Frame>),
    /// The sample has no stack of this kind (kernel thread: no user stack; user mode: no
    /// kernel stack).
    Absent,
    /// The stack could not be recorded: the reason was counted in the losses, or the sample
    /// came with no stack at all ([`Stack::at_least_one`]).
    Lost,
}

impl Stack {
    /// A sample's user and kernel stacks, with the user one lost when neither holds a frame.
    /// Every sample is somewhere: one with no frame would reach a profile as a sample of
    /// nothing, which OTLP writes as its empty stack and pprof as a sample without
    /// locations, and a flame graph cannot draw. The cases are an on-CPU sample in user mode
    /// whose walk gave no frame, and an off-CPU block the kernel gave no stack for.
    pub fn at_least_one(user: Stack, kernel: Stack) -> (Stack, Stack) {
        let empty = |s: &Stack| match s {
            Stack::Frames(frames) => frames.is_empty(),
            Stack::Absent => true,
            Stack::Lost => false,
        };
        if empty(&user) && empty(&kernel) {
            (Stack::Lost, Stack::Absent)
        } else {
            (user, kernel)
        }
    }
}

/// Which thread of its process a sample or a block is: its name, and its id when thread ids
/// are recorded (`thread-ids`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ThreadTag {
    /// The thread's name (its `comm`, which `pthread_setname_np` sets).
    pub name: String,
    /// Its id (the kernel's pid of the task), with `thread-ids` on.
    pub id: Option<u32>,
}

/// One (process, thread, user stack, kernel stack) and how often it was sampled in a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawSample {
    /// The sampled process (the kernel's tgid): what its stacks are symbolized against.
    pub tgid: u32,
    /// The sampled thread: profiles tell threads apart by it.
    pub thread: ThreadTag,
    /// Its user stack.
    pub user: Stack,
    /// Its kernel stack.
    pub kernel: Stack,
    /// Samples of this (process, thread, user stack, kernel stack) in the window.
    pub count: u64,
}

/// Samples whose user-stack walk stopped before the bottom of the stack: at `pc` (the last
/// frame found, in process `tgid`), for `reason` ([`UnwindOutcome::NoRow`],
/// [`UnwindOutcome::UnsupportedCfa`] or [`UnwindOutcome::ReadFault`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalkStop {
    /// The process the walk was in: `pc` is an address in it.
    pub tgid: u32,
    /// The last frame found: it names the binary whose tables lack what the walk needed.
    pub pc: u64,
    /// Why the walk stopped there.
    pub reason: UnwindOutcome,
    /// Samples that stopped so, which weighs the missing tables.
    pub count: u64,
}

/// The loss reason of stacks cut at the depth limit, beside the [`Loss`] names.
pub const TRUNCATED_STACKS: &str = "truncated stacks";

/// Loss counts by [`Loss`] kind, plus stacks cut at the depth limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Losses {
    /// Counts by [`Loss`] index, as the program's `LOSSES` run holds them.
    pub by_kind: [u64; LOSS_KINDS as usize],
    /// Samples whose user or kernel stack hit the depth limit (their root frames are missing).
    pub truncated_stacks: u64,
    /// How walks with unwind tables ended, by [`UnwindOutcome`]: not losses, except the early
    /// stops, but reported beside them.
    pub unwind: [u64; UNWIND_OUTCOMES as usize],
    /// Each walked runtime's counters (the registry's, in its order): its frames, and why its
    /// chains stopped early.
    pub runtimes: Vec<RuntimeCounts>,
}

/// One runtime's walk counters for a window, as its BPF map counts them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeCounts {
    /// The runtime (`python`): the metrics' label.
    pub runtime: &'static str,
    /// Its counters' names, in its map's order: the first the frames its walk emitted, the
    /// rest the reasons a chain stopped early, as `/metrics` labels them.
    pub names: &'static [&'static str],
    /// The counts, one per name.
    pub counts: Vec<u64>,
}

impl RuntimeCounts {
    /// The frames the runtime's walk emitted.
    pub fn frames(&self) -> u64 {
        self.counts.first().copied().unwrap_or(0)
    }

    /// Early stops by reason.
    pub fn stops(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        self.names
            .iter()
            .copied()
            .zip(self.counts.iter().copied())
            .skip(1)
    }
}

impl Losses {
    pub fn add(&mut self, other: &Losses) {
        for (mine, theirs) in self.by_kind.iter_mut().zip(other.by_kind) {
            *mine += theirs;
        }
        self.truncated_stacks += other.truncated_stacks;
        for (mine, theirs) in self.unwind.iter_mut().zip(other.unwind) {
            *mine += theirs;
        }
        for theirs in &other.runtimes {
            match self
                .runtimes
                .iter_mut()
                .find(|mine| mine.runtime == theirs.runtime)
            {
                Some(mine) => {
                    for (mine, theirs) in mine.counts.iter_mut().zip(&theirs.counts) {
                        *mine += theirs;
                    }
                }
                None => self.runtimes.push(theirs.clone()),
            }
        }
    }

    /// Walks with unwind tables by [`UnwindOutcome`], as `/metrics` labels them.
    pub fn unwind_outcomes(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        UnwindOutcome::ALL
            .into_iter()
            .map(|outcome| (outcome.name(), self.unwind[outcome as usize]))
    }

    /// Every reason [`Losses::by_reason`] gives, in its order.
    pub fn reasons() -> impl Iterator<Item = &'static str> {
        Loss::ALL
            .into_iter()
            .map(Loss::name)
            .chain([TRUNCATED_STACKS])
    }

    /// Counts by reason, as `/metrics` labels them: every [`Loss`], then truncated stacks.
    pub fn by_reason(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Loss::ALL
            .into_iter()
            .map(|loss| {
                (
                    loss.name(),
                    self.by_kind.get(loss as usize).copied().unwrap_or(0),
                )
            })
            .chain([(TRUNCATED_STACKS, self.truncated_stacks)])
    }

    /// Samples dropped outright (not merely degraded).
    pub fn dropped_samples(&self) -> u64 {
        self.by_kind[Loss::CountsMapFull as usize]
    }

    /// Samples kept without one of their stacks.
    pub fn lost_stacks(&self) -> u64 {
        [
            Loss::UserStackCollision,
            Loss::UserStackError,
            Loss::UserStackRingFull,
            Loss::KernelStackCollision,
            Loss::KernelStackError,
        ]
        .iter()
        .map(|&l| self.by_kind[l as usize])
        .sum()
    }

    pub fn is_empty(&self) -> bool {
        let Losses {
            by_kind,
            truncated_stacks,
            unwind,
            runtimes,
        } = self;
        by_kind.iter().chain(unwind).all(|&n| n == 0)
            && *truncated_stacks == 0
            && runtimes.iter().all(|r| r.counts.iter().all(|&n| n == 0))
    }

    /// `kind=count` pairs for the non-zero counters, for summaries and logs.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = Loss::ALL
            .iter()
            .filter(|&&l| self.by_kind[l as usize] > 0)
            .map(|&l| format!("{}: {}", l.name(), self.by_kind[l as usize]))
            .collect();
        if self.truncated_stacks > 0 {
            parts.push(format!("{TRUNCATED_STACKS}: {}", self.truncated_stacks));
        }
        let mut text = if parts.is_empty() {
            "none".to_owned()
        } else {
            parts.join(", ")
        };
        if self.unwind.iter().any(|&n| n > 0) {
            let outcomes: Vec<String> = self
                .unwind_outcomes()
                .filter(|(_, n)| *n > 0)
                .map(|(name, n)| format!("{name}: {n}"))
                .collect();
            text.push_str(&format!("; unwind: {}", outcomes.join(", ")));
        }
        for runtime in self
            .runtimes
            .iter()
            .filter(|r| r.counts.iter().any(|&n| n > 0))
        {
            let stops: Vec<String> = runtime
                .stops()
                .filter(|(_, n)| *n > 0)
                .map(|(name, n)| format!("{name}: {n}"))
                .collect();
            text.push_str(&format!(
                "; {}: {} frames, stops: {}",
                runtime.runtime,
                runtime.frames(),
                if stops.is_empty() {
                    "none".to_owned()
                } else {
                    stops.join(", ")
                }
            ));
        }
        text
    }
}

/// Everything sampled in one window, with stack ids resolved to frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawWindow {
    /// When the window began: the previous drain's flip (or the drainer's creation).
    pub start: SystemTime,
    /// When it ended: this drain's flip.
    pub end: SystemTime,
    /// Its samples, one per distinct (process, thread, user stack, kernel stack).
    pub samples: Vec<RawSample>,
    /// Samples whose table walk stopped early (`--unwind auto`), by where and why.
    pub walk_stops: Vec<WalkStop>,
    /// Process names recorded by the BPF program, for processes that may be gone by now.
    pub comms: HashMap<u32, String>,
    /// Each process's cgroup and start, recorded with its name.
    pub origins: HashMap<u32, Origin>,
    pub losses: Losses,
    /// How full the window left its stack maps; their collisions are in `losses`.
    pub stack_maps: StackMapFill,
}

/// Where a process the window sampled belongs, as the BPF program recorded it at its first
/// sample: what labels it when it exited before the agent read /proc/PID.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Origin {
    /// Its cgroup v2 id (the inode of its directory there); 0 when not recorded.
    pub cgroup_id: u64,
    /// Its leader's `start_boottime`, ns since boot; 0 when not recorded.
    pub started_ns: u64,
}

/// The distinct stacks a window stored in each stack map, beside the entries the map holds: a
/// map near full loses stacks as collisions (`bpf_get_stackid` does not chain a bucket) or
/// as errors, so the fill says whether the maps are sized for the host's stacks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StackMapFill {
    /// The distinct stacks the window stored, map by map.
    pub used: StackEntries,
    /// The entries each map had in the window.
    pub capacity: StackEntries,
}

impl StackMapFill {
    /// The fuller of two windows' fills, map by map (a recording reports its fullest).
    pub fn max(self, other: StackMapFill) -> StackMapFill {
        StackMapFill {
            used: self.used.max(other.used),
            capacity: self.capacity.max(other.capacity),
        }
    }

    /// `stacks 57 of 8192 entries, user stacks 310 of 1024`,
    /// or `None` before any window.
    pub fn describe(&self) -> Option<String> {
        if self.capacity == StackEntries::default() {
            return None;
        }
        let mut text = format!(
            "stacks {} of {} entries",
            self.used.stacks, self.capacity.stacks
        );
        // None: `--unwind fp`, where the program walks no user stack itself.
        if self.capacity.user_stacks > 0 {
            text.push_str(&format!(
                ", user stacks {} of {}",
                self.used.user_stacks, self.capacity.user_stacks
            ));
        }
        Some(text)
    }
}

impl RawWindow {
    pub fn total_samples(&self) -> u64 {
        self.samples.iter().map(|s| s.count).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn losses(kinds: &[(Loss, u64)]) -> Losses {
        let mut losses = Losses::default();
        for &(kind, count) in kinds {
            losses.by_kind[kind as usize] = count;
        }
        losses
    }

    #[test]
    fn losses_tell_dropped_samples_from_lost_stacks() {
        let window = losses(&[
            (Loss::UserStackCollision, 1),
            (Loss::UserStackError, 20),
            (Loss::KernelStackCollision, 300),
            (Loss::KernelStackError, 4000),
            (Loss::CountsMapFull, 50_000),
            (Loss::CommMapFull, 600_000),
            (Loss::UserStackRingFull, 7_000_000),
        ]);
        assert_eq!(window.lost_stacks(), 7_004_321);
        assert_eq!(window.dropped_samples(), 50_000);
    }

    #[test]
    fn losses_add_up_counter_by_counter() {
        let mut total = losses(&[(Loss::CountsMapFull, 2)]);
        total.truncated_stacks = 1;
        total.unwind[UnwindOutcome::NoRow as usize] = 3;
        let counts = |counts: Vec<u64>| RuntimeCounts {
            runtime: "python",
            names: &["frames", "frame limit"],
            counts,
        };
        total.runtimes.push(counts(vec![4, 0]));
        let mut window = losses(&[(Loss::CountsMapFull, 10), (Loss::CommMapFull, 1)]);
        window.truncated_stacks = 10;
        window.unwind[UnwindOutcome::NoRow as usize] = 10;
        window.runtimes.push(counts(vec![10, 1]));
        window.runtimes.push(RuntimeCounts {
            runtime: "other",
            ..counts(vec![2, 0])
        });
        total.add(&window);
        assert_eq!(total.by_kind[Loss::CountsMapFull as usize], 12);
        assert_eq!(total.by_kind[Loss::CommMapFull as usize], 1);
        assert_eq!(total.truncated_stacks, 11);
        assert_eq!(total.unwind[UnwindOutcome::NoRow as usize], 13);
        assert_eq!(total.runtimes[0].counts, [14, 1]);
        // A runtime the total had not counted yet is added whole.
        assert_eq!(total.runtimes[1].runtime, "other");
        assert_eq!(total.runtimes[1].frames(), 2);
    }

    #[test]
    fn losses_by_reason_name_every_reason_once_in_order() {
        let mut window = losses(&[(Loss::KernelStackError, 7)]);
        window.truncated_stacks = 2;
        let by_reason: Vec<_> = window.by_reason().collect();
        let reasons: Vec<_> = Losses::reasons().collect();
        assert_eq!(
            by_reason.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
            reasons
        );
        assert_eq!(reasons.len(), LOSS_KINDS as usize + 1);
        assert!(by_reason.contains(&(Loss::KernelStackError.name(), 7)));
        assert_eq!(by_reason.last(), Some(&(TRUNCATED_STACKS, 2)));
        assert_eq!(by_reason.iter().map(|(_, n)| n).sum::<u64>(), 9);
    }

    #[test]
    fn losses_describe_only_what_moved() {
        assert_eq!(Losses::default().describe(), "none");
        assert!(Losses::default().is_empty());
        let mut window = losses(&[(Loss::CountsMapFull, 3)]);
        window.truncated_stacks = 1;
        let text = window.describe();
        assert!(
            text.contains(&format!("{}: 3", Loss::CountsMapFull.name())),
            "{text}"
        );
        assert!(text.contains(&format!("{TRUNCATED_STACKS}: 1")), "{text}");
        assert!(!text.contains(Loss::CommMapFull.name()), "{text}");
        assert!(
            !text.contains("unwind") && !text.contains("python"),
            "{text}"
        );
        assert!(!window.is_empty());
        // A runtime's counters: described when they moved, and only then.
        window.runtimes.push(RuntimeCounts {
            runtime: "python",
            names: &["frames", "frame limit", "frame read fault"],
            counts: vec![0, 0, 0],
        });
        assert!(!window.describe().contains("python"));
        assert!(Losses {
            runtimes: window.runtimes.clone(),
            ..Losses::default()
        }
        .is_empty());
        window.runtimes[0].counts = vec![40, 2, 0];
        let text = window.describe();
        assert!(
            text.ends_with("; python: 40 frames, stops: frame limit: 2"),
            "{text}"
        );
    }
}
