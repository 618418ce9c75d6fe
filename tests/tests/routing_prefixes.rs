//! mcrouter's routing prefixes (`/region/cluster/KEY`) against real memcached: three
//! pools, each carrying a prefix; where a request went is checked by asking each memcached
//! directly.
//!
//! ```text
//!   client ──> memroute ── plain key, /east/web/ ──> east_web      (the default prefix)
//!                       ── /west/web/ ────────────> west_web      (prefix cut)
//!                       ── /east/sessions/ ───────> east_sessions (keep_routing_prefix)
//!                       ── /*/web/ ──> east_web answers; west_web in the background
//! ```
//!
//! Waits are polls of a condition with a deadline (a server's contents).
use std::time::Duration;

use memroute_tests::*;

#[path = "common/binary_client.rs"]
mod binary_client;

/// How long a write sent in the background may take to show up.
const DEADLINE: Duration = Duration::from_secs(5);

struct Setup {
    east_web: Memcached,
    west_web: Memcached,
    sessions: Memcached,
    proxy: Memroute,
    admin: String,
}

fn setup() -> Setup {
    let (east_web, west_web, sessions) =
        (Memcached::start(), Memcached::start(), Memcached::start());
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let toml = format!(
        r#"[proxy]
listen = ["{listen}"]
workers = 1
routing_prefix = "/east/web/"

[admin]
listen = "{admin}"

[pools.east_web]
servers = ["{}"]
routing_prefixes = ["/east/web/"]
timeout = "10s"

[pools.west_web]
servers = ["{}"]
routing_prefixes = ["/west/web/"]
timeout = "10s"

[pools.east_sessions]
servers = ["{}"]
routing_prefixes = ["/east/sessions/"]
keep_routing_prefix = true
timeout = "10s"
"#,
        east_web.addr(),
        west_web.addr(),
        sessions.addr()
    );
    let proxy = Memroute::start(&toml);
    Setup {
        east_web,
        west_web,
        sessions,
        proxy,
        admin,
    }
}

/// The value `key` holds on `server`, asked directly.
fn direct_get(server: &Memcached, key: &str) -> Option<Vec<u8>> {
    server.connect().get(key)
}

fn set_through(c: &mut Conn, key: &str, value: &str) -> Vec<u8> {
    c.roundtrip_line(format!("set {key} 0 0 {}\r\n{value}\r\n", value.len()).as_bytes())
}

#[test]
fn plain_keys_take_the_default_route_and_prefixed_keys_theirs_with_the_prefix_cut() {
    let s = setup();
    let mut c = s.proxy.connect();
    assert_eq!(
        show(&set_through(&mut c, "plain", "p")),
        show(b"STORED\r\n")
    );
    assert_eq!(direct_get(&s.east_web, "plain"), Some(b"p".to_vec()));
    assert_eq!(direct_get(&s.west_web, "plain"), None);

    assert_eq!(
        show(&set_through(&mut c, "/west/web/k", "w")),
        show(b"STORED\r\n")
    );
    assert_eq!(direct_get(&s.west_web, "k"), Some(b"w".to_vec()));
    assert_eq!(direct_get(&s.west_web, "/west/web/k"), None);
    assert_eq!(direct_get(&s.east_web, "k"), None);

    // The default prefix written out goes where plain keys go.
    assert_eq!(
        show(&set_through(&mut c, "/east/web/e", "e")),
        show(b"STORED\r\n")
    );
    assert_eq!(direct_get(&s.east_web, "e"), Some(b"e".to_vec()));

    // keep_routing_prefix: the server gets the key as the client wrote it.
    assert_eq!(
        show(&set_through(&mut c, "/east/sessions/s", "s")),
        show(b"STORED\r\n")
    );
    assert_eq!(
        direct_get(&s.sessions, "/east/sessions/s"),
        Some(b"s".to_vec())
    );
    assert_eq!(direct_get(&s.sessions, "s"), None);

    // Replies carry the client's key.
    c.send(b"get /west/web/k\r\n");
    assert_eq!(
        show(&c.read_get_reply()),
        show(b"VALUE /west/web/k 0 1\r\nw\r\nEND\r\n")
    );
    c.send(b"get /east/sessions/s\r\n");
    assert_eq!(
        show(&c.read_get_reply()),
        show(b"VALUE /east/sessions/s 0 1\r\ns\r\nEND\r\n")
    );
    assert_eq!(
        show(&c.roundtrip_line(b"delete /west/web/k\r\n")),
        show(b"DELETED\r\n")
    );
    assert_eq!(direct_get(&s.west_web, "k"), None);
}

#[test]
fn a_wildcard_write_reaches_every_route_and_the_client_gets_the_first_routes_reply() {
    let s = setup();
    let mut c = s.proxy.connect();
    assert_eq!(
        show(&set_through(&mut c, "/*/web/both", "b")),
        show(b"STORED\r\n")
    );
    assert_eq!(direct_get(&s.east_web, "both"), Some(b"b".to_vec()));
    assert!(
        poll_until(DEADLINE, || direct_get(&s.west_web, "both")
            == Some(b"b".to_vec())),
        "the background copy never reached west_web"
    );
    assert_eq!(direct_get(&s.sessions, "both"), None);

    // `add` where only the default route (east_web, first) already holds the key: the
    // client gets east_web's NOT_STORED although west_web stored it.
    let mut east = s.east_web.connect();
    assert_eq!(
        show(&set_through(&mut east, "taken", "old")),
        show(b"STORED\r\n")
    );
    assert_eq!(
        show(&c.roundtrip_line(b"add /*/web/taken 0 0 3\r\nnew\r\n")),
        show(b"NOT_STORED\r\n")
    );
    assert!(
        poll_until(DEADLINE, || direct_get(&s.west_web, "taken")
            == Some(b"new".to_vec())),
        "west_web never got the add"
    );
    // And the other way round: west_web refuses, east_web answers STORED.
    let mut west = s.west_web.connect();
    assert_eq!(
        show(&set_through(&mut west, "west-only", "old")),
        show(b"STORED\r\n")
    );
    assert_eq!(
        show(&c.roundtrip_line(b"add /*/web/west-only 0 0 3\r\nnew\r\n")),
        show(b"STORED\r\n")
    );
    assert_eq!(direct_get(&s.west_web, "west-only"), Some(b"old".to_vec()));

    // `/*/*/` reaches every route; a get answers from the default route.
    assert_eq!(
        show(&set_through(&mut c, "/*/*/all", "a")),
        show(b"STORED\r\n")
    );
    assert!(poll_until(DEADLINE, || {
        direct_get(&s.west_web, "all") == Some(b"a".to_vec())
            && direct_get(&s.sessions, "/*/*/all") == Some(b"a".to_vec())
    }));
    assert_eq!(direct_get(&s.east_web, "all"), Some(b"a".to_vec()));
    c.send(b"get /*/web/taken\r\n");
    assert_eq!(
        show(&c.read_get_reply()),
        show(b"VALUE /*/web/taken 0 3\r\nold\r\nEND\r\n")
    );
}

#[test]
fn a_prefix_naming_no_route_gets_mcroutes_error_and_the_connection_goes_on() {
    let s = setup();
    let mut c = s.proxy.connect();
    let no_route = b"SERVER_ERROR RootRoute: No rh found\r\n";
    assert_eq!(
        show(&c.roundtrip_line(b"get /north/web/k\r\n")),
        show(no_route)
    );
    assert_eq!(
        show(&c.roundtrip_line(b"set /east/nope/k 0 0 1\r\nx\r\n")),
        show(no_route)
    );
    assert_eq!(
        show(&c.roundtrip_line(b"get /nowhere/*/k\r\n")),
        show(no_route)
    );
    assert_eq!(
        show(&c.roundtrip_line(b"get plain /north/web/k\r\n")),
        show(no_route)
    );
    // noreply: nothing written, the next request answered.
    c.send(b"set /north/web/k 0 0 1 noreply\r\nx\r\n");
    let version = c.roundtrip_line(b"version\r\n");
    assert!(version.starts_with(b"VERSION "), "{}", show(&version));
    // A key that is only a prefix: refused before any server sees an empty key.
    let only = b"CLIENT_ERROR bad command line format\r\n";
    assert_eq!(show(&c.roundtrip_line(b"get /west/web/\r\n")), show(only));
    assert_eq!(
        show(&c.roundtrip_line(b"set /west/web/ 0 0 1\r\nx\r\n")),
        show(only)
    );
    assert_eq!(show(&c.roundtrip_line(b"get a /west/web/\r\n")), show(only));
    // A key with fewer than three slashes has no prefix: a plain key.
    assert_eq!(
        show(&set_through(&mut c, "/one/slash", "o")),
        show(b"STORED\r\n")
    );
    assert_eq!(direct_get(&s.east_web, "/one/slash"), Some(b"o".to_vec()));
}

#[test]
fn a_multi_get_across_prefixes_answers_in_the_clients_order_with_its_keys() {
    let s = setup();
    let mut c = s.proxy.connect();
    for (key, value) in [
        ("/west/web/a", "1"),
        ("b", "2"),
        ("/east/sessions/c", "3"),
        ("/east/web/d", "4"),
        ("/west/web/e", "5"),
    ] {
        assert_eq!(show(&set_through(&mut c, key, value)), show(b"STORED\r\n"));
    }
    c.send(b"get /west/web/a b /west/web/missing /east/sessions/c /east/web/d /west/web/e\r\n");
    assert_eq!(
        show(&c.read_get_reply()),
        show(
            b"VALUE /west/web/a 0 1\r\n1\r\nVALUE b 0 1\r\n2\r\nVALUE /east/sessions/c 0 1\r\n3\r\n\
              VALUE /east/web/d 0 1\r\n4\r\nVALUE /west/web/e 0 1\r\n5\r\nEND\r\n"
        )
    );
    // All of one route: one multi-get, its keys' prefix back in the reply.
    c.send(b"gets /west/web/a /west/web/e\r\n");
    let reply = c.read_get_reply();
    let text = String::from_utf8_lossy(&reply);
    assert!(text.starts_with("VALUE /west/web/a 0 1 "), "{text}");
    assert!(text.contains("\r\nVALUE /west/web/e 0 1 "), "{text}");
    assert!(text.ends_with("\r\n5\r\nEND\r\n"), "{text}");
}

/// A multi-key request with one key whose prefix names no route, as mcrouter answers it:
/// a text multi-get is one error line (its `MultiOpParent` keeps the first error in place
/// of `END` and drops the hits); a `gat`'s routable keys are still touched; binary quiet
/// gets and meta gets are requests of their own, so only that key gets the error.
#[test]
fn a_key_naming_no_route_among_others_gets_the_answer_mcrouter_gives() {
    let s = setup();
    let mut c = s.proxy.connect();
    let no_route = b"SERVER_ERROR RootRoute: No rh found\r\n";
    for (key, value) in [("plain", "p"), ("/west/web/w", "w")] {
        assert_eq!(show(&set_through(&mut c, key, value)), show(b"STORED\r\n"));
    }
    for line in [
        &b"get plain /north/web/k /west/web/w\r\n"[..],
        b"gets /west/web/w /north/web/k\r\n",
        b"get /north/web/k /west/web/\r\n",
    ] {
        assert_eq!(show(&c.roundtrip_line(line)), show(no_route));
    }
    // The first refused key's error is the answer.
    assert_eq!(
        show(&c.roundtrip_line(b"get plain /west/web/ /north/web/k\r\n")),
        show(b"CLIENT_ERROR bad command line format\r\n")
    );
    // gat: the error, and every routable key touched all the same.
    assert_eq!(
        show(&c.roundtrip_line(b"gat 5000 plain /north/web/k /west/web/w\r\n")),
        show(no_route)
    );
    let ttl_set = |server: &Memcached, key: &str| {
        let line = server
            .connect()
            .roundtrip_line(format!("mg {key} t\r\n").as_bytes());
        line.starts_with(b"HD t5000") || line.starts_with(b"HD t4999")
    };
    assert!(poll_until(DEADLINE, || ttl_set(&s.east_web, "plain")));
    assert!(poll_until(DEADLINE, || ttl_set(&s.west_web, "w")));

    // Meta: each mg its own request.
    c.send(b"mg plain v\r\nmg /north/web/k v\r\nmg /west/web/w v\r\nmn\r\n");
    let mut replies = Vec::new();
    for _ in 0..6 {
        replies.extend(c.read_line());
    }
    assert_eq!(
        show(&replies),
        show(b"VA 1\r\np\r\nSERVER_ERROR RootRoute: No rh found\r\nVA 1\r\nw\r\nMN\r\n")
    );

    // Binary quiet gets: the hits, and the error for that key alone, in order.
    const GETKQ: u8 = 0x0d;
    const NOOP: u8 = 0x0a;
    let mut b = s.proxy.connect();
    let mut batch = Vec::new();
    for key in ["/west/web/w", "/north/web/k", "plain", "/west/web/none"] {
        batch.extend(binary_client::frame(GETKQ, key.as_bytes(), b""));
    }
    batch.extend(binary_client::frame(NOOP, b"", b""));
    b.send(&batch);
    let mut answers = Vec::new();
    loop {
        let response = binary_client::read_whole_response(&mut b);
        if response.opcode == NOOP {
            break;
        }
        answers.push((response.status, show(&response.key), show(&response.value)));
    }
    assert_eq!(answers.len(), 3, "{answers:?}");
    assert_eq!(answers[0], (0, show(b"/west/web/w"), show(b"w")));
    // memcached's internal error (0x84), the body mcrouter's message.
    assert_eq!(answers[1].0, 0x84, "{answers:?}");
    assert!(
        answers[1].2.contains("RootRoute: No rh found"),
        "{answers:?}"
    );
    assert_eq!(answers[2], (0, show(b"plain"), show(b"p")));
}

#[test]
fn meta_and_binary_requests_take_prefixes_and_echo_the_clients_key() {
    let s = setup();
    let mut c = s.proxy.connect();
    assert_eq!(
        show(&c.roundtrip_line(b"ms /west/web/m 2 T0\r\nhi\r\n")),
        show(b"HD\r\n")
    );
    assert_eq!(direct_get(&s.west_web, "m"), Some(b"hi".to_vec()));
    c.send(b"mg /west/web/m v k\r\n");
    assert_eq!(show(&c.read_line()), show(b"VA 2 k/west/web/m\r\n"));
    assert_eq!(show(&c.read_line()), show(b"hi\r\n"));
    assert_eq!(
        show(&c.roundtrip_line(b"mg /west/web/none k O7\r\n")),
        show(b"EN k/west/web/none O7\r\n")
    );
    assert_eq!(
        show(&c.roundtrip_line(b"md /west/web/m k q\r\nmn\r\n")),
        show(b"MN\r\n")
    );
    assert_eq!(direct_get(&s.west_web, "m"), None);

    let mut west = s.west_web.connect();
    assert_eq!(
        show(&set_through(&mut west, "bin", "yes")),
        show(b"STORED\r\n")
    );
    let mut b = s.proxy.connect();
    b.send(&binary_client::request(
        binary_client::GETK,
        "/west/web/bin",
    ));
    let response = binary_client::read_whole_response(&mut b);
    assert_eq!(response.status, 0, "{response:?}");
    assert_eq!(show(&response.key), show(b"/west/web/bin"));
    assert_eq!(show(&response.value), show(b"yes"));

    // Quiet getkq across prefixes (batched into one multi-get, split by route): the hits,
    // each with the client's key, in order, then the noop.
    let mut east = s.east_web.connect();
    assert_eq!(
        show(&set_through(&mut east, "plain-bin", "p")),
        show(b"STORED\r\n")
    );
    const GETKQ: u8 = 0x0d;
    const NOOP: u8 = 0x0a;
    let mut batch = Vec::new();
    for key in ["/west/web/bin", "/west/web/missing", "plain-bin"] {
        batch.extend(binary_client::frame(GETKQ, key.as_bytes(), b""));
    }
    batch.extend(binary_client::frame(NOOP, b"", b""));
    b.send(&batch);
    let first = binary_client::read_whole_response(&mut b);
    assert_eq!(
        (first.status, show(&first.key)),
        (0, show(b"/west/web/bin"))
    );
    assert_eq!(show(&first.value), show(b"yes"));
    let second = binary_client::read_whole_response(&mut b);
    assert_eq!((second.status, show(&second.key)), (0, show(b"plain-bin")));
    assert_eq!(show(&second.value), show(b"p"));
    let noop = binary_client::read_whole_response(&mut b);
    assert_eq!(noop.opcode, NOOP, "{noop:?}");
}

#[test]
fn route_lookups_name_the_route_a_prefixed_key_takes() {
    let s = setup();
    let west = s.west_web.addr();
    let mut c = s.proxy.connect();
    c.send(b"get __mcrouter__.route(get,/west/web/k)\r\n");
    let reply = String::from_utf8_lossy(&c.read_get_reply()).into_owned();
    assert!(reply.contains(&west), "{reply}");
    assert!(!reply.contains(&s.east_web.addr()), "{reply}");

    let (code, body) = admin_http(&s.admin, "GET", "/route?key=/west/web/k");
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("routing prefix /west/web/ -> west_web"),
        "{body}"
    );
    assert!(body.contains(&west), "{body}");
    let (_, body) = admin_http(&s.admin, "GET", "/route?key=/*/web/k&op=set");
    assert!(body.contains("-> east_web"), "{body}");
    assert!(body.contains("west_web"), "{body}");
    assert!(body.contains("background"), "{body}");
    let (_, body) = admin_http(&s.admin, "GET", "/route?key=/north/web/k");
    assert!(body.contains("No rh found"), "{body}");

    // The panel's state lists each prefix with its route and the key its servers get.
    let (code, body) = admin_http(&s.admin, "GET", "/state");
    assert_eq!(code, 200, "{body}");
    let state: serde_json::Value = serde_json::from_str(&body).expect("state is JSON");
    let prefixes = state["routing_prefixes"]
        .as_array()
        .expect("routing_prefixes");
    let row = |prefix: &str| {
        prefixes
            .iter()
            .find(|p| p["prefix"] == prefix)
            .unwrap_or_else(|| panic!("no {prefix} in {prefixes:?}"))
    };
    assert_eq!(row("/west/web/")["route"], "west_web");
    assert_eq!(row("/west/web/")["key_sent"], "without the prefix");
    assert_eq!(row("/east/sessions/")["key_sent"], "with the prefix");
    assert_eq!(state["listeners"][0]["routing_prefix"], "/east/web/");
    assert_eq!(state["listeners"][0]["route"], "east_web");

    let out = run_memroute_cli(
        &[
            "route".as_ref(),
            "--config".as_ref(),
            s.proxy.config_path().as_os_str(),
            "/east/sessions/k".as_ref(),
            "plain".as_ref(),
        ],
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "{}", out.stderr);
    assert!(
        out.stdout
            .contains("/east/sessions/k: routing prefix /east/sessions/ -> east_sessions"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("plain: east_web"), "{}", out.stdout);
}

#[test]
fn without_routing_prefixes_a_slashed_key_is_just_a_key() {
    let server = Memcached::start();
    let proxy = Memroute::start_pool(&[server.addr()]);
    let mut c = proxy.connect();
    assert_eq!(
        show(&set_through(&mut c, "/a/b/k", "v")),
        show(b"STORED\r\n")
    );
    assert_eq!(direct_get(&server, "/a/b/k"), Some(b"v".to_vec()));
    c.send(b"get /a/b/k /*/*/k\r\n");
    assert_eq!(
        show(&c.read_get_reply()),
        show(b"VALUE /a/b/k 0 1\r\nv\r\nEND\r\n")
    );
}
