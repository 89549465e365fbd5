//! Bench hosts in network namespaces, joined by the emulated link.
//!
//! Host i is the namespace `bw<pid>-<set>-<i>` with one TUN device, `bw0`, at 10.99.0.(i+1)/24:
//! everything it sends to another host leaves through that device. This process holds
//! every device (a TUN device stays in the namespace it was made in, whichever thread
//! reads it), and moves packets between them:
//! - one **reader** thread per host takes each packet its host sent, finds the host it is
//!   for by its IPv4 destination, and pushes it into that direction's [`Pipe`];
//! - one **deliverer** thread sleeps until the earliest packet is due and writes what is
//!   due into the receiving host's device.
//!
//! The pipes are the only shared state (one lock, held only to push or pop). Bench workers
//! are started inside their host's namespace (`setns` between fork and exec, see
//! [`ns_fd`]), and learn from [`HOSTS_ENV`] that their nodes listen on host addresses.
//!
//! Cleanup: dropping [`Hosts`] stops the threads and deletes the namespaces; SIGINT,
//! SIGTERM and SIGHUP kill the workers, delete the namespaces and exit 130; and namespaces
//! left by a process that was killed outright (SIGKILL) are deleted by the next start.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsRawFd, RawFd};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::LinkSpec;
use super::pipe::{Pipe, PipeStats};

/// Set (to "netns") in the environment of workers that run in a host namespace.
pub const HOSTS_ENV: &str = "BATCHWIRE_BENCH_HOSTS";

/// The link's settings, in the environment of workers that run over it.
pub const LINK_ENV: &str = "BATCHWIRE_BENCH_LINK";

/// The most hosts (addresses 10.99.0.1 ..= 10.99.0.64).
pub const MAX_HOSTS: usize = 64;

/// The TUN devices' MTU: Ethernet's, as on a WAN path.
pub const MTU: u16 = 1500;

/// Host i's address.
pub fn host_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 99, 0, (i + 1) as u8)
}

/// Which host owns `ip`, if it is a host address.
pub fn host_of(ip: IpAddr) -> Option<usize> {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            let i = o[3] as usize;
            (o[..3] == [10, 99, 0] && (1..=MAX_HOSTS).contains(&i)).then(|| i - 1)
        }
        IpAddr::V6(_) => None,
    }
}

/// The namespaces of the running hosts, as open descriptors, by host index (empty when
/// there are none); [`ns_fd`] reads it when starting workers.
static NS_FDS: RwLock<Vec<RawFd>> = RwLock::new(Vec::new());

/// The link of the running hosts (in the bench process), for scenarios that size their
/// runs to it.
static ACTIVE: RwLock<Option<LinkSpec>> = RwLock::new(None);

/// The emulated link the nodes run over, if any (bench process only).
pub fn active_link() -> Option<LinkSpec> {
    ACTIVE.read().ok().and_then(|s| *s)
}

/// What a signal must clean up: namespaces made and worker processes started.
struct Registry {
    namespaces: Vec<String>,
    children: Vec<u32>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    namespaces: Vec::new(),
    children: Vec::new(),
});

/// Whether this process's nodes live on hosts: the bench with [`Hosts`] running, or a
/// worker started in one.
pub fn in_netns() -> bool {
    static WORKER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let worker = *WORKER.get_or_init(|| std::env::var_os(HOSTS_ENV).is_some());
    worker || NS_FDS.read().map(|v| !v.is_empty()).unwrap_or(false)
}

/// The open namespace of host `i`, to `setns` a worker into.
pub fn ns_fd(i: usize) -> Option<RawFd> {
    NS_FDS.read().ok()?.get(i).copied()
}

/// Remember a worker started in a host, so a signal can stop it.
pub fn register_child(pid: u32) {
    if let Ok(mut r) = REGISTRY.lock() {
        r.children
            .retain(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
        r.children.push(pid);
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip` (iproute2): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

fn delete_namespace(name: &str) {
    if let Err(e) = ip(&["netns", "del", name]) {
        tracing::warn!(namespace = name, error = %e, "cannot delete a bench namespace");
    }
}

/// Delete namespaces `bw<pid>-...` whose process is gone (a bench killed outright).
fn sweep_stale() {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let pid = name
            .strip_prefix("bw")
            .and_then(|r| r.split_once('-'))
            .and_then(|(p, _)| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && !std::path::Path::new(&format!("/proc/{pid}")).exists()
        {
            delete_namespace(&name);
        }
    }
}

/// Kill the registered workers and delete the namespaces (a signal's cleanup).
fn cleanup_all() {
    let Ok(mut r) = REGISTRY.lock() else { return };
    for pid in r.children.drain(..) {
        crate::sys::kill9(pid);
    }
    for name in r.namespaces.drain(..) {
        delete_namespace(&name);
    }
}

/// On SIGINT, SIGTERM or SIGHUP: clean up and exit 130 (installed once).
fn install_signal_cleanup() -> Result<(), String> {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    let mut res = Ok(());
    INSTALLED.call_once(|| {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        match signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) {
            Ok(mut signals) => {
                let spawned = std::thread::Builder::new()
                    .name("bw-hosts-signals".into())
                    .spawn(move || {
                        if let Some(sig) = signals.forever().next() {
                            eprintln!("batchwire: signal {sig}: removing the bench hosts");
                            cleanup_all();
                            std::process::exit(130);
                        }
                    });
                if let Err(e) = spawned {
                    res = Err(format!("cannot start the signal thread: {e}"));
                }
            }
            Err(e) => res = Err(format!("cannot handle signals: {e}")),
        }
    });
    res
}

/// Make the TUN device of a host inside its namespace (on a short-lived thread that
/// enters the namespace, so this process's own threads stay where they are).
fn make_device(ns: RawFd, i: usize) -> Result<tun::Device, String> {
    std::thread::spawn(move || {
        // The thread ends right after.
        if let Err(e) = crate::sys::enter_netns(ns) {
            return Err(format!("cannot enter host {i}'s namespace: {e}"));
        }
        let mut cfg = tun::Configuration::default();
        cfg.tun_name("bw0")
            .address(host_ip(i))
            .netmask(Ipv4Addr::new(255, 255, 255, 0))
            .mtu(MTU)
            .up();
        tun::create(&cfg).map_err(|e| format!("cannot make host {i}'s TUN device: {e}"))
    })
    .join()
    .map_err(|_| "the TUN setup thread panicked".to_string())?
}

/// The pipes, shared by the reader threads and the deliverer.
struct Shared {
    /// `n * n` pipes; direction src -> dst is `src * n + dst`.
    pipes: Mutex<Vec<Pipe>>,
    /// Woken when a pipe that was empty gets a packet (its head is a new deadline).
    wake: Condvar,
    stop: AtomicBool,
    devices: Vec<Arc<tun::Device>>,
    /// Packets a host sent that were for no host (or not IPv4).
    unroutable: std::sync::atomic::AtomicU64,
}

impl Shared {
    fn new(pipes: Vec<Pipe>, devices: Vec<Arc<tun::Device>>) -> Arc<Shared> {
        Arc::new(Shared {
            pipes: Mutex::new(pipes),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            devices,
            unroutable: Default::default(),
        })
    }
}

/// Running hosts and their link; dropping it removes them.
pub struct Hosts {
    names: Vec<String>,
    ns_files: Vec<File>,
    /// Whether workers started by this process go into these hosts ([`Hosts::start`]).
    published: bool,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    spec: LinkSpec,
}

impl Hosts {
    /// Make `n` hosts joined by `spec`, start moving packets, and place the bench's
    /// workers on them from now on (one set of hosts per process at a time).
    pub fn start(n: usize, spec: LinkSpec) -> Result<Hosts, String> {
        let mut hosts = Hosts::start_private(n, spec)?;
        let fds = hosts.ns_files.iter().map(|f| f.as_raw_fd()).collect();
        *NS_FDS.write().map_err(|_| "hosts table poisoned")? = fds;
        if let Ok(mut a) = ACTIVE.write() {
            *a = Some(spec);
        }
        hosts.published = true;
        Ok(hosts)
    }

    /// Make `n` hosts joined by `spec` without placing workers on them (the tests: any
    /// number at once, reached with [`Hosts::run_in`]).
    pub fn start_private(n: usize, spec: LinkSpec) -> Result<Hosts, String> {
        if !(2..=MAX_HOSTS).contains(&n) {
            return Err(format!(
                "--hosts netns: {n} hosts; 2 to {MAX_HOSTS} are supported"
            ));
        }
        if !crate::sys::is_root() {
            return Err(
                "--hosts netns needs root: it makes network namespaces and TUN \
                        devices (run the bench as root, e.g. with sudo)"
                    .into(),
            );
        }
        if !std::path::Path::new("/dev/net/tun").exists() {
            return Err("--hosts netns needs /dev/net/tun (the tun kernel module)".into());
        }
        install_signal_cleanup()?;
        sweep_stale();
        let mut hosts = Hosts {
            names: Vec::new(),
            ns_files: Vec::new(),
            published: false,
            // Replaced once the devices exist; until then Drop has nothing to stop.
            shared: Shared::new(Vec::new(), Vec::new()),
            threads: Vec::new(),
            spec,
        };
        static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let mut devices = Vec::new();
        for i in 0..n {
            let name = format!("bw{}-{seq}-{i}", std::process::id());
            ip(&["netns", "add", &name])?;
            hosts.names.push(name.clone());
            if let Ok(mut r) = REGISTRY.lock() {
                r.namespaces.push(name.clone());
            }
            ip(&["-n", &name, "link", "set", "lo", "up"])?;
            let f = File::open(format!("/run/netns/{name}"))
                .map_err(|e| format!("cannot open namespace {name}: {e}"))?;
            devices.push(Arc::new(make_device(f.as_raw_fd(), i)?));
            hosts.ns_files.push(f);
        }
        let pipes = (0..n * n)
            .map(|k| Pipe::new(&spec, 0x9E37_79B9_7F4A_7C15 ^ (k as u64 + 1)))
            .collect();
        hosts.shared = Shared::new(pipes, devices);
        for i in 0..n {
            let sh = Arc::clone(&hosts.shared);
            let t = std::thread::Builder::new()
                .name(format!("bw-link-read-{i}"))
                .spawn(move || reader(&sh, i, n))
                .map_err(|e| format!("cannot start a link thread: {e}"))?;
            hosts.threads.push(t);
        }
        let sh = Arc::clone(&hosts.shared);
        let t = std::thread::Builder::new()
            .name("bw-link-deliver".into())
            .spawn(move || deliverer(&sh, n))
            .map_err(|e| format!("cannot start a link thread: {e}"))?;
        hosts.threads.push(t);
        Ok(hosts)
    }

    pub fn spec(&self) -> LinkSpec {
        self.spec
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// The namespaces' names, by host.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The counters of every direction, summed.
    pub fn stats(&self) -> PipeStats {
        let mut s = PipeStats::default();
        if let Ok(p) = self.shared.pipes.lock() {
            for p in p.iter() {
                s += p.stats();
            }
        }
        s
    }

    /// The most bytes any one direction can hold.
    pub fn held_limit(&self) -> usize {
        self.spec.held_limit()
    }

    /// Packets sent to no host.
    pub fn unroutable(&self) -> u64 {
        self.shared.unroutable.load(Ordering::Relaxed)
    }

    /// Run `f` on a new thread inside host `i`'s namespace (tests: a socket on a host).
    #[cfg(test)]
    pub fn run_in<T: Send + 'static>(
        &self,
        i: usize,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<JoinHandle<T>, String> {
        let ns = self
            .ns_files
            .get(i)
            .map(|f| f.as_raw_fd())
            .ok_or_else(|| format!("no host {i}"))?;
        std::thread::Builder::new()
            .name(format!("bw-host-{i}"))
            .spawn(move || {
                // Only this thread moves.
                if let Err(e) = crate::sys::enter_netns(ns) {
                    panic!("setns: {e}");
                }
                f()
            })
            .map_err(|e| format!("cannot start a thread: {e}"))
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        if self.published {
            if let Ok(mut v) = NS_FDS.write() {
                v.clear();
            }
            if let Ok(mut a) = ACTIVE.write() {
                *a = None;
            }
        }
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        for name in &self.names {
            delete_namespace(name);
        }
        if let Ok(mut r) = REGISTRY.lock() {
            r.namespaces.retain(|n| !self.names.contains(n));
        }
    }
}

/// Read what host `i` sends and push it into the pipe towards its destination.
fn reader(sh: &Shared, i: usize, n: usize) {
    let dev = &sh.devices[i];
    let mut buf = vec![0u8; super::pipe::MAX_PACKET];
    while !sh.stop.load(Ordering::Relaxed) {
        let len = match dev.recv_timeout(&mut buf, Duration::from_millis(100)) {
            Ok(len) => len,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!(host = i, error = %e, "link: reading a TUN device failed");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let pkt = &buf[..len];
        // IPv4 only (the hosts have no IPv6 addresses); the destination is bytes 16..20.
        let dst = (len >= 20 && pkt[0] >> 4 == 4)
            .then(|| {
                host_of(IpAddr::V4(Ipv4Addr::new(
                    pkt[16], pkt[17], pkt[18], pkt[19],
                )))
            })
            .flatten()
            .filter(|d| *d < n && *d != i);
        let Some(dst) = dst else {
            sh.unroutable.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let Ok(mut pipes) = sh.pipes.lock() else {
            return;
        };
        let pipe = &mut pipes[i * n + dst];
        let was_empty = pipe.next_due().is_none();
        pipe.push(Instant::now(), pkt);
        let now_has = pipe.next_due().is_some();
        drop(pipes);
        if was_empty && now_has {
            sh.wake.notify_one();
        }
    }
}

/// Write each packet into its destination host's device when it is due.
fn deliverer(sh: &Shared, n: usize) {
    let mut due: Vec<(usize, Vec<u8>)> = Vec::new();
    let Ok(mut pipes) = sh.pipes.lock() else {
        return;
    };
    loop {
        if sh.stop.load(Ordering::Relaxed) {
            return;
        }
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        for (k, p) in pipes.iter_mut().enumerate() {
            while let Some(pkt) = p.poll(now) {
                due.push((k % n, pkt));
            }
            if let Some(t) = p.next_due() {
                next = Some(next.map_or(t, |x| x.min(t)));
            }
        }
        if !due.is_empty() {
            drop(pipes);
            for (dst, pkt) in due.drain(..) {
                if let Err(e) = sh.devices[dst].send(&pkt) {
                    tracing::debug!(host = dst, error = %e, "link: writing a TUN device failed");
                }
            }
            pipes = match sh.pipes.lock() {
                Ok(p) => p,
                Err(_) => return,
            };
            continue;
        }
        let wait = next
            .map(|t| t.saturating_duration_since(now))
            .unwrap_or(Duration::from_millis(100));
        pipes = match sh.wake.wait_timeout(pipes, wait) {
            Ok((p, _)) => p,
            Err(_) => return,
        };
    }
}

/// The emulator measured from the outside: real sockets in two hosts, timed by the wall
/// clock. They need root (namespaces, TUN devices), as the bench does; without it they say
/// SKIPPED, or fail under CI (`tests/shared/can_run.rs` decides).
#[cfg(test)]
#[path = "../../tests/shared/can_run.rs"]
mod can_run;

#[cfg(test)]
mod tests;
