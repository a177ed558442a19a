//! What the programs, the walk and the runtimes share: the agent's switches and PID filter,
//! the per-CPU counter bump, the `bpf_loop` wrapper, the event ring buffer, the task fields
//! read, the walk's state with the stack it fills, and reads of user memory. Nothing here
//! knows which programs, runtimes or architectures exist (the crate's layers: `main.rs`).

pub mod flags;
pub mod control;
pub mod counters;
pub mod loops;
pub mod events;
pub mod task;
pub mod stack;
pub mod user;
