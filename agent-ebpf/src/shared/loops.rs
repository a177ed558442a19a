//! The `bpf_loop` (5.17+) wrapper every loop of the crate goes through: the verifier checks a
//! callback's one iteration rather than every path through an unrolled loop (6.1's gave up
//! at its million instructions on the unrolled searches of the walk).

use core::ffi::c_void;

use aya_ebpf::helpers::bpf_loop;

/// Runs `callback` up to `iterations` times over `context`, until it returns 1.
#[inline(always)]
pub fn repeat<T>(
    iterations: u32,
    callback: extern "C" fn(u64, *mut c_void) -> i64,
    context: &mut T,
) {
    // SAFETY: the callback has the signature bpf_loop calls and casts the context back to the
    // `T` it is given here, which outlives the call.
    unsafe {
        bpf_loop(
            iterations,
            callback as *mut c_void,
            (context as *mut T).cast(),
            0,
        )
    };
}
