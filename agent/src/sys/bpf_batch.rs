//! Batched reads of BPF hash maps: `BPF_MAP_LOOKUP_BATCH` and `BPF_MAP_LOOKUP_AND_DELETE_BATCH`
//! (Linux 5.6), which aya 0.14 does not wrap.
//!
//! Why: aya's iterator costs a `MAP_GET_NEXT_KEY` and a `MAP_LOOKUP_ELEM` per entry, and
//! emptying a map a `MAP_DELETE_ELEM` more; at 999 Hz those calls were most of a recording's
//! system time (issue 29). One batch call moves as many entries as its buffers hold.
//!
//! The kernel walks a hash map bucket by bucket and never splits a bucket between calls:
//! `ENOSPC` with nothing copied means the next bucket alone is larger than the buffer (grow it
//! and ask again from the same place); `ENOENT` means the walk reached the last bucket, and
//! the entries copied by that same call still count. `EINVAL` (a kernel before 5.6 does not
//! know the command), `ENOTSUPP` or `EOPNOTSUPP` (a map type without batch operations) on the
//! first call is [`BatchError::Unsupported`]: nothing was read or deleted, and the caller can
//! fall back to per-entry calls.

use std::{
    io,
    mem::{size_of, MaybeUninit},
    os::fd::{AsFd, AsRawFd, BorrowedFd},
};

use aya::{
    maps::{HashMap as BpfHashMap, IterableMap, MapData},
    Pod,
};

/// `BPF_MAP_LOOKUP_BATCH` in `enum bpf_cmd` (include/uapi/linux/bpf.h).
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// `BPF_MAP_LOOKUP_AND_DELETE_BATCH` in `enum bpf_cmd`.
const BPF_MAP_LOOKUP_AND_DELETE_BATCH: libc::c_long = 25;
/// The kernel's internal `ENOTSUPP`, which `bpf(2)` returns as is for a map type without
/// batch operations; libc has no name for it.
const ENOTSUPP: i32 = 524;

/// Bytes of keys and values one call may return: a few calls drain a full window (65,536
/// count keys of 20 bytes take six), without holding much memory while they do.
pub const BATCH_BYTES: usize = 256 * 1024;

/// Consecutive `EBUSY` answers tolerated before giving up: the kernel says that when a BPF
/// program on the same CPU holds the bucket's lock, which lasts microseconds.
const BUSY_RETRIES: u32 = 8;

/// The `batch` member of `union bpf_attr`, field for field as the UAPI lays it out (tested
/// below against aya's bindgen copy of the header). The kernel reads only as many bytes as
/// it is given and treats the rest of the union as zero.
#[repr(C)]
#[derive(Debug, Default)]
struct BatchAttr {
    /// Where to resume: 0 (NULL) to start, else a pointer to the previous call's `out_batch`.
    in_batch: u64,
    /// Pointer to where the kernel writes the position to resume from.
    out_batch: u64,
    /// Pointer to `count` keys.
    keys: u64,
    /// Pointer to `count` values.
    values: u64,
    /// In: entries the buffers hold. Out: entries copied.
    count: u32,
    map_fd: u32,
    /// `BPF_F_LOCK` only, for maps with spin locks; ours have none.
    elem_flags: u64,
    /// Must be zero.
    flags: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// The kernel has no batch operations for this map; nothing was read or deleted.
    #[error("{op} is not supported here: {source}")]
    Unsupported { op: &'static str, source: io::Error },
    #[error("{op}: {source}")]
    Syscall { op: &'static str, source: io::Error },
    #[error("{op}: one hash bucket holds more than {capacity} entries")]
    BucketTooLarge { op: &'static str, capacity: usize },
    #[error("{op}: the kernel returned no entry and no end")]
    NoProgress { op: &'static str },
}

/// What one batch call's result means for the walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Entries copied; more buckets remain.
    More,
    /// Entries copied (possibly none); that was the last bucket.
    Last,
    /// A bucket larger than the buffer: nothing copied, ask again with more room.
    Grow,
    /// A BPF program on this CPU held the bucket's lock: take what was copied, ask again.
    Busy,
    /// No batch operations for this map (or this kernel).
    Unsupported,
    /// Anything else: an error.
    Failed,
}

fn step(result: Result<(), i32>) -> Step {
    match result {
        Ok(()) => Step::More,
        Err(libc::ENOENT) => Step::Last,
        Err(libc::ENOSPC) => Step::Grow,
        Err(libc::EBUSY) => Step::Busy,
        Err(libc::EINVAL | libc::EOPNOTSUPP | ENOTSUPP) => Step::Unsupported,
        Err(_) => Step::Failed,
    }
}

/// Entries of `entry_size` bytes that fit in `bytes`, at least one.
pub fn capacity_for(bytes: usize, entry_size: usize) -> usize {
    (bytes / entry_size.max(1)).max(1)
}

/// The buffer size to retry with after `ENOSPC`: double, but a bucket never holds more than
/// the map's `max_entries` (at most `u32::MAX`, the width of `count`), so past that the
/// kernel's answer is wrong, not the buffer too small.
fn grown(capacity: usize) -> Option<usize> {
    const MOST: usize = u32::MAX as usize;
    (capacity < MOST).then(|| capacity.saturating_mul(2).min(MOST))
}

/// Every entry of `map`, handed to `each`; the map is left as it was (entries the BPF program
/// adds or removes meanwhile may or may not be seen, as with a per-entry walk).
pub fn lookup<K: Pod, V: Pod>(
    map: &BpfHashMap<MapData, K, V>,
    capacity: usize,
    each: impl FnMut(K, V),
) -> Result<(), BatchError> {
    let fd = map.map().fd().as_fd();
    walk(
        fd,
        BPF_MAP_LOOKUP_BATCH,
        "BPF_MAP_LOOKUP_BATCH",
        capacity,
        each,
    )
}

/// Every entry of `map`, handed to `each` and deleted. Meant for a map nothing else writes
/// meanwhile (a drained generation): an entry added behind the walk would stay.
pub fn take<K: Pod, V: Pod>(
    map: &mut BpfHashMap<MapData, K, V>,
    capacity: usize,
    each: impl FnMut(K, V),
) -> Result<(), BatchError> {
    let fd = map.map().fd().as_fd();
    walk(
        fd,
        BPF_MAP_LOOKUP_AND_DELETE_BATCH,
        "BPF_MAP_LOOKUP_AND_DELETE_BATCH",
        capacity,
        each,
    )
}

fn walk<K: Pod, V: Pod>(
    fd: BorrowedFd<'_>,
    command: libc::c_long,
    op: &'static str,
    capacity: usize,
    mut each: impl FnMut(K, V),
) -> Result<(), BatchError> {
    let mut capacity = capacity.clamp(1, u32::MAX as usize);
    let mut keys: Vec<MaybeUninit<K>> = Vec::new();
    let mut values: Vec<MaybeUninit<V>> = Vec::new();
    keys.resize_with(capacity, MaybeUninit::uninit);
    values.resize_with(capacity, MaybeUninit::uninit);
    // The position between calls. A hash map's is its bucket index (a u32); libbpf sizes it
    // as a key since other map types resume from a key. Words keep it aligned for either.
    let words = size_of::<K>()
        .max(size_of::<u32>())
        .div_ceil(size_of::<u64>());
    let mut position = vec![0u64; words];
    let mut next = vec![0u64; words];
    let mut started = false;
    let mut busy = 0;
    loop {
        let mut attr = BatchAttr {
            in_batch: if started { position.as_ptr() as u64 } else { 0 },
            out_batch: next.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: capacity as u32,
            map_fd: fd.as_raw_fd() as u32,
            elem_flags: 0,
            flags: 0,
        };
        // SAFETY: `attr` is a `batch` member laid out as the UAPI's, passed with its own size;
        // `keys` and `values` hold `count` elements of the map's key and value size (aya
        // checked both sizes when it typed the map), `position` and `next` at least a key
        // and a u32 each, all live and writable for the call. The kernel writes only those
        // and `attr.count`; `K` and `V` are `Pod`, so whatever bytes it writes are valid.
        let result = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                command,
                &mut attr as *mut BatchAttr,
                size_of::<BatchAttr>(),
            )
        };
        let errno = (result < 0).then(io::Error::last_os_error);
        let step = step(match &errno {
            None => Ok(()),
            Some(error) => Err(error.raw_os_error().unwrap_or(0)),
        });
        match step {
            Step::Grow => {
                capacity = grown(capacity).ok_or(BatchError::BucketTooLarge { op, capacity })?;
                keys.resize_with(capacity, MaybeUninit::uninit);
                values.resize_with(capacity, MaybeUninit::uninit);
                continue;
            }
            // Only the first call can tell: once one succeeded the command and map type are
            // known to work, and entries already taken could not be given back.
            Step::Unsupported if !started => {
                return Err(BatchError::Unsupported {
                    op,
                    source: errno.unwrap_or_else(|| io::Error::from_raw_os_error(libc::EINVAL)),
                });
            }
            Step::Unsupported | Step::Failed => {
                return Err(BatchError::Syscall {
                    op,
                    source: errno.unwrap_or_else(|| io::Error::from_raw_os_error(libc::EIO)),
                });
            }
            Step::Busy => {
                busy += 1;
                if busy > BUSY_RETRIES {
                    return Err(BatchError::Syscall {
                        op,
                        source: io::Error::from_raw_os_error(libc::EBUSY),
                    });
                }
            }
            Step::More | Step::Last => busy = 0,
        }
        let copied = (attr.count as usize).min(capacity);
        for (key, value) in keys.iter().zip(&values).take(copied) {
            // SAFETY: the kernel wrote the first `copied` keys and values (`attr.count`).
            each(unsafe { key.assume_init() }, unsafe { value.assume_init() });
        }
        if step == Step::Last {
            return Ok(());
        }
        // With room for at least one bucket the kernel copies something or says ENOSPC;
        // a success with nothing would loop forever.
        if copied == 0 && step == Step::More {
            return Err(BatchError::NoProgress { op });
        }
        std::mem::swap(&mut position, &mut next);
        started = true;
    }
}

#[cfg(test)]
mod tests {
    use std::mem::offset_of;

    use super::*;

    #[test]
    fn attr_matches_the_uapi() {
        // The offsets of include/uapi/linux/bpf.h's `batch` struct.
        assert_eq!(offset_of!(BatchAttr, in_batch), 0);
        assert_eq!(offset_of!(BatchAttr, out_batch), 8);
        assert_eq!(offset_of!(BatchAttr, keys), 16);
        assert_eq!(offset_of!(BatchAttr, values), 24);
        assert_eq!(offset_of!(BatchAttr, count), 32);
        assert_eq!(offset_of!(BatchAttr, map_fd), 36);
        assert_eq!(offset_of!(BatchAttr, elem_flags), 40);
        assert_eq!(offset_of!(BatchAttr, flags), 48);
        assert_eq!(size_of::<BatchAttr>(), 56);
    }

    #[test]
    fn attr_matches_bindgen() {
        // aya-obj's bindings are generated from the kernel header itself: a second source.
        use aya_obj::generated::{bpf_attr__bindgen_ty_3 as Uapi, bpf_cmd};
        assert_eq!(offset_of!(BatchAttr, in_batch), offset_of!(Uapi, in_batch));
        assert_eq!(
            offset_of!(BatchAttr, out_batch),
            offset_of!(Uapi, out_batch)
        );
        assert_eq!(offset_of!(BatchAttr, keys), offset_of!(Uapi, keys));
        assert_eq!(offset_of!(BatchAttr, values), offset_of!(Uapi, values));
        assert_eq!(offset_of!(BatchAttr, count), offset_of!(Uapi, count));
        assert_eq!(offset_of!(BatchAttr, map_fd), offset_of!(Uapi, map_fd));
        assert_eq!(
            offset_of!(BatchAttr, elem_flags),
            offset_of!(Uapi, elem_flags)
        );
        assert_eq!(offset_of!(BatchAttr, flags), offset_of!(Uapi, flags));
        assert_eq!(size_of::<BatchAttr>(), size_of::<Uapi>());
        assert_eq!(
            BPF_MAP_LOOKUP_BATCH,
            bpf_cmd::BPF_MAP_LOOKUP_BATCH as libc::c_long
        );
        assert_eq!(
            BPF_MAP_LOOKUP_AND_DELETE_BATCH,
            bpf_cmd::BPF_MAP_LOOKUP_AND_DELETE_BATCH as libc::c_long
        );
    }

    #[test]
    fn errors_map_to_steps() {
        assert_eq!(step(Ok(())), Step::More);
        assert_eq!(step(Err(libc::ENOENT)), Step::Last);
        assert_eq!(step(Err(libc::ENOSPC)), Step::Grow);
        assert_eq!(step(Err(libc::EBUSY)), Step::Busy);
        assert_eq!(step(Err(libc::EINVAL)), Step::Unsupported);
        assert_eq!(step(Err(libc::EOPNOTSUPP)), Step::Unsupported);
        assert_eq!(step(Err(524)), Step::Unsupported);
        assert_eq!(step(Err(libc::EPERM)), Step::Failed);
        assert_eq!(step(Err(libc::EFAULT)), Step::Failed);
    }

    #[test]
    fn buffers_grow_until_count_cannot_say_more() {
        assert_eq!(grown(1), Some(2));
        assert_eq!(grown(13_107), Some(26_214));
        assert_eq!(grown(u32::MAX as usize / 2 + 1), Some(u32::MAX as usize));
        assert_eq!(grown(u32::MAX as usize), None);
    }

    #[test]
    fn capacity_is_the_entries_that_fit() {
        // A count key (12 bytes) and its u64: 20 bytes an entry.
        assert_eq!(capacity_for(BATCH_BYTES, 20), 13_107);
        assert_eq!(capacity_for(BATCH_BYTES, BATCH_BYTES * 2), 1);
        assert_eq!(capacity_for(BATCH_BYTES, 0), BATCH_BYTES);
    }
}
