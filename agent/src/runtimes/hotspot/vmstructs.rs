//! HotSpot's tables about itself: `gHotSpotVMStructs` (each field of each class the JVM
//! describes: its offset, or a static's address) and `gHotSpotVMTypes` (each type's size),
//! read from a running JVM's memory.
//!
//! The tables are what the serviceability agent reads, so every HotSpot build since JDK 6
//! exports them, with the geometry of their entries in globals beside them
//! (`gHotSpotVMStructEntryArrayStride`, `...TypeNameOffset`, ...). Those globals are read from
//! the process, never the file: Debian's JDK 17 keeps them in `.bss`, set by a static
//! constructor when libjvm is loaded, and the tables' pointers are relocated.
//!
//! The memory is another process's and is not trusted: every read is bounded (the geometry
//! checked before the walk, at most [`MAX_ENTRIES`] entries, names of at most [`MAX_NAME`]
//! bytes read in chunks that stay within a page), and a table that breaks a bound is an error
//! naming it, never a long loop or a large allocation.

use std::collections::HashMap;

use super::super::image::Image;
use crate::runtimes::memory::{read_u64, Memory};

/// The little-endian value at `offset` in bytes read whole (a class at its `sizeof`); 0 when
/// it lies past them, which the layout's bounds rule out for the offsets it gives.
fn le_in<const N: usize>(bytes: &[u8], offset: u64) -> [u8; N] {
    usize::try_from(offset)
        .ok()
        .and_then(|at| bytes.get(at..at.checked_add(N)?))
        .and_then(|b| b.try_into().ok())
        .unwrap_or([0; N])
}

pub(super) fn u16_in(bytes: &[u8], offset: u64) -> u16 {
    u16::from_le_bytes(le_in(bytes, offset))
}

pub(super) fn i32_in(bytes: &[u8], offset: u64) -> i32 {
    i32::from_le_bytes(le_in(bytes, offset))
}

pub(super) fn u64_in(bytes: &[u8], offset: u64) -> u64 {
    u64::from_le_bytes(le_in(bytes, offset))
}

/// Why a C string was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StringError {
    /// A byte before the terminator could not be read.
    Unreadable,
    /// No terminator within the bound.
    TooLong,
}

/// Bytes a string is read in at a time: names are short, and a read never crosses a page, so
/// a string ending just before an unmapped page still reads.
const STRING_CHUNK: u64 = 64;
const PAGE: u64 = 4096;

/// The NUL-terminated string at `address`, of at most `max` bytes before its terminator.
pub fn read_c_string(memory: &dyn Memory, address: u64, max: usize) -> Result<String, StringError> {
    let mut text = Vec::new();
    let mut at = address;
    // `max` bytes and the terminator: every pass reads at least one byte, so this ends.
    while text.len() <= max {
        let to_page = PAGE - at % PAGE;
        let left = (max + 1 - text.len()) as u64;
        let len = STRING_CHUNK.min(to_page).min(left) as usize;
        let mut chunk = [0u8; STRING_CHUNK as usize];
        let chunk = &mut chunk[..len];
        if !memory.read(at, chunk) {
            return Err(StringError::Unreadable);
        }
        if let Some(end) = chunk.iter().position(|&b| b == 0) {
            text.extend_from_slice(&chunk[..end]);
            return Ok(String::from_utf8_lossy(&text).into_owned());
        }
        text.extend_from_slice(chunk);
        at = at.checked_add(len as u64).ok_or(StringError::Unreadable)?;
    }
    Err(StringError::TooLong)
}

/// Most entries read from one table. The tables hold one entry per field or type the
/// serviceability agent knows: several hundred each in Debian's JDK 17 (the real-JVM test
/// prints them), more as JDKs add fields. This leaves room for twenty times that while bounding
/// what a table without its terminating entry costs: at most this many entries of at most
/// [`MAX_STRIDE`] bytes, 4 MiB, read one entry at a time, and as many names. (OTel's bound,
/// 131,072, allows eight times more reading for no table that exists.)
pub const MAX_ENTRIES: u64 = 16_384;
/// Longest type or field name read. The longest HotSpot describes are template types such as
/// `GrowableArray<...>` and `Array<...>`, far shorter.
pub const MAX_NAME: usize = 256;
/// Widest entry: `VMStructEntry` is six words, `VMTypeEntry` five on 64-bit builds; the bound
/// is OTel's, several times either.
pub const MAX_STRIDE: u64 = 256;
/// Narrowest entry: one pointer, the type name every entry starts from.
pub const MIN_STRIDE: u64 = 8;

/// The ELF addresses of the globals describing one table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StructSymbols {
    /// `gHotSpotVMStructs`: a pointer to the first entry.
    pub table: u64,
    pub stride: u64,
    pub type_name: u64,
    pub field_name: u64,
    pub is_static: u64,
    pub offset: u64,
    pub address: u64,
}

/// The ELF addresses of the globals describing `gHotSpotVMTypes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeSymbols {
    /// `gHotSpotVMTypes`: a pointer to the first entry.
    pub table: u64,
    pub stride: u64,
    pub type_name: u64,
    pub size: u64,
}

/// What a libjvm binary says of where its tables are: read once per binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Symbols {
    pub structs: StructSymbols,
    pub types: TypeSymbols,
}

/// The symbols [`Symbols::of`] reads, in the order of the fields they fill.
pub const STRUCT_SYMBOLS: [&str; 7] = [
    "gHotSpotVMStructs",
    "gHotSpotVMStructEntryArrayStride",
    "gHotSpotVMStructEntryTypeNameOffset",
    "gHotSpotVMStructEntryFieldNameOffset",
    "gHotSpotVMStructEntryIsStaticOffset",
    "gHotSpotVMStructEntryOffsetOffset",
    "gHotSpotVMStructEntryAddressOffset",
];
pub const TYPE_SYMBOLS: [&str; 4] = [
    "gHotSpotVMTypes",
    "gHotSpotVMTypeEntryArrayStride",
    "gHotSpotVMTypeEntryTypeNameOffset",
    "gHotSpotVMTypeEntrySizeOffset",
];

/// Why a JVM's tables were not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VmStructsError {
    #[error("defines gHotSpotVMStructs or gHotSpotVMTypes but not {0}")]
    Missing(&'static str),
    #[error(
        "{table} not yet set up (its pointer or entry stride is still 0): the JVM is starting"
    )]
    NotYetSetUp { table: &'static str },
    #[error("{what} at {address:#x}: unreadable")]
    Unreadable { what: &'static str, address: u64 },
    #[error("{table}: an entry stride of {stride} bytes, not {MIN_STRIDE} to {MAX_STRIDE}")]
    Stride { table: &'static str, stride: u64 },
    #[error("{table}: an entry's {field} at byte {offset} does not fit its stride of {stride}")]
    FieldOutsideEntry {
        table: &'static str,
        field: &'static str,
        offset: u64,
        stride: u64,
    },
    #[error("{table}: no terminating entry within {MAX_ENTRIES} entries")]
    NoEnd { table: &'static str },
    #[error("{table}: a name at {address:#x} is unreadable")]
    NameUnreadable { table: &'static str, address: u64 },
    #[error("{table}: a name at {address:#x} is longer than {MAX_NAME} bytes")]
    NameTooLong { table: &'static str, address: u64 },
}

impl Symbols {
    /// The eleven globals as consecutive words from `base`, in [`STRUCT_SYMBOLS`]' then
    /// [`TYPE_SYMBOLS`]' order: the layout the fuzz target and the tests give a JVM's memory.
    pub fn consecutive(base: u64) -> Symbols {
        let word = |i: u64| base + 8 * i;
        Symbols {
            structs: StructSymbols {
                table: word(0),
                stride: word(1),
                type_name: word(2),
                field_name: word(3),
                is_static: word(4),
                offset: word(5),
                address: word(6),
            },
            types: TypeSymbols {
                table: word(7),
                stride: word(8),
                type_name: word(9),
                size: word(10),
            },
        }
    }

    /// The tables' symbols in `image`: `Ok(None)` when it defines neither table (it is not a
    /// HotSpot libjvm), an error naming the first missing symbol when it defines one.
    pub fn of(image: &Image) -> Result<Option<Symbols>, VmStructsError> {
        if image.symbol(STRUCT_SYMBOLS[0]).is_none() && image.symbol(TYPE_SYMBOLS[0]).is_none() {
            return Ok(None);
        }
        let address = |name: &'static str| {
            image
                .symbol(name)
                .map(|s| s.address)
                .ok_or(VmStructsError::Missing(name))
        };
        let [table, stride, type_name, field_name, is_static, offset, at] =
            STRUCT_SYMBOLS.map(address);
        let structs = StructSymbols {
            table: table?,
            stride: stride?,
            type_name: type_name?,
            field_name: field_name?,
            is_static: is_static?,
            offset: offset?,
            address: at?,
        };
        let [table, stride, type_name, size] = TYPE_SYMBOLS.map(address);
        let types = TypeSymbols {
            table: table?,
            stride: stride?,
            type_name: type_name?,
            size: size?,
        };
        Ok(Some(Symbols { structs, types }))
    }
}

/// What an entry of `gHotSpotVMStructs` says of a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// A member at this offset in its class.
    Offset(u64),
    /// A static at this ELF address of libjvm (the process's address less its load bias), so
    /// the tables read from one process hold for every process mapping the same binary.
    Static(u64),
}

/// The tables as read: the fields and sizes of the types asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmStructs {
    /// By type name, then field name.
    pub fields: HashMap<String, HashMap<String, Field>>,
    /// Each type's `sizeof`, by name.
    pub sizes: HashMap<String, u64>,
    /// Entries in each table, every type's counted (not only those kept).
    pub struct_entries: u64,
    pub type_entries: u64,
}

impl VmStructs {
    pub fn field(&self, type_name: &str, field: &str) -> Option<Field> {
        self.fields.get(type_name)?.get(field).copied()
    }

    pub fn size(&self, type_name: &str) -> Option<u64> {
        self.sizes.get(type_name).copied()
    }
}

/// One table's geometry, read from the process and checked before any entry is.
struct Table {
    name: &'static str,
    first: u64,
    stride: u64,
    type_name: u64,
}

/// Reads the tables of the JVM whose libjvm, with `symbols`, is loaded at `bias` in
/// `memory`, keeping the types `wanted` says yes to (each entry's type name is read to know;
/// the field names of other types are not).
pub fn read(
    memory: &dyn Memory,
    symbols: &Symbols,
    bias: u64,
    wanted: &dyn Fn(&str) -> bool,
) -> Result<VmStructs, VmStructsError> {
    let global = |what: &'static str, elf: u64| {
        let address = elf.wrapping_add(bias);
        read_u64(memory, address).ok_or(VmStructsError::Unreadable { what, address })
    };
    let s = &symbols.structs;
    let structs = table(
        memory,
        "gHotSpotVMStructs",
        s.table,
        s.stride,
        s.type_name,
        bias,
    )?;
    let field_name = global(STRUCT_SYMBOLS[3], s.field_name)?;
    let is_static = global(STRUCT_SYMBOLS[4], s.is_static)?;
    let offset = global(STRUCT_SYMBOLS[5], s.offset)?;
    let address = global(STRUCT_SYMBOLS[6], s.address)?;
    for (field, at, width) in [
        ("type name", structs.type_name, 8),
        ("field name", field_name, 8),
        ("static flag", is_static, 4),
        ("offset", offset, 8),
        ("address", address, 8),
    ] {
        fits(&structs, field, at, width)?;
    }
    let t = &symbols.types;
    let types = table(
        memory,
        "gHotSpotVMTypes",
        t.table,
        t.stride,
        t.type_name,
        bias,
    )?;
    let size = global(TYPE_SYMBOLS[3], t.size)?;
    fits(&types, "type name", types.type_name, 8)?;
    fits(&types, "size", size, 8)?;

    let mut names = Names::default();
    let mut tables = VmStructs::default();
    let (entries, kept) = walk(memory, &structs, &mut names, wanted, |names, entry| {
        let field = names.read(memory, structs.name, word(entry, field_name))?;
        let value = if u32_at(entry, is_static) != 0 {
            Field::Static(word(entry, address).wrapping_sub(bias))
        } else {
            Field::Offset(word(entry, offset))
        };
        Ok((field, value))
    })?;
    tables.struct_entries = entries;
    for (type_name, (field, value)) in kept {
        tables
            .fields
            .entry(type_name)
            .or_default()
            .insert(field, value);
    }
    let (entries, kept) = walk(memory, &types, &mut names, wanted, |_, entry| {
        Ok((String::new(), Field::Offset(word(entry, size))))
    })?;
    tables.type_entries = entries;
    for (type_name, (_, value)) in kept {
        if let Field::Offset(size) = value {
            tables.sizes.insert(type_name, size);
        }
    }
    Ok(tables)
}

/// A table's first entry and geometry, checked.
fn table(
    memory: &dyn Memory,
    name: &'static str,
    table: u64,
    stride: u64,
    type_name: u64,
    bias: u64,
) -> Result<Table, VmStructsError> {
    let global = |what: &'static str, elf: u64| {
        let address = elf.wrapping_add(bias);
        read_u64(memory, address).ok_or(VmStructsError::Unreadable { what, address })
    };
    let first = global(name, table)?;
    let stride = global("the entry stride", stride)?;
    let type_name = global("the type name's offset", type_name)?;
    // Before libjvm's static constructors have run, the geometry globals (in `.bss` on
    // Debian) are still zero: the JVM is starting, and a later look will find them.
    if first == 0 || stride == 0 {
        return Err(VmStructsError::NotYetSetUp { table: name });
    }
    if !(MIN_STRIDE..=MAX_STRIDE).contains(&stride) {
        return Err(VmStructsError::Stride {
            table: name,
            stride,
        });
    }
    Ok(Table {
        name,
        first,
        stride,
        type_name,
    })
}

fn fits(table: &Table, field: &'static str, offset: u64, width: u64) -> Result<(), VmStructsError> {
    match offset.checked_add(width) {
        Some(end) if end <= table.stride => Ok(()),
        _ => Err(VmStructsError::FieldOutsideEntry {
            table: table.name,
            field,
            offset,
            stride: table.stride,
        }),
    }
}

/// An entry's word at `offset` (checked by [`fits`] to lie within it).
fn word(entry: &[u8], offset: u64) -> u64 {
    let at = offset as usize;
    entry
        .get(at..at + 8)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

fn u32_at(entry: &[u8], offset: u64) -> u32 {
    let at = offset as usize;
    entry
        .get(at..at + 4)
        .map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
}

/// Names read so far, by address: entries of one type share its name's string, so each is
/// read once.
#[derive(Default)]
struct Names {
    read: HashMap<u64, String>,
}

impl Names {
    fn read(
        &mut self,
        memory: &dyn Memory,
        table: &'static str,
        address: u64,
    ) -> Result<String, VmStructsError> {
        if let Some(name) = self.read.get(&address) {
            return Ok(name.clone());
        }
        let name = read_c_string(memory, address, MAX_NAME).map_err(|e| match e {
            StringError::Unreadable => VmStructsError::NameUnreadable { table, address },
            StringError::TooLong => VmStructsError::NameTooLong { table, address },
        })?;
        self.read.insert(address, name.clone());
        Ok(name)
    }
}

/// What one kept entry gives: its type's name, and what `keep` made of it.
type Kept = Vec<(String, (String, Field))>;

/// Walks `table` to its entry with a null type name: how many entries it has, and what
/// `keep` made of those of the types `wanted`.
fn walk(
    memory: &dyn Memory,
    table: &Table,
    names: &mut Names,
    wanted: &dyn Fn(&str) -> bool,
    mut keep: impl FnMut(&mut Names, &[u8]) -> Result<(String, Field), VmStructsError>,
) -> Result<(u64, Kept), VmStructsError> {
    let mut entry = vec![0u8; table.stride as usize];
    let mut kept = Vec::new();
    for index in 0..MAX_ENTRIES {
        let address = index
            .checked_mul(table.stride)
            .and_then(|offset| table.first.checked_add(offset))
            .ok_or(VmStructsError::NoEnd { table: table.name })?;
        if !memory.read(address, &mut entry) {
            return Err(VmStructsError::Unreadable {
                what: table.name,
                address,
            });
        }
        let type_name = word(&entry, table.type_name);
        if type_name == 0 {
            return Ok((index, kept));
        }
        let type_name = names.read(memory, table.name, type_name)?;
        if !wanted(&type_name) {
            continue;
        }
        let value = keep(names, &entry)?;
        kept.push((type_name, value));
    }
    Err(VmStructsError::NoEnd { table: table.name })
}
