//! The daemon's web UI in a real browser (Debian's chromium, headless, driven over the DevTools
//! protocol), and its profile URL read by `go tool pprof`: what a user on the host does.
//!
//! The UI test leaves a screenshot in `target/test-artifacts/ui.png`.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, ensure, Context, Result};
use headless_chrome::{
    browser::tab::{point::Point, ModifierKey},
    protocol::cdp::Page::CaptureScreenshotFormatOption,
    Browser, LaunchOptions, Tab,
};
use scorch_tests::{build_workload, go_pprof, http_get, url_encode, work_dir, Daemon, Workload};

/// Debian's chromium, which `cargo xtask setup` installs.
pub(crate) const CHROMIUM: &str = "/usr/bin/chromium";

/// Headless Chromium with a `width` x `height` window.
pub(crate) fn chromium(width: u32, height: u32) -> Result<Browser> {
    let options = LaunchOptions::default_builder()
        .path(Some(PathBuf::from(CHROMIUM)))
        // Chromium refuses to start its sandbox as root, which the integration tests run as.
        .sandbox(false)
        .window_size(Some((width, height)))
        .idle_browser_timeout(Duration::from_secs(120))
        .build()
        .map_err(|e| anyhow!("chromium launch options: {e}"))?;
    Browser::new(options)
        .with_context(|| format!("starting {CHROMIUM} (cargo xtask setup installs chromium)"))
}

/// The workload's process name, and so the selector that picks it.
const COMM: &str = "calltree";
const SELECT_WORKLOAD: &str = r#"{comm="calltree"}"#;

/// Starts the call-tree workload and a daemon with 2 s windows, and waits until the store
/// holds the workload's samples (two windows at least).
fn daemon_with_workload(name: &str) -> Result<(Workload, Daemon)> {
    let program = build_workload(COMM, &["-O2", "-fno-omit-frame-pointer", "-g"])?;
    let workload = Workload::start(&program, &["2", "120"])?;
    let store = work_dir().join(name);
    let _ = std::fs::remove_dir_all(&store);
    let daemon = Daemon::start(&store, &["--window", "2s", "--frequency", "49"])?;
    let path = format!(
        "/api/v1/profile?format=folded&match={}",
        url_encode(SELECT_WORKLOAD)
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = http_get(&daemon.address, &path)?;
        let folded = String::from_utf8_lossy(&body);
        ensure!(status == 200, "{path} answered {status}: {folded}");
        // Two windows' worth: both leaves the tests look for are there by then.
        if folded.contains("leaf_a") && folded.contains("leaf_b") && folded.contains("leaf_c") {
            return Ok((workload, daemon));
        }
        ensure!(
            Instant::now() < deadline,
            "the workload's functions were not in the store after 30 s:\n{folded}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn go_tool_pprof_reads_the_profile_url() -> Result<()> {
    let (_workload, daemon) = daemon_with_workload("pprof-url-store")?;
    let url = format!(
        "http://{}/api/v1/profile?from=now-5m&match={}",
        daemon.address,
        url_encode(SELECT_WORKLOAD)
    );
    let top = go_pprof(&["-top"], Path::new(&url))?;
    for leaf in ["leaf_a", "leaf_b", "leaf_c", "dispatch"] {
        ensure!(
            top.contains(leaf),
            "go tool pprof -top {url} lacks {leaf}:\n{top}"
        );
    }
    // The same table from the API's own text form.
    let (status, body) = http_get(
        &daemon.address,
        &format!(
            "/api/v1/profile?format=top&match={}",
            url_encode(SELECT_WORKLOAD)
        ),
    )?;
    let text = String::from_utf8_lossy(&body);
    ensure!(status == 200 && text.contains("leaf_a"), "{status}: {text}");
    Ok(())
}

/// Evaluates `expression` in the page and returns its value as text (strings as they are,
/// anything else as JSON).
pub(crate) fn eval(tab: &Tab, expression: &str) -> Result<String> {
    let result = tab
        .evaluate(expression, false)
        .with_context(|| format!("evaluating {expression}"))?;
    match result.value {
        Some(serde_value) => Ok(match serde_value.as_str() {
            Some(text) => text.to_owned(),
            None => serde_value.to_string(),
        }),
        None => bail!(
            "{expression} gave no value: {}",
            result.description.unwrap_or_default()
        ),
    }
}

/// Polls `expression` until it is true; fails with `what` and the status line.
pub(crate) fn wait_until(tab: &Tab, expression: &str, what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if eval(tab, expression)? == "true" {
            return Ok(());
        }
        if Instant::now() > deadline {
            let status = eval(tab, "document.getElementById('status').textContent")?;
            bail!("timed out waiting for {what}; status line: {status:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The flame graph's document, inside the page's iframe.
pub(crate) const GRAPH: &str = "document.getElementById('flame').contentDocument";

/// True once the flame graph is drawn and holds `name` (inferno's script has run: it fills
/// the `details` line's text node at load).
fn graph_shows(name: &str) -> String {
    format!(
        "(() => {{ const d = {GRAPH}; const f = d && d.getElementById('frames'); \
         return !!f && !!d.getElementById('details') && \
         [...f.querySelectorAll('title')].some(t => t.textContent.startsWith('{name} ')); }})()"
    )
}

/// The names of the frames one level from the root (`all`): the process names. Levels are
/// told apart by their distance from the root's row, so either orientation reads the same.
pub(crate) const PROCESS_FRAMES: &str =
    "(() => { const d = document.getElementById('flame').contentDocument; \
     const gs = [...d.querySelectorAll('#frames > g')]; \
     const y = (g) => parseFloat(g.querySelector('rect').getAttribute('y')); \
     const root = y(gs.find((g) => g.querySelector('title').textContent.startsWith('all '))); \
     const levels = [...new Set(gs.map(y))].sort((a, b) => Math.abs(a - root) - Math.abs(b - root)); \
     return JSON.stringify(gs.filter((g) => y(g) === levels[1]) \
       .map((g) => g.querySelector('title').textContent.split(' (')[0]).sort()); })()";

/// Samples the status line reports (`N samples, ...`).
fn status_samples(tab: &Tab) -> Result<u64> {
    let status = eval(tab, "document.getElementById('status').textContent")?;
    status
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no sample count in the status line {status:?}"))
}

/// Replaces the selector box's text by typing, as a user would, and submits with Enter.
fn type_selector(tab: &Tab, selector: &str) -> Result<()> {
    let input = tab.wait_for_element("#match")?;
    input.click()?;
    tab.press_key_with_modifiers("a", Some(&[ModifierKey::Ctrl]))?;
    tab.press_key("Backspace")?;
    input.type_into(selector)?;
    ensure!(
        eval(tab, "document.getElementById('match').value")? == selector,
        "typing into the selector box left {:?}",
        eval(tab, "document.getElementById('match').value")?
    );
    tab.press_key("Enter")?;
    Ok(())
}

pub(crate) fn artifact_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/test-artifacts")
        .join(name)
}

#[test]
fn ui_shows_zooms_searches_and_filters_the_flame_graph() -> Result<()> {
    let (_workload, daemon) = daemon_with_workload("ui-store")?;

    let browser = chromium(1400, 1100)?;
    let tab = browser.new_tab()?;
    tab.navigate_to(&format!("http://{}/", daemon.address))?
        .wait_until_navigated()?;

    // The page loads the last 15 minutes of every process, and the workload's functions are
    // in both the flame graph and the table.
    wait_until(
        &tab,
        &graph_shows("leaf_a"),
        "the flame graph to show leaf_a",
    )?;
    wait_until(
        &tab,
        "[...document.querySelectorAll('#top td.fn')].some(td => td.textContent === 'leaf_a')",
        "the top table to list leaf_a",
    )?;
    let processes = eval(&tab, PROCESS_FRAMES)?;
    ensure!(
        processes.contains(&format!("\"{COMM}\"")),
        "the flame graph's process frames {processes} lack {COMM}"
    );
    // Other processes (the daemon itself at least) are drawn beside it until a selector
    // narrows the view.
    println!("processes drawn without a selector: {processes}");

    // Search: a click on the table's leaf_b row highlights leaf_b through inferno's search,
    // which reports the share it matched.
    let row =
        tab.find_element_by_xpath("//table[@id='top']//tr[td[@class='fn' and text()='leaf_b']]")?;
    row.click()?;
    wait_until(
        &tab,
        "(() => { const f = document.getElementById('flame'); const d = f.contentDocument; \
         const fill = (name) => [...d.querySelectorAll('#frames > g')] \
           .filter(g => g.querySelector('title').textContent.startsWith(name + ' ')) \
           .map(g => g.querySelector('rect').getAttribute('fill')); \
         const color = f.contentWindow.searchcolor; \
         return d.getElementById('matched').textContent.startsWith('Matched: ') \
           && fill('leaf_b').length > 0 && fill('leaf_b').every(c => c === color) \
           && !fill('leaf_a').includes(color); })()",
        "inferno's search to highlight leaf_b, and only leaf_b",
    )?;

    // Zoom: a real mouse click on the run_b frame, inside the iframe.
    let point = eval(
        &tab,
        "(() => { const f = document.getElementById('flame'); const d = f.contentDocument; \
         const g = [...d.querySelectorAll('#frames > g')] \
           .find(g => g.querySelector('title').textContent.startsWith('run_b ')); \
         const rect = g.querySelector('rect'); rect.scrollIntoView({block: 'center'}); \
         const r = rect.getBoundingClientRect(), o = f.getBoundingClientRect(); \
         return (o.left + f.clientLeft + r.left + r.width / 2) + ',' + \
                (o.top + f.clientTop + r.top + r.height / 2); })()",
    )?;
    let (x, y) = point
        .split_once(',')
        .and_then(|(x, y)| Some((x.parse().ok()?, y.parse().ok()?)))
        .with_context(|| format!("bad frame position {point:?}"))?;
    tab.click_point(Point { x, y })?;
    // Zoomed: run_b spans the whole width, leaf_a (not under it) is hidden, and inferno shows
    // its "Reset Zoom" button.
    wait_until(
        &tab,
        &format!(
            "(() => {{ const d = {GRAPH}; \
             const frame = (name) => [...d.querySelectorAll('#frames > g')] \
               .find(g => g.querySelector('title').textContent.startsWith(name + ' ')); \
             return parseFloat(frame('run_b').querySelector('rect').getAttribute('width')) > 99 \
               && frame('leaf_a').classList.contains('hide') \
               && !d.getElementById('unzoom').classList.contains('hide'); }})()"
        ),
        "the flame graph to zoom into run_b",
    )?;

    // A selector that matches nothing: no samples, no workload frames.
    type_selector(&tab, r#"{comm="no-such-process"}"#)?;
    wait_until(
        &tab,
        &format!(
            "document.getElementById('status').textContent.startsWith('0 samples') && \
             !!{GRAPH} && {GRAPH}.documentElement.textContent.includes('No samples')"
        ),
        "an empty flame graph for a selector matching nothing",
    )?;
    ensure!(eval(&tab, &graph_shows("leaf_a"))? == "false");

    // The workload's selector: its frames come back, and it is the only process drawn.
    type_selector(&tab, SELECT_WORKLOAD)?;
    wait_until(&tab, &graph_shows("leaf_a"), "the workload's flame graph")?;
    let processes = eval(&tab, PROCESS_FRAMES)?;
    ensure!(
        processes == format!("[\"{COMM}\"]"),
        "with {SELECT_WORKLOAD}, the flame graph shows processes {processes}"
    );
    ensure!(
        status_samples(&tab)? > 0,
        "the workload's view reports no samples"
    );
    // The page's address keeps the selector, so a reload shows the same view.
    let url = tab.get_url();
    ensure!(
        url.contains("match="),
        "the page address {url} lost the selector"
    );

    std::thread::sleep(Duration::from_millis(300));
    let png = tab.capture_screenshot(CaptureScreenshotFormatOption::Png, None, None, true)?;
    let path = artifact_path("ui.png");
    std::fs::create_dir_all(path.parent().context("artifact directory")?)?;
    std::fs::write(&path, png).with_context(|| format!("writing {}", path.display()))?;
    println!("screenshot: {}", path.display());
    Ok(())
}
