//! Wall-clock times as the store and the wire protocols write them: signed nanoseconds since
//! the Unix epoch.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `time` as nanoseconds since the epoch, saturating (times before 1970 become 0, times past
/// 2262 become `i64::MAX`).
pub fn unix_ns(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The inverse of [`unix_ns`]; negative values become the epoch.
pub fn from_unix_ns(ns: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(u64::try_from(ns).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_saturates() {
        let t = UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789);
        assert_eq!(from_unix_ns(unix_ns(t)), t);
        assert_eq!(unix_ns(UNIX_EPOCH - Duration::from_secs(1)), 0);
        assert_eq!(from_unix_ns(-5), UNIX_EPOCH);
    }
}
