//! scorch's BPF programs, one object the agent loads.
//!
//! The crate's modules, bottom-up (`cargo xtask lint` holds each file to importing only the
//! modules declared before its own, here and in each folder's `mod.rs`):
//!
//! - `shared`: the agent's switches and PID filter, the counter bump, the `bpf_loop` wrapper,
//!   the event ring buffer, the task fields read, the walk's state and the walked stacks' maps.
//! - `arch`: the machine (registers, the user-mode test, the signal frame, the PLT rule), one
//!   file per architecture.
//! - `runtimes`: one file per runtime whose frames are read from its own structures (CPython),
//!   entered by the runtime id of the mapping a frame lies in.
//! - `walk`: the user-stack walk, one `bpf_loop` iteration per step: a native frame (`native`:
//!   tables, frame pointers, signal frames) or the runtime's walk a native frame handed over.
//! - `programs`: what the agent attaches: `sampler` (`sample` and `sample_fp`, per sample the
//!   kernel and user stacks and a count, in one of two map generations), `off_cpu`
//!   (`sched_switch`), `process_events` (`sched_process_exec`, `vm_unmapped_area`: forget a
//!   process's mappings).
//!
//! What the kernel must have: `bpf_loop` (5.17), `bpf_task_pt_regs` and
//! `bpf_get_current_task_btf` with the kernel's BTF for the unwinder; ring buffers (5.8) and
//! inner maps of any size (5.10) for the object to load; `sched_switch`'s `prev_state` (5.18)
//! for off-CPU. The `task_struct` offsets read are globals the agent sets from the kernel's
//! BTF before load: no CO-RE relocations. docs/kernels.md has the whole list.
// The program only exists for the BPF target. On the host this crate builds an empty binary, so
// `cargo clippy --workspace` and friends work with the stable toolchain; `cargo xtask test`
// lints the real program with nightly for bpfel-unknown-none.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]
// `core::sync::atomic` offers no fetch_add on the BPF target (it lacks compare-and-swap), but
// the BPF instruction set has an atomic add; the intrinsic reaches it directly.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

#[cfg(target_arch = "bpf")]
mod shared;
#[cfg(target_arch = "bpf")]
mod arch;
#[cfg(target_arch = "bpf")]
mod runtimes;
#[cfg(target_arch = "bpf")]
mod walk;
#[cfg(target_arch = "bpf")]
mod programs;

#[cfg(all(target_arch = "bpf", not(test)))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// `bpf_get_stackid` is GPL-only; the kernel refuses the program without a GPL-compatible
/// licence string.
#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!(
        "scorch-ebpf is a BPF program: the agent's build.rs builds it for bpfel-unknown-none"
    );
}
