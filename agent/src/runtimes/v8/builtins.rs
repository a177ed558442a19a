//! Where a V8 build's embedded builtins lie in its binary: the code every interpreted
//! JavaScript frame runs in (Ignition's entry trampoline and bytecode handlers), which the
//! walk must take over.
//!
//! V8 links its builtins into the binary's text as one blob, without CFI and, in Debian's
//! stripped `libnode`, without symbols. Node 18 and 20 export two accessors of the blob they
//! were built with, `DefaultEmbeddedBlobCode()` and `DefaultEmbeddedBlobCodeSize()`, each a
//! load or an address and a `ret`; their few forms are decoded here ([`accessor`]), and read
//! from the file (the start through its relocation where it is a stored pointer). Debian's
//! Node 24 hides them: there the blob is the one long stretch of the text that no `.eh_frame`
//! FDE describes ([`uncovered`]), which on the builds that have both is where the accessors
//! say it is.

use std::ops::Range;

use super::super::image::{Image, ImageError};

/// `v8::internal::DefaultEmbeddedBlobCode()` and `DefaultEmbeddedBlobCodeSize()`.
pub const CODE: &str = "_ZN2v88internal23DefaultEmbeddedBlobCodeEv";
pub const CODE_SIZE: &str = "_ZN2v88internal27DefaultEmbeddedBlobCodeSizeEv";

/// The largest blob believed: V8's builtins take a few MiB.
pub const MAX_BLOB: u64 = 64 << 20;

/// Bytes of an accessor decoded: the longest form is 11 bytes.
const ACCESSOR_BYTES: usize = 16;

/// Why the builtins were not found.
#[derive(Debug, thiserror::Error)]
pub enum BuiltinsError {
    #[error("no {0} among its symbols")]
    Missing(&'static str),
    #[error("no {0} among its symbols, and no one stretch of its text without CFI")]
    Hidden(&'static str),
    #[error("{function}: {bytes:02x?}, not a form its accessor is known to take")]
    Unrecognised {
        function: &'static str,
        bytes: Vec<u8>,
    },
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error("the embedded builtins' size is {0} bytes, not between 1 and {MAX_BLOB}")]
    Size(u64),
    #[error("the embedded builtins at {start:#x}, {size} bytes, lie outside its code")]
    Outside { start: u64, size: u64 },
}

/// What an accessor returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// A constant (`mov $imm32, %eax`).
    Constant(u64),
    /// An address in the file (`lea rel32(%rip), %rax`).
    Address(u64),
    /// The pointer stored at an address in the file (`mov rel32(%rip), %rax`, or `lea`, then
    /// `mov (%rax), %rax`).
    Pointer(u64),
    /// The u32 stored at an address (`mov rel32(%rip), %eax`, or `lea`, then
    /// `mov (%rax), %eax`).
    U32(u64),
}

/// What the accessor whose code is `code`, at ELF address `at`, returns; `None` for a form
/// not known. The forms GCC and Clang emit at -O2 for `return global;`, `return &global;`
/// and `return (T*)constant;`, in a static or a position-independent binary.
pub fn accessor(code: &[u8], at: u64) -> Option<Access> {
    let rel = |from: usize| -> Option<u64> {
        let bytes: [u8; 4] = code.get(from..from + 4)?.try_into().ok()?;
        // rip-relative: from the end of the instruction, 4 bytes past its displacement.
        Some(
            at.wrapping_add(from as u64 + 4)
                .wrapping_add(i64::from(i32::from_le_bytes(bytes)) as u64),
        )
    };
    let ret = |from: usize| code.get(from) == Some(&0xc3);
    match code {
        // mov $imm32, %eax; ret
        [0xb8, a, b, c, d, 0xc3, ..] => Some(Access::Constant(u64::from(u32::from_le_bytes([
            *a, *b, *c, *d,
        ])))),
        // lea rel32(%rip), %rax
        [0x48, 0x8d, 0x05, ..] => {
            let target = rel(3)?;
            if ret(7) {
                Some(Access::Address(target))
            } else if code.get(7..10) == Some(&[0x48, 0x8b, 0x00]) && ret(10) {
                Some(Access::Pointer(target))
            } else if code.get(7..9) == Some(&[0x8b, 0x00]) && ret(9) {
                Some(Access::U32(target))
            } else {
                None
            }
        }
        // mov rel32(%rip), %rax; ret
        [0x48, 0x8b, 0x05, ..] if ret(7) => Some(Access::Pointer(rel(3)?)),
        // mov rel32(%rip), %eax; ret
        [0x8b, 0x05, ..] if ret(6) => Some(Access::U32(rel(2)?)),
        _ => None,
    }
}

/// The value `access` gives in `image`, as the file holds it (a pointer less the load bias).
fn value(image: &Image, function: &'static str, access: Access) -> Result<u64, BuiltinsError> {
    Ok(match access {
        Access::Constant(value) | Access::Address(value) => value,
        Access::Pointer(at) => image.pointer_at(function, at)?,
        Access::U32(at) => image.i32_or_zero_at(function, at)? as u32 as u64,
    })
}

/// The shortest stretch of text without CFI taken for the builtins: V8's take megabytes, a
/// compiler's gaps between functions bytes.
pub const MIN_UNCOVERED: u64 = 512 << 10;

/// The embedded builtins' code in `image`, in its ELF addresses: through the accessors, or
/// where a build hides them, the text no FDE covers.
pub fn embedded_builtins(image: &Image) -> Result<Range<u64>, BuiltinsError> {
    match from_accessors(image) {
        Err(BuiltinsError::Missing(function)) => uncovered(&image.fde_ranges())
            .filter(|range| image.is_code(range.clone()))
            .ok_or(BuiltinsError::Hidden(function)),
        other => other,
    }
}

/// The one stretch between `fdes` (the ranges the FDEs cover) of at least [`MIN_UNCOVERED`]
/// bytes: `None` when there is none, or more than one (which would be a guess).
pub fn uncovered(fdes: &[Range<u64>]) -> Option<Range<u64>> {
    let mut sorted: Vec<&Range<u64>> = fdes.iter().filter(|r| r.start < r.end).collect();
    sorted.sort_by_key(|r| r.start);
    let mut found = None;
    let mut end = sorted.first()?.end;
    for range in sorted.iter().skip(1) {
        if range.start >= end.saturating_add(MIN_UNCOVERED) {
            if found.is_some() {
                return None;
            }
            found = Some(end..range.start);
        }
        end = end.max(range.end);
    }
    found.filter(|r| r.end - r.start <= MAX_BLOB)
}

/// The builtins' code through the accessors.
fn from_accessors(image: &Image) -> Result<Range<u64>, BuiltinsError> {
    let read = |function: &'static str| -> Result<u64, BuiltinsError> {
        let symbol = image
            .symbol(function)
            .ok_or(BuiltinsError::Missing(function))?;
        let code = image.bytes_at(function, symbol.address, ACCESSOR_BYTES as u64)?;
        let access = accessor(code, symbol.address).ok_or_else(|| BuiltinsError::Unrecognised {
            function,
            bytes: code.to_vec(),
        })?;
        value(image, function, access)
    };
    let start = read(CODE)?;
    let size = read(CODE_SIZE)?;
    if size == 0 || size > MAX_BLOB {
        return Err(BuiltinsError::Size(size));
    }
    let end = start.saturating_add(size);
    if !image.is_code(start..end) {
        return Err(BuiltinsError::Outside { start, size });
    }
    Ok(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_accessors_forms_are_decoded() {
        // Node 20 (NodeSource's static node): the start a constant, the size a load.
        assert_eq!(
            accessor(&[0xb8, 0x00, 0x40, 0x8c, 0x01, 0xc3], 0x106_2150),
            Some(Access::Constant(0x18c_4000))
        );
        assert_eq!(
            accessor(&[0x8b, 0x05, 0x52, 0x11, 0xce, 0x01, 0xc3], 0x106_2160),
            Some(Access::U32(0x2d4_32b8))
        );
        // Debian's libnode 108: the start a stored pointer, the size a load, through `lea`.
        assert_eq!(
            accessor(
                &[0x48, 0x8d, 0x05, 0x19, 0x85, 0xdc, 0x01, 0x48, 0x8b, 0x00, 0xc3],
                0xf6_7e10
            ),
            Some(Access::Pointer(0x2d3_0330))
        );
        assert_eq!(
            accessor(
                &[0x48, 0x8d, 0x05, 0xc9, 0xa5, 0x9a, 0x01, 0x8b, 0x00, 0xc3],
                0xf6_7e20
            ),
            Some(Access::U32(0x291_23f0))
        );
        // Debian's libnode 115: the start an address, backwards.
        assert_eq!(
            accessor(
                &[0x48, 0x8d, 0x05, 0xa9, 0x9d, 0xcd, 0xff, 0xc3],
                0x116_9250
            ),
            Some(Access::Address(0xe4_3000))
        );
        // Anything else, and every form cut short, is refused.
        assert_eq!(accessor(&[0xc3], 0), None);
        assert_eq!(accessor(&[0x55, 0x48, 0x89, 0xe5], 0), None);
        assert_eq!(accessor(&[0x48, 0x8d, 0x05, 0, 0, 0, 0, 0x90], 0), None);
        for form in [
            &[0xb8, 0, 0, 0, 0, 0xc3][..],
            &[0x8b, 0x05, 0, 0, 0, 0, 0xc3],
            &[0x48, 0x8d, 0x05, 0, 0, 0, 0, 0x48, 0x8b, 0x00, 0xc3],
        ] {
            for len in 0..form.len() {
                assert_eq!(accessor(&form[..len], 0), None, "{form:02x?}[..{len}]");
            }
        }
    }

    #[test]
    fn the_builtins_are_the_one_long_stretch_without_cfi() {
        let fdes = |ranges: &[(u64, u64)]| -> Vec<Range<u64>> {
            ranges.iter().map(|&(s, e)| s..e).collect()
        };
        // Debian's libnode 137: functions, then 2 MiB without an FDE, then functions again.
        let found = uncovered(&fdes(&[
            (0x39_5000, 0x9b_90df),
            (0x39_4810, 0x39_5000),
            (0xbc_0000, 0xbd_0000),
            (0xbd_0010, 0xbe_0000),
        ]));
        assert_eq!(found, Some(0x9b_90df..0xbc_0000));
        // Gaps under the threshold are a compiler's; two long ones are a guess.
        assert_eq!(uncovered(&fdes(&[(0, 0x1000), (0x1100, 0x2000)])), None);
        assert_eq!(
            uncovered(&fdes(&[
                (0, 0x1000),
                (0x10_0000, 0x10_1000),
                (0x20_0000, 0x20_1000)
            ])),
            None
        );
        assert_eq!(uncovered(&[]), None);
    }
}
