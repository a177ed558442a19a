//! Names of HotSpot frames: the two words the BPF walk wrote for each Java frame (its subtype
//! and pointer, then a continuation with a detail and a cookie; `scorch_common::frame`), read
//! back against the JVM's memory with the layout its libjvm describes (`layout`).
//!
//! - **Interpreted** (`Method*`, bci, `ConstMethod*` >> 3): the method's `_constMethod` must
//!   still be the one the walk saw, else the `Method` was freed (its class unloaded) and
//!   maybe reused; then [`name_method`]. A bci of `0xffff` (the walk could not read it) gives
//!   the method without a line.
//! - **Compiled** (nmethod, pc offset, compile id): [`name_compiled`], whose compile id check
//!   is the cookie's; one line per method inlined at the pc, innermost first, as one
//!   location.
//! - **Stub, vtable chunks** (`CodeBlob*`, pc offset, the name's first four bytes): the blob's
//!   `_name`, as async-profiler shows such frames (`Interpreter`, `StubRoutines (1)`,
//!   `vtable chunks`): a JVM user knows these names from its flame graphs, and the frame's
//!   kind (`FrameKind::Jvm`) tells them from a native function in pprof and OTLP.
//!
//! A Java frame's line: `function` is the class and method (`java.lang.String.equals`), as
//! async-profiler and JFR's views name a frame; `system_name` adds the JVM's descriptor
//! (`java.lang.String.equals(Ljava/lang/Object;)Z`), the method as the class file spells it
//! (what `system_name` is to a native frame's mangled name, and what async-profiler's
//! `--sig` and JFR's `descriptor` give), which tells overloads apart; `file` the class's
//! source file (`String.java`) and `line` its line, 0 when unknown.
//!
//! A frame that cannot be named (memory unreadable, a cookie that does not match, an nmethod
//! evicted) is [`UNKNOWN_FRAME`], never another frame's name.
//!
//! Frames are named while their process runs, and kept for the window (`runtimes::window`):
//! a class is unloaded, an nmethod is flushed, and the words then point at nothing or at
//! something else. The memory is another process's: the readers are bounded (`method`,
//! `nmethod`), a blob's name is read to at most [`MAX_BLOB_NAME`] bytes, and every name kept
//! is cut to [`MAX_NAME`] bytes.

use std::sync::Arc;

use scorch_common::{hotspot_cookie_parts, hotspot_frame_parts, HotspotSubtype};

use super::layout::Layout;
use super::method::{name_method, JavaFrame, MethodError};
use super::nmethod::{name_compiled, NmethodError};
use super::vmstructs::{read_c_string, StringError};
use crate::profile::Line;
use crate::runtimes::memory::{read_u64, Memory};
use crate::runtimes::window::{bounded, Reader, WindowNames};
pub use crate::runtimes::window::{MAX_CACHED, MAX_CACHED_TEXT, MAX_NAME};

/// What the loader's attachment hands the namer for a JVM process (through
/// `Attachment::process`): its layout, read once from its libjvm's tables.
#[derive(Debug, Clone)]
pub struct Process {
    pub layout: Arc<Layout>,
    /// `Universe::_collectedHeap` in the process (0: the JVM does not say): the collections
    /// count a frame's cookie carries is read again through it before the frame is named.
    pub collected_heap: u64,
}

/// The name of a frame that could not be named: unreadable, freed and reused, or a process
/// the namer was not told of.
pub const UNKNOWN_FRAME: &str = "[jvm: unknown frame]";
/// Longest blob name read (HotSpot's are short: `StubRoutines (1)`, `I2C/C2I adapters`).
pub const MAX_BLOB_NAME: usize = 256;
/// The bci the walk writes when it could not read the frame's.
pub const UNKNOWN_BCI: u32 = 0xffff;

/// Why a frame was not named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("not a HotSpot frame word")]
    NotHotspot,
    #[error("the walk kept no pointer (0)")]
    NoPointer,
    #[error("{what} at {address:#x}: unreadable")]
    Unreadable { what: &'static str, address: u64 },
    #[error("{what} is {found:#x}, not the sample's {expected:#x}: freed and reused")]
    Cookie {
        what: &'static str,
        expected: u32,
        found: u32,
    },
    #[error(
        "sampled after collection {sampled} (its low 8 bits), named after {now}: its class \
         may be unloaded"
    )]
    Collected { sampled: u32, now: u32 },
    #[error("the blob's name at {address:#x}: {reason:?}")]
    BlobName { address: u64, reason: StringError },
    #[error(transparent)]
    Method(#[from] MethodError),
    #[error(transparent)]
    Compiled(#[from] NmethodError),
}

/// `Ok` when the JVM has counted as many collections (their low 8 bits) as when the frame
/// was sampled, which its cookie carries: a class is unloaded only by a collection, and one
/// unloaded since may have had its symbols freed and their memory reused by another class's,
/// while its `Method` still reads as it was. Stubs are never unloaded; a JVM that does not
/// say how many it made is taken at its word (the walk wrote 0).
pub fn same_collections(
    memory: &dyn Memory,
    process: &Process,
    word: u64,
    more: u64,
) -> Result<(), FrameError> {
    let Some((subtype, _, _, cookie)) = hotspot_frame_parts(word, more) else {
        return Err(FrameError::NotHotspot);
    };
    if matches!(subtype, HotspotSubtype::Stub | HotspotSubtype::Vtable) {
        return Ok(());
    }
    let (Some(collections), true) = (process.layout.collections, process.collected_heap != 0)
    else {
        return Ok(());
    };
    let heap = read_u64(memory, process.collected_heap).ok_or(FrameError::Unreadable {
        what: "Universe::_collectedHeap",
        address: process.collected_heap,
    })?;
    let at = heap.wrapping_add(collections.total);
    let mut count = [0u8; 4];
    if !memory.read(at, &mut count) {
        return Err(FrameError::Unreadable {
            what: "CollectedHeap::_total_collections",
            address: at,
        });
    }
    let (_, sampled) = hotspot_cookie_parts(cookie);
    let now = u32::from_le_bytes(count) & 0xff;
    if now == sampled {
        Ok(())
    } else {
        Err(FrameError::Collected { sampled, now })
    }
}

/// The lines of the HotSpot frame (`word`, `more`: its first word and its continuation's
/// payload) in `memory`, innermost first.
pub fn name_frame(
    memory: &dyn Memory,
    layout: &Layout,
    word: u64,
    more: u64,
) -> Result<Vec<Line>, FrameError> {
    let (subtype, pointer, detail, cookie) =
        hotspot_frame_parts(word, more).ok_or(FrameError::NotHotspot)?;
    if pointer == 0 {
        return Err(FrameError::NoPointer);
    }
    match subtype {
        HotspotSubtype::Interpreted => {
            let at = pointer.wrapping_add(layout.method_const_method);
            let const_method = read_u64(memory, at).ok_or(FrameError::Unreadable {
                what: "Method._constMethod",
                address: at,
            })?;
            let (check, _) = hotspot_cookie_parts(cookie);
            let (found, _) = hotspot_cookie_parts((const_method >> 3) as u32);
            if found != check {
                return Err(FrameError::Cookie {
                    what: "Method._constMethod >> 3 (its low 24 bits)",
                    expected: check,
                    found,
                });
            }
            let bci = if detail == UNKNOWN_BCI { 0 } else { detail };
            let mut frame = name_method(memory, layout, pointer, bci)?;
            if detail == UNKNOWN_BCI {
                frame.line = None;
            }
            Ok(vec![java_line(frame)])
        }
        HotspotSubtype::Compiled => {
            let (compile_id, _) = hotspot_cookie_parts(cookie);
            let frames = name_compiled(memory, layout, pointer, detail, compile_id)?;
            Ok(frames.into_iter().map(java_line).collect())
        }
        HotspotSubtype::Stub | HotspotSubtype::Vtable => {
            let at = pointer.wrapping_add(layout.code_blob.name);
            let name = read_u64(memory, at).ok_or(FrameError::Unreadable {
                what: "CodeBlob._name",
                address: at,
            })?;
            // The walk read the name's first four bytes as they lie, terminator or not.
            let mut first = [0u8; 4];
            if !memory.read(name, &mut first) {
                return Err(FrameError::Unreadable {
                    what: "the blob's name",
                    address: name,
                });
            }
            let found = u32::from_le_bytes(first);
            if found != cookie {
                return Err(FrameError::Cookie {
                    what: "the blob name's first bytes",
                    expected: cookie,
                    found,
                });
            }
            let text = read_c_string(memory, name, MAX_BLOB_NAME).map_err(|reason| {
                FrameError::BlobName {
                    address: name,
                    reason,
                }
            })?;
            let text = bounded(text);
            Ok(vec![Line::named(text)])
        }
    }
}

/// A Java frame's line (see the module documentation).
fn java_line(frame: JavaFrame) -> Line {
    let function = frame.display();
    Line {
        system_name: bounded(format!("{function}{}", frame.signature)),
        function: bounded(function),
        file: frame.file.map(bounded),
        line: frame.line.unwrap_or(0),
        column: 0,
    }
}

/// HotSpot's [`Reader`]: a frame's collections count, then its words.
#[derive(Debug, Clone, Copy, Default)]
pub struct HotspotReader;

impl Reader for HotspotReader {
    type Process = Process;
    const UNKNOWN: &'static str = UNKNOWN_FRAME;
    const RUNTIME: &'static str = "HotSpot";

    fn read(
        &mut self,
        _: u32,
        memory: &dyn Memory,
        process: &Process,
        word: u64,
        more: u64,
    ) -> Result<Vec<Line>, String> {
        same_collections(memory, process, word, more)
            .and_then(|()| name_frame(memory, &process.layout, word, more))
            .map_err(|err| err.to_string())
    }
}

/// Names HotSpot frames; see the module documentation.
pub type HotspotNames = WindowNames<HotspotReader>;

#[cfg(test)]
mod tests;
