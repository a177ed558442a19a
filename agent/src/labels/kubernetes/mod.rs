//! Kubernetes pod metadata: the names and labels behind the pod UIDs that cgroup paths carry.
//!
//! Label discovery finds a process's pod UID and container id in its cgroup path, but the names
//! users query by (namespace, pod, container, pod labels) live only in the API server. This
//! module keeps a cache of this node's pods, filled by a list and kept current by a watch, so a
//! lookup ([`Kubernetes::pod`]) is a map read that never waits on the network.
//!
//! It uses the in-cluster service account, as every Kubernetes client does:
//!
//! - `KUBERNETES_SERVICE_HOST`, `KUBERNETES_SERVICE_PORT`: the API server (the kubelet sets both
//!   in every pod).
//! - `token` and `ca.crt` in `/var/run/secrets/kubernetes.io/serviceaccount`, or in the
//!   directory `SCORCH_KUBERNETES_SERVICE_ACCOUNT_DIR` names (tests point it at their own). The
//!   token is read again for every request because bound service-account tokens rotate; only
//!   `ca.crt` is trusted, not the system's roots.
//! - `NODE_NAME`: this node, which the DaemonSet sets from the downward API (`spec.nodeName`).
//!   Only its pods are listed (`fieldSelector=spec.nodeName=...`), so the cache and the API
//!   server's work stay the size of one node. The service account needs `list` and `watch` on
//!   `pods`.
//!
//! Outside a cluster (no `KUBERNETES_SERVICE_HOST`/`PORT`, or no token) this is off, and says so
//! only at debug level. When the API server cannot be reached, the cache keeps what it knew, so
//! profiles keep flowing with the labels already known; [`Kubernetes::reachable`] and
//! [`Kubernetes::api_errors`] feed the `scorch_kubernetes_api_*` metrics. A warning is logged
//! when the API server stops answering, not on every retry.
//!
//! The protocol is the reflector's from client-go: list (paginated) to get the pods and a
//! resource version; watch from that version with bookmarks, resuming from the last version seen
//! when a watch ends; relist when the server says the version is too old (410 Gone, as a status
//! or as a watch `ERROR` event); retry failures with jittered exponential backoff.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, PoisonError, RwLock,
    },
    time::{Duration, Instant},
};

use reqwest::{StatusCode, Url};

use crate::sys::backoff::Backoff;
use serde::Deserialize;
use tracing::{debug, info, warn};

/// Where the kubelet mounts the pod's service account.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Overrides [`SERVICE_ACCOUNT_DIR`]; tests point it at a directory of their own.
pub const SERVICE_ACCOUNT_DIR_VARIABLE: &str = "SCORCH_KUBERNETES_SERVICE_ACCOUNT_DIR";

/// Pods per list page: a node runs about a hundred, so one page is the common case while a
/// crowded node still never makes the API server build one huge answer.
const LIST_PAGE_SIZE: u32 = 500;

/// A whole list page, including its body; far above what a node's pods take.
const LIST_TIMEOUT: Duration = Duration::from_secs(60);

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Watches end on the server after a random 5 to 10 minutes (client-go's choice), so that
/// agents on all nodes do not reconnect in step and a stuck watch cannot last forever.
const WATCH_SECONDS: std::ops::Range<u64> = 300..600;

/// Longest silence on a connection: a watch may legitimately see no event for its whole
/// length, so this is the longest watch plus a margin. TCP keepalive finds dead peers sooner.
const READ_TIMEOUT: Duration = Duration::from_secs(660);

/// One watch event is one object; etcd refuses objects over 1.5 MiB, so anything this long is
/// a broken stream, not a pod.
const MAX_EVENT_BYTES: usize = 16 << 20;

/// Backoff between failed attempts: client-go's reflector uses 800 ms up to 30 s.
const BACKOFF_INITIAL: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// A watch that ends sooner than this without an error is still followed by a backoff, so a
/// server that closes every watch at once cannot make the agent spin.
const SHORTEST_WATCH: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum KubernetesError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the CA certificates in {path}: {source}")]
    Certificate {
        path: PathBuf,
        #[source]
        source: reqwest::Error,
    },
    #[error("{path}: no PEM certificate in it")]
    NoCertificate { path: PathBuf },
    #[error("KUBERNETES_SERVICE_PORT={value:?} is not a port number")]
    Port { value: String },
    #[error("the API server address {url:?} is not a valid URL: {message}")]
    Url { url: String, message: String },
    #[error(
        "running in Kubernetes but NODE_NAME is not set: scorch lists only its own node's pods; \
         set it from the downward API (valueFrom.fieldRef.fieldPath: spec.nodeName)"
    )]
    NodeNameMissing,
    #[error("building the HTTP client for the Kubernetes API server: {0}")]
    Client(#[source] reqwest::Error),
    #[error("{what}: {source}")]
    Request {
        what: &'static str,
        #[source]
        source: reqwest::Error,
    },
    #[error("{what}: the API server answered {status}: {message}")]
    Status {
        what: &'static str,
        status: StatusCode,
        message: String,
    },
    #[error("{what}: resource version expired (410 Gone)")]
    Gone { what: &'static str },
    #[error("parsing {what}: {source}")]
    Parse {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("parsing {what}: {message}")]
    Invalid { what: &'static str, message: String },
    #[error("watching pods: an event longer than {limit} bytes")]
    EventTooLong { limit: usize },
    #[error("watching pods: the API server reported {code}: {message}")]
    Watch { code: u16, message: String },
}

impl KubernetesError {
    /// Whether the watch position can no longer be trusted, so the next attempt must list
    /// again rather than resume: the server said so, or we may have skipped an event.
    fn needs_relist(&self) -> bool {
        matches!(
            self,
            KubernetesError::Gone { .. }
                | KubernetesError::Parse { .. }
                | KubernetesError::Invalid { .. }
                | KubernetesError::EventTooLong { .. }
                | KubernetesError::Watch { .. }
        )
    }
}

/// What the API server says about one pod, as labels need it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodMetadata {
    pub namespace: String,
    pub name: String,
    /// The API server's UID (with dashes).
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    /// Container id (bare hex, no `containerd://` prefix) -> container name, for init,
    /// ephemeral and regular containers alike: cgroup paths do not tell them apart.
    pub containers: HashMap<String, String>,
}

/// This node's pods from the API server, kept current in the background. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Kubernetes {
    inner: Arc<Inner>,
}

/// What the clones share; dropping the last one stops the background task.
#[derive(Debug)]
struct Inner {
    shared: Arc<Shared>,
    /// The list+watch task once [`Kubernetes::start`] ran; aborted on drop because nothing
    /// else would stop it, and it would keep a connection to the API server open.
    task: Mutex<Option<tokio::task::AbortHandle>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self
            .task
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            task.abort();
        }
    }
}

/// What the background task and the lookups share.
#[derive(Debug)]
struct Shared {
    api: ApiServer,
    client: reqwest::Client,
    pods: RwLock<PodCache>,
    /// Whether the last request got an answer (2xx, or a 410 that only asks for a relist).
    reachable: AtomicBool,
    /// Failed requests and broken watches since start.
    errors: AtomicU64,
    /// Whether a warning was logged already, so later recoveries are worth an info line and
    /// the retries after the first failure only a debug one.
    warned: AtomicBool,
}

/// Where the API server is and how to talk to it, from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ApiServer {
    /// `https://host:port/api/v1/pods`.
    pods_url: Url,
    /// The service-account token file, read for every request.
    token_path: PathBuf,
    node: String,
}

impl Kubernetes {
    /// From the environment; `Ok(None)` when not in a cluster (no `KUBERNETES_SERVICE_HOST` or
    /// `KUBERNETES_SERVICE_PORT`, or no token file).
    pub fn from_environment() -> Result<Option<Kubernetes>, KubernetesError> {
        let Some((api, ca_path)) = api_server_from(&|name| std::env::var(name).ok())? else {
            return Ok(None);
        };
        let ca = std::fs::read(&ca_path).map_err(|source| KubernetesError::Read {
            path: ca_path.clone(),
            source,
        })?;
        let certificates = reqwest::Certificate::from_pem_bundle(&ca).map_err(|source| {
            KubernetesError::Certificate {
                path: ca_path.clone(),
                source,
            }
        })?;
        if certificates.is_empty() {
            return Err(KubernetesError::NoCertificate { path: ca_path });
        }
        let mut client = reqwest::Client::builder()
            // Only the cluster's CA vouches for the API server.
            .tls_built_in_root_certs(false)
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .tcp_keepalive(Duration::from_secs(30))
            .tcp_keepalive_interval(Duration::from_secs(10))
            .tcp_keepalive_retries(3)
            .user_agent(concat!("scorch/", env!("CARGO_PKG_VERSION")));
        for certificate in certificates {
            client = client.add_root_certificate(certificate);
        }
        let client = client.build().map_err(KubernetesError::Client)?;
        debug!(
            url = %api.pods_url,
            node = %api.node,
            "Kubernetes: in a cluster, pod metadata from the API server"
        );
        Ok(Some(Kubernetes::new(api, client)))
    }

    fn new(api: ApiServer, client: reqwest::Client) -> Kubernetes {
        Kubernetes {
            inner: Arc::new(Inner {
                shared: Arc::new(Shared {
                    api,
                    client,
                    pods: RwLock::new(PodCache::default()),
                    reachable: AtomicBool::new(false),
                    errors: AtomicU64::new(0),
                    warned: AtomicBool::new(false),
                }),
                task: Mutex::new(None),
            }),
        }
    }

    /// A handle that is never started, with the given state, for other modules' tests.
    #[cfg(test)]
    pub(crate) fn unstarted_for_tests(reachable: bool, errors: u64) -> Kubernetes {
        let api = ApiServer {
            pods_url: pods_url("127.0.0.1", 1).expect("a valid URL"),
            token_path: PathBuf::from("/nonexistent"),
            node: "test".to_string(),
        };
        let client = reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .build()
            .expect("an HTTP client");
        let kubernetes = Kubernetes::new(api, client);
        kubernetes
            .inner
            .shared
            .reachable
            .store(reachable, Ordering::Relaxed);
        kubernetes
            .inner
            .shared
            .errors
            .store(errors, Ordering::Relaxed);
        kubernetes
    }

    /// Starts list+watch on the current tokio runtime; returns at once. Calling it again does
    /// nothing.
    pub fn start(&self) {
        let mut task = self
            .inner
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if task.is_some() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let shared = Arc::clone(&self.inner.shared);
                *task = Some(runtime.spawn(list_and_watch(shared)).abort_handle());
            }
            Err(error) => {
                warn!("Kubernetes pod metadata not started: no tokio runtime ({error})");
            }
        }
    }

    /// The pod with this UID, from the cache. `uid` is as the API server writes it, with
    /// dashes; the underscores of systemd-style cgroup names are accepted too. A static pod is
    /// found by the UID its cgroup carries (its mirror pod's `kubernetes.io/config.mirror`).
    pub fn pod(&self, uid: &str) -> Option<PodMetadata> {
        let uid = uid.replace('_', "-");
        let pods = self
            .inner
            .shared
            .pods
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        pods.get(&uid).cloned()
    }

    /// Whether the API server answered the last request (false until it first does).
    pub fn reachable(&self) -> bool {
        self.inner.shared.reachable.load(Ordering::Relaxed)
    }

    /// Failed requests and broken watches since start.
    pub fn api_errors(&self) -> u64 {
        self.inner.shared.errors.load(Ordering::Relaxed)
    }

    /// Pods in the cache.
    pub fn pod_count(&self) -> usize {
        self.inner
            .shared
            .pods
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// The API server and the CA file from environment variables (`variable`) and the
/// service-account directory; `None` outside a cluster.
fn api_server_from(
    variable: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<(ApiServer, PathBuf)>, KubernetesError> {
    let host = variable("KUBERNETES_SERVICE_HOST").filter(|host| !host.is_empty());
    let port = variable("KUBERNETES_SERVICE_PORT").filter(|port| !port.is_empty());
    let (Some(host), Some(port)) = (host, port) else {
        debug!("Kubernetes: KUBERNETES_SERVICE_HOST/PORT not set, not in a cluster");
        return Ok(None);
    };
    let directory = variable(SERVICE_ACCOUNT_DIR_VARIABLE)
        .filter(|directory| !directory.is_empty())
        .map_or_else(|| PathBuf::from(SERVICE_ACCOUNT_DIR), PathBuf::from);
    let token_path = directory.join("token");
    // A pod with `automountServiceAccountToken: false` has no token: not an error, just no
    // pod names, like outside a cluster.
    if !token_path.exists() {
        debug!(
            "Kubernetes: no service-account token at {}, pod metadata off",
            token_path.display()
        );
        return Ok(None);
    }
    let port: u16 = port
        .trim()
        .parse()
        .map_err(|_| KubernetesError::Port { value: port })?;
    let node = variable("NODE_NAME")
        .filter(|node| !node.is_empty())
        .ok_or(KubernetesError::NodeNameMissing)?;
    let pods_url = pods_url(&host, port)?;
    Ok(Some((
        ApiServer {
            pods_url,
            token_path,
            node,
        },
        directory.join("ca.crt"),
    )))
}

/// `https://host:port/api/v1/pods`, with an IPv6 host in brackets.
fn pods_url(host: &str, port: u16) -> Result<Url, KubernetesError> {
    let url = if host.contains(':') && !host.starts_with('[') {
        format!("https://[{host}]:{port}/api/v1/pods")
    } else {
        format!("https://{host}:{port}/api/v1/pods")
    };
    Url::parse(&url).map_err(|error| KubernetesError::Url {
        message: error.to_string(),
        url,
    })
}

/// One request for this node's pods.
#[derive(Debug, Clone, Copy)]
enum PodsRequest<'a> {
    List {
        continue_token: Option<&'a str>,
    },
    Watch {
        resource_version: &'a str,
        timeout_seconds: u64,
    },
}

impl ApiServer {
    fn url(&self, request: PodsRequest<'_>) -> Url {
        let mut url = self.pods_url.clone();
        {
            let mut query = url.query_pairs_mut();
            query.append_pair("fieldSelector", &format!("spec.nodeName={}", self.node));
            match request {
                PodsRequest::List { continue_token } => {
                    query.append_pair("limit", &LIST_PAGE_SIZE.to_string());
                    if let Some(token) = continue_token {
                        query.append_pair("continue", token);
                    }
                }
                PodsRequest::Watch {
                    resource_version,
                    timeout_seconds,
                } => {
                    query
                        .append_pair("watch", "1")
                        .append_pair("resourceVersion", resource_version)
                        .append_pair("allowWatchBookmarks", "true")
                        .append_pair("timeoutSeconds", &timeout_seconds.to_string());
                }
            }
        }
        url
    }
}

/// The background task: list, then watch for as long as the agent runs.
async fn list_and_watch(shared: Arc<Shared>) {
    let mut backoff = Backoff::new(BACKOFF_INITIAL, BACKOFF_MAX);
    // Where the next watch starts; `None` asks for a list first.
    let mut resource_version: Option<String> = None;
    loop {
        let listing = resource_version.is_none();
        let result = match resource_version.as_mut() {
            None => match shared.list(&mut backoff).await {
                Ok(version) => {
                    resource_version = Some(version);
                    continue;
                }
                Err(error) => Err(error),
            },
            Some(version) => {
                let started = Instant::now();
                match shared.watch(version, &mut backoff).await {
                    Ok(()) if started.elapsed() >= SHORTEST_WATCH => continue,
                    Ok(()) => {
                        debug!("Kubernetes: pod watch ended at once");
                        Ok(())
                    }
                    Err(error) => Err(error),
                }
            }
        };
        if let Err(error) = result {
            if error.needs_relist() {
                resource_version = None;
            }
            if let KubernetesError::Gone { .. } = error {
                // Not a failure: the server answered, its history just no longer reaches
                // our version. List again at once after a watch; after a backoff when a list
                // got it (its continue token expired), so a server that answers every list
                // so cannot make the agent spin.
                debug!("Kubernetes: {error}; listing pods again");
                shared.answered();
                if !listing {
                    continue;
                }
            } else {
                shared.failed(&error);
            }
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

impl Shared {
    /// Lists this node's pods into the cache, replacing what it held; returns the list's
    /// resource version for the watch.
    async fn list(&self, backoff: &mut Backoff) -> Result<String, KubernetesError> {
        const WHAT: &str = "listing pods";
        let mut pods = Vec::new();
        let mut continue_token: Option<String> = None;
        loop {
            let url = self.api.url(PodsRequest::List {
                continue_token: continue_token.as_deref(),
            });
            let response = self
                .request(url, WHAT)?
                .timeout(LIST_TIMEOUT)
                .send()
                .await
                .map_err(|source| KubernetesError::Request { what: WHAT, source })?;
            let response = successful(response, WHAT).await?;
            self.answered();
            backoff.reset();
            let body = response
                .bytes()
                .await
                .map_err(|source| KubernetesError::Request { what: WHAT, source })?;
            let page = parse_pod_list(&body)?;
            pods.extend(page.pods);
            match page.continue_token {
                Some(token) => continue_token = Some(token),
                None => {
                    let on_node = pods
                        .into_iter()
                        .filter(|pod| pod.is_on(&self.api.node))
                        .collect::<Vec<_>>();
                    let count = on_node.len();
                    *self.pods.write().unwrap_or_else(PoisonError::into_inner) =
                        PodCache::from_pods(on_node);
                    debug!(
                        pods = count,
                        node = %self.api.node,
                        resource_version = %page.resource_version,
                        "Kubernetes: listed pods"
                    );
                    return Ok(page.resource_version);
                }
            }
        }
    }

    /// Watches from `resource_version`, applying events to the cache and moving
    /// `resource_version` along, until the server ends the watch (`Ok`) or something fails.
    async fn watch(
        &self,
        resource_version: &mut String,
        backoff: &mut Backoff,
    ) -> Result<(), KubernetesError> {
        const WHAT: &str = "watching pods";
        let url = self.api.url(PodsRequest::Watch {
            resource_version,
            timeout_seconds: fastrand::u64(WATCH_SECONDS),
        });
        let mut response = self
            .request(url, WHAT)?
            .send()
            .await
            .map_err(|source| KubernetesError::Request { what: WHAT, source })?;
        response = successful(response, WHAT).await?;
        self.answered();
        backoff.reset();
        let mut lines = LineSplitter::new(MAX_EVENT_BYTES);
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|source| KubernetesError::Request { what: WHAT, source })?
        {
            for line in lines.feed(&chunk)? {
                let event = parse_watch_event(&line)?;
                let mut pods = self.pods.write().unwrap_or_else(PoisonError::into_inner);
                pods.apply(event, &self.api.node, resource_version)?;
            }
        }
        Ok(())
    }

    /// A GET with the current token.
    fn request(
        &self,
        url: Url,
        what: &'static str,
    ) -> Result<reqwest::RequestBuilder, KubernetesError> {
        let token = read_token(&self.api.token_path)?;
        debug!(%url, "Kubernetes: {what}");
        Ok(self
            .client
            .get(url)
            .bearer_auth(token)
            .header(reqwest::header::ACCEPT, "application/json"))
    }

    fn answered(&self) {
        if !self.reachable.swap(true, Ordering::Relaxed) && self.warned.load(Ordering::Relaxed) {
            info!("Kubernetes API server reachable again");
        }
    }

    fn failed(&self, error: &KubernetesError) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let was_reachable = self.reachable.swap(false, Ordering::Relaxed);
        let warned_before = self.warned.swap(true, Ordering::Relaxed);
        if was_reachable || !warned_before {
            warn!(
                "Kubernetes API server: {error}; pods keep the names already known, retrying \
                 in the background"
            );
        } else {
            debug!("Kubernetes API server: {error}");
        }
    }
}

fn read_token(path: &Path) -> Result<String, KubernetesError> {
    let token = std::fs::read_to_string(path).map_err(|source| KubernetesError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(token.trim().to_string())
}

/// The response if it is a success; 410 as [`KubernetesError::Gone`]; otherwise an error
/// carrying the server's message (its `Status` object's, when it sent one).
async fn successful(
    response: reqwest::Response,
    what: &'static str,
) -> Result<reqwest::Response, KubernetesError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    if status == StatusCode::GONE {
        return Err(KubernetesError::Gone { what });
    }
    let body = response.bytes().await.unwrap_or_default();
    Err(KubernetesError::Status {
        what,
        status,
        message: status_message(&body),
    })
}

/// The `message` of a Kubernetes `Status` body, else the start of the body as text.
fn status_message(body: &[u8]) -> String {
    if let Ok(status) = serde_json::from_slice::<Status>(body) {
        if !status.message.is_empty() {
            return status.message;
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    match text.char_indices().nth(200) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_string(),
    }
}

/// The API objects, reduced to the fields labels need; serde skips the rest.
mod api {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    pub(super) struct PodList {
        #[serde(default)]
        pub metadata: ListMeta,
        #[serde(default)]
        pub items: Option<Vec<Pod>>,
    }

    #[derive(Debug, Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub(super) struct ListMeta {
        #[serde(default)]
        pub resource_version: Option<String>,
        #[serde(default, rename = "continue")]
        pub continue_token: Option<String>,
    }

    #[derive(Debug, Deserialize)]
    pub(super) struct Pod {
        #[serde(default)]
        pub metadata: ObjectMeta,
        #[serde(default)]
        pub spec: Option<PodSpec>,
        #[serde(default)]
        pub status: Option<PodStatus>,
    }

    #[derive(Debug, Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub(super) struct ObjectMeta {
        #[serde(default)]
        pub name: Option<String>,
        #[serde(default)]
        pub namespace: Option<String>,
        #[serde(default)]
        pub uid: Option<String>,
        #[serde(default)]
        pub resource_version: Option<String>,
        #[serde(default)]
        pub labels: Option<BTreeMap<String, String>>,
        #[serde(default)]
        pub annotations: Option<Annotations>,
    }

    /// Only the annotation this module reads; the others (some are large, like
    /// `last-applied-configuration`) are skipped unparsed.
    #[derive(Debug, Default, Deserialize)]
    pub(super) struct Annotations {
        /// On a mirror pod, the static pod's own UID: the kubelet names the static pod's
        /// cgroup after it, while the API server gives the mirror pod another.
        #[serde(default, rename = "kubernetes.io/config.mirror")]
        pub mirror: Option<String>,
    }

    #[derive(Debug, Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub(super) struct PodSpec {
        #[serde(default)]
        pub node_name: Option<String>,
    }

    #[derive(Debug, Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub(super) struct PodStatus {
        #[serde(default)]
        pub container_statuses: Option<Vec<ContainerStatus>>,
        #[serde(default)]
        pub init_container_statuses: Option<Vec<ContainerStatus>>,
        #[serde(default)]
        pub ephemeral_container_statuses: Option<Vec<ContainerStatus>>,
    }

    #[derive(Debug, Deserialize)]
    pub(super) struct ContainerStatus {
        #[serde(default)]
        pub name: String,
        /// `<runtime>://<id>`; absent until the container is created.
        #[serde(default, rename = "containerID")]
        pub container_id: Option<String>,
    }

    /// A watch stream's line: the object is a pod, or a `Status` for `ERROR`, or carries
    /// only a resource version for `BOOKMARK`.
    #[derive(Debug, Deserialize)]
    pub(super) struct WatchEvent {
        #[serde(rename = "type")]
        pub kind: String,
        #[serde(default)]
        pub object: serde_json::Value,
    }
}

/// A Kubernetes `Status` object, as error answers and watch `ERROR` events carry it.
#[derive(Debug, Default, Deserialize)]
struct Status {
    #[serde(default)]
    code: u16,
    #[serde(default)]
    message: String,
}

/// One pod as parsed, before it goes into the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ParsedPod {
    metadata: PodMetadata,
    /// For a mirror pod, the static pod's UID, which its cgroup carries.
    mirror_of: Option<String>,
    /// `spec.nodeName`; empty while unscheduled.
    node: String,
    resource_version: String,
}

impl ParsedPod {
    /// Whether the pod runs here. The field selector already says so; checking again keeps
    /// the cache to this node even behind a proxy or server that ignored it.
    fn is_on(&self, node: &str) -> bool {
        self.node == node
    }
}

/// One page of a pod list.
#[derive(Debug)]
struct PodListPage {
    pods: Vec<ParsedPod>,
    resource_version: String,
    /// Set while more pages follow.
    continue_token: Option<String>,
}

fn parse_pod_list(body: &[u8]) -> Result<PodListPage, KubernetesError> {
    const WHAT: &str = "the pod list";
    let list: api::PodList = serde_json::from_slice(body)
        .map_err(|source| KubernetesError::Parse { what: WHAT, source })?;
    let resource_version = list
        .metadata
        .resource_version
        .filter(|version| !version.is_empty())
        .ok_or_else(|| KubernetesError::Invalid {
            what: WHAT,
            message: "no metadata.resourceVersion to watch from".to_string(),
        })?;
    let pods = list
        .items
        .unwrap_or_default()
        .into_iter()
        .map(|pod| parsed_pod(pod, WHAT))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(PodListPage {
        pods,
        resource_version,
        continue_token: list
            .metadata
            .continue_token
            .filter(|token| !token.is_empty()),
    })
}

fn parsed_pod(pod: api::Pod, what: &'static str) -> Result<ParsedPod, KubernetesError> {
    let metadata = pod.metadata;
    let name = metadata.name.unwrap_or_default();
    let uid =
        metadata
            .uid
            .filter(|uid| !uid.is_empty())
            .ok_or_else(|| KubernetesError::Invalid {
                what,
                message: format!("pod {name:?} has no metadata.uid"),
            })?;
    let status = pod.status.unwrap_or_default();
    let containers = [
        status.container_statuses,
        status.init_container_statuses,
        status.ephemeral_container_statuses,
    ]
    .into_iter()
    .flatten()
    .flatten()
    .filter_map(|container| {
        let id = container_id(container.container_id.as_deref()?)?;
        Some((id.to_string(), container.name))
    })
    .collect();
    Ok(ParsedPod {
        metadata: PodMetadata {
            namespace: metadata.namespace.unwrap_or_default(),
            name,
            uid,
            labels: metadata.labels.unwrap_or_default(),
            containers,
        },
        mirror_of: metadata
            .annotations
            .and_then(|annotations| annotations.mirror)
            .filter(|mirror| !mirror.is_empty()),
        node: pod.spec.and_then(|spec| spec.node_name).unwrap_or_default(),
        resource_version: metadata.resource_version.unwrap_or_default(),
    })
}

/// The bare id of a `containerID` status field (`containerd://<hex>`, `docker://<hex>`,
/// `cri-o://<hex>`), as cgroup paths carry it; `None` when empty.
fn container_id(status_id: &str) -> Option<&str> {
    let id = status_id
        .split_once("://")
        .map_or(status_id, |(_runtime, id)| id);
    (!id.is_empty()).then_some(id)
}

/// One watch event, parsed.
#[derive(Debug, PartialEq, Eq)]
enum WatchEvent {
    /// `ADDED` or `MODIFIED`: the pod as it is now.
    Upsert(ParsedPod),
    Deleted(ParsedPod),
    /// Nothing changed, but the watch may resume from here.
    Bookmark {
        resource_version: String,
    },
    /// `ERROR` with 410: the version we watch from is too old, relist.
    Gone,
    /// `ERROR` with another code.
    Failed {
        code: u16,
        message: String,
    },
    /// A type this module does not know; skipped.
    Unknown(String),
}

fn parse_watch_event(line: &[u8]) -> Result<WatchEvent, KubernetesError> {
    const WHAT: &str = "a pod watch event";
    let parse = |source| KubernetesError::Parse { what: WHAT, source };
    let event: api::WatchEvent = serde_json::from_slice(line).map_err(parse)?;
    Ok(match event.kind.as_str() {
        "ADDED" | "MODIFIED" => WatchEvent::Upsert(parsed_pod(
            serde_json::from_value(event.object).map_err(parse)?,
            WHAT,
        )?),
        "DELETED" => WatchEvent::Deleted(parsed_pod(
            serde_json::from_value(event.object).map_err(parse)?,
            WHAT,
        )?),
        "BOOKMARK" => {
            let pod: api::Pod = serde_json::from_value(event.object).map_err(parse)?;
            WatchEvent::Bookmark {
                resource_version: pod.metadata.resource_version.unwrap_or_default(),
            }
        }
        "ERROR" => {
            let status: Status = serde_json::from_value(event.object).map_err(parse)?;
            if status.code == StatusCode::GONE.as_u16() {
                WatchEvent::Gone
            } else {
                WatchEvent::Failed {
                    code: status.code,
                    message: status.message,
                }
            }
        }
        _ => WatchEvent::Unknown(event.kind),
    })
}

/// The pods of this node by UID, plus the cgroup UIDs of static pods.
#[derive(Debug, Default)]
struct PodCache {
    pods: HashMap<String, CachedPod>,
    /// Static pod UID (as in its cgroup) -> its mirror pod's API UID.
    mirrors: HashMap<String, String>,
}

#[derive(Debug)]
struct CachedPod {
    metadata: PodMetadata,
    mirror_of: Option<String>,
}

impl PodCache {
    fn from_pods(pods: Vec<ParsedPod>) -> PodCache {
        let mut cache = PodCache::default();
        for pod in pods {
            cache.upsert(pod);
        }
        cache
    }

    fn len(&self) -> usize {
        self.pods.len()
    }

    fn get(&self, uid: &str) -> Option<&PodMetadata> {
        let pod = match self.pods.get(uid) {
            Some(pod) => pod,
            None => self.pods.get(self.mirrors.get(uid)?)?,
        };
        Some(&pod.metadata)
    }

    fn upsert(&mut self, pod: ParsedPod) {
        self.remove(&pod.metadata.uid);
        if let Some(mirror_of) = &pod.mirror_of {
            self.mirrors
                .insert(mirror_of.clone(), pod.metadata.uid.clone());
        }
        self.pods.insert(
            pod.metadata.uid.clone(),
            CachedPod {
                metadata: pod.metadata,
                mirror_of: pod.mirror_of,
            },
        );
    }

    fn remove(&mut self, uid: &str) {
        if let Some(removed) = self.pods.remove(uid) {
            if let Some(mirror_of) = removed.mirror_of {
                self.mirrors.remove(&mirror_of);
            }
        }
    }

    /// Applies one watch event for `node`, moving `resource_version` to the event's.
    fn apply(
        &mut self,
        event: WatchEvent,
        node: &str,
        resource_version: &mut String,
    ) -> Result<(), KubernetesError> {
        let mut advance = |version: String| {
            if !version.is_empty() {
                *resource_version = version;
            }
        };
        match event {
            WatchEvent::Upsert(mut pod) => {
                let version = std::mem::take(&mut pod.resource_version);
                if pod.is_on(node) {
                    self.upsert(pod);
                } else {
                    self.remove(&pod.metadata.uid);
                }
                advance(version);
            }
            WatchEvent::Deleted(pod) => {
                self.remove(&pod.metadata.uid);
                advance(pod.resource_version);
            }
            WatchEvent::Bookmark {
                resource_version: version,
            } => advance(version),
            WatchEvent::Gone => {
                return Err(KubernetesError::Gone {
                    what: "watching pods",
                })
            }
            WatchEvent::Failed { code, message } => {
                return Err(KubernetesError::Watch { code, message })
            }
            WatchEvent::Unknown(kind) => {
                debug!("Kubernetes: skipping a pod watch event of type {kind:?}");
            }
        }
        Ok(())
    }
}

/// Cuts a byte stream into newline-terminated lines (the watch's framing: one JSON object per
/// line), whatever the chunk boundaries.
#[derive(Debug)]
struct LineSplitter {
    /// The unterminated end of the stream so far.
    partial: Vec<u8>,
    limit: usize,
}

impl LineSplitter {
    fn new(limit: usize) -> LineSplitter {
        LineSplitter {
            partial: Vec::new(),
            limit,
        }
    }

    /// The lines `chunk` completes, without their newlines; blank lines are skipped.
    fn feed(&mut self, chunk: &[u8]) -> Result<Vec<Vec<u8>>, KubernetesError> {
        let mut lines = Vec::new();
        let mut rest = chunk;
        while let Some(end) = memchr::memchr(b'\n', rest) {
            self.partial.extend_from_slice(&rest[..end]);
            let line = std::mem::take(&mut self.partial);
            if !line.trim_ascii().is_empty() {
                lines.push(line);
            }
            rest = &rest[end + 1..];
        }
        self.partial.extend_from_slice(rest);
        if self.partial.len() > self.limit {
            return Err(KubernetesError::EventTooLong { limit: self.limit });
        }
        Ok(lines)
    }
}

impl crate::metrics::ApiServerState for Kubernetes {
    fn reachable(&self) -> bool {
        Kubernetes::reachable(self)
    }

    fn api_errors(&self) -> u64 {
        Kubernetes::api_errors(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod_json(uid: &str, name: &str, node: &str, version: &str) -> serde_json::Value {
        serde_json::json!({
            "metadata": {
                "name": name, "namespace": "shop", "uid": uid, "resourceVersion": version,
                "labels": {"app": name},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}
            },
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "x"}]},
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {"name": "main", "containerID": "containerd://aaaa1111", "ready": true},
                    {"name": "pending", "ready": false}
                ],
                "initContainerStatuses": [{"name": "setup", "containerID": "cri-o://bbbb2222"}],
                "ephemeralContainerStatuses": [{"name": "debug", "containerID": "docker://cccc"}]
            }
        })
    }

    fn event(kind: &str, object: serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({"type": kind, "object": object}))
            .expect("serialisable")
    }

    fn parsed(uid: &str, name: &str, node: &str, version: &str) -> ParsedPod {
        parsed_pod(
            serde_json::from_value(pod_json(uid, name, node, version)).expect("a pod"),
            "test",
        )
        .expect("valid")
    }

    #[test]
    fn container_ids_lose_the_runtime_prefix() {
        assert_eq!(container_id("containerd://0123abcd"), Some("0123abcd"));
        assert_eq!(container_id("docker://ffee"), Some("ffee"));
        assert_eq!(container_id("cri-o://99"), Some("99"));
        assert_eq!(container_id("0123abcd"), Some("0123abcd"));
        assert_eq!(container_id("containerd://"), None);
        assert_eq!(container_id(""), None);
    }

    #[test]
    fn parses_a_pod_list() {
        let body = serde_json::to_vec(&serde_json::json!({
            "kind": "PodList", "apiVersion": "v1",
            "metadata": {"resourceVersion": "1234", "continue": "next-page"},
            "items": [pod_json("u-1", "checkout", "node-a", "1200")]
        }))
        .expect("serialisable");
        let page = parse_pod_list(&body).expect("parses");
        assert_eq!(page.resource_version, "1234");
        assert_eq!(page.continue_token.as_deref(), Some("next-page"));
        assert_eq!(page.pods.len(), 1);
        let pod = &page.pods[0];
        assert_eq!(pod.node, "node-a");
        assert_eq!(pod.resource_version, "1200");
        assert_eq!(pod.mirror_of, None);
        let metadata = &pod.metadata;
        assert_eq!(
            (
                metadata.namespace.as_str(),
                metadata.name.as_str(),
                metadata.uid.as_str()
            ),
            ("shop", "checkout", "u-1")
        );
        assert_eq!(
            metadata.labels,
            BTreeMap::from([("app".to_string(), "checkout".to_string())])
        );
        assert_eq!(
            metadata.containers,
            HashMap::from([
                ("aaaa1111".to_string(), "main".to_string()),
                ("bbbb2222".to_string(), "setup".to_string()),
                ("cccc".to_string(), "debug".to_string()),
            ])
        );
    }

    #[test]
    fn pod_list_edge_cases() {
        // Empty lists: `items` may be null, `continue` empty on the last page.
        let page =
            parse_pod_list(br#"{"metadata":{"resourceVersion":"7","continue":""},"items":null}"#)
                .expect("parses");
        assert!(page.pods.is_empty());
        assert_eq!(page.continue_token, None);
        // Null labels, no status yet.
        let page = parse_pod_list(
            br#"{"metadata":{"resourceVersion":"7"},"items":[{"metadata":{"name":"p","uid":"u","labels":null}}]}"#,
        )
        .expect("parses");
        assert!(page.pods[0].metadata.labels.is_empty());
        assert!(page.pods[0].metadata.containers.is_empty());
        assert_eq!(page.pods[0].node, "");

        assert!(matches!(
            parse_pod_list(br#"{"metadata":{},"items":[]}"#),
            Err(KubernetesError::Invalid { .. })
        ));
        assert!(matches!(
            parse_pod_list(
                br#"{"metadata":{"resourceVersion":"1"},"items":[{"metadata":{"name":"p"}}]}"#
            ),
            Err(KubernetesError::Invalid { .. })
        ));
        assert!(matches!(
            parse_pod_list(b"<html>"),
            Err(KubernetesError::Parse { .. })
        ));
    }

    #[test]
    fn parses_watch_events() {
        let pod = pod_json("u-1", "checkout", "node-a", "5");
        let expected = parsed("u-1", "checkout", "node-a", "5");
        assert_eq!(
            parse_watch_event(&event("ADDED", pod.clone())).expect("parses"),
            WatchEvent::Upsert(expected.clone())
        );
        assert_eq!(
            parse_watch_event(&event("MODIFIED", pod.clone())).expect("parses"),
            WatchEvent::Upsert(expected.clone())
        );
        assert_eq!(
            parse_watch_event(&event("DELETED", pod)).expect("parses"),
            WatchEvent::Deleted(expected)
        );
        assert_eq!(
            parse_watch_event(&event(
                "BOOKMARK",
                serde_json::json!({"kind": "Pod", "metadata": {"resourceVersion": "99"}})
            ))
            .expect("parses"),
            WatchEvent::Bookmark {
                resource_version: "99".to_string()
            }
        );
        let gone = serde_json::json!({
            "kind": "Status", "status": "Failure", "reason": "Expired", "code": 410,
            "message": "too old resource version: 1 (50)"
        });
        assert_eq!(
            parse_watch_event(&event("ERROR", gone)).expect("parses"),
            WatchEvent::Gone
        );
        let internal = serde_json::json!({"kind": "Status", "code": 500, "message": "etcd"});
        assert_eq!(
            parse_watch_event(&event("ERROR", internal)).expect("parses"),
            WatchEvent::Failed {
                code: 500,
                message: "etcd".to_string()
            }
        );
        assert_eq!(
            parse_watch_event(&event("SOMETHING", serde_json::json!({}))).expect("parses"),
            WatchEvent::Unknown("SOMETHING".to_string())
        );
        assert!(parse_watch_event(b"{\"type\":\"ADDED\"").is_err());
        assert!(parse_watch_event(&event("ADDED", serde_json::json!({"metadata": {}}))).is_err());
    }

    #[test]
    fn the_cache_follows_events() {
        let mut cache = PodCache::from_pods(vec![
            parsed("u-1", "checkout", "node-a", "1"),
            parsed("u-2", "cart", "node-a", "2"),
        ]);
        let mut version = "10".to_string();

        let mut modified = parsed("u-1", "checkout", "node-a", "11");
        modified
            .metadata
            .labels
            .insert("version".to_string(), "v2".to_string());
        cache
            .apply(WatchEvent::Upsert(modified), "node-a", &mut version)
            .expect("applies");
        assert_eq!(version, "11");
        assert_eq!(
            cache
                .get("u-1")
                .map(|pod| pod.labels.get("version").cloned()),
            Some(Some("v2".to_string()))
        );

        cache
            .apply(
                WatchEvent::Deleted(parsed("u-2", "cart", "node-a", "12")),
                "node-a",
                &mut version,
            )
            .expect("applies");
        assert!(cache.get("u-2").is_none());
        assert_eq!(version, "12");

        // A pod reported on another node is not kept.
        cache
            .apply(
                WatchEvent::Upsert(parsed("u-3", "other", "node-b", "13")),
                "node-a",
                &mut version,
            )
            .expect("applies");
        assert!(cache.get("u-3").is_none());

        cache
            .apply(
                WatchEvent::Bookmark {
                    resource_version: "20".to_string(),
                },
                "node-a",
                &mut version,
            )
            .expect("applies");
        assert_eq!(version, "20");
        // An empty bookmark keeps the position.
        cache
            .apply(
                WatchEvent::Bookmark {
                    resource_version: String::new(),
                },
                "node-a",
                &mut version,
            )
            .expect("applies");
        assert_eq!(version, "20");

        let gone = cache.apply(WatchEvent::Gone, "node-a", &mut version);
        assert!(matches!(gone, Err(ref error) if error.needs_relist()));
        let failed = cache.apply(
            WatchEvent::Failed {
                code: 500,
                message: "x".to_string(),
            },
            "node-a",
            &mut version,
        );
        assert!(matches!(failed, Err(ref error) if error.needs_relist()));
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn static_pods_are_found_by_their_cgroup_uid() {
        let mut json = pod_json("api-uid", "kube-apiserver-node-a", "node-a", "1");
        json["metadata"]["annotations"] =
            serde_json::json!({"kubernetes.io/config.mirror": "cgroup-uid", "other": "x"});
        let pod = parsed_pod(serde_json::from_value(json).expect("a pod"), "test").expect("valid");
        assert_eq!(pod.mirror_of.as_deref(), Some("cgroup-uid"));
        let mut cache = PodCache::from_pods(vec![pod.clone()]);
        assert_eq!(
            cache.get("cgroup-uid").map(|pod| pod.name.as_str()),
            Some("kube-apiserver-node-a")
        );
        assert!(cache.get("api-uid").is_some());
        cache.remove("api-uid");
        assert!(cache.get("cgroup-uid").is_none());
        assert!(cache.mirrors.is_empty());
    }

    #[test]
    fn lines_are_cut_across_chunks() {
        let mut splitter = LineSplitter::new(10);
        assert_eq!(splitter.feed(b"ab").expect("fits"), Vec::<Vec<u8>>::new());
        assert_eq!(
            splitter.feed(b"c\n\n de\nf").expect("fits"),
            vec![b"abc".to_vec(), b" de".to_vec()]
        );
        assert_eq!(splitter.feed(b"\n").expect("fits"), vec![b"f".to_vec()]);
        assert!(matches!(
            splitter.feed(b"0123456789a"),
            Err(KubernetesError::EventTooLong { limit: 10 })
        ));
    }

    #[test]
    fn urls_select_this_node() {
        let api = ApiServer {
            pods_url: pods_url("10.96.0.1", 443).expect("valid"),
            token_path: PathBuf::from("/token"),
            node: "node a&b".to_string(),
        };
        assert_eq!(
            api.url(PodsRequest::List {
                continue_token: Some("c=1")
            })
            .as_str(),
            "https://10.96.0.1/api/v1/pods?fieldSelector=spec.nodeName%3Dnode+a%26b&limit=500&continue=c%3D1"
        );
        assert_eq!(
            api.url(PodsRequest::Watch {
                resource_version: "42",
                timeout_seconds: 300
            })
            .as_str(),
            "https://10.96.0.1/api/v1/pods?fieldSelector=spec.nodeName%3Dnode+a%26b&watch=1&resourceVersion=42&allowWatchBookmarks=true&timeoutSeconds=300"
        );
        assert_eq!(
            pods_url("fd00::1", 6443).expect("valid").as_str(),
            "https://[fd00::1]:6443/api/v1/pods"
        );
    }

    #[test]
    fn the_environment_decides() {
        let directory = tempfile::tempdir().expect("a temp dir");
        let account = directory.path().to_string_lossy().into_owned();
        let environment = |pairs: &[(&str, &str)]| {
            let pairs: HashMap<String, String> = pairs
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect();
            move |name: &str| pairs.get(name).cloned()
        };
        let in_cluster = [
            ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            (SERVICE_ACCOUNT_DIR_VARIABLE, account.as_str()),
            ("NODE_NAME", "node-a"),
        ];
        // Not in a cluster: no variables, or no token.
        assert_eq!(api_server_from(&environment(&[])).expect("fine"), None);
        assert_eq!(
            api_server_from(&environment(&in_cluster)).expect("fine"),
            None
        );
        std::fs::write(directory.path().join("token"), "secret\n").expect("writable");
        let (api, ca) = api_server_from(&environment(&in_cluster))
            .expect("fine")
            .expect("in a cluster");
        assert_eq!(api.node, "node-a");
        assert_eq!(api.pods_url.as_str(), "https://10.0.0.1/api/v1/pods");
        assert_eq!(ca, directory.path().join("ca.crt"));
        assert_eq!(read_token(&api.token_path).expect("readable"), "secret");

        assert!(matches!(
            api_server_from(&environment(&in_cluster[..3])),
            Err(KubernetesError::NodeNameMissing)
        ));
        let mut bad_port = in_cluster;
        bad_port[1].1 = "https";
        assert!(matches!(
            api_server_from(&environment(&bad_port)),
            Err(KubernetesError::Port { .. })
        ));
    }

    #[test]
    fn status_messages_are_short() {
        assert_eq!(
            status_message(br#"{"kind":"Status","code":403,"message":"pods is forbidden"}"#),
            "pods is forbidden"
        );
        assert_eq!(status_message(b" plain text \n"), "plain text");
        assert_eq!(status_message(&[b'x'; 500]).len(), 203);
    }
}
