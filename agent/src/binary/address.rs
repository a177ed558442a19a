//! The address spaces a user frame passes through on its way to a name, one type each.
//!
//! A leaf both [`super::elf`] (which translates between them) and [`super::user`] (which
//! starts from `/proc/PID/maps`) import, so neither imports the other for them.

/// An offset into a file on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FileOffset(pub u64);

/// A virtual address as the ELF file's own headers and symbols use it (before relocation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ElfAddress(pub u64);
