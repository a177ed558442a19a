//! Loading an ELF file's DWARF sections for gimli without copying them onto the heap: plain
//! sections are windows into the file's mapping, compressed ones (zlib, zstd) are inflated
//! into unlinked temporary files and mapped, so either way their pages are page cache the
//! kernel can reclaim. What the compressed sections claim to inflate to is added up and held
//! to the file's budget before the first one is inflated.

use std::{fmt, ops::Deref, path::Path, sync::Arc};

use object::{CompressionFormat, Object, ObjectSection};

use super::{DwarfLoad, DwarfOptions, FileData, OverBudget};

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

/// How many bytes one file's compressed DWARF sections may inflate to, all together (and so any
/// one of them: there is no separate bound per section). Inflated copies are written out (to
/// `$TMPDIR`, which may be memory, unless a scratch directory is set) and stay for as long as
/// the file is cached, and the files come from any local user or container: a bound per section
/// alone let one file cost about fifteen times that bound. Real debug info compresses 3-5x, so
/// this admits files with 100-170 MiB of compressed DWARF, more than all but the largest
/// programs' debug files carry; those are named from their symbol tables. The user symboliser
/// lowers it to its cache budget, which counts inflated bytes: a file that fills the cache
/// alone is evicted at the next window and would be inflated again at the next lookup.
pub(super) const MAX_INFLATED_PER_FILE: u64 = 512 << 20;

/// A file's DWARF sections, as [`load_sections`] found them.
pub(super) struct LoadedSections {
    pub(super) dwarf: gimli::Dwarf<Reader>,
    /// Bytes of sections read through mappings (in place or inflated).
    pub(super) mapped_bytes: usize,
    /// The inflated copies of compressed sections.
    pub(super) inflated: Vec<Arc<FileData>>,
}

/// The DWARF sections of `file`, whose bytes are `data`, inflated as `options` say: nothing
/// when it has no `.debug_info`, and nothing inflated when its compressed sections claim more
/// than its budget.
pub(super) fn load_sections(
    file: &object::File<'_>,
    data: &Arc<FileData>,
    options: &DwarfOptions,
) -> Result<DwarfLoad<LoadedSections>, gimli::Error> {
    if file.section_by_name(".debug_info").is_none() {
        return Ok(DwarfLoad::Absent);
    }
    let claimed = claimed_inflated_bytes(file)?;
    if claimed > options.limits.inflated_bytes {
        return Ok(DwarfLoad::OverBudget(OverBudget::Inflated { claimed }));
    }
    let scratch_dir = options.scratch_dir.as_deref();
    let cache = options.section_cache.as_ref();
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
        let Some(section) = symbolization_needs(id)
            .then(|| file.section_by_name(id.name()))
            .flatten()
        else {
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
            // Already checked, with the others' claims, before the first was inflated.
            plausible_claim(&range)?;
            let start = usize::try_from(range.offset).map_err(|_| gimli::Error::Io)?;
            let len = usize::try_from(range.compressed_size).map_err(|_| gimli::Error::Io)?;
            let compressed = data
                .bytes()
                .get(start..start.checked_add(len).ok_or(gimli::Error::Io)?)
                .ok_or(gimli::Error::Io)?;
            let copy = Arc::new(
                cache
                    .and_then(|cache| {
                        cache.inflated(range.format, compressed, range.uncompressed_size, |file| {
                            inflate_into(range.format, compressed, range.uncompressed_size, file)
                        })
                    })
                    .or_else(|| {
                        inflate(
                            range.format,
                            compressed,
                            range.uncompressed_size,
                            scratch_dir,
                        )
                    })
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
    Ok(DwarfLoad::Loaded(LoadedSections {
        dwarf,
        mapped_bytes,
        inflated,
    }))
}

/// Whether naming a pc (units, their functions and inlined calls, line tables) reads section
/// `id`. Variable locations (`.debug_loc`, `.debug_loclists`), macros, type units and the
/// address ranges table (units are indexed from their own ranges) are never read, and are
/// left out rather than mapped or inflated: in libc6-dbg's compressed debug file the location
/// lists alone are a sixth of what would be inflated.
fn symbolization_needs(id: gimli::SectionId) -> bool {
    use gimli::SectionId::*;
    !matches!(
        id,
        DebugLoc | DebugLocLists | DebugMacinfo | DebugMacro | DebugTypes | DebugAranges
    )
}

/// What the compressed sections among those gimli loads claim to inflate to, together.
/// gimli's own loader walks the sections, with the same filter, so the sum covers exactly
/// the ones [`load_sections`] would inflate.
fn claimed_inflated_bytes(file: &object::File<'_>) -> Result<u64, gimli::Error> {
    let mut claimed = 0u64;
    gimli::DwarfSections::<()>::load(|id| -> Result<(), gimli::Error> {
        let Some(section) = symbolization_needs(id)
            .then(|| file.section_by_name(id.name()))
            .flatten()
        else {
            return Ok(());
        };
        let range = section
            .compressed_file_range()
            .map_err(|_| gimli::Error::Io)?;
        if range.format != CompressionFormat::None {
            claimed = claimed.saturating_add(plausible_claim(&range)?);
        }
        Ok(())
    })?;
    Ok(claimed)
}

/// The size a compressed section's header claims, unless its compressed bytes cannot hold it:
/// the claim is input like any other, and neither zlib nor zstd inflates beyond ~1032:1.
fn plausible_claim(range: &object::CompressedFileRange) -> Result<u64, gimli::Error> {
    let limit = range
        .compressed_size
        .saturating_mul(1032)
        .saturating_add(1 << 20);
    if range.uncompressed_size > limit {
        return Err(gimli::Error::Io);
    }
    Ok(range.uncompressed_size)
}

/// Inflates a compressed section into an unlinked temporary file and maps it, producing
/// exactly the size its header claims or nothing: the decoder is cut off one byte past the
/// claim, so a section that claims little and expands to gigabytes (a decompression bomb) costs
/// no more than its claim. An empty section maps nothing and stays on the heap. The file is
/// made in `scratch_dir`, or `$TMPDIR` without one.
fn inflate(
    format: CompressionFormat,
    compressed: &[u8],
    claimed: u64,
    scratch_dir: Option<&Path>,
) -> Option<FileData> {
    if claimed == 0 {
        // Still refused when the format is not one this reads.
        inflate_into(format, compressed, 0, &mut std::io::sink())?;
        return Some(FileData::Owned(Vec::new()));
    }
    let mut file = match scratch_dir {
        Some(dir) => tempfile::tempfile_in(dir),
        None => tempfile::tempfile(),
    }
    .ok()?;
    if inflate_into(format, compressed, claimed, &mut file)? != claimed {
        return None;
    }
    FileData::map_file(&file, Path::new("inflated debug section")).ok()
}

/// Inflates `compressed` into `out`, cut off one byte past `claimed`; returns the bytes
/// written.
fn inflate_into(
    format: CompressionFormat,
    compressed: &[u8],
    claimed: u64,
    out: &mut impl std::io::Write,
) -> Option<u64> {
    use std::io::Read;
    let limit = claimed.checked_add(1)?;
    let mut decoder: Box<dyn Read + '_> = match format {
        CompressionFormat::Zlib => Box::new(flate2::read::ZlibDecoder::new(compressed)),
        CompressionFormat::Zstandard => {
            Box::new(ruzstd::decoding::StreamingDecoder::new(compressed).ok()?)
        }
        _ => return None,
    };
    std::io::copy(&mut (&mut decoder).take(limit), out).ok()
}
