//! FRAGMENT frames: one piece of a message sent in pieces, and reading a piece's head
//! before its data has all come.

use super::*;

/// One piece of a message sent in pieces (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fragment {
    /// This piece's sequence number.
    pub seq: u64,
    /// The sequence number of the message's first piece: the message's id.
    pub id: u64,
    /// The whole message's payload length.
    pub total: u64,
    /// Where this piece's data starts in the payload.
    pub offset: u64,
    /// The destination mailbox.
    pub to: Name,
    /// The sending mailbox.
    pub from: Name,
    /// The data (a slice of the receive buffer when read).
    pub data: Bytes,
}

impl Fragment {
    /// Whether this is the message's first piece.
    pub fn is_first(&self) -> bool {
        self.offset == 0
    }

    /// Whether this is the message's last piece.
    pub fn is_last(&self) -> bool {
        self.offset + self.data.len() as u64 == self.total
    }

    /// What this piece charges against its mailbox's credit (see the module documentation).
    pub fn charge(&self) -> u64 {
        fragment_charge(self.offset, self.data.len(), &self.to, &self.from)
    }
}

/// The credit charge of a piece of `len` bytes at `offset` of a message from `from` to `to`:
/// its data, and for the first piece also what a message adds around its payload, so that a
/// message's pieces charge exactly [`message_len`] in total.
pub fn fragment_charge(offset: u64, len: usize, to: &Name, from: &Name) -> u64 {
    let head = if offset == 0 {
        MESSAGE_OVERHEAD + to.len() + from.len()
    } else {
        0
    };
    (len + head) as u64
}

/// Append a FRAGMENT frame's header and fields, up to (not including) its `data_len` bytes
/// of data, which the caller writes next (from the payload, without copying it here).
#[allow(clippy::too_many_arguments)]
pub fn encode_fragment_head(
    out: &mut Vec<u8>,
    seq: u64,
    id: u64,
    total: u64,
    offset: u64,
    to: &Name,
    from: &Name,
    data_len: usize,
) {
    let start = begin(out, KIND_FRAGMENT);
    for v in [seq, id, total, offset] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    to.encode(out);
    from.encode(out);
    let len = (out.len() - start - 4 + data_len) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

impl Codec for Fragment {
    fn encode(&self, out: &mut Vec<u8>) {
        // Body only (the frame header is written by `Frame::encode`).
        for v in [self.seq, self.id, self.total, self.offset] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        self.to.encode(out);
        self.from.encode(out);
        out.extend_from_slice(&self.data);
    }
    /// Checks that the piece lies inside its message and that only a first piece (offset 0)
    /// is its own id.
    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        let mut f = Fragment::read_fields(r)?;
        let data = r.take(r.remaining(), "data")?;
        f.check(data.len())?;
        f.data = data;
        Ok(f)
    }
}

impl Fragment {
    /// Everything but the data (left empty).
    fn read_fields(r: &mut Reader) -> Result<Fragment, DecodeError> {
        Ok(Fragment {
            seq: r.u64("sequence number")?,
            id: r.u64("message id")?,
            total: r.u64("total length")?,
            offset: r.u64("offset")?,
            to: r.name("destination mailbox")?,
            from: r.name("sending mailbox")?,
            data: Bytes::new(),
        })
    }

    /// With `len` bytes of data: the piece lies inside its message, only a first piece is
    /// its own id, and only an empty message has an empty piece.
    fn check(&self, len: usize) -> Result<(), DecodeError> {
        let (seq, id, total, offset) = (self.seq, self.id, self.total, self.offset);
        let bad = |detail: String| DecodeError::Invalid {
            what: "fragment",
            detail,
        };
        if offset.checked_add(len as u64).is_none_or(|end| end > total) {
            return Err(bad(format!(
                "{len} bytes at offset {offset} run past the message's {total} bytes"
            )));
        }
        if (offset == 0) != (id == seq) || id > seq {
            return Err(bad(format!(
                "piece {seq} at offset {offset} names message {id}: a first piece is its own id, a later one comes after it"
            )));
        }
        if len == 0 && total != 0 {
            return Err(bad("an empty piece of a non-empty message".into()));
        }
        Ok(())
    }
}

/// The fields of a FRAGMENT frame at the front of a buffer, read before all of its data
/// has arrived, so that a reader can read the data straight into the message's
/// reassembly buffer rather than into its receive buffer (see
/// `Reassembly::direct_room`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FragmentHead {
    /// The piece; its `data` is empty.
    pub piece: Fragment,
    /// Bytes of the frame before its data, from the frame's first byte.
    pub head_len: usize,
    /// Bytes of data the frame carries.
    pub data_len: usize,
}

impl FragmentHead {
    /// Whether this is the message's last piece.
    pub fn is_last(&self) -> bool {
        self.piece.offset + self.data_len as u64 == self.piece.total
    }

    /// What the piece charges against its mailbox's credit.
    pub fn charge(&self) -> u64 {
        fragment_charge(
            self.piece.offset,
            self.data_len,
            &self.piece.to,
            &self.piece.from,
        )
    }

    /// The whole frame's length.
    pub fn frame_len(&self) -> usize {
        self.head_len + self.data_len
    }
}

/// Whether `buf` starts with (at least the header of) a FRAGMENT frame.
pub fn starts_fragment(buf: &[u8]) -> bool {
    buf.len() >= HEADER_LEN && buf[4] == KIND_FRAGMENT
}

/// If `buf` starts with a FRAGMENT frame whose fields (all but its data) are there but not
/// all of its data, those fields, checked as [`decode`] checks them (an error is the one
/// `decode` would give for the whole frame). `Ok(None)`: another kind, a whole frame
/// (`decode` takes it), or too few bytes yet to tell.
pub fn fragment_head(buf: &[u8], max_frame_len: usize) -> Result<Option<FragmentHead>, FrameError> {
    if buf.len() < HEADER_LEN || buf[4] != KIND_FRAGMENT {
        return Ok(None);
    }
    if check(buf, max_frame_len)?.is_some() {
        return Ok(None);
    }
    let frame_len = 4 + u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    // The two names' length bytes say where the fields end.
    let to_at = HEADER_LEN + 4 * 8;
    let Some(&to_len) = buf.get(to_at) else {
        return Ok(None);
    };
    let from_at = to_at + 1 + to_len as usize;
    let Some(&from_len) = buf.get(from_at) else {
        return Ok(None);
    };
    let head_len = from_at + 1 + from_len as usize;
    if head_len > buf.len() || head_len > frame_len {
        // Not all there yet, or a frame too short for its own fields (`decode` refuses
        // it once it is whole).
        return Ok(None);
    }
    let data_len = frame_len - head_len;
    let malformed = |source| FrameError::Malformed {
        kind: "FRAGMENT",
        source,
    };
    let mut r = Reader::new(Bytes::copy_from_slice(&buf[HEADER_LEN..head_len]));
    let piece = Fragment::read_fields(&mut r).map_err(malformed)?;
    piece.check(data_len).map_err(malformed)?;
    Ok(Some(FragmentHead {
        piece,
        head_len,
        data_len,
    }))
}
