//! The cache of this node's pods that lookups read: filled whole by a list, then kept
//! current one watch event at a time, so a lookup never waits on the API server.

use std::collections::HashMap;

use tracing::debug;

use super::{pod::ParsedPod, watch::WatchEvent, KubernetesError, PodMetadata};

/// The pods of this node by UID, plus the cgroup UIDs of static pods.
#[derive(Debug, Default)]
pub(super) struct PodCache {
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
    pub(super) fn from_pods(pods: Vec<ParsedPod>) -> PodCache {
        let mut cache = PodCache::default();
        for pod in pods {
            cache.upsert(pod);
        }
        cache
    }

    pub(super) fn len(&self) -> usize {
        self.pods.len()
    }

    pub(super) fn get(&self, uid: &str) -> Option<&PodMetadata> {
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
    pub(super) fn apply(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::kubernetes::pod::{
        parsed_pod,
        tests::{parsed, pod_json},
    };

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
}
