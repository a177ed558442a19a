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
    #[error("{path}: nothing to upload: no .debug_info, .symtab, .dynsym or .gopclntab")]
    NoSymbols { path: PathBuf },
    #[error("{path}: writing its debug sections: {source}")]
    Write {
        path: PathBuf,
        source: object::write::Error,
    },
    /// The writer's own I/O (a full disk, most likely): nothing wrong with the input.
    #[error("{path}: writing its debug-only copy: {source}")]
    Output { path: PathBuf, source: io::Error },
    #[error(
        "{path}: section {index} ({name}) asks for a {align}-byte alignment, above the \
         {MAX_SECTION_ALIGN} bytes a kept section may have"
    )]
    Alignment {
        path: PathBuf,
        index: usize,
        name: String,
        align: u64,
    },
    #[error(
        "{path}: its debug-only copy would hold over {limit} bytes of section contents and \
         padding, more than the {input}-byte file itself plus {MAX_PADDING} bytes: section \
         headers overlap or repeat the same bytes"
    )]
    TooLarge {
        path: PathBuf,
        input: usize,
        limit: usize,
    },
}

/// The largest `sh_addralign` of a section whose contents are kept. Nothing maps these
/// sections, so they never need more than the 8 bytes symbol tables and notes ask for; a page
/// is already generous. Unbounded, an alignment of 2^62 is padding without end.
pub const MAX_SECTION_ALIGN: u64 = 4096;

/// The alignment padding a copy may add on top of the input's own size. A file's sections do
/// not overlap, so their contents fit in the file; only padding can make the copy bigger, and a
/// real file's kept sections need a few hundred bytes of it. Without this bound, section
/// headers that all point at the same bytes would multiply the file.
pub const MAX_PADDING: usize = 64 << 10;

fn is_debug_name(name: &[u8]) -> bool {
    name.starts_with(b".debug_") || name.starts_with(b".zdebug_")
}

/// `elf` reduced to what a symboliser reads, as `objcopy --only-keep-debug` does: the same
/// header and program headers (the program headers as they are, offsets included: with the
/// mapping's offset they turn a sampled address into an ELF address), every section header in
/// its place (so the section indices in symbols and links stay right), but contents only for
/// DWARF, symbol and string tables, notes (the build id), `.gnu_debuglink`, `.gnu_debugdata`
/// and a Go binary's `.gopclntab`; every other section is kept as `SHT_NOBITS` with its
/// address and size. `path` only names the file in errors.
///
/// An I/O error of `out` is [`ExtractError::Output`]. A kept section aligned beyond
/// [`MAX_SECTION_ALIGN`], or contents and padding adding up to more than the input plus
/// [`MAX_PADDING`], is refused before anything is written: the copy is never much larger
/// than the input, whatever the input says.
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
                || name == b".zdebug_info"
                || name == b".gopclntab")
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
    let contents_start = writer.reserved_len();
    let contents_limit = data.len().saturating_add(MAX_PADDING);
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
                || name == b".gnu_debugdata"
                // What a server names a stripped Go binary from.
                || name == b".gopclntab");
        let contents = if keep {
            Some(section.data(endian, data).map_err(malformed)?)
        } else {
            None
        };
        let name_id = writer.add_section_name(name);
        writer.reserve_section_index();
        let align = section.sh_addralign(endian).into();
        let offset = match contents {
            Some(bytes) => {
                if align > MAX_SECTION_ALIGN {
                    return Err(ExtractError::Alignment {
                        path: path.to_owned(),
                        index,
                        name: String::from_utf8_lossy(name).into_owned(),
                        align,
                    });
                }
                let align = if align.is_power_of_two() { align } else { 1 };
                let offset = writer.reserve(bytes.len(), align as usize);
                if writer.reserved_len() - contents_start > contents_limit {
                    return Err(ExtractError::TooLarge {
                        path: path.to_owned(),
                        input: data.len(),
                        limit: contents_limit,
                    });
                }
                offset
            }
            None => writer.reserved_len(),
        };
        planned.push(Some(Planned {
            header: SectionHeader {
                name: Some(name_id),
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

/// A writer that counts what it is given and fails, as a full disk does, past `room` bytes.
struct BoundedSink {
    room: usize,
    written: usize,
}

impl Write for BoundedSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.written + buf.len() > self.room {
            return Err(io::Error::other(format!(
                "more than the {} bytes allowed",
                self.room
            )));
        }
        self.written += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reduces arbitrary bytes with [`write_debug`] into a sink that holds only as much as the
/// copy of a file that size may take: the input again for section contents, program headers,
/// section headers and section names each (all of them are read from the input), plus
/// [`MAX_PADDING`] and the file header. Must never panic, and a copy that outgrows the sink
/// (or padding without end, which the fuzzer reports as a timeout) is a bug: `fuzz/` calls it
/// with corrupt input and `agent/tests/fuzz-regressions/extract/` keeps what it found.
pub fn fuzz_one(data: &[u8]) {
    let room = data
        .len()
        .saturating_mul(4)
        .saturating_add(MAX_PADDING + 256);
    let sink = BoundedSink { room, written: 0 };
    match write_debug(data, Path::new("fuzz"), sink) {
        Ok(sink) => assert!(sink.written <= room),
        Err(ExtractError::Output { source, .. }) => {
            panic!("the copy of a {}-byte input: {source}", data.len())
        }
        Err(_) => {}
    }
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
    fn a_stripped_go_binary_keeps_its_function_table() {
        // The fuzz seed: `go build -ldflags="-s -w"`, so no symbol table and no DWARF; a
        // server names it from `.gopclntab` alone.
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/gopclntab/go1.19-stripped");
        let original = std::fs::read(&path).unwrap();
        let extracted = write_debug(&original, &path, Vec::new()).unwrap();
        let before = object::File::parse(&original[..]).unwrap();
        let after = object::File::parse(&extracted[..]).unwrap();
        let table = |file: &object::File<'_>| {
            file.section_by_name(".gopclntab")
                .expect("a .gopclntab")
                .data()
                .unwrap()
                .to_vec()
        };
        assert!(!table(&before).is_empty());
        assert_eq!(table(&after), table(&before));
        assert!(extracted.len() < original.len() / 2, "{}", extracted.len());
        // And it names the program's function, as the binary itself does.
        let named = |bytes: &[u8]| {
            let file = object::File::parse(bytes).unwrap();
            let table = crate::binary::gopclntab::Pclntab::find(&file, bytes)
                .unwrap()
                .expect("the table is found");
            let work = table
                .funcs(bytes)
                .filter_map(Result::ok)
                .find(|f| f.name == "main.work")
                .expect("main.work")
                .entry;
            table.frames(bytes, work + 4).unwrap()[0].function.clone()
        };
        assert_eq!(named(&extracted), "main.work");
        assert_eq!(named(&original), "main.work");
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

    /// A relocatable ELF64 file with a symbol table and a `.debug_info` and `.debug_str` of
    /// `debug_bytes` each, and where each of their section headers is (its byte offset).
    fn small_elf(debug_bytes: usize) -> (Vec<u8>, Vec<usize>) {
        use object::write::{Object, Symbol, SymbolSection};
        let mut file = Object::new(
            object::BinaryFormat::Elf,
            object::Architecture::X86_64,
            object::Endianness::Little,
        );
        let text = file.add_section(Vec::new(), b".text".to_vec(), SectionKind::Text);
        file.append_section_data(text, &[0xc3; 16], 16);
        file.add_symbol(Symbol {
            name: b"f".to_vec(),
            value: 0,
            size: 16,
            kind: object::SymbolKind::Text,
            scope: object::SymbolScope::Linkage,
            weak: false,
            section: SymbolSection::Section(text),
            flags: object::SymbolFlags::None,
        });
        for name in [".debug_info", ".debug_str"] {
            let id = file.add_section(Vec::new(), name.into(), SectionKind::Debug);
            file.append_section_data(id, &vec![0x5a; debug_bytes], 1);
        }
        let data = file.write().unwrap();
        let parsed = object::read::elf::ElfFile64::<Endianness>::parse(&data[..]).unwrap();
        let shoff = parsed.elf_header().e_shoff.get(Endianness::Little) as usize;
        let headers = [".debug_info", ".debug_str"]
            .iter()
            .map(|name| shoff + parsed.section_by_name(name).unwrap().index().0 * 64)
            .collect();
        (data, headers)
    }

    /// Overwrites a little-endian u64 field of an ELF64 section header.
    fn patch(data: &mut [u8], at: usize, value: u64) {
        data[at..at + 8].copy_from_slice(&value.to_le_bytes());
    }

    /// Where `sh_offset`, `sh_size` and `sh_addralign` sit in an ELF64 section header.
    const SH_OFFSET: usize = 24;
    const SH_SIZE: usize = 32;
    const SH_ADDRALIGN: usize = 48;

    #[test]
    fn an_alignment_above_a_page_is_refused() {
        let (mut data, headers) = small_elf(100);
        let path = Path::new("/x/aligned");
        assert!(write_debug(&data, path, Vec::new()).is_ok());
        patch(&mut data, headers[0] + SH_ADDRALIGN, MAX_SECTION_ALIGN);
        assert!(write_debug(&data, path, Vec::new()).is_ok());
        // 2^62: the padding alone would be 4 EiB, written 1 KiB at a time.
        patch(&mut data, headers[0] + SH_ADDRALIGN, 1 << 62);
        let err = write_debug(&data, path, Vec::new()).unwrap_err();
        assert!(
            matches!(err, ExtractError::Alignment { align, .. } if align == 1 << 62),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "/x/aligned: section 2 (.debug_info) asks for a 4611686018427387904-byte \
             alignment, above the 4096 bytes a kept section may have"
        );
    }

    #[test]
    fn section_headers_repeating_the_same_bytes_are_refused() {
        let (mut data, headers) = small_elf(40 << 10);
        let path = Path::new("/x/aliased");
        let whole = write_debug(&data, path, Vec::new()).unwrap();
        assert!(
            whole.len() < data.len(),
            "{} from {}",
            whole.len(),
            data.len()
        );
        // Both debug sections cover the whole file: twice its bytes, more than the padding
        // allowance over it.
        let len = data.len() as u64;
        for header in &headers {
            patch(&mut data, header + SH_OFFSET, 0);
            patch(&mut data, header + SH_SIZE, len);
        }
        let err = write_debug(&data, path, Vec::new()).unwrap_err();
        assert!(
            matches!(err, ExtractError::TooLarge { input, .. } if input == data.len()),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(
            message.starts_with("/x/aliased: its debug-only copy"),
            "{message}"
        );
        assert!(message.contains("overlap"), "{message}");
        // One of them alone over the whole file still fits.
        let (mut data, headers) = small_elf(40 << 10);
        let len = data.len() as u64;
        patch(&mut data, headers[0] + SH_OFFSET, 0);
        patch(&mut data, headers[0] + SH_SIZE, len);
        assert!(write_debug(&data, path, Vec::new()).is_ok());
    }

    #[test]
    fn fuzz_regressions_do_not_panic() {
        let inputs = crate::sys::fs::fuzz_inputs("extract");
        assert!(!inputs.is_empty(), "fuzz/seeds/extract/ is committed");
        for (path, data) in &inputs {
            eprintln!("{}", path.display());
            fuzz_one(data);
        }
    }
}
