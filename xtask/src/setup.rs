//! `cargo xtask setup`: the nightly `rust-src`, bpf-linker built against the nightly rustc's
//! own LLVM, the Debian packages the tests and benchmarks use, and the Debian arm64 binaries
//! the agent's unit tests read. Every step checks first and does nothing when already done.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::run_command;

/// bpf-linker release that builds with this machine's toolchains (newer ones need Rust 1.98).
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Debian packages: gcc builds the test workloads, golang-go provides `go tool pprof` (the
/// reference pprof reader), nodejs runs the JavaScript workload, linux-perf is the peer profiler, bpftrace the second peer, time
/// gives `/usr/bin/time -v` for the benchmark's RSS figures, util-linux has setpriv and
/// unshare, chromium runs headless for the UI test, systemd has `systemd-analyze` for the unit
/// checks (it need not be running), python3-venv holds kubernetes-validate, python3-pip
/// fetches py-spy's wheel (the Python tests' reference) and python3.11 is the interpreter they
/// profile, debootstrap builds the Debian 13 and unstable roots their python3.13, 3.14 and
/// 3.15 run in, liblzma-dev links
/// the unwinder's test against Debian's liblzma (built without frame pointers),
/// qemu-system-x86 boots the kernel matrix (`vm-test`) whose initramfs holds busybox-static's
/// busybox, xz-utils unpacks the kernels' compressed modules, libc6-dbg is libc's debug info
/// (the overhead bench's `scorch record` names libc frames from it, as on a host that has it
/// installed), heaptrack profiles the daemon's heap (`cargo xtask bench --only heap`),
/// openjdk-17-jdk-headless is the JVM whose layout tables the HotSpot readers' tests read,
/// libc6-arm64-cross is the arm64 glibc whose code the arm64 readers' unit tests read,
/// binutils-aarch64-linux-gnu the objdump they compare its PLT's names with, and
/// gcc-aarch64-linux-gnu and libc6-dev-arm64-cross the compiler and headers of the arm64
/// programs they read (and of the arm64 build); skopeo and umoci
/// read the container image back (`cargo xtask image --check`).
const PACKAGES: &[&str] = &[
    "gcc",
    "g++",
    "golang-go",
    "nodejs",
    "linux-perf",
    "bpftrace",
    "time",
    "util-linux",
    "chromium",
    "systemd",
    "python3",
    "python3-venv",
    "python3-pip",
    "debootstrap",
    "liblzma-dev",
    "qemu-system-x86",
    "busybox-static",
    "xz-utils",
    "libc6-dbg",
    "heaptrack",
    "openjdk-17-jdk-headless",
    "libc6-arm64-cross",
    "binutils-aarch64-linux-gnu",
    "gcc-aarch64-linux-gnu",
    "libc6-dev-arm64-cross",
    "skopeo",
    "umoci",
];

/// Where Debian 12's arm64 packages the agent's unit tests read are unpacked, one directory
/// each (the agent's `arch::aarch64::test_file` names the same paths): outside the clone, so
/// a machine fetches them once.
pub const ARM64_DEBS: &str = "/var/cache/scorch-tests/debian/bookworm-arm64";

/// The arm64 CPython 3.11 of Debian 12: the interpreter (`python3.11-minimal`, libpython
/// linked in) and the shared libpython (`libpython3.11`, which reaches `_PyRuntime` through
/// its GOT), read by the arm64 CPython readers' tests; and what the interpreter needs to run
/// in `cargo xtask vm-test --arch arm64`'s guests: its standard library's core
/// (`libpython3.11-minimal`) and the libraries it links beyond glibc.
pub const ARM64_PACKAGES: &[&str] = &[
    "python3.11-minimal",
    "libpython3.11",
    "libpython3.11-minimal",
    "zlib1g",
    "libexpat1",
];

/// cargo-deb release for `cargo xtask package`; it builds with Rust 1.85 and later.
const CARGO_DEB_VERSION: &str = "3.8.0";

/// kubernetes-validate release for the manifest checks; it bundles the schemas of every
/// Kubernetes release up to its own number, so it works offline.
const KUBERNETES_VALIDATE_VERSION: &str = "1.37.0";

pub fn setup() -> Result<()> {
    install_packages()?;
    ensure_arm64_packages()?;
    ensure_libnode_packages()?;
    ensure_bpf_toolchain()?;
    ensure_cargo_deb()?;
    ensure_kubernetes_validate()
}

fn ensure_cargo_deb() -> Result<()> {
    let installed = Command::new("cargo")
        .args(["deb", "--version"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .is_some_and(|o| String::from_utf8_lossy(&o.stdout).contains(CARGO_DEB_VERSION));
    if installed {
        return Ok(());
    }
    run_command(Command::new("cargo").args([
        "install",
        "cargo-deb",
        "--locked",
        "--force",
        "--version",
        CARGO_DEB_VERSION,
    ]))
}

/// A virtual environment of its own: Debian's python refuses `pip install` outside one.
fn tools_venv() -> PathBuf {
    cargo_home().join("scorch-venv")
}

/// The kubernetes-validate command `ensure_kubernetes_validate` installs.
pub fn kubernetes_validate() -> PathBuf {
    tools_venv().join("bin/kubernetes-validate")
}

fn ensure_kubernetes_validate() -> Result<()> {
    let installed = Command::new(kubernetes_validate())
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .is_some_and(|o| {
            String::from_utf8_lossy(&o.stdout).contains(KUBERNETES_VALIDATE_VERSION)
                || String::from_utf8_lossy(&o.stderr).contains(KUBERNETES_VALIDATE_VERSION)
        });
    if installed {
        return Ok(());
    }
    let venv = tools_venv();
    if !venv.join("bin/pip").exists() {
        run_command(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    }
    run_command(
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet"])
            .arg(format!(
                "kubernetes-validate=={KUBERNETES_VALIDATE_VERSION}"
            )),
    )
}

/// The pieces the BPF build needs: nightly with rust-src, and bpf-linker.
pub fn ensure_bpf_toolchain() -> Result<()> {
    ensure_rust_src()?;
    ensure_bpf_linker()
}

fn install_packages() -> Result<()> {
    ensure_packages(PACKAGES)
}

/// Installs those of `packages` not installed yet, with apt-get (through sudo when not root).
pub fn ensure_packages(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| {
            !Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
                .unwrap_or(false)
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: installing Debian packages: {}", missing.join(" "));
    let sudo = !is_root();
    let apt = |args: &[&str]| {
        let mut command = if sudo {
            Command::new("sudo")
        } else {
            Command::new("apt-get")
        };
        if sudo {
            command.arg("apt-get");
        }
        command.env("DEBIAN_FRONTEND", "noninteractive").args(args);
        command
    };
    run_command(&mut apt(&["update", "-q"]))?;
    let mut install = apt(&["install", "-y", "-q", "--no-install-recommends"]);
    install.args(&missing);
    run_command(&mut install)
}

/// Downloads and unpacks (never installs) [`ARM64_PACKAGES`], through apt lists of their own
/// for arm64, so the host needs no `dpkg --add-architecture`.
pub fn ensure_arm64_packages() -> Result<()> {
    ensure_debian_packages("arm64", Path::new(ARM64_DEBS), ARM64_PACKAGES)
}

/// Where Debian 12's amd64 CPython 3.11 is unpacked for `cargo xtask vm-test`'s x86-64 guests
/// and host row: the same interpreter on any host distribution.
pub const AMD64_DEBS: &str = "/var/cache/scorch-tests/debian/bookworm-amd64";

/// The x86-64 guests' CPython 3.11, as [`ARM64_PACKAGES`] gives arm64's.
const AMD64_PACKAGES: &[&str] = &[
    "python3.11-minimal",
    "libpython3.11-minimal",
    "zlib1g",
    "libexpat1",
];

/// Downloads and unpacks [`AMD64_PACKAGES`] under [`AMD64_DEBS`].
pub fn ensure_amd64_packages() -> Result<()> {
    ensure_debian_packages("amd64", Path::new(AMD64_DEBS), AMD64_PACKAGES)
}

/// Downloads Debian 12's `packages` for `arch` and unpacks each under `dir`, once.
fn ensure_debian_packages(arch: &str, dir: &Path, packages: &[&str]) -> Result<()> {
    ensure_suite_packages("bookworm", arch, dir, packages)
}

/// Where Debian's builds of libnode are unpacked, one directory per suite and package
/// (`bookworm/libnode108/usr/lib/x86_64-linux-gnu/libnode.so.108`): the V8 readers' unit
/// tests read their constants (`agent/src/runtimes/v8/tests.rs` names the same paths).
pub const LIBNODE_DEBS: &str = "/var/cache/scorch-tests/debian/libnode";

/// Node 18 (V8 10.2), 20 (11.3) and 24 (13.6), as Debian 12, 13 and unstable ship them.
const LIBNODE_PACKAGES: &[(&str, &str)] = &[
    ("bookworm", "libnode108"),
    ("trixie", "libnode115"),
    ("sid", "libnode137"),
];

/// Downloads and unpacks [`LIBNODE_PACKAGES`] under [`LIBNODE_DEBS`], once.
pub fn ensure_libnode_packages() -> Result<()> {
    for (suite, package) in LIBNODE_PACKAGES {
        let dir = Path::new(LIBNODE_DEBS).join(suite);
        ensure_suite_packages(suite, "amd64", &dir, &[package])?;
    }
    Ok(())
}

/// Downloads `suite`'s `packages` for `arch` and unpacks each under `dir`, once.
fn ensure_suite_packages(suite: &str, arch: &str, dir: &Path, packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| !dir.join(p).join(".complete").exists())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!(
        "xtask: fetching Debian {suite}'s {arch} {}",
        missing.join(" ")
    );
    let apt = dir.join("apt");
    for sub in ["lists/partial", "archives/partial", "cache", "download"] {
        let sub = apt.join(sub);
        std::fs::create_dir_all(&sub).with_context(|| format!("creating {}", sub.display()))?;
    }
    let sources = apt.join("sources.list");
    std::fs::write(
        &sources,
        format!(
            "deb [arch={arch} signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
             http://deb.debian.org/debian {suite} main\n"
        ),
    )
    .with_context(|| format!("writing {}", sources.display()))?;
    let options = [
        format!("-oDir::Etc::SourceList={}", sources.display()),
        "-oDir::Etc::SourceParts=/dev/null".to_owned(),
        format!("-oDir::State::Lists={}", apt.join("lists").display()),
        format!("-oDir::Cache::Archives={}", apt.join("archives").display()),
        format!("-oDir::Cache={}", apt.join("cache").display()),
        format!("-oAPT::Architecture={arch}"),
        format!("-oAPT::Architectures::={arch}"),
        // trixie's and sid's Release files here are past their Valid-Until date.
        "-oAcquire::Check-Valid-Until=false".to_owned(),
        // The directories belong to root; apt's sandbox user could not write them.
        "-oAPT::Sandbox::User=root".to_owned(),
    ];
    run_command(
        Command::new("apt-get")
            .args(&options)
            .args(["update", "-q"]),
    )?;
    let download = apt.join("download");
    for package in missing {
        run_command(
            Command::new("apt-get")
                .current_dir(&download)
                .args(&options)
                .args(["download", "-q", package]),
        )?;
        let prefix = format!("{package}_");
        let suffix = format!("_{arch}.deb");
        let deb = std::fs::read_dir(&download)
            .with_context(|| format!("listing {}", download.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(&suffix))
            })
            .with_context(|| format!("no {package} .deb in {}", download.display()))?;
        let root = dir.join(package);
        let _ = std::fs::remove_dir_all(&root);
        run_command(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
        std::fs::write(root.join(".complete"), deb.display().to_string())
            .with_context(|| format!("marking {} complete", root.display()))?;
    }
    Ok(())
}

fn ensure_rust_src() -> Result<()> {
    let installed = Command::new("rustup")
        .args(["component", "list", "--installed", "--toolchain", "nightly"])
        .output()
        .context("running rustup (is rustup installed?)")?;
    if !installed.status.success() {
        bail!(
            "the nightly toolchain is missing ({}); install it with `rustup toolchain install nightly`",
            String::from_utf8_lossy(&installed.stderr).trim()
        );
    }
    if String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|l| l.starts_with("rust-src"))
    {
        return Ok(());
    }
    run_command(Command::new("rustup").args([
        "component",
        "add",
        "rust-src",
        "--toolchain",
        "nightly",
    ]))
}

fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"))
}

fn ensure_bpf_linker() -> Result<()> {
    let installed = Command::new("bpf-linker")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(BPF_LINKER_VERSION))
        .unwrap_or(false);
    if installed {
        return Ok(());
    }
    // bpf-linker must link against the LLVM inside the nightly rustc, so the bitcode rustc
    // emits is bitcode it understands. Its build finds LLVM through LLVM_PREFIX/lib; the
    // prefix must outlive the build because the binary keeps it as its runpath.
    let llvm = nightly_llvm()?;
    let major = llvm_major(&llvm)?;
    let prefix = cargo_home().join("scorch-bpf-llvm");
    let lib = prefix.join("lib");
    std::fs::create_dir_all(&lib).with_context(|| format!("creating {}", lib.display()))?;
    let file_name = llvm.file_name().context("LLVM library has no file name")?;
    for link in [lib.join("libLLVM.so"), lib.join(file_name)] {
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&llvm, &link)
            .with_context(|| format!("linking {} to {}", link.display(), llvm.display()))?;
    }
    eprintln!(
        "xtask: building bpf-linker {BPF_LINKER_VERSION} against {}",
        llvm.display()
    );
    run_command(
        Command::new("cargo")
            .env("LLVM_PREFIX", &prefix)
            .args([
                "install",
                "bpf-linker",
                "--locked",
                "--force",
                "--version",
                BPF_LINKER_VERSION,
            ])
            .args([
                "--no-default-features",
                "--features",
                &format!("llvm-{major}"),
            ]),
    )
}

/// The nightly toolchain's libLLVM (`cargo xtask setup` installs the toolchain): what
/// bpf-linker links against, and the largest library `cargo xtask bench --only scale` profiles.
pub fn nightly_llvm() -> Result<PathBuf> {
    let sysroot = Command::new("rustc")
        .args(["+nightly", "--print", "sysroot"])
        .output()
        .context("asking the nightly rustc for its sysroot")?;
    if !sysroot.status.success() {
        bail!(
            "`rustc +nightly --print sysroot` failed ({}): install the nightly toolchain with \
             `cargo xtask setup`",
            String::from_utf8_lossy(&sysroot.stderr).trim()
        );
    }
    let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
    find_rust_llvm(&sysroot.join("lib"))
}

/// The nightly's `libLLVM.so.<ver>-rust-<ver>-nightly`.
fn find_rust_llvm(lib_dir: &Path) -> Result<PathBuf> {
    let entries =
        std::fs::read_dir(lib_dir).with_context(|| format!("listing {}", lib_dir.display()))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("libLLVM.so.") && name.contains("-rust-") {
            return Ok(entry.path());
        }
    }
    bail!(
        "no libLLVM.so.*-rust-* in {}: is the nightly toolchain complete?",
        lib_dir.display()
    )
}

/// `libLLVM.so.22.1-rust-1.97.0-nightly` -> 22.
fn llvm_major(library: &Path) -> Result<u32> {
    let name = library
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    name.strip_prefix("libLLVM.so.")
        .and_then(|rest| rest.split('.').next())
        .and_then(|major| major.parse().ok())
        .with_context(|| format!("cannot read the LLVM version from {name}"))
}

fn is_root() -> bool {
    crate::effective_uid() == 0
}
