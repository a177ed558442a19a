//! AArch64's PLT stubs, read from `.plt`.

use object::{Object, ObjectSection};

use super::decode::Instruction;
use crate::arch::plt_slot_names;

/// `bti c`, which starts each entry of a PLT built for branch target identification.
const BTI_C: u32 = 0xd503_245f;
/// `autia1716`, which authenticates the target in an entry of a PLT built with `-z pac-plt`.
const AUTIA1716: u32 = 0xd503_219f;
/// Bytes of an entry: `adrp, ldr, add, br`, and 8 more with `bti c` or `autia1716` (padded).
const PLT_ENTRY: u64 = 16;
const PLT_ENTRY_PROTECTED: u64 = 24;

/// The AArch64 PLT stubs of `file`, named `function@plt` as objdump and perf name them. No
/// symbol covers them, so a sample in a stub would otherwise take the name of whatever
/// precedes `.plt`. Each stub is decoded rather than counted, as entries are 16 bytes, or 24
/// with `bti c` or pointer authentication (`-z force-bti`, `-z pac-plt`): it loads its target
/// from a GOT slot (`adrp x16, page; ldr x17, [x16, #lo]`), and the `R_AARCH64_JUMP_SLOT`
/// relocation of that slot names the function. A stub starts at its `bti c` when it has one.
/// Entries whose slot has no symbol (the header, PLT0; an executable's `R_AARCH64_IRELATIVE`
/// ones) stay unnamed.
pub fn stubs(file: &object::File<'_>) -> Vec<(u64, u64, String)> {
    let Some(section) = file.section_by_name(".plt") else {
        return Vec::new();
    };
    let Ok(code) = section.data() else {
        return Vec::new();
    };
    let slots = plt_slot_names(file);
    if slots.is_empty() {
        return Vec::new();
    }
    let words: Vec<u32> = code
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    let address = |i: usize| section.address().wrapping_add(4 * i as u64);
    // (start, size, name) of each named entry, in address order.
    let mut entries: Vec<(u64, u64, &str)> = Vec::new();
    for i in 0..words.len().saturating_sub(1) {
        let Some(slot) = got_slot(words[i], words[i + 1], address(i)) else {
            continue;
        };
        let Some(name) = slots.get(&slot) else {
            continue;
        };
        let bti = i > 0 && words[i - 1] == BTI_C;
        let size = if bti || words.get(i + 3) == Some(&AUTIA1716) {
            PLT_ENTRY_PROTECTED
        } else {
            PLT_ENTRY
        };
        let start = if bti { address(i - 1) } else { address(i) };
        entries.push((start, size, name));
    }
    let end = section.address().wrapping_add(code.len() as u64);
    (0..entries.len())
        .map(|i| {
            let (start, size, name) = entries[i];
            let next = entries.get(i + 1).map_or(end, |&(next, _, _)| next);
            let size = size.min(next.saturating_sub(start));
            (start, size, format!("{name}@plt"))
        })
        .collect()
}

/// The GOT slot a stub at `address` loads from, if its words are `adrp x16, page; ldr x17,
/// [x16, #lo]`.
fn got_slot(first: u32, second: u32, address: u64) -> Option<u64> {
    let Instruction::Adrp { rd: 16, page } = Instruction::decode(first, address) else {
        return None;
    };
    match Instruction::decode(second, address.wrapping_add(4)) {
        Instruction::Load {
            rt: 17,
            rn: 16,
            offset,
            wide: true,
        } => Some(page.wrapping_add(offset)),
        _ => None,
    }
}
