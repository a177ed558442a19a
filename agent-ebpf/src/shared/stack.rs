//! The walk's state and the stack it fills, and the stores of walked stacks.
//!
//! [`WalkState`] is the one per-CPU record a walk carries from frame to frame (1 KiB of frames
//! does not fit the 512-byte BPF stack). It names no runtime: a runtime's walk keeps its own
//! state in its own map and adds frames with [`push_frame`]; the walk hands a frame to a
//! runtime through [`WalkState::runtime`], a value read from the frame's mapping
//! (`scorch_common::RuntimeId`).

use core::ffi::c_void;

use aya_ebpf::{
    bindings::{
        BPF_NOEXIST, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, BPF_RB_RING_SIZE,
    },
    btf_maps,
    macros::map,
    maps::{PerCpuArray, RingBuf},
};
use scorch_common::{
    walked_stack_id, SeenStack, UserStack, MAX_USER_STACK_DEPTH, WALKED_GENERATION_1,
    WALKED_RUNTIME_FRAMES, WALKED_STACK_HEADER,
};

/// A task's user registers as a walk starts from them (`crate::arch` reads them).
#[derive(Clone, Copy)]
pub struct UserRegs {
    pub pc: u64,
    pub sp: u64,
    /// The frame pointer.
    pub fp: u64,
    /// The register HotSpot's interpreter keeps its bytecode pointer in (x86-64's r13): a
    /// leaf interpreted frame's bci is there, not in its frame.
    pub bcp: u64,
    /// The link register (arm64's x30; 0 where there is none): the return address of a
    /// function that has not saved it yet.
    pub lr: u64,
}

/// Per-CPU walk state: slot [`WALK_SAMPLE`] for the perf-event sampler, [`WALK_OFF_CPU`] for
/// the `sched_switch` program, so that one can never overwrite a walk of the other on the
/// same CPU.
#[map]
pub static WALK: PerCpuArray<WalkState> = PerCpuArray::with_max_entries(2, 0);

/// [`WALK`]'s slot for the perf-event sampler.
pub const WALK_SAMPLE: u32 = 0;
/// [`WALK`]'s slot for the off-CPU program.
pub const WALK_OFF_CPU: u32 = 1;

/// Words of the stack copied at once (512 bytes): a frame's words are most often within a
/// few hundred bytes above the last frame's, and a read costs about as much for 512 bytes as
/// for 8, so one read serves several frames. A power of two, to bound indices by masking.
pub const WINDOW_WORDS: usize = 64;

/// Not an outcome: the walk goes on.
pub const WALKING: u32 = u32::MAX;

/// The walk's registers and frames, in a per-CPU map value.
#[repr(C)]
pub struct WalkState {
    pub pc: u64,
    pub sp: u64,
    /// The frame pointer.
    pub fp: u64,
    /// The pc to report in an `EVENT_UNKNOWN_PC`.
    pub unknown_pc: u64,
    /// Zero once a rule left the caller's frame pointer unknown.
    pub fp_known: u32,
    /// Non-zero while `lr` holds the current frame's link register: in the frame the walk
    /// started from, and in the one a signal frame interrupted. A caller's is long gone.
    pub lr_valid: u32,
    /// The link register, when `lr_valid`.
    pub lr: u64,
    /// Non-zero when `pc` is a return address: its call instruction (pc - 1) is looked up.
    pub return_address: u32,
    /// `UnwindOutcome` of the end, or [`WALKING`].
    pub stop: u32,
    /// Non-zero when some frame fell back to frame pointers for lack of a mapping.
    pub no_mapping: u32,
    /// Non-zero when some frame fell back to frame pointers for lack of a loaded table.
    pub table_pending: u32,
    /// Non-zero when some frame fell back to frame pointers because its table was evicted.
    pub table_evicted: u32,
    /// Non-zero when some frame in a described mapping had no row and took a frame-pointer
    /// step instead.
    pub no_row_step: u32,
    /// Non-zero when the frame just recorded had no row: the next iteration takes its
    /// checked frame-pointer step.
    pub no_row_next: u32,
    /// The runtime whose walk runs in the next iteration (`RuntimeId`), 0 for the native walk.
    pub runtime: u32,
    /// Non-zero when the current frame was handed to its runtime already: the native walk
    /// steps past it, and does not hand it over again.
    pub handed: u32,
    /// Non-zero when the runtime replaced the current frame with frames of its own: the
    /// native walk steps past it without recording its pc.
    pub claimed: u32,
    /// Frames any runtime added to this walk.
    pub runtime_frames: u32,
    /// Non-zero when the runtime unwound its frames itself and left `pc`, `sp` and `fp` at
    /// the first frame past them: the native walk goes on from there without a step.
    pub stepped: u32,
    /// The JVM's collections count at this sample, read by HotSpot's walk at its first frame
    /// of each hand-over (see `runtimes/hotspot.rs`).
    pub epoch: u32,
    /// [`UserRegs::bcp`] at the walk's start.
    pub bcp: u64,
    /// The run of the counter arrays this walk counts in (`COUNTER_RUNS`).
    pub counters: u32,
    /// Non-zero when the process map held the process.
    pub known: u32,
    /// The mapping of the frame last looked up, plus one; 0 when it was in none.
    pub last_mapping: u32,
    /// This walk's first entry in the row cache.
    pub cache_base: u32,
    /// The process walked.
    pub tgid: u32,
    /// [`WALK`]'s slot of this walk: a runtime keeps its per-walk state in the same slot of
    /// its own map.
    pub slot: u32,
    /// Tells one walk of this slot from the next (bumped at each start), so a runtime's state
    /// of an earlier walk is never taken for this one's.
    pub serial: u64,
    /// The row cache's tag of the entries valid for this walk.
    pub cache_tag: u64,
    /// The user address of `window[0]`.
    pub window_base: u64,
    /// How many words of `window` hold the stack from `window_base`; 0 before the first read.
    pub window_words: u64,
    /// Where the words read last begin in `window`.
    pub window_index: u64,
    /// A copy of the stack from `window_base`.
    pub window: [u64; WINDOW_WORDS],
    /// The frames, and their hash.
    pub stack: UserStack,
}

/// Appends `word` (a pc, or a runtime's frame word) to the walked stack and its hash; false
/// when the stack is full.
#[inline(always)]
pub fn push_frame(walk: &mut WalkState, word: u64) -> bool {
    // Read from memory each time: for two pushes in a row (a runtime's frame and its
    // continuation) the compiler otherwise reuses the first's `len + 1` and folds the second's
    // bound check into the first's `len != 255`, which 6.1's verifier does not turn into a
    // bound on the index.
    // SAFETY: a plain read of a field of this CPU's walk state.
    let len = unsafe { core::ptr::read_volatile(&walk.stack.len) } as usize;
    let Some(slot) = walk.stack.pcs.get_mut(len) else {
        return false;
    };
    *slot = word;
    walk.stack.len = len as u32 + 1;
    walk.stack.hash = (walk.stack.hash ^ word).wrapping_mul(0x0000_0100_0000_01b3);
    true
}

/// The walked stack's identity: the frames' hash carries a word's high bits (a runtime
/// frame's fields above the address) only into its own high bits, and ids are the low ones,
/// so they are mixed down first (MurmurHash3's finaliser), or stacks differing in a line
/// would collide.
#[inline(always)]
pub fn mixed_hash(walk: &WalkState) -> u64 {
    let mut hash = walk.stack.hash ^ u64::from(walk.stack.len);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash
}

/// A generation's record of the walked stacks its window sent through [`WALKED_STACKS`]: id
/// to the stack's hash, which tells the same stack from a collision. Preallocated, so that a
/// new stack allocates nothing: the kernel's allocator of maps that are not refills its
/// per-CPU caches through IRQ work, an interrupt each few new stacks, which the sample that
/// raises it pays for (an exit to the host in a VM). The agent creates each generation's
/// map with the same flags, sized to the stacks its windows send.
pub type SeenStackMap = btf_maps::HashMap<i32, SeenStack, 1, 0>;

/// The walked stacks new to their window, each sent once as a [`UserStack`]'s first
/// `WALKED_STACK_HEADER + 8 * len` bytes: a ring is allocated once, and a record takes only
/// the frames the stack has. The agent keeps them by generation, reads them every 200 ms, and
/// at once when this program wakes it: when the ring is a quarter full. Sized by the agent at
/// load time.
#[map]
pub static WALKED_STACKS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Why a walked stack was not stored.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum StoreError {
    /// Another stack holds its id.
    Collision,
    /// The map refused it (full, or another error).
    Refused,
    /// [`WALKED_STACKS`] had no room for it.
    RingFull,
}

/// Returns the id of the walked stack of `tgid` in generation `generation`, sending it through
/// [`WALKED_STACKS`] when `seen` (the generation's [`SeenStackMap`]) does not hold it yet.
#[inline(always)]
pub fn store_stack(
    seen: &SeenStackMap,
    walk: &mut WalkState,
    tgid: u32,
    generation: u32,
) -> Result<i32, StoreError> {
    // The sent hash is the mixed one, so a later sample compares like with like.
    let hash = mixed_hash(walk);
    walk.stack.hash = hash;
    let id = walked_stack_id(hash);
    // SAFETY: a plain read of a map value; a concurrent writer of the same key writes the
    // same hash or a colliding one, either read whole.
    if let Some(existing) = unsafe { seen.get(id) } {
        return if existing.hash == hash {
            Ok(id)
        } else {
            Err(StoreError::Collision)
        };
    }
    if seen
        .insert(id, &SeenStack { hash }, u64::from(BPF_NOEXIST))
        .is_err()
    {
        // Another CPU recorded this id in between: the same stack, which it sends, or a
        // collision; or the map is full.
        // SAFETY: as above.
        return match unsafe { seen.get(id) } {
            Some(existing) if existing.hash == hash => Ok(id),
            Some(_) => Err(StoreError::Collision),
            None => Err(StoreError::Refused),
        };
    }
    walk.stack.tgid = tgid;
    walk.stack.flags = (generation & WALKED_GENERATION_1)
        | if walk.runtime_frames > 0 {
            WALKED_RUNTIME_FRAMES
        } else {
            0
        };
    if send(walk).is_err() {
        // Not sent: the next sample of this stack tries again.
        let _ = seen.remove(id);
        return Err(StoreError::RingFull);
    }
    Ok(id)
}

/// Sends the walked stack's header and frames through [`WALKED_STACKS`]; wakes the agent when
/// the ring is over a quarter full, so a burst of new stacks is read before it fills.
#[inline(always)]
fn send(walk: &WalkState) -> Result<(), i32> {
    let len = walk.stack.len as usize;
    let len = if len > MAX_USER_STACK_DEPTH {
        MAX_USER_STACK_DEPTH
    } else {
        len
    };
    let bytes = WALKED_STACK_HEADER + len * 8;
    // SAFETY: `bytes` is at most a `UserStack`'s size, and the stack lives in this CPU's
    // walk state for the whole run.
    let record = unsafe {
        core::slice::from_raw_parts((&walk.stack as *const UserStack).cast::<u8>(), bytes)
    };
    let queued = WALKED_STACKS.query(u64::from(BPF_RB_AVAIL_DATA));
    let size = WALKED_STACKS.query(u64::from(BPF_RB_RING_SIZE));
    let wakeup = if queued.saturating_mul(4) >= size {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    WALKED_STACKS.output::<[u8]>(record, u64::from(wakeup))
}

/// Most words [`WalkState::read_up_to`] reads at once: the callee-saved registers a function pushes
/// (the frame pointer among them) and the return address, 64 bytes.
pub const MAX_SAVE_WORDS: usize = 8;

impl WalkState {
    /// Makes the `count` words (1 to [`MAX_SAVE_WORDS`]) below `end` readable with [`WalkState::word`].
    /// They come from the walk's copy of the stack when it holds them; otherwise the
    /// [`WINDOW_WORDS`] from their first are copied in one read (the callers' frames lie above),
    /// or, where that read fails (the stack's end is closer than that), the `count` alone.
    /// Reads cost about the same for 8 bytes as for 512, and each frame needs its return address
    /// and most often a saved frame pointer a few words below it (`cargo xtask bench --only walk`).
    #[inline(always)]
    pub fn read_up_to(&mut self, end: u64, count: u64) -> bool {
        let walk = self;
        if count == 0 || count > MAX_SAVE_WORDS as u64 {
            return false;
        }
        let start = end.wrapping_sub(count * 8);
        // Below the copy, the offset wraps to a huge value: one comparison covers both sides.
        let offset = start.wrapping_sub(walk.window_base);
        if offset & 7 == 0 && offset / 8 + count <= walk.window_words {
            walk.window_index = offset / 8;
            return true;
        }
        walk.window_base = start;
        walk.window_index = 0;
        // SAFETY: the destination is this CPU's walk state, the size the window's; the helper
        // checks the user address, a fault is an error, never a crash.
        let whole = unsafe {
            aya_ebpf::helpers::generated::bpf_probe_read_user(
                walk.window.as_mut_ptr().cast(),
                (WINDOW_WORDS * 8) as u32,
                start as *const c_void,
            )
        };
        if whole == 0 {
            walk.window_words = WINDOW_WORDS as u64;
            return true;
        }
        walk.window_words = 0;
        // The same size, in a form the verifier bounds by the buffer's (it may not relate the
        // test above to this register).
        let bytes = ((((count - 1) as u32) & (MAX_SAVE_WORDS as u32 - 1)) + 1) * 8;
        // SAFETY: as above, `bytes` at most 64.
        let result = unsafe {
            aya_ebpf::helpers::generated::bpf_probe_read_user(
                walk.window.as_mut_ptr().cast(),
                bytes,
                start as *const c_void,
            )
        };
        if result != 0 {
            return false;
        }
        walk.window_words = count;
        true
    }

    /// Word `i` of the last [`WalkState::read_up_to`].
    #[inline(always)]
    pub fn word(&self, i: u64) -> u64 {
        let walk = self;
        walk.window[(walk.window_index.wrapping_add(i) as usize) & (WINDOW_WORDS - 1)]
    }
}
