//! Another process's memory, as the runtimes' readers see it: a running process
//! (`process_vm_readv`), or bytes at addresses for the tests and the fuzz targets. Every read
//! is whole or fails; what is read is the process's to choose, so each reader bounds what it
//! reads.

use crate::sys::memory;

/// Another process's memory: tests and the fuzz targets give bytes at addresses instead of
/// a process.
pub trait Memory {
    /// Fills `buffer` from `address`; false unless every byte was read.
    fn read(&self, address: u64, buffer: &mut [u8]) -> bool;
}

/// A running process's memory (`process_vm_readv`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessMemory(pub u32);

impl Memory for ProcessMemory {
    fn read(&self, address: u64, buffer: &mut [u8]) -> bool {
        memory::read(self.0, address, buffer).is_some()
    }
}

/// Memory given as byte ranges at addresses: what the tests and the fuzz target read. A read
/// succeeds only within one range, as a read across two mappings may fail in a process.
#[derive(Debug, Clone, Default)]
pub struct Regions {
    regions: Vec<(u64, Vec<u8>)>,
}

impl Regions {
    pub fn new() -> Regions {
        Regions::default()
    }

    /// Adds `bytes` at `address` (ranges are expected not to overlap; the first holding a
    /// read answers it).
    pub fn add(&mut self, address: u64, bytes: Vec<u8>) {
        self.regions.push((address, bytes));
    }
}

impl Memory for Regions {
    fn read(&self, address: u64, buffer: &mut [u8]) -> bool {
        for (start, bytes) in &self.regions {
            let Some(from) = address.checked_sub(*start) else {
                continue;
            };
            let Ok(from) = usize::try_from(from) else {
                continue;
            };
            if let Some(source) = from
                .checked_add(buffer.len())
                .and_then(|end| bytes.get(from..end))
            {
                buffer.copy_from_slice(source);
                return true;
            }
        }
        false
    }
}

/// A little-endian u64 at `address`.
pub fn read_u64(memory: &dyn Memory, address: u64) -> Option<u64> {
    let mut bytes = [0u8; 8];
    memory
        .read(address, &mut bytes)
        .then(|| u64::from_le_bytes(bytes))
}

/// A little-endian i32 at `address`.
pub fn read_i32(memory: &dyn Memory, address: u64) -> Option<i32> {
    let mut bytes = [0u8; 4];
    memory
        .read(address, &mut bytes)
        .then(|| i32::from_le_bytes(bytes))
}

/// A byte at `address`.
pub fn read_u8(memory: &dyn Memory, address: u64) -> Option<u8> {
    let mut byte = [0u8; 1];
    memory.read(address, &mut byte).then_some(byte[0])
}

/// A little-endian u16 at `address`.
pub fn read_u16(memory: &dyn Memory, address: u64) -> Option<u16> {
    let mut bytes = [0u8; 2];
    memory
        .read(address, &mut bytes)
        .then(|| u16::from_le_bytes(bytes))
}
