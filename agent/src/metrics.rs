//! The daemon's own health, for `GET /metrics` (Prometheus) and `GET /healthz`.
//!
//! `scorch run` reports what each window did ([`Metrics::window_drained`] and friends); the
//! HTTP server encodes the counters on each scrape, reading the process's own RSS and CPU time
//! from `/proc/self` at that moment so they are never stale. [`Health`] turns "is sampling
//! still draining windows, and did the last store write work" into a yes or a reason.
//!
//! Everything here is shared between the sampling loop and the server through an `Arc`, so it
//! is all atomics and short-held locks.

use std::{
    fmt,
    sync::{Arc, Mutex, OnceLock, PoisonError},
    time::{Duration, SystemTime},
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::{ConstGauge, Gauge},
        histogram::{exponential_buckets, Histogram},
    },
    registry::{Registry, Unit},
};
use scorch_common::Loss;

/// What `scorch_kubernetes_api_*` report, read at each scrape. The pod metadata cache
/// implements it; this module names no subsystem, so that every one of them can report here.
pub trait ApiServerState: fmt::Debug + Send + Sync {
    /// The API server answered the last request.
    fn reachable(&self) -> bool;
    /// Failed requests and broken watches so far.
    fn api_errors(&self) -> u64;
}

/// The content type of [`Metrics::encode`]'s output: prometheus-client writes OpenMetrics text
/// (counters suffixed `_total`, a closing `# EOF`), and Prometheus picks its parser from this.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The `reason` label of [`Losses::truncated_stacks`], beside the [`Loss`] names.
pub const TRUNCATED_STACKS: &str = "truncated stacks";

/// One `reason="..."` label.
type Reason = [(&'static str, &'static str); 1];

/// The daemon's counters, gauges and histograms, and the registry that encodes them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    samples: Counter,
    losses: Family<Reason, Counter>,
    drain_seconds: Histogram,
    symbolize_seconds: Histogram,
    windows_written: Counter,
    store_write_errors: Family<Reason, Counter>,
    store_bytes: Gauge<u64, std::sync::atomic::AtomicU64>,
    windows_buffered: Gauge<u64, std::sync::atomic::AtomicU64>,
    windows_dropped: Counter,
    /// Samples the BPF PID filter discarded (processes relabelling dropped).
    samples_filtered: Counter,
    /// Processes in the BPF deny list now.
    processes_excluded: Gauge<u64, std::sync::atomic::AtomicU64>,
    symbol_cache_bytes: Gauge<u64, std::sync::atomic::AtomicU64>,
    symbol_cache_hits: Counter,
    symbol_cache_misses: Counter,
    /// The cache's own cumulative (hits, misses) at the last report: the counters advance by
    /// the difference, so the daemon can hand over the cache's totals as they are.
    symbol_cache_reported: Mutex<(u64, u64)>,
    remote_windows_sent: Counter,
    remote_sent_bytes: Counter,
    remote_retries: Counter,
    remote_failures: Family<Reason, Counter>,
    remote_windows_rejected: Counter,
    remote_windows_dropped: Counter,
    remote_queue_windows: Gauge<u64, std::sync::atomic::AtomicU64>,
    remote_queue_age: Gauge<f64, std::sync::atomic::AtomicU64>,
    debuginfo_uploads: Family<[(&'static str, &'static str); 1], Counter>,
    debuginfo_uploaded_bytes: Counter,
    /// Set by [`Metrics::watch_kubernetes`] when running in a cluster; the
    /// `scorch_kubernetes_api_*` metrics exist only then, so outside Kubernetes no one sees an
    /// API server that looks down.
    kubernetes: Arc<OnceLock<Box<dyn ApiServerState>>>,
}

/// The `reason` labels of `scorch_remote_failures_total` (see `sink::SendError`), present from
/// the start at 0.
pub const REMOTE_FAILURE_REASONS: [&str; 8] = [
    "connection",
    "timeout",
    "throttled",
    "server_error",
    "unavailable",
    "aborted",
    "unauthorized",
    "rejected",
];

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let metrics = Metrics {
            registry: Registry::default(),
            samples: Counter::default(),
            losses: Family::default(),
            // 0.5 ms .. 4 s: a drain reads and clears maps, normally a few milliseconds.
            drain_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            // 1 ms .. 16 s: the first window of a new binary parses its DWARF.
            symbolize_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            windows_written: Counter::default(),
            store_write_errors: Family::default(),
            store_bytes: Gauge::default(),
            windows_buffered: Gauge::default(),
            windows_dropped: Counter::default(),
            samples_filtered: Counter::default(),
            processes_excluded: Gauge::default(),
            symbol_cache_bytes: Gauge::default(),
            symbol_cache_hits: Counter::default(),
            symbol_cache_misses: Counter::default(),
            symbol_cache_reported: Mutex::new((0, 0)),
            remote_windows_sent: Counter::default(),
            remote_sent_bytes: Counter::default(),
            remote_retries: Counter::default(),
            remote_failures: Family::default(),
            remote_windows_rejected: Counter::default(),
            remote_windows_dropped: Counter::default(),
            remote_queue_windows: Gauge::default(),
            remote_queue_age: Gauge::default(),
            debuginfo_uploads: Family::default(),
            debuginfo_uploaded_bytes: Counter::default(),
            kubernetes: Arc::default(),
        };
        for reason in REMOTE_FAILURE_REASONS {
            let _ = metrics.remote_failures.get_or_create(&[("reason", reason)]);
        }
        // Every loss reason exists from the start at 0, so a rate() over it works before the
        // first loss, as Prometheus's instrumentation guidelines ask.
        for loss in Loss::ALL {
            let _ = metrics.losses.get_or_create(&[("reason", loss.name())]);
        }
        let _ = metrics
            .losses
            .get_or_create(&[("reason", TRUNCATED_STACKS)]);

        let scorch = registry.sub_registry_with_prefix("scorch");
        scorch.register(
            "samples",
            "Samples drained from the kernel",
            metrics.samples.clone(),
        );
        scorch.register(
            "losses",
            "Samples lost or damaged in the kernel, by reason (stack map collisions and \
             errors lose a stack, a full counts map the whole sample)",
            metrics.losses.clone(),
        );
        scorch.register_with_unit(
            "drain_duration",
            "Time to flip generations and read one window's maps",
            Unit::Seconds,
            metrics.drain_seconds.clone(),
        );
        scorch.register_with_unit(
            "symbolize_duration",
            "Time to symbolise one window",
            Unit::Seconds,
            metrics.symbolize_seconds.clone(),
        );
        scorch.register(
            "windows_written",
            "Windows written to the store",
            metrics.windows_written.clone(),
        );
        scorch.register(
            "store_write_errors",
            "Failed store writes, by reason",
            metrics.store_write_errors.clone(),
        );
        scorch.register_with_unit(
            "store_size",
            "Size of the store on disk",
            Unit::Bytes,
            metrics.store_bytes.clone(),
        );
        scorch.register(
            "windows_buffered",
            "Windows held in memory because the store cannot be written",
            metrics.windows_buffered.clone(),
        );
        scorch.register(
            "windows_dropped",
            "Windows discarded because the store could not be written for too long",
            metrics.windows_dropped.clone(),
        );
        scorch.register(
            "samples_filtered",
            "Samples of processes relabelling dropped, discarded in the kernel before any stack walk",
            metrics.samples_filtered.clone(),
        );
        scorch.register(
            "processes_excluded",
            "Processes relabelling dropped that the BPF program skips",
            metrics.processes_excluded.clone(),
        );
        scorch.register_with_unit(
            "symbol_cache",
            "Memory held by parsed binaries and debug info",
            Unit::Bytes,
            metrics.symbol_cache_bytes.clone(),
        );
        scorch.register(
            "symbol_cache_hits",
            "Symbol cache lookups that found the file already parsed",
            metrics.symbol_cache_hits.clone(),
        );
        scorch.register(
            "symbol_cache_misses",
            "Symbol cache lookups that had to parse the file",
            metrics.symbol_cache_misses.clone(),
        );
        scorch.register(
            "remote_windows_sent",
            "Windows the remote server (Pyroscope or Parca) accepted",
            metrics.remote_windows_sent.clone(),
        );
        scorch.register_with_unit(
            "remote_sent",
            "Request bytes the remote server accepted (compressed, as sent)",
            Unit::Bytes,
            metrics.remote_sent_bytes.clone(),
        );
        scorch.register(
            "remote_retries",
            "Requests to the remote server sent again after a retryable failure",
            metrics.remote_retries.clone(),
        );
        scorch.register(
            "remote_failures",
            "Failed requests to the remote server, by reason (`rejected`: refused as bad, not \
             retried)",
            metrics.remote_failures.clone(),
        );
        scorch.register(
            "remote_windows_rejected",
            "Windows skipped because the remote server refused them as bad requests",
            metrics.remote_windows_rejected.clone(),
        );
        scorch.register(
            "remote_windows_dropped",
            "Windows the store's retention deleted before they could be sent",
            metrics.remote_windows_dropped.clone(),
        );
        scorch.register(
            "remote_queue_windows",
            "Windows in the store waiting to be sent",
            metrics.remote_queue_windows.clone(),
        );
        scorch.register_with_unit(
            "remote_queue_age",
            "Age of the oldest window waiting to be sent (0 when none waits)",
            Unit::Seconds,
            metrics.remote_queue_age.clone(),
        );
        scorch.register(
            "debuginfo_uploads",
            "Build ids whose debug info the remote Parca server was asked about, by result \
             (`already_present`: the server had it; `failed`: given up until the next start)",
            metrics.debuginfo_uploads.clone(),
        );
        scorch.register_with_unit(
            "debuginfo_uploaded",
            "Debug-info bytes uploaded to the remote Parca server (debug sections only)",
            Unit::Bytes,
            metrics.debuginfo_uploaded_bytes.clone(),
        );
        scorch.register_collector(Box::new(KubernetesCollector(Arc::clone(
            &metrics.kubernetes,
        ))));
        // Unprefixed: `process_*` are the names every Prometheus client library uses.
        registry.register_collector(Box::new(ProcessCollector));
        Metrics {
            registry,
            ..metrics
        }
    }

    /// A window was drained: its samples, its losses, and how long the drain took.
    ///
    /// `losses` are counts by reason: the [`Loss`] names and [`TRUNCATED_STACKS`].
    pub fn window_drained(
        &self,
        samples: u64,
        losses: impl IntoIterator<Item = (&'static str, u64)>,
        drain: Duration,
    ) {
        self.samples.inc_by(samples);
        for (reason, count) in losses {
            self.losses
                .get_or_create(&[("reason", reason)])
                .inc_by(count);
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

    /// A store write failed; `reason` is a short fixed word (`disk_full`, `io`, ...), since
    /// every distinct value becomes a series.
    pub fn store_write_failed(&self, reason: &'static str) {
        self.store_write_errors
            .get_or_create(&[("reason", reason)])
            .inc();
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

    /// The symbol cache's size and its cumulative hit and miss counts.
    pub fn set_symbol_cache(&self, bytes: u64, hits: u64, misses: u64) {
        self.symbol_cache_bytes.set(bytes);
        let mut reported = self
            .symbol_cache_reported
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // A cache rebuilt from zero counts from zero again: its new totals are all new events.
        let advance = |now: u64, before: u64| if now >= before { now - before } else { now };
        self.symbol_cache_hits.inc_by(advance(hits, reported.0));
        self.symbol_cache_misses.inc_by(advance(misses, reported.1));
        *reported = (hits, misses);
    }

    /// The remote server accepted a whole window.
    pub fn remote_window_sent(&self) {
        self.remote_windows_sent.inc();
    }

    /// The remote server accepted a request of `bytes`.
    pub fn remote_sent_bytes(&self, bytes: u64) {
        self.remote_sent_bytes.inc_by(bytes);
    }

    /// A request to the remote server is about to be sent again.
    pub fn remote_retried(&self) {
        self.remote_retries.inc();
    }

    /// A request to the remote server failed; `reason` is one of [`REMOTE_FAILURE_REASONS`].
    pub fn remote_failed(&self, reason: &'static str) {
        self.remote_failures
            .get_or_create(&[("reason", reason)])
            .inc();
    }

    pub fn remote_window_rejected(&self) {
        self.remote_windows_rejected.inc();
    }

    pub fn remote_windows_dropped(&self, windows: u64) {
        self.remote_windows_dropped.inc_by(windows);
    }

    /// Windows waiting to be sent, and how old the oldest is.
    pub fn set_remote_queue(&self, windows: u64, oldest_age_seconds: f64) {
        self.remote_queue_windows.set(windows);
        self.remote_queue_age.set(oldest_age_seconds);
    }

    /// Makes each debug-info upload `result` exist at 0 before the first upload ends.
    pub fn declare_debuginfo_results(&self, results: impl IntoIterator<Item = &'static str>) {
        for result in results {
            let _ = self.debuginfo_uploads.get_or_create(&[("result", result)]);
        }
    }

    /// One build id's debug-info upload ended.
    pub fn debuginfo_upload(&self, result: &'static str) {
        self.debuginfo_uploads
            .get_or_create(&[("result", result)])
            .inc();
    }

    pub fn debuginfo_uploaded_bytes(&self, bytes: u64) {
        self.debuginfo_uploaded_bytes.inc_by(bytes);
    }

    /// Reports the Kubernetes API server's state from now on (read at each scrape).
    pub fn watch_kubernetes(&self, kubernetes: Box<dyn ApiServerState>) {
        let _ = self.kubernetes.set(kubernetes);
    }

    /// The exposition, in the format [`CONTENT_TYPE`] names.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail, and no metric here has an encoder that does.
        if let Err(error) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::warn!("encoding metrics: {error}");
        }
        text
    }
}

/// `scorch_kubernetes_api_up` and `scorch_kubernetes_api_errors_total`, read at scrape time
/// from the pod metadata cache, and only when running in a cluster.
#[derive(Debug)]
struct KubernetesCollector(Arc<OnceLock<Box<dyn ApiServerState>>>);

impl Collector for KubernetesCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let Some(kubernetes) = self.0.get() else {
            return Ok(());
        };
        let up = ConstGauge::new(i64::from(kubernetes.reachable()));
        let metric = encoder.encode_descriptor(
            "kubernetes_api_up",
            "1 when the Kubernetes API server answered the last request for pod metadata; \
             while 0, pods keep the names already known",
            None,
            up.metric_type(),
        )?;
        up.encode(metric)?;
        let errors = ConstCounter::new(kubernetes.api_errors());
        let metric = encoder.encode_descriptor(
            "kubernetes_api_errors",
            "Failed requests and broken watches to the Kubernetes API server",
            None,
            errors.metric_type(),
        )?;
        errors.encode(metric)
    }
}

/// `process_resident_memory_bytes` and `process_cpu_seconds_total`, read at scrape time.
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        // A /proc that cannot be read leaves these two out rather than failing the scrape.
        if let Some(seconds) = own_cpu_seconds() {
            let counter = ConstCounter::new(seconds);
            let metric = encoder.encode_descriptor(
                "process_cpu",
                "Total user and system CPU time spent in seconds",
                Some(&Unit::Seconds),
                counter.metric_type(),
            )?;
            counter.encode(metric)?;
        }
        if let Some(bytes) = own_rss_bytes() {
            let gauge = ConstGauge::new(bytes);
            let metric = encoder.encode_descriptor(
                "process_resident_memory",
                "Resident memory size in bytes",
                Some(&Unit::Bytes),
                gauge.metric_type(),
            )?;
            gauge.encode(metric)?;
        }
        Ok(())
    }
}

fn own_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    cpu_seconds_from_stat(&stat, u64::try_from(ticks_per_second).ok()?)
}

fn own_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    rss_bytes_from_status(&status)
}

/// utime + stime (fields 14 and 15 of `/proc/PID/stat`, in clock ticks) as seconds.
fn cpu_seconds_from_stat(stat: &str, ticks_per_second: u64) -> Option<f64> {
    // The command name (field 2) is in parentheses and may hold spaces and parentheses itself:
    // fields are counted from the last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    if ticks_per_second == 0 {
        return None;
    }
    Some((user + system) as f64 / ticks_per_second as f64)
}

/// `VmRSS:  1234 kB` from `/proc/PID/status`, in bytes.
fn rss_bytes_from_status(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let mut words = line.split_whitespace();
    let kib: u64 = words.next()?.parse().ok()?;
    (words.next() == Some("kB")).then_some(kib * 1024)
}

/// Whether the daemon is doing its job, for `GET /healthz`.
#[derive(Debug)]
pub struct Health {
    window: Duration,
    state: Mutex<HealthState>,
}

#[derive(Debug)]
struct HealthState {
    /// The last drain, or the start: a daemon gets three windows to drain its first.
    last_drain: SystemTime,
    /// Why the last store write failed; `None` once one succeeds.
    store_failure: Option<String>,
}

/// Windows without a drain before sampling counts as stuck: one late window is a slow
/// symbolisation, three is a loop that stopped.
const MISSED_WINDOWS: u32 = 3;

impl Health {
    /// Health of a daemon that drains every `window`, started at `started`.
    pub fn new(window: Duration, started: SystemTime) -> Health {
        Health {
            window,
            state: Mutex::new(HealthState {
                last_drain: started,
                store_failure: None,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, HealthState> {
        // Nothing holding this lock can leave the state half-updated: recover from a panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A window was drained at `at`.
    pub fn sampling_ok_at(&self, at: SystemTime) {
        let mut state = self.state();
        state.last_drain = state.last_drain.max(at);
    }

    /// The last store write succeeded.
    pub fn store_ok(&self) {
        self.state().store_failure = None;
    }

    /// The last store write failed, for `reason`.
    pub fn store_failed(&self, reason: String) {
        self.state().store_failure = Some(reason);
    }

    /// `Ok` when sampling drained a window recently and the store's last write worked; else
    /// every reason why not.
    pub fn check(&self, now: SystemTime) -> Result<(), String> {
        let state = self.state();
        let mut problems = Vec::new();
        let since_drain = now.duration_since(state.last_drain).unwrap_or_default();
        if since_drain > self.window * MISSED_WINDOWS {
            problems.push(format!(
                "sampling: no window drained for {} (window {}, last drain {})",
                humantime::format_duration(Duration::from_secs(since_drain.as_secs())),
                humantime::format_duration(self.window),
                humantime::format_rfc3339_seconds(state.last_drain)
            ));
        }
        if let Some(reason) = &state.store_failure {
            problems.push(format!("store: last write failed: {reason}"));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{labels::kubernetes::Kubernetes, pipeline::drain::Losses};

    /// The value of the sample line `name` (with labels, as written) in an exposition.
    fn value(text: &str, name: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
            .parse()
            .unwrap()
    }

    #[test]
    fn windows_are_counted() {
        let metrics = Metrics::new();
        let mut losses = Losses::default();
        losses.by_kind[Loss::UserStackCollision as usize] = 2;
        losses.by_kind[Loss::CountsMapFull as usize] = 1;
        losses.truncated_stacks = 5;
        metrics.window_drained(100, losses.by_reason(), Duration::from_millis(3));
        metrics.window_drained(50, Losses::default().by_reason(), Duration::from_millis(1));
        metrics.window_symbolized(Duration::from_millis(20));
        metrics.window_written();
        metrics.store_write_failed("disk_full");
        metrics.store_write_failed("disk_full");
        metrics.set_store_bytes(4096);
        metrics.set_windows_buffered(2);
        metrics.window_dropped();

        let text = metrics.encode();
        assert_eq!(value(&text, "scorch_samples_total"), 150.0);
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
    fn remote_deliveries_are_counted() {
        let metrics = Metrics::new();
        metrics.remote_window_sent();
        metrics.remote_sent_bytes(1500);
        metrics.remote_retried();
        metrics.remote_failed("throttled");
        metrics.remote_window_rejected();
        metrics.remote_windows_dropped(3);
        metrics.set_remote_queue(12, 120.5);
        let text = metrics.encode();
        assert_eq!(value(&text, "scorch_remote_windows_sent_total"), 1.0);
        assert_eq!(value(&text, "scorch_remote_sent_bytes_total"), 1500.0);
        assert_eq!(value(&text, "scorch_remote_retries_total"), 1.0);
        assert_eq!(
            value(&text, r#"scorch_remote_failures_total{reason="throttled"}"#),
            1.0
        );
        assert_eq!(
            value(
                &text,
                r#"scorch_remote_failures_total{reason="connection"}"#
            ),
            0.0
        );
        assert_eq!(value(&text, "scorch_remote_windows_rejected_total"), 1.0);
        assert_eq!(value(&text, "scorch_remote_windows_dropped_total"), 3.0);
        assert_eq!(value(&text, "scorch_remote_queue_windows"), 12.0);
        assert_eq!(value(&text, "scorch_remote_queue_age_seconds"), 120.5);
    }

    #[test]
    fn debuginfo_uploads_are_counted_by_result() {
        let metrics = Metrics::new();
        metrics.declare_debuginfo_results(
            crate::export::debuginfo::UploadResult::ALL.map(|r| r.name()),
        );
        metrics.debuginfo_upload("uploaded");
        metrics.debuginfo_upload("uploaded");
        metrics.debuginfo_upload("already_present");
        metrics.debuginfo_uploaded_bytes(4096);
        let text = metrics.encode();
        let uploads = |result: &str| {
            value(
                &text,
                &format!(r#"scorch_debuginfo_uploads_total{{result="{result}"}}"#),
            )
        };
        assert_eq!(uploads("uploaded"), 2.0);
        assert_eq!(uploads("already_present"), 1.0);
        // Results that did not happen are there at zero.
        assert_eq!(uploads("failed"), 0.0);
        assert_eq!(uploads("nothing_to_upload"), 0.0);
        assert_eq!(
            value(&text, "scorch_debuginfo_uploaded_bytes_total"),
            4096.0
        );
    }

    #[test]
    fn kubernetes_metrics_only_in_a_cluster() {
        let metrics = Metrics::new();
        assert!(!metrics.encode().contains("kubernetes"));
        metrics.watch_kubernetes(Box::new(Kubernetes::unstarted_for_tests(false, 3)));
        let text = metrics.encode();
        assert_eq!(value(&text, "scorch_kubernetes_api_up"), 0.0);
        assert_eq!(value(&text, "scorch_kubernetes_api_errors_total"), 3.0);
    }

    #[test]
    fn symbol_cache_totals_become_counters() {
        let metrics = Metrics::new();
        metrics.set_symbol_cache(1000, 10, 2);
        metrics.set_symbol_cache(3000, 25, 3);
        let text = metrics.encode();
        assert_eq!(value(&text, "scorch_symbol_cache_bytes"), 3000.0);
        assert_eq!(value(&text, "scorch_symbol_cache_hits_total"), 25.0);
        assert_eq!(value(&text, "scorch_symbol_cache_misses_total"), 3.0);
        // A cache that starts over does not make the counters go back.
        metrics.set_symbol_cache(0, 4, 1);
        let text = metrics.encode();
        assert_eq!(value(&text, "scorch_symbol_cache_hits_total"), 29.0);
        assert_eq!(value(&text, "scorch_symbol_cache_misses_total"), 4.0);
    }

    #[test]
    fn process_metrics_are_read_at_scrape() {
        let text = Metrics::new().encode();
        assert!(value(&text, "process_resident_memory_bytes") > 1e5);
        assert!(value(&text, "process_cpu_seconds_total") >= 0.0);
        assert!(text.contains("# TYPE process_cpu_seconds counter"));
    }

    #[test]
    fn parses_proc_files() {
        // A command name with a space and a parenthesis must not shift the fields.
        let stat = "1234 (tricky) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 \
                    1 0 100 1000000 500 18446744073709551615";
        assert_eq!(cpu_seconds_from_stat(stat, 100), Some(3.0));
        assert_eq!(cpu_seconds_from_stat("1234 (x) S 1", 100), None);
        assert_eq!(cpu_seconds_from_stat(stat, 0), None);

        let status = "Name:\tscorch\nVmPeak:\t  100 kB\nVmRSS:\t   2048 kB\nThreads:\t3\n";
        assert_eq!(rss_bytes_from_status(status), Some(2048 * 1024));
        assert_eq!(rss_bytes_from_status("Name:\tx\n"), None);
        assert_eq!(rss_bytes_from_status("VmRSS:\tlots\n"), None);
    }

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn health_needs_recent_drains() {
        let health = Health::new(Duration::from_secs(10), at(1000));
        // Starting up: three windows of grace before the first drain.
        assert_eq!(health.check(at(1000)), Ok(()));
        assert_eq!(health.check(at(1030)), Ok(()));
        let error = health.check(at(1031)).unwrap_err();
        assert!(error.contains("no window drained for 31s"), "{error}");

        health.sampling_ok_at(at(1040));
        assert_eq!(health.check(at(1060)), Ok(()));
        // A report from the past does not move the last drain back.
        health.sampling_ok_at(at(1035));
        assert_eq!(health.check(at(1070)), Ok(()));
        assert!(health.check(at(1071)).is_err());
    }

    #[test]
    fn health_follows_the_last_store_write() {
        let health = Health::new(Duration::from_secs(10), at(1000));
        health.store_failed("writing window: database or disk is full".into());
        let error = health.check(at(1001)).unwrap_err();
        assert_eq!(
            error,
            "store: last write failed: writing window: database or disk is full"
        );
        // Both problems at once are both reported.
        let error = health.check(at(2000)).unwrap_err();
        assert!(
            error.contains("sampling") && error.contains("store"),
            "{error}"
        );
        health.store_ok();
        assert_eq!(health.check(at(1001)), Ok(()));
    }
}
