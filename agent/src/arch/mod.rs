//! What differs between the architectures scorch runs on, one module each, with the same
//! names in each: the one for the machine scorch is built for is [`native`].
//!
//! x86-64 is the only one today. What a second one (arm64) adds here, beside its twin of each
//! item of [`x86_64`]:
//! - the instruction patterns the runtime readers recognise in compiled code (`decode`);
//! - where the kernel keeps a thread's thread pointer (`THREAD_POINTER`).
//!
//! Elsewhere, in files of their own named for the architecture: the BPF program's registers,
//! user-mode test and signal frame (agent-ebpf), the unwind rows' register numbers, PLT and
//! signal rows (`unwind/`). Still written for x86-64 where they are, and to move here as the
//! second architecture comes: glibc's `pthread_getspecific` read from its code
//! (`runtimes/libc.rs`), CPython's `_PyRuntime` found through its code
//! (`runtimes/python/mod.rs`), the relocation kinds of `runtimes/image.rs`, and the PLT stubs
//! of `symbolize/elf/symtab.rs`.

pub mod x86_64;

#[cfg(target_arch = "x86_64")]
pub use x86_64 as native;
