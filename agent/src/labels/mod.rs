//! Labels: what each profile belongs to.
//!
//! discover (/proc, cgroup path, Kubernetes API) -> `__meta_*` labels + defaults
//!   -> relabel (the config's rules) -> the series' labels, or "dropped"
//!
//! The outcome is computed once per process (a pid is checked against its start time, so a
//! reused pid is a new process) and kept until the process exits. A dropped process is also
//! pushed into the BPF program's filter by the daemon, so it stops costing stack walks.
//!
//! A process is judged when the daemon first sees it (its first sample, which the BPF side
//! reports at once, or the periodic discovery), while /proc/PID still describes it: a build
//! step or a cron job's shell may have exited by the time its window is labelled, and keeps
//! the labels read while it ran until that window is done. One that exited before even that
//! read is labelled from what the kernel recorded at its samples: its name and its cgroup
//! ([`KernelFacts`]); it lacks only its executable, and is counted ([`FactsSource`]).

pub mod apply;
pub mod cgroup;
pub mod cgroup_ids;
pub mod kubernetes;
pub mod relabel;

use std::{collections::HashMap, sync::Arc, time::Instant};

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

impl ProcessFacts {
    /// What the kernel recorded of `pid` at its samples, for a process gone before /proc/PID
    /// was read: its name and its cgroup's path, no executable.
    pub fn from_kernel(pid: u32, comm: &str, cgroup: Option<String>) -> ProcessFacts {
        ProcessFacts {
            pid,
            comm: comm.to_owned(),
            executable: None,
            cgroup_facts: cgroup.as_deref().map(cgroup::facts).unwrap_or_default(),
            cgroup,
        }
    }
}

/// What the BPF program recorded of a process at its first sample of a window: its leader's
/// name, its cgroup id (named by [`cgroup_ids::CgroupIds`] when needed) and its start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelFacts {
    pub comm: String,
    /// 0 when not recorded.
    pub cgroup_id: u64,
    /// The leader's `start_boottime`, ns since boot; 0 when not recorded.
    pub started_ns: u64,
}

/// What a process last exec'd, as the exec hook recorded it: the path the exec named, and
/// when the process started (`start_boottime`, ns since boot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRecord {
    pub started_ns: u64,
    pub path: String,
}

/// Finds what `pid` last exec'd (the BPF `EXEC_FILES` map, in the daemon).
type ExecLookup = Box<dyn FnMut(u32) -> Option<ExecRecord> + Send>;

/// Where a process's labels were read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum FactsSource {
    /// /proc/PID, while the process ran.
    Proc,
    /// What the kernel recorded at its samples and its exec: it exited before /proc/PID was
    /// read.
    Kernel,
    /// Nothing: it exited unread and the kernel's record of it was lost (a full map).
    Nothing,
}

/// What a process's labels lack, for the `reason` label in `/metrics` and the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Missing {
    /// Its executable (`executable`, and Pyroscope's and OTLP's names from it): it exited
    /// before /proc/PID/exe was read, and its exec was not recorded (before the daemon
    /// started, or evicted by later ones).
    Executable,
    /// Everything but its pid: it exited unread, and the kernel's record of its samples was
    /// lost.
    Everything,
}

impl Missing {
    pub fn as_str(self) -> &'static str {
        match self {
            Missing::Executable => "no_executable",
            Missing::Everything => "no_process_facts",
        }
    }

    pub const ALL: [Missing; 2] = [Missing::Executable, Missing::Everything];
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
    /// What the discovered labels lack.
    missing: Option<Missing>,
}

/// Processes whose kernel record is kept at most: the captures' own bound on exited processes
/// (`process::captures::CaptureLimits`), whose samples these label.
pub const MAX_KERNEL_FACTS: usize = 16_384;

/// Exec'd paths whose resolved executable is kept ([`Labeler`]'s `resolved_execs`): a host
/// runs a few hundred distinct programs; the bound is for one that execs a new path each time.
pub const MAX_RESOLVED_EXECS: usize = 4096;

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
    /// What the kernel recorded of the processes the current windows sampled, by pid: used
    /// only for a process that exited before it was judged. Emptied of exited processes with
    /// the cache.
    kernel: HashMap<u32, KernelFacts>,
    /// Names the cgroup ids of those records.
    cgroup_ids: cgroup_ids::CgroupIds,
    /// What processes exec'd, for the executable of one read too late to have one.
    exec_files: Option<ExecLookup>,
    /// By (cgroup, path an exec named), the executable /proc/PID/exe gave a live process that
    /// exec'd it: an exec names a path through symlinks (`/usr/bin/python3`), the kernel
    /// resolves it (`/usr/bin/python3.11`), and a process read too late gets the name a live
    /// one got. Keyed by cgroup too: a container's path may lead elsewhere than the host's.
    resolved_execs: HashMap<(Option<String>, String), String>,
    /// Clock ticks a second, the unit of /proc/PID/stat's start time.
    ticks_per_second: u64,
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
            kernel: HashMap::new(),
            cgroup_ids: cgroup_ids::CgroupIds::new(),
            exec_files: None,
            resolved_execs: HashMap::new(),
            // SAFETY: sysconf has no preconditions.
            ticks_per_second: u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
                .ok()
                .filter(|&t| t > 0)
                .unwrap_or(100),
        }
    }

    /// Finds what a process exec'd: `lookup(pid)` (the exec hook's records).
    pub fn with_exec_files(
        mut self,
        lookup: impl FnMut(u32) -> Option<ExecRecord> + Send + 'static,
    ) -> Labeler {
        self.exec_files = Some(Box::new(lookup));
        self
    }

    /// Keeps what the exec of live `pid` resolved to, when its record names it otherwise; at
    /// most [`MAX_RESOLVED_EXECS`] pairs (then it starts over).
    fn learn_exec(&mut self, pid: u32, started: Start, cgroup: &Option<String>, executable: &str) {
        let Some(path) = self.exec_file(pid, started) else {
            return;
        };
        if path == executable {
            return;
        }
        if self.resolved_execs.len() >= MAX_RESOLVED_EXECS {
            self.resolved_execs.clear();
        }
        self.resolved_execs
            .insert((cgroup.clone(), path), executable.to_owned());
    }

    /// The path `pid` last exec'd, when the exec hook's record is of this process: the one
    /// that started at `started` (`Start::Nanoseconds` from the kernel's record of its samples,
    /// `Start::Ticks` from /proc/PID/stat).
    fn exec_file(&mut self, pid: u32, started: Start) -> Option<String> {
        let record = self.exec_files.as_mut()?(pid)?;
        let tick_ns = 1_000_000_000 / self.ticks_per_second;
        let same = match started {
            Start::Nanoseconds(ns) => ns != 0 && record.started_ns == ns,
            Start::Ticks(ticks) => ticks != 0 && record.started_ns / tick_ns == ticks,
        };
        same.then_some(record.path)
    }

    /// Keeps what the kernel recorded of `pid` at its samples, for if it exited before it
    /// was judged ([`KernelFacts`]); at most [`MAX_KERNEL_FACTS`] processes.
    pub fn remember_kernel_facts(&mut self, pid: u32, facts: KernelFacts) {
        if self.kernel.len() < MAX_KERNEL_FACTS || self.kernel.contains_key(&pid) {
            self.kernel.insert(pid, facts);
        }
    }

    /// The outcome for `pid` (as [`Labeler::outcome`]) and what its labels lack.
    pub fn judge(&mut self, pid: u32) -> (Arc<Outcome>, Option<Missing>) {
        let (outcome, _, missing) = self.process(pid);
        (outcome, missing)
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
            None => {
                let (outcome, discovered, _) = self.process(pid);
                (outcome, discovered)
            }
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

    /// The process's outcome, its discovered labels, and what they lack.
    fn process(&mut self, pid: u32) -> (Arc<Outcome>, Arc<Labels>, Option<Missing>) {
        let identity = Identity::read(pid);
        let started = identity.started;
        if let Some(cached) = self.cache.get(&pid) {
            // An exited process (start 0) keeps what was computed while it ran.
            if started == 0 || cached.identity == identity {
                return (
                    cached.outcome.clone(),
                    cached.discovered.clone(),
                    cached.missing,
                );
            }
        }
        let mut process = ProcessFacts::read(pid);
        let mut source = FactsSource::Proc;
        let mut start = Start::Ticks(started);
        // Gone before it was judged (or while it was read: its name reads empty): what the
        // kernel recorded at its samples stands in, so it is labelled, and judged by rules
        // on its name and unit, as it would have been alive.
        if started == 0 || process.comm.is_empty() {
            (process, source) = match self.kernel.get(&pid).cloned() {
                Some(kernel) => {
                    let cgroup = (kernel.cgroup_id != 0)
                        .then(|| self.cgroup_ids.path(kernel.cgroup_id, Instant::now()))
                        .flatten();
                    start = Start::Nanoseconds(kernel.started_ns);
                    (
                        ProcessFacts::from_kernel(pid, &kernel.comm, cgroup),
                        FactsSource::Kernel,
                    )
                }
                None => (process, FactsSource::Nothing),
            };
        }
        // A process read as it exited (a zombie has no executable left) or after: the file
        // its exec named. A kernel thread has none to find.
        // The idle task (pid 0) has no /proc entry and no executable either.
        let kernel_thread = identity.kernel_thread || pid == 0;
        if process.executable.is_none() && !kernel_thread {
            process.executable = self.exec_file(pid, start).map(|path| {
                let key = (process.cgroup.clone(), path);
                self.resolved_execs.get(&key).cloned().unwrap_or(key.1)
            });
        } else if let (Some(executable), FactsSource::Proc, true) =
            (&process.executable, source, self.exec_files.is_some())
        {
            self.learn_exec(pid, start, &process.cgroup, executable);
        }
        let missing = match source {
            FactsSource::Nothing => Some(Missing::Everything),
            // A gone process's record says nothing of a kernel thread: one with a name and
            // no exec is counted as lacking its executable.
            _ if process.executable.is_none() && !kernel_thread => Some(Missing::Executable),
            _ => None,
        };
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
        // Not cached: labels a pod's watch event has not completed yet (a container starts a
        // moment before the API server reports its id), so the next window asks again; and a
        // process gone with nothing known of it, which its record may still come for. A gone
        // process judged from its record is cached (start 0) until `forget_exited`.
        let pod_pending = self.pods.is_some()
            && process.cgroup_facts.pod_uid.is_some()
            && pod.as_ref().is_none_or(|p| {
                p.container.is_none() && process.cgroup_facts.container_id.is_some()
            });
        if !pod_pending && source != FactsSource::Nothing {
            self.cache.insert(
                pid,
                CachedProcess {
                    identity,
                    discovered: discovered.clone(),
                    outcome: outcome.clone(),
                    threads: HashMap::new(),
                    missing,
                },
            );
        }
        (outcome, discovered, missing)
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

    /// Forgets processes that have exited, and the kernel's records of them; returns their
    /// pids. Call after their last window was labelled.
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
        // A live process's record is renewed by each window that samples it.
        self.kernel.clear();
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
    /// A kernel thread (`PF_KTHREAD`, field 9): it has no executable.
    kernel_thread: bool,
}

/// When a process started, in the unit of what says it.
#[derive(Debug, Clone, Copy)]
enum Start {
    /// `start_boottime` in nanoseconds, from the kernel's record of its samples.
    Nanoseconds(u64),
    /// Clock ticks since boot, from /proc/PID/stat.
    Ticks(u64),
}

/// `PF_KTHREAD` in the flags of /proc/PID/stat.
const PF_KTHREAD: u64 = 0x0020_0000;

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
        let fields: Vec<&str> = rest.split_whitespace().take(20).collect();
        Some(Identity {
            started: fields.get(19)?.parse().ok()?,
            comm: comm.to_owned(),
            kernel_thread: fields
                .get(6)
                .and_then(|f| f.parse::<u64>().ok())
                .is_some_and(|flags| flags & PF_KTHREAD != 0),
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
    /// A pid no process has (beyond `pid_max`'s limit of 2^22).
    const GONE: u32 = 4_000_000_000;

    /// A directory tree standing in for the cgroup v2 hierarchy, holding `path`; the id (inode)
    /// of `path` in it, and the labeler naming ids from it.
    fn labeler_over_cgroups(rules: Vec<Rule>, path: &str) -> (Labeler, u64, std::path::PathBuf) {
        use std::os::unix::fs::MetadataExt;
        let root = std::env::temp_dir().join(format!(
            "scorch-labels-{}-{}",
            std::process::id(),
            path.len()
        ));
        let _ = std::fs::remove_dir_all(&root);
        let dir = root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).unwrap();
        let id = std::fs::metadata(&dir).unwrap().ino();
        let mut labeler = Labeler::new("n".into(), rules, Labels::new());
        labeler.cgroup_ids = cgroup_ids::CgroupIds::at(Some((root.clone(), "/".to_owned())));
        (labeler, id, root)
    }

    /// A process gone before it was judged is labelled from the kernel's record of its samples
    /// and its exec: the same labels, and the same rules' verdict, as it would have had alive.
    #[test]
    fn a_process_gone_before_it_was_judged_keeps_its_labels() {
        let unit = "/system.slice/build.service";
        let (labeler, cgroup_id, root) = labeler_over_cgroups(keep_comm("python3"), unit);
        let mut labeler = labeler.with_exec_files(|pid| {
            (pid == GONE).then(|| ExecRecord {
                started_ns: 5_000_000_000,
                path: "/usr/bin/python3.11".into(),
            })
        });
        labeler.remember_kernel_facts(
            GONE,
            KernelFacts {
                comm: "python3".into(),
                cgroup_id,
                started_ns: 5_000_000_000,
            },
        );
        let (outcome, missing) = labeler.judge(GONE);
        let Outcome::Keep(labels) = &*outcome else {
            panic!("a keep rule on its name dropped it: {outcome:?}")
        };
        assert_eq!(missing, None);
        assert_eq!(labels["comm"], "python3");
        assert_eq!(labels["executable"], "/usr/bin/python3.11");
        assert_eq!(labels["cgroup"], unit);
        assert_eq!(labels["systemd_unit"], "build.service");
        assert_eq!(labels["service_name"], "build.service");
        // Kept with the cache until it is forgotten, the kernel's record with it.
        assert_eq!(labeler.judge(GONE).1, None);
        assert!(labeler.forget_exited().contains(&GONE));
        std::fs::remove_dir_all(root).unwrap();
    }

    /// An exec record of an earlier process with the same pid is not this one's; without a
    /// record the executable is counted missing; without even the kernel's record, everything.
    #[test]
    fn what_a_gone_process_lacks_is_counted() {
        let (labeler, cgroup_id, root) = labeler_over_cgroups(Vec::new(), "/job.scope");
        let mut labeler = labeler.with_exec_files(|_| {
            Some(ExecRecord {
                started_ns: 1,
                path: "/usr/bin/earlier".into(),
            })
        });
        labeler.remember_kernel_facts(
            GONE,
            KernelFacts {
                comm: "sh".into(),
                cgroup_id,
                started_ns: 2,
            },
        );
        let (outcome, missing) = labeler.judge(GONE);
        let Outcome::Keep(labels) = &*outcome else {
            panic!("dropped without rules")
        };
        assert_eq!(missing, Some(Missing::Executable));
        assert!(!labels.contains_key("executable"), "{labels:?}");
        assert_eq!(labels["comm"], "sh");
        assert_eq!(labels["cgroup"], "/job.scope");
        assert_eq!(labeler.judge(GONE - 1).1, Some(Missing::Everything));
        std::fs::remove_dir_all(root).unwrap();
    }

    /// The path an exec named (through a symlink) gives a gone process the executable a live
    /// process of the same cgroup got from /proc/PID/exe for it.
    #[test]
    fn an_exec_through_a_symlink_names_what_a_live_process_resolved_it_to() {
        let me = std::process::id();
        let facts = ProcessFacts::read(me);
        let cgroup = facts.cgroup.clone().unwrap_or_else(|| "/".into());
        let (labeler, cgroup_id, root) = labeler_over_cgroups(Vec::new(), &cgroup);
        let tick_ns = 1_000_000_000 / labeler.ticks_per_second;
        let my_start_ns = Identity::read(me).started * tick_ns;
        let mut labeler = labeler.with_exec_files(move |pid| {
            Some(ExecRecord {
                started_ns: if pid == me { my_start_ns } else { 9 },
                path: "/usr/bin/an-alias".into(),
            })
        });
        // Alive: /proc/PID/exe, and what the alias resolved to, learnt.
        let Outcome::Keep(live) = &*labeler.outcome(me) else {
            panic!("dropped without rules")
        };
        assert_eq!(live.get("executable"), facts.executable.as_ref());
        labeler.remember_kernel_facts(
            GONE,
            KernelFacts {
                comm: "gone".into(),
                cgroup_id,
                started_ns: 9,
            },
        );
        let Outcome::Keep(gone) = &*labeler.outcome(GONE) else {
            panic!("dropped without rules")
        };
        assert_eq!(gone.get("executable"), facts.executable.as_ref());
        std::fs::remove_dir_all(root).unwrap();
    }

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
                comm: "a) b)".into(),
                kernel_thread: false,
            })
        );
        // The flags (field 9) of a kworker: PF_KTHREAD.
        let kworker = "7 (kworker/0:1) I 2 0 0 0 -1 69238880 0 0 0 0 0 5 0 0 20 0 1 0 12 0 0";
        assert!(Identity::parse(kworker).unwrap().kernel_thread);
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
