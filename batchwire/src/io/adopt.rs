//! The hand-off of an inbound connection, once its RESUME is done, from its setup thread
//! (`Setup::established`) to the acceptor's event loop that reads it from then on
//! (`io::accept`, its `reading` part). Both sides import this; neither imports the other
//! for it.

use std::net::SocketAddr;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use batchwire_core::codec::Name;
use mio::Waker;

use crate::io::conn::Conn;
use crate::io::peer::Peer;

/// A connection handed to the loop.
pub(crate) struct Adopted {
    pub peer: Arc<Peer>,
    pub conn: Arc<Conn>,
    pub name: Name,
    pub addr: SocketAddr,
}

/// What other threads tell the loop.
pub(crate) enum Msg {
    Adopt(Adopted),
    /// A thread that led connection (place, generation) gave the read turn back.
    Look(usize, u64),
}

/// The handle other threads use to give the loop connections to read.
pub(crate) struct Reading {
    tx: Mutex<Sender<Msg>>,
    waker: Arc<Waker>,
}

impl Reading {
    pub(crate) fn new(tx: Sender<Msg>, waker: Arc<Waker>) -> Reading {
        Reading {
            tx: Mutex::new(tx),
            waker,
        }
    }

    /// Hand `a` (its reader prepared) to the loop. False if the loop has stopped: the
    /// caller reads it itself.
    pub fn adopt(&self, a: Adopted) -> bool {
        let sent = self
            .tx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(Msg::Adopt(a))
            .is_ok();
        sent && self.waker.wake().is_ok()
    }
}
