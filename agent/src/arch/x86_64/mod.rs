//! x86-64.

pub mod decode;

/// Where `struct task_struct` keeps the thread pointer a user thread's TLS is found from
/// (the `fs` base, which glibc points at the thread's `struct pthread`).
pub const THREAD_POINTER: &[&str] = &["thread", "fsbase"];
