//! What a server that symbolises needs (`--symbolize none`): each binary's build id, and the
//! files met for the first time, handed to the debug-info upload.

use super::*;

/// A binary seen for the first time, with the file a server needs to symbolise it.
pub struct NewBinary {
    /// GNU build id, lowercase hex: the server's key.
    pub build_id: String,
    /// Where it was opened, for logs only: the mapping may be gone or replaced by now.
    pub path: PathBuf,
    /// The file mapped: the mapping keeps the inode the process ran, even if the file was
    /// since replaced or deleted, or the process exited.
    pub data: FileData,
}

impl UserSymbolizer {
    /// Keeps each file whose build id `--symbolize none` reads (its separate debug file
    /// instead, when there is one here) for [`UserSymbolizer::take_new_binaries`], at most
    /// `limit` of them between two takes: each holds a mapping open.
    pub fn collect_new_binaries(&mut self, limit: usize) {
        self.collect_binaries = Some(limit);
    }

    /// The files collected since the last call (see [`UserSymbolizer::collect_new_binaries`]).
    pub fn take_new_binaries(&mut self) -> Vec<NewBinary> {
        std::mem::take(&mut self.new_binaries)
    }

    /// The build id of the file behind `entry`, when it has one and could be read.
    pub fn build_id(&mut self, pid: u32, entry: &MapEntry) -> Option<String> {
        if self.mode == SymbolizeMode::Local || entry.path == "[vdso]" {
            return self
                .elf(pid, entry)
                .ok()
                .and_then(|elf| elf.build_id.clone());
        }
        // Without local symbolisation, read only the note, not symbols and DWARF.
        if !entry.is_file() {
            return None;
        }
        if let Some(known) = self.build_ids.get(&(entry.dev, entry.inode)) {
            return known.clone();
        }
        let id = self.read_build_id(pid, entry);
        self.build_ids.insert((entry.dev, entry.inode), id.clone());
        id
    }

    /// The build id note of the file behind `entry`, and the file handed to the debug-info
    /// upload while it is open.
    pub(super) fn read_build_id(&mut self, pid: u32, entry: &MapEntry) -> Option<String> {
        let (handle, path, _) = open_mapped(pid, entry).ok()?;
        let data = FileData::map_file(&handle, &path).ok()?;
        let elf = crate::binary::elf::Elf::parse(data.bytes()).ok()?;
        let id = crate::symbolize::elf::build_id(&elf)?;
        let Some(limit) = self.collect_binaries else {
            return Some(id);
        };
        if self.new_binaries.len() >= limit {
            self.new_binaries_dropped += 1;
            tracing::debug!(
                "not keeping the debug info of {} ({id}) for upload: {limit} files already wait \
                 ({} left out so far)",
                entry.file_path(),
                self.new_binaries_dropped
            );
            return Some(id);
        }
        let debuglink = elf
            .debuglink()
            .map(|(name, crc)| (String::from_utf8_lossy(name).into_owned(), crc));
        drop(elf);
        let root = PathBuf::from(format!("/proc/{pid}/root"));
        let located = self.locate_debug_file(
            &root,
            entry.file_path(),
            Some(&id),
            debuglink.as_ref(),
            |path, data| Some((path.to_owned(), data)),
        );
        let (path, data) = located.unwrap_or((path, data));
        self.new_binaries.push(NewBinary {
            build_id: id.clone(),
            path,
            data,
        });
        Some(id)
    }
}
