//! User-space symbolisation: inline frames with their lines, debug info in separate files
//! (`.gnu_debuglink`, `/usr/lib/debug/.build-id/`), Rust and C++ demangling, shared libraries,
//! processes in another mount namespace or gone before the recording ends, and JIT code named
//! by a perf map. Every expectation comes from the workload's source or from binutils, never
//! from scorch itself.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{bail, ensure, Context, Result};
use scorch_tests::*;

/// Optimised, with frame pointers (complete stacks) and DWARF (names, files, lines, inlining).
const C_FLAGS: &[&str] = &["-O2", "-fno-omit-frame-pointer", "-g"];

/// "Most samples": the hot loop is nearly all of every workload's time; the rest is the loop's
/// setup, the outer loop and the odd interrupt.
const MOST: f64 = 0.8;

/// Records `pid` for 4 s at 199 Hz and returns its samples, failing when there are too few to
/// judge (a single busy thread gives about 800).
fn record_samples(pid: u32, name: &str) -> Result<Vec<DetailedSample>> {
    let (profile, report) = record_pid(pid, 4, name)?;
    println!("{}", report.summary);
    let samples: Vec<DetailedSample> = detailed_samples(&profile)
        .into_iter()
        .filter(|s| s.pid == i64::from(pid))
        .collect();
    let total: i64 = samples.iter().map(|s| s.count).sum();
    ensure!(
        total > 300,
        "only {total} samples of pid {pid} in 4 s at 199 Hz: {}",
        report.summary
    );
    Ok(samples)
}

/// Asserts that at least `share` of `samples` (by count) satisfy `predicate`, printing the
/// heaviest stacks, every line of every frame, when they do not.
fn assert_share(
    samples: &[DetailedSample],
    share: f64,
    what: &str,
    predicate: impl Fn(&DetailedSample) -> bool,
) {
    let (hits, total) = count_where(samples, predicate);
    println!("{what}: {hits} of {total} samples");
    assert!(
        hits as f64 >= share * total as f64,
        "{what}: only {hits} of {total} samples (want {:.0}%); heaviest stacks:\n{}",
        share * 100.0,
        describe_stacks(samples, 8)
    );
}

/// The first frame whose leaf is `function`, with its mapping, checked to be `file`.
fn leaf_in_file<'a>(
    samples: &'a [DetailedSample],
    function: &str,
    file: &Path,
) -> Result<(&'a Frame, &'a MappingInfo)> {
    let frame = first_leaf(samples, function);
    let mapping = frame
        .mapping
        .as_ref()
        .context("leaf frame has no mapping")?;
    ensure!(
        Path::new(&mapping.filename) == file.canonicalize()?,
        "leaf {function} mapped from {:?}, not {}: {frame}",
        mapping.filename,
        file.display()
    );
    Ok((frame, mapping))
}

/// The leaf frame's real function (outermost line), or "" when the sample has none.
fn leaf_function(sample: &DetailedSample) -> &str {
    sample.leaf().and_then(Frame::function).unwrap_or("")
}

/// The real function of the leaf's caller, or "".
fn caller_function(sample: &DetailedSample) -> &str {
    sample.frames.get(1).and_then(Frame::function).unwrap_or("")
}

/// True when `line` is in `function`, in a file whose path ends with `file`, at line `number`.
fn line_is(line: &LineInfo, function: &str, file: &str, number: i64) -> bool {
    line.function == function && line.file.ends_with(file) && line.line == number
}

/// The first leaf frame of `function`, for assertions on what all of them share (mapping).
fn first_leaf<'a>(samples: &'a [DetailedSample], function: &str) -> &'a Frame {
    samples
        .iter()
        .filter_map(DetailedSample::leaf)
        .find(|f| f.function() == Some(function))
        .unwrap_or_else(|| {
            panic!(
                "no leaf frame is {function}; heaviest stacks:\n{}",
                describe_stacks(samples, 8)
            )
        })
}

/// True when `name` ends with a Rust legacy symbol hash, `::h` and 16 hex digits.
fn has_rust_hash(name: &str) -> bool {
    name.rsplit_once("::h")
        .is_some_and(|(_, h)| h.len() == 16 && h.chars().all(|c| c.is_ascii_hexdigit()))
}

#[test]
fn inlined_function_and_its_call_site_are_both_named() -> Result<()> {
    let source = workload_source("inline.c");
    let loop_line = marked_line(&source, "/* LOOP_LINE */")?;
    let call_line = marked_line(&source, "/* CALL_LINE */")?;
    let program = build_workload("inline", C_FLAGS)?;
    let workload = Workload::start(&program, &["20"])?;
    let samples = record_samples(workload.pid(), "inline")?;

    // The loop's instructions belong to spin_caller, but DWARF says they are inlined_spin's
    // loop line, inlined at spin_caller's call line: two lines, innermost first.
    assert_share(
        &samples,
        MOST,
        &format!("leaf = [inlined_spin inline.c:{loop_line}, spin_caller inline.c:{call_line}]"),
        |s| {
            s.leaf().is_some_and(|f| match &f.lines[..] {
                [inner, outer] => {
                    line_is(inner, "inlined_spin", "workloads/inline.c", loop_line)
                        && line_is(outer, "spin_caller", "workloads/inline.c", call_line)
                }
                _ => false,
            })
        },
    );
    let frame = first_leaf(&samples, "spin_caller");
    // C names are not mangled: the system name is the name.
    for line in &frame.lines {
        assert_eq!(line.system_name, line.function, "{frame}");
    }
    let mapping = frame
        .mapping
        .as_ref()
        .context("leaf frame has no mapping")?;
    assert!(
        mapping.has_functions
            && mapping.has_filenames
            && mapping.has_line_numbers
            && mapping.has_inline_frames,
        "mapping of {frame} does not claim functions, files, lines and inline frames: {mapping:?}"
    );
    assert!(
        mapping.filename.ends_with("/inline"),
        "leaf mapping is {}",
        mapping.filename
    );

    // The reference reader sees the inlined function at its own line.
    let top = go_pprof(&["-top", "-lines"], &work_dir().join("inline.pb.gz"))?;
    assert!(
        top.contains("inlined_spin") && top.contains(&format!("inline.c:{loop_line}")),
        "{top}"
    );
    drop(workload);
    Ok(())
}

/// Builds `debuginfo.c` into `dir/debuginfo`, moves its DWARF and symbols into
/// `dir/debuginfo.debug` (linked from the binary with `debuglink`) and checks that the binary
/// really has no symbols or DWARF left. Returns the binary and the debug file.
fn build_stripped_debuginfo(dir: &Path, debuglink: bool) -> Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let binary = compile(
        "gcc",
        &workload_source("debuginfo.c"),
        &dir.join("debuginfo"),
        C_FLAGS,
        &[],
    )?;
    let debug = split_debug_info(&binary, debuglink)?;
    let sections = section_names(&binary)?;
    ensure!(
        !sections
            .iter()
            .any(|s| s == ".symtab" || s.starts_with(".debug_")),
        "{} still has symbols or DWARF: {sections:?}",
        binary.display()
    );
    ensure!(
        sections.iter().any(|s| s == ".gnu_debuglink") == debuglink,
        "{}: .gnu_debuglink {} expected: {sections:?}",
        binary.display(),
        if debuglink { "is" } else { "is not" }
    );
    let debug_sections = section_names(&debug)?;
    ensure!(
        debug_sections.iter().any(|s| s == ".symtab")
            && debug_sections.iter().any(|s| s == ".debug_info"),
        "{} lacks .symtab or .debug_info: {debug_sections:?}",
        debug.display()
    );
    Ok((binary, debug))
}

/// The assertions both debug-file tests share: the stripped binary's hot function and its
/// caller are named, with the file and line of the loop.
fn assert_named_from_debug_file(samples: &[DetailedSample], binary: &Path) -> Result<()> {
    let loop_line = marked_line(&workload_source("debuginfo.c"), "/* LOOP_LINE */")?;
    assert_share(
        samples,
        MOST,
        &format!("leaf = debug_only_spin debuginfo.c:{loop_line}"),
        |s| {
            s.leaf().is_some_and(|f| {
                f.lines.last().is_some_and(|l| {
                    line_is(l, "debug_only_spin", "workloads/debuginfo.c", loop_line)
                })
            })
        },
    );
    assert_share(samples, MOST, "caller = debug_only_caller", |s| {
        caller_function(s) == "debug_only_caller"
    });
    let (frame, mapping) = leaf_in_file(samples, "debug_only_spin", binary)?;
    assert!(
        mapping.has_functions && mapping.has_filenames && mapping.has_line_numbers,
        "mapping of {frame} does not claim functions, files and lines: {mapping:?}"
    );
    assert_eq!(mapping.build_id, gnu_build_id(binary)?, "{frame}");
    Ok(())
}

/// Where debuggers look for the debug file of the binary with `build_id`:
/// `/usr/lib/debug/.build-id/<first two hex digits>/<the rest>.debug`.
fn build_id_debug_path(build_id: &str) -> Result<PathBuf> {
    ensure!(build_id.len() > 2, "build id {build_id:?} is too short");
    Ok(Path::new("/usr/lib/debug/.build-id")
        .join(&build_id[..2])
        .join(format!("{}.debug", &build_id[2..])))
}

#[test]
fn stripped_binary_is_named_from_its_debuglink_file() -> Result<()> {
    let dir = work_dir().join("debuglink");
    let (binary, _debug) = build_stripped_debuginfo(&dir, true)?;
    // The build-id test builds the same binary; its debug file must not be installed, or this
    // test would not show that the debuglink alone is enough.
    let by_build_id = build_id_debug_path(&gnu_build_id(&binary)?)?;
    ensure!(
        !by_build_id.exists(),
        "{} exists: remove it (left by a killed build-id test?)",
        by_build_id.display()
    );
    let workload = Workload::start(&binary, &["20"])?;
    let samples = record_samples(workload.pid(), "debuglink")?;
    assert_named_from_debug_file(&samples, &binary)?;
    drop(workload);
    Ok(())
}

#[test]
fn stripped_binary_is_named_from_its_build_id_debug_file() -> Result<()> {
    let dir = work_dir().join("buildid");
    let (binary, debug) = build_stripped_debuginfo(&dir, false)?;
    // Only the build id leads to the debug file: nothing next to the binary, no debuglink.
    let installed = build_id_debug_path(&gnu_build_id(&binary)?)?;
    let store = installed.parent().context("no directory")?;
    // A file already there can only be this very binary's debug file, left by a run that was
    // killed before its cleanup: the build id is a hash of the binary. Overwriting it is safe.
    let mut cleanup = Cleanup::new();
    cleanup.create_dir_all(store)?;
    cleanup.file(&installed);
    std::fs::copy(&debug, &installed)
        .with_context(|| format!("installing {}", installed.display()))?;
    std::fs::remove_file(&debug)?;

    let workload = Workload::start(&binary, &["20"])?;
    let samples = record_samples(workload.pid(), "buildid")?;
    assert_named_from_debug_file(&samples, &binary)?;
    drop(workload);
    drop(cleanup);
    assert!(
        !installed.exists(),
        "{} was not removed",
        installed.display()
    );
    Ok(())
}

#[test]
fn rust_names_are_demangled_without_hash() -> Result<()> {
    let program = build_rust_workload("rustwork")?;
    let workload = Workload::start(&program, &["20"])?;
    let samples = record_samples(workload.pid(), "rustwork")?;

    const SPIN: &str = "rustwork::outer::inner::spin";
    const GENERIC: &str = "rustwork::outer::inner::spin_generic";
    // Legacy mangling has no generic arguments; v0 would add `::<u32>`.
    let is_generic = |name: &str| name == GENERIC || name.starts_with(&format!("{GENERIC}::<"));
    assert_share(&samples, 0.25, SPIN, |s| leaf_function(s) == SPIN);
    assert_share(&samples, 0.25, GENERIC, |s| is_generic(leaf_function(s)));
    assert_share(&samples, MOST, "caller = rustwork::main", |s| {
        caller_function(s) == "rustwork::main"
    });

    // The mangled name is kept beside the demangled one, and the file is the workload's.
    let frame = first_leaf(&samples, SPIN);
    let line = frame.lines.last().context("no lines")?;
    assert!(
        line.system_name
            .starts_with("_ZN8rustwork5outer5inner4spin")
            || line.system_name.starts_with("_R"),
        "system name of {frame}"
    );
    // The file and line come from the hottest pc's row: a row of line 0 (compiler-made code,
    // with whatever file the row last had) is DWARF's "no source line", and the first sample
    // can land on one.
    let mut by_pc: BTreeMap<u64, (i64, &Frame)> = BTreeMap::new();
    for sample in &samples {
        if let Some(leaf) = sample.leaf().filter(|f| f.function() == Some(SPIN)) {
            by_pc.entry(leaf.address).or_insert((0, leaf)).0 += sample.count;
        }
    }
    let (_, hottest) = by_pc
        .values()
        .max_by_key(|(count, _)| *count)
        .context("no leaf frame is spin")?;
    let line = hottest.lines.last().context("no lines")?;
    assert!(
        line.file.ends_with("workloads/rustwork.rs") && line.line > 0,
        "file:line of the hottest pc of spin, {hottest}"
    );

    // No name from the workload's binary is left mangled or hashed, std's included.
    let binary = program.canonicalize()?;
    let mangled: Vec<String> = samples
        .iter()
        .flat_map(|s| &s.frames)
        .filter(|f| Path::new(f.mapping_file()) == binary)
        .flat_map(|f| &f.lines)
        .map(|l| l.function.clone())
        .filter(|n| n.starts_with("_ZN") || n.starts_with("_R") || has_rust_hash(n))
        .collect();
    assert!(mangled.is_empty(), "mangled or hashed names: {mangled:?}");
    drop(workload);
    Ok(())
}

#[test]
fn cpp_names_are_demangled() -> Result<()> {
    let program = build_cpp_workload("cppwork", C_FLAGS)?;
    let workload = Workload::start(&program, &["20"])?;
    let samples = record_samples(workload.pid(), "cppwork")?;

    const SPIN: &str = "scorch_cpp::Spinner::spin(unsigned long)";
    const RUN: &str = "scorch_cpp::Accumulator<unsigned long>::run(unsigned long)";
    assert_share(&samples, 0.25, SPIN, |s| leaf_function(s) == SPIN);
    assert_share(&samples, 0.25, RUN, |s| leaf_function(s) == RUN);
    assert_share(
        &samples,
        MOST,
        "caller = scorch_cpp::drive(unsigned long)",
        |s| caller_function(s) == "scorch_cpp::drive(unsigned long)",
    );
    for (name, mangled) in [
        (SPIN, "_ZN10scorch_cpp7Spinner4spinEm"),
        (RUN, "_ZN10scorch_cpp11AccumulatorImE3runEm"),
    ] {
        let frame = first_leaf(&samples, name);
        let line = frame.lines.last().context("no lines")?;
        assert_eq!(line.system_name, mangled, "{frame}");
        assert!(
            line.file.ends_with("workloads/cppwork.cpp") && line.line > 0,
            "file:line of {frame}"
        );
    }
    drop(workload);
    Ok(())
}

#[test]
fn shared_library_function_is_named_in_its_mapping() -> Result<()> {
    let library = build_shared_library("libwork", C_FLAGS)?;
    let program = build_workload_linked_to("uselib", C_FLAGS, &library)?;
    let workload = Workload::start(&program, &["20"])?;
    let samples = record_samples(workload.pid(), "uselib")?;

    assert_share(&samples, MOST, "leaf = libwork_spin", |s| {
        leaf_function(s) == "libwork_spin"
    });
    // Unwinding crosses from the library into the executable.
    assert_share(&samples, MOST, "caller = uselib_caller", |s| {
        caller_function(s) == "uselib_caller"
    });
    let (frame, mapping) = leaf_in_file(&samples, "libwork_spin", &library)?;
    assert!(!mapping.build_id.is_empty(), "no build id: {frame}");
    assert_eq!(mapping.build_id, gnu_build_id(&library)?, "{frame}");
    let caller = samples
        .iter()
        .find(|s| caller_function(s) == "uselib_caller")
        .map(|s| &s.frames[1])
        .context("no uselib_caller frame")?;
    assert_eq!(
        Path::new(caller.mapping_file()),
        program.canonicalize()?,
        "{caller}"
    );
    drop(workload);
    Ok(())
}

/// Where the mount-namespace test's binary appears, in its namespace only.
const NS_DIR: &str = "/opt/scorch-only-in-ns";

#[test]
fn process_in_another_mount_namespace_is_named() -> Result<()> {
    let program = build_workload("calltree", C_FLAGS)?;
    let private = work_dir().join("mount-ns");
    std::fs::create_dir_all(&private)?;
    std::fs::copy(&program, private.join("prog"))?;
    ensure!(
        !Path::new(NS_DIR).exists(),
        "{NS_DIR} exists on the host; the test needs a path only the namespace has"
    );
    ensure!(Path::new("/opt").is_dir(), "/opt is missing on the host");

    // In a private mount namespace: a tmpfs over /opt first, so the mount point is created in
    // the namespace's tmpfs and not in the host's /opt; then the program's directory on it.
    // The shell execs the program, so it keeps unshare's PID; it is looked up by its command
    // line all the same, which a unique last argument makes unambiguous.
    let tag = format!("scorch-mount-ns-test-{}", std::process::id());
    let prog = format!("{NS_DIR}/prog");
    let script = format!(
        "mount -t tmpfs scorch-test /opt && mkdir {NS_DIR} && mount --bind \"$1\" {NS_DIR} \
         && exec {prog} 1 20 \"$2\""
    );
    let mut workload = Workload::start(
        Path::new("unshare"),
        &[
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
            "sh",
            private.to_str().context("work directory is not UTF-8")?,
            &tag,
        ],
    )?;
    let started = std::time::Instant::now();
    let pid = loop {
        if let [pid] = pids_with_cmdline(&[&prog, "1", "20", &tag])[..] {
            break pid;
        }
        if let Some(status) = workload.child.try_wait()? {
            bail!("unshare exited ({status}) before running {prog}: see its stderr above");
        }
        ensure!(
            started.elapsed() < Duration::from_secs(10),
            "{prog} did not start in 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let _kill = KillOnDrop(pid);
    ensure!(
        !Path::new(NS_DIR).exists(),
        "{NS_DIR} appeared on the host: the namespace leaked"
    );
    let samples = record_samples(pid, "mount-ns")?;

    let leaves = ["leaf_a", "leaf_b", "leaf_c"];
    assert_share(&samples, MOST, "leaf = leaf_a/b/c", |s| {
        leaves.contains(&leaf_function(s))
    });
    assert_share(&samples, MOST, "stack through dispatch", |s| {
        s.frames.iter().any(|f| f.function() == Some("dispatch"))
    });
    for leaf in leaves {
        let frame = first_leaf(&samples, leaf);
        let mapping = frame
            .mapping
            .as_ref()
            .context("leaf frame has no mapping")?;
        assert_eq!(mapping.filename, prog, "{frame}");
        assert_eq!(mapping.build_id, gnu_build_id(&program)?, "{frame}");
    }
    drop(workload);
    Ok(())
}

#[test]
fn process_that_exits_during_the_recording_is_named() -> Result<()> {
    let program = build_workload("shortlived", C_FLAGS)?;
    let path = work_dir().join("shortlived.pb.gz");
    // System-wide (its PID is not known in advance), short windows so the process is seen
    // while it runs; it starts 0.5 s in and exits 1.5 s later, well before the 4 s end.
    let recording = BackgroundRecording::start(&[
        "record",
        "-F",
        "199",
        "--duration",
        "4s",
        "--window",
        "1s",
        "-o",
        path.to_str().context("work directory is not UTF-8")?,
    ])?;
    std::thread::sleep(Duration::from_millis(500));
    let mut child = Command::new(&program).arg("1500").spawn()?;
    let pid = i64::from(child.id());
    let status = child.wait()?;
    ensure!(status.success(), "shortlived failed: {status}");
    let output = recording.finish()?;
    println!("{}", parse_record_output(&output)?.summary);

    let samples: Vec<DetailedSample> = detailed_samples(&read_pprof(&path)?)
        .into_iter()
        .filter(|s| s.comm == "shortlived")
        .collect();
    let total: i64 = samples.iter().map(|s| s.count).sum();
    assert!(
        total > 100,
        "only {total} samples named shortlived over its 1.5 s at 199 Hz"
    );
    assert!(
        samples.iter().all(|s| s.pid == pid),
        "comm shortlived under other PIDs than {pid}:\n{}",
        describe_stacks(&samples, 8)
    );
    assert_share(&samples, MOST, "leaf = short_spin", |s| {
        leaf_function(s) == "short_spin"
    });
    assert_share(&samples, MOST, "caller = short_run", |s| {
        caller_function(s) == "short_run"
    });
    Ok(())
}

#[test]
fn jit_frames_are_named_from_the_perf_map() -> Result<()> {
    let program = build_workload("jit", C_FLAGS)?;
    let workload = Workload::start(&program, &["20"])?;
    let pid = workload.pid();
    let map = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    let mut cleanup = Cleanup::new();
    cleanup.file(&map);
    // The workload writes its map before it starts calling the generated code.
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(&map).is_ok_and(|m| m.contains(" jit_hot_loop\n")) {
        ensure!(
            started.elapsed() < Duration::from_secs(10),
            "{} was not written",
            map.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let samples = record_samples(pid, "jit")?;

    assert_share(&samples, MOST, "leaf = jit_hot_loop", |s| {
        s.leaf().and_then(Frame::innermost) == Some("jit_hot_loop")
    });
    // The generated code keeps a frame pointer, so the stack goes on through C.
    assert_share(&samples, MOST, "caller = call_jit", |s| {
        caller_function(s) == "call_jit"
    });
    drop(workload);
    drop(cleanup);
    assert!(!map.exists(), "{} was not removed", map.display());
    Ok(())
}

/// `--symbolize none` leaves user frames to a server: addresses, mappings and build ids, no
/// names; kernel frames are still named, since no server has this machine's kallsyms.
#[test]
fn symbolize_none_keeps_addresses_mappings_and_build_ids() -> Result<()> {
    let program = build_workload("calltree", C_FLAGS)?;
    let workload = Workload::start(&program, &["1", "20"])?;
    let path = work_dir().join("symbolize-none.pb.gz");
    let output = record_pid_to(workload.pid(), 3, &path, &["--symbolize", "none"])?;
    println!("{}", parse_record_output(&output)?.summary);
    let samples = detailed_samples(&read_pprof(&path)?);
    let user_frames: Vec<&Frame> = samples
        .iter()
        .flat_map(|s| &s.frames)
        .filter(|f| f.mapping_file() != "[kernel.kallsyms]")
        .collect();
    ensure!(!user_frames.is_empty(), "no user frames");
    for frame in &user_frames {
        ensure!(
            frame.lines.is_empty(),
            "user frame named under --symbolize none: {frame}"
        );
    }
    let in_binary: Vec<&&Frame> = user_frames
        .iter()
        .filter(|f| f.mapping_file() == program.to_str().unwrap_or_default())
        .collect();
    ensure!(!in_binary.is_empty(), "no frame in {}", program.display());
    let mapping = in_binary[0].mapping.as_ref().context("mapping")?;
    ensure!(
        mapping.build_id == gnu_build_id(&program)?,
        "build id {:?}",
        mapping.build_id
    );
    ensure!(
        !mapping.has_functions && !mapping.has_line_numbers,
        "{mapping:?}"
    );
    Ok(())
}

/// A binary built without frame pointers gives one- or two-frame user stacks; scorch says so
/// and names the binary.
#[test]
fn binary_without_frame_pointers_is_named_in_a_hint() -> Result<()> {
    let program = compile(
        "gcc",
        &workload_source("calltree.c"),
        &work_dir().join("calltree-nofp"),
        &["-O2", "-fomit-frame-pointer"],
        &["-lpthread"],
    )?;
    let workload = Workload::start(&program, &["1", "20"])?;
    let path = work_dir().join("nofp.pb.gz");
    // With frame pointers only (`--unwind fp`, scorch before unwind tables): by default the
    // tables unwind this binary whole, and there is nothing to hint.
    let output = record_pid_to(workload.pid(), 3, &path, &["--unwind", "fp"])?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        stderr
            .lines()
            .any(|l| l.contains(program.to_str().unwrap_or_default())
                && l.contains("probably built without frame pointers")),
        "no frame-pointer hint naming {}:\n{stderr}",
        program.display()
    );
    // The same workload with frame pointers draws no hint.
    let program = build_workload("calltree", C_FLAGS)?;
    let workload = Workload::start(&program, &["1", "20"])?;
    let output = record_pid_to(workload.pid(), 2, &path, &[])?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        !stderr.contains("without frame pointers"),
        "spurious hint:\n{stderr}"
    );
    Ok(())
}
