//! The socket options TCP Fast Open needs, which neither std, tokio nor socket2 expose.
//!
//! One of memroute's two modules that allow `unsafe` (the other is `uring`, whose buffers
//! are lent to the kernel): `setsockopt(2)` takes a raw pointer to the option value. Each call passes a pointer to a live, correctly sized
//! `c_int` on the stack and a descriptor borrowed from a socket that outlives the call,
//! so the kernel reads exactly `size_of::<c_int>()` valid bytes.
#![allow(unsafe_code)]

use std::os::fd::AsRawFd;

/// What `net.ipv4.tcp_fastopen` allows, read from /proc (bit 1: client, bit 2: server).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelFastOpen {
    pub client: bool,
    pub server: bool,
}

/// The sysctl that governs TCP Fast Open, named in log lines and `--check`.
pub const FASTOPEN_SYSCTL: &str = "net.ipv4.tcp_fastopen";

/// Reads `net.ipv4.tcp_fastopen` for this network namespace; `None` where it cannot be
/// read (not Linux, /proc not mounted).
pub fn kernel_fastopen() -> Option<KernelFastOpen> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_fastopen").ok()?;
    let value: u32 = text.trim().parse().ok()?;
    Some(KernelFastOpen {
        client: value & 1 != 0,
        server: value & 2 != 0,
    })
}

/// `TCP_FASTOPEN` on a listening socket: up to `queue` connections may have sent data
/// with their SYN before the handshake completes. Set before `listen(2)`.
pub fn set_fastopen_listener(socket: &impl AsRawFd, queue: u32) -> std::io::Result<()> {
    let queue = libc::c_int::try_from(queue).unwrap_or(libc::c_int::MAX);
    set_int(socket, libc::TCP_FASTOPEN, queue)
}

/// `TCP_FASTOPEN_CONNECT` on a socket about to connect: the kernel defers the SYN to the
/// first write and sends that data with it when it holds a cookie for the server.
pub fn set_fastopen_connect(socket: &impl AsRawFd) -> std::io::Result<()> {
    set_int(socket, libc::TCP_FASTOPEN_CONNECT, 1)
}

fn set_int(socket: &impl AsRawFd, option: libc::c_int, value: libc::c_int) -> std::io::Result<()> {
    let len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: see the module header: a valid descriptor, a pointer to a live c_int, its size.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            option,
            (&value as *const libc::c_int).cast(),
            len,
        )
    };
    match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}
