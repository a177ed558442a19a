//! Go's `.gopclntab`: the function table every Go binary carries, stripped (`-ldflags=-s -w`)
//! or not, read in place from the file's bytes.
//!
//! Go code has no `.eh_frame` and a stripped Go binary has no symbols or DWARF, yet the
//! runtime needs both answers for its own tracebacks, so the linker always writes this table:
//! for each function its entry, name and flags, and pc-value tables giving at every pc the
//! stack-pointer delta, the file, the line and the inlined call it is in. This module names
//! pcs from it (inlined frames innermost first, as DWARF's come out of addr2line) and hands
//! the stack-pointer deltas to the unwinder.
//!
//! Formats, told by the header's magic: 1.2 to 1.15 (names, lines and deltas; no inlined
//! frames), 1.16/1.17, 1.18/1.19 and 1.20 onwards. Only little-endian tables with 8-byte
//! pointers and a 1-byte pc quantum (x86-64) are read; others are refused naming the field.
//!
//! The file is hostile: every read is bounds-checked, every loop is bounded by the bytes it
//! consumes or a fixed depth, and a table found inconsistent gives an error rather than a
//! wrong name. Nothing is indexed on the heap: a lookup is a binary search over the functab
//! in the file plus one function's pc-value tables.

use std::ops::Range;

use object::{
    read::elf::{ElfFile, FileHeader, NoteIterator, ProgramHeader, SectionHeader},
    Endianness, Object, ObjectSection, ObjectSegment, ObjectSymbol, SegmentFlags,
};

/// Why a table could not be read, or a pc not named from it. Offsets are file offsets.
#[derive(Debug, thiserror::Error)]
pub enum PclntabError {
    #[error(
        "the Go pclntab at offset {offset:#x} has magic {magic:#x}, which no Go version writes"
    )]
    UnknownMagic { magic: u32, offset: u64 },
    #[error(
        "the Go pclntab at offset {offset:#x} has {field} {value:#x}: only little-endian tables \
         with ptrSize 8 and minLC 1 (x86-64) are read"
    )]
    Unsupported {
        field: &'static str,
        value: u64,
        offset: u64,
    },
    #[error(
        "the Go pclntab header at offset {offset:#x} has {field} {value:#x}, which does not fit \
         in the table's {len:#x} bytes"
    )]
    Header {
        field: &'static str,
        value: u64,
        offset: u64,
        len: u64,
    },
    #[error("{what} at offset {offset:#x} is past the end of the table or file")]
    Truncated { what: &'static str, offset: u64 },
    #[error("{what} at address {address:#x} is in no loaded segment of the file")]
    Unmapped { what: &'static str, address: u64 },
    #[error("{what} at offset {offset:#x} has no NUL within {MAX_STRING} bytes, or is not UTF-8")]
    BadString { what: &'static str, offset: u64 },
    #[error("varint at offset {offset:#x} is longer than 5 bytes or overflows 32 bits")]
    Varint { offset: u64 },
    #[error("the Go pclntab's textStart is 0 (not relocated) and there is no runtime.text symbol")]
    NoTextStart,
    #[error("pc {pc:#x} is in no function: the Go pclntab covers {start:#x}..{end:#x}")]
    NoFunction { pc: u64, start: u64, end: u64 },
    #[error("functab entry {index} ({entry:#x}) is below the one before it: not sorted")]
    Unsorted { index: u64, entry: u64 },
    #[error("the _func at offset {offset:#x} has entry {found:#x}; functab entry {index}: {expected:#x}")]
    EntryMismatch {
        index: u64,
        offset: u64,
        found: u64,
        expected: u64,
    },
    #[error("the {table} table of the function at {entry:#x} ends before pc {pc:#x}")]
    PcValueEnds {
        table: &'static str,
        entry: u64,
        pc: u64,
    },
    #[error("{what} of the function at {entry:#x} is {value:#x}, outside the function")]
    OutsideFunction {
        what: &'static str,
        entry: u64,
        value: u64,
    },
    #[error("the inlined frames at pc {pc:#x} are deeper than {MAX_INLINE_DEPTH}: a cycle")]
    InlineTooDeep { pc: u64 },
    #[error("the pcsp table of the function at {entry:#x} {problem}")]
    BadSpTable { entry: u64, problem: &'static str },
    #[error("the function at {entry:#x} is not entry {index} of this table")]
    ForeignFunction { entry: u64, index: u64 },
}

type Result<T> = std::result::Result<T, PclntabError>;

/// The table layouts, named by the first Go version that wrote each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// 1.2 to 1.15: one table, every offset from its start, absolute entries.
    Go12,
    /// 1.16/1.17: sub-tables (names, per-CU files, pc values); absolute `uintptr` entries and
    /// funcdata addresses. 1.17 added the flag byte (1.16 left it 0).
    Go116,
    /// 1.18/1.19: `textStart` in the header, 32-bit entries relative to it, funcdata as
    /// offsets from `go.func.*`.
    Go118,
    /// 1.20 onwards: `_func.startLine`, and 16-byte inlined calls.
    Go120,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Go12 => "1.2",
            Format::Go116 => "1.16",
            Format::Go118 => "1.18",
            Format::Go120 => "1.20",
        }
    }

    fn from_magic(magic: u32) -> Option<Format> {
        match magic {
            0xffff_fffb => Some(Format::Go12),
            0xffff_fffa => Some(Format::Go116),
            0xffff_fff0 => Some(Format::Go118),
            0xffff_fff1 => Some(Format::Go120),
            _ => None,
        }
    }

    /// Bytes of a functab field (an entry or a `_func` offset), and of `_func.entry`.
    fn word(self) -> u64 {
        match self {
            Format::Go12 | Format::Go116 => 8,
            Format::Go118 | Format::Go120 => 4,
        }
    }

    /// Where `funcID` is in a `_func` (the flag byte, a pad byte and `nfuncdata` follow it),
    /// and the `_func`'s fixed size, which its pcdata offsets follow. The 32-bit fields after
    /// the entry (nameoff, args, deferreturn, pcsp, pcfile, pcln, npcdata, cuOffset) are in
    /// the same order in every format. 1.12 to 1.15 put funcID at 36, but 1.2 to 1.11 had an
    /// int32 there, so neither it nor funcdata is read in the 1.2 format; 1.20's `startLine`
    /// at 36 pushed the last four bytes down.
    fn func_id_and_size(self) -> (Option<u64>, u64) {
        match self {
            Format::Go12 => (None, 40),
            Format::Go116 | Format::Go120 => (Some(40), 44),
            Format::Go118 => (Some(36), 40),
        }
    }
}

/// The longest name or file name read: Go's longest (generic instantiations) are a few KiB.
const MAX_STRING: usize = 64 * 1024;
/// Deeper inlining than this is a cycle in a corrupt table: Go's inliner stops far earlier.
const MAX_INLINE_DEPTH: usize = 64;
/// `_PCDATA_InlTreeIndex`: the pcdata table giving the inlined call at each pc.
const PCDATA_INL_TREE_INDEX: u32 = 2;
/// `_FUNCDATA_InlTree`: the funcdata pointing at the function's inlined calls.
const FUNCDATA_INL_TREE: u64 = 3;
/// `funcFlag_TOPFRAME`, `funcFlag_SPWRITE`, `funcFlag_ASM` (1.17 onwards; ASM from 1.19).
const FLAG_TOPFRAME: u8 = 1;
const FLAG_SPWRITE: u8 = 2;
const FLAG_ASM: u8 = 4;
/// Where stacks start in tables with no flag byte (before 1.17): what the 1.16 runtime's
/// `topofstack` stopped at.
const TOP_FRAMES: [&str; 5] = [
    "runtime.goexit",
    "runtime.mstart",
    "runtime.rt0_go",
    "runtime.mcall",
    "runtime.morestack",
];
/// The segments kept for mapping funcdata addresses: Go binaries have three or four.
const MAX_SEGMENTS: usize = 64;
/// `PF_X` and `PF_W` of an ELF program header.
const PF_X: u32 = 1;
const PF_W: u32 = 2;
/// The Go build id note's type (owner "Go").
const NOTE_GO_BUILD_ID: u32 = 4;
/// `moduledata.gofunc`'s offset: after the slices, the bounds words and `rodata`; 1.20
/// added `covctrs, ecovctrs` before `end`.
const MODULEDATA_GOFUNC_118: u64 = 304;
const MODULEDATA_GOFUNC_120: u64 = 320;

/// Little-endian reads within one slice; `base` is the slice's file offset, for messages.
#[derive(Clone, Copy)]
struct Bytes<'d> {
    bytes: &'d [u8],
    base: u64,
}

impl<'d> Bytes<'d> {
    fn new(bytes: &'d [u8], base: u64) -> Bytes<'d> {
        Bytes { bytes, base }
    }

    /// The `len` bytes at `off`, as a `Bytes` of their own.
    fn sub(&self, off: u64, len: u64, what: &'static str) -> Result<Bytes<'d>> {
        let offset = self.base.saturating_add(off);
        let range = usize::try_from(off)
            .ok()
            .zip(usize::try_from(len).ok())
            .and_then(|(start, len)| Some(start..start.checked_add(len)?));
        let bytes = range.and_then(|range| self.bytes.get(range));
        let bytes = bytes.ok_or(PclntabError::Truncated { what, offset })?;
        Ok(Bytes::new(bytes, offset))
    }

    fn u8(&self, off: u64, what: &'static str) -> Result<u8> {
        Ok(self.sub(off, 1, what)?.bytes[0])
    }

    fn u32(&self, off: u64, what: &'static str) -> Result<u32> {
        let mut word = [0; 4];
        word.copy_from_slice(self.sub(off, 4, what)?.bytes);
        Ok(u32::from_le_bytes(word))
    }

    fn u64(&self, off: u64, what: &'static str) -> Result<u64> {
        let mut word = [0; 8];
        word.copy_from_slice(self.sub(off, 8, what)?.bytes);
        Ok(u64::from_le_bytes(word))
    }

    /// A field of `size` bytes (4 or 8), widened.
    fn uint(&self, off: u64, size: u64, what: &'static str) -> Result<u64> {
        match size {
            8 => self.u64(off, what),
            _ => self.u32(off, what).map(u64::from),
        }
    }

    /// The NUL-terminated UTF-8 string at `off`.
    fn cstr(&self, off: u64, what: &'static str) -> Result<&'d str> {
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
    fn varint(&self, off: u64) -> Result<(u32, u64)> {
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

/// A loaded segment's file bytes: what maps an ELF address to a file offset.
#[derive(Debug, Clone, Copy)]
struct Segment {
    address: u64,
    offset: u64,
    file_size: u64,
    flags: u32,
}

impl Segment {
    /// The file offset of `address`, if this segment has `len` file bytes there.
    fn offset_of(&self, address: u64, len: u64) -> Option<u64> {
        let off = address.checked_sub(self.address)?;
        (off.checked_add(len)? <= self.file_size).then_some(self.offset.checked_add(off)?)
    }

    /// The 8-byte aligned words of the segment's bytes in the file (a truncated file has
    /// fewer): (address, word).
    fn words<'d>(&self, data: &'d [u8]) -> impl Iterator<Item = (u64, &'d [u8])> + 'd {
        let segment = *self;
        let skip = segment.address.wrapping_neg() % 8;
        let clamp = |n: u64| usize::try_from(n).map_or(data.len(), |n| n.min(data.len()));
        let end = clamp(segment.offset.saturating_add(segment.file_size));
        let bytes = data.get(clamp(segment.offset)..end).unwrap_or_default();
        let aligned = bytes.get(skip as usize..).unwrap_or_default();
        aligned
            .chunks_exact(8)
            .enumerate()
            .map(move |(i, word)| (segment.address.wrapping_add(skip + 8 * i as u64), word))
    }
}

fn load_segments(file: &object::File<'_>) -> Vec<Segment> {
    let segments = file.segments().map(|segment| {
        let (offset, file_size) = segment.file_range();
        let flags = match segment.flags() {
            SegmentFlags::Elf { p_flags } => p_flags,
            _ => 0,
        };
        let address = segment.address();
        Segment {
            address,
            offset,
            file_size,
            flags,
        }
    });
    let segments = segments.filter(|segment| segment.file_size > 0);
    segments.take(MAX_SEGMENTS).collect()
}

/// The `len` file bytes at ELF address `address`, all within one segment.
fn bytes_at<'d>(
    data: &'d [u8],
    segments: &[Segment],
    (address, len): (u64, u64),
    what: &'static str,
) -> Result<Bytes<'d>> {
    let offset = segments.iter().find_map(|s| s.offset_of(address, len));
    let offset = offset.ok_or(PclntabError::Unmapped { what, address })?;
    Bytes::new(data, 0).sub(offset, len, what)
}

/// The table's layout: header fields and offsets only, so it is `Copy` and iterators can own it.
#[derive(Debug, Clone, Copy)]
struct Table {
    format: Format,
    /// File offset of the header; the offsets below are from it.
    start: u64,
    /// Bytes from `start` the table may use: its section's size, or the rest of its segment.
    len: u64,
    /// ELF address of the header.
    address: u64,
    nfunc: u64,
    /// 1.18+: what functab entries are relative to.
    text_start: u64,
    funcnames: u64,
    cutab: u64,
    filetab: u64,
    pctab: u64,
    /// The functab, followed by the `_func`s (whose offsets are from here, or from the table's
    /// start in 1.2).
    functab: u64,
    /// 1.2: the file table's entry count (entry 0 is the count itself).
    nfiles: u64,
}

/// One `_func`, decoded.
#[derive(Debug, Clone, Copy)]
struct Func {
    /// Offset of the `_func` from the table's start.
    off: u64,
    entry: u64,
    end: u64,
    name_off: u64,
    pcsp: u32,
    pcfile: u32,
    pcln: u32,
    npcdata: u32,
    cu: u32,
    func_id: u8,
    flag: u8,
    nfuncdata: u8,
}

/// The header fields that are offsets of sub-tables, in header order (1.16+).
const OFFSET_FIELDS: [&str; 5] = [
    "funcnameOffset",
    "cuOffset",
    "filetabOffset",
    "pctabOffset",
    "pclnOffset",
];

impl Table {
    fn bytes<'d>(&self, data: &'d [u8]) -> Result<Bytes<'d>> {
        Bytes::new(data, 0).sub(self.start, self.len, "the Go pclntab")
    }

    /// Reads and checks a header at `start` (`len` bytes available, at ELF `address`).
    fn parse(data: &[u8], start: u64, len: u64, address: u64, text: Option<u64>) -> Result<Table> {
        let tab = Bytes::new(data, 0).sub(start, len, "the Go pclntab")?;
        let magic = tab.u32(0, "the Go pclntab's magic")?;
        let unsupported = |field, value| PclntabError::Unsupported {
            field,
            value,
            offset: start,
        };
        let format = match Format::from_magic(magic) {
            Some(format) => format,
            None if Format::from_magic(magic.swap_bytes()).is_some() => {
                return Err(unsupported("byte order", u64::from(magic)))
            }
            None => {
                return Err(PclntabError::UnknownMagic {
                    magic,
                    offset: start,
                })
            }
        };
        let header = tab.sub(0, 8, "the Go pclntab's header")?.bytes;
        for (field, at, want) in [
            ("pad", 4, 0),
            ("pad", 5, 0),
            ("minLC", 6, 1),
            ("ptrSize", 7, 8),
        ] {
            if header[at] != want {
                return Err(unsupported(field, u64::from(header[at])));
            }
        }
        let word = |i: u64, what| tab.u64(8 + 8 * i, what);
        let out_of = |field, value| PclntabError::Header {
            field,
            value,
            offset: start,
            len,
        };
        let (header_size, first_offset) = match format {
            Format::Go12 => (16, 0),
            Format::Go116 => (64, 2),
            Format::Go118 | Format::Go120 => (72, 3),
        };
        let mut offsets = [0u64; 5];
        if format != Format::Go12 {
            for (i, (value, field)) in offsets.iter_mut().zip(OFFSET_FIELDS).enumerate() {
                *value = word(first_offset + i as u64, field)?;
                if *value < header_size || *value >= len {
                    return Err(out_of(field, *value));
                }
            }
        }
        let [funcnames, cutab, filetab, pctab, functab] = offsets;
        let mut table = Table {
            format,
            start,
            len,
            address,
            nfunc: word(0, "nfunc")?,
            text_start: 0,
            funcnames,
            cutab,
            filetab,
            pctab,
            functab: if format == Format::Go12 { 16 } else { functab },
            nfiles: 0,
        };
        if format != Format::Go12 {
            table.nfiles = word(1, "nfiles")?;
        }
        if matches!(format, Format::Go118 | Format::Go120) {
            table.text_start = match word(2, "textStart")? {
                0 => text.ok_or(PclntabError::NoTextStart)?,
                text_start => text_start,
            };
        }
        // The functab is nfunc (entry, offset) pairs and one end entry.
        let room = len.saturating_sub(table.functab) / format.word();
        if table.nfunc == 0 || table.nfunc > room.saturating_sub(1) / 2 {
            return Err(out_of("nfunc", table.nfunc));
        }
        if format == Format::Go12 {
            let after = table.functab + (2 * table.nfunc + 1) * 8;
            table.filetab = u64::from(tab.u32(after, "the file table's offset")?);
            table.nfiles = u64::from(tab.u32(table.filetab, "the file table's count")?);
        }
        // The first function must read back whole: what tells a table from bytes that happen
        // to start with its magic.
        let first = table.func(tab, 0)?;
        table.name(tab, first.name_off)?;
        Ok(table)
    }

    fn entry(&self, tab: Bytes<'_>, index: u64) -> Result<u64> {
        let word = self.format.word();
        let value = tab.uint(self.functab + 2 * index * word, word, "a functab entry")?;
        match self.format {
            Format::Go12 | Format::Go116 => Ok(value),
            Format::Go118 | Format::Go120 => Ok(self.text_start.wrapping_add(value)),
        }
    }

    fn text_range(&self, tab: Bytes<'_>) -> Result<Range<u64>> {
        Ok(self.entry(tab, 0)?..self.entry(tab, self.nfunc)?)
    }

    /// The index of the function holding `pc`: binary search over the functab in place.
    fn lookup(&self, tab: Bytes<'_>, pc: u64) -> Result<u64> {
        let Range { start, end } = self.text_range(tab)?;
        if !(start..end).contains(&pc) {
            return Err(PclntabError::NoFunction { pc, start, end });
        }
        // entry(lo) <= pc < entry(hi) holds throughout, sorted or not, so the function found
        // always contains pc by its own bounds.
        let (mut lo, mut hi) = (0, self.nfunc);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.entry(tab, mid)? <= pc {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }

    /// The `_func` of function `index`, checked against its functab entry.
    fn func(&self, tab: Bytes<'_>, index: u64) -> Result<Func> {
        let word = self.format.word();
        let (entry, end) = (self.entry(tab, index)?, self.entry(tab, index + 1)?);
        // Both neighbours are checked: a function whose entry moved below its predecessor's
        // would otherwise claim that predecessor's pcs.
        if end < entry {
            return Err(PclntabError::Unsorted {
                index: index + 1,
                entry: end,
            });
        }
        if index > 0 && self.entry(tab, index - 1)? > entry {
            return Err(PclntabError::Unsorted { index, entry });
        }
        let at = self.functab + (2 * index + 1) * word;
        let func_off = tab.uint(at, word, "a functab offset")?;
        let base = if self.format == Format::Go12 {
            0
        } else {
            self.functab
        };
        let off = base.saturating_add(func_off);
        let (func_id, size) = self.format.func_id_and_size();
        let raw = tab.sub(off, size, "a _func")?;
        let found = match self.format {
            Format::Go12 | Format::Go116 => raw.u64(0, "_func.entry")?,
            Format::Go118 | Format::Go120 => {
                let entry_off = raw.u32(0, "_func.entryoff")?;
                self.text_start.wrapping_add(u64::from(entry_off))
            }
        };
        if found != entry {
            let offset = raw.base;
            return Err(PclntabError::EntryMismatch {
                index,
                offset,
                found,
                expected: entry,
            });
        }
        let field = |i: u64| raw.u32(word + 4 * i, "a _func field");
        let byte = |after: u64| func_id.map_or(Ok(0), |at| raw.u8(at + after, "a _func byte"));
        Ok(Func {
            off,
            entry,
            end,
            name_off: u64::from(field(0)?),
            pcsp: field(3)?,
            pcfile: field(4)?,
            pcln: field(5)?,
            npcdata: field(6)?,
            cu: if self.format == Format::Go12 {
                0
            } else {
                field(7)?
            },
            func_id: byte(0)?,
            flag: byte(1)?,
            nfuncdata: byte(3)?,
        })
    }

    /// A function name at `name_off` in the name table.
    fn name<'d>(&self, tab: Bytes<'d>, name_off: u64) -> Result<&'d str> {
        tab.cstr(self.funcnames.saturating_add(name_off), "a function name")
    }

    /// The file `fileno` (a pcfile value) of `func`; None where the table says it has none.
    fn file<'d>(&self, tab: Bytes<'d>, func: &Func, fileno: i32) -> Result<Option<&'d str>> {
        let Ok(fileno) = u64::try_from(fileno) else {
            return Ok(None);
        };
        if self.format == Format::Go12 {
            // Entry 0 is the count, so file numbers start at 1.
            if fileno == 0 || fileno >= self.nfiles {
                return Ok(None);
            }
            let name = tab.u32(self.filetab + 4 * fileno, "a file table entry")?;
            return tab.cstr(u64::from(name), "a file name").map(Some);
        }
        if func.cu == u32::MAX {
            return Ok(None);
        }
        let index = u64::from(func.cu) + fileno;
        match tab.u32(self.cutab + 4 * index, "a cutab entry")? {
            u32::MAX => Ok(None),
            name => tab
                .cstr(self.filetab + u64::from(name), "a file name")
                .map(Some),
        }
    }

    /// The runs of the pc-value table at `off` (a `_func` field), or None for no table.
    fn pc_values<'d>(&self, tab: Bytes<'d>, func: &Func, off: u32) -> Option<PcValues<'d>> {
        let (pos, pc, entry) = (self.pctab + u64::from(off), func.entry, func.entry);
        (off != 0).then_some(PcValues {
            tab,
            pos,
            pc,
            entry,
            value: -1,
        })
    }

    /// The value at `pc` of the pc-value table at `off`; None for no table.
    fn pc_value(
        &self,
        tab: Bytes<'_>,
        func: &Func,
        table: (&'static str, u32),
        pc: u64,
    ) -> Result<Option<i32>> {
        let Some(mut runs) = self.pc_values(tab, func, table.1) else {
            return Ok(None);
        };
        // Each run consumes at least two bytes, so the table's bytes bound the loop.
        while let Some(run) = runs.next_run()? {
            if pc < run.end {
                return Ok(Some(run.value));
            }
        }
        Err(PclntabError::PcValueEnds {
            table: table.0,
            entry: func.entry,
            pc,
        })
    }

    /// pcdata table `index`'s offset, None if the function has fewer.
    fn pcdata(&self, tab: Bytes<'_>, func: &Func, index: u32) -> Result<Option<u32>> {
        if index >= func.npcdata {
            return Ok(None);
        }
        let at = func.off + self.format.func_id_and_size().1 + 4 * u64::from(index);
        tab.u32(at, "a pcdata offset").map(Some)
    }

    /// File name and line at `pc` in `func`.
    fn position<'d>(&self, tab: Bytes<'d>, func: &Func, pc: u64) -> Result<(Option<&'d str>, u32)> {
        let line = self.pc_value(tab, func, ("pcln", func.pcln), pc)?;
        let file = match self.pc_value(tab, func, ("pcfile", func.pcfile), pc)? {
            Some(fileno) => self.file(tab, func, fileno)?,
            None => None,
        };
        Ok((
            file,
            line.and_then(|line| u32::try_from(line).ok()).unwrap_or(0),
        ))
    }

    fn go_func<'d>(&self, tab: Bytes<'d>, index: u64) -> Result<GoFunc<'d>> {
        let func = self.func(tab, index)?;
        let name = self.name(tab, func.name_off)?;
        let flag_less = matches!(self.format, Format::Go12 | Format::Go116);
        Ok(GoFunc {
            entry: func.entry,
            end: func.end,
            name,
            func_id: func.func_id,
            spwrite: func.flag & FLAG_SPWRITE != 0,
            top_frame: func.flag & FLAG_TOPFRAME != 0 || (flag_less && TOP_FRAMES.contains(&name)),
            asm: func.flag & FLAG_ASM != 0,
            index,
        })
    }
}

/// One run of a pc-value table: `value` holds for pcs in `start..end`.
struct Run {
    start: u64,
    end: u64,
    value: i32,
}

/// Decoding of one pc-value table: pairs of varints, a zig-zag value delta and a pc delta,
/// ended by a zero value delta after the first pair.
struct PcValues<'d> {
    tab: Bytes<'d>,
    pos: u64,
    pc: u64,
    entry: u64,
    value: i32,
}

impl PcValues<'_> {
    fn next_run(&mut self) -> Result<Option<Run>> {
        let (value_delta, n) = self.tab.varint(self.pos)?;
        // The first pair may have a zero delta (the value -1 + 1 = 0 at the entry).
        if value_delta == 0 && self.pc != self.entry {
            return Ok(None);
        }
        let delta = ((value_delta >> 1) as i32) ^ -((value_delta & 1) as i32);
        self.value = self.value.wrapping_add(delta);
        let (pc_delta, m) = self.tab.varint(self.pos + n)?;
        self.pos += n + m;
        let start = self.pc;
        // minLC is 1: the delta is in bytes. pc + 2^32 cannot overflow a real address.
        self.pc = self.pc.saturating_add(u64::from(pc_delta));
        Ok(Some(Run {
            start,
            end: self.pc,
            value: self.value,
        }))
    }
}

/// One function of the table, as the unwinder and the symbolizer list them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoFunc<'d> {
    /// ELF address of its first instruction.
    pub entry: u64,
    /// The next function's entry, or the table's end: alignment padding belongs to it.
    pub end: u64,
    /// As Go spells it: `main.matmul`, `runtime.mallocgc`, `main.(*T).M`.
    pub name: &'d str,
    /// `funcID`, raw: its numbering changes between Go versions (0 is always "normal"); 0 in
    /// the 1.2 format, where its place held other fields before 1.12.
    pub func_id: u8,
    /// `funcFlag_SPWRITE` (1.17 onwards): the function writes SP arbitrarily (`gogo`,
    /// `systemstack`, `morestack`, ...); its pcsp cannot be trusted for unwinding past it.
    pub spwrite: bool,
    /// `funcFlag_TOPFRAME`: the outermost frame of a stack (`goexit`, `mstart`, `rt0_go`,
    /// and the signal handler's `sigtramp`). Before 1.17 (no flag byte), the functions the
    /// 1.16 runtime stopped at, by name.
    pub top_frame: bool,
    /// `funcFlag_ASM` (1.19 onwards): written in assembly.
    pub asm: bool,
    /// Its functab index, for `sp_deltas`.
    index: u64,
}

/// One frame at a pc: an inlined call or the real function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoFrame {
    pub function: String,
    pub file: Option<String>,
    /// 0 where the table has no line.
    pub line: u32,
}

/// A Go binary's pclntab, found in its file: offsets and header fields, no copy of the table.
#[derive(Debug, Clone)]
pub struct Pclntab {
    table: Table,
    /// 1.18+: `go:func.*`'s address, which funcdata offsets are from; None when it could not be
    /// found (no inlined frames then).
    gofunc: Option<u64>,
    /// The loaded segments, to read funcdata (inline trees) at their addresses.
    segments: Vec<Segment>,
    /// The functab's first entry to its end entry.
    text: Range<u64>,
}

/// The symbols `find` uses, from one pass over `.symtab`.
#[derive(Default)]
struct Symbols {
    pclntab: Option<u64>,
    epclntab: Option<u64>,
    text: Option<u64>,
    gofunc: Option<u64>,
    firstmoduledata: Option<u64>,
}

impl Symbols {
    fn read(file: &object::File<'_>) -> Symbols {
        let mut found = Symbols::default();
        for symbol in file.symbols() {
            let slot = match symbol.name() {
                Ok("runtime.pclntab") => &mut found.pclntab,
                Ok("runtime.epclntab") => &mut found.epclntab,
                Ok("runtime.text") => &mut found.text,
                Ok("go:func.*" | "go.func.*") => &mut found.gofunc,
                Ok("runtime.firstmoduledata") => &mut found.firstmoduledata,
                _ => continue,
            };
            slot.get_or_insert(symbol.address());
        }
        found
    }
}

impl Pclntab {
    /// Finds the table in an ELF file: by section (`.gopclntab`, or `.data.rel.ro.gopclntab`
    /// in a PIE); else by the `runtime.pclntab` symbol; else (no section headers to trust, or
    /// an externally linked binary that merged the table into `.data.rel.ro`) by scanning the
    /// non-executable PT_LOAD segments for a header that reads back whole. Ok(None) when the
    /// file is not Go (an ELF file with section headers but no Go section is not looked into).
    /// Also finds `go:func.*` for inline trees (1.18+): by symbol, or through the moduledata
    /// whose first word is the table's address and whose slices agree with the header; without
    /// it frames resolve without inlined levels and `inline_trees()` says false.
    pub fn find(file: &object::File<'_>, data: &[u8]) -> Result<Option<Pclntab>> {
        if file.format() != object::BinaryFormat::Elf {
            return Ok(None);
        }
        // Asked of every binary a process maps: most are not Go, and their symbol tables (a
        // hundred thousand symbols in libLLVM) are not read for Go's names.
        if file.sections().next().is_some() && !has_go_section(file) {
            return Ok(None);
        }
        let segments = load_segments(file);
        let symbols = Symbols::read(file);
        let section = file
            .section_by_name(".gopclntab")
            .or_else(|| file.section_by_name(".data.rel.ro.gopclntab"))
            .and_then(|section| Some((section.file_range()?, section.address())));
        let by_symbol = || {
            let address = symbols.pclntab?;
            let segment = segments
                .iter()
                .find(|s| s.offset_of(address, 1).is_some())?;
            let start = segment.offset_of(address, 1)?;
            let rest = segment.file_size - (address - segment.address);
            let len = symbols
                .epclntab
                .and_then(|end| end.checked_sub(address))
                .filter(|&len| len > 0 && len <= rest);
            Some(((start, len.unwrap_or(rest)), address))
        };
        let table = match section.or_else(by_symbol) {
            Some(((start, len), address)) => Table::parse(data, start, len, address, symbols.text)?,
            None => match scan_for_table(data, &segments, symbols.text) {
                Some(table) => table,
                None => return Ok(None),
            },
        };
        let gofunc = match table.format {
            Format::Go12 | Format::Go116 => None,
            Format::Go118 | Format::Go120 => find_gofunc(data, &segments, &table, &symbols),
        };
        let text = table.text_range(table.bytes(data)?)?;
        Ok(Some(Pclntab {
            table,
            gofunc,
            segments,
            text,
        }))
    }

    pub fn format(&self) -> Format {
        self.table.format
    }

    pub fn functions(&self) -> usize {
        usize::try_from(self.table.nfunc).unwrap_or(usize::MAX)
    }

    /// Whether `frames` gives inlined frames: 1.16/1.17 (funcdata are addresses), or 1.18+
    /// with `go:func.*` found. Never for the 1.2 format.
    pub fn inline_trees(&self) -> bool {
        match self.table.format {
            Format::Go12 => false,
            Format::Go116 => true,
            Format::Go118 | Format::Go120 => self.gofunc.is_some(),
        }
    }

    /// The ELF-address range the functab covers: its first entry to its end entry.
    pub fn text_range(&self) -> Range<u64> {
        self.text.clone()
    }

    /// Frames at ELF address `pc`, innermost (inlined) first, the real function last. The
    /// innermost frame's line is the pcln value at `pc`; each caller's is the line at its call
    /// site (pcln at entry + parentPc), as the Go runtime's own tracebacks give them.
    pub fn frames(&self, data: &[u8], pc: u64) -> Result<Vec<GoFrame>> {
        let table = &self.table;
        let tab = table.bytes(data)?;
        let func = table.func(tab, table.lookup(tab, pc)?)?;
        let frame = |name_off, at| -> Result<GoFrame> {
            let (file, line) = table.position(tab, &func, at)?;
            let function = table.name(tab, name_off)?.to_owned();
            Ok(GoFrame {
                function,
                file: file.map(str::to_owned),
                line,
            })
        };
        let mut frames = Vec::new();
        let mut at = pc;
        let tree = self.inline_tree(tab, &func)?;
        let indices = table.pcdata(tab, &func, PCDATA_INL_TREE_INDEX)?;
        // The 1.19 runtime's walk: the inlined call at `at`, then the one at its call site.
        while let (Some(tree), Some(indices)) = (tree, indices) {
            let Some(ix) = table.pc_value(tab, &func, ("InlTreeIndex", indices), at)? else {
                break;
            };
            let Ok(ix) = u64::try_from(ix) else { break };
            if frames.len() >= MAX_INLINE_DEPTH {
                return Err(PclntabError::InlineTooDeep { pc });
            }
            let (name_off, parent_pc) = self.inlined_call(data, tree, ix)?;
            frames.push(frame(name_off, at)?);
            at = func
                .entry
                .checked_add(parent_pc)
                .filter(|parent| *parent < func.end)
                .ok_or(PclntabError::OutsideFunction {
                    what: "an inlined call's parentPc",
                    entry: func.entry,
                    value: parent_pc,
                })?;
        }
        frames.push(frame(func.name_off, at)?);
        Ok(frames)
    }

    /// Every function in address order. An item is an error where the table is corrupt
    /// there (unsorted, a `_func` that disagrees with its entry, a bad name); the rest go on.
    pub fn funcs<'d>(&self, data: &'d [u8]) -> impl Iterator<Item = Result<GoFunc<'d>>> + 'd {
        let table = self.table;
        // A table that no longer reads says so once, not once per function.
        let count = if table.bytes(data).is_ok() {
            table.nfunc
        } else {
            1
        };
        (0..count).map(move |index| table.go_func(table.bytes(data)?, index))
    }

    /// The stack-pointer deltas of `func` (its pcsp table): sorted `(pc, delta)` pairs, delta
    /// being the bytes the function has pushed or subtracted below its entry rsp for pcs from
    /// `pc` to the next pair's (the last, to `func.end`). The first pair is `(entry, 0)`.
    pub fn sp_deltas(&self, data: &[u8], func: &GoFunc) -> Result<Vec<(u64, i32)>> {
        let table = &self.table;
        let tab = table.bytes(data)?;
        let record = table.func(tab, func.index)?;
        let entry = record.entry;
        if entry != func.entry {
            return Err(PclntabError::ForeignFunction {
                entry: func.entry,
                index: func.index,
            });
        }
        let bad = |problem| PclntabError::BadSpTable { entry, problem };
        let runs = table.pc_values(tab, &record, record.pcsp);
        let mut runs = runs.ok_or(bad("is missing"))?;
        let mut deltas: Vec<(u64, i32)> = Vec::new();
        // Each run consumes at least two bytes and none may pass the function's end, so both
        // the table's bytes and the function's length bound the loop.
        while let Some(run) = runs.next_run()? {
            if run.end > record.end {
                return Err(bad("covers more bytes than the function has"));
            }
            if run.end == run.start {
                continue;
            }
            if deltas.is_empty() && (run.start != entry || run.value != 0) {
                return Err(bad("does not start with 0 at the entry"));
            }
            if deltas.last().map(|last| last.1) != Some(run.value) {
                deltas.push((run.start, run.value));
            }
        }
        if deltas.is_empty() {
            deltas.push((entry, 0));
        }
        Ok(deltas)
    }

    /// The ELF address of `func`'s inline tree, None if it has none or it cannot be found.
    fn inline_tree(&self, tab: Bytes<'_>, func: &Func) -> Result<Option<u64>> {
        if !self.inline_trees() || u64::from(func.nfuncdata) <= FUNCDATA_INL_TREE {
            return Ok(None);
        }
        let size = self.table.format.func_id_and_size().1;
        let after_pcdata = func.off + size + 4 * u64::from(func.npcdata);
        match (self.table.format, self.gofunc) {
            (Format::Go116, _) => {
                // Pointer-sized funcdata start at the next 8-byte aligned address.
                let address = self.table.address.wrapping_add(after_pcdata);
                let at = after_pcdata + (address & 4) + 8 * FUNCDATA_INL_TREE;
                let tree = tab.u64(at, "a funcdata address")?;
                Ok((tree != 0).then_some(tree))
            }
            (_, Some(gofunc)) => {
                let off = tab.u32(after_pcdata + 4 * FUNCDATA_INL_TREE, "a funcdata offset")?;
                Ok((off != u32::MAX).then(|| gofunc.wrapping_add(u64::from(off))))
            }
            _ => Ok(None),
        }
    }

    /// Entry `ix` of the inline tree at `tree`: its name offset and its parentPc.
    fn inlined_call(&self, data: &[u8], tree: u64, ix: u64) -> Result<(u64, u64)> {
        let what = "an inlined call";
        // 1.16-1.19: parent int16, funcID, pad, file, line, nameoff, parentPc (20 bytes).
        // 1.20+: funcID, pad[3], nameOff, parentPc, startLine (16 bytes).
        let (size, name, parent_pc) = match self.table.format {
            Format::Go120 => (16, 4, 8),
            _ => (20, 12, 16),
        };
        let address = ix.checked_mul(size).and_then(|off| tree.checked_add(off));
        let address = address.ok_or(PclntabError::Unmapped {
            what,
            address: tree,
        })?;
        let call = bytes_at(data, &self.segments, (address, size), what)?;
        Ok((
            u64::from(call.u32(name, what)?),
            u64::from(call.u32(parent_pc, what)?),
        ))
    }
}

/// Sections only Go's linkers write: a binary with section headers and none of them is not Go.
fn has_go_section(file: &object::File<'_>) -> bool {
    let names = [
        ".gopclntab",
        ".data.rel.ro.gopclntab",
        ".go.buildinfo",
        ".note.go.buildid",
    ];
    names
        .iter()
        .any(|name| file.section_by_name(name).is_some())
}

/// The first 8-aligned header in the non-executable segments (read-only first) that reads
/// back whole.
fn scan_for_table(data: &[u8], segments: &[Segment], text: Option<u64>) -> Option<Table> {
    let mut order: Vec<&Segment> = segments.iter().filter(|s| s.flags & PF_X == 0).collect();
    order.sort_by_key(|s| s.flags & PF_W != 0);
    order.into_iter().find_map(|segment| {
        let mut headers = segment.words(data).filter(|(_, word)| {
            word[1..4] == [0xff; 3]
                && matches!(word[0], 0xfb | 0xfa | 0xf0 | 0xf1)
                && word[4..8] == [0, 0, 1, 8]
        });
        headers.find_map(|(address, _)| {
            let start = segment.offset_of(address, 8)?;
            // To the segment's end, or the file's if it was cut short.
            let len = segment.file_size - (address - segment.address);
            let len = len.min((data.len() as u64).saturating_sub(start));
            Table::parse(data, start, len, address, text).ok()
        })
    })
}

/// `go:func.*`'s address: its symbol, or the moduledata's `gofunc` (the moduledata at the
/// `runtime.firstmoduledata` symbol, or found in the writable segments by its first word,
/// the table's address, and slices that agree with the header). Either must decode the first
/// inline trees, so that a Go version that moved the field costs inlined frames, not names.
fn find_gofunc(data: &[u8], segments: &[Segment], table: &Table, symbols: &Symbols) -> Option<u64> {
    let decodes = |gofunc: u64| gofunc_decodes(data, segments, table, gofunc);
    if let Some(gofunc) = symbols.gofunc.filter(|&gofunc| decodes(gofunc)) {
        return Some(gofunc);
    }
    // 1.20 added `covctrs, ecovctrs` before it; a later shift by a word is tried too.
    let offsets: &[u64] = match table.format {
        Format::Go120 => &[
            MODULEDATA_GOFUNC_120,
            MODULEDATA_GOFUNC_120 + 8,
            MODULEDATA_GOFUNC_118,
        ],
        _ => &[MODULEDATA_GOFUNC_118],
    };
    let read = |address: u64| -> Option<u64> {
        let words = bytes_at(data, segments, (address, 23 * 8), "the moduledata").ok()?;
        let word = |i: u64| words.u64(8 * i, "a moduledata word").ok();
        let slice_at = |i: u64, off: u64| word(i) == Some(table.address.wrapping_add(off));
        let agrees = word(0) == Some(table.address)
            && slice_at(1, table.funcnames)
            && slice_at(4, table.cutab)
            && slice_at(7, table.filetab)
            && slice_at(10, table.pctab)
            && slice_at(13, table.functab)
            && slice_at(16, table.functab)
            && word(17) == Some(table.nfunc + 1)
            && word(22) == Some(table.text_start);
        let field =
            |at: u64| bytes_at(data, segments, (address.wrapping_add(at), 8), "gofunc").ok();
        let gofunc = |at: &u64| field(*at)?.u64(0, "gofunc").ok().filter(|&g| decodes(g));
        agrees.then(|| offsets.iter().find_map(gofunc)).flatten()
    };
    if let Some(found) = symbols.firstmoduledata.and_then(read) {
        return Some(found);
    }
    let needle = table.address.to_le_bytes();
    let mut writable = segments.iter().filter(|s| s.flags & PF_W != 0);
    writable.find_map(|segment| {
        let mut candidates = segment.words(data).filter(|(_, word)| *word == needle);
        candidates.find_map(|(address, _)| read(address))
    })
}

/// Whether, with funcdata taken from `gofunc`, the first few inline trees name functions at
/// call sites inside their callers.
fn gofunc_decodes(data: &[u8], segments: &[Segment], table: &Table, gofunc: u64) -> bool {
    let Ok(tab) = table.bytes(data) else {
        return false;
    };
    if bytes_at(data, segments, (gofunc, 1), "go:func.*").is_err() {
        return false;
    }
    let segments = segments.to_vec();
    let probe = Pclntab {
        table: *table,
        gofunc: Some(gofunc),
        segments,
        text: 0..0,
    };
    let trees = (0..table.nfunc.min(4096)).filter_map(|index| {
        let func = table.func(tab, index).ok()?;
        Some((func, probe.inline_tree(tab, &func).ok()??))
    });
    trees.take(16).all(|(func, tree)| {
        let call = probe.inlined_call(data, tree, 0);
        call.is_ok_and(|(name, parent_pc)| {
            let named = table.name(tab, name).is_ok_and(|name| !name.is_empty());
            named && parent_pc < func.end - func.entry
        })
    })
}

/// The Go build id: the note with owner "Go" and type 4, from `.note.go.buildid` (any note
/// section) or, with no section headers, the PT_NOTE segments. None if absent or not UTF-8.
pub fn build_id(file: &object::File<'_>, data: &[u8]) -> Option<String> {
    match file {
        object::File::Elf32(elf) => elf_build_id(elf, data),
        object::File::Elf64(elf) => elf_build_id(elf, data),
        _ => None,
    }
}

fn elf_build_id<'d, Elf>(elf: &ElfFile<'d, Elf>, data: &'d [u8]) -> Option<String>
where
    Elf: FileHeader<Endian = Endianness>,
{
    let endian = elf.endian();
    let go_note = |notes: Option<NoteIterator<'d, Elf>>| {
        let mut notes = notes?;
        // The iterator advances by each note's size, so the bytes bound the loop.
        while let Ok(Some(note)) = notes.next() {
            if note.name() == b"Go" && note.n_type(endian) == NOTE_GO_BUILD_ID {
                return String::from_utf8(note.desc().to_vec()).ok();
            }
        }
        None
    };
    let sections = elf.elf_section_table().iter();
    let in_sections = sections.filter_map(|section| section.notes(endian, data).ok());
    let segments = elf.elf_program_headers().iter();
    let in_segments = segments.filter_map(|segment| segment.notes(endian, data).ok());
    in_sections.chain(in_segments).find_map(go_note)
}

/// For fuzz/: arbitrary bytes as an ELF file: find the table, name pcs spread over its range
/// and read the first few hundred functions' deltas. Must never panic.
pub fn fuzz_one(data: &[u8]) {
    let Ok(file) = object::File::parse(data) else {
        return;
    };
    let _ = build_id(&file, data);
    let Ok(Some(table)) = Pclntab::find(&file, data) else {
        return;
    };
    let range = table.text_range();
    let span = u128::from(range.end.saturating_sub(range.start));
    for k in 0..=64u128 {
        let _ = table.frames(data, range.start.wrapping_add((span * k / 64) as u64));
    }
    for func in table.funcs(data).take(300).flatten() {
        let _ = table.sp_deltas(data, &func);
        let _ = table.frames(data, func.entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{
        collections::HashMap,
        path::{Path, PathBuf},
        process::Command,
        sync::OnceLock,
    };

    /// main -> run (inlined) -> compute -> matmul (noinline) -> scale (inlined); leaf is a
    /// frameless noinline function. Line numbers below refer to this text.
    const PROGRAM: &str = r#"package main

import (
	"fmt"
	"os"
)

//go:noinline
func matmul(a, b, c []float64, n int) {
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			s := 0.0
			for k := 0; k < n; k++ {
				s += a[i*n+k] * b[k*n+j]
			}
			c[i*n+j] = scale(s)
		}
	}
}

func scale(x float64) float64 {
	return x * 0.5
}

//go:noinline
func leaf(x int) int {
	return x*3 + 1
}

func compute(n int) float64 {
	a := make([]float64, n*n)
	b := make([]float64, n*n)
	c := make([]float64, n*n)
	for i := range a {
		a[i] = float64(leaf(i))
		b[i] = float64(i)
	}
	matmul(a, b, c, n)
	return c[0]
}

func run(n int) float64 {
	return compute(n)
}

func main() {
	fmt.Println(run(len(os.Args) + 10))
}
"#;

    /// `go` with its caches under `dir`, so the tests neither need nor touch a home directory.
    fn go(dir: &Path) -> Command {
        let mut command = Command::new("go");
        command
            .current_dir(dir)
            .env("GOCACHE", dir.join("cache"))
            .env("GOPATH", dir.join("gopath"))
            .env("HOME", dir)
            .env("GOFLAGS", "")
            .env("GOTOOLCHAIN", "local");
        command
    }

    fn output(command: &mut Command) -> String {
        let output = command.output().unwrap_or_else(|e| {
            panic!("{command:?}: {e}: these tests build Go programs; run `cargo xtask setup`")
        });
        assert!(
            output.status.success(),
            "{command:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    /// The test program built each way, once per test run, in target/go-tests (kept: the
    /// build cache there makes the next run fast). Each build is renamed into place, so two
    /// test runs at once do not read each other's half-written files.
    fn binaries() -> &'static Path {
        static DIR: OnceLock<PathBuf> = OnceLock::new();
        DIR.get_or_init(|| {
            let exe = std::env::current_exe().unwrap();
            let dir = exe.ancestors().nth(3).unwrap().join("go-tests");
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("x.go"), PROGRAM).unwrap();
            let pid = std::process::id();
            // The external linker (gcc, as cgo uses) merges the table into `.data.rel.ro`.
            let pie = "-buildmode=pie";
            let external = "-ldflags=-linkmode=external -compressdwarf=false";
            let builds: [(&str, &[&str]); 6] = [
                ("plain", &["-ldflags=-compressdwarf=false"]),
                ("stripped", &["-ldflags=-s -w"]),
                ("pie", &[pie, "-ldflags=-s -w"]),
                ("pie-symbols", &[pie, "-ldflags=-compressdwarf=false"]),
                ("external", &[pie, "-ldflags=-s -w -linkmode=external"]),
                ("external-symbols", &[pie, external]),
            ];
            for (name, flags) in builds {
                let partial = format!("{name}.{pid}");
                output(
                    go(&dir)
                        .arg("build")
                        .args(flags)
                        .args(["-o", &partial, "x.go"]),
                );
                std::fs::rename(dir.join(partial), dir.join(name)).unwrap();
            }
            // What sstrip leaves: no section headers at all.
            let mut bytes = std::fs::read(dir.join("pie")).unwrap();
            bytes[0x28..0x30].fill(0); // e_shoff
            bytes[0x3c..0x40].fill(0); // e_shnum, e_shstrndx
            let partial = dir.join(format!("pie-no-sections.{pid}"));
            std::fs::write(&partial, bytes).unwrap();
            std::fs::rename(partial, dir.join("pie-no-sections")).unwrap();
            dir
        })
    }

    fn binary(name: &str) -> Vec<u8> {
        std::fs::read(binaries().join(name)).unwrap()
    }

    fn table(data: &[u8]) -> Pclntab {
        let file = object::File::parse(data).unwrap();
        Pclntab::find(&file, data).unwrap().expect("a Go table")
    }

    /// The pclntab writes what is inside a name's outermost brackets (generic type arguments,
    /// array lengths) as `...` (1.18+); the symbol table and DWARF do not.
    fn elide_brackets(name: &str) -> String {
        match (name.find('['), name.rfind(']')) {
            (Some(i), Some(j)) if i < j => format!("{}[...]{}", &name[..i], &name[j + 1..]),
            _ => name.to_owned(),
        }
    }

    /// Function symbols of an unstripped build: address -> names. The symbol table marks
    /// assembly functions' ABI (`internal/cpu.cpuid.abi0`); the pclntab does not.
    fn symbols(data: &[u8]) -> HashMap<u64, Vec<String>> {
        let file = object::File::parse(data).unwrap();
        let mut symbols: HashMap<u64, Vec<String>> = HashMap::new();
        for symbol in file.symbols() {
            if symbol.kind() == object::SymbolKind::Text {
                let name = symbol.name().unwrap();
                let name = name.strip_suffix(".abi0").unwrap_or(name);
                let name = elide_brackets(name);
                symbols.entry(symbol.address()).or_default().push(name);
            }
        }
        symbols
    }

    fn symbol(data: &[u8], name: &str) -> u64 {
        let file = object::File::parse(data).unwrap();
        let mut symbols = file.symbols();
        symbols.find(|s| s.name() == Ok(name)).unwrap().address()
    }

    fn func<'d>(table: &Pclntab, data: &'d [u8], name: &str) -> GoFunc<'d> {
        let mut funcs = table.funcs(data).map(Result::unwrap);
        funcs.find(|f| f.name == name).unwrap()
    }

    #[test]
    fn every_build_names_its_functions_like_its_symbol_table() {
        let plain = binary("plain");
        let pie_symbols = binary("pie-symbols");
        let external_symbols = binary("external-symbols");
        for (name, reference) in [
            ("plain", &plain),
            ("stripped", &plain),
            ("pie", &pie_symbols),
            ("pie-no-sections", &pie_symbols),
            ("external", &external_symbols),
        ] {
            let data = binary(name);
            let table = table(&data);
            assert_eq!(table.format(), Format::Go118, "{name}");
            assert_eq!(table.gofunc, Some(symbol(reference, "go.func.*")), "{name}");
            assert!(table.inline_trees(), "{name}");
            let symbols = symbols(reference);
            let mut count = 0;
            let mut previous_end = table.text_range().start;
            for func in table.funcs(&data) {
                let func = func.unwrap();
                let named = symbols.get(&func.entry).into_iter().flatten();
                assert!(
                    named.clone().any(|n| n == func.name),
                    "{name}: {func:?} is {:?} in the symbol table",
                    named.collect::<Vec<_>>()
                );
                assert_eq!(func.entry, previous_end, "{name}: {}", func.name);
                previous_end = func.end;
                count += 1;
            }
            assert_eq!(previous_end, table.text_range().end);
            assert_eq!(count, table.functions());
            assert!(count > 1000, "{name}: {count} functions");
            assert_eq!(
                table.text_range().start,
                symbol(reference, "runtime.text"),
                "{name}"
            );
        }
    }

    #[test]
    fn a_file_that_is_not_go_has_no_table() {
        let data = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let file = object::File::parse(&*data).unwrap();
        assert!(Pclntab::find(&file, &data).unwrap().is_none());
        assert_eq!(build_id(&file, &data), None);
    }

    /// What DWARF says at each pc: (function, file, line), innermost first.
    fn dwarf_frames(data: &[u8], pcs: &[u64]) -> Vec<Vec<(String, Option<String>, u32)>> {
        let file = object::File::parse(data).unwrap();
        let dwarf = gimli::Dwarf::load(|id| -> std::result::Result<_, gimli::Error> {
            let bytes = file.section_by_name(id.name()).map(|s| s.data().unwrap());
            Ok(gimli::EndianSlice::new(
                bytes.unwrap_or(&[]),
                gimli::LittleEndian,
            ))
        })
        .unwrap();
        let context = addr2line::Context::from_dwarf(dwarf).unwrap();
        let frames_at = |pc: u64| {
            let mut frames = Vec::new();
            let mut iter = context.find_frames(pc).skip_all_loads().unwrap();
            while let Some(frame) = iter.next().unwrap() {
                let Some(function) = frame.function else {
                    continue;
                };
                let (file, line) = frame.location.map_or((None, 0), |l| {
                    // addr2line joins the unit's directory (".") to Go's `<autogenerated>`.
                    let file = l.file.map(|f| f.strip_prefix("./").unwrap_or(f).to_owned());
                    (file, l.line.unwrap_or(0))
                });
                frames.push((elide_brackets(&function.raw_name().unwrap()), file, line));
            }
            frames
        };
        pcs.iter().map(|&pc| frames_at(pc)).collect()
    }

    fn go_frames(frames: Vec<GoFrame>) -> Vec<(String, Option<String>, u32)> {
        frames
            .into_iter()
            .map(|f| (f.function, f.file, f.line))
            .collect()
    }

    #[test]
    fn frames_match_dwarf_with_inlined_levels() {
        for (name, reference) in [
            ("stripped", "plain"),
            ("pie", "pie-symbols"),
            ("pie-no-sections", "pie-symbols"),
            ("external", "external-symbols"),
        ] {
            frames_match_dwarf(&binary(name), &binary(reference));
        }
    }

    fn frames_match_dwarf(stripped: &[u8], plain: &[u8]) {
        let table = table(stripped);
        // Every instruction of the program's own functions, and every fifth of the others:
        // pcs a CPU reports (inside a multi-byte NOP, DWARF's rows and the pclntab's can
        // change line at different bytes).
        let segments = load_segments(&object::File::parse(stripped).unwrap());
        let mut pcs = Vec::new();
        for func in table.funcs(stripped).map(Result::unwrap) {
            let code = bytes_at(
                stripped,
                &segments,
                (func.entry, func.end - func.entry),
                "code",
            );
            let mut decoder = iced_x86::Decoder::with_ip(
                64,
                code.unwrap().bytes,
                func.entry,
                iced_x86::DecoderOptions::NONE,
            );
            let every = if func.name.starts_with("main.") { 1 } else { 5 };
            pcs.extend(decoder.iter().map(|i| i.ip()).step_by(every));
        }
        let dwarf = dwarf_frames(plain, &pcs);
        let (mut compared, mut differ) = (0, Vec::new());
        let mut inlined = HashMap::new();
        for (&pc, expected) in pcs.iter().zip(dwarf) {
            // Alignment padding and assembly without DWARF subprograms: nothing to compare.
            let Ok(frames) = table.frames(stripped, pc) else {
                assert!(expected.is_empty(), "{pc:#x}: DWARF has {expected:?}");
                continue;
            };
            if expected.is_empty() {
                continue;
            }
            compared += 1;
            let frames = go_frames(frames);
            if frames.len() > 1 {
                inlined.insert(frames[0].0.clone(), frames.clone());
            }
            // Go writes no DWARF inlining for autogenerated wrappers (`(*T).M` calling an
            // inlined `T.M`): DWARF names the wrapper at the inlined body's line.
            let wrapper = frames
                .last()
                .is_some_and(|f| f.1.as_deref() == Some("<autogenerated>"))
                && expected.len() == 1
                && expected[0]
                    == (
                        frames.last().unwrap().0.clone(),
                        frames[0].1.clone(),
                        frames[0].2,
                    );
            if frames != expected && !wrapper {
                differ.push((pc, frames, expected));
            }
        }
        assert!(compared > 20_000, "{compared} pcs compared");
        assert!(
            differ.is_empty(),
            "{} of {compared} differ: {:#x?}",
            differ.len(),
            &differ[..differ.len().min(5)]
        );
        let source = binaries().join("x.go").to_string_lossy().into_owned();
        let at = |function: &str, line| (function.to_owned(), Some(source.clone()), line);
        assert_eq!(
            inlined["main.scale"],
            [at("main.scale", 22), at("main.matmul", 16)]
        );
        assert_eq!(
            inlined["main.run"],
            [at("main.run", 43), at("main.main", 47)]
        );
    }

    #[test]
    fn frames_match_go_tool_addr2line() {
        // Go's own reader (debug/gosym) names the real function and the innermost line; it
        // reads no PIE's `.data.rel.ro.gopclntab` (1.19), so the non-PIE build is asked.
        let stripped = binary("stripped");
        let table = table(&stripped);
        let range = table.text_range();
        let pcs: Vec<u64> = (range.start..range.end).step_by(37).collect();
        let input: String = pcs.iter().map(|pc| format!("{pc:#x}\n")).collect();
        let mut child = go(binaries())
            .args(["tool", "addr2line", "plain"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("go tool addr2line: run `cargo xtask setup`");
        let mut stdin = child.stdin.take().unwrap();
        let writer = std::thread::spawn(move || {
            std::io::Write::write_all(&mut stdin, input.as_bytes()).unwrap();
        });
        let answer = child.wait_with_output().unwrap();
        writer.join().unwrap();
        let answer = String::from_utf8(answer.stdout).unwrap();
        let lines: Vec<&str> = answer.lines().collect();
        assert_eq!(lines.len(), 2 * pcs.len());
        let mut named = 0;
        for (&pc, go) in pcs.iter().zip(lines.chunks(2)) {
            match table.frames(&stripped, pc) {
                Ok(frames) => {
                    let place = format!(
                        "{}:{}",
                        frames[0].file.as_deref().unwrap_or("?"),
                        frames[0].line
                    );
                    let outer = &frames.last().unwrap().function;
                    assert_eq!((outer.as_str(), place.as_str()), (go[0], go[1]), "{pc:#x}");
                    named += 1;
                }
                // Alignment padding past the function's pc-value tables.
                Err(PclntabError::PcValueEnds { .. }) => assert_eq!(go[1], ":-1", "{pc:#x}"),
                Err(e) => panic!("{pc:#x}: {e}"),
            }
        }
        assert!(named > 10_000, "{named} pcs named");
    }

    /// `go tool objdump`'s instructions of the functions `pattern` matches: (pc, length, text).
    fn objdump(binary: &str, pattern: &str) -> Vec<(u64, u64, String)> {
        let text = output(go(binaries()).args(["tool", "objdump", "-s", pattern, binary]));
        let instruction = |line: &str| {
            let fields: Vec<&str> = line.split('\t').filter(|f| !f.trim().is_empty()).collect();
            let pc = u64::from_str_radix(fields.get(1)?.strip_prefix("0x")?, 16).ok()?;
            let length = fields.get(2)?.len() as u64 / 2;
            Some((pc, length, fields.get(3)?.trim().to_owned()))
        };
        text.lines().filter_map(instruction).collect()
    }

    #[test]
    fn sp_deltas_follow_the_prologues() {
        let stripped = binary("stripped");
        let table = table(&stripped);
        // A frameless leaf: 0 throughout.
        let leaf = func(&table, &stripped, "main.leaf");
        assert_eq!(
            table.sp_deltas(&stripped, &leaf).unwrap(),
            [(leaf.entry, 0)]
        );
        // With frames (and compute's stack check, whose morestack call runs at 0): every
        // instruction that moves SP moves the delta by as much.
        for (name, frame) in [("main.matmul", 0x18), ("main.compute", 0x80)] {
            let func = func(&table, &stripped, name);
            let deltas = table.sp_deltas(&stripped, &func).unwrap();
            assert_eq!(deltas[0], (func.entry, 0), "{name}");
            assert_eq!(deltas.iter().map(|d| d.1).max(), Some(frame), "{name}");
            assert!(deltas.windows(2).all(|w| w[0].0 < w[1].0), "{deltas:?}");
            let delta_at = |pc: u64| deltas.iter().rev().find(|d| d.0 <= pc).unwrap().1;
            let mut moves = 0;
            for (pc, length, text) in objdump("plain", &format!("^{name}$")) {
                let immediate = |prefix: &str| {
                    let hex = text.strip_prefix(prefix)?.strip_suffix(", SP")?;
                    i32::from_str_radix(hex, 16).ok()
                };
                // Go writes `ADDQ $-0x80, SP` and `SUBQ $-0x80, SP` for an 8-bit immediate.
                let change = if let Some(n) = immediate("SUBQ $0x") {
                    n
                } else if let Some(n) = immediate("ADDQ $-0x") {
                    n
                } else if let Some(n) = immediate("ADDQ $0x") {
                    -n
                } else if let Some(n) = immediate("SUBQ $-0x") {
                    -n
                } else if text.starts_with("PUSHQ") {
                    8
                } else if text.starts_with("POPQ") {
                    -8
                } else {
                    continue;
                };
                assert_eq!(
                    delta_at(pc + length) - delta_at(pc),
                    change,
                    "{name} {pc:#x} {text}"
                );
                moves += 1;
            }
            assert!(moves >= 2, "{name}: {moves} SP moves checked");
        }
        // Every function's table reads, starts at 0 and stays within the function.
        for func in table.funcs(&stripped) {
            let func = func.unwrap();
            let deltas = table.sp_deltas(&stripped, &func).unwrap();
            assert_eq!(deltas[0], (func.entry, 0), "{}", func.name);
            assert!(deltas.iter().all(|d| (func.entry..func.end).contains(&d.0)));
        }
    }

    #[test]
    fn flags_mark_the_stack_tops_and_sp_writers() {
        let stripped = binary("stripped");
        let table = table(&stripped);
        let funcs: Vec<GoFunc> = table.funcs(&stripped).map(Result::unwrap).collect();
        let named = |pick: fn(&GoFunc) -> bool| {
            let mut names: Vec<&str> = funcs.iter().filter(|f| pick(f)).map(|f| f.name).collect();
            names.sort_unstable();
            names
        };
        assert_eq!(
            named(|f| f.top_frame),
            [
                "runtime.goexit",
                "runtime.mstart",
                "runtime.rt0_go",
                "runtime.sigtramp"
            ]
        );
        let spwrite = named(|f| f.spwrite);
        // `gogo` is runtime.gogo's file-local assembly half, which switches stacks.
        let switches = [
            "gogo",
            "runtime.morestack",
            "runtime.systemstack",
            "runtime.mcall",
        ];
        for name in switches
            .into_iter()
            .chain(["runtime.asmcgocall", "runtime.clone"])
        {
            assert!(spwrite.contains(&name), "{name} not in {spwrite:?}");
        }
        assert!(func(&table, &stripped, "runtime.memmove").asm);
        assert!(!func(&table, &stripped, "main.matmul").asm);
    }

    #[test]
    fn build_id_matches_go_tool_buildid() {
        for name in ["plain", "stripped", "pie", "pie-no-sections", "external"] {
            let data = binary(name);
            let file = object::File::parse(&*data).unwrap();
            let expected = output(go(binaries()).args(["tool", "buildid", name]));
            assert_eq!(
                build_id(&file, &data).as_deref(),
                Some(expected.trim()),
                "{name}"
            );
        }
    }

    /// One function of a hand-built table: what no installed Go writes (1.2, 1.16, 1.20).
    struct SynthFunc {
        name: &'static str,
        /// Entry and size, from the text start.
        entry: u64,
        size: u64,
        /// Runs of (bytes, value).
        sp: Vec<(u32, i32)>,
        lines: Vec<(u32, i32)>,
        /// An inlined call: callee, parentPc, and the pcs (start, bytes) inside it.
        inlined: Option<(&'static str, u32, (u32, u32))>,
        flag: u8,
    }

    const TEXT: u64 = 0x40_1000;
    const TABLE: u64 = 0x50_0000;

    fn synth_funcs() -> Vec<SynthFunc> {
        vec![
            SynthFunc {
                name: "main.leaf",
                entry: 0,
                size: 0x10,
                sp: vec![(0x10, 0)],
                lines: vec![(0x10, 27)],
                inlined: None,
                flag: 0,
            },
            SynthFunc {
                name: "main.work",
                entry: 0x20,
                size: 0x40,
                sp: vec![(4, 0), (0x38, 0x18), (4, 0)],
                lines: vec![(0x10, 10), (0x10, 22), (0x20, 16)],
                inlined: Some(("main.scale", 0x30, (0x10, 0x10))),
                flag: 0,
            },
            SynthFunc {
                name: "runtime.goexit",
                entry: 0x60,
                size: 0x10,
                sp: vec![(0x10, 0)],
                lines: vec![(0x10, 1)],
                inlined: None,
                flag: FLAG_TOPFRAME,
            },
        ]
    }

    fn varint(out: &mut Vec<u8>, mut v: u32) {
        while v >= 0x80 {
            out.push(v as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    /// A pc-value table of `runs`, as Go's linker encodes it.
    fn pc_table(runs: &[(u32, i32)]) -> Vec<u8> {
        let (mut out, mut previous) = (Vec::new(), -1i32);
        for &(bytes, value) in runs {
            let delta = value - previous;
            varint(&mut out, ((delta << 1) ^ (delta >> 31)) as u32);
            varint(&mut out, bytes);
            previous = value;
        }
        out.push(0);
        out
    }

    /// A file holding one table of `format` at `TABLE` (file offset 0) with its inline trees
    /// after it, and the `Pclntab` read from it. Layouts as each Go version's linker writes
    /// them: 1.2 has every offset from the table's start and the functab after the header.
    fn synth(format: Format, funcs: &[SynthFunc]) -> (Vec<u8>, Pclntab) {
        fn put(out: &mut [u8], at: usize, bytes: &[u8]) {
            out[at..at + bytes.len()].copy_from_slice(bytes);
        }
        let align8 = |n: usize| n.next_multiple_of(8);
        let go12 = format == Format::Go12;
        let word = format.word() as usize;
        let (func_id_at, fixed) = format.func_id_and_size();
        let fixed = fixed as usize;
        // Names and pc-value tables, with offsets local to their blobs.
        let (mut names, mut name_offs) = (Vec::new(), HashMap::new());
        for name in funcs
            .iter()
            .flat_map(|f| [Some(f.name), f.inlined.map(|i| i.0)])
            .flatten()
        {
            name_offs.entry(name).or_insert_with(|| {
                let at = names.len();
                names.extend_from_slice(name.as_bytes());
                names.push(0);
                at
            });
        }
        let mut pcs = vec![0u8]; // offset 0 means "no table"
        let mut table = |runs: &[(u32, i32)]| {
            let at = pcs.len();
            pcs.extend_from_slice(&pc_table(runs));
            at
        };
        let fileno = if go12 { 1 } else { 0 };
        let tables: Vec<[Option<usize>; 4]> = funcs
            .iter()
            .map(|f| {
                let inline = f.inlined.map(|(_, _, (start, len))| {
                    let rest = f.size as u32 - start - len;
                    table(&[(start, -1), (len, 0), (rest, -1)])
                });
                let file = table(&[(f.size as u32, fileno)]);
                [
                    Some(table(&f.sp)),
                    Some(file),
                    Some(table(&f.lines)),
                    inline,
                ]
            })
            .collect();
        let files = b"synth.go\0";
        let n = funcs.len();
        let inlined = |f: &SynthFunc| f.inlined.is_some() && !go12;
        let record = |f: &SynthFunc| {
            let funcdata = if inlined(f) { 4 * word + 4 } else { 0 };
            align8(fixed + if f.inlined.is_some() { 12 } else { 0 } + funcdata)
        };
        // Where everything goes.
        let header = match format {
            Format::Go12 => 16,
            Format::Go116 => 64,
            _ => 72,
        };
        let functab_len = (2 * n + 1) * word + if go12 { 4 } else { 0 };
        let (names_at, files_at, cutab_at, pctab_at, functab_at, funcs_at);
        let mut filetab12_at = 0;
        if go12 {
            functab_at = 16;
            funcs_at = align8(functab_at + functab_len);
            names_at = funcs_at + funcs.iter().map(record).sum::<usize>();
            files_at = names_at + names.len();
            filetab12_at = align8(files_at + files.len());
            pctab_at = filetab12_at + 8;
            cutab_at = 0;
        } else {
            names_at = header;
            cutab_at = align8(names_at + names.len());
            files_at = cutab_at + 4;
            pctab_at = files_at + files.len();
            functab_at = align8(pctab_at + pcs.len());
            funcs_at = align8(functab_at + functab_len);
        }
        let table_len = if go12 {
            pctab_at + pcs.len()
        } else {
            funcs_at + funcs.iter().map(record).sum::<usize>()
        };
        let trees_at = align8(table_len);
        let mut out = vec![0u8; trees_at + 20 * n];
        // The header.
        let magic: u32 = match format {
            Format::Go12 => 0xffff_fffb,
            Format::Go116 => 0xffff_fffa,
            Format::Go118 => 0xffff_fff0,
            Format::Go120 => 0xffff_fff1,
        };
        put(&mut out, 0, &magic.to_le_bytes());
        put(&mut out, 6, &[1, 8]);
        put(&mut out, 8, &(n as u64).to_le_bytes());
        if !go12 {
            put(&mut out, 16, &1u64.to_le_bytes());
            let mut at = 24;
            if format != Format::Go116 {
                put(&mut out, 24, &TEXT.to_le_bytes());
                at = 32;
            }
            for v in [names_at, cutab_at, files_at, pctab_at, functab_at] {
                put(&mut out, at, &(v as u64).to_le_bytes());
                at += 8;
            }
        }
        put(&mut out, names_at, &names);
        put(&mut out, files_at, files);
        put(&mut out, pctab_at, &pcs);
        if go12 {
            put(
                &mut out,
                functab_at + (2 * n + 1) * 8,
                &(filetab12_at as u32).to_le_bytes(),
            );
            put(&mut out, filetab12_at, &2u32.to_le_bytes());
            put(&mut out, filetab12_at + 4, &(files_at as u32).to_le_bytes());
        }
        // Offsets as the format counts them.
        let (name_base, pc_base, func_base) = if go12 {
            (names_at, pctab_at, 0)
        } else {
            (0, 0, functab_at)
        };
        let uint = |v: u64| match word {
            8 => v.to_le_bytes().to_vec(),
            _ => (v as u32).to_le_bytes().to_vec(),
        };
        // 1.2 and 1.16 entries are addresses; 1.18+ are offsets from textStart.
        let entry_bytes = |off: u64| uint(if word == 8 { TEXT + off } else { off });
        let mut at = funcs_at;
        let mut tree_at = trees_at;
        for (i, (f, tables)) in funcs.iter().zip(&tables).enumerate() {
            let slot = functab_at + 2 * i * word;
            put(&mut out, slot, &entry_bytes(f.entry));
            put(&mut out, slot + word, &uint((at - func_base) as u64));
            put(&mut out, at, &entry_bytes(f.entry));
            let npcdata = if f.inlined.is_some() { 3 } else { 0 };
            let pc = |t: Option<usize>| t.map_or(0, |t| (t + pc_base) as u32);
            let fields = [
                (name_offs[f.name] + name_base) as u32,
                0,
                0,
                pc(tables[0]),
                pc(tables[1]),
                pc(tables[2]),
                npcdata,
                0,
            ];
            for (k, v) in fields.iter().enumerate().take(if go12 { 7 } else { 8 }) {
                put(&mut out, at + word + 4 * k, &v.to_le_bytes());
            }
            if let Some(func_id_at) = func_id_at {
                let nfuncdata = if inlined(f) { 4 } else { 0 };
                put(
                    &mut out,
                    at + func_id_at as usize + 1,
                    &[f.flag, 0, nfuncdata],
                );
            }
            if npcdata > 0 {
                put(&mut out, at + fixed + 8, &pc(tables[3]).to_le_bytes());
            }
            if inlined(f) {
                let (callee, parent_pc, _) = f.inlined.unwrap();
                let name = name_offs[callee] as u32;
                let mut call = [0u8; 20];
                if format == Format::Go120 {
                    call[4..8].copy_from_slice(&name.to_le_bytes());
                    call[8..12].copy_from_slice(&parent_pc.to_le_bytes());
                } else {
                    call[0..2].copy_from_slice(&(-1i16).to_le_bytes());
                    call[12..16].copy_from_slice(&name.to_le_bytes());
                    call[16..20].copy_from_slice(&parent_pc.to_le_bytes());
                }
                put(&mut out, tree_at, &call);
                let funcdata_at = at + fixed + 4 * npcdata as usize;
                if format == Format::Go116 {
                    // Pointer-sized funcdata, at the next 8-aligned address.
                    let funcdata_at = align8(funcdata_at);
                    let tree = TABLE + tree_at as u64;
                    put(&mut out, funcdata_at + 24, &tree.to_le_bytes());
                } else {
                    for k in 0..3 {
                        put(&mut out, funcdata_at + 4 * k, &u32::MAX.to_le_bytes());
                    }
                    let off = (tree_at - trees_at) as u32;
                    put(&mut out, funcdata_at + 12, &off.to_le_bytes());
                }
                tree_at += 20;
            }
            at += record(f);
        }
        let end = funcs.last().map_or(0, |f| f.entry + f.size);
        put(&mut out, functab_at + 2 * n * word, &entry_bytes(end));
        let table = Table::parse(&out, 0, table_len as u64, TABLE, None).unwrap();
        let segment = Segment {
            address: TABLE,
            offset: 0,
            file_size: out.len() as u64,
            flags: 4,
        };
        let text = table.text_range(table.bytes(&out).unwrap()).unwrap();
        let gofunc = Some(TABLE + trees_at as u64).filter(|_| word == 4);
        let segments = vec![segment];
        (
            out,
            Pclntab {
                table,
                gofunc,
                segments,
                text,
            },
        )
    }

    #[test]
    fn every_format_reads_from_its_layout() {
        let funcs = synth_funcs();
        let at = |function: &str, line| GoFrame {
            function: function.to_owned(),
            file: Some("synth.go".to_owned()),
            line,
        };
        for format in [Format::Go12, Format::Go116, Format::Go118, Format::Go120] {
            let (data, table) = synth(format, &funcs);
            let name = format.name();
            assert_eq!(table.format(), format);
            assert_eq!(table.functions(), 3);
            assert_eq!(table.text_range(), TEXT..TEXT + 0x70);
            assert_eq!(table.inline_trees(), format != Format::Go12, "{name}");
            let listed: Vec<(u64, u64, &str, bool)> = table
                .funcs(&data)
                .map(|f| f.map(|f| (f.entry - TEXT, f.end - TEXT, f.name, f.top_frame)))
                .collect::<Result<_>>()
                .unwrap();
            assert_eq!(
                listed,
                [
                    (0, 0x20, "main.leaf", false),
                    (0x20, 0x60, "main.work", false),
                    (0x60, 0x70, "runtime.goexit", true)
                ],
                "{name}"
            );
            assert_eq!(
                table.frames(&data, TEXT + 5).unwrap(),
                [at("main.leaf", 27)]
            );
            let inlined = table.frames(&data, TEXT + 0x38).unwrap();
            if format == Format::Go12 {
                assert_eq!(inlined, [at("main.work", 22)], "{name}");
            } else {
                assert_eq!(
                    inlined,
                    [at("main.scale", 22), at("main.work", 16)],
                    "{name}"
                );
            }
            assert_eq!(
                table.frames(&data, TEXT + 0x2f).unwrap(),
                [at("main.work", 10)]
            );
            // Padding after main.leaf's 16 bytes, and past the end.
            assert!(matches!(
                table.frames(&data, TEXT + 0x18),
                Err(PclntabError::PcValueEnds { table: "pcln", .. })
            ));
            assert!(matches!(
                table.frames(&data, TEXT + 0x70),
                Err(PclntabError::NoFunction { .. })
            ));
            let work = func(&table, &data, "main.work");
            let e = work.entry;
            assert_eq!(
                table.sp_deltas(&data, &work).unwrap(),
                [(e, 0), (e + 4, 0x18), (e + 0x3c, 0)],
                "{name}"
            );
        }
    }

    fn find(data: &[u8]) -> Result<Option<Pclntab>> {
        Pclntab::find(&object::File::parse(data).unwrap(), data)
    }

    #[test]
    fn corrupt_headers_and_functabs_give_errors() {
        let data = binary("stripped");
        let good = table(&data);
        let start = good.table.start as usize;
        let with = |at: usize, bytes: &[u8]| {
            let mut data = data.clone();
            data[at..at + bytes.len()].copy_from_slice(bytes);
            data
        };
        let refused = |data: Vec<u8>| find(&data).unwrap_err();
        for (at, bytes, field) in [
            (7, &[4][..], "ptrSize"),
            (6, &[4], "minLC"),
            (4, &[1], "pad"),
            (0, &[0xff, 0xff, 0xff, 0xf0], "byte order"),
        ] {
            let e = refused(with(start + at, bytes));
            assert!(
                matches!(e, PclntabError::Unsupported { field: f, .. } if f == field),
                "{e}"
            );
            assert!(e.to_string().contains(field), "{e}");
        }
        let e = refused(with(start, &0xffff_fff5u32.to_le_bytes()));
        assert!(
            matches!(
                e,
                PclntabError::UnknownMagic {
                    magic: 0xffff_fff5,
                    ..
                }
            ),
            "{e}"
        );
        let e = refused(with(start + 8, &(1u64 << 40).to_le_bytes()));
        assert!(
            matches!(e, PclntabError::Header { field: "nfunc", .. }),
            "{e}"
        );
        let e = refused(with(start + 56, &u64::MAX.to_le_bytes()));
        assert!(
            matches!(
                e,
                PclntabError::Header {
                    field: "pctabOffset",
                    ..
                }
            ),
            "{e}"
        );

        // Functions 100 and 101 swapped in the functab: both refuse, the rest still read.
        let functab = start + good.table.functab as usize;
        let pair = |i: usize| data[functab + 8 * i..functab + 8 * i + 8].to_vec();
        let swapped = with(functab + 800, &[pair(101), pair(100)].concat());
        let table = table(&swapped);
        let failed: Vec<usize> = (table.funcs(&swapped).enumerate())
            .filter_map(|(i, f)| f.is_err().then_some(i))
            .collect();
        assert_eq!(failed, [100, 101]);
        let tab = good.table.bytes(&data).unwrap();
        for i in [100, 101] {
            let entry = good.table.entry(tab, i).unwrap();
            let e = table.frames(&swapped, entry).unwrap_err();
            assert!(matches!(e, PclntabError::Unsorted { .. }), "{e}");
        }

        // A _func whose entry disagrees with its functab entry, and one whose pcln table is
        // past the table's end.
        let func = good.table.func(tab, 200).unwrap();
        let at = start + func.off as usize;
        let moved = with(at, &0u32.to_le_bytes());
        let e = table_frames_error(&moved, func.entry);
        assert!(
            matches!(e, PclntabError::EntryMismatch { index: 200, .. }),
            "{e}"
        );
        let lost = with(at + 24, &u32::MAX.to_le_bytes());
        let e = table_frames_error(&lost, func.entry);
        assert!(matches!(e, PclntabError::Truncated { .. }), "{e}");
    }

    fn table_frames_error(data: &[u8], pc: u64) -> PclntabError {
        table(data).frames(data, pc).unwrap_err()
    }

    #[test]
    fn corrupt_functions_give_errors() {
        // A name with no NUL before the table's end, and one that is not UTF-8.
        let (mut data, table) = synth(Format::Go118, &synth_funcs());
        let tab = table.table.bytes(&data).unwrap();
        let leaf = table.table.func(tab, 0).unwrap();
        let name_at = (table.table.funcnames + leaf.name_off) as usize;
        data[name_at] = 0xff;
        let e = table.frames(&data, TEXT).unwrap_err();
        assert!(
            matches!(
                e,
                PclntabError::BadString {
                    what: "a function name",
                    ..
                }
            ),
            "{e}"
        );
        let end = table.table.len as usize;
        data[end - 1] = b'x';
        let name_off = (end - 1) as u32 - table.table.funcnames as u32;
        data[leaf.off as usize + 4..][..4].copy_from_slice(&name_off.to_le_bytes());
        let e = table.funcs(&data).next().unwrap().unwrap_err();
        assert!(
            matches!(
                e,
                PclntabError::BadString {
                    what: "a function name",
                    ..
                }
            ),
            "{e}"
        );

        // An inlined call whose call site is inside itself: a cycle, cut at 64 levels.
        let mut funcs = synth_funcs();
        funcs[1].inlined = Some(("main.scale", 0x18, (0x10, 0x10)));
        let (data, table) = synth(Format::Go120, &funcs);
        let e = table.frames(&data, TEXT + 0x38).unwrap_err();
        assert!(matches!(e, PclntabError::InlineTooDeep { .. }), "{e}");

        // pcsp tables: one past the function's end, one that does not start at 0, one whose
        // varint never ends.
        for (sp, problem) in [
            (vec![(0x30, 0)], "covers more bytes"),
            (vec![(4, 8), (0xc, 0)], "does not start with 0"),
        ] {
            let mut funcs = synth_funcs();
            funcs[0].sp = sp;
            let (data, table) = synth(Format::Go116, &funcs);
            let leaf = func(&table, &data, "main.leaf");
            let e = table.sp_deltas(&data, &leaf).unwrap_err();
            assert!(e.to_string().contains(problem), "{e}");
        }
        let (mut data, table) = synth(Format::Go12, &synth_funcs());
        let tab = table.table.bytes(&data).unwrap();
        let pcsp = table.table.pctab + u64::from(table.table.func(tab, 0).unwrap().pcsp);
        data[pcsp as usize..][..6].fill(0xff);
        let leaf = func(&table, &data, "main.leaf");
        let e = table.sp_deltas(&data, &leaf).unwrap_err();
        assert!(matches!(e, PclntabError::Varint { .. }), "{e}");
    }

    #[test]
    fn fuzz_regressions_do_not_panic() {
        let inputs = crate::sys::fs::fuzz_inputs("gopclntab");
        let seeds = inputs
            .iter()
            .filter(|(path, _)| path.to_string_lossy().contains("seeds"));
        assert!(seeds.count() >= 1, "fuzz/seeds/gopclntab/ is committed");
        for (_, data) in &inputs {
            fuzz_one(data);
        }
        // Truncations of real binaries, around and inside their tables, and bytes changed at
        // random in them: the section, symbol and scan paths.
        let mut random = 0x2545_f491_4f6c_dd1du64;
        for (name, changes) in [("stripped", 200), ("pie-no-sections", 20)] {
            let data = binary(name);
            let table = table(&data);
            let (start, len) = (table.table.start as usize, table.table.len as usize);
            let cuts = [0, 4, 64, 512, start, start + 8, start + 72, start + len / 2];
            for cut in cuts.into_iter().chain([start + len - 1, data.len() - 1]) {
                fuzz_one(&data[..cut]);
            }
            for _ in 0..changes {
                let mut changed = data.clone();
                for _ in 0..8 {
                    random ^= random << 13;
                    random ^= random >> 7;
                    random ^= random << 17;
                    changed[start + random as usize % len] = (random >> 56) as u8;
                }
                fuzz_one(&changed);
            }
        }
    }

    #[test]
    fn names_ten_thousand_pcs_quickly() {
        let data = binary("stripped");
        let table = table(&data);
        let range = table.text_range();
        let step = (range.end - range.start) / 10_000;
        let started = std::time::Instant::now();
        let named = (0..10_000)
            .filter(|k| table.frames(&data, range.start + k * step).is_ok())
            .count();
        let took = started.elapsed();
        assert!(named > 9_000, "{named} of 10,000 named");
        // Well under 100 ms optimised; debug builds are about twenty times slower.
        let limit = if cfg!(debug_assertions) { 2_000 } else { 100 };
        assert!(took.as_millis() < limit, "10,000 pcs took {took:?}");
        println!("10,000 pcs named in {took:?}");
    }
}
