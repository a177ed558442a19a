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
/// (leaptiering, V8 13), not its `Code`: the walk names such functions without their code.
pub const V8_CODE_DISPATCH: u8 = 2;

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
    pub _reserved: [u8; 2],
    pub slot_bytecode_array: u8,
    pub slot_bytecode_offset: u8,
    /// A `Code`'s kind: `(flags >> shift) & mask`; `baseline` is Sparkplug's, the kinds below
    /// it are builtins and bytecode handlers, those above optimised code.
    pub code_kind_shift: u8,
    pub code_kind_mask: u8,
    pub code_kind_baseline: u8,
    /// [`V8_CODE_INLINE`], [`V8_CODE_DISPATCH`].
    pub flags: u8,
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
    /// since the frame was entered, a leaf in its prologue, or a dispatch handle): the
    /// pointer is the `SharedFunctionInfo`, the detail and cookie 0.
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
