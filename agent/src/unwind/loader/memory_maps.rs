//! An in-memory double of the BPF maps the loader writes ([`LoaderMaps`]), and what the role
//! tests share: an unwinder over it, built tables to hand it, and processes' maps.

use std::{
    collections::{BTreeMap, HashMap},
    path::Path,
    sync::mpsc,
};

use aya::maps::MapError;
use scorch_common::{
    ProcMappings, RuntimeId, UnwindMapping, UnwindRow, MAX_PROC_MAPPINGS, PROCS_NO_MAPPINGS,
};

use super::{BuildResult, Built, FileKey, LoaderError, LoaderMaps, Segment, Unwinder};
use crate::{
    process::maps::{parse_maps, ProcessMaps},
    unwind::pool::RowPools,
};

/// What the loader did to the maps, in order: the order is part of the protocol (a process
/// map is rewritten before the rows it pointed at are freed, and the row epoch moves before a
/// pool is given back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    CreatePool { index: u32, rows: u32 },
    RemovePool(u32),
    CopyRows { from: u32, to: u32, rows: u32 },
    RowEpoch(u64),
    InsertProcess(u32),
    RemoveProcess(u32),
    GrowProcesses(u32),
    InsertRuntimeEntry(RuntimeId, u32),
    RemoveRuntimeEntry(RuntimeId, u32),
}

/// The maps, as the kernel would hold them, and the refusals a test asks of it.
pub(super) struct MemoryMaps {
    /// Each pool's rows, by its index in `UNWIND_ROWS`.
    pub(super) pools: BTreeMap<u32, Vec<UnwindRow>>,
    /// The process map's entries, the walks' entry for processes it does not hold among them.
    pub(super) procs: HashMap<u32, ProcMappings>,
    /// Processes the process map holds at most, that entry aside.
    pub(super) entries: u32,
    /// Processes it may grow to hold.
    pub(super) ceiling: u32,
    /// What `ROW_EPOCH` holds.
    pub(super) row_epoch: u64,
    /// Pools the kernel creates before its memory limits refuse one; `None`: no limit.
    pub(super) pools_allowed: Option<usize>,
    /// Whether the kernel refuses a larger process map.
    pub(super) refuse_growth: bool,
    /// Whether writing `ROW_EPOCH` fails.
    pub(super) refuse_epoch: bool,
    /// Each runtime's entries, by runtime and process.
    pub(super) runtime_entries: HashMap<(RuntimeId, u32), Vec<u8>>,
    /// Every change, in order.
    pub(super) ops: Vec<Op>,
}

impl MemoryMaps {
    /// A process map of `entries` processes that may grow to `ceiling`, and no pool.
    pub(super) fn new(entries: u32, ceiling: u32) -> Self {
        let none = ProcMappings {
            count: 0,
            _reserved: 0,
            mappings: [UnwindMapping::default(); MAX_PROC_MAPPINGS],
        };
        MemoryMaps {
            pools: BTreeMap::new(),
            procs: HashMap::from([(PROCS_NO_MAPPINGS, none)]),
            entries,
            ceiling,
            row_epoch: 0,
            pools_allowed: None,
            refuse_growth: false,
            refuse_epoch: false,
            runtime_entries: HashMap::new(),
            ops: Vec::new(),
        }
    }
}

/// A failed BPF syscall, as aya reports it.
fn syscall_error(call: &'static str, code: i32) -> MapError {
    MapError::SyscallError(aya::sys::SyscallError {
        call,
        io_error: std::io::Error::from_raw_os_error(code),
    })
}

impl LoaderMaps for MemoryMaps {
    fn create_pool(&mut self, index: u32, rows: u32) -> Result<(), LoaderError> {
        if self
            .pools_allowed
            .is_some_and(|allowed| self.pools.len() >= allowed)
        {
            return Err(LoaderError::AddPool {
                index,
                source: std::io::Error::from_raw_os_error(libc::ENOMEM),
            });
        }
        assert!(self
            .pools
            .insert(index, vec![UnwindRow::default(); rows as usize])
            .is_none());
        self.ops.push(Op::CreatePool { index, rows });
        Ok(())
    }

    fn write_rows(
        &mut self,
        pool: u32,
        first_row: u32,
        rows: &[UnwindRow],
    ) -> Result<(), LoaderError> {
        let pool_rows = self.pools.get_mut(&pool).ok_or(LoaderError::NoPool(pool))?;
        let first = first_row as usize;
        pool_rows[first..first + rows.len()].copy_from_slice(rows);
        Ok(())
    }

    fn copy_rows(
        &mut self,
        (from, from_row): (u32, u32),
        (to, to_row): (u32, u32),
        rows: u32,
    ) -> Result<(), LoaderError> {
        let (from_row, to_row, rows) = (from_row as usize, to_row as usize, rows as usize);
        let source = self.pools.get(&from).ok_or(LoaderError::NoPool(from))?
            [from_row..from_row + rows]
            .to_vec();
        let target = self.pools.get_mut(&to).ok_or(LoaderError::NoPool(to))?;
        target[to_row..to_row + rows].copy_from_slice(&source);
        self.ops.push(Op::CopyRows {
            from,
            to,
            rows: rows as u32,
        });
        Ok(())
    }

    fn remove_pool(&mut self, index: u32) {
        assert!(
            self.pools.remove(&index).is_some(),
            "pool {index} removed twice"
        );
        self.ops.push(Op::RemovePool(index));
    }

    fn set_row_epoch(&mut self, epoch: u64) -> Result<(), MapError> {
        if self.refuse_epoch {
            return Err(syscall_error("bpf_map_update_elem", libc::EINVAL));
        }
        self.row_epoch = epoch;
        self.ops.push(Op::RowEpoch(epoch));
        Ok(())
    }

    fn insert_process(&mut self, pid: u32, mappings: &ProcMappings) -> Result<(), MapError> {
        // A preallocated hash: one slot per process and one for the walks' entry.
        if !self.procs.contains_key(&pid) && self.procs.len() > self.entries as usize {
            return Err(syscall_error("bpf_map_update_elem", libc::E2BIG));
        }
        self.procs.insert(pid, *mappings);
        self.ops.push(Op::InsertProcess(pid));
        Ok(())
    }

    fn remove_process(&mut self, pid: u32) -> Result<(), MapError> {
        self.procs
            .remove(&pid)
            .ok_or(MapError::KeyNotFound)
            .map(|_| self.ops.push(Op::RemoveProcess(pid)))
    }

    fn process_entries(&self) -> u32 {
        self.entries
    }

    fn process_ceiling(&self) -> u32 {
        self.ceiling
    }

    fn grow_processes(&mut self, entries: u32) -> Result<(), LoaderError> {
        if self.refuse_growth {
            return Err(LoaderError::CreateProcs {
                entries,
                source: crate::sys::inner_maps::InnerMapError::Create {
                    name: "scorch_procs".into(),
                    source: std::io::Error::from_raw_os_error(libc::ENOMEM),
                },
            });
        }
        self.entries = entries;
        self.ops.push(Op::GrowProcesses(entries));
        Ok(())
    }

    fn insert_runtime_entry(
        &mut self,
        id: RuntimeId,
        pid: u32,
        entry: &[u8],
    ) -> Result<(), LoaderError> {
        self.runtime_entries.insert((id, pid), entry.to_vec());
        self.ops.push(Op::InsertRuntimeEntry(id, pid));
        Ok(())
    }

    fn remove_runtime_entry(&mut self, id: RuntimeId, pid: u32) {
        self.runtime_entries.remove(&(id, pid));
        self.ops.push(Op::RemoveRuntimeEntry(id, pid));
    }
}

/// An unwinder over `maps` whose pools hold `pool_rows` rows together (from pools of 512),
/// and the worker's end of its results, for tests to hand it built tables.
pub(super) fn unwinder(
    maps: MemoryMaps,
    pool_rows: u32,
) -> (Unwinder<MemoryMaps>, mpsc::Sender<BuildResult>) {
    // No worker: a table asked for finds its inbox closed, and a test builds it instead.
    let (requests, _) = mpsc::channel();
    let (outbox, results) = mpsc::channel();
    let pools = RowPools::new(4, pool_rows, 512);
    (Unwinder::new(maps, pools, requests, results), outbox)
}

/// Binary `inode` on device 00:01, as a process's maps name it.
pub(super) fn file(inode: u64) -> FileKey {
    FileKey { dev: 1, inode }
}

/// Where each binary's code is in the test processes: file offset 0x1000, ELF address 0x1000.
pub(super) const CODE: Segment = Segment {
    offset: 0x1000,
    address: 0x1000,
    file_size: 0x10000,
    memory_size: 0x10000,
    flags: crate::binary::elf::PF_X,
};

/// A table of `rows` rows for a binary of build id `id`.
pub(super) fn built(rows: usize, id: u8) -> Built {
    Built {
        rows: vec![UnwindRow::default(); rows],
        base: 0,
        segments: vec![CODE],
        build_id: Some(Box::new([id])),
    }
}

/// The maps of a process whose code is in `inodes`, one mapping each, in that order.
pub(super) fn process(inodes: &[u64]) -> ProcessMaps {
    let text: String = inodes
        .iter()
        .enumerate()
        .map(|(i, inode)| {
            let start = 0x7f00_0000_0000 + (i as u64) * 0x10_0000;
            format!(
                "{start:x}-{:x} r-xp 00001000 00:01 {inode} /lib/lib{inode}.so\n",
                start + CODE.file_size
            )
        })
        .collect();
    ProcessMaps::from_entries(parse_maps(&text, Path::new("maps")).unwrap())
}

/// Process ids no process has (above the kernel's most, 2^22): the tests' processes.
pub(super) const PID: u32 = 5_000_000;
