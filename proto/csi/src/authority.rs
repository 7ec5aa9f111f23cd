//! Accepting the `:authority` every gRPC client sends on a unix socket.
//!
//! On a unix socket the `:authority` pseudo-header names nothing, and
//! clients disagree on it: grpc-go sends `localhost`; grpc-go before 1.34
//! with a custom dialer (kubelet before 1.26 registering a plugin) and
//! grpc-java send the bare socket path; grpc C-core (Python, C++, Ruby) sends
//! the percent-encoded path without its leading slash. h2, tonic's HTTP/2, resets every stream whose
//! `:authority` is not an RFC 3986 authority with PROTOCOL_ERROR and has no
//! option to accept one (hyperium/h2#487, still open).
//!
//! [`AuthorityFilter`] therefore sits between the socket and h2 on the
//! client-to-server bytes and rewrites such an `:authority` to `localhost`.
//! It follows the HTTP/2 framing (RFC 9113 §4.1): the connection preface
//! and every frame pass unchanged, except header blocks (HEADERS and its
//! CONTINUATION frames, §6.2 and §6.10). Those are decoded with the
//! client's HPACK context (RFC 7541) and encoded again without the dynamic
//! table, so h2's decoder never refers to an entry it was not sent.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::{Buf, BufMut, BytesMut};
use loona_hpack::{Decoder, Encoder};

/// Whether this process has logged a rewritten authority: once is enough
/// (kubelet opens a connection per call, so a warning per connection came
/// about ten times a minute); [`rewritten_total`] counts the rest.
static WARNED: AtomicBool = AtomicBool::new(false);
/// Header blocks whose `:authority` was rewritten, since the process began.
static REWRITTEN: AtomicU64 = AtomicU64::new(0);

/// How many header blocks had their `:authority` rewritten since the
/// process began (both services' `/metrics` report it).
pub fn rewritten_total() -> u64 {
    REWRITTEN.load(Ordering::Relaxed)
}

/// The authority a malformed `:authority` becomes (what grpc-go sends on a
/// unix socket).
const LOCALHOST: &[u8] = b"localhost";
/// The frame header's length in bytes (RFC 9113 §4.1).
const FRAME_HEADER_LEN: usize = 9;
/// The client connection preface's length in bytes (RFC 9113 §3.4).
const PREFACE_LEN: usize = 24;
/// HEADERS and CONTINUATION frame types (RFC 9113 §6.2, §6.10).
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
/// Frame flags (RFC 9113 §6.2).
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The stream dependency and weight a PRIORITY flag adds, in bytes.
const PRIORITY_LEN: usize = 5;
/// The largest frame h2 accepts: SETTINGS_MAX_FRAME_SIZE's initial value,
/// which tonic does not raise (RFC 9113 §6.5.2). Frames re-encoded here are
/// split to fit it.
const MAX_FRAME_LEN: usize = 16_384;
/// The largest header block collected, in bytes: far above any CSI request,
/// small enough that a client cannot make the filter hold much memory.
const MAX_BLOCK_LEN: usize = 1 << 20;
/// The HPACK dynamic table size the client may use: the initial
/// SETTINGS_HEADER_TABLE_SIZE, which is what h2 advertises (RFC 9113 §6.5.2).
const CLIENT_TABLE_SIZE: usize = 4096;

/// Why a client's bytes cannot be followed. The connection is closed, as h2
/// would close it with a connection error.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FilterError {
    /// A HEADERS or CONTINUATION frame longer than the maximum frame size.
    #[error("a header frame of {0} bytes is longer than {MAX_FRAME_LEN}")]
    FrameTooLong(usize),
    /// A header block longer than [`MAX_BLOCK_LEN`].
    #[error("a header block is longer than {MAX_BLOCK_LEN} bytes")]
    BlockTooLong,
    /// A frame other than CONTINUATION on the same stream inside a header
    /// block, or a CONTINUATION outside one (RFC 9113 §6.10).
    #[error("a header block on stream {0} is not continued by CONTINUATION frames on that stream")]
    Interrupted(u32),
    /// A HEADERS frame whose padding or priority fields overrun it.
    #[error("a HEADERS frame on stream {0} is shorter than its padding and priority fields")]
    Malformed(u32),
    /// The header block does not decode (RFC 7541).
    #[error("a header block on stream {stream} does not decode: {error}")]
    Hpack {
        /// The stream.
        stream: u32,
        /// The decoder's error.
        error: loona_hpack::decoder::DecoderError,
    },
}

/// A header block being collected from HEADERS and CONTINUATION frames.
struct HeaderBlock {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; PRIORITY_LEN]>,
    fragment: Vec<u8>,
}

/// Rewrites a malformed `:authority` in the bytes a client sends; one per
/// connection (it holds the client's HPACK context).
pub struct AuthorityFilter {
    peer: String,
    pass_through: usize,
    pending: BytesMut,
    block: Option<HeaderBlock>,
    decoder: Decoder<'static>,
    encoder: Encoder<'static>,
}

impl AuthorityFilter {
    /// A filter for a new connection from `peer` (named in the log line
    /// that reports a rewritten authority).
    pub fn new(peer: String) -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(CLIENT_TABLE_SIZE);
        let mut encoder = Encoder::new();
        // Literals only: h2's table may hold what it likes, it is never read.
        encoder.set_max_table_size(0);
        Self {
            peer,
            pass_through: PREFACE_LEN,
            pending: BytesMut::new(),
            block: None,
            decoder,
            encoder,
        }
    }

    /// The peer this filter's connection is from.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Takes the next bytes the client sent and appends to `out` those h2
    /// may read now: everything up to the last complete frame (a header
    /// block once it is complete), other frames' payloads as they arrive.
    ///
    /// # Errors
    /// [`FilterError`] when the bytes are not HTTP/2 a server could accept.
    pub fn push(&mut self, input: &[u8], out: &mut BytesMut) -> Result<(), FilterError> {
        self.pending.extend_from_slice(input);
        loop {
            if self.pass_through > 0 {
                let n = self.pass_through.min(self.pending.len());
                out.extend_from_slice(&self.pending.split_to(n));
                self.pass_through -= n;
                if self.pass_through > 0 {
                    return Ok(());
                }
            }
            let Some(header) = self.pending.get(..FRAME_HEADER_LEN) else {
                return Ok(());
            };
            let len = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
            let (kind, flags) = (header[3], header[4]);
            let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
            if kind != HEADERS && kind != CONTINUATION {
                if let Some(block) = &self.block {
                    return Err(FilterError::Interrupted(block.stream));
                }
                out.extend_from_slice(&self.pending.split_to(FRAME_HEADER_LEN));
                self.pass_through = len;
                continue;
            }
            if len > MAX_FRAME_LEN {
                return Err(FilterError::FrameTooLong(len));
            }
            if self.pending.len() < FRAME_HEADER_LEN + len {
                return Ok(());
            }
            self.pending.advance(FRAME_HEADER_LEN);
            let payload = self.pending.split_to(len);
            if kind == HEADERS {
                self.start_block(stream, flags, &payload)?;
            } else {
                self.continue_block(stream, &payload)?;
            }
            if flags & END_HEADERS != 0 {
                self.finish_block(out)?;
            }
        }
    }

    fn start_block(&mut self, stream: u32, flags: u8, payload: &[u8]) -> Result<(), FilterError> {
        if let Some(block) = &self.block {
            return Err(FilterError::Interrupted(block.stream));
        }
        let malformed = || FilterError::Malformed(stream);
        let mut body = payload;
        if flags & PADDED != 0 {
            let (&pad, rest) = body.split_first().ok_or_else(malformed)?;
            body = rest
                .get(..rest.len().checked_sub(usize::from(pad)).ok_or_else(malformed)?)
                .ok_or_else(malformed)?;
        }
        let mut priority = None;
        if flags & PRIORITY != 0 {
            let (fields, rest) = body.split_first_chunk::<PRIORITY_LEN>().ok_or_else(malformed)?;
            priority = Some(*fields);
            body = rest;
        }
        self.block = Some(HeaderBlock {
            stream,
            end_stream: flags & END_STREAM != 0,
            priority,
            fragment: body.to_vec(),
        });
        Ok(())
    }

    fn continue_block(&mut self, stream: u32, payload: &[u8]) -> Result<(), FilterError> {
        match &mut self.block {
            Some(block) if block.stream == stream => {
                if block.fragment.len() + payload.len() > MAX_BLOCK_LEN {
                    return Err(FilterError::BlockTooLong);
                }
                block.fragment.extend_from_slice(payload);
                Ok(())
            }
            Some(block) => Err(FilterError::Interrupted(block.stream)),
            None => Err(FilterError::Interrupted(stream)),
        }
    }

    /// Decodes the collected block, rewrites a malformed `:authority` and
    /// appends the block, encoded again, as HEADERS and CONTINUATION frames.
    fn finish_block(&mut self, out: &mut BytesMut) -> Result<(), FilterError> {
        let Some(block) = self.block.take() else {
            return Ok(());
        };
        let mut fields = self
            .decoder
            .decode(&block.fragment)
            .map_err(|error| FilterError::Hpack {
                stream: block.stream,
                error,
            })?;
        for (name, value) in &mut fields {
            if name.as_slice() == b":authority" && http::uri::Authority::try_from(value.as_slice()).is_err() {
                REWRITTEN.fetch_add(1, Ordering::Relaxed);
                if !WARNED.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        peer = %self.peer,
                        authority = %String::from_utf8_lossy(value),
                        "the client's :authority is not an RFC 3986 authority (a socket path); serving it as localhost \
                         (said once; ebs_csi_grpc_authority_rewritten_total counts them)",
                    );
                }
                *value = LOCALHOST.to_vec();
            }
        }
        let encoded = self
            .encoder
            .encode(fields.iter().map(|(name, value)| (name.as_slice(), value.as_slice())));
        write_block(out, &block, &encoded);
        Ok(())
    }
}

/// Appends `encoded` as one HEADERS frame with `block`'s stream, END_STREAM
/// and priority, and as many CONTINUATION frames as [`MAX_FRAME_LEN`] needs.
fn write_block(out: &mut BytesMut, block: &HeaderBlock, encoded: &[u8]) {
    let priority_len = if block.priority.is_some() { PRIORITY_LEN } else { 0 };
    let first_len = encoded.len().min(MAX_FRAME_LEN - priority_len);
    let (first, mut rest) = encoded.split_at(first_len);
    let mut flags = if block.end_stream { END_STREAM } else { 0 };
    if block.priority.is_some() {
        flags |= PRIORITY;
    }
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    put_frame_header(out, priority_len + first.len(), HEADERS, flags, block.stream);
    if let Some(priority) = &block.priority {
        out.extend_from_slice(priority);
    }
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(MAX_FRAME_LEN));
        rest = tail;
        let flags = if rest.is_empty() { END_HEADERS } else { 0 };
        put_frame_header(out, chunk.len(), CONTINUATION, flags, block.stream);
        out.extend_from_slice(chunk);
    }
}

/// Appends a frame header (RFC 9113 §4.1); `len` is at most [`MAX_FRAME_LEN`].
fn put_frame_header(out: &mut BytesMut, len: usize, kind: u8, flags: u8, stream: u32) {
    let len = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
    out.extend_from_slice(&len[1..]);
    out.put_u8(kind);
    out.put_u8(flags);
    out.put_u32(stream);
}

#[cfg(test)]
#[path = "authority_tests.rs"]
mod tests;
