//! User frame names: absolute address -> mapping in `/proc/PID/maps` -> file offset -> ELF
//! virtual address -> symbol from `.symtab` / `.dynsym`.
//!
//! Each step changes the address space, so each has its own type ([`FileOffset`],
//! [`ElfAddress`]): mixing an absolute address with an ELF address is the classic profiler bug
//! (wrong names for every PIE binary and shared library), and here it does not compile.
//!
//! Binaries are opened through `/proc/PID/root`, the process's own view of the file system, so a
//! binary inside a container's mount namespace is found. Mappings are captured at every drain
//! while the process is alive, so a process that exits before the profile is written is still
//! named.

use std::{
    collections::HashMap,
    fs::File,
    io,
    path::{Path, PathBuf},
    sync::Arc,
};

use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};

#[derive(Debug, thiserror::Error)]
pub enum UserSymbolError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{path}: line {line}: {reason}")]
    MapsParse {
        path: PathBuf,
        line: usize,
        reason: &'static str,
    },
    #[error("parsing ELF file {path}: {source}")]
    Elf {
        path: PathBuf,
        source: object::Error,
    },
}

/// An offset into a file on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FileOffset(pub u64);

/// A virtual address as the ELF file's own headers and symbols use it (before relocation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ElfAddress(pub u64);

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapEntry {
    /// First absolute address of the mapping.
    pub start: u64,
    /// One past the last absolute address.
    pub end: u64,
    /// Offset in the file of `start`.
    pub offset: u64,
    /// True when the mapping is executable; only those hold code.
    pub executable: bool,
    /// `major:minor` device of the file, and its inode; 0 for anonymous mappings.
    pub dev: u64,
    pub inode: u64,
    /// The path column: a file path, a pseudo path like `[vdso]`, or empty.
    pub path: String,
}

impl MapEntry {
    /// True for mappings backed by a file on disk (a path, a non-zero inode).
    pub fn is_file(&self) -> bool {
        self.inode != 0 && self.path.starts_with('/')
    }

    /// The file path without the ` (deleted)` suffix the kernel adds to unlinked files.
    pub fn file_path(&self) -> &str {
        self.path.strip_suffix(" (deleted)").unwrap_or(&self.path)
    }

    /// Translates an absolute address inside this mapping to an offset in the mapped file.
    pub fn file_offset(&self, address: u64) -> FileOffset {
        FileOffset(address - self.start + self.offset)
    }
}

/// Parses `/proc/PID/maps` text. `origin` only names the input in errors.
pub fn parse_maps(text: &str, origin: &Path) -> Result<Vec<MapEntry>, UserSymbolError> {
    let mut entries = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.is_empty() {
            continue;
        }
        let err = |reason| UserSymbolError::MapsParse {
            path: origin.to_owned(),
            line: index + 1,
            reason,
        };
        let mut fields = line.splitn(6, ' ');
        let range = fields.next().ok_or_else(|| err("missing address range"))?;
        let perms = fields.next().ok_or_else(|| err("missing permissions"))?;
        let offset = fields.next().ok_or_else(|| err("missing offset"))?;
        let dev = fields.next().ok_or_else(|| err("missing device"))?;
        let inode = fields.next().ok_or_else(|| err("missing inode"))?;
        let path = fields.next().unwrap_or("").trim_start();
        let (start, end) = range
            .split_once('-')
            .ok_or_else(|| err("bad address range"))?;
        let hex = |s: &str| u64::from_str_radix(s, 16);
        let start = hex(start).map_err(|_| err("bad start address"))?;
        let end = hex(end).map_err(|_| err("bad end address"))?;
        if end <= start {
            return Err(err("empty address range"));
        }
        let (major, minor) = dev.split_once(':').ok_or_else(|| err("bad device"))?;
        let dev = (hex(major).map_err(|_| err("bad device"))? << 32)
            | hex(minor).map_err(|_| err("bad device"))?;
        entries.push(MapEntry {
            start,
            end,
            offset: hex(offset).map_err(|_| err("bad offset"))?,
            executable: perms.as_bytes().get(2) == Some(&b'x'),
            dev,
            inode: inode.parse().map_err(|_| err("bad inode"))?,
            path: path.to_owned(),
        });
    }
    Ok(entries)
}

/// The memory map of one process at the time it was captured.
#[derive(Debug, Clone, Default)]
pub struct ProcessMaps {
    /// Sorted by `start`, non-overlapping (the kernel guarantees both).
    entries: Vec<MapEntry>,
}

impl ProcessMaps {
    /// Reads `/proc/PID/maps`.
    pub fn read(pid: u32) -> Result<Self, UserSymbolError> {
        let path = PathBuf::from(format!("/proc/{pid}/maps"));
        let text = std::fs::read_to_string(&path).map_err(|source| UserSymbolError::Read {
            path: path.clone(),
            source,
        })?;
        Ok(ProcessMaps {
            entries: parse_maps(&text, &path)?,
        })
    }

    pub fn from_entries(mut entries: Vec<MapEntry>) -> Self {
        entries.sort_by_key(|e| e.start);
        ProcessMaps { entries }
    }

    /// The mapping holding `address`, with its index (stable for this snapshot).
    pub fn find(&self, address: u64) -> Option<(usize, &MapEntry)> {
        let index = self
            .entries
            .partition_point(|e| e.start <= address)
            .checked_sub(1)?;
        let entry = &self.entries[index];
        (address < entry.end).then_some((index, entry))
    }

    pub fn entries(&self) -> &[MapEntry] {
        &self.entries
    }
}

/// A `PT_LOAD` segment: which file bytes land at which ELF addresses.
#[derive(Debug, Clone, Copy)]
struct LoadSegment {
    file_offset: u64,
    file_size: u64,
    address: u64,
}

/// A function symbol: start, size (0 when the symbol table does not say), name in the arena.
#[derive(Debug, Clone, Copy)]
struct FunctionSymbol {
    start: u64,
    size: u64,
    name_offset: u32,
    name_len: u32,
}

/// What one ELF file tells about its functions.
#[derive(Debug)]
pub struct ElfSymbols {
    /// Lowercase hex GNU build id, when the file has one.
    pub build_id: Option<String>,
    segments: Vec<LoadSegment>,
    /// Sorted by start.
    symbols: Vec<FunctionSymbol>,
    arena: String,
}

impl ElfSymbols {
    /// Reads the symbol tables of the ELF file at `path`.
    pub fn load(path: &Path) -> Result<Self, UserSymbolError> {
        let read_err = |source| UserSymbolError::Read {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(read_err)?;
        // SAFETY: the map is read-only and private. If another process truncates the file
        // while it is mapped, reads past the new end fault; binaries in use are replaced by
        // rename, not truncated in place, which is the case the kernel itself relies on.
        let data = unsafe { memmap2::Mmap::map(&file) }.map_err(read_err)?;
        Self::parse(&data, path)
    }

    /// Parses an ELF image held in memory. `path` only names the input in errors.
    pub fn parse(data: &[u8], path: &Path) -> Result<Self, UserSymbolError> {
        let elf_err = |source| UserSymbolError::Elf {
            path: path.to_owned(),
            source,
        };
        let file = object::File::parse(data).map_err(elf_err)?;
        let build_id = file
            .build_id()
            .map_err(elf_err)?
            .map(|id| id.iter().map(|b| format!("{b:02x}")).collect());
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
        let mut arena = String::new();
        let mut symbols = Vec::new();
        // .symtab is the full table; .dynsym survives `strip` and names exported functions.
        for symbol in file.symbols().chain(file.dynamic_symbols()) {
            if symbol.kind() != SymbolKind::Text || symbol.address() == 0 {
                continue;
            }
            let Ok(name) = symbol.name() else { continue };
            if name.is_empty() {
                continue;
            }
            symbols.push(FunctionSymbol {
                start: symbol.address(),
                size: symbol.size(),
                name_offset: arena.len() as u32,
                name_len: name.len() as u32,
            });
            arena.push_str(name);
        }
        // Both tables name the same exported functions; keep one per address, preferring a
        // sized entry so lookups can tell where a function ends.
        symbols.sort_by(|a, b| a.start.cmp(&b.start).then(b.size.cmp(&a.size)));
        symbols.dedup_by_key(|s| s.start);
        Ok(ElfSymbols {
            build_id,
            segments,
            symbols,
            arena,
        })
    }

    /// The ELF address that `offset` is loaded at, through the `PT_LOAD` segment holding it.
    pub fn elf_address(&self, offset: FileOffset) -> Option<ElfAddress> {
        self.segments
            .iter()
            .find(|s| offset.0 >= s.file_offset && offset.0 < s.file_offset + s.file_size)
            .map(|s| ElfAddress(offset.0 - s.file_offset + s.address))
    }

    /// The function holding `address`.
    pub fn lookup(&self, address: ElfAddress) -> Option<&str> {
        let index = self
            .symbols
            .partition_point(|s| s.start <= address.0)
            .checked_sub(1)?;
        let symbol = self.symbols[index];
        // A sized symbol ends where it says; an unsized one (hand-written assembly) is trusted
        // up to the next symbol.
        if symbol.size != 0 && address.0 >= symbol.start + symbol.size {
            return None;
        }
        let start = symbol.name_offset as usize;
        Some(&self.arena[start..start + symbol.name_len as usize])
    }
}

/// Identity of a mapped file that survives path changes: device and inode.
type FileKey = (u64, u64);

/// Why a user frame has no function name. A miss is data, reported in the profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserMiss {
    /// No maps were ever captured for the process (it exited before the first drain).
    NoMaps,
    /// The address is in no mapping.
    Unmapped,
    /// The mapping is anonymous or a pseudo file (`[vdso]`, JIT code, ...).
    NotAFile,
    /// The file could not be opened or parsed.
    UnreadableFile,
    /// The file has no symbol covering the address.
    NoSymbol,
}

/// A named or unnamed user frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserFrame {
    /// Index of the mapping in the process's captured maps, when the address is mapped.
    pub mapping: Option<usize>,
    /// The function name, or why there is none.
    pub function: Result<String, UserMiss>,
}

/// Process maps and ELF symbol tables, cached for the life of a profiling session.
#[derive(Debug, Default)]
pub struct UserSymbolizer {
    /// Latest maps captured per process.
    maps: HashMap<u32, ProcessMaps>,
    /// Parsed symbol tables by file identity; `None` remembers a file that failed to parse.
    files: HashMap<FileKey, Option<Arc<ElfSymbols>>>,
}

impl UserSymbolizer {
    /// Captures the current maps of `pids` while they are alive. A process that has already
    /// exited keeps its earlier capture.
    pub fn capture(&mut self, pids: impl IntoIterator<Item = u32>) {
        for pid in pids {
            if pid == 0 {
                continue;
            }
            match ProcessMaps::read(pid) {
                Ok(maps) => {
                    self.maps.insert(pid, maps);
                }
                Err(err) => tracing::debug!("{err}"),
            }
        }
    }

    /// The captured maps of `pid`.
    pub fn maps(&self, pid: u32) -> Option<&ProcessMaps> {
        self.maps.get(&pid)
    }

    /// The symbol table of the file behind `entry`, opened through the process's root.
    pub fn elf(&mut self, pid: u32, entry: &MapEntry) -> Option<Arc<ElfSymbols>> {
        if !entry.is_file() {
            return None;
        }
        self.files
            .entry((entry.dev, entry.inode))
            .or_insert_with(|| {
                let path = PathBuf::from(format!("/proc/{pid}/root{}", entry.file_path()));
                // The process's own mapping stays readable after the file is deleted or when
                // its mount namespace differs, as long as the process lives.
                let map_files = PathBuf::from(format!(
                    "/proc/{pid}/map_files/{:x}-{:x}",
                    entry.start, entry.end
                ));
                ElfSymbols::load(&path)
                    .or_else(|_| ElfSymbols::load(&map_files))
                    .map_err(|err| tracing::debug!("{err}"))
                    .ok()
                    .map(Arc::new)
            })
            .clone()
    }

    /// Names `address` in process `pid`. `is_return_address` is true for every frame but the
    /// leaf: those point after a call, possibly past the end of the calling function.
    pub fn symbolize(&mut self, pid: u32, address: u64, is_return_address: bool) -> UserFrame {
        let Some(maps) = self.maps.get(&pid) else {
            return UserFrame {
                mapping: None,
                function: Err(UserMiss::NoMaps),
            };
        };
        let Some((index, entry)) = maps.find(address) else {
            return UserFrame {
                mapping: None,
                function: Err(UserMiss::Unmapped),
            };
        };
        let entry = entry.clone();
        let lookup_address = if is_return_address {
            address.saturating_sub(1).max(entry.start)
        } else {
            address
        };
        let function = if entry.is_file() {
            match self.elf(pid, &entry) {
                None => Err(UserMiss::UnreadableFile),
                Some(elf) => elf
                    .elf_address(entry.file_offset(lookup_address))
                    .and_then(|a| elf.lookup(a))
                    .map(str::to_owned)
                    .ok_or(UserMiss::NoSymbol),
            }
        } else {
            Err(UserMiss::NotAFile)
        };
        UserFrame {
            mapping: Some(index),
            function,
        }
    }

    /// The build id of the file behind `entry`, when it has one and could be read.
    pub fn build_id(&mut self, pid: u32, entry: &MapEntry) -> Option<String> {
        self.elf(pid, entry).and_then(|elf| elf.build_id.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c8a00000-55d0c8a01000 r--p 00000000 fd:01 1234 /usr/bin/work
55d0c8a01000-55d0c8a02000 r-xp 00001000 fd:01 1234 /usr/bin/work
7f0000000000-7f0000021000 rw-p 00000000 00:00 0 
7f1000000000-7f1000001000 r-xp 00002000 fd:01 99 /usr/lib/libx.so (deleted)
7ffd000000000-7ffd000002000 r-xp 00000000 00:00 0                          [vdso]
";

    #[test]
    fn parses_maps_lines() {
        let entries = parse_maps(MAPS, Path::new("maps")).unwrap();
        assert_eq!(entries.len(), 5);
        assert_eq!(entries[1].start, 0x55d0c8a01000);
        assert_eq!(entries[1].offset, 0x1000);
        assert!(entries[1].executable);
        assert!(!entries[0].executable);
        assert_eq!(entries[1].dev, (0xfd << 32) | 1);
        assert_eq!(entries[1].inode, 1234);
        assert_eq!(entries[1].path, "/usr/bin/work");
        assert!(!entries[2].is_file());
        assert_eq!(entries[3].file_path(), "/usr/lib/libx.so");
        assert!(entries[3].is_file());
        assert_eq!(entries[4].path, "[vdso]");
    }

    #[test]
    fn finds_mapping_and_file_offset() {
        let maps = ProcessMaps::from_entries(parse_maps(MAPS, Path::new("maps")).unwrap());
        let (index, entry) = maps.find(0x55d0c8a01234).unwrap();
        assert_eq!(index, 1);
        assert_eq!(entry.file_offset(0x55d0c8a01234), FileOffset(0x1234));
        assert!(maps.find(0x55d0c8a02000).is_none());
        assert!(maps.find(0x1000).is_none());
    }

    #[test]
    fn bad_maps_line_names_input_and_line() {
        let err = parse_maps("zz-10 r-xp 0 00:00 0\n", Path::new("/proc/7/maps")).unwrap_err();
        assert_eq!(err.to_string(), "/proc/7/maps: line 1: bad start address");
    }

    #[test]
    fn corrupt_elf_is_an_error_not_a_panic() {
        let err =
            ElfSymbols::parse(b"\x7fELF\x02\x01\x01garbage", Path::new("bad.so")).unwrap_err();
        assert!(
            err.to_string().starts_with("parsing ELF file bad.so:"),
            "{err}"
        );
    }

    #[test]
    fn symbolizes_own_test_binary() {
        // This test binary is a real PIE ELF with a symbol table: resolve one of its own
        // functions through its live mapping, the full absolute -> offset -> ELF path.
        let pid = std::process::id();
        let mut symbolizer = UserSymbolizer::default();
        symbolizer.capture([pid]);
        let address = symbolizes_own_test_binary as *const () as u64;
        let frame = symbolizer.symbolize(pid, address, false);
        let name = frame.function.unwrap();
        assert!(name.contains("symbolizes_own_test_binary"), "{name}");
        let (_, entry) = symbolizer.maps(pid).unwrap().find(address).unwrap();
        let entry = entry.clone();
        let build_id = symbolizer.build_id(pid, &entry);
        assert!(
            build_id.is_some_and(|id| id.len() >= 16 && id.chars().all(|c| c.is_ascii_hexdigit()))
        );
    }
}
