//! Bytes off the connection: each frame acted on, deliveries and notices, the peer's SYNC.

use super::*;

impl Peer {
    /// Bytes off the current connection. Every whole frame is acted on: messages and
    /// completed pieces become deliveries ([`Peer::poll_delivery`]) for the mailboxes
    /// `exists` says this node has (the others' credit goes back at once), ACKs release
    /// the window, CREDIT and SYNC move the send credit.
    pub fn handle_read(
        &mut self,
        now: Instant,
        bytes: &[u8],
        exists: impl Fn(&Name) -> bool,
    ) -> Result<(), PeerError> {
        if bytes.is_empty() || self.goodbye {
            return Ok(());
        }
        self.buf.extend_from_slice(bytes);
        self.s.handle_heard(now, self.id);
        let r = self.read_frames(now, &exists);
        self.after_session();
        r
    }

    pub(super) fn read_frames(
        &mut self,
        now: Instant,
        exists: &impl Fn(&Name) -> bool,
    ) -> Result<(), PeerError> {
        while let Some(f) =
            frame::decode(&mut self.buf, self.cfg.max_frame).map_err(PeerError::Frame)?
        {
            match f {
                Frame::Messages(l) => {
                    let Some(d) = self
                        .s
                        .begin_delivery(self.id, l.first_seq, l.len() as u32)
                        .map_err(PeerError::Sequence)?
                    else {
                        continue;
                    };
                    for m in l.skip(d.skip).iter() {
                        let c = message_len(&m.to, &m.from, m.payload.len()) as u64;
                        self.deliver(m.to, m.from, m.payload, c, exists)?;
                    }
                    self.s.end_delivery(now, d, d.end, l.body().len());
                }
                Frame::Fragment(fr) => {
                    let Some(d) = self
                        .s
                        .begin_delivery(self.id, fr.seq, 1)
                        .map_err(PeerError::Sequence)?
                    else {
                        continue;
                    };
                    if d.skip == 0 {
                        let keep = self.reasm.keeps(&fr, || exists(&fr.to));
                        if keep {
                            self.rcredit
                                .charge(&fr.to, fr.charge())
                                .map_err(PeerError::Credit)?;
                        } else {
                            self.rcredit.dropped(&fr.to, fr.charge());
                        }
                        match self.reasm.add(&fr, keep).map_err(PeerError::Reassembly)? {
                            Added::Complete {
                                to,
                                from,
                                payload,
                                kept: true,
                                charged,
                            } => {
                                // Charged piece by piece already.
                                self.deliveries.push_back(Delivery {
                                    to,
                                    from,
                                    payload,
                                    charge: charged,
                                });
                            }
                            Added::Complete { to, from, .. } => self.notice(to, from, 1),
                            _ => {}
                        }
                    }
                    self.s.end_delivery(now, d, d.end, fr.data.len());
                }
                Frame::Ack(a) => {
                    self.s
                        .handle_ack(now, self.id, a)
                        .map_err(PeerError::Sequence)?;
                }
                Frame::Credit(c) => {
                    for (name, b) in c.grants {
                        self.credit.grant(name.as_bytes(), b);
                    }
                }
                Frame::Sync(sy) => self.apply_sync(sy),
                Frame::Undeliverable(u) => {
                    if self.reported.len() < REPORTS_KEPT {
                        self.reported.push_back(u);
                    } else {
                        self.reports_dropped += 1;
                    }
                }
                Frame::Goodbye => {
                    // It acknowledges nothing more: down (left), what it did not
                    // acknowledge failed.
                    self.s.handle_goodbye(now, self.id);
                    self.goodbye = true;
                    self.buf.clear();
                    return Ok(());
                }
                Frame::Refuse(r) if r.code == RefuseCode::Reset => {
                    // Its Reset event drops what was reassembled (`after_session`).
                    self.s.handle_reset(now);
                    return Err(PeerError::Reset(r.reason));
                }
                Frame::Refuse(r) => return Err(PeerError::Refused(r.code, r.reason)),
                other => return Err(PeerError::Unexpected(other.kind_name())),
            }
        }
        Ok(())
    }

    /// A whole message: charged to its mailbox's credit if this node has that mailbox
    /// (the peer respected the credit, so it fits), else its credit goes back.
    pub(super) fn deliver(
        &mut self,
        to: Name,
        from: Name,
        payload: Bytes,
        charge: u64,
        exists: &impl Fn(&Name) -> bool,
    ) -> Result<(), PeerError> {
        if exists(&to) {
            self.rcredit
                .charge(&to, charge)
                .map_err(PeerError::Credit)?;
            self.deliveries.push_back(Delivery {
                to,
                from,
                payload,
                charge,
            });
        } else {
            self.rcredit.dropped(&to, charge);
            self.notice(to, from, 1);
        }
        Ok(())
    }

    /// `count` messages from the peer's `from` found no mailbox `to` here: tell the peer
    /// (bounded: `NOTICE_PAIRS` pairs, the rest summed).
    pub(super) fn notice(&mut self, to: Name, from: Name, count: u32) {
        match self
            .notices
            .iter()
            .position(|(t, f, _)| *t == to && *f == from)
        {
            Some(i) => self.notices[i].2 = self.notices[i].2.saturating_add(count),
            None if self.notices.len() < NOTICE_PAIRS => self.notices.push((to, from, count)),
            None => self.notice_summary = self.notice_summary.saturating_add(count),
        }
    }

    /// The peer's SYNC: recount each mailbox's charge as held there, plus in flight from
    /// `next` on, plus still queued here. (The peer's figures may be anything: sums
    /// saturate.)
    pub(super) fn apply_sync(&mut self, sy: frame::Sync) {
        let mut totals: NameMap<u64> = NameMap::default();
        let mut add = |to: &Name, b: u64| {
            let e = totals.entry(to.clone()).or_default();
            *e = e.saturating_add(b);
        };
        for (name, h) in &sy.held {
            add(name, *h);
        }
        // Bytes come off the current connection only; a SYNC behind what the window
        // still holds (a RESUME or ACK beyond it) would leave that out: ignored.
        let Some(on) = self.s.current() else {
            return;
        };
        if !self.s.charges_from(on, sy.next, &mut add) {
            return;
        }
        self.outbox.charges(0, &mut add);
        self.bulk.charges(&mut add);
        self.credit.sync(sy.window, sy.max_payload, &totals);
    }
}
