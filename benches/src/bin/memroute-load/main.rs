//! memroute-load: a closed- or open-loop memcached load generator for the end-to-end bench.
//!
//! It drives the *same* load against direct memcached, twemproxy and memroute so
//! that `scripts/bench` can compare them in one run. Shape of a run:
//!
//! ```text
//!   populate (set every key once) -> warmup (not recorded) -> measured window -> JSON line on stdout
//!                                           |                         |
//!                                  "# measure start"          "# measure end"   (stderr markers)
//! ```
//!
//! Each of `--connections` connections is an independent closed loop: it writes
//! `--pipeline` requests in one write, then reads exactly that many replies, and
//! repeats. Latency of a request is the time from that write to the end of its
//! reply. A multi-get of N keys is one op (keys/s is reported separately).
//!
//! With `--rate R` the loop is open instead (module `open`): requests are offered at
//! scheduled times (Poisson or evenly spaced) whatever the replies do, and latency runs from
//! each request's *scheduled* time to the end of its reply (coordinated omission corrected).
//!
//! By default everything runs on ONE OS thread (a current-thread tokio runtime),
//! so the generator takes one core of a small machine; `--threads N` changes it.
//!
//! `--hot-share F` makes a share F of the keys of gets one hot key, `hotkey:0000000`
//! (set once, with a `--hot-value-size` value; sets never touch it), the rest uniform
//! over `--keys` (the storm scenario of scripts/bench). The summary's `hot_gets` counts
//! every get of the hot key sent, warmup included, `hot_gets_window` those sent inside the
//! measured window (closed loop), to set against the servers' counters.
//!
//! `--single-gets F` (with `--multiget N` > 1) makes a share F of gets ask for one key,
//! so single-key gets run beside the multi-gets (collapsing's per-key lookup exists only
//! once a worker has served a single-key get: scripts/bench-policy-callgrind's SINGLE).
//!
//! `--cpu NAME=PID` samples utime+stime of that process from /proc exactly at the
//! window boundaries, so CPU per op covers the measured window only (not the
//! populate or warmup phases).
//!
//! `--tls-ca FILE` speaks TLS (rustls, ring provider, TLS 1.3 or 1.2) to the target,
//! verifying its certificate against FILE for `--tls-server-name`; `--tls-cert` and
//! `--tls-key` present a client certificate (mutual TLS). Connections are opened before
//! the warmup ends, so the window measures the record layer, not handshakes.
#![forbid(unsafe_code)]

use std::cell::Cell;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use memroute_benches::hist::Histogram;
use memroute_benches::open_loop::Arrival;
use memroute_net::Stream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod open;

#[derive(Debug, Parser)]
#[command(
    name = "memroute-load",
    about = "closed- or open-loop memcached load generator (text or binary protocol)"
)]
struct Args {
    /// Target address (memcached, twemproxy or memroute). Loopback only by design.
    #[arg(long, default_value = "127.0.0.1:11211")]
    addr: String,
    /// Number of client connections.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Length of the measured window, e.g. 10s, 500ms.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Warmup before the measured window (load runs, nothing is recorded).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    warmup: Duration,
    /// Size of every value in bytes.
    #[arg(long, default_value_t = 64)]
    value_size: usize,
    /// Fraction of ops that are gets (the rest are sets).
    #[arg(long, default_value_t = 0.9)]
    get_ratio: f64,
    /// Keyspace size; every key is set once before the warmup so gets hit.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Keys per get: 1 sends `get k`, N sends `get k1 .. kN` (one op).
    #[arg(long, default_value_t = 1)]
    multiget: usize,
    /// With --multiget N > 1: the share of gets that ask for one key (`get k`; GET in
    /// binary) instead of N, e.g. so single-key gets run beside multi-gets.
    #[arg(long, default_value_t = 0.0)]
    single_gets: f64,
    /// Share of the keys of gets that are the one hot key `hotkey:0000000` (0 = none).
    #[arg(long, default_value_t = 0.0)]
    hot_share: f64,
    /// Size of the hot key's value in bytes (default: --value-size).
    #[arg(long)]
    hot_value_size: Option<usize>,
    /// Requests written back to back per connection before reading the replies.
    #[arg(long, default_value_t = 1)]
    pipeline: usize,
    /// OS threads for the load generator (1 = current-thread runtime).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Skip the populate phase (keys already set).
    #[arg(long)]
    no_populate: bool,
    /// Give up on a reply after this long (a hung target must not hang the bench).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    reply_timeout: Duration,
    /// Sample CPU of a process during the window: NAME=PID (repeatable).
    #[arg(long = "cpu", value_parser = parse_cpu_target)]
    cpu: Vec<(String, u32)>,
    /// Clock ticks per second of /proc/PID/stat (getconf CLK_TCK).
    #[arg(long, default_value_t = 100)]
    clk_tck: u64,
    /// Open loop: total ops/s to offer (0 = closed loop). Requests leave at scheduled times
    /// (see --arrival) on whichever connection is idle, paced by a timerfd on one thread,
    /// whatever the replies do; latency counts from each request's scheduled time, so
    /// queueing anywhere (the generator included) shows. One request at a time per
    /// connection unless all are busy: use enough connections for rate x latency.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Open loop: how requests arrive: `poisson` (exponential gaps, mutilate's default: many
    /// independent clients) or `uniform` (evenly spaced, wrk2's).
    #[arg(long, default_value = "poisson")]
    arrival: Arrival,
    /// Open loop: poll without sleeping when the next send is due within this long (e.g.
    /// 50us; 0 = always sleep on the timer until a send is due). Sleeping costs a timer
    /// interrupt and a wake-up per send, which in a VM can be tens of µs of CPU and late sends.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    spin: Duration,
    /// Label copied into the JSON summary.
    #[arg(long, default_value = "")]
    label: String,
    /// No per-second progress lines on stderr.
    #[arg(long)]
    quiet: bool,
    /// Speak memcached's binary protocol: a get is GET (one key) or GETKQ x N + NOOP,
    /// a set is SET. The populate phase stays text.
    #[arg(long)]
    binary: bool,
    /// Speak TLS to the target, trusting the CAs in this PEM file.
    #[arg(long)]
    tls_ca: Option<std::path::PathBuf>,
    /// Name the target's certificate must carry (TLS only).
    #[arg(long, default_value = "localhost")]
    tls_server_name: String,
    /// Client certificate chain (PEM) for mutual TLS; needs --tls-key.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    let n: f64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    let secs = match unit {
        "s" => n,
        "ms" => n / 1e3,
        "us" => n / 1e6,
        "m" => n * 60.0,
        _ => return Err(format!("bad duration unit in {s:?} (use s, ms, us, m)")),
    };
    Ok(Duration::from_secs_f64(secs))
}

fn parse_cpu_target(s: &str) -> Result<(String, u32), String> {
    let (name, pid) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=PID, got {s:?}"))?;
    let pid: u32 = pid.parse().map_err(|_| format!("bad pid in {s:?}"))?;
    Ok((name.to_string(), pid))
}

/// Counters shared by all connections; relaxed atomics are enough (they are only summed).
#[derive(Debug, Default)]
struct Shared {
    /// Ops completed since start (any phase), for progress lines.
    ops_total: AtomicU64,
    errors_total: AtomicU64,
    /// Set when the measured window is over: connections stop after their current batch.
    stop: AtomicBool,
}

/// What one connection measured inside the window.
#[derive(Debug, Default)]
struct ConnStats {
    ops: u64,
    gets: u64,
    sets: u64,
    keys_requested: u64,
    hits: u64,
    misses: u64,
    stored: u64,
    /// `SERVER_ERROR ...` replies.
    server_errors: u64,
    /// `CLIENT_ERROR ...` replies.
    client_errors: u64,
    /// `ERROR` and anything else unexpected.
    other_errors: u64,
    hist: Histogram,
}

impl ConnStats {
    fn merge(&mut self, o: &ConnStats) {
        self.ops += o.ops;
        self.gets += o.gets;
        self.sets += o.sets;
        self.keys_requested += o.keys_requested;
        self.hits += o.hits;
        self.misses += o.misses;
        self.stored += o.stored;
        self.server_errors += o.server_errors;
        self.client_errors += o.client_errors;
        self.other_errors += o.other_errors;
        self.hist.merge(&o.hist);
    }
    /// Counts one op that completed inside the window, `latency_ns` after it was sent (closed
    /// loop) or due (open loop).
    fn record(&mut self, kind: Kind, outcome: &Outcome, latency_ns: u64) {
        self.ops += 1;
        self.hist.record(latency_ns);
        let keys = match kind {
            Kind::Get(keys) => {
                self.gets += 1;
                self.keys_requested += u64::from(keys);
                u64::from(keys)
            }
            Kind::Set => {
                self.sets += 1;
                0
            }
        };
        match outcome {
            Outcome::Values(n) => {
                self.hits += n;
                self.misses += keys.saturating_sub(*n);
            }
            Outcome::Stored => self.stored += 1,
            Outcome::ServerError => self.server_errors += 1,
            Outcome::ClientError => self.client_errors += 1,
            Outcome::Other => self.other_errors += 1,
        }
    }

    fn errors(&self) -> u64 {
        self.server_errors + self.client_errors + self.other_errors
    }
}

/// Small, fast, deterministic PRNG (xorshift64*): the load must not depend on a crate's RNG speed.
#[derive(Debug)]
struct Rng(Cell<u64>);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(Cell::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1))
    }
    fn next(&self) -> u64 {
        let mut x = self.0.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&self, n: u64) -> u64 {
        // Multiply-shift: unbiased enough for a keyspace and free of division.
        ((self.next() >> 32) * n) >> 32
    }
    fn unit(&self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The hot key of `--hot-share` (as wide as the others; its own prefix for `stats detail`).
const HOT_KEY: &[u8] = b"hotkey:0000000";

/// Appends the key of one get: the hot key with the plan's hot share, else a uniform one.
fn get_key(buf: &mut Vec<u8>, plan: &Plan, rng: &Rng) {
    if plan.hot_share > 0.0 && rng.unit() < plan.hot_share {
        plan.hot_gets.fetch_add(1, Ordering::Relaxed);
        buf.extend_from_slice(HOT_KEY);
    } else {
        key(buf, rng.below(plan.keys));
    }
}

fn key(buf: &mut Vec<u8>, i: u64) {
    // Fixed-width keys so every request of a kind has the same size.
    let _ = write!(VecWriter(buf), "bench:{i:08}");
}

/// `fmt::Write` adapter so keys are formatted straight into the output buffer.
struct VecWriter<'a>(&'a mut Vec<u8>);
impl std::fmt::Write for VecWriter<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// A get of this many keys.
    Get(u32),
    Set,
}

/// How many keys the next get asks for: the plan's multi-get size, or one for the
/// `--single-gets` share.
fn get_keys(plan: &Plan, rng: &Rng) -> usize {
    if plan.single_gets > 0.0 && plan.multiget > 1 && rng.unit() < plan.single_gets {
        return 1;
    }
    plan.multiget
}

/// Outcome of parsing one reply from the front of the buffer.
#[derive(Debug)]
enum Reply {
    /// Not enough bytes yet.
    Incomplete,
    /// A complete reply `consumed` bytes long.
    Done { consumed: usize, outcome: Outcome },
}

#[derive(Debug)]
enum Outcome {
    Values(u64),
    Stored,
    ServerError,
    ClientError,
    Other,
}

fn find_crlf(buf: &[u8], from: usize) -> Option<usize> {
    buf.get(from..)?
        .windows(2)
        .position(|w| w == b"\r\n")
        .map(|p| from + p)
}

/// Parses one reply to `kind`. Never panics on malformed input: anything
/// unexpected that is still line-framed counts as an error; a stream that cannot
/// be framed any more is returned as Err so the run stops with a clear message.
fn parse_reply(buf: &[u8], kind: Kind) -> Result<Reply, String> {
    let mut pos = 0;
    let mut values = 0u64;
    loop {
        let Some(eol) = find_crlf(buf, pos) else {
            if buf.len() - pos > 64 * 1024 {
                return Err("reply line longer than 64 KiB without CRLF".into());
            }
            return Ok(Reply::Incomplete);
        };
        let line = &buf[pos..eol];
        let next = eol + 2;
        // Error lines replace the whole reply, whatever the command was.
        let error = if line.starts_with(b"SERVER_ERROR") {
            Some(Outcome::ServerError)
        } else if line.starts_with(b"CLIENT_ERROR") {
            Some(Outcome::ClientError)
        } else if line == b"ERROR" {
            Some(Outcome::Other)
        } else {
            None
        };
        if let Some(outcome) = error {
            return Ok(Reply::Done {
                consumed: next,
                outcome,
            });
        }
        match kind {
            Kind::Set => {
                let outcome = if line == b"STORED" {
                    Outcome::Stored
                } else {
                    Outcome::Other
                };
                return Ok(Reply::Done {
                    consumed: next,
                    outcome,
                });
            }
            Kind::Get(_) => {
                if line == b"END" {
                    return Ok(Reply::Done {
                        consumed: next,
                        outcome: Outcome::Values(values),
                    });
                }
                if !line.starts_with(b"VALUE ") {
                    return Err(format!(
                        "unexpected line in get reply: {:?}",
                        String::from_utf8_lossy(line)
                    ));
                }
                // VALUE <key> <flags> <bytes> [<cas>]
                let bytes = line
                    .split(|&b| b == b' ')
                    .nth(3)
                    .and_then(|f| std::str::from_utf8(f).ok())
                    .and_then(|f| f.parse::<usize>().ok())
                    .ok_or_else(|| {
                        format!("malformed VALUE line: {:?}", String::from_utf8_lossy(line))
                    })?;
                let end = next + bytes + 2;
                if buf.len() < end {
                    return Ok(Reply::Incomplete);
                }
                if &buf[end - 2..end] != b"\r\n" {
                    return Err("value block not terminated by CRLF".into());
                }
                values += 1;
                pos = end;
            }
        }
    }
}

/// One binary request header (magic 0x80); the body follows.
fn binary_header(out: &mut Vec<u8>, opcode: u8, key_len: usize, extras: usize, body: usize) {
    out.extend_from_slice(&[0x80, opcode]);
    out.extend_from_slice(&(key_len as u16).to_be_bytes());
    out.extend_from_slice(&[extras as u8, 0, 0, 0]);
    out.extend_from_slice(&(body as u32).to_be_bytes());
    out.extend_from_slice(&[0; 12]);
}

/// Appends one binary op: GET (one key), GETKQ x N + NOOP (multi-get) or SET.
fn binary_request(out: &mut Vec<u8>, plan: &Plan, rng: &Rng) -> Kind {
    let mut k = Vec::with_capacity(16);
    if rng.unit() < plan.get_ratio {
        let n = get_keys(plan, rng);
        let opcode = if n == 1 { 0x00 } else { 0x0d };
        for _ in 0..n {
            k.clear();
            get_key(&mut k, plan, rng);
            binary_header(out, opcode, k.len(), 0, k.len());
            out.extend_from_slice(&k);
        }
        if n > 1 {
            binary_header(out, 0x0a, 0, 0, 0);
        }
        Kind::Get(n as u32)
    } else {
        key(&mut k, rng.below(plan.keys));
        binary_header(out, 0x01, k.len(), 8, 8 + k.len() + plan.value.len());
        out.extend_from_slice(&[0; 8]);
        out.extend_from_slice(&k);
        out.extend_from_slice(&plan.value);
        Kind::Set
    }
}

/// Parses the binary responses of one op: a set's or single get's one response, or a
/// multi-get's hits up to and including the NOOP.
fn parse_binary_reply(buf: &[u8], kind: Kind) -> Result<Reply, String> {
    let mut pos = 0;
    let mut values = 0u64;
    loop {
        let Some(header) = buf.get(pos..pos + 24) else {
            return Ok(Reply::Incomplete);
        };
        if header[0] != 0x81 {
            return Err(format!("bad response magic {:#x}", header[0]));
        }
        let body = u32::from_be_bytes([header[8], header[9], header[10], header[11]]) as usize;
        let end = pos + 24 + body;
        if buf.len() < end {
            return Ok(Reply::Incomplete);
        }
        let status = u16::from_be_bytes([header[6], header[7]]);
        let opcode = header[1];
        pos = end;
        let outcome = match (kind, opcode, status) {
            (Kind::Get(_), 0x0d, 0) => {
                values += 1;
                continue;
            }
            (Kind::Get(_), 0x0a, _) => Outcome::Values(values),
            (Kind::Get(_), 0x00, 0) => Outcome::Values(1),
            (Kind::Get(_), 0x00, 1) => Outcome::Values(0),
            (Kind::Set, _, 0) => Outcome::Stored,
            (_, _, 0x84) => Outcome::ServerError,
            (_, _, 0x04) => Outcome::ClientError,
            _ => Outcome::Other,
        };
        return Ok(Reply::Done {
            consumed: pos,
            outcome,
        });
    }
}

/// Appends one op (text or binary, get or set as the plan's mix says) and returns its kind.
fn request(out: &mut Vec<u8>, plan: &Plan, rng: &Rng) -> Kind {
    if plan.binary {
        return binary_request(out, plan, rng);
    }
    if rng.unit() < plan.get_ratio {
        out.extend_from_slice(b"get");
        let n = get_keys(plan, rng);
        for _ in 0..n {
            out.push(b' ');
            get_key(out, plan, rng);
        }
        out.extend_from_slice(b"\r\n");
        Kind::Get(n as u32)
    } else {
        out.extend_from_slice(b"set ");
        key(out, rng.below(plan.keys));
        let _ = write!(VecWriter(out), " 0 0 {}\r\n", plan.value.len());
        out.extend_from_slice(&plan.value);
        out.extend_from_slice(b"\r\n");
        Kind::Set
    }
}

/// Where to connect, and how: plain TCP, or TLS with this client config.
#[derive(Debug, Clone)]
struct Target {
    addr: String,
    tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
}

impl Target {
    fn new(args: &Args) -> Result<Target, String> {
        let Some(ca) = &args.tls_ca else {
            return Ok(Target {
                addr: args.addr.clone(),
                tls: None,
            });
        };
        let certs = |path: &std::path::Path| {
            CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("{}: {e}", path.display()))
        };
        let mut roots = rustls::RootCertStore::empty();
        for cert in certs(ca)? {
            roots
                .add(cert)
                .map_err(|e| format!("{}: {e}", ca.display()))?;
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
        let config = match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => builder
                .with_client_auth_cert(
                    certs(cert)?,
                    PrivateKeyDer::from_pem_file(key)
                        .map_err(|e| format!("{}: {e}", key.display()))?,
                )
                .map_err(|e| e.to_string())?,
            _ => builder.with_no_client_auth(),
        };
        let name = ServerName::try_from(args.tls_server_name.clone())
            .map_err(|e| format!("--tls-server-name: {e}"))?;
        Ok(Target {
            addr: args.addr.clone(),
            tls: Some((Arc::new(config), name)),
        })
    }
}

#[derive(Debug, Clone)]
struct Plan {
    target: Target,
    value: Vec<u8>,
    get_ratio: f64,
    keys: u64,
    multiget: usize,
    /// Share of gets of one key when `multiget` > 1 (`--single-gets`).
    single_gets: f64,
    hot_share: f64,
    /// Gets of the hot key sent, shared by every connection.
    hot_gets: Arc<AtomicU64>,
    pipeline: usize,
    binary: bool,
    reply_timeout: Duration,
    warmup_end: Instant,
    end: Instant,
}

async fn connect(target: &Target) -> Result<Stream, String> {
    let addr = &target.addr;
    let s = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    // Small requests: without NODELAY Nagle would add delay to every pipelined batch.
    s.set_nodelay(true)
        .map_err(|e| format!("set_nodelay: {e}"))?;
    let Some((config, name)) = &target.tls else {
        return Ok(Stream::Tcp(s));
    };
    let tls = tokio_rustls::TlsConnector::from(config.clone())
        .connect(name.clone(), s)
        .await
        .map_err(|e| format!("TLS handshake with {addr}: {e}"))?;
    Ok(Stream::ClientTls(Box::new(tls)))
}

/// Reads until `buf[start..]` holds at least one more byte; errors on EOF or timeout.
async fn fill(stream: &mut Stream, buf: &mut Vec<u8>, timeout: Duration) -> Result<(), String> {
    if buf.capacity() - buf.len() < 16 * 1024 {
        buf.reserve(64 * 1024);
    }
    let n = tokio::time::timeout(timeout, stream.read_buf(buf))
        .await
        .map_err(|_| format!("no reply within {timeout:?}"))?
        .map_err(|e| format!("read: {e}"))?;
    if n == 0 {
        return Err("connection closed by the target".into());
    }
    Ok(())
}

/// Sets keys `[from, to)` on one connection, pipelined in batches of 100.
async fn populate_range(
    target: Target,
    value: Vec<u8>,
    from: u64,
    to: u64,
    timeout: Duration,
) -> Result<u64, String> {
    let mut s = connect(&target).await?;
    let mut out = Vec::with_capacity(64 * 1024);
    let mut inbuf = Vec::with_capacity(64 * 1024);
    let mut errors = 0;
    let mut i = from;
    while i < to {
        let batch_end = (i + 100).min(to);
        out.clear();
        for k in i..batch_end {
            out.extend_from_slice(b"set ");
            key(&mut out, k);
            let _ = write!(VecWriter(&mut out), " 0 0 {}\r\n", value.len());
            out.extend_from_slice(&value);
            out.extend_from_slice(b"\r\n");
        }
        s.write_all(&out).await.map_err(|e| format!("write: {e}"))?;
        let mut replies = 0;
        while replies < batch_end - i {
            match parse_reply(&inbuf, Kind::Set)? {
                Reply::Incomplete => fill(&mut s, &mut inbuf, timeout).await?,
                Reply::Done { consumed, outcome } => {
                    if !matches!(outcome, Outcome::Stored) {
                        errors += 1;
                    }
                    inbuf.drain(..consumed);
                    replies += 1;
                }
            }
        }
        i = batch_end;
    }
    Ok(errors)
}

/// Sets the hot key of `--hot-share` to a `--hot-value-size` value; returns 1 if not STORED.
async fn set_hot(target: &Target, args: &Args) -> Result<u64, String> {
    let size = args.hot_value_size.unwrap_or(args.value_size);
    let mut s = connect(target).await?;
    let mut out = Vec::with_capacity(size + 64);
    out.extend_from_slice(b"set ");
    out.extend_from_slice(HOT_KEY);
    let _ = write!(VecWriter(&mut out), " 0 0 {size}\r\n");
    out.extend((0..size).map(|i| b'a' + (i % 26) as u8));
    out.extend_from_slice(b"\r\n");
    s.write_all(&out).await.map_err(|e| format!("write: {e}"))?;
    let mut inbuf = Vec::with_capacity(1024);
    loop {
        match parse_reply(&inbuf, Kind::Set)? {
            Reply::Incomplete => fill(&mut s, &mut inbuf, args.reply_timeout).await?,
            Reply::Done { outcome, .. } => {
                return Ok(u64::from(!matches!(outcome, Outcome::Stored)))
            }
        }
    }
}

/// One closed-loop connection. Returns what it measured inside the window.
async fn run_conn(id: usize, plan: Arc<Plan>, shared: Arc<Shared>) -> Result<ConnStats, String> {
    let mut s = connect(&plan.target).await?;
    let rng = Rng::new(id as u64 + 1);
    let mut stats = ConnStats::default();
    let mut out = Vec::with_capacity(16 * 1024);
    let mut inbuf = Vec::with_capacity(64 * 1024);
    let mut kinds = Vec::with_capacity(plan.pipeline);
    loop {
        if shared.stop.load(Ordering::Relaxed) {
            return Ok(stats);
        }
        out.clear();
        kinds.clear();
        for _ in 0..plan.pipeline {
            kinds.push(request(&mut out, &plan, &rng));
        }
        let sent = Instant::now();
        s.write_all(&out).await.map_err(|e| format!("write: {e}"))?;
        let mut done = 0;
        while done < kinds.len() {
            let kind = kinds[done];
            let (consumed, outcome) = loop {
                let parsed = if plan.binary {
                    parse_binary_reply(&inbuf, kind)?
                } else {
                    parse_reply(&inbuf, kind)?
                };
                match parsed {
                    Reply::Incomplete => fill(&mut s, &mut inbuf, plan.reply_timeout).await?,
                    Reply::Done { consumed, outcome } => break (consumed, outcome),
                }
            };
            inbuf.drain(..consumed);
            done += 1;
            let now = Instant::now();
            shared.ops_total.fetch_add(1, Ordering::Relaxed);
            let is_error = matches!(
                outcome,
                Outcome::ServerError | Outcome::ClientError | Outcome::Other
            );
            if is_error {
                shared.errors_total.fetch_add(1, Ordering::Relaxed);
            }
            // Only ops that *complete* inside the window count; warmup and tail are ignored.
            if now < plan.warmup_end || now >= plan.end {
                continue;
            }
            stats.record(kind, &outcome, now.duration_since(sent).as_nanos() as u64);
        }
    }
}

/// utime + stime of a process in seconds, from /proc/PID/stat (fields 14 and 15).
fn proc_cpu_secs(pid: u32, clk_tck: u64) -> Result<f64, String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("/proc/{pid}/stat: {e}"))?;
    // The command name (field 2) may contain spaces: split after its closing ')'.
    let rest = text
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or("malformed /proc stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state), so utime (14) is index 11 and stime (15) index 12.
    let utime: u64 = fields
        .get(11)
        .and_then(|f| f.parse().ok())
        .ok_or("no utime in /proc stat")?;
    let stime: u64 = fields
        .get(12)
        .and_then(|f| f.parse().ok())
        .ok_or("no stime in /proc stat")?;
    Ok((utime + stime) as f64 / clk_tck as f64)
}

/// CPU seconds of every listed process, then (last) the whole machine's busy CPU seconds.
fn sample_cpu(targets: &[(String, u32)], clk_tck: u64) -> Result<Vec<f64>, String> {
    let mut out = targets
        .iter()
        .map(|(_, pid)| proc_cpu_secs(*pid, clk_tck))
        .collect::<Result<Vec<f64>, String>>()?;
    out.push(machine_busy_secs(clk_tck)?);
    Ok(out)
}

/// user + nice + system seconds of all CPUs together, from /proc/stat's first line: with the
/// processes' own CPU it tells how much *other* work ran during the window (a latency run
/// on a shared machine is only as good as that number is small). irq and softirq time are
/// left out: the traffic under test causes most of it.
fn machine_busy_secs(clk_tck: u64) -> Result<f64, String> {
    let text = std::fs::read_to_string("/proc/stat").map_err(|e| format!("/proc/stat: {e}"))?;
    let busy: u64 = text
        .lines()
        .next()
        .filter(|l| l.starts_with("cpu "))
        .ok_or("malformed /proc/stat")?
        .split_whitespace()
        .skip(1)
        .take(3)
        .map(|f| {
            f.parse::<u64>()
                .map_err(|_| "malformed /proc/stat".to_string())
        })
        .sum::<Result<u64, String>>()?;
    Ok(busy as f64 / clk_tck as f64)
}

/// The load generator's own CPU is always sampled as "load": in a saturated machine it is part of
/// what every op costs, and it shows whether the generator itself was the bottleneck.
fn with_self(mut targets: Vec<(String, u32)>) -> Vec<(String, u32)> {
    targets.push(("load".to_string(), std::process::id()));
    targets
}

/// What one measured window produced, in either loop.
#[derive(Debug)]
struct Measured {
    total: ConnStats,
    cpu_before: Vec<f64>,
    cpu_after: Vec<f64>,
    /// Gets of the hot key sent inside the window (closed loop, `--hot-share`).
    hot_window: u64,
    /// Open loop only: how it paced.
    open: Option<open::Report>,
}

/// Checks the arguments and sets every key once (so gets hit). Returns the target and the value.
async fn prepare(args: &Args) -> Result<(Target, Vec<u8>), String> {
    let value: Vec<u8> = (0..args.value_size)
        .map(|i| b'a' + (i % 26) as u8)
        .collect();
    if args.keys == 0 || args.connections == 0 || args.pipeline == 0 || args.multiget == 0 {
        return Err("--keys, --connections, --pipeline and --multiget must be > 0".into());
    }
    if args.rate > 0.0 && (args.pipeline != 1 || args.tls_ca.is_some() || args.threads > 1) {
        return Err(
            "--rate (open loop) sends one request at a time over plain TCP on one \
                    thread: drop --pipeline, --tls-ca and --threads"
                .into(),
        );
    }

    let target = Target::new(args)?;
    if !args.no_populate {
        // Populate over a few connections in parallel; it is not measured.
        let started = Instant::now();
        let parts = args.connections.min(8) as u64;
        let mut tasks = Vec::new();
        for p in 0..parts {
            let from = args.keys * p / parts;
            let to = args.keys * (p + 1) / parts;
            tasks.push(tokio::spawn(populate_range(
                target.clone(),
                value.clone(),
                from,
                to,
                args.reply_timeout,
            )));
        }
        let mut errors = 0;
        for t in tasks {
            errors += t.await.map_err(|e| format!("populate task: {e}"))??;
        }
        if args.hot_share > 0.0 {
            errors += set_hot(&target, args).await?;
        }
        if errors > 0 {
            return Err(format!("populate: {errors} sets were not STORED"));
        }
        if !args.quiet {
            eprintln!(
                "# populated {} keys in {:.2}s",
                args.keys,
                started.elapsed().as_secs_f64()
            );
        }
    }
    Ok((target, value))
}

fn plan(args: &Args, target: Target, value: Vec<u8>) -> Plan {
    let start = Instant::now();
    Plan {
        target,
        value,
        get_ratio: args.get_ratio,
        keys: args.keys,
        multiget: args.multiget,
        single_gets: args.single_gets,
        hot_share: args.hot_share,
        hot_gets: Arc::new(AtomicU64::new(0)),
        pipeline: args.pipeline,
        binary: args.binary,
        reply_timeout: args.reply_timeout,
        warmup_end: start + args.warmup,
        end: start + args.warmup + args.duration,
    }
}

/// The closed loop: every connection sends its next batch as soon as the last one is answered.
async fn measure_closed(args: &Args, plan: Plan) -> Result<Measured, String> {
    let start = Instant::now();
    let plan = Arc::new(plan);
    let shared = Arc::new(Shared::default());
    let mut conns = Vec::new();
    for id in 0..args.connections {
        conns.push(tokio::spawn(run_conn(id, plan.clone(), shared.clone())));
    }
    // Progress each second, CPU samples at the window boundaries, then stop.
    let mut cpu_before = Vec::new();
    let mut measuring = false;
    let mut last_ops = 0;
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::from_std(start + Duration::from_secs(1)),
        Duration::from_secs(1),
    );
    let warmup_sleep = tokio::time::sleep_until(tokio::time::Instant::from_std(plan.warmup_end));
    let end_sleep = tokio::time::sleep_until(tokio::time::Instant::from_std(plan.end));
    tokio::pin!(warmup_sleep, end_sleep);
    let mut warmup_done = args.warmup.is_zero();
    let mut hot_before = 0;
    if warmup_done {
        cpu_before = sample_cpu(&args.cpu, args.clk_tck)?;
        measuring = true;
        if !args.quiet {
            eprintln!("# measure start");
        }
    }
    let (cpu_after, hot_window) = loop {
        tokio::select! {
            _ = &mut warmup_sleep, if !warmup_done => {
                warmup_done = true;
                cpu_before = sample_cpu(&args.cpu, args.clk_tck)?;
                hot_before = plan.hot_gets.load(Ordering::Relaxed);
                measuring = true;
                if !args.quiet { eprintln!("# measure start"); }
            }
            _ = &mut end_sleep => {
                let cpu_after = sample_cpu(&args.cpu, args.clk_tck)?;
                let hot_window = plan.hot_gets.load(Ordering::Relaxed) - hot_before;
                shared.stop.store(true, Ordering::Relaxed);
                if !args.quiet { eprintln!("# measure end"); }
                break (cpu_after, hot_window);
            }
            _ = tick.tick() => {
                let ops = shared.ops_total.load(Ordering::Relaxed);
                if !args.quiet {
                    eprintln!(
                        "# t={:>5.1}s {} ops/s={} errors={}",
                        start.elapsed().as_secs_f64(),
                        if measuring { "measure" } else { "warmup " },
                        ops - last_ops,
                        shared.errors_total.load(Ordering::Relaxed),
                    );
                }
                last_ops = ops;
            }
        }
    };

    let mut total = ConnStats::default();
    for c in conns {
        let stats = c.await.map_err(|e| format!("connection task: {e}"))??;
        total.merge(&stats);
    }

    Ok(Measured {
        total,
        cpu_before,
        cpu_after,
        hot_window,
        open: None,
    })
}

/// The JSON summary line.
fn report(args: &Args, m: &Measured, hot_gets: u64) -> String {
    let total = &m.total;
    let secs = args.duration.as_secs_f64();
    let ops_per_sec = total.ops as f64 / secs;
    let q = |p: f64| total.hist.quantile(p) as f64 / 1000.0;
    let mut j = String::new();
    let _ = write!(
        j,
        "{{\"label\":{:?},\"addr\":{:?},\"connections\":{},\"threads\":{},\"duration_s\":{},\"warmup_s\":{},\
\"value_size\":{},\"get_ratio\":{},\"keys\":{},\"multiget\":{},\"pipeline\":{},\
\"ops\":{},\"ops_per_sec\":{:.1},\"keys_per_sec\":{:.1},\"gets\":{},\"sets\":{},\"hits\":{},\"misses\":{},\
\"errors\":{},\"server_errors\":{},\"client_errors\":{},\"other_errors\":{},\
\"lat_us\":{{\"mean\":{:.1},\"p50\":{:.1},\"p90\":{:.1},\"p99\":{:.1},\"p999\":{:.1},\"max\":{:.1}}}",
        args.label,
        args.addr,
        args.connections,
        args.threads,
        secs,
        args.warmup.as_secs_f64(),
        args.value_size,
        args.get_ratio,
        args.keys,
        args.multiget,
        args.pipeline,
        total.ops,
        ops_per_sec,
        (total.keys_requested + total.sets) as f64 / secs,
        total.gets,
        total.sets,
        total.hits,
        total.misses,
        total.errors(),
        total.server_errors,
        total.client_errors,
        total.other_errors,
        total.hist.mean() / 1000.0,
        q(0.50),
        q(0.90),
        q(0.99),
        q(0.999),
        total.hist.max() as f64 / 1000.0,
    );
    if let Some(open) = &m.open {
        open.write_json(&mut j, &total.hist);
    }
    j.push_str(",\"cpu\":{");
    for (i, (name, pid)) in args.cpu.iter().enumerate() {
        let used = m.cpu_after.get(i).copied().unwrap_or(0.0)
            - m.cpu_before.get(i).copied().unwrap_or(0.0);
        let per_op = if total.ops > 0 {
            used * 1e6 / total.ops as f64
        } else {
            0.0
        };
        let _ = write!(
            j,
            "{}{:?}:{{\"pid\":{},\"cpu_s\":{:.3},\"cpu_util\":{:.3},\"us_per_op\":{:.3}}}",
            if i > 0 { "," } else { "" },
            name,
            pid,
            used,
            used / secs,
            per_op
        );
    }
    j.push('}');
    // The machine's busy CPU in the window (last sample): minus the processes above, other work.
    let machine =
        m.cpu_after.last().copied().unwrap_or(0.0) - m.cpu_before.last().copied().unwrap_or(0.0);
    let _ = write!(
        j,
        ",\"hot_share\":{},\"hot_gets\":{hot_gets},\"hot_gets_window\":{},\"machine_busy_cpu_s\":{machine:.3}}}",
        args.hot_share, m.hot_window
    );
    j
}

fn main() {
    let mut args = Args::parse();
    args.cpu = with_self(std::mem::take(&mut args.cpu));
    let runtime = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            eprintln!("memroute-load: cannot start runtime: {e}");
            std::process::exit(2);
        }
    };
    let hot_gets = Arc::new(AtomicU64::new(0));
    let measured = runtime
        .block_on(prepare(&args))
        .and_then(|(target, value)| {
            let mut plan = plan(&args, target, value);
            plan.hot_gets = hot_gets.clone();
            if args.rate > 0.0 {
                // The open loop paces on a thread of its own making (this one), outside tokio.
                open::measure(&args, &plan)
            } else {
                runtime.block_on(measure_closed(&args, plan))
            }
        });
    match measured {
        Ok(m) => println!("{}", report(&args, &m, hot_gets.load(Ordering::Relaxed))),
        Err(e) => {
            eprintln!("memroute-load: error: {e}");
            std::process::exit(1);
        }
    }
}
