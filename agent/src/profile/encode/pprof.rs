//! pprof encoding (`perftools.profiles.Profile`), gzipped.
//!
//! Layout of Go's CPU profiles, which every reader understands: sample types
//! `[samples/count, cpu/nanoseconds]`, period type `cpu/nanoseconds`, values `[n, n * period]`.
//! Strings, functions, locations and mappings are each written once, and only when a sample
//! uses them; ids start at 1. A location's frame kind goes in scorch's own `Location` field
//! (`scorch_frame_kind`, number 1000), which `go tool pprof` and other readers skip; kernel
//! frames are also told by their `[kernel.kallsyms]` mapping, as every reader expects.
//!
//! The remote sinks encode every series of every window, so the builder borrows from the
//! profile rather than copying it: strings are interned as `&str` and copied once, into the
//! string table, and a series is encoded straight from the window's samples instead of from a
//! sub-profile cut out of it.

use std::{collections::HashMap, io::Write};

use flate2::{write::GzEncoder, Compression};
use prost::Message;

use crate::{
    pprof as pb,
    profile::{Labels, Profile, Sample, SampleType},
};

/// A hash map with a fast, non-cryptographic hasher: its keys come from our own profile.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Interns strings into the pprof string table (index 0 is always "").
struct StringTable<'a> {
    strings: Vec<&'a str>,
    index: FastMap<&'a str, i64>,
}

impl<'a> StringTable<'a> {
    fn new() -> Self {
        let mut table = StringTable {
            strings: Vec::new(),
            index: FastMap::default(),
        };
        table.intern("");
        table
    }

    fn intern(&mut self, s: &'a str) -> i64 {
        let next = self.strings.len() as i64;
        let i = *self.index.entry(s).or_insert(next);
        if i == next {
            self.strings.push(s);
        }
        i
    }
}

/// The whole profile.
pub fn to_message(profile: &Profile) -> pb::Profile {
    let samples: Vec<&Sample> = profile.samples.iter().collect();
    samples_message(profile, &samples)
}

/// The profile of `samples`, which belong to `profile`: only the mappings, locations and
/// functions they use. The main binary goes first among the mappings, as pprof readers
/// expect: the lowest-addressed file mapping, which is where the kernel maps the executable.
pub fn samples_message(profile: &Profile, samples: &[&Sample]) -> pb::Profile {
    let mut strings = StringTable::new();
    let mut value_type = |ty: &'static str, unit: &'static str| pb::ValueType {
        r#type: strings.intern(ty),
        unit: strings.intern(unit),
    };
    let off_cpu = matches!(profile.sample_type, SampleType::OffCpu { .. });
    // Off-CPU time is one value, nanoseconds blocked, as the OpenTelemetry profiler and
    // Pyroscope (`off_cpu:nanoseconds`) name it; its period is the sampling parameter.
    let (sample_type, period_type) = if off_cpu {
        (
            vec![value_type("off_cpu", "nanoseconds")],
            Some(value_type("off_cpu", "nanoseconds")),
        )
    } else {
        (
            vec![
                value_type("samples", "count"),
                value_type("cpu", "nanoseconds"),
            ],
            Some(value_type("cpu", "nanoseconds")),
        )
    };

    // Mappings first, since locations refer to them.
    let mut mapping_used = vec![false; profile.mappings.len()];
    for sample in samples {
        for &location in &sample.locations {
            if let Some(m) = profile.locations.get(location).and_then(|l| l.mapping) {
                if let Some(used) = mapping_used.get_mut(m) {
                    *used = true;
                }
            }
        }
    }
    let mut mapping_order: Vec<usize> = (0..profile.mappings.len())
        .filter(|&m| mapping_used[m])
        .collect();
    let main = mapping_order
        .iter()
        .copied()
        .filter(|&m| {
            let path = &profile.mappings[m].path;
            !path.is_empty() && !path.starts_with('[')
        })
        .min_by_key(|&m| profile.mappings[m].start);
    if let Some(main) = main {
        mapping_order.retain(|&m| m != main);
        mapping_order.insert(0, main);
    }
    // The pprof id of each mapping index (0: not used).
    let mut mapping_id = vec![0u64; profile.mappings.len()];
    let mapping = mapping_order
        .iter()
        .enumerate()
        .map(|(i, &index)| {
            mapping_id[index] = i as u64 + 1;
            let m = &profile.mappings[index];
            pb::Mapping {
                id: i as u64 + 1,
                memory_start: m.start,
                memory_limit: m.limit,
                file_offset: m.file_offset,
                filename: strings.intern(&m.path),
                build_id: m.build_id.as_deref().map_or(0, |id| strings.intern(id)),
                has_functions: m.has_functions,
                has_filenames: m.has_filenames,
                has_line_numbers: m.has_line_numbers,
                has_inline_frames: m.has_inline_frames,
            }
        })
        .collect();

    // Locations in the order samples first use them; a function is its name, mangled name and
    // file: the same name in two files (static functions) stays two functions.
    let mut location_id = vec![0u64; profile.locations.len()];
    let mut location: Vec<pb::Location> = Vec::new();
    let mut function: Vec<pb::Function> = Vec::new();
    let mut function_ids: FastMap<(&str, &str, &str), u64> = FastMap::default();
    // Samples of one process share their label set: its pprof labels are built once.
    let mut label_sets: FastMap<*const Labels, Vec<pb::Label>> = FastMap::default();
    let pid_key = strings.intern("pid");
    let comm_key = strings.intern("comm");
    let period = match profile.sample_type {
        SampleType::OffCpu { mean_ns, .. } => mean_ns as i64,
        SampleType::Cpu => profile.period_ns as i64,
    };
    let sample = samples
        .iter()
        .map(|s| {
            let location_ids = s
                .locations
                .iter()
                .filter(|&&index| index < profile.locations.len())
                .map(|&index| {
                    if location_id[index] == 0 {
                        let l = &profile.locations[index];
                        let line = l
                            .lines
                            .iter()
                            .map(|line| {
                                let file = line.file.as_deref().unwrap_or("");
                                let key = (line.function.as_str(), line.system_name.as_str(), file);
                                let next = function.len() as u64 + 1;
                                let id = *function_ids.entry(key).or_insert(next);
                                if id == next {
                                    function.push(pb::Function {
                                        id,
                                        name: strings.intern(&line.function),
                                        system_name: strings.intern(&line.system_name),
                                        filename: strings.intern(file),
                                        start_line: 0,
                                    });
                                }
                                pb::Line {
                                    function_id: id,
                                    line: i64::from(line.line),
                                    column: i64::from(line.column),
                                }
                            })
                            .collect();
                        location.push(pb::Location {
                            id: location.len() as u64 + 1,
                            mapping_id: l.mapping.map_or(0, |m| mapping_id[m]),
                            address: l.address,
                            line,
                            is_folded: false,
                            scorch_frame_kind: u32::from(l.kind.code()),
                        });
                        location_id[index] = location.len() as u64;
                    }
                    location_id[index]
                })
                .collect();
            let label = if s.labels.is_empty() {
                // What `record` knows: the process.
                vec![
                    pb::Label {
                        key: pid_key,
                        num: i64::from(s.pid),
                        ..Default::default()
                    },
                    pb::Label {
                        key: comm_key,
                        str: strings.intern(&s.comm),
                        ..Default::default()
                    },
                ]
            } else {
                label_sets
                    .entry(std::sync::Arc::as_ptr(&s.labels))
                    .or_insert_with(|| series_labels(&s.labels, &mut strings, pid_key, comm_key))
                    .clone()
            };
            pb::Sample {
                location_id: location_ids,
                value: if off_cpu {
                    vec![s.count as i64]
                } else {
                    vec![s.count as i64, s.count as i64 * period]
                },
                label,
            }
        })
        .collect();

    let time_nanos = profile
        .start
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    // The comment is made here, not borrowed from the profile: it goes last in the table.
    let mut string_table: Vec<String> = strings.strings.into_iter().map(str::to_owned).collect();
    let comment = match off_cpu_comment(profile.sample_type) {
        Some(text) => {
            string_table.push(text);
            vec![string_table.len() as i64 - 1]
        }
        None => Vec::new(),
    };
    pb::Profile {
        sample_type,
        sample,
        mapping,
        location,
        function,
        string_table,
        time_nanos,
        duration_nanos: profile.duration.as_nanos() as i64,
        period_type,
        period,
        comment,
        ..Default::default()
    }
}

/// The note that tells a reader of an off-CPU profile its values are estimates, and how they
/// were made: pprof's comment, and the OTLP sink's profile attribute.
pub fn off_cpu_comment(sample_type: SampleType) -> Option<String> {
    match sample_type {
        SampleType::Cpu => None,
        SampleType::OffCpu { mean_ns, min_ns } => Some(format!(
            "off-CPU time sampled by duration: a block of d ns was recorded with probability \
             1 - exp(-d / {mean_ns}) and its value scaled by the inverse (an unbiased estimate, \
             not a count); blocks under {min_ns} ns left out"
        )),
    }
}

/// A series' labels as pprof string labels, but `pid` as a number, as Go writes it; `pid` and
/// `comm` first, as `record` has always written them, the rest by name.
fn series_labels<'a>(
    labels: &'a Labels,
    strings: &mut StringTable<'a>,
    pid_key: i64,
    comm_key: i64,
) -> Vec<pb::Label> {
    let mut out = Vec::with_capacity(labels.len());
    if let Some(pid) = labels.get("pid") {
        out.push(match pid.parse::<i64>() {
            Ok(num) => pb::Label {
                key: pid_key,
                num,
                ..Default::default()
            },
            Err(_) => pb::Label {
                key: pid_key,
                str: strings.intern(pid),
                ..Default::default()
            },
        });
    }
    if let Some(comm) = labels.get("comm") {
        out.push(pb::Label {
            key: comm_key,
            str: strings.intern(comm),
            ..Default::default()
        });
    }
    for (key, value) in labels {
        if key != "pid" && key != "comm" {
            out.push(pb::Label {
                key: strings.intern(key),
                str: strings.intern(value),
                ..Default::default()
            });
        }
    }
    out
}

/// Encodes and gzips the profile.
pub fn encode(profile: &Profile) -> Vec<u8> {
    gzip(&to_message(profile).encode_to_vec())
}

/// Encodes and gzips a message built elsewhere (the differential profile).
pub fn encode_message(message: &pb::Profile) -> Vec<u8> {
    gzip(&message.encode_to_vec())
}

/// Encodes and gzips the profile of `samples` (see [`samples_message`]).
pub fn encode_samples(profile: &Profile, samples: &[&Sample]) -> Vec<u8> {
    gzip(&samples_message(profile, samples).encode_to_vec())
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    gzip_at(bytes, Compression::default())
}

/// Gzip at the fastest level, for senders: their CPU matters more than a few percent of bytes.
pub fn gzip_fast(bytes: &[u8]) -> Vec<u8> {
    gzip_at(bytes, Compression::fast())
}

fn gzip_at(bytes: &[u8], level: Compression) -> Vec<u8> {
    // Protobuf profiles compress about 3-4x; start near the size they end at.
    let mut gz = GzEncoder::new(Vec::with_capacity(bytes.len() / 3), level);
    // Writing into a Vec cannot fail.
    let _ = gz.write_all(bytes);
    gz.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;
    use crate::profile::sample_profile;

    /// Upstream's `Location`, without scorch's field: what a reader that does not know it
    /// decodes.
    #[derive(Clone, PartialEq, prost::Message)]
    struct UpstreamLocation {
        #[prost(uint64, tag = "1")]
        id: u64,
        #[prost(uint64, tag = "2")]
        mapping_id: u64,
        #[prost(uint64, tag = "3")]
        address: u64,
        #[prost(message, repeated, tag = "4")]
        line: Vec<pb::Line>,
    }

    #[test]
    fn frame_kinds_go_in_a_field_other_readers_skip() {
        let mut profile = sample_profile();
        profile.locations[2].kind = crate::profile::FrameKind::Go;
        let p = to_message(&profile);
        let kinds: Vec<(u64, u32)> = p
            .location
            .iter()
            .map(|l| (l.address, l.scorch_frame_kind))
            .collect();
        // The kernel's address is its offset from `_text` here; the sample holds it as is.
        assert_eq!(
            kinds,
            [
                (0xffffffff81234567, 1),
                (0x5100, 0),
                (0x5200, 3),
                (0x5300, 0)
            ]
        );
        for location in &p.location {
            let bytes = location.encode_to_vec();
            let upstream = UpstreamLocation::decode(&bytes[..]).unwrap();
            assert_eq!(
                (upstream.id, upstream.address, upstream.line.len()),
                (location.id, location.address, location.line.len())
            );
            // A native frame's kind is proto3's default: not on the wire at all.
            if location.scorch_frame_kind == 0 {
                assert_eq!(bytes, upstream.encode_to_vec());
            }
        }
    }

    #[test]
    fn encodes_a_valid_cpu_profile() {
        let profile = sample_profile();
        let gz = encode(&profile);
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut raw)
            .unwrap();
        let p = pb::Profile::decode(&raw[..]).unwrap();
        let s = |i: i64| p.string_table[i as usize].as_str();

        assert_eq!(p.string_table[0], "");
        let types: Vec<_> = p
            .sample_type
            .iter()
            .map(|t| (s(t.r#type), s(t.unit)))
            .collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
        let period_type = p.period_type.unwrap();
        assert_eq!(
            (s(period_type.r#type), s(period_type.unit)),
            ("cpu", "nanoseconds")
        );
        assert_eq!(p.period, 52_631_578);
        assert_eq!(p.time_nanos, 1_700_000_000_000_000_000);
        assert_eq!(p.duration_nanos, 10_000_000_000);

        // Every string once.
        let mut sorted = p.string_table.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), p.string_table.len());

        // Ids are 1-based and every reference resolves.
        assert_eq!(p.mapping.iter().map(|m| m.id).collect::<Vec<_>>(), [1, 2]);
        // The main binary first, as pprof readers expect.
        assert_eq!(s(p.mapping[0].filename), "/usr/bin/work");
        assert_eq!(s(p.mapping[0].build_id), "abcdef");
        assert_eq!(s(p.mapping[1].filename), "[kernel.kallsyms]");
        assert_eq!(p.mapping[1].build_id, 0);
        assert_eq!(p.function.len(), 3, "main is shared, not repeated");
        let name_of = |loc_id: u64| {
            let loc = p.location.iter().find(|l| l.id == loc_id).unwrap();
            loc.line
                .first()
                .map(|line| {
                    let f = p
                        .function
                        .iter()
                        .find(|f| f.id == line.function_id)
                        .unwrap();
                    s(f.name).to_owned()
                })
                .unwrap_or_default()
        };

        assert_eq!(p.sample.len(), 2);
        let first = &p.sample[0];
        assert_eq!(first.value, [3, 3 * 52_631_578]);
        let names: Vec<_> = first.location_id.iter().map(|&id| name_of(id)).collect();
        assert_eq!(names, ["vfs_read", "leaf", "main"]);
        assert_eq!(s(first.label[0].key), "pid");
        assert_eq!(first.label[0].num, 42);
        assert_eq!(s(first.label[1].key), "comm");
        assert_eq!(s(first.label[1].str), "work");
        // The unnamed location keeps its address and mapping and has no line.
        let unnamed = p.location.iter().find(|l| l.address == 0x5300).unwrap();
        assert!(unnamed.line.is_empty());
        assert_eq!(unnamed.mapping_id, 1);
    }

    /// A line's column goes in pprof's `Line.column`; unknown is 0, as pprof reads it.
    #[test]
    fn lines_carry_their_columns() {
        let mut profile = sample_profile();
        profile.locations[1].lines[0].line = 14;
        profile.locations[1].lines[0].column = 9;
        let p = to_message(&profile);
        let columns: Vec<(i64, i64)> = p
            .location
            .iter()
            .flat_map(|l| l.line.iter().map(|line| (line.line, line.column)))
            .collect();
        assert!(columns.contains(&(14, 9)), "{columns:?}");
        assert!(
            columns.iter().filter(|c| c.1 == 0).count() >= 2,
            "{columns:?}"
        );
    }
}
