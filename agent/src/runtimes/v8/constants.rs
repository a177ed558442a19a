//! The `v8dbg_*` constants a V8 build exports for post-mortem debuggers, and its version.
//!
//! V8's `gen-postmortem-metadata.py` emits one `int` global per fact: tagging
//! (`v8dbg_SmiShiftSize`), a frame's slots (`v8dbg_off_fp_function`), instance types
//! (`v8dbg_type_JSFunction__JS_FUNCTION_TYPE`), fields (`v8dbg_class_JSFunction__shared__
//! SharedFunctionInfo`: class, field, then the field's type, whose spelling changes between
//! releases) and frame markers (`v8dbg_frametype_EntryFrame`). Node exports them from
//! `node` and from Debian's stripped `libnode.so.N` alike, in `.dynsym`. A constant whose
//! value is 0 lives in `.bss` and has no bytes in the file.
//!
//! The version is `v8::internal::Version`'s four statics, initialised data in the file.
//! Everything here is read from the file (the binary is another process's, so its bytes are
//! untrusted): a bounded number of constants, each a 4-byte read through the image.

use std::collections::HashMap;

use crate::runtimes::image::{Image, ImageError};

/// Constants kept at most: Node 20's static `node` exports 1,062, Debian's libnode about 500.
pub const MAX_CONSTANTS: usize = 4096;

/// The prefix every constant's symbol has.
pub const PREFIX: &str = "v8dbg_";

/// Why a binary's constants or version were not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConstantsError {
    #[error("no v8::internal::Version::{0}_ symbol")]
    NoVersion(&'static str),
    #[error("V8's version number {0}_ is unreadable: {1}")]
    Version(&'static str, String),
    #[error("V8's version {0} is not a V8 release's")]
    BadVersion(Version),
    #[error("no {PREFIX}* constants: V8 was built without post-mortem metadata")]
    None,
    #[error("more than {MAX_CONSTANTS} {PREFIX}* constants")]
    TooMany,
    #[error("{name}: {error}")]
    Unreadable { name: String, error: String },
}

/// A V8 version: `major.minor.build.patch` (Node 20's is 11.3.244.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub build: u32,
    pub patch: u32,
}

impl Version {
    pub const fn new(major: u32, minor: u32, build: u32) -> Version {
        Version {
            major,
            minor,
            build,
            patch: 0,
        }
    }

    /// Whether this version is `major.minor.build` or later (any patch).
    pub fn at_least(&self, major: u32, minor: u32, build: u32) -> bool {
        (self.major, self.minor, self.build) >= (major, minor, build)
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}.{}.{}.{}",
            self.major, self.minor, self.build, self.patch
        )
    }
}

/// A V8 build's constants by name, without the prefix
/// (`class_JSFunction__shared__SharedFunctionInfo`), and its version.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Constants {
    pub version: Option<Version>,
    values: HashMap<String, i32>,
}

impl Constants {
    /// Constants from `(name without prefix, value)` pairs (tests, the fuzz target).
    pub fn of(version: Version, values: impl IntoIterator<Item = (String, i32)>) -> Constants {
        Constants {
            version: Some(version),
            values: values.into_iter().take(MAX_CONSTANTS).collect(),
        }
    }

    pub fn get(&self, name: &str) -> Option<i32> {
        self.values.get(name).copied()
    }

    /// The field `class::field`, whatever type its name spells (`Object`, `Tagged_Object_`,
    /// `uintptr_t`...): the offset, when exported.
    pub fn field(&self, class: &str, field: &str) -> Option<i32> {
        let prefix = format!("class_{class}__{field}__");
        let mut found = self
            .values
            .iter()
            .filter(|(name, _)| name.starts_with(&prefix))
            .map(|(_, &value)| value);
        let first = found.next()?;
        // Two spellings of one field must agree; if they do not, neither is trusted.
        found.all(|other| other == first).then_some(first)
    }

    /// The instance type `class__TYPE` (`JSFunction__JS_FUNCTION_TYPE`), or the first of
    /// `names` exported.
    pub fn instance_type(&self, names: &[&str]) -> Option<i32> {
        names
            .iter()
            .find_map(|name| self.get(&format!("type_{name}")))
    }

    /// Every constant whose name starts with `prefix`, with the rest of its name.
    pub fn with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, i32)> {
        self.values
            .iter()
            .filter_map(move |(name, &value)| Some((name.strip_prefix(prefix)?, value)))
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// Whether the binary exports V8's constants: a cheap look for the loader.
pub fn exports_constants(elf: &object::File) -> bool {
    use object::{Object, ObjectSymbol};
    elf.dynamic_symbols()
        .any(|s| s.name_bytes() == Ok(b"v8dbg_SmiShiftSize"))
}

/// The constants and version of the V8 in `image`; `Ok(None)` when it has neither.
pub fn read(image: &Image) -> Result<Option<Constants>, ConstantsError> {
    let mut values = HashMap::new();
    for (name, symbol) in image.symbols() {
        let Some(short) = name.strip_prefix(PREFIX) else {
            continue;
        };
        if values.len() == MAX_CONSTANTS {
            return Err(ConstantsError::TooMany);
        }
        // Every constant is an `int`; another size is not one of them, and is left out
        // (a constant the layout needs is then reported missing by name).
        if symbol.size != 4 {
            continue;
        }
        let value = image
            .i32_or_zero_at("V8 constant", symbol.address)
            .map_err(|error: ImageError| ConstantsError::Unreadable {
                name: name.to_owned(),
                error: error.to_string(),
            })?;
        values.insert(short.to_owned(), value);
    }
    let version = read_version(image)?;
    match (version, values.is_empty()) {
        (None, true) => Ok(None),
        (Some(_), true) => Err(ConstantsError::None),
        (version, false) => Ok(Some(Constants { version, values })),
    }
}

/// `v8::internal::Version`'s numbers: `None` when the binary has none of them.
fn read_version(image: &Image) -> Result<Option<Version>, ConstantsError> {
    const PARTS: [(&str, &str); 4] = [
        ("major", "_ZN2v88internal7Version6major_E"),
        ("minor", "_ZN2v88internal7Version6minor_E"),
        ("build", "_ZN2v88internal7Version6build_E"),
        ("patch", "_ZN2v88internal7Version6patch_E"),
    ];
    if image.symbol(PARTS[0].1).is_none() {
        return Ok(None);
    }
    let mut numbers = [0u32; 4];
    for (number, (part, symbol)) in numbers.iter_mut().zip(PARTS) {
        let symbol = image
            .symbol(symbol)
            .ok_or(ConstantsError::NoVersion(part))?;
        let value = image
            .i32_or_zero_at("V8 version", symbol.address)
            .map_err(|error| ConstantsError::Version(part, error.to_string()))?;
        *number =
            u32::try_from(value).map_err(|_| ConstantsError::Version(part, format!("{value}")))?;
    }
    let version = Version {
        major: numbers[0],
        minor: numbers[1],
        build: numbers[2],
        patch: numbers[3],
    };
    // V8's releases run from 1.x; a major past a few hundred is not one.
    if version.major == 0 || version.major > 1000 || version.minor > 1000 {
        return Err(ConstantsError::BadVersion(version));
    }
    Ok(Some(version))
}
