//! The binary protocol's framing: each binary request becomes the meta (or text) request
//! the backends already speak and is dispatched through the same route tree as a text
//! request; its reply is rendered back as binary responses.
//!
//! ```text
//!   0x80 frames -> parse_binary -> translate -> meta line -> parse_request -> dispatch
//!                                   | Shape (opcode, opaque, quiet, key)      | session's
//!                                   v one per pending entry, in its order     v pending FIFO
//!   binary responses <- render <- text/meta reply <------------------- Pending::finish
//! ```
//!
//! The session loop (session.rs) is the one every protocol shares: reading, the pipelining
//! cap, the reply budget, buffers and shutdown are its, not this module's. It picks this
//! framing when a connection's first byte is 0x80, as memcached does. A run of getq/getkq
//! frames already buffered becomes one text `gets k1 k2 ...` multi-get, so it is grouped per
//! server and batched exactly like a text multi-get.
//!
//! Translated lines are written into a pooled buffer and split off as the request's frame,
//! as a text request is split off the input, and answers memroute gives itself are encoded
//! only when written: a single-key request allocates nothing here.
use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt::Write as _;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use memroute_protocol::auth::{sasl_plain, SASL_AUTHENTICATED, SASL_MECHANISMS};
use memroute_protocol::binary::{
    buffered_key, encode_error, encode_response, is_storage, opcode as op, parse_binary,
    BinaryError, BinaryParse, BinaryRequest, Status, HEADER_LEN, REQUEST_MAGIC,
};
use memroute_protocol::meta::{decimal, is_text_key, split_line, MetaReply, MetaRequest};
use memroute_protocol::{parse_request, Limits, Parse, MAX_KEY_LEN};
use memroute_routing::Operation;

use crate::buffers::{self, QueuePool};
use crate::client_log::{self, ClientEvent};
use crate::context::WorkerContext;
use crate::framing::{dispatch_framed, Framed, Inbound};
use crate::pending::{Flow, Pending};

/// Room for a translated line beyond its key and value (command, flags, numbers).
const LINE_OVERHEAD: usize = 96;

/// Frame lists kept per worker once their batch is written; more are freed.
const FRAME_LIST_POOL_LIMIT: usize = 64;
/// A list that grew past this many frames is freed rather than kept.
const FRAME_LIST_KEEP_AT_MOST: usize = 256;

thread_local! {
    /// Storage of shape queues of this worker's idle binary sessions.
    static SHAPES: QueuePool<Shape> = const { QueuePool::new() };
    /// Storage of the frame lists of batched quiet gets, reused batch after batch.
    static FRAME_LISTS: RefCell<Vec<Vec<Frame>>> = const { RefCell::new(Vec::new()) };
}

/// The frames of a batch of quiet gets, in a list from the worker's pool (no heap
/// allocation per batch once the pool has warmed up).
#[derive(Debug)]
struct FrameList(Vec<Frame>);

impl FrameList {
    fn take(capacity: usize) -> FrameList {
        let mut list = FRAME_LISTS
            .with(|lists| lists.borrow_mut().pop())
            .unwrap_or_default();
        list.reserve(capacity);
        FrameList(list)
    }

    fn push(&mut self, frame: Frame) {
        self.0.push(frame);
    }
}

impl Drop for FrameList {
    fn drop(&mut self) {
        let mut list = std::mem::take(&mut self.0);
        list.clear();
        if list.capacity() == 0 || list.capacity() > FRAME_LIST_KEEP_AT_MOST {
            return;
        }
        FRAME_LISTS.with(|lists| {
            let mut lists = lists.borrow_mut();
            if lists.len() < FRAME_LIST_POOL_LIMIT {
                lists.push(list);
            }
        });
    }
}

/// A binary session's framing state: empty (no buffer, no queue storage) while the session
/// is idle; see [`Translator::rest`].
#[derive(Debug, Default)]
pub(crate) struct Translator {
    /// How to write each pending entry's reply: one shape per entry of the session's
    /// pending queue, in the same order.
    shapes: VecDeque<Shape>,
    /// Scratch space, empty between uses: a translated request line (split off as its
    /// request's frame at once), or a reply in text form before it is rendered as binary.
    scratch: BytesMut,
}

/// How to write one pending entry's reply.
#[derive(Debug)]
enum Shape {
    /// As it is: an entry dispatch added beside the request's own, or the close.
    AsIs,
    /// An answer memroute gives itself: the status alone (and its message).
    Local(Frame, Status),
    /// memroute's own `version` answer.
    Version(Frame),
    /// A success memroute gives itself, with this body (SASL's mechanisms, and its
    /// "Authenticated").
    Body(Frame, &'static [u8]),
    /// A backend reply, to render as binary.
    Translated(Translated),
}

/// What a translated request's text reply is rendered as.
#[derive(Debug)]
enum Translated {
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
    MultiGet(FrameList),
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

    /// A response to this request.
    fn respond(
        &self,
        out: &mut BytesMut,
        status: Status,
        cas: u64,
        extras: &[u8],
        key: &[u8],
        value: &[u8],
    ) {
        encode_response(
            out,
            self.opcode,
            status,
            self.opaque,
            cas,
            extras,
            key,
            value,
        );
    }

    /// A success that carries nothing but its CAS.
    fn ok(&self, out: &mut BytesMut, cas: u64) {
        self.respond(out, Status::Success, cas, &[], &[], &[]);
    }

    /// The status alone, with memcached's message for it as the body.
    fn status(&self, out: &mut BytesMut, status: Status) {
        encode_error(out, self.opcode, status, self.opaque);
    }

    /// A found value, answered in the frame's own shape (getk/getkq echo the key).
    fn hit(&self, out: &mut BytesMut, cas: u64, flags: u32, value: &[u8]) {
        let key = if self.echoes_key() {
            &self.key[..]
        } else {
            &[]
        };
        self.respond(out, Status::Success, cas, &flags.to_be_bytes(), key, value);
    }
}

impl Translator {
    /// Frames and dispatches the next binary request in `input` (a run of quiet gets
    /// already buffered goes as one). A malformed frame is answered in its place, or
    /// closes the connection when the stream can no longer be framed.
    pub(crate) fn frame(
        &mut self,
        at: &Inbound<'_>,
        input: &mut BytesMut,
        swallow: &mut usize,
        pending: &mut VecDeque<Pending>,
    ) -> Framed {
        if self.shapes.capacity() == 0 {
            SHAPES.with(|shapes| shapes.fill(&mut self.shapes));
        }
        match parse_binary(input, &at.routing.limits) {
            BinaryParse::Request(request) => self.translate(at, request, input, pending),
            BinaryParse::Incomplete => Framed::Incomplete,
            BinaryParse::Invalid {
                error,
                opcode,
                opaque,
                body_len,
            } => {
                let frame = Frame {
                    opcode,
                    opaque,
                    key: Bytes::new(),
                };
                self.unframeable(at, error, frame, body_len, input, swallow, pending)
            }
        }
    }

    /// Writes the reply of `head` (the oldest pending entry, complete) as binary responses.
    pub(crate) fn finish(
        &mut self,
        head: Pending,
        context: &WorkerContext,
        out: &mut BytesMut,
    ) -> Flow {
        match self.shapes.pop_front().unwrap_or(Shape::AsIs) {
            Shape::AsIs => head.finish(context, out),
            Shape::Local(frame, status) => {
                frame.status(out, status);
                Flow::Continue
            }
            Shape::Version(frame) => {
                let version = crate::version::MEMCACHED_COMPAT_VERSION.as_bytes();
                frame.respond(out, Status::Success, 0, &[], &[], version);
                Flow::Continue
            }
            Shape::Body(frame, body) => {
                frame.respond(out, Status::Success, 0, &[], &[], body);
                Flow::Continue
            }
            Shape::Translated(Translated::Get(frame)) => {
                self.take_scratch();
                let flow = self.finish_get(&frame, head, context, out);
                self.scratch.clear();
                flow
            }
            Shape::Translated(shape) => {
                self.take_scratch();
                let flow = head.finish(context, &mut self.scratch);
                render(shape, &self.scratch, out);
                self.scratch.clear();
                if self.scratch.capacity() > buffers::CHUNK {
                    // A large value went through: the worker's pool keeps (or frees) the
                    // buffer, rather than every session that saw one holding its own.
                    buffers::give(std::mem::take(&mut self.scratch));
                }
                flow
            }
        }
    }

    fn take_scratch(&mut self) {
        if self.scratch.capacity() == 0 {
            self.scratch = buffers::take();
        }
    }

    /// A get's reply, rendered where it lands in `out`: the meta reply is written there,
    /// then its value moves (within `out`) to follow the binary header, which replaces the
    /// `VA` line. A large value is copied into `out` once and moved once, with no buffer in
    /// between: rendering it through `scratch` copied it twice and grew, and freed, a
    /// value-sized buffer per reply.
    fn finish_get(
        &mut self,
        frame: &Frame,
        head: Pending,
        context: &WorkerContext,
        out: &mut BytesMut,
    ) -> Flow {
        let start = out.len();
        let flow = head.finish(context, out);
        let reply = MetaReply::of(&out[start..]);
        if !reply.is(b"VA") {
            // A miss or an error: a few bytes, rendered from a copy.
            self.scratch.extend_from_slice(&out[start..]);
            out.truncate(start);
            render_get(frame, &MetaReply::of(&self.scratch), out);
            return flow;
        }
        let meta = reply.numbers();
        let value_at = out.len() - reply.rest.len();
        // A reply shorter than its size line says reads as an empty value.
        let size = if meta.size <= reply.rest.len() {
            meta.size
        } else {
            0
        };
        // The header, flags and key of the response, its body length counting the value.
        frame.hit(&mut self.scratch, meta.cas, meta.flags, &[]);
        let body = self.scratch.len() - HEADER_LEN + size;
        // The header's body length field: bytes 8..12, big-endian.
        self.scratch[8..12].copy_from_slice(&(body as u32).to_be_bytes());
        let prefix = self.scratch.len();
        let end = start + prefix + size;
        if out.len() < end {
            out.resize(end, 0);
        }
        out.copy_within(value_at..value_at + size, start + prefix);
        out[start..start + prefix].copy_from_slice(&self.scratch);
        out.truncate(end);
        flow
    }

    /// Gives buffers and queue storage back to the worker's pools: called once nothing is
    /// pending, so an idle binary session holds none.
    pub(crate) fn rest(&mut self) {
        SHAPES.with(|shapes| shapes.give(&mut self.shapes));
        if self.scratch.capacity() > 0 {
            buffers::give(std::mem::take(&mut self.scratch));
        }
    }

    fn push(&mut self, pending: &mut VecDeque<Pending>, entry: Pending, shape: Shape) {
        pending.push_back(entry);
        self.shapes.push_back(shape);
    }

    /// Queues an answer memroute gives itself (encoded when it is written).
    fn answer(&mut self, pending: &mut VecDeque<Pending>, frame: Frame, status: Status) {
        self.push(
            pending,
            Pending::Ready(Bytes::new()),
            Shape::Local(frame, status),
        );
    }

    fn close(&mut self, pending: &mut VecDeque<Pending>) -> Framed {
        self.push(pending, Pending::Close, Shape::AsIs);
        Framed::Close
    }

    /// A frame `parse_binary` refused, answered as memcached answers it: a storage value too
    /// large (`Too large`) and the body of an opcode memcached does not know (`Unknown
    /// command`) are skipped as they arrive and the connection goes on; anything else closes
    /// it.
    // The framing call's own arguments plus what the parser said, passed apart.
    #[allow(clippy::too_many_arguments)]
    fn unframeable(
        &mut self,
        at: &Inbound<'_>,
        error: BinaryError,
        frame: Frame,
        body_len: usize,
        input: &mut BytesMut,
        swallow: &mut usize,
        pending: &mut VecDeque<Pending>,
    ) -> Framed {
        let peer = (at.peer)();
        client_log::count(at.context, &peer, ClientEvent::Error);
        if error == BinaryError::BodyTooLarge {
            // memcached discards a value too large, or the body of an opcode it does not
            // know, after its answer: so do we, as it arrives, without buffering it.
            let status = if is_storage(frame.opcode) {
                client_log::count(at.context, &peer, ClientEvent::OversizedValue);
                client_log::protocol_error(&peer, "binary", "value too large");
                Some(Status::TooLarge)
            } else if unknown_to_memcached(frame.opcode) {
                client_log::protocol_error(&peer, "binary", "unknown opcode");
                Some(Status::UnknownCommand)
            } else {
                None
            };
            if let Some(status) = status {
                let key = buffered_key(input).unwrap_or_default();
                self.unlink(at, frame.opcode, key, pending);
                self.answer(pending, frame, status);
                let now = input.len().min(HEADER_LEN + body_len);
                input.advance(now);
                *swallow = HEADER_LEN + body_len - now;
                return Framed::Next;
            }
        }
        client_log::count(at.context, &peer, ClientEvent::FramingClose);
        match error {
            // Not a binary frame: memcached closes without a word.
            BinaryError::BadMagic => {}
            BinaryError::LengthsExceedBody => self.answer(pending, frame, Status::UnknownCommand),
            // A known opcode whose body cannot be its own: memcached's protocol error.
            BinaryError::KeyTooLong | BinaryError::BodyTooLarge => {
                self.answer(pending, frame, Status::InvalidArguments)
            }
        }
        client_log::framing_close(&peer, "binary", error_name(error));
        input.clear();
        self.close(pending)
    }

    /// Translates one binary request and queues its pending entries.
    fn translate(
        &mut self,
        at: &Inbound<'_>,
        request: BinaryRequest,
        input: &mut BytesMut,
        pending: &mut VecDeque<Pending>,
    ) -> Framed {
        if at.login.wants_login() {
            if let Some(answered) = self.login(at, &request, pending) {
                return answered;
            }
        }
        if let Some(refused) = self.refuse(at, &request, pending) {
            return refused;
        }
        if matches!(request.opcode, op::GETQ | op::GETKQ)
            && is_text_key(&request.key)
            && !refused_by_prefix(at, &request.key)
        {
            return self.batch_quiet_gets(at, request, input, pending);
        }
        let line = self.line_buffer(request.key.len() * 2 + request.value.len());
        let Some(shape) = write_request(line, &request) else {
            return self.answer_locally(at, request, pending);
        };
        self.send(at, shape, pending)
    }

    /// On a listener that wants a login, as memcached started with `-S` answers: SASL's
    /// PLAIN login (the only mechanism offered), and `Auth failure.` for anything but
    /// VERSION before a login, after which the connection closes. `None` for a request to
    /// go on as usual.
    fn login(
        &mut self,
        at: &Inbound<'_>,
        request: &BinaryRequest,
        pending: &mut VecDeque<Pending>,
    ) -> Option<Framed> {
        let frame = Frame::of(request);
        match request.opcode {
            op::SASL_LIST_MECHS => {
                self.push(
                    pending,
                    Pending::Ready(Bytes::new()),
                    Shape::Body(frame, SASL_MECHANISMS),
                );
            }
            op::SASL_AUTH => {
                let accepted = match (&request.key[..], sasl_plain(&request.value)) {
                    (b"PLAIN", Some((user, password))) => {
                        at.login.attempt(at.context, at.peer, user, password)
                    }
                    _ => {
                        let peer = (at.peer)();
                        client_log::count(at.context, &peer, ClientEvent::AuthCommand);
                        client_log::count(at.context, &peer, ClientEvent::AuthError);
                        false
                    }
                };
                match accepted {
                    true => self.push(
                        pending,
                        Pending::Ready(Bytes::new()),
                        Shape::Body(frame, SASL_AUTHENTICATED),
                    ),
                    false => self.answer(pending, frame, Status::AuthError),
                }
            }
            // PLAIN takes one step: a step memcached's SASL never started fails.
            op::SASL_STEP => self.answer(pending, frame, Status::AuthError),
            _ if at.login.open() || request.opcode == op::VERSION => return None,
            _ => {
                self.answer(pending, frame, Status::AuthError);
                return Some(self.close(pending));
            }
        }
        Some(Framed::Next)
    }

    /// Answers a request that breaks memcached's rules for its opcode and closes, as
    /// memcached does; `None` for a request to translate.
    fn refuse(
        &mut self,
        at: &Inbound<'_>,
        request: &BinaryRequest,
        pending: &mut VecDeque<Pending>,
    ) -> Option<Framed> {
        if !well_formed(request) {
            let peer = (at.peer)();
            client_log::count(at.context, &peer, ClientEvent::Error);
            self.answer(pending, Frame::of(request), Status::InvalidArguments);
            client_log::count(at.context, &peer, ClientEvent::FramingClose);
            client_log::framing_close(&peer, "binary", "body unlike its opcode's");
            return Some(self.close(pending));
        }
        if request.value.len() > at.routing.limits.max_value_len {
            let peer = (at.peer)();
            client_log::count(at.context, &peer, ClientEvent::OversizedValue);
            client_log::protocol_error(&peer, "binary", "value too large");
            self.unlink(at, request.opcode, &request.key, pending);
            self.answer(pending, Frame::of(request), Status::TooLarge);
            return Some(Framed::Next);
        }
        None
    }

    /// memcached drops a key's old value when it refuses a binary set (setq too, not add,
    /// replace, append or prepend) as too large, as it does for a text set
    /// (proto_bin.c, process_bin_update): the key's delete, translated as a binary delete
    /// is, goes where the set would have gone (`dispatch::unlink`) ahead of the refusal,
    /// and no reply of it is written.
    fn unlink(
        &mut self,
        at: &Inbound<'_>,
        opcode: u8,
        key: &[u8],
        pending: &mut VecDeque<Pending>,
    ) {
        if !matches!(opcode, op::SET | op::SETQ) || key.is_empty() || key.len() > MAX_KEY_LEN {
            return;
        }
        let delete = BinaryRequest {
            opcode: op::DELETE,
            opaque: 0,
            cas: 0,
            extras: Bytes::new(),
            key: Bytes::copy_from_slice(key),
            value: Bytes::new(),
        };
        let line = self.line_buffer(key.len() * 2);
        if write_request(line, &delete).is_none() {
            return;
        }
        // A key no meta line can carry (a base64 form over 250 bytes) was never stored
        // through memroute: nothing to drop.
        let Parse::Request(unlink) = parse_request(&mut self.scratch, &at.routing.limits) else {
            self.scratch.clear();
            return;
        };
        let queued = pending.len();
        crate::dispatch::unlink(at.routing, at.origin, Operation::Set, unlink, pending);
        for _ in queued..pending.len() {
            self.shapes.push_back(Shape::AsIs);
        }
    }

    /// Requests memroute answers itself (no backend has anything to add).
    fn answer_locally(
        &mut self,
        at: &Inbound<'_>,
        request: BinaryRequest,
        pending: &mut VecDeque<Pending>,
    ) -> Framed {
        let frame = Frame::of(&request);
        match request.opcode {
            op::NOOP => self.answer(pending, frame, Status::Success),
            op::VERSION => self.push(pending, Pending::Ready(Bytes::new()), Shape::Version(frame)),
            op::STAT if request.key.is_empty() => {
                let stats = crate::dispatch::all_stats(at.context);
                self.push(pending, stats, Shape::Translated(Translated::Stats(frame)));
            }
            // memroute keeps no slabs or items: sub-statistics belong to the servers.
            op::STAT => self.answer(pending, frame, Status::KeyNotFound),
            op::QUIT | op::QUITQ => {
                if request.opcode == op::QUIT {
                    self.answer(pending, frame, Status::Success);
                }
                return self.close(pending);
            }
            // A memcached built without SASL (or started without -S) answers these so.
            op::SASL_LIST_MECHS | op::SASL_AUTH | op::SASL_STEP => {
                self.answer(pending, frame, Status::UnknownCommand)
            }
            _ => {
                // memcached answers an opcode it does not know (VERBOSITY among them, in
                // 1.6) and reads on.
                let peer = (at.peer)();
                client_log::count(at.context, &peer, ClientEvent::Error);
                client_log::protocol_error(&peer, "binary", "unknown opcode");
                self.answer(pending, frame, Status::UnknownCommand);
            }
        }
        Framed::Next
    }

    /// The line buffer with room for a line of `payload` bytes of key and value: the
    /// pooled buffer, or a fresh one from the pool once the tail left is too short.
    fn line_buffer(&mut self, payload: usize) -> &mut BytesMut {
        let room = payload + LINE_OVERHEAD;
        if self.scratch.capacity() < room {
            if self.scratch.capacity() > 0 {
                buffers::give(std::mem::take(&mut self.scratch));
            }
            self.scratch = buffers::take();
            self.scratch.reserve(room);
        }
        &mut self.scratch
    }

    /// Frames the line just translated with the text parser and dispatches it like a
    /// client's; its first pending entry is rendered in `shape`.
    fn send(
        &mut self,
        at: &Inbound<'_>,
        shape: Translated,
        pending: &mut VecDeque<Pending>,
    ) -> Framed {
        // The translated key may still be refused (a base64 key longer than the limit).
        let limits = Limits {
            max_value_len: usize::MAX,
            ..at.routing.limits
        };
        let Parse::Request(text) = parse_request(&mut self.scratch, &limits) else {
            self.scratch.clear();
            if let Some(frame) = shape.single_frame() {
                self.answer(pending, frame, Status::InvalidArguments);
            }
            return Framed::Next;
        };
        let queued = pending.len();
        let flow = dispatch_framed(at, text, pending);
        let mut shape = Some(Shape::Translated(shape));
        for _ in queued..pending.len() {
            self.shapes.push_back(shape.take().unwrap_or(Shape::AsIs));
        }
        flow.into()
    }

    /// A getq/getkq and the getq/getkq frames already buffered after it, as one text
    /// `gets k1 k2 ...`: the multi-get path groups the keys per server, one request each.
    fn batch_quiet_gets(
        &mut self,
        at: &Inbound<'_>,
        first: BinaryRequest,
        input: &mut BytesMut,
        pending: &mut VecDeque<Pending>,
    ) -> Framed {
        let most = at.routing.limits.max_line_len / 256;
        // Only frames that are whole in the buffer join the batch; never wait for more.
        let (more, more_keys) = buffered_quiet_gets(input, most.saturating_sub(1), |key| {
            refused_by_prefix(at, key)
        });
        let line = self.line_buffer(first.key.len() + more + more_keys);
        line.put_slice(b"gets ");
        line.put_slice(&first.key);
        let mut frames = FrameList::take(1 + more);
        frames.push(Frame::of(&first));
        for _ in 0..more {
            let BinaryParse::Request(request) = parse_binary(input, &at.routing.limits) else {
                break;
            };
            line.put_u8(b' ');
            line.put_slice(&request.key);
            frames.push(Frame::of(&request));
        }
        line.put_slice(b"\r\n");
        self.send(at, Translated::MultiGet(frames), pending)
    }
}

impl Translated {
    /// The request a shape answers, unless it answers several.
    fn single_frame(self) -> Option<Frame> {
        match self {
            Translated::Get(frame)
            | Translated::Touch(frame)
            | Translated::Store(frame)
            | Translated::Delete(frame)
            | Translated::Arithmetic(frame)
            | Translated::Flush(frame)
            | Translated::Stats(frame) => Some(frame),
            Translated::MultiGet(_) => None,
        }
    }
}

fn error_name(error: BinaryError) -> &'static str {
    match error {
        BinaryError::BadMagic => "bad magic byte",
        BinaryError::BodyTooLarge => "body length beyond the value size limit",
        BinaryError::LengthsExceedBody => "key and extras longer than the body",
        BinaryError::KeyTooLong => "key longer than memcached's limit",
    }
}

/// Opcodes memcached 1.6 answers `Unknown command`, skipping their body: those it does not
/// know, and SASL's (memroute has no SASL, as a memcached started without `-S`).
fn unknown_to_memcached(opcode: u8) -> bool {
    let known = matches!(
        opcode,
        op::GET..=op::PREPENDQ | op::TOUCH..=op::GATQ | op::SASL_LIST_MECHS | op::GATK | op::GATKQ
    );
    !known
}

/// Whether the body's parts have the sizes memcached requires of this opcode (the key's
/// length limit is the framing's).
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
        op::NOOP | op::VERSION | op::QUIT | op::QUITQ | op::SASL_LIST_MECHS => {
            extras == 0 && key == 0 && value == 0
        }
        op::STAT => extras == 0,
        op::SASL_AUTH | op::SASL_STEP => extras == 0 && key > 0,
        _ => true,
    }
}

/// Writes the meta (or text) request a binary request is translated to into `line`, and
/// says how its reply is rendered; `None` (nothing written) for a request memroute answers
/// itself.
fn write_request(line: &mut BytesMut, request: &BinaryRequest) -> Option<Translated> {
    let frame = Frame::of(request);
    let ttl = || expiry(request.extra_u32(0).unwrap_or(0));
    Some(match request.opcode {
        op::GET | op::GETQ | op::GETK | op::GETKQ => {
            meta_get(line, &request.key, true, None);
            Translated::Get(frame)
        }
        op::GAT | op::GATQ | op::GATK | op::GATKQ => {
            meta_get(line, &request.key, true, Some(ttl()));
            Translated::Get(frame)
        }
        op::TOUCH => {
            meta_get(line, &request.key, false, Some(ttl()));
            Translated::Touch(frame)
        }
        opcode if is_storage(opcode) => {
            meta_set(line, request);
            Translated::Store(frame)
        }
        op::DELETE | op::DELETEQ => {
            with_cas(MetaRequest::new(line, b"md", &request.key), request.cas).finish();
            Translated::Delete(frame)
        }
        op::INCREMENT | op::INCREMENTQ | op::DECREMENT | op::DECREMENTQ => {
            meta_arithmetic(line, request);
            Translated::Arithmetic(frame)
        }
        op::FLUSH | op::FLUSHQ => {
            match request.extra_u32(0) {
                Some(delay) if delay != 0 => {
                    let _ = write!(line, "flush_all {}\r\n", expiry(delay));
                }
                _ => line.put_slice(b"flush_all\r\n"),
            }
            Translated::Flush(frame)
        }
        _ => return None,
    })
}

/// A binary request's 32-bit expiry as the text protocol carries it. memcached reads the
/// binary field unsigned, so 2^31 and more is an absolute time far ahead (2038 to 2106);
/// its text parser keeps only 32 signed bits and would read that as negative, expired at
/// once. The largest time the text protocol carries, 2^31 - 1 (January 2038), keeps such an
/// item as memcached keeps it; only its expiry comes sooner.
fn expiry(binary: u32) -> u32 {
    binary.min(i32::MAX as u32)
}

/// `mg <key> [v] f c [T<ttl>]`: a get (with the value), a gat, or a touch (without).
fn meta_get(line: &mut BytesMut, key: &[u8], value: bool, ttl: Option<u32>) {
    let mut get = MetaRequest::new(line, b"mg", key);
    if value {
        get = get.flag(b'v');
    }
    get = get.flag(b'f').flag(b'c');
    if let Some(ttl) = ttl {
        get = get.number(b'T', u64::from(ttl));
    }
    get.finish();
}

/// `ms <key> <bytes> M<mode> c [F<flags> T<ttl>] [C<cas>]` and the value.
fn meta_set(line: &mut BytesMut, request: &BinaryRequest) {
    let mode = match request.opcode {
        op::SET | op::SETQ => b'S',
        // memcached stores a binary add that carries a CAS as a compare-and-swap (a missing
        // key is `Not found`); a meta add ignores its CAS, a meta set honours it.
        op::ADD | op::ADDQ if request.cas != 0 => b'S',
        op::ADD | op::ADDQ => b'E',
        op::REPLACE | op::REPLACEQ => b'R',
        op::APPEND | op::APPENDQ => b'A',
        _ => b'P',
    };
    let mut set = MetaRequest::new(line, b"ms", &request.key)
        .size(request.value.len())
        .mode(b'M', mode)
        .flag(b'c');
    if let (Some(flags), Some(ttl)) = (request.extra_u32(0), request.extra_u32(4)) {
        set = set
            .number(b'F', u64::from(flags))
            .number(b'T', u64::from(expiry(ttl)));
    }
    with_cas(set, request.cas).finish_with_data(&request.value);
}

/// `ma <key> M<I|D> D<delta> v c [N<ttl> J<initial>] [C<cas>]`.
fn meta_arithmetic(line: &mut BytesMut, request: &BinaryRequest) {
    let mode = match request.opcode {
        op::INCREMENT | op::INCREMENTQ => b'I',
        _ => b'D',
    };
    let delta = request.extra_u64(0).unwrap_or(0);
    let initial = request.extra_u64(8).unwrap_or(0);
    let create = request.extra_u32(16).unwrap_or(u32::MAX);
    let mut arithmetic = MetaRequest::new(line, b"ma", &request.key)
        .mode(b'M', mode)
        .number(b'D', delta)
        .flag(b'v')
        .flag(b'c');
    // 0xffffffff: fail on a missing key; anything else creates it with `initial`.
    if create != u32::MAX {
        arithmetic = arithmetic
            .number(b'N', u64::from(expiry(create)))
            .number(b'J', initial);
    }
    with_cas(arithmetic, request.cas).finish();
}

/// The request's CAS (`C<cas>`), when it carries one (0: none).
fn with_cas(request: MetaRequest<'_, BytesMut>, cas: u64) -> MetaRequest<'_, BytesMut> {
    match cas {
        0 => request,
        cas => request.number(b'C', cas),
    }
}

/// Whether a key's routing prefix refuses it (`routing_prefix::refuses`): such a getq is
/// sent on its own, so that the error is its alone, as it would be from mcrouter, where
/// each binary request is one.
fn refused_by_prefix(at: &Inbound<'_>, key: &[u8]) -> bool {
    crate::routing_prefix::refuses(&at.routing.routes, at.origin.listener, key)
}

/// How many whole, well-formed getq/getkq frames with text-safe keys start `input` (at most
/// `most`, and none from the first whose key `stop` says ends the run), and the bytes of
/// their keys.
fn buffered_quiet_gets(input: &[u8], most: usize, stop: impl Fn(&[u8]) -> bool) -> (usize, usize) {
    let (mut count, mut key_bytes, mut at) = (0, 0, 0);
    while count < most {
        let Some(key_len) = quiet_get_key_len(&input[at..]) else {
            break;
        };
        if stop(&input[at + HEADER_LEN..at + HEADER_LEN + key_len]) {
            break;
        }
        count += 1;
        key_bytes += key_len;
        at += HEADER_LEN + key_len;
    }
    (count, key_bytes)
}

/// The key length of the whole, well-formed getq/getkq with a text-safe key that starts
/// `input`, if one does.
fn quiet_get_key_len(input: &[u8]) -> Option<usize> {
    if input.len() < HEADER_LEN
        || input[0] != REQUEST_MAGIC
        || !matches!(input[1], op::GETQ | op::GETKQ)
    {
        return None;
    }
    let key_len = usize::from(u16::from_be_bytes([input[2], input[3]]));
    let extras = usize::from(input[4]);
    let body = u32::from_be_bytes([input[8], input[9], input[10], input[11]]) as usize;
    let whole = extras == 0
        && key_len > 0
        && key_len <= MAX_KEY_LEN
        && body == key_len
        && input.len() >= HEADER_LEN + body
        && is_text_key(&input[HEADER_LEN..HEADER_LEN + body]);
    whole.then_some(key_len)
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
        frame.respond(out, Status::Internal, 0, &[], &[], line);
        return;
    };
    frame.status(out, status);
}

fn render(shape: Translated, reply: &[u8], out: &mut BytesMut) {
    let reply_text = MetaReply::of(reply);
    match shape {
        Translated::Get(frame) => render_get(&frame, &reply_text, out),
        Translated::Touch(frame) => render_touch(&frame, &reply_text, out),
        Translated::Store(frame) => render_store(&frame, &reply_text, out),
        Translated::Delete(frame) => render_delete(&frame, &reply_text, out),
        Translated::Arithmetic(frame) => render_arithmetic(&frame, &reply_text, out),
        Translated::Flush(frame) => {
            if reply_text.line != b"OK" {
                failure(&frame, reply_text.line, out);
            } else if !frame.quiet() {
                frame.ok(out, 0);
            }
        }
        Translated::Stats(frame) => render_stats(&frame, reply, out),
        Translated::MultiGet(frames) => render_multi_get(&frames.0, reply, out),
    }
}

/// `VA <bytes> f<flags> c<cas>` and the value, or `EN` (a miss).
fn render_get(frame: &Frame, reply: &MetaReply<'_>, out: &mut BytesMut) {
    if reply.is(b"VA") {
        let meta = reply.numbers();
        let value = reply.rest.get(..meta.size).unwrap_or_default();
        frame.hit(out, meta.cas, meta.flags, value);
    } else if reply.is(b"EN") {
        if frame.quiet() {
            return;
        }
        // A getk miss carries the key; a get miss memcached's "Not found".
        if frame.echoes_key() {
            frame.respond(out, Status::KeyNotFound, 0, &[], &frame.key, &[]);
        } else {
            frame.status(out, Status::KeyNotFound);
        }
    } else {
        failure(frame, reply.line, out);
    }
}

fn render_touch(frame: &Frame, reply: &MetaReply<'_>, out: &mut BytesMut) {
    if reply.is(b"HD") {
        let meta = reply.numbers();
        let flags = meta.flags.to_be_bytes();
        frame.respond(out, Status::Success, meta.cas, &flags, &[], &[]);
    } else if reply.is(b"EN") {
        frame.status(out, Status::KeyNotFound);
    } else {
        failure(frame, reply.line, out);
    }
}

fn render_store(frame: &Frame, reply: &MetaReply<'_>, out: &mut BytesMut) {
    let status = match reply.code {
        b"HD" => {
            if !frame.quiet() {
                frame.ok(out, reply.numbers().cas);
            }
            return;
        }
        b"NS" => match frame.opcode {
            op::ADD | op::ADDQ => Status::KeyExists,
            op::REPLACE | op::REPLACEQ => Status::KeyNotFound,
            _ => Status::NotStored,
        },
        b"EX" => Status::KeyExists,
        b"NF" => Status::KeyNotFound,
        _ => return failure(frame, reply.line, out),
    };
    frame.status(out, status);
}

fn render_delete(frame: &Frame, reply: &MetaReply<'_>, out: &mut BytesMut) {
    match reply.code {
        b"HD" if frame.quiet() => {}
        b"HD" => frame.ok(out, 0),
        b"NF" => frame.status(out, Status::KeyNotFound),
        b"EX" => frame.status(out, Status::KeyExists),
        _ => failure(frame, reply.line, out),
    }
}

/// `VA <bytes> c<cas>` and the new value as decimal digits.
fn render_arithmetic(frame: &Frame, reply: &MetaReply<'_>, out: &mut BytesMut) {
    match reply.code {
        b"VA" if frame.quiet() => {}
        b"VA" => {
            let (number, _) = split_line(reply.rest);
            let value = decimal(number).unwrap_or(0).to_be_bytes();
            frame.respond(out, Status::Success, reply.numbers().cas, &[], &[], &value);
        }
        b"NF" => frame.status(out, Status::KeyNotFound),
        b"EX" => frame.status(out, Status::KeyExists),
        _ => failure(frame, reply.line, out),
    }
}

/// The text `stats` reply, one response per `STAT name value` line, then an empty key.
fn render_stats(frame: &Frame, reply: &[u8], out: &mut BytesMut) {
    let mut text = reply;
    while !text.is_empty() {
        let (line, rest) = split_line(text);
        text = rest;
        let Some(stat) = line.strip_prefix(b"STAT ") else {
            continue;
        };
        let split = stat.iter().position(|&b| b == b' ').unwrap_or(stat.len());
        let value = stat.get(split + 1..).unwrap_or_default();
        frame.respond(out, Status::Success, 0, &[], &stat[..split], value);
    }
    frame.ok(out, 0);
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
        let mut number = || words.next().and_then(decimal).unwrap_or(0);
        let flags = number() as u32;
        let len = number() as usize;
        let cas = number();
        frame.hit(out, cas, flags, rest.get(..len).unwrap_or_default());
        text = rest.get((len + 2).min(rest.len())..).unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(opcode: u8, key: &[u8]) -> Vec<u8> {
        let mut frame = vec![REQUEST_MAGIC, opcode];
        frame.extend_from_slice(&(key.len() as u16).to_be_bytes());
        frame.extend_from_slice(&[0; 4]);
        frame.extend_from_slice(&(key.len() as u32).to_be_bytes());
        frame.extend_from_slice(&[0; 12]);
        frame.extend_from_slice(key);
        frame
    }

    #[test]
    fn a_batch_takes_the_whole_quiet_gets_at_the_front_up_to_its_limit() {
        let mut input = [frame(op::GETQ, b"a"), frame(op::GETKQ, b"bb")].concat();
        assert_eq!(buffered_quiet_gets(&input, 10, none), (2, 3));
        assert_eq!(buffered_quiet_gets(&input, 1, none), (1, 1));
        // A frame of another opcode ends the run; so does one cut short.
        let noop = frame(op::NOOP, b"");
        let run = [input.clone(), noop, frame(op::GETQ, b"c")].concat();
        assert_eq!(buffered_quiet_gets(&run, 10, none), (2, 3));
        input.extend_from_slice(&frame(op::GETQ, b"ccc")[..HEADER_LEN + 1]);
        assert_eq!(buffered_quiet_gets(&input, 10, none), (2, 3));
        // A key the text protocol cannot carry goes on its own (base64, one `mg`).
        assert_eq!(
            buffered_quiet_gets(&frame(op::GETQ, b"a b"), 10, none),
            (0, 0)
        );
        // A key its routing prefix refuses ends the run (it is answered on its own).
        let run = [
            frame(op::GETQ, b"a"),
            frame(op::GETQ, b"/x/y/k"),
            frame(op::GETQ, b"b"),
        ];
        let stop = |key: &[u8]| key.starts_with(b"/x/");
        assert_eq!(buffered_quiet_gets(&run.concat(), 10, stop), (1, 1));
    }

    fn none(_: &[u8]) -> bool {
        false
    }

    /// The line `write_request` translates a request to.
    fn line_of(opcode: u8, key: &[u8], extras: &[u8], value: &[u8], cas: u64) -> String {
        let request = BinaryRequest {
            opcode,
            opaque: 0,
            cas,
            extras: Bytes::copy_from_slice(extras),
            key: Bytes::copy_from_slice(key),
            value: Bytes::copy_from_slice(value),
        };
        let mut line = BytesMut::new();
        assert!(write_request(&mut line, &request).is_some());
        String::from_utf8_lossy(&line).into_owned()
    }

    #[test]
    fn an_expiry_past_2038_goes_as_the_latest_time_the_text_protocol_carries() {
        let far = 1u32 << 31;
        let store = [0u32.to_be_bytes(), far.to_be_bytes()].concat();
        assert_eq!(
            line_of(op::SET, b"k", &store, b"v", 0),
            "ms k 1 MS c F0 T2147483647\r\nv\r\n"
        );
        let counter = [
            &1u64.to_be_bytes()[..],
            &5u64.to_be_bytes(),
            &far.to_be_bytes(),
        ]
        .concat();
        assert_eq!(
            line_of(op::INCREMENT, b"k", &counter, b"", 0),
            "ma k MI D1 v c N2147483647 J5\r\n"
        );
        let touch = (u32::MAX - 1).to_be_bytes();
        assert_eq!(
            line_of(op::TOUCH, b"k", &touch, b"", 0),
            "mg k f c T2147483647\r\n"
        );
        assert_eq!(
            line_of(op::FLUSH, b"", &far.to_be_bytes(), b"", 0),
            "flush_all 2147483647\r\n"
        );
        // Anything up to 2^31 - 1 goes as it came.
        let near = [0u32.to_be_bytes(), 3600u32.to_be_bytes()].concat();
        assert_eq!(
            line_of(op::SET, b"k", &near, b"", 0),
            "ms k 0 MS c F0 T3600\r\n\r\n"
        );
    }

    #[test]
    fn an_add_with_a_cas_is_a_set_with_that_cas() {
        let extras = [0u8; 8];
        assert_eq!(
            line_of(op::ADD, b"k", &extras, b"", 9),
            "ms k 0 MS c F0 T0 C9\r\n\r\n"
        );
        assert_eq!(
            line_of(op::ADDQ, b"k", &extras, b"", 0),
            "ms k 0 ME c F0 T0\r\n\r\n"
        );
    }

    #[test]
    fn a_key_too_long_for_base64_goes_raw_when_a_text_line_can_hold_it() {
        let mut key = vec![b'k'; 187];
        key[5] = 0x01;
        key[6] = 0x7f;
        assert_eq!(
            line_of(op::DELETE, &key, b"", b"", 0).into_bytes(),
            [b"md ".as_slice(), &key, b"\r\n"].concat()
        );
        // 186 bytes still fit base64.
        let line = line_of(op::DELETE, &key[..186], b"", b"", 0);
        assert!(
            line.ends_with(" b\r\n") && line.len() == 3 + 248 + 4,
            "{line}"
        );
        // A space cannot be carried raw: base64, which the meta parser refuses as too long.
        key[5] = b' ';
        assert!(line_of(op::DELETE, &key, b"", b"", 0).ends_with(" b\r\n"));
    }

    #[test]
    fn a_translator_at_rest_holds_no_storage() {
        let mut translator = Translator::default();
        translator.line_buffer(100).put_slice(b"mg k v f c\r\n");
        translator.scratch.clear();
        SHAPES.with(|shapes| shapes.fill(&mut translator.shapes));
        translator.shapes.reserve(4);
        translator.rest();
        assert_eq!(translator.scratch.capacity(), 0);
        assert_eq!(translator.shapes.capacity(), 0);
    }
}
