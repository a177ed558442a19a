//! `cargo xtask package` (the .deb) and the packaging checks `cargo xtask test` runs: the
//! systemd unit (`systemd-analyze verify`, and `security` at most [`MAX_EXPOSURE`]), the
//! Kubernetes manifests (`kubernetes-validate`), and the .deb's life cycle (install with dpkg,
//! run from it, remove and purge without leaving a file).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, ensure, Context, Result};

use crate::{run_command, setup};

/// `systemd-analyze security` rates 0 (locked down) to 10 (unprotected); up to 6.0 is MEDIUM.
const MAX_EXPOSURE: f64 = 6.0;

/// The Kubernetes release the manifests are validated against (kubernetes-validate bundles
/// its schemas; this is the newest it has).
pub const KUBERNETES_VERSION: &str = "1.37.0";

const UNIT: &str = "packaging/systemd/scorch.service";

/// What `cargo xtask build` ships for copying to other machines: the release binary without
/// its debug info (most of its size is line tables), and that debug info beside it, found
/// again through `.gnu_debuglink` so scorch still names its own frames when it profiles
/// itself. The .deb does the same with `/usr/lib/debug/.build-id/`.
pub struct Dist {
    pub binary: PathBuf,
    pub debug: PathBuf,
}

/// Writes `target/dist/scorch` and `target/dist/scorch.debug` from the release binary.
pub fn dist(root: &Path, scorch: &Path) -> Result<Dist> {
    dist_for(root, scorch, None)
}

/// [`dist`] of a binary cross-built for `target` (in `target/dist/TRIPLE/`, with the
/// target's objcopy), or of this machine's (`None`).
pub fn dist_for(root: &Path, scorch: &Path, target: Option<&crate::cross::Target>) -> Result<Dist> {
    let (dir, objcopy) = match target {
        Some(target) => (
            root.join("target/dist").join(target.triple),
            target.tool("objcopy"),
        ),
        None => (root.join("target/dist"), "objcopy".to_owned()),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let binary = dir.join("scorch");
    let debug = dir.join("scorch.debug");
    // The debug link records the debug file's name and CRC; objcopy reads both from the file
    // named here, so it is written first, and the link is a plain name that resolves next to
    // the binary wherever the pair is copied.
    run_command(
        Command::new(&objcopy)
            .args(["--only-keep-debug", "--compress-debug-sections=zlib"])
            .arg(scorch)
            .arg(&debug),
    )?;
    run_command(
        Command::new(&objcopy)
            .arg("--strip-debug")
            .arg(format!("--add-gnu-debuglink={}", debug.display()))
            .arg(scorch)
            .arg(&binary),
    )?;
    let size = |path: &Path| -> Result<u64> {
        Ok(std::fs::metadata(path)
            .with_context(|| format!("reading {}", path.display()))?
            .len())
    };
    println!(
        "dist: {} ({:.1} MB) and {} ({:.1} MB), from {} ({:.1} MB)",
        binary.display(),
        size(&binary)? as f64 / 1e6,
        debug.display(),
        size(&debug)? as f64 / 1e6,
        scorch.display(),
        size(scorch)? as f64 / 1e6
    );
    Ok(Dist { binary, debug })
}

/// The shipped pair works: the stripped binary runs, keeps its symbol table, links to its
/// debug file by name, and that file holds the DWARF the binary lost.
pub fn check_dist(dist: &Dist) -> Result<()> {
    let version = Command::new(&dist.binary)
        .arg("--version")
        .output()
        .with_context(|| format!("running {}", dist.binary.display()))?;
    ensure!(
        version.status.success(),
        "{} --version: {}",
        dist.binary.display(),
        version.status
    );
    let sections = |path: &Path| -> Result<String> {
        let output = Command::new("readelf")
            .args(["--wide", "--section-headers"])
            .arg(path)
            .output()
            .with_context(|| format!("readelf {}", path.display()))?;
        ensure!(output.status.success(), "readelf {}", path.display());
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    };
    let binary = sections(&dist.binary)?;
    ensure!(
        binary.contains(".gnu_debuglink") && binary.contains(".symtab"),
        "{}: no debug link or symbol table",
        dist.binary.display()
    );
    ensure!(
        !binary.contains(".debug_info") && !binary.contains(".debug_line"),
        "{}: still carries DWARF",
        dist.binary.display()
    );
    ensure!(
        sections(&dist.debug)?.contains(".debug_line"),
        "{}: no line tables",
        dist.debug.display()
    );
    let link = Command::new("readelf")
        .args(["--string-dump=.gnu_debuglink"])
        .arg(&dist.binary)
        .output()
        .context("readelf --string-dump")?;
    ensure!(
        String::from_utf8_lossy(&link.stdout).contains("scorch.debug"),
        "{}: the debug link does not name scorch.debug",
        dist.binary.display()
    );
    Ok(())
}

/// Builds `target/debian/scorch_<version>_<arch>.deb` from the release binary `scorch`:
/// man pages and completions first (the binary writes them from its own CLI definition).
pub fn package(root: &Path, scorch: &Path) -> Result<PathBuf> {
    package_for(root, scorch, None, None)
}

/// As [`package`], for `target`'s cross build when given (cargo-deb reads it from
/// `TARGET_DIR/TRIPLE/release/`, `target_dir` the cross build's target directory when not
/// the clone's): `scorch`, a binary this machine runs, writes the man pages and completions,
/// which are the same for every architecture.
pub fn package_for(
    root: &Path,
    scorch: &Path,
    target: Option<&crate::cross::Target>,
    target_dir: Option<&Path>,
) -> Result<PathBuf> {
    // cargo-deb reads assets under `target/release/` (`target/TRIPLE/release/` for a cross
    // build) from the real target directory.
    let dir = target_dir.map_or_else(|| root.join("target"), Path::to_path_buf);
    let release = match target {
        Some(target) => dir.join(target.triple).join("release"),
        None => dir.join("release"),
    };
    let assets = release.join("package-assets");
    let _ = std::fs::remove_dir_all(&assets);
    let man = assets.join("man");
    run_command(Command::new(scorch).arg("man").arg(&man))?;
    for page in std::fs::read_dir(&man).with_context(|| format!("listing {}", man.display()))? {
        // -n: no name or time stamp inside, so the same sources give the same package.
        run_command(Command::new("gzip").args(["-9nf"]).arg(page?.path()))?;
    }
    let completions = assets.join("completions");
    std::fs::create_dir_all(&completions)
        .with_context(|| format!("creating {}", completions.display()))?;
    for (shell, file) in [
        ("bash", "scorch.bash"),
        ("zsh", "_scorch"),
        ("fish", "scorch.fish"),
    ] {
        let output = Command::new(scorch)
            .args(["completions", shell])
            .output()
            .with_context(|| format!("running {} completions {shell}", scorch.display()))?;
        ensure!(
            output.status.success() && !output.stdout.is_empty(),
            "scorch completions {shell} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let path = completions.join(file);
        std::fs::write(&path, &output.stdout)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let mut command = Command::new("cargo");
    command
        .current_dir(root)
        .args(["deb", "--package", "scorch", "--no-build"]);
    if let Some(target) = target {
        command.args(["--target", target.triple]);
    }
    if let Some(dir) = target_dir {
        command.env("CARGO_TARGET_DIR", dir);
    }
    let output = command
        .output()
        .context("running cargo deb (cargo xtask setup installs it)")?;
    ensure!(
        output.status.success(),
        "cargo deb failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let deb = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    ensure!(
        deb.extension().is_some_and(|e| e == "deb") && deb.is_file(),
        "cargo deb printed no package path: {}",
        deb.display()
    );
    eprintln!("xtask: built {}", deb.display());
    Ok(deb)
}

/// A cross build's .deb: of the target's Debian architecture, its `/usr/bin/scorch` the
/// binary built for it (the same bytes, less what cargo-deb moved to the debug file, so
/// compared by ELF machine and build id).
pub fn check_foreign_deb(deb: &Path, scorch: &Path, target: &crate::cross::Target) -> Result<()> {
    let field = |name: &str| -> Result<String> {
        let output = Command::new("dpkg-deb")
            .arg("-f")
            .arg(deb)
            .arg(name)
            .output()
            .context("running dpkg-deb")?;
        ensure!(output.status.success(), "dpkg-deb -f {}", deb.display());
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    };
    let architecture = field("Architecture")?;
    ensure!(
        architecture == target.debian,
        "{} is for {architecture}, not {}",
        deb.display(),
        target.debian
    );
    let dir = deb.with_extension("unpacked");
    let _ = std::fs::remove_dir_all(&dir);
    run_command(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&dir))?;
    let header = |path: &Path| -> Result<String> {
        let output = Command::new(target.tool("readelf"))
            .args(["-h", "-n"])
            .arg(path)
            .output()
            .with_context(|| format!("running {}", target.tool("readelf")))?;
        ensure!(output.status.success(), "readelf {}", path.display());
        let text = String::from_utf8_lossy(&output.stdout);
        Ok(text
            .lines()
            .filter(|l| l.contains("Machine:") || l.contains("Build ID:"))
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect::<Vec<_>>()
            .join("; "))
    };
    let packaged = header(&dir.join("usr/bin/scorch"))?;
    let built = header(scorch)?;
    std::fs::remove_dir_all(&dir)?;
    ensure!(
        packaged == built && packaged.contains(target.elf_machine),
        "the .deb's /usr/bin/scorch ({packaged}) is not the {} build ({built})",
        target.triple
    );
    eprintln!(
        "xtask: {} holds the {} build ({packaged})",
        deb.display(),
        target.triple
    );
    Ok(())
}

/// `systemd-analyze verify` must print nothing, and the offline security rating must be at
/// most [`MAX_EXPOSURE`]. The unit names /usr/bin/scorch, which is only there once the package
/// is installed, so the copy checked here names the binary just built.
pub fn check_unit(root: &Path, scorch: &Path) -> Result<()> {
    let unit = std::fs::read_to_string(root.join(UNIT)).context("reading the unit")?;
    let dir = root.join("target/unit-check");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let copy = dir.join("scorch.service");
    let scorch = scorch.to_str().context("the scorch path is not UTF-8")?;
    std::fs::write(&copy, unit.replace("/usr/bin/scorch", scorch))
        .with_context(|| format!("writing {}", copy.display()))?;
    verify_unit(&copy)?;
    let exposure = unit_exposure(&copy)?;
    eprintln!("xtask: {UNIT}: systemd-analyze verify clean, exposure {exposure:.1}");
    Ok(())
}

fn verify_unit(unit: &Path) -> Result<()> {
    // --man=no: the man pages the unit names exist once the .deb is installed, not here.
    let output = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(unit)
        .output()
        .context("running systemd-analyze (Debian package systemd)")?;
    let complaints = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    ensure!(
        output.status.success() && complaints.trim().is_empty(),
        "systemd-analyze verify {}:\n{complaints}",
        unit.display()
    );
    Ok(())
}

fn unit_exposure(unit: &Path) -> Result<f64> {
    let output = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--no-pager"])
        .arg(unit)
        .output()
        .context("running systemd-analyze security")?;
    let text = String::from_utf8_lossy(&output.stdout);
    // "→ Overall exposure level for scorch.service: 2.4 OK 🙂"
    let exposure = text
        .lines()
        .find_map(|l| l.split_once("Overall exposure level for "))
        .and_then(|(_, rest)| rest.split_once(": "))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|figure| figure.parse::<f64>().ok())
        .with_context(|| format!("no exposure figure in:\n{text}"))?;
    ensure!(
        exposure <= MAX_EXPOSURE,
        "{} exposure {exposure} is above {MAX_EXPOSURE}:\n{text}",
        unit.display()
    );
    Ok(exposure)
}

/// Every manifest under packaging/kubernetes/ against the schemas of [`KUBERNETES_VERSION`],
/// strictly (an unknown field is an error, not silently ignored by the API server).
pub fn validate_manifests(root: &Path) -> Result<()> {
    let dir = root.join("packaging/kubernetes");
    let mut manifests: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    manifests.sort();
    ensure!(!manifests.is_empty(), "no manifests in {}", dir.display());
    let output = Command::new(setup::kubernetes_validate())
        .args(["--strict", "--kubernetes-version", KUBERNETES_VERSION])
        .args(&manifests)
        .output()
        .context("running kubernetes-validate (cargo xtask setup installs it)")?;
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    ensure!(
        output.status.success() && !report.contains("ERROR") && !report.contains("WARN"),
        "kubernetes-validate:\n{report}"
    );
    eprintln!(
        "xtask: {} manifests valid for Kubernetes {KUBERNETES_VERSION}",
        manifests.len()
    );
    Ok(())
}

/// Installs the .deb, runs scorch from it, then removes and purges it, checking each step
/// leaves exactly what it should. Refuses to touch a scorch package installed by someone else.
pub fn test_deb(deb: &Path) -> Result<()> {
    if package_status().is_some() {
        bail!(
            "a scorch package is already installed; the .deb test installs and purges its own, \
             so remove that one first: dpkg --purge scorch"
        );
    }
    let result = install_run_remove(deb);
    // A failed step must not leave the package on the machine.
    if result.is_err() && package_status().is_some() {
        let _ = Command::new("dpkg").args(["--purge", "scorch"]).status();
    }
    result
}

fn install_run_remove(deb: &Path) -> Result<()> {
    run_command(Command::new("dpkg").arg("--install").arg(deb))?;
    let files = package_files()?;
    for wanted in [
        "/usr/bin/scorch",
        "/usr/lib/systemd/system/scorch.service",
        "/etc/scorch/config.toml",
        "/usr/share/man/man1/scorch.1.gz",
        "/usr/share/man/man1/scorch-run.1.gz",
        "/usr/share/bash-completion/completions/scorch",
        "/usr/share/zsh/vendor-completions/_scorch",
        "/usr/share/fish/vendor_completions.d/scorch.fish",
    ] {
        ensure!(
            Path::new(wanted).is_file() && files.iter().any(|f| f == Path::new(wanted)),
            "{wanted} is not installed by the package"
        );
    }
    let conffiles = Command::new("dpkg-query")
        .args(["--showformat=${Conffiles}", "--show", "scorch"])
        .output()
        .context("running dpkg-query")?;
    ensure!(
        String::from_utf8_lossy(&conffiles.stdout).contains("/etc/scorch/config.toml"),
        "/etc/scorch/config.toml is not a conffile"
    );

    let version = Command::new("/usr/bin/scorch")
        .arg("--version")
        .output()
        .context("running the installed scorch")?;
    let version = String::from_utf8_lossy(&version.stdout);
    ensure!(
        version.starts_with("scorch ") && version.contains(env!("CARGO_PKG_VERSION")),
        "scorch --version printed {version:?}"
    );
    let check = Command::new("/usr/bin/scorch")
        .arg("check")
        .output()
        .context("running the installed scorch check")?;
    let report = String::from_utf8_lossy(&check.stdout);
    ensure!(
        check.status.success() && report.contains("BPF program loads"),
        "the installed scorch check failed:\n{report}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    // The unit as installed, where its ExecStart= and man pages exist.
    verify_unit(Path::new("/usr/lib/systemd/system/scorch.service"))?;
    // Removal keeps only the conffile; purge keeps nothing.
    run_command(Command::new("dpkg").args(["--remove", "scorch"]))?;
    let left: Vec<&PathBuf> = files
        .iter()
        .filter(|f| f.is_file() && *f != Path::new("/etc/scorch/config.toml"))
        .collect();
    ensure!(left.is_empty(), "dpkg --remove left {left:?}");
    ensure!(
        Path::new("/etc/scorch/config.toml").is_file(),
        "dpkg --remove deleted the conffile"
    );
    // A store as the service leaves it (StateDirectory= with DynamicUser=), for purge to take.
    let private = Path::new("/var/lib/private");
    let made_private = !private.exists();
    let store = private.join("scorch");
    let link = Path::new("/var/lib/scorch");
    let fake_store = !store.exists() && link.symlink_metadata().is_err();
    if fake_store {
        std::fs::create_dir_all(&store).context("creating /var/lib/private/scorch")?;
        std::fs::write(store.join("scorch.db"), b"").context("writing a store file")?;
        std::os::unix::fs::symlink("private/scorch", link).context("linking /var/lib/scorch")?;
    }
    // What `record` keeps (inflated sections, this boot's kernel symbols), for purge to take
    // too: made here when missing, so the check below can fail on a machine that never ran
    // `record`.
    const KEPT: [&str; 2] = ["/var/cache/scorch", "/run/scorch"];
    for kept in KEPT {
        let kept = Path::new(kept);
        std::fs::create_dir_all(kept).with_context(|| format!("creating {}", kept.display()))?;
        std::fs::write(kept.join("kept-by-record"), b"")
            .with_context(|| format!("writing into {}", kept.display()))?;
    }
    run_command(Command::new("dpkg").args(["--purge", "scorch"]))?;
    if made_private {
        let _ = std::fs::remove_dir(private);
    }
    ensure!(
        !fake_store || (store.symlink_metadata().is_err() && link.symlink_metadata().is_err()),
        "dpkg --purge left the store in /var/lib/scorch"
    );
    ensure!(
        package_status().is_none(),
        "dpkg still knows scorch after --purge"
    );
    for kept in KEPT {
        ensure!(
            Path::new(kept).symlink_metadata().is_err(),
            "dpkg --purge left what record keeps in {kept}"
        );
    }
    let left: Vec<&PathBuf> = files
        .iter()
        .filter(|f| f.symlink_metadata().is_ok() && !is_shared_directory(f))
        .collect();
    ensure!(left.is_empty(), "dpkg --purge left {left:?}");
    eprintln!(
        "xtask: the .deb installs {} paths, runs, and purges cleanly",
        files.len()
    );
    Ok(())
}

/// Directories other packages own too (/usr, /usr/share/man/man1, ...), which dpkg rightly
/// keeps: every one the package lists that still exists must hold something not ours.
fn is_shared_directory(path: &Path) -> bool {
    path.is_dir()
        && std::fs::read_dir(path)
            .map(|mut entries| entries.next().is_some())
            .unwrap_or(false)
}

/// `dpkg-query`'s status of scorch, when it is installed (or half-installed).
fn package_status() -> Option<String> {
    let output = Command::new("dpkg-query")
        .args(["--showformat=${Status}", "--show", "scorch"])
        .output()
        .ok()?;
    let status = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    (output.status.success() && !status.is_empty() && !status.contains("not-installed"))
        .then_some(status)
}

/// Every path the installed package owns, as `dpkg -L` lists them.
fn package_files() -> Result<Vec<PathBuf>> {
    let output = Command::new("dpkg")
        .args(["--listfiles", "scorch"])
        .output()
        .context("running dpkg --listfiles")?;
    ensure!(output.status.success(), "dpkg --listfiles scorch failed");
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| l.starts_with('/') && *l != "/.")
        .map(PathBuf::from)
        .collect())
}
