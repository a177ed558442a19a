//! Cgroup paths by id: a sample records its process's cgroup id (`bpf_get_current_cgroup_id`),
//! which is the inode number of the cgroup's directory in the cgroup v2 file system. For a
//! process that exited before /proc/PID/cgroup was read, that id is all there is, and its path
//! (what a container, a systemd unit or a pod is read from) is found by listing the hierarchy.
//!
//! The hierarchy is written by whoever may create cgroups, a container's tenant with a
//! delegated subtree among them: a listing is bounded in directories and depth, runs at most
//! once every [`MIN_LISTING_INTERVAL`] (each a miss for an id created since the last one), and
//! its names are taken as the kernel gives them, never parsed. An id not found stays unnamed.

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// Directories a listing visits at most: hosts run hundreds of cgroups, a Kubernetes node a
/// few thousand; a tenant creating more cannot make a listing cost more than this.
pub const MAX_DIRECTORIES: usize = 20_000;
/// Levels below the root a listing descends at most (the kernel allows deeper, nobody nests
/// this far: kubepods, a QoS class, a pod, a container is four).
pub const MAX_DEPTH: usize = 16;
/// The least time between two listings: an id missing from the last one lists again only
/// after it, so a flood of unknown ids costs one listing a second.
pub const MIN_LISTING_INTERVAL: Duration = Duration::from_secs(1);

/// Cgroup paths by id, from the last listing of the hierarchy.
pub struct CgroupIds {
    /// The cgroup v2 mount, and the path its root has in the hierarchy (`/`, or the
    /// subtree a bind mount or a cgroup namespace shows); `None` without one.
    mount: Option<(PathBuf, String)>,
    paths: HashMap<u64, String>,
    listed: Option<Instant>,
    /// Listings made, for the tests and the counters.
    pub listings: u64,
}

impl CgroupIds {
    /// Finds the cgroup v2 mount in `/proc/self/mountinfo`.
    pub fn new() -> CgroupIds {
        let mount = std::fs::read_to_string("/proc/self/mountinfo")
            .ok()
            .and_then(|text| cgroup2_mount(&text));
        CgroupIds::at(mount)
    }

    /// Over the hierarchy mounted at `mount.0`, whose root is `mount.1` in it.
    pub fn at(mount: Option<(PathBuf, String)>) -> CgroupIds {
        CgroupIds {
            mount,
            paths: HashMap::new(),
            listed: None,
            listings: 0,
        }
    }

    /// The path of the cgroup `id`, as /proc/PID/cgroup writes it: from the last listing, or
    /// from a new one when the last is older than [`MIN_LISTING_INTERVAL`].
    pub fn path(&mut self, id: u64, now: Instant) -> Option<String> {
        if let Some(path) = self.paths.get(&id) {
            return Some(path.clone());
        }
        let (root, prefix) = self.mount.as_ref()?;
        if self
            .listed
            .is_some_and(|at| now.duration_since(at) < MIN_LISTING_INTERVAL)
        {
            return None;
        }
        self.listed = Some(now);
        self.listings += 1;
        self.paths = list(root, prefix);
        self.paths.get(&id).cloned()
    }
}

impl Default for CgroupIds {
    fn default() -> Self {
        CgroupIds::new()
    }
}

/// Every directory under `root` by inode number, as the path `prefix` joined with its path
/// below `root`; bounded by [`MAX_DIRECTORIES`] and [`MAX_DEPTH`]. Unreadable directories
/// are skipped.
fn list(root: &Path, prefix: &str) -> HashMap<u64, String> {
    let mut paths = HashMap::new();
    let Ok(meta) = std::fs::metadata(root) else {
        return paths;
    };
    paths.insert(meta.ino(), prefix.to_owned());
    // Breadth first: when the bound is met, the shallow cgroups (units, containers) are in.
    let mut queue = std::collections::VecDeque::from([(root.to_owned(), prefix.to_owned(), 0)]);
    while let Some((dir, path, depth)) = queue.pop_front() {
        if depth >= MAX_DEPTH {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if paths.len() >= MAX_DIRECTORIES {
                return paths;
            }
            // The entry's own type (no stat): cgroupfs has no symlinks, and none is followed.
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            let child = if path.ends_with('/') {
                format!("{path}{name}")
            } else {
                format!("{path}/{name}")
            };
            paths.insert(meta.ino(), child.clone());
            queue.push_back((entry.path(), child, depth + 1));
        }
    }
    paths
}

/// The first cgroup v2 mount in the text of /proc/self/mountinfo: its mount point and the
/// path of its root in the hierarchy (field 4). Fields are separated by spaces, which the
/// kernel writes as `\040` inside paths.
pub fn cgroup2_mount(mountinfo: &str) -> Option<(PathBuf, String)> {
    mountinfo.lines().find_map(|line| {
        let (mount, rest) = line.split_once(" - ")?;
        if rest.split(' ').next()? != "cgroup2" {
            return None;
        }
        let fields: Vec<&str> = mount.split(' ').collect();
        let (root, point) = (fields.get(3)?, fields.get(4)?);
        Some((PathBuf::from(unescape(point)), unescape(root)))
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = bytes.get(i + 1..i + 4).and_then(|digits| {
            let text = std::str::from_utf8(digits).ok()?;
            u8::from_str_radix(text, 8).ok()
        });
        match (bytes[i], escaped) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A fuzz target: any mountinfo text, without panicking.
pub fn fuzz_one(data: &[u8]) {
    let _ = cgroup2_mount(&String::from_utf8_lossy(data));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_mount_and_its_root() {
        let text = "24 30 0:22 / /sys rw,nosuid - sysfs sysfs rw\n\
                    29 24 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            cgroup2_mount(text),
            Some((PathBuf::from("/sys/fs/cgroup"), "/".to_owned()))
        );
        let bind = "40 1 0:26 /system.slice /mnt/my\\040cgroups rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount(bind),
            Some((PathBuf::from("/mnt/my cgroups"), "/system.slice".to_owned()))
        );
        assert_eq!(
            cgroup2_mount("24 30 0:22 / /sys rw - sysfs sysfs rw\n"),
            None
        );
        assert_eq!(cgroup2_mount("garbage\n - cgroup2\n"), None);
    }

    #[test]
    fn unescape_leaves_what_is_not_an_escape() {
        assert_eq!(unescape("a\\040b"), "a b");
        assert_eq!(unescape("a\\0"), "a\\0");
        assert_eq!(unescape("a\\999b"), "a\\999b");
        assert_eq!(unescape("\\134"), "\\");
    }

    /// A directory tree stands in for the hierarchy: each directory's inode is its id.
    #[test]
    fn names_ids_by_listing_and_lists_at_most_once_an_interval() {
        let root = std::env::temp_dir().join(format!("scorch-cgroup-ids-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("system.slice/cron.service")).unwrap();
        let id = |p: &str| std::fs::metadata(root.join(p)).unwrap().ino();
        let mut ids = CgroupIds::at(Some((root.clone(), "/".to_owned())));
        let start = Instant::now();
        assert_eq!(
            ids.path(id("system.slice/cron.service"), start).as_deref(),
            Some("/system.slice/cron.service")
        );
        assert_eq!(ids.path(id(""), start).as_deref(), Some("/"));
        assert_eq!(ids.listings, 1);
        // A cgroup made since: unknown until the interval has passed.
        std::fs::create_dir_all(root.join("job.scope")).unwrap();
        assert_eq!(ids.path(id("job.scope"), start), None);
        assert_eq!(ids.listings, 1);
        let later = start + MIN_LISTING_INTERVAL;
        assert_eq!(
            ids.path(id("job.scope"), later).as_deref(),
            Some("/job.scope")
        );
        assert_eq!(ids.listings, 2);
        // Too deep to list: unnamed, never misnamed.
        let deep: PathBuf = (0..MAX_DEPTH + 1).map(|i| format!("d{i}")).collect();
        std::fs::create_dir_all(root.join(&deep)).unwrap();
        let deep_id = std::fs::metadata(root.join(&deep)).unwrap().ino();
        assert_eq!(ids.path(deep_id, later + MIN_LISTING_INTERVAL), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn fuzz_regressions_do_not_panic() {
        let inputs = crate::sys::fs::fuzz_inputs("mountinfo");
        assert!(!inputs.is_empty(), "fuzz/seeds/mountinfo/ is committed");
        for (path, data) in &inputs {
            eprintln!("{}", path.display());
            fuzz_one(data);
        }
    }
}
