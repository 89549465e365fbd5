//! The connection handshake as a sans-IO state machine.
//!
//! Both sides run the same machine, whichever dialled:
//!
//! 1. each sends HELLO: magic, protocol version, incarnation, a fresh random nonce, its name;
//! 2. on the peer's HELLO each checks the version (and, when dialling, that the peer is the
//!    node it meant to reach), then sends AUTH with
//!    `HMAC-SHA256(secret, label | own name | peer name | peer nonce | own nonce | own incarnation)`;
//! 3. on the peer's AUTH each recomputes the peer's proof and compares in constant time.
//!
//! The secret never crosses the wire, and a proof cannot be replayed because it covers the
//! verifier's fresh nonce. Every refusal is sent to the peer as a REFUSE frame with a reason
//! before the connection closes, so both sides log why.
//!
//! Randomness is passed in (the nonce), so tests are deterministic.

use std::collections::VecDeque;
use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::codec::Name;
use super::frame::{Auth, Frame, Hello, PROTOCOL_VERSION, Refuse, RefuseCode};

const LABEL: &[u8] = b"batchwire/1 auth";

/// What a node needs to run a handshake.
#[derive(Clone)]
pub struct HandshakeConfig {
    /// This node's name.
    pub name: Name,
    /// Random per process start; tells a restarted peer from the same one reconnecting.
    pub incarnation: u64,
    /// The cluster secret shared by every node.
    pub secret: Arc<[u8]>,
    /// When dialling: the name the peer at that address must have.
    pub expect_peer: Option<Name>,
}

impl std::fmt::Debug for HandshakeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandshakeConfig")
            .field("name", &self.name)
            .field("incarnation", &self.incarnation)
            .field("secret", &"<redacted>")
            .field("expect_peer", &self.expect_peer)
            .finish()
    }
}

/// Who the peer turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    pub name: Name,
    pub incarnation: u64,
}

/// Why a handshake failed. `peer` is the name the peer claimed, when it got that far.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error("protocol version mismatch: we speak {ours}, peer {peer:?} speaks {theirs}")]
    Version { peer: Name, ours: u16, theirs: u16 },
    #[error("cluster secret mismatch: the proof from peer {peer:?} does not verify")]
    Secret { peer: Name },
    #[error("expected to reach node {expected:?} but the peer is {got:?}")]
    WrongPeer { expected: Name, got: Name },
    #[error("peer claims our own name {0:?}")]
    SameName(Name),
    #[error("refused by peer{}: {reason}", peer.as_ref().map(|p| format!(" {p:?}")).unwrap_or_default())]
    Refused {
        peer: Option<Name>,
        code: RefuseCode,
        reason: String,
    },
    #[error("unexpected {got} frame during the handshake")]
    Unexpected { got: &'static str },
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

    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Process one frame from the peer. `Ok(Some(peer))` when the handshake completes.
    pub fn handle(&mut self, frame: Frame) -> Result<Option<PeerInfo>, HandshakeError> {
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
                if let Some(expected) = &self.cfg.expect_peer {
                    if *expected != h.name {
                        let e = HandshakeError::WrongPeer {
                            expected: expected.clone(),
                            got: h.name.clone(),
                        };
                        return Err(self.refuse(RefuseCode::Name, e));
                    }
                }
                let proof = self.proof(
                    &self.cfg.name,
                    &h.name,
                    &h.nonce,
                    &self.nonce,
                    self.cfg.incarnation,
                );
                self.out.push_back(Frame::Auth(Auth { proof }));
                self.peer = Some(h);
                self.state = State::AwaitAuth;
                Ok(None)
            }
            (State::AwaitAuth, Frame::Auth(a)) => {
                let Some(h) = self.peer.as_ref() else {
                    return Err(HandshakeError::Unexpected { got: "AUTH" });
                };
                let mut mac = self.mac();
                feed(
                    &mut mac,
                    &h.name,
                    &self.cfg.name,
                    &self.nonce,
                    &h.nonce,
                    h.incarnation,
                );
                if mac.verify_slice(&a.proof).is_err() {
                    let e = HandshakeError::Secret {
                        peer: h.name.clone(),
                    };
                    return Err(self.refuse(RefuseCode::Secret, e));
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

    /// Queue a REFUSE carrying the reason from the peer's point of view, and return `e`.
    fn refuse(&mut self, code: RefuseCode, e: HandshakeError) -> HandshakeError {
        let reason = match &e {
            HandshakeError::Version { ours, theirs, .. } => format!(
                "node {:?} speaks protocol version {ours}, you sent version {theirs}",
                self.cfg.name.as_str()
            ),
            HandshakeError::Secret { .. } => format!(
                "cluster secret mismatch: node {:?} could not verify your proof",
                self.cfg.name.as_str()
            ),
            HandshakeError::WrongPeer { expected, got } => format!(
                "node {:?} dialled this address expecting node {expected:?}, not {got:?}",
                self.cfg.name.as_str()
            ),
            other => format!("node {:?}: {other}", self.cfg.name.as_str()),
        };
        self.out.push_back(Frame::Refuse(Refuse { code, reason }));
        e
    }

    fn mac(&self) -> Hmac<Sha256> {
        // HMAC accepts keys of any length, so this cannot fail.
        <Hmac<Sha256> as Mac>::new_from_slice(&self.cfg.secret).expect("HMAC takes any key length")
    }

    fn proof(
        &self,
        me: &Name,
        peer: &Name,
        peer_nonce: &[u8; 16],
        my_nonce: &[u8; 16],
        inc: u64,
    ) -> [u8; 32] {
        let mut mac = self.mac();
        feed(&mut mac, me, peer, peer_nonce, my_nonce, inc);
        mac.finalize().into_bytes().into()
    }
}

/// The bytes a proof covers. `prover` is the node that computes the proof, `verifier` the
/// one that checks it; the verifier's nonce comes first.
fn feed(
    mac: &mut Hmac<Sha256>,
    prover: &Name,
    verifier: &Name,
    verifier_nonce: &[u8; 16],
    prover_nonce: &[u8; 16],
    prover_incarnation: u64,
) {
    mac.update(LABEL);
    for n in [prover, verifier] {
        mac.update(&[n.len() as u8]);
        mac.update(n.as_bytes());
    }
    mac.update(verifier_nonce);
    mac.update(prover_nonce);
    mac.update(&prover_incarnation.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(name: &str, secret: &[u8], expect: Option<&str>) -> HandshakeConfig {
        HandshakeConfig {
            name: Name::new(name).unwrap(),
            incarnation: name.len() as u64 * 1000,
            secret: secret.into(),
            expect_peer: expect.map(|e| Name::new(e).unwrap()),
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
        let mut a = Handshake::new(cfg("a", b"s3cret", Some("bb")), [1; 16]);
        let mut b = Handshake::new(cfg("bb", b"s3cret", None), [2; 16]);
        run(&mut a, &mut b);
        assert_eq!(a.peer().unwrap().name.as_str(), "bb");
        assert_eq!(a.peer().unwrap().incarnation, 2000);
        assert_eq!(b.peer().unwrap().name.as_str(), "a");
    }

    #[test]
    fn wrong_secret_is_refused_on_both_sides_naming_the_peer() {
        let mut a = Handshake::new(cfg("a", b"one", None), [1; 16]);
        let mut b = Handshake::new(cfg("b", b"two", None), [2; 16]);
        let (ra, rb) = run(&mut a, &mut b);
        assert!(!a.is_done() && !b.is_done());
        assert!(
            ra.iter()
                .any(|r| matches!(r, Err(HandshakeError::Secret { peer }) if peer.as_str() == "b")),
            "{ra:?}"
        );
        assert!(
            rb.iter()
                .any(|r| matches!(r, Err(HandshakeError::Secret { peer }) if peer.as_str() == "a")),
            "{rb:?}"
        );
    }

    #[test]
    fn wrong_version_is_refused_with_a_reason_the_peer_sees() {
        let mut a = Handshake::new(cfg("a", b"s", None), [1; 16]);
        // A future peer: hand-craft its hello with version 2.
        let hello = Frame::Hello(Hello {
            version: 2,
            incarnation: 5,
            nonce: [3; 16],
            name: Name::new("future").unwrap(),
        });
        let _ = a.poll_transmit();
        let err = a.handle(hello).unwrap_err();
        assert_eq!(
            err,
            HandshakeError::Version {
                peer: Name::new("future").unwrap(),
                ours: 1,
                theirs: 2
            }
        );
        let Some(Frame::Refuse(r)) = a.poll_transmit() else {
            panic!("no refuse sent")
        };
        assert_eq!(r.code, RefuseCode::Version);
        assert!(
            r.reason.contains("version 1") && r.reason.contains("version 2"),
            "{}",
            r.reason
        );
    }

    #[test]
    fn dialling_the_wrong_node_is_refused() {
        let mut a = Handshake::new(cfg("a", b"s", Some("b")), [1; 16]);
        let mut c = Handshake::new(cfg("c", b"s", None), [2; 16]);
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
    fn a_replayed_proof_fails_against_a_fresh_nonce() {
        // Record a's AUTH from one session and replay it into a session with a new nonce.
        let mut a = Handshake::new(cfg("a", b"s", None), [1; 16]);
        let mut b = Handshake::new(cfg("b", b"s", None), [2; 16]);
        let hello_a = a.poll_transmit().unwrap();
        let hello_b = b.poll_transmit().unwrap();
        a.handle(hello_b).unwrap();
        let auth_a = a.poll_transmit().unwrap();
        let mut b2 = Handshake::new(cfg("b", b"s", None), [3; 16]);
        let _ = b2.poll_transmit();
        b2.handle(hello_a).unwrap();
        assert!(matches!(
            b2.handle(auth_a),
            Err(HandshakeError::Secret { .. })
        ));
    }

    #[test]
    fn messages_before_authentication_are_a_protocol_error() {
        let mut a = Handshake::new(cfg("a", b"s", None), [1; 16]);
        let _ = a.poll_transmit();
        let err = a.handle(Frame::Goodbye).unwrap_err();
        assert_eq!(err, HandshakeError::Unexpected { got: "GOODBYE" });
    }
}
