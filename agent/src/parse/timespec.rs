//! Times and durations as users type them for queries: `scorch query --from/--to/--since` and
//! the HTTP API's `from=`/`to=`.
//!
//! A time is RFC 3339 (`2024-05-01T12:00:00Z`, `...+02:00`), Unix seconds (`1714564800`,
//! `1714564800.25`, what Prometheus's API takes), `now`, or `now-15m` (any duration:
//! `30s`, `1h30m`, `7d`). Everything is resolved against a `now` the caller passes, so a query's
//! `from` and `to` agree on it and tests need no clock.

use std::time::{Duration, SystemTime};

/// A half-open time range `[from, to)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeRange {
    pub from: SystemTime,
    pub to: SystemTime,
}

#[derive(Debug, thiserror::Error)]
pub enum TimeError {
    #[error(
        "time {text:?}: {reason} (expected RFC 3339 like 2024-05-01T12:00:00Z, Unix seconds, \
         `now` or `now-15m`)"
    )]
    Time { text: String, reason: String },
    #[error("duration {text:?}: {reason} (expected e.g. 30s, 15m, 1h30m, 7d)")]
    Duration { text: String, reason: String },
    #[error("time range: from ({from}) is not before to ({to})")]
    EmptyRange { from: String, to: String },
}

/// Parses a point in time; `now` is what `now` means.
pub fn parse_time(text: &str, now: SystemTime) -> Result<SystemTime, TimeError> {
    let trimmed = text.trim();
    let fail = |reason: &str| TimeError::Time {
        text: text.to_owned(),
        reason: reason.to_owned(),
    };
    if trimmed.is_empty() {
        return Err(fail("empty"));
    }
    if let Some(rest) = trimmed.strip_prefix("now") {
        let rest = rest.trim_start();
        if rest.is_empty() {
            return Ok(now);
        }
        let mut chars = rest.chars();
        let sign = chars.next();
        if sign != Some('-') && sign != Some('+') {
            return Err(fail("after `now`, expected `-` or `+` and a duration"));
        }
        let offset = parse_offset(chars.as_str().trim_start()).map_err(|reason| fail(&reason))?;
        return if sign == Some('-') {
            now.checked_sub(offset)
                .ok_or_else(|| fail("before the Unix epoch"))
        } else {
            now.checked_add(offset)
                .ok_or_else(|| fail("too far in the future"))
        };
    }
    if trimmed.starts_with(|c: char| c.is_ascii_digit()) && !trimmed.contains(['-', ':']) {
        return parse_unix_seconds(trimmed).map_err(|reason| fail(&reason));
    }
    parse_rfc3339(trimmed).map_err(|reason| fail(&reason))
}

/// Parses a span such as `1h` (for `--since`): a humantime duration or bare seconds, not zero.
pub fn parse_since(text: &str) -> Result<Duration, TimeError> {
    let duration = parse_offset(text.trim()).map_err(|reason| TimeError::Duration {
        text: text.to_owned(),
        reason,
    })?;
    if duration.is_zero() {
        return Err(TimeError::Duration {
            text: text.to_owned(),
            reason: "must be longer than zero".to_owned(),
        });
    }
    Ok(duration)
}

/// The range a query covers: `since` (a span ending now), or `from` and `to` (either may be
/// missing: `to` defaults to now, `from` to `default_span` before `to`).
pub fn parse_range(
    from: Option<&str>,
    to: Option<&str>,
    since: Option<&str>,
    now: SystemTime,
    default_span: Duration,
) -> Result<TimeRange, TimeError> {
    let to = match to {
        Some(text) => parse_time(text, now)?,
        None => now,
    };
    let from = match (from, since) {
        (Some(text), _) => parse_time(text, now)?,
        (None, Some(text)) => {
            to.checked_sub(parse_since(text)?)
                .ok_or_else(|| TimeError::Duration {
                    text: text.to_owned(),
                    reason: "reaches before the Unix epoch".to_owned(),
                })?
        }
        (None, None) => to
            .checked_sub(default_span)
            .unwrap_or(SystemTime::UNIX_EPOCH),
    };
    if from >= to {
        return Err(TimeError::EmptyRange {
            from: humantime::format_rfc3339_millis(from).to_string(),
            to: humantime::format_rfc3339_millis(to).to_string(),
        });
    }
    Ok(TimeRange { from, to })
}

/// A duration in the one grammar ([`super::duration`]); zero allowed (`now-0s` is now).
fn parse_offset(text: &str) -> Result<Duration, String> {
    super::duration::parse_duration(text)
}

/// `1714564800` or `1714564800.123`, exactly (no float rounding of the fraction).
fn parse_unix_seconds(text: &str) -> Result<SystemTime, String> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return Err("not a number of seconds".to_owned());
    }
    if !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return Err("not a number of seconds".to_owned());
    }
    let seconds: u64 = whole.parse().map_err(|_| "too large".to_owned())?;
    // Nanoseconds: the first nine digits of the fraction, padded; finer digits cannot matter.
    let nanos = fraction
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(9)
        .fold(0u32, |n, digit| n * 10 + u32::from(digit - b'0'));
    SystemTime::UNIX_EPOCH
        .checked_add(Duration::new(seconds, nanos))
        .ok_or_else(|| "too large".to_owned())
}

/// RFC 3339 with a `Z` or `±HH:MM` zone (humantime alone takes only UTC).
fn parse_rfc3339(text: &str) -> Result<SystemTime, String> {
    let describe = |e: humantime::TimestampError| e.to_string();
    if let Some(utc) = text.strip_suffix(['Z', 'z']) {
        return humantime::parse_rfc3339_weak(utc).map_err(describe);
    }
    let zone_start = text
        .len()
        .checked_sub(6)
        .filter(|&i| text.is_char_boundary(i));
    let Some((local, zone)) = zone_start.map(|i| text.split_at(i)) else {
        return Err("not a time".to_owned());
    };
    let zone = zone.as_bytes();
    let digits = |a: u8, b: u8| -> Option<u64> {
        (a.is_ascii_digit() && b.is_ascii_digit()).then(|| u64::from((a - b'0') * 10 + b - b'0'))
    };
    let offset = match zone {
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => digits(*h1, *h2)
            .zip(digits(*m1, *m2))
            .filter(|&(h, m)| h < 24 && m < 60)
            .map(|(h, m)| (*sign, Duration::from_secs(h * 3600 + m * 60))),
        _ => None,
    };
    let Some((sign, offset)) = offset else {
        return Err("an RFC 3339 time needs a zone: Z or +HH:MM".to_owned());
    };
    let local = humantime::parse_rfc3339_weak(local).map_err(describe)?;
    // A time written with +02:00 is two hours ahead of UTC: subtract to get UTC.
    let utc = if sign == b'+' {
        local.checked_sub(offset)
    } else {
        local.checked_add(offset)
    };
    utc.ok_or_else(|| "out of range".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW_SECS: u64 = 1_714_564_800; // 2024-05-01T12:00:00Z

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(NOW_SECS)
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn time(text: &str) -> SystemTime {
        parse_time(text, now()).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    #[test]
    fn now_and_offsets() {
        assert_eq!(time("now"), now());
        assert_eq!(time(" now "), now());
        assert_eq!(time("now-15m"), at(NOW_SECS - 900));
        assert_eq!(time("now - 30s"), at(NOW_SECS - 30));
        assert_eq!(time("now-1h"), at(NOW_SECS - 3600));
        assert_eq!(time("now-7d"), at(NOW_SECS - 7 * 86400));
        assert_eq!(time("now-1h30m"), at(NOW_SECS - 5400));
        assert_eq!(time("now-90"), at(NOW_SECS - 90));
        assert_eq!(time("now+1m"), at(NOW_SECS + 60));
    }

    #[test]
    fn unix_seconds() {
        assert_eq!(time("1714564800"), now());
        assert_eq!(time("1714564800.25"), now() + Duration::from_millis(250));
        assert_eq!(
            time("1714564800.000000001"),
            now() + Duration::from_nanos(1)
        );
        assert_eq!(time("0"), SystemTime::UNIX_EPOCH);
    }

    #[test]
    fn rfc3339_with_zones() {
        assert_eq!(time("2024-05-01T12:00:00Z"), now());
        assert_eq!(time("2024-05-01T12:00:00z"), now());
        assert_eq!(
            time("2024-05-01T12:00:00.5Z"),
            now() + Duration::from_millis(500)
        );
        assert_eq!(time("2024-05-01T14:00:00+02:00"), now());
        assert_eq!(time("2024-05-01T07:30:00-04:30"), now());
        assert_eq!(time("2024-05-01T12:00:00+00:00"), now());
        assert_eq!(time("2024-05-01 12:00:00Z"), now());
    }

    fn time_error(text: &str) -> String {
        match parse_time(text, now()) {
            Err(e @ TimeError::Time { .. }) => e.to_string(),
            other => panic!("{text:?}: expected an error, got {other:?}"),
        }
    }

    #[test]
    fn bad_times_say_what_was_given() {
        for text in [
            "",
            "yesterday",
            "now-",
            "now-15x",
            "now*2",
            "2024-05-01T12:00:00",
            "2024-05-01T12:00:00+2",
            "2024-13-01T12:00:00Z",
            "12abc",
            "1.2.3",
            "-5",
            "nowé",
            "2024-05-01T12:00:00+25:00",
        ] {
            let message = time_error(text);
            assert!(message.contains(&format!("{text:?}")), "{message}");
        }
        assert!(time_error("2024-05-01T12:00:00").contains("zone"));
        assert!(time_error("now-15x").contains("unknown time unit"));
        assert!(time_error("now-").contains("missing duration"));
    }

    #[test]
    fn since() {
        assert_eq!(parse_since("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_since("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_since("2h 5m").unwrap(), Duration::from_secs(7500));
        assert_eq!(parse_since("30").unwrap(), Duration::from_secs(30));
        for bad in ["", "0s", "0", "h", "1 hour ago"] {
            let error = parse_since(bad).unwrap_err();
            assert!(matches!(error, TimeError::Duration { .. }), "{bad:?}");
            assert!(error.to_string().contains(&format!("{bad:?}")));
        }
    }

    #[test]
    fn ranges() {
        let fifteen = Duration::from_secs(900);
        let range = parse_range(None, None, None, now(), fifteen).unwrap();
        assert_eq!((range.from, range.to), (at(NOW_SECS - 900), now()));

        let range = parse_range(None, None, Some("1h"), now(), fifteen).unwrap();
        assert_eq!((range.from, range.to), (at(NOW_SECS - 3600), now()));

        let range = parse_range(Some("now-2h"), Some("now-1h"), None, now(), fifteen).unwrap();
        assert_eq!(
            (range.from, range.to),
            (at(NOW_SECS - 7200), at(NOW_SECS - 3600))
        );

        // `to` alone: the default span before it.
        let range = parse_range(None, Some("now-1h"), None, now(), fifteen).unwrap();
        assert_eq!(range.from, at(NOW_SECS - 3600 - 900));

        let error = parse_range(Some("now"), Some("now-1h"), None, now(), fifteen).unwrap_err();
        assert!(matches!(error, TimeError::EmptyRange { .. }));
        assert!(
            error.to_string().contains("2024-05-01T12:00:00.000Z"),
            "{error}"
        );

        let error = parse_range(Some("then"), None, None, now(), fifteen).unwrap_err();
        assert!(error.to_string().contains("\"then\""), "{error}");
    }
}
