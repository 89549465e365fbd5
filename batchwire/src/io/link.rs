//! The byte transport under a connection: plain TCP, or TCP with mutually authenticated
//! TLS (rustls). The batchwire handshake, frames and bundling run unchanged on top.
//!
//! With TLS one rustls connection serves two threads (the reader and the writer), so it
//! sits behind a mutex that is never held across a socket call: the writer encrypts under
//! the lock and writes the records after releasing it; the reader reads ciphertext without
//! the lock and decrypts under it. Only the writer writes to the socket: records rustls
//! wants to send in reply to what the reader fed it stay in rustls until the writer, woken
//! for them (`wants_write`), sends them in order with its own. (A key update's reply is
//! kept by rustls apart, not reported by `wants_write`: it goes out in front of the next
//! record this end sends, which TLS 1.3 allows.)
//!
//! Over TLS too, a write may be made without waiting ([`Link::try_write_vectored`]: a
//! sender's lone message, the ticker's heartbeat, control a resting connection's reader
//! made due): a piece is encrypted and sent with `MSG_DONTWAIT`, and the records the
//! socket did not take wait in `unsent`, in front of everything written after them.
//!
//! Every write after setup goes through [`Link::write_vectored`]: the socket's write
//! timeout (`write_check`) makes each blocked write return now and then, and the caller
//! says whether to go on. So no write blocks without a look up.

mod pieces;
mod tls_config;
#[cfg(unix)]
use pieces::send_now;
use pieces::{TlsWrite, write_draining, write_slices};
pub(crate) use tls_config::{JOIN_SERVER_NAME, TlsConfigs};

use std::io::{BufRead, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::certs::{TlsFiles, cert_names, tls_err};
use crate::error::Error;

pub(crate) struct TlsState {
    conn: rustls::Connection,
}

/// Ciphertext read from the socket, handed to rustls from `start` (it takes about 4 KiB
/// per call); the reader's alone, read into again once rustls has taken all of it.
#[derive(Default)]
pub(crate) struct Cipher {
    buf: BytesMut,
    start: usize,
    /// rustls refused what was read: every later read fails too (what the failing read
    /// had decrypted was not handed on, so nothing after it may be).
    failed: bool,
}

/// A connection's transport, shared by its reader and its writer.
// One per connection and always behind an `Arc`: the size difference does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Link {
    Plain(TcpStream),
    Tls {
        sock: TcpStream,
        state: Mutex<TlsState>,
        /// rustls has records to send that no write carried yet (replies to what the
        /// reader fed it): the writer should call `flush_tls`.
        pending_out: AtomicBool,
        /// Wakes the writer for those.
        waker: OnceLock<Box<dyn Fn() + Send + Sync>>,
        /// Ciphertext read from the socket without holding `state` (the reader's alone:
        /// its lock is never contended; its buffer is reused).
        cipher: Mutex<Cipher>,
        /// Records encrypted by a write that did not wait, which the socket did not take:
        /// the next write sends them first (only the holder of the write turn touches
        /// them, so this lock is never contended). `pending_out` is set while any wait.
        unsent: Mutex<Vec<u8>>,
    },
}

fn io_err(e: rustls::Error) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("TLS: {e}"))
}

/// A socket whose every read and write must finish by `deadline`: each call gets the time
/// that is left as its timeout, and none is left is a `TimedOut` error. (A per-call timeout
/// alone lets a client that sends a byte now and then hold a connection forever.)
pub(crate) struct DeadlineIo<'a> {
    pub sock: &'a TcpStream,
    pub deadline: Instant,
}

impl DeadlineIo<'_> {
    fn left(&self) -> std::io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        Ok(left)
    }
}

impl Read for DeadlineIo<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.sock.set_read_timeout(Some(self.left()?))?;
        (&mut &*self.sock).read(buf)
    }
}

impl Write for DeadlineIo<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.sock.set_write_timeout(Some(self.left()?))?;
        (&mut &*self.sock).write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Link {
    /// Run the TLS handshake on `sock` (dialling `dial`, or accepting) and return the
    /// link. It must be over by `deadline`, however slowly the peer trickles its bytes.
    pub fn tls(
        sock: TcpStream,
        cfg: &TlsConfigs,
        dial: Option<&str>,
        deadline: Instant,
    ) -> std::io::Result<Link> {
        let mut conn: rustls::Connection = match dial {
            Some(JOIN_SERVER_NAME) => {
                let sn = ServerName::try_from(JOIN_SERVER_NAME).expect("a valid DNS name");
                rustls::ClientConnection::new(cfg.join.clone(), sn)
                    .map_err(io_err)?
                    .into()
            }
            Some(name) => {
                let sn = ServerName::try_from(name.to_string()).map_err(|_| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!("{name:?} is not a valid DNS name for TLS"),
                    )
                })?;
                rustls::ClientConnection::new(cfg.client.clone(), sn)
                    .map_err(io_err)?
                    .into()
            }
            None => rustls::ServerConnection::new(cfg.server.clone())
                .map_err(io_err)?
                .into(),
        };
        let mut io = DeadlineIo {
            sock: &sock,
            deadline,
        };
        while conn.is_handshaking() {
            conn.complete_io(&mut io)?;
        }
        // Flush anything the handshake left (e.g. session tickets).
        while conn.wants_write() {
            conn.write_tls(&mut io)?;
        }
        Ok(Link::tls_established(sock, conn))
    }

    /// The link of a blocking socket whose TLS handshake `conn` has done (the acceptor
    /// drives inbound ones without blocking, see `io::accept`). Plaintext and records that
    /// `conn` still holds come first on the link.
    pub fn tls_established(sock: TcpStream, mut conn: rustls::Connection) -> Link {
        // The writer and reader bound what they hand rustls themselves.
        conn.set_buffer_limit(None);
        Link::Tls {
            sock,
            state: Mutex::new(TlsState { conn }),
            pending_out: AtomicBool::new(false),
            waker: OnceLock::new(),
            cipher: Mutex::new(Cipher::default()),
            unsent: Mutex::new(Vec::new()),
        }
    }

    pub fn sock(&self) -> &TcpStream {
        match self {
            Link::Plain(s) => s,
            Link::Tls { sock, .. } => sock,
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Link::Tls { .. })
    }

    fn lock<T>(state: &Mutex<T>) -> MutexGuard<'_, T> {
        state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The peer's end-entity certificate (TLS only).
    pub fn peer_certificate(&self) -> Option<CertificateDer<'static>> {
        match self {
            Link::Plain(_) => None,
            Link::Tls { state, .. } => Self::lock(state)
                .conn
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| c.clone().into_owned()),
        }
    }

    /// Write every buffer, in order, with as few system calls as possible. Whenever a
    /// write times out (the socket's write timeout), `go_on` says whether to keep trying;
    /// if not, the error is returned (and the connection must be closed: part of the
    /// buffers may have been written). Only one thread writes at a time (whoever holds the
    /// peer's write turn, or the setup before the connection is installed).
    pub fn write_vectored(
        &self,
        bufs: &[&[u8]],
        go_on: &mut dyn FnMut() -> bool,
    ) -> std::io::Result<usize> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        match self {
            Link::Plain(s) => write_slices(s, bufs, go_on)?,
            Link::Tls {
                sock,
                state,
                pending_out,
                unsent,
                ..
            } => {
                // What a write that did not wait left goes first. (A write that fails
                // part way keeps what it did not write there, so that a last write, the
                // goodbye at shutdown, never repeats or skips a record's bytes.)
                // Taken out for the write (no lock is held across a write that waits;
                // only the holder of the write turn touches `unsent`), and its buffer
                // freed once all of it went.
                let mut left = std::mem::take(&mut *Self::lock(unsent));
                if !left.is_empty() {
                    let r = write_draining(sock, &mut left, go_on);
                    if !left.is_empty() {
                        *Self::lock(unsent) = left;
                    }
                    r?;
                }
                // Encrypt a piece of at most `PIECE` bytes under the state lock, write it
                // after releasing it, and go on with the next piece. Records rustls queued
                // in reply to the reader go out first, in order. In pieces because after a
                // reconnect `bufs` is the whole send window (up to `unacked_bytes`):
                // encrypted at once, that can take longer than a connection that breaks
                // often lives, so none of it would ever be written (and it would hold the
                // lock the reader needs, and a buffer of the window's size).
                let mut tls = TlsWrite::new(bufs);
                let mut out = Vec::with_capacity(total.min(PIECE) + 1024);
                loop {
                    out.clear();
                    let more = {
                        let mut st = Self::lock(state);
                        pending_out.store(false, Ordering::SeqCst);
                        while st.conn.wants_write() {
                            st.conn.write_tls(&mut out)?;
                        }
                        let more = tls.feed(&mut st.conn.writer(), PIECE)?;
                        while st.conn.wants_write() {
                            st.conn.write_tls(&mut out)?;
                        }
                        more
                    };
                    if !out.is_empty()
                        && let Err(e) = write_draining(sock, &mut out, go_on)
                    {
                        if !out.is_empty() {
                            Self::lock(unsent).extend_from_slice(&out);
                            pending_out.store(true, Ordering::SeqCst);
                        }
                        return Err(e);
                    }
                    if !more {
                        break;
                    }
                }
            }
        }
        Ok(total)
    }

    /// Write as much of `bufs`, in order, as the socket takes now without waiting, and
    /// return how many bytes that was (0 if it takes none). The caller owns what was not
    /// written: it must go out before anything else. Over TLS, at most a piece ([`PIECE`])
    /// is encrypted, and what is returned is the plaintext taken: the records of it that
    /// the socket did not take wait in the link and go first with the next write
    /// ([`Link::tls_pending`] says so; call [`Link::flush_tls`] or write again).
    #[cfg(unix)]
    pub fn try_write_vectored(&self, bufs: &[&[u8]]) -> Option<std::io::Result<usize>> {
        match self {
            Link::Plain(s) => {
                use std::os::fd::AsRawFd;
                Some(send_now(s.as_raw_fd(), bufs))
            }
            Link::Tls {
                sock,
                state,
                pending_out,
                unsent,
                ..
            } => Some((|| {
                use std::os::fd::AsRawFd;
                let fd = sock.as_raw_fd();
                let mut u = Self::lock(unsent);
                if !u.is_empty() {
                    let n = send_now(fd, &[&u])?;
                    u.drain(..n);
                    if !u.is_empty() {
                        return Ok(0);
                    }
                    // An idle connection keeps no buffer of up to a piece.
                    *u = Vec::new();
                }
                let total: usize = bufs.iter().map(|b| b.len()).sum();
                let mut tls = TlsWrite::new(bufs);
                let mut out = Vec::with_capacity(total.min(PIECE) + 1024);
                {
                    let mut st = Self::lock(state);
                    pending_out.store(false, Ordering::SeqCst);
                    while st.conn.wants_write() {
                        st.conn.write_tls(&mut out)?;
                    }
                    tls.feed(&mut st.conn.writer(), PIECE)?;
                    while st.conn.wants_write() {
                        st.conn.write_tls(&mut out)?;
                    }
                }
                let n = if out.is_empty() {
                    0
                } else {
                    send_now(fd, &[&out])?
                };
                if n < out.len() {
                    u.extend_from_slice(&out[n..]);
                    pending_out.store(true, Ordering::SeqCst);
                }
                Ok(total - tls.left())
            })()),
        }
    }

    /// Elsewhere than Unix there is no non-blocking write here (write-through is off).
    #[cfg(not(unix))]
    pub fn try_write_vectored(&self, _bufs: &[&[u8]]) -> Option<std::io::Result<usize>> {
        None
    }

    /// Whether [`Link::try_write_vectored`] writes (on Unix, plain TCP and TLS).
    pub fn writes_without_waiting(&self) -> bool {
        cfg!(unix)
    }

    /// Write `buf` (setup: the socket's timeouts bound it).
    pub fn write_all(&self, buf: &[u8]) -> std::io::Result<()> {
        self.write_vectored(&[buf], &mut || false).map(|_| ())
    }

    /// TLS: whether records wait to be sent: rustls' own (replies to what the reader fed
    /// it), or what a write that did not wait left (see `flush_tls`).
    pub fn tls_pending(&self) -> bool {
        match self {
            Link::Plain(_) => false,
            Link::Tls { pending_out, .. } => pending_out.load(Ordering::SeqCst),
        }
    }

    /// TLS: send the records that wait (see `tls_pending`).
    pub fn flush_tls(&self, go_on: &mut dyn FnMut() -> bool) -> std::io::Result<()> {
        self.write_vectored(&[], go_on).map(|_| ())
    }

    /// Call `wake` when rustls has records to send (the writer then calls `flush_tls`).
    pub fn set_waker(&self, wake: Box<dyn Fn() + Send + Sync>) {
        if let Link::Tls { waker, .. } = self {
            let _ = waker.set(wake);
        }
    }

    /// Read some bytes of the stream into `out`; 0 at its end.
    /// The socket of a plain link (reads go straight into a buffer's spare capacity).
    #[cfg(unix)]
    pub fn plain_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        match self {
            Link::Plain(s) => Some(s.as_raw_fd()),
            Link::Tls { .. } => None,
        }
    }

    /// The socket, plain or TLS (the node's thread for resting connections polls it).
    #[cfg(unix)]
    pub fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.sock().as_raw_fd()
    }

    /// The connection rests (no reader thread; see `io::resting`): let go of the buffer
    /// ciphertext is read into (TLS), if rustls took all of it; the next read makes a new
    /// one. Returns whether one was let go. (Read into at the handshake, its first pages
    /// stayed resident: 4-8 KiB of every idle TLS peer.)
    pub fn release_read_buffer(&self) -> bool {
        match self {
            Link::Plain(_) => false,
            Link::Tls { cipher, .. } => {
                let mut c = Self::lock(cipher);
                if c.start < c.buf.len() || c.buf.capacity() == 0 {
                    return false;
                }
                c.buf = BytesMut::new();
                c.start = 0;
                true
            }
        }
    }

    /// What one read should ask for, given `read_bytes`: all of it on a plain link, at most
    /// [`TLS_PLAINTEXT_READ`] over TLS.
    pub fn read_size(&self, read_bytes: usize) -> usize {
        match self {
            Link::Plain(_) => read_bytes,
            Link::Tls { .. } => read_bytes.min(TLS_PLAINTEXT_READ),
        }
    }

    /// Read some bytes of the stream (at most `want`, and over TLS at most
    /// [`TLS_PLAINTEXT_READ`]: ask [`Link::read_size`] first) onto the end of `buf`; how
    /// many, 0 at its end. Nothing is zeroed first: a plain link's socket is read straight
    /// into `buf`'s spare capacity ([`crate::sys::recv_append`]); over TLS the plaintext is
    /// copied there from rustls, and ciphertext goes from a reused buffer to rustls without
    /// a stop in between. (Zeroing `want` bytes before every read would cost a pass over up
    /// to 256 KiB per read, however little arrived: with small messages, a large share of
    /// the receiver's work.) Without `wait`, `WouldBlock` if nothing is at hand.
    pub fn read_append(
        &self,
        buf: &mut BytesMut,
        want: usize,
        wait: bool,
    ) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        match self {
            // The fd is this link's socket, open for as long as `self` is borrowed.
            Link::Plain(s) => crate::sys::recv_append(s.as_raw_fd(), buf, want, wait),
            Link::Tls {
                sock,
                state,
                pending_out,
                waker,
                cipher,
                ..
            } => {
                let feed = |conn: &mut rustls::Connection, data: &mut &[u8]| {
                    conn.read_tls(data)?;
                    if let Err(e) = conn.process_new_packets() {
                        // The connection closes; only the writer writes to the socket,
                        // so no alert goes out from here.
                        return Err(io_err(e));
                    }
                    // Protocol replies (key updates) wait in rustls for the writer, which
                    // alone writes to the socket.
                    if conn.wants_write() {
                        pending_out.store(true, Ordering::SeqCst);
                        if let Some(wake) = waker.get() {
                            wake();
                        }
                    }
                    Ok(())
                };
                let want = want.min(TLS_PLAINTEXT_READ);
                buf.reserve(want);
                let mut got = 0;
                let mut cipher = Self::lock(cipher);
                if cipher.failed {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "TLS: the connection failed before",
                    ));
                }
                loop {
                    {
                        let mut st = Self::lock(state);
                        let conn = &mut st.conn;
                        // 1. Plaintext already decrypted goes out first (rustls refuses more
                        //    ciphertext while its plaintext buffer is full), as much as
                        //    `want` takes: a record is at most 16 KiB, a read may be more.
                        loop {
                            let mut r = conn.reader();
                            match r.fill_buf() {
                                // The end of the stream (after what was copied).
                                Ok([]) => return Ok(got),
                                Ok(chunk) => {
                                    let n = chunk.len().min(want - got);
                                    buf.extend_from_slice(&chunk[..n]);
                                    r.consume(n);
                                    got += n;
                                    if got == want {
                                        return Ok(got);
                                    }
                                }
                                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                                // What was copied first; the error comes again next time.
                                Err(_) if got > 0 => return Ok(got),
                                Err(e) => return Err(e),
                            }
                        }
                        // 2. Then feed buffered ciphertext, one call at a time.
                        let c = &mut *cipher;
                        if c.start < c.buf.len() {
                            let mut rest = &c.buf[c.start..];
                            if let Err(e) = feed(conn, &mut rest) {
                                // The connection closes: nothing of this call is handed on,
                                // and no later read goes on after it.
                                buf.truncate(buf.len() - got);
                                c.failed = true;
                                return Err(e);
                            }
                            c.start = c.buf.len() - rest.len();
                            continue;
                        }
                    }
                    // Nothing more without waiting: hand on what there is.
                    if got > 0 {
                        return Ok(got);
                    }
                    // 3. Nothing buffered: read ciphertext from the socket without the
                    //    state lock (rustls takes it in step 2).
                    let c = &mut *cipher;
                    c.buf.clear();
                    c.start = 0;
                    if crate::sys::recv_append(sock.as_raw_fd(), &mut c.buf, TLS_READ, wait)? == 0 {
                        return Ok(0);
                    }
                }
            }
        }
    }

    pub fn set_read_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        self.sock().set_read_timeout(d)
    }

    pub fn set_write_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        self.sock().set_write_timeout(d)
    }

    pub fn shutdown(&self, how: Shutdown) -> std::io::Result<()> {
        self.sock().shutdown(how)
    }

    /// Give the next reads and writes what is left until `deadline` as their timeout
    /// (`TimedOut` if nothing is left).
    pub fn set_deadline(&self, deadline: Instant) -> std::io::Result<()> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.set_read_timeout(Some(left))?;
        self.set_write_timeout(Some(left))
    }
}

/// A TLS record's most plaintext.
const RECORD: usize = 16 << 10;
/// Most ciphertext read from the socket at once.
const TLS_READ: usize = 64 << 10;
/// Most plaintext one read hands on over TLS, whatever `read_bytes` asks (see
/// [`Link::read_size`]): with 256 KiB reads, and receive buffers of four of them, 1 KB
/// and 10 KB messages over TLS went at 0.72-0.81x the rate of 64 KiB reads.
const TLS_PLAINTEXT_READ: usize = 64 << 10;
/// Most plaintext encrypted per turn of the TLS state lock (then written).
const PIECE: usize = 16 * RECORD;

#[cfg(test)]
mod tests;

/// Fixtures for the io layer's tests.
#[cfg(test)]
pub(crate) mod testing {
    pub use super::tests::tls_pair;
    use super::*;

    /// The records `link` (TLS) would send for `data`, encrypted and kept, not sent.
    pub fn encrypt_aside(link: &Link, data: &[u8]) -> Vec<u8> {
        let Link::Tls { state, .. } = link else {
            panic!("not TLS")
        };
        let mut st = Link::lock(state);
        std::io::Write::write_all(&mut st.conn.writer(), data).unwrap();
        let mut out = Vec::new();
        while st.conn.wants_write() {
            st.conn.write_tls(&mut out).unwrap();
        }
        out
    }
}
