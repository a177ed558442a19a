//! The unwinder's `/metrics`: how walks with tables ended, and what the tables take in BPF map
//! memory and in row pools (64 MiB at most for the whole machine by default).

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Unit,
};
use scorch_common::UnwindOutcome;

use super::loader::LoaderStats;
use crate::metrics::{LabeledCounter, Registry};
use crate::pipeline::drain::RuntimeCounts;

#[derive(Debug)]
pub struct UnwindMetrics {
    outcomes: LabeledCounter,
    table_bytes: Gauge<u64, AtomicU64>,
    pool_bytes: Gauge<u64, AtomicU64>,
    tables: Gauge<u64, AtomicU64>,
    evicted: Counter<u64, AtomicU64>,
    idle: Counter<u64, AtomicU64>,
    moved: Counter<u64, AtomicU64>,
    pools_given_back: Counter<u64, AtomicU64>,
    pool_bytes_given_back: Counter<u64, AtomicU64>,
    processes: Gauge<u64, AtomicU64>,
    without_room: Counter<u64, AtomicU64>,
    processes_read: Counter<u64, AtomicU64>,
    /// Each runtime's frames its BPF walk emitted, by runtime.
    runtime_frames: Family<[(&'static str, &'static str); 1], Counter<u64, AtomicU64>>,
    /// Each runtime's chains that stopped early, by runtime and reason.
    runtime_stops: Family<[(&'static str, &'static str); 2], Counter<u64, AtomicU64>>,
    runtime_processes: Gauge<u64, AtomicU64>,
    runtime_processes_refused: Gauge<u64, AtomicU64>,
}

impl UnwindMetrics {
    pub fn register(registry: &mut Registry) -> UnwindMetrics {
        let metrics = UnwindMetrics {
            outcomes: LabeledCounter::new("outcome", UnwindOutcome::ALL.map(UnwindOutcome::name)),
            table_bytes: Gauge::default(),
            pool_bytes: Gauge::default(),
            tables: Gauge::default(),
            evicted: Counter::default(),
            idle: Counter::default(),
            moved: Counter::default(),
            pools_given_back: Counter::default(),
            pool_bytes_given_back: Counter::default(),
            processes: Gauge::default(),
            without_room: Counter::default(),
            processes_read: Counter::default(),
            runtime_frames: Family::default(),
            runtime_stops: Family::default(),
            runtime_processes: Gauge::default(),
            runtime_processes_refused: Gauge::default(),
        };
        registry.register(
            "unwind_walks",
            "User stack walks with unwind tables, by how they ended (completed, or the reason \
             they stopped early); `no mapping`, `table not loaded` and `table evicted` count walks that fell \
             back to frame pointers for some frame",
            metrics.outcomes.clone(),
        );
        registry.register_with_unit(
            "unwind_tables",
            "BPF map memory the loaded unwind tables take",
            Unit::Bytes,
            metrics.table_bytes.clone(),
        );
        registry.register_with_unit(
            "unwind_row_pools",
            "BPF map memory of the unwind row pools, used or not: they are added as tables \
             need room, up to the ceiling (--unwind-pool-mib), and given back when emptied",
            Unit::Bytes,
            metrics.pool_bytes.clone(),
        );
        registry.register(
            "unwind_tables_loaded",
            "Unwind tables loaded into the BPF row pools",
            metrics.tables.clone(),
        );
        registry.register(
            "unwind_tables_evicted",
            "Unwind tables evicted for room at the row pools' ceiling (--unwind-pool-mib): \
             their code walks by frame pointers until a process maps them again",
            metrics.evicted.clone(),
        );
        registry.register(
            "unwind_tables_idle",
            "Unwind tables dropped because no process had mapped them for 30 s: a binary run \
             again has its table built again",
            metrics.idle.clone(),
        );
        registry.register(
            "unwind_tables_moved",
            "Unwind tables moved out of a row pool at most a quarter used, so that the pool \
             could be given back",
            metrics.moved.clone(),
        );
        registry.register(
            "unwind_row_pools_given_back",
            "Row pools given back to the kernel, emptied by idle, evicted or moved tables",
            metrics.pools_given_back.clone(),
        );
        registry.register_with_unit(
            "unwind_row_pools_given_back",
            "BPF map memory of the row pools given back to the kernel",
            Unit::Bytes,
            metrics.pool_bytes_given_back.clone(),
        );
        registry.register(
            "unwind_processes",
            "Processes whose executable mappings the BPF unwinder knows",
            metrics.processes.clone(),
        );
        registry.register(
            "unwind_processes_without_room",
            "Times a process found the BPF unwinder's process map full: it walks by frame \
             pointers until exits make room",
            metrics.without_room.clone(),
        );
        registry.register(
            "unwind_processes_read",
            "Times the unwinder read a process's maps and described it to the BPF walk: at its \
             first sample, while its libraries load, and after an exec or a new mapping; each \
             is the capture that names a short-lived process's frames",
            metrics.processes_read.clone(),
        );
        registry.register(
            "runtime_frames",
            "Frames a runtime's BPF walk emitted in place of its interpreter's (CPython's eval \
             loop), by runtime",
            metrics.runtime_frames.clone(),
        );
        registry.register(
            "runtime_walk_stops",
            "A runtime's frame chains that stopped early, by runtime and reason (CPython's: the \
             eval loop's frames stay native, thread state not found; the chain ends, frame \
             read fault or frame limit; or a frame is shown as an unknown code object)",
            metrics.runtime_stops.clone(),
        );
        registry.register(
            "runtime_processes",
            "Processes running a runtime whose frames the BPF walk takes over (CPython's, \
             HotSpot's), once per runtime a process runs",
            metrics.runtime_processes.clone(),
        );
        registry.register(
            "runtime_processes_refused",
            "Processes that map a runtime's binary but whose runtime the walk cannot take \
             (a JVM whose vmStructs tables are not what the walk reads, or lie), once per \
             runtime a process runs; the reason is in the debug log",
            metrics.runtime_processes_refused.clone(),
        );
        metrics
    }

    /// A window was drained: its walks by outcome, its runtimes' counts, and the tables held
    /// now.
    pub fn window_drained(
        &self,
        outcomes: impl Iterator<Item = (&'static str, u64)>,
        runtimes: &[RuntimeCounts],
        stats: LoaderStats,
    ) {
        for counts in runtimes {
            self.runtime_frames
                .get_or_create(&[("runtime", counts.runtime)])
                .inc_by(counts.frames());
            for (reason, count) in counts.stops() {
                self.runtime_stops
                    .get_or_create(&[("runtime", counts.runtime), ("reason", reason)])
                    .inc_by(count);
            }
        }
        self.runtime_processes.set(stats.runtime_processes as u64);
        self.runtime_processes_refused
            .set(stats.runtime_processes_refused as u64);
        for (outcome, count) in outcomes {
            self.outcomes.inc_by(outcome, count);
        }
        self.table_bytes.set(stats.table_bytes);
        self.pool_bytes.set(stats.pool_bytes);
        self.tables.set(stats.tables_loaded as u64);
        advance(&self.evicted, stats.tables_evicted);
        advance(&self.idle, stats.tables_idle);
        advance(&self.moved, stats.tables_moved);
        advance(&self.pools_given_back, stats.pools_given_back);
        advance(&self.pool_bytes_given_back, stats.pool_bytes_given_back);
        self.processes.set(stats.processes as u64);
        advance(&self.processes_read, stats.processes_read);
        advance(&self.without_room, stats.processes_without_room);
    }
}

/// Brings `counter` up to the loader's running `total` (the loader keeps totals since start;
/// a counter only moves forward).
fn advance(counter: &Counter<u64, AtomicU64>, total: u64) {
    let counted = counter.get();
    if total > counted {
        counter.inc_by(total - counted);
    }
}
