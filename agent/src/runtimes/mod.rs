//! Language runtimes whose frames the native walk cannot name: what the BPF walk needs to
//! find an interpreter's own frames, read from the interpreter's binary.
//!
//! - `image`: one ELF image as these readers need it (symbols by name, bytes at an address,
//!   the ranges its `.eh_frame` describes).
//! - `libc`: where glibc keeps a thread's `pthread_getspecific` values.
//! - `python`: CPython 3.11 to 3.15: version, offsets, eval loop, where the thread state is.
//!
//! Pure: each reader takes a file's bytes and returns data or an error naming the file and
//! what is wrong; nothing here touches a process.

pub mod image;
pub mod libc;
pub mod python;
