//! The admin panel in a real browser: headless Chromium loads `GET /`, whose script reads
//! `GET /state`; the DOM names every pool and server, and a memcached that stops shows as
//! down within a few seconds.
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use memroute_tests::*;

/// The panel's DOM after its script ran (Chromium's virtual time lets the first
/// refreshes happen), from a browser profile of its own.
fn rendered(url: &str, profile: &TempDir) -> String {
    let chromium = find_program("chromium")
        .or_else(|| find_program("chromium-browser"))
        .expect("chromium is not installed: run scripts/test (it installs it) or apt-get install -y chromium");
    let mut child = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--virtual-time-budget=5000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromium");
    let mut out = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut dom = String::new();
        std::io::Read::read_to_string(&mut out, &mut dom).map(|_| dom)
    });
    // A browser that hangs must not hang the suite.
    let deadline = Instant::now() + Duration::from_secs(90);
    while child.try_wait().expect("wait chromium").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    reader.join().expect("reader").expect("read the DOM")
}

/// The text of the row of `server` in the section of `pool`.
fn server_row<'a>(dom: &'a str, pool: &str, server: &str) -> Option<&'a str> {
    let section = &dom[dom.find(&format!("data-pool=\"{pool}\""))?..];
    let section = &section[..section.find("</section>").unwrap_or(section.len())];
    let row = &section[section.find(&format!("data-server=\"{server}\""))?..];
    Some(&row[..row.find("</tr>").unwrap_or(row.len())])
}

#[test]
fn the_panel_names_every_pool_and_server_and_shows_a_stopped_one_down() {
    let a1 = Memcached::start();
    let mut a2 = Memcached::start();
    let b1 = Memcached::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let second = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let config = format!(
        "[proxy]\nlisten = [\"{listen}\", {{ address = \"{second}\", route = \"sessions\" }}]\n\
         workers = 2\nroute = \"main\"\nzone = \"zone-a\"\n\n\
         [pools.main]\nservers = [\"{}\", \"{}\"]\nzone = \"zone-a\"\n\n\
         [pools.sessions]\nservers = [\"{}\"]\nzone = \"zone-b\"\n\n\
         [admin]\nlisten = \"{admin}\"\n",
        a1.addr(),
        a2.addr(),
        b1.addr()
    );
    let proxy = Memroute::start(&config);
    let mut c = proxy.connect();
    for i in 0..200 {
        c.set(&format!("panel{i}"), b"v");
    }
    let profile = TempDir::new("chromium");
    let url = format!("http://{admin}/");

    let dom = rendered(&url, &profile);
    for name in ["main", "sessions"] {
        assert!(
            dom.contains(&format!("data-pool=\"{name}\"")),
            "pool {name} in\n{dom}"
        );
    }
    for (pool, server) in [
        ("main", a1.addr()),
        ("main", a2.addr()),
        ("sessions", b1.addr()),
    ] {
        let row = server_row(&dom, pool, &server)
            .unwrap_or_else(|| panic!("no row for {server} of {pool} in\n{dom}"));
        assert!(row.contains(">up<"), "{server} is up: {row}");
    }
    assert!(
        dom.contains(&listen) && dom.contains(&second),
        "listeners in\n{dom}"
    );
    assert!(
        dom.contains(r#"<div id="banner" class="banner" style="display: none;"></div>"#),
        "the panel read /state without an error:\n{dom}"
    );
    // The proxy's zone beside its workers, and each pool's beside its hashing.
    assert!(dom.contains(", 2 workers, zone zone-a<"), "{dom}");
    for (pool, zone) in [("main", "zone-a"), ("sessions", "zone-b")] {
        let at = dom
            .find(&format!("data-pool=\"{pool}\""))
            .expect("the pool's section");
        let section = &dom[at..];
        let header = &section[..section.find("</h3>").expect("the pool's header")];
        assert!(header.contains(&format!(", zone {zone}")), "{header}");
    }

    // A stopped memcached: the panel says so within a few seconds.
    let stopped = a2.addr();
    a2.kill();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let dom = rendered(&url, &profile);
        let row = server_row(&dom, "main", &stopped)
            .unwrap_or_default()
            .to_string();
        if row.contains(">down") {
            assert!(row.contains("connection refused"), "why it is down: {row}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{stopped} still not shown down 30 s after memcached stopped: {row}"
        );
    }
}

/// An idle proxy with one worker and no zone: the panel says "1 worker" and "no zone", and
/// flags no server's load (a single request is no share to compare).
#[test]
fn an_idle_one_worker_panel_says_so_and_flags_no_load() {
    let servers = [Memcached::start(), Memcached::start()];
    let addrs: Vec<String> = servers.iter().map(Memcached::addr).collect();
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let config = format!(
        "{}\n[admin]\nlisten = \"{admin}\"\n",
        simple_config(&listen, &addrs, "")
    );
    let proxy = Memroute::start(&config);
    proxy.connect().set("one-key", b"v");
    let profile = TempDir::new("chromium-idle");
    let dom = rendered(&format!("http://{admin}/"), &profile);
    assert!(dom.contains(", 1 worker, no zone<"), "{dom}");
    for server in &addrs {
        let row = server_row(&dom, "main", server)
            .unwrap_or_else(|| panic!("no row for {server} in\n{dom}"));
        assert!(row.contains(">up<"), "{row}");
        assert!(
            !row.contains('×') && !row.contains("warn"),
            "load flagged: {row}"
        );
    }
}
