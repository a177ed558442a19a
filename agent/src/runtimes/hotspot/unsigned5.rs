//! HotSpot's UNSIGNED5 encoding: how its compressed streams (a method's line number table, a
//! compiled method's scope descriptors) write an integer in one to five bytes.
//!
//! A byte below `X + L` ends a value; from it up is a continuation carrying six more bits
//! (`H` = 64 values per byte), least significant first, and the fifth byte always ends. `X`
//! is the count of byte values the encoding excludes: 0 before JDK 20 build 15, then 1, so
//! that no encoded value contains a zero byte (the streams end with one). `L` = 256 - H - X,
//! so the continuation threshold `X + L` is 192 either way. The layout gives `X` from the
//! JVM's version ([`super::Layout::unsigned5_excluded`]).
//!
//! The bytes are another process's: a value is read from at most [`MAX_BYTES`] bytes, a
//! stream that ends early or holds an excluded byte is an error, never a panic, and the sums
//! wrap rather than overflow (a hostile fifth byte can exceed 32 bits).

/// Most bytes one value is read from: HotSpot's `MAX_b` + 1.
pub const MAX_BYTES: usize = 5;
/// Bits each byte after a continuation adds: HotSpot's `lg_H`.
const LG_H: u32 = 6;
/// The first byte value that continues a value, whatever `X`: `X + L`.
const CONTINUES: u8 = 192;

/// Why a value was not decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unsigned5Error {
    #[error("the stream ends at byte {at}, within a value")]
    Truncated { at: usize },
    #[error("byte {at} is {byte:#x}, which the encoding excludes")]
    Excluded { byte: u8, at: usize },
}

/// A cursor over encoded bytes.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    excluded: u8,
}

impl<'a> Reader<'a> {
    /// Reads `bytes` from the start, for an encoding excluding `excluded` byte values (0 or 1).
    pub fn new(bytes: &'a [u8], excluded: u8) -> Reader<'a> {
        Reader {
            bytes,
            at: 0,
            excluded,
        }
    }

    /// Where the next byte is read.
    pub fn position(&self) -> usize {
        self.at
    }

    /// One raw byte (the line table's short entries and escapes are raw).
    pub fn byte(&mut self) -> Result<u8, Unsigned5Error> {
        let byte = *self
            .bytes
            .get(self.at)
            .ok_or(Unsigned5Error::Truncated { at: self.at })?;
        self.at += 1;
        Ok(byte)
    }

    /// One byte of a value, less the excluded values.
    fn digit(&mut self) -> Result<(u8, u32), Unsigned5Error> {
        let at = self.at;
        let byte = self.byte()?;
        if byte < self.excluded {
            return Err(Unsigned5Error::Excluded { byte, at });
        }
        Ok((byte, u32::from(byte - self.excluded)))
    }

    /// An unsigned value.
    pub fn uint(&mut self) -> Result<u32, Unsigned5Error> {
        let (mut byte, mut sum) = self.digit()?;
        let mut shift = LG_H;
        for _ in 1..MAX_BYTES {
            if byte < CONTINUES {
                break;
            }
            let (next, digit) = self.digit()?;
            byte = next;
            sum = sum.wrapping_add(digit.wrapping_shl(shift));
            shift += LG_H;
        }
        Ok(sum)
    }

    /// A signed value, zigzag-encoded (HotSpot's `write_signed_int`).
    pub fn signed(&mut self) -> Result<i32, Unsigned5Error> {
        let value = self.uint()?;
        Ok(((value >> 1) as i32) ^ -((value & 1) as i32))
    }
}
