//! Scripted command sequences for the differential conformance suite, and the runner that
//! sends the same bytes to a reference memcached and to a target and compares the replies.
//!
//! Each step is sent followed by `mn\r\n` and read up to the `MN\r\n` that answers it, so the
//! runner frames any reply (none for noreply, several lines for errors) without knowing it.
//! The token `{CAS}` in a step is replaced by the last cas unique that *this* connection saw;
//! both servers start fresh and see the same sequence, so their cas values agree anyway, but
//! substituting per side keeps a divergence in cas from hiding every later difference.
use crate::{show, Conn, ReadError};

/// A named sequence of requests; each step's reply is compared separately.
#[derive(Debug, Clone)]
pub struct Script {
    pub name: &'static str,
    pub steps: Vec<Vec<u8>>,
}

fn script(name: &'static str, steps: &[&[u8]]) -> Script {
    Script {
        name,
        steps: steps.iter().map(|s| s.to_vec()).collect(),
    }
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// The text protocol: storage, retrieval, arithmetic, touch, flush, with and without noreply.
pub fn text_scripts() -> Vec<Script> {
    let big = vec![b'v'; 500 * 1024];
    let mut set_big = format!("set big 0 0 {}\r\n", big.len()).into_bytes();
    set_big.extend_from_slice(&big);
    set_big.extend_from_slice(b"\r\n");
    let mut scripts = vec![
        script(
            "set/get",
            &[
                b"set a 0 0 5\r\nhello\r\n",
                b"get a\r\n",
                b"get missing\r\n",
                b"set b 123 0 3\r\nxyz\r\n",
                b"get a b missing a b\r\n",
                b"set a 0 0 5 noreply\r\nHELLO\r\n",
                b"get a\r\n",
                b"set e 0 0 0\r\n\r\n",
                b"get e\r\n",
                b"set crlf 0 0 4\r\na\r\nb\r\n",
                b"get crlf\r\n",
                b"set gone 0 -1 1\r\nx\r\n",
                b"get gone\r\n",
            ],
        ),
        script(
            "add/replace",
            &[
                b"add a 0 0 1\r\n1\r\n",
                b"add a 0 0 1\r\n2\r\n",
                b"add a2 0 0 1 noreply\r\n3\r\n",
                b"replace nope 0 0 1\r\n4\r\n",
                b"replace a 7 0 1\r\n5\r\n",
                b"replace a 0 0 1 noreply\r\n6\r\n",
                b"get a a2 nope\r\n",
            ],
        ),
        script(
            "append/prepend",
            &[
                b"append nope 0 0 1\r\nx\r\n",
                b"prepend nope 0 0 1\r\nx\r\n",
                b"set a 5 0 3\r\nmid\r\n",
                b"append a 0 0 4\r\n-end\r\n",
                b"prepend a 0 0 6\r\nstart-\r\n",
                b"append a 0 0 1 noreply\r\n!\r\n",
                b"prepend a 0 0 1 noreply\r\n^\r\n",
                b"get a\r\n",
            ],
        ),
        script(
            "gets/cas",
            &[
                b"set c 0 0 3\r\none\r\n",
                b"gets c\r\n",
                b"cas c 0 0 3 {CAS}\r\ntwo\r\n",
                b"cas c 0 0 5 1\r\nthree\r\n",
                b"gets c missing c\r\n",
                b"cas c 0 0 4 {CAS} noreply\r\nfour\r\n",
                b"gets c\r\n",
                b"cas nope 0 0 1 1\r\nx\r\n",
                b"cas nope 0 0 1 1 noreply\r\nx\r\n",
            ],
        ),
        script(
            "delete",
            &[
                b"set d 0 0 1\r\nx\r\n",
                b"delete d\r\n",
                b"delete d\r\n",
                b"set d 0 0 1\r\nx\r\n",
                b"delete d noreply\r\n",
                b"get d\r\n",
                b"set d 0 0 1\r\nx\r\n",
                b"delete d 0\r\n",
                b"delete d 5\r\n",
            ],
        ),
        script(
            "incr/decr",
            &[
                b"set n 0 0 2\r\n10\r\n",
                b"incr n 5\r\n",
                b"decr n 3\r\n",
                b"decr n 100\r\n",
                b"incr n 18446744073709551615\r\n",
                b"incr n 2\r\n",
                b"incr n 1 noreply\r\n",
                b"decr n 1 noreply\r\n",
                b"get n\r\n",
                b"incr nope 1\r\n",
                b"decr nope 1\r\n",
                b"set s 0 0 3\r\nabc\r\n",
                b"incr s 1\r\n",
                b"incr n abc\r\n",
                b"decr n -1\r\n",
            ],
        ),
        script(
            "touch/gat/gats",
            &[
                b"set t 0 0 2\r\nhi\r\n",
                b"set u 9 0 2\r\nyo\r\n",
                b"touch t 1000\r\n",
                b"touch nope 1000\r\n",
                b"touch t 0 noreply\r\n",
                b"gat 1000 t\r\n",
                b"gat 0 t nope u t\r\n",
                b"gats 0 u\r\n",
                b"gats 1000 nope\r\n",
                b"get t u\r\n",
            ],
        ),
        script(
            "flush_all",
            &[
                b"set f1 0 0 1\r\n1\r\n",
                b"flush_all\r\n",
                b"get f1\r\n",
                b"set f2 0 0 1\r\n2\r\n",
                b"flush_all 0\r\n",
                b"get f2\r\n",
                b"set f3 0 0 1\r\n3\r\n",
                b"flush_all noreply\r\n",
                b"get f3\r\n",
                b"set f4 0 0 1\r\n4\r\n",
                b"get f4\r\n",
            ],
        ),
    ];
    scripts.push(Script {
        name: "large value (500 KiB)",
        steps: vec![set_big, b"get big\r\n".to_vec(), b"delete big\r\n".to_vec()],
    });
    scripts
}

/// The meta protocol: mg/ms/md/ma/mn with flags, opaque tokens and quiet mode.
pub fn meta_scripts() -> Vec<Script> {
    vec![
        script(
            "mg/ms",
            &[
                b"mn\r\n",
                b"mg m1 v\r\n",
                b"mg m1 v q\r\n",
                b"ms m1 5 T0 F7\r\nhello\r\n",
                b"mg m1 v f k s O42\r\n",
                b"mg m1 v c t\r\n",
                b"mg m1\r\n",
                b"mg m1 q k v O1\r\n",
                b"mg m1 h\r\n",
                b"mg m1 h\r\n",
                b"ms m1 3 q\r\nnew\r\n",
                b"ms m1 3 O9 k\r\nnw2\r\n",
                b"mg m1 v\r\n",
                b"mg Zm9v b v k\r\n",
                b"ms Zm9v 3 b\r\nfoo\r\n",
                b"mg Zm9v b v k\r\n",
                b"mg foo v\r\n",
            ],
        ),
        script(
            "ms modes and cas",
            &[
                b"ms m2 3 MA\r\nabc\r\n",
                b"ms m2 3 ME\r\nabc\r\n",
                b"ms m2 3 ME\r\nxyz\r\n",
                b"ms m2 1 MA\r\n>\r\n",
                b"ms m2 1 MP\r\n<\r\n",
                b"ms m2 2 MR\r\nrr\r\n",
                b"ms m3 2 MR\r\nrr\r\n",
                b"mg m2 v c\r\n",
                b"ms m2 2 C{CAS}\r\ncc\r\n",
                b"ms m2 2 C1\r\nxx\r\n",
                b"mg m2 v\r\n",
                b"ms m2 2 I\r\nii\r\n",
                b"mg m2 v\r\n",
            ],
        ),
        script(
            "md",
            &[
                b"ms d1 1\r\nx\r\n",
                b"md d1\r\n",
                b"md d1\r\n",
                b"md d1 q\r\n",
                b"ms d1 1\r\nx\r\n",
                b"md d1 q\r\n",
                b"ms d2 1\r\nx\r\n",
                b"md d2 O5 k\r\n",
                b"ms d3 1 T0\r\nx\r\n",
                b"md d3 I T30\r\n",
                b"mg d3 v c\r\n",
            ],
        ),
        script(
            "ma",
            &[
                b"ma c1\r\n",
                b"ma c1 q\r\n",
                b"ma c1 N0 J10\r\n",
                b"ma c1 v\r\n",
                b"ma c1 MD D5 v\r\n",
                b"ma c1 MI D100 v O77 k\r\n",
                b"ma c1 q\r\n",
                b"mg c1 v\r\n",
                b"ms c2 1\r\nz\r\n",
                b"ma c2\r\n",
            ],
        ),
        script(
            "bad meta",
            &[
                b"mg\r\n",
                b"mz foo\r\n",
                b"ms foo S2\r\nhi\r\n",
                b"ms foo abc\r\nhi\r\n",
                b"mg foo v\r\n",
            ],
        ),
    ]
}

/// Bad input that memcached answers and recovers from; every script ends with a request that
/// shows the connection is still usable.
pub fn bad_input_scripts() -> Vec<Script> {
    let long_key = "k".repeat(251);
    let max_key = "k".repeat(250);
    let over_limit = vec![b'x'; 2_000_000];
    let after: &[u8] = b"set ok 0 0 2\r\nok\r\nget ok\r\n";
    let mut scripts = vec![
        script("unknown command", &[b"foo\r\n", b"foo bar baz\r\n", after]),
        script("empty line", &[b"\r\n", after]),
        script(
            "bad command line format",
            &[
                b"set k 0 0\r\n",
                b"set k abc 0 5\r\nhello\r\n",
                b"get\r\n",
                b"set k 0 0 -1\r\n",
                after,
            ],
        ),
        script(
            "bad data chunk",
            &[b"set k 0 0 3\r\nhello\r\n", b"get k\r\n", after],
        ),
        script(
            "incr on non-numeric",
            &[
                b"set s 0 0 3\r\nabc\r\n",
                b"incr s 1\r\n",
                b"decr s 1\r\n",
                after,
            ],
        ),
        script("overlong line", &[&cat(&[&[b'x'; 3000], b"\r\n"]), after]),
    ];
    scripts.push(Script {
        name: "key lengths (250 ok, 251 rejected)",
        steps: vec![
            format!("set {max_key} 0 0 1\r\nx\r\n").into_bytes(),
            format!("get {max_key}\r\n").into_bytes(),
            format!("get {long_key}\r\n").into_bytes(),
            format!("get a {long_key} b\r\n").into_bytes(),
            format!("set {long_key} 0 0 1\r\nx\r\n").into_bytes(),
            format!("delete {long_key}\r\n").into_bytes(),
            format!("mg {long_key} v\r\n").into_bytes(),
            after.to_vec(),
        ],
    });
    scripts.push(Script {
        name: "value over the size limit",
        steps: vec![
            cat(&[b"set big 0 0 2000000\r\n", &over_limit, b"\r\n"]),
            b"get big\r\n".to_vec(),
            after.to_vec(),
        ],
    });
    scripts
}

/// What one side answered to one step.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Reply(Vec<u8>),
    Closed(Vec<u8>),
    TimedOut(Vec<u8>),
}

impl Outcome {
    fn describe(&self) -> String {
        match self {
            Outcome::Reply(b) => show(b),
            Outcome::Closed(b) => format!("{}<connection closed>", show(b)),
            Outcome::TimedOut(b) => format!("{}<read timed out>", show(b)),
        }
    }
}

/// One side of the comparison: a connection and the last cas unique it saw.
#[derive(Debug)]
pub struct Side {
    conn: Conn,
    last_cas: String,
}

impl Side {
    pub fn new(conn: Conn) -> Side {
        Side {
            conn,
            last_cas: "0".into(),
        }
    }

    fn step(&mut self, step: &[u8]) -> Outcome {
        let request = replace_all(step, b"{CAS}", self.last_cas.as_bytes());
        match self.conn.roundtrip_fenced(&request) {
            Ok(reply) => {
                if let Some(cas) = last_cas_in(&reply) {
                    self.last_cas = cas;
                }
                Outcome::Reply(reply)
            }
            Err(ReadError { partial, eof: true }) => Outcome::Closed(partial),
            Err(ReadError {
                partial,
                eof: false,
            }) => Outcome::TimedOut(partial),
        }
    }
}

/// Runs `script` on both sides; Err describes the first step whose replies differ (later steps
/// would only repeat the divergence).
pub fn compare(script: &Script, reference: &mut Side, target: &mut Side) -> Result<(), String> {
    for (i, step) in script.steps.iter().enumerate() {
        let want = reference.step(step);
        let got = target.step(step);
        if want != got {
            let sent = if step.len() > 300 {
                format!("{}... ({} bytes)", show(&step[..300]), step.len())
            } else {
                show(step)
            };
            return Err(format!(
                "script `{}` step {i}:\n--- sent:\n{sent}\n--- memcached answered:\n{}\n--- target answered:\n{}",
                script.name,
                want.describe(),
                got.describe()
            ));
        }
        if !matches!(want, Outcome::Reply(_)) {
            return Err(format!(
                "script `{}` step {i}: both sides {}; the script is wrong",
                script.name,
                want.describe()
            ));
        }
    }
    Ok(())
}

fn replace_all(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(hay.len());
    let mut rest = hay;
    while let Some(i) = crate::find(rest, from) {
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(to);
        rest = &rest[i + from.len()..];
    }
    out.extend_from_slice(rest);
    out
}

/// The last cas unique in a reply: the 5th field of `VALUE k f n cas`, or a meta `c<digits>` flag.
fn last_cas_in(reply: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(reply);
    let mut found = None;
    for line in text.split("\r\n") {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.first() == Some(&"VALUE") && fields.len() == 5 {
            found = Some(fields[4].to_string());
        } else if matches!(fields.first(), Some(&"VA") | Some(&"HD")) {
            for f in &fields[1..] {
                if let Some(c) = f.strip_prefix('c') {
                    if !c.is_empty() && c.bytes().all(|b| b.is_ascii_digit()) {
                        found = Some(c.to_string());
                    }
                }
            }
        }
    }
    found
}
