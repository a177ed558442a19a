//! The loader's side of the runtime walks (`crate::runtimes`): which binaries are a
//! runtime's (or give one what it needs, as glibc does), what a process running one gets in
//! the runtime's BPF map, and the runtime frames of new stacks, read while their processes
//! run. Every runtime comes through the registry; none is named here.

use std::{any::Any, sync::Arc};

use scorch_common::RuntimeId;

use std::collections::HashSet;
use std::path::Path;

use super::{LoaderMaps, Unwinder};
use crate::binary::elf::{load_bias, Elf, Segment};
use crate::pipeline::frames::{decode_user, Frame};
use crate::runtimes::Registry;
use crate::runtimes::{Attach, Attachment, Detected, Support};

/// What a binary is to the runtime walks, found before its table is built (in
/// milliseconds, where the table takes a tenth of a second for an interpreter), so a
/// process's runtime frames are walked from its first samples on.
#[derive(Debug, Clone)]
pub(super) struct FileRuntime {
    /// The runtimes it is a binary of, and what it gives them.
    pub(super) detected: Detected,
    /// Its executable segments, for the load bias of a mapping of it.
    pub(super) segments: Vec<Segment>,
}

/// Most runtime frames remembered for the symbolizer between two takes: a poll reads at most
/// a ring buffer's worth of stacks, but nothing here grows without bound if none takes them.
const MAX_RUNTIME_WORDS: usize = 65_536;

/// What the runtimes made of one process at its description.
#[derive(Debug, Default)]
pub(super) struct Attachments {
    /// Those that walk it, each with its entry.
    pub(super) attached: Vec<(RuntimeId, Attachment)>,
    /// Those that cannot, and why.
    pub(super) refused: Vec<(RuntimeId, String)>,
    /// Whether one asked to be asked again (the process is setting its runtime up).
    pub(super) later: bool,
}

/// A change in which runtimes a process runs, for the symbolizer: the process, the runtime,
/// and what naming its frames needs (`None`: it no longer runs it).
pub type AttachmentChange = (u32, RuntimeId, Option<Arc<dyn Any + Send + Sync>>);

impl<M: LoaderMaps> Unwinder<M> {
    /// Notes the runtime frames of new walked stacks (`stacks`: each with its process): the
    /// symbolizer reads what they point at while their processes run.
    pub fn note_runtime_stacks(&mut self, stacks: Vec<(u32, Box<[u64]>)>) {
        for (tgid, frames) in stacks {
            note_runtime_words(&mut self.runtime_words, tgid, &frames);
        }
    }

    /// The runtime frames (process, word, continuation's payload) of the stacks stored since
    /// the last call, for the symbolizer to read while their processes run.
    pub fn take_runtime_words(&mut self) -> HashSet<(u32, u64, u64)> {
        std::mem::take(&mut self.runtime_words)
    }

    /// The processes that started or stopped running a runtime the BPF side walks since the
    /// last call, for the symbolizer.
    pub fn take_attachments(&mut self) -> Vec<AttachmentChange> {
        std::mem::take(&mut self.attachment_changes)
    }

    /// Writes (or removes) `pid`'s entry in each runtime's BPF map, from what `attach` found.
    /// A full map, or any other failure, leaves that runtime's frames of the process unwalked
    /// (its interpreter loop shows as native frames).
    pub(super) fn write_attachments(
        &mut self,
        pid: u32,
        attachments: Vec<(RuntimeId, Attachment)>,
    ) {
        let mut now: HashSet<RuntimeId> = HashSet::new();
        for (id, attachment) in attachments {
            if let Err(error) = self.maps.insert_runtime_entry(id, pid, &attachment.entry) {
                tracing::debug!("{error}");
                continue;
            }
            now.insert(id);
            if self.attached.get(&(pid, id)) != Some(&attachment.entry) {
                self.attached.insert((pid, id), attachment.entry);
                self.attachment_changes
                    .push((pid, id, Some(attachment.process)));
            }
        }
        let gone: Vec<RuntimeId> = self
            .attached
            .keys()
            .filter(|(p, id)| *p == pid && !now.contains(id))
            .map(|&(_, id)| id)
            .collect();
        for id in gone {
            self.detach(pid, id);
        }
    }

    /// Removes `pid`'s entry from runtime `id`'s BPF map.
    pub(super) fn detach(&mut self, pid: u32, id: RuntimeId) {
        if self.attached.remove(&(pid, id)).is_none() {
            return;
        }
        self.maps.remove_runtime_entry(id, pid);
        self.attachment_changes.push((pid, id, None));
    }

    /// Forgets an exited process's runtimes.
    pub(super) fn detach_all(&mut self, pid: u32) {
        self.refused.retain(|&(p, _)| p != pid);
        let ids: Vec<RuntimeId> = self
            .attached
            .keys()
            .filter(|(p, _)| *p == pid)
            .map(|&(_, id)| id)
            .collect();
        for id in ids {
            self.detach(pid, id);
        }
    }

    /// What each runtime whose binary `pid` maps gives it, with what the process's other
    /// binaries support it with: the attachments, and the runtimes that refused it or asked
    /// to be asked again.
    pub(super) fn attachments(&self, pid: u32) -> Attachments {
        let mut result = Attachments::default();
        let Some(mappings) = self.procs.get(&pid) else {
            return result;
        };
        let mut support = Support::default();
        let mut found = Vec::new();
        for mapping in mappings {
            let Some(file) = mapping.key.and_then(|key| self.runtimes.get(&key)) else {
                continue;
            };
            support.libc = support.libc.or(file.detected.support.libc);
            if file.detected.binaries.is_empty() {
                continue;
            }
            if let Some(bias) = load_bias(&file.segments, mapping.start, mapping.offset) {
                for (runtime, binary) in &file.detected.binaries {
                    found.push((runtime.id(), Arc::clone(binary), bias));
                }
            }
        }
        // One attachment per runtime: a process mapping two interpreters of one runtime (an
        // executable and a libpython) is walked through the last one met.
        for (id, binary, bias) in found {
            match binary.attach(pid, bias, &support) {
                Attach::Attached(attachment) => {
                    result.attached.retain(|(other, _)| *other != id);
                    result.attached.push((id, attachment));
                }
                Attach::Later => result.later = true,
                Attach::Unsupported(reason) => result.refused.push((id, reason)),
            }
        }
        result
            .refused
            .retain(|(id, _)| !result.attached.iter().any(|(other, _)| other == id));
        result
    }

    /// Notes which runtimes refused `pid` now ([`Unwinder::refused`]), logging a new refusal
    /// once (at debug: a process caught before its runtime's support is mapped is refused
    /// until it is).
    pub(super) fn note_refused(&mut self, pid: u32, refused: Vec<(RuntimeId, String)>) {
        self.refused
            .retain(|&(p, id)| p != pid || refused.iter().any(|(r, _)| *r == id));
        for (id, reason) in refused {
            if self.refused.insert((pid, id)) {
                tracing::debug!("process {pid}: its {id:?} frames are not walked: {reason}");
            }
        }
    }
}

/// What the registry makes of a binary, with its executable segments; `None` when it is
/// nothing to any runtime.
pub(super) fn runtime(registry: &Registry, elf: &Elf<'_>, path: &Path) -> Option<FileRuntime> {
    let detected = registry.detect(elf, path);
    if detected.is_empty() {
        return None;
    }
    Some(FileRuntime {
        detected,
        segments: elf.executable_segments(),
    })
}

/// Adds the runtime frames of `stack` (of process `tgid`) to `words`, as (process, word,
/// continuation's payload), up to [`MAX_RUNTIME_WORDS`]. The stack's words are decoded as the
/// drain decodes them, so a frame noted here is the frame the symbolizer is later asked for.
fn note_runtime_words(words: &mut HashSet<(u32, u64, u64)>, tgid: u32, frames: &[u64]) {
    for frame in decode_user(frames) {
        if words.len() >= MAX_RUNTIME_WORDS {
            break;
        }
        if let Frame::Runtime(word, more) = frame {
            words.insert((tgid, word, more));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{any::Any, collections::HashSet, ops::Range, sync::Arc};

    use scorch_common::RuntimeId;

    use super::super::memory_maps::{built, file, process, unwinder, MemoryMaps, Op, CODE, PID};
    use super::*;
    use crate::{
        profile::FrameKind,
        runtimes::{image::Image, libc::SpecificLayout, Binary, Names, Runtime, Support},
    };

    /// A runtime double: binary 2 is its interpreter, whose code at ELF addresses
    /// [`OWNED`] its walk takes over, in processes that also map a glibc.
    #[derive(Debug)]
    struct Double;

    /// The interpreter loop's code, in the binary's addresses.
    const OWNED: Range<u64> = 0x2000..0x2100;

    impl Runtime for Double {
        fn id(&self) -> RuntimeId {
            RuntimeId::Python
        }
        fn name(&self) -> &'static str {
            "double"
        }
        fn frame_kind(&self) -> FrameKind {
            FrameKind::Python
        }
        fn procs_map(&self) -> &'static str {
            "DOUBLE_PROCS"
        }
        fn thread_pointer(&self) -> bool {
            false
        }
        fn counters(&self) -> crate::pipeline::maps::RuntimeCounters {
            unreachable!("the loader never reads counters")
        }
        fn may_be(&self, _: &object::File) -> bool {
            false
        }
        fn detect(&self, _: &Image) -> Result<Option<Arc<dyn Binary>>, String> {
            Ok(None)
        }
        fn names(&self) -> Box<dyn Names> {
            unreachable!("the loader never names frames")
        }
    }

    /// The double's binary: attached at a bias, its entry is the bias.
    #[derive(Debug)]
    struct Interpreter;

    impl Binary for Interpreter {
        fn describe(&self) -> String {
            "double 1.0".into()
        }
        fn attach(&self, _: u32, bias: u64, support: &Support) -> Attach {
            if support.libc.is_none() {
                return Attach::Unsupported("no glibc".into());
            }
            let owned = OWNED.start + bias..OWNED.end + bias;
            Attach::Attached(super::Attachment {
                owned: std::iter::once(owned).collect(),
                anonymous_code: false,
                entry: bias.to_le_bytes().to_vec(),
                process: Arc::new(bias) as Arc<dyn Any + Send + Sync>,
            })
        }
    }

    /// An unwinder with tables for binaries 1 to 3, binary 2 the double's interpreter and
    /// binary 3 a glibc.
    fn with_double() -> Unwinder<MemoryMaps> {
        let (mut unwinder, _) = unwinder(MemoryMaps::new(16, 16), 1 << 20);
        for inode in 1..=3 {
            unwinder
                .install(
                    file(inode),
                    Some(built(10, inode as u8)),
                    &mut HashSet::new(),
                )
                .unwrap();
        }
        let runtime: Arc<dyn Runtime> = Arc::new(Double);
        let binary: Arc<dyn Binary> = Arc::new(Interpreter);
        unwinder.runtimes.insert(
            file(2),
            FileRuntime {
                detected: Detected {
                    binaries: vec![(runtime, binary)],
                    support: Support::default(),
                },
                segments: vec![CODE],
            },
        );
        let layout = SpecificLayout {
            first_block: 32,
            index_bias: 0x31,
            entry_shift: 4,
            value_offset: 8,
        };
        unwinder.runtimes.insert(
            file(3),
            FileRuntime {
                detected: Detected {
                    binaries: Vec::new(),
                    support: Support { libc: Some(layout) },
                },
                segments: vec![CODE],
            },
        );
        unwinder
    }

    #[test]
    fn a_registered_runtime_is_attached_marked_and_detached_through_the_maps() {
        let mut unwinder = with_double();
        unwinder
            .scan_all(&[PID], |_| Ok(process(&[1, 2, 3])))
            .unwrap();
        // `process` maps binary 2 second, 0x10_0000 after the first, at file offset 0x1000.
        let bias: u64 = 0x7f00_0010_0000 - 0x1000;
        assert_eq!(
            unwinder.maps.runtime_entries[&(RuntimeId::Python, PID)],
            bias.to_le_bytes()
        );
        // The owned range is a mapping entry of its own, marked for the runtime's walk, with
        // its mapping's table.
        let mappings = &unwinder.maps.procs[&PID];
        let owned: Vec<_> = mappings.mappings[..mappings.count as usize]
            .iter()
            .filter(|m| m.runtime == RuntimeId::Python as u16)
            .collect();
        assert_eq!(owned.len(), 1);
        assert_eq!(
            (owned[0].start, owned[0].end),
            (OWNED.start + bias, OWNED.end + bias)
        );
        assert_eq!(owned[0].state, scorch_common::MAPPING_TABLE_LOADED);
        // The symbolizer is told once, with what naming needs.
        let changes = unwinder.take_attachments();
        assert_eq!(changes.len(), 1);
        let (pid, id, named) = &changes[0];
        assert_eq!((*pid, *id), (PID, RuntimeId::Python));
        let given = named
            .as_ref()
            .and_then(|p| p.downcast_ref::<u64>().copied());
        assert_eq!(given, Some(bias));
        // Described again, unchanged: nothing new for the symbolizer.
        unwinder
            .scan_all(&[PID], |_| Ok(process(&[1, 2, 3])))
            .unwrap();
        assert!(unwinder.take_attachments().is_empty());

        // It exits: out of the runtime's map, and the symbolizer told.
        unwinder.forget(|pid| pid != PID);
        assert!(unwinder.maps.runtime_entries.is_empty());
        assert!(unwinder
            .maps
            .ops
            .contains(&Op::RemoveRuntimeEntry(RuntimeId::Python, PID)));
        let changes = unwinder.take_attachments();
        assert!(matches!(changes[..], [(PID, RuntimeId::Python, None)]));
        assert_eq!(unwinder.stats().runtime_processes, 0);
    }

    #[test]
    fn a_process_lacking_what_a_runtime_needs_is_not_attached() {
        let mut unwinder = with_double();
        // No glibc: the double's interpreter cannot be walked there.
        unwinder.scan_all(&[PID], |_| Ok(process(&[1, 2]))).unwrap();
        assert!(unwinder.maps.runtime_entries.is_empty());
        assert!(unwinder.take_attachments().is_empty());
        let mappings = &unwinder.maps.procs[&PID];
        assert!(mappings.mappings[..mappings.count as usize]
            .iter()
            .all(|m| m.runtime == 0));
        // Counted as refused, once however often it is described.
        unwinder.scan_all(&[PID], |_| Ok(process(&[1, 2]))).unwrap();
        assert_eq!(unwinder.stats().runtime_processes_refused, 1);
        // Its glibc loads: attached from the next description on, and no longer refused.
        unwinder
            .scan_all(&[PID], |_| Ok(process(&[1, 2, 3])))
            .unwrap();
        assert_eq!(unwinder.stats().runtime_processes, 1);
        assert_eq!(unwinder.stats().runtime_processes_refused, 0);
        // Refused again (its glibc unmapped), then gone: forgotten.
        unwinder.scan_all(&[PID], |_| Ok(process(&[1, 2]))).unwrap();
        assert_eq!(unwinder.stats().runtime_processes_refused, 1);
        unwinder.forget(|pid| pid != PID);
        assert_eq!(unwinder.stats().runtime_processes_refused, 0);
    }

    #[test]
    fn only_runtime_words_of_a_stack_are_noted() {
        let mut words = HashSet::new();
        let python = scorch_common::python_frame_word(0x7f00_0000_1000, 3);
        let stack = [
            0x5555_0000_1000,
            python,
            scorch_common::WordKind::Continuation.word(5),
        ];
        note_runtime_words(&mut words, 7, &stack);
        assert_eq!(words, HashSet::from([(7, python, 5)]));

        // A HotSpot frame with its continuation; a continuation after a native word is none.
        let [java, more] = scorch_common::hotspot_frame_words(
            scorch_common::HotspotSubtype::Interpreted,
            0x7f00_0000_3000,
            4,
            0x1234,
        );
        let stack = [0x5555_0000_1000, more, java, more, 0x5555_0000_2000];
        words.clear();
        note_runtime_words(&mut words, 8, &stack);
        assert_eq!(
            words,
            HashSet::from([(8, java, scorch_common::word_payload(more))])
        );
    }
}
