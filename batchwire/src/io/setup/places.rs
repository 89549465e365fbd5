//! Places for inbound handshakes in progress: strangers' and those kept for known
//! addresses, bounded per address, and who gives way when they are all taken (see
//! [`Setup::slot`]).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use super::Setup;

impl Setup {
    /// A place for an inbound handshake on `stream` from `ip`, or `None` (the caller
    /// closes the connection). Strangers share `max_handshakes` places, at most
    /// `max_handshakes_per_address` from one address; when they are all taken:
    /// - an address this node knows (a configured peer, a seed, a member in the view) has
    ///   `max_handshakes` places of its own, which strangers cannot use up, so members
    ///   and configured peers always get in; so has a known address whose own
    ///   `max_handshakes_per_address` are taken (strangers on a member's host, or behind
    ///   its NAT, must not keep it out). Of those kept places one address holds at most
    ///   `max_handshakes_per_address` too; past that, a connection from it takes the
    ///   place of its oldest one that waits on a silent or slow peer (that connection is
    ///   cut), or of its oldest past half the handshake timeout, or else is refused: this
    ///   node is behind on all of them (see `give_way`);
    /// - any other address takes the oldest place of the address holding the most, if
    ///   that holds at least two more than it (that connection is cut), so a few
    ///   addresses cannot keep everyone else out.
    pub fn slot(self: &Arc<Self>, ip: IpAddr, stream: &TcpStream) -> Option<HandshakeSlot> {
        let cfg = &self.config;
        let per_address = cfg.max_handshakes_per_address;
        let now = Instant::now();
        let mut g = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let live = |p: &&Pending| p.stream.is_some();
        let (here, here_known) = g.by_ip.get(&ip).map_or((0, 0), |l| {
            let known = l.iter().filter(|p| p.known).filter(live).count();
            (l.len() - l.iter().filter(|p| p.known).count(), known)
        });
        let over = here >= per_address;
        // Room among the kept places for this address (else one gives way: `give_way`).
        let kept_room = g.known < cfg.max_handshakes && here_known < per_address;
        let strangers = g.strangers;
        let known = if strangers < cfg.max_handshakes && !over {
            false
        } else if (kept_room || here_known > 0) && self.knows(ip) {
            if !kept_room {
                // This address's own kept places are taken: one gives way (see
                // `give_way`), or, if this node is the one behind, the newcomer is
                // refused (it dials again) and the handshakes in progress finish.
                let patience = cfg.handshake_timeout / 2;
                let cut = g
                    .by_ip
                    .get_mut(&ip)
                    .and_then(|l| give_way(l, now, patience, unread));
                let s = cut?;
                let _ = s.shutdown(std::net::Shutdown::Both);
                self.security.evicted.fetch_add(1, Relaxed);
            }
            self.security.reserved.fetch_add(1, Relaxed);
            true
        } else if over {
            return None;
        } else {
            // The address holding the most stranger places gives up its oldest.
            let (victim, most) = g
                .by_ip
                .iter()
                .map(|(v, p)| {
                    let live = p.iter().filter(|p| !p.known && p.stream.is_some());
                    (*v, live.count())
                })
                .max_by_key(|(_, n)| *n)?;
            if most < here + 2 {
                return None;
            }
            let list = g.by_ip.get_mut(&victim)?;
            let oldest = list
                .iter_mut()
                .filter(|p| !p.known && p.stream.is_some())
                .min_by_key(|p| p.id)?;
            if let Some(s) = oldest.stream.take() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            self.security.evicted.fetch_add(1, Relaxed);
            false
        };
        g.next_id += 1;
        let id = g.next_id;
        if known {
            g.known += 1;
        } else {
            g.strangers += 1;
        }
        g.by_ip.entry(ip).or_default().push(Pending {
            id,
            since: now,
            turn: Turn::Node,
            known,
            stream: stream.try_clone().ok(),
        });
        Some(HandshakeSlot {
            setup: self.clone(),
            ip,
            id,
        })
    }

    /// Inbound handshakes in progress.
    pub fn pending_handshakes(&self) -> usize {
        let g = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        g.strangers + g.known
    }

    /// Whether `ip` is the address of a configured peer, a seed or a member in the view.
    fn knows(&self, ip: IpAddr) -> bool {
        // As the same address whichever way it is written: a node listening on `[::]`
        // sees an IPv4 peer as `::ffff:a.b.c.d`, configured as `a.b.c.d`.
        let ip = ip.to_canonical();
        let is = |a: &SocketAddr| a.ip().to_canonical() == ip;
        self.statics.iter().any(|(_, a)| is(a))
            || self
                .seed_addrs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .any(is)
            || self
                .members
                .as_ref()
                .is_some_and(|m| m.view().iter().any(|v| is(&v.addr)))
    }
}

/// Inbound handshakes in progress (see [`Setup::slot`]).
#[derive(Default)]
pub(super) struct Slots {
    by_ip: HashMap<IpAddr, Vec<Pending>>,
    /// Places taken in the strangers' pool, and in the known addresses' one.
    strangers: usize,
    known: usize,
    next_id: u64,
}

/// One handshake in progress: which pool it is in, and its socket (to cut it if its place
/// is taken over; `None` once cut).
struct Pending {
    id: u64,
    /// When its place was taken.
    since: Instant,
    /// Whose turn it is, as its handshake last said (`HandshakeSlot::set_turn`).
    turn: Turn,
    known: bool,
    stream: Option<TcpStream>,
}

/// Of `list`'s kept places in use, the one to cut for a newcomer from the same address,
/// taken out of the list's hands (`None`: cut none, refuse the newcomer):
/// - the oldest whose peer keeps it waiting: its handshake did all it could and waits on
///   the peer ([`Turn::Peer`]), and fewer bytes than it needs are unread here
///   (`unread`; on plain TCP the rest of the frame begun, over TLS past TLS's own
///   handshake one byte): the peer is silent, or trickles a frame, or does not read.
///   "A real peer's handshake is over in moments" holds only while this node keeps up;
/// - else (this node is the one behind on every one: what it needs unread, or a peer
///   that proved the secret still to set up, as a seed has when a thousand nodes join
///   through it at once on a loaded host) the oldest, if it has waited `patience` (half
///   the handshake timeout), so that a stranger on a member's address cannot keep a
///   place from the member for longer;
/// - else none: cutting a handshake the node is about to finish only to start another
///   would throw work away (it did: a seed that a thousand nodes joined saw 800-1,600
///   handshakes fail a run, most of those it logged cut this way, each dialled again).
fn give_way(
    list: &mut [Pending],
    now: Instant,
    patience: Duration,
    unread: impl Fn(&TcpStream) -> usize,
) -> Option<TcpStream> {
    // By id: the list's order is not arrival order (a place leaves it by `swap_remove`).
    let mut live: Vec<&mut Pending> = list
        .iter_mut()
        .filter(|p| p.known && p.stream.is_some())
        .collect();
    live.sort_by_key(|p| p.id);
    let waiting_on_peer = live.iter().position(|p| {
        let Turn::Peer { needs } = p.turn else {
            return false;
        };
        p.stream.as_ref().is_none_or(|s| unread(s) < needs as usize)
    });
    let i = waiting_on_peer.or_else(|| {
        live.first()
            .is_some_and(|p| now.saturating_duration_since(p.since) >= patience)
            .then_some(0)
    })?;
    live[i].stream.take()
}

/// Bytes the peer sent on `s` that wait unread (an error counts as none).
fn unread(s: &TcpStream) -> usize {
    use std::os::fd::AsRawFd;
    crate::sys::unread_bytes(s.as_raw_fd()).unwrap_or(0)
}

/// An inbound handshake's place; freed when dropped.
pub(crate) struct HandshakeSlot {
    setup: Arc<Setup>,
    ip: IpAddr,
    id: u64,
}

/// Where an inbound handshake stands, for `give_way`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Turn {
    /// Just accepted: this node's HELLO is owed.
    Node,
    /// This node did all it could and waits on the peer: for at least `needs` more bytes
    /// (on plain TCP the rest of the frame begun; over TLS, past TLS's own handshake, one;
    /// during it, `u32::MAX`), or for the peer to read what it wrote.
    Peer { needs: u32 },
    /// The peer proved the secret: what is left (the certificate's name, on a thread of
    /// its own) is this node's.
    Proved,
}

impl HandshakeSlot {
    /// Its handshake now waits on `turn` (set by the acceptor, which alone reads it:
    /// `give_way` runs as it takes a connection).
    pub(crate) fn set_turn(&self, turn: Turn) {
        let mut g = self.setup.slots.lock().unwrap_or_else(|p| p.into_inner());
        let place = g.by_ip.get_mut(&self.ip);
        if let Some(p) = place.and_then(|l| l.iter_mut().find(|p| p.id == self.id)) {
            p.turn = turn;
        }
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        let mut g = self.setup.slots.lock().unwrap_or_else(|p| p.into_inner());
        let Some(list) = g.by_ip.get_mut(&self.ip) else {
            return;
        };
        let Some(i) = list.iter().position(|p| p.id == self.id) else {
            return;
        };
        let p = list.swap_remove(i);
        if list.is_empty() {
            g.by_ip.remove(&self.ip);
        }
        if p.known {
            g.known -= 1;
        } else {
            g.strangers -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    /// A frame of this many bytes is on its way on every place of the test.
    const FRAME: u32 = 100;

    /// `n` kept places (ids 1..=n, server ends of real connections), each waiting on its
    /// peer for a frame of `FRAME` bytes; their clients, and when they were taken.
    fn places(n: u64) -> (Vec<TcpStream>, Vec<Pending>, Instant) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let t0 = Instant::now();
        let (mut clients, mut list) = (Vec::new(), Vec::new());
        for id in 1..=n {
            clients.push(TcpStream::connect(l.local_addr().unwrap()).unwrap());
            let (s, _) = l.accept().unwrap();
            list.push(Pending {
                id,
                since: t0,
                turn: Turn::Peer { needs: FRAME },
                known: true,
                stream: Some(s),
            });
        }
        // Not in arrival order, as after a `swap_remove`.
        list.swap(0, 2);
        (clients, list, t0)
    }

    fn place(list: &[Pending], id: u64) -> &Pending {
        list.iter().find(|p| p.id == id).unwrap()
    }

    /// Client `c` sends `n` bytes; wait until they are unread at place `id`.
    fn send(clients: &mut [TcpStream], c: usize, list: &[Pending], id: u64, n: usize) {
        let s = place(list, id).stream.as_ref().unwrap();
        let before = unread(s);
        clients[c].write_all(&vec![0u8; n]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while unread(s) < before + n {
            assert!(Instant::now() < deadline, "the bytes never arrived");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The client port of a cut place's connection (each place's client has its own).
    fn port_of(cut: &TcpStream) -> u64 {
        cut.peer_addr().unwrap().port() as u64
    }

    #[test]
    fn the_oldest_handshake_waiting_on_its_peer_gives_way_and_none_the_node_is_behind_on() {
        let patience = Duration::from_millis(2500);
        let (mut clients, mut list, t0) = places(5);
        let ports: Vec<u64> = clients
            .iter()
            .map(|c| c.local_addr().unwrap().port() as u64)
            .collect();
        // All silent: the oldest goes.
        let cut = give_way(&mut list, t0, patience, unread).unwrap();
        assert_eq!(port_of(&cut), ports[0]);
        // Id 2's whole frame is unread (the node is behind on it); id 3 proved the secret;
        // id 4 was just accepted: none of them is their peer's fault...
        send(&mut clients, 1, &list, 2, FRAME as usize);
        for (id, turn) in [(3, Turn::Proved), (4, Turn::Node)] {
            list.iter_mut().find(|p| p.id == id).unwrap().turn = turn;
        }
        // ...but id 5 trickles its frame: the bytes unread are short of it, so it goes.
        send(&mut clients, 4, &list, 5, FRAME as usize - 1);
        let cut = give_way(&mut list, t0, patience, unread).unwrap();
        assert_eq!(port_of(&cut), ports[4]);
        // The rest stay while young...
        assert!(give_way(&mut list, t0, patience, unread).is_none());
        assert!(give_way(&mut list, t0 + patience / 2, patience, unread).is_none());
        // ...and go oldest first once they have waited `patience`.
        for c in [1, 2, 3] {
            let cut = give_way(&mut list, t0 + patience, patience, unread).unwrap();
            assert_eq!(port_of(&cut), ports[c]);
        }
        assert!(
            give_way(&mut list, t0 + patience, patience, unread).is_none(),
            "none left"
        );
    }
}
