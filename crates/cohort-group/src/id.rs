//! Who is in a group: member identities, view ids and views.

use cohort_channel::identity::PublicKey;
use cohort_kdc::PrincipalName;
use std::cmp::Ordering;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;

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
    list: Arc<[Member]>,
    /// Ranks sorted by member id.
    by_id: Arc<[u16]>,
    /// Ranks sorted by address.
    by_addr: Arc<[u16]>,
}

impl Members {
    /// The member list `list`, by rank. At most `u16::MAX` members (a view holds at most
    /// [`MAX_VIEW_MEMBERS`](crate::MAX_VIEW_MEMBERS)); beyond that the index covers only
    /// the first `u16::MAX`.
    pub fn new(list: Arc<[Member]>) -> Self {
        let n = list.len().min(usize::from(u16::MAX));
        let mut by_id: Vec<u16> = (0..n as u16).collect();
        by_id.sort_unstable_by(|a, b| list[usize::from(*a)].id.cmp(&list[usize::from(*b)].id));
        let mut by_addr: Vec<u16> = (0..n as u16).collect();
        by_addr.sort_unstable_by(|a, b| {
            addr_key(&list[usize::from(*a)].addr).cmp(&addr_key(&list[usize::from(*b)].addr))
        });
        Members {
            list,
            by_id: by_id.into(),
            by_addr: by_addr.into(),
        }
    }

    /// The rank of `id`, if listed (O(log n)).
    pub fn rank_of(&self, id: &MemberId) -> Option<usize> {
        let list = &self.list;
        self.by_id
            .binary_search_by(|r| list[usize::from(*r)].id.cmp(id))
            .ok()
            .map(|i| usize::from(self.by_id[i]))
    }

    /// The rank of the member reached at `addr`, if listed (O(log n)). With two members at
    /// one address (not in a well-formed view), one of them.
    pub fn rank_of_addr(&self, addr: &SocketAddr) -> Option<usize> {
        let list = &self.list;
        let key = addr_key(addr);
        self.by_addr
            .binary_search_by(|r| addr_key(&list[usize::from(*r)].addr).cmp(&key))
            .ok()
            .map(|i| usize::from(self.by_addr[i]))
    }

    /// The shared list itself.
    pub fn shared(&self) -> &Arc<[Member]> {
        &self.list
    }

    /// Whether `other` is the same shared list (no comparison of members).
    pub fn ptr_eq(&self, other: &Members) -> bool {
        Arc::ptr_eq(&self.list, &other.list)
    }
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
        &self.list
    }
}

impl From<Vec<Member>> for Members {
    fn from(list: Vec<Member>) -> Self {
        Members::new(list.into())
    }
}

impl From<Arc<[Member]>> for Members {
    fn from(list: Arc<[Member]>) -> Self {
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
        self.list.iter()
    }
}

impl PartialEq for Members {
    fn eq(&self, other: &Self) -> bool {
        self.ptr_eq(other) || self.list[..] == other.list[..]
    }
}

impl Eq for Members {}

impl fmt::Debug for Members {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.list.iter()).finish()
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
