//! Encode: write a [`Profile`](crate::profile::Profile) in the formats readers want.
//!
//! - [`pprof`]: gzipped protobuf, the format every profile server and `go tool pprof` read;
//! - [`folded`]: Brendan Gregg's collapsed stacks, one line per stack;
//! - [`svg`]: an interactive flame graph drawn by inferno from the folded lines.
//!
//! All three are pure functions of the profile.

pub mod folded;
pub mod pprof;
pub mod svg;
pub mod top;

use std::path::Path;

/// Output formats `scorch record` (and later `scorch query`) write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Pprof,
    Folded,
    Svg,
    /// Flat and cumulative shares per function, like `go tool pprof -top`.
    Top,
}

impl Format {
    /// The format a file name implies: `.svg`, `.folded`/`.txt`, anything else pprof.
    pub fn from_path(path: &Path) -> Format {
        match path.extension().and_then(|e| e.to_str()) {
            Some("svg") => Format::Svg,
            Some("folded" | "txt") => Format::Folded,
            _ => Format::Pprof,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infers_format_from_extension() {
        assert_eq!(Format::from_path(Path::new("x.svg")), Format::Svg);
        assert_eq!(Format::from_path(Path::new("x.folded")), Format::Folded);
        assert_eq!(Format::from_path(Path::new("out/x.txt")), Format::Folded);
        assert_eq!(Format::from_path(Path::new("x.pb.gz")), Format::Pprof);
        assert_eq!(Format::from_path(Path::new("x")), Format::Pprof);
    }
}
