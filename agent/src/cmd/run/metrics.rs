//! The window loop's own metrics: what each window sampled and lost, how long draining and
//! symbolising took, what became of it in the store, the BPF filter, and the symbol cache.

use std::{collections::BTreeMap, sync::atomic::AtomicU64, time::Duration};

use scorch_common::OffCpuCount;

use prometheus_client::{
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{exponential_buckets, Histogram},
    },
    registry::Unit,
};

use crate::{
    labels::Missing,
    metrics::{LabeledCounter, Registry},
    pipeline::drain::{Losses, StackMapFill},
    pipeline::off_cpu::OffCpuCounts,
    process::captures::{CaptureDrop, CaptureStats},
    store::ErrorReason,
    symbolize::user::CacheStats,
};

#[derive(Debug)]
pub struct WindowMetrics {
    samples: Counter,
    losses: LabeledCounter,
    drain_seconds: Histogram,
    symbolize_seconds: Histogram,
    windows_written: Counter,
    store_write_errors: LabeledCounter,
    store_bytes: Gauge<u64, AtomicU64>,
    windows_buffered: Gauge<u64, AtomicU64>,
    windows_dropped: Counter,
    /// Samples the BPF PID filter discarded (processes relabelling dropped).
    samples_filtered: Counter,
    /// Processes in the BPF deny list now.
    processes_excluded: Gauge<u64, AtomicU64>,
    /// Threads folded into `(other threads)` past the cap per process, summed over
    /// processes and windows (CPU and off-CPU).
    threads_folded: Counter,
    symbol_cache_bytes: Gauge<u64, AtomicU64>,
    symbol_cache_file_backed_bytes: Gauge<u64, AtomicU64>,
    symbol_cache_hits: Counter,
    symbol_cache_misses: Counter,
    /// The cache's own cumulative (hits, misses) at the last report: the counters advance by
    /// the difference, so the loop can hand over the cache's totals as they are.
    symbol_cache_reported: (u64, u64),
    /// Pages of mapped files read after the file shrank, and the total at the last report.
    mapped_file_faults: RunningTotal,
    /// The BPF program's run time and count (`kernel.bpf_stats_enabled`), and the totals at
    /// the last report.
    bpf_run_time: Counter<f64, AtomicU64>,
    bpf_run_count: Counter,
    bpf_run_reported: (Duration, u64),
    bpf_map_memory: Gauge<u64, AtomicU64>,
    /// Processes whose maps are captured (alive, or exited with samples not named yet), the
    /// bytes those take, and the open handles on their files.
    process_captures: Gauge<u64, AtomicU64>,
    process_capture_bytes: Gauge<u64, AtomicU64>,
    process_capture_files: Gauge<u64, AtomicU64>,
    /// Captures dropped before their samples were named, by the bound that dropped them, and
    /// the totals at the last report.
    process_captures_dropped: LabeledCounter,
    process_captures_dropped_reported: BTreeMap<CaptureDrop, u64>,
    /// Samples written without some of their process's labels, by what they lack.
    samples_unlabelled: LabeledCounter,
    /// Samples whose frame-pointer walk ended in glibc's start code and got the frames a table
    /// walk found below it, and the total at the last report.
    start_frames_completed: RunningTotal,
    /// Runtime frame locations left unnamed, by runtime, and the totals at the last report.
    runtime_unnamed: Family<[(&'static str, &'static str); 1], Counter>,
    runtime_unnamed_reported: BTreeMap<&'static str, u64>,
    runtime_names_bytes: Family<[(&'static str, &'static str); 1], Gauge<u64, AtomicU64>>,
    /// The distinct stacks the last window stored in each stack map, and the entries each holds.
    stack_map_entries: Family<[(&'static str, &'static str); 1], Gauge<u64, AtomicU64>>,
    stack_map_max_entries: Family<[(&'static str, &'static str); 1], Gauge<u64, AtomicU64>>,
    /// What became of the blocks the off-CPU program saw, by outcome; the blocked time of
    /// those over the cap; the user stacks it walked; and the program's totals at the last
    /// report (they count from its load).
    off_cpu_blocks: LabeledCounter,
    off_cpu_over_cap_seconds: Counter<f64, AtomicU64>,
    off_cpu_walks: Counter,
    off_cpu_reported: OffCpuCounts,
}

impl WindowMetrics {
    pub fn register(registry: &mut Registry) -> WindowMetrics {
        WindowMetrics {
            samples: registry.register(
                "samples",
                "Samples drained from the kernel",
                Counter::default(),
            ),
            losses: registry.register(
                "losses",
                "Samples lost or damaged in the kernel, by reason (stack map collisions and \
                 errors lose a stack, a full counts map the whole sample)",
                LabeledCounter::new("reason", Losses::reasons()),
            ),
            // 0.5 ms .. 4 s: a drain reads and clears maps, normally a few milliseconds.
            drain_seconds: registry.register_with_unit(
                "drain_duration",
                "Time to flip generations and read one window's maps",
                Unit::Seconds,
                Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            ),
            // 1 ms .. 16 s: the first window of a new binary parses its DWARF.
            symbolize_seconds: registry.register_with_unit(
                "symbolize_duration",
                "Time to symbolise one window",
                Unit::Seconds,
                Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            ),
            windows_written: registry.register(
                "windows_written",
                "Windows written to the store",
                Counter::default(),
            ),
            // No series before the first failure: a store that never failed shows none (and
            // the disk-full integration test waits for `disk_full` to appear).
            store_write_errors: registry.register(
                "store_write_errors",
                "Failed store writes, by reason",
                LabeledCounter::new("reason", []),
            ),
            store_bytes: registry.register_with_unit(
                "store_size",
                "Size of the store on disk",
                Unit::Bytes,
                Gauge::default(),
            ),
            windows_buffered: registry.register(
                "windows_buffered",
                "Windows held in memory because the store cannot be written",
                Gauge::default(),
            ),
            windows_dropped: registry.register(
                "windows_dropped",
                "Windows discarded because the store could not be written for too long",
                Counter::default(),
            ),
            samples_filtered: registry.register(
                "samples_filtered",
                "Samples of processes relabelling dropped, discarded in the kernel before any stack walk",
                Counter::default(),
            ),
            processes_excluded: registry.register(
                "processes_excluded",
                "Processes relabelling dropped that the BPF program skips",
                Gauge::default(),
            ),
            threads_folded: registry.register(
                "threads_folded",
                "Threads folded into thread=\"(other threads)\", past the cap of distinct threads per process per window",
                Counter::default(),
            ),
            symbol_cache_bytes: registry.register_with_unit(
                "symbol_cache",
                "The symbol cache's estimate of what its parsed binaries hold, which its \
                 budget (--symbol-cache-mb) bounds: symbol tables, inflated debug sections, \
                 and the debug sections read in place, which are file-backed pages counted \
                 whole here (scorch_symbol_cache_file_backed_bytes) although only the pages \
                 lookups touch are resident; scorch_footprint_bytes is what is charged",
                Unit::Bytes,
                Gauge::default(),
            ),
            symbol_cache_file_backed_bytes: registry.register_with_unit(
                "symbol_cache_file_backed",
                "Of scorch_symbol_cache_bytes, the debug sections mapped from their files and \
                 read in place: page cache, not heap, and resident only where lookups read",
                Unit::Bytes,
                Gauge::default(),
            ),
            symbol_cache_hits: registry.register(
                "symbol_cache_hits",
                "Symbol cache lookups that found the file already parsed",
                Counter::default(),
            ),
            symbol_cache_misses: registry.register(
                "symbol_cache_misses",
                "Symbol cache lookups that had to parse the file",
                Counter::default(),
            ),
            symbol_cache_reported: (0, 0),
            mapped_file_faults: RunningTotal::new(registry.register(
                "mapped_file_faults",
                "Pages of a mapped binary or debug file read after the file shrank: read as zeros \
                 (SIGBUS handled) instead of stopping the daemon",
                Counter::default(),
            )),
            bpf_run_time: registry.register_with_unit(
                "bpf_run_time",
                "Time the kernel spent in the sampling program, while kernel.bpf_stats_enabled \
                 is 1 (it stays 0 otherwise: the kernel counts only then)",
                Unit::Seconds,
                Counter::default(),
            ),
            bpf_run_count: registry.register(
                "bpf_run_count",
                "Runs of the sampling program, while kernel.bpf_stats_enabled is 1",
                Counter::default(),
            ),
            bpf_run_reported: (Duration::ZERO, 0),
            bpf_map_memory: {
                let gauge = registry.register_with_unit(
                    "bpf_map_memory",
                    "Kernel memory charged to the BPF maps the daemon holds (their memlock)",
                    Unit::Bytes,
                    Gauge::default(),
                );
                registry.register_footprint(gauge.clone());
                gauge
            },
            process_captures: registry.register(
                "process_captures",
                "Processes whose maps are kept for naming their frames: alive, or exited with \
                 samples not named yet",
                Gauge::default(),
            ),
            process_capture_bytes: registry.register_with_unit(
                "process_capture",
                "Estimated memory of the captured process maps",
                Unit::Bytes,
                Gauge::default(),
            ),
            process_capture_files: registry.register(
                "process_capture_files",
                "Open handles on mapped files kept so a process that exits (or a binary deleted) \
                 can still be named",
                Gauge::default(),
            ),
            process_captures_dropped: registry.register(
                "process_captures_dropped",
                "Captures of exited processes (or file handles) dropped before their samples \
                 were named, by the bound that dropped them",
                LabeledCounter::new("reason", CaptureDrop::ALL.map(CaptureDrop::as_str)),
            ),
            process_captures_dropped_reported: BTreeMap::new(),
            samples_unlabelled: registry.register(
                "samples_unlabelled",
                "Samples written without some of their process's labels, by what they lack: \
                 the executable (the process exited before /proc/PID/exe was read and its \
                 exec was not recorded), or everything but the pid (it exited unread and the \
                 kernel's record of it was lost)",
                LabeledCounter::new("reason", Missing::ALL.map(Missing::as_str)),
            ),
            start_frames_completed: RunningTotal::new(registry.register(
                "start_frames_completed_samples",
                "Samples whose frame-pointer walk ended in glibc's start code and were given \
                 the frames below it that table walks of the same libc found",
                Counter::default(),
            )),
            runtime_unnamed: registry.register(
                "runtime_locations_unnamed",
                "Runtime frame locations shown unknown, by runtime (Python's `[python: unknown \
                 code object]`): what the frame points at could not be read, or was not one",
                Family::default(),
            ),
            runtime_unnamed_reported: BTreeMap::new(),
            runtime_names_bytes: registry.register(
                "runtime_names_bytes",
                "The memory the last window's runtime frame names took before the window \
                 ended and they were dropped, by runtime: entries and their text, by capacity",
                Family::default(),
            ),
            stack_map_entries: registry.register(
                "stack_map_entries",
                "Distinct stacks the last window stored, by stack map (`stacks`: kernel stacks, \
                 and user stacks under --unwind fp; `user_stacks`: the record of the stacks \
                 walked with unwind tables); a map near its max entries loses stacks as \
                 collisions (losses)",
                Family::default(),
            ),
            stack_map_max_entries: registry.register(
                "stack_map_max_entries",
                "Entries each stack map holds, by map",
                Family::default(),
            ),
            // Registered without off-CPU too: zeros, not missing series, on a daemon without it.
            off_cpu_blocks: registry.register(
                "off_cpu_blocks",
                "Off-CPU blocks the scheduler hook saw, by outcome: recorded (sent, and sampled \
                 into the off-CPU profile), over_cap (past off-cpu-max-events a second), \
                 ring_full (the daemon read too slowly), threads_full (no room in the thread \
                 map), user_stack_evicted (sent without a user stack), below_minimum",
                LabeledCounter::new("outcome", OffCpuCounts::OUTCOMES.map(|(_, name)| name)),
            ),
            off_cpu_over_cap_seconds: registry.register_with_unit(
                "off_cpu_over_cap",
                "Blocked time of the off-CPU blocks over the cap, missing from the off-CPU profile",
                Unit::Seconds,
                Counter::default(),
            ),
            off_cpu_walks: registry.register(
                "off_cpu_user_stack_walks",
                "User stacks the off-CPU hook walked at switch-out",
                Counter::default(),
            ),
            off_cpu_reported: OffCpuCounts::default(),
        }
    }

    /// A window was drained: its samples, its losses, how full it left the stack maps, and
    /// how long the drain took.
    pub fn window_drained(
        &self,
        samples: u64,
        losses: &Losses,
        stack_maps: &StackMapFill,
        drain: Duration,
    ) {
        self.samples.inc_by(samples);
        for (reason, count) in losses.by_reason() {
            self.losses.inc_by(reason, count);
        }
        for (map, used, capacity) in [
            ("stacks", stack_maps.used.stacks, stack_maps.capacity.stacks),
            (
                "user_stacks",
                stack_maps.used.user_stacks,
                stack_maps.capacity.user_stacks,
            ),
        ] {
            let label = [("map", map)];
            self.stack_map_entries
                .get_or_create(&label)
                .set(u64::from(used));
            self.stack_map_max_entries
                .get_or_create(&label)
                .set(u64::from(capacity));
        }
        self.drain_seconds.observe(drain.as_secs_f64());
    }

    /// A window was symbolised in `duration`.
    pub fn window_symbolized(&self, duration: Duration) {
        self.symbolize_seconds.observe(duration.as_secs_f64());
    }

    pub fn window_written(&self) {
        self.windows_written.inc();
    }

    pub fn store_write_failed(&self, reason: ErrorReason) {
        self.store_write_errors.inc(reason.as_str());
    }

    pub fn set_store_bytes(&self, bytes: u64) {
        self.store_bytes.set(bytes);
    }

    /// Windows waiting in memory for the store to accept writes again.
    pub fn set_windows_buffered(&self, windows: u64) {
        self.windows_buffered.set(windows);
    }

    /// A buffered window was given up on.
    pub fn window_dropped(&self) {
        self.windows_dropped.inc();
    }

    /// More samples discarded by the BPF PID filter, and how many processes it excludes now.
    pub fn filtered(&self, new_samples: u64, processes_excluded: u64) {
        self.samples_filtered.inc_by(new_samples);
        self.processes_excluded.set(processes_excluded);
    }

    /// A window's threads folded past the cap per process.
    pub fn threads_folded(&self, threads: u64) {
        self.threads_folded.inc_by(threads);
    }

    /// The symbol cache's size and its cumulative hit and miss counts.
    pub fn set_symbol_cache(&mut self, cache: &CacheStats) {
        let (hits, misses) = (cache.hits, cache.misses);
        self.symbol_cache_bytes.set(cache.bytes);
        self.symbol_cache_file_backed_bytes.set(cache.file_backed);
        let reported = self.symbol_cache_reported;
        // A cache rebuilt from zero counts from zero again: its new totals are all new events.
        let advance = |now: u64, before: u64| if now >= before { now - before } else { now };
        self.symbol_cache_hits.inc_by(advance(hits, reported.0));
        self.symbol_cache_misses.inc_by(advance(misses, reported.1));
        self.symbol_cache_reported = (hits, misses);
    }

    /// The program's cumulative run time and count (when the kernel counts them), and the
    /// memory of the maps now.
    pub fn bpf_cost(&mut self, run: Option<(Duration, u64)>, map_memory: Option<u64>) {
        if let Some((time, count)) = run {
            let (time_before, count_before) = self.bpf_run_reported;
            // Stats switched off and on again restart nowhere: the kernel keeps its totals, so
            // only a program reloaded from zero would go back, and then all of it is new.
            let time_new = time.checked_sub(time_before).unwrap_or(time);
            let count_new = count.checked_sub(count_before).unwrap_or(count);
            self.bpf_run_time.inc_by(time_new.as_secs_f64());
            self.bpf_run_count.inc_by(count_new);
            self.bpf_run_reported = (time, count);
        }
        if let Some(bytes) = map_memory {
            self.bpf_map_memory.set(bytes);
        }
    }

    /// What the process captures hold, and their cumulative early drops.
    pub fn set_process_captures(&mut self, stats: &CaptureStats) {
        self.process_captures.set(stats.processes as u64);
        self.process_capture_bytes.set(stats.bytes as u64);
        self.process_capture_files.set(stats.files as u64);
        for (&reason, &total) in &stats.dropped {
            let before = self
                .process_captures_dropped_reported
                .insert(reason, total)
                .unwrap_or(0);
            self.process_captures_dropped
                .inc_by(reason.as_str(), total.saturating_sub(before));
        }
    }

    /// Samples of a window labelled without some of their process's labels, by reason.
    pub fn samples_unlabelled(&self, by_reason: &BTreeMap<&'static str, u64>) {
        for (&reason, &count) in by_reason {
            self.samples_unlabelled.inc_by(reason, count);
        }
    }

    /// The off-CPU program's counters since it was loaded.
    pub fn set_off_cpu(&mut self, counts: &OffCpuCounts) {
        let before = self.off_cpu_reported;
        let new = |kind: OffCpuCount| counts.get(kind).saturating_sub(before.get(kind));
        for (kind, name) in OffCpuCounts::OUTCOMES {
            self.off_cpu_blocks.inc_by(name, new(kind));
        }
        self.off_cpu_over_cap_seconds
            .inc_by(new(OffCpuCount::OverCapNs) as f64 / 1e9);
        self.off_cpu_walks.inc_by(new(OffCpuCount::Walks));
        self.off_cpu_reported = *counts;
    }

    /// The cumulative count of samples completed below glibc's start code.
    pub fn set_start_frames_completed(&mut self, total: u64) {
        self.start_frames_completed.set(total);
    }

    /// Each runtime's cumulative count of frame locations left unnamed.
    pub fn set_runtime_unnamed(&mut self, totals: &[(&'static str, (u64, u64))]) {
        for &(runtime, (_, unknown)) in totals {
            let reported = self.runtime_unnamed_reported.entry(runtime).or_default();
            self.runtime_unnamed
                .get_or_create(&[("runtime", runtime)])
                .inc_by(unknown.saturating_sub(*reported));
            *reported = (*reported).max(unknown);
        }
    }

    /// Each runtime's names' memory in the last window.
    pub fn set_runtime_names_bytes(&mut self, bytes: &[(&'static str, usize)]) {
        for &(runtime, bytes) in bytes {
            self.runtime_names_bytes
                .get_or_create(&[("runtime", runtime)])
                .set(bytes as u64);
        }
    }

    /// The process's cumulative count of pages mapped over a shrunk file.
    pub fn set_mapped_file_faults(&mut self, total: u64) {
        self.mapped_file_faults.set(total);
    }
}

/// A counter fed from a running total kept elsewhere: it advances by the difference, so a
/// caller hands over the total as it is.
#[derive(Debug)]
struct RunningTotal {
    counter: Counter,
    reported: u64,
}

impl RunningTotal {
    fn new(counter: Counter) -> RunningTotal {
        RunningTotal {
            counter,
            reported: 0,
        }
    }

    fn set(&mut self, total: u64) {
        self.counter.inc_by(total.saturating_sub(self.reported));
        self.reported = self.reported.max(total);
    }
}

#[cfg(test)]
mod tests {
    use scorch_common::Loss;

    use super::*;
    use crate::metrics::value_in as value;
    use crate::pipeline::maps::StackEntries;

    #[test]
    fn off_cpu_counts_advance_by_what_is_new() {
        let mut registry = Registry::new();
        let mut metrics = WindowMetrics::register(&mut registry);
        // Zeros before any off-CPU window.
        let text = registry.encode();
        assert_eq!(
            value(&text, "scorch_off_cpu_blocks_total{outcome=\"over_cap\"}"),
            0.0
        );
        let mut counts = OffCpuCounts::default();
        counts.by_kind[OffCpuCount::Recorded as usize] = 10;
        counts.by_kind[OffCpuCount::OverCap as usize] = 3;
        counts.by_kind[OffCpuCount::OverCapNs as usize] = 2_000_000_000;
        counts.by_kind[OffCpuCount::Walks as usize] = 40;
        metrics.set_off_cpu(&counts);
        counts.by_kind[OffCpuCount::Recorded as usize] = 15;
        counts.by_kind[OffCpuCount::RingFull as usize] = 1;
        metrics.set_off_cpu(&counts);
        let text = registry.encode();
        let blocks = |outcome: &str| {
            value(
                &text,
                &format!("scorch_off_cpu_blocks_total{{outcome=\"{outcome}\"}}"),
            )
        };
        assert_eq!(blocks("recorded"), 15.0);
        assert_eq!(blocks("over_cap"), 3.0);
        assert_eq!(blocks("ring_full"), 1.0);
        assert_eq!(value(&text, "scorch_off_cpu_over_cap_seconds_total"), 2.0);
        assert_eq!(value(&text, "scorch_off_cpu_user_stack_walks_total"), 40.0);
    }

    #[test]
    fn windows_are_counted() {
        let mut registry = Registry::new();
        let metrics = WindowMetrics::register(&mut registry);
        let mut losses = Losses::default();
        losses.by_kind[Loss::UserStackCollision as usize] = 2;
        losses.by_kind[Loss::CountsMapFull as usize] = 1;
        losses.truncated_stacks = 5;
        let fill = |stacks, user_stacks| StackMapFill {
            used: StackEntries {
                stacks,
                user_stacks,
            },
            capacity: StackEntries {
                stacks: 8192,
                user_stacks: 1024,
            },
        };
        metrics.window_drained(100, &losses, &fill(40, 90), Duration::from_millis(3));
        metrics.window_drained(
            50,
            &Losses::default(),
            &fill(12, 30),
            Duration::from_millis(1),
        );
        metrics.window_symbolized(Duration::from_millis(20));
        metrics.window_written();
        metrics.store_write_failed(ErrorReason::DiskFull);
        metrics.store_write_failed(ErrorReason::DiskFull);
        metrics.set_store_bytes(4096);
        metrics.set_windows_buffered(2);
        metrics.window_dropped();
        metrics.threads_folded(3);
        metrics.threads_folded(0);

        let text = registry.encode();
        assert_eq!(value(&text, "scorch_samples_total"), 150.0);
        assert_eq!(value(&text, "scorch_threads_folded_total"), 3.0);
        assert_eq!(
            value(
                &text,
                r#"scorch_losses_total{reason="user stack collision"}"#
            ),
            2.0
        );
        assert_eq!(
            value(&text, r#"scorch_losses_total{reason="counts map full"}"#),
            1.0
        );
        assert_eq!(
            value(&text, r#"scorch_losses_total{reason="truncated stacks"}"#),
            5.0
        );
        // Reasons that never happened are there at zero.
        assert_eq!(
            value(&text, r#"scorch_losses_total{reason="comm map full"}"#),
            0.0
        );
        // The last window's fill, beside what the maps hold.
        assert_eq!(
            value(&text, r#"scorch_stack_map_entries{map="stacks"}"#),
            12.0
        );
        assert_eq!(
            value(&text, r#"scorch_stack_map_entries{map="user_stacks"}"#),
            30.0
        );
        assert_eq!(
            value(&text, r#"scorch_stack_map_max_entries{map="user_stacks"}"#),
            1024.0
        );
        assert_eq!(
            value(&text, r#"scorch_stack_map_max_entries{map="stacks"}"#),
            8192.0
        );
        assert_eq!(value(&text, "scorch_drain_duration_seconds_count"), 2.0);
        assert!((value(&text, "scorch_drain_duration_seconds_sum") - 0.004).abs() < 1e-9);
        assert_eq!(
            value(&text, r#"scorch_drain_duration_seconds_bucket{le="0.002"}"#),
            1.0
        );
        assert_eq!(value(&text, "scorch_symbolize_duration_seconds_count"), 1.0);
        assert_eq!(value(&text, "scorch_windows_written_total"), 1.0);
        assert_eq!(
            value(
                &text,
                r#"scorch_store_write_errors_total{reason="disk_full"}"#
            ),
            2.0
        );
        assert_eq!(value(&text, "scorch_store_size_bytes"), 4096.0);
        assert_eq!(value(&text, "scorch_windows_buffered"), 2.0);
        assert_eq!(value(&text, "scorch_windows_dropped_total"), 1.0);
        assert!(text.contains("# TYPE scorch_drain_duration_seconds histogram"));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn store_errors_appear_with_the_first() {
        let mut registry = Registry::new();
        let metrics = WindowMetrics::register(&mut registry);
        assert!(!registry.encode().contains("store_write_errors"));
        metrics.store_write_failed(ErrorReason::Busy);
        let text = registry.encode();
        assert_eq!(
            value(&text, r#"scorch_store_write_errors_total{reason="busy"}"#),
            1.0
        );
    }

    #[test]
    fn symbol_cache_totals_become_counters() {
        let mut registry = Registry::new();
        let mut metrics = WindowMetrics::register(&mut registry);
        metrics.set_symbol_cache(&CacheStats {
            bytes: 1000,
            file_backed: 600,
            hits: 10,
            misses: 2,
        });
        metrics.set_symbol_cache(&CacheStats {
            bytes: 3000,
            file_backed: 2000,
            hits: 25,
            misses: 3,
        });
        let text = registry.encode();
        assert_eq!(value(&text, "scorch_symbol_cache_bytes"), 3000.0);
        assert_eq!(
            value(&text, "scorch_symbol_cache_file_backed_bytes"),
            2000.0
        );
        assert_eq!(value(&text, "scorch_symbol_cache_hits_total"), 25.0);
        assert_eq!(value(&text, "scorch_symbol_cache_misses_total"), 3.0);
        // A cache that starts over does not make the counters go back.
        metrics.set_symbol_cache(&CacheStats {
            bytes: 0,
            file_backed: 0,
            hits: 4,
            misses: 1,
        });
        let text = registry.encode();
        assert_eq!(value(&text, "scorch_symbol_cache_hits_total"), 29.0);
        assert_eq!(value(&text, "scorch_symbol_cache_misses_total"), 4.0);
    }

    #[test]
    fn running_totals_become_counters() {
        let mut registry = Registry::new();
        let mut metrics = WindowMetrics::register(&mut registry);
        assert_eq!(
            value(&registry.encode(), "scorch_mapped_file_faults_total"),
            0.0
        );
        metrics.set_mapped_file_faults(3);
        metrics.set_mapped_file_faults(3);
        metrics.set_mapped_file_faults(5);
        metrics.set_start_frames_completed(7);
        metrics.set_start_frames_completed(9);
        let text = registry.encode();
        assert_eq!(value(&text, "scorch_mapped_file_faults_total"), 5.0);
        assert_eq!(
            value(&text, "scorch_start_frames_completed_samples_total"),
            9.0
        );
    }
}
