//! The daemon's HTTP server: the query API over the local store, Prometheus metrics, a health
//! check and the flame-graph page.
//!
//! | route | answer |
//! |---|---|
//! | `GET /` | the UI (`ui/index.html`, self-contained: no network, no CDN) |
//! | `GET /api/v1/profile?from=&to=&match=&format=&orientation=` | the merged profile: `pprof` (default; gzipped protobuf, so `go tool pprof URL` works), `svg` (inferno flame graph: `orientation=icicle`, the default, root on top, or `classic`), `folded`, or `top` (pprof `-top` text) |
//! | `GET /api/v1/top?from=&to=&match=&limit=` | the top-functions table as JSON, for the UI |
//! | `GET /api/v1/series?from=&to=&match=` | the label sets with samples in the range, as JSON |
//! | `/api/v1/timeline`, `/api/v1/diff`, `/api/v1/labels` | the UI's timeline, differential profiles and label names: [`super::views`] |
//! | `GET, POST /symbolz` | the symbol service `go tool pprof URL` asks for names a profile lacks ([`super::symbolz`]): the names the store holds for those addresses |
//! | `GET /metrics` | Prometheus (OpenMetrics text) |
//! | `GET /healthz` | `200 ok`, or `503` and the reason |
//!
//! The profile, top and series routes take `type=cpu` (the default) or `type=off-cpu`:
//! which windows they merge (off-CPU values are nanoseconds blocked).
//!
//! `from`/`to` take RFC 3339, Unix seconds or `now-15m` ([`crate::parse::timespec`]); without them
//! the last 15 minutes. `match` is a Prometheus selector ([`crate::parse::selector`]). A bad parameter
//! is a 400 naming it; a store that cannot be read is a 503 (500 if it is not a scorch store).
//!
//! Anyone who can reach the port can send anything, so the server bounds what a request may
//! cost: requests not meant for this server are refused ([`super::guard`]); at most
//! [`MAX_CONNECTIONS`] connections (and [`MAX_CONNECTIONS_PER_PEER`] from one address), each
//! given [`HEADER_READ_TIMEOUT`] to send its headers and [`CONNECTION_LIFETIME`] in all;
//! queries parse, run and encode their answer on the blocking pool, at most
//! [`MAX_CONCURRENT_QUERIES`] at a time, and one that waits more than [`QUERY_QUEUE_WAIT`] for
//! its turn gets a 503 with `Retry-After`. `/metrics` and `/healthz` never wait behind a query.

use std::{
    collections::HashMap,
    future::Future,
    io,
    net::IpAddr,
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant, SystemTime},
};

use axum::{
    body::Body,
    extract::{Query, RawQuery, Request, State},
    http::{header, HeaderValue, StatusCode},
    middleware::{self, Next},
    response::{Html, IntoResponse, Response},
    routing::get,
    Router,
};
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use serde::Deserialize;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use super::guard::AllowedHosts;
use super::symbolz::{self, SymbolzError};

use crate::{
    metrics::{Health, Registry},
    parse::selector::{Selector, SelectorError},
    parse::timespec::{self, TimeError},
    profile::encode::{self, svg::Orientation, EncodeOptions, Format},
    profile::{Profile, SampleKind},
    store::{Labels, QueryLimits, Store, StoreError, TimeRange},
};

/// Connections served at once; beyond it, new ones wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 256;
/// Connections from one peer address at once, so one client cannot take every slot.
pub const MAX_CONNECTIONS_PER_PEER: usize = 32;
/// Time a client has to send a request's headers (and, between requests, to start the next),
/// so idle or trickling connections (slowloris) give their slot back.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest a connection lives, whatever it does.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(300);
/// Store queries running at once: each holds a blocking thread and a merge's memory.
pub const MAX_CONCURRENT_QUERIES: usize = 2;
/// How long a query waits for its turn before it is told to come back.
pub const QUERY_QUEUE_WAIT: Duration = Duration::from_secs(2);
/// Distinct (series, stack) pairs one query may merge. Measured (the adversarial suite's
/// heavy-queries attack): a merge of 60,000 synthetic 24-frame stacks, encoded as pprof and
/// top at once, took the daemon from 15 to 138 MiB, about 1 KiB per stack and query; 50,000
/// keeps two queries at a time inside the daemon's 150 MiB bound.
pub const MAX_QUERY_STACKS: usize = 50_000;
/// Stacks a flame graph or folded answer holds: the heaviest, the rest summed into one line.
/// Drawing takes about 6 KiB per stack while it runs (6,000 stacks 40 MiB, 60,000 300 MiB),
/// so two queries at a time stay well inside the daemon's 150 MiB bound. The stacks left out
/// are each narrower than a pixel of a picture this size; pprof and top keep them all.
pub const MAX_DRAWN_STACKS: usize = 8_000;
/// How long a connection may finish its request once the server stops. A half-sent request
/// (slowloris) would otherwise hold SIGTERM up for the whole grace; the window loop's own
/// flush must still fit systemd's stop timeout after it.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);
/// How long one query may run before it is stopped with a 503.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(20);

/// What the handlers share.
#[derive(Debug)]
pub struct HttpState {
    /// The store the daemon writes; each query opens it read-only.
    pub store_dir: PathBuf,
    /// Every subsystem's metrics, encoded on each `GET /metrics`.
    pub metrics: Arc<Registry>,
    /// Asked on each `GET /healthz`.
    pub health: Arc<Health>,
    /// The daemon's window length, which the UI shows so a user knows how fresh the data is.
    pub window: Duration,
    /// The names requests may address this server by.
    pub allowed_hosts: AllowedHosts,
    /// Turns for store queries ([`MAX_CONCURRENT_QUERIES`]).
    pub queries: Arc<Semaphore>,
}

impl HttpState {
    pub fn new(
        store_dir: PathBuf,
        metrics: Arc<Registry>,
        health: Arc<Health>,
        window: Duration,
        allowed_hosts: AllowedHosts,
    ) -> HttpState {
        HttpState {
            store_dir,
            metrics,
            health,
            window,
            allowed_hosts,
            queries: Arc::new(Semaphore::new(MAX_CONCURRENT_QUERIES)),
        }
    }

    /// A turn to query the store, or [`ApiError::Busy`] after [`QUERY_QUEUE_WAIT`].
    pub(super) async fn query_turn(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        match tokio::time::timeout(QUERY_QUEUE_WAIT, self.queries.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(ApiError::Busy),
        }
    }
}

/// Why a request failed, and so its status.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("parameter {param}: {message}")]
    BadParameter {
        param: &'static str,
        message: String,
    },
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("encoding the profile: {0}")]
    Encode(String),
    #[error("query task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("busy: {MAX_CONCURRENT_QUERIES} queries are running; retry shortly")]
    Busy,
}

impl ApiError {
    pub(super) fn bad(param: &'static str, message: impl ToString) -> ApiError {
        ApiError::BadParameter {
            param,
            message: message.to_string(),
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            ApiError::BadParameter { .. } => StatusCode::BAD_REQUEST,
            // A file that is not a store will not become one by retrying.
            ApiError::Store(StoreError::Foreign { .. }) => StatusCode::INTERNAL_SERVER_ERROR,
            // The request asks for too much: a smaller one will work.
            ApiError::Store(StoreError::TooLarge { .. }) => StatusCode::UNPROCESSABLE_ENTITY,
            // Missing (nothing written yet), locked, or unreadable: may well pass.
            ApiError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Encode(_) | ApiError::Task(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Busy => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!("HTTP API: {self}");
        }
        let busy = matches!(self, ApiError::Busy);
        let mut response = (status, format!("{self}\n")).into_response();
        if busy {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// The query string of the profile, top and series routes; every field is optional text, so
/// parsing (and its error messages) is ours rather than the extractor's.
#[derive(Debug, Default, Deserialize)]
pub struct QueryParams {
    pub from: Option<String>,
    pub to: Option<String>,
    #[serde(rename = "match")]
    pub selector: Option<String>,
    pub format: Option<String>,
    pub limit: Option<String>,
    pub orientation: Option<String>,
    /// `cpu` (the default) or `off-cpu`: which windows.
    #[serde(rename = "type")]
    pub kind: Option<String>,
}

/// A query with its parameters checked.
#[derive(Debug)]
pub struct ParsedQuery {
    pub range: TimeRange,
    pub selector: Selector,
    pub format: Format,
    /// Rows of the top table, at most.
    pub limit: Option<usize>,
    /// Which way a flame graph grows.
    pub orientation: Orientation,
    /// CPU samples or off-CPU time.
    pub kind: SampleKind,
}

/// The span a query without `from` covers.
pub const DEFAULT_SPAN: Duration = Duration::from_secs(15 * 60);

impl QueryParams {
    /// Checks every parameter, naming the first bad one; `now` resolves relative times.
    pub fn parse(&self, now: SystemTime) -> Result<ParsedQuery, ApiError> {
        let time = |param: &'static str, text: &Option<String>| {
            text.as_deref()
                .filter(|t| !t.trim().is_empty())
                .map(|t| timespec::parse_time(t, now).map_err(|e| ApiError::bad(param, e)))
                .transpose()
        };
        let from = time("from", &self.from)?;
        let to = time("to", &self.to)?.unwrap_or(now);
        let from = from.unwrap_or_else(|| {
            to.checked_sub(DEFAULT_SPAN)
                .unwrap_or(SystemTime::UNIX_EPOCH)
        });
        if from >= to {
            let empty = TimeError::EmptyRange {
                from: humantime::format_rfc3339_millis(from).to_string(),
                to: humantime::format_rfc3339_millis(to).to_string(),
            };
            return Err(ApiError::bad("from", empty));
        }
        let selector = match self.selector.as_deref() {
            Some(text) => {
                Selector::parse(text).map_err(|e: SelectorError| ApiError::bad("match", e))?
            }
            None => Selector::all(),
        };
        let format = match self.format.as_deref().map(str::trim) {
            None | Some("") => Format::Pprof,
            Some(text) => <Format as clap::ValueEnum>::from_str(text, true).map_err(|_| {
                ApiError::bad(
                    "format",
                    format!("{text:?} is not one of pprof, svg, folded, top"),
                )
            })?,
        };
        let limit = match self.limit.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(text) => Some(text.parse::<usize>().map_err(|_| {
                ApiError::bad("limit", format!("{text:?} is not a number of rows"))
            })?),
        };
        let orientation = match self.orientation.as_deref().map(str::trim) {
            None | Some("") => Orientation::default(),
            Some(text) => <Orientation as clap::ValueEnum>::from_str(text, true).map_err(|_| {
                ApiError::bad(
                    "orientation",
                    format!("{text:?} is not one of icicle, classic"),
                )
            })?,
        };
        let kind = parse_kind(&self.kind)?;
        Ok(ParsedQuery {
            range: TimeRange { from, to },
            selector,
            format,
            limit,
            orientation,
            kind,
        })
    }
}

/// The `type` parameter: `cpu` when absent or empty.
pub(super) fn parse_kind(text: &Option<String>) -> Result<SampleKind, ApiError> {
    match text.as_deref().map(str::trim) {
        None | Some("") => Ok(SampleKind::Cpu),
        Some(text) => SampleKind::parse(text).map_err(|e| ApiError::bad("type", e)),
    }
}

/// Serves until `shutdown` resolves, then lets requests in flight finish within
/// [`SHUTDOWN_GRACE`] (connections are asked to close after their current request).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<HttpState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let service = TowerToHyperService::new(router(state));
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let per_peer: Arc<Mutex<HashMap<IpAddr, usize>>> = Arc::default();
    let (stop, stopped) = watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            _ = &mut shutdown => break,
            slot = slots.clone().acquire_owned() => slot,
        };
        let Ok(slot) = slot else { break };
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors (EMFILE) or a connection reset before accept: wait a
                    // moment rather than spin, and keep serving.
                    tracing::debug!("HTTP: accepting a connection: {error}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(peer_slot) = PeerSlot::take(&per_peer, peer.ip()) else {
            tracing::debug!("HTTP: {peer} has {MAX_CONNECTIONS_PER_PEER} connections open already");
            continue; // Dropping the stream closes it.
        };
        while connections.try_join_next().is_some() {}
        let service = service.clone();
        let mut stopped = stopped.clone();
        connections.spawn(async move {
            let _slots = (slot, peer_slot);
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .max_buf_size(64 << 10);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let lifetime = tokio::time::sleep(CONNECTION_LIFETIME);
            tokio::pin!(lifetime);
            tokio::select! {
                _ = connection.as_mut() => return,
                _ = stopped.wait_for(|&s| s) => {}
                _ = &mut lifetime => {}
            }
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, connection).await;
        });
    }
    let _ = stop.send(true);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// One of a peer's [`MAX_CONNECTIONS_PER_PEER`], given back when dropped.
struct PeerSlot {
    counts: Arc<Mutex<HashMap<IpAddr, usize>>>,
    peer: IpAddr,
}

impl PeerSlot {
    fn take(counts: &Arc<Mutex<HashMap<IpAddr, usize>>>, peer: IpAddr) -> Option<PeerSlot> {
        let mut map = counts.lock().unwrap_or_else(PoisonError::into_inner);
        let open = map.entry(peer).or_insert(0);
        if *open >= MAX_CONNECTIONS_PER_PEER {
            return None;
        }
        *open += 1;
        Some(PeerSlot {
            counts: Arc::clone(counts),
            peer,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut map = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(open) = map.get_mut(&self.peer) {
            *open -= 1;
            if *open == 0 {
                map.remove(&self.peer);
            }
        }
    }
}

/// The routes, apart from the listener so tests can drive them directly.
pub fn router(state: Arc<HttpState>) -> Router {
    Router::new()
        .route("/", get(ui))
        .route("/api/v1/profile", get(profile))
        .route("/api/v1/top", get(top))
        .route("/api/v1/series", get(series))
        .merge(super::views::routes())
        .route("/symbolz", get(symbolz_get).post(symbolz_post))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// Refuses requests not meant for this server, before any handler runs.
async fn guard(State(state): State<Arc<HttpState>>, request: Request, next: Next) -> Response {
    match state.allowed_hosts.check(request.headers()) {
        Ok(()) => next.run(request).await,
        Err(refusal) => {
            tracing::debug!("HTTP: refused {}: {refusal}", request.uri().path());
            (StatusCode::FORBIDDEN, format!("{refusal}\n")).into_response()
        }
    }
}

const UI_PAGE: &str = include_str!("ui/index.html");

async fn ui(State(state): State<Arc<HttpState>>) -> Html<String> {
    // The one value the page cannot ask for: how often the data changes.
    Html(UI_PAGE.replace(
        "{{WINDOW_SECONDS}}",
        &state.window.as_secs_f64().to_string(),
    ))
}

/// Parses the parameters and merges the matching windows, on the blocking pool and in the
/// query's turn: a selector's regexes are compiled there too, never on the async workers that
/// answer `/healthz` and `/metrics`. The turn comes back with the profile: whatever the caller
/// makes of the merge (a flame graph, a table) is part of the query's cost and runs in it.
async fn query_store(
    state: &HttpState,
    params: QueryParams,
) -> Result<(ParsedQuery, Profile, OwnedSemaphorePermit), ApiError> {
    let turn = state.query_turn().await?;
    let dir = state.store_dir.clone();
    let (query, profile) = tokio::task::spawn_blocking(move || {
        let query = params.parse(SystemTime::now())?;
        let limits = QueryLimits::new(MAX_QUERY_STACKS, QUERY_TIMEOUT);
        let profile = Store::open_read_only(&dir)?.query_within(
            query.range,
            query.kind,
            &|labels: &Labels| query.selector.matches(labels),
            limits,
        )?;
        Ok::<_, ApiError>((query, profile))
    })
    .await??;
    Ok((query, profile, turn))
}

async fn profile(
    State(state): State<Arc<HttpState>>,
    Query(params): Query<QueryParams>,
) -> Result<Response, ApiError> {
    let (query, profile, turn) = query_store(&state, params).await?;
    let title = flame_graph_title(&query);
    let (format, limit, orientation) = (query.format, query.limit, query.orientation);
    // Encoding a large merge is CPU work too, and a flame graph's text can take several times
    // the merge's memory: off the async threads, and still in the query's turn.
    let response = tokio::task::spawn_blocking(move || -> Result<Response, ApiError> {
        let _turn = turn;
        let options = EncodeOptions {
            title: &title,
            top_limit: limit,
            max_stacks: Some(MAX_DRAWN_STACKS),
            orientation,
        };
        let bytes = encode::encode(format, &profile, options)
            .map_err(|e| ApiError::Encode(e.to_string()))?;
        let mut response = ([(header::CONTENT_TYPE, format.content_type())], bytes).into_response();
        if format == Format::Pprof {
            response.headers_mut().insert(
                header::CONTENT_DISPOSITION,
                header::HeaderValue::from_static("attachment; filename=\"scorch.pb.gz\""),
            );
        }
        Ok(response)
    })
    .await??;
    Ok(response)
}

/// `CPU 2024-05-01T12:00:00Z .. 12:15:00Z {comm="x"}`: what the picture shows, on it.
fn flame_graph_title(query: &ParsedQuery) -> String {
    let from = humantime::format_rfc3339_seconds(query.range.from).to_string();
    let to = humantime::format_rfc3339_seconds(query.range.to).to_string();
    let what = match query.kind {
        SampleKind::Cpu => "CPU",
        SampleKind::OffCpu => "Off-CPU",
    };
    let mut title = format!("{what} {from} .. {to}");
    if !query.selector.is_empty() {
        title.push(' ');
        title.push_str(&query.selector.to_string());
    }
    title
}

async fn top(
    State(state): State<Arc<HttpState>>,
    Query(params): Query<QueryParams>,
) -> Result<Response, ApiError> {
    let (query, profile, turn) = query_store(&state, params).await?;
    let limit = query.limit;
    tokio::task::spawn_blocking(move || {
        let _turn = turn;
        let mut table = encode::top::top(&profile);
        if let Some(limit) = limit {
            table.rows.truncate(limit);
        }
        json(&table)
    })
    .await?
}

async fn series(
    State(state): State<Arc<HttpState>>,
    Query(params): Query<QueryParams>,
) -> Result<Response, ApiError> {
    let _turn = state.query_turn().await?;
    let dir = state.store_dir.clone();
    let matching = tokio::task::spawn_blocking(move || -> Result<Vec<Labels>, ApiError> {
        let query = params.parse(SystemTime::now())?;
        let all = Store::open_read_only(&dir)?.series(query.range, query.kind)?;
        Ok(all
            .into_iter()
            .filter(|labels| query.selector.matches(labels))
            .collect())
    })
    .await??;
    json(&matching)
}

/// `GET /symbolz`: `num_symbols`, or, with addresses as the query string (`?0x1+0x2`), their
/// names, as Go's server answers both.
async fn symbolz_get(
    State(state): State<Arc<HttpState>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    match symbolz::parse_addresses(query.unwrap_or_default().as_bytes()) {
        Ok(addresses) => symbolz_answer(&state, addresses).await,
        Err(refusal) => Ok(symbolz_refusal(refusal)),
    }
}

/// `POST /symbolz`: the body's addresses (`0x1+0x2`), read within [`symbolz::MAX_BODY_BYTES`]
/// and [`symbolz::BODY_READ_TIMEOUT`] before the query's turn is taken.
async fn symbolz_post(
    State(state): State<Arc<HttpState>>,
    body: Body,
) -> Result<Response, ApiError> {
    use http_body_util::{BodyExt, LengthLimitError, Limited};
    let read = Limited::new(body, symbolz::MAX_BODY_BYTES).collect();
    let body = match tokio::time::timeout(symbolz::BODY_READ_TIMEOUT, read).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(error)) if error.downcast_ref::<LengthLimitError>().is_some() => {
            return Ok(symbolz_refusal(SymbolzError::BodyTooLarge))
        }
        Ok(Err(error)) => return Ok(symbolz_refusal(SymbolzError::Body(error.to_string()))),
        Err(_) => return Ok(symbolz_refusal(SymbolzError::SlowBody)),
    };
    match symbolz::parse_addresses(&body) {
        Ok(addresses) => symbolz_answer(&state, addresses).await,
        Err(refusal) => Ok(symbolz_refusal(refusal)),
    }
}

/// The names the store holds for `addresses` (none asked: only `num_symbols`), in a query's
/// turn and on the blocking pool: the lookup scans the stored locations.
async fn symbolz_answer(
    state: &HttpState,
    addresses: std::collections::BTreeSet<u64>,
) -> Result<Response, ApiError> {
    let _turn = state.query_turn().await?;
    let dir = state.store_dir.clone();
    let answer = tokio::task::spawn_blocking(move || -> Result<String, ApiError> {
        let store = Store::open_read_only(&dir)?;
        let limits = QueryLimits::new(MAX_QUERY_STACKS, QUERY_TIMEOUT);
        let names = store.names_at(&addresses, limits)?;
        let symbols = usize::from(!names.is_empty() || store.has_user_names()?);
        Ok(symbolz::format_answer(symbols, &names))
    })
    .await??;
    Ok((
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        answer,
    )
        .into_response())
}

fn symbolz_refusal(refusal: SymbolzError) -> Response {
    let status = StatusCode::from_u16(refusal.status()).unwrap_or(StatusCode::BAD_REQUEST);
    tracing::debug!("HTTP: refused /symbolz: {refusal}");
    (status, format!("{refusal}\n")).into_response()
}

pub(super) fn json(value: &impl serde::Serialize) -> Result<Response, ApiError> {
    let body = serde_json::to_vec(value).map_err(|e| ApiError::Encode(e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

async fn metrics(State(state): State<Arc<HttpState>>) -> Response {
    let mut response = state.metrics.encode().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
    );
    response
}

async fn healthz(State(state): State<Arc<HttpState>>) -> Response {
    match state.health.check(Instant::now()) {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW_SECS: u64 = 1_714_564_800;

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(NOW_SECS)
    }

    fn params(pairs: &[(&str, &str)]) -> QueryParams {
        let mut params = QueryParams::default();
        for &(key, value) in pairs {
            let value = Some(value.to_owned());
            match key {
                "from" => params.from = value,
                "to" => params.to = value,
                "match" => params.selector = value,
                "format" => params.format = value,
                "limit" => params.limit = value,
                "orientation" => params.orientation = value,
                "type" => params.kind = value,
                _ => panic!("{key}"),
            }
        }
        params
    }

    fn bad_param(pairs: &[(&str, &str)]) -> (&'static str, String) {
        match params(pairs).parse(now()) {
            Err(ApiError::BadParameter { param, message }) => (param, message),
            other => panic!("{pairs:?}: expected a bad parameter, got {other:?}"),
        }
    }

    #[test]
    fn the_type_picks_cpu_or_off_cpu_windows() {
        assert_eq!(params(&[]).parse(now()).unwrap().kind, SampleKind::Cpu);
        let off = params(&[("type", "off-cpu")]).parse(now()).unwrap();
        assert_eq!(off.kind, SampleKind::OffCpu);
        let (param, message) = bad_param(&[("type", "wall")]);
        assert_eq!(param, "type");
        assert!(message.contains("\"wall\""), "{message}");
    }

    #[test]
    fn defaults_to_the_last_15_minutes_as_pprof() {
        let query = params(&[]).parse(now()).unwrap();
        assert_eq!(query.range.to, now());
        assert_eq!(query.range.from, now() - DEFAULT_SPAN);
        assert!(query.selector.is_empty());
        assert_eq!(query.format, Format::Pprof);
        assert_eq!(query.limit, None);
        assert_eq!(query.orientation, Orientation::Icicle);
        // Empty values, as an HTML form sends them, are defaults too.
        let query = params(&[("from", ""), ("match", ""), ("format", "")])
            .parse(now())
            .unwrap();
        assert_eq!(query.range.from, now() - DEFAULT_SPAN);
        assert_eq!(query.format, Format::Pprof);
    }

    #[test]
    fn parses_every_parameter() {
        let query = params(&[
            ("from", "now-1h"),
            ("to", "2024-05-01T11:30:00Z"),
            ("match", r#"{comm="nginx"}"#),
            ("format", "SVG"),
            ("limit", "20"),
            ("orientation", "classic"),
        ])
        .parse(now())
        .unwrap();
        assert_eq!(query.orientation, Orientation::Classic);
        assert_eq!(query.range.from, now() - Duration::from_secs(3600));
        assert_eq!(query.range.to, now() - Duration::from_secs(1800));
        assert_eq!(query.selector.to_string(), r#"{comm="nginx"}"#);
        assert_eq!(query.format, Format::Svg);
        assert_eq!(query.limit, Some(20));
        for (text, format) in [
            ("pprof", Format::Pprof),
            ("folded", Format::Folded),
            ("top", Format::Top),
        ] {
            assert_eq!(
                params(&[("format", text)]).parse(now()).unwrap().format,
                format
            );
        }
        // Only `to`: the 15 minutes before it.
        let query = params(&[("to", "1714564000")]).parse(now()).unwrap();
        assert_eq!(
            query.range.from,
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_714_563_100)
        );
    }

    #[test]
    fn bad_parameters_are_named() {
        let (param, message) = bad_param(&[("from", "yesterday")]);
        assert_eq!(param, "from");
        assert!(message.contains("\"yesterday\""), "{message}");
        assert_eq!(bad_param(&[("to", "now-1x")]).0, "to");
        let (param, message) = bad_param(&[("from", "now"), ("to", "now-1h")]);
        assert_eq!(param, "from");
        assert!(message.contains("not before"), "{message}");
        let (param, message) = bad_param(&[("match", "{comm=nginx}")]);
        assert_eq!(param, "match");
        assert!(message.contains("quoted value"), "{message}");
        let (param, message) = bad_param(&[("format", "png")]);
        assert_eq!(param, "format");
        assert!(message.contains("\"png\""), "{message}");
        assert_eq!(bad_param(&[("limit", "-1")]).0, "limit");
        let (param, message) = bad_param(&[("orientation", "upside-down")]);
        assert_eq!(param, "orientation");
        assert!(message.contains("icicle, classic"), "{message}");

        let error = params(&[("format", "png")]).parse(now()).unwrap_err();
        assert_eq!(error.status(), StatusCode::BAD_REQUEST);
        assert!(
            error.to_string().starts_with("parameter format: "),
            "{error}"
        );
    }

    #[test]
    fn store_errors_map_to_5xx() {
        let foreign = ApiError::Store(StoreError::Foreign {
            path: "/x".into(),
            reason: "not SQLite".into(),
        });
        assert_eq!(foreign.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let sqlite = ApiError::Store(StoreError::Sqlite {
            path: "/x".into(),
            source: rusqlite::Error::InvalidQuery,
        });
        assert_eq!(sqlite.status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn title_says_range_and_selector() {
        let query = params(&[("from", "now-1h"), ("match", "{comm=\"a\"}")])
            .parse(now())
            .unwrap();
        assert_eq!(
            flame_graph_title(&query),
            "CPU 2024-05-01T11:00:00Z .. 2024-05-01T12:00:00Z {comm=\"a\"}"
        );
    }

    #[test]
    fn ui_page_is_self_contained() {
        // No script, style or frame from elsewhere: the page must work with no network.
        for needle in [
            "src=\"http",
            "href=\"http",
            "src=\"//",
            "href=\"//",
            "@import",
        ] {
            assert!(!UI_PAGE.contains(needle), "the UI page loads {needle}...");
        }
        assert!(UI_PAGE.contains("{{WINDOW_SECONDS}}"));
    }

    /// A GET over a real socket (blocking, so it runs on the blocking pool): status and body.
    async fn get(address: std::net::SocketAddr, path: &str) -> (u16, String, String) {
        get_with(address, path, "Host: localhost").await
    }

    /// [`get`] with the given header lines (`Host` among them) instead of `Host: localhost`.
    async fn get_with(
        address: std::net::SocketAddr,
        path: &str,
        headers: &str,
    ) -> (u16, String, String) {
        let path = path.to_owned();
        let headers = headers.to_owned();
        tokio::task::spawn_blocking(move || {
            use std::io::{Read, Write};
            let mut stream = std::net::TcpStream::connect(address).unwrap();
            write!(
                stream,
                "GET {path} HTTP/1.1\r\n{headers}\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let mut response = String::new();
            stream.read_to_string(&mut response).unwrap();
            let (head, body) = response.split_once("\r\n\r\n").unwrap();
            let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
            (status, head.to_owned(), body.to_owned())
        })
        .await
        .unwrap()
    }

    /// A POST of `body` to `path` over a real socket: status and body.
    async fn post(address: std::net::SocketAddr, path: &str, body: Vec<u8>) -> (u16, String) {
        let path = path.to_owned();
        tokio::task::spawn_blocking(move || {
            use std::io::{Read, Write};
            let mut stream = std::net::TcpStream::connect(address).unwrap();
            write!(
                stream,
                "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n",
                body.len()
            )
            .unwrap();
            // The server may answer, and close, before it has read an oversized body.
            let _ = stream.write_all(&body);
            let mut response = Vec::new();
            let _ = stream.read_to_end(&mut response);
            let response = String::from_utf8_lossy(&response).into_owned();
            let (head, body) = response.split_once("\r\n\r\n").unwrap();
            let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
            (status, body.to_owned())
        })
        .await
        .unwrap()
    }

    /// The routes that need no store, through `serve` on a loopback socket, then shutdown.
    #[tokio::test]
    async fn metrics_health_ui_and_bad_requests() {
        let mut registry = Registry::new();
        registry.register(
            "samples",
            "Samples drained from the kernel",
            prometheus_client::metrics::counter::Counter::<u64>::default(),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let state = Arc::new(HttpState::new(
            PathBuf::from("/nonexistent/scorch-store"),
            Arc::new(registry),
            Arc::new(Health::new(Duration::from_secs(10), Instant::now())),
            Duration::from_secs(10),
            AllowedHosts::new(address, &[]),
        ));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, state.clone(), async {
            let _ = stopped.await;
        }));

        let (status, head, body) = get(address, "/metrics").await;
        assert_eq!(status, 200);
        assert!(head.contains(crate::metrics::CONTENT_TYPE), "{head}");
        assert!(body.contains("scorch_samples_total 0"), "{body}");

        assert_eq!(get(address, "/healthz").await.0, 200);
        state.health.store_failed("disk full".into());
        let (status, _, body) = get(address, "/healthz").await;
        assert_eq!(status, 503);
        assert!(body.contains("disk full"), "{body}");

        let (status, _, body) = get(address, "/api/v1/profile?format=png").await;
        assert_eq!(status, 400);
        assert!(body.starts_with("parameter format:"), "{body}");
        let (status, _, body) = get(address, "/api/v1/top?match=%7Bcomm%3D").await;
        assert_eq!(status, 400);
        assert!(body.starts_with("parameter match:"), "{body}");

        let (status, head, body) = get(address, "/").await;
        assert_eq!(status, 200);
        assert!(head.contains("text/html"), "{head}");
        assert!(body.contains("<html") && !body.contains("{{WINDOW_SECONDS}}"));

        assert_eq!(get(address, "/nope").await.0, 404);

        // The symbol service refuses a bad request before it looks for the store.
        let (status, body) = post(address, "/symbolz", b"0x401000+main".to_vec()).await;
        assert_eq!(status, 400, "{body}");
        assert!(
            body.contains("word 2") && body.contains("\"main\""),
            "{body}"
        );
        let huge = vec![b'1'; symbolz::MAX_BODY_BYTES + 1];
        let (status, body) = post(address, "/symbolz", huge).await;
        assert_eq!(status, 413, "{body}");
        assert!(body.contains("over 1048576 bytes"), "{body}");
        let (status, _, body) = get(address, "/symbolz?0x1+zz").await;
        assert_eq!(status, 400, "{body}");
        // A good one reaches the store, which is missing here.
        let (status, body) = post(address, "/symbolz", b"0x401000".to_vec()).await;
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("no store"), "{body}");
        assert_eq!(get(address, "/symbolz").await.0, 503);

        // The views' routes: the same 400s naming the parameter, and the same guard.
        for (path, param) in [
            ("/api/v1/timeline?group_by=a-b", "group_by"),
            ("/api/v1/timeline?from=now-7d&step=1s", "step"),
            ("/api/v1/timeline?limit=1000", "limit"),
            ("/api/v1/diff?format=svg", "base_from"),
            (
                "/api/v1/diff?base_from=now-2h&base_to=now-1h&format=png",
                "format",
            ),
            ("/api/v1/labels?from=soon", "from"),
        ] {
            let (status, _, body) = get(address, path).await;
            assert_eq!(status, 400, "{path}: {body}");
            assert!(
                body.starts_with(&format!("parameter {param}:")),
                "{path}: {body}"
            );
        }
        for path in ["/api/v1/timeline", "/api/v1/diff", "/api/v1/labels"] {
            let (status, _, _) = get_with(address, path, "Host: evil.example").await;
            assert_eq!(status, 403, "{path}");
        }

        // DNS rebinding and cross-site reads are refused before any handler runs.
        let (status, _, body) = get_with(address, "/api/v1/profile", "Host: evil.example").await;
        assert_eq!(status, 403, "{body}");
        assert!(body.contains("evil.example"), "{body}");
        let (status, _, _) = get_with(
            address,
            "/metrics",
            "Host: localhost\r\nSec-Fetch-Site: cross-site",
        )
        .await;
        assert_eq!(status, 403);
        let (status, _, _) = get_with(
            address,
            "/api/v1/series",
            "Host: localhost\r\nOrigin: https://evil.example",
        )
        .await;
        assert_eq!(status, 403);
        let with_ip = format!("Host: {address}");
        assert_eq!(get_with(address, "/healthz", &with_ip).await.0, 503);

        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }
}
