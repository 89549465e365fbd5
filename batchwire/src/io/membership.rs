//! The membership thread: it owns the SWIM state machine (`core::membership`) and nothing
//! else touches it. It reads its datagrams itself, takes its other inputs from the
//! handle's channel (see `members.rs`), fires its timers, and acts on what the machine
//! says: packets as sealed datagrams (`datagrams.rs`), members to the dialers, departures
//! to the sessions, events, the view.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use crate::io::logs::warn_limited;
use batchwire_core::codec::Name;
use batchwire_core::membership::{MemberEvent, MemberId, MemberState, Membership, ViewDelta};
use tracing::{debug, info, warn};

use crate::event::Event;
use crate::io::datagrams::MemberStats;
use crate::io::datagrams::{DatagramReader, Sender};
use crate::io::dial::Dialers;
use crate::io::events::Events;
use crate::io::members::{Input, Members, member};
use crate::io::peers::Peers;
use crate::io::shutdown::Shutdown;

/// Inputs taken in one turn, at most.
const TURN: usize = 4096;
/// Datagrams read in one turn, at most (each up to 1.4 KB, held until the turn is done).
const BATCH: usize = 1024;
/// How often peers of forgotten members are looked for, at least.
const SWEEP: Duration = Duration::from_secs(1);
/// Longest sleep of the thread (it is woken by every datagram and input).
const IDLE: Duration = Duration::from_secs(1);

/// What the thread acts on.
pub(crate) struct MembersCtx {
    pub members: Members,
    pub peers: Peers,
    pub dialers: Dialers,
    pub events: Events,
    pub shutdown: Shutdown,
    pub node: Name,
    /// Frames taken, counted for the at-rest figure (`NodeStats`).
    pub counters: Arc<MemberStats>,
    /// When peers of forgotten members were last looked for (see `act`).
    pub swept: std::cell::Cell<Option<Instant>>,
    /// Members that left the view (forgotten) whose peers are still to be removed; at
    /// most the view's bound (a name back in the view leaves it).
    pub forgotten: std::cell::RefCell<std::collections::HashSet<Name>>,
    /// Where packets go out (sealed, over UDP).
    pub udp: std::cell::RefCell<Sender>,
}

/// The thread body: until the node stops, take datagrams, inputs and timers, act on the
/// outputs.
pub(crate) fn run_members(
    mut m: Membership,
    rx: Receiver<Input>,
    mut reader: DatagramReader,
    ctx: MembersCtx,
) {
    let mut left = false;
    let mut batch: Vec<(Name, Vec<u8>)> = Vec::new();
    loop {
        let now = Instant::now();
        let wait = m
            .poll_timeout()
            .map_or(IDLE, |t| t.saturating_duration_since(now))
            .min(IDLE);
        reader.wait(wait);
        if ctx.shutdown.is_stopped() {
            return;
        }
        // Everything that is waiting, in one turn (bounded), and before the timers: an
        // ack that came while this thread waited for a CPU is taken before the probe it
        // answers times out (on a loaded machine, the other order suspected live members).
        let mut acks = Vec::new();
        for input in rx.try_iter().take(TURN) {
            let now = Instant::now();
            match input {
                Input::Join(seed) if !left => {
                    debug!(node = %ctx.node, seed = %seed.name, addr = %seed.addr, "announcing to a seed");
                    m.handle_join(now, seed);
                }
                Input::Join(_) => {}
                Input::Heard(name, incarnation) => m.handle_heard(now, &name, incarnation),
                Input::Unreachable(name) => m.handle_unreachable(now, name.as_bytes()),
                Input::Wake => {}
                Input::Leave(ack) => {
                    m.handle_leave(now);
                    left = true;
                    acks.push(ack);
                }
            }
        }
        // Every datagram waiting, taken as one batch (see `Membership::handle_frames`).
        reader.drain(BATCH, |from, body| {
            if !left {
                batch.push((from, body));
            }
        });
        if !batch.is_empty() {
            // The datagram opened with the cluster key: a body that breaks the rules (a
            // sender field that is not the datagram's sender, a packet that does not
            // decode) is dropped and counted.
            let frames = batch.iter().map(|(f, b)| (f, b.as_slice()));
            m.handle_frames(Instant::now(), frames, |from, e| {
                ctx.counters.violations.fetch_add(1, Relaxed);
                warn_limited!(node = %ctx.node, member = %from, error = %e, "membership protocol violation; packet dropped");
            });
            batch.clear();
        }
        let now = Instant::now();
        if !left && m.poll_timeout().is_some_and(|t| t <= now) {
            m.handle_timeout(now);
        }
        act(&mut m, &ctx);
        for a in acks {
            let _ = a.try_send(());
        }
    }
}

/// Send what the machine queued, report what changed, publish the view.
fn act(m: &mut Membership, ctx: &MembersCtx) {
    while let Some((to, body)) = m.poll_transmit() {
        // Not to members the view had no room for (`max_members`): SWIM probes them too,
        // but they get no peer, no thread and no dial.
        if m.is_refused(to.name.as_bytes()) {
            continue;
        }
        ctx.udp
            .borrow_mut()
            .send(&to.name, to.started, to.addr, &body);
    }
    // What each change does (peers, dialers, sessions) first, then the view, then the
    // events (see below).
    let mut events = Vec::new();
    while let Some(e) = m.poll_event() {
        events.extend(act_on(e, ctx));
    }
    let c = m.counters();
    let s = &ctx.counters;
    s.bytes_in.store(c.bytes_in, Relaxed);
    s.bytes_out.store(c.bytes_out, Relaxed);
    s.packets_in.store(c.packets_in, Relaxed);
    s.packets_out.store(c.packets_out, Relaxed);
    s.probes_out.store(c.probes_out, Relaxed);
    s.gossip_out.store(c.gossip_out, Relaxed);
    s.state_out.store(c.state_out, Relaxed);
    s.rate_limited.store(c.rate_limited, Relaxed);
    s.members_refused.store(c.members_refused, Relaxed);
    s.swim_full.store(c.swim_full, Relaxed);
    let mut forgotten = ctx.forgotten.borrow_mut();
    // Only what changed is published, unless members left the view (or the copy
    // disagrees on the count, which should not happen: then it is rebuilt).
    let mut changed = false;
    let mut whole = false;
    match m.take_view_delta() {
        ViewDelta::Unchanged => {}
        ViewDelta::Changed(entries) => {
            changed = true;
            for (id, _) in &entries {
                forgotten.remove(id.name.as_bytes());
            }
            ctx.members.update(entries);
        }
        _ => whole = true,
    }
    if !whole && m.view_len() != ctx.members.len() {
        warn_limited!(node = %ctx.node, "membership: the published view had drifted; rebuilt");
        whole = true;
    }
    if whole {
        changed = true;
        let view = m.view_unsorted();
        // Forgotten members (down for `forget_down_after`) no longer need a dialer, nor,
        // if they hold nothing, a peer (configured peers stay). Only members that were in
        // the view: a node joining right now is not in it yet.
        // By a set of the names: each of these was a walk of the view per member.
        let names: std::collections::HashSet<&[u8]> =
            view.iter().map(|(id, _)| id.name.as_bytes()).collect();
        ctx.dialers.retain(|n| names.contains(n.as_bytes()));
        ctx.members.for_each_name(|o| {
            if !names.contains(o.as_bytes()) {
                forgotten.insert(o.clone());
            }
        });
        forgotten.retain(|n| !names.contains(n.as_bytes()));
        drop(names);
        ctx.members.publish(view);
    }
    // The view is published before its events go out: whoever subscribes to the events
    // and then reads the view (as the API tells them to) misses nothing, even when the
    // change happens in between (it may see one twice). Emitted first, an event could go
    // to no subscriber yet while the view still lacked the member (a `batchwire node`
    // that started joining before its event printer subscribed then never printed some
    // members: 1 run in 3 of the 64-node bench did not converge). And a member is in the
    // view only once its dialer knows where it is (and, in the full mesh, its peer
    // exists), so a send to a member the view shows finds it (with connections on demand
    // its peer is made by that send).
    for e in events {
        ctx.events.emit(e);
    }
    // When the view changed, and once a second (a peer busy at the change, e.g. with
    // messages still queued, is looked at again).
    if !forgotten.is_empty() && (changed || ctx.swept.get().is_none_or(|t| t.elapsed() >= SWEEP)) {
        ctx.swept.set(Some(Instant::now()));
        let removed = ctx.peers.remove_forgotten(|n| !forgotten.contains(n));
        // Done with those removed or gone; the rest (busy) are looked at again.
        forgotten.retain(|n| ctx.peers.get(n.as_bytes()).is_some());
        if removed > 0 {
            debug!(node = %ctx.node, removed, "peers of forgotten members removed");
        }
    }
}

/// Act on one change of the view; the event to emit once the view is published.
fn act_on(e: MemberEvent, ctx: &MembersCtx) -> Option<Event> {
    let node = &ctx.node;
    match e {
        MemberEvent::Joined(id) => {
            info!(%node, member = %id.name, addr = %id.addr, "member joined");
            // With connections on demand its peer is made when something is first sent
            // to it (`Runtime::member_peer`) or it connects; its dialer learns where it
            // is now. In the full mesh every member gets its peer, which dials.
            if ctx.dialers.on_demand() || ctx.peers.get_or_insert_learnt(&id.name).is_ok() {
                ctx.dialers.ensure(&id.name, id.addr, id.started);
            }
            Some(Event::MemberJoined {
                member: member(&id, MemberState::Alive),
            })
        }
        MemberEvent::Suspected(id) => {
            warn!(%node, member = %id.name, "member suspected down");
            Some(Event::MemberSuspected {
                member: member(&id, MemberState::Suspect),
            })
        }
        MemberEvent::Refuted(id) => {
            info!(%node, member = %id.name, "suspected member is alive");
            Some(Event::MemberAlive {
                member: member(&id, MemberState::Alive),
            })
        }
        MemberEvent::Down(id) => {
            warn!(%node, member = %id.name, "member declared down");
            depart(ctx, &id, false);
            Some(Event::MemberDown {
                member: member(&id, MemberState::Down),
            })
        }
        MemberEvent::Left(id) => {
            info!(%node, member = %id.name, "member left");
            depart(ctx, &id, true);
            Some(Event::MemberLeft {
                member: member(&id, MemberState::Left),
            })
        }
        _ => None,
    }
}

/// A member is gone: its session is declared down (pending messages fail, its connection
/// closes). A member that left is not dialled again; one that went down is (with the
/// dialer's back-off), so a partition heals and a restart is found.
fn depart(ctx: &MembersCtx, id: &MemberId, left: bool) {
    if let Some(p) = ctx.peers.get(id.name.as_bytes()) {
        // Only the incarnation that went: a restarted node already connected stays, and
        // so does one this node hears on a live connection (its own detector decides).
        let same = p.session(|s, _| s.incarnation() == Some(id.started));
        if !p.declare_down(id.started) && same && !left {
            info!(node = %ctx.node, member = %id.name, "member declared down in the cluster, but heard directly on a live connection; its session stays up");
        }
    }
    if left {
        ctx.dialers.stop(&id.name);
    }
}
