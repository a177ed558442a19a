//! V8's layout (`scorch::runtimes::v8`), read from each build's post-mortem constants,
//! against live Node processes: a script (tests/workloads/v8_layout.js) puts functions at
//! known tiers and prints them with V8's own `%DebugPrint` (function, `SharedFunctionInfo`
//! and `Code` addresses, and the code's kind); the test reads the same fields from the
//! process's memory with the layout, and they must agree; each function's name is read as a
//! V8 string, and its script's name through its `SharedFunctionInfo`. This is what makes the layout's
//! rules for what a release leaves out (a function's code slot, `Code`'s fields in 11.x, the
//! range of function types) facts about the builds rather than guesses.
//!
//! Node 20 is the host's (NodeSource's static `node`); Node 18, 20 and 24 are Debian's
//! (libnode108, 115 and 137) in debootstrap roots of bookworm, trixie and sid.

use std::{
    fs::File,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use scorch::{
    binary::elf::Elf,
    runtimes::{
        image::Image,
        memory::ProcessMemory,
        v8::{
            self,
            layout::{FunctionCode, InstructionStart},
            shared::{function_name, script_name},
            strings::read_string,
            Layout,
        },
    },
};
use scorch_tests::{debian::root_filesystem, KillOnDrop};

/// A Node: where its `node` runs (a Debian root, or this host) and the file V8 is in.
pub(crate) struct Node {
    pub(crate) root: Option<PathBuf>,
    /// The file exporting V8's constants, as this test sees it.
    pub(crate) v8: PathBuf,
}

impl Node {
    pub(crate) fn host() -> Node {
        Node {
            root: None,
            v8: PathBuf::from("/usr/bin/node"),
        }
    }

    /// Debian `suite`'s nodejs, whose V8 is its libnode.
    pub(crate) fn debian(suite: &str) -> Result<Node> {
        let root = root_filesystem(suite, &["nodejs"])?;
        let lib = root.join("usr/lib/x86_64-linux-gnu");
        let v8 = std::fs::read_dir(&lib)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("libnode.so."))
            })
            .with_context(|| format!("no libnode.so.N in {}", lib.display()))?;
        Ok(Node {
            root: Some(root),
            v8,
        })
    }

    /// A directory both this test and node see: its path here, and node's.
    pub(crate) fn shared_dir(&self) -> Result<(PathBuf, String)> {
        self.shared_dir_named("layout")
    }

    /// A directory both this test and node see, for test `tag`: its path here, and node's.
    pub(crate) fn shared_dir_named(&self, tag: &str) -> Result<(PathBuf, String)> {
        let inside = format!("/tmp/scorch-v8-{tag}-{}", std::process::id());
        let here = match &self.root {
            None => PathBuf::from(&inside),
            Some(root) => root.join(inside.trim_start_matches('/')),
        };
        let _ = std::fs::remove_dir_all(&here);
        std::fs::create_dir_all(&here)?;
        Ok((here, inside))
    }

    pub(crate) fn command(&self) -> Command {
        match &self.root {
            None => Command::new("/usr/bin/node"),
            Some(root) => {
                let mut command = Command::new("chroot");
                command.arg(root).arg("/usr/bin/node");
                command
            }
        }
    }
}

/// What `%DebugPrint` said of one function.
#[derive(Debug)]
struct Printed {
    name: String,
    function: u64,
    shared: u64,
    code: u64,
    /// The code's kind as V8 prints it (`TURBOFAN`, `BUILTIN`...).
    kind: String,
    /// The function's name string.
    name_string: u64,
    /// Without a name of its own (its name string empty): `name` is the one V8 inferred.
    inferred: bool,
}

fn hex(text: &str) -> Option<u64> {
    let digits: String = text
        .trim_start_matches("0x")
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    u64::from_str_radix(&digits, 16).ok()
}

/// The functions of the script's output: a `function NAME` line, then V8's print of it.
fn parse(output: &str) -> Vec<Printed> {
    let mut printed: Vec<Printed> = Vec::new();
    for line in output.lines() {
        if let Some(name) = line.strip_prefix("function ") {
            let inferred = name.strip_prefix("inferred ");
            printed.push(Printed {
                name: inferred.unwrap_or(name).to_owned(),
                inferred: inferred.is_some(),
                function: 0,
                shared: 0,
                code: 0,
                kind: String::new(),
                name_string: 0,
            });
            continue;
        }
        let Some(current) = printed.last_mut() else {
            continue;
        };
        if let Some(rest) = line.strip_prefix("DebugPrint: ") {
            current.function = hex(rest).unwrap_or(0);
        } else if let Some(rest) = line.strip_prefix(" - name: ") {
            if current.name_string == 0 {
                current.name_string = hex(rest).unwrap_or(0);
            }
        } else if let Some(rest) = line.trim_start().strip_prefix("- shared_info: ") {
            current.shared = hex(rest).unwrap_or(0);
        } else if let Some(rest) = line.trim_start().strip_prefix("- code: ") {
            current.code = hex(rest).unwrap_or(0);
            // `0x178fa4623da1 <Code TURBOFAN>` or `<Code BUILTIN InterpreterEntryTrampoline>`
            current.kind = rest
                .split("<Code ")
                .nth(1)
                .and_then(|k| k.split([' ', '>']).next())
                .unwrap_or("")
                .to_owned();
        }
    }
    printed
}

/// Another process's memory, read through `/proc/PID/mem`.
struct Memory {
    file: File,
    /// Its executable mappings.
    executable: Vec<(u64, u64)>,
}

impl Memory {
    fn of(pid: u32) -> Result<Memory> {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
        let executable = maps
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let range = fields.next()?;
                let perms = fields.next()?;
                let (start, end) = range.split_once('-')?;
                perms.contains('x').then(|| {
                    (
                        u64::from_str_radix(start, 16).unwrap_or(0),
                        u64::from_str_radix(end, 16).unwrap_or(0),
                    )
                })
            })
            .collect();
        Ok(Memory {
            file: File::open(format!("/proc/{pid}/mem"))?,
            executable,
        })
    }

    fn bytes<const N: usize>(&self, address: u64) -> Result<[u8; N]> {
        let mut buffer = [0u8; N];
        self.file
            .read_exact_at(&mut buffer, address)
            .with_context(|| format!("reading {N} bytes at {address:#x}"))?;
        Ok(buffer)
    }

    fn u64(&self, address: u64) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes(address)?))
    }

    fn u32(&self, address: u64) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes(address)?))
    }

    fn u16(&self, address: u64) -> Result<u16> {
        Ok(u16::from_le_bytes(self.bytes(address)?))
    }

    fn is_executable(&self, start: u64, size: u64) -> bool {
        self.executable
            .iter()
            .any(|&(low, high)| start >= low && start.saturating_add(size) <= high)
    }
}

/// The field at `offset` of the heap object `object` (a tagged pointer).
fn field(memory: &Memory, layout: &Layout, object: u64, offset: u16) -> Result<u64> {
    memory.u64(object - layout.tagging.heap_object_tag + u64::from(offset))
}

/// The instance type of the heap object `object`, through its map.
fn instance_type(memory: &Memory, layout: &Layout, object: u64) -> Result<u16> {
    ensure!(
        object & layout.tagging.heap_object_tag_mask == layout.tagging.heap_object_tag,
        "{object:#x} is not a heap object's tagged address"
    );
    let map = field(memory, layout, object, layout.map)?;
    memory.u16(map - layout.tagging.heap_object_tag + u64::from(layout.instance_type))
}

/// Runs the script under `node`, reads its functions back with the layout of its V8.
fn check(node: &Node) -> Result<()> {
    let data = std::fs::read(&node.v8)?;
    let elf = Elf::parse(&data).map_err(|e| anyhow::anyhow!("{}: {e}", node.v8.display()))?;
    let layout = v8::read_layout(&Image::of(&elf))?
        .with_context(|| format!("{} is not seen as V8's", node.v8.display()))?;
    let (here, inside) = node.shared_dir()?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/v8_layout.js");
    std::fs::copy(&script, here.join("v8_layout.js"))?;
    let output = here.join("out.txt");
    let child = node
        .command()
        .args(["--allow-natives-syntax", "--expose-gc"])
        // This host's CA bundle path means nothing in a root.
        .env_remove("NODE_EXTRA_CA_CERTS")
        .arg(format!("{inside}/v8_layout.js"))
        .stdout(File::create(&output)?)
        .stderr(Stdio::inherit())
        .spawn()?;
    let _kill = KillOnDrop(child.id());
    let started = Instant::now();
    let text = loop {
        let text = std::fs::read_to_string(&output)?;
        if text.lines().any(|l| l == "ready") {
            break text;
        }
        ensure!(
            started.elapsed() < Duration::from_secs(60),
            "node printed no `ready` in 60 s:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let printed = parse(&text);
    ensure!(
        printed.len() == 7
            && printed
                .iter()
                .all(|p| p.function != 0 && p.shared != 0 && p.code != 0),
        "V8 {}: %DebugPrint's output not understood: {printed:?}\n{text}",
        layout.version
    );
    let memory = Memory::of(child.id())?;
    let functions = layout.types.first_function..=layout.types.last_function;
    for p in &printed {
        let what = format!("V8 {}: function {}", layout.version, p.name);
        let kind = instance_type(&memory, &layout, p.function)?;
        ensure!(
            functions.contains(&kind),
            "{what}: instance type {kind}, outside {functions:?}"
        );
        let shared = field(&memory, &layout, p.function, layout.function_shared)?;
        ensure!(
            shared == p.shared,
            "{what}: shared {shared:#x}, V8 says {:#x}",
            p.shared
        );
        let kind = instance_type(&memory, &layout, shared)?;
        ensure!(
            kind == layout.types.shared_function_info,
            "{what}: its SharedFunctionInfo has type {kind}"
        );
        match layout.function_code {
            FunctionCode::Code(offset) => {
                let code = field(&memory, &layout, p.function, offset)?;
                ensure!(
                    code == p.code,
                    "{what}: code {code:#x}, V8 says {:#x}",
                    p.code
                );
            }
            FunctionCode::DispatchHandle(offset) => {
                // A 32-bit handle, not a pointer to the code: the code V8 names is found
                // through the dispatch table, which the walk reads.
                let word = field(&memory, &layout, p.function, offset)?;
                let handle = word as u32;
                ensure!(
                    handle != 0 && word != p.code && u64::from(handle) != p.code & 0xffff_ffff,
                    "{what}: the dispatch handle slot holds {word:#x} (code {:#x})",
                    p.code
                );
            }
        }
        let kind = instance_type(&memory, &layout, p.code)?;
        ensure!(
            kind == layout.types.code,
            "{what}: its Code has type {kind}"
        );
        let flags = field(&memory, &layout, p.code, layout.code.flags)? as u32;
        let code_kind = layout.code_kind.of(flags);
        let start = match layout.code.instruction_start {
            InstructionStart::Inline(offset) => {
                p.code - layout.tagging.heap_object_tag + u64::from(offset)
            }
            InstructionStart::Pointer(offset) => field(&memory, &layout, p.code, offset)?,
        };
        let size = memory.u32(
            p.code - layout.tagging.heap_object_tag + u64::from(layout.code.instruction_size),
        )?;
        ensure!(
            size > 0 && size < 16 << 20 && memory.is_executable(start, size.into()),
            "{what}: instructions at {start:#x}, {size} bytes: not in executable memory"
        );
        match p.kind.as_str() {
            "TURBOFAN" | "TURBOFAN_JS" => ensure!(
                code_kind > layout.code_kind.baseline,
                "{what}: TurboFan's code has kind {code_kind}, not past BASELINE ({})",
                layout.code_kind.baseline
            ),
            // An interpreted function runs the interpreter's entry builtin: a kind before
            // the interpreter's own.
            "BUILTIN" => ensure!(
                code_kind < layout.code_kind.interpreted_function,
                "{what}: a builtin's kind {code_kind}"
            ),
            other => bail!("{what}: V8 printed its code as {other:?}"),
        }
        // Its name, read as the namer will read strings.
        let name = read_string(&ProcessMemory(child.id()), &layout, p.name_string, 256)
            .with_context(|| format!("{what}: its name at {:#x}", p.name_string))?;
        let own = if p.inferred { "" } else { p.name.as_str() };
        ensure!(name == own, "{what}: its name reads {name:?}");
        // Its name again, through its SharedFunctionInfo (in its ScopeInfo once compiled),
        // as the namer reads it: the inferred one for a function without its own.
        let named = function_name(&ProcessMemory(child.id()), &layout, p.shared)
            .with_context(|| format!("{what}: its name from its SharedFunctionInfo"))?;
        ensure!(
            named.as_deref() == Some(p.name.as_str()),
            "{what}: its SharedFunctionInfo names it {named:?}"
        );
        // Every function here has run, so that name came from its ScopeInfo.
        let scope_info = field(&memory, &layout, p.shared, layout.shared_name)?;
        let kind = instance_type(&memory, &layout, scope_info)?;
        ensure!(
            kind == layout.types.scope_info,
            "{what}: its SharedFunctionInfo holds a {kind}, not its ScopeInfo"
        );
        let flags = memory.u64(scope_info - layout.tagging.heap_object_tag + 8)?;
        // Its script, from its SharedFunctionInfo: the path node was given.
        let script = script_name(&ProcessMemory(child.id()), &layout, p.shared)
            .with_context(|| format!("{what}: its script"))?;
        let expected = format!("{inside}/v8_layout.js");
        ensure!(
            script.as_deref() == Some(expected.as_str()),
            "{what}: its script is {script:?}, not {expected:?}"
        );
        eprintln!(
            "{what}: named {name:?}, type {}, code kind {code_kind} ({}), {size} bytes at \
             {start:#x}, scope flags {flags:#x}",
            instance_type(&memory, &layout, p.function)?,
            p.kind
        );
    }
    ensure!(
        printed[0].kind.starts_with("TURBOFAN"),
        "V8 {}: `optimised` was not optimised: {:?}",
        layout.version,
        printed[0]
    );
    let _ = std::fs::remove_dir_all(&here);
    Ok(())
}

#[test]
fn v8_layout_agrees_with_node_20_on_this_host() -> Result<()> {
    check(&Node::host())
}

#[test]
fn v8_layout_agrees_with_debian_12s_node_18() -> Result<()> {
    check(&Node::debian("bookworm")?)
}

#[test]
fn v8_layout_agrees_with_debian_13s_node_20() -> Result<()> {
    check(&Node::debian("trixie")?)
}

#[test]
fn v8_layout_agrees_with_debian_unstables_node_24() -> Result<()> {
    check(&Node::debian("sid")?)
}
