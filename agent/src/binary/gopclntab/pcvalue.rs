//! Pc-value tables: runs of a value over pcs, varint-encoded deltas.

use super::*;

/// One run of a pc-value table: `value` holds for pcs in `start..end`.
pub(super) struct Run {
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) value: i32,
}

/// Decoding of one pc-value table: pairs of varints, a zig-zag value delta and a pc delta,
/// ended by a zero value delta after the first pair.
pub(super) struct PcValues<'d> {
    pub(super) tab: Bytes<'d>,
    pub(super) pos: u64,
    pub(super) pc: u64,
    pub(super) entry: u64,
    pub(super) value: i32,
    /// The unit of the pc deltas, in bytes (`minLC`).
    pub(super) quantum: u8,
}

impl PcValues<'_> {
    pub(super) fn next_run(&mut self) -> Result<Option<Run>> {
        let (value_delta, n) = self.tab.varint(self.pos)?;
        // The first pair may have a zero delta (the value -1 + 1 = 0 at the entry).
        if value_delta == 0 && self.pc != self.entry {
            return Ok(None);
        }
        let delta = ((value_delta >> 1) as i32) ^ -((value_delta & 1) as i32);
        self.value = self.value.wrapping_add(delta);
        let (pc_delta, m) = self.tab.varint(self.pos + n)?;
        self.pos += n + m;
        let start = self.pc;
        // The delta counts quanta (`minLC`: 1 byte, or 4 on arm64). pc + 4 * 2^32 cannot
        // overflow a real address.
        self.pc = self
            .pc
            .saturating_add(u64::from(pc_delta) * u64::from(self.quantum));
        Ok(Some(Run {
            start,
            end: self.pc,
            value: self.value,
        }))
    }
}
