//! Bounds-checked reads of the file: little-endian values within a slice, and ELF
//! addresses through the loaded segments (`binary::elf`'s).

use super::*;

/// Little-endian reads within one slice; `base` is the slice's file offset, for messages.
#[derive(Clone, Copy)]
pub(super) struct Bytes<'d> {
    pub(super) bytes: &'d [u8],
    pub(super) base: u64,
}

impl<'d> Bytes<'d> {
    pub(super) fn new(bytes: &'d [u8], base: u64) -> Bytes<'d> {
        Bytes { bytes, base }
    }

    /// The `len` bytes at `off`, as a `Bytes` of their own.
    pub(super) fn sub(&self, off: u64, len: u64, what: &'static str) -> Result<Bytes<'d>> {
        let offset = self.base.saturating_add(off);
        let range = usize::try_from(off)
            .ok()
            .zip(usize::try_from(len).ok())
            .and_then(|(start, len)| Some(start..start.checked_add(len)?));
        let bytes = range.and_then(|range| self.bytes.get(range));
        let bytes = bytes.ok_or(PclntabError::Truncated { what, offset })?;
        Ok(Bytes::new(bytes, offset))
    }

    pub(super) fn u8(&self, off: u64, what: &'static str) -> Result<u8> {
        Ok(self.sub(off, 1, what)?.bytes[0])
    }

    pub(super) fn u32(&self, off: u64, what: &'static str) -> Result<u32> {
        let mut word = [0; 4];
        word.copy_from_slice(self.sub(off, 4, what)?.bytes);
        Ok(u32::from_le_bytes(word))
    }

    pub(super) fn u64(&self, off: u64, what: &'static str) -> Result<u64> {
        let mut word = [0; 8];
        word.copy_from_slice(self.sub(off, 8, what)?.bytes);
        Ok(u64::from_le_bytes(word))
    }

    /// A field of `size` bytes (4 or 8), widened.
    pub(super) fn uint(&self, off: u64, size: u64, what: &'static str) -> Result<u64> {
        match size {
            8 => self.u64(off, what),
            _ => self.u32(off, what).map(u64::from),
        }
    }

    /// The NUL-terminated UTF-8 string at `off`.
    pub(super) fn cstr(&self, off: u64, what: &'static str) -> Result<&'d str> {
        let offset = self.base.saturating_add(off);
        let rest = usize::try_from(off)
            .ok()
            .and_then(|off| self.bytes.get(off..));
        let rest = rest.ok_or(PclntabError::Truncated { what, offset })?;
        let window = &rest[..rest.len().min(MAX_STRING)];
        let bad = PclntabError::BadString { what, offset };
        let len = memchr::memchr(0, window).ok_or(bad)?;
        std::str::from_utf8(&window[..len]).map_err(|_| PclntabError::BadString { what, offset })
    }

    /// One pc-value varint (32 bits at most) at `off`: its value and length.
    pub(super) fn varint(&self, off: u64) -> Result<(u32, u64)> {
        let mut value = 0u32;
        for i in 0..5u64 {
            let byte = self.u8(off + i, "a pc-value varint")?;
            if i == 4 && byte > 0x0f {
                break;
            }
            value |= u32::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok((value, i + 1));
            }
        }
        let offset = self.base.saturating_add(off);
        Err(PclntabError::Varint { offset })
    }
}

/// The segments with file bytes, for mapping addresses to file offsets.
pub(super) fn load_segments(segments: &[Segment]) -> Vec<Segment> {
    let segments = segments.iter().filter(|segment| segment.file_size > 0);
    segments.copied().take(MAX_SEGMENTS).collect()
}

/// The `len` file bytes at ELF address `address`, all within one segment.
pub(super) fn bytes_at<'d>(
    data: &'d [u8],
    segments: &[Segment],
    (address, len): (u64, u64),
    what: &'static str,
) -> Result<Bytes<'d>> {
    let offset = segments.iter().find_map(|s| s.offset_of(address, len));
    let offset = offset.ok_or(PclntabError::Unmapped { what, address })?;
    Bytes::new(data, 0).sub(offset, len, what)
}
