//! The raw tracepoints that keep what the walk knows of a process true: an exec forgets its
//! mappings (and records the file it exec'd), a mapping placed over described code forgets
//! them too. Both tell the agent nothing: the process's next sample does.

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_task, bpf_probe_read_kernel,
        bpf_probe_read_kernel_str_bytes,
    },
    macros::{map, raw_tracepoint},
    maps::{LruHashMap, PerCpuArray},
    programs::RawTracePointContext,
};
use scorch_common::{ExecFile, MAX_EXEC_FILES};

use crate::{
    shared::{control, task},
    walk,
};

/// `offsetof(struct linux_binprm, interp)`, set by the agent from the kernel's BTF before
/// load; 0 records no exec'd files.
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
    walk::forget_process(tgid);
    // The third argument of `sched_process_exec` is the exec's `struct linux_binprm *`.
    record_exec(tgid, ctx.arg(2));
    control::forget_denied(tgid);
    0
}

/// `vm_unmapped_area` (a raw tracepoint): mmap chose where a new mapping of the current
/// process goes, without `MAP_FIXED`, as the loader does for a library. Its arguments are
/// the address and the request, `struct vm_unmapped_area_info *`.
#[raw_tracepoint(tracepoint = "vm_unmapped_area")]
pub fn mapping_placed(ctx: RawTracePointContext) -> i32 {
    let start: u64 = ctx.arg(0);
    let info: *const u64 = ctx.arg(1);
    walk::mapping_placed((bpf_get_current_pid_tgid() >> 32) as u32, start, info);
    0
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
    file.started_ns = task::start_boottime(unsafe { bpf_get_current_task() } as *const u8);
    let _ = EXEC_FILES.insert(tgid, &*file, 0);
}
