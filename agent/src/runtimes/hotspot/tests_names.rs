//! The naming readers (`unsigned5`, `method`, `nmethod`) over synthetic JVM memory (well-formed
//! and hostile), and over the host's real JDK 17 running a known hot method.

use std::time::{Duration, Instant};

use super::super::method::{
    demangle_signature, line_of, name_method, JavaFrame, LineError, MethodError,
};
use super::super::nmethod::{name_compiled, scopes, DebugInfo, NmethodError, MAX_SCOPES};
use super::super::unsigned5::{Reader, Unsigned5Error};
use super::super::vmstructs::read_c_string;
use super::super::Layout;
use super::{attach, jdk17, Jdk};
use crate::runtimes::memory::{read_i32, read_u64, read_u8, Memory, Regions};

/// UNSIGNED5 as HotSpot's `UNSIGNED5::write_uint` defines it, for `excluded` byte values:
/// None where the value needs more than five bytes.
fn encode(value: u32, excluded: u8) -> Option<Vec<u8>> {
    const H: u64 = 64;
    let x = u64::from(excluded);
    let l = 256 - H - x;
    let mut sum = u64::from(value);
    let mut out = Vec::new();
    for i in 0..5 {
        if sum < l || i == 4 {
            let byte = u8::try_from(x + sum).ok()?;
            out.push(byte);
            return Some(out);
        }
        sum -= l;
        out.push((x + l + sum % H) as u8);
        sum /= H;
    }
    None
}

fn encode_signed(value: i32, excluded: u8) -> Vec<u8> {
    let zigzag = ((value << 1) ^ (value >> 31)) as u32;
    encode(zigzag, excluded).unwrap()
}

#[test]
fn unsigned5_round_trips_for_both_exclusions() {
    let values = [
        0,
        1,
        190,
        191,
        192,
        255,
        256,
        4_000,
        12_479,
        12_480,
        65_535,
        1 << 20,
        u32::MAX / 3,
        u32::MAX - 1,
        u32::MAX,
    ];
    for excluded in [0u8, 1] {
        let mut stream = Vec::new();
        let mut encoded = Vec::new();
        for &value in &values {
            if let Some(bytes) = encode(value, excluded) {
                assert!(bytes.len() <= 5);
                // The excluded byte values never appear.
                assert!(bytes.iter().all(|&b| b >= excluded), "{value} {bytes:?}");
                stream.extend_from_slice(&bytes);
                encoded.push(value);
            }
        }
        assert!(encoded.len() >= values.len() - 2, "{excluded}: {encoded:?}");
        let mut reader = Reader::new(&stream, excluded);
        for &value in &encoded {
            assert_eq!(reader.uint(), Ok(value), "excluded {excluded}");
        }
        assert_eq!(reader.position(), stream.len());
        assert_eq!(
            reader.uint(),
            Err(Unsigned5Error::Truncated { at: stream.len() })
        );
        for value in [0, -1, 1, -70_000, 70_000, i32::MAX, i32::MIN + 1] {
            let bytes = encode_signed(value, excluded);
            assert_eq!(Reader::new(&bytes, excluded).signed(), Ok(value));
        }
    }
    // The two encodings differ: 191 is one byte without exclusion, two with.
    assert_eq!(encode(191, 0).unwrap().len(), 1);
    assert_eq!(encode(191, 1).unwrap().len(), 2);
}

#[test]
fn unsigned5_refuses_truncated_and_excluded_bytes() {
    // A continuation with nothing after it.
    assert_eq!(
        Reader::new(&[0xc0], 0).uint(),
        Err(Unsigned5Error::Truncated { at: 1 })
    );
    assert_eq!(
        Reader::new(&[], 1).uint(),
        Err(Unsigned5Error::Truncated { at: 0 })
    );
    // Zero is excluded from JDK 20's encoding.
    assert_eq!(
        Reader::new(&[0xd0, 0x00], 1).uint(),
        Err(Unsigned5Error::Excluded { byte: 0, at: 1 })
    );
    // Continuations forever: five bytes read, no more.
    let mut reader = Reader::new(&[0xff; 16], 0);
    reader.uint().unwrap();
    assert_eq!(reader.position(), 5);
}

// A synthetic method graph, under `jdk17()`'s offsets: Method._constMethod 0x08;
// ConstMethod (0x38 bytes) _constants 0x08, _code_size 0x28, _flags 0x2c, _name_index 0x30,
// _signature_index 0x32; ConstantPool (0x50) _pool_holder 0x20, _source_file_name_index 0x40;
// Klass._name 0x10; Symbol (0x10) _length 0x04, _body 0x06.
pub(in crate::runtimes::hotspot) const METHOD: u64 = 0x1000_0000;
pub(in crate::runtimes::hotspot) const CONST_METHOD: u64 = 0x1100_0000;
const POOL: u64 = 0x1200_0000;
const KLASS: u64 = 0x1300_0000;
const SYMBOLS: u64 = 0x1400_0000;
const CODE_SIZE: u16 = 20;
/// The synthetic method's (bci, line) entries, in stream order.
const LINES: [(u32, u32); 4] = [(0, 10), (4, 11), (9, 13), (15, 40)];

fn layout() -> Layout {
    jdk17().read().unwrap()
}

fn put(bytes: &mut [u8], at: usize, value: &[u8]) {
    bytes[at..at + value.len()].copy_from_slice(value);
}

fn symbol_bytes(text: &str, length: u16) -> Vec<u8> {
    let mut bytes = vec![0u8; 0x10.max(6 + text.len())];
    put(&mut bytes, 4, &length.to_le_bytes());
    put(&mut bytes, 6, text.as_bytes());
    bytes
}

/// The compressed line stream of `entries`, as HotSpot's `CompressedLineNumberWriteStream`
/// writes it.
fn line_stream(entries: &[(u32, u32)], excluded: u8) -> Vec<u8> {
    let mut out = Vec::new();
    let (mut bci, mut line) = (0i32, 0i32);
    for &(b, l) in entries {
        let (db, dl) = (b as i32 - bci, l as i32 - line);
        if (0..32).contains(&db) && (0..8).contains(&dl) && (db << 3 | dl) != 0xff {
            out.push((db << 3 | dl) as u8);
        } else {
            out.push(0xff);
            out.extend(encode_signed(db, excluded));
            out.extend(encode_signed(dl, excluded));
        }
        (bci, line) = (b as i32, l as i32);
    }
    out.push(0);
    out
}

/// `Demo.work(Ljava/lang/String;I)V` in `demo/Demo.java`, with [`LINES`].
fn method_graph(class_symbol: Vec<u8>, after_code: Vec<u8>) -> Regions {
    let mut memory = Regions::new();
    let mut method = vec![0u8; 0x58];
    put(&mut method, 0x08, &CONST_METHOD.to_le_bytes());
    memory.add(METHOD, method);

    let mut cm = vec![0u8; 0x38 + usize::from(CODE_SIZE)];
    put(&mut cm, 0x08, &POOL.to_le_bytes());
    put(&mut cm, 0x28, &CODE_SIZE.to_le_bytes());
    put(&mut cm, 0x2c, &1u16.to_le_bytes());
    put(&mut cm, 0x30, &1u16.to_le_bytes());
    put(&mut cm, 0x32, &2u16.to_le_bytes());
    cm.extend(after_code);
    memory.add(CONST_METHOD, cm);

    let mut pool = vec![0u8; 0x50 + 8 * 4];
    put(&mut pool, 0x20, &KLASS.to_le_bytes());
    put(&mut pool, 0x40, &3u16.to_le_bytes());
    // The method name's entry carries the low tag bit older JDKs set.
    put(&mut pool, 0x58, &(SYMBOLS + 0x100 + 1).to_le_bytes());
    put(&mut pool, 0x60, &(SYMBOLS + 0x200).to_le_bytes());
    put(&mut pool, 0x68, &(SYMBOLS + 0x300).to_le_bytes());
    memory.add(POOL, pool);

    let mut klass = vec![0u8; 0x200];
    put(&mut klass, 0x10, &SYMBOLS.to_le_bytes());
    memory.add(KLASS, klass);
    memory.add(SYMBOLS, class_symbol);
    memory.add(SYMBOLS + 0x100, symbol_bytes("work", 4));
    let signature = "(Ljava/lang/String;I)V";
    memory.add(
        SYMBOLS + 0x200,
        symbol_bytes(signature, signature.len() as u16),
    );
    memory.add(SYMBOLS + 0x300, symbol_bytes("Demo.java", 9));
    memory
}

pub(in crate::runtimes::hotspot) fn demo() -> Regions {
    method_graph(
        symbol_bytes("demo/Demo", 9),
        line_stream(&LINES, layout().unsigned5_excluded),
    )
}

#[test]
fn an_interpreted_frame_is_named_with_its_line() {
    let memory = demo();
    let layout = layout();
    let frame = |bci| name_method(&memory, &layout, METHOD, bci).unwrap();
    let named = frame(0);
    assert_eq!(
        named,
        JavaFrame {
            class: "demo.Demo".into(),
            method: "work".into(),
            signature: "(Ljava/lang/String;I)V".into(),
            file: Some("Demo.java".into()),
            line: Some(10),
        }
    );
    assert_eq!(named.display(), "demo.Demo.work");
    for (bci, line) in [
        (3, 10),
        (4, 11),
        (8, 11),
        (9, 13),
        (14, 13),
        (15, 40),
        (19, 40),
    ] {
        assert_eq!(frame(bci).line, Some(line), "bci {bci}");
    }
    // Past the bytecode: named by its first line, as OTel does.
    assert_eq!(frame(u32::from(CODE_SIZE) + 5).line, Some(10));
}

#[test]
fn line_tables_decode_for_both_exclusions_and_unsorted() {
    let unsorted = [(6, 20), (0, 18), (12, 25), (3, 19)];
    for excluded in [0, 1] {
        let table = line_stream(&unsorted, excluded);
        for (bci, line) in [
            (0, 18),
            (2, 18),
            (3, 19),
            (5, 19),
            (6, 20),
            (11, 20),
            (40, 25),
        ] {
            assert_eq!(line_of(&table, excluded, bci), Ok(Some(line)), "bci {bci}");
        }
        assert_eq!(
            line_of(&table[..table.len() - 1], excluded, 0),
            Err(LineError::Truncated)
        );
    }
    assert_eq!(line_of(&[0], 0, 7), Ok(None));
}

#[test]
fn signatures_demangle_as_java_writes_them() {
    let cases = [
        ("(Ljava/lang/String;I)V", "(java.lang.String, int)"),
        ("()V", "()"),
        ("(J)J", "(long)"),
        (
            "([[B[Ljava/lang/Object;ZCDFS)I",
            "(byte[][], java.lang.Object[], boolean, char, double, float, short)",
        ),
    ];
    for (descriptor, java) in cases {
        assert_eq!(demangle_signature(descriptor).as_deref(), Some(java));
    }
    for bad in ["", "(", "(Ljava/lang/String", "(Q)V", "([)V"] {
        assert_eq!(demangle_signature(bad), None, "{bad}");
    }
}

fn fast<T: std::fmt::Debug>(what: &str, read: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let value = read();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{what}: {value:?}"
    );
    value
}

#[test]
fn hostile_methods_are_refused_fast() {
    let layout = layout();
    // A class name claiming 60000 bytes where only its header is mapped.
    let memory = method_graph(symbol_bytes("", 60_000), line_stream(&LINES, 0));
    let named = fast("long symbol", || name_method(&memory, &layout, METHOD, 0));
    assert_eq!(
        named,
        Err(MethodError::Unreadable {
            what: "Symbol's body",
            address: SYMBOLS + 6
        })
    );
    // A line table without its end: a MiB of one-byte entries.
    let memory = method_graph(symbol_bytes("demo/Demo", 9), vec![0x01; 1 << 20]);
    let named = fast("endless lines", || name_method(&memory, &layout, METHOD, 0));
    assert!(
        matches!(named, Err(MethodError::Unended { .. })),
        "{named:?}"
    );
    // A line table running into unmapped memory.
    let memory = method_graph(symbol_bytes("demo/Demo", 9), vec![0x01; 300]);
    let named = fast("cut lines", || name_method(&memory, &layout, METHOD, 0));
    assert!(
        matches!(named, Err(MethodError::Unreadable { .. })),
        "{named:?}"
    );
    // An unreadable Method.
    assert!(matches!(
        name_method(&memory, &layout, 0xdead_0000, 0),
        Err(MethodError::Unreadable { .. })
    ));
}

// A synthetic nmethod, under `jdk17()`'s offsets: sizeof 0x100, _method 0x60,
// _scopes_data_begin 0x80 (a pointer), _metadata_offset 0xc0, _scopes_pcs_offset 0xc8,
// _dependencies_offset 0xcc, _compile_id 0xe0; PcDesc (0x10) _pc_offset 0x00,
// _scope_decode_offset 0x04.
pub(in crate::runtimes::hotspot) const NMETHOD: u64 = 0x2000_0000;
pub(in crate::runtimes::hotspot) const COMPILE_ID: u32 = 7;

/// The nmethod of [`METHOD`] with two scopes: at pc 0x40 on, the method at bci 9 inlined into
/// itself at bci 4.
pub(in crate::runtimes::hotspot) fn nmethod(memory: &mut Regions) {
    let mut bytes = vec![0u8; 0x140];
    put(&mut bytes, 0x60, &METHOD.to_le_bytes());
    put(&mut bytes, 0x80, &(NMETHOD + 0x110).to_le_bytes());
    put(&mut bytes, 0xc0, &0x100i32.to_le_bytes());
    put(&mut bytes, 0xc8, &0x120i32.to_le_bytes());
    put(&mut bytes, 0xcc, &0x140i32.to_le_bytes());
    put(&mut bytes, 0xe0, &COMPILE_ID.to_le_bytes());
    // metadata: the method twice.
    put(&mut bytes, 0x100, &METHOD.to_le_bytes());
    put(&mut bytes, 0x108, &METHOD.to_le_bytes());
    // scopes data: the null scope, the caller at 1 (bci 4), the callee at 4 (bci 9).
    put(&mut bytes, 0x110, &[0, 0, 1, 5, 1, 2, 10]);
    // scopes pcs: [pc 0, scope 1], [pc 0x40, scope 4].
    put(&mut bytes, 0x120, &0i32.to_le_bytes());
    put(&mut bytes, 0x124, &1i32.to_le_bytes());
    put(&mut bytes, 0x130, &0x40i32.to_le_bytes());
    put(&mut bytes, 0x134, &4i32.to_le_bytes());
    memory.add(NMETHOD, bytes);
}

#[test]
fn a_compiled_frame_is_named_with_its_inlined_scopes() {
    let layout = layout();
    let mut memory = demo();
    nmethod(&mut memory);
    let lines = |pc| {
        name_compiled(&memory, &layout, NMETHOD, pc, COMPILE_ID)
            .unwrap()
            .iter()
            .map(|f| (f.display(), f.line))
            .collect::<Vec<_>>()
    };
    let work = "demo.Demo.work".to_string();
    assert_eq!(lines(0x10), [(work.clone(), Some(11))]);
    assert_eq!(
        lines(0x40),
        [(work.clone(), Some(13)), (work.clone(), Some(11))]
    );
    assert_eq!(lines(0x400), lines(0x40));
    assert_eq!(
        name_compiled(&memory, &layout, NMETHOD, 0x10, COMPILE_ID + 1),
        Err(NmethodError::Evicted {
            expected: COMPILE_ID + 1,
            found: COMPILE_ID
        })
    );
}

/// Debug info whose one `PcDesc` (pc 0) leads to the scope at `scope`.
fn info(scopes_data: Vec<u8>, methods: usize, scope: usize) -> DebugInfo {
    let mut pcs = vec![0u8; 0x10];
    put(&mut pcs, 4, &(scope as i32).to_le_bytes());
    DebugInfo {
        metadata: vec![0x11; 8 * methods],
        scopes_data,
        scopes_pcs: pcs,
    }
}

#[test]
fn hostile_scopes_are_refused_fast() {
    let layout = layout();
    // No PcDesc: the nmethod's own method.
    let none = DebugInfo::default();
    assert_eq!(scopes(&none, &layout, 0x99, 5), Ok(vec![(0x99, 0)]));
    // A scope naming itself as its sender.
    let looping = info(vec![0, 0, 0, 0, 4, 1, 1], 1, 4);
    assert_eq!(
        fast("loop", || scopes(&looping, &layout, 0x99, 5)),
        Err(NmethodError::ScopeLoop {
            offset: 4,
            sender: 4
        })
    );
    // A chain longer than the bound, each sender before its callee.
    let mut data = vec![0u8];
    let mut sender = 0;
    for _ in 0..(MAX_SCOPES + 10) {
        let offset = data.len();
        data.extend(encode(sender, 0).unwrap());
        data.extend([1, 1]);
        sender = offset as u32;
    }
    let deep = info(data, 1, sender as usize);
    assert_eq!(
        fast("deep", || scopes(&deep, &layout, 0x99, 5)),
        Err(NmethodError::TooDeep)
    );
    // A metadata index past the array.
    let past = info(vec![0, 0, 0, 0, 0, 3, 1], 2, 4);
    assert_eq!(
        scopes(&past, &layout, 0x99, 5),
        Err(NmethodError::MetadataIndex {
            offset: 4,
            index: 3,
            len: 2
        })
    );
    // A truncated scope.
    let cut = info(vec![0, 0, 0, 0xff, 0xff, 0xff], 1, 3);
    assert!(matches!(
        scopes(&cut, &layout, 0x99, 5),
        Err(NmethodError::Scope { .. })
    ));
}

#[test]
fn the_names_fuzz_entry_survives_what_it_is_given() {
    super::super::fuzz_names(&[]);
    super::super::fuzz_names(&[0xff; 300]);
    super::super::fuzz_names(&[0x01; 5000]);
}

/// Hot.java: `spin`'s statements are on lines 3 to 7, `main`'s first on 10.
pub(in crate::runtimes::hotspot) const HOT: &str = "public class Hot {
    static long spin(long n) {
        long acc = 0;
        for (long i = 0; i < n; i++) {
            acc += (i * 31) ^ (acc >>> 3);
        }
        return acc;
    }
    public static void main(String[] args) {
        long total = 0;
        while (true) {
            total += spin(100_000);
            if (total == 42) System.out.println(total);
        }
    }
}
";

/// A used blob of the code heaps: (blob, name).
pub(in crate::runtimes::hotspot) fn blobs(
    memory: &dyn Memory,
    layout: &Layout,
    cache: &super::super::CodeCache,
) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    for heap in &cache.heaps {
        let mut at = heap.code.start;
        // HeapBlock::Header { size_t _length (in segments); bool _used; }, from the heap's
        // start; the committed part ends in zeros or unmapped memory.
        while at < heap.code.end && out.len() < 100_000 {
            let (Some(length), Some(used)) = (read_u64(memory, at), read_u8(memory, at + 8)) else {
                break;
            };
            if length == 0 {
                break;
            }
            if used != 0 {
                let blob = at + layout.heap_block_size;
                if let Some(name) = read_u64(memory, blob + layout.code_blob.name) {
                    if let Ok(name) = read_c_string(memory, name, 256) {
                        out.push((blob, name));
                    }
                }
            }
            at += length << cache.segment_shift;
        }
    }
    out
}

/// The host's JDK 17 running Hot.java: its compiled methods enumerated from the code heaps and
/// named, `spin`'s nmethod named at a pc, and a method named as interpreted.
#[test]
fn the_hosts_jdk_17_names_its_compiled_methods() {
    let home = std::path::Path::new("/usr/lib/jvm/java-17-openjdk-amd64");
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("Hot.java");
    std::fs::write(&source, HOT).unwrap();
    let jdk = Jdk(std::process::Command::new(home.join("bin/java"))
        .arg(&source)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("running the host's JDK 17 (openjdk-17-jdk-headless)"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let (memory, _, layout, cache) = attach(jdk.0.id(), deadline);

    let started = Instant::now();
    // Until C2 has compiled spin (the launcher compiles Hot.java first).
    let (named, errors, spin) = loop {
        std::thread::sleep(Duration::from_millis(500));
        let mut named = Vec::new();
        let mut errors = Vec::new();
        let mut spin = Vec::new();
        for (blob, name) in blobs(&memory, &layout, &cache) {
            if name != "nmethod" {
                continue;
            }
            let Some(method) = read_u64(&memory, blob + layout.nmethod.method) else {
                continue;
            };
            match name_method(&memory, &layout, method, 0) {
                Ok(frame) => {
                    if frame.display() == "Hot.spin" {
                        spin.push((blob, method, frame.clone()));
                    }
                    named.push(frame);
                }
                Err(err) => errors.push(err),
            }
        }
        // C1 compiles spin at once; C2 some seconds later.
        let waited = started.elapsed() >= Duration::from_secs(3);
        if waited && !spin.is_empty() && named.len() >= 20 || Instant::now() > deadline {
            break (named, errors, spin);
        }
    };
    eprintln!(
        "JDK 17: {} nmethods named, {} errors {:?}; e.g. {:?}",
        named.len(),
        errors.len(),
        errors.iter().take(5).collect::<Vec<_>>(),
        named
            .iter()
            .take(12)
            .map(|f| format!("{}{} {:?}:{:?}", f.display(), f.signature, f.file, f.line))
            .collect::<Vec<_>>()
    );
    assert!(named.len() >= 20, "{} named", named.len());
    assert!(errors.is_empty(), "{errors:?}");
    assert!(named
        .iter()
        .any(|f| f.class.starts_with("java.lang.") && f.file.is_some()));
    let (blob, _, frame) = spin.first().expect("Hot.spin compiled").clone();
    assert_eq!(
        (
            frame.class.as_str(),
            frame.method.as_str(),
            frame.signature.as_str()
        ),
        ("Hot", "spin", "(J)J")
    );
    assert_eq!(frame.file.as_deref(), Some("Hot.java"));
    // Interpreted: bci 0 is the first statement's line.
    assert_eq!(frame.line, Some(3));

    // Compiled: a pc in the middle of spin's code.
    let super::super::layout::Place::Pointer(begin_at) = layout.code_blob.code_begin else {
        panic!("JDK 17 keeps code pointers");
    };
    let super::super::layout::Place::Pointer(end_at) = layout.code_blob.code_end else {
        panic!("JDK 17 keeps code pointers");
    };
    // Each of spin's nmethods (C1's, C2's, on-stack replacements), the first also checked
    // with a wrong compile id below.
    for &(blob, method, _) in &spin {
        let begin = read_u64(&memory, blob + begin_at).unwrap();
        let end = read_u64(&memory, blob + end_at).unwrap();
        assert!(begin < end);
        let compile_id = read_i32(&memory, blob + layout.nmethod.compile_id).unwrap() as u32;
        for pc in [(end - begin) / 4, (end - begin) / 2, (end - begin) * 3 / 4] {
            let frames = name_compiled(&memory, &layout, blob, pc as u32, compile_id).unwrap();
            eprintln!(
            "Hot.spin nmethod {blob:#x} (compile {compile_id}, Method* {method:#x}) at pc +{pc:#x}: {:?}",
            frames
                .iter()
                .map(|f| format!("{} {:?}:{:?}", f.display(), f.file, f.line))
                .collect::<Vec<_>>()
        );
            let innermost = &frames[0];
            assert_eq!(innermost.display(), "Hot.spin");
            let line = innermost.line.expect("spin has lines");
            assert!((3..=7).contains(&line), "line {line}");
        }
    }
    let compile_id = read_i32(&memory, blob + layout.nmethod.compile_id).unwrap() as u32;
    assert_eq!(
        name_compiled(
            &memory,
            &layout,
            blob,
            0,
            compile_id.wrapping_add(1_000_000)
        ),
        Err(NmethodError::Evicted {
            expected: compile_id.wrapping_add(1_000_000),
            found: compile_id
        })
    );
    // Every nmethod's pcs: the outermost scope is the compiled method itself, and inner ones
    // are what it inlined there.
    let (mut checked, mut inlined, mut evicted) = (0, Vec::new(), 0);
    let mut failures = Vec::new();
    for (blob, name) in blobs(&memory, &layout, &cache) {
        let Some(method) = read_u64(&memory, blob + layout.nmethod.method) else {
            continue;
        };
        let (Ok(own), Some(begin), Some(end), Some(id)) = (
            name_method(&memory, &layout, method, 0),
            read_u64(&memory, blob + begin_at),
            read_u64(&memory, blob + end_at),
            read_i32(&memory, blob + layout.nmethod.compile_id),
        ) else {
            continue;
        };
        if name != "nmethod" || end <= begin {
            continue;
        }
        for pc in [0, (end - begin) / 3, (end - begin) / 2, end - begin - 1] {
            match name_compiled(&memory, &layout, blob, pc as u32, id as u32) {
                Ok(frames) => {
                    checked += 1;
                    let outer = frames.last().expect("at least the method");
                    assert_eq!(
                        (&outer.class, &outer.method, &outer.signature),
                        (&own.class, &own.method, &own.signature)
                    );
                    if frames.len() > 1 && inlined.len() < 5 {
                        inlined.push(
                            frames
                                .iter()
                                .map(|f| format!("{}:{:?}", f.display(), f.line))
                                .collect::<Vec<_>>(),
                        );
                    }
                }
                // Freed and reused while the JVM runs: what the error is for.
                Err(NmethodError::Evicted { .. }) => evicted += 1,
                Err(err) => failures.push((own.display(), pc, err)),
            }
        }
    }
    eprintln!(
        "JDK 17: {checked} compiled pcs named, {evicted} evicted, failures {failures:?}; \
         inlined e.g. {inlined:#?}"
    );
    assert!(failures.is_empty(), "{failures:?}");
    assert!(checked >= 80, "{checked}");
    assert!(!inlined.is_empty(), "no pc with inlined frames");

    // main, compiled on stack or not, is named at its first line where its nmethod is found.
    if let Some(main) = named.iter().find(|f| f.display() == "Hot.main") {
        assert_eq!(main.line, Some(10));
        assert_eq!(main.signature, "([Ljava/lang/String;)V");
    }
}
