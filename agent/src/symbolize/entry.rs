//! Completing the bottom of stacks that a frame-pointer walk ended in glibc's start code.
//!
//! glibc builds its start code without frame pointers, so a frame-pointer walk of a glibc
//! program ends at `main`'s caller, `__libc_start_call_main`, while a table walk goes on to
//! `__libc_start_main_impl` and `_start`. A process's first samples, taken before the agent
//! has read its maps (a short-lived process may have no others), are walked by frame pointers
//! only, and a flame graph then splits every such process into two towers that differ only at
//! the root.
//!
//! The frames below `__libc_start_call_main` are fixed by the two binaries: it is static, and
//! called from one place in `__libc_start_main_impl`, which the executable's `_start` calls.
//! So they are learned from a table walk that passed through it and given to walks that
//! stopped there, per place of `__libc_start_call_main` (one per libc build). A frame in a
//! shared file (libc) is kept as its place in the file (device, inode, offset). A frame in the
//! executable is kept relative to the executable's entry point, `_start`, with its name: a
//! process of another executable, or of a fresh copy of a deleted test binary (a new inode
//! each run), gets it at its own entry point, and only when the frame there has that name.
//! A chain is given only when every walk seen agreed on it, and only when each of its frames
//! lies in a file the stopped process maps: otherwise the stack stays as walked.
//!
//! Pure: what a process maps and what its frames are named comes through [`ProcessFrames`].

use std::{
    borrow::Cow,
    collections::{HashMap, HashSet},
};

use crate::pipeline::{aggregate::StackSample, drain::Stack, frames::Frame};

/// A place in a file: its device and inode as `/proc/PID/maps` gives them, and the offset
/// in the file.
pub type Spot = (u64, u64, u64);

/// The function a frame-pointer walk of a glibc program ends at.
pub const START_CALL_MAIN: &str = "__libc_start_call_main";

/// At most this many places of `__libc_start_call_main` are remembered: one per libc build
/// on the host (a container image may bring its own).
const MAX_CHAINS: usize = 1024;

/// At most this many places are remembered as being, or not being, `__libc_start_call_main`.
const MAX_NAMED: usize = 16_384;

/// Frames of a stack's last few positions looked at for a chain to learn: glibc's has two.
const MAX_CHAIN_LEN: usize = 4;

/// What the completion needs to know of a process, at the maps version of a sample.
pub trait ProcessFrames {
    /// The file place of `address`.
    fn spot(&self, pid: u32, version: u32, address: u64) -> Option<Spot>;
    /// The file place of the process's executable's entry point.
    fn entry(&mut self, pid: u32, version: u32) -> Option<Spot>;
    /// Where the process maps `spot`, when it maps that file over that offset executable.
    fn address(&self, pid: u32, version: u32, spot: Spot) -> Option<u64>;
    /// The outermost function name of the return address `address`.
    fn function(&mut self, pid: u32, version: u32, address: u64) -> Option<String>;
}

/// One frame of a chain.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Link {
    /// A place in a file other than the executable.
    File(Spot),
    /// An offset from the executable's entry point, and the function named there.
    Executable(i64, String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Chain {
    Links(Vec<Link>),
    /// Walks disagreed: nothing is given.
    Ambiguous,
}

/// What was learned across windows; see the module documentation.
#[derive(Debug, Default)]
pub struct EntryChains {
    /// By the place of `__libc_start_call_main`'s return address.
    chains: HashMap<Spot, Chain>,
    /// Whether a place is `__libc_start_call_main`'s.
    named: HashMap<Spot, bool>,
    /// Samples whose stacks were completed, since start.
    pub completed: u64,
}

impl EntryChains {
    /// Learns from `stacks`, then completes those that stopped at `__libc_start_call_main`.
    /// Stacks that become equal are merged; order is not kept. Only a completed stack is
    /// copied: the others are handed back as they were lent.
    pub fn complete<'a>(
        &mut self,
        stacks: impl IntoIterator<Item = (&'a StackSample, u64)>,
        frames: &mut impl ProcessFrames,
    ) -> Vec<(Cow<'a, StackSample>, u64)> {
        let stacks: Vec<(&StackSample, u64)> = stacks.into_iter().collect();
        // A process's stacks share their bottom frames, and what `learn` reads of a stack is
        // its last few: each distinct bottom is learned from once. A 999 Hz recording holds
        // thousands of stacks of one process over the same `main`, and learning from each
        // looked up the same places thousands of times.
        let mut learned = HashSet::new();
        for &(stack, _) in &stacks {
            if let Stack::Frames(user) = &stack.user {
                let read = &user[learned_from(user.len())..];
                if !learned.insert((stack.tgid, stack.maps_version, read)) {
                    continue;
                }
            }
            self.learn(stack, frames);
        }
        // What `below` adds depends on the process, its maps and the stack's last frame only.
        let mut below: HashMap<(u32, u32, Frame), Option<Vec<u64>>> = HashMap::new();
        let mut out = Vec::with_capacity(stacks.len());
        let mut completed: HashMap<StackSample, u64> = HashMap::new();
        for (stack, count) in stacks {
            let added = match &stack.user {
                Stack::Frames(user) if user.len() >= 2 => below
                    .entry((stack.tgid, stack.maps_version, user[user.len() - 1]))
                    .or_insert_with(|| self.below(stack, frames))
                    .clone(),
                _ => None,
            };
            match added {
                Some(added) => {
                    let mut whole = stack.clone();
                    if let Stack::Frames(user) = &mut whole.user {
                        user.extend(added.into_iter().map(Frame::Native));
                    }
                    self.completed += count;
                    *completed.entry(whole).or_insert(0) += count;
                }
                None => out.push((Cow::Borrowed(stack), count)),
            }
        }
        if completed.is_empty() {
            return out;
        }
        // A completed stack may equal one walked whole, which ends at the same frame: the two
        // are merged. Only stacks ending where a completed one ends are looked up.
        let ends: HashSet<u64> = completed.keys().filter_map(last_user_frame).collect();
        for (stack, count) in &mut out {
            if last_user_frame(stack.as_ref()).is_some_and(|end| ends.contains(&end)) {
                if let Some(more) = completed.remove(stack.as_ref()) {
                    *count += more;
                }
            }
        }
        out.extend(completed.into_iter().map(|(s, n)| (Cow::Owned(s), n)));
        out
    }

    /// Whether `address` (a return address) is in `__libc_start_call_main`, remembered by
    /// place.
    fn is_start_call_main(
        &mut self,
        stack: &StackSample,
        address: u64,
        frames: &mut impl ProcessFrames,
    ) -> Option<Spot> {
        let (pid, version) = (stack.tgid, stack.maps_version);
        let spot = frames.spot(pid, version, address)?;
        if let Some(&known) = self.named.get(&spot) {
            return known.then_some(spot);
        }
        let is = frames.function(pid, version, address).as_deref() == Some(START_CALL_MAIN);
        if self.named.len() >= MAX_NAMED {
            self.named.clear();
        }
        self.named.insert(spot, is);
        is.then_some(spot)
    }

    fn learn(&mut self, stack: &StackSample, frames: &mut impl ProcessFrames) {
        let Stack::Frames(user) = &stack.user else {
            return;
        };
        let n = user.len();
        // The leaf (index 0) is not a return address; the bottom has nothing below.
        for i in learned_from(n)..n.saturating_sub(1) {
            let Some(spot) = user[i]
                .pc()
                .and_then(|pc| self.is_start_call_main(stack, pc, frames))
            else {
                continue;
            };
            let (pid, version) = (stack.tgid, stack.maps_version);
            let known = self.chains.get(&spot);
            if known == Some(&Chain::Ambiguous) {
                return;
            }
            let Some(entry) = frames.entry(pid, version) else {
                return;
            };
            let mut links = Vec::with_capacity(n - i - 1);
            for frame in &user[i + 1..] {
                let Some(address) = frame.pc() else {
                    return;
                };
                let Some(place) = frames.spot(pid, version, address) else {
                    return;
                };
                if (place.0, place.1) != (entry.0, entry.1) {
                    links.push(Link::File(place));
                    continue;
                }
                let offset = place.2 as i64 - entry.2 as i64;
                // The name is looked up only for a chain not seen before.
                let name = match known {
                    Some(Chain::Links(known)) => {
                        known.get(links.len()).and_then(|link| match link {
                            Link::Executable(o, name) if *o == offset => Some(name.clone()),
                            _ => None,
                        })
                    }
                    _ => None,
                };
                let Some(name) = name.or_else(|| frames.function(pid, version, address)) else {
                    return;
                };
                links.push(Link::Executable(offset, name));
            }
            match self.chains.get_mut(&spot) {
                Some(Chain::Links(known)) if *known != links => {
                    self.chains.insert(spot, Chain::Ambiguous);
                }
                Some(_) => {}
                None => {
                    if self.chains.len() >= MAX_CHAINS {
                        self.chains.clear();
                    }
                    self.chains.insert(spot, Chain::Links(links));
                }
            }
            return;
        }
    }

    /// The addresses to add below `stack`, when it stopped at `__libc_start_call_main` and
    /// a chain for that place is known and mapped.
    fn below(&mut self, stack: &StackSample, frames: &mut impl ProcessFrames) -> Option<Vec<u64>> {
        let Stack::Frames(user) = &stack.user else {
            return None;
        };
        if user.len() < 2 {
            return None;
        }
        let spot = self.is_start_call_main(stack, user.last()?.pc()?, frames)?;
        let Chain::Links(chain) = self.chains.get(&spot)? else {
            return None;
        };
        let (pid, version) = (stack.tgid, stack.maps_version);
        let mut entry = None;
        let mut below = Vec::with_capacity(chain.len());
        for link in chain {
            let address = match link {
                Link::File(place) => frames.address(pid, version, *place)?,
                Link::Executable(offset, name) => {
                    let (dev, inode, at) = match entry {
                        Some(entry) => entry,
                        None => *entry.insert(frames.entry(pid, version)?),
                    };
                    let place = (dev, inode, at.checked_add_signed(*offset)?);
                    let address = frames.address(pid, version, place)?;
                    if frames.function(pid, version, address).as_deref() != Some(name.as_str()) {
                        return None;
                    }
                    address
                }
            };
            below.push(address);
        }
        Some(below)
    }
}

/// The first index of a stack's user frames that [`EntryChains::learn`] reads: the last
/// [`MAX_CHAIN_LEN`] + 1, never the leaf (not a return address).
fn learned_from(len: usize) -> usize {
    len.saturating_sub(MAX_CHAIN_LEN + 1).max(1).min(len)
}

/// The outermost user frame of a stack, when it has user frames.
fn last_user_frame(stack: &StackSample) -> Option<u64> {
    match &stack.user {
        Stack::Frames(user) => user.last().and_then(|frame| frame.pc()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type FileId = (u64, u64);
    const LIBC: FileId = (8, 100);
    const EXE: FileId = (8, 200);
    const OTHER_EXE: FileId = (8, 300);

    /// A process: its executable, where libc and the executable are mapped, and the file
    /// offset of the executable's entry point.
    #[derive(Clone, Copy)]
    struct Process {
        exe: FileId,
        libc: u64,
        base: u64,
        entry: u64,
    }

    /// libc's `__libc_start_call_main` returns at offset 0x29d90, `__libc_start_main_impl`
    /// at 0x29e40; `_start` calls it from 5 bytes past the entry point.
    struct Fake {
        processes: HashMap<u32, Process>,
        lookups: usize,
        /// Places asked for.
        spots: std::cell::Cell<usize>,
    }

    impl Fake {
        fn new(processes: &[(u32, FileId, u64, u64, u64)]) -> Fake {
            Fake {
                processes: processes
                    .iter()
                    .map(|&(pid, exe, libc, base, entry)| {
                        (
                            pid,
                            Process {
                                exe,
                                libc,
                                base,
                                entry,
                            },
                        )
                    })
                    .collect(),
                lookups: 0,
                spots: std::cell::Cell::new(0),
            }
        }
    }

    impl ProcessFrames for Fake {
        fn spot(&self, pid: u32, _: u32, address: u64) -> Option<Spot> {
            self.spots.set(self.spots.get() + 1);
            let p = self.processes.get(&pid)?;
            if (p.libc..p.libc + 0x10_0000).contains(&address) {
                Some((LIBC.0, LIBC.1, address - p.libc))
            } else if (p.base..p.base + 0x10_0000).contains(&address) {
                Some((p.exe.0, p.exe.1, address - p.base))
            } else {
                None
            }
        }
        fn entry(&mut self, pid: u32, _: u32) -> Option<Spot> {
            let p = self.processes.get(&pid)?;
            Some((p.exe.0, p.exe.1, p.entry))
        }
        fn address(&self, pid: u32, _: u32, (dev, inode, offset): Spot) -> Option<u64> {
            let p = self.processes.get(&pid)?;
            if (dev, inode) == LIBC {
                Some(p.libc + offset)
            } else if (dev, inode) == p.exe {
                Some(p.base + offset)
            } else {
                None
            }
        }
        fn function(&mut self, pid: u32, _: u32, address: u64) -> Option<String> {
            self.lookups += 1;
            let p = self.processes[&pid];
            let name = match address {
                a if a == p.libc + 0x29d90 => START_CALL_MAIN,
                a if a == p.libc + 0x29e40 => "__libc_start_main_impl",
                a if a == p.base + p.entry + 5 => "_start",
                _ => "other",
            };
            Some(name.to_owned())
        }
    }

    fn sample(pid: u32, frames: &[u64]) -> StackSample {
        StackSample {
            tgid: pid,
            maps_version: 0,
            user: Stack::Frames(frames.iter().map(|&pc| Frame::Native(pc)).collect()),
            kernel: Stack::Absent,
            thread: Default::default(),
            block: None,
        }
    }

    /// `EntryChains::complete` on owned stacks, its result owned.
    fn complete<const N: usize>(
        chains: &mut EntryChains,
        stacks: [(StackSample, u64); N],
        frames: &mut impl ProcessFrames,
    ) -> Vec<(StackSample, u64)> {
        chains
            .complete(stacks.iter().map(|(s, n)| (s, *n)), frames)
            .into_iter()
            .map(|(s, n)| (s.into_owned(), n))
            .collect()
    }

    fn frames_of(stacks: &[(StackSample, u64)], pid: u32) -> Vec<(Vec<u64>, u64)> {
        let mut found: Vec<_> = stacks
            .iter()
            .filter(|(s, _)| s.tgid == pid)
            .map(|(s, n)| match &s.user {
                Stack::Frames(f) => (f.iter().filter_map(|f| f.pc()).collect(), *n),
                _ => (Vec::new(), *n),
            })
            .collect();
        found.sort();
        found
    }

    #[test]
    fn a_stopped_walk_gets_the_chain_a_table_walk_of_the_same_binaries_found() {
        // Process 1 (libc at 0x7000_0000, exe at 0x5000_0000) was walked whole once; process
        // 2 maps the same files elsewhere and was walked by frame pointers only.
        let mut fake = Fake::new(&[
            (1, EXE, 0x7000_0000, 0x5000_0000, 0x20),
            (2, EXE, 0x7100_0000, 0x5100_0000, 0x20),
        ]);
        let whole = sample(
            1,
            &[
                0x5000_1000,
                0x5000_1100,
                0x7002_9d90,
                0x7002_9e40,
                0x5000_0025,
            ],
        );
        let stopped = sample(2, &[0x5100_1000, 0x5100_1100, 0x7102_9d90]);
        let mut chains = EntryChains::default();
        let out = complete(&mut chains, [(whole, 3), (stopped, 2)], &mut fake);
        assert_eq!(
            frames_of(&out, 2),
            [(
                vec![
                    0x5100_1000,
                    0x5100_1100,
                    0x7102_9d90,
                    0x7102_9e40,
                    0x5100_0025
                ],
                2
            )]
        );
        assert_eq!(chains.completed, 2);
    }

    #[test]
    fn completed_stacks_merge_with_the_whole_ones_and_later_windows_use_what_was_learned() {
        let mut fake = Fake::new(&[(1, EXE, 0x7000_0000, 0x5000_0000, 0x20)]);
        let whole = [0x5000_1000, 0x7002_9d90, 0x7002_9e40, 0x5000_0025];
        let mut chains = EntryChains::default();
        let out = complete(
            &mut chains,
            [(sample(1, &whole), 3), (sample(1, &whole[..2]), 2)],
            &mut fake,
        );
        assert_eq!(frames_of(&out, 1), [(whole.to_vec(), 5)]);
        // A later window holds only a stopped walk.
        let out = complete(&mut chains, [(sample(1, &whole[..2]), 4)], &mut fake);
        assert_eq!(frames_of(&out, 1), [(whole.to_vec(), 4)]);
        // Three places named once each (`__libc_start_call_main`'s, `_start`'s to learn, and
        // the whole walk's bottom, which is not); each completion checks the name at the
        // executable's entry.
        assert_eq!(fake.lookups, 5);
    }

    #[test]
    fn stacks_sharing_their_bottom_are_learned_from_and_completed_once() {
        // A 999 Hz recording: thousands of stacks of one process over the same `main`, and
        // the frame-pointer walks of its first samples.
        let mut fake = Fake::new(&[(1, EXE, 0x7000_0000, 0x5000_0000, 0x20)]);
        let bottom = [0x5000_1100, 0x7002_9d90, 0x7002_9e40, 0x5000_0025];
        let whole: Vec<(StackSample, u64)> = (0..2000u64)
            .map(|leaf| {
                let mut frames = vec![0x5000_2000 + leaf];
                frames.extend(bottom);
                (sample(1, &frames), 1)
            })
            .collect();
        let stopped: Vec<(StackSample, u64)> = (0..500u64)
            .map(|leaf| {
                (
                    sample(1, &[0x5000_2000 + leaf, 0x5000_1100, 0x7002_9d90]),
                    2,
                )
            })
            .collect();
        let mut chains = EntryChains::default();
        let out = chains.complete(
            whole.iter().chain(&stopped).map(|(s, n)| (s, *n)),
            &mut fake,
        );
        // The stopped walks got the bottom, and merged with the whole walks they now equal.
        assert_eq!(out.len(), 2000);
        for (stack, count) in &out {
            let Stack::Frames(frames) = &stack.user else {
                panic!("user frames")
            };
            let pcs: Vec<u64> = frames.iter().filter_map(|f| f.pc()).collect();
            assert_eq!(pcs[1..], bottom);
            let leaf = pcs[0] - 0x5000_2000;
            assert_eq!(*count, if leaf < 500 { 3 } else { 1 }, "leaf {leaf}");
        }
        assert_eq!(chains.completed, 1000);
        // Learning named each place once; completing checked the name at the entry once.
        assert!(fake.lookups <= 6, "{} name lookups", fake.lookups);
        // And each place was looked up for one stack, not for each of the 2,500 (which took
        // more than 10,000 lookups).
        assert!(
            fake.spots.get() <= 20,
            "{} places looked up",
            fake.spots.get()
        );
    }

    #[test]
    fn another_executable_gets_the_chain_at_its_own_entry_point_when_start_is_there() {
        // Process 2 runs another executable (a fresh copy of a deleted binary is one) with
        // its entry point elsewhere; process 3's executable has other code there.
        let mut fake = Fake::new(&[
            (1, EXE, 0x7000_0000, 0x5000_0000, 0x20),
            (2, OTHER_EXE, 0x7100_0000, 0x5100_0000, 0x440),
            (3, (8, 400), 0x7200_0000, 0x5200_0000, 0x100),
        ]);
        let mut chains = EntryChains::default();
        let whole = sample(1, &[0x5000_1000, 0x7002_9d90, 0x7002_9e40, 0x5000_0025]);
        let other = sample(2, &[0x5100_1000, 0x7102_9d90]);
        let out = complete(&mut chains, [(whole, 1), (other, 1)], &mut fake);
        assert_eq!(
            frames_of(&out, 2),
            [(vec![0x5100_1000, 0x7102_9d90, 0x7102_9e40, 0x5100_0445], 1)]
        );
        // Process 3's executable has other code at its entry point: nothing is given.
        let stranger = sample(3, &[0x5200_1000, 0x7202_9d90]);
        let out = complete(&mut chains, [(stranger, 1)], &mut StrangeStart(fake));
        assert_eq!(frames_of(&out, 3), [(vec![0x5200_1000, 0x7202_9d90], 1)]);
        assert_eq!(chains.completed, 1);
    }

    /// A fake whose executables have something other than `_start` at the entry point.
    struct StrangeStart(Fake);

    impl ProcessFrames for StrangeStart {
        fn spot(&self, pid: u32, version: u32, address: u64) -> Option<Spot> {
            self.0.spot(pid, version, address)
        }
        fn entry(&mut self, pid: u32, version: u32) -> Option<Spot> {
            self.0.entry(pid, version)
        }
        fn address(&self, pid: u32, version: u32, spot: Spot) -> Option<u64> {
            self.0.address(pid, version, spot)
        }
        fn function(&mut self, pid: u32, version: u32, address: u64) -> Option<String> {
            self.0.function(pid, version, address).map(|name| {
                if name == "_start" {
                    "main".to_owned()
                } else {
                    name
                }
            })
        }
    }

    #[test]
    fn nothing_is_given_when_walks_disagree() {
        let mut fake = Fake::new(&[
            (1, EXE, 0x7000_0000, 0x5000_0000, 0x20),
            (3, EXE, 0x7200_0000, 0x5200_0000, 0x20),
        ]);
        let mut chains = EntryChains::default();
        let whole = sample(1, &[0x5000_1000, 0x7002_9d90, 0x7002_9e40, 0x5000_0025]);
        // A second whole walk through the same place that disagrees: nothing is given.
        let odd = sample(1, &[0x5000_1000, 0x7002_9d90, 0x7002_9e48, 0x5000_0025]);
        let stopped = sample(3, &[0x5200_1000, 0x7202_9d90]);
        let out = complete(&mut chains, [(whole, 1), (odd, 1), (stopped, 1)], &mut fake);
        assert_eq!(frames_of(&out, 3), [(vec![0x5200_1000, 0x7202_9d90], 1)]);
        assert_eq!(chains.completed, 0);
    }

    #[test]
    fn a_stack_that_ends_elsewhere_or_in_an_unmapped_place_is_left_alone() {
        let mut fake = Fake::new(&[(1, EXE, 0x7000_0000, 0x5000_0000, 0x20)]);
        let mut chains = EntryChains::default();
        let whole = sample(1, &[0x5000_1000, 0x7002_9d90, 0x7002_9e40, 0x5000_0025]);
        let thread = sample(1, &[0x5000_1000, 0x7002_0000]);
        let unmapped = sample(1, &[0x5000_1000, 0x9000_0000]);
        let out = complete(
            &mut chains,
            [
                (whole.clone(), 1),
                (thread.clone(), 1),
                (unmapped.clone(), 1),
            ],
            &mut fake,
        );
        assert_eq!(out.len(), 3);
        assert_eq!(chains.completed, 0);
    }
}
