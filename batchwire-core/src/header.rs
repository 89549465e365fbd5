//! The frame header, shared by every frame kind: `len:u32 kind:u8`, the kinds, and the
//! helpers that write a header and patch its length once the body is written.

/// The four bytes every HELLO starts with.
pub const MAGIC: [u8; 4] = *b"BWIR";
/// The protocol version this build speaks.
/// Version 2: role-bound handshake proofs (the acceptor proves only after the dialler).
/// Version 3: large messages in fragments, per-mailbox credit (FRAGMENT, CREDIT, SYNC), and
/// RESUME's `keep`.
/// Version 4: cluster membership (MEMBER frames carrying SWIM packets).
/// Version 5: membership on its own sealed UDP datagrams; a MEMBER frame on a connection is
/// a protocol violation (so a version 4 node is refused at the handshake, by version,
/// rather than cut for the frames it would send).
pub const PROTOCOL_VERSION: u16 = 5;
/// Bytes before the body: the length and the kind.
pub const HEADER_LEN: usize = 5;
/// Bytes a MESSAGES frame adds around its messages (header, count, first sequence number).
pub const LIST_OVERHEAD: usize = HEADER_LEN + 4 + 8;
/// Where a MESSAGES frame's first sequence number sits, from the frame's start.
pub(crate) const SEQ_OFFSET: usize = HEADER_LEN + 4;
/// Bytes each message adds around its names and payload (two name lengths, payload length).
pub const MESSAGE_OVERHEAD: usize = 1 + 1 + 4;
/// Bytes a FRAGMENT frame adds around its names and data (header, four u64 fields, two
/// name lengths).
pub const FRAGMENT_OVERHEAD: usize = HEADER_LEN + 4 * 8 + 2;
/// The longest frame any batchwire node sends: MESSAGES frames close at `frame_bytes` (at
/// most 1 MiB) and a message in one is at most `fragment_bytes` (at most 1 MiB), so every
/// frame fits. A reader refuses longer ones before buffering them.
pub const MAX_FRAME_LEN: usize = 2 * (1 << 20) + 4096;
/// Longest reason text carried in a REFUSE frame.
pub const MAX_REASON_LEN: usize = 1024;

pub(crate) const KIND_HELLO: u8 = 1;
pub(crate) const KIND_AUTH: u8 = 2;
pub(crate) const KIND_REFUSE: u8 = 3;
pub(crate) const KIND_MESSAGES: u8 = 4;
pub(crate) const KIND_UNDELIVERABLE: u8 = 5;
pub(crate) const KIND_GOODBYE: u8 = 6;
pub(crate) const KIND_ACK: u8 = 7;
pub(crate) const KIND_RESUME: u8 = 8;
pub(crate) const KIND_FRAGMENT: u8 = 9;
pub(crate) const KIND_CREDIT: u8 = 10;
pub(crate) const KIND_SYNC: u8 = 11;
pub(crate) const KIND_MEMBER: u8 = 12;

/// Write a frame header with a placeholder length; returns where the frame starts.
pub(crate) fn begin(out: &mut Vec<u8>, kind: u8) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0, 0, 0, 0, kind]);
    start
}

/// Patch the length of the frame that starts at `start`.
pub(crate) fn finish(out: &mut [u8], start: usize) {
    finish_with(out, start, 0);
}

/// Patch the length of the frame that starts at `start`, counting `external` bytes that
/// are not in `out` but go on the wire inside the frame (payloads sent by reference).
pub(crate) fn finish_with(out: &mut [u8], start: usize, external: usize) {
    let len = (out.len() - start - 4 + external) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}
