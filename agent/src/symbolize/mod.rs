//! Symbolize: turn aggregated address stacks into a [`Profile`] with function names.
//!
//! Kernel frames are named from kallsyms ([`kernel`]), user frames from the ELF files the
//! process mapped ([`user`]). A frame that cannot be named keeps its address and mapping; that
//! is data for the reader (and for servers that symbolise later), never an error.

pub mod elf;
pub mod entry;
pub mod hints;
mod kallsyms_cache;
pub mod kernel;

pub mod user;

use std::{collections::HashMap, sync::Arc, time::Duration};

use crate::process::maps::MapEntry;
use crate::{
    pipeline::aggregate::{Aggregated, StackSample},
    pipeline::drain::{Stack, ThreadTag},
    pipeline::frames::Frame,
    pipeline::off_cpu::BlockState,
    profile::{
        FrameKind, Labels, Line, Location, LocationIndex, Mapping, MappingIndex, Profile, Sample,
        STATE_LABEL, THREAD_ID_LABEL, THREAD_LABEL,
    },
};
use kernel::{KernelFrame, KernelSymbolizer};
use user::UserSymbolizer;

/// Where a location lives, for deduplication.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum LocationKey {
    Kernel(u64),
    User(Option<MappingIndex>, u64),
    /// A runtime's frame of a process: the word its walk wrote and its continuation's
    /// payload (a CPython frame's code object address, a HotSpot frame's `Method*` and bci,
    /// are the process's own).
    Runtime(u32, u64, u64),
    /// A placeholder for a stack that could not be recorded.
    Lost {
        kernel: bool,
    },
}

/// Identity of a user mapping across processes: the same file mapped at the same place (forked
/// workers) shares one pprof mapping.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct MappingKey {
    start: u64,
    end: u64,
    offset: u64,
    dev: u64,
    inode: u64,
    path: String,
}

struct ProfileBuilder {
    mappings: Vec<Mapping>,
    mapping_index: HashMap<MappingKey, MappingIndex>,
    locations: Vec<Location>,
    location_index: HashMap<LocationKey, LocationIndex>,
    /// Each (process, maps version, address) a user frame was named at: the location it
    /// resolved to. A snapshot of a process's maps never changes, so the same frame of
    /// another sample is one lookup here, not a search of the maps, a copy of the entry and
    /// a hash of its path (the most of a 999 Hz window's naming, whose thousands of stacks
    /// share their frames).
    user_frames: HashMap<(u32, u32, u64), LocationIndex>,
    kernel_mapping: Option<MappingIndex>,
}

impl ProfileBuilder {
    fn location(&mut self, key: LocationKey, make: impl FnOnce() -> Location) -> LocationIndex {
        if let Some(&index) = self.location_index.get(&key) {
            return index;
        }
        self.locations.push(make());
        let index = self.locations.len() - 1;
        self.location_index.insert(key, index);
        index
    }
}

/// Builds the profile. `comm_of` names a process (the agent prefers the name it read from
/// /proc while the process was alive, then the one the BPF program recorded).
pub fn symbolize(
    aggregated: &Aggregated,
    kernel: &mut KernelSymbolizer,
    user: &mut UserSymbolizer,
    period_ns: u64,
    comm_of: impl Fn(u32) -> Option<String>,
) -> Result<Profile, kernel::KallsymsError> {
    let mut builder = ProfileBuilder {
        mappings: Vec::new(),
        mapping_index: HashMap::new(),
        locations: Vec::new(),
        location_index: HashMap::new(),
        user_frames: HashMap::new(),
        kernel_mapping: None,
    };

    // Kernel: one batched lookup for every distinct address, return addresses adjusted.
    let mut kernel_addresses: Vec<u64> = aggregated
        .stacks
        .keys()
        .filter_map(|s| match &s.kernel {
            Stack::Frames(frames) => Some(frames),
            _ => None,
        })
        .flat_map(|frames| {
            kernel_pcs(frames)
                .enumerate()
                .map(|(i, a)| lookup_address(a, i))
        })
        .collect();
    kernel_addresses.sort_unstable();
    kernel_addresses.dedup();
    let kernel_names: HashMap<u64, String> = if kernel_addresses.is_empty() {
        HashMap::new()
    } else {
        let frames = kernel.symbolize(&kernel_addresses)?;
        kernel_addresses
            .iter()
            .zip(frames)
            .filter_map(|(&address, frame)| match frame {
                KernelFrame::Symbol { name, module, .. } => Some((
                    address,
                    match module {
                        Some(m) => format!("{name} [{m}]"),
                        None => name.to_owned(),
                    },
                )),
                KernelFrame::Miss => None,
            })
            .collect()
    };
    let text_start = kernel.text_start();
    kernel.names_taken();
    // pprof readers take mapping[0] as the main binary: make it the executable of the most
    // sampled process (its lowest file mapping, where the kernel maps the executable).
    if let Some(pid) = busiest_process(aggregated) {
        let main = user.maps(pid).and_then(|maps| {
            maps.entries()
                .iter()
                .find(|e| e.is_file() && e.executable)
                .cloned()
        });
        if let Some(entry) = main {
            builder.user_mapping(user, pid, &entry);
        }
    }
    // Kernel locations hold offsets from `_text`, never absolute addresses: profiles are
    // served to anyone who reaches the API and sent to servers, and an absolute address would
    // hand them the kernel's randomised base (KASLR), read with the CAP_SYSLOG we hold.
    if !kernel_addresses.is_empty() {
        builder.mappings.push(Mapping {
            start: 0,
            limit: u64::MAX,
            file_offset: 0,
            path: "[kernel.kallsyms]".to_owned(),
            build_id: kernel_build_id(),
            // kallsyms was read: what it did not name, nothing else will.
            has_functions: true,
            has_filenames: false,
            has_line_numbers: false,
            has_inline_frames: false,
        });
        builder.kernel_mapping = Some(builder.mappings.len() - 1);
    }

    // Walks that frame pointers ended in glibc's start code get the frames a table walk of
    // the same binaries found below it (see `entry`).
    let mut stacks = user.complete_entry_chains(
        aggregated
            .stacks
            .iter()
            .map(|(stack, &count)| (stack, count)),
    );
    // Deterministic output: same input, same bytes.
    stacks.sort_by(|a, b| a.0.cmp(&b.0));
    let mut samples = Vec::with_capacity(stacks.len());
    // One label set per (process, thread, state), shared by its samples.
    let mut label_sets: HashMap<(u32, &ThreadTag, Option<BlockState>), Arc<Labels>> =
        HashMap::new();
    for (stack, count) in &stacks {
        let (stack, count): (&StackSample, u64) = (stack, *count);
        let mut locations = Vec::new();
        match &stack.kernel {
            Stack::Frames(frames) => {
                let frames: Vec<u64> = kernel_pcs(frames).collect();
                // An off-CPU stack was taken inside the scheduler's tracepoint: the frames
                // above `__schedule` are the BPF program and the tracepoint's plumbing.
                let first = if stack.block.is_some() {
                    scheduler_frame(&frames, |depth, address| {
                        kernel_names
                            .get(&lookup_address(address, depth))
                            .map(String::as_str)
                    })
                } else {
                    0
                };
                for (depth, &address) in frames.iter().enumerate().skip(first) {
                    let name = kernel_names.get(&lookup_address(address, depth)).cloned();
                    let mapping = builder.kernel_mapping;
                    locations.push(builder.location(LocationKey::Kernel(address), || Location {
                        mapping,
                        address: kernel_offset(address, text_start),
                        lines: name.map(Line::named).into_iter().collect(),
                        kind: FrameKind::Kernel,
                    }));
                }
            }
            Stack::Lost => locations.push(lost_location(&mut builder, true)),
            Stack::Absent => {}
        }
        match &stack.user {
            Stack::Frames(frames) => {
                for (depth, &frame) in frames.iter().enumerate() {
                    let index = user_location(&mut builder, user, stack, frame, depth);
                    locations.push(index);
                }
            }
            Stack::Lost => locations.push(lost_location(&mut builder, false)),
            Stack::Absent => {}
        }
        let comm = comm_of(stack.tgid)
            .or_else(|| aggregated.comms.get(&stack.tgid).cloned())
            .unwrap_or_default();
        // `record`'s series labels (the process), and the sample's own: its thread, and the
        // state an off-CPU block was in. The daemon takes the sample's own ones over.
        let labels = label_sets
            .entry((stack.tgid, &stack.thread, stack.block))
            .or_insert_with(|| Arc::new(sample_labels(&comm, stack)))
            .clone();
        samples.push(Sample {
            pid: stack.tgid,
            comm,
            labels,
            locations,
            count,
        });
    }

    let start = aggregated
        .start()
        .unwrap_or_else(std::time::SystemTime::now);
    let duration = aggregated
        .end()
        .and_then(|end| end.duration_since(start).ok())
        .unwrap_or(Duration::ZERO);
    Ok(Profile {
        start,
        duration,
        period_ns,
        sample_type: crate::profile::SampleType::Cpu,
        mappings: builder.mappings,
        locations: builder.locations,
        samples,
    })
}

/// A sample's labels as `record` writes them: `comm`, `pid`, `thread`, and `thread_id` and
/// `state` when known.
fn sample_labels(comm: &str, stack: &StackSample) -> Labels {
    let mut labels = Labels::from([
        ("comm".to_owned(), comm.to_owned()),
        ("pid".to_owned(), stack.tgid.to_string()),
    ]);
    if !stack.thread.name.is_empty() {
        labels.insert(THREAD_LABEL.to_owned(), stack.thread.name.clone());
    }
    if let Some(id) = stack.thread.id {
        labels.insert(THREAD_ID_LABEL.to_owned(), id.to_string());
    }
    if let Some(state) = stack.block {
        labels.insert(STATE_LABEL.to_owned(), state.as_str().to_owned());
    }
    labels
}

/// Where an off-CPU kernel stack starts: at `__schedule` (or the first frame when it has
/// none, as a stack cut short would not).
fn scheduler_frame<'a>(frames: &[u64], name: impl Fn(usize, u64) -> Option<&'a str>) -> usize {
    frames
        .iter()
        .enumerate()
        .position(|(depth, &address)| name(depth, address) == Some("__schedule"))
        .unwrap_or(0)
}

/// The pcs of a kernel stack's frames.
fn kernel_pcs(frames: &[Frame]) -> impl Iterator<Item = u64> + '_ {
    frames.iter().filter_map(|frame| frame.pc())
}

/// The process with the most samples.
fn busiest_process(aggregated: &Aggregated) -> Option<u32> {
    let mut per_process: HashMap<u32, u64> = HashMap::new();
    for (stack, count) in &aggregated.stacks {
        *per_process.entry(stack.tgid).or_insert(0) += count;
    }
    per_process
        .into_iter()
        .max_by_key(|&(pid, count)| (count, std::cmp::Reverse(pid)))
        .map(|(pid, _)| pid)
}

/// The address to look up for frame `depth`: every frame but the leaf is a return address,
/// which may already be past the end of the calling function (a call as its last instruction).
fn lookup_address(address: u64, depth: usize) -> u64 {
    if depth == 0 {
        address
    } else {
        address.saturating_sub(1)
    }
}

fn lost_location(builder: &mut ProfileBuilder, kernel: bool) -> LocationIndex {
    builder.location(LocationKey::Lost { kernel }, || Location {
        mapping: None,
        address: 0,
        lines: vec![Line::named(if kernel {
            "[kernel stack lost]"
        } else {
            "[user stack lost]"
        })],
        kind: if kernel {
            FrameKind::Kernel
        } else {
            FrameKind::Native
        },
    })
}

fn user_location(
    builder: &mut ProfileBuilder,
    user: &mut UserSymbolizer,
    stack: &StackSample,
    frame: Frame,
    depth: usize,
) -> LocationIndex {
    let (pid, version) = (stack.tgid, stack.maps_version);
    let address = match frame {
        Frame::Native(pc) | Frame::Kernel(pc) => pc,
        Frame::Runtime(word, more) => {
            return builder.location(LocationKey::Runtime(pid, word, more), || {
                // A compiled frame with methods inlined at its pc is one location of several
                // lines, innermost first, as a native frame's inlines are.
                let (lines, kind) = user.runtime_lines(pid, word, more);
                Location {
                    mapping: None,
                    address: 0,
                    lines,
                    kind,
                }
            });
        }
    };
    let frame_key = (pid, version, address);
    if let Some(&index) = builder.user_frames.get(&frame_key) {
        return index;
    }
    let index = user_frame_location(builder, user, stack, address, depth);
    builder.user_frames.insert(frame_key, index);
    index
}

/// [`user_location`] for a native frame not named yet in this profile.
fn user_frame_location(
    builder: &mut ProfileBuilder,
    user: &mut UserSymbolizer,
    stack: &StackSample,
    address: u64,
    depth: usize,
) -> LocationIndex {
    let (pid, version) = (stack.tgid, stack.maps_version);
    let entry = user
        .maps_at(pid, version)
        .and_then(|maps| maps.find(address))
        .map(|(_, entry)| entry.clone());
    let mapping = entry.map(|entry| builder.user_mapping(user, pid, &entry));
    let key = LocationKey::User(mapping, address);
    if let Some(&index) = builder.location_index.get(&key) {
        return index;
    }
    let frame = user.symbolize_at(pid, version, address, depth > 0);
    let tried = frame
        .frames
        .as_ref()
        .map_or_else(|miss| miss.is_conclusive(), |_| true);
    // Native code Go's toolchain compiled is Go's: the symbolizer knows, the walk does not.
    let kind = match &frame.frames {
        Ok(frames) if frames.first().is_some_and(|f| f.go) => FrameKind::Go,
        _ => FrameKind::Native,
    };
    let lines: Vec<Line> = match frame.frames {
        Ok(frames) => frames
            .into_iter()
            .map(|f| Line {
                function: f.function,
                system_name: f.system_name,
                file: f.file,
                line: f.line,
                column: 0,
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    if let Some(m) = mapping {
        let mapping = &mut builder.mappings[m];
        // pprof asks a symbol server (`/symbolz`) for every mapping without `has_functions`
        // that holds an unnamed address: the flag says the names were looked for, not found.
        mapping.has_functions |= tried;
        mapping.has_filenames |= lines.iter().any(|l| l.file.is_some());
        mapping.has_line_numbers |= lines.iter().any(|l| l.line > 0);
        mapping.has_inline_frames |= lines.len() > 1;
    }
    builder.location(key, || Location {
        mapping,
        address,
        lines,
        kind,
    })
}

impl ProfileBuilder {
    /// The pprof mapping for `entry` of process `pid`, created on first use.
    fn user_mapping(
        &mut self,
        user: &mut UserSymbolizer,
        pid: u32,
        entry: &MapEntry,
    ) -> MappingIndex {
        let key = MappingKey {
            start: entry.start,
            end: entry.end,
            offset: entry.offset,
            dev: entry.dev,
            inode: entry.inode,
            path: entry.path.clone(),
        };
        if let Some(&index) = self.mapping_index.get(&key) {
            return index;
        }
        let build_id = user.build_id(pid, entry);
        self.mappings.push(Mapping {
            start: entry.start,
            limit: entry.end,
            file_offset: entry.offset,
            path: entry.file_path().to_owned(),
            build_id,
            has_functions: false,
            has_filenames: false,
            has_line_numbers: false,
            has_inline_frames: false,
        });
        let index = self.mappings.len() - 1;
        self.mapping_index.insert(key, index);
        index
    }
}

/// `address` as an offset from the kernel's text start; 0 when that start is unknown or the
/// address lies below it, so no absolute kernel address ever leaves this function.
pub fn kernel_offset(address: u64, text_start: u64) -> u64 {
    if text_start == 0 {
        return 0;
    }
    address.saturating_sub(text_start)
}

/// The running kernel's GNU build id, from the ELF notes it exports in /sys/kernel/notes.
fn kernel_build_id() -> Option<String> {
    let notes = std::fs::read("/sys/kernel/notes").ok()?;
    parse_build_id_note(&notes)
}

/// Finds the `NT_GNU_BUILD_ID` note in a sequence of ELF notes (4-byte aligned, native endian).
fn parse_build_id_note(mut notes: &[u8]) -> Option<String> {
    const NT_GNU_BUILD_ID: u32 = 3;
    let word = |b: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    let align4 = |n: usize| (n + 3) & !3;
    while notes.len() >= 12 {
        let name_size = word(notes, 0)? as usize;
        let desc_size = word(notes, 4)? as usize;
        let kind = word(notes, 8)?;
        let name = notes.get(12..12 + name_size)?;
        let desc_start = 12 + align4(name_size);
        let desc = notes.get(desc_start..desc_start + desc_size)?;
        if kind == NT_GNU_BUILD_ID && name == b"GNU\0" {
            return Some(crate::sys::hex::to_hex(desc));
        }
        notes = notes.get(desc_start + align4(desc_size)..)?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_cpu_kernel_stacks_start_at_the_scheduler() {
        let names = [
            "",
            "bpf_trace_run4",
            "__schedule",
            "schedule",
            "do_nanosleep",
        ];
        let frames = [10, 11, 12, 13, 14];
        let name = |depth: usize, _| Some(names[depth]).filter(|n| !n.is_empty());
        assert_eq!(scheduler_frame(&frames, name), 2);
        // Without the scheduler's frame (a kernel whose names are unknown), all of it.
        assert_eq!(scheduler_frame(&frames, |_, _| None), 0);
    }

    #[test]
    fn kernel_addresses_become_offsets_from_text() {
        let text = 0xffff_ffff_8100_0000;
        assert_eq!(kernel_offset(0xffff_ffff_815f_a742, text), 0x5f_a742);
        // Unknown start, or below it: nothing absolute gets out.
        assert_eq!(kernel_offset(0xffff_ffff_815f_a742, 0), 0);
        assert_eq!(kernel_offset(0xffff_ffff_8000_0000, text), 0);
    }

    #[test]
    fn finds_build_id_after_other_notes() {
        let mut notes = Vec::new();
        // A Xen note first (name "Xen", 4 bytes of desc), then the GNU build id.
        for (name, kind, desc) in [
            (&b"Xen\0"[..], 6u32, &[1u8, 2, 3, 4][..]),
            (&b"GNU\0"[..], 3u32, &[0xde, 0xad, 0xbe, 0xef, 0x01][..]),
        ] {
            notes.extend((name.len() as u32).to_ne_bytes());
            notes.extend((desc.len() as u32).to_ne_bytes());
            notes.extend(kind.to_ne_bytes());
            notes.extend(name);
            notes.extend(desc);
            while notes.len() % 4 != 0 {
                notes.push(0);
            }
        }
        assert_eq!(parse_build_id_note(&notes).as_deref(), Some("deadbeef01"));
        assert_eq!(parse_build_id_note(&notes[..20]), None);
    }

    #[test]
    fn return_addresses_are_looked_up_one_byte_earlier() {
        assert_eq!(lookup_address(0x1000, 0), 0x1000);
        assert_eq!(lookup_address(0x1000, 1), 0xfff);
    }
}
