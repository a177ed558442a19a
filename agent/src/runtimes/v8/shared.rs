//! What a `SharedFunctionInfo` (the part of a JavaScript function its closures share) says
//! of the function, read from the process's memory: the script it belongs to.

use super::layout::Layout;
use super::strings::{instance_type, read_string, untag, StringError};
use crate::runtimes::memory::{read_u64, Memory};

/// Why a `SharedFunctionInfo` was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SharedError {
    #[error("the object at {address:#x} has instance type {kind}, not a SharedFunctionInfo's")]
    NotShared { address: u64, kind: u16 },
    #[error(transparent)]
    Read(#[from] StringError),
}

/// Longest script name read: a URL or a path.
pub const MAX_SCRIPT_NAME: usize = 1024;

/// The name of the script the function whose `SharedFunctionInfo` is `shared` (a tagged
/// pointer) belongs to: `Ok(None)` when it has none to give (code from `eval` or `new
/// Function`, or a `DebugInfo` in the slot while a debugger is attached).
pub fn script_name(
    memory: &dyn Memory,
    layout: &Layout,
    shared: u64,
) -> Result<Option<String>, SharedError> {
    let shared = untag(layout, shared)?;
    let kind = instance_type(memory, layout, shared)?;
    if kind != layout.types.shared_function_info {
        return Err(SharedError::NotShared {
            address: shared,
            kind,
        });
    }
    let at = shared + u64::from(layout.shared_script);
    let script = read_u64(memory, at).ok_or(StringError::Unreadable(at))?;
    let Ok(script) = untag(layout, script) else {
        return Ok(None);
    };
    if instance_type(memory, layout, script)? != layout.types.script {
        return Ok(None);
    }
    let at = script + u64::from(layout.script_name);
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
