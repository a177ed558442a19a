//! `.eh_frame` or `.debug_frame` to rows, in two passes: [`index`] reads the FDE headers into
//! the table's function index; [`FdeRows`] then runs one FDE's CFI program at a time, in pc
//! order, through gimli's `UnwindTable`, each row of it narrowed to the few rules the BPF
//! unwinder evaluates.
//!
//! DWARF expressions are never evaluated: the two the BPF side knows (the `.plt` CFA, and the
//! signal trampoline's registers in the `ucontext`) are recognised by their exact operations,
//! and any other expression makes its row unsupported.

use std::{collections::HashMap, path::Path};

use gimli::{
    BaseAddresses, CieOrFde, CommonInformationEntry, EndianSlice, Expression, LittleEndian,
    Operation, ReaderOffset, Register, RegisterRule, UnwindContext, UnwindContextStorage,
    UnwindOffset, UnwindSection, UnwindTableRow,
};

use super::{
    index::{overlaps, Entry, FunctionIndex, Source},
    row::{self, UnwindRow},
    Code, UnwindError,
};
pub(super) use x86_64::go_stack_bottom;

mod aarch64;
mod x86_64;

/// The architectures whose CFI becomes rows: each names its own registers and reads its own
/// rules (`x86_64.rs`, `aarch64.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Arch {
    X86_64,
    Aarch64,
}

impl Arch {
    /// The architecture of a file, when its rows can be read: 64-bit little-endian x86-64 or
    /// arm64.
    pub fn of(file: &object::File<'_>) -> Option<Arch> {
        use object::Object;
        if !file.is_little_endian() || !file.is_64() {
            return None;
        }
        match file.architecture() {
            object::Architecture::X86_64 => Some(Arch::X86_64),
            object::Architecture::Aarch64 => Some(Arch::Aarch64),
            _ => None,
        }
    }

    /// How gimli must read the architecture's CFI: arm64's `DW_CFA_AARCH64_negate_ra_state`
    /// shares its opcode with SPARC's `DW_CFA_GNU_window_save`, and gimli refuses every FDE of
    /// a function that signs its return address unless told the vendor.
    pub fn vendor(self) -> gimli::Vendor {
        match self {
            Arch::X86_64 => gimli::Vendor::Default,
            Arch::Aarch64 => gimli::Vendor::AArch64,
        }
    }

    /// A Go function's rule where it has moved the stack pointer `delta` bytes below its
    /// entry (its `pcsp` table).
    pub fn go_frame(self, delta: i32) -> (row::Cfa, row::FpRule, row::RaKind) {
        match self {
            Arch::X86_64 => {
                let (cfa, fp) = x86_64::go_frame(delta);
                (cfa, fp, row::RaKind::CfaMinus8)
            }
            Arch::Aarch64 => aarch64::go_frame(delta),
        }
    }

    /// The architecture's generated rows for code no CFI describes (`aarch64::generated`).
    pub fn generated(self, file: &object::File<'_>, code: &Code) -> Vec<Generated> {
        match self {
            Arch::X86_64 => Vec::new(),
            Arch::Aarch64 => aarch64::generated(file, code),
        }
    }
}

/// Rows the agent writes for code that has no CFI but a rule it knows (arm64's `.plt` stubs,
/// its vDSO's signal trampoline): one function each, its end-of-function marker last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Generated {
    pub start: u32,
    pub end: u32,
    pub rows: Vec<UnwindRow>,
}

/// Adds the generated functions to `index` (as [`Source::Generated`], `at` their position in
/// `generated`), where no earlier section claimed their code.
pub(super) fn index_generated(generated: &[Generated], index: &mut FunctionIndex) -> FdeCounts {
    let claimed = index.covered();
    let mut counts = FdeCounts::default();
    for (at, function) in generated.iter().enumerate() {
        if overlaps(&claimed, function.start, function.end) {
            counts.claimed += 1;
            continue;
        }
        index.push(Entry {
            start: function.start,
            end: function.end,
            at: at as u32,
            source: Source::Generated,
        });
        counts.converted += 1;
    }
    counts
}

pub(super) type Slice<'data> = EndianSlice<'data, LittleEndian>;

/// Most rows one table may hold before its optimisation, 64 MiB of them: a crafted section
/// (one row per byte of CFI) cannot make the agent allocate without bound. ClickHouse, the
/// largest binary the anchors report, has 2.79 M.
pub(super) const MAX_ROWS: usize = 8 << 20;

/// Where gimli keeps a row's register rules while it runs a CFI program. Its default has room
/// for 192 rules, and every FDE starts from a fresh row that is built and moved whole: 6 KiB
/// copied per FDE, a seventh of libc's build time. x86_64 CFI names at most its 16 general
/// registers and rip (a signal frame names them all), arm64's its 12 callee-saved general
/// registers, 8 vector registers and the return address's signing state, so 32 leave room;
/// an FDE naming more fails alone, counted as skipped.
struct RuleStorage;

impl<T: ReaderOffset> UnwindContextStorage<T> for RuleStorage {
    type Rules = [(Register, RegisterRule<T>); 32];
    /// As gimli's default: `DW_CFA_remember_state` nests at most this deep.
    type Stack = Box<[UnwindTableRow<T, Self>; 4]>;
}

/// One CFI section, named for errors.
pub(super) struct Section<'a, S> {
    pub section: S,
    pub bases: BaseAddresses,
    /// The file it was read from.
    pub path: &'a Path,
    /// `.eh_frame` or `.debug_frame`.
    pub name: &'static str,
    /// Whose registers its rules name.
    pub arch: Arch,
}

/// What happened to the FDEs of a section.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct FdeCounts {
    /// FDEs whose rows were taken: in the first pass, those the index took; the second
    /// counts the ones whose program it then cannot run as skipped instead.
    pub converted: usize,
    /// FDEs left out: unreadable (a bad CIE, a CFI program gimli refuses), or covering
    /// addresses outside the executable segments (FDEs of code the linker discarded). Their
    /// addresses get no row.
    pub skipped: usize,
    /// FDEs left out because an earlier section already covers their code.
    pub claimed: usize,
}

/// The rows of functions converted together, and where each function's rows are: a cluster
/// of overlapping functions that [`super::optimize`] sorts row by row, or (in the tests) a
/// whole table.
#[derive(Debug, Default)]
pub(super) struct Converted {
    pub rows: Vec<UnwindRow>,
    pub functions: Vec<Function>,
}

/// One converted FDE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Function {
    /// Its first and past-the-end pcs (offsets from the table's base).
    pub start: u32,
    pub end: u32,
    /// Its rows in [`Converted::rows`], sorted by pc, its end-of-function marker last.
    pub first_row: usize,
    pub end_row: usize,
}

/// CIEs are few (glibc has three) and shared by thousands of FDEs: each is parsed once.
type Cies<'data> = HashMap<usize, CommonInformationEntry<Slice<'data>>>;

/// The CIE at `offset`, from `cies` or parsed into it.
fn cie<'data, S>(
    cies: &mut Cies<'data>,
    section: &S,
    bases: &BaseAddresses,
    offset: S::Offset,
) -> gimli::Result<CommonInformationEntry<Slice<'data>>>
where
    S: UnwindSection<Slice<'data>>,
{
    let key = UnwindOffset::into(offset);
    if let Some(cie) = cies.get(&key) {
        return Ok(cie.clone());
    }
    let cie = section.cie_from_offset(bases, offset)?;
    cies.insert(key, cie.clone());
    Ok(cie)
}

/// The first pass over a section: adds each FDE of `source` to `index` as `from`'s, from its
/// header alone, unless it overlaps `claimed` (pcs an earlier section covers, as
/// [`FunctionIndex::covered`] gives them) or lies outside the code.
pub(super) fn index<'data, S>(
    source: &Section<'_, S>,
    from: Source,
    code: &Code,
    claimed: &[(u32, u32)],
    index: &mut FunctionIndex,
) -> Result<FdeCounts, UnwindError>
where
    S: UnwindSection<Slice<'data>>,
{
    let section_error = |source_error| UnwindError::Section {
        path: source.path.to_owned(),
        section: source.name,
        source: source_error,
    };
    let mut counts = FdeCounts::default();
    let mut cies = Cies::new();
    let mut entries = source.section.entries(&source.bases);
    // A broken entry header leaves no way to find the next entry: that is the section's error.
    while let Some(entry) = entries.next().map_err(section_error)? {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let fde = partial.parse(|section, bases, offset| cie(&mut cies, section, bases, offset));
        let Ok(fde) = fde else {
            counts.skipped += 1;
            continue;
        };
        let (start, end) = (fde.initial_address(), fde.end_address());
        let at = u32::try_from(fde.offset());
        let (true, Ok(at)) = (start < end && code.covers(start, end), at) else {
            counts.skipped += 1;
            continue;
        };
        let (start, end) = (code.pc(start), code.pc(end));
        if overlaps(claimed, start, end) {
            counts.claimed += 1;
            continue;
        }
        index.push(Entry {
            start,
            end,
            at,
            source: from,
        });
        counts.converted += 1;
    }
    Ok(counts)
}

/// The second pass over a section: the rows of one FDE at a time, as the index asks for them.
pub(super) struct FdeRows<'s, 'data, S> {
    source: &'s Section<'s, S>,
    cies: Cies<'data>,
    context: Box<UnwindContext<usize, RuleStorage>>,
}

impl<'s, 'data, S> FdeRows<'s, 'data, S>
where
    S: UnwindSection<Slice<'data>>,
{
    pub fn new(source: &'s Section<'s, S>) -> Self {
        FdeRows {
            source,
            cies: Cies::new(),
            context: Box::new(UnwindContext::new_in()),
        }
    }

    /// Appends the rows of the FDE at offset `at` (one [`index`] took), then its
    /// end-of-function marker, to `rows`; false, with `rows` as it was, when its program
    /// cannot be run (the FDE is skipped). More than `room` rows is the table's error.
    pub fn rows(
        &mut self,
        at: u32,
        code: &Code,
        rows: &mut Vec<UnwindRow>,
        room: usize,
    ) -> Result<bool, UnwindError> {
        let Section {
            section,
            bases,
            path,
            name,
            arch,
        } = self.source;
        let cies = &mut self.cies;
        let offset = S::Offset::from(at as usize);
        let fde = section.fde_from_offset(bases, offset, |section, bases, offset| {
            cie(cies, section, bases, offset)
        });
        let Ok(fde) = fde else {
            return Ok(false);
        };
        let signal = fde.is_signal_trampoline();
        let encoding = fde.cie().encoding();
        let return_address = fde.cie().return_address_register();
        let outermost_from = match arch {
            Arch::X86_64 => None,
            Arch::Aarch64 => aarch64::outermost_from(&fde, section, bases),
        };
        let first_row = rows.len();
        // Checked row by row: one FDE's program can run as long as the section.
        let mut too_many = false;
        let context = &mut self.context;
        let read = (|| -> gimli::Result<()> {
            let mut table = fde.rows(section, bases, context)?;
            while let Some(dwarf_row) = table.next_row()? {
                if rows.len() >= room {
                    too_many = true;
                    break;
                }
                if dwarf_row.start_address() >= dwarf_row.end_address() {
                    continue;
                }
                let (cfa, rbp, ra) = match arch {
                    Arch::X86_64 => {
                        let ra_is_rip = return_address == x86_64::RA;
                        x86_64::rule_of(dwarf_row, section, encoding, signal, ra_is_rip)
                    }
                    Arch::Aarch64 => {
                        let outermost =
                            outermost_from.is_some_and(|from| dwarf_row.start_address() >= from);
                        aarch64::rule_of(dwarf_row, return_address, outermost)
                    }
                };
                let pc = code.pc(dwarf_row.start_address());
                rows.push(row::narrow(pc, cfa, rbp, ra));
            }
            Ok(())
        })();
        if too_many {
            return Err(UnwindError::TooManyRows {
                path: path.to_path_buf(),
                section: name,
                limit: MAX_ROWS,
            });
        }
        if read.is_err() {
            rows.truncate(first_row);
            return Ok(false);
        }
        rows.push(row::no_row(code.pc(fde.end_address())));
        Ok(true)
    }
}

/// The operations of an expression of at most `MAX_OPERATIONS`, or `None` when it is longer
/// or malformed: every expression the BPF side knows is short, so a longer one is unsupported
/// without reading it all.
pub(super) fn operations<'data>(
    expression: Expression<Slice<'data>>,
    encoding: gimli::Encoding,
) -> Option<Vec<Operation<Slice<'data>>>> {
    const MAX_OPERATIONS: usize = 9;
    let mut iter = expression.operations(encoding);
    let mut operations = Vec::new();
    while let Some(operation) = iter.next().ok()? {
        if operations.len() == MAX_OPERATIONS {
            return None;
        }
        operations.push(operation);
    }
    Some(operations)
}
