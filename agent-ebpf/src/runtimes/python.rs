//! CPython frames, walked where the native walk meets the interpreter's eval loop.
//!
//! The agent marks `_PyEval_EvalFrameDefault` (and the parts the compiler split off it) as
//! mappings of their own owned by [`RuntimeId::Python`](scorch_common::RuntimeId) when it
//! writes a process's `PYTHON_PROCS` entry. When the native walk meets a frame there, it
//! hands the frame over ([`walk`]): the frame is replaced by the Python frames this call of
//! the eval loop runs, innermost first, and the native walk goes on from the eval loop's own
//! C frame. A per-walk cursor ([`PythonWalk`], in `PYTHON_WALK`) remembers where the chain
//! stopped, so the next eval frame further down continues it.
//!
//! The first eval frame finds the thread's state from the thread pointer (`task::
//! thread_pointer`, x86-64's `fs` base): through CPython's `autoTSSkey` (3.11 to 3.14), the
//! way glibc's `pthread_getspecific` does (the key's value sits in the thread's `struct
//! pthread`, at the thread pointer), or in the thread-local 3.15 keeps it in, at a fixed
//! offset from the thread pointer.
//! Per Python frame the stack gets one word: the code object's address and the instruction's
//! offset ([`python_frame_word`]). No string is read here; the agent names code objects.

use core::ffi::c_void;

use aya_ebpf::{
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use scorch_common::{
    python_frame_word, PythonCount, PythonProc, COUNTER_RUNS, MAX_PYTHON_PROCS,
    MAX_USER_STACK_DEPTH, PYTHON_COUNTS, PYTHON_ENTRY_CSTACK_OWNER, PYTHON_ENTRY_IS_ENTRY,
    PYTHON_NO_CFRAME,
};

use crate::shared::{
    counters,
    loops::repeat,
    stack::{push_frame, WalkState, WALK},
    task,
    user::{read_u32, read_u64, read_u8},
};

/// Processes running a CPython interpreter, written by the agent; not preallocated.
#[map]
static PYTHON_PROCS: HashMap<u32, PythonProc> =
    HashMap::with_max_entries(MAX_PYTHON_PROCS, crate::shared::flags::BPF_F_NO_PREALLOC);

/// Per-CPU counters indexed by [`PythonCount`]; cumulative, the agent takes differences.
#[map]
static PYTHON_COUNTS_MAP: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(PYTHON_COUNTS * COUNTER_RUNS, 0);

/// Python's part of a walk: where its chain stopped. One per `WALK` slot, like the walk.
#[repr(C)]
struct PythonWalk {
    /// The walk (`WalkState::serial`) this state belongs to; another one starts afresh.
    serial: u64,
    /// Non-zero once the walk looked for the thread's Python frames.
    started: u32,
    /// Explicit padding.
    _reserved: u32,
    /// The next Python frame to emit, at the next eval-loop frame; 0 when there is none.
    frame: u64,
}

/// Python's per-walk state, by the walk's `WALK` slot.
#[map]
static PYTHON_WALK: PerCpuArray<PythonWalk> = PerCpuArray::with_max_entries(2, 0);

/// After an exec the process runs another program: forget its interpreter.
#[inline(always)]
pub fn forget(tgid: u32) {
    let _ = PYTHON_PROCS.remove(tgid);
}

#[inline(always)]
fn count(run: u32, kind: PythonCount, n: u64) {
    counters::add(&PYTHON_COUNTS_MAP, run * PYTHON_COUNTS + kind as u32, n);
}

/// The running thread's innermost Python frame, through its thread state; `None` when the
/// thread has none (not a Python thread, not started) or it could not be read.
#[inline(always)]
fn current_frame(python: &PythonProc) -> Option<u64> {
    let thread_pointer = task::thread_pointer()?;
    let slot = if python.thread_local != 0 {
        python.thread_local as i64 as u64
    } else {
        let key = read_u32(python.thread_key)?;
        if key >= python.specific_keys {
            return None;
        }
        ((key as u64 + python.specific_bias as u64) << (python.specific_shift & 15))
            .wrapping_add(python.specific_value as i64 as u64)
    };
    let tstate = read_u64(thread_pointer.wrapping_add(slot))?;
    if tstate == 0 {
        return None;
    }
    let holder = if python.tstate_cframe == PYTHON_NO_CFRAME {
        tstate
    } else {
        read_u64(tstate.wrapping_add(python.tstate_cframe as u64))?
    };
    read_u64(holder.wrapping_add(python.current_frame as u64))
}

/// One eval call's chain being emitted.
///
/// Nothing here may count the frames: a counter on the stack is a known constant that differs
/// at each iteration, so the verifier could never find a state it had seen and walked the loop
/// once per count, then the rest of the walk once per exit: work that grows with the frame
/// limit, paid in system time at every load. The count lives in the walk's map value
/// (`WalkState::runtime_frames`), which the verifier does not track, so the loop is checked in
/// a few passes whatever the limit.
#[repr(C)]
struct Chain {
    walk: *mut WalkState,
    python: *const PythonProc,
    /// The next frame to look at.
    frame: u64,
}

/// One Python frame of a [`Chain`]. Returns 1 when the chain of this eval call ends.
extern "C" fn chain_step(_index: u64, context: *mut c_void) -> i64 {
    // SAFETY: `walk` passes its `Chain`, whose pointers are map values.
    let chain = unsafe { &mut *(context as *mut Chain) };
    chain_frame(chain)
}

#[inline(always)]
fn chain_frame(chain: &mut Chain) -> i64 {
    // SAFETY: `walk` passes its `Chain`, whose pointers are map values.
    let (walk, python) = unsafe { (&mut *chain.walk, &*chain.python) };
    let frame = chain.frame;
    if frame == 0 {
        return 1;
    }
    let Some(previous) = read_u64(frame.wrapping_add(python.frame_previous as u64)) else {
        count(walk.counters, PythonCount::FrameReadFault, 1);
        chain.frame = 0;
        return 1;
    };
    let Some(marker) = read_u8(frame.wrapping_add(python.entry_offset as u64)) else {
        count(walk.counters, PythonCount::FrameReadFault, 1);
        chain.frame = 0;
        return 1;
    };
    // 3.12+: the shim frame the eval loop pushed on entry ends this call's chain.
    if python.entry_kind == PYTHON_ENTRY_CSTACK_OWNER && marker == python.entry_value {
        chain.frame = previous;
        return 1;
    }
    let Some(code) = read_u64(frame.wrapping_add(python.frame_code as u64)) else {
        count(walk.counters, PythonCount::FrameReadFault, 1);
        chain.frame = 0;
        return 1;
    };
    let code = code & python.code_mask;
    // The agent checks the code object's type when it names it (a frame whose code is not
    // one shows as an unknown code object there, never as another function's name): one read
    // fewer a frame here, where the reads are what a deep stack costs.
    let word = if code != 0 {
        let instr = read_u64(frame.wrapping_add(python.frame_instr as u64)).unwrap_or(0);
        let start = code.wrapping_add(python.code_adaptive as u64);
        let units = if instr >= start {
            (instr - start) / 2
        } else {
            0
        };
        python_frame_word(code, units)
    } else {
        count(walk.counters, PythonCount::UnknownCode, 1);
        python_frame_word(0, 0)
    };
    if !push_frame(walk, word) {
        count(walk.counters, PythonCount::FrameLimit, 1);
        chain.frame = 0;
        return 1;
    }
    walk.runtime_frames += 1;
    chain.frame = previous;
    // 3.11: the call's first frame is marked, and emitted.
    if python.entry_kind == PYTHON_ENTRY_IS_ENTRY && marker != 0 {
        return 1;
    }
    0
}

/// Replaces the eval-loop frame the walk in `WALK`'s `slot` is at with the Python frames of
/// its eval call; returns 0.
///
/// A global function (not static, never inlined, only scalars in and out), so the verifier
/// checks Python's walk once, on its own, whatever the native walk's states: its work is
/// added to the walk's, not multiplied by it.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn scorch_python_walk(slot: u32) -> u32 {
    if let Some(walk) = WALK.get_ptr_mut(slot) {
        // SAFETY: this CPU's walk state, which the walk that called this has handed over.
        walk_at(unsafe { &mut *walk });
    }
    0
}

/// The eval call's Python frames in place of the frame `walk` is at. The first one of a walk
/// finds the thread's innermost frame.
#[inline(always)]
fn walk_at(walk: &mut WalkState) {
    // No entry (the map was full, or the process exec'd since its mappings were written):
    // the frame stays native.
    let Some(python) = PYTHON_PROCS.get_ptr(walk.tgid) else {
        return;
    };
    let Some(cursor) = PYTHON_WALK.get_ptr_mut(walk.slot) else {
        return;
    };
    // SAFETY: map values, alive while the program runs; the cursor is this CPU's, and the
    // interpreter entry is only read.
    let (python, cursor) = unsafe { (&*python, &mut *cursor) };
    if cursor.serial != walk.serial {
        cursor.serial = walk.serial;
        cursor.started = 0;
        cursor.frame = 0;
    }
    if cursor.started == 0 {
        cursor.started = 1;
        match current_frame(python) {
            Some(frame) => cursor.frame = frame,
            None => count(walk.counters, PythonCount::NoThreadState, 1),
        }
    }
    if cursor.frame == 0 {
        return;
    }
    let before = walk.runtime_frames;
    let mut chain = Chain {
        walk: walk as *mut WalkState,
        python: python as *const PythonProc,
        frame: cursor.frame,
    };
    repeat(MAX_USER_STACK_DEPTH as u32, chain_step, &mut chain);
    cursor.frame = chain.frame;
    let emitted = walk.runtime_frames.wrapping_sub(before);
    if emitted > 0 {
        walk.claimed = 1;
        count(walk.counters, PythonCount::Frames, u64::from(emitted));
    }
}
