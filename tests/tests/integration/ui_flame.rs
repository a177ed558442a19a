//! The UI's flame graphs on the first screen, whatever the depth: a store holding a 150-frame
//! stack (a picture 2,500 px tall), shown in Chromium with a 1400x1000 viewport. Each view's
//! frames are looked for twice: in the DOM (the frames' boxes inside the part of the graph's
//! frame that is on the screen) and in the screenshot's pixels (rows of the frames' own fills).
//!
//! Screenshots go to `target/test-artifacts/ui-deep-*.png`.

use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{ensure, Context, Result};
use headless_chrome::{
    protocol::cdp::{Emulation, Page::CaptureScreenshotFormatOption},
    Tab,
};
use scorch::profile::{FrameKind, Labels, Line, Location, Mapping, Profile, Sample};
use scorch_tests::{url_encode, work_dir, Daemon};

use crate::ui::{artifact_path, chromium, eval, wait_until, GRAPH};

const WIDTH: u32 = 1400;
const HEIGHT: u32 = 1000;
/// Frames of the stack: `main`, `deep_1` .. `deep_148`, and a leaf.
const DEPTH: usize = 150;
const COMM: &str = "deepstack";
/// Windows of the baseline (leaf `leaf_old`) and of the selection (leaf `leaf_new`).
const WINDOWS: u64 = 6;
const WINDOW_SECONDS: u64 = 10;

/// One window of the deep stack ending in `leaf`, starting at `start` (Unix seconds).
fn deep_window(start: u64, leaf: &str) -> Profile {
    let names = (0..DEPTH).map(|d| match d {
        0 => "main".to_owned(),
        d if d == DEPTH - 1 => leaf.to_owned(),
        d => format!("deep_{d}"),
    });
    let locations: Vec<Location> = names
        .enumerate()
        .map(|(d, name)| Location {
            mapping: Some(0),
            address: 0x40_1000 + d as u64 * 0x40,
            lines: vec![Line::named(name)],
            kind: FrameKind::Native,
        })
        .collect();
    Profile {
        start: UNIX_EPOCH + Duration::from_secs(start),
        duration: Duration::from_secs(WINDOW_SECONDS),
        period_ns: 1_000_000_000 / 19,
        sample_type: scorch::profile::SampleType::Cpu,
        mappings: vec![Mapping {
            start: 0x40_0000,
            limit: 0x80_0000,
            file_offset: 0,
            path: "/usr/bin/deepstack".to_owned(),
            build_id: None,
            has_functions: true,
            has_filenames: false,
            has_line_numbers: false,
            has_inline_frames: false,
        }],
        locations,
        samples: vec![Sample {
            pid: 4242,
            comm: COMM.to_owned(),
            labels: Arc::new(Labels::from([("comm".to_owned(), COMM.to_owned())])),
            // Leaf first, as samples hold them.
            locations: (0..DEPTH).rev().collect(),
            // Far more than the daemon's own samples of the machine in a few seconds.
            count: 2_000,
        }],
    }
}

/// What the first screen shows of the flame graph, measured in the page.
#[derive(Debug)]
struct FirstScreen {
    /// The viewport's height.
    viewport: f64,
    /// The SVG's own height.
    svg_height: f64,
    /// The graph's frame (the iframe): its bottom edge on the page.
    frame_bottom: f64,
    /// The part of the iframe's inside on the first screen: left, top, right, bottom.
    inside: [f64; 4],
    /// The root frame's box (`all`), top and bottom, in page coordinates.
    root: (f64, f64),
    /// Frames whose box lies wholly inside the part of the iframe on the first screen.
    visible_frames: usize,
    /// The iframe's own vertical scroll.
    scroll_y: f64,
    /// The root's top edge and the deepest frame's, in the SVG (which way it grows).
    svg_root_y: f64,
    svg_max_y: f64,
}

/// Measures the flame graph as shown: the page is never scrolled, so page coordinates are
/// screen coordinates.
fn first_screen(tab: &Tab) -> Result<FirstScreen> {
    let text = eval(
        tab,
        "(() => { const f = document.getElementById('flame'); const d = f.contentDocument; \
         const o = f.getBoundingClientRect(); \
         const bottom = Math.min(o.top + f.clientTop + f.clientHeight, window.innerHeight); \
         const gs = [...d.querySelectorAll('#frames > g')]; \
         const onPage = (g) => { const r = g.querySelector('rect').getBoundingClientRect(); \
           return [o.top + f.clientTop + r.top, o.top + f.clientTop + r.bottom, r.width]; }; \
         const root = gs.find((g) => g.querySelector('title').textContent.startsWith('all ')); \
         const ys = gs.map((g) => parseFloat(g.querySelector('rect').getAttribute('y'))); \
         const visible = gs.filter((g) => { const [t, b, w] = onPage(g); \
           return w > 0 && t >= o.top + f.clientTop && b <= bottom; }).length; \
         return JSON.stringify({ viewport: window.innerHeight, pageScroll: window.scrollY, \
           svgHeight: Number(d.documentElement.getAttribute('height')), \
           frameBottom: o.bottom, inside: [o.left + f.clientLeft, o.top + f.clientTop,              o.left + f.clientLeft + f.clientWidth, bottom], root: onPage(root).slice(0, 2), visible, \
           scrollY: f.contentWindow.scrollY, \
           svgRootY: parseFloat(root.querySelector('rect').getAttribute('y')), \
           svgMaxY: Math.max(...ys) }); })()",
    )?;
    let json: serde_json::Value = serde_json::from_str(&text)?;
    let number = |key: &str| {
        json[key]
            .as_f64()
            .with_context(|| format!("{key} in {text}"))
    };
    ensure!(
        number("pageScroll")? == 0.0,
        "the page itself scrolled: {text}"
    );
    let root = json["root"].as_array().context("root")?;
    Ok(FirstScreen {
        viewport: number("viewport")?,
        svg_height: number("svgHeight")?,
        frame_bottom: number("frameBottom")?,
        inside: serde_json::from_value(json["inside"].clone()).context("inside")?,
        root: (
            root[0].as_f64().context("root top")?,
            root[1].as_f64().context("root bottom")?,
        ),
        visible_frames: json["visible"].as_u64().context("visible")? as usize,
        scroll_y: number("scrollY")?,
        svg_root_y: number("svgRootY")?,
        svg_max_y: number("svgMaxY")?,
    })
}

/// The frames' fills, `rgb(r,g,b)` as inferno writes them, each once.
fn frame_fills(tab: &Tab) -> Result<Vec<String>> {
    let text = eval(
        tab,
        &format!(
            "JSON.stringify([...new Set([...{GRAPH}.querySelectorAll('#frames > g rect')] \
             .map((r) => r.getAttribute('fill')))])"
        ),
    )?;
    Ok(serde_json::from_str(&text)?)
}

/// `rgb(r,g,b)` -> [r, g, b].
fn rgb(fill: &str) -> Option<[u8; 3]> {
    let inner = fill.strip_prefix("rgb(")?.strip_suffix(')')?;
    let mut parts = inner.split(',').map(|p| p.trim().parse::<u8>().ok());
    Some([parts.next()??, parts.next()??, parts.next()??])
}

/// Takes a screenshot of the viewport into `target/test-artifacts/NAME` and counts the pixel
/// rows of `inside` (the graph's frame on the first screen) holding at least 300 pixels of the
/// frames' fills: frames drawn on the first screen. Only inside the frame, because a
/// differential graph draws unchanged frames in rgb(250,250,250), the page's own background.
fn flame_rows_on_screen(
    tab: &Tab,
    name: &str,
    fills: &[String],
    inside: [f64; 4],
) -> Result<usize> {
    std::thread::sleep(Duration::from_millis(300));
    let png = tab.capture_screenshot(CaptureScreenshotFormatOption::Png, None, None, true)?;
    let path = artifact_path(name);
    std::fs::create_dir_all(path.parent().context("artifact directory")?)?;
    std::fs::write(&path, &png).with_context(|| format!("writing {}", path.display()))?;
    println!("screenshot: {}", path.display());

    let colours: HashSet<[u8; 3]> = fills.iter().filter_map(|f| rgb(f)).collect();
    ensure!(!colours.is_empty(), "no frame fills among {fills:?}");
    let mut decoder = png::Decoder::new(std::io::Cursor::new(png));
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder
        .read_info()
        .context("reading the screenshot's PNG header")?;
    let mut pixels = vec![0; reader.output_buffer_size()];
    let info = reader
        .next_frame(&mut pixels)
        .context("decoding the screenshot")?;
    let channels = info.color_type.samples();
    ensure!(
        channels >= 3 && info.width == WIDTH && info.height == HEIGHT,
        "the screenshot is {}x{} with {channels} channels, not {WIDTH}x{HEIGHT} RGB",
        info.width,
        info.height
    );
    let [left, top, right, bottom] = inside.map(|edge| edge.max(0.0).round() as usize);
    let rows = pixels[..info.buffer_size()]
        .chunks(info.line_size)
        .take(bottom.min(HEIGHT as usize))
        .skip(top)
        .filter(|row| {
            row.chunks(channels)
                .take(right.min(WIDTH as usize))
                .skip(left)
                .filter(|p| colours.contains(&[p[0], p[1], p[2]]))
                .count()
                >= 300
        })
        .count();
    Ok(rows)
}

/// The checks every view passes: a picture far taller than the screen, its frame ending on the
/// first screen, the root and at least 20 frames inside it, and at least 20 frames' worth of
/// pixel rows in the frames' colours in the screenshot.
fn assert_frames_on_first_screen(tab: &Tab, view: &str, screenshot: &str) -> Result<FirstScreen> {
    let shown = first_screen(tab)?;
    println!("{view}: {shown:?}");
    ensure!(
        shown.viewport == f64::from(HEIGHT),
        "{view}: the viewport is {} px tall, not {HEIGHT}",
        shown.viewport
    );
    ensure!(
        shown.svg_height > 2.0 * shown.viewport,
        "{view}: the flame graph is only {} px tall; the test needs a deep one",
        shown.svg_height
    );
    ensure!(
        shown.frame_bottom <= shown.viewport,
        "{view}: the graph's frame ends at {} px, below the first screen",
        shown.frame_bottom
    );
    ensure!(
        shown.root.0 >= shown.inside[1] && shown.root.1 <= shown.inside[3],
        "{view}: the root frame is at {:?}, off the first screen (frame ends at {})",
        shown.root,
        shown.frame_bottom
    );
    ensure!(
        shown.visible_frames >= 20,
        "{view}: only {} frames on the first screen",
        shown.visible_frames
    );
    // A frame is 16 px tall, 15 of them filled.
    let rows = flame_rows_on_screen(tab, screenshot, &frame_fills(tab)?, shown.inside)?;
    println!("{view}: {rows} pixel rows of frame colours in {screenshot}");
    ensure!(
        rows >= 20 * 15,
        "{view}: {rows} pixel rows of the frames' colours on the first screen, not 300"
    );
    Ok(shown)
}

fn is_icicle(shown: &FirstScreen) -> bool {
    shown.svg_root_y < shown.svg_max_y && shown.scroll_y == 0.0
}

/// Classic: the root is the lowest frame, and the graph's frame starts scrolled down to it.
fn is_classic(shown: &FirstScreen) -> bool {
    shown.svg_root_y == shown.svg_max_y && shown.scroll_y > 0.0
}

#[test]
fn ui_flame_graphs_of_a_deep_stack_start_on_the_first_screen() -> Result<()> {
    let store = work_dir().join("ui-deep-store");
    let _ = std::fs::remove_dir_all(&store);
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    // The baseline from 4 minutes ago, the selection from 2.
    let (base_from, sel_from) = (now - 240, now - 120);
    let span = WINDOWS * WINDOW_SECONDS;
    {
        let mut writer = scorch::store::Store::open(&store, scorch::store::Retention::default())?;
        for w in 0..WINDOWS {
            writer.write_window(&deep_window(base_from + w * WINDOW_SECONDS, "leaf_old"))?;
            writer.write_window(&deep_window(sel_from + w * WINDOW_SECONDS, "leaf_new"))?;
        }
    }
    let daemon = Daemon::start(&store, &["--window", "2s"])?;

    let browser = chromium(WIDTH, HEIGHT)?;
    let tab = browser.new_tab()?;
    // The viewport itself 1400x1000, whatever the window's own bars take.
    tab.call_method(Emulation::SetDeviceMetricsOverride {
        width: WIDTH,
        height: HEIGHT,
        device_scale_factor: 1.0,
        mobile: false,
        scale: None,
        screen_width: None,
        screen_height: None,
        position_x: None,
        position_y: None,
        dont_set_visible_size: None,
        screen_orientation: None,
        viewport: None,
        display_feature: None,
        device_posture: None,
    })?;
    let graph_drawn = |leaf: &str| {
        format!(
            "(() => {{ const d = {GRAPH}; const f = d && d.getElementById('frames'); \
             return !!f && !!d.getElementById('details') && \
             [...f.querySelectorAll('title')].some(t => t.textContent.startsWith('{leaf} ')) && \
             d.readyState === 'complete' && document.getElementById('flame').style.height !== ''; }})()"
        )
    };
    let address = format!("http://{}", daemon.address);

    // The page as it opens, no parameters: an icicle, the root on top.
    tab.navigate_to(&format!("{address}/"))?
        .wait_until_navigated()?;
    wait_until(&tab, &graph_drawn("leaf_new"), "the deep flame graph")?;
    let shown = assert_frames_on_first_screen(&tab, "icicle", "ui-deep-icicle.png")?;
    ensure!(
        is_icicle(&shown),
        "the default graph is not an icicle: {shown:?}"
    );
    ensure!(
        !tab.get_url().contains("orientation="),
        "the default orientation is written in the address {}",
        tab.get_url()
    );

    // Classic, from the address: the root at the bottom, scrolled into view.
    tab.navigate_to(&format!("{address}/?orientation=classic"))?
        .wait_until_navigated()?;
    wait_until(&tab, &graph_drawn("leaf_new"), "the classic flame graph")?;
    ensure!(eval(&tab, "document.getElementById('orientation').value")? == "classic");
    let shown = assert_frames_on_first_screen(&tab, "classic", "ui-deep-classic.png")?;
    ensure!(is_classic(&shown), "?orientation=classic drew {shown:?}");

    // The switch: back to icicle, and the address forgets the orientation; then classic again,
    // and the address keeps it.
    let choose = |value: &str| -> Result<()> {
        eval(
            &tab,
            &format!(
                "(() => {{ const s = document.getElementById('orientation'); s.value = '{value}'; \
                 s.dispatchEvent(new Event('change')); return 'ok'; }})()"
            ),
        )?;
        wait_until(
            &tab,
            &format!(
                "document.getElementById('flame').src.includes('orientation={value}') && \
                 document.getElementById('flame').contentDocument.URL.includes('orientation={value}') && \
                 {}",
                graph_drawn("leaf_new")
            ),
            &format!("the {value} flame graph after the switch"),
        )
    };
    choose("icicle")?;
    ensure!(!tab.get_url().contains("orientation="), "{}", tab.get_url());
    ensure!(is_icicle(&first_screen(&tab)?), "the switch to icicle");
    choose("classic")?;
    ensure!(
        tab.get_url().contains("orientation=classic"),
        "the address {} lost the classic orientation",
        tab.get_url()
    );
    let shown = assert_frames_on_first_screen(&tab, "classic switch", "ui-deep-switch.png")?;
    ensure!(is_classic(&shown), "the switch to classic drew {shown:?}");

    // The differential graph, both ways, with the sandwich of a frame halfway down.
    let diff = format!(
        "{address}/?base_from={base_from}&base_to={}&sel_from={sel_from}&sel_to={}&match={}&fn=deep_100",
        base_from + span,
        sel_from + span,
        url_encode(&format!("{{comm=\"{COMM}\"}}"))
    );
    for (orientation, query) in [("icicle", ""), ("classic", "&orientation=classic")] {
        tab.navigate_to(&format!("{diff}{query}"))?
            .wait_until_navigated()?;
        wait_until(
            &tab,
            &format!(
                "document.getElementById('status').textContent.startsWith('comparing') && \
                 {GRAPH}.documentElement.textContent.includes('red grew, blue shrank') && {}",
                graph_drawn("leaf_old")
            ),
            &format!("the {orientation} differential flame graph"),
        )?;
        let view = format!("diff {orientation}");
        let shown =
            assert_frames_on_first_screen(&tab, &view, &format!("ui-deep-diff-{orientation}.png"))?;
        let right = if orientation == "icicle" {
            is_icicle(&shown)
        } else {
            is_classic(&shown)
        };
        ensure!(right, "{view} drew {shown:?}");
    }

    // The sandwich of deep_100 (100 callers): its box scrolls inside and starts at the bottom,
    // where the function is, and ends within 40% of the viewport's height.
    wait_until(
        &tab,
        "!!document.querySelector('#callers div.focus') && \
         !!document.querySelector('#callers div[data-name=\"deep_99\"]') && \
         !!document.querySelector('#callees div[data-name=\"deep_101\"]')",
        "the sandwich view of deep_100",
    )?;
    let sandwich = eval(
        &tab,
        "(() => { const box = document.getElementById('callers'); \
         const b = box.getBoundingClientRect(); \
         const f = box.querySelector('div.focus').getBoundingClientRect(); \
         return JSON.stringify([b.height, box.scrollHeight, f.top >= b.top && f.bottom <= b.bottom]); })()",
    )?;
    let (height, content, focus_shown): (f64, f64, bool) = serde_json::from_str(&sandwich)?;
    ensure!(
        height <= 0.4 * f64::from(HEIGHT) + 1.0 && content > height && focus_shown,
        "the callers box is {height} px tall of {content} px, the function shown: {focus_shown}"
    );
    Ok(())
}
