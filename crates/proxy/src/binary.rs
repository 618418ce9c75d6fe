//! A binary-protocol client session: frames binary requests, translates each into the meta
//! (or text) request the backends already speak, dispatches it through the same route tree
//! as a text request, and turns the reply back into a binary response.
//!
//! ```text
//!   0x80 frames -> parse_binary -> translate -> meta line -> parse_request -> dispatch
//!                                   | Shape (opcode, opaque, quiet, key)    | Pending
//!   binary response <- Shape::render <- text/meta reply <- Pending::finish  <-+
//! ```
//!
//! The session chooses this path when a connection's first byte is 0x80, as memcached does.
//! A run of getq/getkq frames already buffered becomes one text `gets k1 k2 ...` multi-get,
//! so it is grouped per server and batched exactly like a text multi-get.
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::rc::Rc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use memroute_protocol::binary::{
    encode_base64, encode_error, encode_response, is_storage, opcode as op, parse_binary,
    BinaryError, BinaryParse, BinaryRequest, Status, HEADER_LEN,
};
use memroute_protocol::{parse_request, Limits, Parse, MAX_KEY_LEN};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::buffers;
use crate::context::WorkerContext;
use crate::dispatch::{dispatch, Origin};
use crate::pending::{Flow, Pending};
use crate::snapshot::RouteSnapshot;

const READ_CHUNK: usize = 16 * 1024;

/// How to turn one pending entry's text reply into binary responses.
#[derive(Debug)]
enum Shape {
    /// Already binary (answered by memroute itself).
    Raw,
    /// get/getq/getk/getkq/gat/gatq/gatk/gatkq (an `mg ... v f c` reply).
    Get(Frame),
    /// touch (an `mg ... T` reply without value).
    Touch(Frame),
    /// set/add/replace/append/prepend and quiet forms (an `ms ... c` reply).
    Store(Frame),
    Delete(Frame),
    /// incr/decr (an `ma ... v c` reply).
    Arithmetic(Frame),
    Flush(Frame),
    /// `stat` without a key: the text `stats` reply, one response per line.
    Stats(Frame),
    /// A run of getq/getkq batched as one text `gets` (a `VALUE ...` reply).
    MultiGet(Vec<Frame>),
}

/// What a response needs of its request.
#[derive(Debug)]
struct Frame {
    opcode: u8,
    opaque: u32,
    /// The client's key, echoed by the k-variants.
    key: Bytes,
}

impl Frame {
    fn of(request: &BinaryRequest) -> Frame {
        Frame {
            opcode: request.opcode,
            opaque: request.opaque,
            key: request.key.clone(),
        }
    }
    fn quiet(&self) -> bool {
        matches!(
            self.opcode,
            op::GETQ
                | op::GETKQ
                | op::GATQ
                | op::GATKQ
                | op::SETQ
                | op::ADDQ
                | op::REPLACEQ
                | op::APPENDQ
                | op::PREPENDQ
                | op::DELETEQ
                | op::INCREMENTQ
                | op::DECREMENTQ
                | op::FLUSHQ
                | op::QUITQ
        )
    }
    fn echoes_key(&self) -> bool {
        matches!(self.opcode, op::GETK | op::GETKQ | op::GATK | op::GATKQ)
    }
    fn error(&self, out: &mut BytesMut, status: Status) {
        encode_error(out, self.opcode, status, self.opaque);
    }
}

pub(crate) async fn run<R, W>(
    context: Rc<WorkerContext>,
    origin: Origin,
    mut input: BytesMut,
    mut reader: R,
    mut writer: W,
    peer: crate::client_log::Peer,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    crate::client_log::count(
        &context,
        &peer,
        crate::client_log::ClientEvent::BinaryConnection,
    );
    let mut output = BytesMut::with_capacity(READ_CHUNK);
    let mut scratch = BytesMut::new();
    let mut pending: VecDeque<(Pending, Shape)> = VecDeque::new();
    // What `dispatch` appends for one translated request, reused (no allocation per request).
    let mut spare: VecDeque<Pending> = VecDeque::with_capacity(2);
    // Bytes of a refused value still to be discarded as they arrive.
    let mut swallow = 0usize;
    // Shutting down: stop reading, answer what was read, close.
    let mut reading = !context.sessions.draining();
    loop {
        let mut need_input = false;
        let routing = context.routing();
        let max_pending = routing.max_client_pending;
        while reading && pending.len() < max_pending {
            if swallow > 0 && buffers::skip_refused(&mut input, &mut swallow) {
                need_input = true;
                break;
            }
            match parse_binary(&mut input, &routing.limits) {
                BinaryParse::Request(request) => {
                    if translate(
                        &context,
                        &peer,
                        &routing,
                        origin,
                        request,
                        &mut input,
                        &mut pending,
                        &mut spare,
                    ) == Flow::Close
                    {
                        reading = false;
                    }
                }
                BinaryParse::Incomplete => {
                    need_input = true;
                    break;
                }
                BinaryParse::Invalid {
                    error,
                    opcode,
                    opaque,
                    body_len,
                } => {
                    crate::client_log::count(
                        &context,
                        &peer,
                        crate::client_log::ClientEvent::Error,
                    );
                    let mut reply = BytesMut::new();
                    if error == BinaryError::BodyTooLarge && is_storage(opcode) {
                        // memcached answers `Too large` and discards the value: so do we,
                        // as it arrives, without buffering it.
                        crate::client_log::count(
                            &context,
                            &peer,
                            crate::client_log::ClientEvent::OversizedValue,
                        );
                        crate::client_log::protocol_error(&peer, "binary", "value too large");
                        encode_error(&mut reply, opcode, Status::TooLarge, opaque);
                        ready(&mut pending, reply);
                        let now = input.len().min(HEADER_LEN + body_len);
                        input.advance(now);
                        swallow = HEADER_LEN + body_len - now;
                        continue;
                    }
                    crate::client_log::count(
                        &context,
                        &peer,
                        crate::client_log::ClientEvent::FramingClose,
                    );
                    match error {
                        // Not a binary frame: memcached closes without a word.
                        BinaryError::BadMagic => {}
                        BinaryError::BodyTooLarge => {
                            encode_error(&mut reply, opcode, Status::TooLarge, opaque)
                        }
                        BinaryError::LengthsExceedBody => {
                            encode_error(&mut reply, opcode, Status::InvalidArguments, opaque)
                        }
                    }
                    crate::client_log::framing_close(&peer, "binary", error_name(error));
                    input.clear();
                    ready(&mut pending, reply);
                    pending.push_back((Pending::Close, Shape::Raw));
                    reading = false;
                }
            }
        }
        drop(routing);

        let mut closing = false;
        while let Some((head, _)) = pending.front_mut() {
            if !head.try_complete() {
                break;
            }
            let Some((head, shape)) = pending.pop_front() else {
                break;
            };
            if head.finish(&context, &mut scratch) == Flow::Close {
                closing = true;
                break;
            }
            render(shape, &scratch, &mut output);
            scratch.clear();
        }
        if !output.is_empty() {
            // flush: a TLS stream holds encrypted records until asked (no-op for plain TCP).
            if writer.write_all(&output).await.is_err() || writer.flush().await.is_err() {
                return;
            }
            output.clear();
            if output.capacity() > 4 * READ_CHUNK {
                output = BytesMut::with_capacity(READ_CHUNK);
            }
        }
        if closing || (!reading && pending.is_empty()) {
            let _ = writer.shutdown().await;
            return;
        }
        if reading && !need_input && pending.len() < max_pending {
            continue;
        }
        let can_read = reading && need_input;
        if can_read && input.capacity() - input.len() < READ_CHUNK / 4 {
            input.reserve(READ_CHUNK);
        }
        tokio::select! {
            _ = wait_head(&mut pending), if !pending.is_empty() => {}
            read = reader.read_buf(&mut input), if can_read => match read {
                Ok(0) | Err(_) => reading = false,
                Ok(_) => {}
            },
            _ = crate::session_wakers::drained(&context.sessions), if reading => reading = false,
        }
    }
}

async fn wait_head(pending: &mut VecDeque<(Pending, Shape)>) {
    crate::pending::wait_head(pending, |(entry, _)| entry).await
}

fn error_name(error: BinaryError) -> &'static str {
    match error {
        BinaryError::BadMagic => "bad magic byte",
        BinaryError::BodyTooLarge => "body length beyond the value size limit",
        BinaryError::LengthsExceedBody => "key and extras longer than the body",
    }
}

fn ready(pending: &mut VecDeque<(Pending, Shape)>, bytes: BytesMut) {
    pending.push_back((Pending::Ready(bytes.freeze()), Shape::Raw));
}

/// An answer memroute gives itself.
fn local(
    pending: &mut VecDeque<(Pending, Shape)>,
    request: &BinaryRequest,
    status: Status,
    value: &[u8],
) {
    let mut out = BytesMut::new();
    if status == Status::Success {
        encode_response(
            &mut out,
            request.opcode,
            status,
            request.opaque,
            0,
            &[],
            &[],
            value,
        );
    } else {
        encode_error(&mut out, request.opcode, status, request.opaque);
    }
    ready(pending, out);
}

/// Whether the body's parts have the sizes memcached requires of this opcode.
fn well_formed(request: &BinaryRequest) -> bool {
    let (extras, key, value) = (request.extras.len(), request.key.len(), request.value.len());
    let keyed = key > 0 && key <= MAX_KEY_LEN;
    match request.opcode {
        op::GET | op::GETQ | op::GETK | op::GETKQ | op::DELETE | op::DELETEQ => {
            extras == 0 && keyed && value == 0
        }
        op::SET | op::SETQ | op::ADD | op::ADDQ | op::REPLACE | op::REPLACEQ => {
            extras == 8 && keyed
        }
        op::APPEND | op::APPENDQ | op::PREPEND | op::PREPENDQ => extras == 0 && keyed,
        op::INCREMENT | op::INCREMENTQ | op::DECREMENT | op::DECREMENTQ => {
            extras == 20 && keyed && value == 0
        }
        op::TOUCH | op::GAT | op::GATQ | op::GATK | op::GATKQ => extras == 4 && keyed && value == 0,
        op::FLUSH | op::FLUSHQ => (extras == 0 || extras == 4) && key == 0 && value == 0,
        op::NOOP | op::VERSION | op::QUIT | op::QUITQ => extras == 0 && key == 0 && value == 0,
        _ => true,
    }
}

/// The key as a meta command carries it: raw when it is a valid text key, else base64
/// (binary keys may hold spaces, newlines and control bytes); `end_line` adds the `b` flag.
fn put_key(line: &mut BytesMut, key: &[u8]) {
    if text_safe(key) {
        line.put_slice(key);
    } else {
        encode_base64(key, line);
    }
}

/// Ends a meta command line: the `b` flag when the key went base64, then `\r\n`.
fn end_line(line: &mut BytesMut, key: &[u8]) {
    if !text_safe(key) {
        line.put_slice(b" b");
    }
    line.put_slice(b"\r\n");
}

fn text_safe(key: &[u8]) -> bool {
    key.iter().all(|&b| b > b' ' && b != 0x7f)
}

/// Translates one binary request and appends its pending entries.
// The session's state, passed apart (a struct for it would only be built here).
#[allow(clippy::too_many_arguments)]
fn translate(
    context: &WorkerContext,
    peer: &crate::client_log::Peer,
    routing: &Rc<RouteSnapshot>,
    origin: Origin,
    request: BinaryRequest,
    input: &mut BytesMut,
    pending: &mut VecDeque<(Pending, Shape)>,
    spare: &mut VecDeque<Pending>,
) -> Flow {
    if !well_formed(&request) {
        crate::client_log::count(context, peer, crate::client_log::ClientEvent::Error);
        local(pending, &request, Status::InvalidArguments, &[]);
        if request.key.len() > MAX_KEY_LEN {
            // memcached closes a connection that sent a key over 250 bytes.
            crate::client_log::count(context, peer, crate::client_log::ClientEvent::FramingClose);
            crate::client_log::framing_close(peer, "binary", "key longer than 250 bytes");
            pending.push_back((Pending::Close, Shape::Raw));
            return Flow::Close;
        }
        crate::client_log::protocol_error(peer, "binary", "invalid arguments");
        return Flow::Continue;
    }
    if request.value.len() > routing.limits.max_value_len {
        crate::client_log::count(
            context,
            peer,
            crate::client_log::ClientEvent::OversizedValue,
        );
        crate::client_log::protocol_error(peer, "binary", "value too large");
        local(pending, &request, Status::TooLarge, &[]);
        return Flow::Continue;
    }
    let mut line = BytesMut::with_capacity(64 + request.key.len() * 2);
    let shape = match request.opcode {
        op::GETQ | op::GETKQ if text_safe(&request.key) => {
            return batch_quiet_gets(context, routing, origin, request, input, pending, spare);
        }
        op::GET | op::GETQ | op::GETK | op::GETKQ => {
            line.put_slice(b"mg ");
            put_key(&mut line, &request.key);
            line.put_slice(b" v f c");
            end_line(&mut line, &request.key);
            Shape::Get(Frame::of(&request))
        }
        op::GAT | op::GATQ | op::GATK | op::GATKQ | op::TOUCH => {
            line.put_slice(b"mg ");
            put_key(&mut line, &request.key);
            let ttl = request.extra_u32(0).unwrap_or(0) as i32;
            if request.opcode == op::TOUCH {
                {
                    let _ = write!(line, " f c T{ttl}");
                };
                end_line(&mut line, &request.key);
                Shape::Touch(Frame::of(&request))
            } else {
                {
                    let _ = write!(line, " v f c T{ttl}");
                };
                end_line(&mut line, &request.key);
                Shape::Get(Frame::of(&request))
            }
        }
        op::SET
        | op::SETQ
        | op::ADD
        | op::ADDQ
        | op::REPLACE
        | op::REPLACEQ
        | op::APPEND
        | op::APPENDQ
        | op::PREPEND
        | op::PREPENDQ => {
            let mode = match request.opcode {
                op::SET | op::SETQ => 'S',
                op::ADD | op::ADDQ => 'E',
                op::REPLACE | op::REPLACEQ => 'R',
                op::APPEND | op::APPENDQ => 'A',
                _ => 'P',
            };
            line.put_slice(b"ms ");
            put_key(&mut line, &request.key);
            {
                let _ = write!(line, " {} M{mode} c", request.value.len());
            };
            if let (Some(flags), Some(ttl)) = (request.extra_u32(0), request.extra_u32(4)) {
                {
                    let _ = write!(line, " F{flags} T{}", ttl as i32);
                };
            }
            if request.cas != 0 {
                {
                    let _ = write!(line, " C{}", request.cas);
                };
            }
            end_line(&mut line, &request.key);
            line.put_slice(&request.value);
            line.put_slice(b"\r\n");
            Shape::Store(Frame::of(&request))
        }
        op::DELETE | op::DELETEQ => {
            line.put_slice(b"md ");
            put_key(&mut line, &request.key);
            if request.cas != 0 {
                {
                    let _ = write!(line, " C{}", request.cas);
                };
            }
            end_line(&mut line, &request.key);
            Shape::Delete(Frame::of(&request))
        }
        op::INCREMENT | op::INCREMENTQ | op::DECREMENT | op::DECREMENTQ => {
            let mode = match request.opcode {
                op::INCREMENT | op::INCREMENTQ => 'I',
                _ => 'D',
            };
            let delta = request.extra_u64(0).unwrap_or(0);
            let initial = request.extra_u64(8).unwrap_or(0);
            let expiry = request.extra_u32(16).unwrap_or(u32::MAX);
            line.put_slice(b"ma ");
            put_key(&mut line, &request.key);
            {
                let _ = write!(line, " M{mode} D{delta} v c");
            };
            // 0xffffffff: fail on a missing key; anything else creates it with `initial`.
            if expiry != u32::MAX {
                {
                    let _ = write!(line, " N{} J{initial}", expiry as i32);
                };
            }
            if request.cas != 0 {
                {
                    let _ = write!(line, " C{}", request.cas);
                };
            }
            end_line(&mut line, &request.key);
            Shape::Arithmetic(Frame::of(&request))
        }
        op::FLUSH | op::FLUSHQ => {
            match request.extra_u32(0) {
                Some(delay) if delay != 0 => {
                    let _ = write!(line, "flush_all {delay}\r\n");
                }
                _ => line.put_slice(b"flush_all\r\n"),
            }
            Shape::Flush(Frame::of(&request))
        }
        op::NOOP | op::VERBOSITY => {
            local(pending, &request, Status::Success, &[]);
            return Flow::Continue;
        }
        op::VERSION => {
            local(
                pending,
                &request,
                Status::Success,
                crate::MEMCACHED_COMPAT_VERSION.as_bytes(),
            );
            return Flow::Continue;
        }
        op::STAT => {
            if request.key.is_empty() {
                pending.push_back((
                    crate::dispatch::all_stats(context),
                    Shape::Stats(Frame::of(&request)),
                ));
            } else {
                // memroute keeps no slabs or items: sub-statistics belong to the servers.
                local(pending, &request, Status::KeyNotFound, &[]);
            }
            return Flow::Continue;
        }
        op::QUIT | op::QUITQ => {
            if request.opcode == op::QUIT {
                local(pending, &request, Status::Success, &[]);
            }
            pending.push_back((Pending::Close, Shape::Raw));
            return Flow::Close;
        }
        // A memcached built without SASL (or started without -S) answers these so.
        op::SASL_LIST_MECHS | op::SASL_AUTH | op::SASL_STEP => {
            local(pending, &request, Status::UnknownCommand, &[]);
            return Flow::Continue;
        }
        _ => {
            // memcached closes the connection on an opcode it does not know.
            crate::client_log::count(context, peer, crate::client_log::ClientEvent::Error);
            crate::client_log::protocol_error(peer, "binary", "unknown opcode");
            pending.push_back((Pending::Close, Shape::Raw));
            return Flow::Close;
        }
    };
    send(context, routing, origin, line, shape, pending, spare)
}

/// Frames the translated line with the text parser and dispatches it like a client's.
fn send(
    context: &WorkerContext,
    routing: &Rc<RouteSnapshot>,
    origin: Origin,
    mut line: BytesMut,
    shape: Shape,
    pending: &mut VecDeque<(Pending, Shape)>,
    spare: &mut VecDeque<Pending>,
) -> Flow {
    // The translated key may still be refused (a base64 key longer than 250 bytes).
    let limits = Limits {
        max_value_len: usize::MAX,
        ..routing.limits
    };
    match parse_request(&mut line, &limits) {
        Parse::Request(text) => {
            let flow = dispatch(context, routing, origin, text, spare);
            let mut shape = Some(shape);
            for entry in spare.drain(..) {
                pending.push_back((entry, shape.take().unwrap_or(Shape::Raw)));
            }
            flow
        }
        _ => {
            let frame = match &shape {
                Shape::Get(f)
                | Shape::Touch(f)
                | Shape::Store(f)
                | Shape::Delete(f)
                | Shape::Arithmetic(f)
                | Shape::Flush(f)
                | Shape::Stats(f) => f,
                Shape::Raw | Shape::MultiGet(_) => return Flow::Continue,
            };
            let mut out = BytesMut::new();
            frame.error(&mut out, Status::InvalidArguments);
            ready(pending, out);
            Flow::Continue
        }
    }
}

/// A getq/getkq and the getq/getkq frames already buffered after it, as one text
/// `gets k1 k2 ...`: the multi-get path groups the keys per server, one request each.
fn batch_quiet_gets(
    context: &WorkerContext,
    routing: &Rc<RouteSnapshot>,
    origin: Origin,
    first: BinaryRequest,
    input: &mut BytesMut,
    pending: &mut VecDeque<(Pending, Shape)>,
    spare: &mut VecDeque<Pending>,
) -> Flow {
    let mut line = BytesMut::with_capacity(256);
    line.put_slice(b"gets ");
    line.put_slice(&first.key);
    let mut frames = vec![Frame::of(&first)];
    loop {
        // Only frames that are whole in the buffer join the batch; never wait for more.
        let next = peek_quiet_get(input);
        if !next || frames.len() >= routing.limits.max_line_len / 256 {
            break;
        }
        let BinaryParse::Request(request) = parse_binary(input, &routing.limits) else {
            break;
        };
        line.put_u8(b' ');
        line.put_slice(&request.key);
        frames.push(Frame::of(&request));
    }
    line.put_slice(b"\r\n");
    send(
        context,
        routing,
        origin,
        line,
        Shape::MultiGet(frames),
        pending,
        spare,
    )
}

/// True when the buffer starts with a whole, well-formed getq/getkq with a text-safe key.
fn peek_quiet_get(input: &[u8]) -> bool {
    if input.len() < 24 || input[0] != 0x80 || !matches!(input[1], op::GETQ | op::GETKQ) {
        return false;
    }
    let key_len = usize::from(u16::from_be_bytes([input[2], input[3]]));
    let extras = usize::from(input[4]);
    let body = u32::from_be_bytes([input[8], input[9], input[10], input[11]]) as usize;
    extras == 0
        && key_len > 0
        && key_len <= MAX_KEY_LEN
        && body == key_len
        && input.len() >= 24 + body
        && text_safe(&input[24..24 + body])
}

/// The numeric value of a meta flag such as `c123` in a reply line.
fn meta_flag(line: &[u8], flag: u8) -> Option<u64> {
    line.split(|&b| b == b' ')
        .skip(1)
        .find(|w| w.first() == Some(&flag))
        .and_then(|w| std::str::from_utf8(&w[1..]).ok()?.parse().ok())
}

fn split_line(reply: &[u8]) -> (&[u8], &[u8]) {
    match reply.iter().position(|&b| b == b'\n') {
        Some(nl) => {
            let line = &reply[..nl];
            (line.strip_suffix(b"\r").unwrap_or(line), &reply[nl + 1..])
        }
        None => (reply, &[]),
    }
}

/// A reply that is no answer of memcached's (a backend failure): an internal error whose
/// body says what happened, as the text protocol's SERVER_ERROR does.
fn failure(frame: &Frame, line: &[u8], out: &mut BytesMut) {
    let status = if line.starts_with(b"SERVER_ERROR object too large") {
        Status::TooLarge
    } else if line.starts_with(b"SERVER_ERROR out of memory") {
        Status::OutOfMemory
    } else if line.starts_with(b"CLIENT_ERROR cannot increment") {
        Status::DeltaBadValue
    } else if line.starts_with(b"CLIENT_ERROR") {
        Status::InvalidArguments
    } else {
        encode_response(
            out,
            frame.opcode,
            Status::Internal,
            frame.opaque,
            0,
            &[],
            &[],
            line,
        );
        return;
    };
    frame.error(out, status);
}

/// A found value, answered in the frame's own shape (getk/getkq echo the key).
fn hit(frame: &Frame, cas: u64, flags: u32, value: &[u8], out: &mut BytesMut) {
    let key = if frame.echoes_key() {
        &frame.key[..]
    } else {
        &[]
    };
    encode_response(
        out,
        frame.opcode,
        Status::Success,
        frame.opaque,
        cas,
        &flags.to_be_bytes(),
        key,
        value,
    );
}

fn render(shape: Shape, reply: &[u8], out: &mut BytesMut) {
    let (line, rest) = split_line(reply);
    // Meta status codes come with flags (`NS c0`): judge by the first word.
    let code = line.split(|&b| b == b' ').next().unwrap_or_default();
    match shape {
        Shape::Raw => out.extend_from_slice(reply),
        Shape::Get(frame) => {
            if line.starts_with(b"VA ") {
                let len = line[3..]
                    .split(|&b| b == b' ')
                    .next()
                    .and_then(|w| std::str::from_utf8(w).ok()?.parse::<usize>().ok())
                    .unwrap_or(0);
                let flags = meta_flag(line, b'f').unwrap_or(0) as u32;
                let cas = meta_flag(line, b'c').unwrap_or(0);
                hit(&frame, cas, flags, rest.get(..len).unwrap_or_default(), out);
            } else if code == b"EN" {
                if frame.quiet() {
                    return;
                }
                // A getk miss carries the key; a get miss memcached's "Not found".
                if frame.echoes_key() {
                    let key = &frame.key[..];
                    encode_response(
                        out,
                        frame.opcode,
                        Status::KeyNotFound,
                        frame.opaque,
                        0,
                        &[],
                        key,
                        &[],
                    );
                } else {
                    frame.error(out, Status::KeyNotFound);
                }
            } else {
                failure(&frame, line, out);
            }
        }
        Shape::Touch(frame) => {
            if line.starts_with(b"HD") {
                let flags = meta_flag(line, b'f').unwrap_or(0) as u32;
                encode_response(
                    out,
                    frame.opcode,
                    Status::Success,
                    frame.opaque,
                    meta_flag(line, b'c').unwrap_or(0),
                    &flags.to_be_bytes(),
                    &[],
                    &[],
                );
            } else if code == b"EN" {
                frame.error(out, Status::KeyNotFound);
            } else {
                failure(&frame, line, out);
            }
        }
        Shape::Store(frame) => {
            let status = if line.starts_with(b"HD") {
                if frame.quiet() {
                    return;
                }
                let cas = meta_flag(line, b'c').unwrap_or(0);
                encode_response(
                    out,
                    frame.opcode,
                    Status::Success,
                    frame.opaque,
                    cas,
                    &[],
                    &[],
                    &[],
                );
                return;
            } else if code == b"NS" {
                match frame.opcode {
                    op::ADD | op::ADDQ => Status::KeyExists,
                    op::REPLACE | op::REPLACEQ => Status::KeyNotFound,
                    _ => Status::NotStored,
                }
            } else if code == b"EX" {
                Status::KeyExists
            } else if code == b"NF" {
                Status::KeyNotFound
            } else {
                return failure(&frame, line, out);
            };
            frame.error(out, status);
        }
        Shape::Delete(frame) => {
            if line.starts_with(b"HD") {
                if !frame.quiet() {
                    encode_response(
                        out,
                        frame.opcode,
                        Status::Success,
                        frame.opaque,
                        0,
                        &[],
                        &[],
                        &[],
                    );
                }
            } else if code == b"NF" {
                frame.error(out, Status::KeyNotFound);
            } else if code == b"EX" {
                frame.error(out, Status::KeyExists);
            } else {
                failure(&frame, line, out);
            }
        }
        Shape::Arithmetic(frame) => {
            if line.starts_with(b"VA ") {
                if frame.quiet() {
                    return;
                }
                let (number, _) = split_line(rest);
                let value = std::str::from_utf8(number)
                    .ok()
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0);
                let cas = meta_flag(line, b'c').unwrap_or(0);
                encode_response(
                    out,
                    frame.opcode,
                    Status::Success,
                    frame.opaque,
                    cas,
                    &[],
                    &[],
                    &value.to_be_bytes(),
                );
            } else if code == b"NF" {
                frame.error(out, Status::KeyNotFound);
            } else if code == b"EX" {
                frame.error(out, Status::KeyExists);
            } else {
                failure(&frame, line, out);
            }
        }
        Shape::Flush(frame) => {
            if line == b"OK" {
                if !frame.quiet() {
                    encode_response(
                        out,
                        frame.opcode,
                        Status::Success,
                        frame.opaque,
                        0,
                        &[],
                        &[],
                        &[],
                    );
                }
            } else {
                failure(&frame, line, out);
            }
        }
        Shape::Stats(frame) => {
            let mut text = reply;
            while !text.is_empty() {
                let (line, rest) = split_line(text);
                text = rest;
                let Some(stat) = line.strip_prefix(b"STAT ") else {
                    continue;
                };
                let split = stat.iter().position(|&b| b == b' ').unwrap_or(stat.len());
                let value = stat.get(split + 1..).unwrap_or_default();
                encode_response(
                    out,
                    frame.opcode,
                    Status::Success,
                    frame.opaque,
                    0,
                    &[],
                    &stat[..split],
                    value,
                );
            }
            // An empty key ends the list.
            encode_response(
                out,
                frame.opcode,
                Status::Success,
                frame.opaque,
                0,
                &[],
                &[],
                &[],
            );
        }
        Shape::MultiGet(frames) => render_multi_get(&frames, reply, out),
    }
}

/// The text multi-get reply (`VALUE key flags bytes cas` blocks in the client's key order,
/// misses left out, then `END`) as getq/getkq responses: hits only, as memcached sends them.
fn render_multi_get(frames: &[Frame], reply: &[u8], out: &mut BytesMut) {
    let mut text = reply;
    let (first, _) = split_line(text);
    if !first.starts_with(b"VALUE ") && first != b"END" {
        // The whole multi-get failed (a server down): each key gets the error.
        for frame in frames {
            failure(frame, first, out);
        }
        return;
    }
    for frame in frames {
        let (line, rest) = split_line(text);
        let Some(header) = line.strip_prefix(b"VALUE ") else {
            continue;
        };
        let mut words = header.split(|&b| b == b' ');
        let key = words.next().unwrap_or_default();
        if key != &frame.key[..] {
            continue;
        }
        let number = |w: Option<&[u8]>| -> u64 {
            w.and_then(|w| std::str::from_utf8(w).ok()?.parse().ok())
                .unwrap_or(0)
        };
        let flags = number(words.next()) as u32;
        let len = number(words.next()) as usize;
        let cas = number(words.next());
        hit(frame, cas, flags, rest.get(..len).unwrap_or_default(), out);
        text = rest.get((len + 2).min(rest.len())..).unwrap_or_default();
    }
}
