//! What differs between the architectures scorch runs on, one module each, with the same
//! names in each: the one for the machine scorch is built for is [`native`]. This module
//! holds what the rest of the agent asks of them, in words no architecture owns: the places
//! and layouts the instruction decoders find, and the relocation kinds the readers resolve.
//!
//! Each architecture's module has:
//! - the instruction patterns the runtime readers recognise in compiled code (`decode`:
//!   CPython's `_PyRuntime` and thread state, glibc's `pthread_getspecific`), with the same
//!   functions and contracts in each; the dispatchers below refuse a third architecture's
//!   code by name;
//! - its dynamic relocation kinds (`relocation`);
//! - its PLT stubs, named `function@plt` (`plt`);
//! - where the kernel keeps a thread's thread pointer (`THREAD_POINTER`), and on which side
//!   of it an executable's thread-locals are (`executable_thread_local`).
//!
//! Elsewhere, in files of their own named for the architecture: the BPF program's registers,
//! user-mode test, signal frame and thread pointer (agent-ebpf's `arch/`), the unwind rows'
//! register numbers, PLT, signal and Go frame rows (`unwind/convert/`).

pub mod aarch64;
pub mod x86_64;

#[cfg(target_arch = "aarch64")]
pub use aarch64 as native;
#[cfg(target_arch = "x86_64")]
pub use x86_64 as native;

use std::collections::HashMap;

use object::{
    Architecture, Object, ObjectSymbol, ObjectSymbolTable, RelocationFlags, RelocationTarget,
};

/// Where a value lies: at a fixed address, or `offset` bytes past the address a pointer
/// slot holds (a shared library reaches its own exported globals through its GOT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Fixed(u64),
    Pointed { slot: u64, offset: u64 },
}

/// What a function puts in its first argument register before its first call or tail jump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirstArgument {
    /// A 32-bit value loaded from this place.
    Loaded(Place),
    /// This place's address itself.
    Address(Place),
}

/// Where a thread's value of pthread key `key` is, for `key < first_block`:
/// `thread_pointer + ((key + index_bias) << entry_shift) + value_offset`, as glibc's
/// `pthread_getspecific` computes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecificLayout {
    pub first_block: u32,
    pub index_bias: u64,
    pub entry_shift: u32,
    pub value_offset: u64,
}

impl SpecificLayout {
    /// The offset from the thread pointer of key `key`'s value, when the key is in the first
    /// block.
    pub fn offset(&self, key: u32) -> Option<u64> {
        (key < self.first_block).then(|| {
            ((u64::from(key) + self.index_bias) << self.entry_shift).wrapping_add(self.value_offset)
        })
    }
}

/// What a dynamic relocation leaves in the word it names, for the kinds the readers resolve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relocation {
    /// The load bias plus the addend.
    Relative,
    /// A symbol's address plus the addend (a data word).
    Absolute,
    /// A GOT slot holding a symbol's address.
    GlobalData,
    /// A PLT's GOT slot, bound to a function at its first call or at load.
    JumpSlot,
    /// A slot the loader fills with what the resolver at the addend returns (a GNU ifunc).
    IndirectRelative,
}

/// The kind of ELF relocation `r_type` in a file for `architecture`; `None` for the kinds no
/// reader resolves, and for the architectures scorch has no module for.
pub fn relocation(architecture: Architecture, r_type: u32) -> Option<Relocation> {
    match architecture {
        Architecture::X86_64 => x86_64::relocation(r_type),
        Architecture::Aarch64 => aarch64::relocation(r_type),
        _ => None,
    }
}

/// Why code of `architecture` is not decoded: only x86-64's and AArch64's patterns are known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no decoder for {architecture:?} code")]
pub struct NoDecoder {
    pub architecture: Architecture,
}

/// What a function of `architecture` puts in its first argument register before its first
/// call or tail jump ([`x86_64::decode::first_argument`], [`aarch64::decode::first_argument`]).
pub fn first_argument(
    architecture: Architecture,
    code: &[u8],
    ip: u64,
) -> Result<Option<FirstArgument>, NoDecoder> {
    match architecture {
        Architecture::X86_64 => Ok(x86_64::decode::first_argument(code, ip)),
        Architecture::Aarch64 => Ok(aarch64::decode::first_argument(code, ip)),
        _ => Err(NoDecoder { architecture }),
    }
}

/// The thread-pointer offset of the thread-local a function returns
/// ([`x86_64::decode::returned_thread_local`], [`aarch64::decode::returned_thread_local`]).
pub fn returned_thread_local(
    architecture: Architecture,
    code: &[u8],
    ip: u64,
) -> Result<Option<i64>, NoDecoder> {
    match architecture {
        Architecture::X86_64 => Ok(x86_64::decode::returned_thread_local(code, ip)),
        Architecture::Aarch64 => Ok(aarch64::decode::returned_thread_local(code, ip)),
        _ => Err(NoDecoder { architecture }),
    }
}

/// Whether `offset` from the thread pointer can be one of an executable's own thread-locals
/// (the local-exec model), on which side of the thread pointer its TLS block lies
/// ([`x86_64::executable_thread_local`], [`aarch64::executable_thread_local`]); `false` for
/// an architecture scorch has no module for.
pub fn executable_thread_local(architecture: Architecture, offset: i64) -> bool {
    match architecture {
        Architecture::X86_64 => x86_64::executable_thread_local(offset),
        Architecture::Aarch64 => aarch64::executable_thread_local(offset),
        _ => false,
    }
}

/// Where a function's direct jumps land outside it ([`x86_64::decode::jumps_out`],
/// [`aarch64::decode::jumps_out`]).
pub fn jumps_out(architecture: Architecture, code: &[u8], ip: u64) -> Result<Vec<u64>, NoDecoder> {
    match architecture {
        Architecture::X86_64 => Ok(x86_64::decode::jumps_out(code, ip)),
        Architecture::Aarch64 => Ok(aarch64::decode::jumps_out(code, ip)),
        _ => Err(NoDecoder { architecture }),
    }
}

/// Where the pointer lies that a function of `architecture` reads from a global before it
/// leaves ([`x86_64::decode::loaded_pointer`]). Only x86-64's forms are known: V8, its one
/// reader, is walked on x86-64 alone.
pub fn loaded_pointer(
    architecture: Architecture,
    code: &[u8],
    ip: u64,
) -> Result<Option<Place>, NoDecoder> {
    match architecture {
        Architecture::X86_64 => Ok(x86_64::decode::loaded_pointer(code, ip)),
        _ => Err(NoDecoder { architecture }),
    }
}

/// glibc's `pthread_getspecific` layout from its code ([`x86_64::decode::pthread_specific`],
/// [`aarch64::decode::pthread_specific`]): the inner error says which form the code was not.
pub fn pthread_specific(
    architecture: Architecture,
    code: &[u8],
    ip: u64,
) -> Result<Result<SpecificLayout, &'static str>, NoDecoder> {
    match architecture {
        Architecture::X86_64 => Ok(x86_64::decode::pthread_specific(code, ip)),
        Architecture::Aarch64 => Ok(aarch64::decode::pthread_specific(code, ip)),
        _ => Err(NoDecoder { architecture }),
    }
}

/// The PLT stubs of `file`, as `(address, size, "function@plt")`, as objdump and perf name
/// them; none for an architecture scorch has no module for.
pub fn plt_stubs(file: &object::File<'_>) -> Vec<(u64, u64, String)> {
    match file.architecture() {
        Architecture::X86_64 => x86_64::plt::stubs(file),
        Architecture::Aarch64 => aarch64::plt::stubs(file),
        _ => Vec::new(),
    }
}

/// The name of the function each of `file`'s PLT slots is bound to, by the slot's address:
/// the symbols of its jump-slot and GOT relocations, which each architecture's stubs load
/// their targets from; an ifunc's slot, which has no symbol, is `*ABS*+0xresolver`, as
/// objdump names it.
fn plt_slot_names(file: &object::File<'_>) -> HashMap<u64, String> {
    let (Some(relocations), Some(dynsym)) =
        (file.dynamic_relocations(), file.dynamic_symbol_table())
    else {
        return HashMap::new();
    };
    let architecture = file.architecture();
    let mut slots = HashMap::new();
    for (slot, entry) in relocations {
        let RelocationFlags::Elf { r_type } = entry.flags() else {
            continue;
        };
        let name = match (relocation(architecture, r_type), entry.target()) {
            (
                Some(Relocation::JumpSlot | Relocation::GlobalData),
                RelocationTarget::Symbol(index),
            ) => dynsym
                .symbol_by_index(index)
                .ok()
                .and_then(|symbol| symbol.name().ok())
                .filter(|name| !name.is_empty())
                .map(str::to_owned),
            (Some(Relocation::IndirectRelative), RelocationTarget::Absolute) => {
                Some(format!("*ABS*+{:#x}", entry.addend()))
            }
            _ => None,
        };
        if let Some(name) = name {
            slots.insert(slot, name);
        }
    }
    slots
}
