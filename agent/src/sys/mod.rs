//! The operating system beneath every stage: capabilities, systemd notification, the
//! allocator, files, clocks and retry pacing. Imports nothing else of the crate.

pub mod allocator;
pub mod backoff;
pub mod btf;
pub mod fs;
pub mod hex;
pub mod memory;
pub mod notify;
pub mod privileges;
pub mod sigbus;
pub mod time;
pub mod untrusted;
