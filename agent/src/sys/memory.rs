//! Reading another process's memory (`process_vm_readv`): what an interpreter's frames name
//! lives there. Every read is bounded by its caller and may fail at any time (the process
//! exits, the page is gone): a failure is an error, never a crash or a wait.

/// Reads `buffer.len()` bytes at `address` in process `pid`; `None` unless all were read.
pub fn read(pid: u32, address: u64, buffer: &mut [u8]) -> Option<()> {
    if buffer.is_empty() {
        return Some(());
    }
    let local = libc::iovec {
        iov_base: buffer.as_mut_ptr().cast(),
        iov_len: buffer.len(),
    };
    let remote = libc::iovec {
        iov_base: address as *mut libc::c_void,
        iov_len: buffer.len(),
    };
    // SAFETY: `local` describes `buffer`, writable for its length; the kernel checks `remote`
    // against the other process's address space and fails rather than fault.
    let read = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    (read == buffer.len() as isize).then_some(())
}

/// A little-endian u64 at `address` in `pid`.
pub fn read_u64(pid: u32, address: u64) -> Option<u64> {
    let mut bytes = [0u8; 8];
    read(pid, address, &mut bytes)?;
    Some(u64::from_le_bytes(bytes))
}
