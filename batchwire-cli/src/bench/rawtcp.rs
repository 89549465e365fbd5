//! The raw-TCP ceilings' two halves: messages pre-encoded as batchwire MESSAGES frames and
//! written with plain `write(2)`s, and a read loop that decodes them. No node, no window,
//! no acknowledgement, no flow control: what the machine does with the same bytes.
//! `throughput`'s and `mperf`'s `raw` are built from these; `fan-in`'s reads with [`read`].

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use bytes::BytesMut;

use super::Context;
use super::payloads::{header_len, stamp};
use batchwire_core::codec::Name;
use batchwire_core::frame::{self, Frame, ListWriter};

/// The most a frame of pre-encoded messages holds (and the size of each write).
pub const FRAME_BYTES: usize = 64 << 10;

/// `n` numbered messages of `size` bytes (the payload header as [`super::payloads`] stamps
/// it: sequence, then `tag` if any) for mailbox `to`, encoded as MESSAGES frames of at most
/// [`FRAME_BYTES`], back to back.
pub fn encode(n: u64, size: usize, tag: Option<u32>, to: &Name) -> Vec<u8> {
    let from = Name::from_static("");
    let size = size.max(header_len(tag));
    let mut payload = vec![0u8; size];
    let mut out = Vec::with_capacity(n as usize * (size + 16 + to.len()));
    let mut w = ListWriter::start(&mut out);
    for seq in 0..n {
        stamp(&mut payload, seq, tag);
        if !w.is_empty() && w.len(&out) + size + 16 > FRAME_BYTES {
            w.finish(&mut out);
            w = ListWriter::start(&mut out);
        }
        w.push(&mut out, to, &from, &payload);
    }
    w.finish(&mut out);
    out
}

/// Connect to `addr`, trying again every 5 ms (the peer's process may not listen yet) for
/// at most `limit`; with `TCP_NODELAY` set.
pub fn connect_within(addr: SocketAddr, limit: Duration) -> Result<TcpStream, String> {
    let deadline = Instant::now() + limit;
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) if Instant::now() > deadline => {
                return Err(format!("raw connect to {addr}: {e}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Accept one connection on `l`, or give up after `limit` (the peer's process may have
/// failed before it connected).
pub fn accept_within(l: &TcpListener, limit: Duration) -> Result<TcpStream, String> {
    l.set_nonblocking(true).ctx("raw listen")?;
    let deadline = Instant::now() + limit;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).ctx("raw accept")?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(format!("raw: no sender connected within {limit:?}"));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(format!("raw accept: {e}")),
        }
    }
}

/// Read frames from `s` until `expected` messages have come (or the stream ends), handing
/// each payload to `see`. A stream that ends early is not an error here: the caller's
/// count of what arrived shows it. `first` is called once, when the first bytes arrive (a
/// CPU clock's start).
pub fn read(
    s: &mut impl Read,
    expected: u64,
    mut first: impl FnMut(),
    mut see: impl FnMut(&[u8]),
) -> Result<(), String> {
    let mut buf = BytesMut::with_capacity(2 * FRAME_BYTES);
    let mut got = 0;
    let mut started = false;
    while got < expected {
        let len = buf.len();
        buf.resize(len + FRAME_BYTES, 0);
        let n = s.read(&mut buf[len..]).ctx("raw read")?;
        buf.truncate(len + n);
        if n == 0 {
            break;
        }
        if !started {
            started = true;
            first();
        }
        while let Some(f) = frame::decode(&mut buf, 1 << 26).ctx("raw decode")? {
            if let Frame::Messages(list) = f {
                for m in list.iter() {
                    see(&m.payload);
                    got += 1;
                }
            }
        }
    }
    Ok(())
}
