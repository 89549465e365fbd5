//! Values as payloads: postcard, both ways (`send_value`, `request_value`, `reply_value`,
//! `Envelope::value`).

use bytes::Bytes;

use crate::error::Error;

/// A value serialized with postcard (`send_value`, `request_value`, `reply_value`).
pub(crate) fn encode<T: serde::Serialize>(value: &T) -> Result<Bytes, Error> {
    postcard::to_allocvec(value)
        .map(Bytes::from)
        .map_err(|e| Error::Encode(e.to_string()))
}
