//! A whole client session over a scripted backend, for the `session` fuzz target (and a
//! CI-sized randomized run in this crate's tests). Compiled with the `fuzzing` feature only.
//!
//! ```text
//!   client bytes ──duplex──> session::run ──> dispatch ──> backend connection ──TCP──> script
//!   (then EOF)        replies <──────────────────────────────────────────────  (answers the
//!                                                                         script's bytes, then
//!                                                                         closes, stalls, or
//!                                                                         repeats per read)
//! ```
//!
//! A case ends when the session closes the client side (after the client's EOF every
//! request is answered: by the backend, or by a timeout of 20 ms). What a case must show:
//! no panic, the session finishes, and every byte it wrote is a framed memcached reply.
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::context::WorkerContext;
use crate::publisher::{Plan, Publisher};
use crate::stats::Metrics;

/// What the scripted backend does after it has sent its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// Closes the connection.
    Close,
    /// Keeps the connection open and never sends anything again.
    Stall,
    /// Sends the same bytes again after every read.
    Repeat,
}

/// One case: what the backend answers and what the client sends.
#[derive(Debug, Clone)]
pub struct Case {
    pub backend_reply: Vec<u8>,
    pub then: Then,
    pub client: Vec<u8>,
}

impl Case {
    /// Byte 0 picks `then`, bytes 1-2 (little endian) the length of the backend's reply,
    /// which follows; the rest is the client's stream.
    pub fn from_bytes(data: &[u8]) -> Case {
        let then = match data.first().copied().unwrap_or(0) % 3 {
            0 => Then::Close,
            1 => Then::Stall,
            _ => Then::Repeat,
        };
        let rest = data.get(3..).unwrap_or_default();
        let wanted = match data.get(1..3) {
            Some(len) => usize::from(u16::from_le_bytes([len[0], len[1]])),
            None => 0,
        };
        let split = wanted.min(rest.len());
        Case {
            backend_reply: rest[..split].to_vec(),
            then,
            client: rest[split..].to_vec(),
        }
    }
}

/// What a case produced.
#[derive(Debug)]
pub struct Outcome {
    /// Everything the session wrote to the client.
    pub output: Vec<u8>,
    /// The session closed the client side within the deadline.
    pub finished: bool,
}

/// Real time a case may take: every request is answered within the 20 ms backend timeout
/// (or at once), so only a stuck session comes near this.
const CASE_DEADLINE: Duration = Duration::from_secs(10);

/// Runs one case on a fresh current-thread runtime.
pub fn run(case: &Case) -> Outcome {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => panic!("cannot build a runtime: {error}"),
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, run_case(case.clone()))
}

async fn run_case(case: Case) -> Outcome {
    let listener = match TcpListener::bind("127.0.0.1:0").await {
        Ok(listener) => listener,
        Err(error) => panic!("bind the scripted backend: {error}"),
    };
    let address = match listener.local_addr() {
        Ok(address) => address.to_string(),
        Err(error) => panic!("scripted backend address: {error}"),
    };
    let backend = tokio::task::spawn_local(scripted_backend(
        listener,
        case.backend_reply.clone(),
        case.then,
    ));
    let toml = format!(
        "[proxy]\nlisten = [\"127.0.0.1:1\"]\nworkers = 1\nroute = \"main\"\n\
         max_client_pending = 64\nmax_buffered_replies = \"1MiB\"\nslow_client_timeout = \"1s\"\n\
         [pools.main]\nservers = [\"{address}\"]\ntimeout = \"20ms\"\nfailure_limit = 1000\n"
    );
    let config = match memroute_config::parse(&toml) {
        Ok(config) => config,
        Err(errors) => panic!("harness config: {errors}"),
    };
    let shared = Arc::new(Metrics::new(1));
    let plan = || match Plan::bare(config.clone()) {
        Ok(plan) => plan,
        Err(error) => panic!("harness routes: {error}"),
    };
    let (publisher, generation) = Publisher::new(shared.clone(), plan());
    publisher.publish(plan());
    let context = Rc::new(WorkerContext::for_generation(
        0,
        &generation.borrow().clone(),
        shared,
    ));
    let (client, session_side) = tokio::io::duplex(64 * 1024);
    // Counted as the worker counts a session (the guard uncounts it when the session ends).
    context.metrics.shared.admit_connection(0);
    let (alive, _all_done) = tokio::sync::mpsc::channel::<()>(1);
    let open = crate::session::OpenSession::new(context, alive, None);
    let session = tokio::task::spawn_local(crate::session::run(open, Scripted(session_side)));
    let (mut client_reader, mut client_writer) = tokio::io::split(client);
    let input = case.client.clone();
    // The client writes while the session's replies are read: neither side can block the other.
    let writer = tokio::task::spawn_local(async move {
        let _ = client_writer.write_all(&input).await;
        let _ = client_writer.shutdown().await;
    });
    let mut output = Vec::new();
    let finished = tokio::time::timeout(CASE_DEADLINE, client_reader.read_to_end(&mut output))
        .await
        .is_ok();
    writer.abort();
    session.abort();
    backend.abort();
    Outcome { output, finished }
}

async fn scripted_backend(listener: TcpListener, reply: Vec<u8>, then: Then) {
    while let Ok((mut stream, _)) = listener.accept().await {
        let reply = reply.clone();
        tokio::task::spawn_local(async move {
            let mut buffer = vec![0u8; 16 * 1024];
            // Answer once something was asked.
            if !matches!(stream.read(&mut buffer).await, Ok(n) if n > 0) {
                return;
            }
            if stream.write_all(&reply).await.is_err() {
                return;
            }
            match then {
                Then::Close => {}
                Then::Stall => while matches!(stream.read(&mut buffer).await, Ok(n) if n > 0) {},
                Then::Repeat => {
                    while matches!(stream.read(&mut buffer).await, Ok(n) if n > 0) {
                        if stream.write_all(&reply).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
}

/// Checks that `output` is a sequence of framed replies: lines ending in `\r\n` that start
/// with an upper-case word or a number (memcached's reply lines; memroute passes on a
/// backend's line it does not know, as a line), `VALUE`/`VA` lines followed by exactly the
/// data block they announce. Returns the offset and reason of the first violation.
pub fn check_framed(output: &[u8]) -> Result<(), String> {
    let mut at = 0;
    while at < output.len() {
        let rest = &output[at..];
        let Some(end) = rest.windows(2).position(|w| w == b"\r\n") else {
            return Err(format!("{at}: unterminated line {:?}", show(rest)));
        };
        let line = &rest[..end];
        let mut words = line.split(|&b| b == b' ');
        let first = words.next().unwrap_or_default();
        let data_len = match first {
            // VALUE <key> <flags> <bytes> [<cas>]
            b"VALUE" => Some(words.nth(2)),
            // VA <size> <flags>*
            b"VA" => Some(words.next()),
            _ => None,
        };
        at += end + 2;
        match data_len {
            Some(len) => {
                let len: usize = len
                    .and_then(|l| std::str::from_utf8(l).ok())
                    .and_then(|l| l.parse().ok())
                    .ok_or_else(|| format!("{at}: bad data length in {:?}", show(line)))?;
                let block = output
                    .get(at..at + len + 2)
                    .ok_or_else(|| format!("{at}: data block of {len} cut short"))?;
                if &block[len..] != b"\r\n" {
                    return Err(format!("{at}: data block of {len} not followed by \\r\\n"));
                }
                at += len + 2;
            }
            None => {
                let reply_like = first
                    .first()
                    .is_some_and(|c| c.is_ascii_uppercase() || c.is_ascii_digit());
                if !reply_like || line.contains(&b'\n') {
                    return Err(format!("{at}: not a reply line: {:?}", show(line)));
                }
            }
        }
    }
    Ok(())
}

fn show(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(120)]).into_owned()
}

/// The fuzzed client's end of an in-memory pipe, served like an accepted connection.
struct Scripted(tokio::io::DuplexStream);

impl crate::session::ClientConnection for Scripted {
    type Stream = tokio::io::DuplexStream;

    fn into_plain(self) -> Result<tokio::io::DuplexStream, Self> {
        Ok(self.0)
    }

    async fn establish(self) -> Option<tokio::io::DuplexStream> {
        Some(self.0)
    }

    fn describe(_: &tokio::io::DuplexStream) -> String {
        "fuzz".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing_check_accepts_replies_and_rejects_garbage() {
        assert_eq!(
            check_framed(b"VALUE k 0 2\r\nhi\r\nEND\r\nSTORED\r\n12\r\nVA 1 t\r\nx\r\nHD\r\n"),
            Ok(())
        );
        assert!(check_framed(b"VALUE k 0 5\r\nhi\r\nEND\r\n").is_err());
        assert!(check_framed(b"garbage\r\n").is_err());
        assert!(check_framed(b"VALUE k 0 x\r\n").is_err());
        assert!(check_framed(b"END").is_err());
    }

    fn assert_case(case: &Case) {
        let outcome = run(case);
        assert!(outcome.finished, "session did not finish: {case:?}");
        if let Err(reason) = check_framed(&outcome.output) {
            panic!(
                "unframed output ({reason}) for {case:?}: {:?}",
                show(&outcome.output)
            );
        }
    }

    #[test]
    fn garbage_stalls_and_closes_from_the_backend_still_frame_every_reply() {
        let client =
            b"get a\r\nset b 0 0 1\r\nx\r\nget a b c\r\nmg a v\r\nincr n 1\r\nversion\r\n".to_vec();
        for reply in [
            &b"garbage\r\n"[..],
            b"VALUE a 0 1\r\nx\r\nEND\r\n",
            b"VALUE a 0 9\r\nx",
            b"",
            b"STORED\r\nSTORED\r\n",
        ] {
            for then in [Then::Close, Then::Stall, Then::Repeat] {
                assert_case(&Case {
                    backend_reply: reply.to_vec(),
                    then,
                    client: client.clone(),
                });
            }
        }
    }

    /// A CI-sized randomized run of the fuzz target's property: mutations of a few seeds
    /// (deterministic, so a failure reproduces), each a whole session. The cases are drawn
    /// first, then run on several threads: most of a case is waiting out the 20 ms backend
    /// timeout, so one after another they would take about a minute.
    #[test]
    fn randomized_sessions_frame_every_reply() {
        let seeds: [&[u8]; 4] = [
            b"get a b\r\nset k 0 0 2\r\nhi\r\nmg k v t\r\ndelete k\r\n",
            b"gets x y z\r\nappend k 0 0 1\r\nz\r\nms k 2\r\nhi\r\nmn\r\n",
            b"incr c 5\r\ntouch k 10\r\ngat 1 k\r\nstats\r\nbogus\r\n",
            b"VALUE a 0 1\r\nx\r\nEND\r\n",
        ];
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            // xorshift64*: reproducible, no dependency.
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        let mut cases = Vec::with_capacity(1000);
        for _ in 0..1000 {
            let mut client = seeds[(next() % 3) as usize].to_vec();
            let mut backend = seeds[(next() % 4) as usize].to_vec();
            for target in [&mut client, &mut backend] {
                for _ in 0..(next() % 4) {
                    if target.is_empty() {
                        break;
                    }
                    let at = (next() as usize) % target.len();
                    match next() % 3 {
                        0 => target[at] = next() as u8,
                        1 => {
                            target.remove(at);
                        }
                        _ => target.insert(at, b" \r\n0123456789"[(next() % 13) as usize]),
                    }
                }
            }
            let then = match next() % 3 {
                0 => Then::Close,
                1 => Then::Stall,
                _ => Then::Repeat,
            };
            cases.push(Case {
                backend_reply: backend,
                then,
                client,
            });
        }
        let threads = 8;
        std::thread::scope(|scope| {
            for share in cases.chunks(cases.len().div_ceil(threads)) {
                scope.spawn(move || share.iter().for_each(assert_case));
            }
        });
    }
}
