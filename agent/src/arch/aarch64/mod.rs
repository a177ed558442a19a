//! arm64 (AArch64).
//!
//! Not here yet, and refused where asked for (see `arch`'s dispatchers): a decoder of the
//! instruction patterns the runtime readers look for (CPython's thread state, glibc's
//! `pthread_getspecific`), and names for the PLT's stubs.

pub mod pac;

use super::Relocation;

/// Where `struct task_struct` keeps the thread pointer a user thread's TLS is found from
/// (`TPIDR_EL0`, saved at each context switch; glibc's `struct pthread` sits below it).
pub const THREAD_POINTER: &[&str] = &["thread", "uw", "tp_value"];

/// The relocation kinds of the AArch64 ELF ABI the readers resolve.
pub fn relocation(r_type: u32) -> Option<Relocation> {
    match r_type {
        object::elf::R_AARCH64_RELATIVE => Some(Relocation::Relative),
        object::elf::R_AARCH64_ABS64 => Some(Relocation::Absolute),
        object::elf::R_AARCH64_GLOB_DAT => Some(Relocation::GlobalData),
        object::elf::R_AARCH64_JUMP_SLOT => Some(Relocation::JumpSlot),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_abi_s_relocation_numbers() {
        // AArch64 ELF ABI, table "Dynamic relocations".
        assert_eq!(relocation(1027), Some(Relocation::Relative));
        assert_eq!(relocation(257), Some(Relocation::Absolute));
        assert_eq!(relocation(1025), Some(Relocation::GlobalData));
        assert_eq!(relocation(1026), Some(Relocation::JumpSlot));
        assert_eq!(relocation(1028), None);
    }
}
