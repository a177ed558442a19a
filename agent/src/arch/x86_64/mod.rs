//! x86-64.

pub mod decode;
pub mod plt;

use super::Relocation;

/// The architecture as `object` names it: the code this build's BPF walk unwinds.
pub const ARCHITECTURE: object::Architecture = object::Architecture::X86_64;

/// Where `struct task_struct` keeps the thread pointer a user thread's TLS is found from
/// (the `fs` base, which glibc points at the thread's `struct pthread`).
pub const THREAD_POINTER: &[&str] = &["thread", "fsbase"];

/// Whether `offset` from the thread pointer can be one of an executable's own thread-locals:
/// its TLS block lies just below the thread pointer (TLS variant II).
pub fn executable_thread_local(offset: i64) -> bool {
    offset < 0
}

/// The relocation kinds of the x86-64 psABI the readers resolve.
pub fn relocation(r_type: u32) -> Option<Relocation> {
    match r_type {
        object::elf::R_X86_64_RELATIVE => Some(Relocation::Relative),
        object::elf::R_X86_64_64 => Some(Relocation::Absolute),
        object::elf::R_X86_64_GLOB_DAT => Some(Relocation::GlobalData),
        object::elf::R_X86_64_JUMP_SLOT => Some(Relocation::JumpSlot),
        object::elf::R_X86_64_IRELATIVE => Some(Relocation::IndirectRelative),
        _ => None,
    }
}
