//! Opening files that other users control (perf maps, debug files, anything under a profiled
//! process's root) from a daemon that holds capabilities.
//!
//! A path such as `/proc/PID/root/tmp/perf-PID.map` is written by the profiled process: it can
//! be a FIFO (an open or read that never returns), a symlink to `/dev/zero` (a read without
//! end) or to a host file the container must not see, or a file that grows without bound.
//! [`open_in_root`] resolves the path with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`
//! inside the process's own root, so `..` and absolute symlinks stay in that root and
//! `/proc/self/...` tricks are refused; opens with `O_NONBLOCK | O_NOFOLLOW`, so neither a FIFO
//! nor a final symlink can block or redirect it; and accepts only a regular file, checked with
//! `fstat` on the descriptor it will read. [`read_bounded`] then reads at most a cap.

use std::{
    ffi::CString,
    fs::File,
    io::{self, Read},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::{ffi::OsStrExt, fs::MetadataExt},
    },
    path::{Path, PathBuf},
};

/// Why an untrusted file was not opened or read.
#[derive(Debug, thiserror::Error)]
pub enum UntrustedError {
    #[error("opening {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("{path} is a {kind}, not a regular file")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{path} is {size} bytes, more than the {limit} allowed")]
    TooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
}

/// A regular file opened by [`open_in_root`], with the identity read from its descriptor.
#[derive(Debug)]
pub struct UntrustedFile {
    pub file: File,
    /// The path as asked, for messages.
    pub path: PathBuf,
    pub dev: u64,
    pub inode: u64,
    /// Its size when opened.
    pub size: u64,
}

/// Opens `path` as seen from `root` (for a process, `/proc/PID/root`), read-only, refusing
/// anything but a regular file. `path` may be absolute (it is taken relative to `root`).
pub fn open_in_root(root: &Path, path: &Path) -> Result<UntrustedFile, UntrustedError> {
    let shown = root.join(path.strip_prefix("/").unwrap_or(path));
    let open_error = |source| UntrustedError::Open {
        path: shown.clone(),
        source,
    };
    let root_dir = open_path(root, libc::O_PATH | libc::O_DIRECTORY).map_err(open_error)?;
    let relative = path.strip_prefix("/").unwrap_or(path);
    let relative = if relative.as_os_str().is_empty() {
        Path::new(".")
    } else {
        relative
    };
    let fd = openat2(
        &root_dir,
        relative,
        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY | libc::O_CLOEXEC,
        libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    )
    .map_err(open_error)?;
    let file = File::from(fd);
    let metadata = file.metadata().map_err(open_error)?;
    let kind = file_kind(&metadata);
    if kind != "regular file" {
        return Err(UntrustedError::NotRegular { path: shown, kind });
    }
    Ok(UntrustedFile {
        file,
        path: shown,
        dev: metadata.dev(),
        inode: metadata.ino(),
        size: metadata.len(),
    })
}

/// Reads the whole file if it holds at most `limit` bytes; a larger file (or one that grew
/// past `limit` while being read) is refused rather than read in part.
pub fn read_bounded(file: &mut UntrustedFile, limit: u64) -> Result<Vec<u8>, UntrustedError> {
    if file.size > limit {
        return Err(UntrustedError::TooLarge {
            path: file.path.clone(),
            size: file.size,
            limit,
        });
    }
    let mut bytes = Vec::with_capacity(file.size as usize);
    (&mut file.file)
        .take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| UntrustedError::Read {
            path: file.path.clone(),
            source,
        })?;
    if bytes.len() as u64 > limit {
        return Err(UntrustedError::TooLarge {
            path: file.path.clone(),
            size: bytes.len() as u64,
            limit,
        });
    }
    Ok(bytes)
}

fn file_kind(metadata: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let kind = metadata.file_type();
    if kind.is_file() {
        "regular file"
    } else if kind.is_dir() {
        "directory"
    } else if kind.is_fifo() {
        "FIFO"
    } else if kind.is_char_device() {
        "character device"
    } else if kind.is_block_device() {
        "block device"
    } else if kind.is_socket() {
        "socket"
    } else {
        "symbolic link"
    }
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// `open(2)` of a path the daemon chose (not one a user wrote).
fn open_path(path: &Path, flags: libc::c_int) -> io::Result<OwnedFd> {
    let path = c_path(path)?;
    // SAFETY: `path` is a valid NUL-terminated string for the duration of the call.
    let fd = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by open(2) and is owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `openat2(2)` (Linux 5.6+; older kernels get ENOSYS, an error like any other).
fn openat2(dir: &OwnedFd, path: &Path, flags: libc::c_int, resolve: u64) -> io::Result<OwnedFd> {
    let path = c_path(path)?;
    // SAFETY: open_how is plain data; all-zero is its documented default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.resolve = resolve;
    // SAFETY: the pointers are valid for the call and `size` is the struct's own size.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by openat2(2) and is owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn a_regular_file_is_read_within_its_cap() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("perf-1.map"), b"1000 10 f\n").unwrap();
        let mut file = open_in_root(root.path(), Path::new("/perf-1.map")).unwrap();
        assert_eq!(read_bounded(&mut file, 64).unwrap(), b"1000 10 f\n");
        let mut file = open_in_root(root.path(), Path::new("perf-1.map")).unwrap();
        let error = read_bounded(&mut file, 4).unwrap_err().to_string();
        assert!(error.contains("more than the 4 allowed"), "{error}");
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let root = tempfile::tempdir().unwrap();
        let fifo = CString::new(root.path().join("p").as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid path string.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let error = open_in_root(root.path(), Path::new("p")).unwrap_err();
        assert!(error.to_string().contains("FIFO"), "{error}");
    }

    #[test]
    fn symlinks_cannot_reach_devices_or_the_host() {
        let root = tempfile::tempdir().unwrap();
        // A final symlink is refused outright (O_NOFOLLOW).
        symlink("/dev/zero", root.path().join("zero")).unwrap();
        assert!(open_in_root(root.path(), Path::new("zero")).is_err());
        // A directory symlink that points out of the root resolves inside it instead.
        let host = tempfile::tempdir().unwrap();
        std::fs::write(host.path().join("secret"), b"host only").unwrap();
        symlink(host.path(), root.path().join("escape")).unwrap();
        let through = Path::new("escape").join("secret");
        assert!(open_in_root(root.path(), &through).is_err());
        // `..` cannot climb above the root either.
        let climb = PathBuf::from("../".repeat(8)).join(host.path().strip_prefix("/").unwrap());
        assert!(open_in_root(root.path(), &climb.join("secret")).is_err());
        // Devices named directly are not regular files.
        let error = open_in_root(Path::new("/"), Path::new("/dev/zero")).unwrap_err();
        assert!(error.to_string().contains("character device"), "{error}");
    }
}
