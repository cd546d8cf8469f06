//! cohort-hop's wire format, version 2 (documented byte by byte in `docs/wire.md`).
//!
//! Every packet starts with a version byte and a type byte. Handshake packets carry the two
//! endpoints' overlay addresses so that a relay can forward them before it holds any state;
//! data packets carry a *flow header*: the pair id chosen by the initiator, the flow (the
//! direction bit and the association id) and the round.
//!
//! Parsing yields borrowed views; every read is bounds-checked and a packet with bytes left
//! over, a wrong count or an unknown type is [`Malformed`]. Nothing here checks
//! cryptography: that is the caller's job, after these cheap checks.

use crate::crypto::{ChainId, Element, CHAIN_ID_LEN, ELEMENT_LEN};
use cohort_core::wire::{Reader, Truncated, Writer};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The one version this code speaks.
pub const VERSION: u8 = 2;
/// Length of a pair id.
pub const PAIR_ID_LEN: usize = 8;
/// Length of an Ed25519 public key.
pub const PUBLIC_KEY_LEN: usize = 32;
/// Length of an Ed25519 signature.
pub const SIGNATURE_LEN: usize = 64;
/// Length of a return-routability cookie.
pub const COOKIE_LEN: usize = 16;
/// A Hello is padded to at least this many bytes, so that the Challenge it provokes is never
/// larger (72 bytes with two IPv6 addresses): a spoofed Hello cannot be amplified.
pub const HELLO_MIN_LEN: usize = 80;
/// Most MACs one S1 may carry (ALPHA-C's batch limit).
pub const MAX_S1_MACS: usize = 64;
/// Longest Merkle path an S2 may carry (a tree of up to 1024 leaves).
pub const MAX_PATH_LEN: usize = 10;
/// Bit of the flow field that says the flow runs from the responder to the initiator.
pub const FLOW_FROM_RESPONDER: u16 = 0x8000;
/// The association id in a flow field (and the highest association id).
pub const ASSOC_MASK: u16 = 0x7fff;

/// A pair id: chosen at random by the initiator, it names the two endpoints' relationship
/// at every hop.
pub type PairId = [u8; PAIR_ID_LEN];

/// The packet was not a well-formed version-1 packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Malformed;

impl From<Truncated> for Malformed {
    fn from(_: Truncated) -> Self {
        Malformed
    }
}

/// Packet types.
pub mod kind {
    /// Initiator's first packet, before any state.
    pub const HELLO: u8 = 0x01;
    /// Responder's return-routability challenge.
    pub const CHALLENGE: u8 = 0x02;
    /// Initiator's signed anchors, with the cookie.
    pub const SYN: u8 = 0x03;
    /// Responder's signed anchors, with the SYN's signed body echoed.
    pub const ACK: u8 = 0x04;
    /// Initiator's signed confirmation.
    pub const ACKACK: u8 = 0x05;
    /// A control message signed with the sender's identity key (chain renewals), outside
    /// the control association so that renewing its own chains cannot deadlock.
    pub const SIGNED: u8 = 0x06;
    /// First packet of a round: a chain element and MACs.
    pub const S1: u8 = 0x10;
    /// The verifier's acknowledgement of an S1.
    pub const A1: u8 = 0x11;
    /// A message with the round's disclosed key.
    pub const S2: u8 = 0x12;
    /// The verifier's delivery report.
    pub const A2: u8 = 0x13;
    /// A message on an unprotected flow (the no-security baseline).
    pub const PLAIN: u8 = 0x14;
}

/// The ALPHA mode of a flow, as a wire code.
pub mod mode_code {
    /// Unprotected: no authentication (baseline).
    pub const UNPROTECTED: u8 = 0;
    /// ALPHA-N.
    pub const N: u8 = 1;
    /// ALPHA-C.
    pub const C: u8 = 2;
    /// ALPHA-M.
    pub const M: u8 = 3;
}

/// A chain's public description: id, anchor, the anchor's index (the chain's length `n`)
/// and the first round it serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnchorInfo {
    /// The chain's id (hashed into every step).
    pub chain_id: ChainId,
    /// `h_n`.
    pub anchor: Element,
    /// `n`: the anchor's index; the chain serves `n / 2` rounds.
    pub length: u32,
    /// The first round the chain serves.
    pub start_round: u32,
}

/// Encoded size of an [`AnchorInfo`].
pub const ANCHOR_INFO_LEN: usize = CHAIN_ID_LEN + ELEMENT_LEN + 4 + 4;

impl AnchorInfo {
    fn read(r: &mut Reader<'_>) -> Result<Self, Truncated> {
        Ok(AnchorInfo {
            chain_id: r.array()?,
            anchor: r.array()?,
            length: r.u32()?,
            start_round: r.u32()?,
        })
    }

    /// Appends the encoding.
    pub fn write(&self, w: &mut Writer<'_>) {
        w.bytes(&self.chain_id)
            .bytes(&self.anchor)
            .u32(self.length)
            .u32(self.start_round);
    }
}

/// One side's signed part of the handshake: its key, the anchor of its signature chain for
/// its control flow, the anchor of its acknowledgment chain for the peer's control flow,
/// and an Ed25519 signature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SignedHello<'a> {
    /// The signer's Ed25519 public key.
    pub public_key: [u8; PUBLIC_KEY_LEN],
    /// Signature chain of the signer's control flow.
    pub control_sig: AnchorInfo,
    /// Acknowledgment chain for the peer's control flow.
    pub control_ack: AnchorInfo,
    /// The signature (see [`syn_signed_bytes`] and [`ack_signed_bytes`]).
    pub signature: &'a [u8],
}

/// Encoded size of a [`SignedHello`].
pub const SIGNED_HELLO_LEN: usize = PUBLIC_KEY_LEN + 2 * ANCHOR_INFO_LEN + SIGNATURE_LEN;

impl<'a> SignedHello<'a> {
    fn read(r: &mut Reader<'a>) -> Result<Self, Truncated> {
        Ok(SignedHello {
            public_key: r.array()?,
            control_sig: AnchorInfo::read(r)?,
            control_ack: AnchorInfo::read(r)?,
            signature: r.bytes(SIGNATURE_LEN)?,
        })
    }

    /// Appends the encoding.
    pub fn write(&self, w: &mut Writer<'_>) {
        w.bytes(&self.public_key);
        self.control_sig.write(w);
        self.control_ack.write(w);
        w.bytes(self.signature);
    }

    /// The part the signature covers (everything but the signature), appended to `out`.
    fn write_unsigned(&self, out: &mut Vec<u8>) {
        let mut w = Writer::new(out);
        w.bytes(&self.public_key);
        self.control_sig.write(&mut w);
        self.control_ack.write(&mut w);
    }
}

/// The two endpoints of a pair and the pair id: the routing part of every handshake packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandshakeHeader {
    /// The pair id.
    pub pair_id: PairId,
    /// The initiator's overlay address.
    pub initiator: SocketAddr,
    /// The responder's overlay address.
    pub responder: SocketAddr,
}

impl HandshakeHeader {
    fn read(r: &mut Reader<'_>) -> Result<Self, Malformed> {
        Ok(HandshakeHeader {
            pair_id: r.array()?,
            initiator: read_addr(r)?,
            responder: read_addr(r)?,
        })
    }

    fn write(&self, w: &mut Writer<'_>) {
        w.bytes(&self.pair_id);
        write_addr(w, self.initiator);
        write_addr(w, self.responder);
    }
}

/// The header of every data packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlowHeader {
    /// The pair id.
    pub pair_id: PairId,
    /// Direction bit ([`FLOW_FROM_RESPONDER`]) and association id.
    pub flow: u16,
    /// The round (for PLAIN packets: a sequence number).
    pub round: u32,
}

/// Encoded size of a [`FlowHeader`].
pub const FLOW_HEADER_LEN: usize = PAIR_ID_LEN + 2 + 4;

impl FlowHeader {
    fn read(r: &mut Reader<'_>) -> Result<Self, Truncated> {
        Ok(FlowHeader {
            pair_id: r.array()?,
            flow: r.u16()?,
            round: r.u32()?,
        })
    }

    /// Appends the encoding.
    pub fn write(&self, w: &mut Writer<'_>) {
        w.bytes(&self.pair_id).u16(self.flow).u32(self.round);
    }

    /// The encoding as bytes (bound into every MAC).
    pub fn to_bytes(&self) -> [u8; FLOW_HEADER_LEN] {
        let mut out = [0u8; FLOW_HEADER_LEN];
        out[..PAIR_ID_LEN].copy_from_slice(&self.pair_id);
        out[PAIR_ID_LEN..PAIR_ID_LEN + 2].copy_from_slice(&self.flow.to_be_bytes());
        out[PAIR_ID_LEN + 2..].copy_from_slice(&self.round.to_be_bytes());
        out
    }
}

/// The commitments an A1 carries when the flow asked for delivery reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReportCommitment {
    /// `H(ack secret)`.
    pub ack: Element,
    /// `H(nack secret)`.
    pub nack: Element,
    /// MAC over both, keyed with the ack-chain element the A2 will disclose.
    pub mac: Element,
}

/// A parsed packet, borrowing from the datagram.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Packet<'a> {
    /// Initiator -> responder, first contact.
    Hello(HandshakeHeader),
    /// Responder -> initiator: echo this cookie in the SYN.
    Challenge {
        /// Pair and endpoints.
        header: HandshakeHeader,
        /// The responder's clock when it made the cookie, in milliseconds.
        timestamp: u64,
        /// The cookie.
        cookie: [u8; COOKIE_LEN],
    },
    /// Initiator -> responder: cookie and signed anchors.
    Syn {
        /// Pair and endpoints.
        header: HandshakeHeader,
        /// From the Challenge.
        timestamp: u64,
        /// From the Challenge.
        cookie: [u8; COOKIE_LEN],
        /// The initiator's signed part.
        initiator: SignedHello<'a>,
    },
    /// Responder -> initiator: the SYN's signed part echoed, and the responder's.
    Ack {
        /// Pair and endpoints.
        header: HandshakeHeader,
        /// The initiator's signed part, as the responder accepted it.
        initiator: SignedHello<'a>,
        /// The responder's signed part.
        responder: SignedHello<'a>,
    },
    /// Initiator -> responder: signature over the ACK's signature.
    AckAck {
        /// Pair and endpoints.
        header: HandshakeHeader,
        /// The initiator's signature.
        signature: &'a [u8],
    },
    /// A control message under an Ed25519 signature.
    Signed {
        /// The pair.
        pair_id: PairId,
        /// Sent by the responder (else by the initiator).
        from_responder: bool,
        /// The control message ([`Control`]).
        message: &'a [u8],
        /// Signature over [`signed_envelope_bytes`].
        signature: &'a [u8],
    },
    /// First packet of a round.
    S1 {
        /// Pair, flow, round.
        header: FlowHeader,
        /// Mode code ([`mode_code`]).
        mode: u8,
        /// The newly disclosed signature-chain element.
        element: Element,
        /// Messages in the round.
        count: u16,
        /// MACs: one per message (N, C) or one over the Merkle root (M).
        macs: &'a [u8],
    },
    /// The verifier's acknowledgement of an S1.
    A1 {
        /// Pair, flow, round.
        header: FlowHeader,
        /// The newly disclosed acknowledgment-chain element.
        element: Element,
        /// Present when the flow has delivery reports.
        report: Option<ReportCommitment>,
    },
    /// One message of a round.
    S2 {
        /// Pair, flow, round.
        header: FlowHeader,
        /// The message's index in the round.
        index: u16,
        /// The round's MAC key, now disclosed.
        key: Element,
        /// Merkle authentication path (ALPHA-M only; empty otherwise).
        path: &'a [u8],
        /// The message.
        payload: &'a [u8],
    },
    /// The verifier's delivery report for a round.
    A2 {
        /// Pair, flow, round.
        header: FlowHeader,
        /// The acknowledgment-chain element the A1's MAC was keyed with.
        element: Element,
        /// 1: every message arrived (ack); 0: some did not (nack).
        delivered: bool,
        /// The ack or nack secret.
        secret: Element,
    },
    /// A message of an unprotected flow.
    Plain {
        /// Pair, flow, sequence number.
        header: FlowHeader,
        /// The message.
        payload: &'a [u8],
    },
}

impl<'a> Packet<'a> {
    /// Parses one datagram. Any leftover byte, bad count or unknown type is [`Malformed`].
    pub fn parse(bytes: &'a [u8]) -> Result<Packet<'a>, Malformed> {
        let mut r = Reader::new(bytes);
        if r.u8()? != VERSION {
            return Err(Malformed);
        }
        let kind = r.u8()?;
        let packet = match kind {
            kind::HELLO => {
                if bytes.len() < HELLO_MIN_LEN {
                    return Err(Malformed);
                }
                let header = HandshakeHeader::read(&mut r)?;
                // Padding: zeros only, so the padding cannot carry anything.
                if r.rest().iter().any(|&b| b != 0) {
                    return Err(Malformed);
                }
                Packet::Hello(header)
            }
            kind::CHALLENGE => Packet::Challenge {
                header: HandshakeHeader::read(&mut r)?,
                timestamp: r.u64()?,
                cookie: r.array()?,
            },
            kind::SYN => Packet::Syn {
                header: HandshakeHeader::read(&mut r)?,
                timestamp: r.u64()?,
                cookie: r.array()?,
                initiator: SignedHello::read(&mut r)?,
            },
            kind::ACK => Packet::Ack {
                header: HandshakeHeader::read(&mut r)?,
                initiator: SignedHello::read(&mut r)?,
                responder: SignedHello::read(&mut r)?,
            },
            kind::ACKACK => Packet::AckAck {
                header: HandshakeHeader::read(&mut r)?,
                signature: r.bytes(SIGNATURE_LEN)?,
            },
            kind::SIGNED => Packet::Signed {
                pair_id: r.array()?,
                from_responder: match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(Malformed),
                },
                message: r.u16_prefixed()?,
                signature: r.bytes(SIGNATURE_LEN)?,
            },
            kind::S1 => {
                let header = FlowHeader::read(&mut r)?;
                let mode = r.u8()?;
                let element = r.array()?;
                let count = r.u16()?;
                let macs = match mode {
                    mode_code::N if count == 1 => 1,
                    mode_code::C if (1..=MAX_S1_MACS as u16).contains(&count) => usize::from(count),
                    mode_code::M if (1..=1024).contains(&count) => 1,
                    _ => return Err(Malformed),
                };
                Packet::S1 {
                    header,
                    mode,
                    element,
                    count,
                    macs: r.bytes(macs * ELEMENT_LEN)?,
                }
            }
            kind::A1 => {
                let header = FlowHeader::read(&mut r)?;
                let element = r.array()?;
                let report = match r.u8()? {
                    0 => None,
                    1 => Some(ReportCommitment {
                        ack: r.array()?,
                        nack: r.array()?,
                        mac: r.array()?,
                    }),
                    _ => return Err(Malformed),
                };
                Packet::A1 {
                    header,
                    element,
                    report,
                }
            }
            kind::S2 => {
                let header = FlowHeader::read(&mut r)?;
                let index = r.u16()?;
                let key = r.array()?;
                let path_len = usize::from(r.u8()?);
                if path_len > MAX_PATH_LEN {
                    return Err(Malformed);
                }
                let path = r.bytes(path_len * ELEMENT_LEN)?;
                return Ok(Packet::S2 {
                    header,
                    index,
                    key,
                    path,
                    payload: r.rest(),
                });
            }
            kind::A2 => Packet::A2 {
                header: FlowHeader::read(&mut r)?,
                element: r.array()?,
                delivered: match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(Malformed),
                },
                secret: r.array()?,
            },
            kind::PLAIN => {
                return Ok(Packet::Plain {
                    header: FlowHeader::read(&mut r)?,
                    payload: r.rest(),
                })
            }
            _ => return Err(Malformed),
        };
        if !r.is_empty() {
            return Err(Malformed);
        }
        Ok(packet)
    }

    /// Appends the encoding to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        let start = out.len();
        let mut w = Writer::new(out);
        w.u8(VERSION);
        match self {
            Packet::Hello(header) => {
                w.u8(kind::HELLO);
                header.write(&mut w);
                let len = w.len() - start;
                if len < HELLO_MIN_LEN {
                    w.bytes(&[0u8; HELLO_MIN_LEN][..HELLO_MIN_LEN - len]);
                }
            }
            Packet::Challenge {
                header,
                timestamp,
                cookie,
            } => {
                w.u8(kind::CHALLENGE);
                header.write(&mut w);
                w.u64(*timestamp).bytes(cookie);
            }
            Packet::Syn {
                header,
                timestamp,
                cookie,
                initiator,
            } => {
                w.u8(kind::SYN);
                header.write(&mut w);
                w.u64(*timestamp).bytes(cookie);
                initiator.write(&mut w);
            }
            Packet::Ack {
                header,
                initiator,
                responder,
            } => {
                w.u8(kind::ACK);
                header.write(&mut w);
                initiator.write(&mut w);
                responder.write(&mut w);
            }
            Packet::AckAck { header, signature } => {
                w.u8(kind::ACKACK);
                header.write(&mut w);
                w.bytes(signature);
            }
            Packet::Signed {
                pair_id,
                from_responder,
                message,
                signature,
            } => {
                w.u8(kind::SIGNED)
                    .bytes(pair_id)
                    .u8(u8::from(*from_responder));
                // Control messages are far shorter than 64 KiB.
                let _ = w.u16_prefixed(message);
                w.bytes(signature);
            }
            Packet::S1 {
                header,
                mode,
                element,
                count,
                macs,
            } => {
                w.u8(kind::S1);
                header.write(&mut w);
                w.u8(*mode).bytes(element).u16(*count).bytes(macs);
            }
            Packet::A1 {
                header,
                element,
                report,
            } => {
                w.u8(kind::A1);
                header.write(&mut w);
                w.bytes(element);
                match report {
                    None => {
                        w.u8(0);
                    }
                    Some(c) => {
                        w.u8(1).bytes(&c.ack).bytes(&c.nack).bytes(&c.mac);
                    }
                }
            }
            Packet::S2 {
                header,
                index,
                key,
                path,
                payload,
            } => {
                w.u8(kind::S2);
                header.write(&mut w);
                // Path length fits: callers build paths of at most MAX_PATH_LEN elements.
                let path_len = u8::try_from(path.len() / ELEMENT_LEN).unwrap_or(u8::MAX);
                w.u16(*index)
                    .bytes(key)
                    .u8(path_len)
                    .bytes(path)
                    .bytes(payload);
            }
            Packet::A2 {
                header,
                element,
                delivered,
                secret,
            } => {
                w.u8(kind::A2);
                header.write(&mut w);
                w.bytes(element).u8(u8::from(*delivered)).bytes(secret);
            }
            Packet::Plain { header, payload } => {
                w.u8(kind::PLAIN);
                header.write(&mut w);
                w.bytes(payload);
            }
        }
    }

    /// The flow header of a data packet, `None` for handshake packets.
    pub fn flow_header(&self) -> Option<&FlowHeader> {
        match self {
            Packet::S1 { header, .. }
            | Packet::A1 { header, .. }
            | Packet::S2 { header, .. }
            | Packet::A2 { header, .. }
            | Packet::Plain { header, .. } => Some(header),
            _ => None,
        }
    }

    /// The handshake header of a handshake packet.
    pub fn handshake_header(&self) -> Option<&HandshakeHeader> {
        match self {
            Packet::Hello(header)
            | Packet::Challenge { header, .. }
            | Packet::Syn { header, .. }
            | Packet::Ack { header, .. }
            | Packet::AckAck { header, .. } => Some(header),
            _ => None,
        }
    }
}

/// What the initiator signs: a label, the handshake header and its part without the
/// signature.
pub fn syn_signed_bytes(header: &HandshakeHeader, part: &SignedHello<'_>) -> Vec<u8> {
    let mut out = b"cohort-hop v1 syn".to_vec();
    header.write(&mut Writer::new(&mut out));
    part.write_unsigned(&mut out);
    out
}

/// What the responder signs: a label, the handshake header, the initiator's signature (which
/// binds everything the initiator signed) and its own part without the signature.
pub fn ack_signed_bytes(
    header: &HandshakeHeader,
    initiator_signature: &[u8],
    part: &SignedHello<'_>,
) -> Vec<u8> {
    let mut out = b"cohort-hop v1 ack".to_vec();
    header.write(&mut Writer::new(&mut out));
    out.extend_from_slice(initiator_signature);
    part.write_unsigned(&mut out);
    out
}

/// What a [`Packet::Signed`] signs: a label, the pair id, the direction and the message.
pub fn signed_envelope_bytes(pair_id: &PairId, from_responder: bool, message: &[u8]) -> Vec<u8> {
    let mut out = b"cohort-hop v1 signed".to_vec();
    out.extend_from_slice(pair_id);
    out.push(u8::from(from_responder));
    out.extend_from_slice(message);
    out
}

/// What the initiator signs in its ACKACK: a label, the header and the responder's signature.
pub fn ackack_signed_bytes(header: &HandshakeHeader, responder_signature: &[u8]) -> Vec<u8> {
    let mut out = b"cohort-hop v1 ackack".to_vec();
    header.write(&mut Writer::new(&mut out));
    out.extend_from_slice(responder_signature);
    out
}

fn read_addr(r: &mut Reader<'_>) -> Result<SocketAddr, Malformed> {
    let ip = match r.u8()? {
        4 => IpAddr::V4(Ipv4Addr::from(r.array::<4>()?)),
        6 => IpAddr::V6(Ipv6Addr::from(r.array::<16>()?)),
        _ => return Err(Malformed),
    };
    Ok(SocketAddr::new(ip, r.u16()?))
}

fn write_addr(w: &mut Writer<'_>, addr: SocketAddr) {
    match addr.ip() {
        IpAddr::V4(ip) => w.u8(4).bytes(&ip.octets()),
        IpAddr::V6(ip) => w.u8(6).bytes(&ip.octets()),
    };
    w.u16(addr.port());
}

/// A control message: the payload of a message on a control flow (association 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Control<'a> {
    /// The sender opens an outgoing association: its mode and signed signature-chain anchor.
    Open {
        /// The new flow (direction bit of the sender, association id).
        flow: u16,
        /// Mode code.
        mode: u8,
        /// Messages per round (1 for N).
        batch: u16,
        /// Whether the sender wants A2 delivery reports.
        reports: bool,
        /// Rounds the sender may have in flight (1 to [`crate::guard::MAX_WINDOW`]); the
        /// signature chain is laid out for it ([`crate::guard::round_indices`]).
        window: u8,
        /// The signature chain (unused for unprotected flows, all zero).
        chain: AnchorInfo,
        /// Ed25519 signature over [`control_signed_bytes`].
        signature: &'a [u8],
    },
    /// The receiver accepts a flow and gives the anchor of its acknowledgment chain.
    OpenAck {
        /// The flow being accepted.
        flow: u16,
        /// The acknowledgment chain.
        chain: AnchorInfo,
        /// Ed25519 signature over [`control_signed_bytes`].
        signature: &'a [u8],
    },
    /// A chain of a flow is running out: here is the next one, from `chain.start_round` on.
    Renew {
        /// The flow.
        flow: u16,
        /// 0: the signature chain (from the flow's sender); 1: the acknowledgment chain.
        which: u8,
        /// The new chain.
        chain: AnchorInfo,
        /// Ed25519 signature over [`control_signed_bytes`].
        signature: &'a [u8],
    },
    /// The peer holds the renewed chain.
    RenewAck {
        /// The flow.
        flow: u16,
        /// Which chain.
        which: u8,
        /// The new chain's first round.
        start_round: u32,
    },
    /// The sender closes a flow (either end may).
    Close {
        /// The flow.
        flow: u16,
    },
    /// The peer has forgotten the flow.
    CloseAck {
        /// The flow.
        flow: u16,
    },
}

/// Control message codes.
pub mod control_code {
    /// [`super::Control::Open`].
    pub const OPEN: u8 = 1;
    /// [`super::Control::OpenAck`].
    pub const OPEN_ACK: u8 = 2;
    /// [`super::Control::Renew`].
    pub const RENEW: u8 = 3;
    /// [`super::Control::RenewAck`].
    pub const RENEW_ACK: u8 = 4;
    /// [`super::Control::Close`].
    pub const CLOSE: u8 = 5;
    /// [`super::Control::CloseAck`].
    pub const CLOSE_ACK: u8 = 6;
}

impl<'a> Control<'a> {
    /// The flow the message is about.
    pub fn flow(&self) -> u16 {
        match *self {
            Control::Open { flow, .. }
            | Control::OpenAck { flow, .. }
            | Control::Renew { flow, .. }
            | Control::RenewAck { flow, .. }
            | Control::Close { flow }
            | Control::CloseAck { flow } => flow,
        }
    }

    /// Parses a control message. Leftover bytes are [`Malformed`].
    pub fn parse(bytes: &'a [u8]) -> Result<Control<'a>, Malformed> {
        let mut r = Reader::new(bytes);
        let message = match r.u8()? {
            control_code::OPEN => Control::Open {
                flow: r.u16()?,
                mode: match r.u8()? {
                    m @ 0..=3 => m,
                    _ => return Err(Malformed),
                },
                batch: r.u16()?,
                reports: match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(Malformed),
                },
                window: match r.u8()? {
                    w @ 1..=crate::guard::MAX_WINDOW => w,
                    _ => return Err(Malformed),
                },
                chain: AnchorInfo::read(&mut r)?,
                signature: r.bytes(SIGNATURE_LEN)?,
            },
            control_code::OPEN_ACK => Control::OpenAck {
                flow: r.u16()?,
                chain: AnchorInfo::read(&mut r)?,
                signature: r.bytes(SIGNATURE_LEN)?,
            },
            control_code::RENEW => Control::Renew {
                flow: r.u16()?,
                which: match r.u8()? {
                    w @ 0..=1 => w,
                    _ => return Err(Malformed),
                },
                chain: AnchorInfo::read(&mut r)?,
                signature: r.bytes(SIGNATURE_LEN)?,
            },
            control_code::RENEW_ACK => Control::RenewAck {
                flow: r.u16()?,
                which: match r.u8()? {
                    w @ 0..=1 => w,
                    _ => return Err(Malformed),
                },
                start_round: r.u32()?,
            },
            control_code::CLOSE => Control::Close { flow: r.u16()? },
            control_code::CLOSE_ACK => Control::CloseAck { flow: r.u16()? },
            _ => return Err(Malformed),
        };
        if !r.is_empty() {
            return Err(Malformed);
        }
        Ok(message)
    }

    /// Appends the encoding to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        self.write_unsigned(out);
        match self {
            Control::Open { signature, .. }
            | Control::OpenAck { signature, .. }
            | Control::Renew { signature, .. } => out.extend_from_slice(signature),
            _ => {}
        }
    }

    /// Appends everything but the signature.
    fn write_unsigned(&self, out: &mut Vec<u8>) {
        let mut w = Writer::new(out);
        match self {
            Control::Open {
                flow,
                mode,
                batch,
                reports,
                window,
                chain,
                ..
            } => {
                w.u8(control_code::OPEN)
                    .u16(*flow)
                    .u8(*mode)
                    .u16(*batch)
                    .u8(u8::from(*reports))
                    .u8(*window);
                chain.write(&mut w);
            }
            Control::OpenAck { flow, chain, .. } => {
                w.u8(control_code::OPEN_ACK).u16(*flow);
                chain.write(&mut w);
            }
            Control::Renew {
                flow, which, chain, ..
            } => {
                w.u8(control_code::RENEW).u16(*flow).u8(*which);
                chain.write(&mut w);
            }
            Control::RenewAck {
                flow,
                which,
                start_round,
            } => {
                w.u8(control_code::RENEW_ACK)
                    .u16(*flow)
                    .u8(*which)
                    .u32(*start_round);
            }
            Control::Close { flow } => {
                w.u8(control_code::CLOSE).u16(*flow);
            }
            Control::CloseAck { flow } => {
                w.u8(control_code::CLOSE_ACK).u16(*flow);
            }
        }
    }
}

/// What an Open, OpenAck or Renew signs: a label, the pair id and the message without its
/// signature. Relays check it with the key they saw in the handshake.
pub fn control_signed_bytes(pair_id: &PairId, message: &Control<'_>) -> Vec<u8> {
    let mut out = b"cohort-hop v1 anchor".to_vec();
    out.extend_from_slice(pair_id);
    message.write_unsigned(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> HandshakeHeader {
        HandshakeHeader {
            pair_id: [7; 8],
            initiator: "10.0.0.1:7000".parse().unwrap(),
            responder: "[::1]:9".parse().unwrap(),
        }
    }

    fn anchor() -> AnchorInfo {
        AnchorInfo {
            chain_id: [1; 8],
            anchor: [2; 16],
            length: 64,
            start_round: 5,
        }
    }

    fn samples() -> Vec<Vec<u8>> {
        let sig = [9u8; SIGNATURE_LEN];
        let hello = SignedHello {
            public_key: [3; 32],
            control_sig: anchor(),
            control_ack: anchor(),
            signature: &sig,
        };
        let fh = FlowHeader {
            pair_id: [7; 8],
            flow: FLOW_FROM_RESPONDER | 3,
            round: 77,
        };
        let macs = [5u8; 48];
        let path = [6u8; 32];
        let packets = vec![
            Packet::Hello(header()),
            Packet::Challenge {
                header: header(),
                timestamp: 12,
                cookie: [4; 16],
            },
            Packet::Syn {
                header: header(),
                timestamp: 12,
                cookie: [4; 16],
                initiator: hello,
            },
            Packet::Ack {
                header: header(),
                initiator: hello,
                responder: hello,
            },
            Packet::AckAck {
                header: header(),
                signature: &sig,
            },
            Packet::S1 {
                header: fh,
                mode: mode_code::C,
                element: [1; 16],
                count: 3,
                macs: &macs,
            },
            Packet::A1 {
                header: fh,
                element: [1; 16],
                report: None,
            },
            Packet::A1 {
                header: fh,
                element: [1; 16],
                report: Some(ReportCommitment {
                    ack: [1; 16],
                    nack: [2; 16],
                    mac: [3; 16],
                }),
            },
            Packet::S2 {
                header: fh,
                index: 2,
                key: [8; 16],
                path: &path,
                payload: b"hello",
            },
            Packet::A2 {
                header: fh,
                element: [1; 16],
                delivered: true,
                secret: [2; 16],
            },
            Packet::Plain {
                header: fh,
                payload: b"plain",
            },
            Packet::Signed {
                pair_id: [7; 8],
                from_responder: true,
                message: b"\x05\x00\x04",
                signature: &sig,
            },
        ];
        packets
            .iter()
            .map(|p| {
                let mut out = Vec::new();
                p.write(&mut out);
                assert_eq!(Packet::parse(&out).as_ref(), Ok(p), "{p:?}");
                out
            })
            .collect()
    }

    #[test]
    fn packets_round_trip() {
        let all = samples();
        assert!(all[0].len() >= HELLO_MIN_LEN);
        assert!(
            all[0].len() >= all[1].len(),
            "a Hello is never smaller than its Challenge"
        );
    }

    #[test]
    fn truncations_and_extensions_are_malformed() {
        for bytes in samples() {
            let kind = bytes[1];
            for cut in 0..bytes.len() {
                let parsed = Packet::parse(&bytes[..cut]);
                // S2 and PLAIN end in a payload of any length: a cut inside the payload is
                // still a packet (its MAC will fail); a cut before it is not.
                if kind != kind::S2 && kind != kind::PLAIN {
                    assert_eq!(parsed, Err(Malformed), "kind {kind:#x} cut at {cut}");
                }
            }
            if kind != kind::S2 && kind != kind::PLAIN && kind != kind::HELLO {
                let mut longer = bytes.clone();
                longer.push(0);
                assert_eq!(Packet::parse(&longer), Err(Malformed), "kind {kind:#x}");
            }
        }
    }

    #[test]
    fn control_round_trips() {
        let sig = [9u8; SIGNATURE_LEN];
        let messages = [
            Control::Open {
                flow: 4,
                mode: mode_code::M,
                batch: 32,
                reports: true,
                window: 4,
                chain: anchor(),
                signature: &sig,
            },
            Control::OpenAck {
                flow: 4,
                chain: anchor(),
                signature: &sig,
            },
            Control::Renew {
                flow: 4,
                which: 1,
                chain: anchor(),
                signature: &sig,
            },
            Control::RenewAck {
                flow: 4,
                which: 0,
                start_round: 9,
            },
            Control::Close { flow: 4 },
            Control::CloseAck { flow: 4 },
        ];
        for m in messages {
            let mut out = Vec::new();
            m.write(&mut out);
            assert_eq!(Control::parse(&out), Ok(m.clone()));
            out.push(0);
            assert_eq!(Control::parse(&out), Err(Malformed));
        }
    }

    #[test]
    fn unknown_version_kind_and_counts_are_malformed() {
        assert_eq!(Packet::parse(&[2, kind::HELLO]), Err(Malformed));
        assert_eq!(Packet::parse(&[1, 0x7f]), Err(Malformed));
        let fh = FlowHeader {
            pair_id: [0; 8],
            flow: 1,
            round: 0,
        };
        for (mode, count) in [
            (mode_code::N, 2u16),
            (mode_code::C, 0),
            (mode_code::C, 65),
            (9, 1),
        ] {
            let mut out = vec![VERSION, kind::S1];
            fh.write(&mut Writer::new(&mut out));
            out.push(mode);
            out.extend_from_slice(&[0; 16]);
            out.extend_from_slice(&count.to_be_bytes());
            out.extend_from_slice(&vec![0; usize::from(count) * 16]);
            assert_eq!(
                Packet::parse(&out),
                Err(Malformed),
                "mode {mode} count {count}"
            );
        }
    }
}
