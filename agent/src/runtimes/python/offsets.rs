//! Where CPython keeps what the walk reads, per minor version.
//!
//! 3.13 and later describe themselves: `_PyRuntime` starts with `_Py_DebugOffsets`, a cookie
//! and the version, then a flat run of u64 offsets whose order is fixed within a minor
//! version (3.14 and 3.15 inserted fields). 3.11 and 3.12 have no such table; their offsets are kept
//! here. Either way the code-object offsets are checked against the binary's own
//! `PyCode_Type` (its `tp_basicsize` and `tp_members`), so a table that does not fit the
//! interpreter is refused rather than read.
//!
//! One table serves x86-64 and AArch64: both are LP64, and where their C layouts part is
//! glibc's pthread types (`pthread_mutex_t` is 40 bytes on x86-64, 48 on AArch64), which
//! none of these structures holds before a field read here (3.11's headers compiled with
//! `gcc` and `aarch64-linux-gnu-gcc` give every offset below alike). `_PyRuntime`'s
//! `autoTSSkey`, which lies past the GIL's mutexes and moves, is read from code instead.

use super::Version;

/// How the walk knows the frame that ends one C-level call of the eval loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryMark {
    /// 3.11: `is_entry` (a bool at this offset) is set on the eval call's first Python frame,
    /// which is emitted; the chain of that call ends after it.
    IsEntry(u16),
    /// 3.12 and later: the shim frame the eval loop pushes on entry, whose `owner` (a byte at
    /// `offset`) is `value`, ends the chain and is not emitted.
    CStackOwner { offset: u16, value: u8 },
}

/// Offsets in a code object (`PyCodeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeOffsets {
    /// `tp_basicsize`, which is where the bytecode (`co_code_adaptive`) starts.
    pub code_adaptive: u16,
    pub argcount: u16,
    pub firstlineno: u16,
    pub filename: u16,
    pub name: u16,
    pub qualname: u16,
    pub linetable: u16,
}

/// Everything the walk and the naming read, in bytes from the start of each structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offsets {
    /// `PyThreadState.cframe` (3.11, 3.12), through which the running frame is reached.
    pub tstate_cframe: Option<u16>,
    /// The running `_PyInterpreterFrame *`: in the `_PyCFrame` when there is one, else in
    /// the thread state.
    pub current_frame: u16,
    pub frame_code: u16,
    pub frame_previous: u16,
    /// `prev_instr` (3.11, 3.12: the last instruction started) or `instr_ptr` (3.13+: the
    /// one executing).
    pub frame_instr: u16,
    pub entry: EntryMark,
    /// Low bits of the frame's code reference that are tags, not address (3.14's and 3.15's
    /// `_PyStackRef`); objects are 16-byte aligned, so masking them loses nothing.
    pub code_tag_bits: u64,
    pub code: CodeOffsets,
    /// `PyASCIIObject`: `state` (its flag bits), `length`, and where compact ASCII data starts.
    pub unicode_state: u16,
    pub unicode_length: u16,
    pub unicode_data: u16,
    /// `PyBytesObject`: `ob_size` and `ob_sval` (the location table is a bytes object).
    pub bytes_size: u16,
    pub bytes_data: u16,
}

/// 3.11 (CPython's `Include/internal/pycore_frame.h` and `pycore_code.h` of 3.11).
const PYTHON_3_11: Offsets = Offsets {
    tstate_cframe: Some(56),
    current_frame: 8,
    frame_code: 32,
    frame_previous: 48,
    frame_instr: 56,
    entry: EntryMark::IsEntry(68),
    code_tag_bits: 0,
    code: CodeOffsets {
        code_adaptive: 184,
        argcount: 56,
        firstlineno: 72,
        filename: 112,
        name: 120,
        qualname: 128,
        linetable: 136,
    },
    unicode_state: 32,
    unicode_length: 16,
    unicode_data: 48,
    bytes_size: 16,
    bytes_data: 32,
};

/// 3.12 (CPython 3.12's headers): `f_code` moved to the frame's start, the
/// `_PyCFrame` lost its tracing byte, and `PyASCIIObject` its `wstr`.
const PYTHON_3_12: Offsets = Offsets {
    tstate_cframe: Some(56),
    current_frame: 0,
    frame_code: 0,
    frame_previous: 8,
    frame_instr: 56,
    entry: EntryMark::CStackOwner {
        offset: 70,
        value: 3,
    },
    code_tag_bits: 0,
    code: CodeOffsets {
        code_adaptive: 192,
        argcount: 52,
        firstlineno: 68,
        filename: 112,
        name: 120,
        qualname: 128,
        linetable: 136,
    },
    unicode_state: 32,
    unicode_length: 16,
    unicode_data: 40,
    bytes_size: 16,
    bytes_data: 32,
};

/// The offsets for `version` when it predates `_Py_DebugOffsets`.
pub fn static_offsets(version: Version) -> Option<Offsets> {
    match (version.major, version.minor) {
        (3, 11) => Some(PYTHON_3_11),
        (3, 12) => Some(PYTHON_3_12),
        _ => None,
    }
}

/// Why a `_Py_DebugOffsets` was not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DebugOffsetsError {
    #[error("_PyRuntime does not start with the cookie \"xdebugpy\"")]
    NoCookie,
    #[error("_Py_DebugOffsets says version {table:#x}, Py_Version says {binary:#x}")]
    VersionMismatch { table: u64, binary: u64 },
    #[error("a free-threaded build (its frames are not walked)")]
    FreeThreaded,
    #[error("no _Py_DebugOffsets layout known for {0}")]
    UnknownLayout(Version),
    #[error("_Py_DebugOffsets: {field} is {value}, outside its structure of {size} bytes")]
    OutOfRange {
        field: &'static str,
        value: u64,
        size: u64,
    },
    #[error("_Py_DebugOffsets is cut short")]
    Short,
}

/// Where each field the walk needs sits in `_Py_DebugOffsets`, in bytes from its start,
/// with the slot of the `size` of the structure the field belongs to.
struct Slots {
    free_threaded: usize,
    /// (field, slot, size slot)
    fields: [(&'static str, usize, usize); 16],
    /// The `owner` of the shim frame the eval loop pushes on entry: `FRAME_OWNED_BY_CSTACK` (3)
    /// on 3.12 and 3.13; on 3.14 and 3.15 `FRAME_OWNED_BY_INTERPRETER`, also 3 (3.14
    /// renumbered the owners, and its `FRAME_OWNED_BY_CSTACK`, 4, is no longer what `ceval.c`
    /// sets; 3.15 dropped it).
    entry_frame_owner: u8,
    code_tag_bits: u64,
}

/// The order of 3.13's table (`Include/internal/pycore_runtime.h`).
const SLOTS_3_13: Slots = Slots {
    free_threaded: 16,
    fields: [
        ("thread_state.current_frame", 184, 152),
        ("interpreter_frame.previous", 232, 224),
        ("interpreter_frame.executable", 240, 224),
        ("interpreter_frame.instr_ptr", 248, 224),
        ("interpreter_frame.owner", 264, 224),
        ("code_object.filename", 280, 272),
        ("code_object.name", 288, 272),
        ("code_object.qualname", 296, 272),
        ("code_object.linetable", 304, 272),
        ("code_object.firstlineno", 312, 272),
        ("code_object.argcount", 320, 272),
        ("code_object.co_code_adaptive", 344, 272),
        ("bytes_object.ob_size", 520, 512),
        ("bytes_object.ob_sval", 528, 512),
        ("unicode_object.state", 544, 536),
        ("unicode_object.length", 552, 536),
    ],
    entry_frame_owner: 3,
    code_tag_bits: 0,
};

/// 3.14's (`Include/internal/pycore_debug_offsets.h`): the interpreter state gained
/// `threads_main` and two generation counters, the frame `stackpointer` and `tlbc_index`,
/// the code object `co_tlbc`, and a set object came before the dict; the eval loop's entry
/// frame is owned `FRAME_OWNED_BY_INTERPRETER`, 3 (`FRAME_OWNED_BY_CSTACK` became 4).
const SLOTS_3_14: Slots = Slots {
    free_threaded: 16,
    fields: [
        ("thread_state.current_frame", 208, 176),
        ("interpreter_frame.previous", 256, 248),
        ("interpreter_frame.executable", 264, 248),
        ("interpreter_frame.instr_ptr", 272, 248),
        ("interpreter_frame.owner", 288, 248),
        ("code_object.filename", 320, 312),
        ("code_object.name", 328, 312),
        ("code_object.qualname", 336, 312),
        ("code_object.linetable", 344, 312),
        ("code_object.firstlineno", 352, 312),
        ("code_object.argcount", 360, 312),
        ("code_object.co_code_adaptive", 384, 312),
        ("bytes_object.ob_size", 600, 592),
        ("bytes_object.ob_sval", 608, 592),
        ("unicode_object.state", 624, 616),
        ("unicode_object.length", 632, 616),
    ],
    entry_frame_owner: 3,
    code_tag_bits: 7,
};

/// 3.15's (its `Include/internal/pycore_debug_offsets.h`, as Debian's `libpython3.15-dev`
/// ships it, and the DWARF of Debian's 3.15.2): the thread state gained `base_frame`,
/// `last_profiled_frame` and `last_profiled_frame_seq`, and the frame `localsplus`, the code
/// object `localsplusnames` and `localspluskinds`; `_PyStackRef`'s tag bits are
/// `Py_TAG_BITS`, 3. The entry frame's owner is still `FRAME_OWNED_BY_INTERPRETER`, 3: its
/// eval loop stores `0x30000` over the entry frame's `return_offset` and `owner`.
const SLOTS_3_15: Slots = Slots {
    free_threaded: 16,
    fields: [
        ("thread_state.current_frame", 208, 176),
        ("interpreter_frame.previous", 320, 312),
        ("interpreter_frame.executable", 328, 312),
        ("interpreter_frame.instr_ptr", 336, 312),
        ("interpreter_frame.owner", 352, 312),
        ("code_object.filename", 384, 376),
        ("code_object.name", 392, 376),
        ("code_object.qualname", 400, 376),
        ("code_object.linetable", 408, 376),
        ("code_object.firstlineno", 416, 376),
        ("code_object.argcount", 424, 376),
        ("code_object.co_code_adaptive", 448, 376),
        ("bytes_object.ob_size", 696, 688),
        ("bytes_object.ob_sval", 704, 688),
        ("unicode_object.state", 720, 712),
        ("unicode_object.length", 728, 712),
    ],
    entry_frame_owner: 3,
    code_tag_bits: 3,
};

/// Where the ASCII data of a compact string starts: `sizeof(PyASCIIObject)`, the slot after
/// `unicode_object.length` in every layout.
const UNICODE_DATA_AFTER_LENGTH: usize = 8;

/// The offsets a 3.13+ interpreter gives in `table`, the start of its `_PyRuntime` as the
/// file holds it, for the interpreter whose `Py_Version` is `hex_version`.
pub fn debug_offsets(table: &[u8], version: Version) -> Result<Offsets, DebugOffsetsError> {
    let word = |at: usize| -> Result<u64, DebugOffsetsError> {
        table
            .get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .ok_or(DebugOffsetsError::Short)
    };
    if table.get(..8) != Some(b"xdebugpy".as_slice()) {
        return Err(DebugOffsetsError::NoCookie);
    }
    let table_version = word(8)?;
    if table_version != version.hex {
        return Err(DebugOffsetsError::VersionMismatch {
            table: table_version,
            binary: version.hex,
        });
    }
    let slots = match (version.major, version.minor) {
        (3, 13) => &SLOTS_3_13,
        (3, 14) => &SLOTS_3_14,
        (3, 15) => &SLOTS_3_15,
        _ => return Err(DebugOffsetsError::UnknownLayout(version)),
    };
    if word(slots.free_threaded)? != 0 {
        return Err(DebugOffsetsError::FreeThreaded);
    }
    let mut values = [0u16; 16];
    for (i, &(field, slot, size_slot)) in slots.fields.iter().enumerate() {
        let (value, size) = (word(slot)?, word(size_slot)?);
        // An offset is inside its structure: a table read with the wrong layout is not.
        if value >= size || size > 1 << 20 {
            return Err(DebugOffsetsError::OutOfRange { field, value, size });
        }
        values[i] = u16::try_from(value).map_err(|_| DebugOffsetsError::OutOfRange {
            field,
            value,
            size,
        })?;
    }
    let length_slot = slots.fields[15].1;
    let unicode_size = word(slots.fields[15].2)?;
    let unicode_data = word(length_slot + UNICODE_DATA_AFTER_LENGTH)?;
    if unicode_data > unicode_size {
        return Err(DebugOffsetsError::OutOfRange {
            field: "unicode_object.asciiobject_size",
            value: unicode_data,
            size: unicode_size,
        });
    }
    let [current_frame, previous, executable, instr_ptr, owner, filename, name, qualname, linetable, firstlineno, argcount, code_adaptive, bytes_size, bytes_data, unicode_state, unicode_length] =
        values;
    Ok(Offsets {
        tstate_cframe: None,
        current_frame,
        frame_code: executable,
        frame_previous: previous,
        frame_instr: instr_ptr,
        entry: EntryMark::CStackOwner {
            offset: owner,
            value: slots.entry_frame_owner,
        },
        code_tag_bits: slots.code_tag_bits,
        code: CodeOffsets {
            code_adaptive,
            argcount,
            firstlineno,
            filename,
            name,
            qualname,
            linetable,
        },
        unicode_state,
        unicode_length,
        unicode_data: unicode_data as u16,
        bytes_size,
        bytes_data,
    })
}
