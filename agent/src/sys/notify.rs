//! systemd's service notification protocol, for `scorch run` under `Type=notify`: READY=1 once
//! BPF is attached (so `systemctl start` returns only when profiling works, and fails when it
//! cannot), STATUS= lines, and watchdog pings from the window loop when `WatchdogSec=` is set.
//!
//! The protocol is one datagram of `KEY=VALUE` lines to the unix socket `$NOTIFY_SOCKET` names
//! (a path, or `@name` for the abstract namespace); these few lines replace a dependency.
//! Outside systemd (no `$NOTIFY_SOCKET`) every call does nothing.

use std::{
    io,
    os::unix::net::{SocketAddr, UnixDatagram},
    time::Duration,
};

#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("NOTIFY_SOCKET={path:?}: {source}")]
    Socket { path: String, source: io::Error },
    #[error("sending {message:?} to systemd: {source}")]
    Send { message: String, source: io::Error },
}

/// The connection to the service manager, when there is one.
#[derive(Debug)]
pub struct Notifier {
    /// Unbound: systemd identifies the sender by its credentials, not its address.
    socket: UnixDatagram,
    address: SocketAddr,
    /// How often to ping: half of `WATCHDOG_USEC`, as sd_watchdog_enabled(3) advises, so one
    /// late ping is not yet a missed deadline.
    watchdog: Option<Duration>,
}

impl Notifier {
    /// The notifier the environment asks for; `None` when not started by systemd with
    /// `Type=notify` (or `NotifyAccess=`).
    pub fn from_env() -> Result<Option<Notifier>, NotifyError> {
        let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
            return Ok(None);
        };
        let path = path.to_string_lossy().into_owned();
        let watchdog = watchdog_interval(
            std::env::var("WATCHDOG_USEC").ok().as_deref(),
            std::env::var("WATCHDOG_PID").ok().as_deref(),
            std::process::id(),
        );
        Notifier::connect(&path, watchdog).map(Some)
    }

    fn connect(path: &str, watchdog: Option<Duration>) -> Result<Notifier, NotifyError> {
        let error = |source| NotifyError::Socket {
            path: path.to_owned(),
            source,
        };
        let address = match path.strip_prefix('@') {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(name.as_bytes()).map_err(error)?
            }
            None => SocketAddr::from_pathname(path).map_err(error)?,
        };
        let socket = UnixDatagram::unbound().map_err(error)?;
        // A manager that stops reading (or a socket no one reads) must not stop the daemon:
        // a blocking send to a full queue would hang the window loop the pings come from,
        // SIGTERM included. A full queue is an error like any other instead.
        socket.set_nonblocking(true).map_err(error)?;
        Ok(Notifier {
            socket,
            address,
            watchdog,
        })
    }

    /// Profiling works: the unit becomes active.
    pub fn ready(&self, status: &str) -> Result<(), NotifyError> {
        self.send(&format!("READY=1\nSTATUS={}", one_line(status)))
    }

    /// A line `systemctl status` shows.
    pub fn status(&self, status: &str) -> Result<(), NotifyError> {
        self.send(&format!("STATUS={}", one_line(status)))
    }

    /// Shutdown has begun (the last window is being flushed).
    pub fn stopping(&self) -> Result<(), NotifyError> {
        self.send("STOPPING=1\nSTATUS=stopping: flushing the last window")
    }

    /// Tells the watchdog the daemon's loop is alive.
    pub fn watchdog_ping(&self) -> Result<(), NotifyError> {
        self.send("WATCHDOG=1")
    }

    /// How often [`Notifier::watchdog_ping`] must be called; `None` without `WatchdogSec=`.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog
    }

    fn send(&self, message: &str) -> Result<(), NotifyError> {
        self.socket
            .send_to_addr(message.as_bytes(), &self.address)
            .map(|_| ())
            .map_err(|source| NotifyError::Send {
                message: message.to_owned(),
                source,
            })
    }
}

/// What the daemon's loop talks to: the notifier when there is one, the watchdog timer, and the
/// last status sent. Failures to notify are logged, never fatal: profiling matters more than
/// the manager hearing about it (a missed READY=1 fails the start by timeout anyway).
#[derive(Debug, Default)]
pub struct Systemd {
    notifier: Option<Notifier>,
    watchdog: Option<tokio::time::Interval>,
    /// Sent again only when it changes, so a steady daemon sends nothing but pings.
    last_status: String,
    /// The last message could not be sent: the next failures are not logged (a watchdog of a
    /// millisecond would log a thousand a second), the next success is.
    failing: std::sync::atomic::AtomicBool,
}

impl Systemd {
    /// From the environment; without `$NOTIFY_SOCKET` every method does nothing.
    pub fn from_env() -> Systemd {
        let notifier = Notifier::from_env().unwrap_or_else(|err| {
            tracing::warn!("systemd notification disabled: {err}");
            None
        });
        let watchdog = notifier
            .as_ref()
            .and_then(Notifier::watchdog_interval)
            .map(|period| {
                let mut timer = tokio::time::interval(period);
                timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                timer
            });
        Systemd {
            notifier,
            watchdog,
            last_status: String::new(),
            failing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub fn ready(&mut self, status: &str) {
        self.last_status = status.to_owned();
        self.report(|n| n.ready(status));
    }

    pub fn status(&mut self, status: &str) {
        if status != self.last_status {
            self.last_status = status.to_owned();
            self.report(|n| n.status(status));
        }
    }

    pub fn stopping(&self) {
        self.report(Notifier::stopping);
    }

    /// Completes when the next watchdog ping is due; never without a watchdog.
    pub async fn watchdog_due(&mut self) {
        match &mut self.watchdog {
            Some(timer) => {
                timer.tick().await;
            }
            None => std::future::pending().await,
        }
    }

    pub fn watchdog_ping(&self) {
        self.report(Notifier::watchdog_ping);
    }

    fn report(&self, send: impl FnOnce(&Notifier) -> Result<(), NotifyError>) {
        use std::sync::atomic::Ordering;
        if let Some(notifier) = &self.notifier {
            match send(notifier) {
                Ok(()) => {
                    if self.failing.swap(false, Ordering::Relaxed) {
                        tracing::info!("systemd notifications go through again");
                    }
                }
                Err(err) => {
                    if !self.failing.swap(true, Ordering::Relaxed) {
                        tracing::warn!("{err} (further failures not logged until one succeeds)");
                    }
                }
            }
        }
    }
}

/// Half of `WATCHDOG_USEC`, when the watchdog is meant for this process: `WATCHDOG_PID`, when
/// set, names the process that must ping (a forked child must not).
fn watchdog_interval(usec: Option<&str>, pid: Option<&str>, own_pid: u32) -> Option<Duration> {
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok() != Some(own_pid) {
            return None;
        }
    }
    let usec: u64 = usec?.trim().parse().ok()?;
    // A timeout too short to honour (`WATCHDOG_USEC=1`) still gets pings, at most every
    // millisecond: a zero period would make the timer panic.
    (usec > 0).then(|| Duration::from_micros(usec / 2).max(MIN_WATCHDOG_PERIOD))
}

/// The shortest ping period.
const MIN_WATCHDOG_PERIOD: Duration = Duration::from_millis(1);

/// Status text is one line of the protocol: a newline would start a new assignment.
fn one_line(text: &str) -> String {
    text.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receive(socket: &UnixDatagram) -> String {
        let mut buffer = [0u8; 512];
        let n = socket.recv(&mut buffer).unwrap();
        String::from_utf8_lossy(&buffer[..n]).into_owned()
    }

    #[test]
    fn messages_reach_a_path_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let systemd = UnixDatagram::bind(&path).unwrap();
        let notifier =
            Notifier::connect(path.to_str().unwrap(), Some(Duration::from_secs(15))).unwrap();
        notifier.ready("sampling 2 CPUs at 19 Hz").unwrap();
        assert_eq!(
            receive(&systemd),
            "READY=1\nSTATUS=sampling 2 CPUs at 19 Hz"
        );
        notifier.status("two\nlines").unwrap();
        assert_eq!(receive(&systemd), "STATUS=two lines");
        notifier.watchdog_ping().unwrap();
        assert_eq!(receive(&systemd), "WATCHDOG=1");
        notifier.stopping().unwrap();
        assert!(receive(&systemd).starts_with("STOPPING=1\n"));
        assert_eq!(notifier.watchdog_interval(), Some(Duration::from_secs(15)));
    }

    #[test]
    fn messages_reach_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("scorch-notify-test-{}", std::process::id());
        let address = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let systemd = UnixDatagram::bind_addr(&address).unwrap();
        let notifier = Notifier::connect(&format!("@{name}"), None).unwrap();
        notifier.watchdog_ping().unwrap();
        assert_eq!(receive(&systemd), "WATCHDOG=1");
    }

    #[test]
    fn a_manager_that_stops_reading_blocks_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        // Bound, never read: its queue fills.
        let _systemd = UnixDatagram::bind(&path).unwrap();
        let notifier = Notifier::connect(path.to_str().unwrap(), None).unwrap();
        let started = std::time::Instant::now();
        let failed = (0..100_000).find_map(|_| notifier.watchdog_ping().err());
        let err = failed.expect("a full queue is an error").to_string();
        assert!(err.contains("WATCHDOG=1"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_missing_socket_is_an_error_naming_it() {
        let notifier = Notifier::connect("/nonexistent/notify", None).unwrap();
        let err = notifier.ready("x").unwrap_err().to_string();
        assert!(err.contains("READY=1"), "{err}");
    }

    #[test]
    fn watchdog_interval_is_half_and_only_for_this_process() {
        assert_eq!(
            watchdog_interval(Some("30000000"), None, 7),
            Some(Duration::from_secs(15))
        );
        assert_eq!(
            watchdog_interval(Some("30000000"), Some("7"), 7),
            Some(Duration::from_secs(15))
        );
        assert_eq!(watchdog_interval(Some("30000000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval(None, None, 7), None);
        assert_eq!(
            watchdog_interval(Some("1"), None, 7),
            Some(MIN_WATCHDOG_PERIOD)
        );
        assert_eq!(watchdog_interval(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval(Some("soon"), None, 7), None);
    }
}
