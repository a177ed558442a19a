//! The OTLP receiver of the fake remote (`fake_remote::Protocol::Otlp` over gRPC,
//! `Protocol::OtlpHttp` over HTTP/protobuf): decodes every `ExportProfilesServiceRequest` with
//! messages generated from the pinned upstream protos (`build.rs`), not the agent's code,
//! checks what a receiver relies on (every dictionary table starting with its zero element, no
//! index outside its table, a `service.name` on every resource), and turns each profile back
//! into a pprof for `go tool pprof` and the comparisons of the tests.

use std::collections::BTreeMap;

use anyhow::{ensure, Context, Result};
use prost::Message;

use crate::fake_remote::{gunzip, header, Received};

/// The generated messages, nested as their packages are (the generated code refers to its
/// imports by relative path).
#[allow(clippy::all, missing_docs, dead_code)]
pub mod proto {
    pub mod opentelemetry {
        pub mod proto {
            pub mod collector {
                pub mod profiles {
                    pub mod v1development {
                        include!(concat!(
                            env!("OUT_DIR"),
                            "/opentelemetry.proto.collector.profiles.v1development.rs"
                        ));
                    }
                }
            }
            pub mod profiles {
                pub mod v1development {
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/opentelemetry.proto.profiles.v1development.rs"
                    ));
                }
            }
            pub mod common {
                pub mod v1 {
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/opentelemetry.proto.common.v1.rs"
                    ));
                }
            }
            pub mod resource {
                pub mod v1 {
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/opentelemetry.proto.resource.v1.rs"
                    ));
                }
            }
        }
    }
}

use proto::opentelemetry::proto::{
    collector::profiles::v1development::{
        ExportProfilesPartialSuccess, ExportProfilesServiceRequest, ExportProfilesServiceResponse,
    },
    common::v1::{any_value::Value, KeyValue},
    profiles::v1development::{
        Function, KeyValueAndUnit, Link, Location, Mapping, Profile, ProfilesDictionary, Stack,
    },
};

pub const GRPC_PATH: &str =
    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";
pub const HTTP_PATH: &str = "/v1development/profiles";

/// A gRPC Export: one length-prefixed message, gzipped when its flag says so (and then
/// `grpc-encoding: gzip` must say which compression).
pub fn decode_grpc(parts: &hyper::http::request::Parts, body: &[u8]) -> Result<Vec<Received>> {
    ensure!(
        parts.uri.path() == GRPC_PATH,
        "{}: not ProfilesService/Export",
        parts.uri.path()
    );
    ensure!(
        header(parts, "content-type").starts_with("application/grpc"),
        "content-type {:?}",
        header(parts, "content-type")
    );
    ensure!(body.len() >= 5, "a gRPC body of {} bytes", body.len());
    let length = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    ensure!(
        body.len() == 5 + length,
        "gRPC frame length {length}, body {}",
        body.len()
    );
    let message = match body[0] {
        0 => body[5..].to_vec(),
        1 => {
            ensure!(
                header(parts, "grpc-encoding") == "gzip",
                "a compressed message with grpc-encoding {:?}",
                header(parts, "grpc-encoding")
            );
            gunzip(&body[5..])?
        }
        flag => anyhow::bail!("gRPC compressed flag {flag}"),
    };
    decode_export(&message)
}

/// An HTTP export: `POST /v1development/profiles`, protobuf, gzipped or not.
pub fn decode_http(parts: &hyper::http::request::Parts, body: &[u8]) -> Result<Vec<Received>> {
    ensure!(
        parts.method == hyper::Method::POST && parts.uri.path() == HTTP_PATH,
        "{} {}: not the OTLP profiles endpoint",
        parts.method,
        parts.uri.path()
    );
    ensure!(
        header(parts, "content-type") == "application/x-protobuf",
        "content-type {:?}",
        header(parts, "content-type")
    );
    let message = match header(parts, "content-encoding") {
        "gzip" => gunzip(body)?,
        "" => body.to_vec(),
        other => anyhow::bail!("content-encoding {other:?}"),
    };
    decode_export(&message)
}

/// Every profile of the request, as pprof, with its resource's attributes as labels.
pub fn decode_export(message: &[u8]) -> Result<Vec<Received>> {
    let request = ExportProfilesServiceRequest::decode(message)
        .context("decoding ExportProfilesServiceRequest")?;
    ensure!(
        !request.resource_profiles.is_empty(),
        "an export without profiles"
    );
    let dictionary = request.dictionary.context("an export without dictionary")?;
    check_dictionary(&dictionary)?;
    let mut received = Vec::new();
    for resource in &request.resource_profiles {
        let attributes = resource
            .resource
            .as_ref()
            .map(|r| attribute_map(&r.attributes))
            .transpose()?
            .unwrap_or_default();
        ensure!(
            attributes
                .get("service.name")
                .is_some_and(|s| !s.is_empty()),
            "no service.name in {attributes:?}"
        );
        ensure!(
            resource.scope_profiles.iter().all(|s| s.scope.is_some()),
            "a scope without its InstrumentationScope"
        );
        for profile in resource.scope_profiles.iter().flat_map(|s| &s.profiles) {
            check_profile(&dictionary, profile)?;
            ensure!(
                profile.profile_id.len() == 16,
                "profile_id of {} bytes",
                profile.profile_id.len()
            );
            received.push(Received {
                labels: attributes.clone(),
                id: profile
                    .profile_id
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect(),
                pprof: to_pprof(&dictionary, profile).encode_to_vec(),
                start_ns: profile.time_unix_nano as i64,
                accepted: true,
                answer: String::new(),
            });
        }
    }
    Ok(received)
}

/// Resource attributes as text (integers written out), refusing empty and repeated keys.
fn attribute_map(attributes: &[KeyValue]) -> Result<BTreeMap<String, String>> {
    let mut map = BTreeMap::new();
    for attribute in attributes {
        ensure!(!attribute.key.is_empty(), "an attribute without key");
        let value = match attribute.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(Value::StringValue(s)) => s.clone(),
            Some(Value::IntValue(i)) => i.to_string(),
            other => anyhow::bail!("attribute {}: value {other:?}", attribute.key),
        };
        ensure!(
            map.insert(attribute.key.clone(), value).is_none(),
            "attribute {} twice",
            attribute.key
        );
    }
    Ok(map)
}

/// What the protocol requires of the dictionary: the zero value first in every table, every
/// index inside its table.
fn check_dictionary(d: &ProfilesDictionary) -> Result<()> {
    ensure!(
        d.string_table.first().is_some_and(String::is_empty),
        "string_table[0] is not \"\""
    );
    ensure!(
        d.mapping_table.first() == Some(&Mapping::default()),
        "mapping_table[0] is not the zero mapping"
    );
    ensure!(
        d.location_table.first() == Some(&Location::default()),
        "location_table[0] is not the zero location"
    );
    ensure!(
        d.function_table.first() == Some(&Function::default()),
        "function_table[0] is not the zero function"
    );
    ensure!(
        d.link_table.first() == Some(&Link::default()),
        "link_table[0] is not the zero link"
    );
    ensure!(
        d.attribute_table.first() == Some(&KeyValueAndUnit::default()),
        "attribute_table[0] is not the zero attribute"
    );
    ensure!(
        d.stack_table.first() == Some(&Stack::default()),
        "stack_table[0] is not the empty stack"
    );
    let strings = d.string_table.len();
    let string = |what: &str, i: i32| -> Result<()> {
        ensure!(
            (0..strings as i32).contains(&i),
            "{what}: string {i} of {strings}"
        );
        Ok(())
    };
    let attribute = |what: &str, i: i32| -> Result<()> {
        ensure!(
            (1..d.attribute_table.len() as i32).contains(&i),
            "{what}: attribute {i} of {}",
            d.attribute_table.len()
        );
        Ok(())
    };
    for (i, m) in d.mapping_table.iter().enumerate().skip(1) {
        string(&format!("mapping {i}"), m.filename_strindex)?;
        for &a in &m.attribute_indices {
            attribute(&format!("mapping {i}"), a)?;
        }
    }
    for (i, f) in d.function_table.iter().enumerate().skip(1) {
        for s in [f.name_strindex, f.system_name_strindex, f.filename_strindex] {
            string(&format!("function {i}"), s)?;
        }
    }
    for (i, l) in d.location_table.iter().enumerate().skip(1) {
        ensure!(
            (0..d.mapping_table.len() as i32).contains(&l.mapping_index),
            "location {i}: mapping {} of {}",
            l.mapping_index,
            d.mapping_table.len()
        );
        for line in &l.lines {
            ensure!(
                (1..d.function_table.len() as i32).contains(&line.function_index),
                "location {i}: function {} of {}",
                line.function_index,
                d.function_table.len()
            );
        }
        for &a in &l.attribute_indices {
            attribute(&format!("location {i}"), a)?;
        }
        let types = frame_types(d, l);
        ensure!(
            types.len() == 1
                && ["native", "kernel", "cpython", "go", "jvm"].contains(&types[0].as_str()),
            "location {i}: profile.frame.type {types:?}"
        );
    }
    for (i, a) in d.attribute_table.iter().enumerate().skip(1) {
        string(&format!("attribute {i}"), a.key_strindex)?;
        string(&format!("attribute {i}"), a.unit_strindex)?;
    }
    for (i, s) in d.stack_table.iter().enumerate().skip(1) {
        for &l in &s.location_indices {
            ensure!(
                (1..d.location_table.len() as i32).contains(&l),
                "stack {i}: location {l} of {}",
                d.location_table.len()
            );
        }
    }
    Ok(())
}

fn check_profile(d: &ProfilesDictionary, profile: &Profile) -> Result<()> {
    let strings = d.string_table.len() as i32;
    for value_type in [&profile.sample_type, &profile.period_type] {
        let value_type = value_type.as_ref().context("a profile without its types")?;
        ensure!(
            (1..strings).contains(&value_type.type_strindex)
                && (1..strings).contains(&value_type.unit_strindex),
            "a value type outside the string table"
        );
    }
    ensure!(!profile.samples.is_empty(), "a profile without samples");
    for sample in &profile.samples {
        ensure!(
            (1..d.stack_table.len() as i32).contains(&sample.stack_index),
            "sample: stack {} of {}",
            sample.stack_index,
            d.stack_table.len()
        );
        ensure!(
            (0..d.link_table.len() as i32).contains(&sample.link_index),
            "sample: link {}",
            sample.link_index
        );
        ensure!(sample.values.len() == 1, "{} values", sample.values.len());
    }
    Ok(())
}

/// A frame's `profile.frame.type`, as the dictionary names it.
fn frame_types(d: &ProfilesDictionary, location: &Location) -> Vec<String> {
    location
        .attribute_indices
        .iter()
        .filter_map(|&a| d.attribute_table.get(a as usize))
        .filter(|a| d.string_table[a.key_strindex as usize] == "profile.frame.type")
        .filter_map(|a| match a.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some(s.clone()),
            _ => None,
        })
        .collect()
}

/// One OTLP profile as the pprof it stands for: the dictionary's tables become the pprof's
/// (index i is id i; the zero elements, "none" in OTLP, are left out), each sample its stack.
fn to_pprof(d: &ProfilesDictionary, profile: &Profile) -> scorch::pprof::Profile {
    use scorch::pprof as pb;
    let mut string_table = d.string_table.clone();
    let mut intern = |s: &str| -> i64 {
        match string_table.iter().position(|t| t == s) {
            Some(i) => i as i64,
            None => {
                string_table.push(s.to_owned());
                string_table.len() as i64 - 1
            }
        }
    };
    let value_type =
        |v: &Option<proto::opentelemetry::proto::profiles::v1development::ValueType>| {
            v.map(|v| pb::ValueType {
                r#type: i64::from(v.type_strindex),
                unit: i64::from(v.unit_strindex),
            })
        };
    let mapping = d
        .mapping_table
        .iter()
        .enumerate()
        .skip(1)
        .map(|(i, m)| {
            let build_id = m
                .attribute_indices
                .iter()
                .filter_map(|&a| d.attribute_table.get(a as usize))
                .find(|a| {
                    d.string_table[a.key_strindex as usize] == "process.executable.build_id.gnu"
                })
                .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
                    Value::StringValue(s) => Some(s.clone()),
                    _ => None,
                });
            pb::Mapping {
                id: i as u64,
                memory_start: m.memory_start,
                memory_limit: m.memory_limit,
                file_offset: m.file_offset,
                filename: i64::from(m.filename_strindex),
                build_id: build_id.map_or(0, |id| intern(&id)),
                ..Default::default()
            }
        })
        .collect();
    let location = d
        .location_table
        .iter()
        .enumerate()
        .skip(1)
        .map(|(i, l)| pb::Location {
            id: i as u64,
            mapping_id: l.mapping_index as u64,
            address: l.address,
            line: l
                .lines
                .iter()
                .map(|line| pb::Line {
                    function_id: line.function_index as u64,
                    line: line.line,
                    column: line.column,
                })
                .collect(),
            is_folded: false,
            // The kind as scorch's own pprof field says it (`FrameKind::code`).
            scorch_frame_kind: match frame_types(d, l).first().map(String::as_str) {
                Some("kernel") => 1,
                Some("cpython") => 2,
                Some("go") => 3,
                Some("jvm") => 4,
                _ => 0,
            },
        })
        .collect();
    let function = d
        .function_table
        .iter()
        .enumerate()
        .skip(1)
        .map(|(i, f)| pb::Function {
            id: i as u64,
            name: i64::from(f.name_strindex),
            system_name: i64::from(f.system_name_strindex),
            filename: i64::from(f.filename_strindex),
            start_line: f.start_line,
        })
        .collect();
    let sample = profile
        .samples
        .iter()
        .map(|s| pb::Sample {
            location_id: d.stack_table[s.stack_index as usize]
                .location_indices
                .iter()
                .map(|&l| l as u64)
                .collect(),
            value: s.values.clone(),
            label: Vec::new(),
        })
        .collect();
    pb::Profile {
        sample_type: value_type(&profile.sample_type).into_iter().collect(),
        sample,
        mapping,
        location,
        function,
        string_table,
        time_nanos: profile.time_unix_nano as i64,
        duration_nanos: profile.duration_nano as i64,
        period_type: value_type(&profile.period_type),
        period: profile.period,
        ..Default::default()
    }
}

/// The success answer's message: empty, or a partial success rejecting `rejected` profiles.
pub fn response(rejected: Option<i64>) -> ExportProfilesServiceResponse {
    ExportProfilesServiceResponse {
        partial_success: rejected.map(|rejected| ExportProfilesPartialSuccess {
            rejected_profiles: rejected,
            error_message: "fake: rejecting profiles on purpose".into(),
        }),
    }
}

/// `google.rpc.Status` and `google.rpc.RetryInfo` (googleapis google/rpc/status.proto,
/// error_details.proto), as a Collector puts them in `grpc-status-details-bin` when it asks
/// the client to wait.
#[derive(Clone, PartialEq, Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<RpcAny>,
}

#[derive(Clone, PartialEq, Message)]
struct RpcAny {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    retry_delay: Option<ProtoDuration>,
}

#[derive(Clone, PartialEq, Message)]
struct ProtoDuration {
    #[prost(int64, tag = "1")]
    seconds: i64,
    #[prost(int32, tag = "2")]
    nanos: i32,
}

/// `grpc-status-details-bin` (unpadded base64, as gRPC sends binary metadata) of an
/// UNAVAILABLE that asks for `seconds` of wait through RetryInfo.
pub fn retry_info_details(code: i32, message: &str, seconds: u64) -> String {
    use base64::Engine as _;
    let status = RpcStatus {
        code,
        message: message.to_owned(),
        details: vec![RpcAny {
            type_url: "type.googleapis.com/google.rpc.RetryInfo".into(),
            value: RetryInfo {
                retry_delay: Some(ProtoDuration {
                    seconds: seconds as i64,
                    nanos: 0,
                }),
            }
            .encode_to_vec(),
        }],
    };
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(status.encode_to_vec())
}

/// The body of an OTLP/HTTP error answer: a `google.rpc.Status`.
pub fn http_error_body(code: i32, message: &str) -> Vec<u8> {
    RpcStatus {
        code,
        message: message.to_owned(),
        details: Vec::new(),
    }
    .encode_to_vec()
}
