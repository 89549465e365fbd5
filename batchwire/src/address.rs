//! Where a message goes: a mailbox on a node, and the rules for names.

use batchwire_core::codec::Name;

use crate::error::Error;

/// A mailbox on a node: where a message goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Address {
    pub(crate) node: Name,
    pub(crate) mailbox: Name,
}

impl Address {
    /// From names already checked.
    pub(crate) fn from_names(node: Name, mailbox: Name) -> Address {
        Address { node, mailbox }
    }

    /// The mailbox `mailbox` on node `node`. Names are 1..=255 bytes of UTF-8 (the mailbox
    /// name may be empty only as a sender: "" is the anonymous sender used by `Node::send`).
    /// Mailbox names beginning with NUL are reserved (they carry requests and replies).
    pub fn new(node: &str, mailbox: &str) -> Result<Address, Error> {
        if batchwire_core::call::is_reserved(mailbox.as_bytes()) {
            return Err(Error::InvalidName(mailbox.into(), RESERVED_NAME));
        }
        Ok(Address::from_names(
            node_name(node)?,
            Name::new(mailbox)
                .ok_or_else(|| Error::InvalidName(mailbox.into(), "longer than 255 bytes"))?,
        ))
    }

    /// The node's name.
    pub fn node(&self) -> &str {
        self.node.as_str()
    }

    /// The mailbox's name.
    pub fn mailbox(&self) -> &str {
        self.mailbox.as_str()
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.mailbox, self.node)
    }
}

/// Why a name beginning with NUL is refused.
pub(crate) const RESERVED_NAME: &str =
    "reserved: names beginning with NUL carry requests and replies";

/// A node name (or a mailbox name that must not be empty): 1..=255 bytes.
pub(crate) fn node_name(s: &str) -> Result<Name, Error> {
    if s.is_empty() {
        return Err(Error::InvalidName(s.into(), "empty"));
    }
    Name::new(s).ok_or_else(|| Error::InvalidName(s.into(), "longer than 255 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert_eq!(Address::new("n", "m").unwrap().to_string(), "m@n");
        assert!(matches!(
            Address::new("", "m"),
            Err(Error::InvalidName(_, "empty"))
        ));
        assert!(Address::new(&"x".repeat(256), "m").is_err());
        assert!(Address::new("n", &"x".repeat(256)).is_err());
        assert_eq!(Address::new("n", "").unwrap().mailbox(), "");
    }
}
