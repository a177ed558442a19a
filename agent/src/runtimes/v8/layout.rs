//! What walking a V8 stack reads, typed: a build's tagging, a JavaScript frame's slots, the
//! frame markers, the instance types and fields that lead from a frame to its function and
//! its code. Pure: made from a build's [`Constants`].
//!
//! Most of it is exported by every release Node ships. What one release leaves out is given
//! by a rule keyed on the version, and every rule is checked against the process's memory
//! by the tests (`tests/tests/integration/v8_layout.rs`: a function's fields read at the
//! addresses V8's own `%DebugPrint` gives), on Node 18 (V8 10.2), 20 (11.3) and 24 (13.6):
//! - the range of instance types that are JavaScript functions (`JSFunction` has subclasses
//!   for class constructors and others, exported as a range only since 13.x);
//! - where a function keeps its code: a tagged `Code` pointer three words past its
//!   `SharedFunctionInfo` before 11.7.368, a word before it from then; with leaptiering (V8
//!   13, Node 24) that word holds a 32-bit handle into the isolate's dispatch table instead;
//! - `Code`'s fields in 11.x, whose metadata V8 lost there: its instruction start is the
//!   pointer two words past its source-position table, then its flags and instruction size.

use super::constants::{Constants, Version};

/// Why a build's layout was not made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("V8 {version}: no {what} in its v8dbg constants")]
    Missing { version: Version, what: String },
    #[error("V8 {0} is older than 10.0, which no supported Node runs")]
    TooOld(Version),
    #[error("V8 builds with pointer compression are not walked (SmiShiftSize is {0}, not 31)")]
    PointerCompression(i32),
    #[error("V8 {version}: {what} is {value}, out of range")]
    OutOfRange {
        version: Version,
        what: String,
        value: i64,
    },
    #[error("no V8 version")]
    NoVersion,
}

/// The oldest V8 read: Node 18's is 10.2.
pub const OLDEST: Version = Version::new(10, 0, 0);

/// Bytes in a pointer and a tagged word: 64-bit builds without pointer compression only.
pub const POINTER: i32 = 8;

/// A V8 build's layout, as the walk reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub version: Version,
    pub tagging: Tagging,
    pub frame: FrameSlots,
    /// The frame markers (`EntryFrame`...), by value, with their names.
    pub markers: Vec<(u32, String)>,
    pub types: InstanceTypes,
    /// `HeapObject::map`: the word every heap object starts with.
    pub map: u16,
    /// `Map::instance_type`: a 16-bit field of the map.
    pub instance_type: u16,
    /// `JSFunction::shared`: its `SharedFunctionInfo`.
    pub function_shared: u16,
    pub function_code: FunctionCode,
    pub code: CodeFields,
    pub code_kind: CodeKinds,
    pub strings: Strings,
    /// `SharedFunctionInfo::script` (`script_or_debug_info` before 12.x: a `DebugInfo` there
    /// while a debugger is attached).
    pub shared_script: u16,
    /// `Script::name`: a string, or `undefined` for code without a name (`eval`).
    pub script_name: u16,
    /// `SharedFunctionInfo::name_or_scope_info`: the function's name (a string) until it is
    /// compiled, then its `ScopeInfo`, which holds the name; a Smi when it has none.
    pub shared_name: u16,
    pub scope_info: ScopeInfoSlots,
    /// Where optimised code keeps its function: `None` where the build does not say in a
    /// form read here (V8 13 wraps the function in its deoptimisation data).
    pub deoptimization: Option<Deoptimization>,
    /// Where code keeps its source positions: `None` where the build does not say in a form
    /// read here (V8 13 moved them into trusted space).
    pub positions: Option<Positions>,
    /// `Script::source` (a string) and `Script::line_ends` (a `FixedArray` of Smis once V8
    /// has counted them, else `undefined`).
    pub script_source: u16,
    pub script_line_ends: u16,
    /// Where a `Code`'s instructions are kept with a way back to it: `None` where the build
    /// does not say in a form read here (before V8 13).
    pub streams: Option<Streams>,
}

/// V8 13's `InstructionStream`: a header (its map, then its `Code`), then the instructions
/// the `Code` starts at. The way from a pc to its code where no function holds the code
/// (on-stack replacement's), as V8's own lookup by inner pointer goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Streams {
    pub kind: u16,
    /// Bytes of the header: where the instructions start.
    pub header: u16,
    /// `InstructionStream::code`: the word after its map.
    pub code: u16,
    /// `Code::instruction_stream`: the `Code`'s way back.
    pub code_stream: u16,
}

/// Where source positions are kept. V8 10 and 11 export the fields but for the tables'
/// places in `Code` (V8 10) and `BytecodeArray` (both), which follow rules the live test
/// checks: `Code::source_position_table` two words before its instruction size, and the
/// bytecode's table three words past its length (after its constant pool and handler
/// table). V8 13 exports fewer (the tables moved to trusted space, as `TrustedByteArray`s):
/// the code's table is the word before `Code::wrapper`, the bytecode's the word after
/// `BytecodeArray::wrapper`, and the function's bytecode the first field of its
/// `SharedFunctionInfo`. V8 12 is not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Positions {
    /// `Code::source_position_table`: a `ByteArray`.
    pub code_table: u16,
    /// `BytecodeArray::source_position_table`: a `ByteArray`, or `undefined` until V8 has
    /// collected the positions (it does so lazily, when a stack trace or a profiler asks).
    pub bytecode_table: u16,
    /// `BytecodeArray::data`: where its bytecode starts; a frame's bytecode offset counts
    /// from the array's tagged address.
    pub bytecode_data: u16,
    /// `SharedFunctionInfo::function_data`: its `BytecodeArray` (or, with baseline code, that
    /// `Code`, whose deoptimisation data slot holds the `BytecodeArray`).
    pub function_data: u16,
    /// `FixedArrayBase::length`: a Smi, in every array's second word.
    pub array_length: u16,
    pub byte_array_type: u16,
    pub fixed_array_type: u16,
}

/// The way from optimised code (Maglev's, TurboFan's) back to its function:
/// `Code::deoptimization_data`, a `FixedArray` whose element `shared_index` is the
/// function's `SharedFunctionInfo`. V8 10 exports neither; its values are 11.3's, which the
/// live test checks. V8 13 exports the indices but not the field (see `layout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deoptimization {
    pub code_field: u16,
    pub shared_index: u8,
    /// V8 13: the element is a `SharedFunctionInfoWrapper`, whose function is at this
    /// offset.
    pub shared_wrapper: Option<u16>,
    /// The inlined functions' count (a Smi), the literal array (whose first elements are
    /// the inlined functions' `SharedFunctionInfo`s) and the inlining positions (a
    /// `ByteArray`).
    pub inlined_count_index: u8,
    pub literal_array_index: u8,
    pub inlining_positions_index: u8,
}

/// A `FixedArray`'s elements start after its map and its length (a Smi).
pub const FIXED_ARRAY_HEADER: u64 = 16;

/// Where a `ScopeInfo` keeps what naming a function reads, in tagged slots after its map:
/// its flags in the first, then the exported indices. The name's own slot follows the
/// locals' names and infos, so it moves with their count (see `shared::function_name`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScopeInfoSlots {
    /// `scopeinfo_idx_ncontextlocals`: a Smi, how many locals live in the function's
    /// context.
    pub context_local_count: u8,
    /// `scopeinfo_idx_first_vars`: where the locals' names start (3 before 12.x; 5 once the
    /// source positions moved ahead of them).
    pub first_vars: u8,
}

/// How strings are told apart and laid out: a string's instance type is below
/// `first_nonstring_type`, its representation and encoding are bits of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strings {
    pub first_nonstring_type: u16,
    pub representation_mask: u16,
    pub sequential: u16,
    pub cons: u16,
    pub external: u16,
    pub sliced: u16,
    pub thin: u16,
    pub encoding_mask: u16,
    /// The encoding bits of a one-byte (Latin-1) string; others are two-byte (UTF-16).
    pub one_byte: u16,
    /// `String::length`, a 32-bit count of characters.
    pub length: u16,
    /// Where a sequential string's characters start (the same for both encodings).
    pub characters: u16,
    pub cons_first: u16,
    pub cons_second: u16,
    pub thin_actual: u16,
    pub sliced_parent: u16,
    /// A Smi.
    pub sliced_offset: u16,
}

/// How tagged words are told apart: a heap object's address has `heap_object_tag` in its
/// low bits; a small integer (Smi) has `smi_tag_mask` clear and its value in the upper half.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tagging {
    pub heap_object_tag_mask: u64,
    pub heap_object_tag: u64,
    pub smi_tag_mask: u64,
    /// A Smi's value is the word shifted right this much (32).
    pub smi_shift: u32,
}

/// A JavaScript frame's slots, relative to its frame pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameSlots {
    /// The function (a `JSFunction`) of a JavaScript frame.
    pub function: i32,
    /// The context, or a typed frame's marker (a Smi) in the same slot.
    pub context: i32,
    /// An interpreted frame's `BytecodeArray` and its current offset (a Smi).
    pub bytecode_array: i32,
    pub bytecode_offset: i32,
}

/// Instance types (a map's `instance_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceTypes {
    /// `JSFunction` and its subclasses, inclusive.
    pub first_function: u16,
    pub last_function: u16,
    pub shared_function_info: u16,
    pub code: u16,
    pub bytecode_array: u16,
    pub script: u16,
    pub scope_info: u16,
}

/// Where a `JSFunction` keeps its code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FunctionCode {
    /// A tagged pointer to its `Code` at this offset.
    Code(u16),
    /// A 32-bit handle into the isolate group's dispatch table (leaptiering), at this offset.
    DispatchHandle(u16),
}

/// `Code`'s fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeFields {
    pub instruction_start: InstructionStart,
    /// A 32-bit size of its instructions.
    pub instruction_size: u16,
    /// A 32-bit flags word holding its kind.
    pub flags: u16,
}

/// Where a `Code`'s instructions start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstructionStart {
    /// Inside the object, this far from its start (V8 10: instructions follow the header).
    Inline(u16),
    /// At the address held in this field (V8 11.1 and later, and every embedded builtin).
    Pointer(u16),
}

/// `CodeKind`s in a `Code`'s flags: `(flags >> shift) & mask`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeKinds {
    pub mask: u32,
    pub shift: u32,
    /// Ignition's bytecode, run by the interpreter's builtins.
    pub interpreted_function: u32,
    /// Sparkplug's code. The kinds after it (Maglev, TurboFan) are optimised code.
    pub baseline: u32,
}

impl CodeKinds {
    /// The kind a `Code`'s flags word says.
    pub fn of(&self, flags: u32) -> u32 {
        flags.checked_shr(self.shift).unwrap_or(0) & self.mask
    }
}

/// The layout of the build whose constants are `constants`.
pub fn layout(constants: &Constants) -> Result<Layout, LayoutError> {
    let version = constants.version.ok_or(LayoutError::NoVersion)?;
    if version < OLDEST {
        return Err(LayoutError::TooOld(version));
    }
    let missing = |what: &str| LayoutError::Missing {
        version,
        what: what.to_owned(),
    };
    let constant = |name: &str| constants.get(name).ok_or_else(|| missing(name));
    let field = |class: &str, field: &str| {
        constants
            .field(class, field)
            .ok_or_else(|| missing(&format!("{class}::{field}")))
    };
    let smi_shift_size = constant("SmiShiftSize")?;
    if smi_shift_size != 31 {
        return Err(LayoutError::PointerCompression(smi_shift_size));
    }
    let tagging = Tagging {
        heap_object_tag_mask: unsigned(
            version,
            "HeapObjectTagMask",
            constant("HeapObjectTagMask")?,
        )?,
        heap_object_tag: unsigned(version, "HeapObjectTag", constant("HeapObjectTag")?)?,
        smi_tag_mask: unsigned(version, "SmiTagMask", constant("SmiTagMask")?)?,
        smi_shift: 32,
    };
    let frame = FrameSlots {
        function: slot(version, "off_fp_function", constant("off_fp_function")?)?,
        context: slot(version, "off_fp_context", constant("off_fp_context")?)?,
        bytecode_array: slot(
            version,
            "off_fp_bytecode_array",
            constant("off_fp_bytecode_array")?,
        )?,
        bytecode_offset: slot(
            version,
            "off_fp_bytecode_offset",
            constant("off_fp_bytecode_offset")?,
        )?,
    };
    let mut markers: Vec<(u32, String)> = constants
        .with_prefix("frametype_")
        .filter_map(|(name, value)| Some((u32::try_from(value).ok()?, name.to_owned())))
        .collect();
    markers.sort();
    if !markers.iter().any(|(_, name)| name == "EntryFrame") {
        return Err(missing("frametype_EntryFrame"));
    }

    let instance_type = |names: &[&str]| -> Result<u16, LayoutError> {
        let value = constants
            .instance_type(names)
            .ok_or_else(|| missing(&format!("type_{}", names[0])))?;
        narrow(version, names[0], value)
    };
    let function = instance_type(&["JSFunction__JS_FUNCTION_TYPE"])?;
    let (first_function, last_function) = match (
        constants.get("FirstJSFunctionType"),
        constants.get("LastJSFunctionType"),
    ) {
        (Some(first), Some(last)) => (
            narrow(version, "FirstJSFunctionType", first)?,
            narrow(version, "LastJSFunctionType", last)?,
        ),
        // JSFunction's subclasses (class constructors, the builtin classes' constructors)
        // follow it and are not exported: up to the next type that is. The range may then
        // take in a few types that are not functions; the walk's next check, the type of
        // the function's SharedFunctionInfo, refuses those.
        _ => {
            let next = constants
                .with_prefix("type_")
                .filter_map(|(_, value)| u16::try_from(value).ok())
                .filter(|&value| value > function)
                .min()
                .ok_or_else(|| missing("an instance type after JS_FUNCTION_TYPE"))?;
            (function, next - 1)
        }
    };
    if !(first_function..=last_function).contains(&function) {
        return Err(LayoutError::OutOfRange {
            version,
            what: "JS_FUNCTION_TYPE, outside the function types".into(),
            value: function.into(),
        });
    }
    let types = InstanceTypes {
        first_function,
        last_function,
        shared_function_info: instance_type(&["SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE"])?,
        code: instance_type(&["Code__CODE_TYPE"])?,
        bytecode_array: instance_type(&["BytecodeArray__BYTECODE_ARRAY_TYPE"])?,
        script: instance_type(&["Script__SCRIPT_TYPE"])?,
        scope_info: instance_type(&["ScopeInfo__SCOPE_INFO_TYPE"])?,
    };

    let offset = |what: &str, value: i32| offset(version, what, value);
    let map = offset("HeapObject::map", field("HeapObject", "map")?)?;
    let instance_type = offset("Map::instance_type", field("Map", "instance_type")?)?;
    let shared = field("JSFunction", "shared")?;
    let function_shared = offset("JSFunction::shared", shared)?;
    let function_code = match constants.field("JSFunction", "code") {
        Some(code) => FunctionCode::Code(offset("JSFunction::code", code)?),
        None if version.major >= 13 => {
            FunctionCode::DispatchHandle(offset("JSFunction::dispatch_handle", shared - POINTER)?)
        }
        None if version.at_least(11, 7, 368) => {
            FunctionCode::Code(offset("JSFunction::code", shared - POINTER)?)
        }
        None => FunctionCode::Code(offset("JSFunction::code", shared + 3 * POINTER)?),
    };
    let code = code_fields(constants, version)?;
    let code_kind = CodeKinds {
        mask: unsigned(version, "CodeKindFieldMask", constant("CodeKindFieldMask")?)? as u32,
        shift: unsigned(
            version,
            "CodeKindFieldShift",
            constant("CodeKindFieldShift")?,
        )? as u32,
        interpreted_function: unsigned(
            version,
            "CodeKindInterpretedFunction",
            constant("CodeKindInterpretedFunction")?,
        )? as u32,
        baseline: unsigned(version, "CodeKindBaseline", constant("CodeKindBaseline")?)? as u32,
    };
    if code_kind.shift >= 32 || code_kind.mask == 0 {
        return Err(LayoutError::OutOfRange {
            version,
            what: "CodeKind's field".into(),
            value: code_kind.shift.into(),
        });
    }
    let strings = strings(constants, version)?;
    let shared_script = constants
        .field("SharedFunctionInfo", "script")
        .or_else(|| constants.field("SharedFunctionInfo", "script_or_debug_info"))
        .ok_or_else(|| missing("SharedFunctionInfo::script"))?;
    let shared_script = offset("SharedFunctionInfo::script", shared_script)?;
    let script_name = offset("Script::name", field("Script", "name")?)?;
    let shared_name = offset(
        "SharedFunctionInfo::name_or_scope_info",
        field("SharedFunctionInfo", "name_or_scope_info")?,
    )?;
    let scope_slot = |name: &str| -> Result<u8, LayoutError> {
        let value = constant(name)?;
        u8::try_from(value)
            .ok()
            .filter(|&slot| (1..MAX_SCOPE_INFO_SLOT).contains(&slot))
            .ok_or_else(|| LayoutError::OutOfRange {
                version,
                what: name.into(),
                value: value.into(),
            })
    };
    let scope_info = ScopeInfoSlots {
        context_local_count: scope_slot("scopeinfo_idx_ncontextlocals")?,
        first_vars: scope_slot("scopeinfo_idx_first_vars")?,
    };
    let index = |name: &str, default: u8| -> Result<u8, LayoutError> {
        let Some(value) = constants.get(name) else {
            return Ok(default);
        };
        u8::try_from(value)
            .ok()
            .filter(|&i| i < MAX_DEOPTIMIZATION_INDEX)
            .ok_or_else(|| LayoutError::OutOfRange {
                version,
                what: name.into(),
                value: value.into(),
            })
    };
    // V8 13's `Code` keeps its deoptimisation data and its positions (protected pointers,
    // a word each without the sandbox) in the two words before its wrapper, the one field
    // of the three it exports.
    let wrapper = if version.major >= 13 {
        constants.field("Code", "wrapper")
    } else {
        None
    };
    // V8 10 exports none of these; its values are 11's.
    let code_field = match constants.field("Code", "deoptimization_data") {
        Some(field) => Some(offset("Code::deoptimization_data", field)?),
        None if version.major == 10 => Some(2 * POINTER as u16),
        None => match wrapper {
            Some(wrapper) => Some(offset("Code::deoptimization_data", wrapper - 2 * POINTER)?),
            None => None,
        },
    };
    // V8 13 keeps the function in a `SharedFunctionInfoWrapper` (trusted space's way to a
    // heap object).
    let wrapped = match (
        constants.get("DeoptimizationDataWrappedSharedFunctionInfoIndex"),
        constants.field("SharedFunctionInfoWrapper", "shared_info"),
    ) {
        (Some(_), Some(field)) => Some(offset("SharedFunctionInfoWrapper::shared_info", field)?),
        _ => None,
    };
    let deoptimization = match code_field {
        Some(code_field)
            if version.major == 10
                || constants
                    .get("DeoptimizationDataSharedFunctionInfoIndex")
                    .is_some()
                || wrapped.is_some() =>
        {
            Some(Deoptimization {
                code_field,
                shared_index: match wrapped {
                    Some(_) => index("DeoptimizationDataWrappedSharedFunctionInfoIndex", 7)?,
                    None => index("DeoptimizationDataSharedFunctionInfoIndex", 6)?,
                },
                shared_wrapper: wrapped,
                inlined_count_index: index("DeoptimizationDataInlinedFunctionCountIndex", 1)?,
                literal_array_index: index("DeoptimizationDataLiteralArrayIndex", 2)?,
                inlining_positions_index: index("DeoptimizationDataInliningPositionsIndex", 7)?,
            })
        }
        _ => None,
    };
    // An instance type every build that has the type exports.
    let exported_type = |name: &str| -> Result<u16, LayoutError> {
        let value = constants
            .instance_type(&[name])
            .ok_or_else(|| missing(&format!("type_{name}")))?;
        narrow(version, name, value)
    };
    let positions = if version.major >= 13 {
        match (
            wrapper,
            constants.field("BytecodeArray", "wrapper"),
            constants.instance_type(&["TrustedByteArray__TRUSTED_BYTE_ARRAY_TYPE"]),
        ) {
            (Some(code_wrapper), Some(bytecode_wrapper), Some(_)) => {
                Some(Positions {
                    code_table: offset("Code::source_position_table", code_wrapper - POINTER)?,
                    // After its wrapper: the positions, then the handler table and the
                    // constant pool.
                    bytecode_table: offset(
                        "BytecodeArray::source_position_table",
                        bytecode_wrapper + POINTER,
                    )?,
                    bytecode_data: offset("BytecodeArray::data", field("BytecodeArray", "data")?)?,
                    // The trusted half of the function's data, its first field.
                    function_data: offset(
                        "SharedFunctionInfo::trusted_function_data",
                        field("SharedFunctionInfo", "name_or_scope_info")? - 2 * POINTER,
                    )?,
                    array_length: offset(
                        "FixedArrayBase::length",
                        field("FixedArrayBase", "length")?,
                    )?,
                    byte_array_type: exported_type("TrustedByteArray__TRUSTED_BYTE_ARRAY_TYPE")?,
                    fixed_array_type: exported_type("FixedArray__FIXED_ARRAY_TYPE")?,
                })
            }
            _ => None,
        }
    } else if version.major <= 11 {
        let code_table = match constants.field("Code", "source_position_table") {
            Some(field) => offset("Code::source_position_table", field)?,
            None => offset(
                "Code::source_position_table",
                i32::from(code.instruction_size) - 2 * POINTER,
            )?,
        };
        let array_length = offset("FixedArrayBase::length", field("FixedArrayBase", "length")?)?;
        Some(Positions {
            code_table,
            bytecode_table: array_length + 3 * POINTER as u16,
            bytecode_data: offset("BytecodeArray::data", field("BytecodeArray", "data")?)?,
            function_data: offset(
                "SharedFunctionInfo::function_data",
                field("SharedFunctionInfo", "function_data")?,
            )?,
            array_length,
            byte_array_type: exported_type("ByteArray__BYTE_ARRAY_TYPE")?,
            fixed_array_type: exported_type("FixedArray__FIXED_ARRAY_TYPE")?,
        })
    } else {
        None
    };
    let script_source = offset("Script::source", field("Script", "source")?)?;
    let script_line_ends = offset("Script::line_ends", field("Script", "line_ends")?)?;
    let streams = match (
        version.major >= 13,
        constants.field("InstructionStream", "instruction_start"),
        constants.instance_type(&["InstructionStream__INSTRUCTION_STREAM_TYPE"]),
        constants.field("Code", "instruction_stream"),
    ) {
        (true, Some(header), Some(kind), Some(code_stream)) => Some(Streams {
            kind: narrow(version, "InstructionStream__INSTRUCTION_STREAM_TYPE", kind)?,
            header: offset("InstructionStream::instruction_start", header)?,
            code: map + POINTER as u16,
            code_stream: offset("Code::instruction_stream", code_stream)?,
        }),
        _ => None,
    };
    Ok(Layout {
        version,
        tagging,
        frame,
        markers,
        types,
        map,
        instance_type,
        function_shared,
        function_code,
        code,
        code_kind,
        strings,
        shared_script,
        script_name,
        shared_name,
        scope_info,
        deoptimization,
        positions,
        script_source,
        script_line_ends,
        streams,
    })
}

/// Past the header entries a `DeoptimizationData` starts with.
const MAX_DEOPTIMIZATION_INDEX: u8 = 32;

/// Past the few header slots a `ScopeInfo` has (flags, counts, positions).
const MAX_SCOPE_INFO_SLOT: u8 = 16;

/// Strings' tags and fields: exported by every release read.
fn strings(constants: &Constants, version: Version) -> Result<Strings, LayoutError> {
    let missing = |what: &str| LayoutError::Missing {
        version,
        what: what.to_owned(),
    };
    let tag = |name: &str| -> Result<u16, LayoutError> {
        narrow(
            version,
            name,
            constants.get(name).ok_or_else(|| missing(name))?,
        )
    };
    let field = |class: &str, name: &str| -> Result<u16, LayoutError> {
        let value = constants
            .field(class, name)
            .ok_or_else(|| missing(&format!("{class}::{name}")))?;
        offset(version, &format!("{class}::{name}"), value)
    };
    let one_byte_characters = field("SeqOneByteString", "chars")?;
    if field("SeqTwoByteString", "chars")? != one_byte_characters {
        return Err(LayoutError::OutOfRange {
            version,
            what: "SeqTwoByteString::chars, unlike SeqOneByteString's".into(),
            value: one_byte_characters.into(),
        });
    }
    Ok(Strings {
        first_nonstring_type: tag("FirstNonstringType")?,
        representation_mask: tag("StringRepresentationMask")?,
        sequential: tag("SeqStringTag")?,
        cons: tag("ConsStringTag")?,
        external: tag("ExternalStringTag")?,
        sliced: tag("SlicedStringTag")?,
        thin: tag("ThinStringTag")?,
        encoding_mask: tag("StringEncodingMask")?,
        one_byte: tag("OneByteStringTag")?,
        length: field("String", "length")?,
        characters: one_byte_characters,
        cons_first: field("ConsString", "first")?,
        cons_second: field("ConsString", "second")?,
        thin_actual: field("ThinString", "actual")?,
        sliced_parent: field("SlicedString", "parent")?,
        sliced_offset: field("SlicedString", "offset")?,
    })
}

/// `Code`'s instruction start, size and flags: exported in 10.x and from 12.x on; in 11.x
/// placed after its source-position table (see the module documentation).
fn code_fields(constants: &Constants, version: Version) -> Result<CodeFields, LayoutError> {
    let offset = |what: &str, value: i32| offset(version, what, value);
    let exported_start = constants
        .with_prefix("class_Code__instruction_start__")
        .next();
    let size = constants.field("Code", "instruction_size");
    let flags = constants.field("Code", "flags");
    if let (Some((spelling, start)), Some(size), Some(flags)) = (exported_start, size, flags) {
        // `uintptr_t` names the offset of the instructions themselves; `Address`, a field
        // holding their address.
        let start = offset("Code::instruction_start", start)?;
        let instruction_start = if spelling == "uintptr_t" {
            InstructionStart::Inline(start)
        } else {
            InstructionStart::Pointer(start)
        };
        return Ok(CodeFields {
            instruction_start,
            instruction_size: offset("Code::instruction_size", size)?,
            flags: offset("Code::flags", flags)?,
        });
    }
    let positions = constants
        .field("Code", "source_position_table")
        .ok_or_else(|| LayoutError::Missing {
            version,
            what: "Code::instruction_start, or Code::source_position_table to place it".into(),
        })?;
    let start = positions + 2 * POINTER;
    let flags = start + POINTER;
    // Until 11.4.59, two 16-bit fields (the builtin id, kind-specific flags) sat between
    // the flags and the size.
    let size = if version.at_least(11, 4, 59) {
        flags + 4
    } else {
        flags + 8
    };
    Ok(CodeFields {
        instruction_start: InstructionStart::Pointer(offset("Code::instruction_start", start)?),
        instruction_size: offset("Code::instruction_size", size)?,
        flags: offset("Code::flags", flags)?,
    })
}

/// Objects are read at most this far from their start.
const MAX_OFFSET: i32 = 4096;

fn offset(version: Version, what: &str, value: i32) -> Result<u16, LayoutError> {
    if (0..MAX_OFFSET).contains(&value) {
        Ok(value as u16)
    } else {
        Err(LayoutError::OutOfRange {
            version,
            what: what.to_owned(),
            value: value.into(),
        })
    }
}

/// A frame slot: below the frame pointer, within a few words.
fn slot(version: Version, what: &str, value: i32) -> Result<i32, LayoutError> {
    if (-256..0).contains(&value) && value % POINTER == 0 {
        Ok(value)
    } else {
        Err(LayoutError::OutOfRange {
            version,
            what: what.to_owned(),
            value: value.into(),
        })
    }
}

fn unsigned(version: Version, what: &str, value: i32) -> Result<u64, LayoutError> {
    u64::try_from(value).map_err(|_| LayoutError::OutOfRange {
        version,
        what: what.to_owned(),
        value: value.into(),
    })
}

fn narrow(version: Version, what: &str, value: i32) -> Result<u16, LayoutError> {
    u16::try_from(value).map_err(|_| LayoutError::OutOfRange {
        version,
        what: what.to_owned(),
        value: value.into(),
    })
}
