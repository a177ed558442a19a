//! The ring buffer that tells the agent about unknown processes and pcs, and about stored
//! stacks it should read soon (`UnwindEvent`).

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::map,
    maps::{LruHashMap, RingBuf},
};
use scorch_common::{UnwindEvent, MAX_UNWIND_PROCS};

/// Unknown processes and pcs, for the agent to read their maps.
#[map]
static UNWIND_EVENTS: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);

/// When each process last sent an event (ns, `bpf_ktime_get_ns`): at most one per
/// `NOTIFY_INTERVAL_NS`, so a process running JIT code does not flood the agent.
#[map]
static NOTIFIED: LruHashMap<u32, u64> = LruHashMap::with_max_entries(MAX_UNWIND_PROCS, 0);

const NOTIFY_INTERVAL_NS: u64 = 250_000_000;

/// Tells the agent about an unknown process or pc, at most once per `NOTIFY_INTERVAL_NS` per
/// process.
#[inline(always)]
pub fn notify(tgid: u32, kind: u32, pc: u64) {
    // SAFETY: no arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: a plain u64 value; a concurrent update can at worst let one more event through.
    if let Some(&last) = unsafe { NOTIFIED.get(tgid) } {
        if now.wrapping_sub(last) < NOTIFY_INTERVAL_NS {
            return;
        }
    }
    let _ = NOTIFIED.insert(tgid, now, 0);
    // A full ring buffer drops the event; the next sample after the interval sends it again.
    let _ = UNWIND_EVENTS.output::<UnwindEvent>(UnwindEvent { tgid, kind, pc }, 0);
}

/// After an exec the process may be another program: its next unknown pc is told at once.
#[inline(always)]
pub fn forget(tgid: u32) {
    let _ = NOTIFIED.remove(tgid);
}
