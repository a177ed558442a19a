//! The few AArch64 instruction patterns the runtime readers recognise in compiled code, on a
//! decoder of their own.
//!
//! Why not a crate: the readers follow a handful of registers through a function and must
//! know when anything else overwrote one. iced-x86 says which registers an instruction
//! writes; no A64 decoder crate does (yaxpeax-arm, the maintained pure-Rust one, lists
//! operands without saying which are written), so on top of one the readers would still need
//! a table of opcodes (stores, pairs, exclusives, atomics, writeback forms). A64's fixed
//! 4-byte words make that a rule on the encoding group instead ([`Instruction::Other`]): a
//! data-processing instruction writes bits 0-4, a load or store at most the registers in bits
//! 0-4, 5-9, 10-14 and 16-20. The forms read exactly are a dozen bit patterns of the Arm
//! Architecture Reference Manual's "A64 Instruction Set Encoding", each tested below against
//! bytes `aarch64-linux-gnu-objdump` names.
//!
//! Code is read linearly from a function's start, as on x86-64. A word that is no instruction
//! ends what is read along the fall-through path; [`jumps_out`] reads past it, as fixed-size
//! words never lose their alignment.

use crate::arch::{FirstArgument, Place, SpecificLayout};

/// The general registers x0 to x30; number 31 is `sp` or `xzr`, never followed here.
const REGISTERS: usize = 31;

/// One instruction, in the forms the readers follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Instruction {
    /// `adrp xd, page`: the 4 KiB page at an offset from this instruction's page.
    Adrp { rd: u8, page: u64 },
    /// `add`/`sub` `xd, xn, #imm{, lsl #12}` (negative for `sub`); `wide` for x registers.
    AddImmediate {
        rd: u8,
        rn: u8,
        imm: i64,
        wide: bool,
    },
    /// `add xd, xn, xm`, unshifted.
    AddRegister { rd: u8, rn: u8, rm: u8 },
    /// `mov xd, xm` or `mov wd, wm` (`orr` from the zero register).
    Move { rd: u8, rm: u8, wide: bool },
    /// `ubfiz xd, xn, #shift, #width` (`lsl` when the width reaches the top): the low
    /// `width` bits of `xn`, shifted left.
    ShiftLeft {
        rd: u8,
        rn: u8,
        shift: u32,
        width: u32,
    },
    /// `cmp xn|wn, #imm` (`subs` into the zero register).
    Compare { rn: u8, imm: u64 },
    /// `ldr xt|wt, [xn, #offset]`, the unsigned-offset form.
    Load {
        rt: u8,
        rn: u8,
        offset: u64,
        wide: bool,
    },
    /// `mrs xt, tpidr_el0`: the thread pointer.
    ThreadPointer { rt: u8 },
    /// `b target`.
    Branch { target: u64 },
    /// `b.cond`, `cbz`/`cbnz`, `tbz`/`tbnz`; `condition` is `b.cond`'s (`None` for the
    /// register tests).
    ConditionalBranch {
        target: u64,
        condition: Option<Condition>,
    },
    /// `bl target`.
    Call { target: u64 },
    /// `br`, and its pointer-authenticating forms.
    IndirectBranch,
    /// `blr`, and its pointer-authenticating forms.
    IndirectCall,
    /// `ret`, `eret` and their pointer-authenticating forms.
    Return,
    /// `svc`, `brk`, `udf` and the rest of the exception-generating class.
    Exception,
    /// Anything else: the registers (bit n for xn) it may write.
    Other { writes: u32 },
    /// An encoding the architecture leaves unallocated, or one of an extension (SME) whose
    /// effects are not worked out here.
    Undefined,
}

/// `b.cond`'s condition, the two the bound checks use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// Unsigned higher (`b.hi`).
    Higher,
    /// Unsigned higher or same (`b.hs`, also written `b.cs`).
    HigherOrSame,
    Other(u8),
}

/// The bits `from..from + width` of `word`.
fn bits(word: u32, from: u32, width: u32) -> u32 {
    (word >> from) & ((1 << width) - 1)
}

/// The register number in bits `from..from + 5`.
fn register(word: u32, from: u32) -> u8 {
    bits(word, from, 5) as u8
}

/// `value`'s low `width` bits, sign-extended.
fn signed(value: u32, width: u32) -> i64 {
    let shift = 64 - width;
    (i64::from(value) << shift) >> shift
}

/// The address `imm` instructions (of 4 bytes) from `ip`.
fn relative(ip: u64, imm: u32, width: u32) -> u64 {
    ip.wrapping_add_signed(signed(imm, width) * 4)
}

/// Bit n for each register xn among `registers`, leaving out number 31.
fn mask(registers: &[u8]) -> u32 {
    registers
        .iter()
        .filter(|&&r| usize::from(r) < REGISTERS)
        .fold(0, |mask, &r| mask | 1 << r)
}

impl Instruction {
    /// Decodes the instruction `word` at `ip`.
    pub fn decode(word: u32, ip: u64) -> Instruction {
        let rd = register(word, 0);
        let rn = register(word, 5);
        if word & 0x9f00_0000 == 0x9000_0000 {
            let imm = bits(word, 5, 19) << 2 | bits(word, 29, 2);
            let page = (ip & !0xfff).wrapping_add_signed(signed(imm, 21) << 12);
            return Instruction::Adrp { rd, page };
        }
        if word & 0x1f80_0000 == 0x1100_0000 {
            // add/sub (immediate): sf, op, S, then sh and imm12.
            let (wide, sub, flags) = (word >> 31 == 1, bits(word, 30, 1) == 1, bits(word, 29, 1));
            let imm = i64::from(bits(word, 10, 12)) << (12 * bits(word, 22, 1));
            return match (flags, sub) {
                (0, _) => Instruction::AddImmediate {
                    rd,
                    rn,
                    imm: if sub { -imm } else { imm },
                    wide,
                },
                (_, true) if rd == 31 => Instruction::Compare {
                    rn,
                    imm: imm as u64,
                },
                _ => Instruction::Other {
                    writes: mask(&[rd]),
                },
            };
        }
        if word & 0xffe0_fc00 == 0x8b00_0000 {
            // add (shifted register), 64-bit, no shift.
            return Instruction::AddRegister {
                rd,
                rn,
                rm: register(word, 16),
            };
        }
        if word & 0x7fe0_ffe0 == 0x2a00_03e0 {
            // orr (shifted register) from the zero register, no shift.
            return Instruction::Move {
                rd,
                rm: register(word, 16),
                wide: word >> 31 == 1,
            };
        }
        if word & 0xffc0_0000 == 0xd340_0000 {
            // ubfm, 64-bit: a left shift when imms < immr.
            let (immr, imms) = (bits(word, 16, 6), bits(word, 10, 6));
            if imms < immr {
                return Instruction::ShiftLeft {
                    rd,
                    rn,
                    shift: 64 - immr,
                    width: imms + 1,
                };
            }
            return Instruction::Other {
                writes: mask(&[rd]),
            };
        }
        if word & 0xbfc0_0000 == 0xb940_0000 {
            // ldr (immediate, unsigned offset) of a w or x register: imm12 scaled by the size.
            let wide = bits(word, 30, 1) == 1;
            return Instruction::Load {
                rt: rd,
                rn,
                offset: u64::from(bits(word, 10, 12)) << if wide { 3 } else { 2 },
                wide,
            };
        }
        if word & 0xffff_ffe0 == 0xd53b_d040 {
            return Instruction::ThreadPointer { rt: rd };
        }
        match word >> 26 {
            0b000101 => {
                return Instruction::Branch {
                    target: relative(ip, bits(word, 0, 26), 26),
                }
            }
            0b100101 => {
                return Instruction::Call {
                    target: relative(ip, bits(word, 0, 26), 26),
                }
            }
            _ => {}
        }
        if word & 0xff00_0000 == 0x5400_0000 {
            // b.cond, and bc.cond (bit 4).
            let condition = match bits(word, 0, 4) {
                0b1000 => Condition::Higher,
                0b0010 => Condition::HigherOrSame,
                other => Condition::Other(other as u8),
            };
            return Instruction::ConditionalBranch {
                target: relative(ip, bits(word, 5, 19), 19),
                condition: Some(condition),
            };
        }
        if word & 0x7e00_0000 == 0x3400_0000 {
            // cbz, cbnz.
            return Instruction::ConditionalBranch {
                target: relative(ip, bits(word, 5, 19), 19),
                condition: None,
            };
        }
        if word & 0x7e00_0000 == 0x3600_0000 {
            // tbz, tbnz.
            return Instruction::ConditionalBranch {
                target: relative(ip, bits(word, 5, 14), 14),
                condition: None,
            };
        }
        if word & 0xfe00_0000 == 0xd600_0000 {
            // Unconditional branch (register): opc in bits 21-24, bit 24 the authenticating
            // forms of br and blr.
            return match bits(word, 21, 3) {
                0b000 => Instruction::IndirectBranch,
                0b001 => Instruction::IndirectCall,
                0b010 | 0b100 => Instruction::Return,
                _ => Instruction::Undefined,
            };
        }
        if word & 0xff00_0000 == 0xd400_0000 || word >> 16 == 0 {
            return Instruction::Exception;
        }
        // The rest by encoding group (op0, bits 25-28), as what it may write.
        let writes = match bits(word, 25, 4) {
            // Reserved, SME, and unallocated.
            0b0000 | 0b0001 | 0b0011 => return Instruction::Undefined,
            // Loads and stores: the transfer registers (bits 0-4, and 10-14 for pairs), the
            // base written back (5-9), the status or compare register of exclusives and
            // atomics (16-20). Where a field is an immediate instead, the mask is wider than
            // the truth, which only forgets a register.
            group if group & 0b0101 == 0b0100 => {
                mask(&[rd, rn, register(word, 10), register(word, 16)])
            }
            // Data processing (immediate, register, SIMD and floating point, SVE), and system
            // instructions (mrs, sysl): the destination is in bits 0-4, number 31 when there is
            // none (hints such as `bti` and `paciasp`).
            _ => mask(&[rd]),
        };
        Instruction::Other { writes }
    }
}

/// The instructions of `code`, which starts at address `ip`, with their addresses; a last
/// partial word is not one.
pub fn instructions(code: &[u8], ip: u64) -> impl Iterator<Item = (u64, Instruction)> + '_ {
    code.chunks_exact(4).enumerate().map(move |(i, word)| {
        let at = ip.wrapping_add(4 * i as u64);
        let word = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        (at, Instruction::decode(word, at))
    })
}

/// The registers an instruction writes that the state-following readers do not follow
/// exactly: every one but those the caller's own forms handle.
fn written(instruction: &Instruction) -> u32 {
    match *instruction {
        Instruction::Adrp { rd, .. }
        | Instruction::AddImmediate { rd, .. }
        | Instruction::AddRegister { rd, .. }
        | Instruction::Move { rd, .. }
        | Instruction::ShiftLeft { rd, .. } => mask(&[rd]),
        Instruction::Load { rt, .. } | Instruction::ThreadPointer { rt } => mask(&[rt]),
        Instruction::Other { writes } => writes,
        // bl and blr write x30; the readers stop at calls anyway.
        Instruction::Call { .. } | Instruction::IndirectCall => mask(&[30]),
        _ => 0,
    }
}

/// Registers' values as a reader follows them: `None` for unknown.
struct Registers<T>([Option<T>; REGISTERS]);

impl<T: Copy> Registers<T> {
    fn new() -> Self {
        Registers([None; REGISTERS])
    }

    fn get(&self, register: u8) -> Option<T> {
        self.0.get(usize::from(register)).copied().flatten()
    }

    /// Sets `register`, after forgetting everything `instruction` writes.
    fn set(&mut self, instruction: &Instruction, register: u8, value: Option<T>) {
        self.forget(instruction);
        if let Some(slot) = self.0.get_mut(usize::from(register)) {
            *slot = value;
        }
    }

    fn forget(&mut self, instruction: &Instruction) {
        let writes = written(instruction);
        for (i, slot) in self.0.iter_mut().enumerate() {
            if writes & 1 << i != 0 {
                *slot = None;
            }
        }
    }
}

/// What a register holds, for [`first_argument`].
#[derive(Debug, Clone, Copy)]
enum Held {
    /// This place's address.
    Address(Place),
    /// The 32-bit value at this place.
    Loaded(Place),
}

fn offset_place(place: Place, by: i64) -> Place {
    match place {
        Place::Fixed(address) => Place::Fixed(address.wrapping_add_signed(by)),
        Place::Pointed { slot, offset } => Place::Pointed {
            slot,
            offset: offset.wrapping_add_signed(by),
        },
    }
}

/// What the function at `ip` puts in `x0` (or `w0`) before its first call or unconditional
/// branch, following the fall-through path; `None` when it is not one of these forms or the
/// function returns first:
/// - [`FirstArgument::Address`]: `adrp x0, page; add x0, x0, #lo`, or a GOT slot's pointer
///   plus an offset: `adrp xn, got; ldr xn, [xn, #lo]; add x0, xn, #offset`;
/// - [`FirstArgument::Loaded`]: `ldr w0, [xn, #offset]` from either of those addresses.
pub fn first_argument(code: &[u8], ip: u64) -> Option<FirstArgument> {
    let mut registers = Registers::<Held>::new();
    for (_, instruction) in instructions(code, ip).take(64) {
        let value = match instruction {
            Instruction::Call { .. }
            | Instruction::IndirectCall
            | Instruction::Branch { .. }
            | Instruction::IndirectBranch => {
                return match registers.get(0)? {
                    Held::Address(place) => Some(FirstArgument::Address(place)),
                    Held::Loaded(place) => Some(FirstArgument::Loaded(place)),
                }
            }
            Instruction::Return | Instruction::Exception | Instruction::Undefined => return None,
            Instruction::Adrp { rd, page } => (rd, Some(Held::Address(Place::Fixed(page)))),
            Instruction::AddImmediate {
                rd,
                rn,
                imm,
                wide: true,
            } => match registers.get(rn) {
                Some(Held::Address(place)) => (rd, Some(Held::Address(offset_place(place, imm)))),
                _ => (rd, None),
            },
            Instruction::Load {
                rt,
                rn,
                offset,
                wide,
            } => match registers.get(rn) {
                Some(Held::Address(base)) => {
                    let place = offset_place(base, offset as i64);
                    match (wide, place) {
                        (false, _) => (rt, Some(Held::Loaded(place))),
                        // A pointer loaded from a global slot (the GOT).
                        (true, Place::Fixed(slot)) => {
                            (rt, Some(Held::Address(Place::Pointed { slot, offset: 0 })))
                        }
                        (true, Place::Pointed { .. }) => (rt, None),
                    }
                }
                _ => (rt, None),
            },
            Instruction::Move { rd, rm, wide } => match registers.get(rm) {
                Some(held @ Held::Address(_)) if wide => (rd, Some(held)),
                Some(held @ Held::Loaded(_)) => (rd, Some(held)),
                _ => (rd, None),
            },
            other => {
                registers.forget(&other);
                continue;
            }
        };
        registers.set(&instruction, value.0, value.1);
    }
    None
}

/// What a register holds, for [`returned_thread_local`].
#[derive(Debug, Clone, Copy)]
enum Tls {
    /// The thread pointer plus this offset.
    Pointer(i64),
    /// The 64-bit value at the thread pointer plus this offset.
    Value(i64),
}

/// The offset from the thread pointer (`tpidr_el0`) of the thread-local the function at `ip`
/// returns, when that is all it does: `mrs xn, tpidr_el0`, `add`s of immediates (the
/// local-exec model's `add xn, xn, #hi, lsl #12; add xn, xn, #lo`; the linker turns a zero
/// high part into a `nop`), then `ldr x0, [xn, #offset]` and `ret`, as a program reads its
/// own thread-locals. `None` for any other form: a shared library's initial-exec access adds
/// an offset loaded from its GOT (`ldr xn, [xn, :gottprel_lo12:]`), which its loader
/// writes; a TLS descriptor calls through `blr`.
pub fn returned_thread_local(code: &[u8], ip: u64) -> Option<i64> {
    let mut registers = Registers::<Tls>::new();
    for (_, instruction) in instructions(code, ip).take(16) {
        let value = match instruction {
            Instruction::Return => {
                return match registers.get(0)? {
                    Tls::Value(offset) => Some(offset),
                    Tls::Pointer(_) => None,
                }
            }
            Instruction::ThreadPointer { rt } => (rt, Some(Tls::Pointer(0))),
            Instruction::AddImmediate {
                rd,
                rn,
                imm,
                wide: true,
            } => match registers.get(rn) {
                Some(Tls::Pointer(offset)) => (rd, offset.checked_add(imm).map(Tls::Pointer)),
                _ => (rd, None),
            },
            Instruction::Load {
                rt,
                rn,
                offset,
                wide: true,
            } => match registers.get(rn) {
                Some(Tls::Pointer(at)) => (rt, at.checked_add(offset as i64).map(Tls::Value)),
                _ => (rt, None),
            },
            Instruction::Move { rd, rm, wide: true } => (rd, registers.get(rm)),
            Instruction::Other { .. }
            | Instruction::AddImmediate { .. }
            | Instruction::AddRegister { .. }
            | Instruction::Move { .. }
            | Instruction::ShiftLeft { .. }
            | Instruction::Compare { .. }
            | Instruction::Load { .. }
            | Instruction::Adrp { .. } => {
                registers.forget(&instruction);
                continue;
            }
            // Any branch, call or trap: not a function that only returns its thread-local.
            _ => return None,
        };
        registers.set(&instruction, value.0, value.1);
    }
    None
}

/// The targets of the direct branches (conditional or not, never calls) in `code`, which
/// starts at `ip`, that leave `code`: where a compiler put a function's split-off parts.
pub fn jumps_out(code: &[u8], ip: u64) -> Vec<u64> {
    let end = ip.saturating_add(code.len() as u64);
    let mut targets: Vec<u64> = instructions(code, ip)
        .filter_map(|(_, instruction)| match instruction {
            Instruction::Branch { target } | Instruction::ConditionalBranch { target, .. } => {
                Some(target)
            }
            _ => None,
        })
        .filter(|&target| !(ip..end).contains(&target))
        .collect();
    targets.sort_unstable();
    targets.dedup();
    targets
}

/// A value `pthread_getspecific` computes from its key: `(key << shift) + constant`, plus
/// the thread pointer when `thread_pointer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Linear {
    thread_pointer: bool,
    key_shift: Option<u32>,
    constant: i64,
}

impl Linear {
    /// The key itself, as the function receives it in `w0`.
    const KEY: Linear = Linear {
        thread_pointer: false,
        key_shift: Some(0),
        constant: 0,
    };

    fn plus(self, other: Linear) -> Option<Linear> {
        if (self.thread_pointer && other.thread_pointer)
            || (self.key_shift.is_some() && other.key_shift.is_some())
        {
            return None;
        }
        Some(Linear {
            thread_pointer: self.thread_pointer || other.thread_pointer,
            key_shift: self.key_shift.or(other.key_shift),
            constant: self.constant.checked_add(other.constant)?,
        })
    }
}

/// How far from the thread pointer `struct pthread`'s key array can be: the structure is a
/// few KiB.
const PTHREAD_REACH: i64 = 1 << 16;

/// The layout `pthread_getspecific`, whose code starts at `ip`, reads its first block of
/// keys with (glibc 2.36, keys below 32):
///
/// ```text
/// mov   w1, w0
/// cmp   w0, #0x1f ; b.hi  <second level>
/// ubfiz x0, x1, #4, #32           # key * sizeof(struct pthread_key_data)
/// mrs   x2, tpidr_el0             # the thread pointer; struct pthread lies below it
/// sub   x0, x0, #0x630
/// add   x2, x2, x0
/// ldr   x0, [x2, #8]              # `data` of that `struct pthread_key_data`
/// ```
///
/// The key is followed from `w0` through every register it passes, so the bound and the
/// load are known to be the key's. The error says which part is not a form known here.
pub fn pthread_specific(code: &[u8], ip: u64) -> Result<SpecificLayout, &'static str> {
    let mut registers = Registers::<Linear>::new();
    registers.0[0] = Some(Linear::KEY);
    // The key's bound from a `cmp` of the key, until the conditional branch that uses it.
    let mut compared = None;
    let mut first_block = None;
    for (_, instruction) in instructions(code, ip).take(40) {
        let value = match instruction {
            Instruction::Compare { rn, imm } if registers.get(rn) == Some(Linear::KEY) => {
                compared = Some(imm);
                continue;
            }
            Instruction::ConditionalBranch {
                condition: Some(condition),
                ..
            } if first_block.is_none() && compared.is_some() => {
                let bound = compared.take().unwrap_or_default();
                first_block = match condition {
                    // Keys above the bound go to the second level.
                    Condition::Higher => bound.checked_add(1),
                    Condition::HigherOrSame => Some(bound),
                    Condition::Other(_) => return Err("the key's bound is not an unsigned test"),
                };
                continue;
            }
            Instruction::ConditionalBranch { .. } => continue,
            // A 32-bit move keeps only the key itself whole.
            Instruction::Move { rd, rm, wide } => match registers.get(rm) {
                Some(value) if wide || value == Linear::KEY => (rd, Some(value)),
                _ => (rd, None),
            },
            Instruction::ShiftLeft {
                rd,
                rn,
                shift,
                width,
            } => match registers.get(rn) {
                // The whole 32-bit key, zero-extended, and nothing else.
                Some(Linear::KEY) if width == 32 => (
                    rd,
                    Some(Linear {
                        key_shift: Some(shift),
                        ..Linear::KEY
                    }),
                ),
                _ => (rd, None),
            },
            Instruction::ThreadPointer { rt } => (
                rt,
                Some(Linear {
                    thread_pointer: true,
                    key_shift: None,
                    constant: 0,
                }),
            ),
            Instruction::AddImmediate {
                rd,
                rn,
                imm,
                wide: true,
            } => (
                rd,
                registers.get(rn).and_then(|value| {
                    value.plus(Linear {
                        thread_pointer: false,
                        key_shift: None,
                        constant: imm,
                    })
                }),
            ),
            Instruction::AddRegister { rd, rn, rm } => (
                rd,
                registers
                    .get(rn)
                    .zip(registers.get(rm))
                    .and_then(|(a, b)| a.plus(b)),
            ),
            Instruction::Load {
                rt,
                rn,
                offset,
                wide: true,
            } => match registers.get(rn) {
                Some(Linear {
                    thread_pointer: true,
                    key_shift: Some(entry_shift),
                    constant,
                }) => {
                    let first_block = first_block
                        .ok_or("the key is not bounded before its lookup")
                        .and_then(|b| u32::try_from(b).map_err(|_| "first block"))?;
                    return layout(first_block, entry_shift, constant, offset);
                }
                _ => (rt, None),
            },
            Instruction::Branch { .. }
            | Instruction::Call { .. }
            | Instruction::IndirectBranch
            | Instruction::IndirectCall
            | Instruction::Return
            | Instruction::Exception
            | Instruction::Undefined => break,
            other => {
                registers.forget(&other);
                continue;
            }
        };
        registers.set(&instruction, value.0, value.1);
    }
    Err("the first-block lookup was not found")
}

/// The layout of a lookup at `thread_pointer + (key << entry_shift) + constant + offset`,
/// checked to stay near the thread pointer, where `struct pthread` is.
fn layout(
    first_block: u32,
    entry_shift: u32,
    constant: i64,
    offset: u64,
) -> Result<SpecificLayout, &'static str> {
    if entry_shift >= 16 {
        return Err("entry size");
    }
    let value_offset = i64::try_from(offset)
        .ok()
        .and_then(|offset| constant.checked_add(offset))
        .ok_or("offsets beyond struct pthread")?;
    let layout = SpecificLayout {
        first_block,
        index_bias: 0,
        entry_shift,
        // Negative offsets wrap, as the BPF walk's sum does.
        value_offset: value_offset as u64,
    };
    let near = |key: u32| {
        layout
            .offset(key)
            .is_some_and(|o| (-PTHREAD_REACH..=PTHREAD_REACH).contains(&(o as i64)))
    };
    if first_block == 0 || first_block > 1024 || !near(0) || !near(first_block - 1) {
        return Err("offsets beyond struct pthread");
    }
    Ok(layout)
}

/// For fuzz/: arbitrary bytes as a function's code, its address from the first 8 bytes, read
/// by each of the four readers. Must never panic, and what they find must hold together.
pub fn fuzz_one(data: &[u8]) {
    let (ip, code) = match data.split_first_chunk::<8>() {
        Some((ip, code)) => (u64::from_le_bytes(*ip), code),
        None => (0, data),
    };
    let _ = first_argument(code, ip);
    let _ = returned_thread_local(code, ip);
    let end = ip.saturating_add(code.len() as u64);
    for target in jumps_out(code, ip) {
        assert!(!(ip..end).contains(&target), "{target:#x} is inside");
    }
    if let Ok(layout) = pthread_specific(code, ip) {
        assert!(layout.first_block > 0 && layout.entry_shift < 16);
        for key in [0, layout.first_block - 1] {
            let offset = layout.offset(key).map(|o| o as i64);
            assert!(
                offset.is_some_and(|o| o.abs() <= PTHREAD_REACH),
                "{layout:?}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Little-endian bytes of instruction words.
    fn code(words: &[u32]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn decodes_the_forms_as_objdump_names_them() {
        let at = 0x47_1314;
        // adrp x0, a36000
        assert_eq!(
            Instruction::decode(0xb000_2e20, at),
            Instruction::Adrp {
                rd: 0,
                page: 0xa3_6000
            }
        );
        // adrp x16, 19f000 at 0x27244 (a page below is a negative immediate)
        assert_eq!(
            Instruction::decode(0x9000_0bd0, 0x2_7244),
            Instruction::Adrp {
                rd: 16,
                page: 0x19_f000
            }
        );
        // add x0, x0, #0x8
        assert_eq!(
            Instruction::decode(0x9100_2000, at),
            Instruction::AddImmediate {
                rd: 0,
                rn: 0,
                imm: 8,
                wide: true
            }
        );
        // add x1, x1, #0x1, lsl #12
        assert_eq!(
            Instruction::decode(0x9140_0421, at),
            Instruction::AddImmediate {
                rd: 1,
                rn: 1,
                imm: 0x1000,
                wide: true
            }
        );
        // sub x0, x0, #0x630
        assert_eq!(
            Instruction::decode(0xd118_c000, at),
            Instruction::AddImmediate {
                rd: 0,
                rn: 0,
                imm: -0x630,
                wide: true
            }
        );
        // add x2, x2, x0
        assert_eq!(
            Instruction::decode(0x8b00_0042, at),
            Instruction::AddRegister {
                rd: 2,
                rn: 2,
                rm: 0
            }
        );
        // add x0, x2, x0, lsl #3: shifted, not this form
        assert!(matches!(
            Instruction::decode(0x8b00_0c40, at),
            Instruction::Other { writes: 1 }
        ));
        // mov w1, w0
        assert_eq!(
            Instruction::decode(0x2a00_03e1, at),
            Instruction::Move {
                rd: 1,
                rm: 0,
                wide: false
            }
        );
        // ubfiz x0, x1, #4, #32
        assert_eq!(
            Instruction::decode(0xd37c_7c20, at),
            Instruction::ShiftLeft {
                rd: 0,
                rn: 1,
                shift: 4,
                width: 32
            }
        );
        // cmp w0, #0x1f
        assert_eq!(
            Instruction::decode(0x7100_7c1f, at),
            Instruction::Compare { rn: 0, imm: 0x1f }
        );
        // ldr w0, [x0, #612]; ldr x17, [x16, #4088]
        assert_eq!(
            Instruction::decode(0xb942_6400, at),
            Instruction::Load {
                rt: 0,
                rn: 0,
                offset: 612,
                wide: false
            }
        );
        assert_eq!(
            Instruction::decode(0xf947_fe11, at),
            Instruction::Load {
                rt: 17,
                rn: 16,
                offset: 4088,
                wide: true
            }
        );
        // mrs x2, tpidr_el0
        assert_eq!(
            Instruction::decode(0xd53b_d042, at),
            Instruction::ThreadPointer { rt: 2 }
        );
        // b 41fb60 (backwards); bl +8
        assert_eq!(
            Instruction::decode(0x17fe_ba0e, 0x47_1328),
            Instruction::Branch { target: 0x41_fb60 }
        );
        assert_eq!(
            Instruction::decode(0x9400_0002, at),
            Instruction::Call { target: at + 8 }
        );
        // b.hi +0x48; cbz x1, +0xc; tbnz w3, #0, -4
        assert_eq!(
            Instruction::decode(0x5400_0248, 0x8_04c8),
            Instruction::ConditionalBranch {
                target: 0x8_0510,
                condition: Some(Condition::Higher)
            }
        );
        assert_eq!(
            Instruction::decode(0xb400_0061, at),
            Instruction::ConditionalBranch {
                target: at + 0xc,
                condition: None
            }
        );
        assert_eq!(
            Instruction::decode(0x3707_ffe3, at),
            Instruction::ConditionalBranch {
                target: at - 4,
                condition: None
            }
        );
        // br x17; blr x1; ret; retaa; svc #0; udf #0
        assert_eq!(
            Instruction::decode(0xd61f_0220, at),
            Instruction::IndirectBranch
        );
        assert_eq!(
            Instruction::decode(0xd63f_0020, at),
            Instruction::IndirectCall
        );
        assert_eq!(Instruction::decode(0xd65f_03c0, at), Instruction::Return);
        assert_eq!(Instruction::decode(0xd65f_0bff, at), Instruction::Return);
        assert_eq!(Instruction::decode(0xd400_0001, at), Instruction::Exception);
        assert_eq!(Instruction::decode(0x0000_0000, at), Instruction::Exception);
    }

    #[test]
    fn what_other_instructions_may_write() {
        let writes = |word| match Instruction::decode(word, 0) {
            Instruction::Other { writes } => writes,
            other => panic!("{word:#x}: {other:?}"),
        };
        // Hints write nothing: nop, bti c, paciasp, autiasp.
        for hint in [0xd503_201f, 0xd503_245f, 0xd503_233f, 0xd503_23bf] {
            assert_eq!(writes(hint), 0, "{hint:#x}");
        }
        // stp x29, x30, [sp, #-16]!: a store, whose mask forgets x29 and x30, never x0.
        assert_eq!(writes(0xa9bf_7bfd), 1 << 29 | 1 << 30);
        // ldp x0, x1, [x2]: both loaded registers, and the base.
        assert_eq!(writes(0xa940_0440) & 0b111, 0b111);
        // mov x0, #0x0 (movz); lsr w0, w0, #5 (ubfm, a right shift)
        assert_eq!(writes(0xd280_0000), 1);
        assert_eq!(writes(0x5305_7c00), 1);
        // Unallocated words are no instruction.
        assert_eq!(Instruction::decode(0x0200_0000, 0), Instruction::Undefined);
    }

    #[test]
    fn an_address_loaded_from_before_a_tail_branch() {
        // Debian 12's arm64 python3.11, PyGILState_GetThisThreadState: the key in _PyRuntime.
        let ip = 0x47_1314;
        let function = code(&[
            0xb000_2e20, // adrp x0, a36000
            0x9100_2000, // add x0, x0, #0x8
            0xf941_2c01, // ldr x1, [x0, #600]
            0xb400_0061, // cbz x1, +0xc
            0xb942_6400, // ldr w0, [x0, #612]
            0x17fe_ba0e, // b pthread_getspecific@plt
            0xd280_0000, // mov x0, #0x0
            0xd65f_03c0, // ret
        ]);
        assert_eq!(
            first_argument(&function, ip),
            Some(FirstArgument::Loaded(Place::Fixed(0xa3_6008 + 612)))
        );
        // The base overwritten in between (mov x0, #0): unknown.
        let mut clobbered = function.clone();
        clobbered.splice(16..16, code(&[0xd280_0000]));
        assert_eq!(first_argument(&clobbered, ip), None);
        // A function that returns before any branch gives no argument.
        assert_eq!(first_argument(&code(&[0xd280_0000, 0xd65f_03c0]), ip), None);
    }

    #[test]
    fn an_address_given_and_a_global_reached_through_its_got_slot() {
        // Debian's arm64 python3.14: the key's Py_tss_t itself, after a bti.
        let ip = 0x42_5658;
        let function = code(&[
            0xd503_245f, // bti c
            0xf000_3920, // adrp x0, b4c000
            0xb946_a000, // ldr w0, [x0, #1696]
            0x3400_0080, // cbz w0, +0x10
            0xf000_3920, // adrp x0, b4c000
            0x911a_8000, // add x0, x0, #0x6a0
            0x1402_3e06, // b PyThread_tss_get
        ]);
        assert_eq!(
            first_argument(&function, ip),
            Some(FirstArgument::Address(Place::Fixed(0xb4_c6a0)))
        );
        // Debian 12's arm64 libpython3.11.so: _PyRuntime's address from its GOT slot.
        let ip = 0x2a_6a54;
        let shared = code(&[
            0xb000_1bc0, // adrp x0, 61f000
            0xf946_6000, // ldr x0, [x0, #3264]
            0xf941_2c01, // ldr x1, [x0, #600]
            0xb400_0061, // cbz x1, +0xc
            0x9109_8000, // add x0, x0, #0x260
            0x1400_39c6, // b PyThread_tss_get
        ]);
        assert_eq!(
            first_argument(&shared, ip),
            Some(FirstArgument::Address(Place::Pointed {
                slot: 0x61_fcc0,
                offset: 0x260
            }))
        );
        // ldr w0 through the slot's pointer: the value there.
        let mut loaded = shared.clone();
        loaded[16..20].copy_from_slice(&0xb942_6400u32.to_le_bytes()); // ldr w0, [x0, #612]
        assert_eq!(
            first_argument(&loaded, ip),
            Some(FirstArgument::Loaded(Place::Pointed {
                slot: 0x61_fcc0,
                offset: 612
            }))
        );
        // Through the slot's pointer a second time: not a place known here.
        let mut twice = shared.clone();
        twice[16..20].copy_from_slice(&0xf941_3000u32.to_le_bytes()); // ldr x0, [x0, #608]
        assert_eq!(first_argument(&twice, ip), None);
        // x0 from a register that was never given a place: unknown.
        let moved = code(&[0xaa13_03e0, 0x1400_0000]); // mov x0, x19; b
        assert_eq!(first_argument(&moved, ip), None);
    }

    #[test]
    fn a_thread_local_returned() {
        // Debian's arm64 python3.15, PyGILState_GetThisThreadState: _Py_tss_gilstate.
        let ip = 0x42_8fc8;
        let function = code(&[
            0xd503_245f, // bti c
            0xd53b_d040, // mrs x0, tpidr_el0
            0xd503_233f, // paciasp
            0xa9bf_7bfd, // stp x29, x30, [sp, #-16]!
            0xd503_201f, // nop (add x0, x0, #0, lsl #12, relaxed by the linker)
            0x9100_8000, // add x0, x0, #0x20
            0x9100_03fd, // mov x29, sp
            0xa8c1_7bfd, // ldp x29, x30, [sp], #16
            0xd503_23bf, // autiasp
            0xf940_0000, // ldr x0, [x0]
            0xd65f_03c0, // ret
        ]);
        assert_eq!(returned_thread_local(&function, ip), Some(0x20));
        // Both halves of a larger offset.
        let large = code(&[
            0xd53b_d041, // mrs x1, tpidr_el0
            0x9140_0421, // add x1, x1, #0x1, lsl #12
            0x9100_4021, // add x1, x1, #0x10
            0xf940_0420, // ldr x0, [x1, #8]
            0xd65f_03c0, // ret
        ]);
        assert_eq!(returned_thread_local(&large, ip), Some(0x1018));
        // x0 overwritten before the return: not the thread-local.
        let mut clobbered = function.clone();
        clobbered.splice(40..40, code(&[0xd280_0000])); // mov x0, #0
        assert_eq!(returned_thread_local(&clobbered, ip), None);
        // The thread pointer itself returned, not a value below it.
        let pointer = code(&[0xd53b_d040, 0xd65f_03c0]);
        assert_eq!(returned_thread_local(&pointer, ip), None);
        // Initial-exec, as a shared library reads its own: the offset is in the GOT.
        let initial_exec = code(&[
            0x9000_0001, // adrp x1, got page
            0xf940_0021, // ldr x1, [x1, #:gottprel_lo12:]
            0xd53b_d040, // mrs x0, tpidr_el0
            0x8b01_0000, // add x0, x0, x1
            0xf940_0000, // ldr x0, [x0]
            0xd65f_03c0, // ret
        ]);
        assert_eq!(returned_thread_local(&initial_exec, ip), None);
        // A TLS descriptor call: not this form.
        let descriptor = code(&[
            0x9000_0000, // adrp x0, :tlsdesc:
            0xf940_0001, // ldr x1, [x0, #:tlsdesc_lo12:]
            0x9100_0000, // add x0, x0, #:tlsdesc_lo12:
            0xd63f_0020, // blr x1
            0xd53b_d041, // mrs x1, tpidr_el0
            0xf860_6820, // ldr x0, [x1, x0]
            0xd65f_03c0, // ret
        ]);
        assert_eq!(returned_thread_local(&descriptor, ip), None);
    }

    #[test]
    fn jumps_that_leave_the_function() {
        let ip = 0x10_000;
        let function = code(&[
            0x54ff_f800, // b.eq ip-0x100 (out)
            0x1400_0001, // b ip+8 (in)
            0x3400_0400, // cbz w0, ip+8+0x80 (out)
            0x3600_0000, // tbz w0, #0, ip+12 (in)
            0x9400_0100, // bl ip+16+0x400 (a call: not a jump)
            0x0200_0000, // an unallocated word: the rest is still read
            0x1400_0400, // b ip+24+0x1000 (out)
        ]);
        assert_eq!(
            jumps_out(&function, ip),
            [ip - 0x100, ip + 8 + 0x80, ip + 24 + 0x1000]
        );
        // A last partial word is not read.
        assert_eq!(jumps_out(&function[..27], ip), [ip - 0x100, ip + 8 + 0x80]);
    }

    #[test]
    fn arbitrary_words_are_read_without_panics() {
        // The readers' state machines over words drawn mostly from the forms they follow, so
        // the chains they track get long, at addresses near the top of the space.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let forms = [
            0x9000_0000, // adrp
            0x9100_0000, // add
            0xd100_0000, // sub
            0xf940_0000, // ldr x
            0xb940_0000, // ldr w
            0xd53b_d040, // mrs tpidr_el0
            0x2a00_03e0, // mov w
            0xd37c_7c00, // ubfiz
            0x7100_001f, // cmp
            0x5400_0008, // b.hi
            0x8b00_0000, // add (register)
        ];
        for round in 0..2000 {
            let mut data = (u64::MAX - round * 0x1000).to_le_bytes().to_vec();
            for _ in 0..(next() % 48) {
                let random = next() as u32;
                let word = match random % 4 {
                    // A form, with random registers and immediates below its opcode bits.
                    0..=2 => forms[(random >> 8) as usize % forms.len()] | (random >> 12 & 0x3ff),
                    _ => random,
                };
                data.extend(word.to_le_bytes());
            }
            fuzz_one(&data);
        }
    }

    /// glibc 2.36's arm64 `pthread_getspecific`, up to its first-block load.
    const GETSPECIFIC: [u32; 8] = [
        0x2a00_03e1, // mov w1, w0
        0x7100_7c1f, // cmp w0, #0x1f
        0x5400_0248, // b.hi <second level>
        0xd37c_7c20, // ubfiz x0, x1, #4, #32
        0xd53b_d042, // mrs x2, tpidr_el0
        0xd118_c000, // sub x0, x0, #0x630
        0x8b00_0042, // add x2, x2, x0
        0xf940_0440, // ldr x0, [x2, #8]
    ];

    #[test]
    fn the_first_block_of_pthread_keys() {
        let layout = pthread_specific(&code(&GETSPECIFIC), 0x8_04c0).unwrap();
        assert_eq!(
            layout,
            SpecificLayout {
                first_block: 32,
                index_bias: 0,
                entry_shift: 4,
                value_offset: (8i64 - 0x630) as u64,
            }
        );
        assert_eq!(layout.offset(0), Some((-0x628i64) as u64));
        assert_eq!(layout.offset(31), Some((31 * 16 - 0x628i64) as u64));
        assert_eq!(layout.offset(32), None);
        // b.hs bounds the first block at the compared value itself.
        let mut words = GETSPECIFIC;
        words[2] = 0x5400_0242; // b.hs
        assert_eq!(
            pthread_specific(&code(&words), 0).unwrap().first_block,
            0x1f
        );
    }

    #[test]
    fn other_shapes_of_pthread_getspecific_are_refused() {
        let refused = |words: &[u32]| pthread_specific(&code(words), 0).unwrap_err();
        // No bound before the load.
        let mut words = GETSPECIFIC.to_vec();
        words.drain(1..3);
        assert_eq!(refused(&words), "the key is not bounded before its lookup");
        // A bound of something other than the key (cmp w3, #0x1f).
        let mut words = GETSPECIFIC;
        words[1] = 0x7100_7c7f;
        assert_eq!(refused(&words), "the key is not bounded before its lookup");
        // A signed test of the bound.
        let mut words = GETSPECIFIC;
        words[2] = 0x5400_024c; // b.gt
        assert_eq!(refused(&words), "the key's bound is not an unsigned test");
        // The key's register overwritten before the shift (mov x1, #0).
        let mut words = GETSPECIFIC.to_vec();
        words.insert(3, 0xd280_0001);
        assert_eq!(refused(&words), "the first-block lookup was not found");
        // The thread pointer missing: a load from the key alone is no lookup here.
        let mut words = GETSPECIFIC;
        words[4] = 0xd280_0002; // mov x2, #0
        assert_eq!(refused(&words), "the first-block lookup was not found");
        // Far from the thread pointer (sub x0, x0, #0x630, lsl #12).
        let mut words = GETSPECIFIC;
        words[5] = 0xd158_c000;
        assert_eq!(refused(&words), "offsets beyond struct pthread");
        // `mov x0, #0; ret`.
        assert_eq!(
            refused(&[0xd280_0000, 0xd65f_03c0]),
            "the first-block lookup was not found"
        );
    }
}
