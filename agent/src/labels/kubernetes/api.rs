//! The API server's JSON objects, reduced to the fields labels need; serde skips the rest.

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

/// A Kubernetes `Status` object, as error answers and watch `ERROR` events carry it.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Status {
    #[serde(default)]
    pub code: u16,
    #[serde(default)]
    pub message: String,
}
