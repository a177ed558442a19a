//! Types shared by scorch's BPF sampler (`scorch-ebpf`) and its userspace agent (`scorch`).
//!
//! Everything here is `#[repr(C)]` plain data: the BPF program writes these bytes into maps and
//! the agent reads them back, so both sides must agree on the layout to the byte. The `user`
//! feature adds `aya::Pod` impls, which the BPF side must not depend on.
#![no_std]

mod frame;
mod hotspot;
mod v8;
pub use frame::*;
pub use hotspot::*;
pub use v8::*;

/// Deepest stack the kernel records per sample (`PERF_MAX_STACK_DEPTH`): kernel stacks, and
/// user stacks walked by frame pointers only (`--unwind fp`). A stack of exactly this many
/// frames was probably cut short; the agent counts those as truncated.
pub const MAX_STACK_DEPTH: usize = 127;

/// Deepest user stack the program walks itself ([`UserStack`]): native frames and the Python
/// frames merged into them. Deeper than the kernel's limit, because one Python call takes a
/// native frame or two besides its own, and a Python service 100 calls deep is ordinary. A
/// walk that reaches it ends as [`UnwindOutcome::FrameLimit`] and is counted as truncated.
pub const MAX_USER_STACK_DEPTH: usize = 256;

/// Most entries of each per-generation counts map: distinct (process, thread, user stack,
/// kernel stack) keys per window. The agent sizes the map to the samples a window can hold, up
/// to this; 19 Hz on 256 CPUs for 10 s is under 50k samples, so even all-distinct keys fit. A
/// fuller map is counted as a loss, never silently dropped. The object declares this size.
/// Preallocated, an entry costs its 32-byte [`StackKey`], the 8-byte count and the kernel's
/// element header (about 48 bytes): about 5.5 MiB per generation at this ceiling (4.5 MiB
/// when the key was 12 bytes, rounded to 16, before the thread joined it), and 352 KiB at
/// `record`'s 4,096 entries.
pub const MAX_COUNT_KEYS: u32 = 65_536;

/// Most distinct processes whose name is recorded per window (sized like the counts map).
pub const MAX_COMMS: u32 = 32_768;

/// Most PIDs the filter holds: `--pid` arguments, or processes relabelling dropped.
pub const MAX_PID_FILTER: u32 = 16_384;

/// `Control::filter_pids`: no PID filter.
pub const FILTER_NONE: u32 = 0;
/// `Control::filter_pids`: only the PIDs in `PID_FILTER` are sampled (`--pid`).
pub const FILTER_ALLOW: u32 = 1;
/// `Control::filter_pids`: the PIDs in `PID_FILTER` are not sampled (relabel rules dropped
/// them).
pub const FILTER_DENY: u32 = 2;

/// `stack_id` stored in a [`StackKey`] when the sample has no stack of that kind: a kernel
/// thread has no user stack, a sample taken in user mode has no kernel stack.
pub const STACK_ABSENT: i32 = -1;
/// `stack_id` stored when the stack could not be recorded because its hash bucket in the stack
/// map was taken by another stack (`-EEXIST` from `bpf_get_stackid`). The sample still counts.
pub const STACK_LOST_COLLISION: i32 = -2;
/// `stack_id` stored when `bpf_get_stackid` failed for any other reason (e.g. `-ENOMEM`).
pub const STACK_LOST_OTHER: i32 = -3;

/// Key of the counts map: one entry per distinct (process, thread, user stack, kernel stack).
///
/// 32 bytes, no padding. The thread is its name (the current task's `comm`, which
/// `pthread_setname_np` sets), so samples of differently named threads of one process are
/// told apart; its id only when [`Control::thread_ids`] asks, else 0, so a pool of
/// identically named threads stays one key per stack. The name is the kernel's 16 bytes as
/// they are: a hash of it would save 8 bytes a key but could merge two names.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackKey {
    /// Process id (the kernel's tgid).
    pub tgid: u32,
    /// Thread id (the kernel's pid) with [`Control::thread_ids`] set, else 0.
    pub tid: u32,
    /// Id in the generation's stack map, or one of the `STACK_*` sentinels.
    pub user_stack_id: i32,
    /// Id in the generation's stack map, or one of the `STACK_*` sentinels.
    pub kernel_stack_id: i32,
    /// The thread's name, NUL-padded.
    pub thread: [u8; 16],
}

// The BPF side and the agent hash and compare the key's bytes: padding would make two equal
// keys differ.
const _: () = assert!(core::mem::size_of::<StackKey>() == 32);

/// What a window's first sample of a process records of it (the `COMMS_*` maps): what the
/// agent labels the process's samples with when the process exited before the agent could
/// read /proc/PID (a build step living a few milliseconds).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeenProcess {
    /// The thread-group leader's name as the kernel keeps it (`TASK_COMM_LEN`), NUL-padded:
    /// the process's name, not the sampled thread's (the sampled thread's when the kernel's
    /// BTF did not give the offsets to read it).
    pub comm: [u8; 16],
    /// The id of the process's cgroup in the cgroup v2 hierarchy
    /// (`bpf_get_current_cgroup_id`): the inode number of its directory there.
    pub cgroup_id: u64,
    /// When the thread-group leader started (`start_boottime`, ns since boot; 0 without the
    /// offsets): tells this process from an earlier one with the same pid in [`ExecFile`].
    pub started_ns: u64,
}

/// Processes whose last exec'd file `EXEC_FILES` keeps, oldest evicted first: more than a
/// window's execs on a build host (hundreds a second, a window of 10 s).
pub const MAX_EXEC_FILES: u32 = 8192;
/// The longest path an [`ExecFile`] keeps, with its NUL; a longer one is not kept.
pub const EXEC_PATH_BYTES: usize = 256;

/// What a process last exec'd, recorded at the exec (`sched_process_exec`): the executable's
/// path as the exec named it (the interpreter's, for a script), for the agent to label a
/// process that exited before it read /proc/PID/exe.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecFile {
    /// The process's start (`start_boottime`, as [`SeenProcess::started_ns`]).
    pub started_ns: u64,
    /// NUL-terminated.
    pub path: [u8; EXEC_PATH_BYTES],
}

/// Runtime control shared through the single-entry `CONTROL` array map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Control {
    /// Which map generation (0 or 1) the BPF program writes to. The agent flips it to drain the
    /// other generation while sampling goes on.
    pub generation: u32,
    /// How `PID_FILTER` applies: [`FILTER_NONE`], [`FILTER_ALLOW`] (only the PIDs in it are
    /// sampled) or [`FILTER_DENY`] (the PIDs in it are not).
    pub filter_pids: u32,
    /// Non-zero when samples of the idle task (pid 0) are kept.
    pub include_idle: u32,
    /// How user stacks are walked: [`UNWIND_FP`] (`bpf_get_stackid`, frame pointers only) or
    /// [`UNWIND_TABLES`] (the program's own walk, with unwind tables where loaded).
    pub unwind: u32,
    /// Non-zero when the thread id goes into [`StackKey::tid`] (`thread-ids`); otherwise it
    /// is 0 and threads of one name share their keys.
    pub thread_ids: u32,
}

/// `Control::unwind`: user stacks from `bpf_get_stackid` (frame pointers), ids in `STACKS_g`.
pub const UNWIND_FP: u32 = 0;
/// `Control::unwind`: user stacks walked by the program with unwind tables where they are
/// loaded and frame pointers elsewhere; ids of the stacks sent through
/// `WALKED_STACKS` ([`walked_stack_id`]).
pub const UNWIND_TABLES: u32 = 1;

/// Per-CPU bracket around each run of the BPF program, used to prove a generation is quiescent.
///
/// The program bumps `seq` to odd before it reads `Control::generation` and back to even after
/// its last write. After flipping the generation, the agent waits until every CPU's `seq` is even
/// or has moved on: then no run can still write to the old generation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunSeq {
    /// Odd while a run is in flight on this CPU.
    pub seq: u64,
}

/// Index into the per-CPU `LOSSES` array: every way a sample can be lost or degraded.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// `bpf_get_stackid` hit a bucket held by a different user stack (`-EEXIST`).
    UserStackCollision = 0,
    /// `bpf_get_stackid` failed for a user stack for another reason.
    UserStackError = 1,
    /// `bpf_get_stackid` hit a bucket held by a different kernel stack.
    KernelStackCollision = 2,
    /// `bpf_get_stackid` failed for a kernel stack for another reason.
    KernelStackError = 3,
    /// The counts map was full: the whole sample was dropped.
    CountsMapFull = 4,
    /// The comm map was full: the process is reported without a name.
    CommMapFull = 5,
    /// A new walked user stack found the `WALKED_STACKS` ring buffer full: the agent had not
    /// read it in time.
    UserStackRingFull = 6,
}

/// Number of [`Loss`] kinds; the length of one run of the `LOSSES` array.
pub const LOSS_KINDS: u32 = 7;

/// The per-CPU counter arrays (`LOSSES`, `UNWIND_OUTCOMES_COUNT`, `PYTHON_COUNTS_MAP`) hold one
/// run of counters per generation, at `run * kinds + kind`: a sample's counts go in the run of
/// the generation its stacks went to, so the drain, once that generation is quiescent, takes
/// exactly its window's counts and zeroes them. (With one run, read after the flip, a window's
/// counts took in the next window's first samples.) The unwinder's and the Python walk's
/// arrays have a third run, [`OFF_CPU_COUNTER_RUN`], for the off-CPU program's walks, whose
/// events are not windowed by generation; the drain takes its differences.
pub const COUNTER_RUNS: u32 = 3;

/// The counter run of the off-CPU program's walks; see [`COUNTER_RUNS`].
pub const OFF_CPU_COUNTER_RUN: u32 = 2;

impl Loss {
    /// All kinds, in index order.
    pub const ALL: [Loss; LOSS_KINDS as usize] = [
        Loss::UserStackCollision,
        Loss::UserStackError,
        Loss::KernelStackCollision,
        Loss::KernelStackError,
        Loss::CountsMapFull,
        Loss::CommMapFull,
        Loss::UserStackRingFull,
    ];

    /// Short name used in summaries and logs.
    pub const fn name(self) -> &'static str {
        match self {
            Loss::UserStackCollision => "user stack collision",
            Loss::UserStackError => "user stack error",
            Loss::KernelStackCollision => "kernel stack collision",
            Loss::KernelStackError => "kernel stack error",
            Loss::CountsMapFull => "counts map full",
            Loss::CommMapFull => "comm map full",
            Loss::UserStackRingFull => "user stack ring full",
        }
    }
}

/// How to find the canonical frame address (CFA: the caller's stack pointer before its call) at
/// a pc. Bits 0-2 of [`UnwindRow::kinds`].
///
/// The registers are named by role: SP the stack pointer, FP the frame pointer (x86-64: rsp
/// and rbp; arm64: sp and x29). Which kinds each architecture's tables use:
///
/// | kind | x86-64 | arm64 |
/// |---|---|---|
/// | [`CfaKind::Sp`], [`CfaKind::Fp`] | yes | yes |
/// | [`CfaKind::Plt`] | the `.plt`'s one expression | no (its stubs do not push) |
/// | [`CfaKind::Signal`] | `__restore_rt`'s `ucontext` | the vDSO's `rt_sigframe` |
/// | [`RaKind::CfaMinus8`] | always (the call pushed it) | never (see [`FpKind`]) |
/// | [`RaKind::LinkRegister`] | never | before the prologue saves x30, and in `.plt` |
/// | [`FpKind::Record`], [`FpKind::RecordFromBase`], [`FpKind::ReturnAddressAt`] | never | once the prologue saved x30 |
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CfaKind {
    /// No unwind information covers the pc: the gap after a function's last instruction (an
    /// end-of-function marker), or code the binary describes nowhere. The unwinder falls back to
    /// frame pointers or stops; it must not apply the row of the function before.
    NoRow = 0,
    /// CFA = SP + `cfa_offset`.
    Sp = 1,
    /// CFA = FP + `cfa_offset`.
    Fp = 2,
    /// An x86-64 PLT stub: CFA = rsp + `cfa_offset` + 8 when `(rip & 15) >= fp_offset`, else
    /// rsp + `cfa_offset`. The linker describes a whole `.plt` with this one DWARF expression
    /// (the stub pushes once, at a fixed place in its 16 bytes); `fp_offset` holds the
    /// threshold (11 for the classic PLT; the linker states it), rbp is unchanged.
    Plt = 3,
    /// A signal trampoline (`__restore_rt`; CIE augmentation `S`): the interrupted registers are
    /// in the `ucontext` on the stack. CFA = the 8 bytes at rsp + `cfa_offset` (the interrupted
    /// rsp); the next pc is the 8 bytes at rsp + `cfa_offset` + 8 (the interrupted rip, which is
    /// no return address: it is looked up as it is, not minus one); the frame pointer is as
    /// [`FpKind`] says (`AtSp`). The layout is the architecture's.
    Signal = 4,
    /// A rule the BPF unwinder does not evaluate (another base register, any other DWARF
    /// expression, an offset that does not fit, a return address where no [`RaKind`] puts
    /// it): the walk stops here and counts it.
    Unsupported = 5,
}

impl CfaKind {
    /// The kind three bits encode; values no kind has read as [`CfaKind::Unsupported`].
    pub const fn from_bits(bits: u8) -> Self {
        match bits {
            0 => CfaKind::NoRow,
            1 => CfaKind::Sp,
            2 => CfaKind::Fp,
            3 => CfaKind::Plt,
            4 => CfaKind::Signal,
            _ => CfaKind::Unsupported,
        }
    }
}

/// Where the caller's frame pointer is, and whether there is a caller at all. The high nibble
/// of [`UnwindRow::kinds`].
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FpKind {
    /// FP still holds the caller's value (no rule: the function has not saved it, or has
    /// restored it).
    Unchanged = 0,
    /// Saved at CFA + `fp_offset` * 8.
    CfaOffset = 1,
    /// Saved at SP + `fp_offset` * 8 (a signal frame's `ucontext`).
    AtSp = 2,
    /// Restored by a rule the BPF unwinder does not evaluate (another register, a value rule,
    /// an expression): the caller's FP is unknown, so a later FP-based CFA cannot be found.
    Unsupported = 3,
    /// The return address is undefined: the outermost frame of the thread (`_start`, the child
    /// side of `clone`/`clone3`). The walk ends here, cleanly, whatever the CFA kind says; the
    /// unwinder checks this before the CFA.
    ReturnAddressUndefined = 4,
    /// A frame record `{caller's FP, return address}` at CFA + `fp_offset` * 8: arm64's
    /// prologue saves x29 and x30 as a pair, most often at the bottom of the frame (GCC's
    /// `stp x29, x30, [sp, #-N]!`), so the return address is seldom at CFA - 8. The row's
    /// [`RaKind`] is ignored.
    Record = 5,
    /// The frame record at the CFA's base register + `fp_offset` * 8 (CFA - `cfa_offset` +
    /// `fp_offset` * 8): for frames larger than an i8 of words reaches from the CFA, whose
    /// record still lies near the register the CFA is computed from.
    RecordFromBase = 6,
    /// FP unchanged, the return address alone at CFA + `fp_offset` * 8 (arm64's `str x30,
    /// [sp, #-16]!` in a function that keeps no frame record).
    ReturnAddressAt = 7,
}

impl FpKind {
    /// The kind a nibble encodes; values no kind has read as [`FpKind::Unsupported`].
    pub const fn from_bits(bits: u8) -> Self {
        match bits {
            0 => FpKind::Unchanged,
            1 => FpKind::CfaOffset,
            2 => FpKind::AtSp,
            4 => FpKind::ReturnAddressUndefined,
            5 => FpKind::Record,
            6 => FpKind::RecordFromBase,
            7 => FpKind::ReturnAddressAt,
            _ => FpKind::Unsupported,
        }
    }
}

/// Where the caller's pc (the return address) is, unless the [`FpKind`] says (a frame
/// record). Bit 3 of [`UnwindRow::kinds`]; 0, so every row written before the kind existed
/// reads as [`RaKind::CfaMinus8`]. A return address anywhere else makes the row
/// [`CfaKind::Unsupported`].
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RaKind {
    /// Saved at CFA - 8: where x86-64's `call` pushes it, and where arm64's frame record puts
    /// x30 once the prologue has saved it.
    CfaMinus8 = 0,
    /// Still in the link register (arm64's x30, before the prologue saves it). Its value is
    /// known only in the frame whose registers the walk started from (the sample's, or a
    /// signal frame's): in a caller's frame x30 is long overwritten, and the walk stops.
    /// x86-64 has no link register: its walk treats such a row as unsupported.
    LinkRegister = 1,
}

/// One row of an executable's unwind table: from `pc` up to the next row's `pc`, how to find
/// the caller's frame. Rows are sorted by `pc`, neighbours never repeat a rule, and the gap
/// after each function starts with a [`CfaKind::NoRow`] row, so the rule for a pc is the last
/// row whose `pc` is at most it ([`Bisect`]).
///
/// The exact layout, 8 bytes, little-endian, no padding:
///
/// | bytes | field | meaning |
/// |---|---|---|
/// | 0..4 | `pc: u32` | first pc of the row, minus the table's base (an ELF address) |
/// | 4..6 | `cfa_offset: u16` | per [`CfaKind`] |
/// | 6 | `kinds: u8` | bits 0-2 [`CfaKind`], bit 3 [`RaKind`], bits 4-7 [`FpKind`] |
/// | 7 | `fp_offset: i8` | per [`FpKind`], in units of 8 bytes; for [`CfaKind::Plt`] the threshold |
///
/// On arm64 a large frame keeps its frame record far below the CFA, beyond the +-1 KiB an i8
/// of words reaches, but near the register the CFA is computed from (the prologue stores it
/// at the new stack pointer): [`FpKind::RecordFromBase`].
///
/// Why this shape: the anchors use 8 bytes (lightswitch) to 14 (Parca) per row, and a busy
/// host holds hundreds of thousands of rows in BPF maps. A full u32 pc (offset from the base)
/// avoids the page index a 16-bit pc needs (a second map and a second lookup per frame) for
/// any binary whose code spans under 4 GiB; it fits in 8 bytes because the two kinds share a
/// byte and the FP offset is stored in 8-byte units: on x86_64 DWARF saves registers at
/// multiples of the data alignment factor (-8), and measured saves lie within 120 bytes of the
/// CFA (glibc, libstdc++, node), far inside the +-1 KiB an i8 reaches. A CFA offset beyond
/// 64 KiB (a frame that large) or an FP offset beyond reach makes the row `Unsupported`
/// rather than wrong.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UnwindRow {
    /// First pc the row covers, as an offset from the table's base address.
    pub pc: u32,
    /// [`CfaKind::Sp`], [`CfaKind::Fp`]: added to the register. [`CfaKind::Plt`]: the CFA
    /// before the stub's push (8). [`CfaKind::Signal`]: where the interrupted SP is, from SP.
    pub cfa_offset: u16,
    /// [`CfaKind`] in bits 0-2, [`RaKind`] in bit 3, [`FpKind`] in the high nibble.
    pub kinds: u8,
    /// [`FpKind::CfaOffset`], [`FpKind::AtSp`], [`FpKind::Record`],
    /// [`FpKind::RecordFromBase`], [`FpKind::ReturnAddressAt`]: the offset in units of 8 bytes.
    /// [`CfaKind::Plt`]: the `rip & 15` from which the stub has pushed.
    pub fp_offset: i8,
}

impl UnwindRow {
    /// A row whose return address is at CFA - 8 ([`RaKind::CfaMinus8`]).
    pub const fn new(pc: u32, cfa: CfaKind, cfa_offset: u16, fp: FpKind, fp_offset: i8) -> Self {
        UnwindRow {
            pc,
            cfa_offset,
            kinds: (cfa as u8) | ((fp as u8) << 4),
            fp_offset,
        }
    }

    /// The same row with the return address where `ra` says.
    pub const fn with_return_address(self, ra: RaKind) -> Self {
        UnwindRow {
            kinds: (self.kinds & !0x08) | ((ra as u8) << 3),
            ..self
        }
    }

    pub const fn cfa_kind(&self) -> CfaKind {
        CfaKind::from_bits(self.kinds & 0x07)
    }

    pub const fn ra_kind(&self) -> RaKind {
        if self.kinds & 0x08 == 0 {
            RaKind::CfaMinus8
        } else {
            RaKind::LinkRegister
        }
    }

    pub const fn fp_kind(&self) -> FpKind {
        FpKind::from_bits(self.kinds >> 4)
    }
}

/// Probes a row search takes at most. Each probe leaves at most half of the rows still in
/// question (rounded down), so 32 settle any u32 count; `bpf_loop` needs the bound.
pub const UNWIND_SEARCH_STEPS: u32 = 32;

/// Entries of the BPF walk's per-CPU cache of found rows, for each of its two walkers (the
/// sampler, the off-CPU program): 8 KiB a CPU each. A power of two.
pub const ROW_CACHE_SLOTS: u32 = 256;

/// A binary search for the last of `len` entries, sorted by key, whose key is at most a
/// target, taken one probe at a time: [`Bisect::probe`] says which entry to read,
/// [`Bisect::narrow`] takes the comparison. The BPF program runs each probe as one `bpf_loop`
/// iteration, so the verifier checks one probe rather than every path through an unrolled
/// search (6.1's gave up at its million instructions on those); the agent runs the same probes
/// in a plain loop ([`last_at_or_below`]), so its tests are the BPF side's too.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bisect {
    /// Entries below `low` have keys at most the target.
    pub low: u32,
    /// Entries from `high` on have keys above the target.
    pub high: u32,
}

impl Bisect {
    pub const fn new(len: u32) -> Self {
        Bisect { low: 0, high: len }
    }

    /// The entry to read next, or `None` once the search is settled.
    #[inline(always)]
    pub const fn probe(&self) -> Option<u32> {
        if self.low < self.high {
            Some(self.low + (self.high - self.low) / 2)
        } else {
            None
        }
    }

    /// Narrows the search by whether entry `probe`'s key is at most the target.
    #[inline(always)]
    pub fn narrow(&mut self, probe: u32, at_most_target: bool) {
        if at_most_target {
            self.low = probe + 1;
        } else {
            self.high = probe;
        }
    }

    /// The last entry whose key is at most the target, or `None` when every key is above it.
    #[inline(always)]
    pub const fn found(&self) -> Option<u32> {
        self.low.checked_sub(1)
    }
}

/// [`Bisect`] as one call, at most `steps` probes: the last of `len` sorted entries whose key is
/// at most `target`, or `None` when there is none or `key_at` cannot read an entry. For rows,
/// the caller still checks the row's [`CfaKind`]: a [`CfaKind::NoRow`] row means no rule covers
/// the pc; for mappings, the caller checks the end.
pub fn last_at_or_below<K: PartialOrd>(
    len: u32,
    steps: u32,
    target: K,
    mut key_at: impl FnMut(u32) -> Option<K>,
) -> Option<u32> {
    let mut search = Bisect::new(len);
    for _ in 0..steps {
        let Some(probe) = search.probe() else {
            break;
        };
        search.narrow(probe, key_at(probe)? <= target);
    }
    search.found()
}

/// Rows the row pools (`UNWIND_ROWS`) may hold together by default: 8 Mi rows of 8 bytes,
/// 64 MiB, the ceiling on the unwind tables of the whole machine. The pools are created as
/// tables need them, so a host holds only what its processes' tables take.
pub const UNWIND_POOL_ROWS: u32 = 8 << 20;

/// Row pools `UNWIND_ROWS` can point at (its outer array's entries). Pools double in size as
/// they are added, from `MIN_POOL_ROWS`, so 64 of them reach far past any ceiling; the rest
/// is room for pools given back and created again.
pub const MAX_ROW_POOLS: u32 = 64;

/// Rows of the smallest pool: 64 Ki rows, 512 KiB.
pub const MIN_POOL_ROWS: u32 = 64 << 10;

/// Executable mappings one process may have described to the unwinder. Processes with more
/// (many libraries) keep the `MAX_PROC_MAPPINGS` the agent chose; pcs in the others fall back
/// to frame pointers.
pub const MAX_PROC_MAPPINGS: usize = 64;

/// Probes the search over a process's mappings takes at most: `MAX_PROC_MAPPINGS` is 2^6.
pub const MAPPING_SEARCH_STEPS: u32 = 7;
const _: () = assert!(MAX_PROC_MAPPINGS.is_power_of_two() && MAX_PROC_MAPPINGS == 64);

/// Processes whose mappings the unwinder holds at once.
pub const MAX_UNWIND_PROCS: u32 = 8192;

/// `UnwindMapping::state`: no table for this code (anonymous memory, JIT, a binary without
/// `.eh_frame`): frame pointers.
pub const MAPPING_NO_TABLE: u16 = 0;
/// `UnwindMapping::state`: the table is being built or waits for room: frame pointers, counted
/// as [`UnwindOutcome::TableNotLoaded`].
pub const MAPPING_TABLE_PENDING: u16 = 1;
/// `UnwindMapping::state`: the rows are in `UNWIND_ROWS[pool][first_row..first_row + rows]`.
pub const MAPPING_TABLE_LOADED: u16 = 2;
/// `UnwindMapping::state`: the table was evicted at the row pools' ceiling: frame pointers,
/// counted as [`UnwindOutcome::TableEvicted`].
pub const MAPPING_TABLE_EVICTED: u16 = 3;

/// The runtime that owns a mapping's code ([`UnwindMapping::runtime`]): the BPF walk hands a
/// frame there to that runtime's walk (`agent-ebpf/src/runtimes/`), by this value, never by
/// name. Adding a runtime adds a value here and a file there.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RuntimeId {
    /// Native code: the walk steps through it with tables or frame pointers.
    Native = 0,
    /// CPython's eval loop: the frame stands for the Python frames its call runs
    /// ([`PythonProc`], `PYTHON_PROCS`).
    Python = 1,
    /// HotSpot's code cache: the frame and those after it, to the call stub, are Java frames
    /// ([`HotspotProc`], `HOTSPOT_PROCS`).
    Hotspot = 2,
    /// V8's code (its embedded builtins and its JIT code): the frame and those after it, to
    /// the first typed frame, are JavaScript frames ([`V8Proc`], `V8_PROCS`).
    V8 = 3,
}

/// One executable mapping of a process, as the BPF unwinder sees it. The agent may describe
/// one mapping as several entries sharing a table, to mark the parts a runtime owns.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindMapping {
    /// First absolute address.
    pub start: u64,
    /// One past the last absolute address.
    pub end: u64,
    /// Subtracted (wrapping) from an absolute pc to give the table's row pc: the load bias,
    /// the segment's file-offset-to-address shift and the table's base in one number.
    pub bias: u64,
    /// First row of the table in its pool.
    pub first_row: u32,
    /// Rows in the table.
    pub rows: u32,
    /// One of `MAPPING_NO_TABLE`, `MAPPING_TABLE_PENDING`, `MAPPING_TABLE_LOADED`,
    /// `MAPPING_TABLE_EVICTED`.
    pub state: u16,
    /// The [`RuntimeId`] owning this code, as its `u16`; 0 (native) for most.
    pub runtime: u16,
    /// The pool holding the table: its index in `UNWIND_ROWS`.
    pub pool: u32,
}

/// A process's executable mappings, sorted by `start`, in the first `count` slots.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcMappings {
    pub count: u32,
    /// Explicit padding so the layout has no uninitialised bytes.
    pub _reserved: u32,
    pub mappings: [UnwindMapping; MAX_PROC_MAPPINGS],
}

/// A user stack the program walked itself. The sampler sends each stack new to its window
/// once, as the first `WALKED_STACK_HEADER + 8 * len` bytes of this, through the
/// `WALKED_STACKS` ring buffer; its id (a counts key's `user_stack_id`) is
/// [`walked_stack_id`] of `hash`, and `SEEN_STACKS_g` remembers that the window sent it. The
/// off-CPU program keeps whole ones in its LRU map.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UserStack {
    /// Hash of all the pcs: a different stack that lands on the same id is a collision,
    /// counted as [`Loss::UserStackCollision`] like `bpf_get_stackid`'s.
    pub hash: u64,
    /// Frames in `pcs`.
    pub len: u32,
    /// How the walk ended, an [`UnwindOutcome`]: the agent names the binary a walk stopped in
    /// early (the last frame's) and why.
    pub outcome: u32,
    /// The process walked.
    pub tgid: u32,
    /// [`WALKED_GENERATION_1`] and [`WALKED_RUNTIME_FRAMES`].
    pub flags: u32,
    /// Instruction pointers, leaf first.
    pub pcs: [u64; MAX_USER_STACK_DEPTH],
}

/// The value of `SEEN_STACKS_g`: the hash of the walked stack sent under its id. A struct,
/// not a bare `u64`: the agent creates each generation's map with a struct value in its BTF,
/// and 6.1's kernel puts an inner map in its array only when it finds the template's value a
/// struct too (it compares where each keeps a timer, which it looks for in structs only).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SeenStack {
    pub hash: u64,
}

/// Bytes of a [`UserStack`] before its frames: a `WALKED_STACKS` record is these and `len`
/// frames.
pub const WALKED_STACK_HEADER: usize = core::mem::offset_of!(UserStack, pcs);

/// [`UserStack::flags`]: the stack belongs to generation 1's window (else 0's).
pub const WALKED_GENERATION_1: u32 = 1;
/// [`UserStack::flags`]: the stack holds a runtime's frames (CPython's, V8's...), which the
/// agent reads what they point at for soon, while the process still runs: one that exits
/// before the window ends is then named too.
pub const WALKED_RUNTIME_FRAMES: u32 = 2;

/// The id of a walked stack of mixed hash `hash`: its low 31 bits, so that no id is one of
/// the negative sentinels ([`STACK_ABSENT`]...).
#[inline(always)]
pub const fn walked_stack_id(hash: u64) -> i32 {
    (hash & 0x7fff_ffff) as i32
}

/// A walked user stack as the agent holds it.
pub trait WalkedStack {
    /// The hash of all its pcs, which tells a collision on its id from the same stack.
    fn hash(&self) -> u64;
    /// The frames, leaf first (`len` bounded by the array, whatever the map holds).
    fn frames(&self) -> &[u64];
    /// How the walk ended, an [`UnwindOutcome`] index.
    fn outcome(&self) -> u32;
}

impl WalkedStack for UserStack {
    fn hash(&self) -> u64 {
        self.hash
    }
    fn frames(&self) -> &[u64] {
        &self.pcs[..(self.len as usize).min(MAX_USER_STACK_DEPTH)]
    }
    fn outcome(&self) -> u32 {
        self.outcome
    }
}

/// What the BPF unwinder tells the agent through the `UNWIND_EVENTS` ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindEvent {
    pub tgid: u32,
    /// One of the `EVENT_*` kinds.
    pub kind: u32,
    /// The pc no mapping covered, for [`EVENT_UNKNOWN_PC`].
    pub pc: u64,
}

/// [`UnwindEvent::kind`]: a process the unwinder has no mappings for (new, or just exec'd).
pub const EVENT_UNKNOWN_PROCESS: u32 = 0;
/// [`UnwindEvent::kind`]: a pc in no known mapping (dlopen, a new mapping).
pub const EVENT_UNKNOWN_PC: u32 = 1;

/// Index into the per-CPU `UNWIND_OUTCOMES` array: how each walk of a user stack with tables
/// ended, and which samples fell back to frame pointers. Each walk adds one to exactly one of
/// the ends (`Completed` .. `FrameLimit`), and at most one to each fallback (`NoMapping`,
/// `TableNotLoaded`, `FramePointerNoRow`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnwindOutcome {
    /// Reached the bottom: an undefined return address, or a frame-pointer chain ending at 0.
    Completed = 0,
    /// A pc inside a table with no row for it (code the binary's CFI leaves out).
    NoRow = 1,
    /// A row the BPF unwinder does not evaluate, or an rbp-based CFA with rbp unknown.
    UnsupportedCfa = 2,
    /// Reading the stack failed (a page not present, a corrupt stack).
    ReadFault = 3,
    /// The stack was deeper than `MAX_USER_STACK_DEPTH` frames: truncated.
    FrameLimit = 4,
    /// Some frame was in no known mapping (JIT, anonymous memory, a mapping not read yet):
    /// walked with frame pointers.
    NoMapping = 5,
    /// Some frame was in a mapping whose table was not loaded yet: walked with frame pointers.
    TableNotLoaded = 6,
    /// Some frame was in a described mapping that no row covers (code without CFI that keeps
    /// frame pointers: V8's builtins in `node`, hand-written assembly): walked with one
    /// frame-pointer step, checked (the caller's frame above this one, its return address in
    /// an executable mapping), then with tables again.
    FramePointerNoRow = 7,
    /// Some frame was in a mapping whose table was evicted at the row pools' ceiling: walked
    /// with frame pointers.
    TableEvicted = 8,
}

/// Number of [`UnwindOutcome`] kinds; the length of one run of the `UNWIND_OUTCOMES_COUNT`
/// array ([`COUNTER_RUNS`]).
pub const UNWIND_OUTCOMES: u32 = 9;

impl UnwindOutcome {
    /// All kinds, in index order.
    pub const ALL: [UnwindOutcome; UNWIND_OUTCOMES as usize] = [
        UnwindOutcome::Completed,
        UnwindOutcome::NoRow,
        UnwindOutcome::UnsupportedCfa,
        UnwindOutcome::ReadFault,
        UnwindOutcome::FrameLimit,
        UnwindOutcome::NoMapping,
        UnwindOutcome::TableNotLoaded,
        UnwindOutcome::FramePointerNoRow,
        UnwindOutcome::TableEvicted,
    ];

    /// Short name used in summaries, logs and `/metrics` labels.
    pub const fn name(self) -> &'static str {
        match self {
            UnwindOutcome::Completed => "completed",
            UnwindOutcome::NoRow => "no row",
            UnwindOutcome::UnsupportedCfa => "unsupported CFA",
            UnwindOutcome::ReadFault => "read fault",
            UnwindOutcome::FrameLimit => "frame limit",
            UnwindOutcome::NoMapping => "no mapping",
            UnwindOutcome::TableNotLoaded => "table not loaded",
            UnwindOutcome::FramePointerNoRow => "frame pointer where no row",
            UnwindOutcome::TableEvicted => "table evicted",
        }
    }
}

/// Off-CPU time: the knobs the `sched_switch` program reads (`OFF_CPU_CONTROL`, one entry),
/// written by the agent before it attaches the program.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuControl {
    /// The sampling parameter N: a block of d ns is recorded with probability
    /// `1 - exp(-d / N)` ([`off_cpu_probability`]).
    pub mean_ns: u64,
    /// Blocks shorter than this are never recorded.
    pub min_ns: u64,
    /// Most events each CPU may send per second; the rest are counted
    /// ([`OffCpuCount::OverCap`]). Each CPU takes stacks at most [`OFF_CPU_WALKS_PER_EVENT`] times
    /// as many switch-outs a second.
    pub events_per_cpu_second: u32,
    /// The agent's own process: its threads are never recorded.
    pub agent_tgid: u32,
}

/// Deepest kernel stack kept for a block: where it blocked, from `__schedule` down to the
/// system call entry. Blocking paths are 10 to 30 frames deep; a deeper one is cut (and
/// counted as truncated).
pub const OFF_CPU_KERNEL_DEPTH: usize = 48;

/// Switch-outs a CPU may take stacks of each second (a kernel stack and a user walk), per
/// event it may send. Every switch-out's stacks are taken (while the thread is still current,
/// before the block's length, and so whether it is recorded, is known); this bounds their cost
/// in a storm of context switches. A block switched out past it is counted over the cap.
pub const OFF_CPU_WALKS_PER_EVENT: u64 = 2;

/// Most threads the program follows between their switch-out and switch-in
/// (`OFF_CPU_THREADS`); a thread beyond it is counted ([`OffCpuCount::ThreadsFull`]).
pub const MAX_OFF_CPU_THREADS: u32 = 16_384;

/// Distinct user stacks kept for blocked threads (`OFF_CPU_USER_STACKS`, an LRU map: threads
/// blocked in one place share one entry).
pub const OFF_CPU_USER_STACKS: u32 = 1_024;

/// `OffCpuThread::state`'s bit for a switch-out the scheduler forced (preemption); the low
/// bits are the task's `__state` as the tracepoint passed it.
pub const OFF_CPU_PREEMPTED: u32 = 1 << 31;

/// `TASK_DEAD`: the last switch-out of an exiting thread, which never comes back.
pub const TASK_DEAD: u32 = 0x80;

/// A thread the program saw switch out: when, how, and its stacks at that moment (the user
/// stack does not change while the thread is off the CPU). The value of `OFF_CPU_THREADS`,
/// keyed by thread id, for every CPU (a thread may wake on another CPU than it slept on).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct OffCpuThread {
    /// `bpf_ktime_get_ns` at switch-out; 0 while the thread runs.
    pub start_ns: u64,
    /// Key of the user stack in `OFF_CPU_USER_STACKS`; 0 for none (a kernel thread).
    pub user_stack: u64,
    pub tgid: u32,
    /// The switched-out state: `__state`, with [`OFF_CPU_PREEMPTED`].
    pub state: u32,
    /// Frames in `kernel`.
    pub kernel_len: u32,
    /// 1 when the switch-out came past its CPU's budget and its stacks were not taken: the block is then counted over the cap, never sent with a stack it lacks.
    pub unwalked: u32,
    /// The thread's name (`comm` of the thread, not of the process).
    pub comm: [u8; 16],
    /// Kernel return addresses, leaf first.
    pub kernel: [u64; OFF_CPU_KERNEL_DEPTH],
}

/// One recorded block, sent through the `OFF_CPU_EVENTS` ring buffer at switch-in.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct OffCpuEvent {
    pub tgid: u32,
    pub tid: u32,
    /// As [`OffCpuThread::state`].
    pub state: u32,
    /// Frames in `kernel`.
    pub kernel_len: u32,
    /// How long the thread was off the CPU, ns.
    pub duration_ns: u64,
    /// The probability it was recorded with, in units of 2^-32 ([`off_cpu_probability`]):
    /// the agent scales the duration by its inverse.
    pub probability: u64,
    /// The thread's name.
    pub comm: [u8; 16],
    pub kernel: [u64; OFF_CPU_KERNEL_DEPTH],
    /// The user stack; `len` 0 when there is none or it was no longer kept.
    pub user: UserStack,
}

/// Index into the per-CPU `OFF_CPU_COUNTS` array: what became of the blocks the program saw.
/// Cumulative; the agent takes differences.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffCpuCount {
    /// Blocks sent to the agent.
    Recorded = 0,
    /// Blocks over the per-second cap: not sent, counted here.
    OverCap = 1,
    /// Their blocked time, ns (unscaled).
    OverCapNs = 2,
    /// Blocks lost to a full ring buffer (the agent read too slowly).
    RingFull = 3,
    /// Switch-outs not followed: the thread map was full.
    ThreadsFull = 4,
    /// Blocks sent without a user stack: its entry had been evicted while the thread slept.
    UserStackEvicted = 5,
    /// Blocks shorter than the minimum.
    BelowMinimum = 6,
    /// Switch-outs whose user stack was walked.
    Walks = 7,
}

/// Number of [`OffCpuCount`] kinds.
pub const OFF_CPU_COUNTS: u32 = 8;

/// `2^(-k/16)` in units of 2^-32, k = 0..=16: [`off_cpu_probability`] interpolates between
/// them.
const EXP2_NEG_SIXTEENTHS: [u64; 17] = [
    0x100000000,
    0xf5257d15,
    0xeac0c6e8,
    0xe0ccdeec,
    0xd744fccb,
    0xce248c15,
    0xc5672a11,
    0xbd08a39f,
    0xb504f334,
    0xad583eea,
    0xa5fed6aa,
    0x9ef53261,
    0x9837f052,
    0x91c3d374,
    0x8b95c1e4,
    0x85aac368,
    0x80000000,
];

/// Largest sampling parameter [`off_cpu_probability`] takes (about 18 minutes).
pub const MAX_OFF_CPU_MEAN_NS: u64 = 1 << 40;

/// `log2(e)` in 16.16 fixed point.
const LOG2_E_16: u64 = 94_548;

/// The probability, in units of 2^-32 (2^32 = certain), that a block of `duration_ns` is
/// recorded: `1 - exp(-duration_ns / mean_ns)`, the chance that a Poisson process of one
/// point per `mean_ns` of blocked time puts a point in it. Long blocks are always recorded,
/// short ones seldom, and the agent divides each recorded duration by this same value, so the
/// totals are unbiased whatever the rounding here. Integer arithmetic only (the BPF side
/// has no floating point): `exp(-x) = 2^(-x log2 e)`, the fraction from a table of
/// sixteenths, interpolated (within 0.02% of the true value).
#[inline(always)]
pub const fn off_cpu_probability(duration_ns: u64, mean_ns: u64) -> u64 {
    const ONE: u64 = 1 << 32;
    if mean_ns == 0 || duration_ns >= mean_ns.saturating_mul(32) {
        return ONE;
    }
    // x = d / N in 16.16: d < 32 N <= 2^45 (the agent keeps N under
    // [`MAX_OFF_CPU_MEAN_NS`]), so the shift fits; the BPF target has no 128-bit division.
    if mean_ns > MAX_OFF_CPU_MEAN_NS {
        return ONE;
    }
    // Short blocks (x < 1/4): the series 1 - exp(-x) = x - x^2/2 + x^3/6 - x^4/24, with x in
    // units of 2^-32, keeps its precision where 16.16 would round x to a few units and the
    // table's interpolation error would be large beside p. d < N / 4 <= 2^38, so d << 24
    // fits.
    if duration_ns.saturating_mul(4) < mean_ns {
        let x = ((duration_ns << 24) / mean_ns) << 8;
        let square = (x * x) >> 32;
        let cube = (square * x) >> 32;
        let fourth = (cube * x) >> 32;
        return x - square / 2 + cube / 6 - fourth / 24;
    }
    let x = (duration_ns << 16) / mean_ns;
    let y = (x * LOG2_E_16) >> 16;
    let whole = y >> 16;
    if whole >= 33 {
        return ONE;
    }
    let fraction = y & 0xffff;
    let index = (fraction >> 12) as usize;
    let rest = fraction & 0xfff;
    let high = EXP2_NEG_SIXTEENTHS[index & 15];
    let low = EXP2_NEG_SIXTEENTHS[(index & 15) + 1];
    let survive = (high - (((high - low) * rest) >> 12)) >> whole;
    ONE - survive
}

#[cfg(feature = "user")]
mod pod {
    // Each type is plain `#[repr(C)]` integers with no padding and no invalid bit patterns, so
    // any bytes the kernel hands back are a valid value.
    // SAFETY: see above.
    unsafe impl aya::Pod for super::StackKey {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::SeenProcess {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::ExecFile {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::Control {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::RunSeq {}
    // SAFETY: see above; any `kinds` byte decodes (unknown kinds read as unsupported).
    unsafe impl aya::Pod for super::UnwindRow {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::UnwindMapping {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::ProcMappings {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::SeenStack {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::UserStack {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::UnwindEvent {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::PythonProc {}
    // SAFETY: see above; explicit padding.
    unsafe impl aya::Pod for super::HotspotProc {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::V8Proc {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::OffCpuControl {}
    // SAFETY: see above; explicit padding.
    unsafe impl aya::Pod for super::OffCpuThread {}
    // SAFETY: see above.
    unsafe impl aya::Pod for super::OffCpuEvent {}
}

/// Most address ranges of one interpreter's eval loop: the function and the parts the
/// compiler split off it (`.cold`).
pub const PYTHON_EVAL_RANGES: usize = 4;

/// Most processes with a CPython interpreter the walk knows at once (`PYTHON_PROCS`).
pub const MAX_PYTHON_PROCS: u32 = 4096;

/// The process map's key for processes it does not hold: a zeroed [`ProcMappings`] (no
/// mappings: every frame takes a frame-pointer step) that the agent writes into each process
/// map it creates. A walk's mappings are then always a value of that one map, known process or
/// not, so the verifier checks the walk once; with a second map for the unknown case, it
/// checked it once for each. No process has tgid 0.
pub const PROCS_NO_MAPPINGS: u32 = 0;

/// [`PythonProc::entry_kind`]: 3.11's `is_entry` byte marks an eval call's first frame, which
/// is emitted and ends that call's chain.
pub const PYTHON_ENTRY_IS_ENTRY: u8 = 0;
/// [`PythonProc::entry_kind`]: 3.12+'s shim frame, whose `owner` byte is
/// [`PythonProc::entry_value`] (`FRAME_OWNED_BY_CSTACK` on 3.12 and 3.13,
/// `FRAME_OWNED_BY_INTERPRETER` on 3.14 and 3.15), ends the chain and is not emitted.
pub const PYTHON_ENTRY_CSTACK_OWNER: u8 = 1;

/// [`PythonProc::tstate_cframe`] when the thread state holds the running frame itself.
pub const PYTHON_NO_CFRAME: u16 = u16::MAX;

/// A process's CPython interpreter, as the BPF walk reads it: addresses in the process (the
/// binary's plus its load bias), offsets from the start of each structure. Written by the
/// agent into `PYTHON_PROCS`, keyed by tgid.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PythonProc {
    /// The eval loop's ranges, `[start, end)`, in the first `eval_count` slots.
    pub eval_start: [u64; PYTHON_EVAL_RANGES],
    pub eval_end: [u64; PYTHON_EVAL_RANGES],
    /// `autoTSSkey`'s `int` pthread key (3.11 to 3.14); 0 when [`PythonProc::thread_local`]
    /// says where the thread state is.
    pub thread_key: u64,
    /// `PyCode_Type`: the agent names no frame whose code object has another type.
    pub code_type: u64,
    /// Bits of a frame's code reference that are address (3.14 and 3.15 tag the low ones).
    pub code_mask: u64,
    pub eval_count: u32,
    /// glibc: a key's value is at `thread_pointer + ((key + specific_bias) << specific_shift)
    /// + specific_value`, for keys below `specific_keys`. `specific_value` is signed: arm64's
    /// glibc keeps `struct pthread` below the thread pointer (TLS variant I).
    pub specific_keys: u32,
    pub specific_bias: u32,
    pub specific_shift: u32,
    pub specific_value: i32,
    /// `PyThreadState.cframe` (3.11, 3.12), or [`PYTHON_NO_CFRAME`].
    pub tstate_cframe: u16,
    /// The running frame, in the `_PyCFrame` or in the thread state.
    pub current_frame: u16,
    pub frame_code: u16,
    pub frame_previous: u16,
    pub frame_instr: u16,
    /// `tp_basicsize` of code objects: where the bytecode starts.
    pub code_adaptive: u16,
    /// The entry marker's byte offset in a frame.
    pub entry_offset: u16,
    /// [`PYTHON_ENTRY_IS_ENTRY`] or [`PYTHON_ENTRY_CSTACK_OWNER`].
    pub entry_kind: u8,
    pub entry_value: u8,
    /// 3.15+: the thread state's offset from the thread pointer (`fs` base), a thread-local
    /// of the interpreter's executable; 0 (never a thread-local's offset: the thread pointer
    /// points at the thread's own control block) when it is under [`PythonProc::thread_key`].
    pub thread_local: i32,
}

/// Index into the per-CPU `PYTHON_COUNTS` array: Python frames the walk emitted, and why a
/// Python chain stopped early. The native walk goes on after any of these.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PythonCount {
    /// Python frames emitted.
    Frames = 0,
    /// The thread's state could not be found (no key value, a read fault): the eval loop's
    /// frames stay native.
    NoThreadState = 1,
    /// A frame could not be read: the chain ends there.
    FrameReadFault = 2,
    /// A frame's code reference is null: emitted as an unknown code object. (One that is not
    /// a code object is found so by the agent, which reads it to name it.)
    UnknownCode = 3,
    /// The stack had no room for more frames.
    FrameLimit = 4,
}

/// Number of [`PythonCount`] kinds; the length of one run of the `PYTHON_COUNTS_MAP` array
/// ([`COUNTER_RUNS`]).
pub const PYTHON_COUNTS: u32 = 5;

impl PythonCount {
    /// All kinds, in index order.
    pub const ALL: [PythonCount; PYTHON_COUNTS as usize] = [
        PythonCount::Frames,
        PythonCount::NoThreadState,
        PythonCount::FrameReadFault,
        PythonCount::UnknownCode,
        PythonCount::FrameLimit,
    ];

    /// Short name used in summaries, logs and `/metrics` labels.
    pub const fn name(self) -> &'static str {
        match self {
            PythonCount::Frames => "frames",
            PythonCount::NoThreadState => "thread state not found",
            PythonCount::FrameReadFault => "frame read fault",
            PythonCount::UnknownCode => "unknown code object",
            PythonCount::FrameLimit => "frame limit",
        }
    }
}
