//! V8's source positions, decoded: which script offset a code offset (a pc's, or a bytecode
//! offset) stands for, which function inlined there, and which line an offset is on. Pure:
//! the tables are bytes read from the process (`lines`).
//!
//! - **A source position** (`SourcePosition`, `source-position.h`) is 64 bits: bit 0 says it
//!   is external (code from an embedder's file, no script offset); otherwise bits 1-30 hold
//!   the script offset plus one (0: none), and bits 31-46 the inlining id plus one (0: the
//!   code's own function).
//! - **A source position table** (`source-position-table.cc`) is a run of entries, each a
//!   code offset and a source position as differences from the entry before (from -1 and 0),
//!   each a zigzag-signed VLQ; a statement's code offset difference is stored as is, an
//!   expression's as its negation less one. The position at a code offset is the last
//!   entry's at or before it.
//! - **Inlining positions** (a `DeoptimizationData`'s `InliningPositions`, 16 bytes each): the
//!   source position of the call that was inlined, in its caller, and the index of the
//!   inlined function in the literal array (-1: the code's own function).
//! - **Lines**: a script's line ends (offsets of each line's terminator), from the script's
//!   `line_ends` or from its source.

/// Most entries a table is read for: V8's largest functions have tens of thousands.
pub const MAX_ENTRIES: usize = 1 << 20;
/// Bytes of one VLQ: ten hold 64 bits.
const MAX_VLQ_BYTES: usize = 10;
/// Bytes of one inlining position.
pub const INLINING_POSITION_BYTES: usize = 16;

/// Why a table was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PositionError {
    #[error("a VLQ at byte {0} runs past {MAX_VLQ_BYTES} bytes or the table's end")]
    Vlq(usize),
    #[error("more than {MAX_ENTRIES} entries")]
    TooLong,
    #[error("inlining id {id} past the {count} inlining positions")]
    Inlining { id: u16, count: usize },
    #[error("inlining ids do not decrease ({from} to {to}): not a chain")]
    Cycle { from: u16, to: u16 },
}

/// A `SourcePosition`, as V8 encodes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Position(pub u64);

impl Position {
    /// The offset in its script, when it has one.
    pub fn script_offset(self) -> Option<u32> {
        if self.0 & 1 != 0 {
            return None;
        }
        ((self.0 >> 1) & ((1 << 30) - 1))
            .checked_sub(1)
            .map(|o| o as u32)
    }

    /// The inlining id (an index into the inlining positions), when the position is in a
    /// function inlined into the code's own.
    pub fn inlining_id(self) -> Option<u16> {
        (((self.0 >> 31) & 0xffff) as u16).checked_sub(1)
    }
}

/// Reads VLQs: 7 bits a byte, low bits first, the top bit set on all but the last.
pub(super) struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, at: 0 }
    }

    pub(super) fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    pub(super) fn unsigned(&mut self) -> Result<u64, PositionError> {
        let start = self.at;
        let mut value = 0u64;
        for i in 0..MAX_VLQ_BYTES {
            let byte = *self.bytes.get(self.at).ok_or(PositionError::Vlq(start))?;
            self.at += 1;
            value |= u64::from(byte & 0x7f).wrapping_shl(7 * i as u32);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(PositionError::Vlq(start))
    }

    /// A zigzag-signed VLQ.
    fn signed(&mut self) -> Result<i64, PositionError> {
        let value = self.unsigned()?;
        Ok(((value >> 1) as i64) ^ -((value & 1) as i64))
    }
}

/// The source position at code offset `offset` in `table`: the last entry's at or before
/// it; the default (no offset, not inlined) when there is none.
pub fn position_at(table: &[u8], offset: u32) -> Result<Position, PositionError> {
    let mut reader = Reader {
        bytes: table,
        at: 0,
    };
    let (mut code, mut source) = (-1i64, 0i64);
    let mut found = Position::default();
    for _ in 0..MAX_ENTRIES {
        if reader.done() {
            return Ok(found);
        }
        let delta = reader.signed()?;
        // A statement's difference as is, an expression's as -difference - 1.
        code = code.wrapping_add(if delta >= 0 { delta } else { -(delta + 1) });
        source = source.wrapping_add(reader.signed()?);
        if code > i64::from(offset) {
            return Ok(found);
        }
        found = Position(source as u64);
    }
    Err(PositionError::TooLong)
}

/// One inlining position: the call site in its caller, and the inlined function's index in
/// the literal array (`None`: the code's own function).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inlining {
    pub call: Position,
    pub function: Option<u32>,
}

/// The inlining position `id` of the table `positions`.
pub fn inlining(positions: &[u8], id: u16) -> Result<Inlining, PositionError> {
    let at = usize::from(id) * INLINING_POSITION_BYTES;
    let entry = positions
        .get(at..at + INLINING_POSITION_BYTES)
        .ok_or(PositionError::Inlining {
            id,
            count: positions.len() / INLINING_POSITION_BYTES,
        })?;
    let call = u64::from_le_bytes(entry[..8].try_into().expect("8 bytes"));
    let function = i32::from_le_bytes(entry[8..12].try_into().expect("4 bytes"));
    Ok(Inlining {
        call: Position(call),
        function: u32::try_from(function).ok(),
    })
}

/// The frames at `position` in optimised code, innermost first: each with its position and
/// the inlined function's literal index (`None`: the code's own function). Inlining ids
/// decrease from an inlined function to its caller, which bounds the chain.
pub fn inlined_frames(
    positions: &[u8],
    position: Position,
) -> Result<Vec<(Position, Option<u32>)>, PositionError> {
    let mut frames = Vec::new();
    let mut position = position;
    let mut last: Option<u16> = None;
    while let Some(id) = position.inlining_id() {
        if let Some(last) = last {
            if id >= last {
                return Err(PositionError::Cycle { from: last, to: id });
            }
        }
        let inlining = inlining(positions, id)?;
        frames.push((position, inlining.function));
        position = inlining.call;
        last = Some(id);
    }
    frames.push((position, None));
    Ok(frames)
}

/// The 1-based line and 0-based column of script offset `offset`, from the script's line
/// ends (each line's terminator's offset, ascending); `None` past the last line.
pub fn line_of(line_ends: &[u32], offset: u32) -> Option<(u32, u32)> {
    let index = line_ends.partition_point(|&end| end < offset);
    if index >= line_ends.len() {
        return None;
    }
    let start = if index == 0 {
        0
    } else {
        line_ends[index - 1].saturating_add(1)
    };
    Some((index as u32 + 1, offset.saturating_sub(start)))
}

/// The line ends of `source` (UTF-16 code units, as V8 counts script offsets), as V8's
/// `String::CalculateLineEnds` makes them: each line terminator (`\n`, a `\r` not before a
/// `\n`, U+2028, U+2029), then one past the end.
pub fn line_ends(source: &[u16]) -> Vec<u32> {
    let mut ends = Vec::new();
    for (i, &unit) in source.iter().enumerate() {
        let terminator = match unit {
            0x0a | 0x2028 | 0x2029 => true,
            0x0d => source.get(i + 1) != Some(&0x0a),
            _ => false,
        };
        if terminator {
            ends.push(i as u32);
        }
    }
    ends.push(source.len() as u32);
    ends
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `value` as a zigzag VLQ.
    fn vlq(value: i64) -> Vec<u8> {
        let mut bits = ((value << 1) ^ (value >> 63)) as u64;
        let mut bytes = Vec::new();
        loop {
            let byte = (bits & 0x7f) as u8;
            bits >>= 7;
            if bits == 0 {
                bytes.push(byte);
                return bytes;
            }
            bytes.push(byte | 0x80);
        }
    }

    /// A table of (code offset, statement, source position) entries, as V8 writes one.
    fn table(entries: &[(i64, bool, i64)]) -> Vec<u8> {
        let (mut code, mut source) = (-1, 0);
        let mut bytes = Vec::new();
        for &(at, statement, position) in entries {
            let delta = at - code;
            bytes.extend(vlq(if statement { delta } else { -delta - 1 }));
            bytes.extend(vlq(position - source));
            (code, source) = (at, position);
        }
        bytes
    }

    /// A position at `offset`, inlined with id `inlining` (`NOT`: not inlined).
    fn position(offset: u64, inlining: u64) -> i64 {
        (((offset + 1) << 1) | (inlining.wrapping_add(1) << 31)) as i64
    }

    const NOT: u64 = u64::MAX;

    #[test]
    fn a_code_offset_takes_the_last_entry_at_or_before_it() {
        let bytes = table(&[
            (0, true, position(10, NOT)),
            (5, false, position(40, NOT)),
            (300, true, position(25, 0)),
        ]);
        assert_eq!(position_at(&bytes, 0).unwrap().script_offset(), Some(10));
        assert_eq!(position_at(&bytes, 4).unwrap().script_offset(), Some(10));
        assert_eq!(position_at(&bytes, 5).unwrap().script_offset(), Some(40));
        assert_eq!(position_at(&bytes, 299).unwrap().script_offset(), Some(40));
        let last = position_at(&bytes, 10_000).unwrap();
        assert_eq!(
            (last.script_offset(), last.inlining_id()),
            (Some(25), Some(0))
        );
        // Before the first entry, and an empty table: no position.
        assert_eq!(position_at(&[], 7).unwrap(), Position::default());
        assert_eq!(Position::default().script_offset(), None);
        // A VLQ cut short, and one that never ends.
        assert_eq!(position_at(&[0x80], 0), Err(PositionError::Vlq(0)));
        assert_eq!(position_at(&[0xff; 12], 0), Err(PositionError::Vlq(0)));
        // An external position has no script offset.
        assert_eq!(Position(0x15).script_offset(), None);
    }

    #[test]
    fn inlined_functions_come_out_innermost_first() {
        // Function 1 inlined at offset 50 of the code's own function (id 0), and function 0
        // inlined into it at its offset 70 (id 1).
        let mut positions = Vec::new();
        positions.extend((position(50, NOT) as u64).to_le_bytes());
        positions.extend(1i32.to_le_bytes());
        positions.extend([0; 4]);
        positions.extend((position(70, 0) as u64).to_le_bytes());
        positions.extend(0i32.to_le_bytes());
        positions.extend([0; 4]);
        let at = Position(position(90, 1) as u64);
        let frames = inlined_frames(&positions, at).unwrap();
        let offsets: Vec<_> = frames
            .iter()
            .map(|(p, f)| (p.script_offset(), *f))
            .collect();
        assert_eq!(
            offsets,
            [(Some(90), Some(0)), (Some(70), Some(1)), (Some(50), None)]
        );
        // An id past the table, and a chain whose ids do not decrease.
        assert!(matches!(
            inlined_frames(&positions, Position(position(1, 5) as u64)),
            Err(PositionError::Inlining { id: 5, count: 2 })
        ));
        let mut looping = positions.clone();
        looping[..8].copy_from_slice(&(position(50, 1) as u64).to_le_bytes());
        assert!(matches!(
            inlined_frames(&looping, Position(position(1, 1) as u64)),
            Err(PositionError::Cycle { .. })
        ));
    }

    #[test]
    fn lines_come_from_the_line_ends() {
        let source: Vec<u16> = "ab\ncd\r\nef\rg".encode_utf16().collect();
        let ends = line_ends(&source);
        assert_eq!(ends, [2, 6, 9, 11]);
        assert_eq!(line_of(&ends, 0), Some((1, 0)));
        assert_eq!(line_of(&ends, 2), Some((1, 2)));
        assert_eq!(line_of(&ends, 3), Some((2, 0)));
        assert_eq!(line_of(&ends, 10), Some((4, 0)));
        assert_eq!(line_of(&ends, 12), None);
        assert_eq!(line_ends(&"x\n".encode_utf16().collect::<Vec<_>>()), [1, 2]);
        assert_eq!(line_ends(&[]), [0]);
    }
}
