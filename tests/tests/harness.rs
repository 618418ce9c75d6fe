//! Checks the harness itself against memcached alone: the differential scripts give identical
//! bytes on two fresh memcached servers (so a difference through memroute is memroute's), and
//! the process helpers start, kill and restart servers.
use memroute_tests::scripts::{self, compare, Side};
use memroute_tests::*;

#[test]
fn scripts_are_deterministic_between_two_fresh_memcached() {
    let all = [
        scripts::text_scripts(),
        scripts::meta_scripts(),
        scripts::bad_input_scripts(),
    ]
    .concat();
    let mut failures = Vec::new();
    for script in &all {
        // Fresh servers per script, so cas uniques and state start equal on both sides.
        let a = Memcached::start();
        let b = Memcached::start();
        let mut sa = Side::new(a.connect());
        let mut sb = Side::new(b.connect());
        if let Err(e) = compare(script, &mut sa, &mut sb) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn memcached_kill_and_restart_on_the_same_port() {
    let mut mc = Memcached::start();
    mc.connect().set("k", b"v");
    let port = mc.port;
    mc.kill();
    assert!(
        std::net::TcpStream::connect(mc.addr()).is_err(),
        "killed memcached still accepts"
    );
    mc.restart();
    assert_eq!(mc.port, port);
    assert_eq!(
        mc.connect().get("k"),
        None,
        "a restarted memcached starts empty"
    );
}

#[test]
fn nutcracker_proxies_to_memcached() {
    let mc = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let nc = Nutcracker::start(&format!(
        "pool:\n  listen: {listen}\n  hash: fnv1a_64\n  distribution: ketama\n  timeout: 2000\n  servers:\n   - {}:1\n",
        mc.addr()
    ));
    let mut c = nc.connect();
    c.set("through-nutcracker", b"yes");
    assert_eq!(
        mc.connect().get("through-nutcracker").as_deref(),
        Some(&b"yes"[..])
    );
}

#[test]
fn conn_reads_framed_replies() {
    let mc = Memcached::start();
    let mut c = mc.connect();
    c.set("a", b"1\r\n2");
    c.send(b"get a a\r\n");
    let reply = c.read_get_reply();
    assert_eq!(
        show(&reply),
        show(b"VALUE a 0 4\r\n1\r\n2\r\nVALUE a 0 4\r\n1\r\n2\r\nEND\r\n")
    );
    assert_eq!(
        c.roundtrip_lines(b"set b 0 0 1\r\nx\r\nget b\r\n", 4),
        b"STORED\r\nVALUE b 0 1\r\nx\r\nEND\r\n"
    );
    assert_eq!(
        c.roundtrip_fenced(b"get b\r\n").expect("fenced get"),
        b"VALUE b 0 1\r\nx\r\nEND\r\n"
    );
    c.send(b"quit\r\n");
    assert!(c.expect_eof(), "memcached closes on quit");
}
