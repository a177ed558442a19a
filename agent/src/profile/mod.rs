//! The symbolised profile: what the encoders (pprof, folded, SVG) consume.
//!
//! It mirrors pprof's model (mappings, locations, samples) because that is the richest output,
//! but holds owned names rather than string-table indices so the encoders stay simple and the
//! symboliser does not need to know about any wire format.

pub mod diff;
pub mod encode;

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, SystemTime},
};

/// A series' labels (`comm`, `pid`, `systemd_unit`, ...), sorted by name.
pub type Labels = BTreeMap<String, String>;

/// A symbolised CPU profile of one or more processes over one period.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// When sampling started.
    pub start: SystemTime,
    /// How long sampling ran.
    pub duration: Duration,
    /// Nanoseconds of CPU time each sample stands for (1e9 / frequency); 1 for off-CPU
    /// time, whose sample counts are nanoseconds already.
    pub period_ns: u64,
    /// What the samples measure.
    pub sample_type: SampleType,
    pub mappings: Vec<Mapping>,
    pub locations: Vec<Location>,
    pub samples: Vec<Sample>,
}

/// What a profile's samples measure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SampleType {
    /// CPU samples: each count is one sample of `period_ns` of CPU time.
    #[default]
    Cpu,
    /// Off-CPU time: each count is nanoseconds a thread was blocked, an estimate from
    /// blocks recorded with probability `1 - exp(-d / mean_ns)` and scaled by its inverse;
    /// blocks under `min_ns` are left out.
    OffCpu { mean_ns: u64, min_ns: u64 },
}

impl SampleType {
    /// Which kind of profile this is, without its sampling parameters.
    pub fn kind(self) -> SampleKind {
        match self {
            SampleType::Cpu => SampleKind::Cpu,
            SampleType::OffCpu { .. } => SampleKind::OffCpu,
        }
    }
}

/// The two kinds of profile the daemon stores side by side, as users name them
/// (`query --type`, the API's `type=`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum SampleKind {
    #[default]
    Cpu,
    OffCpu,
}

impl SampleKind {
    pub const ALL: [SampleKind; 2] = [SampleKind::Cpu, SampleKind::OffCpu];

    /// The name users type: `cpu`, `off-cpu`.
    pub fn as_str(self) -> &'static str {
        match self {
            SampleKind::Cpu => "cpu",
            SampleKind::OffCpu => "off-cpu",
        }
    }

    /// The kind a user named, or an error saying which names there are.
    pub fn parse(text: &str) -> Result<SampleKind, String> {
        SampleKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == text)
            .ok_or_else(|| format!("unknown profile type {text:?}: expected cpu or off-cpu"))
    }
}

/// The label of the state an off-CPU sample's thread blocked in (`sleeping`, `disk`,
/// `preempted`).
pub const STATE_LABEL: &str = "state";
/// The label of a sample's thread name (on-CPU and off-CPU).
pub const THREAD_LABEL: &str = "thread";
/// The label of a sample's thread id, with `thread-ids` on.
pub const THREAD_ID_LABEL: &str = "thread_id";

/// A file (or the kernel) mapped into an address range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub limit: u64,
    pub file_offset: u64,
    /// File path as the process saw it, or `[kernel.kallsyms]`, `[vdso]`, ...
    pub path: String,
    /// Lowercase hex GNU build id.
    pub build_id: Option<String>,
    /// True when the symboliser looked for this mapping's function names (kallsyms read, the
    /// ELF file read, anonymous code no perf map names), even if some addresses stayed
    /// unnamed: pprof then asks no symbol server for them. False when it could not look
    /// (`--symbolize none`, a file it could not read).
    pub has_functions: bool,
    /// ... a source file name.
    pub has_filenames: bool,
    /// ... a source line number.
    pub has_line_numbers: bool,
    /// ... more than one function level (inlined functions).
    pub has_inline_frames: bool,
}

/// Index into [`Profile::mappings`].
pub type MappingIndex = usize;
/// Index into [`Profile::locations`].
pub type LocationIndex = usize;

/// One distinct frame: an address in a mapping and what it was resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub mapping: Option<MappingIndex>,
    /// Absolute address as sampled (for return addresses, the address after the call).
    pub address: u64,
    /// Function names for this address, innermost (inlined) first; empty when unresolved.
    pub lines: Vec<Line>,
    /// What ran there: set from the stack word's kind, refined by the symbolizer.
    pub kind: FrameKind,
}

/// What a frame is: native code, the kernel's, or a runtime's. The BPF walk writes it into
/// each stack word, the drain decodes it, the symbolizer refines it (native code that Go's
/// toolchain compiled is [`FrameKind::Go`]), and the store, pprof and OTLP carry it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FrameKind {
    /// Native code: C, C++, Rust, or anything else compiled ahead of time, and unnamed pcs.
    #[default]
    Native,
    /// The kernel's code.
    Kernel,
    /// A CPython frame.
    Python,
    /// Go code: a pc its binary's `.gopclntab` holds a function for.
    Go,
    /// A HotSpot JVM's Java frame (interpreted or compiled), or one of its stubs.
    Jvm,
    /// A V8 JavaScript frame (Node.js): interpreted, baseline or optimised.
    V8js,
}

impl FrameKind {
    /// Every kind, in [`FrameKind::code`] order.
    pub const ALL: [FrameKind; 6] = [
        FrameKind::Native,
        FrameKind::Kernel,
        FrameKind::Python,
        FrameKind::Go,
        FrameKind::Jvm,
        FrameKind::V8js,
    ];

    /// The kind's number where it is stored (the store's `locations.kind`, pprof's
    /// `Location` extension): fixed once given. 0 and 1 are the old `kernel` flag's values.
    pub const fn code(self) -> u8 {
        match self {
            FrameKind::Native => 0,
            FrameKind::Kernel => 1,
            FrameKind::Python => 2,
            FrameKind::Go => 3,
            FrameKind::Jvm => 4,
            FrameKind::V8js => 5,
        }
    }

    /// The kind stored as `code`; an unknown one (a newer scorch's) reads as native.
    pub fn from_code(code: i64) -> FrameKind {
        FrameKind::ALL
            .into_iter()
            .find(|kind| i64::from(kind.code()) == code)
            .unwrap_or(FrameKind::Native)
    }

    /// True for the kernel's frames.
    pub fn is_kernel(self) -> bool {
        self == FrameKind::Kernel
    }
}

/// One function level at a location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// Demangled name.
    pub function: String,
    /// The name as the binary spells it (mangled).
    pub system_name: String,
    /// Source file, when debug info says.
    pub file: Option<String>,
    /// Source line (for an inlined function's caller, the call site); 0 when unknown.
    pub line: u32,
    /// Column in `line`, from 1; 0 when unknown (most sources keep lines alone).
    pub column: u32,
}

impl Line {
    /// A level known only by name (kernel symbols, placeholders).
    pub fn named(function: impl Into<String>) -> Line {
        let function = function.into();
        Line {
            system_name: function.clone(),
            function,
            file: None,
            line: 0,
            column: 0,
        }
    }
}

/// A stack seen `count` times in one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub pid: u32,
    pub comm: String,
    /// The series' labels, shared by all samples of the process: when not empty, the whole
    /// set (the daemon's discovered and relabelled labels, which may leave out `pid` or
    /// `comm`); when empty, the series is `comm` and `pid` (what `record` knows).
    pub labels: Arc<Labels>,
    /// Leaf first: kernel frames, then user frames.
    pub locations: Vec<LocationIndex>,
    pub count: u64,
}

impl Sample {
    /// The labels of the series this sample belongs to.
    pub fn series_labels(&self) -> Labels {
        if !self.labels.is_empty() {
            return (*self.labels).clone();
        }
        Labels::from([
            ("comm".to_owned(), self.comm.clone()),
            ("pid".to_owned(), self.pid.to_string()),
        ])
    }
}

impl Profile {
    /// About how much heap the profile holds: its vectors and strings (label sets shared
    /// between samples counted once per sample, an overestimate that errs the safe way).
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        let mappings: usize = self
            .mappings
            .iter()
            .map(|m| {
                size_of::<Mapping>() + m.path.len() + m.build_id.as_ref().map_or(0, String::len)
            })
            .sum();
        let locations: usize = self
            .locations
            .iter()
            .map(|l| {
                size_of::<Location>()
                    + l.lines
                        .iter()
                        .map(|line| {
                            size_of::<Line>()
                                + line.function.len()
                                + line.system_name.len()
                                + line.file.as_ref().map_or(0, String::len)
                        })
                        .sum::<usize>()
            })
            .sum();
        let samples: usize = self
            .samples
            .iter()
            .map(|s| {
                size_of::<Sample>()
                    + s.comm.len()
                    + s.locations.len() * size_of::<LocationIndex>()
                    + s.labels
                        .iter()
                        .map(|(k, v)| k.len() + v.len() + 48)
                        .sum::<usize>()
            })
            .sum();
        mappings + locations + samples
    }

    /// Total samples.
    pub fn total_samples(&self) -> u64 {
        self.samples.iter().map(|s| s.count).sum()
    }

    /// The display names of a location's function levels, innermost (inlined) first; for an
    /// unnamed location, a placeholder naming the mapping (`[libc.so.6]`) or `[unknown]`.
    pub fn location_names(&self, index: LocationIndex) -> Vec<String> {
        let location = &self.locations[index];
        if !location.lines.is_empty() {
            return location.lines.iter().map(|l| l.function.clone()).collect();
        }
        vec![self.placeholder_name(index)]
    }

    fn placeholder_name(&self, index: LocationIndex) -> String {
        let location = &self.locations[index];
        match location.mapping.map(|m| &self.mappings[m]) {
            Some(mapping) => {
                let base = mapping.path.rsplit('/').next().unwrap_or(&mapping.path);
                if base.starts_with('[') {
                    base.to_owned()
                } else {
                    format!("[{base}]")
                }
            }
            None => "[unknown]".to_owned(),
        }
    }
}

/// A small profile with kernel, user and unnamed frames, shared by the encoders' tests.
#[cfg(test)]
pub(crate) fn sample_profile() -> Profile {
    Profile {
        start: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        duration: Duration::from_secs(10),
        period_ns: 52_631_578,
        sample_type: crate::profile::SampleType::Cpu,
        mappings: vec![
            Mapping {
                start: 0xffffffff81000000,
                limit: u64::MAX,
                file_offset: 0,
                path: "[kernel.kallsyms]".into(),
                build_id: None,
                has_functions: true,
                has_filenames: false,
                has_line_numbers: false,
                has_inline_frames: false,
            },
            Mapping {
                start: 0x5000,
                limit: 0x9000,
                file_offset: 0x1000,
                path: "/usr/bin/work".into(),
                build_id: Some("abcdef".into()),
                has_functions: true,
                has_filenames: false,
                has_line_numbers: false,
                has_inline_frames: false,
            },
        ],
        locations: vec![
            Location {
                mapping: Some(0),
                address: 0xffffffff81234567,
                lines: vec![Line::named("vfs_read")],
                kind: FrameKind::Kernel,
            },
            Location {
                mapping: Some(1),
                address: 0x5100,
                lines: vec![Line::named("leaf")],
                kind: FrameKind::Native,
            },
            Location {
                mapping: Some(1),
                address: 0x5200,
                lines: vec![Line::named("main")],
                kind: FrameKind::Native,
            },
            Location {
                mapping: Some(1),
                address: 0x5300,
                lines: vec![],
                kind: FrameKind::Native,
            },
        ],
        samples: vec![
            Sample {
                pid: 42,
                comm: "work".into(),
                labels: Arc::default(),
                locations: vec![0, 1, 2],
                count: 3,
            },
            Sample {
                pid: 42,
                comm: "work".into(),
                labels: Arc::default(),
                locations: vec![3, 2],
                count: 1,
            },
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_from_their_names() {
        for kind in SampleKind::ALL {
            assert_eq!(SampleKind::parse(kind.as_str()), Ok(kind));
        }
        let err = SampleKind::parse("offcpu").unwrap_err();
        assert!(
            err.contains("\"offcpu\"") && err.contains("off-cpu"),
            "{err}"
        );
        let off = SampleType::OffCpu {
            mean_ns: 1,
            min_ns: 0,
        };
        assert_eq!(off.kind(), SampleKind::OffCpu);
        assert_eq!(SampleType::Cpu.kind(), SampleKind::Cpu);
    }

    #[test]
    fn heap_bytes_grow_with_the_profile() {
        let small = sample_profile();
        let mut large = sample_profile();
        for _ in 0..100 {
            large.samples.push(large.samples[0].clone());
        }
        assert!(small.heap_bytes() > 0);
        assert!(large.heap_bytes() > small.heap_bytes() + 100 * std::mem::size_of::<Sample>());
    }
}
