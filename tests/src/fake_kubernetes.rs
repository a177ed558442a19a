//! A fake Kubernetes API server on loopback over TLS, for the pod metadata tests.
//!
//! It serves what scorch asks of a real one and nothing more: `GET /api/v1/pods` with a bearer
//! token, as a list filtered by `fieldSelector=spec.nodeName=...`, or with `watch=1` as a
//! chunked stream of watch events from a resource version. The certificate is signed by a test
//! CA made at start (rcgen); [`FakeKubernetes::start`] writes `token` and `ca.crt` into a
//! service-account directory the agent is pointed at.
//!
//! It runs on a thread with its own tokio runtime, so [`FakeKubernetes::stop`] drops every
//! connection at once, like an API server that goes away; [`FakeKubernetes::restart`] listens
//! on the same port again. [`FakeKubernetes::forget_history`] makes watches from older versions
//! fail with 410 Gone, as after etcd compaction, so the client has to list again.

use std::{
    collections::BTreeMap,
    path::Path,
    sync::{Arc, Mutex, PoisonError},
    thread::JoinHandle,
};

use anyhow::{bail, Context, Result};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsAcceptor;

/// The bearer token the server accepts.
pub const TOKEN: &str = "scorch-test-token";

/// A pod object as the API server writes it: `containers` are (name, `containerID` with its
/// runtime prefix).
pub fn pod(
    uid: &str,
    namespace: &str,
    name: &str,
    node: &str,
    labels: &[(&str, &str)],
    containers: &[(&str, &str)],
) -> Value {
    let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
    let statuses: Vec<Value> = containers
        .iter()
        .map(|(name, id)| json!({"name": name, "containerID": id, "ready": true}))
        .collect();
    json!({
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "labels": labels},
        "spec": {"nodeName": node},
        "status": {"phase": "Running", "containerStatuses": statuses},
    })
}

/// What the server knows, shared with its connections.
#[derive(Debug, Default)]
struct State {
    /// uid -> pod (its `metadata.resourceVersion` set).
    pods: BTreeMap<String, Value>,
    version: u64,
    /// Every change, in order: (version, node, event object).
    events: Vec<(u64, String, Value)>,
    /// Watches from a version older than this get 410 Gone.
    oldest: u64,
    /// The path and query of every request, and whether its token was right.
    requests: Vec<(String, bool)>,
}

/// A request, as far as the server reads it.
#[derive(Debug)]
pub struct Request {
    pub target: String,
    pub authorized: bool,
}

pub struct FakeKubernetes {
    pub port: u16,
    state: Arc<Mutex<State>>,
    /// Wakes watches when an event is added; a tokio watch channel works across runtimes.
    changed: Arc<tokio::sync::watch::Sender<u64>>,
    acceptor: TlsAcceptor,
    server: Option<ServerThread>,
}

struct ServerThread {
    stop: tokio::sync::oneshot::Sender<()>,
    thread: JoinHandle<()>,
}

impl FakeKubernetes {
    /// Makes a CA and a certificate for 127.0.0.1, writes `token` and `ca.crt` into
    /// `service_account_dir`, and starts listening on a free loopback port.
    pub fn start(service_account_dir: &Path) -> Result<FakeKubernetes> {
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "scorch test cluster CA");
        ca_params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key)?;
        let server_key = rcgen::KeyPair::generate()?;
        // "127.0.0.1" becomes an IP address SAN, which is what the client checks.
        let server_cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])?
            .signed_by(&server_key, &ca)?;

        std::fs::create_dir_all(service_account_dir)?;
        std::fs::write(service_account_dir.join("token"), format!("{TOKEN}\n"))?;
        std::fs::write(service_account_dir.join("ca.crt"), ca.pem())?;

        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(server_cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der())),
        )?;
        let (changed, _) = tokio::sync::watch::channel(0);
        let mut fake = FakeKubernetes {
            port: 0,
            state: Arc::default(),
            changed: Arc::new(changed),
            acceptor: TlsAcceptor::from(Arc::new(config)),
            server: None,
        };
        fake.listen()?;
        Ok(fake)
    }

    fn listen(&mut self) -> Result<()> {
        let listener = std::net::TcpListener::bind(("127.0.0.1", self.port))
            .with_context(|| format!("binding 127.0.0.1:{}", self.port))?;
        listener.set_nonblocking(true)?;
        self.port = listener.local_addr()?.port();
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let acceptor = self.acceptor.clone();
        let state = Arc::clone(&self.state);
        let changed = Arc::clone(&self.changed);
        let thread = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                loop {
                    tokio::select! {
                        _ = &mut stopped => break,
                        accepted = listener.accept() => {
                            let Ok((stream, _)) = accepted else { continue };
                            let acceptor = acceptor.clone();
                            let state = Arc::clone(&state);
                            let changes = changed.subscribe();
                            tokio::spawn(async move {
                                if let Ok(stream) = acceptor.accept(stream).await {
                                    let _ = serve(stream, state, changes).await;
                                }
                            });
                        }
                    }
                }
            });
            // Dropping the runtime drops every connection's task, closing its socket.
            drop(runtime);
        });
        self.server = Some(ServerThread { stop, thread });
        Ok(())
    }

    /// Goes away: no more listening, every open connection closed.
    pub fn stop(&mut self) {
        if let Some(server) = self.server.take() {
            let _ = server.stop.send(());
            let _ = server.thread.join();
        }
    }

    /// Listens again on the same port, with the pods it had.
    pub fn restart(&mut self) -> Result<()> {
        if self.server.is_some() {
            bail!("the fake API server is running");
        }
        self.listen()
    }

    /// Watches from versions before now get 410 Gone.
    pub fn forget_history(&self) {
        let mut state = self.state();
        state.oldest = state.version;
    }

    /// Adds or replaces a pod (`ADDED` or `MODIFIED` for watchers).
    pub fn put_pod(&self, mut pod: Value) -> Result<()> {
        let uid = pod["metadata"]["uid"]
            .as_str()
            .context("a pod needs metadata.uid")?
            .to_string();
        let node = pod["spec"]["nodeName"].as_str().unwrap_or("").to_string();
        let mut state = self.state();
        state.version += 1;
        let version = state.version;
        pod["metadata"]["resourceVersion"] = json!(version.to_string());
        let kind = if state.pods.contains_key(&uid) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        state.pods.insert(uid, pod.clone());
        state
            .events
            .push((version, node, json!({"type": kind, "object": pod})));
        drop(state);
        self.changed.send_replace(version);
        Ok(())
    }

    /// Deletes a pod (`DELETED` for watchers).
    pub fn delete_pod(&self, uid: &str) -> Result<()> {
        let mut state = self.state();
        let mut pod = state.pods.remove(uid).context("no such pod")?;
        state.version += 1;
        let version = state.version;
        pod["metadata"]["resourceVersion"] = json!(version.to_string());
        let node = pod["spec"]["nodeName"].as_str().unwrap_or("").to_string();
        state
            .events
            .push((version, node, json!({"type": "DELETED", "object": pod})));
        drop(state);
        self.changed.send_replace(version);
        Ok(())
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Request> {
        self.state()
            .requests
            .iter()
            .map(|(target, authorized)| Request {
                target: target.clone(),
                authorized: *authorized,
            })
            .collect()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for FakeKubernetes {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One connection, one request (`Connection: close`).
async fn serve<S>(
    mut stream: S,
    state: Arc<Mutex<State>>,
    mut changes: tokio::sync::watch::Receiver<u64>,
) -> Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut head = Vec::new();
    let mut buffer = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let read = stream.read(&mut buffer).await?;
        if read == 0 || head.len() > 65536 {
            return Ok(());
        }
        head.extend_from_slice(&buffer[..read]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut lines = head.split("\r\n");
    let target = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .unwrap_or("")
        .to_string();
    let authorized = lines.any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.eq_ignore_ascii_case("authorization") && value.trim() == format!("Bearer {TOKEN}")
        })
    });
    lock(&state).requests.push((target.clone(), authorized));

    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let query: BTreeMap<String, String> = query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(name, value)| (percent_decode(name), percent_decode(value)))
        .collect();
    if !authorized {
        return respond(
            &mut stream,
            "401 Unauthorized",
            &status(401, "Unauthorized"),
        )
        .await;
    }
    if path != "/api/v1/pods" {
        return respond(&mut stream, "404 Not Found", &status(404, "not found")).await;
    }
    let node = query
        .get("fieldSelector")
        .and_then(|selector| selector.strip_prefix("spec.nodeName="))
        .map(str::to_string);
    let on_node = |pod_node: &str| node.as_deref().is_none_or(|node| node == pod_node);

    if query.get("watch").map(String::as_str) != Some("1") {
        let list = {
            let state = lock(&state);
            let items: Vec<&Value> = state
                .pods
                .values()
                .filter(|pod| on_node(pod["spec"]["nodeName"].as_str().unwrap_or("")))
                .collect();
            json!({
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": state.version.to_string()},
                "items": items,
            })
        };
        return respond(&mut stream, "200 OK", &list).await;
    }

    let mut from: u64 = query
        .get("resourceVersion")
        .and_then(|version| version.parse().ok())
        .unwrap_or(0);
    stream
        .write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\
              Connection: close\r\n\r\n",
        )
        .await?;
    if from < lock(&state).oldest {
        let gone = json!({"type": "ERROR", "object": status(410, "too old resource version")});
        write_chunk(&mut stream, &gone).await?;
        stream.write_all(b"0\r\n\r\n").await?;
        return Ok(());
    }
    loop {
        let pending: Vec<(u64, Value)> = lock(&state)
            .events
            .iter()
            .filter(|(version, node, _)| *version > from && on_node(node))
            .map(|(version, _, event)| (*version, event.clone()))
            .collect();
        for (version, event) in pending {
            write_chunk(&mut stream, &event).await?;
            from = version;
        }
        // Events between the read above and here are caught: `changed` compares versions.
        if changes.changed().await.is_err() {
            return Ok(());
        }
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

fn status(code: u16, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code})
}

async fn respond<S: tokio::io::AsyncWrite + Unpin>(
    stream: &mut S,
    status: &str,
    body: &Value,
) -> Result<()> {
    let body = serde_json::to_vec(body)?;
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(&body).await?;
    stream.shutdown().await?;
    Ok(())
}

async fn write_chunk<S: tokio::io::AsyncWrite + Unpin>(
    stream: &mut S,
    event: &Value,
) -> Result<()> {
    let mut line = serde_json::to_vec(event)?;
    line.push(b'\n');
    stream
        .write_all(format!("{:x}\r\n", line.len()).as_bytes())
        .await?;
    stream.write_all(&line).await?;
    stream.write_all(b"\r\n").await?;
    stream.flush().await?;
    Ok(())
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(byte) => {
                        out.push(byte);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            byte => out.push(byte),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
