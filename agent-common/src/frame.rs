//! Stack words: how the BPF walk writes one frame of a user stack into a `u64`, and how the
//! agent reads it back. Every word carries its [`WordKind`] in its top bits, so nothing
//! downstream guesses what a frame is from its shape.
//!
//! ```text
//!  63   61 60                                                          0
//! +-------+-------------------------------------------------------------+
//! | kind  | payload (61 bits)                                           |
//! +-------+-------------------------------------------------------------+
//! ```
//!
//! - [`WordKind::Native`] (0): the payload is the pc. Kind 0 keeps a native word equal to its
//!   pc, so the native walk stores pcs as they are. Every 64-bit Linux keeps user addresses
//!   far below 2^61: x86-64 below 2^47, or 2^56 with 5-level paging; arm64 below 2^48, or
//!   2^52 with 52-bit virtual addresses.
//! - [`WordKind::Python`] (1): a CPython frame, its instruction offset (code units from the
//!   bytecode's start) in bits 45-60 and its code object's address, shifted right by 3, in
//!   bits 0-44. A code object is a C struct of pointers, 8-byte aligned, so the shift loses
//!   nothing, and the 45 bits hold every address below 2^48: all of x86-64 with 4-level
//!   paging, and the default address space of arm64 and of x86-64 with 5-level paging (the
//!   kernel hands a process addresses above 2^47 or 2^48 only when it asks for them with an
//!   `mmap` hint). **Limits:** a code object at 2^48 or above, or one not 8-byte aligned, is
//!   written as code 0, which the agent names as an unknown code object, never as another
//!   function; an instruction offset above `u16::MAX` is written as `u16::MAX`, so the frame
//!   keeps its function and is given the line of that offset.
//! - [`WordKind::Hotspot`] (2) and [`WordKind::V8`] (3): a frame of two words
//!   ([`pointer_frame_words`]): its subtype and pointer, then a continuation.
//! - [`WordKind::Continuation`] (7): more payload for the frame of the word before it. A
//!   runtime that needs more than 61 bits for a frame (a method and a bytecode index, a
//!   function and a pc offset) writes a frame's first word with the runtime's kind and each
//!   further word as a continuation, and the agent's decoder gathers them. A frame of a
//!   runtime takes a kind of its own from the unassigned 4-6; when those run out, kind 6 can
//!   become an escape whose continuation names the runtime.
//!
//! The walk writes every word through the functions here, and the agent decodes each word
//! once (its drain) into a typed frame.

/// The bits of a word that say its kind.
pub const WORD_KIND_SHIFT: u32 = 61;
/// The payload bits of a word (below [`WORD_KIND_SHIFT`]).
pub const WORD_PAYLOAD_MASK: u64 = (1 << WORD_KIND_SHIFT) - 1;

/// What a stack word holds (its top 3 bits).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WordKind {
    /// A native pc.
    Native = 0,
    /// A CPython frame: code object and instruction offset.
    Python = 1,
    /// A HotSpot frame's first word: its subtype and pointer (a continuation follows).
    Hotspot = 2,
    /// A V8 frame's first word: its subtype and pointer (a continuation follows).
    V8 = 3,
    /// More payload for the frame of the word before.
    Continuation = 7,
}

impl WordKind {
    /// The kind of `word`; `None` for a kind no runtime has taken yet (4-6). The walk writes
    /// none of those: such a word is a native walk's garbage read, whose top bits are set.
    pub const fn of(word: u64) -> Option<WordKind> {
        match word >> WORD_KIND_SHIFT {
            0 => Some(WordKind::Native),
            1 => Some(WordKind::Python),
            2 => Some(WordKind::Hotspot),
            3 => Some(WordKind::V8),
            7 => Some(WordKind::Continuation),
            _ => None,
        }
    }

    /// `payload` as a word of this kind (bits above the payload are dropped).
    pub const fn word(self, payload: u64) -> u64 {
        ((self as u64) << WORD_KIND_SHIFT) | (payload & WORD_PAYLOAD_MASK)
    }
}

/// A word's payload: the bits below its kind.
pub const fn word_payload(word: u64) -> u64 {
    word & WORD_PAYLOAD_MASK
}

/// Where a Python word's instruction offset starts.
pub const PYTHON_INSTR_SHIFT: u32 = 45;
/// The code object's address bits a Python word keeps: below 2^48, 8-byte aligned. Any other
/// bit set makes the word's code 0 (an unknown code object).
pub const PYTHON_CODE_BITS: u64 = ((1 << 48) - 1) & !7;

/// A Python frame as a stack word: its code object and instruction offset (see the module's
/// doc for the limits).
pub const fn python_frame_word(code: u64, instr: u64) -> u64 {
    let instr = if instr > u16::MAX as u64 {
        u16::MAX as u64
    } else {
        instr
    };
    // Branchless, so that the BPF walk's verifier follows one path here, not two:
    // `(x | -x) >> 63` is 1 exactly when x is not 0.
    let outside = code & !PYTHON_CODE_BITS;
    let refused = (outside | outside.wrapping_neg()) >> 63;
    let code = code & refused.wrapping_sub(1);
    WordKind::Python.word((instr << PYTHON_INSTR_SHIFT) | (code >> 3))
}

/// The code object's address and the instruction offset of a Python word; `None` for a word
/// of another kind.
pub const fn python_frame_parts(word: u64) -> Option<(u64, u16)> {
    if word >> WORD_KIND_SHIFT != WordKind::Python as u64 {
        return None;
    }
    let payload = word_payload(word);
    let code = (payload & ((1 << PYTHON_INSTR_SHIFT) - 1)) << 3;
    Some((code, (payload >> PYTHON_INSTR_SHIFT) as u16))
}

/// What a HotSpot frame is (bits 59-60 of its first word).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HotspotSubtype {
    /// The template interpreter: the pointer is the `Method*`, the detail its bci, the cookie
    /// `ConstMethod*` >> 3.
    Interpreted = 0,
    /// A compiled method (C1, C2, or a native method's wrapper): the pointer is the nmethod,
    /// the detail the pc's offset from its code, the cookie its compile id.
    Compiled = 1,
    /// A stub: the pointer is its `CodeBlob`, the detail the pc's offset, the cookie the
    /// first four bytes of its name.
    Stub = 2,
    /// vtable chunks (a megamorphic call's dispatch), as a stub.
    Vtable = 3,
}

/// Where a two-word frame's subtype starts (HotSpot's, V8's).
pub const SUBTYPE_SHIFT: u32 = 59;
/// Where a HotSpot word's subtype starts.
pub const HOTSPOT_SUBTYPE_SHIFT: u32 = SUBTYPE_SHIFT;
/// The pointer bits a two-word frame keeps: below 2^48, 8-byte aligned (a `Method*`, a
/// `CodeBlob*` and an untagged V8 heap object all are); any other bit set makes the pointer
/// 0, which the agent leaves unnamed.
pub const POINTER_BITS: u64 = ((1 << 48) - 1) & !7;
/// [`POINTER_BITS`], by its HotSpot name.
pub const HOTSPOT_POINTER_BITS: u64 = POINTER_BITS;
/// The largest detail a two-word frame keeps; a larger one is written as this.
pub const MAX_DETAIL: u32 = (1 << 29) - 1;

/// A frame of a runtime that takes two words: the first of `kind` with its `subtype` (2
/// bits) and pointer, then a continuation with the detail (a bytecode index or offset, a pc
/// offset; at most [`MAX_DETAIL`]) and the cookie.
pub const fn pointer_frame_words(
    kind: WordKind,
    subtype: u8,
    pointer: u64,
    detail: u32,
    cookie: u32,
) -> [u64; 2] {
    // Branchless, as `python_frame_word`.
    let outside = pointer & !POINTER_BITS;
    let refused = (outside | outside.wrapping_neg()) >> 63;
    let pointer = pointer & refused.wrapping_sub(1);
    let detail = if detail > MAX_DETAIL {
        MAX_DETAIL
    } else {
        detail
    };
    [
        kind.word((((subtype & 3) as u64) << SUBTYPE_SHIFT) | (pointer >> 3)),
        WordKind::Continuation.word(((detail as u64) << 32) | cookie as u64),
    ]
}

/// A two-word frame's parts from its first word and its continuation's payload: subtype
/// bits, pointer, detail and cookie; `None` when `word` is not of `kind`.
pub const fn pointer_frame_parts(
    kind: WordKind,
    word: u64,
    continuation: u64,
) -> Option<(u8, u64, u32, u32)> {
    if word >> WORD_KIND_SHIFT != kind as u64 {
        return None;
    }
    let payload = word_payload(word);
    let pointer = (payload << 3) & POINTER_BITS;
    let continuation = continuation & WORD_PAYLOAD_MASK;
    Some((
        ((payload >> SUBTYPE_SHIFT) & 3) as u8,
        pointer,
        ((continuation >> 32) & MAX_DETAIL as u64) as u32,
        continuation as u32,
    ))
}

/// A HotSpot frame as two stack words ([`pointer_frame_words`]).
pub const fn hotspot_frame_words(
    subtype: HotspotSubtype,
    pointer: u64,
    detail: u32,
    cookie: u32,
) -> [u64; 2] {
    pointer_frame_words(WordKind::Hotspot, subtype as u8, pointer, detail, cookie)
}

/// A HotSpot frame's parts from its first word and its continuation's payload: subtype,
/// pointer, detail and cookie; `None` when `word` is no HotSpot word.
pub const fn hotspot_frame_parts(
    word: u64,
    continuation: u64,
) -> Option<(HotspotSubtype, u64, u32, u32)> {
    let Some((subtype, pointer, detail, cookie)) =
        pointer_frame_parts(WordKind::Hotspot, word, continuation)
    else {
        return None;
    };
    let subtype = match subtype {
        0 => HotspotSubtype::Interpreted,
        1 => HotspotSubtype::Compiled,
        2 => HotspotSubtype::Stub,
        _ => HotspotSubtype::Vtable,
    };
    Some((subtype, pointer, detail, cookie))
}

/// A V8 frame as two stack words ([`pointer_frame_words`]).
pub const fn v8_frame_words(
    subtype: crate::V8Subtype,
    pointer: u64,
    detail: u32,
    cookie: u32,
) -> [u64; 2] {
    pointer_frame_words(WordKind::V8, subtype as u8, pointer, detail, cookie)
}

/// A V8 frame's parts from its first word and its continuation's payload: subtype, pointer,
/// detail and cookie; `None` when `word` is no V8 word.
pub const fn v8_frame_parts(
    word: u64,
    continuation: u64,
) -> Option<(crate::V8Subtype, u64, u32, u32)> {
    let Some((subtype, pointer, detail, cookie)) =
        pointer_frame_parts(WordKind::V8, word, continuation)
    else {
        return None;
    };
    Some((crate::V8Subtype::of(subtype), pointer, detail, cookie))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_words_are_their_pcs() {
        // x86-64 (4- and 5-level paging) and arm64 (48- and 52-bit) user addresses.
        for pc in [
            0x40_1000,
            (1 << 47) - 1,
            (1 << 48) - 16,
            (1 << 52) - 4,
            (1 << 56) - 4096,
        ] {
            let word = WordKind::Native.word(pc);
            assert_eq!(word, pc);
            assert_eq!(WordKind::of(word), Some(WordKind::Native));
            assert_eq!(word_payload(word), pc);
            assert_eq!(python_frame_parts(word), None);
        }
    }

    #[test]
    fn python_words_round_trip() {
        for (code, instr) in [
            (0x7f12_3456_7890u64, 0u64),
            (0x5555_5555_8000, 12),
            // arm64's default mmap area, just below 2^48.
            (0xffff_a5a5_5a58, 40_000),
            ((1 << 48) - 8, u16::MAX as u64),
            (8, 1),
        ] {
            let word = python_frame_word(code, instr);
            assert_eq!(WordKind::of(word), Some(WordKind::Python));
            assert_eq!(python_frame_parts(word), Some((code, instr as u16)));
        }
    }

    #[test]
    fn python_words_past_their_limits_lose_what_they_cannot_keep() {
        // An offset beyond 16 bits keeps its function and the last offset's line.
        let word = python_frame_word(0x7f00_0000_1000, 70_000);
        assert_eq!(python_frame_parts(word), Some((0x7f00_0000_1000, u16::MAX)));
        // A code object at or above 2^48 (an opted-in 52- or 57-bit address space), or not
        // aligned, is an unknown code object, never another one.
        for code in [1 << 48, (1 << 52) - 8, (1 << 56) - 8, 0x7f00_0000_1004] {
            let word = python_frame_word(code, 3);
            assert_eq!(python_frame_parts(word), Some((0, 3)), "{code:#x}");
        }
        assert_eq!(python_frame_parts(python_frame_word(0, 0)), Some((0, 0)));
    }

    #[test]
    fn hotspot_frames_round_trip_and_refuse_what_they_cannot_hold() {
        let [word, more] =
            hotspot_frame_words(HotspotSubtype::Compiled, 0x7f12_3456_7898, 0x1234, 77);
        assert_eq!(WordKind::of(word), Some(WordKind::Hotspot));
        assert_eq!(WordKind::of(more), Some(WordKind::Continuation));
        assert_eq!(
            hotspot_frame_parts(word, word_payload(more)),
            Some((HotspotSubtype::Compiled, 0x7f12_3456_7898, 0x1234, 77))
        );
        for subtype in [
            HotspotSubtype::Interpreted,
            HotspotSubtype::Stub,
            HotspotSubtype::Vtable,
        ] {
            let [word, more] = hotspot_frame_words(subtype, 0x1000, u32::MAX, u32::MAX);
            // The detail saturates at 29 bits; the cookie keeps all 32.
            assert_eq!(
                hotspot_frame_parts(word, word_payload(more)),
                Some((subtype, 0x1000, (1 << 29) - 1, u32::MAX))
            );
        }
        // A pointer at or above 2^48, or unaligned, is 0: left unnamed, never another.
        for pointer in [1 << 48, u64::MAX, 0x7f00_0000_1004] {
            let [word, more] = hotspot_frame_words(HotspotSubtype::Interpreted, pointer, 1, 2);
            assert_eq!(hotspot_frame_parts(word, more).map(|p| p.1), Some(0));
        }
        assert_eq!(hotspot_frame_parts(0x1000, 0), None);
    }

    #[test]
    fn v8_frames_take_two_words_of_their_own_kind() {
        let [word, more] = v8_frame_words(crate::V8Subtype::Baseline, 0x7f12_3456_7898, 0x40, 9);
        assert_eq!(WordKind::of(word), Some(WordKind::V8));
        assert_eq!(WordKind::of(more), Some(WordKind::Continuation));
        assert_eq!(
            v8_frame_parts(word, word_payload(more)),
            Some((crate::V8Subtype::Baseline, 0x7f12_3456_7898, 0x40, 9))
        );
        // A HotSpot word is no V8 word, nor the other way round.
        assert_eq!(hotspot_frame_parts(word, more), None);
        let [java, more] = hotspot_frame_words(HotspotSubtype::Stub, 0x1000, 1, 2);
        assert_eq!(v8_frame_parts(java, more), None);
    }

    #[test]
    fn kinds_are_read_from_the_top_bits() {
        assert_eq!(
            WordKind::of(WordKind::Continuation.word(u64::MAX)),
            Some(WordKind::Continuation)
        );
        assert_eq!(
            word_payload(WordKind::Continuation.word(u64::MAX)),
            WORD_PAYLOAD_MASK
        );
        // Unassigned kinds: what a garbage pc with its top bits set reads as.
        for kind in 4..7u64 {
            assert_eq!(WordKind::of(kind << WORD_KIND_SHIFT | 0x1234), None);
        }
        // The old Python tag (bit 63) is no Python word now.
        assert_eq!(WordKind::of(1 << 63), None);
    }
}
