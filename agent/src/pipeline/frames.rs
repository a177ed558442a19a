//! Typed frames: the drain (and the off-CPU events' decoder) reads each stack word the BPF
//! program wrote once, by its kind (`scorch_common::WordKind`), into a [`Frame`]; every stage
//! after it (aggregation, symbolization) carries the frame, never the word.

use scorch_common::{word_payload, WordKind};

/// One frame of a sampled stack, as the kernel or the BPF walk recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Frame {
    /// A user-space pc.
    Native(u64),
    /// A kernel pc (of a kernel stack: the kernel's own stack map recorded it).
    Kernel(u64),
    /// A runtime's frame (CPython's, HotSpot's): the word as its walk wrote it, kind bits
    /// included, and the payload of the continuation word right after it (0 when none: a
    /// Python frame fits one word), for the runtime's own namer (`runtimes::Names`) to read.
    Runtime(u64, u64),
}

impl Frame {
    /// The pc of a native or kernel frame; `None` for an interpreter's frame.
    pub fn pc(self) -> Option<u64> {
        match self {
            Frame::Native(pc) | Frame::Kernel(pc) => Some(pc),
            Frame::Runtime(..) => None,
        }
    }
}

/// The frames of a user stack the BPF walk wrote, leaf first.
///
/// A word of a kind no runtime has taken is what a native walk read from a corrupt stack (a
/// "pc" with its top bits set): it stays the native pc it claims to be, unmapped and unnamed,
/// as it always was. A continuation word carries more payload for the frame before it: the
/// first after a runtime's word is gathered into that frame (HotSpot's frames take one);
/// one after a native word, or beyond the first, belongs to no frame that reads it, and is
/// skipped.
pub fn decode_user(words: &[u64]) -> Vec<Frame> {
    let mut frames = Vec::with_capacity(words.len());
    // Whether the frame last pushed is a runtime's still without its continuation.
    let mut open = false;
    for &word in words {
        let frame = match WordKind::of(word) {
            Some(WordKind::Native) => Frame::Native(word_payload(word)),
            Some(WordKind::Python | WordKind::Hotspot | WordKind::V8) => Frame::Runtime(word, 0),
            Some(WordKind::Continuation) => {
                if let (true, Some(Frame::Runtime(_, more))) = (open, frames.last_mut()) {
                    *more = word_payload(word);
                }
                open = false;
                continue;
            }
            None => Frame::Native(word),
        };
        open = matches!(frame, Frame::Runtime(..));
        frames.push(frame);
    }
    frames
}

/// The frames of a stack of pcs the kernel recorded: a kernel stack (`kernel`), or a user
/// stack walked by frame pointers (native pcs only).
pub fn from_pcs(pcs: &[u64], kernel: bool) -> Vec<Frame> {
    let frame = if kernel { Frame::Kernel } else { Frame::Native };
    pcs.iter().map(|&pc| frame(pc)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use scorch_common::{hotspot_frame_words, python_frame_word, HotspotSubtype};

    #[test]
    fn user_words_decode_by_their_kind() {
        let words = [
            0x5555_5555_1234,
            python_frame_word(0x7f00_0000_1000, 7),
            // arm64's high user addresses and x86-64's 5-level ones stay native pcs.
            0xffff_8000_1000,
            (1 << 56) - 4096,
            python_frame_word(0, 0),
        ];
        assert_eq!(
            decode_user(&words),
            [
                Frame::Native(0x5555_5555_1234),
                Frame::Runtime(python_frame_word(0x7f00_0000_1000, 7), 0),
                Frame::Native(0xffff_8000_1000),
                Frame::Native((1 << 56) - 4096),
                Frame::Runtime(python_frame_word(0, 0), 0),
            ]
        );
    }

    #[test]
    fn a_hotspot_frame_carries_its_continuation() {
        let [compiled, compiled_more] =
            hotspot_frame_words(HotspotSubtype::Compiled, 0x7f00_0000_2000, 0x40, 17);
        let [interpreted, interpreted_more] =
            hotspot_frame_words(HotspotSubtype::Interpreted, 0x7f00_0000_3000, 5, 99);
        let words = [
            compiled,
            compiled_more,
            interpreted,
            interpreted_more,
            0x5555_5555_1234,
        ];
        assert_eq!(
            decode_user(&words),
            [
                Frame::Runtime(compiled, word_payload(compiled_more)),
                Frame::Runtime(interpreted, word_payload(interpreted_more)),
                Frame::Native(0x5555_5555_1234),
            ]
        );
        // The two words read back as the frame the walk wrote.
        let Frame::Runtime(word, more) = decode_user(&words)[0] else {
            panic!("a runtime frame");
        };
        assert_eq!(
            scorch_common::hotspot_frame_parts(word, more),
            Some((HotspotSubtype::Compiled, 0x7f00_0000_2000, 0x40, 17))
        );
        // A frame cut before its continuation (the stack's end) keeps 0.
        assert_eq!(decode_user(&[compiled]), [Frame::Runtime(compiled, 0)]);
    }

    #[test]
    fn garbage_words_stay_native_and_stray_continuations_are_skipped() {
        let garbage = 0xdead_beef_0000_0000;
        let continuation = WordKind::Continuation.word(42);
        // After a native word, and after garbage (a native pc too): no frame reads one.
        assert_eq!(
            decode_user(&[0x1000, continuation, garbage, continuation]),
            [Frame::Native(0x1000), Frame::Native(garbage)]
        );
        // Only the first continuation after a runtime's word is its; a leading one has no
        // frame at all.
        let python = python_frame_word(0x7f00_0000_1000, 7);
        let second = WordKind::Continuation.word(43);
        assert_eq!(
            decode_user(&[continuation, python, continuation, second, 0x2000]),
            [Frame::Runtime(python, 42), Frame::Native(0x2000)]
        );
    }

    #[test]
    fn pcs_are_kernel_or_native_by_their_stack() {
        let pcs = [0xffff_ffff_8100_0000, 0xffff_ffff_8100_0100];
        assert_eq!(
            from_pcs(&pcs, true),
            [
                Frame::Kernel(0xffff_ffff_8100_0000),
                Frame::Kernel(0xffff_ffff_8100_0100)
            ]
        );
        assert_eq!(from_pcs(&[0x1000], false), [Frame::Native(0x1000)]);
        assert_eq!(Frame::Kernel(5).pc(), Some(5));
        assert_eq!(Frame::Runtime(python_frame_word(8, 0), 0).pc(), None);
    }
}
