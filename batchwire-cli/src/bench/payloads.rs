//! The payloads a timed sender sends (`throughput` and `mperf`): numbered, so the receiver
//! checks count, duplicates and order.
//!
//! Each payload starts with its sequence number (u64, little endian), then the sender's tag
//! (u32) if it has one; the rest is zeros. They are built before the clock starts whenever
//! all of them fit in [`PREBUILT_BYTES`] (512 MiB), as `raw` encodes all its frames before
//! its clock: a figure is then what sending costs, not what building costs. (Until the
//! tenth session of issue 14 the payloads of these two scenarios were built inside the
//! timed loop; at 100 B that was about a quarter of the sending thread's time. `fan-in` has
//! always built its payloads before its gate opens.) Runs too large for that (long chaos
//! runs) cut the payloads from reused chunks while sending, and their tables say so.

use std::collections::VecDeque;

use bytes::{BufMut, Bytes, BytesMut};

/// The most a sending process builds before its clock starts: every payload of its run, if
/// they fit (the default runs need at most 300 MB). Per process: mperf's N nodes may each
/// hold this much.
pub const PREBUILT_BYTES: u64 = 512 << 20;

/// Whether `n` payloads of `size` bytes (at least the 8-byte header) are built before the
/// clock.
pub fn prebuilt(n: u64, size: usize) -> bool {
    n.saturating_mul(size.max(8) as u64) <= PREBUILT_BYTES
}

/// How the payloads of a run were built, for a table's title.
pub fn how(n: u64, size: usize) -> &'static str {
    if prebuilt(n, size) {
        "payloads built before the clock starts, as raw's frames"
    } else {
        "payloads built while sending (more than 512 MiB per sender)"
    }
}

/// `n` numbered payloads of `size` bytes (at least the header), in order.
pub struct Payloads {
    size: usize,
    tag: Option<u32>,
    next: u64,
    n: u64,
    how: How,
}

enum How {
    /// Every payload, back to back, in one buffer: a payload is a slice of it.
    Prebuilt(Bytes),
    /// Built as they are taken, cut from chunks of `block` bytes.
    WhileSending {
        chunk: BytesMut,
        retired: VecDeque<BytesMut>,
        block: usize,
    },
}

impl Payloads {
    /// The payloads; builds them all now if [`prebuilt`] says so.
    pub fn new(n: u64, size: usize, tag: Option<u32>) -> Payloads {
        let size = size.max(header_len(tag));
        let how = if prebuilt(n, size) {
            let mut all = BytesMut::zeroed(n as usize * size);
            for (seq, p) in all.chunks_mut(size).enumerate() {
                stamp(p, seq as u64, tag);
            }
            How::Prebuilt(all.freeze())
        } else {
            let block = (1 << 20).max(size);
            How::WhileSending {
                chunk: BytesMut::with_capacity(block),
                retired: VecDeque::new(),
                block,
            }
        };
        Payloads {
            size,
            tag,
            next: 0,
            n,
            how,
        }
    }
}

impl Iterator for Payloads {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        if self.next == self.n {
            return None;
        }
        let seq = self.next;
        self.next += 1;
        let size = self.size;
        Some(match &mut self.how {
            How::Prebuilt(all) => {
                let at = seq as usize * size;
                all.slice(at..at + size)
            }
            How::WhileSending {
                chunk,
                retired,
                block,
            } => {
                if chunk.capacity() < size {
                    *chunk = next_chunk(std::mem::take(chunk), retired, *block);
                }
                chunk.put_u64_le(seq);
                if let Some(t) = self.tag {
                    chunk.put_u32_le(t);
                }
                chunk.put_bytes(0, size - header_len(self.tag));
                chunk.split().freeze()
            }
        })
    }
}

pub(super) fn header_len(tag: Option<u32>) -> usize {
    8 + if tag.is_some() { 4 } else { 0 }
}

pub(super) fn stamp(p: &mut [u8], seq: u64, tag: Option<u32>) {
    p[..8].copy_from_slice(&seq.to_le_bytes());
    if let Some(t) = tag {
        p[8..12].copy_from_slice(&t.to_le_bytes());
    }
}

/// Retired payload chunks a sender keeps while sending: enough for what batchwire may hold
/// by reference with the default limits (a 4 MiB queue and a 16 MiB send window), 40 MiB
/// at most. Payloads of 512 B or more are sent by reference (not copied), so batchwire
/// holds them until the peer acknowledges them; a chunk is used again once every payload
/// cut from it is dropped. A new chunk per 1 MiB cost the sending thread page faults on
/// fresh pages (at 10 KB, 2.4% of all samples in page faults and zeroing); with 16
/// chunks, a chaos run at 1 KB (acknowledgements lost at every break, so the window
/// full) ran out of free ones.
const CHUNKS: usize = 40;

/// The next chunk to cut payloads from, with room for `block` bytes: `used` itself or a
/// retired one if every payload cut from it was dropped, else a new one. `used` is
/// retired (the oldest retired chunk goes beyond [`CHUNKS`]); it must have a buffer (not
/// `BytesMut::new()`).
fn next_chunk(mut used: BytesMut, retired: &mut VecDeque<BytesMut>, block: usize) -> BytesMut {
    if used.try_reclaim(block) {
        return used;
    }
    let free = (0..retired.len()).find(|&i| retired[i].try_reclaim(block));
    let next = match free.and_then(|i| retired.remove(i)) {
        Some(c) => c,
        None => BytesMut::with_capacity(block),
    };
    if retired.len() == CHUNKS {
        retired.pop_front();
    }
    retired.push_back(used);
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(p: &[u8]) -> u64 {
        u64::from_le_bytes(p[..8].try_into().unwrap())
    }

    #[test]
    fn prebuilt_and_built_while_sending_give_the_same_payloads() {
        let built: Vec<Bytes> = Payloads::new(5000, 300, Some(7)).collect();
        let mut sending = Payloads::new(5000, 300, Some(7));
        // Force the other way on the same run.
        sending.how = How::WhileSending {
            chunk: BytesMut::with_capacity(1 << 20),
            retired: VecDeque::new(),
            block: 1 << 20,
        };
        let sending: Vec<Bytes> = sending.collect();
        assert_eq!(built.len(), 5000);
        assert_eq!(built, sending);
        for (i, p) in built.iter().enumerate() {
            assert_eq!((p.len(), seq(p)), (300, i as u64));
            assert_eq!(&p[8..12], &7u32.to_le_bytes());
            assert!(p[12..].iter().all(|&b| b == 0));
        }
        // Without a tag the header is the sequence number only; a size below it grows to it.
        let p: Vec<Bytes> = Payloads::new(3, 2, None).collect();
        assert_eq!(
            p.iter().map(|p| (p.len(), seq(p))).collect::<Vec<_>>(),
            [(8, 0), (8, 1), (8, 2)]
        );
    }

    #[test]
    fn runs_above_the_bound_are_built_while_sending() {
        assert!(prebuilt(300_000, 1000));
        assert!(!prebuilt(3_000_000, 1000));
        // A size below the header is built at the header's size.
        assert!(!prebuilt(PREBUILT_BYTES / 8 + 1, 2));
        assert!(!prebuilt(u64::MAX, 2));
        let mut p = Payloads::new(PREBUILT_BYTES / 100 + 1, 100, None);
        assert!(matches!(p.how, How::WhileSending { .. }));
        assert_eq!(p.next().map(|b| seq(&b)), Some(0));
    }

    #[test]
    fn payload_chunks_are_taken_again_once_their_payloads_are_dropped() {
        let mut retired = Default::default();
        let mut c = BytesMut::with_capacity(1000);
        let first = c.as_ptr();
        c.put_bytes(1, 1000);
        let held = c.split().freeze();
        // A payload of it is alive: a new chunk, and the used one is retired.
        let mut c = next_chunk(c, &mut retired, 1000);
        assert_ne!(c.as_ptr(), first);
        assert_eq!(retired.len(), 1);
        c.put_bytes(2, 1000);
        let _held2 = c.split().freeze();
        drop(held);
        // The first chunk's payload is gone: it is taken again.
        let c = next_chunk(c, &mut retired, 1000);
        assert_eq!(c.as_ptr(), first);
        assert_eq!(retired.len(), 1);
    }
}
