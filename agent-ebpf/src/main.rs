//! scorch's BPF programs, one object the agent loads.
//!
//! - `sampler`: the `perf_event` program run on every CPU at the sampling frequency. Per sample
//!   it records the kernel stack and the user stack (walked by `unwind` with the binaries'
//!   unwind tables, or by frame pointers) and bumps a count keyed by process, thread and the
//!   two stack ids. Everything goes to one of two map generations chosen by
//!   `CONTROL.generation`, so the agent drains one while the other fills (the protocol is at
//!   the top of `agent/src/pipeline/drain.rs`). It comes twice: `sample` with the unwinder and
//!   `sample_fp` without, for kernels that refuse the unwinder. Two raw tracepoints
//!   (`sched_process_exec`, `vm_unmapped_area`) forget a process's unwind mappings.
//! - `unwind`: the user-stack walk, one `bpf_loop` iteration per frame.
//! - `python`: CPython's frames, walked where the native walk meets the eval loop.
//! - `off_cpu`: the `sched_switch` raw tracepoint behind `--off-cpu`.
//!
//! What the kernel must have: `bpf_loop` (5.17), `bpf_task_pt_regs` and
//! `bpf_get_current_task_btf` with the kernel's BTF for the unwinder; ring buffers (5.8) and
//! inner maps of any size (5.10) for the object to load; `sched_switch`'s `prev_state` (5.18)
//! for off-CPU. The two `task_struct` offsets read (`TASK_FSBASE`, `TASK_PID`) are globals the
//! agent sets from the kernel's BTF before load: no CO-RE relocations. docs/kernels.md has the
//! whole list.
// The program only exists for the BPF target. On the host this crate builds an empty binary, so
// `cargo clippy --workspace` and friends work with the stable toolchain; `cargo xtask test`
// lints the real program with nightly for bpfel-unknown-none.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]
// `core::sync::atomic` offers no fetch_add on the BPF target (it lacks compare-and-swap), but
// the BPF instruction set has an atomic add; the intrinsic reaches it directly.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

/// `BPF_F_NO_PREALLOC`: a hash map holds only the entries it has, allocated as they are
/// inserted, instead of every entry up front. For maps only the agent writes (the program
/// reads and deletes): sized for thousands of processes, they hold the few dozen a host runs,
/// and no entry is ever allocated in the program's (NMI) context. The kernels of the matrix
/// (6.1, 6.12, 6.18) accept them in a perf-event program.
#[cfg(target_arch = "bpf")]
pub(crate) const BPF_F_NO_PREALLOC: u32 = 1;

#[cfg(target_arch = "bpf")]
mod off_cpu;
#[cfg(target_arch = "bpf")]
mod python;
#[cfg(target_arch = "bpf")]
mod sampler;
#[cfg(target_arch = "bpf")]
mod unwind;

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!(
        "scorch-ebpf is a BPF program: the agent's build.rs builds it for bpfel-unknown-none"
    );
}
