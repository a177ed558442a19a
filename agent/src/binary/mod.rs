//! Binary formats, read in place from a file's bytes: what a binary says about itself, not
//! about a process that maps it.
//!
//! - `address`: the address spaces a pc passes through on its way to a name, each its own
//!   type (`FileOffset`, `ElfAddress`).
//! - `elf`: one parsed ELF image, read once and handed to every reader of the file: its
//!   `PT_LOAD` segments and a mapping's load bias, its GNU and Go build ids, its debug link,
//!   and where `.gopclntab` is.
//! - `gopclntab`: Go's function table, in every Go binary, stripped or not: function names,
//!   lines and inlined frames at a pc, each function's stack-pointer deltas, and the Go build
//!   id. Go is native code, not an interpreter: the unwinder and the symbolizer both read it.
//!
//! Pure: each reader takes a file's bytes and returns data or an error naming what is wrong.

pub mod address;
pub mod elf;
pub mod gopclntab;
