//! One parsed ELF image: what the unwinder, the runtimes' detectors and the Go reader all ask
//! of a binary (its `PT_LOAD` segments, its build ids, its debug link, where `.gopclntab` is),
//! read once from its headers and handed to each of them, so a file is not parsed again by
//! every reader.
//!
//! The file is hostile: `object` bounds every header read by the file's bytes, the segments
//! kept are at most as many as the program headers the file holds, a note that does not
//! parse is no build id rather than an error, and nothing here indexes without a check.

use std::borrow::Cow;

use object::{Object, ObjectSection, ObjectSegment, SegmentFlags};

/// Why bytes are not an ELF image this module reads.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("not an object file: {0}")]
    Parse(#[source] object::Error),
    #[error("a {0:?} object file, not ELF")]
    NotElf(object::BinaryFormat),
}

/// `PF_X` of an ELF program header: the segment holds code.
pub const PF_X: u32 = object::elf::PF_X;
/// `PF_W` of an ELF program header: the segment is writable data.
pub const PF_W: u32 = object::elf::PF_W;

/// A `PT_LOAD` segment: which file bytes land at which ELF addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// `p_vaddr`: the ELF address its first byte is loaded at.
    pub address: u64,
    /// `p_offset`: where its bytes start in the file; with `address`, what a mapping's file
    /// offset is translated by.
    pub offset: u64,
    /// `p_filesz`: how many of its bytes come from the file (a mapping past them is `.bss`).
    pub file_size: u64,
    /// `p_memsz`: how far its addresses reach once loaded, `.bss` included: the code's extent
    /// for the unwinder.
    pub memory_size: u64,
    /// `p_flags`: `PF_X` tells code from data, `PF_W` writable data from read-only.
    pub flags: u32,
}

impl Segment {
    /// Whether it holds code (`PF_X`).
    pub fn is_executable(&self) -> bool {
        self.flags & PF_X != 0
    }

    /// The file offset of `address`, if this segment has `len` file bytes there.
    pub fn offset_of(&self, address: u64, len: u64) -> Option<u64> {
        let off = address.checked_sub(self.address)?;
        (off.checked_add(len)? <= self.file_size).then_some(self.offset.checked_add(off)?)
    }

    /// The 8-byte aligned words of the segment's bytes in `data`, its file (a truncated file
    /// has fewer): (address, word).
    pub fn words<'d>(&self, data: &'d [u8]) -> impl Iterator<Item = (u64, &'d [u8])> + 'd {
        let segment = *self;
        let skip = segment.address.wrapping_neg() % 8;
        let clamp = |n: u64| usize::try_from(n).map_or(data.len(), |n| n.min(data.len()));
        let end = clamp(segment.offset.saturating_add(segment.file_size));
        let bytes = data.get(clamp(segment.offset)..end).unwrap_or_default();
        let aligned = bytes.get(skip as usize..).unwrap_or_default();
        aligned
            .chunks_exact(8)
            .enumerate()
            .map(move |(i, word)| (segment.address.wrapping_add(skip + 8 * i as u64), word))
    }
}

/// What a process adds to a binary's ELF addresses: its load bias, from the segment of
/// `segments` (the executable ones, as the unwinder keeps them) that a mapping starting at
/// `start` with file offset `offset` holds. The mapping starts at a page boundary, so the
/// segment's offset is compared rounded down to its page.
pub fn load_bias(segments: &[Segment], start: u64, offset: u64) -> Option<u64> {
    let segment = segments
        .iter()
        .find(|s| s.offset & !0xfff <= offset && offset < s.offset.saturating_add(s.file_size))?;
    Some(
        start
            .wrapping_sub(offset)
            .wrapping_add(segment.offset)
            .wrapping_sub(segment.address),
    )
}

/// Where a section's bytes are, in the file and in the ELF address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SectionRange {
    /// Its first byte's file offset.
    pub offset: u64,
    /// Its length in the file.
    pub size: u64,
    /// The ELF address its first byte is loaded at.
    pub address: u64,
}

/// One ELF image, parsed once: see the module documentation.
pub struct Elf<'d> {
    /// The parse, for what this view does not keep (sections, symbols, notes).
    file: object::File<'d>,
    /// The image's bytes, which `file` and every range here point into.
    data: &'d [u8],
    /// Every `PT_LOAD` segment, in program header order: the unwinder keeps the executable
    /// ones, the Go reader maps addresses through the rest too.
    segments: Vec<Segment>,
    /// The GNU build id note's bytes; `None` when absent or unreadable.
    gnu_build_id: Option<&'d [u8]>,
    /// The Go build id, from its note: what keys a Go binary built without a GNU one.
    go_build_id: Option<String>,
    /// `.gnu_debuglink`: the separate debug file's name and the CRC-32 of its contents.
    debuglink: Option<(&'d [u8], u32)>,
    /// `.gopclntab` (`.data.rel.ro.gopclntab` in a PIE), when the section headers name it.
    gopclntab: Option<SectionRange>,
}

impl std::fmt::Debug for Elf<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elf")
            .field("segments", &self.segments)
            .field("gnu_build_id", &self.gnu_build_id)
            .field("go_build_id", &self.go_build_id)
            .field("gopclntab", &self.gopclntab)
            .finish()
    }
}

impl<'d> Elf<'d> {
    /// Parses the headers of the ELF image `data`.
    pub fn parse(data: &'d [u8]) -> Result<Elf<'d>, ElfError> {
        let file = object::File::parse(data).map_err(ElfError::Parse)?;
        if file.format() != object::BinaryFormat::Elf {
            return Err(ElfError::NotElf(file.format()));
        }
        // `object` yields only `PT_LOAD` headers, each read from the file: no more of them
        // than the file's bytes hold.
        let segments = file
            .segments()
            .map(|segment| {
                let (offset, file_size) = segment.file_range();
                let flags = match segment.flags() {
                    SegmentFlags::Elf { p_flags } => p_flags,
                    _ => 0,
                };
                Segment {
                    address: segment.address(),
                    offset,
                    file_size,
                    memory_size: segment.size(),
                    flags,
                }
            })
            .collect();
        let gnu_build_id = file.build_id().ok().flatten();
        let go_build_id = super::gopclntab::build_id(&file, data);
        let debuglink = file.gnu_debuglink().ok().flatten();
        let gopclntab = file
            .section_by_name(".gopclntab")
            .or_else(|| file.section_by_name(".data.rel.ro.gopclntab"))
            .and_then(|section| {
                let (offset, size) = section.file_range()?;
                Some(SectionRange {
                    offset,
                    size,
                    address: section.address(),
                })
            });
        Ok(Elf {
            file,
            data,
            segments,
            gnu_build_id,
            go_build_id,
            debuglink,
            gopclntab,
        })
    }

    /// The parse underneath, for sections and symbols.
    pub fn object(&self) -> &object::File<'d> {
        &self.file
    }

    /// The image's bytes.
    pub fn data(&self) -> &'d [u8] {
        self.data
    }

    /// Every `PT_LOAD` segment, in program header order.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The executable `PT_LOAD` segments: where the code is, and what a mapping of it is
    /// biased by.
    pub fn executable_segments(&self) -> Vec<Segment> {
        let code = self.segments.iter().filter(|s| s.is_executable());
        code.copied().collect()
    }

    /// The GNU build id's bytes.
    pub fn gnu_build_id(&self) -> Option<&'d [u8]> {
        self.gnu_build_id
    }

    /// The Go build id (`go build`'s `action/content` string).
    pub fn go_build_id(&self) -> Option<&str> {
        self.go_build_id.as_deref()
    }

    /// What keys the binary: its GNU build id, or else a Go binary's Go build id's bytes
    /// (which `go build` writes where it writes no GNU one).
    pub fn build_id(&self) -> Option<Cow<'d, [u8]>> {
        match (self.gnu_build_id, &self.go_build_id) {
            (Some(id), _) => Some(Cow::Borrowed(id)),
            (None, Some(go)) => Some(Cow::Owned(go.as_bytes().to_vec())),
            (None, None) => None,
        }
    }

    /// `.gnu_debuglink`: the debug file's name (as the binary spells it) and its CRC-32.
    pub fn debuglink(&self) -> Option<(&'d [u8], u32)> {
        self.debuglink
    }

    /// Where `.gopclntab` is, when the section headers say.
    pub fn gopclntab(&self) -> Option<SectionRange> {
        self.gopclntab
    }
}

/// Parses arbitrary bytes and reads every field, with a mapping biased at each segment:
/// must never panic (the `elf_view` fuzz target).
pub fn fuzz_one(data: &[u8]) {
    let Ok(elf) = Elf::parse(data) else {
        return;
    };
    let code = elf.executable_segments();
    for segment in elf.segments() {
        let _ = load_bias(&code, 0x7f00_0000_0000, segment.offset & !0xfff);
        let _ = segment.offset_of(segment.address, 8);
        let _ = segment.words(data).take(64).count();
    }
    let _ = (
        elf.build_id(),
        elf.go_build_id(),
        elf.debuglink(),
        elf.gopclntab(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(path: &str) -> Vec<u8> {
        std::fs::read(path).unwrap_or_else(|err| panic!("reading {path}: {err}"))
    }

    /// The segments, as `readelf -l` lists them, taken independently through `object`.
    fn loads(data: &[u8]) -> Vec<(u64, u64, u64, u64, bool)> {
        let file = object::File::parse(data).unwrap();
        file.segments()
            .map(|s| {
                let (offset, size) = s.file_range();
                let x = matches!(s.flags(), SegmentFlags::Elf { p_flags } if p_flags & 1 != 0);
                (s.address(), offset, size, s.size(), x)
            })
            .collect()
    }

    #[test]
    fn segments_and_load_bias_of_real_binaries() {
        for path in ["/usr/bin/python3.11", "/usr/lib/x86_64-linux-gnu/libc.so.6"] {
            let data = read(path);
            let elf = Elf::parse(&data).unwrap();
            let ours: Vec<_> = elf
                .segments()
                .iter()
                .map(|s| {
                    (
                        s.address,
                        s.offset,
                        s.file_size,
                        s.memory_size,
                        s.is_executable(),
                    )
                })
                .collect();
            assert_eq!(ours, loads(&data), "{path}");
            let code = elf.executable_segments();
            assert_eq!(code.len(), 1, "{path}: one text segment");
            let text = code[0];
            assert!(text.file_size > 0 && text.memory_size >= text.file_size);
            // A mapping of the text at a page-aligned address: the bias takes a file
            // address to the process's.
            let start = 0x7f12_3400_0000 + (text.address & 0xfff);
            let offset = text.offset & !0xfff;
            let start = start & !0xfff;
            let bias = load_bias(&code, start, offset).unwrap();
            assert_eq!(bias.wrapping_add(text.address) & !0xfff, start, "{path}");
            assert_eq!(
                bias.wrapping_add(text.address),
                start + (text.offset - offset),
                "{path}"
            );
            // A mapping of data, or past the text's file bytes, has no bias from the code.
            let past = text.offset.saturating_add(text.file_size) + 0x1000;
            assert_eq!(load_bias(&code, start, past & !0xfff), None, "{path}");
        }
    }

    /// A position-dependent layout: offset 0x1000 at 0x401000, mapped where it says.
    #[test]
    fn load_bias_of_an_unbiased_executable_is_zero() {
        let text = Segment {
            address: 0x40_1000,
            offset: 0x1000,
            file_size: 0x2000,
            memory_size: 0x2000,
            flags: PF_X,
        };
        assert_eq!(load_bias(&[text], 0x40_1000, 0x1000), Some(0));
        assert_eq!(load_bias(&[text], 0x40_2000, 0x2000), Some(0));
        assert_eq!(load_bias(&[text], 0x40_3000, 0x3000), None);
    }

    #[test]
    fn build_ids_agree_with_the_symbolizers() {
        for path in ["/usr/bin/python3.11", "/usr/lib/x86_64-linux-gnu/libc.so.6"] {
            let data = read(path);
            let elf = Elf::parse(&data).unwrap();
            let symbolizer = crate::symbolize::elf::ElfFile::open(std::path::Path::new(path))
                .unwrap()
                .build_id;
            let ours = elf.build_id().map(|id| crate::sys::hex::to_hex(&id));
            assert!(ours.is_some(), "{path} has a GNU build id");
            assert_eq!(ours, symbolizer, "{path}");
            // The note as `object` reads it, apart from this module.
            let object = object::File::parse(&*data).unwrap();
            assert_eq!(elf.gnu_build_id(), object.build_id().unwrap(), "{path}");
            assert_eq!(elf.gnu_build_id().map(<[u8]>::len), Some(20), "{path}");
        }
    }

    /// A binary the Go toolchain built: its Go build id is found and keys it when it has no
    /// GNU one, as the symbolizer keys it.
    #[test]
    fn go_build_id_of_a_go_binary() {
        let found = [
            "/usr/lib/go/bin/gofmt",
            "/usr/lib/go-1.19/bin/gofmt",
            "/usr/bin/go",
        ]
        .into_iter()
        .find(|path| std::path::Path::new(path).exists());
        let Some(path) = found else {
            eprintln!("skipped: no Go toolchain binary on this machine to read a Go build id of");
            return;
        };
        let data = read(path);
        let elf = Elf::parse(&data).unwrap();
        let go = elf.go_build_id().expect("a Go build id");
        // `action id/content id`, each part base64-like, as `go tool buildid` prints it.
        assert!(go.contains('/') && go.is_ascii(), "{path}: {go}");
        // The note's descriptor, read by hand: namesz, descsz, type, "Go\0\0", then the id.
        let object = object::File::parse(&*data).unwrap();
        let note = object.section_by_name(".note.go.buildid").unwrap();
        let note = note.data().unwrap();
        let len = u32::from_le_bytes(note[4..8].try_into().unwrap()) as usize;
        assert_eq!(&note[12..16], b"Go\0\0", "{path}");
        assert_eq!(go.as_bytes(), &note[16..16 + len], "{path}");
        let symbolizer = crate::symbolize::elf::ElfFile::open(std::path::Path::new(path))
            .unwrap()
            .build_id;
        let ours = elf.build_id().map(|id| crate::sys::hex::to_hex(&id));
        assert_eq!(ours, symbolizer, "{path}");
        if elf.gnu_build_id().is_none() {
            assert_eq!(ours, Some(crate::sys::hex::to_hex(go.as_bytes())), "{path}");
        }
        assert!(
            elf.gopclntab().is_some_and(|range| range.size > 0),
            "{path}"
        );
    }

    #[test]
    fn debuglink_of_a_stripped_library() {
        let data = read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fuzz/seeds/elf/lib-stripped-debuglink.so"
        ));
        let elf = Elf::parse(&data).unwrap();
        let object = object::File::parse(&*data).unwrap();
        assert_eq!(elf.debuglink(), object.gnu_debuglink().unwrap());
        assert!(elf.debuglink().is_some());
    }

    #[test]
    fn malformed_images_are_errors_naming_why() {
        let err = Elf::parse(b"\x7fELF not really").unwrap_err().to_string();
        assert!(err.starts_with("not an object file: "), "{err}");
        let err = Elf::parse(b"").unwrap_err().to_string();
        assert!(err.starts_with("not an object file: "), "{err}");
        // The headers of a real binary, cut before its program headers end.
        let data = read("/usr/lib/x86_64-linux-gnu/libc.so.6");
        let err = Elf::parse(&data[..80]).unwrap_err().to_string();
        assert!(err.contains("program header"), "{err}");
        // Cut after the headers: the segments stand, the sections (and so the notes) do
        // not, and nothing reads past the end.
        let cut = &data[..4096];
        match Elf::parse(cut) {
            Ok(elf) => {
                assert_eq!(elf.segments().len(), loads(&data).len());
                for segment in elf.segments() {
                    assert!(segment.words(cut).count() <= cut.len() / 8);
                }
            }
            Err(err) => assert!(err.to_string().contains("section"), "{err}"),
        }
    }

    /// The ELF and Go seeds and findings of the other targets, whole and cut at every 97th
    /// byte: the headers of real images, truncated anywhere, never panic the parse.
    #[test]
    fn fuzz_inputs_and_their_truncations_do_not_panic() {
        let mut inputs = crate::sys::fs::fuzz_inputs("elf");
        inputs.extend(crate::sys::fs::fuzz_inputs("gopclntab"));
        assert!(
            inputs.len() >= 2,
            "fuzz/seeds/elf/ and gopclntab/ are committed"
        );
        for (path, data) in inputs {
            let cut = data.len().min(1 << 16);
            for len in (0..cut).step_by(97).chain([data.len()]) {
                let result = std::panic::catch_unwind(|| fuzz_one(&data[..len]));
                assert!(result.is_ok(), "{} cut at {len}", path.display());
            }
        }
    }

    #[test]
    fn other_formats_are_not_elf() {
        use object::write::Object as Writer;
        let writer = Writer::new(
            object::BinaryFormat::Coff,
            object::Architecture::X86_64,
            object::Endianness::Little,
        );
        let coff = writer.write().unwrap();
        let err = Elf::parse(&coff).unwrap_err().to_string();
        assert_eq!(err, "a Coff object file, not ELF");
    }
}
