//! The OTLP sink: a window's series as OpenTelemetry profiles (`convert`), sent to a Collector
//! (or Pyroscope, Parca, any OTLP profiles receiver) over gRPC,
//! `opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export` through tonic,
//! or over HTTP, `POST /v1development/profiles` with a protobuf body, through reqwest.
//!
//! Both transports carry the same `ExportProfilesServiceRequest`, gzipped unless
//! `remote-compression = "none"`, with the credentials, tenant and extra headers of the
//! configuration. A receiver that keeps part of a request answers with a `partial_success`
//! counting the profiles it rejected: retrying cannot help (the spec says not to), so the rest
//! counts as delivered and the rejection is logged and counted, as a refused window is.
//!
//! The messages come from opentelemetry-proto v1.11.0 (`proto/opentelemetry/VERSION.md`);
//! profiles are alpha there, and a receiver older than v1.10.0 misreads them.

pub mod convert;

use std::{io::Write as _, time::SystemTime};

use prost::Message as _;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_ENCODING};
use tonic::{
    codec::CompressionEncoding,
    metadata::{Ascii, AsciiMetadataKey, MetadataValue},
    service::{interceptor::InterceptedService, Interceptor},
    transport::Channel,
    Status,
};

use super::{
    classify_http_status, parca, parse_retry_after, pyroscope, ClientSettings, FailureReason,
    RemoteCompression, SendError, SinkError,
};
use crate::profile::Profile;
use convert::ConvertOptions;
use proto::collector::{
    profiles_service_client::ProfilesServiceClient, ExportProfilesServiceRequest,
    ExportProfilesServiceResponse,
};

/// Types generated from opentelemetry-proto v1.11.0, nested as their packages are (the
/// generated code refers to its imports by relative path), with short names for the sink.
#[allow(clippy::all, missing_docs, dead_code)]
pub mod proto {
    pub mod opentelemetry {
        pub mod proto {
            pub mod collector {
                pub mod profiles {
                    pub mod v1development {
                        include!(concat!(
                            env!("OUT_DIR"),
                            "/opentelemetry.proto.collector.profiles.v1development.rs"
                        ));
                    }
                }
            }
            pub mod profiles {
                pub mod v1development {
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/opentelemetry.proto.profiles.v1development.rs"
                    ));
                }
            }
            pub mod common {
                pub mod v1 {
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/opentelemetry.proto.common.v1.rs"
                    ));
                }
            }
            pub mod resource {
                pub mod v1 {
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/opentelemetry.proto.resource.v1.rs"
                    ));
                }
            }
        }
    }
    pub use opentelemetry::proto::collector::profiles::v1development as collector;
    pub use opentelemetry::proto::common::v1 as common;
    pub use opentelemetry::proto::profiles::v1development as profiles;
    pub use opentelemetry::proto::resource::v1 as resource;
}

/// The path of the HTTP transport, after the URL's own (a Collector's `otlp` receiver).
pub const HTTP_PATH: &str = "/v1development/profiles";

/// A request is closed at about this much plain protobuf: half the 4 MiB a Collector's gRPC
/// receiver takes by default, leaving room for the one series that may go over.
const MAX_REQUEST_BYTES: usize = 2 << 20;

/// How much of an error response is kept for the log.
const MAX_ERROR_BODY: usize = 1024;

/// What the receiver said of a request it took: how many profiles it rejected, and why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartialSuccess {
    pub rejected_profiles: u64,
    pub message: String,
}

/// An export ready to send, in the form its transport sends it on every retry.
pub enum Request {
    Grpc(ExportProfilesServiceRequest),
    /// The encoded (and maybe gzipped) body.
    Http(bytes::Bytes),
}

enum Transport {
    Grpc {
        inner: ProfilesServiceClient<InterceptedService<Channel, Metadata>>,
        /// The call's deadline (`grpc-timeout`), so a receiver abandons what the client gave up on.
        timeout: std::time::Duration,
    },
    Http {
        http: reqwest::Client,
        url: reqwest::Url,
        /// Content type and encoding, credentials, tenant and extra headers; secrets marked
        /// sensitive so nothing prints them.
        headers: HeaderMap,
    },
}

pub struct Client {
    transport: Transport,
    /// The host's name for series whose labels lost `node`, and the request size.
    options: ConvertOptions,
    /// HTTP bodies are gzipped when preparing (once, not per retry); gRPC's by tonic.
    gzip: bool,
}

/// Adds the credentials, tenant and extra headers to every gRPC call.
#[derive(Clone)]
pub struct Metadata {
    /// `authorization` and `x-scope-orgid`, as the Parca client sends them.
    credentials: parca::Credentialed,
    /// `remote-headers` and `remote-header-files`, the latter marked sensitive.
    extra: Vec<(AsciiMetadataKey, MetadataValue<Ascii>)>,
}

impl Interceptor for Metadata {
    fn call(&mut self, request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        let mut request = self.credentials.call(request)?;
        for (key, value) in &self.extra {
            request.metadata_mut().insert(key.clone(), value.clone());
        }
        Ok(request)
    }
}

impl Client {
    /// Must run inside a tokio runtime (tonic's channel spawns its worker). `grpc` picks the
    /// transport.
    pub fn new(settings: &ClientSettings, grpc: bool) -> Result<Client, SinkError> {
        let protocol = if grpc { "otlp" } else { "otlp-http" };
        let client_error = |message: String| SinkError::Client { protocol, message };
        let gzip = settings.compression == RemoteCompression::Gzip;
        let transport = if grpc {
            let connection = parca::Connection::new(settings, protocol)?;
            let mut extra = Vec::new();
            for header in &settings.headers {
                let key: AsciiMetadataKey = header.name.parse().map_err(|_| {
                    client_error(format!("{:?} is not a metadata key", header.name))
                })?;
                let mut value: MetadataValue<Ascii> =
                    header.value.expose().parse().map_err(|_| {
                        client_error(format!(
                            "the value of header {:?} is not ASCII",
                            header.name
                        ))
                    })?;
                value.set_sensitive(header.secret);
                extra.push((key, value));
            }
            let mut inner = ProfilesServiceClient::with_interceptor(
                connection.channel,
                Metadata {
                    credentials: connection.credentials,
                    extra,
                },
            )
            .accept_compressed(CompressionEncoding::Gzip);
            if gzip {
                inner = inner.send_compressed(CompressionEncoding::Gzip);
            }
            Transport::Grpc {
                inner,
                timeout: settings.timeout,
            }
        } else {
            let url = reqwest::Url::parse(&format!("{}{HTTP_PATH}", settings.endpoint.base))
                .map_err(|e| client_error(e.to_string()))?;
            let http = settings.http_client(protocol, Some(settings.timeout))?;
            let mut headers = settings.auth_headers(protocol)?;
            headers.insert(
                reqwest::header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-protobuf"),
            );
            if gzip {
                headers.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            }
            for header in &settings.headers {
                let name = HeaderName::from_bytes(header.name.as_bytes())
                    .map_err(|_| client_error(format!("{:?} is not a header name", header.name)))?;
                let mut value = HeaderValue::from_str(header.value.expose()).map_err(|_| {
                    client_error(format!(
                        "the value of header {:?} is not valid",
                        header.name
                    ))
                })?;
                value.set_sensitive(header.secret);
                headers.insert(name, value);
            }
            Transport::Http { http, url, headers }
        };
        Ok(Client {
            transport,
            options: ConvertOptions {
                host_name: crate::sys::fs::hostname(),
                max_bytes: MAX_REQUEST_BYTES,
            },
            gzip,
        })
    }

    /// The requests that carry the window `profile`.
    pub fn prepare(&self, profile: &Profile) -> Vec<Request> {
        convert::window_requests(profile, &self.options)
            .into_iter()
            .map(|message| match self.transport {
                Transport::Grpc { .. } => Request::Grpc(message),
                Transport::Http { .. } => {
                    let plain = message.encode_to_vec();
                    Request::Http(if self.gzip { gzip(&plain) } else { plain }.into())
                }
            })
            .collect()
    }

    /// Sends one export: the bytes of its message, and what the receiver rejected of it.
    pub async fn send(
        &mut self,
        request: &Request,
    ) -> Result<(u64, Option<PartialSuccess>), SendError> {
        let response = match (&mut self.transport, request) {
            (Transport::Grpc { inner, timeout }, Request::Grpc(message)) => {
                let mut call = tonic::Request::new(message.clone());
                call.set_timeout(*timeout);
                match inner.export(call).await {
                    Ok(response) => response.into_inner(),
                    Err(status) => return Err(classify_status(&status)),
                }
            }
            (Transport::Http { http, url, headers }, Request::Http(body)) => {
                send_http(http, url, headers, body).await?
            }
            _ => {
                return Err(SendError::Rejected {
                    message: "a request prepared for the other OTLP transport".into(),
                })
            }
        };
        let bytes = match request {
            Request::Grpc(message) => message.encoded_len() as u64,
            Request::Http(body) => body.len() as u64,
        };
        Ok((bytes, partial_success(&response)))
    }
}

/// One HTTP export: the response message on success, else the failure as delivery sees it.
async fn send_http(
    http: &reqwest::Client,
    url: &reqwest::Url,
    headers: &HeaderMap,
    body: &bytes::Bytes,
) -> Result<ExportProfilesServiceResponse, SendError> {
    let response = http
        .post(url.clone())
        .headers(headers.clone())
        .body(body.clone())
        .send()
        .await
        .map_err(|e| pyroscope::transport_error(&e))?;
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, SystemTime::now()));
    let success = response.status().is_success();
    let body =
        pyroscope::error_body(response, if success { 1 << 20 } else { MAX_ERROR_BODY }).await;
    if success {
        // An empty body is a full success; a body that is not the message is one too (the
        // receiver took the request), only without a partial success to read.
        return Ok(ExportProfilesServiceResponse::decode(&body[..]).unwrap_or_default());
    }
    // OTLP/HTTP errors carry a google.rpc.Status (protobuf), whose message is the part to log.
    let message = match RpcStatus::decode(&body[..]) {
        Ok(rpc) if !rpc.message.is_empty() => format!("HTTP {status}: {}", rpc.message),
        _ => format!("HTTP {status}: {}", String::from_utf8_lossy(&body).trim()),
    };
    Err(
        match classify_http_status(status, message.clone(), retry_after) {
            Err(error) => error,
            // Unreachable: success returned above.
            Ok(()) => SendError::new(FailureReason::ServerError, message, None),
        },
    )
}

/// A gRPC failure as Parca's client classifies it, waiting what the receiver asked for: OTLP
/// receivers (the Collector) ask through a `RetryInfo` in the status details rather than a
/// `retry-after` header.
fn classify_status(status: &Status) -> SendError {
    match parca::classify_status(status) {
        SendError::Retryable {
            reason,
            message,
            retry_after: None,
        } => SendError::Retryable {
            reason,
            message,
            retry_after: retry_info_delay(status.details()),
        },
        other => other,
    }
}

/// The delay of the `google.rpc.RetryInfo` among a status's details, if one is there.
fn retry_info_delay(details: &[u8]) -> Option<std::time::Duration> {
    const RETRY_INFO: &str = "type.googleapis.com/google.rpc.RetryInfo";
    let status = RpcStatus::decode(details).ok()?;
    let info = status
        .details
        .iter()
        .find(|any| any.type_url == RETRY_INFO)?;
    let delay = RetryInfo::decode(&info.value[..]).ok()?.retry_delay?;
    let seconds = u64::try_from(delay.seconds).ok()?;
    let nanos = u32::try_from(delay.nanos).ok()?;
    Some(std::time::Duration::new(seconds, nanos.min(999_999_999)))
}

/// `google.rpc.Status` and `google.rpc.RetryInfo`, as much as the sink reads (field numbers
/// from googleapis google/rpc/status.proto and error_details.proto).
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<RpcAny>,
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcAny {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    retry_delay: Option<ProtoDuration>,
}

/// `google.protobuf.Duration`.
#[derive(Clone, PartialEq, prost::Message)]
struct ProtoDuration {
    #[prost(int64, tag = "1")]
    seconds: i64,
    #[prost(int32, tag = "2")]
    nanos: i32,
}

/// The partial success of a response, when it says something: an empty one means full
/// success, and a warning comes as a message with no rejected profiles.
fn partial_success(response: &ExportProfilesServiceResponse) -> Option<PartialSuccess> {
    let partial = response.partial_success.as_ref()?;
    if partial.rejected_profiles == 0 && partial.error_message.is_empty() {
        return None;
    }
    Some(PartialSuccess {
        rejected_profiles: partial.rejected_profiles.max(0) as u64,
        message: partial.error_message.clone(),
    })
}

fn gzip(plain: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(plain.len() / 4),
        flate2::Compression::fast(),
    );
    // Writing into a Vec cannot fail.
    let _ = encoder.write_all(plain);
    encoder.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::collector::ExportProfilesPartialSuccess;

    #[test]
    fn partial_successes_are_read() {
        let response = |rejected: i64, message: &str| ExportProfilesServiceResponse {
            partial_success: Some(ExportProfilesPartialSuccess {
                rejected_profiles: rejected,
                error_message: message.into(),
            }),
        };
        assert_eq!(
            partial_success(&ExportProfilesServiceResponse::default()),
            None
        );
        assert_eq!(partial_success(&response(0, "")), None);
        assert_eq!(
            partial_success(&response(3, "no service.name")),
            Some(PartialSuccess {
                rejected_profiles: 3,
                message: "no service.name".into()
            })
        );
        // A warning without rejections is still worth a log line.
        assert_eq!(
            partial_success(&response(0, "deprecated field")).map(|p| p.rejected_profiles),
            Some(0)
        );
    }

    #[test]
    fn a_retry_info_sets_the_wait() {
        let details = RpcStatus {
            code: 14,
            message: "later".into(),
            details: vec![
                RpcAny {
                    type_url: "type.googleapis.com/google.rpc.DebugInfo".into(),
                    value: vec![1, 2],
                },
                RpcAny {
                    type_url: "type.googleapis.com/google.rpc.RetryInfo".into(),
                    value: RetryInfo {
                        retry_delay: Some(ProtoDuration {
                            seconds: 3,
                            nanos: 500_000_000,
                        }),
                    }
                    .encode_to_vec(),
                },
            ],
        }
        .encode_to_vec();
        let status = Status::with_details(tonic::Code::Unavailable, "later", details.into());
        match classify_status(&status) {
            SendError::Retryable {
                reason: FailureReason::Unavailable,
                retry_after,
                ..
            } => assert_eq!(retry_after, Some(std::time::Duration::from_millis(3500))),
            other => panic!("{other:?}"),
        }
        assert_eq!(retry_info_delay(b"not a status"), None);
        assert_eq!(retry_info_delay(&[]), None);
        // Refusals stay refusals, whatever the details say.
        let refused = Status::invalid_argument("bad");
        assert_eq!(classify_status(&refused).reason(), FailureReason::Rejected);
    }

    #[test]
    fn the_export_request_has_the_upstream_field_numbers() {
        // ExportProfilesServiceRequest{resource_profiles=1, dictionary=2}.
        let request = ExportProfilesServiceRequest {
            resource_profiles: vec![Default::default()],
            dictionary: Some(Default::default()),
        };
        assert_eq!(request.encode_to_vec(), [0x0a, 0x00, 0x12, 0x00]);
    }
}
