//! The kernel's `task_struct` fields the programs read, at offsets the agent takes from the
//! kernel's BTF and sets as globals before load (no CO-RE relocations): the process's name
//! and start, and the thread pointer a runtime's walk finds a thread's state from.

use aya_ebpf::helpers::{bpf_get_current_task, bpf_probe_read_kernel};

/// `offsetof(struct task_struct, group_leader)` and `offsetof(struct task_struct, comm)` on
/// the running kernel, set by the agent before load from the kernel's BTF; 0 records the
/// sampled thread's name instead of its process's.
#[unsafe(no_mangle)]
static TASK_GROUP_LEADER: u32 = 0;
#[unsafe(no_mangle)]
static TASK_COMM: u32 = 0;
/// `offsetof(struct task_struct, start_boottime)`, set as the two above; 0 records no start
/// and no exec'd files.
#[unsafe(no_mangle)]
static TASK_START_BOOTTIME: u32 = 0;

/// `offsetof(struct task_struct, <the thread pointer>)` on the running kernel (x86-64's
/// `thread.fsbase`), set by the agent when a runtime's walk needs it; 0 leaves those runtimes
/// unwalked.
#[unsafe(no_mangle)]
static TASK_THREAD_POINTER: u32 = 0;

/// The current thread's user thread pointer (its TLS base: x86-64's `fs` base, which glibc
/// points at the thread's `struct pthread`); `None` without the offset or when the read fails.
#[inline(always)]
pub fn thread_pointer() -> Option<u64> {
    // SAFETY: a plain value the agent set before load (read volatile: the loader rewrites it).
    let offset = unsafe { core::ptr::read_volatile(&TASK_THREAD_POINTER) };
    if offset == 0 {
        return None;
    }
    // SAFETY: a helper with no arguments; the result is only used as an address to read.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    // SAFETY: bpf_probe_read_kernel checks the address.
    unsafe { bpf_probe_read_kernel(task.wrapping_add(offset as usize) as *const u64) }.ok()
}

/// Fills `comm` with the current thread's name, NUL-padded: `comm` must be zeroed, since
/// older kernels copy the name without padding. On failure the helper zeroes it.
///
/// The helper itself, not aya's `bpf_get_current_comm`: that one zeroes a byte array of its
/// own with a `memset` call and copies it out byte by byte, and the verifier walks such a
/// `memset` (a byte loop) once per byte at every call.
#[inline(always)]
pub fn current_comm_into(comm: &mut [u8; 16]) {
    // SAFETY: the helper writes at most the 16 bytes given.
    unsafe {
        aya_ebpf::helpers::generated::bpf_get_current_comm(comm.as_mut_ptr().cast(), 16);
    }
}

/// Fills `comm` with the name of the current task's thread-group leader (the process's name,
/// which a thread may not share: a pool's workers are often named) and returns its start
/// (`start_boottime`, 0 without that offset). `None` without the offsets or when a read fails;
/// then `comm` is zeroed or untouched. Read in place, for the reason `current_comm_into` says.
#[inline(always)]
pub fn leader_comm_into(comm: &mut [u8; 16]) -> Option<u64> {
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
    // SAFETY: as above; the helper writes at most the 16 bytes given.
    let read = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_kernel(
            comm.as_mut_ptr().cast(),
            16,
            leader.wrapping_add(comm_offset as usize).cast(),
        )
    };
    if read != 0 {
        return None;
    }
    Some(start_boottime(leader))
}

/// `task`'s `start_boottime`, 0 without the offset or when it cannot be read.
#[inline(always)]
pub fn start_boottime(task: *const u8) -> u64 {
    // SAFETY: a plain value the agent set before load.
    let offset = unsafe { core::ptr::read_volatile(&TASK_START_BOOTTIME) };
    if offset == 0 {
        return 0;
    }
    // SAFETY: bpf_probe_read_kernel checks the address.
    unsafe { bpf_probe_read_kernel(task.wrapping_add(offset as usize) as *const u64) }.unwrap_or(0)
}
