//! The perf-event programs `sample` and `sample_fp` and their per-window maps: per sample,
//! the kernel stack and the user stack (walked by `crate::walk` with the binaries' unwind
//! tables, or by frame pointers) and a count keyed by process, thread and the two stack ids,
//! in one of two map generations chosen by `CONTROL.generation` (the drain protocol is at the
//! top of `agent/src/pipeline/drain.rs`).

use core::intrinsics::{atomic_xadd, AtomicOrdering};

use aya_ebpf::{
    bindings::{BPF_F_USER_STACK, BPF_NOEXIST},
    btf_maps,
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid},
    macros::{btf_map, map, perf_event},
    maps::{HashMap, PerCpuArray},
    programs::{tracing::StackIdContext, PerfEventContext},
};
use aya_log_ebpf::warn;
use scorch_common::{
    Loss, RunSeq, SeenProcess, StackKey, LOSS_KINDS, MAX_COMMS, MAX_COUNT_KEYS, STACK_ABSENT,
    STACK_LOST_COLLISION, STACK_LOST_OTHER, UNWIND_TABLES,
};

use crate::{
    arch,
    shared::{
        control::{self, CONTROL},
        counters,
        stack::{self, SeenStackMap, StoreError},
        task,
    },
    walk,
};

const EEXIST: i32 = 17;
const EFAULT: i32 = 14;
const E2BIG: i32 = 7;

/// Per-CPU count of samples the PID filter discarded before any stack was walked.
#[map]
static FILTERED: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Per-CPU run bracket; see `RunSeq`.
#[map]
static RUN_SEQ: PerCpuArray<RunSeq> = PerCpuArray::with_max_entries(1, 0);

/// Per-CPU loss counters, a run of `Loss` kinds per generation (see `COUNTER_RUNS`); the agent
/// takes and zeroes a generation's run once it is quiescent.
#[map]
static LOSSES: PerCpuArray<u64> = PerCpuArray::with_max_entries(LOSS_KINDS * 2, 0);

// Two generations of the per-window maps. The agent sizes the stack maps at load time from the
// CPU count, frequency and window; the value here is only the default.
#[map]
static COUNTS_0: HashMap<StackKey, u64> = HashMap::with_max_entries(MAX_COUNT_KEYS, 0);
#[map]
static COUNTS_1: HashMap<StackKey, u64> = HashMap::with_max_entries(MAX_COUNT_KEYS, 0);
/// A generation's stack-trace map (kernel stacks, and user stacks under `--unwind fp`).
type StackMap = btf_maps::StackTrace<1>;
/// The two generations' stack-trace maps, by generation. The agent creates each, sized by the
/// distinct stacks its windows store, and replaces it while its generation is idle: sized at
/// load time from the samples a window could hold, they took megabytes on a quiet host, and
/// hundreds at 999 Hz, for a few dozen distinct stacks.
#[btf_map]
static STACKS: btf_maps::ArrayOfMaps<StackMap, 2> = btf_maps::ArrayOfMaps::new();
/// A generation's processes, each as its first sample of the window saw it ([`SeenProcess`]).
#[map]
static COMMS_0: HashMap<u32, SeenProcess> = HashMap::with_max_entries(MAX_COMMS, 0);
#[map]
static COMMS_1: HashMap<u32, SeenProcess> = HashMap::with_max_entries(MAX_COMMS, 0);

/// The two generations' records of the walked stacks they sent, by generation; the agent
/// creates and replaces them as it does `STACKS`'s.
#[btf_map]
static SEEN_STACKS: btf_maps::ArrayOfMaps<SeenStackMap, 2> = btf_maps::ArrayOfMaps::new();

/// The maps of one generation.
struct Generation {
    counts: &'static HashMap<StackKey, u64>,
    stacks: &'static StackMap,
    seen_stacks: &'static SeenStackMap,
}

#[perf_event]
pub fn sample(ctx: PerfEventContext) -> u32 {
    run::<true>(&ctx)
}

/// The same program without the unwinder's code: for `--unwind fp`, and for kernels whose
/// verifier refuses the unwinder (6.1's gives up at its million instructions), so that they
/// still sample with frame pointers.
#[perf_event]
pub fn sample_fp(ctx: PerfEventContext) -> u32 {
    run::<false>(&ctx)
}

#[inline(always)]
fn run<const TABLES: bool>(ctx: &PerfEventContext) -> u32 {
    let Some(seq) = RUN_SEQ.get_ptr_mut(0) else {
        return 0;
    };
    let seq = seq.cast::<u64>();
    // SAFETY: the pointer is this CPU's slot of a per-CPU array map value, valid for the whole
    // run, and u64-aligned. The atomic adds are full barriers, so the read of the generation
    // inside `try_sample` cannot move before the first one nor the map writes after the second.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(seq, 1) };
    if let Err(err) = try_sample::<TABLES>(ctx) {
        warn!(ctx, "scorch sampler: map update failed: {}", err);
    }
    // SAFETY: as above.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::SeqCst }>(seq, 1) };
    0
}

#[inline(always)]
fn try_sample<const TABLES: bool>(ctx: &PerfEventContext) -> Result<(), i64> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    let Some(control) = CONTROL.get(0) else {
        return Ok(());
    };
    // Idle (the per-CPU swapper, tid 0) would dominate every profile of a quiet machine.
    if tid == 0 && control.include_idle == 0 {
        return Ok(());
    }
    // The filter runs before any stack is walked so unwanted processes cost one lookup.
    if !control::process_wanted(control, tgid) {
        counters::add(&FILTERED, 0, 1);
        return Ok(());
    }
    // Read once: the agent may flip it while this run goes on, and every map and counter this
    // run writes must be of one generation.
    // SAFETY: `control` points into a map value; the read is of a plain u32.
    // The agent writes 0 or 1. Masked, not compared: a comparison compiles to a branch that
    // makes the slot a constant on each side, and the verifier then checks all that follows
    // (the user walk with its loop) once for each.
    let slot = unsafe { core::ptr::read_volatile(&control.generation) } & 1;
    // A sample taken in user mode has no kernel stack: skip asking for one.
    let user_mode = arch::interrupted_user_mode(ctx);
    let kernel_stack_id = if user_mode {
        STACK_ABSENT
    } else {
        let Some(stacks) = STACKS.get(slot) else {
            return Ok(());
        };
        stack_id(
            ctx,
            stacks,
            0,
            slot,
            Loss::KernelStackCollision,
            Loss::KernelStackError,
        )
    };
    // The user walk before the generation's other maps are looked up: what stays live across
    // the walk's loop is in every state of it the verifier compares and keeps.
    // SAFETY: as above.
    let tables = TABLES && unsafe { core::ptr::read_volatile(&control.unwind) } == UNWIND_TABLES;
    let walked = tables && walk::walk(ctx, tgid, user_mode, slot);
    // The agent fills every slot before it attaches the program.
    let (Some(stacks), Some(seen_stacks)) = (STACKS.get(slot), SEEN_STACKS.get(slot)) else {
        return Ok(());
    };
    let generation = if slot == 0 {
        Generation {
            counts: &COUNTS_0,
            stacks,
            seen_stacks,
        }
    } else {
        Generation {
            counts: &COUNTS_1,
            stacks,
            seen_stacks,
        }
    };
    let user_stack_id = if tables {
        match walk::walked(walked) {
            None => STACK_ABSENT,
            Some(walk) => match stack::store_stack(generation.seen_stacks, walk, tgid, slot) {
                Ok(id) => id,
                Err(StoreError::Collision) => {
                    count_loss(slot, Loss::UserStackCollision);
                    STACK_LOST_COLLISION
                }
                Err(StoreError::Refused) => {
                    count_loss(slot, Loss::UserStackError);
                    STACK_LOST_OTHER
                }
                Err(StoreError::RingFull) => {
                    count_loss(slot, Loss::UserStackRingFull);
                    STACK_LOST_OTHER
                }
            },
        }
    } else {
        stack_id(
            ctx,
            generation.stacks,
            u64::from(BPF_F_USER_STACK),
            slot,
            Loss::UserStackCollision,
            Loss::UserStackError,
        )
    };
    // The current task is the thread, so its comm is the thread's name; read for every
    // sample, since it is part of the key (a copy of 16 bytes, no lookup).
    let mut key = StackKey {
        tgid,
        // Zero unless asked for: ids would split every stack by thread, one key per thread
        // of a pool, for a label few want.
        tid: if control.thread_ids != 0 { tid } else { 0 },
        user_stack_id,
        kernel_stack_id,
        thread: [0; 16],
    };
    task::current_comm_into(&mut key.thread);

    if let Some(count) = generation.counts.get_ptr_mut(key) {
        bump(count);
        return Ok(());
    }
    // A new key: the first sample of this stack in this window. Every process sampled in a
    // window passes here at least once, so this is where its name is recorded, off the
    // common path.
    scorch_record_comm(slot);
    match generation.counts.insert(key, 1u64, u64::from(BPF_NOEXIST)) {
        Ok(()) => Ok(()),
        // Another CPU inserted the same key between our lookup and insert.
        Err(err) if err == -EEXIST => {
            if let Some(count) = generation.counts.get_ptr_mut(key) {
                bump(count);
            }
            Ok(())
        }
        Err(err) => {
            count_loss(slot, Loss::CountsMapFull);
            // -E2BIG is the expected "map full"; anything else is worth a log line.
            if err == -E2BIG {
                Ok(())
            } else {
                Err(err as i64)
            }
        }
    }
}

#[inline(always)]
fn bump(count: *mut u64) {
    // SAFETY: `count` points into a map value that stays allocated while this program runs;
    // several CPUs may bump the same key, hence the atomic add.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(count, 1) };
}

#[inline(always)]
fn stack_id(
    ctx: &PerfEventContext,
    stacks: &StackMap,
    flags: u64,
    slot: u32,
    collision: Loss,
    error: Loss,
) -> i32 {
    match ctx.get_stackid(stacks, flags) {
        Ok(id) => id as i32,
        // No stack of this kind: a kernel thread has no user stack, and a sample taken in
        // user mode has no kernel stack. Not a loss.
        Err(err) if err == -EFAULT => STACK_ABSENT,
        Err(err) if err == -EEXIST => {
            count_loss(slot, collision);
            STACK_LOST_COLLISION
        }
        Err(_) => {
            count_loss(slot, error);
            STACK_LOST_OTHER
        }
    }
}

/// Records the current process in generation `slot`'s `COMMS` map, unless it is there: its
/// leader's name (the thread's, `thread`, without the task offsets), cgroup and start.
///
/// A global function (not static, never inlined, only scalars in and out), so the verifier
/// checks it once, on its own, and at each call only that its argument is a scalar. Inlined,
/// it was checked again for every state the sampler reaches its new-key path with, and its
/// reads of the leader's fields (each a branch on success) made that the sampler's largest
/// increase in the verifier's work.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn scorch_record_comm(slot: u32) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let comms = if slot & 1 == 0 { &COMMS_0 } else { &COMMS_1 };
    if comms.get_ptr(tgid).is_some() {
        return 0;
    }
    let mut seen = SeenProcess {
        comm: [0; 16],
        // SAFETY: a helper with no arguments.
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        started_ns: 0,
    };
    // The leader's name, else the thread's (without the task offsets, or a read failed).
    match task::leader_comm_into(&mut seen.comm) {
        Some(started_ns) => seen.started_ns = started_ns,
        None => task::current_comm_into(&mut seen.comm),
    }
    // -EEXIST means another CPU recorded it first, which is fine.
    if let Err(err) = comms.insert(tgid, seen, u64::from(BPF_NOEXIST)) {
        if err != -EEXIST {
            count_loss(slot & 1, Loss::CommMapFull);
        }
    }
    0
}

/// Counts a loss in generation `slot`'s run.
#[inline(always)]
fn count_loss(slot: u32, loss: Loss) {
    counters::add(&LOSSES, slot * LOSS_KINDS + loss as u32, 1);
}
