//! The agent's switches (`CONTROL`) and the PID filter, read by every program that samples.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap},
};
use scorch_common::{Control, FILTER_DENY, FILTER_NONE, MAX_PID_FILTER};

/// Single entry: generation, PID filter switch, idle switch. Written only by the agent.
#[map]
pub static CONTROL: Array<Control> = Array::with_max_entries(1, 0);

/// PIDs (tgids) that `Control::filter_pids` selects (allow list) or excludes (deny list).
/// Value unused. Written by the agent only, so not preallocated.
#[map]
pub static PID_FILTER: HashMap<u32, u8> =
    HashMap::with_max_entries(MAX_PID_FILTER, crate::shared::flags::BPF_F_NO_PREALLOC);

/// Whether the PID filter lets `tgid`'s samples through: no filter, on the allow list, or off
/// the deny list. One lookup at most, before any stack is walked.
#[inline(always)]
pub fn process_wanted(control: &Control, tgid: u32) -> bool {
    if control.filter_pids == FILTER_NONE {
        return true;
    }
    // SAFETY: the value is only tested for presence, never read, so a concurrent update
    // from userspace cannot hand this program a torn value.
    let listed = unsafe { PID_FILTER.get(tgid) }.is_some();
    listed != (control.filter_pids == FILTER_DENY)
}

/// After an exec a process dropped by relabelling (in the deny list) runs another program,
/// which the agent judges again at its next sample: a shell or launcher forked, sampled
/// before its exec and dropped by its parent's name, would otherwise stay dropped. An allow
/// list is the user's pids and keeps them across an exec.
#[inline(always)]
pub fn forget_denied(tgid: u32) {
    if let Some(control) = CONTROL.get(0) {
        if control.filter_pids == FILTER_DENY {
            let _ = PID_FILTER.remove(&tgid);
        }
    }
}
