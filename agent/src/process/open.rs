//! Opening the files another process maps, which it named: safely, and only the file it
//! mapped.

use std::{
    fs::File,
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use super::maps::MapEntry;
use crate::sys::untrusted;

/// Why a mapped file was not opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// The file at the mapped path is no longer the one that was mapped.
    #[error("the file at the mapped path is not the one mapped")]
    Replaced,
    /// Neither the kernel's link nor the path opened.
    #[error("the mapped file could not be opened")]
    Unreadable,
}

/// Opens the file a mapping holds: `/proc/PID/map_files` (the mapped inode itself, even
/// deleted or replaced), else the path inside the process's root or, once the process is gone,
/// on the host, each only when the inode (and on the host the device) matches.
///
/// The path comes from the process, so it is opened as untrusted ([`untrusted::open_in_root`]:
/// inside that root, no FIFO, device or final symlink), and the identity is checked on the
/// descriptor that will be read, never on a path opened again later.
pub fn open_mapped(pid: u32, entry: &MapEntry) -> Result<(File, PathBuf, i64), OpenError> {
    // Formatted from the parsed numbers, never copied from /proc/PID/maps: maps pads
    // addresses to 8 digits (`00400000`, a non-PIE binary) and map_files names never are.
    let map_files = PathBuf::from(format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        entry.start, entry.end
    ));
    // The kernel's own link to the mapped file: not a path the process chose.
    if let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&map_files)
    {
        if let Ok(m) = file.metadata() {
            if m.is_file() {
                return Ok((file, map_files, m.mtime()));
            }
        }
    }
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    let path = Path::new(entry.file_path());
    let mut replaced = false;
    // Through the root only the inode is compared: on overlayfs the device in /proc/PID/maps
    // is the underlying one, not what fstat reports.
    for (root, check_dev) in [(root.as_path(), false), (Path::new("/"), true)] {
        match untrusted::open_in_root(root, path) {
            Ok(opened)
                if opened.inode == entry.inode && (!check_dev || opened.dev == entry.dev_t()) =>
            {
                let mtime = opened.file.metadata().map(|m| m.mtime()).unwrap_or(0);
                return Ok((opened.file, opened.path, mtime));
            }
            Ok(_) => replaced = true,
            Err(err) => tracing::trace!("{err}"),
        }
    }
    Err(if replaced {
        OpenError::Replaced
    } else {
        OpenError::Unreadable
    })
}
