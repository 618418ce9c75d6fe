//! memcached's binary protocol, client side: framing of requests and encoding of responses.
//!
//! ```text
//!   24-byte header: magic 0x80 | opcode | key len (u16) | extras len | data type | vbucket (u16)
//!                   | body len (u32) | opaque (u32) | cas (u64)        (all big-endian)
//!   body: extras, key, value
//! ```
//!
//! Like the text parser this is check-then-advance: nothing is removed from the buffer until
//! a whole frame is there, `Incomplete` is a normal outcome, and the body length is checked
//! against the limits once the header, extras and key are in (at most 64 KiB more, as
//! memcached waits for them), so a hostile body length never makes us buffer the body.
use bytes::{BufMut, Bytes, BytesMut};

use crate::{Limits, MAX_KEY_LEN};

/// First byte of every binary request (and how a connection is recognised as binary).
pub const REQUEST_MAGIC: u8 = 0x80;
/// First byte of every binary response.
pub const RESPONSE_MAGIC: u8 = 0x81;
/// Size of the fixed header of requests and responses.
pub const HEADER_LEN: usize = 24;
/// Bytes a frame may carry beyond `Limits::max_value_len` (extras and key), as memcached
/// allows an item's key and header on top of its value.
pub const BODY_HEADROOM: usize = 64 * 1024;

/// Opcodes memcached answers (protocol_binary.h).
pub mod opcode {
    pub const GET: u8 = 0x00;
    pub const SET: u8 = 0x01;
    pub const ADD: u8 = 0x02;
    pub const REPLACE: u8 = 0x03;
    pub const DELETE: u8 = 0x04;
    pub const INCREMENT: u8 = 0x05;
    pub const DECREMENT: u8 = 0x06;
    pub const QUIT: u8 = 0x07;
    pub const FLUSH: u8 = 0x08;
    pub const GETQ: u8 = 0x09;
    pub const NOOP: u8 = 0x0a;
    pub const VERSION: u8 = 0x0b;
    pub const GETK: u8 = 0x0c;
    pub const GETKQ: u8 = 0x0d;
    pub const APPEND: u8 = 0x0e;
    pub const PREPEND: u8 = 0x0f;
    pub const STAT: u8 = 0x10;
    pub const SETQ: u8 = 0x11;
    pub const ADDQ: u8 = 0x12;
    pub const REPLACEQ: u8 = 0x13;
    pub const DELETEQ: u8 = 0x14;
    pub const INCREMENTQ: u8 = 0x15;
    pub const DECREMENTQ: u8 = 0x16;
    pub const QUITQ: u8 = 0x17;
    pub const FLUSHQ: u8 = 0x18;
    pub const APPENDQ: u8 = 0x19;
    pub const PREPENDQ: u8 = 0x1a;
    pub const VERBOSITY: u8 = 0x1b;
    pub const TOUCH: u8 = 0x1c;
    pub const GAT: u8 = 0x1d;
    pub const GATQ: u8 = 0x1e;
    pub const GATK: u8 = 0x23;
    pub const GATKQ: u8 = 0x24;
    pub const SASL_LIST_MECHS: u8 = 0x20;
    pub const SASL_AUTH: u8 = 0x21;
    pub const SASL_STEP: u8 = 0x22;
}

/// Response status codes (protocol_binary.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Status {
    Success = 0x00,
    KeyNotFound = 0x01,
    KeyExists = 0x02,
    TooLarge = 0x03,
    InvalidArguments = 0x04,
    NotStored = 0x05,
    DeltaBadValue = 0x06,
    /// Not logged in (SASL), or a login refused.
    AuthError = 0x20,
    UnknownCommand = 0x81,
    OutOfMemory = 0x82,
    /// No memcached reply: a backend failed (the body names it, as the text SERVER_ERROR does).
    Internal = 0x84,
}

impl Status {
    /// The text memcached puts in the body of an error response.
    pub fn message(self) -> &'static [u8] {
        match self {
            Status::Success => b"",
            Status::KeyNotFound => b"Not found",
            Status::KeyExists => b"Data exists for key.",
            Status::TooLarge => b"Too large.",
            Status::InvalidArguments => b"Invalid arguments",
            Status::NotStored => b"Not stored.",
            Status::DeltaBadValue => b"Non-numeric server-side value for incr or decr",
            Status::AuthError => b"Auth failure.",
            Status::UnknownCommand => b"Unknown command",
            Status::OutOfMemory => b"Out of memory",
            Status::Internal => b"Internal error",
        }
    }
}

/// One framed binary request; the parts are slices of the frame (no copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinaryRequest {
    pub opcode: u8,
    pub opaque: u32,
    pub cas: u64,
    pub extras: Bytes,
    pub key: Bytes,
    pub value: Bytes,
}

impl BinaryRequest {
    /// The big-endian u32 at `offset` of the extras (flags, expiry, delay), if present.
    pub fn extra_u32(&self, offset: usize) -> Option<u32> {
        let bytes = self.extras.get(offset..offset + 4)?;
        Some(u32::from_be_bytes(bytes.try_into().ok()?))
    }
    /// The big-endian u64 at `offset` of the extras (incr/decr delta and initial value).
    pub fn extra_u64(&self, offset: usize) -> Option<u64> {
        let bytes = self.extras.get(offset..offset + 8)?;
        Some(u64::from_be_bytes(bytes.try_into().ok()?))
    }
}

/// What a malformed frame gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryError {
    /// The first byte is not 0x80: memcached closes the connection without a reply.
    BadMagic,
    /// Key and extras longer than the body: the frame's parts cannot be told apart.
    /// memcached answers `Unknown command` and closes.
    LengthsExceedBody,
    /// A key longer than memcached's limit: memcached answers `Invalid arguments` and
    /// closes, whatever the opcode.
    KeyTooLong,
    /// The body is longer than any value we accept. A storage request's body is discarded
    /// as it arrives after a `Too large` answer, as memcached does; see the proxy's binary
    /// framing for the other opcodes.
    BodyTooLarge,
}

/// The outcome of framing one binary request at the front of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum BinaryParse {
    /// A whole frame, removed from the buffer.
    Request(BinaryRequest),
    /// More bytes are needed; nothing was removed.
    Incomplete,
    /// The stream cannot be framed any further. `opcode` and `opaque` are those of the bad
    /// header (for the error response); the buffer is left as it was.
    Invalid {
        error: BinaryError,
        opcode: u8,
        opaque: u32,
        /// The header's body length (what follows the 24-byte header).
        body_len: usize,
    },
}

/// Storage opcodes: the only ones whose body may legitimately be large.
pub fn is_storage(opcode: u8) -> bool {
    use opcode::*;
    matches!(
        opcode,
        SET | SETQ | ADD | ADDQ | REPLACE | REPLACEQ | APPEND | APPENDQ | PREPEND | PREPENDQ
    )
}

fn be_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be_u64(b: &[u8], at: usize) -> u64 {
    (u64::from(be_u32(b, at)) << 32) | u64::from(be_u32(b, at + 4))
}

/// The key of the request whose header starts `buf`, once its extras and key are buffered:
/// memcached reads them before it judges a frame, so a frame refused from its header (a
/// body too large) still has a known key.
pub fn buffered_key(buf: &[u8]) -> Option<&[u8]> {
    let header = buf.get(..HEADER_LEN)?;
    let key_len = usize::from(be_u16(header, 2));
    let extras_len = usize::from(header[4]);
    buf.get(HEADER_LEN + extras_len..HEADER_LEN + extras_len + key_len)
}

/// Frames one binary request from the front of `buf`.
pub fn parse_binary(buf: &mut BytesMut, limits: &Limits) -> BinaryParse {
    let Some(&magic) = buf.first() else {
        return BinaryParse::Incomplete;
    };
    if magic != REQUEST_MAGIC {
        return BinaryParse::Invalid {
            error: BinaryError::BadMagic,
            opcode: 0,
            opaque: 0,
            body_len: 0,
        };
    }
    if buf.len() < HEADER_LEN {
        return BinaryParse::Incomplete;
    }
    let opcode = buf[1];
    let key_len = usize::from(be_u16(buf, 2));
    let extras_len = usize::from(buf[4]);
    let body_len = be_u32(buf, 8) as usize;
    let opaque = be_u32(buf, 12);
    let cas = be_u64(buf, 16);
    let invalid = |error| BinaryParse::Invalid {
        error,
        opcode,
        opaque,
        body_len,
    };
    // memcached reads the extras and the key before it judges a frame, in this order.
    if buf.len() < HEADER_LEN + extras_len + key_len {
        return BinaryParse::Incomplete;
    }
    if key_len + extras_len > body_len {
        return invalid(BinaryError::LengthsExceedBody);
    }
    if key_len > MAX_KEY_LEN {
        return invalid(BinaryError::KeyTooLong);
    }
    if body_len > limits.max_value_len.saturating_add(BODY_HEADROOM) {
        return invalid(BinaryError::BodyTooLarge);
    }
    if buf.len() < HEADER_LEN + body_len {
        return BinaryParse::Incomplete;
    }
    let mut frame = buf.split_to(HEADER_LEN + body_len).freeze();
    let mut body = frame.split_off(HEADER_LEN);
    let extras = body.split_to(extras_len);
    let key = body.split_to(key_len);
    BinaryParse::Request(BinaryRequest {
        opcode,
        opaque,
        cas,
        extras,
        key,
        value: body,
    })
}

/// Appends one response frame to `out`.
#[allow(clippy::too_many_arguments)]
pub fn encode_response(
    out: &mut BytesMut,
    opcode: u8,
    status: Status,
    opaque: u32,
    cas: u64,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
) {
    let body = extras.len() + key.len() + value.len();
    out.reserve(HEADER_LEN + body);
    out.put_u8(RESPONSE_MAGIC);
    out.put_u8(opcode);
    // Keys are at most 250 bytes and extras 20: both fit their header fields.
    out.put_u16(key.len() as u16);
    out.put_u8(extras.len() as u8);
    out.put_u8(0);
    out.put_u16(status as u16);
    out.put_u32(body as u32);
    out.put_u32(opaque);
    out.put_u64(cas);
    out.put_slice(extras);
    out.put_slice(key);
    out.put_slice(value);
}

/// Appends an error response: status and memcached's message as the body.
pub fn encode_error(out: &mut BytesMut, opcode: u8, status: Status, opaque: u32) {
    encode_response(out, opcode, status, opaque, 0, &[], &[], status.message());
}
