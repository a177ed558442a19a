//! An ELF file's function symbols (`.symtab`, `.dynsym`): the names a frame falls back to when
//! DWARF has none, kept compact because every cached file holds them: 16 bytes a symbol, and
//! the names read in place from the file's string tables at lookup. A compiler's libraries
//! name hundreds of thousands of functions in tens of megabytes of `.strtab`; copied, those
//! names were most of the daemon's heap on a build host.

use std::{borrow::Cow, sync::Arc};

use object::{Object, ObjectSymbol, SymbolKind};

use super::FileData;

/// A function symbol: start, size (0 when the table does not say), and where its name is.
#[derive(Debug, Clone, Copy)]
pub(super) struct FunctionSymbol {
    pub(super) start: u64,
    /// Saturated: no function is 4 GiB long, and a table that says so is trusted up to there.
    pub(super) size: u32,
    /// The offset in the file of the name's first byte, NUL-terminated in a string table; or,
    /// with [`IN_ARENA`] set, its offset in the table's own arena (names made here, such as
    /// PLT stubs', and names the file's bytes cannot be addressed by).
    name: u32,
}

/// The bit of [`FunctionSymbol::name`] that says the name is in the arena.
const IN_ARENA: u32 = 1 << 31;

/// Function symbols from `.symtab` and `.dynsym`, sorted by address.
#[derive(Default)]
pub(super) struct SymbolTable {
    symbols: Vec<FunctionSymbol>,
    /// NUL-terminated names not read from the file.
    arena: Vec<u8>,
    /// The file the names are read from.
    data: Option<Arc<FileData>>,
}

impl std::fmt::Debug for SymbolTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymbolTable")
            .field("symbols", &self.symbols.len())
            .field("arena", &self.arena.len())
            .finish()
    }
}

/// Symbols read between two releases of the mapped pages the reading touched (about 2 MiB of
/// table and names for a Rust binary).
const RELEASE_EVERY: usize = 16 << 10;

/// Bytes of names one file's arena keeps at most: the PLT stubs' names are made here, and a
/// crafted file can have any number of stubs; this bounds what such a file costs.
const MAX_ARENA_BYTES: usize = 64 << 20;

/// The longest name kept. Longer ones (none in real tables: the longest C++ template names
/// are tens of kilobytes) are left out, so a lookup's search for a name's end is bounded.
const MAX_NAME: usize = 64 << 10;

impl SymbolTable {
    /// The text symbols of `file`, parsed from `data`'s bytes. `release_pages` is called
    /// every [`RELEASE_EVERY`] symbols: reading a large Rust binary's table touches tens of
    /// MiB of `.symtab` and `.strtab`, which count as this process's memory until let go.
    pub(super) fn read(
        file: &object::File<'_>,
        data: &Arc<FileData>,
        release_pages: &dyn Fn(),
    ) -> Self {
        Self::read_within(file, data, release_pages, MAX_ARENA_BYTES)
    }

    /// [`SymbolTable::read`] keeping at most `arena_budget` bytes of names in the arena: the
    /// symbols past it are left out, as if the table ended there.
    fn read_within(
        file: &object::File<'_>,
        data: &Arc<FileData>,
        release_pages: &dyn Fn(),
        arena_budget: usize,
    ) -> Self {
        let mut table = SymbolTable {
            data: Some(Arc::clone(data)),
            ..SymbolTable::default()
        };
        let bytes = data.bytes();
        // .symtab is the full table; .dynsym survives `strip` and names exported functions.
        for (i, symbol) in file.symbols().chain(file.dynamic_symbols()).enumerate() {
            if i % RELEASE_EVERY == RELEASE_EVERY - 1 {
                release_pages();
            }
            if symbol.kind() != SymbolKind::Text || symbol.address() == 0 {
                continue;
            }
            let Ok(name) = symbol.name() else { continue };
            if name.is_empty() || name.len() > MAX_NAME {
                continue;
            }
            // `object` reads names in place: the name's offset in the file, when it is there
            // and followed by its NUL, as a string table's names are.
            let offset = (name.as_ptr() as usize).wrapping_sub(bytes.as_ptr() as usize);
            let in_file = offset < bytes.len()
                && offset + name.len() < bytes.len()
                && bytes[offset + name.len()] == 0
                && offset < IN_ARENA as usize;
            let start = symbol.address();
            if in_file {
                table.symbols.push(FunctionSymbol {
                    start,
                    size: saturate(symbol.size()),
                    name: offset as u32,
                });
            } else if !table.push(start, symbol.size(), name, arena_budget) {
                break;
            }
        }
        for (start, size, name) in crate::arch::plt_stubs(file) {
            if !table.push(start, size, &name, arena_budget) {
                break;
            }
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

    /// Adds a symbol whose name goes in the arena, unless it would take the arena past
    /// `budget` bytes.
    fn push(&mut self, start: u64, size: u64, name: &str, budget: usize) -> bool {
        let offset = self.arena.len();
        let Some(end) = offset.checked_add(name.len() + 1) else {
            return false;
        };
        if end > budget || end >= IN_ARENA as usize || name.len() > MAX_NAME || name.contains('\0')
        {
            return false;
        }
        self.symbols.push(FunctionSymbol {
            start,
            size: saturate(size),
            name: offset as u32 | IN_ARENA,
        });
        self.arena.extend_from_slice(name.as_bytes());
        self.arena.push(0);
        true
    }

    pub(super) fn lookup(&self, address: u64) -> Option<&str> {
        let index = self
            .symbols
            .partition_point(|s| s.start <= address)
            .checked_sub(1)?;
        let symbol = self.symbols[index];
        // A sized symbol ends where it says; an unsized one (hand-written assembly) is trusted
        // up to the next symbol.
        if symbol.size != 0 && address >= symbol.start.saturating_add(u64::from(symbol.size)) {
            return None;
        }
        self.name(symbol)
    }

    /// The name of `symbol`. Read again at each lookup from the file, which whoever can write
    /// it may have changed since: bounded, and checked to be text.
    fn name(&self, symbol: FunctionSymbol) -> Option<&str> {
        let (bytes, offset) = if symbol.name & IN_ARENA != 0 {
            (&self.arena[..], (symbol.name & !IN_ARENA) as usize)
        } else {
            (self.data.as_ref()?.bytes(), symbol.name as usize)
        };
        let rest = bytes.get(offset..)?;
        let rest = &rest[..rest.len().min(MAX_NAME + 1)];
        let end = rest.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&rest[..end])
            .ok()
            .filter(|name| !name.is_empty())
    }

    /// Heap bytes the table holds; the names read in place are file pages, resident only
    /// while lookups touch them.
    pub(super) fn bytes(&self) -> usize {
        self.symbols.len() * std::mem::size_of::<FunctionSymbol>() + self.arena.len()
    }

    /// The symbols, by address: for the fuzzer and tests, which pick addresses from them.
    pub(super) fn functions(&self) -> &[FunctionSymbol] {
        &self.symbols
    }
}

fn saturate(size: u64) -> u32 {
    u32::try_from(size).unwrap_or(u32::MAX)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `name@plt` -> address, as `objdump -d` labels the stubs of `binary`.
    fn objdump_plt(binary: &std::path::Path) -> std::collections::HashMap<String, u64> {
        objdump_plt_with("objdump", binary)
    }

    /// The same, with the objdump named `objdump`.
    fn objdump_plt_with(
        objdump: &str,
        binary: &std::path::Path,
    ) -> std::collections::HashMap<String, u64> {
        let output = std::process::Command::new(objdump)
            .arg("-d")
            .arg(binary)
            .output()
            .unwrap_or_else(|e| panic!("{objdump}: {e} (`cargo xtask setup` installs it)"));
        assert!(output.status.success());
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| {
                let (address, label) = line.split_once(" <")?;
                let name = label.strip_suffix(">:")?;
                name.ends_with("@plt")
                    .then(|| Some((name.to_owned(), u64::from_str_radix(address, 16).ok()?)))?
            })
            .collect()
    }

    #[test]
    fn names_plt_stubs_as_objdump_does() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("plt.c"),
            "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n\
             int main(int argc, char **argv) { char *p = malloc(16); strcpy(p, argv[0]);\n\
             puts(p); free(p); return 0; }\n",
        )
        .unwrap();
        // Without IBT the stubs are in .plt; with it (`-z ibtplt`), in .plt.sec.
        for (name, extra) in [("plain", &[][..]), ("ibt", &["-Wl,-z,ibtplt"][..])] {
            let binary = dir.path().join(name);
            let status = std::process::Command::new("gcc")
                .args(["-O1", "-fno-builtin", "-o"])
                .arg(&binary)
                .arg(dir.path().join("plt.c"))
                .args(extra)
                .status()
                .unwrap();
            assert!(status.success());
            let expected = objdump_plt(&binary);
            assert!(expected.contains_key("puts@plt"), "{name}: {expected:?}");
            let data = Arc::new(FileData::map(&binary).unwrap());
            let file = object::File::parse(data.bytes()).unwrap();
            let table = SymbolTable::read(&file, &data, &|| {});
            for (stub, &address) in &expected {
                for offset in [0, 4, 7] {
                    assert_eq!(
                        table.lookup(address + offset),
                        Some(stub.as_str()),
                        "{name}: {address:#x}+{offset}"
                    );
                }
            }
        }
    }

    #[test]
    fn names_arm64_plt_stubs_as_objdump_does() {
        use crate::arch::aarch64::test_files;
        let binary = test_files::existing(test_files::LIBC);
        let expected = objdump_plt_with("aarch64-linux-gnu-objdump", binary);
        assert!(expected.contains_key("calloc@plt"), "{expected:?}");
        let data = Arc::new(FileData::map(binary).unwrap());
        let file = object::File::parse(data.bytes()).unwrap();
        let stubs = crate::arch::plt_stubs(&file);
        // Every stub objdump names, and no other.
        let mut named: Vec<(&str, u64)> = stubs.iter().map(|(a, _, n)| (n.as_str(), *a)).collect();
        let mut wanted: Vec<(&str, u64)> = expected.iter().map(|(n, &a)| (n.as_str(), a)).collect();
        named.sort_unstable();
        wanted.sort_unstable();
        assert_eq!(named, wanted);
        let table = SymbolTable::read(&file, &data, &|| {});
        for (stub, &address) in &expected {
            for offset in [0, 4, 15] {
                assert_eq!(
                    table.lookup(address + offset),
                    Some(stub.as_str()),
                    "{address:#x}+{offset}"
                );
            }
        }
    }

    #[test]
    fn keeps_the_arena_within_its_budget() {
        let data = Arc::new(FileData::map(&std::env::current_exe().unwrap()).unwrap());
        let file = object::File::parse(data.bytes()).unwrap();
        let whole = SymbolTable::read(&file, &data, &|| {});
        let stubs = whole
            .symbols
            .iter()
            .filter(|s| s.name & IN_ARENA != 0)
            .count();
        assert!(stubs > 10 && whole.arena.len() > 100, "{stubs} stubs");
        let bounded = SymbolTable::read_within(&file, &data, &|| {}, 100);
        assert!(bounded.arena.len() <= 100 && !bounded.symbols.is_empty());
        assert!(bounded.symbols.len() < whole.symbols.len());
    }

    /// The names come from the file's string tables, not copies: the table's heap is its
    /// entries and the PLT stubs' names, whatever the names' length.
    #[test]
    fn names_are_read_in_place_and_the_heap_is_the_entries() {
        let exe = std::env::current_exe().unwrap();
        let data = Arc::new(FileData::map(&exe).unwrap());
        let file = object::File::parse(data.bytes()).unwrap();
        let table = SymbolTable::read(&file, &data, &|| {});
        let names: usize = file
            .symbols()
            .filter(|s| s.kind() == SymbolKind::Text)
            .filter_map(|s| s.name().ok())
            .map(str::len)
            .sum();
        assert!(table.symbols.len() > 1000);
        assert!(
            table.bytes() < table.symbols.len() * 16 + table.arena.len() + 1
                && table.arena.len() * 20 < names,
            "{} bytes for {} symbols, {names} bytes of names",
            table.bytes(),
            table.symbols.len()
        );
        // And every name reads back as the symbol table has it.
        let by_address: std::collections::HashMap<u64, &str> = file
            .symbols()
            .filter(|s| s.kind() == SymbolKind::Text && s.address() != 0)
            .filter_map(|s| Some((s.address(), s.name().ok()?)))
            .collect();
        for symbol in table.symbols.iter().filter(|s| s.name & IN_ARENA == 0) {
            let name = table.name(*symbol).unwrap();
            if let Some(&expected) = by_address.get(&symbol.start) {
                // Aliases share an address; any of their names will do, but it is one.
                assert!(
                    expected == name
                        || file
                            .symbols()
                            .any(|s| s.address() == symbol.start && s.name() == Ok(name)),
                    "{:#x}: {name} / {expected}",
                    symbol.start
                );
            }
        }
    }

    /// A name whose bytes changed under the mapping (a file rewritten in place) is read
    /// again and checked: no NUL within the bound, or bytes that are not text, give no name.
    #[test]
    fn a_name_that_is_no_longer_text_is_none() {
        let mut bytes = b"\0first\0second\0".to_vec();
        let table = |bytes: Vec<u8>| SymbolTable {
            symbols: vec![FunctionSymbol {
                start: 0x1000,
                size: 16,
                name: 1,
            }],
            arena: Vec::new(),
            data: Some(Arc::new(FileData::Owned(bytes))),
        };
        assert_eq!(table(bytes.clone()).lookup(0x1004), Some("first"));
        bytes[2] = 0xff;
        assert_eq!(table(bytes.clone()).lookup(0x1004), None);
        let unterminated = [b"\0".to_vec(), vec![b'a'; MAX_NAME + 10]].concat();
        assert_eq!(table(unterminated).lookup(0x1004), None);
        assert_eq!(table(b"\0x".to_vec()).lookup(0x1004), None);
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
}
