//! How a link writes: TLS plaintext handed to rustls a piece at a time, and the socket
//! writes (waiting with a look up now and then, or not at all).

use std::io::{IoSlice, Write};
use std::net::TcpStream;

use super::RECORD;

/// Hands the plaintext of one TLS write to rustls a piece at a time, gathering small
/// slices into whole records: a write per slice made a record per slice, and a payload
/// sent by reference is a slice of its own. The whole records of a large slice at a
/// record's start go as they are. (Handing rustls all the slices at once with
/// `write_vectored` makes a record per slice too, and encrypting the whole window that
/// way can take longer than a connection that breaks often lives, so it never gets
/// written. One buffer for the whole write would cost an allocation of megabytes per
/// write.)
pub(super) struct TlsWrite<'a> {
    bufs: std::slice::Iter<'a, &'a [u8]>,
    rest: &'a [u8],
    plain: Vec<u8>,
}

impl<'a> TlsWrite<'a> {
    pub(super) fn new(bufs: &'a [&'a [u8]]) -> Self {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        TlsWrite {
            bufs: bufs.iter(),
            rest: &[],
            plain: Vec::with_capacity(total.min(RECORD)),
        }
    }

    /// Give `w` up to about `piece` bytes (whole records); whether any are left.
    pub(super) fn feed(&mut self, w: &mut dyn Write, piece: usize) -> std::io::Result<bool> {
        let mut fed = 0;
        while fed < piece {
            if self.rest.is_empty() {
                match self.bufs.next() {
                    Some(b) => self.rest = b,
                    None => break,
                }
                continue;
            }
            let room = piece - fed;
            if self.plain.is_empty() && self.rest.len() >= RECORD {
                // Whole records only; the tail is gathered with what follows.
                let n = self.rest.len().min(room.max(RECORD)) / RECORD * RECORD;
                w.write_all(&self.rest[..n])?;
                self.rest = &self.rest[n..];
                fed += n;
                continue;
            }
            let n = self.rest.len().min(RECORD - self.plain.len());
            self.plain.extend_from_slice(&self.rest[..n]);
            self.rest = &self.rest[n..];
            fed += n;
            if self.plain.len() == RECORD {
                w.write_all(&self.plain)?;
                self.plain.clear();
            }
        }
        // What is gathered goes with this piece (a short record at most once per piece).
        if !self.plain.is_empty() {
            w.write_all(&self.plain)?;
            self.plain.clear();
        }
        Ok(!self.rest.is_empty() || self.bufs.len() > 0)
    }

    /// Plaintext bytes not handed to rustls yet.
    pub(super) fn left(&self) -> usize {
        self.rest.len() + self.bufs.as_slice().iter().map(|b| b.len()).sum::<usize>()
    }
}

/// One send of `bufs` without waiting: how many bytes the socket took (0 if none).
#[cfg(unix)]
pub(super) fn send_now(fd: std::os::fd::RawFd, bufs: &[&[u8]]) -> std::io::Result<usize> {
    loop {
        // The fd is a link's socket, open while the link is borrowed.
        match crate::sys::send_vectored(fd, bufs) {
            Ok(n) => return Ok(n),
            Err(e) => match e.kind() {
                std::io::ErrorKind::Interrupted => continue,
                std::io::ErrorKind::WouldBlock => return Ok(0),
                _ => return Err(e),
            },
        }
    }
}

/// Write all of `buf`, going on after each timeout while `go_on` says so, and remove what
/// was written from it: after an error, what is left in `buf` is what was not written.
pub(super) fn write_draining(
    s: &TcpStream,
    buf: &mut Vec<u8>,
    go_on: &mut dyn FnMut() -> bool,
) -> std::io::Result<()> {
    let mut done = 0;
    let r = write_counted(s, &[&buf[..]], go_on, &mut done);
    buf.drain(..done);
    r
}

/// Write every slice, going on after each timeout while `go_on` says so.
pub(super) fn write_slices(
    s: &TcpStream,
    bufs: &[&[u8]],
    go_on: &mut dyn FnMut() -> bool,
) -> std::io::Result<()> {
    write_counted(s, bufs, go_on, &mut 0)
}

/// [`write_slices`], counting into `done` what was written (also when it fails).
fn write_counted(
    mut s: &TcpStream,
    bufs: &[&[u8]],
    go_on: &mut dyn FnMut() -> bool,
    done: &mut usize,
) -> std::io::Result<()> {
    let mut slices: Vec<IoSlice> = bufs.iter().map(|b| IoSlice::new(b)).collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        match s.write_vectored(rest) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                *done += n;
                IoSlice::advance_slices(&mut rest, n);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if !go_on() {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
