//! The send window's buffers: reused, best fit, chunks appended.

use super::*;

impl SendWindow {
    /// Capacity of the acknowledged buffers kept for reuse.
    pub fn spare_bytes(&self) -> usize {
        self.free_bytes
    }

    /// Let go of the acknowledged buffers kept for reuse (the peer is gone for good).
    pub fn release_buffers(&mut self) {
        self.free = Vec::new();
        self.free_bytes = 0;
    }

    /// The smallest acknowledged chunk's buffer that holds `need` bytes, emptied, or a new
    /// one of `new` bytes (a free one is not grown: growing copies and faults in fresh
    /// pages, and it may serve a later batch as it is).
    pub(super) fn take_free(&mut self, need: usize, new: usize) -> Vec<u8> {
        match self.best_fit(need) {
            Some(i) => self.take_slot(i),
            None => Vec::with_capacity(new),
        }
    }

    /// Free buffer `i`, taken off the free list.
    pub(super) fn take_slot(&mut self, i: usize) -> Vec<u8> {
        let v = self.free.swap_remove(i);
        self.free_bytes -= v.capacity();
        v
    }

    /// A buffer to copy `need` bytes into: a free one, unless it is one a large batch
    /// could move into (at least [`MOVE_BYTES`]) and more than twice what is needed; else
    /// a new one of exactly that size. A small batch that took a large free buffer held
    /// it in the window for a round trip with a few KiB in it (memory the window's byte
    /// count does not see), and the next large batch found none to move into, so it was
    /// copied into freshly allocated pages.
    pub(super) fn take_fitting(&mut self, need: usize) -> Vec<u8> {
        match self.best_fit(need) {
            Some(i)
                if self.free[i].capacity() < MOVE_BYTES
                    || self.free[i].capacity() <= need.saturating_mul(2) =>
            {
                self.take_slot(i)
            }
            _ => Vec::with_capacity(need),
        }
    }

    /// The index of the smallest free buffer with room for `need` bytes.
    pub(super) fn best_fit(&self, need: usize) -> Option<usize> {
        (self.free.iter().enumerate())
            .filter(|(_, b)| b.capacity() >= need)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i)
    }

    /// Append a chunk of MESSAGES frames numbered from `first` to `self.next_seq`.
    pub(super) fn push_chunk(&mut self, data: Bytes, first: u64, refs: Option<Arc<[ByRef]>>) {
        let c = Chunk {
            data,
            first_seq: first,
            end_seq: self.next_seq,
            piece: None,
            refs,
        };
        self.bytes += c.wire_len();
        self.chunks.push_back(c);
    }
}
