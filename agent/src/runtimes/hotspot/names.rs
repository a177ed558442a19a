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
//! Frames are named at [`Names::capture`], while their process runs: a process exits, a class
//! is unloaded, an nmethod is flushed, and the words then point at nothing or at something
//! else. What is named is kept for the window, by (process, word, continuation), at most
//! [`MAX_CACHED`] frames and [`MAX_CACHED_TEXT`] bytes of names, and dropped at its end (an
//! address freed and reused within a window is the one case a stale name is given; the
//! cookies catch most of those). Past the bound, frames are named when their lines are asked.
//!
//! The memory is another process's: the readers are bounded (`method`, `nmethod`), a blob's
//! name is read to at most [`MAX_BLOB_NAME`] bytes, and every name kept is cut to
//! [`MAX_NAME`] bytes, so a hostile process costs at most the cache's bound.

use std::{any::Any, collections::HashMap, sync::Arc};

use scorch_common::{hotspot_cookie_parts, hotspot_frame_parts, HotspotSubtype};

use super::layout::Layout;
use super::method::{name_method, JavaFrame, MethodError};
use super::nmethod::{name_compiled, NmethodError};
use super::vmstructs::{read_c_string, StringError};
use crate::runtimes::memory::{read_u64, Memory, ProcessMemory};
use crate::{profile::Line, runtimes::Names};

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
/// Longest name kept (a function, a system name or a file). A class file allows names of 64
/// KiB; none a compiler writes for a real class comes near this, and the cut bounds what a
/// hostile process makes the agent keep per line.
pub const MAX_NAME: usize = 4096;
/// Most frames kept named at once.
pub const MAX_CACHED: usize = 65_536;
/// Most bytes of names kept at once: real frames take a few hundred bytes each, so the frame
/// bound is reached first; this one holds when names are long.
pub const MAX_CACHED_TEXT: usize = 32 << 20;
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
            Ok(vec![Line {
                function: text.clone(),
                system_name: text,
                file: None,
                line: 0,
            }])
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
    }
}

/// `text` cut to [`MAX_NAME`] bytes, on a character's boundary.
fn bounded(mut text: String) -> String {
    if text.len() > MAX_NAME {
        let mut end = MAX_NAME;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// The bytes of names a frame's lines keep.
fn text_size(lines: &[Line]) -> usize {
    lines
        .iter()
        .map(|l| l.function.len() + l.system_name.len() + l.file.as_ref().map_or(0, String::len))
        .sum()
}

/// Whose memory frames are read from.
enum Source {
    /// Each frame's process's own.
    Processes,
    /// The same bytes for every process (the tests).
    Given(Arc<dyn Memory + Send + Sync>),
}

/// Names HotSpot frames; see the module documentation.
pub struct HotspotNames {
    /// Each JVM process's layout, from its attachment.
    processes: HashMap<u32, Process>,
    /// Frames named this window (`None`: left unknown), by (process, word, continuation).
    cache: HashMap<(u32, u64, u64), Option<Vec<Line>>>,
    /// The bytes of names `cache` holds, against [`MAX_CACHED_TEXT`].
    cached_text: usize,
    /// What the last window's names took ([`Names::window_bytes`]).
    window_bytes: usize,
    source: Source,
    /// Frames named and frames left unknown, since start.
    pub named: u64,
    pub unknown: u64,
}

impl std::fmt::Debug for HotspotNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HotspotNames")
            .field("processes", &self.processes.len())
            .field("cached", &self.cache.len())
            .field("named", &self.named)
            .field("unknown", &self.unknown)
            .finish_non_exhaustive()
    }
}

impl Default for HotspotNames {
    fn default() -> HotspotNames {
        HotspotNames::new()
    }
}

impl HotspotNames {
    /// A namer reading each frame's process's memory.
    pub fn new() -> HotspotNames {
        HotspotNames::with_source(Source::Processes)
    }

    /// A namer reading every process's frames from `memory` (the tests).
    pub fn reading(memory: Arc<dyn Memory + Send + Sync>) -> HotspotNames {
        HotspotNames::with_source(Source::Given(memory))
    }

    fn with_source(source: Source) -> HotspotNames {
        HotspotNames {
            processes: HashMap::new(),
            cache: HashMap::new(),
            cached_text: 0,
            window_bytes: 0,
            source,
            named: 0,
            unknown: 0,
        }
    }

    /// Notes that `pid` runs a JVM of `layout` (or, with `None`, no longer does).
    pub fn set_process(&mut self, pid: u32, process: Option<Process>) {
        match process {
            Some(process) => {
                self.processes.insert(pid, process);
            }
            // What was captured stays until the window ends: a process that exited is
            // named from it.
            None => {
                self.processes.remove(&pid);
            }
        }
    }

    /// The frame's lines read now, `None` when it cannot be named (or `pid` is no JVM the
    /// namer was told of).
    fn read(&self, pid: u32, word: u64, more: u64) -> Option<Vec<Line>> {
        let process = self.processes.get(&pid)?;
        let process_memory = ProcessMemory(pid);
        let memory: &dyn Memory = match &self.source {
            Source::Processes => &process_memory,
            Source::Given(memory) => memory.as_ref(),
        };
        let named = same_collections(memory, process, word, more)
            .and_then(|()| name_frame(memory, &process.layout, word, more));
        match named {
            Ok(lines) if !lines.is_empty() => Some(lines),
            Ok(_) => None,
            Err(err) => {
                tracing::trace!("pid {pid}: HotSpot frame {word:#x}/{more:#x} unnamed: {err}");
                None
            }
        }
    }

    /// Whether one more frame of `lines` fits the cache.
    fn room_for(&self, lines: Option<&Vec<Line>>) -> bool {
        self.cache.len() < MAX_CACHED
            && self.cached_text + lines.map_or(0, |l| text_size(l)) <= MAX_CACHED_TEXT
    }

    fn keep(&mut self, key: (u32, u64, u64), lines: Option<Vec<Line>>) {
        self.cached_text += lines.as_deref().map_or(0, text_size);
        self.cache.insert(key, lines);
    }

    /// Frames kept named now.
    #[cfg(test)]
    fn cached(&self) -> usize {
        self.cache.len()
    }
}

impl Names for HotspotNames {
    fn attach(&mut self, pid: u32, process: Option<Arc<dyn Any + Send + Sync>>) {
        let process = process
            .as_ref()
            .and_then(|p| p.downcast_ref::<Process>())
            .cloned();
        self.set_process(pid, process);
    }

    fn capture(&mut self, pid: u32, word: u64, more: u64) {
        let key = (pid, word, more);
        if !self.processes.contains_key(&pid)
            || self.cache.contains_key(&key)
            || !self.room_for(None)
        {
            return;
        }
        let lines = self.read(pid, word, more);
        if self.room_for(lines.as_ref()) {
            self.keep(key, lines);
        }
    }

    fn end_window(&mut self, alive: &dyn Fn(u32) -> bool) {
        // The cache only grows within a window: what it holds now is its most.
        self.window_bytes = self
            .cache
            .values()
            .map(|lines| {
                size_of::<((u32, u64, u64), Option<Vec<Line>>)>()
                    + lines.as_ref().map_or(0, |lines| {
                        lines.capacity() * size_of::<Line>() + text_size(lines)
                    })
            })
            .sum();
        self.cache.clear();
        self.cached_text = 0;
        self.processes.retain(|&pid, _| alive(pid));
    }

    fn lines(&mut self, pid: u32, word: u64, more: u64) -> Vec<Line> {
        let key = (pid, word, more);
        let lines = match self.cache.get(&key) {
            Some(lines) => lines.clone(),
            None => {
                let lines = self.read(pid, word, more);
                // A process the namer was not told of has nothing to keep.
                if self.processes.contains_key(&pid) && self.room_for(lines.as_ref()) {
                    self.keep(key, lines.clone());
                }
                lines
            }
        };
        match lines {
            Some(lines) => {
                self.named += 1;
                lines
            }
            None => {
                self.unknown += 1;
                vec![Line::named(UNKNOWN_FRAME)]
            }
        }
    }

    fn counts(&self) -> (u64, u64) {
        (self.named, self.unknown)
    }

    fn window_bytes(&self) -> usize {
        self.window_bytes
    }
}

#[cfg(test)]
mod tests;
