//! The connection handshake as a sans-IO state machine.
//!
//! The two sides play different roles, and the proofs say which:
//!
//! 1. both send HELLO at once: magic, protocol version, incarnation, a fresh random nonce,
//!    the node's name. HELLO carries nothing that depends on the secret;
//! 2. the **dialler**, on the acceptor's HELLO, checks the version and that the peer is the
//!    node it meant to reach, then sends its AUTH:
//!    `HMAC-SHA256(secret, "dialler" | dialler name | acceptor name | dialler nonce |
//!    acceptor nonce | dialler incarnation | acceptor incarnation)`;
//! 3. the **acceptor**, on the dialler's HELLO, checks the version and the claimed name (not
//!    its own, and not a node it dials itself: of two peers, the name that sorts first dials);
//!    on the dialler's AUTH it verifies the proof and only then sends its own, computed the
//!    same way with the label "acceptor";
//! 4. the dialler verifies the acceptor's proof.
//!
//! Every proof binds the role, both names, both nonces and both incarnations, so no proof
//! computed in one connection or one role is accepted in another: a node can never be used
//! to sign the answer to another node's challenge (the relay attack of issue 9), and an
//! acceptor reveals nothing that depends on the secret to a client that has not proved it.
//! The secret never crosses the wire. Every refusal is sent to the peer as a REFUSE frame
//! with a reason before the connection closes, so both sides log why.
//!
//! A handshake has a deadline ([`Handshake::with_deadline`]): the IO layer asks for it
//! ([`Handshake::poll_timeout`]) and reports the time ([`Handshake::handle_timeout`]); not
//! done by then, it fails with [`HandshakeError::Timeout`], naming the peer if it said who
//! it is. Randomness (the nonce) and time are passed in, so tests are deterministic.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::codec::Name;
use super::frame::{Auth, Frame, Hello, PROTOCOL_VERSION, Refuse, RefuseCode};

const DIALLER: &[u8] = b"batchwire/2 auth: dialler";
const ACCEPTOR: &[u8] = b"batchwire/2 auth: acceptor";

/// Which end of the connection this node is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// This node dialled; the peer at that address must be `expect`.
    Dial {
        /// The node this node meant to reach.
        expect: Name,
    },
    /// This node dialled a seed's address to join its cluster, not knowing its name: any
    /// node but this one will do (it must still prove the secret).
    Join,
    /// This node accepted the connection. `refuse` lists the names this node dials itself:
    /// an inbound connection claiming one of them is refused before any proof is exchanged.
    Accept {
        /// Names of peers this node is responsible for dialling.
        refuse: Arc<[Name]>,
    },
}

/// What a node needs to run a handshake.
#[derive(Clone)]
pub struct HandshakeConfig {
    /// This node's name.
    pub name: Name,
    /// Random per process start; tells a restarted peer from the same one reconnecting.
    pub incarnation: u64,
    /// The cluster secret shared by every node.
    pub secret: Arc<[u8]>,
    /// Dialler or acceptor.
    pub role: Role,
}

impl std::fmt::Debug for HandshakeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandshakeConfig")
            .field("name", &self.name)
            .field("incarnation", &self.incarnation)
            .field("secret", &"<redacted>")
            .field("role", &self.role)
            .finish()
    }
}

/// Who the peer turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// The peer's node name (authenticated).
    pub name: Name,
    /// The peer's incarnation (authenticated: it is covered by the proofs).
    pub incarnation: u64,
}

/// Why a handshake failed. `peer` is the name the peer claimed, when it got that far.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The peer speaks another protocol version.
    #[error("protocol version mismatch: we speak {ours}, peer {peer:?} speaks {theirs}")]
    Version {
        /// The name the peer claimed.
        peer: Name,
        /// Our version.
        ours: u16,
        /// The peer's version.
        theirs: u16,
    },
    /// The peer's proof does not verify: it does not know the cluster secret (or it tried
    /// to pass off a proof made for another connection or role).
    #[error("cluster secret mismatch: the proof from peer {peer:?} does not verify")]
    Secret {
        /// The name the peer claimed.
        peer: Name,
    },
    /// We dialled an address and found another node there.
    #[error("expected to reach node {expected:?} but the peer is {got:?}")]
    WrongPeer {
        /// The node we meant to reach.
        expected: Name,
        /// The name the peer claimed.
        got: Name,
    },
    /// The peer claims to be this node.
    #[error("peer claims our own name {0:?}")]
    SameName(Name),
    /// An inbound connection claims a node that this node dials itself (the name that
    /// sorts first dials): a misconfigured peer, or someone pretending to be it.
    #[error(
        "inbound connection claims to be {0:?}, a node this node dials itself (the name that sorts first dials)"
    )]
    WrongDirection(Name),
    /// The peer refused us, with its reason.
    #[error("refused by peer{}: {reason}", peer.as_ref().map(|p| format!(" {p:?}")).unwrap_or_default())]
    Refused {
        /// The name the peer claimed, if it sent its HELLO first.
        peer: Option<Name>,
        /// The peer's refusal code.
        code: RefuseCode,
        /// The peer's explanation.
        reason: String,
    },
    /// A frame that has no place at this point of the handshake.
    #[error("unexpected {got} frame during the handshake")]
    Unexpected {
        /// The frame's kind.
        got: &'static str,
    },
    /// Not done within its time.
    #[error("timed out after {after:?}{}", peer.as_ref().map(|p| format!(" (peer {p:?})")).unwrap_or_default())]
    Timeout {
        /// The name the peer claimed, if its HELLO came.
        peer: Option<Name>,
        /// The time it had.
        after: Duration,
    },
}

impl HandshakeError {
    /// The name the peer claimed, if it got that far.
    pub fn peer(&self) -> Option<&Name> {
        match self {
            HandshakeError::Version { peer, .. } | HandshakeError::Secret { peer } => Some(peer),
            HandshakeError::WrongPeer { got, .. } => Some(got),
            HandshakeError::SameName(p) | HandshakeError::WrongDirection(p) => Some(p),
            HandshakeError::Refused { peer, .. } | HandshakeError::Timeout { peer, .. } => {
                peer.as_ref()
            }
            HandshakeError::Unexpected { .. } => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    AwaitHello,
    AwaitAuth,
    Done,
    Failed,
}

/// One side of a handshake. Feed it frames with [`Handshake::handle`]; send what
/// [`Handshake::poll_transmit`] gives, including after an error (the REFUSE).
pub struct Handshake {
    cfg: HandshakeConfig,
    nonce: [u8; 16],
    state: State,
    peer: Option<Hello>,
    out: VecDeque<Frame>,
    /// (started, deadline), if it has one.
    deadline: Option<(Instant, Instant)>,
}

impl Handshake {
    /// A handshake about to start; its HELLO is the first frame to transmit.
    pub fn new(cfg: HandshakeConfig, nonce: [u8; 16]) -> Self {
        let hello = Frame::Hello(Hello {
            version: PROTOCOL_VERSION,
            incarnation: cfg.incarnation,
            nonce,
            name: cfg.name.clone(),
        });
        Handshake {
            cfg,
            nonce,
            state: State::AwaitHello,
            peer: None,
            out: VecDeque::from([hello]),
            deadline: None,
        }
    }

    /// This handshake, started at `now`, fails if not done within `timeout`.
    pub fn with_deadline(mut self, now: Instant, timeout: Duration) -> Self {
        self.deadline = Some((now, now + timeout));
        self
    }

    /// When [`Handshake::handle_timeout`] must be called next: its deadline while it is
    /// neither done nor failed.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Done | State::Failed => None,
            State::AwaitHello | State::AwaitAuth => self.deadline.map(|(_, d)| d),
        }
    }

    /// The time is `now`: at or past the deadline, a handshake not yet done fails. Nothing
    /// is sent to the peer (it is too late to explain); the caller closes the connection.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), HandshakeError> {
        match (self.poll_timeout(), self.deadline) {
            (Some(d), Some((started, _))) if now >= d => {
                self.state = State::Failed;
                Err(HandshakeError::Timeout {
                    peer: self.peer.as_ref().map(|h| h.name.clone()),
                    after: d - started,
                })
            }
            _ => Ok(()),
        }
    }

    /// The next frame to send, if any.
    pub fn poll_transmit(&mut self) -> Option<Frame> {
        self.out.pop_front()
    }

    /// `Some` once the peer is authenticated.
    pub fn peer(&self) -> Option<PeerInfo> {
        match (self.state, &self.peer) {
            (State::Done, Some(h)) => Some(PeerInfo {
                name: h.name.clone(),
                incarnation: h.incarnation,
            }),
            _ => None,
        }
    }

    /// The name the peer claimed in its HELLO (not yet authenticated), if it sent one.
    pub fn claimed(&self) -> Option<&Name> {
        self.peer.as_ref().map(|h| &h.name)
    }

    /// Whether the peer is authenticated.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    fn dialling(&self) -> bool {
        matches!(self.cfg.role, Role::Dial { .. } | Role::Join)
    }

    /// Process one frame from the peer. `Ok(Some(peer))` when the handshake completes.
    pub fn handle(&mut self, frame: Frame) -> Result<Option<PeerInfo>, HandshakeError> {
        if matches!(self.state, State::Done | State::Failed) {
            return Err(HandshakeError::Unexpected {
                got: frame.kind_name(),
            });
        }
        let res = self.step(frame);
        if res.is_err() {
            self.state = State::Failed;
        }
        res
    }

    fn step(&mut self, frame: Frame) -> Result<Option<PeerInfo>, HandshakeError> {
        match (self.state, frame) {
            (_, Frame::Refuse(r)) => Err(HandshakeError::Refused {
                peer: self.peer.as_ref().map(|h| h.name.clone()),
                code: r.code,
                reason: r.reason,
            }),
            (State::AwaitHello, Frame::Hello(h)) => {
                self.check_hello(&h)?;
                self.peer = Some(h);
                self.state = State::AwaitAuth;
                // The dialler proves first; the acceptor waits for that proof.
                if self.dialling() {
                    let proof = self.proof(DIALLER);
                    self.out.push_back(Frame::Auth(Auth { proof }));
                }
                Ok(None)
            }
            (State::AwaitAuth, Frame::Auth(a)) => {
                let theirs = if self.dialling() { ACCEPTOR } else { DIALLER };
                let mut mac = self.mac();
                self.feed(&mut mac, theirs);
                if mac.verify_slice(&a.proof).is_err() {
                    let peer = self.claimed().cloned().unwrap_or(Name::from_static(""));
                    return Err(self.refuse(RefuseCode::Secret, HandshakeError::Secret { peer }));
                }
                // Only now, with the dialler proven, does the acceptor prove itself.
                if !self.dialling() {
                    let proof = self.proof(ACCEPTOR);
                    self.out.push_back(Frame::Auth(Auth { proof }));
                }
                self.state = State::Done;
                Ok(self.peer())
            }
            (_, other) => {
                let e = HandshakeError::Unexpected {
                    got: other.kind_name(),
                };
                Err(self.refuse(RefuseCode::Protocol, e))
            }
        }
    }

    /// The peer's HELLO: version, and a name this node will talk to in this role.
    fn check_hello(&mut self, h: &Hello) -> Result<(), HandshakeError> {
        if h.version != PROTOCOL_VERSION {
            let e = HandshakeError::Version {
                peer: h.name.clone(),
                ours: PROTOCOL_VERSION,
                theirs: h.version,
            };
            return Err(self.refuse(RefuseCode::Version, e));
        }
        if h.name == self.cfg.name {
            let e = HandshakeError::SameName(h.name.clone());
            return Err(self.refuse(RefuseCode::Name, e));
        }
        match &self.cfg.role {
            Role::Dial { expect } if *expect != h.name => {
                let e = HandshakeError::WrongPeer {
                    expected: expect.clone(),
                    got: h.name.clone(),
                };
                Err(self.refuse(RefuseCode::Name, e))
            }
            Role::Accept { refuse } if refuse.contains(&h.name) => {
                let e = HandshakeError::WrongDirection(h.name.clone());
                Err(self.refuse(RefuseCode::Direction, e))
            }
            _ => Ok(()),
        }
    }

    /// Queue a REFUSE carrying the reason from the peer's point of view, and return `e`.
    fn refuse(&mut self, code: RefuseCode, e: HandshakeError) -> HandshakeError {
        let me = self.cfg.name.as_str();
        let reason = match &e {
            HandshakeError::Version { ours, theirs, .. } => {
                format!("node {me:?} speaks protocol version {ours}, you sent version {theirs}")
            }
            HandshakeError::Secret { .. } => {
                format!("cluster secret mismatch: node {me:?} could not verify your proof")
            }
            HandshakeError::WrongPeer { expected, got } => {
                format!("node {me:?} dialled this address expecting node {expected:?}, not {got:?}")
            }
            HandshakeError::WrongDirection(p) => format!(
                "node {me:?} dials {p:?} itself (the name that sorts first dials); {p:?} must not dial {me:?}"
            ),
            other => format!("node {me:?}: {other}"),
        };
        self.out.push_back(Frame::Refuse(Refuse { code, reason }));
        e
    }

    fn mac(&self) -> Hmac<Sha256> {
        // HMAC accepts keys of any length, so this cannot fail.
        <Hmac<Sha256> as Mac>::new_from_slice(&self.cfg.secret).expect("HMAC takes any key length")
    }

    fn proof(&self, label: &[u8]) -> [u8; 32] {
        let mut mac = self.mac();
        self.feed(&mut mac, label);
        mac.finalize().into_bytes().into()
    }

    /// The bytes a proof covers: the role's label, then the dialler's name, nonce and
    /// incarnation and the acceptor's, whichever side computes it. Only called once the
    /// peer's HELLO is in.
    fn feed(&self, mac: &mut Hmac<Sha256>, label: &[u8]) {
        let Some(peer) = &self.peer else { return };
        let me = (&self.cfg.name, &self.nonce, self.cfg.incarnation);
        let them = (&peer.name, &peer.nonce, peer.incarnation);
        let (d, a) = if self.dialling() {
            (me, them)
        } else {
            (them, me)
        };
        mac.update(&[label.len() as u8]);
        mac.update(label);
        for n in [d.0, a.0] {
            mac.update(&[n.len() as u8]);
            mac.update(n.as_bytes());
        }
        mac.update(d.1);
        mac.update(a.1);
        mac.update(&d.2.to_le_bytes());
        mac.update(&a.2.to_le_bytes());
    }
}

#[cfg(test)]
mod tests;
