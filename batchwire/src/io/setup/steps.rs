//! The steps of one connection's setup: TLS, the handshake, the certificate's name, the
//! RESUME exchange.

use super::*;

impl Setup {
    /// Wrap a fresh socket: plain, or after a TLS handshake (over by `deadline`).
    pub(super) fn open(
        &self,
        stream: TcpStream,
        expect: Option<&Name>,
        joining: bool,
        deadline: Instant,
    ) -> Result<Link, LinkError> {
        let Some(tls) = &self.tls else {
            return Ok(Link::Plain(stream));
        };
        let dial = match expect {
            Some(n) => Some(n.as_str()),
            None if joining => Some(JOIN_SERVER_NAME),
            None => None,
        };
        Link::tls(stream, tls, dial, deadline).map_err(|e| {
            if matches!(
                e.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            ) {
                return LinkError::HandshakeTimeout(self.config.handshake_timeout);
            }
            LinkError::Tls(format!(
                "{e} (does the peer run TLS with a certificate from the same CA, naming the node?)"
            ))
        })
    }

    /// The role of an accepting end: a peer this node dials itself is refused.
    pub(crate) fn accept_role(&self) -> Role {
        Role::Accept {
            refuse: self.dials.clone(),
        }
    }

    /// A handshake machine for a connection whose setup must be over by `deadline`.
    pub(crate) fn new_handshake(
        &self,
        role: Role,
        deadline: Instant,
    ) -> Result<Handshake, LinkError> {
        let mut nonce = [0u8; 16];
        getrandom::fill(&mut nonce).map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(Handshake::new(
            HandshakeConfig {
                name: self.name.clone(),
                incarnation: self.incarnation,
                secret: self.secret.clone(),
                role,
            },
            nonce,
        )
        // The connection's deadline (TLS, handshake and RESUME share it) is the machine's.
        .with_deadline(
            deadline
                .checked_sub(self.config.handshake_timeout)
                .unwrap_or(deadline),
            self.config.handshake_timeout,
        ))
    }

    /// A TLS server connection for an inbound socket, if this node runs TLS.
    pub(crate) fn tls_server(&self) -> Option<Result<rustls::ServerConnection, LinkError>> {
        let tls = self.tls.as_ref()?;
        Some(
            rustls::ServerConnection::new(tls.server.clone())
                .map_err(|e| LinkError::Tls(e.to_string())),
        )
    }

    /// Drive the sans-IO handshake of a dialled connection (to `expect`, or a seed's
    /// address when `None`) over the blocking link, finishing by `deadline`. Returns the
    /// peer and any bytes read past the handshake. (Inbound connections are set up by the
    /// acceptor's loop.)
    pub(super) fn handshake(
        &self,
        link: &Link,
        expect: Option<Name>,
        deadline: Instant,
    ) -> Result<(PeerInfo, BytesMut), LinkError> {
        let role = match expect {
            Some(expect) => Role::Dial { expect },
            None => Role::Join,
        };
        let mut hs = self.new_handshake(role, deadline)?;
        let mut buf = BytesMut::with_capacity(HANDSHAKE_MAX_FRAME);
        let mut out = Vec::new();
        loop {
            // Send what the machine queued: HELLO first, then AUTH, or a REFUSE.
            while let Some(f) = hs.poll_transmit() {
                f.encode(&mut out);
            }
            if !out.is_empty() {
                link.set_deadline(deadline)?;
                link.write_all(&out)?;
                out.clear();
            }
            if let Some(peer) = hs.peer() {
                return Ok((peer, buf));
            }
            // Read until a whole frame is buffered.
            let frame = loop {
                if !link.is_tls() && looks_like_tls(&buf) {
                    return Err(LinkError::PeerSpeaksTls);
                }
                match frame::decode(&mut buf, HANDSHAKE_MAX_FRAME) {
                    Ok(Some(f)) => break f,
                    Ok(None) => {}
                    Err(e) => {
                        // Not a batchwire peer, or a broken one: say so, best effort.
                        let mut out = Vec::new();
                        self.bad_frame_refusal(&e).encode(&mut out);
                        let _ = link.write_all(&out);
                        return Err(e.into());
                    }
                }
                hs.handle_timeout(Instant::now())?;
                match read_small(link, &mut buf, deadline, self.config.handshake_timeout) {
                    Ok(()) => {}
                    // The socket gave up at the deadline: the machine says so, naming the
                    // peer if its HELLO came.
                    Err(LinkError::HandshakeTimeout(_)) => {
                        hs.handle_timeout(Instant::now().max(deadline))?;
                        return Err(LinkError::HandshakeTimeout(self.config.handshake_timeout));
                    }
                    Err(e) => return Err(e),
                }
            };
            // Feed it to the machine; on failure send its REFUSE (best effort) and give up.
            if let Err(e) = hs.handle(frame) {
                while let Some(f) = hs.poll_transmit() {
                    f.encode(&mut out);
                }
                let _ = link.write_all(&out);
                return Err(e.into());
            }
        }
    }

    /// With TLS: the peer's certificate must name the node it claimed. (A dialler's rustls
    /// already checked the name it dialled; the acceptor checks here.) On a mismatch both
    /// sides learn why: a REFUSE goes out before the connection closes.
    pub(super) fn check_certificate(&self, link: &Link, info: &PeerInfo) -> Result<(), LinkError> {
        if !link.is_tls() {
            return Ok(());
        }
        let res = match link.peer_certificate() {
            Some(cert) => cert_names(&cert, info.name.as_str()),
            None => Err("the peer presented no certificate".to_string()),
        };
        res.map_err(|why| {
            let reason = format!(
                "node {:?} refuses {:?}: {why}",
                self.name.as_str(),
                info.name.as_str()
            );
            refuse(link, frame::RefuseCode::Name, reason.clone());
            LinkError::Certificate {
                peer: info.name.to_string(),
                reason,
            }
        })
    }

    /// Exchange RESUME frames, let the session reconcile both windows, and make this the
    /// peer's current connection. Returns it with the bytes read past the peer's RESUME.
    pub(super) fn resume(
        &self,
        peer: &Arc<Peer>,
        link: Arc<Link>,
        info: &PeerInfo,
        mut buf: BytesMut,
        deadline: Instant,
        canonical: bool,
    ) -> Result<Option<(Arc<Conn>, BytesMut)>, LinkError> {
        let (id, ours) = peer.session(|s, now| s.handle_connect(now, info.incarnation));
        let mut out = Vec::new();
        Frame::Resume(ours).encode(&mut out);
        link.set_deadline(deadline)?;
        link.write_all(&out)?;
        let theirs: Resume = loop {
            match frame::decode(&mut buf, HANDSHAKE_MAX_FRAME)? {
                Some(Frame::Resume(r)) => break r,
                // The peer could not resume our session and reset its end: so do we.
                Some(Frame::Refuse(r)) if r.code == frame::RefuseCode::Reset => {
                    let _turn = peer.delivery_turn();
                    peer.session(|s, now| s.handle_reset(now));
                    return Err(LinkError::SessionReset(format!(
                        "the peer says: {}",
                        r.reason
                    )));
                }
                // Refused after the handshake (e.g. our certificate does not name us).
                Some(Frame::Refuse(r)) => {
                    return Err(HandshakeError::Refused {
                        peer: Some(info.name.clone()),
                        code: r.code,
                        reason: r.reason,
                    }
                    .into());
                }
                Some(other) => return Err(LinkError::Unexpected(other.kind_name())),
                None => read_small(&link, &mut buf, deadline, self.config.handshake_timeout)?,
            }
        };
        // From now on a blocked write returns every `write_check` for the writer to look up.
        link.set_read_timeout(None)?;
        link.set_write_timeout(Some(self.config.write_check))?;
        let mut conn = Conn::new(id, link);
        conn.canonical = canonical;
        let conn = Arc::new(conn);
        let lane = peer.lane.clone();
        conn.link.set_waker(Box::new(move || lane.poke()));
        // Reconcile and install together, so the session's current connection and the
        // connection the writer uses are always the same one. (Installs happen under the
        // session lock, so the redundancy check here sees every one.)
        let replaced = peer.session(|s, now| {
            if !canonical
                && s.incarnation() == Some(info.incarnation)
                && peer.current_is_live_canonical()
            {
                return Ok(None);
            }
            let r = s.handle_resume(now, id, theirs)?;
            peer.stats.acked.fetch_add(r.acked, Relaxed);
            Ok::<_, LinkError>(Some((r.resent, r.keep, peer.install(conn.clone()))))
        });
        let replaced = match replaced {
            // The two ends' numbering disagrees, again and again, and no connection of the
            // peer is live (else this is an impostor's claim, closed like any violation):
            // refusing every RESUME would cut the link for good. Start the session over
            // (with the delivery turn: no delivery is under way) and tell the peer to.
            Err(LinkError::Sequence(e))
                if peer
                    .session(|s, now| s.is_unresumable() && s.live_incarnation(now).is_none()) =>
            {
                let reset = {
                    let _turn = peer.delivery_turn();
                    peer.session(|s, now| {
                        let still = s.is_unresumable() && s.live_incarnation(now).is_none();
                        if still {
                            s.handle_reset(now);
                        }
                        still
                    })
                };
                if !reset {
                    conn.close();
                    return Err(LinkError::Sequence(e));
                }
                let e = LinkError::SessionReset(e.to_string());
                refuse(
                    &conn.link,
                    frame::RefuseCode::Reset,
                    format!("node {:?}: {e}", self.name.as_str()),
                );
                conn.close();
                return Err(e);
            }
            r => r?,
        };
        let Some((resent, keep, old)) = replaced else {
            conn.close();
            return Ok(None);
        };
        // The peer goes on with none of its messages in pieces below `keep`: drop what was
        // reassembled of those, and give their credit back.
        let gone = {
            let _turn = peer.delivery_turn();
            peer.lock_reassembly().discard_below(keep)
        };
        peer.abandon(gone);
        peer.stats.resent.fetch_add(resent, Relaxed);
        if let Some(old) = old {
            old.close();
        }
        Ok(Some((conn, buf)))
    }
}

/// One small read while the connection is being set up, with what is left of `deadline`
/// as its timeout: end of stream and running out of time are errors.
fn read_small(
    link: &Link,
    buf: &mut BytesMut,
    deadline: Instant,
    timeout: Duration,
) -> Result<(), LinkError> {
    // Reads that do not wait, and the waiting done here against the deadline: a read
    // that waits gets the socket's timeout afresh for every read it makes, and over TLS
    // one read goes on reading until rustls has a record whole, so a peer sending a byte
    // at a time could stretch it far past the deadline. (The socket's timeouts still
    // bound the handshake's writes.)
    if link.set_deadline(deadline).is_err() {
        return Err(LinkError::HandshakeTimeout(timeout));
    }
    loop {
        match link.read_append(buf, 512, false) {
            Ok(0) => return Err(LinkError::Eof),
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(LinkError::HandshakeTimeout(timeout));
        }
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        match crate::sys::poll_readable([link.fd()], ms) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::link::testing::{encrypt_aside, tls_pair};

    /// A peer that sends a TLS record a byte at a time after the TLS handshake (each read
    /// gets a byte, rustls never a whole record) does not stretch the read past the
    /// handshake's deadline.
    #[test]
    fn a_record_trickled_a_byte_at_a_time_does_not_outlast_the_deadline() {
        use std::io::Write;
        let (a, b) = tls_pair();
        let record = encrypt_aside(&b, &[7u8; 2000]);
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for byte in record.chunks(1) {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let _ = b.sock().write_all(byte);
                    std::thread::sleep(Duration::from_millis(20));
                }
            });
            let timeout = Duration::from_millis(300);
            let t0 = Instant::now();
            let mut buf = BytesMut::new();
            let r = read_small(&a, &mut buf, t0 + timeout, timeout);
            let took = t0.elapsed();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            assert!(matches!(r, Err(LinkError::HandshakeTimeout(_))), "{r:?}");
            assert!(took < Duration::from_secs(2), "read for {took:?}");
        });
    }
}
