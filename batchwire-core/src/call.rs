//! Requests and replies, carried as ordinary messages (the way Erlang's `gen_server:call`
//! rides on plain messages as `{'$gen_call', {From, Ref}, Request}`): no frame kind of their
//! own, so they are sequenced, acknowledged, resumed, bundled and flow-controlled like any
//! other message. The correlation id travels in the message's *sender* field:
//!
//! ```text
//! request:  to = the service's mailbox   from = NUL id:16 hex digits  caller's mailbox
//! reply:    to = NUL (the reply inbox)    from = NUL id:16 hex digits
//! ```
//!
//! Mailbox names that begin with NUL are reserved for this (applications cannot register or
//! address them), so a plain message is never mistaken for a call. Everything here is
//! untrusted input: a malformed call name is just a name, and a reply's id means something
//! only to the node that issued it, and only from the node it asked.

use crate::codec::Name;

/// The first byte of every reserved name.
pub const RESERVED: u8 = 0;

/// The reply inbox: the destination mailbox of every reply.
pub const REPLY_INBOX: &str = "\0";

/// Bytes a call id takes in a name: NUL and 16 hex digits.
pub const CALL_TAG_LEN: usize = 17;

/// The longest caller mailbox name a request can carry (255 minus the tag).
pub const MAX_CALLER_LEN: usize = Name::MAX_LEN - CALL_TAG_LEN;

/// Whether `name` is reserved for calls (begins with NUL).
#[inline]
pub fn is_reserved(name: &[u8]) -> bool {
    name.first() == Some(&RESERVED)
}

/// Whether `name` is the reply inbox.
#[inline]
pub fn is_reply_inbox(name: &[u8]) -> bool {
    name == REPLY_INBOX.as_bytes()
}

/// NUL, the id in 16 lowercase hex digits, then `rest`: one allocation.
fn tagged(id: u64, rest: &str) -> Option<Name> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut b = Vec::with_capacity(CALL_TAG_LEN + rest.len());
    b.push(RESERVED);
    b.extend((0..16).rev().map(|i| HEX[(id >> (4 * i)) as usize & 0xf]));
    b.extend_from_slice(rest.as_bytes());
    Name::from_bytes(b.into())
}

/// The sender field of request `id` from the caller's mailbox `caller` (`None` if `caller`
/// is longer than [`MAX_CALLER_LEN`]).
pub fn request_sender(id: u64, caller: &str) -> Option<Name> {
    if caller.len() > MAX_CALLER_LEN {
        return None;
    }
    tagged(id, caller)
}

/// The sender field of the reply to request `id`.
pub fn reply_sender(id: u64) -> Name {
    // 17 bytes of ASCII: always a valid name.
    tagged(id, "").unwrap_or_else(|| Name::from_static(""))
}

/// Read a call tag: `Some((id, rest))` if `name` is NUL, 16 lowercase hex digits, then
/// anything; `None` for any other name.
pub fn parse(name: &[u8]) -> Option<(u64, &[u8])> {
    if name.len() < CALL_TAG_LEN || name[0] != RESERVED {
        return None;
    }
    let mut id = 0u64;
    for &c in &name[1..CALL_TAG_LEN] {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => return None,
        };
        id = id << 4 | u64::from(d);
    }
    Some((id, &name[CALL_TAG_LEN..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn requests_and_replies_name_their_call() {
        let r = request_sender(0xdead_beef, "caller").unwrap();
        assert_eq!(r.len(), CALL_TAG_LEN + 6);
        assert!(is_reserved(r.as_bytes()));
        assert!(
            !is_reserved(b"caller") && !is_reserved(b""),
            "plain names are not"
        );
        assert_eq!(
            parse(r.as_bytes()),
            Some((0xdead_beef, b"caller".as_slice()))
        );
        let p = reply_sender(u64::MAX);
        assert_eq!(parse(p.as_bytes()), Some((u64::MAX, b"".as_slice())));
        assert_eq!(
            reply_sender(0x0123_4567_89ab_cdef).as_str(),
            "\x000123456789abcdef"
        );
        assert!(is_reply_inbox(REPLY_INBOX.as_bytes()));
        assert!(!is_reply_inbox(p.as_bytes()));
    }

    #[test]
    fn other_names_are_not_calls() {
        for n in [
            b"".as_slice(),
            b"svc",
            b"\0",
            b"\x00123",
            b"\x000123456789abcdeX",
            b"\x000123456789ABCDEF",
            b"x0123456789abcdef",
        ] {
            assert_eq!(parse(n), None, "{n:?}");
        }
        assert!(request_sender(1, &"m".repeat(MAX_CALLER_LEN)).is_some());
        assert!(request_sender(1, &"m".repeat(MAX_CALLER_LEN + 1)).is_none());
    }

    proptest! {
        #[test]
        fn parse_never_panics_and_round_trips(id: u64, caller in "[a-z]{0,40}", junk: Vec<u8>) {
            let n = request_sender(id, &caller).unwrap();
            prop_assert_eq!(parse(n.as_bytes()), Some((id, caller.as_bytes())));
            let _ = parse(&junk);
        }
    }
}
