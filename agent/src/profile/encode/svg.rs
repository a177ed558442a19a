//! Flame graph SVG, drawn by inferno from the folded stacks.

use inferno::flamegraph::{self, color::MultiPalette, Direction, Options, Palette};

use crate::profile::Profile;

#[derive(Debug, thiserror::Error)]
#[error("drawing the flame graph: {0}")]
pub struct SvgError(String);

impl SvgError {
    pub(crate) fn new(message: String) -> SvgError {
        SvgError(message)
    }
}

/// Which way a flame graph grows.
///
/// Icicle is the default because a picture is as tall as its deepest stack: drawn the classic
/// way, one 150-frame stack puts the root (and every wide, readable frame) 2,500 px down, below
/// the first screen; drawn as an icicle, the root is on top whatever the depth.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Orientation {
    /// The root on top, callees below it.
    #[default]
    Icicle,
    /// The root at the bottom, callees above it (Brendan Gregg's original flame graph).
    Classic,
}

/// inferno's options for every flame graph scorch draws, merged or differential: the title,
/// the orientation, and the count's name.
pub(crate) fn inferno_options(
    title: &str,
    orientation: Orientation,
    count_name: &str,
) -> Options<'static> {
    let mut options = Options::default();
    options.title = title.to_owned();
    options.count_name = count_name.to_owned();
    options.direction = match orientation {
        Orientation::Icicle => Direction::Inverted,
        Orientation::Classic => Direction::Straight,
    };
    options
}

/// Draws the profile as an interactive flame graph titled `title`, of at most `max_stacks`
/// stacks (the heaviest; see [`super::folded::fold_heaviest`]) when given.
pub fn encode(
    profile: &Profile,
    title: &str,
    max_stacks: Option<usize>,
    orientation: Orientation,
) -> Result<Vec<u8>, SvgError> {
    let lines = match max_stacks {
        Some(max) => super::folded::fold_heaviest(profile, max),
        None => super::folded::fold(profile),
    };
    let mut options = inferno_options(title, orientation, "samples");
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

/// What the tests read back from inferno's SVG: the picture's height and each frame's name and
/// top edge, shared with [`crate::profile::diff`]'s tests.
#[cfg(test)]
pub(crate) mod layout {
    /// The root `<svg>`'s `height`.
    pub fn height(svg: &str) -> f64 {
        let root = &svg[svg.find("<svg").unwrap()..];
        attribute(root, "height")
    }

    /// `(name, y)` of every frame, in the order drawn.
    pub fn frames(svg: &str) -> Vec<(String, f64)> {
        let frames = &svg[svg.find("<svg id=\"frames\"").unwrap()..];
        frames
            .split("<g>")
            .skip(1)
            .map(|g| {
                let title = &g[g.find("<title>").unwrap() + 7..g.find("</title>").unwrap()];
                let name = title.split(" (").next().unwrap().to_owned();
                (name, attribute(&g[g.find("<rect").unwrap()..], "y"))
            })
            .collect()
    }

    /// The top edge of the frame called `name` (the first drawn).
    pub fn y_of(svg: &str, name: &str) -> f64 {
        frames(svg)
            .into_iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no frame {name}"))
            .1
    }

    fn attribute(element: &str, name: &str) -> f64 {
        let start = element.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
        let value = &element[start..];
        value[..value.find('"').unwrap()].parse().unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::layout::{frames, height, y_of};
    use super::*;
    use crate::profile::{sample_profile, FrameKind, Labels, Line, Location, Sample};

    #[test]
    fn draws_named_frames() {
        let svg = String::from_utf8(
            encode(&sample_profile(), "scorch test", None, Orientation::Icicle).unwrap(),
        )
        .unwrap();
        assert!(svg.starts_with("<?xml"));
        assert!(svg.contains("scorch test"));
        // The java palette draws `_[k]` frames in the kernel colour and drops the suffix.
        assert!(svg.contains("vfs_read"));
        assert!(svg.contains("leaf"));
    }

    /// One process whose only stack is `depth` frames deep: `main` calling `frame_1` calling
    /// ... `frame_{depth - 1}`.
    fn deep_profile(depth: usize) -> Profile {
        let mut profile = sample_profile();
        let first = profile.locations.len();
        profile.locations.extend((0..depth).map(|d| Location {
            mapping: None,
            address: 0x1000 + d as u64,
            lines: vec![Line::named(if d == 0 {
                "main".to_owned()
            } else {
                format!("frame_{d}")
            })],
            kind: FrameKind::Native,
        }));
        profile.samples = vec![Sample {
            pid: 7,
            comm: "deep".into(),
            labels: std::sync::Arc::new(Labels::new()),
            // Leaf first, as the samples hold them.
            locations: (first..first + depth).rev().collect(),
            count: 10,
        }];
        profile
    }

    fn draw(profile: &Profile, orientation: Orientation) -> String {
        String::from_utf8(encode(profile, "deep", None, orientation).unwrap()).unwrap()
    }

    #[test]
    fn icicle_is_the_default() {
        use clap::ValueEnum;
        assert_eq!(Orientation::default(), Orientation::Icicle);
        // The names `--orientation` and the API's `orientation=` take.
        assert_eq!(
            Orientation::from_str("classic", true),
            Ok(Orientation::Classic)
        );
        assert_eq!(
            Orientation::from_str("icicle", true),
            Ok(Orientation::Icicle)
        );
        assert!(Orientation::from_str("upside-down", true).is_err());
    }

    #[test]
    fn icicle_puts_the_root_on_top_however_deep_the_stack() {
        let svg = draw(&deep_profile(150), Orientation::Icicle);
        // 150 frames, the process and the root, 16 px each: far taller than a screen.
        assert!(height(&svg) > 2_400.0, "height {}", height(&svg));
        // The root just under the title and the details line, then one row per level down.
        let root = y_of(&svg, "all");
        assert!(root < 100.0, "root at {root}");
        assert_eq!(y_of(&svg, "deep"), root + 16.0);
        assert_eq!(y_of(&svg, "main"), root + 32.0);
        assert_eq!(y_of(&svg, "frame_149"), root + 16.0 * 151.0);
        // Every frame is drawn: none was too narrow.
        assert_eq!(frames(&svg).len(), 152);
    }

    #[test]
    fn classic_puts_the_root_at_the_bottom() {
        let svg = draw(&deep_profile(150), Orientation::Classic);
        let root = y_of(&svg, "all");
        assert!(
            height(&svg) - root < 60.0,
            "root at {root} of {}",
            height(&svg)
        );
        assert_eq!(y_of(&svg, "main"), root - 32.0);
        assert_eq!(y_of(&svg, "frame_149"), root - 16.0 * 151.0);
        assert!(y_of(&svg, "frame_149") < 100.0);
    }
}
