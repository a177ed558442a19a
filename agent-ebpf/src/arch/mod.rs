//! What the walk needs to know of the machine, one file per architecture: which registers of
//! `pt_regs` are the pc, stack pointer and frame pointer, how to tell a sample taken in user
//! mode, where a signal frame keeps the interrupted registers, and the PLT stubs' rule. The
//! rest of the crate calls these and names no register. x86-64 and arm64, each with the same
//! items; a return address read from a frame goes through [`return_address`] (arm64 strips
//! its pointer-authentication code).

#[cfg(bpf_target_arch = "x86_64")]
mod x86_64;
#[cfg(bpf_target_arch = "x86_64")]
pub use self::x86_64::*;

#[cfg(bpf_target_arch = "aarch64")]
mod aarch64;
#[cfg(bpf_target_arch = "aarch64")]
pub use self::aarch64::*;

#[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
compile_error!(
    "scorch's BPF walk knows x86-64 (arch/x86_64.rs) and arm64 (arch/aarch64.rs); add this \
     architecture's twin"
);
