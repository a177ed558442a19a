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

/// The offset of the thread's `fs` base in `struct task_struct` (`thread.fsbase`), read from
/// the running kernel's BTF.
pub fn task_fsbase_offset() -> Result<u32, BtfError> {
    task_member_offset(&["thread", "fsbase"])
}

/// The offset of the thread id in `struct task_struct` (`pid`), for the off-CPU program to
/// read the id of the task switching in.
pub fn task_pid_offset() -> Result<u32, BtfError> {
    task_member_offset(&["pid"])
}

fn task_member_offset(path: &[&str]) -> Result<u32, BtfError> {
    let file = "/sys/kernel/btf/vmlinux";
    let data = std::fs::read(file).map_err(|e| BtfError::Read {
        path: file.to_owned(),
        reason: e.to_string(),
    })?;
    Btf::parse(&data)?.member_offset("task_struct", path)
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

    /// The running kernel's: x86-64 keeps `thread` near the end of `task_struct`.
    #[test]
    fn this_kernels_task_fsbase() {
        let offset = task_fsbase_offset().unwrap();
        assert!((1024..16384).contains(&offset), "{offset}");
    }
}
