//! What one ELF file knows about its code: `PT_LOAD` segments, symbol tables, GNU build id,
//! `.gnu_debuglink`, and DWARF with inline frames and file:line (through addr2line).
//!
//! A Go binary is named from its `.gopclntab` when DWARF does not cover a pc (Go's stripped
//! builds keep it: the runtime needs it for its own tracebacks), before its symbol table: the
//! table gives files, lines and inlined calls, where the symbol table gives a name only.
//!
//! Files are memory-mapped and DWARF sections are read in place, so only the pages a lookup
//! touches become resident, and addr2line parses only the compilation units that hold the
//! addresses asked for. Compressed sections (zlib, zstd; Debian's debug packages use them) are
//! inflated into unlinked temporary files and mapped too: their pages are page cache the kernel
//! can reclaim, not heap, and leave this process's RSS like the rest of the mapped DWARF.
//!
//! Every input here comes from outside the process and may be truncated or corrupt: parsing
//! errors become [`ElfError`], lookup failures become a fallback (DWARF, then symbol table,
//! then nothing), never a panic. `fuzz/` drives [`fuzz_one`] with arbitrary bytes. Any local
//! user or container can also hand over a file that is valid but built to cost: DWARF that
//! would inflate or index beyond [`DwarfLimits`] is refused before it is paid for
//! ([`OverBudget`]), and the file is named from its symbol tables.
//!
//! This file is the surface the rest of the symboliser sees. Its parts import from it only the
//! plain types (`FileData`, `ResolvedFrame`, the DWARF limits and what they refused), and from
//! each other only the parts listed before them: `symtab` (symbol tables, demangling),
//! `sections` (DWARF sections in place or inflated), `units` (the unit index and one-unit
//! views), `dwarf` (addr2line lookups within a parse budget). [`extract`], apart, rewrites a
//! file into its debug-only form for servers that symbolise.

mod dwarf;
pub mod extract;
mod section_cache;
mod sections;
mod symtab;
mod units;

use std::{
    fmt,
    fs::File,
    io,
    path::{Path, PathBuf},
    sync::Arc,
};

use object::Object;

use crate::binary::address::{ElfAddress, FileOffset};
use crate::binary::elf::Elf;
use crate::binary::gopclntab::Pclntab;
use crate::sys;
use dwarf::Dwarf;
pub use section_cache::SectionCache;
pub use symtab::demangle;
use symtab::SymbolTable;

#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("parsing ELF file {path}: {source}")]
    Parse {
        path: PathBuf,
        source: object::Error,
    },
    #[error("parsing ELF file {path}: {source}")]
    Image {
        path: PathBuf,
        source: crate::binary::elf::ElfError,
    },
    #[error("reading DWARF in {path}: {source}")]
    Dwarf { path: PathBuf, source: gimli::Error },
}

/// The bytes of a file: mapped from disk, or owned (a copy of the vdso, fuzz input).
pub enum FileData {
    /// Mapped read-only. A file mapping carries its SIGBUS guard (see [`sys::sigbus`]):
    /// whoever can write the file can shrink it under us. Anonymous memory needs none.
    Mapped(memmap2::Mmap, Option<sys::sigbus::Guarded>),
    Owned(Vec<u8>),
}

/// Files larger than this are not copied into memory when no SIGBUS guard is left for them.
const MAX_COPIED_FILE: u64 = 64 << 20;

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
        // SAFETY: a private read-only map. A file truncated underneath it faults on access;
        // the guard below turns that fault into pages of zeros instead of a dead daemon.
        let map = unsafe { memmap2::Mmap::map(file) }.map_err(read_err)?;
        match sys::sigbus::guard(map.as_ptr(), map.len()) {
            Some(guard) => Ok(FileData::Mapped(map, Some(guard))),
            None => {
                // Every guard is taken: read the file instead, if it is of a sane size.
                drop(map);
                let size = file.metadata().map_err(read_err)?.len();
                if size > MAX_COPIED_FILE {
                    return Err(read_err(std::io::Error::other(
                        "too many files mapped to map another one, and too large to copy",
                    )));
                }
                let mut bytes = Vec::with_capacity(size as usize);
                std::io::Read::read_to_end(
                    &mut std::io::Read::take(file, MAX_COPIED_FILE),
                    &mut bytes,
                )
                .map_err(read_err)?;
                Ok(FileData::Owned(bytes))
            }
        }
    }

    pub fn bytes(&self) -> &[u8] {
        match self {
            FileData::Mapped(map, _) => map,
            FileData::Owned(bytes) => bytes,
        }
    }

    /// Drops this process's page-table entries for the mapping. The pages stay in the page
    /// cache (shared, not this process's RSS) and fault back in on the next read; without
    /// this, every DWARF page a lookup ever touched would count as scorch's memory.
    fn release_resident_pages(&self) {
        if let FileData::Mapped(map, _) = self {
            // SAFETY: the mapping is private and read-only and never written, so discarding
            // its pages loses nothing: the next access reads the file again.
            let _ = unsafe { map.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
        }
    }
}

/// What one file's DWARF may cost before it is refused and the file is named from its symbol
/// tables instead. The defaults, and why they are what they are, are with each bound:
/// `sections::MAX_INFLATED_PER_FILE`, `units::MAX_UNITS`, `units::MAX_RANGE_ENTRIES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DwarfLimits {
    /// Bytes all compressed DWARF sections of the file claim to inflate to, together.
    pub inflated_bytes: u64,
    /// Units in the unit index.
    pub units: usize,
    /// Range-list entries read to build the unit index (which bounds its spans).
    pub range_entries: usize,
}

impl Default for DwarfLimits {
    fn default() -> Self {
        DwarfLimits {
            inflated_bytes: sections::MAX_INFLATED_PER_FILE,
            units: units::MAX_UNITS,
            range_entries: units::MAX_RANGE_ENTRIES,
        }
    }
}

/// How [`ElfFile::parse_with`] reads a file's DWARF.
#[derive(Debug, Clone, Default)]
pub struct DwarfOptions {
    /// Read no DWARF at all, symbol tables only: for a file already known to go over its limits,
    /// so that opening it again costs nothing it was refused for.
    pub skip: bool,
    pub limits: DwarfLimits,
    /// Where compressed sections are inflated to; `None` for `$TMPDIR`, which may be memory.
    pub scratch_dir: Option<PathBuf>,
    /// Where inflated sections are kept for the next reader, if anywhere.
    pub section_cache: Option<SectionCache>,
}

/// Which of [`DwarfLimits`] a file's DWARF went over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverBudget {
    /// Its compressed sections claim to inflate to `claimed` bytes in all.
    Inflated { claimed: u64 },
    /// It has more units than the unit index may hold.
    Units,
    /// Its units' range lists have more entries than the unit index may read.
    RangeEntries,
}

impl fmt::Display for OverBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OverBudget::Inflated { claimed } => {
                write!(
                    f,
                    "compressed DWARF sections claim {claimed} bytes inflated"
                )
            }
            OverBudget::Units => f.write_str("too many DWARF units"),
            OverBudget::RangeEntries => f.write_str("too many DWARF range-list entries"),
        }
    }
}

/// What loading a file's DWARF came to, before or after it is wrapped for lookups.
enum DwarfLoad<T> {
    /// The file has no `.debug_info`.
    Absent,
    /// Refused before it cost what the limits forbid.
    OverBudget(OverBudget),
    Loaded(T),
}

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
    /// Go code: the file's `.gopclntab` holds a function at the address (the profile's
    /// frames then say Go, not just native).
    pub go: bool,
}

/// The file's build id in lowercase hex: its GNU build id, or else a Go binary's Go build id
/// (which `go build` writes where it writes no GNU one), its bytes in hex as Parca Agent keys
/// it, so that the symbol cache and uploads key stripped Go binaries too.
pub fn build_id(elf: &Elf<'_>) -> Option<String> {
    elf.build_id().map(|id| crate::sys::hex::to_hex(&id))
}

/// A `PT_LOAD` segment: which file bytes land at which ELF addresses.
#[derive(Debug, Clone, Copy)]
struct LoadSegment {
    file_offset: u64,
    file_size: u64,
    address: u64,
}

/// Why an ELF lookup found nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElfMiss {
    /// The file offset is in no `PT_LOAD` segment.
    NotLoaded,
    /// Neither DWARF nor the symbol tables cover the address.
    NoSymbol,
    /// Only the file's `.gopclntab` could have named the address, and it is corrupt.
    CorruptGoTable,
}

/// One ELF file's code knowledge.
pub struct ElfFile {
    /// Lowercase hex GNU build id; for a Go binary without one, its Go build id's bytes in hex
    /// (as Parca Agent keys them).
    pub build_id: Option<String>,
    /// `.gnu_debuglink`: the separate debug file's name and the CRC-32 of its contents.
    pub debuglink: Option<(String, u32)>,
    /// `e_entry`: where an executable starts (`_start`); 0 in most libraries.
    entry: u64,
    segments: Vec<LoadSegment>,
    symbols: SymbolTable,
    dwarf: Option<Dwarf>,
    /// A Go binary's `.gopclntab`, read in place from `data[0]`: it names what DWARF does not.
    go: Option<Pclntab>,
    /// Why the file's `.gopclntab` was refused, when it has one that is corrupt.
    go_refused: Option<String>,
    /// Lookups the `.gopclntab` failed (a corrupt function entry or pc table); each fell back
    /// to the symbol table.
    go_errors: std::sync::atomic::AtomicU64,
    /// Why the DWARF of the file (or of its debug file) was refused when it was loaded.
    dwarf_refused: Option<OverBudget>,
    /// The mapped files this entry reads from (the binary, and its debug file when attached).
    data: Vec<Arc<FileData>>,
    /// The inflated copies of `dwarf`'s compressed sections: kept apart from `data` because
    /// they go with the DWARF when it is given up ([`ElfFile::forget_dwarf`]).
    inflated: Vec<Arc<FileData>>,
    /// DWARF problems met while resolving, reported as fallbacks; the frame still gets the
    /// symbol-table name.
    dwarf_errors: std::sync::atomic::AtomicU64,
}

impl fmt::Debug for ElfFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ElfFile")
            .field("build_id", &self.build_id)
            .field("symbols", &self.symbols.functions().len())
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
        Self::parse_with(data, path, &DwarfOptions::default())
    }

    /// Parses an ELF image, reading its DWARF as `options` say.
    pub fn parse_with(
        data: Arc<FileData>,
        path: &Path,
        options: &DwarfOptions,
    ) -> Result<Self, ElfError> {
        let parse_err = |source| ElfError::Parse {
            path: path.to_owned(),
            source,
        };
        let elf = Elf::parse(data.bytes()).map_err(|source| ElfError::Image {
            path: path.to_owned(),
            source,
        })?;
        let file = elf.object();
        let (go, go_refused) = match Pclntab::of(&elf) {
            Ok(table) => (table, None),
            Err(err) => {
                tracing::debug!("{}: its Go symbol table is refused: {err}", path.display());
                (None, Some(err.to_string()))
            }
        };
        file.build_id().map_err(parse_err)?;
        let build_id = build_id(&elf);
        let debuglink = elf
            .debuglink()
            .map(|(name, crc)| (String::from_utf8_lossy(name).into_owned(), crc));
        let segments = elf
            .segments()
            .iter()
            .map(|segment| LoadSegment {
                file_offset: segment.offset,
                file_size: segment.file_size,
                address: segment.address,
            })
            .collect();
        let symbols = SymbolTable::read(file, &data, &|| data.release_resident_pages());
        // Corrupt or oversized DWARF costs the file its line tables, not its symbol names.
        let loaded = if options.skip {
            Ok(DwarfLoad::Absent)
        } else {
            Dwarf::load(file, &data, options)
        };
        let (mut dwarf, dwarf_refused, dwarf_unreadable) = match loaded {
            Ok(DwarfLoad::Loaded(dwarf)) => (Some(dwarf), None, false),
            Ok(DwarfLoad::Absent) => (None, None, false),
            // The caller reports it: it knows whether it had been refused before.
            Ok(DwarfLoad::OverBudget(over)) => (None, Some(over), false),
            Err(source) => {
                let err = ElfError::Dwarf {
                    path: path.to_owned(),
                    source,
                };
                tracing::debug!("{err}");
                (None, None, true)
            }
        };
        let inflated = dwarf.as_mut().map(Dwarf::take_inflated).unwrap_or_default();
        Ok(ElfFile {
            build_id,
            debuglink,
            entry: file.entry(),
            segments,
            symbols,
            dwarf,
            dwarf_refused,
            go,
            go_refused,
            go_errors: 0.into(),
            data: vec![data],
            inflated,
            dwarf_errors: u64::from(dwarf_unreadable).into(),
        })
    }

    /// True when the file carries its own DWARF line tables.
    pub fn has_dwarf(&self) -> bool {
        self.dwarf.is_some()
    }

    /// Why the file's DWARF was refused, if it was: when it was loaded, or since, when a
    /// lookup found its units beyond the limits. The file is then named from its symbol tables.
    pub fn dwarf_refused(&self) -> Option<OverBudget> {
        self.dwarf_refused
            .or_else(|| self.dwarf.as_ref().and_then(Dwarf::refused))
    }

    /// Gives up the file's DWARF and its inflated sections, keeping the symbol tables: for a
    /// file whose DWARF was refused after it was loaded.
    pub fn forget_dwarf(&mut self) {
        self.dwarf_refused = self.dwarf_refused();
        self.dwarf = None;
        self.inflated.clear();
    }

    /// Takes DWARF (and, when it has more, the symbol table) from a separate debug file.
    pub fn attach_debug(&mut self, debug: ElfFile) {
        if self.dwarf.is_none() {
            self.dwarf = debug.dwarf;
            self.inflated.extend(debug.inflated);
            // The file's own DWARF is absent, so a refusal can only be the debug file's.
            self.dwarf_refused = self.dwarf_refused.or(debug.dwarf_refused);
        }
        if debug.symbols.functions().len() > self.symbols.functions().len() {
            self.symbols = debug.symbols;
        }
        self.data.extend(debug.data);
    }

    /// Lets the kernel reclaim the file pages lookups made resident (see
    /// [`FileData::release_resident_pages`]).
    pub fn release_resident_pages(&self) {
        for data in self.data.iter().chain(&self.inflated) {
            data.release_resident_pages();
        }
    }

    /// Estimated memory this entry can hold: heap for tables and inflated sections, plus the
    /// mapped DWARF that lookups may fault in.
    pub fn cost(&self) -> usize {
        let dwarf = self.dwarf.as_ref().map_or(0, Dwarf::mapped_bytes);
        self.symbols.bytes() + dwarf + 4096
    }

    /// The part of [`ElfFile::cost`] that is debug sections read in place from the file:
    /// file-backed pages, of which only those lookups touch are resident (and those are
    /// released every few hundred lookups), unlike the heap and the inflated sections.
    pub fn file_backed_bytes(&self) -> usize {
        let dwarf = self.dwarf.as_ref().map_or(0, Dwarf::mapped_bytes);
        dwarf.saturating_sub(self.inflated_bytes())
    }

    /// Bytes of compressed sections inflated for the file's DWARF.
    pub fn inflated_bytes(&self) -> usize {
        self.inflated.iter().map(|data| data.bytes().len()).sum()
    }

    /// Caps how much DWARF the file's parsed state may cover (default
    /// [`dwarf::MAX_PARSED_DWARF`]).
    pub fn set_dwarf_parse_budget(&mut self, bytes: usize) {
        if let Some(dwarf) = &mut self.dwarf {
            dwarf.set_budget(bytes);
        }
    }

    /// Drops the DWARF parse when no lookup used it since the last call: a daemon calls this
    /// every window, so only the files its current stacks need keep their (megabytes of)
    /// parsed state. Returns whether a parse was dropped.
    pub fn release_idle_parse(&self) -> bool {
        self.dwarf.as_ref().is_some_and(Dwarf::release_idle_parse)
    }

    /// Looks DWARF up through one addr2line `Context` for the whole file, as files with
    /// cross-unit references do, instead of one per unit: for benchmarks comparing the two.
    pub fn use_whole_file_dwarf(&self) {
        if let Some(dwarf) = &self.dwarf {
            dwarf.use_whole_file();
        }
    }

    /// How many times the DWARF parse was dropped for covering more than its budget.
    pub fn dwarf_reparses(&self) -> u64 {
        self.dwarf.as_ref().map_or(0, Dwarf::reparses)
    }

    /// DWARF errors met so far (each one fell back to the symbol table).
    pub fn dwarf_errors(&self) -> u64 {
        self.dwarf_errors.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// True when the file is a Go binary whose `.gopclntab` is read.
    pub fn has_go_table(&self) -> bool {
        self.go.is_some()
    }

    /// Why the file's `.gopclntab` was refused, if it has a corrupt one.
    pub fn go_table_refused(&self) -> Option<&str> {
        self.go_refused.as_deref()
    }

    /// `.gopclntab` lookups that failed so far (each fell back to the symbol table).
    pub fn go_errors(&self) -> u64 {
        self.go_errors.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The ELF address that `offset` is loaded at, through the `PT_LOAD` segment holding it.
    pub fn elf_address(&self, offset: FileOffset) -> Option<ElfAddress> {
        self.segments
            .iter()
            .find(|s| offset.0 >= s.file_offset && offset.0 - s.file_offset < s.file_size)
            .map(|s| ElfAddress(offset.0 - s.file_offset + s.address))
    }

    /// The file offset of the entry point (`e_entry`), when a `PT_LOAD` segment holds it.
    pub fn entry_offset(&self) -> Option<FileOffset> {
        let entry = self.entry;
        self.segments
            .iter()
            .find(|s| entry >= s.address && entry - s.address < s.file_size)
            .map(|s| FileOffset(entry - s.address + s.file_offset))
    }

    /// The function levels at `address`, innermost (inlined) first. DWARF first; then a Go
    /// binary's `.gopclntab`; the symbol table when neither has anything or both fail.
    pub fn resolve(&self, address: ElfAddress) -> Result<Vec<ResolvedFrame>, ElfMiss> {
        let symbol = self.symbols.lookup(address.0);
        // addr2line probes [address, address + 1): the last address cannot be asked about.
        let dwarf = self.dwarf.as_ref().filter(|_| address.0 != u64::MAX);
        if let Some(dwarf) = dwarf {
            match dwarf.frames(address.0, symbol, || self.release_resident_pages()) {
                Ok(mut frames) if !frames.is_empty() => {
                    let go = self.is_go_code(address);
                    frames.iter_mut().for_each(|frame| frame.go = go);
                    return Ok(frames);
                }
                Ok(_) => {}
                Err(_) => {
                    self.dwarf_errors
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        if let Some(go) = &self.go {
            if go.text_range().contains(&address.0) {
                match go.frames(self.data[0].bytes(), address.0) {
                    Ok(frames) if !frames.is_empty() => {
                        return Ok(frames
                            .into_iter()
                            .map(|frame| ResolvedFrame {
                                system_name: frame.function.clone(),
                                function: frame.function,
                                file: frame.file,
                                line: frame.line,
                                go: true,
                            })
                            .collect());
                    }
                    // Outside every function, or in the padding after one's code, where its
                    // pc tables end: nothing to name, nothing wrong.
                    Err(
                        crate::binary::gopclntab::PclntabError::NoFunction { .. }
                        | crate::binary::gopclntab::PclntabError::PcValueEnds { .. },
                    ) => {}
                    _ => {
                        self.go_errors
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if symbol.is_none() {
                            return Err(ElfMiss::CorruptGoTable);
                        }
                    }
                }
            }
        }
        let name = match symbol {
            Some(name) => name,
            None if self.go_refused.is_some() => return Err(ElfMiss::CorruptGoTable),
            None => return Err(ElfMiss::NoSymbol),
        };
        Ok(vec![ResolvedFrame {
            function: demangle(name).into_owned(),
            system_name: name.to_owned(),
            file: None,
            line: 0,
            go: false,
        }])
    }

    /// Whether `address` is Go code: the file's `.gopclntab` names a function there (a cgo
    /// binary's C code, between Go's functions, is named by nothing in it).
    fn is_go_code(&self, address: ElfAddress) -> bool {
        self.go.as_ref().is_some_and(|go| {
            go.text_range().contains(&address.0)
                && go
                    .frames(self.data[0].bytes(), address.0)
                    .is_ok_and(|frames| !frames.is_empty())
        })
    }
}

/// Parses arbitrary bytes as an ELF file and resolves addresses spread over its segments,
/// the way the profiler would. Must never panic: `fuzz/` calls it with corrupt input and the
/// regression files under `agent/tests/fuzz-regressions/elf/` keep what it found.
pub fn fuzz_one(data: &[u8]) {
    let Ok(file) = ElfFile::parse(Arc::new(FileData::Owned(data.to_vec())), Path::new("fuzz"))
    else {
        return;
    };
    let mut addresses: Vec<u64> = file
        .segments
        .iter()
        .flat_map(|s| [s.address, s.address.wrapping_add(s.file_size / 2)])
        .chain(file.symbols.functions().iter().take(64).map(|s| s.start))
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

    /// Where in its file this process's code at `address` is. `user` parses maps, but it is
    /// a layer above this one: the test reads the one line it needs itself.
    fn own_file_offset(address: u64) -> FileOffset {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines()
            .find_map(|line| {
                let mut fields = line.split_whitespace();
                let (start, end) = fields.next()?.split_once('-')?;
                let start = u64::from_str_radix(start, 16).ok()?;
                let end = u64::from_str_radix(end, 16).ok()?;
                let offset = u64::from_str_radix(fields.nth(1)?, 16).ok()?;
                (start..end)
                    .contains(&address)
                    .then(|| FileOffset(address - start + offset))
            })
            .expect("the test's own code is mapped")
    }

    #[test]
    fn resolves_own_functions_with_dwarf() {
        // This test binary has DWARF (tests build with debug info): resolve one of its own
        // functions through its own file, and expect a source file and line.
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let file = ElfFile::open(&exe).unwrap();
        assert!(file.has_dwarf());
        assert!(file.build_id.is_some());
        let address = resolves_own_functions_with_dwarf as *const () as u64;
        let elf_address = file.elf_address(own_file_offset(address)).unwrap();
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

    /// An ELF object with `crafted_function` at 0x10 (a symbol table to fall back to) and the
    /// given DWARF sections, each zlib-compressed (`SHF_COMPRESSED`): (name, the inflated size
    /// its header claims, the compressed stream that follows the header).
    fn elf_with_compressed_sections(sections: &[(&str, u64, Vec<u8>)]) -> Vec<u8> {
        use object::write::{Object as Writer, StandardSection, Symbol, SymbolSection};
        use object::{SectionFlags, SectionKind, SymbolFlags, SymbolKind, SymbolScope};
        let mut writer = Writer::new(
            object::BinaryFormat::Elf,
            object::Architecture::X86_64,
            object::Endianness::Little,
        );
        let text = writer.section_id(StandardSection::Text);
        writer.append_section_data(text, &[0x90; 0x40], 16);
        writer.add_symbol(Symbol {
            name: b"crafted_function".to_vec(),
            value: 0x10,
            size: 0x10,
            kind: SymbolKind::Text,
            scope: SymbolScope::Compilation,
            weak: false,
            section: SymbolSection::Section(text),
            flags: SymbolFlags::None,
        });
        for (name, claimed, stream) in sections {
            let id = writer.add_section(Vec::new(), name.as_bytes().to_vec(), SectionKind::Debug);
            // Elf64_Chdr: type, reserved, size, alignment.
            let mut data = Vec::new();
            data.extend(object::elf::ELFCOMPRESS_ZLIB.to_le_bytes());
            data.extend(0u32.to_le_bytes());
            data.extend(claimed.to_le_bytes());
            data.extend(1u64.to_le_bytes());
            data.extend(stream);
            let section = writer.section_mut(id);
            section.set_data(data, 1);
            section.flags = SectionFlags::Elf {
                sh_flags: u64::from(object::elf::SHF_COMPRESSED),
            };
        }
        writer.write().unwrap()
    }

    fn zlib(bytes: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    fn parse_crafted(bytes: &[u8], options: &DwarfOptions) -> ElfFile {
        let data = Arc::new(FileData::Owned(bytes.to_vec()));
        ElfFile::parse_with(data, Path::new("crafted"), options).unwrap()
    }

    fn outermost_name(file: &ElfFile, address: u64) -> Option<String> {
        let frames = file.resolve(ElfAddress(address)).ok()?;
        Some(frames.last()?.function.clone())
    }

    #[test]
    fn compressed_sections_over_the_file_budget_are_refused_before_any_is_inflated() {
        // Three sections of 64 KiB each: every one within a budget of 128 KiB, together not.
        let section = 64u64 << 10;
        let stream = zlib(&vec![0; section as usize]);
        let bytes = elf_with_compressed_sections(
            &[".debug_abbrev", ".debug_info", ".debug_str"]
                .map(|name| (name, section, stream.clone())),
        );
        let scratch = tempfile::tempdir().unwrap();
        // Inflating there fails: a parse that never needs it inflated nothing.
        let missing = scratch.path().join("missing");
        let options = |inflated_bytes, dir: &Path| DwarfOptions {
            limits: DwarfLimits {
                inflated_bytes,
                ..DwarfLimits::default()
            },
            scratch_dir: Some(dir.to_owned()),
            ..DwarfOptions::default()
        };

        let refused = parse_crafted(&bytes, &options(2 * section, &missing));
        assert_eq!(
            refused.dwarf_refused(),
            Some(OverBudget::Inflated {
                claimed: 3 * section
            })
        );
        assert!(!refused.has_dwarf());
        assert_eq!(refused.dwarf_errors(), 0, "a section was inflated");
        assert_eq!(refused.inflated_bytes(), 0);
        assert_eq!(
            outermost_name(&refused, 0x18).as_deref(),
            Some("crafted_function")
        );

        // Within the budget the same sections are inflated, into the scratch directory: where
        // it is missing, they fail.
        let loaded = parse_crafted(&bytes, &options(3 * section, scratch.path()));
        assert!(loaded.has_dwarf() && loaded.dwarf_refused().is_none());
        assert_eq!(loaded.inflated_bytes() as u64, 3 * section);
        let failed = parse_crafted(&bytes, &options(3 * section, &missing));
        assert_eq!((failed.dwarf_errors(), failed.dwarf_refused()), (1, None));
    }

    #[test]
    fn nine_sections_of_60_mib_are_refused_by_the_default_budget() {
        // Each section claims what its compressed bytes could plausibly hold (~1000:1), far
        // below the old per-section cap of 1 GiB: only their sum gives them away. The streams
        // are not even valid, since nothing may be inflated. Six of the fifteen (locations,
        // macros, type units, aranges) are never read, so neither counted nor inflated.
        let claimed = 60u64 << 20;
        let stream = vec![0x78; 60 << 10];
        let names = [
            ".debug_abbrev",
            ".debug_addr",
            ".debug_aranges",
            ".debug_info",
            ".debug_line",
            ".debug_line_str",
            ".debug_macinfo",
            ".debug_macro",
            ".debug_str",
            ".debug_str_offsets",
            ".debug_types",
            ".debug_loc",
            ".debug_loclists",
            ".debug_ranges",
            ".debug_rnglists",
        ];
        let bytes =
            elf_with_compressed_sections(&names.map(|name| (name, claimed, stream.clone())));
        let file = parse_crafted(&bytes, &DwarfOptions::default());
        assert_eq!(
            file.dwarf_refused(),
            Some(OverBudget::Inflated {
                claimed: 9 * claimed
            })
        );
        assert_eq!(file.dwarf_errors(), 0, "a section was inflated");
        assert_eq!(
            outermost_name(&file, 0x18).as_deref(),
            Some("crafted_function")
        );
    }

    #[test]
    fn unit_index_over_its_caps_refuses_the_dwarf() {
        // This test binary has hundreds of units and over a hundred thousand range entries.
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let data = Arc::new(FileData::map(&exe).unwrap());
        let parse = |limits| {
            let options = DwarfOptions {
                limits,
                ..DwarfOptions::default()
            };
            ElfFile::parse_with(data.clone(), &exe, &options).unwrap()
        };
        let within = parse(DwarfLimits::default());
        let code = unit_index_over_its_caps_refuses_the_dwarf as *const () as u64;
        let address = within.elf_address(own_file_offset(code)).unwrap();
        assert!(within.resolve(address).unwrap().iter().any(|f| f.line > 0));
        assert_eq!(within.dwarf_refused(), None);
        for (limits, over) in [
            (
                DwarfLimits {
                    units: 8,
                    ..DwarfLimits::default()
                },
                OverBudget::Units,
            ),
            (
                DwarfLimits {
                    range_entries: 1000,
                    ..DwarfLimits::default()
                },
                OverBudget::RangeEntries,
            ),
        ] {
            let file = parse(limits);
            // The index is built by the first lookup, which the symbol table answers.
            assert_eq!(file.dwarf_refused(), None);
            let frames = file.resolve(address).unwrap();
            assert_eq!(file.dwarf_refused(), Some(over));
            assert!(
                frames.len() == 1 && frames[0].file.is_none() && frames[0].line == 0,
                "{frames:?}"
            );
            assert_eq!(file.dwarf_errors(), 0);
        }
    }

    #[test]
    fn fuzz_regressions_do_not_panic() {
        let inputs = crate::sys::fs::fuzz_inputs("elf");
        let findings = inputs
            .iter()
            .filter(|(path, _)| path.to_string_lossy().contains("fuzz-regressions"))
            .count();
        assert!(
            findings >= 7,
            "agent/tests/fuzz-regressions/elf/ is committed"
        );
        for (_, data) in &inputs {
            fuzz_one(data);
        }
        // Truncations of a real binary: every prefix length class must fail cleanly.
        let exe = std::fs::read(std::fs::read_link("/proc/self/exe").unwrap()).unwrap();
        for len in [0, 4, 16, 64, 512, 4096, exe.len() / 3, exe.len() - 1] {
            fuzz_one(&exe[..len]);
        }
    }
}
