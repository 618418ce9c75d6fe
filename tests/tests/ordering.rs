//! One client's pipelined requests reach memcached in the client's order, also when memroute
//! keeps several connections per server (`connections = 4`) and through a policy route.
//! memcached serves its connections on different threads: a `set` and the `get` behind it
//! sent on two connections can run in either order, so each client session must stick to
//! one connection.
use memroute_tests::*;

/// Pipelines `rounds` pairs of `set kN` + `get kN` in one write and counts the gets that did
/// not see their own set.
fn stale_reads(proxy: &Memroute, rounds: usize, prefix: &str) -> usize {
    let mut c = proxy.connect();
    let mut batch = Vec::new();
    for i in 0..rounds {
        let value = format!("v{i}");
        batch.extend_from_slice(
            format!(
                "set {prefix}{i} 0 0 {}\r\n{value}\r\nget {prefix}{i}\r\n",
                value.len()
            )
            .as_bytes(),
        );
    }
    c.send(&batch);
    let mut stale = 0;
    for i in 0..rounds {
        assert_eq!(c.read_line(), b"STORED\r\n", "set {prefix}{i}");
        let reply = c.read_get_reply();
        let expected = format!(
            "VALUE {prefix}{i} 0 {}\r\nv{i}\r\nEND\r\n",
            format!("v{i}").len()
        );
        if reply != expected.as_bytes() {
            stale += 1;
        }
    }
    stale
}

#[test]
fn pipelined_set_then_get_sees_the_set_with_several_connections_per_server() {
    let server = Memcached::start();
    let replica = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let toml = format!(
        "{}\n{}\n{}\n[routes.root]\ntype = \"prefix\"\nprefixes = {{ \"r:\" = \"rep\" }}\ndefault = \"main\"\n\
         [routes.rep]\ntype = \"replicated\"\nchildren = [\"main\", \"other\"]\n",
        proxy_section(&listen, "root"),
        pool_section("main", &[server.addr()], "connections = 4"),
        pool_section("other", &[replica.addr()], "connections = 4"),
    );
    let proxy = Memroute::start(&toml);
    // Each client session sticks to one of the 4 connections (the second client gets the
    // next slot); before that, requests took turns over the connections.
    let plain = stale_reads(&proxy, 400, "k");
    let replicated = stale_reads(&proxy, 200, "r:");
    println!("ordering: stale reads with connections = 4: plain pool {plain}/400, replicated route {replicated}/200");
    assert_eq!(
        plain, 0,
        "gets that ran before the set pipelined ahead of them"
    );
    assert_eq!(replicated, 0, "through a replicated route");
}
