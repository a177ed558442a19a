//! What one ELF file knows about its code: `PT_LOAD` segments, symbol tables, GNU build id,
//! `.gnu_debuglink`, and DWARF with inline frames and file:line (through addr2line).
//!
//! Files are memory-mapped and DWARF sections are read in place, so only the pages a lookup
//! touches become resident, and addr2line parses only the compilation units that hold the
//! addresses asked for. Compressed sections (zlib, zstd; Debian's debug packages use them) are
//! inflated into unlinked temporary files and mapped too: their pages are page cache the kernel
//! can reclaim, not heap, and leave this process's RSS like the rest of the mapped DWARF.
//!
//! Every input here comes from outside the process and may be truncated or corrupt: parsing
//! errors become [`ElfError`], lookup failures become a fallback (DWARF, then symbol table,
//! then nothing), never a panic. `fuzz/` drives [`fuzz_one`] with arbitrary bytes.

use std::{
    borrow::Cow,
    cell::RefCell,
    collections::HashSet,
    fmt,
    fs::File,
    io,
    ops::Deref,
    path::{Path, PathBuf},
    sync::Arc,
};

use object::{CompressionFormat, Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};

use super::user::{ElfAddress, FileOffset};
use crate::sys::allocator::release_free_memory;

#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("parsing ELF file {path}: {source}")]
    Parse {
        path: PathBuf,
        source: object::Error,
    },
    #[error("reading DWARF in {path}: {source}")]
    Dwarf { path: PathBuf, source: gimli::Error },
}

/// The bytes of a file: mapped from disk, or owned (a copy of the vdso, fuzz input).
pub enum FileData {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl FileData {
    /// Maps `path` read-only.
    pub fn map(path: &Path) -> Result<Self, ElfError> {
        let file = File::open(path).map_err(|source| ElfError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::map_file(&file, path)
    }

    /// Maps an already open file read-only. `path` only names it in errors.
    pub fn map_file(file: &File, path: &Path) -> Result<Self, ElfError> {
        let read_err = |source| ElfError::Read {
            path: path.to_owned(),
            source,
        };
        // SAFETY: a private read-only map. A file truncated underneath it would fault on
        // access; binaries are replaced by rename, not rewritten in place, and a binary that is
        // mapped for execution cannot be opened for writing (ETXTBSY).
        let map = unsafe { memmap2::Mmap::map(file) }.map_err(read_err)?;
        Ok(FileData::Mapped(map))
    }

    pub fn bytes(&self) -> &[u8] {
        match self {
            FileData::Mapped(map) => map,
            FileData::Owned(bytes) => bytes,
        }
    }

    /// Drops this process's page-table entries for the mapping. The pages stay in the page
    /// cache (shared, not this process's RSS) and fault back in on the next read; without
    /// this, every DWARF page a lookup ever touched would count as scorch's memory.
    fn release_resident_pages(&self) {
        if let FileData::Mapped(map) = self {
            // SAFETY: the mapping is private and read-only and never written, so discarding
            // its pages loses nothing: the next access reads the file again.
            let _ = unsafe { map.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
        }
    }
}

/// A DWARF section's bytes: a window into a mapped file (the binary, or the inflated copy of a
/// compressed section). Cheap to clone, and its address never moves, which is what gimli's
/// owned reader needs.
#[derive(Clone)]
pub struct SectionBytes {
    data: Arc<FileData>,
    start: usize,
    len: usize,
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

type Reader = gimli::EndianReader<gimli::RunTimeEndian, SectionBytes>;

/// Largest compressed debug section inflated onto the heap. Real ones are tens of MB.
const MAX_INFLATED_SECTION: u64 = 1 << 30;

/// One function level at an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedFrame {
    /// Demangled name.
    pub function: String,
    /// The name as the binary spells it (mangled).
    pub system_name: String,
    /// Source file, when DWARF says.
    pub file: Option<String>,
    /// Source line, 0 when unknown. For an inlined function's caller, the call site.
    pub line: u32,
}

/// A `PT_LOAD` segment: which file bytes land at which ELF addresses.
#[derive(Debug, Clone, Copy)]
struct LoadSegment {
    file_offset: u64,
    file_size: u64,
    address: u64,
}

/// A function symbol: start, size (0 when the table does not say), name in the arena.
#[derive(Debug, Clone, Copy)]
struct FunctionSymbol {
    start: u64,
    size: u64,
    name_offset: u32,
    name_len: u32,
}

/// Function symbols from `.symtab` and `.dynsym`, sorted by address.
#[derive(Debug, Default)]
struct SymbolTable {
    symbols: Vec<FunctionSymbol>,
    arena: String,
}

impl SymbolTable {
    fn read(file: &object::File<'_>) -> Self {
        let mut table = SymbolTable::default();
        // .symtab is the full table; .dynsym survives `strip` and names exported functions.
        for symbol in file.symbols().chain(file.dynamic_symbols()) {
            if symbol.kind() != SymbolKind::Text || symbol.address() == 0 {
                continue;
            }
            let Ok(name) = symbol.name() else { continue };
            if name.is_empty() || name.len() > u32::MAX as usize {
                continue;
            }
            table.symbols.push(FunctionSymbol {
                start: symbol.address(),
                size: symbol.size(),
                name_offset: table.arena.len() as u32,
                name_len: name.len() as u32,
            });
            table.arena.push_str(name);
        }
        // Both tables name the same exported functions; keep one per address, preferring a
        // sized entry so lookups can tell where a function ends.
        table
            .symbols
            .sort_by(|a, b| a.start.cmp(&b.start).then(b.size.cmp(&a.size)));
        table.symbols.dedup_by_key(|s| s.start);
        table.symbols.shrink_to_fit();
        table.arena.shrink_to_fit();
        table
    }

    fn lookup(&self, address: u64) -> Option<&str> {
        let index = self
            .symbols
            .partition_point(|s| s.start <= address)
            .checked_sub(1)?;
        let symbol = self.symbols[index];
        // A sized symbol ends where it says; an unsized one (hand-written assembly) is trusted
        // up to the next symbol.
        if symbol.size != 0 && address >= symbol.start.saturating_add(symbol.size) {
            return None;
        }
        let start = symbol.name_offset as usize;
        self.arena.get(start..start + symbol.name_len as usize)
    }

    fn bytes(&self) -> usize {
        self.symbols.len() * std::mem::size_of::<FunctionSymbol>() + self.arena.len()
    }
}

/// How much DWARF (bytes of `.debug_info` plus `.debug_line` of the units lookups have
/// touched) one file's parsed state may cover before it is dropped and started afresh.
/// addr2line keeps every unit it ever parsed, and its parse costs about 0.8 bytes of heap per
/// byte of those sections; without a bound, a long-lived agent symbolising a large binary
/// would end up holding all of its DWARF in parsed form.
const MAX_PARSED_DWARF: usize = 8 << 20;

/// DWARF of a file, ready for address lookups.
struct Dwarf {
    sections: Arc<gimli::Dwarf<Reader>>,
    /// Which unit holds which addresses, built on the first lookup and kept: it is small, and
    /// it lets a lookup parse only the unit it needs.
    index: RefCell<UnitIndex>,
    /// Parsed lazily on the first lookup and dropped when it covers more than `budget`.
    parsed: RefCell<Parse>,
    budget: usize,
    /// How many times the parse was dropped and started afresh.
    reparses: std::cell::Cell<u64>,
    /// Lookups since [`ElfFile::release_idle_parse`] last looked.
    recent_lookups: std::cell::Cell<u64>,
    /// Lookups a unit's own view could not answer (a cross-unit reference): answered by the
    /// whole-file `Context`.
    unit_fallbacks: std::cell::Cell<u64>,
    /// Bytes of sections read through mappings (in place or inflated): an upper bound on what
    /// lookups can make resident.
    mapped_bytes: usize,
    /// The inflated copies of compressed sections, for releasing their pages.
    inflated: Vec<Arc<FileData>>,
}

/// Which compilation unit covers which addresses.
///
/// addr2line's `Context` indexes every unit of a file up front and keeps each one's
/// abbreviations and line-program header for as long as it lives: tens of MB of heap for a
/// large binary, to answer lookups that usually land in a handful of units. With this index a
/// lookup builds a `Context` over the one unit holding the address instead.
enum UnitIndex {
    NotYet,
    Units {
        /// Sorted by `begin`; adjacent ranges of one unit merged.
        spans: Vec<UnitSpan>,
        /// Some unit refers to entries of other units (`DW_FORM_ref_addr`, as Rust's and
        /// LTO's inlined functions do): a unit's view then holds the units it refers to as
        /// well, each at its real offset; a lookup it still cannot answer goes to the
        /// whole-file `Context`.
        cross_refs: bool,
        /// Every unit's `.debug_info` offset and length, sorted: where a reference lands.
        units: Vec<(usize, usize)>,
    },
    /// The index could not be built, or units use forms a one-unit view cannot serve
    /// (`DW_FORM_indirect`, references into a supplementary file): lookups go through one
    /// `Context` for the whole file.
    WholeFile,
}

/// An address range of one unit, and where the unit is in `.debug_info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct UnitSpan {
    begin: u64,
    end: u64,
    offset: usize,
    len: usize,
}

/// The key of the whole-file `Context` in [`ParsedDwarf::contexts`].
const WHOLE_FILE: usize = usize::MAX;

/// Where a file's DWARF parse stands.
enum Parse {
    NotYet,
    Parsed(ParsedDwarf),
    /// The unit index could not be read: lookups use the symbol table.
    Unreadable,
}

/// addr2line's lookup state, and which units it has parsed so far.
#[derive(Default)]
struct ParsedDwarf {
    /// One `Context` per unit lookups landed in, by the unit's `.debug_info` offset; or one
    /// for the whole file, under [`WHOLE_FILE`].
    contexts: std::collections::HashMap<usize, addr2line::Context<Reader>>,
    /// `.debug_info` offsets of the units lookups landed in.
    units: HashSet<usize>,
    /// Sum of those units' `.debug_info` and line-program bytes.
    covered: usize,
}

impl ParsedDwarf {
    /// Counts the unit of `context` holding `address` as parsed (addr2line has just parsed
    /// it, or had before); `key` names the unit when `context` holds only one, whose offset in
    /// its own view of `.debug_info` is 0.
    fn account(&mut self, key: usize, address: u64) {
        let Some(context) = self.contexts.get(&key) else {
            return;
        };
        let Some(unit) = context.find_dwarf_and_unit(address).skip_all_loads() else {
            return;
        };
        let offset = match unit.header.offset() {
            _ if key != WHOLE_FILE => key,
            gimli::UnitSectionOffset::DebugInfoOffset(offset) => offset.0,
            _ => return,
        };
        if self.units.insert(offset) {
            let lines = unit
                .line_program
                .as_ref()
                .map_or(0, |p| p.header().raw_program_buf().len());
            self.covered += unit.header.length_including_self() + lines;
        }
    }
}

/// The unit index of `sections`: each compilation unit's ranges (read from its root entry the
/// way addr2line does, one unit at a time, nothing kept but the ranges), or
/// [`UnitIndex::WholeFile`] when a unit refers outside itself.
fn build_unit_index(sections: &gimli::Dwarf<Reader>) -> gimli::Result<UnitIndex> {
    let mut spans = Vec::new();
    let mut cross_refs = false;
    let mut units = Vec::new();
    let mut headers = sections.units();
    while let Some(header) = headers.next()? {
        let Some(offset) = header.offset().as_debug_info_offset() else {
            continue;
        };
        units.push((offset.0, header.length_including_self()));
        match outside_references(sections, &header)? {
            OutsideReferences::None => {}
            OutsideReferences::SameFile => cross_refs = true,
            OutsideReferences::Unsupported => return Ok(UnitIndex::WholeFile),
        }
        if !matches!(
            header.type_(),
            gimli::UnitType::Compilation | gimli::UnitType::Skeleton(_)
        ) {
            continue;
        }
        let len = header.length_including_self();
        let Ok(unit) = sections.unit(header) else {
            continue;
        };
        let mut ranges = sections.unit_ranges(&unit)?;
        while let Some(range) = ranges.next()? {
            if range.begin < range.end {
                spans.push(UnitSpan {
                    begin: range.begin,
                    end: range.end,
                    offset: offset.0,
                    len,
                });
            }
        }
    }
    spans.sort_unstable_by_key(|s| (s.begin, s.end));
    let mut merged: Vec<UnitSpan> = Vec::with_capacity(spans.len());
    for span in spans {
        match merged.last_mut() {
            Some(last) if last.offset == span.offset && span.begin <= last.end => {
                last.end = last.end.max(span.end);
            }
            _ => merged.push(span),
        }
    }
    merged.shrink_to_fit();
    units.shrink_to_fit();
    Ok(UnitIndex::Units {
        spans: merged,
        cross_refs,
        units,
    })
}

/// The unit holding `address`. Units should not overlap, but a few spans before the last one
/// starting at or below `address` are tried, in case they do.
fn find_unit(spans: &[UnitSpan], address: u64) -> Option<UnitSpan> {
    let end = spans.partition_point(|s| s.begin <= address);
    spans[..end]
        .iter()
        .rev()
        .take(8)
        .find(|s| address < s.end)
        .copied()
}

/// What a unit's attributes may refer to outside the unit.
enum OutsideReferences {
    None,
    /// Entries of other units of the file (`DW_FORM_ref_addr`).
    SameFile,
    /// A supplementary file's entries, or forms only known per entry (`DW_FORM_indirect`).
    Unsupported,
}

/// What `header`'s abbreviations allow its attributes to refer to outside the unit: a view of
/// `.debug_info` holding only this unit must then keep it at its real offset, or cannot serve
/// it at all.
fn outside_references(
    sections: &gimli::Dwarf<Reader>,
    header: &gimli::UnitHeader<Reader>,
) -> gimli::Result<OutsideReferences> {
    use gimli::{constants as dw, Reader as _};
    let mut table = gimli::Section::reader(&sections.debug_abbrev).clone();
    table.skip(header.debug_abbrev_offset().0)?;
    let mut found = OutsideReferences::None;
    loop {
        if table.read_uleb128()? == 0 {
            return Ok(found);
        }
        let _tag = table.read_uleb128()?;
        let _children = table.read_u8()?;
        loop {
            let name = table.read_uleb128()?;
            let form = table.read_uleb128()?;
            if name == 0 && form == 0 {
                break;
            }
            let form = u16::try_from(form)
                .map(dw::DwForm)
                .unwrap_or(dw::DW_FORM_indirect);
            if form == dw::DW_FORM_implicit_const {
                table.read_sleb128()?;
            }
            if form == dw::DW_FORM_ref_addr {
                found = OutsideReferences::SameFile;
            } else if matches!(
                form,
                dw::DW_FORM_indirect
                    | dw::DW_FORM_GNU_ref_alt
                    | dw::DW_FORM_ref_sup4
                    | dw::DW_FORM_ref_sup8
            ) {
                return Ok(OutsideReferences::Unsupported);
            }
        }
    }
}

/// `sections` with `.debug_info` cut down to the one unit at `span`, for a `Context` that
/// parses only that unit. Every other section is shared as is: the unit's references into
/// them are offsets in those sections.
fn unit_dwarf(
    sections: &gimli::Dwarf<Reader>,
    span: &UnitSpan,
    cross_refs: Option<&[(usize, usize)]>,
) -> Option<gimli::Dwarf<Reader>> {
    use gimli::Reader as _;
    let info = gimli::Section::reader(&sections.debug_info);
    let end = span.offset.checked_add(span.len)?;
    if end > info.len() {
        return None;
    }
    let unit = if let Some(all_units) = cross_refs {
        let mut wanted = referenced_units(sections, span, all_units).unwrap_or_default();
        wanted.push((span.offset, span.len));
        wanted.sort_unstable();
        wanted.dedup();
        let padded = padded_units(info, &wanted, info.endian())?;
        let len = padded.bytes().len();
        Reader::new(
            SectionBytes {
                data: Arc::new(padded),
                start: 0,
                len,
            },
            info.endian(),
        )
    } else {
        info.range(span.offset..end)
    };
    let no_aranges = info.range(0..0);
    Some(gimli::Dwarf {
        debug_abbrev: sections.debug_abbrev.clone(),
        debug_addr: sections.debug_addr.clone(),
        // addr2line would take this unit's ranges from here, by its offset in the full
        // section; the unit's own DW_AT_ranges or low/high pc say the same.
        debug_aranges: no_aranges.into(),
        debug_info: unit.into(),
        debug_line: sections.debug_line.clone(),
        debug_line_str: sections.debug_line_str.clone(),
        debug_macinfo: sections.debug_macinfo.clone(),
        debug_macro: sections.debug_macro.clone(),
        debug_str: sections.debug_str.clone(),
        debug_str_offsets: sections.debug_str_offsets.clone(),
        debug_types: sections.debug_types.clone(),
        locations: sections.locations.clone(),
        ranges: sections.ranges.clone(),
        file_type: sections.file_type,
        sup: sections.sup.clone(),
        abbreviations_cache: gimli::AbbreviationsCache::new(),
    })
}

/// The units (offset, length) that `span`'s unit refers to by section offset, one level deep
/// (what a name lookup follows: an inlined function's abstract origin), read from its entries.
fn referenced_units(
    sections: &gimli::Dwarf<Reader>,
    span: &UnitSpan,
    all_units: &[(usize, usize)],
) -> gimli::Result<Vec<(usize, usize)>> {
    let header = sections
        .debug_info
        .header_from_offset(gimli::DebugInfoOffset(span.offset))?;
    let abbreviations = sections.abbreviations(&header)?;
    let mut entries = header.entries(&abbreviations);
    let mut found = Vec::new();
    while let Some((_, entry)) = entries.next_dfs()? {
        let mut attrs = entry.attrs();
        while let Some(attr) = attrs.next()? {
            if let gimli::AttributeValue::DebugInfoRef(target) = attr.value() {
                let index = all_units.partition_point(|&(offset, _)| offset <= target.0);
                if let Some(&(offset, len)) = index.checked_sub(1).map(|i| &all_units[i]) {
                    if target.0 < offset + len && offset != span.offset {
                        found.push((offset, len));
                    }
                }
            }
        }
    }
    found.sort_unstable();
    found.dedup();
    Ok(found)
}

/// `.debug_info` holding only `units` (sorted offset and length), each at its real offset, so
/// references between them keep their meaning and a reference to any other unit fails instead
/// of landing in the wrong one. A gap between them becomes one type unit, which addr2line
/// skips without reading past its header: anonymous memory nothing touches, address space but
/// not RSS. A gap too small for that header keeps its real units. Only the units' bytes are
/// copied.
fn padded_units(
    info: &[u8],
    units: &[(usize, usize)],
    endian: gimli::RunTimeEndian,
) -> Option<FileData> {
    let end = units.last().map(|&(offset, len)| offset + len)?;
    if end > info.len() {
        return None;
    }
    let mut map = memmap2::MmapMut::map_anon(end).ok()?;
    let mut at = 0;
    for &(offset, len) in units {
        if offset < at {
            return None;
        }
        let gap = offset - at;
        match padding_unit(gap, endian) {
            Some(header) => map[at..at + header.len()].copy_from_slice(&header),
            None => map[at..offset].copy_from_slice(&info[at..offset]),
        }
        map[offset..offset + len].copy_from_slice(&info[offset..offset + len]);
        at = offset + len;
    }
    Some(FileData::Mapped(map.make_read_only().ok()?))
}

/// The header of a DWARF 5 type unit spanning `gap` bytes (unit_length, version, unit_type,
/// address_size, debug_abbrev_offset, type_signature, type_offset; the 64-bit format when the
/// gap needs it), or `None` when the gap is too small to hold one.
fn padding_unit(gap: usize, endian: gimli::RunTimeEndian) -> Option<Vec<u8>> {
    let big = matches!(endian, gimli::RunTimeEndian::Big);
    let put = |out: &mut Vec<u8>, value: u64, size: usize| {
        if big {
            out.extend_from_slice(&value.to_be_bytes()[8 - size..]);
        } else {
            out.extend_from_slice(&value.to_le_bytes()[..size]);
        }
    };
    let wide = gap >= 0xffff_fff0;
    let (length_size, offset_size) = if wide { (12, 8) } else { (4, 4) };
    let header_len = length_size + 2 + 1 + 1 + offset_size + 8 + offset_size;
    if gap <= header_len {
        return None;
    }
    let mut header = Vec::with_capacity(header_len);
    if wide {
        put(&mut header, 0xffff_ffff, 4);
        put(&mut header, (gap - length_size) as u64, 8);
    } else {
        put(&mut header, (gap - length_size) as u64, 4);
    }
    put(&mut header, 5, 2);
    put(&mut header, u64::from(gimli::constants::DW_UT_type.0), 1);
    put(&mut header, 8, 1);
    put(&mut header, 0, offset_size);
    put(&mut header, 0, 8);
    put(&mut header, header_len as u64, offset_size);
    Some(header)
}

/// Why an ELF lookup found nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElfMiss {
    /// The file offset is in no `PT_LOAD` segment.
    NotLoaded,
    /// Neither DWARF nor the symbol tables cover the address.
    NoSymbol,
}

/// One ELF file's code knowledge.
pub struct ElfFile {
    /// Lowercase hex GNU build id.
    pub build_id: Option<String>,
    /// `.gnu_debuglink`: the separate debug file's name and the CRC-32 of its contents.
    pub debuglink: Option<(String, u32)>,
    segments: Vec<LoadSegment>,
    symbols: SymbolTable,
    dwarf: Option<Dwarf>,
    /// The mapped files this entry reads from (the binary, and its debug file when attached).
    data: Vec<Arc<FileData>>,
    /// DWARF problems met while resolving, reported as fallbacks; the frame still gets the
    /// symbol-table name.
    dwarf_errors: std::sync::atomic::AtomicU64,
}

impl fmt::Debug for ElfFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ElfFile")
            .field("build_id", &self.build_id)
            .field("symbols", &self.symbols.symbols.len())
            .field("has_dwarf", &self.dwarf.is_some())
            .finish()
    }
}

impl ElfFile {
    /// Maps and parses the file at `path`.
    pub fn open(path: &Path) -> Result<Self, ElfError> {
        Self::parse(Arc::new(FileData::map(path)?), path)
    }

    /// Parses an ELF image. `path` only names the input in errors.
    pub fn parse(data: Arc<FileData>, path: &Path) -> Result<Self, ElfError> {
        let parse_err = |source| ElfError::Parse {
            path: path.to_owned(),
            source,
        };
        let file = object::File::parse(data.bytes()).map_err(parse_err)?;
        let build_id = file
            .build_id()
            .map_err(parse_err)?
            .map(crate::sys::hex::to_hex);
        let debuglink = file
            .gnu_debuglink()
            .ok()
            .flatten()
            .map(|(name, crc)| (String::from_utf8_lossy(name).into_owned(), crc));
        let segments = file
            .segments()
            .map(|segment| {
                let (file_offset, file_size) = segment.file_range();
                LoadSegment {
                    file_offset,
                    file_size,
                    address: segment.address(),
                }
            })
            .collect();
        let symbols = SymbolTable::read(&file);
        // Corrupt DWARF costs the file its line tables, not its symbol names.
        let (mut dwarf, dwarf_unreadable) = match load_dwarf(&file, &data) {
            Ok(dwarf) => (dwarf, false),
            Err(source) => {
                let err = ElfError::Dwarf {
                    path: path.to_owned(),
                    source,
                };
                tracing::debug!("{err}");
                (None, true)
            }
        };
        let inflated = dwarf.as_mut().map(|d| std::mem::take(&mut d.inflated));
        let mapped = std::iter::once(data)
            .chain(inflated.unwrap_or_default())
            .collect();
        Ok(ElfFile {
            build_id,
            debuglink,
            segments,
            symbols,
            dwarf,
            data: mapped,
            dwarf_errors: u64::from(dwarf_unreadable).into(),
        })
    }

    /// True when the file carries its own DWARF line tables.
    pub fn has_dwarf(&self) -> bool {
        self.dwarf.is_some()
    }

    /// Takes DWARF (and, when it has more, the symbol table) from a separate debug file.
    pub fn attach_debug(&mut self, debug: ElfFile) {
        if self.dwarf.is_none() {
            self.dwarf = debug.dwarf;
        }
        if debug.symbols.symbols.len() > self.symbols.symbols.len() {
            self.symbols = debug.symbols;
        }
        self.data.extend(debug.data);
    }

    /// Lets the kernel reclaim the file pages lookups made resident (see
    /// [`FileData::release_resident_pages`]).
    pub fn release_resident_pages(&self) {
        for data in &self.data {
            data.release_resident_pages();
        }
    }

    /// Estimated memory this entry can hold: heap for tables and inflated sections, plus the
    /// mapped DWARF that lookups may fault in.
    pub fn cost(&self) -> usize {
        let dwarf = self.dwarf.as_ref().map_or(0, |d| d.mapped_bytes);
        self.symbols.bytes() + dwarf + 4096
    }

    /// Caps how much DWARF the file's parsed state may cover (default [`MAX_PARSED_DWARF`]).
    pub fn set_dwarf_parse_budget(&mut self, bytes: usize) {
        if let Some(dwarf) = &mut self.dwarf {
            dwarf.budget = bytes;
        }
    }

    /// Drops the DWARF parse when no lookup used it since the last call: a daemon calls this
    /// every window, so only the files its current stacks need keep their (megabytes of)
    /// parsed state. Returns whether a parse was dropped.
    pub fn release_idle_parse(&self) -> bool {
        let Some(dwarf) = &self.dwarf else {
            return false;
        };
        let idle = dwarf.recent_lookups.replace(0) == 0;
        let mut slot = dwarf.parsed.borrow_mut();
        if idle && matches!(&*slot, Parse::Parsed(_)) {
            *slot = Parse::NotYet;
            return true;
        }
        false
    }

    /// Looks DWARF up through one addr2line `Context` for the whole file, as files with
    /// cross-unit references do, instead of one per unit: for benchmarks comparing the two.
    pub fn use_whole_file_dwarf(&self) {
        if let Some(dwarf) = &self.dwarf {
            *dwarf.index.borrow_mut() = UnitIndex::WholeFile;
            *dwarf.parsed.borrow_mut() = Parse::NotYet;
        }
    }

    /// How many times the DWARF parse was dropped for covering more than its budget.
    pub fn dwarf_reparses(&self) -> u64 {
        self.dwarf.as_ref().map_or(0, |d| d.reparses.get())
    }

    /// DWARF errors met so far (each one fell back to the symbol table).
    pub fn dwarf_errors(&self) -> u64 {
        self.dwarf_errors.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The ELF address that `offset` is loaded at, through the `PT_LOAD` segment holding it.
    pub fn elf_address(&self, offset: FileOffset) -> Option<ElfAddress> {
        self.segments
            .iter()
            .find(|s| offset.0 >= s.file_offset && offset.0 - s.file_offset < s.file_size)
            .map(|s| ElfAddress(offset.0 - s.file_offset + s.address))
    }

    /// The function levels at `address`, innermost (inlined) first. DWARF first; the symbol
    /// table when DWARF has nothing or fails.
    pub fn resolve(&self, address: ElfAddress) -> Result<Vec<ResolvedFrame>, ElfMiss> {
        let symbol = self.symbols.lookup(address.0);
        // addr2line probes [address, address + 1): the last address cannot be asked about.
        let dwarf = self.dwarf.as_ref().filter(|_| address.0 != u64::MAX);
        if let Some(dwarf) = dwarf {
            match self.dwarf_frames(dwarf, address.0, symbol) {
                Ok(frames) if !frames.is_empty() => return Ok(frames),
                Ok(_) => {}
                Err(_) => {
                    self.dwarf_errors
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        let name = symbol.ok_or(ElfMiss::NoSymbol)?;
        Ok(vec![ResolvedFrame {
            function: demangle(name).into_owned(),
            system_name: name.to_owned(),
            file: None,
            line: 0,
        }])
    }
}

impl ElfFile {
    /// DWARF frames at `address`, through the parsed state, which is started afresh once it
    /// covers too much.
    fn dwarf_frames(
        &self,
        dwarf: &Dwarf,
        address: u64,
        symbol: Option<&str>,
    ) -> Result<Vec<ResolvedFrame>, gimli::Error> {
        dwarf.recent_lookups.set(dwarf.recent_lookups.get() + 1);
        let (span, cross_refs) = {
            let mut index = dwarf.index.borrow_mut();
            if matches!(&*index, UnitIndex::NotYet) {
                *index = build_unit_index(&dwarf.sections).unwrap_or(UnitIndex::WholeFile);
                // Indexing read a little of every unit (header, root entry, abbreviations);
                // the lookups that follow need few of those pages again.
                self.release_resident_pages();
            }
            match &*index {
                UnitIndex::Units {
                    spans, cross_refs, ..
                } => match find_unit(spans, address) {
                    Some(span) => (Some(span), *cross_refs),
                    // No unit covers it: nothing DWARF could say.
                    None => return Ok(Vec::new()),
                },
                _ => (None, false),
            }
        };
        let mut slot = dwarf.parsed.borrow_mut();
        if matches!(&*slot, Parse::Parsed(parsed) if parsed.covered > dwarf.budget) {
            // Dropping the parse frees its heap; the pages it read go too, and what the next
            // lookups need is parsed again (a unit's parse costs well under a millisecond).
            *slot = Parse::NotYet;
            self.release_resident_pages();
            release_free_memory();
            dwarf.reparses.set(dwarf.reparses.get() + 1);
        }
        if matches!(&*slot, Parse::NotYet) {
            *slot = Parse::Parsed(ParsedDwarf::default());
        }
        let Parse::Parsed(parsed) = &mut *slot else {
            return Ok(Vec::new());
        };
        if let Some(span) = span {
            let key = span.offset;
            if let std::collections::hash_map::Entry::Vacant(entry) = parsed.contexts.entry(key) {
                let index = dwarf.index.borrow();
                let all_units = match &*index {
                    UnitIndex::Units {
                        cross_refs: true,
                        units,
                        ..
                    } => Some(units.as_slice()),
                    _ => None,
                };
                let unit = unit_dwarf(&dwarf.sections, &span, all_units);
                if let Some(context) =
                    unit.and_then(|unit| addr2line::Context::from_arc_dwarf(Arc::new(unit)).ok())
                {
                    entry.insert(context);
                }
            }
            if let Some(context) = parsed.contexts.get(&key) {
                match dwarf_frames(context, address, symbol) {
                    Ok(frames) => {
                        parsed.account(key, address);
                        return Ok(frames);
                    }
                    // Without cross-unit references the unit's view is all there is.
                    Err(err) if !cross_refs => return Err(err),
                    // The frame refers to another unit: the whole file can answer.
                    Err(_) => dwarf.unit_fallbacks.set(dwarf.unit_fallbacks.get() + 1),
                }
            }
        }
        // Not the entry API: a failed build replaces the slot the entry would borrow.
        #[allow(clippy::map_entry)]
        if !parsed.contexts.contains_key(&WHOLE_FILE) {
            let built = addr2line::Context::from_arc_dwarf(dwarf.sections.clone());
            // The whole-file index read a little of every unit.
            self.release_resident_pages();
            match built {
                Ok(context) => {
                    parsed.contexts.insert(WHOLE_FILE, context);
                }
                Err(err) => {
                    *slot = Parse::Unreadable;
                    return Err(err);
                }
            }
        }
        let frames = match parsed.contexts.get(&WHOLE_FILE) {
            Some(context) => dwarf_frames(context, address, symbol),
            None => Ok(Vec::new()),
        };
        parsed.account(WHOLE_FILE, address);
        frames
    }
}

/// Demangles Rust (legacy and v0) and C++ names; anything else comes back unchanged.
pub fn demangle(name: &str) -> Cow<'_, str> {
    // Itanium C++ names start with _Z, Rust v0 with _R, legacy Rust is Itanium-shaped. Most
    // names (C, assembly) are neither, and trying two demanglers on each costs time.
    if !(name.starts_with("_Z") || name.starts_with("_R") || name.starts_with("__Z")) {
        return Cow::Borrowed(name);
    }
    addr2line::demangle_auto(Cow::Borrowed(name), None)
}

fn load_dwarf(
    file: &object::File<'_>,
    data: &Arc<FileData>,
) -> Result<Option<Dwarf>, gimli::Error> {
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
    Ok(Some(Dwarf {
        sections: Arc::new(dwarf),
        index: RefCell::new(UnitIndex::NotYet),
        parsed: RefCell::new(Parse::NotYet),
        budget: MAX_PARSED_DWARF,
        reparses: 0.into(),
        recent_lookups: 0.into(),
        unit_fallbacks: 0.into(),
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

fn dwarf_frames(
    context: &addr2line::Context<Reader>,
    address: u64,
    symbol: Option<&str>,
) -> Result<Vec<ResolvedFrame>, gimli::Error> {
    let mut frames = Vec::new();
    let mut iter = context.find_frames(address).skip_all_loads()?;
    while let Some(frame) = iter.next()? {
        let system_name = match &frame.function {
            Some(function) => function.raw_name()?.into_owned(),
            None => String::new(),
        };
        let function = match &frame.function {
            Some(function) => function.demangle()?.into_owned(),
            None => String::new(),
        };
        let (file, line) = frame.location.map_or((None, 0), |l| {
            (l.file.map(str::to_owned), l.line.unwrap_or(0))
        });
        frames.push(ResolvedFrame {
            function,
            system_name,
            file,
            line,
        });
    }
    // The outermost frame is the real function: when DWARF has no name for it (some
    // compilers only give the inlined ones names), the symbol table does.
    if let (Some(outer), Some(symbol)) = (frames.last_mut(), symbol) {
        if outer.function.is_empty() {
            outer.function = demangle(symbol).into_owned();
            outer.system_name = symbol.to_owned();
        }
    }
    frames.retain(|f| !f.function.is_empty());
    Ok(frames)
}

/// Parses arbitrary bytes as an ELF file and resolves addresses spread over its segments,
/// the way the profiler would. Must never panic: `fuzz/` calls it with corrupt input and the
/// regression files under `agent/tests/fuzz-regressions/` keep what it found.
pub fn fuzz_one(data: &[u8]) {
    let Ok(file) = ElfFile::parse(Arc::new(FileData::Owned(data.to_vec())), Path::new("fuzz"))
    else {
        return;
    };
    let mut addresses: Vec<u64> = file
        .segments
        .iter()
        .flat_map(|s| [s.address, s.address.wrapping_add(s.file_size / 2)])
        .chain(file.symbols.symbols.iter().take(64).map(|s| s.start))
        .collect();
    addresses.extend([0, 1, u64::MAX]);
    for address in addresses {
        let _ = file.resolve(ElfAddress(address));
    }
    let _ = file.elf_address(FileOffset(0));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corrupt_elf_is_an_error_not_a_panic() {
        let data = Arc::new(FileData::Owned(b"\x7fELF\x02\x01\x01garbage".to_vec()));
        let err = ElfFile::parse(data, Path::new("bad.so")).unwrap_err();
        assert!(
            err.to_string().starts_with("parsing ELF file bad.so:"),
            "{err}"
        );
    }

    #[test]
    fn resolves_own_functions_with_dwarf() {
        // This test binary has DWARF (tests build with debug info): resolve one of its own
        // functions through its own file, and expect a source file and line.
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let file = ElfFile::open(&exe).unwrap();
        assert!(file.has_dwarf());
        assert!(file.build_id.is_some());
        let maps = super::super::user::ProcessMaps::read(std::process::id()).unwrap();
        let address = resolves_own_functions_with_dwarf as *const () as u64;
        let (_, entry) = maps.find(address).unwrap();
        let elf_address = file.elf_address(entry.file_offset(address)).unwrap();
        let frames = file.resolve(elf_address).unwrap();
        let outer = frames.last().unwrap();
        assert!(
            outer
                .function
                .ends_with("resolves_own_functions_with_dwarf"),
            "{frames:?}"
        );
        assert!(
            outer
                .file
                .as_deref()
                .is_some_and(|f| f.ends_with("elf/mod.rs")),
            "{frames:?}"
        );
        assert!(outer.line > 0);
    }

    #[test]
    fn bounded_parse_resolves_the_same_frames() {
        // With a budget of one byte the parse is dropped before every lookup: the frames
        // must not change, only the work to find them.
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let unbounded = ElfFile::open(&exe).unwrap();
        let mut bounded = ElfFile::open(&exe).unwrap();
        bounded.set_dwarf_parse_budget(1);
        let addresses: Vec<ElfAddress> = unbounded
            .symbols
            .symbols
            .iter()
            .step_by(97)
            .take(60)
            .map(|s| ElfAddress(s.start + 1))
            .collect();
        let mut with_lines = 0;
        for &address in &addresses {
            let expected = unbounded.resolve(address);
            with_lines += usize::from(
                expected
                    .as_ref()
                    .is_ok_and(|frames| frames.iter().any(|f| f.line > 0)),
            );
            assert_eq!(bounded.resolve(address), expected, "at {address:?}");
        }
        assert!(with_lines > 30, "only {with_lines} addresses had lines");
        // Every lookup that found a unit put it over budget for the next one.
        assert!(bounded.dwarf_reparses() >= with_lines as u64 - 1);
        assert_eq!(unbounded.dwarf_reparses(), 0);
    }

    /// Builds a C program of three units, with inlined static helpers, at -O2 with DWARF.
    fn three_unit_program(dir: &Path) -> PathBuf {
        for (unit, seed) in [("a", 3), ("b", 5), ("c", 7)] {
            let source = format!(
                "static inline int helper_{unit}(int x) {{ return x * {seed} + (x >> 2); }}\n\
                 int work_{unit}(int n) {{ int s = 0; for (int i = 0; i < n; i++) \
                 s += helper_{unit}(i ^ s); return s; }}\n\
                 int more_{unit}(int n) {{ return work_{unit}(n) + helper_{unit}(n); }}\n"
            );
            std::fs::write(dir.join(format!("{unit}.c")), source).unwrap();
        }
        std::fs::write(
            dir.join("main.c"),
            "int more_a(int); int more_b(int); int more_c(int);\n\
             int main(int argc, char **argv) { return more_a(argc) + more_b(argc) + more_c(argc); }\n",
        )
        .unwrap();
        let binary = dir.join("three-units");
        let status = std::process::Command::new("gcc")
            .args(["-O2", "-g", "-o"])
            .arg(&binary)
            .args(["main.c", "a.c", "b.c", "c.c"].map(|f| dir.join(f)))
            .status()
            .unwrap();
        assert!(status.success());
        binary
    }

    #[test]
    fn unit_lookups_resolve_what_the_whole_file_does() {
        let dir = tempfile::tempdir().unwrap();
        let binary = three_unit_program(dir.path());
        let by_unit = ElfFile::open(&binary).unwrap();
        let whole = ElfFile::open(&binary).unwrap();
        whole.use_whole_file_dwarf();
        // Every byte of every function: starts, inlined bodies, ends, and the gaps between.
        let mut addresses = Vec::new();
        for symbol in &by_unit.symbols.symbols {
            for offset in 0..symbol.size.max(1) + 4 {
                addresses.push(ElfAddress(symbol.start + offset));
            }
        }
        let mut inlined = 0;
        for &address in &addresses {
            let expected = whole.resolve(address);
            inlined += usize::from(expected.as_ref().is_ok_and(|f| f.len() > 1));
            assert_eq!(by_unit.resolve(address), expected, "at {address:?}");
        }
        assert!(inlined > 10, "only {inlined} addresses in inlined code");
        // The per-unit path is the one that ran: one context per unit looked up.
        let dwarf = by_unit.dwarf.as_ref().unwrap();
        let UnitIndex::Units { spans, .. } = &*dwarf.index.borrow() else {
            panic!("a C program without cross-unit references fell back to the whole file");
        };
        assert!(spans.len() >= 4, "{spans:?}");
        let Parse::Parsed(parsed) = &*dwarf.parsed.borrow() else {
            panic!("nothing parsed");
        };
        assert!(parsed.contexts.len() >= 4 && !parsed.contexts.contains_key(&WHOLE_FILE));
    }

    #[test]
    fn unit_lookups_with_cross_unit_references_resolve_what_the_whole_file_does() {
        // This test binary is Rust: its units refer to each other's entries.
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let by_unit = ElfFile::open(&exe).unwrap();
        let whole = ElfFile::open(&exe).unwrap();
        whole.use_whole_file_dwarf();
        let addresses: Vec<ElfAddress> = by_unit
            .symbols
            .symbols
            .iter()
            .step_by(23)
            .take(400)
            .flat_map(|s| [s.start, s.start + s.size / 2])
            .map(ElfAddress)
            .collect();
        let mut inlined = 0;
        for &address in &addresses {
            let expected = whole.resolve(address);
            inlined += usize::from(expected.as_ref().is_ok_and(|f| f.len() > 1));
            assert_eq!(by_unit.resolve(address), expected, "at {address:?}");
        }
        assert!(inlined > 20, "only {inlined} addresses in inlined code");
        let dwarf = by_unit.dwarf.as_ref().unwrap();
        assert!(matches!(
            &*dwarf.index.borrow(),
            UnitIndex::Units {
                cross_refs: true,
                ..
            }
        ));
        // Most lookups were answered by their unit alone.
        let fallbacks = dwarf.unit_fallbacks.get();
        assert!(
            fallbacks < addresses.len() as u64 / 20,
            "{fallbacks} of {} lookups needed the whole file",
            addresses.len()
        );
    }

    #[test]
    fn demangles_rust_and_cpp() {
        assert_eq!(
            demangle("_ZN4core3fmt5write17h0123456789abcdefE"),
            "core::fmt::write"
        );
        assert_eq!(demangle("_RNvCs1234_7mycrate4work"), "mycrate::work");
        assert_eq!(demangle("_ZN2ns5Shape4areaEv"), "ns::Shape::area()");
        assert_eq!(demangle("plain_c_function"), "plain_c_function");
    }

    #[test]
    fn fuzz_regressions_do_not_panic() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-regressions");
        let entries = std::fs::read_dir(&dir).expect("agent/tests/fuzz-regressions is committed");
        for entry in entries.flatten() {
            fuzz_one(&std::fs::read(entry.path()).unwrap());
        }
        // Truncations of a real binary: every prefix length class must fail cleanly.
        let exe = std::fs::read(std::fs::read_link("/proc/self/exe").unwrap()).unwrap();
        for len in [0, 4, 16, 64, 512, 4096, exe.len() / 3, exe.len() - 1] {
            fuzz_one(&exe[..len]);
        }
    }
}
