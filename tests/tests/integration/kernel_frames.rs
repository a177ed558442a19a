//! A kernel-heavy workload: its kernel frames come out named from /proc/kallsyms.

use scorch_tests::*;

#[test]
fn kernel_frames_are_symbolized() -> anyhow::Result<()> {
    let program = build_workload("readzero", &["-O2", "-fno-omit-frame-pointer"])?;
    let workload = Workload::start(&program, &["20"])?;
    let path = work_dir().join("readzero.pb.gz");
    let output = record_pid_to(workload.pid(), 4, &path, &[])?;
    println!("{}", parse_record_output(&output)?.summary);

    let profile = read_pprof(&path)?;
    let samples = named_samples(&profile);
    let total: i64 = samples.iter().map(|s| s.count).sum();
    assert!(total > 400, "only {total} samples");
    // Most time is in the kernel, and those frames have names, not addresses.
    let in_kernel: i64 = samples
        .iter()
        .filter(|s| s.kernel.first() == Some(&true))
        .map(|s| s.count)
        .sum();
    assert!(
        in_kernel * 2 > total,
        "{in_kernel} of {total} samples in the kernel"
    );
    let named_kernel_frames = samples
        .iter()
        .flat_map(|s| s.frames.iter().zip(&s.kernel))
        .filter(|(_, &kernel)| kernel)
        .filter(|(name, _)| !name.starts_with("0x"))
        .count();
    let all_kernel_frames = samples
        .iter()
        .flat_map(|s| &s.kernel)
        .filter(|&&k| k)
        .count();
    assert!(
        named_kernel_frames * 100 >= all_kernel_frames * 99,
        "{named_kernel_frames} of {all_kernel_frames} kernel frames named"
    );
    // The read path is there by name, below the user-space read() call.
    let read_path: i64 = samples
        .iter()
        .filter(|s| s.frames.iter().any(|f| f == "vfs_read" || f == "ksys_read"))
        .map(|s| s.count)
        .sum();
    assert!(
        read_path * 2 > total,
        "vfs_read/ksys_read in only {read_path} of {total}"
    );
    let top = go_pprof(&["-top"], &path)?;
    assert!(
        top.contains("vfs_read") || top.contains("ksys_read"),
        "{top}"
    );
    Ok(())
}
