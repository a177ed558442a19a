//! A library with a table of about a million rows, generated here (an ELF file whose
//! `.eh_frame` is written byte by byte, its FDEs in shuffled order): its build holds the heap
//! under a bound stated in the table's own size, and gives the rows the whole-table merge
//! gives, each function's rules where the generator put them.

use std::path::Path;

use super::{
    convert::{Converted, Function},
    optimize::optimize,
    row::{narrow, no_row, Cfa, FpRule, RaKind},
    UnwindTable,
};
use crate::sys::allocator::counting::peak_heap;

/// About four and a half rows each once merged: a million rows.
const FUNCTIONS: usize = 220_000;
/// Where the first function starts.
const TEXT: u64 = 0x1000;
/// Where `.eh_frame` sits in the file.
const EH_FRAME_OFFSET: usize = 0x100;

/// One function of the library: its code, and its rules as `(offset, CFA offset from rsp,
/// rbp saved at CFA - 16)`.
struct Generated {
    start: u64,
    len: u64,
    steps: Vec<(u64, i64, bool)>,
}

impl Generated {
    fn rows(&self) -> Vec<scorch_common::UnwindRow> {
        let mut rows: Vec<_> = self
            .steps
            .iter()
            .map(|&(offset, cfa, saved)| {
                let rbp = if saved {
                    FpRule::CfaOffset(-16)
                } else {
                    FpRule::Unchanged
                };
                narrow(
                    (self.start + offset) as u32,
                    Cfa::Sp(cfa),
                    rbp,
                    RaKind::CfaMinus8,
                )
            })
            .collect();
        rows.push(no_row((self.start + self.len) as u32));
        rows
    }
}

/// xorshift64: the same library every run.
struct Random(u64);

impl Random {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Functions as a compiler lays them out: a push of rbp, up to five more pushes, a return;
/// most right after the one before, a quarter after a gap of padding.
fn functions(random: &mut Random) -> Vec<Generated> {
    let mut at = TEXT;
    (0..FUNCTIONS)
        .map(|_| {
            at += 16 * u64::from(random.below(4) == 0);
            let pushes = random.below(6);
            let len = 8 + 3 * pushes;
            let mut steps = vec![(0, 8, false), (1, 16, true)];
            steps.extend((0..pushes).map(|j| (4 + 3 * j, 24 + 8 * j as i64, true)));
            steps.push((len - 1, 8, false));
            let function = Generated {
                start: at,
                len,
                steps,
            };
            at += len;
            function
        })
        .collect()
}

/// `.eh_frame`: one CIE, then an FDE for each function in `order`, pc-absolute 4-byte
/// pointers.
fn eh_frame(functions: &[Generated], order: &[usize]) -> Vec<u8> {
    fn entry(out: &mut Vec<u8>, body: &[u8]) {
        let padded = body.len().next_multiple_of(4);
        out.extend_from_slice(&(padded as u32).to_le_bytes());
        out.extend_from_slice(body);
        out.resize(out.len() + padded - body.len(), 0); // DW_CFA_nop
    }
    let mut out = Vec::new();
    // Version 1, "zR", code alignment 1, data alignment -8, return address in r16, FDE
    // pointers DW_EH_PE_udata4; CFA = rsp + 8, return address at CFA - 8.
    let cie = [
        0, 0, 0, 0, 1, b'z', b'R', 0, 1, 0x78, 16, 1, 0x03, 0x0c, 7, 8, 0x90, 1,
    ];
    entry(&mut out, &cie);
    for &i in order {
        let function = &functions[i];
        let mut body = Vec::new();
        body.extend_from_slice(&(out.len() as u32 + 4).to_le_bytes());
        body.extend_from_slice(&(function.start as u32).to_le_bytes());
        body.extend_from_slice(&(function.len as u32).to_le_bytes());
        body.push(0); // no augmentation data
        let mut previous = 0;
        for &(offset, cfa, saved) in &function.steps[1..] {
            body.push(0x40 | (offset - previous) as u8); // DW_CFA_advance_loc
            body.extend_from_slice(&[0x0e, cfa as u8]); // DW_CFA_def_cfa_offset
            if saved && previous == 0 {
                body.extend_from_slice(&[0x86, 2]); // DW_CFA_offset rbp, CFA - 16
            }
            if !saved {
                body.push(0xc6); // DW_CFA_restore rbp
            }
            previous = offset;
        }
        entry(&mut out, &body);
    }
    out.extend_from_slice(&[0; 4]);
    out
}

/// An x86_64 ELF file of one executable segment over the code (no bytes in the file), and
/// the sections `.eh_frame` and `.shstrtab`.
fn elf(code_end: u64, eh_frame: &[u8]) -> Vec<u8> {
    let mut out = vec![0; EH_FRAME_OFFSET];
    out.extend_from_slice(eh_frame);
    let names = b"\0.eh_frame\0.shstrtab\0";
    let names_offset = out.len();
    out.extend_from_slice(names);
    out.resize(out.len().next_multiple_of(8), 0);
    let section_headers = out.len();
    let u16s = |v: u16| v.to_le_bytes();
    let u32s = |v: u32| v.to_le_bytes();
    let u64s = |v: u64| v.to_le_bytes();
    let mut header = Vec::new();
    header.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    header.extend_from_slice(&u16s(3)); // ET_DYN
    header.extend_from_slice(&u16s(62)); // EM_X86_64
    header.extend_from_slice(&u32s(1));
    header.extend_from_slice(&u64s(0)); // entry
    header.extend_from_slice(&u64s(64)); // program headers
    header.extend_from_slice(&u64s(section_headers as u64));
    header.extend_from_slice(&u32s(0));
    for field in [64, 56, 1, 64, 3, 2] {
        header.extend_from_slice(&u16s(field));
    }
    // PT_LOAD, R+X, from address 0 to the code's end.
    header.extend_from_slice(&u32s(1));
    header.extend_from_slice(&u32s(5));
    for field in [0, 0, 0, 0, code_end, 0x1000] {
        header.extend_from_slice(&u64s(field));
    }
    out[..header.len()].copy_from_slice(&header);
    let mut section = |name: u32, kind: u32, flags: u64, address: u64, offset, size| {
        out.extend_from_slice(&u32s(name));
        out.extend_from_slice(&u32s(kind));
        for field in [flags, address, offset as u64, size as u64] {
            out.extend_from_slice(&u64s(field));
        }
        out.extend_from_slice(&[0; 8]); // sh_link, sh_info
        out.extend_from_slice(&u64s(8)); // sh_addralign
        out.extend_from_slice(&u64s(0)); // sh_entsize
    };
    section(0, 0, 0, 0, 0, 0);
    // SHT_PROGBITS, SHF_ALLOC, after the code.
    section(
        1,
        1,
        2,
        code_end.next_multiple_of(0x1000),
        EH_FRAME_OFFSET,
        eh_frame.len(),
    );
    section(11, 3, 0, 0, names_offset, names.len()); // SHT_STRTAB
    out
}

#[test]
fn a_million_row_library_builds_within_twice_its_table_as_the_whole_table_merge_does() {
    let mut random = Random(0x9e37_79b9_7f4a_7c15);
    let functions = functions(&mut random);
    // The linker's order is not the code's: FDEs shuffled, so the build sorts them.
    let mut order: Vec<usize> = (0..functions.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, random.below(i as u64 + 1) as usize);
    }
    let code_end = functions.last().map_or(TEXT, |f| f.start + f.len);
    let bytes = elf(code_end, &eh_frame(&functions, &order));

    let (table, peak) = peak_heap(|| UnwindTable::build(Path::new("generated.so"), &bytes));
    let table = table.unwrap();
    let stats = table.stats();
    assert_eq!((stats.eh_frame_fdes, stats.fdes_skipped), (FUNCTIONS, 0));
    assert!(stats.rows > 900_000, "{stats:?}");
    // The build's peak, the table itself included: the table, a few words a function for
    // the index, and one function's rows at a time. Whole-table vectors of unsorted rows and
    // a sorted copy of them took several times the table.
    let bound = 2 * table.size_bytes();
    println!(
        "{} rows ({} bytes) from {} FDEs: heap at most {peak} bytes while building (bound \
         {bound})",
        stats.rows,
        table.size_bytes(),
        FUNCTIONS
    );
    assert!(peak <= bound, "peak heap {peak} bytes, bound {bound}");

    // The same rows as the merge of the whole table, the functions in section order.
    let mut converted = Converted::default();
    for &i in &order {
        let first_row = converted.rows.len();
        converted.rows.extend(functions[i].rows());
        converted.functions.push(Function {
            start: functions[i].start as u32,
            end: (functions[i].start + functions[i].len) as u32,
            first_row,
            end_row: converted.rows.len(),
        });
    }
    assert_eq!(stats.rows_before_merging, converted.rows.len());
    let whole = optimize(converted);
    assert!(table.rows() == whole.as_slice(), "the rows differ");

    // And every pc of every function has the rule the generator gave it; padding has none.
    assert!(table.rows().windows(2).all(|w| w[0].pc < w[1].pc));
    // No function before the first.
    let mut end_before = 0;
    for function in &functions {
        let padding = function.start > end_before;
        assert_eq!(table.lookup(function.start - 1).is_none(), padding);
        end_before = function.start + function.len;
        let rows = function.rows();
        for (step, row) in function.steps.iter().zip(&rows) {
            let next = function.steps.iter().find(|s| s.0 > step.0);
            let last = function.start + next.map_or(function.len, |s| s.0) - 1;
            for address in [function.start + step.0, last] {
                let found = table.lookup(address).expect("a row");
                let found = (found.cfa_kind(), found.cfa_offset, found.fp_kind());
                assert_eq!(found, (row.cfa_kind(), row.cfa_offset, row.fp_kind()));
            }
        }
    }
}
