//! Differential conformance: the same bytes sent straight to memcached A and through memroute
//! to memcached B (a one-server pool) must get the same reply bytes. Both servers start fresh
//! per script and see the same sequence, so even cas uniques agree.
//! `version`, `verbosity` and `stats` are answered by memroute itself and are tested apart.
//! The shared script lists also run through a TLS pool (memroute speaks TLS to a real
//! `memcached -Z` B) and on both I/O modes (io_uring, the default, and `proxy.io =
//! "epoll"`): the replies must not depend on the transport.
use memroute_tests::scripts::{self, compare, Script, Side};
use memroute_tests::tls::Pki;
use memroute_tests::*;

/// What stands between the client and memcached B.
enum Path<'a> {
    /// memroute, plaintext both sides.
    Plain,
    /// memroute, plaintext, with `proxy.io = "epoll"` (the default is io_uring).
    Epoll,
    /// memroute with a TLS pool to `memcached -Z` serving `pki.server`.
    TlsPool(&'a Pki),
}

/// The pool timeout of the memroute under test: memcached never times out, and a reply through
/// a debug build on a busy machine can take longer than the default 250 ms.
const PATIENT: &str = "timeout = \"10s\"";

impl Path<'_> {
    /// Memcached B and memroute in front of it.
    fn start(&self) -> (Memcached, Memroute) {
        match self {
            Path::Plain => {
                let backend = Memcached::start();
                let proxy = Memroute::start_pool_with(&[backend.addr()], PATIENT);
                (backend, proxy)
            }
            Path::Epoll => {
                let backend = Memcached::start();
                let listen = format!("127.0.0.1:{}", free_port());
                let toml = simple_config(&listen, &[backend.addr()], PATIENT).replacen(
                    "[proxy]\n",
                    "[proxy]\nio = \"epoll\"\n",
                    1,
                );
                (backend, Memroute::start(&toml))
            }
            Path::TlsPool(pki) => {
                let backend = Memcached::start_with_args(
                    "127.0.0.1",
                    free_port(),
                    64,
                    Pki::memcached_args(&pki.server),
                );
                let tls = format!(
                    "tls = {{ ca = {:?}, server_name = \"localhost\" }}\n{PATIENT}",
                    pki.ca.display().to_string()
                );
                let proxy = Memroute::start_pool_with(&[backend.addr()], &tls);
                (backend, proxy)
            }
        }
    }
}

/// Runs every script on a fresh (memcached, memroute+memcached) pair; reports all differences.
fn run(scripts: Vec<Script>) {
    run_through(scripts, &Path::Plain);
}

fn run_through(scripts: Vec<Script>, path: &Path) {
    let mut failures = Vec::new();
    for script in &scripts {
        let reference = Memcached::start();
        let (_backend, proxy) = path.start();
        let mut want = Side::new(reference.connect());
        let mut got = Side::new(proxy.connect());
        if let Err(e) = compare(script, &mut want, &mut got) {
            failures.push(e);
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} scripts differ:\n\n{}",
        failures.len(),
        scripts.len(),
        failures.join("\n\n")
    );
}

#[test]
fn text_protocol_matches_memcached() {
    run(scripts::text_scripts());
}

#[test]
fn meta_protocol_matches_memcached() {
    run(scripts::meta_scripts());
}

#[test]
fn text_and_meta_protocols_match_memcached_on_epoll() {
    let all = [scripts::text_scripts(), scripts::meta_scripts()].concat();
    run_through(all, &Path::Epoll);
}

#[test]
fn bad_input_matches_memcached() {
    run(scripts::bad_input_scripts());
}

/// Every script (the shared text, meta and bad-input lists and this file's own) through a
/// TLS pool to `memcached -Z`.
#[test]
fn every_script_matches_memcached_through_a_tls_pool() {
    let pki = Pki::generate();
    let mut all = scripts::text_scripts();
    all.extend(scripts::meta_scripts());
    all.extend(scripts::bad_input_scripts());
    all.extend(nul_scripts());
    all.extend(huge_length_scripts());
    all.extend(tab_scripts());
    run_through(all, &Path::TlsPool(&pki));
}

/// The conformance checks that are not scripts (quit, a 100-request pipeline, a client
/// writing byte by byte, recoverable errors), through a TLS pool to `memcached -Z`.
#[test]
fn pipelining_byte_writes_errors_and_quit_through_a_tls_pool() {
    let pki = Pki::generate();
    let path = Path::TlsPool(&pki);
    quit_closes(&path);
    pipelined_in_order(&path);
    byte_at_a_time(&path);
    usable_after_errors(&path);
}

/// Steps owned by this file (the shared lists live in memroute_tests::scripts).
fn steps(name: &'static str, steps: &[&[u8]]) -> Script {
    Script {
        name,
        steps: steps.iter().map(|s| s.to_vec()).collect(),
    }
}

/// A NUL byte ends memcached's command line (it tokenises a C string), while the line
/// still ends at its `\n`. memroute must give the same verdict and never forward a line
/// memcached would read differently: a forwarded NUL tail would let `set k\0junk 0 0 5`
/// smuggle its data line (`hello`, or any command) onto the shared backend connection.
#[test]
fn nul_in_command_line_matches_memcached() {
    run(nul_scripts());
}

fn nul_scripts() -> Vec<Script> {
    vec![
        steps(
            "NUL cuts the command line",
            &[
                b"set k\0junk 0 0 5\r\nhello\r\n",
                b"set k\0junk 0 0 10\r\nget victim\r\n",
                b"get k\r\n",
                b"set k 0 0 5\0junk\r\nhello\r\n",
                b"get k\0 victim\r\n",
                b"set a 0 0 1\r\n1\r\n",
                b"get a\0b\r\n",
                b"get a k\0 a\r\n",
                b"gets a\0\r\n",
                b"gat 0 a\0 k\r\n",
                b"set n 0 0 1\r\n5\r\n",
                b"incr n 1\0 abc\r\n",
                b"decr n\0 1\r\n",
                b"touch n 10\0\r\n",
                b"touch n 10\0 noreply\r\n",
                b"delete n\0 0 noreply\r\n",
                b"delete a noreply\0 x\r\n",
                b"get a n\r\n",
                b"set q 0 0 1 noreply\0 x\r\nz\r\n",
                b"get q\r\n",
                b"get \0a\r\n",
                b"\0get a\r\n",
                b"get a\r\0b\r\n",
                b"flush_all\0 noreply\r\n",
                b"get q\r\n",
            ],
        ),
        steps(
            "NUL cuts the meta command line",
            &[
                b"ms m 5\0 T0\r\nhello\r\n",
                b"mg m\0 v\r\n",
                b"mg m v\0 k\r\n",
                b"mg m v q\0\r\n",
                b"ms m\0 5\r\nhello\r\n",
                b"ms m 2 q\0 q\r\nhi\r\n",
                b"mg m v\r\n",
                b"ma m\0 v\r\n",
                b"md m q\0\r\n",
                b"md m\0 q\r\n",
                b"mn\0x\r\n",
                b"mg\0 m\r\n",
            ],
        ),
    ]
}

/// Data lengths memcached refuses on the line (above INT_MAX - 2, or negative after its
/// 32-bit truncation) answer bad command line format and swallow nothing, so the next
/// request is answered. (2147483645 and below are swallowed whole by memcached: not
/// scriptable here; see the protocol unit tests.)
#[test]
fn huge_data_lengths_match_memcached() {
    run(huge_length_scripts());
}

fn huge_length_scripts() -> Vec<Script> {
    vec![
        steps(
            "set lengths near 2^31 and 2^32",
            &[
                b"set k 0 0 2147483647\r\n",
                b"set k 0 0 2147483646\r\n",
                b"set k 0 0 4294967295\r\n",
                b"set k 0 0 4294967294\r\n",
                b"set k 0 0 -1\r\n",
                b"set k 0 0 2147483647 noreply\r\n",
                b"cas k 0 0 2147483646 1\r\n",
                b"append k 0 0 2147483647\r\n",
                b"set k 0 0 4294967297\r\nx\r\n",
                b"get k\r\n",
                b"set k 0 0 4294967296\r\n\r\n",
                b"get k\r\n",
            ],
        ),
        steps(
            "ms lengths near 2^31 and 2^32",
            &[
                b"ms k 2147483647\r\n",
                b"ms k 2147483646 T0\r\n",
                b"ms k 2147483646 q q\r\n",
                b"ms k 4294967295\r\n",
                b"ms k -1\r\n",
                b"ms k 4294967297\r\nx\r\n",
                b"mg k v\r\n",
            ],
        ),
    ]
}

/// Only spaces separate words and only `\n` ends a line: tabs and a `\r` inside a line
/// are part of a word, so what memroute forwards is one request for memcached as well.
#[test]
fn tabs_and_inner_carriage_returns_match_memcached() {
    run(tab_scripts());
}

fn tab_scripts() -> Vec<Script> {
    vec![steps(
        "tabs and inner CR",
        &[
            b"set k\t0 0 0 1\r\nx\r\n",
            b"get k\t0\r\n",
            b"get\tk\t0\r\n",
            b"set r\rx 0 0 1\r\ny\r\n",
            b"get r\rx\r\n",
            b"get r\rx\rmn\r\n",
            b"get r\rx\rget r\r\n",
            b"get a\r b\r r\rx\r\r\n",
            b"set n 0 0\t1\r\nz\r\n",
            b"set n 0 0 1\t\r\nz\r\n",
            b"set n 0 0 1\r\r\nz\r\n",
            b"set n 0 0 1\r noreply\r\nw\r\n",
            b"get n\r\n",
            b"touch n\r10\r\n",
            b"touch n 10\r\r\n",
            b"incr n\t1\r\n",
            b"delete n\r\tnoreply\r\n",
            b"mg r\rx v\r\n",
            b"mg r\rx v\rq\r\n",
            b"ms t\tx 1 T0\tq\r\nv\r\n",
            b"mg t\tx v\r\n",
        ],
    )]
}

/// A value larger than memroute's client-side max_value_size (the backend has a bigger
/// item limit, or the value grew through append) must still be served: memroute frames
/// backend replies independently of that limit instead of resetting the connection.
#[test]
fn values_above_the_client_limit_are_still_served() {
    let reference = Memcached::start();
    let backend = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let toml = simple_config(&listen, &[backend.addr()], "").replacen(
        "[proxy]\n",
        "[proxy]\nmax_value_size = 1000\n",
        1,
    );
    let proxy = Memroute::start(&toml);
    let chunk = vec![b'x'; 900];
    let mut set = b"set big 0 0 900\r\n".to_vec();
    set.extend_from_slice(&chunk);
    set.extend_from_slice(b"\r\n");
    let mut append = b"append big 0 0 900\r\n".to_vec();
    append.extend_from_slice(&chunk);
    append.extend_from_slice(b"\r\n");
    let script = Script {
        name: "value grown past max_value_size",
        steps: vec![
            set,
            append.clone(),
            append,
            b"get big\r\n".to_vec(),
            b"gets big nope big\r\n".to_vec(),
            b"mg big v s\r\n".to_vec(),
            b"gat 0 big\r\n".to_vec(),
            b"set after 0 0 2\r\nok\r\n".to_vec(),
            b"get after big\r\n".to_vec(),
        ],
    };
    let mut want = Side::new(reference.connect());
    let mut got = Side::new(proxy.connect());
    if let Err(e) = compare(&script, &mut want, &mut got) {
        panic!("{e}");
    }
    // The client-side limit still applies to what clients send.
    let mut c = proxy.connect();
    let mut too_big = b"set c 0 0 1001\r\n".to_vec();
    too_big.extend_from_slice(&[b'y'; 1001]);
    too_big.extend_from_slice(b"\r\n");
    let reply = c.roundtrip_fenced(&too_big).expect("too large set");
    assert_eq!(
        show(&reply),
        show(b"SERVER_ERROR object too large for cache\r\n")
    );
}

/// One memcached behind one memroute, for the tests that do not need a reference.
fn single() -> (Memcached, Memroute) {
    let backend = Memcached::start();
    let proxy = Memroute::start_pool(&[backend.addr()]);
    (backend, proxy)
}

#[test]
fn version_verbosity_stats_are_answered_by_memroute() {
    let (_backend, proxy) = single();
    let mut c = proxy.connect();
    let version = c.roundtrip_line(b"version\r\n");
    assert!(
        version.starts_with(b"VERSION ") && version.ends_with(b"\r\n"),
        "version: {}",
        show(&version)
    );
    assert_eq!(show(&c.roundtrip_line(b"verbosity 1\r\n")), show(b"OK\r\n"));
    assert_eq!(show(&c.roundtrip_line(b"verbosity 0\r\n")), show(b"OK\r\n"));
    // noreply: nothing comes back, so the next reply is the fence's.
    assert_eq!(
        show(
            &c.roundtrip_fenced(b"verbosity 1 noreply\r\n")
                .expect("verbosity noreply")
        ),
        ""
    );

    // Counters move with traffic: one hit and one miss.
    c.set("s", b"1");
    c.get("s");
    c.get("nope");
    let stats = c.stats();
    let stat = |name: &str| {
        stats
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    for name in ["uptime", "curr_connections", "cmd_get", "get_hits"] {
        assert!(stat(name).is_some(), "stats lacks STAT {name}: {stats:?}");
    }
    let num = |name: &str| {
        stat(name)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("STAT {name} not a number: {stats:?}"))
    };
    // The proxy is this test's own and `stats` counts every request answered before it.
    assert_eq!(num("cmd_get"), 2, "cmd_get after two gets: {stats:?}");
    assert_eq!(num("get_hits"), 1, "get_hits after a hit: {stats:?}");
    assert_eq!(num("get_misses"), 1, "get_misses after a miss: {stats:?}");
    assert!(
        num("curr_connections") >= 1,
        "curr_connections with one client: {stats:?}"
    );
    // The connection is still framed after stats (stats() read up to END).
    assert_eq!(c.get("s").as_deref(), Some(&b"1"[..]));
}

#[test]
fn quit_closes_the_connection() {
    quit_closes(&Path::Plain);
}

fn quit_closes(path: &Path) {
    let (_backend, proxy) = path.start();
    let mut c = proxy.connect();
    c.set("q", b"1");
    c.send(b"quit\r\n");
    assert!(c.expect_eof(), "memroute must close the connection on quit");
    assert_eq!(proxy.connect().get("q").as_deref(), Some(&b"1"[..]));
}

/// 100 mixed commands in one write; the replies must come back complete and in order. The
/// same bytes go to a direct memcached for the expected answer.
#[test]
fn pipelined_requests_are_answered_in_order() {
    pipelined_in_order(&Path::Plain);
}

fn pipelined_in_order(path: &Path) {
    let reference = Memcached::start();
    let (_backend, proxy) = path.start();
    let mut batch = Vec::new();
    for i in 0..100 {
        let cmd = match i % 5 {
            0 => format!("set p{i} 0 0 {}\r\nv{i}\r\n", format!("v{i}").len()),
            1 => format!("get p{} nope p{}\r\n", i - 1, i - 1),
            2 => format!("incr p{} 1\r\n", i - 2),
            3 => format!("mg p{} v k O{i}\r\n", i - 3),
            _ => format!("delete p{}\r\n", i - 4),
        };
        batch.extend_from_slice(cmd.as_bytes());
    }
    let want = reference
        .connect()
        .roundtrip_fenced(&batch)
        .expect("batch to memcached");
    let got = proxy
        .connect()
        .roundtrip_fenced(&batch)
        .unwrap_or_else(|e| panic!("pipelined batch through memroute: {e}"));
    assert_eq!(show(&got), show(&want));
}

/// A client that writes one byte at a time must be answered as if it wrote whole requests.
#[test]
fn byte_at_a_time_requests() {
    byte_at_a_time(&Path::Plain);
}

fn byte_at_a_time(path: &Path) {
    let reference = Memcached::start();
    let (_backend, proxy) = path.start();
    let requests: &[u8] = b"set slow 0 0 5\r\nhello\r\nget slow nope slow\r\nmg slow v k\r\nincr slow 1\r\ndelete slow\r\nmn\r\n";
    let want = reference
        .connect()
        .roundtrip_fenced(requests)
        .expect("requests to memcached");
    let mut c = proxy.connect();
    for b in requests {
        c.send(std::slice::from_ref(b));
    }
    // The fence comes after the script's own trailing mn.
    let got = c
        .roundtrip_fenced(b"")
        .unwrap_or_else(|e| panic!("byte-at-a-time through memroute: {e}"));
    assert_eq!(show(&got), show(&want));
}

/// After each recoverable error the same connection keeps working.
#[test]
fn connection_stays_usable_after_recoverable_errors() {
    usable_after_errors(&Path::Plain);
}

fn usable_after_errors(path: &Path) {
    let (_backend, proxy) = path.start();
    let mut c = proxy.connect();
    let errors: [&[u8]; 7] = [
        b"bogus\r\n",
        b"\r\n",
        b"set k abc 0 1\r\nx\r\n",
        b"set k 0 0 1\r\nxyz\r\n",
        b"set s 0 0 1\r\na\r\nincr s 1\r\n",
        b"get kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk\r\n",
        b"mg\r\n",
    ];
    for (i, bad) in errors.iter().enumerate() {
        let reply = c
            .roundtrip_fenced(bad)
            .unwrap_or_else(|e| panic!("error case {i} {}: {e}", show(bad)));
        assert!(
            !reply.is_empty(),
            "error case {i} {} got no reply",
            show(bad)
        );
        let value = format!("after{i}");
        c.set("alive", value.as_bytes());
        assert_eq!(
            c.get("alive"),
            Some(value.into_bytes()),
            "connection unusable after {}",
            show(bad)
        );
    }
}
