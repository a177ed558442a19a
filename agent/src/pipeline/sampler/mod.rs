//! Sampler: load the BPF program and attach it to a CPU-clock perf event on every online CPU.
//! What it is asked for, and the map sizes that follow, are in `config`; this file loads,
//! fills the maps and attaches.

mod config;

use std::{io, path::PathBuf};

use aya::{
    maps::{Array, HashMap as BpfHashMap, Map, MapData, MapError, PerCpuArray},
    programs::{
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        PerfEvent, ProgramError, RawTracePoint,
    },
    Ebpf, EbpfError, EbpfLoader,
};
use scorch_common::{Control, ExecFile, RuntimeId, MAX_STACK_DEPTH};

use super::{
    maps::{
        new_seen_stack_map, new_stack_map, GenerationMaps, RuntimeCounters, SamplerMaps,
        StackMapError, UnwindMaps,
    },
    off_cpu::{OffCpuMaps, OffCpuSettings},
    stack_sizing::StackSizing,
};
use config::{off_cpu_map_sizes, per_window_map_entries, samples_per_window, walked_ring_bytes};

pub use config::{RuntimeMap, SamplerConfig, UnwindCapacity, UnwindMode};

/// The BPF object, built by build.rs with aya-build.
static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/scorch-ebpf"));

#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    #[error("loading the BPF object: {0}")]
    Load(#[from] EbpfError),
    #[error("BPF program `sample` is missing from the object")]
    MissingProgram,
    #[error("BPF map {0} is missing from the object")]
    MissingMap(&'static str),
    #[error("BPF map {name}, a runtime's processes: {source}")]
    RuntimeMap {
        name: &'static str,
        source: crate::sys::inner_maps::BytesMapError,
    },
    #[error("a second descriptor of BPF map {name}: {source}")]
    Duplicate {
        name: &'static str,
        source: io::Error,
    },
    #[error("BPF map {name}: {source}")]
    Map {
        name: &'static str,
        source: MapError,
    },
    #[error("loading the BPF program into the kernel: {0}")]
    Program(ProgramError),
    #[error(transparent)]
    StackMap(#[from] StackMapError),
    #[error("attaching to the sched_process_exec raw tracepoint (to forget exec'd processes' unwind tables): {0}")]
    ExecTracepoint(ProgramError),
    #[error("attaching the off-CPU program to the sched_switch raw tracepoint: {0}")]
    OffCpu(ProgramError),
    #[error("off-CPU time needs the thread id's place in the kernel's task_struct: {0}")]
    TaskPid(crate::sys::btf::BtfError),
    #[error("opening the CPU-clock perf event on CPU {cpu}: {source}")]
    Attach { cpu: u32, source: ProgramError },
    #[error("reading {path}: {source}")]
    OnlineCpus { path: PathBuf, source: io::Error },
    #[error("{path}: cannot parse CPU list {text:?}")]
    CpuList { path: PathBuf, text: String },
}

/// A verifier's refusal in one line: the load's error, which starts the log, and the log's
/// last line, which says what the verifier refused.
fn refusal(error: &str) -> String {
    // The log ends with the verifier's statistics: the refusal is the line before them.
    let statistics = ["processed ", "verification time ", "stack depth "];
    let mut lines = error.lines().map(str::trim).filter(|line| {
        !line.is_empty() && !statistics.iter().any(|prefix| line.starts_with(prefix))
    });
    let first = lines.next().unwrap_or_default();
    match lines.next_back() {
        Some(last) => format!("{first} ... {last}"),
        None => first.to_owned(),
    }
}

/// A loaded and attached sampler. Dropping it detaches the program.
pub struct Sampler {
    ebpf: Ebpf,
    cpus: Vec<u32>,
    /// Drains BPF-side log records into `tracing` (through the `log` bridge).
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    /// The unwinder's maps, until [`Sampler::take_unwind_maps`] (with [`UnwindMode::Auto`]).
    unwind_maps: Option<UnwindMaps>,
    /// `sample` (with the unwinder) or `sample_fp`.
    program_name: &'static str,
    /// Why the kernel refused the unwinder, when it did and frame pointers walk instead.
    unwind_refused: Option<String>,
    /// Why the `vm_unmapped_area` hook could not be attached, when it could not.
    mapping_hook_refused: Option<String>,
    /// The off-CPU program's maps, until [`Sampler::take_off_cpu_maps`] (with `off_cpu`).
    off_cpu_maps: Option<OffCpuMaps>,
    /// The files processes exec'd, until [`Sampler::take_exec_files`] (with the unwinder,
    /// whose exec hook records them).
    exec_files: Option<ExecFiles>,
}

/// By tgid, what each process last exec'd ([`ExecFile`]).
pub type ExecFiles = BpfHashMap<MapData, u32, ExecFile>;

impl Sampler {
    /// Loads the program, sizes and fills its maps, and attaches it on every online CPU.
    /// Returns the sampler and the maps the drain needs. With [`UnwindMode::Auto`] on a kernel
    /// whose verifier refuses the unwinder, starts again with frame pointers only, says so
    /// once, and keeps the reason ([`Sampler::unwind_refused`]).
    pub fn start(config: &SamplerConfig) -> Result<(Sampler, SamplerMaps, Control), SamplerError> {
        match Self::start_as(config) {
            Err(SamplerError::Program(error)) if config.unwind == UnwindMode::Auto => {
                let reason = refusal(&error.to_string());
                tracing::debug!("the verifier's log of the BPF unwinder: {error}");
                tracing::warn!(
                    "the BPF unwinder does not pass this kernel's verifier ({reason}); user \
                     stacks are walked with frame pointers, as with --unwind fp"
                );
                let fp = SamplerConfig {
                    unwind: UnwindMode::Fp,
                    ..config.clone()
                };
                let (mut sampler, maps, control) = Self::start_as(&fp)?;
                sampler.unwind_refused = Some(reason);
                Ok((sampler, maps, control))
            }
            other => other,
        }
    }

    fn start_as(config: &SamplerConfig) -> Result<(Sampler, SamplerMaps, Control), SamplerError> {
        let cpus = online_cpus()?;
        let samples = samples_per_window(cpus.len() as u64, config);
        let stack_sizing = StackSizing::stack_trace(samples, config.stack_entries_ceiling);
        let (count_entries, comm_entries) = per_window_map_entries(cpus.len() as u64, config);
        let tables = config.unwind == UnwindMode::Auto;
        // Only walked user stacks go in these, and only with tables: otherwise one entry each.
        let seen_stack_sizing = StackSizing::user_stacks(
            samples,
            if tables {
                config.stack_entries_ceiling
            } else {
                1
            },
        );
        // Without tables the unwinder's maps go unused: one entry each.
        let capacity = if tables {
            config.unwind_capacity
        } else {
            UnwindCapacity {
                pool_rows: 1,
                processes: 1,
            }
        };
        let pool_rows = capacity.pool_rows;
        // A runtime whose walk reads the thread pointer is walked only when the kernel's BTF
        // gives that pointer's place in the task; otherwise its frames stay native frames.
        let needs_thread_pointer = tables && config.runtime_maps.iter().any(|r| r.thread_pointer);
        let task_thread_pointer: u32 = if needs_thread_pointer {
            crate::sys::btf::task_thread_pointer_offset(crate::arch::native::THREAD_POINTER)
                .unwrap_or_else(|err| {
                    let ids: Vec<RuntimeId> = config
                        .runtime_maps
                        .iter()
                        .filter(|r| r.thread_pointer)
                        .map(|r| r.id)
                        .collect();
                    tracing::warn!("runtime frames not walked ({ids:?}): {err}");
                    0
                })
        } else {
            0
        };
        let runtime_maps: Vec<RuntimeMap> = config
            .runtime_maps
            .iter()
            .filter(|r| tables && (!r.thread_pointer || task_thread_pointer != 0))
            .copied()
            .collect();
        let task_pid: u32 = match config.off_cpu {
            Some(_) => crate::sys::btf::task_pid_offset().map_err(SamplerError::TaskPid)?,
            None => 0,
        };
        // A process that exits before the agent reads /proc/PID is labelled by what its
        // samples and its exec recorded (its leader's name and start, the file it exec'd),
        // read from the task and the exec, whose layouts the BTF gives.
        let [task_group_leader, task_comm, task_start_boottime, binprm_interp] =
            crate::sys::btf::process_record_offsets().unwrap_or_else(|err| {
                tracing::debug!(
                    "exited processes labelled by their sampled thread's name only: {err}"
                );
                [0; 4]
            });
        let (threads, user_stacks, ring_bytes) = off_cpu_map_sizes(config.off_cpu.is_some());
        let mut loader = EbpfLoader::new();
        // Signed return addresses are stripped with the running kernel's mask.
        #[cfg(target_arch = "aarch64")]
        let return_address_mask = {
            use crate::arch::aarch64::pac;
            let code = pac::code_mask()
                .inspect_err(|err| {
                    tracing::warn!("{err}: stripping return addresses to 48 bits instead")
                })
                .ok();
            pac::address_mask(code)
        };
        #[cfg(target_arch = "aarch64")]
        loader.override_global("RETURN_ADDRESS_MASK", &return_address_mask, true);
        loader
            .override_global("TASK_THREAD_POINTER", &task_thread_pointer, true)
            .override_global("TASK_PID", &task_pid, true)
            .override_global("TASK_GROUP_LEADER", &task_group_leader, true)
            .override_global("TASK_COMM", &task_comm, true)
            .override_global("TASK_START_BOOTTIME", &task_start_boottime, true)
            .override_global("BINPRM_INTERP", &binprm_interp, true)
            .map_max_entries("OFF_CPU_THREADS", threads)
            .map_max_entries("OFF_CPU_USER_STACK_MAP", user_stacks)
            .map_max_entries("OFF_CPU_EVENTS", ring_bytes)
            .map_max_entries(
                "WALKED_STACKS",
                walked_ring_bytes(cpus.len() as u64, config.frequency_hz, tables),
            )
            .map_max_entries("COUNTS_0", count_entries)
            .map_max_entries("COUNTS_1", count_entries)
            .map_max_entries("COMMS_0", comm_entries)
            .map_max_entries("COMMS_1", comm_entries)
            .map_max_entries("NOTIFIED", capacity.processes)
            // Recorded by the exec hook, which runs with the unwinder only.
            .map_max_entries(
                "EXEC_FILES",
                if tables && config.exec_files {
                    scorch_common::MAX_EXEC_FILES
                } else {
                    1
                },
            );
        for runtime in &runtime_maps {
            // Not preallocated: the bound is what a full host could hold, never memory taken
            // up front. One more for an entry of processes without the runtime.
            loader.map_max_entries(runtime.procs, capacity.processes.saturating_add(1));
        }
        let mut ebpf = loader.load(BPF_OBJECT)?;
        let logger = match aya_log::EbpfLogger::init(&mut ebpf) {
            Ok(logger) => Some(logger),
            Err(err) => {
                tracing::debug!("BPF-side logging unavailable: {err}");
                None
            }
        };

        let mut maps = take_maps(
            &mut ebpf,
            stack_sizing,
            seen_stack_sizing,
            &config.runtime_counters,
        )?;
        let control = Control {
            generation: 0,
            filter_pids: if !config.pids.is_empty() {
                scorch_common::FILTER_ALLOW
            } else if config.deny_list {
                scorch_common::FILTER_DENY
            } else {
                scorch_common::FILTER_NONE
            },
            include_idle: u32::from(config.include_idle),
            unwind: if tables {
                scorch_common::UNWIND_TABLES
            } else {
                scorch_common::UNWIND_FP
            },
            thread_ids: u32::from(config.thread_ids),
        };
        maps.control
            .set(0, control, 0)
            .map_err(|source| SamplerError::Map {
                name: "CONTROL",
                source,
            })?;
        if !config.pids.is_empty() {
            let map = ebpf
                .map_mut("PID_FILTER")
                .ok_or(SamplerError::MissingMap("PID_FILTER"))?;
            let mut filter: BpfHashMap<&mut MapData, u32, u8> =
                BpfHashMap::try_from(map).map_err(|source| SamplerError::Map {
                    name: "PID_FILTER",
                    source,
                })?;
            for &pid in &config.pids {
                filter
                    .insert(pid, 1, 0)
                    .map_err(|source| SamplerError::Map {
                        name: "PID_FILTER",
                        source,
                    })?;
            }
        }

        let mut mapping_hook_refused = None;
        let mut exec_files = None;
        let unwind_maps = if tables {
            let exec: &mut RawTracePoint = ebpf
                .program_mut("process_exec")
                .ok_or(SamplerError::MissingProgram)?
                .try_into()
                .map_err(SamplerError::ExecTracepoint)?;
            exec.load().map_err(SamplerError::ExecTracepoint)?;
            exec.attach("sched_process_exec")
                .map_err(SamplerError::ExecTracepoint)?;
            mapping_hook_refused = attach_mapping_placed(&mut ebpf);
            if config.exec_files {
                exec_files = Some(take(&mut ebpf, "EXEC_FILES")?);
            }
            Some(take_unwind_maps(
                &mut ebpf,
                pool_rows,
                capacity.processes,
                &runtime_maps,
            )?)
        } else {
            None
        };

        let program_name = if tables { "sample" } else { "sample_fp" };
        let program: &mut PerfEvent = ebpf
            .program_mut(program_name)
            .ok_or(SamplerError::MissingProgram)?
            .try_into()
            .map_err(SamplerError::Program)?;
        program.load().map_err(SamplerError::Program)?;
        for &cpu in &cpus {
            program
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Frequency(config.frequency_hz),
                    false,
                )
                .map_err(|source| SamplerError::Attach { cpu, source })?;
        }
        let off_cpu_maps = match config.off_cpu {
            Some(settings) => Some(attach_off_cpu(&mut ebpf, &settings, cpus.len())?),
            None => None,
        };
        let sampler = Sampler {
            ebpf,
            cpus,
            logger,
            unwind_maps,
            program_name,
            unwind_refused: None,
            mapping_hook_refused,
            off_cpu_maps,
            exec_files,
        };
        Ok((sampler, maps, control))
    }

    /// Why this kernel's verifier refused the unwinder, when it did (see [`Sampler::start`]).
    pub fn unwind_refused(&self) -> Option<&str> {
        self.unwind_refused.as_deref()
    }

    /// Why the unwinder does not hear of code mapped over code (the `vm_unmapped_area`
    /// tracepoint), when it does not.
    pub fn mapping_hook_refused(&self) -> Option<&str> {
        self.mapping_hook_refused.as_deref()
    }

    /// The maps that feed the unwinder its tables, once (`None` with [`UnwindMode::Fp`]).
    pub fn take_unwind_maps(&mut self) -> Option<UnwindMaps> {
        self.unwind_maps.take()
    }

    /// The files processes exec'd, once (`None` without the unwinder).
    pub fn take_exec_files(&mut self) -> Option<ExecFiles> {
        self.exec_files.take()
    }

    /// The off-CPU program's maps, once (`None` without `off_cpu`).
    pub fn take_off_cpu_maps(&mut self) -> Option<OffCpuMaps> {
        self.off_cpu_maps.take()
    }

    /// Cumulative run time and run count of the off-CPU program, when
    /// `kernel.bpf_stats_enabled` is on.
    pub fn off_cpu_run_stats(&self) -> Option<(std::time::Duration, u64)> {
        let info = self.ebpf.program("off_cpu_switch")?.info().ok()?;
        Some((info.run_time(), info.run_count()))
    }

    /// Instructions the verifier walked to accept the off-CPU program (5.16+).
    pub fn off_cpu_verified_instructions(&self) -> Option<u32> {
        let program = self.ebpf.program("off_cpu_switch")?;
        program.info().ok()?.verified_instruction_count()
    }

    /// CPUs the program is attached on.
    pub fn cpus(&self) -> &[u32] {
        &self.cpus
    }

    fn pid_filter(&mut self) -> Result<BpfHashMap<&mut MapData, u32, u8>, SamplerError> {
        let map = self
            .ebpf
            .map_mut("PID_FILTER")
            .ok_or(SamplerError::MissingMap("PID_FILTER"))?;
        BpfHashMap::try_from(map).map_err(|source| SamplerError::Map {
            name: "PID_FILTER",
            source,
        })
    }

    /// Stops sampling `pid` (with `deny_list`): the program then drops its samples before
    /// walking any stack.
    pub fn exclude_pid(&mut self, pid: u32) -> Result<(), SamplerError> {
        self.pid_filter()?
            .insert(pid, 1, 0)
            .map_err(|source| SamplerError::Map {
                name: "PID_FILTER",
                source,
            })
    }

    /// Forgets an excluded `pid` (the process exited; the number may be reused).
    pub fn forget_pid(&mut self, pid: u32) {
        if let Ok(mut filter) = self.pid_filter() {
            let _ = filter.remove(&pid);
        }
    }

    /// Samples the PID filter has discarded since the program was loaded, over all CPUs.
    pub fn filtered_samples(&self) -> u64 {
        let Some(map) = self.ebpf.map("FILTERED") else {
            return 0;
        };
        let Ok(array) = aya::maps::PerCpuArray::<&MapData, u64>::try_from(map) else {
            return 0;
        };
        array
            .get(&0, 0)
            .map(|values| values.iter().sum())
            .unwrap_or(0)
    }

    /// Forwards log records the BPF program wrote since the last call.
    pub fn flush_logs(&mut self) {
        if let Some(logger) = &mut self.logger {
            logger.flush();
        }
    }

    /// Cumulative run time and run count of the program, when `kernel.bpf_stats_enabled` is on
    /// (otherwise both stay zero).
    pub fn run_stats(&self) -> Option<(std::time::Duration, u64)> {
        let program = self.ebpf.program(self.program_name)?;
        let info = program.info().ok()?;
        Some((info.run_time(), info.run_count()))
    }

    /// Instructions the kernel's verifier walked to accept the program (5.16+): how far it is
    /// from the verifier's million-instruction limit.
    pub fn verified_instructions(&self) -> Option<u32> {
        let program = self.ebpf.program(self.program_name)?;
        program.info().ok()?.verified_instruction_count()
    }
}

/// Loads the off-CPU program, fills its control and attaches it to `sched_switch`.
fn attach_off_cpu(
    ebpf: &mut Ebpf,
    settings: &OffCpuSettings,
    cpus: usize,
) -> Result<OffCpuMaps, SamplerError> {
    let control = settings.control(cpus, std::process::id());
    let mut array: Array<MapData, scorch_common::OffCpuControl> = take(ebpf, "OFF_CPU_CONTROL")?;
    array
        .set(0, control, 0)
        .map_err(|source| SamplerError::Map {
            name: "OFF_CPU_CONTROL",
            source,
        })?;
    let program: &mut RawTracePoint = ebpf
        .program_mut("off_cpu_switch")
        .ok_or(SamplerError::MissingProgram)?
        .try_into()
        .map_err(SamplerError::OffCpu)?;
    program.load().map_err(SamplerError::OffCpu)?;
    program
        .attach("sched_switch")
        .map_err(SamplerError::OffCpu)?;
    Ok(OffCpuMaps {
        events: take(ebpf, "OFF_CPU_EVENTS")?,
        counts: take(ebpf, "OFF_CPU_COUNTS_MAP")?,
    })
}

/// Attaches `mapping_placed` to the `vm_unmapped_area` tracepoint, which tells the BPF side
/// that a process mapped something over addresses where it had code: a library unloaded and
/// another loaded in its place. Without it (a kernel without the tracepoint) such a process
/// keeps its old table for the address until something else makes the agent read its maps
/// again; that is logged, and sampling goes on. Returns why it could not be attached.
fn attach_mapping_placed(ebpf: &mut Ebpf) -> Option<String> {
    let attached = ebpf
        .program_mut("mapping_placed")
        .ok_or(ProgramError::UnexpectedProgramType)
        .and_then(|program| {
            let program: &mut RawTracePoint = program.try_into()?;
            program.load()?;
            program.attach("vm_unmapped_area").map(drop)
        });
    let err = attached.err()?;
    tracing::warn!(
        "attaching to the vm_unmapped_area raw tracepoint: {err}; a library loaded where an \
         unloaded one was is walked with the old one's unwind table until the process is read \
         again"
    );
    Some(err.to_string())
}

fn take<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, SamplerError>
where
    T: TryFrom<Map, Error = MapError>,
{
    let map = ebpf.take_map(name).ok_or(SamplerError::MissingMap(name))?;
    T::try_from(map).map_err(|source| SamplerError::Map { name, source })
}

/// Takes the drain's maps out of the object, and creates each generation's stack maps: the
/// seen-stack maps start with `seen_stack_sizing`'s entries.
fn take_maps(
    ebpf: &mut Ebpf,
    stack_sizing: StackSizing,
    seen_stack_sizing: StackSizing,
    runtime_counters: &[RuntimeCounters],
) -> Result<SamplerMaps, SamplerError> {
    let stacks_outer = take_outer(ebpf, "STACKS")?;
    let seen_stacks_outer = take_outer(ebpf, "SEEN_STACKS")?;
    let generation = |ebpf: &mut Ebpf, g: u32, [counts, comms]: [&'static str; 2]| {
        let entries = stack_sizing.entries(g as usize);
        let seen_entries = seen_stack_sizing.entries(g as usize);
        Ok::<_, SamplerError>(GenerationMaps {
            counts: take(ebpf, counts)?,
            stacks: new_stack_map(&stacks_outer, g, entries)?,
            comms: take(ebpf, comms)?,
            seen_stacks: new_seen_stack_map(&seen_stacks_outer, g, seen_entries)?,
        })
    };
    let gen0 = generation(ebpf, 0, ["COUNTS_0", "COMMS_0"])?;
    let gen1 = generation(ebpf, 1, ["COUNTS_1", "COMMS_1"])?;
    let control: Array<MapData, Control> = take(ebpf, "CONTROL")?;
    Ok(SamplerMaps {
        control,
        run_seq: take(ebpf, "RUN_SEQ")?,
        losses: take::<PerCpuArray<MapData, u64>>(ebpf, "LOSSES")?,
        unwind_outcomes: take(ebpf, "UNWIND_OUTCOMES_COUNT")?,
        runtime_counts: runtime_counters
            .iter()
            .map(|&counters| Ok((counters, take(ebpf, counters.map)?)))
            .collect::<Result<_, SamplerError>>()?,
        generations: [gen0, gen1],
        stacks_outer,
        stack_sizing,
        seen_stacks_outer,
        seen_stack_sizing,
        walked_stacks: take(ebpf, "WALKED_STACKS")?,
    })
}

/// The array of maps `name`, taken out of the object.
fn take_outer(ebpf: &mut Ebpf, name: &'static str) -> Result<MapData, SamplerError> {
    match ebpf.take_map(name).ok_or(SamplerError::MissingMap(name))? {
        Map::ArrayOfMaps(data) => Ok(data),
        _ => Err(SamplerError::MissingMap(name)),
    }
}

fn take_unwind_maps(
    ebpf: &mut Ebpf,
    pool_rows: u32,
    processes: u32,
    runtime_maps: &[RuntimeMap],
) -> Result<UnwindMaps, SamplerError> {
    let rows = take_outer(ebpf, "UNWIND_ROWS")?;
    let procs = take_outer(ebpf, "UNWIND_PROCS")?;
    let mut runtime_procs = Vec::with_capacity(runtime_maps.len());
    for &RuntimeMap {
        id, procs: name, ..
    } in runtime_maps
    {
        let data = match ebpf.take_map(name).ok_or(SamplerError::MissingMap(name))? {
            Map::HashMap(data) => data,
            _ => return Err(SamplerError::MissingMap(name)),
        };
        let map = crate::sys::inner_maps::BytesMap::new(data)
            .map_err(|source| SamplerError::RuntimeMap { name, source })?;
        runtime_procs.push((id, map));
    }
    Ok(UnwindMaps {
        rows,
        pool_rows,
        procs,
        processes,
        events: take(ebpf, "UNWIND_EVENTS")?,
        row_epoch: take(ebpf, "ROW_EPOCH")?,
        runtime_procs,
    })
}

/// The online CPUs, from `/sys/devices/system/cpu/online` (e.g. `0-3,6`).
pub fn online_cpus() -> Result<Vec<u32>, SamplerError> {
    let path = PathBuf::from("/sys/devices/system/cpu/online");
    let text = std::fs::read_to_string(&path).map_err(|source| SamplerError::OnlineCpus {
        path: path.clone(),
        source,
    })?;
    parse_cpu_list(text.trim()).ok_or(SamplerError::CpuList { path, text })
}

/// Parses the kernel's CPU list format.
pub fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if b < a {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    (!cpus.is_empty()).then_some(cpus)
}

// The stack map's value size is what bounds recorded depth; keep the shared constant honest.
const _: () = assert!(MAX_STACK_DEPTH == 127);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_lists() {
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("0-3,6"), Some(vec![0, 1, 2, 3, 6]));
        assert_eq!(parse_cpu_list("0-1,4-5"), Some(vec![0, 1, 4, 5]));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn a_refusal_keeps_the_error_and_the_verifiers_last_word() {
        let log = "the BPF_PROG_LOAD syscall returned Permission denied (os error 13). \
                   Verifier output: 0: R1=ctx() R10=fp0\n1: (85) call 14\n\ncombined stack \
                   size of 3 calls is 544. Too large\nverification time 33560 usec\nstack depth \
                   160+72\nprocessed 8579 insns (limit 1000000) \
                   max_states_per_insn 11\n";
        assert_eq!(
            refusal(log),
            "the BPF_PROG_LOAD syscall returned Permission denied (os error 13). Verifier \
             output: 0: R1=ctx() R10=fp0 ... combined stack size of 3 calls is 544. Too large"
        );
        assert_eq!(refusal("no log"), "no log");
    }
}
