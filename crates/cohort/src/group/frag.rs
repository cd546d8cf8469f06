//! Fragmentation of the facade's reliable messages: one application message (or state
//! snapshot) of up to [`MAX_MESSAGE`] bytes becomes one or more member messages, each with a
//! 14-byte header, sent on the member's reliable channel (so under the same group keys);
//! [`Reassembler`] puts them back together.
//!
//! ```text
//!   fragment = version (1, u8) | stream (u8: 0 data, 1 state) | message (u32 BE)
//!            | index (u32 BE) | count (u32 BE) | chunk
//! ```
//!
//! The reliable channel delivers each sender's messages in its send order (and every member
//! in the same total order), so a sender's fragments arrive one message at a time, index 0
//! to count-1, with nothing of that sender in between. Reassembly therefore keeps at most
//! one partial message per sender, and anything else (a wrong version, an index out of
//! order, a message number that changes mid-way, a message above the limit) is garbage:
//! dropped and counted, never a panic.

use cohort_group::MemberId;
use std::collections::HashMap;

/// Largest application message on the reliable channel: 16 MiB.
pub const MAX_MESSAGE: usize = 16 << 20;

/// Bytes of a fragment's header.
pub const HEADER: usize = 14;

/// The header's version byte.
const VERSION: u8 = 1;

/// What a reassembled message carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// An application message.
    Data,
    /// A state-transfer message (see the module `state`).
    State,
}

impl Stream {
    fn byte(self) -> u8 {
        match self {
            Stream::Data => 0,
            Stream::State => 1,
        }
    }

    fn from_byte(b: u8) -> Option<Stream> {
        match b {
            0 => Some(Stream::Data),
            1 => Some(Stream::State),
            _ => None,
        }
    }
}

/// Splits `data` into fragments of at most `payload` bytes each (header included), for
/// message number `message`. `payload` must exceed [`HEADER`]; an empty message is one
/// fragment with an empty chunk. `None` if `data` is above [`MAX_MESSAGE`] or `payload` is
/// too small.
pub fn split(stream: Stream, message: u32, data: &[u8], payload: usize) -> Option<Vec<Vec<u8>>> {
    if data.len() > MAX_MESSAGE || payload <= HEADER {
        return None;
    }
    let chunk = payload - HEADER;
    let count = data.len().div_ceil(chunk).max(1);
    let count32 = u32::try_from(count).ok()?;
    let mut out = Vec::with_capacity(count);
    for index in 0..count {
        let part = &data[(index * chunk).min(data.len())..((index + 1) * chunk).min(data.len())];
        let mut fragment = Vec::with_capacity(HEADER + part.len());
        fragment.push(VERSION);
        fragment.push(stream.byte());
        fragment.extend_from_slice(&message.to_be_bytes());
        fragment.extend_from_slice(&u32::try_from(index).ok()?.to_be_bytes());
        fragment.extend_from_slice(&count32.to_be_bytes());
        fragment.extend_from_slice(part);
        out.push(fragment);
    }
    Some(out)
}

/// Why fragments were dropped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FragmentDrops {
    /// Fragments that were not fragments (short, wrong version, unknown stream, bad count)
    /// or did not continue their sender's message (index or message number out of order).
    pub garbage: u64,
    /// Messages dropped because they would exceed [`MAX_MESSAGE`] or the reassembly memory
    /// bound.
    pub over_limit: u64,
    /// Partial messages discarded because their sender left the view.
    pub sender_left: u64,
}

/// One sender's message under reassembly.
struct Partial {
    stream: Stream,
    message: u32,
    next: u32,
    count: u32,
    data: Vec<u8>,
}

/// Reassembles fragments per sender, holding at most `limit` bytes in partial messages.
pub struct Reassembler {
    partials: HashMap<MemberId, Partial>,
    /// Senders whose current message was dropped: their fragments up to its end are
    /// skipped (counted as part of the one drop).
    skipping: HashMap<MemberId, u32>,
    held: usize,
    limit: usize,
    drops: FragmentDrops,
}

impl Reassembler {
    /// A reassembler that holds at most `limit` bytes of partial messages at once.
    pub fn new(limit: usize) -> Self {
        Reassembler {
            partials: HashMap::new(),
            skipping: HashMap::new(),
            held: 0,
            limit,
            drops: FragmentDrops::default(),
        }
    }

    /// What was dropped so far.
    pub fn drops(&self) -> FragmentDrops {
        self.drops
    }

    /// Counts as garbage a whole message that its reader could not parse (a malformed
    /// state-transfer message).
    pub fn note_garbage(&mut self) {
        self.drops.garbage += 1;
    }

    /// Bytes held in partial messages now.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Takes one fragment from `sender`; returns a message when it is complete.
    pub fn push(&mut self, sender: MemberId, fragment: &[u8]) -> Option<(Stream, Vec<u8>)> {
        let Some((stream, message, index, count, chunk)) = parse(fragment) else {
            self.garbage(sender);
            return None;
        };
        if index == 0 {
            self.begin(sender);
            if count == 1 {
                return Some((stream, chunk.to_vec()));
            }
            // Fragments are at most one datagram; a count that cannot fit the limit even
            // with full chunks is refused from the start (and its fragments skipped).
            let at_least = usize::try_from(count - 1).unwrap_or(usize::MAX);
            if at_least.saturating_mul(chunk.len().max(1)) > MAX_MESSAGE {
                self.drops.over_limit += 1;
                self.skipping.insert(sender, message);
                return None;
            }
            self.partials.insert(
                sender,
                Partial {
                    stream,
                    message,
                    next: 0,
                    count,
                    data: Vec::new(),
                },
            );
        } else if self.skipping.get(&sender) == Some(&message) {
            if index + 1 == count {
                self.skipping.remove(&sender);
            }
            return None;
        }
        let Some(partial) = self.partials.get_mut(&sender) else {
            self.drops.garbage += 1;
            return None;
        };
        if partial.message != message
            || partial.next != index
            || partial.count != count
            || partial.stream != stream
        {
            self.discard(&sender);
            self.drops.garbage += 1;
            return None;
        }
        if partial.data.len() + chunk.len() > MAX_MESSAGE || self.held + chunk.len() > self.limit {
            self.discard(&sender);
            self.drops.over_limit += 1;
            if index + 1 < count {
                self.skipping.insert(sender, message);
            }
            return None;
        }
        partial.data.extend_from_slice(chunk);
        partial.next += 1;
        self.held += chunk.len();
        if partial.next == partial.count {
            let done = self.partials.remove(&sender)?;
            self.held -= done.data.len();
            return Some((done.stream, done.data));
        }
        None
    }

    /// As [`Reassembler::push`], taking the fragment by value: a message in one fragment
    /// (the common case) comes back in the fragment's own buffer, moved down over the
    /// header, instead of being copied into a new one.
    pub fn push_owned(
        &mut self,
        sender: MemberId,
        mut fragment: Vec<u8>,
    ) -> Option<(Stream, Vec<u8>)> {
        match parse(&fragment) {
            Some((stream, _, 0, 1, _)) => {
                self.begin(sender);
                fragment.drain(..HEADER);
                Some((stream, fragment))
            }
            _ => self.push(sender, &fragment),
        }
    }

    /// The first fragment of a new message from `sender`: whatever was under way from it is
    /// incomplete.
    fn begin(&mut self, sender: MemberId) {
        self.skipping.remove(&sender);
        if self.discard(&sender) {
            self.drops.garbage += 1;
        }
    }

    /// `sender` left the view: its partial message (if any) will never complete.
    pub fn forget(&mut self, sender: &MemberId) {
        self.skipping.remove(sender);
        if self.discard(sender) {
            self.drops.sender_left += 1;
        }
    }

    /// Forgets every sender not in `members`.
    pub fn retain(&mut self, members: &[MemberId]) {
        let gone: Vec<MemberId> = self
            .partials
            .keys()
            .chain(self.skipping.keys())
            .filter(|m| !members.contains(m))
            .copied()
            .collect();
        for m in gone {
            self.forget(&m);
        }
    }

    fn garbage(&mut self, sender: MemberId) {
        self.drops.garbage += 1;
        self.discard(&sender);
    }

    /// Drops `sender`'s partial message; true if there was one.
    fn discard(&mut self, sender: &MemberId) -> bool {
        match self.partials.remove(sender) {
            Some(p) => {
                self.held -= p.data.len();
                true
            }
            None => false,
        }
    }
}

/// A fragment's header fields and chunk, if it is one.
fn parse(fragment: &[u8]) -> Option<(Stream, u32, u32, u32, &[u8])> {
    let header = fragment.get(..HEADER)?;
    if header[0] != VERSION {
        return None;
    }
    let stream = Stream::from_byte(header[1])?;
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_be_bytes(header.get(at..at + 4)?.try_into().ok()?))
    };
    let (message, index, count) = (word(2)?, word(6)?, word(10)?);
    if count == 0 || index >= count {
        return None;
    }
    Some((stream, message, index, count, &fragment[HEADER..]))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // reason: test code; a panic is the failure report
mod tests {
    use super::*;

    fn id(n: u8) -> MemberId {
        MemberId::from_bytes([n; 32])
    }

    fn data(len: usize, salt: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ salt)
            .collect()
    }

    #[test]
    fn split_and_reassemble_round_trip_at_every_boundary() {
        for len in [0, 1, 85, 86, 87, 172, 1000] {
            let msg = data(len, 3);
            let frags = split(Stream::Data, 7, &msg, 100).unwrap();
            assert_eq!(frags.len(), len.div_ceil(86).max(1), "len {len}");
            assert!(frags.iter().all(|f| f.len() <= 100));
            let mut r = Reassembler::new(1 << 20);
            let mut out = None;
            for (i, f) in frags.iter().enumerate() {
                let got = r.push(id(1), f);
                if i + 1 < frags.len() {
                    assert!(got.is_none());
                } else {
                    out = got;
                }
            }
            assert_eq!(out, Some((Stream::Data, msg)));
            assert_eq!(r.held(), 0);
            assert_eq!(r.drops(), FragmentDrops::default());
        }
        assert!(split(Stream::Data, 0, &[0; MAX_MESSAGE + 1], 1400).is_none());
        assert!(split(Stream::Data, 0, b"x", HEADER).is_none());
        assert_eq!(
            split(Stream::Data, 0, &vec![0; MAX_MESSAGE], 16384)
                .unwrap()
                .len(),
            1025
        );
    }

    #[test]
    fn taking_fragments_by_value_gives_what_taking_them_by_reference_gives() {
        // Whole messages, parts of messages, a message cut short by a new one, and junk, from
        // two senders: both readers see the same messages and count the same drops.
        let mut fragments: Vec<(u8, Vec<u8>)> = Vec::new();
        for (k, len) in [0usize, 5, 86, 87, 300, 1, 7].into_iter().enumerate() {
            let sender = 1 + (k % 2) as u8;
            let stream = if k == 3 { Stream::State } else { Stream::Data };
            let mut frags = split(stream, k as u32, &data(len, k as u8), 100).unwrap();
            if k == 4 {
                frags.truncate(2); // cut short by sender 1's next, a one-fragment message
            }
            fragments.extend(frags.into_iter().map(|f| (sender, f)));
            if k == 2 {
                fragments.push((1, b"\x01\x00junk".to_vec()));
            }
        }
        let (mut by_ref, mut by_value) = (Reassembler::new(1 << 20), Reassembler::new(1 << 20));
        let (mut got_ref, mut got_value) = (Vec::new(), Vec::new());
        for (sender, f) in fragments {
            got_ref.extend(by_ref.push(id(sender), &f));
            got_value.extend(by_value.push_owned(id(sender), f));
        }
        assert_eq!(got_value, got_ref);
        assert_eq!(got_ref.len(), 6, "every message but the one cut short");
        assert_eq!(by_value.drops(), by_ref.drops());
        assert_eq!(by_value.held(), by_ref.held());
    }

    #[test]
    fn interleaved_senders_reassemble_independently() {
        let (a, b) = (data(500, 1), data(333, 2));
        let fa = split(Stream::Data, 1, &a, 64).unwrap();
        let fb = split(Stream::State, 1, &b, 64).unwrap();
        let mut r = Reassembler::new(1 << 20);
        let mut done = Vec::new();
        for i in 0..fa.len().max(fb.len()) {
            if let Some(f) = fa.get(i) {
                done.extend(r.push(id(1), f).map(|m| (1, m)));
            }
            if let Some(f) = fb.get(i) {
                done.extend(r.push(id(2), f).map(|m| (2, m)));
            }
        }
        assert_eq!(done.len(), 2);
        assert!(done.contains(&(1, (Stream::Data, a))));
        assert!(done.contains(&(2, (Stream::State, b))));
    }

    #[test]
    fn garbage_and_truncated_messages_are_dropped_and_counted() {
        let mut r = Reassembler::new(1 << 20);
        // Not fragments at all.
        for junk in [
            &b""[..],
            b"\x01\x00",
            b"\x02\x00\0\0\0\0\0\0\0\0\0\0\0\x01",
            b"\x01\x09\0\0\0\0\0\0\0\0\0\0\0\x01",
        ] {
            assert!(r.push(id(1), junk).is_none());
        }
        // index >= count, count 0.
        assert!(r
            .push(id(1), b"\x01\x00\0\0\0\0\0\0\0\x02\0\0\0\x02")
            .is_none());
        assert!(r.push(id(1), b"\x01\x00\0\0\0\0\0\0\0\0\0\0\0\0").is_none());
        assert_eq!(r.drops().garbage, 6);
        // A truncated message (its last fragment never comes) followed by a new one.
        let f1 = split(Stream::Data, 1, &data(300, 0), 64).unwrap();
        let f2 = split(Stream::Data, 2, &data(200, 9), 64).unwrap();
        for f in &f1[..f1.len() - 1] {
            assert!(r.push(id(1), f).is_none());
        }
        assert!(r.held() > 0);
        let mut out = None;
        for f in &f2 {
            out = r.push(id(1), f);
        }
        assert_eq!(out, Some((Stream::Data, data(200, 9))));
        assert_eq!(r.drops().garbage, 7);
        assert_eq!(r.held(), 0);
        // A fragment out of order kills the message; its tail is garbage too.
        let f3 = split(Stream::Data, 3, &data(300, 0), 64).unwrap();
        r.push(id(1), &f3[0]);
        assert!(r.push(id(1), &f3[2]).is_none());
        assert!(r.push(id(1), &f3[3]).is_none());
        assert_eq!(r.drops().garbage, 9);
        assert_eq!(r.held(), 0);
    }

    #[test]
    fn memory_is_bounded_and_a_sender_that_left_is_forgotten() {
        let mut r = Reassembler::new(1000);
        let big = split(Stream::Data, 1, &data(3000, 0), 514).unwrap();
        let mut got = None;
        for f in &big {
            got = got.or(r.push(id(1), f));
            assert!(r.held() <= 1000);
        }
        assert!(got.is_none());
        assert_eq!(r.drops().over_limit, 1);
        assert_eq!(r.drops().garbage, 0, "the skipped tail is one drop");
        // The next message from the same sender gets through.
        let small = split(Stream::Data, 2, &data(900, 4), 514).unwrap();
        let mut got = None;
        for f in &small {
            got = got.or(r.push(id(1), f));
        }
        assert_eq!(got, Some((Stream::Data, data(900, 4))));
        // A partial from a sender that leaves is discarded; its later fragments are garbage.
        let c = split(Stream::Data, 5, &data(900, 4), 514).unwrap();
        r.push(id(3), &c[0]);
        r.retain(&[id(1)]);
        assert_eq!(r.drops().sender_left, 1);
        assert_eq!(r.held(), 0);
        assert!(r.push(id(3), &c[1]).is_none());
        assert_eq!(r.drops().garbage, 1);
        // A count that could never fit is refused at its first fragment.
        let mut huge = split(Stream::Data, 6, &data(100, 0), 514)
            .unwrap()
            .remove(0);
        huge[10..14].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(r.push(id(4), &huge).is_none());
        assert_eq!(r.drops().over_limit, 2);
        assert_eq!(r.held(), 0);
    }
}
