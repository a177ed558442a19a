//! Go binaries as they ship: built by Debian 12's Go (1.19, the 1.18 table format) on this
//! host and by Debian 13's (1.24, the 1.20 format) in a root of that release, plainly,
//! stripped with `-ldflags=-s -w` and as stripped PIEs. Stripped, they have no symbol table,
//! no DWARF and no `.eh_frame`: only `.gopclntab`, which names and unwinds them.

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use object::{Object, ObjectSection};
use scorch_tests::{debian::root_filesystem, DetailedSample};

/// A Go toolchain: the host's, or the one in a root filesystem of another release.
pub(crate) enum Go {
    Host,
    Root(PathBuf),
}

impl Go {
    fn trixie() -> Result<Go> {
        Ok(Go::Root(root_filesystem("trixie", &["golang-go"])?))
    }

    fn version(&self) -> Result<String> {
        let output = self.command(&["version"]).output()?;
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }

    /// `go <args>` with a build cache of its own (the root's, inside the root).
    fn command(&self, args: &[&str]) -> std::process::Command {
        let mut command = match self {
            Go::Host => {
                let mut command = std::process::Command::new("go");
                command.env("GOCACHE", scorch_tests::work_dir().join("go-cache"));
                command
            }
            Go::Root(root) => {
                let mut command = std::process::Command::new("chroot");
                command
                    .arg(root)
                    // The root has no /proc: Go finds its GOROOT from this, not its path.
                    .args([
                        "env",
                        "HOME=/tmp",
                        "GOCACHE=/tmp/go-cache",
                        "GOROOT=/usr/lib/go",
                    ])
                    .args(["GOTELEMETRY=off", "go"]);
                command
            }
        };
        command
            .args(args)
            .env("GOFLAGS", "")
            .env("CGO_ENABLED", "0");
        command
    }

    /// Builds `tests/workloads/<name>.go` with `flags` into the work directory as
    /// `<name>-<tag>`.
    pub(crate) fn build(&self, name: &str, tag: &str, flags: &[&str]) -> Result<PathBuf> {
        let source = scorch_tests::workload_source(&format!("{name}.go"));
        let output = scorch_tests::work_dir().join(format!("{name}-{tag}"));
        match self {
            Go::Host => {
                let mut args = vec!["build", "-o"];
                let out = output.to_str().context("work dir not UTF-8")?;
                args.push(out);
                args.extend_from_slice(flags);
                let source = source.to_str().context("source path not UTF-8")?;
                args.push(source);
                scorch_tests::run_tool(&mut self.command(&args))?;
            }
            Go::Root(root) => {
                let inside = format!("/tmp/{name}.go");
                std::fs::copy(&source, root.join(inside.trim_start_matches('/')))?;
                let built = format!("/tmp/{name}-{tag}");
                let mut args = vec!["build", "-o", &built];
                args.extend_from_slice(flags);
                args.push(&inside);
                scorch_tests::run_tool(&mut self.command(&args))?;
                std::fs::copy(root.join(built.trim_start_matches('/')), &output)?;
            }
        }
        Ok(output)
    }
}

/// The three builds of a binary, as images ship them.
const BUILDS: [(&str, &[&str]); 3] = [
    ("plain", &[]),
    ("stripped", &["-ldflags=-s -w"]),
    ("pie", &["-buildmode=pie", "-ldflags=-s -w"]),
];

/// The functions of `tests/workloads/gotree.go` and their share of its CPU time.
const SHARES: [(&str, f64); 6] = [
    ("main.run", 1.0),
    ("main.compute", 0.75),
    ("main.matmul", 0.5),
    ("main.reduce", 0.25),
    ("main.parse", 0.125),
    ("main.digest", 0.125),
];

/// Whether a frame of the sample is `function`'s own machine code (its outermost line).
fn has(sample: &DetailedSample, function: &str) -> bool {
    sample.frames.iter().any(|f| f.function() == Some(function))
}

fn share(samples: &[&DetailedSample], total: i64, test: impl Fn(&DetailedSample) -> bool) -> f64 {
    samples
        .iter()
        .filter(|s| test(s))
        .map(|s| s.count)
        .sum::<i64>() as f64
        / total as f64
}

#[test]
fn go119_builds_plain_stripped_and_pie_give_the_same_call_tree() -> Result<()> {
    call_tree(&Go::Host, "119")
}

#[test]
fn go124_builds_plain_stripped_and_pie_give_the_same_call_tree() -> Result<()> {
    call_tree(&Go::trixie()?, "124")
}

/// The three builds run side by side and recorded together: each function's share in the
/// stripped builds within 3 points of the plain build's (which DWARF and `.symtab` name, and
/// which is checked against the known shares), named in scorch's own output, with file and
/// line, `checksum` shown inlined into `digest`, and the frameless `spin` always under the
/// caller that called it.
fn call_tree(go: &Go, tag: &str) -> Result<()> {
    println!("{}", go.version()?);
    let mut binaries = Vec::new();
    for (build, flags) in BUILDS {
        binaries.push(go.build("gotree", &format!("{tag}-{build}"), flags)?);
    }
    for binary in &binaries[1..] {
        let sections = scorch_tests::section_names(binary)?;
        ensure!(
            !sections
                .iter()
                .any(|s| s == ".symtab" || s.contains("debug") || s == ".eh_frame"),
            "{} is not stripped: {sections:?}",
            binary.display()
        );
    }
    let workloads = binaries
        .iter()
        .map(|binary| scorch_tests::Workload::start(binary, &["40"]))
        .collect::<Result<Vec<_>>>()?;
    std::thread::sleep(std::time::Duration::from_millis(300));
    let pids: Vec<String> = workloads.iter().map(|w| w.pid().to_string()).collect();
    let path = scorch_tests::work_dir().join(format!("go-calltree-{tag}.pb.gz"));
    // At 999 Hz each process gets some 8,000 samples: a share's sampling error is then about
    // half a point, so two builds' shares 3 points apart are a real difference, not chance
    // (at 199 Hz, with 1,500 each, they were 1.6 standard deviations).
    let mut args = vec!["record", "-F", "999", "--duration", "12s", "-o"];
    args.push(path.to_str().context("work dir not UTF-8")?);
    for pid in &pids {
        args.extend(["--pid", pid]);
    }
    let report = scorch_tests::parse_record_output(&scorch_tests::run_scorch(&args)?)?;
    println!("scorch: {}", report.summary);
    drop(workloads);
    let samples = scorch_tests::detailed_samples(&scorch_tests::read_pprof(&path)?);

    let mut tables = String::new();
    let mut shares = Vec::new();
    for ((build, _), pid) in BUILDS.iter().zip(&pids) {
        let ours: Vec<&DetailedSample> = samples
            .iter()
            .filter(|s| s.pid.to_string() == *pid)
            .collect();
        let total: i64 = ours.iter().map(|s| s.count).sum();
        ensure!(
            total > 3000,
            "{build}: only {total} samples: {}",
            report.summary
        );
        let row: Vec<f64> = SHARES
            .iter()
            .map(|(name, _)| share(&ours, total, |s| has(s, name)))
            .collect();
        tables += &format!("{build:>8}: {row:.3?} of {total}\n");
        shares.push(row);

        // `spin` is called by parse, matmul and reduce only: a walk that skipped a frame
        // would show it under compute or run.
        for sample in &ours {
            if let [leaf, caller, ..] = sample.frames.as_slice() {
                if leaf.function() == Some("main.spin") {
                    ensure!(
                        matches!(
                            caller.function(),
                            Some("main.parse" | "main.matmul" | "main.reduce")
                        ),
                        "{build}: spin called from {caller}"
                    );
                }
            }
        }
        // checksum's loop is digest's machine code, named as checksum inlined into digest.
        let digest = share(&ours, total, |s| has(s, "main.digest"));
        let inlined = share(&ours, total, |s| {
            s.frames.iter().any(|f| {
                f.function() == Some("main.digest") && f.innermost() == Some("main.checksum")
            })
        });
        ensure!(
            inlined >= 0.9 * digest,
            "{build}: {inlined:.3} of digest's {digest:.3} show checksum inlined"
        );
        // Every line of the program's own functions has its file and number. A frame may
        // also hold lines of the standard library's functions inlined into them
        // (`syscall.(*Timespec).Nano` into `threadCPUNs`), which are the library's files.
        for sample in &ours {
            for line in sample.frames.iter().flat_map(|f| &f.lines) {
                if line.function.starts_with("main.") {
                    ensure!(
                        line.file.ends_with("gotree.go") && line.line > 0,
                        "{build}: {} at {}:{}",
                        line.function,
                        line.file,
                        line.line
                    );
                }
            }
        }
        // The stripped builds carry their Go build id, which keys the caches and uploads.
        let mapping = ours
            .iter()
            .flat_map(|s| &s.frames)
            .find(|f| f.function() == Some("main.matmul"))
            .and_then(|f| f.mapping.clone())
            .with_context(|| format!("{build}: no main.matmul frame with a mapping"))?;
        ensure!(
            !mapping.build_id.is_empty(),
            "{build}: no build id on {}",
            mapping.filename
        );
    }
    println!("{:?}\n{tables}", SHARES.map(|(name, _)| name));
    for (i, (name, expected)) in SHARES.iter().enumerate() {
        ensure!(
            (shares[0][i] - expected).abs() <= 0.06,
            "the plain build's {name} is {:.3}, not about {expected}:\n{tables}",
            shares[0][i]
        );
        for (b, (build, _)) in BUILDS.iter().enumerate().skip(1) {
            ensure!(
                (shares[b][i] - shares[0][i]).abs() <= 0.03,
                "{build}: {name} differs from the plain build's by more than 3 points:\n{tables}"
            );
        }
    }
    Ok(())
}

/// A stripped binary whose `.gopclntab` header is corrupt (its function count beyond what the
/// table holds; the Go runtime reads its own table through its module data, so the program
/// still runs): its frames go unnamed, never misnamed, and the summary counts why.
#[test]
fn a_corrupt_go_table_leaves_frames_unnamed_and_counted() -> Result<()> {
    let stripped = Go::Host.build("gotree", "119-corrupt", BUILDS[1].1)?;
    let mut bytes = std::fs::read(&stripped)?;
    let offset = {
        let file = object::File::parse(&*bytes)?;
        let section = file
            .section_by_name(".gopclntab")
            .context("no .gopclntab section")?;
        section.file_range().context(".gopclntab has no bytes")?.0 as usize
    };
    // The header: magic, two pads, minLC and ptrSize, then nfunc.
    bytes[offset + 8..offset + 16].copy_from_slice(&u64::MAX.to_le_bytes());
    let corrupt: &Path = &scorch_tests::work_dir().join("gotree-corrupt");
    std::fs::write(corrupt, &bytes)?;
    std::fs::set_permissions(corrupt, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let workload = scorch_tests::Workload::start(corrupt, &["20"])?;
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (profile, report) = scorch_tests::record_pid(workload.pid(), 5, "go-corrupt")?;
    drop(workload);
    println!("scorch: {}", report.summary);
    let samples = scorch_tests::detailed_samples(&profile);
    let total: i64 = samples.iter().map(|s| s.count).sum();
    ensure!(total > 300, "only {total} samples: {}", report.summary);
    let named: Vec<String> = samples
        .iter()
        .flat_map(|s| &s.frames)
        .filter(|f| f.mapping_file().ends_with("gotree-corrupt"))
        .filter(|f| !f.lines.is_empty())
        .map(|f| f.to_string())
        .collect();
    ensure!(named.is_empty(), "named from a corrupt table: {named:?}");
    ensure!(
        report.summary.contains("corrupt Go symbol table"),
        "no counted reason: {}",
        report.summary
    );
    Ok(())
}
