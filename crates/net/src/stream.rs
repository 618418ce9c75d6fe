//! One byte stream type for sessions and backend connections, plain or TLS, over epoll
//! (tokio's sockets) or the worker's io_uring (`uring`), so the code above it never names
//! rustls or a ring. Splitting borrows the stream: the plain halves are tokio's zero-cost
//! TCP/unix halves, or two references to one io_uring stream; a TLS stream (one state
//! machine for both directions) is shared by its halves through `tokio::io::split`.
use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

use crate::uring::{Peer, UringStream};

type ServerTlsStream = tokio_rustls::server::TlsStream<TcpStream>;
type ClientTlsStream = tokio_rustls::client::TlsStream<TcpStream>;
type UringServerTlsStream = tokio_rustls::server::TlsStream<UringStream>;
type UringClientTlsStream = tokio_rustls::client::TlsStream<UringStream>;

/// A connection: accepted from a client or opened to a backend.
#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// A client connection to a TLS listener (boxed: rustls's state is large).
    ServerTls(Box<ServerTlsStream>),
    /// A TLS connection to a backend.
    ClientTls(Box<ClientTlsStream>),
    /// A TCP or unix socket served by the worker's io_uring (`proxy.io = "io_uring"`).
    Uring(UringStream),
    /// `ServerTls` over the worker's io_uring.
    UringServerTls(Box<UringServerTlsStream>),
    /// `ClientTls` over the worker's io_uring.
    UringClientTls(Box<UringClientTlsStream>),
}

/// The reading half of a borrowed [`Stream`].
#[derive(Debug)]
pub enum ReadHalf<'a> {
    Tcp(tokio::net::tcp::ReadHalf<'a>),
    Unix(tokio::net::unix::ReadHalf<'a>),
    ServerTls(tokio::io::ReadHalf<&'a mut ServerTlsStream>),
    ClientTls(tokio::io::ReadHalf<&'a mut ClientTlsStream>),
    Uring(&'a UringStream),
    UringServerTls(tokio::io::ReadHalf<&'a mut UringServerTlsStream>),
    UringClientTls(tokio::io::ReadHalf<&'a mut UringClientTlsStream>),
}

/// The writing half of a borrowed [`Stream`].
#[derive(Debug)]
pub enum WriteHalf<'a> {
    Tcp(tokio::net::tcp::WriteHalf<'a>),
    Unix(tokio::net::unix::WriteHalf<'a>),
    ServerTls(tokio::io::WriteHalf<&'a mut ServerTlsStream>),
    ClientTls(tokio::io::WriteHalf<&'a mut ClientTlsStream>),
    Uring(&'a UringStream),
    UringServerTls(tokio::io::WriteHalf<&'a mut UringServerTlsStream>),
    UringClientTls(tokio::io::WriteHalf<&'a mut UringClientTlsStream>),
}

impl Stream {
    /// A connected TCP socket to or from `peer`, served by this worker's io_uring when it
    /// runs one (`proxy.io = "io_uring"`), else by tokio's epoll reactor.
    pub(crate) fn from_tcp(tcp: TcpStream, peer: Peer) -> std::io::Result<Stream> {
        match crate::uring::current() {
            None => Ok(Stream::Tcp(tcp)),
            Some(driver) => {
                let std = tcp.into_std()?;
                Ok(Stream::Uring(UringStream::new(&driver, std.into(), peer)?))
            }
        }
    }

    /// A connected unix socket, as [`Stream::from_tcp`].
    pub(crate) fn from_unix(unix: UnixStream, peer: Peer) -> std::io::Result<Stream> {
        match crate::uring::current() {
            None => Ok(Stream::Unix(unix)),
            Some(driver) => {
                let std = unix.into_std()?;
                Ok(Stream::Uring(UringStream::new(&driver, std.into(), peer)?))
            }
        }
    }

    /// Halves that read and write concurrently (a session's reader and writer, a backend
    /// connection's two tasks).
    pub fn split(&mut self) -> (ReadHalf<'_>, WriteHalf<'_>) {
        match self {
            Stream::Tcp(s) => {
                let (r, w) = s.split();
                (ReadHalf::Tcp(r), WriteHalf::Tcp(w))
            }
            Stream::Unix(s) => {
                let (r, w) = s.split();
                (ReadHalf::Unix(r), WriteHalf::Unix(w))
            }
            Stream::ServerTls(s) => {
                let (r, w) = tokio::io::split(&mut **s);
                (ReadHalf::ServerTls(r), WriteHalf::ServerTls(w))
            }
            Stream::ClientTls(s) => {
                let (r, w) = tokio::io::split(&mut **s);
                (ReadHalf::ClientTls(r), WriteHalf::ClientTls(w))
            }
            Stream::Uring(s) => (ReadHalf::Uring(s), WriteHalf::Uring(s)),
            Stream::UringServerTls(s) => {
                let (r, w) = tokio::io::split(&mut **s);
                (ReadHalf::UringServerTls(r), WriteHalf::UringServerTls(w))
            }
            Stream::UringClientTls(s) => {
                let (r, w) = tokio::io::split(&mut **s);
                (ReadHalf::UringClientTls(r), WriteHalf::UringClientTls(w))
            }
        }
    }

    /// The peer as log lines name it (`ip:port`, or `unix-socket`), asked from the socket
    /// when a line is written rather than stored with every connection.
    pub fn peer_description(&self) -> String {
        let address = match self {
            Stream::Tcp(s) => s.peer_addr(),
            Stream::Unix(_) => return "unix-socket".to_string(),
            Stream::ServerTls(s) => s.get_ref().0.peer_addr(),
            Stream::ClientTls(s) => s.get_ref().0.peer_addr(),
            Stream::Uring(s) => return uring_peer(s),
            Stream::UringServerTls(s) => return uring_peer(s.get_ref().0),
            Stream::UringClientTls(s) => return uring_peer(s.get_ref().0),
        };
        address.map_or_else(|_| "unknown".to_string(), |a| a.to_string())
    }

    /// Whether this stream is encrypted.
    pub fn is_tls(&self) -> bool {
        matches!(
            self,
            Stream::ServerTls(_)
                | Stream::ClientTls(_)
                | Stream::UringServerTls(_)
                | Stream::UringClientTls(_)
        )
    }

    /// Whether this stream is served by the worker's io_uring.
    pub fn is_uring(&self) -> bool {
        matches!(
            self,
            Stream::Uring(_) | Stream::UringServerTls(_) | Stream::UringClientTls(_)
        )
    }
}

/// Forwards a poll to whichever variant `$value` holds (every variant is `Unpin`).
macro_rules! each {
    ($value:expr, $enum:ident, $s:ident => $call:expr) => {
        match $value {
            $enum::Tcp($s) => $call,
            $enum::Unix($s) => $call,
            $enum::ServerTls($s) => $call,
            $enum::ClientTls($s) => $call,
            $enum::Uring($s) => $call,
            $enum::UringServerTls($s) => $call,
            $enum::UringClientTls($s) => $call,
        }
    };
}

macro_rules! read_impl {
    ($ty:ty, $enum:ident) => {
        impl AsyncRead for $ty {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<std::io::Result<()>> {
                each!(self.get_mut(), $enum, s => Pin::new(s).poll_read(cx, buf))
            }
        }
    };
}

macro_rules! write_impl {
    ($ty:ty, $enum:ident) => {
        impl AsyncWrite for $ty {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<std::io::Result<usize>> {
                each!(self.get_mut(), $enum, s => Pin::new(s).poll_write(cx, buf))
            }
            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[IoSlice<'_>],
            ) -> Poll<std::io::Result<usize>> {
                each!(self.get_mut(), $enum, s => Pin::new(s).poll_write_vectored(cx, bufs))
            }
            fn is_write_vectored(&self) -> bool {
                each!(self, $enum, s => s.is_write_vectored())
            }
            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
                each!(self.get_mut(), $enum, s => Pin::new(s).poll_flush(cx))
            }
            fn poll_shutdown(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<std::io::Result<()>> {
                each!(self.get_mut(), $enum, s => Pin::new(s).poll_shutdown(cx))
            }
        }
    };
}

fn uring_peer(stream: &UringStream) -> String {
    match stream.socket().peer_addr() {
        Ok(address) => match address.as_socket() {
            Some(address) => address.to_string(),
            None => "unix-socket".to_string(),
        },
        Err(_) => "unknown".to_string(),
    }
}

read_impl!(Stream, Stream);
write_impl!(Stream, Stream);
read_impl!(ReadHalf<'_>, ReadHalf);
write_impl!(WriteHalf<'_>, WriteHalf);
