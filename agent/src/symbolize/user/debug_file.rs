//! Separate debug information, found the way gdb finds it: by build id, then by
//! `.gnu_debuglink`, inside the process's root and then on the host.

use super::*;

impl UserSymbolizer {
    /// Separate debug info, looked up the way gdb does: by build id under
    /// `/usr/lib/debug/.build-id/`, then by `.gnu_debuglink` next to the binary, in its
    /// `.debug/` directory and under `/usr/lib/debug/`. Each place is tried inside the
    /// process's root first, then on the host.
    pub(super) fn find_debug_file(
        &mut self,
        root: &Path,
        binary: &str,
        file: &ElfFile,
        skip_dwarf: bool,
    ) -> Option<ElfFile> {
        let options = self.dwarf_options(skip_dwarf);
        self.locate_debug_file(
            root,
            binary,
            file.build_id.as_deref(),
            file.debuglink.as_ref(),
            |path, data| match ElfFile::parse_with(Arc::new(data), path, &options) {
                Ok(debug) => Some(debug),
                Err(err) => {
                    tracing::debug!("{err}");
                    None
                }
            },
        )
    }

    /// The search [`Self::find_debug_file`] describes, for any use of the file: each candidate
    /// found, mapped and checked (the same build id, or the debug link's CRC) goes to `accept`,
    /// until it takes one.
    pub(super) fn locate_debug_file<T>(
        &mut self,
        root: &Path,
        binary: &str,
        build_id: Option<&str>,
        debuglink: Option<&(String, u32)>,
        mut accept: impl FnMut(&Path, FileData) -> Option<T>,
    ) -> Option<T> {
        let prefixes = [root, Path::new("/")];
        // Every candidate is opened as untrusted, inside its root (see `open_mapped`).
        let map_in = |prefix: &Path, relative: &Path| -> Option<(PathBuf, FileData)> {
            let opened = untrusted::open_in_root(prefix, relative).ok()?;
            let data = FileData::map_file(&opened.file, &opened.path).ok()?;
            Some((opened.path, data))
        };
        if let Some(id) =
            build_id.filter(|id| id.len() > 2 && id.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            let relative = format!("usr/lib/debug/.build-id/{}/{}.debug", &id[..2], &id[2..]);
            for prefix in prefixes {
                let Some((path, data)) = map_in(prefix, Path::new(&relative)) else {
                    continue;
                };
                let checked = Some(data).filter(|data| {
                    object::File::parse(data.bytes())
                        .ok()
                        .and_then(|debug| object::Object::build_id(&debug).ok().flatten())
                        .is_some_and(|found| to_hex(found) == id)
                });
                if let Some(found) = checked.and_then(|data| accept(&path, data)) {
                    return Some(found);
                }
                *self.fallbacks.entry(Fallback::BadDebugFile).or_insert(0) += 1;
            }
        }
        let (name, crc) = debuglink?.clone();
        if !is_plain_file_name(&name) {
            *self.fallbacks.entry(Fallback::BadDebugFile).or_insert(0) += 1;
            return None;
        }
        let dir = Path::new(binary).parent()?.strip_prefix("/").ok()?;
        for prefix in prefixes {
            for relative in [
                dir.join(&name),
                dir.join(".debug").join(&name),
                Path::new("usr/lib/debug").join(dir).join(&name),
            ] {
                let Some((candidate, data)) = map_in(prefix, &relative) else {
                    continue;
                };
                if crc32fast::hash(data.bytes()) != crc {
                    *self
                        .fallbacks
                        .entry(Fallback::DebugLinkCrcMismatch)
                        .or_insert(0) += 1;
                    continue;
                }
                match accept(&candidate, data) {
                    Some(found) => return Some(found),
                    None => *self.fallbacks.entry(Fallback::BadDebugFile).or_insert(0) += 1,
                }
            }
        }
        None
    }
}

/// A `.gnu_debuglink` name is a file name the binary's author wrote; it must not climb out of
/// the directories it is looked up in (`../../etc/shadow`).
pub(super) fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.contains(['/', '\0'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_links_are_plain_file_names() {
        assert!(is_plain_file_name("libc.so.6.debug"));
        for bad in ["", ".", "..", "../../etc/shadow", "a/b", "x\0y"] {
            assert!(!is_plain_file_name(bad), "{bad:?}");
        }
        assert!(!is_plain_file_name(&"x".repeat(256)));
    }
}
