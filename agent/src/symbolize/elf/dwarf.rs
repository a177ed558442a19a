//! Address lookups in a file's DWARF through addr2line: inline frames and file:line, one
//! `Context` per compilation unit a lookup lands in (see [`super::units`]), with the parsed
//! state bounded and dropped when idle, since it is heap that stays for as long as the file is
//! cached.

use std::{
    cell::{Cell, RefCell},
    collections::{hash_map::Entry, HashMap, HashSet},
    sync::Arc,
};

use super::sections::{load_sections, Reader};
use super::symtab::demangle;
use super::units::{build_unit_index, find_unit, unit_dwarf, UnitIndex};
use super::{DwarfLimits, DwarfLoad, DwarfOptions, FileData, OverBudget, ResolvedFrame};
use crate::sys::allocator::release_free_memory;

/// How much DWARF (bytes of `.debug_info` plus `.debug_line` of the units lookups have
/// touched) one file's parsed state may cover before it is dropped and started afresh.
/// addr2line keeps every unit it ever parsed, and its parse costs about 0.8 bytes of heap per
/// byte of those sections; without a bound, a long-lived agent symbolising a large binary
/// would end up holding all of its DWARF in parsed form.
pub(super) const MAX_PARSED_DWARF: usize = 8 << 20;

/// DWARF bytes parsed between two releases of the mapped pages the parses touched.
const RELEASE_EVERY_PARSED: usize = 2 << 20;

/// DWARF of a file, ready for address lookups.
pub(super) struct Dwarf {
    sections: Arc<gimli::Dwarf<Reader>>,
    /// Which unit holds which addresses, built on the first lookup and kept: it is small, and
    /// it lets a lookup parse only the unit it needs.
    index: RefCell<UnitIndex>,
    /// What the index may hold before the file's DWARF is refused.
    limits: DwarfLimits,
    /// Parsed lazily on the first lookup and dropped when it covers more than `budget`.
    parsed: RefCell<Parse>,
    budget: usize,
    /// How many times the parse was dropped and started afresh.
    reparses: Cell<u64>,
    /// Lookups since [`super::ElfFile::release_idle_parse`] last looked.
    recent_lookups: Cell<u64>,
    /// Lookups a unit's own view could not answer (a cross-unit reference): answered by the
    /// whole-file `Context`.
    unit_fallbacks: Cell<u64>,
    /// Bytes of sections read through mappings (in place or inflated): an upper bound on what
    /// lookups can make resident.
    mapped_bytes: usize,
    /// The inflated copies of compressed sections, for releasing their pages.
    inflated: Vec<Arc<FileData>>,
}

/// The key of the whole-file `Context` in [`ParsedDwarf::contexts`].
const WHOLE_FILE: usize = usize::MAX;

/// Where a file's DWARF parse stands.
enum Parse {
    NotYet,
    Parsed(ParsedDwarf),
    /// The unit index could not be read: lookups use the symbol table.
    Unreadable,
}

/// addr2line's lookup state, and which units it has parsed so far.
#[derive(Default)]
struct ParsedDwarf {
    /// One `Context` per unit lookups landed in, by the unit's `.debug_info` offset; or one
    /// for the whole file, under [`WHOLE_FILE`].
    contexts: HashMap<usize, addr2line::Context<Reader>>,
    /// `.debug_info` offsets of the units lookups landed in.
    units: HashSet<usize>,
    /// Sum of those units' `.debug_info` and line-program bytes.
    covered: usize,
    /// `covered` when the pages lookups touched were last let go.
    covered_at_release: usize,
}

impl ParsedDwarf {
    /// Counts the unit of `context` holding `address` as parsed (addr2line has just parsed
    /// it, or had before); `key` names the unit when `context` holds only one, whose offset in
    /// its own view of `.debug_info` is 0.
    /// Returns whether the units parsed since the pages were last let go cover more than
    /// [`RELEASE_EVERY_PARSED`]: each parse touches its unit and its line program, and a
    /// window naming many addresses of one large binary would otherwise hold tens of MiB of
    /// its mapping resident until the window ends.
    fn account(&mut self, key: usize, address: u64) -> bool {
        self.record(key, address);
        if self.covered - self.covered_at_release >= RELEASE_EVERY_PARSED {
            self.covered_at_release = self.covered;
            return true;
        }
        false
    }

    fn record(&mut self, key: usize, address: u64) {
        let Some(context) = self.contexts.get(&key) else {
            return;
        };
        let Some(unit) = context.find_dwarf_and_unit(address).skip_all_loads() else {
            return;
        };
        let offset = match unit.header.offset() {
            _ if key != WHOLE_FILE => key,
            gimli::UnitSectionOffset::DebugInfoOffset(offset) => offset.0,
            _ => return,
        };
        if self.units.insert(offset) {
            let lines = unit
                .line_program
                .as_ref()
                .map_or(0, |p| p.header().raw_program_buf().len());
            self.covered += unit.header.length_including_self() + lines;
        }
    }
}

impl Dwarf {
    /// The DWARF of `file`, whose bytes are `data`, read as `options` say.
    pub(super) fn load(
        file: &object::File<'_>,
        data: &Arc<FileData>,
        options: &DwarfOptions,
    ) -> Result<DwarfLoad<Dwarf>, gimli::Error> {
        let loaded = match load_sections(file, data, options)? {
            DwarfLoad::Loaded(loaded) => loaded,
            DwarfLoad::Absent => return Ok(DwarfLoad::Absent),
            DwarfLoad::OverBudget(over) => return Ok(DwarfLoad::OverBudget(over)),
        };
        Ok(DwarfLoad::Loaded(Dwarf {
            sections: Arc::new(loaded.dwarf),
            index: RefCell::new(UnitIndex::NotYet),
            limits: options.limits,
            parsed: RefCell::new(Parse::NotYet),
            budget: MAX_PARSED_DWARF,
            reparses: 0.into(),
            recent_lookups: 0.into(),
            unit_fallbacks: 0.into(),
            mapped_bytes: loaded.mapped_bytes,
            inflated: loaded.inflated,
        }))
    }

    /// Hands over the inflated sections, for the owner to keep with its other mappings.
    pub(super) fn take_inflated(&mut self) -> Vec<Arc<FileData>> {
        std::mem::take(&mut self.inflated)
    }

    pub(super) fn mapped_bytes(&self) -> usize {
        self.mapped_bytes
    }

    pub(super) fn set_budget(&mut self, bytes: usize) {
        self.budget = bytes;
    }

    pub(super) fn reparses(&self) -> u64 {
        self.reparses.get()
    }

    /// Why the unit index refused the file's DWARF, once a lookup has built it.
    pub(super) fn refused(&self) -> Option<OverBudget> {
        match &*self.index.borrow() {
            UnitIndex::OverBudget(over) => Some(*over),
            _ => None,
        }
    }

    /// See [`super::ElfFile::release_idle_parse`].
    pub(super) fn release_idle_parse(&self) -> bool {
        let idle = self.recent_lookups.replace(0) == 0;
        let mut slot = self.parsed.borrow_mut();
        if idle && matches!(&*slot, Parse::Parsed(_)) {
            *slot = Parse::NotYet;
            return true;
        }
        false
    }

    /// See [`super::ElfFile::use_whole_file_dwarf`].
    pub(super) fn use_whole_file(&self) {
        *self.index.borrow_mut() = UnitIndex::WholeFile;
        *self.parsed.borrow_mut() = Parse::NotYet;
    }

    /// DWARF frames at `address`, through the parsed state, which is started afresh once it
    /// covers too much. `release_pages` lets go of the pages lookups made resident in every
    /// mapping the file reads (binary, debug file, inflated sections), not only this DWARF's.
    pub(super) fn frames(
        &self,
        address: u64,
        symbol: Option<&str>,
        release_pages: impl Fn(),
    ) -> Result<Vec<ResolvedFrame>, gimli::Error> {
        self.recent_lookups.set(self.recent_lookups.get() + 1);
        let (span, cross_refs) = {
            let mut index = self.index.borrow_mut();
            if matches!(&*index, UnitIndex::NotYet) {
                *index = build_unit_index(&self.sections, &self.limits, &release_pages)
                    .unwrap_or(UnitIndex::WholeFile);
                // Indexing read a little of every unit (header, root entry, abbreviations);
                // the lookups that follow need few of those pages again.
                release_pages();
            }
            match &*index {
                UnitIndex::Units {
                    spans, cross_refs, ..
                } => match find_unit(spans, address) {
                    Some(span) => (Some(span), *cross_refs),
                    // No unit covers it: nothing DWARF could say.
                    None => return Ok(Vec::new()),
                },
                // Refused: the symbol table names every frame.
                UnitIndex::OverBudget(_) => return Ok(Vec::new()),
                UnitIndex::NotYet | UnitIndex::WholeFile => (None, false),
            }
        };
        let mut slot = self.parsed.borrow_mut();
        if matches!(&*slot, Parse::Parsed(parsed) if parsed.covered > self.budget) {
            // Dropping the parse frees its heap; the pages it read go too, and what the next
            // lookups need is parsed again (a unit's parse costs well under a millisecond).
            *slot = Parse::NotYet;
            release_pages();
            release_free_memory();
            self.reparses.set(self.reparses.get() + 1);
        }
        if matches!(&*slot, Parse::NotYet) {
            *slot = Parse::Parsed(ParsedDwarf::default());
        }
        let Parse::Parsed(parsed) = &mut *slot else {
            return Ok(Vec::new());
        };
        if let Some(span) = span {
            let key = span.offset;
            if let Entry::Vacant(entry) = parsed.contexts.entry(key) {
                let index = self.index.borrow();
                let all_units = match &*index {
                    UnitIndex::Units {
                        cross_refs: true,
                        units,
                        ..
                    } => Some(units.as_slice()),
                    _ => None,
                };
                let unit = unit_dwarf(&self.sections, &span, all_units);
                if let Some(context) =
                    unit.and_then(|unit| addr2line::Context::from_arc_dwarf(Arc::new(unit)).ok())
                {
                    entry.insert(context);
                }
            }
            if let Some(context) = parsed.contexts.get(&key) {
                match dwarf_frames(context, address, symbol) {
                    Ok(frames) => {
                        if parsed.account(key, address) {
                            release_pages();
                        }
                        return Ok(frames);
                    }
                    // Without cross-unit references the unit's view is all there is.
                    Err(err) if !cross_refs => return Err(err),
                    // The frame refers to another unit: the whole file can answer.
                    Err(_) => self.unit_fallbacks.set(self.unit_fallbacks.get() + 1),
                }
            }
        }
        // Not the entry API: a failed build replaces the slot the entry would borrow.
        #[allow(clippy::map_entry)]
        if !parsed.contexts.contains_key(&WHOLE_FILE) {
            let built = addr2line::Context::from_arc_dwarf(self.sections.clone());
            // The whole-file index read a little of every unit.
            release_pages();
            match built {
                Ok(context) => {
                    parsed.contexts.insert(WHOLE_FILE, context);
                }
                Err(err) => {
                    *slot = Parse::Unreadable;
                    return Err(err);
                }
            }
        }
        let frames = match parsed.contexts.get(&WHOLE_FILE) {
            Some(context) => dwarf_frames(context, address, symbol),
            None => Ok(Vec::new()),
        };
        if parsed.account(WHOLE_FILE, address) {
            release_pages();
        }
        frames
    }
}

fn dwarf_frames(
    context: &addr2line::Context<Reader>,
    address: u64,
    symbol: Option<&str>,
) -> Result<Vec<ResolvedFrame>, gimli::Error> {
    let mut frames = Vec::new();
    let mut iter = context.find_frames(address).skip_all_loads()?;
    while let Some(frame) = iter.next()? {
        let system_name = match &frame.function {
            Some(function) => function.raw_name()?.into_owned(),
            None => String::new(),
        };
        let function = match &frame.function {
            Some(function) => function.demangle()?.into_owned(),
            None => String::new(),
        };
        let (file, line) = frame.location.map_or((None, 0), |l| {
            (l.file.map(str::to_owned), l.line.unwrap_or(0))
        });
        frames.push(ResolvedFrame {
            function,
            system_name,
            file,
            line,
            go: false,
        });
    }
    // The outermost frame is the real function: when DWARF has no name for it (some
    // compilers only give the inlined ones names), the symbol table does.
    if let (Some(outer), Some(symbol)) = (frames.last_mut(), symbol) {
        if outer.function.is_empty() {
            outer.function = demangle(symbol).into_owned();
            outer.system_name = symbol.to_owned();
        }
    }
    frames.retain(|f| !f.function.is_empty());
    Ok(frames)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{binary::address::ElfAddress, symbolize::elf::ElfFile};
    use std::path::{Path, PathBuf};

    #[test]
    fn bounded_parse_resolves_the_same_frames() {
        // With a budget of one byte the parse is dropped before every lookup: the frames
        // must not change, only the work to find them.
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        // Unbounded indeed: a release build of these tests carries more DWARF than the
        // default budget, which made the reference reparse too.
        let mut unbounded = ElfFile::open(&exe).unwrap();
        unbounded.set_dwarf_parse_budget(usize::MAX);
        let mut bounded = ElfFile::open(&exe).unwrap();
        bounded.set_dwarf_parse_budget(1);
        let addresses: Vec<ElfAddress> = unbounded
            .symbols
            .functions()
            .iter()
            .step_by(97)
            .take(60)
            .map(|s| ElfAddress(s.start + 1))
            .collect();
        let mut with_lines = 0;
        for &address in &addresses {
            let expected = unbounded.resolve(address);
            with_lines += usize::from(
                expected
                    .as_ref()
                    .is_ok_and(|frames| frames.iter().any(|f| f.line > 0)),
            );
            assert_eq!(bounded.resolve(address), expected, "at {address:?}");
        }
        assert!(with_lines > 30, "only {with_lines} addresses had lines");
        // Every lookup that found a unit put it over budget for the next one.
        assert!(bounded.dwarf_reparses() >= with_lines as u64 - 1);
        assert_eq!(unbounded.dwarf_reparses(), 0);
    }

    /// Builds a C program of three units, with inlined static helpers, at -O2 with DWARF.
    fn three_unit_program(dir: &Path) -> PathBuf {
        for (unit, seed) in [("a", 3), ("b", 5), ("c", 7)] {
            let source = format!(
                "static inline int helper_{unit}(int x) {{ return x * {seed} + (x >> 2); }}\n\
                 int work_{unit}(int n) {{ int s = 0; for (int i = 0; i < n; i++) \
                 s += helper_{unit}(i ^ s); return s; }}\n\
                 int more_{unit}(int n) {{ return work_{unit}(n) + helper_{unit}(n); }}\n"
            );
            std::fs::write(dir.join(format!("{unit}.c")), source).unwrap();
        }
        std::fs::write(
            dir.join("main.c"),
            "int more_a(int); int more_b(int); int more_c(int);\n\
             int main(int argc, char **argv) { return more_a(argc) + more_b(argc) + more_c(argc); }\n",
        )
        .unwrap();
        let binary = dir.join("three-units");
        let status = std::process::Command::new("gcc")
            .args(["-O2", "-g", "-o"])
            .arg(&binary)
            .args(["main.c", "a.c", "b.c", "c.c"].map(|f| dir.join(f)))
            .status()
            .unwrap();
        assert!(status.success());
        binary
    }

    #[test]
    fn unit_lookups_resolve_what_the_whole_file_does() {
        let dir = tempfile::tempdir().unwrap();
        let binary = three_unit_program(dir.path());
        let by_unit = ElfFile::open(&binary).unwrap();
        let whole = ElfFile::open(&binary).unwrap();
        whole.use_whole_file_dwarf();
        // Every byte of every function: starts, inlined bodies, ends, and the gaps between.
        let mut addresses = Vec::new();
        for symbol in by_unit.symbols.functions() {
            for offset in 0..u64::from(symbol.size.max(1)) + 4 {
                addresses.push(ElfAddress(symbol.start + offset));
            }
        }
        let mut inlined = 0;
        for &address in &addresses {
            let expected = whole.resolve(address);
            inlined += usize::from(expected.as_ref().is_ok_and(|f| f.len() > 1));
            assert_eq!(by_unit.resolve(address), expected, "at {address:?}");
        }
        assert!(inlined > 10, "only {inlined} addresses in inlined code");
        // The per-unit path is the one that ran: one context per unit looked up.
        let dwarf = by_unit.dwarf.as_ref().unwrap();
        let UnitIndex::Units { spans, .. } = &*dwarf.index.borrow() else {
            panic!("a C program without cross-unit references fell back to the whole file");
        };
        assert!(spans.len() >= 4, "{spans:?}");
        let Parse::Parsed(parsed) = &*dwarf.parsed.borrow() else {
            panic!("nothing parsed");
        };
        assert!(parsed.contexts.len() >= 4 && !parsed.contexts.contains_key(&WHOLE_FILE));
    }

    #[test]
    fn unit_lookups_with_cross_unit_references_resolve_what_the_whole_file_does() {
        // This test binary is Rust: its units refer to each other's entries.
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let by_unit = ElfFile::open(&exe).unwrap();
        let whole = ElfFile::open(&exe).unwrap();
        whole.use_whole_file_dwarf();
        let addresses: Vec<ElfAddress> = by_unit
            .symbols
            .functions()
            .iter()
            .step_by(23)
            .take(400)
            .flat_map(|s| [s.start, s.start + u64::from(s.size) / 2])
            .map(ElfAddress)
            .collect();
        let mut inlined = 0;
        for &address in &addresses {
            let expected = whole.resolve(address);
            inlined += usize::from(expected.as_ref().is_ok_and(|f| f.len() > 1));
            assert_eq!(by_unit.resolve(address), expected, "at {address:?}");
        }
        assert!(inlined > 20, "only {inlined} addresses in inlined code");
        let dwarf = by_unit.dwarf.as_ref().unwrap();
        assert!(matches!(
            &*dwarf.index.borrow(),
            UnitIndex::Units {
                cross_refs: true,
                ..
            }
        ));
        // Most lookups were answered by their unit alone.
        let fallbacks = dwarf.unit_fallbacks.get();
        assert!(
            fallbacks < addresses.len() as u64 / 20,
            "{fallbacks} of {} lookups needed the whole file",
            addresses.len()
        );
    }
}
