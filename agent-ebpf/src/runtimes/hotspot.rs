//! HotSpot's Java frames, walked where the native walk meets the JVM's code cache.
//!
//! The agent marks each code heap's executable range (`HotspotProc::heap_*`) as owned by
//! [`RuntimeId::Hotspot`] in the process's anonymous mappings. When
//! the native walk meets a pc there it hands the frame over ([`walk_at`]); unlike CPython's
//! eval loop, whose frame the native walk steps past itself, the code cache holds no native
//! frames and no unwind tables: this walk unwinds every Java frame itself, up to
//! [`FRAMES_PER_CALL`] per iteration of the walk's loop, and leaves the walk's registers at
//! the first frame outside the cache (the call stub's caller, `JavaCalls::call_helper` in
//! libjvm), with `WalkState::stepped` set so the native walk goes on from there without a
//! step of its own.
//!
//! Per frame (libjvm_db's algorithm, as the OpenTelemetry profiler also reads it):
//! 1. **The blob.** The segment map: `(pc - heap start) >> shift` is the pc's segment; its
//!    byte in the map says how many segments back the block may start (0 at the start, 0xff
//!    for a free segment); at most [`SEGMAP_STEPS`] bytes are read. The `CodeBlob` starts
//!    after the block's `HeapBlock` header. What the walk needs of it is kept per CPU by pc
//!    ([`BlobFacts`]): a stack's return addresses recur from sample to sample, and one read
//!    of the blob's compile id or name pointer tells the blob is still the one found.
//! 2. **Its kind**, from the first four bytes of its `_name`: `nmet` (a compiled method, C1 or
//!    C2), `nati` (a native method's wrapper), `Inte` (the template interpreter), `vtab`
//!    (vtable chunks), anything else a stub.
//! 3. **Its rule.** The interpreter: the frame pointer's slots (method at fp - 3 words, the
//!    sender's sp at fp - 1, the saved fp at fp, the return pc at fp + 1) and the bytecode
//!    pointer (a slot for a caller; `r13` at the leaf, where the interpreter keeps it). A
//!    compiled method (C2 keeps no frame pointer): its deoptimised pc recovered from
//!    `sp + orig_pc_offset`; its caller at `sp + frame_size`, where the return address must
//!    lie in the code cache, as whoever calls Java code is Java code or the call stub; at the
//!    leaf, when the frame is not set up (its prologue, `pc < code begin + frame_complete`,
//!    or its epilogue), the return address at `sp` or one word above. A stub with a frame size
//!    as a compiled method; one without: at the leaf the return address at `sp` (a jump or a
//!    leaf routine), else its frame pointer (the call stub, called from C++).
//! 4. **Its words**: the subtype and the `Method*` (interpreted) or `CodeBlob*` (the rest),
//!    then a continuation word with the bci or pc delta and a cookie the agent checks: the
//!    low 24 bits of the compile id or of `ConstMethod*` >> 3 (an nmethod or a method freed
//!    and reused since is left unnamed), and the low 8 of the JVM's collections count at the
//!    sample (a class unloaded since, whose symbols may be reused, is left unnamed too).

use aya_ebpf::{
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use scorch_common::{
    hotspot_cookie, hotspot_frame_words, HotspotCount, HotspotProc, HotspotSubtype, RuntimeId,
    COUNTER_RUNS, HOTSPOT_BLOB_BYTES, HOTSPOT_COUNTS, HOTSPOT_HEAPS, HOTSPOT_NEW_BCP_SLOT,
    HOTSPOT_USES_OFFSETS, MAX_HOTSPOT_PROCS,
};

use crate::shared::{
    counters,
    stack::{push_frame, WalkState, WALK},
    user::{read, read_into, read_u32, read_u64, read_u8},
};

/// Processes running a JVM, written by the agent; not preallocated.
#[map]
static HOTSPOT_PROCS: HashMap<u32, HotspotProc> =
    HashMap::with_max_entries(MAX_HOTSPOT_PROCS, crate::shared::flags::BPF_F_NO_PREALLOC);

/// Per-CPU counters indexed by [`HotspotCount`]; cumulative, the agent takes differences.
#[map]
static HOTSPOT_COUNTS_MAP: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(HOTSPOT_COUNTS * COUNTER_RUNS, 0);

/// Bytes of a `CodeBlob` read at once: every field the rules read lies in the first few
/// hundred bytes of an nmethod (the agent checks each offset against it when it writes the
/// entry), and one read costs about as much as several small ones.
const BLOB_BYTES: usize = HOTSPOT_BLOB_BYTES;

/// Slots of the per-CPU cache of blobs found ([`BlobFacts`]), a power of two. A service's hot
/// stacks return to a few hundred call sites; a slot lost to another costs one lookup more.
const CACHE_SLOTS: usize = 128;

/// What a pc's blob told the walk the last time this CPU looked it up: the segment-map walk
/// and the blob's read are skipped while one read says the blob is still there ([`cached`]).
#[repr(C)]
#[derive(Clone, Copy)]
struct BlobFacts {
    /// The pc looked up (0: an empty slot), and its process.
    pc: u64,
    tgid: u32,
    /// The first four bytes of the blob's name.
    kind: u32,
    blob: u64,
    /// Read again at each use: an nmethod's compile id, or another blob's name pointer. A
    /// blob freed and its memory reused holds another there (compile ids are never reused).
    check: u64,
    code_begin: u64,
    deopt: u64,
    frame_size: u32,
    frame_complete: u32,
    orig_pc_offset: u32,
    compile_id: u32,
}

/// Java frames unwound per call of [`scorch_hotspot_walk`]: the walk's loop, the hand-over and
/// the map lookups are paid once for each so many frames, while the verifier checks the
/// frame's code that many times over.
const FRAMES_PER_CALL: u32 = 8;

/// Words of an interpreter frame read at once, from fp - 8 words to fp + 2.
const INTERPRETER_WORDS: usize = 10;

/// Per CPU, too large for the stack: the blob being read, the words of an interpreter frame,
/// and the cache of blobs found.
#[repr(C)]
struct Scratch {
    blob: [u8; BLOB_BYTES],
    /// An interpreter frame's slots.
    words: [u64; INTERPRETER_WORDS],
    /// Java frames this hand-over emitted, counted once when it ends.
    frames: u64,
    cache: [BlobFacts; CACHE_SLOTS],
}

#[map]
static HOTSPOT_SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// Most segment-map bytes read to find a blob's start. A tag holds at most 0xfe, so a blob of
/// n segments needs about n / 254 steps; libjvm_db's longest chains are under ten.
const SEGMAP_STEPS: u32 = 12;

/// The blob kinds, from the first four bytes of their names (little-endian).
const NAME_NMETHOD: u32 = u32::from_le_bytes(*b"nmet");
const NAME_NATIVE: u32 = u32::from_le_bytes(*b"nati");
const NAME_INTERPRETER: u32 = u32::from_le_bytes(*b"Inte");
const NAME_VTABLE: u32 = u32::from_le_bytes(*b"vtab");

/// After an exec the process runs another program: forget its JVM.
#[inline(always)]
pub fn forget(tgid: u32) {
    let _ = HOTSPOT_PROCS.remove(tgid);
}

#[inline(always)]
fn count(run: u32, kind: HotspotCount, n: u64) {
    counters::add(&HOTSPOT_COUNTS_MAP, run * HOTSPOT_COUNTS + kind as u32, n);
}

/// A field of the blob in the scratch buffer, at an offset the agent checked to lie within
/// it (clamped again here for the verifier).
#[inline(always)]
fn blob_u64(blob: &[u8; BLOB_BYTES], offset: u16) -> u64 {
    let at = (offset as usize).min(BLOB_BYTES - 8);
    u64::from_le_bytes(blob[at..at + 8].try_into().unwrap_or([0; 8]))
}

#[inline(always)]
fn blob_u32(blob: &[u8; BLOB_BYTES], offset: u16) -> u32 {
    let at = (offset as usize).min(BLOB_BYTES - 4);
    u32::from_le_bytes(blob[at..at + 4].try_into().unwrap_or([0; 4]))
}

/// The code heap holding `pc`: its code start and its segment map.
#[inline(always)]
fn heap_of(proc: &HotspotProc, pc: u64) -> Option<(u64, u64)> {
    let count = (proc.heap_count as usize).min(HOTSPOT_HEAPS);
    for i in 0..HOTSPOT_HEAPS {
        if i < count && pc >= proc.heap_start[i] && pc < proc.heap_end[i] {
            return Some((proc.heap_start[i], proc.heap_segmap[i]));
        }
    }
    None
}

/// The `CodeBlob` holding `pc`, through its heap's segment map. A loop of its own, not a
/// `bpf_loop` callback: a callback's frame would take the call chain's stack past the
/// verifier's 512 bytes (its frames are counted in 32-byte steps).
#[inline(always)]
fn find_blob(proc: &HotspotProc, pc: u64) -> Option<u64> {
    let (start, segmap) = heap_of(proc, pc)?;
    let shift = proc.segment_shift & 31;
    let mut segment = (pc - start) >> shift;
    for _ in 0..SEGMAP_STEPS {
        let tag = u64::from(read_u8(segmap.wrapping_add(segment))?);
        if tag == 0 {
            return Some(
                start
                    .wrapping_add(segment << shift)
                    .wrapping_add(u64::from(proc.heapblock_size)),
            );
        }
        // 0xff: a free segment; a tag past the heap's start: not a map.
        if tag == 0xff || tag > segment {
            return None;
        }
        segment -= tag;
    }
    None
}

/// The cache slot of `pc` in `tgid`.
#[inline(always)]
fn slot_of(tgid: u32, pc: u64) -> usize {
    let mixed = (pc ^ (pc >> 9) ^ (pc >> 21) ^ u64::from(tgid)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (mixed >> 57) as usize & (CACHE_SLOTS - 1)
}

/// Whether `facts` still describe the blob of `pc` in `tgid`: the same key, and the blob's
/// compile id (an nmethod) or name pointer (any other) read again unchanged.
#[inline(always)]
fn cached(facts: &BlobFacts, proc: &HotspotProc, tgid: u32, pc: u64) -> bool {
    if facts.pc != pc || facts.tgid != tgid {
        return false;
    }
    if facts.kind == NAME_NMETHOD || facts.kind == NAME_NATIVE {
        read_u32(facts.blob.wrapping_add(u64::from(proc.nmethod_compile_id)))
            == Some(facts.check as u32)
    } else {
        read_u64(facts.blob.wrapping_add(u64::from(proc.codeblob_name))) == Some(facts.check)
    }
}

/// Finds `pc`'s blob through the segment map, reads it, and writes what the walk needs of it
/// into `facts`. False (counted) when there is none or it cannot be read.
#[inline(always)]
fn look_up(
    walk: &WalkState,
    proc: &HotspotProc,
    blob_bytes: &mut [u8; BLOB_BYTES],
    facts: &mut BlobFacts,
    pc: u64,
) -> bool {
    facts.pc = 0;
    let Some(blob) = find_blob(proc, pc) else {
        count(walk.counters, HotspotCount::NoCodeBlob, 1);
        return false;
    };
    if !read_into(blob_bytes, blob) {
        count(walk.counters, HotspotCount::InvalidCodeBlob, 1);
        return false;
    }
    let name = blob_u64(blob_bytes, proc.codeblob_name);
    let Some(kind) = read_u32(name) else {
        count(walk.counters, HotspotCount::InvalidCodeBlob, 1);
        return false;
    };
    let mut code_begin = blob_u64(blob_bytes, proc.codeblob_code_begin);
    let mut deopt = blob_u64(blob_bytes, proc.nmethod_deopt_handler);
    if proc.flags & HOTSPOT_USES_OFFSETS != 0 {
        code_begin = blob.wrapping_add(code_begin & 0xffff_ffff);
        deopt = blob.wrapping_add(deopt & 0xffff_ffff);
    }
    let compile_id = blob_u32(blob_bytes, proc.nmethod_compile_id);
    facts.tgid = walk.tgid;
    facts.kind = kind;
    facts.blob = blob;
    facts.check = if kind == NAME_NMETHOD || kind == NAME_NATIVE {
        u64::from(compile_id)
    } else {
        name
    };
    facts.code_begin = code_begin;
    facts.deopt = deopt;
    facts.frame_size = blob_u32(blob_bytes, proc.codeblob_frame_size);
    facts.frame_complete = blob_u32(blob_bytes, proc.codeblob_frame_complete) & 0xffff;
    facts.orig_pc_offset = blob_u32(blob_bytes, proc.nmethod_orig_pc_offset);
    facts.compile_id = compile_id;
    facts.pc = pc;
    true
}

/// One Java frame: its words, and the caller's registers. Returns false when it is not one
/// (the pc is outside the code heaps), its frame cannot be read, or the stack is full.
#[inline(always)]
fn java_frame(walk: &mut WalkState, proc: &HotspotProc, scratch: &mut Scratch) -> bool {
    let pc = walk.pc;
    let leaf = walk.return_address == 0;
    // A return address's call is one byte before it.
    let lookup = if leaf { pc } else { pc - 1 };
    if heap_of(proc, lookup).is_none() {
        return false;
    }
    let facts = &mut scratch.cache[slot_of(walk.tgid, lookup)];
    if !cached(facts, proc, walk.tgid, lookup)
        && !look_up(walk, proc, &mut scratch.blob, facts, lookup)
    {
        return false;
    }
    let (kind, blob, code_begin) = (facts.kind, facts.blob, facts.code_begin);
    let frame_size = u64::from(facts.frame_size) * 8;
    let (sp, fp) = (walk.sp, walk.fp);
    // The caller's (pc, sp, fp) and this frame's words.
    let (caller, words) = if kind == NAME_INTERPRETER {
        // The interpreter keeps a frame pointer; its slots are not in vmStructs but have not
        // moved since JDK 9 (a `mirror` slot moved the bcp then).
        if fp < sp || fp >= sp + 0x1000 {
            count(walk.counters, HotspotCount::InterpreterFrame, 1);
            return false;
        }
        // The frame's slots from the bcp's (8 words below fp) to the return pc, in one read.
        let frame = &mut scratch.words;
        if !read_into(frame, fp - 64) {
            count(walk.counters, HotspotCount::InterpreterFrame, 1);
            return false;
        }
        // Words from fp - 64: the method at fp - 24, the sender's sp at fp - 8, the saved fp
        // at fp, the return pc at fp + 8.
        let (method, sender_sp, saved_fp, ret) = (frame[5], frame[7], frame[8], frame[9]);
        let bcp = if leaf {
            walk.bcp
        } else if proc.flags & HOTSPOT_NEW_BCP_SLOT != 0 {
            frame[0]
        } else {
            frame[1]
        };
        let const_method =
            read_u64(method.wrapping_add(u64::from(proc.method_constmethod))).unwrap_or(0);
        let code = const_method.wrapping_add(u64::from(proc.cmethod_size));
        let bci = if bcp >= code {
            (bcp - code).min(0xffff)
        } else {
            0xffff
        };
        (
            (ret, sender_sp, saved_fp),
            hotspot_frame_words(
                HotspotSubtype::Interpreted,
                method,
                bci as u32,
                hotspot_cookie((const_method >> 3) as u32, walk.epoch),
            ),
        )
    } else if kind == NAME_NMETHOD || kind == NAME_NATIVE {
        let compile_id = facts.compile_id;
        // A deoptimised frame returns to the handler; its own pc was saved in the frame.
        let mut at = pc;
        if pc == facts.deopt {
            let orig = u64::from(facts.orig_pc_offset);
            if let Some(original) = read_u64(sp.wrapping_add(orig)) {
                at = original;
            }
        }
        let frame_complete = u64::from(facts.frame_complete);
        // Whoever calls a compiled method is Java code (compiled, the interpreter, the call
        // stub): its return address is in the code cache, which tells the frame's shape.
        let whole = !leaf || at >= code_begin.wrapping_add(frame_complete);
        let Some(caller) = compiled_caller(proc, sp, fp, frame_size, whole, leaf) else {
            count(walk.counters, HotspotCount::InvalidReturnAddress, 1);
            return false;
        };
        (
            caller,
            hotspot_frame_words(
                HotspotSubtype::Compiled,
                blob,
                at.wrapping_sub(code_begin) as u32,
                hotspot_cookie(compile_id, walk.epoch),
            ),
        )
    } else {
        let subtype = if kind == NAME_VTABLE {
            HotspotSubtype::Vtable
        } else {
            HotspotSubtype::Stub
        };
        // A stub with a frame size is a runtime stub compiled code calls; one without is a
        // jump (vtable chunks, adapters), a leaf routine, or the call stub, which keeps a
        // frame pointer and is called from the JVM's C++.
        let caller = if frame_size != 0 {
            compiled_caller(proc, sp, fp, frame_size, true, leaf)
        } else if leaf {
            compiled_caller(proc, sp, fp, 0, false, true).or_else(|| caller_at(fp + 16, fp, true))
        } else {
            caller_at(fp + 16, fp, true)
        };
        let Some(caller) = caller else {
            count(walk.counters, HotspotCount::InvalidReturnAddress, 1);
            return false;
        };
        (
            caller,
            hotspot_frame_words(subtype, blob, pc.wrapping_sub(code_begin) as u32, kind),
        )
    };
    if !push_frame(walk, words[0]) || !push_frame(walk, words[1]) {
        count(walk.counters, HotspotCount::FrameLimit, 1);
        return false;
    }
    walk.runtime_frames += 1;
    (walk.pc, walk.sp, walk.fp) = caller;
    walk.return_address = 1;
    true
}

/// The caller's registers from a frame whose return address is the word below `cfa`, and
/// whose saved frame pointer (when `saved_fp`) is the word below that.
#[inline(always)]
fn caller_at(cfa: u64, fp: u64, saved_fp: bool) -> Option<(u64, u64, u64)> {
    if !saved_fp {
        return Some((read_u64(cfa - 8)?, cfa, fp));
    }
    let [saved_fp, ret] = read::<[u64; 2]>(cfa - 16)?;
    Some((ret, cfa, saved_fp))
}

/// The caller of a frame whose caller is Java code, so that its return address lies in the
/// code cache. `whole`: the frame is set up, `frame_size` bytes from `sp` with the return
/// address and the saved frame pointer on top. Otherwise, and as a fallback at the leaf, the
/// frame is being built or torn down: the return address at `sp` (before `push rbp`, or
/// after the epilogue's `pop rbp`), or above the pushed frame pointer.
#[inline(always)]
fn compiled_caller(
    proc: &HotspotProc,
    sp: u64,
    fp: u64,
    frame_size: u64,
    whole: bool,
    leaf: bool,
) -> Option<(u64, u64, u64)> {
    if whole {
        if let Some(caller) = caller_at(sp + frame_size, fp, true) {
            if heap_of(proc, caller.0).is_some() {
                return Some(caller);
            }
        }
    }
    if !leaf {
        return None;
    }
    if let Some(caller) = caller_at(sp + 8, fp, false) {
        if heap_of(proc, caller.0).is_some() {
            return Some(caller);
        }
    }
    let caller = caller_at(sp + 16, fp, true)?;
    heap_of(proc, caller.0).map(|_| caller)
}

/// Replaces the code-cache frame the walk in `WALK`'s `slot` is at with its Java frames, up to
/// [`FRAMES_PER_CALL`], and leaves the walk's registers at the last one's caller; returns 0.
/// While that caller is in the code cache too, the walk's next iteration comes back here
/// (`WalkState::runtime` set again), and once it is not, the native walk goes on from it
/// (`stepped`). A frame that cannot be read goes back to the native walk as a pc it records
/// and steps past by frame pointer. A global function, so the verifier checks it once on its
/// own (see `python.rs`); a plain loop of a few frames, not a `bpf_loop` callback, keeps
/// its stack off the chain of calls the verifier bounds at 512 bytes.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn scorch_hotspot_walk(slot: u32) -> u32 {
    if let Some(walk) = WALK.get_ptr_mut(slot) {
        // SAFETY: this CPU's walk state, which the walk that called this has handed over.
        walk_at(unsafe { &mut *walk });
    }
    0
}

#[inline(always)]
fn walk_at(walk: &mut WalkState) {
    let Some(proc) = HOTSPOT_PROCS.get_ptr(walk.tgid) else {
        return;
    };
    let Some(scratch) = HOTSPOT_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: map values, alive while the program runs; the scratch is this CPU's.
    let (proc, scratch) = unsafe { (&*proc, &mut *scratch) };
    // The JVM's collections count, once per hand-over: its low bits go in each frame's
    // cookie, and the agent names a frame only while the count is the same (a class is
    // unloaded only by a collection, and its memory may be reused after).
    if walk.claimed == 0 {
        scratch.frames = 0;
        walk.epoch = 0;
        if proc.collected_heap != 0 {
            if let Some(heap) = read_u64(proc.collected_heap) {
                walk.epoch =
                    read_u32(heap.wrapping_add(u64::from(proc.total_collections))).unwrap_or(0);
            }
        }
    }
    for _ in 0..FRAMES_PER_CALL {
        if !java_frame(walk, proc, scratch) {
            // Not claimed: the native walk records the pc and steps past it.
            count(walk.counters, HotspotCount::Frames, scratch.frames);
            walk.claimed = 0;
            walk.stepped = 0;
            return;
        }
        scratch.frames += 1;
        walk.claimed = 1;
        if heap_of(proc, walk.pc.wrapping_sub(1)).is_none() {
            // The hand-over ends: its frames are counted once.
            count(walk.counters, HotspotCount::Frames, scratch.frames);
            walk.stepped = 1;
            return;
        }
    }
    // More Java frames: the walk's next iteration comes back here.
    walk.runtime = RuntimeId::Hotspot as u32;
}
