//! Inflated debug sections kept on disk, so that the next `record` that names frames of the
//! same library maps them instead of inflating them again: libc6-dbg's compressed DWARF
//! inflates to 8 MB, about 25 ms of a 999 Hz recording's 0.2 s of CPU here. (gdb's index
//! cache and perf's build-id cache keep what they derived from a binary for the same reason.)
//!
//! An entry is named by what it was inflated from: the SHA-256 of the compressed bytes, their
//! format, and the size they claim. So whoever wrote the file they came from, the entry holds
//! the bytes that file's section inflates to, and a file with other bytes cannot reach it.
//! An entry is trusted only when it is this user's regular file, reached without a symlink,
//! that no other user can write, of exactly the claimed size, in a directory that is this
//! user's and that no other user can write. The directory holds at most `max_bytes`: the
//! oldest entries go first. Any failure here leaves the section inflated as before, into the
//! scratch directory.

use std::{
    fs::File,
    io,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    time::SystemTime,
};

use object::CompressionFormat;

use super::FileData;
use crate::sys::{
    fs::{check_private, check_private_dir, create_private, ensure_private_dir, unit_directory},
    hex::to_hex,
};

/// The cache's size when none is set: about 30 libc builds' worth.
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;

/// Prefix of every entry's file name; the cache touches no other file in its directory.
const ENTRY_PREFIX: &str = "section-";

/// Temporary files older than this are left over from a process that died mid-write.
const STALE_TEMPORARY: std::time::Duration = std::time::Duration::from_secs(3600);

/// A directory of inflated sections; see the module documentation.
#[derive(Debug, Clone)]
pub struct SectionCache {
    dir: PathBuf,
    max_bytes: u64,
}

impl SectionCache {
    /// The cache in `dir`, created (private to this user) if missing.
    pub fn new(dir: PathBuf, max_bytes: u64) -> io::Result<Self> {
        ensure_private_dir(&dir)?;
        Ok(SectionCache { dir, max_bytes })
    }

    /// The host's cache: systemd's `CacheDirectory=` when set, else `/var/cache/scorch`.
    pub fn system() -> io::Result<Self> {
        Self::new(
            unit_directory("CACHE_DIRECTORY", "/var/cache/scorch"),
            DEFAULT_MAX_BYTES,
        )
    }

    /// The section `compressed` (in `format`, claiming `claimed` bytes) inflated: the kept
    /// entry when there is one to trust, else what `inflate` writes to the file it is given
    /// (which it must fill with exactly `claimed` bytes), kept for the next reader.
    pub fn inflated(
        &self,
        format: CompressionFormat,
        compressed: &[u8],
        claimed: u64,
        inflate: impl FnOnce(&mut File) -> Option<u64>,
    ) -> Option<FileData> {
        let path = self.dir.join(entry_name(format, compressed, claimed));
        if let Some(kept) = self.kept(&path, claimed) {
            return Some(kept);
        }
        let temporary = self.dir.join(format!(
            ".{ENTRY_PREFIX}tmp-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        let mut file = create_private(&temporary).ok()?;
        let written = inflate(&mut file);
        let kept = written == Some(claimed) && std::fs::rename(&temporary, &path).is_ok();
        if !kept {
            let _ = std::fs::remove_file(&temporary);
            return None;
        }
        self.evict_beyond_limit();
        FileData::map_file(&file, &path).ok()
    }

    fn kept(&self, path: &Path, claimed: u64) -> Option<FileData> {
        check_private_dir(&self.dir).ok()?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .ok()?;
        let metadata = file.metadata().ok()?;
        if !metadata.is_file() || metadata.len() != claimed || check_private(&metadata).is_err() {
            return None;
        }
        FileData::map_file(&file, path).ok()
    }

    /// Removes the oldest entries until the directory holds at most `max_bytes`, and any
    /// temporary file a dead writer left.
    fn evict_beyond_limit(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let now = SystemTime::now();
        let mut kept: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let Ok(metadata) = entry.metadata() else {
                continue;
            };
            let modified = metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            if name.starts_with(&format!(".{ENTRY_PREFIX}tmp-")) {
                if now.duration_since(modified).unwrap_or_default() > STALE_TEMPORARY {
                    let _ = std::fs::remove_file(entry.path());
                }
            } else if name.starts_with(ENTRY_PREFIX) && metadata.is_file() {
                kept.push((modified, metadata.len(), entry.path()));
            }
        }
        let mut total: u64 = kept.iter().map(|(_, len, _)| len).sum();
        kept.sort();
        for (_, len, path) in kept {
            if total <= self.max_bytes {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }
}

/// The entry's file name: what the section was inflated from.
fn entry_name(format: CompressionFormat, compressed: &[u8], claimed: u64) -> String {
    let hex = to_hex(ring::digest::digest(&ring::digest::SHA256, compressed).as_ref());
    let format = match format {
        CompressionFormat::Zlib => "zlib",
        CompressionFormat::Zstandard => "zstd",
        _ => "other",
    };
    format!("{ENTRY_PREFIX}{hex}-{format}-{claimed}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A cache of `max_bytes` in a fresh directory.
    fn cache(max_bytes: u64) -> (tempfile::TempDir, SectionCache) {
        let root = tempfile::tempdir().unwrap();
        let cache = SectionCache::new(root.path().join("cache"), max_bytes).unwrap();
        (root, cache)
    }

    fn fill(bytes: &'static [u8]) -> impl FnOnce(&mut File) -> Option<u64> {
        move |file| {
            file.write_all(bytes).ok()?;
            Some(bytes.len() as u64)
        }
    }

    #[test]
    fn a_section_is_inflated_once_then_mapped() {
        let (_root, cache) = cache(DEFAULT_MAX_BYTES);
        let first = cache
            .inflated(CompressionFormat::Zlib, b"compressed", 8, fill(b"inflated"))
            .unwrap();
        assert_eq!(first.bytes(), b"inflated");
        let second = cache
            .inflated(CompressionFormat::Zlib, b"compressed", 8, |_| {
                panic!("inflated twice")
            })
            .unwrap();
        assert_eq!(second.bytes(), b"inflated");
        // Other compressed bytes are another entry.
        let other = cache
            .inflated(
                CompressionFormat::Zlib,
                b"compressed!",
                8,
                fill(b"another!"),
            )
            .unwrap();
        assert_eq!(other.bytes(), b"another!");
    }

    #[test]
    fn a_short_inflation_is_not_kept() {
        let (_root, cache) = cache(DEFAULT_MAX_BYTES);
        assert!(cache
            .inflated(CompressionFormat::Zlib, b"c", 9, fill(b"inflated"))
            .is_none());
        let names: Vec<_> = std::fs::read_dir(&cache.dir).unwrap().flatten().collect();
        assert!(names.is_empty(), "{names:?}");
    }

    #[test]
    fn an_entry_others_can_write_or_of_another_size_is_inflated_again() {
        let (_root, cache) = cache(DEFAULT_MAX_BYTES);
        cache
            .inflated(CompressionFormat::Zlib, b"c", 8, fill(b"inflated"))
            .unwrap();
        let path = cache.dir.join(entry_name(CompressionFormat::Zlib, b"c", 8));
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .unwrap();
        let again = cache
            .inflated(CompressionFormat::Zlib, b"c", 8, fill(b"INFLATED"))
            .unwrap();
        assert_eq!(again.bytes(), b"INFLATED");
        std::fs::write(&path, b"short").unwrap();
        let again = cache
            .inflated(CompressionFormat::Zlib, b"c", 8, fill(b"inflated"))
            .unwrap();
        assert_eq!(again.bytes(), b"inflated");
    }

    #[test]
    fn a_symlink_in_place_of_an_entry_is_not_followed() {
        // A private file of the right size elsewhere, linked where the entry would be.
        let (_elsewhere, other) = cache(DEFAULT_MAX_BYTES);
        let (_root, cache) = cache(DEFAULT_MAX_BYTES);
        other
            .inflated(CompressionFormat::Zlib, b"x", 8, fill(b"planted!"))
            .unwrap();
        std::os::unix::fs::symlink(
            other.dir.join(entry_name(CompressionFormat::Zlib, b"x", 8)),
            cache.dir.join(entry_name(CompressionFormat::Zlib, b"c", 8)),
        )
        .unwrap();
        let read = cache
            .inflated(CompressionFormat::Zlib, b"c", 8, fill(b"inflated"))
            .map(|data| data.bytes().to_vec());
        // Inflated, and kept in place of the link (a rename replaces the link, not what it
        // points at).
        assert_eq!(read.as_deref(), Some(&b"inflated"[..]));
        let planted = other.dir.join(entry_name(CompressionFormat::Zlib, b"x", 8));
        assert_eq!(std::fs::read(planted).unwrap(), b"planted!");
    }

    #[test]
    fn a_directory_others_can_write_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("open");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        assert!(SectionCache::new(dir, DEFAULT_MAX_BYTES).is_err());
    }

    #[test]
    fn the_oldest_entries_go_beyond_the_limit() {
        let (_root, cache) = cache(20);
        cache
            .inflated(CompressionFormat::Zlib, b"a", 8, fill(b"aaaaaaaa"))
            .unwrap();
        let first = cache.dir.join(entry_name(CompressionFormat::Zlib, b"a", 8));
        let old = SystemTime::now() - std::time::Duration::from_secs(60);
        File::options()
            .write(true)
            .open(&first)
            .unwrap()
            .set_modified(old)
            .unwrap();
        cache
            .inflated(CompressionFormat::Zlib, b"b", 8, fill(b"bbbbbbbb"))
            .unwrap();
        assert!(first.exists(), "evicted under the limit");
        cache
            .inflated(CompressionFormat::Zlib, b"c", 8, fill(b"cccccccc"))
            .unwrap();
        assert!(!first.exists(), "the oldest entry stayed past the limit");
        assert!(cache
            .dir
            .join(entry_name(CompressionFormat::Zlib, b"c", 8))
            .exists());
    }
}
