//! Membership datagrams: how a MEMBER body (a SWIM packet or a leave notice) travels over
//! UDP, sealed so that only holders of the cluster secret can make one, nobody else can
//! read one, and none can be replayed.
//!
//! ```text
//! magic "BWM" | version 2 | sender name (u8 length, UTF-8) | boot u64 LE | counter u64 LE
//!   | receiver's boot u64 LE | ChaCha20-Poly1305(body) with its 16-byte tag
//! ```
//!
//! - **Keys.** The master key is HMAC-SHA256(cluster secret, "batchwire membership
//!   datagrams v1"). Each sender boot seals with its own key, HMAC-SHA256(master, "sender"
//!   | name | boot), so the nonce (the counter, never repeated within a boot) is unique per
//!   key although every member shares the secret.
//! - **What the tag covers**: the whole header (the receiver's boot with it) and the
//!   *receiver's* name (not sent), so a datagram meant for one member, or for an earlier
//!   boot of it, is refused by every other.
//! - **Replays**: the receiver keeps per sender the newest boot and a window of the last 64
//!   counters ([`ReplayGuard`], bounded); an older boot, a counter seen before or one that
//!   fell out of the window is refused. A receiver that restarted knows no window, but it
//!   takes only datagrams sealed for its own boot, which no one could have recorded before
//!   it started: an old datagram (a leave notice, a full state) replayed to it after a
//!   restart is refused as stale ([`DatagramError::Stale`]), not believed.
//! - **Trust**: a datagram that opens proves its sender holds the secret, as a handshake
//!   does. (With TLS, certificates bind names to connections; a datagram's sender name is
//!   bound only by the secret: a member that went bad could speak for another here, and
//!   SWIM's own checks, the rate limit and the view's bounds are what limit it.)

use hmac::{Hmac, Mac};
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
use sha2::Sha256;

use crate::codec::{Name, NameHash};

/// The first bytes of every membership datagram.
pub const MAGIC: [u8; 3] = *b"BWM";
/// The datagram format's version.
pub const VERSION: u8 = 2;
/// The AEAD tag's length.
pub const TAG_LEN: usize = 16;
/// The largest datagram: the largest header, a MEMBER body (tag byte + the largest SWIM
/// packet) and the AEAD tag. A receive buffer of this size holds any valid datagram.
pub const MAX_DATAGRAM: usize = 3 + 1 + 1 + 255 + 8 + 8 + 8 + 1 + super::MAX_PACKET + TAG_LEN;
/// The replay window: counters this far below the newest seen are still taken (once).
pub const WINDOW: u64 = 64;

type HmacSha256 = Hmac<Sha256>;

/// Why a datagram was refused. Each is counted by the receiver; none is believed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DatagramError {
    #[error(
        "datagram of {len} bytes is not a membership datagram (too short, too long or no magic)"
    )]
    NotOurs { len: usize },
    #[error("membership datagram of version {0}, this node speaks {VERSION}")]
    Version(u8),
    #[error("membership datagram with a malformed header: {0}")]
    Malformed(&'static str),
    #[error(
        "membership datagram from {sender:?} does not open with the cluster key (forged, damaged, another cluster, or meant for another member)"
    )]
    Forged { sender: String },
    #[error("membership datagram from {sender:?} replayed (boot {boot}, counter {counter})")]
    Replayed {
        sender: String,
        boot: u64,
        counter: u64,
    },
    /// Sealed for another boot of this node: as a rule one that ran before (a datagram
    /// recorded then and replayed, or a sender that has not heard of the restart yet).
    /// Checked before the tag: the boot named may also be made up.
    #[error(
        "membership datagram from {sender:?} was meant for another boot of this node ({to_boot}), not this one"
    )]
    Stale { sender: String, to_boot: u64 },
}

/// The master key, from the cluster secret.
#[derive(Clone)]
pub struct DatagramKey([u8; 32]);

impl std::fmt::Debug for DatagramKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DatagramKey(<redacted>)")
    }
}

impl DatagramKey {
    pub fn from_secret(secret: &[u8]) -> DatagramKey {
        let mut m = <HmacSha256 as Mac>::new_from_slice(secret).expect("HMAC takes any key");
        m.update(b"batchwire membership datagrams v1");
        DatagramKey(m.finalize().into_bytes().into())
    }

    /// The key one boot of one sender seals with.
    fn sender_key(&self, sender: &[u8], boot: u64) -> LessSafeKey {
        let mut m = <HmacSha256 as Mac>::new_from_slice(&self.0).expect("HMAC takes any key");
        m.update(b"sender");
        m.update(&[sender.len() as u8]);
        m.update(sender);
        m.update(&boot.to_le_bytes());
        let k: [u8; 32] = m.finalize().into_bytes().into();
        LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &k).expect("a 32-byte key"))
    }
}

fn nonce(counter: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_le_bytes());
    Nonce::assume_unique_for_key(n)
}

/// The additional data: the header as sent, then the receiver's name.
fn aad(header: &[u8], to: &[u8]) -> Vec<u8> {
    let mut a = Vec::with_capacity(header.len() + 1 + to.len());
    a.extend_from_slice(header);
    a.push(to.len() as u8);
    a.extend_from_slice(to);
    a
}

/// This node's sealing side: its name, its boot (the incarnation) and the counter.
pub struct Sealer {
    key: LessSafeKey,
    name: Name,
    boot: u64,
    counter: u64,
}

impl Sealer {
    pub fn new(master: &DatagramKey, name: Name, boot: u64) -> Sealer {
        Sealer {
            key: master.sender_key(name.as_bytes(), boot),
            name,
            boot,
            counter: 0,
        }
    }

    /// The datagram carrying `body` to the member called `to`, in its boot `to_boot` (its
    /// identity's `started`).
    pub fn seal(&mut self, to: &[u8], to_boot: u64, body: &[u8]) -> Vec<u8> {
        self.counter += 1;
        let mut out = Vec::with_capacity(MAX_DATAGRAM.min(body.len() + 300));
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        self.name.encode(&mut out);
        out.extend_from_slice(&self.boot.to_le_bytes());
        out.extend_from_slice(&self.counter.to_le_bytes());
        out.extend_from_slice(&to_boot.to_le_bytes());
        let header = out.len();
        out.extend_from_slice(body);
        let mut sealed = out.split_off(header);
        self.key
            .seal_in_place_append_tag(nonce(self.counter), Aad::from(aad(&out, to)), &mut sealed)
            .expect("a body far below the AEAD's limit");
        out.extend_from_slice(&sealed);
        out
    }

    /// Datagrams sealed so far.
    pub fn sealed(&self) -> u64 {
        self.counter
    }
}

/// A datagram that opened: who sent it, and the MEMBER body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    pub sender: Name,
    pub boot: u64,
    pub counter: u64,
    pub body: Vec<u8>,
}

/// Open a datagram meant for the member called `me`, in its boot `my_boot`. Checks
/// lengths, the header, the receiver's boot and the tag; replays within this boot are the
/// [`ReplayGuard`]'s to find.
pub fn open(
    master: &DatagramKey,
    me: &[u8],
    my_boot: u64,
    datagram: &[u8],
) -> Result<Opened, DatagramError> {
    let len = datagram.len();
    if len > MAX_DATAGRAM || len < MAGIC.len() + 1 || datagram[..3] != MAGIC {
        return Err(DatagramError::NotOurs { len });
    }
    if datagram[3] != VERSION {
        return Err(DatagramError::Version(datagram[3]));
    }
    let name_len = *datagram
        .get(4)
        .ok_or(DatagramError::Malformed("no sender"))? as usize;
    if name_len == 0 {
        return Err(DatagramError::Malformed("empty sender name"));
    }
    let header = 5 + name_len + 24;
    if len < header + TAG_LEN {
        return Err(DatagramError::Malformed("shorter than its header"));
    }
    let name = std::str::from_utf8(&datagram[5..5 + name_len])
        .map_err(|_| DatagramError::Malformed("sender name is not UTF-8"))?;
    let sender = Name::new(name).ok_or(DatagramError::Malformed("sender name too long"))?;
    let at = 5 + name_len;
    let boot = u64::from_le_bytes(datagram[at..at + 8].try_into().expect("8 bytes"));
    let counter = u64::from_le_bytes(datagram[at + 8..at + 16].try_into().expect("8 bytes"));
    if counter == 0 {
        return Err(DatagramError::Malformed("counter 0"));
    }
    let to_boot = u64::from_le_bytes(datagram[at + 16..at + 24].try_into().expect("8 bytes"));
    if to_boot != my_boot {
        // Not opened: whether it is forged does not matter, it is not for this boot.
        return Err(DatagramError::Stale {
            sender: shown(sender.as_str()),
            to_boot,
        });
    }
    let key = master.sender_key(sender.as_bytes(), boot);
    let mut body = datagram[header..].to_vec();
    let plain = key
        .open_in_place(
            nonce(counter),
            Aad::from(aad(&datagram[..header], me)),
            &mut body,
        )
        .map_err(|_| DatagramError::Forged {
            sender: shown(sender.as_str()),
        })?
        .len();
    body.truncate(plain);
    Ok(Opened {
        sender,
        boot,
        counter,
        body,
    })
}

/// A name for an error message: at most 64 characters.
fn shown(s: &str) -> String {
    s.chars().take(64).collect()
}

/// Per sender: the newest boot, the newest counter in it, and which of the `WINDOW`
/// counters below it were seen (bit `i` = counter `top - i`).
#[derive(Debug, Clone, Copy)]
struct Window {
    boot: u64,
    top: u64,
    seen: u64,
    /// When it was last used, in `ReplayGuard` ticks (for eviction).
    used: u64,
}

/// The receiver's memory of what it took, to refuse replays. Bounded: at most `cap`
/// senders (the least recently heard is forgotten to make room; only senders whose
/// datagrams opened are ever entered, so only holders of the secret, or replays of their
/// datagrams, can fill it).
pub struct ReplayGuard {
    windows: std::collections::HashMap<Name, Window, NameHash>,
    cap: usize,
    tick: u64,
}

impl ReplayGuard {
    pub fn new(cap: usize) -> ReplayGuard {
        ReplayGuard {
            windows: Default::default(),
            cap: cap.max(1),
            tick: 0,
        }
    }

    /// Senders remembered.
    pub fn len(&self) -> usize {
        self.windows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }

    /// Take `d` if it is new (and remember it), or say it is a replay.
    pub fn check(&mut self, d: &Opened) -> Result<(), DatagramError> {
        self.tick += 1;
        let replay = || DatagramError::Replayed {
            sender: shown(d.sender.as_str()),
            boot: d.boot,
            counter: d.counter,
        };
        let fresh = Window {
            boot: d.boot,
            top: d.counter,
            seen: 1,
            used: self.tick,
        };
        let Some(w) = self.windows.get_mut(&d.sender) else {
            if self.windows.len() >= self.cap {
                let oldest = self
                    .windows
                    .iter()
                    .min_by_key(|(_, w)| w.used)
                    .map(|(n, _)| n.clone());
                if let Some(n) = oldest {
                    self.windows.remove(&n);
                }
            }
            self.windows.insert(d.sender.detached(), fresh);
            return Ok(());
        };
        if d.boot < w.boot {
            return Err(replay());
        }
        if d.boot > w.boot {
            *w = fresh;
            return Ok(());
        }
        if d.counter > w.top {
            let shift = d.counter - w.top;
            w.seen = if shift >= WINDOW { 0 } else { w.seen << shift };
            w.seen |= 1;
            w.top = d.counter;
        } else {
            let back = w.top - d.counter;
            if back >= WINDOW || w.seen & (1 << back) != 0 {
                return Err(replay());
            }
            w.seen |= 1 << back;
        }
        w.used = self.tick;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> DatagramKey {
        DatagramKey::from_secret(b"cluster secret")
    }

    fn sealer(name: &'static str, boot: u64) -> Sealer {
        Sealer::new(&key(), Name::from_static(name), boot)
    }

    #[test]
    fn the_key_is_never_printed() {
        assert_eq!(format!("{:?}", key()), "DatagramKey(<redacted>)");
    }

    #[test]
    fn a_sealed_body_opens_for_its_receiver_only() {
        let mut a = sealer("a", 7);
        let d = a.seal(b"b", 3, b"\x00swim packet");
        let o = open(&key(), b"b", 3, &d).unwrap();
        assert_eq!(o.sender.as_str(), "a");
        assert_eq!((o.boot, o.counter), (7, 1));
        assert_eq!(o.body, b"\x00swim packet");
        // Encrypted: the body is not in the datagram.
        assert!(!d.windows(5).any(|w| w == b"swim "));
        // Another member, another secret: refused, naming the sender (cut to 64
        // characters).
        assert_eq!(
            open(&key(), b"c", 3, &d),
            Err(DatagramError::Forged { sender: "a".into() })
        );
        let long = "é".repeat(100);
        let mut l = Sealer::new(&key(), Name::new(&long).unwrap(), 1);
        let e = open(&key(), b"c", 3, &l.seal(b"b", 3, b"")).unwrap_err();
        assert_eq!(
            e,
            DatagramError::Forged {
                sender: "é".repeat(64)
            }
        );
        let other = DatagramKey::from_secret(b"another secret");
        assert!(matches!(
            open(&other, b"b", 3, &d),
            Err(DatagramError::Forged { .. })
        ));
        // The counter goes on.
        let d2 = a.seal(b"b", 3, b"");
        assert_eq!(open(&key(), b"b", 3, &d2).unwrap().counter, 2);
        assert_eq!(a.sealed(), 2);
    }

    #[test]
    fn every_changed_byte_is_refused() {
        let mut a = sealer("a", 7);
        let d = a.seal(b"b", 3, b"\x00abc");
        for i in 0..d.len() {
            for bit in [0x01u8, 0x80] {
                let mut x = d.clone();
                x[i] ^= bit;
                assert!(open(&key(), b"b", 3, &x).is_err(), "byte {i} bit {bit:#x}");
            }
        }
        for n in 0..d.len() {
            assert!(open(&key(), b"b", 3, &d[..n]).is_err(), "cut to {n}");
        }
        let mut long = d.clone();
        long.push(0);
        assert!(open(&key(), b"b", 3, &long).is_err());
    }

    #[test]
    fn malformed_headers_say_what_is_wrong() {
        let k = key();
        assert!(matches!(
            open(&k, b"b", 3, b"GET / HTTP/1.1"),
            Err(DatagramError::NotOurs { .. })
        ));
        assert!(matches!(
            open(&k, b"b", 3, &[0u8; MAX_DATAGRAM + 1]),
            Err(DatagramError::NotOurs { .. })
        ));
        assert_eq!(
            open(&k, b"b", 3, b"BWM\x03xx"),
            Err(DatagramError::Version(3))
        );
        assert_eq!(
            open(&k, b"b", 3, b"BWM\x02"),
            Err(DatagramError::Malformed("no sender"))
        );
        assert_eq!(
            open(&k, b"b", 3, b"BWM\x02\x00"),
            Err(DatagramError::Malformed("empty sender name"))
        );
        assert_eq!(
            open(&k, b"b", 3, b"BWM\x02\xffabc"),
            Err(DatagramError::Malformed("shorter than its header"))
        );
        let mut bad = b"BWM\x02\x01\xff".to_vec();
        bad.extend_from_slice(&[0; 24 + TAG_LEN]);
        assert_eq!(
            open(&k, b"b", 3, &bad),
            Err(DatagramError::Malformed("sender name is not UTF-8"))
        );
        let mut zero = b"BWM\x02\x01a".to_vec();
        zero.extend_from_slice(&[0; 24 + TAG_LEN]);
        assert_eq!(
            open(&k, b"b", 3, &zero),
            Err(DatagramError::Malformed("counter 0"))
        );
        // The largest body fits.
        let mut a = Sealer::new(&k, Name::new(&"n".repeat(255)).unwrap(), 1);
        let d = a.seal(b"b", 3, &vec![0; 1 + crate::membership::MAX_PACKET]);
        assert_eq!(d.len(), MAX_DATAGRAM);
        open(&k, b"b", 3, &d).unwrap();
    }

    /// A datagram sealed for an earlier boot of the receiver (recorded then, replayed
    /// after it restarted, when its replay guard knows nothing) is refused as stale: a
    /// member's old leave notice cannot make its new incarnation look gone.
    #[test]
    fn a_datagram_for_an_earlier_boot_of_the_receiver_is_stale() {
        let mut x = sealer("x", 1);
        let leave = x.seal(b"r", 10, b"\x02");
        assert_eq!(open(&key(), b"r", 10, &leave).unwrap().body, b"\x02");
        // r restarted (boot 11): the recording is refused, before any key work.
        assert_eq!(
            open(&key(), b"r", 11, &leave),
            Err(DatagramError::Stale {
                sender: "x".into(),
                to_boot: 10
            })
        );
        // And the receiver's boot cannot be edited: it is under the tag.
        let mut edited = leave.clone();
        let at = 5 + 1 + 16;
        edited[at..at + 8].copy_from_slice(&11u64.to_le_bytes());
        assert!(matches!(
            open(&key(), b"r", 11, &edited),
            Err(DatagramError::Forged { .. })
        ));
    }

    fn opened(sender: &'static str, boot: u64, counter: u64) -> Opened {
        Opened {
            sender: Name::from_static(sender),
            boot,
            counter,
            body: Vec::new(),
        }
    }

    #[test]
    fn replays_are_refused_within_and_below_the_window() {
        let mut g = ReplayGuard::new(16);
        g.check(&opened("a", 5, 10)).unwrap();
        assert!(g.check(&opened("a", 5, 10)).is_err(), "the same again");
        // Out of order within the window: each taken once.
        g.check(&opened("a", 5, 12)).unwrap();
        assert!(
            g.check(&opened("a", 5, 10)).is_err(),
            "10 is still remembered after the window moved to 12"
        );
        g.check(&opened("a", 5, 11)).unwrap();
        assert!(g.check(&opened("a", 5, 11)).is_err());
        assert!(g.check(&opened("a", 5, 12)).is_err());
        // The window's edge: top 12, so 12 - 63 = -51.. : counter 1 is 11 back, taken.
        g.check(&opened("a", 5, 1)).unwrap();
        // A jump: 100 is the top; 100 - 64 = 36 is out of the window, 37 in.
        g.check(&opened("a", 5, 100)).unwrap();
        assert!(g.check(&opened("a", 5, 36)).is_err());
        g.check(&opened("a", 5, 37)).unwrap();
        assert!(g.check(&opened("a", 5, 37)).is_err());
        // A jump past the whole window forgets what was seen below it.
        g.check(&opened("a", 5, 1000)).unwrap();
        g.check(&opened("a", 5, 999)).unwrap();
        assert!(g.check(&opened("a", 5, 100)).is_err());
        // An older boot is refused; a newer one starts over.
        assert!(g.check(&opened("a", 4, 5000)).is_err());
        g.check(&opened("a", 6, 1)).unwrap();
        assert!(g.check(&opened("a", 5, 1001)).is_err());
        // Senders are apart.
        g.check(&opened("b", 6, 1)).unwrap();
        assert!(g.check(&opened("b", 6, 1)).is_err());
    }

    #[test]
    fn the_guard_is_bounded_and_forgets_the_least_recently_heard() {
        let mut g = ReplayGuard::new(3);
        assert!(g.is_empty());
        for s in ["a", "b", "c"] {
            g.check(&opened(s, 1, 1)).unwrap();
        }
        assert!(!g.is_empty());
        g.check(&opened("a", 1, 2)).unwrap(); // a heard again: b is now the oldest
        g.check(&opened("d", 1, 1)).unwrap();
        assert_eq!(g.len(), 3);
        // b was forgotten (its old datagram is taken again), a and c were not.
        assert!(g.check(&opened("a", 1, 2)).is_err());
        assert!(g.check(&opened("c", 1, 1)).is_err());
        g.check(&opened("b", 1, 1)).unwrap();
        assert_eq!(g.len(), 3);
    }
}
