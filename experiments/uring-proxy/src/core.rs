//! The proxy's state without any I/O: both event loops (epoll and io_uring) drive this
//! same code, so what the benchmark compares is only how bytes get in and out.
//!
//! ```text
//!   client bytes --client_input--> parse_request --> frame copied into backend_out
//!                                                    slot queued on the client, entry on `inflight`
//!   backend bytes --backend_input--> parse_reply (FIFO kind) --> reply appended to the client's out
//!   the loop then sends backend_out (one write for every request parsed in this wake-up)
//!   and each client's out (one write per client per wake-up)
//! ```
//!
//! One backend connection, replies matched in order (memcached answers a connection's
//! requests in order). Bad input gets memcached's error in its place in the reply order.

use std::collections::VecDeque;

use bytes::{Buf, BytesMut};
use memroute_protocol::{
    parse_reply, parse_request, Command, ErrorReply, Limits, Parse, ReplyKind, ReplyParse,
};

/// A client as the core knows it: slab index plus a generation, so a reply for a client
/// that closed (and whose index was reused) is dropped instead of misdelivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientId {
    pub index: usize,
    generation: u32,
}

/// One reply a client is owed, in its request order.
#[derive(Debug)]
enum Slot {
    /// Comes from the backend; `discard` for `noreply` requests (memroute strips the token
    /// and drops the reply, so a backend error cannot desynchronise the stream).
    Backend { discard: bool },
    /// Decided by the proxy itself (a parse error).
    Immediate(Vec<u8>),
}

#[derive(Debug)]
struct Client {
    generation: u32,
    slots: VecDeque<Slot>,
    out: BytesMut,
    /// Bytes of a rejected data block still to skip in the client's stream.
    swallow: usize,
    /// The stream cannot be framed any more, or the client sent `quit`: close once `out` is sent.
    close_after_flush: bool,
    /// Already in `ready` (each client is listed once per wake-up).
    listed: bool,
}

/// A request sent to the backend whose reply has not arrived yet.
#[derive(Debug)]
struct Inflight {
    client: ClientId,
    kind: ReplyKind,
}

/// The backend sent something that cannot be framed: the experiment stops (memroute would
/// reconnect and fail the in-flight requests; that is not what is measured here).
#[derive(Debug)]
pub struct BackendBroken(pub String);

/// The proxy's whole state for one worker.
#[derive(Debug, Default)]
pub struct Core {
    clients: Vec<Option<Client>>,
    free: Vec<usize>,
    next_generation: u32,
    inflight: VecDeque<Inflight>,
    backend_out: BytesMut,
    /// Clients with bytes in `out` since the loop last asked.
    ready: Vec<usize>,
    limits: Limits,
    /// Requests forwarded (for the loop's own counters and the tests).
    pub forwarded: u64,
    /// Non-empty outputs handed to the loop: backend writes and client writes (each is one
    /// send), so the log shows how many requests each send carried.
    backend_sends: u64,
    client_sends: u64,
    reported_at: u64,
}

/// A batching line is logged every this many forwarded requests.
const REPORT_EVERY: u64 = 1 << 17;

impl Core {
    pub fn new() -> Core {
        Core::default()
    }

    pub fn open_client(&mut self) -> ClientId {
        self.next_generation = self.next_generation.wrapping_add(1);
        let client = Client {
            generation: self.next_generation,
            slots: VecDeque::new(),
            out: BytesMut::new(),
            swallow: 0,
            close_after_flush: false,
            listed: false,
        };
        let index = match self.free.pop() {
            Some(i) => {
                self.clients[i] = Some(client);
                i
            }
            None => {
                self.clients.push(Some(client));
                self.clients.len() - 1
            }
        };
        ClientId {
            index,
            generation: self.next_generation,
        }
    }

    /// The client's connection is gone; replies still owed to it will be dropped.
    pub fn close_client(&mut self, id: ClientId) {
        if self.client_mut(id).is_some() {
            self.clients[id.index] = None;
            self.free.push(id.index);
        }
    }

    fn client_mut(&mut self, id: ClientId) -> Option<&mut Client> {
        self.clients
            .get_mut(id.index)?
            .as_mut()
            .filter(|c| c.generation == id.generation)
    }

    /// Frames every whole request at the front of `input` (which keeps any partial one).
    pub fn client_input(&mut self, id: ClientId, input: &mut BytesMut) {
        let limits = self.limits;
        let Some(client) = self
            .clients
            .get_mut(id.index)
            .and_then(|c| c.as_mut())
            .filter(|c| c.generation == id.generation)
        else {
            return;
        };
        while !input.is_empty() && !client.close_after_flush {
            if client.swallow > 0 {
                let skip = client.swallow.min(input.len());
                input.advance(skip);
                client.swallow -= skip;
                continue;
            }
            match parse_request(input, &limits) {
                Parse::Incomplete => break,
                Parse::Invalid {
                    reply,
                    swallow,
                    close,
                } => {
                    client.swallow = swallow;
                    client.close_after_flush = close;
                    if reply != ErrorReply::Silent {
                        client.slots.push_back(Slot::Immediate(reply.to_bytes()));
                    }
                }
                Parse::Request(request) => {
                    if request.command == Command::Quit {
                        client.close_after_flush = true;
                        break;
                    }
                    let (head, tail) = request.forward_parts();
                    self.backend_out.extend_from_slice(&head);
                    if let Some(tail) = tail {
                        self.backend_out.extend_from_slice(&tail);
                    }
                    self.inflight.push_back(Inflight {
                        client: id,
                        kind: ReplyKind::for_command(request.command),
                    });
                    client.slots.push_back(Slot::Backend {
                        discard: request.noreply,
                    });
                    self.forwarded += 1;
                }
            }
        }
        // Immediate replies at the head of the queue are owed to no one else: out now.
        if flush_immediates(client) && !client.listed {
            client.listed = true;
            self.ready.push(id.index);
        }
    }

    /// Hands every whole reply at the front of `input` to its client, in request order.
    pub fn backend_input(&mut self, input: &mut BytesMut) -> Result<(), BackendBroken> {
        while let Some(head) = self.inflight.front() {
            let len = match parse_reply(input, head.kind, &self.limits) {
                Ok(ReplyParse::Complete(len)) => len,
                Ok(ReplyParse::Incomplete) => break,
                Err(e) => return Err(BackendBroken(e.to_string())),
            };
            let reply = input.split_to(len);
            let Some(done) = self.inflight.pop_front() else {
                break;
            };
            let Some(client) = self
                .clients
                .get_mut(done.client.index)
                .and_then(|c| c.as_mut())
                .filter(|c| c.generation == done.client.generation)
            else {
                continue; // the client left before its reply arrived
            };
            if let Some(Slot::Backend { discard }) = client.slots.pop_front() {
                if !discard {
                    client.out.extend_from_slice(&reply);
                }
            }
            flush_immediates(client);
            if !client.out.is_empty() && !client.listed {
                client.listed = true;
                self.ready.push(done.client.index);
            }
        }
        if self.inflight.is_empty() && !input.is_empty() {
            return Err(BackendBroken(
                "bytes from the backend with no request waiting".into(),
            ));
        }
        Ok(())
    }

    /// Indexes of the clients that have output waiting (each listed once), clearing the list.
    pub fn take_ready(&mut self, into: &mut Vec<usize>) {
        for &i in &self.ready {
            if let Some(Some(c)) = self.clients.get_mut(i) {
                c.listed = false;
            }
        }
        into.append(&mut self.ready);
    }

    /// The client's pending output (empty if none); `close` is true when the connection
    /// must be closed once these bytes are written.
    pub fn take_output(&mut self, index: usize) -> Option<(ClientId, BytesMut, bool)> {
        let c = self.clients.get_mut(index)?.as_mut()?;
        let close = c.close_after_flush && c.slots.is_empty();
        if !c.out.is_empty() {
            self.client_sends += 1;
        }
        Some((
            ClientId {
                index,
                generation: c.generation,
            },
            c.out.split(),
            close,
        ))
    }

    /// Whether the client must be closed (after its output is written).
    pub fn must_close(&self, id: ClientId) -> bool {
        match self.clients.get(id.index) {
            Some(Some(c)) if c.generation == id.generation => {
                c.close_after_flush && c.slots.is_empty() && c.out.is_empty()
            }
            _ => true,
        }
    }

    /// Every request framed since the last call, as one buffer for one backend write.
    pub fn take_backend_output(&mut self) -> BytesMut {
        if !self.backend_out.is_empty() {
            self.backend_sends += 1;
        }
        self.backend_out.split()
    }

    /// Every 2^17 forwarded requests: requests per backend send and per client send since
    /// the last line (the loop prints it; the bench keeps the proxies' logs).
    pub fn batching_report(&mut self) -> Option<String> {
        if self.forwarded - self.reported_at < REPORT_EVERY {
            return None;
        }
        let requests = (self.forwarded - self.reported_at) as f64;
        let line = format!(
            "batching: {:.2} requests per backend send, {:.2} per client send",
            requests / self.backend_sends.max(1) as f64,
            requests / self.client_sends.max(1) as f64
        );
        self.reported_at = self.forwarded;
        self.backend_sends = 0;
        self.client_sends = 0;
        Some(line)
    }

    pub fn has_backend_output(&self) -> bool {
        !self.backend_out.is_empty()
    }
}

/// Moves the immediate replies at the head of the client's queue to its output.
/// Returns whether the client has output.
fn flush_immediates(client: &mut Client) -> bool {
    while let Some(Slot::Immediate(_)) = client.slots.front() {
        if let Some(Slot::Immediate(bytes)) = client.slots.pop_front() {
            client.out.extend_from_slice(&bytes);
        }
    }
    !client.out.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(s: &[u8]) -> BytesMut {
        BytesMut::from(s)
    }

    #[test]
    fn replies_go_back_in_request_order_with_errors_in_place() {
        let mut core = Core::new();
        let a = core.open_client();
        let b = core.open_client();
        core.client_input(
            a,
            &mut buf(b"get k1\r\nbogus\r\nset k2 0 0 1 noreply\r\nx\r\nget k3\r\n"),
        );
        core.client_input(b, &mut buf(b"get k4\r\n"));
        assert_eq!(
            &core.take_backend_output()[..],
            b"get k1\r\nset k2 0 0 1\r\nx\r\nget k3\r\nget k4\r\n"
        );
        let mut ready = Vec::new();
        core.take_ready(&mut ready);
        assert!(ready.is_empty(), "nothing is owed before k1's reply");

        let mut replies =
            buf(b"VALUE k1 0 1\r\na\r\nEND\r\nSTORED\r\nEND\r\nVALUE k4 0 1\r\nb\r\nEND\r\n");
        core.backend_input(&mut replies)
            .expect("well-framed replies");
        assert!(replies.is_empty());
        core.take_ready(&mut ready);
        assert_eq!(ready, vec![a.index, b.index]);
        let (_, out_a, close_a) = core.take_output(a.index).expect("client a");
        assert_eq!(&out_a[..], b"VALUE k1 0 1\r\na\r\nEND\r\nERROR\r\nEND\r\n");
        assert!(!close_a);
        let (_, out_b, _) = core.take_output(b.index).expect("client b");
        assert_eq!(&out_b[..], b"VALUE k4 0 1\r\nb\r\nEND\r\n");
    }

    #[test]
    fn a_reply_for_a_closed_client_is_dropped_not_misdelivered() {
        let mut core = Core::new();
        let a = core.open_client();
        core.client_input(a, &mut buf(b"get k\r\n"));
        core.close_client(a);
        let c = core.open_client();
        assert_eq!(c.index, a.index, "the slot is reused");
        core.client_input(c, &mut buf(b"get j\r\n"));
        let mut replies = buf(b"VALUE k 0 1\r\na\r\nEND\r\nEND\r\n");
        core.backend_input(&mut replies)
            .expect("well-framed replies");
        let (_, out, _) = core.take_output(c.index).expect("client c");
        assert_eq!(&out[..], b"END\r\n");
    }

    #[test]
    fn partial_input_waits_and_garbage_from_the_backend_is_an_error() {
        let mut core = Core::new();
        let a = core.open_client();
        let mut input = buf(b"set k 0 0 5\r\nab");
        core.client_input(a, &mut input);
        assert_eq!(&input[..], b"set k 0 0 5\r\nab");
        assert!(!core.has_backend_output());
        input.extend_from_slice(b"cde\r\nquit\r\n");
        core.client_input(a, &mut input);
        assert_eq!(&core.take_backend_output()[..], b"set k 0 0 5\r\nabcde\r\n");
        assert!(!core.must_close(a), "quit waits for the owed reply");
        assert!(core.backend_input(&mut buf(b"VALUE x 0 1\r\n")).is_err());
    }
}
