//! Surviving files that shrink under a mapping.
//!
//! Binaries and debug files are mapped rather than read, so a daemon that has parsed hundreds
//! of them keeps only the pages a lookup touches. But any user who can write such a file (a
//! library in their home, a container's own root filesystem) can truncate it, and the next
//! read of a page past the new end raises SIGBUS, whose default action kills the daemon.
//!
//! [`guard`] registers a mapping's address range. The process-wide SIGBUS handler looks the
//! faulting address up among the registered ranges and, when it is in one, maps a page of
//! zeros over the faulting page (`mmap(MAP_FIXED | MAP_ANONYMOUS)` is async-signal-safe) and
//! returns: the read is retried and sees zeros, which the ELF and DWARF parsers already treat
//! as malformed input. A fault anywhere else is a real bug: the handler restores the default
//! action and returns, so the retried access dies as it would have without the handler.
//!
//! The registry is a fixed array of atomics, because the handler may run at any instant and
//! can neither lock nor allocate.

use std::sync::{
    atomic::{AtomicU64, AtomicUsize, Ordering},
    Once,
};

/// Mappings guarded at once. The symbol cache holds far fewer files than this; beyond it the
/// caller reads the file into memory instead of mapping it.
const SLOTS: usize = 4096;

struct Slot {
    /// Start address; 0 when the slot is free. Written last on registration, first on release.
    start: AtomicUsize,
    /// One past the end.
    end: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)] // Only to build the array below.
const FREE: Slot = Slot {
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
};
static REGISTRY: [Slot; SLOTS] = [FREE; SLOTS];
static PAGE_SIZE: AtomicUsize = AtomicUsize::new(4096);
static FAULTS: AtomicU64 = AtomicU64::new(0);
static INSTALL: Once = Once::new();

/// A registered range; dropping it unregisters the range.
#[derive(Debug)]
pub struct Guarded {
    slot: usize,
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if let Some(slot) = REGISTRY.get(self.slot) {
            slot.start.store(0, Ordering::Release);
            slot.end.store(0, Ordering::Release);
        }
    }
}

/// Registers `[start, start + len)`, a read-only mapping of a file someone else may shrink;
/// `None` when every slot is taken (map nothing then: read the file instead).
pub fn guard(start: *const u8, len: usize) -> Option<Guarded> {
    install();
    let start = start as usize;
    let end = start.checked_add(len)?;
    if start == 0 || len == 0 {
        return None;
    }
    for (index, slot) in REGISTRY.iter().enumerate() {
        // Claim a free slot by its end first (the handler matches only on a nonzero start).
        if slot
            .end
            .compare_exchange(0, end, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            slot.start.store(start, Ordering::Release);
            return Some(Guarded { slot: index });
        }
    }
    None
}

/// Pages of zeros mapped over a shrunk file so far.
pub fn faults() -> u64 {
    FAULTS.load(Ordering::Relaxed)
}

fn install() {
    INSTALL.call_once(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            PAGE_SIZE.store(page as usize, Ordering::Relaxed);
        }
        // SAFETY: an all-zero sigaction is a valid start; the handler has the SA_SIGINFO
        // signature and only does async-signal-safe work.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) != 0 {
                tracing::warn!(
                    "installing the SIGBUS handler: {}; a mapped file that shrinks will stop \
                     the daemon",
                    std::io::Error::last_os_error()
                );
            }
        }
    });
}

extern "C" fn on_sigbus(
    _signal: libc::c_int,
    info: *mut libc::siginfo_t,
    _context: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler; si_addr is the
    // faulting address for SIGBUS.
    let address = unsafe { (*info).si_addr() } as usize;
    let page = PAGE_SIZE.load(Ordering::Relaxed);
    for slot in REGISTRY.iter() {
        let start = slot.start.load(Ordering::Acquire);
        if start == 0 || address < start || address >= slot.end.load(Ordering::Acquire) {
            continue;
        }
        let page_start = address & !(page - 1);
        // SAFETY: the page lies in a read-only file mapping this process made and registered;
        // replacing it with zeros changes only what that mapping reads.
        let mapped = unsafe {
            libc::mmap(
                page_start as *mut libc::c_void,
                page,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if mapped != libc::MAP_FAILED {
            FAULTS.fetch_add(1, Ordering::Relaxed);
            return;
        }
        break;
    }
    // Not a guarded mapping: a bug. Die as SIGBUS would have, on the retried access.
    // SAFETY: resetting a signal's disposition is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGBUS, libc::SIG_DFL);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn a_file_truncated_under_its_mapping_reads_as_zeros() {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&vec![0xabu8; 64 << 10]).unwrap();
        // SAFETY: the test's own temporary file, truncated below on purpose.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let guarded = guard(map.as_ptr(), map.len()).unwrap();
        assert_eq!(map[0], 0xab);
        let before = faults();
        file.set_len(0).unwrap();
        // Without the guard, this read would kill the test process with SIGBUS.
        let sum: u64 = map.iter().map(|&b| u64::from(b)).sum();
        assert_eq!(sum, 0);
        assert!(faults() > before);
        drop(guarded);
        drop(map);
    }

    #[test]
    fn slots_are_given_back() {
        let data = [1u8; 16];
        let first = guard(data.as_ptr(), data.len()).unwrap();
        let slot = first.slot;
        drop(first);
        let again = guard(data.as_ptr(), data.len()).unwrap();
        assert_eq!(again.slot, slot);
    }
}
