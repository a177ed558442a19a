//! Support for scorch's integration tests: build the C workloads, run `scorch` and `perf`, and
//! read what they wrote. The tests themselves are in `tests/integration/`.

use std::{
    collections::HashMap,
    io::Read,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::OnceLock,
    time::Duration,
};

use anyhow::{bail, ensure, Context, Result};
use prost::Message;
use scorch::pprof;

/// The scorch binary under test: `SCORCH_BIN`, which `cargo xtask test` sets to the release
/// build it just made.
pub fn scorch_bin() -> PathBuf {
    match std::env::var_os("SCORCH_BIN") {
        Some(path) => PathBuf::from(path),
        None => panic!("SCORCH_BIN is not set: run the integration tests with `cargo xtask test`"),
    }
}

/// A scratch directory for this test run, under the workspace's target directory.
pub fn work_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target/integration")
            .join(std::process::id().to_string());
        std::fs::create_dir_all(&dir).expect("creating the test work directory");
        // Readable by the unprivileged user some tests run scorch as.
        let _ = Command::new("chmod")
            .args(["-R", "a+rwx"])
            .arg(&dir)
            .status();
        // Canonical, so paths the tests build compare equal to what /proc/PID/maps shows.
        dir.canonicalize()
            .expect("canonicalizing the test work directory")
    })
}

/// `tests/workloads/<file>`: the sources of the programs the tests profile. Absolute, so the
/// DWARF of what is built from it names it with its full path.
pub fn workload_source(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("workloads")
        .join(file)
}

/// Runs a build or inspection tool and returns its output, failing with the command line and
/// its stderr when it fails, so a broken toolchain reads as such rather than as a scorch bug.
pub fn run_tool(command: &mut Command) -> Result<Output> {
    let line = format!("{command:?}");
    let output = command
        .output()
        .with_context(|| format!("running {line} (cargo xtask setup installs the tools)"))?;
    ensure!(
        output.status.success(),
        "{line} failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(output)
}

/// Compiles `source` with `compiler` (gcc, g++) into `output`: `flags` before the source,
/// `link` after it, where the linker wants libraries (after the objects that use them).
pub fn compile(
    compiler: &str,
    source: &Path,
    output: &Path,
    flags: &[&str],
    link: &[&str],
) -> Result<PathBuf> {
    run_tool(
        Command::new(compiler)
            .args(flags)
            .arg("-o")
            .arg(output)
            .arg(source)
            .args(link),
    )?;
    Ok(output.to_owned())
}

/// Compiles `tests/workloads/<name>.c` with gcc and `flags`; returns the executable.
pub fn build_workload(name: &str, flags: &[&str]) -> Result<PathBuf> {
    compile(
        "gcc",
        &workload_source(&format!("{name}.c")),
        &work_dir().join(name),
        flags,
        &["-lpthread"],
    )
}

/// Compiles `tests/workloads/<name>.cpp` with g++ and `flags`; returns the executable. C++
/// workloads exist for their mangled names.
pub fn build_cpp_workload(name: &str, flags: &[&str]) -> Result<PathBuf> {
    compile(
        "g++",
        &workload_source(&format!("{name}.cpp")),
        &work_dir().join(name),
        flags,
        &[],
    )
}

/// Compiles `tests/workloads/<name>.rs` with rustc, optimised, with frame pointers (so the
/// stacks unwind through it) and full debug info; the crate is named `name`, which is the
/// first path segment of its demangled function names.
pub fn build_rust_workload(name: &str) -> Result<PathBuf> {
    let output = work_dir().join(name);
    run_tool(
        Command::new("rustc")
            .args(["--edition", "2021", "--crate-name", name])
            .args(["-C", "opt-level=2", "-C", "force-frame-pointers=yes", "-g"])
            .arg("-o")
            .arg(&output)
            .arg(workload_source(&format!("{name}.rs"))),
    )?;
    Ok(output)
}

/// Compiles `tests/workloads/<name>.c` into the shared library `<name>.so`, position
/// independent (it is mapped wherever the loader puts it, unlike the executable). Give `name`
/// the `lib` prefix so programs can link it with `-l`.
pub fn build_shared_library(name: &str, flags: &[&str]) -> Result<PathBuf> {
    let mut all = vec!["-shared", "-fPIC"];
    all.extend_from_slice(flags);
    compile(
        "gcc",
        &workload_source(&format!("{name}.c")),
        &work_dir().join(format!("{name}.so")),
        &all,
        &[],
    )
}

/// Compiles `tests/workloads/<name>.c` like [`build_workload`], linked against `library` (a
/// `lib*.so` from [`build_shared_library`]) with an rpath to its directory, so the program
/// runs without `LD_LIBRARY_PATH`.
pub fn build_workload_linked_to(name: &str, flags: &[&str], library: &Path) -> Result<PathBuf> {
    let dir = library.parent().context("library has no directory")?;
    let stem = library
        .file_name()
        .and_then(|f| f.to_str())
        .and_then(|f| f.strip_prefix("lib"))
        .and_then(|f| f.strip_suffix(".so"))
        .with_context(|| format!("{} is not named lib*.so", library.display()))?;
    let dir = dir.to_str().context("library directory is not UTF-8")?;
    compile(
        "gcc",
        &workload_source(&format!("{name}.c")),
        &work_dir().join(name),
        flags,
        &[
            &format!("-L{dir}"),
            &format!("-l{stem}"),
            &format!("-Wl,-rpath,{dir}"),
            "-lpthread",
        ],
    )
}

/// Moves `binary`'s debug information into `<binary>.debug` the way distributions ship it, and
/// strips the binary with `strip --strip-all`, which removes `.symtab` as well as the DWARF: any
/// name or line a profiler then shows for it can only have come from the debug file. With
/// `debuglink`, the binary gets a `.gnu_debuglink` section naming that file (looked up next to
/// the binary); without, only its build id can lead to it. Returns the debug file.
pub fn split_debug_info(binary: &Path, debuglink: bool) -> Result<PathBuf> {
    let mut debug = binary.as_os_str().to_owned();
    debug.push(".debug");
    let debug = PathBuf::from(debug);
    run_tool(
        Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(binary)
            .arg(&debug),
    )?;
    run_tool(Command::new("strip").arg("--strip-all").arg(binary))?;
    if debuglink {
        let mut link = std::ffi::OsString::from("--add-gnu-debuglink=");
        link.push(&debug);
        run_tool(Command::new("objcopy").arg(link).arg(binary))?;
    }
    Ok(debug)
}

/// The GNU build id of an ELF file as lowercase hex, read by `readelf -n`: an independent
/// reading to compare with the one scorch reports, and the key of `/usr/lib/debug/.build-id/`.
pub fn gnu_build_id(file: &Path) -> Result<String> {
    let output = run_tool(Command::new("readelf").arg("-n").arg(file))?;
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .find_map(|l| l.trim().strip_prefix("Build ID:"))
        .map(|id| id.trim().to_lowercase())
        .with_context(|| format!("{} has no GNU build id:\n{text}", file.display()))
}

/// The section names of an ELF file (`readelf -S`), to check that a test set up what it meant
/// to (a stripped binary really has no `.symtab`) before blaming scorch.
pub fn section_names(file: &Path) -> Result<Vec<String>> {
    let output = run_tool(Command::new("readelf").args(["-S", "-W"]).arg(file))?;
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix('[')?.split_once(']'))
        .filter_map(|(_, rest)| rest.split_whitespace().next())
        .filter(|name| name.starts_with('.'))
        .map(str::to_owned)
        .collect())
}

/// The 1-based number of the one line of `source` that contains `marker` (a comment such as
/// `/* LOOP_LINE */`): tests expect line numbers found in the source, not written in the test,
/// so editing a workload cannot silently make them wrong.
pub fn marked_line(source: &Path, marker: &str) -> Result<i64> {
    let text =
        std::fs::read_to_string(source).with_context(|| format!("reading {}", source.display()))?;
    let lines: Vec<usize> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(marker))
        .map(|(i, _)| i + 1)
        .collect();
    ensure!(
        lines.len() == 1,
        "{marker} marks lines {lines:?} of {}; expected exactly one",
        source.display()
    );
    Ok(lines[0] as i64)
}

/// Files and directories a test created outside its work directory (`/usr/lib/debug`, `/tmp`),
/// removed when dropped, in reverse order, so that a failing test leaves the machine as it
/// found it. Directories are only removed when empty.
#[derive(Default)]
pub struct Cleanup {
    paths: Vec<PathBuf>,
}

impl Cleanup {
    pub fn new() -> Cleanup {
        Cleanup::default()
    }

    /// Removes `path` (a file) on drop, whoever creates it.
    pub fn file(&mut self, path: impl Into<PathBuf>) {
        self.paths.push(path.into());
    }

    /// Creates `dir` and its missing parents, each removed on drop if still empty; the ones
    /// that already existed are left alone.
    pub fn create_dir_all(&mut self, dir: &Path) -> Result<()> {
        let mut missing: Vec<&Path> = dir.ancestors().take_while(|d| !d.exists()).collect();
        missing.reverse();
        for d in missing {
            std::fs::create_dir(d).with_context(|| format!("creating {}", d.display()))?;
            self.paths.push(d.to_owned());
        }
        Ok(())
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for path in self.paths.iter().rev() {
            if path.is_dir() {
                let _ = std::fs::remove_dir(path);
            } else {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// Kills a process by PID when dropped: for processes a test did not spawn itself (the program
/// a wrapper such as `unshare` ran), which [`Workload`] cannot reach.
pub struct KillOnDrop(pub u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", &self.0.to_string()])
            .stderr(Stdio::null())
            .status();
    }
}

/// The PIDs of processes whose command line is exactly `argv`, from `/proc/*/cmdline`: how a
/// test finds a process started through a wrapper, whose PID it was never told.
pub fn pids_with_cmdline(argv: &[&str]) -> Vec<u32> {
    let mut wanted = Vec::new();
    for arg in argv {
        wanted.extend_from_slice(arg.as_bytes());
        wanted.push(0);
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == wanted))
        .collect()
}

/// Records `pid` with scorch for `seconds` at 199 Hz into `output` (format from its
/// extension), with `extra` arguments, and returns what scorch printed.
pub fn record_pid_to(pid: u32, seconds: u32, output: &Path, extra: &[&str]) -> Result<Output> {
    let pid = pid.to_string();
    let duration = format!("{seconds}s");
    let output = output.to_str().context("output path is not UTF-8")?;
    let mut args = vec![
        "record",
        "--pid",
        &pid,
        "-F",
        "199",
        "--duration",
        &duration,
        "-o",
        output,
    ];
    args.extend_from_slice(extra);
    run_scorch(&args)
}

/// Records `pid` with scorch for `seconds` at 199 Hz into `work_dir()/<name>.pb.gz` and returns
/// the decoded profile with the summary: the usual shape of a symbolisation test.
pub fn record_pid(pid: u32, seconds: u32, name: &str) -> Result<(pprof::Profile, RecordReport)> {
    let path = work_dir().join(format!("{name}.pb.gz"));
    let output = record_pid_to(pid, seconds, &path, &[])?;
    let report = parse_record_output(&output)?;
    Ok((read_pprof(&path)?, report))
}

/// A `scorch record` running in the background, for tests that must act once sampling has
/// begun (start a process that lives for only part of the recording).
pub struct BackgroundRecording {
    child: Option<Child>,
    stderr: Option<std::thread::JoinHandle<Vec<u8>>>,
}

impl BackgroundRecording {
    /// Starts `scorch <args>` and returns once it samples: when it holds the file descriptor of
    /// an attached perf event program (a BPF link, or the perf event itself on kernels that
    /// attach without links). That is a fact of the kernel, unlike the wording of a log line.
    pub fn start(args: &[&str]) -> Result<BackgroundRecording> {
        let mut child = Command::new(scorch_bin())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting scorch")?;
        let mut pipe = child.stderr.take().context("scorch's stderr")?;
        let stderr = std::thread::spawn(move || {
            let mut text = Vec::new();
            let _ = pipe.read_to_end(&mut text);
            text
        });
        let mut recording = BackgroundRecording {
            child: Some(child),
            stderr: Some(stderr),
        };
        let started = std::time::Instant::now();
        let pid = recording.child.as_ref().map_or(0, Child::id);
        while attachment_fds(pid) == 0 {
            if let Some(status) = recording.child.as_mut().and_then(|c| c.try_wait().ok()?) {
                let stderr = recording.take_stderr();
                bail!("scorch {args:?} exited ({status}) before sampling:\n{stderr}");
            }
            ensure!(
                started.elapsed() < std::time::Duration::from_secs(20),
                "scorch {args:?} attached nothing in 20 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Ok(recording)
    }

    fn take_stderr(&mut self) -> String {
        self.stderr
            .take()
            .and_then(|t| t.join().ok())
            .map(|s| String::from_utf8_lossy(&s).into_owned())
            .unwrap_or_default()
    }

    /// Waits for the recording to end; fails with scorch's stderr when it fails.
    pub fn finish(mut self) -> Result<Output> {
        let child = self.child.take().context("recording already finished")?;
        let output = child.wait_with_output().context("waiting for scorch")?;
        let stderr = self.take_stderr();
        ensure!(
            output.status.success(),
            "scorch failed ({}):\n{stderr}",
            output.status
        );
        Ok(Output {
            stderr: stderr.into_bytes(),
            ..output
        })
    }
}

impl Drop for BackgroundRecording {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// How many BPF link and perf event file descriptors process `pid` holds.
fn attachment_fds(pid: u32) -> usize {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| {
            target.as_os_str() == "anon_inode:bpf_link"
                || target.as_os_str() == "anon_inode:[perf_event]"
        })
        .count()
}

/// A running workload, killed when dropped so a failing test leaves nothing behind.
pub struct Workload {
    pub child: Child,
}

impl Workload {
    pub fn start(program: &Path, args: &[&str]) -> Result<Workload> {
        let child = Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        Ok(Workload { child })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs scorch with `args` and returns its output, failing with its stderr when it fails.
pub fn run_scorch(args: &[&str]) -> Result<Output> {
    let output = Command::new(scorch_bin())
        .args(args)
        .output()
        .context("running scorch")?;
    if !output.status.success() {
        bail!(
            "scorch {} failed ({}):\n{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(output)
}

/// `scorch query --store STORE RANGE --match MATCHER --format folded`'s output: `range` is
/// `["--since", "1h"]` or `["--from", SECONDS]`.
pub fn query_folded(store: &Path, range: &[&str], matcher: &str) -> Result<String> {
    let store = store.to_str().context("store path not UTF-8")?;
    let mut args = vec!["query", "--store", store];
    args.extend_from_slice(range);
    args.extend_from_slice(&["--match", matcher, "--format", "folded"]);
    Ok(String::from_utf8(run_scorch(&args)?.stdout)?)
}

/// A `/proc/PID/status` field in KiB (`VmRSS:`, `VmHWM:`).
pub fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("{field} in /proc/{pid}/status"))
}

/// Polls `condition` every 500 ms for up to `limit`, failing with `what` past it.
pub fn wait_for(what: &str, limit: Duration, condition: &dyn Fn() -> Result<bool>) -> Result<()> {
    let deadline = std::time::Instant::now() + limit;
    while !condition()? {
        ensure!(
            std::time::Instant::now() < deadline,
            "waited {limit:?} for {what}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    Ok(())
}

/// Reads a gzipped pprof file.
pub fn read_pprof(path: &Path) -> Result<pprof::Profile> {
    let gz = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut raw)
        .with_context(|| format!("{} is not gzip", path.display()))?;
    pprof::Profile::decode(&raw[..]).with_context(|| format!("{} is not a pprof", path.display()))
}

/// One sample of a decoded pprof, with names resolved.
#[derive(Debug, Clone)]
pub struct NamedSample {
    /// Function names, leaf first; an unnamed location is `0x<address>`.
    pub frames: Vec<String>,
    /// True per frame when its mapping is the kernel's.
    pub kernel: Vec<bool>,
    /// Per frame, its kind as scorch's own `Location` field says it (`FrameKind::code`: 0
    /// native, 1 kernel, 2 Python, 3 Go, 4 JVM).
    pub kinds: Vec<u32>,
    pub count: i64,
    pub pid: i64,
    pub comm: String,
}

/// One sample of a profile whose value is a weight (off-CPU nanoseconds): its value, every
/// function name leaf first (inlined ones too), and its string labels.
#[derive(Debug)]
pub struct OffCpuSample {
    pub value: i64,
    pub frames: Vec<String>,
    pub labels: HashMap<String, String>,
}

/// Flattens a pprof into [`OffCpuSample`]s.
pub fn off_cpu_samples(profile: &pprof::Profile) -> Vec<OffCpuSample> {
    let strings = &profile.string_table;
    let functions: HashMap<u64, &str> = profile
        .function
        .iter()
        .map(|f| (f.id, strings[f.name as usize].as_str()))
        .collect();
    let locations: HashMap<u64, Vec<String>> = profile
        .location
        .iter()
        .map(|l| {
            let names = l
                .line
                .iter()
                .map(|line| functions.get(&line.function_id).copied().unwrap_or("?"))
                .map(str::to_owned)
                .collect();
            (l.id, names)
        })
        .collect();
    profile
        .sample
        .iter()
        .map(|s| OffCpuSample {
            value: s.value[0],
            frames: s
                .location_id
                .iter()
                .flat_map(|id| locations.get(id).cloned().unwrap_or_default())
                .collect(),
            labels: s
                .label
                .iter()
                .filter(|l| l.str != 0)
                .map(|l| {
                    (
                        strings[l.key as usize].clone(),
                        strings[l.str as usize].clone(),
                    )
                })
                .collect(),
        })
        .collect()
}

/// Flattens a pprof into named samples.
pub fn named_samples(profile: &pprof::Profile) -> Vec<NamedSample> {
    let strings = &profile.string_table;
    let functions: HashMap<u64, &str> = profile
        .function
        .iter()
        .map(|f| (f.id, strings[f.name as usize].as_str()))
        .collect();
    let kernel_mappings: Vec<u64> = profile
        .mapping
        .iter()
        .filter(|m| strings[m.filename as usize] == "[kernel.kallsyms]")
        .map(|m| m.id)
        .collect();
    let locations: HashMap<u64, (String, bool, u32)> = profile
        .location
        .iter()
        .map(|l| {
            let name = l
                .line
                .last()
                .and_then(|line| functions.get(&line.function_id))
                .map_or_else(|| format!("{:#x}", l.address), |n| (*n).to_owned());
            let kernel = kernel_mappings.contains(&l.mapping_id);
            (l.id, (name, kernel, l.scorch_frame_kind))
        })
        .collect();
    profile
        .sample
        .iter()
        .map(|s| {
            let label = |key: &str| s.label.iter().find(|l| strings[l.key as usize] == key);
            NamedSample {
                frames: s
                    .location_id
                    .iter()
                    .map(|id| locations[id].0.clone())
                    .collect(),
                kernel: s.location_id.iter().map(|id| locations[id].1).collect(),
                kinds: s.location_id.iter().map(|id| locations[id].2).collect(),
                count: s.value[0],
                pid: label("pid").map_or(-1, |l| l.num),
                comm: label("comm").map_or_else(String::new, |l| strings[l.str as usize].clone()),
            }
        })
        .collect()
}

/// One source line of a frame, as the pprof names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineInfo {
    /// Demangled name (`Function.name`).
    pub function: String,
    /// Mangled name (`Function.system_name`).
    pub system_name: String,
    /// Source file (`Function.filename`); empty when unknown.
    pub file: String,
    /// Line in `file`; 0 when unknown.
    pub line: i64,
    /// Column in `line`, from 1; 0 when unknown.
    pub column: i64,
}

/// A pprof mapping with its strings resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappingInfo {
    pub filename: String,
    pub build_id: String,
    pub has_functions: bool,
    pub has_filenames: bool,
    pub has_line_numbers: bool,
    pub has_inline_frames: bool,
}

/// One frame (pprof location) of a sample, with every line it carries.
#[derive(Debug, Clone)]
pub struct Frame {
    pub address: u64,
    pub mapping: Option<MappingInfo>,
    /// One per inline level: innermost (inlined) function first, the real function whose
    /// machine code this is last. Empty when the frame could not be named.
    pub lines: Vec<LineInfo>,
}

impl Frame {
    /// The real function, whose machine code holds this address: the outermost line's
    /// function, which does not change when the compiler inlines something else into it.
    pub fn function(&self) -> Option<&str> {
        self.lines.last().map(|l| l.function.as_str())
    }

    /// The innermost function: the inlined one when there is inlining.
    pub fn innermost(&self) -> Option<&str> {
        self.lines.first().map(|l| l.function.as_str())
    }

    /// The mapping's file, or "" when the frame has no mapping.
    pub fn mapping_file(&self) -> &str {
        self.mapping.as_ref().map_or("", |m| m.filename.as_str())
    }
}

impl std::fmt::Display for Frame {
    /// `inlined (file:12) < caller (file:30) @0x1234 in /path/to/binary`: every inline level,
    /// innermost first, which is what a failing assertion needs to show.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.lines.is_empty() {
            write!(f, "?")?;
        }
        for (i, line) in self.lines.iter().enumerate() {
            if i > 0 {
                write!(f, " < ")?;
            }
            write!(f, "{}", line.function)?;
            if !line.file.is_empty() || line.line != 0 {
                write!(f, " ({}:{})", line.file, line.line)?;
            }
            if line.system_name != line.function {
                write!(f, " [{}]", line.system_name)?;
            }
        }
        write!(f, " @{:#x} in {}", self.address, self.mapping_file())
    }
}

/// One sample of a decoded pprof with everything its frames carry.
#[derive(Debug, Clone)]
pub struct DetailedSample {
    /// Leaf first.
    pub frames: Vec<Frame>,
    pub count: i64,
    pub pid: i64,
    pub comm: String,
}

impl DetailedSample {
    /// The leaf frame, if the sample has any.
    pub fn leaf(&self) -> Option<&Frame> {
        self.frames.first()
    }
}

/// Flattens a pprof into samples whose frames keep all their lines, files, mangled names and
/// mappings, for tests of symbolisation (where [`named_samples`] keeps one name per frame).
pub fn detailed_samples(profile: &pprof::Profile) -> Vec<DetailedSample> {
    let strings = &profile.string_table;
    let string = |i: i64| strings.get(i as usize).cloned().unwrap_or_default();
    let functions: HashMap<u64, &pprof::Function> =
        profile.function.iter().map(|f| (f.id, f)).collect();
    let mappings: HashMap<u64, MappingInfo> = profile
        .mapping
        .iter()
        .map(|m| {
            let info = MappingInfo {
                filename: string(m.filename),
                build_id: string(m.build_id),
                has_functions: m.has_functions,
                has_filenames: m.has_filenames,
                has_line_numbers: m.has_line_numbers,
                has_inline_frames: m.has_inline_frames,
            };
            (m.id, info)
        })
        .collect();
    let frames: HashMap<u64, Frame> = profile
        .location
        .iter()
        .map(|l| {
            let lines = l
                .line
                .iter()
                .map(|line| {
                    let function = functions.get(&line.function_id);
                    LineInfo {
                        function: function.map_or_else(String::new, |f| string(f.name)),
                        system_name: function.map_or_else(String::new, |f| string(f.system_name)),
                        file: function.map_or_else(String::new, |f| string(f.filename)),
                        line: line.line,
                        column: line.column,
                    }
                })
                .collect();
            let frame = Frame {
                address: l.address,
                mapping: mappings.get(&l.mapping_id).cloned(),
                lines,
            };
            (l.id, frame)
        })
        .collect();
    profile
        .sample
        .iter()
        .map(|s| {
            let label = |key: &str| s.label.iter().find(|l| string(l.key) == key);
            DetailedSample {
                frames: s
                    .location_id
                    .iter()
                    .filter_map(|id| frames.get(id).cloned())
                    .collect(),
                count: s.value.first().copied().unwrap_or(0),
                pid: label("pid").map_or(-1, |l| l.num),
                comm: label("comm").map_or_else(String::new, |l| string(l.str)),
            }
        })
        .collect()
}

/// Samples of `samples` that satisfy `predicate`, and all samples, both weighted by count:
/// "most samples have ..." assertions compare the two.
pub fn count_where<'a>(
    samples: impl IntoIterator<Item = &'a DetailedSample>,
    predicate: impl Fn(&DetailedSample) -> bool,
) -> (i64, i64) {
    samples.into_iter().fold((0, 0), |(hits, total), s| {
        (
            hits + if predicate(s) { s.count } else { 0 },
            total + s.count,
        )
    })
}

/// The `limit` heaviest stacks of `samples`, one frame per line, leaf first: what a failed
/// assertion prints so its message says what scorch produced instead.
pub fn describe_stacks<'a>(
    samples: impl IntoIterator<Item = &'a DetailedSample>,
    limit: usize,
) -> String {
    let mut samples: Vec<&DetailedSample> = samples.into_iter().collect();
    samples.sort_by_key(|s| std::cmp::Reverse(s.count));
    let mut text = String::new();
    for s in samples.iter().take(limit) {
        text.push_str(&format!(
            "{} samples, pid {} ({}):\n",
            s.count, s.pid, s.comm
        ));
        for frame in &s.frames {
            text.push_str(&format!("    {frame}\n"));
        }
    }
    if samples.len() > limit {
        text.push_str(&format!("... and {} more stacks\n", samples.len() - limit));
    }
    text
}

/// Share of samples (0..1) whose leaf frame is each of `names`, among samples of `pid`.
pub fn leaf_shares(samples: &[NamedSample], pid: i64, names: &[&str]) -> Vec<f64> {
    let of_pid: Vec<&NamedSample> = samples.iter().filter(|s| s.pid == pid).collect();
    let total: i64 = of_pid.iter().map(|s| s.count).sum();
    names
        .iter()
        .map(|name| {
            let hits: i64 = of_pid
                .iter()
                .filter(|s| s.frames.first().map(String::as_str) == Some(name))
                .map(|s| s.count)
                .sum();
            hits as f64 / total.max(1) as f64
        })
        .collect()
}

/// Leaf function shares (0..1) in a `perf record -g` file, from `perf script`.
pub fn perf_leaf_shares(perf_data: &Path, names: &[&str]) -> Result<(Vec<f64>, u64)> {
    let output = Command::new("perf")
        .args(["script", "-F", "ip,sym", "-i"])
        .arg(perf_data)
        .output()
        .context("running perf script")?;
    ensure!(
        output.status.success(),
        "perf script: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout);
    // One block per sample, blank-line separated; the first line of a block is the leaf.
    let mut counts = vec![0u64; names.len()];
    let mut total = 0u64;
    for block in text.split("\n\n") {
        let Some(leaf) = block.lines().map(str::trim).find(|l| !l.is_empty()) else {
            continue;
        };
        total += 1;
        let symbol = leaf.split_whitespace().nth(1).unwrap_or("");
        let symbol = symbol.split('+').next().unwrap_or(symbol);
        if let Some(i) = names.iter().position(|n| *n == symbol) {
            counts[i] += 1;
        }
    }
    ensure!(total > 0, "perf script printed no samples");
    Ok((
        counts.iter().map(|&c| c as f64 / total as f64).collect(),
        total,
    ))
}

/// Runs `go tool pprof` with `args` on `file` and returns its stdout.
pub fn go_pprof(args: &[&str], file: &Path) -> Result<String> {
    let output = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        .env("HOME", work_dir())
        .output()
        .context("running go tool pprof (cargo xtask setup installs golang-go)")?;
    ensure!(
        output.status.success(),
        "go tool pprof {args:?} {}: {}",
        file.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The `N samples` figure and the per-window figures scorch printed.
#[derive(Debug)]
pub struct RecordReport {
    pub samples: u64,
    pub seconds: f64,
    pub windows: Vec<u64>,
    pub summary: String,
}

/// Parses scorch record's summary (stdout) and window log lines (stderr).
pub fn parse_record_output(output: &Output) -> Result<RecordReport> {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("scorch: "))
        .context("no summary line")?
        .to_owned();
    let words: Vec<&str> = summary.split_whitespace().collect();
    let samples = words
        .get(1)
        .and_then(|w| w.parse().ok())
        .with_context(|| format!("no sample count in {summary:?}"))?;
    let seconds = words
        .iter()
        .position(|&w| w == "in")
        .and_then(|i| words.get(i + 1))
        .and_then(|w| w.trim_end_matches('s').parse().ok())
        .with_context(|| format!("no duration in {summary:?}"))?;
    let windows = stderr
        .lines()
        .filter_map(|l| l.split_once("window ").map(|(_, rest)| rest))
        .filter_map(|rest| rest.split_once(": ").map(|(_, rest)| rest))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect();
    Ok(RecordReport {
        samples,
        seconds,
        windows,
        summary,
    })
}

/// A `scorch run` daemon started by a test, on a free loopback port, killed when dropped.
pub struct Daemon {
    pub child: Child,
    /// `127.0.0.1:PORT` of its HTTP server.
    pub address: String,
    pub store: PathBuf,
    /// Reads the daemon's stderr as it comes, so a daemon that logs a lot never blocks on a
    /// full pipe; joined by [`Daemon::stop`].
    stderr: Option<std::thread::JoinHandle<Vec<u8>>>,
}

impl Daemon {
    /// Starts `scorch run --store STORE --http-address 127.0.0.1:PORT ARGS...` and waits until
    /// its HTTP server answers (the BPF program is attached by then).
    pub fn start(store: &Path, args: &[&str]) -> Result<Daemon> {
        Daemon::start_with_env(store, args, &[])
    }

    /// [`Daemon::start`] with `env` added to the daemon's environment.
    pub fn start_with_env(store: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<Daemon> {
        // Let the kernel pick a free port, then hand it to the daemon.
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let address = format!("127.0.0.1:{port}");
        let mut child = Command::new(scorch_bin())
            .arg("run")
            .arg("--store")
            .arg(store)
            .args(["--http-address", &address])
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting scorch run")?;
        let mut pipe = child.stderr.take().context("scorch run's stderr")?;
        let stderr = std::thread::spawn(move || {
            let mut text = Vec::new();
            let _ = pipe.read_to_end(&mut text);
            text
        });
        let mut daemon = Daemon {
            child,
            address,
            store: store.to_owned(),
            stderr: Some(stderr),
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if let Some(status) = daemon.child.try_wait()? {
                let stderr = daemon.take_stderr();
                bail!("scorch run exited ({status}) before serving:\n{stderr}");
            }
            if http_get(&daemon.address, "/healthz").is_ok() {
                return Ok(daemon);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!(
            "scorch run did not serve HTTP on {} within 30 s",
            daemon.address
        )
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the daemon wrote to stderr; call once it has exited (the pipe is read to its end).
    fn take_stderr(&mut self) -> String {
        self.stderr
            .take()
            .and_then(|reader| reader.join().ok())
            .map(|text| String::from_utf8_lossy(&text).into_owned())
            .unwrap_or_default()
    }

    /// Sends SIGTERM and waits for the exit; returns the exit status, the time it took and
    /// what the daemon wrote to stderr.
    pub fn stop(mut self) -> Result<(std::process::ExitStatus, Duration, String)> {
        let started = std::time::Instant::now();
        // SAFETY: kill(2) on a child this test started and has not reaped.
        unsafe { libc_kill(self.child.id() as i32, 15) };
        let status = self.child.wait()?;
        let elapsed = started.elapsed();
        Ok((status, elapsed, self.take_stderr()))
    }

    /// [`Daemon::stop`], failing (after a SIGKILL, with what the daemon logged) when the
    /// daemon is still running `limit` after the SIGTERM, instead of waiting for ever.
    pub fn stop_within(
        mut self,
        limit: Duration,
    ) -> Result<(std::process::ExitStatus, Duration, String)> {
        let started = std::time::Instant::now();
        // SAFETY: kill(2) on a child this test started and has not reaped.
        unsafe { libc_kill(self.child.id() as i32, 15) };
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok((status, started.elapsed(), self.take_stderr()));
            }
            if started.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let stderr = self.take_stderr();
                bail!("scorch run still ran {limit:?} after SIGTERM (killed):\n{stderr}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, signal: i32) -> i32;
}

/// SIGKILLs the process group `leader` leads (a child spawned with `process_group(0)`), so
/// the programs it started go with it: `go tool pprof` runs `pprof` as a child, which outlived
/// a kill of `go` alone, holding the test's descriptors.
pub fn kill_process_group(leader: u32) {
    // SAFETY: kill(2) on a process group this test created.
    unsafe { libc_kill(-(leader as i32), 9) };
}

/// The value of one series of a Prometheus text exposition, named with its labels exactly as
/// the exposition writes them (`name{label="value"}`); `None` when it is absent.
pub fn series_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// A metric's value in a Prometheus text exposition, summed over its label sets.
pub fn metric_total(text: &str, name: &str) -> Result<f64> {
    let mut total = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        if series.split('{').next() == Some(name) {
            *total.get_or_insert(0.0) += value.parse::<f64>()?;
        }
    }
    total.with_context(|| format!("no {name} in /metrics"))
}

/// A metric's value (summed over its label sets) in the daemon's `/metrics` at `address`.
pub fn metric(address: &str, name: &str) -> Result<f64> {
    let (status, body) = http_get(address, "/metrics")?;
    ensure!(status == 200, "/metrics answered {status}");
    metric_total(&String::from_utf8(body)?, name)
}

/// Percent-encodes a query value (everything but unreserved characters).
pub fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A minimal HTTP/1.1 GET over loopback: `(status, body)`. Enough for the daemon's API; no
/// client library needed.
pub fn http_get(address: &str, path: &str) -> Result<(u16, Vec<u8>)> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    let response = http_request(address, &request, Duration::from_secs(30))?;
    Ok((response.status, response.body))
}

/// An HTTP response: the status, the header lines as text, the body (de-chunked).
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

/// Sends `request` (the whole text, headers and blank line included, so a test can send what
/// no client library would) and reads the response to the end of the connection. Every read
/// and write gives up after `timeout`: a server that hangs fails the test instead of blocking
/// it. Ask for `Connection: close`.
pub fn http_request(address: &str, request: &str, timeout: Duration) -> Result<HttpResponse> {
    let stream = std::net::TcpStream::connect(address)
        .with_context(|| format!("connecting to {address}"))?;
    http_exchange(stream, request, timeout)
}

/// [`http_request`] on a stream the caller connected (from a chosen source address, say).
pub fn http_exchange(
    mut stream: std::net::TcpStream,
    request: &str,
    timeout: Duration,
) -> Result<HttpResponse> {
    use std::io::Write;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(request.as_bytes())?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .with_context(|| format!("reading the response ({} bytes so far)", response.len()))?;
    let header_end = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .with_context(|| {
            format!(
                "no end of HTTP headers in {:?}",
                String::from_utf8_lossy(&response)
            )
        })?;
    let head = String::from_utf8_lossy(&response[..header_end]).into_owned();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("bad status line in {head:?}"))?;
    let mut body = response[header_end + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body)?;
    }
    Ok(HttpResponse { status, head, body })
}

fn dechunk(mut data: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("truncated chunk size")?;
        let size_text = String::from_utf8_lossy(&data[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .with_context(|| format!("bad chunk size {size_text:?}"))?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(data.get(..size).context("truncated chunk")?);
        data = data.get(size + 2..).context("truncated chunk end")?;
    }
}

/// Fake Pyroscope and Parca servers for the remote sink's tests.
pub mod debian;
pub mod fake_kubernetes;
pub mod fake_otlp;
pub mod fake_remote;

/// A cgroup the test made, removed (after its processes are gone) when dropped.
pub struct Cgroup(PathBuf);

impl Cgroup {
    pub fn create(root: &Path, relative: &str) -> Result<Cgroup> {
        let path = root.join(relative.trim_start_matches('/'));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Cgroup(path))
    }

    pub fn add(&self, pid: u32) -> Result<()> {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("moving {pid} into {}", self.0.display()))
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Innermost first; a directory still holding a process stays (and says so).
        let mut dir = Some(self.0.as_path());
        while let Some(path) = dir {
            if path.ends_with("unified") || path.ends_with("systemd") {
                break;
            }
            if std::fs::remove_dir(path).is_err() {
                break;
            }
            dir = path.parent();
        }
    }
}
