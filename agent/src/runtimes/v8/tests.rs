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
    vec![
        ("SmiShiftSize", 31),
        ("HeapObjectTagMask", 3),
        ("HeapObjectTag", 1),
        ("SmiTagMask", 1),
        ("off_fp_function", -16),
        ("off_fp_context", -8),
        ("off_fp_bytecode_array", -32),
        ("off_fp_bytecode_offset", -40),
        ("frametype_EntryFrame", 1),
        ("type_JSFunction__JS_FUNCTION_TYPE", 2066),
        ("type_JSAtomicsCondition__JS_ATOMICS_CONDITION_TYPE", 2097),
        ("type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE", 262),
        ("type_Code__CODE_TYPE", 245),
        ("type_BytecodeArray__BYTECODE_ARRAY_TYPE", 191),
        ("type_Script__SCRIPT_TYPE", 167),
        ("class_HeapObject__map__Map", 0),
        ("class_Map__instance_type__uint16_t", 12),
        ("class_JSFunction__shared__SharedFunctionInfo", 24),
        ("class_Code__source_position_table__ByteArray", 24),
        ("CodeKindFieldMask", 15),
        ("CodeKindFieldShift", 0),
        ("CodeKindInterpretedFunction", 10),
        ("CodeKindBaseline", 11),
    ]
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
    for index in 0..FUZZ_NAMES.len() as i32 {
        seed.extend_from_slice(&index.to_le_bytes());
        seed.extend_from_slice(&(-index * 8).to_le_bytes());
    }
    fuzz_one(&seed);
}
