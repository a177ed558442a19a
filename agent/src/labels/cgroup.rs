//! What a process's cgroup path says about it: its container, its systemd unit, its
//! Kubernetes pod. Pure functions of the text of `/proc/PID/cgroup`.

/// Facts read from a cgroup path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupFacts {
    /// The container id (64 hex digits) of docker, containerd, cri-o or podman.
    pub container_id: Option<String>,
    /// The outermost systemd service (`foo.service`), else the outermost scope that is not a
    /// container's.
    pub systemd_unit: Option<String>,
    /// The Kubernetes pod UID, with dashes as the API writes it.
    pub pod_uid: Option<String>,
}

/// The cgroup path that describes the process best, from `/proc/PID/cgroup`: the unified (v2)
/// path when it says more than `/`, else the v1 `name=systemd` hierarchy, else the first v1
/// controller with a path below the root. Hybrid hosts (v1 controllers beside a unified tree)
/// put the useful path in different places depending on the container runtime.
pub fn process_cgroup(text: &str) -> Option<String> {
    let mut unified = None;
    let mut systemd = None;
    let mut controller = None;
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            unified = Some(path);
        } else if controllers == "name=systemd" {
            systemd = Some(path);
        } else if controller.is_none() && path != "/" && !controllers.is_empty() {
            controller = Some(path);
        }
    }
    let informative = |p: &&str| *p != "/" && !p.is_empty();
    unified
        .filter(informative)
        .or(systemd.filter(informative))
        .or(controller)
        .or(unified)
        .or(systemd)
        .map(str::to_owned)
}

/// Reads what the path's components name.
///
/// Only the outermost unit, container and pod count. A unit or a container may have its
/// subtree delegated to the processes inside it (`user@1000.service`, a container allowed to
/// write its cgroup), and those processes can create cgroups named like any other unit,
/// container or pod: taking the innermost name would let them wear another workload's labels
/// and slip past the keep/drop rules written for it. A pod counts only inside the kubelet's
/// `kubepods` hierarchy and above any delegation point.
pub fn facts(path: &str) -> CgroupFacts {
    let mut facts = CgroupFacts::default();
    let mut scope = None;
    // A unit or container was met: what lies below may be named by its tenant.
    let mut delegated = false;
    let mut in_kubepods = false;
    for component in path.split('/').filter(|c| !c.is_empty()) {
        in_kubepods |= !delegated && component.contains("kubepods");
        if in_kubepods && !delegated && facts.pod_uid.is_none() {
            if let Some(uid) = pod_uid(component) {
                facts.pod_uid = Some(uid);
                continue;
            }
        }
        if let Some(id) = container_id(component) {
            facts.container_id.get_or_insert_with(|| id.to_owned());
            delegated = true;
        } else if component.ends_with(".service") {
            facts
                .systemd_unit
                .get_or_insert_with(|| component.to_owned());
            delegated = true;
        } else if component.ends_with(".scope") {
            scope.get_or_insert(component);
            delegated = true;
        }
    }
    if facts.systemd_unit.is_none() {
        facts.systemd_unit = scope.map(str::to_owned);
    }
    facts
}

/// The container id in one path component: `docker-<id>.scope`, `cri-containerd-<id>.scope`,
/// `crio-<id>.scope`, `libpod-<id>.scope` (systemd cgroup driver) or a bare `<id>` (cgroupfs
/// driver: `/docker/<id>`, `/kubepods/burstable/pod<uid>/<id>`).
fn container_id(component: &str) -> Option<&str> {
    let id = match component.strip_suffix(".scope") {
        Some(scope) => ["docker-", "cri-containerd-", "crio-", "libpod-"]
            .iter()
            .find_map(|prefix| scope.strip_prefix(prefix))?,
        None => component,
    };
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// The pod UID in one path component: `kubepods-burstable-pod<uid>.slice` (systemd driver,
/// dashes written as underscores) or `pod<uid>` (cgroupfs driver).
fn pod_uid(component: &str) -> Option<String> {
    let uid = match component.strip_suffix(".slice") {
        Some(slice) => slice.rsplit_once("-pod")?.1.replace('_', "-"),
        None => component.strip_prefix("pod")?.to_owned(),
    };
    let shaped = uid.len() == 36
        && uid.bytes().enumerate().all(|(i, b)| {
            matches!(i, 8 | 13 | 18 | 23) == (b == b'-') && (b == b'-' || b.is_ascii_hexdigit())
        });
    shaped.then_some(uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const UID: &str = "6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9";

    #[test]
    fn reads_units_containers_and_pods() {
        assert_eq!(
            facts("/system.slice/nginx.service"),
            CgroupFacts {
                systemd_unit: Some("nginx.service".into()),
                ..CgroupFacts::default()
            }
        );
        let docker = facts(&format!("/system.slice/docker-{ID}.scope"));
        assert_eq!(docker.container_id.as_deref(), Some(ID));
        assert_eq!(docker.systemd_unit, None);
        assert_eq!(
            facts(&format!("/docker/{ID}")).container_id.as_deref(),
            Some(ID)
        );
        let kubelet = facts(&format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{ID}.scope",
            UID.replace('-', "_")
        ));
        assert_eq!(kubelet.container_id.as_deref(), Some(ID));
        assert_eq!(kubelet.pod_uid.as_deref(), Some(UID));
        let cgroupfs = facts(&format!("/kubepods/besteffort/pod{UID}/{ID}"));
        assert_eq!(cgroupfs.pod_uid.as_deref(), Some(UID));
        assert_eq!(cgroupfs.container_id.as_deref(), Some(ID));
        assert_eq!(
            facts(&format!("/machine.slice/libpod-{ID}.scope/container"))
                .container_id
                .as_deref(),
            Some(ID)
        );
        assert_eq!(
            facts(&format!("/system.slice/crio-{ID}.scope"))
                .container_id
                .as_deref(),
            Some(ID)
        );
        assert_eq!(
            facts("/user.slice/user-0.slice/session-3.scope")
                .systemd_unit
                .as_deref(),
            Some("session-3.scope")
        );
        // Look-alikes are not ids.
        assert_eq!(facts("/docker/abc").container_id, None);
        assert_eq!(facts("/kubepods-podnotauid.slice").pod_uid, None);
    }

    #[test]
    fn nested_cgroups_cannot_take_another_identity() {
        let other = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";
        let victim_pod = UID.replace('-', "_");
        // Inside a real container, a nested cgroup named like another pod and container.
        let nested = facts(&format!(
            "/kubepods.slice/kubepods-pod{victim_pod}.slice/cri-containerd-{ID}.scope/\
             kubepods-pod0a1e2d3c_4b5a_4978_8695_a4b3c2d1e0f9.slice/cri-containerd-{other}.scope"
        ));
        assert_eq!(nested.pod_uid.as_deref(), Some(UID));
        assert_eq!(nested.container_id.as_deref(), Some(ID));
        // A user's delegated subtree, named like a pod: no pod at all.
        let user = facts(&format!(
            "/user.slice/user-1000.slice/user@1000.service/kubepods-pod{victim_pod}.slice/\
             cri-containerd-{ID}.scope"
        ));
        assert_eq!(user.pod_uid, None);
        assert_eq!(user.systemd_unit.as_deref(), Some("user@1000.service"));
        // A unit named like a system service inside a user's manager stays the user's.
        let unit = facts("/user.slice/user-1000.slice/user@1000.service/app.slice/sshd.service");
        assert_eq!(unit.systemd_unit.as_deref(), Some("user@1000.service"));
        // A container nested in another container keeps the outer id.
        let docker = facts(&format!(
            "/system.slice/docker-{ID}.scope/docker-{other}.scope"
        ));
        assert_eq!(docker.container_id.as_deref(), Some(ID));
        // kind-style kubelet roots still name pods.
        let kind = facts(&format!(
            "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/\
             kubelet-kubepods-besteffort-pod{victim_pod}.slice/cri-containerd-{ID}.scope"
        ));
        assert_eq!(kind.pod_uid.as_deref(), Some(UID));
    }

    #[test]
    fn picks_the_informative_hierarchy() {
        // Unified only.
        assert_eq!(
            process_cgroup("0::/system.slice/sshd.service\n").as_deref(),
            Some("/system.slice/sshd.service")
        );
        // Hybrid: the unified path is the root, systemd's v1 hierarchy has the unit.
        let hybrid = "12:cpu,cpuacct:/\n1:name=systemd:/system.slice/cron.service\n0::/\n";
        assert_eq!(
            process_cgroup(hybrid).as_deref(),
            Some("/system.slice/cron.service")
        );
        // A v1 controller only.
        assert_eq!(
            process_cgroup("4:memory:/docker/x\n3:cpu:/\n").as_deref(),
            Some("/docker/x")
        );
        assert_eq!(process_cgroup("0::/\n").as_deref(), Some("/"));
        assert_eq!(process_cgroup("garbage"), None);
    }
}
