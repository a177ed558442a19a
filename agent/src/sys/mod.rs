//! The operating system beneath every stage: capabilities, systemd notification, the
//! allocator, files, clocks, retry pacing, the `bpf(2)` calls aya lacks and the kernel's
//! query of a process's mappings. Imports nothing else of the crate.

pub mod allocator;
pub mod backoff;
pub mod bpf_batch;
pub mod btf;
pub mod fs;
pub mod hex;
pub mod inner_maps;
pub mod memory;
pub mod notify;
pub mod procmap;
pub mod privileges;
pub mod sigbus;
pub mod time;
pub mod untrusted;

/// This boot's id (`/proc/sys/kernel/random/boot_id`), which names what the agent keeps in
/// its runtime directory for one boot only; `None` when `/proc` does not say.
pub fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(id.trim().to_owned()).filter(|id| !id.is_empty())
}

/// How many processes exist now (the numeric entries of `/proc`), to size the unwinder's maps.
pub fn running_processes() -> usize {
    std::fs::read_dir("/proc").map_or(0, |entries| {
        entries
            .filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.parse::<u32>().is_ok())
            })
            .count()
    })
}
