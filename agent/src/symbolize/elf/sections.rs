//! Loading an ELF file's DWARF sections for gimli without copying them onto the heap: plain
//! sections are windows into the file's mapping, compressed ones (zlib, zstd) are inflated
//! into unlinked temporary files and mapped, so either way their pages are page cache the
//! kernel can reclaim.

use std::{fmt, ops::Deref, path::Path, sync::Arc};

use object::{CompressionFormat, Object, ObjectSection};

use super::FileData;

/// A DWARF section's bytes: a window into a mapped file (the binary, or the inflated copy of a
/// compressed section). Cheap to clone, and its address never moves, which is what gimli's
/// owned reader needs.
#[derive(Clone)]
pub(super) struct SectionBytes {
    data: Arc<FileData>,
    start: usize,
    len: usize,
}

impl SectionBytes {
    /// All of `data`.
    pub(super) fn whole(data: Arc<FileData>) -> Self {
        let len = data.bytes().len();
        SectionBytes {
            data,
            start: 0,
            len,
        }
    }
}

impl Deref for SectionBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.data.bytes()[self.start..self.start + self.len]
    }
}

impl fmt::Debug for SectionBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SectionBytes({} bytes)", self.len)
    }
}

// SAFETY: derefs into memory owned by an `Arc` (a mapping or a heap buffer) that neither moves
// nor changes while any clone is alive.
unsafe impl stable_deref_trait::StableDeref for SectionBytes {}
// SAFETY: clones share the same `Arc`, so they deref to the same address.
unsafe impl stable_deref_trait::CloneStableDeref for SectionBytes {}

pub(super) type Reader = gimli::EndianReader<gimli::RunTimeEndian, SectionBytes>;

/// Largest compressed debug section inflated onto the heap. Real ones are tens of MB.
const MAX_INFLATED_SECTION: u64 = 1 << 30;

/// A file's DWARF sections, as [`load_sections`] found them.
pub(super) struct LoadedSections {
    pub(super) dwarf: gimli::Dwarf<Reader>,
    /// Bytes of sections read through mappings (in place or inflated).
    pub(super) mapped_bytes: usize,
    /// The inflated copies of compressed sections.
    pub(super) inflated: Vec<Arc<FileData>>,
}

/// The DWARF sections of `file`, whose bytes are `data`; `None` when it has no `.debug_info`.
pub(super) fn load_sections(
    file: &object::File<'_>,
    data: &Arc<FileData>,
) -> Result<Option<LoadedSections>, gimli::Error> {
    if file.section_by_name(".debug_info").is_none() {
        return Ok(None);
    }
    let endian = if file.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let mut inflated = Vec::new();
    let mut mapped_bytes = 0;
    let empty = SectionBytes {
        data: data.clone(),
        start: 0,
        len: 0,
    };
    let dwarf = gimli::Dwarf::load(|id| -> Result<Reader, gimli::Error> {
        let Some(section) = file.section_by_name(id.name()) else {
            return Ok(Reader::new(empty.clone(), endian));
        };
        let range = section
            .compressed_file_range()
            .map_err(|_| gimli::Error::Io)?;
        let bytes = if range.format == CompressionFormat::None {
            let start = usize::try_from(range.offset).map_err(|_| gimli::Error::Io)?;
            let len = usize::try_from(range.compressed_size).map_err(|_| gimli::Error::Io)?;
            if start
                .checked_add(len)
                .is_none_or(|end| end > data.bytes().len())
            {
                return Err(gimli::Error::Io);
            }
            mapped_bytes += len;
            SectionBytes {
                data: data.clone(),
                start,
                len,
            }
        } else {
            // The header's size is input like any other: a corrupt one must not make us
            // allocate terabytes. Neither zlib nor zstd inflates beyond ~1032:1.
            let limit = range
                .compressed_size
                .saturating_mul(1032)
                .saturating_add(1 << 20);
            if range.uncompressed_size > limit.min(MAX_INFLATED_SECTION) {
                return Err(gimli::Error::Io);
            }
            let start = usize::try_from(range.offset).map_err(|_| gimli::Error::Io)?;
            let len = usize::try_from(range.compressed_size).map_err(|_| gimli::Error::Io)?;
            let compressed = data
                .bytes()
                .get(start..start.checked_add(len).ok_or(gimli::Error::Io)?)
                .ok_or(gimli::Error::Io)?;
            let copy = Arc::new(
                inflate(range.format, compressed, range.uncompressed_size)
                    .ok_or(gimli::Error::Io)?,
            );
            let len = copy.bytes().len();
            mapped_bytes += len;
            inflated.push(copy.clone());
            SectionBytes {
                data: copy,
                start: 0,
                len,
            }
        };
        Ok(Reader::new(bytes, endian))
    })?;
    let mut dwarf = dwarf;
    // Units that share an abbreviation table (common in large binaries) then share its parse.
    dwarf.populate_abbreviations_cache(gimli::AbbreviationsCacheStrategy::Duplicates);
    Ok(Some(LoadedSections {
        dwarf,
        mapped_bytes,
        inflated,
    }))
}

/// Inflates a compressed section into an unlinked temporary file and maps it, producing
/// exactly the size its header claims or nothing: the decoder is cut off one byte past the
/// claim, so a section that claims little and expands to gigabytes (a decompression bomb) costs
/// no more than its claim. An empty section maps nothing and stays on the heap.
fn inflate(format: CompressionFormat, compressed: &[u8], claimed: u64) -> Option<FileData> {
    use std::io::Read;
    let limit = claimed.checked_add(1)?;
    let mut decoder: Box<dyn Read + '_> = match format {
        CompressionFormat::Zlib => Box::new(flate2::read::ZlibDecoder::new(compressed)),
        CompressionFormat::Zstandard => {
            Box::new(ruzstd::decoding::StreamingDecoder::new(compressed).ok()?)
        }
        _ => return None,
    };
    if claimed == 0 {
        return Some(FileData::Owned(Vec::new()));
    }
    let mut file = tempfile::tempfile().ok()?;
    let written = std::io::copy(&mut (&mut decoder).take(limit), &mut file).ok()?;
    if written != claimed {
        return None;
    }
    FileData::map_file(&file, Path::new("inflated debug section")).ok()
}
