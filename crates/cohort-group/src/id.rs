//! Who is in a group: member identities, view ids and views.

use cohort_channel::identity::PublicKey;
use cohort_kdc::PrincipalName;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::{Arc, Mutex, Weak};

/// A member: its Ed25519 public key, in the text form of `cohort keygen`
/// (`ed25519:<64 hex>`). Members are ordered by their key bytes; that order breaks ties
/// everywhere in the protocol (who founds a group, who is the server of a pair channel).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemberId(pub PublicKey);

impl MemberId {
    /// The 32 key bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        self.0.as_bytes()
    }

    /// The member with these key bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        MemberId(PublicKey::from_bytes(bytes))
    }
}

impl Ord for MemberId {
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl PartialOrd for MemberId {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl MemberId {
    /// A KDC-mode member: its principal name, padded with zero bytes to 32 (LSGC names
    /// members by a short null-terminated string; names are at most 31 bytes).
    pub fn from_principal(name: &PrincipalName) -> MemberId {
        let mut b = [0u8; 32];
        b[..name.as_bytes().len()].copy_from_slice(name.as_bytes());
        MemberId::from_bytes(b)
    }

    /// The principal name, if this id has the KDC form (a name and zero padding).
    pub fn principal(&self) -> Option<PrincipalName> {
        let b = self.as_bytes();
        let len = b.iter().position(|x| *x == 0)?;
        if len == 0 || b[len..].iter().any(|x| *x != 0) {
            return None;
        }
        PrincipalName::from_bytes(&b[..len]).ok()
    }
}

impl fmt::Display for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.principal() {
            Some(name) => write!(f, "kdc:{}", name.as_str()),
            None => fmt::Display::fmt(&self.0, f),
        }
    }
}

impl fmt::Debug for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Short form for logs: the first 4 bytes.
        write!(f, "m:{}", hex::encode(&self.as_bytes()[..4]))
    }
}

/// Why a member id does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemberIdParseError {
    /// Not an `ed25519:<64 hex>` public key.
    Key(cohort_channel::identity::PublicKeyParseError),
    /// Not a `kdc:<name>` principal (1 to 31 bytes of `A-Z a-z 0-9 . _ -`).
    Principal,
}

impl fmt::Display for MemberIdParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemberIdParseError::Key(e) => fmt::Display::fmt(e, f),
            MemberIdParseError::Principal => {
                f.write_str("a kdc principal is kdc:<1 to 31 bytes of A-Z a-z 0-9 . _ ->")
            }
        }
    }
}

impl std::error::Error for MemberIdParseError {}

impl FromStr for MemberId {
    type Err = MemberIdParseError;
    /// `ed25519:<64 hex>` (identity-key mode) or `kdc:<name>` (KDC mode).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(name) = s.strip_prefix("kdc:") {
            return PrincipalName::new(name)
                .map(|n| MemberId::from_principal(&n))
                .map_err(|_| MemberIdParseError::Principal);
        }
        PublicKey::from_str(s)
            .map(MemberId)
            .map_err(MemberIdParseError::Key)
    }
}

/// A view's id: a counter and the member that installed it (its coordinator). The
/// coordinator makes ids unique across the components of a partitioned group, whose
/// counters may coincide. Ordered by counter, then coordinator.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct ViewId {
    /// Grows by at least one with every view a member installs.
    pub seq: u64,
    /// The member that installed the view.
    pub coordinator: MemberId,
}

impl fmt::Display for ViewId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}",
            self.seq,
            hex::encode(&self.coordinator.as_bytes()[..4])
        )
    }
}

/// A member of a view and the address it is reached at.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Member {
    /// Its identity.
    pub id: MemberId,
    /// Its UDP address.
    pub addr: SocketAddr,
}

/// A view's member list, by rank: shared, not copied, when a view is cloned (a
/// `GroupEvent::View` or a kept old view costs a pointer, not 10,000 members), with an
/// index by id and by address so that looking a member up costs O(log n).
///
/// It dereferences to `[Member]`, so `members.len()`, `members[r]`, `members.iter()` and
/// `members.get(r)` work as on the `Vec<Member>` it replaces; build one with
/// `Members::from(vec)` or `collect()`.
#[derive(Clone)]
pub struct Members {
    inner: Arc<Indexed>,
}

struct Indexed {
    list: Box<[Member]>,
    /// Ranks sorted by member id.
    by_id: Box<[u16]>,
    /// Ranks sorted by address.
    by_addr: Box<[u16]>,
}

/// Lists built in this process, by a key that names their content (a view's roster
/// digest): members of one process (a simulator running thousands) share one copy of each
/// view's list instead of one each.
static INTERNED: Mutex<Option<HashMap<[u8; 32], Weak<Indexed>>>> = Mutex::new(None);

impl Members {
    /// The member list `list`, by rank. At most `u16::MAX` members (a view holds at most
    /// [`MAX_VIEW_MEMBERS`](crate::MAX_VIEW_MEMBERS)); beyond that the index covers only
    /// the first `u16::MAX`.
    pub fn new(list: Vec<Member>) -> Self {
        let list = list.into_boxed_slice();
        let n = list.len().min(usize::from(u16::MAX));
        let mut by_id: Vec<u16> = (0..n as u16).collect();
        by_id.sort_unstable_by(|a, b| list[usize::from(*a)].id.cmp(&list[usize::from(*b)].id));
        let mut by_addr: Vec<u16> = (0..n as u16).collect();
        by_addr.sort_unstable_by(|a, b| {
            addr_key(&list[usize::from(*a)].addr).cmp(&addr_key(&list[usize::from(*b)].addr))
        });
        Members {
            inner: Arc::new(Indexed {
                list,
                by_id: by_id.into_boxed_slice(),
                by_addr: by_addr.into_boxed_slice(),
            }),
        }
    }

    /// The list of the view that follows `base` by one change: the members of `base` at
    /// the ranks `survivors` (ascending, each below `base.len()`), in that order, then
    /// `joined`. The same list, and indexes that answer the same lookups, as
    /// [`Members::new`] of that concatenation, but built from `base`'s indexes: survivors
    /// keep their relative order, so each index is the old one with the leavers taken out
    /// and the ranks shifted down (moves of `u16`, no comparison of ids or addresses), and
    /// only the joiners are sorted and each put in place by a binary search. For a change
    /// of k members in a view of n: O(n + k log n) instead of two sorts of n with 32-byte
    /// comparisons (the leader's largest O(n log n) cost in a view change at 10,000). Any
    /// other `survivors` (unsorted, repeated, out of range) falls back to `Members::new`.
    pub fn changed(base: &Members, survivors: &[u16], joined: &[Member]) -> Members {
        let old = &base.inner;
        let n_old = old.list.len();
        let total = survivors.len() + joined.len();
        let well_formed = n_old <= usize::from(u16::MAX)
            && total <= usize::from(u16::MAX)
            && survivors.windows(2).all(|w| w[0] < w[1])
            && survivors.last().is_none_or(|r| usize::from(*r) < n_old);
        if !well_formed {
            let list: Vec<Member> = survivors
                .iter()
                .filter_map(|r| old.list.get(usize::from(*r)).copied())
                .chain(joined.iter().copied())
                .collect();
            return Members::new(list);
        }
        // Survivors come in runs of consecutive ranks (a change removes a few): each run
        // is copied whole.
        let mut list: Vec<Member> = Vec::with_capacity(total);
        let mut rest = survivors;
        while let Some(&first) = rest.first() {
            let run = rest
                .windows(2)
                .position(|w| w[1] != w[0] + 1)
                .map_or(rest.len(), |i| i + 1);
            let from = usize::from(first);
            list.extend_from_slice(&old.list[from..from + run]);
            rest = &rest[run..];
        }
        list.extend_from_slice(joined);
        let list = list.into_boxed_slice();
        // Old rank -> new rank (u16::MAX: left).
        let mut remap = vec![u16::MAX; n_old];
        for (new, r) in survivors.iter().enumerate() {
            remap[usize::from(*r)] = new as u16;
        }
        let first_joiner = survivors.len() as u16;
        let by_id = merge_index(&old.by_id, &remap, first_joiner, total as u16, |a, b| {
            list[usize::from(a)].id.cmp(&list[usize::from(b)].id)
        });
        let by_addr = merge_index(&old.by_addr, &remap, first_joiner, total as u16, |a, b| {
            addr_key(&list[usize::from(a)].addr).cmp(&addr_key(&list[usize::from(b)].addr))
        });
        Members {
            inner: Arc::new(Indexed {
                list,
                by_id,
                by_addr,
            }),
        }
    }

    /// The list this process holds under `key` (a roster digest that whoever interned it
    /// computed from its content), if any and if `same` accepts it.
    pub(crate) fn lookup(key: &[u8; 32], same: impl FnOnce(&[Member]) -> bool) -> Option<Members> {
        let guard = INTERNED.lock().unwrap_or_else(|e| e.into_inner());
        let inner = guard.as_ref()?.get(key).and_then(Weak::upgrade)?;
        same(&inner.list).then_some(Members { inner })
    }

    /// `list`, remembered under `key` (which the caller computed from its content) for
    /// [`Members::lookup`]: members of one process (a simulator running thousands) then
    /// share one copy of a view's list. Entries whose list is gone are pruned as it grows.
    pub(crate) fn intern(key: &[u8; 32], list: Vec<Member>) -> Members {
        Members::intern_built(key, Members::new(list))
    }

    /// As [`Members::intern`], for a list already built (by [`Members::changed`]).
    pub(crate) fn intern_built(key: &[u8; 32], m: Members) -> Members {
        let mut guard = INTERNED.lock().unwrap_or_else(|e| e.into_inner());
        let map = guard.get_or_insert_with(HashMap::new);
        if map.len() >= 64 {
            map.retain(|_, w| w.strong_count() > 0);
        }
        map.insert(*key, Arc::downgrade(&m.inner));
        m
    }

    /// The rank of `id`, if listed (O(log n)).
    pub fn rank_of(&self, id: &MemberId) -> Option<usize> {
        let list = &self.inner.list;
        let by_id = &self.inner.by_id;
        by_id
            .binary_search_by(|r| list[usize::from(*r)].id.cmp(id))
            .ok()
            .map(|i| usize::from(by_id[i]))
    }

    /// The rank of the member reached at `addr`, if listed (O(log n)). With two members at
    /// one address (not in a well-formed view), one of them.
    pub fn rank_of_addr(&self, addr: &SocketAddr) -> Option<usize> {
        let list = &self.inner.list;
        let by_addr = &self.inner.by_addr;
        let key = addr_key(addr);
        by_addr
            .binary_search_by(|r| addr_key(&list[usize::from(*r)].addr).cmp(&key))
            .ok()
            .map(|i| usize::from(by_addr[i]))
    }

    /// Whether `other` is the same shared list (no comparison of members).
    pub fn ptr_eq(&self, other: &Members) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

/// An index of the next view (ranks ordered by `cmp`) from the same index of the view
/// before: the survivors' entries in their old order, renumbered by `remap`, with the new
/// ranks `first_joiner..total` (the joiners) sorted and each inserted where a binary search
/// puts it.
fn merge_index(
    old: &[u16],
    remap: &[u16],
    first_joiner: u16,
    total: u16,
    cmp: impl Fn(u16, u16) -> std::cmp::Ordering,
) -> Box<[u16]> {
    let kept: Vec<u16> = old
        .iter()
        .map(|r| remap[usize::from(*r)])
        .filter(|r| *r != u16::MAX)
        .collect();
    let mut joiners: Vec<u16> = (first_joiner..total).collect();
    joiners.sort_unstable_by(|a, b| cmp(*a, *b));
    let mut out = Vec::with_capacity(usize::from(total));
    let mut from = 0;
    for j in joiners {
        let at = from + kept[from..].partition_point(|r| cmp(*r, j).is_lt());
        out.extend_from_slice(&kept[from..at]);
        out.push(j);
        from = at;
    }
    out.extend_from_slice(&kept[from..]);
    out.into_boxed_slice()
}

/// A total order on addresses for the index (`SocketAddr` orders V4 before V6 already,
/// but this keeps the order explicit and cheap).
fn addr_key(a: &SocketAddr) -> (u8, [u8; 16], u16) {
    match a.ip() {
        std::net::IpAddr::V4(ip) => {
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&ip.octets());
            (4, b, a.port())
        }
        std::net::IpAddr::V6(ip) => (6, ip.octets(), a.port()),
    }
}

impl std::ops::Deref for Members {
    type Target = [Member];
    fn deref(&self) -> &[Member] {
        &self.inner.list
    }
}

impl From<Vec<Member>> for Members {
    fn from(list: Vec<Member>) -> Self {
        Members::new(list)
    }
}

impl FromIterator<Member> for Members {
    fn from_iter<I: IntoIterator<Item = Member>>(iter: I) -> Self {
        Members::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl<'a> IntoIterator for &'a Members {
    type Item = &'a Member;
    type IntoIter = std::slice::Iter<'a, Member>;
    fn into_iter(self) -> Self::IntoIter {
        self.inner.list.iter()
    }
}

impl PartialEq for Members {
    fn eq(&self, other: &Self) -> bool {
        self.ptr_eq(other) || self.inner.list[..] == other.inner.list[..]
    }
}

impl Eq for Members {}

impl fmt::Debug for Members {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.inner.list.iter()).finish()
    }
}

/// A view: the members that see the same sequence of messages until the next view.
///
/// Members are listed by rank: the first is the leader (and sequencer); when the leader is
/// suspected, the next in rank takes over as coordinator. Joiners are appended, so rank is
/// seniority. Cloning a view shares its member list.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct View {
    /// The view's id.
    pub id: ViewId,
    /// The members, by rank (shared; indexed by id and address).
    pub members: Members,
    /// Counts group keys: grows by one with every fresh key (a rekey), not with every view.
    pub key_epoch: u64,
}

impl View {
    /// The leader: the first member.
    pub fn leader(&self) -> &Member {
        &self.members[0]
    }

    /// The rank of `id`, if it is a member (O(log n)).
    pub fn rank_of(&self, id: &MemberId) -> Option<usize> {
        self.members.rank_of(id)
    }

    /// The rank of the member reached at `addr`, if any (O(log n)).
    pub fn rank_of_addr(&self, addr: &SocketAddr) -> Option<usize> {
        self.members.rank_of_addr(addr)
    }

    /// Whether `id` is a member.
    pub fn contains(&self, id: &MemberId) -> bool {
        self.rank_of(id).is_some()
    }

    /// The member ids, by rank.
    pub fn ids(&self) -> impl Iterator<Item = MemberId> + '_ {
        self.members.iter().map(|m| m.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::ChaCha20Rng;
    use rand_core::{RngCore, SeedableRng};
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    fn random_member(rng: &mut ChaCha20Rng) -> Member {
        let mut id = [0u8; 32];
        rng.fill_bytes(&mut id);
        // Few distinct first bytes, so that comparisons go past the first byte.
        id[0] %= 4;
        let port = 7000 + (rng.next_u32() % 8) as u16;
        let addr = if rng.next_u32().is_multiple_of(4) {
            let mut b = [0u8; 16];
            rng.fill_bytes(&mut b);
            SocketAddr::new(IpAddr::V6(Ipv6Addr::from(b)), port)
        } else {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::from(rng.next_u32())), port)
        };
        Member {
            id: MemberId::from_bytes(id),
            addr,
        }
    }

    /// Every lookup `changed` answers, `new` answers the same way (and both find each
    /// member at its rank); both indexes are sorted.
    fn same_lookups(a: &Members, b: &Members, absent: &[Member]) {
        assert_eq!(a[..], b[..]);
        for (rank, m) in a.iter().enumerate() {
            assert_eq!(a.rank_of(&m.id), Some(rank));
            assert_eq!(b.rank_of(&m.id), Some(rank));
            assert_eq!(a.rank_of_addr(&m.addr), Some(rank));
            assert_eq!(b.rank_of_addr(&m.addr), Some(rank));
        }
        for m in absent {
            assert_eq!(a.rank_of(&m.id), None);
            assert_eq!(a.rank_of_addr(&m.addr), None);
        }
        let list = &a.inner.list;
        let ids = &a.inner.by_id;
        assert!(ids
            .windows(2)
            .all(|w| list[usize::from(w[0])].id <= list[usize::from(w[1])].id));
        let addrs = &a.inner.by_addr;
        assert!(addrs.windows(2).all(|w| {
            addr_key(&list[usize::from(w[0])].addr) <= addr_key(&list[usize::from(w[1])].addr)
        }));
        assert_eq!(ids.len(), list.len());
        assert_eq!(addrs.len(), list.len());
    }

    #[test]
    fn a_list_changed_from_its_base_answers_as_one_built_from_scratch() {
        let mut rng = ChaCha20Rng::seed_from_u64(14);
        for _ in 0..200 {
            let n = 1 + (rng.next_u32() % 300) as usize;
            let base: Members = (0..n).map(|_| random_member(&mut rng)).collect();
            // Leave out each member with some probability (all of them in some rounds).
            let keep = rng.next_u32() % 5;
            let mut survivors = Vec::new();
            let mut left = Vec::new();
            for r in 0..n as u16 {
                if rng.next_u32() % 5 >= keep {
                    survivors.push(r);
                } else {
                    left.push(base[usize::from(r)]);
                }
            }
            let k = (rng.next_u32() % 40) as usize;
            let joined: Vec<Member> = (0..k).map(|_| random_member(&mut rng)).collect();
            let changed = Members::changed(&base, &survivors, &joined);
            let list: Vec<Member> = survivors
                .iter()
                .map(|r| base[usize::from(*r)])
                .chain(joined.iter().copied())
                .collect();
            let fresh = Members::new(list);
            same_lookups(&changed, &fresh, &left);
        }
    }

    #[test]
    fn survivors_out_of_order_or_range_fall_back_to_a_fresh_build() {
        let mut rng = ChaCha20Rng::seed_from_u64(15);
        let base: Members = (0..20).map(|_| random_member(&mut rng)).collect();
        let joined = vec![random_member(&mut rng)];
        // Unsorted; past the end (rank 40 of 20 is dropped from the list, as `new` of the
        // same list would have it).
        for survivors in [vec![3u16, 1, 2], vec![0, 5, 40]] {
            let changed = Members::changed(&base, &survivors, &joined);
            let list: Vec<Member> = survivors
                .iter()
                .filter_map(|r| base.get(usize::from(*r)).copied())
                .chain(joined.iter().copied())
                .collect();
            same_lookups(&changed, &Members::new(list), &[]);
        }
    }
}
