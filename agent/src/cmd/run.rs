//! `scorch run`: the daemon. Samples continuously and, every window, drains the maps,
//! symbolises, and writes one profile per series to the local store, while an HTTP server
//! answers queries, serves the UI, /metrics and /healthz.
//!
//! sampler -> (every window) drain -> aggregate -> symbolize -> Profile -> store
//!
//! A store that cannot be written (a full disk) does not stop sampling: windows wait in memory
//! (up to [`MAX_BUFFERED_WINDOWS`] and [`MAX_BUFFERED_BYTES`]) and are written when the store accepts writes again.
//!
//! With `remote-url`, the remote sink (`export/`) runs beside it on its own thread, reading
//! the windows back from the store and sending them to Pyroscope or Parca.
//!
//! Each part registers its own metrics in one [`Registry`] before the HTTP server starts, so
//! the first scrape has every family: the loop's ([`metrics::WindowMetrics`]) and the remote
//! sink's (with or without a remote, so dashboards see zeros rather than no data).

mod metrics;

use std::{
    collections::{HashSet, VecDeque},
    io,
    net::SocketAddr,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use tokio::sync::{mpsc::error::TrySendError, watch};

use self::metrics::WindowMetrics;
use crate::{
    cmd::sampling::{self, shutdown_signals, Consumer, Drained, Sampling, StartError},
    export::{
        self, debuginfo::DebugFileSender, RemoteConfig, RemoteMetrics, RemoteProtocol, SinkError,
    },
    labels::{
        self, apply,
        kubernetes::Kubernetes,
        relabel::{self, Outcome, RuleConfig},
        ExecRecord, KernelFacts, Labeler, PodFacts,
    },
    metrics::{Health, Registry},
    pipeline::aggregate::Aggregated,
    pipeline::aggregate::MAX_THREADS_PER_PROCESS,
    pipeline::cost,
    pipeline::drain::DrainError,
    pipeline::off_cpu::OffCpuSettings,
    pipeline::sampler::{Sampler, SamplerConfig, UnwindCapacity, UnwindMode},
    pipeline::stack_sizing::DEFAULT_MAX_STACK_ENTRIES,
    profile::{Labels, Profile, SampleType},
    runtimes::{self, hotspot::JvmMode, python::PythonMode, v8::NodeMode, RuntimeConfig},
    serve::{
        guard::AllowedHosts,
        http::{self, HttpState},
    },
    store::{Retention, Store, StoreError},
    symbolize::{
        self,
        kernel::KernelSymbolizer,
        user::{SymbolizeMode, UserSymbolizer},
    },
    sys::allocator::{release_free_memory, release_free_memory_above},
    sys::notify::Systemd,
    sys::privileges::{missing_privileges_message, Capabilities},
    unwind::metrics::UnwindMetrics,
};

/// Windows kept in memory while the store refuses writes: 30 minutes at the default window
/// (15 with off-CPU on: its windows wait beside the CPU ones).
pub const MAX_BUFFERED_WINDOWS: usize = 180;
/// ...and at most this much memory ([`Profile::heap_bytes`]): on a busy host 180 windows of
/// thousands of distinct stacks would otherwise hold hundreds of MiB while the disk is full.
pub const MAX_BUFFERED_BYTES: usize = 64 << 20;

/// Free heap the daemon keeps between windows rather than returning it to the OS.
const FREE_MEMORY_KEPT: usize = 4 << 20;

/// How long shutdown may take: the partial window is flushed within it, or given up.
const SHUTDOWN_BUDGET: Duration = Duration::from_secs(4);

/// Everything `scorch run` needs, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct RunConfig {
    pub store: PathBuf,
    pub http_address: SocketAddr,
    /// Extra names the HTTP server answers to (see `serve::guard`).
    pub http_allowed_hosts: Vec<String>,
    pub window: Duration,
    pub frequency: u64,
    pub retention: Retention,
    pub symbolize: SymbolizeMode,
    pub symbol_cache_mb: u64,
    pub include_idle: bool,
    /// How user stacks are walked (`--unwind`, `unwind`).
    pub unwind: UnwindMode,
    /// Processes the unwinder describes to the BPF program at once (`--unwind-processes`,
    /// `unwind-processes`); the others walk by frame pointers.
    pub unwind_processes: u32,
    /// Ceiling on the unwind tables' row pools, in MiB (`--unwind-pool-mib`,
    /// `unwind-pool-mib`).
    pub unwind_pool_mib: u32,
    /// Ceiling on each stack-trace map's entries (`--stack-map-entries`,
    /// `stack-map-entries`).
    pub stack_map_entries: u32,
    /// Whether interpreters' Python frames are walked (`--python`, `python`).
    pub python: PythonMode,
    /// Whether JVMs' Java frames are walked (`--jvm`, `jvm`).
    pub jvm: JvmMode,
    /// Whether Node's JavaScript frames are walked (`--node`, `node`).
    pub node: NodeMode,
    /// Whether off-CPU time is recorded beside the CPU samples (`--off-cpu`, `off-cpu`).
    pub off_cpu: bool,
    /// How off-CPU time is sampled (`off-cpu-mean`, `off-cpu-min`, `off-cpu-max-events`),
    /// when [`RunConfig::off_cpu`] is on.
    pub off_cpu_sampling: OffCpuSettings,
    /// Whether samples carry their thread's id (`thread_id`, `__meta_thread_id`) besides its
    /// name (`--thread-ids`, `thread-ids`).
    pub thread_ids: bool,
    /// Relabelling rules (config file only: `[[relabel]]`), checked by [`RunConfig::resolve`].
    pub relabel: Vec<RuleConfig>,
    /// Labels added to every series (`[external-labels]`, or `--external-label NAME=VALUE`).
    pub external_labels: Labels,
    /// The `remote-*` keys: where else windows go.
    pub remote: RemoteConfig,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            store: PathBuf::from("/var/lib/scorch"),
            http_address: SocketAddr::from(([127, 0, 0, 1], 7071)),
            http_allowed_hosts: Vec::new(),
            window: Duration::from_secs(10),
            frequency: 19,
            retention: Retention::default(),
            symbolize: SymbolizeMode::Local,
            symbol_cache_mb: 256,
            include_idle: false,
            unwind: UnwindMode::Auto,
            unwind_processes: UnwindCapacity::DAEMON.processes,
            unwind_pool_mib: UnwindCapacity::DAEMON.pool_mib(),
            stack_map_entries: DEFAULT_MAX_STACK_ENTRIES,
            python: PythonMode::Auto,
            jvm: JvmMode::Auto,
            node: NodeMode::Auto,
            off_cpu: false,
            off_cpu_sampling: OffCpuSettings::default(),
            thread_ids: false,
            relabel: Vec::new(),
            external_labels: Labels::new(),
            remote: RemoteConfig::default(),
        }
    }
}

impl RunConfig {
    /// The off-CPU sampling, when off-CPU time is recorded.
    pub fn off_cpu_settings(&self) -> Option<OffCpuSettings> {
        self.off_cpu.then_some(self.off_cpu_sampling)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Privileges(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("listening on {address}: {source}")]
    Listen {
        address: std::net::SocketAddr,
        source: io::Error,
    },
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("draining the sampler's maps: {0}")]
    Drain(#[from] DrainError),
    #[error("waiting for signals: {0}")]
    Signals(io::Error),
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error(transparent)]
    Relabel(relabel::RelabelError),
}

/// Checks what can be checked before any BPF is loaded: privileges, and that the store opens.
pub fn preflight(config: &RunConfig) -> Result<Store, RunError> {
    let caps = Capabilities::effective();
    if !caps.can_profile() {
        return Err(RunError::Privileges(missing_privileges_message(caps)));
    }
    Ok(Store::open(&config.store, config.retention)?)
}

/// Runs until SIGINT or SIGTERM, then flushes the partial window and returns. The window
/// loop runs on the caller's runtime; the HTTP server and the pod watch on `services`, so a
/// window being symbolised never holds up a request.
pub async fn run(
    config: RunConfig,
    store: Store,
    services: tokio::runtime::Handle,
) -> Result<(), RunError> {
    let shutdown = shutdown_signals().map_err(RunError::Signals)?;
    // Bound on `services`, whose event driver then serves it.
    let address = config.http_address;
    let listener = services
        .spawn(tokio::net::TcpListener::bind(address))
        .await
        .map_err(|err| RunError::Listen {
            address,
            source: io::Error::other(err),
        })?
        .map_err(|source| RunError::Listen { address, source })?;
    let mut registry = Registry::new();
    let window_metrics = WindowMetrics::register(&mut registry);
    let unwind_metrics = UnwindMetrics::register(&mut registry);
    let remote_metrics = Arc::new(RemoteMetrics::register(&mut registry));
    let registry = Arc::new(registry);
    let health = Arc::new(Health::new(config.window, Instant::now()));
    let (stop_http, http_stopped) = watch::channel(false);
    let http_state = Arc::new(HttpState::new(
        config.store.clone(),
        registry.clone(),
        health.clone(),
        config.window,
        AllowedHosts::new(config.http_address, &config.http_allowed_hosts),
    ));
    let http_task = services.spawn(http::serve(listener, http_state, async move {
        let mut stopped = http_stopped;
        let _ = stopped.wait_for(|&stop| stop).await;
    }));

    // Rules were checked when the config was read; compiling them again cannot fail then.
    let rules = relabel::compile(&config.relabel).map_err(RunError::Relabel)?;
    let mut labeler = Labeler::new(labels::node_name(), rules, config.external_labels.clone());
    // In a cluster, pods are named from the API server; elsewhere this is off, quietly.
    match Kubernetes::from_environment() {
        Ok(Some(kubernetes)) => {
            {
                let _on_services = services.enter();
                kubernetes.start();
            }
            registry.watch_kubernetes(Box::new(kubernetes.clone()));
            tracing::info!("naming pods from the Kubernetes API server");
            labeler = labeler.with_pods(move |uid, container_id| {
                let pod = kubernetes.pod(uid)?;
                // The cgroup names the pod and the container; the API server says which
                // containers the pod has. A container id the pod does not list is not taken
                // at its word (the API may not have reported a new container yet: the labeler
                // asks again next window rather than caching a guess).
                let container = match container_id {
                    Some(id) => Some(pod.containers.get(id).cloned()?),
                    None => None,
                };
                Some(PodFacts {
                    container,
                    namespace: pod.namespace,
                    pod: pod.name,
                    labels: pod.labels,
                })
            });
        }
        Ok(None) => {}
        Err(err) => tracing::warn!(
            "Kubernetes pod names are unavailable ({err}); profiles carry the other labels"
        ),
    }
    let sampler_config = SamplerConfig {
        frequency_hz: config.frequency,
        pids: Vec::new(),
        include_idle: config.include_idle,
        window_secs: config.window.as_secs().max(1),
        deny_list: labeler.can_drop(),
        unwind: config.unwind,
        unwind_capacity: UnwindCapacity {
            processes: config.unwind_processes,
            ..UnwindCapacity::DAEMON
        }
        .with_pool_mib(config.unwind_pool_mib),
        stack_entries_ceiling: config.stack_map_entries,
        off_cpu: config.off_cpu_settings(),
        thread_ids: config.thread_ids,
        exec_files: true,
        // Set from the runtimes' registry by `Sampling::start`.
        runtime_maps: Vec::new(),
        runtime_counters: Vec::new(),
    };
    // Before BPF is loaded: a bad remote configuration (URL, secret files, CA file) fails the
    // start with its reason.
    // Only a server that symbolises needs the binaries' debug info.
    let (debug_files, debug_files_rx) = match (&config.remote.url, config.remote.protocol) {
        (Some(_), RemoteProtocol::Parca)
            if config.remote.upload_debuginfo && config.symbolize == SymbolizeMode::None =>
        {
            let (files, receiver) = export::debuginfo::hand_off();
            (Some(files), Some(receiver))
        }
        _ => (None, None),
    };
    let remote = match config.remote.url {
        Some(_) => Some(export::spawn(
            &config.remote,
            &config.store,
            config.retention,
            remote_metrics,
            debug_files_rx,
        )?),
        None => None,
    };
    let mut user_symbolizer =
        UserSymbolizer::new(config.symbolize, (config.symbol_cache_mb as usize) << 20);
    user_symbolizer.set_scratch_dir(&config.store);
    if debug_files.is_some() {
        user_symbolizer.collect_new_binaries(export::debuginfo::CHANNEL_CAPACITY);
    }
    let registry = runtimes::Registry::new(RuntimeConfig {
        python: config.python,
        jvm: config.jvm,
        node: config.node,
    });
    let mut sampling = Sampling::start(&sampler_config, registry, user_symbolizer)?;
    // What processes exec'd names the executable of one that exited before it was read.
    if let Some(files) = sampling.sampler.take_exec_files() {
        labeler = labeler.with_exec_files(move |pid| {
            let file = files.get(&pid, 0).ok()?;
            exec_record(&file)
        });
    }
    // Loading parsed the kernel's BTF (tens of MB, freed by now): give those pages back, or a
    // daemon's RSS would keep them for its whole life.
    release_free_memory();
    let cpus = sampling.sampler.cpus().len();
    tracing::info!(
        cpus,
        frequency_hz = config.frequency,
        window = ?config.window,
        store = %config.store.display(),
        "profiling; UI and API on http://{}",
        config.http_address
    );
    // Under systemd (Type=notify) the unit becomes active only now that BPF is attached: a
    // start that failed above never says READY, so `systemctl start` fails with its reason.
    let mut systemd = Systemd::from_env();
    let status = format!("sampling {cpus} CPUs at {} Hz", config.frequency);
    systemd.ready(&status);
    let mut pipeline = Pipeline {
        kernel: KernelSymbolizer::default(),
        period_ns: 1_000_000_000 / config.frequency,
        store,
        buffered: VecDeque::new(),
        metrics: window_metrics,
        health: health.clone(),
        warned_binaries: HashSet::new(),
        failing_since: None,
        labeler,
        excluded: HashSet::new(),
        filtered_reported: 0,
        debug_files,
        debug_files_dropped: 0,
        unwind_metrics,
        off_cpu_type: config.off_cpu_settings().map(|settings| {
            let control = settings.control(1, 0);
            SampleType::OffCpu {
                mean_ns: control.mean_ns,
                min_ns: control.min_ns,
            }
        }),
        systemd,
        status,
    };
    let result = sampling::drive(&mut sampling, &mut pipeline, config.window, None, async {
        let why = shutdown.await;
        tracing::info!("{why}: flushing the current window");
    })
    .await;
    // The partial window: drained and written within the shutdown budget. Symbolising is
    // bounded by what the window holds; the store write by its busy timeout.
    let flush_started = Instant::now();
    pipeline.systemd.stopping();
    if result.is_ok() {
        let flushed = sampling
            .drain()
            .map_err(RunError::from)
            .and_then(|drained| pipeline.window(&mut sampling, drained));
        if let Err(err) = flushed {
            tracing::warn!("flushing the last window: {err}");
        }
        if !pipeline.buffered.is_empty() {
            tracing::warn!(
                "{} windows could not be written before exit: {}",
                pipeline.buffered.len(),
                health.check(Instant::now()).err().unwrap_or_default()
            );
        }
    }
    drop(sampling);
    // The remote gets what it takes at once of the windows still queued, the last one
    // included, within the budget; the rest waits in the store for the next start.
    if let Some(remote) = remote {
        let budget = SHUTDOWN_BUDGET.saturating_sub(flush_started.elapsed());
        remote
            .stop(budget.saturating_sub(Duration::from_millis(500)))
            .await;
    }
    let _ = stop_http.send(true);
    let remaining = SHUTDOWN_BUDGET.saturating_sub(flush_started.elapsed());
    match tokio::time::timeout(remaining, http_task).await {
        Ok(Ok(Err(err))) => tracing::warn!("HTTP server: {err}"),
        Ok(_) => {}
        Err(_) => tracing::warn!("HTTP server did not stop in time; exiting anyway"),
    }
    result
}

/// The exec hook's record as a path, when it is one: absolute (a relative one named a file
/// from a directory the record does not say), UTF-8 and whole (the record cuts a longer one).
fn exec_record(file: &scorch_common::ExecFile) -> Option<ExecRecord> {
    let end = file.path.iter().position(|&b| b == 0)?;
    let path = std::str::from_utf8(&file.path[..end]).ok()?;
    path.starts_with('/').then(|| ExecRecord {
        started_ns: file.started_ns,
        path: path.to_owned(),
    })
}

/// The per-window work, and what it keeps between windows.
struct Pipeline {
    kernel: KernelSymbolizer,
    period_ns: u64,
    store: Store,
    /// Symbolised windows the store has not accepted yet, oldest first.
    buffered: VecDeque<Profile>,
    metrics: WindowMetrics,
    health: Arc<Health>,
    /// Executables already reported as built without frame pointers.
    warned_binaries: HashSet<String>,
    /// When the store started refusing writes, so the log says it once, not every window.
    failing_since: Option<SystemTime>,
    /// Each process's labels, or that relabelling dropped it.
    labeler: Labeler,
    /// Dropped processes in the BPF deny list.
    excluded: HashSet<u32>,
    /// The BPF filter's discard count at the last report.
    filtered_reported: u64,
    /// The debug-info upload's queue (Parca, `--symbolize none`): binaries the symboliser met
    /// for the first time go there after each window. It is never waited on.
    debug_files: Option<DebugFileSender>,
    /// Binaries the queue had no room for.
    debug_files_dropped: u64,
    unwind_metrics: UnwindMetrics,
    /// What each off-CPU window's values are, when off-CPU time is recorded: its sampling rule
    /// travels with it to the store and the sinks.
    off_cpu_type: Option<SampleType>,
    /// Told that the daemon is ready, its status after each window, and that it stops.
    systemd: Systemd,
    /// The status systemd shows while all is well.
    status: String,
}

impl Pipeline {
    /// Passes the binaries this window met first to the debug-info upload.
    fn hand_over_new_binaries(&mut self, user: &mut UserSymbolizer) {
        let Some(queue) = &self.debug_files else {
            return;
        };
        for file in user.take_new_binaries() {
            let (path, id) = (file.path.clone(), file.build_id.clone());
            if let Err(err) = queue.try_send(file) {
                self.debug_files_dropped += 1;
                let reason = match err {
                    TrySendError::Full(_) => "the upload queue is full",
                    TrySendError::Closed(_) => "the uploader stopped",
                };
                tracing::debug!(
                    "not uploading the debug info of {} ({id}): {reason} ({} files so far)",
                    path.display(),
                    self.debug_files_dropped
                );
            }
        }
    }

    /// Judges the processes discovery met (their labels read while they run), and puts those
    /// relabelling drops into the BPF deny list, so from then on their samples cost one map
    /// lookup and no stack walk.
    fn target(&mut self, pids: &[u32], sampler: &mut Sampler) {
        if !self.labeler.can_drop() {
            for &pid in pids {
                self.labeler.outcome(pid);
            }
            return;
        }
        for &pid in pids {
            if self.excluded.contains(&pid) {
                continue;
            }
            if let Outcome::Dropped { .. } = *self.labeler.outcome(pid) {
                match sampler.exclude_pid(pid) {
                    Ok(()) => {
                        self.excluded.insert(pid);
                    }
                    // A full filter: the process is still dropped, after its stacks are walked.
                    Err(err) => tracing::debug!("excluding pid {pid} in BPF: {err}"),
                }
            }
        }
    }

    /// Caps the window's threads per process (after the dropped ones are gone, so they take
    /// no place under the cap), counting those folded.
    fn fold_threads(&mut self, aggregated: &mut Aggregated) {
        let folded = aggregated.fold_threads(MAX_THREADS_PER_PROCESS);
        self.metrics.threads_folded(folded.threads);
    }

    /// Gives each sample its series' labels (`labels::apply`), counting those that lack some.
    fn label(&mut self, profile: &mut Profile) {
        let unlabelled = apply::label(&mut self.labeler, profile);
        if !unlabelled.is_empty() {
            tracing::debug!("samples without their process's labels: {unlabelled:?}");
            self.metrics.samples_unlabelled(&unlabelled);
        }
    }

    /// Keeps what the BPF program recorded of each process the window sampled, for those that
    /// exited before they were judged.
    fn remember_kernel_facts(&mut self, aggregated: &Aggregated) {
        for (&pid, comm) in &aggregated.comms {
            let origin = aggregated.origins.get(&pid).copied().unwrap_or_default();
            self.labeler.remember_kernel_facts(
                pid,
                KernelFacts {
                    comm: comm.clone(),
                    cgroup_id: origin.cgroup_id,
                    started_ns: origin.started_ns,
                },
            );
        }
    }

    /// Symbolises, labels and writes one drained window: its CPU samples, then its off-CPU
    /// blocks as a window of their own type.
    fn store_window(&mut self, sampling: &mut Sampling, drained: Drained) {
        let Drained {
            samples,
            losses,
            stack_maps,
            took,
        } = drained;
        self.metrics
            .window_drained(samples, &losses, &stack_maps, took);
        self.metrics
            .bpf_cost(sampling.sampler.run_stats(), cost::bpf_map_memory().ok());
        if let Some(unwinder) = &sampling.unwinder {
            self.unwind_metrics.window_drained(
                losses.unwind_outcomes(),
                &losses.runtimes,
                unwinder.stats(),
            );
        }
        self.health.sampling_ok_at(Instant::now());

        let session = &mut sampling.session;
        let mut aggregated = std::mem::take(&mut session.aggregated);
        self.remember_kernel_facts(&aggregated);
        apply::discard_dropped(&mut self.labeler, &mut aggregated);
        self.fold_threads(&mut aggregated);
        let symbolize_started = Instant::now();
        let comms = &session.proc_comms;
        match symbolize::symbolize(
            &aggregated,
            &mut self.kernel,
            &mut session.user,
            self.period_ns,
            |pid| comms.get(&pid).cloned(),
        ) {
            Ok(mut profile) => {
                self.label(&mut profile);
                if !profile.samples.is_empty() {
                    self.buffered.push_back(profile);
                }
            }
            // No kernel symbols this window; the next one reloads /proc/kallsyms.
            Err(err) => tracing::warn!("symbolizing a window: {err}"),
        }
        self.metrics.window_symbolized(symbolize_started.elapsed());
        self.hand_over_new_binaries(&mut session.user);
        // Once per binary: the figures in the text change every window.
        for hint in symbolize::hints::stack_hints(&aggregated, &session.user) {
            if self.warned_binaries.insert(hint.binary.clone()) {
                tracing::warn!("{hint}");
            }
        }
        drop(aggregated);
        self.off_cpu_window(sampling);

        self.write_buffered();
        let session = &mut sampling.session;
        session.forget_exited();
        for pid in self.labeler.forget_exited() {
            if self.excluded.remove(&pid) {
                sampling.sampler.forget_pid(pid);
            }
        }
        let filtered = sampling.sampler.filtered_samples();
        self.metrics.filtered(
            filtered.saturating_sub(self.filtered_reported),
            self.excluded.len() as u64,
        );
        self.filtered_reported = filtered;
        let user = &mut sampling.session.user;
        user.enforce_budget();
        user.release_idle_parses();
        // Symbolising and encoding a window allocate and free megabytes; glibc would keep the
        // freed pages in its arenas for the daemon's whole life. Small amounts stay, or every
        // window would fault in and zero the same pages again.
        release_free_memory_above(FREE_MEMORY_KEPT);
        let cache = user.cache_stats();
        self.metrics.set_symbol_cache(&cache);
        self.metrics
            .set_mapped_file_faults(crate::sys::sigbus::faults());
        self.metrics.set_process_captures(&user.capture_stats());
        self.metrics
            .set_start_frames_completed(user.entry_completions());
        self.metrics.set_runtime_unnamed(&user.runtime_counts());
        self.metrics
            .set_runtime_names_bytes(&user.runtime_window_bytes());
        self.metrics.set_store_bytes(self.store.disk_bytes());
    }

    /// The window's off-CPU blocks, symbolised and labelled as the CPU samples are, and
    /// buffered as a window of their own type.
    fn off_cpu_window(&mut self, sampling: &mut Sampling) {
        let (Some(sample_type), Some(reader)) = (self.off_cpu_type, sampling.off_cpu()) else {
            return;
        };
        match reader.counts() {
            Ok(counts) => self.metrics.set_off_cpu(&counts),
            Err(err) => tracing::warn!("{err}"),
        }
        let session = &mut sampling.session;
        let mut blocks = std::mem::take(&mut session.blocks);
        apply::discard_dropped(&mut self.labeler, &mut blocks);
        self.fold_threads(&mut blocks);
        let comms = &session.proc_comms;
        // Values are nanoseconds already: a period of 1.
        match symbolize::symbolize(&blocks, &mut self.kernel, &mut session.user, 1, |pid| {
            comms.get(&pid).cloned()
        }) {
            Ok(mut profile) => {
                profile.sample_type = sample_type;
                self.label(&mut profile);
                if !profile.samples.is_empty() {
                    self.buffered.push_back(profile);
                }
            }
            Err(err) => tracing::warn!("symbolizing a window's off-CPU blocks: {err}"),
        }
    }

    /// Writes waiting windows oldest first; stops at the first failure and keeps the rest.
    fn write_buffered(&mut self) {
        while let Some(profile) = self.buffered.front() {
            match self.store.write_window(profile) {
                Ok(stats) => {
                    self.buffered.pop_front();
                    self.metrics.window_written();
                    self.health.store_ok();
                    if let Some(since) = self.failing_since.take() {
                        tracing::info!(
                            "the store accepts writes again (refused them for {:.0?})",
                            since.elapsed().unwrap_or_default()
                        );
                    }
                    if stats.windows_expired > 0 {
                        tracing::debug!("retention deleted {} windows", stats.windows_expired);
                    }
                }
                Err(err) => {
                    self.metrics.store_write_failed(err.reason());
                    self.health.store_failed(err.to_string());
                    if self.failing_since.is_none() {
                        self.failing_since = Some(SystemTime::now());
                        tracing::error!(
                            "writing to the store failed ({err}); sampling goes on and up to \
                             {MAX_BUFFERED_WINDOWS} windows ({} MiB) wait in memory",
                            MAX_BUFFERED_BYTES >> 20
                        );
                    }
                    break;
                }
            }
        }
        let mut bytes: usize = self.buffered.iter().map(Profile::heap_bytes).sum();
        while self.buffered.len() > MAX_BUFFERED_WINDOWS
            || (bytes > MAX_BUFFERED_BYTES && self.buffered.len() > 1)
        {
            if let Some(oldest) = self.buffered.pop_front() {
                bytes -= oldest.heap_bytes();
            }
            self.metrics.window_dropped();
        }
        self.metrics
            .set_windows_buffered(self.buffered.len() as u64);
    }
}

impl Consumer for Pipeline {
    type Error = RunError;

    fn window(&mut self, sampling: &mut Sampling, drained: Drained) -> Result<(), RunError> {
        self.store_window(sampling, drained);
        let status = match self.health.check(Instant::now()) {
            Ok(()) => self.status.clone(),
            Err(reason) => format!("{}; unhealthy: {reason}", self.status),
        };
        self.systemd.status(&status);
        Ok(())
    }

    /// Not the processes relabelling drops: they get no tables.
    fn wants(&mut self, pid: u32) -> bool {
        !self.labeler.can_drop() || !matches!(*self.labeler.outcome(pid), Outcome::Dropped { .. })
    }

    /// Judged now, while /proc/PID still describes them: a process that lives a few
    /// milliseconds keeps these labels until its window is labelled. Those dropped go into
    /// the BPF deny list.
    fn met(&mut self, pids: &[u32], sampler: &mut Sampler) {
        self.target(pids, sampler);
    }

    /// Pinged from the sampling loop, not a task of its own: a window stuck in symbolising or
    /// the store then stops the pings, and systemd restarts the daemon.
    async fn chore_due(&mut self) {
        self.systemd.watchdog_due().await
    }

    fn chore(&mut self) {
        self.systemd.watchdog_ping();
    }
}
