//! The native walk: one frame by the binary's unwind table, by its frame pointer, or through
//! a signal frame.
//!
//! Per frame: find the process's mapping holding the pc (`UNWIND_PROCS`), binary-search its
//! table's rows in the pool that holds them (`UNWIND_ROWS`), compute the CFA and read the
//! return address and the saved frame pointer from the stack. Code without a loaded table
//! (JIT, anonymous memory, a table still being built) takes a frame-pointer step instead, and
//! the walk goes back to tables at the next frame. A mapping a runtime owns
//! (`UnwindMapping::runtime`) is handed to that runtime's walk first ([`frame`]), by its id,
//! never its name. Registers and layouts of the machine come from `crate::arch`.

use core::ffi::c_void;

use aya_ebpf::{
    btf_maps,
    helpers::bpf_probe_read_kernel,
    macros::{btf_map, map},
    maps::{Array, PerCpuArray},
};
use scorch_common::{
    Bisect, CfaKind, FpKind, ProcMappings, RaKind, UnwindMapping, UnwindOutcome, UnwindRow,
    MAPPING_SEARCH_STEPS, MAPPING_TABLE_EVICTED, MAPPING_TABLE_LOADED, MAPPING_TABLE_PENDING,
    MAX_PROC_MAPPINGS, MAX_ROW_POOLS, ROW_CACHE_SLOTS, UNWIND_SEARCH_STEPS, WORD_KIND_SHIFT,
};

use crate::{
    arch,
    shared::{
        loops::repeat,
        stack::{push_frame, WalkState, MAX_SAVE_WORDS, WALKING},
        user,
    },
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
pub fn procs() -> Option<&'static ProcMap> {
    UNWIND_PROCS.get(0)
}

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
pub static ROW_EPOCH: Array<u64> = Array::with_max_entries(1, 0);

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

#[inline(always)]
fn read(address: u64) -> Option<u64> {
    user::read_u64(address)
}

/// The caller by the frame pointer: `[fp]` is the caller's fp, `[fp + 8]` the return
/// address.
#[inline(always)]
fn frame_pointer_step(walk: &mut WalkState) -> u32 {
    if walk.fp_known == 0 {
        return UnwindOutcome::UnsupportedCfa as u32;
    }
    let bp = walk.fp;
    // The outermost frame: the C runtime clears the frame pointer before calling into main.
    if bp == 0 {
        return UnwindOutcome::Completed as u32;
    }
    // The stack grows down: a frame pointer below the stack pointer is no frame.
    if bp < walk.sp {
        return UnwindOutcome::ReadFault as u32;
    }
    if !walk.read_up_to(bp.wrapping_add(16), 2) {
        return UnwindOutcome::ReadFault as u32;
    }
    let (caller_bp, return_address) = (walk.word(0), arch::return_address(walk.word(1)));
    if return_address == 0 {
        return UnwindOutcome::Completed as u32;
    }
    walk.pc = return_address;
    walk.sp = bp.wrapping_add(16);
    walk.fp = caller_bp;
    WALKING
}

/// A frame-pointer step where no row covers the pc, kept only when it looks like a real
/// caller: fp known and not 0, the caller's frame above this one (the stack grows down, so a
/// walk whose stack pointer only rises cannot loop), and the return address inside one of the
/// process's executable mappings. Otherwise the walk ends as `NoRow` with the frames it has:
/// in code without frame pointers fp is any value, and a caller read through it would be
/// made up.
#[inline(always)]
fn checked_frame_pointer_step(walk: &mut WalkState, procs: &ProcMappings) -> u32 {
    let bp = walk.fp;
    if walk.fp_known == 0 || bp == 0 || bp < walk.sp {
        return UnwindOutcome::NoRow as u32;
    }
    if !walk.read_up_to(bp.wrapping_add(16), 2) {
        return UnwindOutcome::NoRow as u32;
    }
    let (caller_bp, return_address) = (walk.word(0), arch::return_address(walk.word(1)));
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
    walk.fp = caller_bp;
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

/// The caller by the row of `mapping`'s table that covers `row_pc`. `lr_valid`: the link
/// register holds this frame's return address, if a row says it is there.
#[inline(always)]
fn table_step(walk: &mut WalkState, mapping: &UnwindMapping, row_pc: u32, lr_valid: bool) -> u32 {
    let Some(row) = find_row(walk, mapping, row_pc) else {
        return UnwindOutcome::NoRow as u32;
    };
    let fp_kind = row.fp_kind();
    if fp_kind == FpKind::ReturnAddressUndefined {
        return UnwindOutcome::Completed as u32;
    }
    let sp = walk.sp;
    let offset = u64::from(row.cfa_offset);
    let fp_offset = i64::from(row.fp_offset) * 8;
    let cfa = match row.cfa_kind() {
        CfaKind::Sp => sp.wrapping_add(offset),
        CfaKind::Fp if walk.fp_known != 0 => walk.fp.wrapping_add(offset),
        CfaKind::Plt => arch::plt_cfa(sp, offset, walk.pc, row.fp_offset),
        CfaKind::Signal => return signal_step(walk, offset, fp_kind, fp_offset),
        CfaKind::NoRow => return UnwindOutcome::NoRow as u32,
        CfaKind::Fp | CfaKind::Unsupported => return UnwindOutcome::UnsupportedCfa as u32,
    };
    // An architecture with a link register (arm64) keeps the return address apart from the
    // CFA: in x30, or in the frame record wherever the prologue put it. Compiled out of
    // x86-64's walk, whose agent writes none of these kinds.
    if arch::LINK_REGISTER {
        if row.ra_kind() == RaKind::LinkRegister {
            return link_register_step(walk, cfa, fp_kind, lr_valid);
        }
        match fp_kind {
            FpKind::Record | FpKind::RecordFromBase | FpKind::ReturnAddressAt => {
                return record_step(walk, cfa, offset, fp_kind, fp_offset)
            }
            _ => {}
        }
    }
    // The return address is read at CFA - 8 below; one in a link register is a row of an
    // architecture that has one, read above.
    if row.ra_kind() != RaKind::CfaMinus8 {
        return UnwindOutcome::UnsupportedCfa as u32;
    }
    // A saved frame pointer a few words below the return address, as a prologue's pushes leave it,
    // comes in the same read.
    let saved_below = fp_kind == FpKind::CfaOffset
        && row.fp_offset < 0
        && row.fp_offset >= -(MAX_SAVE_WORDS as i8);
    let words = if saved_below {
        -i64::from(row.fp_offset) as u64
    } else {
        1
    };
    if !walk.read_up_to(cfa, words) {
        return UnwindOutcome::ReadFault as u32;
    }
    let return_address = arch::return_address(walk.word(words - 1));
    match fp_kind {
        FpKind::Unchanged => {}
        FpKind::CfaOffset if saved_below => walk.fp = walk.word(0),
        FpKind::CfaOffset => match read(cfa.wrapping_add(fp_offset as u64)) {
            Some(bp) => walk.fp = bp,
            None => return UnwindOutcome::ReadFault as u32,
        },
        FpKind::AtSp => match read(sp.wrapping_add(fp_offset as u64)) {
            Some(bp) => walk.fp = bp,
            None => return UnwindOutcome::ReadFault as u32,
        },
        _ => walk.fp_known = 0,
    }
    to_caller(walk, return_address, cfa)
}

/// Moves the walk to the caller at `return_address`, whose stack pointer is `cfa`; a return
/// address of 0 is the outermost frame's (the C runtime clears it), and ends the walk.
#[inline(always)]
fn to_caller(walk: &mut WalkState, return_address: u64, cfa: u64) -> u32 {
    if return_address == 0 {
        return UnwindOutcome::Completed as u32;
    }
    walk.pc = return_address;
    walk.sp = cfa;
    WALKING
}

/// The caller of a frame whose return address is still in the link register (a function
/// before its prologue saved x30, a leaf that never does, a PLT stub): known only while
/// `lr_valid`, in the frame the walk started from or a signal interrupted. Elsewhere x30
/// holds whatever the frame's callees left, and the walk stops rather than make a caller up.
#[inline(always)]
fn link_register_step(walk: &mut WalkState, cfa: u64, fp_kind: FpKind, lr_valid: bool) -> u32 {
    if !lr_valid {
        return UnwindOutcome::UnsupportedCfa as u32;
    }
    if fp_kind != FpKind::Unchanged {
        walk.fp_known = 0;
    }
    let return_address = arch::return_address(walk.lr);
    to_caller(walk, return_address, cfa)
}

/// The caller by a frame record `{caller's FP, return address}` at CFA + `fp_offset`
/// ([`FpKind::Record`]) or at the CFA's register + `fp_offset` ([`FpKind::RecordFromBase`]),
/// or by the return address alone at CFA + `fp_offset` ([`FpKind::ReturnAddressAt`]).
#[inline(always)]
fn record_step(
    walk: &mut WalkState,
    cfa: u64,
    offset: u64,
    fp_kind: FpKind,
    fp_offset: i64,
) -> u32 {
    let base = if fp_kind == FpKind::RecordFromBase {
        cfa.wrapping_sub(offset)
    } else {
        cfa
    };
    let at = base.wrapping_add(fp_offset as u64);
    let return_address = if fp_kind == FpKind::ReturnAddressAt {
        if !walk.read_up_to(at.wrapping_add(8), 1) {
            return UnwindOutcome::ReadFault as u32;
        }
        walk.word(0)
    } else {
        if !walk.read_up_to(at.wrapping_add(16), 2) {
            return UnwindOutcome::ReadFault as u32;
        }
        walk.fp = walk.word(0);
        walk.word(1)
    };
    let return_address = arch::return_address(return_address);
    to_caller(walk, return_address, cfa)
}

/// A signal trampoline: the interrupted registers are in the `ucontext` on the stack. The
/// interrupted pc is where the signal came, not a return address; on an architecture with a
/// link register, the interrupted frame's is there too, and valid for that frame.
#[inline(always)]
fn signal_step(walk: &mut WalkState, offset: u64, fp_kind: FpKind, fp_offset: i64) -> u32 {
    let sp = walk.sp;
    let (sp_at, pc_at) = arch::signal_frame(sp, offset);
    let (Some(interrupted_sp), Some(interrupted_pc)) = (read(sp_at), read(pc_at)) else {
        return UnwindOutcome::ReadFault as u32;
    };
    if arch::LINK_REGISTER {
        if let Some(lr) = read(arch::signal_link_register(sp_at)) {
            walk.lr = lr;
            walk.lr_valid = 1;
        }
    }
    if fp_kind == FpKind::AtSp {
        match read(sp.wrapping_add(fp_offset as u64)) {
            Some(bp) => walk.fp = bp,
            None => return UnwindOutcome::ReadFault as u32,
        }
    } else {
        walk.fp_known = 0;
    }
    if interrupted_pc == 0 {
        return UnwindOutcome::Completed as u32;
    }
    walk.pc = interrupted_pc;
    walk.sp = interrupted_sp;
    walk.return_address = 0;
    WALKING
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

/// After an exec the process's mappings are another program's: forget them, so its next
/// sample asks the agent again.
#[inline(always)]
pub fn forget(tgid: u32) {
    if let Some(procs) = procs() {
        let _ = procs.remove(tgid);
    }
}

/// One native frame: hands it to the runtime that owns its mapping, or records its pc, then
/// finds the caller's registers. Returns the walk's outcome, or [`WALKING`] to go on.
#[inline(always)]
pub fn frame(walk: &mut WalkState, procs: &ProcMappings) -> u32 {
    // The frame the last iteration recorded had no row. Its caller is found here, in an
    // iteration of its own, rather than at the end of that iteration's table step: the
    // verifier checks an iteration's code once for each distinct state it reaches it with,
    // and a table step ends in `NoRow` by many paths, each a state. Inline, this step was
    // checked once for each of them; here, once per check of the callback (`scorch check`
    // prints the instructions the verifier walked).
    if walk.no_row_next != 0 {
        walk.no_row_next = 0;
        return checked_frame_pointer_step(walk, procs);
    }
    // The runtime walked its frames and left the registers at the first frame past them (a
    // return address, in native code): a fresh frame, which nothing has handed or claimed.
    if walk.stepped != 0 {
        walk.stepped = 0;
        walk.handed = 0;
        walk.claimed = 0;
        walk.lr_valid = 0;
    }
    let pc = walk.pc;
    // A "pc" past every user address space (2^57 at most) is a stack word read as one: a
    // corrupt stack. Pushed, its top bits would read as a runtime's frame kind.
    if pc >> WORD_KIND_SHIFT != 0 {
        return UnwindOutcome::ReadFault as u32;
    }
    let lookup = if walk.return_address != 0 { pc - 1 } else { pc };
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
    // Code a runtime owns (an interpreter's eval loop): its walk runs in the next iteration
    // and may replace this frame with its own; then this frame is stepped past here again.
    // Not once the walk has taken a frame-pointer step out of code whose table is not loaded:
    // that code most often keeps no frame pointers (a distribution's libpython), so the
    // frames past it are stack words read as frames, and one of them can point into the eval
    // loop, where the runtime would hang its real frames below the process's start.
    let guessed = walk.table_pending != 0 || walk.table_evicted != 0;
    if let Some(m) = mapping {
        if m.runtime != 0 && walk.handed == 0 && !guessed {
            walk.handed = 1;
            walk.runtime = u32::from(m.runtime);
            return WALKING;
        }
    }
    let claimed = walk.claimed != 0;
    walk.handed = 0;
    walk.claimed = 0;
    if !claimed && !push_frame(walk, pc) {
        return UnwindOutcome::FrameLimit as u32;
    }
    walk.return_address = 1;
    // The link register is this frame's only: whatever step is taken, the caller's is not.
    let lr_valid = arch::LINK_REGISTER && walk.lr_valid != 0;
    if arch::LINK_REGISTER {
        walk.lr_valid = 0;
    }
    match mapping {
        Some(m) if m.state == MAPPING_TABLE_LOADED => {
            let row_pc = lookup.wrapping_sub(m.bias);
            let outcome = if row_pc > u64::from(u32::MAX) {
                UnwindOutcome::NoRow as u32
            } else {
                table_step(walk, m, row_pc as u32, lr_valid)
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
    }
}
