//! CPython frames, walked where the native walk meets the interpreter's eval loop.
//!
//! When a frame's pc lies in `_PyEval_EvalFrameDefault` (or a part the compiler split off it)
//! of a process in `PYTHON_PROCS`, that native frame is replaced by the Python frames this
//! call of the eval loop runs, innermost first, and the native walk goes on from the eval
//! loop's own C frame. A per-walk cursor (`WalkState::python_frame`) remembers where the
//! chain stopped, so the next eval frame further down continues it.
//!
//! The first eval frame finds the thread's state from the thread's `fs` base (read from the
//! task, at the offset the agent took from BTF): through CPython's `autoTSSkey` (3.11 to
//! 3.14), the way glibc's `pthread_getspecific` does (the key's value sits in the thread's
//! `struct pthread`, at the `fs` base), or in the thread-local 3.15 keeps it in, at a fixed
//! offset from the `fs` base.
//! Per Python frame the stack gets one word: the code object's address and the instruction's
//! offset ([`python_frame_word`]). No string is read here; the agent names code objects.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::{bpf_get_current_task_btf, bpf_probe_read_kernel, bpf_probe_read_user},
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use scorch_common::{
    python_frame_word, PythonCount, PythonProc, COUNTER_RUNS, MAX_PYTHON_PROCS,
    MAX_USER_STACK_DEPTH, PYTHON_COUNTS, PYTHON_ENTRY_CSTACK_OWNER, PYTHON_ENTRY_IS_ENTRY,
    PYTHON_EVAL_RANGES, PYTHON_NO_CFRAME, PYTHON_NO_INTERPRETER,
};

use crate::unwind::{repeat, WalkState};

/// Processes running a CPython interpreter, written by the agent; not preallocated.
#[map]
static PYTHON_PROCS: HashMap<u32, PythonProc> =
    HashMap::with_max_entries(MAX_PYTHON_PROCS, crate::BPF_F_NO_PREALLOC);

/// Per-CPU counters indexed by [`PythonCount`]; cumulative, the agent takes differences.
#[map]
static PYTHON_COUNTS_MAP: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(PYTHON_COUNTS * COUNTER_RUNS, 0);

/// `offsetof(struct task_struct, thread.fsbase)` on the running kernel, set by the agent
/// before load from the kernel's BTF; 0 leaves Python frames unwalked.
#[unsafe(no_mangle)]
static TASK_FSBASE: u32 = 0;

/// The interpreter of `tgid`, or the entry of processes without one (no eval-loop ranges:
/// every frame stays native); `None` only when the agent has not written that entry yet.
#[inline(always)]
pub fn process(tgid: u32) -> Option<*const PythonProc> {
    PYTHON_PROCS
        .get_ptr(tgid)
        .or_else(|| PYTHON_PROCS.get_ptr(PYTHON_NO_INTERPRETER))
}

/// After an exec the process runs another program: forget its interpreter.
#[inline(always)]
pub fn forget(tgid: u32) {
    let _ = PYTHON_PROCS.remove(tgid);
}

/// Whether `pc` lies in the interpreter's eval loop.
#[inline(always)]
pub fn in_eval_loop(python: &PythonProc, pc: u64) -> bool {
    let mut i = 0;
    let mut found = false;
    while i < PYTHON_EVAL_RANGES {
        if (i as u32) < python.eval_count && pc >= python.eval_start[i] && pc < python.eval_end[i] {
            found = true;
        }
        i += 1;
    }
    found
}

#[inline(always)]
fn count(counters: u32, kind: PythonCount) {
    if let Some(counter) = PYTHON_COUNTS_MAP.get_ptr_mut(counters * PYTHON_COUNTS + kind as u32) {
        // SAFETY: this CPU's slot; the program cannot run twice at once on one CPU.
        unsafe { *counter += 1 };
    }
}

#[inline(always)]
fn read_u64(address: u64) -> Option<u64> {
    // SAFETY: bpf_probe_read_user checks the address; a fault is an error, never a crash.
    unsafe { bpf_probe_read_user(address as *const u64) }.ok()
}

#[inline(always)]
fn read_u32(address: u64) -> Option<u32> {
    // SAFETY: as above.
    unsafe { bpf_probe_read_user(address as *const u32) }.ok()
}

#[inline(always)]
fn read_u8(address: u64) -> Option<u8> {
    // SAFETY: as above.
    unsafe { bpf_probe_read_user(address as *const u8) }.ok()
}

/// The running thread's innermost Python frame, through its thread state; `None` when the
/// thread has none (not a Python thread, not started) or it could not be read.
#[inline(always)]
fn current_frame(python: &PythonProc) -> Option<u64> {
    // SAFETY: a plain value the agent set before load (read volatile: the loader rewrites it).
    let fsbase_offset = unsafe { core::ptr::read_volatile(&TASK_FSBASE) };
    if fsbase_offset == 0 {
        return None;
    }
    // SAFETY: a helper with no arguments; the result is only used as an address to read.
    let task = unsafe { bpf_get_current_task_btf() } as *const u8;
    // SAFETY: bpf_probe_read_kernel checks the address.
    let fs_base =
        unsafe { bpf_probe_read_kernel(task.wrapping_add(fsbase_offset as usize) as *const u64) }
            .ok()?;
    let slot = if python.thread_local != 0 {
        python.thread_local as i64 as u64
    } else {
        let key = read_u32(python.thread_key)?;
        if key >= python.specific_keys {
            return None;
        }
        ((key as u64 + python.specific_bias as u64) << (python.specific_shift & 15))
            + python.specific_value as u64
    };
    let tstate = read_u64(fs_base.wrapping_add(slot))?;
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
/// (`WalkState::python_frames`), which the verifier does not track, so the loop is checked in
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
    // SAFETY: `emit` passes its `Chain`, whose pointers are map values.
    let chain = unsafe { &mut *(context as *mut Chain) };
    chain_frame(chain)
}

#[inline(always)]
fn chain_frame(chain: &mut Chain) -> i64 {
    // SAFETY: `emit` passes its `Chain`, whose pointers are map values.
    let (walk, python) = unsafe { (&mut *chain.walk, &*chain.python) };
    let frame = chain.frame;
    if frame == 0 {
        return 1;
    }
    let Some(previous) = read_u64(frame.wrapping_add(python.frame_previous as u64)) else {
        count(walk.counters, PythonCount::FrameReadFault);
        chain.frame = 0;
        return 1;
    };
    let Some(marker) = read_u8(frame.wrapping_add(python.entry_offset as u64)) else {
        count(walk.counters, PythonCount::FrameReadFault);
        chain.frame = 0;
        return 1;
    };
    // 3.12+: the shim frame the eval loop pushed on entry ends this call's chain.
    if python.entry_kind == PYTHON_ENTRY_CSTACK_OWNER && marker == python.entry_value {
        chain.frame = previous;
        return 1;
    }
    let Some(code) = read_u64(frame.wrapping_add(python.frame_code as u64)) else {
        count(walk.counters, PythonCount::FrameReadFault);
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
        count(walk.counters, PythonCount::UnknownCode);
        python_frame_word(0, 0)
    };
    let len = walk.stack.len as usize;
    let Some(slot) = walk.stack.pcs.get_mut(len) else {
        count(walk.counters, PythonCount::FrameLimit);
        chain.frame = 0;
        return 1;
    };
    *slot = word;
    walk.stack.len = len as u32 + 1;
    walk.stack.hash = (walk.stack.hash ^ word).wrapping_mul(0x0000_0100_0000_01b3);
    walk.python_frames += 1;
    chain.frame = previous;
    // 3.11: the call's first frame is marked, and emitted.
    if python.entry_kind == PYTHON_ENTRY_IS_ENTRY && marker != 0 {
        return 1;
    }
    0
}

/// Emits the Python frames of the eval call whose C frame the walk is at; returns how many.
/// The first call of a walk finds the thread's innermost frame.
#[inline(always)]
pub fn emit(walk: &mut WalkState, python: &PythonProc) -> u32 {
    if walk.python_started == 0 {
        walk.python_started = 1;
        match current_frame(python) {
            Some(frame) => walk.python_frame = frame,
            None => {
                count(walk.counters, PythonCount::NoThreadState);
                walk.python_frame = 0;
            }
        }
    }
    if walk.python_frame == 0 {
        return 0;
    }
    let before = walk.python_frames;
    let mut chain = Chain {
        walk: walk as *mut WalkState,
        python: python as *const PythonProc,
        frame: walk.python_frame,
    };
    repeat(MAX_USER_STACK_DEPTH as u32, chain_step, &mut chain);
    walk.python_frame = chain.frame;
    let emitted = walk.python_frames.wrapping_sub(before);
    if emitted > 0 {
        let index = walk.counters * PYTHON_COUNTS + PythonCount::Frames as u32;
        if let Some(counter) = PYTHON_COUNTS_MAP.get_ptr_mut(index) {
            // SAFETY: this CPU's slot; the program cannot run twice at once on one CPU.
            unsafe { *counter += emitted as u64 };
        }
    }
    emitted
}
