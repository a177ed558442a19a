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
    BaseAddresses, CfaRule, CieOrFde, CommonInformationEntry, EndianSlice, Expression,
    LittleEndian, Operation, ReaderOffset, Register, RegisterRule, UnwindContext,
    UnwindContextStorage, UnwindOffset, UnwindSection, UnwindTableRow,
};

use super::{
    index::{overlaps, Entry, FunctionIndex, Source},
    row::{self, Cfa, FpRule, UnwindRow},
    Code, UnwindError,
};
pub(super) use x86_64::{go_frame, go_stack_bottom};
use x86_64::{plt_cfa, return_address_where_read, signal_cfa, sp_offset, FP, RA, SP};

mod x86_64;

pub(super) type Slice<'data> = EndianSlice<'data, LittleEndian>;

/// Most rows one table may hold before its optimisation, 64 MiB of them: a crafted section
/// (one row per byte of CFI) cannot make the agent allocate without bound. ClickHouse, the
/// largest binary the anchors report, has 2.79 M.
pub(super) const MAX_ROWS: usize = 8 << 20;

/// Where gimli keeps a row's register rules while it runs a CFI program. Its default has room
/// for 192 rules, and every FDE starts from a fresh row that is built and moved whole: 6 KiB
/// copied per FDE, a seventh of libc's build time. x86_64 CFI names at most its 16 general
/// registers and rip (a signal frame names them all), so 32 leave room; an FDE naming more
/// fails alone, counted as skipped.
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
        let ra_is_rip = fde.cie().return_address_register() == RA;
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
                let (cfa, rbp) = rule_of(dwarf_row, section, encoding, signal, ra_is_rip);
                rows.push(row::narrow(code.pc(dwarf_row.start_address()), cfa, rbp));
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

/// The CFA and rbp rules of one DWARF row.
fn rule_of<'data, S>(
    dwarf_row: &UnwindTableRow<usize, RuleStorage>,
    section: &S,
    encoding: gimli::Encoding,
    signal: bool,
    ra_is_rip: bool,
) -> (Cfa, FpRule)
where
    S: UnwindSection<Slice<'data>>,
{
    let expression = |expression: &gimli::UnwindExpression<usize>| expression.get(section).ok();
    let ra = dwarf_row.register(RA);
    let cfa = match dwarf_row.cfa() {
        CfaRule::RegisterAndOffset {
            register: SP,
            offset,
        } => Cfa::Sp(*offset),
        CfaRule::RegisterAndOffset {
            register: FP,
            offset,
        } => Cfa::Fp(*offset),
        CfaRule::RegisterAndOffset { .. } => Cfa::Unsupported,
        CfaRule::Expression(cfa) => match expression(cfa) {
            Some(cfa) if signal => signal_cfa(cfa, encoding).unwrap_or(Cfa::Unsupported),
            Some(cfa) => plt_cfa(cfa, encoding).unwrap_or(Cfa::Unsupported),
            None => Cfa::Unsupported,
        },
    };
    // The BPF side reads the return address where these kinds put it; a row that keeps it
    // anywhere else (`setcontext`'s, `__start_context`'s) is one it cannot unwind. An
    // undefined one ends the walk (below), and the CFA stays as DWARF gives it.
    let ra_where_expected = ra == RegisterRule::Undefined
        || ra_is_rip && return_address_where_read(&ra, cfa, expression, encoding);
    let cfa = if ra_where_expected {
        cfa
    } else {
        Cfa::Unsupported
    };
    let rbp = match dwarf_row.register(FP) {
        // gimli reports a register without a rule as undefined; rbp is callee-saved, so no
        // rule means the caller's value is still in it.
        RegisterRule::Undefined | RegisterRule::SameValue => FpRule::Unchanged,
        RegisterRule::Offset(offset) => FpRule::CfaOffset(offset),
        RegisterRule::Expression(at) => {
            match expression(&at).and_then(|at| sp_offset(at, encoding)) {
                Some(offset) => FpRule::AtSp(offset),
                None => FpRule::Unsupported,
            }
        }
        _ => FpRule::Unsupported,
    };
    // Checked first by the unwinder: the outermost frame ends the walk, whatever else it says.
    let rbp = if ra == RegisterRule::Undefined {
        FpRule::ReturnAddressUndefined
    } else {
        rbp
    };
    (cfa, rbp)
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
