//! pprof encoding (`perftools.profiles.Profile`), gzipped.
//!
//! Layout of Go's CPU profiles, which every reader understands: sample types
//! `[samples/count, cpu/nanoseconds]`, period type `cpu/nanoseconds`, values `[n, n * period]`.
//! Strings, functions, locations and mappings are each written once; ids start at 1.

use std::{collections::HashMap, io::Write};

use flate2::{write::GzEncoder, Compression};
use prost::Message;

use crate::{pprof as pb, profile::Profile};

/// Interns strings into the pprof string table (index 0 is always "").
#[derive(Default)]
struct StringTable {
    strings: Vec<String>,
    index: HashMap<String, i64>,
}

impl StringTable {
    fn new() -> Self {
        let mut table = StringTable::default();
        table.intern("");
        table
    }

    fn intern(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.strings.len() as i64;
        self.strings.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }
}

/// Builds the protobuf message.
pub fn to_message(profile: &Profile) -> pb::Profile {
    let mut strings = StringTable::new();
    let value_type = |strings: &mut StringTable, ty: &str, unit: &str| pb::ValueType {
        r#type: strings.intern(ty),
        unit: strings.intern(unit),
    };
    let sample_type = vec![
        value_type(&mut strings, "samples", "count"),
        value_type(&mut strings, "cpu", "nanoseconds"),
    ];
    let period_type = Some(value_type(&mut strings, "cpu", "nanoseconds"));

    let mapping = profile
        .mappings
        .iter()
        .enumerate()
        .map(|(i, m)| pb::Mapping {
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
        })
        .collect();

    let mut functions: Vec<pb::Function> = Vec::new();
    // A function is its name, mangled name and file: the same name in two files (static
    // functions) stays two functions.
    let mut function_ids: HashMap<(&str, &str, &str), u64> = HashMap::new();
    let location = profile
        .locations
        .iter()
        .enumerate()
        .map(|(i, l)| pb::Location {
            id: i as u64 + 1,
            mapping_id: l.mapping.map_or(0, |m| m as u64 + 1),
            address: l.address,
            line: l
                .lines
                .iter()
                .map(|line| {
                    let file = line.file.as_deref().unwrap_or("");
                    let key = (line.function.as_str(), line.system_name.as_str(), file);
                    let id = *function_ids.entry(key).or_insert_with(|| {
                        functions.push(pb::Function {
                            id: functions.len() as u64 + 1,
                            name: strings.intern(&line.function),
                            system_name: strings.intern(&line.system_name),
                            filename: strings.intern(file),
                            start_line: 0,
                        });
                        functions.len() as u64
                    });
                    pb::Line {
                        function_id: id,
                        line: i64::from(line.line),
                        column: 0,
                    }
                })
                .collect(),
            is_folded: false,
        })
        .collect();

    let pid_key = strings.intern("pid");
    let comm_key = strings.intern("comm");
    let period = profile.period_ns as i64;
    let sample = profile
        .samples
        .iter()
        .map(|s| {
            // The series' labels as string labels, but `pid` as a number, as Go writes it.
            let mut series = s.series_labels().into_iter().collect::<Vec<_>>();
            // pid and comm first, as `record` has always written them; the rest by name.
            series.sort_by_key(|(key, _)| match key.as_str() {
                "pid" => 0,
                "comm" => 1,
                _ => 2,
            });
            let label = series
                .iter()
                .map(|(key, value)| match (key.as_str(), value.parse::<i64>()) {
                    ("pid", Ok(pid)) => pb::Label {
                        key: pid_key,
                        num: pid,
                        ..Default::default()
                    },
                    ("comm", _) => pb::Label {
                        key: comm_key,
                        str: strings.intern(value),
                        ..Default::default()
                    },
                    _ => pb::Label {
                        key: strings.intern(key),
                        str: strings.intern(value),
                        ..Default::default()
                    },
                })
                .collect();
            pb::Sample {
                location_id: s.locations.iter().map(|&l| l as u64 + 1).collect(),
                value: vec![s.count as i64, s.count as i64 * period],
                label,
            }
        })
        .collect();

    let time_nanos = profile
        .start
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    pb::Profile {
        sample_type,
        sample,
        mapping,
        location,
        function: functions,
        string_table: strings.strings,
        time_nanos,
        duration_nanos: profile.duration.as_nanos() as i64,
        period_type,
        period,
        ..Default::default()
    }
}

/// Encodes and gzips the profile.
pub fn encode(profile: &Profile) -> Vec<u8> {
    let bytes = to_message(profile).encode_to_vec();
    let mut gz = GzEncoder::new(Vec::with_capacity(bytes.len() / 4), Compression::default());
    // Writing into a Vec cannot fail.
    let _ = gz.write_all(&bytes);
    gz.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;
    use crate::profile::sample_profile;

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
        assert_eq!(s(p.mapping[0].filename), "[kernel.kallsyms]");
        assert_eq!(s(p.mapping[1].build_id), "abcdef");
        assert_eq!(p.mapping[0].build_id, 0);
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
        assert_eq!(unnamed.mapping_id, 2);
    }
}
