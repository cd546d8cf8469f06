//! Principals: their names, their long-term keys `K_A`, and the key file a principal keeps.
//!
//! LSGC: "Each potential member, A, of a group (including the session leader) has a shared
//! secret K_A registered with a trusted third party called the key distribution center."
//!
//! **Names.** LSGC's identities are "a unique 16 byte null terminated ASCII string of
//! alphanumeric characters" (15 usable characters). cohort allows 1 to 31 bytes of
//! `A-Z a-z 0-9 . _ -`: length-prefixed on the wire instead of NUL-terminated, long enough
//! for host-style names (`alice.lab-2`), short enough that a name is a small `Copy` value
//! ([`PrincipalName`]) and its length fits one byte with room to spare. The character set
//! keeps names safe in file names (`NAME.key`), log lines and the whitespace-separated
//! database without quoting.
//!
//! **Keys.** A [`PrincipalKey`] is 32 random bytes (LSGC used 8-byte DES keys), zeroized on
//! drop, redacted in `Debug` and compared in constant time.
//!
//! **Key files.** A principal keeps its name and key in a small text file ([`KeyFile`]):
//!
//! ```text
//! cohort-kdc-key v1
//! name = alice
//! key = 5f0e...(64 hex digits)
//! ```
//!
//! Blank lines and lines starting with `#` are ignored; fields may come in any order; any
//! other line is an error that names its line (and never echoes a value, which could be a
//! key).

use cohort_crypto::ct_eq;
use rand_core::{CryptoRng, RngCore};
use std::fmt;
use std::str::FromStr;
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

/// Longest principal name, in bytes.
pub const MAX_NAME_LEN: usize = 31;
/// Length of a long-term key `K_A`, in bytes.
pub const KEY_LEN: usize = 32;

/// A principal's name: 1 to [`MAX_NAME_LEN`] bytes of `A-Z a-z 0-9 . _ -`.
///
/// Stored inline (no allocation), so parsing a request builds names without touching the
/// heap. Ordered and compared by its bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PrincipalName {
    len: u8,
    /// The name, then zeros (so the derived equality and hash are by value).
    bytes: [u8; MAX_NAME_LEN],
}

impl PrincipalName {
    /// Checks and copies `name`.
    pub fn new(name: &str) -> Result<Self, NameError> {
        Self::from_bytes(name.as_bytes())
    }

    /// Checks and copies `bytes` (as found on the wire).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, NameError> {
        if bytes.is_empty() {
            return Err(NameError::Empty);
        }
        if bytes.len() > MAX_NAME_LEN {
            return Err(NameError::TooLong(bytes.len()));
        }
        if let Some(position) = bytes.iter().position(|&b| !is_name_byte(b)) {
            return Err(NameError::BadCharacter { position });
        }
        let mut out = [0u8; MAX_NAME_LEN];
        out[..bytes.len()].copy_from_slice(bytes);
        Ok(PrincipalName {
            // At most 31: checked above.
            len: bytes.len() as u8,
            bytes: out,
        })
    }

    /// The name's bytes (ASCII).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        // Every byte is ASCII (checked on construction), so this never fails.
        std::str::from_utf8(self.as_bytes()).unwrap_or("")
    }

    /// The length prefix the name has on the wire (1 to 31).
    pub fn wire_len(&self) -> u8 {
        self.len
    }
}

/// Whether `b` may appear in a principal name.
fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

impl PartialOrd for PrincipalName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for PrincipalName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl FromStr for PrincipalName {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, NameError> {
        PrincipalName::new(s)
    }
}

impl fmt::Display for PrincipalName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for PrincipalName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PrincipalName({:?})", self.as_str())
    }
}

/// Why a string is not a principal name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NameError {
    /// The name is empty.
    Empty,
    /// The name has this many bytes, more than [`MAX_NAME_LEN`].
    TooLong(usize),
    /// The byte at this position is not one of `A-Z a-z 0-9 . _ -`.
    BadCharacter {
        /// Zero-based byte offset.
        position: usize,
    },
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NameError::Empty => f.write_str("a principal name must not be empty"),
            NameError::TooLong(n) => write!(
                f,
                "a principal name has at most {MAX_NAME_LEN} bytes (this one has {n})"
            ),
            NameError::BadCharacter { position } => write!(
                f,
                "byte {position} of the principal name is not one of A-Z a-z 0-9 . _ -"
            ),
        }
    }
}

impl std::error::Error for NameError {}

/// A principal's long-term key `K_A`: 32 bytes, known to the principal and the KDC only.
///
/// Zeroized on drop, redacted in `Debug`, compared in constant time.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct PrincipalKey([u8; KEY_LEN]);

impl PrincipalKey {
    /// A fresh key from `rng` (the operating system's generator in the CLI).
    pub fn generate<R: RngCore + CryptoRng + ?Sized>(rng: &mut R) -> Self {
        let mut key = PrincipalKey([0; KEY_LEN]);
        rng.fill_bytes(&mut key.0);
        key
    }

    /// A key from its bytes. The caller's copy is not wiped; prefer [`PrincipalKey::generate`]
    /// or [`PrincipalKey::from_hex`].
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        PrincipalKey(bytes)
    }

    /// Parses exactly 64 hex digits (either case).
    pub fn from_hex(text: &str) -> Result<Self, KeyError> {
        let digits = text.as_bytes();
        if digits.len() != 2 * KEY_LEN {
            return Err(KeyError);
        }
        let mut key = PrincipalKey([0; KEY_LEN]);
        for (out, pair) in key.0.iter_mut().zip(digits.chunks_exact(2)) {
            let (Some(hi), Some(lo)) = (hex_value(pair[0]), hex_value(pair[1])) else {
                return Err(KeyError);
            };
            *out = hi << 4 | lo;
        }
        Ok(key)
    }

    /// The key as 64 lowercase hex digits, in a string wiped on drop.
    pub fn to_hex(&self) -> Zeroizing<String> {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = Zeroizing::new(String::with_capacity(2 * KEY_LEN));
        for b in self.0 {
            out.push(char::from(DIGITS[usize::from(b >> 4)]));
            out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
        }
        out
    }

    /// The key's bytes. Keep the borrow short.
    pub fn expose(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
}

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

impl fmt::Debug for PrincipalKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PrincipalKey(redacted)")
    }
}

impl PartialEq for PrincipalKey {
    fn eq(&self, other: &Self) -> bool {
        ct_eq(&self.0, &other.0)
    }
}

impl Eq for PrincipalKey {}

/// A key's text is not 64 hex digits. Carries no detail, so that an error message never
/// echoes any part of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyError;

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a key must be exactly {} hex digits", 2 * KEY_LEN)
    }
}

impl std::error::Error for KeyError {}

/// What a principal keeps: its name and its long-term key (the file `NAME.key` that
/// `cohort kdc add-principal` writes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyFile {
    /// Whose key this is.
    pub name: PrincipalName,
    /// The key registered with the KDC under `name`.
    pub key: PrincipalKey,
}

impl KeyFile {
    /// The first line of every key file.
    pub const HEADER: &'static str = "cohort-kdc-key v1";

    /// The file's text, in a string wiped on drop.
    pub fn to_text(&self) -> Zeroizing<String> {
        let hex = self.key.to_hex();
        let mut out = Zeroizing::new(String::with_capacity(160));
        out.push_str(Self::HEADER);
        out.push_str("\n# a cohort KDC principal's long-term key: keep it secret (mode 0600)\n");
        out.push_str("name = ");
        out.push_str(self.name.as_str());
        out.push_str("\nkey = ");
        out.push_str(&hex);
        out.push('\n');
        out
    }

    /// Parses a key file's text.
    pub fn parse(text: &str) -> Result<KeyFile, FileError> {
        let mut lines = content_lines(text);
        expect_header(&mut lines, Self::HEADER)?;
        let mut name = None;
        let mut key = None;
        for (line, content) in lines {
            let at = |problem| FileError { line, problem };
            let (field, value) = content
                .split_once('=')
                .map(|(f, v)| (f.trim(), v.trim()))
                .ok_or_else(|| at(FileProblem::Syntax("expected `field = value`")))?;
            match field {
                "name" if name.is_some() => return Err(at(FileProblem::DuplicateField("name"))),
                "name" => {
                    name = Some(PrincipalName::new(value).map_err(|e| at(FileProblem::Name(e)))?)
                }
                "key" if key.is_some() => return Err(at(FileProblem::DuplicateField("key"))),
                "key" => {
                    key = Some(PrincipalKey::from_hex(value).map_err(|_| at(FileProblem::Key))?)
                }
                other => return Err(at(FileProblem::UnknownField(shorten(other)))),
            }
        }
        let missing = |field| FileError {
            line: 0,
            problem: FileProblem::MissingField(field),
        };
        Ok(KeyFile {
            name: name.ok_or_else(|| missing("name"))?,
            key: key.ok_or_else(|| missing("key"))?,
        })
    }
}

/// The lines of `text` that carry content, numbered from 1, trimmed; blank lines and
/// `#` comments left out.
pub(crate) fn content_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
}

/// Takes the first content line and checks that it is `header`.
pub(crate) fn expect_header<'a>(
    lines: &mut impl Iterator<Item = (usize, &'a str)>,
    header: &'static str,
) -> Result<(), FileError> {
    match lines.next() {
        Some((_, first)) if first == header => Ok(()),
        Some((line, first)) => Err(FileError {
            line,
            problem: if first.starts_with(header.split(' ').next().unwrap_or(header)) {
                FileProblem::Version { expected: header }
            } else {
                FileProblem::Header { expected: header }
            },
        }),
        None => Err(FileError {
            line: 0,
            problem: FileProblem::Header { expected: header },
        }),
    }
}

/// A field name for an error message: what the file said, cut short.
fn shorten(field: &str) -> String {
    field.chars().take(32).collect()
}

/// A key file or KDC database that does not parse: the line at fault and what is wrong.
/// Never echoes a value from the file (it could be a key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileError {
    /// One-based line number; 0 for the file as a whole (a missing field, an empty file).
    pub line: usize,
    /// What is wrong.
    pub problem: FileProblem,
}

/// What is wrong with a key file or database (see [`FileError`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileProblem {
    /// The first line is not this header (or the file is empty).
    Header {
        /// The header the file should start with.
        expected: &'static str,
    },
    /// The first line names another version of the format.
    Version {
        /// The header this version reads.
        expected: &'static str,
    },
    /// A line that is not in the format (the text says what was expected).
    Syntax(&'static str),
    /// A field this format does not have (its name, cut to 32 characters).
    UnknownField(String),
    /// A field given twice.
    DuplicateField(&'static str),
    /// A required field is missing.
    MissingField(&'static str),
    /// The name is not a principal name.
    Name(NameError),
    /// The key is not 64 hex digits.
    Key,
    /// A database lists this principal twice.
    DuplicatePrincipal(PrincipalName),
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line > 0 {
            write!(f, "line {}: ", self.line)?;
        }
        match &self.problem {
            FileProblem::Header { expected } => {
                write!(
                    f,
                    "not the right kind of file: the first line must be `{expected}`"
                )
            }
            FileProblem::Version { expected } => write!(
                f,
                "a version of the format this program does not read (it reads `{expected}`)"
            ),
            FileProblem::Syntax(what) => f.write_str(what),
            FileProblem::UnknownField(name) => write!(f, "unknown field `{name}`"),
            FileProblem::DuplicateField(name) => write!(f, "`{name}` given twice"),
            FileProblem::MissingField(name) => write!(f, "`{name}` is missing"),
            FileProblem::Name(e) => write!(f, "name: {e}"),
            FileProblem::Key => write!(f, "key: {KeyError}"),
            FileProblem::DuplicatePrincipal(name) => write!(f, "principal {name} listed twice"),
        }
    }
}

impl std::error::Error for FileError {}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::rand_core::SeedableRng;

    #[test]
    fn names_follow_the_rules() {
        for good in ["a", "alice", "Node-7.lab_2", &"x".repeat(MAX_NAME_LEN)] {
            let name = PrincipalName::new(good).unwrap();
            assert_eq!(name.as_str(), good);
            assert_eq!(usize::from(name.wire_len()), good.len());
        }
        assert_eq!(PrincipalName::new(""), Err(NameError::Empty));
        assert_eq!(
            PrincipalName::new(&"x".repeat(32)),
            Err(NameError::TooLong(32))
        );
        for (bad, position) in [("a b", 1), ("a/b", 1), ("é", 0), ("ab\0", 2), ("x:y", 1)] {
            assert_eq!(
                PrincipalName::new(bad),
                Err(NameError::BadCharacter { position }),
                "{bad:?}"
            );
        }
        assert!(PrincipalName::new("a").unwrap() < PrincipalName::new("aa").unwrap());
        assert!(PrincipalName::new("b").unwrap() > PrincipalName::new("aa").unwrap());
        assert_eq!(
            format!("{:?}", PrincipalName::new("bob").unwrap()),
            "PrincipalName(\"bob\")"
        );
    }

    #[test]
    fn keys_round_trip_through_hex_and_are_redacted() {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(1);
        let key = PrincipalKey::generate(&mut rng);
        assert_eq!(PrincipalKey::from_hex(&key.to_hex()).unwrap(), key);
        assert_eq!(
            PrincipalKey::from_hex(&key.to_hex().to_uppercase()).unwrap(),
            key
        );
        assert_ne!(PrincipalKey::generate(&mut rng), key);
        assert_eq!(format!("{key:?}"), "PrincipalKey(redacted)");
        assert_eq!(PrincipalKey::from_hex(&"0".repeat(63)), Err(KeyError));
        assert_eq!(PrincipalKey::from_hex(&"g".repeat(64)), Err(KeyError));
        assert_eq!(PrincipalKey::from_hex(&"é".repeat(32)), Err(KeyError));
    }

    #[test]
    fn key_files_round_trip() {
        let file = KeyFile {
            name: PrincipalName::new("alice").unwrap(),
            key: PrincipalKey::from_bytes([7; KEY_LEN]),
        };
        let text = file.to_text();
        assert!(text.starts_with("cohort-kdc-key v1\n"));
        assert!(text.contains("name = alice\n"));
        assert_eq!(KeyFile::parse(&text).unwrap(), file);
        // Order, comments, blank lines and CRLF do not matter.
        let other = format!(
            "\r\n# c\r\n{}\r\n\r\nkey = {}\r\nname=alice\r\n",
            KeyFile::HEADER,
            "07".repeat(32)
        );
        assert_eq!(KeyFile::parse(&other).unwrap(), file);
    }

    #[test]
    fn key_file_errors_name_the_line_and_never_the_key() {
        let key = "ab".repeat(32);
        let cases: Vec<(String, FileError)> = vec![
            (
                String::new(),
                FileError {
                    line: 0,
                    problem: FileProblem::Header {
                        expected: KeyFile::HEADER,
                    },
                },
            ),
            (
                "cohort-kdc-key v2\n".into(),
                FileError {
                    line: 1,
                    problem: FileProblem::Version {
                        expected: KeyFile::HEADER,
                    },
                },
            ),
            (
                format!(
                    "{}\nname = alice\nkey = {}\nkey = {key}\n",
                    KeyFile::HEADER,
                    key
                ),
                FileError {
                    line: 4,
                    problem: FileProblem::DuplicateField("key"),
                },
            ),
            (
                format!("{}\nname = al ice\n", KeyFile::HEADER),
                FileError {
                    line: 2,
                    problem: FileProblem::Name(NameError::BadCharacter { position: 2 }),
                },
            ),
            (
                format!("{}\nname = alice\nkey = {}\n", KeyFile::HEADER, &key[1..]),
                FileError {
                    line: 3,
                    problem: FileProblem::Key,
                },
            ),
            (
                format!("{}\nname = alice\n", KeyFile::HEADER),
                FileError {
                    line: 0,
                    problem: FileProblem::MissingField("key"),
                },
            ),
            (
                format!("{}\nname = alice\nsecret = {key}\n", KeyFile::HEADER),
                FileError {
                    line: 3,
                    problem: FileProblem::UnknownField("secret".into()),
                },
            ),
            (
                format!("{}\n{key}\n", KeyFile::HEADER),
                FileError {
                    line: 2,
                    problem: FileProblem::Syntax("expected `field = value`"),
                },
            ),
        ];
        for (text, expected) in cases {
            let e = KeyFile::parse(&text).unwrap_err();
            assert_eq!(e, expected, "{text:?}");
            assert!(!e.to_string().contains(&key[..16]), "{e}");
        }
    }
}
