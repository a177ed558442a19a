//! What the HotSpot walk in BPF and the agent share: a JVM's entry (`HOTSPOT_PROCS`), the
//! frames' cookies and the walk's counters. The frame words themselves are in `frame.rs`.

/// Most JVMs the BPF side walks at once; the map is not preallocated.
pub const MAX_HOTSPOT_PROCS: u32 = 1024;
/// Code heaps a JVM may have: JDK 9+'s segmented cache has three (non-methods, profiled and
/// non-profiled methods), JDK 8 one.
pub const HOTSPOT_HEAPS: usize = 4;
/// Bytes of a `CodeBlob` the walk reads at once: every field it reads of a blob must lie in
/// them (the agent checks each offset when it writes a process's entry).
pub const HOTSPOT_BLOB_BYTES: usize = 512;
/// [`HotspotProc::flags`]: code begin/end and the deopt handler are u32 offsets from the blob
/// (JDK 8 and 23+), not pointers.
pub const HOTSPOT_USES_OFFSETS: u16 = 1;
/// [`HotspotProc::flags`]: the interpreter frame's bcp is 8 words below fp (JDK 9+), not 7.
pub const HOTSPOT_NEW_BCP_SLOT: u16 = 2;

/// What the HotSpot walk needs of one JVM process, written by the agent into
/// `HOTSPOT_PROCS`, keyed by tgid. Every offset is one the agent checked to lie within the
/// blob bytes the walk reads at once.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HotspotProc {
    /// Each code heap's code, `[start, end)`, and its segment map, in the first `heap_count`.
    pub heap_start: [u64; HOTSPOT_HEAPS],
    pub heap_end: [u64; HOTSPOT_HEAPS],
    pub heap_segmap: [u64; HOTSPOT_HEAPS],
    pub heap_count: u32,
    /// log2 of the code cache's segment size.
    pub segment_shift: u32,
    /// `sizeof(HeapBlock)`: the blob follows its block's header.
    pub heapblock_size: u32,
    /// `sizeof(ConstMethod)`: the bytecode follows it.
    pub cmethod_size: u32,
    pub method_constmethod: u16,
    pub codeblob_name: u16,
    pub codeblob_code_begin: u16,
    pub codeblob_frame_size: u16,
    pub codeblob_frame_complete: u16,
    pub nmethod_compile_id: u16,
    pub nmethod_orig_pc_offset: u16,
    pub nmethod_deopt_handler: u16,
    /// [`HOTSPOT_USES_OFFSETS`], [`HOTSPOT_NEW_BCP_SLOT`].
    pub flags: u16,
    pub _reserved: [u16; 3],
    /// Where the JVM's `CollectedHeap*` is (`Universe::_collectedHeap`, in the process's
    /// addresses), and its `_total_collections`' offset in the heap: the collections count
    /// read with the sample, in each frame's cookie ([`hotspot_cookie`]). 0 where the JVM
    /// does not say.
    pub collected_heap: u64,
    pub total_collections: u32,
    pub _reserved2: u32,
}

/// Where a HotSpot frame's cookie keeps the low bits of the JVM's collections count at the
/// sample; the bits below it keep the frame's own check (the compile id, or the
/// `ConstMethod*` >> 3).
pub const HOTSPOT_EPOCH_SHIFT: u32 = 24;

/// A HotSpot frame's cookie: the low 24 bits of `check` and the low 8 of `epoch`.
pub const fn hotspot_cookie(check: u32, epoch: u32) -> u32 {
    (check & ((1 << HOTSPOT_EPOCH_SHIFT) - 1)) | (epoch << HOTSPOT_EPOCH_SHIFT)
}

/// A cookie's check and epoch ([`hotspot_cookie`]).
pub const fn hotspot_cookie_parts(cookie: u32) -> (u32, u32) {
    (
        cookie & ((1 << HOTSPOT_EPOCH_SHIFT) - 1),
        cookie >> HOTSPOT_EPOCH_SHIFT,
    )
}

/// Index into the per-CPU `HOTSPOT_COUNTS` array: Java frames the walk emitted, and why a
/// walk through the code cache stopped early. The native walk goes on after any of these.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HotspotCount {
    Frames = 0,
    /// The segment map led to no blob (a free segment, a chain too long, a read fault).
    NoCodeBlob = 1,
    /// The blob or its name could not be read.
    InvalidCodeBlob = 2,
    /// An interpreter frame whose frame pointer is not near its stack pointer.
    InterpreterFrame = 3,
    /// A compiled or stub frame whose return address was not found.
    InvalidReturnAddress = 4,
    /// The stack had no room for more frames.
    FrameLimit = 5,
}

/// Number of [`HotspotCount`] kinds.
pub const HOTSPOT_COUNTS: u32 = 6;

impl HotspotCount {
    /// All kinds, in index order.
    pub const ALL: [HotspotCount; HOTSPOT_COUNTS as usize] = [
        HotspotCount::Frames,
        HotspotCount::NoCodeBlob,
        HotspotCount::InvalidCodeBlob,
        HotspotCount::InterpreterFrame,
        HotspotCount::InvalidReturnAddress,
        HotspotCount::FrameLimit,
    ];

    /// Short name used in summaries, logs and `/metrics` labels.
    pub const fn name(self) -> &'static str {
        match self {
            HotspotCount::Frames => "frames",
            HotspotCount::NoCodeBlob => "no code blob",
            HotspotCount::InvalidCodeBlob => "invalid code blob",
            HotspotCount::InterpreterFrame => "invalid interpreter frame",
            HotspotCount::InvalidReturnAddress => "return address not found",
            HotspotCount::FrameLimit => "frame limit",
        }
    }
}
