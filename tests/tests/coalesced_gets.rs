//! Gets of many clients that meet on one backend connection, every reply checked byte for
//! byte against a model of the cache the test filled itself.
//!
//! ```text
//!   client 0: 60-100 requests in one write ─┐
//!   client 1: ...                            ├─> memroute (1 worker) ─ 1 connection/server ─> memcached
//!   client 7: ...                            ┘
//! ```
//!
//! The clients start each round together (a gate), so gets of different clients queue on the
//! same backend connection between two writes: the case where a proxy may send them to
//! memcached as one `get k1 k2 ...` and split the reply back per request by its VALUE keys.
//! Whatever the proxy does with them, each client must get exactly what memcached would have
//! answered it alone: hits and misses, a key twice in one request, the same key in several
//! clients' requests, `gets` with memcached's own cas next to plain `get`s, `gat`/`gats`, meta
//! `mg` (quiet too), binary get/getk/getq/getkq, a client's own `set`/`delete` (noreply too)
//! read back right after, values that look like replies (`\r\nEND\r\n`, `VALUE x 0 1`), empty
//! values, 100 KB and 900 KB values among tiny ones, 250-byte keys, 100-key gets, a key too
//! long, a NUL in a line, and clients that hang up in the middle of their pipeline.
//!
//! Each pipeline ends with `mn`, so a reply with bytes too many or too few fails at once. The
//! shared keys are never written while clients run, so their cas is read from each memcached
//! directly beforehand. Every pseudo-random choice comes from a fixed-seed xorshift, so a
//! failure replays the same requests.
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use memroute_tests::*;

/// How long a client waits at the start gate for the others: long enough for any round, so
/// reaching it means a client is stuck (one that failed breaks the gate at once).
const GATE_TIMEOUT: Duration = Duration::from_secs(40);

/// The pool's reply timeout, and how long a client waits for the next bytes of its replies:
/// generous, because this file checks replies, not timeouts, and a debug build on a machine
/// shared with builds (load 5 on 2 cores seen) can take seconds with megabytes in flight.
/// Only a failing run waits this long.
const POOL_LINES: &str = "timeout = \"20s\"";
const REPLY_TIMEOUT: Duration = Duration::from_secs(20);

// ---- deterministic choices ----------------------------------------------------------------

/// xorshift64*: small, fast and deterministic; a fixed seed replays the same test.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// 0..n
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// lo..=hi
    fn between(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    fn percent(&mut self, p: usize) -> bool {
        self.below(100) < p
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

// ---- the model ----------------------------------------------------------------------------

/// A stored value as memcached reports it.
#[derive(Debug, Clone)]
struct Item {
    flags: u32,
    value: Vec<u8>,
    cas: u64,
}

/// The shared keys: stored before the clients start and never written while they run.
#[derive(Debug, Default)]
struct Cache {
    items: HashMap<String, Item>,
    /// Stored keys with small values (some 200-250 bytes long, some with a tab or non-ASCII).
    hits: Vec<String>,
    /// Keys never stored (some long, some a stored key with a suffix).
    misses: Vec<String>,
    /// Keys never stored that are the start of stored keys (`hit:`, a long key cut short):
    /// a reply's VALUE key must match whole, not by its start.
    prefixes: Vec<String>,
    /// Keys with ~100 KB values.
    big: Vec<String>,
    /// Keys with ~900 KB values.
    huge: Vec<String>,
}

/// What a reply must hold for a value: text `VALUE` blocks, with or without cas.
fn push_value(out: &mut Vec<u8>, key: &str, flags: u32, value: &[u8], cas: Option<u64>) {
    let head = match cas {
        Some(cas) => format!("VALUE {key} {flags} {} {cas}\r\n", value.len()),
        None => format!("VALUE {key} {flags} {}\r\n", value.len()),
    };
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Pieces values are built from: bytes that look like reply framing, so a reader that looks
/// for `END` or `VALUE` inside data (instead of skipping it by its length) goes wrong.
const TRICKY: [&[u8]; 12] = [
    b"\r\nEND\r\n",
    b"VALUE x 0 1\r\n",
    b"VALUE hit:1 0 3\r\n",
    b"END\r\n",
    b"EN\r\n",
    b"MN\r\n",
    b"VA 1 f0\r\n",
    b"\r\n",
    b"\n",
    b" ",
    b"\0",
    b"\xff\x80",
];

/// A small value: empty, a few bytes or up to 3 KB, mixing plain bytes and [`TRICKY`] pieces.
fn small_value(rng: &mut Rng, tag: &str) -> Vec<u8> {
    let target = match rng.below(10) {
        0 => return Vec::new(),
        1..=6 => rng.between(1, 40),
        _ => rng.between(100, 3000),
    };
    let mut value = Vec::with_capacity(target + 16);
    while value.len() < target {
        if rng.percent(30) {
            value.extend_from_slice(TRICKY[rng.below(TRICKY.len())]);
        } else if rng.percent(20) {
            value.extend_from_slice(tag.as_bytes());
        } else {
            let n = rng.between(1, 12);
            value.extend((0..n).map(|_| b'a' + rng.below(26) as u8));
        }
    }
    value.truncate(target);
    value
}

/// A value of `len` bytes unique to `tag`, with framing look-alikes every few KB.
fn large_value(rng: &mut Rng, tag: &str, len: usize) -> Vec<u8> {
    let mut value = Vec::with_capacity(len + 64);
    while value.len() < len {
        value.extend_from_slice(tag.as_bytes());
        value.extend_from_slice(TRICKY[rng.below(TRICKY.len())]);
        let n = rng.between(500, 4000);
        let letter = b'a' + rng.below(26) as u8;
        value.extend(std::iter::repeat_n(letter, n));
    }
    value.truncate(len);
    value
}

fn flags(rng: &mut Rng) -> u32 {
    match rng.below(5) {
        0 => 0,
        1 => u32::MAX,
        _ => rng.next() as u32,
    }
}

/// `prefix` padded to exactly `len` bytes (some of them a tab or a two-byte character, which
/// memcached keys may hold).
fn long_key(rng: &mut Rng, prefix: &str, len: usize) -> String {
    let mut key = prefix.to_string();
    while key.len() < len {
        let c = match rng.below(20) {
            0 => '\t',
            1 if key.len() + 2 <= len => 'é',
            _ => char::from(b'a' + rng.below(26) as u8),
        };
        key.push(c);
    }
    key
}

impl Cache {
    /// `hits` stored keys (a quarter of them 200-250 bytes long), `misses` never-stored ones,
    /// and `big`/`huge` keys with 100 KB and 900 KB values, with their flags and values.
    fn plan(rng: &mut Rng, hits: usize, misses: usize, big: usize, huge: usize) -> Cache {
        let mut cache = Cache::default();
        for i in 0..hits {
            let key = match i % 4 {
                3 => {
                    let n = rng.between(200, 250);
                    long_key(rng, &format!("hit:{i}:"), n)
                }
                _ => format!("hit:{i}"),
            };
            let item = Item {
                flags: flags(rng),
                value: small_value(rng, &key),
                cas: 0,
            };
            cache.items.insert(key.clone(), item);
            cache.hits.push(key);
        }
        // Keys that read like reply words.
        for key in ["END", "VALUE", "EN", "MN", "hit:END"] {
            let item = Item {
                flags: flags(rng),
                value: small_value(rng, key),
                cas: 0,
            };
            cache.items.insert(key.to_string(), item);
            cache.hits.push(key.to_string());
        }
        let long_hits: Vec<String> = cache
            .hits
            .iter()
            .filter(|k| k.len() > 100)
            .cloned()
            .collect();
        for i in 0..misses {
            cache.misses.push(match i % 3 {
                0 => format!("miss:{i}"),
                1 => long_key(rng, &format!("miss:{i}:"), 250),
                _ => format!("hit:{}:gone", i % hits.max(1)),
            });
        }
        let cut_short = long_hits.iter().take(misses / 4).map(|stored| {
            let mut cut = stored.clone();
            cut.pop();
            cut
        });
        let starts = ["hit", "hit:", "VALU", "E", "M"].map(String::from);
        cache.prefixes = starts.into_iter().chain(cut_short).collect();
        for key in cache.misses.iter().chain(&cache.prefixes) {
            assert!(!cache.items.contains_key(key), "{key:?} is stored");
        }
        for (n, size, list) in [
            (big, 100_000, &mut cache.big),
            (huge, 900_000, &mut cache.huge),
        ] {
            for i in 0..n {
                let key = format!("big:{size}:{i}");
                let len = size + rng.below(5000);
                let item = Item {
                    flags: flags(rng),
                    value: large_value(rng, &key, len),
                    cas: 0,
                };
                cache.items.insert(key.clone(), item);
                list.push(key);
            }
        }
        cache
    }

    /// Stores every item through `proxy` (so each lands where memroute routes it), then reads
    /// each one's cas from the memcached that holds it and checks it is held exactly once,
    /// with its flags and value.
    fn store(&mut self, proxy: &Memroute, servers: &[Memcached]) {
        let mut keys: Vec<String> = self.items.keys().cloned().collect();
        keys.sort();
        let mut client = Client::connect(&proxy.listen, "filler");
        for chunk in keys.chunks(100) {
            let mut p = Pipeline::default();
            for key in chunk {
                let item = &self.items[key];
                let mut request =
                    format!("set {key} {} 0 {}\r\n", item.flags, item.value.len()).into_bytes();
                request.extend_from_slice(&item.value);
                request.extend_from_slice(b"\r\n");
                p.push(&request, b"STORED\r\n");
            }
            client.exchange(&p.fenced());
        }
        let mut found: HashMap<String, usize> = HashMap::new();
        for server in servers {
            let mut direct = server.connect();
            for chunk in keys.chunks(50) {
                let names: Vec<&str> = chunk.iter().map(|k| k.as_str()).collect();
                direct.send(format!("gets {}\r\n", names.join(" ")).as_bytes());
                let reply = direct.read_get_reply();
                for (key, flags, value, cas) in parse_gets(&reply) {
                    let item = self
                        .items
                        .get_mut(&key)
                        .unwrap_or_else(|| panic!("{} holds unknown key {key:?}", server.addr()));
                    assert_eq!((flags, &value), (item.flags, &item.value), "{key:?}");
                    item.cas = cas;
                    *found.entry(key).or_default() += 1;
                }
            }
        }
        for key in keys {
            assert_eq!(found.get(key.as_str()), Some(&1), "{key:?} held once");
        }
    }
}

/// A `gets` reply as (key, flags, value, cas); panics on anything else.
fn parse_gets(reply: &[u8]) -> Vec<(String, u32, Vec<u8>, u64)> {
    let mut out = Vec::new();
    let mut rest = reply;
    loop {
        let end = find(rest, b"\r\n").unwrap_or_else(|| panic!("no line end: {}", show(rest)));
        let line = std::str::from_utf8(&rest[..end]).expect("a utf-8 VALUE line");
        if line == "END" {
            assert_eq!(end + 2, rest.len(), "bytes after END");
            return out;
        }
        let words: Vec<&str> = line.split(' ').collect();
        assert!(
            words.len() == 5 && words[0] == "VALUE",
            "not a gets VALUE line: {line:?}"
        );
        let number = |s: &str| -> u64 { s.parse().unwrap_or_else(|_| panic!("{line:?}")) };
        let len = number(words[3]) as usize;
        let value = rest[end + 2..end + 2 + len].to_vec();
        out.push((
            words[1].to_string(),
            number(words[2]) as u32,
            value,
            number(words[4]),
        ));
        rest = &rest[end + 2 + len + 2..];
    }
}

// ---- pipelines and the client that sends them ---------------------------------------------

/// Requests to write in one go and the exact bytes they must be answered with.
#[derive(Debug, Default)]
struct Pipeline {
    request: Vec<u8>,
    expected: Vec<u8>,
    /// For each request, where its reply ends in `expected` and what it was (for messages).
    steps: Vec<(usize, String)>,
}

impl Pipeline {
    fn push(&mut self, request: &[u8], expected: &[u8]) {
        self.request.extend_from_slice(request);
        self.expected.extend_from_slice(expected);
        let line_end = find(request, b"\n").map_or(request.len(), |i| i + 1);
        let mut what = show(&request[..line_end.min(160)]);
        if line_end > 160 {
            what.push_str(&format!("... ({line_end} byte line)"));
        }
        self.steps.push((self.expected.len(), what));
    }

    /// Ends the pipeline with `mn`: its `MN` must come right after the last reply.
    fn fenced(mut self) -> Pipeline {
        self.push(b"mn\r\n", b"MN\r\n");
        self
    }

    /// The request whose reply covers byte `at` of `expected`.
    fn step_at(&self, at: usize) -> (usize, &str) {
        let i = self
            .steps
            .iter()
            .position(|(end, _)| at < *end)
            .unwrap_or(self.steps.len().saturating_sub(1));
        (i, self.steps.get(i).map_or("", |(_, s)| s.as_str()))
    }
}

/// A client connection that writes a pipeline on a second thread while it reads the replies:
/// a pipeline bigger than the socket buffers cannot deadlock against a proxy that stops
/// reading a client while its replies wait to be read.
#[derive(Debug)]
struct Client {
    stream: TcpStream,
    name: String,
}

impl Client {
    fn connect(addr: &str, name: &str) -> Client {
        let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("{name}: connect: {e}"));
        stream
            .set_read_timeout(Some(REPLY_TIMEOUT))
            .expect("timeout");
        stream
            .set_write_timeout(Some(REPLY_TIMEOUT))
            .expect("timeout");
        stream.set_nodelay(true).expect("nodelay");
        Client {
            stream,
            name: name.to_string(),
        }
    }

    /// Writes the whole pipeline and reads exactly as many bytes as it must be answered
    /// with (no more: the next pipeline's replies are not taken); panics unless they are the
    /// expected bytes, naming the request whose reply first differs.
    fn exchange(&mut self, p: &Pipeline) {
        let got = self.exchange_raw(&p.request, p.expected.len());
        if got == p.expected {
            return;
        }
        let at = got
            .iter()
            .zip(&p.expected)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(p.expected.len()));
        let (i, what) = p.step_at(at);
        let from = at.saturating_sub(80);
        let window =
            |bytes: &[u8]| show(&bytes[from.min(bytes.len())..(at + 160).min(bytes.len())]);
        panic!(
            "{}: reply differs at byte {at} of {} (got {} bytes), in the reply to request {i} of {}: {what}\n\
             expected (from byte {from}):\n{}\n\
             got:\n{}",
            self.name,
            p.expected.len(),
            got.len(),
            p.steps.len(),
            window(&p.expected),
            window(&got),
        );
    }

    /// Writes `request` (on a second thread) and reads up to `want` bytes; returns what came
    /// before EOF, a read timeout or `want`.
    fn exchange_raw(&mut self, request: &[u8], want: usize) -> Vec<u8> {
        let mut writer = self.stream.try_clone().expect("clone the stream");
        let name = self.name.clone();
        std::thread::scope(|scope| {
            let write = scope.spawn(move || writer.write_all(request));
            let got = read_up_to(&mut self.stream, want);
            if let Err(e) = write.join().expect("writer thread") {
                panic!(
                    "{name}: writing the pipeline: {e} (read {} bytes)",
                    got.len()
                );
            }
            got
        })
    }
}

/// Reads until `want` bytes, EOF or a read timeout, never past `want`.
fn read_up_to(stream: &mut TcpStream, want: usize) -> Vec<u8> {
    let mut got = vec![0u8; want];
    let mut n = 0;
    while n < want {
        match stream.read(&mut got[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    got.truncate(n);
    got
}

/// A reusable start line: every party waits until all have arrived, then all go at once.
/// A party that panics breaks it (see [`Gate::leave_on_panic`]), so the others stop at
/// their next wait instead of waiting for it in vain.
#[derive(Debug)]
struct Gate {
    state: Mutex<GateState>,
    all_here: Condvar,
    parties: usize,
}

#[derive(Debug, Default)]
struct GateState {
    /// Parties waiting in this generation.
    arrived: usize,
    /// Rounds opened so far.
    generation: u64,
    /// A party failed.
    broken: bool,
}

impl Gate {
    fn new(parties: usize) -> Gate {
        Gate {
            state: Mutex::new(GateState::default()),
            all_here: Condvar::new(),
            parties,
        }
    }

    /// Waits for the others, bounded by [`GATE_TIMEOUT`].
    fn wait(&self, who: &str) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        assert!(!state.broken, "{who}: stopped, another client failed");
        let generation = state.generation;
        state.arrived += 1;
        if state.arrived == self.parties {
            state.arrived = 0;
            state.generation += 1;
            self.all_here.notify_all();
            return;
        }
        let (state, waited) = self
            .all_here
            .wait_timeout_while(state, GATE_TIMEOUT, |s| {
                s.generation == generation && !s.broken
            })
            .unwrap_or_else(|e| e.into_inner());
        assert!(!state.broken, "{who}: stopped, another client failed");
        assert!(
            !waited.timed_out(),
            "{who}: the other clients did not reach the gate within {GATE_TIMEOUT:?}"
        );
    }

    /// A guard to hold for a party's whole run: if the party panics, the gate breaks.
    fn leave_on_panic(&self) -> LeaveOnPanic<'_> {
        LeaveOnPanic(self)
    }
}

/// Breaks its gate when dropped by a panicking thread.
#[derive(Debug)]
struct LeaveOnPanic<'a>(&'a Gate);

impl Drop for LeaveOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut state = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
            state.broken = true;
            self.0.all_here.notify_all();
        }
    }
}

// ---- what a text client asks ----------------------------------------------------------------

/// Keys a client owns: it alone sets and deletes them, and reads them back (no cas: the
/// model does not know it).
#[derive(Debug)]
struct Own {
    prefix: String,
    items: HashMap<String, (u32, Vec<u8>)>,
    made: usize,
}

impl Own {
    fn new(prefix: String) -> Own {
        Own {
            prefix,
            items: HashMap::new(),
            made: 0,
        }
    }

    /// One of this client's keys: set now, deleted, or never set.
    fn key(&mut self, rng: &mut Rng) -> String {
        if self.made == 0 || rng.percent(30) {
            self.made += 1;
        }
        let i = rng.below(self.made + 1);
        format!("{}{i}", self.prefix)
    }
}

/// Which keys a request may hold.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Keys {
    /// Shared keys only (cas known).
    Shared,
    /// Shared keys and the client's own.
    Any,
}

/// A shared key: mostly stored small ones, some misses, rarely a 100 KB value.
fn shared_key(rng: &mut Rng, cache: &Cache) -> String {
    match rng.below(200) {
        0 if !cache.big.is_empty() => rng.pick(&cache.big).clone(),
        1..=14 if !cache.prefixes.is_empty() => rng.pick(&cache.prefixes).clone(),
        15..=59 => rng.pick(&cache.misses).clone(),
        _ => rng.pick(&cache.hits).clone(),
    }
}

/// `n` keys for one request; some repeat an earlier key of the same request.
fn some_keys(rng: &mut Rng, cache: &Cache, own: &mut Own, which: Keys, n: usize) -> Vec<String> {
    let mut keys: Vec<String> = Vec::with_capacity(n);
    for _ in 0..n {
        let key = if !keys.is_empty() && rng.percent(15) {
            rng.pick(&keys).clone()
        } else if which == Keys::Any && rng.percent(20) {
            own.key(rng)
        } else {
            shared_key(rng, cache)
        };
        keys.push(key);
    }
    keys
}

/// The reply memcached gives to a get-like command over `keys`.
fn retrieval_reply(cache: &Cache, own: &Own, keys: &[String], with_cas: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for key in keys {
        if let Some(item) = cache.items.get(key) {
            push_value(
                &mut out,
                key,
                item.flags,
                &item.value,
                with_cas.then_some(item.cas),
            );
        } else if let Some((flags, value)) = own.items.get(key) {
            assert!(!with_cas, "the model knows no cas for {key:?}");
            push_value(&mut out, key, *flags, value, None);
        }
    }
    out.extend_from_slice(b"END\r\n");
    out
}

/// Appends `command keys...` and the reply it must get.
fn push_retrieval(p: &mut Pipeline, cache: &Cache, own: &Own, command: &str, keys: &[String]) {
    let with_cas = matches!(command.split(' ').next(), Some("gets" | "gats"));
    let request = format!("{command} {}\r\n", keys.join(" "));
    p.push(
        request.as_bytes(),
        &retrieval_reply(cache, own, keys, with_cas),
    );
}

/// Appends a meta get of `key` in one of several shapes, and its reply.
fn push_meta_get(rng: &mut Rng, p: &mut Pipeline, cache: &Cache, own: &mut Own) {
    let (key, shape) = if rng.percent(25) {
        (own.key(rng), 0)
    } else {
        (shared_key(rng, cache), rng.between(1, 3))
    };
    let found = cache
        .items
        .get(&key)
        .map(|item| (item.flags, &item.value, Some(item.cas)))
        .or_else(|| own.items.get(&key).map(|(f, v)| (*f, v, None)));
    // What is asked (shape 0: own keys; 1-3: shared keys, which have a cas) and what a
    // miss answers: the key echoed with `k`, nothing when quiet.
    let (asked, miss) = match shape {
        0 => ("v f", b"EN\r\n".to_vec()),
        1 => ("v f c", b"EN\r\n".to_vec()),
        2 => ("k v", format!("EN k{key}\r\n").into_bytes()),
        _ => ("v q", Vec::new()),
    };
    let hit = found.map(|(flags, value, cas)| {
        let returned = match (shape, cas) {
            (0, _) => format!(" f{flags}"),
            (1, Some(cas)) => format!(" f{flags} c{cas}"),
            (2, _) => format!(" k{key}"),
            _ => String::new(),
        };
        [
            format!("VA {}{returned}\r\n", value.len()).as_bytes(),
            value,
            b"\r\n",
        ]
        .concat()
    });
    p.push(
        format!("mg {key} {asked}\r\n").as_bytes(),
        &hit.unwrap_or(miss),
    );
}

/// Appends a write to one of the client's own keys (set or delete, noreply sometimes) and a
/// get that reads it back among shared keys: the get must see the write.
fn push_own_write(rng: &mut Rng, p: &mut Pipeline, cache: &Cache, own: &mut Own) {
    let key = own.key(rng);
    let noreply = rng.percent(30);
    let suffix = if noreply { " noreply" } else { "" };
    if rng.percent(70) {
        let flags = flags(rng);
        let value = small_value(rng, &key);
        let mut request = format!("set {key} {flags} 0 {}{suffix}\r\n", value.len()).into_bytes();
        request.extend_from_slice(&value);
        request.extend_from_slice(b"\r\n");
        p.push(&request, if noreply { b"" } else { b"STORED\r\n" });
        own.items.insert(key.clone(), (flags, value));
    } else {
        let reply: &[u8] = match (noreply, own.items.remove(&key).is_some()) {
            (true, _) => b"",
            (false, true) => b"DELETED\r\n",
            (false, false) => b"NOT_FOUND\r\n",
        };
        p.push(format!("delete {key}{suffix}\r\n").as_bytes(), reply);
    }
    let mut keys = {
        let n = rng.below(3);
        some_keys(rng, cache, own, Keys::Any, n)
    };
    let at = rng.below(keys.len() + 1);
    keys.insert(at, key);
    let command = if rng.percent(80) { "get" } else { "gat 0" };
    push_retrieval(p, cache, own, command, &keys);
}

/// One client's pipeline of `n` requests (plus, always, a 100 KB get and sometimes a 900 KB
/// one among the small requests).
fn text_pipeline(rng: &mut Rng, cache: &Cache, own: &mut Own, n: usize) -> Pipeline {
    let mut p = Pipeline::default();
    let big_at = rng.below(n);
    let huge_at = if rng.percent(40) { rng.below(n) } else { n };
    for i in 0..n {
        if i == big_at && !cache.big.is_empty() {
            let mut keys = {
                let n = rng.below(3);
                some_keys(rng, cache, own, Keys::Any, n)
            };
            keys.insert(0, rng.pick(&cache.big).clone());
            push_retrieval(&mut p, cache, own, "get", &keys);
        }
        if i == huge_at && !cache.huge.is_empty() {
            let mut keys = some_keys(rng, cache, own, Keys::Shared, 2);
            keys.insert(1, rng.pick(&cache.huge).clone());
            let command = if rng.percent(50) { "get" } else { "gets" };
            push_retrieval(&mut p, cache, own, command, &keys);
        }
        match rng.below(100) {
            // Single-key gets: the commonest request, the most to merge.
            0..=29 => {
                let keys = some_keys(rng, cache, own, Keys::Any, 1);
                push_retrieval(&mut p, cache, own, "get", &keys);
            }
            30..=49 => {
                let keys = {
                    let n = rng.between(2, 8);
                    some_keys(rng, cache, own, Keys::Any, n)
                };
                push_retrieval(&mut p, cache, own, "get", &keys);
            }
            50..=59 => {
                let keys = {
                    let n = rng.between(1, 6);
                    some_keys(rng, cache, own, Keys::Shared, n)
                };
                push_retrieval(&mut p, cache, own, "gets", &keys);
            }
            60..=64 => {
                let n = rng.between(1, 4);
                if rng.percent(50) {
                    let keys = some_keys(rng, cache, own, Keys::Any, n);
                    push_retrieval(&mut p, cache, own, "gat 0", &keys);
                } else {
                    let keys = some_keys(rng, cache, own, Keys::Shared, n);
                    push_retrieval(&mut p, cache, own, "gats 0", &keys);
                }
            }
            65..=72 => push_meta_get(rng, &mut p, cache, own),
            73..=86 => push_own_write(rng, &mut p, cache, own),
            // Many keys in one request.
            87..=89 => {
                let (command, which) = if rng.percent(60) {
                    ("get", Keys::Any)
                } else {
                    ("gets", Keys::Shared)
                };
                let keys = {
                    let n = rng.between(40, 100);
                    some_keys(rng, cache, own, which, n)
                };
                push_retrieval(&mut p, cache, own, command, &keys);
            }
            // A key over 250 bytes: memcached refuses the whole request.
            90..=91 => {
                let mut keys = {
                    let n = rng.between(1, 3);
                    some_keys(rng, cache, own, Keys::Shared, n)
                };
                keys.insert(rng.below(keys.len() + 1), "k".repeat(251));
                let command = if rng.percent(50) { "get" } else { "gets" };
                p.push(
                    format!("{command} {}\r\n", keys.join(" ")).as_bytes(),
                    b"CLIENT_ERROR bad command line format\r\n",
                );
            }
            // A NUL ends the line for memcached: only the keys before it are asked for.
            92..=93 => {
                let before = {
                    let n = rng.between(1, 3);
                    some_keys(rng, cache, own, Keys::Any, n)
                };
                let after = some_keys(rng, cache, own, Keys::Any, 2);
                let mut request = format!("get {}", before.join(" ")).into_bytes();
                request.push(0);
                request.extend_from_slice(format!("junk {}\r\n", after.join(" ")).as_bytes());
                p.push(&request, &retrieval_reply(cache, own, &before, false));
            }
            // Framing memcached accepts: a bare `\n`, runs of spaces, a trailing space.
            94..=95 => {
                let n = rng.between(1, 4);
                let keys = some_keys(rng, cache, own, Keys::Any, n);
                let (line, end) = match rng.below(3) {
                    0 => (keys.join(" "), "\n"),
                    1 => (keys.join("   "), "\r\n"),
                    _ => (format!(" {} ", keys.join(" ")), "\r\n"),
                };
                p.push(
                    format!("get {line}{end}").as_bytes(),
                    &retrieval_reply(cache, own, &keys, false),
                );
            }
            _ => {
                let keys = some_keys(rng, cache, own, Keys::Shared, 1);
                let command = if rng.percent(50) { "get" } else { "gets" };
                push_retrieval(&mut p, cache, own, command, &keys);
            }
        }
    }
    p.fenced()
}

// ---- running clients together ---------------------------------------------------------------

/// memroute (one worker, one connection per server) over `servers` with ketama/md5 (which
/// spreads short keys over every server), and `extra` pool lines.
fn proxy_over(servers: &[Memcached], extra: &str) -> Memroute {
    let listen = format!("127.0.0.1:{}", free_port());
    let addrs: Vec<String> = servers.iter().map(Memcached::addr).collect();
    Memroute::start(&pool_config(
        &listen,
        &addrs,
        "ketama",
        "md5",
        &format!("{POOL_LINES}\n{extra}"),
    ))
}

/// The size of a [`Cache::plan`]: stored small keys, misses, 100 KB and 900 KB values.
type CacheSize = (usize, usize, usize, usize);

/// `servers` memcached behind memroute (`extra` pool lines), and a cache of `size` planned
/// from `rng` and stored through it.
fn filled(
    servers: usize,
    extra: &str,
    rng: &mut Rng,
    size: CacheSize,
) -> (Vec<Memcached>, Memroute, Cache) {
    let servers: Vec<Memcached> = (0..servers).map(|_| Memcached::start()).collect();
    let proxy = proxy_over(&servers, extra);
    let (hits, misses, big, huge) = size;
    let mut cache = Cache::plan(rng, hits, misses, big, huge);
    cache.store(&proxy, &servers);
    (servers, proxy, cache)
}

/// Connections each server has accepted so far (the asking connection included).
fn connections_accepted(servers: &[Memcached]) -> Vec<u64> {
    servers
        .iter()
        .map(|s| s.stat("total_connections"))
        .collect()
}

/// Checks that memroute opened no new connection to any server since `before` was taken: a
/// reply it could not match to its requests would have made it drop and reopen one.
fn assert_no_reconnect(servers: &[Memcached], before: &[u64], what: &str) {
    let after = connections_accepted(servers);
    // Each count includes the connection that asked for it: one more than before.
    let expected: Vec<u64> = before.iter().map(|n| n + 1).collect();
    assert_eq!(
        after, expected,
        "{what}: memroute reconnected to a server (total_connections before {before:?})"
    );
}

/// `clients` text clients, each over its own connection, run `rounds` rounds of a pipeline of
/// `per_round` requests; all start each round together.
fn run_text_clients(
    proxy: &Memroute,
    cache: &Cache,
    clients: usize,
    rounds: usize,
    per_round: usize,
    seed: u64,
) {
    let gate = Gate::new(clients);
    std::thread::scope(|scope| {
        for c in 0..clients {
            let gate = &gate;
            scope.spawn(move || {
                let _leave = gate.leave_on_panic();
                let name = format!("client {c} (seed {seed})");
                let mut rng = Rng::new(seed * 1000 + c as u64);
                let mut own = Own::new(format!("own:{seed}:{c}:"));
                let mut client = Client::connect(&proxy.listen, &name);
                for round in 0..rounds {
                    let pipeline = text_pipeline(&mut rng, cache, &mut own, per_round);
                    gate.wait(&name);
                    client.name = format!("{name}, round {round}");
                    client.exchange(&pipeline);
                }
            });
        }
    });
}

/// The whole scenario over `servers` memcached processes: fill, run, check nothing was reset.
fn text_clients_scenario(servers: usize, extra: &str, seed: u64) {
    let mut rng = Rng::new(seed);
    let (servers, proxy, cache) = filled(servers, extra, &mut rng, (300, 90, 3, 2));
    if servers.len() > 1 {
        for server in &servers {
            assert!(
                server.stat("curr_items") > 10,
                "{}: few keys",
                server.addr()
            );
        }
    }
    let before = connections_accepted(&servers);
    let started = std::time::Instant::now();
    run_text_clients(&proxy, &cache, 8, 3, 70, seed);
    println!(
        "coalesced gets: 8 clients x 3 rounds x ~70 requests over {} server(s) {extra:?}: {:?}",
        servers.len(),
        started.elapsed()
    );
    assert_no_reconnect(&servers, &before, "after the clients");
    let mut after = proxy.connect();
    assert!(after
        .roundtrip_line(b"version\r\n")
        .starts_with(b"VERSION "));
}

// ---- the tests ------------------------------------------------------------------------------

/// Eight clients pipelining get/gets/gat/gats/mg and their own writes through one worker to
/// one memcached: every reply byte-exact.
#[test]
fn concurrent_pipelines_through_one_backend_connection_get_exact_replies() {
    text_clients_scenario(1, "", 1);
}

/// The same over three servers: a client's multi-get is split into legs per server, and each
/// server's connection sees legs of several clients.
#[test]
fn concurrent_pipelines_over_a_three_server_pool_get_exact_replies() {
    text_clients_scenario(3, "", 2);
}

/// Three servers with backend gets capped at 3 keys: a multi-get becomes several legs per
/// server, queued one after another on the same connection.
#[test]
fn concurrent_pipelines_with_capped_backend_batches_get_exact_replies() {
    text_clients_scenario(3, "max_keys_per_request = 3", 3);
}

/// The same with merging turned off (`coalesce_gets = false`): each get goes to memcached as
/// the client's own command, with the same replies.
#[test]
fn concurrent_pipelines_with_coalescing_off_get_exact_replies() {
    text_clients_scenario(1, "coalesce_gets = false", 8);
}

/// Long keys and many keys: 240-250 byte keys a few to a request (a few such requests make a
/// line of KBs, so a merged line reaches any length cap after a handful), 20-60 short keys to
/// a request (a few reach any key-count cap), 100-key gets (as many as memroute sends in one
/// backend get) and 101-150-key gets (split into two batches), all to one server.
#[test]
fn long_keys_and_many_key_gets_from_several_clients_get_exact_replies() {
    let servers = [Memcached::start()];
    let proxy = proxy_over(&servers, "");
    let mut rng = Rng::new(4);
    let mut cache = Cache::default();
    let (mut long_keys, mut short_keys) = (Vec::new(), Vec::new());
    for i in 0..600 {
        let key = if i % 2 == 0 {
            let n = rng.between(240, 250);
            long_key(&mut rng, &format!("long:{i}:"), n)
        } else {
            format!("s:{i}")
        };
        // Two of every three are stored.
        if i % 3 != 0 {
            let item = Item {
                flags: flags(&mut rng),
                value: small_value(&mut rng, &key),
                cas: 0,
            };
            cache.items.insert(key.clone(), item);
            cache.hits.push(key.clone());
        } else {
            cache.misses.push(key.clone());
        }
        if i % 2 == 0 {
            long_keys.push(key);
        } else {
            short_keys.push(key);
        }
    }
    cache.store(&proxy, &servers);
    let before = connections_accepted(&servers);
    let clients = 6;
    let gate = Gate::new(clients);
    let started = std::time::Instant::now();
    std::thread::scope(|scope| {
        for c in 0..clients {
            let (gate, cache, proxy) = (&gate, &cache, &proxy);
            let (long_keys, short_keys) = (&long_keys, &short_keys);
            scope.spawn(move || {
                let _leave = gate.leave_on_panic();
                let name = format!("long-key client {c}");
                let mut rng = Rng::new(400 + c as u64);
                let own = Own::new(String::new());
                let mut client = Client::connect(&proxy.listen, &name);
                for round in 0..3 {
                    let mut p = Pipeline::default();
                    for _ in 0..40 {
                        let (n, from) = match rng.below(20) {
                            0..=5 => (rng.between(1, 3), long_keys),
                            6..=10 => (rng.between(20, 60), short_keys),
                            11..=12 => (100, short_keys),
                            13 => (100, long_keys),
                            14..=15 => (rng.between(101, 150), short_keys),
                            _ => (1, short_keys),
                        };
                        let keys: Vec<String> = (0..n).map(|_| rng.pick(from).clone()).collect();
                        let command = if rng.percent(70) { "get" } else { "gets" };
                        push_retrieval(&mut p, cache, &own, command, &keys);
                    }
                    let p = p.fenced();
                    gate.wait(&name);
                    client.name = format!("{name}, round {round}");
                    client.exchange(&p);
                }
            });
        }
    });
    println!(
        "coalesced gets: 6 clients x 3 rounds x 40 long-key and many-key gets: {:?}",
        started.elapsed()
    );
    assert_no_reconnect(&servers, &before, "after the long-key clients");
}

// ---- binary ---------------------------------------------------------------------------------

const GET: u8 = 0x00;
const GETQ: u8 = 0x09;
const NOOP: u8 = 0x0a;
const GETK: u8 = 0x0c;
const GETKQ: u8 = 0x0d;

/// A binary request frame with no extras and no value.
fn binary_request(opcode: u8, key: &[u8], opaque: u32) -> Vec<u8> {
    let mut f = vec![0x80, opcode];
    f.extend_from_slice(&(key.len() as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 0]);
    f.extend_from_slice(&(key.len() as u32).to_be_bytes());
    f.extend_from_slice(&opaque.to_be_bytes());
    f.extend_from_slice(&0u64.to_be_bytes());
    f.extend_from_slice(key);
    f
}

/// A binary response frame as memcached writes it.
fn binary_response(
    opcode: u8,
    status: u16,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
    opaque: u32,
    cas: u64,
) -> Vec<u8> {
    let body = (extras.len() + key.len() + value.len()) as u32;
    let mut f = vec![0x81, opcode];
    f.extend_from_slice(&(key.len() as u16).to_be_bytes());
    f.push(extras.len() as u8);
    f.push(0);
    f.extend_from_slice(&status.to_be_bytes());
    f.extend_from_slice(&body.to_be_bytes());
    f.extend_from_slice(&opaque.to_be_bytes());
    f.extend_from_slice(&cas.to_be_bytes());
    f.extend_from_slice(extras);
    f.extend_from_slice(key);
    f.extend_from_slice(value);
    f
}

/// Appends one binary get-like frame for `key` and the response it must get: get and getk
/// answer hits and misses (getk's miss with its key, get's with `Not found`); getq and getkq (memroute batches a run of them into one text
/// `gets`) answer hits only.
fn push_binary_get(p: &mut Pipeline, cache: &Cache, opcode: u8, key: &str, opaque: u32) {
    let with_key = matches!(opcode, GETK | GETKQ);
    let echoed: &[u8] = if with_key { key.as_bytes() } else { b"" };
    let expected = match cache.items.get(key) {
        Some(item) => binary_response(
            opcode,
            0,
            &item.flags.to_be_bytes(),
            echoed,
            &item.value,
            opaque,
            item.cas,
        ),
        None if matches!(opcode, GETQ | GETKQ) => Vec::new(),
        // memcached's getk miss carries the key and no message; get's the message.
        None if with_key => binary_response(opcode, 1, b"", echoed, b"", opaque, 0),
        None => binary_response(opcode, 1, b"", b"", b"Not found", opaque, 0),
    };
    p.push(&binary_request(opcode, key.as_bytes(), opaque), &expected);
}

/// A binary client's pipeline: single gets, getk, runs of getq/getkq, noops between.
fn binary_pipeline(rng: &mut Rng, cache: &Cache, keys: &[String], n: usize) -> Pipeline {
    let mut p = Pipeline::default();
    let mut opaque = rng.next() as u32;
    for _ in 0..n {
        match rng.below(10) {
            0..=2 => {
                let key = rng.pick(keys).clone();
                push_binary_get(&mut p, cache, GET, &key, opaque)
            }
            3..=4 => {
                let key = rng.pick(keys).clone();
                push_binary_get(&mut p, cache, GETK, &key, opaque)
            }
            5..=8 => {
                for _ in 0..rng.between(1, 12) {
                    opaque = opaque.wrapping_add(1);
                    let opcode = if rng.percent(50) { GETQ } else { GETKQ };
                    let key = rng.pick(keys).clone();
                    push_binary_get(&mut p, cache, opcode, &key, opaque);
                }
            }
            _ => p.push(
                &binary_request(NOOP, b"", opaque),
                &binary_response(NOOP, 0, b"", b"", b"", opaque, 0),
            ),
        }
        opaque = opaque.wrapping_add(1);
    }
    p.push(
        &binary_request(NOOP, b"", 0xfeed),
        &binary_response(NOOP, 0, b"", b"", b"", 0xfeed, 0),
    );
    p
}

/// Binary clients (whose get runs memroute sends as text `gets`, single gets as `mg`) and
/// text clients (get/gets/gat/gats/mg, own writes) at once over one backend connection.
#[test]
fn binary_and_meta_gets_among_text_gets_get_exact_replies() {
    let mut rng = Rng::new(5);
    let (servers, proxy, cache) = filled(1, "", &mut rng, (200, 60, 2, 1));
    // Keys a binary client can send as they are (memroute sends others base64 in meta).
    let binary_keys: Vec<String> = cache
        .hits
        .iter()
        .chain(&cache.misses)
        .chain(&cache.prefixes)
        .chain(&cache.big)
        .filter(|k| k.bytes().all(|b| b.is_ascii_graphic()))
        .cloned()
        .collect();
    // The binary model, checked once against memcached itself.
    let mut check = Client::connect(&servers[0].addr(), "binary model vs memcached");
    check.exchange(&binary_pipeline(&mut rng, &cache, &binary_keys, 60));

    let before = connections_accepted(&servers);
    let (text_clients, binary_clients) = (4, 3);
    let gate = Gate::new(text_clients + binary_clients);
    std::thread::scope(|scope| {
        for c in 0..text_clients + binary_clients {
            let (gate, cache, binary_keys, proxy) = (&gate, &cache, &binary_keys, &proxy);
            scope.spawn(move || {
                let _leave = gate.leave_on_panic();
                let binary = c >= text_clients;
                let name = format!("{} client {c}", if binary { "binary" } else { "text" });
                let mut rng = Rng::new(500 + c as u64);
                let mut own = Own::new(format!("own:b:{c}:"));
                let mut client = Client::connect(&proxy.listen, &name);
                for round in 0..3 {
                    let p = if binary {
                        binary_pipeline(&mut rng, cache, binary_keys, 60)
                    } else {
                        text_pipeline(&mut rng, cache, &mut own, 60)
                    };
                    gate.wait(&name);
                    client.name = format!("{name}, round {round}");
                    client.exchange(&p);
                }
            });
        }
    });
    assert_no_reconnect(&servers, &before, "after the binary and text clients");
}

// ---- clients that hang up -------------------------------------------------------------------

/// While text clients check every reply, others send 100 gets (big values among them) and
/// hang up after reading part of the replies, or none: their replies are still in flight on
/// the backend connection, merged or not, and must be read and dropped without disturbing
/// anyone else's.
#[test]
fn clients_hanging_up_mid_pipeline_do_not_disturb_the_others() {
    let mut rng = Rng::new(6);
    let (servers, proxy, cache) = filled(1, "", &mut rng, (200, 60, 3, 2));
    let before = connections_accepted(&servers);
    let (checkers, quitters, rounds) = (4, 2, 4);
    let gate = Gate::new(checkers + quitters);
    let hung_up = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for c in 0..checkers + quitters {
            let (gate, cache, proxy, hung_up) = (&gate, &cache, &proxy, &hung_up);
            scope.spawn(move || {
                let _leave = gate.leave_on_panic();
                let name = format!("client {c}");
                let mut rng = Rng::new(600 + c as u64);
                let mut own = Own::new(format!("own:q:{c}:"));
                if c < checkers {
                    let mut client = Client::connect(&proxy.listen, &name);
                    for round in 0..rounds {
                        let p = text_pipeline(&mut rng, cache, &mut own, 60);
                        gate.wait(&name);
                        client.name = format!("{name}, round {round}");
                        client.exchange(&p);
                    }
                    return;
                }
                for round in 0..rounds {
                    gate.wait(&name);
                    // Three clients per round that leave early.
                    for _ in 0..3 {
                        let mut p = Pipeline::default();
                        for _ in 0..100 {
                            let mut keys = some_keys(&mut rng, cache, &mut own, Keys::Shared, 3);
                            if rng.percent(10) {
                                keys.push(rng.pick(&cache.big).clone());
                            }
                            if rng.percent(3) {
                                keys.push(rng.pick(&cache.huge).clone());
                            }
                            let command = if rng.percent(70) { "get" } else { "gets" };
                            push_retrieval(&mut p, cache, &own, command, &keys);
                        }
                        let name = format!("{name}, round {round}, leaving early");
                        let mut client = Client::connect(&proxy.listen, &name);
                        let read = rng.below(p.expected.len() / 2);
                        let got = client.exchange_raw(&p.request, read);
                        // What it read before leaving is the start of its replies.
                        assert!(
                            got == p.expected[..got.len()],
                            "{name}: the first {} bytes differ",
                            got.len()
                        );
                        if rng.percent(30) {
                            let _ = client.stream.shutdown(Shutdown::Both);
                        }
                        // Dropped with replies unread: the kernel resets the connection.
                        drop(client);
                        hung_up.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(
        hung_up.load(std::sync::atomic::Ordering::Relaxed),
        quitters * rounds * 3
    );
    // A newcomer gets exact replies too, on the same backend connection.
    let mut own = Own::new("own:q:late:".to_string());
    let p = text_pipeline(&mut rng, &cache, &mut own, 80);
    Client::connect(&proxy.listen, "newcomer").exchange(&p);
    assert_no_reconnect(&servers, &before, "after clients hung up");
}

// ---- a backend lost with gets in flight ---------------------------------------------------

/// From /proc/net/tcp, summed over established connections: bytes received and not yet
/// read by the sockets whose local port is `port` (a server's accepted connections), and
/// bytes written and not yet sent (or not yet acknowledged) by the sockets connected to
/// remote port `port` (its clients).
fn socket_queues(port: u16) -> (u64, u64) {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
    let (mut unread, mut unsent) = (0, 0);
    for line in table.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let port_of = |i: usize| {
            fields
                .get(i)
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
        };
        let queues = fields
            .get(4)
            .and_then(|q| q.split_once(':'))
            .and_then(|(tx, rx)| {
                Some((
                    u64::from_str_radix(tx, 16).ok()?,
                    u64::from_str_radix(rx, 16).ok()?,
                ))
            });
        let (Some((tx, rx)), Some("01")) = (queues, fields.get(3).copied()) else {
            continue;
        };
        if port_of(1) == Some(port) {
            unread += rx;
        }
        if port_of(2) == Some(port) {
            unsent += tx;
        }
    }
    (unread, unsent)
}

/// Clients pipeline gets to a memcached frozen with SIGSTOP, so they sit on memroute's
/// connection, merged or not, written and unanswered; the server is then killed. Every one
/// of those gets is answered `SERVER_ERROR`, and once the server is back (restarted, empty,
/// filled again) clients get exact replies: nothing of the lost connection's runs is left
/// to misassign the new connection's replies.
#[test]
fn a_backend_lost_with_gets_in_flight_leaves_nothing_behind() {
    let mut rng = Rng::new(7);
    let (mut servers, proxy, mut cache) = filled(1, "", &mut rng, (120, 40, 1, 0));
    let server = &mut servers[0];

    let stopped = server.stop();
    let proxy_port: u16 = proxy
        .listen
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .expect("memroute's port");
    let long_hits: Vec<String> = cache
        .hits
        .iter()
        .filter(|k| k.len() > 100)
        .cloned()
        .collect();
    let mut clients: Vec<(Conn, usize)> = Vec::new();
    // First wave: 6 MB of 100-key gets of long keys (25 KB lines, never merged), more than
    // the frozen server's socket and memroute's send buffer (at most 4 MB here) take, so
    // memroute's write blocks with gets in flight. Second wave: short gets, merged or not,
    // queued unsent behind that write. 30 requests a client: within a new session's window
    // of 32 unanswered requests, so memroute reads and sends on all of them.
    for (wave, clients_in_wave, keys_per_get) in [(1, 8, 100), (2, 4, 3)] {
        for _ in 0..clients_in_wave {
            let mut conn = proxy.connect();
            let mut request = Vec::new();
            let requests = 30;
            for _ in 0..requests {
                let keys: Vec<&str> = (0..keys_per_get)
                    .map(|_| rng.pick(&long_hits).as_str())
                    .collect();
                let command = if rng.percent(70) { "get" } else { "gets" };
                request.extend_from_slice(format!("{command} {}\r\n", keys.join(" ")).as_bytes());
            }
            request.extend_from_slice(b"mn\r\n");
            conn.send(&request);
            clients.push((conn, requests));
        }
        // memroute read everything the clients wrote (and so queued it), and its requests
        // wait at the server: unread there, and (first wave) unsent in memroute's socket.
        let settled = || {
            let (unread_by_proxy, unsent_to_proxy) = socket_queues(proxy_port);
            let (unread_by_server, unsent_to_server) = socket_queues(server.port);
            unread_by_proxy == 0
                && unsent_to_proxy == 0
                && unread_by_server > 0
                && (wave > 1 || unsent_to_server > 0)
        };
        assert!(
            poll_until(Duration::from_secs(10), settled),
            "wave {wave}: memroute {:?} (unread, unsent by its clients), server {:?}",
            socket_queues(proxy_port),
            socket_queues(server.port)
        );
    }
    let in_flight = socket_queues(server.port);
    server.kill();
    drop(stopped);
    for (i, (conn, requests)) in clients.iter_mut().enumerate() {
        for r in 0..*requests {
            let reply = conn.read_get_reply();
            assert!(
                reply.starts_with(b"SERVER_ERROR "),
                "client {i}, request {r}: {}",
                show(&reply)
            );
        }
        assert_eq!(show(&conn.read_line()), show(b"MN\r\n"), "client {i}");
    }
    println!(
        "coalesced gets: request bytes unread by the server, unsent to it when it was killed: {in_flight:?}"
    );

    server.restart();
    let mut probe = proxy.connect();
    assert!(
        poll_until(Duration::from_secs(10), || {
            probe.send(b"get hit:0\r\n");
            probe.read_get_reply() == b"END\r\n"
        }),
        "memroute did not reach the restarted server"
    );
    cache.store(&proxy, &servers);
    let before = connections_accepted(&servers);
    run_text_clients(&proxy, &cache, 4, 2, 60, 7);
    assert_no_reconnect(&servers, &before, "after the server came back");
}
