//! The programs the agent attaches, thin over the walk and the shared state: the perf-event
//! sampler, the off-CPU `sched_switch` hook, and the tracepoints that keep the walk's process
//! data true.

pub mod sampler;
pub mod off_cpu;
pub mod process_events;
