//! The drain's pure half: what a quiescent generation's maps held, as plain values, into the
//! parts of a [`RawWindow`](super::RawWindow). The protocol ([`super`]) reads and empties the
//! maps and hands their entries here; nothing here touches the kernel, so the rules of the
//! decoding (the stack ids' sentinels, walks that stopped early, stacks cut at the depth limit,
//! the counter arrays' runs, the off-CPU walks' differences) are tested without it.

use std::collections::{BTreeSet, HashMap};

use scorch_common::{
    Control, Loss, SeenProcess, StackKey, UnwindOutcome, WalkedStack, LOSS_KINDS, MAX_STACK_DEPTH,
    MAX_USER_STACK_DEPTH, STACK_ABSENT, STACK_LOST_COLLISION, UNWIND_TABLES,
};

use super::window::{Origin, RawSample, Stack, ThreadTag, WalkStop};
use crate::pipeline::frames::{decode_user, from_pcs, Frame};

/// A name as the kernel keeps it (`TASK_COMM_LEN`), NUL-padded.
pub fn comm_name(comm: &[u8; 16]) -> String {
    let len = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..len]).into_owned()
}

/// Whether the program walks user stacks itself, with unwind tables (`--unwind auto`), into
/// the user-stack maps, rather than leaving them to the kernel's stack-trace map.
pub fn walks_user_stacks(control: &Control) -> bool {
    control.unwind == UNWIND_TABLES
}

/// The stacks a window's count keys reference, as read out of its generation's maps.
#[derive(Debug, Default)]
pub struct WindowStacks {
    /// The user stacks the program walked itself, by id: their frames, decoded once, and how
    /// the walk ended (an [`UnwindOutcome`] index), which says whether it stopped early.
    walked: HashMap<i32, (Vec<Frame>, u32)>,
    /// The stack-trace map's stacks the keys reference, by id: kernel stacks, and user stacks
    /// walked by frame pointers. Kept as pcs, as the map holds them: whether they are kernel
    /// or user frames depends on which of a key's ids names them.
    traces: HashMap<u32, Vec<u64>>,
}

impl WindowStacks {
    /// Keeps a stack the program walked, sent under `id`.
    pub fn add_walked(&mut self, id: i32, stack: &dyn WalkedStack) {
        self.walked
            .insert(id, (decode_user(stack.frames()), stack.outcome()));
    }

    /// Keeps the pcs the stack-trace map holds under `id`.
    pub fn add_trace(&mut self, id: u32, pcs: Vec<u64>) {
        self.traces.insert(id, pcs);
    }

    /// The ids of the stack-trace map's stacks kept: those the window stored and its keys
    /// reference.
    pub fn trace_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.traces.keys().copied()
    }

    /// How many stacks of the stack-trace map are kept.
    pub fn traces(&self) -> usize {
        self.traces.len()
    }

    /// As [`WindowStacks::resolve_trace`], for a stack the program walked itself; with how
    /// its walk ended (an [`UnwindOutcome`] index; [`UnwindOutcome::Completed`] when there was
    /// no walk).
    pub fn resolve_walked(&self, id: i32) -> (Stack, u32) {
        let completed = UnwindOutcome::Completed as u32;
        if id == STACK_ABSENT {
            return (Stack::Absent, completed);
        }
        if id < 0 {
            return (Stack::Lost, completed);
        }
        match self.walked.get(&id) {
            Some((frames, outcome)) => (Stack::Frames(frames.clone()), *outcome),
            // Cannot happen while the generation is quiescent, but a missing stack must not
            // abort the window.
            None => (Stack::Lost, completed),
        }
    }

    /// The stack `id` of the kernel's stack map: a kernel stack (`kernel`), or a user stack
    /// walked by frame pointers.
    pub fn resolve_trace(&self, id: i32, kernel: bool) -> Stack {
        if id == STACK_ABSENT {
            return Stack::Absent;
        }
        if id < 0 {
            debug_assert!(id <= STACK_LOST_COLLISION);
            return Stack::Lost;
        }
        match self.traces.get(&(id as u32)) {
            Some(pcs) => Stack::Frames(from_pcs(pcs, kernel)),
            // Cannot happen while the generation is quiescent, but a missing stack must not
            // abort the window.
            None => Stack::Lost,
        }
    }
}

/// The ids of the stack-trace map's stacks that `counts`' keys reference: every kernel stack,
/// and the user stacks when the program does not walk them itself. Sentinels name no stack.
pub fn referenced_traces(counts: &[(StackKey, u64)], control: &Control) -> BTreeSet<u32> {
    let walked = walks_user_stacks(control);
    counts
        .iter()
        .flat_map(|(key, _)| {
            let user = (!walked).then_some(key.user_stack_id);
            user.into_iter().chain([key.kernel_stack_id])
        })
        .filter_map(|id| u32::try_from(id).ok())
        .collect()
}

/// A window's count keys, their stacks resolved.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DecodedSamples {
    /// One per count key, in the keys' order.
    pub samples: Vec<RawSample>,
    /// The samples whose table walk stopped early, where it stopped.
    pub walk_stops: Vec<WalkStop>,
    /// Samples whose user or kernel stack reached the depth limit: the window's
    /// [`Losses::truncated_stacks`](super::Losses::truncated_stacks).
    pub truncated_stacks: u64,
}

/// Resolves every count key's stacks against `stacks`, as the program configured by `control`
/// recorded them.
pub fn decode_samples(
    counts: &[(StackKey, u64)],
    stacks: &WindowStacks,
    control: &Control,
) -> DecodedSamples {
    let walked = walks_user_stacks(control);
    let thread_ids = control.thread_ids != 0;
    let mut decoded = DecodedSamples {
        samples: Vec::with_capacity(counts.len()),
        ..DecodedSamples::default()
    };
    for (key, count) in counts {
        let user = if walked {
            let (user, outcome) = stacks.resolve_walked(key.user_stack_id);
            let reason = UnwindOutcome::ALL.get(outcome as usize).copied();
            if let (Stack::Frames(frames), Some(reason)) = (&user, reason) {
                let early = matches!(
                    reason,
                    UnwindOutcome::NoRow | UnwindOutcome::UnsupportedCfa | UnwindOutcome::ReadFault
                );
                if let (true, Some(pc)) = (early, frames.last().and_then(|f| f.pc())) {
                    decoded.walk_stops.push(WalkStop {
                        tgid: key.tgid,
                        pc,
                        reason,
                        count: *count,
                    });
                }
            }
            user
        } else {
            stacks.resolve_trace(key.user_stack_id, false)
        };
        let (user, kernel) =
            Stack::at_least_one(user, stacks.resolve_trace(key.kernel_stack_id, true));
        // The program's own walk goes deeper than the kernel's stacks.
        let user_limit = if walked {
            MAX_USER_STACK_DEPTH
        } else {
            MAX_STACK_DEPTH
        };
        let truncated = |s: &Stack, limit| matches!(s, Stack::Frames(f) if f.len() >= limit);
        if truncated(&user, user_limit) || truncated(&kernel, MAX_STACK_DEPTH) {
            decoded.truncated_stacks += count;
        }
        decoded.samples.push(RawSample {
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
    decoded
}

/// The names and origins of the processes a window saw (its `COMMS` map's entries), by
/// process id.
pub fn decode_processes(
    seen: impl IntoIterator<Item = (u32, SeenProcess)>,
) -> (HashMap<u32, String>, HashMap<u32, Origin>) {
    let (mut comms, mut origins) = (HashMap::new(), HashMap::new());
    for (tgid, seen) in seen {
        comms.insert(tgid, comm_name(&seen.comm));
        origins.insert(
            tgid,
            Origin {
                cgroup_id: seen.cgroup_id,
                started_ns: seen.started_ns,
            },
        );
    }
    (comms, origins)
}

/// The index of counter `kind` of run `run` in a per-CPU counter array of `kinds` counters a
/// run (`scorch_common::COUNTER_RUNS`).
pub fn counter_index(run: usize, kinds: usize, kind: usize) -> u32 {
    (run * kinds + kind) as u32
}

/// One counter of a per-CPU array: its CPUs' values summed.
pub fn sum_cpus(per_cpu: &[u64]) -> u64 {
    per_cpu.iter().sum()
}

/// A window's walk counts: its generation's run (`window`), to which is added what the
/// off-CPU walks' cumulative run (`off_cpu`) gained since the previous drain (`previous`),
/// which becomes `off_cpu`. The three have one length, the array's counters per run. A counter that went back (its map was replaced) gains nothing rather than
/// wrapping to an absurd count.
pub fn add_off_cpu_gain(window: &mut [u64], off_cpu: &[u64], previous: &mut [u64]) {
    for ((counted, total), before) in window.iter_mut().zip(off_cpu).zip(previous.iter()) {
        *counted += total.saturating_sub(*before);
    }
    previous.copy_from_slice(off_cpu);
}

/// The stacks the stack-trace map lost to collisions in a window of losses `by_kind`: kernel
/// stacks, and user stacks when the map holds them (the program's own walk counts its
/// collisions under the same loss, but in its own maps).
pub fn stack_map_collisions(by_kind: &[u64; LOSS_KINDS as usize], control: &Control) -> u64 {
    by_kind[Loss::KernelStackCollision as usize]
        + if walks_user_stacks(control) {
            0
        } else {
            by_kind[Loss::UserStackCollision as usize]
        }
}

/// The user stacks a user-stack map of `capacity` entries lost, after a window stored `stored`
/// stacks in it and lost `errors` user stacks to errors in all: a `user stack error` does not
/// say which map refused the stack, so a map the window filled takes them all as its own.
pub fn user_stack_losses(stored: u32, capacity: u32, errors: u64) -> u64 {
    if stored >= capacity {
        errors
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use scorch_common::{
        python_frame_word, UserStack, LOSS_KINDS, STACK_LOST_OTHER, UNWIND_FP, UNWIND_OUTCOMES,
    };

    /// A program that leaves user stacks to the kernel (`--unwind fp`).
    fn fp() -> Control {
        Control {
            unwind: UNWIND_FP,
            ..Control::default()
        }
    }

    /// A program that walks them itself (`--unwind auto`).
    fn tables() -> Control {
        Control {
            unwind: UNWIND_TABLES,
            ..Control::default()
        }
    }

    fn thread(name: &str) -> [u8; 16] {
        let mut comm = [0; 16];
        comm[..name.len()].copy_from_slice(name.as_bytes());
        comm
    }

    fn key(tgid: u32, user: i32, kernel: i32) -> StackKey {
        StackKey {
            tgid,
            tid: tgid + 1,
            user_stack_id: user,
            kernel_stack_id: kernel,
            thread: thread("worker"),
        }
    }

    /// A long walked stack of `len` frames as the map holds it: words past `len` are garbage
    /// the decoding must not read.
    fn long_stack(len: u32, outcome: UnwindOutcome, words: &[u64]) -> UserStack {
        let mut pcs = [0xdead_0000; MAX_USER_STACK_DEPTH];
        pcs[..words.len()].copy_from_slice(words);
        UserStack {
            hash: 1,
            len,
            outcome: outcome as u32,
            tgid: 1,
            flags: 0,
            pcs,
        }
    }

    fn short_stack(len: u32, outcome: UnwindOutcome, words: &[u64]) -> UserStack {
        UserStack {
            hash: 2,
            ..long_stack(len, outcome, words)
        }
    }

    fn natives(pcs: &[u64]) -> Stack {
        Stack::Frames(pcs.iter().map(|&pc| Frame::Native(pc)).collect())
    }

    #[test]
    fn comm_names_end_at_the_first_nul_or_fill_the_buffer() {
        assert_eq!(comm_name(&thread("bash")), "bash");
        assert_eq!(comm_name(&[b'a'; 16]), "a".repeat(16));
        assert_eq!(comm_name(&[0; 16]), "");
    }

    #[test]
    fn walked_stacks_keep_only_their_len_words_and_never_past_their_array() {
        let mut stacks = WindowStacks::default();
        stacks.add_walked(
            7,
            &long_stack(2, UnwindOutcome::Completed, &[0x10, 0x20, 0x30]),
        );
        // A corrupt length is bounded by the value's array.
        stacks.add_walked(8, &long_stack(u32::MAX, UnwindOutcome::Completed, &[]));

        assert_eq!(stacks.resolve_walked(7).0, natives(&[0x10, 0x20]));
        let Stack::Frames(long) = stacks.resolve_walked(8).0 else {
            panic!("stack 8 was stored");
        };
        assert_eq!(long.len(), MAX_USER_STACK_DEPTH);
    }

    #[test]
    fn walked_stack_words_are_decoded_by_their_kind() {
        let mut stacks = WindowStacks::default();
        let python = python_frame_word(0x7f00_0000_1000, 3);
        stacks.add_walked(
            1,
            &short_stack(2, UnwindOutcome::Completed, &[0x10, python]),
        );
        assert_eq!(
            stacks.resolve_walked(1).0,
            Stack::Frames(vec![Frame::Native(0x10), Frame::Runtime(python, 0)])
        );
        // A HotSpot frame's two words are one frame; a continuation after a native word
        // (what a native walk's garbage could look like) is no frame.
        let [java, more] = scorch_common::hotspot_frame_words(
            scorch_common::HotspotSubtype::Compiled,
            0x7f00_0000_2000,
            0x40,
            9,
        );
        stacks.add_walked(
            2,
            &short_stack(4, UnwindOutcome::Completed, &[java, more, 0x20, more]),
        );
        assert_eq!(
            stacks.resolve_walked(2).0,
            Stack::Frames(vec![
                Frame::Runtime(java, scorch_common::word_payload(more)),
                Frame::Native(0x20)
            ])
        );
    }

    #[test]
    fn sentinels_and_missing_ids_are_absent_or_lost_stacks() {
        let mut stacks = WindowStacks::default();
        stacks.add_walked(1, &short_stack(1, UnwindOutcome::NoRow, &[0x10]));
        stacks.add_trace(1, vec![0xffff_ffff_8100_0000]);
        let completed = UnwindOutcome::Completed as u32;
        assert_eq!(
            stacks.resolve_walked(STACK_ABSENT),
            (Stack::Absent, completed)
        );
        assert_eq!(
            stacks.resolve_walked(STACK_LOST_COLLISION),
            (Stack::Lost, completed)
        );
        assert_eq!(
            stacks.resolve_walked(STACK_LOST_OTHER),
            (Stack::Lost, completed)
        );
        // A key naming a stack its map does not hold: lost, not an early stop.
        assert_eq!(stacks.resolve_walked(2), (Stack::Lost, completed));
        assert_eq!(
            stacks.resolve_walked(1),
            (natives(&[0x10]), UnwindOutcome::NoRow as u32)
        );

        assert_eq!(stacks.resolve_trace(STACK_ABSENT, true), Stack::Absent);
        assert_eq!(
            stacks.resolve_trace(STACK_LOST_COLLISION, true),
            Stack::Lost
        );
        assert_eq!(stacks.resolve_trace(STACK_LOST_OTHER, false), Stack::Lost);
        assert_eq!(stacks.resolve_trace(2, true), Stack::Lost);
        assert_eq!(
            stacks.resolve_trace(1, true),
            Stack::Frames(vec![Frame::Kernel(0xffff_ffff_8100_0000)])
        );
        // The same pcs named as a frame-pointer user stack are native frames.
        assert_eq!(
            stacks.resolve_trace(1, false),
            natives(&[0xffff_ffff_8100_0000])
        );
    }

    #[test]
    fn the_stack_map_is_read_for_the_stacks_it_holds() {
        let counts = [
            (key(1, 5, 9), 1),
            (key(2, 5, STACK_ABSENT), 1),
            (key(3, STACK_LOST_COLLISION, 9), 1),
            (key(4, 6, STACK_LOST_OTHER), 1),
        ];
        // Frame pointers: user and kernel stacks both, each id once, no sentinel.
        assert_eq!(referenced_traces(&counts, &fp()), BTreeSet::from([5, 6, 9]));
        // The program walks user stacks into maps of their own: only kernel stacks.
        assert_eq!(referenced_traces(&counts, &tables()), BTreeSet::from([9]));
    }

    #[test]
    fn a_sample_with_neither_stack_has_its_user_stack_lost() {
        let mut stacks = WindowStacks::default();
        stacks.add_walked(3, &long_stack(0, UnwindOutcome::Completed, &[]));
        stacks.add_trace(9, vec![0xffff_ffff_8100_0000]);
        let counts = [
            // A walk that gave no stack, in user mode.
            (key(1, STACK_ABSENT, STACK_ABSENT), 2),
            // A walk that stored no frame.
            (key(2, 3, STACK_ABSENT), 3),
            // No user stack, a kernel one: as it was.
            (key(3, STACK_ABSENT, 9), 4),
        ];
        let decoded = decode_samples(&counts, &stacks, &tables());
        let stacks: Vec<(&Stack, &Stack)> = decoded
            .samples
            .iter()
            .map(|s| (&s.user, &s.kernel))
            .collect();
        assert_eq!(
            stacks,
            [
                (&Stack::Lost, &Stack::Absent),
                (&Stack::Lost, &Stack::Absent),
                (
                    &Stack::Absent,
                    &Stack::Frames(vec![Frame::Kernel(0xffff_ffff_8100_0000)])
                ),
            ]
        );
    }

    #[test]
    fn samples_resolve_both_stacks_and_name_their_thread() {
        let mut stacks = WindowStacks::default();
        stacks.add_trace(5, vec![0x1000, 0x2000]);
        stacks.add_trace(9, vec![0xffff_ffff_8100_0000]);
        let counts = [(key(1, 5, 9), 3), (key(2, 7, STACK_ABSENT), 4)];

        let decoded = decode_samples(&counts, &stacks, &fp());
        assert_eq!(
            decoded.samples,
            [
                RawSample {
                    tgid: 1,
                    thread: ThreadTag {
                        name: "worker".into(),
                        id: None
                    },
                    user: natives(&[0x1000, 0x2000]),
                    kernel: Stack::Frames(vec![Frame::Kernel(0xffff_ffff_8100_0000)]),
                    count: 3,
                },
                RawSample {
                    tgid: 2,
                    thread: ThreadTag {
                        name: "worker".into(),
                        id: None
                    },
                    // Stack 7 was not in the map: the sample is kept, its stack lost.
                    user: Stack::Lost,
                    kernel: Stack::Absent,
                    count: 4,
                },
            ]
        );
        assert!(decoded.walk_stops.is_empty());
        assert_eq!(decoded.truncated_stacks, 0);

        let with_ids = Control {
            thread_ids: 1,
            ..fp()
        };
        let decoded = decode_samples(&counts, &stacks, &with_ids);
        assert_eq!(decoded.samples[0].thread.id, Some(2));
        assert_eq!(decoded.samples[1].thread.id, Some(3));
    }

    #[test]
    fn walks_that_stopped_early_are_kept_where_they_stopped() {
        let python = python_frame_word(0x7f00_0000_1000, 3);
        let mut stacks = WindowStacks::default();
        stacks.add_walked(1, &short_stack(2, UnwindOutcome::NoRow, &[0x10, 0x20]));
        stacks.add_walked(2, &short_stack(1, UnwindOutcome::ReadFault, &[0x30]));
        stacks.add_walked(3, &short_stack(1, UnwindOutcome::UnsupportedCfa, &[0x40]));
        // Not early stops: a complete walk, one cut at the depth limit, one that went on by
        // frame pointers.
        stacks.add_walked(4, &short_stack(1, UnwindOutcome::Completed, &[0x50]));
        stacks.add_walked(5, &short_stack(1, UnwindOutcome::FrameLimit, &[0x60]));
        stacks.add_walked(6, &short_stack(1, UnwindOutcome::NoMapping, &[0x70]));
        // An outcome the agent does not know, and a last frame without a pc: nowhere to
        // point at.
        let mut unknown = short_stack(1, UnwindOutcome::NoRow, &[0x80]);
        unknown.outcome = UNWIND_OUTCOMES;
        stacks.add_walked(7, &unknown);
        stacks.add_walked(8, &short_stack(2, UnwindOutcome::NoRow, &[0x90, python]));
        let counts: Vec<(StackKey, u64)> = (1..=8)
            .map(|id| (key(100 + id as u32, id, STACK_ABSENT), 10 * id as u64))
            .collect();

        let decoded = decode_samples(&counts, &stacks, &tables());
        assert_eq!(
            decoded.walk_stops,
            [
                WalkStop {
                    tgid: 101,
                    pc: 0x20,
                    reason: UnwindOutcome::NoRow,
                    count: 10
                },
                WalkStop {
                    tgid: 102,
                    pc: 0x30,
                    reason: UnwindOutcome::ReadFault,
                    count: 20
                },
                WalkStop {
                    tgid: 103,
                    pc: 0x40,
                    reason: UnwindOutcome::UnsupportedCfa,
                    count: 30
                },
            ]
        );
        assert_eq!(decoded.samples.len(), 8);
        assert_eq!(decoded.samples[0].user, natives(&[0x10, 0x20]));
    }

    #[test]
    fn stacks_at_the_depth_limit_count_as_truncated_by_their_samples() {
        let deep: Vec<u64> = (1..=MAX_USER_STACK_DEPTH as u64).collect();
        let mut stacks = WindowStacks::default();
        stacks.add_walked(
            1,
            &long_stack(
                MAX_USER_STACK_DEPTH as u32,
                UnwindOutcome::FrameLimit,
                &deep,
            ),
        );
        stacks.add_walked(
            2,
            &long_stack(MAX_STACK_DEPTH as u32, UnwindOutcome::Completed, &deep),
        );
        stacks.add_trace(3, deep[..MAX_STACK_DEPTH].to_vec());
        stacks.add_trace(4, deep[..MAX_STACK_DEPTH - 1].to_vec());
        let counts = [
            // A walked stack at its own limit.
            (key(1, 1, 4), 2),
            // A walked stack as deep as the kernel's limit, not its own: whole.
            (key(2, 2, 4), 100),
            // A kernel stack at the kernel's limit.
            (key(3, 2, 3), 5),
        ];
        assert_eq!(
            decode_samples(&counts, &stacks, &tables()).truncated_stacks,
            7
        );

        // Under frame pointers the user stack comes from the kernel's map and its limit.
        let counts = [(key(1, 3, STACK_ABSENT), 11), (key(2, 4, 4), 100)];
        assert_eq!(decode_samples(&counts, &stacks, &fp()).truncated_stacks, 11);
    }

    #[test]
    fn seen_processes_give_names_and_origins_by_process() {
        let seen = [
            (
                10,
                SeenProcess {
                    comm: thread("cc1"),
                    cgroup_id: 77,
                    started_ns: 123,
                },
            ),
            (
                11,
                SeenProcess {
                    comm: thread("sh"),
                    cgroup_id: 0,
                    started_ns: 0,
                },
            ),
        ];
        let (comms, origins) = decode_processes(seen);
        assert_eq!(
            comms,
            HashMap::from([(10, "cc1".into()), (11, "sh".into())])
        );
        assert_eq!(
            origins,
            HashMap::from([
                (
                    10,
                    Origin {
                        cgroup_id: 77,
                        started_ns: 123
                    }
                ),
                (11, Origin::default()),
            ])
        );
    }

    #[test]
    fn counters_are_summed_over_cpus_within_their_generations_run() {
        const KINDS: usize = LOSS_KINDS as usize;
        // A per-CPU array of three runs on two CPUs: counter `i` of run `r` holds
        // `100 * r + i` on CPU 0 and 1 on CPU 1.
        let array: Vec<Vec<u64>> = (0..3 * KINDS)
            .map(|index| vec![100 * (index / KINDS) as u64 + (index % KINDS) as u64, 1])
            .collect();
        let run = |r: usize| -> Vec<u64> {
            (0..KINDS)
                .map(|kind| sum_cpus(&array[counter_index(r, KINDS, kind) as usize]))
                .collect()
        };
        assert_eq!(run(0), [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(run(1), [101, 102, 103, 104, 105, 106, 107]);
        assert_eq!(run(2), [201, 202, 203, 204, 205, 206, 207]);
    }

    #[test]
    fn off_cpu_walks_add_what_they_gained_since_the_previous_drain() {
        let mut previous = [0; 3];
        let gain = |mut window: [u64; 3], off_cpu: [u64; 3], previous: &mut [u64; 3]| {
            add_off_cpu_gain(&mut window, &off_cpu, previous);
            window
        };
        assert_eq!(gain([1, 0, 0], [5, 2, 0], &mut previous), [6, 2, 0]);
        assert_eq!(previous, [5, 2, 0]);
        // Nothing new: the cumulative counts are not counted twice.
        assert_eq!(gain([0, 0, 0], [5, 2, 0], &mut previous), [0, 0, 0]);
        assert_eq!(gain([0, 4, 0], [8, 3, 1], &mut previous), [3, 5, 1]);
        // A counter that went back (its map started over) gains nothing this window, and
        // counts from its new value on.
        assert_eq!(gain([2, 0, 0], [1, 3, 1], &mut previous), [2, 0, 0]);
        assert_eq!(previous, [1, 3, 1]);
        assert_eq!(gain([0, 0, 0], [4, 3, 1], &mut previous), [3, 0, 0]);
    }

    #[test]
    fn the_stack_map_counts_user_collisions_only_when_it_holds_user_stacks() {
        let mut by_kind = [0; LOSS_KINDS as usize];
        by_kind[Loss::KernelStackCollision as usize] = 3;
        by_kind[Loss::UserStackCollision as usize] = 20;
        by_kind[Loss::KernelStackError as usize] = 400;
        by_kind[Loss::CountsMapFull as usize] = 5000;
        assert_eq!(stack_map_collisions(&by_kind, &fp()), 23);
        assert_eq!(stack_map_collisions(&by_kind, &tables()), 3);
    }

    #[test]
    fn a_user_stack_map_takes_the_errors_only_when_the_window_filled_it() {
        assert_eq!(user_stack_losses(1024, 1024, 9), 9);
        assert_eq!(user_stack_losses(1023, 1024, 9), 0);
        assert_eq!(user_stack_losses(1024, 1024, 0), 0);
    }
}
