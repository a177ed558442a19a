//! The remote sink's metrics, `scorch_remote_*` and `scorch_debuginfo_*`: what reached the
//! server, what failed and why, what waits in the store, and the debug-info uploads. Registered
//! whether or not a remote is configured, so dashboards see zeros rather than no data.

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    metrics::{counter::Counter, gauge::Gauge},
    registry::Unit,
};

use super::{debuginfo::UploadResult, FailureReason};
use crate::metrics::{LabeledCounter, Registry};

#[derive(Debug)]
pub struct RemoteMetrics {
    windows_sent: Counter,
    sent_bytes: Counter,
    retries: Counter,
    failures: LabeledCounter,
    windows_rejected: Counter,
    windows_dropped: Counter,
    profiles_rejected: Counter,
    queue_windows: Gauge<u64, AtomicU64>,
    queue_age: Gauge<f64, AtomicU64>,
    debuginfo_uploads: LabeledCounter,
    debuginfo_uploaded_bytes: Counter,
}

impl RemoteMetrics {
    pub fn register(registry: &mut Registry) -> RemoteMetrics {
        RemoteMetrics {
            windows_sent: registry.register(
                "remote_windows_sent",
                "Windows the remote server (Pyroscope, Parca or OTLP) accepted",
                Counter::default(),
            ),
            sent_bytes: registry.register_with_unit(
                "remote_sent",
                "Request bytes the remote server accepted (compressed, as sent)",
                Unit::Bytes,
                Counter::default(),
            ),
            retries: registry.register(
                "remote_retries",
                "Requests to the remote server sent again after a retryable failure",
                Counter::default(),
            ),
            failures: registry.register(
                "remote_failures",
                "Failed requests to the remote server, by reason (`rejected`: refused as bad, not \
                 retried)",
                LabeledCounter::new("reason", FailureReason::ALL.map(FailureReason::as_str)),
            ),
            windows_rejected: registry.register(
                "remote_windows_rejected",
                "Windows skipped because the remote server refused them as bad requests",
                Counter::default(),
            ),
            windows_dropped: registry.register(
                "remote_windows_dropped",
                "Windows the store's retention deleted before they could be sent",
                Counter::default(),
            ),
            profiles_rejected: registry.register(
                "remote_profiles_rejected",
                "Profiles an OTLP receiver took the request of but rejected (its partial \
                 success); not sent again",
                Counter::default(),
            ),
            queue_windows: registry.register(
                "remote_queue_windows",
                "Windows in the store waiting to be sent",
                Gauge::default(),
            ),
            queue_age: registry.register_with_unit(
                "remote_queue_age",
                "Age of the oldest window waiting to be sent (0 when none waits)",
                Unit::Seconds,
                Gauge::default(),
            ),
            debuginfo_uploads: registry.register(
                "debuginfo_uploads",
                "Build ids whose debug info the remote Parca server was asked about, by result \
                 (`already_present`: the server had it; `failed`: given up until the next start)",
                LabeledCounter::new("result", UploadResult::ALL.map(UploadResult::as_str)),
            ),
            debuginfo_uploaded_bytes: registry.register_with_unit(
                "debuginfo_uploaded",
                "Debug-info bytes uploaded to the remote Parca server (debug sections only)",
                Unit::Bytes,
                Counter::default(),
            ),
        }
    }

    /// The remote server accepted a whole window.
    pub fn window_sent(&self) {
        self.windows_sent.inc();
    }

    /// The remote server accepted a request of `bytes`.
    pub fn sent_bytes(&self, bytes: u64) {
        self.sent_bytes.inc_by(bytes);
    }

    /// A request to the remote server is about to be sent again.
    pub fn retried(&self) {
        self.retries.inc();
    }

    pub fn failed(&self, reason: FailureReason) {
        self.failures.inc(reason.as_str());
    }

    pub fn window_rejected(&self) {
        self.windows_rejected.inc();
    }

    pub fn windows_dropped(&self, windows: u64) {
        self.windows_dropped.inc_by(windows);
    }

    /// An OTLP receiver rejected `profiles` of a request it otherwise took.
    pub fn profiles_rejected(&self, profiles: u64) {
        self.profiles_rejected.inc_by(profiles);
    }

    /// Windows waiting to be sent, and how old the oldest is.
    pub fn set_queue(&self, windows: u64, oldest_age_seconds: f64) {
        self.queue_windows.set(windows);
        self.queue_age.set(oldest_age_seconds);
    }

    /// One build id's debug-info upload ended.
    pub fn debuginfo_upload(&self, result: UploadResult) {
        self.debuginfo_uploads.inc(result.as_str());
    }

    pub fn debuginfo_uploaded_bytes(&self, bytes: u64) {
        self.debuginfo_uploaded_bytes.inc_by(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::value_in as value;

    #[test]
    fn remote_deliveries_are_counted() {
        let mut registry = Registry::new();
        let metrics = RemoteMetrics::register(&mut registry);
        metrics.window_sent();
        metrics.sent_bytes(1500);
        metrics.retried();
        metrics.failed(FailureReason::Throttled);
        metrics.window_rejected();
        metrics.windows_dropped(3);
        metrics.profiles_rejected(2);
        metrics.set_queue(12, 120.5);
        let text = registry.encode();
        assert_eq!(value(&text, "scorch_remote_windows_sent_total"), 1.0);
        assert_eq!(value(&text, "scorch_remote_sent_bytes_total"), 1500.0);
        assert_eq!(value(&text, "scorch_remote_retries_total"), 1.0);
        // Every reason a failure can have is there from the start.
        for reason in FailureReason::ALL {
            let line = format!(
                r#"scorch_remote_failures_total{{reason="{}"}}"#,
                reason.as_str()
            );
            let expected = if reason == FailureReason::Throttled {
                1.0
            } else {
                0.0
            };
            assert_eq!(value(&text, &line), expected, "{line}");
        }
        assert_eq!(value(&text, "scorch_remote_windows_rejected_total"), 1.0);
        assert_eq!(value(&text, "scorch_remote_windows_dropped_total"), 3.0);
        assert_eq!(value(&text, "scorch_remote_profiles_rejected_total"), 2.0);
        assert_eq!(value(&text, "scorch_remote_queue_windows"), 12.0);
        assert_eq!(value(&text, "scorch_remote_queue_age_seconds"), 120.5);
    }

    #[test]
    fn debuginfo_uploads_are_counted_by_result() {
        let mut registry = Registry::new();
        let metrics = RemoteMetrics::register(&mut registry);
        metrics.debuginfo_upload(UploadResult::Uploaded);
        metrics.debuginfo_upload(UploadResult::Uploaded);
        metrics.debuginfo_upload(UploadResult::AlreadyPresent);
        metrics.debuginfo_uploaded_bytes(4096);
        let text = registry.encode();
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
}
