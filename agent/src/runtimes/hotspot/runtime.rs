//! HotSpot as a [`Runtime`]: the registry's entry, what a JVM process gets in
//! `HOTSPOT_PROCS`, and which of its memory (the code heaps) HotSpot's BPF walk takes over.
//!
//! Unlike CPython, whose offsets come from the binary, a JVM describes itself only in its
//! memory, once its static constructors and its code cache's set-up have run: a process met
//! while starting is attached at a later look ([`Attach::Later`]). The layout, the costly
//! part (the tables' hundreds of entries), is read once per process and libjvm load address;
//! the code heaps' bounds, a handful of words, at every attach, as a JVM reserves them at
//! start and never moves them.

use std::{
    any::Any,
    collections::HashMap,
    sync::{Arc, Mutex},
};

use object::{Object, ObjectSymbol};
use scorch_common::{
    HotspotCount, HotspotProc, RuntimeId, HOTSPOT_BLOB_BYTES, HOTSPOT_COUNTS, HOTSPOT_HEAPS,
    HOTSPOT_NEW_BCP_SLOT, HOTSPOT_USES_OFFSETS,
};

use super::{
    heaps::{code_cache, CodeCache, HeapsError},
    layout::{Layout, Place},
    names::{HotspotNames, Process},
    read_layout,
    vmstructs::Symbols,
    HotspotError,
};
use crate::{
    pipeline::maps::RuntimeCounters,
    profile::FrameKind,
    runtimes::{
        image::Image, memory::ProcessMemory, Attach, Attachment, Binary, Names, Runtime, Support,
    },
};

/// `HOTSPOT_COUNTS_MAP`'s counters by [`HotspotCount`], frames first.
static COUNT_NAMES: [&str; HOTSPOT_COUNTS as usize] = {
    let mut names = [""; HOTSPOT_COUNTS as usize];
    let mut i = 0;
    while i < names.len() {
        names[i] = HotspotCount::ALL[i].name();
        i += 1;
    }
    names
};

/// Most processes whose layout a libjvm keeps at once; past it the cache starts again (a
/// layout is read again at the next attach of each).
const MAX_LAYOUTS: usize = 4096;

/// HotSpot JVMs, JDK 8 to 26 (the layouts `layout` knows).
#[derive(Debug, Clone, Copy, Default)]
pub struct Hotspot;

impl Runtime for Hotspot {
    fn id(&self) -> RuntimeId {
        RuntimeId::Hotspot
    }

    fn name(&self) -> &'static str {
        "hotspot"
    }

    fn frame_kind(&self) -> FrameKind {
        FrameKind::Jvm
    }

    fn procs_map(&self) -> &'static str {
        "HOTSPOT_PROCS"
    }

    /// The walk starts from the code a frame's pc is in, not from a thread's state.
    fn thread_pointer(&self) -> bool {
        false
    }

    fn counters(&self) -> RuntimeCounters {
        RuntimeCounters {
            runtime: self.name(),
            map: "HOTSPOT_COUNTS_MAP",
            names: &COUNT_NAMES,
        }
    }

    /// libjvm exports its tables for the serviceability agent: a dynamic symbol. Only an
    /// x86-64 one: the BPF walk knows that architecture's frame layouts (the interpreter's
    /// slots, the return address above the saved frame pointer) and not arm64's yet, whose
    /// JVMs are left to the native walk rather than read wrong.
    fn may_be(&self, elf: &object::File) -> bool {
        elf.architecture() == object::Architecture::X86_64
            && elf
                .dynamic_symbols()
                .any(|s| s.name_bytes() == Ok(b"gHotSpotVMStructs"))
    }

    fn detect(&self, image: &Image) -> Result<Option<Arc<dyn Binary>>, String> {
        match Symbols::of(image) {
            Ok(Some(symbols)) => Ok(Some(Arc::new(Jvm {
                symbols,
                layouts: Mutex::default(),
            }))),
            Ok(None) => Ok(None),
            Err(err) => Err(err.to_string()),
        }
    }

    fn names(&self) -> Box<dyn Names> {
        Box::new(HotspotNames::default())
    }
}

/// What reading a JVM's layout gave.
type LayoutRead = Result<Arc<Layout>, HotspotError>;

/// A libjvm: where its tables' globals are, and what was read from the processes loading
/// it, by (process, load bias).
#[derive(Debug)]
struct Jvm {
    symbols: Symbols,
    layouts: Mutex<HashMap<(u32, u64), LayoutRead>>,
}

impl Jvm {
    /// The layout of the JVM `pid` runs from this libjvm at `bias`, read at its first attach.
    /// A failure is kept as well, but for a JVM still starting: a process whose tables lie
    /// is described again at each of its events, and reading them again each time (up to the
    /// readers' bounds) would be its way to spend the agent's CPU.
    fn layout(&self, pid: u32, bias: u64) -> Result<Arc<Layout>, HotspotError> {
        let mut layouts = self.layouts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(read) = layouts.get(&(pid, bias)) {
            return read.clone();
        }
        let read = read_layout(&ProcessMemory(pid), &self.symbols, bias).map(|(_, l)| Arc::new(l));
        if matches!(&read, Err(err) if err.is_not_yet_set_up()) {
            return read;
        }
        if layouts.len() >= MAX_LAYOUTS {
            layouts.clear();
        }
        layouts.insert((pid, bias), read.clone());
        read
    }
}

impl Binary for Jvm {
    fn describe(&self) -> String {
        "HotSpot libjvm".into()
    }

    fn attach(&self, pid: u32, bias: u64, _: &Support) -> Attach {
        let layout = match self.layout(pid, bias) {
            Ok(layout) => layout,
            Err(err) if err.is_not_yet_set_up() => return Attach::Later,
            Err(err) => return Attach::Unsupported(err.to_string()),
        };
        let cache = match code_cache(&ProcessMemory(pid), &layout, bias) {
            Ok(cache) => cache,
            Err(HeapsError::NotYetSetUp(_)) => return Attach::Later,
            Err(err) => return Attach::Unsupported(err.to_string()),
        };
        let entry = match hotspot_proc(&layout, &cache, bias) {
            Ok(entry) => entry,
            Err(err) => {
                return Attach::Unsupported(format!("JVM {}: {err}", layout.version.release))
            }
        };
        let count = entry.heap_count as usize;
        Attach::Attached(Attachment {
            owned: (0..count)
                .map(|i| entry.heap_start[i]..entry.heap_end[i])
                .collect(),
            anonymous_code: false,
            entry: entry_bytes(&entry),
            process: Arc::new(Process {
                layout,
                collected_heap: entry.collected_heap,
            }) as Arc<dyn Any + Send + Sync>,
        })
    }
}

/// Why a JVM's layout does not fit what the BPF walk reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error(
        "{field} at byte {offset} of a CodeBlob, past the {HOTSPOT_BLOB_BYTES} the walk reads"
    )]
    OutsideBlob { field: &'static str, offset: u64 },
    #[error("{field} is at byte {offset}, past what the walk's u16 offsets hold")]
    TooFar { field: &'static str, offset: u64 },
    #[error("{count} code heaps, more than the walk's {HOTSPOT_HEAPS}")]
    Heaps { count: usize },
    #[error("the code begins at a {code} but the deoptimisation handler at a {deopt}")]
    MixedPlaces {
        code: &'static str,
        deopt: &'static str,
    },
}

/// The `HOTSPOT_PROCS` value of a JVM with `layout` and code heaps `cache`, its libjvm at
/// `bias`: every field the walk reads of a blob checked to lie in the bytes it reads at once.
pub fn hotspot_proc(
    layout: &Layout,
    cache: &CodeCache,
    bias: u64,
) -> Result<HotspotProc, EntryError> {
    if cache.heaps.len() > HOTSPOT_HEAPS {
        return Err(EntryError::Heaps {
            count: cache.heaps.len(),
        });
    }
    let (code_begin, uses_offsets) = place(layout.code_blob.code_begin);
    let (deopt, deopt_offsets) = place(layout.nmethod.deopt_handler);
    if uses_offsets != deopt_offsets {
        let kind = |offsets| if offsets { "u32 offset" } else { "pointer" };
        return Err(EntryError::MixedPlaces {
            code: kind(uses_offsets),
            deopt: kind(deopt_offsets),
        });
    }
    let blob = |field: &'static str, offset: u64, width: u64| {
        if offset + width > HOTSPOT_BLOB_BYTES as u64 {
            Err(EntryError::OutsideBlob { field, offset })
        } else {
            Ok(offset as u16)
        }
    };
    let small = |field: &'static str, offset: u64| {
        u16::try_from(offset).map_err(|_| EntryError::TooFar { field, offset })
    };
    let wide = |field: &'static str, offset: u64| {
        u32::try_from(offset).map_err(|_| EntryError::TooFar { field, offset })
    };
    let mut entry = HotspotProc {
        heap_count: cache.heaps.len() as u32,
        segment_shift: cache.segment_shift,
        heapblock_size: wide("sizeof(HeapBlock)", layout.heap_block_size)?,
        cmethod_size: wide("sizeof(ConstMethod)", layout.const_method.size_of)?,
        method_constmethod: small("Method::_constMethod", layout.method_const_method)?,
        codeblob_name: blob("CodeBlob::_name", layout.code_blob.name, 8)?,
        codeblob_code_begin: blob(
            "CodeBlob's code begin",
            code_begin,
            if uses_offsets { 4 } else { 8 },
        )?,
        codeblob_frame_size: blob("CodeBlob::_frame_size", layout.code_blob.frame_size, 4)?,
        codeblob_frame_complete: blob(
            "CodeBlob::_frame_complete_offset",
            layout.code_blob.frame_complete_offset,
            4,
        )?,
        nmethod_compile_id: blob("nmethod::_compile_id", layout.nmethod.compile_id, 4)?,
        nmethod_orig_pc_offset: blob("nmethod::_orig_pc_offset", layout.nmethod.orig_pc_offset, 4)?,
        nmethod_deopt_handler: blob(
            "nmethod's deoptimisation handler",
            deopt,
            if uses_offsets { 4 } else { 8 },
        )?,
        ..HotspotProc::default()
    };
    if uses_offsets {
        entry.flags |= HOTSPOT_USES_OFFSETS;
    }
    if let Some(collections) = layout.collections {
        entry.collected_heap = collections.heap.wrapping_add(bias);
        entry.total_collections = wide("CollectedHeap::_total_collections", collections.total)?;
    }
    // JDK 9 put the method's mirror in the interpreter's frame, a word above the bcp.
    if layout.version.major >= 9 {
        entry.flags |= HOTSPOT_NEW_BCP_SLOT;
    }
    for (i, heap) in cache.heaps.iter().enumerate() {
        entry.heap_start[i] = heap.code.start;
        entry.heap_end[i] = heap.code.end;
        entry.heap_segmap[i] = heap.segmap.start;
    }
    Ok(entry)
}

/// A code address's field, and whether it is a u32 offset from the blob.
fn place(place: Place) -> (u64, bool) {
    match place {
        Place::Pointer(at) => (at, false),
        Place::Offset(at) => (at, true),
    }
}

/// `value` as the BPF map holds it.
fn entry_bytes(value: &HotspotProc) -> Vec<u8> {
    // SAFETY: `HotspotProc` is `repr(C)` plain data with explicit padding (it is `aya::Pod`),
    // so all its bytes are initialised; the slice lives only as long as `value`.
    unsafe {
        std::slice::from_raw_parts(
            std::ptr::from_ref(value).cast::<u8>(),
            std::mem::size_of::<HotspotProc>(),
        )
    }
    .to_vec()
}

#[cfg(test)]
mod tests {
    use super::super::heaps::CodeHeap;
    use super::*;

    fn cache(heaps: usize) -> CodeCache {
        CodeCache {
            heaps: (0..heaps as u64)
                .map(|i| CodeHeap {
                    code: 0x7f00_0000_0000 + i * 0x100_0000..0x7f00_0080_0000 + i * 0x100_0000,
                    segmap: 0x5500_0000_0000 + i * 0x1_0000..0x5500_0000_8000 + i * 0x1_0000,
                })
                .collect(),
            segment_shift: 7,
            bounds: 0x7f00_0000_0000..0x7f00_0380_0000,
        }
    }

    #[test]
    fn a_jdk17_layout_gives_the_walk_its_heaps_offsets_and_flags() {
        let layout = super::super::fuzz_layout(0);
        let entry = hotspot_proc(&layout, &cache(3), 0x7f00).unwrap();
        assert_eq!(entry.heap_count, 3);
        assert_eq!(entry.segment_shift, 7);
        assert_eq!(entry.heap_start[1], 0x7f00_0100_0000);
        assert_eq!(entry.heap_end[2], 0x7f00_0280_0000);
        assert_eq!(entry.heap_segmap[2], 0x5500_0002_0000);
        assert_eq!(entry.heap_start[3], 0);
        assert_eq!(entry.heapblock_size, 0x10);
        assert_eq!(entry.cmethod_size, 0x38);
        assert_eq!(entry.method_constmethod, 0x08);
        assert_eq!(entry.codeblob_name, 0x08);
        assert_eq!(entry.codeblob_code_begin, 0x28);
        assert_eq!(entry.codeblob_frame_size, 0x20);
        assert_eq!(entry.codeblob_frame_complete, 0x18);
        assert_eq!(entry.nmethod_compile_id, 0xe0);
        assert_eq!(entry.nmethod_orig_pc_offset, 0xd4);
        assert_eq!(entry.nmethod_deopt_handler, 0x98);
        // JDK 17: pointers, and the bcp below the mirror's slot.
        assert_eq!(entry.flags, HOTSPOT_NEW_BCP_SLOT);
        // The collections count's place, in the process's addresses.
        assert_eq!(
            (entry.collected_heap, entry.total_collections),
            (0x7f18, 0x28)
        );
        assert_eq!(
            entry_bytes(&entry).len(),
            std::mem::size_of::<HotspotProc>()
        );
    }

    #[test]
    fn jdk8_and_jdk23_forms_set_their_flags() {
        let mut layout = super::super::fuzz_layout(0);
        layout.version.major = 8;
        layout.code_blob.code_begin = Place::Offset(0x2c);
        layout.nmethod.deopt_handler = Place::Offset(0xd8);
        let entry = hotspot_proc(&layout, &cache(1), 0x7f00).unwrap();
        assert_eq!(entry.flags, HOTSPOT_USES_OFFSETS);
        assert_eq!(entry.codeblob_code_begin, 0x2c);
    }

    #[test]
    fn what_the_walk_cannot_read_is_refused_by_name() {
        let mut layout = super::super::fuzz_layout(0);
        layout.nmethod.compile_id = HOTSPOT_BLOB_BYTES as u64 - 2;
        assert_eq!(
            hotspot_proc(&layout, &cache(3), 0x7f00),
            Err(EntryError::OutsideBlob {
                field: "nmethod::_compile_id",
                offset: HOTSPOT_BLOB_BYTES as u64 - 2
            })
        );
        let mut layout = super::super::fuzz_layout(0);
        layout.method_const_method = 0x1_0000;
        assert!(matches!(
            hotspot_proc(&layout, &cache(3), 0x7f00),
            Err(EntryError::TooFar { .. })
        ));
        let mut layout = super::super::fuzz_layout(0);
        layout.code_blob.code_begin = Place::Offset(0x2c);
        assert!(matches!(
            hotspot_proc(&layout, &cache(3), 0x7f00),
            Err(EntryError::MixedPlaces { .. })
        ));
        let layout = super::super::fuzz_layout(0);
        assert_eq!(
            hotspot_proc(&layout, &cache(HOTSPOT_HEAPS + 1), 0x7f00),
            Err(EntryError::Heaps {
                count: HOTSPOT_HEAPS + 1
            })
        );
    }
}
