//! The daemon's own health, for `GET /metrics` (Prometheus) and `GET /healthz`.
//!
//! [`Registry`] holds the metric families, but defines none of them: each subsystem defines
//! its own and registers them at startup (the remote sink its deliveries, the window loop of
//! `scorch run` its samples and store writes), so this module names no subsystem and every one
//! of them can report here. The HTTP server encodes the registry on each scrape, reading the
//! process's own RSS and CPU time from `/proc/self` at that moment so they are never stale.
//! [`Health`] turns "is sampling still draining windows, and did the last store write work"
//! into a yes or a reason.
//!
//! Everything here is shared between the sampling loop and the server through an `Arc`, so it
//! is all atomics and short-held locks.

use std::{
    fmt,
    sync::{atomic::AtomicU64, Arc, Mutex, OnceLock, PoisonError},
    time::{Duration, Instant},
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder},
    metrics::{
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::{ConstGauge, Gauge},
        MetricType,
    },
    registry::{Metric, Unit},
};

/// What `scorch_kubernetes_api_*` report, read at each scrape. The pod metadata cache
/// implements it; this module names no subsystem, so that every one of them can report here.
pub trait ApiServerState: fmt::Debug + Send + Sync {
    /// The API server answered the last request.
    fn reachable(&self) -> bool;
    /// Failed requests and broken watches so far.
    fn api_errors(&self) -> u64;
}

/// The content type of [`Registry::encode`]'s output: prometheus-client writes OpenMetrics
/// text (counters suffixed `_total`, a closing `# EOF`), and Prometheus picks its parser from
/// this.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Every metric family of the daemon, and what encodes them.
#[derive(Debug)]
pub struct Registry {
    /// `process_*`, unprefixed: the names every Prometheus client library uses.
    process: prometheus_client::registry::Registry,
    /// The subsystems' families, named `scorch_*`.
    scorch: prometheus_client::registry::Registry,
    /// Set by [`Registry::watch_kubernetes`] when running in a cluster; the
    /// `scorch_kubernetes_api_*` metrics exist only then, so outside Kubernetes no one sees an
    /// API server that looks down.
    kubernetes: Arc<OnceLock<Box<dyn ApiServerState>>>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new()
    }
}

impl Registry {
    pub fn new() -> Registry {
        let mut process = prometheus_client::registry::Registry::default();
        process.register_collector(Box::new(ProcessCollector));
        let kubernetes = Arc::default();
        let mut scorch = prometheus_client::registry::Registry::with_prefix("scorch");
        // Collectors are encoded after every family, so these stay last whatever registers
        // after them.
        scorch.register_collector(Box::new(KubernetesCollector(Arc::clone(&kubernetes))));
        Registry {
            process,
            scorch,
            kubernetes,
        }
    }

    /// Adds `metric` as `scorch_<name>` (a counter's samples get `_total` as well).
    pub fn register<M: Metric + Clone>(&mut self, name: &str, help: &str, metric: M) -> M {
        self.scorch.register(name, help, metric.clone());
        metric
    }

    /// Adds `scorch_footprint_bytes`: this process's resident memory, read at each scrape, plus
    /// `map_memory` (the BPF maps' kernel memory, which no RSS counts and a memory cgroup
    /// charges all the same), so the two are never from different moments' RSS.
    pub fn register_footprint(&mut self, map_memory: Gauge<u64, AtomicU64>) {
        self.scorch
            .register_collector(Box::new(FootprintCollector(map_memory)));
    }

    /// Adds `metric` as `scorch_<name>_<unit>`.
    pub fn register_with_unit<M: Metric + Clone>(
        &mut self,
        name: &str,
        help: &str,
        unit: Unit,
        metric: M,
    ) -> M {
        self.scorch
            .register_with_unit(name, help, unit, metric.clone());
        metric
    }

    /// Reports the Kubernetes API server's state from now on (read at each scrape).
    pub fn watch_kubernetes(&self, kubernetes: Box<dyn ApiServerState>) {
        let _ = self.kubernetes.set(kubernetes);
    }

    /// The exposition, in the format [`CONTENT_TYPE`] names.
    pub fn encode(&self) -> String {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let mut text = String::new();
        // Writing to a String cannot fail, and no metric here has an encoder that does.
        if let Err(error) = encode_registry(&mut text, &self.process)
            .and_then(|()| encode_registry(&mut text, &self.scorch))
            .and_then(|()| encode_eof(&mut text))
        {
            tracing::warn!("encoding metrics: {error}");
        }
        text
    }
}

/// Counters by the value of one label: failures by `reason`, uploads by `result`. The values
/// come from the enum that owns them (its `as_str`), which this module never sees.
#[derive(Debug, Clone)]
pub struct LabeledCounter {
    label: &'static str,
    family: Family<[(&'static str, &'static str); 1], Counter>,
}

impl LabeledCounter {
    /// Counters by `label`, each of `values` there at 0 from the start, so a rate() over it
    /// works before its first event, as Prometheus's instrumentation guidelines ask. A family
    /// with no value yet is left out of the exposition until its first event.
    pub fn new(label: &'static str, values: impl IntoIterator<Item = &'static str>) -> Self {
        let counter = LabeledCounter {
            label,
            family: Family::default(),
        };
        for value in values {
            let _ = counter.family.get_or_create(&[(label, value)]);
        }
        counter
    }

    pub fn inc(&self, value: &'static str) {
        self.inc_by(value, 1);
    }

    pub fn inc_by(&self, value: &'static str, count: u64) {
        self.family
            .get_or_create(&[(self.label, value)])
            .inc_by(count);
    }
}

impl EncodeMetric for LabeledCounter {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), fmt::Error> {
        EncodeMetric::encode(&self.family, encoder)
    }

    fn metric_type(&self) -> MetricType {
        EncodeMetric::metric_type(&self.family)
    }

    fn is_empty(&self) -> bool {
        EncodeMetric::is_empty(&self.family)
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

/// `scorch_footprint_bytes`, read at scrape time: see [`Registry::register_footprint`].
#[derive(Debug)]
struct FootprintCollector(Gauge<u64, AtomicU64>);

impl Collector for FootprintCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let maps = self.0.get();
        // Before the first window has read the maps, or without /proc, there is no whole.
        let (Some(rss), true) = (own_rss_bytes(), maps > 0) else {
            return Ok(());
        };
        let gauge = ConstGauge::new(rss + maps);
        let metric = encoder.encode_descriptor(
            "footprint",
            "The daemon's whole memory: its resident memory plus the kernel memory of its BPF \
             maps, which its RSS does not count and a memory cgroup charges all the same",
            Some(&Unit::Bytes),
            gauge.metric_type(),
        )?;
        gauge.encode(metric)
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

/// This process's resident memory (`VmRSS`), in bytes.
pub fn own_rss_bytes() -> Option<u64> {
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
    /// The last drain, or the start: a daemon gets three windows to drain its first. On the
    /// monotonic clock: a wall clock set forward must not make a healthy daemon look stuck,
    /// nor one set back hide a stuck one.
    last_drain: Instant,
    /// Why the last store write failed; `None` once one succeeds.
    store_failure: Option<String>,
}

/// Windows without a drain before sampling counts as stuck: one late window is a slow
/// symbolisation, three is a loop that stopped.
const MISSED_WINDOWS: u32 = 3;

impl Health {
    /// Health of a daemon that drains every `window`, started at `started`.
    pub fn new(window: Duration, started: Instant) -> Health {
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
    pub fn sampling_ok_at(&self, at: Instant) {
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
    pub fn check(&self, now: Instant) -> Result<(), String> {
        let state = self.state();
        let mut problems = Vec::new();
        let since_drain = now.saturating_duration_since(state.last_drain);
        if since_drain > self.window * MISSED_WINDOWS {
            problems.push(format!(
                "sampling: no window drained for {} (window {})",
                humantime::format_duration(Duration::from_secs(since_drain.as_secs())),
                humantime::format_duration(self.window),
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

/// The value of the sample line `name` (with labels, as written) in an exposition, for the
/// tests of every module that registers metrics.
#[cfg(test)]
pub(crate) fn value_in(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
        .parse()
        .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::kubernetes::Kubernetes;

    #[test]
    fn labeled_counters_start_at_zero_and_stay_hidden_until_used() {
        let mut registry = Registry::new();
        let failures = LabeledCounter::new("reason", ["slow", "broken"]);
        let unknown = LabeledCounter::new("reason", []);
        registry.register("failures", "Failures, by reason", failures.clone());
        registry.register("surprises", "Surprises, by reason", unknown.clone());
        failures.inc("slow");
        failures.inc_by("slow", 2);
        let text = registry.encode();
        assert_eq!(
            value_in(&text, r#"scorch_failures_total{reason="slow"}"#),
            3.0
        );
        assert_eq!(
            value_in(&text, r#"scorch_failures_total{reason="broken"}"#),
            0.0
        );
        assert!(!text.contains("surprises"), "{text}");
        unknown.inc("odd");
        let text = registry.encode();
        assert_eq!(
            value_in(&text, r#"scorch_surprises_total{reason="odd"}"#),
            1.0
        );
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn kubernetes_metrics_only_in_a_cluster() {
        let registry = Registry::new();
        assert!(!registry.encode().contains("kubernetes"));
        registry.watch_kubernetes(Box::new(Kubernetes::unstarted_for_tests(false, 3)));
        let text = registry.encode();
        assert_eq!(value_in(&text, "scorch_kubernetes_api_up"), 0.0);
        assert_eq!(value_in(&text, "scorch_kubernetes_api_errors_total"), 3.0);
    }

    #[test]
    fn process_metrics_are_read_at_scrape() {
        let text = Registry::new().encode();
        assert!(value_in(&text, "process_resident_memory_bytes") > 1e5);
        assert!(value_in(&text, "process_cpu_seconds_total") >= 0.0);
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

    fn at(seconds: u64) -> Instant {
        use std::sync::OnceLock;
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        *ORIGIN.get_or_init(Instant::now) + Duration::from_secs(seconds)
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
