//! The loader's side of the runtime walks (`crate::runtimes`): which binaries are a
//! runtime's (or give one what it needs, as glibc does), what a process running one gets in
//! the runtime's BPF map, and the runtime frames of new stacks, read while their processes
//! run. Every runtime comes through the registry; none is named here.

use std::{any::Any, sync::Arc};

use scorch_common::{RuntimeId, WordKind};

use super::*;
use crate::runtimes::{Attachment, Detected, Support};

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

/// A change in which runtimes a process runs, for the symbolizer: the process, the runtime,
/// and what naming its frames needs (`None`: it no longer runs it).
pub type AttachmentChange = (u32, RuntimeId, Option<Arc<dyn Any + Send + Sync>>);

impl Unwinder {
    /// Notes the runtime frames of the new stacks the BPF side reported (`stacks`: the
    /// events' process, and generation and id): the symbolizer reads them while their
    /// processes run. A stack its window's drain already took is gone from the map, and named
    /// by then.
    pub(super) fn read_runtime_stacks(&mut self, stacks: HashSet<(u32, u64)>) {
        let Some(outers) = &self.maps.user_stacks else {
            return;
        };
        // The generation's maps now, each opened at most once (`None` inside: it could not be):
        // the drain replaces a map that needs another size.
        type Opened<V> = [Option<Option<aya::maps::HashMap<MapData, i32, V>>>; 2];
        let mut long: Opened<UserStack> = [None, None];
        let mut short: Opened<ShortUserStack> = [None, None];
        for (tgid, stack) in stacks {
            let generation = (stack >> 32) as usize & 1;
            let id = stack as u32 as i32;
            // The id's class bit says which map holds it.
            let words = &mut self.runtime_words;
            if id & SHORT_USER_STACK_ID != 0 {
                let map = short[generation]
                    .get_or_insert_with(|| generation_map(&outers.short, generation as u32));
                if let Some(walked) = map.as_ref().and_then(|map| map.get(&id, 0).ok()) {
                    note_runtime_words(words, tgid, &walked);
                }
            } else {
                let map = long[generation]
                    .get_or_insert_with(|| generation_map(&outers.long, generation as u32));
                if let Some(walked) = map.as_ref().and_then(|map| map.get(&id, 0).ok()) {
                    note_runtime_words(words, tgid, &walked);
                }
            }
        }
    }

    /// The runtime frames (process, word) of the stacks stored since the last call, for the
    /// symbolizer to read while their processes run.
    pub fn take_runtime_words(&mut self) -> HashSet<(u32, u64)> {
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
            let Some(map) = self.maps.runtime_procs.iter().find(|(r, _)| *r == id) else {
                continue;
            };
            if let Err(error) = map.1.insert(pid, &attachment.entry) {
                tracing::debug!("writing process {pid}'s entry in {id:?}'s BPF map: {error}");
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
        if let Some((_, map)) = self.maps.runtime_procs.iter().find(|(r, _)| *r == id) {
            let _ = map.remove(pid);
        }
        self.attachment_changes.push((pid, id, None));
    }

    /// Forgets an exited process's runtimes.
    pub(super) fn detach_all(&mut self, pid: u32) {
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
    /// binaries support it with.
    pub(super) fn attachments(&self, pid: u32) -> Vec<(RuntimeId, Attachment)> {
        let Some(mappings) = self.procs.get(&pid) else {
            return Vec::new();
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
            if let Some(bias) = load_bias(mapping, &file.segments) {
                for (runtime, binary) in &file.detected.binaries {
                    found.push((runtime.id(), Arc::clone(binary), bias));
                }
            }
        }
        // One attachment per runtime: a process mapping two interpreters of one runtime (an
        // executable and a libpython) is walked through the last one met.
        let mut attachments: Vec<(RuntimeId, Attachment)> = Vec::new();
        for (id, binary, bias) in found {
            if let Some(attachment) = binary.attach(bias, &support) {
                attachments.retain(|(other, _)| *other != id);
                attachments.push((id, attachment));
            }
        }
        attachments
    }
}

/// What the registry makes of a binary, with its executable segments; `None` when it is
/// nothing to any runtime.
pub(super) fn runtime(registry: &Registry, bytes: &[u8], path: &Path) -> Option<FileRuntime> {
    let detected = registry.detect(bytes, path);
    if detected.is_empty() {
        return None;
    }
    Some(FileRuntime {
        detected,
        segments: executable_segments(&object::File::parse(bytes).ok()?),
    })
}

/// Adds the runtime frames of `stack` (of process `tgid`) to `words`, up to
/// [`MAX_RUNTIME_WORDS`].
fn note_runtime_words(words: &mut HashSet<(u32, u64)>, tgid: u32, stack: &dyn WalkedStack) {
    for &word in stack.frames() {
        if words.len() >= MAX_RUNTIME_WORDS {
            break;
        }
        if !matches!(
            WordKind::of(word),
            Some(WordKind::Native | WordKind::Continuation) | None
        ) {
            words.insert((tgid, word));
        }
    }
}

/// Generation `generation`'s map in the array of maps `outer`, or `None` when it cannot be
/// opened (the stacks it holds are then named at the window's end).
fn generation_map<V: aya::Pod>(
    outer: &MapData,
    generation: u32,
) -> Option<aya::maps::HashMap<MapData, i32, V>> {
    inner_map(outer.fd(), generation)
        .ok()
        .and_then(|fd| MapData::from_fd(fd).ok())
        .and_then(|data| aya::maps::HashMap::try_from(aya::maps::Map::HashMap(data)).ok())
}
