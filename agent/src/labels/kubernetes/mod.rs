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
//!
//! The parts: `client` finds the API server and talks HTTPS to it, `watch` runs the list +
//! watch loop, `api` and `pod` turn its JSON into pods, `cache` keeps them; this file is the
//! handle the rest of the agent holds and the one error type they all return.

mod api;
mod cache;
mod client;
mod pod;
mod watch;

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, PoisonError, RwLock,
    },
};

use reqwest::StatusCode;
use tracing::{debug, info, warn};

use cache::PodCache;
use client::ApiServer;

/// Where the kubelet mounts the pod's service account.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Overrides [`SERVICE_ACCOUNT_DIR`]; tests point it at a directory of their own.
pub const SERVICE_ACCOUNT_DIR_VARIABLE: &str = "SCORCH_KUBERNETES_SERVICE_ACCOUNT_DIR";

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

impl Kubernetes {
    /// From the environment; `Ok(None)` when not in a cluster (no `KUBERNETES_SERVICE_HOST` or
    /// `KUBERNETES_SERVICE_PORT`, or no token file).
    pub fn from_environment() -> Result<Option<Kubernetes>, KubernetesError> {
        let Some((api, ca_path)) = client::api_server_from(&|name| std::env::var(name).ok())?
        else {
            return Ok(None);
        };
        let client = client::http_client(&ca_path)?;
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
            pods_url: client::pods_url("127.0.0.1", 1).expect("a valid URL"),
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
                *task = Some(runtime.spawn(watch::list_and_watch(shared)).abort_handle());
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

/// The outcome of each request, as the metrics and the log report it; here rather than in the
/// watch loop because it is the state [`Kubernetes::reachable`] and the metrics read.
impl Shared {
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

impl crate::metrics::ApiServerState for Kubernetes {
    fn reachable(&self) -> bool {
        Kubernetes::reachable(self)
    }

    fn api_errors(&self) -> u64 {
        Kubernetes::api_errors(self)
    }
}
