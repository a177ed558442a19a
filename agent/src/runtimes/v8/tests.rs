//! The layouts of the V8 builds Node ships: Debian's libnode for Node 18, 20 and 24
//! (`cargo xtask setup` unpacks them) and the host's Node 20 (NodeSource's static `node`).
//! The values are the builds' own constants (`readelf --dyn-syms` and the bytes at each);
//! the rules for what a build leaves out are checked against live processes by
//! tests/tests/integration/v8_layout.rs.

use super::layout::{CodeFields, FunctionCode, InstructionStart};
use super::*;
use crate::binary::elf::Elf;

/// The unpacked libnode of `suite`'s `package`, as `cargo xtask setup` leaves it.
fn libnode(suite: &str, package: &str, soname: &str) -> std::path::PathBuf {
    std::path::Path::new("/var/cache/scorch-tests/debian/libnode")
        .join(suite)
        .join(package)
        .join("usr/lib/x86_64-linux-gnu")
        .join(soname)
}

fn read(path: &std::path::Path) -> (Constants, Layout) {
    let data = std::fs::read(path)
        .unwrap_or_else(|e| panic!("{} ({e}): run `cargo xtask setup`", path.display()));
    let elf = Elf::parse(&data).unwrap();
    assert!(may_be(elf.object()), "{} not seen as V8's", path.display());
    let image = Image::of(&elf);
    let constants = constants::read(&image).unwrap().unwrap();
    let layout = layout::layout(&constants).unwrap();
    (constants, layout)
}

#[test]
fn node_18_as_debian_12_ships_it() {
    let (constants, layout) = read(&libnode("bookworm", "libnode108", "libnode.so.108"));
    assert_eq!(
        constants.version,
        Some(Version {
            major: 10,
            minor: 2,
            build: 154,
            patch: 26
        })
    );
    assert!(constants.len() > 400, "{} constants", constants.len());
    assert_eq!(layout.frame.function, -16);
    assert_eq!(layout.frame.context, -8);
    assert_eq!(layout.frame.bytecode_array, -32);
    assert_eq!(layout.frame.bytecode_offset, -40);
    assert_eq!(layout.tagging.heap_object_tag, 1);
    assert_eq!(layout.tagging.heap_object_tag_mask, 3);
    // Zero-valued constants are in .bss: HeapObject::map and CodeKindFieldShift.
    assert_eq!(layout.map, 0);
    assert_eq!(layout.code_kind.shift, 0);
    assert_eq!(layout.instance_type, 12);
    assert_eq!(
        (layout.types.first_function, layout.types.last_function),
        (2065, 2096)
    );
    assert_eq!(layout.types.shared_function_info, 257);
    assert_eq!(layout.types.code, 240);
    assert_eq!(layout.function_shared, 24);
    // Exported as `code__CodeT`, where the rule would also put it.
    assert_eq!(layout.function_code, FunctionCode::Code(48));
    assert_eq!(
        layout.code,
        CodeFields {
            instruction_start: InstructionStart::Inline(128),
            instruction_size: 40,
            flags: 48,
        }
    );
    assert_eq!(layout.code_kind.interpreted_function, 10);
    assert_eq!(layout.code_kind.baseline, 11);
    assert_eq!(layout.code_kind.mask, 15);
    assert_eq!(layout.markers.first(), Some(&(1, "EntryFrame".to_owned())));
}

#[test]
fn node_20_as_debian_13_ships_it() {
    let (constants, layout) = read(&libnode("trixie", "libnode115", "libnode.so.115"));
    assert_eq!(
        constants.version.map(|v| (v.major, v.minor, v.build)),
        Some((11, 3, 244))
    );
    node_20(&layout);
}

#[test]
fn node_20_as_nodesource_ships_it() {
    let (constants, layout) = read(std::path::Path::new("/usr/bin/node"));
    assert_eq!(constants.version.map(|v| (v.major, v.minor)), Some((11, 3)));
    assert!(constants.len() > 500, "{} constants", constants.len());
    node_20(&layout);
}

/// V8 11.3 exports neither `JSFunction::code` nor `Code`'s instruction fields: the rules
/// place them.
fn node_20(layout: &Layout) {
    assert_eq!(layout.function_shared, 24);
    assert_eq!(layout.function_code, FunctionCode::Code(48));
    assert_eq!(
        layout.code,
        CodeFields {
            instruction_start: InstructionStart::Pointer(40),
            instruction_size: 56,
            flags: 48,
        }
    );
    assert_eq!(
        (layout.types.first_function, layout.types.last_function),
        (2066, 2096)
    );
    assert_eq!(layout.types.code, 245);
    assert_eq!(layout.markers.len(), 27);
}

#[test]
fn node_24_as_debian_unstable_ships_it() {
    let (constants, layout) = read(&libnode("sid", "libnode137", "libnode.so.137"));
    assert_eq!(
        constants.version.map(|v| (v.major, v.minor, v.build)),
        Some((13, 6, 233))
    );
    // Exported again, with the function range.
    assert_eq!(
        (layout.types.first_function, layout.types.last_function),
        (2065, 2081)
    );
    assert_eq!(layout.function_shared, 32);
    assert_eq!(layout.function_code, FunctionCode::DispatchHandle(24));
    assert_eq!(
        layout.code,
        CodeFields {
            instruction_start: InstructionStart::Pointer(40),
            instruction_size: 56,
            flags: 52,
        }
    );
    assert_eq!(layout.code_kind.interpreted_function, 9);
    assert_eq!(layout.code_kind.baseline, 10);
    // Placed by the rules around the wrappers (checked live in `v8_walk`'s Node 24 lines).
    let deoptimization = layout.deoptimization.unwrap();
    assert_eq!(
        (
            deoptimization.code_field,
            deoptimization.shared_index,
            deoptimization.shared_wrapper
        ),
        (8, 7, Some(8))
    );
    assert_eq!(
        (
            deoptimization.literal_array_index,
            deoptimization.inlining_positions_index
        ),
        (3, 8)
    );
    let positions = layout.positions.unwrap();
    assert_eq!(
        (
            positions.code_table,
            positions.bytecode_table,
            positions.bytecode_data,
            positions.function_data
        ),
        (16, 24, 64, 8)
    );
    assert_eq!(
        (positions.byte_array_type, positions.fixed_array_type),
        (196, 205)
    );
}

#[test]
fn node_24s_isolate_group_is_found_from_its_accessor() {
    let path = libnode("sid", "libnode137", "libnode.so.137");
    let data = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{} ({e}): run `cargo xtask setup`", path.display()));
    let elf = Elf::parse(&data).unwrap();
    // `lea 0x396b2cd(%rip),%rax; mov (%rax),%rax` at 0xcfa50c.
    assert_eq!(
        super::dispatch::group_static(&Image::of(&elf)),
        Ok(0x466_57e0)
    );
}

/// Each build's `kBytecodeSizes`, found by its rows' shape: as many bytecodes as V8's
/// `bytecodes.h` of the release lists (10.2 and 11.3 from Debian's sources of Node 18 and
/// 20), and `Ldar`, `LdaZero` and `LdaSmi` sized as it sizes them at each scale.
#[test]
fn each_builds_bytecode_sizes_are_found() {
    for (path, count) in [
        (libnode("bookworm", "libnode108", "libnode.so.108"), 198),
        (libnode("trixie", "libnode115", "libnode.so.115"), 198),
        (libnode("sid", "libnode137", "libnode.so.137"), 208),
        ("/usr/bin/node".into(), 198),
    ] {
        let data = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{} ({e}): run `cargo xtask setup`", path.display()));
        let elf = Elf::parse(&data).unwrap();
        let image = Image::of(&elf);
        let sizes: Vec<_> = image
            .read_only_data()
            .filter_map(bytecodes::BytecodeSizes::find)
            .collect();
        assert_eq!(sizes.len(), 1, "{}", path.display());
        let sizes = &sizes[0].1;
        assert_eq!(sizes.count(), count, "{}", path.display());
        // Ldar r0, LdaZero, LdaSmi [1]; Wide Ldar; ExtraWide LdaSmi.
        let bytecodes = [11, 0, 12, 13, 1, 0, 11, 0, 0, 1, 13, 1, 0, 0, 0];
        let steps: Vec<usize> = [0, 2, 3, 5, 9]
            .iter()
            .map(|&at| sizes.size_at(&bytecodes, at).unwrap())
            .collect();
        assert_eq!(steps, [2, 1, 2, 4, 6], "{}", path.display());
    }
}

#[test]
fn binaries_without_the_constants_are_not_v8() {
    let data = std::fs::read("/proc/self/exe").unwrap();
    let elf = Elf::parse(&data).unwrap();
    assert!(!may_be(elf.object()));
    assert_eq!(read_layout(&Image::of(&elf)), Ok(None));
}

fn constants_of(version: Version, values: &[(&str, i32)]) -> Constants {
    Constants::of(version, values.iter().map(|&(n, v)| (n.to_owned(), v)))
}

/// Node 20's constants, as the tests below vary them.
fn node_20_constants() -> Vec<(&'static str, i32)> {
    NODE_20.to_vec()
}

#[test]
fn what_a_build_lacks_is_named() {
    let v = Version::new(11, 3, 244);
    let mut values = node_20_constants();
    values.retain(|(n, _)| *n != "off_fp_function");
    let err = layout::layout(&constants_of(v, &values)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "V8 11.3.244.0: no off_fp_function in its v8dbg constants"
    );
    let mut values = node_20_constants();
    values.retain(|(n, _)| *n != "class_Code__source_position_table__ByteArray");
    let err = layout::layout(&constants_of(v, &values)).unwrap_err();
    assert!(err.to_string().contains("Code::instruction_start"), "{err}");
}

#[test]
fn pointer_compression_and_old_releases_are_refused() {
    let mut values = node_20_constants();
    values[0].1 = 0;
    assert_eq!(
        layout::layout(&constants_of(Version::new(11, 3, 244), &values)),
        Err(LayoutError::PointerCompression(0))
    );
    assert!(matches!(
        layout::layout(&constants_of(Version::new(9, 4, 146), &node_20_constants())),
        Err(LayoutError::TooOld(_))
    ));
}

#[test]
fn lying_constants_are_refused_not_used() {
    for (name, value) in [
        ("off_fp_function", 16),
        ("off_fp_function", -12),
        ("class_JSFunction__shared__SharedFunctionInfo", -8),
        ("class_JSFunction__shared__SharedFunctionInfo", 1 << 20),
        ("CodeKindFieldShift", 40),
        ("type_Code__CODE_TYPE", 1 << 17),
    ] {
        let mut values = node_20_constants();
        values.retain(|(n, _)| *n != name);
        values.push((name, value));
        let result = layout::layout(&constants_of(Version::new(11, 3, 244), &values));
        assert!(
            matches!(result, Err(LayoutError::OutOfRange { .. })),
            "{name} = {value}: {result:?}"
        );
    }
    // Two spellings of one field that disagree are neither.
    let mut values = node_20_constants();
    values.push(("class_JSFunction__shared__Tagged_SharedFunctionInfo_", 32));
    assert!(matches!(
        layout::layout(&constants_of(Version::new(11, 3, 244), &values)),
        Err(LayoutError::Missing { .. })
    ));
}

#[test]
fn the_fuzz_target_survives_its_own_seeds() {
    fuzz_one(&[]);
    fuzz_one(&[0xff; 64]);
    let mut seed = Vec::new();
    for word in [11i32, 3, 244] {
        seed.extend_from_slice(&word.to_le_bytes());
    }
    for index in 0..(NODE_20.len() + OTHER_NAMES.len()) as i32 {
        seed.extend_from_slice(&index.to_le_bytes());
        seed.extend_from_slice(&(-index * 8).to_le_bytes());
    }
    fuzz_one(&seed);
}

/// A V8 heap written by hand, laid out as Node 20 lays it: maps with instance types, and
/// strings (map, hash, length at 12, characters at 16).
struct Heap {
    bytes: Vec<u8>,
}

const HEAP: u64 = 0x100_000;
/// Where each instance type's map is: `MAPS + type * 16`.
const MAPS: u64 = HEAP + 0x8000;
const ONE_BYTE: u16 = 8; // sequential | one-byte
const TWO_BYTE: u16 = 0;
const CONS: u16 = 9;
const EXTERNAL: u16 = 10;
const SLICED: u16 = 11;
const THIN: u16 = 13;
/// Node 20's SharedFunctionInfo and Script.
const SHARED: u16 = 262;
const SCRIPT: u16 = 167;
const SCOPE_INFO: u16 = 261;

impl Heap {
    fn new() -> Heap {
        let mut heap = Heap {
            bytes: vec![0; 0x10000],
        };
        for kind in [
            ONE_BYTE, TWO_BYTE, CONS, EXTERNAL, SLICED, THIN, 200, SHARED, SCRIPT, SCOPE_INFO,
        ] {
            heap.put(MAPS + u64::from(kind) * 16 + 12, &kind.to_le_bytes());
        }
        heap
    }

    fn put(&mut self, at: u64, bytes: &[u8]) {
        let at = (at - HEAP) as usize;
        self.bytes[at..at + bytes.len()].copy_from_slice(bytes);
    }

    /// An object of `kind` at `at` with `length`; returns its tagged pointer.
    fn object(&mut self, at: u64, kind: u16, length: i32) -> u64 {
        self.put(at, &(MAPS + u64::from(kind) * 16 + 1).to_le_bytes());
        self.put(at + 12, &length.to_le_bytes());
        at + 1
    }

    fn one_byte(&mut self, at: u64, text: &str) -> u64 {
        self.put(at + 16, text.as_bytes());
        self.object(at, ONE_BYTE, text.len() as i32)
    }

    fn link(&mut self, at: u64, kind: u16, length: i32, first: u64, second: u64) -> u64 {
        self.put(at + 16, &first.to_le_bytes());
        self.put(at + 24, &second.to_le_bytes());
        self.object(at, kind, length)
    }

    fn read(&self, tagged: u64, max: usize) -> Result<String, strings::StringError> {
        strings::read_string(&self.memory(), &node_20_layout(), tagged, max)
    }

    /// The heap as the memory of a process.
    fn memory(&self) -> crate::runtimes::memory::Regions {
        let mut memory = crate::runtimes::memory::Regions::new();
        memory.add(HEAP, self.bytes.clone());
        memory
    }
}

#[test]
fn strings_of_every_representation_read() {
    use strings::StringError;
    let mut heap = Heap::new();
    let name = heap.one_byte(HEAP, "optimised");
    assert_eq!(heap.read(name, 256).unwrap(), "optimised");
    assert_eq!(heap.read(name, 3).unwrap(), "opt");

    let text: Vec<u16> = "héllo ✓".encode_utf16().collect();
    let bytes: Vec<u8> = text.iter().flat_map(|u| u.to_le_bytes()).collect();
    heap.put(HEAP + 0x100 + 16, &bytes);
    let two = heap.object(HEAP + 0x100, TWO_BYTE, text.len() as i32);
    assert_eq!(heap.read(two, 256).unwrap(), "héllo ✓");

    // (ab + cd) + ef, and a slice of it.
    let ab = heap.one_byte(HEAP + 0x200, "ab");
    let cd = heap.one_byte(HEAP + 0x300, "cd");
    let ef = heap.one_byte(HEAP + 0x400, "ef");
    let abcd = heap.link(HEAP + 0x500, CONS, 4, ab, cd);
    let abcdef = heap.link(HEAP + 0x600, CONS, 6, abcd, ef);
    assert_eq!(heap.read(abcdef, 256).unwrap(), "abcdef");
    assert_eq!(heap.read(abcdef, 3).unwrap(), "abc");
    // A slice of a flat string, 6 characters in: its offset is a Smi.
    let hello = heap.one_byte(HEAP + 0x700, "hello world");
    let world = heap.link(HEAP + 0x800, SLICED, 5, hello, 6 << 32);
    assert_eq!(heap.read(world, 256).unwrap(), "world");
    let thin = heap.link(HEAP + 0x900, THIN, 9, name, 0);
    assert_eq!(heap.read(thin, 256).unwrap(), "optimised");

    // What the process may lie about.
    let cycle = heap.link(HEAP + 0xa00, CONS, 4, HEAP + 0xa00 + 1, ab);
    assert_eq!(heap.read(cycle, 256), Err(StringError::TooManyPieces));
    let external = heap.object(HEAP + 0xb00, EXTERNAL, 4);
    assert_eq!(heap.read(external, 256), Err(StringError::External));
    let not_string = heap.object(HEAP + 0xc00, 200, 4);
    assert!(matches!(
        heap.read(not_string, 256),
        Err(StringError::NotAString { kind: 200, .. })
    ));
    let negative = heap.object(HEAP + 0xd00, ONE_BYTE, -5);
    assert!(matches!(
        heap.read(negative, 256),
        Err(StringError::BadLength { length: -5, .. })
    ));
    // Claims more characters than its memory holds.
    let long = heap.object(HEAP + 0xfff0 - 16, ONE_BYTE, 1 << 30);
    assert!(matches!(
        heap.read(long, 1 << 20),
        Err(StringError::Unreadable(_))
    ));
    assert_eq!(heap.read(HEAP, 256), Err(StringError::NotAnObject(HEAP)));
}

#[test]
fn the_strings_fuzz_target_survives_its_own_seeds() {
    fuzz_strings(&[]);
    fuzz_strings(&[0xff; 64]);
    // Its first word points at itself: a string whose map is the input's second word.
    let mut seed = (FUZZ_BASE + 1).to_le_bytes().to_vec();
    seed.extend_from_slice(&(FUZZ_BASE + 1).to_le_bytes());
    seed.extend_from_slice(&[0x10; 48]);
    fuzz_strings(&seed);
}

#[test]
fn a_function_names_its_script() {
    let mut heap = Heap::new();
    let read =
        |heap: &Heap, shared: u64| shared::script_name(&heap.memory(), &node_20_layout(), shared);
    let path = heap.one_byte(HEAP, "/srv/app/server.js");
    // Script::name at 16, SharedFunctionInfo::script_or_debug_info at 32.
    heap.put(HEAP + 0x100 + 16, &path.to_le_bytes());
    let script = heap.object(HEAP + 0x100, SCRIPT, 0);
    heap.put(HEAP + 0x200 + 32, &script.to_le_bytes());
    let shared = heap.object(HEAP + 0x200, SHARED, 0);
    assert_eq!(read(&heap, shared), Ok(Some("/srv/app/server.js".into())));
    // eval'd code: the script's name is not a string.
    heap.put(HEAP + 0x100 + 16, &(HEAP + 0x300 + 1).to_le_bytes());
    heap.object(HEAP + 0x300, 200, 0);
    assert_eq!(read(&heap, shared), Ok(None));
    // A DebugInfo (here: any other object) where the script would be.
    heap.put(HEAP + 0x200 + 32, &(HEAP + 0x300 + 1).to_le_bytes());
    assert_eq!(read(&heap, shared), Ok(None));
    // Not a SharedFunctionInfo at all.
    assert!(matches!(
        read(&heap, script),
        Err(shared::SharedError::NotShared { kind: SCRIPT, .. })
    ));
}

/// A `ScopeInfo` at `at` as Node 20 lays it out: flags (a Smi, or a raw word), the
/// parameter count, the context locals' count, their names (inline below 75, else one hash
/// table slot) and infos, then the function variable's name and slot. Returns it tagged.
fn scope_info(heap: &mut Heap, at: u64, flags: u64, locals: u64, name: u64) -> u64 {
    let slot = |index: u64| at + 8 * (1 + index);
    heap.put(slot(0), &flags.to_le_bytes());
    heap.put(slot(1), &(1u64 << 32).to_le_bytes());
    heap.put(slot(2), &(locals << 32).to_le_bytes());
    let names = if locals < 75 { locals } else { 1 };
    for i in 0..names + locals {
        // Names of locals (any string will do) and Smi infos: never the function's name.
        let word = if i < names { HEAP + 1 } else { 7 << 32 };
        heap.put(slot(3 + i), &word.to_le_bytes());
    }
    heap.put(slot(3 + names + locals), &name.to_le_bytes());
    heap.put(slot(4 + names + locals), &(2u64 << 32).to_le_bytes());
    // Its map only: `Heap::object`'s length would overwrite the flags' upper half.
    heap.put(at, &(MAPS + u64::from(SCOPE_INFO) * 16 + 1).to_le_bytes());
    at + 1
}

#[test]
fn a_function_is_named_from_its_shared_info_or_its_scope_info() {
    let mut heap = Heap::new();
    let read =
        |heap: &Heap, shared: u64| shared::function_name(&heap.memory(), &node_20_layout(), shared);
    heap.one_byte(HEAP, "local");
    let name = heap.one_byte(HEAP + 0x40, "captures");
    // SharedFunctionInfo::name_or_scope_info at 16.
    let shared = heap.object(HEAP + 0x200, SHARED, 0);
    let set = |heap: &mut Heap, value: u64| heap.put(HEAP + 0x200 + 16, &value.to_le_bytes());
    // Not compiled yet: the name itself.
    set(&mut heap, name);
    assert_eq!(read(&heap, shared), Ok(Some("captures".into())));
    // No name: the Smi sentinel.
    set(&mut heap, 0);
    assert_eq!(read(&heap, shared), Ok(None));
    // Compiled: in its ScopeInfo, past two locals' names and infos. The function variable
    // is UNUSED (3) in bits 12 and 13; the flags a Smi (V8 10 and 11) or a raw word.
    let unused = 3u64 << 12 | 1 << 6 | 2;
    for flags in [unused << 32, unused] {
        let info = scope_info(&mut heap, HEAP + 0x1000, flags, 2, name);
        set(&mut heap, info);
        assert_eq!(
            read(&heap, shared),
            Ok(Some("captures".into())),
            "{flags:#x}"
        );
    }
    // More locals than V8 keeps inline: their names are one hash table slot.
    let info = scope_info(&mut heap, HEAP + 0x2000, unused << 32, 80, name);
    set(&mut heap, info);
    assert_eq!(read(&heap, shared), Ok(Some("captures".into())));
    // A saved class variable takes the slot before it.
    let info = scope_info(
        &mut heap,
        HEAP + 0x3000,
        (unused | 1 << 10) << 32,
        0,
        5 << 32,
    );
    heap.put(HEAP + 0x3000 + 8 * 5, &name.to_le_bytes());
    set(&mut heap, info);
    assert_eq!(read(&heap, shared), Ok(Some("captures".into())));
    // No function variable: no name kept.
    let info = scope_info(&mut heap, HEAP + 0x1000, (1u64 << 6) << 32, 2, name);
    set(&mut heap, info);
    assert_eq!(read(&heap, shared), Ok(None));
    // A function variable without a name (`Zero`).
    let info = scope_info(&mut heap, HEAP + 0x1000, unused << 32, 2, 0);
    set(&mut heap, info);
    assert_eq!(read(&heap, shared), Ok(None));
    // Without a name of its own, the one V8 inferred (bit 14), where the function variable
    // would be, or after it.
    let inferred = heap.one_byte(HEAP + 0x80, "holder.method");
    let info = scope_info(
        &mut heap,
        HEAP + 0x1000,
        (1u64 << 14 | 1 << 6 | 2) << 32,
        2,
        inferred,
    );
    set(&mut heap, info);
    assert_eq!(read(&heap, shared), Ok(Some("holder.method".into())));
    let empty = heap.one_byte(HEAP + 0xc0, "");
    for own in [0, empty] {
        let info = scope_info(&mut heap, HEAP + 0x1000, (unused | 1 << 14) << 32, 2, own);
        heap.put(HEAP + 0x1000 + 8 * 10, &inferred.to_le_bytes());
        set(&mut heap, info);
        assert_eq!(
            read(&heap, shared),
            Ok(Some("holder.method".into())),
            "{own:#x}"
        );
    }
    // Its own name first.
    let info = scope_info(&mut heap, HEAP + 0x1000, (unused | 1 << 14) << 32, 2, name);
    heap.put(HEAP + 0x1000 + 8 * 10, &inferred.to_le_bytes());
    set(&mut heap, info);
    assert_eq!(read(&heap, shared), Ok(Some("captures".into())));
    // `undefined` (no string) for the inferred name: none.
    let info = scope_info(&mut heap, HEAP + 0x1000, (1u64 << 14) << 32, 2, 0);
    set(&mut heap, info);
    assert_eq!(read(&heap, shared), Ok(None));
    // A count of locals that is not a Smi, or too large: refused, never followed.
    for count in [(1u64 << 40) | 1, 1 << 60] {
        let info = scope_info(&mut heap, HEAP + 0x1000, unused << 32, 2, name);
        heap.put(HEAP + 0x1000 + 8 * 3, &count.to_le_bytes());
        set(&mut heap, info);
        assert!(
            matches!(
                read(&heap, shared),
                Err(shared::SharedError::BadScopeInfo { .. })
            ),
            "{count:#x}"
        );
    }
    // Its name slot past the readable memory.
    let info = scope_info(&mut heap, HEAP + 0x1000, unused << 32, 2, name);
    heap.put(HEAP + 0x1000 + 8 * 3, &(60_000u64 << 32).to_le_bytes());
    set(&mut heap, info);
    assert!(matches!(
        read(&heap, shared),
        Err(shared::SharedError::Read(strings::StringError::Unreadable(
            _
        )))
    ));
}

#[test]
fn the_frames_fuzz_target_survives_its_own_seeds() {
    super::fuzz_frames(&[]);
    super::fuzz_frames(&[0xff; 64]);
    super::fuzz_frames(&[0x80; 4096]);
    // Its words point back into it: every object's map is the input's first word.
    let mut seed = Vec::new();
    for _ in 0..64 {
        seed.extend_from_slice(&(FUZZ_BASE + 1).to_le_bytes());
    }
    super::fuzz_frames(&seed);
}

/// The frames target's findings, replayed: each once ended in a panic.
#[test]
fn the_frames_fuzz_targets_findings_are_read_without_a_panic() {
    let inputs = crate::sys::fs::fuzz_inputs("v8_frames");
    assert!(!inputs.is_empty());
    for (_, data) in inputs {
        super::fuzz_frames(&data);
    }
}
