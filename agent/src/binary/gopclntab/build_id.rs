//! The Go build id, from its ELF note.

use super::*;

/// The Go build id: the note with owner "Go" and type 4, from `.note.go.buildid` (any note
/// section) or, with no section headers, the PT_NOTE segments. None if absent or not UTF-8.
pub fn build_id(file: &object::File<'_>, data: &[u8]) -> Option<String> {
    match file {
        object::File::Elf32(elf) => elf_build_id(elf, data),
        object::File::Elf64(elf) => elf_build_id(elf, data),
        _ => None,
    }
}

pub(super) fn elf_build_id<'d, Elf>(elf: &ElfFile<'d, Elf>, data: &'d [u8]) -> Option<String>
where
    Elf: FileHeader<Endian = Endianness>,
{
    let endian = elf.endian();
    let go_note = |notes: Option<NoteIterator<'d, Elf>>| {
        let mut notes = notes?;
        // The iterator advances by each note's size, so the bytes bound the loop.
        while let Ok(Some(note)) = notes.next() {
            if note.name() == b"Go" && note.n_type(endian) == NOTE_GO_BUILD_ID {
                return String::from_utf8(note.desc().to_vec()).ok();
            }
        }
        None
    };
    let sections = elf.elf_section_table().iter();
    let in_sections = sections.filter_map(|section| section.notes(endian, data).ok());
    let segments = elf.elf_program_headers().iter();
    let in_segments = segments.filter_map(|segment| segment.notes(endian, data).ok());
    in_sections.chain(in_segments).find_map(go_note)
}
