//! Control made due while a thread leads the peer's connection (see `read/leading.rs`), or
//! by the ticker (`tick.rs`): that thread writes it when it is done with the peer, rather
//! than waking the writer for it.

use std::cell::Cell;

use super::Peer;

thread_local! {
    /// The peer whose connection this thread leads (or whose timers the ticker handles),
    /// while it does, and whether a session turn of that peer made control due meanwhile.
    static LEADING: Cell<Option<(*const Peer, bool)>> = const { Cell::new(None) };
}

/// In a session turn of `peer` that made control due: whether the calling thread leads
/// `peer`'s connection (or is the ticker) and will write the control itself (then the
/// writer is not woken).
pub(super) fn defer(peer: &Peer) -> bool {
    LEADING.with(|l| match l.get() {
        Some((p, _)) if std::ptr::eq(p, peer) => {
            l.set(Some((p, true)));
            true
        }
        _ => false,
    })
}

/// This thread starts leading `peer`'s connection (or handling its timers). Returns what
/// to give `end`.
pub(crate) fn begin(peer: &Peer) -> Option<(*const Peer, bool)> {
    LEADING.replace(Some((peer as *const Peer, false)))
}

/// This thread stops leading (call `take` first).
pub(crate) fn end(outer: Option<(*const Peer, bool)>) {
    LEADING.set(outer);
}

/// Whether control was made due since the last call (and forget it).
pub(crate) fn take() -> bool {
    LEADING.with(|l| match l.get() {
        Some((p, true)) => {
            l.set(Some((p, false)));
            true
        }
        _ => false,
    })
}

/// Run `f` as a thread that does not lead (its session turns wake the writer as usual).
pub(crate) fn without<R>(f: impl FnOnce() -> R) -> R {
    let outer = LEADING.replace(None);
    let r = f();
    LEADING.set(outer);
    r
}
