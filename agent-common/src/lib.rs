//! Types shared by scorch's BPF sampler (`scorch-ebpf`) and its userspace agent (`scorch`).
//!
//! Everything here is `#[repr(C)]` plain data: the BPF program writes these bytes into maps and
//! the agent reads them back, so both sides must agree on the layout to the byte. The `user`
//! feature adds `aya::Pod` impls, which the BPF side must not depend on.
#![no_std]

/// Deepest stack the kernel records per sample (`PERF_MAX_STACK_DEPTH`). A stack of exactly this
/// many frames was probably cut short; the agent counts those as truncated.
pub const MAX_STACK_DEPTH: usize = 127;

/// Capacity of each per-generation counts map: distinct (process, user stack, kernel stack)
/// keys per window. 19 Hz on 256 CPUs for 10 s is under 50k samples, so even all-distinct
/// stacks fit; a fuller map is counted as a loss, never silently dropped.
pub const MAX_COUNT_KEYS: u32 = 65_536;

/// Capacity of each per-generation stack-trace map. Larger than the counts map because user and
/// kernel stacks share it, and a roomier hash table means fewer bucket collisions (`-EEXIST`).
pub const MAX_STACKS: u32 = 131_072;

/// Distinct processes whose name is recorded per window.
pub const MAX_COMMS: u32 = 32_768;

/// Most PIDs the filter holds: `--pid` arguments, or processes relabelling dropped.
pub const MAX_PID_FILTER: u32 = 16_384;

/// `Control::filter_pids`: no PID filter.
pub const FILTER_NONE: u32 = 0;
/// `Control::filter_pids`: only the PIDs in `PID_FILTER` are sampled (`--pid`).
pub const FILTER_ALLOW: u32 = 1;
/// `Control::filter_pids`: the PIDs in `PID_FILTER` are not sampled (relabel rules dropped
/// them).
pub const FILTER_DENY: u32 = 2;

/// `stack_id` stored in a [`StackKey`] when the sample has no stack of that kind: a kernel
/// thread has no user stack, a sample taken in user mode has no kernel stack.
pub const STACK_ABSENT: i32 = -1;
/// `stack_id` stored when the stack could not be recorded because its hash bucket in the stack
/// map was taken by another stack (`-EEXIST` from `bpf_get_stackid`). The sample still counts.
pub const STACK_LOST_COLLISION: i32 = -2;
/// `stack_id` stored when `bpf_get_stackid` failed for any other reason (e.g. `-ENOMEM`).
pub const STACK_LOST_OTHER: i32 = -3;

/// Key of the counts map: one entry per distinct (process, user stack, kernel stack).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackKey {
    /// Process id (the kernel's tgid).
    pub tgid: u32,
    /// Id in the generation's stack map, or one of the `STACK_*` sentinels.
    pub user_stack_id: i32,
    /// Id in the generation's stack map, or one of the `STACK_*` sentinels.
    pub kernel_stack_id: i32,
}

/// Process name as the kernel keeps it (`TASK_COMM_LEN`), NUL-padded.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Comm(pub [u8; 16]);

/// Runtime control shared through the single-entry `CONTROL` array map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Control {
    /// Which map generation (0 or 1) the BPF program writes to. The agent flips it to drain the
    /// other generation while sampling goes on.
    pub generation: u32,
    /// How `PID_FILTER` applies: [`FILTER_NONE`], [`FILTER_ALLOW`] (only the PIDs in it are
    /// sampled) or [`FILTER_DENY`] (the PIDs in it are not).
    pub filter_pids: u32,
    /// Non-zero when samples of the idle task (pid 0) are kept.
    pub include_idle: u32,
    /// Explicit padding so the layout has no uninitialised bytes.
    pub _reserved: u32,
}

/// Per-CPU bracket around each run of the BPF program, used to prove a generation is quiescent.
///
/// The program bumps `seq` to odd before it reads `Control::generation` and back to even after
/// its last write. After flipping the generation, the agent waits until every CPU's `seq` is even
/// or has moved on: then no run can still write to the old generation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunSeq {
    /// Odd while a run is in flight on this CPU.
    pub seq: u64,
}

/// Index into the per-CPU `LOSSES` array: every way a sample can be lost or degraded.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// `bpf_get_stackid` hit a bucket held by a different user stack (`-EEXIST`).
    UserStackCollision = 0,
    /// `bpf_get_stackid` failed for a user stack for another reason.
    UserStackError = 1,
    /// `bpf_get_stackid` hit a bucket held by a different kernel stack.
    KernelStackCollision = 2,
    /// `bpf_get_stackid` failed for a kernel stack for another reason.
    KernelStackError = 3,
    /// The counts map was full: the whole sample was dropped.
    CountsMapFull = 4,
    /// The comm map was full: the process is reported without a name.
    CommMapFull = 5,
}

/// Number of [`Loss`] kinds; the size of the `LOSSES` array.
pub const LOSS_KINDS: u32 = 6;

impl Loss {
    /// All kinds, in index order.
    pub const ALL: [Loss; LOSS_KINDS as usize] = [
        Loss::UserStackCollision,
        Loss::UserStackError,
        Loss::KernelStackCollision,
        Loss::KernelStackError,
        Loss::CountsMapFull,
        Loss::CommMapFull,
    ];

    /// Short name used in summaries and logs.
    pub const fn name(self) -> &'static str {
        match self {
            Loss::UserStackCollision => "user stack collision",
            Loss::UserStackError => "user stack error",
            Loss::KernelStackCollision => "kernel stack collision",
            Loss::KernelStackError => "kernel stack error",
            Loss::CountsMapFull => "counts map full",
            Loss::CommMapFull => "comm map full",
        }
    }
}

#[cfg(feature = "user")]
mod pod {
    // Each type is plain `#[repr(C)]` integers with no padding and no invalid bit patterns, so
    // any bytes the kernel hands back are a valid value.
    // SAFETY: see above.
    unsafe impl aya::Pod for super::StackKey {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::Comm {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::Control {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::RunSeq {}
}
