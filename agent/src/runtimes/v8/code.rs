//! The `Code` a pc is in, found back from the pc (V8 13): for frames whose code no function
//! holds, such as a loop's on-stack-replaced code, whose frame keeps the function of the
//! bytecode it replaced.
//!
//! V8's JIT code lives in `InstructionStream`s: a header (a map, then the `Code`), then the
//! instructions. The words below the pc are read back, a chunk at a time, for the nearest
//! header whose map is an `InstructionStream`'s; its `Code` must point back to it and hold
//! the pc. The nearest stream that does not hold it means the pc is in no code (freed, or
//! not V8's): nothing is named from a guess.

use std::collections::HashMap;

use super::{
    layout::Layout,
    strings::{instance_type, untag},
};
use crate::runtimes::memory::{read_u16, read_u64, Memory};

/// Bytes read at once.
const CHUNK: u64 = 16 << 10;
/// Most bytes below the pc looked at: past the largest functions TurboFan compiles.
pub const MAX_SCAN: u64 = 1 << 20;
/// Most maps checked (by reading their instance type) per look.
const MAX_CHECKED: usize = 256;

/// A `Code` found holding a pc: its address (untagged), and where its instructions start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    pub code: u64,
    pub start: u64,
}

/// The `Code` whose instructions hold `pc`; `None` when the build does not say how to
/// find it, or no code holds it.
pub fn code_at(memory: &dyn Memory, layout: &Layout, pc: u64) -> Option<Found> {
    let streams = layout.streams?;
    let header = u64::from(streams.header);
    let tag = layout.tagging.heap_object_tag;
    let mask = layout.tagging.heap_object_tag_mask;
    // A header's words, from its map to its `Code`.
    let span = u64::from(streams.code) + 8;
    if span > CHUNK / 2 {
        return None;
    }
    // The highest header address that can hold `pc`: instructions start after it.
    let top = pc.checked_sub(header)? & !7;
    let floor = top.saturating_sub(MAX_SCAN);
    let mut maps: HashMap<u64, bool> = HashMap::new();
    let mut checked = 0;
    let mut high = top.checked_add(span)?;
    loop {
        let mut low = high.saturating_sub(CHUNK).max(floor) & !7;
        let mut bytes = vec![0u8; (high - low) as usize];
        // The code space's first page: nothing below it is read.
        let mut bottom = false;
        while !memory.read(low, &mut bytes) {
            let page = (low | 4095).checked_add(1)?;
            if page.checked_add(span).is_none_or(|end| end > high) {
                return None;
            }
            low = page;
            bytes.truncate((high - low) as usize);
            bottom = true;
        }
        let word = |at: u64| {
            let i = (at - low) as usize;
            bytes
                .get(i..i + 8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        };
        // Each address whose header lies in the chunk, highest first.
        let mut at = high.saturating_sub(span).min(top);
        while at >= low {
            let (map, code) = (word(at)?, word(at.wrapping_add(u64::from(streams.code)))?);
            if map & mask == tag && code & mask == tag {
                let is_stream = *maps.entry(map).or_insert_with(|| {
                    checked += 1;
                    untag(layout, map).ok().and_then(|map| {
                        read_u16(memory, map.wrapping_add(u64::from(layout.instance_type)))
                    }) == Some(streams.kind)
                });
                if is_stream {
                    // The nearest stream below the pc decides.
                    return holds(memory, layout, at, code - tag, pc);
                }
                if checked >= MAX_CHECKED {
                    return None;
                }
            }
            at = at.checked_sub(8)?;
        }
        if bottom || low <= floor {
            return None;
        }
        // The next chunk overlaps this one by a header's words.
        high = low + span - 8;
    }
}

/// Whether the `Code` at `code` is the stream at `stream`'s and holds `pc`.
fn holds(memory: &dyn Memory, layout: &Layout, stream: u64, code: u64, pc: u64) -> Option<Found> {
    let streams = layout.streams?;
    if instance_type(memory, layout, code).ok()? != layout.types.code {
        return None;
    }
    let back = read_u64(memory, code.wrapping_add(u64::from(streams.code_stream)))?;
    if back != stream.wrapping_add(layout.tagging.heap_object_tag) {
        return None;
    }
    let start = stream.wrapping_add(u64::from(streams.header));
    let mut size = [0u8; 4];
    if !memory.read(
        code.wrapping_add(u64::from(layout.code.instruction_size)),
        &mut size,
    ) {
        return None;
    }
    let end = start.checked_add(u64::from(u32::from_le_bytes(size)))?;
    (start..end).contains(&pc).then_some(Found { code, start })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtimes::{memory::Regions, v8::layout::Streams};

    /// V8 13.6's: a stream's map at 0, its `Code` at 8, instructions at 32; a `Code`'s
    /// stream at 32, its size at 56.
    fn layout() -> Layout {
        let mut layout = super::super::node_20_layout();
        layout.map = 0;
        layout.instance_type = 12;
        layout.types.code = 187;
        layout.code.instruction_size = 56;
        layout.streams = Some(Streams {
            kind: 192,
            header: 32,
            code: 8,
            code_stream: 32,
        });
        layout
    }

    const STREAM_MAP: u64 = 0x1000;
    const CODE_MAP: u64 = 0x1100;
    const CODE: u64 = 0x2000;

    /// Maps, a `Code` whose stream is at `stream` with `size` bytes of instructions, and
    /// `jit` bytes of code space from 0x10_0000 holding that stream's header.
    fn memory(stream: u64, size: u32, jit: usize) -> Regions {
        let mut memory = Regions::new();
        for (map, kind) in [(STREAM_MAP, 192u16), (CODE_MAP, 187)] {
            let mut bytes = vec![0u8; 16];
            bytes[12..14].copy_from_slice(&kind.to_le_bytes());
            memory.add(map, bytes);
        }
        let mut code = vec![0u8; 64];
        code[..8].copy_from_slice(&(CODE_MAP + 1).to_le_bytes());
        code[32..40].copy_from_slice(&(stream + 1).to_le_bytes());
        code[56..60].copy_from_slice(&size.to_le_bytes());
        memory.add(CODE, code);
        // Instructions: bytes that look like tagged words, without a stream's map.
        let mut space: Vec<u8> = (0..jit)
            .map(|i| if i % 8 == 0 { 0x41 } else { 0x90 })
            .collect();
        let at = (stream - 0x10_0000) as usize;
        space[at..at + 8].copy_from_slice(&(STREAM_MAP + 1).to_le_bytes());
        space[at + 8..at + 16].copy_from_slice(&(CODE + 1).to_le_bytes());
        memory.add(0x10_0000, space);
        memory
    }

    #[test]
    fn the_nearest_stream_below_the_pc_gives_its_code() {
        // A stream 40 KiB below the pc: found across chunks.
        let stream = 0x10_0040;
        let memory = memory(stream, 64 << 10, 128 << 10);
        let pc = stream + 32 + (40 << 10);
        assert_eq!(
            code_at(&memory, &layout(), pc),
            Some(Found {
                code: CODE,
                start: stream + 32
            })
        );
        // Its first instruction.
        assert!(code_at(&memory, &layout(), stream + 32).is_some());
    }

    #[test]
    fn a_pc_past_the_nearest_stream_is_in_no_code() {
        let stream = 0x10_0040;
        let memory = memory(stream, 256, 64 << 10);
        assert_eq!(code_at(&memory, &layout(), stream + 32 + 4096), None);
        // No stream at all below the pc, and the space's start unreadable below it.
        let memory = memory_without_stream();
        assert_eq!(code_at(&memory, &layout(), 0x10_8000), None);
        // Before V8 13: no way back.
        let mut old = layout();
        old.streams = None;
        let memory = self::memory(stream, 64 << 10, 64 << 10);
        assert_eq!(code_at(&memory, &old, stream + 64), None);
    }

    fn memory_without_stream() -> Regions {
        let mut memory = Regions::new();
        memory.add(0x10_0000, vec![0x41; 64 << 10]);
        memory
    }
}
