//! The table read from real Go binaries (built by the `go` toolchain) and from synthetic
//! tables written byte by byte.

use super::*;
use object::ObjectSection;
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

/// main -> run (inlined) -> compute -> matmul (noinline) -> scale (inlined); leaf is a
/// frameless noinline function. Line numbers below refer to this text.
const PROGRAM: &str = r#"package main

import (
	"fmt"
	"os"
)

//go:noinline
func matmul(a, b, c []float64, n int) {
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			s := 0.0
			for k := 0; k < n; k++ {
				s += a[i*n+k] * b[k*n+j]
			}
			c[i*n+j] = scale(s)
		}
	}
}

func scale(x float64) float64 {
	return x * 0.5
}

//go:noinline
func leaf(x int) int {
	return x*3 + 1
}

func compute(n int) float64 {
	a := make([]float64, n*n)
	b := make([]float64, n*n)
	c := make([]float64, n*n)
	for i := range a {
		a[i] = float64(leaf(i))
		b[i] = float64(i)
	}
	matmul(a, b, c, n)
	return c[0]
}

func run(n int) float64 {
	return compute(n)
}

func main() {
	fmt.Println(run(len(os.Args) + 10))
}
"#;

/// `go` with its caches under `dir`, so the tests neither need nor touch a home directory.
fn go(dir: &Path) -> Command {
    let mut command = Command::new("go");
    command
        .current_dir(dir)
        .env("GOCACHE", dir.join("cache"))
        .env("GOPATH", dir.join("gopath"))
        .env("HOME", dir)
        .env("GOFLAGS", "")
        .env("GOTOOLCHAIN", "local");
    command
}

fn output(command: &mut Command) -> String {
    let output = command.output().unwrap_or_else(|e| {
        panic!("{command:?}: {e}: these tests build Go programs; run `cargo xtask setup`")
    });
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The test program built each way, once per test run, in target/go-tests (kept: the
/// build cache there makes the next run fast). Each build is renamed into place, so two
/// test runs at once do not read each other's half-written files.
fn binaries() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let dir = exe.ancestors().nth(3).unwrap().join("go-tests");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("x.go"), PROGRAM).unwrap();
        let pid = std::process::id();
        // The external linker (gcc, as cgo uses) merges the table into `.data.rel.ro`.
        let pie = "-buildmode=pie";
        let external = "-ldflags=-linkmode=external -compressdwarf=false";
        let builds: [(&str, &[&str]); 6] = [
            ("plain", &["-ldflags=-compressdwarf=false"]),
            ("stripped", &["-ldflags=-s -w"]),
            ("pie", &[pie, "-ldflags=-s -w"]),
            ("pie-symbols", &[pie, "-ldflags=-compressdwarf=false"]),
            ("external", &[pie, "-ldflags=-s -w -linkmode=external"]),
            ("external-symbols", &[pie, external]),
        ];
        for (name, flags) in builds {
            let partial = format!("{name}.{pid}");
            output(
                go(&dir)
                    .arg("build")
                    .args(flags)
                    .args(["-o", &partial, "x.go"]),
            );
            std::fs::rename(dir.join(partial), dir.join(name)).unwrap();
        }
        // For arm64, whose pc tables count 4-byte instructions (minLC 4).
        for (name, flags) in [
            ("arm64-plain", "-ldflags=-compressdwarf=false"),
            ("arm64-stripped", "-ldflags=-s -w"),
        ] {
            let partial = format!("{name}.{pid}");
            output(
                go(&dir)
                    .env("GOARCH", "arm64")
                    .args(["build", flags, "-o", &partial, "x.go"]),
            );
            std::fs::rename(dir.join(partial), dir.join(name)).unwrap();
        }
        // What sstrip leaves: no section headers at all.
        let mut bytes = std::fs::read(dir.join("pie")).unwrap();
        bytes[0x28..0x30].fill(0); // e_shoff
        bytes[0x3c..0x40].fill(0); // e_shnum, e_shstrndx
        let partial = dir.join(format!("pie-no-sections.{pid}"));
        std::fs::write(&partial, bytes).unwrap();
        std::fs::rename(partial, dir.join("pie-no-sections")).unwrap();
        dir
    })
}

fn binary(name: &str) -> Vec<u8> {
    std::fs::read(binaries().join(name)).unwrap()
}

fn table(data: &[u8]) -> Pclntab {
    let file = object::File::parse(data).unwrap();
    Pclntab::find(&file, data).unwrap().expect("a Go table")
}

/// The pclntab writes what is inside a name's outermost brackets (generic type arguments,
/// array lengths) as `...` (1.18+); the symbol table and DWARF do not.
fn elide_brackets(name: &str) -> String {
    match (name.find('['), name.rfind(']')) {
        (Some(i), Some(j)) if i < j => format!("{}[...]{}", &name[..i], &name[j + 1..]),
        _ => name.to_owned(),
    }
}

/// Function symbols of an unstripped build: address -> names. The symbol table marks
/// assembly functions' ABI (`internal/cpu.cpuid.abi0`); the pclntab does not.
fn symbols(data: &[u8]) -> HashMap<u64, Vec<String>> {
    let file = object::File::parse(data).unwrap();
    let mut symbols: HashMap<u64, Vec<String>> = HashMap::new();
    for symbol in file.symbols() {
        if symbol.kind() == object::SymbolKind::Text {
            let name = symbol.name().unwrap();
            let name = name.strip_suffix(".abi0").unwrap_or(name);
            let name = elide_brackets(name);
            symbols.entry(symbol.address()).or_default().push(name);
        }
    }
    symbols
}

fn symbol(data: &[u8], name: &str) -> u64 {
    let file = object::File::parse(data).unwrap();
    let mut symbols = file.symbols();
    symbols.find(|s| s.name() == Ok(name)).unwrap().address()
}

fn func<'d>(table: &Pclntab, data: &'d [u8], name: &str) -> GoFunc<'d> {
    let mut funcs = table.funcs(data).map(Result::unwrap);
    funcs.find(|f| f.name == name).unwrap()
}

#[test]
fn every_build_names_its_functions_like_its_symbol_table() {
    let plain = binary("plain");
    let pie_symbols = binary("pie-symbols");
    let external_symbols = binary("external-symbols");
    for (name, reference) in [
        ("plain", &plain),
        ("stripped", &plain),
        ("pie", &pie_symbols),
        ("pie-no-sections", &pie_symbols),
        ("external", &external_symbols),
    ] {
        let data = binary(name);
        let table = table(&data);
        assert_eq!(table.format(), Format::Go118, "{name}");
        assert_eq!(table.gofunc, Some(symbol(reference, "go.func.*")), "{name}");
        assert!(table.inline_trees(), "{name}");
        let symbols = symbols(reference);
        let mut count = 0;
        let mut previous_end = table.text_range().start;
        for func in table.funcs(&data) {
            let func = func.unwrap();
            let named = symbols.get(&func.entry).into_iter().flatten();
            assert!(
                named.clone().any(|n| n == func.name),
                "{name}: {func:?} is {:?} in the symbol table",
                named.collect::<Vec<_>>()
            );
            assert_eq!(func.entry, previous_end, "{name}: {}", func.name);
            previous_end = func.end;
            count += 1;
        }
        assert_eq!(previous_end, table.text_range().end);
        assert_eq!(count, table.functions());
        assert!(count > 1000, "{name}: {count} functions");
        assert_eq!(
            table.text_range().start,
            symbol(reference, "runtime.text"),
            "{name}"
        );
    }
}

#[test]
fn a_file_that_is_not_go_has_no_table() {
    let data = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    let file = object::File::parse(&*data).unwrap();
    assert!(Pclntab::find(&file, &data).unwrap().is_none());
    assert_eq!(build_id(&file, &data), None);
}

/// What DWARF says at each pc: (function, file, line), innermost first.
fn dwarf_frames(data: &[u8], pcs: &[u64]) -> Vec<Vec<(String, Option<String>, u32)>> {
    let file = object::File::parse(data).unwrap();
    let dwarf = gimli::Dwarf::load(|id| -> std::result::Result<_, gimli::Error> {
        let bytes = file.section_by_name(id.name()).map(|s| s.data().unwrap());
        Ok(gimli::EndianSlice::new(
            bytes.unwrap_or(&[]),
            gimli::LittleEndian,
        ))
    })
    .unwrap();
    let context = addr2line::Context::from_dwarf(dwarf).unwrap();
    let frames_at = |pc: u64| {
        let mut frames = Vec::new();
        let mut iter = context.find_frames(pc).skip_all_loads().unwrap();
        while let Some(frame) = iter.next().unwrap() {
            let Some(function) = frame.function else {
                continue;
            };
            let (file, line) = frame.location.map_or((None, 0), |l| {
                // addr2line joins the unit's directory (".") to Go's `<autogenerated>`.
                let file = l.file.map(|f| f.strip_prefix("./").unwrap_or(f).to_owned());
                (file, l.line.unwrap_or(0))
            });
            frames.push((elide_brackets(&function.raw_name().unwrap()), file, line));
        }
        frames
    };
    pcs.iter().map(|&pc| frames_at(pc)).collect()
}

fn go_frames(frames: Vec<GoFrame>) -> Vec<(String, Option<String>, u32)> {
    frames
        .into_iter()
        .map(|f| (f.function, f.file, f.line))
        .collect()
}

#[test]
fn frames_match_dwarf_with_inlined_levels() {
    for (name, reference) in [
        ("stripped", "plain"),
        ("pie", "pie-symbols"),
        ("pie-no-sections", "pie-symbols"),
        ("external", "external-symbols"),
    ] {
        frames_match_dwarf(&binary(name), &binary(reference));
    }
}

fn frames_match_dwarf(stripped: &[u8], plain: &[u8]) {
    let table = table(stripped);
    // Every instruction of the program's own functions, and every fifth of the others:
    // pcs a CPU reports (inside a multi-byte NOP, DWARF's rows and the pclntab's can
    // change line at different bytes).
    let segments = load_segments(Elf::parse(stripped).unwrap().segments());
    let mut pcs = Vec::new();
    for func in table.funcs(stripped).map(Result::unwrap) {
        let code = bytes_at(
            stripped,
            &segments,
            (func.entry, func.end - func.entry),
            "code",
        );
        let mut decoder = iced_x86::Decoder::with_ip(
            64,
            code.unwrap().bytes,
            func.entry,
            iced_x86::DecoderOptions::NONE,
        );
        let every = if func.name.starts_with("main.") { 1 } else { 5 };
        pcs.extend(decoder.iter().map(|i| i.ip()).step_by(every));
    }
    let dwarf = dwarf_frames(plain, &pcs);
    let (mut compared, mut differ) = (0, Vec::new());
    let mut inlined = HashMap::new();
    for (&pc, expected) in pcs.iter().zip(dwarf) {
        // Alignment padding and assembly without DWARF subprograms: nothing to compare.
        let Ok(frames) = table.frames(stripped, pc) else {
            assert!(expected.is_empty(), "{pc:#x}: DWARF has {expected:?}");
            continue;
        };
        if expected.is_empty() {
            continue;
        }
        compared += 1;
        let frames = go_frames(frames);
        if frames.len() > 1 {
            inlined.insert(frames[0].0.clone(), frames.clone());
        }
        // Go writes no DWARF inlining for autogenerated wrappers (`(*T).M` calling an
        // inlined `T.M`): DWARF names the wrapper at the inlined body's line.
        let wrapper = frames
            .last()
            .is_some_and(|f| f.1.as_deref() == Some("<autogenerated>"))
            && expected.len() == 1
            && expected[0]
                == (
                    frames.last().unwrap().0.clone(),
                    frames[0].1.clone(),
                    frames[0].2,
                );
        if frames != expected && !wrapper {
            differ.push((pc, frames, expected));
        }
    }
    assert!(compared > 20_000, "{compared} pcs compared");
    assert!(
        differ.is_empty(),
        "{} of {compared} differ: {:#x?}",
        differ.len(),
        &differ[..differ.len().min(5)]
    );
    let source = binaries().join("x.go").to_string_lossy().into_owned();
    let at = |function: &str, line| (function.to_owned(), Some(source.clone()), line);
    assert_eq!(
        inlined["main.scale"],
        [at("main.scale", 22), at("main.matmul", 16)]
    );
    assert_eq!(
        inlined["main.run"],
        [at("main.run", 43), at("main.main", 47)]
    );
}

#[test]
fn frames_match_go_tool_addr2line() {
    // Go's own reader (debug/gosym) names the real function and the innermost line; it
    // reads no PIE's `.data.rel.ro.gopclntab` (1.19), so the non-PIE build is asked.
    let stripped = binary("stripped");
    let table = table(&stripped);
    let range = table.text_range();
    let pcs: Vec<u64> = (range.start..range.end).step_by(37).collect();
    let input: String = pcs.iter().map(|pc| format!("{pc:#x}\n")).collect();
    let mut child = go(binaries())
        .args(["tool", "addr2line", "plain"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("go tool addr2line: run `cargo xtask setup`");
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        std::io::Write::write_all(&mut stdin, input.as_bytes()).unwrap();
    });
    let answer = child.wait_with_output().unwrap();
    writer.join().unwrap();
    let answer = String::from_utf8(answer.stdout).unwrap();
    let lines: Vec<&str> = answer.lines().collect();
    assert_eq!(lines.len(), 2 * pcs.len());
    let mut named = 0;
    for (&pc, go) in pcs.iter().zip(lines.chunks(2)) {
        match table.frames(&stripped, pc) {
            Ok(frames) => {
                let place = format!(
                    "{}:{}",
                    frames[0].file.as_deref().unwrap_or("?"),
                    frames[0].line
                );
                let outer = &frames.last().unwrap().function;
                assert_eq!((outer.as_str(), place.as_str()), (go[0], go[1]), "{pc:#x}");
                named += 1;
            }
            // Alignment padding past the function's pc-value tables.
            Err(PclntabError::PcValueEnds { .. }) => assert_eq!(go[1], ":-1", "{pc:#x}"),
            Err(e) => panic!("{pc:#x}: {e}"),
        }
    }
    assert!(named > 10_000, "{named} pcs named");
}

/// `go tool objdump`'s instructions of the functions `pattern` matches: (pc, length, text).
fn objdump(binary: &str, pattern: &str) -> Vec<(u64, u64, String)> {
    let text = output(go(binaries()).args(["tool", "objdump", "-s", pattern, binary]));
    let instruction = |line: &str| {
        let fields: Vec<&str> = line.split('\t').filter(|f| !f.trim().is_empty()).collect();
        let pc = u64::from_str_radix(fields.get(1)?.strip_prefix("0x")?, 16).ok()?;
        let length = fields.get(2)?.len() as u64 / 2;
        Some((pc, length, fields.get(3)?.trim().to_owned()))
    };
    text.lines().filter_map(instruction).collect()
}

#[test]
fn arm64_builds_count_their_pcs_in_instructions() {
    let plain = binary("arm64-plain");
    let stripped = binary("arm64-stripped");
    let table = table(&stripped);
    let symbols = symbols(&plain);
    let mut count = 0;
    for func in table.funcs(&stripped) {
        let func = func.unwrap();
        let named = symbols.get(&func.entry).into_iter().flatten();
        assert!(named.clone().any(|n| n == func.name), "{func:?}");
        // Every delta lies on an instruction of its function.
        let deltas = table.sp_deltas(&stripped, &func).unwrap();
        assert_eq!(deltas[0], (func.entry, 0), "{}", func.name);
        assert!(
            deltas
                .iter()
                .all(|d| d.0 % 4 == 0 && (func.entry..func.end).contains(&d.0)),
            "{}: {deltas:?}",
            func.name
        );
        count += 1;
    }
    assert!(count > 1000, "{count} functions");
    // The prologue `MOVD.W R30, -N(RSP)` moves sp by N from the next instruction on.
    let compute = func(&table, &stripped, "main.compute");
    let deltas = table.sp_deltas(&stripped, &compute).unwrap();
    let delta_at = |pc: u64| deltas.iter().rev().find(|d| d.0 <= pc).unwrap().1;
    let (pc, _, text) = objdump("arm64-plain", "^main.compute$")
        .into_iter()
        .find(|(_, _, text)| text.starts_with("MOVD.W R30, -"))
        .unwrap();
    let frame: i32 = text
        .strip_prefix("MOVD.W R30, -")
        .and_then(|rest| rest.strip_suffix("(RSP)"))
        .and_then(|decimal| decimal.parse().ok())
        .unwrap();
    assert_eq!((delta_at(pc), delta_at(pc + 4)), (0, frame), "{text}");
    // Lines too: the prologue's is the `func` line.
    let frames = table.frames(&stripped, compute.entry + 4).unwrap();
    let declared = PROGRAM
        .lines()
        .position(|line| line.starts_with("func compute("))
        .unwrap()
        + 1;
    let last = frames.last().unwrap();
    assert_eq!(
        (last.function.as_str(), last.line as usize),
        ("main.compute", declared),
        "{frames:?}"
    );
}

#[test]
fn sp_deltas_follow_the_prologues() {
    let stripped = binary("stripped");
    let table = table(&stripped);
    // A frameless leaf: 0 throughout.
    let leaf = func(&table, &stripped, "main.leaf");
    assert_eq!(
        table.sp_deltas(&stripped, &leaf).unwrap(),
        [(leaf.entry, 0)]
    );
    // With frames (and compute's stack check, whose morestack call runs at 0): every
    // instruction that moves SP moves the delta by as much.
    for (name, frame) in [("main.matmul", 0x18), ("main.compute", 0x80)] {
        let func = func(&table, &stripped, name);
        let deltas = table.sp_deltas(&stripped, &func).unwrap();
        assert_eq!(deltas[0], (func.entry, 0), "{name}");
        assert_eq!(deltas.iter().map(|d| d.1).max(), Some(frame), "{name}");
        assert!(deltas.windows(2).all(|w| w[0].0 < w[1].0), "{deltas:?}");
        let delta_at = |pc: u64| deltas.iter().rev().find(|d| d.0 <= pc).unwrap().1;
        let mut moves = 0;
        for (pc, length, text) in objdump("plain", &format!("^{name}$")) {
            let immediate = |prefix: &str| {
                let hex = text.strip_prefix(prefix)?.strip_suffix(", SP")?;
                i32::from_str_radix(hex, 16).ok()
            };
            // Go writes `ADDQ $-0x80, SP` and `SUBQ $-0x80, SP` for an 8-bit immediate.
            let change = if let Some(n) = immediate("SUBQ $0x") {
                n
            } else if let Some(n) = immediate("ADDQ $-0x") {
                n
            } else if let Some(n) = immediate("ADDQ $0x") {
                -n
            } else if let Some(n) = immediate("SUBQ $-0x") {
                -n
            } else if text.starts_with("PUSHQ") {
                8
            } else if text.starts_with("POPQ") {
                -8
            } else {
                continue;
            };
            assert_eq!(
                delta_at(pc + length) - delta_at(pc),
                change,
                "{name} {pc:#x} {text}"
            );
            moves += 1;
        }
        assert!(moves >= 2, "{name}: {moves} SP moves checked");
    }
    // Every function's table reads, starts at 0 and stays within the function.
    for func in table.funcs(&stripped) {
        let func = func.unwrap();
        let deltas = table.sp_deltas(&stripped, &func).unwrap();
        assert_eq!(deltas[0], (func.entry, 0), "{}", func.name);
        assert!(deltas.iter().all(|d| (func.entry..func.end).contains(&d.0)));
    }
}

#[test]
fn flags_mark_the_stack_tops_and_sp_writers() {
    let stripped = binary("stripped");
    let table = table(&stripped);
    let funcs: Vec<GoFunc> = table.funcs(&stripped).map(Result::unwrap).collect();
    let named = |pick: fn(&GoFunc) -> bool| {
        let mut names: Vec<&str> = funcs.iter().filter(|f| pick(f)).map(|f| f.name).collect();
        names.sort_unstable();
        names
    };
    assert_eq!(
        named(|f| f.top_frame),
        [
            "runtime.goexit",
            "runtime.mstart",
            "runtime.rt0_go",
            "runtime.sigtramp"
        ]
    );
    let spwrite = named(|f| f.spwrite);
    // `gogo` is runtime.gogo's file-local assembly half, which switches stacks.
    let switches = [
        "gogo",
        "runtime.morestack",
        "runtime.systemstack",
        "runtime.mcall",
    ];
    for name in switches
        .into_iter()
        .chain(["runtime.asmcgocall", "runtime.clone"])
    {
        assert!(spwrite.contains(&name), "{name} not in {spwrite:?}");
    }
    assert!(func(&table, &stripped, "runtime.memmove").asm);
    assert!(!func(&table, &stripped, "main.matmul").asm);
}

#[test]
fn build_id_matches_go_tool_buildid() {
    for name in ["plain", "stripped", "pie", "pie-no-sections", "external"] {
        let data = binary(name);
        let file = object::File::parse(&*data).unwrap();
        let expected = output(go(binaries()).args(["tool", "buildid", name]));
        assert_eq!(
            build_id(&file, &data).as_deref(),
            Some(expected.trim()),
            "{name}"
        );
    }
}

/// One function of a hand-built table: what no installed Go writes (1.2, 1.16, 1.20).
struct SynthFunc {
    name: &'static str,
    /// Entry and size, from the text start.
    entry: u64,
    size: u64,
    /// Runs of (bytes, value).
    sp: Vec<(u32, i32)>,
    lines: Vec<(u32, i32)>,
    /// An inlined call: callee, parentPc, and the pcs (start, bytes) inside it.
    inlined: Option<(&'static str, u32, (u32, u32))>,
    flag: u8,
}

const TEXT: u64 = 0x40_1000;
const TABLE: u64 = 0x50_0000;

fn synth_funcs() -> Vec<SynthFunc> {
    vec![
        SynthFunc {
            name: "main.leaf",
            entry: 0,
            size: 0x10,
            sp: vec![(0x10, 0)],
            lines: vec![(0x10, 27)],
            inlined: None,
            flag: 0,
        },
        SynthFunc {
            name: "main.work",
            entry: 0x20,
            size: 0x40,
            sp: vec![(4, 0), (0x38, 0x18), (4, 0)],
            lines: vec![(0x10, 10), (0x10, 22), (0x20, 16)],
            inlined: Some(("main.scale", 0x30, (0x10, 0x10))),
            flag: 0,
        },
        SynthFunc {
            name: "runtime.goexit",
            entry: 0x60,
            size: 0x10,
            sp: vec![(0x10, 0)],
            lines: vec![(0x10, 1)],
            inlined: None,
            flag: FLAG_TOPFRAME,
        },
    ]
}

fn varint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A pc-value table of `runs`, as Go's linker encodes it.
fn pc_table(runs: &[(u32, i32)]) -> Vec<u8> {
    let (mut out, mut previous) = (Vec::new(), -1i32);
    for &(bytes, value) in runs {
        let delta = value - previous;
        varint(&mut out, ((delta << 1) ^ (delta >> 31)) as u32);
        varint(&mut out, bytes);
        previous = value;
    }
    out.push(0);
    out
}

/// A file holding one table of `format` at `TABLE` (file offset 0) with its inline trees
/// after it, and the `Pclntab` read from it. Layouts as each Go version's linker writes
/// them: 1.2 has every offset from the table's start and the functab after the header.
fn synth(format: Format, funcs: &[SynthFunc]) -> (Vec<u8>, Pclntab) {
    fn put(out: &mut [u8], at: usize, bytes: &[u8]) {
        out[at..at + bytes.len()].copy_from_slice(bytes);
    }
    let align8 = |n: usize| n.next_multiple_of(8);
    let go12 = format == Format::Go12;
    let word = format.word() as usize;
    let (func_id_at, fixed) = format.func_id_and_size();
    let fixed = fixed as usize;
    // Names and pc-value tables, with offsets local to their blobs.
    let (mut names, mut name_offs) = (Vec::new(), HashMap::new());
    for name in funcs
        .iter()
        .flat_map(|f| [Some(f.name), f.inlined.map(|i| i.0)])
        .flatten()
    {
        name_offs.entry(name).or_insert_with(|| {
            let at = names.len();
            names.extend_from_slice(name.as_bytes());
            names.push(0);
            at
        });
    }
    let mut pcs = vec![0u8]; // offset 0 means "no table"
    let mut table = |runs: &[(u32, i32)]| {
        let at = pcs.len();
        pcs.extend_from_slice(&pc_table(runs));
        at
    };
    let fileno = if go12 { 1 } else { 0 };
    let tables: Vec<[Option<usize>; 4]> = funcs
        .iter()
        .map(|f| {
            let inline = f.inlined.map(|(_, _, (start, len))| {
                let rest = f.size as u32 - start - len;
                table(&[(start, -1), (len, 0), (rest, -1)])
            });
            let file = table(&[(f.size as u32, fileno)]);
            [
                Some(table(&f.sp)),
                Some(file),
                Some(table(&f.lines)),
                inline,
            ]
        })
        .collect();
    let files = b"synth.go\0";
    let n = funcs.len();
    let inlined = |f: &SynthFunc| f.inlined.is_some() && !go12;
    let record = |f: &SynthFunc| {
        let funcdata = if inlined(f) { 4 * word + 4 } else { 0 };
        align8(fixed + if f.inlined.is_some() { 12 } else { 0 } + funcdata)
    };
    // Where everything goes.
    let header = match format {
        Format::Go12 => 16,
        Format::Go116 => 64,
        _ => 72,
    };
    let functab_len = (2 * n + 1) * word + if go12 { 4 } else { 0 };
    let (names_at, files_at, cutab_at, pctab_at, functab_at, funcs_at);
    let mut filetab12_at = 0;
    if go12 {
        functab_at = 16;
        funcs_at = align8(functab_at + functab_len);
        names_at = funcs_at + funcs.iter().map(record).sum::<usize>();
        files_at = names_at + names.len();
        filetab12_at = align8(files_at + files.len());
        pctab_at = filetab12_at + 8;
        cutab_at = 0;
    } else {
        names_at = header;
        cutab_at = align8(names_at + names.len());
        files_at = cutab_at + 4;
        pctab_at = files_at + files.len();
        functab_at = align8(pctab_at + pcs.len());
        funcs_at = align8(functab_at + functab_len);
    }
    let table_len = if go12 {
        pctab_at + pcs.len()
    } else {
        funcs_at + funcs.iter().map(record).sum::<usize>()
    };
    let trees_at = align8(table_len);
    let mut out = vec![0u8; trees_at + 20 * n];
    // The header.
    let magic: u32 = match format {
        Format::Go12 => 0xffff_fffb,
        Format::Go116 => 0xffff_fffa,
        Format::Go118 => 0xffff_fff0,
        Format::Go120 => 0xffff_fff1,
    };
    put(&mut out, 0, &magic.to_le_bytes());
    put(&mut out, 6, &[1, 8]);
    put(&mut out, 8, &(n as u64).to_le_bytes());
    if !go12 {
        put(&mut out, 16, &1u64.to_le_bytes());
        let mut at = 24;
        if format != Format::Go116 {
            put(&mut out, 24, &TEXT.to_le_bytes());
            at = 32;
        }
        for v in [names_at, cutab_at, files_at, pctab_at, functab_at] {
            put(&mut out, at, &(v as u64).to_le_bytes());
            at += 8;
        }
    }
    put(&mut out, names_at, &names);
    put(&mut out, files_at, files);
    put(&mut out, pctab_at, &pcs);
    if go12 {
        put(
            &mut out,
            functab_at + (2 * n + 1) * 8,
            &(filetab12_at as u32).to_le_bytes(),
        );
        put(&mut out, filetab12_at, &2u32.to_le_bytes());
        put(&mut out, filetab12_at + 4, &(files_at as u32).to_le_bytes());
    }
    // Offsets as the format counts them.
    let (name_base, pc_base, func_base) = if go12 {
        (names_at, pctab_at, 0)
    } else {
        (0, 0, functab_at)
    };
    let uint = |v: u64| match word {
        8 => v.to_le_bytes().to_vec(),
        _ => (v as u32).to_le_bytes().to_vec(),
    };
    // 1.2 and 1.16 entries are addresses; 1.18+ are offsets from textStart.
    let entry_bytes = |off: u64| uint(if word == 8 { TEXT + off } else { off });
    let mut at = funcs_at;
    let mut tree_at = trees_at;
    for (i, (f, tables)) in funcs.iter().zip(&tables).enumerate() {
        let slot = functab_at + 2 * i * word;
        put(&mut out, slot, &entry_bytes(f.entry));
        put(&mut out, slot + word, &uint((at - func_base) as u64));
        put(&mut out, at, &entry_bytes(f.entry));
        let npcdata = if f.inlined.is_some() { 3 } else { 0 };
        let pc = |t: Option<usize>| t.map_or(0, |t| (t + pc_base) as u32);
        let fields = [
            (name_offs[f.name] + name_base) as u32,
            0,
            0,
            pc(tables[0]),
            pc(tables[1]),
            pc(tables[2]),
            npcdata,
            0,
        ];
        for (k, v) in fields.iter().enumerate().take(if go12 { 7 } else { 8 }) {
            put(&mut out, at + word + 4 * k, &v.to_le_bytes());
        }
        if let Some(func_id_at) = func_id_at {
            let nfuncdata = if inlined(f) { 4 } else { 0 };
            put(
                &mut out,
                at + func_id_at as usize + 1,
                &[f.flag, 0, nfuncdata],
            );
        }
        if npcdata > 0 {
            put(&mut out, at + fixed + 8, &pc(tables[3]).to_le_bytes());
        }
        if inlined(f) {
            let (callee, parent_pc, _) = f.inlined.unwrap();
            let name = name_offs[callee] as u32;
            let mut call = [0u8; 20];
            if format == Format::Go120 {
                call[4..8].copy_from_slice(&name.to_le_bytes());
                call[8..12].copy_from_slice(&parent_pc.to_le_bytes());
            } else {
                call[0..2].copy_from_slice(&(-1i16).to_le_bytes());
                call[12..16].copy_from_slice(&name.to_le_bytes());
                call[16..20].copy_from_slice(&parent_pc.to_le_bytes());
            }
            put(&mut out, tree_at, &call);
            let funcdata_at = at + fixed + 4 * npcdata as usize;
            if format == Format::Go116 {
                // Pointer-sized funcdata, at the next 8-aligned address.
                let funcdata_at = align8(funcdata_at);
                let tree = TABLE + tree_at as u64;
                put(&mut out, funcdata_at + 24, &tree.to_le_bytes());
            } else {
                for k in 0..3 {
                    put(&mut out, funcdata_at + 4 * k, &u32::MAX.to_le_bytes());
                }
                let off = (tree_at - trees_at) as u32;
                put(&mut out, funcdata_at + 12, &off.to_le_bytes());
            }
            tree_at += 20;
        }
        at += record(f);
    }
    let end = funcs.last().map_or(0, |f| f.entry + f.size);
    put(&mut out, functab_at + 2 * n * word, &entry_bytes(end));
    let table = Table::parse(&out, 0, table_len as u64, TABLE, None).unwrap();
    let segment = Segment {
        address: TABLE,
        offset: 0,
        file_size: out.len() as u64,
        memory_size: out.len() as u64,
        flags: 4,
    };
    let text = table.text_range(table.bytes(&out).unwrap()).unwrap();
    let gofunc = Some(TABLE + trees_at as u64).filter(|_| word == 4);
    let segments = vec![segment];
    (
        out,
        Pclntab {
            table,
            gofunc,
            segments,
            text,
        },
    )
}

#[test]
fn every_format_reads_from_its_layout() {
    let funcs = synth_funcs();
    let at = |function: &str, line| GoFrame {
        function: function.to_owned(),
        file: Some("synth.go".to_owned()),
        line,
    };
    for format in [Format::Go12, Format::Go116, Format::Go118, Format::Go120] {
        let (data, table) = synth(format, &funcs);
        let name = format.name();
        assert_eq!(table.format(), format);
        assert_eq!(table.functions(), 3);
        assert_eq!(table.text_range(), TEXT..TEXT + 0x70);
        assert_eq!(table.inline_trees(), format != Format::Go12, "{name}");
        let listed: Vec<(u64, u64, &str, bool)> = table
            .funcs(&data)
            .map(|f| f.map(|f| (f.entry - TEXT, f.end - TEXT, f.name, f.top_frame)))
            .collect::<Result<_>>()
            .unwrap();
        assert_eq!(
            listed,
            [
                (0, 0x20, "main.leaf", false),
                (0x20, 0x60, "main.work", false),
                (0x60, 0x70, "runtime.goexit", true)
            ],
            "{name}"
        );
        assert_eq!(
            table.frames(&data, TEXT + 5).unwrap(),
            [at("main.leaf", 27)]
        );
        let inlined = table.frames(&data, TEXT + 0x38).unwrap();
        if format == Format::Go12 {
            assert_eq!(inlined, [at("main.work", 22)], "{name}");
        } else {
            assert_eq!(
                inlined,
                [at("main.scale", 22), at("main.work", 16)],
                "{name}"
            );
        }
        assert_eq!(
            table.frames(&data, TEXT + 0x2f).unwrap(),
            [at("main.work", 10)]
        );
        // Padding after main.leaf's 16 bytes, and past the end.
        assert!(matches!(
            table.frames(&data, TEXT + 0x18),
            Err(PclntabError::PcValueEnds { table: "pcln", .. })
        ));
        assert!(matches!(
            table.frames(&data, TEXT + 0x70),
            Err(PclntabError::NoFunction { .. })
        ));
        let work = func(&table, &data, "main.work");
        let e = work.entry;
        assert_eq!(
            table.sp_deltas(&data, &work).unwrap(),
            [(e, 0), (e + 4, 0x18), (e + 0x3c, 0)],
            "{name}"
        );
    }
}

fn find(data: &[u8]) -> Result<Option<Pclntab>> {
    Pclntab::find(&object::File::parse(data).unwrap(), data)
}

#[test]
fn corrupt_headers_and_functabs_give_errors() {
    let data = binary("stripped");
    let good = table(&data);
    let start = good.table.start as usize;
    let with = |at: usize, bytes: &[u8]| {
        let mut data = data.clone();
        data[at..at + bytes.len()].copy_from_slice(bytes);
        data
    };
    let refused = |data: Vec<u8>| find(&data).unwrap_err();
    for (at, bytes, field) in [
        (7, &[4][..], "ptrSize"),
        (6, &[2], "minLC"),
        (4, &[1], "pad"),
        (0, &[0xff, 0xff, 0xff, 0xf0], "byte order"),
    ] {
        let e = refused(with(start + at, bytes));
        assert!(
            matches!(e, PclntabError::Unsupported { field: f, .. } if f == field),
            "{e}"
        );
        assert!(e.to_string().contains(field), "{e}");
    }
    let e = refused(with(start, &0xffff_fff5u32.to_le_bytes()));
    assert!(
        matches!(
            e,
            PclntabError::UnknownMagic {
                magic: 0xffff_fff5,
                ..
            }
        ),
        "{e}"
    );
    let e = refused(with(start + 8, &(1u64 << 40).to_le_bytes()));
    assert!(
        matches!(e, PclntabError::Header { field: "nfunc", .. }),
        "{e}"
    );
    let e = refused(with(start + 56, &u64::MAX.to_le_bytes()));
    assert!(
        matches!(
            e,
            PclntabError::Header {
                field: "pctabOffset",
                ..
            }
        ),
        "{e}"
    );

    // Functions 100 and 101 swapped in the functab: both refuse, the rest still read.
    let functab = start + good.table.functab as usize;
    let pair = |i: usize| data[functab + 8 * i..functab + 8 * i + 8].to_vec();
    let swapped = with(functab + 800, &[pair(101), pair(100)].concat());
    let table = table(&swapped);
    let failed: Vec<usize> = (table.funcs(&swapped).enumerate())
        .filter_map(|(i, f)| f.is_err().then_some(i))
        .collect();
    assert_eq!(failed, [100, 101]);
    let tab = good.table.bytes(&data).unwrap();
    for i in [100, 101] {
        let entry = good.table.entry(tab, i).unwrap();
        let e = table.frames(&swapped, entry).unwrap_err();
        assert!(matches!(e, PclntabError::Unsorted { .. }), "{e}");
    }

    // A _func whose entry disagrees with its functab entry, and one whose pcln table is
    // past the table's end.
    let func = good.table.func(tab, 200).unwrap();
    let at = start + func.off as usize;
    let moved = with(at, &0u32.to_le_bytes());
    let e = table_frames_error(&moved, func.entry);
    assert!(
        matches!(e, PclntabError::EntryMismatch { index: 200, .. }),
        "{e}"
    );
    let lost = with(at + 24, &u32::MAX.to_le_bytes());
    let e = table_frames_error(&lost, func.entry);
    assert!(matches!(e, PclntabError::Truncated { .. }), "{e}");
}

fn table_frames_error(data: &[u8], pc: u64) -> PclntabError {
    table(data).frames(data, pc).unwrap_err()
}

#[test]
fn corrupt_functions_give_errors() {
    // A name with no NUL before the table's end, and one that is not UTF-8.
    let (mut data, table) = synth(Format::Go118, &synth_funcs());
    let tab = table.table.bytes(&data).unwrap();
    let leaf = table.table.func(tab, 0).unwrap();
    let name_at = (table.table.funcnames + leaf.name_off) as usize;
    data[name_at] = 0xff;
    let e = table.frames(&data, TEXT).unwrap_err();
    assert!(
        matches!(
            e,
            PclntabError::BadString {
                what: "a function name",
                ..
            }
        ),
        "{e}"
    );
    let end = table.table.len as usize;
    data[end - 1] = b'x';
    let name_off = (end - 1) as u32 - table.table.funcnames as u32;
    data[leaf.off as usize + 4..][..4].copy_from_slice(&name_off.to_le_bytes());
    let e = table.funcs(&data).next().unwrap().unwrap_err();
    assert!(
        matches!(
            e,
            PclntabError::BadString {
                what: "a function name",
                ..
            }
        ),
        "{e}"
    );

    // An inlined call whose call site is inside itself: a cycle, cut at 64 levels.
    let mut funcs = synth_funcs();
    funcs[1].inlined = Some(("main.scale", 0x18, (0x10, 0x10)));
    let (data, table) = synth(Format::Go120, &funcs);
    let e = table.frames(&data, TEXT + 0x38).unwrap_err();
    assert!(matches!(e, PclntabError::InlineTooDeep { .. }), "{e}");

    // pcsp tables: one past the function's end, one that does not start at 0, one whose
    // varint never ends.
    for (sp, problem) in [
        (vec![(0x30, 0)], "covers more bytes"),
        (vec![(4, 8), (0xc, 0)], "does not start with 0"),
    ] {
        let mut funcs = synth_funcs();
        funcs[0].sp = sp;
        let (data, table) = synth(Format::Go116, &funcs);
        let leaf = func(&table, &data, "main.leaf");
        let e = table.sp_deltas(&data, &leaf).unwrap_err();
        assert!(e.to_string().contains(problem), "{e}");
    }
    let (mut data, table) = synth(Format::Go12, &synth_funcs());
    let tab = table.table.bytes(&data).unwrap();
    let pcsp = table.table.pctab + u64::from(table.table.func(tab, 0).unwrap().pcsp);
    data[pcsp as usize..][..6].fill(0xff);
    let leaf = func(&table, &data, "main.leaf");
    let e = table.sp_deltas(&data, &leaf).unwrap_err();
    assert!(matches!(e, PclntabError::Varint { .. }), "{e}");
}

#[test]
fn fuzz_regressions_do_not_panic() {
    let inputs = crate::sys::fs::fuzz_inputs("gopclntab");
    let seeds = inputs
        .iter()
        .filter(|(path, _)| path.to_string_lossy().contains("seeds"));
    assert!(seeds.count() >= 1, "fuzz/seeds/gopclntab/ is committed");
    for (_, data) in &inputs {
        fuzz_one(data);
    }
    // Truncations of real binaries, around and inside their tables, and bytes changed at
    // random in them: the section, symbol and scan paths.
    let mut random = 0x2545_f491_4f6c_dd1du64;
    for (name, changes) in [("stripped", 200), ("pie-no-sections", 20)] {
        let data = binary(name);
        let table = table(&data);
        let (start, len) = (table.table.start as usize, table.table.len as usize);
        let cuts = [0, 4, 64, 512, start, start + 8, start + 72, start + len / 2];
        for cut in cuts.into_iter().chain([start + len - 1, data.len() - 1]) {
            fuzz_one(&data[..cut]);
        }
        for _ in 0..changes {
            let mut changed = data.clone();
            for _ in 0..8 {
                random ^= random << 13;
                random ^= random >> 7;
                random ^= random << 17;
                changed[start + random as usize % len] = (random >> 56) as u8;
            }
            fuzz_one(&changed);
        }
    }
}

#[test]
fn names_ten_thousand_pcs_quickly() {
    let data = binary("stripped");
    let table = table(&data);
    let range = table.text_range();
    let step = (range.end - range.start) / 10_000;
    let started = std::time::Instant::now();
    let named = (0..10_000)
        .filter(|k| table.frames(&data, range.start + k * step).is_ok())
        .count();
    let took = started.elapsed();
    assert!(named > 9_000, "{named} of 10,000 named");
    // Well under 100 ms optimised; debug builds are about twenty times slower.
    let limit = if cfg!(debug_assertions) { 2_000 } else { 100 };
    assert!(took.as_millis() < limit, "10,000 pcs took {took:?}");
    println!("10,000 pcs named in {took:?}");
}
