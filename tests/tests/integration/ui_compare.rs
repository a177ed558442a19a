//! The UI's "what changed?" views in a real browser at 1280x800: the CPU timeline by label,
//! brushing it to narrow the flame graph, a baseline that makes the flame graph differential,
//! the sandwich view, and the page address holding all of it.
//!
//! Two copies of the call-tree workload, `phase_a` then `phase_b`, run one after the other
//! (a few windows apart), so the timeline has two processes side by side and the diff between
//! "only A ran" and "only B ran" is known. Screenshots go to `target/test-artifacts/ui-*.png`.

use std::{
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context, Result};
use headless_chrome::{
    protocol::cdp::{Input, Page::CaptureScreenshotFormatOption},
    Tab,
};
use scorch_tests::{build_workload, go_pprof, http_get, run_scorch, url_encode, work_dir, Daemon};

use crate::ui::{artifact_path, chromium, eval, wait_until, GRAPH, PROCESS_FRAMES};

const SELECT_PHASES: &str = r#"{comm=~"phase_.*"}"#;

/// Runs `program` with one thread for `seconds` and waits for it to exit.
fn run_phase(program: &PathBuf, seconds: u32) -> Result<()> {
    let status = Command::new(program)
        .args(["1", &seconds.to_string()])
        .status()
        .with_context(|| format!("running {}", program.display()))?;
    // It ends on SIGALRM, its own timer: an exit by signal is the normal end.
    ensure!(
        status.success() || status.code().is_none(),
        "{} failed: {status}",
        program.display()
    );
    Ok(())
}

/// Presses the left button at `x0`, drags to `x1` and releases, at height `y`: a brush.
fn drag(tab: &Tab, x0: f64, x1: f64, y: f64) -> Result<()> {
    let event = |kind, x: f64, buttons: Option<u32>| Input::DispatchMouseEvent {
        Type: kind,
        x,
        y,
        modifiers: None,
        timestamp: None,
        button: Some(Input::MouseButton::Left),
        buttons,
        click_count: Some(1),
        force: None,
        tangential_pressure: None,
        tilt_x: None,
        tilt_y: None,
        twist: None,
        delta_x: None,
        delta_y: None,
        pointer_Type: None,
    };
    use Input::DispatchMouseEventTypeOption::{MouseMoved, MousePressed, MouseReleased};
    tab.call_method(event(MouseMoved, x0, None))?;
    tab.call_method(event(MousePressed, x0, Some(1)))?;
    for i in 1..=5 {
        let x = x0 + (x1 - x0) * f64::from(i) / 5.0;
        tab.call_method(event(MouseMoved, x, Some(1)))?;
    }
    tab.call_method(event(MouseReleased, x1, Some(0)))?;
    Ok(())
}

/// The horizontal extent, in page pixels, of a series' bars on the timeline, and the
/// timeline's vertical middle: `(left, right, y)`.
fn bars_extent(tab: &Tab, series: &str) -> Result<(f64, f64, f64)> {
    let text = eval(
        tab,
        &format!(
            "(() => {{ const rs = [...document.querySelectorAll('#timeline g[data-series=\"{series}\"] rect')] \
               .map((r) => r.getBoundingClientRect()); \
             const t = document.getElementById('timeline').getBoundingClientRect(); \
             return Math.min(...rs.map((r) => r.left)) + ',' + Math.max(...rs.map((r) => r.right)) \
               + ',' + (t.top + t.height / 2); }})()"
        ),
    )?;
    let numbers: Vec<f64> = text.split(',').filter_map(|n| n.parse().ok()).collect();
    ensure!(
        numbers.len() == 3 && numbers.iter().all(|n| n.is_finite()),
        "no bars of {series}: {text}"
    );
    Ok((numbers[0], numbers[1], numbers[2]))
}

fn screenshot(tab: &Tab, name: &str) -> Result<()> {
    std::thread::sleep(Duration::from_millis(300));
    let png = tab.capture_screenshot(CaptureScreenshotFormatOption::Png, None, None, true)?;
    let path = artifact_path(name);
    std::fs::create_dir_all(path.parent().context("artifact directory")?)?;
    std::fs::write(&path, png).with_context(|| format!("writing {}", path.display()))?;
    println!("screenshot: {}", path.display());
    Ok(())
}

/// The fills of the leaf frames (`leaf_*`) drawn above the process frame `process` in the
/// flame graph: inferno's `rgb(r,g,b)` strings.
fn leaf_fills_under(process: &str) -> String {
    format!(
        "(() => {{ const d = {GRAPH}; const gs = [...d.querySelectorAll('#frames > g')]; \
           const name = (g) => g.querySelector('title').textContent.split(' (')[0]; \
           const box = (g) => {{ const r = g.querySelector('rect'); \
             return [parseFloat(r.getAttribute('x')), parseFloat(r.getAttribute('x')) + parseFloat(r.getAttribute('width'))]; }}; \
           const p = gs.find((g) => name(g) === '{process}'); if (!p) return '[]'; \
           const [a, b] = box(p); \
           return JSON.stringify(gs.filter((g) => name(g).startsWith('leaf_')) \
             .filter((g) => {{ const [x, y] = box(g); return x >= a - 1e-6 && y <= b + 1e-6; }}) \
             .map((g) => g.querySelector('rect').getAttribute('fill'))); }})()"
    )
}

/// `rgb(r,g,b)` -> (r, g, b).
fn rgb(fill: &str) -> Option<(u8, u8, u8)> {
    let inner = fill.strip_prefix("rgb(")?.strip_suffix(')')?;
    let mut parts = inner.split(',').map(|p| p.trim().parse::<u8>().ok());
    Some((parts.next()??, parts.next()??, parts.next()??))
}

#[test]
fn ui_timeline_brush_compare_sandwich_and_url_state() -> Result<()> {
    // Two copies of one program, so each has its own process name.
    let program = build_workload("calltree", &["-O2", "-fno-omit-frame-pointer", "-g"])?;
    let (phase_a, phase_b) = (work_dir().join("phase_a"), work_dir().join("phase_b"));
    std::fs::copy(&program, &phase_a)?;
    std::fs::copy(&program, &phase_b)?;
    let store = work_dir().join("ui-compare-store");
    let _ = std::fs::remove_dir_all(&store);
    let daemon = Daemon::start(&store, &["--window", "2s", "--frequency", "49"])?;

    // A, a gap of a few windows, then B; the gap keeps any one window from holding both.
    let unix_now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    };
    let started = unix_now() - 3;
    run_phase(&phase_a, 8)?;
    std::thread::sleep(Duration::from_secs(5));
    let middle = unix_now() - 2;
    run_phase(&phase_b, 8)?;
    let ended = unix_now() + 3;
    // Until B's last window is in the store.
    let path = format!(
        "/api/v1/timeline?from=now-5m&group_by=comm&match={}",
        url_encode(SELECT_PHASES)
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = http_get(&daemon.address, &path)?;
        let text = String::from_utf8_lossy(&body);
        ensure!(status == 200, "{path}: {status} {text}");
        let json: serde_json::Value = serde_json::from_str(&text)?;
        let names: Vec<&str> = json["series"]
            .as_array()
            .context("series")?
            .iter()
            .filter_map(|s| s["name"].as_str())
            .collect();
        if names.contains(&"phase_a") && names.contains(&"phase_b") {
            std::thread::sleep(Duration::from_secs(4));
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "no timeline of both phases: {text}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    let browser = chromium(1280, 800)?;
    let tab = browser.new_tab()?;
    let page = format!(
        "http://{}/?range=300&group_by=comm&match={}",
        daemon.address,
        url_encode(SELECT_PHASES)
    );
    tab.navigate_to(&page)?.wait_until_navigated()?;

    // The timeline: one series per process, A's bars all before B's.
    wait_until(
        &tab,
        "document.querySelectorAll('#timeline g[data-series=\"phase_a\"] rect').length > 0 && \
         document.querySelectorAll('#timeline g[data-series=\"phase_b\"] rect').length > 0",
        "the timeline to draw phase_a and phase_b",
    )?;
    let times = |series: &str| -> Result<Vec<f64>> {
        let text = eval(
            &tab,
            &format!(
                "JSON.stringify([...document.querySelectorAll('#timeline g[data-series=\"{series}\"] rect')] \
                   .map((r) => Number(r.dataset.t)))"
            ),
        )?;
        Ok(serde_json::from_str(&text)?)
    };
    let (a, b) = (times("phase_a")?, times("phase_b")?);
    let last_a = a.iter().copied().fold(f64::MIN, f64::max);
    let first_b = b.iter().copied().fold(f64::MAX, f64::min);
    ensure!(
        last_a < first_b,
        "phase_a's bars ({a:?}) do not all come before phase_b's ({b:?})"
    );
    let legend = eval(&tab, "document.getElementById('legend').textContent")?;
    ensure!(
        legend.contains("phase_a") && legend.contains("phase_b"),
        "legend: {legend}"
    );

    // Brushing A's bars narrows the flame graph to A.
    wait_until(
        &tab,
        &format!("!!{GRAPH} && !!{GRAPH}.getElementById('frames')"),
        "the first flame graph",
    )?;
    let (a_left, a_right, y) = bars_extent(&tab, "phase_a")?;
    drag(&tab, a_left - 2.0, a_right + 2.0, y)?;
    wait_until(
        &tab,
        &format!(
            "location.search.includes('sel_from=') && (() => {{ try {{ return {PROCESS_FRAMES} === '[\"phase_a\"]'; }} catch (e) {{ return false; }} }})()"
        ),
        "the flame graph to narrow to phase_a",
    )?;
    screenshot(&tab, "ui-timeline.png")?;

    // "Compare with…", then a brush over A: the baseline. Then a brush over B: the selection.
    tab.wait_for_element("#compare")?.click()?;
    drag(&tab, a_left - 2.0, a_right + 2.0, y)?;
    let (b_left, b_right, _) = bars_extent(&tab, "phase_b")?;
    drag(&tab, b_left - 2.0, b_right + 2.0, y)?;
    wait_until(
        &tab,
        &format!(
            "document.getElementById('status').textContent.startsWith('comparing') && \
             location.search.includes('base_from=') && !!{GRAPH} && \
             {GRAPH}.documentElement.textContent.includes('red grew, blue shrank')"
        ),
        "the differential flame graph",
    )?;
    wait_until(
        &tab,
        &format!(
            "{}.length > 2 && {}.length > 2",
            leaf_fills_under("phase_a"),
            leaf_fills_under("phase_b")
        ),
        "leaf frames under both processes in the differential flame graph",
    )?;
    let fills = |process: &str| -> Result<Vec<(u8, u8, u8)>> {
        let text = eval(&tab, &leaf_fills_under(process))?;
        let fills: Vec<String> = serde_json::from_str(&text)?;
        fills
            .iter()
            .map(|f| rgb(f).with_context(|| format!("fill {f:?}")))
            .collect()
    };
    let (shrank, grew) = (fills("phase_a")?, fills("phase_b")?);
    // A leaf with a sample or two changes by a share so small that inferno draws it neutral
    // (250,250,250): never the other colour, and the rest in this one.
    ensure!(
        shrank.iter().all(|&(r, _, b)| b >= r) && shrank.iter().any(|&(r, _, b)| b > r),
        "phase_a (only in the baseline) is not drawn shrinking (blue): {shrank:?}"
    );
    ensure!(
        grew.iter().all(|&(r, _, b)| r >= b) && grew.iter().any(|&(r, _, b)| r > b),
        "phase_b (only in the selection) is not drawn growing (red): {grew:?}"
    );
    let table = eval(&tab, "document.getElementById('top').textContent")?;
    ensure!(table.contains("pp"), "the diff table: {table}");
    screenshot(&tab, "ui-diff.png")?;

    // Sandwich of run_a: called by dispatch, calls leaf_a.
    tab.wait_for_element("button[aria-label='sandwich view of run_a']")?
        .click()?;
    wait_until(
        &tab,
        "!!document.querySelector('#callers div[data-name=\"dispatch\"]') && \
         !!document.querySelector('#callees div[data-name=\"leaf_a\"]') && \
         !document.querySelector('#callees div[data-name=\"leaf_b\"]')",
        "the sandwich view of run_a",
    )?;
    eval(
        &tab,
        "document.getElementById('sandwich').scrollIntoView(); 'ok'",
    )?;
    screenshot(&tab, "ui-sandwich.png")?;

    // The refresh interval, by keyboard: focus the select and choose the next option.
    tab.wait_for_element("#refresh")?.focus()?;
    tab.press_key("ArrowDown")?;
    wait_until(
        &tab,
        "location.search.includes('refresh=10')",
        "the refresh interval in the address",
    )?;

    // The address holds the whole view: a new tab opened on it shows the same.
    let url = tab.get_url();
    let state = "JSON.stringify([location.search, document.getElementById('group').value, \
                 document.getElementById('match').value, document.getElementById('refresh').value, \
                 document.getElementById('sel-from').value, document.getElementById('base-to').value, \
                 document.getElementById('sandwich-fn').textContent])";
    let before = eval(&tab, state)?;
    let second = browser.new_tab()?;
    second.navigate_to(&url)?.wait_until_navigated()?;
    wait_until(
        &second,
        &format!(
            "document.getElementById('status').textContent.startsWith('comparing') && !!{GRAPH} && \
             {GRAPH}.documentElement.textContent.includes('red grew, blue shrank') && \
             !!document.querySelector('#callees div[data-name=\"leaf_a\"]')"
        ),
        "the shared address to show the same comparison",
    )?;
    let after = eval(&second, state)?;
    ensure!(
        before == after,
        "state before {before}\nafter reload {after}"
    );
    drop(second);
    drop(tab);

    diff_pprof_is_go_tool_pprofs_diff_base(&daemon, started, middle, ended)
}

/// The API's and the CLI's diff in pprof read by `go tool pprof -top` as `-diff_base` reads the
/// two ranges' own profiles: the same table.
fn diff_pprof_is_go_tool_pprofs_diff_base(
    daemon: &Daemon,
    started: u64,
    middle: u64,
    ended: u64,
) -> Result<()> {
    let dir = work_dir().join("ui-compare-pprof");
    std::fs::create_dir_all(&dir)?;
    let selector = url_encode(SELECT_PHASES);
    let fetch = |path: String, name: &str| -> Result<PathBuf> {
        let (status, body) = http_get(&daemon.address, &path)?;
        ensure!(
            status == 200,
            "{path}: {status} {}",
            String::from_utf8_lossy(&body)
        );
        let file = dir.join(name);
        std::fs::write(&file, body)?;
        Ok(file)
    };
    let base = fetch(
        format!("/api/v1/profile?from={started}&to={middle}&match={selector}"),
        "base.pb.gz",
    )?;
    let target = fetch(
        format!("/api/v1/profile?from={middle}&to={ended}&match={selector}"),
        "target.pb.gz",
    )?;
    let diff = fetch(
        format!(
            "/api/v1/diff?base_from={started}&base_to={middle}&from={middle}&to={ended}\
             &match={selector}&format=pprof"
        ),
        "diff.pb.gz",
    )?;
    // The table from "Showing nodes" on: the header's time and duration lines differ.
    let table = |text: &str| -> String {
        text.lines()
            .skip_while(|l| !l.starts_with("Showing nodes"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let base_arg = format!("-diff_base={}", base.display());
    let expected = table(&go_pprof(&["-top", &base_arg], &target)?);
    let ours = table(&go_pprof(&["-top"], &diff)?);
    // Both phases run the same program, so the change per function is the difference of the
    // phases' sample counts: its sign depends on which got more CPU, and the totals may even
    // be equal, but some leaf changed (else both tables would agree trivially).
    let changed = expected.lines().any(|l| {
        l.contains("leaf_") && l.split_whitespace().next().is_some_and(|flat| flat != "0")
    });
    ensure!(
        changed,
        "go tool pprof -diff_base shows no leaf that changed:\n{expected}"
    );
    ensure!(
        ours == expected,
        "the diff profile reads\n{ours}\nwhere go tool pprof -diff_base reads\n{expected}"
    );

    // The CLI: the same profile, and a differential flame graph.
    let store = daemon.store.display().to_string();
    let (started, middle, ended) = (started.to_string(), middle.to_string(), ended.to_string());
    let cli = dir.join("cli-diff.pb.gz");
    let svg = dir.join("cli-diff.svg");
    for (output, format) in [(&cli, "pprof"), (&svg, "svg")] {
        run_scorch(&[
            "query",
            "--store",
            &store,
            "--from",
            &middle,
            "--to",
            &ended,
            "--base-from",
            &started,
            "--base-to",
            &middle,
            "--match",
            SELECT_PHASES,
            "--format",
            format,
            "-o",
            &output.display().to_string(),
        ])?;
    }
    let from_cli = table(&go_pprof(&["-top"], &cli)?);
    ensure!(
        from_cli == expected,
        "scorch query --base-from's profile reads\n{from_cli}\nwhere go tool pprof -diff_base reads\n{expected}"
    );
    let svg = std::fs::read_to_string(&svg)?;
    ensure!(
        svg.contains("red grew, blue shrank") && svg.contains("phase_a") && svg.contains("phase_b"),
        "scorch query --base-from --format svg drew no differential flame graph of both phases"
    );
    Ok(())
}
