//! HotSpot JVMs: the layout of a JVM's classes and its code cache, read from the JVM itself,
//! which walking its Java frames in BPF and naming them will need (issue 49).
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
//!   typed [`Layout`] (`layout`, pure); then the code cache's heaps and segment maps, once the JVM has set them up.
//!
//! HotSpot is not yet in the runtimes' `Registry`: nothing here is called by the loader. Its
//! BPF walk (the code heaps' frames, from the segment map to the blob and its frame) lands
//! next, and the registry's entry with it.

pub mod heaps;
pub mod layout;
pub mod version;
pub mod vmstructs;

#[cfg(test)]
mod tests;

pub use heaps::{code_cache, CodeCache, HeapsError};
pub use layout::{Layout, LayoutError};
pub use version::{Version, VersionError};
pub use vmstructs::{Memory, ProcessMemory, Regions, Symbols, VmStructs, VmStructsError};

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
    let word = |i: u64| FUZZ_BASE + 8 * i;
    let symbols = Symbols {
        structs: vmstructs::StructSymbols {
            table: word(0),
            stride: word(1),
            type_name: word(2),
            field_name: word(3),
            is_static: word(4),
            offset: word(5),
            address: word(6),
        },
        types: vmstructs::TypeSymbols {
            table: word(7),
            stride: word(8),
            type_name: word(9),
            size: word(10),
        },
    };
    if let Ok((_, layout)) = read_layout(&memory, &symbols, 0) {
        let _ = heaps::code_cache(&memory, &layout, 0);
    }
}
