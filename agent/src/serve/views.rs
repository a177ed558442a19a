//! The routes behind the UI's "when, who, what changed" views, beside `http`'s profile routes
//! and under the same rules: each query parses and runs on the blocking pool in its turn
//! ([`HttpState::query_turn`]), within [`QueryLimits`], and a bad parameter is a 400 naming it.
//!
//! | route | answer |
//! |---|---|
//! | `GET /api/v1/timeline?from=&to=&match=&step=&group_by=&limit=` | CPU seconds per step, one series per value of the `group_by` label (the `limit` largest, at most [`MAX_TIMELINE_SERIES`], the rest as "other"), as JSON; read from per-window totals, no stack merged |
//! | `GET /api/v1/diff?base_from=&base_to=&from=&to=&match=&format=&orientation=` | the change from the base range to the range: `pprof` (default; what `go tool pprof -diff_base` builds), `svg` (differential flame graph, both ranges normalised; `orientation` as for the profile's), `top` (change in share per function, text) or `json` (the same table) |
//! | `GET /api/v1/labels?from=&to=` | the label names of the series in the range, as JSON |
//!
//! Each takes `type=cpu` (the default) or `type=off-cpu`: which windows it reads. Off-CPU
//! timelines are blocked seconds per step, where CPU timelines are CPU seconds.

use std::{sync::Arc, time::SystemTime};

use axum::{
    extract::{Query, State},
    http::header,
    response::{IntoResponse, Response},
    routing::get,
    Router,
};
use serde::Deserialize;

use super::http::{json, ApiError, HttpState, QueryParams, MAX_QUERY_STACKS, QUERY_TIMEOUT};
use crate::{
    parse::duration::parse_duration,
    profile::{diff, encode::svg::Orientation, Profile, SampleKind},
    store::{Labels, QueryLimits, Store, TimeRange, TimelineRequest},
};

/// Points per series, at most: a day at one per minute, with room.
pub const MAX_TIMELINE_STEPS: i64 = 2_000;
/// Points a timeline gets when no `step` is given.
pub const DEFAULT_TIMELINE_STEPS: i64 = 240;
/// Series a timeline names, at most; the rest are "other".
pub const MAX_TIMELINE_SERIES: usize = 50;
/// Series when no `limit` is given.
pub const DEFAULT_TIMELINE_SERIES: usize = 10;
/// The longest label name `group_by` takes.
const MAX_LABEL_NAME: usize = 128;

pub(super) fn routes() -> Router<Arc<HttpState>> {
    Router::new()
        .route("/api/v1/timeline", get(timeline))
        .route("/api/v1/diff", get(diff_route))
        .route("/api/v1/labels", get(labels))
}

#[derive(Debug, Default, Deserialize)]
pub struct TimelineParams {
    pub from: Option<String>,
    pub to: Option<String>,
    #[serde(rename = "match")]
    pub selector: Option<String>,
    pub step: Option<String>,
    pub group_by: Option<String>,
    pub limit: Option<String>,
    /// `cpu` (the default) or `off-cpu`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
}

/// A label name as Prometheus spells them: `[a-zA-Z_][a-zA-Z0-9_]*`.
fn check_label_name(param: &'static str, name: &str) -> Result<(), ApiError> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok
        || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        || name.len() > MAX_LABEL_NAME
    {
        return Err(ApiError::bad(
            param,
            format!("{name:?} is not a label name ([a-zA-Z_][a-zA-Z0-9_]*, at most {MAX_LABEL_NAME} characters)"),
        ));
    }
    Ok(())
}

impl TimelineParams {
    /// Checks every parameter; `window` is the daemon's window length, the finest step that
    /// means anything.
    pub fn parse(
        &self,
        now: SystemTime,
        window: std::time::Duration,
    ) -> Result<(TimelineRequest, crate::parse::selector::Selector), ApiError> {
        let query = QueryParams {
            from: self.from.clone(),
            to: self.to.clone(),
            selector: self.selector.clone(),
            kind: self.kind.clone(),
            ..QueryParams::default()
        }
        .parse(now)?;
        let span =
            crate::sys::time::unix_ns(query.range.to) - crate::sys::time::unix_ns(query.range.from);
        let step_ns = match self.step.as_deref().map(str::trim) {
            None | Some("") => {
                // About DEFAULT_TIMELINE_STEPS points, in whole windows so none straddles two.
                let window = (window.as_nanos() as i64).max(1_000_000_000);
                let wanted = span / DEFAULT_TIMELINE_STEPS;
                ((wanted + window - 1) / window).max(1) * window
            }
            Some(text) => {
                // Seconds as a number, or a duration (`30s`, `5m`).
                let step = match text.parse::<f64>() {
                    Ok(seconds) if seconds.is_finite() && seconds > 0.0 => (seconds * 1e9) as i64,
                    _ => parse_duration(text)
                        .map(|d| d.as_nanos().min(i64::MAX as u128) as i64)
                        .map_err(|e| ApiError::bad("step", e))?,
                };
                if step < 1_000_000 {
                    return Err(ApiError::bad("step", format!("{text:?} is under 1 ms")));
                }
                step
            }
        };
        let steps = (span + step_ns - 1) / step_ns;
        if steps > MAX_TIMELINE_STEPS {
            return Err(ApiError::bad(
                "step",
                format!(
                    "{steps} steps in the range; at most {MAX_TIMELINE_STEPS} (a longer step or a shorter range)"
                ),
            ));
        }
        let group_by = match self.group_by.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(name) => {
                check_label_name("group_by", name)?;
                Some(name.to_owned())
            }
        };
        let limit = match self.limit.as_deref().map(str::trim) {
            None | Some("") => DEFAULT_TIMELINE_SERIES,
            Some(text) => match text.parse::<usize>() {
                Ok(n) if (1..=MAX_TIMELINE_SERIES).contains(&n) => n,
                _ => {
                    return Err(ApiError::bad(
                        "limit",
                        format!(
                            "{text:?} is not a number of series from 1 to {MAX_TIMELINE_SERIES}"
                        ),
                    ))
                }
            },
        };
        Ok((
            TimelineRequest {
                range: query.range,
                step_ns,
                group_by,
                limit,
                kind: query.kind,
            },
            query.selector,
        ))
    }
}

async fn timeline(
    State(state): State<Arc<HttpState>>,
    Query(params): Query<TimelineParams>,
) -> Result<Response, ApiError> {
    let _turn = state.query_turn().await?;
    let dir = state.store_dir.clone();
    let window = state.window;
    let timeline = tokio::task::spawn_blocking(move || {
        let (request, selector) = params.parse(SystemTime::now(), window)?;
        let limits = QueryLimits::new(MAX_QUERY_STACKS, QUERY_TIMEOUT);
        Store::open_read_only(&dir)?
            .timeline(
                &request,
                &|labels: &Labels| selector.matches(labels),
                limits,
            )
            .map_err(ApiError::from)
    })
    .await??;
    json(&timeline)
}

async fn labels(
    State(state): State<Arc<HttpState>>,
    Query(params): Query<QueryParams>,
) -> Result<Response, ApiError> {
    let _turn = state.query_turn().await?;
    let dir = state.store_dir.clone();
    let names = tokio::task::spawn_blocking(move || {
        let query = params.parse(SystemTime::now())?;
        let limits = QueryLimits::new(MAX_QUERY_STACKS, QUERY_TIMEOUT);
        Store::open_read_only(&dir)?
            .label_names(query.range, query.kind, limits)
            .map_err(ApiError::from)
    })
    .await??;
    json(&names)
}

#[derive(Debug, Default, Deserialize)]
pub struct DiffParams {
    pub base_from: Option<String>,
    pub base_to: Option<String>,
    pub from: Option<String>,
    pub to: Option<String>,
    #[serde(rename = "match")]
    pub selector: Option<String>,
    pub format: Option<String>,
    pub limit: Option<String>,
    pub orientation: Option<String>,
    /// `cpu` (the default) or `off-cpu`: which windows both ranges merge.
    #[serde(rename = "type")]
    pub kind: Option<String>,
}

/// What a diff answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiffFormat {
    Pprof,
    Svg,
    Top,
    Json,
}

/// A diff with its parameters checked.
#[derive(Debug)]
pub struct ParsedDiff {
    pub base: TimeRange,
    pub target: TimeRange,
    pub selector: crate::parse::selector::Selector,
    pub format: DiffFormat,
    pub limit: Option<usize>,
    /// Which way the flame graph grows.
    pub orientation: Orientation,
    pub kind: SampleKind,
}

impl DiffParams {
    pub fn parse(&self, now: SystemTime) -> Result<ParsedDiff, ApiError> {
        let required =
            |param: &'static str, value: &Option<String>| match value.as_deref().map(str::trim) {
                None | Some("") => Err(ApiError::bad(param, "required: the baseline range")),
                Some(_) => Ok(()),
            };
        required("base_from", &self.base_from)?;
        required("base_to", &self.base_to)?;
        let target = QueryParams {
            from: self.from.clone(),
            to: self.to.clone(),
            selector: self.selector.clone(),
            limit: self.limit.clone(),
            orientation: self.orientation.clone(),
            kind: self.kind.clone(),
            ..QueryParams::default()
        }
        .parse(now)?;
        let base = QueryParams {
            from: self.base_from.clone(),
            to: self.base_to.clone(),
            ..QueryParams::default()
        }
        .parse(now)
        .map_err(|e| match e {
            ApiError::BadParameter { param, message } => ApiError::BadParameter {
                param: if param == "to" {
                    "base_to"
                } else {
                    "base_from"
                },
                message,
            },
            other => other,
        })?;
        let format = match self.format.as_deref().map(str::trim) {
            None | Some("") | Some("pprof") => DiffFormat::Pprof,
            Some("svg") => DiffFormat::Svg,
            Some("top") => DiffFormat::Top,
            Some("json") => DiffFormat::Json,
            Some(text) => {
                return Err(ApiError::bad(
                    "format",
                    format!("{text:?} is not one of pprof, svg, top, json"),
                ))
            }
        };
        Ok(ParsedDiff {
            base: base.range,
            target: target.range,
            selector: target.selector,
            format,
            limit: target.limit,
            orientation: target.orientation,
            kind: target.kind,
        })
    }
}

/// `CPU diff base .. -> target ..`: on the differential flame graph.
fn diff_title(query: &ParsedDiff) -> String {
    let time = |t| humantime::format_rfc3339_seconds(t).to_string();
    let what = match query.kind {
        SampleKind::Cpu => "CPU",
        SampleKind::OffCpu => "Off-CPU",
    };
    let mut title = format!(
        "{what} change: {} .. {} -> {} .. {}",
        time(query.base.from),
        time(query.base.to),
        time(query.target.from),
        time(query.target.to)
    );
    if !query.selector.is_empty() {
        title.push(' ');
        title.push_str(&query.selector.to_string());
    }
    title
}

async fn diff_route(
    State(state): State<Arc<HttpState>>,
    Query(params): Query<DiffParams>,
) -> Result<Response, ApiError> {
    let _turn = state.query_turn().await?;
    let dir = state.store_dir.clone();
    // Both merges and the encoding in the one turn: a diff costs two queries.
    let response = tokio::task::spawn_blocking(move || -> Result<Response, ApiError> {
        let query = params.parse(SystemTime::now())?;
        let store = Store::open_read_only(&dir)?;
        let merge = |range: TimeRange| -> Result<Profile, ApiError> {
            let limits = QueryLimits::new(MAX_QUERY_STACKS, QUERY_TIMEOUT);
            Ok(store.query_within(
                range,
                query.kind,
                &|labels: &Labels| query.selector.matches(labels),
                limits,
            )?)
        };
        let (base, target) = (merge(query.base)?, merge(query.target)?);
        Ok(match query.format {
            DiffFormat::Pprof => (
                [
                    (header::CONTENT_TYPE, "application/octet-stream"),
                    (
                        header::CONTENT_DISPOSITION,
                        "attachment; filename=\"scorch-diff.pb.gz\"",
                    ),
                ],
                diff::pprof(&base, &target),
            )
                .into_response(),
            DiffFormat::Svg => {
                let svg = diff::svg(
                    &base,
                    &target,
                    &diff_title(&query),
                    Some(super::http::MAX_DRAWN_STACKS),
                    query.orientation,
                )
                .map_err(|e| ApiError::Encode(e.to_string()))?;
                ([(header::CONTENT_TYPE, "image/svg+xml")], svg).into_response()
            }
            DiffFormat::Top => (
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                diff::render_top(&diff::top(&base, &target), query.limit),
            )
                .into_response(),
            DiffFormat::Json => {
                let mut table = diff::top(&base, &target);
                if let Some(limit) = query.limit {
                    table.rows.truncate(limit);
                }
                json(&table)?
            }
        })
    })
    .await??;
    Ok(response)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const NOW_SECS: u64 = 1_714_564_800;

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(NOW_SECS)
    }

    fn timeline_error(params: TimelineParams) -> (&'static str, String) {
        match params.parse(now(), Duration::from_secs(10)) {
            Err(ApiError::BadParameter { param, message }) => (param, message),
            other => panic!("expected a bad parameter, got {other:?}"),
        }
    }

    #[test]
    fn timeline_parameters_are_bounded_and_named() {
        let (request, selector) = TimelineParams {
            from: Some("now-1h".into()),
            group_by: Some("comm".into()),
            ..Default::default()
        }
        .parse(now(), Duration::from_secs(10))
        .unwrap();
        // An hour in about 240 points of whole 10 s windows: 20 s.
        assert_eq!(request.step_ns, 20_000_000_000);
        assert_eq!(request.group_by.as_deref(), Some("comm"));
        assert_eq!(request.limit, DEFAULT_TIMELINE_SERIES);
        assert!(selector.is_empty());
        let (request, _) = TimelineParams {
            from: Some("now-1h".into()),
            step: Some("1m".into()),
            limit: Some("3".into()),
            ..Default::default()
        }
        .parse(now(), Duration::from_secs(10))
        .unwrap();
        assert_eq!((request.step_ns, request.limit), (60_000_000_000, 3));
        let (param, message) = timeline_error(TimelineParams {
            from: Some("now-7d".into()),
            step: Some("1".into()),
            ..Default::default()
        });
        assert_eq!(param, "step");
        assert!(message.contains("at most 2000"), "{message}");
        for bad in ["1m\"}", "0comm", "a-b"] {
            let (param, _) = timeline_error(TimelineParams {
                group_by: Some(bad.into()),
                ..Default::default()
            });
            assert_eq!(param, "group_by", "{bad}");
        }
        let long = "a".repeat(MAX_LABEL_NAME + 1);
        assert_eq!(
            timeline_error(TimelineParams {
                group_by: Some(long),
                ..Default::default()
            })
            .0,
            "group_by"
        );
        for bad in ["0", "51", "x"] {
            let (param, _) = timeline_error(TimelineParams {
                limit: Some(bad.into()),
                ..Default::default()
            });
            assert_eq!(param, "limit", "{bad}");
        }
        for bad in ["-5", "soon", "0.0000001"] {
            let (param, _) = timeline_error(TimelineParams {
                step: Some(bad.into()),
                ..Default::default()
            });
            assert_eq!(param, "step", "{bad}");
        }
        assert_eq!(
            timeline_error(TimelineParams {
                from: Some("yesterday".into()),
                ..Default::default()
            })
            .0,
            "from"
        );
    }

    fn diff_error(params: DiffParams) -> (&'static str, String) {
        match params.parse(now()) {
            Err(ApiError::BadParameter { param, message }) => (param, message),
            other => panic!("expected a bad parameter, got {other:?}"),
        }
    }

    fn diff_params(pairs: &[(&str, &str)]) -> DiffParams {
        let mut params = DiffParams {
            base_from: Some("now-2h".into()),
            base_to: Some("now-1h".into()),
            ..Default::default()
        };
        for &(key, value) in pairs {
            let value = Some(value.to_owned());
            match key {
                "base_from" => params.base_from = value,
                "base_to" => params.base_to = value,
                "from" => params.from = value,
                "match" => params.selector = value,
                "format" => params.format = value,
                "orientation" => params.orientation = value,
                _ => panic!("{key}"),
            }
        }
        params
    }

    #[test]
    fn diff_parameters_are_checked_and_named() {
        let query = diff_params(&[("from", "now-1h"), ("format", "svg")])
            .parse(now())
            .unwrap();
        assert_eq!(query.base.from, now() - Duration::from_secs(7200));
        assert_eq!(query.base.to, now() - Duration::from_secs(3600));
        assert_eq!(query.target.from, now() - Duration::from_secs(3600));
        assert_eq!(query.target.to, now());
        assert_eq!(query.format, DiffFormat::Svg);
        assert_eq!(query.orientation, Orientation::Icicle);
        let classic = diff_params(&[("orientation", "classic")]).parse(now());
        assert_eq!(classic.unwrap().orientation, Orientation::Classic);
        assert_eq!(
            diff_error(diff_params(&[("orientation", "sideways")])).0,
            "orientation"
        );
        assert_eq!(
            diff_params(&[]).parse(now()).unwrap().format,
            DiffFormat::Pprof
        );
        assert!(diff_title(&query).starts_with("CPU change: 2024-05-01T10:00:00Z"));
        assert_eq!(diff_error(diff_params(&[("base_from", "")])).0, "base_from");
        assert_eq!(diff_error(diff_params(&[("base_to", "")])).0, "base_to");
        assert_eq!(
            diff_error(diff_params(&[("base_to", "now-3h")])).0,
            "base_from"
        );
        assert_eq!(
            diff_error(diff_params(&[("base_to", "later")])).0,
            "base_to"
        );
        assert_eq!(diff_error(diff_params(&[("from", "later")])).0, "from");
        assert_eq!(diff_error(diff_params(&[("match", "{a=b}")])).0, "match");
        let (param, message) = diff_error(diff_params(&[("format", "folded")]));
        assert_eq!(param, "format");
        assert!(message.contains("\"folded\""), "{message}");
    }
}
