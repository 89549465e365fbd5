//! [`Class`]: which lane a message takes to its peer.

/// Which lane a message takes to its peer. Control frames (acknowledgements, heartbeats,
/// credit) always go first, on a path of their own; then ordinary messages; then bulk,
/// whose pieces have a budget of bytes in flight of their own (`bulk_inflight_bytes`), so
/// neither class can starve the other. Messages from one mailbox to one mailbox arrive in
/// the order they were sent, whatever their classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Class {
    /// Small messages, bundled into few writes. A message larger than `fragment_bytes`
    /// goes as bulk anyway. The default.
    #[default]
    Ordinary,
    /// Large transfers: sent in pieces of `fragment_bytes`, interleaved with (and after)
    /// the ordinary messages to the same peer, never copied on the way out.
    Bulk,
}

impl std::fmt::Display for Class {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Class::Ordinary => "ordinary",
            Class::Bulk => "bulk",
        })
    }
}

impl std::str::FromStr for Class {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ordinary" => Ok(Class::Ordinary),
            "bulk" => Ok(Class::Bulk),
            other => Err(format!("unknown class {other:?} (ordinary, bulk)")),
        }
    }
}
