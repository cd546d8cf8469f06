//! The JSON-lines toolkit of the binary's daemons (`cohort group run`, `cohort hop run` and
//! its control socket): reading bounded command lines from standard input on a plain
//! thread, taking a `{"cmd": ...}` object apart with typed getters whose errors name the
//! field, the `error` event line, and writing one JSON object per line to standard output.
//!
//! Owns only the shape of a line; what the commands and events of each daemon are stays in
//! `group_cmd/json.rs` and `hop_cmd/json.rs`. It must not know any daemon's commands.
//! (`kdc serve` and the tunnel log plain text on stderr and read no JSON lines.)

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use serde_json::{json, Map, Value};
use std::io::{BufRead, Write};
use std::net::SocketAddr;
use tokio::sync::mpsc;

/// Writes `value` as one line on standard output and flushes it; the error means nobody
/// reads standard output any more (each daemon decides what that means for it).
pub fn write_line(value: &Value) -> std::io::Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    writeln!(out, "{value}").and_then(|()| out.flush())
}

/// The `error` event: an error answering a command (`cmd` is `None` when the line was not a
/// The line for an event kind the writer does not know yet (the libraries' event enums are
/// non-exhaustive): its debug form, so that it is seen rather than dropped.
pub fn other_event(event: &impl std::fmt::Debug) -> Value {
    json!({ "event": "other", "debug": format!("{event:?}") })
}

/// command at all).
pub fn error(cmd: Option<&str>, error: &str) -> Value {
    json!({"event": "error", "cmd": cmd, "error": error})
}

/// Counters (`(name, count)` pairs, as the libraries' counters iterate) as an object of
/// `name: count`.
pub fn counts(counters: impl Iterator<Item = (&'static str, u64)>) -> Value {
    let map: Map<String, Value> = counters.map(|(k, v)| (k.to_string(), json!(v))).collect();
    Value::Object(map)
}

/// Why a line is not a command: the command's name when it was known, and the problem.
#[derive(Debug, PartialEq, Eq)]
pub struct CommandError {
    /// The `cmd` field, if the line had a string one.
    pub cmd: Option<String>,
    /// What is wrong.
    pub error: String,
}

impl CommandError {
    /// The error line for it.
    pub fn to_json(&self) -> Value {
        error(self.cmd.as_deref(), &self.error)
    }
}

/// The fields of one JSON-object line, with getters whose errors name the field.
pub struct Fields(Map<String, Value>);

impl Fields {
    /// Parses `line` as a JSON object; `noun` names what it should be ("a command is a JSON
    /// object").
    pub fn object(line: &str, noun: &str) -> Result<Self, String> {
        let value: Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
        match value {
            Value::Object(map) => Ok(Self(map)),
            _ => Err(format!("a {noun} is a JSON object")),
        }
    }

    /// The field's value, if present (JSON `null` included).
    pub fn get(&self, field: &str) -> Option<&Value> {
        self.0.get(field)
    }

    /// An error unless every field is one of `allowed`.
    pub fn only(&self, allowed: &[&str]) -> Result<(), String> {
        match self.0.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(extra) => Err(format!("unknown field {extra:?}")),
            None => Ok(()),
        }
    }

    /// An optional string (absent or `null`: `None`).
    pub fn opt_str(&self, field: &str) -> Result<Option<&str>, String> {
        match self.0.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(format!("\"{field}\" must be a string")),
        }
    }

    /// An optional `IP:PORT` string (absent or `null`: `None`).
    pub fn opt_addr(&self, field: &str) -> Result<Option<SocketAddr>, String> {
        self.opt_str(field)?
            .map(|s| {
                s.parse()
                    .map_err(|e| format!("\"{field}\" is not IP:PORT ({s:?}): {e}"))
            })
            .transpose()
    }

    /// A required payload in standard base64 (with padding).
    pub fn base64(&self, field: &str) -> Result<Vec<u8>, String> {
        let text = self
            .0
            .get(field)
            .and_then(Value::as_str)
            .ok_or_else(|| format!("\"{field}\" must be a base64 string"))?;
        BASE64
            .decode(text)
            .map_err(|e| format!("\"{field}\" is not base64: {e}"))
    }
}

/// A command line taken apart: its `cmd` and its fields. Errors from here on name `cmd`.
pub struct CommandLine {
    /// The `cmd` field.
    pub cmd: String,
    /// Every field, `cmd` included.
    pub fields: Fields,
}

impl CommandLine {
    /// Parses one input line: a JSON object with a string `cmd`.
    pub fn parse(line: &str) -> Result<Self, CommandError> {
        let fail = |error: String| CommandError { cmd: None, error };
        let fields = Fields::object(line, "command").map_err(fail)?;
        let cmd = match fields.get("cmd") {
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(fail("\"cmd\" must be a string".into())),
            None => return Err(fail("missing \"cmd\"".into())),
        };
        Ok(Self { cmd, fields })
    }

    /// An error about this command.
    pub fn fail(&self, error: impl Into<String>) -> CommandError {
        CommandError {
            cmd: Some(self.cmd.clone()),
            error: error.into(),
        }
    }

    /// Checks the fields against `allowed`: `None` (the command is not known) is an error
    /// listing `known`.
    pub fn allow(&self, allowed: Option<&[&str]>, known: &str) -> Result<(), CommandError> {
        let allowed = allowed.ok_or_else(|| self.fail(format!("unknown command ({known})")))?;
        self.fields.only(allowed).map_err(|e| self.fail(e))
    }
}

/// Reads standard input on a plain thread (blocking reads never stall the runtime) as lines
/// of at most `limit` bytes, skips blank ones and parses the others with `parse`. Each item
/// is a command or the error line to print; the channel closes at the end of input.
pub fn commands<C: Send + 'static>(
    limit: usize,
    parse: fn(&str) -> Result<C, CommandError>,
) -> mpsc::Receiver<Result<C, Value>> {
    commands_from(|| Ok(std::io::stdin().lock()), limit, parse)
}

/// As [`commands`], from the reader `open` returns, opened on the reading thread (so that
/// opening a fifo, which waits for its writer, blocks nobody else). The channel closes at
/// the end of input or when `open` fails.
pub fn commands_from<C: Send + 'static, R: BufRead>(
    open: impl FnOnce() -> std::io::Result<R> + Send + 'static,
    limit: usize,
    parse: fn(&str) -> Result<C, CommandError>,
) -> mpsc::Receiver<Result<C, Value>> {
    let (tx, rx) = mpsc::channel(64);
    std::thread::spawn(move || {
        let Ok(mut input) = open() else { return };
        loop {
            let item = match read_line_bounded(&mut input, limit) {
                Ok(Some(Ok(line))) if line.trim().is_empty() => continue,
                Ok(Some(Ok(line))) => parse(&line).map_err(|e| e.to_json()),
                Ok(Some(Err(problem))) => Err(error(None, &problem)),
                Ok(None) | Err(_) => return,
            };
            if tx.blocking_send(item).is_err() {
                return;
            }
        }
    });
    rx
}

/// Reads one line of at most `limit` bytes: `None` at end of input, `Some(Err(_))` for a
/// line too long (skipped to its end) or not UTF-8.
fn read_line_bounded(
    input: &mut impl BufRead,
    limit: usize,
) -> std::io::Result<Option<Result<String, String>>> {
    let mut line = Vec::new();
    let mut too_long = false;
    loop {
        let buf = input.fill_buf()?;
        if buf.is_empty() {
            if line.is_empty() && !too_long {
                return Ok(None);
            }
            break;
        }
        let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..=i], true),
            None => (buf, false),
        };
        let used = chunk.len();
        if line.len() + used > limit + 1 {
            too_long = true;
            line.clear();
        } else if !too_long {
            line.extend_from_slice(chunk);
        }
        input.consume(used);
        if done {
            break;
        }
    }
    if too_long {
        return Ok(Some(Err(format!("line longer than {limit} bytes"))));
    }
    while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        line.pop();
    }
    Ok(Some(
        String::from_utf8(line).map_err(|_| "line is not UTF-8".to_string()),
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // reason: test code; a panic is the failure report
mod tests {
    use super::*;

    #[test]
    fn lines_are_bounded_and_checked() {
        let text = b"short\r\n0123456789abcdef\nok\n\xff\nlast";
        let mut input = std::io::BufReader::with_capacity(4, &text[..]);
        let mut lines = Vec::new();
        while let Some(line) = read_line_bounded(&mut input, 8).unwrap() {
            lines.push(line);
        }
        assert_eq!(
            lines,
            [
                Ok("short".to_string()),
                Err("line longer than 8 bytes".to_string()),
                Ok("ok".to_string()),
                Err("line is not UTF-8".to_string()),
                Ok("last".to_string()),
            ]
        );
    }

    #[test]
    fn fields_name_themselves_in_errors() {
        let f = Fields::object(
            r#"{"a":"x","n":null,"p":"127.0.0.1:1","d":"aGk=","k":7}"#,
            "t",
        )
        .unwrap();
        assert_eq!(f.opt_str("a"), Ok(Some("x")));
        assert_eq!(f.opt_str("n"), Ok(None));
        assert_eq!(f.opt_str("k"), Err("\"k\" must be a string".into()));
        assert_eq!(f.opt_addr("p"), Ok(Some("127.0.0.1:1".parse().unwrap())));
        assert!(f
            .opt_addr("a")
            .unwrap_err()
            .starts_with("\"a\" is not IP:PORT"));
        assert_eq!(f.base64("d"), Ok(b"hi".to_vec()));
        assert!(f
            .base64("a")
            .unwrap_err()
            .starts_with("\"a\" is not base64"));
        assert!(f.only(&["a", "n", "p", "d"]).unwrap_err().contains("\"k\""));
        assert_eq!(
            Fields::object("[]", "thing").err(),
            Some("a thing is a JSON object".into())
        );
    }
}
