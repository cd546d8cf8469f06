//! What a member received, by kind: for each group message type, the datagrams that
//! carried it and their bytes (counted once the packet opened, whole datagrams, framing
//! included), and the pair-channel, gossip and KDC datagrams (counted as they arrive,
//! whether or not they then open). For operators' metrics, and for the benchmarks' account
//! of where the bytes of a view change go.

use crate::wire::msg_type_name;

/// Datagrams of one kind and their bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Count {
    /// Datagrams.
    pub datagrams: u64,
    /// Their bytes, whole (headers and tags included).
    pub bytes: u64,
}

impl Count {
    /// Counts one more datagram, of `bytes`.
    pub fn add(&mut self, bytes: usize) {
        self.datagrams += 1;
        self.bytes += bytes as u64;
    }

    /// What was counted after `earlier` (a copy of this count taken before).
    pub fn since(self, earlier: Count) -> Count {
        Count {
            datagrams: self.datagrams.saturating_sub(earlier.datagrams),
            bytes: self.bytes.saturating_sub(earlier.bytes),
        }
    }

    fn plus(self, other: Count) -> Count {
        Count {
            datagrams: self.datagrams + other.datagrams,
            bytes: self.bytes + other.bytes,
        }
    }
}

/// Message type bytes are below this (the highest in use is 24).
const TYPES: usize = 32;

/// Datagrams received by kind ([`GroupMember::traffic`](crate::GroupMember::traffic)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    messages: [Count; TYPES],
    pair: Count,
    gossip: Count,
    kdc: Count,
}

impl Traffic {
    /// A protected group packet of `bytes` that opened and carried a message of type
    /// `msg_type` (its first byte; types past the table are not counted: they do not
    /// parse).
    pub(crate) fn message(&mut self, msg_type: u8, bytes: usize) {
        if let Some(c) = self.messages.get_mut(usize::from(msg_type)) {
            c.add(bytes);
        }
    }

    /// A pair-channel datagram of `bytes`.
    pub(crate) fn pair(&mut self, bytes: usize) {
        self.pair.add(bytes);
    }

    /// A gossip datagram of `bytes`.
    pub(crate) fn gossip(&mut self, bytes: usize) {
        self.gossip.add(bytes);
    }

    /// A datagram of `bytes` from the KDC (KDC mode).
    pub(crate) fn kdc(&mut self, bytes: usize) {
        self.kdc.add(bytes);
    }

    /// Every kind with at least one datagram: group messages by name (`"Install"`,
    /// `"FlushOks"`, ...) in type order, then `"pair channel"`, `"gossip"` and `"kdc"`.
    pub fn by_kind(&self) -> Vec<(&'static str, Count)> {
        let mut out: Vec<(&'static str, Count)> = self
            .messages
            .iter()
            .enumerate()
            .filter(|(_, c)| c.datagrams > 0)
            .map(|(t, c)| (msg_type_name(t as u8).unwrap_or("unknown"), *c))
            .collect();
        let others = [
            ("pair channel", self.pair),
            ("gossip", self.gossip),
            ("kdc", self.kdc),
        ];
        for (name, c) in others {
            if c.datagrams > 0 {
                out.push((name, c));
            }
        }
        out
    }

    /// All kinds together.
    pub fn total(&self) -> Count {
        self.messages
            .iter()
            .fold(self.pair.plus(self.gossip).plus(self.kdc), |a, c| {
                a.plus(*c)
            })
    }

    /// What was received after `earlier` (a copy of this member's counts taken before).
    pub fn since(&self, earlier: &Traffic) -> Traffic {
        let mut out = Traffic {
            pair: self.pair.since(earlier.pair),
            gossip: self.gossip.since(earlier.gossip),
            kdc: self.kdc.since(earlier.kdc),
            ..Traffic::default()
        };
        for (o, (now, then)) in out
            .messages
            .iter_mut()
            .zip(self.messages.iter().zip(&earlier.messages))
        {
            *o = now.since(*then);
        }
        out
    }

    /// Adds `other`'s counts to these (members summed).
    pub fn add(&mut self, other: &Traffic) {
        self.pair = self.pair.plus(other.pair);
        self.gossip = self.gossip.plus(other.gossip);
        self.kdc = self.kdc.plus(other.kdc);
        for (a, b) in self.messages.iter_mut().zip(&other.messages) {
            *a = a.plus(*b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_kind_difference_and_sum() {
        let mut t = Traffic::default();
        t.message(8, 300);
        t.message(24, 160);
        t.message(24, 162);
        t.message(200, 9); // no such type: not counted
        t.pair(1_000);
        let before = t.clone();
        t.message(24, 100);
        t.gossip(50);
        t.kdc(70);
        assert_eq!(
            before.by_kind(),
            vec![
                (
                    "Install",
                    Count {
                        datagrams: 1,
                        bytes: 300
                    }
                ),
                (
                    "InstallInView",
                    Count {
                        datagrams: 2,
                        bytes: 322
                    }
                ),
                (
                    "pair channel",
                    Count {
                        datagrams: 1,
                        bytes: 1_000
                    }
                ),
            ]
        );
        let d = t.since(&before);
        assert_eq!(
            d.by_kind(),
            vec![
                (
                    "InstallInView",
                    Count {
                        datagrams: 1,
                        bytes: 100
                    }
                ),
                (
                    "gossip",
                    Count {
                        datagrams: 1,
                        bytes: 50
                    }
                ),
                (
                    "kdc",
                    Count {
                        datagrams: 1,
                        bytes: 70
                    }
                ),
            ]
        );
        let mut sum = before.clone();
        sum.add(&d);
        assert_eq!(sum, t);
        assert_eq!(
            t.total(),
            Count {
                datagrams: 7,
                bytes: 1_842
            }
        );
    }
}
