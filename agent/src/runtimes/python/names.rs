//! Names of Python frames: the code objects the BPF walk sent, read from the process's memory
//! with the offsets its interpreter was recognised with (`runtimes::python`).
//!
//! A Python frame arrives as a code object's address and an instruction offset. The code
//! object is read (bounded: a fixed header, strings of at most [`MAX_STRING`] bytes, a
//! location table of at most [`MAX_LINETABLE`]) and checked to be one (its type is the
//! interpreter's `PyCode_Type`), and cached by (process, address) for the window: an address
//! freed and reused by another code object within a window is the one case a stale name could
//! be given, and the cache is dropped every window to keep it that small.

use std::collections::HashMap;

use std::{any::Any, sync::Arc};

use scorch_common::python_frame_parts;

use super::Offsets;
use crate::{profile::Line, runtimes::Names, sys::memory};

/// A process's interpreter, in the process's addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PythonProcess {
    /// `PyCode_Type` in the process.
    pub code_type: u64,
    pub offsets: Offsets,
}

/// Longest string read from a process (a qualified name or a file name).
pub const MAX_STRING: usize = 1024;
/// Longest location table read (a code object's `co_linetable`).
pub const MAX_LINETABLE: usize = 64 * 1024;
/// Most code objects remembered at once.
const MAX_CODE: usize = 65_536;

/// The name of a frame whose code object could not be read or is not one.
pub const UNKNOWN_CODE: &str = "[python: unknown code object]";

/// What a code object says of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Code {
    qualname: String,
    filename: String,
    firstlineno: i64,
    linetable: Vec<u8>,
}

/// Names Python frames; see the module documentation.
#[derive(Debug, Default)]
pub struct PythonNames {
    processes: HashMap<u32, PythonProcess>,
    code: HashMap<(u32, u64), Option<Code>>,
    /// The most `code` took since the window started, and in the last window
    /// ([`Names::window_bytes`]).
    peak_bytes: usize,
    window_bytes: usize,
    /// Frames named and frames left unknown, since start.
    pub named: u64,
    pub unknown: u64,
}

impl PythonNames {
    /// Notes that `pid` runs an interpreter (or, with `None`, no longer does).
    pub fn set_process(&mut self, pid: u32, process: Option<PythonProcess>) {
        match process {
            Some(process) => {
                self.processes.insert(pid, process);
            }
            None => {
                self.processes.remove(&pid);
            }
        }
    }

    /// Reads the code object at `code` in `pid` now, while the process runs, unless it was
    /// read this window: the BPF side reports each new stack's code objects, so a process
    /// that exits before the window ends is named from what was read here.
    pub fn capture(&mut self, pid: u32, code: u64) {
        let Some(process) = self.processes.get(&pid).copied() else {
            return;
        };
        if self.code.len() >= MAX_CODE {
            return;
        }
        self.code
            .entry((pid, code))
            .or_insert_with(|| read_code(pid, code, &process));
    }

    /// Forgets what was read: called once a window, so a reused address is read again.
    pub fn end_window(&mut self, alive: impl Fn(u32) -> bool) {
        self.window_bytes = self.peak_bytes.max(self.code_bytes());
        self.peak_bytes = 0;
        self.code.clear();
        self.processes.retain(|&pid, _| alive(pid));
    }

    /// What the code objects read take: each entry's slot and its names and line table.
    fn code_bytes(&self) -> usize {
        self.code
            .values()
            .map(|code| {
                size_of::<((u32, u64), Option<Code>)>()
                    + code.as_ref().map_or(0, |code| {
                        code.qualname.capacity()
                            + code.filename.capacity()
                            + code.linetable.capacity()
                    })
            })
            .sum()
    }

    /// The line of the frame at `code` (an address in `pid`), `instr` code units into it.
    pub fn line(&mut self, pid: u32, code: u64, instr: u16) -> Line {
        let process = self.processes.get(&pid).copied();
        if self.code.len() >= MAX_CODE {
            self.peak_bytes = self.peak_bytes.max(self.code_bytes());
            self.code.clear();
        }
        let read = self
            .code
            .entry((pid, code))
            .or_insert_with(|| process.and_then(|p| read_code(pid, code, &p)));
        match read {
            Some(code) => {
                self.named += 1;
                Line {
                    function: code.qualname.clone(),
                    system_name: code.qualname.clone(),
                    file: Some(code.filename.clone()),
                    line: line_of(&code.linetable, code.firstlineno, instr)
                        .and_then(|line| u32::try_from(line).ok())
                        .unwrap_or(0),
                    column: 0,
                }
            }
            None => {
                self.unknown += 1;
                Line::named(UNKNOWN_CODE)
            }
        }
    }
}

impl Names for PythonNames {
    fn attach(&mut self, pid: u32, process: Option<Arc<dyn Any + Send + Sync>>) {
        let process = process.and_then(|p| p.downcast_ref::<PythonProcess>().copied());
        self.set_process(pid, process);
    }

    fn capture(&mut self, pid: u32, word: u64, _more: u64) {
        // A Python frame is one word (no continuation). Code 0 is a frame whose code object
        // the walk could not keep: nothing to read.
        if let Some((code @ 1.., _)) = python_frame_parts(word) {
            PythonNames::capture(self, pid, code);
        }
    }

    fn end_window(&mut self, alive: &dyn Fn(u32) -> bool) {
        PythonNames::end_window(self, alive);
    }

    fn lines(&mut self, pid: u32, word: u64, _more: u64) -> Vec<Line> {
        let (code, instr) = python_frame_parts(word).unwrap_or((0, 0));
        vec![PythonNames::line(self, pid, code, instr)]
    }

    fn counts(&self) -> (u64, u64) {
        (self.named, self.unknown)
    }

    fn window_bytes(&self) -> usize {
        self.window_bytes
    }
}

fn read_u32(bytes: &[u8], at: u16) -> Option<u32> {
    bytes
        .get(at as usize..at as usize + 4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
}

fn read_u64(bytes: &[u8], at: u16) -> Option<u64> {
    bytes
        .get(at as usize..at as usize + 8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// Reads the code object at `address`, `None` when it is not one or cannot be read.
fn read_code(pid: u32, address: u64, process: &PythonProcess) -> Option<Code> {
    let offsets = &process.offsets;
    if address == 0 {
        return None;
    }
    let mut header = vec![0u8; usize::from(offsets.code.code_adaptive).min(1024)];
    memory::read(pid, address, &mut header)?;
    // `ob_type`, at 8 in every object.
    if read_u64(&header, 8)? != process.code_type {
        return None;
    }
    let code = &offsets.code;
    let qualname = read_string(pid, read_u64(&header, code.qualname)?, offsets)?;
    let filename = read_string(pid, read_u64(&header, code.filename)?, offsets)?;
    let firstlineno = i64::from(read_u32(&header, code.firstlineno)? as i32);
    let linetable =
        read_bytes(pid, read_u64(&header, code.linetable)?, offsets).unwrap_or_default();
    Some(Code {
        qualname,
        filename,
        firstlineno,
        linetable,
    })
}

/// A `str` object's text: compact strings only (the interpreter makes every identifier and
/// file name one), ASCII or of one, two or four bytes a character.
fn read_string(pid: u32, address: u64, offsets: &Offsets) -> Option<String> {
    let mut header = [0u8; 64];
    let header_len = usize::from(offsets.unicode_data).min(header.len());
    memory::read(pid, address, &mut header[..header_len])?;
    let length = usize::try_from(read_u64(&header, offsets.unicode_length)?).ok()?;
    let state = read_u32(&header, offsets.unicode_state)?;
    let (kind, compact, ascii) = ((state >> 2) & 7, state >> 5 & 1 == 1, state >> 6 & 1 == 1);
    if !compact || length > MAX_STRING {
        return None;
    }
    if ascii {
        let mut text = vec![0u8; length];
        memory::read(pid, address + u64::from(offsets.unicode_data), &mut text)?;
        return String::from_utf8(text).ok();
    }
    // A compact non-ASCII string keeps its characters after `PyCompactUnicodeObject`: the
    // ASCII header plus `utf8_length` and `utf8` (and 3.11's `wstr_length`).
    let compact_header =
        u64::from(offsets.unicode_data) + if offsets.unicode_data == 48 { 24 } else { 16 };
    let width = match kind {
        1 => 1,
        2 => 2,
        4 => 4,
        _ => return None,
    };
    let mut data = vec![0u8; length * width];
    memory::read(pid, address + compact_header, &mut data)?;
    let chars: Option<String> = data
        .chunks_exact(width)
        .map(|c| {
            let mut value = [0u8; 4];
            value[..width].copy_from_slice(c);
            char::from_u32(u32::from_le_bytes(value))
        })
        .collect();
    chars
}

/// A `bytes` object's contents, at most [`MAX_LINETABLE`].
fn read_bytes(pid: u32, address: u64, offsets: &Offsets) -> Option<Vec<u8>> {
    let size = memory::read_u64(pid, address + u64::from(offsets.bytes_size))?;
    let size = usize::try_from(size).ok().filter(|&s| s <= MAX_LINETABLE)?;
    let mut data = vec![0u8; size];
    memory::read(pid, address + u64::from(offsets.bytes_data), &mut data)?;
    Some(data)
}

/// An unsigned varint of the location table: 6 bits a byte, bit 6 set when more follow.
fn varint(table: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    let mut shift = 0;
    loop {
        let byte = *table.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x3f) << shift;
        if byte & 0x40 == 0 || shift > 56 {
            return Some(value);
        }
        shift += 6;
    }
}

/// A signed varint: the sign in the low bit.
fn svarint(table: &[u8], at: &mut usize) -> Option<i64> {
    let value = varint(table, at)?;
    let magnitude = (value >> 1) as i64;
    Some(if value & 1 == 1 {
        -magnitude
    } else {
        magnitude
    })
}

/// The line of code unit `instr`, from a 3.11+ location table (`Objects/locations.md`):
/// entries of one header byte (bit 7 set; the kind in bits 3-6, the code units covered less
/// one in bits 0-2) and the kind's data. `None` where the table says there is no line.
pub fn line_of(table: &[u8], firstlineno: i64, instr: u16) -> Option<i64> {
    let (mut at, mut line, mut unit) = (0usize, firstlineno, 0u64);
    while at < table.len() {
        let header = table[at];
        at += 1;
        if header & 0x80 == 0 {
            return None;
        }
        let kind = (header >> 3) & 15;
        let units = u64::from(header & 7) + 1;
        let this = match kind {
            15 => None,
            14 => {
                line += svarint(table, &mut at)?;
                for _ in 0..3 {
                    varint(table, &mut at)?;
                }
                Some(line)
            }
            13 => {
                line += svarint(table, &mut at)?;
                Some(line)
            }
            10..=12 => {
                line += i64::from(kind - 10);
                at += 2;
                Some(line)
            }
            _ => {
                at += 1;
                Some(line)
            }
        };
        if (unit..unit + units).contains(&u64::from(instr)) {
            return this;
        }
        unit += units;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table as CPython 3.11 writes it for a function of first line 10: a no-column entry
    /// (line +1) for 2 units, a short entry (same line) for 3, one-line forms (+1, +2) for 1
    /// each, a long entry (-4) for 2, and a none entry for 1.
    const TABLE: &[u8] = &[
        0x80 | (13 << 3) | 1,
        0x02, // line 11, units 0-1
        0x80 | (2 << 3) | 2,
        0x00, // line 11, units 2-4
        0x80 | (11 << 3),
        0x01,
        0x02, // line 12, unit 5
        0x80 | (12 << 3),
        0x01,
        0x02, // line 14, unit 6
        0x80 | (14 << 3) | 1,
        0x09,
        0x00,
        0x01,
        0x02,             // line 10, units 7-8
        0x80 | (15 << 3), // no line, unit 9
    ];

    #[test]
    fn lines_from_the_location_table() {
        let lines: Vec<Option<i64>> = (0..11).map(|u| line_of(TABLE, 10, u)).collect();
        assert_eq!(
            lines,
            [
                Some(11),
                Some(11),
                Some(11),
                Some(11),
                Some(11),
                Some(12),
                Some(14),
                Some(10),
                Some(10),
                None,
                None
            ]
        );
    }

    #[test]
    fn a_cut_or_corrupt_table_gives_no_line() {
        assert_eq!(line_of(&TABLE[..1], 10, 0), None);
        assert_eq!(line_of(&[0x00, 0x01], 10, 0), None);
        // A varint that never ends is bounded by the table.
        assert_eq!(line_of(&[0x80 | (13 << 3), 0x7f, 0x7f, 0x7f], 10, 0), None);
    }

    #[test]
    fn this_process_memory_reads_back() {
        let value: u64 = 0x1122_3344_5566_7788;
        let address = &value as *const u64 as u64;
        assert_eq!(memory::read_u64(std::process::id(), address), Some(value));
        // An address nothing maps fails, it does not fault.
        assert_eq!(memory::read_u64(std::process::id(), 8), None);
    }
}
