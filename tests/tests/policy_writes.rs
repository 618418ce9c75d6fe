//! Single-key writes through replicated and failover routes over pools, which memroute
//! sends as a plain pool's requests (one leg per replica, judged by the write policy in
//! place; a failover's first pool tried first), against real memcached. Each answer is
//! compared with the route executor's, which still runs a replicated route whose child is a
//! route: the same reply text, the same route stats.
//!
//! ```text
//!   test ──> memroute ──replicated (pools a, b[, c])──> memcached a, b[, c]
//!                     └─replicated (a, route → b)────> the executor's path, for comparison
//!                     └─failover (fake, a)──────────> a fake that answers SERVER_ERROR
//! ```
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};

use memroute_tests::*;

fn pool(name: &str, server: &str) -> String {
    pool_section(name, &[server.to_string()], "timeout = \"500ms\"")
}

fn line(c: &mut Conn, request: &str) -> String {
    String::from_utf8_lossy(&c.roundtrip_line(request.as_bytes())).into_owned()
}

fn replicated(name: &str, children: &[&str], writes: &str) -> String {
    let children: Vec<String> = children.iter().map(|c| format!("{c:?}")).collect();
    format!(
        "[routes.{name}]\ntype = \"replicated\"\nchildren = [{}]\nwrites = \"{writes}\"\n\n",
        children.join(", ")
    )
}

fn route_stat(proxy: &Memroute, route: &str, name: &str) -> u64 {
    stat_u64(&proxy.stats(), &format!("route:{route}:{name}")).unwrap_or(0)
}

#[test]
fn a_replicated_all_sync_set_with_a_replica_down_answers_as_the_executor_does() {
    let a = Memcached::start();
    let mut b = Memcached::start();
    let c = Memcached::start();
    // `fast`: every child a pool (the session's legs). `exec`: the second child is a
    // random route over pool b alone, so the write runs on the executor.
    let proxy = Memroute::start_routes(
        "root",
        &[
            pool("a", &a.addr()),
            pool("b", &b.addr()),
            pool("c", &c.addr()),
            "[routes.root]\ntype = \"prefix\"\nprefixes = { \"x:\" = \"exec\", \"m:\" = \"majority\" }\ndefault = \"fast\"\n\n"
                .to_string(),
            replicated("fast", &["a", "b"], "all-sync"),
            replicated("exec", &["a", "only_b"], "all-sync"),
            "[routes.only_b]\ntype = \"random\"\nchildren = [\"b\"]\n\n".to_string(),
            replicated("majority", &["a", "b", "c"], "all-majority"),
        ],
    );
    let mut client = proxy.connect();
    assert_eq!(line(&mut client, "set k 0 0 1\r\nx\r\n"), "STORED\r\n");
    assert_eq!(line(&mut client, "set x:k 0 0 1\r\nx\r\n"), "STORED\r\n");
    assert_eq!(b.connect().get("k").as_deref(), Some(&b"x"[..]));
    assert_eq!(b.connect().get("x:k").as_deref(), Some(&b"x"[..]));

    b.kill();
    let failed = "SERVER_ERROR replicated write failed on 1 of 2 replicas (all-sync)\r\n";
    for attempt in 0..3 {
        assert_eq!(
            line(&mut client, "set k 0 0 1\r\ny\r\n"),
            failed,
            "fast path, attempt {attempt}\n{}",
            proxy.log_text()
        );
        assert_eq!(
            line(&mut client, "set x:k 0 0 1\r\ny\r\n"),
            failed,
            "executor, attempt {attempt}"
        );
    }
    // The replica that answered was written all the same.
    assert_eq!(a.connect().get("k").as_deref(), Some(&b"y"[..]));
    assert_eq!(route_stat(&proxy, "fast", "write_failures"), 3);
    assert_eq!(route_stat(&proxy, "exec", "write_failures"), 3);
    // noreply: nothing comes back, the failure is counted; the next request still answers.
    client.send(b"set k 0 0 1 noreply\r\nz\r\n");
    assert_eq!(line(&mut client, "get k\r\n"), "VALUE k 0 1\r\n");
    assert_eq!(client.read_line(), b"z\r\n");
    assert_eq!(client.read_line(), b"END\r\n");
    assert_eq!(route_stat(&proxy, "fast", "write_failures"), 4);

    // all-majority over three: two of three answered is a majority.
    assert_eq!(line(&mut client, "set m:k 0 0 3\r\nyes\r\n"), "STORED\r\n");
    assert_eq!(c.connect().get("m:k").as_deref(), Some(&b"yes"[..]));
    assert_eq!(route_stat(&proxy, "majority", "write_failures"), 0);
}

#[test]
fn a_write_through_a_replicated_route_is_seen_by_the_get_pipelined_behind_it() {
    let a = Memcached::start();
    let b = Memcached::start();
    let policies = ["all-sync", "all-initial", "all-majority", "all-async"];
    let mut sections = vec![pool("a", &a.addr()), pool("b", &b.addr())];
    let prefixes: Vec<String> = policies
        .iter()
        .map(|p| format!("\"{p}:\" = \"{p}\""))
        .collect();
    sections.push(format!(
        "[routes.root]\ntype = \"prefix\"\nprefixes = {{ {} }}\ndefault = \"all-sync\"\n\n",
        prefixes.join(", ")
    ));
    for policy in policies {
        sections.push(replicated(policy, &["a", "b"], policy));
    }
    let proxy = Memroute::start_routes("root", &sections);
    let mut client = proxy.connect();
    for policy in policies {
        // 50 set/get pairs in one write: each get must see the set before it.
        let mut batch = String::new();
        for i in 0..50 {
            let value = format!("{policy}-{i}");
            batch += &format!(
                "set {policy}:k 0 0 {}\r\n{value}\r\nget {policy}:k\r\n",
                value.len()
            );
        }
        client.send(batch.as_bytes());
        for i in 0..50 {
            let value = format!("{policy}-{i}");
            assert_eq!(client.read_line(), b"STORED\r\n", "{policy} set {i}");
            let reply = client.read_get_reply();
            assert_eq!(
                show(&reply),
                show(
                    format!("VALUE {policy}:k 0 {}\r\n{value}\r\nEND\r\n", value.len()).as_bytes()
                ),
                "{policy}: get {i} pipelined behind its set"
            );
        }
        // Every replica was written. The gets above read from a (reads fail over, a
        // first), so b's copy of an acknowledged-early write (all-async, and the slower
        // replica of all-initial / all-majority) may still be on its way: wait for it
        // with a deadline instead of assuming it landed.
        let last = format!("{policy}-49");
        for (name, server) in [("a", &a), ("b", &b)] {
            let key = format!("{policy}:k");
            let holds_last = || server.connect().get(&key).as_deref() == Some(last.as_bytes());
            assert!(
                poll_until(std::time::Duration::from_secs(5), holds_last),
                "{policy}: replica {name} holds {:?}, expected {last}",
                server.connect().get(&key).map(|v| show(&v))
            );
        }
    }
}

/// A fake memcached that answers every request with `SERVER_ERROR busy` (a fault a real
/// server does not produce on demand): the request was received, so a failover must not
/// repeat a non-idempotent one elsewhere. Storage commands' data blocks are read whole.
fn busy_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind fake server");
    let addr = listener.local_addr().expect("fake address").to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            std::thread::spawn(move || answer_busy(stream));
        }
    });
    addr
}

fn answer_busy(stream: TcpStream) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut request = String::new();
    loop {
        request.clear();
        match reader.read_line(&mut request) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let tokens: Vec<&str> = request.split_whitespace().collect();
        let data = match tokens.first().copied() {
            Some("set" | "add" | "replace" | "append" | "prepend" | "cas") => {
                tokens.get(4).and_then(|n| n.parse::<usize>().ok())
            }
            _ => None,
        };
        if let Some(length) = data {
            let mut block = vec![0u8; length + 2];
            if reader.read_exact(&mut block).is_err() {
                return;
            }
        }
        let reply: &[u8] = match tokens.first().copied() {
            Some("version") => b"VERSION 1.6.0\r\n",
            _ => b"SERVER_ERROR busy\r\n",
        };
        if writer.write_all(reply).is_err() {
            return;
        }
    }
}

#[test]
fn a_failover_write_moves_on_only_when_it_may_be_repeated() {
    let a = Memcached::start();
    let mut gone = Memcached::start();
    let gone_addr = gone.addr();
    gone.kill();
    let busy = busy_server();
    let proxy = Memroute::start_routes(
        "root",
        &[
            pool("busy", &busy),
            pool("gone", &gone_addr),
            pool("a", &a.addr()),
            "[routes.root]\ntype = \"prefix\"\nprefixes = { \"g:\" = \"after_gone\" }\ndefault = \"after_busy\"\n\n"
                .to_string(),
            "[routes.after_busy]\ntype = \"failover\"\nchildren = [\"busy\", \"a\"]\n\n".to_string(),
            "[routes.after_gone]\ntype = \"failover\"\nchildren = [\"gone\", \"a\"]\n\n".to_string(),
        ],
    );
    let mut client = proxy.connect();
    // A set may be repeated: the busy server's error sends it on to a.
    assert_eq!(line(&mut client, "set n 0 0 1\r\n5\r\n"), "STORED\r\n");
    assert_eq!(a.connect().get("n").as_deref(), Some(&b"5"[..]));
    assert_eq!(route_stat(&proxy, "after_busy", "failovers"), 1);
    // incr and append reached the busy server: they are not repeated on a.
    assert_eq!(line(&mut client, "incr n 1\r\n"), "SERVER_ERROR busy\r\n");
    assert_eq!(
        line(&mut client, "append n 0 0 1\r\n0\r\n"),
        "SERVER_ERROR busy\r\n"
    );
    assert_eq!(a.connect().get("n").as_deref(), Some(&b"5"[..]));
    assert_eq!(route_stat(&proxy, "after_busy", "failovers"), 1);
    // Pipelined, the same answers in order.
    client.send(b"set n 0 0 1\r\n7\r\nincr n 1\r\nget n\r\n");
    assert_eq!(client.read_line(), b"STORED\r\n");
    assert_eq!(client.read_line(), b"SERVER_ERROR busy\r\n");
    // A read is always repeatable: the busy server's error sends it on to a.
    assert_eq!(client.read_get_reply(), b"VALUE n 0 1\r\n7\r\nEND\r\n");

    // A first pool that is down never received the request: even incr moves on.
    assert_eq!(line(&mut client, "set g:n 0 0 1\r\n5\r\n"), "STORED\r\n");
    assert_eq!(line(&mut client, "incr g:n 1\r\n"), "6\r\n");
    assert_eq!(a.connect().get("g:n").as_deref(), Some(&b"6"[..]));
    assert_eq!(route_stat(&proxy, "after_gone", "failovers"), 2);
}

/// Pipelined writes of one key that all fail on a failover's first pool reach the next
/// pool in the client's order, so the last write wins there as it would on one server.
/// (Found in review: the session moved on the requests behind the head before the head
/// itself, so when several first answers failed in one wake-up a later `set` was sent on
/// before an earlier one and `a` kept a stale value after every `set` answered STORED.)
#[test]
fn pipelined_failover_writes_reach_the_next_pool_in_order() {
    let a = Memcached::start();
    let busy = busy_server();
    let proxy = Memroute::start_routes(
        "root",
        &[
            pool("busy", &busy),
            pool("a", &a.addr()),
            "[routes.root]\ntype = \"failover\"\nchildren = [\"busy\", \"a\"]\n\n".to_string(),
        ],
    );
    let mut client = proxy.connect();
    for round in 0..20 {
        let mut pipeline = Vec::new();
        for i in 0..20 {
            let value = format!("{round}-{i}");
            pipeline
                .extend_from_slice(format!("set k 0 0 {}\r\n{value}\r\n", value.len()).as_bytes());
        }
        client.send(&pipeline);
        for _ in 0..20 {
            assert_eq!(client.read_line(), b"STORED\r\n");
        }
        let last = format!("{round}-19");
        assert_eq!(
            a.connect().get("k").as_deref(),
            Some(last.as_bytes()),
            "round {round}: the next pool holds an earlier write"
        );
    }
}
