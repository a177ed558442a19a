//! Unwind tables: for one executable, compact sorted rows that say, for every pc of its code,
//! how to find the caller's frame without frame pointers. The BPF program searches them (the
//! row format and the search are shared through `scorch_common`); [`loader`] puts them in its
//! maps and keeps each process's mappings current, off the window loop's critical path.
//!
//! A table comes from `.eh_frame`, and for code it does not describe, from `.debug_frame` in
//! the binary or in its separate debug file ([`convert`]), and then, in a Go binary, from the
//! stack-pointer deltas of its `.gopclntab` ([`pcsp`]). A first pass reads only which
//! functions each source describes ([`index`]); the second converts them one at a time in pc
//! order, each function's rows merged into the table as they come, with end-of-function
//! markers before the gaps between functions ([`optimize`]). So a library of millions of rows
//! is built in about its table's size, never through whole-table vectors of unsorted rows.
//! x86-64 and arm64 (`convert/x86_64.rs`, `convert/aarch64.rs`, each naming its registers);
//! other architectures are refused. The tables a running agent builds are its own
//! architecture's: another's is refused by the loader (`arch::native`).
//!
//! The bytes come from files any user controls. Nothing in them panics the agent: malformed
//! FDEs are skipped and counted, a malformed section is an [`UnwindError`], and the rows one
//! table may allocate are capped.

mod convert;
mod index;
mod kernel_maps;
pub use kernel_maps::initial_process_entries;
#[cfg(test)]
mod large_table_tests;
pub mod loader;
pub mod metrics;
mod optimize;
mod owned;
mod pcsp;
mod pool;
pub mod row;

use std::{borrow::Cow, path::Path, path::PathBuf};

use gimli::{BaseAddresses, DebugFrame, EhFrame, LittleEndian};
use object::{Object, ObjectSection};

use crate::binary::{elf::Elf, gopclntab::Pclntab};

use convert::{Arch, FdeCounts, FdeRows, Generated, Section, Slice};
use index::{Entry, FunctionIndex, Source, SOURCES};
use optimize::Merger;
pub use row::{CfaKind, FpKind, UnwindRow};

use scorch_common::{last_at_or_below, UNWIND_SEARCH_STEPS};

/// Why a table could not be built.
#[derive(Debug, thiserror::Error)]
pub enum UnwindError {
    #[error("parsing ELF file {path}: {source}")]
    Parse {
        path: PathBuf,
        source: crate::binary::elf::ElfError,
    },
    #[error(
        "{path} is {architecture} code: unwind tables are built for 64-bit x86-64 and arm64 only"
    )]
    Architecture { path: PathBuf, architecture: String },
    #[error("{path} has no executable PT_LOAD segment")]
    NoCode { path: PathBuf },
    #[error(
        "the executable segments of {path} span {span} bytes, more than a row's 32-bit pc reaches"
    )]
    CodeTooLarge { path: PathBuf, span: u64 },
    #[error(
        "{path} has no .eh_frame or .debug_frame with any FDE, nor a Go function table{}",
        if *.debug_file { ", nor has its debug file" } else { "" }
    )]
    NoUnwindInfo { path: PathBuf, debug_file: bool },
    #[error("reading {section} of {path}: {source}")]
    Section {
        path: PathBuf,
        section: &'static str,
        source: gimli::Error,
    },
    #[error("reading compressed {section} of {path}: {source}")]
    Compressed {
        path: PathBuf,
        section: &'static str,
        source: object::Error,
    },
    #[error(
        "compressed {section} of {path} claims {size} bytes inflated, more than the {limit} \
         allowed"
    )]
    CompressedTooLarge {
        path: PathBuf,
        section: &'static str,
        size: u64,
        limit: u64,
    },
    #[error("{section} of {path} gives more than {limit} rows")]
    TooManyRows {
        path: PathBuf,
        section: &'static str,
        limit: usize,
    },
}

/// Largest `.debug_frame` inflated from a compressed section. Real CFI takes about 5 bytes a
/// row, so a table of [`convert::MAX_ROWS`] rows comes from some 40 MiB; a section claiming
/// more than six times that is refused before anything is inflated.
const MAX_INFLATED_DEBUG_FRAME: u64 = 256 << 20;

/// What building a table found, for logs and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnwindStats {
    /// FDEs (functions) taken from `.eh_frame`.
    pub eh_frame_fdes: usize,
    /// FDEs taken from `.debug_frame` (the binary's, or else its debug file's), for code
    /// `.eh_frame` does not describe.
    pub debug_frame_fdes: usize,
    /// Go functions taken from `.gopclntab`'s stack-pointer deltas, for code no CFI describes.
    pub go_functions: usize,
    /// FDEs and Go functions left out (unreadable, or outside the executable segments): their
    /// code has no row.
    pub fdes_skipped: usize,
    /// Rows DWARF gave, end-of-function markers included, before sorting and merging.
    pub rows_before_merging: usize,
    pub rows: usize,
    /// Of `rows`, the end-of-function markers that start a gap between functions.
    pub end_markers: usize,
    /// Rows whose CFA the BPF side cannot find ([`CfaKind::Unsupported`]).
    pub unsupported_cfa: usize,
    /// Rows whose caller's rbp it cannot find ([`FpKind::Unsupported`]).
    pub unsupported_rbp: usize,
}

/// The unwind table of one executable or library.
#[derive(Debug, Clone)]
pub struct UnwindTable {
    /// The ELF address row pcs count from: the lowest executable segment's. A pc in the
    /// process becomes a row pc by its mapping's load bias, then this.
    base: u64,
    rows: Vec<UnwindRow>,
    stats: UnwindStats,
}

/// The executable segments of a binary: the only addresses rows may cover, and what their
/// 32-bit pcs count from.
struct Code {
    base: u64,
    /// `(start, end)` ELF addresses of each executable `PT_LOAD`.
    segments: Vec<(u64, u64)>,
}

impl Code {
    fn of(elf: &Elf<'_>, path: &Path) -> Result<Self, UnwindError> {
        let code = elf
            .segments()
            .iter()
            .filter(|segment| segment.is_executable());
        let segments: Vec<(u64, u64)> = code
            .map(|segment| {
                let start = segment.address;
                (start, start.saturating_add(segment.memory_size))
            })
            .collect();
        let (Some(base), Some(end)) = (
            segments.iter().map(|s| s.0).min(),
            segments.iter().map(|s| s.1).max(),
        ) else {
            return Err(UnwindError::NoCode {
                path: path.to_owned(),
            });
        };
        let span = end - base;
        if span > u64::from(u32::MAX) {
            return Err(UnwindError::CodeTooLarge {
                path: path.to_owned(),
                span,
            });
        }
        Ok(Code { base, segments })
    }

    /// True when `[start, end)` lies inside one executable segment.
    fn covers(&self, start: u64, end: u64) -> bool {
        self.segments
            .iter()
            .any(|&(low, high)| low <= start && end <= high)
    }

    /// The row pc of an address [`Code::covers`] accepted (or the end of such a range): the
    /// span check in [`Code::of`] makes it fit.
    fn pc(&self, address: u64) -> u32 {
        (address - self.base) as u32
    }
}

impl UnwindTable {
    /// Builds the table of the ELF file `elf` (its bytes; `path` names it in errors) from its
    /// `.eh_frame` and, for code `.eh_frame` does not describe, its `.debug_frame`.
    pub fn build(path: &Path, elf: &[u8]) -> Result<Self, UnwindError> {
        Self::build_with_debug_file(path, elf, None)
    }

    /// As [`UnwindTable::build`], from a file already parsed (the loader's one parse of it).
    pub fn of(path: &Path, elf: &Elf<'_>) -> Result<Self, UnwindError> {
        Self::of_with_debug_file(path, elf, None)
    }

    /// As [`UnwindTable::build`]; when the binary has no `.debug_frame`, that of its separate
    /// debug file (`(path, bytes)`, found the way symbolisation finds it) is read instead.
    ///
    /// `.eh_frame` comes first: it is what the process itself unwinds with, and it covers
    /// every function of a normal build. `.debug_frame` only fills in code `.eh_frame` leaves
    /// out (built with `-fno-asynchronous-unwind-tables -g`: then only the C runtime's start
    /// files have `.eh_frame`, and the program's own functions are in `.debug_frame`).
    pub fn build_with_debug_file(
        path: &Path,
        elf: &[u8],
        debug_file: Option<(&Path, &[u8])>,
    ) -> Result<Self, UnwindError> {
        Self::of_with_debug_file(path, &parse(path, elf)?, debug_file)
    }

    /// As [`UnwindTable::build_with_debug_file`], from a file already parsed.
    ///
    /// Two passes: the first reads which functions each source describes into a
    /// [`FunctionIndex`], a few words a function; the second converts them one at a time in
    /// pc order, each merged into the table as it comes ([`optimize::Merger`]). The rows are
    /// held once, in the table's own storage: a whole table of unsorted rows and then a
    /// sorted copy of it made a library of millions of rows cost several times its table.
    ///
    /// A source's function claims its code from the first pass on: an FDE whose program
    /// turns out unreadable in the second leaves its code without rows rather than to a
    /// later source (a corrupt section only).
    pub fn of_with_debug_file(
        path: &Path,
        parsed: &Elf<'_>,
        debug_file: Option<(&Path, &[u8])>,
    ) -> Result<Self, UnwindError> {
        let arch = arch(path, parsed)?;
        let (file, elf) = (parsed.object(), parsed.data());
        let code = Code::of(parsed, path)?;
        // In a Go binary, the runtime's functions that start or switch stacks come first:
        // its CFI (an unstripped build's `.debug_frame`) describes them as ordinary frames,
        // and a walk through them goes on into another stack's words.
        let go = match Pclntab::of(parsed) {
            Ok(table) => table,
            Err(err) => {
                tracing::debug!("{}: Go function table refused: {err}", path.display());
                None
            }
        };
        // `.debug_frame` is the binary's; only without one, its debug file's.
        let debug_parsed = match debug_file {
            Some((debug_path, bytes)) if file.section_by_name(DEBUG_FRAME).is_none() => {
                Some((debug_path, parse(debug_path, bytes)?))
            }
            _ => None,
        };
        let (debug_path, debug_object) = match &debug_parsed {
            Some((debug_path, debug)) => (*debug_path, debug.object()),
            None => (path, file),
        };
        let debug_data = debug_frame_data(debug_object, debug_path)?;
        let sections = Sections {
            eh_frame: eh_frame(file, path, arch),
            debug_frame: debug_data
                .as_deref()
                .map(|data| debug_frame(data, debug_path, arch)),
            go: go.as_ref().map(|table| (table, elf)),
            generated: arch.generated(file, &code),
            arch,
        };

        let mut index = FunctionIndex::default();
        let go_stops = sections.go.map_or(FdeCounts::default(), |(table, data)| {
            pcsp::index(table, data, &code, &[], pcsp::Which::Stops, &mut index)
        });
        let eh_frame = match &sections.eh_frame {
            Some(source) => {
                convert::index(source, Source::EhFrame, &code, &index.covered(), &mut index)?
            }
            None => FdeCounts::default(),
        };
        let claimed = index.covered();
        let debug_frame = match &sections.debug_frame {
            Some(source) => {
                convert::index(source, Source::DebugFrame, &code, &claimed, &mut index)?
            }
            None => FdeCounts::default(),
        };
        // Go's own code has no CFI unless the linker kept `.debug_frame` (unstripped builds):
        // its pc tables describe every function the runtime can unwind.
        let go_rest = sections.go.map_or(FdeCounts::default(), |(table, data)| {
            let claimed = index.covered();
            pcsp::index(table, data, &code, &claimed, pcsp::Which::Rest, &mut index)
        });

        let generated = convert::index_generated(&sections.generated, &mut index);
        let merged = sections.convert(&index.into_sorted(), &code)?;
        let failed = |source: Source| merged.failed[source as usize];
        let eh_frame_fdes = eh_frame.converted - failed(Source::EhFrame);
        let debug_frame_fdes = debug_frame.converted - failed(Source::DebugFrame);
        let go_functions = go_stops.converted + go_rest.converted
            - failed(Source::GoStops)
            - failed(Source::GoRest);
        // Generated rows alone (a vDSO without CFI) are a table too.
        let generated = generated.converted - failed(Source::Generated);
        if eh_frame_fdes + debug_frame_fdes + go_functions + generated == 0 {
            return Err(UnwindError::NoUnwindInfo {
                path: path.to_owned(),
                debug_file: debug_file.is_some(),
            });
        }
        let rows = merged.rows;
        let stats = UnwindStats {
            eh_frame_fdes,
            debug_frame_fdes,
            go_functions,
            fdes_skipped: eh_frame.skipped
                + debug_frame.skipped
                + go_stops.skipped
                + go_rest.skipped
                + merged.failed.iter().sum::<usize>(),
            rows_before_merging: merged.given,
            rows: rows.len(),
            end_markers: rows
                .iter()
                .filter(|row| row.cfa_kind() == CfaKind::NoRow)
                .count(),
            unsupported_cfa: rows
                .iter()
                .filter(|row| row.cfa_kind() == CfaKind::Unsupported)
                .count(),
            unsupported_rbp: rows
                .iter()
                .filter(|row| row.fp_kind() == FpKind::Unsupported)
                .count(),
        };
        Ok(UnwindTable {
            base: code.base,
            rows,
            stats,
        })
    }

    /// The ELF address row pcs count from.
    pub fn base(&self) -> u64 {
        self.base
    }

    pub fn rows(&self) -> &[UnwindRow] {
        &self.rows
    }

    /// The rows, taken without a copy: the loader hands them on to its pools.
    pub fn into_rows(self) -> Vec<UnwindRow> {
        self.rows
    }

    /// Bytes the rows take, in memory as in a BPF map.
    pub fn size_bytes(&self) -> usize {
        std::mem::size_of_val(self.rows.as_slice())
    }

    pub fn stats(&self) -> UnwindStats {
        self.stats
    }

    /// The row whose rule applies at ELF address `address`, or `None` when no FDE covers it
    /// (a gap between functions, or outside the code). The search is the BPF program's own
    /// ([`scorch_common::Bisect`]), so its tests are the BPF side's too.
    pub fn lookup(&self, address: u64) -> Option<UnwindRow> {
        let pc = u32::try_from(address.checked_sub(self.base)?).ok()?;
        let len = u32::try_from(self.rows.len()).ok()?;
        let index = last_at_or_below(len, UNWIND_SEARCH_STEPS, pc, |i| {
            self.rows.get(i as usize).map(|row| row.pc)
        })?;
        let row = *self.rows.get(index as usize)?;
        (row.cfa_kind() != CfaKind::NoRow).then_some(row)
    }
}

/// Parses `bytes` (`path` names them in errors) as ELF of an architecture whose rows are
/// known.
fn parse<'data>(path: &Path, bytes: &'data [u8]) -> Result<Elf<'data>, UnwindError> {
    let elf = Elf::parse(bytes).map_err(|source| UnwindError::Parse {
        path: path.to_owned(),
        source,
    })?;
    arch(path, &elf)?;
    Ok(elf)
}

/// The file's architecture; another one is refused, as the rows name x86-64's or arm64's
/// registers.
fn arch(path: &Path, elf: &Elf<'_>) -> Result<Arch, UnwindError> {
    let file = elf.object();
    Arch::of(file).ok_or_else(|| UnwindError::Architecture {
        path: path.to_owned(),
        architecture: format!("{:?}", file.architecture()),
    })
}

/// The file's `.eh_frame`, when it has one.
fn eh_frame<'data, 'a>(
    file: &object::File<'data>,
    path: &'a Path,
    arch: Arch,
) -> Option<Section<'a, EhFrame<Slice<'data>>>> {
    let section = file.section_by_name(".eh_frame")?;
    // An allocated section, never compressed.
    let data = section.data().unwrap_or_default();
    let address_of = |name| file.section_by_name(name).map(|s| s.address());
    // Pointers in `.eh_frame` are mostly pc-relative; text- and data-relative ones need these.
    let mut bases = BaseAddresses::default().set_eh_frame(section.address());
    if let Some(text) = address_of(".text") {
        bases = bases.set_text(text);
    }
    if let Some(got) = address_of(".got") {
        bases = bases.set_got(got);
    }
    let mut eh_frame = EhFrame::new(data, LittleEndian);
    eh_frame.set_address_size(8);
    eh_frame.set_vendor(arch.vendor());
    Some(Section {
        section: eh_frame,
        bases,
        path,
        name: ".eh_frame",
        arch,
    })
}

const DEBUG_FRAME: &str = ".debug_frame";

/// The bytes of the file's `.debug_frame`, inflated when compressed; `None` when it has no
/// such section.
fn debug_frame_data<'data>(
    file: &object::File<'data>,
    path: &Path,
) -> Result<Option<Cow<'data, [u8]>>, UnwindError> {
    let Some(section) = file.section_by_name(DEBUG_FRAME) else {
        return Ok(None);
    };
    let compressed_error = |source| UnwindError::Compressed {
        path: path.to_owned(),
        section: DEBUG_FRAME,
        source,
    };
    let compressed = section.compressed_data().map_err(compressed_error)?;
    if compressed.uncompressed_size > MAX_INFLATED_DEBUG_FRAME {
        return Err(UnwindError::CompressedTooLarge {
            path: path.to_owned(),
            section: DEBUG_FRAME,
            size: compressed.uncompressed_size,
            limit: MAX_INFLATED_DEBUG_FRAME,
        });
    }
    compressed.decompress().map(Some).map_err(compressed_error)
}

/// `.debug_frame`'s bytes as the section to convert (`path` names the file they came from).
fn debug_frame<'data, 'a>(
    data: &'data [u8],
    path: &'a Path,
    arch: Arch,
) -> Section<'a, DebugFrame<Slice<'data>>> {
    let mut debug_frame = DebugFrame::new(data, LittleEndian);
    debug_frame.set_address_size(8);
    debug_frame.set_vendor(arch.vendor());
    Section {
        section: debug_frame,
        bases: BaseAddresses::default(),
        path,
        name: DEBUG_FRAME,
        arch,
    }
}

/// The sections a table's functions come from, for the second pass.
struct Sections<'a, 'data> {
    eh_frame: Option<Section<'a, EhFrame<Slice<'data>>>>,
    debug_frame: Option<Section<'a, DebugFrame<Slice<'data>>>>,
    /// Go's function table, and the file's bytes it reads.
    go: Option<(&'a Pclntab, &'data [u8])>,
    /// The architecture's rows for code without CFI.
    generated: Vec<Generated>,
    arch: Arch,
}

/// What the second pass made of the index.
struct Merged {
    rows: Vec<UnwindRow>,
    /// Rows converted, before merging.
    given: usize,
    /// Functions of the index whose rules could not be read after all, by [`Source`]: their
    /// code has no row.
    failed: [usize; SOURCES],
}

impl Sections<'_, '_> {
    /// The second pass: each function of `functions` (sorted by pc) converted from its
    /// section and merged into the table, one at a time.
    fn convert(&self, functions: &[Entry], code: &Code) -> Result<Merged, UnwindError> {
        let mut eh_frame = self.eh_frame.as_ref().map(FdeRows::new);
        let mut debug_frame = self.debug_frame.as_ref().map(FdeRows::new);
        let mut merger = Merger::default();
        let mut failed = [0; SOURCES];
        // One function's rows at a time: the largest function bounds it.
        let mut rows = Vec::new();
        for function in functions {
            rows.clear();
            let room = convert::MAX_ROWS.saturating_sub(merger.given());
            let read = match function.source {
                Source::EhFrame => match &mut eh_frame {
                    Some(section) => section.rows(function.at, code, &mut rows, room)?,
                    None => false,
                },
                Source::DebugFrame => match &mut debug_frame {
                    Some(section) => section.rows(function.at, code, &mut rows, room)?,
                    None => false,
                },
                Source::GoStops | Source::GoRest => match self.go {
                    Some((table, data)) => {
                        pcsp::rows(table, data, function.at, self.arch, code, &mut rows, room)
                    }
                    None => false,
                },
                Source::Generated => match self.generated.get(function.at as usize) {
                    Some(generated) => {
                        rows.extend_from_slice(&generated.rows);
                        true
                    }
                    None => false,
                },
            };
            if read {
                merger.add(function.start, function.end, &rows);
            } else {
                failed[function.source as usize] += 1;
            }
        }
        let given = merger.given();
        Ok(Merged {
            rows: merger.finish(),
            given,
            failed,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, path::Path, process::Command};

    use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};

    use super::*;
    use crate::{symbolize::elf::FileData, unwind::row::RaKind};

    const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

    /// One row of `readelf --debug-dump=frames-interp`, its columns as readelf prints them.
    #[derive(Debug)]
    struct ReferenceRow {
        pc: u64,
        cfa: String,
        rbp: Option<String>,
        ra: Option<String>,
    }

    #[derive(Debug)]
    struct ReferenceFde {
        start: u64,
        end: u64,
        cie: u64,
        /// Empty when the FDE changes nothing: the CIE's rows apply.
        rows: Vec<ReferenceRow>,
    }

    #[derive(Debug, Default)]
    struct ReferenceCie {
        /// Augmentation `S`.
        signal: bool,
        /// The return address column (`ra=N`).
        return_address: u64,
        rows: Vec<ReferenceRow>,
    }

    /// readelf's reading of one CFI section, and the layout facts it is compared under.
    struct Reference {
        cies: HashMap<u64, ReferenceCie>,
        /// Sorted by start, FDEs outside the executable segments left out (as the table does).
        fdes: Vec<ReferenceFde>,
        /// For each FDE, whether another FDE claims any of its pcs: those pcs are not compared.
        overlapping: Vec<bool>,
        /// For each FDE, the furthest end of it and every FDE before it.
        reach: Vec<u64>,
        /// `.plt` sections: where an expression CFA is the PLT one (x86-64), or where the
        /// table has generated rows (arm64).
        plt: Ranges,
        arch: Arch,
    }

    /// `[start, end)` ELF addresses.
    type Ranges = Vec<(u64, u64)>;

    /// The executable segments and `.plt` of a file, from `object`, independently of `Code`.
    fn layout(bytes: &[u8]) -> (Ranges, Ranges) {
        let file = object::File::parse(bytes).unwrap();
        let code = file
            .segments()
            .filter(|s| matches!(s.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0))
            .map(|s| (s.address(), s.address() + s.size()))
            .collect();
        let plt = file
            .sections()
            .filter(|s| s.name() == Ok(".plt"))
            .map(|s| (s.address(), s.address() + s.size()))
            .collect();
        (code, plt)
    }

    fn hex(text: &str) -> u64 {
        u64::from_str_radix(text, 16).unwrap()
    }

    /// Runs readelf on `path` and reads its interpretation of `section`.
    fn readelf(path: &Path, bytes: &[u8], section: &str) -> Reference {
        // `-wN`: not the separate debug file `.gnu_debuglink` names, this file alone.
        let output = Command::new("readelf")
            .args(["-wN", "--debug-dump=frames-interp"])
            .arg(path)
            .output()
            .expect("running readelf (binutils)");
        assert!(
            output.status.success(),
            "readelf failed on {}",
            path.display()
        );
        let text = String::from_utf8_lossy(&output.stdout);
        let arch = Arch::of(&object::File::parse(bytes).unwrap()).unwrap();
        let fp_column = match arch {
            Arch::X86_64 => "rbp",
            Arch::Aarch64 => "x29",
        };
        let mut cies: HashMap<u64, ReferenceCie> = HashMap::new();
        let mut fdes = Vec::new();
        let mut in_section = false;
        let mut columns: Vec<String> = Vec::new();
        // Which entry the table lines below belong to.
        let mut current: Option<Result<u64, usize>> = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("Contents of the ") {
                in_section = rest.starts_with(&format!("{section} section"));
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            if !in_section || fields.is_empty() {
                continue;
            }
            if fields.get(3) == Some(&"CIE") {
                let offset = hex(fields[0]);
                let signal = fields[4].trim_matches('"').contains('S');
                let return_address = fields
                    .iter()
                    .find_map(|field| field.strip_prefix("ra="))
                    .and_then(|ra| ra.parse().ok())
                    .unwrap();
                cies.insert(
                    offset,
                    ReferenceCie {
                        signal,
                        return_address,
                        rows: Vec::new(),
                    },
                );
                current = Some(Ok(offset));
                continue;
            }
            if fields.get(3) == Some(&"FDE") {
                let cie = hex(fields[4].strip_prefix("cie=").unwrap());
                let (start, end) = fields[5]
                    .strip_prefix("pc=")
                    .unwrap()
                    .split_once("..")
                    .unwrap();
                fdes.push(ReferenceFde {
                    start: hex(start),
                    end: hex(end),
                    cie,
                    rows: Vec::new(),
                });
                current = Some(Err(fdes.len() - 1));
                continue;
            }
            if fields[0] == "LOC" {
                columns = fields.iter().map(|f| f.to_string()).collect();
                continue;
            }
            let (Some(entry), true) = (current, fields[0].len() == 16) else {
                continue;
            };
            // A register rule prints as `r9 (r9)`: one value in two words.
            let mut values: Vec<String> = Vec::new();
            for field in &fields[1..] {
                match values.last_mut() {
                    Some(last) if field.starts_with('(') => *last = format!("{last} {field}"),
                    _ => values.push(field.to_string()),
                }
            }
            let column = |name: &str| {
                let at = columns.iter().position(|c| c == name)?;
                values.get(at - 1).cloned()
            };
            let row = ReferenceRow {
                pc: hex(fields[0]),
                cfa: column("CFA").unwrap(),
                rbp: column(fp_column),
                ra: column("ra"),
            };
            match entry {
                Ok(cie) => cies.get_mut(&cie).unwrap().rows.push(row),
                Err(fde) => fdes[fde].rows.push(row),
            }
        }
        let (code, plt) = layout(bytes);
        fdes.retain(|fde| {
            fde.start < fde.end && code.iter().any(|&(s, e)| s <= fde.start && fde.end <= e)
        });
        fdes.sort_by_key(|fde| (fde.start, fde.end));
        let mut overlapping = vec![false; fdes.len()];
        let mut reach = Vec::with_capacity(fdes.len());
        let mut furthest = 0;
        for (i, fde) in fdes.iter().enumerate() {
            if i > 0 && fde.start < furthest {
                overlapping[i] = true;
                overlapping[i - 1] = true;
            }
            furthest = furthest.max(fde.end);
            reach.push(furthest);
        }
        Reference {
            cies,
            fdes,
            overlapping,
            reach,
            plt,
            arch,
        }
    }

    /// What the table must say at a pc, from readelf's columns.
    #[derive(Debug, Clone, PartialEq)]
    struct Expected {
        cfa: CfaKind,
        /// Compared when known.
        cfa_offset: Option<u16>,
        /// The rbp kinds readelf's column allows (`exp` does not say which expression).
        rbp: Vec<FpKind>,
        fp_offset: Option<i8>,
        /// Compared when known.
        ra: Option<RaKind>,
    }

    fn expected(row: &ReferenceRow, signal: bool, in_plt: bool) -> Expected {
        let ra = row.ra.as_deref();
        let ra_where_expected = match ra {
            None | Some("c-8") | Some("u") => true,
            Some("exp") => signal,
            _ => false,
        };
        let fit = |kind, offset: &str| match offset.parse::<u16>() {
            Ok(offset) => (kind, Some(offset)),
            Err(_) => (CfaKind::Unsupported, None),
        };
        let (cfa, cfa_offset) = if !ra_where_expected {
            (CfaKind::Unsupported, None)
        } else if let Some(offset) = row.cfa.strip_prefix("rsp+") {
            fit(CfaKind::Sp, offset)
        } else if let Some(offset) = row.cfa.strip_prefix("rbp+") {
            fit(CfaKind::Fp, offset)
        } else if row.cfa == "exp" && signal {
            (CfaKind::Signal, None)
        } else if row.cfa == "exp" && in_plt {
            (CfaKind::Plt, Some(8))
        } else {
            (CfaKind::Unsupported, None)
        };
        let (rbp, fp_offset) = match row.rbp.as_deref() {
            _ if ra == Some("u") => (vec![FpKind::ReturnAddressUndefined], None),
            None | Some("u") | Some("s") => (vec![FpKind::Unchanged], None),
            Some("exp") if signal => (vec![FpKind::AtSp], None),
            Some("exp") => (vec![FpKind::AtSp, FpKind::Unsupported], None),
            Some(saved) => match saved.strip_prefix('c').map(str::parse::<i64>) {
                Some(Ok(offset)) if offset % 8 == 0 && (-1024..1024).contains(&offset) => {
                    (vec![FpKind::CfaOffset], Some((offset / 8) as i8))
                }
                _ => (vec![FpKind::Unsupported], None),
            },
        };
        Expected {
            cfa,
            cfa_offset,
            rbp,
            fp_offset,
            ra: None,
        }
    }

    /// What an arm64 table must say, from readelf's columns: x29 and the return address saved
    /// as a frame record, the return address alone, or neither (the return address still in
    /// x30). readelf prints `u` for a register without a rule as for an undefined one, so an
    /// unsaved x30 may also be the outermost frame.
    fn expected_aarch64(row: &ReferenceRow, return_address: u64) -> Expected {
        let saved = |column: Option<&str>| match column {
            None | Some("u") | Some("s") => Some(None),
            Some(saved) => match saved.strip_prefix('c').map(str::parse::<i64>) {
                Some(Ok(offset)) => Some(Some(offset)),
                _ => None,
            },
        };
        let cfa = |kind, offset: &str| match offset.parse::<u16>() {
            Ok(offset) => (kind, Some(offset)),
            Err(_) => (CfaKind::Unsupported, None),
        };
        let (cfa, cfa_offset) = if let Some(offset) = row.cfa.strip_prefix("sp+") {
            cfa(CfaKind::Sp, offset)
        } else if let Some(offset) = row.cfa.strip_prefix("x29+") {
            cfa(CfaKind::Fp, offset)
        } else {
            (CfaKind::Unsupported, None)
        };
        let words = |offset: i64| {
            (offset % 8 == 0)
                .then_some(offset / 8)
                .and_then(|words| i8::try_from(words).ok())
        };
        // The walk stops at an unsupported CFA, whatever the rest of the row says.
        let unsupported = Expected {
            cfa: CfaKind::Unsupported,
            cfa_offset: None,
            rbp: (0..16).map(FpKind::from_bits).collect(),
            fp_offset: None,
            ra: None,
        };
        let expected = |rbp, fp_offset, ra| Expected {
            cfa,
            cfa_offset,
            rbp,
            fp_offset,
            ra,
        };
        match (saved(row.rbp.as_deref()), saved(row.ra.as_deref())) {
            // A return address column other than x30 (glibc's `__rawmemchr` moves it to x15).
            _ if cfa == CfaKind::Unsupported || return_address != 30 => unsupported,
            (Some(None), Some(None)) => expected(
                vec![FpKind::Unchanged, FpKind::ReturnAddressUndefined],
                None,
                None,
            ),
            (Some(Some(fp)), Some(Some(ra))) if ra == fp + 8 => {
                match (words(fp), words(fp + i64::from(cfa_offset.unwrap()))) {
                    (Some(near), _) => expected(vec![FpKind::Record], Some(near), None),
                    (None, Some(from_base)) => {
                        expected(vec![FpKind::RecordFromBase], Some(from_base), None)
                    }
                    (None, None) => expected(vec![FpKind::Unsupported], None, None),
                }
            }
            (Some(None), Some(Some(ra))) => match words(ra) {
                Some(ra) => expected(vec![FpKind::ReturnAddressAt], Some(ra), None),
                None => expected(vec![FpKind::Unsupported], None, None),
            },
            _ => unsupported,
        }
    }

    impl Reference {
        /// What readelf says applies at `pc`: `Some(None)` for no FDE, `None` where FDEs
        /// overlap (the table's choice there is its own rule, not readelf's).
        fn at(&self, pc: u64) -> Option<Option<Expected>> {
            // arm64's `.plt` has no FDE: its stubs get the table's generated row.
            if self.arch == Arch::Aarch64 && self.plt.iter().any(|&(s, e)| s <= pc && pc < e) {
                return Some(Some(Expected {
                    cfa: CfaKind::Plt,
                    cfa_offset: Some(0),
                    rbp: vec![FpKind::Unchanged],
                    fp_offset: None,
                    ra: Some(RaKind::LinkRegister),
                }));
            }
            let after = self.fdes.partition_point(|fde| fde.start <= pc);
            if after == 0 {
                return Some(None);
            }
            let fde = &self.fdes[after - 1];
            if fde.end <= pc {
                // Only an FDE reaching further than this one could still cover pc.
                return (self.reach[after - 1] <= pc).then_some(None);
            }
            if self.overlapping[after - 1] {
                return None;
            }
            let cie = &self.cies[&fde.cie];
            let rows = if fde.rows.is_empty() {
                &cie.rows
            } else {
                &fde.rows
            };
            let row = rows.iter().rev().find(|row| row.pc <= pc || row.pc == 0)?;
            let in_plt = self.plt.iter().any(|&(s, e)| s <= pc && pc < e);
            Some(Some(match self.arch {
                Arch::X86_64 => expected(row, cie.signal, in_plt),
                Arch::Aarch64 => expected_aarch64(row, cie.return_address),
            }))
        }

        /// Pcs to compare: every row start of every `every`-th FDE, a pc inside each row, the
        /// row's last byte, and the pc just past each function.
        fn sample(&self, every: usize) -> Vec<u64> {
            let mut pcs = Vec::new();
            for fde in self.fdes.iter().step_by(every) {
                let mut starts: Vec<u64> = fde.rows.iter().map(|row| row.pc).collect();
                if starts.is_empty() {
                    starts.push(fde.start);
                }
                for (i, &start) in starts.iter().enumerate() {
                    let next = starts.get(i + 1).copied().unwrap_or(fde.end);
                    pcs.extend([start, start + (next - start) / 2, next - 1]);
                }
                pcs.push(fde.end);
            }
            pcs
        }
    }

    /// What comparing a table with readelf found.
    #[derive(Debug, Default)]
    struct Fidelity {
        compared: usize,
        /// Pcs where FDEs overlap, not compared.
        contested: usize,
        gaps: usize,
        plt: usize,
        signal: usize,
        bottom: usize,
        unsupported: usize,
        disagreements: Vec<String>,
    }

    impl Fidelity {
        /// Prints what was compared after `what` (the table), and fails on any disagreement.
        fn print_and_check(&self, what: &str) {
            println!(
                "{what}; {} pcs compared ({} gaps, {} plt, {} signal, {} bottom of stack, {} \
                 unsupported), {} contested, {} disagreements",
                self.compared,
                self.gaps,
                self.plt,
                self.signal,
                self.bottom,
                self.unsupported,
                self.contested,
                self.disagreements.len(),
            );
            assert!(
                self.disagreements.is_empty(),
                "{} disagreements, first: {:#?}",
                self.disagreements.len(),
                &self.disagreements[..self.disagreements.len().min(20)]
            );
        }
    }

    fn compare(table: &UnwindTable, reference: &Reference, pcs: &[u64]) -> Fidelity {
        let mut fidelity = Fidelity::default();
        for &pc in pcs {
            let Some(expected) = reference.at(pc) else {
                fidelity.contested += 1;
                continue;
            };
            fidelity.compared += 1;
            let got = table.lookup(pc);
            let agree = match (&expected, got) {
                (None, None) => {
                    fidelity.gaps += 1;
                    true
                }
                (Some(expected), Some(row)) => {
                    fidelity.plt += usize::from(expected.cfa == CfaKind::Plt);
                    fidelity.signal += usize::from(expected.cfa == CfaKind::Signal);
                    fidelity.bottom +=
                        usize::from(expected.rbp == [FpKind::ReturnAddressUndefined]);
                    fidelity.unsupported += usize::from(expected.cfa == CfaKind::Unsupported);
                    // arm64's PLT rows are counted as `plt`, but their CFA is sp's.
                    let cfa = match (expected.cfa, reference.arch) {
                        (CfaKind::Plt, Arch::Aarch64) => CfaKind::Sp,
                        (cfa, _) => cfa,
                    };
                    row.cfa_kind() == cfa
                        && expected.cfa_offset.is_none_or(|o| o == row.cfa_offset)
                        && expected.ra.is_none_or(|ra| ra == row.ra_kind())
                        && expected.rbp.contains(&row.fp_kind())
                        && expected.fp_offset.is_none_or(|o| o == row.fp_offset)
                }
                _ => false,
            };
            if !agree {
                fidelity
                    .disagreements
                    .push(format!("{pc:#x}: readelf {expected:?}, table {got:?}"));
            }
        }
        fidelity
    }

    fn map(path: &str) -> FileData {
        FileData::map(Path::new(path)).unwrap()
    }

    #[test]
    fn libc_agrees_with_readelf_at_every_row() {
        let data = map(LIBC);
        let start = std::time::Instant::now();
        let table = UnwindTable::build(Path::new(LIBC), data.bytes()).unwrap();
        let elapsed = start.elapsed();
        let stats = table.stats();
        let reference = readelf(Path::new(LIBC), data.bytes(), ".eh_frame");
        let pcs = reference.sample(1);
        let fidelity = compare(&table, &reference, &pcs);
        fidelity.print_and_check(&format!(
            "libc: {stats:?}, {} bytes, built in {elapsed:?} (unoptimised test build)",
            table.size_bytes()
        ));
        assert!(fidelity.compared > 3000, "{fidelity:?}");
        // Every kind the BPF side handles was met: gaps after functions, the PLT, the signal
        // trampoline, the outermost frames (clone).
        assert!(fidelity.gaps > 100, "{fidelity:?}");
        assert!(fidelity.plt > 0, "{fidelity:?}");
        assert!(fidelity.signal > 0, "{fidelity:?}");
        assert!(fidelity.bottom > 0, "{fidelity:?}");
        // glibc 2.36 has 23,759 rows in readelf's tables. The table adds the FDEs readelf
        // prints no row for (those that keep the CIE's rule) and a marker before each gap
        // between functions (most, as functions are 16-byte aligned), and merges repeats.
        assert!(
            (15_000..35_000).contains(&stats.rows),
            "libc gives {} rows",
            stats.rows
        );
        assert_eq!(stats.debug_frame_fdes, 0);
        assert!(stats.eh_frame_fdes > 3000, "{stats:?}");
        assert_eq!(table.size_bytes(), stats.rows * 8);
    }

    /// Debian's arm64 glibc, from `libc6-arm64-cross` (`cargo xtask setup` installs it).
    const ARM64_LIBC: &str = "/usr/aarch64-linux-gnu/lib/libc.so.6";

    fn arm64_file(path: &str) -> FileData {
        assert!(
            Path::new(path).exists(),
            "{path} is missing: `cargo xtask setup` installs Debian's arm64 cross toolchain"
        );
        map(path)
    }

    #[test]
    fn arm64_libc_agrees_with_readelf_at_every_row() {
        let data = arm64_file(ARM64_LIBC);
        let table = UnwindTable::build(Path::new(ARM64_LIBC), data.bytes()).unwrap();
        let stats = table.stats();
        let reference = readelf(Path::new(ARM64_LIBC), data.bytes(), ".eh_frame");
        let mut pcs = reference.sample(1);
        // Each PLT stub's first and last byte.
        for &(start, end) in &reference.plt {
            pcs.extend((start..end).step_by(16).flat_map(|stub| [stub, stub + 15]));
        }
        let fidelity = compare(&table, &reference, &pcs);
        fidelity.print_and_check(&format!(
            "arm64 libc: {stats:?}, {} bytes",
            table.size_bytes()
        ));
        assert!(fidelity.compared > 3000, "{fidelity:?}");
        assert!(fidelity.gaps > 100 && fidelity.plt > 20, "{fidelity:?}");
        assert_eq!(stats.fdes_skipped, 0, "{stats:?}");
        // Every kind arm64's rows use was met, large frames among them.
        let kinds: std::collections::HashSet<(FpKind, RaKind)> = table
            .rows()
            .iter()
            .map(|row| (row.fp_kind(), row.ra_kind()))
            .collect();
        for kind in [
            (FpKind::Unchanged, RaKind::LinkRegister),
            (FpKind::Record, RaKind::CfaMinus8),
            (FpKind::RecordFromBase, RaKind::CfaMinus8),
            (FpKind::ReturnAddressAt, RaKind::CfaMinus8),
            (FpKind::ReturnAddressUndefined, RaKind::CfaMinus8),
        ] {
            assert!(kinds.contains(&kind), "no {kind:?} row in {kinds:?}");
        }
    }

    /// A C program built for arm64 with return addresses signed (`-mbranch-protection`): its
    /// FDEs toggle the signing state (`DW_CFA_AARCH64_negate_ra_state`), which gimli reads
    /// only when told the file is arm64's.
    #[test]
    fn arm64_functions_that_sign_their_return_address_keep_their_rows() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("signed.c");
        std::fs::write(
            &source,
            "#include <stdio.h>\n\
             __attribute__((noinline)) int leaf(int x) { return x * 3; }\n\
             __attribute__((noinline)) int middle(int x) { char b[64]; \
             snprintf(b, sizeof b, \"%d\", leaf(x)); return b[0]; }\n\
             int main(int argc, char **argv) { return middle(argc); }\n",
        )
        .unwrap();
        let program = dir.path().join("signed");
        let compiler = "aarch64-linux-gnu-gcc";
        let status = Command::new(compiler)
            .args([
                "-O2",
                "-fomit-frame-pointer",
                "-mbranch-protection=standard",
            ])
            .arg(&source)
            .arg("-o")
            .arg(&program)
            .status()
            .unwrap_or_else(|e| panic!("{compiler}: {e} (`cargo xtask setup` installs it)"));
        assert!(status.success());
        let data = FileData::map(&program).unwrap();
        let table = UnwindTable::build(&program, data.bytes()).unwrap();
        let stats = table.stats();
        assert_eq!(stats.fdes_skipped, 0, "{stats:?}");
        let reference = readelf(&program, data.bytes(), ".eh_frame");
        let fidelity = compare(&table, &reference, &reference.sample(1));
        fidelity.print_and_check(&format!("signed arm64 program: {stats:?}"));
        // `middle` signs x30, then saves it (without x29: no frame pointer is kept).
        let file = object::File::parse(data.bytes()).unwrap();
        let middle = file
            .symbols()
            .find(|symbol| symbol.name() == Ok("middle"))
            .unwrap();
        let code = file
            .section_by_name(".text")
            .unwrap()
            .data_range(middle.address(), 4)
            .unwrap()
            .unwrap();
        assert_eq!(code, [0x3f, 0x23, 0x03, 0xd5], "paciasp");
        let entry = table.lookup(middle.address()).unwrap();
        assert_eq!(entry.ra_kind(), RaKind::LinkRegister, "{entry:?}");
        let body = table.lookup(middle.address() + 12).unwrap();
        assert_eq!(body.fp_kind(), FpKind::ReturnAddressAt, "{body:?}");
    }

    #[test]
    fn this_test_binary_agrees_with_readelf() {
        let exe = std::env::current_exe().unwrap();
        let data = FileData::map(&exe).unwrap();
        let table = UnwindTable::build(&exe, data.bytes()).unwrap();
        let reference = readelf(&exe, data.bytes(), ".eh_frame");
        // A few thousand functions, spread over the whole binary.
        let every = (reference.fdes.len() / 3000).max(1);
        let mut pcs = reference.sample(every);
        // `_start` (the C runtime's) and the PLT, wherever the stride falls.
        let first = reference
            .fdes
            .iter()
            .take(8)
            .flat_map(|fde| [fde.start, fde.end - 1]);
        pcs.extend(first);
        let fidelity = compare(&table, &reference, &pcs);
        fidelity.print_and_check(&format!(
            "{}: {:?}, {} bytes",
            exe.display(),
            table.stats(),
            table.size_bytes()
        ));
        assert!(fidelity.compared > 3000, "{fidelity:?}");
        assert!(fidelity.gaps > 0 && fidelity.bottom > 0, "{fidelity:?}");
        // A function of this very file, unwound the way the BPF side will: its CFA is found.
        let own = this_test_binary_agrees_with_readelf as *const () as u64;
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let elf_address = maps
            .lines()
            .find_map(|line| {
                let mut fields = line.split_whitespace();
                let (range, _, offset) = (fields.next()?, fields.next()?, fields.next()?);
                let (start, end) = range.split_once('-')?;
                let (start, end) = (hex(start), hex(end));
                (start <= own && own < end).then(|| own - start + hex(offset))
            })
            .unwrap();
        // File offset to ELF address: the executable segment of a Rust PIE maps at its offset
        // plus a constant the segment says.
        let file = object::File::parse(data.bytes()).unwrap();
        let address = file
            .segments()
            .find_map(|s| {
                let (offset, size) = s.file_range();
                (offset <= elf_address && elf_address < offset + size)
                    .then(|| elf_address - offset + s.address())
            })
            .unwrap();
        let row = table.lookup(address + 1).unwrap();
        assert!(
            matches!(row.cfa_kind(), CfaKind::Sp | CfaKind::Fp),
            "{row:?}"
        );
    }

    #[test]
    fn libc_plt_and_signal_trampoline_get_their_kinds() {
        let data = map(LIBC);
        let table = UnwindTable::build(Path::new(LIBC), data.bytes()).unwrap();
        let (_, plt) = layout(data.bytes());
        let &(plt_start, plt_end) = plt.first().expect("libc has a .plt");
        // Past the first entry (PLT0, which has rows of its own), every 16-byte stub pushes
        // at byte 6 and jumps at byte 11.
        for stub in (plt_start + 16..plt_end).step_by(16).take(8) {
            for (byte, cfa) in [(0, 8), (6, 8), (10, 8), (11, 16), (15, 16)] {
                let row = table.lookup(stub + byte).unwrap();
                assert_eq!(row.cfa_kind(), CfaKind::Plt, "{:#x}", stub + byte);
                let pushed = (stub + byte) & 15 >= row.fp_offset as u64;
                assert_eq!(u64::from(row.cfa_offset) + 8 * u64::from(pushed), cfa);
            }
        }

        // `__restore_rt` is `mov $15, %rax; syscall` (rt_sigreturn); libc's symbol table is
        // stripped, so find it by its bytes.
        let file = object::File::parse(data.bytes()).unwrap();
        let code = b"\x48\xc7\xc0\x0f\x00\x00\x00\x0f\x05";
        let restore_rt = file
            .segments()
            .filter_map(|s| {
                let bytes = s.data().ok()?;
                let at = bytes.windows(code.len()).position(|w| w == code)?;
                Some(s.address() + at as u64)
            })
            .next()
            .expect("libc has __restore_rt");
        let row = table.lookup(restore_rt).unwrap();
        assert_eq!(
            (row.cfa_kind(), row.cfa_offset, row.fp_kind(), row.fp_offset),
            // The kernel's sigcontext: rbp at 120, rsp at 160, rip at 168 from the ucontext's
            // machine context as rsp finds it.
            (CfaKind::Signal, 160, FpKind::AtSp, 15)
        );
        // The FDE starts a byte early so that a caller's `pc - 1` lookup finds it too.
        assert_eq!(table.lookup(restore_rt - 1), Some(row));
    }

    #[test]
    fn lookup_is_the_last_row_at_or_before_the_pc() {
        let rows: Vec<u32> = (0..1000).map(|i| i * 7 + 3).collect();
        for len in [0, 1, 2, 3, 999, 1000] {
            let rows = &rows[..len];
            for pc in 0..7010 {
                let linear = rows.iter().rposition(|&row| row <= pc).map(|i| i as u32);
                let found = last_at_or_below(len as u32, UNWIND_SEARCH_STEPS, pc, |i| {
                    rows.get(i as usize).copied()
                });
                assert_eq!(found, linear, "{len} rows, pc {pc}");
            }
        }
        // A row that cannot be read ends the search with nothing, never with a wrong row.
        assert_eq!(
            last_at_or_below(10, UNWIND_SEARCH_STEPS, 5, |_| None::<u32>),
            None
        );
    }

    /// A C program whose own functions are described only in `.debug_frame`.
    fn debug_frame_program(dir: &Path) -> std::path::PathBuf {
        let source = dir.join("program.c");
        std::fs::write(
            &source,
            "__attribute__((noinline)) int leaf(int x) { return x * 3 + 1; }\n\
             int main(int argc, char **argv) { (void)argv; return leaf(argc); }\n",
        )
        .unwrap();
        let program = dir.join("program");
        let status = Command::new("gcc")
            .args([
                "-O0",
                "-g",
                "-fno-asynchronous-unwind-tables",
                "-fno-unwind-tables",
                "-o",
            ])
            .arg(&program)
            .arg(&source)
            .status()
            .expect("running gcc");
        assert!(status.success());
        program
    }

    fn objcopy(args: &[&str], from: &Path, to: &Path) {
        let status = Command::new("objcopy")
            .args(args)
            .arg(from)
            .arg(to)
            .status()
            .expect("running objcopy (binutils)");
        assert!(status.success());
    }

    #[test]
    fn debug_frame_fills_in_what_eh_frame_leaves_out_from_the_binary_or_its_debug_file() {
        let dir = tempfile::tempdir().unwrap();
        let program = debug_frame_program(dir.path());
        let bytes = std::fs::read(&program).unwrap();
        let symbol = |name: &str| {
            let file = object::File::parse(bytes.as_slice()).unwrap();
            use object::ObjectSymbol;
            let symbol = file.symbols().find(|s| s.name() == Ok(name)).unwrap();
            (symbol.address(), symbol.size())
        };
        let (main, main_size) = symbol("main");

        // `.eh_frame` has only the C runtime (`_start`, the PLT); `main` is in `.debug_frame`.
        let table = UnwindTable::build(&program, &bytes).unwrap();
        let stats = table.stats();
        assert!(
            stats.eh_frame_fdes > 0 && stats.debug_frame_fdes >= 2,
            "{stats:?}"
        );
        let reference = readelf(&program, &bytes, ".debug_frame");
        let fidelity = compare(&table, &reference, &reference.sample(1));
        assert!(
            fidelity.disagreements.is_empty(),
            "{:#?}",
            fidelity.disagreements
        );
        assert!(fidelity.compared > 8, "{fidelity:?}");
        // -O0 keeps the frame pointer: in main's body the CFA is rbp + 16, rbp at CFA - 16.
        let body = table.lookup(main + main_size / 2).unwrap();
        assert_eq!(
            (
                body.cfa_kind(),
                body.cfa_offset,
                body.fp_kind(),
                body.fp_offset
            ),
            (CfaKind::Fp, 16, FpKind::CfaOffset, -2)
        );

        // Without `.debug_frame`, from the separate debug file; without either, an error.
        let debug = dir.path().join("program.debug");
        objcopy(&["--only-keep-debug"], &program, &debug);
        let stripped = dir.path().join("program.stripped");
        objcopy(
            &["--remove-section=.debug_frame", "--strip-debug"],
            &program,
            &stripped,
        );
        let stripped_bytes = std::fs::read(&stripped).unwrap();
        let without = UnwindTable::build(&stripped, &stripped_bytes).unwrap();
        assert_eq!(without.stats().debug_frame_fdes, 0);
        assert_eq!(without.lookup(main + main_size / 2), None);
        let debug_bytes = std::fs::read(&debug).unwrap();
        let with = UnwindTable::build_with_debug_file(
            &stripped,
            &stripped_bytes,
            Some((&debug, &debug_bytes)),
        )
        .unwrap();
        assert_eq!(with.rows(), table.rows());
        assert_eq!(with.stats().debug_frame_fdes, stats.debug_frame_fdes);

        let bare = dir.path().join("program.bare");
        objcopy(
            &[
                "--remove-section=.eh_frame",
                "--remove-section=.eh_frame_hdr",
            ],
            &stripped,
            &bare,
        );
        let error = UnwindTable::build(&bare, &std::fs::read(&bare).unwrap()).unwrap_err();
        assert!(matches!(error, UnwindError::NoUnwindInfo { .. }), "{error}");
        assert!(error.to_string().contains("program.bare"), "{error}");
    }

    #[test]
    fn other_architectures_and_non_elf_bytes_are_refused_cleanly() {
        use object::write;
        let mut object = write::Object::new(
            object::BinaryFormat::Elf,
            object::Architecture::Riscv64,
            object::Endianness::Little,
        );
        let text = object.section_id(write::StandardSection::Text);
        // `ret`.
        object.append_section_data(text, &[0x67, 0x80, 0x00, 0x00], 4);
        let bytes = object.write().unwrap();
        let error = UnwindTable::build(Path::new("riscv.o"), &bytes).unwrap_err();
        assert!(matches!(error, UnwindError::Architecture { .. }), "{error}");
        assert!(error.to_string().contains("Riscv64"), "{error}");
        let error = UnwindTable::build(Path::new("junk"), b"not an ELF file").unwrap_err();
        assert!(matches!(error, UnwindError::Parse { .. }), "{error}");
    }

    #[test]
    fn corrupt_eh_frame_fails_or_loses_functions_never_panics() {
        let pristine = std::fs::read(LIBC).unwrap();
        let file = object::File::parse(pristine.as_slice()).unwrap();
        let (offset, size) = file
            .section_by_name(".eh_frame")
            .unwrap()
            .file_range()
            .unwrap();
        let whole = UnwindTable::build(Path::new(LIBC), &pristine).unwrap();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut random = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let (mut failed, mut built) = (0, 0);
        for _ in 0..64 {
            let mut bytes = pristine.clone();
            for _ in 0..16 {
                let at = offset + random() % size;
                bytes[at as usize] = random() as u8;
            }
            match UnwindTable::build(Path::new(LIBC), &bytes) {
                Ok(table) => {
                    built += 1;
                    assert!(table.stats().rows <= whole.stats().rows * 2);
                    assert!(table.rows().windows(2).all(|w| w[0].pc < w[1].pc));
                }
                Err(error) => {
                    failed += 1;
                    assert!(error.to_string().contains(".eh_frame"), "{error}");
                }
            }
        }
        println!("corrupted libc .eh_frame: {built} tables built, {failed} refused");
    }
}
