//! The one duration grammar of every flag, config key and query parameter: `10s`, `500ms`,
//! `2m`, `1h30m`, `7d`, `1h 30m`, `250us` (off-CPU sampling is set in microseconds), or a bare
//! number of seconds (`90`, `1.5`).
//!
//! Callers add their own bounds (a window must be longer than zero, an offset may be zero).

use std::time::Duration;

/// Parses `text` into a duration, zero allowed. Errors name the text and what is wrong.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("missing duration".to_owned());
    }
    if text.starts_with('-') {
        return Err("a duration cannot be negative; use e.g. `10s`".to_owned());
    }
    let not_a_duration = || format!("`{text}` is not a duration; use e.g. `10s`, `2m` or `500ms`");
    if text.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return seconds(text, 1.0).ok_or_else(not_a_duration);
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_end);
        if number.is_empty() {
            return Err(not_a_duration());
        }
        let unit_end = after
            .find(|c: char| !(c.is_ascii_alphabetic() || c == 'µ'))
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        let scale = match unit {
            "us" | "µs" => 0.000_001,
            "ms" => 0.001,
            "s" | "sec" => 1.0,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            "d" => 86_400.0,
            "" => return Err(not_a_duration()),
            other => {
                return Err(format!(
                    "unknown time unit `{other}` in `{text}`; use us, ms, s, m, h or d"
                ))
            }
        };
        let term = seconds(number, scale).ok_or_else(not_a_duration)?;
        total = total
            .checked_add(term)
            .ok_or_else(|| format!("`{text}` is too long"))?;
        rest = after.trim_start();
    }
    Ok(total)
}

/// `number` (digits, at most one `.`) times `scale` seconds; `None` when it is not a number or
/// overflows a `Duration`.
fn seconds(number: &str, scale: f64) -> Option<Duration> {
    if number.matches('.').count() > 1 || number == "." {
        return None;
    }
    let value: f64 = number.parse().ok()?;
    if scale < 1.0 {
        // Whole nanoseconds, rounded: `20us` as f64 seconds would come back as 19.999 us.
        let nanos = (value * scale * 1e9).round();
        return (nanos < u64::MAX as f64).then(|| Duration::from_nanos(nanos as u64));
    }
    Duration::try_from_secs_f64(value * scale).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_terms_and_bare_seconds() {
        let secs = Duration::from_secs;
        assert_eq!(parse_duration("10s"), Ok(secs(10)));
        assert_eq!(parse_duration("90"), Ok(secs(90)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("20us"), Ok(Duration::from_micros(20)));
        assert_eq!(parse_duration("1.5µs"), Ok(Duration::from_nanos(1500)));
        assert_eq!(parse_duration("1ms 250us"), Ok(Duration::from_micros(1250)));
        assert_eq!(parse_duration("2m"), Ok(secs(120)));
        assert_eq!(parse_duration("1h30m"), Ok(secs(5400)));
        assert_eq!(parse_duration("1h 30m"), Ok(secs(5400)));
        assert_eq!(parse_duration("7d"), Ok(secs(7 * 86400)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn bad_text_is_named() {
        assert!(parse_duration("").unwrap_err().contains("missing"));
        assert!(parse_duration("-5s").unwrap_err().contains("negative"));
        assert!(parse_duration("ten")
            .unwrap_err()
            .contains("`ten` is not a duration"));
        assert!(parse_duration("15x")
            .unwrap_err()
            .contains("unknown time unit `x`"));
        for bad in ["s", "h", "1..2s", "1 hour ago", "10 s x"] {
            assert!(parse_duration(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn huge_values_are_refused_not_wrapped() {
        // `days * 86400` once overflowed; here it is an error.
        assert!(parse_duration("999999999999999999999d").is_err());
        assert!(parse_duration("213503982334602d").is_err());
    }
}
