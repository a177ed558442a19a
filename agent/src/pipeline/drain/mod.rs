//! Drain: read and reset the sampler's maps once per window, without losing or double-counting
//! a sample at the boundary.
//!
//! The BPF program writes to one of two map generations, chosen by `CONTROL.generation`. To
//! drain, the agent flips the generation, waits until no run of the program can still be
//! writing to the old one, then reads and empties the old generation at leisure:
//!
//! 1. write `generation = 1 - g`;
//! 2. for every CPU, read its `RUN_SEQ`; an odd value means a run is in flight, possibly one
//!    that read `g` before the flip. Wait until that CPU's value changes. A run that starts
//!    after step 2 read the CPU's value reads the new generation, because the program bumps its
//!    sequence (a full barrier) before it reads the generation;
//! 3. read `COUNTS_g`, the stacks it references in `STACKS_g`, and `COMMS_g`; delete every entry.
//!
//! The user stacks the program walks itself reach the agent otherwise: each stack new to a
//! window is sent once through the `WALKED_STACKS` ring buffer, tagged with its generation,
//! and `SEEN_STACKS_g` records that it was sent. The ring is read every 200 ms, and when the
//! program wakes the agent (`Drainer::read_walked`); at step 3 it is read to its end, which
//! holds every record of the quiescent generation, and that window's stacks are taken.
//!
//! The hash maps (`COUNTS_g`, `COMMS_g`, `SEEN_STACKS_g`) are read and emptied with
//! `BPF_MAP_LOOKUP_AND_DELETE_BATCH` (`sys::bpf_batch`), a few calls per map rather than three
//! per entry; a kernel without batch operations (before 5.6) gets the per-entry calls, decided
//! on the first refusal and kept. `STACKS_g` has no batch operations: its referenced stacks
//! are read one by one, and the ids read are the ids deleted.
//!
//! The counters (`LOSSES`, `UNWIND_OUTCOMES_COUNT`, each runtime's, as `PYTHON_COUNTS_MAP`)
//! are per CPU, with a
//! run of counters per generation (`COUNTER_RUNS`): the old generation's run is taken and
//! zeroed with its maps, so a window reports exactly the counts of its own samples. The
//! off-CPU program's walks count in a run of their own, cumulative; a window reports its
//! difference.
//!
//! This file holds the protocol: the flip, the wait and every read and write of a map. What the
//! entries read mean (stack ids and their sentinels, walked stacks, counter runs, the off-CPU
//! differences) is decoded in `decode`, without the kernel; the window handed on is in
//! `window`.

mod decode;
mod walked;
mod window;

use std::time::{Duration, Instant, SystemTime};

use aya::{
    maps::{HashMap as BpfHashMap, MapData, MapError, PerCpuArray, PerCpuValues, StackTraceMap},
    Pod,
};

use crate::{
    pipeline::{
        maps::{new_seen_stack_map, new_stack_map, SamplerMaps, StackEntries},
        stack_sizing::StackSizing,
    },
    sys::bpf_batch::{self, BatchError},
};
use decode::{
    add_off_cpu_gain, counter_index, decode_processes, decode_samples, referenced_traces,
    stack_map_collisions, sum_cpus, user_stack_losses, walks_user_stacks, WindowStacks,
};
use scorch_common::{
    Control, Loss, SeenProcess, SeenStack, StackKey, OFF_CPU_COUNTER_RUN, UNWIND_OUTCOMES,
};
use walked::WalkedStacks;

pub use decode::comm_name;
pub use window::{
    Losses, Origin, RawSample, RawWindow, RuntimeCounts, Stack, StackMapFill, ThreadTag, WalkStop,
    TRUNCATED_STACKS,
};

/// Longest a single BPF run may take before the drain gives up waiting on it. Runs take
/// microseconds; this only guards against a wedged CPU stalling the daemon.
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("{action} BPF map {map}: {source}")]
    Map {
        action: &'static str,
        map: &'static str,
        source: MapError,
    },
    #[error("{action} BPF map {map}: {source}")]
    Batch {
        action: &'static str,
        map: &'static str,
        source: BatchError,
    },
    #[error("CPU {cpu} stayed inside the BPF program for over {QUIESCE_TIMEOUT:?}")]
    NotQuiescent { cpu: usize },
    #[error("zeroing BPF map {map}: the possible CPUs: {source}")]
    Cpus {
        map: &'static str,
        source: std::io::Error,
    },
}

/// Reads windows out of the sampler's maps.
pub struct Drainer {
    maps: SamplerMaps,
    control: Control,
    window_start: SystemTime,
    /// The off-CPU walks' cumulative unwind outcome counters at the previous drain.
    previous_off_cpu_unwind: [u64; UNWIND_OUTCOMES as usize],
    /// The off-CPU walks' cumulative counters of each runtime (`maps.runtime_counts`' order)
    /// at the previous drain.
    previous_off_cpu_runtimes: Vec<Vec<u64>>,
    /// Whether hash maps are read in batches; false once the kernel refused a batch call
    /// (before 5.6), and then for good: the answer is the kernel's, not the window's.
    batched: bool,
    /// The walked stacks read from `WALKED_STACKS`, until their windows are drained.
    walked: WalkedStacks,
}

fn map_err(action: &'static str, map: &'static str) -> impl FnOnce(MapError) -> DrainError {
    move |source| DrainError::Map {
        action,
        map,
        source,
    }
}

impl Drainer {
    /// Takes over the maps; `control` is the configuration the sampler was started with.
    pub fn new(maps: SamplerMaps, control: Control) -> Self {
        let previous_off_cpu_runtimes = maps
            .runtime_counts
            .iter()
            .map(|(counters, _)| vec![0; counters.names.len()])
            .collect();
        Drainer {
            maps,
            control,
            window_start: SystemTime::now(),
            previous_off_cpu_unwind: [0; UNWIND_OUTCOMES as usize],
            previous_off_cpu_runtimes,
            batched: true,
            walked: WalkedStacks::default(),
        }
    }

    /// Reads the walked stacks the program sent since the last read. Call it when
    /// [`Drainer::walked_fd`] is readable, and every 200 ms: the ring holds a burst of new
    /// stacks only until it fills.
    pub fn read_walked(&mut self) {
        while let Some(item) = self.maps.walked_stacks.next() {
            if let Err(error) = self.walked.add_bytes(&item) {
                // The program writes whole records: this is a layout mismatch, said once.
                if self.walked.refused == 1 {
                    tracing::warn!("{error}");
                }
            }
        }
    }

    /// The stacks with a runtime's frames read since the last call, with their processes:
    /// the unwinder has what they point at read while the processes run.
    pub fn take_runtime_stacks(&mut self) -> Vec<(u32, Box<[u64]>)> {
        self.walked.take_runtime()
    }

    /// A descriptor of `WALKED_STACKS`, readable when the program woke the agent: the ring is
    /// filling.
    pub fn walked_fd(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        std::os::fd::AsFd::as_fd(&self.maps.walked_stacks).try_clone_to_owned()
    }

    /// Processes sampled so far in the current window, from the comm map the program fills the
    /// first time it sees each one. Lets the agent read a new process's maps right away, so
    /// a process that exits before the window ends is still named.
    pub fn active_pids(&mut self) -> Result<Vec<u32>, DrainError> {
        let current = self.control.generation as usize & 1;
        let comms = &self.maps.generations[current].comms;
        if self.batched {
            let mut pids = Vec::new();
            match bpf_batch::lookup(comms, batch_capacity(comms), |tgid, _| pids.push(tgid)) {
                Ok(()) => return Ok(pids),
                Err(BatchError::Unsupported { source, .. }) => {
                    stop_batching(&mut self.batched, &source)
                }
                Err(source) => return Err(batch_err("listing", "COMMS")(source)),
            }
        }
        comms
            .keys()
            .collect::<Result<_, _>>()
            .map_err(map_err("listing", "COMMS"))
    }

    /// Ends the current window and returns what it sampled.
    pub fn drain_window(&mut self) -> Result<RawWindow, DrainError> {
        let old = self.control.generation as usize & 1;
        self.control.generation = (old ^ 1) as u32;
        self.maps
            .control
            .set(0, self.control, 0)
            .map_err(map_err("writing", "CONTROL"))?;
        let end = SystemTime::now();
        self.wait_quiescent()?;

        // The generation is quiescent: each hash map is read and emptied in the same pass.
        let mut counts: Vec<(StackKey, u64)> = Vec::new();
        take_all(
            &mut self.batched,
            &mut self.maps.generations[old].counts,
            "COUNTS",
            |key, count| counts.push((key, count)),
        )?;
        let walked = walks_user_stacks(&self.control);
        let mut stacks = WindowStacks::default();
        let mut walked_stored = StackEntries::default();
        if walked {
            // Every record of the quiescent generation is in the ring by now.
            self.read_walked();
            for (id, stack) in self.walked.take(old) {
                stacks.add_walked(id, &stack);
            }
            take_all(
                &mut self.batched,
                &mut self.maps.generations[old].seen_stacks,
                "SEEN_STACKS",
                |_, _: SeenStack| walked_stored.user_stacks += 1,
            )?;
        }
        let batched = &mut self.batched;
        let generation = &mut self.maps.generations[old];
        for id in referenced_traces(&counts, &self.control) {
            if let Some(pcs) = read_trace(&generation.stacks, id)? {
                stacks.add_trace(id, pcs);
            }
        }
        let decoded = decode_samples(&counts, &stacks, &self.control);
        let mut losses = Losses {
            truncated_stacks: decoded.truncated_stacks,
            ..Losses::default()
        };
        let mut seen = Vec::new();
        take_all(
            batched,
            &mut generation.comms,
            "COMMS",
            |tgid, process: SeenProcess| seen.push((tgid, process)),
        )?;
        let (comms, origins) = decode_processes(seen);

        take_run(&mut self.maps.losses, "LOSSES", old, &mut losses.by_kind)?;

        // Stack-trace maps have no batch operations. Every stack the program stored is one a
        // count key references, and was resolved above, unless the key itself was dropped
        // (the counts map was full): only then are the stored ids listed again. A stack left
        // behind would hold its bucket, and the next window's stacks hashing there would be
        // lost as collisions.
        // The map is sized for the stacks its windows store: one that needs another size is
        // replaced now, while its generation is idle, and the new one starts empty.
        let capacity = self.maps.stack_sizing.entries(old);
        let collisions = stack_map_collisions(&losses.by_kind, &self.control);
        let entries = self
            .maps
            .stack_sizing
            .after_window(old, stacks.traces() as u32, collisions);
        let replaced = entries != capacity
            && match new_stack_map(&self.maps.stacks_outer, old as u32, entries) {
                Ok(map) => {
                    tracing::debug!(
                        "stack-trace map {old}: {} stacks stored, {collisions} lost to \
                         collisions; {capacity} entries now {entries}",
                        stacks.traces()
                    );
                    self.maps.generations[old].stacks = map;
                    true
                }
                Err(error) => {
                    tracing::warn!("{error}; its map keeps {capacity} entries");
                    self.maps.stack_sizing.keep(old, capacity);
                    false
                }
            };
        if !replaced {
            let stacks_map = &mut self.maps.generations[old].stacks;
            if losses.by_kind[Loss::CountsMapFull as usize] > 0 {
                let stack_ids: Vec<u32> = stacks_map
                    .stack_ids()
                    .collect::<Result<_, _>>()
                    .map_err(map_err("listing", "STACKS"))?;
                for id in stack_ids {
                    remove_ok(stacks_map.remove(&id)).map_err(map_err("clearing", "STACKS"))?;
                }
            } else {
                for id in stacks.trace_ids() {
                    remove_ok(stacks_map.remove(&id)).map_err(map_err("clearing", "STACKS"))?;
                }
            }
        }

        // The seen-stack map, emptied by the take above, likewise; a stack that found it full
        // is lost as a `user stack error`. None under `--unwind fp`: the program walks no user
        // stack itself.
        let mut user_capacity = StackEntries::default();
        if walked {
            let errors = losses.by_kind[Loss::UserStackError as usize];
            let maps = &mut self.maps;
            user_capacity.user_stacks = resize_seen_stacks(
                &maps.seen_stacks_outer,
                &mut maps.seen_stack_sizing,
                &mut maps.generations[old].seen_stacks,
                old,
                walked_stored.user_stacks,
                errors,
            );
        }

        take_walk_counts(
            &mut self.maps.unwind_outcomes,
            "UNWIND_OUTCOMES_COUNT",
            old,
            &mut losses.unwind,
            &mut self.previous_off_cpu_unwind,
        )?;
        for ((counters, map), previous) in self
            .maps
            .runtime_counts
            .iter_mut()
            .zip(&mut self.previous_off_cpu_runtimes)
        {
            let mut counts = vec![0; counters.names.len()];
            take_walk_counts(map, counters.map, old, &mut counts, previous)?;
            losses.runtimes.push(RuntimeCounts {
                runtime: counters.runtime,
                names: counters.names,
                counts,
            });
        }

        let stack_maps = StackMapFill {
            used: StackEntries {
                stacks: stacks.traces() as u32,
                ..walked_stored
            },
            capacity: StackEntries {
                stacks: capacity,
                ..user_capacity
            },
        };
        let start = std::mem::replace(&mut self.window_start, end);
        Ok(RawWindow {
            start,
            end,
            samples: decoded.samples,
            walk_stops: decoded.walk_stops,
            comms,
            origins,
            losses,
            stack_maps,
        })
    }

    /// Waits until no CPU can still be running the program against the old generation.
    fn wait_quiescent(&self) -> Result<(), DrainError> {
        let snapshot = self
            .maps
            .run_seq
            .get(&0, 0)
            .map_err(map_err("reading", "RUN_SEQ"))?;
        let deadline = Instant::now() + QUIESCE_TIMEOUT;
        for (cpu, before) in snapshot.iter().enumerate() {
            if before.seq % 2 == 0 {
                continue;
            }
            loop {
                let now = self
                    .maps
                    .run_seq
                    .get(&0, 0)
                    .map_err(map_err("reading", "RUN_SEQ"))?;
                if now[cpu].seq != before.seq {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(DrainError::NotQuiescent { cpu });
                }
                std::thread::yield_now();
            }
        }
        Ok(())
    }
}

/// After a window recorded `stored` stacks in generation `generation`'s seen-stack map (`map`,
/// in `SEEN_STACKS`, `outer`) and lost `errors` user stacks to errors: replaces the map when
/// `sizing` wants another size for it. A map the window filled takes the errors as its own.
/// Returns the entries the map had in the window.
fn resize_seen_stacks(
    outer: &MapData,
    sizing: &mut StackSizing,
    map: &mut BpfHashMap<MapData, i32, SeenStack>,
    generation: usize,
    stored: u32,
    errors: u64,
) -> u32 {
    let capacity = sizing.entries(generation);
    let lost = user_stack_losses(stored, capacity, errors);
    let entries = sizing.after_window(generation, stored, lost);
    if entries != capacity {
        match new_seen_stack_map(outer, generation as u32, entries) {
            Ok(new) => *map = new,
            Err(error) => {
                tracing::warn!("{error}; its map keeps {capacity} entries");
                sizing.keep(generation, capacity);
            }
        }
    }
    capacity
}

/// Run `run` of a per-CPU counter array (`COUNTER_RUNS`) into `totals`, each counter summed
/// over the CPUs; the array holds `totals.len()` counters per run.
fn sum_run(
    map: &PerCpuArray<MapData, u64>,
    name: &'static str,
    run: usize,
    totals: &mut [u64],
) -> Result<(), DrainError> {
    let kinds = totals.len();
    for (i, total) in totals.iter_mut().enumerate() {
        let per_cpu = map
            .get(&counter_index(run, kinds, i), 0)
            .map_err(map_err("reading", name))?;
        *total = sum_cpus(&per_cpu);
    }
    Ok(())
}

/// Takes run `run` of a per-CPU counter array into `totals`: each counter summed over the CPUs,
/// then zeroed. Only for a quiescent generation's run, which no program writes: nothing
/// counted between the read and the write can be lost.
fn take_run(
    map: &mut PerCpuArray<MapData, u64>,
    name: &'static str,
    run: usize,
    totals: &mut [u64],
) -> Result<(), DrainError> {
    let kinds = totals.len();
    for (i, total) in totals.iter_mut().enumerate() {
        let index = counter_index(run, kinds, i);
        let per_cpu = map.get(&index, 0).map_err(map_err("reading", name))?;
        *total = sum_cpus(&per_cpu);
        // Most counters stay at zero: only those that moved are written.
        if *total != 0 {
            let zeros = PerCpuValues::try_from(vec![0u64; per_cpu.len()])
                .map_err(|source| DrainError::Cpus { map: name, source })?;
            map.set(index, zeros, 0).map_err(map_err("zeroing", name))?;
        }
    }
    Ok(())
}

/// A window's counts from a walk counter array into `counts`: generation `generation`'s run,
/// taken, plus what the off-CPU walks' cumulative run gained since `previous`.
fn take_walk_counts(
    map: &mut PerCpuArray<MapData, u64>,
    name: &'static str,
    generation: usize,
    counts: &mut [u64],
    previous: &mut [u64],
) -> Result<(), DrainError> {
    take_run(map, name, generation, counts)?;
    let mut off_cpu = vec![0; counts.len()];
    sum_run(map, name, OFF_CPU_COUNTER_RUN as usize, &mut off_cpu)?;
    add_off_cpu_gain(counts, &off_cpu, previous);
    Ok(())
}

fn batch_err(action: &'static str, map: &'static str) -> impl FnOnce(BatchError) -> DrainError {
    move |source| DrainError::Batch {
        action,
        map,
        source,
    }
}

/// Entries of `map` one batch call may return.
fn batch_capacity<K: Pod, V: Pod>(_: &BpfHashMap<MapData, K, V>) -> usize {
    let entry = std::mem::size_of::<K>() + std::mem::size_of::<V>();
    bpf_batch::capacity_for(bpf_batch::BATCH_BYTES, entry)
}

fn stop_batching(batched: &mut bool, error: &std::io::Error) {
    tracing::info!("BPF map batch operations unavailable ({error}): reading maps entry by entry");
    *batched = false;
}

/// Hands every entry of `map` to `each` and empties it, in batches while `batched` holds;
/// a refusal of the first batch (nothing was taken) turns batching off and falls back to the
/// per-entry calls, for this map and every later one.
fn take_all<K: Pod, V: Pod>(
    batched: &mut bool,
    map: &mut BpfHashMap<MapData, K, V>,
    name: &'static str,
    mut each: impl FnMut(K, V),
) -> Result<(), DrainError> {
    if *batched {
        let capacity = batch_capacity(map);
        match bpf_batch::take(map, capacity, &mut each) {
            Ok(()) => return Ok(()),
            Err(BatchError::Unsupported { source, .. }) => stop_batching(batched, &source),
            Err(source) => return Err(batch_err("draining", name)(source)),
        }
    }
    // Keys are collected first: deleting while iterating a BPF hash map restarts or skips
    // the walk.
    let mut keys = Vec::new();
    for entry in map.iter() {
        let (key, value) = entry.map_err(map_err("reading", name))?;
        keys.push(key);
        each(key, value);
    }
    for key in &keys {
        remove_ok(map.remove(key)).map_err(map_err("clearing", name))?;
    }
    Ok(())
}

/// A key deleted by someone else in between is as good as deleted.
fn remove_ok(result: Result<(), MapError>) -> Result<(), MapError> {
    match result {
        Err(MapError::KeyNotFound) => Ok(()),
        other => other,
    }
}

/// The pcs of stack `id` of the kernel's stack-trace map; `None` when the map holds none.
fn read_trace(map: &StackTraceMap<MapData>, id: u32) -> Result<Option<Vec<u64>>, DrainError> {
    match map.get(&id, 0) {
        Ok(trace) => Ok(Some(trace.frames().iter().map(|f| f.ip).collect())),
        // Cannot happen while the generation is quiescent, but a missing stack must not
        // abort the window: its samples keep it as lost.
        Err(MapError::KeyNotFound) => Ok(None),
        Err(source) => Err(DrainError::Map {
            action: "reading",
            map: "STACKS",
            source,
        }),
    }
}
