//! Places for inbound handshakes in progress: strangers' and those kept for known
//! addresses, bounded per address, and who gives way when they are all taken (see
//! [`Setup::slot`]).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

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
    ///   place of its oldest (that connection is cut): a real peer's handshake is over in
    ///   moments, so the oldest are the silent ones;
    /// - any other address takes the oldest place of the address holding the most, if
    ///   that holds at least two more than it (that connection is cut), so a few
    ///   addresses cannot keep everyone else out.
    pub fn slot(self: &Arc<Self>, ip: IpAddr, stream: &TcpStream) -> Option<HandshakeSlot> {
        let cfg = &self.config;
        let per_address = cfg.max_handshakes_per_address;
        let mut g = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let live = |p: &&Pending| p.stream.is_some();
        let (here, here_known) = g.by_ip.get(&ip).map_or((0, 0), |l| {
            let known = l.iter().filter(|p| p.known).filter(live).count();
            (l.len() - l.iter().filter(|p| p.known).count(), known)
        });
        let over = here >= per_address;
        // Room among the kept places for this address (else its oldest gives way).
        let kept_room = g.known < cfg.max_handshakes && here_known < per_address;
        let strangers = g.strangers;
        let known = if strangers < cfg.max_handshakes && !over {
            false
        } else if (kept_room || here_known > 0) && self.knows(ip) {
            if !kept_room {
                // This address's own kept places are taken: its oldest gives way.
                // The oldest by id: the list's order is not arrival order (a place
                // leaves it by `swap_remove`).
                let oldest = g.by_ip.get_mut(&ip).and_then(|l| {
                    l.iter_mut()
                        .filter(|p| p.known && p.stream.is_some())
                        .min_by_key(|p| p.id)
                });
                if let Some(s) = oldest.and_then(|p| p.stream.take()) {
                    let _ = s.shutdown(std::net::Shutdown::Both);
                    self.security.evicted.fetch_add(1, Relaxed);
                }
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
    known: bool,
    stream: Option<TcpStream>,
}

/// An inbound handshake's place; freed when dropped.
pub(crate) struct HandshakeSlot {
    setup: Arc<Setup>,
    ip: IpAddr,
    id: u64,
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
