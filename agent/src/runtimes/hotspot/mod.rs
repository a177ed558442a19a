//! HotSpot JVMs: the layout of a JVM's classes and its code cache, read from the JVM itself,
//! which walking its Java frames in BPF and naming them need (issue 49).
//!
//! Every HotSpot libjvm.so describes itself for the serviceability agent: `gHotSpotVMStructs`
//! gives each field of each class it names (an offset, or a static's address) and
//! `gHotSpotVMTypes` each type's size, so a walker needs no table of offsets per JDK build,
//! only the names of what it reads under each JDK's spelling (`layout`).
//! - **Per binary** ([`Symbols::of`], from the ELF's symbols): where the tables' pointers and
//!   the globals giving their entries' geometry are. A binary defining neither table is not a
//!   JVM.
//! - **Per process** ([`read_layout`], then [`heaps::code_cache`]): the tables themselves,
//!   walked in the process's memory (`vmstructs`: the geometry is set by a static constructor
//!   in Debian's builds, so even it is read there), the JVM's version (`version`), and a
//!   typed [`Layout`] (`layout`, pure); then the code cache's heaps and segment maps, once
//!   the JVM has set them up.
//! - **Per frame** ([`HotspotNames`], `names`): the two words the BPF walk writes for a Java
//!   frame, checked against their cookie and named from the process's memory (`method`: an
//!   interpreted `Method*` and bci; `nmethod`: a compiled pc and the methods inlined there;
//!   a stub's blob name), while the process runs.
//! - **The registry's entry** ([`Hotspot`], `runtime`): `--jvm auto` recognises a libjvm,
//!   and a process's `HOTSPOT_PROCS` value (from its layout and code heaps) hands its code
//!   heaps to the BPF walk (agent-ebpf/src/runtimes/hotspot.rs).

pub mod heaps;
pub mod layout;
pub mod method;
pub mod names;
pub mod nmethod;
pub mod runtime;
pub mod unsigned5;
pub mod version;
pub mod vmstructs;

#[cfg(test)]
mod tests;

pub use heaps::{code_cache, CodeCache, HeapsError};
pub use layout::{Layout, LayoutError};
pub use method::{demangle_signature, name_method, JavaFrame, MethodError};
pub use names::{name_frame, HotspotNames, Process, UNKNOWN_FRAME};
pub use nmethod::{name_compiled, NmethodError};
pub use runtime::{hotspot_proc, EntryError, Hotspot};
pub use version::{Version, VersionError};
pub use vmstructs::{Symbols, VmStructs, VmStructsError};

use crate::runtimes::memory::{Memory, Regions};

/// Whether Java frames are walked (`--jvm`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum JvmMode {
    /// HotSpot JVMs are recognised from their libjvm and their Java frames (interpreted,
    /// compiled with what they inlined, and the JVM's stubs) walked in BPF, in place of the
    /// code cache's unnamed addresses.
    #[default]
    Auto,
    /// JVMs are not looked for: their Java code shows as unnamed addresses.
    Off,
}

/// Why a JVM's layout was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HotspotError {
    #[error(transparent)]
    Tables(#[from] VmStructsError),
    #[error(transparent)]
    Version(#[from] VersionError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
}

impl HotspotError {
    /// Whether the JVM was met while starting: a later look may succeed.
    pub fn is_not_yet_set_up(&self) -> bool {
        matches!(
            self,
            HotspotError::Tables(VmStructsError::NotYetSetUp { .. })
                | HotspotError::Version(VersionError::NotYetSet)
        )
    }
}

/// Whether [`vmstructs::read`] keeps a type's entries: those [`layout::layout`] reads.
pub fn wanted(type_name: &str) -> bool {
    layout::TYPES.contains(&type_name)
}

/// The tables and layout of the JVM whose libjvm (with `symbols`) is at `bias` in `memory`.
pub fn read_layout(
    memory: &dyn Memory,
    symbols: &Symbols,
    bias: u64,
) -> Result<(VmStructs, Layout), HotspotError> {
    let tables = vmstructs::read(memory, symbols, bias, &wanted)?;
    let version = version::read(memory, &tables, bias)?;
    let layout = layout::layout(&tables, version)?;
    Ok((tables, layout))
}

/// Where the fuzz target's input is, as a process's memory.
pub const FUZZ_BASE: u64 = 0x10_000;

/// Arbitrary bytes as a JVM's memory: the input lies at [`FUZZ_BASE`], and the eleven table
/// globals are its first eleven words (libjvm loaded at bias 0), so the input chooses the
/// tables' pointers and geometry. Reads the tables, the layout and the heaps; must never
/// panic, and ends within the readers' bounds whatever the bytes.
pub fn fuzz_one(data: &[u8]) {
    let mut memory = Regions::new();
    memory.add(FUZZ_BASE, data.to_vec());
    let symbols = Symbols::consecutive(FUZZ_BASE);
    if let Ok((_, layout)) = read_layout(&memory, &symbols, 0) {
        let _ = heaps::code_cache(&memory, &layout, 0);
    }
}

/// A JDK 17-like layout (offsets made up, forms JDK 17's) for the naming fuzz target.
fn fuzz_layout(excluded: u8) -> Layout {
    use layout::*;
    Layout {
        version: Version {
            major: 17,
            minor: 0,
            security: 0,
            build: 0,
            release: "17.0.0".into(),
        },
        unsigned5_excluded: excluded,
        nmethod_uses_offsets: false,
        code_blob: CodeBlob {
            size_of: 0x70,
            name: 0x08,
            frame_complete_offset: 0x18,
            frame_size: 0x20,
            code_begin: Place::Pointer(0x28),
            code_end: Place::Pointer(0x30),
            size: 0x10,
            relocation_size: None,
            mutable_data_size: None,
            mutable_data: None,
        },
        code_cache: layout::CodeCache {
            heaps: Heaps::Segmented(0),
            low_bound: None,
            high_bound: None,
        },
        code_heap: layout::CodeHeap {
            size_of: 0xa0,
            log2_segment_size: 0x90,
            memory: 0,
            segmap: 0x38,
        },
        virtual_space: VirtualSpace {
            low_boundary: 0,
            high_boundary: 8,
            low: None,
            high: None,
        },
        heap_block_size: 0x10,
        constant_pool: ConstantPool {
            size_of: 0x50,
            pool_holder: 0x20,
        },
        source_file: SourceFile::PoolIndex(0x40),
        const_method: ConstMethod {
            size_of: 0x38,
            constants: 0x08,
            code_size: 0x28,
            flags: 0x2c,
            name_index: 0x30,
            signature_index: 0x32,
        },
        method_const_method: 0x08,
        instance_klass_size: 0x1c0,
        klass_name: 0x10,
        nmethod: Nmethod {
            size_of: 0x100,
            compile_id: 0xe0,
            metadata_offset: Some(0xc0),
            scopes_pcs_offset: 0xc8,
            scopes_data: Place::Pointer(0x80),
            dependencies_offset: Some(0xcc),
            immutable_data: None,
            immutable_data_size: None,
            immutable_data_ref_count_offset: None,
            orig_pc_offset: 0xd4,
            deopt_handler: Place::Pointer(0x98),
            method: 0x60,
        },
        pc_desc: PcDesc {
            size_of: 0x10,
            pc_offset: 0,
            scope_decode_offset: 4,
        },
        symbol: Symbol {
            size_of: 0x10,
            body: 0x06,
            length: 0x04,
        },
        growable_array: GrowableArray {
            size_of: 0x18,
            data: 0x10,
            len: 0,
        },
        vm_version: VmVersion {
            release: 0,
            major: None,
            minor: None,
            security: None,
            build: None,
        },
        collections: Some(Collections {
            heap: 0x18,
            total: 0x28,
        }),
    }
}

/// Arbitrary bytes as what the naming reads: UNSIGNED5 values, a line stream and scope
/// chains over the bytes themselves, then a `Method*` and an `nmethod*` at [`FUZZ_BASE`],
/// whose pointers are the input's words (so the input chooses the graph), and a frame of
/// each subtype there as the walk's words ([`name_frame`]: a stub's name too). The first
/// byte chooses the exclusion count. Must never panic, and ends within the readers' bounds.
pub fn fuzz_names(data: &[u8]) {
    let excluded = data.first().map_or(0, |b| b & 1);
    let mut reader = unsigned5::Reader::new(data, excluded);
    while reader.uint().is_ok() {}
    let _ = method::line_of(data, excluded, 0);
    let _ = method::line_of(data, excluded, u32::MAX);
    let _ = demangle_signature(&String::from_utf8_lossy(data));
    let layout = fuzz_layout(excluded);
    let half = data.len() / 2;
    let info = nmethod::DebugInfo {
        metadata: data[..half / 2].to_vec(),
        scopes_data: data[half / 2..half].to_vec(),
        scopes_pcs: data[half..].to_vec(),
    };
    for pc in [0, 0x40, u32::MAX] {
        let _ = nmethod::scopes(&info, &layout, FUZZ_BASE, pc);
    }
    let mut memory = Regions::new();
    memory.add(FUZZ_BASE, data.to_vec());
    let _ = name_method(&memory, &layout, FUZZ_BASE, 0);
    let id = data
        .get(4..8)
        .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let _ = name_compiled(&memory, &layout, FUZZ_BASE, 0x40, id);
    // The frame words as the walk writes them, the input's words as cookies.
    let cookie = data
        .get(8..12)
        .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    for subtype in [
        scorch_common::HotspotSubtype::Interpreted,
        scorch_common::HotspotSubtype::Compiled,
        scorch_common::HotspotSubtype::Stub,
        scorch_common::HotspotSubtype::Vtable,
    ] {
        for (detail, cookie) in [(0, cookie), (names::UNKNOWN_BCI, id)] {
            let [word, more] =
                scorch_common::hotspot_frame_words(subtype, FUZZ_BASE, detail, cookie);
            let _ = name_frame(&memory, &layout, word, scorch_common::word_payload(more));
        }
    }
}
