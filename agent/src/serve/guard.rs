//! Who may be answered: requests meant for this server, not ones a web page made a browser
//! send.
//!
//! The API serves every process's stacks without authentication, so it must not be readable
//! by a page the user happens to visit. Two browser attacks matter:
//!
//! - **DNS rebinding**: `evil.example` resolves to 127.0.0.1 after the page loaded, so the
//!   browser treats the API as same-origin. The request still carries `Host: evil.example`.
//!   Only requests whose `Host` names this server are answered: `localhost`, an IP literal (a
//!   page cannot make a browser send one for its own origin: rebinding needs a name), the name
//!   the server is bound to, or a name the operator allowed (`http-allowed-hosts`).
//! - **Cross-site requests**: a page that sends a request elsewhere gets `Sec-Fetch-Site:
//!   cross-site` from every current browser, and an `Origin` naming itself on anything but a
//!   simple GET. Either, when it does not name an allowed host, is refused.
//!
//! Non-browser clients (curl, Prometheus, `go tool pprof`) send neither header and a `Host`
//! that names the address they connected to, so they pass.

use std::net::{IpAddr, SocketAddr};

use axum::http::{header, HeaderMap};

/// Why a request was refused (a 403 with this text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no Host header")]
    NoHost,
    #[error("Host {0:?} is not this server's name; add it to http-allowed-hosts if it should be")]
    ForeignHost(String),
    #[error("cross-site request refused (Sec-Fetch-Site: cross-site)")]
    CrossSite,
    #[error("request from origin {0:?} refused: not this server's name")]
    ForeignOrigin(String),
}

/// The names a request may address this server by.
#[derive(Debug, Clone, Default)]
pub struct AllowedHosts {
    /// Lower-case host names, without ports.
    names: Vec<String>,
}

impl AllowedHosts {
    /// `localhost`, IP literals, the bound address's name, and `extra` (operator's names).
    pub fn new(bound: SocketAddr, extra: &[String]) -> AllowedHosts {
        let mut names = vec!["localhost".to_owned(), bound.ip().to_string()];
        names.extend(extra.iter().map(|n| n.trim().to_ascii_lowercase()));
        names.retain(|n| !n.is_empty());
        AllowedHosts { names }
    }

    /// Whether `host` (a `Host` header or an origin's host, with or without a port) is one.
    pub fn allows(&self, host: &str) -> bool {
        let name = strip_port(host.trim()).to_ascii_lowercase();
        if name.is_empty() {
            return false;
        }
        let bare = name.trim_start_matches('[').trim_end_matches(']');
        if bare.parse::<IpAddr>().is_ok() {
            return true;
        }
        // `localhost.` and `app.localhost` resolve to loopback in browsers, never to a page.
        let name = name.trim_end_matches('.');
        name == "localhost" || name.ends_with(".localhost") || self.names.iter().any(|n| n == name)
    }

    /// Checks a request's headers.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .ok_or(Refusal::NoHost)?;
        if !self.allows(host) {
            return Err(Refusal::ForeignHost(shorten(host)));
        }
        if let Some(site) = headers.get("sec-fetch-site").and_then(|h| h.to_str().ok()) {
            if site.trim().eq_ignore_ascii_case("cross-site") {
                return Err(Refusal::CrossSite);
            }
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("");
            // `null` is what sandboxed frames and file: pages send: never ours.
            let allowed = origin_host(origin).is_some_and(|h| self.allows(h));
            if !allowed {
                return Err(Refusal::ForeignOrigin(shorten(origin)));
            }
        }
        Ok(())
    }
}

/// `host` without a `:port`; IPv6 literals keep their brackets.
fn strip_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.find(']').map_or(host, |end| &host[..end + 2]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// The host of an `Origin` (`scheme://host[:port]`).
fn origin_host(origin: &str) -> Option<&str> {
    let (_, rest) = origin.split_once("://")?;
    Some(rest.split('/').next().unwrap_or(rest))
}

/// Header values are echoed in errors and logs; keep them short.
fn shorten(text: &str) -> String {
    text.chars().take(100).collect()
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn allowed() -> AllowedHosts {
        AllowedHosts::new(
            "127.0.0.1:7071".parse().unwrap(),
            &["scorch.node-1.internal".to_owned()],
        )
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn our_names_and_ip_literals_pass() {
        let hosts = allowed();
        for host in [
            "127.0.0.1:7071",
            "localhost:7071",
            "LOCALHOST",
            "[::1]:7071",
            "10.1.2.3:7071",
            "scorch.node-1.internal:7071",
            "ui.localhost",
        ] {
            assert_eq!(hosts.check(&headers(&[("host", host)])), Ok(()), "{host}");
        }
        // A same-origin request from the UI itself.
        assert_eq!(
            hosts.check(&headers(&[
                ("host", "localhost:7071"),
                ("origin", "http://localhost:7071"),
                ("sec-fetch-site", "same-origin"),
            ])),
            Ok(())
        );
    }

    #[test]
    fn rebinding_and_cross_site_requests_are_refused() {
        let hosts = allowed();
        assert_eq!(
            hosts.check(&headers(&[("host", "evil.example")])),
            Err(Refusal::ForeignHost("evil.example".into()))
        );
        assert_eq!(
            hosts.check(&headers(&[("host", "localhost.evil.example:7071")])),
            Err(Refusal::ForeignHost("localhost.evil.example:7071".into()))
        );
        assert_eq!(hosts.check(&HeaderMap::new()), Err(Refusal::NoHost));
        assert_eq!(
            hosts.check(&headers(&[
                ("host", "127.0.0.1:7071"),
                ("sec-fetch-site", "cross-site")
            ])),
            Err(Refusal::CrossSite)
        );
        assert_eq!(
            hosts.check(&headers(&[
                ("host", "127.0.0.1:7071"),
                ("origin", "https://evil.example")
            ])),
            Err(Refusal::ForeignOrigin("https://evil.example".into()))
        );
        assert!(hosts
            .check(&headers(&[("host", "127.0.0.1:7071"), ("origin", "null")]))
            .is_err());
    }
}
