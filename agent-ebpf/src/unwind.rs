//! The user-stack walk with unwind tables (`Control::unwind == UNWIND_TABLES`).
//!
//! Per frame: find the process's mapping holding the pc (`UNWIND_PROCS`), binary-search its
//! table's rows in the pool that holds them (`UNWIND_ROWS`), compute the CFA and read the
//! return address and the saved rbp from the stack. Code without a loaded table (JIT,
//! anonymous memory, a table still being built) takes a frame-pointer step instead, and the
//! walk goes back to tables at the next frame. Each walk ends with one counted [`UnwindOutcome`]; a walk that cannot
//! finish keeps the frames it found, never a guessed caller.
//!
//! Every loop is a `bpf_loop` (5.17+) callback: one frame per iteration of the walk, one probe
//! per iteration of the two binary searches inside it. The verifier then checks one frame and
//! one probe, not the paths through 127 frames of unrolled searches (6.1's verifier gave up at
//! its million instructions on the unrolled searches). The walk's state is in a per-CPU array:
//! 1 KiB of frames does not fit the 512-byte stack.

use core::ffi::c_void;

use crate::python;

use aya_ebpf::{
    bindings::{pt_regs, BPF_NOEXIST, BPF_RB_NO_WAKEUP},
    btf_maps,
    helpers::{
        bpf_get_current_task_btf, bpf_ktime_get_ns, bpf_loop, bpf_probe_read_kernel,
        bpf_probe_read_user, bpf_task_pt_regs,
    },
    macros::{btf_map, map},
    maps::{Array, LruHashMap, PerCpuArray, RingBuf},
    programs::PerfEventContext,
};
use scorch_common::{
    Bisect, CfaKind, ProcMappings, PythonProc, RbpKind, ShortUserStack, UnwindEvent, UnwindMapping,
    UnwindOutcome, UnwindRow, UserStack, WalkedStack, COUNTER_RUNS, EVENT_PYTHON_STACK,
    EVENT_UNKNOWN_PC, EVENT_UNKNOWN_PROCESS, MAPPING_SEARCH_STEPS, MAPPING_TABLE_EVICTED,
    MAPPING_TABLE_LOADED, MAPPING_TABLE_PENDING, MAX_PROC_MAPPINGS, MAX_ROW_POOLS,
    MAX_UNWIND_PROCS, MAX_USER_STACK_DEPTH, PROCS_NO_MAPPINGS, ROW_CACHE_SLOTS,
    SHORT_USER_STACK_DEPTH, SHORT_USER_STACK_ID, UNWIND_OUTCOMES, UNWIND_SEARCH_STEPS,
};

/// A row pool's flags. `BPF_F_MMAPABLE`: the agent writes tables straight into the pool's
/// memory, not one syscall per row. `BPF_F_INNER_MAP`: pools of any size fit the outer array
/// (the template's one entry is not a bound); the price is that a row lookup is a helper call
/// the verifier cannot inline, measured by `cargo xtask bench --only walk`.
const POOL_FLAGS: usize = (1 << 10) | (1 << 12);

/// A row pool: an array of rows the agent creates, sizes and maps into its memory.
type RowPool = btf_maps::Array<UnwindRow, 1, POOL_FLAGS>;

/// The row pools: every loaded table is a range of one of them (`UnwindMapping::pool`). The
/// agent adds pools as tables need room, up to a ceiling (`UNWIND_POOL_ROWS` rows by default),
/// and gives back the ones left empty, so the memory follows what the processes' tables take
/// rather than the ceiling. One more lookup per frame than a single array, none per probe.
#[btf_map]
static UNWIND_ROWS: btf_maps::ArrayOfMaps<RowPool, { MAX_ROW_POOLS as usize }> =
    btf_maps::ArrayOfMaps::new();

/// A process map: each known process's executable mappings, written by the agent.
/// Preallocated (2.5 KiB a process), as it was when it was a single map: without
/// preallocation, the test of a map without room
/// (`unwind::a_process_without_room_in_the_process_map_walks_by_frame_pointers_and_others_go_on`)
/// found one sample in about seven with no walk outcome counted, unexplained yet.
type ProcMap = btf_maps::HashMap<u32, ProcMappings, 1, 0>;

/// The process map, in the one slot of an outer array: the agent creates it at a size for the
/// processes running, and when it fills, replaces it with one twice as large holding the same
/// processes, up to a ceiling (`--unwind-processes`). One more lookup per sample.
#[btf_map]
static UNWIND_PROCS: btf_maps::ArrayOfMaps<ProcMap, 1> = btf_maps::ArrayOfMaps::new();

/// The process map in use.
#[inline(always)]
fn procs() -> Option<&'static ProcMap> {
    UNWIND_PROCS.get(0)
}

/// Unknown processes and pcs, for the agent to read their maps.
#[map]
static UNWIND_EVENTS: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);

/// When each process last sent an event (ns, `bpf_ktime_get_ns`): at most one per
/// `NOTIFY_INTERVAL_NS`, so a process running JIT code does not flood the agent.
#[map]
static NOTIFIED: LruHashMap<u32, u64> = LruHashMap::with_max_entries(MAX_UNWIND_PROCS, 0);

/// Per-CPU counters, a run of [`UnwindOutcome`] kinds per generation and one for the off-CPU
/// program's walks (`COUNTER_RUNS`).
#[map]
static UNWIND_OUTCOMES_COUNT: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(UNWIND_OUTCOMES * COUNTER_RUNS, 0);

/// Per-CPU walk state: slot [`WALK_SAMPLE`] for the perf-event sampler, [`WALK_OFF_CPU`] for
/// the `sched_switch` program, so that one can never overwrite a walk of the other on the
/// same CPU.
#[map]
static WALK: PerCpuArray<WalkState> = PerCpuArray::with_max_entries(2, 0);

/// Where a search found the row for a pc of a table, kept for the next walk that needs it
/// ([`ROW_CACHE`]).
#[repr(C)]
#[derive(Clone, Copy)]
struct CachedRow {
    pool: u32,
    first_row: u32,
    pc: u32,
    /// The row's index in its table.
    index: u32,
    /// [`ROW_EPOCH`]'s value when the row was found, plus one: a zeroed entry matches nothing.
    tag: u64,
}

/// Per-CPU cache of found rows, [`ROW_CACHE_SLOTS`] entries per [`WALK`] slot, direct-mapped
/// by the row's key. Only a stack's leaf pc moves from sample to sample: the callers' return
/// addresses are the same ones over and over (and again inside a recursion), and each took a
/// binary search of some 16 probes in its table, the largest part of a walk's cost (`cargo
/// xtask bench --only walk`). A hit starts the search settled: one row lookup.
#[map]
static ROW_CACHE: PerCpuArray<CachedRow> = PerCpuArray::with_max_entries(ROW_CACHE_SLOTS * 2, 0);

/// Bumped by the agent whenever it frees rows of a pool (an evicted or idle table, a pool
/// given back), before another table can take them: rows cached under an earlier value may
/// belong to a table that is gone, so they no longer match.
#[map]
static ROW_EPOCH: Array<u64> = Array::with_max_entries(1, 0);

/// [`WALK`]'s slot for the perf-event sampler.
pub const WALK_SAMPLE: u32 = 0;
/// [`WALK`]'s slot for the off-CPU program.
pub const WALK_OFF_CPU: u32 = 1;

const NOTIFY_INTERVAL_NS: u64 = 250_000_000;

/// Not an outcome: the walk goes on.
const WALKING: u32 = u32::MAX;

/// The walk's registers and frames, in a per-CPU map value.
#[repr(C)]
pub struct WalkState {
    pc: u64,
    sp: u64,
    bp: u64,
    /// The pc to report in an `EVENT_UNKNOWN_PC`.
    unknown_pc: u64,
    /// Zero once a rule left the caller's rbp unknown.
    bp_known: u32,
    /// Non-zero when `pc` is a return address: its call instruction (pc - 1) is looked up.
    return_address: u32,
    /// [`UnwindOutcome`] of the end, or `WALKING`.
    stop: u32,
    /// Non-zero when some frame fell back to frame pointers for lack of a mapping.
    no_mapping: u32,
    /// Non-zero when some frame fell back to frame pointers for lack of a loaded table.
    table_pending: u32,
    /// Non-zero when some frame fell back to frame pointers because its table was evicted.
    table_evicted: u32,
    /// Non-zero when some frame in a described mapping had no row and took a frame-pointer
    /// step instead.
    no_row_step: u32,
    /// Non-zero when the frame just recorded had no row: the next iteration takes its
    /// checked frame-pointer step (see [`step`]).
    no_row_next: u32,
    /// Non-zero once the walk looked for the thread's Python frames (`python`).
    pub python_started: u32,
    /// Python frames emitted so far.
    pub python_frames: u32,
    /// The run of the counter arrays this walk counts in (`COUNTER_RUNS`).
    pub counters: u32,
    /// Non-zero when the process map held the process.
    known: u32,
    /// The mapping of the frame last looked up, plus one; 0 when it was in none.
    last_mapping: u32,
    /// This walk's first entry in [`ROW_CACHE`].
    cache_base: u32,
    /// [`CachedRow::tag`] of the entries valid for this walk.
    cache_tag: u64,
    /// The next Python frame to emit, at the next eval-loop frame; 0 when there is none.
    pub python_frame: u64,
    /// The user address of `window[0]`.
    window_base: u64,
    /// How many words of `window` hold the stack from `window_base`; 0 before the first read.
    window_words: u64,
    /// Where the words [`read_up_to`] read last begin in `window`.
    window_index: u64,
    /// A copy of the stack from `window_base` ([`read_up_to`]).
    window: [u64; WINDOW_WORDS],
    /// The frames, and their hash.
    pub stack: UserStack,
}

/// Most words [`read_up_to`] reads at once: the callee-saved registers a function pushes
/// (rbp among them) and the return address, 64 bytes.
const MAX_SAVE_WORDS: usize = 8;

/// Words of the stack copied at once (512 bytes): a frame's words are most often within a
/// few hundred bytes above the last frame's, and a read costs about as much for 512 bytes as
/// for 8, so one read serves several frames. A power of two, to bound indices by masking.
const WINDOW_WORDS: usize = 64;

/// What each loop iteration needs: pointers to map values, so no iteration looks them up.
#[repr(C)]
struct LoopContext {
    state: *mut WalkState,
    procs: *const ProcMappings,
    /// The process's CPython interpreter, or `PYTHON_NO_INTERPRETER`'s empty entry.
    python: *const PythonProc,
}

/// The search for the mapping holding `pc` (mappings are sorted by start).
#[repr(C)]
struct MappingSearch {
    bisect: Bisect,
    pc: u64,
    procs: *const ProcMappings,
}

/// The search for the row covering `pc` among `rows` from `first_row` of `pool`.
#[repr(C)]
struct RowSearch {
    pool: &'static RowPool,
    bisect: Bisect,
    first_row: u32,
    pc: u32,
}

/// Runs `callback` up to `iterations` times over `context`, until it returns 1.
#[inline(always)]
pub(crate) fn repeat<T>(
    iterations: u32,
    callback: extern "C" fn(u64, *mut c_void) -> i64,
    context: &mut T,
) {
    // SAFETY: the callback has the signature bpf_loop calls and casts the context back to the
    // `T` it is given here, which outlives the call.
    unsafe {
        bpf_loop(
            iterations,
            callback as *mut c_void,
            (context as *mut T).cast(),
            0,
        )
    };
}

/// The user registers: the sample's when it interrupted user mode, else the task's saved
/// ones (a sample in a system call or a page fault). `None` for kernel threads.
#[inline(always)]
fn user_regs(ctx: &PerfEventContext, user_mode: bool) -> Option<(u64, u64, u64)> {
    if user_mode {
        // SAFETY: perf_event programs may read the saved registers in their context.
        let regs = unsafe { &(*ctx.ctx).regs };
        return Some((regs.rip, regs.rsp, regs.rbp));
    }
    current_user_regs()
}

/// The current task's saved user registers (pc, sp, rbp), from its kernel stack's `pt_regs`;
/// `None` for kernel threads.
#[inline(always)]
pub fn current_user_regs() -> Option<(u64, u64, u64)> {
    // SAFETY: helpers with no memory arguments; the result is checked before use.
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const pt_regs;
    if regs.is_null() {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel checks the address.
    let regs = unsafe { bpf_probe_read_kernel(regs) }.ok()?;
    // A kernel thread's saved registers are not user ones (CS privilege level 3).
    (regs.cs & 3 == 3).then_some((regs.rip, regs.rsp, regs.rbp))
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

/// Walks the current task's user stack from registers (pc, sp, rbp) into `WALK`'s `slot`,
/// counting in the counter arrays' run `counters`.
#[inline(always)]
pub fn walk_from(
    (pc, sp, bp): (u64, u64, u64),
    tgid: u32,
    slot: u32,
    counters: u32,
) -> Option<&'static mut WalkState> {
    if pc == 0 {
        return None;
    }
    let state = WALK.get_ptr_mut(slot)?;
    // SAFETY: this CPU's slot; the program cannot run twice at once on one CPU.
    let walk = unsafe { &mut *state };
    walk.pc = pc;
    walk.sp = sp;
    walk.bp = bp;
    walk.unknown_pc = 0;
    walk.bp_known = 1;
    walk.return_address = 0;
    walk.stop = WALKING;
    walk.no_mapping = 0;
    walk.table_pending = 0;
    walk.table_evicted = 0;
    walk.no_row_step = 0;
    walk.no_row_next = 0;
    walk.python_started = 0;
    walk.python_frames = 0;
    walk.python_frame = 0;
    walk.counters = counters;
    walk.cache_base = slot * ROW_CACHE_SLOTS;
    walk.stack.len = 0;
    walk.window_words = 0;
    walk.last_mapping = 0;
    walk.stack.hash = 0xcbf2_9ce4_8422_2325;

    // Read before the process's mappings: a walk that sees a new epoch then also sees the
    // mappings the agent rewrote before it freed their rows (`ROW_EPOCH`).
    walk.cache_tag = ROW_EPOCH.get(0).copied().unwrap_or(0).wrapping_add(1);
    // A process the map does not hold walks with its entry of no mappings, a value of the
    // same map (`PROCS_NO_MAPPINGS`). Whether it was known is kept in the walk's state, not
    // in a register: a value live across the loop is in each state the verifier compares.
    let map = procs()?;
    let known = map.get_ptr(tgid);
    walk.known = u32::from(known.is_some());
    let procs = match known {
        Some(procs) => procs,
        None => map.get_ptr(PROCS_NO_MAPPINGS)?,
    };
    // A walk needs the interpreter entry, real or empty (`PYTHON_NO_INTERPRETER`), which the
    // agent writes before the program is attached.
    let python = python::process(tgid)?;
    // Twice the frames: a frame without a row takes two iterations (see `step`).
    repeat(
        2 * MAX_USER_STACK_DEPTH as u32,
        step,
        &mut LoopContext {
            state,
            procs,
            python,
        },
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
        notify(tgid, EVENT_UNKNOWN_PROCESS, pc);
    } else if walk.no_mapping != 0 {
        notify(tgid, EVENT_UNKNOWN_PC, walk.unknown_pc);
    }
    Some(walk)
}

/// One frame: records the pc, then finds the caller's registers. Returns 1 to end the loop.
extern "C" fn step(_index: u64, context: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes back the context `walk` gave it, whose pointers are map values.
    let context = unsafe { &*(context as *const LoopContext) };
    // SAFETY: as above; this CPU's walk state.
    let (walk, procs) = unsafe { (&mut *context.state, &*context.procs) };
    // The frame the last iteration recorded had no row. Its caller is found here, in an
    // iteration of its own, rather than at the end of that iteration's table step: the
    // verifier checks an iteration's code once for each distinct state it reaches it with,
    // and a table step ends in `NoRow` by many paths, each a state. Inline, this step was
    // checked once for each of them; here, once per check of the callback (`scorch check`
    // prints the instructions the verifier walked).
    if walk.no_row_next != 0 {
        walk.no_row_next = 0;
        let outcome = checked_frame_pointer_step(walk, procs);
        return end_of_step(walk, outcome);
    }
    let pc = walk.pc;
    let lookup = if walk.return_address != 0 { pc - 1 } else { pc };
    // An eval-loop frame of a CPython process stands for the Python frames it runs.
    let python_frames = {
        // SAFETY: a map value `walk` looked up for this process, never null.
        let python = unsafe { &*context.python };
        if python::in_eval_loop(python, lookup) {
            python::emit(walk, python)
        } else {
            0
        }
    };
    if python_frames == 0 {
        let len = walk.stack.len as usize;
        let Some(slot) = walk.stack.pcs.get_mut(len) else {
            walk.stop = UnwindOutcome::FrameLimit as u32;
            return 1;
        };
        *slot = pc;
        walk.stack.len = len as u32 + 1;
        walk.stack.hash = (walk.stack.hash ^ pc).wrapping_mul(0x0000_0100_0000_01b3);
    }
    walk.return_address = 1;
    // A caller is most often in the mapping of the frame it called (a recursion, a library
    // calling itself): that one is tried before the search.
    let last = walk.last_mapping;
    let mut index = None;
    if last != 0 {
        let m = mapping_at(procs, last - 1);
        if lookup >= m.start && lookup < m.end {
            index = Some(last - 1);
        }
    }
    if index.is_none() {
        let mut search = MappingSearch {
            bisect: Bisect::new(procs.count.min(MAX_PROC_MAPPINGS as u32)),
            pc: lookup,
            procs,
        };
        repeat(MAPPING_SEARCH_STEPS, probe_mapping, &mut search);
        index = search
            .bisect
            .found()
            .filter(|&i| lookup < mapping_at(procs, i).end);
    }
    walk.last_mapping = index.map_or(0, |i| i + 1);
    let mapping = index.map(|i| mapping_at(procs, i));
    let outcome = match mapping {
        Some(m) if m.state == MAPPING_TABLE_LOADED => {
            let row_pc = lookup.wrapping_sub(m.bias);
            let outcome = if row_pc > u64::from(u32::MAX) {
                UnwindOutcome::NoRow as u32
            } else {
                table_step(walk, m, row_pc as u32)
            };
            // Code the binary's CFI leaves out (generated or hand-written, as V8's builtins
            // inside `node`) often keeps frame pointers: one checked step, in the next
            // iteration, then tables again.
            if outcome == UnwindOutcome::NoRow as u32 {
                walk.no_row_next = 1;
                WALKING
            } else {
                outcome
            }
        }
        Some(m) => {
            if m.state == MAPPING_TABLE_PENDING {
                walk.table_pending = 1;
            } else if m.state == MAPPING_TABLE_EVICTED {
                walk.table_evicted = 1;
            }
            frame_pointer_step(walk)
        }
        None => {
            if walk.no_mapping == 0 {
                walk.unknown_pc = pc;
            }
            walk.no_mapping = 1;
            frame_pointer_step(walk)
        }
    };
    end_of_step(walk, outcome)
}

/// What [`step`] returns to `bpf_loop` for `outcome`: 0 to go on, or 1 with the walk's end.
#[inline(always)]
fn end_of_step(walk: &mut WalkState, outcome: u32) -> i64 {
    if outcome == WALKING {
        0
    } else {
        walk.stop = outcome;
        1
    }
}

/// One probe of a [`MappingSearch`]. Returns 1 once the search is settled.
extern "C" fn probe_mapping(_index: u64, context: *mut c_void) -> i64 {
    // SAFETY: `step` passes its `MappingSearch`, whose `procs` is a map value.
    let search = unsafe { &mut *(context as *mut MappingSearch) };
    let Some(probe) = search.bisect.probe() else {
        return 1;
    };
    // SAFETY: as above.
    let start = mapping_at(unsafe { &*search.procs }, probe).start;
    search.bisect.narrow(probe, start <= search.pc);
    0
}

/// One probe of a [`RowSearch`]. Returns 1 once the search is settled, or a row is unreadable:
/// then the search is emptied, so it finds none.
extern "C" fn probe_row(_index: u64, context: *mut c_void) -> i64 {
    // SAFETY: `table_step` passes its `RowSearch`.
    let search = unsafe { &mut *(context as *mut RowSearch) };
    let Some(probe) = search.bisect.probe() else {
        return 1;
    };
    let Some(row) = search.pool.get(search.first_row.wrapping_add(probe)) else {
        search.bisect = Bisect::new(0);
        return 1;
    };
    search.bisect.narrow(probe, row.pc <= search.pc);
    0
}

/// Mapping `i`; the mask is what lets the verifier see the access in bounds, where a
/// comparison the compiler proved redundant would be dropped.
#[inline(always)]
fn mapping_at(procs: &ProcMappings, i: u32) -> &UnwindMapping {
    &procs.mappings[(i as usize) & (MAX_PROC_MAPPINGS - 1)]
}

/// Makes the `count` words (1 to [`MAX_SAVE_WORDS`]) below `end` readable with [`word`].
/// They come from the walk's copy of the stack when it holds them; otherwise the
/// [`WINDOW_WORDS`] from their first are copied in one read (the callers' frames lie above),
/// or, where that read fails (the stack's end is closer than that), the `count` alone.
/// Reads cost about the same for 8 bytes as for 512, and each frame needs its return address
/// and most often a saved rbp a few words below it (`cargo xtask bench --only walk`).
#[inline(always)]
fn read_up_to(walk: &mut WalkState, end: u64, count: u64) -> bool {
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

/// Word `i` of the last [`read_up_to`].
#[inline(always)]
fn word(walk: &WalkState, i: u64) -> u64 {
    walk.window[(walk.window_index.wrapping_add(i) as usize) & (WINDOW_WORDS - 1)]
}

#[inline(always)]
fn read(address: u64) -> Option<u64> {
    // SAFETY: bpf_probe_read_user checks the address; a fault is an error, never a crash.
    unsafe { bpf_probe_read_user(address as *const u64) }.ok()
}

/// The caller by the frame pointer: `[rbp]` is the caller's rbp, `[rbp + 8]` the return
/// address.
#[inline(always)]
fn frame_pointer_step(walk: &mut WalkState) -> u32 {
    if walk.bp_known == 0 {
        return UnwindOutcome::UnsupportedCfa as u32;
    }
    let bp = walk.bp;
    // The outermost frame: the C runtime clears rbp before calling into main.
    if bp == 0 {
        return UnwindOutcome::Completed as u32;
    }
    // The stack grows down: a frame pointer below the stack pointer is no frame.
    if bp < walk.sp {
        return UnwindOutcome::ReadFault as u32;
    }
    if !read_up_to(walk, bp.wrapping_add(16), 2) {
        return UnwindOutcome::ReadFault as u32;
    }
    let (caller_bp, return_address) = (word(walk, 0), word(walk, 1));
    if return_address == 0 {
        return UnwindOutcome::Completed as u32;
    }
    walk.pc = return_address;
    walk.sp = bp.wrapping_add(16);
    walk.bp = caller_bp;
    WALKING
}

/// A frame-pointer step where no row covers the pc, kept only when it looks like a real
/// caller: rbp known and not 0, the caller's frame above this one (the stack grows down, so a
/// walk whose stack pointer only rises cannot loop), and the return address inside one of the
/// process's executable mappings. Otherwise the walk ends as `NoRow` with the frames it has:
/// in code without frame pointers rbp is any value, and a caller read through it would be
/// made up.
#[inline(always)]
fn checked_frame_pointer_step(walk: &mut WalkState, procs: &ProcMappings) -> u32 {
    let bp = walk.bp;
    if walk.bp_known == 0 || bp == 0 || bp < walk.sp {
        return UnwindOutcome::NoRow as u32;
    }
    if !read_up_to(walk, bp.wrapping_add(16), 2) {
        return UnwindOutcome::NoRow as u32;
    }
    let (caller_bp, return_address) = (word(walk, 0), word(walk, 1));
    // The call instruction before the return address must be code this process maps.
    let call = return_address.wrapping_sub(1);
    let mut search = MappingSearch {
        bisect: Bisect::new(procs.count.min(MAX_PROC_MAPPINGS as u32)),
        pc: call,
        procs,
    };
    repeat(MAPPING_SEARCH_STEPS, probe_mapping, &mut search);
    let mapped = search
        .bisect
        .found()
        .is_some_and(|i| call < mapping_at(procs, i).end);
    if return_address == 0 || !mapped {
        return UnwindOutcome::NoRow as u32;
    }
    walk.no_row_step = 1;
    walk.pc = return_address;
    walk.sp = bp.wrapping_add(16);
    walk.bp = caller_bp;
    WALKING
}

/// The row of `mapping`'s table that covers `row_pc`, by a binary search that starts settled
/// on the row's index when [`ROW_CACHE`] holds it, and keeps the index there when it did not.
/// One path for a hit and a miss, so the verifier checks the search once.
#[inline(always)]
fn find_row(walk: &WalkState, mapping: &UnwindMapping, row_pc: u32) -> Option<UnwindRow> {
    // A pool given back after the mapping was read: no row, as for a table being replaced.
    let pool = UNWIND_ROWS.get(mapping.pool)?;
    let key = (row_pc ^ mapping.first_row.rotate_left(13) ^ mapping.pool.rotate_left(27))
        .wrapping_mul(0x9e37_79b1);
    let entry = ROW_CACHE.get_ptr_mut(walk.cache_base + (key >> 24) % ROW_CACHE_SLOTS)?;
    // SAFETY: this CPU's entry; the program cannot run twice at once on one CPU, and the
    // off-CPU program's walks use entries of their own.
    let entry = unsafe { &mut *entry };
    let hit = entry.tag == walk.cache_tag
        && entry.pc == row_pc
        && entry.first_row == mapping.first_row
        && entry.pool == mapping.pool;
    let mut search = RowSearch {
        pool,
        bisect: if hit {
            Bisect {
                low: entry.index.wrapping_add(1),
                high: entry.index.wrapping_add(1),
            }
        } else {
            Bisect::new(mapping.rows)
        },
        first_row: mapping.first_row,
        pc: row_pc,
    };
    // The entry takes this key now and its index once found (until then its tag matches
    // nothing): the fewer values live across the search, the smaller the frame, and the
    // three frames of sampler, walk and probe share 512 bytes of stack on 6.1.
    entry.pool = mapping.pool;
    entry.first_row = mapping.first_row;
    entry.pc = row_pc;
    entry.tag = 0;
    repeat(UNWIND_SEARCH_STEPS, probe_row, &mut search);
    let index = search.bisect.found()?;
    let row = *search.pool.get(search.first_row.wrapping_add(index))?;
    entry.index = index;
    entry.tag = walk.cache_tag;
    Some(row)
}

/// The caller by the row of `mapping`'s table that covers `row_pc`.
#[inline(always)]
fn table_step(walk: &mut WalkState, mapping: &UnwindMapping, row_pc: u32) -> u32 {
    let Some(row) = find_row(walk, mapping, row_pc) else {
        return UnwindOutcome::NoRow as u32;
    };
    let rbp_kind = row.rbp_kind();
    if rbp_kind == RbpKind::ReturnAddressUndefined {
        return UnwindOutcome::Completed as u32;
    }
    let sp = walk.sp;
    let offset = u64::from(row.cfa_offset);
    let rbp_offset = i64::from(row.rbp_offset) * 8;
    let cfa = match row.cfa_kind() {
        CfaKind::Rsp => sp.wrapping_add(offset),
        CfaKind::Rbp if walk.bp_known != 0 => walk.bp.wrapping_add(offset),
        CfaKind::Plt => {
            let pushed = (walk.pc & 15) >= row.rbp_offset as u64;
            sp.wrapping_add(offset)
                .wrapping_add(if pushed { 8 } else { 0 })
        }
        CfaKind::Signal => return signal_step(walk, offset, rbp_kind, rbp_offset),
        CfaKind::NoRow => return UnwindOutcome::NoRow as u32,
        CfaKind::Rbp | CfaKind::Unsupported => return UnwindOutcome::UnsupportedCfa as u32,
    };
    // A saved rbp a few words below the return address, as a prologue's pushes leave it,
    // comes in the same read.
    let saved_below = rbp_kind == RbpKind::CfaOffset
        && row.rbp_offset < 0
        && row.rbp_offset >= -(MAX_SAVE_WORDS as i8);
    let words = if saved_below {
        -i64::from(row.rbp_offset) as u64
    } else {
        1
    };
    if !read_up_to(walk, cfa, words) {
        return UnwindOutcome::ReadFault as u32;
    }
    let return_address = word(walk, words - 1);
    match rbp_kind {
        RbpKind::Unchanged => {}
        RbpKind::CfaOffset if saved_below => walk.bp = word(walk, 0),
        RbpKind::CfaOffset => match read(cfa.wrapping_add(rbp_offset as u64)) {
            Some(bp) => walk.bp = bp,
            None => return UnwindOutcome::ReadFault as u32,
        },
        RbpKind::AtRsp => match read(sp.wrapping_add(rbp_offset as u64)) {
            Some(bp) => walk.bp = bp,
            None => return UnwindOutcome::ReadFault as u32,
        },
        _ => walk.bp_known = 0,
    }
    if return_address == 0 {
        return UnwindOutcome::Completed as u32;
    }
    walk.pc = return_address;
    walk.sp = cfa;
    WALKING
}

/// A signal trampoline: the interrupted registers are in the `ucontext` on the stack. The
/// interrupted pc is where the signal came, not a return address.
#[inline(always)]
fn signal_step(walk: &mut WalkState, offset: u64, rbp_kind: RbpKind, rbp_offset: i64) -> u32 {
    let sp = walk.sp;
    let (Some(interrupted_sp), Some(interrupted_pc)) = (
        read(sp.wrapping_add(offset)),
        read(sp.wrapping_add(offset).wrapping_add(8)),
    ) else {
        return UnwindOutcome::ReadFault as u32;
    };
    if rbp_kind == RbpKind::AtRsp {
        match read(sp.wrapping_add(rbp_offset as u64)) {
            Some(bp) => walk.bp = bp,
            None => return UnwindOutcome::ReadFault as u32,
        }
    } else {
        walk.bp_known = 0;
    }
    if interrupted_pc == 0 {
        return UnwindOutcome::Completed as u32;
    }
    walk.pc = interrupted_pc;
    walk.sp = interrupted_sp;
    walk.return_address = 0;
    WALKING
}

#[inline(always)]
fn count(counters: u32, outcome: u32) {
    if let Some(counter) = UNWIND_OUTCOMES_COUNT.get_ptr_mut(counters * UNWIND_OUTCOMES + outcome) {
        // SAFETY: this CPU's slot; the program cannot run twice at once on one CPU.
        unsafe { *counter += 1 };
    }
}

/// Tells the agent about an unknown process or pc, at most once per `NOTIFY_INTERVAL_NS` per
/// process.
#[inline(always)]
fn notify(tgid: u32, kind: u32, pc: u64) {
    // SAFETY: no arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: a plain u64 value; a concurrent update can at worst let one more event through.
    if let Some(&last) = unsafe { NOTIFIED.get(tgid) } {
        if now.wrapping_sub(last) < NOTIFY_INTERVAL_NS {
            return;
        }
    }
    let _ = NOTIFIED.insert(tgid, now, 0);
    // A full ring buffer drops the event; the next sample after the interval sends it again.
    let _ = UNWIND_EVENTS.output::<UnwindEvent>(UnwindEvent { tgid, kind, pc }, 0);
}

/// After an exec the process's mappings are another program's: forget them, so its next
/// sample asks the agent again.
#[inline(always)]
pub fn forget_process(tgid: u32) {
    if let Some(procs) = procs() {
        let _ = procs.remove(tgid);
    }
    python::forget(tgid);
    let _ = NOTIFIED.remove(tgid);
}

/// A new mapping of `tgid` went at `start`, for the length in `info`: an executable mapping
/// the agent described there is gone, and whatever now sits at its addresses (another
/// library, after a `dlclose` and a `dlopen`: the kernel reuses the hole) would be walked with
/// the old table, and give wrong callers. Forget its mappings: its next sample asks the agent
/// to read its maps again, and until then its walks take frame-pointer steps. Unlike at exec,
/// its `NOTIFIED` time stays: a process mapping over its own code in a loop still makes the
/// agent read its maps at most once per `NOTIFY_INTERVAL_NS`.
#[inline(always)]
pub fn mapping_placed(tgid: u32, start: u64, info: *const u64) {
    let Some(map) = procs() else {
        return;
    };
    let Some(procs) = map.get_ptr(tgid) else {
        return;
    };
    // An error (`-ENOMEM`) instead of an address, or nothing placed.
    if start >= 1 << 63 || info.is_null() {
        return;
    }
    // `struct vm_unmapped_area_info` begins with `flags`, then `length`, in every kernel
    // since it was introduced (3.10); the layout is read, not relocated (no CO-RE here).
    // SAFETY: a kernel pointer the tracepoint passed; the helper checks the read.
    let Ok(len) = (unsafe { bpf_probe_read_kernel(info.wrapping_add(1)) }) else {
        return;
    };
    let Some(last) = len.checked_sub(1).and_then(|l| start.checked_add(l)) else {
        return;
    };
    // SAFETY: a map value, alive while this program runs.
    let procs = unsafe { &*procs };
    // The mapping starting last at or below the new one's last byte: sorted and disjoint, no
    // other can reach further up, so the two overlap exactly when it ends above `start`.
    let mut search = MappingSearch {
        bisect: Bisect::new(procs.count.min(MAX_PROC_MAPPINGS as u32)),
        pc: last,
        procs,
    };
    repeat(MAPPING_SEARCH_STEPS, probe_mapping, &mut search);
    if search
        .bisect
        .found()
        .is_some_and(|i| mapping_at(procs, i).end > start)
    {
        let _ = map.remove(tgid);
    }
}

/// The walked stack's identity: the frames' hash carries a word's high bits (a Python frame's
/// instruction offset, in bits 47-62) only into its own high bits, and ids are the low ones,
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

/// Inserts the walked stack of `tgid` into generation `generation`'s map for its size: the
/// short stacks' (`short_stacks`) when it has at most `SHORT_USER_STACK_DEPTH` frames, else
/// `stacks`. Returns its id, or whether the failure was a collision (`true`) or another error.
#[inline(always)]
pub fn store_stack(
    stacks: &crate::sampler::UserStackMap,
    short_stacks: &crate::sampler::ShortUserStackMap,
    walk: &mut WalkState,
    tgid: u32,
    generation: u32,
) -> Result<i32, bool> {
    // The stored hash is the mixed one, so a later sample compares like with like.
    let hash = mixed_hash(walk);
    walk.stack.hash = hash;
    let low = (hash & 0x3fff_ffff) as i32;
    let (id, new) = if walk.stack.len as usize <= SHORT_USER_STACK_DEPTH {
        // SAFETY: `ShortUserStack` is `UserStack`'s prefix, field for field (asserted in
        // scorch-common), and the map copies only its size from this pointer.
        let short = unsafe { &*(&walk.stack as *const UserStack).cast::<ShortUserStack>() };
        let id = low | SHORT_USER_STACK_ID;
        (id, insert_new(short_stacks, id, short, hash)?)
    } else {
        (low, insert_new(stacks, low, &walk.stack, hash)?)
    };
    if new && walk.python_frames > 0 {
        // A new stack with Python frames: the agent reads its code objects soon, not at the
        // window's end, when the process may be gone. No wakeup: these come in bursts (every
        // stack is new again each window), and its 200 ms poll reads them.
        let event = UnwindEvent {
            tgid,
            kind: EVENT_PYTHON_STACK,
            pc: (u64::from(generation) << 32) | u64::from(id as u32),
        };
        let _ = UNWIND_EVENTS.output::<UnwindEvent>(event, u64::from(BPF_RB_NO_WAKEUP));
    }
    Ok(id)
}

/// Stores `stack` under `id` unless a stack is there: whether it was new, or whether the
/// failure was a collision (`true`: another stack holds the id) or another error.
#[inline(always)]
fn insert_new<V: WalkedStack, const FLAGS: usize>(
    map: &btf_maps::HashMap<i32, V, 1, FLAGS>,
    id: i32,
    stack: &V,
    hash: u64,
) -> Result<bool, bool> {
    // SAFETY: only the hash is read; a concurrent writer of the same key writes the same hash.
    if let Some(existing) = unsafe { map.get(id) } {
        return if existing.hash() == hash {
            Ok(false)
        } else {
            Err(true)
        };
    }
    match map.insert(id, stack, u64::from(BPF_NOEXIST)) {
        Ok(()) => Ok(true),
        // Another CPU stored a stack under this id in between: the same one, or a collision.
        // SAFETY: as above.
        Err(_) => match unsafe { map.get(id) } {
            Some(existing) if existing.hash() == hash => Ok(false),
            Some(_) => Err(true),
            None => Err(false),
        },
    }
}
