//! The fields of HotSpot's classes that walking Java frames and naming them read, taken from a
//! JVM's own tables (`vmstructs`) under the names each JDK from 7 to 26 gives them, and its
//! version.
//!
//! A field renamed between JDKs is looked up under each of its names (`_code_begin` in 9 to
//! 22, `_code_offset` in 8 and 23+); a class renamed likewise (`nmethod` or its 9-to-22 base
//! `CompiledMethod`, JDK 7's `methodOopDesc`). Fields only some JDKs have are `Option`s; a
//! field every JDK has that a JVM's table lacks is an error naming the class, the field and
//! the JVM, which is how a new JDK that moved something shows itself.
//!
//! The version comes first (`version`), as the errors name it.
//!
//! How the walk reads a code address (a pointer or an offset from the blob) follows from which
//! of the names the table holds, never from the version alone: Dragonwell 11's
//! `ReduceNMethodSize` has JDK 23's layout in a JDK 11. Only the line tables' UNSIGNED5
//! encoding, which no field shows, is told by the version.

use super::version::Version;
use super::vmstructs::{Field, VmStructs};

/// Largest `sizeof` of a class read whole (OTel's bound: HotSpot's are a few hundred bytes).
pub const MAX_CLASS_SIZE: u64 = 64 * 1024;
/// Largest `sizeof(Symbol)`: the naming reads a symbol's header and body in one read of a
/// fixed size, which must hold the header.
pub const MAX_SYMBOL_SIZE: u64 = 32;

/// Every class name the layout reads, under each of its names: what [`super::vmstructs::read`]
/// keeps.
pub const TYPES: &[&str] = &[
    "Abstract_VM_Version",
    "JDK_Version",
    "CodeBlob",
    "CodeCache",
    "CodeHeap",
    "VirtualSpace",
    "HeapBlock",
    "ConstantPool",
    "constantPoolOopDesc",
    "ConstMethod",
    "constMethodOopDesc",
    "Method",
    "methodOopDesc",
    "InstanceKlass",
    "instanceKlass",
    "Klass",
    "oopDesc",
    "nmethod",
    "CompiledMethod",
    "PcDesc",
    "Symbol",
    "GrowableArray<int>",
    "GenericGrowableArray",
    "GrowableArrayBase",
    "Universe",
    "CollectedHeap",
];

/// Why a JVM's layout was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("JVM {version}: no {type_name}.{field} in its vmStructs")]
    Missing {
        type_name: &'static str,
        field: String,
        version: String,
    },
    #[error("JVM {version}: no size of {type_name} in its vmTypes")]
    NoSize {
        type_name: &'static str,
        version: String,
    },
    #[error("JVM {version}: {type_name}.{field} is {found}, not {expected}")]
    Kind {
        type_name: &'static str,
        field: &'static str,
        found: &'static str,
        expected: &'static str,
        version: String,
    },
    #[error("JVM {version}: sizeof({type_name}) is {size}, more than {max}")]
    TooLarge {
        type_name: &'static str,
        size: u64,
        max: u64,
        version: String,
    },
    #[error("JVM {version}: {type_name}.{field} at {offset} lies past sizeof({type_name}) {size}")]
    PastSize {
        type_name: &'static str,
        field: &'static str,
        offset: u64,
        size: u64,
        version: String,
    },
    #[error(
        "JVM {version}: the code's start, end and deoptimisation handler are not all pointers \
         or all offsets"
    )]
    MixedPlaces { version: String },
}

/// Where a code address is kept in a blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// A pointer at this offset (JDK 9 to 22).
    Pointer(u64),
    /// A 32-bit offset from the blob's start, at this offset (JDK 8, 23+).
    Offset(u64),
}

impl Place {
    fn is_offset(self) -> bool {
        matches!(self, Place::Offset(_))
    }
}

/// `CodeBlob`: every blob of the code cache (JIT-compiled methods, the interpreter, stubs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeBlob {
    pub size_of: u64,
    /// `const char* _name`: what kind of blob ("nmethod", "Interpreter", a stub's name).
    pub name: u64,
    pub frame_complete_offset: u64,
    /// In words.
    pub frame_size: u64,
    pub code_begin: Place,
    /// `_code_end`, or where the code ends in JDK 8 and 23+: `_data_offset`.
    pub code_end: Place,
    /// `_size`: the blob's size in bytes.
    pub size: u64,
    /// JDK 25+: metadata lives in the mutable data, after the relocations.
    pub relocation_size: Option<u64>,
    pub mutable_data_size: Option<u64>,
    pub mutable_data: Option<u64>,
}

/// How the code cache's heaps are found (statics, as ELF addresses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heaps {
    /// JDK 8: `CodeCache::_heap`, a `CodeHeap*`.
    Single(u64),
    /// JDK 9+: `CodeCache::_heaps`, a `GrowableArray<CodeHeap*>*`.
    Segmented(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeCache {
    pub heaps: Heaps,
    /// `CodeCache::_low_bound`, `_high_bound` (JDK 9+): statics holding the whole cache's
    /// bounds.
    pub low_bound: Option<u64>,
    pub high_bound: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeHeap {
    pub size_of: u64,
    pub log2_segment_size: u64,
    /// `VirtualSpace _memory`: the heap's code.
    pub memory: u64,
    /// `VirtualSpace _segmap`: one byte per segment, leading back to the blob's first.
    pub segmap: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VirtualSpace {
    /// The reserved range.
    pub low_boundary: u64,
    pub high_boundary: u64,
    /// The committed range.
    pub low: Option<u64>,
    pub high: Option<u64>,
}

/// Where a class's source file name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceFile {
    /// JDK 15+: `ConstantPool._source_file_name_index`, a constant-pool index.
    PoolIndex(u64),
    /// JDK 8 to 14: `InstanceKlass._source_file_name_index`.
    KlassIndex(u64),
    /// JDK 7: `instanceKlass._source_file_name`, a `Symbol*` (offset from the klass oop).
    KlassSymbol(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConstantPool {
    pub size_of: u64,
    pub pool_holder: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConstMethod {
    /// Where the bytecode starts: the interpreter's BCP less this is the BCI.
    pub size_of: u64,
    pub constants: u64,
    pub code_size: u64,
    /// `_flags` (a `u2`), or JDK 21+'s `_flags._flags`: bit 0 says a line table follows the
    /// bytecode.
    pub flags: u64,
    pub name_index: u64,
    pub signature_index: u64,
}

/// `nmethod` (with its JDK 9-to-22 base `CompiledMethod`): a JIT-compiled method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nmethod {
    pub size_of: u64,
    /// What the BPF walk sends with the frame, so a freed and reused nmethod is told apart.
    pub compile_id: u64,
    /// `_metadata_offset` (`_oops_offset` in JDK 7); gone in 25+, where metadata is in the
    /// mutable data.
    pub metadata_offset: Option<u64>,
    pub scopes_pcs_offset: u64,
    /// `_scopes_data_begin` (a pointer, 9 to 22) or `_scopes_data_offset`.
    pub scopes_data: Place,
    /// To JDK 22.
    pub dependencies_offset: Option<u64>,
    /// JDK 23+: scopes in a separate area.
    pub immutable_data: Option<u64>,
    pub immutable_data_size: Option<u64>,
    /// JDK 26+: the area ends at a reference count.
    pub immutable_data_ref_count_offset: Option<u64>,
    /// Where a deoptimised frame keeps its original pc, from the frame's stack pointer.
    pub orig_pc_offset: u64,
    /// The deoptimisation handler (four names across JDKs).
    pub deopt_handler: Place,
    pub method: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PcDesc {
    pub size_of: u64,
    pub pc_offset: u64,
    pub scope_decode_offset: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Symbol {
    pub size_of: u64,
    pub body: u64,
    /// The `u2` length: `_length`, or two bytes into JDK 12's `_length_and_refcount`.
    pub length: u64,
}

/// `GrowableArray<int>` and its base, as `CodeCache::_heaps` is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrowableArray {
    pub size_of: u64,
    pub data: u64,
    /// `GrowableArrayBase._len` (16+) or `GenericGrowableArray._len`.
    pub len: u64,
}

/// `Abstract_VM_Version` statics, as ELF addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmVersion {
    /// `const char* _s_vm_release`.
    pub release: u64,
    pub major: Option<u64>,
    pub minor: Option<u64>,
    pub security: Option<u64>,
    pub build: Option<u64>,
}

/// What the walk and the naming read of a JVM: offsets in bytes, statics as ELF addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub version: Version,
    /// Bytes the line tables' UNSIGNED5 encoding excludes: 1 from JDK 20 build 15 on (the
    /// zero byte), else 0.
    pub unsigned5_excluded: u8,
    /// Whether an nmethod's code start and end and deoptimisation handler are offsets from
    /// the blob (JDK 8, 23+) rather than pointers.
    pub nmethod_uses_offsets: bool,
    pub code_blob: CodeBlob,
    pub code_cache: CodeCache,
    pub code_heap: CodeHeap,
    pub virtual_space: VirtualSpace,
    /// `sizeof(HeapBlock)`: the header before each blob in a code heap.
    pub heap_block_size: u64,
    pub constant_pool: ConstantPool,
    pub source_file: SourceFile,
    pub const_method: ConstMethod,
    /// `Method._constMethod`.
    pub method_const_method: u64,
    pub instance_klass_size: u64,
    /// `Klass._name`, a `Symbol*`.
    pub klass_name: u64,
    pub nmethod: Nmethod,
    pub pc_desc: PcDesc,
    pub symbol: Symbol,
    pub growable_array: GrowableArray,
    pub vm_version: VmVersion,
    /// Where the JVM counts its collections, which the walk reads with each sample and the
    /// naming again: a class is unloaded only by a collection, so a frame sampled before one
    /// and named after may be of memory freed since. `None` where the table has no
    /// `Universe::_collectedHeap` or `CollectedHeap::_total_collections`.
    pub collections: Option<Collections>,
}

/// `Universe::_collectedHeap` (a static `CollectedHeap*`, at an address of the libjvm) and
/// `CollectedHeap::_total_collections` (a u32 in it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Collections {
    pub heap: u64,
    pub total: u64,
}

/// A class under its names across JDKs, the first its table holds giving its size.
struct Class<'a> {
    tables: &'a VmStructs,
    names: &'static [&'static str],
    version: &'a Version,
}

impl Class<'_> {
    fn version(&self) -> String {
        self.version.release.clone()
    }

    /// The field's offset under the first of `fields` any of the class's names has, and
    /// which name it was.
    fn find(&self, fields: &[&'static str]) -> Result<Option<(u64, &'static str)>, LayoutError> {
        for &field in fields {
            for &type_name in self.names {
                match self.tables.field(type_name, field) {
                    Some(Field::Offset(offset)) => {
                        self.within(field, offset)?;
                        return Ok(Some((offset, field)));
                    }
                    Some(Field::Static(_)) => {
                        return Err(self.kind(field, "a static", "a member"));
                    }
                    None => {}
                }
            }
        }
        Ok(None)
    }

    fn optional(&self, field: &'static str) -> Result<Option<u64>, LayoutError> {
        Ok(self.find(&[field])?.map(|(offset, _)| offset))
    }

    fn required(&self, fields: &[&'static str]) -> Result<u64, LayoutError> {
        Ok(self.place(fields, &[])?.0)
    }

    /// The field under `pointers` (read as a pointer) or else `offsets` (a 32-bit offset).
    fn place(
        &self,
        pointers: &[&'static str],
        offsets: &[&'static str],
    ) -> Result<(u64, Place), LayoutError> {
        if let Some((offset, _)) = self.find(pointers)? {
            return Ok((offset, Place::Pointer(offset)));
        }
        if let Some((offset, _)) = self.find(offsets)? {
            return Ok((offset, Place::Offset(offset)));
        }
        Err(LayoutError::Missing {
            type_name: self.names[0],
            field: pointers
                .iter()
                .chain(offsets)
                .copied()
                .collect::<Vec<_>>()
                .join(" or "),
            version: self.version(),
        })
    }

    fn static_at(&self, field: &'static str) -> Result<Option<u64>, LayoutError> {
        for &type_name in self.names {
            match self.tables.field(type_name, field) {
                Some(Field::Static(address)) => return Ok(Some(address)),
                Some(Field::Offset(_)) => return Err(self.kind(field, "a member", "a static")),
                None => {}
            }
        }
        Ok(None)
    }

    fn size(&self) -> Result<u64, LayoutError> {
        let (type_name, size) = self
            .names
            .iter()
            .find_map(|&name| Some((name, self.tables.size(name)?)))
            .ok_or(LayoutError::NoSize {
                type_name: self.names[0],
                version: self.version(),
            })?;
        if size > MAX_CLASS_SIZE {
            return Err(LayoutError::TooLarge {
                type_name,
                size,
                max: MAX_CLASS_SIZE,
                version: self.version(),
            });
        }
        Ok(size)
    }

    /// A member lies within its class, when the table gives the class's size: what is read
    /// whole is read at `sizeof` bytes.
    fn within(&self, field: &'static str, offset: u64) -> Result<(), LayoutError> {
        let Some(&type_name) = self.names.iter().find(|&&n| self.tables.size(n).is_some()) else {
            return Ok(());
        };
        let size = self.tables.size(type_name).unwrap_or(u64::MAX);
        if offset >= size {
            return Err(LayoutError::PastSize {
                type_name,
                field,
                offset,
                size,
                version: self.version(),
            });
        }
        Ok(())
    }

    fn kind(
        &self,
        field: &'static str,
        found: &'static str,
        expected: &'static str,
    ) -> LayoutError {
        LayoutError::Kind {
            type_name: self.names[0],
            field,
            found,
            expected,
            version: self.version(),
        }
    }
}

/// The layout `tables` describe, for a JVM of `version`; pure.
pub fn layout(tables: &VmStructs, version: Version) -> Result<Layout, LayoutError> {
    let class = |names: &'static [&'static str]| Class {
        tables,
        names,
        version: &version,
    };
    let blob = class(&["CodeBlob"]);
    let (_, code_begin) = blob.place(&["_code_begin"], &["_code_offset"])?;
    let (_, code_end) = blob.place(&["_code_end"], &["_data_offset"])?;
    let code_blob = CodeBlob {
        size_of: blob.size()?,
        name: blob.required(&["_name"])?,
        frame_complete_offset: blob.required(&["_frame_complete_offset"])?,
        frame_size: blob.required(&["_frame_size"])?,
        code_begin,
        code_end,
        size: blob.required(&["_size"])?,
        relocation_size: blob.optional("_relocation_size")?,
        mutable_data_size: blob.optional("_mutable_data_size")?,
        mutable_data: blob.optional("_mutable_data")?,
    };

    let cache = class(&["CodeCache"]);
    let heaps = match (cache.static_at("_heaps")?, cache.static_at("_heap")?) {
        (Some(heaps), _) => Heaps::Segmented(heaps),
        (None, Some(heap)) => Heaps::Single(heap),
        (None, None) => {
            return Err(LayoutError::Missing {
                type_name: "CodeCache",
                field: "_heaps or _heap".into(),
                version: version.release.clone(),
            })
        }
    };
    let code_cache = CodeCache {
        heaps,
        low_bound: cache.static_at("_low_bound")?,
        high_bound: cache.static_at("_high_bound")?,
    };

    let heap = class(&["CodeHeap"]);
    let code_heap = CodeHeap {
        size_of: heap.size()?,
        log2_segment_size: heap.required(&["_log2_segment_size"])?,
        memory: heap.required(&["_memory"])?,
        segmap: heap.required(&["_segmap"])?,
    };
    let space = class(&["VirtualSpace"]);
    let virtual_space = VirtualSpace {
        low_boundary: space.required(&["_low_boundary"])?,
        high_boundary: space.required(&["_high_boundary"])?,
        low: space.optional("_low")?,
        high: space.optional("_high")?,
    };

    let pool = class(&["ConstantPool", "constantPoolOopDesc"]);
    let constant_pool = ConstantPool {
        size_of: pool.size()?,
        pool_holder: pool.required(&["_pool_holder"])?,
    };
    let instance_klass = class(&["InstanceKlass", "instanceKlass"]);
    let klass = class(&["Klass"]);
    let mut klass_name = klass.required(&["_name"])?;
    let source_file = if let Some(index) = pool.optional("_source_file_name_index")? {
        SourceFile::PoolIndex(index)
    } else if let Some(index) = instance_klass.optional("_source_file_name_index")? {
        SourceFile::KlassIndex(index)
    } else {
        // JDK 7: a klass is an oop; its fields are described from past the oop's header.
        let header = class(&["oopDesc"]).size()?;
        klass_name += header;
        let name = instance_klass.required(&["_source_file_name"])?;
        SourceFile::KlassSymbol(name + header)
    };

    let constants = class(&["ConstMethod", "constMethodOopDesc"]);
    let const_method = ConstMethod {
        size_of: constants.size()?,
        constants: constants.required(&["_constants"])?,
        code_size: constants.required(&["_code_size"])?,
        flags: constants.required(&["_flags", "_flags._flags"])?,
        name_index: constants.required(&["_name_index"])?,
        signature_index: constants.required(&["_signature_index"])?,
    };
    let method_const_method = class(&["Method", "methodOopDesc"]).required(&["_constMethod"])?;

    let compiled = class(&["nmethod", "CompiledMethod"]);
    let (_, deopt_handler) = compiled.place(
        &["_deopt_handler_begin"],
        &[
            "_deoptimize_offset",
            "_deopt_handler_offset",
            "_deopt_handler_entry_offset",
        ],
    )?;
    let (_, scopes_data) = compiled.place(&["_scopes_data_begin"], &["_scopes_data_offset"])?;
    let metadata_offset = compiled.find(&["_metadata_offset", "_oops_offset"])?;
    let mutable_metadata = code_blob.mutable_data.is_some();
    if metadata_offset.is_none() && !mutable_metadata {
        return Err(LayoutError::Missing {
            type_name: "nmethod",
            field: "_metadata_offset or CodeBlob._mutable_data".into(),
            version: version.release.clone(),
        });
    }
    let nmethod = Nmethod {
        size_of: compiled.size()?,
        compile_id: compiled.required(&["_compile_id"])?,
        metadata_offset: metadata_offset.map(|(offset, _)| offset),
        scopes_pcs_offset: compiled.required(&["_scopes_pcs_offset"])?,
        scopes_data,
        dependencies_offset: compiled.optional("_dependencies_offset")?,
        immutable_data: compiled.optional("_immutable_data")?,
        immutable_data_size: compiled.optional("_immutable_data_size")?,
        immutable_data_ref_count_offset: compiled.optional("_immutable_data_ref_count_offset")?,
        orig_pc_offset: compiled.required(&["_orig_pc_offset"])?,
        deopt_handler,
        method: compiled.required(&["_method"])?,
    };
    // Where the names put them, not the version: see the module documentation.
    let places = [
        code_blob.code_begin,
        code_blob.code_end,
        nmethod.deopt_handler,
    ];
    let nmethod_uses_offsets = places.iter().all(|p| p.is_offset());
    if !nmethod_uses_offsets && places.iter().any(|p| p.is_offset()) {
        return Err(LayoutError::MixedPlaces {
            version: version.release.clone(),
        });
    }

    let pc = class(&["PcDesc"]);
    let pc_desc = PcDesc {
        size_of: pc.size()?,
        pc_offset: pc.required(&["_pc_offset"])?,
        scope_decode_offset: pc.required(&["_scope_decode_offset"])?,
    };
    let symbols = class(&["Symbol"]);
    let symbol_size = symbols.size()?;
    if symbol_size > MAX_SYMBOL_SIZE {
        return Err(LayoutError::TooLarge {
            type_name: "Symbol",
            size: symbol_size,
            max: MAX_SYMBOL_SIZE,
            version: version.release.clone(),
        });
    }
    let length = match symbols.optional("_length")? {
        Some(length) => length,
        // JDK 12 to 14 keep the length in the top half of a u32 with the refcount.
        None => symbols.required(&["_length_and_refcount"])? + 2,
    };
    let symbol = Symbol {
        size_of: symbol_size,
        body: symbols.required(&["_body"])?,
        length,
    };

    let array = class(&["GrowableArray<int>"]);
    let growable_array = GrowableArray {
        size_of: array.size()?,
        data: array.required(&["_data"])?,
        len: class(&["GrowableArrayBase", "GenericGrowableArray"]).required(&["_len"])?,
    };

    let vm = class(&["Abstract_VM_Version"]);
    let vm_version = VmVersion {
        release: vm
            .static_at("_s_vm_release")?
            .ok_or_else(|| LayoutError::Missing {
                type_name: "Abstract_VM_Version",
                field: "_s_vm_release".into(),
                version: version.release.clone(),
            })?,
        major: vm.static_at("_vm_major_version")?,
        minor: vm.static_at("_vm_minor_version")?,
        security: vm.static_at("_vm_security_version")?,
        build: vm.static_at("_vm_build_number")?,
    };

    let collections = match (
        class(&["Universe"]).static_at("_collectedHeap")?,
        class(&["CollectedHeap"]).optional("_total_collections")?,
    ) {
        (Some(heap), Some(total)) => Some(Collections { heap, total }),
        _ => None,
    };

    let unsigned5_excluded = u8::from(
        (
            version.major,
            version.minor,
            version.security,
            version.build,
        ) >= (20, 0, 0, 15),
    );
    Ok(Layout {
        unsigned5_excluded,
        nmethod_uses_offsets,
        code_blob,
        code_cache,
        code_heap,
        virtual_space,
        heap_block_size: class(&["HeapBlock"]).size()?,
        constant_pool,
        source_file,
        const_method,
        method_const_method,
        instance_klass_size: instance_klass.size()?,
        klass_name,
        nmethod,
        pc_desc,
        symbol,
        growable_array,
        vm_version,
        collections,
        version,
    })
}
