//! CPython interpreters: recognising one in a binary, what the BPF walk needs of it
//! (`runtime`: the registry's entry and a process's `PYTHON_PROCS` value), and the names of
//! its frames (`names`).
//!
//! A binary is an interpreter when it defines `Py_Version` and `_PyRuntime` (Debian's
//! `python3.X` links libpython in; an embedder maps `libpython3.X.so`). From the binary
//! alone, never the process, this reads:
//! - the version (`Py_Version`, `PY_VERSION_HEX`), 3.11 to 3.15;
//! - the offsets of the thread state, frames, code objects and strings (`offsets`), checked
//!   against the binary's own `PyCode_Type`;
//! - the eval loop's address ranges: `_PyEval_EvalFrameDefault` and the parts GCC split off
//!   it (`.cold`; in 3.14 most of the loop), found as the unnamed `.eh_frame` ranges its
//!   direct jumps land in;
//! - where the thread's state is, from `PyGILState_GetThisThreadState`'s code: under the
//!   `autoTSSkey` pthread key (3.11 to 3.14), or in the thread-local `_Py_tss_gilstate`
//!   (3.15, which dropped the key). Both hold a thread's state whether or not the thread
//!   holds the GIL (3.12+'s `_Py_tss_tstate` is cleared while a thread runs without it, as
//!   `hashlib` does on large inputs).

pub mod names;
pub mod offsets;
pub mod runtime;

use std::{fmt, ops::Range};

use super::image::{Image, ImageError, Symbol};
use crate::arch::{
    executable_thread_local, first_argument, jumps_out, returned_thread_local, FirstArgument, Place,
};
pub use names::{PythonProcess, UNKNOWN_CODE};
pub use offsets::{CodeOffsets, EntryMark, Offsets};
pub use runtime::{may_be, Python};

/// Whether Python's frames are walked (`--python`): Python's switch, beside what it turns on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PythonMode {
    /// CPython 3.11 to 3.15 interpreters are recognised from their binaries and their Python
    /// frames walked in BPF, in place of the eval loop's.
    #[default]
    Auto,
    /// Interpreters are not looked for: their stacks show the eval loop's C frames.
    Off,
}

/// Why a binary that defines CPython's symbols is not walked.
#[derive(Debug, thiserror::Error)]
pub enum PythonError {
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error("Python {0}: versions 3.11 to 3.15 are walked")]
    Unsupported(Version),
    #[error("Python older than 3.11 (no Py_Version): versions 3.11 to 3.15 are walked")]
    TooOld,
    #[error("Python {version}: no {symbol} symbol")]
    Missing {
        version: Version,
        symbol: &'static str,
    },
    #[error("Python {version}: {0}", .source)]
    DebugOffsets {
        version: Version,
        source: offsets::DebugOffsetsError,
    },
    #[error(
        "Python {version}: the code object's {field} is at {binary} in this binary's PyCode_Type, \
         {expected} in the offsets for this version"
    )]
    CodeMismatch {
        version: Version,
        field: &'static str,
        binary: u64,
        expected: u64,
    },
    #[error("Python {version}: PyCode_Type has no {0} member", .field)]
    NoMember {
        version: Version,
        field: &'static str,
    },
    #[error(
        "Python {version}: the thread-state key could not be read from \
         PyGILState_GetThisThreadState's code"
    )]
    NoThreadKey { version: Version },
    #[error(
        "Python {version}: PyGILState_GetThisThreadState does not read its thread-local at a \
         fixed offset from the thread pointer (a shared libpython, whose thread-locals are \
         placed when it is loaded, is not walked)"
    )]
    NoThreadLocal { version: Version },
    #[error("Python {version}: {source}")]
    NoDecoder {
        version: Version,
        source: crate::arch::NoDecoder,
    },
}

/// Where a thread's `PyThreadState` is found, from the thread pointer (x86-64's `fs` base,
/// AArch64's `tpidr_el0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadState {
    /// 3.11 to 3.14: the value of a pthread key, whose `int` is at this address, inside
    /// `_PyRuntime` (`autoTSSkey`).
    Key(u64),
    /// 3.15 and later: a thread-local of the interpreter's executable, at this offset from
    /// the thread pointer (`_Py_tss_gilstate`): negative on x86-64, past the thread control
    /// block on AArch64.
    ThreadLocal(i32),
}

/// `PY_VERSION_HEX`, split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version {
    pub major: u8,
    pub minor: u8,
    pub micro: u8,
    pub hex: u64,
}

impl Version {
    pub fn from_hex(hex: u64) -> Version {
        Version {
            major: (hex >> 24) as u8,
            minor: (hex >> 16) as u8,
            micro: (hex >> 8) as u8,
            hex,
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.micro)
    }
}

/// A CPython interpreter binary, as the walk needs it. Addresses are the binary's own (ELF
/// addresses); the process adds its load bias.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpreter {
    pub version: Version,
    /// `_PyRuntime`.
    pub runtime: Symbol,
    /// `_PyEval_EvalFrameDefault` and its split-off parts.
    pub eval: Vec<Range<u64>>,
    pub thread_state: ThreadState,
    /// `PyCode_Type`: a frame's code object has it as its type, or the frame is not walked.
    pub code_type: u64,
    /// `_Py_NoneStruct`: a 3.13+ entry frame's code.
    pub none: u64,
    pub offsets: Offsets,
}

/// `PyTypeObject` on x86-64 and AArch64: `tp_basicsize` and `tp_members`, stable since 3.0.
const TP_BASICSIZE: u64 = 32;
const TP_MEMBERS: u64 = 240;
/// `PyMemberDef`: `name` at 0, `offset` at 16, 40 bytes each.
const MEMBER_SIZE: u64 = 40;
const MEMBER_OFFSET: u64 = 16;
/// More members than a code object has ends the read: a table without its terminator.
const MAX_MEMBERS: u64 = 64;
/// `Py_tss_t` is `{ int _is_initialized; pthread_key_t _key; }`.
const TSS_KEY: u64 = 4;

fn symbol(image: &Image, version: Version, name: &'static str) -> Result<Symbol, PythonError> {
    image.symbol(name).ok_or(PythonError::Missing {
        version,
        symbol: name,
    })
}

/// The interpreter in `image`, `Ok(None)` when it is not one (it does not define
/// `Py_Version`, `_PyRuntime` and `_PyEval_EvalFrameDefault`).
pub fn interpreter(image: &Image) -> Result<Option<Interpreter>, PythonError> {
    let (Some(runtime), Some(eval)) = (
        image.symbol("_PyRuntime"),
        image.symbol("_PyEval_EvalFrameDefault"),
    ) else {
        return Ok(None);
    };
    let version = Version::from_hex(
        image
            .symbol("Py_Version")
            .map(|s| image.u64_at("Py_Version", s.address))
            .ok_or(PythonError::TooOld)??
            // `Py_Version` is an `unsigned long`; its value fits 32 bits.
            & 0xffff_ffff,
    );
    if version.major != 3 || !(11..=15).contains(&version.minor) {
        return Err(PythonError::Unsupported(version));
    }
    let offsets = match offsets::static_offsets(version) {
        Some(offsets) => offsets,
        None => {
            let table = image.bytes_at("_PyRuntime", runtime.address, runtime.size.min(4096))?;
            offsets::debug_offsets(table, version)
                .map_err(|source| PythonError::DebugOffsets { version, source })?
        }
    };
    let code_type = symbol(image, version, "PyCode_Type")?;
    check_code_offsets(image, version, code_type.address, &offsets.code)?;
    let thread_state = thread_state(image, version, runtime)?;
    let none = symbol(image, version, "_Py_NoneStruct")?.address;
    Ok(Some(Interpreter {
        version,
        runtime,
        eval: eval_ranges(image, version, eval)?,
        thread_state,
        code_type: code_type.address,
        none,
        offsets,
    }))
}

/// Checks `expected` against `PyCode_Type`'s `tp_basicsize` and `tp_members` in the binary.
fn check_code_offsets(
    image: &Image,
    version: Version,
    code_type: u64,
    expected: &CodeOffsets,
) -> Result<(), PythonError> {
    let mismatch = |field, binary: u64, expected: u16| {
        (binary != u64::from(expected)).then_some(PythonError::CodeMismatch {
            version,
            field,
            binary,
            expected: u64::from(expected),
        })
    };
    let basicsize = image.u64_at("PyCode_Type.tp_basicsize", code_type + TP_BASICSIZE)?;
    if let Some(err) = mismatch(
        "co_code_adaptive (tp_basicsize)",
        basicsize,
        expected.code_adaptive,
    ) {
        return Err(err);
    }
    let members = image.pointer_at("PyCode_Type.tp_members", code_type + TP_MEMBERS)?;
    let mut found = Vec::new();
    for i in 0..MAX_MEMBERS {
        let member = members + i * MEMBER_SIZE;
        let name = image.pointer_at("PyMemberDef.name", member)?;
        if name == 0 {
            break;
        }
        let name = image.c_str_at("PyMemberDef.name", name, 64)?;
        let offset = image.u64_at("PyMemberDef.offset", member + MEMBER_OFFSET)?;
        found.push((name, offset));
    }
    for (field, expected) in [
        ("co_argcount", expected.argcount),
        ("co_firstlineno", expected.firstlineno),
        ("co_filename", expected.filename),
        ("co_name", expected.name),
        ("co_qualname", expected.qualname),
        ("co_linetable", expected.linetable),
    ] {
        let binary = found
            .iter()
            .find(|(name, _)| *name == field.as_bytes())
            .map(|&(_, offset)| offset)
            .ok_or(PythonError::NoMember { version, field })?;
        if let Some(err) = mismatch(field, binary, expected) {
            return Err(err);
        }
    }
    Ok(())
}

/// Where `PyGILState_GetThisThreadState` finds the thread's state: 3.15 returns its
/// thread-local `_Py_tss_gilstate`; earlier versions load `autoTSSkey`'s pthread key and
/// tail-call `pthread_getspecific` (3.11 to 3.13), or pass the key's `Py_tss_t` to
/// `PyThread_tss_get` (3.14, and every shared `libpython`, which reaches `_PyRuntime`
/// through its GOT slot). The key lies in `_PyRuntime`.
fn thread_state(
    image: &Image,
    version: Version,
    runtime: Symbol,
) -> Result<ThreadState, PythonError> {
    let function = symbol(image, version, "PyGILState_GetThisThreadState")?;
    let code = image.code("PyGILState_GetThisThreadState", function)?;
    if version.minor >= 15 {
        let architecture = image.architecture();
        let no_decoder = |source| PythonError::NoDecoder { version, source };
        return returned_thread_local(architecture, code, function.address)
            .map_err(no_decoder)?
            .filter(|&offset| executable_thread_local(architecture, offset))
            .and_then(|offset| i32::try_from(offset).ok())
            .map(ThreadState::ThreadLocal)
            .ok_or(PythonError::NoThreadLocal { version });
    }
    let resolve = |place: Place| -> Result<u64, PythonError> {
        Ok(match place {
            Place::Fixed(address) => address,
            Place::Pointed { slot, offset } => image
                .pointer_at("the GOT slot PyGILState_GetThisThreadState reads", slot)?
                .wrapping_add(offset),
        })
    };
    let first = first_argument(image.architecture(), code, function.address)
        .map_err(|source| PythonError::NoDecoder { version, source })?;
    let key = match first {
        Some(FirstArgument::Loaded(place)) => resolve(place)?,
        Some(FirstArgument::Address(tss)) => resolve(tss)?.wrapping_add(TSS_KEY),
        None => return Err(PythonError::NoThreadKey { version }),
    };
    let inside = runtime.address..runtime.address + runtime.size;
    if !inside.contains(&key) || !inside.contains(&(key + 3)) {
        return Err(PythonError::NoThreadKey { version });
    }
    Ok(ThreadState::Key(key))
}

/// `_PyEval_EvalFrameDefault`'s range and those of its split-off parts: the `.eh_frame`
/// ranges its direct jumps land in that no symbol names (a jump into a named function is a
/// tail call).
fn eval_ranges(
    image: &Image,
    version: Version,
    eval: Symbol,
) -> Result<Vec<Range<u64>>, PythonError> {
    let own = eval.address..eval.address + eval.size;
    let code = image.code("_PyEval_EvalFrameDefault", eval)?;
    let named: Vec<Range<u64>> = image
        .symbols()
        .filter(|(_, s)| s.size > 0)
        .map(|(_, s)| s.address..s.address + s.size)
        .collect();
    let fdes = image.fde_ranges();
    let mut ranges = vec![own.clone()];
    let jumps = jumps_out(image.architecture(), code, eval.address)
        .map_err(|source| PythonError::NoDecoder { version, source })?;
    for target in jumps {
        if named.iter().any(|r| r.contains(&target)) {
            continue;
        }
        // FDEs are sorted by start and do not overlap.
        let at = fdes.partition_point(|r| r.start <= target);
        let Some(fde) = at.checked_sub(1).map(|i| &fdes[i]) else {
            continue;
        };
        if fde.contains(&target)
            && !named.iter().any(|r| r.start < fde.end && fde.start < r.end)
            && !ranges.contains(fde)
        {
            ranges.push(fde.clone());
        }
    }
    ranges.sort_by_key(|r| r.start);
    Ok(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Debian 12's own interpreter, which these machines run.
    #[test]
    fn debian_12s_python_3_11() {
        let data = std::fs::read("/usr/bin/python3.11").expect("Debian 12's /usr/bin/python3.11");
        let elf = crate::binary::elf::Elf::parse(&data).unwrap();
        let image = Image::of(&elf);
        let interpreter = interpreter(&image).unwrap().expect("an interpreter");
        assert_eq!(
            (interpreter.version.major, interpreter.version.minor),
            (3, 11)
        );
        assert_eq!(
            interpreter.offsets,
            offsets::static_offsets(interpreter.version).unwrap()
        );
        // The key is `_PyRuntime.autoTSSkey._key`.
        assert_eq!(
            interpreter.thread_state,
            ThreadState::Key(interpreter.runtime.address + 0x254)
        );
        // The hot loop, and the cold part GCC split off it (reached by its jumps).
        let eval = image.symbol("_PyEval_EvalFrameDefault").unwrap();
        assert_eq!(interpreter.eval.len(), 2, "{:x?}", interpreter.eval);
        assert!(interpreter
            .eval
            .contains(&(eval.address..eval.address + eval.size)));
        let cold = interpreter
            .eval
            .iter()
            .find(|r| r.start != eval.address)
            .unwrap();
        assert!(cold.end - cold.start > 1024, "{cold:x?}");
    }

    /// Debian 12's arm64 interpreter: the same readers, on the AArch64 decoder.
    #[test]
    fn debian_12s_arm64_python_3_11() {
        use crate::arch::aarch64::test_files;
        let data = test_files::read(test_files::PYTHON);
        let elf = crate::binary::elf::Elf::parse(&data).unwrap();
        let image = Image::of(&elf);
        let interpreter = interpreter(&image).unwrap().expect("an interpreter");
        assert_eq!(
            (interpreter.version.major, interpreter.version.minor),
            (3, 11)
        );
        // `_PyRuntime.autoTSSkey._key`: 16 bytes further than on x86-64, past the GIL's two
        // `pthread_mutex_t`s, 8 bytes larger each on arm64.
        assert_eq!(
            interpreter.thread_state,
            ThreadState::Key(interpreter.runtime.address + 0x264)
        );
        // Nothing split off the loop in this build: every direct branch in it lands inside
        // it (`aarch64-linux-gnu-objdump -d` agrees), unlike x86-64's `.cold` part.
        let eval = image.symbol("_PyEval_EvalFrameDefault").unwrap();
        let own = eval.address..eval.address + eval.size;
        assert_eq!(interpreter.eval, vec![own], "{:x?}", interpreter.eval);
    }

    /// Debian 12's arm64 shared libpython, which reaches `_PyRuntime` through its GOT: the key
    /// is found from the slot's relocation.
    #[test]
    fn debian_12s_arm64_libpython_3_11() {
        use crate::arch::aarch64::test_files;
        let data = test_files::read(test_files::LIBPYTHON);
        let elf = crate::binary::elf::Elf::parse(&data).unwrap();
        let image = Image::of(&elf);
        let interpreter = interpreter(&image).unwrap().expect("an interpreter");
        assert_eq!(
            interpreter.thread_state,
            ThreadState::Key(interpreter.runtime.address + 0x264)
        );
    }

    #[test]
    fn not_an_interpreter() {
        let data = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
        assert_eq!(
            interpreter(&Image::of(&crate::binary::elf::Elf::parse(&data).unwrap())).unwrap(),
            None
        );
    }

    /// A 3.13 table with one offset beyond its structure is refused, as is one whose version
    /// differs from `Py_Version`; the good one reads.
    #[test]
    fn debug_offsets_are_checked() {
        // Python 3.13.5's table as Debian 13's python3.13 holds it, the slots the walk reads.
        let mut table = vec![0u8; 1024];
        table[..8].copy_from_slice(b"xdebugpy");
        let mut put =
            |at: usize, value: u64| table[at..at + 8].copy_from_slice(&value.to_le_bytes());
        put(8, 0x030d05f0);
        for (at, value) in [
            (152, 304),
            (184, 72),
            (224, 80),
            (232, 8),
            (240, 0),
            (248, 56),
            (264, 70),
            (272, 208),
            (280, 112),
            (288, 120),
            (296, 128),
            (304, 136),
            (312, 68),
            (320, 52),
            (344, 200),
            (512, 40),
            (520, 16),
            (528, 32),
            (536, 64),
            (544, 32),
            (552, 16),
            (560, 40),
        ] {
            put(at, value);
        }
        let version = Version::from_hex(0x030d05f0);
        let offsets = offsets::debug_offsets(&table, version).unwrap();
        assert_eq!(offsets.current_frame, 72);
        assert_eq!(
            offsets.entry,
            EntryMark::CStackOwner {
                offset: 70,
                value: 3
            }
        );
        assert_eq!(offsets.code.code_adaptive, 200);
        assert_eq!(offsets.unicode_data, 40);

        let other = Version::from_hex(0x030d06f0);
        assert!(matches!(
            offsets::debug_offsets(&table, other),
            Err(offsets::DebugOffsetsError::VersionMismatch { .. })
        ));
        let mut bad = table.clone();
        bad[264..272].copy_from_slice(&90u64.to_le_bytes());
        assert!(matches!(
            offsets::debug_offsets(&bad, version),
            Err(offsets::DebugOffsetsError::OutOfRange {
                field: "interpreter_frame.owner",
                ..
            })
        ));
        bad[..8].copy_from_slice(b"notdebug");
        assert_eq!(
            offsets::debug_offsets(&bad, version),
            Err(offsets::DebugOffsetsError::NoCookie)
        );
    }

    /// 3.15's table, laid out as Debian's python3.15 (3.15.2) holds it: its slots moved from
    /// 3.14's, and read with 3.14's they would fail the range checks.
    #[test]
    fn debug_offsets_of_3_15() {
        let mut table = vec![0u8; 1024];
        table[..8].copy_from_slice(b"xdebugpy");
        let mut put =
            |at: usize, value: u64| table[at..at + 8].copy_from_slice(&value.to_le_bytes());
        put(8, 0x030f02f0);
        for (at, value) in [
            (176, 888),
            (208, 72),
            (312, 88),
            (320, 8),
            (328, 0),
            (336, 56),
            (352, 74),
            (376, 216),
            (384, 112),
            (392, 120),
            (400, 128),
            (408, 136),
            (416, 68),
            (424, 52),
            (448, 208),
            (688, 40),
            (696, 16),
            (704, 32),
            (712, 64),
            (720, 32),
            (728, 16),
            (736, 40),
        ] {
            put(at, value);
        }
        let offsets = offsets::debug_offsets(&table, Version::from_hex(0x030f02f0)).unwrap();
        assert_eq!(
            (
                offsets.current_frame,
                offsets.frame_previous,
                offsets.frame_instr
            ),
            (72, 8, 56)
        );
        assert_eq!(
            offsets.entry,
            EntryMark::CStackOwner {
                offset: 74,
                value: 3
            }
        );
        assert_eq!(offsets.code_tag_bits, 3);
        assert_eq!(offsets.code.code_adaptive, 208);
        assert_eq!((offsets.code.firstlineno, offsets.code.argcount), (68, 52));
        assert_eq!((offsets.unicode_data, offsets.bytes_data), (40, 32));
        // A 3.16 is refused, whatever its table says.
        let mut next = table.clone();
        next[8..16].copy_from_slice(&0x031000a0u64.to_le_bytes());
        assert!(matches!(
            offsets::debug_offsets(&next, Version::from_hex(0x031000a0)),
            Err(offsets::DebugOffsetsError::UnknownLayout(_))
        ));
    }
}
