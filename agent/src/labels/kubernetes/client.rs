//! Talking to the API server: where it is (the in-cluster environment and service account),
//! the HTTPS client that trusts only the cluster's CA, the requests for this node's pods, and
//! what an error answer says.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use reqwest::{StatusCode, Url};
use tracing::debug;

use super::{
    api::Status, KubernetesError, Shared, SERVICE_ACCOUNT_DIR, SERVICE_ACCOUNT_DIR_VARIABLE,
};

/// Pods per list page: a node runs about a hundred, so one page is the common case while a
/// crowded node still never makes the API server build one huge answer.
const LIST_PAGE_SIZE: u32 = 500;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Watches end on the server after a random 5 to 10 minutes (client-go's choice), so that
/// agents on all nodes do not reconnect in step and a stuck watch cannot last forever.
pub(super) const WATCH_SECONDS: std::ops::Range<u64> = 300..600;

/// Longest silence on a connection: a watch may legitimately see no event for its whole
/// length, so this is the longest watch plus a margin. TCP keepalive finds dead peers sooner.
const READ_TIMEOUT: Duration = Duration::from_secs(660);

/// Where the API server is and how to talk to it, from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ApiServer {
    /// `https://host:port/api/v1/pods`.
    pub(super) pods_url: Url,
    /// The service-account token file, read for every request.
    pub(super) token_path: PathBuf,
    pub(super) node: String,
}

/// The API server and the CA file from environment variables (`variable`) and the
/// service-account directory; `None` outside a cluster.
pub(super) fn api_server_from(
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
pub(super) fn pods_url(host: &str, port: u16) -> Result<Url, KubernetesError> {
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
pub(super) enum PodsRequest<'a> {
    List {
        continue_token: Option<&'a str>,
    },
    Watch {
        resource_version: &'a str,
        timeout_seconds: u64,
    },
}

impl ApiServer {
    pub(super) fn url(&self, request: PodsRequest<'_>) -> Url {
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

/// The HTTPS client for the API server, trusting the CA certificates in `ca_path`.
pub(super) fn http_client(ca_path: &Path) -> Result<reqwest::Client, KubernetesError> {
    let ca = std::fs::read(ca_path).map_err(|source| KubernetesError::Read {
        path: ca_path.to_path_buf(),
        source,
    })?;
    let certificates = reqwest::Certificate::from_pem_bundle(&ca).map_err(|source| {
        KubernetesError::Certificate {
            path: ca_path.to_path_buf(),
            source,
        }
    })?;
    if certificates.is_empty() {
        return Err(KubernetesError::NoCertificate {
            path: ca_path.to_path_buf(),
        });
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
    client.build().map_err(KubernetesError::Client)
}

impl Shared {
    /// A GET with the current token.
    pub(super) fn request(
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
pub(super) async fn successful(
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

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
