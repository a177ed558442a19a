//! Flags of the maps the crate declares.

/// `BPF_F_NO_PREALLOC`: a hash map holds only the entries it has, allocated as they are
/// inserted, instead of every entry up front. For maps only the agent writes (the program
/// reads and deletes): sized for thousands of processes, they hold the few dozen a host runs,
/// and no entry is ever allocated in the program's (NMI) context. The kernels of the matrix
/// (6.1, 6.12, 6.18) accept them in a perf-event program.
pub const BPF_F_NO_PREALLOC: u32 = 1;
