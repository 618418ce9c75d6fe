//! memroute-protocol: the memcached text and meta protocols, sans-I/O.
//!
//! The binary protocol's client side (framing and response encoding) is in [`binary`].
//!
//! Two directions, both framing-only (no sockets, no tokio):
//!
//! ```text
//!   client bytes --parse_request--> Request { command, frame, keys, ... }
//!   backend bytes --parse_reply(kind)--> length of one complete reply
//! ```
//!
//! Parsers never consume input until a whole frame parses; `Incomplete` is a
//! normal outcome. Limits (key length, line length, value size) are enforced
//! while scanning so a hostile client cannot make us buffer unbounded input.
#![forbid(unsafe_code)]

pub mod auth;
mod base64;
pub mod binary;
mod error;
mod exptime;
pub mod meta;
mod reply;
mod request;
mod scan;

pub use base64::{decode_base64, encode_base64};
pub use error::{ErrorReply, ProtocolError};
pub use exptime::{cap_exptime, cap_multi_head, capped_exptime};
pub use reply::{
    framed_block_is_for, parse_reply, parse_reply_counting, parse_retrieval_blocks,
    quiet_suppresses, retrieval_error, value_block_at, value_block_for, value_blocks, ReplyKind,
    ReplyParse, ValueBlock, MAX_REPLY_VALUE_LEN,
};
pub use request::{
    parse_request, single_get_line, Command, KeyRanges, Limits, Parse, Request, RequestBytes,
    TooLarge, DEFAULT_MAX_LINE_LEN, DEFAULT_MAX_VALUE_LEN, MAX_KEY_LEN, MAX_RELATIVE_EXPTIME,
    MAX_SHORT_LINE,
};
