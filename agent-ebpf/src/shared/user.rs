//! Reads of the sampled process's memory, which every walk and runtime makes: one place for
//! the helper's one `unsafe`. Every address comes from the process and may be anything; the
//! helper checks it, and a fault is `None` (or `false`), never a crash.

use core::ffi::c_void;

use aya_ebpf::helpers::{bpf_probe_read_user, generated};

/// The value of type `T` at `address`.
#[inline(always)]
pub fn read<T>(address: u64) -> Option<T> {
    // SAFETY: bpf_probe_read_user checks the address; a fault is an error, never a crash.
    unsafe { bpf_probe_read_user(address as *const T) }.ok()
}

#[inline(always)]
pub fn read_u64(address: u64) -> Option<u64> {
    read(address)
}

#[inline(always)]
pub fn read_u32(address: u64) -> Option<u32> {
    read(address)
}

#[inline(always)]
pub fn read_u8(address: u64) -> Option<u8> {
    read(address)
}

/// Fills `into` (a buffer in a map value: too large for the BPF stack) with the bytes at
/// `address`; false when they cannot all be read.
#[inline(always)]
pub fn read_into<T>(into: &mut T, address: u64) -> bool {
    // SAFETY: the destination is `into`, exactly `size_of::<T>()` bytes; the helper checks
    // the source address.
    let result = unsafe {
        generated::bpf_probe_read_user(
            (into as *mut T).cast::<c_void>(),
            core::mem::size_of::<T>() as u32,
            address as *const c_void,
        )
    };
    result == 0
}
