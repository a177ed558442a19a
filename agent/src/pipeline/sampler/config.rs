//! What the sampler is asked for ([`SamplerConfig`]), and the sizes of the BPF maps that
//! follow from it: the counts and comm maps hold a window's samples, the unwinder's maps its
//! processes and rows, the off-CPU maps the threads alive. Worked out before the program loads,
//! since the kernel allocates a preallocated map whole at load.

use scorch_common::{RuntimeId, MAX_COMMS, MAX_COUNT_KEYS};

use crate::pipeline::{
    maps::RuntimeCounters, off_cpu::OffCpuSettings, stack_sizing::DEFAULT_MAX_STACK_ENTRIES,
};

/// What to sample.
#[derive(Debug, Clone)]
pub struct SamplerConfig {
    /// Samples per second per CPU.
    pub frequency_hz: u64,
    /// When non-empty, only these processes are sampled.
    pub pids: Vec<u32>,
    /// Keep samples of the idle task.
    pub include_idle: bool,
    /// How often the maps are drained: sizes the stack maps.
    pub window_secs: u64,
    /// Start with an empty deny list that
    /// [`Sampler::exclude_pid`](super::Sampler::exclude_pid) fills (the daemon, when
    /// relabelling can drop processes). Ignored when `pids` is set.
    pub deny_list: bool,
    /// How user stacks are walked.
    pub unwind: UnwindMode,
    /// How much the unwinder's maps hold (with [`UnwindMode::Auto`]).
    pub unwind_capacity: UnwindCapacity,
    /// The most entries each stack-trace map grows to (`--stack-map-entries`).
    pub stack_entries_ceiling: u32,
    /// Off-CPU time too (`--off-cpu`): the `sched_switch` program is attached.
    pub off_cpu: Option<OffCpuSettings>,
    /// Keep threads apart by id, not only by name (`thread-ids`): the counts map's keys carry
    /// the thread id.
    pub thread_ids: bool,
    /// Record the file each process exec'd (`EXEC_FILES`), which labels a process the daemon
    /// read too late; `record` labels none, and sizes the map to one entry.
    pub exec_files: bool,
    /// The runtimes whose frames the BPF side walks (the registry's), each with its BPF map
    /// of processes: sized to the processes the unwinder tracks, and handed to the loader.
    pub runtime_maps: Vec<RuntimeMap>,
    /// The walked runtimes' counter arrays (the registry's), which the drain reads.
    pub runtime_counters: Vec<RuntimeCounters>,
}

/// A runtime's BPF side, as the sampler loads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeMap {
    pub id: RuntimeId,
    /// Its BPF map of processes.
    pub procs: &'static str,
    /// Whether its walk reads the thread pointer (`Runtime::thread_pointer`).
    pub thread_pointer: bool,
}

/// Bytes of an unwind row.
const ROW_BYTES: u64 = std::mem::size_of::<scorch_common::UnwindRow>() as u64;

/// How much the unwinder's maps hold. The process map is fixed when the program loads (the
/// kernel allocates and zeroes a preallocated hash map up front); the row pools are created as
/// tables need them, up to `pool_rows`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnwindCapacity {
    /// Rows all row pools (`UNWIND_ROWS`) may hold together, 8 bytes each: the ceiling.
    pub pool_rows: u32,
    /// Processes whose mappings the program holds at once (`UNWIND_PROCS`, 2.5 KiB each).
    pub processes: u32,
}

impl UnwindCapacity {
    /// The daemon's: the whole machine, for good (up to 64 MiB of rows, 8192 processes).
    pub const DAEMON: UnwindCapacity = UnwindCapacity {
        pool_rows: scorch_common::UNWIND_POOL_ROWS,
        processes: scorch_common::MAX_UNWIND_PROCS,
    };

    /// A one-shot capture's: the daemon's ceiling on rows (pools cost only what the tables
    /// sampled take), and room for the processes alive now twice over. `pids` (`--pid`)
    /// bounds the processes instead; `running` is how many processes exist when it starts.
    pub fn capture(pids: &[u32], running: usize) -> UnwindCapacity {
        let wanted = if pids.is_empty() {
            running.saturating_mul(2).max(1024)
        } else {
            pids.len().max(16)
        };
        UnwindCapacity {
            pool_rows: scorch_common::UNWIND_POOL_ROWS,
            processes: u32::try_from(wanted)
                .unwrap_or(u32::MAX)
                .min(scorch_common::MAX_UNWIND_PROCS),
        }
    }

    /// The ceiling on the row pools, in MiB.
    pub fn pool_mib(self) -> u32 {
        ((u64::from(self.pool_rows) * ROW_BYTES) >> 20) as u32
    }

    /// This capacity, with a ceiling of `mib` MiB on the row pools (`--unwind-pool-mib`).
    pub fn with_pool_mib(self, mib: u32) -> UnwindCapacity {
        UnwindCapacity {
            pool_rows: ((u64::from(mib) << 20) / ROW_BYTES).min(u64::from(u32::MAX)) as u32,
            ..self
        }
    }

    /// This capacity, holding `processes` processes when given (`--unwind-processes`).
    pub fn with_processes(self, processes: Option<u32>) -> UnwindCapacity {
        UnwindCapacity {
            processes: processes.unwrap_or(self.processes),
            ..self
        }
    }
}

/// How the program walks user stacks (`--unwind`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum UnwindMode {
    /// Unwind tables from `.eh_frame` where the agent has loaded them, frame pointers
    /// elsewhere.
    #[default]
    Auto,
    /// Frame pointers only, through `bpf_get_stackid`: scorch before unwind tables.
    Fp,
}

impl Default for SamplerConfig {
    /// scorch's defaults: 19 Hz (a prime), every process, 10 s windows.
    fn default() -> Self {
        SamplerConfig {
            frequency_hz: 19,
            pids: Vec::new(),
            include_idle: false,
            window_secs: 10,
            deny_list: false,
            unwind: UnwindMode::Auto,
            unwind_capacity: UnwindCapacity::DAEMON,
            stack_entries_ceiling: DEFAULT_MAX_STACK_ENTRIES,
            off_cpu: None,
            thread_ids: false,
            exec_files: true,
            runtime_maps: Vec::new(),
            runtime_counters: Vec::new(),
        }
    }
}

/// Entries of the off-CPU program's thread map and user-stack map, and its ring buffer's
/// bytes: one of each (and a page) when off-CPU time is not recorded, since the kernel
/// allocates preallocated maps whole; otherwise room for twice the threads alive now.
pub(super) fn off_cpu_map_sizes(enabled: bool) -> (u32, u32, u32) {
    if !enabled {
        return (1, 1, 4096);
    }
    let threads = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| threads_in_loadavg(&text))
        .unwrap_or(scorch_common::MAX_OFF_CPU_THREADS / 4);
    (
        threads
            .saturating_mul(2)
            .clamp(1024, scorch_common::MAX_OFF_CPU_THREADS),
        scorch_common::OFF_CPU_USER_STACKS,
        4 << 20,
    )
}

/// Bytes of the `WALKED_STACKS` ring buffer: a second of samples that are each a new stack
/// of the deepest kind, a power of two from 256 KiB to 16 MiB. The agent reads it every
/// 200 ms, and at once when the program finds it a quarter full; a record takes what its
/// frames take, and most stacks repeat. One page without the unwinder, which sends nothing.
pub(super) fn walked_ring_bytes(cpus: u64, frequency_hz: u64, tables: bool) -> u32 {
    if !tables {
        return 4096;
    }
    let record = std::mem::size_of::<scorch_common::UserStack>() as u64;
    cpus.saturating_mul(frequency_hz)
        .saturating_mul(record)
        .checked_next_power_of_two()
        .unwrap_or(u64::MAX)
        .clamp(256 << 10, 16 << 20) as u32
}

/// The threads alive, from `/proc/loadavg`'s fourth field (`running/total`).
pub(super) fn threads_in_loadavg(text: &str) -> Option<u32> {
    text.split_whitespace()
        .nth(3)?
        .split('/')
        .nth(1)?
        .parse()
        .ok()
}

/// The samples one window can take: every CPU at the frequency for the window's length.
pub(super) fn samples_per_window(cpus: u64, config: &SamplerConfig) -> u64 {
    cpus * config.frequency_hz * config.window_secs.max(1)
}

/// Counts-map and comm-map sizes: each holds at most one entry per sample of a window (the
/// thread in the counts map's key splits a stack into at most one key per sample too), so
/// twice a window's samples, at least 4096 (a late drain, a burst of new processes), at most
/// the object's [`MAX_COUNT_KEYS`] and [`MAX_COMMS`]. Both are preallocated hash maps (the
/// program inserts into them from the perf NMI, where an allocation can fail and would lose
/// the sample), whose every entry the kernel allocates and
/// charges up front; and the agent lists the comm map's keys every discovery tick, a walk over
/// every bucket. Sized for 256 CPUs, they made a small host's `scorch record` allocate and scan
/// a hundred times the buckets its few hundred samples a window need.
pub(super) fn per_window_map_entries(cpus: u64, config: &SamplerConfig) -> (u32, u32) {
    let wanted = (samples_per_window(cpus, config) * 2)
        .next_power_of_two()
        .max(4096);
    (
        wanted.min(u64::from(MAX_COUNT_KEYS)) as u32,
        wanted.min(u64::from(MAX_COMMS)) as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walked_ring_holds_a_second_of_new_stacks_within_bounds() {
        assert_eq!(walked_ring_bytes(2, 19, false), 4096);
        // 2 CPUs at 19 Hz: 38 stacks of 2 KiB and its header, under the floor.
        assert_eq!(walked_ring_bytes(2, 19, true), 256 << 10);
        // 2 CPUs at 999 Hz: 1,998 records of 2,072 bytes, just under 4 MiB.
        assert_eq!(walked_ring_bytes(2, 999, true), 4 << 20);
        assert_eq!(walked_ring_bytes(64, 999, true), 16 << 20);
        assert_eq!(walked_ring_bytes(u64::MAX, u64::MAX, true), 16 << 20);
    }

    #[test]
    fn counts_threads_in_loadavg() {
        assert_eq!(
            threads_in_loadavg("0.52 0.58 0.59 3/1234 5678\n"),
            Some(1234)
        );
        assert_eq!(threads_in_loadavg("0.52 0.58"), None);
        assert_eq!(off_cpu_map_sizes(false), (1, 1, 4096));
    }

    #[test]
    fn a_capture_sizes_the_unwinder_for_its_processes() {
        let pool = scorch_common::UNWIND_POOL_ROWS;
        assert_eq!(
            UnwindCapacity::capture(&[42], 300),
            UnwindCapacity {
                pool_rows: pool,
                processes: 16
            }
        );
        assert_eq!(UnwindCapacity::capture(&[], 300).processes, 1024);
        assert_eq!(UnwindCapacity::capture(&[], 3000).processes, 6000);
        assert_eq!(
            UnwindCapacity::capture(&[], 100_000).processes,
            scorch_common::MAX_UNWIND_PROCS
        );
    }

    #[test]
    fn the_pool_ceiling_is_set_in_mib() {
        assert_eq!(UnwindCapacity::DAEMON.pool_mib(), 64);
        let small = UnwindCapacity::DAEMON.with_pool_mib(3);
        assert_eq!((small.pool_rows, small.pool_mib()), (3 << 17, 3));
        assert_eq!(small.processes, UnwindCapacity::DAEMON.processes);
        // The largest ceiling the flag takes, 4 GiB, is 2^29 rows.
        assert_eq!(
            UnwindCapacity::DAEMON.with_pool_mib(4096).pool_rows,
            1 << 29
        );
    }

    #[test]
    fn sizes_counts_and_comms_to_a_window() {
        let config = SamplerConfig::default();
        assert_eq!(config.frequency_hz * config.window_secs, 190);
        // 2 CPUs: 380 samples a window.
        assert_eq!(per_window_map_entries(2, &config), (4096, 4096));
        // 64 CPUs: 12,160 samples.
        assert_eq!(per_window_map_entries(64, &config), (32_768, 32_768));
        // 256 CPUs: 48,640 samples, up to the bounds the object declares.
        assert_eq!(
            per_window_map_entries(256, &config),
            (MAX_COUNT_KEYS, MAX_COMMS)
        );
        let fast = SamplerConfig {
            frequency_hz: 999,
            ..SamplerConfig::default()
        };
        // 19,980 samples.
        assert_eq!(per_window_map_entries(2, &fast), (65_536, 32_768));
    }
}
