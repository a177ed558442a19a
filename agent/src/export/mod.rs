//! Remote sinks: the windows `scorch run` writes to the local store, sent to a Pyroscope or
//! Parca server as well.
//!
//! ```text
//! store (the spool) -> window_profile -> split_by_series -> encode (pprof) -> pyroscope | parca
//! ```
//!
//! The local store is the spool: the sender reads the windows after its cursor, oldest first,
//! and moves the cursor (persisted in the store) only once the server has a window, so a server
//! that is away, or a restart of scorch, loses nothing; windows wait on disk, bounded by the
//! store's retention (a window retention deletes before it was sent is counted as dropped).
//!
//! Delivery policy, the same for both protocols ([`SendError`] classifies each failure):
//! every request has a timeout; connection errors, timeouts, 408, 429, 5xx (and the matching
//! connect and gRPC codes), and authentication refusals (a credential being fixed) are retried
//! with exponential backoff and jitter, waiting at least what `Retry-After` asks; any other
//! refusal means the request itself is bad, so retrying cannot help: it is counted, logged with
//! the server's message, and the window is skipped.
//!
//! The sender runs on its own thread with its own single-threaded runtime, so neither its
//! SQLite reads nor its encoding ever hold up the sampling loop.

pub mod debuginfo;
pub mod parca;
pub mod pyroscope;

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use prost::Message as _;
use tokio::sync::{oneshot, watch};

use crate::{
    metrics::Metrics,
    profile::encode,
    profile::{Labels, Profile, Sample},
    store::{Retention, Store, StoreError, TimeRange},
    sys::{backoff::Backoff, time::unix_ns},
};

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

/// Windows read from the store per query; also how far ahead the queue metrics look.
const BATCH: usize = 64;

/// Freed heap above which the sender hands memory back to the OS after encoding a window.
const RELEASE_ABOVE: usize = 1 << 20;

/// How often an idle sender looks for new windows in the store.
const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// First retry delay; doubled on each further failure of the same request, up to the cap.
const BACKOFF_BASE: Duration = Duration::from_millis(500);
const BACKOFF_CAP: Duration = Duration::from_secs(30);
/// The longest `Retry-After` honoured: a server asking for more is waited on this long.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(300);

/// Which server speaks which API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RemoteProtocol {
    /// Grafana Pyroscope: `push.v1.PusherService/Push`, connect over HTTP.
    #[default]
    Pyroscope,
    /// Parca: `parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw`, gRPC.
    Parca,
}

impl RemoteProtocol {
    pub fn name(self) -> &'static str {
        match self {
            RemoteProtocol::Pyroscope => "pyroscope",
            RemoteProtocol::Parca => "parca",
        }
    }
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

/// Why one attempt to send failed, and whether another can succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// Connection trouble, a timeout, an overloaded or failing server: try again later.
    Retryable {
        /// Short fixed word for the failures metric.
        reason: &'static str,
        message: String,
        /// What the server asked for (`Retry-After`), if anything.
        retry_after: Option<Duration>,
    },
    /// The server refused the request itself; sending it again cannot help.
    Rejected {
        reason: &'static str,
        message: String,
    },
}

impl SendError {
    pub fn reason(&self) -> &'static str {
        match self {
            SendError::Retryable { reason, .. } | SendError::Rejected { reason, .. } => reason,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            SendError::Retryable { message, .. } | SendError::Rejected { message, .. } => message,
        }
    }

    fn retryable(reason: &'static str, message: impl Into<String>) -> SendError {
        SendError::Retryable {
            reason,
            message: message.into(),
            retry_after: None,
        }
    }
}

/// What an HTTP status means for delivery (connect errors carry a code that is more precise:
/// see [`classify_connect_code`]).
pub fn classify_http_status(
    status: u16,
    message: String,
    retry_after: Option<Duration>,
) -> Result<(), SendError> {
    let retry = |reason| {
        Err(SendError::Retryable {
            reason,
            message: message.clone(),
            retry_after,
        })
    };
    match status {
        200..=299 => Ok(()),
        408 => retry("timeout"),
        429 => retry("throttled"),
        // A credential being rotated or fixed: the data is fine, keep it until it is.
        401 | 403 => retry("unauthorized"),
        500..=599 => retry("server_error"),
        _ => Err(SendError::Rejected {
            reason: "rejected",
            message: message.clone(),
        }),
    }
}

/// A connect (or gRPC: the names are the same) error code: retryable ones as the connect and
/// gRPC specs list them, plus the authentication codes (see [`classify_http_status`]).
pub fn classify_connect_code(
    code: &str,
    message: String,
    retry_after: Option<Duration>,
) -> SendError {
    let reason = match code {
        "unavailable" => "unavailable",
        "resource_exhausted" => "throttled",
        "deadline_exceeded" => "timeout",
        "internal" | "unknown" | "data_loss" => "server_error",
        "aborted" | "canceled" => "aborted",
        "unauthenticated" | "permission_denied" => "unauthorized",
        _ => {
            return SendError::Rejected {
                reason: "rejected",
                message,
            }
        }
    };
    SendError::Retryable {
        reason,
        message,
        retry_after,
    }
}

/// `Retry-After`: delta-seconds or an HTTP date, as a wait from `now`.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or_default())
}

/// How long to wait after `error`: what the server asked for when it said (capped), else
/// the next backoff step.
pub fn delay_after(backoff: &mut Backoff, error: &SendError, unit: f64) -> Duration {
    let next = backoff.next_delay_with(unit);
    match error {
        SendError::Retryable {
            retry_after: Some(asked),
            ..
        } => (*asked).min(RETRY_AFTER_CAP),
        _ => next,
    }
}

/// One series of a window: its labels and its samples, borrowed from the window's profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Series<'a> {
    pub labels: Labels,
    pub samples: Vec<&'a Sample>,
}

/// A window's samples grouped by label set. Series come out sorted by labels, so the same
/// window always gives the same requests. Samples of one process share one label set (an
/// `Arc`), so the labels are compared once per process, not once per sample.
pub fn split_by_series(profile: &Profile) -> Vec<Series<'_>> {
    let mut by_labels: BTreeMap<Labels, usize> = BTreeMap::new();
    let mut by_set: HashMap<*const Labels, usize> = HashMap::new();
    let mut groups: Vec<Vec<&Sample>> = Vec::new();
    let mut group_of = |labels: Labels, groups: &mut Vec<Vec<&Sample>>| {
        *by_labels.entry(labels).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        })
    };
    for sample in &profile.samples {
        let group = if sample.labels.is_empty() {
            group_of(sample.series_labels(), &mut groups)
        } else {
            match by_set.get(&Arc::as_ptr(&sample.labels)) {
                Some(&group) => group,
                None => {
                    let group = group_of((*sample.labels).clone(), &mut groups);
                    by_set.insert(Arc::as_ptr(&sample.labels), group);
                    group
                }
            }
        };
        groups[group].push(sample);
    }
    let mut groups: Vec<Option<Vec<&Sample>>> = groups.into_iter().map(Some).collect();
    by_labels
        .into_iter()
        .map(|(labels, group)| Series {
            labels,
            samples: groups[group].take().unwrap_or_default(),
        })
        .collect()
}

/// How a protocol packs series into requests; [`encode_window`] feeds it one series at a time.
pub trait RequestBuilder {
    type Request;
    /// At most this many bytes of packed profiles in one request (a larger series goes alone).
    const MAX_BYTES: usize;
    /// One series' pprof as the request carries it, from its plain encoding (the protocol
    /// gzips each profile, or the request as a whole).
    fn pack(plain: Vec<u8>) -> Vec<u8>;
    fn add(&mut self, labels: &Labels, pprof: Vec<u8>);
    fn finish(self) -> Self::Request;
}

/// A window's requests: its series encoded one at a time and packed into requests of at most
/// `B::MAX_BYTES`, in label order, so the same window always gives the same requests. Only one
/// series' pprof exists unpacked at any time: a window of hundreds of series costs the sender
/// little more memory than its requests.
pub fn encode_window<B: RequestBuilder>(
    profile: &Profile,
    mut builder: impl FnMut() -> B,
) -> Vec<B::Request> {
    let mut requests = Vec::new();
    let mut current: Option<(B, usize)> = None;
    for series in split_by_series(profile) {
        let plain = encode::pprof::samples_message(profile, &series.samples).encode_to_vec();
        let packed = B::pack(plain);
        if let Some((request, bytes)) = current.take() {
            if bytes + packed.len() > B::MAX_BYTES {
                requests.push(request.finish());
            } else {
                current = Some((request, bytes));
            }
        }
        let (request, bytes) = current.get_or_insert_with(|| (builder(), 0));
        *bytes += packed.len();
        request.add(&series.labels, packed);
    }
    if let Some((request, _)) = current {
        requests.push(request.finish());
    }
    requests
}

/// A label name as Prometheus (and so both servers) accept it: `[a-zA-Z_][a-zA-Z0-9_]*`, other
/// characters replaced by `_`.
pub fn label_name(name: &str) -> String {
    let mut out = crate::labels::relabel::sanitize_label_chars(name);
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// A secret read from a file: never printed, in logs, errors or `Debug`.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    /// The file's content without surrounding whitespace (the trailing newline editors add).
    pub fn read(what: &'static str, path: &Path) -> Result<Secret, SinkError> {
        let text = std::fs::read_to_string(path).map_err(|source| SinkError::ReadFile {
            what,
            path: path.to_owned(),
            source,
        })?;
        let text = text.trim();
        if text.is_empty() {
            return Err(SinkError::EmptySecret {
                what,
                path: path.to_owned(),
            });
        }
        Ok(Secret(text.to_owned()))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

/// How the client authenticates.
#[derive(Debug, Clone)]
pub enum Credentials {
    None,
    Bearer(Secret),
    Basic { user: String, password: Secret },
}

impl Credentials {
    /// The `Authorization` value (HTTP header or gRPC metadata), if any: a secret, which
    /// the callers mark sensitive.
    pub fn authorization(&self) -> Option<String> {
        use base64::Engine as _;
        match self {
            Credentials::None => None,
            Credentials::Bearer(token) => Some(format!("Bearer {}", token.expose())),
            Credentials::Basic { user, password } => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD
                    .encode(format!("{user}:{}", password.expose()))
            )),
        }
    }
}

/// The parts of the URL the clients need, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `http` or `https`, from the URL's scheme or else `remote-insecure`.
    pub tls: bool,
    /// `scheme://host:port/path` with no trailing slash and no credentials.
    pub base: String,
}

/// Checks `url` against `insecure`: `http://` or `remote-insecure` is plaintext, `https://` or
/// no scheme (`host:port`, Parca's habit) is TLS unless `remote-insecure`.
pub fn endpoint(url: &str, insecure: bool) -> Result<Endpoint, SinkError> {
    let bad = |message: &str| SinkError::Url {
        url: url.to_owned(),
        message: message.to_owned(),
    };
    let (tls, rest) = if let Some(rest) = url.strip_prefix("https://") {
        if insecure {
            return Err(bad(
                "https:// with remote-insecure: pick one (http:// is plaintext)",
            ));
        }
        (true, rest)
    } else if let Some(rest) = url.strip_prefix("http://") {
        (false, rest)
    } else if url.contains("://") {
        return Err(bad("expected http:// or https://"));
    } else {
        (!insecure, url)
    };
    let rest = rest.trim_end_matches('/');
    let host = rest.split('/').next().unwrap_or("");
    if host.is_empty() {
        return Err(bad("no host"));
    }
    if host.contains('@') {
        return Err(bad(
            "credentials in the URL would show in logs and the process list; use \
             remote-basic-auth-user and remote-basic-auth-password-file",
        ));
    }
    let base = format!("{}://{rest}", if tls { "https" } else { "http" });
    reqwest::Url::parse(&base).map_err(|e| bad(&e.to_string()))?;
    Ok(Endpoint { tls, base })
}

/// Everything a client needs, with the secrets read.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    pub endpoint: Endpoint,
    pub credentials: Credentials,
    pub tenant: Option<String>,
    /// PEM roots replacing the system's, when given.
    pub ca_pem: Option<Vec<u8>>,
    pub timeout: Duration,
}

impl ClientSettings {
    /// An HTTP client with these TLS roots (the system's, or `remote-ca-file`'s alone) and
    /// connect timeout; `timeout` bounds whole requests when given. `protocol` names the
    /// client in errors.
    pub fn http_client(
        &self,
        protocol: &'static str,
        timeout: Option<Duration>,
    ) -> Result<reqwest::Client, SinkError> {
        let client_error = |message: String| SinkError::Client { protocol, message };
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .connect_timeout(self.timeout)
            .user_agent(concat!("scorch/", env!("CARGO_PKG_VERSION")));
        if let Some(timeout) = timeout {
            builder = builder.timeout(timeout);
        }
        if let Some(pem) = &self.ca_pem {
            let roots = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| client_error(format!("reading remote-ca-file: {e}")))?;
            builder = builder.tls_built_in_root_certs(false);
            for root in roots {
                builder = builder.add_root_certificate(root);
            }
        }
        builder.build().map_err(|e| client_error(e.to_string()))
    }

    pub fn new(config: &RemoteConfig) -> Result<ClientSettings, SinkError> {
        let url = config
            .url
            .as_deref()
            .ok_or_else(|| SinkError::Config("remote-url is not set".into()))?;
        let endpoint = endpoint(url, config.insecure)?;
        let credentials = match (
            &config.bearer_token_file,
            &config.basic_auth_user,
            &config.basic_auth_password_file,
        ) {
            (None, None, None) => Credentials::None,
            (Some(token), None, None) => {
                Credentials::Bearer(Secret::read("the bearer token", token)?)
            }
            (None, Some(user), Some(password)) => Credentials::Basic {
                user: user.clone(),
                password: Secret::read("the basic auth password", password)?,
            },
            (None, Some(_), None) | (None, None, Some(_)) => {
                return Err(SinkError::Config(
                    "remote-basic-auth-user and remote-basic-auth-password-file go together".into(),
                ))
            }
            (Some(_), _, _) => {
                return Err(SinkError::Config(
                    "remote-bearer-token-file and remote-basic-auth-* exclude each other".into(),
                ))
            }
        };
        if !endpoint.tls && config.ca_file.is_some() {
            return Err(SinkError::Config(
                "remote-ca-file is for TLS, but the remote is plaintext".into(),
            ));
        }
        let ca_pem = match &config.ca_file {
            Some(path) => Some(std::fs::read(path).map_err(|source| SinkError::ReadFile {
                what: "CA certificates",
                path: path.clone(),
                source,
            })?),
            None => None,
        };
        Ok(ClientSettings {
            endpoint,
            credentials,
            tenant: config.tenant.clone().filter(|t| !t.is_empty()),
            ca_pem,
            timeout: config.timeout,
        })
    }
}

/// A prepared request of either protocol, sent as is on every retry.
enum Request {
    Pyroscope(pyroscope::Request),
    Parca(parca::Request),
}

/// The protocol client.
enum Client {
    Pyroscope(pyroscope::Client),
    Parca(parca::Client),
}

impl Client {
    /// Must run inside a tokio runtime (tonic's channel spawns its worker).
    fn new(protocol: RemoteProtocol, settings: &ClientSettings) -> Result<Client, SinkError> {
        Ok(match protocol {
            RemoteProtocol::Pyroscope => Client::Pyroscope(pyroscope::Client::new(settings)?),
            RemoteProtocol::Parca => Client::Parca(parca::Client::new(settings)?),
        })
    }

    /// The requests that carry the window `profile`.
    fn prepare(&self, profile: &Profile) -> Vec<Request> {
        let start_ns = unix_ns(profile.start);
        match self {
            Client::Pyroscope(_) => {
                encode_window(profile, || pyroscope::PushBuilder::new(start_ns))
                    .into_iter()
                    .map(Request::Pyroscope)
                    .collect()
            }
            Client::Parca(_) => encode_window(profile, parca::WriteRawBuilder::default)
                .into_iter()
                .map(Request::Parca)
                .collect(),
        }
    }

    /// Sends one request; the bytes that went on the wire.
    async fn send(&mut self, request: &Request) -> Result<u64, SendError> {
        match (self, request) {
            (Client::Pyroscope(client), Request::Pyroscope(request)) => client.send(request).await,
            (Client::Parca(client), Request::Parca(request)) => client.send(request).await,
            _ => Err(SendError::Rejected {
                reason: "internal",
                message: "a request prepared for the other protocol".into(),
            }),
        }
    }
}

/// The running sender; [`SinkHandle::stop`] ends it.
pub struct SinkHandle {
    stop: watch::Sender<bool>,
    done: oneshot::Receiver<()>,
    thread: std::thread::JoinHandle<()>,
}

impl SinkHandle {
    /// Asks the sender to finish: it sends what is already in the store if the server takes
    /// it at once (no retries), and stops. Waits at most `budget`; what is left waits in the
    /// store for the next start.
    pub async fn stop(self, budget: Duration) {
        let _ = self.stop.send(true);
        match tokio::time::timeout(budget, self.done).await {
            Ok(_) => {
                let _ = self.thread.join();
            }
            Err(_) => tracing::info!(
                "remote sink: still sending at exit; the rest waits in the store for the next start"
            ),
        }
    }
}

/// The cursor's name in the store: one per server, so pointing scorch at another server
/// starts that one afresh rather than where the last one stopped.
pub fn cursor_name(protocol: RemoteProtocol, endpoint: &Endpoint) -> String {
    format!("remote:{}:{}", protocol.name(), endpoint.base)
}

/// Starts the sender on its own thread, once the store opened and the client was built (so a
/// bad configuration fails `scorch run` at start, not later in a log). With `debug_files`
/// (Parca only), the debug-info uploader runs beside it, on the same connection.
pub fn spawn(
    config: &RemoteConfig,
    store_dir: &Path,
    retention: Retention,
    metrics: Arc<Metrics>,
    debug_files: Option<debuginfo::DebugFileReceiver>,
) -> Result<SinkHandle, SinkError> {
    let settings = ClientSettings::new(config)?;
    let protocol = config.protocol;
    let store = Store::open(store_dir, retention)?;
    let temp_dir = store_dir.to_owned();
    let (stop_tx, stop_rx) = watch::channel(false);
    let (done_tx, done_rx) = oneshot::channel();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("scorch-remote".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(err) => {
                    let _ = ready_tx.send(Err(SinkError::Thread(err)));
                    return;
                }
            };
            runtime.block_on(async move {
                let sender = match Sender::new(protocol, &settings, store, metrics.clone()) {
                    Ok(sender) => sender,
                    Err(err) => {
                        let _ = ready_tx.send(Err(err));
                        return;
                    }
                };
                let uploader = match (debug_files, &sender.client) {
                    (Some(files), Client::Parca(client)) => match debuginfo::Uploader::new(
                        client.connection(),
                        &settings,
                        files,
                        metrics,
                        stop_rx.clone(),
                        temp_dir,
                    ) {
                        Ok(uploader) => Some(uploader),
                        Err(err) => {
                            let _ = ready_tx.send(Err(err));
                            return;
                        }
                    },
                    _ => None,
                };
                let _ = ready_tx.send(Ok(()));
                // One task: the uploader's calls and the sender's share the thread, and an
                // upload's extraction runs on the blocking pool.
                tokio::join!(sender.run(stop_rx), async {
                    if let Some(uploader) = uploader {
                        uploader.run().await;
                    }
                });
            });
            let _ = done_tx.send(());
        })
        .map_err(SinkError::Thread)?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(SinkHandle {
            stop: stop_tx,
            done: done_rx,
            thread,
        }),
        Ok(Err(err)) => Err(err),
        Err(_) => Err(SinkError::Thread(std::io::Error::other(
            "the remote sink's thread ended while starting",
        ))),
    }
}

/// How one window's delivery ended.
enum Outcome {
    /// The server has it (or it was refused as bad, or retention deleted it): move on.
    Done,
    /// Stopping: leave it for the next start.
    Stopped,
}

/// The delivery loop and what it keeps between windows.
pub struct Sender {
    client: Client,
    store: Store,
    metrics: Arc<Metrics>,
    cursor_name: String,
    /// The last window delivered (or given up on).
    cursor: i64,
    endpoint: String,
    /// When the server started failing, so the log says so once and says when it is back.
    failing_since: Option<SystemTime>,
}

impl Sender {
    fn new(
        protocol: RemoteProtocol,
        settings: &ClientSettings,
        store: Store,
        metrics: Arc<Metrics>,
    ) -> Result<Sender, SinkError> {
        let client = Client::new(protocol, settings)?;
        let cursor_name = cursor_name(protocol, &settings.endpoint);
        let cursor = start_cursor(&store, &cursor_name)?;
        tracing::info!(
            "sending profiles to {} ({}), from window {}",
            settings.endpoint.base,
            protocol.name(),
            cursor + 1
        );
        Ok(Sender {
            client,
            store,
            metrics,
            cursor_name,
            cursor,
            endpoint: settings.endpoint.base.clone(),
            failing_since: None,
        })
    }

    async fn run(mut self, mut stop: watch::Receiver<bool>) {
        loop {
            let stopping = *stop.borrow();
            let pending = match self.store.windows_after(self.cursor, usize::MAX >> 1) {
                Ok(pending) => pending,
                Err(err) => {
                    tracing::warn!("remote sink: reading the store: {err}");
                    if stopping || !wait(POLL_INTERVAL, &mut stop).await {
                        return;
                    }
                    continue;
                }
            };
            self.report_queue(&pending);
            if pending.is_empty() {
                if stopping || !wait(POLL_INTERVAL, &mut stop).await {
                    return;
                }
                continue;
            }
            for (done, &(id, range)) in pending.iter().take(BATCH).enumerate() {
                // Window ids only grow by one per window written: a gap is windows retention
                // deleted before they could be sent.
                let skipped = id.saturating_sub(self.cursor).saturating_sub(1);
                if skipped > 0 {
                    self.metrics.remote_windows_dropped(skipped as u64);
                    tracing::warn!(
                        "remote sink: {skipped} windows were deleted by retention before they \
                         could be sent"
                    );
                }
                match self.deliver(id, range, &mut stop).await {
                    Outcome::Done => {
                        self.report_queue(&pending[done + 1..]);
                        self.cursor = id;
                        if let Err(err) = self.store.set_cursor(&self.cursor_name, id) {
                            // The window is delivered; at worst it is sent again after a
                            // restart.
                            tracing::warn!("remote sink: saving the cursor: {err}");
                        }
                    }
                    Outcome::Stopped => return,
                }
            }
        }
    }

    fn report_queue(&self, pending: &[(i64, TimeRange)]) {
        let age = pending
            .first()
            .and_then(|(_, range)| SystemTime::now().duration_since(range.to).ok())
            .unwrap_or_default();
        self.metrics
            .set_remote_queue(pending.len() as u64, age.as_secs_f64());
    }

    async fn deliver(
        &mut self,
        id: i64,
        range: TimeRange,
        stop: &mut watch::Receiver<bool>,
    ) -> Outcome {
        let mut backoff = Backoff::new(BACKOFF_BASE, BACKOFF_CAP);
        let profile = loop {
            match self.store.window_profile(id) {
                Ok(Some(profile)) => break profile,
                Ok(None) => {
                    self.metrics.remote_windows_dropped(1);
                    return Outcome::Done;
                }
                Err(err) => {
                    tracing::warn!("remote sink: reading window {id}: {err}");
                    if *stop.borrow() || !wait(backoff.next_delay(), stop).await {
                        return Outcome::Stopped;
                    }
                }
            }
        };
        let requests = self.client.prepare(&profile);
        drop(profile);
        // Encoding a window's hundreds of series leaves the sender's arena holding several
        // times the requests' size in freed memory; a sender waiting out a server that is away
        // should not keep it.
        crate::sys::allocator::release_free_memory_above(RELEASE_ABOVE);
        for (index, request) in requests.iter().enumerate() {
            loop {
                match self.client.send(request).await {
                    Ok(bytes) => {
                        self.metrics.remote_sent_bytes(bytes);
                        if let Some(since) = self.failing_since.take() {
                            tracing::info!(
                                "remote sink: {} accepts profiles again (failing for {:.0?})",
                                self.endpoint,
                                since.elapsed().unwrap_or_default()
                            );
                        }
                        break;
                    }
                    Err(error @ SendError::Rejected { .. }) => {
                        self.metrics.remote_failed(error.reason());
                        self.metrics.remote_window_rejected();
                        tracing::warn!(
                            "remote sink: {} refused window {id} ({}, request {} of {}): {}; \
                             skipping it",
                            self.endpoint,
                            humantime::format_rfc3339_seconds(range.from),
                            index + 1,
                            requests.len(),
                            error.message()
                        );
                        return Outcome::Done;
                    }
                    Err(error) => {
                        self.metrics.remote_failed(error.reason());
                        if self.failing_since.is_none() {
                            self.failing_since = Some(SystemTime::now());
                            tracing::warn!(
                                "remote sink: sending to {} failed ({}: {}); retrying, windows \
                                 wait in the store meanwhile",
                                self.endpoint,
                                error.reason(),
                                error.message()
                            );
                        } else {
                            tracing::debug!("remote sink: {}: {}", error.reason(), error.message());
                        }
                        // Stopping: no retries, the window waits in the store.
                        if *stop.borrow() {
                            return Outcome::Stopped;
                        }
                        let delay = delay_after(&mut backoff, &error, fastrand::f64());
                        self.metrics.remote_retried();
                        // The queue grows while the server is away: keep its gauges current.
                        if let Ok(pending) = self.store.windows_after(self.cursor, usize::MAX >> 1)
                        {
                            self.report_queue(&pending);
                        }
                        if !wait(delay, stop).await {
                            return Outcome::Stopped;
                        }
                    }
                }
            }
        }
        self.metrics.remote_window_sent();
        // A window's profile, series and requests are megabytes freed at once; glibc would
        // keep those pages in this thread's arena for the daemon's whole life.
        drop(requests);
        crate::sys::allocator::release_free_memory();
        Outcome::Done
    }
}

/// Waits `delay`; false when a stop was asked meanwhile.
async fn wait(delay: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    let slept = tokio::select! {
        _ = tokio::time::sleep(delay) => true,
        _ = stop.wait_for(|&s| s) => false,
    };
    slept && !*stop.borrow()
}

/// Where delivery starts. A sink seen before goes on from its cursor, so a restart sends the
/// backlog; a sink new to this store starts after the windows already there, rather than
/// pushing days of history at a server that never asked for it.
fn start_cursor(store: &Store, name: &str) -> Result<i64, StoreError> {
    let started = format!("{name}#started");
    if store.cursor(&started)? != 0 {
        return store.cursor(name);
    }
    let mut newest = store.cursor(name)?;
    loop {
        let page = store.windows_after(newest, 10_000)?;
        match page.last() {
            Some(&(id, _)) => newest = id,
            None => break,
        }
    }
    store.set_cursor(name, newest)?;
    store.set_cursor(&started, 1)?;
    Ok(newest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{sample_profile, Line, Location, Mapping};

    #[test]
    fn http_statuses_are_classified() {
        assert_eq!(classify_http_status(200, String::new(), None), Ok(()));
        for (status, reason) in [
            (408, "timeout"),
            (429, "throttled"),
            (500, "server_error"),
            (503, "server_error"),
            (401, "unauthorized"),
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
                    classify_connect_code(code, String::new(), None),
                    SendError::Retryable { .. }
                ),
                "{code}"
            );
        }
        let refused = classify_connect_code("invalid_argument", "no service_name".into(), None);
        assert_eq!(
            refused,
            SendError::Rejected {
                reason: "rejected",
                message: "no service_name".into()
            }
        );
    }

    #[test]
    fn retry_after_takes_seconds_and_dates() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
        // RFC 9110's example date is 784111777.
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:47 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
    }

    #[test]
    fn retry_after_wins_capped() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        // A server's Retry-After wins, capped.
        let asked = SendError::Retryable {
            reason: "throttled",
            message: String::new(),
            retry_after: Some(Duration::from_secs(4)),
        };
        assert_eq!(
            delay_after(&mut backoff, &asked, 0.0),
            Duration::from_secs(4)
        );
        let greedy = SendError::Retryable {
            reason: "throttled",
            message: String::new(),
            retry_after: Some(Duration::from_secs(86400)),
        };
        assert_eq!(delay_after(&mut backoff, &greedy, 0.0), RETRY_AFTER_CAP);
    }

    /// Two processes sharing the kernel mapping, each with its own binary.
    fn two_process_profile() -> Profile {
        let mut profile = sample_profile();
        profile.mappings.push(Mapping {
            start: 0x1000,
            limit: 0x2000,
            file_offset: 0,
            path: "/usr/bin/other".into(),
            build_id: None,
            has_functions: true,
            has_filenames: false,
            has_line_numbers: false,
            has_inline_frames: false,
        });
        profile.locations.push(Location {
            mapping: Some(2),
            address: 0x1100,
            lines: vec![Line::named("other_main")],
            kernel: false,
        });
        profile.samples.push(Sample {
            pid: 7,
            comm: "other".into(),
            labels: Arc::new(Labels::from([
                ("service_name".into(), "db".into()),
                ("comm".into(), "other".into()),
                ("pid".into(), "7".into()),
            ])),
            locations: vec![0, 4],
            count: 5,
        });
        profile
    }

    #[test]
    fn windows_split_into_series_with_only_their_frames() {
        let profile = two_process_profile();
        let series = split_by_series(&profile);
        assert_eq!(series.len(), 2);
        let work = series
            .iter()
            .find(|s| s.labels.get("comm").map(String::as_str) == Some("work"))
            .unwrap();
        assert_eq!(work.labels.get("pid").map(String::as_str), Some("42"));
        assert_eq!(work.samples.len(), 2);
        assert_eq!(work.samples.iter().map(|s| s.count).sum::<u64>(), 4);
        let message = encode::pprof::samples_message(&profile, &work.samples);
        let text = |i: i64| message.string_table[i as usize].as_str();
        // Its binary first (the main binary), then the kernel; not the other process's.
        let paths: Vec<_> = message.mapping.iter().map(|m| text(m.filename)).collect();
        assert_eq!(paths, ["/usr/bin/work", "[kernel.kallsyms]"]);
        assert_eq!(message.location.len(), 4);

        let other = series
            .iter()
            .find(|s| s.labels.get("comm").map(String::as_str) == Some("other"))
            .unwrap();
        assert_eq!(
            other.labels.get("service_name").map(String::as_str),
            Some("db")
        );
        let message = encode::pprof::samples_message(&profile, &other.samples);
        let text = |i: i64| message.string_table[i as usize].as_str();
        let paths: Vec<_> = message.mapping.iter().map(|m| text(m.filename)).collect();
        assert_eq!(paths, ["/usr/bin/other", "[kernel.kallsyms]"]);
        // The sample's frames name the same functions as before the split, and each
        // location sits in the right mapping.
        assert_eq!(message.sample.len(), 1);
        let frames: Vec<(&str, &str)> = message.sample[0]
            .location_id
            .iter()
            .map(|&id| {
                let location = &message.location[id as usize - 1];
                assert_eq!(location.id, id);
                let function = &message.function[location.line[0].function_id as usize - 1];
                let mapping = &message.mapping[location.mapping_id as usize - 1];
                (text(function.name), text(mapping.filename))
            })
            .collect();
        assert_eq!(
            frames,
            [
                ("vfs_read", "[kernel.kallsyms]"),
                ("other_main", "/usr/bin/other")
            ]
        );
        // The series' labels travel as pprof labels, pid as a number.
        let labels: Vec<(&str, &str, i64)> = message.sample[0]
            .label
            .iter()
            .map(|l| (text(l.key), text(l.str), l.num))
            .collect();
        assert_eq!(
            labels,
            [
                ("pid", "", 7),
                ("comm", "other", 0),
                ("service_name", "db", 0)
            ]
        );
    }

    /// Records what [`encode_window`] gives it; packed size = plain size.
    struct Recorder(Vec<String>);

    impl RequestBuilder for Recorder {
        type Request = Vec<String>;
        const MAX_BYTES: usize = 700;
        fn pack(plain: Vec<u8>) -> Vec<u8> {
            plain
        }
        fn add(&mut self, labels: &Labels, pprof: Vec<u8>) {
            let message = crate::pprof::Profile::decode(&pprof[..]).unwrap();
            assert_eq!(message.sample.len(), 1);
            self.0.push(labels["comm"].clone());
        }
        fn finish(self) -> Vec<String> {
            self.0
        }
    }

    #[test]
    fn requests_are_split_by_size() {
        let mut profile = two_process_profile();
        profile.samples.truncate(1);
        let one = encode::pprof::to_message(&profile).encode_to_vec().len();
        assert!((234..=350).contains(&one), "{one}");
        // Five processes of one sample each, about the same size: two fit in 700 bytes, three do not.
        for comm in ["b", "c", "d", "e"] {
            let mut sample = profile.samples[0].clone();
            sample.comm = comm.into();
            sample.labels = Arc::new(Labels::from([("comm".into(), comm.into())]));
            profile.samples.push(sample);
        }
        profile.samples[0].labels = Arc::new(Labels::from([("comm".into(), "a".into())]));
        let requests = encode_window(&profile, || Recorder(Vec::new()));
        assert_eq!(requests, [vec!["a", "b"], vec!["c", "d"], vec!["e"]]);
        profile.samples.clear();
        assert!(encode_window(&profile, || Recorder(Vec::new())).is_empty());
    }

    #[test]
    fn label_names_are_made_valid() {
        assert_eq!(label_name("service_name"), "service_name");
        assert_eq!(label_name("k8s.pod-name"), "k8s_pod_name");
        assert_eq!(label_name("1x"), "_1x");
        assert_eq!(label_name(""), "_");
    }

    #[test]
    fn urls_decide_tls() {
        let e = endpoint("https://profiles.example.com/prefix/", false).unwrap();
        assert_eq!(
            e,
            Endpoint {
                tls: true,
                base: "https://profiles.example.com/prefix".into()
            }
        );
        assert!(!endpoint("http://127.0.0.1:4040", false).unwrap().tls);
        let parca = endpoint("grpc.polarsignals.com:443", false).unwrap();
        assert_eq!(parca.base, "https://grpc.polarsignals.com:443");
        let plain = endpoint("parca:7070", true).unwrap();
        assert_eq!(plain.base, "http://parca:7070");
        assert!(endpoint("https://x", true).is_err());
        assert!(endpoint("ftp://x", false).is_err());
        assert!(endpoint("http://", false).is_err());
        let err = endpoint("https://user:pw@x", false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("credentials"), "{err}");
    }

    #[test]
    fn secrets_are_trimmed_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "s3cr3t\n").unwrap();
        let secret = Secret::read("the bearer token", &path).unwrap();
        assert_eq!(secret.expose(), "s3cr3t");
        assert!(!format!("{secret:?}").contains("s3cr3t"));
        let credentials = Credentials::Bearer(secret);
        assert!(!format!("{credentials:?}").contains("s3cr3t"));
        std::fs::write(&path, "\n").unwrap();
        assert!(matches!(
            Secret::read("the bearer token", &path),
            Err(SinkError::EmptySecret { .. })
        ));
        let config = RemoteConfig {
            url: Some("http://127.0.0.1:4040".into()),
            basic_auth_user: Some("u".into()),
            ..RemoteConfig::default()
        };
        assert!(ClientSettings::new(&config).is_err());
    }

    #[test]
    fn a_new_sink_starts_after_the_history_and_a_known_one_where_it_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path(), Retention::default()).unwrap();
        let mut profile = sample_profile();
        profile.start = SystemTime::now() - Duration::from_secs(100);
        store.write_window(&profile).unwrap();
        store.write_window(&profile).unwrap();
        assert_eq!(start_cursor(&store, "remote:x").unwrap(), 2);
        // Delivered nothing yet, restarted with a backlog: it stays.
        store.write_window(&profile).unwrap();
        assert_eq!(start_cursor(&store, "remote:x").unwrap(), 2);
        store.set_cursor("remote:x", 3).unwrap();
        assert_eq!(start_cursor(&store, "remote:x").unwrap(), 3);
        // A fresh store: a backlog from cursor 0 is kept across restarts too.
        let fresh = tempfile::tempdir().unwrap();
        let mut store = Store::open(fresh.path(), Retention::default()).unwrap();
        assert_eq!(start_cursor(&store, "remote:y").unwrap(), 0);
        store.write_window(&profile).unwrap();
        assert_eq!(start_cursor(&store, "remote:y").unwrap(), 0);
    }
}
