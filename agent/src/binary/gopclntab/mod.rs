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
//! pointers and a pc quantum of 1 byte (x86-64) or 4 (arm64) are read; others are refused
//! naming the field.
//!
//! The file is hostile: every read is bounds-checked, every loop is bounded by the bytes it
//! consumes or a fixed depth, and a table found inconsistent gives an error rather than a
//! wrong name. Nothing is indexed on the heap: a lookup is a binary search over the functab
//! in the file plus one function's pc-value tables.

mod build_id;
mod locate;
mod pcvalue;
mod reader;
mod table;

use std::ops::Range;

pub use build_id::build_id;
use locate::*;
use pcvalue::*;
use reader::*;
use table::*;

use object::{
    read::elf::{ElfFile, FileHeader, NoteIterator, ProgramHeader, SectionHeader},
    Endianness, Object, ObjectSymbol,
};

use super::elf::{Elf, SectionRange, Segment, PF_W, PF_X};

/// Why a table could not be read, or a pc not named from it. Offsets are file offsets.
#[derive(Debug, thiserror::Error)]
pub enum PclntabError {
    #[error(
        "the Go pclntab at offset {offset:#x} has magic {magic:#x}, which no Go version writes"
    )]
    UnknownMagic { magic: u32, offset: u64 },
    #[error(
        "the Go pclntab at offset {offset:#x} has {field} {value:#x}: only little-endian tables \
         with ptrSize 8 and minLC 1 (x86-64) or 4 (arm64) are read"
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
/// The Go build id note's type (owner "Go").
const NOTE_GO_BUILD_ID: u32 = 4;
/// `moduledata.gofunc`'s offset: after the slices, the bounds words and `rodata`; 1.20
/// added `covctrs, ecovctrs` before `end`.
const MODULEDATA_GOFUNC_118: u64 = 304;
const MODULEDATA_GOFUNC_120: u64 = 320;
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
        match Elf::parse(data) {
            Ok(elf) => Self::of(&elf),
            // `file` parsed these bytes as ELF, so this parse did too.
            Err(_) => Ok(None),
        }
    }

    /// As [`Pclntab::find`], in a binary already parsed: its segments and where its
    /// `.gopclntab` section is are the parse's.
    pub fn of(elf: &Elf<'_>) -> Result<Option<Pclntab>> {
        let (file, data) = (elf.object(), elf.data());
        // Asked of every binary a process maps: most are not Go, and their symbol tables (a
        // hundred thousand symbols in libLLVM) are not read for Go's names.
        if file.sections().next().is_some() && !has_go_section(file) {
            return Ok(None);
        }
        let segments = load_segments(elf.segments());
        let symbols = Symbols::read(file);
        let section = elf.gopclntab().map(
            |SectionRange {
                 offset,
                 size,
                 address,
             }| { ((offset, size), address) },
        );
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

    /// Function `index` of the table, as [`Pclntab::funcs`] gives it: a table's build reads
    /// its functions once to place them, then again one at a time in pc order.
    pub fn func<'d>(&self, data: &'d [u8], index: u64) -> Result<GoFunc<'d>> {
        self.table.go_func(self.table.bytes(data)?, index)
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
mod tests;
