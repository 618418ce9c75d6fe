//! The live watch of requests: `GET /watch` on the admin port and `memroute watch` stream the
//! requests real memcached answered (sets, hits, misses, errors) as JSON lines, filtered by
//! key prefix and route, ended by `limit`; keys hidden under `show_keys = false`; a token
//! required when one is set; sampling off once the watch closes (seen in
//! `memroute_watch_requests_examined_total`); a watcher that does not read dropped while
//! client traffic goes on.
use std::io::Read as _;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use memroute_tests::*;
use serde_json::Value;

/// A pool `main`, a pool `other` for keys `o:...`, a pool `dead` (a port nobody listens on)
/// for keys `d:...`, under the prefix route `by_prefix`; `[admin]` with `admin_extra`.
fn config(listen: &str, admin: &str, main: &str, other: &str, admin_extra: &str) -> String {
    let dead = format!("127.0.0.1:{}", free_port());
    format!(
        "[proxy]\nlisten = [\"{listen}\"]\nworkers = 2\nroute = \"by_prefix\"\n\n\
         [pools.main]\nservers = [\"{main}\"]\ntimeout = \"10s\"\n\n\
         [pools.other]\nservers = [\"{other}\"]\ntimeout = \"10s\"\n\n\
         [pools.dead]\nservers = [\"{dead}\"]\ntimeout = \"2s\"\n\n\
         [routes.by_prefix]\ntype = \"prefix\"\nprefixes = {{ \"o:\" = \"other\", \"d:\" = \"dead\" }}\ndefault = \"main\"\n\n\
         [admin]\nlisten = \"{admin}\"\n{admin_extra}"
    )
}

struct Setup {
    main: Memcached,
    other: Memcached,
    proxy: Memroute,
    admin: String,
}

fn start(admin_extra: &str) -> Setup {
    let main = Memcached::start();
    let other = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&config(
        &listen,
        &admin,
        &main.addr(),
        &other.addr(),
        admin_extra,
    ));
    Setup {
        main,
        other,
        proxy,
        admin,
    }
}

/// The value of an unlabelled metric (or the one labelled `labels`, `reason="rate_cap"`).
fn metric(admin: &str, name: &str, labels: &str) -> u64 {
    let (code, body) = admin_http(admin, "GET", "/metrics");
    assert_eq!(code, 200, "{body}");
    let series = match labels {
        "" => format!("{name} "),
        labels => format!("{name}{{{labels}}} "),
    };
    body.lines()
        .find_map(|line| line.strip_prefix(&series))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {series} in /metrics:\n{body}")) as u64
}

/// An open `GET /watch`, read line by line through its chunked body.
struct Watch {
    conn: Conn,
    /// Body bytes of the chunks read so far, not yet returned as lines.
    partial: Vec<u8>,
    ended: bool,
}

impl Watch {
    /// Opens `/watch?query` and returns the status and, for a 200, the watch.
    fn open(admin: &str, query: &str, token: Option<&str>) -> (u16, Result<Watch, String>) {
        let mut conn = Conn::connect(admin);
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        conn.send(format!("GET /watch?{query} HTTP/1.1\r\nHost: {admin}\r\n{auth}\r\n").as_bytes());
        let head = String::from_utf8(conn.read_until(b"\r\n\r\n")).expect("head");
        let code: u16 = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .expect("status");
        if code != 200 {
            return (code, Err(head));
        }
        assert!(
            head.to_ascii_lowercase().contains("application/x-ndjson"),
            "{head}"
        );
        let watch = Watch {
            conn,
            partial: Vec::new(),
            ended: false,
        };
        (code, Ok(watch))
    }

    /// The next line as JSON; `None` once the body ended. Panics after IO_TIMEOUT.
    fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(at) = self.partial.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.partial.drain(..=at).collect();
                let text = String::from_utf8(line).expect("UTF-8 line");
                return Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")));
            }
            if self.ended {
                return None;
            }
            let size = String::from_utf8(self.conn.read_line()).expect("chunk size");
            let size = usize::from_str_radix(size.trim(), 16).expect("hex chunk size");
            if size == 0 {
                self.conn.read_until(b"\r\n");
                self.ended = true;
                continue;
            }
            let data = self.conn.read_for(size + 2);
            self.partial.extend_from_slice(&data[..size]);
        }
    }
}

fn field<'a>(line: &'a Value, name: &str) -> &'a str {
    line[name]
        .as_str()
        .unwrap_or_else(|| panic!("no {name} in {line}"))
}

#[test]
fn watch_streams_sets_hits_misses_and_errors_filtered_by_key_prefix_until_its_limit() {
    let setup = start("");
    let (code, watch) = Watch::open(&setup.admin, "key_prefix=w%3A&limit=6&rate=1000", None);
    assert_eq!(code, 200);
    let mut watch = watch.expect("watch");
    let mut c = setup.proxy.connect();
    assert_eq!(c.roundtrip_line(b"set w:a 0 0 1\r\n7\r\n"), b"STORED\r\n");
    // Not under the prefix: no line.
    assert_eq!(c.roundtrip_line(b"set x:a 0 0 1\r\n1\r\n"), b"STORED\r\n");
    c.send(b"get w:a\r\n");
    assert_eq!(c.read_get_reply(), b"VALUE w:a 0 1\r\n7\r\nEND\r\n");
    c.send(b"get w:nope\r\n");
    assert_eq!(c.read_get_reply(), b"END\r\n");
    c.send(b"get w:a w:nope\r\n");
    assert_eq!(c.read_get_reply(), b"VALUE w:a 0 1\r\n7\r\nEND\r\n");
    // An error memcached itself gives: incr of a value that is not a number.
    assert_eq!(
        c.roundtrip_line(b"set w:text 0 0 3\r\nabc\r\n"),
        b"STORED\r\n"
    );
    let incr = c.roundtrip_line(b"incr w:text 1\r\n");
    assert!(incr.starts_with(b"CLIENT_ERROR"), "{}", show(&incr));
    // Past the limit: no line.
    c.send(b"get w:a\r\n");
    c.read_get_reply();

    let lines: Vec<Value> = std::iter::from_fn(|| watch.next()).collect();
    let summary: Vec<(&str, &str, &str)> = lines
        .iter()
        .map(|l| (field(l, "command"), field(l, "key"), field(l, "result")))
        .collect();
    assert_eq!(
        summary,
        [
            ("set", "w:a", "stored"),
            ("get", "w:a", "hit"),
            ("get", "w:nope", "miss"),
            ("get", "w:a", "1 of 2 hit"),
            ("set", "w:text", "stored"),
            (
                "incr",
                "w:text",
                std::str::from_utf8(&incr).expect("text").trim_end()
            ),
        ]
    );
    for line in &lines {
        assert!(field(line, "client").starts_with("127.0.0.1:"), "{line}");
        assert_eq!(field(line, "route"), "main", "{line}");
        assert_eq!(field(line, "server"), setup.main.addr(), "{line}");
        assert!(field(line, "time").ends_with('Z'), "{line}");
        assert!(line["latency_us"].as_u64().is_some(), "{line}");
    }
    assert_eq!(lines[3]["keys"], 2, "{}", lines[3]);
    // The watch ended with its limit: nobody watches, and every line was counted.
    assert!(poll_until(IO_TIMEOUT, || metric(
        &setup.admin,
        "memroute_watch_watchers",
        ""
    ) == 0));
    assert_eq!(
        metric(&setup.admin, "memroute_watch_lines_sent_total", ""),
        6
    );
}

#[test]
fn watch_filters_by_route_and_names_a_dead_servers_error() {
    let setup = start("");
    let (_, watch) = Watch::open(&setup.admin, "route=other&limit=2", None);
    let mut other = watch.expect("watch");
    let (_, watch) = Watch::open(&setup.admin, "route=dead&limit=1", None);
    let mut dead = watch.expect("watch");
    // The listener's root route takes every request.
    let (_, watch) = Watch::open(&setup.admin, "route=by_prefix&limit=3", None);
    let mut root = watch.expect("watch");
    let mut c = setup.proxy.connect();
    assert_eq!(c.roundtrip_line(b"set w:1 0 0 1\r\n1\r\n"), b"STORED\r\n");
    assert_eq!(c.roundtrip_line(b"set o:1 0 0 1\r\n1\r\n"), b"STORED\r\n");
    c.send(b"mg o:1 v\r\n");
    assert_eq!(c.read_until(b"\r\n1\r\n"), b"VA 1\r\n1\r\n");
    let refused = c.roundtrip_line(b"set d:1 0 0 1\r\n1\r\n");
    assert!(refused.starts_with(b"SERVER_ERROR"), "{}", show(&refused));

    let lines: Vec<Value> = std::iter::from_fn(|| other.next()).collect();
    let summary: Vec<(&str, &str, &str, &str)> = lines
        .iter()
        .map(|l| {
            let route = field(l, "route");
            (
                field(l, "command"),
                field(l, "key"),
                field(l, "result"),
                route,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("set", "o:1", "stored", "other"),
            ("mg", "o:1", "hit", "other")
        ]
    );
    assert_eq!(field(&lines[0], "server"), setup.other.addr());
    let dead_line = dead.next().expect("a line for the dead pool");
    assert_eq!(field(&dead_line, "route"), "dead");
    assert_eq!(
        field(&dead_line, "result"),
        std::str::from_utf8(&refused).expect("text").trim_end()
    );
    assert!(dead.next().is_none());
    let keys: Vec<String> = std::iter::from_fn(|| root.next())
        .map(|l| field(&l, "key").to_string())
        .collect();
    assert_eq!(keys, ["w:1", "o:1", "o:1"]);

    // A route that does not exist is refused with the names there are.
    let (code, refused) = Watch::open(&setup.admin, "route=nope", None);
    assert_eq!(code, 400);
    assert!(refused.is_err());
    let (code, body) = admin_http(&setup.admin, "GET", "/watch?route=nope");
    assert_eq!(code, 400);
    assert!(
        body.contains("main") && body.contains("by_prefix"),
        "{body}"
    );
}

#[test]
fn show_keys_false_hides_every_key() {
    let setup = start("show_keys = false\n");
    let (_, watch) = Watch::open(&setup.admin, "key_prefix=secret&limit=2", None);
    let mut watch = watch.expect("watch");
    let mut c = setup.proxy.connect();
    assert_eq!(
        c.roundtrip_line(b"set secret:7 0 0 1\r\n1\r\n"),
        b"STORED\r\n"
    );
    c.send(b"get secret:7\r\n");
    assert_eq!(c.read_get_reply(), b"VALUE secret:7 0 1\r\n1\r\nEND\r\n");
    let lines: Vec<Value> = std::iter::from_fn(|| watch.next()).collect();
    assert_eq!(lines.len(), 2);
    for line in &lines {
        assert_eq!(field(line, "key"), "<hidden>", "{line}");
        assert!(!line.to_string().contains("secret"), "{line}");
    }
    assert_eq!(field(&lines[1], "result"), "hit");
}

#[test]
fn a_token_is_required_when_one_is_set() {
    let setup = start("token = \"s3cret\"\n");
    for token in [None, Some("wrong"), Some("s3cre")] {
        let (code, refused) = Watch::open(&setup.admin, "limit=1", token);
        assert_eq!(code, 401, "{token:?}");
        assert!(refused.is_err());
    }
    assert_eq!(metric(&setup.admin, "memroute_watch_watchers", ""), 0);
    let (code, watch) = Watch::open(&setup.admin, "limit=1", Some("s3cret"));
    assert_eq!(code, 200);
    let mut watch = watch.expect("watch");
    let mut c = setup.proxy.connect();
    c.send(b"get w:t\r\n");
    assert_eq!(c.read_get_reply(), b"END\r\n");
    let line = watch.next().expect("a line");
    assert_eq!(field(&line, "key"), "w:t");
    assert_eq!(field(&line, "result"), "miss");
}

#[test]
fn closing_the_watch_turns_sampling_off() {
    let setup = start("");
    let examined = || metric(&setup.admin, "memroute_watch_requests_examined_total", "");
    let mut c = setup.proxy.connect();
    let gets = |c: &mut Conn, n: usize| {
        for i in 0..n {
            c.send(format!("get k{i}\r\n").as_bytes());
            assert_eq!(c.read_get_reply(), b"END\r\n");
        }
    };
    gets(&mut c, 50);
    assert_eq!(examined(), 0, "nobody watches: no request is looked at");

    let (_, watch) = Watch::open(&setup.admin, "key_prefix=none-of-these", None);
    let watch = watch.expect("watch");
    assert_eq!(metric(&setup.admin, "memroute_watch_watchers", ""), 1);
    gets(&mut c, 50);
    assert_eq!(
        examined(),
        50,
        "every request is looked at while a watch is open"
    );

    drop(watch);
    assert!(
        poll_until(IO_TIMEOUT, || metric(
            &setup.admin,
            "memroute_watch_watchers",
            ""
        ) == 0),
        "the watch's close was not seen"
    );
    gets(&mut c, 200);
    assert_eq!(examined(), 50, "sampling went on after the watch closed");
}

#[test]
fn a_watcher_that_does_not_read_is_dropped_while_traffic_goes_on() {
    let setup = start("");
    // A watcher with a small receive buffer that never reads.
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let address: std::net::SocketAddr = setup.admin.parse().expect("admin address");
    socket
        .connect(&address.into())
        .expect("connect the watcher");
    let mut stalled: TcpStream = socket.into();
    std::io::Write::write_all(
        &mut stalled,
        format!(
            "GET /watch?rate=10000 HTTP/1.1\r\nHost: {}\r\n\r\n",
            setup.admin
        )
        .as_bytes(),
    )
    .expect("ask for the watch");
    assert!(poll_until(IO_TIMEOUT, || metric(
        &setup.admin,
        "memroute_watch_watchers",
        ""
    ) == 1));

    // Pipelined gets, every reply checked, until the watcher is dropped.
    let mut c = setup.proxy.connect();
    assert_eq!(c.roundtrip_line(b"set hot 0 0 2\r\nhi\r\n"), b"STORED\r\n");
    let batch: Vec<u8> = b"get hot\r\n".repeat(100);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut answered = 0u64;
    while metric(
        &setup.admin,
        "memroute_watch_slow_watchers_dropped_total",
        "",
    ) == 0
    {
        assert!(
            Instant::now() < deadline,
            "the stalled watcher was never dropped"
        );
        c.send(&batch);
        for _ in 0..100 {
            assert_eq!(c.read_get_reply(), b"VALUE hot 0 2\r\nhi\r\nEND\r\n");
            answered += 1;
        }
    }
    assert_eq!(metric(&setup.admin, "memroute_watch_watchers", ""), 0);
    assert!(
        metric(
            &setup.admin,
            "memroute_watch_lines_dropped_total",
            "reason=\"slow_watcher\""
        ) >= 1
    );
    // Traffic goes on, and sampling is off.
    let examined = metric(&setup.admin, "memroute_watch_requests_examined_total", "");
    for _ in 0..10 {
        c.send(&batch);
        for _ in 0..100 {
            assert_eq!(c.read_get_reply(), b"VALUE hot 0 2\r\nhi\r\nEND\r\n");
        }
    }
    assert_eq!(
        metric(&setup.admin, "memroute_watch_requests_examined_total", ""),
        examined
    );
    // Every get reached memcached or waited for an identical one in flight (collapsing).
    let collapsed = metric(
        &setup.admin,
        "memroute_collapsed_gets_total",
        "pool=\"main\"",
    );
    assert_eq!(setup.main.stat("cmd_get") + collapsed, answered + 1000);

    // What the watcher finally reads is bounded and ends with the notice.
    stalled
        .set_read_timeout(Some(IO_TIMEOUT))
        .expect("read timeout");
    let mut received = Vec::new();
    let mut chunk = [0u8; 65536];
    while !received.ends_with(b"0\r\n\r\n") {
        match stalled.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => received.extend_from_slice(&chunk[..n]),
            Err(e) => panic!(
                "reading the stalled watch: {e} after {} bytes",
                received.len()
            ),
        }
    }
    let text = String::from_utf8_lossy(&received);
    assert!(
        text.contains("\"closed\""),
        "no notice at the end of {} bytes",
        received.len()
    );
    assert!(
        received.len() < 4 * 1024 * 1024,
        "{} bytes kept for a stalled watcher",
        received.len()
    );
    let _ = &setup.other;
}

#[test]
fn memroute_watch_prints_lines() {
    let setup = start("");
    let config = setup.proxy.config_path().to_path_buf();
    let cli = std::thread::spawn(move || {
        let args: Vec<std::ffi::OsString> = vec![
            "watch".into(),
            "--config".into(),
            config.into_os_string(),
            "--key-prefix".into(),
            "cli:".into(),
            "--limit".into(),
            "2".into(),
        ];
        run_memroute_cli(&args, Duration::from_secs(30))
    });
    assert!(poll_until(Duration::from_secs(20), || metric(
        &setup.admin,
        "memroute_watch_watchers",
        ""
    ) == 1));
    let mut c = setup.proxy.connect();
    assert_eq!(c.roundtrip_line(b"set cli:1 0 0 1\r\n1\r\n"), b"STORED\r\n");
    c.send(b"get cli:1 cli:2\r\n");
    assert_eq!(c.read_get_reply(), b"VALUE cli:1 0 1\r\n1\r\nEND\r\n");
    let output = cli.join().expect("the cli thread");
    assert!(output.status.success(), "{output:?}");
    let lines: Vec<&str> = output.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{output:?}");
    assert!(
        lines[0].contains(" set cli:1 route=main server=") && lines[0].contains(" stored "),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains(" get cli:1 (+1 keys) route=main ") && lines[1].contains(" 1 of 2 hit "),
        "{}",
        lines[1]
    );
    assert!(lines[0].contains(&setup.main.addr()), "{}", lines[0]);
}

/// A binary request frame (magic 0x80): `opcode`, `key`, `extras`, `value`.
fn binary_frame(opcode: u8, key: &[u8], extras: &[u8], value: &[u8]) -> Vec<u8> {
    let body = (key.len() + extras.len() + value.len()) as u32;
    let mut f = vec![0x80, opcode];
    f.extend_from_slice(&(key.len() as u16).to_be_bytes());
    f.extend_from_slice(&[extras.len() as u8, 0, 0, 0]);
    f.extend_from_slice(&body.to_be_bytes());
    f.extend_from_slice(&[0; 12]);
    [f, extras.to_vec(), key.to_vec(), value.to_vec()].concat()
}

/// A binary response's status, and its value for a get.
fn binary_reply(conn: &mut Conn) -> (u16, Vec<u8>) {
    let header = conn.read_for(24);
    assert_eq!(header[0], 0x81, "response magic: {header:?}");
    let key_len = usize::from(u16::from_be_bytes([header[2], header[3]]));
    let extras = usize::from(header[4]);
    let body = u32::from_be_bytes([header[8], header[9], header[10], header[11]]) as usize;
    let body = conn.read_for(body);
    let status = u16::from_be_bytes([header[6], header[7]]);
    (status, body[extras + key_len..].to_vec())
}

#[test]
fn binary_protocol_requests_are_watched_as_the_commands_they_become() {
    let setup = start("");
    let (_, watch) = Watch::open(&setup.admin, "key_prefix=bin&limit=3", None);
    let mut watch = watch.expect("watch");
    let mut c = setup.proxy.connect();
    let flags_and_expiry = [0u8; 8];
    c.send(&binary_frame(0x01, b"bin:1", &flags_and_expiry, b"v1"));
    assert_eq!(binary_reply(&mut c).0, 0, "set");
    c.send(&binary_frame(0x00, b"bin:1", &[], &[]));
    assert_eq!(binary_reply(&mut c), (0, b"v1".to_vec()), "get hit");
    c.send(&binary_frame(0x00, b"bin:2", &[], &[]));
    assert_eq!(binary_reply(&mut c).0, 1, "get miss: key not found");
    let lines: Vec<Value> = std::iter::from_fn(|| watch.next()).collect();
    let results: Vec<(&str, &str)> = lines
        .iter()
        .map(|l| (field(l, "key"), field(l, "result")))
        .collect();
    assert_eq!(
        results,
        [("bin:1", "stored"), ("bin:1", "hit"), ("bin:2", "miss")]
    );
    for line in &lines {
        assert!(
            field(line, "command").starts_with('m'),
            "a meta command: {line}"
        );
        assert_eq!(field(line, "server"), setup.main.addr(), "{line}");
    }
}
