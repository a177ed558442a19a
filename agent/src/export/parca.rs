//! The Parca sink: gRPC `parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw` through
//! tonic, TLS by rustls (the system's roots or `remote-ca-file`), plaintext with
//! `remote-insecure`; a bearer token (or basic credentials) and the tenant travel as metadata.
//!
//! WriteRaw has no sample IDs: a window sent again after a restart that interrupted its
//! delivery is stored twice. Retries within one run happen only after a failure the server
//! reported or a connection that broke, so they resend what it did not take.

use std::time::SystemTime;

use tonic::{
    metadata::{Ascii, MetadataValue},
    service::{interceptor::InterceptedService, Interceptor},
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint},
    Code, Status,
};

use super::{
    label_name, parse_retry_after,
    proto::parca::profilestore::v1alpha1::{
        profile_store_service_client::ProfileStoreServiceClient, Label, LabelSet, RawProfileSeries,
        RawSample, WriteRawRequest,
    },
    ClientSettings, FailureReason, RequestBuilder, SendError, SinkError,
};
use crate::profile::{Labels, SampleKind};

/// The metric name Parca's own agent gives CPU profiles.
pub const PROFILE_NAME: &str = "parca_agent_cpu";
/// ... and of off-CPU profiles: Parca names a profile type by `__name__` and the pprof's
/// sample and period types (`parca_agent_off_cpu:off_cpu:nanoseconds:off_cpu:nanoseconds`), so
/// another kind of profile needs its own name or it would be filed under CPU's.
pub const OFF_CPU_PROFILE_NAME: &str = "parca_agent_off_cpu";

/// A WriteRaw ready to send.
pub struct Request {
    message: WriteRawRequest,
}

pub struct Client {
    inner: ProfileStoreServiceClient<InterceptedService<Channel, Credentialed>>,
    connection: Connection,
    /// Sent as the call's deadline (`grpc-timeout`) too: a server abandons a write the client
    /// gave up on, so the retry does not store the window twice.
    timeout: std::time::Duration,
}

/// Adds the credentials and tenant to every call.
#[derive(Clone)]
pub struct Credentialed {
    /// `authorization`, marked sensitive.
    authorization: Option<MetadataValue<Ascii>>,
    tenant: Option<MetadataValue<Ascii>>,
}

impl Interceptor for Credentialed {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(value) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        if let Some(value) = &self.tenant {
            request
                .metadata_mut()
                .insert("x-scope-orgid", value.clone());
        }
        Ok(request)
    }
}

/// The connection to a Parca server and the metadata every call carries: one HTTP/2
/// connection for the profiles and the debug-info upload (`export::debuginfo`).
#[derive(Clone)]
pub struct Connection {
    pub channel: Channel,
    pub credentials: Credentialed,
}

impl Connection {
    /// Connects lazily (the first call connects), so a server that is down at start is only
    /// a failed first send. `protocol` names the client in errors (the OTLP sink's gRPC
    /// transport is built here too).
    pub fn new(settings: &ClientSettings, protocol: &'static str) -> Result<Connection, SinkError> {
        let client_error = |message: String| SinkError::Client { protocol, message };
        let mut endpoint = Endpoint::from_shared(settings.endpoint.base.clone())
            .map_err(|e| client_error(e.to_string()))?
            // No channel-wide timeout: each call sets its own deadline (grpc-timeout, which
            // the channel enforces too), as a debug-info upload needs longer than a WriteRaw.
            .connect_timeout(settings.timeout)
            .user_agent(concat!("scorch/", env!("CARGO_PKG_VERSION")))
            .map_err(|e| client_error(e.to_string()))?;
        if settings.endpoint.tls {
            let tls = match &settings.ca_pem {
                Some(pem) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)),
                None => ClientTlsConfig::new().with_native_roots(),
            };
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| client_error(format!("TLS: {e}")))?;
        }
        let channel = endpoint.connect_lazy();
        let authorization = match settings.credentials.authorization() {
            Some(value) => {
                let mut value: MetadataValue<Ascii> = value.parse().map_err(|_| {
                    client_error("the credentials hold characters metadata cannot carry".into())
                })?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        let tenant = match &settings.tenant {
            Some(tenant) => Some(tenant.parse().map_err(|_| {
                client_error(format!("remote-tenant {tenant:?} is not a metadata value"))
            })?),
            None => None,
        };
        Ok(Connection {
            channel,
            credentials: Credentialed {
                authorization,
                tenant,
            },
        })
    }
}

impl Client {
    pub fn new(settings: &ClientSettings) -> Result<Client, SinkError> {
        let connection = Connection::new(settings, "parca")?;
        Ok(Client {
            inner: ProfileStoreServiceClient::with_interceptor(
                connection.channel.clone(),
                connection.credentials.clone(),
            ),
            connection,
            timeout: settings.timeout,
        })
    }

    /// The connection, for the debug-info uploader to share.
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// Sends one WriteRaw; the bytes of its message.
    pub async fn send(&mut self, request: &Request) -> Result<u64, SendError> {
        let bytes = prost::Message::encoded_len(&request.message) as u64;
        let mut call = tonic::Request::new(request.message.clone());
        call.set_timeout(self.timeout);
        match self.inner.write_raw(call).await {
            Ok(_) => Ok(bytes),
            Err(status) => Err(classify_status(&status)),
        }
    }
}

/// A gRPC status as a delivery failure.
pub fn classify_status(status: &Status) -> SendError {
    let retry_after = status
        .metadata()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, SystemTime::now()));
    let mut message = format!("gRPC {:?}: {}", status.code(), status.message());
    // Transport failures put the cause (connection refused, reset...) in the source.
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    SendError::new(code_reason(status.code()), message, retry_after)
}

/// Retryable codes as the gRPC spec lists them, plus the authentication codes (see
/// [`super::classify_http_status`]); any other means the request is bad.
fn code_reason(code: Code) -> FailureReason {
    match code {
        Code::Unavailable => FailureReason::Unavailable,
        Code::ResourceExhausted => FailureReason::Throttled,
        Code::DeadlineExceeded => FailureReason::Timeout,
        Code::Internal | Code::Unknown | Code::DataLoss => FailureReason::ServerError,
        Code::Aborted | Code::Cancelled => FailureReason::Aborted,
        Code::Unauthenticated | Code::PermissionDenied => FailureReason::Unauthorized,
        Code::Ok
        | Code::InvalidArgument
        | Code::NotFound
        | Code::AlreadyExists
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::Unimplemented => FailureReason::Rejected,
    }
}

/// Builds a WriteRaw, one series at a time.
pub struct WriteRawBuilder {
    /// What the window's values measure: its series' `__name__`.
    kind: SampleKind,
    series: Vec<RawProfileSeries>,
}

impl WriteRawBuilder {
    pub fn new(kind: SampleKind) -> WriteRawBuilder {
        WriteRawBuilder {
            kind,
            series: Vec::new(),
        }
    }
}

impl RequestBuilder for WriteRawBuilder {
    type Request = Request;
    /// Well under the 4 MiB message a gRPC server accepts by default.
    const MAX_BYTES: usize = 2 << 20;

    /// Each profile gzipped: the gRPC message itself is not compressed.
    fn pack(plain: Vec<u8>) -> Vec<u8> {
        crate::profile::encode::pprof::gzip_fast(&plain)
    }

    fn add(&mut self, labels: &Labels, pprof: Vec<u8>) {
        self.series.push(RawProfileSeries {
            labels: Some(LabelSet {
                labels: series_labels(labels, self.kind),
            }),
            samples: vec![RawSample { raw_profile: pprof }],
        });
    }

    fn finish(self) -> Request {
        Request {
            message: WriteRawRequest {
                series: self.series,
                // Addresses are as sampled; Parca normalizes them with the mappings.
                normalized: false,
                ..Default::default()
            },
        }
    }
}

/// `__name__` (the profile type's) and the series' labels with valid names, sorted, without
/// duplicates.
pub fn series_labels(labels: &Labels, kind: SampleKind) -> Vec<Label> {
    let name = match kind {
        SampleKind::Cpu => PROFILE_NAME,
        SampleKind::OffCpu => OFF_CPU_PROFILE_NAME,
    };
    let mut pairs = std::collections::BTreeMap::new();
    pairs.insert("__name__".to_owned(), name.to_owned());
    for (name, value) in labels {
        if !value.is_empty() {
            pairs
                .entry(label_name(name))
                .or_insert_with(|| value.clone());
        }
    }
    pairs
        .into_iter()
        .map(|(name, value)| Label { name, value })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    fn labels_of(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn write_raw_carries_labels_and_profiles() {
        let mut builder = WriteRawBuilder::new(SampleKind::Cpu);
        let labels: Labels = [("comm", "nginx"), ("pid", "3")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        builder.add(&labels, vec![1, 2, 3]);
        let request = builder.finish().message;
        assert!(!request.normalized);
        assert_eq!(request.series[0].samples[0].raw_profile, [1, 2, 3]);
        let labels: Vec<_> = request.series[0]
            .labels
            .as_ref()
            .unwrap()
            .labels
            .iter()
            .map(|l| format!("{}={}", l.name, l.value))
            .collect();
        assert_eq!(labels, ["__name__=parca_agent_cpu", "comm=nginx", "pid=3"]);
        // series=2 on the wire (tenant=1 is left empty).
        let bytes = request.encode_to_vec();
        assert_eq!(bytes[0], 0x12);
        let mut builder = WriteRawBuilder::new(SampleKind::OffCpu);
        builder.add(&labels_of(&[("comm", "nginx")]), vec![1]);
        let request = builder.finish().message;
        assert_eq!(
            request.series[0].labels.as_ref().unwrap().labels[0].value,
            "parca_agent_off_cpu"
        );
    }

    #[test]
    fn statuses_are_classified() {
        assert!(matches!(
            classify_status(&Status::unavailable("down")),
            SendError::Retryable { .. }
        ));
        assert!(matches!(
            classify_status(&Status::resource_exhausted("slow down")),
            SendError::Retryable {
                reason: FailureReason::Throttled,
                ..
            }
        ));
        let refused = classify_status(&Status::invalid_argument("bad pprof"));
        assert_eq!(refused.reason(), FailureReason::Rejected);
        assert!(refused.message().contains("bad pprof"));
    }
}
