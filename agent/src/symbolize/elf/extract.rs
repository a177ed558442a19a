//! An ELF file reduced to what a symboliser reads, as `objcopy --only-keep-debug` does: what a
//! server that names frames needs of a binary. The result is streamed to any writer, one
//! section at a time, so nothing the size of a section (debug sections run to hundreds of MB)
//! is copied onto the heap.

use std::{
    collections::HashSet,
    io::{self, Write},
    path::{Path, PathBuf},
};

use object::{
    elf,
    read::elf::{ProgramHeader as _, SectionHeader as _},
    write::{
        elf::{FileHeader, ProgramHeader, SectionHeader, Writer},
        StreamingBuffer,
    },
    Endianness, FileKind,
};

#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
    #[error("{path}: not an ELF file")]
    NotElf { path: PathBuf },
    #[error("{path}: malformed ELF: {source}")]
    Malformed {
        path: PathBuf,
        source: object::read::Error,
    },
    #[error("{path}: nothing to upload: no .debug_info, .symtab or .dynsym")]
    NoSymbols { path: PathBuf },
    #[error("{path}: writing its debug sections: {source}")]
    Write {
        path: PathBuf,
        source: object::write::Error,
    },
    /// The writer's own I/O (a full disk, most likely): nothing wrong with the input.
    #[error("{path}: writing its debug-only copy: {source}")]
    Output { path: PathBuf, source: io::Error },
}

fn is_debug_name(name: &[u8]) -> bool {
    name.starts_with(b".debug_") || name.starts_with(b".zdebug_")
}

/// `elf` reduced to what a symboliser reads, as `objcopy --only-keep-debug` does: the same
/// header and program headers (the program headers as they are, offsets included: with the
/// mapping's offset they turn a sampled address into an ELF address), every section header in
/// its place (so the section indices in symbols and links stay right), but contents only for
/// DWARF, symbol and string tables, notes (the build id), `.gnu_debuglink` and
/// `.gnu_debugdata`; every other section is kept as `SHT_NOBITS` with its address and size.
/// `path` only names the file in errors.
///
/// An I/O error of `out` is [`ExtractError::Output`].
pub fn write_debug<W: Write>(elf: &[u8], path: &Path, out: W) -> Result<W, ExtractError> {
    match FileKind::parse(elf) {
        Ok(FileKind::Elf32) => extract::<elf::FileHeader32<Endianness>, W>(elf, path, out),
        Ok(FileKind::Elf64) => extract::<elf::FileHeader64<Endianness>, W>(elf, path, out),
        _ => Err(ExtractError::NotElf {
            path: path.to_owned(),
        }),
    }
}

fn extract<Elf, W>(data: &[u8], path: &Path, out: W) -> Result<W, ExtractError>
where
    Elf: object::read::elf::FileHeader<Endian = Endianness>,
    W: Write,
{
    let malformed = |source| ExtractError::Malformed {
        path: path.to_owned(),
        source,
    };
    let header = Elf::parse(data).map_err(malformed)?;
    let endian = header.endian().map_err(malformed)?;
    let segments = header.program_headers(endian, data).map_err(malformed)?;
    let sections = header.sections(endian, data).map_err(malformed)?;
    let shstrndx = header.shstrndx(endian, data).map_err(malformed)? as usize;

    // String tables are kept when a kept symbol table names its strings there.
    let mut linked_strings = HashSet::new();
    let mut has_symbols = false;
    for section in sections.iter() {
        let kind = section.sh_type(endian);
        if matches!(kind, elf::SHT_SYMTAB | elf::SHT_DYNSYM) {
            linked_strings.insert(section.sh_link(endian) as usize);
        }
        let name = sections.section_name(endian, section).unwrap_or_default();
        let has_contents = kind != elf::SHT_NOBITS && section.sh_size(endian).into() > 0;
        if has_contents
            && (matches!(kind, elf::SHT_SYMTAB | elf::SHT_DYNSYM)
                || name == b".debug_info"
                || name == b".zdebug_info")
        {
            has_symbols = true;
        }
    }
    if !has_symbols {
        return Err(ExtractError::NoSymbols {
            path: path.to_owned(),
        });
    }

    /// One input section and where its contents go, if they are kept.
    struct Planned<'a> {
        header: SectionHeader,
        contents: Option<&'a [u8]>,
    }

    let mut out = StreamingBuffer::new(out);
    let mut writer = Writer::new(endian, header.is_type_64(), &mut out);
    writer.reserve_file_header();
    writer.reserve_program_headers(segments.len() as u32);
    // Pass 1: the same section indices, in order, and a place for every kept section's bytes.
    let mut planned: Vec<Option<Planned>> = Vec::with_capacity(sections.len());
    for (index, section) in sections.iter().enumerate().skip(1) {
        if index == shstrndx {
            writer.reserve_shstrtab_section_index();
            planned.push(None);
            continue;
        }
        let name = sections.section_name(endian, section).map_err(malformed)?;
        let kind = section.sh_type(endian);
        let keep = kind != elf::SHT_NOBITS
            && (is_debug_name(name)
                || matches!(
                    kind,
                    elf::SHT_SYMTAB | elf::SHT_DYNSYM | elf::SHT_SYMTAB_SHNDX | elf::SHT_NOTE
                )
                || (kind == elf::SHT_STRTAB && linked_strings.contains(&index))
                || name == b".gnu_debuglink"
                || name == b".gnu_debugdata");
        let contents = if keep {
            Some(section.data(endian, data).map_err(malformed)?)
        } else {
            None
        };
        let name = writer.add_section_name(name);
        writer.reserve_section_index();
        let align = section.sh_addralign(endian).into();
        let offset = match contents {
            Some(bytes) => {
                let align = if align.is_power_of_two() { align } else { 1 };
                writer.reserve(bytes.len(), align as usize)
            }
            None => writer.reserved_len(),
        };
        planned.push(Some(Planned {
            header: SectionHeader {
                name: Some(name),
                sh_type: if keep { kind } else { elf::SHT_NOBITS },
                sh_flags: section.sh_flags(endian).into(),
                sh_addr: section.sh_addr(endian).into(),
                sh_offset: offset as u64,
                sh_size: section.sh_size(endian).into(),
                sh_link: section.sh_link(endian),
                sh_info: section.sh_info(endian),
                sh_addralign: align,
                sh_entsize: section.sh_entsize(endian).into(),
            },
            contents,
        }));
    }
    writer.reserve_shstrtab();
    writer.reserve_section_headers();

    // Pass 2: the bytes, in the order reserved.
    let ident = header.e_ident();
    writer
        .write_file_header(&FileHeader {
            os_abi: ident.os_abi,
            abi_version: ident.abi_version,
            e_type: header.e_type(endian),
            e_machine: header.e_machine(endian),
            e_entry: header.e_entry(endian).into(),
            e_flags: header.e_flags(endian),
        })
        .map_err(|source| ExtractError::Write {
            path: path.to_owned(),
            source,
        })?;
    writer.write_align_program_headers();
    for segment in segments {
        writer.write_program_header(&ProgramHeader {
            p_type: segment.p_type(endian),
            p_flags: segment.p_flags(endian),
            p_offset: segment.p_offset(endian).into(),
            p_vaddr: segment.p_vaddr(endian).into(),
            p_paddr: segment.p_paddr(endian).into(),
            p_filesz: segment.p_filesz(endian).into(),
            p_memsz: segment.p_memsz(endian).into(),
            p_align: segment.p_align(endian).into(),
        });
    }
    for section in planned.iter().flatten() {
        if let Some(bytes) = section.contents {
            writer.pad_until(section.header.sh_offset as usize);
            writer.write(bytes);
        }
    }
    writer.write_shstrtab();
    writer.write_null_section_header();
    for section in &planned {
        match section {
            Some(section) => writer.write_section_header(&section.header),
            None => writer.write_shstrtab_section_header(),
        }
    }
    // The writer cannot report a failed write (a full disk) as it goes; the buffer keeps the
    // first one, and writes nothing after it.
    out.result().map_err(|source| ExtractError::Output {
        path: path.to_owned(),
        source,
    })?;
    Ok(out.into_inner())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use object::{Object as _, ObjectSection as _, ObjectSymbol as _, SectionKind};
    use std::process::Command;

    /// A C program with DWARF and a `.text` inflated by a megabyte of padding in one function,
    /// built with gcc into `dir`.
    pub(crate) fn build_program(dir: &Path) -> PathBuf {
        let source = dir.join("prog.c");
        std::fs::write(
            &source,
            "#include <stdio.h>\n\
             __attribute__((noinline)) int known_function(int x) {\n\
             \x20   return x * 3 + 1;\n\
             }\n\
             __attribute__((noinline)) void padding(void) {\n\
             \x20   __asm__ volatile(\".fill 1048576, 1, 0x90\");\n\
             }\n\
             int main(int argc, char **argv) {\n\
             \x20   (void)argv;\n\
             \x20   padding();\n\
             \x20   printf(\"%d\\n\", known_function(argc));\n\
             \x20   return 0;\n\
             }\n",
        )
        .unwrap();
        let binary = dir.join("prog");
        let status = Command::new("gcc")
            .args(["-g", "-O1", "-Wl,--build-id", "-o"])
            .arg(&binary)
            .arg(&source)
            .status()
            .expect("gcc is installed");
        assert!(status.success());
        binary
    }

    fn addr2line(file: &Path, address: u64) -> String {
        let output = Command::new("addr2line")
            .args(["-f", "-e"])
            .arg(file)
            .arg(format!("{address:#x}"))
            .output()
            .expect("addr2line (binutils) is installed");
        assert!(output.status.success());
        String::from_utf8(output.stdout).unwrap()
    }

    #[test]
    fn keeps_only_what_a_symboliser_reads() {
        let dir = tempfile::tempdir().unwrap();
        let binary = build_program(dir.path());
        let original = std::fs::read(&binary).unwrap();
        let extracted = write_debug(&original, &binary, Vec::new()).unwrap();
        let before = object::File::parse(&original[..]).unwrap();
        let after = object::File::parse(&extracted[..]).unwrap();

        assert_eq!(after.build_id().unwrap(), before.build_id().unwrap());
        assert!(before.build_id().unwrap().is_some());
        assert_eq!(after.architecture(), before.architecture());
        assert_eq!(after.entry(), before.entry());
        let section = |file: &object::File<'_>, name: &str| {
            file.section_by_name(name)
                .unwrap_or_else(|| panic!("no {name}"))
                .data()
                .unwrap()
                .to_vec()
        };
        for name in [
            ".debug_info",
            ".debug_line",
            ".debug_abbrev",
            ".symtab",
            ".strtab",
        ] {
            assert_eq!(section(&after, name), section(&before, name), "{name}");
        }
        // Every section header in its place, the code ones without their bytes.
        let headers = |file: &object::File<'_>| -> Vec<(String, u64, u64)> {
            file.sections()
                .map(|s| (s.name().unwrap().to_owned(), s.address(), s.size()))
                .collect()
        };
        assert_eq!(headers(&after), headers(&before));
        let text = after.section_by_name(".text").unwrap();
        assert_eq!(text.kind(), SectionKind::UninitializedData);
        assert_eq!(
            text.address(),
            before.section_by_name(".text").unwrap().address()
        );
        assert!(
            text.size() > 1 << 20,
            ".text of {} bytes is not the padded one",
            text.size()
        );
        // The symbols, with their sections, as they were.
        let symbols = |file: &object::File<'_>| -> Vec<(String, u64, u64, object::SymbolSection)> {
            file.symbols()
                .map(|s| {
                    (
                        s.name().unwrap().to_owned(),
                        s.address(),
                        s.size(),
                        s.section(),
                    )
                })
                .collect()
        };
        assert!(symbols(&before).len() > 10);
        assert_eq!(symbols(&after), symbols(&before));
        // Program headers unchanged, offsets included.
        let segments = |file: &object::File<'_>| -> Vec<(u64, u64, (u64, u64))> {
            use object::ObjectSegment as _;
            file.segments()
                .map(|s| (s.address(), s.size(), s.file_range()))
                .collect()
        };
        assert_eq!(segments(&after), segments(&before));
        assert!(
            extracted.len() * 4 < original.len(),
            "{} bytes extracted from {}",
            extracted.len(),
            original.len()
        );

        // binutils names a function and its line the same from either file.
        std::fs::write(dir.path().join("prog.debug"), &extracted).unwrap();
        let known = before
            .symbols()
            .find(|s| s.name() == Ok("known_function"))
            .unwrap()
            .address();
        let from_binary = addr2line(&binary, known);
        assert!(from_binary.starts_with("known_function\n"), "{from_binary}");
        assert!(from_binary.contains("prog.c:"), "{from_binary}");
        assert_eq!(
            addr2line(&dir.path().join("prog.debug"), known),
            from_binary
        );
    }

    #[test]
    fn a_file_without_symbols_has_nothing_to_upload() {
        let dir = tempfile::tempdir().unwrap();
        let binary = build_program(dir.path());
        let status = Command::new("strip")
            .args(["--strip-all", "--remove-section=.dynsym"])
            .arg(&binary)
            .status()
            .unwrap();
        // strip refuses to drop .dynsym of a dynamic binary: then strip a copy of the object
        // file instead, which has no .dynsym to begin with.
        let stripped = if status.success() {
            binary
        } else {
            let object = dir.path().join("prog.o");
            assert!(Command::new("gcc")
                .args(["-c", "-o"])
                .arg(&object)
                .arg(dir.path().join("prog.c"))
                .status()
                .unwrap()
                .success());
            assert!(Command::new("strip")
                .arg("--strip-all")
                .arg(&object)
                .status()
                .unwrap()
                .success());
            object
        };
        let data = std::fs::read(&stripped).unwrap();
        let err = write_debug(&data, &stripped, Vec::new())
            .unwrap_err()
            .to_string();
        assert!(err.contains("nothing to upload"), "{err}");
        assert!(err.contains(&stripped.display().to_string()), "{err}");
        let err = write_debug(b"#!/bin/sh\n", Path::new("/bin/script"), Vec::new())
            .unwrap_err()
            .to_string();
        assert_eq!(err, "/bin/script: not an ELF file");
    }

    /// A writer that takes `room` bytes, then fails as a full disk does.
    #[derive(Debug)]
    struct FullDisk {
        room: usize,
    }

    impl Write for FullDisk {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.room == 0 {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            let taken = buf.len().min(self.room);
            self.room -= taken;
            Ok(taken)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_full_disk_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let binary = build_program(dir.path());
        let original = std::fs::read(&binary).unwrap();
        let whole = write_debug(&original, &binary, Vec::new()).unwrap().len();
        // Full in the headers, in a section's bytes, and one byte before the end.
        for room in [0, 100, whole / 2, whole - 1] {
            let err = write_debug(&original, &binary, FullDisk { room })
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with(&format!("{}: writing", binary.display())),
                "{err}"
            );
            assert!(err.contains("No space left on device"), "{err}");
        }
        assert!(write_debug(&original, &binary, FullDisk { room: whole }).is_ok());
    }
}
