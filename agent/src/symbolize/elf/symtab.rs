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

impl SymbolTable {
    /// The text symbols of `file`. `release_pages` is called every [`RELEASE_EVERY`] symbols:
    /// reading a large Rust binary's table touches tens of MiB of `.symtab` and `.strtab`,
    /// which count as this process's memory until let go.
    pub(super) fn read(file: &object::File<'_>, release_pages: &dyn Fn()) -> Self {
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
