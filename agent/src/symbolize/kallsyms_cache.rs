//! This boot's kernel text symbols, kept in a file so that the next `record` names its kernel
//! frames without the kernel formatting `/proc/kallsyms` again: its 120,000 lines cost the
//! reader about 20 ms of system time here, a tenth of a 999 Hz recording's CPU. `perf` keeps a
//! copy in its build-id cache for the same reason.
//!
//! The file (`kallsyms` in `$RUNTIME_DIRECTORY`, else `/run/scorch`: a tmpfs, emptied at
//! boot) is trusted only when:
//! - it is this user's regular file, reached without a symlink, that no other user can write,
//!   in a directory that is this user's and no other's;
//! - its header names this boot (`/proc/sys/kernel/random/boot_id`: KASLR moves the kernel at
//!   every boot) and exactly the modules loaded now, with their sizes and addresses
//!   (`/proc/modules`).
//!
//! It holds the core kernel's symbols and those of the listed modules only: BPF programs and
//! ftrace trampolines come and go with every run. A table read from it is partial
//! ([`KernelSymbols::lookup`]): it names an address only between two symbols of one module,
//! or of the core kernel, and any other address makes the symbolizer read `/proc/kallsyms`.
//! Any failure here (no such directory, a stale or foreign file) is a debug line, and the
//! kernel's own file is read as before.

use std::{
    io::{self, BufRead, BufReader, Read, Write},
    path::{Path, PathBuf},
};

use super::kernel::KernelSymbols;
use crate::sys::fs::{create_private, ensure_private_dir, open_private, unit_directory};

/// The header's first line; a change of layout changes it.
const MAGIC: &str = "scorch-kallsyms 1";

/// The largest file accepted: the kernel's table is about 5 MB.
const MAX_BYTES: u64 = 64 << 20;

/// The boot and the modules a table was read under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelIdentity {
    boot: String,
    /// `name size address` of each loaded module, in `/proc/modules`' order.
    modules: Vec<String>,
}

impl KernelIdentity {
    /// This boot's identity; `None` when `/proc` does not say (then nothing is cached).
    pub fn current() -> Option<Self> {
        let boot = crate::sys::boot_id()?;
        // A kernel without modules has no /proc/modules: its table is the core alone.
        let modules = std::fs::read_to_string("/proc/modules").unwrap_or_default();
        Some(Self::parse(&boot, &modules))
    }

    fn parse(boot: &str, modules: &str) -> Self {
        KernelIdentity {
            boot: boot.trim().to_owned(),
            modules: modules
                .lines()
                .filter_map(|line| {
                    // name size refcount dependencies state address [taints]
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    Some(format!(
                        "{} {} {}",
                        fields.first()?,
                        fields.get(1)?,
                        fields.get(5)?
                    ))
                })
                .collect(),
        }
    }

    /// Whether the copy keeps `module`'s symbols: only modules `/proc/modules` lists.
    pub fn lists_module(&self, module: &str) -> bool {
        self.modules
            .iter()
            .any(|line| line.split(' ').next() == Some(module))
    }
}

/// Where the copy lives.
fn cache_dir() -> PathBuf {
    unit_directory("RUNTIME_DIRECTORY", "/run/scorch")
}

/// The table kept for `identity`, when there is one to trust.
pub fn load(identity: &KernelIdentity) -> Option<KernelSymbols> {
    let path = cache_dir().join("kallsyms");
    match read(&path, identity) {
        Ok(table) => {
            tracing::debug!(
                symbols = table.len(),
                "kernel symbols from {}",
                path.display()
            );
            Some(table)
        }
        Err(error) => {
            tracing::debug!("not using {}: {error}", path.display());
            None
        }
    }
}

/// Keeps `table`, read from `/proc/kallsyms` under `identity`, for the next reader.
pub fn store(table: &KernelSymbols, identity: &KernelIdentity) {
    let dir = cache_dir();
    if let Err(error) = write(&dir, table, identity) {
        tracing::debug!(
            "not keeping the kernel symbols in {}: {error}",
            dir.display()
        );
    }
}

fn read(path: &Path, identity: &KernelIdentity) -> io::Result<KernelSymbols> {
    let file = open_private(path)?;
    let mut input = BufReader::new(file.take(MAX_BYTES));
    let mut line = String::new();
    let mut header = |line: &mut String| -> io::Result<String> {
        line.clear();
        input.read_line(line)?;
        Ok(line.trim_end_matches('\n').to_owned())
    };
    if header(&mut line)? != MAGIC {
        return Err(invalid("another layout"));
    }
    if header(&mut line)?.strip_prefix("boot ") != Some(identity.boot.as_str()) {
        return Err(invalid("another boot"));
    }
    let mut modules = Vec::new();
    loop {
        let next = header(&mut line)?;
        if next == "symbols" {
            break;
        }
        let module = next
            .strip_prefix("module ")
            .ok_or_else(|| invalid("a malformed header"))?;
        modules.push(module.to_owned());
        if modules.len() > identity.modules.len() {
            break;
        }
    }
    if modules != identity.modules {
        return Err(invalid("other modules loaded"));
    }
    let table = KernelSymbols::parse(input, path).map_err(io::Error::other)?;
    if table.addresses_hidden() {
        return Err(invalid("no addresses"));
    }
    Ok(table.partial())
}

fn write(dir: &Path, table: &KernelSymbols, identity: &KernelIdentity) -> io::Result<()> {
    ensure_private_dir(dir)?;
    let path = dir.join("kallsyms");
    let temporary = dir.join(format!(".kallsyms.tmp-{}", std::process::id()));
    let file = create_private(&temporary)?;
    let result = (|| {
        let mut out = io::BufWriter::new(file);
        writeln!(out, "{MAGIC}")?;
        writeln!(out, "boot {}", identity.boot)?;
        for module in &identity.modules {
            writeln!(out, "module {module}")?;
        }
        writeln!(out, "symbols")?;
        table.write_kallsyms(&mut out, |module| identity.lists_module(module))?;
        out.into_inner().map_err(|e| e.into_error())?;
        std::fs::rename(&temporary, &path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result
}

fn invalid(reason: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, reason)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbolize::kernel::KernelFrame;

    const FIXTURE: &str = include_str!("../../../tests/fixtures/kallsyms");

    fn identity(boot: &str) -> KernelIdentity {
        KernelIdentity::parse(
            boot,
            "ext4 1036288 2 - Live 0xffffffffc0a00000\n\
             nf_tables 360448 0 - Live 0xffffffffc0b00000 (E)\n",
        )
    }

    /// The fixture's table, kept in a private directory under boot `boot-a`.
    fn kept_fixture() -> (tempfile::TempDir, KernelSymbols, KernelIdentity, PathBuf) {
        let table = KernelSymbols::parse(FIXTURE.as_bytes(), Path::new("fixture")).unwrap();
        let dir = crate::sys::fs::private_tempdir();
        let id = identity("boot-a");
        write(dir.path(), &table, &id).unwrap();
        let path = dir.path().join("kallsyms");
        assert!(path.is_file());
        (dir, table, id, path)
    }

    #[test]
    fn a_kept_table_names_what_the_kernel_table_named_between_symbols_of_one_owner() {
        let (_dir, table, id, path) = kept_fixture();
        let kept = read(&path, &id).unwrap();
        // vfs_read is followed by another core symbol: named alike.
        let inside = 0xffffffff81234567 + 0x10;
        assert_eq!(kept.lookup(inside), table.lookup(inside));
        assert!(matches!(
            kept.lookup(inside),
            KernelFrame::Symbol {
                name: "vfs_read",
                ..
            }
        ));
        // Past the last symbol of its owner, the full table still answers (within its
        // span), the kept one does not: it may be code the copy does not hold.
        let last = kept.last_address();
        assert!(matches!(
            table.lookup(last + 0x20),
            KernelFrame::Symbol { .. }
        ));
        assert_eq!(kept.lookup(last + 0x20), KernelFrame::Miss);
    }

    #[test]
    fn another_boot_or_other_modules_are_not_trusted() {
        let (_dir, _, _, path) = kept_fixture();
        let error = read(&path, &identity("boot-b")).unwrap_err();
        assert!(error.to_string().contains("another boot"), "{error}");
        let fewer = KernelIdentity::parse("boot-a", "ext4 1036288 2 - Live 0xffffffffc0a00000\n");
        let error = read(&path, &fewer).unwrap_err();
        assert!(error.to_string().contains("other modules"), "{error}");
        // The same module moved (unloaded and loaded again).
        let moved = KernelIdentity::parse(
            "boot-a",
            "ext4 1036288 2 - Live 0xffffffffc0c00000\n\
             nf_tables 360448 0 - Live 0xffffffffc0b00000 (E)\n",
        );
        let error = read(&path, &moved).unwrap_err();
        assert!(error.to_string().contains("other modules"), "{error}");
    }

    #[test]
    fn a_file_others_can_write_or_a_symlink_is_not_trusted() {
        let (_dir, table, id, path) = kept_fixture();
        // A link to a copy that is trusted where it stands is not followed.
        let other = crate::sys::fs::private_tempdir();
        std::os::unix::fs::symlink(&path, other.path().join("kallsyms")).unwrap();
        assert!(read(&path, &id).is_ok());
        assert!(read(&other.path().join("kallsyms"), &id).is_err());

        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o622))
            .unwrap();
        let error = read(&path, &id).unwrap_err();
        assert!(error.to_string().contains("writable"), "{error}");

        let open = crate::sys::fs::private_tempdir();
        std::fs::set_permissions(
            open.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        assert!(write(open.path(), &table, &id).is_err());
    }

    #[test]
    fn only_listed_modules_are_kept() {
        let id = identity("boot-a");
        assert!(id.lists_module("ext4"));
        assert!(id.lists_module("nf_tables"));
        assert!(!id.lists_module("bpf"));
        assert!(!id.lists_module("__builtin__ftrace"));
    }
}
