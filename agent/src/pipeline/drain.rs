//! Drain: read and reset the sampler's maps once per window, without losing or double-counting
//! a sample at the boundary.
//!
//! The BPF program writes to one of two map generations, chosen by `CONTROL.generation`. To
//! drain, the agent flips the generation, waits until no run of the program can still be
//! writing to the old one, then reads and empties the old generation at leisure:
//!
//! 1. write `generation = 1 - g`;
//! 2. for every CPU, read its `RUN_SEQ`; an odd value means a run is in flight, possibly one
//!    that read `g` before the flip. Wait until that CPU's value changes. A run that starts
//!    after step 2 read the CPU's value reads the new generation, because the program bumps its
//!    sequence (a full barrier) before it reads the generation;
//! 3. read `COUNTS_g`, the stacks it references in `STACKS_g`, and `COMMS_g`; delete every entry.
//!
//! The hash maps (`COUNTS_g`, `COMMS_g`, `USER_STACKS_g`) are read and emptied with
//! `BPF_MAP_LOOKUP_AND_DELETE_BATCH` (`sys::bpf_batch`), a few calls per map rather than three
//! per entry; a kernel without batch operations (before 5.6) gets the per-entry calls, decided
//! on the first refusal and kept. `STACKS_g` has no batch operations: its referenced stacks
//! are read one by one, and the ids read are the ids deleted.
//!
//! The counters (`LOSSES`, `UNWIND_OUTCOMES_COUNT`, `PYTHON_COUNTS_MAP`) are per CPU, with a
//! run of counters per generation (`COUNTER_RUNS`): the old generation's run is taken and
//! zeroed with its maps, so a window reports exactly the counts of its own samples. The
//! off-CPU program's walks count in a run of their own, cumulative; a window reports its
//! difference.

use std::{
    collections::HashMap,
    time::{Duration, Instant, SystemTime},
};

use aya::{
    maps::{HashMap as BpfHashMap, MapData, MapError, PerCpuArray, PerCpuValues, StackTraceMap},
    Pod,
};

use super::{
    frames::{decode_user, from_pcs, Frame},
    maps::{new_stack_map, new_user_stack_map, SamplerMaps, StackEntries, UserStackClass},
    stack_sizing::StackSizing,
};
use crate::sys::bpf_batch::{self, BatchError};
use scorch_common::{
    Control, Loss, PythonCount, SeenProcess, ShortUserStack, StackKey, UnwindOutcome, UserStack,
    WalkedStack, LOSS_KINDS, MAX_STACK_DEPTH, MAX_USER_STACK_DEPTH, OFF_CPU_COUNTER_RUN,
    PYTHON_COUNTS, STACK_ABSENT, STACK_LOST_COLLISION, UNWIND_OUTCOMES, UNWIND_TABLES,
};

/// Longest a single BPF run may take before the drain gives up waiting on it. Runs take
/// microseconds; this only guards against a wedged CPU stalling the daemon.
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("{action} BPF map {map}: {source}")]
    Map {
        action: &'static str,
        map: &'static str,
        source: MapError,
    },
    #[error("{action} BPF map {map}: {source}")]
    Batch {
        action: &'static str,
        map: &'static str,
        source: BatchError,
    },
    #[error("CPU {cpu} stayed inside the BPF program for over {QUIESCE_TIMEOUT:?}")]
    NotQuiescent { cpu: usize },
    #[error("zeroing BPF map {map}: the possible CPUs: {source}")]
    Cpus {
        map: &'static str,
        source: std::io::Error,
    },
}

/// A stack as recorded for one sample.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stack {
    /// Frames, leaf first, decoded once from the words the kernel or the BPF walk wrote.
    Frames(Vec<Frame>),
    /// The sample has no stack of this kind (kernel thread: no user stack; user mode: no
    /// kernel stack).
    Absent,
    /// The stack could not be recorded; the reason was counted in the losses.
    Lost,
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

/// A name as the kernel keeps it (`TASK_COMM_LEN`), NUL-padded.
pub fn comm_name(comm: &[u8; 16]) -> String {
    let len = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..len]).into_owned()
}

/// One (process, thread, user stack, kernel stack) and how often it was sampled in a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawSample {
    pub tgid: u32,
    pub thread: ThreadTag,
    pub user: Stack,
    pub kernel: Stack,
    pub count: u64,
}

/// Samples whose user-stack walk stopped before the bottom of the stack: at `pc` (the last
/// frame found, in process `tgid`), for `reason` ([`UnwindOutcome::NoRow`],
/// [`UnwindOutcome::UnsupportedCfa`] or [`UnwindOutcome::ReadFault`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalkStop {
    pub tgid: u32,
    pub pc: u64,
    pub reason: UnwindOutcome,
    pub count: u64,
}

/// The loss reason of stacks cut at the depth limit, beside the [`Loss`] names.
pub const TRUNCATED_STACKS: &str = "truncated stacks";

/// Loss counts by [`Loss`] kind, plus stacks cut at the depth limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Losses {
    pub by_kind: [u64; LOSS_KINDS as usize],
    /// Samples whose user or kernel stack hit the depth limit (their root frames are missing).
    pub truncated_stacks: u64,
    /// How walks with unwind tables ended, by [`UnwindOutcome`]: not losses, except the early
    /// stops, but reported beside them.
    pub unwind: [u64; UNWIND_OUTCOMES as usize],
    /// Python frames walked, and why Python chains stopped early, by [`PythonCount`].
    pub python: [u64; PYTHON_COUNTS as usize],
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
        for (mine, theirs) in self.python.iter_mut().zip(other.python) {
            *mine += theirs;
        }
    }

    /// Python frames walked, then early stops by reason, as `/metrics` labels them.
    pub fn python_counts(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        PythonCount::ALL
            .into_iter()
            .map(|kind| (kind.name(), self.python[kind as usize]))
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
            Loss::KernelStackCollision,
            Loss::KernelStackError,
        ]
        .iter()
        .map(|&l| self.by_kind[l as usize])
        .sum()
    }

    pub fn is_empty(&self) -> bool {
        *self == Losses::default()
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
        if self.python.iter().any(|&n| n > 0) {
            let stops: Vec<String> = self
                .python_counts()
                .skip(1)
                .filter(|(_, n)| *n > 0)
                .map(|(name, n)| format!("{name}: {n}"))
                .collect();
            text.push_str(&format!(
                "; python: {} frames, stops: {}",
                self.python[PythonCount::Frames as usize],
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
    pub start: SystemTime,
    pub end: SystemTime,
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
    pub used: StackEntries,
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

    /// `stacks 57 of 8192 entries, user stacks 3 of 1024, short user stacks 310 of 1024`,
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
                ", user stacks {} of {}, short user stacks {} of {}",
                self.used.user_stacks,
                self.capacity.user_stacks,
                self.used.short_user_stacks,
                self.capacity.short_user_stacks
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

/// Reads windows out of the sampler's maps.
pub struct Drainer {
    maps: SamplerMaps,
    control: Control,
    window_start: SystemTime,
    /// The off-CPU walks' cumulative unwind outcome counters at the previous drain.
    previous_off_cpu_unwind: [u64; UNWIND_OUTCOMES as usize],
    /// The off-CPU walks' cumulative Python counters at the previous drain.
    previous_off_cpu_python: [u64; PYTHON_COUNTS as usize],
    /// Whether hash maps are read in batches; false once the kernel refused a batch call
    /// (before 5.6), and then for good: the answer is the kernel's, not the window's.
    batched: bool,
}

fn map_err(action: &'static str, map: &'static str) -> impl FnOnce(MapError) -> DrainError {
    move |source| DrainError::Map {
        action,
        map,
        source,
    }
}

impl Drainer {
    /// Takes over the maps; `control` is the configuration the sampler was started with.
    pub fn new(maps: SamplerMaps, control: Control) -> Self {
        Drainer {
            maps,
            control,
            window_start: SystemTime::now(),
            previous_off_cpu_unwind: [0; UNWIND_OUTCOMES as usize],
            previous_off_cpu_python: [0; PYTHON_COUNTS as usize],
            batched: true,
        }
    }

    /// Processes sampled so far in the current window, from the comm map the program fills the
    /// first time it sees each one. Lets the agent read a new process's maps right away, so
    /// a process that exits before the window ends is still named.
    pub fn active_pids(&mut self) -> Result<Vec<u32>, DrainError> {
        let current = self.control.generation as usize & 1;
        let comms = &self.maps.generations[current].comms;
        if self.batched {
            let mut pids = Vec::new();
            match bpf_batch::lookup(comms, batch_capacity(comms), |tgid, _| pids.push(tgid)) {
                Ok(()) => return Ok(pids),
                Err(BatchError::Unsupported { source, .. }) => {
                    stop_batching(&mut self.batched, &source)
                }
                Err(source) => return Err(batch_err("listing", "COMMS")(source)),
            }
        }
        comms
            .keys()
            .collect::<Result<_, _>>()
            .map_err(map_err("listing", "COMMS"))
    }

    /// Ends the current window and returns what it sampled.
    pub fn drain_window(&mut self) -> Result<RawWindow, DrainError> {
        let old = self.control.generation as usize & 1;
        self.control.generation = (old ^ 1) as u32;
        self.maps
            .control
            .set(0, self.control, 0)
            .map_err(map_err("writing", "CONTROL"))?;
        let end = SystemTime::now();
        self.wait_quiescent()?;

        // The generation is quiescent: each hash map is read and emptied in the same pass.
        let batched = &mut self.batched;
        let generation = &mut self.maps.generations[old];
        let mut counts: Vec<(StackKey, u64)> = Vec::new();
        take_all(batched, &mut generation.counts, "COUNTS", |key, count| {
            counts.push((key, count))
        })?;
        let walked = self.control.unwind == UNWIND_TABLES;
        let thread_ids = self.control.thread_ids != 0;
        // Both size classes' stacks, by id: the ids' class bit keeps them apart.
        let mut user_stacks: HashMap<i32, (Vec<Frame>, u32)> = HashMap::new();
        let mut walked_stored = StackEntries::default();
        if walked {
            let mut keep = |id, stack: &dyn WalkedStack| {
                user_stacks.insert(id, (decode_user(stack.frames()), stack.outcome()));
            };
            take_all(
                batched,
                &mut generation.user_stacks,
                UserStackClass::Long.outer_name(),
                |id, stack: UserStack| {
                    walked_stored.user_stacks += 1;
                    keep(id, &stack)
                },
            )?;
            take_all(
                batched,
                &mut generation.short_user_stacks,
                UserStackClass::Short.outer_name(),
                |id, stack: ShortUserStack| {
                    walked_stored.short_user_stacks += 1;
                    keep(id, &stack)
                },
            )?;
        }
        let mut stacks: HashMap<i32, Vec<u64>> = HashMap::new();
        let mut losses = Losses::default();
        let mut samples = Vec::with_capacity(counts.len());
        let mut walk_stops = Vec::new();
        for (key, count) in &counts {
            let user = if walked {
                let (user, outcome) = resolve_user_stack(&user_stacks, key.user_stack_id);
                let reason = UnwindOutcome::ALL.get(outcome as usize).copied();
                if let (Stack::Frames(frames), Some(reason)) = (&user, reason) {
                    let early = matches!(
                        reason,
                        UnwindOutcome::NoRow
                            | UnwindOutcome::UnsupportedCfa
                            | UnwindOutcome::ReadFault
                    );
                    if let (true, Some(pc)) = (early, frames.last().and_then(|f| f.pc())) {
                        walk_stops.push(WalkStop {
                            tgid: key.tgid,
                            pc,
                            reason,
                            count: *count,
                        });
                    }
                }
                user
            } else {
                resolve_stack(&generation.stacks, &mut stacks, key.user_stack_id, false)?
            };
            let kernel = resolve_stack(&generation.stacks, &mut stacks, key.kernel_stack_id, true)?;
            // The program's own walk goes deeper than the kernel's stacks.
            let user_limit = if walked {
                MAX_USER_STACK_DEPTH
            } else {
                MAX_STACK_DEPTH
            };
            let truncated = |s: &Stack, limit| matches!(s, Stack::Frames(f) if f.len() >= limit);
            if truncated(&user, user_limit) || truncated(&kernel, MAX_STACK_DEPTH) {
                losses.truncated_stacks += count;
            }
            samples.push(RawSample {
                tgid: key.tgid,
                thread: ThreadTag {
                    name: comm_name(&key.thread),
                    id: thread_ids.then_some(key.tid),
                },
                user,
                kernel,
                count: *count,
            });
        }
        let (mut comms, mut origins) = (HashMap::new(), HashMap::new());
        take_all(
            batched,
            &mut generation.comms,
            "COMMS",
            |tgid, seen: SeenProcess| {
                comms.insert(tgid, comm_name(&seen.comm));
                origins.insert(
                    tgid,
                    Origin {
                        cgroup_id: seen.cgroup_id,
                        started_ns: seen.started_ns,
                    },
                );
            },
        )?;

        losses.by_kind = take_run(&mut self.maps.losses, "LOSSES", old)?;

        // Stack-trace maps have no batch operations. Every stack the program stored is one a
        // count key references, and was resolved above, unless the key itself was dropped
        // (the counts map was full): only then are the stored ids listed again. A stack left
        // behind would hold its bucket, and the next window's stacks hashing there would be
        // lost as collisions.
        // The map is sized for the stacks its windows store: one that needs another size is
        // replaced now, while its generation is idle, and the new one starts empty.
        let capacity = self.maps.stack_sizing.entries(old);
        let collisions = losses.by_kind[Loss::KernelStackCollision as usize]
            + if walked {
                0
            } else {
                losses.by_kind[Loss::UserStackCollision as usize]
            };
        let entries = self
            .maps
            .stack_sizing
            .after_window(old, stacks.len() as u32, collisions);
        let replaced = entries != capacity
            && match new_stack_map(&self.maps.stacks_outer, old as u32, entries) {
                Ok(map) => {
                    tracing::debug!(
                        "stack-trace map {old}: {} stacks stored, {collisions} lost to \
                         collisions; {capacity} entries now {entries}",
                        stacks.len()
                    );
                    self.maps.generations[old].stacks = map;
                    true
                }
                Err(error) => {
                    tracing::warn!("{error}; its map keeps {capacity} entries");
                    self.maps.stack_sizing.keep(old, capacity);
                    false
                }
            };
        if !replaced {
            let stacks_map = &mut self.maps.generations[old].stacks;
            if losses.by_kind[Loss::CountsMapFull as usize] > 0 {
                let stack_ids: Vec<u32> = stacks_map
                    .stack_ids()
                    .collect::<Result<_, _>>()
                    .map_err(map_err("listing", "STACKS"))?;
                for id in stack_ids {
                    remove_ok(stacks_map.remove(&id)).map_err(map_err("clearing", "STACKS"))?;
                }
            } else {
                for &id in stacks.keys() {
                    remove_ok(stacks_map.remove(&(id as u32)))
                        .map_err(map_err("clearing", "STACKS"))?;
                }
            }
        }

        // The user-stack maps, emptied by the takes above, likewise; a stack that found its
        // map full is lost as a `user stack error`, which does not say which map: the one
        // the window filled grows. None under `--unwind fp`: the program walks no user stack
        // itself.
        let mut user_capacity = StackEntries::default();
        if walked {
            let errors = losses.by_kind[Loss::UserStackError as usize];
            let maps = &mut self.maps;
            let generation = &mut maps.generations[old];
            user_capacity.user_stacks = resize_user_stacks(
                UserStackClass::Long,
                &maps.user_stacks_outer,
                &mut maps.user_stack_sizing,
                &mut generation.user_stacks,
                old,
                walked_stored.user_stacks,
                errors,
            );
            user_capacity.short_user_stacks = resize_user_stacks(
                UserStackClass::Short,
                &maps.short_user_stacks_outer,
                &mut maps.short_user_stack_sizing,
                &mut generation.short_user_stacks,
                old,
                walked_stored.short_user_stacks,
                errors,
            );
        }

        losses.unwind = take_walk_counts(
            &mut self.maps.unwind_outcomes,
            "UNWIND_OUTCOMES_COUNT",
            old,
            &mut self.previous_off_cpu_unwind,
        )?;
        losses.python = take_walk_counts(
            &mut self.maps.python_counts,
            "PYTHON_COUNTS_MAP",
            old,
            &mut self.previous_off_cpu_python,
        )?;

        let stack_maps = StackMapFill {
            used: StackEntries {
                stacks: stacks.len() as u32,
                ..walked_stored
            },
            capacity: StackEntries {
                stacks: capacity,
                ..user_capacity
            },
        };
        let start = std::mem::replace(&mut self.window_start, end);
        Ok(RawWindow {
            start,
            end,
            samples,
            walk_stops,
            comms,
            origins,
            losses,
            stack_maps,
        })
    }

    /// Waits until no CPU can still be running the program against the old generation.
    fn wait_quiescent(&self) -> Result<(), DrainError> {
        let snapshot = self
            .maps
            .run_seq
            .get(&0, 0)
            .map_err(map_err("reading", "RUN_SEQ"))?;
        let deadline = Instant::now() + QUIESCE_TIMEOUT;
        for (cpu, before) in snapshot.iter().enumerate() {
            if before.seq % 2 == 0 {
                continue;
            }
            loop {
                let now = self
                    .maps
                    .run_seq
                    .get(&0, 0)
                    .map_err(map_err("reading", "RUN_SEQ"))?;
                if now[cpu].seq != before.seq {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(DrainError::NotQuiescent { cpu });
                }
                std::thread::yield_now();
            }
        }
        Ok(())
    }
}

/// After a window stored `stored` stacks in generation `generation`'s user-stack map of
/// `class` (`map`, in the array of maps `outer`) and lost `errors` user stacks to errors:
/// replaces the map when `sizing` wants another size for it. A map the window filled takes
/// the errors as its own. Returns the entries the map had in the window.
fn resize_user_stacks<V: Pod>(
    class: UserStackClass,
    outer: &MapData,
    sizing: &mut StackSizing,
    map: &mut BpfHashMap<MapData, i32, V>,
    generation: usize,
    stored: u32,
    errors: u64,
) -> u32 {
    let capacity = sizing.entries(generation);
    let lost = if stored >= capacity { errors } else { 0 };
    let entries = sizing.after_window(generation, stored, lost);
    if entries != capacity {
        match new_user_stack_map(class, outer, generation as u32, entries) {
            Ok(new) => *map = new,
            Err(error) => {
                tracing::warn!("{error}; its map keeps {capacity} entries");
                sizing.keep(generation, capacity);
            }
        }
    }
    capacity
}

/// Counters `0..N` of a per-CPU array, each summed over the CPUs.
/// Run `run` of a per-CPU counter array (`COUNTER_RUNS`), each counter summed over the CPUs.
fn sum_run<const N: usize>(
    map: &PerCpuArray<MapData, u64>,
    name: &'static str,
    run: usize,
) -> Result<[u64; N], DrainError> {
    let mut totals = [0u64; N];
    for (i, total) in totals.iter_mut().enumerate() {
        let per_cpu = map
            .get(&((run * N + i) as u32), 0)
            .map_err(map_err("reading", name))?;
        *total = per_cpu.iter().sum();
    }
    Ok(totals)
}

/// Takes run `run` of a per-CPU counter array: each counter summed over the CPUs, then zeroed.
/// Only for a quiescent generation's run, which no program writes: nothing counted between the
/// read and the write can be lost.
fn take_run<const N: usize>(
    map: &mut PerCpuArray<MapData, u64>,
    name: &'static str,
    run: usize,
) -> Result<[u64; N], DrainError> {
    let mut totals = [0u64; N];
    for (i, total) in totals.iter_mut().enumerate() {
        let index = (run * N + i) as u32;
        let per_cpu = map.get(&index, 0).map_err(map_err("reading", name))?;
        *total = per_cpu.iter().sum();
        // Most counters stay at zero: only those that moved are written.
        if *total != 0 {
            let zeros = PerCpuValues::try_from(vec![0u64; per_cpu.len()])
                .map_err(|source| DrainError::Cpus { map: name, source })?;
            map.set(index, zeros, 0).map_err(map_err("zeroing", name))?;
        }
    }
    Ok(totals)
}

/// A window's counts from a walk counter array: generation `generation`'s run, taken, plus
/// what the off-CPU walks' cumulative run gained since `previous`.
fn take_walk_counts<const N: usize>(
    map: &mut PerCpuArray<MapData, u64>,
    name: &'static str,
    generation: usize,
    previous: &mut [u64; N],
) -> Result<[u64; N], DrainError> {
    let mut window = take_run(map, name, generation)?;
    let off_cpu: [u64; N] = sum_run(map, name, OFF_CPU_COUNTER_RUN as usize)?;
    for ((counted, total), before) in window.iter_mut().zip(&off_cpu).zip(previous.iter()) {
        *counted += total.saturating_sub(*before);
    }
    *previous = off_cpu;
    Ok(window)
}

fn batch_err(action: &'static str, map: &'static str) -> impl FnOnce(BatchError) -> DrainError {
    move |source| DrainError::Batch {
        action,
        map,
        source,
    }
}

/// Entries of `map` one batch call may return.
fn batch_capacity<K: Pod, V: Pod>(_: &BpfHashMap<MapData, K, V>) -> usize {
    let entry = std::mem::size_of::<K>() + std::mem::size_of::<V>();
    bpf_batch::capacity_for(bpf_batch::BATCH_BYTES, entry)
}

fn stop_batching(batched: &mut bool, error: &std::io::Error) {
    tracing::info!("BPF map batch operations unavailable ({error}): reading maps entry by entry");
    *batched = false;
}

/// Hands every entry of `map` to `each` and empties it, in batches while `batched` holds;
/// a refusal of the first batch (nothing was taken) turns batching off and falls back to the
/// per-entry calls, for this map and every later one.
fn take_all<K: Pod, V: Pod>(
    batched: &mut bool,
    map: &mut BpfHashMap<MapData, K, V>,
    name: &'static str,
    mut each: impl FnMut(K, V),
) -> Result<(), DrainError> {
    if *batched {
        let capacity = batch_capacity(map);
        match bpf_batch::take(map, capacity, &mut each) {
            Ok(()) => return Ok(()),
            Err(BatchError::Unsupported { source, .. }) => stop_batching(batched, &source),
            Err(source) => return Err(batch_err("draining", name)(source)),
        }
    }
    // Keys are collected first: deleting while iterating a BPF hash map restarts or skips
    // the walk.
    let mut keys = Vec::new();
    for entry in map.iter() {
        let (key, value) = entry.map_err(map_err("reading", name))?;
        keys.push(key);
        each(key, value);
    }
    for key in &keys {
        remove_ok(map.remove(key)).map_err(map_err("clearing", name))?;
    }
    Ok(())
}

/// A key deleted by someone else in between is as good as deleted.
fn remove_ok(result: Result<(), MapError>) -> Result<(), MapError> {
    match result {
        Err(MapError::KeyNotFound) => Ok(()),
        other => other,
    }
}

/// As [`resolve_stack`], for a stack the program walked itself (`stacks`: the generation's
/// `USER_STACKS`, already taken); with how its walk ended (an [`UnwindOutcome`] index;
/// [`UnwindOutcome::Completed`] when there was no walk).
fn resolve_user_stack(stacks: &HashMap<i32, (Vec<Frame>, u32)>, id: i32) -> (Stack, u32) {
    let completed = UnwindOutcome::Completed as u32;
    if id == STACK_ABSENT {
        return (Stack::Absent, completed);
    }
    if id < 0 {
        return (Stack::Lost, completed);
    }
    match stacks.get(&id) {
        Some((frames, outcome)) => (Stack::Frames(frames.clone()), *outcome),
        // Cannot happen while the generation is quiescent, but a missing stack must not
        // abort the window.
        None => (Stack::Lost, completed),
    }
}

/// The stack `id` of the kernel's stack map: a kernel stack (`kernel`), or a user stack walked
/// by frame pointers. `cache` keeps each id's pcs, as one stack is shared by many keys.
fn resolve_stack(
    map: &StackTraceMap<MapData>,
    cache: &mut HashMap<i32, Vec<u64>>,
    id: i32,
    kernel: bool,
) -> Result<Stack, DrainError> {
    if id == STACK_ABSENT {
        return Ok(Stack::Absent);
    }
    if id < 0 {
        debug_assert!(id <= STACK_LOST_COLLISION);
        return Ok(Stack::Lost);
    }
    if let Some(pcs) = cache.get(&id) {
        return Ok(Stack::Frames(from_pcs(pcs, kernel)));
    }
    match map.get(&(id as u32), 0) {
        Ok(trace) => {
            let pcs: Vec<u64> = trace.frames().iter().map(|f| f.ip).collect();
            let frames = from_pcs(&pcs, kernel);
            cache.insert(id, pcs);
            Ok(Stack::Frames(frames))
        }
        // Cannot happen while the generation is quiescent, but a missing stack must not
        // abort the window.
        Err(MapError::KeyNotFound) => Ok(Stack::Lost),
        Err(source) => Err(DrainError::Map {
            action: "reading",
            map: "STACKS",
            source,
        }),
    }
}
