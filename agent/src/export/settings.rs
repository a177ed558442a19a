//! What a client needs to reach the remote server: the URL checked ([`endpoint`]: scheme,
//! TLS, no credentials in it), the secrets read from their files, the CA roots, and the HTTP
//! client built from them ([`ClientSettings`]).

use std::{path::Path, time::Duration};

use super::{RemoteCompression, RemoteConfig, SinkError};

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
    /// OTLP: the extra headers, in the order configured.
    pub headers: Vec<ExtraHeader>,
    /// OTLP: how requests are compressed.
    pub compression: RemoteCompression,
}

/// A header sent with every request (OTLP's `remote-headers`, `remote-header-files`).
#[derive(Debug, Clone)]
pub struct ExtraHeader {
    pub name: String,
    /// Kept as a [`Secret`] either way, so no header value is ever printed.
    pub value: Secret,
    /// Read from a file: marked sensitive on the wire too (HTTP/2 never indexes it).
    pub secret: bool,
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

    /// The credentials (`Authorization`, marked sensitive so nothing prints it) and tenant
    /// (`X-Scope-OrgID`) as HTTP headers, for the clients over HTTP. `protocol` names the
    /// client in errors.
    pub fn auth_headers(
        &self,
        protocol: &'static str,
    ) -> Result<reqwest::header::HeaderMap, SinkError> {
        use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION};
        let client_error = |message: String| SinkError::Client { protocol, message };
        let mut headers = HeaderMap::new();
        if let Some(value) = self.credentials.authorization() {
            let mut value = HeaderValue::from_str(&value).map_err(|_| {
                client_error("the credentials hold characters a header cannot carry".into())
            })?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        if let Some(tenant) = &self.tenant {
            let value = HeaderValue::from_str(tenant).map_err(|_| {
                client_error(format!("remote-tenant {tenant:?} is not a header value"))
            })?;
            headers.insert("x-scope-orgid", value);
        }
        Ok(headers)
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
        if !endpoint.tls
            && !matches!(credentials, Credentials::None)
            && !is_loopback(&endpoint.base)
        {
            // Allowed (a sidecar proxy may add TLS), but the secret crosses the network in
            // the clear: say so once, at start.
            tracing::warn!(
                "remote credentials are sent over plaintext http to {}: anyone on the path can \
                 read them; use https://",
                endpoint.base
            );
        }
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
        if !config.protocol.is_otlp()
            && (!config.headers.is_empty() || !config.header_files.is_empty())
        {
            return Err(SinkError::Config(format!(
                "remote-headers and remote-header-files are for the otlp protocols, not {}",
                config.protocol.name()
            )));
        }
        let mut headers: Vec<ExtraHeader> = config
            .headers
            .iter()
            .map(|(name, value)| ExtraHeader {
                name: name.clone(),
                value: Secret(value.clone()),
                secret: false,
            })
            .collect();
        for (name, path) in &config.header_files {
            headers.push(ExtraHeader {
                name: name.clone(),
                value: Secret::read("a remote header", path)?,
                secret: true,
            });
        }
        Ok(ClientSettings {
            endpoint,
            credentials,
            tenant: config.tenant.clone().filter(|t| !t.is_empty()),
            ca_pem,
            timeout: config.timeout,
            headers,
            compression: config.compression,
        })
    }
}

/// Whether `base` (`scheme://host:port/path`) names this machine, where plaintext stays local.
fn is_loopback(base: &str) -> bool {
    let host = base.split_once("://").map_or(base, |(_, rest)| rest);
    let host = host.split('/').next().unwrap_or(host);
    let host = match host.rsplit_once(':') {
        Some((name, port)) if !name.ends_with(']') || port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => host,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(is_loopback("http://127.0.0.1:4040"));
        assert!(is_loopback("http://localhost:4040/x"));
        assert!(is_loopback("http://[::1]:4040"));
        assert!(!is_loopback("http://parca:7070"));
        assert!(!is_loopback("http://10.0.0.1:7070"));
        let err = endpoint("https://user:pw@x", false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("credentials"), "{err}");
    }

    #[test]
    fn extra_headers_are_for_otlp_and_their_files_are_secrets() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api-key");
        std::fs::write(&path, "k3y-value\n").unwrap();
        let config = RemoteConfig {
            url: Some("http://127.0.0.1:4318".into()),
            protocol: crate::export::RemoteProtocol::OtlpHttp,
            headers: vec![("x-team".into(), "payments".into())],
            header_files: vec![("api-key".into(), path.clone())],
            ..RemoteConfig::default()
        };
        let settings = ClientSettings::new(&config).unwrap();
        let headers: Vec<_> = settings
            .headers
            .iter()
            .map(|h| (h.name.as_str(), h.value.expose(), h.secret))
            .collect();
        assert_eq!(
            headers,
            [
                ("x-team", "payments", false),
                ("api-key", "k3y-value", true)
            ]
        );
        assert!(!format!("{settings:?}").contains("k3y-value"));
        // Another protocol would ignore them: refused rather than silently dropped.
        let parca = RemoteConfig {
            protocol: crate::export::RemoteProtocol::Parca,
            ..config.clone()
        };
        assert!(matches!(
            ClientSettings::new(&parca),
            Err(SinkError::Config(_))
        ));
        std::fs::write(&path, "").unwrap();
        assert!(matches!(
            ClientSettings::new(&config),
            Err(SinkError::EmptySecret { .. })
        ));
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
}
