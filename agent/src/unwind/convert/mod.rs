//! `.eh_frame` or `.debug_frame` to rows: every FDE's CFI program run through gimli's
//! `UnwindTable`, each row of it narrowed to the few rules the BPF unwinder evaluates.
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
    /// FDEs whose rows were taken.
    pub converted: usize,
    /// FDEs left out: unreadable (a bad CIE, a CFI program gimli refuses), or covering
    /// addresses outside the executable segments (FDEs of code the linker discarded). Their
    /// addresses get no row.
    pub skipped: usize,
    /// FDEs left out because an earlier section already covers their code.
    pub claimed: usize,
}

/// The rows of every section converted so far, in section order, and where each function's
/// rows are: what [`super::optimize`] sorts.
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

impl Converted {
    /// Room for the rows a section of `bytes` usually gives (glibc's `.eh_frame` has a row
    /// per 5 to 6 bytes), so that converting rarely grows the vector.
    pub fn reserve_for(&mut self, bytes: usize) {
        self.rows.reserve((bytes / 4).min(MAX_ROWS));
        self.functions.reserve(bytes / 40);
    }

    /// The pcs the functions so far cover, sorted and disjoint: what a later section may not
    /// claim again.
    pub fn covered(&self) -> Vec<(u32, u32)> {
        let mut ranges: Vec<(u32, u32)> = self.functions.iter().map(|f| (f.start, f.end)).collect();
        ranges.sort_unstable();
        ranges.dedup_by(|range, previous| {
            if range.0 <= previous.1 {
                previous.1 = previous.1.max(range.1);
                true
            } else {
                false
            }
        });
        ranges
    }
}

/// True when `[start, end)` meets any of `ranges` (sorted, disjoint).
pub(super) fn overlaps(ranges: &[(u32, u32)], start: u32, end: u32) -> bool {
    // The last range starting before `end` is also the one reaching furthest.
    let before_end = ranges.partition_point(|range| range.0 < end);
    before_end > 0 && ranges[before_end - 1].1 > start
}

/// Appends the rows of every FDE in `source` to `converted`, each function's followed by an
/// end-of-function marker. FDEs that overlap `claimed` (pcs an earlier section covers, as
/// [`Converted::covered`] gives them) are left out.
pub(super) fn convert<'data, S>(
    source: &Section<'_, S>,
    code: &Code,
    claimed: &[(u32, u32)],
    converted: &mut Converted,
) -> Result<FdeCounts, UnwindError>
where
    S: UnwindSection<Slice<'data>>,
{
    let section_error = |source_error| UnwindError::Section {
        path: source.path.to_owned(),
        section: source.name,
        source: source_error,
    };
    let section = &source.section;
    let bases = &source.bases;
    let rows = &mut converted.rows;
    let mut counts = FdeCounts::default();
    // CIEs are few (glibc has three) and shared by thousands of FDEs: parse each once.
    let mut cies: HashMap<usize, CommonInformationEntry<Slice<'data>>> = HashMap::new();
    let mut context = Box::new(UnwindContext::<usize, RuleStorage>::new_in());
    let mut entries = section.entries(bases);
    // A broken entry header leaves no way to find the next entry: that is the section's error.
    while let Some(entry) = entries.next().map_err(section_error)? {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let fde = partial.parse(|section, bases, offset| {
            let key = UnwindOffset::into(offset);
            if let Some(cie) = cies.get(&key) {
                return Ok(cie.clone());
            }
            let cie = section.cie_from_offset(bases, offset)?;
            cies.insert(key, cie.clone());
            Ok(cie)
        });
        let Ok(fde) = fde else {
            counts.skipped += 1;
            continue;
        };
        let (start, end) = (fde.initial_address(), fde.end_address());
        if start >= end || !code.covers(start, end) {
            counts.skipped += 1;
            continue;
        }
        let (start_pc, end_pc) = (code.pc(start), code.pc(end));
        if overlaps(claimed, start_pc, end_pc) {
            counts.claimed += 1;
            continue;
        }
        let signal = fde.is_signal_trampoline();
        let encoding = fde.cie().encoding();
        let ra_is_rip = fde.cie().return_address_register() == RA;
        let first_row = rows.len();
        // Checked row by row: one FDE's program can run as long as the section.
        let mut too_many = false;
        let read = (|| -> gimli::Result<()> {
            let mut table = fde.rows(section, bases, &mut context)?;
            while let Some(dwarf_row) = table.next_row()? {
                if rows.len() >= MAX_ROWS {
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
                path: source.path.to_owned(),
                section: source.name,
                limit: MAX_ROWS,
            });
        }
        if read.is_err() {
            rows.truncate(first_row);
            counts.skipped += 1;
            continue;
        }
        rows.push(row::no_row(end_pc));
        converted.functions.push(Function {
            start: start_pc,
            end: end_pc,
            first_row,
            end_row: rows.len(),
        });
        counts.converted += 1;
    }
    Ok(counts)
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
