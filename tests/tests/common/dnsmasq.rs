//! A real DNS server for tests: dnsmasq (Debian's `dnsmasq-base`, installed by scripts/test)
//! on a loopback port, answering from a hosts file and SRV records with a chosen TTL.
//! Shared by the test files that `#[path]` this module in.
#![allow(dead_code)] // Each test file uses part of it.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use memroute_tests::*;

/// dnsmasq starts, or re-reads its hosts file, within this.
const START_DEADLINE: Duration = Duration::from_secs(15);

/// A dnsmasq process answering on 127.0.0.1:`port` from `hosts` and `srv` records only
/// (no upstream, no /etc/hosts), every answer with TTL `ttl`. Killed on drop.
pub struct Dnsmasq {
    child: Option<Child>,
    pub port: u16,
    ttl: u32,
    srv: Vec<String>,
    dir: TempDir,
    hosts: PathBuf,
}

impl Dnsmasq {
    pub fn start(hosts: &[String], srv: &[String], ttl: u32) -> Dnsmasq {
        let dir = TempDir::new("dnsmasq");
        let path = dir.path().join("hosts");
        let mut server = Dnsmasq {
            child: None,
            port: free_port(),
            ttl,
            srv: srv.to_vec(),
            dir,
            hosts: path,
        };
        server.write_hosts(hosts);
        server.spawn();
        server
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("dnsmasq.log")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn spawn(&mut self) {
        let program = find_program("dnsmasq").unwrap_or_else(|| {
            panic!("dnsmasq is not installed: run scripts/test (it installs dnsmasq-base)")
        });
        let _ = std::fs::remove_file(self.log_path());
        let mut command = Command::new(program);
        command
            .arg("--keep-in-foreground")
            .arg("--conf-file=/dev/null")
            .arg(format!("--port={}", self.port))
            .arg("--listen-address=127.0.0.1")
            .arg("--bind-interfaces")
            .arg("--no-resolv")
            .arg("--no-hosts")
            .arg("--pid-file")
            .arg("--user=root")
            .arg("--group=root")
            .arg(format!("--addn-hosts={}", self.hosts.display()))
            .arg(format!("--local-ttl={}", self.ttl))
            .arg(format!("--log-facility={}", self.log_path().display()))
            .arg("--log-queries");
        for record in &self.srv {
            command.arg(format!("--srv-host={record}"));
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn dnsmasq");
        self.child = Some(child);
        // dnsmasq binds its sockets before it logs "started".
        let started = poll_until(START_DEADLINE, || {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("dnsmasq exited: {status}\n{}", self.log());
                }
            }
            self.log().contains("started")
        });
        assert!(started, "dnsmasq did not start\n{}", self.log());
    }

    /// Replaces the hosts file and tells dnsmasq (SIGHUP re-reads it and clears its cache).
    pub fn set_hosts(&self, lines: &[String]) {
        self.write_hosts(lines);
        let pid = self.child.as_ref().map(Child::id).expect("dnsmasq runs");
        let reloads = self.log().matches("read ").count();
        signal_pid(pid, "HUP");
        assert!(
            poll_until(START_DEADLINE, || self.log().matches("read ").count()
                > reloads),
            "dnsmasq did not re-read its hosts file\n{}",
            self.log()
        );
    }

    fn write_hosts(&self, lines: &[String]) {
        let staged = self
            .dir
            .write("hosts.new", &format!("{}\n", lines.join("\n")));
        std::fs::rename(staged, &self.hosts).expect("replace the hosts file");
    }

    /// New SRV records: dnsmasq reads them only at start, so it restarts on the same port.
    pub fn set_srv(&mut self, srv: &[String]) {
        self.stop();
        self.srv = srv.to_vec();
        self.spawn();
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        self.stop();
    }
}
