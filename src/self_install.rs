//! `arbiter install --to DIR`: copies this binary into a directory. It is how the agent gets
//! into a pod whose image does not have it: an init container from the arbiter image copies
//! the static binary into a volume (an `emptyDir`) shared with the workload's container, which
//! then runs `DIR/arbiter run ... -- <its command>`.
//!
//! Hand-written rather than a crate: a copy, a mode and a rename, in that order so that no
//! reader of DIR ever finds a partial binary under the final name.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// `arbiter install` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct Settings {
    /// The directory to copy the binary into, as `DIR/arbiter` (it must exist: a mounted volume,
    /// such as an emptyDir shared with the container that runs `DIR/arbiter run`).
    #[arg(long, value_name = "DIR")]
    pub to: PathBuf,
}

/// Copies the running binary into `settings.to`; prints the path it wrote.
pub fn run(settings: Settings) -> anyhow::Result<i32> {
    let from = std::env::current_exe().context("finding the running binary")?;
    let written = install(&from, &settings.to)?;
    println!("{}", written.display());
    Ok(0)
}

/// Copies `from` to `dir/arbiter`, executable by all: under a temporary name first, synced,
/// then renamed over the final one.
pub fn install(from: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    anyhow::ensure!(
        dir.is_dir(),
        "--to {}: no such directory (mount a volume there, such as an emptyDir)",
        dir.display()
    );
    let dest = dir.join("arbiter");
    let partial = dir.join(".arbiter.partial");
    let copy = || -> std::io::Result<()> {
        std::fs::copy(from, &partial)?;
        std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))?;
        std::fs::File::open(&partial)?.sync_all()?;
        std::fs::rename(&partial, &dest)
    };
    copy().with_context(|| format!("copying {} to {}", from.display(), dest.display()))?;
    Ok(dest)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn the_binary_is_copied_whole_and_executable_under_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("source");
        std::fs::write(&from, b"\x7fELF and the rest").unwrap();
        std::fs::set_permissions(&from, std::fs::Permissions::from_mode(0o600)).unwrap();
        let to = dir.path().join("shared");
        std::fs::create_dir(&to).unwrap();
        // An older copy is replaced.
        std::fs::write(to.join("arbiter"), b"old").unwrap();

        let written = install(&from, &to).unwrap();
        assert_eq!(written, to.join("arbiter"));
        assert_eq!(std::fs::read(&written).unwrap(), b"\x7fELF and the rest");
        let mode = std::fs::metadata(&written).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        let names: Vec<_> = std::fs::read_dir(&to)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["arbiter"], "nothing left behind");
    }

    #[test]
    fn a_missing_directory_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("not-mounted");
        let e = install(&std::env::current_exe().unwrap(), &missing).unwrap_err();
        assert!(
            e.to_string().contains("not-mounted") && e.to_string().contains("no such directory"),
            "{e}"
        );
    }
}
