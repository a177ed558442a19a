//! CPython as a [`Runtime`]: the registry's entry, what a process running an interpreter gets
//! in `PYTHON_PROCS`, and which of its code Python's BPF walk takes over.

use std::{any::Any, sync::Arc};

use object::Object;
use scorch_common::{
    PythonCount, PythonProc, RuntimeId, PYTHON_COUNTS, PYTHON_ENTRY_CSTACK_OWNER,
    PYTHON_ENTRY_IS_ENTRY, PYTHON_EVAL_RANGES, PYTHON_NO_CFRAME,
};

use super::{interpreter, names::PythonNames, EntryMark, Interpreter, PythonProcess, ThreadState};
use crate::{
    pipeline::maps::RuntimeCounters,
    profile::FrameKind,
    runtimes::{image::Image, Attach, Attachment, Binary, Names, Runtime, Support},
};

/// `PYTHON_COUNTS_MAP`'s counters by [`PythonCount`], frames first.
static COUNT_NAMES: [&str; PYTHON_COUNTS as usize] = {
    let mut names = [""; PYTHON_COUNTS as usize];
    let mut i = 0;
    while i < names.len() {
        names[i] = PythonCount::ALL[i].name();
        i += 1;
    }
    names
};

/// CPython 3.11 to 3.15.
#[derive(Debug, Clone, Copy, Default)]
pub struct Python;

impl Runtime for Python {
    fn id(&self) -> RuntimeId {
        RuntimeId::Python
    }

    fn name(&self) -> &'static str {
        "python"
    }

    fn frame_kind(&self) -> FrameKind {
        FrameKind::Python
    }

    fn procs_map(&self) -> &'static str {
        "PYTHON_PROCS"
    }

    /// A thread's state is under a pthread key or in a thread-local: both from the thread
    /// pointer.
    fn thread_pointer(&self) -> bool {
        true
    }

    fn counters(&self) -> RuntimeCounters {
        RuntimeCounters {
            runtime: self.name(),
            map: "PYTHON_COUNTS_MAP",
            names: &COUNT_NAMES,
        }
    }

    fn may_be(&self, elf: &object::File) -> bool {
        may_be(elf)
    }

    fn detect(&self, image: &Image) -> Result<Option<Arc<dyn Binary>>, String> {
        match interpreter(image) {
            Ok(found) => Ok(found.map(|i| Arc::new(i) as Arc<dyn Binary>)),
            Err(err) => Err(err.to_string()),
        }
    }

    fn names(&self) -> Box<dyn Names> {
        Box::new(PythonNames::default())
    }
}

/// Whether a binary may be an interpreter: `_PyRuntime` has had its own `.PyRuntime` section
/// since 3.10, found from the section headers alone.
pub fn may_be(elf: &object::File) -> bool {
    elf.section_by_name(".PyRuntime").is_some()
}

impl Binary for Interpreter {
    fn describe(&self) -> String {
        format!("CPython {}", self.version)
    }

    /// Needs glibc's layout: the walk finds a thread's state from its pthread values (3.15's
    /// thread-local one too, as glibc's thread pointer is where both are).
    fn attach(&self, _: u32, bias: u64, support: &Support) -> Attach {
        let Some(libc) = support.libc else {
            return Attach::Unsupported("no glibc mapped".into());
        };
        let (value, process) = python_value(self, bias, &libc);
        let count = (value.eval_count as usize).min(PYTHON_EVAL_RANGES);
        let owned = (0..count)
            .map(|i| value.eval_start[i]..value.eval_end[i])
            .collect();
        Attach::Attached(Attachment {
            owned,
            anonymous_code: false,
            entry: entry_bytes(&value),
            process: Arc::new(process) as Arc<dyn Any + Send + Sync>,
        })
    }
}

/// `value` as the BPF map holds it.
fn entry_bytes(value: &PythonProc) -> Vec<u8> {
    // SAFETY: `PythonProc` is `repr(C)` plain data with explicit padding (it is `aya::Pod`),
    // so all its bytes are initialised; the slice lives only as long as `value`.
    unsafe {
        std::slice::from_raw_parts(
            std::ptr::from_ref(value).cast::<u8>(),
            std::mem::size_of::<PythonProc>(),
        )
    }
    .to_vec()
}

/// The `PYTHON_PROCS` value of an interpreter loaded at `bias`, and what naming needs.
fn python_value(
    interpreter: &Interpreter,
    bias: u64,
    layout: &crate::runtimes::libc::SpecificLayout,
) -> (PythonProc, PythonProcess) {
    let offsets = &interpreter.offsets;
    let (thread_key, thread_local) = match interpreter.thread_state {
        ThreadState::Key(key) => (key.wrapping_add(bias), 0),
        ThreadState::ThreadLocal(offset) => (0, offset),
    };
    let mut value = PythonProc {
        thread_key,
        thread_local,
        code_type: interpreter.code_type.wrapping_add(bias),
        code_mask: !offsets.code_tag_bits,
        specific_keys: layout.first_block,
        specific_bias: layout.index_bias as u32,
        specific_shift: layout.entry_shift,
        // Within 64 KiB of the thread pointer either way (`arch::SpecificLayout`'s readers
        // check it): the low 32 bits of the wrapped offset are the signed one.
        specific_value: layout.value_offset as i32,
        tstate_cframe: offsets.tstate_cframe.unwrap_or(PYTHON_NO_CFRAME),
        current_frame: offsets.current_frame,
        frame_code: offsets.frame_code,
        frame_previous: offsets.frame_previous,
        frame_instr: offsets.frame_instr,
        code_adaptive: offsets.code.code_adaptive,
        ..PythonProc::default()
    };
    (value.entry_kind, value.entry_offset, value.entry_value) = match offsets.entry {
        EntryMark::IsEntry(offset) => (PYTHON_ENTRY_IS_ENTRY, offset, 1),
        EntryMark::CStackOwner { offset, value } => (PYTHON_ENTRY_CSTACK_OWNER, offset, value),
    };
    for (i, range) in interpreter.eval.iter().take(PYTHON_EVAL_RANGES).enumerate() {
        value.eval_start[i] = range.start.wrapping_add(bias);
        value.eval_end[i] = range.end.wrapping_add(bias);
        value.eval_count = i as u32 + 1;
    }
    let process = PythonProcess {
        code_type: value.code_type,
        offsets: *offsets,
    };
    (value, process)
}
