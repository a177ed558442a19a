//! Names of V8 frames: the two words the BPF walk writes for a JavaScript frame (its subtype
//! and pointer, then a continuation with an offset and a cookie; `scorch_common::frame`),
//! read back against the process's heap with the layout its binary describes (`layout`).
//!
//! Each subtype leads to the function's `SharedFunctionInfo`, whose name and script name the
//! frame (`shared`):
//! - **Interpreted**, **Function**: the pointer is the `SharedFunctionInfo`.
//! - **Baseline**: the pointer is the `JSFunction` (Sparkplug's code keeps no way back to
//!   its function); its `shared`. Its line is its bytecode's, at the pc's bytecode, which
//!   the code's bytecode offset table gives (`bytecodes`).
//! - **Optimised**: the pointer is the `Code`, whose size and kind must still be the
//!   cookie's (code freed and its memory reused is left unnamed); its deoptimisation data's
//!   `SharedFunctionInfo`.
//!
//! Every object is checked to be of its type before it is read further. V8's collector
//! moves objects: one moved since the sample leaves a forwarding word where its map was, and
//! the frame is left unnamed ([`UNKNOWN_FRAME`]). A frame's line is the function's name (or
//! the one V8 inferred for it, else `(anonymous)`, as V8's own profiler shows it) and its
//! script (the file, as Node names it: a path, or a `file://` or `node:` URL).

use std::{collections::HashMap, ops::Range, sync::Arc};

use scorch_common::{v8_code_cookie, v8_frame_parts, V8Subtype};

use super::bytecodes::{BytecodeError, BytecodeSizes};
use super::code;
use super::layout::{Layout, FIXED_ARRAY_HEADER};
use super::positions::{self, Position, PositionError};
use super::shared::{function_name, script_name, SharedError};
use super::strings::{instance_type, read_string, untag, StringError};
use crate::profile::Line;
use crate::runtimes::memory::{read_u64, Memory};
use crate::runtimes::window::{bounded, Reader, WindowNames};

/// What the loader's attachment hands the namer for a Node process: its binary's layout, its
/// embedded builtins' code (in the process's addresses), where no `InstructionStream` is
/// looked for, and its bytecodes' sizes, when the binary's table of them was found.
#[derive(Debug, Clone)]
pub struct Process {
    pub layout: Arc<Layout>,
    pub builtins: Range<u64>,
    pub bytecodes: Option<Arc<BytecodeSizes>>,
}

/// The name of a frame that could not be named.
pub const UNKNOWN_FRAME: &str = "[v8: unknown frame]";
/// The name of a function without one, as V8's profiler and Chrome's tools show it.
pub const ANONYMOUS: &str = "(anonymous)";

/// Why a frame was not named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("not a V8 frame word")]
    NotV8,
    #[error("the walk kept no pointer (0)")]
    NoPointer,
    #[error("the object at {address:#x} has instance type {kind}, not a {expected}'s")]
    Type {
        address: u64,
        kind: u16,
        expected: &'static str,
    },
    #[error("the code found at the pc is another function's ({0:#x})")]
    OtherFunction(u64),
    #[error("the code found at the pc is of kind {0}, not optimised")]
    NotOptimised(u32),
    #[error("the code's size and kind are {found:#x}, not the sample's {expected:#x}: replaced")]
    Cookie { expected: u32, found: u32 },
    #[error("optimised code: this V8 keeps its function where this reader does not look")]
    NoDeoptimizationData,
    #[error("{what} at {address:#x}: unreadable")]
    Unreadable { what: &'static str, address: u64 },
    #[error("{what} of {length}, past what is believed")]
    TooLong { what: &'static str, length: u64 },
    #[error(transparent)]
    Positions(#[from] PositionError),
    #[error("baseline code's bytecode: {0}")]
    Bytecodes(#[from] BytecodeError),
    #[error(transparent)]
    Object(#[from] StringError),
    #[error(transparent)]
    Shared(#[from] SharedError),
}

/// The lines of the V8 frame (`word`, `more`: its first word and its continuation's
/// payload) in `memory`, innermost first: one per function inlined at an optimised frame's
/// pc, then the code's own. `scripts` keeps the scripts' line ends read so far.
pub fn name_frame(
    memory: &dyn Memory,
    process: &Process,
    word: u64,
    more: u64,
    scripts: &mut Scripts,
) -> Result<Vec<Line>, FrameError> {
    let (layout, builtins) = (&*process.layout, &process.builtins);
    let (subtype, pointer, detail, cookie) = v8_frame_parts(word, more).ok_or(FrameError::NotV8)?;
    if pointer == 0 {
        return Err(FrameError::NoPointer);
    }
    let tag = layout.tagging.heap_object_tag;
    match subtype {
        V8Subtype::Interpreted => {
            let shared = pointer | tag;
            // The position is a nicety: a function whose bytecode has none yet (V8 collects
            // them lazily) is named without its line.
            let offset = bytecode_position(memory, layout, shared, detail)
                .ok()
                .flatten();
            Ok(vec![line(memory, layout, shared, offset, scripts)?])
        }
        V8Subtype::Function => {
            let shared = pointer | tag;
            // The code the pc is in, where no field of the function holds it (a loop's
            // on-stack-replaced code): its lines and inlined functions, when it is this
            // function's optimised code.
            let pc = u64::from(detail) << 32 | u64::from(cookie);
            if pc != 0 && !builtins.contains(&pc) {
                if let Some(found) = code::code_at(memory, layout, pc) {
                    let offset = (pc - found.start) as u32;
                    if let Ok(lines) = optimised(
                        memory,
                        layout,
                        found.code,
                        offset,
                        None,
                        Some(shared),
                        scripts,
                    ) {
                        return Ok(lines);
                    }
                }
            }
            Ok(vec![line(memory, layout, shared, None, scripts)?])
        }
        V8Subtype::Baseline => {
            let functions = layout.types.first_function..=layout.types.last_function;
            of_type(memory, layout, pointer, "JSFunction", |k| {
                functions.contains(&k)
            })?;
            let shared = field(
                memory,
                pointer,
                layout.function_shared,
                "JSFunction::shared",
            )?;
            // As the interpreter's: the line a nicety, the name not.
            let offset = process.bytecodes.as_deref().and_then(|sizes| {
                baseline_position(memory, layout, sizes, shared, detail, cookie)
                    .ok()
                    .flatten()
            });
            Ok(vec![line(memory, layout, shared, offset, scripts)?])
        }
        V8Subtype::Optimised => {
            optimised(memory, layout, pointer, detail, Some(cookie), None, scripts)
        }
    }
}

/// The line of the function whose `SharedFunctionInfo` is `shared` (tagged), at script
/// offset `offset` when known.
fn line(
    memory: &dyn Memory,
    layout: &Layout,
    shared: u64,
    offset: Option<u32>,
    scripts: &mut Scripts,
) -> Result<Line, FrameError> {
    let name = function_name(memory, layout, shared)?.unwrap_or_else(|| ANONYMOUS.to_owned());
    let file = script_name(memory, layout, shared)?;
    // Columns from 1, as Node's stack traces and pprof count them (0 is pprof's unknown).
    let (line, column) = offset
        .and_then(|offset| {
            let ends = scripts.line_ends(memory, layout, shared)?;
            positions::line_of(&ends, offset)
        })
        .map_or((0, 0), |(line, column)| (line, column.saturating_add(1)));
    let name = bounded(name);
    Ok(Line {
        system_name: name.clone(),
        function: name,
        file: file.map(bounded),
        line,
        column,
    })
}

/// `Ok` when the object at `object` has an instance type `accepts` (a type `expected` is).
fn of_type(
    memory: &dyn Memory,
    layout: &Layout,
    object: u64,
    expected: &'static str,
    accepts: impl Fn(u16) -> bool,
) -> Result<(), FrameError> {
    let kind = instance_type(memory, layout, object)?;
    if accepts(kind) {
        Ok(())
    } else {
        Err(FrameError::Type {
            address: object,
            kind,
            expected,
        })
    }
}

/// The tagged word at `object + offset`.
fn field(
    memory: &dyn Memory,
    object: u64,
    offset: u16,
    what: &'static str,
) -> Result<u64, FrameError> {
    let address = object.wrapping_add(u64::from(offset));
    read_u64(memory, address).ok_or(FrameError::Unreadable { what, address })
}

/// The function `shared`'s (tagged) `BytecodeArray` (untagged), and its baseline `Code` when
/// it has one: `None` when the build keeps no positions.
fn function_bytecode(
    memory: &dyn Memory,
    layout: &Layout,
    shared: u64,
) -> Result<Option<(u64, Option<u64>)>, FrameError> {
    let (Some(positions), Ok(shared)) = (layout.positions, untag(layout, shared)) else {
        return Ok(None);
    };
    let data = untag(
        layout,
        field(
            memory,
            shared,
            positions.function_data,
            "SharedFunctionInfo::function_data",
        )?,
    )?;
    // With baseline code, the function's data is that `Code`, holding the bytecode where
    // optimised code holds its deoptimisation data.
    let (array, baseline) = if instance_type(memory, layout, data)? == layout.types.code {
        let Some(deoptimization) = layout.deoptimization else {
            return Ok(None);
        };
        let array = field(
            memory,
            data,
            deoptimization.code_field,
            "baseline Code's bytecode",
        )?;
        (untag(layout, array)?, Some(data))
    } else {
        (data, None)
    };
    of_type(memory, layout, array, "BytecodeArray", |k| {
        k == layout.types.bytecode_array
    })?;
    Ok(Some((array, baseline)))
}

/// The script offset of the bytecode at `index` of the `BytecodeArray` at `array`: `None`
/// when its positions are not collected yet.
fn bytecode_script_offset(
    memory: &dyn Memory,
    layout: &Layout,
    array: u64,
    index: u32,
) -> Result<Option<u32>, FrameError> {
    let Some(positions) = layout.positions else {
        return Ok(None);
    };
    let table = field(
        memory,
        array,
        positions.bytecode_table,
        "BytecodeArray's positions",
    )?;
    let Some(table) = byte_array(memory, layout, table)? else {
        return Ok(None);
    };
    Ok(positions::position_at(&table, index)?.script_offset())
}

/// The script offset of bytecode offset `detail` (as the frame keeps it, from the
/// `BytecodeArray`'s tagged address) of the function `shared`: `None` when the build or the
/// bytecode keeps no positions.
fn bytecode_position(
    memory: &dyn Memory,
    layout: &Layout,
    shared: u64,
    detail: u32,
) -> Result<Option<u32>, FrameError> {
    let (Some(positions), Some((array, _))) =
        (layout.positions, function_bytecode(memory, layout, shared)?)
    else {
        return Ok(None);
    };
    let Some(index) = detail.checked_sub(u32::from(positions.bytecode_data) - 1) else {
        return Ok(None);
    };
    bytecode_script_offset(memory, layout, array, index)
}

/// The script offset of a baseline frame of the function `shared` (tagged) at code offset
/// `pc`, when the function's baseline code is still the one the walk saw (`cookie`): the
/// position of the bytecode the code offset table puts the pc in. `None` in its prologue,
/// or when the build or the bytecode keeps no positions.
fn baseline_position(
    memory: &dyn Memory,
    layout: &Layout,
    sizes: &BytecodeSizes,
    shared: u64,
    pc: u32,
    cookie: u32,
) -> Result<Option<u32>, FrameError> {
    let (Some(positions), Some((array, Some(code)))) =
        (layout.positions, function_bytecode(memory, layout, shared)?)
    else {
        return Ok(None);
    };
    let (found, _) = code_cookie(memory, layout, code)?;
    if found != cookie {
        return Err(FrameError::Cookie {
            expected: cookie,
            found,
        });
    }
    // Baseline code keeps its bytecode offset table where other code keeps its positions.
    let table = field(
        memory,
        code,
        positions.code_table,
        "baseline Code's bytecode offsets",
    )?;
    let Some(table) = byte_array(memory, layout, table)? else {
        return Ok(None);
    };
    let length = field(
        memory,
        array,
        positions.array_length,
        "BytecodeArray::length",
    )? >> 32;
    if length > MAX_TABLE as u64 {
        return Err(FrameError::TooLong {
            what: "a BytecodeArray",
            length,
        });
    }
    let mut bytecodes = vec![0u8; length as usize];
    let at = array.wrapping_add(u64::from(positions.bytecode_data));
    if !memory.read(at, &mut bytecodes) {
        return Err(FrameError::Unreadable {
            what: "a BytecodeArray's bytecodes",
            address: at,
        });
    }
    let Some(index) = sizes.bytecode_at(&table, &bytecodes, u64::from(pc))? else {
        return Ok(None);
    };
    bytecode_script_offset(memory, layout, array, index as u32)
}

/// The cookie of the `Code` at `code` (its size and kind, as the walk makes it), and its
/// kind.
fn code_cookie(memory: &dyn Memory, layout: &Layout, code: u64) -> Result<(u32, u32), FrameError> {
    let word = |offset: u16, what| -> Result<u32, FrameError> {
        let address = code.wrapping_add(u64::from(offset));
        let mut bytes = [0u8; 4];
        if memory.read(address, &mut bytes) {
            Ok(u32::from_le_bytes(bytes))
        } else {
            Err(FrameError::Unreadable { what, address })
        }
    };
    let flags = word(layout.code.flags, "Code::flags")?;
    let size = word(layout.code.instruction_size, "Code::instruction_size")?;
    let kind = layout.code_kind.of(flags);
    Ok((v8_code_cookie(size, kind), kind))
}

/// The bytes of the `ByteArray` at the tagged `tagged`, at most [`MAX_TABLE`]; `None` when
/// it is no heap object (`undefined` for positions not collected yet) or not a `ByteArray`.
fn byte_array(
    memory: &dyn Memory,
    layout: &Layout,
    tagged: u64,
) -> Result<Option<Vec<u8>>, FrameError> {
    let Some(positions) = layout.positions else {
        return Ok(None);
    };
    let Ok(array) = untag(layout, tagged) else {
        return Ok(None);
    };
    if instance_type(memory, layout, array)? != positions.byte_array_type {
        return Ok(None);
    }
    let length = field(memory, array, positions.array_length, "ByteArray::length")? >> 32;
    if length > MAX_TABLE as u64 {
        return Err(FrameError::TooLong {
            what: "a ByteArray",
            length,
        });
    }
    let mut bytes = vec![0u8; length as usize];
    let at = array.wrapping_add(FIXED_ARRAY_HEADER);
    if !memory.read(at, &mut bytes) {
        return Err(FrameError::Unreadable {
            what: "a ByteArray's bytes",
            address: at,
        });
    }
    Ok(Some(bytes))
}

/// The first `count` tagged elements of the `FixedArray` (or weak one: a weak element is
/// tagged 3) at the tagged `tagged`.
fn elements(
    memory: &dyn Memory,
    layout: &Layout,
    tagged: u64,
    count: u64,
) -> Result<Vec<u64>, FrameError> {
    let array = untag(layout, tagged)?;
    let length_at = layout.positions.map_or(8, |p| p.array_length);
    let length = field(memory, array, length_at, "FixedArray::length")? >> 32;
    if count > length || count > MAX_INLINED as u64 {
        return Err(FrameError::TooLong {
            what: "an array's elements",
            length: count,
        });
    }
    let mut bytes = vec![0u8; count as usize * 8];
    let at = array.wrapping_add(FIXED_ARRAY_HEADER);
    if !memory.read(at, &mut bytes) {
        return Err(FrameError::Unreadable {
            what: "an array's elements",
            address: at,
        });
    }
    Ok(bytes
        .chunks_exact(8)
        // A weak reference's tag (3) as a strong one's (1).
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) & !2)
        .collect())
}

/// The lines of the optimised `Code` at `code` at pc offset `offset`, once its size and kind
/// are checked against the frame's cookie (when the walk saw the code) and its function is
/// `expected` (when the frame named it): the functions inlined there, innermost first, then
/// its own.
fn optimised(
    memory: &dyn Memory,
    layout: &Layout,
    code: u64,
    offset: u32,
    cookie: Option<u32>,
    expected: Option<u64>,
    scripts: &mut Scripts,
) -> Result<Vec<Line>, FrameError> {
    of_type(memory, layout, code, "Code", |k| k == layout.types.code)?;
    let (found, kind) = code_cookie(memory, layout, code)?;
    match cookie {
        Some(cookie) if found != cookie => {
            return Err(FrameError::Cookie {
                expected: cookie,
                found,
            })
        }
        // Found from the pc: optimised code only (baseline code keeps no function).
        None if kind <= layout.code_kind.baseline => return Err(FrameError::NotOptimised(kind)),
        _ => {}
    }
    let deoptimization = layout
        .deoptimization
        .ok_or(FrameError::NoDeoptimizationData)?;
    let data = field(
        memory,
        code,
        deoptimization.code_field,
        "Code::deoptimization_data",
    )?;
    let last = deoptimization
        .shared_index
        .max(deoptimization.inlined_count_index)
        .max(deoptimization.literal_array_index)
        .max(deoptimization.inlining_positions_index);
    let entries = elements(memory, layout, data, u64::from(last) + 1)?;
    let entry = |index: u8| entries[usize::from(index)];
    let mut shared = entry(deoptimization.shared_index);
    // V8 13's wrapper; what it holds is checked as any function is, when it is named.
    if let Some(at) = deoptimization.shared_wrapper {
        shared = field(
            memory,
            untag(layout, shared)?,
            at,
            "SharedFunctionInfoWrapper::shared_info",
        )?;
    }
    if expected.is_some_and(|expected| expected != shared) {
        return Err(FrameError::OtherFunction(shared));
    }
    let position = match layout.positions {
        Some(positions) => {
            let table = field(memory, code, positions.code_table, "Code's positions")?;
            match byte_array(memory, layout, table)? {
                Some(table) => positions::position_at(&table, offset)?,
                None => Position::default(),
            }
        }
        None => Position::default(),
    };
    let inlined = entry(deoptimization.inlined_count_index) >> 32;
    let frames = if inlined == 0 || position.inlining_id().is_none() {
        vec![(position, None)]
    } else {
        let inlining = entry(deoptimization.inlining_positions_index);
        let inlining = byte_array(memory, layout, inlining)?.unwrap_or_default();
        positions::inlined_frames(&inlining, position)?
    };
    let literals = if frames.iter().any(|(_, f)| f.is_some()) {
        elements(
            memory,
            layout,
            entry(deoptimization.literal_array_index),
            inlined,
        )?
    } else {
        Vec::new()
    };
    frames
        .into_iter()
        .map(|(position, function)| {
            let shared = match function {
                Some(index) => *literals.get(index as usize).ok_or(FrameError::TooLong {
                    what: "an inlined function's index",
                    length: u64::from(index),
                })?,
                None => shared,
            };
            line(memory, layout, shared, position.script_offset(), scripts)
        })
        .collect()
}

/// Most bytes of a position table read.
pub const MAX_TABLE: usize = 1 << 20;
/// Most functions inlined into one optimised function believed.
pub const MAX_INLINED: usize = 4096;
/// Most characters of a script's source read to count its lines.
pub const MAX_SOURCE: usize = 4 << 20;
/// Most lines of a script believed.
pub const MAX_LINES: u64 = 1 << 20;
/// Most line ends kept at once, over every script: past it, a script met for the first
/// time in the window is named without lines.
pub const MAX_CACHED_LINES: usize = 1 << 20;
/// Most scripts remembered a window (as many as the frames a window names at most).
pub const MAX_SCRIPTS: usize = crate::runtimes::window::MAX_CACHED;

/// The line ends of the scripts met this window, by process and script address.
#[derive(Debug, Default)]
pub struct Scripts {
    pid: u32,
    kept: HashMap<(u32, u64), Option<Arc<Vec<u32>>>>,
    lines: usize,
}

impl Scripts {
    /// Names frames of process `pid` from now on.
    pub fn process(&mut self, pid: u32) {
        self.pid = pid;
    }

    /// Forgets every script: its memory may be another's by the next window.
    pub fn clear(&mut self) {
        self.kept.clear();
        self.lines = 0;
    }

    /// The line ends of the script of the function `shared` (tagged), from its `line_ends`
    /// or its source; `None` when it has neither (or they cannot be read).
    fn line_ends(
        &mut self,
        memory: &dyn Memory,
        layout: &Layout,
        shared: u64,
    ) -> Option<Arc<Vec<u32>>> {
        let shared = untag(layout, shared).ok()?;
        let script = read_u64(memory, shared.wrapping_add(u64::from(layout.shared_script)))?;
        let script = untag(layout, script).ok()?;
        if let Some(kept) = self.kept.get(&(self.pid, script)) {
            return kept.clone();
        }
        let ends = script_line_ends(memory, layout, script).map(Arc::new);
        let lines = ends.as_ref().map_or(0, |e| e.len());
        // Read once a window: a script whose lines do not fit is kept as having none (its
        // frames are named without lines), never read again for each of its frames.
        let ends = if self.lines + lines <= MAX_CACHED_LINES {
            self.lines += lines;
            ends
        } else {
            None
        };
        if self.kept.len() < MAX_SCRIPTS {
            self.kept.insert((self.pid, script), ends.clone());
        }
        ends
    }
}

/// The line ends of the `Script` at `script`.
fn script_line_ends(memory: &dyn Memory, layout: &Layout, script: u64) -> Option<Vec<u32>> {
    if instance_type(memory, layout, script).ok()? != layout.types.script {
        return None;
    }
    let positions = layout.positions?;
    let ends = read_u64(
        memory,
        script.wrapping_add(u64::from(layout.script_line_ends)),
    )?;
    if let Ok(array) = untag(layout, ends) {
        if instance_type(memory, layout, array).ok()? == positions.fixed_array_type {
            let count = read_u64(
                memory,
                array.wrapping_add(u64::from(positions.array_length)),
            )? >> 32;
            if count == 0 || count > MAX_LINES {
                return None;
            }
            let mut bytes = vec![0u8; count as usize * 8];
            if !memory.read(array.wrapping_add(FIXED_ARRAY_HEADER), &mut bytes) {
                return None;
            }
            // Smis: the value in the upper half.
            return Some(
                bytes
                    .chunks_exact(8)
                    .map(|b| (u64::from_le_bytes(b.try_into().expect("8 bytes")) >> 32) as u32)
                    .collect(),
            );
        }
    }
    // Not counted yet: count them in the source.
    let source = read_u64(memory, script.wrapping_add(u64::from(layout.script_source)))?;
    let text = read_string(memory, layout, source, MAX_SOURCE).ok()?;
    let units: Vec<u16> = text.encode_utf16().collect();
    Some(positions::line_ends(&units))
}

/// V8's [`Reader`]: the scripts' line ends it read this window.
#[derive(Debug, Default)]
pub struct V8Reader {
    scripts: Scripts,
}

impl Reader for V8Reader {
    type Process = Process;
    const UNKNOWN: &'static str = UNKNOWN_FRAME;
    const RUNTIME: &'static str = "V8";

    fn read(
        &mut self,
        pid: u32,
        memory: &dyn Memory,
        process: &Process,
        word: u64,
        more: u64,
    ) -> Result<Vec<Line>, String> {
        self.scripts.process(pid);
        name_frame(memory, process, word, more, &mut self.scripts).map_err(|err| err.to_string())
    }

    fn end_window(&mut self) {
        self.scripts.clear();
    }
}

/// Names V8 frames; see the module documentation.
pub type V8Names = WindowNames<V8Reader>;
