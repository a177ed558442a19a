//! The sampling driver `record` and `run` share: the BPF side started, and one loop that
//! drains a window on each tick, reads off-CPU blocks as they come, meets new processes (the
//! unwinder's events, and discovery every 200 ms) and feeds the unwinder their tables, until
//! a deadline or the shutdown the caller passes in (mini-redis' `run(listener, shutdown)`).
//! What a command does with each window is its [`Consumer`]: `record` keeps them all for one
//! profile at the end, `run` symbolises, labels and stores each one.

use std::{
    future::Future,
    io,
    time::{Duration, Instant, SystemTime},
};

use tokio::{
    signal::unix::{signal, SignalKind},
    time::MissedTickBehavior,
};

use crate::{
    cmd::session::{ReadyFd, Session, DISCOVERY_INTERVAL},
    pipeline::{
        drain::{DrainError, Drainer, Losses, StackMapFill},
        off_cpu::OffCpuReader,
        sampler::{RuntimeMap, Sampler, SamplerConfig, SamplerError},
    },
    runtimes::Registry,
    symbolize::user::UserSymbolizer,
    unwind::loader::{LoaderError, Unwinder},
};

/// How often the off-CPU ring buffer is read: it holds about 1,600 blocks, so the cap's
/// 10,000 a second never fill it.
const OFF_CPU_READ_INTERVAL: Duration = Duration::from_millis(50);

/// What a command does with what sampling gathers. Every hook but [`Consumer::window`] has a
/// default that does nothing.
pub(crate) trait Consumer {
    type Error: From<DrainError>;

    /// A window was drained into `sampling.session` (its CPU samples, and the off-CPU blocks
    /// read up to now); `drained` says what it held.
    fn window(&mut self, sampling: &mut Sampling, drained: Drained) -> Result<(), Self::Error>;

    /// Whether a process the BPF side met gets its maps read and its tables built (the
    /// daemon's relabelling drops some).
    fn wants(&mut self, _pid: u32) -> bool {
        true
    }

    /// Processes met for the first time in this window (by discovery, or by the unwinder's
    /// events), while /proc still describes them.
    fn met(&mut self, _pids: &[u32], _sampler: &mut Sampler) {}

    /// A chore of the command's own, awaited beside sampling (the daemon's systemd watchdog):
    /// when this completes, [`Consumer::chore`] runs. Pending forever by default.
    async fn chore_due(&mut self) {
        std::future::pending::<()>().await
    }

    fn chore(&mut self) {}
}

/// What one drain took from the BPF maps.
#[derive(Debug, Clone)]
pub(crate) struct Drained {
    pub(crate) samples: u64,
    pub(crate) losses: Losses,
    pub(crate) stack_maps: StackMapFill,
    /// How long the drain took.
    pub(crate) took: Duration,
}

/// The BPF side and what reads it: the sampler and its drainer, the unwinder, the off-CPU
/// reader, and what they gathered ([`Session`]).
pub(crate) struct Sampling {
    pub(crate) sampler: Sampler,
    drainer: Drainer,
    /// Feeds the BPF unwinder its tables (`--unwind auto`).
    pub(crate) unwinder: Option<Unwinder>,
    off_cpu: Option<OffCpuSource>,
    pub(crate) session: Session,
}

/// The off-CPU program's ring buffer, and when it was last read: the next read's blocks
/// happened after it.
struct OffCpuSource {
    reader: OffCpuReader,
    last_read: SystemTime,
}

impl Sampling {
    /// Loads and attaches the BPF programs, and starts the unwinder's worker, which walks
    /// `registry`'s runtimes.
    pub(crate) fn start(
        config: &SamplerConfig,
        registry: Registry,
        mut symbolizer: UserSymbolizer,
    ) -> Result<Sampling, StartError> {
        let config = SamplerConfig {
            runtime_maps: registry
                .iter()
                .map(|r| RuntimeMap {
                    id: r.id(),
                    procs: r.procs_map(),
                    thread_pointer: r.thread_pointer(),
                })
                .collect(),
            runtime_counters: registry.iter().map(|r| r.counters()).collect(),
            ..config.clone()
        };
        let (mut sampler, maps, control) = Sampler::start(&config)?;
        symbolizer.set_runtimes(&registry);
        let unwinder = sampler
            .take_unwind_maps()
            .map(|maps| Unwinder::start(maps, registry))
            .transpose()?;
        let off_cpu = sampler.take_off_cpu_maps().map(|maps| OffCpuSource {
            reader: OffCpuReader::new(maps),
            last_read: SystemTime::now(),
        });
        Ok(Sampling {
            sampler,
            drainer: Drainer::new(maps, control),
            unwinder,
            off_cpu,
            session: Session::new(symbolizer, config.thread_ids),
        })
    }

    /// Builds the tables of `pids` before sampling counts (`record --pid`): a walk without
    /// them loses the stack (a binary without frame pointers) or its runtime frames. Waits for
    /// them at most `limit`, then drops what was sampled meanwhile.
    pub(crate) fn watch(&mut self, pids: &[u32], limit: Duration) -> Result<(), StartError> {
        let Some(unwinder) = &mut self.unwinder else {
            return Ok(());
        };
        self.session.keep_captures(unwinder.watch(pids)?);
        if pids.is_empty() {
            return Ok(());
        }
        unwinder.wait_for_tables(limit)?;
        self.session.take_runtimes(unwinder);
        self.drainer.drain_window()?;
        Ok(())
    }

    /// Drains the window into the session, with the off-CPU blocks read up to now, and lets
    /// the unwinder forget the processes that exited.
    pub(crate) fn drain(&mut self) -> Result<Drained, DrainError> {
        let started = Instant::now();
        let raw = self.drainer.drain_window()?;
        let drained = Drained {
            samples: raw.total_samples(),
            losses: raw.losses.clone(),
            stack_maps: raw.stack_maps,
            took: started.elapsed(),
        };
        self.session.add(raw);
        self.read_blocks();
        if let Some(unwinder) = &mut self.unwinder {
            unwinder.forget_exited();
        }
        Ok(drained)
    }

    /// Reads the blocks the off-CPU program sent since the last read into the session.
    fn read_blocks(&mut self) {
        let Some(source) = &mut self.off_cpu else {
            return;
        };
        let now = SystemTime::now();
        let blocks = source.reader.read();
        self.session.add_blocks(source.last_read, now, blocks);
        source.last_read = now;
    }

    /// The off-CPU reader, when off-CPU time is recorded.
    pub(crate) fn off_cpu(&self) -> Option<&OffCpuReader> {
        self.off_cpu.as_ref().map(|source| &source.reader)
    }

    /// Reads the unwinder's events: the maps it read go to the session at once (which opens
    /// their files while the processes live) and the consumer meets their processes; then the
    /// tables built go to the BPF side, waiting for those just asked for with `wait`.
    fn poll_unwinder<C: Consumer>(&mut self, consumer: &mut C, wait: bool) {
        let Sampling {
            sampler,
            drainer,
            unwinder,
            session,
            ..
        } = self;
        let Some(unwinder) = unwinder else {
            return;
        };
        drainer.read_walked();
        unwinder.note_runtime_stacks(drainer.take_runtime_stacks());
        // A process the maps have no room for walks by frame pointers (logged and counted by
        // the unwinder); sampling goes on.
        let polled = unwinder
            .poll(|pid| consumer.wants(pid))
            .map(|captured| session.keep_captures(captured));
        if let Ok(pids) = &polled {
            consumer.met(pids, sampler);
        }
        if let Err(err) = polled.and_then(|_| unwinder.install_tables(wait)) {
            tracing::warn!("{err}");
        }
        session.take_runtimes(unwinder);
    }

    /// Stops sampling and hands back what was gathered.
    pub(crate) fn stop(self) -> Session {
        self.session
    }
}

/// Why [`Sampling::start`] or [`Sampling::watch`] failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Sampler(#[from] SamplerError),
    #[error("loading unwind tables: {0}")]
    Unwind(#[from] LoaderError),
    #[error("draining the sampler's maps: {0}")]
    Drain(#[from] DrainError),
}

/// Samples until `until` (if any) or `shutdown`, whichever comes first, handing each window to
/// `consumer`. The last, partial window is left in the maps: the caller drains it
/// ([`Sampling::drain`]) when it is ready to.
pub(crate) async fn drive<C: Consumer>(
    sampling: &mut Sampling,
    consumer: &mut C,
    window: Duration,
    until: Option<tokio::time::Instant>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), C::Error> {
    let events = ReadyFd::new(
        sampling
            .unwinder
            .as_ref()
            .map(|unwinder| unwinder.events_fd()),
        "the unwinder's events",
    );
    let walked = ReadyFd::new(
        sampling
            .unwinder
            .as_ref()
            .map(|_| sampling.drainer.walked_fd()),
        "the walked stacks' ring",
    );
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + window, window);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut discover = tokio::time::interval(DISCOVERY_INTERVAL);
    discover.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut off_cpu_tick = tokio::time::interval(OFF_CPU_READ_INTERVAL);
    off_cpu_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let deadline = async {
        match until {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline, shutdown);
    loop {
        tokio::select! {
            // Checked in order: at the deadline the caller's final drain takes the last
            // window, rather than a tick draining it and leaving an empty one behind.
            biased;
            _ = &mut deadline => return Ok(()),
            _ = &mut shutdown => return Ok(()),
            // Before the windows: a window stuck in symbolising or the store then holds up
            // the chore (the watchdog's ping), as it should.
            _ = consumer.chore_due() => consumer.chore(),
            _ = ticker.tick() => {
                let drained = sampling.drain()?;
                consumer.window(sampling, drained)?;
                sampling.sampler.flush_logs();
            }
            _ = events.ready() => sampling.poll_unwinder(consumer, false),
            _ = walked.ready() => sampling.drainer.read_walked(),
            _ = off_cpu_tick.tick(), if sampling.off_cpu.is_some() => sampling.read_blocks(),
            _ = discover.tick() => {
                let new = sampling.session.discover(sampling.drainer.active_pids()?);
                consumer.met(&new, &mut sampling.sampler);
                sampling.poll_unwinder(consumer, true);
            }
        }
    }
}

/// SIGINT or SIGTERM, as a future that completes with what it was ("interrupted",
/// "terminated"): the shutdown the commands pass to [`drive`].
pub(crate) fn shutdown_signals() -> io::Result<impl Future<Output = &'static str>> {
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = sigint.recv() => "interrupted",
            _ = sigterm.recv() => "terminated",
        }
    })
}
