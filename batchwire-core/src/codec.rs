//! The `Codec` trait and a zero-copy `Reader`, in the style of rustls' `msgs::codec`.
//!
//! Every wire type encodes itself by appending to a `Vec<u8>` and reads itself from a
//! [`Reader`] over a [`Bytes`] buffer, so that byte strings read from the wire (payloads and
//! mailbox names) are slices of the receive buffer rather than copies.
//!
//! All integers are little-endian.

use bytes::Bytes;

/// Why bytes could not be decoded. "Not enough bytes yet" is *not* one of these: the frame
/// layer checks that a whole frame is present before any `Codec::read` runs, so running out
/// of bytes inside a frame means the frame is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A field ran past the end of its frame.
    #[error("{what} runs past the end of the frame")]
    Truncated { what: &'static str },
    /// A name was not valid UTF-8.
    #[error("{what} is not valid UTF-8")]
    NotUtf8 { what: &'static str },
    /// A frame had bytes left over after its last field.
    #[error("{0} unexpected trailing bytes in frame")]
    TrailingBytes(usize),
    /// A field held a value that is not allowed.
    #[error("invalid {what}: {detail}")]
    Invalid { what: &'static str, detail: String },
}

/// A type with a wire encoding.
pub trait Codec: Sized {
    /// Append the encoding of `self` to `out`.
    fn encode(&self, out: &mut Vec<u8>);
    /// Read one value from `r`, advancing it.
    fn read(r: &mut Reader) -> Result<Self, DecodeError>;

    /// Encode into a fresh vector (convenience for tests and cold paths).
    fn get_encoding(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode(&mut v);
        v
    }
}

/// A cursor over a `Bytes` buffer. Slices it hands out share the buffer (no copy).
#[derive(Debug, Clone)]
pub struct Reader {
    buf: Bytes,
    pos: usize,
}

impl Reader {
    pub fn new(buf: Bytes) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes not yet consumed.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Fail unless every byte was consumed.
    pub fn expect_empty(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(DecodeError::TrailingBytes(n)),
        }
    }

    /// Take the next `n` bytes as a shared slice.
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<Bytes, DecodeError> {
        if self.remaining() < n {
            return Err(DecodeError::Truncated { what });
        }
        let b = self.buf.slice(self.pos..self.pos + n);
        self.pos += n;
        Ok(b)
    }

    /// Borrow the next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        if self.remaining() < N {
            return Err(DecodeError::Truncated { what });
        }
        let mut a = [0u8; N];
        a.copy_from_slice(&self.buf[self.pos..self.pos + N]);
        self.pos += N;
        Ok(a)
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(what)?[0])
    }
    pub fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    pub fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    pub fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A name: one length byte, then that many bytes of UTF-8.
    pub fn name(&mut self, what: &'static str) -> Result<Name, DecodeError> {
        let len = self.u8(what)? as usize;
        let b = self.take(len, what)?;
        Name::from_bytes(b).ok_or(DecodeError::NotUtf8 { what })
    }
}

/// A short UTF-8 string (at most 255 bytes). A name of up to [`Name::INLINE`] bytes (most
/// node and mailbox names) is kept inline, so cloning or dropping it touches no shared
/// reference count: the receive path makes two names per message. A longer one is backed
/// by `Bytes`, so that a name read off the wire is a slice of the receive buffer and cloning
/// it never allocates.
#[derive(Clone)]
pub struct Name(Repr);

#[derive(Clone)]
enum Repr {
    Inline(Wire),
    Shared(Bytes),
}

/// An inline name as it goes on the wire: its length, then its bytes (what follows them is
/// never read). Aligned to 8 bytes, so it is copied in whole words at the same offsets
/// wherever it goes, and encoded as one 24-byte copy. The fields it had before (a length
/// byte, then 23 bytes at an odd offset) were copied through a temporary a few bytes at a
/// time and read back in words, and each such read waited for the stores before it (a
/// failed store-to-load forward), on the hottest path of a send.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct Wire([u8; Name::INLINE + 1]);

impl Wire {
    /// The wire form of `b`, at most [`Name::INLINE`] bytes long.
    #[inline(always)]
    fn of(b: &[u8]) -> Wire {
        let mut w = Wire([0; Name::INLINE + 1]);
        w.0[0] = b.len() as u8;
        w.0[1..=b.len()].copy_from_slice(b);
        w
    }

    #[inline(always)]
    fn bytes(&self) -> &[u8] {
        &self.0[1..=self.0[0] as usize]
    }
}

// On 64-bit targets a name is no bigger than a `Bytes`: the inline form fits beside its
// vtable pointer. (Where pointers are 4 bytes, a name is larger than a `Bytes`.)
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<Name>() == std::mem::size_of::<Bytes>());

impl Name {
    /// The longest name the wire format can carry.
    pub const MAX_LEN: usize = 255;

    /// The longest name kept inline (no allocation, no reference count): what fits in a
    /// `Bytes` beside its vtable pointer, so a `Name` is no bigger than a `Bytes`.
    pub const INLINE: usize = 23;

    /// A copy of `b` (unchecked): inline if short enough.
    pub(crate) fn copied(b: &[u8]) -> Name {
        if b.len() <= Self::INLINE {
            Name(Repr::Inline(Wire::of(b)))
        } else {
            Name(Repr::Shared(Bytes::copy_from_slice(b)))
        }
    }

    /// `b` itself if long, a copy if short enough to be inline (unchecked).
    fn shared(b: Bytes) -> Name {
        if b.len() <= Self::INLINE {
            Self::copied(&b)
        } else {
            Name(Repr::Shared(b))
        }
    }

    /// Wrap bytes that are valid UTF-8 and at most 255 bytes long.
    pub fn from_bytes(b: Bytes) -> Option<Name> {
        (b.len() <= Self::MAX_LEN && std::str::from_utf8(&b).is_ok()).then(|| Name::shared(b))
    }

    /// The name at `range` of `data`, already checked to be UTF-8 and at most 255 bytes
    /// long (by `frame::check_message`): copied if short, else a slice of `data`. Were the
    /// bytes not checked, `as_str` would give "" rather than misbehave.
    #[inline(always)]
    pub(crate) fn from_validated(data: &Bytes, range: std::ops::Range<usize>) -> Name {
        if range.len() <= Self::INLINE {
            // A fixed-size copy (a few vector moves, no call) when the buffer goes on that
            // far: the bytes past the name are never read (`as_bytes` stops at `len`).
            if let Some(window) = data.get(range.start..range.start + Self::INLINE) {
                let mut w = Wire([0; Self::INLINE + 1]);
                w.0[0] = range.len() as u8;
                w.0[1..].copy_from_slice(window);
                return Name(Repr::Inline(w));
            }
            Self::copied(&data[range])
        } else {
            Name(Repr::Shared(data.slice(range)))
        }
    }

    /// A name from a string; `None` if longer than 255 bytes.
    pub fn new(s: &str) -> Option<Name> {
        (s.len() <= Self::MAX_LEN).then(|| Name::copied(s.as_bytes()))
    }

    /// A name from a `'static` string, without copying a long one. Panics if longer than
    /// 255 bytes, which for a literal is a programming error.
    pub fn from_static(s: &'static str) -> Name {
        assert!(s.len() <= Self::MAX_LEN, "name longer than 255 bytes");
        Name::shared(Bytes::from_static(s.as_bytes()))
    }

    /// The same name in a buffer of its own: a long name read off the wire is a slice of
    /// the receive buffer and would keep all of it alive in a long-lived table.
    pub fn detached(&self) -> Name {
        match &self.0 {
            Repr::Inline(_) => self.clone(),
            Repr::Shared(b) => Name(Repr::Shared(Bytes::copy_from_slice(b))),
        }
    }

    /// The name without its first `n` bytes ("" if `n` is not at a character boundary or
    /// past the end); a long one shares the buffer.
    pub fn slice_from(&self, n: usize) -> Name {
        if n > self.len() || !self.as_str().is_char_boundary(n) {
            return Name::copied(b"");
        }
        match &self.0 {
            Repr::Inline(_) => Name::copied(&self.as_bytes()[n..]),
            Repr::Shared(b) => Name::shared(b.slice(n..)),
        }
    }

    pub fn as_str(&self) -> &str {
        // Checked in every constructor; from_utf8 on a short name costs a few nanoseconds
        // and keeps this crate free of `unsafe`.
        std::str::from_utf8(self.as_bytes()).unwrap_or("")
    }

    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline(w) => w.bytes(),
            Repr::Shared(b) => b,
        }
    }

    #[inline]
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::Inline(w) => w.0[0] as usize,
            Repr::Shared(b) => b.len(),
        }
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Append the wire encoding (length byte + bytes). An inline name goes as one
    /// fixed-size copy (no call), cut back to its length: the send path encodes two names
    /// per message.
    #[inline]
    pub fn encode(&self, out: &mut Vec<u8>) {
        match &self.0 {
            Repr::Inline(w) => {
                out.extend_from_slice(&w.0);
                out.truncate(out.len() - (Self::INLINE - w.0[0] as usize));
            }
            Repr::Shared(b) => {
                out.push(b.len() as u8);
                out.extend_from_slice(b);
            }
        }
    }
}

// Equality, order and hash are the bytes' (as `Borrow<[u8]>` requires), whatever the
// representation.
impl PartialEq for Name {
    #[inline(always)]
    fn eq(&self, other: &Name) -> bool {
        bytes_eq(self.as_bytes(), other.as_bytes())
    }
}

/// `a == b`, without a call to `memcmp` for slices of up to 16 bytes (most names): two
/// loads each, overlapping when shorter than the loads. The send path compares a node
/// name and a mailbox name per message, and for slices this short a call to `memcmp`
/// costs more than the comparison itself.
#[inline]
pub fn bytes_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let u64_at = |s: &[u8], i: usize| u64::from_le_bytes(s[i..i + 8].try_into().unwrap_or([0; 8]));
    let u32_at = |s: &[u8], i: usize| u32::from_le_bytes(s[i..i + 4].try_into().unwrap_or([0; 4]));
    match n {
        0 => true,
        1..=3 => a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1],
        4..=7 => u32_at(a, 0) == u32_at(b, 0) && u32_at(a, n - 4) == u32_at(b, n - 4),
        8..=16 => u64_at(a, 0) == u64_at(b, 0) && u64_at(a, n - 8) == u64_at(b, n - 8),
        _ => a == b,
    }
}

impl Eq for Name {}

impl PartialOrd for Name {
    fn partial_cmp(&self, other: &Name) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Name {
    fn cmp(&self, other: &Name) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl std::hash::Hash for Name {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state)
    }
}

impl std::fmt::Debug for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// FNV-1a for maps keyed by names, which the send path looks up: node and mailbox names
/// are short, and for so few bytes SipHash's fixed cost per hash dominates. The maps keyed
/// by names from the network are bounded by their owners (and only ever looked up with
/// names a peer sent, or filled with a bound).
#[derive(Default, Clone, Copy, Debug)]
pub struct NameHash;

impl std::hash::BuildHasher for NameHash {
    type Hasher = Fnv;
    #[inline]
    fn build_hasher(&self) -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

/// The hasher of [`NameHash`].
pub struct Fnv(u64);

// Inlined: the peer index and every name map hash a name per message, from other crates.
impl std::hash::Hasher for Fnv {
    /// FNV's state, mixed: its top bits barely depend on the last bytes (names `m000` to
    /// `m999` got 10 distinct values in the 7 top bits, which the hash table uses as its
    /// tag, so a lookup compared many names), and one multiply spreads them.
    #[inline]
    fn finish(&self) -> u64 {
        (self.0 ^ (self.0 >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ *b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
}

/// A map keyed by names.
pub type NameMap<V> = std::collections::HashMap<Name, V, NameHash>;

impl std::borrow::Borrow<[u8]> for Name {
    fn borrow(&self) -> &[u8] {
        self.as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Names that differ only in their last characters spread over the hash table's tags
    /// (its 7 top bits) and its buckets as random values would.
    #[test]
    fn similar_names_hash_apart() {
        use std::hash::BuildHasher;
        for fmt in ["m", "node-", "n"] {
            let hashes: Vec<u64> = (0..1000)
                .map(|i| NameHash.hash_one(Name::new(&format!("{fmt}{i:03}")).unwrap()))
                .collect();
            let tags: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
            let low: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 1023).collect();
            // Random values: all 128 tags, about 632 of 1024 buckets.
            assert!(tags.len() >= 120, "{fmt}: {} tags", tags.len());
            assert!(low.len() >= 550, "{fmt}: {} buckets", low.len());
        }
    }

    /// Every length from 0 to 40 (each load width and the fallback), equal slices and
    /// slices differing in any one byte.
    #[test]
    fn bytes_eq_is_slice_equality() {
        for n in 0..=40usize {
            let a: Vec<u8> = (0..n as u8).map(|i| i.wrapping_mul(37)).collect();
            assert!(bytes_eq(&a, &a.clone()), "{n} bytes, equal");
            for i in 0..n {
                let mut b = a.clone();
                b[i] ^= 0x80;
                assert!(!bytes_eq(&a, &b), "{n} bytes, byte {i} differs");
            }
            assert!(
                !bytes_eq(&a, &[a.as_slice(), b"x"].concat()),
                "{n} against {}",
                n + 1
            );
        }
    }

    proptest! {
        #[test]
        fn bytes_eq_agrees_with_slice_equality(a in proptest::collection::vec(0u8..4, 0..24),
                                               b in proptest::collection::vec(0u8..4, 0..24)) {
            prop_assert_eq!(bytes_eq(&a, &b), a == b);
        }
    }

    #[test]
    fn reader_reads_integers_little_endian_and_reports_truncation() {
        let mut r = Reader::new(Bytes::from_static(&[1, 0, 2, 0, 0, 0, 9]));
        assert_eq!(r.u16("a").unwrap(), 1);
        assert_eq!(r.u32("b").unwrap(), 2);
        assert_eq!(r.u16("c"), Err(DecodeError::Truncated { what: "c" }));
        assert_eq!(r.u8("d").unwrap(), 9);
        r.expect_empty().unwrap();
    }

    #[test]
    fn names_are_checked_for_utf8_and_length() {
        assert!(Name::from_bytes(Bytes::from_static(&[0xff, 0xfe])).is_none());
        assert!(Name::new(&"x".repeat(256)).is_none());
        let n = Name::new("inbox").unwrap();
        let mut v = Vec::new();
        n.encode(&mut v);
        assert_eq!(v, b"\x05inbox");
        assert_eq!(Reader::new(v.into()).name("n").unwrap(), n);
    }

    #[test]
    fn a_name_encodes_as_its_length_and_bytes_whatever_follows_it_in_the_buffer() {
        for len in 0..=Name::INLINE + 8 {
            let s: String = (0..len).map(|i| (b'a' + (i % 26) as u8) as char).collect();
            let mut want = vec![len as u8];
            want.extend_from_slice(s.as_bytes());
            let mut out = b"x".to_vec();
            Name::new(&s).unwrap().encode(&mut out);
            assert_eq!(out[1..], want[..], "new, {len} bytes");
            // Read from a frame with other bytes after it (the window copied for a short
            // name takes some of them along): they do not go out with it.
            let mut framed = b"..".to_vec();
            framed.extend_from_slice(s.as_bytes());
            framed.extend_from_slice(&[0xff; 32]);
            let framed = Bytes::from(framed);
            let n = Name::from_validated(&framed, 2..2 + len);
            let mut out = Vec::new();
            n.encode(&mut out);
            assert_eq!(out, want, "from_validated, {len} bytes");
            assert_eq!(n.clone().as_str(), s);
        }
    }

    #[test]
    fn short_and_long_names_behave_alike() {
        use std::collections::hash_map::DefaultHasher;
        use std::hash::{Hash, Hasher};
        let hash = |b: &[u8]| {
            let mut h = DefaultHasher::new();
            b.hash(&mut h);
            h.finish()
        };
        let long = "l".repeat(Name::INLINE + 1);
        let edge = "e".repeat(Name::INLINE);
        for s in ["", "inbox", edge.as_str(), long.as_str(), &"x".repeat(255)] {
            let n = Name::new(s).unwrap();
            assert_eq!(n.as_str(), s);
            assert_eq!(n.len(), s.len());
            // Hash and equality are the bytes' (maps look names up by `&[u8]`).
            let mut h = DefaultHasher::new();
            n.hash(&mut h);
            assert_eq!(h.finish(), hash(s.as_bytes()), "{s}");
            let b = Bytes::copy_from_slice(s.as_bytes());
            assert_eq!(Name::from_bytes(b.clone()).unwrap(), n);
            let mut framed = b"ab".to_vec();
            framed.extend_from_slice(s.as_bytes());
            let framed = Bytes::from(framed);
            assert_eq!(Name::from_validated(&framed, 2..framed.len()), n);
            // With more bytes after it (a message's payload), equal all the same.
            let mut followed = framed.to_vec();
            followed.extend_from_slice(&[0xff; 40]);
            let followed = Bytes::from(followed);
            let m = Name::from_validated(&followed, 2..2 + s.len());
            assert_eq!(m, n);
            assert_eq!(m.as_str(), s);
            assert_eq!(n.detached(), n);
            assert_eq!(n.slice_from(0), n);
            if !s.is_empty() {
                assert_eq!(n.slice_from(1).as_str(), &s[1..]);
            }
            assert_eq!(n.slice_from(s.len() + 1).as_str(), "");
            assert_eq!(
                Name::from_static("inbox").cmp(&Name::new("inboy").unwrap()),
                std::cmp::Ordering::Less
            );
        }
        // The inline form fits beside the `Bytes` one: a name is no bigger than a `Bytes`
        // (on 64-bit targets).
        #[cfg(target_pointer_width = "64")]
        assert_eq!(std::mem::size_of::<Name>(), std::mem::size_of::<Bytes>());
        // A long name from the wire shares the receive buffer; a short one does not.
        let buf = Bytes::from(format!("..{long}"));
        let n = Name::from_validated(&buf, 2..buf.len());
        assert_eq!(n.as_bytes().as_ptr(), buf[2..].as_ptr());
        let buf = Bytes::from_static(b"..inbox");
        let n = Name::from_validated(&buf, 2..buf.len());
        assert_ne!(n.as_bytes().as_ptr(), buf[2..].as_ptr());
        assert_eq!(n.as_str(), "inbox");
    }
}
