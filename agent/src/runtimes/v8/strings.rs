//! V8's strings, read from a process's memory: function names, script names.
//!
//! A V8 string is one of several representations, told by its map's instance type: a
//! sequential string holds its characters (one byte or two each); a cons string is the
//! concatenation of two strings; a thin string forwards to its internalised copy; a sliced
//! string is a part of another. An external string's characters are outside the heap, behind
//! a C++ object; Node keeps its builtin modules' sources so, never names, and they are not
//! read.
//!
//! The memory is another process's: at most [`MAX_PIECES`] pieces are visited (a cons
//! string's tree, whatever its shape or cycles) and at most the asked number of characters
//! read.

use super::layout::{Layout, Strings};
use crate::runtimes::memory::{read_i32, read_u16, read_u64, Memory};

/// Pieces of one string visited at most: names are flat or a few concatenations deep.
pub const MAX_PIECES: usize = 32;

/// Why a string was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StringError {
    #[error("{0:#x} is not a heap object")]
    NotAnObject(u64),
    #[error("unreadable memory at {0:#x}")]
    Unreadable(u64),
    #[error("the object at {address:#x} has instance type {kind}, not a string's")]
    NotAString { address: u64, kind: u16 },
    #[error("an external string (its characters are outside V8's heap)")]
    External,
    #[error("a string of more than {MAX_PIECES} pieces")]
    TooManyPieces,
    #[error("the string at {address:#x} claims {length} characters")]
    BadLength { address: u64, length: i32 },
}

/// The string at the tagged pointer `tagged`, cut at `max` characters.
pub fn read_string(
    memory: &dyn Memory,
    layout: &Layout,
    tagged: u64,
    max: usize,
) -> Result<String, StringError> {
    let strings = &layout.strings;
    let mut text = String::new();
    let mut length = 0usize;
    // Pieces to read, the next one last, each with where in it to start (a slice's offset)
    // and how much of it is wanted at most.
    let mut pending = vec![(tagged, 0usize, usize::MAX)];
    let mut visited = 0;
    while let Some((tagged, skip, wanted)) = pending.pop() {
        if length >= max {
            break;
        }
        visited += 1;
        if visited > MAX_PIECES {
            return Err(StringError::TooManyPieces);
        }
        let object = untag(layout, tagged)?;
        let kind = instance_type(memory, layout, object)?;
        if kind >= strings.first_nonstring_type {
            return Err(StringError::NotAString {
                address: object,
                kind,
            });
        }
        let field = |offset: u16| {
            read_u64(memory, object.wrapping_add(u64::from(offset))).ok_or(StringError::Unreadable(
                object.wrapping_add(u64::from(offset)),
            ))
        };
        match kind & strings.representation_mask {
            r if r == strings.sequential => {
                let count = read_i32(memory, object.wrapping_add(u64::from(strings.length)))
                    .ok_or(StringError::Unreadable(object))?;
                let count = usize::try_from(count).map_err(|_| StringError::BadLength {
                    address: object,
                    length: count,
                })?;
                let take = count.saturating_sub(skip).min(wanted).min(max - length);
                let one_byte = kind & strings.encoding_mask == strings.one_byte;
                let width = if one_byte { 1 } else { 2 };
                let start = object
                    .wrapping_add(u64::from(strings.characters))
                    .wrapping_add(skip.saturating_mul(width) as u64);
                let mut bytes = vec![0u8; take * width];
                if !memory.read(start, &mut bytes) {
                    return Err(StringError::Unreadable(start));
                }
                if one_byte {
                    // Latin-1: each byte is the code point.
                    text.extend(bytes.iter().map(|&b| char::from(b)));
                } else {
                    let units = bytes
                        .chunks_exact(2)
                        .map(|c| u16::from_le_bytes([c[0], c[1]]));
                    text.extend(char::decode_utf16(units).map(|c| c.unwrap_or('\u{fffd}')));
                }
                length += take;
            }
            r if r == strings.cons => {
                // First then second, within what the slice around them wants.
                let first = field(strings.cons_first)?;
                let second = field(strings.cons_second)?;
                let first_length = read_i32(
                    memory,
                    untag(layout, first)?.wrapping_add(u64::from(strings.length)),
                )
                .ok_or(StringError::Unreadable(first))?;
                let first_length = usize::try_from(first_length).unwrap_or(0);
                if skip >= first_length {
                    pending.push((second, skip - first_length, wanted));
                } else {
                    let from_first = first_length - skip;
                    if wanted > from_first {
                        pending.push((second, 0, wanted - from_first));
                    }
                    pending.push((first, skip, wanted.min(from_first)));
                }
            }
            r if r == strings.thin => pending.push((field(strings.thin_actual)?, skip, wanted)),
            r if r == strings.sliced => {
                let parent = field(strings.sliced_parent)?;
                let offset = field(strings.sliced_offset)?;
                // A Smi: its value in the upper half.
                let offset = (offset >> layout.tagging.smi_shift) as usize;
                let count = read_i32(memory, object.wrapping_add(u64::from(strings.length)))
                    .ok_or(StringError::Unreadable(object))?;
                let count = usize::try_from(count).unwrap_or(0);
                pending.push((
                    parent,
                    offset.saturating_add(skip),
                    count.saturating_sub(skip).min(wanted),
                ));
            }
            r if r == strings.external => return Err(StringError::External),
            _ => {
                return Err(StringError::NotAString {
                    address: object,
                    kind,
                })
            }
        }
    }
    Ok(text)
}

/// The address of the heap object `tagged` points to.
pub fn untag(layout: &Layout, tagged: u64) -> Result<u64, StringError> {
    let tagging = &layout.tagging;
    if tagged & tagging.heap_object_tag_mask != tagging.heap_object_tag {
        return Err(StringError::NotAnObject(tagged));
    }
    Ok(tagged - tagging.heap_object_tag)
}

/// The instance type of the heap object at `object`, through its map.
pub fn instance_type(
    memory: &dyn Memory,
    layout: &Layout,
    object: u64,
) -> Result<u16, StringError> {
    let at = object.wrapping_add(u64::from(layout.map));
    let map = read_u64(memory, at).ok_or(StringError::Unreadable(at))?;
    let map = untag(layout, map)?;
    let at = map.wrapping_add(u64::from(layout.instance_type));
    read_u16(memory, at).ok_or(StringError::Unreadable(at))
}

impl Strings {
    /// Whether `kind` is a string's instance type.
    pub fn is_string(&self, kind: u16) -> bool {
        kind < self.first_nonstring_type
    }
}
