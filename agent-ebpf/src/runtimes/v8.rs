//! V8's JavaScript frames, walked where the native walk meets V8's code.
//!
//! The agent marks V8's code as owned by [`RuntimeId::V8`]: the embedded builtins in `node`
//! or `libnode` (the interpreter's handlers among them) and the process's anonymous
//! executable mappings (the JIT's code). When the native walk meets a pc there it hands the
//! frame over ([`walk_at`]). Every frame V8 builds keeps a frame pointer, so this walk steps
//! by it, up to [`FRAMES_PER_CALL`] JavaScript frames per iteration of the walk's loop, and
//! hands back at the first frame that is not one (a typed frame: the entry frame V8 was
//! called through, an exit frame into C++, a stub's), which the native walk records and
//! steps past, so `node::Start`, `main` and `_start` follow.
//!
//! Per frame (the slots V8's `frame-constants.h` gives, exported as `v8dbg_off_fp_*`):
//! 1. **Typed or JavaScript.** The context slot holds a typed frame's marker (the frame type
//!    shifted left by one: a Smi's tag, not a Smi) or a JavaScript frame's context (a tagged
//!    pointer).
//! 2. **The function**, from the function slot: a `JSFunction` (its map's instance type in
//!    the range the agent gives).
//! 3. **Its code.** Compiled code (Sparkplug's, Maglev's, TurboFan's) when the function's
//!    `Code` is of a kind from baseline up and holds the pc: the pc's offset from its
//!    instructions, and a cookie of the code's size and kind. Otherwise Ignition's, when the
//!    frame's bytecode offset slot holds a Smi and its bytecode array slot a `BytecodeArray`:
//!    the offset. Otherwise (the code was replaced since the frame was entered, a leaf in a
//!    prologue, a builtin's frame) the function alone, through its `SharedFunctionInfo`.
//!    With leaptiering (V8 13) the function keeps a handle into the process's dispatch
//!    table, whose entry holds the code: the agent finds the table, and without it the
//!    walk names such functions alone.
//! 4. **Its words**: the subtype and the pointer the agent names it from (the
//!    `SharedFunctionInfo`, the optimised `Code`, or for baseline code, which keeps no way
//!    back to its function, the `JSFunction`), then the offset and the cookie.

use aya_ebpf::{
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use scorch_common::{
    v8_code_cookie, v8_frame_words, RuntimeId, V8Count, V8Proc, V8Subtype, COUNTER_RUNS,
    MAX_V8_PROCS, SUBTYPE_SHIFT, V8_CODE_BYTES, V8_CODE_DISPATCH, V8_CODE_INLINE, V8_COUNTS,
    V8_DISPATCH_CODE_SHIFT, V8_DISPATCH_ENTRY_BYTES, V8_FRAME_BELOW,
};

use crate::shared::{
    counters,
    stack::{push_frame, WalkState, WALK},
    user::{read, read_into, read_u64},
};

/// Processes running V8, written by the agent; not preallocated.
#[map]
static V8_PROCS: HashMap<u32, V8Proc> =
    HashMap::with_max_entries(MAX_V8_PROCS, crate::shared::flags::BPF_F_NO_PREALLOC);

/// Per-CPU counters indexed by [`V8Count`]; cumulative, the agent takes differences.
#[map]
static V8_COUNTS_MAP: PerCpuArray<u64> = PerCpuArray::with_max_entries(V8_COUNTS * COUNTER_RUNS, 0);

/// Slots of the per-CPU cache of frames read ([`Seen`]), a power of two. A service's hot
/// stacks return to a few hundred call sites; a slot lost to another costs one read more.
const CACHE_SLOTS: usize = 256;

/// What a frame's pc told the walk the last time this CPU read one there, so that a stack
/// seen before costs a read a frame (its words), or two, not the eight of its objects' maps,
/// types and fields.
/// - **Compiled code** (`function` 0): the words of a frame at this pc, whatever its
///   function. The pc lies in one `Code`, and the words name that `Code`'s address, so a
///   stale entry gives the words the full read would whenever the code now there starts
///   where the old one did; other code there makes the agent's check of the `Code` fail, and
///   the frame is left unnamed, never misnamed.
/// - **Ignition's, or a function alone** (`function` set): the `SharedFunctionInfo` of
///   `function` at this pc (the interpreter's, or code the function's own does not hold, as
///   on-stack-replaced code), read again from the function at each use: a function moved by
///   the collector and another allocated in its place has another.
#[repr(C)]
#[derive(Clone, Copy)]
struct Seen {
    /// The pc looked up (0: an empty slot), and its process.
    pc: u64,
    tgid: u32,
    /// [`V8Subtype`], as its bits.
    subtype: u32,
    function: u64,
    /// The frame's first word, and its continuation.
    words: [u64; 2],
}

/// Per CPU, too large for the stack: a frame's words, a `Code`'s first bytes, and the
/// cache of frames read.
#[repr(C)]
struct Scratch {
    code: [u8; V8_CODE_BYTES],
    /// JavaScript frames this hand-over emitted, counted once when it ends.
    frames: u64,
    cache: [Seen; CACHE_SLOTS],
}

#[map]
static V8_SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// JavaScript frames unwound per call of [`scorch_v8_walk`] (see `hotspot.rs`).
const FRAMES_PER_CALL: u32 = 16;

/// Words of a frame below its function, from `fp - V8_FRAME_BELOW`: its bytecode slots lie
/// there (the agent checks they do).
const BELOW_FUNCTION: u64 = (V8_FRAME_BELOW as u64 - 16) / 8;

/// The farthest a frame pointer may lie above the stack pointer: a JavaScript frame holds
/// its locals and the arguments it pushes, and V8 bounds both far below this.
const MAX_FRAME_BYTES: u64 = 0x10000;

/// A V8 tagged pointer's tag (`HeapObjectTag` under `HeapObjectTagMask`): the agent writes
/// an entry only for builds whose tagging is this.
const HEAP_OBJECT_TAG: u64 = 1;
const HEAP_OBJECT_TAG_MASK: u64 = 3;
/// A Smi's value is the word's upper half (no pointer compression).
const SMI_SHIFT: u32 = 32;

/// After an exec the process runs another program: forget its V8.
#[inline(always)]
pub fn forget(tgid: u32) {
    let _ = V8_PROCS.remove(tgid);
}

#[inline(always)]
fn count(run: u32, kind: V8Count, n: u64) {
    counters::add(&V8_COUNTS_MAP, run * V8_COUNTS + kind as u32, n);
}

/// The object a tagged word points to, or `None` for a Smi or a marker.
#[inline(always)]
fn untag(tagged: u64) -> Option<u64> {
    (tagged & HEAP_OBJECT_TAG_MASK == HEAP_OBJECT_TAG).then(|| tagged - HEAP_OBJECT_TAG)
}

/// The instance type of the object whose map is the tagged word `map`.
#[inline(always)]
fn type_of_map(proc: &V8Proc, map: u64) -> Option<u16> {
    read::<u16>(untag(map)?.wrapping_add(u64::from(proc.instance_type)))
}

/// The instance type of the object at `object` (untagged).
#[inline(always)]
fn type_of(proc: &V8Proc, object: u64) -> Option<u16> {
    type_of_map(proc, read_u64(object.wrapping_add(u64::from(proc.map)))?)
}

/// A field of the `Code` bytes in the scratch buffer, at an offset the agent checked to lie
/// within them (clamped again here for the verifier).
#[inline(always)]
fn code_u64(code: &[u8; V8_CODE_BYTES], offset: u16) -> u64 {
    let at = (offset as usize).min(V8_CODE_BYTES - 8);
    u64::from_le_bytes(code[at..at + 8].try_into().unwrap_or([0; 8]))
}

#[inline(always)]
fn code_u32(code: &[u8; V8_CODE_BYTES], offset: u16) -> u32 {
    let at = (offset as usize).min(V8_CODE_BYTES - 4);
    u32::from_le_bytes(code[at..at + 4].try_into().unwrap_or([0; 4]))
}

/// The cache slot of `pc` and `function` in `tgid`.
#[inline(always)]
fn slot_of(tgid: u32, pc: u64, function: u64) -> usize {
    let mixed =
        (pc ^ (pc >> 9) ^ (function >> 3) ^ u64::from(tgid)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (mixed >> 56) as usize & (CACHE_SLOTS - 1)
}

/// What became of one frame.
#[derive(PartialEq, Eq)]
enum Step {
    /// A JavaScript frame: its words pushed, the walk's registers at its caller.
    Javascript,
    /// Not a JavaScript frame (counted): the native walk records and steps past it.
    Other,
    /// The stack is full.
    Full,
}

/// The words of the JavaScript frame whose function is `function` (untagged), at `lookup`
/// (its pc, or its return address less one): from the cache when this CPU read a frame there
/// before, else read and kept.
#[inline(always)]
fn words_of(
    walk: &mut WalkState,
    proc: &V8Proc,
    scratch: &mut Scratch,
    function: u64,
    lookup: u64,
) -> Option<[u64; 2]> {
    // Compiled code's entry, keyed by the pc alone, then Ignition's, by the pc and function.
    let compiled = slot_of(walk.tgid, lookup, 0);
    let seen = scratch.cache[compiled];
    if seen.pc == lookup && seen.tgid == walk.tgid && seen.function == 0 {
        let mut words = seen.words;
        // Sparkplug's frames name their function, this frame's.
        if seen.subtype == V8Subtype::Baseline as u32 {
            words[0] = v8_frame_words(V8Subtype::Baseline, function, 0, 0)[0];
        }
        return Some(words);
    }
    // The frame's words below its function, for its bytecode slots (the agent checks they
    // are there).
    if !walk.read_up_to(walk.fp.wrapping_sub(16), BELOW_FUNCTION) {
        return None;
    }
    let offset = walk.word(u64::from(proc.slot_bytecode_offset));
    let array = walk.word(u64::from(proc.slot_bytecode_array));
    let interpreted = slot_of(walk.tgid, lookup, function);
    let seen = scratch.cache[interpreted];
    let is_smi = offset & 1 == 0 && (offset >> 63) == 0;
    if seen.pc == lookup
        && seen.tgid == walk.tgid
        && seen.function == function
        && (is_smi || seen.subtype == V8Subtype::Function as u32)
    {
        let shared =
            read_u64(function.wrapping_add(u64::from(proc.function_shared))).and_then(untag);
        if shared == Some(seen.words[0]) {
            if seen.subtype == V8Subtype::Function as u32 {
                count(walk.counters, V8Count::NoCode, 1);
                return Some(function_words(seen.words[0], lookup));
            }
            return Some(v8_frame_words(
                V8Subtype::Interpreted,
                seen.words[0],
                (offset >> SMI_SHIFT) as u32,
                0,
            ));
        }
    }
    // Not seen: the function must be one before anything else is read of it.
    let is_function = type_of(proc, function)
        .is_some_and(|t| t >= proc.first_function_type && t <= proc.last_function_type);
    if !is_function {
        return None;
    }
    let words = read_words(walk, proc, scratch, function, lookup, offset, array)?;
    let subtype = V8Subtype::of((scorch_common::word_payload(words[0]) >> SUBTYPE_SHIFT) as u8);
    let (index, function, kept) = match subtype {
        V8Subtype::Optimised | V8Subtype::Baseline => (compiled, 0, words),
        // The shared info alone: the offset is the frame's; a function whose code holds
        // no pc here (on-stack-replaced code, most often) stays so while it runs there.
        V8Subtype::Interpreted | V8Subtype::Function => {
            let shared = (scorch_common::word_payload(words[0]) << 3) & scorch_common::POINTER_BITS;
            (interpreted, function, [shared, 0])
        }
    };
    let entry = &mut scratch.cache[index];
    entry.pc = lookup;
    entry.tgid = walk.tgid;
    entry.subtype = subtype as u32;
    entry.function = function;
    entry.words = kept;
    Some(words)
}

/// The `Code` (untagged) of the function at `function`: its code field's, or with
/// leaptiering its dispatch table entry's, whose code word keeps the tagged pointer above
/// the entry's mark bit and parameter count. `None` for a dispatch handle whose table the
/// agent did not find.
#[inline(always)]
fn code_of(proc: &V8Proc, function: u64) -> Option<u64> {
    let field = function.wrapping_add(u64::from(proc.function_code));
    if proc.flags & V8_CODE_DISPATCH == 0 {
        return read_u64(field).and_then(untag);
    }
    if proc.dispatch_table == 0 {
        return None;
    }
    let handle = read::<u32>(field)?;
    let entry = proc.dispatch_table.wrapping_add(
        u64::from(handle >> (proc.dispatch_shift & 31)).wrapping_mul(V8_DISPATCH_ENTRY_BYTES),
    );
    let word = read_u64(entry.wrapping_add(8))?;
    if word >> V8_DISPATCH_CODE_SHIFT == 0 {
        return None;
    }
    untag((word >> V8_DISPATCH_CODE_SHIFT) | HEAP_OBJECT_TAG)
}

/// The words of the JavaScript frame whose function is `function`, read from its objects;
/// `offset` and `array` are its bytecode slots.
#[inline(always)]
fn read_words(
    walk: &WalkState,
    proc: &V8Proc,
    scratch: &mut Scratch,
    function: u64,
    lookup: u64,
    offset: u64,
    array: u64,
) -> Option<[u64; 2]> {
    // Compiled code holding the pc.
    if let Some(code) = code_of(proc, function) {
        if read_into(&mut scratch.code, code)
            && type_of_map(proc, code_u64(&scratch.code, proc.map)) == Some(proc.code_type)
        {
            let flags = code_u32(&scratch.code, proc.code_flags);
            let kind = (flags >> (proc.code_kind_shift & 31)) & u32::from(proc.code_kind_mask);
            let start = if proc.flags & V8_CODE_INLINE != 0 {
                code.wrapping_add(u64::from(proc.code_start))
            } else {
                code_u64(&scratch.code, proc.code_start)
            };
            let size = code_u32(&scratch.code, proc.code_size);
            if kind >= u32::from(proc.code_kind_baseline)
                && lookup >= start
                && lookup < start.wrapping_add(u64::from(size))
            {
                let (subtype, pointer) = if kind == u32::from(proc.code_kind_baseline) {
                    (V8Subtype::Baseline, function)
                } else {
                    (V8Subtype::Optimised, code)
                };
                // The offset of the pc, or of the call a return address follows: the
                // source position the agent looks up is the call's.
                return Some(v8_frame_words(
                    subtype,
                    pointer,
                    lookup.wrapping_sub(start) as u32,
                    v8_code_cookie(size, kind),
                ));
            }
        }
    }
    let shared =
        read_u64(function.wrapping_add(u64::from(proc.function_shared))).and_then(untag)?;
    if type_of(proc, shared) != Some(proc.shared_function_info_type) {
        return None;
    }
    // Ignition's: the bytecode offset a Smi, the bytecode array's slot a `BytecodeArray`,
    // and where the agent gives the builtins' range, the pc in its handlers.
    let interpreter =
        proc.builtins_end == 0 || (lookup >= proc.builtins_start && lookup < proc.builtins_end);
    if interpreter && offset & 1 == 0 && (offset >> 63) == 0 {
        if let Some(bytecode) = untag(array) {
            if type_of(proc, bytecode) == Some(proc.bytecode_array_type) {
                return Some(v8_frame_words(
                    V8Subtype::Interpreted,
                    shared,
                    (offset >> SMI_SHIFT) as u32,
                    0,
                ));
            }
        }
    }
    count(walk.counters, V8Count::NoCode, 1);
    Some(function_words(shared, lookup))
}

/// A function named without its code: its `SharedFunctionInfo` and the frame's pc, from
/// which the agent looks for the code (on-stack-replaced code is in no function's field).
#[inline(always)]
fn function_words(shared: u64, pc: u64) -> [u64; 2] {
    // The detail's bits hold a user address's high half.
    v8_frame_words(V8Subtype::Function, shared, (pc >> 32) as u32, pc as u32)
}

/// One frame at the walk's registers: pushed when it is a JavaScript frame.
#[inline(always)]
fn frame(walk: &mut WalkState, proc: &V8Proc, scratch: &mut Scratch) -> Step {
    let (pc, sp, fp) = (walk.pc, walk.sp, walk.fp);
    if fp < sp || fp - sp > MAX_FRAME_BYTES {
        count(walk.counters, V8Count::BadFramePointer, 1);
        return Step::Other;
    }
    // A return address's call is one byte before it.
    let lookup = if walk.return_address == 0 { pc } else { pc - 1 };
    // Optimised code seen at this pc: the frame is its function's, whose words the cache
    // has; only the caller's registers are read, as a frame-pointer step reads them.
    let seen = &scratch.cache[slot_of(walk.tgid, lookup, 0)];
    let (words, saved_fp, return_address) = if seen.pc == lookup
        && seen.tgid == walk.tgid
        && seen.function == 0
        && seen.subtype == V8Subtype::Optimised as u32
    {
        let words = seen.words;
        if !walk.read_up_to(fp.wrapping_add(16), 2) {
            count(walk.counters, V8Count::BadFramePointer, 1);
            return Step::Other;
        }
        (words, walk.word(0), walk.word(1))
    } else {
        // Through the walk's copy of the stack, as the native walk reads its frames: one
        // read for the frames of several hundred bytes of stack.
        if !walk.read_up_to(fp.wrapping_add(16), 4) {
            count(walk.counters, V8Count::BadFramePointer, 1);
            return Step::Other;
        }
        // A typed frame's marker: a Smi's tag bit, clear. The agent writes an entry only
        // for builds whose function and context are the two words below the frame pointer.
        let (function, context, saved_fp, return_address) =
            (walk.word(0), walk.word(1), walk.word(2), walk.word(3));
        if context & 1 == 0 {
            count(walk.counters, V8Count::TypedFrame, 1);
            return Step::Other;
        }
        let Some(function) = untag(function) else {
            count(walk.counters, V8Count::BadFunction, 1);
            return Step::Other;
        };
        let Some(words) = words_of(walk, proc, scratch, function, lookup) else {
            count(walk.counters, V8Count::BadFunction, 1);
            return Step::Other;
        };
        (words, saved_fp, return_address)
    };
    if !push_frame(walk, words[0]) || !push_frame(walk, words[1]) {
        count(walk.counters, V8Count::FrameLimit, 1);
        return Step::Full;
    }
    walk.runtime_frames += 1;
    walk.pc = return_address;
    walk.fp = saved_fp;
    walk.sp = fp + 16;
    walk.return_address = 1;
    Step::Javascript
}

/// Replaces the V8 frame the walk in `WALK`'s `slot` is at with its JavaScript frames, up to
/// [`FRAMES_PER_CALL`], and leaves the walk's registers at the last one's caller; returns 0.
/// While the frames go on being JavaScript's, the walk's next iteration comes back here; at
/// the first that is not, the native walk goes on from it (`stepped`), and hands it back if
/// its pc is V8's, to be recorded and stepped past natively. A global function, so the
/// verifier checks it once on its own (see `python.rs`).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn scorch_v8_walk(slot: u32) -> u32 {
    if let Some(walk) = WALK.get_ptr_mut(slot) {
        // SAFETY: this CPU's walk state, which the walk that called this has handed over.
        walk_at(unsafe { &mut *walk });
    }
    0
}

#[inline(always)]
fn walk_at(walk: &mut WalkState) {
    let Some(proc) = V8_PROCS.get_ptr(walk.tgid) else {
        return;
    };
    let Some(scratch) = V8_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: map values, alive while the program runs; the scratch is this CPU's.
    let (proc, scratch) = unsafe { (&*proc, &mut *scratch) };
    if walk.claimed == 0 {
        scratch.frames = 0;
    }
    for _ in 0..FRAMES_PER_CALL {
        let first = walk.claimed == 0;
        match frame(walk, proc, scratch) {
            Step::Javascript => {
                scratch.frames += 1;
                walk.claimed = 1;
            }
            Step::Other if first => {
                // Not claimed: the native walk records the pc and steps past it.
                walk.stepped = 0;
                return;
            }
            _ => {
                // The hand-over ends at a frame that is not JavaScript's (or a full stack):
                // its frames are counted once, and the native walk takes the registers.
                count(walk.counters, V8Count::Frames, scratch.frames);
                walk.claimed = 0;
                walk.stepped = 1;
                return;
            }
        }
    }
    // More frames may be JavaScript's: the walk's next iteration comes back here.
    walk.runtime = RuntimeId::V8 as u32;
}
