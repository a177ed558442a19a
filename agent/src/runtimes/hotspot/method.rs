//! Naming a Java method from its `Method*` and a bytecode index: what an interpreted frame
//! gives, and what each scope of a compiled one resolves to (`nmethod`).
//!
//! `Method` -> `_constMethod` (read whole once: its indices, sizes and flags) -> `_constants`
//! (the `ConstantPool`, whose `Symbol*` entries follow it, one word each) -> `_pool_holder`
//! (the class) -> `Klass._name`. The method's name and signature are pool entries at the
//! `ConstMethod`'s indices; the source file's is a pool entry too, at an index the pool (JDK
//! 15+) or the class (8 to 14) keeps. JDK 7's klass holds a `Symbol*` instead.
//!
//! The line: a `ConstMethod` whose flags say so is followed by its bytecode and then by the
//! "compressed line number stream" (HotSpot's `CompressedLineNumberReadStream`): pairs of
//! deltas from the previous (bci, line), each either one byte (`bci_delta << 3 | line_delta`
//! for small non-negative deltas) or 0xFF and two signed UNSIGNED5 values, ended by a zero
//! byte. javac's table need not be sorted, so the whole stream is read and the line is that
//! of the entry with the largest bci not past the frame's.
//!
//! The memory is another process's: a symbol is read at its `u2` length once, the bytecode
//! size is a `u2`, the line stream is read in growing page-bounded pieces to at most
//! [`MAX_LINE_TABLE`] bytes and [`MAX_LINE_ENTRIES`] entries.

use super::layout::{Layout, SourceFile, MAX_SYMBOL_SIZE};
use super::unsigned5::{Reader, Unsigned5Error};
use super::vmstructs::{u16_in, u64_in};
use crate::runtimes::memory::{read_u64, Memory};

/// Most line entries decoded: a class file's `LineNumberTable` counts its entries in a `u2`,
/// so no table javac writes is cut.
pub const MAX_LINE_ENTRIES: usize = 65_535;
/// Most bytes of a line stream read. An entry is at most 11 bytes (0xFF and two 5-byte
/// values), but javac's deltas are small: nearly every entry is one byte, a long one takes
/// 3 to 5. 256 KiB holds [`MAX_LINE_ENTRIES`] entries of 4 bytes, and bounds what a stream
/// without its end costs.
pub const MAX_LINE_TABLE: usize = 256 * 1024;
/// The first piece of a line stream read: most tables are a few dozen bytes.
const FIRST_LINE_READ: usize = 256;
const PAGE: u64 = 4096;
/// `ConstMethod`'s flag saying a line table follows the bytecode (bit 0 in every JDK).
const HAS_LINE_TABLE: u8 = 0x01;

/// Why a method was not named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MethodError {
    #[error("{what} at {address:#x}: unreadable")]
    Unreadable { what: &'static str, address: u64 },
    #[error("{what} is null")]
    Null { what: &'static str },
    #[error("the {what}'s constant pool index is 0")]
    NoIndex { what: &'static str },
    #[error("the line table at {address:#x}: {source}")]
    LineTable {
        address: u64,
        source: Unsigned5Error,
    },
    #[error(
        "the line table at {address:#x} has no end within {MAX_LINE_ENTRIES} entries or \
         {MAX_LINE_TABLE} bytes"
    )]
    Unended { address: u64 },
    /// A symbol that is not one the JVM could hold there: bytes that are no modified UTF-8,
    /// a control character, or a character the JVM refuses in such a name. What a symbol
    /// freed since the sample and its memory reused reads as.
    #[error("the {what} at {address:#x} is no name the JVM gives")]
    Garbled { what: &'static str, address: u64 },
}

/// A named Java frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JavaFrame {
    /// The class, dotted: `java.lang.String`.
    pub class: String,
    pub method: String,
    /// The JVM's descriptor: `(Ljava/lang/String;I)V`.
    pub signature: String,
    /// The source file's name (`String.java`), where the class has one (generated lambdas
    /// and hidden classes have none).
    pub file: Option<String>,
    pub line: Option<u32>,
}

impl JavaFrame {
    /// `java.lang.String.equals`: the class and method as scorch names a frame.
    pub fn display(&self) -> String {
        format!("{}.{}", self.class, self.method)
    }
}

/// A descriptor's parameters as Java writes them: `(Ljava/lang/String;I)V` ->
/// `(java.lang.String, int)`. None for a malformed descriptor.
pub fn demangle_signature(descriptor: &str) -> Option<String> {
    let inner = descriptor.strip_prefix('(')?;
    let (params, _) = inner.split_once(')')?;
    let mut out = Vec::new();
    let mut rest = params;
    while !rest.is_empty() {
        let (name, after) = demangle_type(rest)?;
        out.push(name);
        rest = after;
    }
    Some(format!("({})", out.join(", ")))
}

/// One field type from the start of `text`, and what follows it.
fn demangle_type(text: &str) -> Option<(String, &str)> {
    let mut dims = 0;
    let mut rest = text;
    while let Some(after) = rest.strip_prefix('[') {
        dims += 1;
        rest = after;
    }
    let first = rest.chars().next()?;
    let (base, after) = match first {
        'B' => ("byte".to_owned(), &rest[1..]),
        'C' => ("char".to_owned(), &rest[1..]),
        'D' => ("double".to_owned(), &rest[1..]),
        'F' => ("float".to_owned(), &rest[1..]),
        'I' => ("int".to_owned(), &rest[1..]),
        'J' => ("long".to_owned(), &rest[1..]),
        'S' => ("short".to_owned(), &rest[1..]),
        'Z' => ("boolean".to_owned(), &rest[1..]),
        'V' => ("void".to_owned(), &rest[1..]),
        'L' => {
            let (class, after) = rest[1..].split_once(';')?;
            (class.replace('/', "."), after)
        }
        _ => return None,
    };
    Some((format!("{base}{}", "[]".repeat(dims)), after))
}

fn unreadable(what: &'static str, address: u64) -> MethodError {
    MethodError::Unreadable { what, address }
}

fn pointer(memory: &dyn Memory, what: &'static str, address: u64) -> Result<u64, MethodError> {
    match read_u64(memory, address) {
        Some(0) => Err(MethodError::Null { what }),
        Some(value) => Ok(value),
        None => Err(unreadable(what, address)),
    }
}

/// The text of the `Symbol` at `address`: its header, then its body at its `u2` length, each
/// read once, decoded as the modified UTF-8 the JVM keeps; `None` for bytes that are not.
pub fn symbol(memory: &dyn Memory, layout: &Layout, address: u64) -> Result<String, MethodError> {
    symbol_text(memory, layout, address)?.ok_or(MethodError::Garbled {
        what: "symbol",
        address,
    })
}

fn symbol_text(
    memory: &dyn Memory,
    layout: &Layout,
    address: u64,
) -> Result<Option<String>, MethodError> {
    let mut header = [0u8; MAX_SYMBOL_SIZE as usize];
    let header = &mut header[..layout.symbol.size_of as usize];
    if !memory.read(address, header) {
        return Err(unreadable("Symbol", address));
    }
    let length = u16_in(header, layout.symbol.length) as usize;
    let body = address.wrapping_add(layout.symbol.body);
    let mut text = vec![0u8; length];
    if !memory.read(body, &mut text) {
        return Err(unreadable("Symbol's body", body));
    }
    Ok(modified_utf8(&text))
}

/// `bytes` as the JVM's modified UTF-8 (JVMS 4.4.7): UTF-8 but for NUL, written `C0 80`, and
/// supplementary characters, written as their two surrogates of three bytes each. `None`
/// for anything else, and for a control character, which no name holds.
pub fn modified_utf8(bytes: &[u8]) -> Option<String> {
    let mut text = String::with_capacity(bytes.len());
    let mut rest = bytes;
    while let Some(&first) = rest.first() {
        let (c, used) = match first {
            0x01..=0x7f => (u32::from(first), 1),
            0xc0..=0xdf => {
                let &[_, b, ..] = rest else { return None };
                if b & 0xc0 != 0x80 {
                    return None;
                }
                (u32::from(first & 0x1f) << 6 | u32::from(b & 0x3f), 2)
            }
            0xe0..=0xef => {
                let &[_, b, c, ..] = rest else { return None };
                if b & 0xc0 != 0x80 || c & 0xc0 != 0x80 {
                    return None;
                }
                let unit =
                    u32::from(first & 0x0f) << 12 | u32::from(b & 0x3f) << 6 | u32::from(c & 0x3f);
                if (0xd800..0xdc00).contains(&unit) {
                    // A high surrogate: its low one follows, three bytes more.
                    let &[_, _, _, d, e, f, ..] = rest else {
                        return None;
                    };
                    let low =
                        u32::from(d & 0x0f) << 12 | u32::from(e & 0x3f) << 6 | u32::from(f & 0x3f);
                    if d != 0xed
                        || e & 0xc0 != 0x80
                        || f & 0xc0 != 0x80
                        || !(0xdc00..0xe000).contains(&low)
                    {
                        return None;
                    }
                    (0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00), 6)
                } else {
                    (unit, 3)
                }
            }
            _ => return None,
        };
        let c = char::from_u32(c)?;
        if c.is_control() {
            return None;
        }
        text.push(c);
        rest = &rest[used..];
    }
    Some(text)
}

/// Whether `name` is a method's name as the JVM accepts one (JVMS 4.2.2): not empty, none
/// of `. ; [ /`, and `<` or `>` only in `<init>` and `<clinit>`.
pub fn is_method_name(name: &str) -> bool {
    name == "<init>"
        || name == "<clinit>"
        || (!name.is_empty() && !name.contains(['.', ';', '[', '/', '<', '>']))
}

/// Whether `name` is a class's name as `Klass::_name` holds one: an internal binary name
/// (JVMS 4.2.1; a hidden class's has a `/` and its address, or JDK 21's `+0x...`), or an
/// array's descriptor.
pub fn is_class_name(name: &str) -> bool {
    if let Some(element) = name.strip_prefix('[') {
        return !element.is_empty();
    }
    !name.is_empty()
        && !name.contains(['.', ';', '['])
        && name.split('/').all(|part| !part.is_empty())
}

/// Whether `descriptor` is a method descriptor's shape: `(` the parameters `)` the return.
fn is_method_descriptor(descriptor: &str) -> bool {
    descriptor.starts_with('(')
        && descriptor
            .split_once(')')
            .is_some_and(|(_, ret)| !ret.is_empty())
}

/// The `Symbol*` at `index` in the constant pool at `pool`. The low bit is masked, as OTel
/// does: older JDKs tag unresolved entries with it, and names are always symbols.
fn pool_symbol(
    memory: &dyn Memory,
    layout: &Layout,
    pool: u64,
    index: u16,
    what: &'static str,
) -> Result<String, MethodError> {
    if index == 0 {
        return Err(MethodError::NoIndex { what });
    }
    let entry = pool
        .wrapping_add(layout.constant_pool.size_of)
        .wrapping_add(8 * u64::from(index));
    let address = pointer(memory, what, entry)? & !1;
    symbol(memory, layout, address)
}

/// The method at `method` (a `Method*`), with the line of `bci` where it has a line table.
pub fn name_method(
    memory: &dyn Memory,
    layout: &Layout,
    method: u64,
    bci: u32,
) -> Result<JavaFrame, MethodError> {
    let const_method = pointer(
        memory,
        "Method._constMethod",
        method.wrapping_add(layout.method_const_method),
    )?;
    let cm = &layout.const_method;
    let mut bytes = vec![0u8; cm.size_of as usize];
    if !memory.read(const_method, &mut bytes) {
        return Err(unreadable("ConstMethod", const_method));
    }
    let pool = u64_in(&bytes, cm.constants);
    if pool == 0 {
        return Err(MethodError::Null {
            what: "ConstMethod._constants",
        });
    }
    let holder = pointer(
        memory,
        "ConstantPool._pool_holder",
        pool.wrapping_add(layout.constant_pool.pool_holder),
    )?;
    let name = pointer(
        memory,
        "Klass._name",
        holder.wrapping_add(layout.klass_name),
    )?;
    // Each name checked to be one the JVM gives: a class unloaded since the sample may have
    // had its symbols freed and their memory reused, while its Method and ConstMethod still
    // read as they were.
    let class = symbol(memory, layout, name)?;
    if !is_class_name(&class) {
        return Err(MethodError::Garbled {
            what: "class name",
            address: name,
        });
    }
    let class = class.replace('/', ".");
    let method_name = pool_symbol(
        memory,
        layout,
        pool,
        u16_in(&bytes, cm.name_index),
        "method name",
    )?;
    if !is_method_name(&method_name) {
        return Err(MethodError::Garbled {
            what: "method name",
            address: pool,
        });
    }
    let signature = pool_symbol(
        memory,
        layout,
        pool,
        u16_in(&bytes, cm.signature_index),
        "signature",
    )?;
    if !is_method_descriptor(&signature) {
        return Err(MethodError::Garbled {
            what: "method descriptor",
            address: pool,
        });
    }
    let file = source_file(memory, layout, pool, holder)?;

    let code_size = u16_in(&bytes, cm.code_size);
    let flags = bytes.get(cm.flags as usize).copied().unwrap_or(0);
    let line = if flags & HAS_LINE_TABLE != 0 {
        let table = const_method
            .wrapping_add(cm.size_of)
            .wrapping_add(u64::from(code_size));
        // A bci past the bytecode is no instruction of it; OTel names such a frame by its
        // first line, as this does.
        let bci = if bci >= u32::from(code_size) { 0 } else { bci };
        read_line(memory, table, layout.unsigned5_excluded, bci)?
    } else {
        None
    };
    Ok(JavaFrame {
        class,
        method: method_name,
        signature,
        file,
        line,
    })
}

/// The class's source file name, None where it has none.
fn source_file(
    memory: &dyn Memory,
    layout: &Layout,
    pool: u64,
    holder: u64,
) -> Result<Option<String>, MethodError> {
    let index_at = |address: u64| {
        let mut index = [0u8; 2];
        if memory.read(address, &mut index) {
            Ok(u16::from_le_bytes(index))
        } else {
            Err(unreadable("the source file's index", address))
        }
    };
    let index = match layout.source_file {
        SourceFile::PoolIndex(offset) => index_at(pool.wrapping_add(offset))?,
        SourceFile::KlassIndex(offset) => index_at(holder.wrapping_add(offset))?,
        SourceFile::KlassSymbol(offset) => {
            let address = holder.wrapping_add(offset);
            return match read_u64(memory, address) {
                Some(0) => Ok(None),
                Some(name) => symbol(memory, layout, name).map(Some),
                None => Err(unreadable("instanceKlass._source_file_name", address)),
            };
        }
    };
    if index == 0 {
        return Ok(None);
    }
    pool_symbol(memory, layout, pool, index, "source file").map(Some)
}

/// Reads the line stream at `address` in growing pieces (each page-bounded, as the stream may
/// end just before an unmapped page), decoding from the start after each, until it ends.
fn read_line(
    memory: &dyn Memory,
    address: u64,
    excluded: u8,
    bci: u32,
) -> Result<Option<u32>, MethodError> {
    let mut table: Vec<u8> = Vec::new();
    let mut want = FIRST_LINE_READ;
    let mut short = false;
    loop {
        let mut piece = usize::MAX;
        while table.len() < want {
            let at = address.wrapping_add(table.len() as u64);
            let to_page = (PAGE - at % PAGE) as usize;
            let len = to_page.min(want - table.len()).min(piece);
            let start = table.len();
            table.resize(start + len, 0);
            if memory.read(at, &mut table[start..]) {
                continue;
            }
            table.truncate(start);
            if len > 1 {
                // The stream may end just before unreadable memory within the piece: halve
                // it (at most 12 times, pieces being within a page).
                piece = len / 2;
                continue;
            }
            if table.is_empty() {
                return Err(unreadable("the line table", address));
            }
            // What was read may hold the whole stream.
            short = true;
            break;
        }
        match line_of(&table, excluded, bci) {
            Ok(line) => return Ok(line),
            Err(LineError::Truncated) if !short && want < MAX_LINE_TABLE => {
                want = (want * 2).min(MAX_LINE_TABLE);
            }
            Err(LineError::Truncated) if short => {
                return Err(unreadable("the line table", address + table.len() as u64));
            }
            Err(LineError::Truncated) | Err(LineError::TooMany) => {
                return Err(MethodError::Unended { address })
            }
            Err(LineError::Value(source)) => {
                return Err(MethodError::LineTable { address, source })
            }
        }
    }
}

/// Why a line stream was not decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineError {
    /// The bytes end before the stream does.
    Truncated,
    /// More than [`MAX_LINE_ENTRIES`] entries.
    TooMany,
    Value(Unsigned5Error),
}

/// The line of `bci` in the compressed line number stream `table` (pure): the line of the
/// entry with the largest bci not past `bci`, the later on a tie; None if no entry is.
pub fn line_of(table: &[u8], excluded: u8, bci: u32) -> Result<Option<u32>, LineError> {
    let mut reader = Reader::new(table, excluded);
    let (mut at_bci, mut at_line) = (0u32, 0u32);
    let mut best: Option<(u32, u32)> = None;
    let value = |e: Unsigned5Error| match e {
        Unsigned5Error::Truncated { .. } => LineError::Truncated,
        other => LineError::Value(other),
    };
    for _ in 0..MAX_LINE_ENTRIES {
        match reader.byte().map_err(value)? {
            0 => return Ok(best.map(|(_, line)| line)),
            0xFF => {
                at_bci = at_bci.wrapping_add(reader.signed().map_err(value)? as u32);
                at_line = at_line.wrapping_add(reader.signed().map_err(value)? as u32);
            }
            byte => {
                at_bci = at_bci.wrapping_add(u32::from(byte >> 3));
                at_line = at_line.wrapping_add(u32::from(byte & 7));
            }
        }
        if at_bci <= bci && best.is_none_or(|(b, _)| at_bci >= b) {
            best = Some((at_bci, at_line));
        }
    }
    Err(LineError::TooMany)
}
