//! The byte formats inside rows: varint lists (stacks, a location's lines), a window's encoded
//! sample rows, the content hash that lookups go by, and a series' labels as JSON. They are on
//! disk: changing one is a schema change (see `schema`).

use crate::profile::Labels;

/// FNV-1a, 64 bits: a stable hash (the store keeps it on disk, so it must not change between
/// builds, as std's hasher may). Collisions are harmless: lookups compare the content.
pub(super) fn content_hash(bytes: &[u8]) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash as i64
}

/// A `locations` row's hash: its mapping id, address, frame kind (`FrameKind::code`, which
/// for native and kernel frames is the byte the old `kernel` flag hashed), encoded lines and
/// their columns. Columns count only when known, so that a location without them hashes as
/// the schemas before them did.
pub(super) fn location_hash(
    mapping: i64,
    address: i64,
    kind: u8,
    lines: &[u8],
    columns: &[u8],
) -> i64 {
    let mut content = Vec::with_capacity(lines.len() + columns.len() + 24);
    put_varint(&mut content, mapping as u64);
    put_varint(&mut content, address as u64);
    content.push(kind);
    content.extend_from_slice(lines);
    content.extend_from_slice(columns);
    content_hash(&content)
}

/// A window's `(series, stack, value)` rows, sorted: series as deltas from the previous row's,
/// stack as a delta from the previous row's within the same series (from 0 when the series
/// changes), value as is; all varints.
pub(super) fn encode_rows(rows: &[(i64, i64, u64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows.len() * 4);
    let (mut last_series, mut last_stack) = (0i64, 0i64);
    for &(series, stack, value) in rows {
        if series != last_series {
            last_stack = 0;
        }
        put_varint(&mut out, (series - last_series) as u64);
        put_varint(&mut out, (stack - last_stack) as u64);
        put_varint(&mut out, value);
        (last_series, last_stack) = (series, stack);
    }
    out
}

pub(super) fn decode_rows(bytes: &[u8]) -> Option<Vec<(i64, i64, u64)>> {
    let numbers = varints(bytes)?;
    if numbers.len() % 3 != 0 {
        return None;
    }
    let (mut series, mut stack) = (0i64, 0i64);
    let mut rows = Vec::with_capacity(numbers.len() / 3);
    for triple in numbers.chunks_exact(3) {
        let next_series = series.checked_add(i64::try_from(triple[0]).ok()?)?;
        if next_series != series {
            stack = 0;
        }
        series = next_series;
        stack = stack.checked_add(i64::try_from(triple[1]).ok()?)?;
        rows.push((series, stack, triple[2]));
    }
    Some(rows)
}

/// A window's per-series totals (`(series, value)`, sorted by series): series as deltas from
/// the previous one, value as is; all varints. What the timeline reads instead of the rows.
pub(super) fn encode_totals(totals: &[(i64, u64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(totals.len() * 3);
    let mut last_series = 0i64;
    for &(series, value) in totals {
        put_varint(&mut out, (series - last_series) as u64);
        put_varint(&mut out, value);
        last_series = series;
    }
    out
}

/// Calls `each(series, value)` for every pair of [`encode_totals`]' output, without
/// allocating: the timeline decodes a day of windows per request. False if the bytes are
/// not such a list.
pub(super) fn for_each_total(mut bytes: &[u8], mut each: impl FnMut(i64, u64)) -> bool {
    let mut series = 0i64;
    while !bytes.is_empty() {
        let (Some(delta), Some(value)) = (next_varint(&mut bytes), next_varint(&mut bytes)) else {
            return false;
        };
        let Some(next) = i64::try_from(delta)
            .ok()
            .and_then(|d| series.checked_add(d))
        else {
            return false;
        };
        series = next;
        each(series, value);
    }
    true
}

/// The per-series totals of a window's sorted `(series, stack, value)` rows.
pub(super) fn totals_of_rows(rows: &[(i64, i64, u64)]) -> Vec<(i64, u64)> {
    let mut totals: Vec<(i64, u64)> = Vec::new();
    for &(series, _, value) in rows {
        match totals.last_mut() {
            Some((last, sum)) if *last == series => *sum = sum.saturating_add(value),
            _ => totals.push((series, value)),
        }
    }
    totals
}

pub(super) fn labels_json(labels: &Labels) -> String {
    serde_json::to_string(labels).unwrap_or_else(|_| "{}".to_owned())
}

pub(super) fn parse_labels(text: &str) -> Option<Labels> {
    serde_json::from_str(text).ok()
}

/// LEB128, as protobuf writes it: ids are small, most take one or two bytes.
pub(super) fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

pub(super) fn varints(mut bytes: &[u8]) -> Option<Vec<u64>> {
    let mut values = Vec::new();
    while !bytes.is_empty() {
        values.push(next_varint(&mut bytes)?);
    }
    Some(values)
}

/// The varint at the start of `bytes`, which then starts after it.
fn next_varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    let mut shift = 0;
    loop {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        if shift > 63 {
            return None;
        }
        value |= u64::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_and_reject_truncation() {
        let values = [0u64, 1, 127, 128, 300, 1 << 40, u64::MAX];
        let mut bytes = Vec::new();
        for &v in &values {
            put_varint(&mut bytes, v);
        }
        assert_eq!(varints(&bytes).unwrap(), values);
        assert!(varints(&[0x80]).is_none());
        let rows = vec![(1, 5, 3), (1, 9, 1), (4, 2, 7), (4, 2000, 1), (300, 1, 1)];
        assert_eq!(decode_rows(&encode_rows(&rows)).unwrap(), rows);
        assert!(decode_rows(&[1, 2]).is_none());
    }

    #[test]
    fn totals_sum_each_series_and_round_trip() {
        let rows = vec![(1, 5, 3), (1, 9, 1), (4, 2, 7), (4, 2000, 1), (300, 1, 1)];
        let totals = totals_of_rows(&rows);
        assert_eq!(totals, vec![(1, 4), (4, 8), (300, 1)]);
        let mut decoded = Vec::new();
        assert!(for_each_total(&encode_totals(&totals), |s, v| decoded.push((s, v))));
        assert_eq!(decoded, totals);
        assert!(for_each_total(&[], |_, _| unreachable!()));
        // A series without its value, or a truncated varint, is refused.
        assert!(!for_each_total(&[1], |_, _| {}));
        assert!(!for_each_total(&[1, 0x80], |_, _| {}));
    }
}
