//! Standard input as bounded JSON-command lines, read on a plain thread: shared by
//! `cohort group run` and `cohort hop run`.

use std::io::BufRead;
use tokio::sync::mpsc;

/// One line of standard input, as the reader thread saw it.
pub enum Input {
    /// A line, without its line ending.
    Line(String),
    /// A line too long or not UTF-8 (what was wrong).
    Bad(String),
    /// Standard input ended (or failed).
    Eof,
}

/// Reads lines of at most `limit` bytes on a plain thread (blocking reads of stdin never
/// stall the runtime).
pub fn spawn(limit: usize) -> mpsc::Receiver<Input> {
    let (tx, rx) = mpsc::channel(64);
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut stdin = stdin.lock();
        loop {
            let input = match read_line_bounded(&mut stdin, limit) {
                Ok(Some(Ok(line))) => Input::Line(line),
                Ok(Some(Err(problem))) => Input::Bad(problem),
                Ok(None) | Err(_) => Input::Eof,
            };
            let eof = matches!(input, Input::Eof);
            if tx.blocking_send(input).is_err() || eof {
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
}
