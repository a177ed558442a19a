//! The sender: one thread with its own single-threaded runtime, so neither its SQLite reads
//! nor its encoding ever hold up the sampling loop. It reads the windows after its cursor in
//! the store, oldest first, sends each, and moves the cursor once the server has it. Every
//! request has a timeout; retryable failures are sent again with backoff and jitter, waiting
//! at least what `Retry-After` asks; a window the server refuses as bad is skipped.

use std::{
    path::Path,
    sync::Arc,
    time::{Duration, SystemTime},
};

use tokio::sync::{oneshot, watch};

use super::{
    debuginfo, encode_window, otlp, parca, pyroscope, ClientSettings, Endpoint, RemoteConfig,
    RemoteMetrics, RemoteProtocol, SendError, SinkError,
};
use crate::{
    profile::Profile,
    store::{Retention, Store, StoreError, TimeRange, WindowId},
    sys::{backoff::Backoff, time::unix_ns},
};

/// Windows read from the store per query, so a long backlog is never read whole; the queue
/// gauges count the backlog in SQL instead.
const BATCH: usize = 64;

/// Freed heap above which the sender hands memory back to the OS after encoding a window.
const RELEASE_ABOVE: usize = 1 << 20;

/// How often an idle sender looks for new windows in the store.
const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// First retry delay; doubled on each further failure of the same request, up to the cap.
pub(super) const BACKOFF_BASE: Duration = Duration::from_millis(500);
pub(super) const BACKOFF_CAP: Duration = Duration::from_secs(30);
/// The longest `Retry-After` honoured: a server asking for more is waited on this long.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(300);

/// What a sink's `#started` marker holds once it has started: any id but none.
const STARTED: WindowId = WindowId::new(1);

/// `Retry-After`: delta-seconds or an HTTP date, as a wait from `now`.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or_default())
}

/// How long to wait after `error`: what the server asked for when it said (capped), else
/// the next backoff step.
pub fn delay_after(backoff: &mut Backoff, error: &SendError, unit: f64) -> Duration {
    let next = backoff.next_delay_with(unit);
    match error {
        SendError::Retryable {
            retry_after: Some(asked),
            ..
        } => (*asked).min(RETRY_AFTER_CAP),
        _ => next,
    }
}

/// A prepared request of any protocol, sent as is on every retry.
enum Request {
    Pyroscope(pyroscope::Request),
    Parca(parca::Request),
    Otlp(otlp::Request),
}

/// The protocol client.
enum Client {
    Pyroscope(pyroscope::Client),
    Parca(parca::Client),
    Otlp(otlp::Client),
}

impl Client {
    /// Must run inside a tokio runtime (tonic's channel spawns its worker).
    fn new(protocol: RemoteProtocol, settings: &ClientSettings) -> Result<Client, SinkError> {
        Ok(match protocol {
            RemoteProtocol::Pyroscope => Client::Pyroscope(pyroscope::Client::new(settings)?),
            RemoteProtocol::Parca => Client::Parca(parca::Client::new(settings)?),
            RemoteProtocol::Otlp => Client::Otlp(otlp::Client::new(settings, true)?),
            RemoteProtocol::OtlpHttp => Client::Otlp(otlp::Client::new(settings, false)?),
        })
    }

    /// The requests that carry the window `profile`.
    fn prepare(&self, profile: &Profile) -> Vec<Request> {
        let start_ns = unix_ns(profile.start);
        let kind = profile.sample_type.kind();
        match self {
            Client::Pyroscope(_) => {
                encode_window(profile, || pyroscope::PushBuilder::new(start_ns, kind))
                    .into_iter()
                    .map(Request::Pyroscope)
                    .collect()
            }
            Client::Parca(_) => encode_window(profile, || parca::WriteRawBuilder::new(kind))
                .into_iter()
                .map(Request::Parca)
                .collect(),
            Client::Otlp(client) => client
                .prepare(profile)
                .into_iter()
                .map(Request::Otlp)
                .collect(),
        }
    }

    /// Sends one request; the bytes that went on the wire, and what the server rejected of
    /// a request it took (OTLP's partial success).
    async fn send(
        &mut self,
        request: &Request,
    ) -> Result<(u64, Option<otlp::PartialSuccess>), SendError> {
        match (self, request) {
            (Client::Pyroscope(client), Request::Pyroscope(request)) => {
                client.send(request).await.map(|bytes| (bytes, None))
            }
            (Client::Parca(client), Request::Parca(request)) => {
                client.send(request).await.map(|bytes| (bytes, None))
            }
            (Client::Otlp(client), Request::Otlp(request)) => client.send(request).await,
            // Our own mistake, not the server's, but the same outcome as a refusal: sending
            // it again cannot help, so the window is skipped.
            _ => Err(SendError::Rejected {
                message: "a request prepared for the other protocol".into(),
            }),
        }
    }
}

/// The running sender; [`SinkHandle::stop`] ends it.
pub struct SinkHandle {
    stop: watch::Sender<bool>,
    done: oneshot::Receiver<()>,
    thread: std::thread::JoinHandle<()>,
}

impl SinkHandle {
    /// Asks the sender to finish: it sends what is already in the store if the server takes
    /// it at once (no retries), and stops. Waits at most `budget`; what is left waits in the
    /// store for the next start.
    pub async fn stop(self, budget: Duration) {
        let _ = self.stop.send(true);
        match tokio::time::timeout(budget, self.done).await {
            Ok(_) => {
                let _ = self.thread.join();
            }
            Err(_) => tracing::info!(
                "remote sink: still sending at exit; the rest waits in the store for the next start"
            ),
        }
    }
}

/// The cursor's name in the store: one per server, so pointing scorch at another server
/// starts that one afresh rather than where the last one stopped.
pub fn cursor_name(protocol: RemoteProtocol, endpoint: &Endpoint) -> String {
    format!("remote:{}:{}", protocol.name(), endpoint.base)
}

/// Starts the sender on its own thread, once the store opened and the client was built (so a
/// bad configuration fails `scorch run` at start, not later in a log). With `debug_files`
/// (Parca only), the debug-info uploader runs beside it, on the same connection.
pub fn spawn(
    config: &RemoteConfig,
    store_dir: &Path,
    retention: Retention,
    metrics: Arc<RemoteMetrics>,
    debug_files: Option<debuginfo::DebugFileReceiver>,
) -> Result<SinkHandle, SinkError> {
    let settings = ClientSettings::new(config)?;
    let protocol = config.protocol;
    let store = Store::open(store_dir, retention)?;
    let temp_dir = store_dir.to_owned();
    let (stop_tx, stop_rx) = watch::channel(false);
    let (done_tx, done_rx) = oneshot::channel();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("scorch-remote".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(err) => {
                    let _ = ready_tx.send(Err(SinkError::Thread(err)));
                    return;
                }
            };
            runtime.block_on(async move {
                let sender = match Sender::new(protocol, &settings, store, metrics.clone()) {
                    Ok(sender) => sender,
                    Err(err) => {
                        let _ = ready_tx.send(Err(err));
                        return;
                    }
                };
                let uploader = match (debug_files, &sender.client) {
                    (Some(files), Client::Parca(client)) => match debuginfo::Uploader::new(
                        client.connection(),
                        &settings,
                        files,
                        metrics,
                        stop_rx.clone(),
                        temp_dir,
                    ) {
                        Ok(uploader) => Some(uploader),
                        Err(err) => {
                            let _ = ready_tx.send(Err(err));
                            return;
                        }
                    },
                    _ => None,
                };
                let _ = ready_tx.send(Ok(()));
                // One task: the uploader's calls and the sender's share the thread, and an
                // upload's extraction runs on the blocking pool.
                tokio::join!(sender.run(stop_rx), async {
                    if let Some(uploader) = uploader {
                        uploader.run().await;
                    }
                });
            });
            let _ = done_tx.send(());
        })
        .map_err(SinkError::Thread)?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(SinkHandle {
            stop: stop_tx,
            done: done_rx,
            thread,
        }),
        Ok(Err(err)) => Err(err),
        Err(_) => Err(SinkError::Thread(std::io::Error::other(
            "the remote sink's thread ended while starting",
        ))),
    }
}

/// How one window's delivery ended.
enum Outcome {
    /// The server has it (or it was refused as bad, or retention deleted it): move on.
    Done,
    /// Stopping: leave it for the next start.
    Stopped,
}

/// The delivery loop and what it keeps between windows.
struct Sender {
    client: Client,
    store: Store,
    metrics: Arc<RemoteMetrics>,
    cursor_name: String,
    /// The last window delivered (or given up on).
    cursor: WindowId,
    endpoint: String,
    /// When the server started failing, so the log says so once and says when it is back.
    failing_since: Option<SystemTime>,
}

impl Sender {
    fn new(
        protocol: RemoteProtocol,
        settings: &ClientSettings,
        store: Store,
        metrics: Arc<RemoteMetrics>,
    ) -> Result<Sender, SinkError> {
        let client = Client::new(protocol, settings)?;
        let cursor_name = cursor_name(protocol, &settings.endpoint);
        let cursor = start_cursor(&store, &cursor_name)?;
        tracing::info!(
            "sending profiles to {} ({}), from window {}",
            settings.endpoint.base,
            protocol.name(),
            cursor.get() + 1
        );
        Ok(Sender {
            client,
            store,
            metrics,
            cursor_name,
            cursor,
            endpoint: settings.endpoint.base.clone(),
            failing_since: None,
        })
    }

    async fn run(mut self, mut stop: watch::Receiver<bool>) {
        loop {
            let stopping = *stop.borrow();
            // A bounded read: a backlog of days (a server away for long) is read a batch at a
            // time, never whole.
            let pending = match self.store.windows_after(self.cursor, BATCH) {
                Ok(pending) => pending,
                Err(err) => {
                    tracing::warn!("remote sink: reading the store: {err}");
                    if stopping || !wait(POLL_INTERVAL, &mut stop).await {
                        return;
                    }
                    continue;
                }
            };
            self.report_queue();
            if pending.is_empty() {
                if stopping {
                    return;
                }
                // A stop ends the wait early: one more pass sends what the store took since
                // this one read it (the windows written just before the stop), as `stop` says.
                wait(POLL_INTERVAL, &mut stop).await;
                continue;
            }
            for &(id, range) in &pending {
                // Window ids only grow by one per window written: a gap is windows retention
                // deleted before they could be sent.
                let skipped = id.get().saturating_sub(self.cursor.get()).saturating_sub(1);
                if skipped > 0 {
                    self.metrics.windows_dropped(skipped as u64);
                    tracing::warn!(
                        "remote sink: {skipped} windows were deleted by retention before they \
                         could be sent"
                    );
                }
                match self.deliver(id, range, &mut stop).await {
                    Outcome::Done => {
                        self.cursor = id;
                        self.report_queue();
                        if let Err(err) = self.store.set_cursor(&self.cursor_name, id) {
                            // The window is delivered; at worst it is sent again after a
                            // restart.
                            tracing::warn!("remote sink: saving the cursor: {err}");
                        }
                    }
                    Outcome::Stopped => return,
                }
            }
        }
    }

    /// Sets the queue gauges: windows after the cursor, and how old the oldest is.
    fn report_queue(&self) {
        let Ok((windows, oldest)) = self.store.backlog_after(self.cursor) else {
            return; // Left as they were; the next report corrects them.
        };
        let age = oldest
            .and_then(|range| SystemTime::now().duration_since(range.to).ok())
            .unwrap_or_default();
        self.metrics.set_queue(windows, age.as_secs_f64());
    }

    /// Waits `delay` before a retry, setting the queue gauges at least every
    /// `POLL_INTERVAL`: the queue grows while the server is away, and a backoff grows to
    /// `BACKOFF_CAP`, far longer than a scrape interval. False when a stop was asked.
    async fn wait_reporting_queue(
        &self,
        delay: Duration,
        stop: &mut watch::Receiver<bool>,
    ) -> bool {
        let mut left = delay;
        loop {
            self.report_queue();
            let step = left.min(POLL_INTERVAL);
            if !wait(step, stop).await {
                return false;
            }
            left = left.saturating_sub(step);
            if left.is_zero() {
                return true;
            }
        }
    }

    async fn deliver(
        &mut self,
        id: WindowId,
        range: TimeRange,
        stop: &mut watch::Receiver<bool>,
    ) -> Outcome {
        let mut backoff = Backoff::new(BACKOFF_BASE, BACKOFF_CAP);
        let profile = loop {
            match self.store.window_profile(id) {
                Ok(Some(profile)) => break profile,
                Ok(None) => {
                    self.metrics.windows_dropped(1);
                    return Outcome::Done;
                }
                Err(err) => {
                    tracing::warn!("remote sink: reading window {id}: {err}");
                    if *stop.borrow() || !wait(backoff.next_delay(), stop).await {
                        return Outcome::Stopped;
                    }
                }
            }
        };
        let requests = self.client.prepare(&profile);
        drop(profile);
        // Encoding a window's hundreds of series leaves the sender's arena holding several
        // times the requests' size in freed memory; a sender waiting out a server that is away
        // should not keep it.
        crate::sys::allocator::release_free_memory_above(RELEASE_ABOVE);
        for (index, request) in requests.iter().enumerate() {
            loop {
                match self.client.send(request).await {
                    Ok((bytes, partial)) => {
                        self.metrics.sent_bytes(bytes);
                        if let Some(partial) = partial {
                            // Kept in part: sending again cannot help, the spec says, so
                            // the rest stands as delivered and the loss is said and counted.
                            self.metrics.profiles_rejected(partial.rejected_profiles);
                            tracing::warn!(
                                "remote sink: {} rejected {} profiles of window {id} ({}, \
                                 request {} of {}): {}",
                                self.endpoint,
                                partial.rejected_profiles,
                                humantime::format_rfc3339_seconds(range.from),
                                index + 1,
                                requests.len(),
                                partial.message
                            );
                        }
                        if let Some(since) = self.failing_since.take() {
                            tracing::info!(
                                "remote sink: {} accepts profiles again (failing for {:.0?})",
                                self.endpoint,
                                since.elapsed().unwrap_or_default()
                            );
                        }
                        break;
                    }
                    Err(error @ SendError::Rejected { .. }) => {
                        self.metrics.failed(error.reason());
                        self.metrics.window_rejected();
                        tracing::warn!(
                            "remote sink: {} refused window {id} ({}, request {} of {}): {}; \
                             skipping it",
                            self.endpoint,
                            humantime::format_rfc3339_seconds(range.from),
                            index + 1,
                            requests.len(),
                            error.message()
                        );
                        return Outcome::Done;
                    }
                    Err(error) => {
                        self.metrics.failed(error.reason());
                        if self.failing_since.is_none() {
                            self.failing_since = Some(SystemTime::now());
                            tracing::warn!(
                                "remote sink: sending to {} failed ({}: {}); retrying, windows \
                                 wait in the store meanwhile",
                                self.endpoint,
                                error.reason().as_str(),
                                error.message()
                            );
                        } else {
                            tracing::debug!(
                                "remote sink: {}: {}",
                                error.reason().as_str(),
                                error.message()
                            );
                        }
                        // Stopping: no retries, the window waits in the store.
                        if *stop.borrow() {
                            return Outcome::Stopped;
                        }
                        let delay = delay_after(&mut backoff, &error, fastrand::f64());
                        self.metrics.retried();
                        if !self.wait_reporting_queue(delay, stop).await {
                            return Outcome::Stopped;
                        }
                    }
                }
            }
        }
        self.metrics.window_sent();
        // A window's profile, series and requests are megabytes freed at once; glibc would
        // keep those pages in this thread's arena for the daemon's whole life.
        drop(requests);
        crate::sys::allocator::release_free_memory();
        Outcome::Done
    }
}

/// Waits `delay`; false when a stop was asked meanwhile.
pub(super) async fn wait(delay: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    let slept = tokio::select! {
        _ = tokio::time::sleep(delay) => true,
        _ = stop.wait_for(|&s| s) => false,
    };
    slept && !*stop.borrow()
}

/// Where delivery starts. A sink seen before goes on from its cursor, so a restart sends the
/// backlog; a sink new to this store starts after the windows already there, rather than
/// pushing days of history at a server that never asked for it.
fn start_cursor(store: &Store, name: &str) -> Result<WindowId, StoreError> {
    let started = format!("{name}#started");
    if store.cursor(&started)? != WindowId::NONE {
        return store.cursor(name);
    }
    let mut newest = store.cursor(name)?;
    loop {
        let page = store.windows_after(newest, 10_000)?;
        match page.last() {
            Some(&(id, _)) => newest = id,
            None => break,
        }
    }
    store.set_cursor(name, newest)?;
    store.set_cursor(&started, STARTED)?;
    Ok(newest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::FailureReason;
    use crate::profile::sample_profile;

    #[test]
    fn retry_after_takes_seconds_and_dates() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
        // RFC 9110's example date is 784111777.
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:47 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
    }

    #[test]
    fn retry_after_wins_capped() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        // A server's Retry-After wins, capped.
        let asked = SendError::Retryable {
            reason: FailureReason::Throttled,
            message: String::new(),
            retry_after: Some(Duration::from_secs(4)),
        };
        assert_eq!(
            delay_after(&mut backoff, &asked, 0.0),
            Duration::from_secs(4)
        );
        let greedy = SendError::Retryable {
            reason: FailureReason::Throttled,
            message: String::new(),
            retry_after: Some(Duration::from_secs(86400)),
        };
        assert_eq!(delay_after(&mut backoff, &greedy, 0.0), RETRY_AFTER_CAP);
    }

    #[test]
    fn a_new_sink_starts_after_the_history_and_a_known_one_where_it_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path(), Retention::default()).unwrap();
        let mut profile = sample_profile();
        profile.start = SystemTime::now() - Duration::from_secs(100);
        store.write_window(&profile).unwrap();
        store.write_window(&profile).unwrap();
        assert_eq!(start_cursor(&store, "remote:x").unwrap(), WindowId::new(2));
        // Delivered nothing yet, restarted with a backlog: it stays.
        store.write_window(&profile).unwrap();
        assert_eq!(start_cursor(&store, "remote:x").unwrap(), WindowId::new(2));
        store.set_cursor("remote:x", WindowId::new(3)).unwrap();
        assert_eq!(start_cursor(&store, "remote:x").unwrap(), WindowId::new(3));
        // A fresh store: a backlog from cursor 0 is kept across restarts too.
        let fresh = tempfile::tempdir().unwrap();
        let mut store = Store::open(fresh.path(), Retention::default()).unwrap();
        assert_eq!(start_cursor(&store, "remote:y").unwrap(), WindowId::NONE);
        store.write_window(&profile).unwrap();
        assert_eq!(start_cursor(&store, "remote:y").unwrap(), WindowId::NONE);
    }
}
