//! Packages from other Debian suites (trixie, sid), fetched through the same mirror as the
//! host's and unpacked, cached outside the clone so a CI run pays for them once per machine.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{ensure, Context, Result};

use crate::run_tool;

/// Where fetched packages are kept between runs.
pub const CACHE: &str = "/var/cache/scorch-tests/debian";

/// The mirror the host's own apt sources use.
const MIRROR: &str = "http://deb.debian.org/debian";

/// apt options that keep `suite`'s package lists and downloads in `dir`, apart from the
/// host's own.
fn apt_options(dir: &Path) -> Vec<String> {
    vec![
        format!(
            "-oDir::Etc::SourceList={}",
            dir.join("sources.list").display()
        ),
        "-oDir::Etc::SourceParts=/dev/null".to_owned(),
        format!("-oDir::State::Lists={}", dir.join("lists").display()),
        format!("-oDir::Cache::Archives={}", dir.join("archives").display()),
        format!("-oDir::Cache={}", dir.join("cache").display()),
        // The download directory belongs to root; apt's sandbox user could not write it.
        "-oAPT::Sandbox::User=root".to_owned(),
    ]
}

/// `package` from `suite`, unpacked (not installed: no maintainer scripts run) into a
/// directory of its own, which is returned.
pub fn unpacked_package(suite: &str, package: &str) -> Result<PathBuf> {
    let dir = Path::new(CACHE).join(suite);
    let root = dir.join("unpacked").join(package);
    if root.join(".complete").exists() {
        return Ok(root);
    }
    for sub in ["lists/partial", "archives/partial", "cache", "download"] {
        std::fs::create_dir_all(dir.join(sub))?;
    }
    std::fs::write(
        dir.join("sources.list"),
        format!(
            "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {MIRROR} {suite} main\n"
        ),
    )?;
    let options = apt_options(&dir);
    run_tool(Command::new("apt-get").args(&options).arg("update"))
        .with_context(|| format!("apt-get update for {suite}"))?;
    let download = dir.join("download");
    run_tool(
        Command::new("apt-get")
            .current_dir(&download)
            .args(&options)
            .args(["download", package]),
    )
    .with_context(|| format!("apt-get download {package} from {suite}"))?;
    let deb = std::fs::read_dir(&download)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{package}_")) && n.ends_with(".deb"))
        })
        .with_context(|| format!("no {package} .deb in {}", download.display()))?;
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root)?;
    run_tool(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
    std::fs::write(root.join(".complete"), deb.display().to_string())?;
    ensure!(root.is_dir(), "{} was not unpacked", deb.display());
    Ok(root)
}

/// Where root filesystems are kept between runs.
pub const ROOTS: &str = "/var/cache/scorch-tests/roots";

/// A minimal root filesystem of `suite` with `packages` installed (debootstrap's `minbase`,
/// about a minute from the mirror), built once per machine and kept: programs of that
/// release run in it with `chroot`, as in a container, and scorch reaches their files through
/// `/proc/PID/root`.
pub fn root_filesystem(suite: &str, packages: &[&str]) -> Result<PathBuf> {
    let name = format!("{suite}-{}", packages.join("-"));
    let root = Path::new(ROOTS).join(&name);
    if root.join(".scorch-complete").exists() {
        return Ok(root);
    }
    std::fs::create_dir_all(ROOTS)?;
    // Built aside and renamed, so a run cut short never leaves a half root that looks whole.
    let building = Path::new(ROOTS).join(format!("{name}.building"));
    let _ = std::fs::remove_dir_all(&building);
    run_tool(
        Command::new("debootstrap")
            .args([
                "--variant=minbase",
                &format!("--include={}", packages.join(",")),
            ])
            .arg(suite)
            .arg(&building)
            .arg(MIRROR),
    )
    .with_context(|| format!("debootstrap {suite} with {packages:?}"))?;
    std::fs::write(building.join(".scorch-complete"), packages.join("\n"))?;
    let _ = std::fs::remove_dir_all(&root);
    std::fs::rename(&building, &root)?;
    Ok(root)
}

/// py-spy, the reference Python profiler: its static binary from its PyPI wheel, cached.
pub fn py_spy() -> Result<PathBuf> {
    const VERSION: &str = "0.4.3";
    let dir = Path::new("/var/cache/scorch-tests/py-spy").join(VERSION);
    let binary = dir.join("py-spy");
    if binary.exists() {
        return Ok(binary);
    }
    std::fs::create_dir_all(&dir)?;
    run_tool(
        Command::new("/usr/bin/python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--platform",
                "manylinux_2_5_x86_64",
                &format!("py-spy=={VERSION}"),
                "-d",
            ])
            .arg(&dir),
    )
    .context("downloading py-spy's wheel from PyPI")?;
    let wheel = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .context("no py-spy wheel downloaded")?;
    // A wheel is a zip; the binary is its only script.
    let unpacked = dir.join("wheel");
    run_tool(
        Command::new("/usr/bin/python3")
            .args(["-m", "zipfile", "-e"])
            .arg(&wheel)
            .arg(&unpacked),
    )?;
    let script = unpacked.join(format!("py_spy-{VERSION}.data/scripts/py-spy"));
    ensure!(script.exists(), "{} has no py-spy binary", wheel.display());
    std::fs::copy(&script, &binary)?;
    run_tool(Command::new("chmod").arg("755").arg(&binary))?;
    Ok(binary)
}
