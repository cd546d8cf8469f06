//! What `cohort group run` and `cohort hop run` share in reading their TOML configs: the
//! error that names the key at fault, reading an identity file, parsing an address.

use cohort_channel::identity::Identity;
use cohort_crypto::CryptoProvider;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;

/// A configuration problem: the key (or the file) at fault and what is wrong with it.
#[derive(Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The key, as written in the file (`trust[2]`, `peer[0].via`), or the file's path for
    /// file-level problems.
    pub key: String,
    /// What is wrong.
    pub problem: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "config error: {}: {}", self.key, self.problem)
    }
}

/// A [`ConfigError`] for `key`.
pub fn err(key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.into(),
        problem: problem.into(),
    }
}

/// Reads the identity file at `path` (the `identity` key); the secret is wiped after use.
pub fn read_identity(provider: &CryptoProvider, path: &Path) -> Result<Identity, ConfigError> {
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .map(zeroize::Zeroizing::new)
        .map_err(|e| err("identity", format!("cannot read {shown}: {e}")))?;
    Identity::from_file_text(provider, &text).map_err(|e| err("identity", format!("{shown}: {e}")))
}

/// Parses `IP:PORT` for `key`.
pub fn parse_addr(key: &str, text: &str) -> Result<SocketAddr, ConfigError> {
    text.parse()
        .map_err(|e| err(key, format!("not an IP:PORT address ({text:?}): {e}")))
}
