//! Names of V8 frames: the two words the BPF walk writes for a JavaScript frame (its subtype
//! and pointer, then a continuation with an offset and a cookie; `scorch_common::frame`),
//! read back against the process's heap with the layout its binary describes (`layout`).
//!
//! Each subtype leads to the function's `SharedFunctionInfo`, whose name and script name the
//! frame (`shared`):
//! - **Interpreted**, **Function**: the pointer is the `SharedFunctionInfo`.
//! - **Baseline**: the pointer is the `JSFunction` (Sparkplug's code keeps no way back to
//!   its function); its `shared`.
//! - **Optimised**: the pointer is the `Code`, whose size and kind must still be the
//!   cookie's (code freed and its memory reused is left unnamed); its deoptimisation data's
//!   `SharedFunctionInfo`.
//!
//! Every object is checked to be of its type before it is read further. V8's collector
//! moves objects: one moved since the sample leaves a forwarding word where its map was, and
//! the frame is left unnamed ([`UNKNOWN_FRAME`]). A frame's line is the function's name
//! (`(anonymous)` for a function without one, as V8's own profiler shows it) and its script
//! (the file, as Node names it: a path, or a `file://` or `node:` URL).

use std::sync::Arc;

use scorch_common::{v8_code_cookie, v8_frame_parts, V8Subtype};

use super::layout::{Layout, FIXED_ARRAY_HEADER};
use super::shared::{function_name, script_name, SharedError};
use super::strings::{instance_type, untag, StringError};
use crate::profile::Line;
use crate::runtimes::memory::{read_u64, Memory};
use crate::runtimes::window::{bounded, Reader, WindowNames};

/// What the loader's attachment hands the namer for a Node process: its binary's layout.
#[derive(Debug, Clone)]
pub struct Process {
    pub layout: Arc<Layout>,
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
    #[error("the code's size and kind are {found:#x}, not the sample's {expected:#x}: replaced")]
    Cookie { expected: u32, found: u32 },
    #[error("optimised code: this V8 keeps its function where this reader does not look")]
    NoDeoptimizationData,
    #[error("{what} at {address:#x}: unreadable")]
    Unreadable { what: &'static str, address: u64 },
    #[error(transparent)]
    Object(#[from] StringError),
    #[error(transparent)]
    Shared(#[from] SharedError),
}

/// The lines of the V8 frame (`word`, `more`: its first word and its continuation's
/// payload) in `memory`, innermost first.
pub fn name_frame(
    memory: &dyn Memory,
    layout: &Layout,
    word: u64,
    more: u64,
) -> Result<Vec<Line>, FrameError> {
    let (subtype, pointer, _detail, cookie) =
        v8_frame_parts(word, more).ok_or(FrameError::NotV8)?;
    if pointer == 0 {
        return Err(FrameError::NoPointer);
    }
    let tag = layout.tagging.heap_object_tag;
    let shared = match subtype {
        V8Subtype::Interpreted | V8Subtype::Function => pointer | tag,
        V8Subtype::Baseline => {
            let kind = instance_type(memory, layout, pointer)?;
            if !(layout.types.first_function..=layout.types.last_function).contains(&kind) {
                return Err(FrameError::Type {
                    address: pointer,
                    kind,
                    expected: "JSFunction",
                });
            }
            field(
                memory,
                pointer,
                layout.function_shared,
                "JSFunction::shared",
            )?
        }
        V8Subtype::Optimised => optimised_shared(memory, layout, pointer, cookie)?,
    };
    let name = function_name(memory, layout, shared)?.unwrap_or_else(|| ANONYMOUS.to_owned());
    let file = script_name(memory, layout, shared)?;
    let name = bounded(name);
    Ok(vec![Line {
        system_name: name.clone(),
        function: name,
        file: file.map(bounded),
        line: 0,
    }])
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

/// The `SharedFunctionInfo` (tagged) of the optimised `Code` at `code`, once its size and
/// kind are checked against the frame's cookie.
fn optimised_shared(
    memory: &dyn Memory,
    layout: &Layout,
    code: u64,
    cookie: u32,
) -> Result<u64, FrameError> {
    let kind = instance_type(memory, layout, code)?;
    if kind != layout.types.code {
        return Err(FrameError::Type {
            address: code,
            kind,
            expected: "Code",
        });
    }
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
    let found = v8_code_cookie(size, layout.code_kind.of(flags));
    if found != cookie {
        return Err(FrameError::Cookie {
            expected: cookie,
            found,
        });
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
    let data = untag(layout, data)?;
    let at = FIXED_ARRAY_HEADER + 8 * u64::from(deoptimization.shared_index);
    let shared = read_u64(memory, data.wrapping_add(at)).ok_or(FrameError::Unreadable {
        what: "DeoptimizationData's SharedFunctionInfo",
        address: data.wrapping_add(at),
    })?;
    Ok(shared)
}

/// V8's [`Reader`].
#[derive(Debug, Clone, Copy, Default)]
pub struct V8Reader;

impl Reader for V8Reader {
    type Process = Process;
    const UNKNOWN: &'static str = UNKNOWN_FRAME;
    const RUNTIME: &'static str = "V8";

    fn read(
        &self,
        memory: &dyn Memory,
        process: &Process,
        word: u64,
        more: u64,
    ) -> Result<Vec<Line>, String> {
        name_frame(memory, &process.layout, word, more).map_err(|err| err.to_string())
    }
}

/// Names V8 frames; see the module documentation.
pub type V8Names = WindowNames<V8Reader>;
