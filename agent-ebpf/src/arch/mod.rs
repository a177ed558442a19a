//! What the walk needs to know of the machine, one file per architecture: which registers of
//! `pt_regs` are the pc, stack pointer and frame pointer, how to tell a sample taken in user
//! mode, where a signal frame keeps the interrupted registers, and the PLT stubs' rule. The
//! rest of the crate calls these and names no register. x86-64 is the only one; arm64 is an
//! `aarch64.rs` beside it with the same items.

#[cfg(bpf_target_arch = "x86_64")]
mod x86_64;
#[cfg(bpf_target_arch = "x86_64")]
pub use self::x86_64::*;

#[cfg(not(bpf_target_arch = "x86_64"))]
compile_error!(
    "scorch's BPF walk knows only x86-64 (arch/x86_64.rs); add this architecture's twin"
);
