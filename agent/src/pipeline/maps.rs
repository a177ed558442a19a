//! The BPF maps the sampler takes out of the loaded program and hands to the drain: the
//! contract between the two stages, so neither imports the other's internals.

use aya::maps::{
    Array, HashMap as BpfHashMap, Map, MapData, MapError, PerCpuArray, RingBuf, StackTraceMap,
};
use scorch_common::{Control, RunSeq, SeenProcess, SeenStack, StackKey, MAX_STACK_DEPTH};

use super::stack_sizing::StackSizing;
use crate::sys::inner_maps::{
    create_inner, set_inner, InnerMapError, BPF_MAP_TYPE_HASH, BPF_MAP_TYPE_STACK_TRACE,
};

/// The maps of one generation, taken out of the loaded program.
pub struct GenerationMaps {
    pub counts: BpfHashMap<MapData, StackKey, u64>,
    pub stacks: StackTraceMap<MapData>,
    pub comms: BpfHashMap<MapData, u32, SeenProcess>,
    /// The ids and hashes of the user stacks the program walked with unwind tables
    /// (`--unwind auto`) and sent through `WALKED_STACKS` in this generation's window.
    pub seen_stacks: BpfHashMap<MapData, i32, SeenStack>,
}

/// Entries of a generation's two stack maps: the distinct stacks one window stored, or the
/// most each map holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StackEntries {
    /// `STACKS_g` (`bpf_get_stackid`): kernel stacks, and user stacks under `--unwind fp`.
    pub stacks: u32,
    /// `SEEN_STACKS_g`: the user stacks the program walked with tables.
    pub user_stacks: u32,
}

impl StackEntries {
    /// The larger of two, map by map.
    pub fn max(self, other: StackEntries) -> StackEntries {
        StackEntries {
            stacks: self.stacks.max(other.stacks),
            user_stacks: self.user_stacks.max(other.user_stacks),
        }
    }
}

/// A runtime's per-CPU counter array, as the runtime names it: what the sampler takes from
/// the object and the drain reads, without knowing the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeCounters {
    /// The runtime (`python`): the metrics' label.
    pub runtime: &'static str,
    /// Its BPF map: `names.len()` counters per run (`scorch_common::COUNTER_RUNS`).
    pub map: &'static str,
    /// Its counters in the map's order: the first the frames its walk emitted, the rest the
    /// reasons a chain stopped early.
    pub names: &'static [&'static str],
}

/// All maps the drain needs.
pub struct SamplerMaps {
    pub control: Array<MapData, Control>,
    pub run_seq: PerCpuArray<MapData, RunSeq>,
    pub losses: PerCpuArray<MapData, u64>,
    /// How walks with unwind tables ended, per `scorch_common::UnwindOutcome`; cumulative.
    pub unwind_outcomes: PerCpuArray<MapData, u64>,
    /// Each walked runtime's counters (its frames, and why its chains stopped), with what
    /// names them; cumulative.
    pub runtime_counts: Vec<(RuntimeCounters, PerCpuArray<MapData, u64>)>,
    pub generations: [GenerationMaps; 2],
    /// `STACKS`, the array of maps holding each generation's stack-trace map.
    pub stacks_outer: MapData,
    /// How many entries each generation's stack-trace map has, and will have.
    pub stack_sizing: StackSizing,
    /// `SEEN_STACKS`, the array of maps holding each generation's seen-stack map.
    pub seen_stacks_outer: MapData,
    /// How many entries each generation's seen-stack map has, and will have.
    pub seen_stack_sizing: StackSizing,
    /// `WALKED_STACKS`: the walked user stacks, each sent once in the window it is new to.
    pub walked_stacks: RingBuf<MapData>,
}

/// Why a stack map could not be created or put in place.
#[derive(Debug, thiserror::Error)]
pub enum StackMapError {
    #[error("creating {map} map of {entries} entries: {source}")]
    Create {
        map: &'static str,
        entries: u32,
        source: InnerMapError,
    },
    #[error("putting generation {generation}'s new map in {map}: {source}")]
    Place {
        map: &'static str,
        generation: u32,
        source: std::io::Error,
    },
    #[error("reading the new {map} map: {source}")]
    Wrap { map: &'static str, source: MapError },
}

/// Creates generation `generation`'s stack-trace map with `entries` entries and puts it in
/// `STACKS` (`outer`), where the program finds it from its next sample of that generation on:
/// the caller does this while the generation is idle, so no stack is stored in the map it
/// replaces.
pub fn new_stack_map(
    outer: &MapData,
    generation: u32,
    entries: u32,
) -> Result<StackTraceMap<MapData>, StackMapError> {
    let map = "STACKS";
    let data = new_inner(
        map,
        outer,
        generation,
        BPF_MAP_TYPE_STACK_TRACE,
        MAX_STACK_DEPTH * 8,
        entries,
        0,
    )?;
    StackTraceMap::try_from(Map::StackTraceMap(data))
        .map_err(|source| StackMapError::Wrap { map, source })
}

/// The same for generation `generation`'s seen-stack map, in `SEEN_STACKS` (`outer`).
pub fn new_seen_stack_map(
    outer: &MapData,
    generation: u32,
    entries: u32,
) -> Result<BpfHashMap<MapData, i32, SeenStack>, StackMapError> {
    let map = "SEEN_STACKS";
    let data = new_inner(
        map,
        outer,
        generation,
        BPF_MAP_TYPE_HASH,
        std::mem::size_of::<SeenStack>(),
        entries,
        // Preallocated, as the program's template (`SeenStackMap`) declares.
        0,
    )?;
    BpfHashMap::try_from(Map::HashMap(data)).map_err(|source| StackMapError::Wrap { map, source })
}

fn new_inner(
    map: &'static str,
    outer: &MapData,
    generation: u32,
    map_type: u32,
    value_size: usize,
    entries: u32,
    flags: u32,
) -> Result<MapData, StackMapError> {
    let data = create_inner(
        map_type,
        value_size as u32,
        entries,
        flags,
        &format!("scorch_{}_{generation}", map.to_ascii_lowercase()),
    )
    .map_err(|source| StackMapError::Create {
        map,
        entries,
        source,
    })?;
    set_inner(outer.fd(), generation, data.fd()).map_err(|source| StackMapError::Place {
        map,
        generation,
        source,
    })?;
    Ok(data)
}

/// The maps through which the agent gives the BPF unwinder its tables and process mappings
/// (see `unwind::loader`).
pub struct UnwindMaps {
    /// The row pools' outer array (`BPF_MAP_TYPE_ARRAY_OF_MAPS`): the agent creates each pool
    /// and puts it here.
    pub rows: MapData,
    /// Rows all pools may hold together: the ceiling.
    pub pool_rows: u32,
    /// The process map's outer array (`BPF_MAP_TYPE_ARRAY_OF_MAPS`, one slot): the agent
    /// creates the map and replaces it with a larger one when it fills.
    pub procs: MapData,
    /// Processes the process map may grow to hold: the ceiling.
    pub processes: u32,
    /// Unknown processes and pcs, from the program.
    pub events: RingBuf<MapData>,
    /// `ROW_EPOCH`: bumped whenever rows are freed, so the program's per-CPU cache of found
    /// rows drops every row it holds.
    pub row_epoch: Array<MapData, u64>,
    /// Each walked runtime's map of processes running it (`PYTHON_PROCS`), written with
    /// the value the runtime lays out.
    pub runtime_procs: Vec<(scorch_common::RuntimeId, crate::sys::inner_maps::BytesMap)>,
}
