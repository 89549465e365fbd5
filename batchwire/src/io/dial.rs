//! A dialer thread: for a peer whose name sorts after ours, connect, run the connection
//! until it breaks (this thread is its reader), and connect again with exponential back-off,
//! until the node stops.

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use batchwire_core::codec::Name;
use tracing::debug;

use crate::io::setup::Setup;

pub(crate) fn run_dialer(setup: Arc<Setup>, peer: Name, addr: SocketAddr) {
    let (min, max) = (setup.config.reconnect_min, setup.config.reconnect_max);
    let mut backoff = min;
    let mut failures = 0u32;
    while !setup.shutdown.is_stopped() {
        match TcpStream::connect_timeout(&addr, setup.config.handshake_timeout) {
            Ok(s) => {
                // A completed handshake resets the back-off.
                if setup.run(s, Some(peer.clone()), None) {
                    backoff = min;
                    failures = 0;
                }
            }
            Err(e) => {
                failures += 1;
                // Log the first failure and then rarely: a peer that is not up yet is normal.
                if failures == 1 || failures.is_power_of_two() {
                    debug!(node = %setup.name, %peer, %addr, error = %e, failures, "cannot connect yet; retrying with back-off");
                }
            }
        }
        if !setup.shutdown.sleep(backoff) {
            break;
        }
        backoff = (backoff * 2).min(max).max(Duration::from_millis(1));
    }
}
