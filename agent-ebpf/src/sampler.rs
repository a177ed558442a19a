//! The perf_event program and its maps (see the crate root for the design).

use core::intrinsics::{atomic_xadd, AtomicOrdering};

use aya_ebpf::{
    bindings::{BPF_F_USER_STACK, BPF_NOEXIST},
    btf_maps,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_get_current_task, bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes,
    },
    macros::{btf_map, map, perf_event, raw_tracepoint},
    maps::{Array, HashMap, LruHashMap, PerCpuArray},
    programs::{tracing::StackIdContext, PerfEventContext, RawTracePointContext},
};
use aya_log_ebpf::warn;
use scorch_common::{
    Control, ExecFile, Loss, RunSeq, SeenProcess, ShortUserStack, StackKey, UserStack, FILTER_DENY,
    FILTER_NONE, LOSS_KINDS, MAX_COMMS, MAX_COUNT_KEYS, MAX_EXEC_FILES, MAX_PID_FILTER,
    STACK_ABSENT, STACK_LOST_COLLISION, STACK_LOST_OTHER, UNWIND_TABLES,
};

use crate::unwind;

const EEXIST: i32 = 17;
const EFAULT: i32 = 14;
const E2BIG: i32 = 7;

/// Single entry: generation, PID filter switch, idle switch. Written only by the agent.
#[map]
pub(crate) static CONTROL: Array<Control> = Array::with_max_entries(1, 0);

/// PIDs (tgids) that `Control::filter_pids` selects (allow list) or excludes (deny list).
/// Value unused. Written by the agent only, so not preallocated.
#[map]
pub(crate) static PID_FILTER: HashMap<u32, u8> =
    HashMap::with_max_entries(MAX_PID_FILTER, crate::BPF_F_NO_PREALLOC);

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

/// `offsetof(struct task_struct, group_leader)` and `offsetof(struct task_struct, comm)` on
/// the running kernel, set by the agent before load from the kernel's BTF; 0 records the
/// sampled thread's name instead of its process's.
#[unsafe(no_mangle)]
static TASK_GROUP_LEADER: u32 = 0;
#[unsafe(no_mangle)]
static TASK_COMM: u32 = 0;
/// `offsetof(struct task_struct, start_boottime)` and `offsetof(struct linux_binprm, interp)`,
/// set as the two above; 0 records no exec'd files.
#[unsafe(no_mangle)]
static TASK_START_BOOTTIME: u32 = 0;
#[unsafe(no_mangle)]
static BINPRM_INTERP: u32 = 0;

/// By tgid, the file each process last exec'd and when the process started ([`ExecFile`]):
/// what names the executable of a process that exited before the agent read /proc/PID/exe.
/// Written at each exec, read by the agent for those processes only; least recently written
/// first out.
#[map]
static EXEC_FILES: LruHashMap<u32, ExecFile> = LruHashMap::with_max_entries(MAX_EXEC_FILES, 0);
/// Where an exec's record is built (it is larger than is wise on the BPF stack).
#[map]
static EXEC_SCRATCH: PerCpuArray<ExecFile> = PerCpuArray::with_max_entries(1, 0);
/// A generation's map of the user stacks the program walked itself (`UNWIND_TABLES`), keyed
/// by a hash of their pcs. Not preallocated: a 256-frame stack is 2 KiB, and the map must hold
/// a whole window's samples when each is a stack of its own (Python stacks carry the
/// instruction offset of every frame), so its memory follows what it holds. The agent's inner
/// maps carry the same flag, which the kernel requires of an inner map.
pub type UserStackMap = btf_maps::HashMap<i32, UserStack, 1, { crate::BPF_F_NO_PREALLOC as usize }>;
/// The two generations' user-stack maps, by generation; the agent creates and replaces them
/// as it does `STACKS`'s.
#[btf_map]
static USER_STACKS: btf_maps::ArrayOfMaps<UserStackMap, 2> = btf_maps::ArrayOfMaps::new();
/// A generation's map of the walked stacks of at most `SHORT_USER_STACK_DEPTH` frames: the
/// same, with a value a fifth the size, since the kernel's cost to allocate, copy and free an
/// element follows its size.
pub type ShortUserStackMap =
    btf_maps::HashMap<i32, ShortUserStack, 1, { crate::BPF_F_NO_PREALLOC as usize }>;
/// The two generations' short-stack maps, by generation, managed as `USER_STACKS`.
#[btf_map]
static SHORT_USER_STACKS: btf_maps::ArrayOfMaps<ShortUserStackMap, 2> =
    btf_maps::ArrayOfMaps::new();

/// The maps of one generation.
struct Generation {
    counts: &'static HashMap<StackKey, u64>,
    stacks: &'static StackMap,
    comms: &'static HashMap<u32, SeenProcess>,
    user_stacks: &'static UserStackMap,
    short_user_stacks: &'static ShortUserStackMap,
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
    if control.filter_pids != FILTER_NONE {
        // SAFETY: the value is only tested for presence, never read, so a concurrent update
        // from userspace cannot hand this program a torn value.
        let listed = unsafe { PID_FILTER.get(tgid) }.is_some();
        if listed == (control.filter_pids == FILTER_DENY) {
            if let Some(counter) = FILTERED.get_ptr_mut(0) {
                // SAFETY: this CPU's slot; the program cannot run twice at once on one CPU.
                unsafe { *counter += 1 };
            }
            return Ok(());
        }
    }
    // Read once: the agent may flip it while this run goes on, and every map and counter this
    // run writes must be of one generation.
    // SAFETY: `control` points into a map value; the read is of a plain u32.
    // The agent writes 0 or 1. Masked, not compared: a comparison compiles to a branch that
    // makes the slot a constant on each side, and the verifier then checks all that follows
    // (the user walk with its loop) once for each.
    let slot = unsafe { core::ptr::read_volatile(&control.generation) } & 1;
    // A sample taken in user mode has no kernel stack: skip asking for one.
    let user_mode = interrupted_user_mode(ctx);
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
    let walked = tables && unwind::walk(ctx, tgid, user_mode, slot);
    // The agent fills every slot before it attaches the program.
    let (Some(stacks), Some(user_stacks), Some(short_user_stacks)) = (
        STACKS.get(slot),
        USER_STACKS.get(slot),
        SHORT_USER_STACKS.get(slot),
    ) else {
        return Ok(());
    };
    let generation = if slot == 0 {
        Generation {
            counts: &COUNTS_0,
            stacks,
            comms: &COMMS_0,
            user_stacks,
            short_user_stacks,
        }
    } else {
        Generation {
            counts: &COUNTS_1,
            stacks,
            comms: &COMMS_1,
            user_stacks,
            short_user_stacks,
        }
    };
    let user_stack_id = if tables {
        match unwind::walked(walked) {
            None => STACK_ABSENT,
            Some(walk) => match unwind::store_stack(
                generation.user_stacks,
                generation.short_user_stacks,
                walk,
                tgid,
                slot,
            ) {
                Ok(id) => id,
                Err(true) => {
                    count_loss(slot, Loss::UserStackCollision);
                    STACK_LOST_COLLISION
                }
                Err(false) => {
                    count_loss(slot, Loss::UserStackError);
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
    let thread = bpf_get_current_comm().unwrap_or([0; 16]);
    let key = StackKey {
        tgid,
        // Zero unless asked for: ids would split every stack by thread, one key per thread
        // of a pool, for a label few want.
        tid: if control.thread_ids != 0 { tid } else { 0 },
        user_stack_id,
        kernel_stack_id,
        thread,
    };

    if let Some(count) = generation.counts.get_ptr_mut(key) {
        bump(count);
        return Ok(());
    }
    // A new key: the first sample of this stack in this window. Every process sampled in a
    // window passes here at least once, so this is where its name is recorded, off the
    // common path.
    record_comm(generation.comms, tgid, thread, slot);
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

/// `sched_process_exec` (a raw tracepoint: no tracefs needed): the process's unwind mappings
/// describe the program it was.
///
/// It tells the agent nothing: the process's first sample does, at once (the agent waits on
/// the event ring buffer), while the process still runs. An event per exec was tried, to
/// capture even processes never sampled: under a churn of execs (a pyenv shim execs several
/// times per `python3`), reading and describing each one multiplied the daemon's CPU and its
/// BPF programs' (`cargo xtask bench --only churn` measures it), for processes that mostly are
/// never sampled at 19 Hz.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn process_exec(ctx: RawTracePointContext) -> i32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    unwind::forget_process(tgid);
    // The third argument of `sched_process_exec` is the exec's `struct linux_binprm *`.
    record_exec(tgid, ctx.arg(2));
    // A process relabelling dropped (in the deny list) runs another program now, which the
    // agent judges again at its next sample: a shell or launcher forked, sampled before its
    // exec and dropped by its parent's name, would otherwise stay dropped. An allow list is
    // the user's pids and keeps them across an exec.
    if let Some(control) = CONTROL.get(0) {
        if control.filter_pids == FILTER_DENY {
            let _ = PID_FILTER.remove(&tgid);
        }
    }
    0
}

/// `vm_unmapped_area` (a raw tracepoint): mmap chose where a new mapping of the current
/// process goes, without `MAP_FIXED`, as the loader does for a library. Its arguments are
/// the address and the request, `struct vm_unmapped_area_info *`.
#[raw_tracepoint(tracepoint = "vm_unmapped_area")]
pub fn mapping_placed(ctx: RawTracePointContext) -> i32 {
    let start: u64 = ctx.arg(0);
    let info: *const u64 = ctx.arg(1);
    unwind::mapping_placed((bpf_get_current_pid_tgid() >> 32) as u32, start, info);
    0
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

/// True when the sample interrupted user mode (on architectures where that is cheap to tell).
#[inline(always)]
fn interrupted_user_mode(ctx: &PerfEventContext) -> bool {
    #[cfg(bpf_target_arch = "x86_64")]
    {
        // SAFETY: `ctx.ctx` is the kernel's bpf_perf_event_data for this run; perf_event
        // programs may read the saved registers. The low two bits of CS are the privilege level.
        let cs = unsafe { (*ctx.ctx).regs.cs };
        cs & 3 == 3
    }
    #[cfg(not(bpf_target_arch = "x86_64"))]
    {
        let _ = ctx;
        false
    }
}

#[inline(always)]
fn record_comm(comms: &HashMap<u32, SeenProcess>, tgid: u32, thread: [u8; 16], slot: u32) {
    if comms.get_ptr(tgid).is_some() {
        return;
    }
    let (comm, started_ns) = leader_comm_and_start().unwrap_or((thread, 0));
    let seen = SeenProcess {
        comm,
        // SAFETY: a helper with no arguments.
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        started_ns,
    };
    // -EEXIST means another CPU recorded it first, which is fine.
    if let Err(err) = comms.insert(tgid, seen, u64::from(BPF_NOEXIST)) {
        if err != -EEXIST {
            count_loss(slot, Loss::CommMapFull);
        }
    }
}

/// The name of the current task's thread-group leader (the process's name, which a thread may
/// not share: a pool's workers are often named) and its start (`start_boottime`, 0 without
/// that offset). `None` without the offsets.
#[inline(always)]
fn leader_comm_and_start() -> Option<([u8; 16], u64)> {
    // SAFETY: plain values the agent set before load (read volatile: the loader rewrites them).
    let (leader_offset, comm_offset) = unsafe {
        (
            core::ptr::read_volatile(&TASK_GROUP_LEADER),
            core::ptr::read_volatile(&TASK_COMM),
        )
    };
    if leader_offset == 0 || comm_offset == 0 {
        return None;
    }
    // SAFETY: a helper with no arguments; the result is only used as an address to read.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    // SAFETY: bpf_probe_read_kernel checks the addresses.
    let leader =
        unsafe { bpf_probe_read_kernel(task.wrapping_add(leader_offset as usize) as *const u64) }
            .ok()? as *const u8;
    // SAFETY: as above.
    unsafe { bpf_probe_read_kernel(leader.wrapping_add(comm_offset as usize) as *const [u8; 16]) }
        .ok()
        .map(|comm| (comm, start_boottime(leader)))
}

/// `task`'s `start_boottime`, 0 without the offset or when it cannot be read.
#[inline(always)]
fn start_boottime(task: *const u8) -> u64 {
    // SAFETY: a plain value the agent set before load.
    let offset = unsafe { core::ptr::read_volatile(&TASK_START_BOOTTIME) };
    if offset == 0 {
        return 0;
    }
    // SAFETY: bpf_probe_read_kernel checks the address.
    unsafe { bpf_probe_read_kernel(task.wrapping_add(offset as usize) as *const u64) }.unwrap_or(0)
}

/// Records what `tgid` exec'd: the path the exec named (`bprm->interp`: the script's
/// interpreter for a script, the file itself otherwise) and the process's start.
#[inline(always)]
fn record_exec(tgid: u32, bprm: *const u8) {
    // SAFETY: a plain value the agent set before load.
    let interp_offset = unsafe { core::ptr::read_volatile(&BINPRM_INTERP) };
    if interp_offset == 0 {
        return;
    }
    let Some(file) = EXEC_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's scratch entry; the program cannot run twice at once on one CPU.
    let file = unsafe { &mut *file };
    // SAFETY: bpf_probe_read_kernel checks the address.
    let Ok(path) = (unsafe {
        bpf_probe_read_kernel(bprm.wrapping_add(interp_offset as usize) as *const *const u8)
    }) else {
        return;
    };
    // SAFETY: as above; the helper writes at most the slice, and a NUL.
    if unsafe { bpf_probe_read_kernel_str_bytes(path, &mut file.path) }.is_err() {
        return;
    }
    // After the exec, the current task leads its thread group (`de_thread`).
    // SAFETY: a helper with no arguments; the result is only used as an address to read.
    file.started_ns = start_boottime(unsafe { bpf_get_current_task() } as *const u8);
    let _ = EXEC_FILES.insert(tgid, &*file, 0);
}

/// Counts a loss in generation `slot`'s run.
#[inline(always)]
fn count_loss(slot: u32, loss: Loss) {
    if let Some(counter) = LOSSES.get_ptr_mut(slot * LOSS_KINDS + loss as u32) {
        // SAFETY: this CPU's slot; the program cannot run twice at once on one CPU.
        unsafe { *counter += 1 };
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// `bpf_get_stackid` is GPL-only; the kernel refuses the program without a GPL-compatible
/// licence string.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
