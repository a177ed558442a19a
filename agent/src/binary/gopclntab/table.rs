//! The table's header and its records: the functab, `_func`s, names, files and the
//! inline tree.

use super::*;

/// The table's layout: header fields and offsets only, so it is `Copy` and iterators can own it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Table {
    pub(super) format: Format,
    /// File offset of the header; the offsets below are from it.
    pub(super) start: u64,
    /// Bytes from `start` the table may use: its section's size, or the rest of its segment.
    pub(super) len: u64,
    /// ELF address of the header.
    pub(super) address: u64,
    pub(super) nfunc: u64,
    /// 1.18+: what functab entries are relative to.
    pub(super) text_start: u64,
    pub(super) funcnames: u64,
    pub(super) cutab: u64,
    pub(super) filetab: u64,
    pub(super) pctab: u64,
    /// The functab, followed by the `_func`s (whose offsets are from here, or from the table's
    /// start in 1.2).
    pub(super) functab: u64,
    /// 1.2: the file table's entry count (entry 0 is the count itself).
    pub(super) nfiles: u64,
    /// The unit of the pc-value tables' pc deltas (`minLC`): 1 on x86-64, 4 on arm64, whose
    /// instructions are all 4 bytes.
    pub(super) quantum: u8,
}

/// One `_func`, decoded.
#[derive(Debug, Clone, Copy)]
pub(super) struct Func {
    /// Offset of the `_func` from the table's start.
    pub(super) off: u64,
    pub(super) entry: u64,
    pub(super) end: u64,
    pub(super) name_off: u64,
    pub(super) pcsp: u32,
    pub(super) pcfile: u32,
    pub(super) pcln: u32,
    pub(super) npcdata: u32,
    pub(super) cu: u32,
    pub(super) func_id: u8,
    pub(super) flag: u8,
    pub(super) nfuncdata: u8,
}

/// The header fields that are offsets of sub-tables, in header order (1.16+).
pub(super) const OFFSET_FIELDS: [&str; 5] = [
    "funcnameOffset",
    "cuOffset",
    "filetabOffset",
    "pctabOffset",
    "pclnOffset",
];

impl Table {
    pub(super) fn bytes<'d>(&self, data: &'d [u8]) -> Result<Bytes<'d>> {
        Bytes::new(data, 0).sub(self.start, self.len, "the Go pclntab")
    }

    /// Reads and checks a header at `start` (`len` bytes available, at ELF `address`).
    pub(super) fn parse(
        data: &[u8],
        start: u64,
        len: u64,
        address: u64,
        text: Option<u64>,
    ) -> Result<Table> {
        let tab = Bytes::new(data, 0).sub(start, len, "the Go pclntab")?;
        let magic = tab.u32(0, "the Go pclntab's magic")?;
        let unsupported = |field, value| PclntabError::Unsupported {
            field,
            value,
            offset: start,
        };
        let format = match Format::from_magic(magic) {
            Some(format) => format,
            None if Format::from_magic(magic.swap_bytes()).is_some() => {
                return Err(unsupported("byte order", u64::from(magic)))
            }
            None => {
                return Err(PclntabError::UnknownMagic {
                    magic,
                    offset: start,
                })
            }
        };
        let header = tab.sub(0, 8, "the Go pclntab's header")?.bytes;
        for (field, at, wanted) in [
            ("pad", 4, &[0][..]),
            ("pad", 5, &[0]),
            ("minLC", 6, &[1, 4]),
            ("ptrSize", 7, &[8]),
        ] {
            if !wanted.contains(&header[at]) {
                return Err(unsupported(field, u64::from(header[at])));
            }
        }
        let word = |i: u64, what| tab.u64(8 + 8 * i, what);
        let out_of = |field, value| PclntabError::Header {
            field,
            value,
            offset: start,
            len,
        };
        let (header_size, first_offset) = match format {
            Format::Go12 => (16, 0),
            Format::Go116 => (64, 2),
            Format::Go118 | Format::Go120 => (72, 3),
        };
        let mut offsets = [0u64; 5];
        if format != Format::Go12 {
            for (i, (value, field)) in offsets.iter_mut().zip(OFFSET_FIELDS).enumerate() {
                *value = word(first_offset + i as u64, field)?;
                if *value < header_size || *value >= len {
                    return Err(out_of(field, *value));
                }
            }
        }
        let [funcnames, cutab, filetab, pctab, functab] = offsets;
        let mut table = Table {
            format,
            start,
            len,
            address,
            nfunc: word(0, "nfunc")?,
            text_start: 0,
            funcnames,
            cutab,
            filetab,
            pctab,
            functab: if format == Format::Go12 { 16 } else { functab },
            nfiles: 0,
            quantum: header[6],
        };
        if format != Format::Go12 {
            table.nfiles = word(1, "nfiles")?;
        }
        if matches!(format, Format::Go118 | Format::Go120) {
            table.text_start = match word(2, "textStart")? {
                0 => text.ok_or(PclntabError::NoTextStart)?,
                text_start => text_start,
            };
        }
        // The functab is nfunc (entry, offset) pairs and one end entry.
        let room = len.saturating_sub(table.functab) / format.word();
        if table.nfunc == 0 || table.nfunc > room.saturating_sub(1) / 2 {
            return Err(out_of("nfunc", table.nfunc));
        }
        if format == Format::Go12 {
            let after = table.functab + (2 * table.nfunc + 1) * 8;
            table.filetab = u64::from(tab.u32(after, "the file table's offset")?);
            table.nfiles = u64::from(tab.u32(table.filetab, "the file table's count")?);
        }
        // The first function must read back whole: what tells a table from bytes that happen
        // to start with its magic.
        let first = table.func(tab, 0)?;
        table.name(tab, first.name_off)?;
        Ok(table)
    }

    pub(super) fn entry(&self, tab: Bytes<'_>, index: u64) -> Result<u64> {
        let word = self.format.word();
        let value = tab.uint(self.functab + 2 * index * word, word, "a functab entry")?;
        match self.format {
            Format::Go12 | Format::Go116 => Ok(value),
            Format::Go118 | Format::Go120 => Ok(self.text_start.wrapping_add(value)),
        }
    }

    pub(super) fn text_range(&self, tab: Bytes<'_>) -> Result<Range<u64>> {
        Ok(self.entry(tab, 0)?..self.entry(tab, self.nfunc)?)
    }

    /// The index of the function holding `pc`: binary search over the functab in place.
    pub(super) fn lookup(&self, tab: Bytes<'_>, pc: u64) -> Result<u64> {
        let Range { start, end } = self.text_range(tab)?;
        if !(start..end).contains(&pc) {
            return Err(PclntabError::NoFunction { pc, start, end });
        }
        // entry(lo) <= pc < entry(hi) holds throughout, sorted or not, so the function found
        // always contains pc by its own bounds.
        let (mut lo, mut hi) = (0, self.nfunc);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.entry(tab, mid)? <= pc {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }

    /// The `_func` of function `index`, checked against its functab entry.
    pub(super) fn func(&self, tab: Bytes<'_>, index: u64) -> Result<Func> {
        let word = self.format.word();
        let (entry, end) = (self.entry(tab, index)?, self.entry(tab, index + 1)?);
        // Both neighbours are checked: a function whose entry moved below its predecessor's
        // would otherwise claim that predecessor's pcs.
        if end < entry {
            return Err(PclntabError::Unsorted {
                index: index + 1,
                entry: end,
            });
        }
        if index > 0 && self.entry(tab, index - 1)? > entry {
            return Err(PclntabError::Unsorted { index, entry });
        }
        let at = self.functab + (2 * index + 1) * word;
        let func_off = tab.uint(at, word, "a functab offset")?;
        let base = if self.format == Format::Go12 {
            0
        } else {
            self.functab
        };
        let off = base.saturating_add(func_off);
        let (func_id, size) = self.format.func_id_and_size();
        let raw = tab.sub(off, size, "a _func")?;
        let found = match self.format {
            Format::Go12 | Format::Go116 => raw.u64(0, "_func.entry")?,
            Format::Go118 | Format::Go120 => {
                let entry_off = raw.u32(0, "_func.entryoff")?;
                self.text_start.wrapping_add(u64::from(entry_off))
            }
        };
        if found != entry {
            let offset = raw.base;
            return Err(PclntabError::EntryMismatch {
                index,
                offset,
                found,
                expected: entry,
            });
        }
        let field = |i: u64| raw.u32(word + 4 * i, "a _func field");
        let byte = |after: u64| func_id.map_or(Ok(0), |at| raw.u8(at + after, "a _func byte"));
        Ok(Func {
            off,
            entry,
            end,
            name_off: u64::from(field(0)?),
            pcsp: field(3)?,
            pcfile: field(4)?,
            pcln: field(5)?,
            npcdata: field(6)?,
            cu: if self.format == Format::Go12 {
                0
            } else {
                field(7)?
            },
            func_id: byte(0)?,
            flag: byte(1)?,
            nfuncdata: byte(3)?,
        })
    }

    /// A function name at `name_off` in the name table.
    pub(super) fn name<'d>(&self, tab: Bytes<'d>, name_off: u64) -> Result<&'d str> {
        tab.cstr(self.funcnames.saturating_add(name_off), "a function name")
    }

    /// The file `fileno` (a pcfile value) of `func`; None where the table says it has none.
    pub(super) fn file<'d>(
        &self,
        tab: Bytes<'d>,
        func: &Func,
        fileno: i32,
    ) -> Result<Option<&'d str>> {
        let Ok(fileno) = u64::try_from(fileno) else {
            return Ok(None);
        };
        if self.format == Format::Go12 {
            // Entry 0 is the count, so file numbers start at 1.
            if fileno == 0 || fileno >= self.nfiles {
                return Ok(None);
            }
            let name = tab.u32(self.filetab + 4 * fileno, "a file table entry")?;
            return tab.cstr(u64::from(name), "a file name").map(Some);
        }
        if func.cu == u32::MAX {
            return Ok(None);
        }
        let index = u64::from(func.cu) + fileno;
        match tab.u32(self.cutab + 4 * index, "a cutab entry")? {
            u32::MAX => Ok(None),
            name => tab
                .cstr(self.filetab + u64::from(name), "a file name")
                .map(Some),
        }
    }

    /// The runs of the pc-value table at `off` (a `_func` field), or None for no table.
    pub(super) fn pc_values<'d>(
        &self,
        tab: Bytes<'d>,
        func: &Func,
        off: u32,
    ) -> Option<PcValues<'d>> {
        let (pos, pc, entry) = (self.pctab + u64::from(off), func.entry, func.entry);
        (off != 0).then_some(PcValues {
            tab,
            pos,
            pc,
            entry,
            value: -1,
            quantum: self.quantum,
        })
    }

    /// The value at `pc` of the pc-value table at `off`; None for no table.
    pub(super) fn pc_value(
        &self,
        tab: Bytes<'_>,
        func: &Func,
        table: (&'static str, u32),
        pc: u64,
    ) -> Result<Option<i32>> {
        let Some(mut runs) = self.pc_values(tab, func, table.1) else {
            return Ok(None);
        };
        // Each run consumes at least two bytes, so the table's bytes bound the loop.
        while let Some(run) = runs.next_run()? {
            if pc < run.end {
                return Ok(Some(run.value));
            }
        }
        Err(PclntabError::PcValueEnds {
            table: table.0,
            entry: func.entry,
            pc,
        })
    }

    /// pcdata table `index`'s offset, None if the function has fewer.
    pub(super) fn pcdata(&self, tab: Bytes<'_>, func: &Func, index: u32) -> Result<Option<u32>> {
        if index >= func.npcdata {
            return Ok(None);
        }
        let at = func.off + self.format.func_id_and_size().1 + 4 * u64::from(index);
        tab.u32(at, "a pcdata offset").map(Some)
    }

    /// File name and line at `pc` in `func`.
    pub(super) fn position<'d>(
        &self,
        tab: Bytes<'d>,
        func: &Func,
        pc: u64,
    ) -> Result<(Option<&'d str>, u32)> {
        let line = self.pc_value(tab, func, ("pcln", func.pcln), pc)?;
        let file = match self.pc_value(tab, func, ("pcfile", func.pcfile), pc)? {
            Some(fileno) => self.file(tab, func, fileno)?,
            None => None,
        };
        Ok((
            file,
            line.and_then(|line| u32::try_from(line).ok()).unwrap_or(0),
        ))
    }

    pub(super) fn go_func<'d>(&self, tab: Bytes<'d>, index: u64) -> Result<GoFunc<'d>> {
        let func = self.func(tab, index)?;
        let name = self.name(tab, func.name_off)?;
        let flag_less = matches!(self.format, Format::Go12 | Format::Go116);
        Ok(GoFunc {
            entry: func.entry,
            end: func.end,
            name,
            func_id: func.func_id,
            spwrite: func.flag & FLAG_SPWRITE != 0,
            top_frame: func.flag & FLAG_TOPFRAME != 0 || (flag_less && TOP_FRAMES.contains(&name)),
            asm: func.flag & FLAG_ASM != 0,
            index,
        })
    }
}
