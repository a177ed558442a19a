//! One pod as the cache needs it, parsed from a pod list page or a watch event's object: its
//! names, labels and container ids, plus what the cache and the watch need besides (the node,
//! the static pod it mirrors, its resource version).

use super::{api, KubernetesError, PodMetadata};

/// One pod as parsed, before it goes into the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ParsedPod {
    pub(super) metadata: PodMetadata,
    /// For a mirror pod, the static pod's UID, which its cgroup carries.
    pub(super) mirror_of: Option<String>,
    /// `spec.nodeName`; empty while unscheduled.
    pub(super) node: String,
    pub(super) resource_version: String,
}

impl ParsedPod {
    /// Whether the pod runs here. The field selector already says so; checking again keeps
    /// the cache to this node even behind a proxy or server that ignored it.
    pub(super) fn is_on(&self, node: &str) -> bool {
        self.node == node
    }
}

/// One page of a pod list.
#[derive(Debug)]
pub(super) struct PodListPage {
    pub(super) pods: Vec<ParsedPod>,
    pub(super) resource_version: String,
    /// Set while more pages follow.
    pub(super) continue_token: Option<String>,
}

pub(super) fn parse_pod_list(body: &[u8]) -> Result<PodListPage, KubernetesError> {
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

pub(super) fn parsed_pod(pod: api::Pod, what: &'static str) -> Result<ParsedPod, KubernetesError> {
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

/// The pod fixtures are shared with the cache's and the watch's tests.
#[cfg(test)]
pub(super) mod tests {
    use std::collections::{BTreeMap, HashMap};

    use super::*;

    pub(crate) fn pod_json(uid: &str, name: &str, node: &str, version: &str) -> serde_json::Value {
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

    pub(crate) fn parsed(uid: &str, name: &str, node: &str, version: &str) -> ParsedPod {
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
}
