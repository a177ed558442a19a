//! Leaptiering's dispatch table (V8 13, Node 24): where a function's code is.
//!
//! A `JSFunction` keeps a 32-bit handle, not its `Code`: the entry's index shifted left by
//! [`HANDLE_SHIFT`]. Each entry is 16 bytes, the code's entry point then its code word (the
//! tagged `Code` pointer shifted left by 16, over a mark bit and the parameter count). One
//! table serves a process (its default isolate group's), reserved once at V8's start and
//! never moved, so the agent finds it once per process and hands its address to the walk:
//! - **Per binary** ([`group_static`]): the exported `v8::IsolateGroup::GetDefault()` reads
//!   the default group's pointer from a static; its code says where.
//! - **Per process** ([`find_table`]): the group holds the table's address among its words
//!   (an internal layout no constant exports). Every word that could be a table (aligned
//!   as V8 reserves them) is tried: the one whose entries in use all hold `Code`, at least
//!   one at the entry point it gives, is it. A process that has not set V8 up yet has no
//!   group, or no entry in use: it is asked again later.

use scorch_common::{V8_DISPATCH_CODE_SHIFT, V8_DISPATCH_ENTRY_BYTES};

use super::{
    layout::{InstructionStart, Layout},
    strings::{instance_type, untag},
};
use crate::{
    arch::{loaded_pointer, NoDecoder, Place},
    runtimes::{
        image::{Image, ImageError},
        memory::{read_u64, Memory},
    },
};

/// A handle is its entry's index shifted left by this: V8 13's on 64-bit hosts, whose table
/// reserves 2^24 entries (256 MiB). A build whose handles are shifted otherwise finds no
/// `Code` at the entries the walk computes, and its frames are named without their code.
pub const HANDLE_SHIFT: u8 = 8;

/// The exported accessor whose code reads the default group's pointer.
const GET_DEFAULT: &str = "_ZN2v812IsolateGroup10GetDefaultEv";

/// V8 reserves its tables aligned to their 64 KiB segments.
const SEGMENT: u64 = 64 << 10;
/// Most bytes of the group read for the table's address: the group is a few pages (12.6 KiB
/// in V8 13.6).
pub const MAX_GROUP_BYTES: usize = 32 << 10;
/// Entries read at the start of each of the first two segments: the first segment may be
/// kept for read-only entries and be empty.
const PROBED_ENTRIES: usize = 16;
/// Most candidate words tried.
const MAX_CANDIDATES: usize = 64;

/// Why the dispatch table is not found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DispatchError {
    #[error("v8::IsolateGroup::GetDefault is not exported")]
    NoAccessor,
    #[error("v8::IsolateGroup::GetDefault reads no static pointer in a form known here")]
    NoStatic,
    /// An [`ImageError`], as text.
    #[error("{0}")]
    Image(String),
    #[error(transparent)]
    NoDecoder(#[from] NoDecoder),
    #[error("the default isolate group at {0:#x} is unreadable")]
    UnreadableGroup(u64),
    #[error("no word of the isolate group at {0:#x} is a dispatch table")]
    NoTable(u64),
}

/// Where the default isolate group's pointer is in `image` (its own addresses).
pub fn group_static(image: &Image) -> Result<u64, DispatchError> {
    let function = image.symbol(GET_DEFAULT).ok_or(DispatchError::NoAccessor)?;
    let image_error = |err: ImageError| DispatchError::Image(err.to_string());
    let code = image
        .code("v8::IsolateGroup::GetDefault", function)
        .map_err(image_error)?;
    match loaded_pointer(image.architecture(), code, function.address)? {
        Some(Place::Fixed(address)) => Ok(address),
        Some(Place::Pointed { slot, offset }) => Ok(image
            .pointer_at("the GOT slot IsolateGroup::GetDefault reads", slot)
            .map_err(image_error)?
            .wrapping_add(offset)),
        None => Err(DispatchError::NoStatic),
    }
}

/// What a process's look for its table found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// The table's first entry.
    At(u64),
    /// V8 is not set up yet: no group, or no entry in use in a table-shaped word.
    NotYet,
}

/// The dispatch table of the process whose default group's pointer is at `group_static`
/// (its address in the process).
pub fn find_table(
    memory: &dyn Memory,
    layout: &Layout,
    group_static: u64,
) -> Result<Table, DispatchError> {
    let group = match read_u64(memory, group_static) {
        Some(0) => return Ok(Table::NotYet),
        Some(group) => group,
        None => return Err(DispatchError::UnreadableGroup(group_static)),
    };
    let words = group_words(memory, group);
    if words.is_empty() {
        return Err(DispatchError::UnreadableGroup(group));
    }
    let mut candidates: Vec<u64> = words
        .into_iter()
        .filter(|&w| w != 0 && w % SEGMENT == 0)
        .collect();
    candidates.sort_unstable();
    candidates.dedup();
    let mut empty = false;
    for &candidate in candidates.iter().take(MAX_CANDIDATES) {
        match probe(memory, layout, candidate) {
            Probe::Table => return Ok(Table::At(candidate)),
            Probe::Empty => empty = true,
            Probe::Not => {}
        }
    }
    if empty {
        Ok(Table::NotYet)
    } else {
        Err(DispatchError::NoTable(group))
    }
}

/// The group's words, up to [`MAX_GROUP_BYTES`] or its first unreadable page.
fn group_words(memory: &dyn Memory, group: u64) -> Vec<u64> {
    const PAGE: u64 = 4096;
    let mut bytes = Vec::new();
    let mut at = group;
    while bytes.len() < MAX_GROUP_BYTES {
        let to_page = (PAGE - at % PAGE) as usize;
        let mut chunk = vec![0u8; to_page.min(MAX_GROUP_BYTES - bytes.len())];
        if !memory.read(at, &mut chunk) {
            break;
        }
        at = at.wrapping_add(chunk.len() as u64);
        bytes.extend_from_slice(&chunk);
    }
    bytes
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect()
}

enum Probe {
    Table,
    /// Readable and table-shaped, no entry in use yet.
    Empty,
    Not,
}

/// Whether `candidate` is a dispatch table: its entries in use each hold a `Code`, at least
/// one of them entered at its instructions' start (a function waiting to be tiered up is
/// entered elsewhere).
fn probe(memory: &dyn Memory, layout: &Layout, candidate: u64) -> Probe {
    let mut used = 0;
    let mut entered = 0;
    for segment in 0..2 {
        let at = candidate.wrapping_add(segment * SEGMENT);
        let mut bytes = vec![0u8; PROBED_ENTRIES * V8_DISPATCH_ENTRY_BYTES as usize];
        if !memory.read(at, &mut bytes) {
            return Probe::Not;
        }
        for entry in bytes.chunks_exact(V8_DISPATCH_ENTRY_BYTES as usize) {
            let entry_point = u64::from_le_bytes(entry[..8].try_into().expect("8 bytes"));
            let word = u64::from_le_bytes(entry[8..].try_into().expect("8 bytes"));
            if word >> V8_DISPATCH_CODE_SHIFT == 0 {
                continue;
            }
            used += 1;
            let tagged = (word >> V8_DISPATCH_CODE_SHIFT) | layout.tagging.heap_object_tag;
            let Ok(code) = untag(layout, tagged) else {
                return Probe::Not;
            };
            if instance_type(memory, layout, code).ok() != Some(layout.types.code) {
                return Probe::Not;
            }
            let start = match layout.code.instruction_start {
                InstructionStart::Pointer(at) => read_u64(memory, code.wrapping_add(u64::from(at))),
                InstructionStart::Inline(at) => Some(code.wrapping_add(u64::from(at))),
            };
            if start == Some(entry_point) {
                entered += 1;
            }
        }
    }
    match (used, entered) {
        (0, _) => Probe::Empty,
        (_, 0) => Probe::Not,
        _ => Probe::Table,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtimes::memory::Regions;

    /// A V8 13 layout's fields the probe reads: the map at 0, the instance type at 12, a
    /// `Code` of type 187 whose instruction start is a pointer at 40.
    fn layout() -> Layout {
        let mut layout = super::super::node_20_layout();
        layout.types.code = 187;
        layout.map = 0;
        layout.instance_type = 12;
        layout.code.instruction_start = InstructionStart::Pointer(40);
        layout
    }

    /// Memory with a map of `kind` at 0x1000 and a `Code` at 0x2000 entered at 0x9000.
    fn heap(kind: u16) -> Regions {
        let mut memory = Regions::new();
        let mut map = vec![0u8; 16];
        map[12..14].copy_from_slice(&kind.to_le_bytes());
        memory.add(0x1000, map);
        let mut code = vec![0u8; 64];
        code[..8].copy_from_slice(&0x1001u64.to_le_bytes());
        code[40..48].copy_from_slice(&0x9000u64.to_le_bytes());
        memory.add(0x2000, code);
        memory
    }

    fn entry(entry_point: u64, code: u64) -> Vec<u8> {
        let mut bytes = entry_point.to_le_bytes().to_vec();
        bytes.extend_from_slice(&((code | 1) << 16 | 2).to_le_bytes());
        bytes
    }

    /// A table at 0x7f00_0000_0000 whose second segment starts with `entries`, and a group
    /// at 0x5000 whose page starts with `words`, its pointer at 0x100.
    fn process(kind: u16, entries: &[Vec<u8>], words: &[u64]) -> Regions {
        let mut memory = heap(kind);
        let table = 0x7f00_0000_0000u64;
        memory.add(table, vec![0u8; 256]);
        let mut segment = entries.concat();
        segment.resize(256, 0);
        memory.add(table + SEGMENT, segment);
        memory.add(0x100, 0x5000u64.to_le_bytes().to_vec());
        // The group is read a page at a time.
        let mut group: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        group.resize(4096, 0);
        memory.add(0x5000, group);
        memory
    }

    #[test]
    fn the_table_is_the_group_word_whose_entries_hold_code() {
        let words = [0x7f00_0000_0000u64 + 8, 0x30_0000, 0x7f00_0000_0000, 7];
        let memory = process(187, &[entry(0x9000, 0x2000), entry(0x8000, 0x2000)], &words);
        assert_eq!(
            find_table(&memory, &layout(), 0x100),
            Ok(Table::At(0x7f00_0000_0000))
        );
    }

    #[test]
    fn a_process_before_v8_starts_is_asked_again() {
        let mut memory = Regions::new();
        memory.add(0x100, vec![0u8; 8]);
        assert_eq!(find_table(&memory, &layout(), 0x100), Ok(Table::NotYet));
        let memory = process(187, &[], &[0x7f00_0000_0000]);
        assert_eq!(find_table(&memory, &layout(), 0x100), Ok(Table::NotYet));
    }

    #[test]
    fn entries_that_hold_no_code_are_no_table() {
        // Its entries point at an object of another type.
        let memory = process(99, &[entry(0x9000, 0x2000)], &[0x7f00_0000_0000]);
        assert_eq!(
            find_table(&memory, &layout(), 0x100),
            Err(DispatchError::NoTable(0x5000))
        );
        // Code, but never entered at its start.
        let memory = process(187, &[entry(0x8000, 0x2000)], &[0x7f00_0000_0000]);
        assert!(find_table(&memory, &layout(), 0x100).is_err());
        // No readable group.
        let mut memory = Regions::new();
        memory.add(0x100, 0x5000u64.to_le_bytes().to_vec());
        assert_eq!(
            find_table(&memory, &layout(), 0x100),
            Err(DispatchError::UnreadableGroup(0x5000))
        );
    }
}
