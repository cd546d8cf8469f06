//! The tunnel's copy loop: moves bytes both ways between two streams until both directions
//! have ended, like tokio's `copy_bidirectional_with_sizes`, but with buffers that start
//! small and grow only while reads fill them.
//!
//! A tunnel that carries one short request and its reply (most connections) then never
//! allocates, zeroes and faults in the 64 KiB a bulk transfer wants, and one that carries
//! megabytes reaches that size after a few reads. Each direction's buffer is allocated on
//! its first read, so a direction that carries nothing costs nothing.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The first buffer of a direction: a short request or reply fits.
pub(super) const FIRST_BUFFER: usize = 4 * 1024;

/// One direction: read from one stream into the buffer, write it all to the other, and
/// shut the writer down after the reader's end.
struct OneWay {
    buf: Vec<u8>,
    /// Bytes `start..end` of `buf` are read and not yet written.
    start: usize,
    end: usize,
    /// The largest the buffer may grow.
    max: usize,
    read_done: bool,
    /// Bytes were written since the last flush.
    need_flush: bool,
    done: bool,
    copied: u64,
}

impl OneWay {
    fn new(max: usize) -> Self {
        OneWay {
            buf: Vec::new(),
            start: 0,
            end: 0,
            max: max.max(1),
            read_done: false,
            need_flush: false,
            done: false,
            copied: 0,
        }
    }

    /// Copies until the reader ends (then shuts the writer down) or one of them is
    /// pending; the bytes copied once done.
    fn poll_copy<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        mut reader: Pin<&mut R>,
        mut writer: Pin<&mut W>,
    ) -> Poll<io::Result<u64>>
    where
        R: AsyncRead + ?Sized,
        W: AsyncWrite + ?Sized,
    {
        if self.done {
            return Poll::Ready(Ok(self.copied));
        }
        loop {
            if self.start == self.end && !self.read_done {
                self.grow_if_filled();
                let mut rb = ReadBuf::new(&mut self.buf);
                match reader.as_mut().poll_read(cx, &mut rb) {
                    Poll::Pending => {
                        // Nothing more to send for now: push out what the writer queued.
                        if self.need_flush {
                            ready!(writer.as_mut().poll_flush(cx))?;
                            self.need_flush = false;
                        }
                        return Poll::Pending;
                    }
                    Poll::Ready(result) => result?,
                }
                let n = rb.filled().len();
                if n == 0 {
                    self.read_done = true;
                } else {
                    self.start = 0;
                    self.end = n;
                }
            }
            while self.start < self.end {
                let n = ready!(writer
                    .as_mut()
                    .poll_write(cx, &self.buf[self.start..self.end]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.start += n;
                self.copied += n as u64;
                self.need_flush = true;
            }
            if self.read_done {
                ready!(writer.as_mut().poll_shutdown(cx))?;
                self.done = true;
                return Poll::Ready(Ok(self.copied));
            }
        }
    }

    /// Before a read into the empty buffer: allocates the first buffer, or doubles it (up
    /// to the maximum) if the last read filled it.
    fn grow_if_filled(&mut self) {
        if self.buf.is_empty() {
            self.buf = vec![0; FIRST_BUFFER.min(self.max)];
        } else if self.end == self.buf.len() && self.buf.len() < self.max {
            let larger = (self.buf.len() * 2).min(self.max);
            self.buf.resize(larger, 0);
        }
    }
}

/// Copies `a` to `b` and `b` to `a` at once until both have ended, shutting down each
/// writer after its reader's end; returns the bytes copied each way (a to b, b to a). Each
/// direction's buffer grows from [`FIRST_BUFFER`] to at most `max_a_to_b` and
/// `max_b_to_a` bytes. The first error from either direction ends both.
pub(super) async fn copy_both_ways<A, B>(
    a: &mut A,
    b: &mut B,
    max_a_to_b: usize,
    max_b_to_a: usize,
) -> io::Result<(u64, u64)>
where
    A: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let mut a_to_b = OneWay::new(max_a_to_b);
    let mut b_to_a = OneWay::new(max_b_to_a);
    poll_fn(|cx| {
        let up = a_to_b.poll_copy(cx, Pin::new(&mut *a), Pin::new(&mut *b))?;
        let down = b_to_a.poll_copy(cx, Pin::new(&mut *b), Pin::new(&mut *a))?;
        match (up, down) {
            (Poll::Ready(up), Poll::Ready(down)) => Poll::Ready(Ok((up, down))),
            _ => Poll::Pending,
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // reason: tests fail loudly on unexpected errors
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Runs the copy between two in-memory pipes; `left` and `right` are the far ends.
    #[tokio::test]
    async fn copies_both_ways_and_shuts_down_each_side_after_its_end() {
        let (mut left, mut a) = tokio::io::duplex(1 << 20);
        let (mut b, mut right) = tokio::io::duplex(1 << 20);
        let big: Vec<u8> = (0..300_000).map(|i| (i * 13 % 251) as u8).collect();
        let task = tokio::spawn(async move { copy_both_ways(&mut a, &mut b, 65536, 65536).await });
        left.write_all(&big).await.unwrap();
        left.shutdown().await.unwrap();
        right.write_all(b"reply").await.unwrap();
        right.shutdown().await.unwrap();
        let mut got = Vec::new();
        right.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, big);
        let mut back = Vec::new();
        left.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"reply");
        assert_eq!(task.await.unwrap().unwrap(), (300_000, 5));
    }

    #[test]
    fn the_buffer_starts_small_and_doubles_only_after_a_full_read() {
        let mut way = OneWay::new(65536);
        assert!(way.buf.is_empty());
        way.grow_if_filled();
        assert_eq!(way.buf.len(), FIRST_BUFFER);
        way.end = 100; // a short read: no growth
        way.grow_if_filled();
        assert_eq!(way.buf.len(), FIRST_BUFFER);
        for expected in [8192, 16384, 32768, 65536, 65536] {
            way.end = way.buf.len(); // a full read
            way.grow_if_filled();
            assert_eq!(way.buf.len(), expected);
        }
    }

    #[tokio::test]
    async fn a_write_error_ends_the_copy() {
        let (mut left, mut a) = tokio::io::duplex(1024);
        let (mut b, right) = tokio::io::duplex(1024);
        drop(right);
        let task = tokio::spawn(async move { copy_both_ways(&mut a, &mut b, 4096, 4096).await });
        left.write_all(b"into a closed pipe").await.unwrap();
        assert!(task.await.unwrap().is_err());
    }
}
