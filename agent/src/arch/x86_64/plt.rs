//! x86-64's PLT stubs, read from `.plt`, `.plt.sec` and `.plt.got`.

use object::{Object, ObjectSection};

use crate::arch::plt_slot_names;

/// Bytes of an x86-64 PLT entry in `.plt` and `.plt.sec`, and in `.plt.got` with IBT.
const PLT_ENTRY: u64 = 16;

/// The x86-64 PLT stubs of `file`, named `function@plt` as objdump and perf name them. No
/// symbol covers them, so a sample in a stub would otherwise take the name of whatever
/// precedes `.plt` (usually the unsized `_init`). Each stub is decoded rather than counted:
/// it jumps through a GOT slot (`jmp *disp32(%rip)`, after an optional `endbr64` and `bnd`
/// prefix), and the dynamic relocation of that slot (`R_X86_64_JUMP_SLOT` for `.plt` and
/// `.plt.sec`, `R_X86_64_GLOB_DAT` for `.plt.got`) names the function. Entries that decode to
/// no relocated slot (`.plt`'s header, lazy stubs beside a `.plt.sec`) stay unnamed.
pub fn stubs(file: &object::File<'_>) -> Vec<(u64, u64, String)> {
    let slots = plt_slot_names(file);
    if slots.is_empty() {
        return Vec::new();
    }
    let mut stubs = Vec::new();
    for name in [".plt", ".plt.sec", ".plt.got"] {
        let Some(section) = file.section_by_name(name) else {
            continue;
        };
        let Ok(code) = section.data() else { continue };
        let mut at = 0usize;
        while at < code.len() {
            let entry = &code[at..];
            let endbr = entry.starts_with(&[0xf3, 0x0f, 0x1e, 0xfa]);
            // `.plt.got` entries are 8 bytes unless IBT made them 16.
            let size = if name == ".plt.got" && !endbr {
                8
            } else {
                PLT_ENTRY
            };
            let address = section.address() + at as u64;
            let named = rip_jump_slot(entry, endbr, address).and_then(|slot| slots.get(&slot));
            if let Some(function) = named {
                stubs.push((address, size, format!("{function}@plt")));
            }
            at += size as usize;
        }
    }
    stubs
}

/// The GOT slot an entry starting at `address` jumps through, if it starts with
/// `[endbr64] [bnd] jmp *disp32(%rip)`.
fn rip_jump_slot(entry: &[u8], endbr: bool, address: u64) -> Option<u64> {
    let mut at = if endbr { 4 } else { 0 };
    if entry.get(at) == Some(&0xf2) {
        at += 1;
    }
    if entry.get(at..at + 2)? != [0xff, 0x25] {
        return None;
    }
    let displacement = i32::from_le_bytes(entry.get(at + 2..at + 6)?.try_into().ok()?);
    let next = address.checked_add(at as u64 + 6)?;
    Some(next.wrapping_add_signed(i64::from(displacement)))
}
