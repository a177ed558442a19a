//! The background task, client-go's reflector protocol: list this node's pods (paginated) into
//! the cache, then watch from the list's resource version, resuming where a watch ended and
//! listing again when the version is too old; the watch stream cut into lines and decoded
//! into events.

use std::{
    sync::{Arc, PoisonError},
    time::{Duration, Instant},
};

use reqwest::StatusCode;
use tracing::debug;

use super::{
    api::{self, Status},
    cache::PodCache,
    client::{successful, PodsRequest, WATCH_SECONDS},
    pod::{parse_pod_list, parsed_pod, ParsedPod},
    KubernetesError, Shared,
};
use crate::sys::backoff::Backoff;

/// A whole list page, including its body; far above what a node's pods take.
const LIST_TIMEOUT: Duration = Duration::from_secs(60);

/// One watch event is one object; etcd refuses objects over 1.5 MiB, so anything this long is
/// a broken stream, not a pod.
const MAX_EVENT_BYTES: usize = 16 << 20;

/// Backoff between failed attempts: client-go's reflector uses 800 ms up to 30 s.
const BACKOFF_INITIAL: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// A watch that ends sooner than this without an error is still followed by a backoff, so a
/// server that closes every watch at once cannot make the agent spin.
const SHORTEST_WATCH: Duration = Duration::from_secs(1);

/// The background task: list, then watch for as long as the agent runs.
pub(super) async fn list_and_watch(shared: Arc<Shared>) {
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
}

/// One watch event, parsed.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum WatchEvent {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::kubernetes::pod::tests::{parsed, pod_json};

    fn event(kind: &str, object: serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({"type": kind, "object": object}))
            .expect("serialisable")
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
}
