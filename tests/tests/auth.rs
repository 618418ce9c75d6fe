//! Authentication, end to end against real memcached started with `-Y` (ASCII auth) and
//! `-S` (binary SASL):
//!
//! - memroute logs in to memcached itself (a pool's `auth`), and no client's bytes ever log
//!   a pooled connection in: one client's login never opens the cache for another;
//! - a server that wants a login memroute lacks, or refuses memroute's, is marked down with
//!   that reason, and a reload with the right password brings it back;
//! - a listener with `auth = { authfile }` answers its clients exactly as memcached `-Y`
//!   answers them (text) and as memcached `-S` does (binary SASL PLAIN, pylibmc).
use std::path::PathBuf;
use std::time::Duration;

use memroute_tests::{
    admin_http, free_port, poll_until, require_program, run_program_with_env, stat_u64, Conn,
    Memcached, Memroute, TempDir,
};

#[path = "common/binary_client.rs"]
mod binary_client;

const WAIT: Duration = Duration::from_secs(10);

/// memcached with ASCII authentication: user `foo`, password `bar`.
fn memcached_with_authfile(dir: &TempDir) -> Memcached {
    let authfile = dir.write("memcached-authfile", "foo:bar\n");
    Memcached::start_with_args(
        "127.0.0.1",
        free_port(),
        64,
        vec!["-Y".to_string(), authfile.display().to_string()],
    )
}

/// A connection to memcached logged in as foo.
fn logged_in(addr: &str) -> Conn {
    let mut c = Conn::connect(addr);
    assert_eq!(
        c.roundtrip_line(b"set x 0 0 7\r\nfoo bar\r\n"),
        b"STORED\r\n"
    );
    c
}

/// memroute over one pool `main` of `server`, with `pool_lines` in the pool, `listen` as
/// its one listen entry (`"ADDR"` or `{ address = "ADDR", auth = ... }`), and an admin port.
fn config(listen: &str, server: &str, pool_lines: &str, admin: &str) -> String {
    format!(
        "[proxy]\nlisten = [{listen}]\nworkers = 1\nroute = \"main\"\n\n\
         [admin]\nlisten = \"{admin}\"\n\n\
         [pools.main]\nservers = [\"{server}\"]\ntimeout = \"1s\"\n\
         probe_interval = \"50ms\"\nprobe_interval_max = \"100ms\"\n{pool_lines}\n"
    )
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn memroute_logs_in_with_the_pools_credentials_and_serves_clients_that_never_log_in() {
    let dir = TempDir::new("auth-pool");
    let mc = memcached_with_authfile(&dir);
    // memcached refuses a connection that has not logged in.
    assert_eq!(
        Conn::connect(&mc.addr()).roundtrip_line(b"get k\r\n"),
        b"CLIENT_ERROR unauthenticated\r\n"
    );
    // A password file as a Kubernetes Secret or `echo bar > file` writes it (a newline).
    let password = dir.write("password", "bar\n");
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let auth = format!(
        "auth = {{ username = \"foo\", password_file = \"{}\" }}",
        password.display()
    );
    let proxy = Memroute::start(&config(&format!("\"{listen}\""), &mc.addr(), &auth, &admin));
    let mut client = proxy.connect();
    for i in 0..20 {
        let set = format!("set k{i} 0 0 2\r\nv{}\r\n", i % 10);
        assert_eq!(text(&client.roundtrip_line(set.as_bytes())), "STORED\r\n");
    }
    assert_eq!(
        text(&client.roundtrip_lines(b"get k3\r\n", 3)),
        "VALUE k3 0 2\r\nv3\r\nEND\r\n"
    );
    // The items are in memcached, for a client that logs in there itself.
    assert_eq!(
        text(&logged_in(&mc.addr()).roundtrip_lines(b"get k13\r\n", 3)),
        "VALUE k13 0 2\r\nv3\r\nEND\r\n"
    );
    let checked = memroute_tests::run_memroute_cli(
        &[
            "--check",
            "--config",
            &proxy.config_path().display().to_string(),
        ],
        WAIT,
    )
    .stdout;
    assert!(
        checked.contains("pool main: logs in to its servers as foo"),
        "{checked}"
    );
}

#[test]
fn one_clients_login_never_opens_the_cache_for_another() {
    let dir = TempDir::new("auth-hole");
    let mc = memcached_with_authfile(&dir);
    // The reported setup: memroute has no credentials and its listener wants no login.
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&config(&format!("\"{listen}\""), &mc.addr(), "", &admin));
    // Client A "logs in" and sets toast; client B, who never logged in, reads toast.
    let mut a = proxy.connect();
    let login = text(&a.roundtrip_line(b"set foo 0 0 7\r\nfoo bar\r\n"));
    let set = text(&a.roundtrip_line(b"set toast 0 0 2\r\nhi\r\n"));
    let mut b = proxy.connect();
    let get = text(&b.roundtrip_line(b"get toast\r\n"));
    let wants_login =
        "memcached wants a login (CLIENT_ERROR unauthenticated) and the pool has no auth";
    for reply in [&login, &set, &get] {
        assert!(
            reply.starts_with(&format!("SERVER_ERROR backend {} ", mc.addr()))
                && reply.contains(wants_login),
            "a client must get memcached's refusal, never a value or a stored item: {reply:?}"
        );
    }
    // memcached never saw a login (auth_cmds counts ours, below, alone) and holds no toast.
    let mut direct = logged_in(&mc.addr());
    let stats = direct.stats();
    assert_eq!(stat_u64(&stats, "auth_cmds"), Some(1), "{stats:?}");
    assert_eq!(text(&direct.roundtrip_line(b"get toast\r\n")), "END\r\n");
    // The server is down with the reason, in stats and the log.
    let proxy_stats = proxy.connect().stats();
    let down = format!("server:main:{}:down", mc.addr());
    assert_eq!(stat_u64(&proxy_stats, &down), Some(1), "{proxy_stats:?}");
    let refused = format!("server:main:{}:login_failures", mc.addr());
    assert!(
        stat_u64(&proxy_stats, &refused) >= Some(1),
        "{proxy_stats:?}"
    );
    let (_, metrics) = admin_http(&admin, "GET", "/metrics");
    assert!(
        metrics.contains("memroute_backend_login_failures_total{pool=\"main\""),
        "{metrics}"
    );
    assert!(
        proxy.wait_log("backend login failed", WAIT),
        "{}",
        proxy.log_text()
    );
}

#[test]
fn a_refused_login_marks_the_server_down_and_a_reload_with_the_right_password_brings_it_back() {
    let dir = TempDir::new("auth-wrong");
    let mc = memcached_with_authfile(&dir);
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let wrong = config(
        &format!("\"{listen}\""),
        &mc.addr(),
        "auth = { username = \"foo\", password = \"wrong\" }",
        &admin,
    );
    let proxy = Memroute::start(&wrong);
    let reply = text(&proxy.connect().roundtrip_line(b"get k\r\n"));
    assert!(
        reply.starts_with(&format!(
            "SERVER_ERROR backend {} is marked down: ",
            mc.addr()
        )) && reply.contains("refused the login of user foo: CLIENT_ERROR authentication failure"),
        "{reply:?}"
    );
    // The panel's state names the reason; /config never shows the password.
    let (status, state) = admin_http(&admin, "GET", "/state");
    assert_eq!(status, 200);
    assert!(state.contains("authentication failure"), "{state}");
    let (_, shown) = admin_http(&admin, "GET", "/config");
    assert!(
        shown.contains("<redacted>") && !shown.contains("wrong"),
        "{shown}"
    );
    // The password moves to a file with the right one: the reload reads it, the prober
    // logs in and the server is back.
    let password = dir.write("password", "bar");
    let right = config(
        &format!("\"{listen}\""),
        &mc.addr(),
        &format!(
            "auth = {{ username = \"foo\", password_file = \"{}\" }}",
            password.display()
        ),
        &admin,
    );
    assert!(proxy.reload(&right), "{}", proxy.log_text());
    let mut client = proxy.connect();
    assert!(
        poll_until(WAIT, || client.roundtrip_line(b"set k 0 0 1\r\n1\r\n")
            == b"STORED\r\n"),
        "{}",
        proxy.log_text()
    );
    let marked_up = format!("server:main:{}:marked_up", mc.addr());
    assert_eq!(stat_u64(&client.stats(), &marked_up), Some(1));
    // The password file changes again (a rotated Secret), the config file does not: a
    // SIGHUP re-reads it, memroute logs in anew with the wrong one and the server goes down.
    std::fs::write(&password, "rotated-wrong").expect("rewrite the password file");
    assert!(proxy.reload(&right), "{}", proxy.log_text());
    assert!(
        poll_until(WAIT, || text(&client.roundtrip_line(b"get k\r\n"))
            .contains("refused the login")),
        "{}",
        proxy.log_text()
    );
}

/// Sends `request` on a fresh connection to `addr` and reads `lines` reply lines (0: expects
/// the connection closed without a word).
fn answer(addr: &str, request: &[u8], lines: usize) -> String {
    let mut c = Conn::connect(addr);
    c.send(request);
    match lines {
        0 => format!("closed: {}", c.expect_eof()),
        n => text(&(0..n).flat_map(|_| c.read_line()).collect::<Vec<u8>>()),
    }
}

#[test]
fn a_listener_that_wants_a_login_answers_as_memcached_with_an_authfile_does() {
    let dir = TempDir::new("auth-listener");
    let reference = memcached_with_authfile(&dir);
    let backend = Memcached::start();
    let authfile = dir.write("authfile", "foo:bar\n");
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let entry = format!(
        "{{ address = \"{listen}\", auth = {{ authfile = \"{}\" }} }}",
        authfile.display()
    );
    let proxy = Memroute::start(&config(&entry, &backend.addr(), "", &admin));
    let cases: &[(&[u8], usize)] = &[
        (b"get toast\r\n", 1),
        (b"mg toast v\r\n", 1),
        (b"version\r\n", 1),
        (b"set foo 0 0\r\n", 1),
        (b"set foo 0 0 7\r\nfoo baz\r\n", 1),
        (b"set foo 0 0 6\r\nfoobar\r\n", 1),
        (b"set k 0 0 7\r\nfoo barXY", 1),
        (b"  set  k  0 0   7\r\nfoo bar\r\nget toast\r\n", 2),
        (
            b"set k 0 0 9\r\nfoo bar x\r\nset toast 0 0 2\r\nhi\r\nget toast\r\n",
            5,
        ),
        (&[b'a'; 2049], 0),
    ];
    for (request, lines) in cases {
        let want = answer(&reference.addr(), request, *lines);
        let got = answer(&listen, request, *lines);
        assert_eq!(got, want, "request {:?}", text(request));
    }
    // Logged in, a client is served; another client on the same listener is still not.
    let mut a = proxy.connect();
    assert_eq!(
        a.roundtrip_line(b"set x 0 0 7\r\nfoo bar\r\n"),
        b"STORED\r\n"
    );
    assert_eq!(
        a.roundtrip_line(b"set toast 0 0 2\r\nhi\r\n"),
        b"STORED\r\n"
    );
    let mut b = proxy.connect();
    assert_eq!(
        b.roundtrip_line(b"get toast\r\n"),
        b"CLIENT_ERROR unauthenticated\r\n"
    );
    // Logins tried so far: the three cases above that are logins (one refused) and a's;
    // a malformed token is no login, as memcached counts them.
    let stats = a.stats();
    assert_eq!(stat_u64(&stats, "auth_cmds"), Some(4), "{stats:?}");
    assert_eq!(stat_u64(&stats, "auth_errors"), Some(1), "{stats:?}");
    // The authfile is re-read on reload (the config file unchanged): a new user logs in,
    // the old one no longer can.
    std::fs::write(&authfile, "new:secret\n").expect("rewrite the authfile");
    let toml = std::fs::read_to_string(proxy.config_path()).expect("read config");
    assert!(proxy.reload(&toml), "{}", proxy.log_text());
    let mut c = proxy.connect();
    assert_eq!(
        c.roundtrip_line(b"set x 0 0 7\r\nfoo bar\r\n"),
        b"CLIENT_ERROR authentication failure\r\n"
    );
    assert_eq!(
        c.roundtrip_line(b"set x 0 0 10\r\nnew secret\r\n"),
        b"STORED\r\n"
    );
    assert_eq!(
        c.roundtrip_lines(b"get toast\r\n", 3),
        b"VALUE toast 0 2\r\nhi\r\nEND\r\n"
    );
    // A client logged in before the reload stays logged in, as on memcached.
    assert_eq!(
        a.roundtrip_lines(b"get toast\r\n", 3),
        b"VALUE toast 0 2\r\nhi\r\nEND\r\n"
    );
}

/// memcached -S with a SASL database holding foo/bar, and the environment a SASL client
/// needs to find the PLAIN plugin.
struct SaslServer {
    memcached: Memcached,
    _dir: TempDir,
}

fn sasl_memcached() -> SaslServer {
    require_program("saslpasswd2");
    let dir = TempDir::new("sasl");
    let db = dir.path().join("sasldb2");
    dir.write(
        "memcached.conf",
        &format!("mech_list: plain\nsasldb_path: {}\n", db.display()),
    );
    let made = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "printf bar | saslpasswd2 -p -a memcached -c -f '{}' foo",
            db.display()
        ))
        .status()
        .expect("run saslpasswd2");
    assert!(made.success(), "saslpasswd2 failed");
    let memcached = Memcached::start_with_env(
        vec!["-S".to_string()],
        vec![(
            "SASL_CONF_PATH".to_string(),
            dir.path().display().to_string(),
        )],
    );
    SaslServer {
        memcached,
        _dir: dir,
    }
}

/// Where Debian keeps the SASL client plugins (pylibmc's bundled libsasl2 looks elsewhere).
fn sasl_plugins() -> &'static str {
    [
        "/usr/lib/x86_64-linux-gnu/sasl2",
        "/usr/lib/aarch64-linux-gnu/sasl2",
    ]
    .into_iter()
    .find(|p| PathBuf::from(p).join("libplain.so").exists())
    .expect("the SASL PLAIN plugin (libsasl2-modules) is not installed: run scripts/test")
}

/// memroute whose one listener wants a login (authfile foo:bar) over a plain memcached.
fn proxy_with_login(dir: &TempDir, backend: &Memcached) -> Memroute {
    let authfile = dir.write("authfile", "foo:bar\n");
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let entry = format!(
        "{{ address = \"{listen}\", auth = {{ authfile = \"{}\" }} }}",
        authfile.display()
    );
    Memroute::start(&config(&entry, &backend.addr(), "", &admin))
}

/// The bytes of every response to `frames` sent on one connection, read until it closes
/// or `responses` have come.
fn binary_exchange(addr: &str, frames: &[Vec<u8>], responses: usize) -> Vec<(u16, Vec<u8>)> {
    let mut c = Conn::connect(addr);
    for frame in frames {
        c.send(frame);
    }
    (0..responses)
        .map(|_| binary_client::read_response(&mut c))
        .collect()
}

#[test]
fn binary_sasl_is_answered_as_memcached_with_sasl_answers_it() {
    let sasl = sasl_memcached();
    let dir = TempDir::new("auth-binary");
    let backend = Memcached::start();
    let proxy = proxy_with_login(&dir, &backend);
    let auth = |user_password: &[u8]| {
        let mut value = vec![0u8];
        value.extend_from_slice(user_password);
        binary_client::frame(binary_client::SASL_AUTH, b"PLAIN", &value)
    };
    let list = binary_client::request(binary_client::SASL_LIST_MECHS, "");
    let get = binary_client::get_request("k");
    // Before a login: mechanisms listed, a wrong password refused (the connection stays),
    // then a get refused and the connection closed.
    let before = [list.clone(), auth(b"foo\0baz"), get.clone()];
    let want = binary_exchange(&sasl.memcached.addr(), &before, 3);
    let got = binary_exchange(&proxy.listen, &before, 3);
    assert_eq!(got, want);
    assert_eq!(want[0], (0, b"PLAIN".to_vec()));
    assert_eq!(want[2].0, 0x20);
    // A login, then a get: a miss.
    let after = [auth(b"foo\0bar"), get];
    let want = binary_exchange(&sasl.memcached.addr(), &after, 2);
    assert_eq!(binary_exchange(&proxy.listen, &after, 2), want);
    assert_eq!(want[0], (0, b"Authenticated".to_vec()));
    assert_eq!(want[1].0, 1);
}

#[test]
fn pylibmc_with_sasl_behaves_through_memroute_as_against_memcached() {
    let sasl = sasl_memcached();
    let dir = TempDir::new("auth-pylibmc");
    let backend = Memcached::start();
    let proxy = proxy_with_login(&dir, &backend);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients/pylibmc_sasl.py");
    let run = |addr: &str| {
        let script = script.display().to_string();
        let out = run_program_with_env(
            "python3",
            &[script.as_str(), addr, "foo:bar", "foo:baz", ""],
            &[("SASL_PATH", sasl_plugins())],
            WAIT,
        );
        assert!(
            out.status.success(),
            "pylibmc against {addr}: {}",
            out.stderr
        );
        out.stdout
    };
    let want = run(&sasl.memcached.addr());
    assert!(
        want.contains("foo:bar: set True get 'sasl-value'"),
        "against memcached -S: {want}"
    );
    assert_eq!(run(&proxy.listen), want);
}
