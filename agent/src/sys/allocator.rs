//! glibc's allocator, tuned once at start and asked to give freed memory back after the
//! stages that allocate in bursts (symbolisation, encoding a window for a remote sink).

/// Fixes glibc's allocation thresholds, once at start, before any thread exists.
///
/// By default glibc raises its mmap threshold to the size of each large block freed (up to
/// 32 MiB) and its trim threshold to twice that, so after one window's big buffers, memory
/// freed at the top of a thread's arena is never given back; `malloc_trim` does not help
/// there, as it trims only the main arena's top. With the thresholds fixed, blocks over
/// 256 KiB come from mmap and go back when freed, and an arena's top is trimmed past 1 MiB.
/// A remote sink waiting out a server that is away is where this shows: its buffers come and
/// go every retry.
pub fn tune_allocator() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets the allocator's parameters; called before other threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 20);
    }
}

/// Returns freed heap memory to the OS. glibc keeps freed memory in its arenas until asked,
/// and memory an arena keeps is still this process's RSS.
pub fn release_free_memory() {
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Like [`release_free_memory`], but only when the allocator holds more than `threshold`
/// bytes of free memory: trimming every time would hand pages back only to fault them in
/// (and zero them) again on the next allocation.
pub fn release_free_memory_above(threshold: usize) {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallinfo2 only reads the allocator's statistics.
        let free = unsafe { libc::mallinfo2() }.fordblks;
        if free > threshold {
            release_free_memory();
        }
    }
    #[cfg(not(target_env = "gnu"))]
    let _ = threshold;
}
