//! Emits `bpf_target_arch` (aya-build passes it when building the object; this sets it for
//! host builds and lints) and rebuilds the BPF object when bpf-linker changes, since the linker
//! is part of what makes it.
fn main() {
    if let Err(err) = aya_build::emit_bpf_target_arch_cfg() {
        println!("cargo:warning=cannot set bpf_target_arch: {err}");
    }
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(err) => println!("cargo:warning=bpf-linker not found ({err}); run `cargo xtask setup`"),
    }
}
