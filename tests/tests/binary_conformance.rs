//! The binary protocol answered as memcached answers it: each case sends the same frames to a
//! memcached directly and, through memroute, to another one, and compares every response
//! (opcode, status, opaque, whether a CAS came, extras, key, value) and how the connection
//! ends: still serving (it answers a NOOP sent after the case's frames) or closed.
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use memroute_tests::*;

const GET: u8 = 0x00;
const SET: u8 = 0x01;
const ADD: u8 = 0x02;
const REPLACE: u8 = 0x03;
const DELETE: u8 = 0x04;
const INCREMENT: u8 = 0x05;
const DECREMENT: u8 = 0x06;
const QUIT: u8 = 0x07;
const FLUSH: u8 = 0x08;
const NOOP: u8 = 0x0a;
const VERSION: u8 = 0x0b;
const GETK: u8 = 0x0c;
const GETKQ: u8 = 0x0d;
const APPEND: u8 = 0x0e;
const STAT: u8 = 0x10;
const ADDQ: u8 = 0x12;
const VERBOSITY: u8 = 0x1b;
const TOUCH: u8 = 0x1c;
const GAT: u8 = 0x1d;
const SASL_LIST_MECHS: u8 = 0x20;
const SASL_AUTH: u8 = 0x21;
const GATK: u8 = 0x23;

/// The opaque of the NOOP that follows each case's frames: its answer says the connection
/// still serves.
const FENCE: u32 = 0xfeed_face;

/// No case waits longer than this for a response.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Expiries memcached reads as absolute times after January 2038 (its field is unsigned).
const FAR_EXPIRIES: [u32; 3] = [1 << 31, (1 << 31) + 12_345, u32::MAX - 1];

/// A request frame.
fn frame(opcode: u8, key: &[u8], extras: &[u8], value: &[u8], opaque: u32, cas: u64) -> Vec<u8> {
    let body = (extras.len() + key.len() + value.len()) as u32;
    let mut f = vec![0x80, opcode];
    f.extend_from_slice(&(key.len() as u16).to_be_bytes());
    f.push(extras.len() as u8);
    // Raw data type, vbucket 0.
    f.extend_from_slice(&[0, 0, 0]);
    f.extend_from_slice(&body.to_be_bytes());
    f.extend_from_slice(&opaque.to_be_bytes());
    f.extend_from_slice(&cas.to_be_bytes());
    f.extend_from_slice(extras);
    f.extend_from_slice(key);
    f.extend_from_slice(value);
    f
}

/// A frame without extras or value (get, delete, noop ...).
fn plain(opcode: u8, key: &[u8], opaque: u32) -> Vec<u8> {
    frame(opcode, key, &[], &[], opaque, 0)
}

/// Extras of set/add/replace: flags, expiry.
fn store_extras(flags: u32, expiry: u32) -> Vec<u8> {
    [flags.to_be_bytes(), expiry.to_be_bytes()].concat()
}

/// Extras of incr/decr: delta, initial value, expiry (0xffffffff: do not create).
fn counter_extras(delta: u64, initial: u64, expiry: u32) -> Vec<u8> {
    [
        &delta.to_be_bytes()[..],
        &initial.to_be_bytes(),
        &expiry.to_be_bytes(),
    ]
    .concat()
}

/// One response, its CAS kept apart: two servers give the same item different CAS values.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reply {
    opcode: u8,
    status: u16,
    opaque: u32,
    has_cas: bool,
    extras: Vec<u8>,
    key: Vec<u8>,
    value: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The NOOP after the case's frames was answered.
    Serving,
    /// The server closed the connection.
    Closed,
}

/// What a server answered to one batch of frames.
type Exchange = (Vec<Reply>, End);

/// A raw binary connection.
struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
    /// The CAS of the last response to a case's frames.
    last_cas: u64,
}

impl Client {
    fn connect(addr: &str) -> Client {
        let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        stream
            .set_read_timeout(Some(READ_TIMEOUT))
            .expect("read timeout");
        stream.set_nodelay(true).expect("nodelay");
        Client {
            stream,
            buf: Vec::new(),
            last_cas: 0,
        }
    }

    /// Reads until `n` bytes are buffered; false when the peer closed (or reset) first.
    fn fill_to(&mut self, n: usize) -> bool {
        let mut chunk = [0u8; 64 * 1024];
        while self.buf.len() < n {
            match self.stream.read(&mut chunk) {
                Ok(0) => return false,
                Ok(read) => self.buf.extend_from_slice(&chunk[..read]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return false,
                Err(e) => panic!("no response within {READ_TIMEOUT:?}: {e}"),
            }
        }
        true
    }

    /// The next response and its CAS, or `None` once the connection is closed.
    fn next(&mut self) -> Option<(Reply, u64)> {
        if !self.fill_to(24) {
            return None;
        }
        let header = &self.buf[..24];
        assert_eq!(header[0], 0x81, "response magic: {header:?}");
        let key_len = usize::from(u16::from_be_bytes([header[2], header[3]]));
        let extras_len = usize::from(header[4]);
        let body = u32::from_be_bytes([header[8], header[9], header[10], header[11]]) as usize;
        if !self.fill_to(24 + body) {
            return None;
        }
        let frame: Vec<u8> = self.buf.drain(..24 + body).collect();
        let cas = u64::from_be_bytes(frame[16..24].try_into().expect("8 bytes"));
        let reply = Reply {
            opcode: frame[1],
            status: u16::from_be_bytes([frame[6], frame[7]]),
            opaque: u32::from_be_bytes([frame[12], frame[13], frame[14], frame[15]]),
            has_cas: cas != 0,
            extras: frame[24..24 + extras_len].to_vec(),
            key: frame[24 + extras_len..24 + extras_len + key_len].to_vec(),
            value: frame[24 + extras_len + key_len..].to_vec(),
        };
        Some((reply, cas))
    }

    /// Sends `frames` and a NOOP in one write, and reads every response up to the NOOP's, or
    /// up to the close.
    fn exchange(&mut self, frames: &[u8]) -> Exchange {
        let mut bytes = frames.to_vec();
        bytes.extend_from_slice(&plain(NOOP, b"", FENCE));
        // A server that closed at once may refuse the rest of the write.
        let _ = self.stream.write_all(&bytes);
        let mut replies = Vec::new();
        while let Some((reply, cas)) = self.next() {
            if reply.opcode == NOOP && reply.opaque == FENCE {
                return (replies, End::Serving);
            }
            self.last_cas = cas;
            replies.push(reply);
        }
        (replies, End::Closed)
    }

    /// The CAS of `key`'s item (0 on a miss), read with a GET.
    fn cas_of(&mut self, key: &[u8]) -> u64 {
        self.exchange(&plain(GET, key, 0));
        self.last_cas
    }
}

/// A memcached served directly, and memroute over a memcached of its own.
struct Pair {
    direct: Memcached,
    _backend: Memcached,
    proxy: Memroute,
}

impl Pair {
    fn start() -> Pair {
        let direct = Memcached::start();
        let backend = Memcached::start();
        let proxy = Memroute::start_pool(&[backend.addr()]);
        Pair {
            direct,
            _backend: backend,
            proxy,
        }
    }

    /// Runs `case` on a new connection to memcached and on one through memroute, and asserts
    /// both gave the same answers; returns them.
    fn same(&self, what: &str, case: impl Fn(&mut Client) -> Vec<Exchange>) -> Vec<Exchange> {
        let want = case(&mut Client::connect(&self.direct.addr()));
        let got = case(&mut Client::connect(&self.proxy.listen));
        assert_eq!(got, want, "{what}: through memroute (left) and memcached");
        want
    }
}

/// A hit on `key` with `value`, as a GET answers it.
fn is_hit(exchange: &Exchange, value: &[u8]) -> bool {
    exchange.0.iter().any(|r| r.status == 0 && r.value == value)
}

#[test]
fn far_expiries_keep_the_item_as_memcached_does() {
    let pair = Pair::start();
    for expiry in FAR_EXPIRIES {
        let key = |name: &str| format!("{name}-{expiry}").into_bytes();
        let answers = pair.same(&format!("set/add/replace/cas, expiry {expiry}"), |c| {
            let (set, add, replace, cas) = (key("set"), key("add"), key("replace"), key("cas"));
            let mut answers = vec![
                c.exchange(&frame(SET, &set, &store_extras(1, expiry), b"s", 1, 0)),
                c.exchange(&plain(GET, &set, 2)),
                c.exchange(&frame(ADD, &add, &store_extras(2, expiry), b"a", 3, 0)),
                c.exchange(&plain(GET, &add, 4)),
                c.exchange(&frame(SET, &replace, &store_extras(0, 0), b"-", 5, 0)),
                c.exchange(&frame(
                    REPLACE,
                    &replace,
                    &store_extras(3, expiry),
                    b"r",
                    6,
                    0,
                )),
                c.exchange(&plain(GET, &replace, 7)),
                c.exchange(&frame(SET, &cas, &store_extras(0, 0), b"-", 8, 0)),
            ];
            let current = c.cas_of(&cas);
            answers.push(c.exchange(&frame(
                SET,
                &cas,
                &store_extras(4, expiry),
                b"c",
                9,
                current,
            )));
            answers.push(c.exchange(&plain(GET, &cas, 10)));
            answers
        });
        for (at, value) in [(1, b"s"), (3, b"a"), (6, b"r"), (9, b"c")] {
            assert!(is_hit(&answers[at], value), "expiry {expiry}: {answers:?}");
        }

        let answers = pair.same(&format!("incr/decr creating, expiry {expiry}"), |c| {
            let (up, down) = (key("incr"), key("decr"));
            vec![
                c.exchange(&frame(
                    INCREMENT,
                    &up,
                    &counter_extras(1, 10, expiry),
                    b"",
                    1,
                    0,
                )),
                c.exchange(&plain(GET, &up, 2)),
                c.exchange(&frame(
                    DECREMENT,
                    &down,
                    &counter_extras(1, 7, expiry),
                    b"",
                    3,
                    0,
                )),
                c.exchange(&plain(GET, &down, 4)),
            ]
        });
        assert!(is_hit(&answers[1], b"10"), "expiry {expiry}: {answers:?}");
        assert!(is_hit(&answers[3], b"7"), "expiry {expiry}: {answers:?}");

        let answers = pair.same(&format!("touch/gat, expiry {expiry}"), |c| {
            let (touched, gat) = (key("touch"), key("gat"));
            let ttl = expiry.to_be_bytes();
            vec![
                c.exchange(&frame(SET, &touched, &store_extras(5, 0), b"t", 1, 0)),
                c.exchange(&frame(TOUCH, &touched, &ttl, b"", 2, 0)),
                c.exchange(&plain(GET, &touched, 3)),
                c.exchange(&frame(SET, &gat, &store_extras(6, 0), b"g", 4, 0)),
                c.exchange(&frame(GAT, &gat, &ttl, b"", 5, 0)),
                c.exchange(&frame(GATK, &gat, &ttl, b"", 6, 0)),
                c.exchange(&plain(GET, &gat, 7)),
            ]
        });
        assert!(is_hit(&answers[2], b"t"), "expiry {expiry}: {answers:?}");
        assert!(is_hit(&answers[6], b"g"), "expiry {expiry}: {answers:?}");
    }
    // A flush delayed to a time that far ahead leaves the items where they are.
    let answers = pair.same("flush delayed past 2038", |c| {
        vec![
            c.exchange(&frame(SET, b"flushed", &store_extras(0, 0), b"f", 1, 0)),
            c.exchange(&frame(FLUSH, b"", &(1u32 << 31).to_be_bytes(), b"", 2, 0)),
            c.exchange(&plain(GET, b"flushed", 3)),
        ]
    });
    assert!(is_hit(&answers[2], b"f"), "{answers:?}");
}

#[test]
fn unknown_opcodes_answer_unknown_command_and_the_connection_goes_on() {
    let pair = Pair::start();
    let answers = pair.same("unknown opcodes", |c| {
        let mut answers: Vec<Exchange> = [0x50, 0x30, 0x1f, 0x3d, 0x25, 0xff, VERBOSITY]
            .into_iter()
            .map(|opcode| c.exchange(&plain(opcode, b"", u32::from(opcode))))
            .collect();
        // SASL, which memcached without -S does not know: the mechanism's data is skipped.
        answers.push(c.exchange(&plain(SASL_LIST_MECHS, b"", 1)));
        answers.push(c.exchange(&frame(SASL_AUTH, b"PLAIN", &[], b"\0u\0p", 2, 0)));
        // A body past any value's limit, skipped as it arrives.
        answers.push(c.exchange(&frame(0x50, b"", &[], &vec![0; 2 << 20], 3, 0)));
        answers.push(c.exchange(&frame(SET, b"after", &store_extras(0, 0), b"v", 4, 0)));
        answers.push(c.exchange(&plain(GET, b"after", 5)));
        answers
    });
    for (replies, end) in &answers[..10] {
        assert_eq!(*end, End::Serving, "{answers:?}");
        assert_eq!(replies.len(), 1, "{answers:?}");
        assert_eq!(replies[0].status, 0x81, "{answers:?}");
        assert_eq!(replies[0].value, b"Unknown command", "{answers:?}");
    }
    assert!(is_hit(&answers[11], b"v"), "{answers:?}");
}

#[test]
fn malformed_frames_answer_and_close_as_memcached_does() {
    let pair = Pair::start();
    let long_body = {
        let mut f = plain(GET, b"k", 1);
        f[8..12].copy_from_slice(&(200u32 << 20).to_be_bytes());
        f
    };
    let lengths_past_the_body = {
        let mut f = plain(GET, b"abc", 1);
        f[2..4].copy_from_slice(&100u16.to_be_bytes());
        // The 100 bytes the key length claims, so that memcached reads on to judge it.
        f.extend_from_slice(&[0; 97]);
        f
    };
    let bad_magic_after_a_frame = [plain(NOOP, b"", 1), vec![0x81; 24]].concat();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("get with a value", frame(GET, b"k", &[], b"v", 1, 0)),
        ("get with extras", frame(GET, b"k", &[0; 4], b"", 1, 0)),
        ("getk without a key", plain(GETK, b"", 1)),
        (
            "delete with extras",
            frame(DELETE, b"k", &[0; 4], b"", 1, 0),
        ),
        ("set without extras", frame(SET, b"k", &[], b"v", 1, 0)),
        (
            "incr with short extras",
            frame(INCREMENT, b"k", &[0; 8], b"", 1, 0),
        ),
        ("touch without extras", plain(TOUCH, b"k", 1)),
        (
            "append with extras",
            frame(APPEND, b"k", &[0; 8], b"v", 1, 0),
        ),
        ("flush with a key", plain(FLUSH, b"k", 1)),
        ("noop with a value", frame(NOOP, b"", &[], b"v", 1, 0)),
        ("version with a key", plain(VERSION, b"k", 1)),
        ("quit with a value", frame(QUIT, b"", &[], b"v", 1, 0)),
        ("stat with extras", frame(STAT, b"", &[0; 4], b"", 1, 0)),
        ("sasl list with a key", plain(SASL_LIST_MECHS, b"k", 1)),
        (
            "sasl auth without a key",
            frame(SASL_AUTH, b"", &[], b"v", 1, 0),
        ),
        ("a 251-byte key", plain(GET, &[b'k'; 251], 1)),
        (
            "a 251-byte key on an unknown opcode",
            plain(0x50, &[b'k'; 251], 1),
        ),
        ("a get's body past any value's limit", long_body),
        ("key and extras longer than the body", lengths_past_the_body),
        ("a bad magic byte after a frame", bad_magic_after_a_frame),
    ];
    for (what, bytes) in cases {
        let answers = pair.same(what, |c| vec![c.exchange(&bytes)]);
        assert_eq!(answers[0].1, End::Closed, "{what}: {answers:?}");
    }
}

#[test]
fn long_keys_with_control_bytes_are_stored_and_read_as_memcached_does() {
    let pair = Pair::start();
    for len in [187, 200, 250] {
        for byte in [0x01, 0x09, 0x1b, 0x7f] {
            let key: Vec<u8> = (0..len)
                .map(|i| if i % 7 == 3 { byte } else { b'k' })
                .collect();
            let answers = pair.same(&format!("{len}-byte key holding {byte:#04x}"), |c| {
                vec![
                    c.exchange(&frame(SET, &key, &store_extras(9, 0), b"val", 1, 0)),
                    c.exchange(&plain(GETK, &key, 2)),
                    c.exchange(&frame(APPEND, &key, &[], b"ue", 3, 0)),
                    // A quiet get of such a key, alone and between others.
                    c.exchange(
                        &[
                            plain(GETKQ, b"plain-key", 4),
                            plain(GETKQ, &key, 5),
                            plain(GETKQ, b"other-key", 6),
                        ]
                        .concat(),
                    ),
                    c.exchange(&plain(DELETE, &key, 7)),
                    c.exchange(&plain(GET, &key, 8)),
                ]
            });
            assert!(is_hit(&answers[1], b"val"), "{answers:?}");
            assert!(is_hit(&answers[3], b"value"), "{answers:?}");
            assert_eq!(answers[5].0[0].status, 0x01, "{answers:?}");
        }
    }
}

#[test]
fn an_add_carrying_a_cas_is_a_compare_and_swap_as_in_memcached() {
    let pair = Pair::start();
    let answers = pair.same("add with a CAS", |c| {
        let mut answers = vec![
            c.exchange(&frame(
                ADD,
                b"missing",
                &store_extras(0, 0),
                b"v",
                1,
                12_345,
            )),
            c.exchange(&frame(
                ADDQ,
                b"missing-q",
                &store_extras(0, 0),
                b"v",
                2,
                12_345,
            )),
            c.exchange(&plain(GET, b"missing", 3)),
            c.exchange(&frame(SET, b"present", &store_extras(0, 0), b"old", 4, 0)),
            c.exchange(&frame(
                ADD,
                b"present",
                &store_extras(0, 0),
                b"x",
                5,
                0xdead_beef,
            )),
        ];
        let current = c.cas_of(b"present");
        answers.push(c.exchange(&frame(
            ADD,
            b"present",
            &store_extras(7, 0),
            b"new",
            6,
            current,
        )));
        answers.push(c.exchange(&plain(GET, b"present", 7)));
        answers
    });
    let status = |at: usize| answers[at].0[0].status;
    assert_eq!(
        (status(0), status(1), status(2)),
        (0x01, 0x01, 0x01),
        "{answers:?}"
    );
    assert_eq!(status(4), 0x02, "{answers:?}");
    assert!(is_hit(&answers[6], b"new"), "{answers:?}");
}

/// A key whose base64 form passes memcached's 250-byte limit for meta keys and that the text
/// protocol cannot carry raw (it holds a space, a line end or a NUL) cannot reach a text
/// backend: memroute refuses it and serves on (memcached would store it).
#[test]
fn a_long_key_holding_a_space_is_refused_and_the_connection_goes_on() {
    let pair = Pair::start();
    let mut c = Client::connect(&pair.proxy.listen);
    for bad in [b' ', b'\n', b'\r', 0] {
        let mut key = vec![b'k'; 187];
        key[90] = bad;
        let (replies, end) = c.exchange(&frame(SET, &key, &store_extras(0, 0), b"v", 1, 0));
        assert_eq!(end, End::Serving);
        assert_eq!(replies.len(), 1, "{replies:?}");
        assert_eq!(
            (replies[0].status, &replies[0].value[..]),
            (0x04, &b"Invalid arguments"[..])
        );
    }
    // 186 bytes still go base64.
    let key = [&[b' '; 1][..], &[b'k'; 185]].concat();
    let answers = pair.same("a 186-byte key holding a space", |c| {
        vec![
            c.exchange(&frame(SET, &key, &store_extras(0, 0), b"v", 1, 0)),
            c.exchange(&plain(GET, &key, 2)),
        ]
    });
    assert!(is_hit(&answers[1], b"v"), "{answers:?}");
}
