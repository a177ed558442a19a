//! The readers over synthetic JVM memory (well-formed and hostile), and over the host's real
//! JDK 17.

use std::time::{Duration, Instant};

use super::heaps::{code_cache, HeapsError, MAX_HEAPS};
use super::layout::{Heaps, LayoutError, Place, SourceFile};
use super::version::{parse_release, VersionError};
use super::vmstructs::{
    read_c_string, StringError, Symbols, VmStructsError, MAX_ENTRIES, MAX_NAME,
};
use super::{read_layout, HotspotError};
use crate::runtimes::memory::{Memory, ProcessMemory, Regions};

/// Where the synthetic libjvm is loaded.
const BIAS: u64 = 0x7f00_0000_0000;
/// Its eleven table globals, at ELF addresses.
const GLOBALS: u64 = 0x1000;
/// Its statics, at ELF addresses.
const STATICS: u64 = 0x2000;
const RELEASE: u64 = STATICS;
const JDK_CURRENT: u64 = STATICS + 0x08;
const HEAPS: u64 = STATICS + 0x10;
const LOW_BOUND: u64 = STATICS + 0x18;
const HIGH_BOUND: u64 = STATICS + 0x20;
const VM_MAJOR: u64 = STATICS + 0x28;
/// Names, entries and the release string, at process addresses.
const POOL: u64 = 0x5000_0000;
const STRUCT_ENTRIES: u64 = 0x6000_0000;
const TYPE_ENTRIES: u64 = 0x6100_0000;
const RELEASE_TEXT: u64 = 0x6200_0000;
/// The heaps' objects, and where their code and segment maps are said to be.
const GROWABLE: u64 = 0x7000_0000;
const HEAP_ARRAY: u64 = 0x7000_0100;
const HEAP_STRUCTS: u64 = 0x7000_1000;
const CODE: u64 = 0x7f10_0000_0000;
const SEGMAPS: u64 = 0x7f20_0000_0000;

/// A field of the synthetic table: a member's offset, or a static's ELF address.
#[derive(Debug, Clone, Copy)]
enum Entry {
    Member(u64),
    Static(u64),
}

/// A JVM's tables and version, laid out in memory by [`Jvm::memory`] with a chosen geometry.
#[derive(Debug, Clone)]
pub(super) struct Jvm {
    fields: Vec<(&'static str, &'static str, Entry)>,
    sizes: Vec<(&'static str, u64)>,
    /// `VMStructEntry`: stride, then where the type name, field name, static flag, offset and
    /// address are.
    struct_geometry: [u64; 6],
    /// `VMTypeEntry`: stride, type name, size.
    type_geometry: [u64; 3],
    /// Whether each table ends with its null entry.
    terminated: bool,
    release: Vec<u8>,
    jdk_major: u8,
    /// How far past where the entries point the names are put (0: where they point).
    names_moved: u64,
}

/// A JDK 17-like JVM (offsets made up, names and forms JDK 17's).
pub(super) fn jdk17() -> Jvm {
    use Entry::{Member as M, Static as S};
    Jvm {
        fields: vec![
            ("Abstract_VM_Version", "_s_vm_release", S(RELEASE)),
            ("Abstract_VM_Version", "_vm_major_version", S(VM_MAJOR)),
            ("JDK_Version", "_current", S(JDK_CURRENT)),
            ("CodeBlob", "_name", M(0x08)),
            ("CodeBlob", "_size", M(0x10)),
            ("CodeBlob", "_frame_complete_offset", M(0x18)),
            ("CodeBlob", "_data_offset", M(0x1c)),
            ("CodeBlob", "_frame_size", M(0x20)),
            ("CodeBlob", "_code_begin", M(0x28)),
            ("CodeBlob", "_code_end", M(0x30)),
            ("CodeCache", "_heaps", S(HEAPS)),
            ("CodeCache", "_low_bound", S(LOW_BOUND)),
            ("CodeCache", "_high_bound", S(HIGH_BOUND)),
            ("CodeHeap", "_memory", M(0x00)),
            ("CodeHeap", "_segmap", M(0x38)),
            ("CodeHeap", "_log2_segment_size", M(0x90)),
            ("VirtualSpace", "_low_boundary", M(0x00)),
            ("VirtualSpace", "_high_boundary", M(0x08)),
            ("VirtualSpace", "_low", M(0x10)),
            ("VirtualSpace", "_high", M(0x18)),
            ("ConstantPool", "_pool_holder", M(0x20)),
            ("ConstantPool", "_source_file_name_index", M(0x40)),
            ("ConstMethod", "_constants", M(0x08)),
            ("ConstMethod", "_code_size", M(0x28)),
            ("ConstMethod", "_flags", M(0x2c)),
            ("ConstMethod", "_name_index", M(0x30)),
            ("ConstMethod", "_signature_index", M(0x32)),
            ("Method", "_constMethod", M(0x08)),
            ("Klass", "_name", M(0x10)),
            ("InstanceKlass", "_source_file_name_index", M(0x1a0)),
            ("Thread", "_osthread", M(0x40)),
            ("nmethod", "_compile_id", M(0xe0)),
            ("nmethod", "_metadata_offset", M(0xc0)),
            ("nmethod", "_scopes_pcs_offset", M(0xc8)),
            ("nmethod", "_dependencies_offset", M(0xcc)),
            ("nmethod", "_orig_pc_offset", M(0xd4)),
            ("CompiledMethod", "_method", M(0x60)),
            ("CompiledMethod", "_scopes_data_begin", M(0x80)),
            ("CompiledMethod", "_deopt_handler_begin", M(0x98)),
            ("PcDesc", "_pc_offset", M(0x00)),
            ("PcDesc", "_scope_decode_offset", M(0x04)),
            ("Symbol", "_hash_and_refcount", M(0x00)),
            ("Symbol", "_length", M(0x04)),
            ("Symbol", "_body", M(0x06)),
            ("GrowableArray<int>", "_data", M(0x10)),
            ("GrowableArrayBase", "_len", M(0x00)),
        ],
        sizes: vec![
            ("CodeBlob", 0x70),
            ("CodeHeap", 0xa0),
            ("VirtualSpace", 0x38),
            ("HeapBlock", 0x10),
            ("ConstantPool", 0x50),
            ("ConstMethod", 0x38),
            ("Method", 0x58),
            ("Klass", 0xc8),
            ("InstanceKlass", 0x1c0),
            ("Thread", 0x300),
            ("nmethod", 0x100),
            ("CompiledMethod", 0xb0),
            ("PcDesc", 0x10),
            ("Symbol", 0x10),
            ("GrowableArray<int>", 0x18),
            ("GrowableArrayBase", 0x10),
        ],
        struct_geometry: [48, 0, 8, 24, 32, 40],
        type_geometry: [40, 0, 32],
        terminated: true,
        release: b"17.0.15+6-Debian-1deb12u1\0".to_vec(),
        jdk_major: 17,
        names_moved: 0,
    }
}

impl Jvm {
    fn without(mut self, type_name: &str, field: &str) -> Jvm {
        self.fields
            .retain(|&(t, f, _)| !(t == type_name && f == field));
        self
    }

    fn with(mut self, type_name: &'static str, field: &'static str, entry: Entry) -> Jvm {
        self = self.without(type_name, field);
        self.fields.push((type_name, field, entry));
        self
    }

    fn symbols() -> Symbols {
        Symbols::consecutive(GLOBALS)
    }

    /// The JVM's memory: its globals and statics, its names, its tables.
    fn memory(&self) -> Regions {
        let mut pool = Vec::new();
        let mut name = |text: &str| {
            let at = POOL + pool.len() as u64;
            pool.extend_from_slice(text.as_bytes());
            pool.push(0);
            at
        };
        let [stride, type_at, field_at, static_at, offset_at, address_at] = self.struct_geometry;
        let mut structs = Vec::new();
        for &(type_name, field, entry) in &self.fields {
            // A stride the reader refuses is laid out no wider than it would read.
            let mut bytes = vec![0u8; stride.min(1024) as usize];
            let mut put = |at: u64, value: &[u8]| {
                if let Some(slot) = bytes
                    .get_mut(at as usize..)
                    .and_then(|b| b.get_mut(..value.len()))
                {
                    slot.copy_from_slice(value);
                }
            };
            put(type_at, &name(type_name).to_le_bytes());
            put(field_at, &name(field).to_le_bytes());
            match entry {
                Entry::Member(offset) => put(offset_at, &offset.to_le_bytes()),
                Entry::Static(elf) => {
                    put(static_at, &1u32.to_le_bytes());
                    put(address_at, &(elf + BIAS).to_le_bytes());
                }
            }
            structs.extend_from_slice(&bytes);
        }
        let [type_stride, type_name_at, size_at] = self.type_geometry;
        let mut types = Vec::new();
        for &(type_name, size) in &self.sizes {
            let mut bytes = vec![0u8; type_stride as usize];
            bytes[type_name_at as usize..][..8].copy_from_slice(&name(type_name).to_le_bytes());
            if let Some(slot) = bytes
                .get_mut(size_at as usize..)
                .and_then(|b| b.get_mut(..8))
            {
                slot.copy_from_slice(&size.to_le_bytes());
            }
            types.extend_from_slice(&bytes);
        }
        if self.terminated {
            structs.resize(structs.len() + stride.min(1024) as usize, 0);
            types.resize(types.len() + type_stride as usize, 0);
        }
        let mut globals = vec![0u8; 0x2000];
        let words = [
            STRUCT_ENTRIES,
            stride,
            type_at,
            field_at,
            static_at,
            offset_at,
            address_at,
            TYPE_ENTRIES,
            type_stride,
            type_name_at,
            size_at,
        ];
        for (i, word) in words.iter().enumerate() {
            globals[8 * i..][..8].copy_from_slice(&word.to_le_bytes());
        }
        let statics = (STATICS - GLOBALS) as usize;
        globals[statics..][..8].copy_from_slice(&RELEASE_TEXT.to_le_bytes());
        globals[statics + 8] = self.jdk_major;
        globals[statics + 0x10..][..8].copy_from_slice(&GROWABLE.to_le_bytes());
        globals[statics + 0x18..][..8].copy_from_slice(&CODE.to_le_bytes());
        globals[statics + 0x20..][..8].copy_from_slice(&(CODE + 0x1000_0000).to_le_bytes());
        globals[statics + 0x28..][..4].copy_from_slice(&17i32.to_le_bytes());
        // A process's memory comes in pages: a name read in chunks reads past its end up to
        // the page's.
        let page = |mut bytes: Vec<u8>| {
            if !bytes.is_empty() {
                bytes.resize(bytes.len().next_multiple_of(4096), 0);
            }
            bytes
        };
        let mut memory = Regions::new();
        memory.add(GLOBALS + BIAS, globals);
        memory.add(POOL + self.names_moved, page(pool));
        memory.add(STRUCT_ENTRIES, structs);
        memory.add(TYPE_ENTRIES, types);
        memory.add(RELEASE_TEXT, page(self.release.clone()));
        memory
    }

    pub(super) fn read(&self) -> Result<super::Layout, HotspotError> {
        read_layout(&self.memory(), &Jvm::symbols(), BIAS).map(|(_, layout)| layout)
    }
}

/// Reads the synthetic JVM, which must fail, and fast whatever the memory holds.
fn refused(jvm: &Jvm) -> HotspotError {
    let started = Instant::now();
    let read = jvm.read();
    assert!(started.elapsed() < Duration::from_secs(5), "{read:?}");
    read.expect_err("a hostile table read")
}

#[test]
fn a_well_formed_table_reads_to_its_layout() {
    let jvm = jdk17();
    let (tables, layout) = read_layout(&jvm.memory(), &Jvm::symbols(), BIAS).unwrap();
    assert_eq!(tables.struct_entries, jvm.fields.len() as u64);
    assert_eq!(tables.type_entries, jvm.sizes.len() as u64);
    // Types the layout does not read are counted, not kept.
    assert!(!tables.fields.contains_key("Thread"));
    assert!(tables.size("Thread").is_none());
    assert_eq!(layout.version.major, 17);
    assert_eq!(
        (
            layout.version.minor,
            layout.version.security,
            layout.version.build
        ),
        (0, 15, 6)
    );
    assert_eq!(layout.version.release, "17.0.15+6-Debian-1deb12u1");
    assert_eq!(layout.unsigned5_excluded, 0);
    assert!(!layout.nmethod_uses_offsets);
    assert_eq!(layout.code_blob.code_begin, Place::Pointer(0x28));
    assert_eq!(layout.code_blob.code_end, Place::Pointer(0x30));
    assert_eq!(layout.code_blob.frame_size, 0x20);
    assert_eq!(layout.code_blob.size_of, 0x70);
    assert_eq!(layout.code_blob.mutable_data, None);
    assert_eq!(layout.code_cache.heaps, Heaps::Segmented(HEAPS));
    assert_eq!(layout.code_cache.low_bound, Some(LOW_BOUND));
    assert_eq!(layout.code_heap.segmap, 0x38);
    assert_eq!(layout.code_heap.log2_segment_size, 0x90);
    assert_eq!(layout.virtual_space.high_boundary, 0x08);
    assert_eq!(layout.virtual_space.high, Some(0x18));
    assert_eq!(layout.heap_block_size, 0x10);
    assert_eq!(layout.source_file, SourceFile::PoolIndex(0x40));
    assert_eq!(layout.const_method.flags, 0x2c);
    assert_eq!(layout.const_method.size_of, 0x38);
    assert_eq!(layout.method_const_method, 0x08);
    assert_eq!(layout.klass_name, 0x10);
    assert_eq!(layout.instance_klass_size, 0x1c0);
    // nmethod's own fields and those of its JDK 9-22 base.
    assert_eq!(layout.nmethod.size_of, 0x100);
    assert_eq!(layout.nmethod.compile_id, 0xe0);
    assert_eq!(layout.nmethod.method, 0x60);
    assert_eq!(layout.nmethod.deopt_handler, Place::Pointer(0x98));
    assert_eq!(layout.nmethod.scopes_data, Place::Pointer(0x80));
    assert_eq!(layout.nmethod.metadata_offset, Some(0xc0));
    assert_eq!(layout.nmethod.immutable_data, None);
    assert_eq!(layout.pc_desc.scope_decode_offset, 0x04);
    assert_eq!(layout.symbol.length, 0x04);
    assert_eq!(layout.symbol.body, 0x06);
    assert_eq!(layout.growable_array.data, 0x10);
    assert_eq!(layout.growable_array.len, 0x00);
    assert_eq!(layout.vm_version.release, RELEASE);
    assert_eq!(layout.vm_version.major, Some(VM_MAJOR));
}

#[test]
fn other_geometries_and_jdks_spellings_read_alike() {
    // A wider entry with its fields elsewhere: the geometry is the process's, not assumed.
    let mut jvm = jdk17();
    jvm.struct_geometry = [64, 56, 8, 0, 16, 24];
    jvm.type_geometry = [48, 40, 8];
    assert_eq!(jvm.read().unwrap(), jdk17().read().unwrap());

    // JDK 23's offsets, JDK 12's merged symbol length, JDK 21's flags, JDK 9's array base.
    let jvm = jdk17()
        .without("CodeBlob", "_code_begin")
        .without("CodeBlob", "_code_end")
        .with("CodeBlob", "_code_offset", Entry::Member(0x24))
        .without("CompiledMethod", "_deopt_handler_begin")
        .with("nmethod", "_deopt_handler_offset", Entry::Member(0xd8))
        .with("nmethod", "_immutable_data", Entry::Member(0xe8))
        .without("Symbol", "_length")
        .with("Symbol", "_length_and_refcount", Entry::Member(0x00))
        .without("ConstMethod", "_flags")
        .with("ConstMethod", "_flags._flags", Entry::Member(0x2e))
        .without("GrowableArrayBase", "_len")
        .with("GenericGrowableArray", "_len", Entry::Member(0x08));
    let layout = jvm.read().unwrap();
    assert!(layout.nmethod_uses_offsets);
    assert_eq!(layout.code_blob.code_begin, Place::Offset(0x24));
    assert_eq!(layout.code_blob.code_end, Place::Offset(0x1c));
    assert_eq!(layout.nmethod.deopt_handler, Place::Offset(0xd8));
    assert_eq!(layout.nmethod.immutable_data, Some(0xe8));
    assert_eq!(layout.symbol.length, 0x02);
    assert_eq!(layout.const_method.flags, 0x2e);
    assert_eq!(layout.growable_array.len, 0x08);

    // Offsets for the code but a pointer for the handler: not a layout any JDK has.
    let jvm = jdk17()
        .without("CodeBlob", "_code_begin")
        .without("CodeBlob", "_code_end")
        .with("CodeBlob", "_code_offset", Entry::Member(0x24));
    assert!(matches!(
        refused(&jvm),
        HotspotError::Layout(LayoutError::MixedPlaces { .. })
    ));

    // A string and numbers that disagree; then JDK 21's, whose UNSIGNED5 excludes the zero
    // byte (JDK 20 build 15 on).
    let mut jvm = jdk17();
    jvm.release = b"21.0.5+11-LTS\0".to_vec();
    assert!(matches!(
        refused(&jvm),
        HotspotError::Version(VersionError::Disagrees {
            parsed: 21,
            major: 17,
            ..
        })
    ));
    jvm.jdk_major = 21;
    let layout = jvm.read().unwrap();
    assert_eq!(layout.version.major, 21);
    assert_eq!(layout.unsigned5_excluded, 1);
}

#[test]
fn versions_parse_from_their_strings() {
    assert_eq!(
        parse_release("17.0.15+6-Debian-1deb12u1"),
        Some((17, 0, 15, 6))
    );
    assert_eq!(parse_release("21-ea+5"), Some((21, 0, 0, 5)));
    assert_eq!(parse_release("20.0.2+9"), Some((20, 0, 2, 9)));
    assert_eq!(parse_release("11.0.25"), Some((11, 0, 25, 0)));
    // JDK 8's is HotSpot's own numbering.
    assert_eq!(parse_release("25.402-b06"), None);
    assert_eq!(parse_release("17-beta+5"), Some((17, 0, 0, 5)));
    assert_eq!(parse_release("garbage"), None);
    assert_eq!(parse_release(""), None);
}

#[test]
fn strides_that_cannot_hold_an_entry_are_refused() {
    let mut jvm = jdk17();
    jvm.struct_geometry[0] = 0;
    assert!(matches!(
        refused(&jvm),
        HotspotError::Tables(VmStructsError::NotYetSetUp {
            table: "gHotSpotVMStructs"
        })
    ));
    assert!(refused(&jvm).is_not_yet_set_up());
    for stride in [4, 257, 1 << 40] {
        let mut jvm = jdk17();
        jvm.struct_geometry[0] = stride;
        assert_eq!(
            refused(&jvm),
            HotspotError::Tables(VmStructsError::Stride {
                table: "gHotSpotVMStructs",
                stride
            })
        );
    }
    // A stride of 32 cannot hold an address at 40.
    let mut jvm = jdk17();
    jvm.struct_geometry[0] = 32;
    assert_eq!(
        refused(&jvm),
        HotspotError::Tables(VmStructsError::FieldOutsideEntry {
            table: "gHotSpotVMStructs",
            field: "offset",
            offset: 32,
            stride: 32
        })
    );
    let mut jvm = jdk17();
    jvm.type_geometry[2] = u64::MAX - 3;
    assert!(matches!(
        refused(&jvm),
        HotspotError::Tables(VmStructsError::FieldOutsideEntry { field: "size", .. })
    ));
}

#[test]
fn a_table_without_its_end_stops_at_the_entry_bound() {
    // Entries past the bound, every one of a type the layout does not read: the walk ends at
    // the bound.
    let mut jvm = jdk17();
    jvm.terminated = false;
    jvm.fields = vec![("Thread", "_osthread", Entry::Member(8)); MAX_ENTRIES as usize + 1];
    assert_eq!(
        refused(&jvm),
        HotspotError::Tables(VmStructsError::NoEnd {
            table: "gHotSpotVMStructs"
        })
    );
    // Ending in unreadable memory instead.
    let mut jvm = jdk17();
    jvm.terminated = false;
    assert!(matches!(
        refused(&jvm),
        HotspotError::Tables(VmStructsError::Unreadable {
            what: "gHotSpotVMStructs",
            ..
        })
    ));
}

#[test]
fn names_are_bounded_and_must_end() {
    // One that reads to the end of its memory without a terminator.
    let memory = {
        let mut memory = Regions::new();
        memory.add(0x1000, b"_unterminated".to_vec());
        memory.add(0x2000, vec![b'a'; 4096]);
        let mut exact = vec![b'a'; MAX_NAME];
        exact.push(0);
        memory.add(0x4000, exact);
        memory
    };
    assert_eq!(
        read_c_string(&memory, 0x1000, MAX_NAME),
        Err(StringError::Unreadable)
    );
    assert_eq!(
        read_c_string(&memory, 0x2000, MAX_NAME),
        Err(StringError::TooLong)
    );
    assert_eq!(
        read_c_string(&memory, 0x4000, MAX_NAME).unwrap().len(),
        MAX_NAME
    );
    assert_eq!(
        read_c_string(&memory, 0x4001, MAX_NAME).unwrap().len(),
        MAX_NAME - 1
    );
    // A string ending just before a page the process has not mapped still reads.
    let mut memory = Regions::new();
    memory.add(0x3ffd, b"ab\0".to_vec());
    assert_eq!(read_c_string(&memory, 0x3ffd, MAX_NAME).unwrap(), "ab");

    // In a table: a type name too long, then one unreadable.
    let long: &'static str = Box::leak("x".repeat(MAX_NAME + 1).into_boxed_str());
    let jvm = jdk17().with(long, "_field", Entry::Member(0));
    assert!(matches!(
        refused(&jvm),
        HotspotError::Tables(VmStructsError::NameTooLong {
            table: "gHotSpotVMStructs",
            ..
        })
    ));
    let mut jvm = jdk17();
    jvm.names_moved = 0x1000_0000;
    assert!(matches!(
        refused(&jvm),
        HotspotError::Tables(VmStructsError::NameUnreadable { .. })
    ));
}

#[test]
fn unreadable_tables_are_refused() {
    let memory = jdk17().memory();
    // The globals alone, without the tables they point to.
    let symbols = Jvm::symbols();
    let mut globals_only = Regions::new();
    let mut globals = vec![0u8; 0x2000];
    assert!(memory.read(GLOBALS + BIAS, &mut globals));
    globals_only.add(GLOBALS + BIAS, globals);
    assert_eq!(
        read_layout(&globals_only, &symbols, BIAS).unwrap_err(),
        HotspotError::Tables(VmStructsError::Unreadable {
            what: "gHotSpotVMStructs",
            address: STRUCT_ENTRIES
        })
    );
    // Nothing at all where the globals should be.
    assert!(matches!(
        read_layout(&Regions::new(), &symbols, BIAS).unwrap_err(),
        HotspotError::Tables(VmStructsError::Unreadable { .. })
    ));
    // The version string's pointer leads nowhere.
    let mut jvm = jdk17();
    jvm.release = Vec::new();
    assert!(matches!(
        refused(&jvm),
        HotspotError::Version(VersionError::Release { .. })
    ));
}

#[test]
fn a_missing_field_is_named() {
    let err = refused(&jdk17().without("nmethod", "_compile_id"));
    assert_eq!(
        err,
        HotspotError::Layout(LayoutError::Missing {
            type_name: "nmethod",
            field: "_compile_id".into(),
            version: "17.0.15+6-Debian-1deb12u1".into(),
        })
    );
    assert_eq!(
        err.to_string(),
        "JVM 17.0.15+6-Debian-1deb12u1: no nmethod._compile_id in its vmStructs"
    );
    let err = refused(&jdk17().without("CompiledMethod", "_deopt_handler_begin"));
    assert!(
        err.to_string().contains(
            "nmethod._deopt_handler_begin or _deoptimize_offset or _deopt_handler_offset or \
             _deopt_handler_entry_offset"
        ),
        "{err}"
    );
    let err = refused(&jdk17().without("CodeCache", "_heaps"));
    assert!(
        err.to_string().contains("CodeCache._heaps or _heap"),
        "{err}"
    );
    let mut jvm = jdk17();
    jvm.sizes.retain(|&(t, _)| t != "HeapBlock");
    assert!(matches!(
        refused(&jvm),
        HotspotError::Layout(LayoutError::NoSize {
            type_name: "HeapBlock",
            ..
        })
    ));
    // A static where a member is read, a member past its class, a class too large.
    let err = refused(&jdk17().with("Klass", "_name", Entry::Static(0x10)));
    assert!(
        matches!(err, HotspotError::Layout(LayoutError::Kind { .. })),
        "{err}"
    );
    let err = refused(&jdk17().with("Klass", "_name", Entry::Member(0xc8)));
    assert!(
        matches!(err, HotspotError::Layout(LayoutError::PastSize { .. })),
        "{err}"
    );
    let mut jvm = jdk17();
    jvm.sizes.retain(|&(t, _)| t != "Symbol");
    jvm.sizes.push(("Symbol", 4096));
    assert!(matches!(
        refused(&jvm),
        HotspotError::Layout(LayoutError::TooLarge {
            type_name: "Symbol",
            ..
        })
    ));
    // A JVM whose JDK_Version is not yet set is starting.
    let mut jvm = jdk17();
    jvm.jdk_major = 0;
    assert!(refused(&jvm).is_not_yet_set_up());
}

/// A code cache of `count` heaps in `memory`, each of `size` bytes of code, with segment
/// shift `shift`, the array saying it holds `len`.
fn add_heaps(memory: &mut Regions, len: i32, count: usize, shift: i32, size: u64) {
    let mut growable = vec![0u8; 0x18];
    growable[0..4].copy_from_slice(&len.to_le_bytes());
    growable[0x10..0x18].copy_from_slice(&HEAP_ARRAY.to_le_bytes());
    let mut array = Vec::new();
    let mut structs = Vec::new();
    for i in 0..count as u64 {
        let heap = HEAP_STRUCTS + i * 0x100;
        array.extend_from_slice(&heap.to_le_bytes());
        let mut bytes = vec![0u8; 0x100];
        let code = CODE + i * 0x100_0000;
        let segmap = SEGMAPS + i * 0x100_0000;
        bytes[0x00..0x08].copy_from_slice(&code.to_le_bytes());
        bytes[0x08..0x10].copy_from_slice(&code.wrapping_add(size).to_le_bytes());
        bytes[0x38..0x40].copy_from_slice(&segmap.to_le_bytes());
        let map = (size >> shift.clamp(0, 63)).max(1);
        bytes[0x40..0x48].copy_from_slice(&segmap.wrapping_add(map).to_le_bytes());
        bytes[0x90..0x94].copy_from_slice(&shift.to_le_bytes());
        structs.extend_from_slice(&bytes);
    }
    memory.add(GROWABLE, growable);
    memory.add(HEAP_ARRAY, array);
    memory.add(HEAP_STRUCTS, structs);
}

fn heaps_of(len: i32, count: usize, shift: i32, size: u64) -> Result<super::CodeCache, HeapsError> {
    let jvm = jdk17();
    let (_, layout) = read_layout(&jvm.memory(), &Jvm::symbols(), BIAS).unwrap();
    let mut memory = jvm.memory();
    add_heaps(&mut memory, len, count, shift, size);
    let started = Instant::now();
    let read = code_cache(&memory, &layout, BIAS);
    assert!(started.elapsed() < Duration::from_secs(5));
    read
}

#[test]
fn the_code_heaps_read_with_their_segment_maps() {
    let cache = heaps_of(3, 3, 6, 0x10_0000).unwrap();
    assert_eq!(cache.heaps.len(), 3);
    assert_eq!(cache.segment_shift, 6);
    assert_eq!(cache.bounds, CODE..CODE + 0x1000_0000);
    assert_eq!(cache.heaps[1].code, CODE + 0x100_0000..CODE + 0x110_0000);
    assert_eq!(
        cache.heaps[2].segmap,
        SEGMAPS + 0x200_0000..SEGMAPS + 0x200_0000 + (0x10_0000 >> 6)
    );
}

#[test]
fn garbage_heaps_are_refused_and_unset_ones_awaited() {
    assert_eq!(
        heaps_of(1_000_000, 3, 6, 0x1000).unwrap_err(),
        HeapsError::Count(1_000_000)
    );
    assert_eq!(
        heaps_of(-1, 3, 6, 0x1000).unwrap_err(),
        HeapsError::Count(-1)
    );
    assert_eq!(
        heaps_of(MAX_HEAPS as i32 + 1, 3, 6, 0x1000).unwrap_err(),
        HeapsError::Count(17)
    );
    assert!(matches!(
        heaps_of(0, 3, 6, 0x1000).unwrap_err(),
        HeapsError::NotYetSetUp(_)
    ));
    // More heaps said than there are pointers to read.
    assert!(matches!(
        heaps_of(4, 3, 6, 0x1000).unwrap_err(),
        HeapsError::Unreadable { .. }
    ));
    // A heap whose high boundary is below its low one.
    assert!(matches!(
        heaps_of(2, 2, 6, 0u64.wrapping_sub(0x1000)).unwrap_err(),
        HeapsError::Inverted {
            index: 0,
            what: "code",
            ..
        }
    ));
    assert_eq!(
        heaps_of(3, 3, 40, 0x1000).unwrap_err(),
        HeapsError::SegmentShift {
            index: 0,
            shift: 40
        }
    );
    assert_eq!(
        heaps_of(3, 3, 4, 0x1000).unwrap_err(),
        HeapsError::SegmentShift { index: 0, shift: 4 }
    );

    // No heaps array yet.
    let jvm = jdk17();
    let (_, layout) = read_layout(&jvm.memory(), &Jvm::symbols(), BIAS).unwrap();
    let mut memory = Regions::new();
    memory.add(STATICS + BIAS + 0x10, vec![0; 8]);
    assert_eq!(
        code_cache(&memory, &layout, BIAS).unwrap_err(),
        HeapsError::NotYetSetUp("CodeCache::_heaps is null")
    );
}

#[test]
fn symbols_are_all_or_nothing() {
    use super::vmstructs::{STRUCT_SYMBOLS, TYPE_SYMBOLS};
    let parse = |names: &[&str]| {
        let functions: Vec<(&str, &[u8])> = names.iter().map(|&n| (n, &[0u8; 8][..])).collect();
        let data = crate::runtimes::image::test_elf(&functions);
        let elf = crate::binary::elf::Elf::parse(&data).unwrap();
        let image = crate::runtimes::image::Image::of(&elf);
        Symbols::of(&image)
    };
    assert_eq!(parse(&["main"]), Ok(None));
    assert_eq!(
        parse(&["gHotSpotVMStructs"]),
        Err(VmStructsError::Missing("gHotSpotVMStructEntryArrayStride"))
    );
    let mut all: Vec<&str> = STRUCT_SYMBOLS
        .iter()
        .chain(&TYPE_SYMBOLS)
        .copied()
        .collect();
    assert!(parse(&all).unwrap().is_some());
    all.retain(|&n| n != "gHotSpotVMTypeEntrySizeOffset");
    assert_eq!(
        parse(&all),
        Err(VmStructsError::Missing("gHotSpotVMTypeEntrySizeOffset"))
    );
}

#[test]
fn the_fuzz_entry_survives_what_it_is_given() {
    super::fuzz_one(&[]);
    super::fuzz_one(&[0xff; 200]);
    // Globals pointing at themselves: a table whose entries are the globals.
    let mut data = Vec::new();
    for word in [
        super::FUZZ_BASE,
        8,
        0,
        0,
        0,
        0,
        0,
        super::FUZZ_BASE,
        8,
        0,
        0,
    ] {
        data.extend_from_slice(&u64::to_le_bytes(word));
    }
    super::fuzz_one(&data);
}

/// Kills the JVM when the test ends, however it ends.
pub(super) struct Jdk(pub(super) std::process::Child);

impl Drop for Jdk {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The host's JVM `pid` read as the agent will: its libjvm from the file, its tables, layout
/// and code heaps from its memory, waiting until `deadline` for it to set them up.
pub(super) fn attach(
    pid: u32,
    deadline: Instant,
) -> (
    ProcessMemory,
    super::VmStructs,
    super::Layout,
    super::CodeCache,
) {
    // Until the JVM has loaded libjvm and set up its tables and code cache.
    let libjvm = loop {
        assert!(Instant::now() < deadline, "the JVM never mapped libjvm.so");
        if let Ok(maps) = crate::process::maps::ProcessMaps::read(pid) {
            if let Some(entry) = maps
                .entries()
                .iter()
                .find(|e| e.path.ends_with("/libjvm.so"))
            {
                break entry.clone();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let data = std::fs::read(&libjvm.path).unwrap();
    let elf = crate::binary::elf::Elf::parse(&data).unwrap();
    let image = crate::runtimes::image::Image::of(&elf);
    let symbols = Symbols::of(&image)
        .unwrap()
        .expect("libjvm defines the tables");
    let bias =
        crate::binary::elf::load_bias(&elf.executable_segments(), libjvm.start, libjvm.offset)
            .expect("libjvm's code mapping is one of its segments");
    let memory = ProcessMemory(pid);
    let (tables, layout) = loop {
        match read_layout(&memory, &symbols, bias) {
            Ok(read) => break read,
            Err(err) if err.is_not_yet_set_up() && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(err) => panic!("JDK 17's layout: {err}"),
        }
    };
    let cache = loop {
        match code_cache(&memory, &layout, bias) {
            Ok(cache) => break cache,
            Err(HeapsError::NotYetSetUp(_)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(err) => panic!("JDK 17's code cache: {err}"),
        }
    };
    (memory, tables, layout, cache)
}

/// The host's JDK 17 (Debian's openjdk-17), running a program that sleeps, read as the
/// agent will: its libjvm from the file, its tables and heaps from its memory.
#[test]
fn the_hosts_jdk_17_describes_itself() {
    let home = std::path::Path::new("/usr/lib/jvm/java-17-openjdk-amd64");
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("Sleep.java");
    std::fs::write(
        &source,
        "public class Sleep { public static void main(String[] a) throws Exception { \
         Thread.sleep(Long.parseLong(a[0]) * 1000); } }",
    )
    .unwrap();
    let flags = dir.path().join("flags");
    let jdk = Jdk(std::process::Command::new(home.join("bin/java"))
        .args([
            "-XX:+UnlockExperimentalVMOptions",
            "-XX:+UnlockDiagnosticVMOptions",
            "-XX:+PrintFlagsFinal",
        ])
        .arg(&source)
        .arg("60")
        .stdout(std::fs::File::create(&flags).unwrap())
        .spawn()
        .expect("running the host's JDK 17 (openjdk-17-jdk-headless)"));
    let pid = jdk.0.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    let (memory, tables, layout, cache) = attach(pid, deadline);
    eprintln!(
        "JDK 17: {:?}, {} vmStructs entries, {} vmTypes entries, heaps {:#x?}, segment shift {}, \
         bounds {:#x?}",
        layout.version.release,
        tables.struct_entries,
        tables.type_entries,
        cache.heaps,
        cache.segment_shift,
        cache.bounds
    );
    eprintln!("JDK 17 layout: {layout:#x?}");

    assert_eq!(layout.version.major, 17);
    assert!(
        layout.version.release.starts_with("17."),
        "{:?}",
        layout.version
    );
    // Several hundred of each (JDK 17.0.15 has 788 and 768), far within the bound.
    assert!(tables.struct_entries > 500 && tables.struct_entries < MAX_ENTRIES / 8);
    assert!(tables.type_entries > 500 && tables.type_entries < MAX_ENTRIES / 8);
    assert!(layout.code_blob.frame_size < layout.code_blob.size_of);
    assert!(layout.nmethod.compile_id < layout.nmethod.size_of);
    assert!(layout.symbol.length < layout.symbol.size_of);
    // JDK 9 to 22: pointers, a segmented cache, no UNSIGNED5 exclusion.
    assert!(!layout.nmethod_uses_offsets);
    assert!(matches!(layout.code_blob.code_begin, Place::Pointer(_)));
    assert!(matches!(layout.code_cache.heaps, Heaps::Segmented(_)));
    assert_eq!(layout.unsigned5_excluded, 0);

    // What the JVM says of its flags, to check what was read against: printed once it is
    // set up, which may be after its code cache is.
    let flags = loop {
        let text = std::fs::read_to_string(&flags).unwrap();
        if text.contains("SegmentedCodeCache") && text.contains("CodeCacheSegmentSize") {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "the JVM printed no flags: {text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let flag = |name: &str| {
        flags
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name))
            .and_then(|l| l.split_whitespace().nth(3).map(str::to_owned))
            .unwrap_or_else(|| panic!("-XX:+PrintFlagsFinal printed no {name}"))
    };
    let segment_size: u64 = flag("CodeCacheSegmentSize").parse().unwrap();
    assert_eq!(1u64 << cache.segment_shift, segment_size);
    let expected_heaps = if flag("SegmentedCodeCache") == "true" {
        3
    } else {
        1
    };
    assert_eq!(cache.heaps.len(), expected_heaps);
    for heap in &cache.heaps {
        assert!(heap.code.start < heap.code.end);
        assert!(cache.bounds.start <= heap.code.start && heap.code.end <= cache.bounds.end);
        let mut byte = [0u8; 1];
        assert!(
            memory.read(heap.segmap.start, &mut byte),
            "segment map at {:#x} unreadable",
            heap.segmap.start
        );
    }
}

#[path = "tests_names.rs"]
pub(super) mod names;

#[test]
fn symbols_decode_as_modified_utf8_and_garbage_does_not() {
    use super::method::{is_class_name, is_method_name, modified_utf8};
    assert_eq!(
        modified_utf8(b"java/lang/String").as_deref(),
        Some("java/lang/String")
    );
    assert_eq!(
        modified_utf8("caf\u{e9}".as_bytes()).as_deref(),
        Some("caf\u{e9}")
    );
    assert_eq!(
        modified_utf8("\u{4e2d}".as_bytes()).as_deref(),
        Some("\u{4e2d}")
    );
    // U+1F600 as its two surrogates, three bytes each.
    let surrogates = [0xed, 0xa0, 0xbd, 0xed, 0xb8, 0x80];
    assert_eq!(modified_utf8(&surrogates).as_deref(), Some("\u{1f600}"));
    // A NUL (C0 80) or any control character is no name; neither are stray bytes, a lone
    // surrogate, standard UTF-8's four-byte form, or a sequence cut short.
    for garbage in [
        &[0xc0, 0x80][..],
        b"a\x01b",
        b"\x7f",
        &[0xff, 0x41],
        &[0xed, 0xa0, 0xbd],
        &[0xf0, 0x9f, 0x98, 0x80],
        &[0xe4, 0xb8],
        &[0x80],
    ] {
        assert_eq!(modified_utf8(garbage), None, "{garbage:x?}");
    }
    for good in ["spin", "<init>", "<clinit>", "lambda$main$0", "access$000"] {
        assert!(is_method_name(good), "{good}");
    }
    for bad in ["", "a.b", "a;b", "[a", "a/b", "<spin>", "x<"] {
        assert!(!is_method_name(bad), "{bad}");
    }
    for good in [
        "java/lang/String",
        "CallTree$$Lambda$14/0x0000000800c03000",
        "CallTree$$Lambda+0x00007f6d98006a08",
        "[I",
        "[Ljava/lang/Object;",
        "Gen000001",
    ] {
        assert!(is_class_name(good), "{good}");
    }
    for bad in ["", "java.lang.String", "a;", "a//b", "/a", "["] {
        assert!(!is_class_name(bad), "{bad}");
    }
}
