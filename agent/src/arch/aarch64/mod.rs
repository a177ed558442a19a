//! arm64 (AArch64).

pub mod decode;
pub mod plt;

pub mod pac;

use super::Relocation;

/// The architecture as `object` names it: the code this build's BPF walk unwinds.
pub const ARCHITECTURE: object::Architecture = object::Architecture::Aarch64;

/// Where `struct task_struct` keeps the thread pointer a user thread's TLS is found from
/// (`TPIDR_EL0`, saved at each context switch; glibc's `struct pthread` sits below it).
pub const THREAD_POINTER: &[&str] = &["thread", "uw", "tp_value"];

/// The bytes of the thread control block the thread pointer points at, which an
/// executable's TLS block follows (TLS variant I: glibc's `struct pthread` lies below).
const TCB_SIZE: i64 = 16;

/// Whether `offset` from the thread pointer can be one of an executable's own thread-locals:
/// its TLS block starts past the thread control block.
pub fn executable_thread_local(offset: i64) -> bool {
    offset >= TCB_SIZE
}

/// The relocation kinds of the AArch64 ELF ABI the readers resolve.
pub fn relocation(r_type: u32) -> Option<Relocation> {
    match r_type {
        object::elf::R_AARCH64_RELATIVE => Some(Relocation::Relative),
        object::elf::R_AARCH64_ABS64 => Some(Relocation::Absolute),
        object::elf::R_AARCH64_GLOB_DAT => Some(Relocation::GlobalData),
        object::elf::R_AARCH64_JUMP_SLOT => Some(Relocation::JumpSlot),
        object::elf::R_AARCH64_IRELATIVE => Some(Relocation::IndirectRelative),
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
        assert_eq!(relocation(1032), Some(Relocation::IndirectRelative));
        assert_eq!(relocation(1028), None);
    }
}

/// Debian's arm64 binaries the unit tests read, which `cargo xtask setup` provides: glibc from
/// `libc6-arm64-cross`, and Debian 12's CPython 3.11 unpacked where xtask's `ARM64_DEBS` says.
#[cfg(test)]
pub(crate) mod test_files {
    /// glibc 2.36.
    pub const LIBC: &str = "/usr/aarch64-linux-gnu/lib/libc.so.6";
    /// The interpreter, libpython linked in.
    pub const PYTHON: &str =
        "/var/cache/scorch-tests/debian/bookworm-arm64/python3.11-minimal/usr/bin/python3.11";
    /// The shared libpython.
    pub const LIBPYTHON: &str = "/var/cache/scorch-tests/debian/bookworm-arm64/libpython3.11/\
                                 usr/lib/aarch64-linux-gnu/libpython3.11.so.1.0";

    /// The bytes of `path`; a missing file fails the test with how to get it.
    pub fn read(path: &str) -> Vec<u8> {
        std::fs::read(path).unwrap_or_else(|err| missing(path, err))
    }

    /// `path`, which must exist, for a reader that opens it itself.
    pub fn existing(path: &str) -> &std::path::Path {
        let path = std::path::Path::new(path);
        if let Err(err) = std::fs::metadata(path) {
            missing(&path.display().to_string(), err);
        }
        path
    }

    fn missing(path: &str, err: std::io::Error) -> ! {
        panic!(
            "{path}: {err}; `cargo xtask setup` installs libc6-arm64-cross and unpacks \
             Debian 12's arm64 python3.11-minimal and libpython3.11 under \
             /var/cache/scorch-tests"
        )
    }
}
