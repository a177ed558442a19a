//! What a process's cgroup path says about it: its container, its systemd unit, its
//! Kubernetes pod. Pure functions of the text of `/proc/PID/cgroup`.

/// Facts read from a cgroup path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupFacts {
    /// The container id (64 hex digits) of docker, containerd, cri-o or podman.
    pub container_id: Option<String>,
    /// The innermost systemd service (`foo.service`), else the innermost scope that is not a
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
pub fn facts(path: &str) -> CgroupFacts {
    let mut facts = CgroupFacts::default();
    let mut scope = None;
    for component in path.split('/').filter(|c| !c.is_empty()) {
        if let Some(id) = container_id(component) {
            facts.container_id = Some(id.to_owned());
        } else if component.ends_with(".service") {
            facts.systemd_unit = Some(component.to_owned());
        } else if component.ends_with(".scope") {
            scope = Some(component);
        }
        if let Some(uid) = pod_uid(component) {
            facts.pod_uid = Some(uid);
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
