//! What the TOML config readers (`group run`, `hop run`, `kdc`) share: reading the file,
//! deserializing it with serde into a command's typed struct with the key at fault named
//! ([`from_toml`]), the number types whose errors read well ([`Whole`], [`Number`]), the
//! error that names the key, identity files, addresses and the `listen` rule.
//!
//! Owns only what every reader needs; which keys a file has and what they mean stay in
//! each command's `config` module.

use cohort_channel::identity::Identity;
use cohort_crypto::CryptoProvider;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// A configuration problem: the key (or the file) at fault and what is wrong with it.
#[derive(Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The key, as written in the file (`trust[2]`, `peer[0].via`), or the file's path for
    /// file-level problems.
    pub key: String,
    /// What is wrong.
    pub problem: String,
    /// The file the key is in, when the error came from reading one (`read_config`) and
    /// `key` is not already the file's path.
    pub file: Option<String>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "config error: {}: {}", self.key, self.problem)?;
        match &self.file {
            Some(file) => write!(f, " (in {file})"),
            None => Ok(()),
        }
    }
}

/// A [`ConfigError`] for `key`.
pub fn err(key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.into(),
        problem: problem.into(),
        file: None,
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

/// The address to bind and to be reached at: `flag` (the command line's `--listen`) over
/// the file's `listen`; an unspecified IP (`0.0.0.0`) is refused, since the address is also
/// what `others` use to reach this `node`.
pub fn listen_addr(
    flag: Option<SocketAddr>,
    file: Option<&str>,
    others: &str,
    node: &str,
) -> Result<SocketAddr, ConfigError> {
    let listen = match (flag, file) {
        (Some(addr), _) => addr,
        (None, Some(text)) => parse_addr("listen", text)?,
        (None, None) => return Err(err("listen", "missing (or give --listen)")),
    };
    if listen.ip().is_unspecified() {
        return Err(err(
            "listen",
            format!(
                "{} is not an address {others} can reach: give this {node}'s own IP",
                listen.ip()
            ),
        ));
    }
    Ok(listen)
}

/// Deserializes a config file's `text` into its typed form `T` (a `#[serde(deny_unknown_fields)]`
/// struct), with the key at fault named as the file writes it (`peers[0]`, `peer[1].via`,
/// `tun.mtu`). A file that is not TOML at all comes back with an empty key.
pub fn from_toml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| {
        // Only a file that failed is parsed a second time, to find the key at fault.
        let doc = match toml::de::DeTable::parse(text) {
            Ok(doc) => doc,
            Err(syntax) => return err("", format!("not valid TOML: {}", syntax.message())),
        };
        let key = e
            .span()
            .map(|span| key_at(doc.get_ref(), span.start))
            .unwrap_or_default();
        err(key, reword(e.message()))
    })
}

/// The dotted path of the key whose name or value covers byte `at` ("" for none).
fn key_at(table: &toml::de::DeTable<'_>, at: usize) -> String {
    for (key, value) in table {
        if key.span().contains(&at) {
            return key.get_ref().to_string();
        }
        let inner = value_path(value, at);
        if value.span().contains(&at) || !inner.is_empty() {
            return format!("{}{inner}", key.get_ref());
        }
    }
    String::new()
}

/// The rest of the path below a value (`[2]`, `.mtu`, `[0].via`) that covers byte `at`.
fn value_path(value: &toml::Spanned<toml::de::DeValue<'_>>, at: usize) -> String {
    match value.get_ref() {
        toml::de::DeValue::Table(t) => match key_at(t, at) {
            inner if inner.is_empty() => inner,
            inner => format!(".{inner}"),
        },
        toml::de::DeValue::Array(items) => items
            .iter()
            .enumerate()
            .find(|(_, item)| item.span().contains(&at) || !value_path(item, at).is_empty())
            .map(|(i, item)| format!("[{i}]{}", value_path(item, at)))
            .unwrap_or_default(),
        _ => String::new(),
    }
}

/// serde's fixed wordings in the config's terms: "unknown field `x`, expected one of ..."
/// becomes "unknown key (expected one of ...)", "invalid type: string \"fast\", expected a
/// whole number" becomes "must be a whole number, not string \"fast\"".
fn reword(message: &str) -> String {
    let message = message.trim_end();
    if let Some(rest) = message.strip_prefix("unknown field ") {
        let expected = rest.split_once(", ").map_or("", |(_, e)| e);
        return format!("unknown key ({expected})");
    }
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some((found, expected)) = message
            .strip_prefix(prefix)
            .and_then(|rest| rest.rsplit_once(", expected "))
        {
            return format!("must be {expected}, not {found}");
        }
    }
    message.to_string()
}

/// A whole number of a config file (durations in `*_ms` keys, counts): its type errors say
/// "must be a whole number", a negative one "must not be negative".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Whole(pub u64);

impl Whole {
    /// The number as milliseconds.
    pub fn millis(self) -> Duration {
        Duration::from_millis(self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Whole {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Whole;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a whole number")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Whole, E> {
                Ok(Whole(n))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Whole, E> {
                u64::try_from(n)
                    .map(Whole)
                    .map_err(|_| E::custom(format!("must not be negative ({n})")))
            }
        }
        d.deserialize_u64(Visitor)
    }
}

/// A number of a config file, whole or not (`rekey_period_secs`, `floor_bits`); its type
/// errors say "must be a number". Range checks belong to validation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Number(pub f64);

impl<'de> serde::Deserialize<'de> for Number {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Number;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number")
            }
            fn visit_f64<E: serde::de::Error>(self, x: f64) -> Result<Number, E> {
                Ok(Number(x))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Number, E> {
                Ok(Number(n as f64))
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Number, E> {
                Ok(Number(n as f64))
            }
        }
        d.deserialize_f64(Visitor)
    }
}

impl Number {
    /// The number if it is finite and at least 0; otherwise the error for `key`.
    pub fn non_negative(self, key: &str) -> Result<f64, ConfigError> {
        let n = self.0;
        if !n.is_finite() || n < 0.0 {
            return Err(err(
                key,
                format!("must be a finite number, at least 0 ({n})"),
            ));
        }
        Ok(n)
    }
}

/// Reads a config file of at most 1 MiB at `path` and turns it into a setup with `parse`
/// (which gets the text and the folder relative paths start from); file-level problems
/// name the file.
pub fn read_config<T>(
    path: &Path,
    parse: impl FnOnce(&str, &Path) -> Result<T, ConfigError>,
) -> Result<T, ConfigError> {
    let shown = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| err(&shown, format!("cannot read: {e}")))?;
    if meta.len() > MAX_CONFIG_LEN {
        return Err(err(&shown, "larger than 1 MiB: not a config file"));
    }
    let text =
        std::fs::read_to_string(path).map_err(|e| err(&shown, format!("cannot read: {e}")))?;
    let base = path.parent().unwrap_or(Path::new("."));
    parse(&text, base).map_err(|e| {
        if e.key.is_empty() {
            err(shown, e.problem)
        } else {
            ConfigError {
                file: Some(shown),
                ..e
            }
        }
    })
}

/// Largest configuration file read (a config is a few hundred bytes).
const MAX_CONFIG_LEN: u64 = 1 << 20;

/// What the config readers' unit tests share: a temporary folder with an identity file.
#[cfg(test)]
#[allow(clippy::unwrap_used)] // reason: test code; a panic is the failure report
pub mod test_support {
    use cohort_channel::identity::Identity;
    use cohort_crypto::CryptoProvider;
    use std::path::PathBuf;

    /// A temporary folder, removed when dropped.
    pub struct Dir(pub PathBuf);

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A fresh folder `cohort-{tag}-{pid}` in the temporary directory, holding a new
    /// identity file named `key_file`; returns it and the identity's public key.
    pub fn dir_with_key(tag: &str, key_file: &str) -> (Dir, String) {
        let provider = CryptoProvider::default_provider();
        let dir = std::env::temp_dir().join(format!("cohort-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let id = Identity::generate(&provider).unwrap();
        std::fs::write(dir.join(key_file), id.to_file_text().as_bytes()).unwrap();
        (Dir(dir), id.public().to_string())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // reason: test code; a panic is the failure report
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // reason: only the errors are looked at
    struct File {
        a_ms: Option<Whole>,
        x: Option<Number>,
        #[serde(default)]
        list: Vec<String>,
        sub: Option<Sub>,
        #[serde(default)]
        item: Vec<Sub>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // reason: only the errors are looked at
    struct Sub {
        n: Option<Whole>,
    }

    fn error(text: &str) -> String {
        from_toml::<File>(text).unwrap_err().to_string()
    }

    #[test]
    fn toml_errors_name_the_key_in_the_config_s_words() {
        assert!(error("colour = 1").starts_with("config error: colour: unknown key (expected"));
        assert_eq!(
            error("a_ms = \"fast\""),
            "config error: a_ms: must be a whole number, not string \"fast\""
        );
        assert_eq!(
            error("a_ms = -5"),
            "config error: a_ms: must not be negative (-5)"
        );
        assert!(error("x = true").starts_with("config error: x: must be a number, not"));
        assert!(error("list = [\"a\", 7]").starts_with("config error: list[1]: must be a string"));
        assert!(error("[sub]\nn = \"x\"").starts_with("config error: sub.n: must be a whole"));
        assert!(error("[sub]\nm = 1").starts_with("config error: sub.m: unknown key"));
        assert!(error("[[item]]\n[[item]]\nn = 1.5").starts_with("config error: item[1].n: "));
        assert!(error("[[item]]\nq = 1").starts_with("config error: item[0].q: unknown key"));
        let e = from_toml::<File>("a_ms = [").unwrap_err();
        assert_eq!(e.key, "");
        assert!(e.problem.starts_with("not valid TOML"), "{e}");
        assert_eq!(Number(1.5).non_negative("x"), Ok(1.5));
        assert_eq!(Number(-1.0).non_negative("x").unwrap_err().key, "x");
    }
}
