//! A raw client speaking frames, for the attack suites: it connects (from a chosen source
//! address if need be), logs in with the secret as a real peer would, and then does only
//! what the test asks.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use batchwire_core::codec::Name;
use batchwire_core::frame::{self, Frame, Hello};
use batchwire_core::handshake::{Handshake, HandshakeConfig, Role};
use bytes::BytesMut;

use super::SECRET;

const T: Duration = Duration::from_secs(10);

/// A raw client speaking frames.
pub struct Raw {
    pub s: TcpStream,
    pub buf: BytesMut,
}

impl Raw {
    pub fn connect(addr: SocketAddr) -> Raw {
        let s = TcpStream::connect_timeout(&addr, T).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        Raw {
            s,
            buf: BytesMut::new(),
        }
    }

    pub fn send(&mut self, f: &Frame) {
        let mut out = Vec::new();
        f.encode(&mut out);
        self.s.write_all(&out).unwrap();
    }

    /// The next frame, or `None` once the node closes the connection (or `wait` passes).
    pub fn recv(&mut self, wait: Duration) -> Option<Frame> {
        let deadline = Instant::now() + wait;
        loop {
            if let Ok(Some(f)) = frame::decode(&mut self.buf, 1 << 20) {
                return Some(f);
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            self.s
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .unwrap();
            let mut chunk = [0u8; 4096];
            match self.s.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Read until the node closes; `false` if it is still open after `wait`.
    pub fn closed_within(&mut self, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        let mut chunk = [0u8; 4096];
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            self.s
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .unwrap();
            match self.s.read(&mut chunk) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
        false
    }
}

pub fn hello(name: &str, incarnation: u64, nonce: [u8; 16]) -> Frame {
    Frame::Hello(Hello {
        version: batchwire_core::frame::PROTOCOL_VERSION,
        incarnation,
        nonce,
        name: Name::new(name).unwrap(),
    })
}

/// A node's incarnation, as its HELLO tells anyone who connects.
pub fn incarnation_of(addr: SocketAddr) -> u64 {
    let mut r = Raw::connect(addr);
    match r.recv(T) {
        Some(Frame::Hello(h)) => h.incarnation,
        other => panic!("no HELLO: {other:?}"),
    }
}

/// Log in to the node at `addr` as `name` (dialling, with the secret), as a real peer
/// would. Returns the connection after the handshake.
pub fn login(addr: SocketAddr, name: &str, expect: &str, incarnation: u64) -> Raw {
    login_trickled(addr, name, expect, incarnation, None)
}

/// [`login`], writing each of its frames a byte at a time with `pause` between the bytes
/// if given.
pub fn login_trickled(
    addr: SocketAddr,
    name: &str,
    expect: &str,
    incarnation: u64,
    pause: Option<Duration>,
) -> Raw {
    let mut r = Raw::connect(addr);
    let mut hs = Handshake::new(
        HandshakeConfig {
            name: Name::new(name).unwrap(),
            incarnation,
            secret: Arc::from(SECRET),
            role: Role::Dial {
                expect: Name::new(expect).unwrap(),
            },
        },
        [0x42; 16],
    );
    loop {
        while let Some(f) = hs.poll_transmit() {
            match pause {
                None => r.send(&f),
                Some(p) => {
                    let mut out = Vec::new();
                    f.encode(&mut out);
                    for b in out {
                        r.s.write_all(&[b]).unwrap();
                        std::thread::sleep(p);
                    }
                }
            }
        }
        if hs.is_done() {
            return r;
        }
        let f = r.recv(T).expect("the node closed during the handshake");
        hs.handle(f).expect("handshake");
    }
}

/// A connection to `to` from the local address `ip` (any of 127.0.0.0/8 on loopback).
pub fn connect_from(ip: &str, to: SocketAddr) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    s.bind(&SocketAddr::new(ip.parse().unwrap(), 0).into())?;
    s.connect_timeout(&to.into(), T)?;
    Ok(s.into())
}

/// A member's datagram side, as a member (or an attacker with the secret) has it: sealed
/// membership datagrams from `name`, numbered on from 1.
pub struct Datagrams {
    pub sock: std::net::UdpSocket,
    pub sealer: batchwire_core::membership::datagram::Sealer,
}

impl Datagrams {
    /// Sealing as `name` (boot `boot`) with `secret`.
    pub fn new(name: &str, boot: u64, secret: &[u8]) -> Datagrams {
        use batchwire_core::membership::datagram::{DatagramKey, Sealer};
        Datagrams {
            sock: std::net::UdpSocket::bind("127.0.0.1:0").unwrap(),
            sealer: Sealer::new(
                &DatagramKey::from_secret(secret),
                batchwire_core::codec::Name::new(name).unwrap(),
                boot,
            ),
        }
    }

    /// The sealed datagram carrying the MEMBER `body` to the member `to_name` in its boot
    /// `to_boot` (its incarnation).
    pub fn seal(&mut self, to_name: &str, to_boot: u64, body: &[u8]) -> Vec<u8> {
        self.sealer.seal(to_name.as_bytes(), to_boot, body)
    }

    /// Send bytes as they are to `to`.
    pub fn send_raw(&self, to: SocketAddr, bytes: &[u8]) {
        self.sock.send_to(bytes, to).unwrap();
    }

    /// Seal `body` for `to_name` (boot `to_boot`) and send it to `to`.
    pub fn send(&mut self, to: SocketAddr, to_name: &str, to_boot: u64, body: &[u8]) {
        let d = self.seal(to_name, to_boot, body);
        self.send_raw(to, &d);
    }
}
