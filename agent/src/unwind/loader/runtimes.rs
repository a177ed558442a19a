//! The loader's side of the runtime walks: which binaries are interpreters (or the glibc
//! they need), what a process running one gets in the runtime's BPF map, and the code
//! objects of new stacks, read while their processes run.

use super::*;

/// What a binary is to the runtime walks, found before its table is built (in
/// milliseconds, where the table takes a tenth of a second for an interpreter), so a
/// process's Python frames are walked from its first samples on.
#[derive(Debug, Clone)]
pub(super) struct FileRuntime {
    pub(super) runtime: Runtime,
    /// Its executable segments, for the load bias of a mapping of it.
    pub(super) segments: Vec<Segment>,
}

/// What a binary is to the runtime walks.
#[derive(Debug, Clone)]
pub(super) enum Runtime {
    /// A CPython interpreter (the executable, or libpython).
    Python(Box<Interpreter>),
    /// glibc, with where a thread's pthread key values are.
    Libc(SpecificLayout),
}

/// Most code objects remembered for the symbolizer between two takes: a poll reads at most
/// a ring buffer's worth of stacks, but nothing here grows without bound if none takes them.
pub(super) const MAX_PYTHON_CODE: usize = 65_536;

impl Unwinder {
    /// Notes the code objects of the new Python stacks the BPF side stored (`stacks`: the
    /// events' process, and generation and id): the symbolizer reads them while their
    /// processes run. A stack its window's drain already took is gone from the map, and named
    /// by then.
    pub(super) fn read_python_stacks(&mut self, stacks: HashSet<(u32, u64)>) {
        let Some(outers) = &self.maps.user_stacks else {
            return;
        };
        // The generation's maps now, each opened at most once (`None` inside: it could not be):
        // the drain replaces a map that needs another size.
        type Opened<V> = [Option<Option<aya::maps::HashMap<MapData, i32, V>>>; 2];
        let mut long: Opened<UserStack> = [None, None];
        let mut short: Opened<ShortUserStack> = [None, None];
        for (tgid, stack) in stacks {
            let generation = (stack >> 32) as usize & 1;
            let id = stack as u32 as i32;
            // The id's class bit says which map holds it.
            let python_code = &mut self.python_code;
            if id & SHORT_USER_STACK_ID != 0 {
                let map = short[generation]
                    .get_or_insert_with(|| generation_map(&outers.short, generation as u32));
                if let Some(walked) = map.as_ref().and_then(|map| map.get(&id, 0).ok()) {
                    note_python_code(python_code, tgid, &walked);
                }
            } else {
                let map = long[generation]
                    .get_or_insert_with(|| generation_map(&outers.long, generation as u32));
                if let Some(walked) = map.as_ref().and_then(|map| map.get(&id, 0).ok()) {
                    note_python_code(python_code, tgid, &walked);
                }
            }
        }
    }

    /// The code objects (process, address) of Python stacks stored since the last call.
    pub fn take_python_code(&mut self) -> HashSet<(u32, u64)> {
        std::mem::take(&mut self.python_code)
    }

    /// The processes that started or stopped running a CPython interpreter the BPF side walks
    /// since the last call, for the symbolizer.
    pub fn take_python_changes(&mut self) -> Vec<(u32, Option<PythonProcess>)> {
        std::mem::take(&mut self.python_changes)
    }

    /// Writes (or removes) `pid`'s interpreter in `PYTHON_PROCS`: when it maps a CPython
    /// interpreter and glibc, both with loaded tables. A full map leaves the process's Python
    /// frames unwalked (its eval loop shows as native frames), as does any other failure.
    pub(super) fn write_python(
        &mut self,
        pid: u32,
        described: Option<(PythonProc, PythonProcess)>,
    ) {
        let before = self.python.get(&pid).copied();
        match described {
            Some((value, process)) => {
                if self.maps.python_procs.insert(pid, value, 0).is_err() {
                    return;
                }
                if before != Some(process) {
                    self.python.insert(pid, process);
                    self.python_changes.push((pid, Some(process)));
                }
            }
            None if before.is_some() => {
                let _ = self.maps.python_procs.remove(&pid);
                self.python.remove(&pid);
                self.python_changes.push((pid, None));
            }
            None => {}
        }
    }

    /// `pid`'s interpreter as the BPF side and the symbolizer need it.
    pub(super) fn python_proc(&self, pid: u32) -> Option<(PythonProc, PythonProcess)> {
        let mappings = self.procs.get(&pid)?;
        let (mut python, mut libc) = (None, None);
        for mapping in mappings {
            let Some(file) = mapping.key.and_then(|key| self.runtimes.get(&key)) else {
                continue;
            };
            match &file.runtime {
                Runtime::Python(interpreter) => {
                    if let Some(bias) = load_bias(mapping, &file.segments) {
                        python = Some((interpreter, bias));
                    }
                }
                Runtime::Libc(layout) => libc = Some(*layout),
            }
        }
        let ((interpreter, bias), layout) = (python?, libc?);
        Some(python_value(interpreter, bias, &layout))
    }
}

/// Whether the binary is a CPython interpreter or glibc; a CPython that cannot be walked is
/// logged with why, once per binary.
pub(super) fn runtime(bytes: &[u8], path: &Path) -> Option<FileRuntime> {
    let runtime = file_runtime(bytes, path)?;
    Some(FileRuntime {
        runtime,
        segments: executable_segments(&object::File::parse(bytes).ok()?),
    })
}

fn file_runtime(bytes: &[u8], path: &Path) -> Option<Runtime> {
    if !may_hold_runtime(bytes) {
        return None;
    }
    let image = Image::parse(bytes).ok()?;
    match interpreter(&image) {
        Ok(Some(interpreter)) => {
            tracing::info!(
                "{}: CPython {}, its Python frames walked",
                path.display(),
                interpreter.version
            );
            return Some(Runtime::Python(Box::new(interpreter)));
        }
        Ok(None) => {}
        Err(err) => {
            tracing::warn!("{}: Python frames not walked: {err}", path.display());
            return None;
        }
    }
    image.symbol("pthread_getspecific")?;
    match specific_layout(&image) {
        Ok(layout) => Some(Runtime::Libc(layout)),
        Err(err) => {
            tracing::warn!(
                "{}: Python frames of processes using this libc not walked: {err}",
                path.display()
            );
            None
        }
    }
}

/// The `PYTHON_PROCS` value of an interpreter loaded at `bias`, and what naming needs.
fn python_value(
    interpreter: &Interpreter,
    bias: u64,
    layout: &SpecificLayout,
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
        specific_value: layout.value_offset as u32,
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

/// Adds the code objects of `stack`'s Python frames (of process `tgid`) to `code`, up to
/// [`MAX_PYTHON_CODE`].
fn note_python_code(code: &mut HashSet<(u32, u64)>, tgid: u32, stack: &dyn WalkedStack) {
    for &word in stack.frames() {
        if code.len() >= MAX_PYTHON_CODE {
            continue;
        }
        if let Some((object @ 1.., _)) = python_frame_parts(word) {
            code.insert((tgid, object));
        }
    }
}

/// Generation `generation`'s map in the array of maps `outer`, or `None` when it cannot be
/// opened (the stacks it holds are then named at the window's end).
fn generation_map<V: aya::Pod>(
    outer: &MapData,
    generation: u32,
) -> Option<aya::maps::HashMap<MapData, i32, V>> {
    inner_map(outer.fd(), generation)
        .ok()
        .and_then(|fd| MapData::from_fd(fd).ok())
        .and_then(|data| aya::maps::HashMap::try_from(aya::maps::Map::HashMap(data)).ok())
}
