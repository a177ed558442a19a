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
//!
//! This file is the surface the rest of the symboliser sees. Its parts import from it only the
//! plain types (`FileData`, `ResolvedFrame`), and from each other only the parts listed before
//! them: `symtab` (symbol tables, demangling), `sections` (DWARF sections in place or
//! inflated), `units` (the unit index and one-unit views), `dwarf` (addr2line lookups within a
//! parse budget). [`extract`], apart, rewrites a file into its debug-only form for servers that
//! symbolise.

mod dwarf;
pub mod extract;
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

use object::{Object, ObjectSegment};

use super::address::{ElfAddress, FileOffset};
use dwarf::Dwarf;
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
        let (mut dwarf, dwarf_unreadable) = match Dwarf::load(&file, &data) {
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
        let inflated = dwarf.as_mut().map(Dwarf::take_inflated);
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
        if debug.symbols.functions().len() > self.symbols.functions().len() {
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
        let dwarf = self.dwarf.as_ref().map_or(0, Dwarf::mapped_bytes);
        self.symbols.bytes() + dwarf + 4096
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
            match dwarf.frames(address.0, symbol, || self.release_resident_pages()) {
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
