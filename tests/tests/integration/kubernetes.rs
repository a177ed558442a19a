//! Pod metadata from a fake Kubernetes API server on loopback over TLS (see
//! `scorch_tests::fake_kubernetes`): the in-cluster service account (token, CA) and the
//! `KUBERNETES_SERVICE_*`/`NODE_NAME` variables are honoured, only this node's pods are
//! listed, the watch keeps the cache current, and when the server goes away the cache keeps
//! answering while `reachable()` says so; when it is back, a 410 Gone makes the agent list again.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use scorch::labels::kubernetes::{Kubernetes, SERVICE_ACCOUNT_DIR_VARIABLE};
use scorch_tests::{
    fake_kubernetes::{pod, FakeKubernetes},
    work_dir,
};

const NODE: &str = "node-a";

/// Sets the in-cluster variables for the test and removes them when dropped, so later tests
/// in this process (and the daemons they start) do not inherit them.
struct ClusterEnvironment;

const VARIABLES: [&str; 4] = [
    "KUBERNETES_SERVICE_HOST",
    "KUBERNETES_SERVICE_PORT",
    "NODE_NAME",
    SERVICE_ACCOUNT_DIR_VARIABLE,
];

impl ClusterEnvironment {
    fn set(port: u16, service_account_dir: &std::path::Path) -> ClusterEnvironment {
        // The tests run one at a time (`--test-threads=1`), and nothing else in this
        // process reads these variables concurrently.
        std::env::set_var("KUBERNETES_SERVICE_HOST", "127.0.0.1");
        std::env::set_var("KUBERNETES_SERVICE_PORT", port.to_string());
        std::env::set_var("NODE_NAME", NODE);
        std::env::set_var(SERVICE_ACCOUNT_DIR_VARIABLE, service_account_dir);
        ClusterEnvironment
    }
}

impl Drop for ClusterEnvironment {
    fn drop(&mut self) {
        for variable in VARIABLES {
            std::env::remove_var(variable);
        }
    }
}

/// Waits until `condition` holds, polling; fails after `limit` naming `what`.
fn wait_until(limit: Duration, what: &str, mut condition: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + limit;
    while !condition() {
        ensure!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn label(kubernetes: &Kubernetes, uid: &str, name: &str) -> Option<String> {
    kubernetes.pod(uid)?.labels.get(name).cloned()
}

#[test]
fn pod_names_follow_the_api_server() -> Result<()> {
    let started = Instant::now();
    let service_account = work_dir().join("kubernetes-service-account");
    let _ = std::fs::remove_dir_all(&service_account);
    let mut server = FakeKubernetes::start(&service_account)?;
    server.put_pod(pod(
        "11111111-aaaa-4bbb-8ccc-000000000001",
        "shop",
        "checkout-7d9f",
        NODE,
        &[("app.kubernetes.io/name", "checkout"), ("version", "v1")],
        &[
            ("app", "containerd://aaaa0001"),
            ("sidecar", "containerd://aaaa0002"),
        ],
    ))?;
    server.put_pod(pod(
        "11111111-aaaa-4bbb-8ccc-000000000002",
        "shop",
        "cart-5c4b",
        NODE,
        &[("app", "cart")],
        &[("cart", "cri-o://bbbb0001")],
    ))?;
    server.put_pod(pod(
        "11111111-aaaa-4bbb-8ccc-000000000003",
        "shop",
        "elsewhere",
        "node-b",
        &[("app", "elsewhere")],
        &[("main", "containerd://cccc0001")],
    ))?;

    let environment = ClusterEnvironment::set(server.port, &service_account);
    let kubernetes = Kubernetes::from_environment()?.context("the variables say in a cluster")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let _entered = runtime.enter();
    assert!(!kubernetes.reachable(), "reachable before any request");
    kubernetes.start();

    let checkout = "11111111-aaaa-4bbb-8ccc-000000000001";
    wait_until(Duration::from_secs(5), "the node's pods listed", || {
        kubernetes.pod(checkout).is_some()
    })?;
    let listed = kubernetes.pod(checkout).context("listed")?;
    assert_eq!(
        (
            listed.namespace.as_str(),
            listed.name.as_str(),
            listed.uid.as_str()
        ),
        ("shop", "checkout-7d9f", checkout)
    );
    assert_eq!(
        label(&kubernetes, checkout, "app.kubernetes.io/name").as_deref(),
        Some("checkout")
    );
    assert_eq!(
        listed.containers.get("aaaa0001").map(String::as_str),
        Some("app")
    );
    assert_eq!(
        listed.containers.get("aaaa0002").map(String::as_str),
        Some("sidecar")
    );
    // systemd's cgroup names write the UID with underscores.
    assert!(kubernetes.pod(&checkout.replace('-', "_")).is_some());
    let cart = kubernetes
        .pod("11111111-aaaa-4bbb-8ccc-000000000002")
        .context("cart listed")?;
    assert_eq!(
        cart.containers.get("bbbb0001").map(String::as_str),
        Some("cart")
    );
    assert!(
        kubernetes
            .pod("11111111-aaaa-4bbb-8ccc-000000000003")
            .is_none(),
        "a pod of another node is cached"
    );
    assert!(kubernetes.reachable());
    assert_eq!(kubernetes.api_errors(), 0);

    // The watch: a label changes, a pod starts, a pod is deleted.
    server.put_pod(pod(
        checkout,
        "shop",
        "checkout-7d9f",
        NODE,
        &[("app.kubernetes.io/name", "checkout"), ("version", "v2")],
        &[
            ("app", "containerd://aaaa0001"),
            ("sidecar", "containerd://aaaa0002"),
        ],
    ))?;
    wait_until(Duration::from_secs(5), "the modified label", || {
        label(&kubernetes, checkout, "version").as_deref() == Some("v2")
    })?;
    let search = "11111111-aaaa-4bbb-8ccc-000000000004";
    server.put_pod(pod(
        search,
        "shop",
        "search-0",
        NODE,
        &[("app", "search")],
        &[],
    ))?;
    wait_until(Duration::from_secs(5), "the added pod", || {
        kubernetes.pod(search).is_some()
    })?;
    server.delete_pod("11111111-aaaa-4bbb-8ccc-000000000002")?;
    wait_until(Duration::from_secs(5), "the deleted pod gone", || {
        kubernetes
            .pod("11111111-aaaa-4bbb-8ccc-000000000002")
            .is_none()
    })?;
    // Events of other nodes' pods are not sent to this node's watch, nor cached.
    server.put_pod(pod(
        "11111111-aaaa-4bbb-8ccc-000000000005",
        "shop",
        "elsewhere-2",
        "node-b",
        &[],
        &[],
    ))?;

    // All of that came through one watch, not through lists again.
    let lists = |server: &FakeKubernetes| {
        server
            .requests()
            .iter()
            .filter(|request| !request.target.contains("watch=1"))
            .count()
    };
    assert_eq!(lists(&server), 1, "requests: {:?}", server.requests());
    assert_eq!(kubernetes.api_errors(), 0);

    // The API server goes away: lookups keep answering from the cache.
    server.stop();
    wait_until(Duration::from_secs(5), "reachable() turning false", || {
        !kubernetes.reachable()
    })?;
    assert!(kubernetes.api_errors() > 0);
    assert_eq!(
        label(&kubernetes, checkout, "version").as_deref(),
        Some("v2"),
        "the cache lost a pod while the API server was away"
    );
    assert_eq!(kubernetes.pod_count(), 2);

    // While it is away, pods change and its history is compacted: the watch's version is
    // gone, so the agent must list again to see the changes.
    server.delete_pod(search)?;
    let recommendations = "11111111-aaaa-4bbb-8ccc-000000000006";
    server.put_pod(pod(
        recommendations,
        "shop",
        "recommendations-0",
        NODE,
        &[("app", "recommendations")],
        &[("main", "containerd://dddd0001")],
    ))?;
    server.forget_history();
    server.restart()?;
    wait_until(Duration::from_secs(10), "reachable again, relisted", || {
        kubernetes.reachable()
            && kubernetes.pod(recommendations).is_some()
            && kubernetes.pod(search).is_none()
    })?;
    assert_eq!(kubernetes.pod_count(), 2);

    let requests = server.requests();
    ensure!(requests.len() >= 4, "requests: {requests:?}");
    for request in &requests {
        ensure!(
            request.authorized,
            "a request without the token: {request:?}"
        );
        ensure!(
            request
                .target
                .contains("fieldSelector=spec.nodeName%3Dnode-a"),
            "a request for more than this node's pods: {request:?}"
        );
    }
    ensure!(
        lists(&server) >= 2,
        "no relist after 410 Gone: {requests:?}"
    );

    // Outside a cluster it is off, without an error.
    drop(environment);
    ensure!(Kubernetes::from_environment()?.is_none());
    for request in &requests {
        eprintln!("{}", request.target);
    }
    eprintln!("took {:?}", started.elapsed());
    Ok(())
}

/// End to end: a process in a kubelet-shaped cgroup, profiled by `scorch run` in a "cluster"
/// (the fake API server), is stored with its namespace, pod, container and service name; the
/// API server going away does not stop profiling.
#[test]
fn the_daemon_names_pods_from_the_api_server() -> Result<()> {
    use scorch_tests::{build_workload, Cgroup, Daemon, Workload};

    const UID: &str = "7a6b5c4d-3e2f-4a1b-9c8d-7e6f5a4b3c2d";
    const CONTAINER: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90";
    let unified = std::path::Path::new("/sys/fs/cgroup/unified");
    ensure!(
        unified.join("cgroup.procs").exists(),
        "this test needs the unified cgroup tree at {}",
        unified.display()
    );
    let account = work_dir().join("daemon-service-account");
    std::fs::create_dir_all(&account)?;
    let mut server = FakeKubernetes::start(&account)?;
    server.put_pod(pod(
        UID,
        "shop",
        "checkout-1",
        NODE,
        &[("app.kubernetes.io/name", "checkout"), ("tier", "web")],
        &[("app", &format!("containerd://{CONTAINER}"))],
    ))?;
    let _cluster = ClusterEnvironment::set(server.port, &account);

    let program = build_workload("calltree", &["-O2", "-fno-omit-frame-pointer"])?;
    let copy = work_dir().join("podproc");
    std::fs::copy(&program, &copy)?;
    let workload = Workload::start(&copy, &["1", "60"])?;
    let cgroup = Cgroup::create(
        unified,
        &format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CONTAINER}.scope",
            UID.replace('-', "_")
        ),
    )?;
    cgroup.add(workload.pid())?;

    let store = work_dir().join("kubernetes-store");
    let _ = std::fs::remove_dir_all(&store);
    let config = work_dir().join("kubernetes-relabel.toml");
    std::fs::write(
        &config,
        "[[relabel]]\nregex = \"__meta_kubernetes_pod_label_(.+)\"\naction = \"labelmap\"\n",
    )?;
    let daemon = Daemon::start(
        &store,
        &["--window", "1s", "--config", &config.to_string_lossy()],
    )?;
    std::thread::sleep(Duration::from_secs(3));
    // The API server goes away: profiling goes on with the names already known.
    server.stop();
    let (_, metrics) = scorch_tests::http_get(&daemon.address, "/metrics")?;
    std::thread::sleep(Duration::from_secs(2));
    let (status, _, stderr) = daemon.stop()?;
    ensure!(status.success(), "{stderr}");
    let pid = workload.pid().to_string();
    drop(workload);

    let range = scorch::store::TimeRange {
        from: std::time::UNIX_EPOCH,
        to: std::time::SystemTime::now() + Duration::from_secs(60),
    };
    let reader = scorch::store::Store::open_read_only(&store)?;
    let series: Vec<_> = reader
        .series(range, scorch::store::SampleKind::Cpu)?
        .into_iter()
        .filter(|l| l.get("pid") == Some(&pid))
        .collect();
    ensure!(!series.is_empty(), "no series for the pod's process");
    let labels = &series[0];
    ensure!(labels["namespace"] == "shop", "{labels:?}");
    ensure!(labels["pod"] == "checkout-1", "{labels:?}");
    ensure!(labels["container"] == "app", "{labels:?}");
    ensure!(labels["container_id"] == CONTAINER, "{labels:?}");
    ensure!(labels["service_name"] == "checkout", "{labels:?}");
    // labelmap turned the pod's labels into series labels.
    ensure!(labels["tier"] == "web", "{labels:?}");
    ensure!(labels["app_kubernetes_io_name"] == "checkout", "{labels:?}");
    let metrics = String::from_utf8(metrics)?;
    ensure!(
        metrics.contains("scorch_kubernetes_api_up"),
        "no API metric:\n{metrics}"
    );
    // Windows kept being written after the server went away.
    let (windows, _, newest) = reader.windows()?;
    ensure!(windows >= 4, "{windows} windows");
    ensure!(
        newest.is_some_and(|t| t.elapsed().unwrap_or_default() < Duration::from_secs(30)),
        "no recent window"
    );
    Ok(())
}
