//! What the BPF side costs the kernel: the program's run time and run count (counted by the
//! kernel only while `kernel.bpf_stats_enabled` is 1) and the memory of the maps this process
//! holds. The daemon publishes both on `/metrics`; `scorch record` prints the per-sample time.

use std::{io, path::Path};

/// Bytes of kernel memory charged to the BPF maps this process holds: the sum of `memlock:`
/// over the map descriptors in `/proc/self/fdinfo` (what `bpftool map show` reports as
/// `memlock`), each map once however many descriptors refer to it (the user-stack maps have a
/// second one, for reading Python stacks mid-window). Every map counts, whichever part of the
/// agent created it.
pub fn bpf_map_memory() -> io::Result<u64> {
    map_memory_in(Path::new("/proc/self/fdinfo"))
}

fn map_memory_in(fdinfo: &Path) -> io::Result<u64> {
    let mut seen = std::collections::HashSet::new();
    let mut total = 0;
    for entry in std::fs::read_dir(fdinfo)? {
        // A descriptor closed between the listing and the read is simply gone.
        let Ok(text) = std::fs::read_to_string(entry?.path()) else {
            continue;
        };
        if let Some((id, memlock)) = map_memlock(&text) {
            if seen.insert(id) {
                total += memlock;
            }
        }
    }
    Ok(total)
}

/// The `map_id:` and `memlock:` of one fdinfo text if it describes a BPF map (it has a
/// `map_type:` line).
fn map_memlock(fdinfo: &str) -> Option<(u64, u64)> {
    let mut is_map = false;
    let mut memlock = None;
    let mut id = None;
    for line in fdinfo.lines() {
        if line.starts_with("map_type:") {
            is_map = true;
        } else if let Some(value) = line.strip_prefix("memlock:") {
            memlock = value.trim().parse().ok();
        } else if let Some(value) = line.strip_prefix("map_id:") {
            id = value.trim().parse().ok();
        }
    }
    if is_map {
        Some((id?, memlock?))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_maps_count() {
        let map = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\nmap_type:\t1\n\
                   key_size:\t4\nvalue_size:\t8\nmax_entries:\t1024\nmap_flags:\t0x0\n\
                   map_extra:\t0x0\nmemlock:\t90112\nmap_id:\t31\nfrozen:\t0\n";
        assert_eq!(map_memlock(map), Some((31, 90112)));
        let program = "pos:\t0\nflags:\t02000002\nprog_type:\t7\nprog_jited:\t1\n\
                       memlock:\t4096\nprog_id:\t55\nrun_time_ns:\t0\nrun_cnt:\t0\n";
        assert_eq!(map_memlock(program), None);
        assert_eq!(map_memlock("pos:\t0\nflags:\t0100000\n"), None);
    }

    #[test]
    fn a_map_behind_two_descriptors_counts_once() {
        let dir = tempfile::tempdir().unwrap();
        let map =
            |id, memlock| format!("pos:\t0\nmap_type:\t1\nmemlock:\t{memlock}\nmap_id:\t{id}\n");
        std::fs::write(dir.path().join("3"), map(31, 4096)).unwrap();
        std::fs::write(dir.path().join("4"), map(31, 4096)).unwrap();
        std::fs::write(dir.path().join("5"), map(32, 1000)).unwrap();
        assert_eq!(map_memory_in(dir.path()).unwrap(), 5096);
    }

    #[test]
    fn a_process_without_maps_holds_none() {
        // This test process holds no BPF map; its fdinfo is still readable.
        assert_eq!(bpf_map_memory().unwrap(), 0);
    }
}
