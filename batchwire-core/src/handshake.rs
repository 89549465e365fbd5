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
//! Randomness is passed in (the nonce), so tests are deterministic.

use std::collections::VecDeque;
use std::sync::Arc;

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
}

impl HandshakeError {
    /// The name the peer claimed, if it got that far.
    pub fn peer(&self) -> Option<&Name> {
        match self {
            HandshakeError::Version { peer, .. } | HandshakeError::Secret { peer } => Some(peer),
            HandshakeError::WrongPeer { got, .. } => Some(got),
            HandshakeError::SameName(p) | HandshakeError::WrongDirection(p) => Some(p),
            HandshakeError::Refused { peer, .. } => peer.as_ref(),
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
        matches!(self.cfg.role, Role::Dial { .. })
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
mod tests {
    use super::*;

    fn n(s: &str) -> Name {
        Name::new(s).unwrap()
    }

    fn dial(name: &str, secret: &[u8], expect: &str) -> HandshakeConfig {
        HandshakeConfig {
            name: n(name),
            incarnation: name.len() as u64 * 1000,
            secret: secret.into(),
            role: Role::Dial { expect: n(expect) },
        }
    }

    fn accept(name: &str, secret: &[u8], refuse: &[&str]) -> HandshakeConfig {
        HandshakeConfig {
            name: n(name),
            incarnation: name.len() as u64 * 1000,
            secret: secret.into(),
            role: Role::Accept {
                refuse: refuse.iter().map(|r| n(r)).collect(),
            },
        }
    }

    type Outcomes = Vec<Result<Option<PeerInfo>, HandshakeError>>;

    /// Shuttle frames between two machines until both are quiet.
    fn run(a: &mut Handshake, b: &mut Handshake) -> (Outcomes, Outcomes) {
        let (mut ra, mut rb) = (Vec::new(), Vec::new());
        for _ in 0..10 {
            let mut moved = false;
            while let Some(f) = a.poll_transmit() {
                moved = true;
                if b.state != State::Failed {
                    rb.push(b.handle(f));
                }
            }
            while let Some(f) = b.poll_transmit() {
                moved = true;
                if a.state != State::Failed {
                    ra.push(a.handle(f));
                }
            }
            if !moved {
                break;
            }
        }
        (ra, rb)
    }

    #[test]
    fn same_secret_authenticates_both_sides() {
        let mut a = Handshake::new(dial("a", b"s3cret", "bb"), [1; 16]);
        let mut b = Handshake::new(accept("bb", b"s3cret", &[]), [2; 16]);
        run(&mut a, &mut b);
        assert_eq!(a.peer().unwrap().name.as_str(), "bb");
        assert_eq!(a.peer().unwrap().incarnation, 2000);
        assert_eq!(b.peer().unwrap().name.as_str(), "a");
        assert_eq!(b.peer().unwrap().incarnation, 1000);
    }

    #[test]
    fn wrong_secret_is_refused_on_both_sides_naming_the_peer() {
        let mut a = Handshake::new(dial("a", b"one", "b"), [1; 16]);
        let mut b = Handshake::new(accept("b", b"two", &[]), [2; 16]);
        let (ra, rb) = run(&mut a, &mut b);
        assert!(!a.is_done() && !b.is_done());
        assert!(
            rb.iter()
                .any(|r| matches!(r, Err(HandshakeError::Secret { peer }) if peer.as_str() == "a")),
            "{rb:?}"
        );
        assert!(
            ra.iter().any(|r| matches!(
                r,
                Err(HandshakeError::Refused { peer: Some(p), code: RefuseCode::Secret, .. }) if p.as_str() == "b"
            )),
            "{ra:?}"
        );
    }

    #[test]
    fn the_acceptor_sends_no_proof_before_the_dialler_proves() {
        let mut b = Handshake::new(accept("b", b"s", &[]), [2; 16]);
        assert!(matches!(b.poll_transmit(), Some(Frame::Hello(_))));
        b.handle(Frame::Hello(Hello {
            version: PROTOCOL_VERSION,
            incarnation: 9,
            nonce: [3; 16],
            name: n("a"),
        }))
        .unwrap();
        assert_eq!(b.poll_transmit(), None, "no AUTH before the dialler's");
        assert!(matches!(
            b.handle(Frame::Auth(Auth { proof: [0; 32] })),
            Err(HandshakeError::Secret { .. })
        ));
        assert!(matches!(b.poll_transmit(), Some(Frame::Refuse(_))));
        assert_eq!(b.poll_transmit(), None, "still no AUTH after a bad proof");
    }

    /// The attack of issue 9: read `b`'s challenge, get `a` to answer it (by dialling `a`
    /// claiming to be `b` with `b`'s nonce), and hand the answer to `b` claiming to be `a`.
    /// With role-bound proofs and an acceptor that proves last, `a` never answers, and a
    /// dialler's proof made for `b` would not verify in the acceptor's role anyway.
    #[test]
    fn a_node_cannot_be_used_to_answer_another_nodes_challenge() {
        let secret = b"cluster";
        // The attacker dials b claiming "a" and reads b's HELLO.
        let mut b = Handshake::new(accept("b", secret, &[]), [0xb0; 16]);
        let Some(Frame::Hello(b_hello)) = b.poll_transmit() else {
            panic!()
        };
        b.handle(Frame::Hello(Hello {
            version: PROTOCOL_VERSION,
            incarnation: 1000,
            nonce: b_hello.nonce, // anything; reuse b's nonce as the relay would
            name: n("a"),
        }))
        .unwrap();
        // The attacker dials a claiming "b", with b's nonce and incarnation.
        let mut a = Handshake::new(accept("a", secret, &[]), [0xa0; 16]);
        let _ = a.poll_transmit();
        a.handle(Frame::Hello(Hello {
            version: PROTOCOL_VERSION,
            incarnation: b_hello.incarnation,
            nonce: b_hello.nonce,
            name: n("b"),
        }))
        .unwrap();
        assert_eq!(a.poll_transmit(), None, "a must not prove anything first");
        // Even a proof a made as a dialler to b (a real connection with other nonces)
        // does not verify here: the nonces differ. Try the best the attacker can get.
        let mut real_a = Handshake::new(dial("a", secret, "b"), [0xa1; 16]);
        let _ = real_a.poll_transmit();
        real_a.handle(Frame::Hello(b_hello.clone())).unwrap();
        let Some(Frame::Auth(stolen)) = real_a.poll_transmit() else {
            panic!()
        };
        assert!(matches!(
            b.handle(Frame::Auth(stolen)),
            Err(HandshakeError::Secret { .. })
        ));
    }

    #[test]
    fn a_proof_from_one_role_does_not_verify_in_the_other() {
        // Both sides use the same nonces and incarnations; only the label differs, so a
        // reflected proof would pass if the role were not bound.
        let mut acc = Handshake::new(accept("b", b"s", &[]), [5; 16]);
        let _ = acc.poll_transmit();
        acc.handle(Frame::Hello(Hello {
            version: PROTOCOL_VERSION,
            incarnation: acc.cfg.incarnation,
            nonce: [5; 16],
            name: n("a"),
        }))
        .unwrap();
        let reflected = acc.proof(ACCEPTOR);
        assert!(matches!(
            acc.handle(Frame::Auth(Auth { proof: reflected })),
            Err(HandshakeError::Secret { .. })
        ));
    }

    #[test]
    fn wrong_version_is_refused_with_a_reason_the_peer_sees() {
        let mut a = Handshake::new(accept("a", b"s", &[]), [1; 16]);
        // A future peer: hand-craft its hello with version 99.
        let hello = Frame::Hello(Hello {
            version: 99,
            incarnation: 5,
            nonce: [3; 16],
            name: n("future"),
        });
        let _ = a.poll_transmit();
        let err = a.handle(hello).unwrap_err();
        assert_eq!(
            err,
            HandshakeError::Version {
                peer: n("future"),
                ours: PROTOCOL_VERSION,
                theirs: 99
            }
        );
        let Some(Frame::Refuse(r)) = a.poll_transmit() else {
            panic!("no refuse sent")
        };
        assert_eq!(r.code, RefuseCode::Version);
        assert!(
            r.reason.contains(&format!("version {PROTOCOL_VERSION}"))
                && r.reason.contains("version 99"),
            "{}",
            r.reason
        );
    }

    #[test]
    fn dialling_the_wrong_node_is_refused() {
        let mut a = Handshake::new(dial("a", b"s", "b"), [1; 16]);
        let mut c = Handshake::new(accept("c", b"s", &[]), [2; 16]);
        let (ra, rc) = run(&mut a, &mut c);
        assert!(matches!(&ra[0], Err(HandshakeError::WrongPeer { .. })));
        assert!(
            matches!(
                &rc[..],
                [
                    ..,
                    Err(HandshakeError::Refused {
                        code: RefuseCode::Name,
                        ..
                    })
                ]
            ),
            "{rc:?}"
        );
    }

    #[test]
    fn an_inbound_connection_claiming_a_node_we_dial_is_refused() {
        let mut b = Handshake::new(dial("b", b"s", "a"), [1; 16]);
        let mut a = Handshake::new(accept("a", b"s", &["b"]), [2; 16]);
        let (rb, ra) = run(&mut b, &mut a);
        assert_eq!(ra[0], Err(HandshakeError::WrongDirection(n("b"))));
        let Some(Err(HandshakeError::Refused { code, reason, .. })) = rb.last() else {
            panic!("{rb:?}")
        };
        assert_eq!(*code, RefuseCode::Direction);
        assert!(reason.contains("sorts first"), "{reason}");
    }

    #[test]
    fn a_replayed_proof_fails_against_a_fresh_nonce() {
        // Record a's AUTH from one session and replay it into a session with a new nonce.
        let mut a = Handshake::new(dial("a", b"s", "b"), [1; 16]);
        let mut b = Handshake::new(accept("b", b"s", &[]), [2; 16]);
        let hello_a = a.poll_transmit().unwrap();
        let hello_b = b.poll_transmit().unwrap();
        a.handle(hello_b).unwrap();
        let auth_a = a.poll_transmit().unwrap();
        let mut b2 = Handshake::new(accept("b", b"s", &[]), [3; 16]);
        let _ = b2.poll_transmit();
        b2.handle(hello_a).unwrap();
        assert!(matches!(
            b2.handle(auth_a),
            Err(HandshakeError::Secret { .. })
        ));
    }

    #[test]
    fn messages_before_authentication_are_a_protocol_error() {
        let mut a = Handshake::new(accept("a", b"s", &[]), [1; 16]);
        let _ = a.poll_transmit();
        let err = a.handle(Frame::Goodbye).unwrap_err();
        assert_eq!(err, HandshakeError::Unexpected { got: "GOODBYE" });
        assert!(
            a.handle(Frame::Goodbye).is_err(),
            "a failed handshake stays failed"
        );
    }
}
