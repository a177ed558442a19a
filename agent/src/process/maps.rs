//! `/proc/PID/maps`: its lines parsed ([`parse_maps`]), one capture of a process's mappings
//! ([`ProcessMaps`]), and the captures a recording's samples still need ([`MapsHistory`]).

use std::{
    io,
    path::{Path, PathBuf},
};

use crate::binary::address::FileOffset;
use crate::sys::procmap::{self, CodeVma, QueryError};

#[derive(Debug, thiserror::Error)]
pub enum MapsError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{path}: larger than {limit} bytes (a process with that many mappings is not named)")]
    TooLarge { path: PathBuf, limit: usize },
    #[error("{path}: line {line}: {reason}")]
    Parse {
        path: PathBuf,
        line: usize,
        reason: &'static str,
    },
    #[error(
        "{path}: no mappings (a process that exited and is not reaped yet, or a kernel thread)"
    )]
    Empty { path: PathBuf },
}

/// The first read's buffer for `/proc/PID/maps`: Debian's python3 has 43 lines (4.5 KiB),
/// a JVM or a browser a few hundred.
const MAPS_READ_START: usize = 32 << 10;

/// The most of `/proc/PID/maps` read: 100,000 lines of 80 bytes.
const MAPS_READ_LIMIT: usize = 8 << 20;

/// This process's vDSO image: the kernel maps the same one into every 64-bit process, so the
/// agent reads its own copy rather than another process's memory (which that process could
/// have made writable and changed).
pub fn own_vdso() -> Option<Vec<u8>> {
    let maps = ProcessMaps::read(std::process::id()).ok()?;
    let entry = maps.entries().iter().find(|e| e.path == "[vdso]")?;
    let len = usize::try_from(entry.end - entry.start).ok()?;
    // SAFETY: the kernel maps the vdso readable for the life of the process, at the address
    // /proc/self/maps reports.
    let image = unsafe { std::slice::from_raw_parts(entry.start as *const u8, len) };
    Some(image.to_vec())
}

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapEntry {
    /// First absolute address of the mapping.
    pub start: u64,
    /// One past the last absolute address.
    pub end: u64,
    /// Offset in the file of `start`.
    pub offset: u64,
    /// True when the mapping is executable; only those hold code.
    pub executable: bool,
    /// `major:minor` device of the file, and its inode; 0 for anonymous mappings.
    pub dev: u64,
    pub inode: u64,
    /// The path column: a file path, a pseudo path like `[vdso]`, or empty.
    pub path: String,
}

impl MapEntry {
    /// True for mappings backed by a file on disk (a path, a non-zero inode).
    pub fn is_file(&self) -> bool {
        self.inode != 0 && self.path.starts_with('/')
    }

    /// The file path without the ` (deleted)` suffix the kernel adds to unlinked files.
    pub fn file_path(&self) -> &str {
        self.path.strip_suffix(" (deleted)").unwrap_or(&self.path)
    }

    /// The device number in the kernel's `dev_t` encoding, as `stat` reports it.
    pub fn dev_t(&self) -> u64 {
        let (major, minor) = (self.dev >> 32, self.dev & 0xffff_ffff);
        libc::makedev(major as u32, minor as u32)
    }

    /// Translates an absolute address inside this mapping to an offset in the mapped file.
    pub fn file_offset(&self, address: u64) -> FileOffset {
        FileOffset(address - self.start + self.offset)
    }
}

/// Parses `/proc/PID/maps` text. `origin` only names the input in errors.
pub fn parse_maps(text: &str, origin: &Path) -> Result<Vec<MapEntry>, MapsError> {
    let mut entries = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.is_empty() {
            continue;
        }
        let err = |reason| MapsError::Parse {
            path: origin.to_owned(),
            line: index + 1,
            reason,
        };
        let mut fields = line.splitn(6, ' ');
        let range = fields.next().ok_or_else(|| err("missing address range"))?;
        let perms = fields.next().ok_or_else(|| err("missing permissions"))?;
        let offset = fields.next().ok_or_else(|| err("missing offset"))?;
        let dev = fields.next().ok_or_else(|| err("missing device"))?;
        let inode = fields.next().ok_or_else(|| err("missing inode"))?;
        let path = fields.next().unwrap_or("").trim_start();
        let (start, end) = range
            .split_once('-')
            .ok_or_else(|| err("bad address range"))?;
        let hex = |s: &str| u64::from_str_radix(s, 16);
        let start = hex(start).map_err(|_| err("bad start address"))?;
        let end = hex(end).map_err(|_| err("bad end address"))?;
        if end <= start {
            return Err(err("empty address range"));
        }
        let (major, minor) = dev.split_once(':').ok_or_else(|| err("bad device"))?;
        let dev = (hex(major).map_err(|_| err("bad device"))? << 32)
            | hex(minor).map_err(|_| err("bad device"))?;
        entries.push(MapEntry {
            start,
            end,
            offset: hex(offset).map_err(|_| err("bad offset"))?,
            executable: perms.as_bytes().get(2) == Some(&b'x'),
            dev,
            inode: inode.parse().map_err(|_| err("bad inode"))?,
            path: path.to_owned(),
        });
    }
    Ok(entries)
}

/// The code mappings in the text of `/proc/PID/maps` (opened as `file`), as the query gives
/// them: the executable lines, less the kernel's vsyscall page, which is in no process's list
/// of mappings (and which no libc calls into any more).
fn code_of_text(file: std::fs::File, path: &Path) -> Result<Vec<MapEntry>, MapsError> {
    let mut entries = read_text(file, path)?;
    entries.retain(|e| e.executable && e.path != "[vsyscall]");
    Ok(entries)
}

/// Every line of `/proc/PID/maps` (opened as `file`), read as text.
///
/// One buffer of [`MAPS_READ_START`] bytes takes a typical process's maps in one `read`,
/// where growing from empty took three or four, each of which walks the mappings in the
/// kernel again. A process decides how long its maps are (up to 65,530 mappings, each with a
/// path of up to 4 KiB): past [`MAPS_READ_LIMIT`] the read stops with an error rather than
/// holding it all.
fn read_text(file: std::fs::File, path: &Path) -> Result<Vec<MapEntry>, MapsError> {
    use std::io::Read;
    thread_local! {
        /// The read buffer, kept between reads: a read is made at every process's first
        /// sample, and each one allocated and freed 32 KiB. (The churn bench did not
        /// measurably change with this; it saves the allocator's work, no more.)
        static BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BUFFER.with_borrow_mut(|bytes| {
        bytes.clear();
        if bytes.capacity() > MAPS_READ_START {
            // A huge process's maps are not kept for the next, small one.
            bytes.shrink_to(MAPS_READ_START);
        }
        bytes.reserve(MAPS_READ_START);
        file.take(MAPS_READ_LIMIT as u64 + 1)
            .read_to_end(bytes)
            .map_err(|source| MapsError::Read {
                path: path.to_owned(),
                source,
            })?;
        if bytes.len() > MAPS_READ_LIMIT {
            return Err(MapsError::TooLarge {
                path: path.to_owned(),
                limit: MAPS_READ_LIMIT,
            });
        }
        // A file name need not be UTF-8, and the rest of a line is ASCII: such a name is kept
        // with replacement characters (the file is opened through `map_files` by its address
        // range, or by a path whose inode is checked, so a mangled name opens nothing else),
        // where failing the read left the whole process unnamed.
        parse_maps(&String::from_utf8_lossy(bytes), path)
    })
}

impl From<CodeVma> for MapEntry {
    fn from(vma: CodeVma) -> Self {
        MapEntry {
            start: vma.start,
            end: vma.end,
            offset: vma.offset,
            executable: true,
            dev: (u64::from(vma.dev_major) << 32) | u64::from(vma.dev_minor),
            inode: vma.inode,
            // As the text read keeps a name that is not UTF-8 (see `read_text`).
            path: String::from_utf8_lossy(&vma.name).into_owned(),
        }
    }
}

/// The code mappings of one process at the time they were captured.
#[derive(Debug, Clone, Default)]
pub struct ProcessMaps {
    /// Sorted by `start`, non-overlapping (the kernel guarantees both).
    entries: Vec<MapEntry>,
}

impl ProcessMaps {
    /// Reads the code mappings of `pid` (its executable ones, the only ones a pc can be in):
    /// by `PROCMAP_QUERY` where the kernel has it (6.11), else from the text of
    /// `/proc/PID/maps`.
    ///
    /// Read at every process's first sample (a build host starts hundreds a second). Asked by
    /// query, the kernel resolves the paths of the 7 code mappings of Debian's `python3`, not
    /// the 30-odd of its 43 lines that name a file, and nothing is formatted or parsed (see
    /// [`crate::sys::procmap`]). The captures, kept for as long as the samples need them,
    /// hold those 7 entries, not 43.
    pub fn read(pid: u32) -> Result<Self, MapsError> {
        let path = PathBuf::from(format!("/proc/{pid}/maps"));
        let file = std::fs::File::open(&path).map_err(|source| MapsError::Read {
            path: path.clone(),
            source,
        })?;
        let entries = match procmap::executable_vmas(&file, MAPS_READ_LIMIT) {
            Ok(vmas) => vmas.into_iter().map(MapEntry::from).collect(),
            // The text says the same; a name too long for the query's buffer is read there.
            Err(QueryError::Unsupported | QueryError::NameTooLong) => code_of_text(file, &path)?,
            Err(QueryError::TooLarge { limit }) => {
                return Err(MapsError::TooLarge { path, limit });
            }
            // The process has no memory to ask about: exited and not reaped, or a kernel
            // thread. The text reads empty then.
            Err(QueryError::Io(source)) if source.raw_os_error() == Some(libc::ESRCH) => Vec::new(),
            Err(QueryError::Io(source)) => return Err(MapsError::Read { path, source }),
        };
        // A zombie's maps read empty: taken as a capture, they would replace the one of its
        // life and leave every sample of it unnamed. A process that runs maps code.
        if entries.is_empty() {
            return Err(MapsError::Empty { path });
        }
        Ok(ProcessMaps { entries })
    }

    pub fn from_entries(mut entries: Vec<MapEntry>) -> Self {
        entries.sort_by_key(|e| e.start);
        ProcessMaps { entries }
    }

    /// The mapping holding `address`, with its index (stable for this snapshot).
    pub fn find(&self, address: u64) -> Option<(usize, &MapEntry)> {
        let index = self
            .entries
            .partition_point(|e| e.start <= address)
            .checked_sub(1)?;
        let entry = &self.entries[index];
        (address < entry.end).then_some((index, entry))
    }

    pub fn entries(&self) -> &[MapEntry] {
        &self.entries
    }

    /// True when every address that held code from a file in `earlier` still holds the same
    /// file at the same place here, so a pc sampled then names the same code in either.
    /// Anonymous code is named by the process's perf map, not its mappings, and the vDSO is
    /// the same image in every capture: neither counts.
    pub fn keeps_code_of(&self, earlier: &ProcessMaps) -> bool {
        let bias = |e: &MapEntry| e.start.wrapping_sub(e.offset);
        earlier
            .entries
            .iter()
            .filter(|e| e.executable && e.is_file())
            .all(|old| {
                // The range may now be split (mprotect) into several entries of the same file.
                let mut address = old.start;
                while address < old.end {
                    match self.find(address) {
                        Some((_, new))
                            if new.executable
                                && (new.dev, new.inode) == (old.dev, old.inode)
                                && bias(new) == bias(old) =>
                        {
                            address = new.end;
                        }
                        _ => return false,
                    }
                }
                true
            })
    }
}

/// Versions of one process kept at most, so a process that maps code over its own in a loop
/// cannot grow a recording's memory without bound: past it, captures replace the latest, and
/// the samples of those windows are named with the newest maps.
const MAX_VERSIONS: usize = 64;

/// The captures of one process's maps that its samples may still need.
///
/// A process's maps are read while it lives (when it is first seen in a window, and at each
/// drain). A capture that no longer holds code the previous one held (a library unloaded, or
/// another loaded at its address: `dlclose`, then `dlopen`) starts a new version; samples keep
/// the version that was latest when they were drained, so a recording names them with the maps
/// of their time rather than with whatever sits at those addresses at its end. A capture that
/// only adds code replaces the latest version: earlier pcs resolve the same in it.
#[derive(Debug, Clone)]
pub struct MapsHistory {
    /// The version of `versions[0]`; the last is the latest capture.
    first: u32,
    versions: Vec<ProcessMaps>,
}

impl MapsHistory {
    pub fn new(maps: ProcessMaps) -> Self {
        MapsHistory {
            first: 0,
            versions: vec![maps],
        }
    }

    /// The latest capture.
    pub fn latest(&self) -> &ProcessMaps {
        self.versions
            .last()
            .expect("a history holds at least one capture")
    }

    /// Every capture kept, oldest first.
    pub fn versions(&self) -> &[ProcessMaps] {
        &self.versions
    }

    /// The latest capture's version.
    pub fn version(&self) -> u32 {
        self.first + (self.versions.len() as u32 - 1)
    }

    /// The capture that was latest at `version`; the latest for a version already forgotten
    /// (see [`MapsHistory::forget_earlier`]).
    pub fn at(&self, version: u32) -> &ProcessMaps {
        version
            .checked_sub(self.first)
            .and_then(|index| self.versions.get(index as usize))
            .unwrap_or_else(|| self.latest())
    }

    /// Adds a capture; true when it started a new version.
    pub fn capture(&mut self, maps: ProcessMaps) -> bool {
        let new_version = !maps.keeps_code_of(self.latest()) && self.versions.len() < MAX_VERSIONS;
        if new_version {
            self.versions.push(maps);
        } else {
            *self.versions.last_mut().expect("never empty") = maps;
        }
        new_version
    }

    /// Keeps only the latest capture, once every sample of an earlier version was named.
    pub fn forget_earlier(&mut self) {
        let version = self.version();
        self.versions.drain(..self.versions.len() - 1);
        self.first = version;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c8a00000-55d0c8a01000 r--p 00000000 fd:01 1234 /usr/bin/work
55d0c8a01000-55d0c8a02000 r-xp 00001000 fd:01 1234 /usr/bin/work
7f0000000000-7f0000021000 rw-p 00000000 00:00 0 
7f1000000000-7f1000001000 r-xp 00002000 fd:01 99 /usr/lib/libx.so (deleted)
7ffd000000000-7ffd000002000 r-xp 00000000 00:00 0                          [vdso]
";

    #[test]
    fn a_zombie_has_no_maps_to_capture() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Exited, not reaped: a zombie until `wait`.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap()
            .contains(") Z ")
        {
            assert!(std::time::Instant::now() < deadline, "{pid} never exited");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let read = ProcessMaps::read(pid);
        child.wait().unwrap();
        assert!(
            matches!(read, Err(MapsError::Empty { .. })),
            "a zombie's maps: {read:?}"
        );
        // The living process reads as before.
        assert!(!ProcessMaps::read(std::process::id())
            .unwrap()
            .entries()
            .is_empty());
    }

    #[test]
    fn the_query_and_the_text_capture_the_same_code() {
        // A process whose mappings stay put while both are read.
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .unwrap();
        let path = PathBuf::from(format!("/proc/{}/maps", child.id()));
        // `sleep` has exec'd once its mappings hold its own code and the vDSO: the kernel maps
        // the vDSO last, after the binary and its interpreter, and a read in between sees the
        // binary without it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let execd = |maps: String| maps.contains("/sleep") && maps.contains("[vdso]");
        while !execd(std::fs::read_to_string(&path).unwrap()) {
            assert!(std::time::Instant::now() < deadline, "sleep never ran");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let read = ProcessMaps::read(child.id()).unwrap();
        let text = code_of_text(std::fs::File::open(&path).unwrap(), &path).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(read.entries(), text.as_slice());
        assert!(text.iter().all(|e| e.executable), "{text:?}");
        assert!(text.iter().any(|e| e.path.ends_with("/sleep")), "{text:?}");
        assert!(text.iter().any(|e| e.path == "[vdso]"), "{text:?}");
    }

    #[test]
    fn parses_maps_lines() {
        let entries = parse_maps(MAPS, Path::new("maps")).unwrap();
        assert_eq!(entries.len(), 5);
        assert_eq!(entries[1].start, 0x55d0c8a01000);
        assert_eq!(entries[1].offset, 0x1000);
        assert!(entries[1].executable);
        assert!(!entries[0].executable);
        assert_eq!(entries[1].dev, (0xfd << 32) | 1);
        assert_eq!(entries[1].inode, 1234);
        assert_eq!(entries[1].path, "/usr/bin/work");
        assert!(!entries[2].is_file());
        assert_eq!(entries[3].file_path(), "/usr/lib/libx.so");
        assert!(entries[3].is_file());
        assert_eq!(entries[4].path, "[vdso]");
    }

    #[test]
    fn finds_mapping_and_file_offset() {
        let maps = ProcessMaps::from_entries(parse_maps(MAPS, Path::new("maps")).unwrap());
        let (index, entry) = maps.find(0x55d0c8a01234).unwrap();
        assert_eq!(index, 1);
        assert_eq!(entry.file_offset(0x55d0c8a01234), FileOffset(0x1234));
        assert!(maps.find(0x55d0c8a02000).is_none());
        assert!(maps.find(0x1000).is_none());
    }

    #[test]
    fn bad_maps_line_names_input_and_line() {
        let err = parse_maps("zz-10 r-xp 0 00:00 0\n", Path::new("/proc/7/maps")).unwrap_err();
        assert_eq!(err.to_string(), "/proc/7/maps: line 1: bad start address");
    }

    fn code(start: u64, end: u64, offset: u64, inode: u64) -> MapEntry {
        MapEntry {
            start,
            end,
            offset,
            executable: true,
            dev: 1,
            inode,
            path: format!("/lib/lib{inode}.so"),
        }
    }

    fn capture(entries: &[MapEntry]) -> ProcessMaps {
        ProcessMaps::from_entries(entries.to_vec())
    }

    #[test]
    fn code_kept_in_place_is_kept_even_split_or_joined_by_new_code() {
        let before = capture(&[code(0x1000, 0x3000, 0, 7)]);
        let split = capture(&[
            code(0x1000, 0x2000, 0, 7),
            code(0x2000, 0x3000, 0x1000, 7),
            code(0x8000, 0x9000, 0, 8),
        ]);
        assert!(split.keeps_code_of(&before));
        // Anonymous code and the vDSO are not named by the maps.
        let mut jit = code(0x5000, 0x6000, 0, 0);
        jit.path.clear();
        assert!(before.keeps_code_of(&capture(&[code(0x1000, 0x3000, 0, 7), jit])));
    }

    #[test]
    fn code_unloaded_or_replaced_at_its_address_is_not_kept() {
        let before = capture(&[code(0x1000, 0x3000, 0, 7)]);
        assert!(!capture(&[]).keeps_code_of(&before), "unloaded");
        assert!(
            !capture(&[code(0x1000, 0x3000, 0, 9)]).keeps_code_of(&before),
            "another file at the same address"
        );
        assert!(
            !capture(&[code(0x1000, 0x3000, 0x1000, 7)]).keeps_code_of(&before),
            "the same file at another offset"
        );
        assert!(
            !capture(&[code(0x1000, 0x2000, 0, 7)]).keeps_code_of(&before),
            "half of it unmapped"
        );
    }

    #[test]
    fn history_names_each_version_with_its_own_capture() {
        let a = capture(&[code(0x1000, 0x2000, 0, 7)]);
        let mut history = MapsHistory::new(a.clone());
        // A library added: same version, the latest capture answers for both.
        assert!(!history.capture(capture(&[
            code(0x1000, 0x2000, 0, 7),
            code(0x4000, 0x5000, 0, 8)
        ])));
        assert_eq!(history.version(), 0);
        assert_eq!(history.at(0).entries().len(), 2);
        // libswap: another file where the first was.
        assert!(history.capture(capture(&[code(0x1000, 0x2000, 0, 9)])));
        assert_eq!(history.version(), 1);
        assert_eq!(history.at(0).find(0x1800).unwrap().1.inode, 7);
        assert_eq!(history.at(1).find(0x1800).unwrap().1.inode, 9);
        history.forget_earlier();
        assert_eq!(history.version(), 1);
        assert_eq!(history.at(1).find(0x1800).unwrap().1.inode, 9);
        // A forgotten version falls back to the latest capture.
        assert_eq!(history.at(0).find(0x1800).unwrap().1.inode, 9);
    }

    #[test]
    fn a_process_that_keeps_replacing_its_code_holds_a_bounded_history() {
        let mut history = MapsHistory::new(capture(&[code(0x1000, 0x2000, 0, 1)]));
        for inode in 2..1000 {
            history.capture(capture(&[code(0x1000, 0x2000, 0, inode)]));
        }
        assert_eq!(history.versions.len(), MAX_VERSIONS);
        assert_eq!(history.latest().entries()[0].inode, 999);
    }
}
