//! Encode: write a [`Profile`](crate::profile::Profile) in the formats readers want.
//!
//! - [`pprof`]: gzipped protobuf, the format every profile server and `go tool pprof` read;
//! - [`folded`]: Brendan Gregg's collapsed stacks, one line per stack;
//! - [`svg`]: an interactive flame graph drawn by inferno from the folded lines;
//! - [`top`]: flat and cumulative shares per function, as a table.
//!
//! All four are pure functions of the profile; [`encode`] picks one by [`Format`].

pub mod folded;
pub mod pprof;
pub mod svg;
pub mod top;

use std::path::Path;

use crate::profile::Profile;

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

    /// The name `--format` and the API's `format=` take.
    pub fn name(self) -> &'static str {
        match self {
            Format::Pprof => "pprof",
            Format::Folded => "folded",
            Format::Svg => "svg",
            Format::Top => "top",
        }
    }

    /// The HTTP content type of [`encode`]'s output.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Pprof => "application/octet-stream",
            Format::Svg => "image/svg+xml",
            Format::Folded | Format::Top => "text/plain; charset=utf-8",
        }
    }
}

/// What some formats need beyond the profile.
#[derive(Debug, Clone, Copy, Default)]
pub struct EncodeOptions<'a> {
    /// The flame graph's title ([`Format::Svg`]).
    pub title: &'a str,
    /// Rows of the table ([`Format::Top`]); `None` for all.
    pub top_limit: Option<usize>,
    /// The heaviest stacks drawn or folded ([`Format::Svg`], [`Format::Folded`]), the rest
    /// summed into one; `None` for all.
    pub max_stacks: Option<usize>,
    /// Which way the flame graph grows ([`Format::Svg`]): an icicle unless asked otherwise.
    pub orientation: svg::Orientation,
}

/// `profile` in `format`, as the bytes a file or a response holds.
pub fn encode(
    format: Format,
    profile: &Profile,
    options: EncodeOptions<'_>,
) -> Result<Vec<u8>, svg::SvgError> {
    Ok(match format {
        Format::Pprof => pprof::encode(profile),
        Format::Folded => match options.max_stacks {
            Some(max) => folded::encode_heaviest(profile, max).into_bytes(),
            None => folded::encode(profile).into_bytes(),
        },
        Format::Svg => svg::encode(
            profile,
            options.title,
            options.max_stacks,
            options.orientation,
        )?,
        Format::Top => top::render(&top::top(profile), options.top_limit).into_bytes(),
    })
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
