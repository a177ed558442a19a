//! Hints: which binaries lose their callers, and what would fix it, for the user to read in
//! the log. Pure: it reads the merged samples and the processes' maps, nothing else.
//!
//! With frame pointers only (`--unwind fp`) the sign is a binary whose stacks are mostly a
//! frame or two long: built without frame pointers. With unwind tables the BPF walk says where
//! and why each stack stopped early ([`Aggregated::walk_stops`]); the hint names the binary
//! holding the last frame found and the reason, and short stacks that reached the bottom draw
//! none (they are whole).

use std::collections::HashMap;

use scorch_common::UnwindOutcome;

use crate::{
    pipeline::{aggregate::Aggregated, drain::Stack},
    symbolize::user::UserSymbolizer,
};

/// Share of an executable's samples with at most `SHORT_STACK_FRAMES` user frames above which
/// it was probably built without frame pointers: its stacks stop after a frame or two.
const SHORT_STACK_SHARE: f64 = 0.5;
const SHORT_STACK_FRAMES: usize = 2;
/// Share of the samples of the processes that map a binary whose walks stop in it, above
/// which it is worth a hint.
const STOP_SHARE: f64 = 0.1;
/// Fewer samples than this say nothing either way.
const HINT_MIN_SAMPLES: u64 = 20;

/// One binary that loses callers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackHint {
    /// The file (or `[anonymous code]`, `[vdso]`): what a log deduplicates on.
    pub binary: String,
    pub message: String,
}

impl std::fmt::Display for StackHint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The binaries whose callers are lost, sorted by name.
pub fn stack_hints(aggregated: &Aggregated, user: &UserSymbolizer) -> Vec<StackHint> {
    let walked = aggregated.losses.unwind.iter().any(|&n| n > 0);
    let mut hints = if walked {
        walk_stop_hints(aggregated, user)
    } else {
        frame_pointer_hints(aggregated, user)
    };
    hints.sort_by(|a, b| a.binary.cmp(&b.binary));
    hints
}

/// Frame pointers only: the executables whose user stacks are mostly short.
fn frame_pointer_hints(aggregated: &Aggregated, user: &UserSymbolizer) -> Vec<StackHint> {
    let mut per_executable: HashMap<String, (u64, u64)> = HashMap::new();
    for (stack, &count) in &aggregated.stacks {
        let Stack::Frames(frames) = &stack.user else {
            continue;
        };
        let Some(executable) = user
            .maps_at(stack.tgid, stack.maps_version)
            .and_then(|maps| maps.entries().iter().find(|e| e.is_file() && e.executable))
        else {
            continue;
        };
        let entry = per_executable
            .entry(executable.file_path().to_owned())
            .or_insert((0, 0));
        entry.0 += count;
        if frames.len() <= SHORT_STACK_FRAMES {
            entry.1 += count;
        }
    }
    per_executable
        .into_iter()
        .filter(|(_, (total, short))| {
            *total >= HINT_MIN_SAMPLES && *short as f64 > SHORT_STACK_SHARE * *total as f64
        })
        .map(|(path, (total, short))| StackHint {
            message: format!(
                "{path}: {:.0}% of its {total} samples have at most {SHORT_STACK_FRAMES} user \
                 frames; it was probably built without frame pointers (rebuild with \
                 -fno-omit-frame-pointer, or -C force-frame-pointers=yes for Rust)",
                100.0 * short as f64 / total as f64
            ),
            binary: path,
        })
        .collect()
}

/// Unwind tables: the binaries the walks stopped in early, with the reasons.
fn walk_stop_hints(aggregated: &Aggregated, user: &UserSymbolizer) -> Vec<StackHint> {
    let mut samples_of: HashMap<u32, u64> = HashMap::new();
    for (stack, &count) in &aggregated.stacks {
        if matches!(stack.user, Stack::Frames(_)) {
            *samples_of.entry(stack.tgid).or_insert(0) += count;
        }
    }
    // binary -> (samples stopped in it by reason, the processes they came from)
    let mut per_binary: HashMap<String, (HashMap<UnwindOutcome, u64>, Vec<u32>)> = HashMap::new();
    for (&(tgid, version, pc, reason), &count) in &aggregated.walk_stops {
        // The agent walks itself by frame pointers only (`unwind::loader`): not the user's
        // binary, nothing for them to fix.
        if tgid == std::process::id() {
            continue;
        }
        let binary = match user.maps_at(tgid, version).and_then(|maps| maps.find(pc)) {
            Some((_, entry)) if entry.is_file() => entry.file_path().to_owned(),
            Some((_, entry)) if entry.path.starts_with('[') => entry.path.clone(),
            Some(_) => "[anonymous code]".to_owned(),
            // The process is gone or its maps were never read: nothing to name.
            None => continue,
        };
        let (reasons, processes) = per_binary.entry(binary).or_default();
        *reasons.entry(reason).or_insert(0) += count;
        if !processes.contains(&tgid) {
            processes.push(tgid);
        }
    }
    per_binary
        .into_iter()
        .filter_map(|(binary, (reasons, processes))| {
            let stopped: u64 = reasons.values().sum();
            let total: u64 = processes.iter().filter_map(|p| samples_of.get(p)).sum();
            if stopped < HINT_MIN_SAMPLES || (stopped as f64) < STOP_SHARE * total as f64 {
                return None;
            }
            let mut reasons: Vec<(UnwindOutcome, u64)> = reasons.into_iter().collect();
            reasons.sort_by_key(|&(reason, n)| (std::cmp::Reverse(n), reason));
            let listed: Vec<String> = reasons
                .iter()
                .map(|(reason, n)| format!("{}: {n}", reason.name()))
                .collect();
            Some(StackHint {
                message: format!(
                    "{binary}: {:.0}% of the samples of the processes running it lose their \
                     callers there ({}); {}",
                    100.0 * stopped as f64 / total.max(1) as f64,
                    listed.join(", "),
                    advice(reasons[0].0)
                ),
                binary,
            })
        })
        .collect()
}

/// What the user can do about the commonest reason.
fn advice(reason: UnwindOutcome) -> &'static str {
    match reason {
        UnwindOutcome::NoRow => {
            "its unwind information (.eh_frame) leaves that code out: rebuild it with \
             -fasynchronous-unwind-tables (the default on x86_64) or with frame pointers"
        }
        UnwindOutcome::UnsupportedCfa => {
            "its unwind rules there use a register or DWARF expression the BPF unwinder does \
             not evaluate: frames above it are lost until it does (frame pointers would do)"
        }
        _ => {
            "the stack could not be read there: code without unwind information walked by a \
             frame pointer it does not keep (JIT or generated code: keep frame pointers), or a \
             stack page not present"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        pipeline::{aggregate::StackSample, drain::Stack, frames::from_pcs},
        process::maps::{MapEntry, ProcessMaps},
    };

    fn entry(start: u64, end: u64, path: &str, inode: u64) -> MapEntry {
        MapEntry {
            start,
            end,
            offset: 0,
            executable: true,
            dev: 1,
            inode,
            path: path.to_owned(),
        }
    }

    fn symbolizer() -> UserSymbolizer {
        let mut user = UserSymbolizer::new(crate::symbolize::user::SymbolizeMode::None, 0);
        user.insert_maps(
            7,
            ProcessMaps::from_entries(vec![
                entry(0x1000, 0x2000, "/usr/bin/app", 10),
                entry(0x5000, 0x6000, "/usr/lib/libfoo.so", 11),
                entry(0x9000, 0xa000, "", 0),
            ]),
        );
        user
    }

    fn aggregated(frames: &[u64], count: u64) -> Aggregated {
        let mut aggregated = Aggregated::default();
        aggregated.stacks.insert(
            StackSample {
                maps_version: 0,
                tgid: 7,
                user: Stack::Frames(from_pcs(frames, false)),
                kernel: Stack::Absent,
                thread: Default::default(),
                block: None,
            },
            count,
        );
        aggregated.losses.unwind[UnwindOutcome::Completed as usize] = count;
        aggregated
    }

    #[test]
    fn a_walk_stopping_in_a_library_names_it_and_the_reason() {
        let mut aggregated = aggregated(&[0x1100, 0x1200, 0x1300], 100);
        aggregated.stacks.insert(
            StackSample {
                maps_version: 0,
                tgid: 7,
                user: Stack::Frames(from_pcs(&[0x5100], false)),
                kernel: Stack::Absent,
                thread: Default::default(),
                block: None,
            },
            60,
        );
        aggregated
            .walk_stops
            .insert((7, 0, 0x5100, UnwindOutcome::NoRow), 50);
        aggregated
            .walk_stops
            .insert((7, 0, 0x5100, UnwindOutcome::ReadFault), 10);
        let hints = stack_hints(&aggregated, &symbolizer());
        assert_eq!(hints.len(), 1, "{hints:?}");
        assert_eq!(hints[0].binary, "/usr/lib/libfoo.so");
        let message = &hints[0].message;
        assert!(message.contains("38%"), "{message}");
        assert!(message.contains("no row: 50, read fault: 10"), "{message}");
        assert!(message.contains(".eh_frame"), "{message}");
    }

    #[test]
    fn short_stacks_that_reached_the_bottom_draw_no_hint_with_tables() {
        // Two-frame stacks that completed: whole, whatever the frame pointers.
        let aggregated = aggregated(&[0x1100, 0x1200], 100);
        assert!(stack_hints(&aggregated, &symbolizer()).is_empty());
        // The same stacks with frame pointers only: the executable is blamed.
        let mut fp = aggregated.clone();
        fp.losses.unwind = Default::default();
        let hints = stack_hints(&fp, &symbolizer());
        assert_eq!(hints.len(), 1, "{hints:?}");
        assert_eq!(hints[0].binary, "/usr/bin/app");
        assert!(hints[0].message.contains("frame pointers"));
    }

    #[test]
    fn few_or_rare_stops_say_nothing_and_anonymous_code_is_named_as_such() {
        let mut aggregated = aggregated(&[0x1100, 0x1200, 0x1300], 1000);
        // 5% of the samples: below the share.
        aggregated
            .walk_stops
            .insert((7, 0, 0x5100, UnwindOutcome::NoRow), 50);
        // Below the sample floor.
        aggregated
            .walk_stops
            .insert((7, 0, 0x1100, UnwindOutcome::UnsupportedCfa), 5);
        // JIT code.
        aggregated
            .walk_stops
            .insert((7, 0, 0x9100, UnwindOutcome::ReadFault), 400);
        // A process whose maps were never read.
        aggregated
            .walk_stops
            .insert((8, 0, 0x9100, UnwindOutcome::ReadFault), 400);
        let hints = stack_hints(&aggregated, &symbolizer());
        assert_eq!(hints.len(), 1, "{hints:?}");
        assert_eq!(hints[0].binary, "[anonymous code]");
        assert!(hints[0].message.contains("JIT"), "{}", hints[0].message);
    }
}
