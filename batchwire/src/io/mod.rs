//! The IO layer: threads and sockets around the sans-IO core.
//!
//! Floors, each importing only the ones below it:
//! - [`runtime`]: the node's parts (registries, event bus, shutdown, timer, threads), the
//!   routing of sends, starting and stopping. The API (`Node`, `Mailbox`) sits on it.
//! - thread bodies, each taking only what it uses: [`accept`] (an event loop that sets up
//!   every inbound connection, TLS and handshake, without a thread each), [`dial`] and
//!   [`setup`] (connections: TLS, handshake, RESUME, then [`read`]), [`write`] (a peer's
//!   writer), [`bundle`] (transfer-queue), [`tick`] (the sessions' timers), [`membership`] (the
//!   membership thread: SWIM's packets, joins, the view; its handle is [`members`]).
//! - handles: [`peers`] and [`peer`] (a peer's session, lane and connection), [`lane`],
//!   [`calls`] (requests in flight; its timer thread), [`wakers`] (tasks waiting for room),
//!   [`mailbox`], [`conn`], [`link`] (plain or TLS), [`events`], [`shutdown`], [`timer`],
//!   [`threads`].
//!
//! Ownership: every protocol rule lives in the peer's `Session` (core); a peer's session is
//! locked for one step at a time and never across a wait. Only the writer writes to a
//! socket; only a connection's reader reads it. Every wait has a wake-up or a deadline.

pub(crate) mod accept;
pub(crate) mod bundle;
pub(crate) mod calls;
pub(crate) mod conn;
pub(crate) mod datagrams;
pub(crate) mod dial;
pub(crate) mod envelope;
pub(crate) mod events;
pub(crate) mod flow;
pub(crate) mod join;
pub(crate) mod lane;
pub(crate) mod link;
pub(crate) mod logs;
pub(crate) mod mailbox;
pub(crate) mod members;
pub(crate) mod membership;
pub(crate) mod peer;
pub(crate) mod peers;
pub(crate) mod read;
pub(crate) mod resting;
pub(crate) mod runtime;
pub(crate) mod setup;
pub(crate) mod shutdown;
pub(crate) mod threads;
pub(crate) mod tick;
pub(crate) mod timer;
pub(crate) mod wakers;
pub(crate) mod write;

use batchwire_core::idle::IdleStrategy;

use crate::config::NodeConfig;

/// `d` from now; a wait too long for the clock to express (`Duration::MAX`, as
/// `recv_timeout` or `request` may be given) ends a century from now, that is, never.
pub(crate) fn deadline_after(d: std::time::Duration) -> std::time::Instant {
    use std::time::{Duration, Instant};
    let now = Instant::now();
    now.checked_add(d)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}

/// Spin or yield as an idle step says (the caller holds no lock); parking is the caller's,
/// on its own condvar.
pub(crate) fn pause(step: batchwire_core::idle::IdleStep) {
    use batchwire_core::idle::{IdleStep, SPIN_HINTS};
    match step {
        IdleStep::Spin => {
            for _ in 0..SPIN_HINTS {
                std::hint::spin_loop();
            }
        }
        IdleStep::Yield => std::thread::yield_now(),
        IdleStep::Park => {}
    }
}

/// The idle strategy of a (validated) configuration.
pub(crate) fn idle_strategy(cfg: &NodeConfig) -> IdleStrategy {
    IdleStrategy::from_level(cfg.idle_cpu_level).unwrap_or_default()
}

pub(crate) use batchwire_core::codec::NameHash;

/// `addr` as this host reaches it: a wildcard address (`0.0.0.0`, `[::]`) becomes loopback.
pub(crate) fn reachable(addr: std::net::SocketAddr) -> std::net::SocketAddr {
    let mut to = addr;
    match to.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            to.set_ip(std::net::Ipv4Addr::LOCALHOST.into())
        }
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
            to.set_ip(std::net::Ipv6Addr::LOCALHOST.into())
        }
        _ => {}
    }
    to
}
