//! The user-stack walk with unwind tables (`Control::unwind == UNWIND_TABLES`): one
//! `bpf_loop` iteration per step, each either a native frame (`native`) or, when the last
//! native frame lay in code a runtime owns, that runtime's walk (`crate::runtimes`). Each walk
//! ends with one counted [`UnwindOutcome`]; a walk that cannot finish keeps the frames it
//! found, never a guessed caller.
//!
//! Every loop is a `bpf_loop` (5.17+) callback: one step per iteration of the walk, one probe
//! per iteration of the two binary searches inside a native step, one frame per iteration of
//! a runtime's chain. The verifier then checks one step and one probe, not the paths through
//! 256 frames of unrolled searches. A runtime's walk is a branch of the step taken in an
//! iteration of its own, never inside the native frame's code: the verifier's work is the
//! native step's plus each runtime's, not their product.

mod native;

use core::ffi::c_void;

use aya_ebpf::{
    bindings::pt_regs,
    helpers::{bpf_get_current_task_btf, bpf_task_pt_regs},
    macros::map,
    maps::PerCpuArray,
    programs::PerfEventContext,
};
use scorch_common::{
    ProcMappings, UnwindOutcome, COUNTER_RUNS, EVENT_UNKNOWN_PC, EVENT_UNKNOWN_PROCESS,
    MAX_USER_STACK_DEPTH, PROCS_NO_MAPPINGS, ROW_CACHE_SLOTS, UNWIND_OUTCOMES,
};

use crate::{
    arch, runtimes,
    shared::{
        counters, events,
        loops::repeat,
        stack::{UserRegs, WalkState, WALK, WALKING, WALK_SAMPLE},
    },
};

pub use native::mapping_placed;

/// Per-CPU counters, a run of [`UnwindOutcome`] kinds per generation and one for the off-CPU
/// program's walks (`COUNTER_RUNS`).
#[map]
static UNWIND_OUTCOMES_COUNT: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(UNWIND_OUTCOMES * COUNTER_RUNS, 0);

/// What each loop iteration needs: pointers to map values, so no iteration looks them up.
#[repr(C)]
struct LoopContext {
    state: *mut WalkState,
    procs: *const ProcMappings,
}

/// The user registers: the sample's when it interrupted user mode, else the task's saved
/// ones (a sample in a system call or a page fault). `None` for kernel threads.
#[inline(always)]
fn user_regs(ctx: &PerfEventContext, user_mode: bool) -> Option<UserRegs> {
    if user_mode {
        return Some(arch::sample_regs(ctx));
    }
    current_user_regs()
}

/// The task's `pt_regs` as read by [`current_user_regs`], per CPU: on the stack they would
/// take a third of the 512 bytes the verifier allows the sampler and the calls beneath it.
#[map]
static SAVED_REGS: PerCpuArray<pt_regs> = PerCpuArray::with_max_entries(1, 0);

/// The current task's saved user registers, from its kernel stack's `pt_regs`; `None` for
/// kernel threads.
#[inline(always)]
pub fn current_user_regs() -> Option<UserRegs> {
    // SAFETY: helpers with no memory arguments; the result is checked before use.
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const pt_regs;
    if regs.is_null() {
        return None;
    }
    let saved = SAVED_REGS.get_ptr_mut(0)?;
    // SAFETY: bpf_probe_read_kernel checks the source and fills this CPU's map value.
    let read = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_kernel(
            saved as *mut c_void,
            core::mem::size_of::<pt_regs>() as u32,
            regs as *const c_void,
        )
    };
    if read != 0 {
        return None;
    }
    // SAFETY: this CPU's value, just filled.
    arch::user_regs(unsafe { &*saved })
}

/// Walks the current task's user stack into `WALK`, counting in generation `generation`'s run;
/// false when the task has no user stack. [`walked`] gives the walk back.
///
/// Not the state itself: what the caller keeps alive across the walk's loop is in each state
/// the verifier compares, and a pointer kept in an `Option` through the caller's other
/// branches can reach it as a scalar.
#[inline(always)]
pub fn walk(ctx: &PerfEventContext, tgid: u32, user_mode: bool, generation: u32) -> bool {
    user_regs(ctx, user_mode)
        .and_then(|regs| walk_from(regs, tgid, WALK_SAMPLE, generation))
        .is_some()
}

/// The sampler's walk, when [`walk`] returned true.
#[inline(always)]
pub fn walked(walked: bool) -> Option<&'static mut WalkState> {
    if !walked {
        return None;
    }
    // SAFETY: this CPU's slot; the program cannot run twice at once on one CPU.
    WALK.get_ptr_mut(WALK_SAMPLE)
        .map(|state| unsafe { &mut *state })
}

/// Walks the current task's user stack from `regs` into `WALK`'s `slot`, counting in the
/// counter arrays' run `counters`.
#[inline(always)]
pub fn walk_from(
    regs: UserRegs,
    tgid: u32,
    slot: u32,
    counters: u32,
) -> Option<&'static mut WalkState> {
    if regs.pc == 0 {
        return None;
    }
    let state = WALK.get_ptr_mut(slot)?;
    // SAFETY: this CPU's slot; the program cannot run twice at once on one CPU.
    let walk = unsafe { &mut *state };
    walk.pc = regs.pc;
    walk.sp = regs.sp;
    walk.fp = regs.fp;
    walk.bcp = regs.bcp;
    walk.unknown_pc = 0;
    walk.fp_known = 1;
    walk.lr = regs.lr;
    walk.lr_valid = u32::from(arch::LINK_REGISTER);
    walk.return_address = 0;
    walk.stop = WALKING;
    clear(&mut walk.no_mapping);
    clear(&mut walk.table_pending);
    clear(&mut walk.table_evicted);
    clear(&mut walk.no_row_step);
    clear(&mut walk.no_row_next);
    clear(&mut walk.runtime);
    clear(&mut walk.handed);
    clear(&mut walk.claimed);
    clear(&mut walk.runtime_frames);
    clear(&mut walk.stepped);
    walk.counters = counters;
    walk.tgid = tgid;
    walk.slot = slot;
    walk.serial = walk.serial.wrapping_add(1);
    walk.cache_base = slot * ROW_CACHE_SLOTS;
    walk.stack.len = 0;
    walk.stack.tgid = 0;
    walk.stack.flags = 0;
    walk.window_words = 0;
    walk.last_mapping = 0;
    walk.stack.hash = 0xcbf2_9ce4_8422_2325;

    // Read before the process's mappings: a walk that sees a new epoch then also sees the
    // mappings the agent rewrote before it freed their rows (the row cache's epoch).
    walk.cache_tag = native::ROW_EPOCH
        .get(0)
        .copied()
        .unwrap_or(0)
        .wrapping_add(1);
    // A process the map does not hold walks with its entry of no mappings, a value of the
    // same map (`PROCS_NO_MAPPINGS`). Whether it was known is kept in the walk's state, not
    // in a register: a value live across the loop is in each state the verifier compares.
    let map = native::procs()?;
    let known = map.get_ptr(tgid);
    walk.known = u32::from(known.is_some());
    let procs = match known {
        Some(procs) => procs,
        None => map.get_ptr(PROCS_NO_MAPPINGS)?,
    };
    // Twice the frames: a frame without a row takes two iterations, and so does a frame
    // handed to a runtime (its walk, then the native step past it).
    repeat(
        2 * MAX_USER_STACK_DEPTH as u32,
        step,
        &mut LoopContext { state, procs },
    );
    if walk.stop == WALKING {
        walk.stop = UnwindOutcome::FrameLimit as u32;
    }
    walk.stack.outcome = walk.stop;
    count(counters, walk.stop);
    if walk.no_mapping != 0 {
        count(counters, UnwindOutcome::NoMapping as u32);
    }
    if walk.table_pending != 0 {
        count(counters, UnwindOutcome::TableNotLoaded as u32);
    }
    if walk.table_evicted != 0 {
        count(counters, UnwindOutcome::TableEvicted as u32);
    }
    if walk.no_row_step != 0 {
        count(counters, UnwindOutcome::FramePointerNoRow as u32);
    }
    if walk.known == 0 {
        events::notify(tgid, EVENT_UNKNOWN_PROCESS, regs.pc);
    } else if walk.no_mapping != 0 {
        events::notify(tgid, EVENT_UNKNOWN_PC, walk.unknown_pc);
    }
    Some(walk)
}

/// Zeroes `field` with a store of its own. LLVM merges a run of zero stores into a call of
/// `memset`, a byte loop the verifier walks once per byte, at every state it reaches the call
/// with.
#[inline(always)]
fn clear(field: &mut u32) {
    // SAFETY: a plain store to a field of this CPU's walk state.
    unsafe { core::ptr::write_volatile(field, 0) };
}

/// One step of the walk: the runtime's walk the last native frame handed over, or the next
/// native frame. Returns 1 to end the loop.
extern "C" fn step(_index: u64, context: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes back the context `walk_from` gave it, whose pointers are map
    // values.
    let context = unsafe { &*(context as *const LoopContext) };
    // SAFETY: as above; this CPU's walk state.
    let (walk, procs) = unsafe { (&mut *context.state, &*context.procs) };
    let runtime = walk.runtime;
    let outcome = if runtime != 0 {
        walk.runtime = 0;
        runtimes::walk(runtime, walk);
        WALKING
    } else {
        native::frame(walk, procs)
    };
    if outcome == WALKING {
        0
    } else {
        walk.stop = outcome;
        1
    }
}

#[inline(always)]
fn count(run: u32, outcome: u32) {
    counters::add(&UNWIND_OUTCOMES_COUNT, run * UNWIND_OUTCOMES + outcome, 1);
}

/// After an exec the process's mappings are another program's: forget them and what its
/// runtimes knew of it, so its next sample asks the agent again.
#[inline(always)]
pub fn forget_process(tgid: u32) {
    native::forget(tgid);
    runtimes::forget(tgid);
    events::forget(tgid);
}
