//! One ELF image, as the runtime readers need it: a view over the loader's one parse of the
//! file (`binary::elf`), with the symbols hashed by name.

use std::{cell::OnceCell, collections::HashMap, ops::Range};

use crate::{
    arch::{relocation, Relocation},
    binary::elf::Elf,
};
use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, UnwindSection};
use object::{
    Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, RelocationFlags, RelocationTarget,
    SectionKind, SymbolKind,
};

/// Why an image could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{what} at {address:#x}: not in a section with contents")]
    NoData { what: &'static str, address: u64 },
}

/// A symbol: its ELF address and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Symbol {
    pub address: u64,
    pub size: u64,
}

/// An ELF image: its symbol tables (`.dynsym`, and `.symtab` when not stripped) by name,
/// and its sections with contents.
pub struct Image<'a> {
    /// The file's one parse, which the loader made: sections and relocations are read
    /// through it.
    file: &'a object::File<'a>,
    /// Defined function and object symbols by plain name: the readers look them up by name.
    symbols: HashMap<&'a str, Symbol>,
    /// What the dynamic loader writes at each relocated address, less the load bias: read at
    /// the first pointer asked for.
    relative: OnceCell<HashMap<u64, u64>>,
}

impl<'a> Image<'a> {
    /// The image of the parsed file `elf`.
    pub fn of(elf: &'a Elf<'a>) -> Image<'a> {
        let file = elf.object();
        let mut symbols = HashMap::new();
        for symbol in file.dynamic_symbols().chain(file.symbols()) {
            if symbol.is_undefined()
                || !matches!(symbol.kind(), SymbolKind::Text | SymbolKind::Data)
            {
                continue;
            }
            if let Ok(name) = symbol.name() {
                // A versioned name (`f@@V`) is its plain name here.
                let name = name.split('@').next().unwrap_or(name);
                symbols.entry(name).or_insert(Symbol {
                    address: symbol.address(),
                    size: symbol.size(),
                });
            }
        }
        Image {
            file,
            symbols,
            relative: OnceCell::new(),
        }
    }

    /// The machine the file's code is for.
    pub fn architecture(&self) -> object::Architecture {
        use object::Object;
        self.file.architecture()
    }

    pub fn symbol(&self, name: &str) -> Option<Symbol> {
        self.symbols.get(name).copied()
    }

    /// The defined function and object symbols, for telling named code from unnamed.
    pub fn symbols(&self) -> impl Iterator<Item = (&'a str, Symbol)> + '_ {
        self.symbols.iter().map(|(&name, &symbol)| (name, symbol))
    }

    /// The bytes from ELF address `address` to the end of the section that holds it (never
    /// `.bss`, which has none in the file).
    fn rest_at(&self, what: &'static str, address: u64) -> Result<&'a [u8], ImageError> {
        let missing = || ImageError::NoData { what, address };
        let section = self
            .file
            .sections()
            .find(|s| {
                s.kind() != SectionKind::UninitializedData
                    && address >= s.address()
                    && address - s.address() < s.size()
            })
            .ok_or_else(missing)?;
        let data = section.data().map_err(|_| missing())?;
        let start = usize::try_from(address - section.address()).map_err(|_| missing())?;
        data.get(start..).ok_or_else(missing)
    }

    /// `len` bytes at ELF address `address`.
    pub fn bytes_at(
        &self,
        what: &'static str,
        address: u64,
        len: u64,
    ) -> Result<&'a [u8], ImageError> {
        let rest = self.rest_at(what, address)?;
        usize::try_from(len)
            .ok()
            .and_then(|len| rest.get(..len))
            .ok_or(ImageError::NoData { what, address })
    }

    /// A little-endian u64 at `address`.
    pub fn u64_at(&self, what: &'static str, address: u64) -> Result<u64, ImageError> {
        let bytes = self.bytes_at(what, address, 8)?;
        Ok(u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
    }

    /// The pointer stored at `address`, as the loader leaves it less the load bias: a
    /// position-independent file keeps it in a relocation, not in the data. A relative one, or
    /// one to a symbol this file defines (a library's GOT slot for its own exported global),
    /// taken as bound to this file's definition: another object interposing it is not seen.
    pub fn pointer_at(&self, what: &'static str, address: u64) -> Result<u64, ImageError> {
        let relocated = self.relative.get_or_init(|| {
            let symbols = self.file.dynamic_symbol_table();
            let architecture = self.file.architecture();
            self.file
                .dynamic_relocations()
                .into_iter()
                .flatten()
                .filter_map(|(at, r)| {
                    let RelocationFlags::Elf { r_type } = r.flags() else {
                        return None;
                    };
                    match (relocation(architecture, r_type)?, r.target()) {
                        (Relocation::Relative, _) => Some((at, r.addend() as u64)),
                        (
                            Relocation::GlobalData | Relocation::Absolute,
                            RelocationTarget::Symbol(index),
                        ) => {
                            let symbol = symbols.as_ref()?.symbol_by_index(index).ok()?;
                            (!symbol.is_undefined())
                                .then(|| (at, symbol.address().wrapping_add(r.addend() as u64)))
                        }
                        _ => None,
                    }
                })
                .collect()
        });
        match relocated.get(&address) {
            Some(&target) => Ok(target),
            None => self.u64_at(what, address),
        }
    }

    /// A little-endian i32 at `address`.
    pub fn i32_at(&self, what: &'static str, address: u64) -> Result<i32, ImageError> {
        let bytes = self.bytes_at(what, address, 4)?;
        Ok(i32::from_le_bytes(bytes.try_into().expect("4 bytes")))
    }

    /// A little-endian i32 at `address`, or 0 where `address` is in a zero-filled section
    /// (`.bss`): a constant whose value is 0 is placed there and has no bytes in the file.
    pub fn i32_or_zero_at(&self, what: &'static str, address: u64) -> Result<i32, ImageError> {
        let zero_filled = self.file.sections().any(|s| {
            s.kind() == SectionKind::UninitializedData
                && address >= s.address()
                && address - s.address() < s.size()
                && s.size() - (address - s.address()) >= 4
        });
        if zero_filled {
            return Ok(0);
        }
        self.i32_at(what, address)
    }

    /// A NUL-terminated string of at most `max` bytes at `address`.
    pub fn c_str_at(
        &self,
        what: &'static str,
        address: u64,
        max: usize,
    ) -> Result<&'a [u8], ImageError> {
        let rest = self.rest_at(what, address)?;
        let rest = &rest[..rest.len().min(max)];
        Ok(rest.split(|&b| b == 0).next().unwrap_or(rest))
    }

    /// Whether `range` lies within one section of code.
    pub fn is_code(&self, range: Range<u64>) -> bool {
        range.start < range.end
            && self.file.sections().any(|s| {
                s.kind() == SectionKind::Text
                    && range.start >= s.address()
                    && range.end <= s.address().saturating_add(s.size())
            })
    }

    /// The contents of each section of read-only data (`.rodata` and its kin), for tables
    /// found by their shape rather than by a symbol.
    pub fn read_only_data(&self) -> impl Iterator<Item = &'a [u8]> + '_ {
        self.file
            .sections()
            .filter(|s| s.kind() == SectionKind::ReadOnlyData)
            .filter_map(|s| s.data().ok())
    }

    /// The code of the function `symbol`.
    pub fn code(&self, what: &'static str, symbol: Symbol) -> Result<&'a [u8], ImageError> {
        self.bytes_at(what, symbol.address, symbol.size)
    }

    /// The address ranges the `.eh_frame` FDEs describe, sorted; empty without one.
    pub fn fde_ranges(&self) -> Vec<Range<u64>> {
        let Some(section) = self.file.section_by_name(".eh_frame") else {
            return Vec::new();
        };
        let Ok(data) = section.data() else {
            return Vec::new();
        };
        let eh_frame = EhFrame::new(data, LittleEndian);
        let mut bases = BaseAddresses::default().set_eh_frame(section.address());
        if let Some(text) = self.file.section_by_name(".text") {
            bases = bases.set_text(text.address());
        }
        if let Some(hdr) = self.file.section_by_name(".eh_frame_hdr") {
            bases = bases.set_eh_frame_hdr(hdr.address());
        }
        let mut ranges = Vec::new();
        let mut entries = eh_frame.entries(&bases);
        // A malformed entry ends the list: what came before it stands.
        while let Ok(Some(entry)) = entries.next() {
            if let CieOrFde::Fde(partial) = entry {
                if let Ok(fde) =
                    partial.parse(|section, bases, offset| section.cie_from_offset(bases, offset))
                {
                    let start = fde.initial_address();
                    ranges.push(start..start.saturating_add(fde.len()));
                }
            }
        }
        ranges.sort_by_key(|r| r.start);
        ranges
    }
}

/// A relocatable x86-64 ELF whose `.text` holds each function's code, one after another.
#[cfg(test)]
pub(crate) fn test_elf(functions: &[(&str, &[u8])]) -> Vec<u8> {
    use object::write::{Object as Writer, Symbol as WriterSymbol, SymbolSection};
    use object::{Architecture, BinaryFormat, Endianness, SymbolFlags, SymbolScope};
    let mut writer = Writer::new(BinaryFormat::Elf, Architecture::X86_64, Endianness::Little);
    let text = writer.section_id(object::write::StandardSection::Text);
    for (name, code) in functions {
        let offset = writer.append_section_data(text, code, 1);
        writer.add_symbol(WriterSymbol {
            name: name.as_bytes().to_vec(),
            value: offset,
            size: code.len() as u64,
            kind: SymbolKind::Text,
            scope: SymbolScope::Dynamic,
            weak: false,
            section: SymbolSection::Section(text),
            flags: SymbolFlags::None,
        });
    }
    writer.write().expect("a test ELF")
}

#[cfg(test)]
mod tests {

    /// The pre-filters pass what the readers recognise on this machine (Debian 12's own
    /// interpreter and glibc) and turn away binaries that are neither, whose symbols define
    /// or import what a careless check would match.
    #[test]
    fn only_interpreters_and_glibc_pass_the_pre_filters() {
        let read = |path: &str| std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let passes = |bytes: &[u8]| {
            object::File::parse(bytes).is_ok_and(|elf| {
                let python = crate::runtimes::python::may_be(&elf);
                let libc = crate::runtimes::libc::may_be(&elf);
                assert!(!(python && libc));
                python || libc
            })
        };
        let python = read("/usr/bin/python3.11");
        assert!(
            object::File::parse(&*python).is_ok_and(|elf| crate::runtimes::python::may_be(&elf))
        );
        let libc = read("/usr/lib/x86_64-linux-gnu/libc.so.6");
        assert!(object::File::parse(&*libc).is_ok_and(|elf| crate::runtimes::libc::may_be(&elf)));
        // libstdc++ imports pthread_getspecific; bash defines neither.
        assert!(!passes(&read("/usr/lib/x86_64-linux-gnu/libstdc++.so.6")));
        assert!(!passes(&read("/usr/bin/bash")));
        assert!(!passes(b"\x7fELF not really"));
    }
}
