//! Node identities and the addresses the simulator gives them.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// The UDP port every simulated node listens on.
pub const NODE_PORT: u16 = 7000;

/// Hosts per /24: `.1` to `.254` (`.0` and `.255` are never used).
const HOSTS_PER_SUBNET: u32 = 254;

/// The most nodes one simulation can hold: 254 hosts in each of the 65 536 /24s of
/// `10.0.0.0/8`.
pub const MAX_NODES: usize = 254 * 256 * 256;

/// A node of a [`Sim`](crate::Sim), numbered from zero in the order it was added.
///
/// Node `n` lives at a fixed address, so a machine can be told its peers' addresses before
/// they exist: nodes 0 to 253 are `10.0.0.1:7000` to `10.0.0.254:7000`, node 254 is
/// `10.0.1.1:7000`, and so on through `10.255.255.254` (see [`NodeId::addr`]).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(u32);

impl NodeId {
    /// The node added `index`-th (from zero).
    ///
    /// # Panics
    /// If `index >= MAX_NODES`.
    pub const fn from_index(index: usize) -> Self {
        assert!(index < MAX_NODES, "node index beyond MAX_NODES");
        NodeId(index as u32)
    }

    /// Position of the node in the order nodes were added.
    pub const fn index(self) -> usize {
        self.0 as usize
    }

    /// The node's address: `10.a.b.h:7000` where `(a, b)` counts /24s and `h` runs from 1
    /// to 254 within each.
    pub fn addr(self) -> SocketAddr {
        let subnet = self.0 / HOSTS_PER_SUBNET;
        let host = self.0 % HOSTS_PER_SUBNET + 1;
        let ip = Ipv4Addr::new(10, (subnet >> 8) as u8, (subnet & 0xff) as u8, host as u8);
        SocketAddr::new(IpAddr::V4(ip), NODE_PORT)
    }

    /// The node that [`NodeId::addr`] maps to `addr`, whether or not a simulation holds that
    /// many nodes ([`Sim::node_by_addr`](crate::Sim::node_by_addr) also checks that).
    pub fn from_addr(addr: SocketAddr) -> Option<NodeId> {
        let IpAddr::V4(ip) = addr.ip() else {
            return None;
        };
        let [ten, hi, lo, host] = ip.octets();
        if ten != 10 || addr.port() != NODE_PORT || host == 0 || host == 255 {
            return None;
        }
        let subnet = (u32::from(hi) << 8) | u32::from(lo);
        Some(NodeId(subnet * HOSTS_PER_SUBNET + u32::from(host) - 1))
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for NodeId {
    /// `n` and the index, e.g. `n3`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_fixed_and_round_trip() {
        let a = |i| NodeId::from_index(i).addr();
        assert_eq!(a(0), "10.0.0.1:7000".parse().unwrap());
        assert_eq!(a(253), "10.0.0.254:7000".parse().unwrap());
        assert_eq!(a(254), "10.0.1.1:7000".parse().unwrap());
        assert_eq!(a(254 * 256), "10.1.0.1:7000".parse().unwrap());
        assert_eq!(a(MAX_NODES - 1), "10.255.255.254:7000".parse().unwrap());
        for i in [0, 1, 253, 254, 255, 508, 65_000, MAX_NODES - 1] {
            assert_eq!(NodeId::from_addr(a(i)), Some(NodeId::from_index(i)));
        }
        for bad in [
            "10.0.0.0:7000",
            "10.0.0.255:7000",
            "10.0.0.1:7001",
            "11.0.0.1:7000",
        ] {
            assert_eq!(NodeId::from_addr(bad.parse().unwrap()), None, "{bad}");
        }
        assert_eq!(NodeId::from_addr("[::1]:7000".parse().unwrap()), None);
    }

    #[test]
    #[should_panic(expected = "MAX_NODES")]
    fn too_many_nodes_is_caught() {
        let _ = NodeId::from_index(MAX_NODES);
    }
}
