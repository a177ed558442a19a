//! A JIT's perf map (`/tmp/perf-PID.map`), read inside the process's root.

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use crate::sys::untrusted;

/// Largest perf map read: JITs of big applications write tens of MiB; anything beyond this is
/// not a symbol map but an attempt to exhaust the daemon.
pub const MAX_PERF_MAP_BYTES: u64 = 64 << 20;

/// A JIT's symbol map, `/tmp/perf-PID.map`: one `START SIZE name` line (hex) per function.
#[derive(Debug, Default)]
pub struct PerfMap {
    /// (start, end, name), sorted by start.
    entries: Vec<(u64, u64, String)>,
}

impl PerfMap {
    /// Reads the map of `pid` inside its own root, under the PID its own namespace gives it.
    ///
    /// The file is the process's to write, so it is opened as untrusted: a FIFO, a device or a
    /// symlink there is refused without blocking, and a map above [`MAX_PERF_MAP_BYTES`] is not
    /// read. As perf does, a map owned by neither the process's user nor root is ignored: in a
    /// shared `/tmp` another user could otherwise name this process's JIT frames.
    pub fn read(pid: u32) -> Option<PerfMap> {
        let ns_pid = namespace_pid(pid).unwrap_or(pid);
        let root = PathBuf::from(format!("/proc/{pid}/root"));
        let relative = format!("tmp/perf-{ns_pid}.map");
        let mut opened = match untrusted::open_in_root(&root, Path::new(&relative)) {
            Ok(opened) => opened,
            Err(err) => {
                tracing::debug!("perf map of process {pid}: {err}");
                return None;
            }
        };
        let owner = opened.file.metadata().ok()?.uid();
        if owner != 0 && Some(owner) != process_uid(pid) {
            tracing::debug!(
                "perf map {}: owned by uid {owner}, not by process {pid}'s user; ignored",
                opened.path.display()
            );
            return None;
        }
        let bytes = match untrusted::read_bounded(&mut opened, MAX_PERF_MAP_BYTES) {
            Ok(bytes) => bytes,
            Err(err) => {
                tracing::debug!("perf map of process {pid}: {err}");
                return None;
            }
        };
        Some(PerfMap::parse(&String::from_utf8_lossy(&bytes)))
    }

    /// Parses perf map text; malformed lines are skipped (JITs write these files live).
    pub fn parse(text: &str) -> PerfMap {
        let mut entries: Vec<(u64, u64, String)> = text
            .lines()
            .filter_map(|line| {
                let mut fields = line.splitn(3, ' ');
                let start =
                    u64::from_str_radix(fields.next()?.trim_start_matches("0x"), 16).ok()?;
                let size = u64::from_str_radix(fields.next()?.trim_start_matches("0x"), 16).ok()?;
                let name = fields.next()?.trim();
                (!name.is_empty()).then(|| (start, start.saturating_add(size), name.to_owned()))
            })
            .collect();
        entries.sort_by_key(|e| e.0);
        PerfMap { entries }
    }

    pub fn lookup(&self, address: u64) -> Option<&str> {
        // Later lines win when a JIT reuses memory: search backwards from the last start <=
        // address among entries that still cover it.
        let end = self.entries.partition_point(|e| e.0 <= address);
        self.entries[..end]
            .iter()
            .rev()
            .find(|e| address < e.1)
            .map(|e| e.2.as_str())
    }
}

/// The effective user of `pid` (second `Uid` field of its status).
fn process_uid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The PID of `pid` inside its own PID namespace (last `NSpid` field), used in perf map names.
fn namespace_pid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_maps_name_jit_code() {
        let map = PerfMap::parse(
            "7f0000001000 40 jit_hot_loop\n7f0000002000 0x10 LazyCompile:*foo bar.js:1\nbad line\n7f0000001020 8 reused\n",
        );
        assert_eq!(map.lookup(0x7f0000001000), Some("jit_hot_loop"));
        assert_eq!(map.lookup(0x7f000000103f), Some("jit_hot_loop"));
        // A later entry inside an earlier one wins (the JIT reused the memory).
        assert_eq!(map.lookup(0x7f0000001024), Some("reused"));
        assert_eq!(map.lookup(0x7f0000001040), None);
        assert_eq!(
            map.lookup(0x7f0000002008),
            Some("LazyCompile:*foo bar.js:1")
        );
        assert_eq!(map.lookup(0x1000), None);
    }
}
