//! The replicated store's state machine, with no network: the operations and their wire form,
//! applying them in delivery order, snapshots for state transfer, and the merge of two
//! components' states after a partition heals. The network glue (`node.rs`) only feeds it
//! what the group delivers.
//!
//! Every member applies the same operations in the same order (the group's reliable channel
//! is totally ordered within a view), so every member of a view holds the same `Store`. Each
//! write is stamped when it is *applied*, not when it is sent: the stamp is the store's
//! Lamport clock plus one, and the writer. Because the clock is part of the replicated state,
//! all members of a view compute the same stamp for the same write.
//!
//! After a partition, two components hold different stores. [`Store::merge`] joins them key
//! by key (the entry with the larger stamp wins; deletions are kept as tombstones so they win
//! too) and takes the larger clock, so that any write applied after the merge beats every
//! write made on either side during the partition. `merge` is commutative, associative and
//! idempotent, so it does not matter how many members send their old state, or in which order
//! the merges are delivered.

use std::collections::BTreeMap;
use std::fmt;

/// Longest key, in bytes.
pub const MAX_KEY_LEN: usize = 1024;
/// Longest value, in bytes.
pub const MAX_VALUE_LEN: usize = 1 << 20;
/// First bytes of every encoded operation and snapshot (format version 1).
const MAGIC: &[u8; 4] = b"ckv1";

const TAG_PUT: u8 = 1;
const TAG_DELETE: u8 = 2;
const TAG_MERGE: u8 = 3;
const TAG_SNAPSHOT: u8 = 4;

/// When and by whom an entry was last written: ordered by clock, then writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Stamp {
    /// The store's Lamport clock when the write was applied.
    pub clock: u64,
    /// The writer's member id bytes (breaks ties between components of a partition, which
    /// may have reached the same clock).
    pub writer: [u8; 32],
}

/// One key's latest write: a value, or a tombstone left by a delete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// `None` for a deleted key (the tombstone keeps the delete's stamp for merges).
    pub value: Option<Vec<u8>>,
    /// The write's stamp.
    pub stamp: Stamp,
}

impl Entry {
    /// Whether `self` wins over `other` in a merge: the larger stamp, then (for two writes
    /// that somehow share a stamp) the larger value, a tombstone being smallest. A total order,
    /// so that the merge gives the same result whichever side runs it.
    fn beats(&self, other: &Entry) -> bool {
        (self.stamp, &self.value) > (other.stamp, &other.value)
    }
}

/// An operation, as members send it on the reliable channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Set `key` to `value`.
    Put {
        /// The key.
        key: String,
        /// The value.
        value: Vec<u8>,
    },
    /// Remove `key`.
    Delete {
        /// The key.
        key: String,
    },
    /// A member's state from before a merge, for every member to join into its own.
    Merge(Store),
}

/// The replicated state: every key's latest write and the Lamport clock.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Store {
    entries: BTreeMap<String, Entry>,
    clock: u64,
}

/// Why bytes do not decode to an operation or a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError(&'static str);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a kv operation or snapshot: {}", self.0)
    }
}

impl std::error::Error for DecodeError {}

/// What applying an operation did, for the application to print.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// `key` now holds the write stamped `stamp` (a value, or a tombstone).
    Wrote {
        /// The key.
        key: String,
        /// The write's stamp.
        stamp: Stamp,
    },
    /// A merge changed this many keys.
    Merged {
        /// Keys whose entry changed.
        changed: usize,
    },
}

impl Store {
    /// An empty store.
    pub fn new() -> Store {
        Store::default()
    }

    /// The value of `key`, if it has one.
    pub fn get(&self, key: &str) -> Option<&[u8]> {
        self.entries.get(key)?.value.as_deref()
    }

    /// The live keys and their values, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.entries
            .iter()
            .filter_map(|(k, e)| Some((k.as_str(), e.value.as_deref()?)))
    }

    /// The Lamport clock: how many writes this history applied, at least.
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// Whether no write was ever applied (a fresh member's store).
    pub fn is_pristine(&self) -> bool {
        self.clock == 0 && self.entries.is_empty()
    }

    /// Applies `op`, delivered from `writer` in the group's total order. Every member that
    /// applies the same operations in the same order from the same store ends in the same
    /// store.
    pub fn apply(&mut self, writer: [u8; 32], op: &Op) -> Applied {
        match op {
            Op::Put { key, value } => self.write(writer, key, Some(value.clone())),
            Op::Delete { key } => self.write(writer, key, None),
            Op::Merge(other) => Applied::Merged {
                changed: self.merge(other),
            },
        }
    }

    fn write(&mut self, writer: [u8; 32], key: &str, value: Option<Vec<u8>>) -> Applied {
        self.clock += 1;
        let stamp = Stamp {
            clock: self.clock,
            writer,
        };
        self.entries.insert(key.to_string(), Entry { value, stamp });
        Applied::Wrote {
            key: key.to_string(),
            stamp,
        }
    }

    /// Joins `other` into `self`: per key the winning entry ([`Entry::beats`]), and the larger
    /// clock. Returns how many keys changed. Commutative, associative and idempotent.
    pub fn merge(&mut self, other: &Store) -> usize {
        let mut changed = 0;
        for (key, theirs) in &other.entries {
            match self.entries.get(key) {
                Some(ours) if !theirs.beats(ours) => {}
                _ => {
                    self.entries.insert(key.clone(), theirs.clone());
                    changed += 1;
                }
            }
        }
        self.clock = self.clock.max(other.clock);
        changed
    }

    /// The store as bytes, for state transfer to a joiner (the facade's snapshot callback).
    pub fn snapshot(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.push(TAG_SNAPSHOT);
        self.put_body(&mut out);
        out
    }

    /// The store a snapshot describes.
    pub fn restore(bytes: &[u8]) -> Result<Store, DecodeError> {
        let mut r = Reader::new(bytes);
        r.magic()?;
        if r.u8()? != TAG_SNAPSHOT {
            return Err(DecodeError("not a snapshot"));
        }
        let store = Store::get_body(&mut r)?;
        r.end()?;
        Ok(store)
    }

    fn put_body(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.clock.to_be_bytes());
        out.extend_from_slice(&(self.entries.len() as u64).to_be_bytes());
        for (key, entry) in &self.entries {
            put_bytes(out, key.as_bytes());
            out.extend_from_slice(&entry.stamp.clock.to_be_bytes());
            out.extend_from_slice(&entry.stamp.writer);
            match &entry.value {
                None => out.push(0),
                Some(v) => {
                    out.push(1);
                    put_bytes(out, v);
                }
            }
        }
    }

    fn get_body(r: &mut Reader<'_>) -> Result<Store, DecodeError> {
        let clock = r.u64()?;
        let n = r.u64()?;
        let mut entries = BTreeMap::new();
        for _ in 0..n {
            let key = r.key()?;
            let stamp = Stamp {
                clock: r.u64()?,
                writer: r.array()?,
            };
            if stamp.clock > clock {
                return Err(DecodeError("an entry's stamp is past the clock"));
            }
            let value = match r.u8()? {
                0 => None,
                1 => Some(r.value()?),
                _ => return Err(DecodeError("bad value flag")),
            };
            if entries.insert(key, Entry { value, stamp }).is_some() {
                return Err(DecodeError("a key appears twice"));
            }
        }
        Ok(Store { entries, clock })
    }
}

impl Op {
    /// The operation's wire form.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        match self {
            Op::Put { key, value } => {
                out.push(TAG_PUT);
                put_bytes(&mut out, key.as_bytes());
                put_bytes(&mut out, value);
            }
            Op::Delete { key } => {
                out.push(TAG_DELETE);
                put_bytes(&mut out, key.as_bytes());
            }
            Op::Merge(store) => {
                out.push(TAG_MERGE);
                store.put_body(&mut out);
            }
        }
        out
    }

    /// Parses an operation; every length is checked against the bytes and the limits.
    pub fn decode(bytes: &[u8]) -> Result<Op, DecodeError> {
        let mut r = Reader::new(bytes);
        r.magic()?;
        let op = match r.u8()? {
            TAG_PUT => Op::Put {
                key: r.key()?,
                value: r.value()?,
            },
            TAG_DELETE => Op::Delete { key: r.key()? },
            TAG_MERGE => Op::Merge(Store::get_body(&mut r)?),
            _ => return Err(DecodeError("unknown operation")),
        };
        r.end()?;
        Ok(op)
    }
}

/// One member's copy of the store and the two rules that keep copies equal: apply what is
/// delivered, and on state transfer take the snapshot and hand back the old store to send as
/// an [`Op::Merge`]. No network: the glue (and the simulator test) calls it with what the
/// group reports.
#[derive(Clone, Debug, Default)]
pub struct Replica {
    /// The local copy.
    pub store: Store,
}

impl Replica {
    /// A fresh member's replica: an empty store.
    pub fn new() -> Replica {
        Replica {
            store: Store::new(),
        }
    }

    /// The bytes the group's snapshot callback returns: the store as of the last delivery.
    pub fn snapshot(&self) -> Vec<u8> {
        self.store.snapshot()
    }

    /// State transfer: the group hands this member a snapshot before its first delivery in
    /// the view it joined. The store becomes the snapshot; if the old store held writes (this
    /// member comes from another component of a partition), they come back as the operation
    /// to send on the reliable channel so that every member merges them at one point of the
    /// total order. A snapshot that does not decode leaves the store as it was.
    pub fn on_state(&mut self, snapshot: &[u8]) -> Result<Option<Op>, DecodeError> {
        let new = Store::restore(snapshot)?;
        let old = std::mem::replace(&mut self.store, new);
        if old.is_pristine() {
            return Ok(None);
        }
        Ok(Some(Op::Merge(old)))
    }

    /// A reliable delivery from `writer`: decoded and applied.
    pub fn on_deliver(&mut self, writer: [u8; 32], data: &[u8]) -> Result<Applied, DecodeError> {
        let op = Op::decode(data)?;
        Ok(self.store.apply(writer, &op))
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_be_bytes());
    out.extend_from_slice(b);
}

/// A bounds-checked cursor over received bytes.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader { rest: bytes }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.rest.len() < n {
            return Err(DecodeError("truncated"));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn magic(&mut self) -> Result<(), DecodeError> {
        if self.take(MAGIC.len())? != MAGIC {
            return Err(DecodeError("bad magic or version"));
        }
        Ok(())
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    fn bytes(&mut self, max: usize) -> Result<&'a [u8], DecodeError> {
        let len = u32::from_be_bytes(self.array()?) as usize;
        if len > max {
            return Err(DecodeError("a key or value over the limit"));
        }
        self.take(len)
    }

    fn key(&mut self) -> Result<String, DecodeError> {
        let b = self.bytes(MAX_KEY_LEN)?;
        String::from_utf8(b.to_vec()).map_err(|_| DecodeError("a key is not UTF-8"))
    }

    fn value(&mut self) -> Result<Vec<u8>, DecodeError> {
        Ok(self.bytes(MAX_VALUE_LEN)?.to_vec())
    }

    fn end(&self) -> Result<(), DecodeError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(DecodeError("trailing bytes"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 32] = [0xA; 32];
    const B: [u8; 32] = [0xB; 32];
    const C: [u8; 32] = [0xC; 32];

    fn put(key: &str, value: &str) -> Op {
        Op::Put {
            key: key.into(),
            value: value.as_bytes().to_vec(),
        }
    }

    fn del(key: &str) -> Op {
        Op::Delete { key: key.into() }
    }

    fn run(store: &mut Store, ops: &[([u8; 32], Op)]) {
        for (w, op) in ops {
            store.apply(*w, op);
        }
    }

    #[test]
    fn same_order_gives_same_store_and_the_later_write_wins() {
        let ops = [(A, put("x", "1")), (B, put("x", "2")), (C, put("y", "3"))];
        let (mut s1, mut s2) = (Store::new(), Store::new());
        run(&mut s1, &ops);
        run(&mut s2, &ops);
        assert_eq!(s1, s2);
        assert_eq!(s1.get("x"), Some(&b"2"[..]));
        assert_eq!(s1.get("y"), Some(&b"3"[..]));
        assert_eq!(s1.clock(), 3);
    }

    #[test]
    fn delete_leaves_a_tombstone_that_survives_a_snapshot() {
        let mut s = Store::new();
        run(&mut s, &[(A, put("x", "1")), (B, del("x"))]);
        assert_eq!(s.get("x"), None);
        assert_eq!(s.iter().count(), 0);
        let back = Store::restore(&s.snapshot()).unwrap();
        assert_eq!(back, s);
        assert!(!back.is_pristine());
    }

    #[test]
    fn operations_and_snapshots_round_trip() {
        let mut s = Store::new();
        run(
            &mut s,
            &[(A, put("k", "v")), (B, put("é", "")), (C, del("gone"))],
        );
        for op in [put("a", "b"), del("a"), Op::Merge(s.clone())] {
            assert_eq!(Op::decode(&op.encode()).unwrap(), op);
        }
        assert_eq!(Store::restore(&s.snapshot()).unwrap(), s);
        assert_eq!(
            Store::restore(&Store::new().snapshot()).unwrap(),
            Store::new()
        );
    }

    #[test]
    fn bad_bytes_are_refused_not_panicked_on() {
        let mut s = Store::new();
        run(&mut s, &[(A, put("k", "v")), (B, del("d"))]);
        let good = [
            put("key", "value").encode(),
            Op::Merge(s.clone()).encode(),
            s.snapshot(),
        ];
        for g in &good {
            // Every truncation, and one trailing byte, is refused.
            for n in 0..g.len() {
                assert!(Op::decode(&g[..n]).is_err() && Store::restore(&g[..n]).is_err());
            }
            let mut long = g.clone();
            long.push(0);
            assert!(Op::decode(&long).is_err() && Store::restore(&long).is_err());
            // Every single flipped byte either is refused or decodes to something that
            // encodes back to the same bytes (no panic either way).
            for i in 0..g.len() {
                let mut b = g.clone();
                b[i] ^= 0x80;
                if let Ok(op) = Op::decode(&b) {
                    assert_eq!(op.encode(), b);
                }
                if let Ok(st) = Store::restore(&b) {
                    assert_eq!(st.snapshot(), b);
                }
            }
        }
        // A length over the limit is refused before any allocation of that size.
        let mut huge = MAGIC.to_vec();
        huge.push(TAG_DELETE);
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(
            Op::decode(&huge),
            Err(DecodeError("a key or value over the limit"))
        );
        // A snapshot is not an operation, nor an operation a snapshot.
        assert!(Op::decode(&s.snapshot()).is_err());
        assert!(Store::restore(&put("a", "b").encode()).is_err());
    }

    /// Two components diverge from one common state; merging either way round, and merging
    /// twice, gives one store; a write after the merge wins over both sides' partition writes.
    #[test]
    fn merge_converges_whatever_the_order_and_later_writes_win() {
        let mut common = Store::new();
        run(
            &mut common,
            &[(A, put("x", "0")), (A, put("y", "0")), (A, put("z", "0"))],
        );
        // Big side: three writes; small side: five writes, so its clock runs ahead.
        let mut big = common.clone();
        run(
            &mut big,
            &[(A, put("x", "big")), (B, del("y")), (A, put("w", "big"))],
        );
        let mut small = common.clone();
        run(
            &mut small,
            &[
                (C, put("y", "small")),
                (C, put("z", "small1")),
                (C, put("z", "small2")),
                (C, put("v", "small")),
                (C, put("v", "small2")),
            ],
        );
        let mut m1 = big.clone();
        m1.merge(&small);
        let mut m2 = small.clone();
        m2.merge(&big);
        assert_eq!(m1, m2, "merge is commutative");
        let again = m1.clone();
        assert_eq!(m1.merge(&again), 0, "merge is idempotent");
        assert_eq!(m1.merge(&small), 0);
        assert_eq!(m1, m2);
        // Writes only one side made survive; on keys both wrote, the larger stamp wins: y was
        // deleted by the big side at clock 5 and written by the small side at clock 4, so
        // the delete (a tombstone) wins; z and v only the small side wrote.
        assert_eq!(m1.get("x"), Some(&b"big"[..]));
        assert_eq!(m1.get("w"), Some(&b"big"[..]));
        assert_eq!(m1.get("y"), None);
        assert_eq!(m1.get("z"), Some(&b"small2"[..]));
        assert_eq!(m1.get("v"), Some(&b"small2"[..]));
        assert_eq!(m1.clock(), small.clock().max(big.clock()));
        // After the merge, the next write (a smaller clock than small's on its own side) wins.
        m1.apply(A, &put("y", "after"));
        assert_eq!(m1.get("y"), Some(&b"after"[..]));
        let mut m3 = m1.clone();
        m3.merge(&small);
        m3.merge(&big);
        assert_eq!(m3, m1, "stale states merged late change nothing");
    }

    /// The merge as the example runs it: the members of the small component get the big
    /// component's snapshot by state transfer, then send their old state as an `Op::Merge`
    /// that every member applies in the same place of the total order.
    #[test]
    fn state_transfer_then_merge_op_gives_every_member_the_same_store() {
        let mut big = Store::new();
        run(&mut big, &[(A, put("a", "1")), (B, put("b", "1"))]);
        let mut small = Store::new();
        run(
            &mut small,
            &[(C, put("b", "2")), (C, put("c", "2")), (C, del("a"))],
        );
        // Member C: takes the snapshot, keeps its old store aside to send.
        let mut c = Store::restore(&big.snapshot()).unwrap();
        let merge = Op::decode(&Op::Merge(small.clone()).encode()).unwrap();
        // The total order of the merged view: a write from A, then C's merge, then a write.
        let order = [(A, put("a", "3")), (C, merge), (B, put("c", "4"))];
        let mut a = big.clone();
        run(&mut a, &order);
        run(&mut c, &order);
        assert_eq!(a, c);
        // b: big wrote it at clock 2, small at clock 1: big's write stays.
        assert_eq!(a.get("b"), Some(&b"1"[..]));
        assert_eq!(a.get("c"), Some(&b"4"[..]), "a write after the merge wins");
        // A's write to a was stamped before the merge in the new view, at big's clock + 1 = 3,
        // the same as small's delete of a; the writer byte breaks the tie (C > A).
        assert_eq!(a.get("a"), None);
    }

    /// Randomized: any interleaving of independent partition histories, merged in any order
    /// and any number of times, converges.
    #[test]
    fn random_partitions_converge() {
        let mut seed: u64 = 0x5eed;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let writers = [A, B, C];
        for _ in 0..200 {
            let mut base = Store::new();
            let sides: Vec<Store> = (0..3)
                .map(|_| {
                    let mut s = base.clone();
                    for _ in 0..(next() % 8) {
                        let key = format!("k{}", next() % 4);
                        let w = writers[(next() % 3) as usize];
                        if next() % 4 == 0 {
                            s.apply(w, &Op::Delete { key });
                        } else {
                            let value = format!("{}", next() % 100).into_bytes();
                            s.apply(w, &Op::Put { key, value });
                        }
                    }
                    s
                })
                .collect();
            let mut results = Vec::new();
            for perm in [[0, 1, 2], [2, 1, 0], [1, 0, 2], [1, 2, 0]] {
                let mut m = sides[perm[0]].clone();
                m.merge(&sides[perm[1]]);
                m.merge(&sides[perm[2]]);
                m.merge(&sides[perm[1]]);
                results.push(m);
            }
            assert!(results.windows(2).all(|w| w[0] == w[1]));
            base.merge(&results[0]);
            assert_eq!(base, results[0]);
        }
    }
}
