//! A session turn's events, acted on in order with `dispatching` held (see
//! `Peer::session`): logs, events for the application, failures handed back.

use super::*;

impl Peer {
    /// Act on one event of a session turn, in order (with `dispatching` held). `failed`:
    /// what the turn took from the lane because the peer went down.
    pub(super) fn dispatch(
        &self,
        e: SessionEvent,
        failed: &mut Vec<batchwire_core::frame::Message>,
    ) {
        let node = &self.ctx.node;
        match e {
            // (The lane took sends again in the turn: see `session`.)
            SessionEvent::Up { incarnation } => {
                info!(node = %node, peer = %self.name, incarnation, "peer up");
                self.ctx.events.emit(Event::PeerUp {
                    peer: self.name.to_string(),
                    incarnation,
                });
            }
            SessionEvent::Restarted { incarnation } => {
                info!(node = %node, peer = %self.name, incarnation, "peer restarted (new incarnation)");
                // Nothing it had in pieces will continue.
                let gone = self.lock_reassembly().clear();
                self.abandon(gone);
            }
            SessionEvent::Reset => {
                // The connection that found it logs why. Nothing in pieces continues.
                let gone = self.lock_reassembly().clear();
                self.abandon(gone);
            }
            SessionEvent::Down { reason } => {
                // A peer that left (said goodbye, or left the cluster) is not a failure.
                if matches!(reason, batchwire_core::session::DownReason::Left) {
                    info!(node = %node, peer = %self.name, %reason, "peer left");
                } else {
                    warn!(node = %node, peer = %self.name, %reason, "peer declared down");
                }
                self.ctx.events.emit(Event::PeerDown {
                    peer: self.name.to_string(),
                    reason,
                });
                // Its session ended: nothing it had in pieces will continue.
                let gone = self.lock_reassembly().clear();
                self.abandon(gone);
                // What was still queued for it (taken in the turn, the lane now refusing
                // more) goes back too, and senders waiting for room or credit are woken.
                self.report_failed(std::mem::take(failed), FailReason::Down(reason));
                self.wake_senders();
                // Requests to it fail now, not at their timeout.
                self.ctx.calls.fail_node(&self.name);
            }
            SessionEvent::Failed { messages, reason } => self.report_failed(messages, reason),
            SessionEvent::Close { conn } => {
                if let Some(c) = self.current().filter(|c| c.id == conn) {
                    c.close();
                }
            }
            _ => {}
        }
    }
}
