//! Command lines memcached would choke on when they share a pipelined backend connection:
//! memcached closes a connection holding more than 2048 bytes of a line without its newline
//! (unless it is a get/gets). memroute rebuilds padded lines and cuts gat batches by bytes,
//! so no backend connection is ever reset by one client's long line.
use memroute_tests::*;

fn stat(conn: &mut Conn, name: &str) -> u64 {
    conn.stats()
        .into_iter()
        .filter(|(k, _)| k.starts_with("server:") && k.ends_with(name))
        .map(|(_, v)| v.parse::<u64>().expect("numeric stat"))
        .sum()
}

#[test]
fn padded_lines_and_long_gat_batches_do_not_reset_backend_connections() {
    let server = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&pool_config(
        &listen,
        &[server.addr()],
        "ketama",
        "fnv1a_64",
        "",
    ));
    let mut client = proxy.connect();

    // A set whose line is padded past 2048 bytes is stored, like memcached stores it
    // when the whole line arrives at once.
    let padded = format!("set padded{}0 0 2\r\nok\r\n", " ".repeat(3000));
    assert_eq!(client.roundtrip_line(padded.as_bytes()), b"STORED\r\n");
    assert_eq!(
        client.roundtrip_lines(b"get padded\r\n", 3),
        b"VALUE padded 0 2\r\nok\r\nEND\r\n"
    );

    // A gat over 100 keys of 40 bytes (a 4 KB line), pipelined with single-key gets from
    // another client, many times over: every reply is whole and no backend connection errs.
    let keys: Vec<String> = (0..100).map(|i| format!("long-gat-key-{i:027}")).collect();
    for key in &keys {
        client.set(key, b"v");
    }
    let gat = format!("gat 100 {}\r\n", keys.join(" "));
    let expected: String = keys
        .iter()
        .map(|k| format!("VALUE {k} 0 1\r\nv\r\n"))
        .collect::<String>()
        + "END\r\n";
    let mut other = proxy.connect();
    for round in 0..50 {
        let gets: String = (0..20).map(|_| "get padded\r\n").collect();
        other.send(gets.as_bytes());
        let reply = client.roundtrip_lines(gat.as_bytes(), 201);
        assert_eq!(String::from_utf8_lossy(&reply), expected, "round {round}");
        for _ in 0..20 {
            assert_eq!(other.read_get_reply(), b"VALUE padded 0 2\r\nok\r\nEND\r\n");
        }
    }
    assert_eq!(
        stat(&mut client, ":errors"),
        0,
        "a backend connection failed"
    );

    // Meta commands too: a padded mg is rebuilt and answered.
    let mg = format!("mg padded{}v\r\n", " ".repeat(2500));
    assert_eq!(client.roundtrip_lines(mg.as_bytes(), 2), b"VA 2\r\nok\r\n");
    assert_eq!(
        stat(&mut client, ":errors"),
        0,
        "a backend connection failed"
    );
}
