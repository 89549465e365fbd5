//! The transfer-queue bundler thread (JGRP-1540): one queue for every peer, drained by one
//! thread. Each batch it takes is split into runs of consecutive frames for one destination
//! (every member, for the null destination); each run is numbered into that peer's window
//! and its writer is poked. The thread never touches a socket, so a peer that stops reading
//! stalls only its own writer; senders to a peer whose window is full wait at the door
//! (`Peer::wait_room`), not in the shared queue.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use batchwire_core::bundler::BundlerConfig;
use batchwire_core::outbox::{ALL, Batch, groups, message_frames};

use crate::io::lane::{Lane, Next};
use crate::io::peers::Peers;
use crate::io::write::hold_frames;

pub(crate) fn run_bundler(
    lane: Arc<Lane>,
    peers: Peers,
    cfg: BundlerConfig,
    done: Arc<AtomicBool>,
) {
    let mut bundler = cfg.build();
    let mut batch = Batch::default();
    loop {
        let epoch = lane.epoch();
        match lane.next_batch(bundler.as_mut(), epoch, &mut batch, false, None) {
            Next::Batch(reason) => {
                for group in groups(&batch.frames) {
                    let frames = message_frames(&batch.buf, group);
                    let targets = match group[0].dest {
                        ALL => peers.all(),
                        id => peers.by_id(id).into_iter().collect(),
                    };
                    let n: u64 = frames.iter().map(|f| f.1 as u64).sum();
                    for p in targets {
                        hold_frames(&p, &frames, reason);
                        // Numbered (or failed): a bulk message queued after these may go.
                        p.lane.note_taken(n);
                        p.lane.poke();
                    }
                }
            }
            // (No linger: this thread runs until shutdown.)
            Next::Wake | Next::Idle => {}
            // Shutting down and drained: the writers finish on their own.
            Next::Drained => {
                done.store(true, Ordering::Release);
                for p in peers.all() {
                    p.lane.poke();
                }
                return;
            }
        }
    }
}
