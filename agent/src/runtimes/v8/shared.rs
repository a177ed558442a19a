//! What a `SharedFunctionInfo` (the part of a JavaScript function its closures share) says
//! of the function, read from the process's memory: its name and the script it belongs to.
//!
//! A function's name is a string in its `SharedFunctionInfo` until the function is compiled;
//! from then on that slot holds the function's `ScopeInfo`, which keeps the name among its
//! variable-length parts. Where, depends on bits of its flags (`ScopeFlags` in V8's
//! `scope-info.tq`) and on how many locals its context holds: after the header slots come
//! the locals' names (inline below [`MAX_INLINED_LOCAL_NAMES`], else one slot for a hash
//! table), their infos, a class's saved variable when the flags say, then the function
//! variable's name and slot, then the name V8 inferred for a function without one of its own
//! (`holder.method = function () {}` is `holder.method`), which V8's profiler shows in its
//! place, as this does.
//!
//! The live test (`tests/tests/integration/v8_layout.rs`) reads the names of functions of
//! each shape on Node 18, 20 and 24 (V8 10.2, 11.3, 13.6): the flags are a Smi in the first
//! two and a raw 32-bit word in 13.6, and the function variable's two bits are at 12 in
//! all three. The saved class variable's bit (10) is V8's `scope-info.tq`'s; no function in
//! that test sets it.

use super::layout::{Layout, POINTER};
use super::strings::{instance_type, read_string, untag, StringError};
use crate::runtimes::memory::{read_u64, Memory};

/// Why a `SharedFunctionInfo` was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SharedError {
    #[error("the object at {address:#x} has instance type {kind}, not a SharedFunctionInfo's")]
    NotShared { address: u64, kind: u16 },
    #[error("the ScopeInfo at {address:#x} has {word:#x} for {what}")]
    BadScopeInfo {
        address: u64,
        what: &'static str,
        word: u64,
    },
    #[error(transparent)]
    Read(#[from] StringError),
}

/// Longest script name read: a URL or a path.
pub const MAX_SCRIPT_NAME: usize = 1024;

/// Longest function name read.
pub const MAX_FUNCTION_NAME: usize = 256;

/// `ScopeFlags::has_saved_class_variable`: a slot for the class variable follows the
/// locals' infos.
const SAVED_CLASS_VARIABLE: u32 = 1 << 10;
/// `ScopeFlags::function_variable`, two bits: `NONE` (0) when the scope keeps no function
/// name; otherwise where the function's own variable lives, and its name is kept either way.
const FUNCTION_VARIABLE_SHIFT: u32 = 12;
/// `ScopeFlags::has_inferred_function_name`: a slot for the inferred name follows the
/// function variable's.
const INFERRED_FUNCTION_NAME: u32 = 1 << 14;
/// `kScopeInfoMaxInlinedLocalNamesSize`: from this many context locals on, their names are
/// in a hash table, one slot, instead of inline.
pub const MAX_INLINED_LOCAL_NAMES: u64 = 75;
/// Most context locals believed: more is not a `ScopeInfo` this reads.
const MAX_CONTEXT_LOCALS: u64 = 1 << 16;

/// The name of the function whose `SharedFunctionInfo` is `shared` (a tagged pointer), or
/// for one without, the name V8 inferred from where it was assigned, as V8's profiler names
/// it (`SharedFunctionInfo::DebugNameCStr`): `Ok(None)` when it has neither (an anonymous
/// callback, a script's or a module's top level). Names longer than [`MAX_FUNCTION_NAME`]
/// are cut.
pub fn function_name(
    memory: &dyn Memory,
    layout: &Layout,
    shared: u64,
) -> Result<Option<String>, SharedError> {
    let shared = shared_object(memory, layout, shared)?;
    let at = shared.wrapping_add(u64::from(layout.shared_name));
    let value = read_u64(memory, at).ok_or(StringError::Unreadable(at))?;
    // A Smi: `kNoSharedNameSentinel`.
    let Ok(object) = untag(layout, value) else {
        return Ok(None);
    };
    let kind = instance_type(memory, layout, object)?;
    let names = if layout.strings.is_string(kind) {
        [Some(value), None]
    } else if kind == layout.types.scope_info {
        scope_info_names(memory, layout, object)?
    } else {
        return Ok(None);
    };
    for name in names.into_iter().flatten() {
        let name = read_string(memory, layout, name, MAX_FUNCTION_NAME)?;
        if !name.is_empty() {
            return Ok(Some(name));
        }
    }
    Ok(None)
}

/// The tagged names a `ScopeInfo` (at `scope_info`, untagged) keeps of its function: its
/// own, and the one V8 inferred, each if any.
fn scope_info_names(
    memory: &dyn Memory,
    layout: &Layout,
    scope_info: u64,
) -> Result<[Option<u64>; 2], SharedError> {
    // Slot `index` is the tagged word `index` after the map.
    let slot = |index: u64| -> Result<u64, SharedError> {
        let at = scope_info.wrapping_add(POINTER as u64 * (1 + index));
        Ok(read_u64(memory, at).ok_or(StringError::Unreadable(at))?)
    };
    let word = slot(0)?;
    // A Smi's value is in the upper half, its lower half zero; a raw word's upper half is
    // padding. A function scope's flags are never zero (it is a declaration scope).
    let flags = if word as u32 == 0 {
        (word >> 32) as u32
    } else {
        word as u32
    };
    let function_variable = (flags >> FUNCTION_VARIABLE_SHIFT) & 3 != 0;
    let inferred = flags & INFERRED_FUNCTION_NAME != 0;
    if !function_variable && !inferred {
        return Ok([None, None]);
    }
    let at = u64::from(layout.scope_info.context_local_count);
    let count = slot(at)?;
    let locals = count >> layout.tagging.smi_shift;
    if count & layout.tagging.smi_tag_mask != 0 || locals > MAX_CONTEXT_LOCALS {
        return Err(SharedError::BadScopeInfo {
            address: scope_info,
            what: "its count of context locals",
            word: count,
        });
    }
    let names = if locals < MAX_INLINED_LOCAL_NAMES {
        locals
    } else {
        1
    };
    let index = u64::from(layout.scope_info.first_vars)
        + names
        + locals
        + u64::from(flags & SAVED_CLASS_VARIABLE != 0);
    // A string, or `Zero` (a function variable without a name) or `undefined` (no inferred
    // name): what is not a string reads as none.
    let string = |name: u64| -> Result<Option<u64>, SharedError> {
        let Ok(object) = untag(layout, name) else {
            return Ok(None);
        };
        let kind = instance_type(memory, layout, object)?;
        Ok(layout.strings.is_string(kind).then_some(name))
    };
    let own = if function_variable {
        string(slot(index)?)?
    } else {
        None
    };
    let inferred = if inferred {
        // After the function variable's name and slot, when it has them.
        string(slot(index + 2 * u64::from(function_variable))?)?
    } else {
        None
    };
    Ok([own, inferred])
}

/// The untagged address of the `SharedFunctionInfo` at `shared`, checked to be one.
fn shared_object(memory: &dyn Memory, layout: &Layout, shared: u64) -> Result<u64, SharedError> {
    let object = untag(layout, shared)?;
    let kind = instance_type(memory, layout, object)?;
    if kind != layout.types.shared_function_info {
        return Err(SharedError::NotShared {
            address: object,
            kind,
        });
    }
    Ok(object)
}

/// The name of the script the function whose `SharedFunctionInfo` is `shared` (a tagged
/// pointer) belongs to: `Ok(None)` when it has none to give (code from `eval` or `new
/// Function`, or a `DebugInfo` in the slot while a debugger is attached).
pub fn script_name(
    memory: &dyn Memory,
    layout: &Layout,
    shared: u64,
) -> Result<Option<String>, SharedError> {
    let shared = shared_object(memory, layout, shared)?;
    let at = shared.wrapping_add(u64::from(layout.shared_script));
    let script = read_u64(memory, at).ok_or(StringError::Unreadable(at))?;
    let Ok(script) = untag(layout, script) else {
        return Ok(None);
    };
    if instance_type(memory, layout, script)? != layout.types.script {
        return Ok(None);
    }
    let at = script.wrapping_add(u64::from(layout.script_name));
    let name = read_u64(memory, at).ok_or(StringError::Unreadable(at))?;
    let Ok(name_object) = untag(layout, name) else {
        return Ok(None);
    };
    if !layout
        .strings
        .is_string(instance_type(memory, layout, name_object)?)
    {
        return Ok(None);
    }
    Ok(Some(read_string(memory, layout, name, MAX_SCRIPT_NAME)?))
}
