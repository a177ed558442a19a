//! Flame graph SVG, drawn by inferno from the folded stacks.

use inferno::flamegraph::{self, color::MultiPalette, Options, Palette};

use crate::profile::Profile;

#[derive(Debug, thiserror::Error)]
#[error("drawing the flame graph: {0}")]
pub struct SvgError(String);

impl SvgError {
    pub(crate) fn new(message: String) -> SvgError {
        SvgError(message)
    }
}

/// Draws the profile as an interactive flame graph titled `title`, of at most `max_stacks`
/// stacks (the heaviest; see [`super::folded::fold_heaviest`]) when given.
pub fn encode(
    profile: &Profile,
    title: &str,
    max_stacks: Option<usize>,
) -> Result<Vec<u8>, SvgError> {
    let lines = match max_stacks {
        Some(max) => super::folded::fold_heaviest(profile, max),
        None => super::folded::fold(profile),
    };
    let mut options = Options::default();
    options.title = title.to_owned();
    options.count_name = "samples".to_owned();
    // The "java" palette colours `_[k]` frames (kernel) apart from user frames.
    options.colors = Palette::Multi(MultiPalette::Java);
    if lines.is_empty() {
        // inferno refuses empty input; say so in a picture rather than invent a frame.
        return Ok(empty_svg(title).into_bytes());
    }
    let mut svg = Vec::new();
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut svg)
        .map_err(|e| SvgError(e.to_string()))?;
    Ok(svg)
}

fn empty_svg(title: &str) -> String {
    let title = title
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    format!(
        "<?xml version=\"1.0\" standalone=\"no\"?>\n\
         <svg version=\"1.1\" width=\"1200\" height=\"80\" xmlns=\"http://www.w3.org/2000/svg\">\n\
         <text x=\"600\" y=\"24\" text-anchor=\"middle\" font-size=\"17\">{title}</text>\n\
         <text x=\"600\" y=\"56\" text-anchor=\"middle\" font-size=\"14\">No samples were collected.</text>\n\
         </svg>\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::sample_profile;

    #[test]
    fn draws_named_frames() {
        let svg =
            String::from_utf8(encode(&sample_profile(), "scorch test", None).unwrap()).unwrap();
        assert!(svg.starts_with("<?xml"));
        assert!(svg.contains("scorch test"));
        // The java palette draws `_[k]` frames in the kernel colour and drops the suffix.
        assert!(svg.contains("vfs_read"));
        assert!(svg.contains("leaf"));
    }
}
