//! The KDC's database: every registered principal's name and long-term key.
//!
//! On disk it is a text file, written with mode 0600 through a temporary file and a rename
//! (a crash leaves the old database or the new one, never half of one):
//!
//! ```text
//! cohort-kdc-db v1
//! # name key: the KDC's database; keep it secret (mode 0600)
//! alice 5f0e...(64 hex digits)
//! leader 9a41...(64 hex digits)
//! ```
//!
//! One principal per line, name and key separated by whitespace, sorted by name when
//! written; blank lines and `#` comments are ignored when read.
//!
//! LSGC: "This secret key is generated and registered with the KDC before the party
//! attempts to join any session. We assume an out of band method for establishing key
//! registration." Here that method is `cohort kdc add-principal`, which adds to this file
//! and writes the principal's key file.

use crate::principal::{
    content_lines, expect_header, FileError, FileProblem, PrincipalKey, PrincipalName,
};
use std::collections::BTreeMap;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use zeroize::Zeroizing;

/// Registered principals and their keys, by name.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Registry {
    principals: BTreeMap<PrincipalName, PrincipalKey>,
}

impl Registry {
    /// The first line of every database file.
    pub const HEADER: &'static str = "cohort-kdc-db v1";

    /// An empty registry.
    pub fn new() -> Self {
        Registry::default()
    }

    /// Registers `name` with `key`; returns the key it had before, if any.
    pub fn insert(&mut self, name: PrincipalName, key: PrincipalKey) -> Option<PrincipalKey> {
        self.principals.insert(name, key)
    }

    /// Removes `name`; returns its key, if it was registered.
    pub fn remove(&mut self, name: &PrincipalName) -> Option<PrincipalKey> {
        self.principals.remove(name)
    }

    /// The key registered for `name`.
    pub fn get(&self, name: &PrincipalName) -> Option<&PrincipalKey> {
        self.principals.get(name)
    }

    /// Whether `name` is registered.
    pub fn contains(&self, name: &PrincipalName) -> bool {
        self.principals.contains_key(name)
    }

    /// How many principals are registered.
    pub fn len(&self) -> usize {
        self.principals.len()
    }

    /// Whether no principal is registered.
    pub fn is_empty(&self) -> bool {
        self.principals.is_empty()
    }

    /// The registered names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &PrincipalName> {
        self.principals.keys()
    }

    /// Parses a database file's text.
    pub fn parse(text: &str) -> Result<Registry, FileError> {
        let mut lines = content_lines(text);
        expect_header(&mut lines, Self::HEADER)?;
        let mut registry = Registry::new();
        for (line, content) in lines {
            let at = |problem| FileError { line, problem };
            let mut fields = content.split_whitespace();
            let (Some(name), Some(key), None) = (fields.next(), fields.next(), fields.next())
            else {
                return Err(at(FileProblem::Syntax("expected `name key`")));
            };
            let name = PrincipalName::new(name).map_err(|e| at(FileProblem::Name(e)))?;
            let key = PrincipalKey::from_hex(key).map_err(|_| at(FileProblem::Key))?;
            if registry.insert(name, key).is_some() {
                return Err(at(FileProblem::DuplicatePrincipal(name)));
            }
        }
        Ok(registry)
    }

    /// The database file's text, in a string wiped on drop.
    pub fn to_text(&self) -> Zeroizing<String> {
        let mut out = Zeroizing::new(String::with_capacity(64 + 100 * self.len()));
        out.push_str(Self::HEADER);
        out.push_str("\n# name key: the KDC's database; keep it secret (mode 0600)\n");
        for (name, key) in &self.principals {
            out.push_str(name.as_str());
            out.push(' ');
            out.push_str(&key.to_hex());
            out.push('\n');
        }
        out
    }

    /// Reads the database at `path`.
    pub fn load(path: &Path) -> Result<Registry, RegistryError> {
        let text = Zeroizing::new(std::fs::read_to_string(path).map_err(RegistryError::Io)?);
        Registry::parse(&text).map_err(RegistryError::Format)
    }

    /// Writes the database to `path` (mode 0600), atomically: into a new temporary file
    /// beside it, synced, then renamed over `path`.
    pub fn save(&self, path: &Path) -> io::Result<()> {
        write_private_atomically(path, self.to_text().as_bytes())
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("principals", &self.principals.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// A database that could not be read.
#[derive(Debug)]
#[non_exhaustive]
pub enum RegistryError {
    /// Reading the file failed.
    Io(io::Error),
    /// The file is not a valid database.
    Format(FileError),
}

impl fmt::Display for RegistryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegistryError::Io(e) => write!(f, "cannot read: {e}"),
            RegistryError::Format(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for RegistryError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RegistryError::Io(e) => Some(e),
            RegistryError::Format(e) => Some(e),
        }
    }
}

/// Creates `path` for writing only if nothing is there (a dangling symlink counts), with
/// owner-only permissions from the moment it exists.
fn create_private(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
}

/// Writes `bytes` to `.NAME.PID.tmp` beside `path` (mode 0600), syncs it, renames it over
/// `path` and syncs the directory. Replacing in place would keep an old file's permissions
/// and could leave half a database after a crash.
fn write_private_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other("the database path must name a file"))?;
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(".{}.tmp", std::process::id()));
    let temp = path.with_file_name(temp_name);
    let file = match create_private(&temp) {
        // Left over from a crashed run with the same process id: ours to replace.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(&temp)?;
            create_private(&temp)?
        }
        other => other?,
    };
    let written = (|| {
        let mut file = file;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
        return written;
    }
    // Make the rename itself durable; not every platform can open a directory.
    if let Some(dir) = path.parent() {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> PrincipalName {
        PrincipalName::new(s).unwrap()
    }

    fn sample() -> Registry {
        let mut r = Registry::new();
        r.insert(name("leader"), PrincipalKey::from_bytes([1; 32]));
        r.insert(name("alice"), PrincipalKey::from_bytes([2; 32]));
        r
    }

    #[test]
    fn text_round_trips_sorted_and_debug_hides_keys() {
        let r = sample();
        let text = r.to_text();
        assert!(text.starts_with("cohort-kdc-db v1\n"));
        let alice = text.find("alice ").unwrap();
        assert!(alice < text.find("leader ").unwrap());
        assert_eq!(Registry::parse(&text).unwrap(), r);
        let debug = format!("{r:?}");
        assert!(
            debug.contains("alice") && !debug.contains("0202"),
            "{debug}"
        );
        assert_eq!(
            Registry::parse("cohort-kdc-db v1\n").unwrap(),
            Registry::new()
        );
    }

    #[test]
    fn bad_databases_name_the_line() {
        let key = "01".repeat(32);
        let cases = [
            (
                "cohort-kdc-db v1\nalice\n".to_string(),
                2,
                "expected `name key`",
            ),
            (
                format!("cohort-kdc-db v1\nalice {key} extra\n"),
                2,
                "expected `name key`",
            ),
            (format!("cohort-kdc-db v1\n\nal/ice {key}\n"), 3, "name:"),
            (
                format!("cohort-kdc-db v1\nalice {}\n", &key[2..]),
                2,
                "key:",
            ),
            (
                format!("cohort-kdc-db v1\nalice {key}\nalice {key}\n"),
                3,
                "listed twice",
            ),
            ("cohort-kdc-key v1\n".to_string(), 1, "first line must be"),
            ("cohort-kdc-db v7\n".to_string(), 1, "version"),
        ];
        for (text, line, says) in cases {
            let e = Registry::parse(&text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.to_string().contains(says), "{e}");
            assert!(!e.to_string().contains(&key[4..20]), "{e}");
        }
    }

    #[test]
    fn save_is_private_and_atomic() {
        let dir = std::env::temp_dir().join(format!("cohort-kdc-registry-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kdc.db");
        // An old, world-readable database is replaced by a private one.
        std::fs::write(&path, "old").unwrap();
        let r = sample();
        r.save(&path).unwrap();
        assert_eq!(Registry::load(&path).unwrap(), r);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("kdc.db")]);
        assert!(matches!(
            Registry::load(&dir.join("missing.db")),
            Err(RegistryError::Io(_))
        ));
        std::fs::write(&path, "junk").unwrap();
        assert!(matches!(
            Registry::load(&path),
            Err(RegistryError::Format(_))
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
