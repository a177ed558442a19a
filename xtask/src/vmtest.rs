//! `cargo xtask vm-test`: the same scorch build, booted under Debian's kernels in qemu (TCG),
//! and on the host kernel, through the same checks (vmtest/checks.sh), judged here. With
//! `--arch arm64` ([`crate::machine::ARM64`]), Debian's arm64 kernels under
//! `qemu-system-aarch64`, with scorch and the workloads cross-built.
//!
//! Each kernel comes from Debian's archive through apt (`apt-cache` picks the newest build of
//! the asked version, `apt-get download` fetches it); only vmlinuz, its config and the few
//! modules the initramfs needs are kept under target/vm-test/kernels/. The initramfs is an
//! uncompressed cpio written here: the container image's files (scorch stripped, the
//! libraries it loads; [`crate::image::root_filesystem`]), busybox, the static workloads,
//! and vmtest/init.sh as PID 1. Results come back as a tar stream over a virtio-serial port,
//! never scraped from the console.

mod cpio;
mod report;

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};

use crate::image;
use crate::machine::{Machine, X86_64};
use crate::run_command;
use report::Row;

/// The kernels `cargo xtask test` boots: Debian 12's own (6.1) and the one Debian 13 ships,
/// which bookworm-security also carries as `6.12.*+deb12`.
pub const DEFAULT_KERNELS: &[&str] = &["6.1", "6.12"];

/// A VM that has not powered off by then has hung. A run takes well under two minutes even
/// with the host's two cores shared; this leaves room for a loaded machine.
const VM_TIMEOUT: Duration = Duration::from_secs(420);

/// Modules the guest needs for the results port, loaded when the kernel does not build them
/// in; their dependencies come first, read from each module's `depends=`.
const GUEST_MODULES: &[&str] = &["virtio_pci", "virtio_console"];

/// The test programs (name, source in tests/workloads/, gcc flags), built static (the
/// initramfs has no compiler, and only scorch's own libraries). Static and non-PIE also covers
/// the `/proc/PID/maps` padding that made `scorch check` and map_files lookups miss such
/// binaries. `calltree_nofp` is the same call tree without frame pointers: only the BPF
/// program's `.eh_frame` unwinder can find its callers.
const WORKLOADS: &[(&str, &str, &[&str])] = &[
    (
        "calltree",
        "calltree.c",
        &["-O2", "-fno-omit-frame-pointer", "-g", "-pthread"],
    ),
    (
        "calltree_nofp",
        "calltree.c",
        &["-O2", "-fomit-frame-pointer", "-g", "-pthread"],
    ),
    (
        "readzero",
        "readzero.c",
        &["-O2", "-fno-omit-frame-pointer", "-g"],
    ),
    ("blocker", "blocker.c", &["-O2", "-g", "-pthread"]),
];

const INIT: &str = include_str!("vmtest/init.sh");
const CHECKS: &str = include_str!("vmtest/checks.sh");

/// Runs the checks on the host (when `host`) and under each kernel, writes
/// target/vm-test/report.md, and fails when any check failed.
pub fn vm_test(
    root: &Path,
    scorch: &Path,
    kernels: &[String],
    host: bool,
    machine: &Machine,
) -> Result<()> {
    let dir = if machine.foreign {
        root.join("target/vm-test").join(machine.debian)
    } else {
        root.join("target/vm-test")
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("checks.sh"), CHECKS)?;
    crate::setup::ensure_packages(machine.packages)?;
    if machine.foreign {
        add_foreign_architecture(machine)?;
    }
    let workloads = build_workloads(root, &dir, machine)?;
    let mut rows = Vec::new();
    if host {
        ensure!(!machine.foreign, "the host is not {}", machine.debian);
        rows.push(run_host(&dir, scorch, &workloads)?);
    }
    if !kernels.is_empty() {
        let base = base_initramfs(root, &dir, scorch, &workloads, machine)?;
        for spec in kernels {
            let started = Instant::now();
            let row = match run_kernel(&dir, &base, spec, machine) {
                Ok(row) => row,
                Err(err) => Row::failed(spec, format!("{err:#}")),
            };
            eprintln!(
                "xtask: vm-test {spec}: {} in {:.0?}",
                row.summary(),
                started.elapsed()
            );
            rows.push(row);
        }
    }
    let table = report::table(&rows);
    println!("{table}");
    std::fs::write(dir.join("report.md"), &table)?;
    let failed: Vec<&str> = rows
        .iter()
        .filter(|r| r.failed_any())
        .map(|r| r.label.as_str())
        .collect();
    ensure!(
        failed.is_empty(),
        "vm-test failed on {} (outputs under {})",
        failed.join(", "),
        dir.display()
    );
    Ok(())
}

/// Lets apt fetch `machine`'s packages (`dpkg --add-architecture`), once.
fn add_foreign_architecture(machine: &Machine) -> Result<()> {
    let foreign = Command::new("dpkg")
        .arg("--print-foreign-architectures")
        .output()
        .context("running dpkg")?;
    if String::from_utf8_lossy(&foreign.stdout)
        .lines()
        .any(|a| a.trim() == machine.debian)
    {
        return Ok(());
    }
    run_command(Command::new("dpkg").args(["--add-architecture", machine.debian]))?;
    run_command(Command::new("apt-get").args(["update", "-q"]))
}

/// Compiles each workload with `machine`'s gcc, static, into its vm-test directory's
/// workloads/.
fn build_workloads(root: &Path, dir: &Path, machine: &Machine) -> Result<PathBuf> {
    let out = dir.join("workloads");
    std::fs::create_dir_all(&out)?;
    for (name, source, flags) in WORKLOADS {
        let source = root.join("tests/workloads").join(source);
        let frame_pointers = flags.contains(&"-fno-omit-frame-pointer");
        run_command(
            Command::new(machine.tool("gcc"))
                .args(*flags)
                .args(if frame_pointers {
                    machine.frame_pointer_flags
                } else {
                    machine.no_frame_pointer_flags
                })
                .arg("-static")
                .arg(&source)
                .arg("-o")
                .arg(out.join(name)),
        )?;
    }
    std::fs::copy(
        root.join("tests/workloads/calltree.py"),
        out.join("calltree.py"),
    )?;
    // The Go call tree, stripped as images ship it, static (no cgo) for the bare guest.
    let go_cache = root.join("target/vm-test/go-cache");
    run_command(
        Command::new("go")
            .current_dir(root.join("tests/workloads"))
            .env("GOARCH", machine.goarch)
            .env("CGO_ENABLED", "0")
            .env("GOCACHE", &go_cache)
            .env("GOFLAGS", "")
            .env("GOTOOLCHAIN", "local")
            .args(["build", "-ldflags=-s -w", "-o"])
            .arg(out.join("gotree"))
            .arg("gotree.go"),
    )?;
    Ok(out)
}

/// The host kernel, through the same script, run by busybox's shell as in the VMs.
fn run_host(dir: &Path, scorch: &Path, workloads: &Path) -> Result<Row> {
    let started = Instant::now();
    let host = dir.join("host");
    let results = host.join("results");
    let _ = std::fs::remove_dir_all(&host);
    std::fs::create_dir_all(&results)?;
    // Other test runs may hold scorch's default port: take one the kernel hands out.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let status = Command::new("busybox")
        .arg("sh")
        .arg(dir.join("checks.sh"))
        .env("SCORCH", scorch)
        .env("WORKLOADS", workloads)
        .env("RESULTS", &results)
        .env("PORT", port.to_string())
        .env("STORE", host.join("store"))
        .env("WGET", "busybox wget")
        // Debian 12's CPython 3.11, as the guests run it, whatever the host's Python is.
        .env(
            "PYTHON",
            python_debs(&X86_64)?.join("python3.11-minimal/usr/bin/python3.11"),
        )
        .env(
            "PYTHONHOME",
            python_debs(&X86_64)?.join("libpython3.11-minimal/usr"),
        )
        .status()
        .context("running checks.sh with busybox sh (is busybox-static installed?)")?;
    ensure!(status.success(), "checks.sh on the host: {status}");
    let config = host_config();
    let mut row = report::judge("host", &results, config.as_deref());
    row.seconds = started.elapsed().as_secs_f64();
    Ok(row)
}

/// The running kernel's build config, when the system keeps it.
fn host_config() -> Option<String> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    std::fs::read_to_string(format!("/boot/config-{}", release.trim())).ok()
}

/// Boots one kernel with the base initramfs plus its modules, and judges what comes back.
fn run_kernel(dir: &Path, base: &cpio::Archive, spec: &str, machine: &Machine) -> Result<Row> {
    let package = newest_package(spec, machine)?;
    let kernel = fetch_kernel(dir, &package, machine)?;
    let run_dir = dir.join(&package);
    let _ = std::fs::remove_dir_all(&run_dir);
    std::fs::create_dir_all(&run_dir)?;
    let mut archive = base.clone();
    let mut order = String::new();
    for module in &kernel.modules {
        let name = module.file_name().context("module without a name")?;
        archive.file(
            &format!("lib/modules/{}", name.to_string_lossy()),
            &std::fs::read(module)?,
            0o644,
        );
        order.push_str(&name.to_string_lossy());
        order.push('\n');
    }
    archive.file("lib/modules/order", order.as_bytes(), 0o644);
    let initramfs = run_dir.join("initramfs.cpio");
    std::fs::write(&initramfs, archive.finish())?;
    let started = Instant::now();
    let booted = boot(&kernel.vmlinuz, &initramfs, &run_dir, machine);
    let seconds = started.elapsed().as_secs_f64();
    // 20 MB per kernel, rebuilt each run: not worth keeping.
    let _ = std::fs::remove_file(&initramfs);
    booted?;
    let results = run_dir.join("results");
    std::fs::create_dir_all(&results)?;
    let tar = run_dir.join("results.tar");
    let unpacked = std::fs::metadata(&tar).is_ok_and(|m| m.len() > 0)
        && Command::new("tar")
            .arg("-xf")
            .arg(&tar)
            .arg("-C")
            .arg(&results)
            .status()
            .is_ok_and(|s| s.success());
    ensure!(
        unpacked && results.join("done").exists(),
        "no complete results from the VM: see {}",
        run_dir.join("console.log").display()
    );
    let _ = std::fs::remove_file(&tar);
    let config = std::fs::read_to_string(&kernel.config).ok();
    let mut row = report::judge(&package, &results, config.as_deref());
    row.seconds = seconds;
    Ok(row)
}

/// Runs qemu until the guest powers off, or kills it at the timeout.
fn boot(vmlinuz: &Path, initramfs: &Path, run_dir: &Path, machine: &Machine) -> Result<()> {
    let console = run_dir.join("console.log");
    let tar = run_dir.join("results.tar");
    let mut qemu = Command::new(machine.qemu);
    qemu.args(["-accel", "tcg"])
        .args(machine.qemu_machine)
        .args(["-smp", "2", "-m", "1G"])
        // No default NIC, VGA or monitor: nothing the checks need, and the NIC wants a ROM.
        .args(["-nodefaults", "-no-reboot", "-display", "none"])
        .arg("-kernel")
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initramfs)
        // panic=-1 with -no-reboot: a panic (or init exiting) ends qemu at once.
        .arg("-append")
        .arg(format!("console={} panic=-1 quiet", machine.console))
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .args(["-device", "virtio-serial-pci"])
        .arg("-chardev")
        .arg(format!("file,id=results,path={}", tar.display()))
        .args([
            "-device",
            "virtserialport,chardev=results,name=scorch.results",
        ])
        .stdin(Stdio::null());
    let mut child = qemu
        .spawn()
        .with_context(|| format!("starting {}", machine.qemu))?;
    let deadline = Instant::now() + VM_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait()? {
            ensure!(status.success(), "qemu exited with {status}");
            return Ok(());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "the VM did not power off within {} s: hung kernel or check; see {}",
                VM_TIMEOUT.as_secs(),
                console.display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `6.1` -> `linux-image-6.1.0-57-cloud-amd64`: the newest signed build apt knows of. An
/// exact ABI (`6.1.0-57`, `6.12.117+deb12`) names one build; `:FLAVOUR` picks another
/// flavour than cloud (`6.1:rt-amd64`, the PREEMPT_RT build).
fn newest_package(spec: &str, machine: &Machine) -> Result<String> {
    let (spec, flavour) = spec.split_once(':').unwrap_or((spec, machine.flavour));
    let output = Command::new("apt-cache")
        .args(["pkgnames", "linux-image-"])
        .output()
        .context("running apt-cache")?;
    let suffix = format!("-{flavour}");
    let mut builds: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|name| {
            let version = name.strip_prefix("linux-image-")?.strip_suffix(&suffix)?;
            let rest = version.strip_prefix(spec)?;
            // `6.1` must not match `6.12...`.
            (rest.is_empty() || rest.starts_with(['.', '-', '+'])).then(|| version.to_owned())
        })
        .collect();
    builds.sort_by_key(|v| version_key(v));
    let newest = builds.pop().with_context(|| {
        format!("apt knows no linux-image-{spec}*-{flavour} (run apt-get update?)")
    })?;
    Ok(format!("linux-image-{newest}{suffix}"))
}

/// `6.12.117+deb12` -> [6, 12, 117, 12]: the numbers in order, compared numerically.
fn version_key(version: &str) -> Vec<u64> {
    version
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// What a kernel package leaves in the cache.
struct Kernel {
    vmlinuz: PathBuf,
    config: PathBuf,
    /// Module files in load order; empty when the kernel has them built in.
    modules: Vec<PathBuf>,
}

/// Downloads and unpacks the package once; keeps vmlinuz, its config and the guest modules.
fn fetch_kernel(dir: &Path, package: &str, machine: &Machine) -> Result<Kernel> {
    let cache = dir.join("kernels").join(package);
    let kernel = Kernel {
        vmlinuz: cache.join("vmlinuz"),
        config: cache.join("config"),
        modules: Vec::new(),
    };
    if !cache.join("complete").exists() {
        let _ = std::fs::remove_dir_all(&cache);
        let download = dir.join("download");
        eprintln!("xtask: vm-test: downloading {package}");
        let unpacked = download_package(&download, &machine.package(package))?;
        unpack_kernel(&unpacked, &cache)?;
        // The package is 30 MB; what the VM uses is a tenth of that.
        std::fs::remove_dir_all(&download)?;
        std::fs::write(cache.join("complete"), "")?;
    }
    let order = std::fs::read_to_string(cache.join("modules.order")).unwrap_or_default();
    Ok(Kernel {
        modules: order.lines().map(|m| cache.join(m)).collect(),
        ..kernel
    })
}

/// Downloads `package` (apt's name, `pkg:arch` for a foreign one) into `download`, emptied
/// first, and unpacks it there; returns the unpacked root. Stale package lists name builds the
/// mirror has since dropped: a failed download refreshes them once.
fn download_package(download: &Path, package: &str) -> Result<PathBuf> {
    let _ = std::fs::remove_dir_all(download);
    std::fs::create_dir_all(download)?;
    let fetch = || {
        run_command(
            Command::new("apt-get")
                .current_dir(download)
                .args(["download", "-q", package]),
        )
    };
    if fetch().is_err() {
        run_command(Command::new("apt-get").args(["update", "-q"]))?;
        fetch()?;
    }
    let deb = std::fs::read_dir(download)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .with_context(|| format!("apt-get download {package} left no .deb"))?;
    let unpacked = download.join("root");
    run_command(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked))?;
    Ok(unpacked)
}

/// Copies vmlinuz, config and the guest modules (decompressed, dependencies first) out of an
/// unpacked kernel package.
fn unpack_kernel(unpacked: &Path, cache: &Path) -> Result<()> {
    std::fs::create_dir_all(cache)?;
    let boot = unpacked.join("boot");
    for entry in std::fs::read_dir(&boot)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("vmlinuz-") {
            std::fs::copy(entry.path(), cache.join("vmlinuz"))?;
        } else if name.starts_with("config-") {
            std::fs::copy(entry.path(), cache.join("config"))?;
        }
    }
    ensure!(
        cache.join("vmlinuz").exists(),
        "no vmlinuz in {}",
        boot.display()
    );
    let modules_root = std::fs::read_dir(unpacked.join("lib/modules"))?
        .flatten()
        .map(|e| e.path())
        .next()
        .context("no lib/modules in the kernel package")?;
    let builtin = std::fs::read_to_string(modules_root.join("modules.builtin")).unwrap_or_default();
    let builtin: BTreeSet<String> = builtin.lines().filter_map(module_name).collect();
    let mut files = std::collections::BTreeMap::new();
    collect_modules(&modules_root.join("kernel"), &mut files)?;
    let mut order = Vec::new();
    for module in GUEST_MODULES {
        add_module(module, &builtin, &files, &mut order)?;
    }
    let mut listing = String::new();
    for name in &order {
        let data = read_module(&files[name])?;
        std::fs::write(cache.join(format!("{name}.ko")), data)?;
        listing.push_str(&format!("{name}.ko\n"));
    }
    std::fs::write(cache.join("modules.order"), listing)?;
    Ok(())
}

/// `kernel/drivers/char/virtio_console.ko.xz` -> `virtio_console` (dashes are underscores to
/// the kernel).
fn module_name(path: &str) -> Option<String> {
    let file = path.rsplit('/').next()?;
    let stem = file.split(".ko").next()?;
    Some(stem.replace('-', "_"))
}

fn collect_modules(
    dir: &Path,
    files: &mut std::collections::BTreeMap<String, PathBuf>,
) -> Result<()> {
    for entry in std::fs::read_dir(dir)?.flatten() {
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            collect_modules(&path, files)?;
        } else if let Some(name) = module_name(&path.to_string_lossy()) {
            files.insert(name, path);
        }
    }
    Ok(())
}

/// Appends `name` to `order` after its dependencies, unless built in or already there.
fn add_module(
    name: &str,
    builtin: &BTreeSet<String>,
    files: &std::collections::BTreeMap<String, PathBuf>,
    order: &mut Vec<String>,
) -> Result<()> {
    if builtin.contains(name) || order.iter().any(|m| m == name) {
        return Ok(());
    }
    let path = files
        .get(name)
        .with_context(|| format!("module {name} is neither built in nor shipped"))?;
    for dependency in module_depends(&read_module(path)?) {
        add_module(&dependency, builtin, files, order)?;
    }
    order.push(name.to_owned());
    Ok(())
}

/// A module file, decompressed: Debian's 6.12 ships them xz-compressed, and busybox's insmod
/// takes them plain.
fn read_module(path: &Path) -> Result<Vec<u8>> {
    if path.extension().is_some_and(|e| e == "xz") {
        let out = Command::new("xz").arg("-dc").arg(path).output()?;
        ensure!(out.status.success(), "xz -d {}", path.display());
        Ok(out.stdout)
    } else {
        Ok(std::fs::read(path)?)
    }
}

/// The `depends=a,b` string of a module's .modinfo section (NUL-separated key=value strings).
fn module_depends(module: &[u8]) -> Vec<String> {
    let key = b"\0depends=";
    let Some(at) = module.windows(key.len()).position(|w| w == key) else {
        return Vec::new();
    };
    let value = &module[at + key.len()..];
    let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
    String::from_utf8_lossy(&value[..end])
        .split(',')
        .filter(|d| !d.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Everything but the modules: the same for every kernel.
fn base_initramfs(
    root: &Path,
    dir: &Path,
    scorch: &Path,
    workloads: &Path,
    machine: &Machine,
) -> Result<cpio::Archive> {
    let mut archive = cpio::Archive::default();
    for directory in [
        "proc",
        "sys",
        "dev",
        "tmp",
        "results",
        "usr/bin",
        "lib/modules",
    ] {
        archive.directory(directory);
    }
    archive.file("init", INIT.as_bytes(), 0o755);
    archive.file("checks.sh", CHECKS.as_bytes(), 0o644);
    // The container image's files (`cargo xtask image`), so every kernel runs what the
    // image ships. Its binary keeps its line tables (92 MB); the VM needs none of them, and a
    // smaller initramfs boots faster under TCG.
    for entry in image::root_filesystem(root, scorch, machine)? {
        match entry.content {
            image::Content::Directory => archive.directory(&entry.path),
            _ if entry.path == image::BINARY => {
                let stripped = dir.join("scorch.stripped");
                run_command(
                    Command::new(machine.tool("strip"))
                        .arg("-o")
                        .arg(&stripped)
                        .arg(scorch),
                )?;
                archive.file(&entry.path, &std::fs::read(&stripped)?, entry.mode);
                std::fs::remove_file(&stripped)?;
            }
            _ => archive.file(&entry.path, &entry.bytes()?, entry.mode),
        }
    }
    if machine.foreign {
        archive.file("bin/busybox", &foreign_busybox(dir, machine)?, 0o755);
    } else {
        let busybox = which("busybox")?;
        archive.file("bin/busybox", &std::fs::read(busybox)?, 0o755);
    }
    for (name, _, _) in WORKLOADS {
        archive.file(
            &format!("workloads/{name}"),
            &std::fs::read(workloads.join(name))?,
            0o755,
        );
    }
    archive.file(
        "workloads/gotree",
        &std::fs::read(workloads.join("gotree"))?,
        0o755,
    );
    archive.file(
        "workloads/calltree.py",
        &std::fs::read(workloads.join("calltree.py"))?,
        0o644,
    );
    for (inside, file) in python(machine)? {
        archive.file(&inside, &std::fs::read(&file)?, 0o755);
    }
    Ok(archive)
}

/// Where Debian 12's CPython 3.11 for `machine` is unpacked, one directory per package,
/// fetched when missing (`cargo xtask setup` fetches arm64's for the unit tests too).
fn python_debs(machine: &Machine) -> Result<PathBuf> {
    if machine.foreign {
        crate::setup::ensure_arm64_packages()?;
        Ok(PathBuf::from(crate::setup::ARM64_DEBS))
    } else {
        crate::setup::ensure_amd64_packages()?;
        Ok(PathBuf::from(crate::setup::AMD64_DEBS))
    }
}

/// Debian 12's CPython 3.11 for `machine`, as (path in the guest, file) pairs: the interpreter
/// at /usr/bin/python3.11, its standard library's core (`libpython3.11-minimal`: enough for
/// the call tree's `random`, `sys` and `time`), and the libraries it links beyond those
/// scorch brings (libz, libexpat, and libm from where the guest's libc comes from).
fn python(machine: &Machine) -> Result<Vec<(String, PathBuf)>> {
    let debs = python_debs(machine)?;
    let mut files = Vec::new();
    let root = debs.join("libpython3.11-minimal");
    let mut pending = vec![root.join("usr/lib/python3.11")];
    while let Some(dir) = pending.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))?
        {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.is_file() {
                let inside = path.strip_prefix(&root)?.to_string_lossy().into_owned();
                files.push((inside, path));
            }
        }
    }
    let interpreter = debs.join("python3.11-minimal/usr/bin/python3.11");
    files.push(("usr/bin/python3.11".to_owned(), interpreter));
    let multiarch = machine.multiarch;
    for (package, library) in [("zlib1g", "libz.so.1"), ("libexpat1", "libexpat.so.1")] {
        let file = ["lib", "usr/lib"]
            .iter()
            .map(|dir| debs.join(package).join(dir).join(multiarch).join(library))
            .find(|file| file.exists())
            .with_context(|| format!("{package} has no {library} in {}", debs.display()))?;
        // The link's target, under the link's name.
        files.push((
            format!("lib/{multiarch}/{library}"),
            std::fs::canonicalize(&file)?,
        ));
    }
    let libm = Path::new(machine.libraries).join("libm.so.6");
    files.push((format!("lib/{multiarch}/libm.so.6"), libm));
    Ok(files)
}

/// `machine`'s static busybox, from Debian's busybox-static package for it, kept in `dir`.
fn foreign_busybox(dir: &Path, machine: &Machine) -> Result<Vec<u8>> {
    let kept = dir.join("busybox");
    if !kept.exists() {
        let download = dir.join("download-busybox");
        let unpacked = download_package(&download, &machine.package("busybox-static"))?;
        std::fs::copy(unpacked.join("bin/busybox"), &kept)?;
        std::fs::remove_dir_all(&download)?;
    }
    Ok(std::fs::read(&kept)?)
}

/// The static busybox: busybox-static installs it as /bin/busybox.
fn which(program: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/bin"), PathBuf::from("/usr/bin")])
        .map(|d| d.join(program))
        .find(|p| p.exists())
        .with_context(|| format!("{program} not found (cargo xtask setup installs it)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_numerically() {
        let mut v = vec!["6.1.0-9", "6.1.0-57", "6.1.0-50"];
        v.sort_by_key(|v| version_key(v));
        assert_eq!(v, ["6.1.0-9", "6.1.0-50", "6.1.0-57"]);
        assert!(version_key("6.12.117+deb12") > version_key("6.12.100+deb12"));
    }

    #[test]
    fn module_names_and_dependencies() {
        assert_eq!(
            module_name("kernel/drivers/char/virtio_console.ko.xz").as_deref(),
            Some("virtio_console")
        );
        assert_eq!(
            module_name("kernel/x/virtio-pci.ko").as_deref(),
            Some("virtio_pci")
        );
        let modinfo = b"\x7fELF...\0license=GPL\0depends=virtio_ring,virtio\0retpoline=Y\0";
        assert_eq!(module_depends(modinfo), ["virtio_ring", "virtio"]);
        assert!(module_depends(b"\0depends=\0").is_empty());
    }
}
