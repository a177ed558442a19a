//! Naming a compiled frame from its `nmethod*`, the pc's offset from the code's start and the
//! compile id the BPF walk read with it: one frame per method inlined at that pc, innermost
//! first.
//!
//! An nmethod's debug info is three arrays: `metadata` (the `Method*`s its scopes name),
//! `scopes_data` (the scope descriptors, UNSIGNED5 streams) and `scopes_pcs` (`PcDesc`s, each
//! a pc offset and the scope at it). To JDK 22 the three lie in the nmethod, from
//! `_metadata_offset` to `_dependencies_offset` (scopes data at `_scopes_data_begin`, a
//! pointer, or JDK 8's offset); from JDK 23 the scopes lie in a separate immutable area and
//! the metadata after the code (in 25+, in the mutable data after the relocations).
//!
//! The `PcDesc` chosen is the one with the largest pc offset not past the pc's, as OTel does:
//! HotSpot records a call's `PcDesc` at the return address, which is what a caller's frame
//! holds. Each scope descriptor is three values: the sender's (caller's) descriptor offset (0
//! for none), a 1-based index into the metadata (0 for none), and the bci plus one (HotSpot
//! writes `bci - InvocationEntryBci`; the method-entry bci -1 is named as bci 0).
//!
//! A compile id that is not the sample's means the nmethod was freed and its memory reused
//! since the sample: [`NmethodError::Evicted`], and the frame is never named from it. What is
//! read is bounded: the nmethod at its `sizeof`, the debug info at most [`MAX_DEBUG_INFO`]
//! bytes (OTel's bound), at most [`MAX_SCOPES`] scopes, each sender strictly before its
//! callee's descriptor so that a chain cannot loop.

use super::layout::{Layout, Place};
use super::method::{name_method, JavaFrame, MethodError};
use super::unsigned5::{Reader, Unsigned5Error};
use super::vmstructs::{i32_in, u16_in, u64_in};
use crate::runtimes::memory::Memory;

/// Most bytes of metadata and scopes read for one nmethod (OTel's bound): real ones are a
/// few KiB, a large method with deep inlining some tens.
pub const MAX_DEBUG_INFO: u64 = 1024 * 1024;
/// Most scopes named for one pc. HotSpot's `MaxInlineLevel` is 15 by default (9 before JDK
/// 14), and C2 also inlines within its `InlineSmallCode` budget; 64 is OTel's bound, far
/// past any real chain.
pub const MAX_SCOPES: usize = 64;

/// Why a compiled frame was not named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NmethodError {
    #[error("{what} at {address:#x}: unreadable")]
    Unreadable { what: &'static str, address: u64 },
    #[error("the nmethod holds compile {found}, not the sample's {expected}: freed and reused")]
    Evicted { expected: u32, found: u32 },
    #[error("the nmethod's {what} are out of order or past its end ({detail})")]
    Bounds { what: &'static str, detail: String },
    #[error("the nmethod's {what} is {size} bytes, more than {MAX_DEBUG_INFO}")]
    TooLarge { what: &'static str, size: u64 },
    #[error("the nmethod's layout has no {0}")]
    NoField(&'static str),
    #[error("scope at {offset}: {source}")]
    Scope {
        offset: usize,
        source: Unsigned5Error,
    },
    #[error("scope at {offset} is past the scopes' {len} bytes")]
    ScopePast { offset: usize, len: usize },
    #[error("scope at {offset} names sender {sender}, not one before it")]
    ScopeLoop { offset: usize, sender: usize },
    #[error("more than {MAX_SCOPES} scopes")]
    TooDeep,
    #[error("scope at {offset} names metadata {index} of {len}")]
    MetadataIndex {
        offset: usize,
        index: u32,
        len: usize,
    },
    #[error("a method of the nmethod: {0}")]
    Method(#[from] MethodError),
}

/// An nmethod's debug info, read from its process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DebugInfo {
    /// `Method*`s (and other metadata), one word each.
    pub metadata: Vec<u8>,
    pub scopes_data: Vec<u8>,
    pub scopes_pcs: Vec<u8>,
}

fn read(
    memory: &dyn Memory,
    what: &'static str,
    address: u64,
    len: u64,
) -> Result<Vec<u8>, NmethodError> {
    if len > MAX_DEBUG_INFO {
        return Err(NmethodError::TooLarge { what, size: len });
    }
    let mut bytes = vec![0u8; len as usize];
    if !memory.read(address, &mut bytes) {
        return Err(NmethodError::Unreadable { what, address });
    }
    Ok(bytes)
}

/// The frames of the pc `pc_offset` bytes past the code's start in the nmethod at `nmethod`,
/// which the sample saw with `compile_id` (its low 24 bits, as a frame's cookie keeps it):
/// innermost first.
pub fn name_compiled(
    memory: &dyn Memory,
    layout: &Layout,
    nmethod: u64,
    pc_offset: u32,
    compile_id: u32,
) -> Result<Vec<JavaFrame>, NmethodError> {
    let n = &layout.nmethod;
    let bytes = read(memory, "nmethod", nmethod, n.size_of)?;
    let (found, _) = scorch_common::hotspot_cookie_parts(i32_in(&bytes, n.compile_id) as u32);
    let (compile_id, _) = scorch_common::hotspot_cookie_parts(compile_id);
    if found != compile_id {
        return Err(NmethodError::Evicted {
            expected: compile_id,
            found,
        });
    }
    let method = u64_in(&bytes, n.method);
    let info = debug_info(memory, layout, nmethod, &bytes)?;
    let scopes = scopes(&info, layout, method, pc_offset)?;
    scopes
        .into_iter()
        .map(|(method, bci)| Ok(name_method(memory, layout, method, bci)?))
        .collect()
}

/// The debug info of the nmethod at `nmethod`, whose `sizeof` bytes are `bytes`.
pub fn debug_info(
    memory: &dyn Memory,
    layout: &Layout,
    nmethod: u64,
    bytes: &[u8],
) -> Result<DebugInfo, NmethodError> {
    let n = &layout.nmethod;
    let scopes_pcs = i32_in(bytes, n.scopes_pcs_offset) as i64;
    let scopes_data = match n.scopes_data {
        Place::Pointer(at) => u64_in(bytes, at).wrapping_sub(nmethod) as i64,
        Place::Offset(at) => i32_in(bytes, at) as i64,
    };
    if let Some(immutable) = n.immutable_data {
        // JDK 23+: scopes_pcs then scopes_data in the immutable area, up to its size.
        let size_at = n
            .immutable_data_size
            .ok_or(NmethodError::NoField("_immutable_data_size"))?;
        let area = u64_in(bytes, immutable);
        let size = i32_in(bytes, size_at) as i64;
        if !(0 <= scopes_pcs && scopes_pcs <= scopes_data && scopes_data <= size) {
            return Err(NmethodError::Bounds {
                what: "scopes",
                detail: format!("pcs {scopes_pcs}, data {scopes_data}, size {size}"),
            });
        }
        let scopes = read(
            memory,
            "scopes",
            area.wrapping_add(scopes_pcs as u64),
            (size - scopes_pcs) as u64,
        )?;
        let split = (scopes_data - scopes_pcs) as usize;
        let metadata = metadata_after_code(memory, layout, nmethod, bytes)?;
        return Ok(DebugInfo {
            metadata,
            scopes_pcs: scopes[..split].to_vec(),
            scopes_data: scopes[split..].to_vec(),
        });
    }
    // To JDK 22: metadata, scopes data, scopes pcs, then the dependencies, in the nmethod.
    let metadata_at = n
        .metadata_offset
        .ok_or(NmethodError::NoField("_metadata_offset"))?;
    let dependencies_at = n
        .dependencies_offset
        .ok_or(NmethodError::NoField("_dependencies_offset"))?;
    let metadata = i32_in(bytes, metadata_at) as i64;
    let dependencies = i32_in(bytes, dependencies_at) as i64;
    if !(0 <= metadata
        && metadata <= scopes_data
        && scopes_data <= scopes_pcs
        && scopes_pcs <= dependencies)
    {
        return Err(NmethodError::Bounds {
            what: "debug info offsets",
            detail: format!(
                "metadata {metadata}, scopes data {scopes_data}, pcs {scopes_pcs}, \
                 dependencies {dependencies}"
            ),
        });
    }
    let all = read(
        memory,
        "debug info",
        nmethod.wrapping_add(metadata as u64),
        (dependencies - metadata) as u64,
    )?;
    let data = (scopes_data - metadata) as usize;
    let pcs = (scopes_pcs - metadata) as usize;
    Ok(DebugInfo {
        metadata: all[..data].to_vec(),
        scopes_data: all[data..pcs].to_vec(),
        scopes_pcs: all[pcs..].to_vec(),
    })
}

/// JDK 23+'s metadata: after the relocations in the mutable data (25+), else at
/// `_metadata_offset` (a `u2`) past the code's end, to the blob's end (OTel's reading: the
/// JVMCI data that may follow is not described).
fn metadata_after_code(
    memory: &dyn Memory,
    layout: &Layout,
    nmethod: u64,
    bytes: &[u8],
) -> Result<Vec<u8>, NmethodError> {
    let blob = &layout.code_blob;
    if let (Some(data), Some(relocations), Some(size)) = (
        blob.mutable_data,
        blob.relocation_size,
        blob.mutable_data_size,
    ) {
        let data = u64_in(bytes, data);
        let relocations = i32_in(bytes, relocations) as i64;
        let size = i32_in(bytes, size) as i64;
        if !(0 <= relocations && relocations <= size) {
            return Err(NmethodError::Bounds {
                what: "mutable data",
                detail: format!("relocations {relocations}, size {size}"),
            });
        }
        return read(
            memory,
            "metadata",
            data.wrapping_add(relocations as u64),
            (size - relocations) as u64,
        );
    }
    let metadata_at = layout
        .nmethod
        .metadata_offset
        .ok_or(NmethodError::NoField("_metadata_offset"))?;
    let Place::Offset(code_end) = blob.code_end else {
        return Err(NmethodError::NoField("CodeBlob._data_offset"));
    };
    let start = i32_in(bytes, code_end) as i64 + i64::from(u16_in(bytes, metadata_at));
    let end = i32_in(bytes, blob.size) as i64;
    if !(0 <= start && start <= end) {
        return Err(NmethodError::Bounds {
            what: "metadata",
            detail: format!("start {start}, blob size {end}"),
        });
    }
    read(
        memory,
        "metadata",
        nmethod.wrapping_add(start as u64),
        (end - start) as u64,
    )
}

/// The scope descriptor offset of the pc `pc_offset` bytes past the code's start: that of the
/// `PcDesc` with the largest pc offset not past it (pure). None without one, or with the
/// null descriptor (0).
pub fn scope_at(info: &DebugInfo, layout: &Layout, pc_offset: u32) -> Option<usize> {
    let desc = &layout.pc_desc;
    let stride = desc.size_of.max(1) as usize;
    let target = i64::from(pc_offset);
    let mut best: Option<(i64, i32)> = None;
    for entry in info.scopes_pcs.chunks_exact(stride) {
        let pc = i64::from(i32_in(entry, desc.pc_offset));
        if pc <= target && best.is_none_or(|(b, _)| pc >= b) {
            best = Some((pc, i32_in(entry, desc.scope_decode_offset)));
            if pc == target {
                break;
            }
        }
    }
    match best {
        Some((_, scope)) if scope > 0 => Some(scope as usize),
        _ => None,
    }
}

/// The methods and bcis at `pc_offset`, innermost first (pure): the scope chain from the
/// `PcDesc` there, or the nmethod's own `method` alone where none is.
pub fn scopes(
    info: &DebugInfo,
    layout: &Layout,
    method: u64,
    pc_offset: u32,
) -> Result<Vec<(u64, u32)>, NmethodError> {
    let Some(mut offset) = scope_at(info, layout, pc_offset) else {
        return Ok(vec![(method, 0)]);
    };
    let data = &info.scopes_data;
    let methods = info.metadata.len() / 8;
    let mut out = Vec::new();
    for _ in 0..MAX_SCOPES {
        let bytes = data.get(offset..).ok_or(NmethodError::ScopePast {
            offset,
            len: data.len(),
        })?;
        let mut reader = Reader::new(bytes, layout.unsigned5_excluded);
        let scope = |source| NmethodError::Scope { offset, source };
        let sender = reader.uint().map_err(scope)? as usize;
        let index = reader.uint().map_err(scope)?;
        let bci = reader.uint().map_err(scope)?;
        if index != 0 {
            let slot = index as usize - 1;
            if slot >= methods {
                return Err(NmethodError::MetadataIndex {
                    offset,
                    index,
                    len: methods,
                });
            }
            let method = u64_in(&info.metadata, 8 * slot as u64);
            out.push((method, bci.saturating_sub(1)));
        }
        if sender == 0 {
            return Ok(out);
        }
        // HotSpot writes a caller's descriptor before its callees'.
        if sender >= offset {
            return Err(NmethodError::ScopeLoop { offset, sender });
        }
        offset = sender;
    }
    Err(NmethodError::TooDeep)
}
