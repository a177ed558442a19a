//! V8 as a [`Runtime`]: the registry's entry, what a Node process gets in `V8_PROCS`, and
//! which of its code V8's BPF walk takes over: the embedded builtins in the binary
//! (`builtins`) and every anonymous executable mapping, where V8's JIT puts its code.
//!
//! Everything the walk needs is in the binary, so a process is attached at its first look,
//! whatever it has run yet; but for leaptiering's dispatch table (V8 13), which is the
//! process's own (`dispatch`): a process that has not set V8 up yet is attached at a later
//! look.

use std::{any::Any, ops::Range, sync::Arc};

use scorch_common::{
    RuntimeId, V8Count, V8Proc, V8_CODE_BYTES, V8_CODE_DISPATCH, V8_CODE_INLINE, V8_COUNTS,
    V8_FRAME_BELOW,
};

use super::{
    builtins::embedded_builtins,
    bytecodes::BytecodeSizes,
    dispatch::{find_table, group_static, DispatchError, Table, HANDLE_SHIFT},
    layout::{FunctionCode, InstructionStart, Layout},
    names::{Process, V8Names},
    read_layout,
};
use crate::{
    pipeline::maps::RuntimeCounters,
    profile::FrameKind,
    runtimes::{
        image::Image, memory::ProcessMemory, pod_bytes, Attach, Attachment, Binary, Names, Runtime,
        Support,
    },
};

/// `V8_COUNTS_MAP`'s counters by [`V8Count`], frames first.
static COUNT_NAMES: [&str; V8_COUNTS as usize] = {
    let mut names = [""; V8_COUNTS as usize];
    let mut i = 0;
    while i < names.len() {
        names[i] = V8Count::ALL[i].name();
        i += 1;
    }
    names
};

/// V8 as Node.js 18 to 24 embed it (the layouts `layout` knows).
#[derive(Debug, Clone, Copy, Default)]
pub struct V8;

impl Runtime for V8 {
    fn id(&self) -> RuntimeId {
        RuntimeId::V8
    }

    fn name(&self) -> &'static str {
        "v8"
    }

    fn frame_kind(&self) -> FrameKind {
        FrameKind::V8js
    }

    fn procs_map(&self) -> &'static str {
        "V8_PROCS"
    }

    /// The walk starts from the code a frame's pc is in, not from a thread's state.
    fn thread_pointer(&self) -> bool {
        false
    }

    fn counters(&self) -> RuntimeCounters {
        RuntimeCounters {
            runtime: self.name(),
            map: "V8_COUNTS_MAP",
            names: &COUNT_NAMES,
        }
    }

    fn may_be(&self, elf: &object::File) -> bool {
        super::may_be(elf)
    }

    fn detect(&self, image: &Image) -> Result<Option<Arc<dyn Binary>>, String> {
        let layout = match read_layout(image) {
            Ok(Some(layout)) => layout,
            Ok(None) => return Ok(None),
            Err(err) => return Err(err.to_string()),
        };
        let entry = v8_proc(&layout).map_err(|err| format!("V8 {}: {err}", layout.version))?;
        let builtins = embedded_builtins(image)
            .map_err(|err| format!("V8 {}: its builtins not found: {err}", layout.version))?;
        // Without them, baseline frames are named without their lines.
        let bytecodes = image
            .read_only_data()
            .find_map(BytecodeSizes::find)
            .map(|(_, sizes)| Arc::new(sizes));
        if bytecodes.is_none() {
            tracing::info!(
                "V8 {}: its bytecodes' sizes not found: baseline frames are named without \
                 their lines",
                layout.version
            );
        }
        // Without the group, the walk names the functions without their code.
        let group = match layout.function_code {
            FunctionCode::DispatchHandle(_) => Some(group_static(image)),
            FunctionCode::Code(_) => None,
        };
        Ok(Some(Arc::new(Node {
            layout: Arc::new(layout),
            entry,
            builtins,
            bytecodes,
            group,
        })))
    }

    fn names(&self) -> Box<dyn Names> {
        Box::new(V8Names::default())
    }
}

/// A binary embedding V8 (`node`, `libnode.so.N`): its layout, the walk's entry, its
/// builtins' code in its own addresses, and with leaptiering where its default isolate
/// group's pointer is (or why that is not known).
#[derive(Debug)]
struct Node {
    layout: Arc<Layout>,
    entry: V8Proc,
    builtins: Range<u64>,
    bytecodes: Option<Arc<BytecodeSizes>>,
    group: Option<Result<u64, DispatchError>>,
}

impl Node {
    /// The walk's entry for process `pid`: with leaptiering, its dispatch table's address.
    /// `None` while the process has not set V8 up.
    fn entry(&self, pid: u32, bias: u64) -> Option<V8Proc> {
        let mut entry = self.entry;
        let table = match &self.group {
            None => return Some(entry),
            Some(Ok(group)) => {
                find_table(&ProcessMemory(pid), &self.layout, group.wrapping_add(bias))
            }
            Some(Err(err)) => Err(err.clone()),
        };
        match table {
            Ok(Table::At(table)) => {
                entry.dispatch_table = table;
                entry.builtins_start = self.builtins.start.wrapping_add(bias);
                entry.builtins_end = self.builtins.end.wrapping_add(bias);
            }
            Ok(Table::NotYet) => return None,
            Err(err) => tracing::info!(
                "process {pid}: V8 {}'s dispatch table: {err}: its JavaScript functions \
                 are named without their code (no lines, no inlined functions)",
                self.layout.version
            ),
        }
        Some(entry)
    }
}

impl Binary for Node {
    fn describe(&self) -> String {
        format!("V8 {}", self.layout.version)
    }

    fn attach(&self, pid: u32, bias: u64, _: &Support) -> Attach {
        let Some(entry) = self.entry(pid, bias) else {
            return Attach::Later;
        };
        Attach::Attached(Attachment {
            owned: std::iter::once(self.builtins.start + bias..self.builtins.end + bias).collect(),
            anonymous_code: true,
            entry: pod_bytes(&entry),
            process: Arc::new(Process {
                layout: Arc::clone(&self.layout),
                builtins: self.builtins.start + bias..self.builtins.end + bias,
                bytecodes: self.bytecodes.clone(),
            }) as Arc<dyn Any + Send + Sync>,
        })
    }
}

/// Why a V8 layout does not fit what the BPF walk reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("its tagging ({0}) is not the walk's (heap objects tagged 1 under 3, Smis by 1)")]
    Tagging(String),
    #[error(
        "frame slot {what} at fp{offset:+}, outside the {V8_FRAME_BELOW} bytes the walk reads"
    )]
    OutsideFrame { what: &'static str, offset: i32 },
    #[error("Code::{field} at byte {offset}, past the {V8_CODE_BYTES} the walk reads")]
    OutsideCode { field: &'static str, offset: u16 },
    #[error(
        "a frame's function at fp{function:+} and context at fp{context:+}, not the two words \
         below the frame pointer the walk reads first"
    )]
    Top { function: i32, context: i32 },
    #[error("CodeKind's field ({mask:#x} << {shift}) or its baseline kind ({baseline})")]
    CodeKind {
        mask: u32,
        shift: u32,
        baseline: u32,
    },
}

/// The `V8_PROCS` value of a build with `layout`: every slot and field the walk reads
/// checked to lie within the bytes it reads at once.
pub fn v8_proc(layout: &Layout) -> Result<V8Proc, EntryError> {
    let tagging = layout.tagging;
    if (
        tagging.heap_object_tag_mask,
        tagging.heap_object_tag,
        tagging.smi_tag_mask,
    ) != (3, 1, 1)
    {
        return Err(EntryError::Tagging(format!("{tagging:?}")));
    }
    let slot = |what: &'static str, offset: i32| {
        let index = (offset + V8_FRAME_BELOW) / 8;
        if (-V8_FRAME_BELOW..0).contains(&offset) && offset % 8 == 0 {
            Ok(index as u8)
        } else {
            Err(EntryError::OutsideFrame { what, offset })
        }
    };
    // The bytecode slots are read with the words below the function.
    let below_function = |what: &'static str, offset: i32| {
        slot(what, offset).and_then(|index| {
            if offset < -16 {
                Ok(index)
            } else {
                Err(EntryError::OutsideFrame { what, offset })
            }
        })
    };
    let code = |field: &'static str, offset: u16, width: u16| {
        if usize::from(offset) + usize::from(width) <= V8_CODE_BYTES {
            Ok(offset)
        } else {
            Err(EntryError::OutsideCode { field, offset })
        }
    };
    // The walk reads every frame's top first: the function and the context must be there.
    if layout.frame.function != -16 || layout.frame.context != -8 {
        return Err(EntryError::Top {
            function: layout.frame.function,
            context: layout.frame.context,
        });
    }
    let kinds = layout.code_kind;
    if kinds.mask > 0xff || kinds.shift > 31 || kinds.baseline > 0xff || kinds.baseline == 0 {
        return Err(EntryError::CodeKind {
            mask: kinds.mask,
            shift: kinds.shift,
            baseline: kinds.baseline,
        });
    }
    let mut flags = 0;
    let mut dispatch_shift = 0;
    let (function_code, code_start) = (
        match layout.function_code {
            FunctionCode::Code(at) => at,
            FunctionCode::DispatchHandle(at) => {
                flags |= V8_CODE_DISPATCH;
                dispatch_shift = HANDLE_SHIFT;
                at
            }
        },
        match layout.code.instruction_start {
            InstructionStart::Inline(at) => {
                flags |= V8_CODE_INLINE;
                at
            }
            InstructionStart::Pointer(at) => code("instruction_start", at, 8)?,
        },
    );
    let types = layout.types;
    Ok(V8Proc {
        first_function_type: types.first_function,
        last_function_type: types.last_function,
        shared_function_info_type: types.shared_function_info,
        code_type: types.code,
        bytecode_array_type: types.bytecode_array,
        map: code("map", layout.map, 8)?,
        instance_type: layout.instance_type,
        function_shared: layout.function_shared,
        function_code,
        code_start,
        code_size: code("instruction_size", layout.code.instruction_size, 4)?,
        code_flags: code("flags", layout.code.flags, 4)?,
        dispatch_shift,
        _reserved: 0,
        slot_bytecode_array: below_function("bytecode_array", layout.frame.bytecode_array)?,
        slot_bytecode_offset: below_function("bytecode_offset", layout.frame.bytecode_offset)?,
        code_kind_shift: kinds.shift as u8,
        code_kind_mask: kinds.mask as u8,
        code_kind_baseline: kinds.baseline as u8,
        flags,
        dispatch_table: 0,
        builtins_start: 0,
        builtins_end: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_20s_layout_gives_the_walk_its_slots_and_fields() {
        let layout = super::super::node_20_layout();
        let entry = v8_proc(&layout).unwrap();
        // fp - 32 and - 40 (bytecode), from fp - 64.
        assert_eq!(
            (entry.slot_bytecode_array, entry.slot_bytecode_offset),
            (4, 3)
        );
        assert_eq!((entry.first_function_type, entry.code_type), (2066, 245));
        assert_eq!(entry.shared_function_info_type, 262);
        assert_eq!(
            (entry.map, entry.instance_type, entry.function_shared),
            (0, 12, 24)
        );
        // 11.3: the code a word past `shared`; its instruction start a pointer.
        assert_eq!((entry.function_code, entry.flags), (48, 0));
        assert_eq!(
            (entry.code_start, entry.code_flags, entry.code_size),
            (40, 48, 56)
        );
        assert_eq!((entry.code_kind_mask, entry.code_kind_baseline), (15, 11));
    }

    #[test]
    fn what_the_walk_cannot_read_is_refused_by_name() {
        let mut layout = super::super::node_20_layout();
        layout.frame.bytecode_offset = -72;
        assert_eq!(
            v8_proc(&layout),
            Err(EntryError::OutsideFrame {
                what: "bytecode_offset",
                offset: -72
            })
        );
        let mut layout = super::super::node_20_layout();
        layout.frame.function = -24;
        assert!(matches!(v8_proc(&layout), Err(EntryError::Top { .. })));
        let mut layout = super::super::node_20_layout();
        layout.code.flags = 62;
        assert!(matches!(
            v8_proc(&layout),
            Err(EntryError::OutsideCode { field: "flags", .. })
        ));
        let mut layout = super::super::node_20_layout();
        layout.tagging.heap_object_tag = 0;
        assert!(matches!(v8_proc(&layout), Err(EntryError::Tagging(_))));
    }
}
