//! Language runtimes whose frames the native walk cannot name, one room each, behind one
//! interface ([`Runtime`]) and one list ([`Registry`]).
//!
//! A runtime is met at three moments, the split the OpenTelemetry profiler's interpreters
//! use:
//! - **per binary** ([`Runtime::detect`], on the loader's worker thread): whether a binary is
//!   this runtime's, and what its walk needs of it, read once from the file;
//! - **per process** ([`Binary::attach`], on the loader's thread): what a process mapping that
//!   binary gets in the runtime's BPF map, and which of its code the runtime's BPF walk takes
//!   over; forgotten when the process exits or stops mapping it;
//! - **per frame** ([`Names`], in the symbolizer): the name of one of its frames, read from the
//!   process's memory while it runs or at the window's end.
//!
//! The loader, the symbolizer, the session and the CLI go through [`Registry`]; none of them
//! names a runtime. A runtime's frame words carry its [`RuntimeId`] as their kind
//! (`scorch_common::WordKind`), so the drain hands them on undecoded and its own [`Names`]
//! reads them.
//!
//! - `image`: one ELF image as these readers need it (symbols by name, bytes at an address,
//!   the ranges its `.eh_frame` describes).
//! - `hotspot`: HotSpot JVMs (JDK 8 to 26), whose layout is read from the JVM's own
//!   `gHotSpotVMStructs` tables and whose code heaps the walk takes over.
//! - `memory`: another process's memory as the readers see it, and reads of its values.
//! - `libc`: where glibc keeps a thread's `pthread_getspecific` values, which an interpreter
//!   keeping its thread state under a pthread key needs ([`Support`]).
//! - `python`: CPython 3.11 to 3.15.
//! - `v8`: V8 (Node.js 18 to 24), whose layout is read from its post-mortem constants and
//!   whose builtins and JIT code the walk takes over.

pub mod hotspot;
pub mod image;
pub mod libc;
pub mod memory;
pub mod python;
pub mod v8;
pub mod window;

use std::{any::Any, fmt, ops::Range, path::Path, sync::Arc};

use scorch_common::RuntimeId;

use self::image::Image;
use self::libc::SpecificLayout;
use crate::{
    binary::elf::Elf,
    pipeline::maps::RuntimeCounters,
    profile::{FrameKind, Line},
};

/// A language runtime the BPF side walks; see the module documentation.
pub trait Runtime: Send + Sync + fmt::Debug {
    /// The walk its code dispatches to (a mapping entry's `runtime`), and the kind its frame
    /// words carry.
    fn id(&self) -> RuntimeId;
    /// Its name, in logs and metric labels (`python`).
    fn name(&self) -> &'static str;
    /// The kind its frames have in profiles.
    fn frame_kind(&self) -> FrameKind;
    /// The BPF hash map (keyed by tgid) holding each attached process's entry.
    fn procs_map(&self) -> &'static str;
    /// Whether its BPF walk finds a thread's state from the thread pointer (its TLS base):
    /// the sampler then sets that pointer's place in the task, from the kernel's BTF, and
    /// walks the runtime only when the kernel tells it.
    fn thread_pointer(&self) -> bool;
    /// Its walk's counters in BPF (its frames, and why its chains stopped early), which the
    /// drain reads each window.
    fn counters(&self) -> RuntimeCounters;
    /// A cheap look at a binary before [`Runtime::detect`] (section headers, dynamic
    /// symbols): the loader asks it of every binary a process maps, and a full symbol table
    /// takes a hundred milliseconds for the largest libraries.
    fn may_be(&self, elf: &object::File) -> bool;
    /// What this runtime reads from a binary once: `Ok(None)` when the binary is not this
    /// runtime's, an error naming what is wrong when it is but cannot be walked.
    fn detect(&self, image: &Image) -> Result<Option<Arc<dyn Binary>>, String>;
    /// A namer of its frames, one per symbolizer.
    fn names(&self) -> Box<dyn Names>;
}

/// A binary a runtime recognised, with what it read from it; addresses are the binary's own.
pub trait Binary: Send + Sync + fmt::Debug {
    /// What it is, for the log (`CPython 3.12.4`).
    fn describe(&self) -> String;
    /// What process `pid`, mapping this binary at load bias `bias`, gets. A runtime that
    /// reads the process's memory to know it (a JVM describes itself only there) may find it
    /// starting, and asks to be called again.
    fn attach(&self, pid: u32, bias: u64, support: &Support) -> Attach;
}

/// What [`Binary::attach`] made of a process.
#[derive(Debug, Clone)]
pub enum Attach {
    /// The runtime's walk takes the process's frames from now on.
    Attached(Attachment),
    /// The process cannot be walked, for the reason given (it lacks what [`Support`] should
    /// give, or its runtime's data is not what the walk reads).
    Unsupported(String),
    /// The process is still setting its runtime up: the loader asks again shortly.
    Later,
}

/// What a process's other binaries give a runtime: read once per binary by the registry, as
/// several runtimes may need it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Support {
    /// glibc's layout of a thread's pthread key values, when the process maps a glibc.
    pub libc: Option<SpecificLayout>,
}

/// A process as one runtime's walk sees it.
#[derive(Clone)]
pub struct Attachment {
    /// The process's code (its addresses) whose frames the runtime's BPF walk takes over.
    pub owned: Vec<Range<u64>>,
    /// Whether the process's anonymous executable mappings are the runtime's too (a JIT's
    /// code, which comes and goes): the loader marks them at each look at its mappings.
    pub anonymous_code: bool,
    /// The process's value in [`Runtime::procs_map`], as the BPF side lays it out.
    pub entry: Vec<u8>,
    /// What [`Names`] needs to name the process's frames, handed to the symbolizer.
    pub process: Arc<dyn Any + Send + Sync>,
}

impl fmt::Debug for Attachment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attachment")
            .field("owned", &self.owned)
            .field("entry", &self.entry.len())
            .finish_non_exhaustive()
    }
}

/// Names one runtime's frames; see the module documentation.
///
/// A frame is its first word (`word`, kind bits included) and the payload of the
/// continuation word the walk wrote after it (`more`, 0 when there is none: a Python frame
/// fits one word, a HotSpot frame takes two), as `pipeline::frames::Frame::Runtime` holds
/// them.
pub trait Names: Send {
    /// Notes that `pid` runs the runtime (with what [`Attachment::process`] gave), or, with
    /// `None`, no longer does.
    fn attach(&mut self, pid: u32, process: Option<Arc<dyn Any + Send + Sync>>);
    /// Reads what naming the frame (`word`, `more`) of `pid` needs now, while the process
    /// runs: a process that exits before the window ends is named from it.
    fn capture(&mut self, pid: u32, word: u64, more: u64);
    /// Ends a window: what was read may be stale by the next, and exited processes go.
    fn end_window(&mut self, alive: &dyn Fn(u32) -> bool);
    /// The names of the frame (`word`, `more`) in `pid`, innermost first, never empty: one
    /// for most frames, several for compiled code with methods inlined at its pc (one
    /// location with several lines, as a native frame's DWARF inlines are).
    fn lines(&mut self, pid: u32, word: u64, more: u64) -> Vec<Line>;
    /// Frames named so far, and frames left unknown.
    fn counts(&self) -> (u64, u64);
    /// The most memory the names of the last window took before it ended and they were
    /// dropped: each entry's slot and the heap its names use (by capacity, before the
    /// allocator's own overhead).
    fn window_bytes(&self) -> usize;
}

/// The runtimes the agent walks: the one list the loader, the symbolizer and the CLI use.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    runtimes: Vec<Arc<dyn Runtime>>,
}

/// Which runtimes a run walks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeConfig {
    pub python: python::PythonMode,
    pub jvm: hotspot::JvmMode,
    pub node: v8::NodeMode,
}

impl Registry {
    /// The runtimes `config` turns on.
    pub fn new(config: RuntimeConfig) -> Registry {
        let mut runtimes: Vec<Arc<dyn Runtime>> = Vec::new();
        if config.python == python::PythonMode::Auto {
            runtimes.push(Arc::new(python::Python));
        }
        if config.jvm == hotspot::JvmMode::Auto {
            runtimes.push(Arc::new(hotspot::Hotspot));
        }
        if config.node == v8::NodeMode::Auto {
            runtimes.push(Arc::new(v8::V8));
        }
        Registry { runtimes }
    }

    /// A registry of exactly `runtimes` (tests plug theirs in here).
    pub fn of(runtimes: Vec<Arc<dyn Runtime>>) -> Registry {
        Registry { runtimes }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn Runtime>> {
        self.runtimes.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.runtimes.is_empty()
    }

    /// The runtime whose frame words carry kind `kind` (a word's top bits).
    pub fn by_word_kind(&self, kind: u64) -> Option<&Arc<dyn Runtime>> {
        self.runtimes.iter().find(|r| r.id() as u64 == kind)
    }

    /// What the runtimes make of a binary (on the loader's worker): each runtime that
    /// recognises it, and what it gives the others. Why a binary of a runtime's cannot be
    /// walked is logged, as it is data about the binary, not a fault of the agent.
    pub fn detect(&self, elf: &Elf<'_>, path: &Path) -> Detected {
        let mut detected = Detected::default();
        if self.runtimes.is_empty() {
            return detected;
        }
        let object = elf.object();
        let maybe: Vec<_> = self.runtimes.iter().filter(|r| r.may_be(object)).collect();
        let libc = self::libc::may_be(object);
        if maybe.is_empty() && !libc {
            return detected;
        }
        let image = Image::of(elf);
        for runtime in maybe {
            match runtime.detect(&image) {
                Ok(Some(binary)) => {
                    tracing::info!(
                        "{}: {}, its {} frames walked",
                        path.display(),
                        binary.describe(),
                        runtime.name()
                    );
                    detected.binaries.push((Arc::clone(runtime), binary));
                }
                Ok(None) => {}
                Err(err) => tracing::warn!(
                    "{}: {} frames not walked: {err}",
                    path.display(),
                    runtime.name()
                ),
            }
        }
        if libc && detected.binaries.is_empty() {
            match self::libc::specific_layout(&image) {
                Ok(layout) => detected.support.libc = Some(layout),
                Err(err) => tracing::warn!(
                    "{}: interpreters' frames in processes using this libc not walked: {err}",
                    path.display()
                ),
            }
        }
        detected
    }
}

/// What the runtimes found in one binary.
#[derive(Debug, Clone, Default)]
pub struct Detected {
    /// The runtimes it is a binary of (one, in practice).
    pub binaries: Vec<(Arc<dyn Runtime>, Arc<dyn Binary>)>,
    /// What it gives the runtimes of the processes mapping it.
    pub support: Support,
}

impl Detected {
    pub fn is_empty(&self) -> bool {
        self.binaries.is_empty() && self.support == Support::default()
    }
}

/// `value` as a BPF map holds it.
pub fn pod_bytes<T: aya::Pod>(value: &T) -> Vec<u8> {
    // SAFETY: a `Pod` is `repr(C)` plain data with explicit padding, so all its bytes are
    // initialised; the slice lives only as long as `value`.
    unsafe { std::slice::from_raw_parts(std::ptr::from_ref(value).cast::<u8>(), size_of::<T>()) }
        .to_vec()
}

/// Every registered runtime's namer, for the symbolizer: the registry's per-frame side.
#[derive(Default)]
pub struct RuntimeNames {
    names: Vec<Namer>,
}

/// A runtime and its namer.
type Namer = (Arc<dyn Runtime>, Box<dyn Names>);

impl fmt::Debug for RuntimeNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.names.iter().map(|(runtime, _)| runtime.name()))
            .finish()
    }
}

/// The name of a runtime's frame that no registered runtime reads: the BPF side wrote a kind
/// this agent was not built, or not configured, to name.
pub const UNKNOWN_RUNTIME_FRAME: &str = "[unknown runtime frame]";

impl RuntimeNames {
    pub fn new(registry: &Registry) -> RuntimeNames {
        RuntimeNames {
            names: registry
                .iter()
                .map(|runtime| (Arc::clone(runtime), runtime.names()))
                .collect(),
        }
    }

    fn of_word(&mut self, word: u64) -> Option<&mut Namer> {
        let kind = word >> scorch_common::WORD_KIND_SHIFT;
        self.names
            .iter_mut()
            .find(|(runtime, _)| runtime.id() as u64 == kind)
    }

    /// Notes that `pid` runs runtime `id`, with what its attachment gave (`None`: no longer).
    pub fn attach(&mut self, pid: u32, id: RuntimeId, process: Option<Arc<dyn Any + Send + Sync>>) {
        if let Some((_, names)) = self.names.iter_mut().find(|(r, _)| r.id() == id) {
            names.attach(pid, process);
        }
    }

    /// Reads what naming the runtime frame (`word`, `more`) of `pid` needs, while the
    /// process runs.
    pub fn capture(&mut self, pid: u32, word: u64, more: u64) {
        if let Some((_, names)) = self.of_word(word) {
            names.capture(pid, word, more);
        }
    }

    pub fn end_window(&mut self, alive: &dyn Fn(u32) -> bool) {
        for (_, names) in &mut self.names {
            names.end_window(alive);
        }
    }

    /// The lines (innermost first, never empty) and kind of the runtime frame (`word`,
    /// `more`) of `pid`.
    pub fn lines(&mut self, pid: u32, word: u64, more: u64) -> (Vec<Line>, FrameKind) {
        match self.of_word(word) {
            Some((runtime, names)) => {
                let mut lines = names.lines(pid, word, more);
                if lines.is_empty() {
                    // A namer's slip is an unnamed frame, not a location without a name.
                    lines.push(Line::named(UNKNOWN_RUNTIME_FRAME));
                }
                (lines, runtime.frame_kind())
            }
            None => (vec![Line::named(UNKNOWN_RUNTIME_FRAME)], FrameKind::Native),
        }
    }

    /// Each runtime's frames named and left unknown since start, by its name.
    pub fn counts(&self) -> impl Iterator<Item = (&'static str, (u64, u64))> + '_ {
        self.names
            .iter()
            .map(|(runtime, names)| (runtime.name(), names.counts()))
    }

    /// Each runtime's names' memory in the last window ([`Names::window_bytes`]), by its name.
    pub fn window_bytes(&self) -> impl Iterator<Item = (&'static str, usize)> + '_ {
        self.names
            .iter()
            .map(|(runtime, names)| (runtime.name(), names.window_bytes()))
    }
}
