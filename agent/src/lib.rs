//! scorch: a system-wide CPU profiler for Linux on eBPF.
//!
//! The pipeline, one module per stage (see ARCHITECTURE.md):
//!
//! ```text
//! pipeline: sampler (BPF load + attach) -> drain (read + reset maps) -> RawWindow -> aggregate
//!   (off-CPU: pipeline::off_cpu, the scheduler's blocks, into the same aggregate)
//!   -> symbolize (kernel: kallsyms; user: ELF/DWARF, Go's .gopclntab; Python) -> Profile
//!   (unwind: tables from .eh_frame, .debug_frame and .gopclntab, loaded into the BPF
//!    unwinder's maps as processes are sampled; runtimes: one room per interpreter, what its
//!    walk needs of a binary and a process, and its frames' names, through one registry)
//!   -> labels (discovery, relabelling; dropped processes into the BPF deny list)
//!   -> profile::encode (pprof, folded, SVG, top) -> file, or the store (`scorch run`)
//!   -> export (Pyroscope, Parca, OTLP), serve (UI, API, /metrics)
//! ```
//!
//! Modules are layered: each imports only those declared before it below (`cargo xtask lint`
//! checks it), so the list reads bottom-up as the pipeline does.

/// Protobuf types generated from `proto/profile.proto`.
#[allow(clippy::all, missing_docs)]
pub mod pprof {
    include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
}

// Leaves: the operating system, self-measurement, and pure parsers.
pub mod sys;
pub mod metrics;
pub mod parse;
// What differs between architectures, one module each.
pub mod arch;
// Binary formats read in place from a file's bytes (pure, like the parsers).
pub mod binary;
// Another process: its mappings, and what is kept of them after it exits.
pub mod process;
// The data model and its encoders.
pub mod profile;
// The stages, in the order data passes them.
pub mod pipeline;
// Language runtimes, one room each behind one interface: what each reads from its binaries,
// gives a process's BPF entry, and names its frames with. The symbolizer and the loader call
// their list.
pub mod runtimes;
pub mod symbolize;
pub mod unwind;
pub mod labels;
pub mod store;
pub mod export;
pub mod serve;
// Commands that drive the stages, and the command line that picks them.
pub mod cmd;
pub mod cli;
