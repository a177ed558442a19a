//! The one way a program counts: add to its CPU's slot of a per-CPU counter array. Each
//! subsystem keeps its own array (the agent reads them by name), laid out in runs per
//! generation where its counts are windowed (`scorch_common::COUNTER_RUNS`).

use aya_ebpf::maps::PerCpuArray;

/// Adds `n` to this CPU's `index` of `counters`; an index past the end counts nothing.
#[inline(always)]
pub fn add(counters: &PerCpuArray<u64>, index: u32, n: u64) {
    if let Some(counter) = counters.get_ptr_mut(index) {
        // SAFETY: this CPU's slot; a program does not run twice at once on one CPU (the
        // perf-event program does not nest, nor does the scheduler hook).
        unsafe { *counter += n };
    }
}
