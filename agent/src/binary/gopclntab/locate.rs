//! Finding the table in a binary: by section, by symbol, by scanning the segments for its
//! header, and `moduledata.gofunc` for the inline tree's names.

use super::*;

/// Sections only Go's linkers write: a binary with section headers and none of them is not Go.
pub(super) fn has_go_section(file: &object::File<'_>) -> bool {
    let names = [
        ".gopclntab",
        ".data.rel.ro.gopclntab",
        ".go.buildinfo",
        ".note.go.buildid",
    ];
    names
        .iter()
        .any(|name| file.section_by_name(name).is_some())
}

/// The first 8-aligned header in the non-executable segments (read-only first) that reads
/// back whole.
pub(super) fn scan_for_table(
    data: &[u8],
    segments: &[Segment],
    text: Option<u64>,
) -> Option<Table> {
    let mut order: Vec<&Segment> = segments.iter().filter(|s| s.flags & PF_X == 0).collect();
    order.sort_by_key(|s| s.flags & PF_W != 0);
    order.into_iter().find_map(|segment| {
        let mut headers = segment.words(data).filter(|(_, word)| {
            word[1..4] == [0xff; 3]
                && matches!(word[0], 0xfb | 0xfa | 0xf0 | 0xf1)
                && word[4..8] == [0, 0, 1, 8]
        });
        headers.find_map(|(address, _)| {
            let start = segment.offset_of(address, 8)?;
            // To the segment's end, or the file's if it was cut short.
            let len = segment.file_size - (address - segment.address);
            let len = len.min((data.len() as u64).saturating_sub(start));
            Table::parse(data, start, len, address, text).ok()
        })
    })
}

/// `go:func.*`'s address: its symbol, or the moduledata's `gofunc` (the moduledata at the
/// `runtime.firstmoduledata` symbol, or found in the writable segments by its first word,
/// the table's address, and slices that agree with the header). Either must decode the first
/// inline trees, so that a Go version that moved the field costs inlined frames, not names.
pub(super) fn find_gofunc(
    data: &[u8],
    segments: &[Segment],
    table: &Table,
    symbols: &Symbols,
) -> Option<u64> {
    let decodes = |gofunc: u64| gofunc_decodes(data, segments, table, gofunc);
    if let Some(gofunc) = symbols.gofunc.filter(|&gofunc| decodes(gofunc)) {
        return Some(gofunc);
    }
    // 1.20 added `covctrs, ecovctrs` before it; a later shift by a word is tried too.
    let offsets: &[u64] = match table.format {
        Format::Go120 => &[
            MODULEDATA_GOFUNC_120,
            MODULEDATA_GOFUNC_120 + 8,
            MODULEDATA_GOFUNC_118,
        ],
        _ => &[MODULEDATA_GOFUNC_118],
    };
    let read = |address: u64| -> Option<u64> {
        let words = bytes_at(data, segments, (address, 23 * 8), "the moduledata").ok()?;
        let word = |i: u64| words.u64(8 * i, "a moduledata word").ok();
        let slice_at = |i: u64, off: u64| word(i) == Some(table.address.wrapping_add(off));
        let agrees = word(0) == Some(table.address)
            && slice_at(1, table.funcnames)
            && slice_at(4, table.cutab)
            && slice_at(7, table.filetab)
            && slice_at(10, table.pctab)
            && slice_at(13, table.functab)
            && slice_at(16, table.functab)
            && word(17) == Some(table.nfunc + 1)
            && word(22) == Some(table.text_start);
        let field =
            |at: u64| bytes_at(data, segments, (address.wrapping_add(at), 8), "gofunc").ok();
        let gofunc = |at: &u64| field(*at)?.u64(0, "gofunc").ok().filter(|&g| decodes(g));
        agrees.then(|| offsets.iter().find_map(gofunc)).flatten()
    };
    if let Some(found) = symbols.firstmoduledata.and_then(read) {
        return Some(found);
    }
    let needle = table.address.to_le_bytes();
    let mut writable = segments.iter().filter(|s| s.flags & PF_W != 0);
    writable.find_map(|segment| {
        let mut candidates = segment.words(data).filter(|(_, word)| *word == needle);
        candidates.find_map(|(address, _)| read(address))
    })
}

/// Whether, with funcdata taken from `gofunc`, the first few inline trees name functions at
/// call sites inside their callers.
pub(super) fn gofunc_decodes(
    data: &[u8],
    segments: &[Segment],
    table: &Table,
    gofunc: u64,
) -> bool {
    let Ok(tab) = table.bytes(data) else {
        return false;
    };
    if bytes_at(data, segments, (gofunc, 1), "go:func.*").is_err() {
        return false;
    }
    let segments = segments.to_vec();
    let probe = Pclntab {
        table: *table,
        gofunc: Some(gofunc),
        segments,
        text: 0..0,
    };
    let trees = (0..table.nfunc.min(4096)).filter_map(|index| {
        let func = table.func(tab, index).ok()?;
        Some((func, probe.inline_tree(tab, &func).ok()??))
    });
    trees.take(16).all(|(func, tree)| {
        let call = probe.inlined_call(data, tree, 0);
        call.is_ok_and(|(name, parent_pc)| {
            let named = table.name(tab, name).is_ok_and(|name| !name.is_empty());
            named && parent_pc < func.end - func.entry
        })
    })
}
