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

/// The heap one thread holds, counted for the tests that bound it: every allocation of the
/// test binary goes through this allocator, and a thread counts only while it measures.
#[cfg(test)]
pub mod counting {
    use std::{
        alloc::{GlobalAlloc, Layout, System},
        cell::Cell,
    };

    struct Counting;

    #[global_allocator]
    static ALLOCATOR: Counting = Counting;

    thread_local! {
        /// While this thread measures: the bytes it holds above what it held when it began,
        /// and the most it held. Other threads (the tests beside it) are not counted.
        static HELD: Cell<Option<(isize, isize)>> = const { Cell::new(None) };
    }

    fn count(delta: isize) {
        // `try_with`: an allocation while the thread's locals are torn down is not counted.
        let _ = HELD.try_with(|held| {
            if let Some((now, peak)) = held.get() {
                let now = now + delta;
                held.set(Some((now, peak.max(now))));
            }
        });
    }

    // SAFETY: every call goes to the system allocator unchanged; counting only reads sizes.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: as the caller's contract for `alloc`.
            let pointer = unsafe { System.alloc(layout) };
            if !pointer.is_null() {
                count(layout.size() as isize);
            }
            pointer
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            // SAFETY: as the caller's contract for `alloc_zeroed`.
            let pointer = unsafe { System.alloc_zeroed(layout) };
            if !pointer.is_null() {
                count(layout.size() as isize);
            }
            pointer
        }

        unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
            // SAFETY: as the caller's contract for `dealloc`.
            unsafe { System.dealloc(pointer, layout) };
            count(-(layout.size() as isize));
        }

        /// Counted as the change of size: glibc moves a block above its mmap threshold with
        /// `mremap`, never holding both, and a table's blocks are that large.
        unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: as the caller's contract for `realloc`.
            let moved = unsafe { System.realloc(pointer, layout, new_size) };
            if !moved.is_null() {
                count(new_size as isize - layout.size() as isize);
            }
            moved
        }
    }

    /// Runs `f` on this thread and returns what it returned, with the most heap the thread
    /// held while it ran, above what it held before.
    pub fn peak_heap<R>(f: impl FnOnce() -> R) -> (R, usize) {
        HELD.with(|held| held.set(Some((0, 0))));
        let result = f();
        let (_, peak) = HELD.with(|held| held.replace(None)).unwrap_or_default();
        (result, peak.max(0) as usize)
    }
}
