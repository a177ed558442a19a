//! A window as OTLP profiles: the pure half of the OTLP sink, no I/O.
//!
//! ```text
//! Profile (a window) -> split_by_series -> one ResourceProfiles per series (a process, or a
//!   container when relabelling grouped its processes) -> ExportProfilesServiceRequest
//! ```
//!
//! Every request carries one `ProfilesDictionary` that all its profiles index into, built as
//! the series are added, so a library mapped by a hundred processes is described once. Every
//! table starts with its zero element (`""`, the empty mapping, location, function, link,
//! attribute and stack), as the protocol requires: index 0 means "none" everywhere.
//!
//! The resource attributes follow the semantic conventions a Collector's processors and the
//! backends key on (`service.name`, `container.id`, `k8s.pod.name`, ...); the labels with no
//! convention travel as attributes under their own names, so nothing the relabelling kept is
//! lost on the way.

use std::collections::HashMap;

use prost::Message as _;

use super::proto::{
    collector::ExportProfilesServiceRequest,
    common::{any_value, AnyValue, InstrumentationScope, KeyValue},
    profiles::{
        Function, KeyValueAndUnit, Line, Link, Location, Mapping, Profile as OtlpProfile,
        ProfilesDictionary, ResourceProfiles, Sample as OtlpSample, ScopeProfiles, Stack,
        ValueType,
    },
    resource::Resource,
};
use crate::{
    export::series::{split_by_series, Series},
    profile::{
        encode::pprof::off_cpu_comment, FrameKind, Labels, LocationIndex, MappingIndex, Profile,
        SampleType,
    },
    sys::time::unix_ns,
};

/// A hash map with a fast, non-cryptographic hasher: its keys come from our own profile.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// What one profile of a resource measures: its sample type and its period's type. A window's
/// CPU samples are one; another source (off-CPU time) is another profile of the same resource,
/// with its own types, as the protocol wants one sample type per profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfileType {
    pub sample: (&'static str, &'static str),
    pub period: (&'static str, &'static str),
}

/// On-CPU samples, as the OpenTelemetry eBPF profiler sends them (and as scorch's pprof's first
/// sample type counts them): each sample one tick of the sampling clock.
pub const CPU: ProfileType = ProfileType {
    sample: ("samples", "count"),
    period: ("cpu", "nanoseconds"),
};

/// Off-CPU time, as the OpenTelemetry eBPF profiler sends it: nanoseconds blocked, the period
/// the sampling parameter (one event per that much blocked time, on average).
pub const OFF_CPU: ProfileType = ProfileType {
    sample: ("off_cpu", "nanoseconds"),
    period: ("off_cpu", "nanoseconds"),
};

/// The profile attribute that carries an off-CPU profile's sampling rule (pprof's comment):
/// its values are estimates, and this says how they were made.
pub const SAMPLING_RULE_ATTRIBUTE: &str = "scorch.off_cpu.sampling_rule";

/// The profile type of a window's samples, and its period.
pub fn profile_type(profile: &Profile) -> (ProfileType, i64) {
    match profile.sample_type {
        SampleType::Cpu => (CPU, profile.period_ns as i64),
        SampleType::OffCpu { mean_ns, .. } => (OFF_CPU, mean_ns as i64),
    }
}

/// The instrumentation scope every profile is filed under.
const SCOPE_NAME: &str = "scorch";

/// Labels whose value becomes a semantic-convention resource attribute instead of one under
/// the label's own name: (label, attribute).
const RESOURCE_KEYS: [(&str, &str); 7] = [
    ("service_name", "service.name"),
    ("container_id", "container.id"),
    ("pod", "k8s.pod.name"),
    ("namespace", "k8s.namespace.name"),
    ("container", "k8s.container.name"),
    ("executable", "process.executable.path"),
    ("node", "host.name"),
];

/// What the conversion needs besides the window.
#[derive(Debug, Clone)]
pub struct ConvertOptions {
    /// `host.name` of a series whose labels have no `node` (a rule dropped it).
    pub host_name: String,
    /// A request is closed once its profiles and dictionary hold about this many bytes of
    /// protobuf, so it stays under what a server takes in one message (a Collector's gRPC
    /// receiver: 4 MiB by default); one series larger than that goes alone.
    pub max_bytes: usize,
}

/// The requests that carry the window `profile`, its series in label order, so the same window
/// always gives the same requests (and so the same profile ids).
pub fn window_requests(
    profile: &Profile,
    options: &ConvertOptions,
) -> Vec<ExportProfilesServiceRequest> {
    let mut requests = Vec::new();
    let rule = off_cpu_comment(profile.sample_type);
    let rule = rule.as_deref();
    let mut builder = RequestBuilder::new(profile, options, rule);
    for series in split_by_series(profile) {
        builder.add_series(&series);
        if builder.bytes >= options.max_bytes {
            requests.push(builder.finish());
            builder = RequestBuilder::new(profile, options, rule);
        }
    }
    if !builder.resource_profiles.is_empty() {
        requests.push(builder.finish());
    }
    requests
}

/// One request being built: its resources and the dictionary they share.
struct RequestBuilder<'a> {
    profile: &'a Profile,
    options: &'a ConvertOptions,
    /// An off-CPU window's sampling rule, an attribute of each of its profiles.
    rule: Option<&'a str>,
    dictionary: Dictionary<'a>,
    resource_profiles: Vec<ResourceProfiles>,
    /// About how many bytes the request encodes to: what was added to it, each part counted
    /// as it was added (measuring the whole request again per series would be quadratic).
    bytes: usize,
}

impl<'a> RequestBuilder<'a> {
    fn new(
        profile: &'a Profile,
        options: &'a ConvertOptions,
        rule: Option<&'a str>,
    ) -> RequestBuilder<'a> {
        RequestBuilder {
            profile,
            options,
            rule,
            dictionary: Dictionary::new(),
            resource_profiles: Vec::new(),
            bytes: 0,
        }
    }

    fn add_series(&mut self, series: &Series<'a>) {
        let samples = self.samples(series);
        let (kind, period) = profile_type(self.profile);
        let attribute_indices = match self.rule {
            Some(rule) => vec![self.dictionary.attribute(SAMPLING_RULE_ATTRIBUTE, rule)],
            None => Vec::new(),
        };
        let profile = OtlpProfile {
            sample_type: Some(self.dictionary.value_type(kind.sample)),
            samples,
            time_unix_nano: unix_ns(self.profile.start).max(0) as u64,
            duration_nano: self.profile.duration.as_nanos() as u64,
            period_type: Some(self.dictionary.value_type(kind.period)),
            period,
            profile_id: profile_id(unix_ns(self.profile.start), &series.labels, kind).to_vec(),
            attribute_indices,
            ..Default::default()
        };
        let resource = ResourceProfiles {
            resource: Some(Resource {
                attributes: resource_attributes(&series.labels, &self.options.host_name),
                ..Default::default()
            }),
            scope_profiles: vec![ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: SCOPE_NAME.to_owned(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    ..Default::default()
                }),
                profiles: vec![profile],
                ..Default::default()
            }],
            ..Default::default()
        };
        self.bytes += resource.encoded_len() + self.dictionary.take_added_bytes();
        self.resource_profiles.push(resource);
    }

    /// A series' samples, one per distinct stack: samples of several processes grouped in
    /// one series (a container's) with the same stack are one sample, as the protocol's
    /// sample identity (stack, attributes, link) requires.
    fn samples(&mut self, series: &Series<'a>) -> Vec<OtlpSample> {
        let mut samples: Vec<OtlpSample> = Vec::new();
        let mut by_stack: FastMap<i32, usize> = FastMap::default();
        for sample in &series.samples {
            let stack = self.dictionary.stack(self.profile, &sample.locations);
            match by_stack.get(&stack) {
                Some(&at) => samples[at].values[0] += sample.count as i64,
                None => {
                    by_stack.insert(stack, samples.len());
                    samples.push(OtlpSample {
                        stack_index: stack,
                        values: vec![sample.count as i64],
                        ..Default::default()
                    });
                }
            }
        }
        samples
    }

    fn finish(self) -> ExportProfilesServiceRequest {
        ExportProfilesServiceRequest {
            resource_profiles: self.resource_profiles,
            dictionary: Some(self.dictionary.finish()),
        }
    }
}

/// The 16-byte profile id: the window's start, the series' labels and the profile type,
/// hashed, so a window sent again (after a restart interrupted its delivery) carries the same
/// ids and a backend that deduplicates can.
fn profile_id(start_ns: i64, labels: &Labels, profile_type: ProfileType) -> [u8; 16] {
    let mut name = format!(
        "{start_ns}\n{}/{}",
        profile_type.sample.0, profile_type.sample.1
    );
    for (key, value) in labels {
        name.push('\n');
        name.push_str(key);
        name.push('=');
        name.push_str(value);
    }
    *uuid::Uuid::new_v5(&PROFILE_ID_NAMESPACE, name.as_bytes()).as_bytes()
}

/// Namespace of the profile ids (UUID v5): a fixed, random UUID of scorch's own.
const PROFILE_ID_NAMESPACE: uuid::Uuid =
    uuid::Uuid::from_u128(0x0c7d_42e9_86b1_4f3a_b5d0_7e61_a9c2_38f4);

/// A series' labels as resource attributes: the semantic conventions where one exists
/// (`process.pid` as an integer), the rest under their own names.
fn resource_attributes(labels: &Labels, host_name: &str) -> Vec<KeyValue> {
    let mut attributes: Vec<KeyValue> = Vec::new();
    let mut put = |key: &str, value: any_value::Value| {
        if !attributes.iter().any(|a| a.key == key) {
            attributes.push(KeyValue {
                key: key.to_owned(),
                value: Some(AnyValue { value: Some(value) }),
                ..Default::default()
            });
        }
    };
    let text = |value: &str| any_value::Value::StringValue(value.to_owned());
    for (label, key) in RESOURCE_KEYS {
        if let Some(value) = labels.get(label).filter(|v| !v.is_empty()) {
            put(key, text(value));
        }
    }
    if let Some(pid) = labels.get("pid") {
        match pid.parse::<i64>() {
            Ok(pid) => put("process.pid", any_value::Value::IntValue(pid)),
            Err(_) => put("pid", text(pid)),
        }
    }
    // The executable's name is its path's last part; a series without a path (a rule dropped
    // it) has the command name, which is the same name cut to 15 bytes.
    let executable_name = labels
        .get("executable")
        .and_then(|path| path.rsplit('/').next())
        .or_else(|| labels.get("comm").map(String::as_str))
        .filter(|name| !name.is_empty());
    if let Some(name) = executable_name {
        put("process.executable.name", text(name));
    }
    // The node a pod runs on is the host itself.
    if labels.contains_key("pod") || labels.contains_key("namespace") {
        if let Some(node) = labels.get("node").filter(|v| !v.is_empty()) {
            put("k8s.node.name", text(node));
        }
    }
    if !host_name.is_empty() {
        put("host.name", text(host_name));
    }
    // Required by the conventions: `unknown_service:` and the executable, as SDKs do.
    let service = match executable_name {
        Some(name) => format!("unknown_service:{name}"),
        None => "unknown_service".to_owned(),
    };
    put("service.name", text(&service));
    for (label, value) in labels {
        let converted = label == "pid"
            || RESOURCE_KEYS.iter().any(|&(name, _)| name == label)
            // The command name went as the executable's name only when there is no path.
            || (label == "comm" && !labels.contains_key("executable"));
        // Labels starting with `__` are the relabelling's own and never leave scorch.
        if !converted && !label.starts_with("__") && !value.is_empty() {
            put(label, text(value));
        }
    }
    attributes
}

/// The kind of frame a location is, as the semantic conventions' `profile.frame.type` names
/// it (their well-known values: `native`, `kernel`, `cpython`, `go`, `jvm` (HotSpot, as
/// OTel's profiler names its frames); `v8js`, `ruby` for the runtimes to come).
fn frame_type(profile: &Profile, index: LocationIndex) -> &'static str {
    match profile.locations[index].kind {
        FrameKind::Native => "native",
        FrameKind::Kernel => "kernel",
        FrameKind::Python => "cpython",
        FrameKind::Go => "go",
        FrameKind::Jvm => "jvm",
        FrameKind::V8js => "v8js",
    }
}

/// The tables a request's profiles index into, each built once per request and holding only
/// what its samples use. Strings are borrowed from the window until [`Dictionary::finish`].
struct Dictionary<'a> {
    strings: Vec<&'a str>,
    string_index: FastMap<&'a str, i32>,
    /// Every attribute is a string here (frame types, build ids): keyed by key and value.
    attributes: Vec<KeyValueAndUnit>,
    attribute_index: FastMap<(i32, &'a str), i32>,
    mappings: Vec<Mapping>,
    mapping_index: FastMap<MappingIndex, i32>,
    functions: Vec<Function>,
    function_index: FastMap<(i32, i32, i32), i32>,
    locations: Vec<Location>,
    location_index: FastMap<LocationIndex, i32>,
    stacks: Vec<Stack>,
    stack_index: FastMap<Vec<i32>, i32>,
    /// Bytes of table entries added since the last [`Dictionary::take_added_bytes`].
    added_bytes: usize,
}

impl<'a> Dictionary<'a> {
    fn new() -> Dictionary<'a> {
        let mut dictionary = Dictionary {
            strings: Vec::new(),
            string_index: FastMap::default(),
            attributes: vec![KeyValueAndUnit::default()],
            attribute_index: FastMap::default(),
            mappings: vec![Mapping::default()],
            mapping_index: FastMap::default(),
            functions: vec![Function::default()],
            function_index: FastMap::default(),
            locations: vec![Location::default()],
            location_index: FastMap::default(),
            stacks: vec![Stack::default()],
            stack_index: FastMap::default(),
            added_bytes: 0,
        };
        dictionary.string("");
        dictionary.stack_index.insert(Vec::new(), 0);
        dictionary
    }

    fn take_added_bytes(&mut self) -> usize {
        std::mem::take(&mut self.added_bytes)
    }

    fn string(&mut self, s: &'a str) -> i32 {
        let next = self.strings.len() as i32;
        let index = *self.string_index.entry(s).or_insert(next);
        if index == next {
            self.strings.push(s);
            // The string, its length and its field key.
            self.added_bytes += s.len() + 2;
        }
        index
    }

    fn value_type(&mut self, (kind, unit): (&'static str, &'static str)) -> ValueType {
        ValueType {
            type_strindex: self.string(kind),
            unit_strindex: self.string(unit),
        }
    }

    fn attribute(&mut self, key: &'a str, value: &'a str) -> i32 {
        let key = self.string(key);
        let next = self.attributes.len() as i32;
        let index = *self.attribute_index.entry((key, value)).or_insert(next);
        if index == next {
            let attribute = KeyValueAndUnit {
                key_strindex: key,
                value: Some(AnyValue {
                    value: Some(any_value::Value::StringValue(value.to_owned())),
                }),
                unit_strindex: 0,
            };
            self.added_bytes += attribute.encoded_len() + 2;
            self.attributes.push(attribute);
        }
        index
    }

    fn mapping(&mut self, profile: &'a Profile, index: MappingIndex) -> i32 {
        if let Some(&at) = self.mapping_index.get(&index) {
            return at;
        }
        let m = &profile.mappings[index];
        let attribute_indices = match m.build_id.as_deref() {
            Some(id) => vec![self.attribute("process.executable.build_id.gnu", id)],
            None => Vec::new(),
        };
        let mapping = Mapping {
            memory_start: m.start,
            memory_limit: m.limit,
            file_offset: m.file_offset,
            filename_strindex: self.string(&m.path),
            attribute_indices,
        };
        self.added_bytes += mapping.encoded_len() + 2;
        let at = self.mappings.len() as i32;
        self.mappings.push(mapping);
        self.mapping_index.insert(index, at);
        at
    }

    fn function(&mut self, line: &'a crate::profile::Line) -> i32 {
        let key = (
            self.string(&line.function),
            self.string(&line.system_name),
            self.string(line.file.as_deref().unwrap_or("")),
        );
        let next = self.functions.len() as i32;
        let index = *self.function_index.entry(key).or_insert(next);
        if index == next {
            let function = Function {
                name_strindex: key.0,
                system_name_strindex: key.1,
                filename_strindex: key.2,
                start_line: 0,
            };
            self.added_bytes += function.encoded_len() + 2;
            self.functions.push(function);
        }
        index
    }

    fn location(&mut self, profile: &'a Profile, index: LocationIndex) -> i32 {
        if let Some(&at) = self.location_index.get(&index) {
            return at;
        }
        let l = &profile.locations[index];
        let mapping_index = l.mapping.map_or(0, |m| self.mapping(profile, m));
        // Innermost (inlined) first and the caller last, as the profile holds them.
        let lines = l
            .lines
            .iter()
            .map(|line| Line {
                function_index: self.function(line),
                line: i64::from(line.line),
                column: i64::from(line.column),
            })
            .collect();
        let frame_type = self.attribute("profile.frame.type", frame_type(profile, index));
        let location = Location {
            mapping_index,
            address: l.address,
            lines,
            attribute_indices: vec![frame_type],
        };
        self.added_bytes += location.encoded_len() + 2;
        let at = self.locations.len() as i32;
        self.locations.push(location);
        self.location_index.insert(index, at);
        at
    }

    /// The stack of `locations` (leaf first, as both the profile and the protocol order them).
    fn stack(&mut self, profile: &'a Profile, locations: &[LocationIndex]) -> i32 {
        let indices: Vec<i32> = locations
            .iter()
            .filter(|&&index| index < profile.locations.len())
            .map(|&index| self.location(profile, index))
            .collect();
        if let Some(&at) = self.stack_index.get(&indices) {
            return at;
        }
        let stack = Stack {
            location_indices: indices.clone(),
        };
        self.added_bytes += stack.encoded_len() + 2;
        let at = self.stacks.len() as i32;
        self.stacks.push(stack);
        self.stack_index.insert(indices, at);
        at
    }

    fn finish(self) -> ProfilesDictionary {
        ProfilesDictionary {
            mapping_table: self.mappings,
            location_table: self.locations,
            function_table: self.functions,
            // No trace links: only the zero element, which "no link" (index 0) points to.
            link_table: vec![Link::default()],
            string_table: self.strings.into_iter().map(str::to_owned).collect(),
            attribute_table: self.attributes,
            stack_table: self.stacks,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::profile::{
        sample_profile, Line as ProfileLine, Location as ProfileLocation, Sample,
    };

    /// The frame type is the location's kind, never guessed from its shape: a native frame
    /// with no mapping, no address and a file (what Python frames once were told by) stays
    /// native.
    #[test]
    fn frame_types_are_the_locations_kinds() {
        let mut profile = sample_profile();
        for (kind, name) in [
            (FrameKind::Native, "native"),
            (FrameKind::Kernel, "kernel"),
            (FrameKind::Python, "cpython"),
            (FrameKind::Go, "go"),
            (FrameKind::Jvm, "jvm"),
            (FrameKind::V8js, "v8js"),
        ] {
            profile.locations[1].kind = kind;
            assert_eq!(frame_type(&profile, 1), name);
        }
        profile.locations[3] = ProfileLocation {
            mapping: None,
            address: 0,
            lines: vec![ProfileLine {
                file: Some("/srv/app.rb".into()),
                ..ProfileLine::named("handler")
            }],
            kind: FrameKind::Native,
        };
        assert_eq!(frame_type(&profile, 3), "native");
    }

    fn options() -> ConvertOptions {
        ConvertOptions {
            host_name: "fallback-host".into(),
            max_bytes: 1 << 20,
        }
    }

    /// The sample profile, plus a container's two processes (same stack in both, a Python
    /// frame on top) and a process in a systemd unit.
    fn window() -> Profile {
        let mut profile = sample_profile();
        profile.locations.push(ProfileLocation {
            mapping: None,
            address: 0,
            lines: vec![ProfileLine {
                function: "handler".into(),
                system_name: "handler".into(),
                file: Some("/srv/app.py".into()),
                line: 12,
                column: 5,
            }],
            kind: FrameKind::Python,
        });
        let container = Arc::new(Labels::from([
            ("container_id".into(), "c0ffee".into()),
            ("service_name".into(), "shop".into()),
            ("node".into(), "node-7".into()),
            ("pod".into(), "shop-1".into()),
            ("namespace".into(), "prod".into()),
            ("cluster".into(), "eu".into()),
        ]));
        for pid in [100, 101] {
            profile.samples.push(Sample {
                pid,
                comm: "python3".into(),
                labels: container.clone(),
                locations: vec![4, 2],
                count: 2,
            });
        }
        profile.samples.push(Sample {
            pid: 9,
            comm: "nginx".into(),
            labels: Arc::new(Labels::from([
                ("pid".into(), "9".into()),
                ("comm".into(), "nginx".into()),
                ("executable".into(), "/usr/sbin/nginx".into()),
                ("systemd_unit".into(), "nginx.service".into()),
                ("service_name".into(), "nginx.service".into()),
            ])),
            locations: vec![0, 1, 2],
            count: 7,
        });
        profile
    }

    fn string_attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
        attributes.iter().find(|a| a.key == key).and_then(|a| {
            match a.value.as_ref()?.value.as_ref()? {
                any_value::Value::StringValue(s) => Some(s.clone()),
                any_value::Value::IntValue(i) => Some(i.to_string()),
                _ => None,
            }
        })
    }

    /// Every table starts with its zero element and every index lands inside its table.
    fn check_tables(request: &ExportProfilesServiceRequest) {
        let d = request.dictionary.as_ref().unwrap();
        assert_eq!(d.string_table[0], "");
        assert_eq!(d.mapping_table[0], Mapping::default());
        assert_eq!(d.location_table[0], Location::default());
        assert_eq!(d.function_table[0], Function::default());
        assert_eq!(d.link_table[0], Link::default());
        assert_eq!(d.attribute_table[0], KeyValueAndUnit::default());
        assert_eq!(d.stack_table[0], Stack::default());
        let string = |i: i32| assert!((0..d.string_table.len() as i32).contains(&i), "{i}");
        let attribute = |i: i32| assert!((1..d.attribute_table.len() as i32).contains(&i), "{i}");
        for m in &d.mapping_table[1..] {
            string(m.filename_strindex);
            m.attribute_indices.iter().copied().for_each(attribute);
        }
        for f in &d.function_table[1..] {
            string(f.name_strindex);
            string(f.system_name_strindex);
            string(f.filename_strindex);
        }
        for l in &d.location_table[1..] {
            assert!((0..d.mapping_table.len() as i32).contains(&l.mapping_index));
            for line in &l.lines {
                assert!((1..d.function_table.len() as i32).contains(&line.function_index));
            }
            l.attribute_indices.iter().copied().for_each(attribute);
        }
        for a in &d.attribute_table[1..] {
            string(a.key_strindex);
        }
        for s in &d.stack_table[1..] {
            for &l in &s.location_indices {
                assert!((1..d.location_table.len() as i32).contains(&l));
            }
        }
        for r in &request.resource_profiles {
            for p in &r.scope_profiles[0].profiles {
                for s in &p.samples {
                    assert!((1..d.stack_table.len() as i32).contains(&s.stack_index));
                    assert_eq!(s.link_index, 0);
                }
            }
        }
        // No duplicates in the tables built by value.
        let unique = |n: usize, set: usize| assert_eq!(n, set);
        unique(
            d.string_table.len(),
            d.string_table
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .len(),
        );
        unique(
            d.stack_table.len(),
            d.stack_table
                .iter()
                .map(|s| &s.location_indices)
                .collect::<std::collections::HashSet<_>>()
                .len(),
        );
    }

    #[test]
    fn an_off_cpu_window_is_its_own_profile_type_with_its_rule() {
        let cpu = window();
        let mut off_cpu = window();
        off_cpu.sample_type = SampleType::OffCpu {
            mean_ns: 10_000_000,
            min_ns: 0,
        };
        off_cpu.period_ns = 1;
        let requests = window_requests(&off_cpu, &options());
        assert_eq!(requests.len(), 1);
        let request = &requests[0];
        check_tables(request);
        let d = request.dictionary.as_ref().unwrap();
        let text = |i: i32| d.string_table[i as usize].as_str();
        let cpu_ids: Vec<Vec<u8>> = window_requests(&cpu, &options())[0]
            .resource_profiles
            .iter()
            .map(|r| r.scope_profiles[0].profiles[0].profile_id.clone())
            .collect();
        for resource in &request.resource_profiles {
            let profile = &resource.scope_profiles[0].profiles[0];
            let types = [profile.sample_type.unwrap(), profile.period_type.unwrap()]
                .map(|t| (text(t.type_strindex), text(t.unit_strindex)));
            assert_eq!(types, [("off_cpu", "nanoseconds"); 2]);
            assert_eq!(profile.period, 10_000_000);
            assert_eq!(profile.attribute_indices.len(), 1);
            let rule = &d.attribute_table[profile.attribute_indices[0] as usize];
            assert_eq!(text(rule.key_strindex), SAMPLING_RULE_ATTRIBUTE);
            match rule.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(text)) => {
                    assert!(text.contains("1 - exp(-d / 10000000)"), "{text}")
                }
                other => panic!("{other:?}"),
            }
            // Not the CPU profile of the same series and window.
            assert!(!cpu_ids.contains(&profile.profile_id));
        }
        // A CPU window's profiles carry no rule.
        for resource in &window_requests(&cpu, &options())[0].resource_profiles {
            assert!(resource.scope_profiles[0].profiles[0]
                .attribute_indices
                .is_empty());
        }
    }

    #[test]
    fn a_window_becomes_one_resource_per_series_sharing_one_dictionary() {
        let profile = window();
        let requests = window_requests(&profile, &options());
        assert_eq!(requests.len(), 1);
        let request = &requests[0];
        check_tables(request);
        // The record-style series (comm, pid), the container, the unit.
        assert_eq!(request.resource_profiles.len(), 3);
        let d = request.dictionary.as_ref().unwrap();
        let text = |i: i32| d.string_table[i as usize].as_str();
        for resource in &request.resource_profiles {
            let profile = &resource.scope_profiles[0].profiles[0];
            let sample_type = profile.sample_type.unwrap();
            assert_eq!(
                (
                    text(sample_type.type_strindex),
                    text(sample_type.unit_strindex)
                ),
                ("samples", "count")
            );
            let period_type = profile.period_type.unwrap();
            assert_eq!(
                (
                    text(period_type.type_strindex),
                    text(period_type.unit_strindex)
                ),
                ("cpu", "nanoseconds")
            );
            assert_eq!(profile.period, 52_631_578);
            assert_eq!(profile.time_unix_nano, 1_700_000_000_000_000_000);
            assert_eq!(profile.duration_nano, 10_000_000_000);
            assert_eq!(profile.profile_id.len(), 16);
            assert_eq!(
                resource.scope_profiles[0].scope.as_ref().unwrap().name,
                "scorch"
            );
        }
        let attributes = |i: usize| {
            &request.resource_profiles[i]
                .resource
                .as_ref()
                .unwrap()
                .attributes
        };
        // Series in label order: the container's (container_id < comm), nginx, then record's.
        let container = attributes(0);
        let get = |a: &[KeyValue], key: &str| string_attribute(a, key);
        assert_eq!(get(container, "container.id").as_deref(), Some("c0ffee"));
        assert_eq!(get(container, "service.name").as_deref(), Some("shop"));
        assert_eq!(get(container, "k8s.pod.name").as_deref(), Some("shop-1"));
        assert_eq!(
            get(container, "k8s.namespace.name").as_deref(),
            Some("prod")
        );
        assert_eq!(get(container, "k8s.node.name").as_deref(), Some("node-7"));
        assert_eq!(get(container, "host.name").as_deref(), Some("node-7"));
        assert_eq!(get(container, "cluster").as_deref(), Some("eu"));
        assert_eq!(
            get(container, "container_id"),
            None,
            "converted labels go once"
        );
        // The two processes' samples of one stack are one sample.
        let samples = &request.resource_profiles[0].scope_profiles[0].profiles[0].samples;
        assert_eq!(samples.len(), 1);
        assert_eq!(samples[0].values, [4]);

        let recorded = attributes(2);
        assert_eq!(get(recorded, "process.pid").as_deref(), Some("42"));
        assert_eq!(
            get(recorded, "process.executable.name").as_deref(),
            Some("work")
        );
        assert_eq!(
            get(recorded, "service.name").as_deref(),
            Some("unknown_service:work")
        );
        assert_eq!(get(recorded, "host.name").as_deref(), Some("fallback-host"));
        // pid is an integer.
        let pid = recorded.iter().find(|a| a.key == "process.pid").unwrap();
        assert!(matches!(
            pid.value.as_ref().unwrap().value,
            Some(any_value::Value::IntValue(42))
        ));

        let unit = attributes(1);
        assert_eq!(get(unit, "service.name").as_deref(), Some("nginx.service"));
        assert_eq!(
            get(unit, "process.executable.path").as_deref(),
            Some("/usr/sbin/nginx")
        );
        assert_eq!(
            get(unit, "process.executable.name").as_deref(),
            Some("nginx")
        );
        assert_eq!(get(unit, "systemd_unit").as_deref(), Some("nginx.service"));
        assert_eq!(get(unit, "comm").as_deref(), Some("nginx"));
        assert_eq!(get(unit, "container.id"), None);
    }

    #[test]
    fn frames_carry_their_type_names_lines_and_build_ids() {
        let profile = window();
        let request = &window_requests(&profile, &options())[0];
        let d = request.dictionary.as_ref().unwrap();
        let text = |i: i32| d.string_table[i as usize].as_str();
        let attribute = |i: i32| {
            let a = &d.attribute_table[i as usize];
            let value = match a.value.as_ref().unwrap().value.as_ref().unwrap() {
                any_value::Value::StringValue(s) => s.clone(),
                other => panic!("{other:?}"),
            };
            (text(a.key_strindex).to_owned(), value)
        };
        // The nginx sample: vfs_read (kernel), leaf, main; leaf first.
        let nginx = &request.resource_profiles[1].scope_profiles[0].profiles[0].samples[0];
        assert_eq!(nginx.values, [7]);
        let stack = &d.stack_table[nginx.stack_index as usize];
        let frames: Vec<(String, String)> = stack
            .location_indices
            .iter()
            .map(|&l| {
                let location = &d.location_table[l as usize];
                let function = &d.function_table[location.lines[0].function_index as usize];
                let (key, kind) = attribute(location.attribute_indices[0]);
                assert_eq!(key, "profile.frame.type");
                (text(function.name_strindex).to_owned(), kind)
            })
            .collect();
        assert_eq!(
            frames,
            [
                ("vfs_read".into(), "kernel".into()),
                ("leaf".into(), "native".into()),
                ("main".into(), "native".into())
            ]
        );
        let leaf = &d.location_table[stack.location_indices[1] as usize];
        assert_eq!(leaf.address, 0x5100);
        let mapping = &d.mapping_table[leaf.mapping_index as usize];
        assert_eq!(text(mapping.filename_strindex), "/usr/bin/work");
        assert_eq!(
            (
                mapping.memory_start,
                mapping.memory_limit,
                mapping.file_offset
            ),
            (0x5000, 0x9000, 0x1000)
        );
        assert_eq!(
            attribute(mapping.attribute_indices[0]),
            ("process.executable.build_id.gnu".into(), "abcdef".into())
        );
        // The Python frame: its file, line and column, no mapping.
        let container = &request.resource_profiles[0].scope_profiles[0].profiles[0].samples[0];
        let top = &d.location_table
            [d.stack_table[container.stack_index as usize].location_indices[0] as usize];
        assert_eq!(top.mapping_index, 0);
        assert_eq!(attribute(top.attribute_indices[0]).1, "cpython");
        let function = &d.function_table[top.lines[0].function_index as usize];
        assert_eq!(text(function.filename_strindex), "/srv/app.py");
        assert_eq!((top.lines[0].line, top.lines[0].column), (12, 5));
        // `main` is shared by three stacks but described once.
        let mains = d
            .function_table
            .iter()
            .filter(|f| text(f.name_strindex) == "main")
            .count();
        assert_eq!(mains, 1);
    }

    #[test]
    fn unnamed_frames_go_as_addresses_and_build_ids() {
        // What `symbolize = "none"` stores: no lines, the mapping and its build id.
        let mut profile = sample_profile();
        for location in &mut profile.locations {
            if !location.kind.is_kernel() {
                location.lines.clear();
            }
        }
        let request = &window_requests(&profile, &options())[0];
        check_tables(request);
        let d = request.dictionary.as_ref().unwrap();
        assert_eq!(d.function_table.len(), 2, "only vfs_read is named");
        let user: Vec<_> = d.location_table[1..]
            .iter()
            .filter(|l| l.lines.is_empty())
            .collect();
        assert_eq!(user.len(), 3);
        for location in user {
            assert_ne!(location.address, 0);
            let mapping = &d.mapping_table[location.mapping_index as usize];
            assert_eq!(mapping.attribute_indices.len(), 1, "the build id");
        }
    }

    #[test]
    fn large_windows_split_into_requests_each_with_its_own_dictionary() {
        let mut profile = window();
        let tiny = ConvertOptions {
            max_bytes: 1,
            ..options()
        };
        let requests = window_requests(&profile, &tiny);
        assert_eq!(requests.len(), 3, "one series per request");
        for request in &requests {
            check_tables(request);
        }
        let total: i64 = requests
            .iter()
            .flat_map(|r| &r.resource_profiles)
            .flat_map(|r| &r.scope_profiles[0].profiles[0].samples)
            .flat_map(|s| &s.values)
            .sum();
        assert_eq!(total as u64, profile.total_samples());
        // The same window gives the same requests; another window other profile ids.
        assert_eq!(window_requests(&profile, &tiny), requests);
        profile.start += std::time::Duration::from_secs(10);
        let later = window_requests(&profile, &tiny);
        let id = |r: &[ExportProfilesServiceRequest]| {
            r[0].resource_profiles[0].scope_profiles[0].profiles[0]
                .profile_id
                .clone()
        };
        assert_ne!(id(&later), id(&requests));
        profile.samples.clear();
        assert!(window_requests(&profile, &options()).is_empty());
    }
}
