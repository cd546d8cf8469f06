//! What a handshake ends in: [`ChannelError`] (why a connection failed) and [`AuthResult`]
//! (how it was authenticated). Owns these two types only; shared by the connection and by
//! the caches of the long-lived endpoints. Must not reach up into `connection`, `cache` or
//! `endpoint`.

use crate::identity::PublicKey;
use crate::messages::{AlertCode, MessageError};
use crate::record::RecordError;
use crate::suite::AuthMode;

/// Why a connection failed. Every error is final: the connection sends nothing more
/// (except, where it helps the peer, one alert already queued).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChannelError {
    /// The peer's first bytes are not a cohort message: it does not speak cohort.
    NotCohort,
    /// A message did not parse.
    Message(MessageError),
    /// A frame of a type not allowed in the current state.
    UnexpectedFrame(u8),
    /// The peer refused the handshake.
    PeerAlert(AlertCode),
    /// No KEM suite, gear or authentication mode in common.
    NoCommonSuite,
    /// The peer chose something the client did not offer (a downgrade or a broken peer).
    BadChoice(&'static str),
    /// The KEM key share or ciphertext was malformed.
    BadKeyShare,
    /// A finished MAC did not verify: the two ends do not share a transcript and keys.
    KeyConfirmationFailed,
    /// The peer did not prove what the authentication mode requires.
    AuthenticationFailed,
    /// A record failed.
    Record(RecordError),
    /// The transport ended without the peer's close record: the stream was truncated.
    Truncated,
    /// Data was sent after a close, or before the handshake finished.
    NotReady,
    /// The crypto provider failed.
    Crypto,
    /// The datagram keys were already handed out.
    KeysTaken,
    /// The configuration cannot work (the message says why).
    Config(&'static str),
}

impl From<MessageError> for ChannelError {
    fn from(e: MessageError) -> Self {
        match e {
            MessageError::BadMagic => ChannelError::NotCohort,
            e => ChannelError::Message(e),
        }
    }
}

impl From<RecordError> for ChannelError {
    fn from(e: RecordError) -> Self {
        ChannelError::Record(e)
    }
}

impl std::fmt::Display for ChannelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChannelError::NotCohort => f.write_str("the peer does not speak cohort"),
            ChannelError::Message(e) => write!(f, "bad message: {e}"),
            ChannelError::UnexpectedFrame(t) => write!(f, "unexpected frame type {t:#04x}"),
            ChannelError::PeerAlert(a) => write!(f, "peer refused: {a}"),
            ChannelError::NoCommonSuite => f.write_str("no suite in common"),
            ChannelError::BadChoice(what) => write!(f, "peer chose a {what} that was not offered"),
            ChannelError::BadKeyShare => f.write_str("malformed key share or ciphertext"),
            ChannelError::KeyConfirmationFailed => f.write_str("key confirmation failed"),
            ChannelError::AuthenticationFailed => f.write_str("authentication failed"),
            ChannelError::Record(e) => write!(f, "record: {e}"),
            ChannelError::Truncated => f.write_str("stream truncated (no close from peer)"),
            ChannelError::NotReady => f.write_str("connection not ready for data"),
            ChannelError::Crypto => f.write_str("crypto provider failed"),
            ChannelError::KeysTaken => f.write_str("datagram keys already handed out"),
            ChannelError::Config(why) => write!(f, "configuration: {why}"),
        }
    }
}

impl std::error::Error for ChannelError {}

/// How the connection was authenticated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuthResult {
    /// The mode used.
    pub mode: AuthMode,
    /// For `ServerSignature`: the server key that signed.
    pub server_key: Option<PublicKey>,
    /// Whether this connection resumed an earlier one (it then inherits that one's
    /// authentication: only the two ends of it hold the next-session key).
    pub resumed: bool,
}

impl std::fmt::Display for AuthResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.mode, self.server_key) {
            (AuthMode::None, _) => f.write_str("unauthenticated (compare session IDs)")?,
            (AuthMode::ServerSignature, Some(k)) => write!(f, "server signature by {k}")?,
            (mode, _) => write!(f, "{mode} verified")?,
        }
        if self.resumed {
            f.write_str(", resumed")?;
        }
        Ok(())
    }
}
