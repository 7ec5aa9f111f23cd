//! Length-prefixed CBOR framing: a 4-byte big-endian payload length, then
//! that many bytes of CBOR.

use std::io::{self, Read, Write};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The largest payload a frame may carry, in bytes. Requests are a few
/// hundred bytes; anything near this limit is hostile or broken.
pub const MAX_FRAME_BYTES: u32 = 64 * 1024;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer announced a payload larger than [`MAX_FRAME_BYTES`].
    #[error("frame of {len} bytes exceeds the limit of {MAX_FRAME_BYTES} bytes")]
    TooLarge {
        /// The announced payload length, in bytes.
        len: u32,
    },
    /// The stream ended before the announced length was read.
    #[error("frame truncated: the stream ended early")]
    Truncated,
    /// The payload is not valid CBOR for the expected type (unknown field,
    /// unknown variant, wrong type, trailing bytes, invalid value).
    #[error("frame does not decode: {0}")]
    Decode(String),
    /// The value could not be encoded (never expected for our types).
    #[error("frame does not encode: {0}")]
    Encode(String),
    /// The socket failed (including read/write time-outs).
    #[error("socket error: {0}")]
    Io(#[from] io::Error),
}

/// Encodes `value` as CBOR and writes it as one frame.
///
/// # Errors
/// [`FrameError::Encode`] if the value does not encode or exceeds
/// [`MAX_FRAME_BYTES`], [`FrameError::Io`] if the write fails.
pub fn write_frame<W: Write, T: Serialize>(writer: &mut W, value: &T) -> Result<(), FrameError> {
    let mut payload = Vec::new();
    ciborium::into_writer(value, &mut payload).map_err(|e| FrameError::Encode(e.to_string()))?;
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|len| *len <= MAX_FRAME_BYTES)
        .ok_or_else(|| FrameError::Encode(format!("{} bytes is too large", payload.len())))?;
    let mut frame = Vec::with_capacity(payload.len() + 4);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&payload);
    writer.write_all(&frame)?;
    writer.flush()?;
    Ok(())
}

/// Reads one frame and returns its payload undecoded, so a server can
/// look at the version before decoding the request ([`decode`] then).
/// The length is checked before any payload byte is read, so an oversized
/// frame costs the reader nothing.
///
/// # Errors
/// [`FrameError::TooLarge`], [`FrameError::Truncated`] or [`FrameError::Io`].
pub fn read_payload<R: Read>(reader: &mut R) -> Result<Vec<u8>, FrameError> {
    let mut header = [0u8; 4];
    read_exact(reader, &mut header)?;
    let len = u32::from_be_bytes(header);
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge { len });
    }
    let mut payload = vec![0u8; usize::try_from(len).map_err(|_| FrameError::TooLarge { len })?];
    read_exact(reader, &mut payload)?;
    Ok(payload)
}

/// Decodes a payload as exactly one CBOR value of type `T`.
///
/// # Errors
/// [`FrameError::Decode`] for invalid CBOR, a value of another shape, or
/// trailing bytes.
pub fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, FrameError> {
    let mut slice = payload;
    let value = ciborium::from_reader(&mut slice).map_err(|e| FrameError::Decode(e.to_string()))?;
    if !slice.is_empty() {
        return Err(FrameError::Decode(format!(
            "{} trailing bytes after the value",
            slice.len()
        )));
    }
    Ok(value)
}

fn read_exact<R: Read>(reader: &mut R, buf: &mut [u8]) -> Result<(), FrameError> {
    reader.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => FrameError::Truncated,
        _ => FrameError::Io(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Request, RequestFrame};

    const PING: RequestFrame = RequestFrame {
        version: crate::OLDEST_VERSION,
        request: Request::Ping,
    };

    fn read(buf: &[u8]) -> Result<RequestFrame, FrameError> {
        decode(&read_payload(&mut &buf[..])?)
    }

    #[test]
    fn round_trips_a_request() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &PING).unwrap();
        assert_eq!(read(&buf).unwrap(), PING);
    }

    #[test]
    fn refuses_oversized_length_before_reading_payload() {
        let buf = (MAX_FRAME_BYTES + 1).to_be_bytes();
        let err = read(&buf).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { len } if len == MAX_FRAME_BYTES + 1));
    }

    #[test]
    fn refuses_truncated_frames() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &PING).unwrap();
        for cut in [0, 2, 4, buf.len() - 1] {
            let err = read(&buf[..cut]).unwrap_err();
            assert!(matches!(err, FrameError::Truncated), "cut at {cut}: {err}");
        }
    }

    #[test]
    fn refuses_trailing_bytes() {
        let mut payload = Vec::new();
        ciborium::into_writer(&PING, &mut payload).unwrap();
        payload.push(0);
        let mut buf = u32::try_from(payload.len()).unwrap().to_be_bytes().to_vec();
        buf.extend_from_slice(&payload);
        let err = read(&buf).unwrap_err();
        assert!(matches!(err, FrameError::Decode(_)), "{err}");
    }
}
