//! `cargo xtask image`: scorch's container image for x86-64 and arm64, one OCI image index
//! with a manifest per platform, written as an OCI image layout (target/image/) without a
//! container engine. `skopeo copy --all oci:target/image:VERSION docker://REGISTRY/scorch:VERSION`
//! pushes both platforms under one tag, which is what a DaemonSet on a mixed fleet pulls.
//!
//! Each platform is one layer: the release binary, the libraries it was linked against (taken
//! from the toolchain that linked it: this machine's for x86-64, the cross sysroot for arm64),
//! CA certificates for a remote sink over TLS, the configuration packaging/Dockerfile ships,
//! and the copyright files of what is redistributed. No shell, no package manager. The layer
//! is byte-for-byte reproducible: sorted entries, owner root, mtime 0, so the same builds give
//! the same digests.
//!
//! `cargo xtask vm-test` boots this same file set (binary stripped) under every kernel of the
//! matrix, and [`check`] reads the layout back with skopeo and umoci, then runs the host's
//! platform from its unpacked root filesystem.

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::{machine::Machine, run_command};

/// Where the binary is in the image, and its entry point.
pub const BINARY: &str = "usr/bin/scorch";

/// What the container runs without arguments: the daemon on the shipped configuration, as
/// packaging/kubernetes/daemonset.yaml's `args` do.
const COMMAND: &[&str] = &["run", "--config", "/etc/scorch/config.toml"];

/// The port `scorch run` serves its UI, API and /metrics on in the shipped configuration.
const PORT: &str = "7071/tcp";

/// The copyright files of the Debian packages whose files the image redistributes (glibc's
/// libraries, libgcc's, the CA bundle), from this machine's documentation.
const COPYRIGHTS: &[&str] = &["libc6", "libgcc-s1", "ca-certificates"];

const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const INDEX: &str = "application/vnd.oci.image.index.v1+json";
const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// One path of the image's root filesystem.
pub struct Entry {
    /// Relative to `/`.
    pub path: String,
    pub mode: u32,
    pub content: Content,
}

pub enum Content {
    Directory,
    File(PathBuf),
    Bytes(Vec<u8>),
}

impl Entry {
    fn directory(path: &str, mode: u32) -> Self {
        Entry {
            path: path.to_owned(),
            mode,
            content: Content::Directory,
        }
    }

    fn file(path: &str, mode: u32, file: PathBuf) -> Self {
        Entry {
            path: path.to_owned(),
            mode,
            content: Content::File(file),
        }
    }

    /// The entry's bytes (none for a directory).
    pub fn bytes(&self) -> Result<Vec<u8>> {
        match &self.content {
            Content::Directory => Ok(Vec::new()),
            Content::Bytes(bytes) => Ok(bytes.clone()),
            Content::File(file) => {
                std::fs::read(file).with_context(|| format!("reading {}", file.display()))
            }
        }
    }
}

/// The image's root filesystem for `scorch`, built for `machine`, sorted by path.
pub fn root_filesystem(root: &Path, scorch: &Path, machine: &Machine) -> Result<Vec<Entry>> {
    let mut entries = vec![
        Entry::directory("etc", 0o755),
        Entry::directory("etc/scorch", 0o755),
        Entry::directory("etc/ssl", 0o755),
        Entry::directory("etc/ssl/certs", 0o755),
        // `scorch record`'s output and temporary files; the DaemonSet mounts its own.
        Entry::directory("tmp", 0o1777),
        Entry::directory("usr", 0o755),
        Entry::directory("usr/bin", 0o755),
        Entry::directory("usr/share", 0o755),
        Entry::directory("usr/share/doc", 0o755),
        // The store of the shipped configuration (a hostPath volume on Kubernetes).
        Entry::directory("var", 0o755),
        Entry::directory("var/lib", 0o755),
        Entry::directory("var/lib/scorch", 0o755),
        Entry::file(BINARY, 0o755, scorch.to_owned()),
        Entry::file(
            "etc/scorch/config.toml",
            0o644,
            root.join("packaging/scorch.toml"),
        ),
        Entry::file(
            "etc/ssl/certs/ca-certificates.crt",
            0o644,
            PathBuf::from("/etc/ssl/certs/ca-certificates.crt"),
        ),
        // getpwuid(0) answers, for the libraries that ask who they run as.
        Entry {
            path: "etc/passwd".into(),
            mode: 0o644,
            content: Content::Bytes(b"root:x:0:0:root:/root:/usr/sbin/nologin\n".to_vec()),
        },
        Entry {
            path: "etc/group".into(),
            mode: 0o644,
            content: Content::Bytes(b"root:x:0:\n".to_vec()),
        },
    ];
    for package in COPYRIGHTS {
        let file = Path::new("/usr/share/doc").join(package).join("copyright");
        ensure!(
            file.exists(),
            "{} is missing: the image redistributes {package}'s files and needs its licence",
            file.display()
        );
        entries.push(Entry::directory(&format!("usr/share/doc/{package}"), 0o755));
        entries.push(Entry::file(
            &format!("usr/share/doc/{package}/copyright"),
            0o644,
            file,
        ));
    }
    for (inside, library) in libraries(scorch, machine)? {
        let mut prefix = String::new();
        for part in Path::new(&inside).parent().into_iter().flat_map(Path::iter) {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(&part.to_string_lossy());
            if !entries.iter().any(|e| e.path == prefix) {
                entries.push(Entry::directory(&prefix, 0o755));
            }
        }
        entries.push(Entry::file(&inside, 0o755, library));
    }
    for entry in &entries {
        if let Content::File(file) = &entry.content {
            ensure!(file.exists(), "{} is missing", file.display());
        }
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(entries)
}

/// The shared libraries `binary` loads and its program interpreter, as (path in the image,
/// file here). This machine's build is asked with ldd; a cross build's come from its
/// toolchain's sysroot (ldd cannot run it), where Debian's loader finds them in
/// `/lib/TRIPLE/`.
fn libraries(binary: &Path, machine: &Machine) -> Result<Vec<(String, PathBuf)>> {
    if !machine.foreign {
        let output = Command::new("ldd").arg(binary).output()?;
        ensure!(output.status.success(), "ldd {}", binary.display());
        return Ok(String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| {
                // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` or `/lib64/ld-linux... (0x...)`
                let path = line.split("=>").last()?.split_whitespace().next()?;
                path.starts_with('/')
                    .then(|| (path.trim_start_matches('/').to_owned(), PathBuf::from(path)))
            })
            .collect());
    }
    let readelf = |flag: &str| -> Result<String> {
        let output = Command::new(machine.tool("readelf"))
            .arg(flag)
            .arg(binary)
            .output()
            .with_context(|| format!("running {}", machine.tool("readelf")))?;
        ensure!(
            output.status.success(),
            "readelf {flag} {}",
            binary.display()
        );
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    };
    let lib = Path::new(machine.sysroot).join("lib");
    let mut libraries = Vec::new();
    for line in readelf("-d")?.lines() {
        // ` 0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]`
        let Some(name) = line
            .contains("(NEEDED)")
            .then(|| line.split('[').nth(1)?.split(']').next())
            .flatten()
        else {
            continue;
        };
        let file = lib.join(name);
        ensure!(
            file.exists(),
            "{} needs {name}, not in {}",
            binary.display(),
            lib.display()
        );
        libraries.push((format!("lib/{}/{name}", machine.multiarch), file));
    }
    let interpreter = readelf("-l")?
        .lines()
        .find_map(|line| {
            // `      [Requesting program interpreter: /lib/ld-linux-aarch64.so.1]`
            let path = line.split("interpreter: ").nth(1)?.trim_end_matches(']');
            Some(path.to_owned())
        })
        .context("the binary names no program interpreter")?;
    let name = interpreter.rsplit('/').next().unwrap_or(&interpreter);
    libraries.push((
        interpreter.trim_start_matches('/').to_owned(),
        lib.join(name),
    ));
    Ok(libraries)
}

/// The tag the image index carries in the layout: the workspace's version.
pub fn tag() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// Writes the OCI image layout `out` (emptied first) holding one image index, tagged
/// [`tag`], with a manifest for each `(machine, binary)` of `builds`.
pub fn build(root: &Path, builds: &[(&Machine, &Path)], out: &Path) -> Result<()> {
    if out.exists() {
        std::fs::remove_dir_all(out).with_context(|| format!("emptying {}", out.display()))?;
    }
    let blobs = out.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).with_context(|| format!("creating {}", blobs.display()))?;
    let mut manifests = Vec::new();
    for (machine, scorch) in builds {
        let entries = root_filesystem(root, scorch, machine)?;
        let tar = layer(&entries)?;
        let diff_id = digest(&tar);
        let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gzip.write_all(&tar)?;
        let layer = write_blob(&blobs, &gzip.finish()?, LAYER)?;
        let config = json!({
            "architecture": machine.debian,
            "os": "linux",
            "config": {
                "Entrypoint": [format!("/{BINARY}")],
                "Cmd": COMMAND,
                "Env": ["PATH=/usr/bin"],
                "ExposedPorts": { PORT: {} },
                "Labels": labels(),
            },
            "rootfs": { "type": "layers", "diff_ids": [diff_id] },
            "history": [{ "created_by": "cargo xtask image" }],
        });
        let config = write_blob(&blobs, &serde_json::to_vec(&config)?, CONFIG)?;
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": config,
            "layers": [layer],
            "annotations": labels(),
        });
        let mut manifest = write_blob(&blobs, &serde_json::to_vec(&manifest)?, MANIFEST)?;
        manifest["platform"] = json!({ "architecture": machine.debian, "os": "linux" });
        manifests.push(manifest);
    }
    let index = json!({
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": manifests,
        "annotations": labels(),
    });
    let mut index = write_blob(&blobs, &serde_json::to_vec(&index)?, INDEX)?;
    index["annotations"] = json!({ "org.opencontainers.image.ref.name": tag() });
    let layout = json!({ "schemaVersion": 2, "mediaType": INDEX, "manifests": [index] });
    std::fs::write(out.join("index.json"), serde_json::to_vec(&layout)?)?;
    std::fs::write(out.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    Ok(())
}

/// The OCI annotations the image, its manifests and its configurations carry.
fn labels() -> Value {
    json!({
        "org.opencontainers.image.title": "scorch",
        "org.opencontainers.image.description": "scorch, a system-wide continuous profiler for Linux",
        "org.opencontainers.image.version": tag(),
        "org.opencontainers.image.licenses": "Apache-2.0 OR MIT",
    })
}

/// The uncompressed tar of `entries`, reproducible: owner root, mtime 0, in their order.
fn layer(entries: &[Entry]) -> Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    for entry in entries {
        let bytes = entry.bytes()?;
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(match entry.content {
            Content::Directory => tar::EntryType::Directory,
            _ => tar::EntryType::Regular,
        });
        header.set_mode(entry.mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_size(bytes.len() as u64);
        let path = match entry.content {
            Content::Directory => format!("{}/", entry.path),
            _ => entry.path.clone(),
        };
        tar.append_data(&mut header, &path, bytes.as_slice())
            .with_context(|| format!("adding {path} to the layer"))?;
    }
    Ok(tar.into_inner()?)
}

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// Stores `bytes` under its digest and returns its descriptor.
fn write_blob(blobs: &Path, bytes: &[u8], media_type: &str) -> Result<Value> {
    let digest = digest(bytes);
    let file = blobs.join(digest.trim_start_matches("sha256:"));
    std::fs::write(&file, bytes).with_context(|| format!("writing {}", file.display()))?;
    Ok(json!({ "mediaType": media_type, "digest": digest, "size": bytes.len() }))
}

/// Reads the layout `layout` back with the OCI tools (skopeo verifies every blob's digest
/// as it copies; umoci unpacks a platform's root filesystem and runtime configuration), and
/// checks that each of `builds` is there: its platform, its binary byte for byte, its
/// libraries, its entry point. Then runs this machine's platform from the unpacked root
/// filesystem, as a container would: `scorch check`, and a recording of a known call tree.
pub fn check(root: &Path, layout: &Path, builds: &[(&Machine, &Path)]) -> Result<()> {
    let reference = format!("oci:{}:{}", layout.display(), tag());
    let raw = output(Command::new("skopeo").args(["inspect", "--raw", &reference]))?;
    let index: Value = serde_json::from_str(&raw)
        .with_context(|| format!("skopeo's index of {reference} is not JSON"))?;
    let platforms: Vec<&str> = index["manifests"]
        .as_array()
        .context("the image index lists no manifests")?
        .iter()
        .filter_map(|m| m["platform"]["architecture"].as_str())
        .collect();
    let work = layout.with_file_name("image-check");
    if work.exists() {
        std::fs::remove_dir_all(&work)?;
    }
    std::fs::create_dir_all(&work)?;
    for (machine, scorch) in builds {
        ensure!(
            platforms.contains(&machine.debian),
            "{reference} has no {} manifest (it has {platforms:?})",
            machine.debian
        );
        // One platform, copied out of the index: skopeo fails on any blob whose digest or
        // size differs from its descriptor.
        let single = work.join(machine.debian);
        run_command(Command::new("skopeo").args([
            "copy",
            "--quiet",
            "--override-arch",
            machine.debian,
            &reference,
            &format!("oci:{}:{}", single.display(), tag()),
        ]))?;
        let bundle = work.join(format!("{}-bundle", machine.debian));
        run_command(Command::new("umoci").args([
            "unpack",
            "--image",
            &format!("{}:{}", single.display(), tag()),
            &bundle.to_string_lossy(),
        ]))?;
        let rootfs = bundle.join("rootfs");
        let shipped = std::fs::read(rootfs.join(BINARY))
            .with_context(|| format!("the {} image has no /{BINARY}", machine.debian))?;
        ensure!(
            shipped == std::fs::read(scorch)?,
            "the {} image's /{BINARY} is not {}",
            machine.debian,
            scorch.display()
        );
        for (inside, _) in libraries(scorch, machine)? {
            ensure!(
                rootfs.join(&inside).is_file(),
                "the {} image lacks /{inside}, which scorch loads",
                machine.debian
            );
        }
        let runtime: Value = serde_json::from_slice(&std::fs::read(bundle.join("config.json"))?)?;
        let args: Vec<&str> = runtime["process"]["args"]
            .as_array()
            .context("umoci's runtime configuration has no process.args")?
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let mut expected = vec![format!("/{BINARY}")];
        expected.extend(COMMAND.iter().map(|a| a.to_string()));
        ensure!(
            args == expected,
            "the {} image runs {args:?}, not {expected:?}",
            machine.debian
        );
        if !machine.foreign {
            run_from(root, &rootfs, &work)?;
        }
        eprintln!(
            "xtask: image: {} platform read back, binary and libraries present",
            machine.debian
        );
    }
    std::fs::remove_dir_all(&work)?;
    Ok(())
}

/// Runs the binary of the unpacked `rootfs` in it, with this machine's /proc and /sys (as the
/// DaemonSet's hostPID pod sees them): `scorch check`, then a recording of the known call tree
/// (tests/workloads/calltree.c, run outside), which must name its leaves under `main`.
fn run_from(root: &Path, rootfs: &Path, work: &Path) -> Result<()> {
    for mount_point in ["proc", "sys"] {
        std::fs::create_dir_all(rootfs.join(mount_point))?;
    }
    let contained = |args: &[&str]| -> Result<()> {
        // A mount namespace of its own: the bind mounts go when the command ends.
        let script = format!(
            "mount --rbind /proc {root}/proc && mount --rbind /sys {root}/sys && exec chroot {root} /{BINARY} {args}",
            root = rootfs.display(),
            args = args.join(" "),
        );
        run_command(Command::new("unshare").args(["--mount", "--fork", "sh", "-c", &script]))
    };
    contained(&["check"])?;
    let workload = work.join("calltree");
    let workloads = root.join("tests/workloads");
    run_command(
        Command::new("gcc")
            .args(["-O2", "-fno-omit-frame-pointer", "-g", "-pthread", "-I"])
            .arg(&workloads)
            .arg("-o")
            .arg(&workload)
            .arg(workloads.join("calltree.c")),
    )?;
    let mut child = Command::new(&workload)
        .args(["1", "60"])
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", workload.display()))?;
    std::thread::sleep(Duration::from_millis(200));
    let pid = child.id().to_string();
    let recorded = contained(&[
        "record",
        "--pid",
        &pid,
        "--frequency",
        "199",
        "--duration",
        "3s",
        "--output",
        "/tmp/calltree.folded",
    ]);
    let _ = child.kill();
    let _ = child.wait();
    recorded?;
    let folded = std::fs::read_to_string(rootfs.join("tmp/calltree.folded"))
        .context("the recording made in the image wrote no /tmp/calltree.folded")?;
    for leaf in ["leaf_a", "leaf_b", "leaf_c"] {
        if !folded
            .lines()
            .any(|line| line.contains(";main;") && line.contains(leaf))
        {
            bail!(
                "the recording made in the image has no stack of main reaching {leaf}:\n{folded}"
            );
        }
    }
    Ok(())
}

fn output(command: &mut Command) -> Result<String> {
    let output = command
        .output()
        .with_context(|| format!("starting {command:?}"))?;
    ensure!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same files give the same layer, whatever their times on disk: digests are the
    /// image's identity, and a rebuild must not change them.
    #[test]
    fn layers_are_reproducible() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("xtask-image-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let file = dir.join("f");
        std::fs::write(&file, b"contents")?;
        let entries = |file: &Path| {
            vec![
                Entry::directory("etc", 0o755),
                Entry::file("etc/f", 0o644, file.to_owned()),
            ]
        };
        let first = layer(&entries(&file))?;
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(&file, b"contents")?;
        let second = layer(&entries(&file))?;
        std::fs::remove_dir_all(&dir)?;
        assert_eq!(digest(&first), digest(&second));
        let mut archive = tar::Archive::new(first.as_slice());
        let paths: Vec<(String, u64, u32)> = archive
            .entries()?
            .map(|e| {
                let e = e?;
                Ok((
                    e.path()?.to_string_lossy().into_owned(),
                    e.header().mtime()?,
                    e.header().mode()?,
                ))
            })
            .collect::<Result<_>>()?;
        assert_eq!(
            paths,
            vec![("etc/".into(), 0, 0o755), ("etc/f".into(), 0, 0o644)]
        );
        Ok(())
    }
}
