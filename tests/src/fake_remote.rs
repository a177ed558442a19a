//! Fake Pyroscope, Parca and OTLP servers on loopback, for the remote sink's tests.
//!
//! Written from the upstream protos (field numbers below, independently of the agent's
//! generated code, so a wrong field number in scorch shows up here): Pyroscope's
//! `push.v1.PusherService/Push` as connect unary over HTTP/1.1, Parca's
//! `parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw` as gRPC over HTTP/2 (hyper, with
//! the gRPC framing done by hand), and OTLP profiles over gRPC or HTTP (`fake_otlp`, from the
//! pinned upstream protos). Every request is decoded and every profile in it kept.
//!
//! Faults are queued: each request takes the next one (an error status, a 429 with
//! Retry-After, an answer slower than the client's timeout, a connection reset), and
//! [`FakeRemote::down`] / [`FakeRemote::up`] stop and restart listening on the same port.
//!
//! The Parca fake also serves `parca.debuginfo.v1alpha1.DebuginfoService` (faults do not apply
//! to it): it wants every build id it has not been sent, hands out gRPC upload instructions or,
//! after [`FakeRemote::use_signed_urls`], a signed URL on a second, HTTP/1.1 port, keeps what
//! is uploaded by build id and records every call.

use std::{
    collections::{BTreeMap, VecDeque},
    convert::Infallible,
    io::Read as _,
    net::SocketAddr,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context as TaskContext, Poll},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::{body::Incoming, HeaderMap, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;

/// Which API the fake speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Pyroscope,
    Parca,
    /// OTLP profiles over gRPC: `ProfilesService/Export`.
    Otlp,
    /// OTLP profiles over HTTP/1.1: `POST /v1development/profiles`.
    OtlpHttp,
}

/// What the next request gets instead of a plain success.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Pyroscope: this HTTP status (400 comes with a connect `invalid_argument` body).
    /// Parca: the gRPC status code.
    Status(u16),
    /// 429 with `Retry-After: N` (Parca: RESOURCE_EXHAUSTED with `retry-after` metadata).
    RetryAfter(u64),
    /// Answer (successfully) only after this long: slower than the client's timeout. The
    /// profile is kept only if the handler was not dropped meanwhile.
    Slow(Duration),
    /// Close the connection in the middle of the request, with a TCP reset.
    Reset,
    /// OTLP: take the request, answering a partial success that rejects this many profiles.
    Partial(i64),
}

/// One profile the server received (accepted or not).
#[derive(Debug, Clone)]
pub struct Received {
    /// The series' labels.
    pub labels: BTreeMap<String, String>,
    /// Pyroscope's RawSample ID (empty for Parca).
    pub id: String,
    /// The pprof as sent (gzipped or not).
    pub pprof: Vec<u8>,
    /// The profile's `time_nanos`: the window's start.
    pub start_ns: i64,
    /// False when the request was answered with a fault: the server did not keep it.
    pub accepted: bool,
    /// What its request was answered ("ok", "400", "grpc 3", ...).
    pub answer: String,
}

/// One request as it arrived.
#[derive(Debug, Clone)]
pub struct RequestLog {
    pub at: Instant,
    pub headers: HeaderMap,
    /// What it was answered: "ok", or the fault.
    pub answer: String,
}

/// One debug-info upload the fake was asked for.
#[derive(Debug, Clone, Default)]
pub struct UploadedDebuginfo {
    pub upload_id: String,
    /// The size and hash InitiateUpload announced.
    pub size: i64,
    pub hash: String,
    /// What arrived, through the Upload stream or the signed URL.
    pub bytes: Vec<u8>,
    /// "grpc" or "signed_url".
    pub via: String,
    /// MarkUploadFinished came, for this upload id, after all `size` bytes.
    pub finished: bool,
}

/// One DebuginfoService call (or signed-URL PUT): the method and the build id it named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebuginfoCall {
    pub method: String,
    pub build_id: String,
}

#[derive(Default)]
struct State {
    faults: VecDeque<Fault>,
    received: Vec<Received>,
    requests: Vec<RequestLog>,
    /// Problems with requests that a real server would refuse (wrong path, headers, labels).
    protocol_errors: Vec<String>,
    debuginfo: BTreeMap<String, UploadedDebuginfo>,
    debuginfo_calls: Vec<DebuginfoCall>,
    /// `http://127.0.0.1:PORT` of the signed-URL listener, when InitiateUpload hands them out.
    signed_url_base: Option<String>,
}

/// A fake server on `127.0.0.1:PORT`, up or down.
pub struct FakeRemote {
    pub protocol: Protocol,
    pub address: SocketAddr,
    state: Arc<Mutex<State>>,
    runtime: tokio::runtime::Runtime,
    /// Bumped by `down`: every connection and the accept loop of the older generation end.
    generation: tokio::sync::watch::Sender<u64>,
    listening: bool,
}

impl FakeRemote {
    /// A fake on a free port, listening.
    pub fn start(protocol: Protocol) -> Result<FakeRemote> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut fake = FakeRemote::down_on(protocol, port)?;
        fake.up()?;
        Ok(fake)
    }

    /// A fake for `127.0.0.1:PORT` that is not listening yet: "down at start".
    pub fn down_on(protocol: Protocol, port: u16) -> Result<FakeRemote> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        Ok(FakeRemote {
            protocol,
            address: SocketAddr::from(([127, 0, 0, 1], port)),
            state: Arc::default(),
            runtime,
            generation: tokio::sync::watch::channel(0).0,
            listening: false,
        })
    }

    /// A free loopback port nobody listens on (yet).
    pub fn free_port() -> Result<u16> {
        Ok(std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port())
    }

    /// The URL to give scorch.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Starts listening (again) on the same port.
    pub fn up(&mut self) -> Result<()> {
        if self.listening {
            return Ok(());
        }
        let listener = self.runtime.block_on(async {
            // The port was ours a moment ago; give the kernel a few tries to release it.
            let mut tries = 0;
            loop {
                match tokio::net::TcpListener::bind(self.address).await {
                    Ok(listener) => return Ok(listener),
                    Err(err) if tries < 50 => {
                        tries += 1;
                        let _ = err;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(err) => return Err(err),
                }
            }
        })?;
        let generation = *self.generation.borrow();
        let mut stop = self.generation.subscribe();
        let state = self.state.clone();
        let protocol = self.protocol;
        let generations = self.generation.clone();
        self.runtime.spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    _ = stop.wait_for(|&g| g != generation) => return,
                };
                let Ok((stream, _)) = accepted else { continue };
                // Every close is a reset: a server going down mid-request looks like one.
                let _ = stream.set_zero_linger();
                let state = state.clone();
                let mut stop = generations.subscribe();
                tokio::spawn(async move {
                    let (kill, killed) = tokio::sync::mpsc::channel::<()>(1);
                    let service = hyper::service::service_fn(move |request| {
                        handle(protocol, state.clone(), kill.clone(), request)
                    });
                    let io = TokioIo::new(stream);
                    let mut killed = killed;
                    match protocol {
                        Protocol::Pyroscope | Protocol::OtlpHttp => {
                            let connection = hyper::server::conn::http1::Builder::new()
                                .serve_connection(io, service);
                            tokio::select! {
                                _ = connection => {}
                                _ = killed.recv() => {}
                                _ = stop.wait_for(|&g| g != generation) => {}
                            }
                        }
                        Protocol::Parca | Protocol::Otlp => {
                            let connection =
                                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                                    .serve_connection(io, service);
                            tokio::select! {
                                _ = connection => {}
                                _ = killed.recv() => {}
                                _ = stop.wait_for(|&g| g != generation) => {}
                            }
                        }
                    }
                });
            }
        });
        self.listening = true;
        Ok(())
    }

    /// Stops listening and drops every open connection (with resets).
    pub fn down(&mut self) {
        self.generation.send_modify(|g| *g += 1);
        self.listening = false;
        // Let the accept loop and connections see it before the port is rebound.
        std::thread::sleep(Duration::from_millis(100));
    }

    /// Queues faults for the next requests, in order.
    pub fn inject(&self, faults: impl IntoIterator<Item = Fault>) {
        self.lock().faults.extend(faults);
    }

    /// Faults not used yet.
    pub fn faults_left(&self) -> usize {
        self.lock().faults.len()
    }

    pub fn received(&self) -> Vec<Received> {
        self.lock().received.clone()
    }

    pub fn requests(&self) -> Vec<RequestLog> {
        self.lock().requests.clone()
    }

    pub fn protocol_errors(&self) -> Vec<String> {
        self.lock().protocol_errors.clone()
    }

    /// Stops `daemon`, which sent to this server, and checks how the exchange ended: the
    /// daemon exited cleanly (its log in the error if not), and the server found nothing
    /// malformed in what it received.
    pub fn stop_sender(&self, daemon: crate::Daemon) -> Result<()> {
        let (status, _, stderr) = daemon.stop()?;
        anyhow::ensure!(
            status.success(),
            "scorch run exited with {status}:\n{stderr}"
        );
        anyhow::ensure!(
            self.protocol_errors().is_empty(),
            "{:?}",
            self.protocol_errors()
        );
        Ok(())
    }

    /// Debug-info uploads by build id.
    pub fn debuginfo(&self) -> BTreeMap<String, UploadedDebuginfo> {
        self.lock().debuginfo.clone()
    }

    pub fn debuginfo_calls(&self) -> Vec<DebuginfoCall> {
        self.lock().debuginfo_calls.clone()
    }

    /// From now on InitiateUpload answers with a signed URL to PUT to, served on another
    /// loopback port over HTTP/1.1, as an object store would.
    pub fn use_signed_urls(&self) -> Result<()> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let base = format!("http://{}", listener.local_addr()?);
        let state = self.state.clone();
        let _guard = self.runtime.enter();
        let listener = tokio::net::TcpListener::from_std(listener)?;
        self.runtime.spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = state.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        handle_signed_put(state.clone(), request)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        self.lock().signed_url_base = Some(base);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for FakeRemote {
    fn drop(&mut self) {
        self.generation.send_modify(|g| *g += 1);
    }
}

type Body = GrpcBody;

async fn handle(
    protocol: Protocol,
    state: Arc<Mutex<State>>,
    kill: tokio::sync::mpsc::Sender<()>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    if protocol == Protocol::Parca && request.uri().path().starts_with(DEBUGINFO_SERVICE) {
        return Ok(handle_debuginfo(&state, request).await);
    }
    let at = Instant::now();
    let (parts, body) = request.into_parts();
    let fault = lock(&state).faults.pop_front();
    if let Some(Fault::Reset) = fault {
        log(&state, at, &parts.headers, "reset");
        let _ = kill.send(()).await;
        // The connection is being dropped; this answer never leaves.
        std::future::pending::<()>().await;
    }
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Ok(empty(StatusCode::BAD_REQUEST)),
    };
    let mut past_deadline = false;
    if let Some(Fault::Slow(delay)) = fault {
        tokio::time::sleep(delay).await;
        // A gRPC server abandons a call past the client's deadline (its context is
        // cancelled), so the write does not happen.
        past_deadline = grpc_timeout(&parts.headers).is_some_and(|timeout| timeout < delay);
    }
    let decoded = match protocol {
        Protocol::Pyroscope => decode_push(&parts, &body),
        Protocol::Parca => decode_write_raw(&parts, &body),
        Protocol::Otlp => crate::fake_otlp::decode_grpc(&parts, &body),
        Protocol::OtlpHttp => crate::fake_otlp::decode_http(&parts, &body),
    };
    let mut received = match decoded {
        Ok(received) => received,
        Err(err) => {
            lock(&state).protocol_errors.push(format!("{err:#}"));
            log(&state, at, &parts.headers, "malformed");
            return Ok(match protocol {
                Protocol::Pyroscope => connect_error(400, "invalid_argument", &format!("{err:#}")),
                Protocol::Parca | Protocol::Otlp => grpc_status(3, &format!("{err:#}"), None),
                Protocol::OtlpHttp => otlp_http_error(400, &format!("{err:#}"), None),
            });
        }
    };
    let (answer, response) = match (protocol, &fault) {
        (Protocol::Parca | Protocol::Otlp, Some(Fault::Slow(_))) if past_deadline => (
            "deadline exceeded".to_owned(),
            grpc_status(4, "fake: deadline exceeded", None),
        ),
        (_, None | Some(Fault::Slow(_)) | Some(Fault::Reset)) => {
            ("ok".to_owned(), success(protocol, None))
        }
        (_, Some(Fault::Partial(rejected))) => {
            ("partial".to_owned(), success(protocol, Some(*rejected)))
        }
        (Protocol::Otlp, Some(Fault::Status(code))) => (
            format!("grpc {code}"),
            grpc_status(*code, "fake: failing on purpose", None),
        ),
        // As a Collector asks for a wait: UNAVAILABLE with RetryInfo in the status details.
        (Protocol::Otlp, Some(Fault::RetryAfter(seconds))) => ("grpc 14".to_owned(), {
            let mut response = grpc_status(14, "fake: come back later", None);
            let details =
                crate::fake_otlp::retry_info_details(14, "fake: come back later", *seconds);
            if let Ok(value) = details.parse() {
                response
                    .headers_mut()
                    .insert("grpc-status-details-bin", value);
            }
            response
        }),
        (Protocol::OtlpHttp, Some(Fault::Status(status))) => (
            status.to_string(),
            otlp_http_error(*status, "fake: failing on purpose", None),
        ),
        (Protocol::OtlpHttp, Some(Fault::RetryAfter(seconds))) => (
            "503".to_owned(),
            otlp_http_error(503, "fake: come back later", Some(*seconds)),
        ),
        (Protocol::Pyroscope, Some(Fault::Status(400))) => (
            "400".to_owned(),
            connect_error(400, "invalid_argument", "fake: this profile is refused"),
        ),
        (Protocol::Pyroscope, Some(Fault::Status(status))) => (status.to_string(), {
            let mut response =
                empty(StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR));
            *response.body_mut() = GrpcBody::data(Bytes::from_static(b"fake: failing on purpose"));
            response
        }),
        (Protocol::Pyroscope, Some(Fault::RetryAfter(seconds))) => ("429".to_owned(), {
            let mut response = empty(StatusCode::TOO_MANY_REQUESTS);
            response.headers_mut().insert(
                "retry-after",
                seconds
                    .to_string()
                    .parse()
                    .unwrap_or(hyper::header::HeaderValue::from_static("1")),
            );
            response
        }),
        (Protocol::Parca, Some(Fault::Status(code))) => (
            format!("grpc {code}"),
            grpc_status(*code, "fake: failing on purpose", None),
        ),
        (Protocol::Parca, Some(Fault::RetryAfter(seconds))) => (
            "grpc 8".to_owned(),
            grpc_status(8, "fake: slow down", Some(*seconds)),
        ),
    };
    let accepted = answer == "ok" || answer == "partial";
    for r in &mut received {
        r.accepted = accepted;
        r.answer = answer.clone();
    }
    let mut state_guard = lock(&state);
    state_guard.received.extend(received);
    state_guard.requests.push(RequestLog {
        at,
        headers: parts.headers.clone(),
        answer,
    });
    Ok(response)
}

/// The `grpc-timeout` header: a number and a unit (H, M, S, m, u, n).
fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    let (number, unit) = value.split_at(value.len().checked_sub(1)?);
    let number: u64 = number.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(number * 3600),
        "M" => Duration::from_secs(number * 60),
        "S" => Duration::from_secs(number),
        "m" => Duration::from_millis(number),
        "u" => Duration::from_micros(number),
        "n" => Duration::from_nanos(number),
        _ => return None,
    })
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn log(state: &Mutex<State>, at: Instant, headers: &HeaderMap, answer: &str) {
    lock(state).requests.push(RequestLog {
        at,
        headers: headers.clone(),
        answer: answer.to_owned(),
    });
}

fn empty(status: StatusCode) -> Response<Body> {
    let mut response = Response::new(GrpcBody::default());
    *response.status_mut() = status;
    response
}

/// A plain success; OTLP's carries its response message (a partial success when `rejected`).
fn success(protocol: Protocol, rejected: Option<i64>) -> Response<Body> {
    match protocol {
        Protocol::Otlp => grpc_ok(&crate::fake_otlp::response(rejected)),
        Protocol::OtlpHttp => {
            let mut response = empty(StatusCode::OK);
            response.headers_mut().insert(
                "content-type",
                hyper::header::HeaderValue::from_static("application/x-protobuf"),
            );
            *response.body_mut() = GrpcBody::data(Bytes::from(
                crate::fake_otlp::response(rejected).encode_to_vec(),
            ));
            response
        }
        // PushResponse is empty: an empty protobuf body.
        Protocol::Pyroscope => {
            let mut response = empty(StatusCode::OK);
            response.headers_mut().insert(
                "content-type",
                hyper::header::HeaderValue::from_static("application/proto"),
            );
            response
        }
        Protocol::Parca => {
            // One gRPC frame holding the empty WriteRawResponse, then grpc-status 0.
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", hyper::header::HeaderValue::from_static("0"));
            let mut response = Response::new(GrpcBody {
                data: Some(Bytes::from_static(&[0, 0, 0, 0, 0])),
                trailers: Some(trailers),
            });
            response.headers_mut().insert(
                "content-type",
                hyper::header::HeaderValue::from_static("application/grpc"),
            );
            response
        }
    }
}

/// An OTLP/HTTP error: the status, a `google.rpc.Status` body, `Retry-After` when asked.
fn otlp_http_error(status: u16, message: &str, retry_after: Option<u64>) -> Response<Body> {
    let mut response = empty(StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST));
    response.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/x-protobuf"),
    );
    if let Some(seconds) = retry_after {
        if let Ok(value) = seconds.to_string().parse() {
            response.headers_mut().insert("retry-after", value);
        }
    }
    // gRPC's code for the status, as the OTLP spec maps them (only the message is read).
    let code = if status >= 500 { 14 } else { 3 };
    *response.body_mut() = GrpcBody::data(Bytes::from(crate::fake_otlp::http_error_body(
        code, message,
    )));
    response
}

fn connect_error(status: u16, code: &str, message: &str) -> Response<Body> {
    let mut response = empty(StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST));
    response.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/json"),
    );
    let body = format!(r#"{{"code":"{code}","message":"{message}"}}"#);
    *response.body_mut() = GrpcBody::data(Bytes::from(body));
    response
}

/// A trailers-only gRPC error response.
fn grpc_status(code: u16, message: &str, retry_after: Option<u64>) -> Response<Body> {
    let mut response = empty(StatusCode::OK);
    let headers = response.headers_mut();
    headers.insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/grpc"),
    );
    if let Ok(value) = code.to_string().parse() {
        headers.insert("grpc-status", value);
    }
    if let Ok(value) = message.replace(' ', "%20").parse() {
        headers.insert("grpc-message", value);
    }
    if let Some(seconds) = retry_after {
        if let Ok(value) = seconds.to_string().parse() {
            headers.insert("retry-after", value);
        }
    }
    response
}

/// A body of at most one data frame, then optional trailers: all a unary answer needs.
#[derive(Default)]
pub struct GrpcBody {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl GrpcBody {
    fn data(data: Bytes) -> GrpcBody {
        GrpcBody {
            data: Some(data),
            trailers: None,
        }
    }
}

impl hyper::body::Body for GrpcBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(hyper::body::Frame::data(data))));
        }
        if let Some(trailers) = self.trailers.take() {
            return Poll::Ready(Some(Ok(hyper::body::Frame::trailers(trailers))));
        }
        Poll::Ready(None)
    }
}

// The upstream messages, field numbers from grafana/pyroscope api/push/v1/push.proto,
// api/types/v1/types.proto and parca-dev/parca proto/parca/profilestore/v1alpha1/
// profilestore.proto.

#[derive(Clone, PartialEq, Message)]
struct PushRequest {
    #[prost(message, repeated, tag = "1")]
    series: Vec<PushSeries>,
}

#[derive(Clone, PartialEq, Message)]
struct PushSeries {
    #[prost(message, repeated, tag = "1")]
    labels: Vec<LabelPair>,
    #[prost(message, repeated, tag = "2")]
    samples: Vec<PushSample>,
}

#[derive(Clone, PartialEq, Message)]
struct LabelPair {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    value: String,
}

#[derive(Clone, PartialEq, Message)]
struct PushSample {
    #[prost(bytes = "vec", tag = "1")]
    raw_profile: Vec<u8>,
    #[prost(string, tag = "2")]
    id: String,
}

#[derive(Clone, PartialEq, Message)]
struct WriteRawRequest {
    #[prost(string, tag = "1")]
    tenant: String,
    #[prost(message, repeated, tag = "2")]
    series: Vec<ParcaSeries>,
    #[prost(bool, tag = "3")]
    normalized: bool,
}

#[derive(Clone, PartialEq, Message)]
struct ParcaSeries {
    #[prost(message, optional, tag = "1")]
    labels: Option<LabelSet>,
    #[prost(message, repeated, tag = "2")]
    samples: Vec<ParcaSample>,
}

#[derive(Clone, PartialEq, Message)]
struct LabelSet {
    #[prost(message, repeated, tag = "1")]
    labels: Vec<LabelPair>,
}

#[derive(Clone, PartialEq, Message)]
struct ParcaSample {
    #[prost(bytes = "vec", tag = "1")]
    raw_profile: Vec<u8>,
}

pub(crate) fn header<'a>(parts: &'a hyper::http::request::Parts, name: &str) -> &'a str {
    parts
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

fn decode_push(parts: &hyper::http::request::Parts, body: &[u8]) -> Result<Vec<Received>> {
    anyhow::ensure!(
        parts.method == hyper::Method::POST && parts.uri.path() == "/push.v1.PusherService/Push",
        "{} {}: not the push endpoint",
        parts.method,
        parts.uri.path()
    );
    anyhow::ensure!(
        header(parts, "content-type") == "application/proto",
        "content-type {:?}",
        header(parts, "content-type")
    );
    let body = if header(parts, "content-encoding") == "gzip" {
        gunzip(body)?
    } else {
        body.to_vec()
    };
    let push = PushRequest::decode(&body[..]).context("decoding PushRequest")?;
    anyhow::ensure!(!push.series.is_empty(), "a push without series");
    let mut received = Vec::new();
    for series in push.series {
        let labels = label_map(&series.labels)?;
        anyhow::ensure!(
            labels.get("service_name").is_some_and(|s| !s.is_empty()),
            "no service_name in {labels:?}"
        );
        anyhow::ensure!(labels.contains_key("__name__"), "no __name__ in {labels:?}");
        for sample in series.samples {
            anyhow::ensure!(
                sample.id.len() == 36 && sample.id.chars().filter(|&c| c == '-').count() == 4,
                "RawSample ID {:?} is not a UUID",
                sample.id
            );
            received.push(Received {
                start_ns: profile_start(&sample.raw_profile)?,
                labels: labels.clone(),
                id: sample.id,
                pprof: sample.raw_profile,
                accepted: true,
                answer: String::new(),
            });
        }
    }
    Ok(received)
}

fn decode_write_raw(parts: &hyper::http::request::Parts, body: &[u8]) -> Result<Vec<Received>> {
    anyhow::ensure!(
        parts.uri.path() == "/parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw",
        "{}: not WriteRaw",
        parts.uri.path()
    );
    anyhow::ensure!(
        header(parts, "content-type").starts_with("application/grpc"),
        "content-type {:?}",
        header(parts, "content-type")
    );
    // One length-prefixed message: compressed flag, 4-byte big-endian length.
    anyhow::ensure!(body.len() >= 5, "a gRPC body of {} bytes", body.len());
    anyhow::ensure!(body[0] == 0, "a compressed gRPC message");
    let length = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    anyhow::ensure!(
        body.len() == 5 + length,
        "gRPC frame length {length}, body {}",
        body.len()
    );
    let request = WriteRawRequest::decode(&body[5..]).context("decoding WriteRawRequest")?;
    anyhow::ensure!(
        !request.normalized,
        "normalized=true but addresses are as sampled"
    );
    let mut received = Vec::new();
    for series in request.series {
        let labels = label_map(&series.labels.unwrap_or_default().labels)?;
        anyhow::ensure!(labels.contains_key("__name__"), "no __name__ in {labels:?}");
        for sample in series.samples {
            received.push(Received {
                start_ns: profile_start(&sample.raw_profile)?,
                labels: labels.clone(),
                id: String::new(),
                pprof: sample.raw_profile,
                accepted: true,
                answer: String::new(),
            });
        }
    }
    Ok(received)
}

/// Labels as a map, refusing what Prometheus-style servers refuse.
fn label_map(pairs: &[LabelPair]) -> Result<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    for pair in pairs {
        let valid = !pair.name.is_empty()
            && !pair.name.starts_with(|c: char| c.is_ascii_digit())
            && pair
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_');
        anyhow::ensure!(valid, "invalid label name {:?}", pair.name);
        anyhow::ensure!(
            labels
                .insert(pair.name.clone(), pair.value.clone())
                .is_none(),
            "duplicate label {:?}",
            pair.name
        );
    }
    Ok(labels)
}

pub(crate) fn gunzip(bytes: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .context("gunzipping")?;
    Ok(out)
}

/// `time_nanos` of a pprof, gzipped or not (both servers take either).
fn profile_start(raw: &[u8]) -> Result<i64> {
    let plain = if raw.starts_with(&[0x1f, 0x8b]) {
        gunzip(raw)?
    } else {
        raw.to_vec()
    };
    let profile = scorch::pprof::Profile::decode(&plain[..]).context("decoding pprof")?;
    anyhow::ensure!(!profile.sample.is_empty(), "a profile without samples");
    Ok(profile.time_nanos)
}

// Parca's DebuginfoService, field numbers from parca-dev/parca
// proto/parca/debuginfo/v1alpha1/debuginfo.proto.

const DEBUGINFO_SERVICE: &str = "/parca.debuginfo.v1alpha1.DebuginfoService/";

#[derive(Clone, PartialEq, Message)]
struct ShouldInitiateUploadRequest {
    #[prost(string, tag = "1")]
    build_id: String,
    #[prost(string, tag = "2")]
    hash: String,
    #[prost(bool, tag = "3")]
    force: bool,
}

#[derive(Clone, PartialEq, Message)]
struct ShouldInitiateUploadResponse {
    #[prost(bool, tag = "1")]
    should_initiate_upload: bool,
    #[prost(string, tag = "2")]
    reason: String,
}

#[derive(Clone, PartialEq, Message)]
struct InitiateUploadRequest {
    #[prost(string, tag = "1")]
    build_id: String,
    #[prost(int64, tag = "2")]
    size: i64,
    #[prost(string, tag = "3")]
    hash: String,
    #[prost(bool, tag = "4")]
    force: bool,
}

#[derive(Clone, PartialEq, Message)]
struct InitiateUploadResponse {
    #[prost(message, optional, tag = "1")]
    upload_instructions: Option<UploadInstructions>,
}

#[derive(Clone, PartialEq, Message)]
struct UploadInstructions {
    #[prost(string, tag = "1")]
    build_id: String,
    #[prost(string, tag = "2")]
    upload_id: String,
    /// 1 GRPC, 2 SIGNED_URL.
    #[prost(int32, tag = "3")]
    upload_strategy: i32,
    #[prost(string, tag = "4")]
    signed_url: String,
}

#[derive(Clone, PartialEq, Message)]
struct MarkUploadFinishedRequest {
    #[prost(string, tag = "1")]
    build_id: String,
    #[prost(string, tag = "2")]
    upload_id: String,
}

#[derive(Clone, PartialEq, Message)]
struct MarkUploadFinishedResponse {}

/// The `oneof data` as two optional fields: the same bytes on the wire.
#[derive(Clone, PartialEq, Message)]
struct UploadRequest {
    #[prost(message, optional, tag = "1")]
    info: Option<UploadInfo>,
    #[prost(bytes = "vec", optional, tag = "2")]
    chunk_data: Option<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
struct UploadInfo {
    #[prost(string, tag = "1")]
    build_id: String,
    #[prost(string, tag = "2")]
    upload_id: String,
}

#[derive(Clone, PartialEq, Message)]
struct UploadResponse {
    #[prost(string, tag = "1")]
    build_id: String,
    #[prost(uint64, tag = "2")]
    size: u64,
}

/// The length-prefixed messages of a gRPC body.
fn grpc_messages(body: &[u8]) -> Result<Vec<&[u8]>> {
    let mut messages = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        anyhow::ensure!(rest.len() >= 5, "a truncated gRPC frame");
        anyhow::ensure!(rest[0] == 0, "a compressed gRPC message");
        let length = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        anyhow::ensure!(
            rest.len() >= 5 + length,
            "gRPC frame length {length} past the body"
        );
        messages.push(&rest[5..5 + length]);
        rest = &rest[5 + length..];
    }
    Ok(messages)
}

/// A successful unary answer: one frame holding `message`, then grpc-status 0.
fn grpc_ok(message: &impl Message) -> Response<Body> {
    let encoded = message.encode_to_vec();
    let mut frame = Vec::with_capacity(5 + encoded.len());
    frame.push(0);
    frame.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
    frame.extend_from_slice(&encoded);
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", hyper::header::HeaderValue::from_static("0"));
    let mut response = Response::new(GrpcBody {
        data: Some(Bytes::from(frame)),
        trailers: Some(trailers),
    });
    response.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/grpc"),
    );
    response
}

async fn handle_debuginfo(state: &Mutex<State>, request: Request<Incoming>) -> Response<Body> {
    let (parts, body) = request.into_parts();
    let method = parts
        .uri
        .path()
        .trim_start_matches(DEBUGINFO_SERVICE)
        .to_owned();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return empty(StatusCode::BAD_REQUEST),
    };
    match debuginfo_call(state, &method, &body) {
        Ok(response) => response,
        Err(err) => {
            let message = format!("{method}: {err:#}");
            lock(state).protocol_errors.push(message.clone());
            // FAILED_PRECONDITION: not retried by a client.
            grpc_status(9, &message, None)
        }
    }
}

fn debuginfo_call(state: &Mutex<State>, method: &str, body: &[u8]) -> Result<Response<Body>> {
    let messages = grpc_messages(body)?;
    let one = || -> Result<&[u8]> {
        anyhow::ensure!(
            messages.len() == 1,
            "{} messages in a unary call",
            messages.len()
        );
        Ok(messages[0])
    };
    let mut state = lock(state);
    let record = |state: &mut State, build_id: &str| {
        state.debuginfo_calls.push(DebuginfoCall {
            method: method.to_owned(),
            build_id: build_id.to_owned(),
        });
    };
    match method {
        "ShouldInitiateUpload" => {
            let request = ShouldInitiateUploadRequest::decode(one()?)?;
            record(&mut state, &request.build_id);
            check_build_id(&request.build_id)?;
            let finished = state
                .debuginfo
                .get(&request.build_id)
                .is_some_and(|u| u.finished);
            Ok(grpc_ok(&ShouldInitiateUploadResponse {
                should_initiate_upload: !finished,
                reason: if finished {
                    "fake: already uploaded".into()
                } else {
                    "fake: first time seen".into()
                },
            }))
        }
        "InitiateUpload" => {
            let request = InitiateUploadRequest::decode(one()?)?;
            record(&mut state, &request.build_id);
            check_build_id(&request.build_id)?;
            anyhow::ensure!(request.size > 0, "size {}", request.size);
            anyhow::ensure!(
                !state
                    .debuginfo
                    .get(&request.build_id)
                    .is_some_and(|u| u.finished),
                "{} is uploaded already",
                request.build_id
            );
            let upload_id = format!("upload-{}", state.debuginfo_calls.len());
            let (strategy, signed_url) = match &state.signed_url_base {
                Some(base) => (2, format!("{base}/put/{}/{upload_id}", request.build_id)),
                None => (1, String::new()),
            };
            state.debuginfo.insert(
                request.build_id.clone(),
                UploadedDebuginfo {
                    upload_id: upload_id.clone(),
                    size: request.size,
                    hash: request.hash,
                    ..UploadedDebuginfo::default()
                },
            );
            Ok(grpc_ok(&InitiateUploadResponse {
                upload_instructions: Some(UploadInstructions {
                    build_id: request.build_id,
                    upload_id,
                    upload_strategy: strategy,
                    signed_url,
                }),
            }))
        }
        "Upload" => {
            let (first, chunks) = messages
                .split_first()
                .context("an Upload stream without messages")?;
            let info = UploadRequest::decode(*first)?
                .info
                .context("the first Upload message is not UploadInfo")?;
            record(&mut state, &info.build_id);
            let mut bytes = Vec::new();
            for chunk in chunks {
                let chunk = UploadRequest::decode(*chunk)?;
                anyhow::ensure!(chunk.info.is_none(), "UploadInfo after the first message");
                bytes.extend(chunk.chunk_data.context("an Upload message without data")?);
            }
            let upload = state
                .debuginfo
                .get_mut(&info.build_id)
                .context("Upload without InitiateUpload")?;
            anyhow::ensure!(
                upload.upload_id == info.upload_id,
                "upload id {:?}, initiated {:?}",
                info.upload_id,
                upload.upload_id
            );
            let size = bytes.len() as u64;
            upload.bytes = bytes;
            upload.via = "grpc".into();
            Ok(grpc_ok(&UploadResponse {
                build_id: info.build_id,
                size,
            }))
        }
        "MarkUploadFinished" => {
            let request = MarkUploadFinishedRequest::decode(one()?)?;
            record(&mut state, &request.build_id);
            let upload = state
                .debuginfo
                .get_mut(&request.build_id)
                .context("MarkUploadFinished without InitiateUpload")?;
            anyhow::ensure!(
                upload.upload_id == request.upload_id,
                "upload id {:?}, initiated {:?}",
                request.upload_id,
                upload.upload_id
            );
            anyhow::ensure!(
                upload.bytes.len() as i64 == upload.size,
                "{} bytes arrived, {} announced",
                upload.bytes.len(),
                upload.size
            );
            upload.finished = true;
            Ok(grpc_ok(&MarkUploadFinishedResponse {}))
        }
        other => anyhow::bail!("unknown method {other}"),
    }
}

fn check_build_id(id: &str) -> Result<()> {
    anyhow::ensure!(
        id.len() >= 16
            && id
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
        "build id {id:?} is not lowercase hex"
    );
    Ok(())
}

/// `PUT /put/BUILD_ID/UPLOAD_ID` with the file, as to an object store's signed URL.
async fn handle_signed_put(
    state: Arc<Mutex<State>>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Ok(empty(StatusCode::BAD_REQUEST)),
    };
    let result = (|| -> Result<()> {
        anyhow::ensure!(
            parts.method == hyper::Method::PUT,
            "{} not PUT",
            parts.method
        );
        let length: usize = header(&parts, "content-length")
            .parse()
            .context("no Content-Length")?;
        anyhow::ensure!(
            length == body.len(),
            "Content-Length {length}, body {}",
            body.len()
        );
        anyhow::ensure!(
            parts.headers.get("authorization").is_none(),
            "the remote's credentials sent to the object store"
        );
        let mut path = parts.uri.path().split('/').skip(1);
        let (Some("put"), Some(build_id), Some(upload_id), None) =
            (path.next(), path.next(), path.next(), path.next())
        else {
            anyhow::bail!("PUT to {}", parts.uri.path());
        };
        let mut state = lock(&state);
        state.debuginfo_calls.push(DebuginfoCall {
            method: "PUT".into(),
            build_id: build_id.to_owned(),
        });
        let upload = state
            .debuginfo
            .get_mut(build_id)
            .context("PUT without InitiateUpload")?;
        anyhow::ensure!(upload.upload_id == upload_id, "upload id {upload_id:?}");
        upload.bytes = body.to_vec();
        upload.via = "signed_url".into();
        Ok(())
    })();
    Ok(match result {
        Ok(()) => empty(StatusCode::OK),
        Err(err) => {
            lock(&state)
                .protocol_errors
                .push(format!("signed PUT: {err:#}"));
            empty(StatusCode::BAD_REQUEST)
        }
    })
}
