//! The operating system beneath every stage: capabilities, systemd notification, the
//! allocator, files, clocks, retry pacing and the `bpf(2)` calls aya lacks. Imports nothing
//! else of the crate.

pub mod allocator;
pub mod backoff;
pub mod bpf_batch;
pub mod btf;
pub mod fs;
pub mod hex;
pub mod memory;
pub mod notify;
pub mod privileges;
pub mod sigbus;
pub mod time;
pub mod untrusted;
