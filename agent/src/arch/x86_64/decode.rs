//! The few x86-64 instruction patterns the runtime readers recognise in compiled code, on
//! the iced-x86 decoder.
//!
//! Compiled code is read linearly from a function's start: the functions read here are
//! small, or only their direct branches are wanted, and GCC and Clang keep jump tables out
//! of `.text`.

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind, Register};

use crate::arch::{FirstArgument, Place, SpecificLayout};

/// The instructions of `code`, which starts at address `ip`; an undecodable byte ends them.
pub fn instructions(code: &[u8], ip: u64) -> impl Iterator<Item = Instruction> + '_ {
    let mut decoder = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
    std::iter::from_fn(move || {
        if !decoder.can_decode() {
            return None;
        }
        let instruction = decoder.decode();
        (!instruction.is_invalid()).then_some(instruction)
    })
}

/// The place a memory operand names: a global (no base but `rip`, no index), or a fixed
/// offset from a register that holds a pointer loaded from a global slot.
fn operand_place(instruction: &Instruction, slots: &[(Register, u64)]) -> Option<Place> {
    if instruction.memory_index() != Register::None {
        return None;
    }
    match instruction.memory_base() {
        Register::RIP => Some(Place::Fixed(instruction.ip_rel_memory_address())),
        Register::None if instruction.memory_segment() == Register::DS => {
            Some(Place::Fixed(instruction.memory_displacement64()))
        }
        base => slots
            .iter()
            .find(|(register, _)| *register == base)
            .map(|&(_, slot)| Place::Pointed {
                slot,
                offset: instruction.memory_displacement64(),
            }),
    }
}

/// What the function at `ip` puts in `rdi` (or `edi`) before its first call or
/// unconditional jump, following the fall-through path; `None` when it is not one of these
/// forms or the function returns first:
/// - [`FirstArgument::Loaded`]: `mov edi, [address]`;
/// - [`FirstArgument::Address`]: `mov edi, imm`, `lea rdi, [rip + x]`, or
///   `mov rax, [rip + got]; lea rdi, [rax + x]`.
pub fn first_argument(code: &[u8], ip: u64) -> Option<FirstArgument> {
    let mut argument = None;
    // 64-bit registers holding a pointer loaded from a global slot, and that slot.
    let mut slots: Vec<(Register, u64)> = Vec::new();
    for instruction in instructions(code, ip).take(64) {
        match instruction.flow_control() {
            FlowControl::Call
            | FlowControl::UnconditionalBranch
            | FlowControl::IndirectBranch
            | FlowControl::IndirectCall => return argument,
            FlowControl::Return | FlowControl::Exception | FlowControl::Interrupt => return None,
            _ => {}
        }
        if instruction.op_count() == 0 || instruction.op0_kind() != OpKind::Register {
            continue;
        }
        let target = instruction.op0_register();
        if !matches!(
            target,
            Register::EDI | Register::RDI | Register::DI | Register::DIL
        ) {
            // Whatever else writes a register ends what it held.
            let full = target.full_register();
            slots.retain(|(register, _)| *register != full);
            if instruction.mnemonic() == Mnemonic::Mov
                && instruction.op1_kind() == OpKind::Memory
                && target.is_gpr64()
            {
                if let Some(Place::Fixed(slot)) = operand_place(&instruction, &[]) {
                    slots.push((target, slot));
                }
            }
            continue;
        }
        argument = match (instruction.mnemonic(), instruction.op1_kind()) {
            (Mnemonic::Mov, OpKind::Memory) if target == Register::EDI => {
                operand_place(&instruction, &slots).map(FirstArgument::Loaded)
            }
            (Mnemonic::Lea, OpKind::Memory) if target == Register::RDI => {
                operand_place(&instruction, &slots).map(FirstArgument::Address)
            }
            (Mnemonic::Mov, OpKind::Register) if target == Register::RDI => slots
                .iter()
                .find(|(register, _)| *register == instruction.op1_register())
                .map(|&(_, slot)| FirstArgument::Address(Place::Pointed { slot, offset: 0 })),
            (
                Mnemonic::Mov,
                OpKind::Immediate32 | OpKind::Immediate32to64 | OpKind::Immediate64,
            ) => Some(FirstArgument::Address(Place::Fixed(
                instruction.immediate(1),
            ))),
            // Anything else written to the register: not a form known here.
            _ => None,
        };
    }
    None
}

/// The offset from the thread pointer (`fs`) of the thread-local the function at `ip`
/// returns, when that is all it does: `mov %fs:OFFSET, %rax` then `ret`, as a program reads
/// its own thread-locals (the local-exec model: the offset is fixed at link time). `None` for
/// any other form, such as a shared library's call to `__tls_get_addr`.
pub fn returned_thread_local(code: &[u8], ip: u64) -> Option<i64> {
    let mut returned = None;
    for instruction in instructions(code, ip).take(16) {
        match instruction.flow_control() {
            FlowControl::Return => return returned,
            FlowControl::Next => {}
            _ => return None,
        }
        if instruction.op_count() == 0
            || instruction.op0_kind() != OpKind::Register
            || instruction.op0_register().full_register() != Register::RAX
        {
            continue;
        }
        let from_fs = instruction.mnemonic() == Mnemonic::Mov
            && instruction.op0_register() == Register::RAX
            && instruction.op1_kind() == OpKind::Memory
            && instruction.memory_segment() == Register::FS
            && instruction.memory_base() == Register::None
            && instruction.memory_index() == Register::None;
        returned = from_fs.then(|| instruction.memory_displacement64() as i64);
    }
    None
}

/// The targets of the direct jumps (conditional or not, never calls) in `code`, which
/// starts at `ip`, that leave `code`: where a compiler put a function's split-off parts.
pub fn jumps_out(code: &[u8], ip: u64) -> Vec<u64> {
    let end = ip + code.len() as u64;
    let mut targets: Vec<u64> = instructions(code, ip)
        .filter(|i| {
            matches!(
                i.flow_control(),
                FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch
            ) && matches!(i.op0_kind(), OpKind::NearBranch64)
        })
        .map(|i| i.near_branch_target())
        .filter(|&target| !(ip..end).contains(&target))
        .collect();
    targets.sort_unstable();
    targets.dedup();
    targets
}

/// Where the pointer lies that the function at `ip` reads from a global before its first
/// call, jump or return, as an accessor of a static pointer does (V8's
/// `IsolateGroup::GetDefault`):
/// - `lea r, [rip + x]; mov r2, [r + d]`: at [`Place::Fixed`] `x + d`;
/// - `mov r, [rip + got]; mov r2, [r + d]`: `d` past what the GOT slot holds
///   ([`Place::Pointed`]);
/// - `mov r, [rip + x]` and no load through `r`: at `x` itself.
///
/// `None` when the function reads no global so before it leaves.
pub fn loaded_pointer(code: &[u8], ip: u64) -> Option<Place> {
    // Registers holding a global's address (from `lea`), and those holding a word loaded
    // from a global slot.
    let mut addresses: Vec<(Register, u64)> = Vec::new();
    let mut slots: Vec<(Register, u64)> = Vec::new();
    let mut direct = None;
    for instruction in instructions(code, ip).take(64) {
        if instruction.flow_control() != FlowControl::Next {
            break;
        }
        if instruction.op_count() != 2 || instruction.op0_kind() != OpKind::Register {
            continue;
        }
        let target = instruction.op0_register();
        let loads = instruction.op1_kind() == OpKind::Memory && target.is_gpr64();
        let place = loads.then(|| {
            let base = instruction.memory_base();
            let from = |held: &[(Register, u64)]| {
                held.iter()
                    .find(|(register, _)| *register == base)
                    .map(|&(_, at)| at)
            };
            (
                operand_place(&instruction, &[]),
                from(&addresses),
                from(&slots),
            )
        });
        let full = target.full_register();
        addresses.retain(|(register, _)| *register != full);
        slots.retain(|(register, _)| *register != full);
        let Some((global, address, slot)) = place else {
            continue;
        };
        let displacement = instruction.memory_displacement64();
        match instruction.mnemonic() {
            Mnemonic::Lea => {
                if let Some(Place::Fixed(at)) = global {
                    addresses.push((target, at));
                }
            }
            Mnemonic::Mov if instruction.memory_index() == Register::None => {
                if let Some(at) = address {
                    return Some(Place::Fixed(at.wrapping_add(displacement)));
                }
                if let Some(slot) = slot {
                    return Some(Place::Pointed {
                        slot,
                        offset: displacement,
                    });
                }
                if let Some(Place::Fixed(at)) = global {
                    slots.push((target, at));
                    direct.get_or_insert(at);
                }
            }
            _ => {}
        }
    }
    direct.map(Place::Fixed)
}

/// glibc's `struct pthread` starts with its TCB header, whose `self` pointer (at 0x10) is the
/// thread's `fs` base: the value `pthread_getspecific` adds is that base.
const TCB_SELF: u64 = 0x10;

/// The layout `pthread_getspecific`, whose code starts at `ip`, reads its first block of
/// keys with (glibc 2.36, keys below 32):
///
/// ```text
/// cmp  $0x1f,%edi ; ja  <second level>
/// mov  %edi,%eax ; add $0x31,%rax ; shl $0x4,%rax
/// add  %fs:0x10,%rax            # the thread's own `struct pthread *` (its fs base)
/// mov  0x8(%rax),%rdx           # `data` of that `struct pthread_key_data`
/// ```
///
/// The error says which part is not a form known here.
pub fn pthread_specific(code: &[u8], ip: u64) -> Result<SpecificLayout, &'static str> {
    let mut first_block = None;
    let mut index_bias = None;
    let mut entry_shift = None;
    let mut base = None;
    for instruction in instructions(code, ip).take(40) {
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
                    return Err("the fs operand is not the TCB's self pointer");
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
                    first_block: u32::try_from(first_block).map_err(|_| "first block")?,
                    index_bias,
                    entry_shift: u32::try_from(entry_shift)
                        .ok()
                        .filter(|&s| s < 16)
                        .ok_or("entry size")?,
                    value_offset: instruction.memory_displacement64(),
                };
                // A `struct pthread` is a few KiB: anything past that is not its array.
                if layout.first_block > 1024
                    || layout
                        .offset(layout.first_block - 1)
                        .is_none_or(|o| o > 1 << 16)
                {
                    return Err("offsets beyond struct pthread");
                }
                return Ok(layout);
            }
            _ => {}
        }
    }
    Err("the first-block lookup was not found")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_static_pointer_read_through_its_address_or_its_got_slot() {
        // libnode 137's IsolateGroup::GetDefault: lea 0x396b2cd(%rip),%rax; mov (%rax),%rax;
        // lock addl $1,(%rax); ...; call
        let code = [
            0x55, 0x48, 0x89, 0xe5, 0x53, 0x48, 0x89, 0xfb, 0x48, 0x83, 0xec,
            0x18, // prologue
            0x48, 0x8d, 0x05, 0xcd, 0xb2, 0x96, 0x03, // lea 0x396b2cd(%rip),%rax
            0x48, 0x8b, 0x00, // mov (%rax),%rax
            0xf0, 0x83, 0x00, 0x01, // lock addl $0x1,(%rax)
            0xe8, 0xa9, 0xc8, 0x68, 0xff, // call
        ];
        assert_eq!(
            loaded_pointer(&code, 0xcf_a500),
            Some(Place::Fixed(0x466_57e0))
        );
        // mov 0x100(%rip),%rax (a GOT slot); mov 0x8(%rax),%rax; ret
        let code = [
            0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00, 0x48, 0x8b, 0x40, 0x08, 0xc3,
        ];
        assert_eq!(
            loaded_pointer(&code, 0x1000),
            Some(Place::Pointed {
                slot: 0x1107,
                offset: 8
            })
        );
        // mov 0x100(%rip),%rax; lock addl $1,(%rax); ret: the pointer itself.
        let code = [
            0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00, 0xf0, 0x83, 0x00, 0x01, 0xc3,
        ];
        assert_eq!(loaded_pointer(&code, 0x1000), Some(Place::Fixed(0x1107)));
        // A register overwritten before it is read through forgets the address it held.
        let code = [
            0x48, 0x8d, 0x05, 0x00, 0x01, 0x00, 0x00, // lea 0x100(%rip),%rax
            0x48, 0x89, 0xf8, // mov %rdi,%rax
            0x48, 0x8b, 0x00, // mov (%rax),%rax
            0xc3,
        ];
        assert_eq!(loaded_pointer(&code, 0x1000), None);
    }

    #[test]
    fn a_key_loaded_from_a_global_before_a_tail_jump() {
        // cmpl $0,0x563d50(%rip); je +0; mov 0x563d50(%rip),%edi; jmp +0
        let code = [
            0x48, 0x83, 0x3d, 0x50, 0x3d, 0x56, 0x00, 0x00, // cmpq $0,0x563d50(%rip)
            0x0f, 0x84, 0x00, 0x00, 0x00, 0x00, // je
            0x8b, 0x3d, 0x50, 0x3d, 0x56, 0x00, // mov 0x563d50(%rip),%edi
            0xe9, 0x00, 0x00, 0x00, 0x00, // jmp
        ];
        let ip = 0x4f_7c30;
        // rip of the mov's end is ip + 20.
        assert_eq!(
            first_argument(&code, ip),
            Some(FirstArgument::Loaded(Place::Fixed(ip + 20 + 0x56_3d50)))
        );
    }

    #[test]
    fn an_address_given_as_an_immediate() {
        // mov $0xba10e0,%edi; jmp
        let code = [0xbf, 0xe0, 0x10, 0xba, 0x00, 0xe9, 0, 0, 0, 0];
        assert_eq!(
            first_argument(&code, 0x1000),
            Some(FirstArgument::Address(Place::Fixed(0xba_10e0)))
        );
        // A function that returns before any call has no argument to give.
        assert_eq!(first_argument(&[0x31, 0xc0, 0xc3], 0x1000), None);
        // rdi computed from another register: unknown.
        assert_eq!(
            first_argument(&[0x48, 0x89, 0xc7, 0xe9, 0, 0, 0, 0], 0x1000),
            None
        );
    }

    #[test]
    fn a_global_reached_through_a_pointer_slot() {
        // libpython3.11.so's PyGILState_GetThisThreadState: the address of _PyRuntime from its
        // GOT slot, then the key's Py_tss_t inside it.
        let code = [
            0x48, 0x8b, 0x05, 0x09, 0xd8, 0x1a, 0x00, // mov 0x1ad809(%rip),%rax
            0x48, 0x83, 0xb8, 0x48, 0x02, 0x00, 0x00, 0x00, // cmpq $0x0,0x248(%rax)
            0x74, 0x0f, // je
            0x48, 0x8d, 0xb8, 0x50, 0x02, 0x00, 0x00, // lea 0x250(%rax),%rdi
            0xe9, 0xf3, 0x3b, 0xe6, 0xff, // jmp PyThread_tss_get@plt
        ];
        let ip = 0x29_6520;
        assert_eq!(
            first_argument(&code, ip),
            Some(FirstArgument::Address(Place::Pointed {
                slot: 0x44_3d30,
                offset: 0x250
            }))
        );
        // The register overwritten in between: unknown.
        let mut clobbered = code.to_vec();
        clobbered.splice(17..17, [0x31, 0xc0]); // xor %eax,%eax
        assert_eq!(first_argument(&clobbered, ip), None);
    }

    #[test]
    fn a_thread_local_returned() {
        // Debian's python3.15 PyGILState_GetThisThreadState: endbr64; mov %fs:-0x28,%rax; ret
        let code = [
            0xf3, 0x0f, 0x1e, 0xfa, // endbr64
            0x64, 0x48, 0x8b, 0x04, 0x25, 0xd8, 0xff, 0xff, 0xff, // mov %fs:0xffff..d8,%rax
            0xc3, // ret
        ];
        assert_eq!(returned_thread_local(&code, 0x42_fa7d), Some(-0x28));
        // rax overwritten before the return: not the thread-local.
        let mut clobbered = code.to_vec();
        clobbered.splice(13..13, [0x31, 0xc0]); // xor %eax,%eax
        assert_eq!(returned_thread_local(&clobbered, 0x42_fa7d), None);
        // A shared library's general-dynamic access calls __tls_get_addr: not this form.
        let dynamic = [
            0x48, 0x8d, 0x3d, 0x61, 0xa6, 0x4a, 0x00, // lea 0x4aa661(%rip),%rdi
            0xe8, 0x00, 0x00, 0x00, 0x00, // call __tls_get_addr@plt
            0x48, 0x8b, 0x40, 0x28, // mov 0x28(%rax),%rax
            0xc3, // ret
        ];
        assert_eq!(returned_thread_local(&dynamic, 0x3c_f128), None);
    }

    #[test]
    fn jumps_that_leave_the_function() {
        // je -0x100 (out), jmp +2 (in), jmp +0x1000 (out)
        let code = [
            0x0f, 0x84, 0x00, 0xff, 0xff, 0xff, // je ip+6-0x100
            0xeb, 0x00, // jmp ip+8
            0xe9, 0x00, 0x10, 0x00, 0x00, // jmp ip+13+0x1000
        ];
        let ip = 0x10_000;
        assert_eq!(jumps_out(&code, ip), [ip + 6 - 0x100, ip + 13 + 0x1000]);
    }
}
