//! The acceptor thread: takes connections and gives each a thread that runs it.
//!
//! At most `max_handshakes` inbound handshakes run at once (`max_handshakes_per_address`
//! from one address): beyond that a new connection is closed at once and counted, so a
//! flood of unauthenticated clients costs a bounded number of threads. Nothing ends the
//! loop but the node stopping: a failure to accept or to start a thread is logged, counted
//! and retried after a pause.

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use crate::io::logs::warn_limited;
use tracing::warn;

use crate::io::setup::{Setup, Side};
use crate::io::threads::Threads;

const PAUSE: Duration = Duration::from_millis(50);

pub(crate) fn run_acceptor(listener: TcpListener, setup: Arc<Setup>, threads: Threads) {
    let shutdown = setup.shutdown.clone();
    for stream in listener.incoming() {
        // The node wakes us with a connection of its own when it stops. (While it drains,
        // peers may still reconnect to finish.)
        if shutdown.is_stopped() {
            break;
        }
        let s = match stream {
            Ok(s) => s,
            Err(e) => {
                // Typically EMFILE; back off a little rather than spin.
                setup.security.accept_errors.fetch_add(1, Relaxed);
                warn_limited!(node = %setup.name, error = %e, "accept failed; retrying in 50 ms");
                if !shutdown.sleep(PAUSE) {
                    break;
                }
                continue;
            }
        };
        let from = s.peer_addr().map(|a| a.ip()).ok();
        let Some(slot) = from.and_then(|ip| setup.slot(ip, &s)) else {
            // Too many handshakes in progress: close at once (dropping the socket).
            let n = setup.security.busy.fetch_add(1, Relaxed) + 1;
            if n.is_power_of_two() {
                warn!(node = %setup.name, addr = ?from, refused_so_far = n, max = setup.config.max_handshakes, per_address = setup.config.max_handshakes_per_address, "too many handshakes in progress; closing new connections at once");
            }
            continue;
        };
        let st = setup.clone();
        let spawned = threads.spawn_inbound(format!("bw-in-{}", setup.name), move || {
            st.run(s, Side::Accept(slot));
        });
        if let Err(e) = spawned {
            // The closure (socket and slot) was dropped: the connection is closed.
            setup.security.spawn_errors.fetch_add(1, Relaxed);
            warn_limited!(node = %setup.name, error = %e, "cannot start a thread for a new connection; closed it, retrying in 50 ms");
            if !shutdown.sleep(PAUSE) {
                break;
            }
        }
    }
}
