//! Where glibc keeps a thread's `pthread_getspecific` values, read from `libc.so.6`.
//!
//! CPython finds a thread's state through a pthread key (`autoTSSkey`), so the BPF walk must
//! do what `pthread_getspecific` does, from the thread pointer (x86-64's `fs` base, AArch64's
//! `tpidr_el0`). glibc keeps the values of the first keys in an array inside `struct
//! pthread`, whose layout is private and changes between releases and architectures (above
//! the thread pointer on x86-64, below it on AArch64): it is read here from the function's
//! own code rather than assumed.
//!
//! The code's pattern is its architecture's (`arch::pthread_specific`).

use super::image::{Image, ImageError};
pub use crate::arch::SpecificLayout;

/// Why a libc's layout was not read.
#[derive(Debug, thiserror::Error)]
pub enum LibcError {
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error("no pthread_getspecific symbol")]
    NoSymbol,
    #[error("pthread_getspecific's code is not a form known here ({0})")]
    UnknownCode(&'static str),
    #[error("pthread_getspecific: {0}")]
    NoDecoder(#[from] crate::arch::NoDecoder),
}

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
    crate::arch::pthread_specific(image.architecture(), code, symbol.address)?
        .map_err(LibcError::UnknownCode)
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
    fn debian_12s_arm64_glibc_keeps_them_below_the_thread_pointer() {
        use crate::arch::aarch64::test_files;
        let data = test_files::read(test_files::LIBC);
        let elf = crate::binary::elf::Elf::parse(&data).unwrap();
        let image = Image::of(&elf);
        let layout = specific_layout(&image).unwrap();
        // `*(tpidr_el0 + key * 16 - 0x630 + 8)`: `struct pthread` ends at the thread pointer.
        assert_eq!(
            layout,
            SpecificLayout {
                first_block: 32,
                index_bias: 0,
                entry_shift: 4,
                value_offset: 8u64.wrapping_sub(0x630),
            }
        );
        assert_eq!(layout.offset(0).map(|o| o as i64), Some(-0x628));
        assert_eq!(layout.offset(31).map(|o| o as i64), Some(-0x438));
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
