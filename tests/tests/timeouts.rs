//! A backend that stalls (SIGSTOP: its port still accepts, it answers nothing): its keys get
//! `SERVER_ERROR backend ADDR ... timed out` after the pool's timeout, other servers' keys
//! keep working meanwhile, and after SIGCONT its keys work again. Also: SIGTERM while a
//! request waits on a stalled backend still answers that request before memroute exits 0.
//!
//! Every stopped process is resumed by a guard (`Stopped`) on every path, panics included.
use std::time::{Duration, Instant};

use memroute_tests::*;

/// Three servers, keys `to{i}` spread over them (md5: short sequential keys reach all three),
/// and the index of the server holding `to0`.
struct Setup {
    servers: Vec<Memcached>,
    proxy: Memroute,
    victim: usize,
    victim_keys: Vec<String>,
    other_keys: Vec<String>,
}

fn setup(timeout: &str) -> Setup {
    setup_with(timeout, "")
}

/// [`setup`] with more `[proxy]` lines.
fn setup_with(timeout: &str, proxy_lines: &str) -> Setup {
    let servers: Vec<Memcached> = (0..3).map(|_| Memcached::start()).collect();
    let listen = format!("127.0.0.1:{}", free_port());
    let addrs: Vec<String> = servers.iter().map(Memcached::addr).collect();
    let config = pool_config(
        &listen,
        &addrs,
        "ketama",
        "md5",
        &format!("timeout = \"{timeout}\""),
    )
    .replacen("[proxy]\n", &format!("[proxy]\n{proxy_lines}"), 1);
    let proxy = Memroute::start(&config);
    let mut c = proxy.connect();
    let keys: Vec<String> = (0..60).map(|i| format!("to{i}")).collect();
    for k in &keys {
        c.set(k, format!("v-{k}").as_bytes());
    }
    let victim = holder(&servers, &keys[0]);
    let (victim_keys, other_keys): (Vec<String>, Vec<String>) = keys
        .into_iter()
        .partition(|k| holder(&servers, k) == victim);
    assert!(!other_keys.is_empty(), "all keys landed on one server");
    Setup {
        servers,
        proxy,
        victim,
        victim_keys,
        other_keys,
    }
}

/// `SERVER_ERROR backend ADDR timed out` or, while memroute re-opens the connection after a
/// timeout, `SERVER_ERROR backend ADDR unavailable: timed out`.
fn is_timeout_error(reply: &[u8], addr: &str) -> bool {
    let text = String::from_utf8_lossy(reply);
    text.starts_with(&format!("SERVER_ERROR backend {addr} ")) && text.ends_with("timed out\r\n")
}

#[test]
fn stalled_backend_times_out_others_keep_working_and_it_recovers() {
    let s = setup("200ms");
    let addr = s.servers[s.victim].addr();
    let mut c = s.proxy.connect();

    let frozen = s.servers[s.victim].stop();
    // Replies that are the pool timeout itself (`BackendError::Timeout`), each counted once in
    // the server's `timeouts` stat; the others are a re-opened connection failing.
    let exact_timeout = format!("SERVER_ERROR backend {addr} timed out\r\n");
    let mut timed_out = 0u64;
    // The first request to the frozen server: a timeout error, within the client's generous
    // read timeout (read_line panics otherwise).
    let reply = c.roundtrip_line(format!("get {}\r\n", s.victim_keys[0]).as_bytes());
    assert!(
        is_timeout_error(&reply, &addr),
        "get of a key on a SIGSTOPped server: {}\nlog:\n{}",
        show(&reply),
        s.proxy.log_text()
    );
    timed_out += u64::from(reply == exact_timeout.as_bytes());
    // Meanwhile: every stalled key gets a timeout error, each other key its value, on the
    // same connection, interleaved.
    // (A few stalled keys are enough: each may wait the full pool timeout.)
    for (dead, live) in s
        .victim_keys
        .iter()
        .take(6)
        .zip(s.other_keys.iter().cycle())
    {
        for request in [
            format!("get {dead}\r\n"),
            format!("set {dead} 0 0 1\r\nx\r\n"),
        ] {
            let reply = c.roundtrip_line(request.as_bytes());
            assert!(
                is_timeout_error(&reply, &addr),
                "{} while its server is stopped: {}",
                show(request.as_bytes()),
                show(&reply)
            );
            timed_out += u64::from(reply == exact_timeout.as_bytes());
        }
        assert_eq!(
            c.get(live).as_deref(),
            Some(format!("v-{live}").as_bytes()),
            "{live} (another server) while {addr} is stopped"
        );
    }
    // A second client, not just the same connection, is served too.
    let mut other = s.proxy.connect();
    for live in &s.other_keys {
        assert_eq!(
            other.get(live).as_deref(),
            Some(format!("v-{live}").as_bytes())
        );
    }
    let stats = other.stats();
    let timeouts: u64 = stats
        .iter()
        .find(|(k, _)| k == &format!("server:main:{addr}:timeouts"))
        .map(|(_, v)| v.parse().expect("numeric stat"))
        .unwrap_or_else(|| panic!("no timeouts stat for {addr}: {stats:?}"));
    assert!(timed_out >= 1, "no reply was the pool timeout itself");
    assert_eq!(
        timeouts, timed_out,
        "timeouts counted for {addr} vs pool-timeout replies seen"
    );

    frozen.resume();

    // memroute re-opens the connection; retry (bounded) until the key's server answers.
    let key = &s.victim_keys[0];
    set_until_stored(&mut c, key, Duration::from_secs(15), || s.proxy.log_text());
    assert_eq!(c.get(key).as_deref(), Some(&b"again"[..]));
    // The server's other keys are still there (it was paused, not restarted).
    for k in &s.victim_keys[1..] {
        assert_eq!(
            c.get(k).as_deref(),
            Some(format!("v-{k}").as_bytes()),
            "{k} after resume"
        );
    }
    for k in &s.other_keys {
        assert_eq!(c.get(k).as_deref(), Some(format!("v-{k}").as_bytes()));
    }
}

#[test]
fn sigterm_answers_a_request_waiting_on_a_stalled_backend_then_exits_zero() {
    // A timeout long enough that the backend, resumed right after SIGTERM, normally answers
    // first; a timeout error is an acceptable answer too (the machine may be slow). No
    // drain delay: the connection is closed as soon as what was in flight is answered.
    let mut s = setup_with("2s", "drain_delay = \"0s\"\n");
    let key = s.victim_keys[0].clone();
    let mut c = s.proxy.connect();
    let mut watcher = s.proxy.connect();
    let before = cmd_get(&mut watcher);

    let frozen = s.servers[s.victim].stop();
    c.send(format!("get {key}\r\n").as_bytes());
    // The request is in flight once memroute counted it (polled, bounded).
    let deadline = Instant::now() + Duration::from_secs(5);
    while cmd_get(&mut watcher) == before {
        assert!(Instant::now() < deadline, "memroute never counted the get");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(watcher);

    s.proxy.signal("TERM");
    assert!(
        s.proxy
            .wait_log("SIGTERM: shutting down", Duration::from_secs(5)),
        "memroute did not log the SIGTERM\n{}",
        s.proxy.log_text()
    );
    frozen.resume();

    let reply = c.read_get_reply();
    let value = format!("VALUE {key} 0 {}\r\nv-{key}\r\nEND\r\n", key.len() + 2);
    let addr = s.servers[s.victim].addr();
    assert!(
        reply == value.as_bytes() || is_timeout_error(&reply, &addr),
        "in-flight get during shutdown got {}",
        show(&reply)
    );
    // With no drain delay memroute stops accepting at once; the connection closes once it
    // is idle, its get answered.
    assert!(
        s.proxy
            .wait_log("drain delay over", Duration::from_secs(15)),
        "{}",
        s.proxy.log_text()
    );
    assert!(
        c.expect_eof(),
        "memroute closes the connection after answering what was in flight"
    );
    let status = s.proxy.wait_exit(Duration::from_secs(15));
    assert!(
        status.success(),
        "memroute exited with {status} after SIGTERM\n{}",
        s.proxy.log_text()
    );
}

fn cmd_get(c: &mut Conn) -> u64 {
    c.stats()
        .into_iter()
        .find(|(k, _)| k == "cmd_get")
        .map(|(_, v)| v.parse().expect("numeric stat"))
        .expect("cmd_get in stats")
}
