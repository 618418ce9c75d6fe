//! Hostile clients must not crash memroute: after each abuse a second connection is served.
use memroute_tests::*;

/// Sends `bytes` on a fresh connection, reads whatever comes back until memroute answers or
/// closes (bounded by the read timeout), closes; then checks memroute is alive and serving.
fn abuse_then_check(proxy: &mut Memroute, what: &str, bytes: &[u8], half_close: bool) {
    {
        let mut c = proxy.connect();
        // memroute may close the connection mid-write on garbage: that is allowed.
        let _ = c.try_send(bytes);
        if !half_close {
            // Drain what memroute says (or its close) so the abuse is fully processed.
            let _ =
                c.read_until_with(|b| (!b.is_empty() && b.ends_with(b"\r\n")).then_some(b.len()));
        }
    }
    assert!(
        proxy.is_running(),
        "memroute died after {what}\n{}",
        proxy.log_text()
    );
    let mut c = proxy.connect();
    c.set("alive", what.as_bytes());
    assert_eq!(
        c.get("alive").as_deref(),
        Some(what.as_bytes()),
        "after {what}"
    );
}

#[test]
fn garbage_and_half_requests_do_not_crash() {
    let backend = Memcached::start();
    let mut proxy = Memroute::start_pool(&[backend.addr()]);

    // Deterministic "random" junk: a xorshift stream covering every byte value, NULs included.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let junk: Vec<u8> = (0..64 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("binary junk", junk.clone(), false),
        (
            "binary protocol magic",
            [
                0x80u8, 0x00, 0x00, 0x05, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                0,
            ]
            .repeat(4),
            false,
        ),
        (
            "garbage lines",
            b"\x00\x01\x02\r\n\xff\xfe\r\n   \r\n\t\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            false,
        ),
        ("a 2 MiB line without newline", vec![b'a'; 2 << 20], false),
        (
            "a 2 MiB get line",
            [b"get ".as_slice(), &b"k ".repeat(1 << 20), b"\r\n"].concat(),
            false,
        ),
        (
            "a huge length",
            b"set k 0 0 99999999999999999999\r\n".to_vec(),
            false,
        ),
        ("half a command line", b"get half".to_vec(), true),
        (
            "half a data block",
            b"set k 0 0 100\r\nonly-some".to_vec(),
            true,
        ),
        ("half a meta set", b"ms k 10 T0\r\nabc".to_vec(), true),
        ("junk then close", junk[..1000].to_vec(), true),
        ("many pipelined errors", b"bogus\r\n".repeat(10_000), false),
    ];
    for (what, bytes, half_close) in &cases {
        abuse_then_check(&mut proxy, what, bytes, *half_close);
    }
}

#[test]
fn many_connections_opened_and_dropped() {
    let backend = Memcached::start();
    let mut proxy = Memroute::start_pool(&[backend.addr()]);
    for i in 0..200 {
        let mut c = proxy.connect();
        if i % 2 == 0 {
            c.send(b"get k\r\n");
        }
        // dropped without reading: memroute must cope with the peer vanishing
    }
    abuse_then_check(&mut proxy, "connection churn", b"mn\r\n", false);
}

/// What a connection got for `line`: the bytes before the peer closed, and whether it
/// closed (read to end of stream, bounded by the read timeout); for a line that is
/// answered, the answer (fenced by `mn`) and no close.
fn answer_to(mut c: Conn, line: &[u8]) -> (Vec<u8>, bool) {
    let mut bytes = line.to_vec();
    bytes.extend_from_slice(b"mn\r\n");
    c.send(&bytes);
    match c.read_until_with(|b| find(b, b"MN\r\n").map(|at| at + 4)) {
        Ok(reply) => (reply, false),
        Err(e) => (e.partial, e.eof),
    }
}

/// memcached hangs up without a word on an HTTP request line (t/malicious-commands.t: a web
/// page must not make a browser talk to a cache on localhost), and answers `ERROR` to lines
/// that only look alike. memroute must do the same, byte for byte and close for close.
#[test]
fn http_request_lines_are_hung_up_on_as_memcached_does() {
    let reference = Memcached::start();
    let backend = Memcached::start();
    let mut proxy = Memroute::start_pool(&[backend.addr()]);
    let lines: [&[u8]; 9] = [
        // memcached's own three.
        b"GET / HTTP/1.0\r\n",
        b"PUT /asdf/asd/fasdfasdf/sadf HTTP/1.1\r\n",
        b"DELETE HTTP/1.1\r\n",
        // What a browser's form post starts with: the rest must never be read as commands.
        b"POST /x HTTP/1.1\r\nHost: localhost\r\n\r\nset k 0 0 1\r\n",
        b"HTTP/1.1\r\n",
        // Answered ERROR: the last word is not HTTP/..., or memcached dispatched the name
        // earlier (by its first letter).
        b"PUT /x HTTP\r\n",
        b"GET / HTTP/1.0 x\r\n",
        b"gx / HTTP/1.1\r\n",
        b"delete_all HTTP/1.1\r\n",
    ];
    let mut closes = 0;
    for line in lines {
        let want = answer_to(reference.connect(), line);
        let got = answer_to(proxy.connect(), line);
        assert_eq!(
            (show(&got.0), got.1),
            (show(&want.0), want.1),
            "{} (memroute, then memcached)",
            show(line)
        );
        closes += usize::from(want.1);
    }
    assert_eq!(closes, 5, "memcached hung up on the HTTP lines only");
    assert!(proxy.is_running());
    let mut c = proxy.connect();
    c.set("after-http", b"served");
    assert_eq!(c.get("after-http").as_deref(), Some(&b"served"[..]));
}
