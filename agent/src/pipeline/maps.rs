//! The BPF maps the sampler takes out of the loaded program and hands to the drain: the
//! contract between the two stages, so neither imports the other's internals.

use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, StackTraceMap};
use scorch_common::{Comm, Control, RunSeq, StackKey};

/// The maps of one generation, taken out of the loaded program.
pub struct GenerationMaps {
    pub counts: BpfHashMap<MapData, StackKey, u64>,
    pub stacks: StackTraceMap<MapData>,
    pub comms: BpfHashMap<MapData, u32, Comm>,
}

/// All maps the drain needs.
pub struct SamplerMaps {
    pub control: Array<MapData, Control>,
    pub run_seq: PerCpuArray<MapData, RunSeq>,
    pub losses: PerCpuArray<MapData, u64>,
    pub generations: [GenerationMaps; 2],
}
