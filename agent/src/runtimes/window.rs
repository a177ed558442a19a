//! A runtime's namer over one window: what the JVM's and V8's namers share.
//!
//! Frames are named at [`Names::capture`], while their process runs: a process exits, code
//! is freed or moved, and a frame's words then point at nothing or at something else. What
//! is named is kept for the window, by (process, word, continuation), at most
//! [`MAX_CACHED`] frames and [`MAX_CACHED_TEXT`] bytes of names, and dropped at its end (an
//! address freed and reused within a window is the one case a stale name is given; each
//! runtime's cookies catch most of those). Past the bound, frames are named when their
//! lines are asked.
//!
//! The memory is another process's: each runtime's readers are bounded, and every name kept
//! is cut to [`MAX_NAME`] bytes, so a hostile process costs at most the cache's bound.

use std::{any::Any, collections::HashMap, fmt, sync::Arc};

use crate::profile::Line;
use crate::runtimes::{
    memory::{Memory, ProcessMemory},
    Names,
};

/// Longest name kept (a function, a system name or a file): far past any a compiler or a
/// bundler writes, and the bound on what a hostile process makes the agent keep per line.
pub const MAX_NAME: usize = 4096;
/// Most frames kept named at once.
pub const MAX_CACHED: usize = 65_536;
/// Most bytes of names kept at once: real frames take a few hundred bytes each, so the frame
/// bound is reached first; this one holds when names are long.
pub const MAX_CACHED_TEXT: usize = 32 << 20;

/// How one runtime names one of its frames.
pub trait Reader: Send {
    /// What the loader's attachment gives of a process (`Attachment::process`).
    type Process: Clone + Send + Sync + 'static;
    /// The name of a frame that could not be named.
    const UNKNOWN: &'static str;
    /// The runtime, in the log.
    const RUNTIME: &'static str;
    /// The lines (innermost first) of the frame (`word`, `more`) of process `pid`, with
    /// `process`, read from `memory`; why not, when it cannot be named.
    fn read(
        &mut self,
        pid: u32,
        memory: &dyn Memory,
        process: &Self::Process,
        word: u64,
        more: u64,
    ) -> Result<Vec<Line>, String>;

    /// Ends a window: what the reader kept of the processes' memory may be stale by the next.
    fn end_window(&mut self) {}
}

/// Whose memory frames are read from.
enum Source {
    /// Each frame's process's own.
    Processes,
    /// The same bytes for every process (the tests).
    Given(Arc<dyn Memory + Send + Sync>),
}

/// Names one runtime's frames over windows; see the module documentation.
pub struct WindowNames<R: Reader> {
    reader: R,
    /// Each process's attachment.
    processes: HashMap<u32, R::Process>,
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

impl<R: Reader> fmt::Debug for WindowNames<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(R::RUNTIME)
            .field("processes", &self.processes.len())
            .field("cached", &self.cache.len())
            .field("named", &self.named)
            .field("unknown", &self.unknown)
            .finish_non_exhaustive()
    }
}

impl<R: Reader + Default> Default for WindowNames<R> {
    fn default() -> WindowNames<R> {
        WindowNames::with_source(R::default(), Source::Processes)
    }
}

impl<R: Reader + Default> WindowNames<R> {
    /// A namer reading every process's frames from `memory` (the tests).
    pub fn reading(memory: Arc<dyn Memory + Send + Sync>) -> WindowNames<R> {
        WindowNames::with_source(R::default(), Source::Given(memory))
    }
}

impl<R: Reader> WindowNames<R> {
    fn with_source(reader: R, source: Source) -> WindowNames<R> {
        WindowNames {
            reader,
            processes: HashMap::new(),
            cache: HashMap::new(),
            cached_text: 0,
            window_bytes: 0,
            source,
            named: 0,
            unknown: 0,
        }
    }

    /// Notes that `pid` runs the runtime with `process` (or, with `None`, no longer does).
    pub fn set_process(&mut self, pid: u32, process: Option<R::Process>) {
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

    /// The frame's lines read now, `None` when it cannot be named (or `pid` is no process
    /// the namer was told of).
    fn read(&mut self, pid: u32, word: u64, more: u64) -> Option<Vec<Line>> {
        let process = self.processes.get(&pid)?;
        let process_memory = ProcessMemory(pid);
        let memory: &dyn Memory = match &self.source {
            Source::Processes => &process_memory,
            Source::Given(memory) => memory.as_ref(),
        };
        match self.reader.read(pid, memory, process, word, more) {
            Ok(lines) if !lines.is_empty() => Some(lines),
            Ok(_) => None,
            Err(err) => {
                tracing::trace!(
                    "pid {pid}: {} frame {word:#x}/{more:#x} unnamed: {err}",
                    R::RUNTIME
                );
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
    pub fn cached(&self) -> usize {
        self.cache.len()
    }
}

impl<R: Reader> Names for WindowNames<R> {
    fn attach(&mut self, pid: u32, process: Option<Arc<dyn Any + Send + Sync>>) {
        let process = process
            .as_ref()
            .and_then(|p| p.downcast_ref::<R::Process>())
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
        self.reader.end_window();
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
                vec![Line::named(R::UNKNOWN)]
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

/// `text` cut to [`MAX_NAME`] bytes, on a character's boundary.
pub fn bounded(mut text: String) -> String {
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
pub fn text_size(lines: &[Line]) -> usize {
    lines
        .iter()
        .map(|l| l.function.len() + l.system_name.len() + l.file.as_ref().map_or(0, String::len))
        .sum()
}
