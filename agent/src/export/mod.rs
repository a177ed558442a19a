//! Remote sinks: the windows `scorch run` writes to the local store, sent to a Pyroscope or
//! Parca server, or an OTLP profiles receiver (an OpenTelemetry Collector), as well.
//!
//! ```text
//! store (the spool) -> window_profile -> split_by_series -> encode (pprof) -> pyroscope | parca
//!                                                        -> otlp::convert -> otlp (gRPC | HTTP)
//! ```
//!
//! The local store is the spool: the sender reads the windows after its cursor, oldest first,
//! and moves the cursor (persisted in the store) only once the server has a window, so a server
//! that is away, or a restart of scorch, loses nothing; windows wait on disk, bounded by the
//! store's retention (a window retention deletes before it was sent is counted as dropped).
//!
//! Delivery policy, the same for every protocol ([`SendError`] classifies each failure):
//! every request has a timeout; connection errors, timeouts, 408, 429, 5xx (and the matching
//! connect and gRPC codes), and authentication refusals (a credential being fixed) are retried
//! with exponential backoff and jitter, waiting at least what `Retry-After` asks; any other
//! refusal means the request itself is bad, so retrying cannot help: it is counted, logged with
//! the server's message, and the window is skipped.
//!
//! The sender runs on its own thread with its own single-threaded runtime, so neither its
//! SQLite reads nor its encoding ever hold up the sampling loop.
//!
//! This file is the surface (configuration, errors, what a failure means); `delivery.rs` the
//! sender, `series.rs` a window split into series and requests, `settings.rs` the URL, TLS and
//! credentials, `metrics.rs` what the sink reports; a module per protocol (`otlp/` a folder:
//! its clients, and `convert.rs`, the pure window-to-OTLP conversion), and `debuginfo.rs`.

pub mod debuginfo;
mod delivery;
mod metrics;
pub mod otlp;
pub mod parca;
pub mod pyroscope;
mod series;
mod settings;

use std::{path::PathBuf, time::Duration};

pub use delivery::{cursor_name, delay_after, parse_retry_after, spawn, SinkHandle};
pub use metrics::RemoteMetrics;
pub use series::{encode_window, label_name, split_by_series, RequestBuilder, Series};
pub use settings::{endpoint, ClientSettings, Credentials, Endpoint, ExtraHeader, Secret};

// For the debug-info upload, which retries its steps as the sender does.
use crate::{store::StoreError, sys::backoff::Backoff};
use delivery::{wait, BACKOFF_BASE, BACKOFF_CAP};

/// Types generated from the remote APIs' protos (see `proto/` for their upstreams).
#[allow(clippy::all, missing_docs, dead_code)]
pub mod proto {
    pub mod types {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/types.v1.rs"));
        }
    }
    pub mod push {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/push.v1.rs"));
        }
    }
    pub mod parca {
        pub mod profilestore {
            pub mod v1alpha1 {
                include!(concat!(env!("OUT_DIR"), "/parca.profilestore.v1alpha1.rs"));
            }
        }
        pub mod debuginfo {
            pub mod v1alpha1 {
                include!(concat!(env!("OUT_DIR"), "/parca.debuginfo.v1alpha1.rs"));
            }
        }
    }
}

/// Which server speaks which API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RemoteProtocol {
    /// Grafana Pyroscope: `push.v1.PusherService/Push`, connect over HTTP.
    #[default]
    Pyroscope,
    /// Parca: `parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw`, gRPC.
    Parca,
    /// OpenTelemetry: `ProfilesService/Export` of OTLP profiles, gRPC (a Collector's 4317).
    Otlp,
    /// OpenTelemetry: `POST /v1development/profiles`, HTTP/protobuf (a Collector's 4318).
    OtlpHttp,
}

impl RemoteProtocol {
    pub fn name(self) -> &'static str {
        match self {
            RemoteProtocol::Pyroscope => "pyroscope",
            RemoteProtocol::Parca => "parca",
            RemoteProtocol::Otlp => "otlp",
            RemoteProtocol::OtlpHttp => "otlp-http",
        }
    }

    /// Whether the protocol is OTLP, which alone takes extra headers and a compression.
    pub fn is_otlp(self) -> bool {
        matches!(self, RemoteProtocol::Otlp | RemoteProtocol::OtlpHttp)
    }
}

/// How the OTLP sink compresses its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RemoteCompression {
    /// gzip, which every OTLP receiver takes (`grpc-encoding` or `Content-Encoding`).
    #[default]
    Gzip,
    None,
}

/// The `remote-*` keys, resolved. Secrets are named by file, read when the sink starts.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteConfig {
    /// The server's base URL; no remote sink when `None`.
    pub url: Option<String>,
    pub protocol: RemoteProtocol,
    /// Plaintext instead of TLS.
    pub insecure: bool,
    pub bearer_token_file: Option<PathBuf>,
    pub basic_auth_user: Option<String>,
    pub basic_auth_password_file: Option<PathBuf>,
    /// `X-Scope-OrgID` of a multi-tenant server.
    pub tenant: Option<String>,
    /// PEM roots to trust instead of the system's.
    pub ca_file: Option<PathBuf>,
    /// How long one request may take, connecting included.
    pub timeout: Duration,
    /// Parca with `--symbolize none`: upload the debug info of the binaries profiled, for the
    /// server to name their frames (see [`debuginfo`]).
    pub upload_debuginfo: bool,
    /// OTLP: headers (gRPC metadata) sent with every request, (name, value).
    pub headers: Vec<(String, String)>,
    /// OTLP: headers whose values are secrets, read from these files when the sink starts.
    pub header_files: Vec<(String, PathBuf)>,
    /// OTLP: how requests are compressed.
    pub compression: RemoteCompression,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        RemoteConfig {
            url: None,
            protocol: RemoteProtocol::Pyroscope,
            insecure: false,
            bearer_token_file: None,
            basic_auth_user: None,
            basic_auth_password_file: None,
            tenant: None,
            ca_file: None,
            timeout: Duration::from_secs(10),
            upload_debuginfo: true,
            headers: Vec::new(),
            header_files: Vec::new(),
            compression: RemoteCompression::Gzip,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("remote-url {url:?}: {message}")]
    Url { url: String, message: String },
    #[error("reading {what} from {path}: {source}")]
    ReadFile {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} file {path} is empty")]
    EmptySecret { what: &'static str, path: PathBuf },
    #[error("{0}")]
    Config(String),
    #[error("setting up the {protocol} client: {message}")]
    Client {
        protocol: &'static str,
        message: String,
    },
    #[error("remote sink: {0}")]
    Store(#[from] StoreError),
    #[error("starting the remote sink's thread: {0}")]
    Thread(std::io::Error),
}

/// Why a request to the remote server failed: the `reason` label of
/// `scorch_remote_failures_total`, and what the logs say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureReason {
    /// Nothing reached the server, or its answer never came back.
    Connection,
    Timeout,
    /// The server asked to slow down.
    Throttled,
    ServerError,
    Unavailable,
    Aborted,
    /// Credentials refused: retried all the same, as a credential may be being fixed.
    Unauthorized,
    /// The request itself is bad: never sent again.
    Rejected,
}

impl FailureReason {
    pub const ALL: [FailureReason; 8] = [
        FailureReason::Connection,
        FailureReason::Timeout,
        FailureReason::Throttled,
        FailureReason::ServerError,
        FailureReason::Unavailable,
        FailureReason::Aborted,
        FailureReason::Unauthorized,
        FailureReason::Rejected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::Connection => "connection",
            FailureReason::Timeout => "timeout",
            FailureReason::Throttled => "throttled",
            FailureReason::ServerError => "server_error",
            FailureReason::Unavailable => "unavailable",
            FailureReason::Aborted => "aborted",
            FailureReason::Unauthorized => "unauthorized",
            FailureReason::Rejected => "rejected",
        }
    }
}

/// Why one attempt to send failed, and whether another can succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// Connection trouble, a timeout, an overloaded or failing server: try again later.
    Retryable {
        reason: FailureReason,
        message: String,
        /// What the server asked for (`Retry-After`), if anything.
        retry_after: Option<Duration>,
    },
    /// The server refused the request itself ([`FailureReason::Rejected`]); sending it again
    /// cannot help.
    Rejected { message: String },
}

impl SendError {
    /// A failure for `reason`: retryable unless the request was refused.
    pub fn new(
        reason: FailureReason,
        message: impl Into<String>,
        retry_after: Option<Duration>,
    ) -> SendError {
        let message = message.into();
        match reason {
            FailureReason::Rejected => SendError::Rejected { message },
            reason => SendError::Retryable {
                reason,
                message,
                retry_after,
            },
        }
    }

    pub fn reason(&self) -> FailureReason {
        match self {
            SendError::Retryable { reason, .. } => *reason,
            SendError::Rejected { .. } => FailureReason::Rejected,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            SendError::Retryable { message, .. } | SendError::Rejected { message } => message,
        }
    }
}

/// What an HTTP status means for delivery (connect and gRPC errors carry a code that is more
/// precise: see `pyroscope` and `parca`).
pub fn classify_http_status(
    status: u16,
    message: String,
    retry_after: Option<Duration>,
) -> Result<(), SendError> {
    let reason = match status {
        200..=299 => return Ok(()),
        408 => FailureReason::Timeout,
        429 => FailureReason::Throttled,
        // A credential being rotated or fixed: the data is fine, keep it until it is.
        401 | 403 => FailureReason::Unauthorized,
        500..=599 => FailureReason::ServerError,
        _ => FailureReason::Rejected,
    };
    Err(SendError::new(reason, message, retry_after))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_statuses_are_classified() {
        assert_eq!(classify_http_status(200, String::new(), None), Ok(()));
        for (status, reason) in [
            (408, FailureReason::Timeout),
            (429, FailureReason::Throttled),
            (500, FailureReason::ServerError),
            (503, FailureReason::ServerError),
            (401, FailureReason::Unauthorized),
        ] {
            match classify_http_status(status, "m".into(), Some(Duration::from_secs(3))) {
                Err(SendError::Retryable {
                    reason: r,
                    retry_after,
                    ..
                }) => {
                    assert_eq!(r, reason, "{status}");
                    assert_eq!(retry_after, Some(Duration::from_secs(3)));
                }
                other => panic!("{status}: {other:?}"),
            }
        }
        for status in [400, 404, 413, 422] {
            assert!(
                matches!(
                    classify_http_status(status, "bad".into(), None),
                    Err(SendError::Rejected { .. })
                ),
                "{status}"
            );
        }
    }
}
