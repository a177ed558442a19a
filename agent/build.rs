//! Builds the two things the agent embeds: the BPF object (through aya-build, with the nightly
//! toolchain and bpf-linker that `cargo xtask setup` installs) and the protobuf types: pprof,
//! and the remote sinks' Pyroscope push and Parca gRPC APIs (through protox, so no system
//! `protoc` is needed; tonic's generator takes protox's descriptors for the gRPC clients).
use anyhow::{anyhow, Context as _};

fn main() -> anyhow::Result<()> {
    build_proto()?;
    build_remote_protos()?;
    build_ebpf()
}

fn build_proto() -> anyhow::Result<()> {
    let proto_dir = "../proto";
    println!("cargo:rerun-if-changed={proto_dir}/profile.proto");
    let descriptors = protox::compile([format!("{proto_dir}/profile.proto")], [proto_dir])
        .context("compiling proto/profile.proto")?;
    prost_build::Config::new()
        .compile_fds(descriptors)
        .context("generating Rust types for proto/profile.proto")?;
    Ok(())
}

/// The remote sinks' APIs (see proto/ for their upstreams): message types for Pyroscope's push
/// API, which scorch speaks as connect over HTTP/1.1, and tonic clients for Parca's services
/// and OTLP's `ProfilesService` (whose messages the OTLP/HTTP client sends as well).
fn build_remote_protos() -> anyhow::Result<()> {
    let proto_dir = "../proto";
    let files = [
        "push/v1/push.proto",
        "types/v1/types.proto",
        "parca/profilestore/v1alpha1/profilestore.proto",
        "parca/debuginfo/v1alpha1/debuginfo.proto",
        // opentelemetry-proto v1.11.0 (proto/opentelemetry/VERSION.md): the profiles signal.
        "opentelemetry/proto/collector/profiles/v1development/profiles_service.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={proto_dir}/{file}");
    }
    // Imported by the profiles service's files, so not listed above.
    for file in [
        "opentelemetry/proto/profiles/v1development/profiles.proto",
        "opentelemetry/proto/common/v1/common.proto",
        "opentelemetry/proto/resource/v1/resource.proto",
    ] {
        println!("cargo:rerun-if-changed={proto_dir}/{file}");
    }
    let descriptors = protox::compile(files, [proto_dir]).context("compiling the remote protos")?;
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(descriptors)
        .context("generating Rust types for the remote protos")?;
    Ok(())
}

fn build_ebpf() -> anyhow::Result<()> {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR not set")?;
    let ebpf_dir = std::path::Path::new(&manifest_dir).join("../agent-ebpf");
    let ebpf_dir = ebpf_dir
        .to_str()
        .ok_or_else(|| anyhow!("non-UTF-8 path {}", ebpf_dir.display()))?;
    // aya-build prints `rerun-if-changed` for the BPF crate's directory, so edits there rebuild
    // the embedded object. The types it shares with the agent live in agent-common, which it
    // does not watch: a change of a layout there (a stack's depth) must rebuild the object too,
    // or the agent creates maps the object's templates do not match.
    println!("cargo:rerun-if-changed={manifest_dir}/../agent-common");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "scorch-ebpf",
            root_dir: ebpf_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
    .context("building the BPF program (is the toolchain set up? run `cargo xtask setup`)")
}
