//! Both event loops of the experiment against a real memcached: the same replies, in
//! order, for pipelined requests from several connections, errors in place, `quit` closes.
use std::net::{SocketAddr, TcpListener};

use memroute_tests::{Conn, Memcached};
use memroute_uring_proxy::{epoll, uring};

#[derive(Debug, Clone, Copy)]
enum Mode {
    Epoll,
    Uring,
    UringMultishot,
}

/// Starts the proxy on its own thread; it ends when its memcached goes away.
fn start_proxy(mode: Mode, backend: &Memcached) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("local addr").to_string();
    let backend: SocketAddr = backend.addr().parse().expect("memcached address");
    std::thread::spawn(move || match mode {
        Mode::Epoll => epoll::run(listener, backend),
        Mode::Uring | Mode::UringMultishot => uring::run(
            listener,
            backend,
            uring::Options {
                defer_taskrun: true,
                multishot_recv: matches!(mode, Mode::UringMultishot),
            },
        ),
    });
    addr
}

fn check(mode: Mode) {
    let memcached = Memcached::start();
    let addr = start_proxy(mode, &memcached);

    let mut one = Conn::connect(&addr);
    let reply = one
        .roundtrip_fenced(
            b"set a 0 0 1\r\nx\r\nget a\r\nbogus\r\nset n 0 0 1 noreply\r\ny\r\nget a n zz\r\n",
        )
        .expect("reply");
    assert_eq!(
        String::from_utf8_lossy(&reply),
        "STORED\r\nVALUE a 0 1\r\nx\r\nEND\r\nERROR\r\nVALUE a 0 1\r\nx\r\nVALUE n 0 1\r\ny\r\nEND\r\n",
        "{mode:?}"
    );

    // Several connections, each with a pipelined batch, sent before any reply is read: the
    // one backend connection carries them interleaved, and each client gets its own back.
    let mut conns: Vec<Conn> = (0..8).map(|_| Conn::connect(&addr)).collect();
    let mut expected = Vec::new();
    for (c, conn) in conns.iter_mut().enumerate() {
        let mut batch = Vec::new();
        let mut want = String::new();
        for i in 0..100 {
            let value = format!("v{c}-{i}");
            batch.extend_from_slice(
                format!("set k{c}-{i} 0 0 {}\r\n{value}\r\n", value.len()).as_bytes(),
            );
            batch.extend_from_slice(format!("get k{c}-{i}\r\n").as_bytes());
            want.push_str(&format!(
                "STORED\r\nVALUE k{c}-{i} 0 {}\r\n{value}\r\nEND\r\n",
                value.len()
            ));
        }
        batch.extend_from_slice(b"mn\r\n");
        conn.send(&batch);
        expected.push(want);
    }
    for (conn, want) in conns.iter_mut().zip(expected) {
        let mut got = conn.read_until(b"MN\r\n");
        got.truncate(got.len() - 4);
        assert_eq!(String::from_utf8_lossy(&got), want, "{mode:?}");
    }

    one.send(b"quit\r\n");
    assert!(one.expect_eof(), "{mode:?}: quit closes the connection");
}

#[test]
fn epoll_loop_proxies_in_order() {
    check(Mode::Epoll);
}

#[test]
fn uring_loop_proxies_in_order() {
    check(Mode::Uring);
}

#[test]
fn uring_loop_with_multishot_recv_proxies_in_order() {
    check(Mode::UringMultishot);
}
