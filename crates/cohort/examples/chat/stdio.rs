//! Standard input and output as tokio byte streams, for the examples' loops (the `cohort`
//! crate's tokio has no `io-std` feature): one thread copies standard input into an
//! in-memory pipe, and one task copies the loop's output to standard output. Shared by the
//! chat and kv examples (kv includes this file by path).

use std::io::{BufRead, Write};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, DuplexStream};
use tokio::task::JoinHandle;

/// `(input, output, written)`: lines typed on standard input come out of `input`; what is
/// written to `output` goes to standard output; `written` ends once `output` is dropped and
/// everything written to it is out. Call inside a tokio runtime.
pub fn stdio() -> (BufReader<DuplexStream>, DuplexStream, JoinHandle<()>) {
    let (mut to_loop, input) = tokio::io::duplex(1 << 16);
    let (output, mut from_loop) = tokio::io::duplex(1 << 16);
    let handle = tokio::runtime::Handle::current();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            let bytes = format!("{line}\n").into_bytes();
            if handle.block_on(to_loop.write_all(&bytes)).is_err() {
                break;
            }
        }
        // Dropping `to_loop` ends the loop's input.
    });
    let written = tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        while let Ok(n) = from_loop.read(&mut buf).await {
            if n == 0 {
                break;
            }
            let mut out = std::io::stdout().lock();
            if out.write_all(&buf[..n]).and_then(|()| out.flush()).is_err() {
                break;
            }
        }
    });
    (BufReader::new(input), output, written)
}
