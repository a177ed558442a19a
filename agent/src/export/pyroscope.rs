//! The Pyroscope sink: `push.v1.PusherService/Push` as a connect unary call over HTTP (plain
//! HTTP/1.1 works, no gRPC framing): a protobuf `PushRequest`, gzipped as a whole, one
//! RawProfileSeries per series with one RawSample (a plain pprof) per window.
//!
//! Each RawSample's ID is a UUID derived from the window's start and the series' labels, so a
//! window sent again, after a retry or a restart, carries the same IDs and the server drops the
//! duplicate.

use std::{io::Write as _, time::SystemTime};

use reqwest::header::{HeaderMap, HeaderValue, CONTENT_ENCODING, CONTENT_TYPE};

use super::{
    classify_http_status, label_name, parse_retry_after,
    proto::{
        push::v1::{RawProfileSeries, RawSample},
        types::v1::LabelPair,
    },
    ClientSettings, FailureReason, RequestBuilder, SendError, SinkError,
};
use crate::profile::{Labels, SampleKind};

/// The metric name Pyroscope files scorch's CPU profiles under (its own agents' name for
/// CPU profiles of processes).
pub const PROFILE_NAME: &str = "process_cpu";
/// ... and its off-CPU profiles: the name is the profile type's first part, beside the pprof's
/// own `off_cpu`/`nanoseconds` sample type (`off_cpu:off_cpu:nanoseconds:off_cpu:nanoseconds`
/// in Pyroscope's profile type list).
pub const OFF_CPU_PROFILE_NAME: &str = "off_cpu";

/// The `__name__` of a series of `kind`.
pub fn profile_name(kind: SampleKind) -> &'static str {
    match kind {
        SampleKind::Cpu => PROFILE_NAME,
        SampleKind::OffCpu => OFF_CPU_PROFILE_NAME,
    }
}

/// The service name when a series has neither a `service_name` label nor a comm.
const UNSPECIFIED_SERVICE: &str = "unspecified";

/// Namespace of the RawSample IDs (UUID v5): a fixed, random UUID that is scorch's own.
const SAMPLE_ID_NAMESPACE: uuid::Uuid =
    uuid::Uuid::from_u128(0x6b1e_58a4_2f0c_4d7e_9a33_0c51_e7d2_94f1);

/// How much of an error response is kept for the log.
const MAX_ERROR_BODY: usize = 1024;

/// A push ready to send: the gzipped PushRequest.
pub struct Request {
    body: bytes::Bytes,
}

pub struct Client {
    http: reqwest::Client,
    push_url: reqwest::Url,
    /// Content type and encoding, the connect version, credentials (marked sensitive so
    /// nothing prints them) and tenant.
    headers: HeaderMap,
}

impl Client {
    pub fn new(settings: &ClientSettings) -> Result<Client, SinkError> {
        let client_error = |message: String| SinkError::Client {
            protocol: "pyroscope",
            message,
        };
        let push_url = reqwest::Url::parse(&format!(
            "{}/push.v1.PusherService/Push",
            settings.endpoint.base
        ))
        .map_err(|e| client_error(e.to_string()))?;
        let http = settings.http_client("pyroscope", Some(settings.timeout))?;

        let mut headers = settings.auth_headers("pyroscope")?;
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/proto"));
        headers.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        headers.insert("connect-protocol-version", HeaderValue::from_static("1"));
        // The call's deadline, so the server gives up when the client does.
        headers.insert(
            "connect-timeout-ms",
            HeaderValue::from(settings.timeout.as_millis().min(u128::from(u32::MAX)) as u64),
        );
        Ok(Client {
            http,
            push_url,
            headers,
        })
    }

    /// Sends one push; the bytes of its body.
    pub async fn send(&self, request: &Request) -> Result<u64, SendError> {
        let response = self
            .http
            .post(self.push_url.clone())
            .headers(self.headers.clone())
            .body(request.body.clone())
            .send()
            .await
            .map_err(|e| transport_error(&e))?;
        let status = response.status().as_u16();
        if response.status().is_success() {
            return Ok(request.body.len() as u64);
        }
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        let body = error_body(response, MAX_ERROR_BODY).await;
        let body = &body[..];
        Err(match connect_error(body) {
            Some((code, message)) => SendError::new(
                connect_code_reason(&code),
                format!("{status} {code}: {message}"),
                retry_after,
            ),
            None => {
                let message = format!("HTTP {status}: {}", String::from_utf8_lossy(body).trim());
                match classify_http_status(status, message.clone(), retry_after) {
                    Err(error) => error,
                    // Unreachable: success returned above.
                    Ok(()) => SendError::new(FailureReason::ServerError, message, None),
                }
            }
        })
    }
}

/// A transport failure: nothing reached the server, or its answer never came back.
/// The start of an error response's body, at most `limit` bytes: a server (or anything
/// pretending to be one) may send an endless body, and only its first lines are worth a log.
pub(super) async fn error_body(mut response: reqwest::Response, limit: usize) -> Vec<u8> {
    let mut body = Vec::new();
    while body.len() < limit {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                body.extend_from_slice(&chunk[..chunk.len().min(limit - body.len())])
            }
            Ok(None) | Err(_) => break,
        }
    }
    body
}

pub(super) fn transport_error(error: &reqwest::Error) -> SendError {
    let reason = if error.is_timeout() {
        FailureReason::Timeout
    } else {
        FailureReason::Connection
    };
    // reqwest's Display leaves out the cause (connection refused, reset...), which is the part
    // worth logging.
    let mut message = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    SendError::new(reason, message, None)
}

/// A connect error body: `{"code": "invalid_argument", "message": "..."}`.
fn connect_error(body: &[u8]) -> Option<(String, String)> {
    #[derive(serde::Deserialize)]
    struct ConnectError {
        code: String,
        #[serde(default)]
        message: String,
    }
    let error: ConnectError = serde_json::from_slice(body).ok()?;
    Some((error.code, error.message))
}

/// A connect error code, which arrives as a string: retryable ones as the connect spec lists
/// them, plus the authentication codes (see [`classify_http_status`]).
fn connect_code_reason(code: &str) -> FailureReason {
    match code {
        "unavailable" => FailureReason::Unavailable,
        "resource_exhausted" => FailureReason::Throttled,
        "deadline_exceeded" => FailureReason::Timeout,
        "internal" | "unknown" | "data_loss" => FailureReason::ServerError,
        "aborted" | "canceled" => FailureReason::Aborted,
        "unauthenticated" | "permission_denied" => FailureReason::Unauthorized,
        _ => FailureReason::Rejected,
    }
}

/// Builds a push: each series is written into the gzipped body as it comes, so the plain
/// PushRequest never exists whole. Plain pprofs, gzipped with the request (one compression
/// pass instead of two; the server takes raw profiles gzipped or not).
pub struct PushBuilder {
    start_ns: i64,
    /// What the window's values measure: its series' `__name__`.
    kind: SampleKind,
    body: flate2::write::GzEncoder<Vec<u8>>,
    /// One series' encoding, reused.
    scratch: Vec<u8>,
}

impl PushBuilder {
    /// A push of the window of `kind` that started at `start_ns` (Unix nanoseconds): with the
    /// labels, what names a series' profile across retries and restarts.
    pub fn new(start_ns: i64, kind: SampleKind) -> PushBuilder {
        PushBuilder {
            start_ns,
            kind,
            body: flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()),
            scratch: Vec::new(),
        }
    }
}

impl RequestBuilder for PushBuilder {
    type Request = Request;
    /// 8 MiB of plain protobuf is about 2 MiB on the wire.
    const MAX_BYTES: usize = 8 << 20;

    fn pack(plain: Vec<u8>) -> Vec<u8> {
        plain
    }

    fn add(&mut self, labels: &Labels, pprof: Vec<u8>) {
        let labels = series_labels(labels, self.kind);
        let series = RawProfileSeries {
            samples: vec![RawSample {
                id: sample_id(self.start_ns, &labels).to_string(),
                raw_profile: pprof,
            }],
            labels,
        };
        // PushRequest.series is field 1: a PushRequest is its series, each key-and-length
        // prefixed, one after the other.
        self.scratch.clear();
        prost::encoding::message::encode(1, &series, &mut self.scratch);
        // Writing into a Vec cannot fail.
        let _ = self.body.write_all(&self.scratch);
    }

    fn finish(self) -> Request {
        Request {
            body: self.body.finish().unwrap_or_default().into(),
        }
    }
}

/// A series' labels as Pyroscope wants them: `__name__` (the profile type's), a non-empty
/// `service_name` (the series' own when it has one, else its comm), then the others with
/// valid names, sorted and without duplicates.
pub fn series_labels(labels: &Labels, kind: SampleKind) -> Vec<LabelPair> {
    let service = labels
        .get("service_name")
        .or_else(|| labels.get("comm"))
        .filter(|s| !s.is_empty())
        .map_or(UNSPECIFIED_SERVICE, String::as_str);
    let mut pairs = std::collections::BTreeMap::new();
    pairs.insert("__name__".to_owned(), profile_name(kind).to_owned());
    pairs.insert("service_name".to_owned(), service.to_owned());
    for (name, value) in labels {
        if value.is_empty() {
            continue;
        }
        pairs
            .entry(label_name(name))
            .or_insert_with(|| value.clone());
    }
    pairs
        .into_iter()
        .map(|(name, value)| LabelPair { name, value })
        .collect()
}

/// The RawSample ID: the same window and series always give the same UUID.
pub fn sample_id(start_ns: i64, labels: &[LabelPair]) -> uuid::Uuid {
    let mut name = start_ns.to_string();
    for pair in labels {
        name.push('\n');
        name.push_str(&pair.name);
        name.push('=');
        name.push_str(&pair.value);
    }
    uuid::Uuid::new_v5(&SAMPLE_ID_NAMESPACE, name.as_bytes())
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;
    use crate::export::proto::push::v1::PushRequest;

    use crate::parse::selector::labels;

    fn names(pairs: &[LabelPair]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|p| (p.name.clone(), p.value.clone()))
            .collect()
    }

    #[test]
    fn labels_carry_a_service_name_and_the_profile_name() {
        let pairs = series_labels(
            &labels(&[("comm", "nginx"), ("pid", "12")]),
            SampleKind::Cpu,
        );
        assert_eq!(
            names(&pairs),
            [
                ("__name__".into(), "process_cpu".into()),
                ("comm".into(), "nginx".into()),
                ("pid".into(), "12".into()),
                ("service_name".into(), "nginx".into()),
            ]
        );
        let pairs = series_labels(
            &labels(&[
                ("comm", "java"),
                ("service_name", "checkout"),
                ("k8s.pod", "p-1"),
            ]),
            SampleKind::Cpu,
        );
        let pairs = names(&pairs);
        assert!(pairs.contains(&("service_name".into(), "checkout".into())));
        assert!(pairs.contains(&("k8s_pod".into(), "p-1".into())));
        let pairs = series_labels(&labels(&[("comm", "")]), SampleKind::Cpu);
        assert!(names(&pairs).contains(&("service_name".into(), "unspecified".into())));
        let pairs = series_labels(&labels(&[("comm", "db")]), SampleKind::OffCpu);
        assert_eq!(pairs[0].name, "__name__");
        assert_eq!(pairs[0].value, "off_cpu");
        assert!(names(&pairs).contains(&("service_name".into(), "db".into())));
    }

    #[test]
    fn sample_ids_are_stable_per_window_and_series() {
        let a = series_labels(&labels(&[("comm", "a"), ("pid", "1")]), SampleKind::Cpu);
        let b = series_labels(&labels(&[("comm", "a"), ("pid", "2")]), SampleKind::Cpu);
        assert_eq!(sample_id(10, &a), sample_id(10, &a));
        assert_ne!(sample_id(10, &a), sample_id(10, &b));
        assert_ne!(sample_id(10, &a), sample_id(20, &a));
    }

    #[test]
    fn a_push_holds_one_sample_per_series() {
        let mut builder = PushBuilder::new(5, SampleKind::Cpu);
        for comm in ["b", "c"] {
            builder.add(&labels(&[("comm", comm)]), comm.as_bytes().to_vec());
        }
        let body = builder.finish().body;
        let mut plain = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&body[..]), &mut plain)
            .unwrap();
        // Wire check against the upstream field numbers: series=1; labels=1, samples=2;
        // raw_profile=1, ID=2.
        assert_eq!(plain[0], 0x0a);
        let push = PushRequest::decode(&plain[..]).unwrap();
        assert_eq!(push.series.len(), 2);
        assert_eq!(push.series[0].samples.len(), 1);
        assert_eq!(push.series[0].samples[0].raw_profile, b"b");
        assert_eq!(push.series[1].samples[0].raw_profile, b"c");
        assert_eq!(
            push.series[0].samples[0].id,
            sample_id(5, &push.series[0].labels).to_string()
        );
        assert!(names(&push.series[1].labels).contains(&("comm".into(), "c".into())));
    }

    #[test]
    fn connect_codes_are_classified() {
        for code in [
            "unavailable",
            "resource_exhausted",
            "deadline_exceeded",
            "internal",
            "aborted",
            "unknown",
        ] {
            assert!(
                matches!(
                    SendError::new(connect_code_reason(code), String::new(), None),
                    SendError::Retryable { .. }
                ),
                "{code}"
            );
        }
        let refused = SendError::new(
            connect_code_reason("invalid_argument"),
            "no service_name",
            None,
        );
        assert_eq!(
            refused,
            SendError::Rejected {
                message: "no service_name".into()
            }
        );
    }

    #[test]
    fn connect_errors_are_read() {
        assert_eq!(
            connect_error(br#"{"code":"invalid_argument","message":"no service_name"}"#),
            Some(("invalid_argument".into(), "no service_name".into()))
        );
        assert_eq!(connect_error(b"<html>bad gateway</html>"), None);
    }
}
