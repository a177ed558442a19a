//! scorch's sampler: a `perf_event` program run on every CPU at the sampling frequency.
//!
//! Per sample it records the user and kernel stacks in the current generation's stack-trace
//! map and bumps a count keyed by (tgid, user stack id, kernel stack id). Everything is written
//! to one of two map generations chosen by `CONTROL.generation`, so the agent can drain one
//! generation while the other fills (see `agent/src/drain.rs` for the protocol).
//!
//! The program reads no kernel structures, only helper results, so the same object runs on any
//! kernel with BTF and `bpf_get_stackid` (4.9+), without relocations.
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
