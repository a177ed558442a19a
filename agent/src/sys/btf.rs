//! Offsets of kernel structure fields, read from the kernel's BTF (`/sys/kernel/btf/vmlinux`).
//!
//! The BPF program reads a few kernel fields a task's user-space state needs (the thread's
//! `fs` base, for thread-local storage), whose offsets change with the kernel's build. aya's
//! CO-RE is not available to Rust BPF programs, so the agent reads the offsets here, once,
//! and hands them to the program. Only the type headers are indexed: a full BTF parse is
//! tens of megabytes.

/// Why an offset was not found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BtfError {
    #[error("{path}: {reason}")]
    Read { path: String, reason: String },
    #[error("kernel BTF: {0}")]
    Malformed(&'static str),
    #[error("kernel BTF has no struct {0}")]
    NoStruct(String),
    #[error("kernel BTF: struct {structure} has no member {member}")]
    NoMember { structure: String, member: String },
}

const MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_TYPE_TAG: u32 = 18;

/// The kernel's BTF, with each type's position indexed by id.
pub struct Btf<'a> {
    types: &'a [u8],
    strings: &'a [u8],
    /// Byte offset in `types` of type id `i + 1`.
    offsets: Vec<u32>,
}

fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    data.get(at..at + 4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
}

impl<'a> Btf<'a> {
    pub fn parse(data: &'a [u8]) -> Result<Btf<'a>, BtfError> {
        let header = |at| u32_at(data, at).ok_or(BtfError::Malformed("short header"));
        if data.get(..2) != Some(&MAGIC.to_le_bytes()[..]) {
            return Err(BtfError::Malformed(
                "no BTF magic (a big-endian or other file)",
            ));
        }
        let header_len = header(4)? as usize;
        let (type_off, type_len, str_off, str_len) = (
            header(8)? as usize,
            header(12)? as usize,
            header(16)? as usize,
            header(20)? as usize,
        );
        let section = |off: usize, len: usize| {
            header_len
                .checked_add(off)
                .and_then(|start| data.get(start..start.checked_add(len)?))
                .ok_or(BtfError::Malformed("a section beyond the file"))
        };
        let (types, strings) = (section(type_off, type_len)?, section(str_off, str_len)?);
        let mut offsets = Vec::new();
        let mut at = 0usize;
        while at < types.len() {
            let info = u32_at(types, at + 4).ok_or(BtfError::Malformed("a type cut short"))?;
            let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
            // The data that follows each kind's 12-byte header.
            let extra = match kind {
                1 | 14 | 17 => 4,             // int, var, decl_tag
                3 => 12,                      // array
                4 | 5 | 15 | 19 => 12 * vlen, // struct, union, datasec, enum64
                6 | 13 => 8 * vlen,           // enum, func_proto
                2 | 7..=12 | 16 | 18 => 0, // ptr, fwd, typedef, volatile, const, restrict, func, float, type_tag
                _ => return Err(BtfError::Malformed("a type of unknown kind")),
            };
            offsets.push(u32::try_from(at).map_err(|_| BtfError::Malformed("too large"))?);
            at += 12 + extra;
        }
        Ok(Btf {
            types,
            strings,
            offsets,
        })
    }

    fn name(&self, name_off: u32) -> &'a [u8] {
        let rest = self.strings.get(name_off as usize..).unwrap_or_default();
        rest.split(|&b| b == 0).next().unwrap_or_default()
    }

    /// (name_off, info, size_or_type) of type `id`, and where its extra data starts.
    fn header(&self, id: u32) -> Option<(u32, u32, u32, usize)> {
        let at = *self.offsets.get((id as usize).checked_sub(1)?)? as usize;
        Some((
            u32_at(self.types, at)?,
            u32_at(self.types, at + 4)?,
            u32_at(self.types, at + 8)?,
            at + 12,
        ))
    }

    /// Type `id` with typedefs and qualifiers looked through.
    fn resolve(&self, mut id: u32) -> Option<u32> {
        for _ in 0..32 {
            let (_, info, next, _) = self.header(id)?;
            match (info >> 24) & 0x1f {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = next
                }
                _ => return Some(id),
            }
        }
        None
    }

    fn struct_id(&self, name: &str) -> Option<u32> {
        (1..=self.offsets.len() as u32).find(|&id| {
            self.header(id).is_some_and(|(name_off, info, _, _)| {
                (info >> 24) & 0x1f == KIND_STRUCT && self.name(name_off) == name.as_bytes()
            })
        })
    }

    /// The byte offset of `path` (member names, each in the previous one's struct) from the
    /// start of struct `structure`.
    pub fn member_offset(&self, structure: &str, path: &[&str]) -> Result<u32, BtfError> {
        let mut id = self
            .struct_id(structure)
            .ok_or_else(|| BtfError::NoStruct(structure.to_owned()))?;
        let mut bits = 0u32;
        let mut current = structure.to_owned();
        for member in path {
            let (_, info, _, extra) = self
                .header(id)
                .ok_or(BtfError::Malformed("a bad type id"))?;
            let kind = (info >> 24) & 0x1f;
            if kind != KIND_STRUCT && kind != KIND_UNION {
                return Err(BtfError::NoStruct(current));
            }
            let bitfields = info >> 31 == 1;
            let found = (0..(info & 0xffff) as usize).find_map(|i| {
                let at = extra + 12 * i;
                let (name, ty, offset) = (
                    u32_at(self.types, at)?,
                    u32_at(self.types, at + 4)?,
                    u32_at(self.types, at + 8)?,
                );
                (self.name(name) == member.as_bytes()).then_some((
                    ty,
                    if bitfields {
                        offset & 0xff_ffff
                    } else {
                        offset
                    },
                ))
            });
            let Some((ty, offset)) = found else {
                return Err(BtfError::NoMember {
                    structure: current,
                    member: (*member).to_owned(),
                });
            };
            bits += offset;
            id = self
                .resolve(ty)
                .ok_or(BtfError::Malformed("a bad member type"))?;
            current = (*member).to_owned();
        }
        if !bits.is_multiple_of(8) {
            return Err(BtfError::Malformed("a member that is not byte-aligned"));
        }
        Ok(bits / 8)
    }
}

/// The offset of the thread pointer in `struct task_struct`, at the member path the
/// architecture names (`arch::native::THREAD_POINTER`), read from the running kernel's BTF.
pub fn task_thread_pointer_offset(path: &[&str]) -> Result<u32, BtfError> {
    task_member_offset(path)
}

/// The offset of the thread id in `struct task_struct` (`pid`), for the off-CPU program to
/// read the id of the task switching in.
pub fn task_pid_offset() -> Result<u32, BtfError> {
    task_member_offset(&["pid"])
}

/// What the sampler records of a process for labelling it after it exited: the offsets of
/// the thread-group leader (`group_leader`), the name (`comm`) and the start
/// (`start_boottime`, what /proc/PID/stat's start time counts from) in `struct task_struct`,
/// and of the exec'd file's name (`interp`) in `struct linux_binprm`. One read of the BTF for
/// all four when this boot has not kept them.
pub fn process_record_offsets() -> Result<[u32; 4], BtfError> {
    let offsets = member_offsets(&[
        ("task_struct", &["group_leader"]),
        ("task_struct", &["comm"]),
        ("task_struct", &["start_boottime"]),
        ("linux_binprm", &["interp"]),
    ])?;
    Ok([offsets[0], offsets[1], offsets[2], offsets[3]])
}

/// The offset of `path` in `struct task_struct` (see [`member_offsets`]).
fn task_member_offset(path: &[&str]) -> Result<u32, BtfError> {
    Ok(member_offsets(&[("task_struct", path)])?[0])
}

/// The offsets of members, each `(structure, path)`: this boot's kept ones ([`kept`]), else
/// read from the kernel's BTF (once for all of them), then kept.
fn member_offsets(members: &[(&str, &[&str])]) -> Result<Vec<u32>, BtfError> {
    let names: Vec<String> = members
        .iter()
        .map(|(structure, path)| format!("{structure}.{}", path.join(".")))
        .collect();
    let boot = super::boot_id();
    let kept: Vec<Option<u32>> = names
        .iter()
        .map(|name| boot.as_deref().and_then(|boot| kept::load(boot, name)))
        .collect();
    if let Some(all) = kept.iter().copied().collect::<Option<Vec<u32>>>() {
        return Ok(all);
    }
    let file = "/sys/kernel/btf/vmlinux";
    let data = std::fs::read(file).map_err(|e| BtfError::Read {
        path: file.to_owned(),
        reason: e.to_string(),
    })?;
    let btf = Btf::parse(&data)?;
    let mut offsets = Vec::with_capacity(members.len());
    for ((structure, path), name) in members.iter().zip(&names) {
        let offset = btf.member_offset(structure, path)?;
        if let Some(boot) = &boot {
            kept::store(boot, name, offset);
        }
        offsets.push(offset);
    }
    Ok(offsets)
}

/// The offset of `path` in `struct task_struct`, read from the kernel's BTF.
#[cfg(test)]
fn btf_task_member_offset(path: &[&str]) -> Result<u32, BtfError> {
    let file = "/sys/kernel/btf/vmlinux";
    let data = std::fs::read(file).map_err(|e| BtfError::Read {
        path: file.to_owned(),
        reason: e.to_string(),
    })?;
    Btf::parse(&data)?.member_offset("task_struct", path)
}

/// The offsets found, kept for this boot in `btf-offsets` in `$RUNTIME_DIRECTORY`, else
/// `/run/scorch` (a tmpfs, emptied at boot), beside the kernel symbols' copy.
///
/// Why: the kernel hands its BTF out 4 KiB a `read` (1,300 reads for Debian's 5.5 MB), and
/// every `record` and daemon start needs one offset from it; kernel types do not change
/// within a boot. The file is trusted as the kernel symbols' copy is: this user's, private,
/// in a private directory, naming this boot. A wrong offset there could only make the BPF
/// program read the wrong field of a task (its `fs` base, its thread id), so a value past
/// any `task_struct` is refused too. Any failure is a debug line, and the BTF is read.
mod kept {
    use std::{
        io::{self, Read},
        path::{Path, PathBuf},
    };

    use crate::sys::fs::{
        ensure_private_dir, open_private, unit_directory, write_private_atomically,
    };

    /// The first line; a change of layout changes it.
    const MAGIC: &str = "scorch-btf-offsets 1";
    /// The largest file read: a few lines are expected.
    const MAX_BYTES: u64 = 16 << 10;
    /// No `task_struct` is this large (about 10 KiB on Debian's kernels).
    const MAX_OFFSET: u32 = 1 << 20;

    fn path() -> PathBuf {
        unit_directory("RUNTIME_DIRECTORY", "/run/scorch").join("btf-offsets")
    }

    /// The offset kept under `name` for `boot`.
    pub fn load(boot: &str, name: &str) -> Option<u32> {
        let path = path();
        match read(&path, boot) {
            Ok(entries) => entries
                .into_iter()
                .find_map(|(kept, offset)| (kept == name).then_some(offset)),
            Err(error) => {
                tracing::debug!("not using {}: {error}", path.display());
                None
            }
        }
    }

    /// Keeps `offset` under `name` for `boot`, with the others kept for this boot.
    pub fn store(boot: &str, name: &str, offset: u32) {
        let path = path();
        let mut entries = read(&path, boot).unwrap_or_default();
        entries.retain(|(kept, _)| kept != name);
        entries.push((name.to_owned(), offset));
        if let Err(error) = write(&path, boot, &entries) {
            tracing::debug!("not keeping BTF offsets in {}: {error}", path.display());
        }
    }

    /// `name offset` lines after the magic line and `boot ID`.
    pub(super) fn parse(text: &str, boot: &str) -> io::Result<Vec<(String, u32)>> {
        let invalid = |reason| io::Error::new(io::ErrorKind::InvalidData, reason);
        let mut lines = text.lines();
        if lines.next() != Some(MAGIC) {
            return Err(invalid("another layout"));
        }
        if lines.next().and_then(|line| line.strip_prefix("boot ")) != Some(boot) {
            return Err(invalid("another boot"));
        }
        lines
            .map(|line| {
                let (name, offset) = line
                    .split_once(' ')
                    .ok_or_else(|| invalid("a line without an offset"))?;
                let offset: u32 = offset
                    .parse()
                    .map_err(|_| invalid("an offset that is not a number"))?;
                if offset >= MAX_OFFSET {
                    return Err(invalid("an offset past any task_struct"));
                }
                Ok((name.to_owned(), offset))
            })
            .collect()
    }

    pub(super) fn read(path: &Path, boot: &str) -> io::Result<Vec<(String, u32)>> {
        let mut text = String::new();
        open_private(path)?
            .take(MAX_BYTES)
            .read_to_string(&mut text)?;
        parse(&text, boot)
    }

    pub(super) fn write(path: &Path, boot: &str, entries: &[(String, u32)]) -> io::Result<()> {
        ensure_private_dir(path.parent().unwrap_or(Path::new("/")))?;
        let mut text = format!("{MAGIC}\nboot {boot}\n");
        for (name, offset) in entries {
            text.push_str(&format!("{name} {offset}\n"));
        }
        write_private_atomically(path, text.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob with `struct inner { int a; long b; }` and `struct outer { int x; struct
    /// inner in; }` behind a typedef.
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0long\0inner\0a\0b\0outer\0x\0in\0inner_t\0";
        let name = |s: &str| {
            let needle = format!("\0{s}\0");
            (strings
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .unwrap()
                + 1) as u32
        };
        let mut types = Vec::new();
        let mut put = |words: &[u32]| {
            for w in words {
                types.extend_from_slice(&w.to_le_bytes());
            }
        };
        // 1: int (4 bytes), 2: long (8 bytes)
        put(&[name("int"), 1 << 24, 4, 32]);
        put(&[name("long"), 1 << 24, 8, 64]);
        // 3: struct inner { a @0, b @64 bits }
        put(&[
            name("inner"),
            (4 << 24) | 2,
            16,
            name("a"),
            1,
            0,
            name("b"),
            2,
            64,
        ]);
        // 4: typedef inner_t -> 3
        put(&[name("inner_t"), 8 << 24, 3]);
        // 5: struct outer { x @0, in @64 bits (inner_t) }
        put(&[
            name("outer"),
            (4 << 24) | 2,
            24,
            name("x"),
            1,
            0,
            name("in"),
            4,
            64,
        ]);
        let mut data = Vec::new();
        for w in [
            0x0001_eb9f_u32,
            24,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            data.extend_from_slice(&w.to_le_bytes());
        }
        data[0..4].copy_from_slice(&[0x9f, 0xeb, 1, 0]);
        data.extend_from_slice(&types);
        data.extend_from_slice(strings);
        data
    }

    #[test]
    fn nested_members_through_a_typedef() {
        let data = blob();
        let btf = Btf::parse(&data).unwrap();
        assert_eq!(btf.member_offset("outer", &["in", "b"]), Ok(16));
        assert_eq!(btf.member_offset("outer", &["x"]), Ok(0));
        assert_eq!(
            btf.member_offset("outer", &["in", "c"]),
            Err(BtfError::NoMember {
                structure: "in".to_owned(),
                member: "c".to_owned()
            })
        );
        assert_eq!(
            btf.member_offset("none", &["x"]),
            Err(BtfError::NoStruct("none".to_owned()))
        );
    }

    #[test]
    fn a_cut_file_is_malformed() {
        let data = blob();
        assert!(matches!(
            Btf::parse(&data[..30]),
            Err(BtfError::Malformed(_))
        ));
        assert!(matches!(
            Btf::parse(b"not btf at all, not at all"),
            Err(BtfError::Malformed(_))
        ));
    }

    /// The running kernel's: x86-64 keeps `thread` near the end of `task_struct`. The kept
    /// route (this boot's file, written by the first call) gives the BTF's offset.
    #[test]
    fn this_kernels_task_fsbase() {
        let offset = btf_task_member_offset(&["thread", "fsbase"]).unwrap();
        assert!((1024..16384).contains(&offset), "{offset}");
        let path = crate::arch::x86_64::THREAD_POINTER;
        assert_eq!(task_thread_pointer_offset(path).unwrap(), offset);
        assert_eq!(task_thread_pointer_offset(path).unwrap(), offset);
    }

    #[test]
    fn kept_offsets_are_read_back_for_their_boot_only() {
        let dir = crate::sys::fs::private_tempdir();
        let path = dir.path().join("btf-offsets");
        let entries = vec![
            ("task_struct.thread.fsbase".to_owned(), 7520),
            ("task_struct.pid".to_owned(), 2456),
        ];
        kept::write(&path, "boot-a", &entries).unwrap();
        assert_eq!(kept::read(&path, "boot-a").unwrap(), entries);
        assert!(kept::read(&path, "boot-b").is_err());
        // Writable by others: not trusted.
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .unwrap();
        assert!(kept::read(&path, "boot-a").is_err());
        // Through a symlink: not trusted.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        assert!(kept::read(&link, "boot-a").is_err());
        assert!(kept::read(&path, "boot-a").is_ok());
    }

    #[test]
    fn a_kept_file_that_is_not_this_layout_is_refused() {
        let good = "scorch-btf-offsets 1\nboot b\ntask_struct.pid 2456\n";
        assert_eq!(
            kept::parse(good, "b").unwrap(),
            vec![("task_struct.pid".to_owned(), 2456)]
        );
        for bad in [
            "scorch-btf-offsets 2\nboot b\ntask_struct.pid 2456\n",
            "scorch-btf-offsets 1\ntask_struct.pid 2456\n",
            "scorch-btf-offsets 1\nboot b\ntask_struct.pid\n",
            "scorch-btf-offsets 1\nboot b\ntask_struct.pid -4\n",
            "scorch-btf-offsets 1\nboot b\ntask_struct.pid 99999999\n",
            "",
        ] {
            assert!(kept::parse(bad, "b").is_err(), "{bad:?}");
        }
    }
}
