//! Labels: what each profile belongs to.
//!
//! discover (/proc, cgroup path, Kubernetes API) -> `__meta_*` labels + defaults
//!   -> relabel (the config's rules) -> the series' labels, or "dropped"
//!
//! The outcome is computed once per process (a pid is checked against its start time, so a
//! reused pid is a new process) and kept until the process exits. A dropped process is also
//! pushed into the BPF program's filter by the daemon, so it stops costing stack walks.

pub mod cgroup;
pub mod kubernetes;
pub mod relabel;

use std::{collections::HashMap, sync::Arc};

use crate::profile::{Labels, THREAD_ID_LABEL, THREAD_LABEL};
use relabel::{Outcome, Rule};

/// The host's name: `NODE_NAME` (set from the downward API in Kubernetes), else the kernel's.
pub fn node_name() -> String {
    std::env::var("NODE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(crate::sys::fs::hostname)
}

/// What is known about a process, as `__meta_*` labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessFacts {
    pub pid: u32,
    pub comm: String,
    /// Path of the executable, as the process's mount namespace names it.
    pub executable: Option<String>,
    pub cgroup: Option<String>,
    pub cgroup_facts: cgroup::CgroupFacts,
}

impl ProcessFacts {
    /// Reads `/proc/PID/{comm,exe,cgroup}`. A process that has exited reads as mostly empty.
    pub fn read(pid: u32) -> ProcessFacts {
        let proc = format!("/proc/{pid}");
        let comm = std::fs::read_to_string(format!("{proc}/comm"))
            .map(|c| c.trim_end().to_owned())
            .unwrap_or_default();
        let executable = std::fs::read_link(format!("{proc}/exe"))
            .ok()
            .map(|p| p.to_string_lossy().into_owned());
        let cgroup = std::fs::read_to_string(format!("{proc}/cgroup"))
            .ok()
            .and_then(|text| cgroup::process_cgroup(&text));
        let cgroup_facts = cgroup.as_deref().map(cgroup::facts).unwrap_or_default();
        ProcessFacts {
            pid,
            comm,
            executable,
            cgroup,
            cgroup_facts,
        }
    }
}

/// Kubernetes names of a process's pod and container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodFacts {
    pub namespace: String,
    pub pod: String,
    pub container: Option<String>,
    pub labels: Labels,
}

/// The discovered labels: `__meta_*` for relabelling rules to read, and the defaults a series
/// gets when no rule changes them (`node`, `comm`, `pid`, `executable`, `cgroup`,
/// `container_id`, `systemd_unit`, `namespace`, `pod`, `container`, `service_name`).
pub fn discovered_labels(node: &str, process: &ProcessFacts, pod: Option<&PodFacts>) -> Labels {
    let mut labels = Labels::new();
    let mut put = |meta: &str, default: Option<&str>, value: Option<&str>| {
        if let Some(value) = value.filter(|v| !v.is_empty()) {
            labels.insert(format!("__meta_{meta}"), value.to_owned());
            if let Some(default) = default {
                labels.insert(default.to_owned(), value.to_owned());
            }
        }
    };
    let pid = process.pid.to_string();
    put("node", Some("node"), Some(node));
    put("process_comm", Some("comm"), Some(&process.comm));
    put("process_pid", Some("pid"), Some(&pid));
    put(
        "process_executable",
        Some("executable"),
        process.executable.as_deref(),
    );
    put("process_cgroup", Some("cgroup"), process.cgroup.as_deref());
    let facts = &process.cgroup_facts;
    put(
        "container_id",
        Some("container_id"),
        facts.container_id.as_deref(),
    );
    put(
        "systemd_unit",
        Some("systemd_unit"),
        facts.systemd_unit.as_deref(),
    );
    put("kubernetes_pod_uid", None, facts.pod_uid.as_deref());
    if let Some(pod) = pod {
        put(
            "kubernetes_namespace",
            Some("namespace"),
            Some(&pod.namespace),
        );
        put("kubernetes_pod_name", Some("pod"), Some(&pod.pod));
        put(
            "kubernetes_pod_container_name",
            Some("container"),
            pod.container.as_deref(),
        );
        for (name, value) in &pod.labels {
            put(
                &format!(
                    "kubernetes_pod_label_{}",
                    relabel::sanitize_label_chars(name)
                ),
                None,
                Some(value),
            );
        }
    }
    // Pyroscope's application name: the pod's app label, else the unit, else the command.
    let service = pod
        .and_then(|p| {
            p.labels
                .get("app.kubernetes.io/name")
                .or_else(|| p.labels.get("app"))
        })
        .map(String::as_str)
        .or(facts
            .systemd_unit
            .as_deref()
            .filter(|u| u.ends_with(".service")))
        .unwrap_or(&process.comm);
    if !service.is_empty() {
        labels.insert("service_name".to_owned(), service.to_owned());
    }
    labels
}

/// Names a pod from its UID and a container id (from the cgroup path).
type PodLookup = Box<dyn Fn(&str, Option<&str>) -> Option<PodFacts> + Send>;

/// The meta label of a sample's thread name, for relabelling rules (the series get it as
/// `profile::THREAD_LABEL`, `thread`).
pub const THREAD_META: &str = "__meta_thread";
/// The meta label of a sample's thread id, with `thread-ids` on (`thread_id` on the series).
pub const THREAD_ID_META: &str = "__meta_thread_id";

/// The labels a thread adds to its process's discovered ones, meta and default, which
/// rules may read: what `relabel::dependent_rules` follows.
const THREAD_SOURCES: [&str; 4] = [THREAD_META, THREAD_ID_META, THREAD_LABEL, THREAD_ID_LABEL];

/// Thread outcomes kept per process: past it they are computed afresh. A process's threads
/// per window are capped (`pipeline::aggregate::MAX_THREADS_PER_PROCESS`), but a process
/// naming a thread per job meets new names for its whole life.
const MAX_THREAD_OUTCOMES: usize = 1024;

/// What the cache keeps of a process.
struct CachedProcess {
    /// Tells a reused pid or an exec apart from the process judged.
    identity: Identity,
    /// The discovered labels: each thread is relabelled from them, with its own added.
    discovered: Arc<Labels>,
    outcome: Arc<Outcome>,
    /// By (thread name, thread id): each thread's outcome.
    threads: HashMap<(String, Option<u32>), Arc<Outcome>>,
}

/// Labels per process: discovery, relabelling and external labels, cached per process.
pub struct Labeler {
    node: String,
    rules: Vec<Rule>,
    /// For each rule, whether it depends on a thread's labels (`relabel::dependent_rules`).
    thread_rules: Vec<bool>,
    external: Labels,
    /// pid -> what was judged. The start time tells a reused pid apart, the name an exec (a
    /// child forked, sampled and judged by its parent's name before it ran its own program;
    /// the BPF deny list forgets a process at exec for the same reason).
    cache: HashMap<u32, CachedProcess>,
    /// Resolves a pod UID and container id to names, when running in Kubernetes.
    pods: Option<PodLookup>,
    /// Invalid label names rules produced, reported once per rule.
    reported: std::collections::HashSet<(usize, String)>,
}

impl Labeler {
    pub fn new(node: String, rules: Vec<Rule>, external: Labels) -> Labeler {
        Labeler {
            node,
            thread_rules: relabel::dependent_rules(&rules, &THREAD_SOURCES),
            rules,
            external,
            cache: HashMap::new(),
            pods: None,
            reported: Default::default(),
        }
    }

    /// Whether a rule reads a thread's labels (`__meta_thread`, `thread`, and their ids):
    /// then a thread may be dropped while its process is kept.
    pub fn reads_threads(&self) -> bool {
        self.thread_rules.iter().any(|&dependent| dependent)
    }

    /// Names pods: `lookup(pod_uid, container_id)`.
    pub fn with_pods(
        mut self,
        lookup: impl Fn(&str, Option<&str>) -> Option<PodFacts> + Send + 'static,
    ) -> Labeler {
        self.pods = Some(Box::new(lookup));
        self
    }

    /// Whether any rule can drop a process (then the BPF filter is worth maintaining).
    pub fn can_drop(&self) -> bool {
        self.rules
            .iter()
            .any(|r| matches!(r.action, relabel::Action::Keep | relabel::Action::Drop))
    }

    /// The outcome for `pid`: computed on first sight, then cached until the process exits or
    /// runs another program. When rules read a thread's labels, `Dropped` means every thread
    /// of the process is dropped, and `Keep` that [`Labeler::thread_outcome`] decides.
    pub fn outcome(&mut self, pid: u32) -> Arc<Outcome> {
        self.process(pid).0
    }

    /// The outcome for one thread of `pid` (its name, and its id with `thread-ids`): dropped
    /// with its process; otherwise the rules applied to the process's discovered labels with
    /// the thread's added, `__meta_thread` and `thread` (and `__meta_thread_id` and
    /// `thread_id`), so rules can rename or remove `thread` as any other label. Cached with
    /// the process: call [`Labeler::outcome`] first in a window, which checks that the pid is
    /// still the process judged.
    pub fn thread_outcome(&mut self, pid: u32, name: &str, id: Option<u32>) -> Arc<Outcome> {
        let (process, discovered) = match self.cache.get(&pid) {
            Some(cached) => {
                let key = (name.to_owned(), id);
                if let Some(outcome) = cached.threads.get(&key) {
                    return outcome.clone();
                }
                (cached.outcome.clone(), cached.discovered.clone())
            }
            None => self.process(pid),
        };
        if matches!(*process, Outcome::Dropped { .. }) {
            return process;
        }
        let mut labels = (*discovered).clone();
        if !name.is_empty() {
            labels.insert(THREAD_META.to_owned(), name.to_owned());
            labels.insert(THREAD_LABEL.to_owned(), name.to_owned());
        }
        if let Some(id) = id {
            labels.insert(THREAD_ID_META.to_owned(), id.to_string());
            labels.insert(THREAD_ID_LABEL.to_owned(), id.to_string());
        }
        let mut invalid = Vec::new();
        let outcome = relabel::relabel(labels, &self.rules, &mut invalid);
        let outcome = self.finish(outcome, invalid);
        if let Some(cached) = self.cache.get_mut(&pid) {
            if cached.threads.len() >= MAX_THREAD_OUTCOMES {
                cached.threads.clear();
            }
            cached
                .threads
                .insert((name.to_owned(), id), outcome.clone());
        }
        outcome
    }

    /// The process's outcome and its discovered labels.
    fn process(&mut self, pid: u32) -> (Arc<Outcome>, Arc<Labels>) {
        let identity = Identity::read(pid);
        let started = identity.started;
        if let Some(cached) = self.cache.get(&pid) {
            // An exited process (start 0) keeps what was computed while it ran.
            if started == 0 || cached.identity == identity {
                return (cached.outcome.clone(), cached.discovered.clone());
            }
        }
        let process = ProcessFacts::read(pid);
        let pod = match (&self.pods, &process.cgroup_facts.pod_uid) {
            (Some(lookup), Some(uid)) => lookup(uid, process.cgroup_facts.container_id.as_deref()),
            _ => None,
        };
        let labels = discovered_labels(&self.node, &process, pod.as_ref());
        let discovered = Arc::new(labels.clone());
        let mut invalid = Vec::new();
        // Without a thread's labels, and with the rules that read them skipped: what drops
        // the process drops all its threads (see `relabel::dependent_rules`).
        let outcome =
            relabel::relabel_skipping(labels, &self.rules, &self.thread_rules, &mut invalid);
        let outcome = self.finish(outcome, invalid);
        // A process seen without a start time has exited: do not cache a guess. Nor labels a
        // pod's watch event has not completed yet (a container starts a moment before the
        // API server reports its id): the next window asks again.
        let pod_pending = self.pods.is_some()
            && process.cgroup_facts.pod_uid.is_some()
            && pod.as_ref().is_none_or(|p| {
                p.container.is_none() && process.cgroup_facts.container_id.is_some()
            });
        if started != 0 && !pod_pending {
            self.cache.insert(
                pid,
                CachedProcess {
                    identity,
                    discovered: discovered.clone(),
                    outcome: outcome.clone(),
                    threads: HashMap::new(),
                },
            );
        }
        (outcome, discovered)
    }

    /// A relabelled outcome with the external labels added; the invalid labels the rules
    /// produced are logged, once per rule and name.
    fn finish(&mut self, outcome: Outcome, invalid: Vec<relabel::InvalidLabel>) -> Arc<Outcome> {
        for label in invalid {
            if self.reported.insert((label.rule, label.name.clone())) {
                tracing::warn!("{label}");
            }
        }
        Arc::new(match outcome {
            Outcome::Keep(mut labels) => {
                for (name, value) in &self.external {
                    labels.insert(name.clone(), value.clone());
                }
                Outcome::Keep(labels)
            }
            dropped => dropped,
        })
    }

    /// Forgets processes that have exited; returns their pids.
    pub fn forget_exited(&mut self) -> Vec<u32> {
        let exited: Vec<u32> = self
            .cache
            .keys()
            .copied()
            .filter(|pid| Identity::read(*pid).started == 0)
            .collect();
        for pid in &exited {
            self.cache.remove(pid);
        }
        exited
    }
}

/// What tells one program run by a pid from another: the process's start time (field 22 of
/// /proc/PID/stat, clock ticks since boot; 0 when gone) and its name (field 2, which an exec
/// sets), from one read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Identity {
    started: u64,
    comm: String,
}

impl Identity {
    fn read(pid: u32) -> Identity {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| Identity::parse(&stat))
            .unwrap_or_default()
    }

    /// From the text of /proc/PID/stat. The name may hold spaces and parentheses: it runs
    /// from the first `(` to the last `)`.
    fn parse(stat: &str) -> Option<Identity> {
        let (head, rest) = stat.rsplit_once(')')?;
        let comm = head.split_once('(')?.1;
        Some(Identity {
            started: rest.split_whitespace().nth(19)?.parse().ok()?,
            comm: comm.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_meta_labels() {
        let process = ProcessFacts {
            pid: 7,
            comm: "nginx".into(),
            executable: Some("/usr/sbin/nginx".into()),
            cgroup: Some("/system.slice/nginx.service".into()),
            cgroup_facts: cgroup::facts("/system.slice/nginx.service"),
        };
        let labels = discovered_labels("node7", &process, None);
        assert_eq!(labels["node"], "node7");
        assert_eq!(labels["comm"], "nginx");
        assert_eq!(labels["pid"], "7");
        assert_eq!(labels["executable"], "/usr/sbin/nginx");
        assert_eq!(labels["systemd_unit"], "nginx.service");
        assert_eq!(labels["service_name"], "nginx.service");
        assert_eq!(labels["__meta_systemd_unit"], "nginx.service");
        assert!(!labels.contains_key("container_id"));

        let pod = PodFacts {
            namespace: "shop".into(),
            pod: "checkout-7d9".into(),
            container: Some("app".into()),
            labels: Labels::from([("app.kubernetes.io/name".into(), "checkout".into())]),
        };
        let labels = discovered_labels("node7", &process, Some(&pod));
        assert_eq!(labels["namespace"], "shop");
        assert_eq!(labels["pod"], "checkout-7d9");
        assert_eq!(labels["container"], "app");
        assert_eq!(
            labels["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
            "checkout"
        );
        assert_eq!(labels["service_name"], "checkout");
    }

    #[test]
    fn labels_this_process_and_drops_by_rule() {
        let me = std::process::id();
        let mut labeler = Labeler::new(
            "n".into(),
            Vec::new(),
            Labels::from([("env".into(), "test".into())]),
        );
        let Outcome::Keep(labels) = &*labeler.outcome(me) else {
            panic!("dropped without rules")
        };
        assert_eq!(labels["pid"], me.to_string());
        assert_eq!(labels["env"], "test");
        assert!(labels.keys().all(|k| !k.starts_with("__")));
        let rules = keep_comm("no-such-command");
        let mut labeler = Labeler::new("n".into(), rules, Labels::new());
        assert!(labeler.can_drop());
        assert_eq!(*labeler.outcome(me), Outcome::Dropped { rule: 1 });
    }

    /// A rule on the thread's name drops one thread and keeps its process and the other
    /// threads, which carry `thread` (and `thread_id`) like any discovered label.
    #[test]
    fn a_rule_on_the_thread_drops_that_thread_only() {
        let me = std::process::id();
        let rules = relabel::compile(&[relabel::RuleConfig {
            source_labels: vec![THREAD_META.into()],
            regex: Some("spin.*".into()),
            action: Some("drop".into()),
            ..Default::default()
        }])
        .unwrap();
        let mut labeler = Labeler::new("n".into(), rules, Labels::new());
        assert!(labeler.can_drop() && labeler.reads_threads());
        // The process is kept: it must not go into the deny list.
        assert!(matches!(*labeler.outcome(me), Outcome::Keep(_)));
        assert_eq!(
            *labeler.thread_outcome(me, "spinner", Some(9)),
            Outcome::Dropped { rule: 1 }
        );
        let Outcome::Keep(labels) = &*labeler.thread_outcome(me, "sleeper", Some(10)) else {
            panic!("the sleeper was dropped")
        };
        assert_eq!(labels[THREAD_LABEL], "sleeper");
        assert_eq!(labels[THREAD_ID_LABEL], "10");
        assert!(!labels.contains_key(THREAD_META));

        // Removing `thread` by name reads no thread: one series per process again.
        let rules = relabel::compile(&[relabel::RuleConfig {
            regex: Some("thread".into()),
            action: Some("labeldrop".into()),
            ..Default::default()
        }])
        .unwrap();
        let mut labeler = Labeler::new("n".into(), rules, Labels::new());
        assert!(!labeler.reads_threads());
        labeler.outcome(me);
        let Outcome::Keep(labels) = &*labeler.thread_outcome(me, "sleeper", None) else {
            panic!("dropped without a drop rule")
        };
        assert!(!labels.contains_key(THREAD_LABEL), "{labels:?}");
        assert_eq!(labels["pid"], me.to_string());
    }

    /// One rule: keep the processes whose name matches `regex`.
    fn keep_comm(regex: &str) -> Vec<Rule> {
        relabel::compile(&[relabel::RuleConfig {
            source_labels: vec!["comm".into()],
            regex: Some(regex.into()),
            action: Some("keep".into()),
            ..Default::default()
        }])
        .unwrap()
    }

    #[test]
    fn identity_reads_the_start_and_a_name_with_parentheses() {
        let stat = "42 (a) b)) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 \
                    1000 100 18446744073709551615";
        assert_eq!(
            Identity::parse(stat),
            Some(Identity {
                started: 987_654,
                comm: "a) b)".into()
            })
        );
        assert_eq!(Identity::parse("42 (cut"), None);
        assert_eq!(Identity::parse("42 (x) S 1"), None);
    }

    /// A child judged by its parent's name before its exec is judged again by its own after.
    #[test]
    fn a_process_is_judged_again_after_it_execs() {
        use std::io::Write;
        let rules = keep_comm("sleep");
        let mut labeler = Labeler::new("n".into(), rules, Labels::new());
        let mut child = std::process::Command::new("sh")
            .args(["-c", "read line; exec sleep 30"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        assert_eq!(*labeler.outcome(pid), Outcome::Dropped { rule: 1 });
        writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while Identity::read(pid).comm != "sleep" {
            assert!(
                std::time::Instant::now() < deadline,
                "the child never ran sleep"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let kept = matches!(*labeler.outcome(pid), Outcome::Keep(_));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(kept, "still dropped by the name it had before its exec");
    }
}
