//! `cargo xtask build --target TRIPLE`: scorch for another architecture than this machine's.
//! aya-build compiles the BPF program for the target's `bpf_target_arch` by itself; what this
//! adds is the target's Rust standard library (rustup) and a C cross toolchain (Debian's), for
//! the linker and the C the agent's dependencies build (SQLite, ring).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::{run_command, setup};

/// A target scorch cross-builds for.
#[derive(Debug)]
pub struct Target {
    /// Rust's name for it.
    pub triple: &'static str,
    /// The prefix of Debian's cross tools for it (`aarch64-linux-gnu-gcc`, `-objcopy`).
    prefix: &'static str,
    /// The Debian package of its C cross compiler (binutils come with it).
    package: &'static str,
    /// Debian's name for the architecture (a .deb's `Architecture`).
    pub debian: &'static str,
    /// How readelf names its ELF machine.
    pub elf_machine: &'static str,
}

const TARGETS: &[Target] = &[Target {
    triple: "aarch64-unknown-linux-gnu",
    prefix: "aarch64-linux-gnu-",
    package: "gcc-aarch64-linux-gnu",
    debian: "arm64",
    elf_machine: "AArch64",
}];

impl Target {
    /// The target named `triple`, when scorch cross-builds for it.
    pub fn named(triple: &str) -> Result<&'static Target> {
        TARGETS
            .iter()
            .find(|t| t.triple == triple)
            .with_context(|| {
                let known: Vec<&str> = TARGETS.iter().map(|t| t.triple).collect();
                format!(
                    "scorch does not cross-build for {triple:?}: the targets are {}",
                    known.join(", ")
                )
            })
    }

    /// The cross tool `tool` (`gcc`, `objcopy`) for this target.
    pub fn tool(&self, tool: &str) -> String {
        format!("{}{tool}", self.prefix)
    }
}

/// The target's standard library and C toolchain, installed when missing.
pub fn ensure(target: &Target) -> Result<()> {
    setup::ensure_packages(&[target.package])?;
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("running rustup (is rustup installed?)")?;
    if String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|line| line.trim() == target.triple)
    {
        return Ok(());
    }
    let added = Command::new("rustup")
        .args(["target", "add", target.triple])
        .status()
        .context("running rustup target add")?;
    if !added.success() {
        bail!(
            "`rustup target add {}` failed ({added}): the target's standard library could not be \
             installed",
            target.triple
        );
    }
    Ok(())
}

/// Builds scorch for `target`; returns the binary, where cargo puts it.
pub fn build(root: &Path, target: &Target) -> Result<PathBuf> {
    build_in(root, target, None)
}

/// As [`build`], into `target_dir` when given (a directory kept outside a clone, so a fresh
/// clone's build recompiles only what changed), else cargo's own.
pub fn build_in(root: &Path, target: &Target, target_dir: Option<&Path>) -> Result<PathBuf> {
    setup::ensure_bpf_toolchain()?;
    ensure(target)?;
    let env_triple = target.triple.replace('-', "_");
    let gcc = target.tool("gcc");
    let mut command = Command::new("cargo");
    if let Some(dir) = target_dir {
        command.env("CARGO_TARGET_DIR", dir);
    }
    run_command(
        command
            .current_dir(root)
            .args(["build", "--release", "--package", "scorch", "--target"])
            .arg(target.triple)
            .env(
                format!("CARGO_TARGET_{}_LINKER", env_triple.to_uppercase()),
                &gcc,
            )
            .env(format!("CC_{env_triple}"), &gcc)
            .env(format!("AR_{env_triple}"), target.tool("ar")),
    )?;
    let dir = match target_dir {
        Some(dir) => dir.to_owned(),
        None => std::env::var_os("CARGO_TARGET_DIR")
            .filter(|dir| !dir.is_empty())
            .map_or_else(|| root.join("target"), |dir| root.join(dir)),
    };
    Ok(dir.join(target.triple).join("release/scorch"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_known_by_name() {
        let arm64 = Target::named("aarch64-unknown-linux-gnu").unwrap();
        assert_eq!(arm64.tool("objcopy"), "aarch64-linux-gnu-objcopy");
        let err = Target::named("riscv64gc-unknown-linux-gnu").unwrap_err();
        assert!(
            err.to_string().contains("aarch64-unknown-linux-gnu"),
            "{err}"
        );
    }
}
