//! The io_uring side: one ring, one thread, no readiness step. Every operation is a
//! submission whose completion carries the result; all submissions prepared while handling
//! one batch of completions go to the kernel in ONE `io_uring_enter`, which also waits for
//! the next completion.
//!
//! ```text
//!   loop {
//!     io_uring_enter(submit everything queued, wait for >= 1 completion)
//!     for each completion:
//!       accept (multishot)   -> new client, queue its recv
//!       client recv n bytes  -> core.client_input, queue the next recv
//!       backend recv         -> core.backend_input (clients get their replies)
//!       send done            -> queue the rest / the next output
//!     queue one send per client with output, one backend send with every framed request
//!   }
//! ```
//!
//! Buffers are owned by the connection record and are neither moved, resized nor dropped
//! while an operation on them is in flight; a connection record (and its socket) is dropped
//! only when it has no operation in flight. That is the whole safety argument for the
//! `unsafe` blocks below (the kernel writes into / reads from those buffers asynchronously).
//!
//! Sockets stay in blocking mode: io_uring first tries each recv/send without blocking and
//! otherwise arms an internal poll, so no io-wq thread is needed for sockets.
#![allow(unsafe_code)]

use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};

use bytes::{Buf, BytesMut};
use io_uring::{cqueue, opcode, squeue, types, IoUring};

use crate::core::{ClientId, Core};

const READ_CHUNK: usize = 16 * 1024;

/// user_data layout: connection index << 2 | operation.
const OP_ACCEPT: u64 = 0;
const OP_RECV: u64 = 1;
const OP_SEND: u64 = 2;
/// The backend connection's index in user_data (clients use the core's slab indexes).
const BACKEND: usize = u32::MAX as usize;

fn token(index: usize, op: u64) -> u64 {
    ((index as u64) << 2) | op
}

/// Ring options worth comparing.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN: completions are processed
    /// only when the loop enters the kernel to wait, never by interrupting it.
    pub defer_taskrun: bool,
    /// One multishot recv per connection over a ring of provided buffers (the kernel picks a
    /// buffer per completion; the bytes are copied into the connection's input and the
    /// buffer goes straight back), instead of a single-shot recv re-armed after each read.
    pub multishot_recv: bool,
}

/// Provided buffers: a page-aligned ring of `{addr, len, bid}` entries shared with the
/// kernel, and the buffers themselves in one allocation that never moves.
struct BufRing {
    base: *mut types::BufRingEntry,
    layout: std::alloc::Layout,
    entries: u16,
    /// Our copy of the tail; published to the kernel by `publish`.
    tail: u16,
    data: Box<[u8]>,
}

const BUF_GROUP: u16 = 0;
const BUF_ENTRIES: u16 = 256;
const BUF_SIZE: usize = 16 * 1024;

impl BufRing {
    fn new(ring: &IoUring) -> io::Result<BufRing> {
        let layout = std::alloc::Layout::from_size_align(
            BUF_ENTRIES as usize * std::mem::size_of::<types::BufRingEntry>(),
            4096,
        )
        .map_err(io::Error::other)?;
        // SAFETY: the layout has a non-zero size.
        let base = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<types::BufRingEntry>();
        if base.is_null() {
            return Err(io::Error::other("out of memory for the buffer ring"));
        }
        let mut br = BufRing {
            base,
            layout,
            entries: BUF_ENTRIES,
            tail: 0,
            data: vec![0u8; BUF_ENTRIES as usize * BUF_SIZE].into_boxed_slice(),
        };
        for bid in 0..BUF_ENTRIES {
            br.give_back(bid);
        }
        br.publish();
        // SAFETY: `base` is page-aligned, `entries` long, and lives as long as the ring
        // (the `Loop` drops its ring before this `BufRing`).
        unsafe {
            ring.submitter()
                .register_buf_ring_with_flags(base as u64, BUF_ENTRIES, BUF_GROUP, 0)?
        };
        Ok(br)
    }

    /// Queues buffer `bid` for the kernel again (visible after `publish`).
    fn give_back(&mut self, bid: u16) {
        let slot = (self.tail & (self.entries - 1)) as usize;
        // SAFETY: `slot` < `entries`; the kernel reads only entries up to the published tail.
        let entry = unsafe { &mut *self.base.add(slot) };
        entry.set_addr(self.data[bid as usize * BUF_SIZE..].as_ptr() as u64);
        entry.set_len(BUF_SIZE as u32);
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    fn publish(&self) {
        // SAFETY: the tail field overlays the first entry's `resv`; the kernel reads it with
        // acquire semantics, so a release store makes the entries written before it visible.
        unsafe {
            let tail = types::BufRingEntry::tail(self.base).cast_mut();
            std::sync::atomic::AtomicU16::from_ptr(tail)
                .store(self.tail, std::sync::atomic::Ordering::Release);
        }
    }

    fn bytes(&self, bid: u16, len: usize) -> &[u8] {
        let start = bid as usize * BUF_SIZE;
        &self.data[start..start + len.min(BUF_SIZE)]
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; the ring that used it is gone.
        unsafe { std::alloc::dealloc(self.base.cast(), self.layout) };
    }
}

struct Conn {
    stream: TcpStream,
    /// The client in the core (None for the backend connection).
    id: Option<ClientId>,
    input: BytesMut,
    recv_inflight: bool,
    /// The bytes of the send in flight; kept here until its completion.
    sending: BytesMut,
    send_inflight: bool,
    closing: bool,
}

impl Conn {
    fn new(stream: TcpStream, id: Option<ClientId>) -> Conn {
        Conn {
            stream,
            id,
            input: BytesMut::with_capacity(READ_CHUNK),
            recv_inflight: false,
            sending: BytesMut::new(),
            send_inflight: false,
            closing: false,
        }
    }
}

struct Loop {
    /// Declared first: dropped (and so unregistered from the kernel) before `buffers`.
    ring: IoUring,
    buffers: Option<BufRing>,
    core: Core,
    /// Clients by the core's slab index: a record stays until its last completion, and the
    /// core's index is freed only then, so the two never disagree.
    clients: Vec<Option<Conn>>,
    backend: Conn,
    ready: Vec<usize>,
}

/// Serves clients on `listener` through one connection to `backend` until an error.
pub fn run(listener: TcpListener, backend: SocketAddr, options: Options) -> io::Result<()> {
    let mut builder = IoUring::builder();
    if options.defer_taskrun {
        builder.setup_single_issuer().setup_defer_taskrun();
    }
    let ring = builder.setup_cqsize(8192).build(4096)?;
    let upstream = TcpStream::connect(backend)?;
    upstream.set_nodelay(true)?;
    let buffers = if options.multishot_recv {
        Some(BufRing::new(&ring)?)
    } else {
        None
    };
    let mut lp = Loop {
        ring,
        buffers,
        core: Core::new(),
        clients: Vec::new(),
        backend: Conn::new(upstream, None),
        ready: Vec::new(),
    };
    let accept = opcode::AcceptMulti::new(types::Fd(listener.as_raw_fd()))
        .flags(libc::SOCK_CLOEXEC)
        .build()
        .user_data(token(0, OP_ACCEPT));
    // SAFETY: a multishot accept refers to no memory of ours; `listener` outlives the loop.
    unsafe { lp.push(accept)? };
    lp.arm_recv(BACKEND)?;
    let mut completions: Vec<(u64, i32, u32)> = Vec::with_capacity(1024);
    loop {
        match lp.ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return Err(e),
        }
        completions.clear();
        completions.extend(
            lp.ring
                .completion()
                .map(|c| (c.user_data(), c.result(), c.flags())),
        );
        for &(user_data, result, flags) in &completions {
            let index = (user_data >> 2) as usize;
            match user_data & 3 {
                OP_ACCEPT => lp.accepted(&listener, result, flags)?,
                OP_RECV if lp.buffers.is_some() => lp.received_multishot(index, result, flags)?,
                OP_RECV => lp.received(index, result)?,
                OP_SEND => lp.sent(index, result)?,
                _ => {}
            }
        }
        lp.flush()?;
        if let Some(line) = lp.core.batching_report() {
            eprintln!("{line}");
        }
    }
}

impl Loop {
    /// Queues one submission, entering the kernel first if the queue is full.
    ///
    /// # Safety
    /// Every buffer the entry points at must stay valid and unmoved until its completion.
    unsafe fn push(&mut self, entry: squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: forwarded from the caller.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return Ok(());
            }
            self.ring.submit()?;
        }
    }

    fn conn(&mut self, index: usize) -> Option<&mut Conn> {
        if index == BACKEND {
            Some(&mut self.backend)
        } else {
            self.clients.get_mut(index)?.as_mut()
        }
    }

    fn accepted(&mut self, listener: &TcpListener, result: i32, flags: u32) -> io::Result<()> {
        if !cqueue::more(flags) {
            let accept = opcode::AcceptMulti::new(types::Fd(listener.as_raw_fd()))
                .flags(libc::SOCK_CLOEXEC)
                .build()
                .user_data(token(0, OP_ACCEPT));
            // SAFETY: no buffer; see `run`.
            unsafe { self.push(accept)? };
        }
        if result < 0 {
            return Ok(()); // e.g. EMFILE: the listener stays, the client is refused
        }
        // SAFETY: a successful accept returns a new descriptor that nothing else owns.
        let stream = unsafe { TcpStream::from_raw_fd(result) };
        stream.set_nodelay(true)?;
        let id = self.core.open_client();
        if self.clients.len() <= id.index {
            self.clients.resize_with(id.index + 1, || None);
        }
        self.clients[id.index] = Some(Conn::new(stream, Some(id)));
        self.arm_recv(id.index)
    }

    fn arm_recv(&mut self, index: usize) -> io::Result<()> {
        let multishot = self.buffers.is_some();
        let Some(conn) = self.conn(index) else {
            return Ok(());
        };
        if conn.recv_inflight || conn.closing {
            return Ok(());
        }
        if multishot {
            let entry = opcode::RecvMulti::new(types::Fd(conn.stream.as_raw_fd()), BUF_GROUP)
                .build()
                .user_data(token(index, OP_RECV));
            conn.recv_inflight = true;
            // SAFETY: the kernel writes only into provided buffers, which live as long as the ring.
            return unsafe { self.push(entry) };
        }
        if conn.input.capacity() - conn.input.len() < READ_CHUNK / 4 {
            conn.input.reserve(READ_CHUNK);
        }
        let spare = conn.input.spare_capacity_mut();
        let entry = opcode::Recv::new(
            types::Fd(conn.stream.as_raw_fd()),
            spare.as_mut_ptr().cast::<u8>(),
            spare.len().min(u32::MAX as usize) as u32,
        )
        .build()
        .user_data(token(index, OP_RECV));
        conn.recv_inflight = true;
        // SAFETY: the spare capacity belongs to `conn.input`, which is not touched (no
        // reserve, no parse) until this recv completes, and the record outlives it.
        unsafe { self.push(entry) }
    }

    fn received(&mut self, index: usize, result: i32) -> io::Result<()> {
        let Some(conn) = self.conn(index) else {
            return Ok(());
        };
        conn.recv_inflight = false;
        if result > 0 && !conn.closing {
            // SAFETY: the kernel wrote `result` bytes into the spare capacity of this recv.
            unsafe { conn.input.set_len(conn.input.len() + result as usize) };
        }
        if self.consume_input(index, result)? {
            self.arm_recv(index)?;
        }
        Ok(())
    }

    /// After a recv completed with `result` (its bytes already in the connection's input):
    /// ends the connection on end of stream or error, else feeds the core. Returns whether
    /// the connection is still open.
    fn consume_input(&mut self, index: usize, result: i32) -> io::Result<bool> {
        let Some(conn) = self.conn(index) else {
            return Ok(false);
        };
        if result <= 0 || conn.closing {
            if index == BACKEND {
                return Err(io::Error::other(format!(
                    "backend connection ended (recv result {result})"
                )));
            }
            self.close(index)?;
            return Ok(false);
        }
        if index == BACKEND {
            self.core
                .backend_input(&mut self.backend.input)
                .map_err(|e| io::Error::other(e.0))?;
        } else if let Some(id) = conn.id {
            let mut input = std::mem::take(&mut conn.input);
            self.core.client_input(id, &mut input);
            if let Some(conn) = self.conn(index) {
                conn.input = input;
            }
            if self.core.must_close(id) {
                self.close(index)?; // `quit`, or a stream that cannot be framed
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn received_multishot(&mut self, index: usize, result: i32, flags: u32) -> io::Result<()> {
        let more = cqueue::more(flags);
        let bid = cqueue::buffer_select(flags);
        let (Some(conn), Some(buffers)) = (
            if index == BACKEND {
                Some(&mut self.backend)
            } else {
                self.clients.get_mut(index).and_then(|c| c.as_mut())
            },
            self.buffers.as_mut(),
        ) else {
            return Ok(());
        };
        if let Some(bid) = bid {
            if result > 0 {
                conn.input
                    .extend_from_slice(buffers.bytes(bid, result as usize));
            }
            buffers.give_back(bid); // published before the loop next enters the kernel
        }
        if !more {
            conn.recv_inflight = false;
        }
        if result == -libc::ENOBUFS {
            return self.arm_recv(index); // every buffer was taken: re-arm once they are back
        }
        if self.consume_input(index, result)? && !more {
            self.arm_recv(index)?;
        }
        Ok(())
    }

    fn sent(&mut self, index: usize, result: i32) -> io::Result<()> {
        let Some(conn) = self.conn(index) else {
            return Ok(());
        };
        conn.send_inflight = false;
        if result < 0 {
            if index == BACKEND {
                return Err(io::Error::from_raw_os_error(-result));
            }
            return self.close(index);
        }
        conn.sending.advance(result as usize);
        if conn.closing {
            return self.close(index);
        }
        self.start_send(index)
    }

    /// Sends what is left of the current output, or the connection's next output.
    fn start_send(&mut self, index: usize) -> io::Result<()> {
        match self.conn(index) {
            Some(conn) if !conn.send_inflight && !conn.closing => {}
            _ => return Ok(()), // its completion will come back here
        }
        let mut close_after = false;
        let next = if index == BACKEND {
            Some(self.core.take_backend_output())
        } else {
            self.core.take_output(index).map(|(_, out, close)| {
                close_after = close;
                out
            })
        };
        let Some(conn) = self.conn(index) else {
            return Ok(());
        };
        if let Some(next) = next {
            if conn.sending.is_empty() {
                conn.sending = next;
            } else {
                conn.sending.extend_from_slice(&next);
            }
        }
        if conn.sending.is_empty() {
            if close_after {
                return self.close(index);
            }
            return Ok(());
        }
        let entry = opcode::Send::new(
            types::Fd(conn.stream.as_raw_fd()),
            conn.sending.as_ptr(),
            conn.sending.len().min(u32::MAX as usize) as u32,
        )
        .build()
        .user_data(token(index, OP_SEND));
        conn.send_inflight = true;
        // SAFETY: `conn.sending` is neither changed nor dropped until this send completes.
        unsafe { self.push(entry) }
    }

    /// Starts closing a client; its record goes once no operation is in flight.
    fn close(&mut self, index: usize) -> io::Result<()> {
        let Some(Some(conn)) = self.clients.get_mut(index) else {
            return Ok(());
        };
        if !conn.closing {
            conn.closing = true;
            // Ends a recv still waiting (it completes with 0); errors mean it is gone anyway.
            let _ = conn.stream.shutdown(Shutdown::Both);
        }
        if !conn.recv_inflight && !conn.send_inflight {
            if let Some(id) = conn.id {
                self.core.close_client(id);
            }
            self.clients[index] = None; // closes the socket
        }
        Ok(())
    }

    /// After a batch of completions: one send per client with output, one to the backend.
    fn flush(&mut self) -> io::Result<()> {
        if let Some(buffers) = &self.buffers {
            buffers.publish();
        }
        let mut ready = std::mem::take(&mut self.ready);
        self.core.take_ready(&mut ready);
        for &index in &ready {
            self.start_send(index)?;
        }
        ready.clear();
        self.ready = ready;
        if self.core.has_backend_output() {
            self.start_send(BACKEND)?;
        }
        Ok(())
    }
}
