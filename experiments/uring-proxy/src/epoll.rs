//! The epoll side: a current-thread tokio runtime and a `LocalSet`, as memroute's worker
//! runs today. One task per client connection and one for the backend connection; the
//! state is one `Core` behind a `RefCell` (single thread: never borrowed across an await).
//!
//! ```text
//!   client task:  read_buf -> core.client_input -> notify backend task
//!                 notified  -> write the client's output
//!   backend task: notified  -> write every request framed since its last write (one send)
//!                 read_buf  -> core.backend_input -> notify each client with output
//! ```
//!
//! Each readiness wait is an epoll registration; each read or write is its own syscall.

use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use crate::core::{ClientId, Core};

const READ_CHUNK: usize = 16 * 1024;

struct Shared {
    core: RefCell<Core>,
    backend_wake: Notify,
    client_wakes: RefCell<Vec<Option<Rc<Notify>>>>,
}

/// Serves clients on `listener` through one connection to `backend` until an error.
pub fn run(listener: std::net::TcpListener, backend: SocketAddr) -> io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, serve(listener, backend))
}

async fn serve(listener: std::net::TcpListener, backend: SocketAddr) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = TcpListener::from_std(listener)?;
    let upstream = TcpStream::connect(backend).await?;
    upstream.set_nodelay(true)?;
    let shared = Rc::new(Shared {
        core: RefCell::new(Core::new()),
        backend_wake: Notify::new(),
        client_wakes: RefCell::new(Vec::new()),
    });
    let mut backend_task = tokio::task::spawn_local(backend_loop(upstream, shared.clone()));
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => accepted?,
            ended = &mut backend_task => {
                return ended.map_err(io::Error::other).and_then(|r| r);
            }
        };
        stream.set_nodelay(true)?;
        let id = shared.core.borrow_mut().open_client();
        let wake = Rc::new(Notify::new());
        {
            let mut wakes = shared.client_wakes.borrow_mut();
            if wakes.len() <= id.index {
                wakes.resize(id.index + 1, None);
            }
            wakes[id.index] = Some(wake.clone());
        }
        tokio::task::spawn_local(client_loop(stream, id, wake, shared.clone()));
    }
}

async fn client_loop(mut stream: TcpStream, id: ClientId, wake: Rc<Notify>, shared: Rc<Shared>) {
    let mut input = BytesMut::with_capacity(READ_CHUNK);
    loop {
        if input.capacity() - input.len() < READ_CHUNK / 4 {
            input.reserve(READ_CHUNK);
        }
        tokio::select! {
            biased;
            _ = wake.notified() => {}
            read = stream.read_buf(&mut input) => match read {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    shared.core.borrow_mut().client_input(id, &mut input);
                    shared.backend_wake.notify_one();
                }
            },
        }
        let taken = shared.core.borrow_mut().take_output(id.index);
        let Some((_, out, close)) = taken else { break };
        if !out.is_empty() && stream.write_all(&out).await.is_err() {
            break;
        }
        if close {
            break;
        }
    }
    shared.core.borrow_mut().close_client(id);
    if let Some(slot) = shared.client_wakes.borrow_mut().get_mut(id.index) {
        *slot = None;
    }
}

async fn backend_loop(mut upstream: TcpStream, shared: Rc<Shared>) -> io::Result<()> {
    let mut input = BytesMut::with_capacity(64 * 1024);
    let mut ready = Vec::new();
    loop {
        if input.capacity() - input.len() < 16 * 1024 {
            input.reserve(64 * 1024);
        }
        tokio::select! {
            biased;
            _ = shared.backend_wake.notified() => {}
            read = upstream.read_buf(&mut input) => {
                if read? == 0 {
                    return Err(io::Error::other("backend closed the connection"));
                }
                let mut core = shared.core.borrow_mut();
                core.backend_input(&mut input)
                    .map_err(|e| io::Error::other(e.0))?;
                core.take_ready(&mut ready);
            }
        }
        {
            let wakes = shared.client_wakes.borrow();
            for index in ready.drain(..) {
                if let Some(Some(w)) = wakes.get(index) {
                    w.notify_one();
                }
            }
        }
        if let Some(line) = shared.core.borrow_mut().batching_report() {
            eprintln!("{line}");
        }
        let out = shared.core.borrow_mut().take_backend_output();
        if !out.is_empty() {
            upstream.write_all(&out).await?;
        }
    }
}
