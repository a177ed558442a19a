//! Maps the agent creates while it runs and puts in one of the program's arrays of maps
//! (`BPF_MAP_TYPE_ARRAY_OF_MAPS`), through the `bpf(2)` calls aya 0.14 lacks: creating a map
//! with a BTF description of its own, and setting or clearing an outer array's slot. The
//! unwinder's row pools and process map, and the sampler's stack maps, are made this way, so
//! each is sized by what it holds rather than at its ceiling when the program loads.

use std::os::fd::AsRawFd;

use aya::maps::{MapData, MapError, MapFd};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_BTF_LOAD: libc::c_long = 18;
pub const BPF_MAP_TYPE_HASH: u32 = 1;
pub const BPF_MAP_TYPE_ARRAY: u32 = 2;
pub const BPF_MAP_TYPE_STACK_TRACE: u32 = 7;

/// Creates a map to go in one of the program's outer arrays, keyed by `u32`, with a BTF
/// description of its key and value.
///
/// The kernel puts a map in an outer array only if it matches the array's template, which
/// aya created with the program's BTF; and 6.1 compares where each keeps a `bpf_timer` in
/// its value, which it finds through BTF, and records as "unknown" for a map created without
/// (6.6 and later compare the fields found, none for both). So the map gets a small BTF of its
/// own: a `u32` key, and a value struct of the right size with no timer in it. A stack-trace
/// map gets none: the kernel refuses BTF on one (`ENOTSUPP`), so its template has none either.
pub fn create_inner(
    map_type: u32,
    value_size: u32,
    max_entries: u32,
    flags: u32,
    name: &str,
) -> Result<MapData, InnerMapError> {
    let btf_fd = if map_type == BPF_MAP_TYPE_STACK_TRACE {
        None
    } else {
        Some(described(value_size)?)
    };
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
        btf_fd: btf_fd.as_ref().map_or(0, |fd| fd.as_raw_fd() as u32),
        btf_key_type_id: if btf_fd.is_some() { BTF_KEY } else { 0 },
        btf_value_type_id: if btf_fd.is_some() { BTF_VALUE } else { 0 },
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

/// [`value_btf`] loaded: the kernel's descriptor for it, or why it was refused, with the
/// kernel's log.
fn described(value_size: u32) -> Result<std::os::fd::OwnedFd, InnerMapError> {
    let btf = value_btf(value_size);
    load_btf(&btf, None).or_else(|_| {
        // Again with a log, for the reason.
        let mut log = vec![0u8; 64 * 1024];
        load_btf(&btf, Some(&mut log)).map_err(|source| {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            InnerMapError::Btf {
                source,
                log: String::from_utf8_lossy(&log[..end]).trim().to_owned(),
            }
        })
    })
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

/// Puts `inner` in slot `index` of the array of maps `outer`: the BPF side finds it from its
/// next lookup on, and a walk that looked up the map before keeps that one to its end.
pub fn set_inner(outer: &MapFd, index: u32, inner: &MapFd) -> std::io::Result<()> {
    let mut inner = inner.as_fd_raw() as u32;
    element_command(BPF_MAP_UPDATE_ELEM, outer, index, Some(&mut inner))
}

/// Empties slot `index` of the array of maps `outer`; the kernel frees the map that was there
/// once no program holds it and its last descriptor is closed.
pub fn clear_inner(outer: &MapFd, index: u32) -> std::io::Result<()> {
    element_command(BPF_MAP_DELETE_ELEM, outer, index, None)
}

/// `BPF_MAP_UPDATE_ELEM` (with the inner map's fd) or `BPF_MAP_DELETE_ELEM` (without) of
/// `index` in the outer array of maps. aya 0.14's `ArrayOfMaps` sets an element but cannot
/// remove one, and keeps its descriptor to itself.
fn element_command(
    command: libc::c_long,
    map: &MapFd,
    index: u32,
    value: Option<&mut u32>,
) -> std::io::Result<()> {
    let value = value.map_or(0, |value| std::ptr::from_mut(value) as u64);
    // The key and value point at live u32s (an array of maps' key and value are both 4 bytes);
    // a lookup writes the value.
    element_call(command, map.as_fd_raw(), &index, value)
}

/// The element commands' part of `union bpf_attr`.
#[repr(C)]
struct ElementAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// An element command on map `fd` with a `u32` key and `value` (a pointer, or 0 for none),
/// which the caller keeps live and of the map's value size for the call.
fn element_call(command: libc::c_long, fd: i32, key: &u32, value: u64) -> std::io::Result<()> {
    let attr = ElementAttr {
        map_fd: fd as u32,
        _pad: 0,
        key: std::ptr::from_ref(key) as u64,
        value,
        flags: 0,
    };
    bpf_call(command, &attr).map(drop)
}

/// `MapFd` to a raw fd, for `mmap` and the attributes above.
pub trait AsFdRaw {
    fn as_fd_raw(&self) -> i32;
}

impl AsFdRaw for MapFd {
    fn as_fd_raw(&self) -> i32 {
        std::os::fd::AsFd::as_fd(self).as_raw_fd()
    }
}

/// A hash map keyed by `u32` (a tgid) whose values the agent writes as bytes: a runtime's
/// per-process map, whose value type only the runtime knows. The value's size is checked
/// against the map's own, as the kernel reads the map's size from the pointer it is given.
pub struct BytesMap {
    /// The map, taken from the loaded program.
    data: MapData,
    /// Its value size, from the kernel.
    value_size: usize,
}

/// Why a [`BytesMap`] write did not happen.
#[derive(Debug, thiserror::Error)]
pub enum BytesMapError {
    #[error("reading the map's key and value sizes: {0}")]
    Info(MapError),
    #[error("the map's key is {0} bytes, not a u32")]
    KeySize(u32),
    #[error("a value of {given} bytes for a map whose values are {expected}")]
    ValueSize { given: usize, expected: usize },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl BytesMap {
    pub fn new(data: MapData) -> Result<BytesMap, BytesMapError> {
        let info = data.info().map_err(BytesMapError::Info)?;
        if info.key_size() != 4 {
            return Err(BytesMapError::KeySize(info.key_size()));
        }
        let value_size = info.value_size() as usize;
        Ok(BytesMap { data, value_size })
    }

    /// Sets `key`'s value to `value`, which must be the map's value size.
    pub fn insert(&self, key: u32, value: &[u8]) -> Result<(), BytesMapError> {
        if value.len() != self.value_size {
            return Err(BytesMapError::ValueSize {
                given: value.len(),
                expected: self.value_size,
            });
        }
        self.command(BPF_MAP_UPDATE_ELEM, key, value.as_ptr() as u64)?;
        Ok(())
    }

    /// Removes `key`; a key that is not there is no error.
    pub fn remove(&self, key: u32) -> Result<(), BytesMapError> {
        match self.command(BPF_MAP_DELETE_ELEM, key, 0) {
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            other => Ok(other?),
        }
    }

    fn command(&self, command: libc::c_long, key: u32, value: u64) -> std::io::Result<()> {
        // The key is a live u32 (the map's key size, checked); the value, when given, is a
        // live slice of the map's value size (checked by `insert`).
        element_call(command, self.data.fd().as_fd_raw(), &key, value)
    }
}
