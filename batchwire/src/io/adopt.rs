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
    /// `None` once the loop has ended (it takes what was sent before, under this lock).
    tx: Mutex<Option<Sender<Msg>>>,
    waker: Arc<Waker>,
}

impl Reading {
    pub(crate) fn new(tx: Sender<Msg>, waker: Arc<Waker>) -> Reading {
        Reading {
            tx: Mutex::new(Some(tx)),
            waker,
        }
    }

    /// Hand `a` (its reader prepared) to the loop. False if the loop has ended: the
    /// caller reads it itself. Once this says true the loop reads the connection, or
    /// tears it down if it ends first.
    pub fn adopt(&self, a: Adopted) -> bool {
        let g = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        let sent = g.as_ref().is_some_and(|tx| tx.send(Msg::Adopt(a)).is_ok());
        drop(g);
        if sent && let Err(e) = self.waker.wake() {
            // It looks at its messages at least whenever one of its sockets is ready.
            tracing::debug!(error = %e, "cannot wake the acceptor's event loop");
        }
        sent
    }

    /// Wake the loop (the node stops).
    pub fn wake(&self) {
        let _ = self.waker.wake();
    }

    /// The loop ends: no more hand-offs (those sent before are still in its channel).
    pub(crate) fn close(&self) {
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}
