//! scorch: a system-wide CPU profiler for Linux on eBPF.
//!
//! The pipeline, one module per stage (see ARCHITECTURE.md):
//!
//! ```text
//! sampler (BPF load + attach) -> drain (read + reset maps) -> RawWindow
//!   -> aggregate -> symbolize (kernel: kallsyms; user: ELF) -> Profile
//!   -> encode (pprof, folded, SVG) -> file, or the store (`scorch run`) -> sink (Pyroscope, Parca)
//! ```

pub mod aggregate;
pub mod check;
pub mod cli;
pub mod cli_docs;
pub mod config;
pub mod drain;
pub mod encode;
pub mod http;
pub mod labels;
pub mod metrics;
pub mod notify;
pub mod privileges;
pub mod profile;
pub mod query;
pub mod record;
pub mod run;
pub mod sampler;
pub mod selector;
pub mod sink;
pub mod store;
pub mod symbolize;
pub mod timespec;

/// Protobuf types generated from `proto/profile.proto`.
#[allow(clippy::all, missing_docs)]
pub mod pprof {
    include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
}
