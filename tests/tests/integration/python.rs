//! CPython interpreters as the distributions ship them: Debian 12's python3.11 (the host's),
//! Debian 13's python3.13 and unstable's python3.14, recognised from their binaries with
//! what the BPF walk needs.

use anyhow::{ensure, Context, Result};
use scorch::runtimes::{
    image::Image,
    python::{interpreter, EntryMark},
};
use scorch_tests::debian::unpacked_package;

struct Expected {
    minor: u8,
    /// FRAME_OWNED_BY_CSTACK and where `owner` is (3.11 marks entry frames otherwise).
    entry: EntryMark,
    code_tag_bits: u64,
}

fn check(binary: &std::path::Path, expected: Expected) -> Result<()> {
    let data = std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    let image = Image::parse(&data)?;
    let found = interpreter(&image)
        .with_context(|| format!("{}", binary.display()))?
        .with_context(|| format!("{} is not recognised as CPython", binary.display()))?;
    println!("{}: {found:x?}", binary.display());
    ensure!(
        found.version.major == 3 && found.version.minor == expected.minor,
        "{found:?}"
    );
    ensure!(found.offsets.entry == expected.entry, "{found:?}");
    ensure!(
        found.offsets.code_tag_bits == expected.code_tag_bits,
        "{found:?}"
    );
    let runtime = found.runtime.address..found.runtime.address + found.runtime.size;
    ensure!(runtime.contains(&found.thread_key), "{found:x?}");
    // The eval loop and the part GCC split off it: on 3.14 that part is most of the loop.
    let eval = image
        .symbol("_PyEval_EvalFrameDefault")
        .context("eval symbol")?;
    ensure!(found.eval.len() == 2, "{:x?}", found.eval);
    ensure!(
        found
            .eval
            .contains(&(eval.address..eval.address + eval.size)),
        "{:x?}",
        found.eval
    );
    let split: u64 = found
        .eval
        .iter()
        .filter(|r| r.start != eval.address)
        .map(|r| r.end - r.start)
        .sum();
    ensure!(split > 2048, "{:x?}", found.eval);
    Ok(())
}

#[test]
fn distribution_interpreters_are_recognised_from_their_binaries() -> Result<()> {
    check(
        std::path::Path::new("/usr/bin/python3.11"),
        Expected {
            minor: 11,
            entry: EntryMark::IsEntry(68),
            code_tag_bits: 0,
        },
    )?;
    let trixie = unpacked_package("trixie", "python3.13-minimal")?;
    check(
        &trixie.join("usr/bin/python3.13"),
        Expected {
            minor: 13,
            entry: EntryMark::CStackOwner {
                offset: 70,
                value: 3,
            },
            code_tag_bits: 0,
        },
    )?;
    let sid = unpacked_package("sid", "python3.14-minimal")?;
    check(
        &sid.join("usr/bin/python3.14"),
        Expected {
            minor: 14,
            entry: EntryMark::CStackOwner {
                offset: 74,
                value: 4,
            },
            code_tag_bits: 7,
        },
    )?;
    Ok(())
}
