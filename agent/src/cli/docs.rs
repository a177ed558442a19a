//! Man pages and shell completions, generated from the clap definition in `cli.rs`, so they
//! can never disagree with the options scorch accepts. `scorch completions SHELL` prints a
//! completion script; the hidden `scorch man DIR` writes the man pages, which
//! `cargo xtask package` puts into the .deb.

use std::{io, path::Path};

use clap::CommandFactory;
use clap_complete::Shell;

use crate::cli::Cli;

#[derive(Debug, thiserror::Error)]
pub enum CliDocsError {
    #[error("creating {dir}: {source}")]
    CreateDir { dir: String, source: io::Error },
    #[error("writing the man pages into {dir}: {source}")]
    WriteManPages { dir: String, source: io::Error },
}

/// Writes the completion script for `shell` to `out`.
pub fn write_completions(shell: Shell, out: &mut dyn io::Write) {
    clap_complete::generate(shell, &mut Cli::command(), "scorch", out);
}

/// Writes `scorch.1` and one page per subcommand (`scorch-record.1`, ...) into `dir`.
pub fn write_man_pages(dir: &Path) -> Result<(), CliDocsError> {
    let shown = dir.display().to_string();
    std::fs::create_dir_all(dir).map_err(|source| CliDocsError::CreateDir {
        dir: shown.clone(),
        source,
    })?;
    // Hidden commands (this one) stay out of the pages, as they stay out of --help.
    clap_mangen::generate_to(Cli::command(), dir)
        .map_err(|source| CliDocsError::WriteManPages { dir: shown, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_name_every_subcommand() {
        let mut script = Vec::new();
        write_completions(Shell::Bash, &mut script);
        let script = String::from_utf8(script).unwrap();
        for word in [
            "record",
            "run",
            "query",
            "check",
            "completions",
            "--frequency",
        ] {
            assert!(script.contains(word), "{word} missing");
        }
        assert!(!script.contains("scorch__man"), "hidden command completed");
    }

    #[test]
    fn man_pages_cover_the_subcommands() {
        let dir = tempfile::tempdir().unwrap();
        write_man_pages(dir.path()).unwrap();
        let main = std::fs::read_to_string(dir.path().join("scorch.1")).unwrap();
        assert!(main.contains(".TH scorch 1"), "{main}");
        let record = std::fs::read_to_string(dir.path().join("scorch-record.1")).unwrap();
        assert!(record.contains("frequency"), "{record}");
        assert!(!dir.path().join("scorch-man.1").exists());
    }
}
