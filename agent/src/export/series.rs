//! A window as series: its samples grouped by label set ([`split_by_series`]), and the
//! requests that carry them ([`encode_window`]), packed by each protocol's [`RequestBuilder`].
//! Pure: no I/O, so the same window always gives the same requests.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use prost::Message as _;

use crate::profile::{encode, Labels, Profile, Sample};

/// One series of a window: its labels and its samples, borrowed from the window's profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Series<'a> {
    pub labels: Labels,
    pub samples: Vec<&'a Sample>,
}

/// A window's samples grouped by label set. Series come out sorted by labels, so the same
/// window always gives the same requests. Samples of one process share one label set (an
/// `Arc`), so the labels are compared once per process, not once per sample.
pub fn split_by_series(profile: &Profile) -> Vec<Series<'_>> {
    let mut by_labels: BTreeMap<Labels, usize> = BTreeMap::new();
    let mut by_set: HashMap<*const Labels, usize> = HashMap::new();
    let mut groups: Vec<Vec<&Sample>> = Vec::new();
    let mut group_of = |labels: Labels, groups: &mut Vec<Vec<&Sample>>| {
        *by_labels.entry(labels).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        })
    };
    for sample in &profile.samples {
        let group = if sample.labels.is_empty() {
            group_of(sample.series_labels(), &mut groups)
        } else {
            match by_set.get(&Arc::as_ptr(&sample.labels)) {
                Some(&group) => group,
                None => {
                    let group = group_of((*sample.labels).clone(), &mut groups);
                    by_set.insert(Arc::as_ptr(&sample.labels), group);
                    group
                }
            }
        };
        groups[group].push(sample);
    }
    let mut groups: Vec<Option<Vec<&Sample>>> = groups.into_iter().map(Some).collect();
    by_labels
        .into_iter()
        .map(|(labels, group)| Series {
            labels,
            samples: groups[group].take().unwrap_or_default(),
        })
        .collect()
}

/// How a protocol packs series into requests; [`encode_window`] feeds it one series at a time.
pub trait RequestBuilder {
    type Request;
    /// At most this many bytes of packed profiles in one request (a larger series goes alone).
    const MAX_BYTES: usize;
    /// One series' pprof as the request carries it, from its plain encoding (the protocol
    /// gzips each profile, or the request as a whole).
    fn pack(plain: Vec<u8>) -> Vec<u8>;
    fn add(&mut self, labels: &Labels, pprof: Vec<u8>);
    fn finish(self) -> Self::Request;
}

/// A window's requests: its series encoded one at a time and packed into requests of at most
/// `B::MAX_BYTES`, in label order, so the same window always gives the same requests. Only one
/// series' pprof exists unpacked at any time: a window of hundreds of series costs the sender
/// little more memory than its requests.
pub fn encode_window<B: RequestBuilder>(
    profile: &Profile,
    mut builder: impl FnMut() -> B,
) -> Vec<B::Request> {
    let mut requests = Vec::new();
    let mut current: Option<(B, usize)> = None;
    for series in split_by_series(profile) {
        let plain = encode::pprof::samples_message(profile, &series.samples).encode_to_vec();
        let packed = B::pack(plain);
        if let Some((request, bytes)) = current.take() {
            if bytes + packed.len() > B::MAX_BYTES {
                requests.push(request.finish());
            } else {
                current = Some((request, bytes));
            }
        }
        let (request, bytes) = current.get_or_insert_with(|| (builder(), 0));
        *bytes += packed.len();
        request.add(&series.labels, packed);
    }
    if let Some((request, _)) = current {
        requests.push(request.finish());
    }
    requests
}

/// A label name as Prometheus (and so both servers) accept it: `[a-zA-Z_][a-zA-Z0-9_]*`, other
/// characters replaced by `_`.
pub fn label_name(name: &str) -> String {
    let mut out = crate::labels::relabel::sanitize_label_chars(name);
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{sample_profile, FrameKind, Line, Location, Mapping};

    /// Two processes sharing the kernel mapping, each with its own binary.
    fn two_process_profile() -> Profile {
        let mut profile = sample_profile();
        profile.mappings.push(Mapping {
            start: 0x1000,
            limit: 0x2000,
            file_offset: 0,
            path: "/usr/bin/other".into(),
            build_id: None,
            has_functions: true,
            has_filenames: false,
            has_line_numbers: false,
            has_inline_frames: false,
        });
        profile.locations.push(Location {
            mapping: Some(2),
            address: 0x1100,
            lines: vec![Line::named("other_main")],
            kind: FrameKind::Native,
        });
        profile.samples.push(Sample {
            pid: 7,
            comm: "other".into(),
            labels: Arc::new(Labels::from([
                ("service_name".into(), "db".into()),
                ("comm".into(), "other".into()),
                ("pid".into(), "7".into()),
            ])),
            locations: vec![0, 4],
            count: 5,
        });
        profile
    }

    #[test]
    fn windows_split_into_series_with_only_their_frames() {
        let profile = two_process_profile();
        let series = split_by_series(&profile);
        assert_eq!(series.len(), 2);
        let work = series
            .iter()
            .find(|s| s.labels.get("comm").map(String::as_str) == Some("work"))
            .unwrap();
        assert_eq!(work.labels.get("pid").map(String::as_str), Some("42"));
        assert_eq!(work.samples.len(), 2);
        assert_eq!(work.samples.iter().map(|s| s.count).sum::<u64>(), 4);
        let message = encode::pprof::samples_message(&profile, &work.samples);
        let text = |i: i64| message.string_table[i as usize].as_str();
        // Its binary first (the main binary), then the kernel; not the other process's.
        let paths: Vec<_> = message.mapping.iter().map(|m| text(m.filename)).collect();
        assert_eq!(paths, ["/usr/bin/work", "[kernel.kallsyms]"]);
        assert_eq!(message.location.len(), 4);

        let other = series
            .iter()
            .find(|s| s.labels.get("comm").map(String::as_str) == Some("other"))
            .unwrap();
        assert_eq!(
            other.labels.get("service_name").map(String::as_str),
            Some("db")
        );
        let message = encode::pprof::samples_message(&profile, &other.samples);
        let text = |i: i64| message.string_table[i as usize].as_str();
        let paths: Vec<_> = message.mapping.iter().map(|m| text(m.filename)).collect();
        assert_eq!(paths, ["/usr/bin/other", "[kernel.kallsyms]"]);
        // The sample's frames name the same functions as before the split, and each
        // location sits in the right mapping.
        assert_eq!(message.sample.len(), 1);
        let frames: Vec<(&str, &str)> = message.sample[0]
            .location_id
            .iter()
            .map(|&id| {
                let location = &message.location[id as usize - 1];
                assert_eq!(location.id, id);
                let function = &message.function[location.line[0].function_id as usize - 1];
                let mapping = &message.mapping[location.mapping_id as usize - 1];
                (text(function.name), text(mapping.filename))
            })
            .collect();
        assert_eq!(
            frames,
            [
                ("vfs_read", "[kernel.kallsyms]"),
                ("other_main", "/usr/bin/other")
            ]
        );
        // The series' labels travel as pprof labels, pid as a number.
        let labels: Vec<(&str, &str, i64)> = message.sample[0]
            .label
            .iter()
            .map(|l| (text(l.key), text(l.str), l.num))
            .collect();
        assert_eq!(
            labels,
            [
                ("pid", "", 7),
                ("comm", "other", 0),
                ("service_name", "db", 0)
            ]
        );
    }

    /// Records what [`encode_window`] gives it; packed size = plain size.
    struct Recorder(Vec<String>);

    impl RequestBuilder for Recorder {
        type Request = Vec<String>;
        const MAX_BYTES: usize = 700;
        fn pack(plain: Vec<u8>) -> Vec<u8> {
            plain
        }
        fn add(&mut self, labels: &Labels, pprof: Vec<u8>) {
            let message = crate::pprof::Profile::decode(&pprof[..]).unwrap();
            assert_eq!(message.sample.len(), 1);
            self.0.push(labels["comm"].clone());
        }
        fn finish(self) -> Vec<String> {
            self.0
        }
    }

    #[test]
    fn requests_are_split_by_size() {
        let mut profile = two_process_profile();
        profile.samples.truncate(1);
        let one = encode::pprof::to_message(&profile).encode_to_vec().len();
        assert!((234..=350).contains(&one), "{one}");
        // Five processes of one sample each, about the same size: two fit in 700 bytes, three do not.
        for comm in ["b", "c", "d", "e"] {
            let mut sample = profile.samples[0].clone();
            sample.comm = comm.into();
            sample.labels = Arc::new(Labels::from([("comm".into(), comm.into())]));
            profile.samples.push(sample);
        }
        profile.samples[0].labels = Arc::new(Labels::from([("comm".into(), "a".into())]));
        let requests = encode_window(&profile, || Recorder(Vec::new()));
        assert_eq!(requests, [vec!["a", "b"], vec!["c", "d"], vec!["e"]]);
        profile.samples.clear();
        assert!(encode_window(&profile, || Recorder(Vec::new())).is_empty());
    }

    #[test]
    fn label_names_are_made_valid() {
        assert_eq!(label_name("service_name"), "service_name");
        assert_eq!(label_name("k8s.pod-name"), "k8s_pod_name");
        assert_eq!(label_name("1x"), "_1x");
        assert_eq!(label_name(""), "_");
    }
}
