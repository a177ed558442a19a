//! Off-CPU time: the `sched_switch` raw tracepoint (no tracefs, no kprobes, no BTF load-time
//! relocation), attached only with `--off-cpu`.
//!
//! At switch-out (the task leaving, which is still `current`), the thread's start time, state,
//! kernel stack and user stack go in `OFF_CPU_THREADS`, keyed by thread id and shared by every
//! CPU: a thread that wakes on another CPU finds its entry (the per-CPU map of the
//! OpenTelemetry profiler loses it, their issue 1348). The stacks are taken here because this
//! is the last moment they can be: at switch-in `current` is still the task leaving, whose
//! address space is the one mapped, so the woken task's user memory cannot be read, and this
//! kernel has no kprobes for a hook after the switch. The user stack is walked at every
//! switch-out (a thread's registers do not tell its callers apart, so a walk cannot be
//! reused), within a per-CPU budget of walks a second; a block switched out past it is counted
//! over the cap at switch-in, never sent without its stack.
//!
//! At switch-in (the task arriving, `next`), its blocked time d is known: the block is recorded
//! with probability `1 - exp(-d / N)` (`scorch_common::off_cpu_probability`), sent with that
//! probability through `OFF_CPU_EVENTS`, within a per-CPU cap per second; the agent scales it
//! by 1/p.

use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_prandom_u32, bpf_ktime_get_ns,
        bpf_probe_read_kernel,
        generated::{bpf_get_stack, bpf_probe_read_kernel as probe_read_kernel_raw},
    },
    macros::{map, raw_tracepoint},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
    programs::RawTracePointContext,
    EbpfContext,
};
use scorch_common::{
    off_cpu_probability, OffCpuControl, OffCpuCount, OffCpuEvent, OffCpuThread, UserStack,
    MAX_OFF_CPU_THREADS, OFF_CPU_COUNTER_RUN, OFF_CPU_COUNTS, OFF_CPU_KERNEL_DEPTH,
    OFF_CPU_PREEMPTED, OFF_CPU_USER_STACKS, OFF_CPU_WALKS_PER_EVENT, TASK_DEAD,
};

use crate::{
    shared::{
        control::{self, CONTROL},
        counters,
        stack::{mixed_hash, WALK_OFF_CPU},
    },
    walk,
};

/// The sampling knobs; see [`OffCpuControl`].
#[map]
static OFF_CPU_CONTROL: Array<OffCpuControl> = Array::with_max_entries(1, 0);

/// Threads seen switching out, by thread id. Preallocated: the program inserts with the
/// run-queue lock held.
#[map]
static OFF_CPU_THREADS: HashMap<u32, OffCpuThread> =
    HashMap::with_max_entries(MAX_OFF_CPU_THREADS, 0);

/// User stacks of blocked threads, by their hash: threads blocked at one place share one.
#[map]
static OFF_CPU_USER_STACK_MAP: LruHashMap<u64, UserStack> =
    LruHashMap::with_max_entries(OFF_CPU_USER_STACKS, 0);

/// A zeroed thread entry to insert from (too large for the BPF stack).
#[map]
static OFF_CPU_EMPTY: Array<OffCpuThread> = Array::with_max_entries(1, 0);

/// Recorded blocks, for the agent (which polls it: no wakeup per event).
#[map]
static OFF_CPU_EVENTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

/// Per-CPU counters indexed by [`OffCpuCount`].
#[map]
static OFF_CPU_COUNTS_MAP: PerCpuArray<u64> = PerCpuArray::with_max_entries(OFF_CPU_COUNTS, 0);

/// Per-CPU budgets, one per kind: the second each counts, and what was taken in it.
#[map]
static OFF_CPU_BUDGET: PerCpuArray<[u64; 2]> = PerCpuArray::with_max_entries(2, 0);
/// `OFF_CPU_BUDGET`'s slot for events sent.
const BUDGET_EVENTS: u32 = 0;
/// Its slot for switch-outs whose stacks were taken.
const BUDGET_WALKS: u32 = 1;

/// `offsetof(struct task_struct, pid)`, set by the agent from the kernel's BTF before load.
#[unsafe(no_mangle)]
static TASK_PID: u32 = 0;

/// `sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
/// unsigned int prev_state)` (the fourth argument since 5.18).
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn off_cpu_switch(ctx: RawTracePointContext) -> i32 {
    let Some(control) = OFF_CPU_CONTROL.get(0) else {
        return 0;
    };
    // SAFETY: a helper with no arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let next: u64 = ctx.arg(2);
    switch_in(next, now, control);
    let preempt: u64 = ctx.arg(0);
    let prev_state: u64 = ctx.arg(3);
    switch_out(&ctx, preempt != 0, prev_state as u32, now, control);
    0
}

/// The task leaving the CPU (`current`).
#[inline(always)]
fn switch_out(
    ctx: &RawTracePointContext,
    preempt: bool,
    state: u32,
    now: u64,
    control: &OffCpuControl,
) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let tgid = (pid_tgid >> 32) as u32;
    // The idle task, and the agent itself (its drains would be most of the profile).
    if tid == 0 || tgid == control.agent_tgid {
        return;
    }
    // An exiting thread's last switch: it never comes back.
    if !preempt && state & TASK_DEAD != 0 {
        let _ = OFF_CPU_THREADS.remove(tid);
        return;
    }
    if let Some(sampler) = CONTROL.get(0) {
        if !control::process_wanted(sampler, tgid) {
            return;
        }
    }
    let entry = match OFF_CPU_THREADS.get_ptr_mut(tid) {
        Some(entry) => entry,
        None => {
            let Some(empty) = OFF_CPU_EMPTY.get(0) else {
                return;
            };
            if OFF_CPU_THREADS.insert(tid, empty, 0).is_err() {
                count(OffCpuCount::ThreadsFull, 1);
                return;
            }
            match OFF_CPU_THREADS.get_ptr_mut(tid) {
                Some(entry) => entry,
                None => return,
            }
        }
    };
    // SAFETY: a map value, alive while the program runs; only this thread's switches touch
    // it, and the scheduler does not run a task on two CPUs at once.
    let entry = unsafe { &mut *entry };
    entry.tgid = tgid;
    entry.state = if preempt {
        state | OFF_CPU_PREEMPTED
    } else {
        state
    };
    entry.user_stack = 0;
    entry.unwalked = 0;
    // Taking the stacks is most of a switch-out's cost (a kernel stack and a user walk): past
    // this CPU's budget of them for the second, the block is timed but counted over the cap
    // at switch-in, never sent without its stacks.
    let stacks = u64::from(control.events_per_cpu_second).saturating_mul(OFF_CPU_WALKS_PER_EVENT);
    if !take_budget(BUDGET_WALKS, now, stacks) {
        entry.unwalked = 1;
        entry.kernel_len = 0;
        entry.start_ns = now;
        return;
    }
    if let Ok(comm) = bpf_get_current_comm() {
        entry.comm = comm;
    }
    // SAFETY: the buffer is the entry's array, of the size given.
    let bytes = unsafe {
        bpf_get_stack(
            ctx.as_ptr(),
            entry.kernel.as_mut_ptr().cast(),
            (OFF_CPU_KERNEL_DEPTH * 8) as u32,
            0,
        )
    };
    entry.kernel_len = if bytes > 0 { (bytes as u32) / 8 } else { 0 };
    user_stack(entry, tgid);
    entry.start_ns = now;
}

/// Walks the current task's user stack into `OFF_CPU_USER_STACK_MAP` and keys the entry with
/// it (0 for none). Every switch-out within the budget is walked: its registers do not say
/// where its callers are (two calls of one blocking function from the same frame block with
/// the same pc, sp and rbp).
#[inline(always)]
fn user_stack(entry: &mut OffCpuThread, tgid: u32) {
    let Some(regs) = walk::current_user_regs() else {
        return;
    };
    count(OffCpuCount::Walks, 1);
    let Some(walk) = walk::walk_from(regs, tgid, WALK_OFF_CPU, OFF_CPU_COUNTER_RUN) else {
        return;
    };
    // 0 means "none": a stack hashing to it is stored under 1.
    let key = mixed_hash(walk).max(1);
    walk.stack.hash = key;
    // SAFETY: only tested for presence.
    if unsafe { OFF_CPU_USER_STACK_MAP.get(key) }.is_none()
        && OFF_CPU_USER_STACK_MAP.insert(key, &walk.stack, 0).is_err()
    {
        return;
    }
    entry.user_stack = key;
}

/// The task arriving on the CPU, `next` (a `struct task_struct *`).
#[inline(always)]
fn switch_in(next: u64, now: u64, control: &OffCpuControl) {
    // SAFETY: the offset is read once per run; 0 means the agent found none.
    let pid_offset = unsafe { core::ptr::read_volatile(&TASK_PID) };
    if pid_offset == 0 {
        return;
    }
    // SAFETY: bpf_probe_read_kernel checks the address.
    let Ok(tid) = (unsafe { bpf_probe_read_kernel((next + u64::from(pid_offset)) as *const i32) })
    else {
        return;
    };
    let tid = tid as u32;
    if tid == 0 {
        return;
    }
    let Some(entry) = OFF_CPU_THREADS.get_ptr_mut(tid) else {
        return;
    };
    // SAFETY: as in `switch_out`.
    let entry = unsafe { &mut *entry };
    let start = entry.start_ns;
    if start == 0 {
        return;
    }
    entry.start_ns = 0;
    let duration = now.wrapping_sub(start);
    if duration < control.min_ns || duration >= 1 << 62 {
        count(OffCpuCount::BelowMinimum, 1);
        return;
    }
    let probability = off_cpu_probability(duration, control.mean_ns);
    // SAFETY: a helper with no arguments.
    let draw = u64::from(unsafe { bpf_get_prandom_u32() });
    if draw >= probability {
        return;
    }
    if entry.unwalked != 0
        || !take_budget(BUDGET_EVENTS, now, u64::from(control.events_per_cpu_second))
    {
        count(OffCpuCount::OverCap, 1);
        count(OffCpuCount::OverCapNs, duration);
        return;
    }
    let Some(mut event) = OFF_CPU_EVENTS.reserve::<OffCpuEvent>(0) else {
        count(OffCpuCount::RingFull, 1);
        return;
    };
    let out = event.as_mut_ptr();
    // SAFETY: `out` is the reserved record, of `OffCpuEvent`'s size; the copies read map
    // values through the helper, which checks them.
    unsafe {
        (*out).tgid = entry.tgid;
        (*out).tid = tid;
        (*out).state = entry.state;
        (*out).kernel_len = entry.kernel_len;
        (*out).duration_ns = duration;
        (*out).probability = probability;
        (*out).comm = entry.comm;
        let copied = probe_read_kernel_raw(
            (*out).kernel.as_mut_ptr().cast(),
            (OFF_CPU_KERNEL_DEPTH * 8) as u32,
            entry.kernel.as_ptr().cast(),
        );
        if copied != 0 {
            (*out).kernel_len = 0;
        }
        (*out).user.len = 0;
        (*out).user.outcome = 0;
        (*out).user.hash = 0;
        if entry.user_stack != 0 {
            match OFF_CPU_USER_STACK_MAP.get_ptr(entry.user_stack) {
                Some(stack) => {
                    let copied = probe_read_kernel_raw(
                        core::ptr::addr_of_mut!((*out).user).cast(),
                        core::mem::size_of::<UserStack>() as u32,
                        stack.cast(),
                    );
                    if copied != 0 {
                        (*out).user.len = 0;
                    }
                }
                None => count(OffCpuCount::UserStackEvicted, 1),
            }
        }
    }
    event.submit(u64::from(BPF_RB_NO_WAKEUP));
    count(OffCpuCount::Recorded, 1);
}

/// Whether this CPU may take one more of `kind` this second (and takes it), `limit` a second.
#[inline(always)]
fn take_budget(kind: u32, now: u64, limit: u64) -> bool {
    let Some(budget) = OFF_CPU_BUDGET.get_ptr_mut(kind) else {
        return false;
    };
    // SAFETY: this CPU's slot; the scheduler hook does not nest on one CPU.
    let budget = unsafe { &mut *budget };
    let second = now / 1_000_000_000;
    if budget[0] != second {
        budget[0] = second;
        budget[1] = 0;
    }
    if budget[1] >= limit {
        return false;
    }
    budget[1] += 1;
    true
}

#[inline(always)]
fn count(kind: OffCpuCount, n: u64) {
    counters::add(&OFF_CPU_COUNTS_MAP, kind as u32, n);
}
