//! One inbound connection's setup on the acceptor's event loop, without a thread of its
//! own: TLS first if the node runs it (rustls fed by readiness, not its blocking
//! `complete_io`), then the batchwire handshake (`core::handshake`), all by the
//! connection's one deadline. The socket is non-blocking while here; once the peer has
//! proved the cluster secret and every byte this side owes it is written, the connection
//! leaves the loop as a blocking [`Link`] for a thread of its own (certificate check,
//! RESUME, reader).
//!
//! Memory is bounded: at most one handshake frame ([`HANDSHAKE_MAX_FRAME`]) plus one read
//! is buffered (the frame decoder refuses a longer one as soon as its length is read),
//! rustls keeps its own bounds during its handshake, and nothing is read once the peer is
//! known (what follows stays in the socket for the connection's thread).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use batchwire_core::frame;
use batchwire_core::handshake::Handshake;
use bytes::BytesMut;

use crate::io::conn::LinkError;
use crate::io::link::Link;
use crate::io::setup::{
    HANDSHAKE_MAX_FRAME, HandshakeSlot, Handshaken, Setup, Turn, looks_like_tls,
};

/// Bytes read from the socket at once while setting up.
const CHUNK: usize = 4096;

/// The bytes still to come before the frame begun in `buf` (read, not yet whole) is whole,
/// at least one. The length in a frame's header was checked when it was read (at most
/// `HANDSHAKE_MAX_FRAME`).
fn needs(buf: &[u8]) -> u32 {
    let frame = match buf.get(..4) {
        Some(h) => 4 + u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize,
        None => 4,
    };
    u32::try_from(frame.saturating_sub(buf.len()).max(1)).unwrap_or(u32::MAX)
}

/// What a turn of [`Inbound::drive`] came to.
pub(super) enum Progress {
    /// Waiting for the peer's bytes, or (`writable`) for room to write ours.
    Waiting { writable: bool },
    /// The peer proved the secret and everything owed to it was written.
    Done,
    /// The connection is to be closed, for this reason.
    Failed(LinkError),
}

/// One inbound connection being set up.
pub(super) struct Inbound {
    pub sock: TcpStream,
    pub addr: SocketAddr,
    tls: Option<rustls::ServerConnection>,
    hs: Handshake,
    /// Plaintext read and not yet decoded.
    buf: BytesMut,
    /// Plain TCP: bytes the socket did not take yet (with TLS, rustls holds them).
    unsent: Vec<u8>,
    pub deadline: Instant,
    /// Its place among the inbound handshakes (freed once the peer is authenticated).
    pub slot: Option<HandshakeSlot>,
    /// Whether the socket is registered for writability too.
    pub writable: bool,
    pub span: tracing::Span,
}

/// What one read came to.
enum Read1 {
    Got,
    Empty,
    End,
}

impl Inbound {
    pub fn new(
        setup: &Setup,
        sock: TcpStream,
        addr: SocketAddr,
        slot: HandshakeSlot,
        now: Instant,
    ) -> Result<Inbound, LinkError> {
        let span = tracing::info_span!("handshake", node = %setup.name, %addr, dialled = false);
        // Small messages must not wait for Nagle: batching is the bundler's job.
        let _ = sock.set_nodelay(true);
        sock.set_nonblocking(true)?;
        let deadline = now + setup.config.handshake_timeout;
        let tls = setup.tls_server().transpose()?;
        let hs = setup.new_handshake(setup.accept_role(), deadline)?;
        Ok(Inbound {
            sock,
            addr,
            tls,
            hs,
            buf: BytesMut::with_capacity(CHUNK),
            unsent: Vec::new(),
            deadline,
            slot: Some(slot),
            writable: false,
            span,
        })
    }

    /// Go as far as the socket allows: read what is there, act on it, write what is owed.
    /// Called when the socket is ready (and once at the start).
    pub fn drive(&mut self, setup: &Setup) -> Progress {
        match self.step(setup) {
            Ok(p) => p,
            Err(e) => {
                // Whatever the machine queued on the way out (a REFUSE) goes if it can.
                self.queue_out();
                let _ = self.flush();
                Progress::Failed(e)
            }
        }
    }

    fn step(&mut self, setup: &Setup) -> Result<Progress, LinkError> {
        loop {
            self.take_frames(setup)?;
            self.queue_out();
            let owed = self.flush()?;
            if self.hs.peer().is_some() {
                return Ok(if owed {
                    Progress::Waiting { writable: true }
                } else {
                    Progress::Done
                });
            }
            match self.read_some()? {
                Read1::Got => {}
                Read1::Empty => return Ok(Progress::Waiting { writable: owed }),
                Read1::End => return Err(LinkError::Eof),
            }
        }
    }

    /// After [`Inbound::drive`] came to `Waiting { writable }`: on what (see
    /// `setup::Turn`, for who gives way when places run out). Everything read was acted
    /// on, so it waits on the peer, unless the peer proved the secret already.
    pub fn turn(&self, writable: bool) -> Turn {
        if self.hs.peer().is_some() {
            return Turn::Proved;
        }
        // The peer does not read what this node wrote, or TLS is still shaking hands (how
        // many bytes its next flight takes is rustls' to know): any byte short of that is
        // the peer's.
        if writable || self.tls.as_ref().is_some_and(|t| t.is_handshaking()) {
            return Turn::Peer { needs: u32::MAX };
        }
        // Over TLS the peer has shown a certificate of the cluster's CA by now, and how
        // much of a record rustls holds is not known here: any byte unread is the node's
        // to read. On plain TCP, the rest of the frame begun (a stranger trickling one
        // byte at a time must not look like a peer the node is behind on).
        if self.tls.is_some() {
            return Turn::Peer { needs: 1 };
        }
        Turn::Peer {
            needs: needs(&self.buf),
        }
    }

    /// The deadline passed: why the connection fails (naming the peer if its HELLO came).
    pub fn timed_out(&mut self, timeout: std::time::Duration) -> LinkError {
        match self.hs.handle_timeout(self.deadline) {
            Err(e) => e.into(),
            Ok(()) => LinkError::HandshakeTimeout(timeout),
        }
    }

    /// Decode and act on the whole frames read (none while TLS is still shaking hands, none
    /// once the peer is known).
    fn take_frames(&mut self, setup: &Setup) -> Result<(), LinkError> {
        if self.tls.as_ref().is_some_and(|t| t.is_handshaking()) {
            return Ok(());
        }
        while self.hs.peer().is_none() {
            if self.tls.is_none() && looks_like_tls(&self.buf) {
                return Err(LinkError::PeerSpeaksTls);
            }
            match frame::decode(&mut self.buf, HANDSHAKE_MAX_FRAME) {
                Ok(Some(f)) => {
                    self.hs.handle(f)?;
                }
                Ok(None) => return Ok(()),
                Err(e) => {
                    // Not a batchwire peer, or a broken one: say so, best effort (`drive`
                    // writes it on the way out).
                    let mut out = Vec::new();
                    setup.bad_frame_refusal(&e).encode(&mut out);
                    self.send(&out);
                    return Err(e.into());
                }
            }
        }
        Ok(())
    }

    /// The frames the machine wants sent, onto the way out.
    fn queue_out(&mut self) {
        let mut out = Vec::new();
        while let Some(f) = self.hs.poll_transmit() {
            f.encode(&mut out);
        }
        if !out.is_empty() {
            self.send(&out);
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        match &mut self.tls {
            // Within rustls' own bound (handshake frames are small).
            Some(t) => {
                let _ = t.writer().write_all(bytes);
            }
            None => self.unsent.extend_from_slice(bytes),
        }
    }

    /// Write what is owed; returns whether some of it still waits for room in the socket.
    fn flush(&mut self) -> Result<bool, LinkError> {
        let mut sock = &self.sock;
        match &mut self.tls {
            Some(t) => {
                while t.wants_write() {
                    match t.write_tls(&mut sock) {
                        Ok(_) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(true),
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(tls_error(e)),
                    }
                }
            }
            None => {
                while !self.unsent.is_empty() {
                    match sock.write(&self.unsent) {
                        Ok(n) => {
                            self.unsent.drain(..n);
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(true),
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
        Ok(false)
    }

    /// One read from the socket (through rustls, with TLS) onto `buf`.
    fn read_some(&mut self) -> Result<Read1, LinkError> {
        let mut sock = &self.sock;
        let Some(t) = &mut self.tls else {
            let mut chunk = [0u8; CHUNK];
            return match sock.read(&mut chunk) {
                Ok(0) => Ok(Read1::End),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    Ok(Read1::Got)
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(Read1::Empty),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(Read1::Got),
                Err(e) => Err(e.into()),
            };
        };
        // Plaintext rustls already holds first: the socket may have nothing new to wake
        // this loop for it.
        if let Some(r) = drain_plaintext(t, &mut self.buf)? {
            return Ok(r);
        }
        match t.read_tls(&mut sock) {
            // Closed in the middle of TLS' handshake (a peer that refused this node's
            // certificate closes without a word): a TLS failure, as rustls' own
            // `complete_io` says.
            Ok(0) if t.is_handshaking() => {
                return Err(tls_error(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "tls handshake eof",
                )));
            }
            Ok(0) => return Ok(Read1::End),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(Read1::Empty),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Ok(Read1::Got),
            Err(e) => return Err(tls_error(e)),
        }
        if let Err(e) = t.process_new_packets() {
            // Its alert, if it has one, goes if it can.
            let _ = t.write_tls(&mut sock);
            return Err(tls_error(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                e,
            )));
        }
        Ok(drain_plaintext(t, &mut self.buf)?.unwrap_or(Read1::Got))
    }

    /// The connection, blocking again, for its thread.
    pub fn into_handshaken(self) -> Result<(Handshaken, Option<HandshakeSlot>), LinkError> {
        let info = self
            .hs
            .peer()
            .ok_or(LinkError::Unexpected("end before the handshake"))?;
        self.sock.set_nonblocking(false)?;
        let link = match self.tls {
            Some(t) => Link::tls_established(self.sock, t.into()),
            None => Link::Plain(self.sock),
        };
        let h = Handshaken {
            link,
            info,
            buf: self.buf,
            addr: self.addr,
            deadline: self.deadline,
            dialled: false,
            joining: false,
        };
        Ok((h, self.slot))
    }
}

/// Move the plaintext rustls holds onto `buf`, up to a handshake frame's worth past what
/// is there (the rest is taken once that is decoded): `None` if it held none.
fn drain_plaintext(
    t: &mut rustls::ServerConnection,
    buf: &mut BytesMut,
) -> Result<Option<Read1>, LinkError> {
    let mut chunk = [0u8; CHUNK];
    let mut got = None;
    while buf.len() <= HANDSHAKE_MAX_FRAME + CHUNK {
        match t.reader().read(&mut chunk) {
            // The peer closed the TLS stream.
            Ok(0) => return Ok(Some(Read1::End)),
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                got = Some(Read1::Got);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(tls_error(e)),
        }
    }
    Ok(got)
}

/// A TLS failure, as the blocking setup reports it.
fn tls_error(e: std::io::Error) -> LinkError {
    LinkError::Tls(format!(
        "{e} (does the peer run TLS with a certificate from the same CA, naming the node?)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_begun_needs_the_rest_of_it() {
        assert_eq!(needs(&[]), 4, "a header");
        assert_eq!(needs(&[10, 0]), 2, "the rest of the header");
        let mut b = vec![10, 0, 0, 0];
        assert_eq!(needs(&b), 10);
        b.extend_from_slice(&[0; 9]);
        assert_eq!(needs(&b), 1);
        b.push(0);
        assert_eq!(needs(&b), 1, "whole (never the case here): still one");
    }
}
