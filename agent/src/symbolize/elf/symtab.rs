//! An ELF file's function symbols (`.symtab`, `.dynsym`): the names a frame falls back to when
//! DWARF has none, kept compact (one arena of names) because every cached file holds them.

use std::borrow::Cow;

use object::{Object, ObjectSymbol, SymbolKind};

/// A function symbol: start, size (0 when the table does not say), name in the arena.
#[derive(Debug, Clone, Copy)]
pub(super) struct FunctionSymbol {
    pub(super) start: u64,
    pub(super) size: u64,
    name_offset: u32,
    name_len: u32,
}

/// Function symbols from `.symtab` and `.dynsym`, sorted by address.
#[derive(Debug, Default)]
pub(super) struct SymbolTable {
    symbols: Vec<FunctionSymbol>,
    arena: String,
}

/// Symbols read between two releases of the mapped pages the reading touched (about 2 MiB of
/// table and names for a Rust binary).
const RELEASE_EVERY: usize = 16 << 10;

/// Bytes of names one file's table keeps at most. Each symbol's name is copied into the
/// arena, and a crafted file can point any number of symbols (or PLT stubs) at one long
/// string; this bounds what such a file costs. The largest real tables (a browser's
/// `.strtab`) are a few hundred MB of mostly non-text names.
const MAX_NAME_BYTES: usize = 256 << 20;

impl SymbolTable {
    /// The text symbols of `file`. `release_pages` is called every [`RELEASE_EVERY`] symbols:
    /// reading a large Rust binary's table touches tens of MiB of `.symtab` and `.strtab`,
    /// which count as this process's memory until let go.
    pub(super) fn read(file: &object::File<'_>, release_pages: &dyn Fn()) -> Self {
        Self::read_within(file, release_pages, MAX_NAME_BYTES)
    }

    /// [`SymbolTable::read`] keeping at most `name_budget` bytes of names: the symbols past it
    /// are left out, as if the table ended there.
    fn read_within(file: &object::File<'_>, release_pages: &dyn Fn(), name_budget: usize) -> Self {
        let mut table = SymbolTable::default();
        // .symtab is the full table; .dynsym survives `strip` and names exported functions.
        for (i, symbol) in file.symbols().chain(file.dynamic_symbols()).enumerate() {
            if i % RELEASE_EVERY == RELEASE_EVERY - 1 {
                release_pages();
            }
            if symbol.kind() != SymbolKind::Text || symbol.address() == 0 {
                continue;
            }
            let Ok(name) = symbol.name() else { continue };
            if !name.is_empty() && !table.push(symbol.address(), symbol.size(), name, name_budget) {
                break;
            }
        }
        for (start, size, name) in crate::arch::plt_stubs(file) {
            if !table.push(start, size, &name, name_budget) {
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

    /// Adds a symbol, unless its name would take the arena past `name_budget` bytes.
    fn push(&mut self, start: u64, size: u64, name: &str, name_budget: usize) -> bool {
        let Some(end) = self.arena.len().checked_add(name.len()) else {
            return false;
        };
        if end > name_budget || end > u32::MAX as usize {
            return false;
        }
        self.symbols.push(FunctionSymbol {
            start,
            size,
            name_offset: self.arena.len() as u32,
            name_len: name.len() as u32,
        });
        self.arena.push_str(name);
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
        if symbol.size != 0 && address >= symbol.start.saturating_add(symbol.size) {
            return None;
        }
        let start = symbol.name_offset as usize;
        self.arena.get(start..start + symbol.name_len as usize)
    }

    pub(super) fn bytes(&self) -> usize {
        self.symbols.len() * std::mem::size_of::<FunctionSymbol>() + self.arena.len()
    }

    /// The symbols, by address: for the fuzzer and tests, which pick addresses from them.
    pub(super) fn functions(&self) -> &[FunctionSymbol] {
        &self.symbols
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `name@plt` -> address, as `objdump -d` labels the stubs of `binary`.
    fn objdump_plt(binary: &std::path::Path) -> std::collections::HashMap<String, u64> {
        let output = std::process::Command::new("objdump")
            .arg("-d")
            .arg(binary)
            .output()
            .unwrap();
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
            let data = std::fs::read(&binary).unwrap();
            let file = object::File::parse(&*data).unwrap();
            let table = SymbolTable::read(&file, &|| {});
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
    fn keeps_names_within_the_budget() {
        let data = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let whole = SymbolTable::read(&file, &|| {});
        assert!(whole.arena.len() > 10_000);
        let bounded = SymbolTable::read_within(&file, &|| {}, 10_000);
        assert!(bounded.arena.len() <= 10_000 && !bounded.symbols.is_empty());
        assert!(bounded.symbols.len() < whole.symbols.len());
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
