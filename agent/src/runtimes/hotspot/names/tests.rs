//! HotSpot's namer over synthetic JVM memory (the graphs of `tests_names`, under the fuzz
//! target's JDK 17-like layout), and over the host's real JDK 17.

use std::{
    any::Any,
    sync::Arc,
    time::{Duration, Instant},
};

use scorch_common::{hotspot_frame_words, word_payload, HotspotSubtype};

use super::super::tests::names::{demo, nmethod, COMPILE_ID, CONST_METHOD, METHOD, NMETHOD};
use super::*;
use crate::runtimes::Names;
use crate::runtimes::{hotspot::Layout, memory::Regions};

const PID: u32 = 4_500_000;
/// A stub's `CodeBlob` (its `_name` at 0x08) and its name.
const BLOB: u64 = 0x3000_0000;
const BLOB_NAME: u64 = 0x3100_0000;

fn layout() -> Arc<Layout> {
    Arc::new(super::super::fuzz_layout(0))
}

/// The frame `subtype` of `pointer` as the drain hands it on: (word, continuation's payload).
fn frame(subtype: HotspotSubtype, pointer: u64, detail: u32, cookie: u32) -> (u64, u64) {
    let [word, more] = hotspot_frame_words(subtype, pointer, detail, cookie);
    (word, word_payload(more))
}

fn interpreted(bci: u32) -> (u64, u64) {
    frame(
        HotspotSubtype::Interpreted,
        METHOD,
        bci,
        (CONST_METHOD >> 3) as u32,
    )
}

/// The first four bytes of `name`, as the walk reads them.
fn cookie_of(name: &[u8]) -> u32 {
    let mut first = [0u8; 4];
    first.copy_from_slice(&name[..4]);
    u32::from_le_bytes(first)
}

/// `demo()`'s method and nmethod, and a stub named `name` (NUL-terminated, then zeros to the
/// page's end, as a real name's page reads).
fn memory_with_stub(name: &[u8]) -> Regions {
    let mut memory = demo();
    nmethod(&mut memory);
    let mut blob = vec![0u8; 0x70];
    blob[0x08..0x10].copy_from_slice(&BLOB_NAME.to_le_bytes());
    memory.add(BLOB, blob);
    let mut text = name.to_vec();
    text.resize(4096, 0);
    memory.add(BLOB_NAME, text);
    memory
}

fn names_over(memory: Regions) -> HotspotNames {
    let mut names = HotspotNames::reading(Arc::new(memory));
    let process: Arc<dyn Any + Send + Sync> = Arc::new(Process {
        layout: layout(),
        collected_heap: 0,
    });
    names.attach(PID, Some(process));
    names
}

fn lines_of(names: &mut HotspotNames, (word, more): (u64, u64)) -> Vec<Line> {
    names.lines(PID, word, more)
}

fn work(line: u32) -> Line {
    Line {
        function: "demo.Demo.work".into(),
        system_name: "demo.Demo.work(Ljava/lang/String;I)V".into(),
        file: Some("Demo.java".into()),
        line,
        column: 0,
    }
}

fn unknown() -> Vec<Line> {
    vec![Line::named(UNKNOWN_FRAME)]
}

#[test]
fn an_interpreted_frame_is_its_method_at_its_bci_when_its_cookie_matches() {
    let mut names = names_over(memory_with_stub(b"Interpreter\0"));
    assert_eq!(lines_of(&mut names, interpreted(4)), [work(11)]);
    assert_eq!(lines_of(&mut names, interpreted(15)), [work(40)]);
    // An unknown bci: the method, no line.
    assert_eq!(lines_of(&mut names, interpreted(UNKNOWN_BCI)), [work(0)]);
    // Another ConstMethod than the walk saw: the Method was freed and its memory reused.
    let stale = frame(
        HotspotSubtype::Interpreted,
        METHOD,
        4,
        (CONST_METHOD >> 3) as u32 + 1,
    );
    assert_eq!(lines_of(&mut names, stale), unknown());
    assert_eq!(names.counts(), (3, 1));
}

#[test]
fn a_compiled_frame_is_one_location_of_its_inlined_methods() {
    let mut names = names_over(memory_with_stub(b"Interpreter\0"));
    let compiled = |pc| frame(HotspotSubtype::Compiled, NMETHOD, pc, COMPILE_ID);
    // Innermost first: the method at bci 9 inlined into itself at bci 4.
    assert_eq!(lines_of(&mut names, compiled(0x40)), [work(13), work(11)]);
    assert_eq!(lines_of(&mut names, compiled(0x10)), [work(11)]);
    // Another compile id: the nmethod was flushed and its memory reused.
    let evicted = frame(HotspotSubtype::Compiled, NMETHOD, 0x40, COMPILE_ID + 1);
    assert_eq!(lines_of(&mut names, evicted), unknown());
    assert_eq!(names.counts(), (2, 1));
}

#[test]
fn a_window_s_names_are_measured_when_it_ends_and_then_dropped() {
    let mut names = names_over(memory_with_stub(b"Interpreter\0"));
    let compiled = |pc| frame(HotspotSubtype::Compiled, NMETHOD, pc, COMPILE_ID);
    let lines = lines_of(&mut names, compiled(0x40));
    names.end_window(&|_| true);
    let text: usize = lines
        .iter()
        .map(|l| l.function.len() + l.system_name.len() + l.file.as_ref().map_or(0, String::len))
        .sum();
    let held = names.window_bytes();
    assert!(
        held >= text + 2 * size_of::<Line>(),
        "{held} bytes for {text} of text"
    );
    assert_eq!(names.cached(), 0);
    names.end_window(&|_| true);
    assert_eq!(names.window_bytes(), 0);
}

#[test]
fn a_stub_is_its_blobs_name_when_its_first_bytes_match() {
    let name = b"StubRoutines (1)\0";
    let mut names = names_over(memory_with_stub(name));
    let stub = Line::named("StubRoutines (1)");
    for subtype in [HotspotSubtype::Stub, HotspotSubtype::Vtable] {
        let frame = frame(subtype, BLOB, 0x20, cookie_of(name));
        assert_eq!(lines_of(&mut names, frame), std::slice::from_ref(&stub));
    }
    let renamed = frame(HotspotSubtype::Stub, BLOB, 0x20, cookie_of(b"nmethod"));
    assert_eq!(lines_of(&mut names, renamed), unknown());

    // A name shorter than the cookie: its terminator and what follows it, as they lie.
    let mut names = names_over(memory_with_stub(b"ab\0"));
    let short = frame(HotspotSubtype::Stub, BLOB, 0, cookie_of(b"ab\0\0"));
    assert_eq!(lines_of(&mut names, short)[0].function, "ab");
    // A name without its end within the bound.
    let long = vec![b'x'; MAX_BLOB_NAME + 10];
    let mut names = names_over(memory_with_stub(&long));
    let endless = frame(HotspotSubtype::Stub, BLOB, 0, cookie_of(&long));
    assert_eq!(lines_of(&mut names, endless), unknown());
}

#[test]
fn frames_nothing_can_name_are_unknown() {
    let mut names = names_over(memory_with_stub(b"Interpreter\0"));
    // The walk kept no pointer (one at or above 2^48).
    let none = frame(HotspotSubtype::Compiled, 1 << 48, 0, COMPILE_ID);
    assert_eq!(lines_of(&mut names, none), unknown());
    // Unmapped pointers, of each subtype.
    for subtype in [
        HotspotSubtype::Interpreted,
        HotspotSubtype::Compiled,
        HotspotSubtype::Stub,
        HotspotSubtype::Vtable,
    ] {
        assert_eq!(
            lines_of(&mut names, frame(subtype, 0xdead_0000, 0, 0)),
            unknown()
        );
    }
    // A frame cut before its continuation: no cookie matches.
    let [word, _] = hotspot_frame_words(HotspotSubtype::Compiled, NMETHOD, 0x40, COMPILE_ID);
    assert_eq!(names.lines(PID, word, 0), unknown());
    // A process the namer was not told of, or given what is no JVM's.
    let (word, more) = interpreted(4);
    assert_eq!(names.lines(PID + 1, word, more), unknown());
    names.attach(PID + 2, Some(Arc::new(7u64)));
    assert_eq!(names.lines(PID + 2, word, more), unknown());
    assert_eq!(names.counts(), (0, 8));
}

#[test]
fn names_are_cut_to_their_bound() {
    let long = "a".repeat(MAX_NAME + 100);
    let line = java_line(JavaFrame {
        class: long.clone(),
        method: "work".into(),
        signature: "()V".into(),
        file: Some(long),
        line: Some(3),
    });
    assert_eq!(line.function.len(), MAX_NAME);
    assert_eq!(line.system_name.len(), MAX_NAME);
    assert_eq!(line.file.as_ref().map(String::len), Some(MAX_NAME));
    assert_eq!(line.line, 3);
    // On a character's boundary.
    let even = bounded("é".repeat(MAX_NAME));
    assert_eq!(even.len(), MAX_NAME);
    let odd = bounded(format!("a{}", "é".repeat(MAX_NAME)));
    assert_eq!(odd.len(), MAX_NAME - 1);
    assert_eq!(bounded("short".into()), "short");
}

#[test]
fn a_frame_captured_while_its_process_runs_is_named_after_it_exits() {
    let mut names = names_over(memory_with_stub(b"Interpreter\0"));
    let (word, more) = interpreted(4);
    names.capture(PID, word, more);
    assert_eq!(names.cached(), 1);
    // The process exits before the window ends: named from the capture.
    names.attach(PID, None);
    assert_eq!(names.lines(PID, word, more), [work(11)]);
    // The window ends: the capture goes with the process.
    names.end_window(&|_| false);
    assert_eq!(names.cached(), 0);
    assert_eq!(names.lines(PID, word, more), unknown());
    // A process not attached is not captured.
    names.capture(PID, word, more);
    assert_eq!(names.cached(), 0);
}

#[test]
fn the_cache_is_bounded_and_frames_past_it_are_named_when_asked() {
    let mut names = names_over(memory_with_stub(b"Interpreter\0"));
    let started = Instant::now();
    for pointer in 0..MAX_CACHED as u64 + 10 {
        let (word, more) = frame(HotspotSubtype::Compiled, 0x10_0000 + 8 * pointer, 0, 1);
        names.capture(PID, word, more);
    }
    assert_eq!(names.cached(), MAX_CACHED);
    assert!(started.elapsed() < Duration::from_secs(20));
    let (word, more) = interpreted(4);
    names.capture(PID, word, more);
    assert_eq!(names.cached(), MAX_CACHED);
    assert_eq!(names.lines(PID, word, more), [work(11)]);
    assert_eq!(names.cached(), MAX_CACHED);
    // A new window starts empty.
    names.end_window(&|pid| pid == PID);
    names.capture(PID, word, more);
    assert_eq!(names.cached(), 1);
}

/// The host's JDK 17 running `Hot.java`: `Hot.spin`'s `Method*` as an interpreted frame, its
/// nmethods as compiled frames and a stub of the code heaps, each as the two words the walk
/// writes, named by the namer reading the JVM's memory; wrong cookies give the unknown frame;
/// and what was captured is named after the JVM exits.
#[test]
fn the_hosts_jdk_17_frames_are_named_from_their_words() {
    use super::super::tests::names::{blobs, HOT};
    use super::super::tests::{attach, Jdk};
    use crate::runtimes::memory::{read_i32, read_u64};

    let home = std::path::Path::new("/usr/lib/jvm/java-17-openjdk-amd64");
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("Hot.java");
    std::fs::write(&source, HOT).unwrap();
    let jdk = Jdk(std::process::Command::new(home.join("bin/java"))
        .arg(&source)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("running the host's JDK 17 (openjdk-17-jdk-headless)"));
    let pid = jdk.0.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (memory, _, layout, cache) = attach(pid, deadline);

    // Until spin is compiled (C1 at once, once the launcher has compiled Hot.java).
    let (spin, stub) = loop {
        assert!(Instant::now() < deadline, "Hot.spin never compiled");
        std::thread::sleep(Duration::from_millis(300));
        let found = blobs(&memory, &layout, &cache);
        let spin: Vec<(u64, u64)> = found
            .iter()
            .filter(|(_, name)| name == "nmethod")
            .filter_map(|&(blob, _)| {
                let method = read_u64(&memory, blob + layout.nmethod.method)?;
                let named = super::super::name_method(&memory, &layout, method, 0).ok()?;
                (named.display() == "Hot.spin").then_some((blob, method))
            })
            .collect();
        let stub = found
            .iter()
            .find(|(_, name)| name.starts_with("StubRoutines") || name == "Interpreter")
            .cloned();
        if let (Some(&first), Some(stub)) = (spin.first(), stub) {
            break (first, stub);
        }
    };
    let (nmethod, method) = spin;
    let mut names = HotspotNames::default();
    let process: Arc<dyn Any + Send + Sync> = Arc::new(Process {
        layout: Arc::new(layout.clone()),
        collected_heap: 0,
    });
    names.attach(pid, Some(process));
    let named = |names: &mut HotspotNames, (word, more): (u64, u64)| names.lines(pid, word, more);

    // Interpreted, at bci 0: spin's first statement.
    let const_method = read_u64(&memory, method + layout.method_const_method).unwrap();
    let cookie = (const_method >> 3) as u32;
    let at_entry = frame(HotspotSubtype::Interpreted, method, 0, cookie);
    let spin_line = |line| Line {
        function: "Hot.spin".into(),
        system_name: "Hot.spin(J)J".into(),
        file: Some("Hot.java".into()),
        line,
        column: 0,
    };
    assert_eq!(named(&mut names, at_entry), [spin_line(3)]);
    let no_bci = frame(HotspotSubtype::Interpreted, method, UNKNOWN_BCI, cookie);
    assert_eq!(named(&mut names, no_bci), [spin_line(0)]);
    let stale = frame(HotspotSubtype::Interpreted, method, 0, cookie ^ 1);
    assert_eq!(named(&mut names, stale), unknown());

    // Compiled, in the middle of its code: spin (perhaps with what it inlined) at a line of
    // its loop.
    let super::super::layout::Place::Pointer(begin_at) = layout.code_blob.code_begin else {
        panic!("JDK 17 keeps code pointers");
    };
    let super::super::layout::Place::Pointer(end_at) = layout.code_blob.code_end else {
        panic!("JDK 17 keeps code pointers");
    };
    let begin = read_u64(&memory, nmethod + begin_at).unwrap();
    let end = read_u64(&memory, nmethod + end_at).unwrap();
    let compile_id = read_i32(&memory, nmethod + layout.nmethod.compile_id).unwrap() as u32;
    let middle = ((end - begin) / 2) as u32;
    let compiled = frame(HotspotSubtype::Compiled, nmethod, middle, compile_id);
    let lines = named(&mut names, compiled);
    eprintln!("Hot.spin compiled at +{middle:#x}: {lines:?}");
    let outer = lines.last().unwrap();
    assert_eq!(
        (outer.function.as_str(), outer.system_name.as_str()),
        ("Hot.spin", "Hot.spin(J)J")
    );
    assert_eq!(outer.file.as_deref(), Some("Hot.java"));
    assert!((3..=7).contains(&outer.line), "{lines:?}");
    let evicted = frame(
        HotspotSubtype::Compiled,
        nmethod,
        middle,
        compile_id.wrapping_add(1_000_000),
    );
    assert_eq!(named(&mut names, evicted), unknown());

    // A stub, by its blob's name.
    let (blob, stub_name) = stub;
    let name_at = read_u64(&memory, blob + layout.code_blob.name).unwrap();
    let mut first = [0u8; 4];
    assert!(memory.read(name_at, &mut first));
    let stub_frame = frame(HotspotSubtype::Stub, blob, 0, u32::from_le_bytes(first));
    let lines = named(&mut names, stub_frame);
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0].function, stub_name);
    let renamed = frame(HotspotSubtype::Stub, blob, 0, !u32::from_le_bytes(first));
    assert_eq!(named(&mut names, renamed), unknown());
    assert_eq!(names.counts(), (4, 3));

    // Captured while the JVM runs, named after it exits.
    names.end_window(&|_| true);
    for (word, more) in [at_entry, compiled] {
        names.capture(pid, word, more);
    }
    drop(jdk);
    names.attach(pid, None);
    assert_eq!(named(&mut names, at_entry), [spin_line(3)]);
    assert_eq!(named(&mut names, compiled).last(), Some(outer));
}
