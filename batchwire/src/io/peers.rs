//! The node's peers by name and by id, and how a peer comes to be: its session, its lane and
//! its writer thread. At most `max_peers`.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use batchwire_core::codec::Name;
use batchwire_core::outbox::Dest;
use batchwire_core::session::Session;

use crate::config::NodeConfig;
use crate::io::flow::Flow;
use crate::io::lane::Lane;
use crate::io::peer::{Peer, PeerCtx};
use crate::io::shutdown::Shutdown;
use crate::io::threads::Threads;
use crate::io::write::{WriterCfg, run_writer};
use crate::io::{NameHash, lane_cfg};

/// A cheap handle on the registry.
#[derive(Clone)]
pub(crate) struct Peers(Arc<Inner>);

struct Inner {
    map: RwLock<HashMap<Name, Arc<Peer>, NameHash>>,
    by_id: RwLock<Vec<Arc<Peer>>>,
    maker: Maker,
}

/// What it takes to make a peer.
struct Maker {
    ctx: Arc<PeerCtx>,
    config: NodeConfig,
    threads: Threads,
    shutdown: Shutdown,
    /// Transfer-queue: the bundler thread fills the windows; writers only write.
    shared: bool,
    /// Transfer-queue: set once the bundler has drained the shared lane at shutdown.
    shared_done: Option<Arc<std::sync::atomic::AtomicBool>>,
}

/// Why a peer could not be added.
#[derive(Debug)]
pub(crate) enum AddError {
    /// `max_peers` reached.
    Full(usize),
    /// No writer thread could be started.
    Spawn(std::io::Error),
}

impl Peers {
    pub fn new(
        ctx: Arc<PeerCtx>,
        config: NodeConfig,
        threads: Threads,
        shutdown: Shutdown,
        shared_done: Option<Arc<std::sync::atomic::AtomicBool>>,
    ) -> Peers {
        let shared = config.bundler.kind.shared_queue();
        Peers(Arc::new(Inner {
            map: RwLock::new(HashMap::default()),
            by_id: RwLock::new(Vec::new()),
            maker: Maker {
                ctx,
                config,
                threads,
                shutdown,
                shared,
                shared_done,
            },
        }))
    }

    /// The peer called `name`.
    pub fn get(&self, name: &[u8]) -> Option<Arc<Peer>> {
        self.0
            .map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// Run `f` on the peer called `name` under the registry's read lock (no reference
    /// count is touched: the send path).
    pub fn with<R>(&self, name: &[u8], f: impl FnOnce(Option<&Arc<Peer>>) -> R) -> R {
        f(self
            .0
            .map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name))
    }

    pub fn by_id(&self, id: Dest) -> Option<Arc<Peer>> {
        self.0
            .by_id
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id as usize)
            .cloned()
    }

    /// Every peer, in id order.
    pub fn all(&self) -> Vec<Arc<Peer>> {
        self.0
            .by_id
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The peer called `name`, made (with its writer thread) if there is none yet.
    pub fn get_or_insert(&self, name: &Name) -> Result<Arc<Peer>, AddError> {
        if let Some(p) = self.get(name.as_bytes()) {
            return Ok(p);
        }
        let mut map = self.0.map.write().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = map.get(name.as_bytes()) {
            return Ok(p.clone());
        }
        let m = &self.0.maker;
        if map.len() >= m.config.max_peers {
            return Err(AddError::Full(m.config.max_peers));
        }
        let mut by_id = self.0.by_id.write().unwrap_or_else(|p| p.into_inner());
        let cfg = &m.config;
        let bundler = cfg.bundler.build();
        let lane = Arc::new(Lane::new(lane_cfg(cfg, true), bundler.as_ref()));
        let flow = Arc::new(Flow::new(
            cfg.mailbox_bytes as u64,
            cfg.max_payload as u64,
            lane.clone(),
        ));
        let peer = Arc::new(Peer::new(
            by_id.len() as Dest,
            name.clone(),
            m.ctx.clone(),
            Session::new(cfg.session.clone(), Instant::now()),
            lane,
            flow,
        ));
        let wcfg = WriterCfg {
            bundler: (!m.shared).then_some(cfg.bundler),
            shared_done: m.shared_done.clone(),
        };
        let (p, sd) = (peer.clone(), m.shutdown.clone());
        let node = m.ctx.node.clone();
        m.threads
            .spawn(format!("bw-write-{}-{name}", m.ctx.node), move || {
                let _span = tracing::info_span!("writer", node = %node, peer = %p.name).entered();
                run_writer(p, wcfg, sd)
            })
            .map_err(AddError::Spawn)?;
        by_id.push(peer.clone());
        map.insert(name.clone(), peer.clone());
        Ok(peer)
    }
}
