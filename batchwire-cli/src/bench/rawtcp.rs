//! The raw-TCP ceilings' two halves: messages pre-encoded as batchwire MESSAGES frames and
//! written with plain `write(2)`s, and a read loop that decodes them. No node, no window,
//! no acknowledgement, no flow control: what the machine does with the same bytes.
//! `throughput`'s and `mperf`'s `raw` are built from these; `fan-in`'s reads with [`read`].
//!
//! `raw` still frames and decodes every message, writes 64 KiB at a time and zeroes its
//! read buffer before each read, so it is not what the socket can carry. [`stream_bytes`]
//! and [`drain_bytes`] are: plain bytes in 1 MiB writes from one buffer, read into one
//! reused buffer that is never cleared (`throughput`'s `tcp`, as `iperf3 -l 1M` does).

use std::io::{Read, Write};
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

/// The size of each write and read of the plain-TCP ceiling (`iperf3 -l 1M`).
pub const CEILING_IO: usize = 1 << 20;

/// The plain-TCP ceiling's sender: `total` bytes to `s` in writes of [`CEILING_IO`] from
/// one buffer filled once. Nothing is framed or encoded.
pub fn stream_bytes(s: &mut impl Write, total: u64) -> Result<(), String> {
    let buf = vec![0x5au8; CEILING_IO];
    let mut left = total;
    while left > 0 {
        let n = left.min(CEILING_IO as u64) as usize;
        s.write_all(&buf[..n]).ctx("tcp write")?;
        left -= n as u64;
    }
    Ok(())
}

/// The plain-TCP ceiling's receiver: read from `s` into one buffer of [`CEILING_IO`],
/// allocated and cleared once, until `total` bytes came or the stream ended; returns the
/// bytes read. `first` is called when the first bytes arrive.
pub fn drain_bytes(s: &mut impl Read, total: u64, mut first: impl FnMut()) -> Result<u64, String> {
    let mut buf = vec![0u8; CEILING_IO];
    let mut got = 0u64;
    while got < total {
        let n = s.read(&mut buf).ctx("tcp read")?;
        if n == 0 {
            break;
        }
        if got == 0 {
            first();
        }
        got += n as u64;
    }
    Ok(got)
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
