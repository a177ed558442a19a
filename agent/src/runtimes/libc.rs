//! Where glibc keeps a thread's `pthread_getspecific` values, read from `libc.so.6`.
//!
//! CPython finds a thread's state through a pthread key (`autoTSSkey`), so the BPF walk must
//! do what `pthread_getspecific` does, from the thread's `fs` base. glibc keeps the values of
//! the first keys in an array inside `struct pthread`, whose layout is private and changes
//! between releases: it is read here from the function's own code rather than assumed.
//!
//! glibc 2.36 (x86-64), keys below 32:
//!
//! ```text
//! cmp  $0x1f,%edi ; ja  <second level>
//! mov  %edi,%eax ; add $0x31,%rax ; shl $0x4,%rax
//! add  %fs:0x10,%rax            # the thread's own `struct pthread *` (its fs base)
//! mov  0x8(%rax),%rdx           # `data` of that `struct pthread_key_data`
//! ```

use iced_x86::{Mnemonic, OpKind, Register};

use super::image::{Image, ImageError};
use crate::arch::x86_64::decode::instructions;

/// Why a libc's layout was not read.
#[derive(Debug, thiserror::Error)]
pub enum LibcError {
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error("no pthread_getspecific symbol")]
    NoSymbol,
    #[error("pthread_getspecific's code is not a form known here ({0})")]
    UnknownCode(&'static str),
}

/// Where a thread's value of pthread key `key` is, for `key < first_block`:
/// `fs_base + ((key + index_bias) << entry_shift) + value_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecificLayout {
    pub first_block: u32,
    pub index_bias: u64,
    pub entry_shift: u32,
    pub value_offset: u64,
}

impl SpecificLayout {
    /// The offset from the thread's `fs` base of key `key`'s value, when the key is in the
    /// first block.
    pub fn offset(&self, key: u32) -> Option<u64> {
        (key < self.first_block)
            .then(|| ((u64::from(key) + self.index_bias) << self.entry_shift) + self.value_offset)
    }
}

/// glibc's `struct pthread` starts with its TCB header, whose `self` pointer (at 0x10) is the
/// thread's `fs` base: the value `pthread_getspecific` adds is that base.
const TCB_SELF: u64 = 0x10;

/// Whether a binary may be a glibc: it defines `pthread_getspecific` among its dynamic
/// symbols. Read without hashing the symbols ([`Image::of`] does), as the loader asks it of
/// every binary a process maps.
pub fn may_be(elf: &object::File) -> bool {
    use object::{Object, ObjectSymbol};
    elf.dynamic_symbols().any(|symbol| {
        !symbol.is_undefined()
            && matches!(
                symbol.name_bytes(),
                Ok(b"pthread_getspecific" | b"__pthread_getspecific")
            )
    })
}

/// Reads `pthread_getspecific`'s layout from a libc image.
pub fn specific_layout(image: &Image) -> Result<SpecificLayout, LibcError> {
    let symbol = image
        .symbol("pthread_getspecific")
        .or_else(|| image.symbol("__pthread_getspecific"))
        .ok_or(LibcError::NoSymbol)?;
    let code = image.code("pthread_getspecific", symbol)?;
    let mut first_block = None;
    let mut index_bias = None;
    let mut entry_shift = None;
    let mut base = None;
    for instruction in instructions(code, symbol.address).take(40) {
        let immediate = matches!(
            instruction.op1_kind(),
            OpKind::Immediate8
                | OpKind::Immediate8to32
                | OpKind::Immediate8to64
                | OpKind::Immediate32
                | OpKind::Immediate32to64
        );
        match instruction.mnemonic() {
            Mnemonic::Cmp
                if first_block.is_none()
                    && instruction.op0_register() == Register::EDI
                    && immediate =>
            {
                first_block = Some(instruction.immediate(1) + 1);
            }
            Mnemonic::Add if index_bias.is_none() && first_block.is_some() && immediate => {
                index_bias = Some(instruction.immediate(1));
            }
            Mnemonic::Shl if entry_shift.is_none() && index_bias.is_some() && immediate => {
                entry_shift = Some(instruction.immediate(1));
            }
            Mnemonic::Add
                if base.is_none()
                    && entry_shift.is_some()
                    && instruction.op1_kind() == OpKind::Memory
                    && instruction.memory_segment() == Register::FS
                    && instruction.memory_base() == Register::None
                    && instruction.memory_index() == Register::None =>
            {
                if instruction.memory_displacement64() != TCB_SELF {
                    return Err(LibcError::UnknownCode(
                        "the fs operand is not the TCB's self pointer",
                    ));
                }
                base = Some(instruction.op0_register());
            }
            Mnemonic::Mov
                if base.is_some()
                    && instruction.op1_kind() == OpKind::Memory
                    && Some(instruction.memory_base()) == base
                    && instruction.memory_index() == Register::None =>
            {
                let (Some(first_block), Some(index_bias), Some(entry_shift)) =
                    (first_block, index_bias, entry_shift)
                else {
                    break;
                };
                let layout = SpecificLayout {
                    first_block: u32::try_from(first_block)
                        .map_err(|_| LibcError::UnknownCode("first block"))?,
                    index_bias,
                    entry_shift: u32::try_from(entry_shift)
                        .ok()
                        .filter(|&s| s < 16)
                        .ok_or(LibcError::UnknownCode("entry size"))?,
                    value_offset: instruction.memory_displacement64(),
                };
                // A `struct pthread` is a few KiB: anything past that is not its array.
                if layout.first_block > 1024
                    || layout
                        .offset(layout.first_block - 1)
                        .is_none_or(|o| o > 1 << 16)
                {
                    return Err(LibcError::UnknownCode("offsets beyond struct pthread"));
                }
                return Ok(layout);
            }
            _ => {}
        }
    }
    Err(LibcError::UnknownCode(
        "the first-block lookup was not found",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_glibc_keeps_its_first_keys_in_struct_pthread() {
        // Debian 12's glibc 2.36, which these machines run.
        let data = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").expect("the host's libc");
        let elf = crate::binary::elf::Elf::parse(&data).unwrap();
        let image = Image::of(&elf);
        let layout = specific_layout(&image).unwrap();
        assert_eq!(
            layout,
            SpecificLayout {
                first_block: 32,
                index_bias: 0x31,
                entry_shift: 4,
                value_offset: 8,
            }
        );
        assert_eq!(layout.offset(0), Some(0x318));
        assert_eq!(layout.offset(32), None);
    }

    #[test]
    fn code_of_another_shape_is_refused() {
        // A libc whose pthread_getspecific is `xor eax,eax; ret`.
        let data =
            crate::runtimes::image::test_elf(&[("pthread_getspecific", &[0x31, 0xc0, 0xc3])]);
        let elf = crate::binary::elf::Elf::parse(&data).unwrap();
        let image = Image::of(&elf);
        assert!(matches!(
            specific_layout(&image),
            Err(LibcError::UnknownCode(_))
        ));
        let data = crate::runtimes::image::test_elf(&[("other", &[0xc3])]);
        let elf = crate::binary::elf::Elf::parse(&data).unwrap();
        let image = Image::of(&elf);
        assert!(matches!(specific_layout(&image), Err(LibcError::NoSymbol)));
    }
}
