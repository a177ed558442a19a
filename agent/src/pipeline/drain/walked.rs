//! The walked user stacks as the sampler sends them through `WALKED_STACKS`: each record
//! parsed and kept by the window (generation) it is new to, until the drain takes that
//! window's. Pure: the protocol ([`super`]) reads the ring and hands the records here.

use std::collections::HashMap;

use scorch_common::{
    walked_stack_id, WalkedStack, MAX_USER_STACK_DEPTH, WALKED_GENERATION_1, WALKED_RUNTIME_FRAMES,
    WALKED_STACK_HEADER,
};

/// Most stacks with a runtime's frames kept for the unwinder between two of its polls: it
/// reads what they point at while their processes run, and a burst beyond this is named at
/// the window's end instead.
const MAX_PENDING_RUNTIME_STACKS: usize = 4096;

/// Why a record of the ring was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error(
        "a walked-stack record of {0} bytes, shorter than its {WALKED_STACK_HEADER}-byte header"
    )]
    Short(usize),
    #[error(
        "a walked-stack record of {bytes} bytes for {len} frames (at most {MAX_USER_STACK_DEPTH})"
    )]
    Length { bytes: usize, len: u32 },
}

/// A walked stack as the ring carried it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Walked {
    pub hash: u64,
    pub outcome: u32,
    pub frames: Box<[u64]>,
}

impl WalkedStack for Walked {
    fn hash(&self) -> u64 {
        self.hash
    }
    fn frames(&self) -> &[u64] {
        &self.frames
    }
    fn outcome(&self) -> u32 {
        self.outcome
    }
}

/// One record of the ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The process walked.
    pub tgid: u32,
    /// The generation whose window the stack is new to.
    pub generation: usize,
    /// Whether the stack holds a runtime's frames.
    pub runtime: bool,
    pub stack: Walked,
}

fn word(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_ne_bytes(word)
}

fn half(bytes: &[u8], at: usize) -> u32 {
    let mut half = [0; 4];
    half.copy_from_slice(&bytes[at..at + 4]);
    u32::from_ne_bytes(half)
}

/// Parses a record: a `UserStack`'s header and its `len` frames, exactly.
pub fn parse(bytes: &[u8]) -> Result<Record, RecordError> {
    use core::mem::offset_of;
    use scorch_common::UserStack;
    if bytes.len() < WALKED_STACK_HEADER {
        return Err(RecordError::Short(bytes.len()));
    }
    let len = half(bytes, offset_of!(UserStack, len));
    let frames = &bytes[WALKED_STACK_HEADER..];
    // The ring rounds a record's length up to 8 bytes: frames are words, so it is exact.
    if len as usize > MAX_USER_STACK_DEPTH || frames.len() != len as usize * 8 {
        return Err(RecordError::Length {
            bytes: bytes.len(),
            len,
        });
    }
    let flags = half(bytes, offset_of!(UserStack, flags));
    Ok(Record {
        tgid: half(bytes, offset_of!(UserStack, tgid)),
        generation: usize::from(flags & WALKED_GENERATION_1 != 0),
        runtime: flags & WALKED_RUNTIME_FRAMES != 0,
        stack: Walked {
            hash: word(bytes, offset_of!(UserStack, hash)),
            outcome: half(bytes, offset_of!(UserStack, outcome)),
            frames: frames.chunks_exact(8).map(|chunk| word(chunk, 0)).collect(),
        },
    })
}

/// The walked stacks received, by generation and id, until the drain takes a generation's.
#[derive(Debug, Default)]
pub struct WalkedStacks {
    generations: [HashMap<i32, Walked>; 2],
    /// The stacks with a runtime's frames received since the unwinder last took them.
    runtime: Vec<(u32, Box<[u64]>)>,
    /// Records refused ([`RecordError`]) since the start.
    pub refused: u64,
}

impl WalkedStacks {
    /// Keeps a record's stack under its id in its generation. A second record of the same id
    /// (the program sends a stack once per window, unless two CPUs raced on it) replaces the
    /// first: both are the same stack.
    pub fn add(&mut self, record: Record) {
        if record.runtime && self.runtime.len() < MAX_PENDING_RUNTIME_STACKS {
            self.runtime
                .push((record.tgid, record.stack.frames.clone()));
        }
        let id = walked_stack_id(record.stack.hash);
        self.generations[record.generation & 1].insert(id, record.stack);
    }

    /// Parses and keeps a record; counts it refused when it does not parse.
    pub fn add_bytes(&mut self, bytes: &[u8]) -> Result<(), RecordError> {
        parse(bytes)
            .map(|record| self.add(record))
            .inspect_err(|_| {
                self.refused += 1;
            })
    }

    /// Takes generation `generation`'s stacks: that window's, once it is quiescent.
    pub fn take(&mut self, generation: usize) -> HashMap<i32, Walked> {
        std::mem::take(&mut self.generations[generation & 1])
    }

    /// Takes the stacks with a runtime's frames received since the last call, with their
    /// processes.
    pub fn take_runtime(&mut self) -> Vec<(u32, Box<[u64]>)> {
        std::mem::take(&mut self.runtime)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use scorch_common::UserStack;

    fn record_bytes(stack: &UserStack) -> Vec<u8> {
        let bytes = WALKED_STACK_HEADER + stack.len as usize * 8;
        // SAFETY: a `UserStack` is plain old data, at least `bytes` long.
        unsafe { std::slice::from_raw_parts((stack as *const UserStack).cast::<u8>(), bytes) }
            .to_vec()
    }

    fn stack(hash: u64, frames: &[u64], tgid: u32, flags: u32) -> UserStack {
        let mut stack = UserStack {
            hash,
            len: frames.len() as u32,
            outcome: 4,
            tgid,
            flags,
            pcs: [0; MAX_USER_STACK_DEPTH],
        };
        stack.pcs[..frames.len()].copy_from_slice(frames);
        stack
    }

    #[test]
    fn a_record_parses_into_its_stack_process_and_generation() {
        let bytes = record_bytes(&stack(
            0x1_8000_0005,
            &[0x10, 0x20, 0x30],
            42,
            WALKED_GENERATION_1 | WALKED_RUNTIME_FRAMES,
        ));
        let record = parse(&bytes).unwrap();
        assert_eq!(record.tgid, 42);
        assert_eq!(record.generation, 1);
        assert!(record.runtime);
        assert_eq!(record.stack.hash, 0x1_8000_0005);
        assert_eq!(record.stack.outcome, 4);
        assert_eq!(&*record.stack.frames, &[0x10, 0x20, 0x30]);
    }

    #[test]
    fn a_record_whose_length_disagrees_with_its_frames_is_refused() {
        let mut bytes = record_bytes(&stack(1, &[0x10, 0x20], 1, 0));
        assert_eq!(parse(&bytes[..5]), Err(RecordError::Short(5)));
        bytes.truncate(bytes.len() - 8);
        assert!(matches!(
            parse(&bytes),
            Err(RecordError::Length { len: 2, .. })
        ));
        let mut long = record_bytes(&stack(1, &[], 1, 0));
        long[8..12].copy_from_slice(&(MAX_USER_STACK_DEPTH as u32 + 1).to_ne_bytes());
        long.resize(WALKED_STACK_HEADER + (MAX_USER_STACK_DEPTH + 1) * 8, 0);
        assert!(matches!(parse(&long), Err(RecordError::Length { .. })));
    }

    #[test]
    fn stacks_are_kept_by_generation_until_taken() {
        let mut walked = WalkedStacks::default();
        walked
            .add_bytes(&record_bytes(&stack(0x8000_0007, &[1, 2], 5, 0)))
            .unwrap();
        walked
            .add_bytes(&record_bytes(&stack(9, &[3], 6, WALKED_GENERATION_1)))
            .unwrap();
        walked
            .add_bytes(&record_bytes(&stack(
                11,
                &[4],
                7,
                WALKED_GENERATION_1 | WALKED_RUNTIME_FRAMES,
            )))
            .unwrap();
        assert!(walked.add_bytes(&[0; 3]).is_err());
        assert_eq!(walked.refused, 1);
        let zero = walked.take(0);
        assert_eq!(zero.len(), 1);
        assert_eq!(&*zero[&7].frames, &[1, 2]);
        assert!(walked.take(0).is_empty());
        let one = walked.take(1);
        assert_eq!(one.len(), 2);
        assert_eq!(walked.take_runtime(), vec![(7, vec![4].into_boxed_slice())]);
        assert!(walked.take_runtime().is_empty());
    }
}
