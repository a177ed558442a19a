//! Pointer authentication: the bits of a user return address that hold its code, as the
//! running kernel places them. A function built with `-mbranch-protection` signs x30
//! (`paciasp`) before saving it, and the BPF walk reads it from the stack signed: it must
//! clear those bits before looking the address up. Where they are depends on the kernel's
//! virtual address size (bits 54 down to 48 with 48-bit addresses, 54 to 52 with 52-bit
//! ones), so the mask is asked of the kernel, not assumed.
//!
//! The kernel reports it per process through ptrace (`PTRACE_GETREGSET`, `NT_ARM_PAC_MASK`:
//! `{data_mask, insn_mask}`); the agent asks it of a child of its own, stopped for the
//! purpose, so no other process is ever traced.

/// What `NT_ARM_PAC_MASK` reported, or why it could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeMask {
    /// The bits of an instruction address that hold its authentication code.
    Bits(u64),
    /// The CPU or the kernel has no pointer authentication for user space (the regset does
    /// not exist: `EINVAL` or `ENODEV`): return addresses are never signed.
    Unsupported,
}

/// Why the mask could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading the pointer-authentication mask (NT_ARM_PAC_MASK) of a stopped child: {0}")]
pub struct PacError(#[source] std::io::Error);

/// The mask of the bits a user return address's code occupies, from the kernel.
#[cfg(target_arch = "aarch64")]
pub fn code_mask() -> Result<CodeMask, PacError> {
    use std::io::Error;
    const NT_ARM_PAC_MASK: libc::c_int = 0x406;
    // SAFETY: the child only calls async-signal-safe functions (ptrace, raise, _exit), as a
    // fork of a multi-threaded process must.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(PacError(Error::last_os_error()));
    }
    if child == 0 {
        // SAFETY: see above; the child never returns into the agent.
        unsafe {
            libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0);
            libc::raise(libc::SIGSTOP);
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    let waited = unsafe { libc::waitpid(child, &mut status, 0) };
    let result = if waited != child {
        Err(PacError(Error::last_os_error()))
    } else if !libc::WIFSTOPPED(status) {
        Err(PacError(Error::other(format!(
            "the child did not stop (wait status {status:#x})"
        ))))
    } else {
        let mut masks = [0u64; 2];
        let mut iov = libc::iovec {
            iov_base: masks.as_mut_ptr().cast(),
            iov_len: std::mem::size_of_val(&masks),
        };
        // SAFETY: `iov` describes `masks`, which the kernel fills at most.
        let read = unsafe {
            libc::ptrace(
                libc::PTRACE_GETREGSET,
                child,
                NT_ARM_PAC_MASK as usize as *mut libc::c_void,
                (&mut iov as *mut libc::iovec).cast::<libc::c_void>(),
            )
        };
        if read == 0 {
            Ok(CodeMask::Bits(masks[1]))
        } else {
            let error = Error::last_os_error();
            match error.raw_os_error() {
                Some(libc::EINVAL) | Some(libc::ENODEV) => Ok(CodeMask::Unsupported),
                _ => Err(PacError(error)),
            }
        }
    };
    // SAFETY: the child is ours and stopped; it is killed and reaped whatever happened.
    unsafe {
        libc::kill(child, libc::SIGKILL);
        libc::waitpid(child, &mut status, 0);
    }
    result
}

/// The bits the BPF walk keeps of a return address: below the code (user addresses are at
/// most 52 bits wide), or all of a user address where nothing is signed. Without the
/// kernel's answer, the 48 bits every kernel gives user space unless a process asks `mmap`
/// for more.
pub fn address_mask(code: Option<CodeMask>) -> u64 {
    const USER_BITS: u64 = (1 << 55) - 1;
    match code {
        Some(CodeMask::Bits(bits)) => USER_BITS & !bits,
        Some(CodeMask::Unsupported) => USER_BITS,
        None => (1 << 48) - 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_masks_keep_the_address_below_the_code() {
        // Debian's 6.1 (48-bit addresses) and 6.12 (52-bit) under qemu, and return addresses
        // signed there.
        let six_one = address_mask(Some(CodeMask::Bits(0x007f_0000_0000_0000)));
        assert_eq!(0x0014_0000_0040_0648 & six_one, 0x40_0648);
        let six_twelve = address_mask(Some(CodeMask::Bits(0x0070_0000_0000_0000)));
        assert_eq!(0x0070_ffff_a833_2820 & six_twelve, 0xffff_a833_2820);
        // A 52-bit address keeps its top bits where they are no code.
        assert_eq!(0x000f_0000_0000_1000 & six_twelve, 0x000f_0000_0000_1000);
        assert_eq!(address_mask(None), 0xffff_ffff_ffff);
        assert_eq!(address_mask(Some(CodeMask::Unsupported)) >> 55, 0);
    }
}
