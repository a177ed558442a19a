//! The unwinder's BPF maps that the agent creates while it runs, behind the outer arrays the
//! program holds: the row pools the tables go in (`UNWIND_ROWS`) and the process map
//! (`UNWIND_PROCS`). Creating them as the work needs them, instead of at their ceilings when
//! the program loads, is what keeps a quiet host's map memory small.

use std::os::fd::AsRawFd;

use aya::maps::{MapData, MapError};
use scorch_common::{ProcMappings, UnwindRow, MAX_ROW_POOLS};

use super::loader::LoaderError;

/// The row pools' maps: each a `BPF_F_MMAPABLE` array the agent creates when the tables need
/// room, puts in `UNWIND_ROWS` (the outer array, owned by the [`UnwindMaps`] beside this in
/// [`Unwinder`]) and removes when its last table goes, which frees its memory.
///
/// Only the pages a table is written to are mapped into the agent, and only while it is
/// written: the kernel maps every page of a mapping of a BPF array at `mmap` time, so a
/// mapping of a whole pool kept open would count it in the daemon's RSS, although the memory
/// is the map's own (kernel memory, counted once in `scorch_bpf_map_memory_bytes`).
pub(super) struct PoolMaps {
    maps: Vec<Option<(MapData, u32)>>,
}

/// A pool's `map_flags`: `BPF_F_MMAPABLE | BPF_F_INNER_MAP`, as the BPF side's template
/// declares them (the kernel refuses an inner map whose flags differ).
const POOL_FLAGS: u32 = (1 << 10) | (1 << 12);

impl PoolMaps {
    pub(super) fn new() -> Self {
        PoolMaps {
            maps: (0..MAX_ROW_POOLS).map(|_| None).collect(),
        }
    }

    /// Creates pool `index` with `rows` rows and puts it in the outer array.
    pub(super) fn create(
        &mut self,
        outer: &MapData,
        index: u32,
        rows: u32,
    ) -> Result<(), LoaderError> {
        let map = create_inner(
            BPF_MAP_TYPE_ARRAY,
            std::mem::size_of::<UnwindRow>() as u32,
            rows,
            POOL_FLAGS,
            &format!("scorch_rows_{index}"),
        )
        .map_err(|source| LoaderError::CreatePool { rows, source })?;
        let inner = map.fd().as_fd_raw() as u32;
        element_command(BPF_MAP_UPDATE_ELEM, outer.fd(), index, Some(&inner))
            .map_err(|source| LoaderError::AddPool { index, source })?;
        if let Some(slot) = self.maps.get_mut(index as usize) {
            *slot = Some((map, rows));
        }
        Ok(())
    }

    /// Takes pool `index` out of the outer array and closes it. A walk that looked the pool up
    /// before keeps it until the walk ends (the kernel frees an inner map after an RCU grace
    /// period); no mapping points at it by then, as its tables were evicted first.
    pub(super) fn remove(&mut self, outer: &MapData, index: u32) {
        if let Err(source) = element_command(BPF_MAP_DELETE_ELEM, outer.fd(), index, None) {
            tracing::debug!("removing row pool {index} from UNWIND_ROWS: {source}");
        }
        if let Some(slot) = self.maps.get_mut(index as usize) {
            *slot = None;
        }
    }

    pub(super) fn write(
        &mut self,
        pool: u32,
        first_row: u32,
        rows: &[UnwindRow],
    ) -> Result<(), LoaderError> {
        let Some(Some((map, len))) = self.maps.get(pool as usize) else {
            return Err(LoaderError::NoPool(pool));
        };
        let first = first_row as usize;
        assert!(
            first + rows.len() <= *len as usize,
            "row range outside the pool"
        );
        let row = std::mem::size_of::<UnwindRow>();
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let start = first * row;
        let end = (first + rows.len()) * row;
        let map_start = start / page * page;
        let map_len = end.div_ceil(page) * page - map_start;
        let map_error = || LoaderError::MapPool {
            bytes: map_len,
            source: std::io::Error::last_os_error(),
        };
        // SAFETY: a fresh shared mapping of whole pages of the map's fd, inside the pool (the
        // kernel refuses a range past the map's size); nothing else maps these pages in this
        // process, and the BPF side reads these rows only once a process mapping points at
        // them, which is written after this.
        unsafe {
            let address = libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.fd().as_fd_raw(),
                map_start as libc::off_t,
            );
            if address == libc::MAP_FAILED {
                return Err(map_error());
            }
            let rows_at = address
                .cast::<u8>()
                .add(start - map_start)
                .cast::<UnwindRow>();
            std::ptr::copy_nonoverlapping(rows.as_ptr(), rows_at, rows.len());
            libc::munmap(address, map_len);
        }
        Ok(())
    }
}

/// The process map: a preallocated hash of [`ProcMappings`] by process, in `UNWIND_PROCS`'s one
/// slot.
pub(super) struct ProcMap {
    pub(super) map: aya::maps::HashMap<MapData, u32, ProcMappings>,
    pub(super) entries: u32,
}

impl ProcMap {
    /// An empty map of `entries` processes, not in place yet.
    fn new(entries: u32) -> Result<Self, LoaderError> {
        let failed = |source| LoaderError::CreateProcs { entries, source };
        let data = create_inner(
            BPF_MAP_TYPE_HASH,
            std::mem::size_of::<ProcMappings>() as u32,
            entries,
            0,
            "scorch_procs",
        )
        .map_err(failed)?;
        let map = aya::maps::HashMap::try_from(aya::maps::Map::HashMap(data))
            .map_err(|source| failed(InnerMapError::Wrap(source)))?;
        Ok(ProcMap { map, entries })
    }

    /// Puts this map in `outer`'s slot: the BPF side reads it from its next lookup on.
    fn put_in(&self, outer: &MapData) -> Result<(), LoaderError> {
        let inner = aya::maps::IterableMap::map(&self.map).fd().as_fd_raw() as u32;
        element_command(BPF_MAP_UPDATE_ELEM, outer.fd(), 0, Some(&inner))
            .map_err(|source| LoaderError::AddProcs { source })
    }

    /// An empty map of `entries` processes, in `outer`'s slot.
    pub(super) fn create(outer: &MapData, entries: u32) -> Result<Self, LoaderError> {
        let created = ProcMap::new(entries)?;
        created.put_in(outer)?;
        Ok(created)
    }

    /// A map of `entries` processes holding this one's, in its place. A process the BPF side
    /// forgets while the entries are copied (an exec, a library mapped over its code) is
    /// deleted from the old map; it is deleted from the new one too once the new one is in
    /// place, so no process keeps mappings the BPF side dropped.
    pub(super) fn replaced(&self, outer: &MapData, entries: u32) -> Result<Self, LoaderError> {
        let mut created = ProcMap::new(entries)?;
        let pids: Vec<u32> = self.map.keys().filter_map(Result::ok).collect();
        for &pid in &pids {
            if let Ok(value) = self.map.get(&pid, 0) {
                let _ = created.map.insert(pid, value, 0);
            }
        }
        created.put_in(outer)?;
        for pid in pids {
            if self.map.get(&pid, 0).is_err() {
                let _ = created.map.remove(&pid);
            }
        }
        tracing::info!(
            "BPF process map grown from {} to {entries} processes",
            self.entries
        );
        Ok(created)
    }
}

/// The process map's first size: room for the processes running twice over, at least 512
/// (1.25 MiB), within the ceiling.
pub fn initial_process_entries(running: usize, ceiling: u32) -> u32 {
    let wanted = u32::try_from(running.saturating_mul(2))
        .unwrap_or(u32::MAX)
        .max(512)
        .checked_next_power_of_two()
        .unwrap_or(u32::MAX);
    wanted.min(ceiling).max(1)
}

/// Whether a map insert failed for want of room.
pub(super) fn is_full(error: &MapError) -> bool {
    matches!(error, MapError::SyscallError(aya::sys::SyscallError { io_error, .. })
        if io_error.raw_os_error() == Some(libc::E2BIG))
}

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_BTF_LOAD: libc::c_long = 18;
const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_MAP_TYPE_ARRAY: u32 = 2;

/// Creates a map to go in one of the program's outer arrays, keyed by `u32`, with a BTF
/// description of its key and value.
///
/// The kernel puts a map in an outer array only if it matches the array's template, which
/// aya created with the program's BTF; and 6.1 compares where each keeps a `bpf_timer` in
/// its value, which it finds through BTF, and records as "unknown" for a map created without
/// (6.6 and later compare the fields found, none for both). So the map gets a small BTF of its
/// own: a `u32` key, and a value struct of the right size with no timer in it.
fn create_inner(
    map_type: u32,
    value_size: u32,
    max_entries: u32,
    flags: u32,
    name: &str,
) -> Result<MapData, InnerMapError> {
    let btf = value_btf(value_size);
    let btf_fd = load_btf(&btf, None).or_else(|_| {
        // Again with a log, for the reason.
        let mut log = vec![0u8; 64 * 1024];
        load_btf(&btf, Some(&mut log)).map_err(|source| {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            InnerMapError::Btf {
                source,
                log: String::from_utf8_lossy(&log[..end]).trim().to_owned(),
            }
        })
    })?;
    /// `union bpf_attr` for `BPF_MAP_CREATE`, up to `map_extra`.
    #[repr(C)]
    struct MapCreateAttr {
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        map_flags: u32,
        inner_map_fd: u32,
        numa_node: u32,
        map_name: [u8; 16],
        map_ifindex: u32,
        btf_fd: u32,
        btf_key_type_id: u32,
        btf_value_type_id: u32,
        btf_vmlinux_value_type_id: u32,
        map_extra: u64,
    }
    let mut map_name = [0u8; 16];
    // At most 15 bytes, NUL-terminated; scorch's names are ASCII.
    for (to, from) in map_name.iter_mut().zip(name.bytes().take(15)) {
        *to = from;
    }
    let attr = MapCreateAttr {
        map_type,
        key_size: std::mem::size_of::<u32>() as u32,
        value_size,
        max_entries,
        map_flags: flags,
        inner_map_fd: 0,
        numa_node: 0,
        map_name,
        map_ifindex: 0,
        btf_fd: btf_fd.as_raw_fd() as u32,
        btf_key_type_id: BTF_KEY,
        btf_value_type_id: BTF_VALUE,
        btf_vmlinux_value_type_id: 0,
        map_extra: 0,
    };
    // A plain attribute, no pointers.
    let fd = bpf(BPF_MAP_CREATE, &attr).map_err(|source| InnerMapError::Create {
        name: name.to_owned(),
        source,
    })?;
    // The map holds its own reference to the BTF: `btf_fd` closes here.
    MapData::from_fd(fd).map_err(InnerMapError::Wrap)
}

#[derive(Debug, thiserror::Error)]
pub enum InnerMapError {
    #[error("loading the BTF of its key and value: {source} ({log})")]
    Btf { source: std::io::Error, log: String },
    #[error("creating BPF map {name}: {source}")]
    Create {
        name: String,
        source: std::io::Error,
    },
    #[error("reading the new map's description: {0}")]
    Wrap(MapError),
}

/// Loads a BTF blob; with `log`, the kernel's account of it goes there.
fn load_btf(btf: &[u8], log: Option<&mut [u8]>) -> std::io::Result<std::os::fd::OwnedFd> {
    /// `union bpf_attr` for `BPF_BTF_LOAD`.
    #[repr(C)]
    struct BtfLoadAttr {
        btf: u64,
        log_buf: u64,
        btf_size: u32,
        log_size: u32,
        log_level: u32,
        /// Zero: a kernel refuses a command whose attribute has bytes past its fields set
        /// (6.1 ends `BPF_BTF_LOAD`'s here), and the struct's padding would be any value.
        _pad: u32,
    }
    let (log_buf, log_size, log_level) = match log {
        Some(log) => (log.as_mut_ptr() as u64, log.len() as u32, 1),
        None => (0, 0, 0),
    };
    let attr = BtfLoadAttr {
        btf: btf.as_ptr() as u64,
        log_buf,
        btf_size: btf.len() as u32,
        log_size,
        log_level,
        _pad: 0,
    };
    // The attribute points at `btf` and the log, live across the call, with their sizes.
    bpf(BPF_BTF_LOAD, &attr)
}

/// The BTF ids of [`value_btf`]'s key and value types.
const BTF_KEY: u32 = 1;
const BTF_VALUE: u32 = 4;

/// A BTF blob of four types: `[1] u32`, `[2] u8`, `[3] u8[value_size]`, and `[4] struct value
/// { u8 bytes[value_size]; }`.
fn value_btf(value_size: u32) -> Vec<u8> {
    const INT: u32 = 1 << 24;
    const ARRAY: u32 = 3 << 24;
    const STRUCT: u32 = 4 << 24;
    // Offsets into the string section.
    let strings = b"\0u32\0u8\0value\0bytes\0";
    let (u32_name, u8_name, value_name, bytes_name) = (1, 5, 8, 14);
    let types: Vec<u32> = vec![
        // [1] INT u32: 4 bytes, 32 bits, unsigned.
        u32_name,
        INT,
        4,
        32,
        // [2] INT u8.
        u8_name,
        INT,
        1,
        8,
        // [3] ARRAY of [2] indexed by [1].
        0,
        ARRAY,
        0,
        2,
        1,
        value_size,
        // [4] STRUCT of one member, [3] at bit 0.
        value_name,
        STRUCT | 1,
        value_size,
        bytes_name,
        3,
        0,
    ];
    let type_len = (types.len() * 4) as u32;
    let mut blob = Vec::new();
    blob.extend_from_slice(&0xeb9f_u16.to_le_bytes());
    blob.extend_from_slice(&[1, 0]);
    for word in [24, 0, type_len, type_len, strings.len() as u32] {
        blob.extend_from_slice(&word.to_le_bytes());
    }
    for word in types {
        blob.extend_from_slice(&word.to_le_bytes());
    }
    blob.extend_from_slice(strings);
    blob
}

/// The `bpf(2)` command `command` with `attr`; the descriptor it returns.
fn bpf<T>(command: libc::c_long, attr: &T) -> std::io::Result<std::os::fd::OwnedFd> {
    let fd = bpf_call(command, attr)?;
    // SAFETY: a descriptor the kernel just returned, owned by no one else.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd as i32) })
}

/// The `bpf(2)` command `command` with `attr`, which its callers lay out as the command's
/// part of `union bpf_attr` (padding zeroed), with any pointers in it live for the call.
fn bpf_call<T>(command: libc::c_long, attr: &T) -> std::io::Result<libc::c_long> {
    // SAFETY: `attr` is a `bpf_attr` prefix of its size for `command`, as the callers promise.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            std::ptr::from_ref(attr),
            std::mem::size_of::<T>(),
        )
    };
    if result < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;

/// `BPF_MAP_UPDATE_ELEM` (with the inner map's fd) or `BPF_MAP_DELETE_ELEM` (without) of
/// `index` in the outer array of maps. aya 0.14's `ArrayOfMaps` sets an element but cannot
/// remove one, and keeps its descriptor to itself.
fn element_command(
    command: libc::c_long,
    map: &aya::maps::MapFd,
    index: u32,
    value: Option<&u32>,
) -> std::io::Result<()> {
    /// The element commands' part of `union bpf_attr`.
    #[repr(C)]
    struct ElementAttr {
        map_fd: u32,
        _pad: u32,
        key: u64,
        value: u64,
        flags: u64,
    }
    let attr = ElementAttr {
        map_fd: map.as_fd_raw() as u32,
        _pad: 0,
        key: std::ptr::addr_of!(index) as u64,
        value: value.map_or(0, |value| std::ptr::from_ref(value) as u64),
        flags: 0,
    };
    // The key and value point at live u32s (an array of maps' key and value are both 4 bytes).
    bpf_call(command, &attr).map(drop)
}

/// `MapFd` to a raw fd for `mmap`.
trait AsFdRaw {
    fn as_fd_raw(&self) -> i32;
}

impl AsFdRaw for aya::maps::MapFd {
    fn as_fd_raw(&self) -> i32 {
        std::os::fd::AsFd::as_fd(self).as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_map_starts_at_twice_the_running_within_the_ceiling() {
        // A quiet host: the floor.
        assert_eq!(initial_process_entries(150, 8192), 512);
        // 700 running: 1400, to a power of two.
        assert_eq!(initial_process_entries(700, 8192), 2048);
        assert_eq!(initial_process_entries(100_000, 8192), 8192);
        // `--unwind-processes 1`.
        assert_eq!(initial_process_entries(150, 1), 1);
    }

    #[test]
    fn only_e2big_means_full() {
        let error = |code| {
            MapError::SyscallError(aya::sys::SyscallError {
                call: "bpf_map_update_elem",
                io_error: std::io::Error::from_raw_os_error(code),
            })
        };
        assert!(is_full(&error(libc::E2BIG)));
        assert!(!is_full(&error(libc::ENOMEM)));
        assert!(!is_full(&MapError::KeyNotFound));
    }
}
