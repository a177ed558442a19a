//! Kernel frame names from `/proc/kallsyms`.
//!
//! The table holds only text symbols (`t`, `T`, `w`, `W`), sorted by address, with all names in
//! one string arena: 120k symbols cost about 6 MB in two allocations.
//! Lookup is a binary search. Module symbols (including `[bpf]` programs) are named
//! `name [module]`, the way `perf` prints them.
//!
//! The kernel's table changes when modules or BPF programs load, so [`KernelSymbolizer`]
//! reloads when the set of modules or BPF programs changed since the last load, and when a
//! lookup lands outside the table. A load takes this boot's kept copy when it is current
//! ([`super::kallsyms_cache`]), and `/proc/kallsyms` otherwise, then keeps a copy.

use std::{
    fs::File,
    io::{self, Read},
    path::{Path, PathBuf},
};

use super::kallsyms_cache::{self, KernelIdentity};

/// A symbol further than this from the address it names is not trusted: the address is more
/// likely in code the table does not know (a module or BPF program loaded later).
const MAX_SYMBOL_SPAN: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum KallsymsError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{path}: line {line}: {reason}")]
    Parse {
        path: PathBuf,
        line: usize,
        reason: &'static str,
    },
    #[error("{path}: no text symbols found")]
    Empty { path: PathBuf },
}

/// One text symbol: where it starts and where its name lives in the arena.
#[derive(Clone, Copy, Debug)]
struct Symbol {
    address: u64,
    name_offset: u32,
    /// The name's length, and `GLOBAL` for `T`/`W` rather than `t`/`w` (preferred among
    /// aliases at one address): a flag of its own would pad every entry to 24 bytes, and the
    /// daemon keeps one entry per kernel text symbol, a hundred thousand or more.
    name_len_and_global: u16,
    /// Index into `modules`, or `NO_MODULE` for the core kernel.
    module: u16,
}

const _: () = assert!(std::mem::size_of::<Symbol>() == 16);

const NO_MODULE: u16 = u16::MAX;
const GLOBAL: u16 = 1 << 15;
/// The longest name the table keeps: the kernel's own limit (`KSYM_NAME_LEN`) is 512.
const MAX_NAME_LEN: usize = (GLOBAL - 1) as usize;

impl Symbol {
    fn name_len(&self) -> usize {
        usize::from(self.name_len_and_global & !GLOBAL)
    }

    fn global(&self) -> bool {
        self.name_len_and_global & GLOBAL != 0
    }
}

/// A sorted, immutable snapshot of the kernel's text symbols.
#[derive(Debug)]
pub struct KernelSymbols {
    /// Ascending by address, one per address.
    symbols: Vec<Symbol>,
    /// All symbol names back to back.
    arena: String,
    /// Module names referenced by `Symbol::module`.
    modules: Vec<String>,
    /// True when every address read was zero: kptr_restrict hides them from this process.
    addresses_hidden: bool,
    /// A kept copy without BPF programs and trampolines: names only addresses between two
    /// symbols of one owner (see [`KernelSymbols::lookup`]).
    partial: bool,
}

/// The answer for one kernel address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelFrame<'a> {
    /// The function holding the address, and how far into it the address is.
    Symbol {
        name: &'a str,
        module: Option<&'a str>,
        offset: u64,
    },
    /// The address is not covered by the table (see [`MAX_SYMBOL_SPAN`]).
    Miss,
}

impl KernelSymbols {
    /// Reads the live table from `/proc/kallsyms`.
    pub fn load() -> Result<Self, KallsymsError> {
        Self::load_from(Path::new("/proc/kallsyms"))
    }

    /// Reads a table in kallsyms format from `path`.
    ///
    /// Most of the time goes into the kernel formatting the file (~120k `vsnprintf` calls), so a
    /// reader thread pulls chunks while this thread parses the previous ones. Chunks stream
    /// through a small bounded channel: the ~5 MB file is never held whole.
    pub fn load_from(path: &Path) -> Result<Self, KallsymsError> {
        let read_err = |source| KallsymsError::Read {
            path: path.to_owned(),
            source,
        };
        let mut file = File::open(path).map_err(read_err)?;
        let (chunks_tx, chunks_rx) = std::sync::mpsc::sync_channel::<io::Result<Vec<u8>>>(4);
        std::thread::scope(|scope| {
            scope.spawn(move || loop {
                let mut chunk = vec![0; CHUNK];
                let result = read_full(&mut file, &mut chunk).map(|n| {
                    chunk.truncate(n);
                    chunk
                });
                let done = matches!(&result, Ok(c) if c.is_empty()) || result.is_err();
                // The parser hung up (it failed): nothing more to do.
                if chunks_tx.send(result).is_err() || done {
                    return;
                }
            });
            let mut builder = TableBuilder::new(path);
            let mut lines = LineSplitter::default();
            for chunk in chunks_rx {
                let chunk = chunk.map_err(read_err)?;
                if chunk.is_empty() {
                    break;
                }
                lines.feed(&chunk, |line| builder.line(line))?;
            }
            lines.finish(|line| builder.line(line))?;
            builder.finish()
        })
    }

    /// Parses kallsyms text from any reader. `origin` only names the input in errors.
    pub fn parse(mut input: impl Read, origin: &Path) -> Result<Self, KallsymsError> {
        let mut builder = TableBuilder::new(origin);
        let mut lines = LineSplitter::default();
        let mut chunk = vec![0; CHUNK];
        loop {
            let n = read_full(&mut input, &mut chunk).map_err(|source| KallsymsError::Read {
                path: origin.to_owned(),
                source,
            })?;
            if n == 0 {
                break;
            }
            lines.feed(&chunk[..n], |line| builder.line(line))?;
        }
        lines.finish(|line| builder.line(line))?;
        builder.finish()
    }

    /// True when kptr_restrict hid every address (all read as zero): lookups cannot work.
    pub fn addresses_hidden(&self) -> bool {
        self.addresses_hidden
    }

    /// Number of distinct symbol addresses in the table.
    pub fn len(&self) -> usize {
        self.symbols.len()
    }

    /// True when the table holds no symbols.
    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }

    /// Names the function holding `address`. A partial table names an address only when the
    /// next symbol is of the same module (or both are the core kernel's): the address then
    /// lies in that owner's text, where nothing the copy left out can be.
    pub fn lookup(&self, address: u64) -> KernelFrame<'_> {
        if self.addresses_hidden {
            return KernelFrame::Miss;
        }
        let index = self.symbols.partition_point(|s| s.address <= address);
        let Some(symbol) = index.checked_sub(1).map(|i| self.symbols[i]) else {
            return KernelFrame::Miss;
        };
        if self.partial
            && self
                .symbols
                .get(index)
                .is_none_or(|next| next.module != symbol.module)
        {
            return KernelFrame::Miss;
        }
        let offset = address - symbol.address;
        if offset >= MAX_SYMBOL_SPAN {
            return KernelFrame::Miss;
        }
        let name = symbol_name(&self.arena, &symbol);
        let module =
            (symbol.module != NO_MODULE).then(|| self.modules[usize::from(symbol.module)].as_str());
        KernelFrame::Symbol {
            name,
            module,
            offset,
        }
    }

    /// Lowest symbol address, a stand-in for the start of kernel text.
    pub fn lowest_address(&self) -> u64 {
        self.symbols.first().map_or(0, |s| s.address)
    }

    /// Highest symbol address.
    #[cfg(test)]
    pub fn last_address(&self) -> u64 {
        self.symbols.last().map_or(0, |s| s.address)
    }

    /// The same table, marked as a kept copy (see [`KernelSymbols::lookup`]).
    pub(super) fn partial(mut self) -> Self {
        self.partial = true;
        self
    }

    /// Writes the table in kallsyms' format, one line per address, leaving out the modules
    /// `keep` refuses.
    pub(super) fn write_kallsyms(
        &self,
        out: &mut impl io::Write,
        keep: impl Fn(&str) -> bool,
    ) -> io::Result<()> {
        let kept: Vec<bool> = self.modules.iter().map(|m| keep(m)).collect();
        for symbol in &self.symbols {
            let kind = if symbol.global() { 'T' } else { 't' };
            let name = symbol_name(&self.arena, symbol);
            if symbol.module == NO_MODULE {
                writeln!(out, "{:016x} {kind} {name}", symbol.address)?;
            } else if kept[usize::from(symbol.module)] {
                let module = &self.modules[usize::from(symbol.module)];
                writeln!(out, "{:016x} {kind} {name}\t[{module}]", symbol.address)?;
            }
        }
        Ok(())
    }
}

/// Bytes read per chunk: large enough that the kernel's per-read setup is noise.
const CHUNK: usize = 256 * 1024;

/// Fills `buf` as far as the reader allows; returns the bytes read (0 at end of input).
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Cuts a byte stream that arrives in arbitrary chunks into lines.
#[derive(Default)]
struct LineSplitter {
    /// The start of a line whose end is in a later chunk.
    partial: Vec<u8>,
}

impl LineSplitter {
    fn feed<E>(
        &mut self,
        mut chunk: &[u8],
        mut line: impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        if !self.partial.is_empty() {
            let Some(end) = memchr::memchr(b'\n', chunk) else {
                self.partial.extend_from_slice(chunk);
                return Ok(());
            };
            self.partial.extend_from_slice(&chunk[..end]);
            line(&self.partial)?;
            self.partial.clear();
            chunk = &chunk[end + 1..];
        }
        let mut start = 0;
        for end in memchr::memchr_iter(b'\n', chunk) {
            line(&chunk[start..end])?;
            start = end + 1;
        }
        self.partial.extend_from_slice(&chunk[start..]);
        Ok(())
    }

    fn finish<E>(self, mut line: impl FnMut(&[u8]) -> Result<(), E>) -> Result<(), E> {
        if self.partial.is_empty() {
            Ok(())
        } else {
            line(&self.partial)
        }
    }
}

/// Accumulates parsed lines into a table.
struct TableBuilder<'p> {
    /// Names the input in errors.
    origin: &'p Path,
    symbols: Vec<Symbol>,
    arena: String,
    modules: Vec<String>,
    line_no: usize,
    any_nonzero: bool,
}

impl<'p> TableBuilder<'p> {
    fn new(origin: &'p Path) -> Self {
        TableBuilder {
            origin,
            symbols: Vec::with_capacity(1 << 17),
            arena: String::with_capacity(4 << 20),
            modules: Vec::new(),
            line_no: 0,
            any_nonzero: false,
        }
    }

    /// Parses one line: `address type name` or `address type name\t[module]`.
    fn line(&mut self, text: &[u8]) -> Result<(), KallsymsError> {
        self.line_no += 1;
        if text.is_empty() {
            return Ok(());
        }
        let parse_err = |reason| KallsymsError::Parse {
            path: self.origin.to_owned(),
            line: self.line_no,
            reason,
        };
        let (address, rest) = split_field(text).ok_or_else(|| parse_err("missing fields"))?;
        let (kind, rest) = split_field(rest).ok_or_else(|| parse_err("missing symbol type"))?;
        let address = parse_hex(address).ok_or_else(|| parse_err("address is not hex"))?;
        let [kind] = kind else {
            return Err(parse_err("symbol type is not one character"));
        };
        if !matches!(kind, b't' | b'T' | b'w' | b'W') {
            return Ok(());
        }
        let (name, module) = match memchr::memchr(b'\t', rest) {
            Some(tab) => (&rest[..tab], module_name(&rest[tab + 1..])),
            None => (rest, None),
        };
        let name = std::str::from_utf8(name).map_err(|_| parse_err("name is not UTF-8"))?;
        if name.is_empty() || name.len() > MAX_NAME_LEN {
            return Err(parse_err("symbol name empty or too long"));
        }
        self.any_nonzero |= address != 0;
        let module = match module {
            None => NO_MODULE,
            Some(m) => {
                let m = std::str::from_utf8(m).map_err(|_| parse_err("module is not UTF-8"))?;
                // Modules arrive grouped, so the last one is almost always the match.
                match self.modules.iter().rposition(|known| known == m) {
                    Some(i) => i as u16,
                    None if self.modules.len() < usize::from(NO_MODULE) => {
                        self.modules.push(m.to_owned());
                        (self.modules.len() - 1) as u16
                    }
                    None => return Err(parse_err("more than 65534 modules")),
                }
            }
        };
        self.symbols.push(Symbol {
            address,
            name_offset: self.arena.len() as u32,
            name_len_and_global: name.len() as u16
                | if matches!(kind, b'T' | b'W') {
                    GLOBAL
                } else {
                    0
                },
            module,
        });
        self.arena.push_str(name);
        Ok(())
    }

    fn finish(self) -> Result<KernelSymbols, KallsymsError> {
        let TableBuilder {
            origin,
            mut symbols,
            mut arena,
            modules,
            any_nonzero,
            ..
        } = self;
        if symbols.is_empty() {
            return Err(KallsymsError::Empty {
                path: origin.to_owned(),
            });
        }
        // Core kernel symbols come sorted; modules follow in load order. A stable sort keeps
        // the kernel's own order among aliases at one address.
        symbols.sort_by_key(|s| s.address);
        // Several names often share an address (`_text`, `_stext`, ...): keep the one a reader
        // expects, a global symbol before a local one, a plain name before `__`-prefixed.
        symbols.dedup_by(|later, earlier| {
            if later.address != earlier.address {
                return false;
            }
            if alias_rank(&arena, later) < alias_rank(&arena, earlier) {
                std::mem::swap(later, earlier);
            }
            true
        });
        symbols.shrink_to_fit();
        arena.shrink_to_fit();
        Ok(KernelSymbols {
            symbols,
            arena,
            modules,
            addresses_hidden: !any_nonzero,
            partial: false,
        })
    }
}

fn symbol_name<'a>(arena: &'a str, symbol: &Symbol) -> &'a str {
    let start = symbol.name_offset as usize;
    &arena[start..start + symbol.name_len()]
}

/// Lower is preferred.
fn alias_rank(arena: &str, symbol: &Symbol) -> (bool, bool) {
    (
        !symbol.global(),
        symbol_name(arena, symbol).starts_with('_'),
    )
}

/// Splits off the first space-separated field.
fn split_field(text: &[u8]) -> Option<(&[u8], &[u8])> {
    let space = text.iter().position(|&b| b == b' ')?;
    Some((&text[..space], &text[space + 1..]))
}

fn module_name(field: &[u8]) -> Option<&[u8]> {
    field.strip_prefix(b"[")?.strip_suffix(b"]")
}

fn parse_hex(text: &[u8]) -> Option<u64> {
    if text.is_empty() || text.len() > 16 {
        return None;
    }
    let mut value = 0u64;
    for &b in text {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => return None,
        };
        value = (value << 4) | u64::from(digit);
    }
    Some(value)
}

/// Fingerprint of what makes the kernel's symbol table change after boot.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct TableFingerprint {
    modules: Vec<u8>,
    bpf_program_ids: Vec<u32>,
}

impl TableFingerprint {
    fn read() -> Self {
        // Either source may be unreadable (no modules support, no BPF privileges); an empty
        // value then simply never changes and the miss-triggered reload still works.
        let modules = std::fs::read("/proc/modules")
            .map(|text| {
                // Keep only the names: the use counts in later columns change all the time.
                text.split(|&b| b == b'\n')
                    .filter_map(|line| line.split(|&b| b == b' ').next())
                    .flat_map(|name| name.iter().copied().chain([b'\n']))
                    .collect()
            })
            .unwrap_or_default();
        let bpf_program_ids = aya::programs::loaded_programs()
            .filter_map(Result::ok)
            .map(|info| info.id())
            .collect();
        TableFingerprint {
            modules,
            bpf_program_ids,
        }
    }
}

/// The kernel symbol table as the pipeline uses it: loaded on first use, reloaded when stale.
#[derive(Debug, Default)]
pub struct KernelSymbolizer {
    table: Option<KernelSymbols>,
    fingerprint: TableFingerprint,
    /// The hidden-addresses warning is printed once per process, not once per reload.
    warned_hidden: bool,
    /// Drop the table once a profile's kernel frames are named (see
    /// [`KernelSymbolizer::one_profile`]); `text_start` keeps its one figure.
    one_profile: bool,
    text_start: u64,
}

impl KernelSymbolizer {
    /// A symbolizer for a single profile (`scorch record`): its table (about 6 MB) is dropped
    /// as soon as the kernel frames are named ([`KernelSymbolizer::names_taken`]), so it is
    /// never held at the same time as the user frames' debug info, which is named next.
    pub fn one_profile() -> Self {
        KernelSymbolizer {
            one_profile: true,
            ..KernelSymbolizer::default()
        }
    }

    /// The caller has copied out the names it needs: a one-profile symbolizer lets its table go.
    pub fn names_taken(&mut self) {
        if self.one_profile {
            self.text_start = self.text_start();
            self.table = None;
        }
    }

    /// Makes sure the table is current, then names each of `addresses`. Reloads at most once per
    /// call when an address misses, because a module or BPF program may have appeared since.
    pub fn symbolize<'s>(
        &'s mut self,
        addresses: &[u64],
    ) -> Result<Vec<KernelFrame<'s>>, KallsymsError> {
        let fingerprint = TableFingerprint::read();
        let stale = self.table.is_none() || fingerprint != self.fingerprint;
        if stale {
            self.reload(fingerprint.clone(), true)?;
        }
        if let Some(table) = &self.table {
            let missed = addresses
                .iter()
                .any(|&a| matches!(table.lookup(a), KernelFrame::Miss));
            // A fresh table from the kernel answers for itself; a kept copy, or an older
            // table, may lack what loaded since.
            let fresh = stale && !table.partial;
            if missed && !fresh && !table.addresses_hidden() {
                self.reload(fingerprint, false)?;
            }
        }
        let Some(table) = &self.table else {
            return Ok(vec![KernelFrame::Miss; addresses.len()]);
        };
        Ok(addresses.iter().map(|&a| table.lookup(a)).collect())
    }

    /// Loads the table: this boot's kept copy when `kept` allows it and it is current, else
    /// `/proc/kallsyms`, which is then kept.
    fn reload(&mut self, fingerprint: TableFingerprint, kept: bool) -> Result<(), KallsymsError> {
        // The old table goes first: holding both while the new one is read would double
        // this stage's 6 MB at the moment the daemon's memory peaks. If the read fails, this
        // window's kernel frames are unnamed and the next window tries again.
        self.table = None;
        let identity = KernelIdentity::current();
        let copy = identity
            .as_ref()
            .filter(|_| kept)
            .and_then(kallsyms_cache::load);
        if let Some(table) = copy {
            self.table = Some(table);
            self.fingerprint = fingerprint;
            return Ok(());
        }
        let table = KernelSymbols::load()?;
        if let (Some(identity), false) = (&identity, table.addresses_hidden()) {
            // The modules read before and after the table: one loaded meanwhile would make
            // the copy claim a table it does not hold.
            if KernelIdentity::current().as_ref() == Some(identity) {
                kallsyms_cache::store(&table, identity);
            }
        }
        if table.addresses_hidden() && !self.warned_hidden {
            tracing::warn!(
                "/proc/kallsyms shows every address as zero (kernel.kptr_restrict hides them \
                 from this process): kernel frames will be reported as raw addresses. Run as \
                 root or with CAP_SYSLOG, or set kernel.kptr_restrict=0"
            );
            self.warned_hidden = true;
        }
        tracing::debug!(symbols = table.len(), "loaded /proc/kallsyms");
        self.table = Some(table);
        self.fingerprint = fingerprint;
        Ok(())
    }

    /// Start of kernel text as far as the table knows, for the pprof kernel mapping.
    pub fn text_start(&self) -> u64 {
        self.table
            .as_ref()
            .map_or(self.text_start, KernelSymbols::lowest_address)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_one_profile_symbolizer_lets_its_table_go_once_the_names_are_taken() {
        // The live /proc/kallsyms: its addresses read as zero without CAP_SYSLOG, which
        // changes the figures, not what is kept.
        let mut kernel = KernelSymbolizer::one_profile();
        kernel.symbolize(&[]).expect("reading /proc/kallsyms");
        let text_start = kernel.text_start();
        assert!(kernel.table.is_some());
        kernel.names_taken();
        assert!(kernel.table.is_none(), "the table outlived the names");
        assert_eq!(kernel.text_start(), text_start);

        let mut daemon = KernelSymbolizer::default();
        daemon.symbolize(&[]).expect("reading /proc/kallsyms");
        daemon.names_taken();
        assert!(
            daemon.table.is_some(),
            "the daemon's table is reused every window"
        );
    }

    fn parse(text: &str) -> KernelSymbols {
        KernelSymbols::parse(text.as_bytes(), Path::new("fixture")).unwrap()
    }

    const FIXTURE: &str = include_str!("../../../tests/fixtures/kallsyms");

    #[test]
    fn parses_fixture_and_keeps_only_text() {
        let table = parse(FIXTURE);
        assert!(!table.addresses_hidden());
        // 16 lines: 3 data symbols dropped, 4 aliases at one address folded into one.
        assert_eq!(table.len(), 10);
        // The data symbol `init_task` is not in the table, so its address names nothing.
        assert_eq!(table.lookup(0xffffffff82a00000), KernelFrame::Miss);
    }

    #[test]
    fn looks_up_inside_a_function() {
        let table = parse(FIXTURE);
        assert_eq!(
            table.lookup(0xffffffff81234567 + 0x10),
            KernelFrame::Symbol {
                name: "vfs_read",
                module: None,
                offset: 0x10
            }
        );
        // Exactly at a start address.
        assert_eq!(
            table.lookup(0xffffffff81234600),
            KernelFrame::Symbol {
                name: "ksys_read",
                module: None,
                offset: 0
            }
        );
    }

    #[test]
    fn names_module_symbols() {
        let table = parse(FIXTURE);
        assert_eq!(
            table.lookup(0xffffffffc0a01010),
            KernelFrame::Symbol {
                name: "ext4_file_read_iter",
                module: Some("ext4"),
                offset: 0x10
            }
        );
        assert_eq!(
            table.lookup(0xffffffffc0301005),
            KernelFrame::Symbol {
                name: "bpf_prog_6deef7357e7b4530_sample",
                module: Some("bpf"),
                offset: 5
            }
        );
    }

    #[test]
    fn prefers_global_plain_alias_at_shared_address() {
        let table = parse(FIXTURE);
        assert_eq!(
            table.lookup(0xffffffff81000000),
            KernelFrame::Symbol {
                name: "startup_64",
                module: None,
                offset: 0
            }
        );
    }

    #[test]
    fn misses_outside_the_table() {
        let table = parse(FIXTURE);
        assert_eq!(table.lookup(0x1000), KernelFrame::Miss);
        // Far past the last core symbol, before the module area.
        assert_eq!(table.lookup(0xffffffffa0000000), KernelFrame::Miss);
        assert_eq!(table.lookup(u64::MAX), KernelFrame::Miss);
    }

    #[test]
    fn lines_split_across_chunks_of_any_size() {
        for chunk_size in [1, 2, 7, 64, FIXTURE.len()] {
            let mut builder = TableBuilder::new(Path::new("fixture"));
            let mut lines = LineSplitter::default();
            for chunk in FIXTURE.as_bytes().chunks(chunk_size) {
                lines.feed(chunk, |line| builder.line(line)).unwrap();
            }
            lines.finish(|line| builder.line(line)).unwrap();
            let table = builder.finish().unwrap();
            assert_eq!(table.len(), 10, "chunk size {chunk_size}");
            assert_eq!(
                table.lookup(0xffffffffc0a01010),
                parse(FIXTURE).lookup(0xffffffffc0a01010)
            );
        }
        // A last line without a newline still counts.
        assert_eq!(parse("ffffffff81000000 T only").len(), 1);
    }

    #[test]
    fn unsorted_input_is_sorted() {
        let table = parse(
            "ffffffff81000200 T second\nffffffff81000100 T first\nffffffff81000300 t third\n",
        );
        assert_eq!(
            table.lookup(0xffffffff81000150),
            KernelFrame::Symbol {
                name: "first",
                module: None,
                offset: 0x50
            }
        );
    }

    #[test]
    fn hidden_addresses_are_detected() {
        let table = parse("0000000000000000 T _text\n0000000000000000 t do_one\n");
        assert!(table.addresses_hidden());
        assert_eq!(table.lookup(0xffffffff81000000), KernelFrame::Miss);
    }

    #[test]
    fn bad_lines_name_the_input_and_line() {
        let err = KernelSymbols::parse(
            "ffffffff81000000 T ok\nzzzz T broken\n".as_bytes(),
            Path::new("my-kallsyms"),
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "my-kallsyms: line 2: address is not hex");
        let err = KernelSymbols::parse("".as_bytes(), Path::new("empty")).unwrap_err();
        assert_eq!(err.to_string(), "empty: no text symbols found");
    }

    #[test]
    fn long_names_keep_their_length_apart_from_the_global_flag() {
        // The length shares its u16 with the flag: a name of exactly the limit must not set it,
        // and a longer one is refused rather than cut.
        let longest = "f".repeat(MAX_NAME_LEN);
        let table = parse(&format!(
            "ffffffff81000000 t {longest}\nffffffff81000000 T __alias\n"
        ));
        // The global alias wins over the local one, though `_`-prefixed: the flag was read.
        assert_eq!(
            table.lookup(0xffffffff81000004),
            KernelFrame::Symbol {
                name: "__alias",
                module: None,
                offset: 4
            }
        );
        let table = parse(&format!("ffffffff81000000 t {longest}\n"));
        assert_eq!(
            table.lookup(0xffffffff81000004),
            KernelFrame::Symbol {
                name: &longest,
                module: None,
                offset: 4
            }
        );
        let err = KernelSymbols::parse(
            format!("ffffffff81000000 T {longest}f\n").as_bytes(),
            Path::new("long"),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "long: line 1: symbol name empty or too long"
        );
    }

    #[test]
    fn parses_this_machines_table_when_readable() {
        // The live table must parse: it is the real format. Only an unreadable file (a
        // sandbox without /proc) is a reason to skip.
        if let Err(err) = File::open("/proc/kallsyms") {
            eprintln!("skipping: cannot open /proc/kallsyms: {err}");
            return;
        }
        let table = KernelSymbols::load().unwrap();
        assert!(table.len() > 1000);
    }
}
