//! The code cache's heaps in a running JVM: where its compiled code, interpreter and stubs
//! are, and the segment map that leads from any pc in them back to its blob.
//!
//! Read at attach, once the JVM has set them up (a JVM met while starting has no heaps yet:
//! [`HeapsError::NotYetSetUp`], for the caller to look again later). A heap's reserved range
//! does not move for the JVM's life, so the BPF walk can own it from then on.
//!
//! What is read is another process's and bounded: at most [`MAX_HEAPS`] heaps, each range
//! checked to be ordered, the segment size within what HotSpot allows, the segment map large
//! enough to cover the heap.

use std::ops::Range;

use super::layout::{Heaps, Layout};
use crate::runtimes::memory::{read_i32, read_u64, Memory};

/// Most heaps read. JDK 9+'s segmented cache has three (non-profiled, profiled, non-method)
/// or one; HotSpot's `CodeBlobType` allows a handful more. OTel's bound.
pub const MAX_HEAPS: u32 = 16;
/// Segment sizes a heap may have, as shifts: HotSpot's `CodeCacheSegmentSize` is a power of
/// two of 64 or 128 bytes in product builds; 32 bytes to 4 KiB leaves room for debug builds'
/// settings while refusing a shift that would make the segment map meaningless.
pub const SEGMENT_SHIFTS: std::ops::RangeInclusive<u32> = 5..=12;

/// Why a JVM's code heaps were not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeapsError {
    #[error("the code cache is not yet set up ({0}): the JVM is starting")]
    NotYetSetUp(&'static str),
    #[error("{what} at {address:#x}: unreadable")]
    Unreadable { what: &'static str, address: u64 },
    #[error("CodeCache::_heaps holds {0} heaps, not 1 to {MAX_HEAPS}")]
    Count(i32),
    #[error("code heap {index}: its {what} {low:#x}..{high:#x} is empty or inverted")]
    Inverted {
        index: usize,
        what: &'static str,
        low: u64,
        high: u64,
    },
    #[error("code heap {index}: a segment shift of {shift}, not {}..={}", SEGMENT_SHIFTS.start(), SEGMENT_SHIFTS.end())]
    SegmentShift { index: usize, shift: i32 },
    #[error("code heap {index}: a segment shift of {shift}, where heap 0's is {first}")]
    Shifts {
        index: usize,
        shift: u32,
        first: u32,
    },
    #[error(
        "code heap {index}: its segment map's {map} bytes cannot cover its {segments} segments"
    )]
    SegmentMap {
        index: usize,
        map: u64,
        segments: u64,
    },
    #[error("the code cache's bounds {low:#x}..{high:#x} are empty or inverted")]
    Bounds { low: u64, high: u64 },
}

/// One code heap, in the process's addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeHeap {
    /// Its reserved range (`_memory`'s boundaries): every blob it ever holds is in it.
    pub code: Range<u64>,
    /// Its segment map's reserved range: one byte per segment of `code`.
    pub segmap: Range<u64>,
}

/// The code cache, in the process's addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeCache {
    pub heaps: Vec<CodeHeap>,
    /// log2 of the segment size, the same for every heap.
    pub segment_shift: u32,
    /// The whole cache's bounds: `CodeCache::_low_bound.._high_bound` (JDK 9+), else the one
    /// heap's.
    pub bounds: Range<u64>,
}

fn u64_at(memory: &dyn Memory, what: &'static str, address: u64) -> Result<u64, HeapsError> {
    read_u64(memory, address).ok_or(HeapsError::Unreadable { what, address })
}

/// The code heaps of the JVM whose libjvm (of `layout`) is at `bias` in `memory`.
pub fn code_cache(
    memory: &dyn Memory,
    layout: &Layout,
    bias: u64,
) -> Result<CodeCache, HeapsError> {
    let pointers = match layout.code_cache.heaps {
        Heaps::Single(heap) => {
            let heap = u64_at(memory, "CodeCache::_heap", heap.wrapping_add(bias))?;
            if heap == 0 {
                return Err(HeapsError::NotYetSetUp("CodeCache::_heap is null"));
            }
            vec![heap]
        }
        Heaps::Segmented(heaps) => segmented(memory, layout, heaps.wrapping_add(bias))?,
    };
    let mut heaps = Vec::with_capacity(pointers.len());
    let mut segment_shift = None;
    for (index, &pointer) in pointers.iter().enumerate() {
        let (heap, shift) = code_heap(memory, layout, index, pointer)?;
        match segment_shift {
            None => segment_shift = Some(shift),
            Some(first) if first != shift => {
                return Err(HeapsError::Shifts {
                    index,
                    shift,
                    first,
                })
            }
            Some(_) => {}
        }
        heaps.push(heap);
    }
    let bounds = match (layout.code_cache.low_bound, layout.code_cache.high_bound) {
        (Some(low), Some(high)) => {
            let low = u64_at(memory, "CodeCache::_low_bound", low.wrapping_add(bias))?;
            let high = u64_at(memory, "CodeCache::_high_bound", high.wrapping_add(bias))?;
            if low >= high {
                return Err(HeapsError::Bounds { low, high });
            }
            low..high
        }
        _ => {
            let low = heaps.iter().map(|h| h.code.start).min().unwrap_or(0);
            let high = heaps.iter().map(|h| h.code.end).max().unwrap_or(0);
            low..high
        }
    };
    Ok(CodeCache {
        heaps,
        segment_shift: segment_shift.unwrap_or(0),
        bounds,
    })
}

/// The `CodeHeap*`s of `CodeCache::_heaps` (a `GrowableArray<CodeHeap*>*` at `address`).
fn segmented(memory: &dyn Memory, layout: &Layout, address: u64) -> Result<Vec<u64>, HeapsError> {
    let array = u64_at(memory, "CodeCache::_heaps", address)?;
    if array == 0 {
        return Err(HeapsError::NotYetSetUp("CodeCache::_heaps is null"));
    }
    let at = array.wrapping_add(layout.growable_array.len);
    let len = read_i32(memory, at).ok_or(HeapsError::Unreadable {
        what: "the heaps' count",
        address: at,
    })?;
    let data = u64_at(
        memory,
        "the heaps' array",
        array.wrapping_add(layout.growable_array.data),
    )?;
    if len == 0 || data == 0 {
        return Err(HeapsError::NotYetSetUp("CodeCache::_heaps is empty"));
    }
    let count = u32::try_from(len)
        .ok()
        .filter(|&n| n <= MAX_HEAPS)
        .ok_or(HeapsError::Count(len))?;
    let mut bytes = vec![0u8; 8 * count as usize];
    if !memory.read(data, &mut bytes) {
        return Err(HeapsError::Unreadable {
            what: "the heaps' array",
            address: data,
        });
    }
    let pointers: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
        .collect();
    if pointers.contains(&0) {
        return Err(HeapsError::NotYetSetUp(
            "a heap of CodeCache::_heaps is null",
        ));
    }
    Ok(pointers)
}

/// The heap at `pointer` and its segment shift.
fn code_heap(
    memory: &dyn Memory,
    layout: &Layout,
    index: usize,
    pointer: u64,
) -> Result<(CodeHeap, u32), HeapsError> {
    let space = &layout.virtual_space;
    let range = |what: &'static str, field: u64| -> Result<Range<u64>, HeapsError> {
        let at = pointer.wrapping_add(field);
        let low = u64_at(memory, what, at.wrapping_add(space.low_boundary))?;
        let high = u64_at(memory, what, at.wrapping_add(space.high_boundary))?;
        if low == 0 && high == 0 {
            return Err(HeapsError::NotYetSetUp("a heap has no memory reserved yet"));
        }
        if low >= high {
            return Err(HeapsError::Inverted {
                index,
                what,
                low,
                high,
            });
        }
        Ok(low..high)
    };
    let code = range("code", layout.code_heap.memory)?;
    let segmap = range("segment map", layout.code_heap.segmap)?;
    let at = pointer.wrapping_add(layout.code_heap.log2_segment_size);
    let shift = read_i32(memory, at).ok_or(HeapsError::Unreadable {
        what: "a heap's segment shift",
        address: at,
    })?;
    let shift = u32::try_from(shift)
        .ok()
        .filter(|s| SEGMENT_SHIFTS.contains(s))
        .ok_or(HeapsError::SegmentShift { index, shift })?;
    // HotSpot reserves the map for the heap's whole reserved range, rounded up to pages.
    let segments = (code.end - code.start) >> shift;
    let map = segmap.end - segmap.start;
    if map < segments {
        return Err(HeapsError::SegmentMap {
            index,
            map,
            segments,
        });
    }
    Ok((CodeHeap { code, segmap }, shift))
}
