//! An initramfs in the kernel's cpio "newc" format, written in memory (no cpio tool needed,
//! and the archive's contents are exactly the files named, owned by root).

use std::collections::BTreeSet;

#[derive(Clone, Default)]
pub struct Archive {
    data: Vec<u8>,
    directories: BTreeSet<String>,
    inode: u32,
}

impl Archive {
    /// Adds a directory, and its parents first.
    pub fn directory(&mut self, path: &str) {
        let mut prefix = String::new();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            if self.directories.insert(prefix.clone()) {
                let name = prefix.clone();
                self.entry(&name, 0o040755, &[]);
            }
        }
    }

    /// Adds a regular file, creating its directories.
    pub fn file(&mut self, path: &str, contents: &[u8], mode: u32) {
        if let Some((parent, _)) = path.rsplit_once('/') {
            self.directory(parent);
        }
        self.entry(path, 0o100000 | mode, contents);
    }

    /// The archive with its trailer.
    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        self.data
    }

    fn entry(&mut self, name: &str, mode: u32, contents: &[u8]) {
        self.inode += 1;
        let nlink = if mode & 0o040000 != 0 { 2 } else { 1 };
        let fields = [
            self.inode,
            mode,
            0, // uid
            0, // gid
            nlink,
            0, // mtime
            contents.len() as u32,
            0, // dev major
            0, // dev minor
            0, // rdev major
            0, // rdev minor
            name.len() as u32 + 1,
            0, // check
        ];
        self.data.extend_from_slice(b"070701");
        for field in fields {
            self.data
                .extend_from_slice(format!("{field:08x}").as_bytes());
        }
        self.data.extend_from_slice(name.as_bytes());
        self.data.push(0);
        self.pad();
        self.data.extend_from_slice(contents);
        self.pad();
    }

    /// Header+name and data each end on a 4-byte boundary.
    fn pad(&mut self) {
        while !self.data.len().is_multiple_of(4) {
            self.data.push(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpio_reads_back_with_the_cpio_layout() {
        let mut archive = Archive::default();
        archive.file("a/b/c", b"hello", 0o644);
        let data = archive.finish();
        // a, a/b, a/b/c, trailer: four headers, each 4-aligned.
        assert_eq!(data.windows(6).filter(|w| w == b"070701").count(), 4);
        assert_eq!(data.len() % 4, 0);
        let text = String::from_utf8_lossy(&data);
        assert!(text.contains("a/b/c\0"));
        assert!(text.contains("hello"));
        assert!(text.contains("TRAILER!!!"));
        // The file's header: mode 100644, size 5, name length 6 ("a/b/c" and NUL).
        let at = text.find("a/b/c\0").unwrap() - 110;
        let header = &text[at..at + 110];
        assert_eq!(&header[14..22], "000081a4");
        assert_eq!(&header[54..62], "00000005");
        assert_eq!(&header[94..102], "00000006");
    }
}
