//! The runtimes whose frames the walk reads from their own data structures, one file each.
//!
//! The native walk names none of them: a process mapping's `UnwindMapping::runtime` (written
//! by the agent's loader for the code a runtime owns, such as CPython's eval loop) says which
//! runtime a frame belongs to, and the walk's next iteration calls [`walk`] with that id. The
//! runtime adds its frames with `shared::stack::push_frame`, sets `WalkState::claimed` when
//! they stand for the native frame, and keeps its own per-walk state in its own map, in the
//! walk's slot, reset when `WalkState::serial` changes. Its entry is a global function that
//! takes the walk's slot (a scalar) and looks the walk up itself, so the verifier checks it
//! once on its own. Adding one: a file here, a value in `scorch_common::RuntimeId`, an arm in
//! [`walk`] and [`forget`].

mod hotspot;
mod python;
mod v8;

use scorch_common::RuntimeId;

use crate::shared::stack::WalkState;

/// Runs runtime `runtime`'s walk at the walk's current frame. An id no runtime has (an agent
/// newer than this program) leaves the frame native.
#[inline(always)]
pub fn walk(runtime: u32, walk: &mut WalkState) {
    if runtime == RuntimeId::Python as u32 {
        python::scorch_python_walk(walk.slot);
    } else if runtime == RuntimeId::Hotspot as u32 {
        hotspot::scorch_hotspot_walk(walk.slot);
    } else if runtime == RuntimeId::V8 as u32 {
        v8::scorch_v8_walk(walk.slot);
    }
}

/// After an exec the process runs another program: each runtime forgets it.
#[inline(always)]
pub fn forget(tgid: u32) {
    python::forget(tgid);
    hotspot::forget(tgid);
    v8::forget(tgid);
}
