//! Files the commands write, and facts about this host read from `/proc`.

use std::{
    io::{self, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

/// Raises this process's soft limit on open files to its hard limit (at most 65,536): the
/// symbolizer keeps a handle on the binaries of processes that may exit before their samples
/// are named, up to 2,048 of them, and systemd's default soft limit is 1,024. Returns the
/// soft limit now in force.
pub fn raise_open_file_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 0;
    }
    let wanted = limit.rlim_max.min(65_536);
    if wanted > limit.rlim_cur {
        let raised = libc::rlimit {
            rlim_cur: wanted,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads the struct it is given; raising the soft limit up to the
        // hard one needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return wanted;
        }
    }
    limit.rlim_cur
}

/// This host's name, as the kernel knows it.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown host".to_owned())
}

/// Fails early, before any BPF is loaded, when `path` cannot be written; the error says why.
pub fn check_output_writable(path: &Path) -> Result<(), String> {
    if path.is_dir() {
        return Err("it is a directory; name a file".into());
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        return Err(format!("directory {} does not exist", parent.display()));
    }
    // Creating a probe file proves the directory is writable for real (read-only mounts,
    // ACLs and permissions all show up), which access(2) would not for root. It is created
    // exclusively and without following links: the name is predictable, so another user may
    // have planted a symlink there.
    let probe = parent.join(format!(".scorch-probe-{}", std::process::id()));
    match create_new(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
        }
        Err(e) => {
            return Err(format!(
                "directory {} is not writable: {e}",
                parent.display()
            ))
        }
    }
    // A pipe or a device is opened only to be written: opening a FIFO here would wait for a
    // reader, and closing it would hand that reader its end of file before the profile.
    if path.exists() && !is_special_file(path) {
        std::fs::OpenOptions::new()
            .append(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| format!("{e}"))?;
    }
    Ok(())
}

/// Writes through a temporary file and a rename, so a reader never sees half a file and an
/// interrupted write leaves any earlier file intact.
///
/// The temporary file is created with `O_EXCL | O_NOFOLLOW`: its name is predictable, and in a
/// shared directory such as `/tmp` another user could otherwise plant a symlink there and have
/// this (privileged) process write through it.
///
/// A path that is itself a device, a pipe or a socket (`-o /dev/null`, a FIFO) is written in
/// place: a rename would put a regular file where the device was, and a root process that
/// replaces `/dev/null` breaks every other program on the host. A symlink is never written
/// through (`-o /dev/stdout` is refused by [`check_output_writable`]): one planted in a
/// shared directory could lead to any device.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    if is_special_file(path) {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        return file.write_all(bytes);
    }
    write_through_temporary(path, bytes, create_new)
}

/// Whether `path` itself (not a symlink's target) is there and is neither a regular file, a
/// directory nor a symlink.
fn is_special_file(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| {
        let kind = m.file_type();
        !(kind.is_file() || kind.is_dir() || kind.is_symlink())
    })
}

/// [`write_atomically`] for a file this user alone may read and write ([`create_private`]),
/// which a privileged process will trust when it reads it back.
pub fn write_private_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_through_temporary(path, bytes, create_private)
}

fn write_through_temporary(
    path: &Path,
    bytes: &[u8],
    create: fn(&Path) -> io::Result<std::fs::File>,
) -> io::Result<()> {
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temporary = path.with_file_name(format!(".{file_name}.tmp-{}", std::process::id()));
    let mut file = create(&temporary)?;
    let result = (|| {
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result
}

/// Creates `path` with `mode`, open for reading and writing, failing if anything (a file, a
/// symlink) is already there.
fn create_exclusive(path: &Path, mode: u32) -> io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(mode)
        .open(path)
}

/// Creates `path` for others to read, failing if anything is already there.
fn create_new(path: &Path) -> io::Result<std::fs::File> {
    create_exclusive(path, 0o644)
}

/// Creates `path` readable and writable by this user alone, failing if anything is already
/// there: a file a privileged process will trust when it reads it back.
pub fn create_private(path: &Path) -> io::Result<std::fs::File> {
    create_exclusive(path, 0o600)
}

/// The directory systemd gives a unit in `variable` (`RUNTIME_DIRECTORY=`, `CACHE_DIRECTORY=`;
/// the first when it lists several), else `fallback`.
pub fn unit_directory(variable: &str, fallback: &str) -> PathBuf {
    std::env::var_os(variable)
        .and_then(|dirs| {
            let dirs = dirs.to_string_lossy().into_owned();
            dirs.split(':').next().map(PathBuf::from)
        })
        .filter(|dir| dir.is_absolute())
        .unwrap_or_else(|| PathBuf::from(fallback))
}

/// Creates `dir` (and its missing parents) private to this user when it is missing, then
/// fails unless it is private ([`check_private_dir`]).
pub fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Err(error) if error.kind() != io::ErrorKind::AlreadyExists => return Err(error),
        _ => {}
    }
    check_private_dir(dir)
}

/// Opens `path` for reading only when a privileged process may trust it: a regular file,
/// reached without a symlink, this user's and writable by no other, in a directory that is
/// the same ([`check_private_dir`]).
pub fn open_private(path: &Path) -> io::Result<std::fs::File> {
    check_private_dir(path.parent().unwrap_or(Path::new("/")))?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    check_private(&metadata)?;
    Ok(file)
}

/// A temporary directory private to this user, as [`check_private_dir`] wants one: for the
/// tests of what is kept in such directories.
#[cfg(test)]
pub fn private_tempdir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

/// Fails unless `dir` is a directory, reached without a symlink, that this user owns and no
/// other user can write: where a privileged process may trust what it finds.
pub fn check_private_dir(dir: &Path) -> io::Result<()> {
    let metadata = std::fs::symlink_metadata(dir)?;
    if !metadata.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a directory",
        ));
    }
    check_private(&metadata)
}

/// Fails unless the file `metadata` describes is this user's and no other user can write it.
pub fn check_private(metadata: &std::fs::Metadata) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: no arguments, cannot fail.
    let user = unsafe { libc::geteuid() };
    if metadata.uid() != user {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "owned by another user",
        ));
    }
    if metadata.mode() & 0o022 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "writable by other users",
        ));
    }
    Ok(())
}

/// Every input a fuzz target's replay test runs: its findings, committed under
/// `agent/tests/fuzz-regressions/TARGET/`, then its seeds, `fuzz/seeds/TARGET/` (so the
/// properties a `fuzz_one` asserts are checked on well-formed input too). A target without
/// findings has no directory of them.
#[cfg(test)]
pub(crate) fn fuzz_inputs(target: &str) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut inputs = Vec::new();
    for dir in [
        root.join("tests/fuzz-regressions").join(target),
        root.join("../fuzz/seeds").join(target),
    ] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut paths: Vec<_> = entries.map(|entry| entry.unwrap().path()).collect();
        paths.sort();
        for path in paths.into_iter().filter(|p| p.is_file()) {
            let data = std::fs::read(&path).unwrap();
            inputs.push((path, data));
        }
    }
    inputs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_checks_name_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        assert!(check_output_writable(&dir.path().join("x.pb.gz")).is_ok());
        let e = check_output_writable(dir.path()).unwrap_err();
        assert!(e.contains("directory"), "{e}");
        let e = check_output_writable(&dir.path().join("missing/x.svg")).unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
    }

    #[test]
    fn writes_atomically_and_refuses_a_planted_link() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("y.txt");
        write_atomically(&out, b"abc").unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"abc");
        // A symlink planted on the temporary name must not be written through.
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let planted = dir
            .path()
            .join(format!(".z.txt.tmp-{}", std::process::id()));
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        assert!(write_atomically(&dir.path().join("z.txt"), b"evil").is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    }

    #[test]
    fn a_pipe_or_device_is_written_in_place_not_replaced() {
        use std::os::unix::{ffi::OsStrExt, fs::FileTypeExt};
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("out.fifo");
        let name = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        // With no reader yet: the check must not wait for one (nor open the pipe and hand
        // one an early end of file).
        let (done, checked) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || done.send(check_output_writable(&path)));
        assert_eq!(
            checked.recv_timeout(std::time::Duration::from_secs(10)),
            Ok(Ok(()))
        );
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read(fifo).unwrap())
        };
        write_atomically(&fifo, b"profile").unwrap();
        assert_eq!(reader.join().unwrap(), b"profile");
        let kind = std::fs::symlink_metadata(&fifo).unwrap().file_type();
        assert!(kind.is_fifo(), "the pipe was replaced: {kind:?}");
    }

    #[test]
    fn private_writes_are_this_users_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = private_tempdir();
        let private = dir.path().join("private");
        write_private_atomically(&private, b"b").unwrap();
        let mode = std::fs::metadata(&private).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{mode:o}");
        let mut text = String::new();
        std::io::Read::read_to_string(&mut open_private(&private).unwrap(), &mut text).unwrap();
        assert_eq!(text, "b");
    }
}
