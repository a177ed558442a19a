//! Lower-case hex, as build ids are written everywhere (paths under `.build-id/`, pprof's
//! `build_id`, the Parca debug-info service).

use std::fmt::Write as _;

/// `bytes` as lower-case hex, two digits per byte.
pub fn to_hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        // Writing into a String cannot fail.
        let _ = write!(out, "{byte:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_lower_case_digits_per_byte() {
        assert_eq!(super::to_hex(&[0x00, 0xab, 0x7f]), "00ab7f");
        assert_eq!(super::to_hex(&[]), "");
    }
}
