//! `PROCMAP_QUERY` (Linux 6.11): a process's mappings asked of its open `/proc/PID/maps` one
//! at a time, filtered by the kernel, as binary records.
//!
//! The agent reads a process's maps at its first sample, and a build host starts hundreds of
//! processes a second. Read as text, the kernel formats every mapping (Debian's `python3 -c
//! pass`: 43 lines, a path resolved for each of its 30-odd file mappings) and the agent parses
//! them all, to keep the 7 that hold code. Asked this way, the kernel skips the others and
//! resolves 7 paths. Kernels before 6.11 answer `ENOTTY`; the caller then reads the text.

use std::{
    fs::File,
    io,
    os::fd::AsRawFd,
    sync::atomic::{AtomicBool, Ordering},
};

/// `_IOWR('f', 17, struct procmap_query)`, from `include/uapi/linux/fs.h`.
const PROCMAP_QUERY: libc::c_ulong = 0xC068_6611;
/// The VMA must be executable.
const QUERY_VMA_EXECUTABLE: u64 = 0x04;
/// The VMA at the address, or else the next one that matches.
const QUERY_COVERING_OR_NEXT_VMA: u64 = 0x10;

/// The longest name asked for: a path the kernel resolves (`PATH_MAX`) with the ` (deleted)`
/// it appends to an unlinked file's.
const NAME_CAPACITY: usize = 4096 + 16;

/// What a mapping's line of text takes besides its name, counted against the caller's limit.
const LINE_BYTES: usize = 64;

/// `struct procmap_query`, as the kernel lays it out (104 bytes, no padding).
#[repr(C)]
#[derive(Debug, Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

const _: () = assert!(std::mem::size_of::<ProcmapQuery>() == 104);

/// Set once the kernel has answered `ENOTTY`: it has no such query, and every process's maps
/// are read as text without asking again.
static UNSUPPORTED: AtomicBool = AtomicBool::new(false);

#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// This kernel has no `PROCMAP_QUERY` (before 6.11).
    #[error("this kernel has no PROCMAP_QUERY")]
    Unsupported,
    /// The process's executable mappings come to more than the caller takes.
    #[error("executable mappings over {limit} bytes")]
    TooLarge { limit: usize },
    /// A mapping's name does not fit the buffer (a path near `PATH_MAX`).
    #[error("a mapping's name is longer than {NAME_CAPACITY} bytes")]
    NameTooLong,
    #[error("{0}")]
    Io(io::Error),
}

/// One executable mapping, as the kernel describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeVma {
    pub start: u64,
    pub end: u64,
    /// Offset in the file of `start` (0 for anonymous memory).
    pub offset: u64,
    pub dev_major: u32,
    pub dev_minor: u32,
    pub inode: u64,
    /// The path (with ` (deleted)` for an unlinked file), a pseudo name such as `[vdso]`, or
    /// empty; not necessarily UTF-8.
    pub name: Vec<u8>,
}

/// The executable mappings of the process whose `/proc/PID/maps` is `maps`, in address order,
/// at most `limit` bytes of them (each counted as its line of text would be, about 64 bytes
/// and its name): the process decides how many it has (up to `vm.max_map_count`, 65,530 by
/// default) and how long their names are.
///
/// Each query takes the process's mappings as they are at that moment: a mapping added or
/// removed between two queries is seen or not, as a text read racing the same change would.
/// Addresses only grow from one query to the next, so the walk ends.
pub fn executable_vmas(maps: &File, limit: usize) -> Result<Vec<CodeVma>, QueryError> {
    if UNSUPPORTED.load(Ordering::Relaxed) {
        return Err(QueryError::Unsupported);
    }
    let mut name = vec![0u8; NAME_CAPACITY];
    let mut vmas = Vec::new();
    let mut bytes = 0usize;
    let mut address = 0u64;
    loop {
        let mut query = ProcmapQuery {
            size: std::mem::size_of::<ProcmapQuery>() as u64,
            query_flags: QUERY_VMA_EXECUTABLE | QUERY_COVERING_OR_NEXT_VMA,
            query_addr: address,
            vma_name_size: NAME_CAPACITY as u32,
            vma_name_addr: name.as_mut_ptr() as u64,
            ..ProcmapQuery::default()
        };
        // SAFETY: `query` is a `struct procmap_query` of the size it declares, and its name
        // buffer is `NAME_CAPACITY` writable bytes that outlive the call.
        let result = unsafe { libc::ioctl(maps.as_raw_fd(), PROCMAP_QUERY, &mut query) };
        if result != 0 {
            let err = io::Error::last_os_error();
            return match err.raw_os_error() {
                // No executable mapping at or after `address`: the walk is done.
                Some(libc::ENOENT) => Ok(vmas),
                Some(libc::ENOTTY) => {
                    UNSUPPORTED.store(true, Ordering::Relaxed);
                    Err(QueryError::Unsupported)
                }
                Some(libc::ENAMETOOLONG) => Err(QueryError::NameTooLong),
                _ => Err(QueryError::Io(err)),
            };
        }
        // The kernel's answer is trusted no further than its shape: a range that does not
        // move forward would loop, and a name size past the buffer would read beyond it.
        if query.vma_end <= query.vma_start || query.vma_end <= address {
            return Err(QueryError::Io(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "PROCMAP_QUERY at {address:#x} answered the range {:#x}-{:#x}",
                    query.vma_start, query.vma_end
                ),
            )));
        }
        // The size counts the name's terminating NUL.
        let len = (query.vma_name_size as usize)
            .saturating_sub(1)
            .min(NAME_CAPACITY);
        bytes += LINE_BYTES + len;
        if bytes > limit {
            return Err(QueryError::TooLarge { limit });
        }
        vmas.push(CodeVma {
            start: query.vma_start,
            end: query.vma_end,
            offset: query.vma_offset,
            dev_major: query.dev_major,
            dev_minor: query.dev_minor,
            inode: query.inode,
            name: name[..len].to_vec(),
        });
        address = query.vma_end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether this kernel answers the query (6.11 and later).
    fn supported(maps: &File) -> bool {
        !matches!(executable_vmas(maps, 1 << 16), Err(QueryError::Unsupported))
    }

    #[test]
    fn gives_the_executable_lines_of_the_text() {
        let maps = File::open("/proc/self/maps").unwrap();
        if !supported(&maps) {
            eprintln!("skipped: this kernel has no PROCMAP_QUERY");
            return;
        }
        // Read both before and after, so a mapping the test harness's threads added in
        // between does not fail the comparison: the query must match one of the texts.
        let before = std::fs::read_to_string("/proc/self/maps").unwrap();
        let vmas = executable_vmas(&maps, 1 << 16).unwrap();
        let after = std::fs::read_to_string("/proc/self/maps").unwrap();
        let expected = |text: &str| -> Vec<CodeVma> {
            text.lines()
                .filter_map(|line| {
                    let mut fields = line.splitn(6, ' ');
                    let (range, perms, offset, dev, inode) = (
                        fields.next()?,
                        fields.next()?,
                        fields.next()?,
                        fields.next()?,
                        fields.next()?,
                    );
                    let name = fields.next().unwrap_or("").trim_start();
                    // The vsyscall page is the kernel's, in no process's list of mappings:
                    // the query does not give it (and no libc calls into it any more).
                    (perms.as_bytes()[2] == b'x' && name != "[vsyscall]").then(|| {
                        let (start, end) = range.split_once('-').unwrap();
                        let (major, minor) = dev.split_once(':').unwrap();
                        let hex = |s: &str| u64::from_str_radix(s, 16).unwrap();
                        CodeVma {
                            start: hex(start),
                            end: hex(end),
                            offset: hex(offset),
                            dev_major: hex(major) as u32,
                            dev_minor: hex(minor) as u32,
                            inode: inode.parse().unwrap(),
                            name: name.as_bytes().to_vec(),
                        }
                    })
                })
                .collect()
        };
        assert!(vmas.iter().any(|v| v.name == b"[vdso]"), "{vmas:?}");
        let names = |vmas: &[CodeVma]| -> Vec<String> {
            vmas.iter()
                .map(|v| {
                    format!(
                        "{:x}-{:x} {}",
                        v.start,
                        v.end,
                        String::from_utf8_lossy(&v.name)
                    )
                })
                .collect()
        };
        assert!(
            vmas == expected(&before) || vmas == expected(&after),
            "{:#?}\n{before}",
            names(&vmas)
        );
    }

    #[test]
    fn more_mappings_than_the_limit_is_an_error() {
        let maps = File::open("/proc/self/maps").unwrap();
        if !supported(&maps) {
            eprintln!("skipped: this kernel has no PROCMAP_QUERY");
            return;
        }
        assert!(matches!(
            executable_vmas(&maps, 100),
            Err(QueryError::TooLarge { limit: 100 })
        ));
    }

    #[test]
    fn a_reaped_process_is_an_error() {
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .unwrap();
        let maps = File::open(format!("/proc/{}/maps", child.id())).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        match executable_vmas(&maps, 1 << 16) {
            Err(QueryError::Unsupported) => eprintln!("skipped: no PROCMAP_QUERY"),
            Err(QueryError::Io(err)) => assert_eq!(err.raw_os_error(), Some(libc::ESRCH)),
            other => panic!("{other:?}"),
        }
    }
}
