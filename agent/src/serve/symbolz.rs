//! The symbol service's wire format (`/symbolz`), pure: parsing a request, formatting the
//! answer. The route itself is in [`super::http`].
//!
//! `go tool pprof URL` asks `http://host:port/symbolz` (its `internal/symbolz` derives that
//! from any profile URL whose path has no `/debug/pprof/`) for the addresses of every mapping
//! the profile does not mark `has_functions` that hold unnamed locations, and gives up on the
//! whole profile if the answer is not a 200. The protocol, as Go's `net/http/pprof` serves it:
//!
//! - `GET`: `num_symbols: N`; pprof only looks at whether N is 0.
//! - `POST`, body `0xADDR+0xADDR+...`: the same first line, then `0xADDR name` per address
//!   named, in pprof's format (`%#x`); addresses not named are left out.
//!
//! The body comes from anyone who reaches the port: it is bounded ([`MAX_BODY_BYTES`],
//! [`MAX_ADDRESSES`]), a word that is not an address is a 400 naming it, and the names sent
//! back are kept to one line each, so a name a hostile binary chose cannot add lines.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write,
    time::Duration,
};

/// The largest request body read: pprof's addresses take at most 19 bytes each
/// (`0x` + 16 digits + `+`), so this holds more than [`MAX_ADDRESSES`] of them.
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// Addresses one request may ask for. A profile's unnamed addresses in mappings scorch could
/// not read are far fewer (the query merge holds at most 50,000 stacks); each costs a set
/// lookup during the store's one scan.
pub const MAX_ADDRESSES: usize = 50_000;
/// How long a client has to send the body, once its headers are in.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a symbol request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SymbolzError {
    #[error("symbolz: the request body is over {MAX_BODY_BYTES} bytes; ask for fewer addresses")]
    BodyTooLarge,
    #[error("symbolz: more than {MAX_ADDRESSES} addresses in one request; ask for fewer")]
    TooManyAddresses,
    #[error(
        "symbolz: word {index} of the request, {word:?}, is not an address \
         (0x-prefixed hex or decimal, joined by '+')"
    )]
    NotAnAddress { index: usize, word: String },
    #[error("symbolz: the request body did not arrive within {} s", BODY_READ_TIMEOUT.as_secs())]
    SlowBody,
    #[error("symbolz: reading the request body: {0}")]
    Body(String),
}

impl SymbolzError {
    /// The HTTP status of the refusal.
    pub fn status(&self) -> u16 {
        match self {
            SymbolzError::BodyTooLarge | SymbolzError::TooManyAddresses => 413,
            SymbolzError::NotAnAddress { .. } | SymbolzError::Body(_) => 400,
            SymbolzError::SlowBody => 408,
        }
    }
}

/// The addresses a request asks for (a POST body, or a GET's raw query string), deduplicated.
/// Surrounding whitespace and empty words (a trailing `+`) are allowed; address 0, which no
/// frame has, is dropped, as Go's server does.
pub fn parse_addresses(text: &[u8]) -> Result<BTreeSet<u64>, SymbolzError> {
    if text.len() > MAX_BODY_BYTES {
        return Err(SymbolzError::BodyTooLarge);
    }
    let mut addresses = BTreeSet::new();
    let words = text
        .split(|&b| b == b'+')
        .map(|w| w.trim_ascii())
        .filter(|w| !w.is_empty());
    for (index, word) in words.enumerate() {
        if index >= MAX_ADDRESSES {
            return Err(SymbolzError::TooManyAddresses);
        }
        let address = parse_address(word).ok_or_else(|| SymbolzError::NotAnAddress {
            index: index + 1,
            // Echoed in the answer: short, and as text whatever the bytes were.
            word: String::from_utf8_lossy(&word[..word.len().min(40)]).into_owned(),
        })?;
        if address != 0 {
            addresses.insert(address);
        }
    }
    Ok(addresses)
}

/// One word: `0x`-prefixed hex (what pprof sends) or decimal.
fn parse_address(word: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(word).ok()?;
    // `from_str_radix` takes a leading sign; an address has none.
    if text.starts_with(['+', '-']) {
        return None;
    }
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) if !hex.starts_with(['+', '-']) => u64::from_str_radix(hex, 16).ok(),
        Some(_) => None,
        None => text.parse().ok(),
    }
}

/// The answer: `num_symbols: N`, then `0xADDR name` for each named address. `symbols` is
/// what the first line reports (pprof only checks it is not 0).
pub fn format_answer(symbols: usize, names: &BTreeMap<u64, String>) -> String {
    let mut out = format!("num_symbols: {symbols}\n");
    for (address, name) in names {
        let name = one_line(name);
        if !name.is_empty() {
            // Writing into a String cannot fail.
            let _ = writeln!(out, "{address:#x} {name}");
        }
    }
    out
}

/// `name` with every control character (a newline above all) as `?`, and no surrounding
/// whitespace, which pprof's `0x... name` pattern would fold into the name.
fn one_line(name: &str) -> String {
    name.trim()
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_pprof_sends() {
        // symbolz.go: fmt.Sprintf("%#x", addr) joined by "+".
        let asked = parse_addresses(b"0x4011a6+0x7f3c2a1b4c5d+0x4011a6").unwrap();
        assert_eq!(
            asked.into_iter().collect::<Vec<_>>(),
            [0x4011a6, 0x7f3c2a1b4c5d]
        );
        // Decimal, upper-case prefix, whitespace, a trailing '+', zero.
        let asked = parse_addresses(b" 4096+0X1F+0+\n").unwrap();
        assert_eq!(asked.into_iter().collect::<Vec<_>>(), [0x1f, 4096]);
        assert!(parse_addresses(b"").unwrap().is_empty());
        assert!(parse_addresses(b"+ +").unwrap().is_empty());
        let max = format!("{:#x}", u64::MAX);
        assert_eq!(
            parse_addresses(max.as_bytes()).unwrap().first(),
            Some(&u64::MAX)
        );
    }

    #[test]
    fn refuses_what_is_not_an_address_naming_it() {
        for (body, index, word) in [
            (&b"0x10+main"[..], 2, "main"),
            (b"0x", 1, "0x"),
            (b"0x-1", 1, "0x-1"),
            (b"-1", 1, "-1"),
            (b"0x1 0x2", 1, "0x1 0x2"),
            (b"0x10000000000000000", 1, "0x10000000000000000"),
            (b"\xff\xfe", 1, "\u{fffd}\u{fffd}"),
        ] {
            let error = parse_addresses(body).unwrap_err();
            assert_eq!(
                error,
                SymbolzError::NotAnAddress {
                    index,
                    word: word.to_owned()
                },
                "{body:?}"
            );
            assert_eq!(error.status(), 400);
        }
        // A long word is echoed shortened.
        let long = format!("0x{}", "z".repeat(500));
        match parse_addresses(long.as_bytes()).unwrap_err() {
            SymbolzError::NotAnAddress { word, .. } => assert_eq!(word.len(), 40),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bounds_the_request() {
        let at_most: Vec<String> = (1..=MAX_ADDRESSES).map(|a| format!("{a:#x}")).collect();
        assert_eq!(
            parse_addresses(at_most.join("+").as_bytes()).unwrap().len(),
            MAX_ADDRESSES
        );
        let over = format!("{}+0x1", at_most.join("+"));
        let error = parse_addresses(over.as_bytes()).unwrap_err();
        assert_eq!(error, SymbolzError::TooManyAddresses);
        assert_eq!(error.status(), 413);
        // The longest words pprof sends fit MAX_ADDRESSES in the body.
        assert!(MAX_ADDRESSES * "0xffffffffffffffff+".len() <= MAX_BODY_BYTES);
        let huge = vec![b' '; MAX_BODY_BYTES + 1];
        assert_eq!(
            parse_addresses(&huge).unwrap_err(),
            SymbolzError::BodyTooLarge
        );
    }

    #[test]
    fn answers_in_the_format_pprof_parses() {
        let names = BTreeMap::from([
            (0x4011a6, "leaf_a".to_owned()),
            (0x7f3c2a1b4c5d, "std::vector<int>::push_back".to_owned()),
        ]);
        assert_eq!(
            format_answer(1, &names),
            "num_symbols: 1\n0x4011a6 leaf_a\n0x7f3c2a1b4c5d std::vector<int>::push_back\n"
        );
        assert_eq!(format_answer(0, &BTreeMap::new()), "num_symbols: 0\n");
    }

    #[test]
    fn a_hostile_name_stays_on_its_line() {
        let names = BTreeMap::from([
            (0x10, "evil\n0x20 forged\r".to_owned()),
            (0x30, " \t ".to_owned()),
        ]);
        let answer = format_answer(1, &names);
        assert_eq!(answer, "num_symbols: 1\n0x10 evil?0x20 forged\n");
        assert_eq!(answer.lines().count(), 2);
    }
}
