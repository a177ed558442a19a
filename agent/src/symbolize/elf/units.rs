//! Which compilation unit holds an address, and a view of a file's DWARF holding only that
//! unit (and the units it refers to), so an addr2line `Context` parses one unit, not all.

use std::sync::Arc;

use super::sections::{Reader, SectionBytes};
use super::{DwarfLimits, FileData, OverBudget};

/// Which compilation unit covers which addresses.
///
/// addr2line's `Context` indexes every unit of a file up front and keeps each one's
/// abbreviations and line-program header for as long as it lives: tens of MB of heap for a
/// large binary, to answer lookups that usually land in a handful of units. With this index a
/// lookup builds a `Context` over the one unit holding the address instead.
pub(super) enum UnitIndex {
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
    /// The file has more units or ranges than an index may hold: its DWARF is not used.
    OverBudget(OverBudget),
}

/// An address range of one unit, and where the unit is in `.debug_info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct UnitSpan {
    begin: u64,
    end: u64,
    /// Where the unit starts in `.debug_info`: it names the unit.
    pub(super) offset: usize,
    len: usize,
}

/// Most units one file's unit index holds: 16 bytes each in `units`, 2 MiB at most. The
/// largest real programs have tens of thousands of compilation units; more is a file built to
/// cost, and addr2line's whole-file `Context`, which lookups may fall back to, would keep a
/// parsed header (line program included) for every one of them.
pub(super) const MAX_UNITS: usize = 1 << 17;

/// Most range-list entries read for one file's unit index, counted as read, before they become
/// ranges: a range list of only base-address entries yields nothing and still costs time, and
/// every unit may name the same list. Each entry becomes at most one 32-byte span, so the spans
/// take 32 MiB at most (before adjacent ones merge). Real files have about a thousand entries
/// per MiB of DWARF (this crate's debug test binary: 144 MiB, 932 units, 142 000 entries), so
/// this admits about a GiB of it; beyond, symbol tables name the frames.
pub(super) const MAX_RANGE_ENTRIES: usize = 1 << 20;

/// Bytes of units walked between two releases of the pages the walk made resident.
const RELEASE_EVERY: usize = 4 << 20;

/// The unit index of `sections`: each compilation unit's ranges (read from its root entry the
/// way addr2line does, one unit at a time, nothing kept but the ranges), or
/// [`UnitIndex::WholeFile`] when a unit refers outside itself or cannot be read, or
/// [`UnitIndex::OverBudget`] when the file has more units or range-list entries than `limits`
/// allow. Every unit is walked even when the index falls back to the whole file: that
/// `Context` reads the same units and ranges, and must be held to the same limits.
///
/// The walk touches a page or more of every unit, which in a mapped file counts as this
/// process's memory until let go: `release_pages` is called after every
/// [`RELEASE_EVERY`] bytes of units, so indexing a binary with 100 MB of DWARF (scorch's own,
/// when the daemon samples itself) costs a few MiB of resident pages instead of tens.
pub(super) fn build_unit_index(
    sections: &gimli::Dwarf<Reader>,
    limits: &DwarfLimits,
    release_pages: &dyn Fn(),
) -> gimli::Result<UnitIndex> {
    let mut walked_since_release = 0usize;
    let mut spans = Vec::new();
    let mut cross_refs = false;
    let mut whole_file = false;
    let mut units = Vec::new();
    let mut range_entries = 0usize;
    // An error here is one addr2line meets at the same header, before any unit past it.
    let mut headers = sections.units();
    while let Some(header) = headers.next()? {
        let Some(offset) = header.offset().as_debug_info_offset() else {
            continue;
        };
        if units.len() >= limits.units {
            return Ok(UnitIndex::OverBudget(OverBudget::Units));
        }
        units.push((offset.0, header.length_including_self()));
        walked_since_release += header.length_including_self();
        if walked_since_release >= RELEASE_EVERY {
            release_pages();
            walked_since_release = 0;
        }
        match outside_references(sections, &header) {
            Ok(OutsideReferences::None) => {}
            Ok(OutsideReferences::SameFile) => cross_refs = true,
            Ok(OutsideReferences::Unsupported) | Err(_) => whole_file = true,
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
        let left = limits.range_entries.saturating_sub(range_entries);
        match count_range_entries(sections, &unit, left) {
            Ok(count) => range_entries = range_entries.saturating_add(count),
            Err(_) => whole_file = true,
        }
        if range_entries > limits.range_entries {
            return Ok(UnitIndex::OverBudget(OverBudget::RangeEntries));
        }
        if whole_file {
            continue;
        }
        let mut push_ranges = || -> gimli::Result<()> {
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
            Ok(())
        };
        whole_file = push_ranges().is_err();
    }
    if whole_file {
        return Ok(UnitIndex::WholeFile);
    }
    spans.sort_unstable_by_key(|s| (s.begin, s.end));
    // Merged in place: a second vector would double the index's peak.
    spans.dedup_by(|next, last| {
        let adjacent = last.offset == next.offset && next.begin <= last.end;
        if adjacent {
            last.end = last.end.max(next.end);
        }
        adjacent
    });
    spans.shrink_to_fit();
    units.shrink_to_fit();
    Ok(UnitIndex::Units {
        spans,
        cross_refs,
        units,
    })
}

/// How many entries `unit`'s range list has, read raw (base-address and end entries too), or 1
/// for a unit with a single range or none. Reading stops once the count passes `left` (the
/// caller then refuses the file, whatever the rest holds) or at an entry that cannot be read,
/// where addr2line stops too.
fn count_range_entries(
    sections: &gimli::Dwarf<Reader>,
    unit: &gimli::Unit<Reader>,
    left: usize,
) -> gimli::Result<usize> {
    let mut entries = unit.entries();
    let root = entries.next_dfs()?.ok_or(gimli::Error::MissingUnitDie)?.1;
    let Some(value) = root.attr_value(gimli::DW_AT_ranges)? else {
        return Ok(1);
    };
    let Some(offset) = sections.attr_ranges_offset(unit, value)? else {
        return Ok(1);
    };
    let mut raw = sections.raw_ranges(unit, offset)?;
    let mut count = 0;
    while let Ok(Some(_)) = raw.next() {
        count += 1;
        if count > left {
            break;
        }
    }
    Ok(count)
}

/// The unit holding `address`. Units should not overlap, but a few spans before the last one
/// starting at or below `address` are tried, in case they do.
pub(super) fn find_unit(spans: &[UnitSpan], address: u64) -> Option<UnitSpan> {
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
pub(super) fn unit_dwarf(
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
        Reader::new(SectionBytes::whole(Arc::new(padded)), info.endian())
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
    // Anonymous memory cannot shrink: no SIGBUS guard.
    Some(FileData::Mapped(map.make_read_only().ok()?, None))
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
