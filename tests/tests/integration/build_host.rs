//! A build host's pattern, in small: a process maps a library with a very large unwind table
//! (a compiler's libLLVM), runs, and exits. The row pools grow for its table while it runs,
//! then shrink back once the table has been idle its grace period, and a process that ran
//! throughout keeps being walked with its own rows, wherever they were moved.

use std::{
    fmt::Write as _,
    path::PathBuf,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{ensure, Context, Result};
use scorch_tests::{
    build_workload, build_workload_linked_to, compile, metric, query_folded, wait_for, work_dir,
    Daemon, Workload,
};

/// Functions in the generated library, and push/pop pairs in each: two rows a pair, about a
/// million rows in all.
const FUNCTIONS: usize = 2000;
const PAIRS: usize = 250;

/// Bytes of an unwind row in the pools.
const ROW_BYTES: f64 = 8.0;

/// Writes and assembles `libbigtable.so`: each function's CFI moves the CFA at every push and
/// pop, so its table has a row for each.
fn big_library() -> Result<PathBuf> {
    let mut source = String::from(".text\n");
    for i in 0..FUNCTIONS {
        write!(
            source,
            ".globl big_{i}\n.type big_{i},@function\nbig_{i}:\n.cfi_startproc\n\
             .rept {PAIRS}\npush %rbx\n.cfi_adjust_cfa_offset 8\npop %rbx\n\
             .cfi_adjust_cfa_offset -8\n.endr\nret\n.cfi_endproc\n.size big_{i},.-big_{i}\n"
        )?;
    }
    source.push_str(".section .note.GNU-stack,\"\",@progbits\n");
    let asm = work_dir().join("libbigtable.s");
    std::fs::write(&asm, source)?;
    compile(
        "gcc",
        &asm,
        &work_dir().join("libbigtable.so"),
        &["-shared"],
        &[],
    )
}

#[test]
fn row_pools_grown_for_a_large_table_shrink_back_after_it() -> Result<()> {
    let library = big_library()?;
    let big = build_workload_linked_to("bigtable", &["-O2"], &library)?;
    // Walked by its tables only: no frame pointers.
    let neighbour = build_workload("calltree", &["-O2", "-fomit-frame-pointer", "-g"])?;
    let _neighbour = Workload::start(&neighbour, &["1", "300"])?;
    let store = work_dir().join("build-host-store");
    let _ = std::fs::remove_dir_all(&store);
    let daemon = Daemon::start(&store, &["--window", "1s", "--frequency", "99"])?;
    let address = daemon.address.clone();
    let pools = || metric(&address, "scorch_unwind_row_pools_bytes");
    wait_for("the neighbour's tables", Duration::from_secs(20), &|| {
        Ok(metric(&address, "scorch_unwind_tables_loaded")? >= 2.0)
    })?;
    std::thread::sleep(Duration::from_secs(2));
    let tables = || metric(&address, "scorch_unwind_tables_bytes");
    let before = pools()?;
    let tables_before = tables()?;

    // The "compiler": its table alone needs a pool of its own.
    let compiler = Workload::start(&big, &["8"])?;
    let table = (FUNCTIONS * PAIRS * 2) as f64 * ROW_BYTES;
    wait_for("the pools to grow", Duration::from_secs(20), &|| {
        Ok(pools()? >= before + 0.9 * table)
    })
    .with_context(|| {
        format!(
            "row pools {:?} bytes, {before} before; tables {:?} bytes",
            pools().ok(),
            metric(&address, "scorch_unwind_tables_bytes").ok()
        )
    })?;
    let grown = pools()?;
    drop(compiler);
    let ended = Instant::now();

    // Back after the grace periods (the idle table's 30 s, a sparse pool's 10 s, a window to
    // notice): the large table's pool given back, and the pools no larger than before but for
    // the tables other processes loaded meanwhile (this test's own, when it is sampled), which
    // a pool holds at a quarter at least.
    let given_back = || metric(&address, "scorch_unwind_row_pools_given_back_bytes_total");
    wait_for("the pools to shrink back", Duration::from_secs(60), &|| {
        let others = (tables()? - tables_before).max(0.0);
        Ok(given_back()? >= 0.9 * table && pools()? <= before + 4.0 * others + 1048576.0)
    })
    .with_context(|| {
        let metric = |name| metric(&address, name).ok();
        format!(
            "row pools {:?} bytes, {before} before, {grown} grown; tables {:?} bytes, {:?} \
             loaded, {:?} idle, {:?} moved; {:?} pools given back",
            pools().ok(),
            metric("scorch_unwind_tables_bytes"),
            metric("scorch_unwind_tables_loaded"),
            metric("scorch_unwind_tables_idle_total"),
            metric("scorch_unwind_tables_moved_total"),
            metric("scorch_unwind_row_pools_given_back_total"),
        )
    })?;
    let after = pools()?;
    let took = ended.elapsed();
    let given_back = given_back()?;
    println!(
        "row pools: {:.1} MiB before, {:.1} MiB with the large table, {:.1} MiB {:.0} s after \
         it exited, holding {:.1} MiB of tables (other processes' loaded since: {:.1} MiB); \
         {:.1} MiB given back",
        before / 1048576.0,
        grown / 1048576.0,
        after / 1048576.0,
        took.as_secs_f64(),
        tables()? / 1048576.0,
        (tables()? - tables_before).max(0.0) / 1048576.0,
        given_back / 1048576.0
    );

    // The neighbour, walked after the shrink: every leaf under its own caller.
    let from = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)?
        .as_secs()
        + 1;
    let written = metric(&address, "scorch_windows_written_total")?;
    wait_for("windows after the shrink", Duration::from_secs(20), &|| {
        Ok(metric(&address, "scorch_windows_written_total")? >= written + 5.0)
    })?;
    let (status, _, stderr) = daemon.stop()?;
    ensure!(status.success(), "{stderr}");
    let folded = query_folded(
        &store,
        &["--from", &from.to_string()],
        r#"{comm="calltree"}"#,
    )?;
    let mut leaves = 0u64;
    for line in folded.lines() {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            continue;
        };
        for (leaf, caller) in [
            ("leaf_a", "run_a"),
            ("leaf_b", "run_b"),
            ("leaf_c", "run_c"),
        ] {
            if stack.ends_with(&format!(";{leaf}")) {
                ensure!(
                    stack.ends_with(&format!("dispatch;{caller};{leaf}")),
                    "after the shrink, {leaf} walked as {stack}"
                );
                leaves += count.parse::<u64>().unwrap_or(0);
            }
        }
    }
    ensure!(
        leaves > 100,
        "only {leaves} samples of the neighbour's leaves after the shrink:\n{folded}"
    );
    Ok(())
}
