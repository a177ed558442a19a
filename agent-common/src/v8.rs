//! What the V8 walk in BPF and the agent share: a Node process's entry (`V8_PROCS`), the
//! frames' subtypes and the walk's counters. The frame words themselves are in `frame.rs`.

/// Most V8 processes the BPF side walks at once; the map is not preallocated.
pub const MAX_V8_PROCS: u32 = 4096;

/// Bytes below the frame pointer the walk reads a frame's bytecode slots from, with the
/// function and context at its top: the slots must lie in them, which the agent checks when
/// it writes the entry.
pub const V8_FRAME_BELOW: i32 = 64;
/// Bytes of a `Code` object the walk reads at once: its instruction start (when a pointer),
/// size and flags must lie in them.
pub const V8_CODE_BYTES: usize = 64;

/// [`V8Proc::flags`]: a `Code`'s instructions follow its header at `code_start` (V8 10), not
/// at the address held there.
pub const V8_CODE_INLINE: u8 = 1;
/// [`V8Proc::flags`]: a function keeps a handle into the dispatch table at `function_code`
/// (leaptiering, V8 13), not its `Code`: the walk finds the code in the process's table
/// ([`V8Proc::dispatch_table`]), or names such functions without it where that is 0.
pub const V8_CODE_DISPATCH: u8 = 2;

/// Where a dispatch table entry keeps its `Code`: its second word, the tagged pointer
/// shifted left by this, over the entry's mark bit and parameter count.
pub const V8_DISPATCH_CODE_SHIFT: u32 = 16;
/// Bytes of a dispatch table entry (its entry point, then the code's word).
pub const V8_DISPATCH_ENTRY_BYTES: u64 = 16;

/// What the V8 walk needs of one process, written by the agent into `V8_PROCS`, keyed by
/// tgid. The bytecode slots are indices into the words below the function; the `Code`
/// fields offsets into its first [`V8_CODE_BYTES`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct V8Proc {
    /// `JSFunction` and its subclasses' instance types, inclusive.
    pub first_function_type: u16,
    pub last_function_type: u16,
    pub shared_function_info_type: u16,
    pub code_type: u16,
    pub bytecode_array_type: u16,
    /// `HeapObject::map`, `Map::instance_type` (16 bits), `JSFunction::shared`.
    pub map: u16,
    pub instance_type: u16,
    pub function_shared: u16,
    /// `JSFunction`'s code: a tagged `Code`, or with [`V8_CODE_DISPATCH`] a 32-bit handle.
    pub function_code: u16,
    /// `Code`'s instruction start (a pointer, or with [`V8_CODE_INLINE`] where they start),
    /// its 32-bit instruction size and its 32-bit flags.
    pub code_start: u16,
    pub code_size: u16,
    pub code_flags: u16,
    /// The bytecode slots, as indices into the words read from `fp - V8_FRAME_BELOW`. The
    /// function and the context are always the two words below the frame pointer (the agent
    /// refuses a build where they are not).
    /// A dispatch handle is an entry's index shifted left by this.
    pub dispatch_shift: u8,
    pub _reserved: u8,
    pub slot_bytecode_array: u8,
    pub slot_bytecode_offset: u8,
    /// A `Code`'s kind: `(flags >> shift) & mask`; `baseline` is Sparkplug's, the kinds below
    /// it are builtins and bytecode handlers, those above optimised code.
    pub code_kind_shift: u8,
    pub code_kind_mask: u8,
    pub code_kind_baseline: u8,
    /// [`V8_CODE_INLINE`], [`V8_CODE_DISPATCH`].
    pub flags: u8,
    /// With [`V8_CODE_DISPATCH`], the process's dispatch table (its first entry's address),
    /// or 0 where the agent did not find it.
    pub dispatch_table: u64,
    /// With leaptiering (V8 13), the process's embedded builtins, where Ignition's handlers
    /// run: a frame is interpreted only with its pc there, as an on-stack-replaced frame
    /// keeps its bytecode slots, stale, while its optimised code runs, which the agent finds
    /// from the pc. 0 and 0 otherwise: a V8 that copies its builtins next to its JIT code
    /// (short builtin calls, as NodeSource's Node 20 does) runs Ignition outside them, and
    /// its on-stack-replaced frames are named as interpreted.
    pub builtins_start: u64,
    pub builtins_end: u64,
}

/// What a V8 frame is (bits 59-60 of its first word).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum V8Subtype {
    /// Ignition's bytecode: the pointer is the `SharedFunctionInfo`, the detail the frame's
    /// bytecode offset (as V8 keeps it, from the `BytecodeArray`'s tagged address), the
    /// cookie 0.
    Interpreted = 0,
    /// Optimised code (Maglev, TurboFan): the pointer is its `Code`, the detail the pc's
    /// offset from its instructions, the cookie [`v8_code_cookie`].
    Optimised = 1,
    /// Sparkplug's baseline code, which keeps no way back to its function: the pointer is the
    /// `JSFunction`, the detail and cookie as [`V8Subtype::Optimised`]'s.
    Baseline = 2,
    /// A function whose code the walk could not place the pc in (a builtin's, code replaced
    /// since the frame was entered, on-stack-replaced code, a leaf in its prologue, or a
    /// dispatch handle without its table): the pointer is the `SharedFunctionInfo`, the
    /// detail and cookie the frame's pc (its high and low halves; above a leaf, the return
    /// address less one).
    Function = 3,
}

impl V8Subtype {
    pub const fn of(bits: u8) -> V8Subtype {
        match bits & 3 {
            0 => V8Subtype::Interpreted,
            1 => V8Subtype::Optimised,
            2 => V8Subtype::Baseline,
            _ => V8Subtype::Function,
        }
    }
}

/// A compiled frame's cookie: its code's size and kind when the walk saw it. The agent reads
/// them again before naming the frame: code freed and its memory reused by other code is
/// most often of another size or kind, and is then left unnamed.
pub const fn v8_code_cookie(size: u32, kind: u32) -> u32 {
    (size << 4) | (kind & 0xf)
}

/// Index into the per-CPU `V8_COUNTS` array: JavaScript frames the walk emitted, and why a
/// frame in V8's code was left to the native walk. The native walk goes on after any of
/// these.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum V8Count {
    Frames = 0,
    /// A typed frame (entry, exit, stub, construct...): V8's own code, walked natively.
    TypedFrame = 1,
    /// A frame whose function slot held no `JSFunction` with a `SharedFunctionInfo`.
    BadFunction = 2,
    /// A JavaScript frame named without its code (see [`V8Subtype::Function`]).
    NoCode = 3,
    /// A frame pointer below the stack pointer, too far above it, or unreadable.
    BadFramePointer = 4,
    /// The stack had no room for more frames.
    FrameLimit = 5,
}

/// Number of [`V8Count`] kinds.
pub const V8_COUNTS: u32 = 6;

impl V8Count {
    /// All kinds, in index order.
    pub const ALL: [V8Count; V8_COUNTS as usize] = [
        V8Count::Frames,
        V8Count::TypedFrame,
        V8Count::BadFunction,
        V8Count::NoCode,
        V8Count::BadFramePointer,
        V8Count::FrameLimit,
    ];

    /// Short name used in summaries, logs and `/metrics` labels.
    pub const fn name(self) -> &'static str {
        match self {
            V8Count::Frames => "frames",
            V8Count::TypedFrame => "typed frame",
            V8Count::BadFunction => "invalid function",
            V8Count::NoCode => "function without its code",
            V8Count::BadFramePointer => "invalid frame pointer",
            V8Count::FrameLimit => "frame limit",
        }
    }
}
