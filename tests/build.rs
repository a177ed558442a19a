//! The OTLP receiver's messages (`src/fake_otlp.rs`), generated from the same pinned
//! opentelemetry-proto files as the agent's (`proto/opentelemetry/VERSION.md`), through protox
//! so no system `protoc` is needed. Messages only: the receiver frames gRPC by hand.
use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
    let proto_dir = "../proto";
    let files = [
        "opentelemetry/proto/collector/profiles/v1development/profiles_service.proto",
        "opentelemetry/proto/profiles/v1development/profiles.proto",
        "opentelemetry/proto/common/v1/common.proto",
        "opentelemetry/proto/resource/v1/resource.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={proto_dir}/{file}");
    }
    let descriptors =
        protox::compile(&files[..1], [proto_dir]).context("compiling the OTLP protos")?;
    prost_build::Config::new()
        .compile_fds(descriptors)
        .context("generating Rust types for the OTLP protos")?;
    Ok(())
}
