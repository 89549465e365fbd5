//! Where a joining node finds its cluster: a socket address, or a DNS name with a port.
//!
//! A name is resolved when the node starts joining and again and again after (see
//! [`crate::config::NodeConfig::join_refresh`]); every address it resolves to (A and AAAA records,
//! through the system resolver) is a seed. That is how the pods of a Kubernetes
//! StatefulSet find each other through a headless Service with no list of peers.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

/// Longest DNS name (RFC 1035: 255 octets on the wire, 253 characters written out).
const MAX_NAME: usize = 253;
/// Longest label of a DNS name.
const MAX_LABEL: usize = 63;

/// A seed of [`crate::config::NodeConfig::join`]: an address, or a DNS name and a port.
///
/// Parsed from `HOST:PORT`: `10.0.0.7:7000`, `[fd00::7]:7000` or
/// `batchwire.default.svc.cluster.local:7000`.
///
/// ```
/// use batchwire::Seed;
/// let s: Seed = "peers.example.com:7000".parse().unwrap();
/// assert_eq!(s, Seed::Name { host: "peers.example.com".into(), port: 7000 });
/// let a: Seed = "127.0.0.1:7000".parse().unwrap();
/// assert!(matches!(a, Seed::Addr(_)));
/// assert!("peers.example.com".parse::<Seed>().is_err()); // no port
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Seed {
    /// A node's address.
    Addr(SocketAddr),
    /// A DNS name, resolved to any number of addresses, each with `port`.
    Name {
        /// The name, e.g. `batchwire.default.svc.cluster.local`.
        host: String,
        /// The port every address it resolves to is dialled on.
        port: u16,
    },
}

impl From<SocketAddr> for Seed {
    fn from(a: SocketAddr) -> Seed {
        Seed::Addr(a)
    }
}

impl fmt::Display for Seed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Seed::Addr(a) => write!(f, "{a}"),
            Seed::Name { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

impl FromStr for Seed {
    type Err = String;

    /// `HOST:PORT`, where HOST is an IPv4 address, an IPv6 address in brackets or a DNS
    /// name (letters, digits, `-` and `_` in dot-separated labels of at most 63
    /// characters, 253 in all), and PORT is 1..=65535.
    fn from_str(s: &str) -> Result<Seed, String> {
        if let Ok(a) = s.parse::<SocketAddr>() {
            return Ok(Seed::Addr(a));
        }
        let shown: String = s.chars().take(80).collect();
        let (host, port) = s
            .rsplit_once(':')
            .ok_or_else(|| format!("seed {shown:?} is not HOST:PORT (no port)"))?;
        let port = match port.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => return Err(format!("seed {shown:?}: the port must be 1..=65535")),
        };
        check_name(host).map_err(|why| format!("seed {shown:?}: {why}"))?;
        Ok(Seed::Name {
            host: host.to_string(),
            port,
        })
    }
}

impl Seed {
    /// Whether a seed built by hand (not parsed) is one `from_str` would accept.
    pub(crate) fn check(&self) -> Result<(), String> {
        match self {
            Seed::Addr(_) => Ok(()),
            Seed::Name { port: 0, .. } => Err(format!("seed {self}: the port must be 1..=65535")),
            Seed::Name { host, .. } => check_name(host).map_err(|why| {
                let shown: String = host.chars().take(80).collect();
                format!("seed {shown:?}: {why}")
            }),
        }
    }
}

/// Whether `host` is a DNS name as written in a seed (a trailing dot is allowed).
fn check_name(host: &str) -> Result<(), String> {
    let bare = host.strip_suffix('.').unwrap_or(host);
    if bare.is_empty() {
        return Err("no host name".into());
    }
    if bare.len() > MAX_NAME {
        return Err(format!(
            "the host name is {} characters long, at most {MAX_NAME} allowed",
            bare.len()
        ));
    }
    for label in bare.split('.') {
        if label.is_empty() || label.len() > MAX_LABEL {
            return Err(format!(
                "the host name has a label of {} characters (1..={MAX_LABEL})",
                label.len()
            ));
        }
        if let Some(c) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
        {
            return Err(format!(
                "the host name holds {c:?} (letters, digits, '-', '_' and '.' only)"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!(
                "the host name's label {label:?} begins or ends with '-'"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_parse_and_print_back() {
        for s in [
            "127.0.0.1:7000",
            "[::1]:7000",
            "peers:7000",
            "batchwire.default.svc.cluster.local:7000",
            "_bw.peers-1.example.:1",
        ] {
            assert_eq!(s.parse::<Seed>().unwrap().to_string(), s, "{s}");
        }
        assert_eq!(
            "a.b:65535".parse::<Seed>().unwrap(),
            Seed::Name {
                host: "a.b".into(),
                port: 65535
            }
        );
    }

    #[test]
    fn bad_seeds_are_refused_with_the_reason() {
        let long = format!("{}:7000", vec!["a".repeat(60); 5].join("."));
        let label = format!("{}.com:7000", "a".repeat(64));
        for (s, why) in [
            ("peers", "no port"),
            ("peers:", "port"),
            ("peers:0", "port"),
            ("peers:70000", "port"),
            (":7000", "no host name"),
            (".:7000", "no host name"),
            ("a..b:7000", "label of 0"),
            ("a b:7000", "' '"),
            ("-a.b:7000", "begins or ends"),
            ("a-.b:7000", "begins or ends"),
            ("fd00::7:7000", "':'"),
            ("ä.b:7000", "'ä'"),
            (long.as_str(), "at most 253"),
            (label.as_str(), "label of 64"),
        ] {
            let e = s.parse::<Seed>().unwrap_err();
            assert!(e.contains(why), "{s:?}: {e}");
            assert!(e.starts_with("seed \""), "{s:?}: {e}");
        }
        // A long input is shown cut.
        let e = format!("{}:x", "a".repeat(1000))
            .parse::<Seed>()
            .unwrap_err();
        assert!(e.len() < 200, "{e}");
    }
}
