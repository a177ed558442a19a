//! Which bytecode a baseline (Sparkplug) frame's pc is at: V8 compiles each bytecode of a
//! function to a run of machine code, in order, and keeps the length of each run in the
//! code's bytecode offset table (`bytecode-offset-iterator.h`: one unsigned VLQ a bytecode,
//! the first the prologue's). Walking that table beside the bytecodes themselves gives the
//! bytecode at a pc, and the bytecode its source position; stepping over a bytecode takes
//! its size, which depends on the V8 release's list of bytecodes and their operands.
//!
//! The sizes come from the binary itself: V8's interpreter keeps them in one table,
//! `Bytecodes::kBytecodeSizes[3][count]` (a row per operand scale: single, double,
//! quadruple), which [`BytecodeSizes::find`] finds in the read-only data by the rows' common
//! start. Every release from V8 10 to 13 begins its list with the two prefixes that scale
//! operands (`Wide`, `ExtraWide`), their debug-break twins, and seven debug breaks, one per
//! operand shape; and ends it with sixteen one-byte `Star` forms and `Illegal`. So no table
//! per release is kept here, and a release's new bytecodes are sized as it sizes them.
//! Pure: the bytes are the binary's and the process's (`names`).

use super::positions::{PositionError, Reader};

/// The start of each row of `kBytecodeSizes`: `Wide`, `ExtraWide`, `DebugBreakWide`,
/// `DebugBreakExtraWide` (1 byte each), then `DebugBreak0` to `DebugBreak6`, whose operands
/// are registers (scaled) and, for the last two, a runtime id (2 bytes, unscaled).
const ROW_STARTS: [[u8; 11]; 3] = [
    [1, 1, 1, 1, 1, 2, 3, 4, 5, 5, 6],
    [1, 1, 1, 1, 1, 3, 5, 7, 9, 7, 9],
    [1, 1, 1, 1, 1, 5, 9, 13, 17, 11, 15],
];
/// The end of each row: `Star15` to `Star0` and `Illegal`, one byte at every scale.
const ROW_END: usize = 17;
/// Fewest and most bytecodes believed: V8 10 has 198, 13 has 208.
const MIN_BYTECODES: usize = 150;
const MAX_BYTECODES: usize = 256;
/// The prefixes that scale the next bytecode's operands, by opcode: `Wide` and
/// `DebugBreakWide` double them, `ExtraWide` and `DebugBreakExtraWide` quadruple them.
const DOUBLE: [u8; 2] = [0, 2];
const QUADRUPLE: [u8; 2] = [1, 3];
/// Most places where a row's start is met that are examined: the binary is the process's,
/// and one that repeats the start everywhere must not cost a count check at each. V8's own
/// builds hold it once.
const MAX_CANDIDATES: usize = 64;
/// Most bytecodes stepped over to reach a pc: V8 bounds a function's bytecodes far below.
pub const MAX_BYTECODE_STEPS: usize = 1 << 20;

/// Why a baseline pc's bytecode was not found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BytecodeError {
    #[error("opcode {opcode:#x} at bytecode offset {offset} is past the {count} bytecodes")]
    Opcode {
        opcode: u8,
        offset: usize,
        count: usize,
    },
    #[error("the bytecodes end at {0} before the offset table does")]
    Short(usize),
    #[error("more than {MAX_BYTECODE_STEPS} bytecodes")]
    TooLong,
    #[error(transparent)]
    Table(#[from] PositionError),
}

/// `kBytecodeSizes`: each bytecode's size with its operands, at each operand scale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BytecodeSizes {
    /// The single, double and quadruple rows, one after another.
    sizes: Vec<u8>,
    count: usize,
}

impl BytecodeSizes {
    /// The table in `data` (a binary's read-only data), with its offset there: the one place
    /// where three rows of one length begin as [`ROW_STARTS`] says and end as [`ROW_END`]
    /// says. `None` when there is none, or more than one, or the start is met more than
    /// [`MAX_CANDIDATES`] times.
    pub fn find(data: &[u8]) -> Option<(usize, BytecodeSizes)> {
        let mut found = None;
        for (seen, at) in memchr::memmem::find_iter(data, &ROW_STARTS[0]).enumerate() {
            if seen == MAX_CANDIDATES {
                return None;
            }
            for count in MIN_BYTECODES..=MAX_BYTECODES {
                let Some(table) = data.get(at..at + 3 * count) else {
                    break;
                };
                let rows = (0..3).all(|row| {
                    let sizes = &table[row * count..(row + 1) * count];
                    sizes.starts_with(&ROW_STARTS[row])
                        && sizes[count - ROW_END..].iter().all(|&size| size == 1)
                });
                if rows {
                    if found.is_some() {
                        return None;
                    }
                    found = Some((
                        at,
                        BytecodeSizes {
                            sizes: table.to_vec(),
                            count,
                        },
                    ));
                }
            }
        }
        found
    }

    /// A table of `count` bytecodes as a release lays it out: the common start and end,
    /// `LdaZero` (1 byte) at 11, `LdaSmi` (an immediate, scaled) at 12, and one-byte forms
    /// between; as bytes, for [`BytecodeSizes::find`]. For tests and the fuzz target.
    pub fn sample_table(count: usize) -> Vec<u8> {
        let mut rows = Vec::new();
        for (row, start) in ROW_STARTS.iter().enumerate() {
            let mut sizes = vec![1u8; count];
            sizes[..start.len()].copy_from_slice(start);
            sizes[12] = 1 + [1, 2, 4][row];
            rows.extend(sizes);
        }
        rows
    }

    /// How many bytecodes the release has.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The size of the bytecode at `offset` of `bytecodes`, its scaling prefix included.
    pub fn size_at(&self, bytecodes: &[u8], offset: usize) -> Result<usize, BytecodeError> {
        let opcode = |at: usize| bytecodes.get(at).copied().ok_or(BytecodeError::Short(at));
        let first = opcode(offset)?;
        let (row, prefix, opcode) = if DOUBLE.contains(&first) {
            (1, 1, opcode(offset + 1)?)
        } else if QUADRUPLE.contains(&first) {
            (2, 1, opcode(offset + 1)?)
        } else {
            (0, 0, first)
        };
        if usize::from(opcode) >= self.count {
            return Err(BytecodeError::Opcode {
                opcode,
                offset,
                count: self.count,
            });
        }
        Ok(prefix + usize::from(self.sizes[row * self.count + usize::from(opcode)]))
    }

    /// The offset of the bytecode whose machine code holds code offset `pc` of baseline
    /// code whose bytecode offset table is `table` and bytecodes `bytecodes`: as V8's
    /// `Code::GetBytecodeOffsetForBaselinePC` finds it, the bytecode whose run ends at or
    /// after `pc`. `None` in the prologue, before the first bytecode's code.
    pub fn bytecode_at(
        &self,
        table: &[u8],
        bytecodes: &[u8],
        pc: u64,
    ) -> Result<Option<usize>, BytecodeError> {
        let mut reader = Reader::new(table);
        let mut end = reader.unsigned()?;
        let (mut current, mut next) = (None, 0usize);
        for _ in 0..MAX_BYTECODE_STEPS {
            if end >= pc || reader.done() {
                return Ok(current);
            }
            end = end.saturating_add(reader.unsigned()?);
            current = Some(next);
            next += self.size_at(bytecodes, next)?;
        }
        Err(BytecodeError::TooLong)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(count: usize) -> Vec<u8> {
        BytecodeSizes::sample_table(count)
    }

    #[test]
    fn the_table_is_found_by_its_rows() {
        let mut data = vec![7u8; 1000];
        data.extend(table(198));
        data.extend([9u8; 500]);
        let (at, sizes) = BytecodeSizes::find(&data).unwrap();
        assert_eq!((at, sizes.count()), (1000, 198));
        // Two tables: neither is believed.
        let mut twice = data.clone();
        twice.extend(table(208));
        assert_eq!(BytecodeSizes::find(&twice), None);
        // A start without the rows that follow it.
        assert_eq!(BytecodeSizes::find(&ROW_STARTS.concat()), None);
        // The start met more often than is examined: none, before the table is reached.
        let mut noisy = ROW_STARTS[0].repeat(MAX_CANDIDATES);
        noisy.extend(table(198));
        assert_eq!(BytecodeSizes::find(&noisy), None);
    }

    #[test]
    fn sizes_follow_the_scaling_prefixes() {
        let (_, sizes) = BytecodeSizes::find(&table(198)).unwrap();
        // LdaSmi [5]; Wide LdaSmi [300]; ExtraWide LdaSmi [70000]; LdaZero.
        let bytecodes = [12, 5, 0, 12, 0x2c, 1, 1, 12, 0x70, 0x11, 1, 0, 11];
        let mut at = 0;
        let mut steps = Vec::new();
        while at < bytecodes.len() {
            steps.push(at);
            at += sizes.size_at(&bytecodes, at).unwrap();
        }
        assert_eq!(steps, [0, 2, 6, 12]);
        assert_eq!(at, bytecodes.len());
        // An opcode past the list, a prefix at the end.
        assert_eq!(
            sizes.size_at(&[230], 0),
            Err(BytecodeError::Opcode {
                opcode: 230,
                offset: 0,
                count: 198
            })
        );
        assert_eq!(sizes.size_at(&[0], 0), Err(BytecodeError::Short(1)));
    }

    #[test]
    fn a_pc_is_at_the_bytecode_whose_code_reaches_it() {
        let (_, sizes) = BytecodeSizes::find(&table(198)).unwrap();
        // Bytecodes at 0 (2 bytes), 2 (6), 8 (1); a prologue of 20 bytes of code, then 10,
        // 30 and 5 bytes.
        let bytecodes = [12, 5, 1, 12, 0, 0, 0, 0, 11];
        let offsets = [20, 10, 30, 5];
        let at = |pc| sizes.bytecode_at(&offsets, &bytecodes, pc);
        assert_eq!(at(0), Ok(None));
        assert_eq!(at(20), Ok(None));
        assert_eq!(at(21), Ok(Some(0)));
        assert_eq!(at(30), Ok(Some(0)));
        assert_eq!(at(31), Ok(Some(2)));
        assert_eq!(at(64), Ok(Some(8)));
        // Past the code: the last bytecode's.
        assert_eq!(at(1000), Ok(Some(8)));
        // A table longer than the bytecodes.
        assert_eq!(
            sizes.bytecode_at(&[1, 1, 1, 1, 1], &[11], 100),
            Err(BytecodeError::Short(1))
        );
        // A VLQ cut short.
        assert!(matches!(
            sizes.bytecode_at(&[1, 0x80], &[11], 100),
            Err(BytecodeError::Table(_))
        ));
    }
}
