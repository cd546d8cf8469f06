//! `cohort keygen --out PATH [--force]`: a fresh Ed25519 identity file, readable only by its
//! owner, and its public key on standard output.

use crate::UsageError;
use clap::Args;
use cohort_channel::identity::Identity;
use cohort_crypto::CryptoProvider;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct KeygenArgs {
    /// Where to write the identity file (created with mode 0600).
    #[arg(long)]
    out: PathBuf,
    /// Replace the file if it exists (the old key is gone for good).
    #[arg(long)]
    force: bool,
}

pub fn run(args: &KeygenArgs) -> Result<(), UsageError> {
    let provider = CryptoProvider::default_provider();
    let identity = Identity::generate(&provider)
        .map_err(|e| UsageError(format!("cannot generate a key: {e}")))?;
    let text = identity.to_file_text();
    let shown = args.out.display();
    let written = if args.force {
        replace(&args.out, text.as_bytes())
    } else {
        create_new(&args.out, text.as_bytes())
    };
    written.map_err(|e| match e.kind() {
        io::ErrorKind::AlreadyExists if !args.force => UsageError(format!(
            "{shown} already exists (use --force to replace it)"
        )),
        _ => UsageError(format!("cannot write {shown}: {e}")),
    })?;
    println!("{}", identity.public());
    Ok(())
}

/// Opens `path` for writing only if it does not exist yet (a dangling symlink counts as
/// existing), with owner-only permissions from the moment it exists.
fn open_private_new(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
}

fn write_and_sync(mut file: File, bytes: &[u8]) -> io::Result<()> {
    file.write_all(bytes)?;
    file.sync_all()
}

/// Writes `bytes` to a new file at `path` (mode 0600); fails with `AlreadyExists` if there is
/// one. A failed write removes the partial file. (`cohort kdc add-principal` writes key
/// files with it too.)
pub(crate) fn create_new(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let file = open_private_new(path)?;
    write_and_sync(file, bytes).inspect_err(|_| {
        let _ = std::fs::remove_file(path);
    })
}

/// Writes `bytes` to a fresh private file beside `path` and renames it over `path`. Opening
/// the existing file instead would keep its permissions (the mode applies only when a file is
/// created), and a crash midway would leave neither the old key nor the new one.
pub(crate) fn replace(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other("--out must name a file"))?;
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(".{}.tmp", std::process::id()));
    let temp = path.with_file_name(temp_name);
    create_new(&temp, bytes)?;
    std::fs::rename(&temp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&temp);
    })
}
