use super::outgoing::MAX_COALESCED_LINE;
use super::*;
use crate::reply::ReplyReceiver;
use crate::reply::TryRecvError;
use crate::HealthSettings;
use crate::ServerHealth;
use bytes::Bytes;
use memroute_net::Connector;
use memroute_protocol::Limits;
use memroute_protocol::{ReplyKind, RequestBytes};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::AtomicU64;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::LocalSet;

fn settings(address: &str, failure_limit: u32) -> ConnectionSettings {
    let health = ServerHealth::new(
        Arc::from("main"),
        Arc::from(address),
        HealthSettings {
            failure_limit,
            probe_interval: Duration::from_millis(10),
            probe_interval_max: Duration::from_millis(40),
            connect_timeout: Duration::from_secs(1),
            timeout: Duration::from_millis(50),
        },
        Arc::new(AtomicU64::new(0)),
    );
    ConnectionSettings {
        address: Arc::from(address),
        connector: Arc::new(Connector::plain(address)),
        timeout: Duration::from_millis(50),
        connect_timeout: Duration::from_secs(1),
        // Far longer than any test waits: a reconnect seen in a test came from the
        // health waking the connection, not from the backoff running out.
        backoff_min: Duration::from_secs(60),
        backoff_max: Duration::from_secs(60),
        limits: Limits::default(),
        health,
        round_trips: None,
        coalesce_keys: 100,
    }
}

/// Accepts a connection and answers memroute's greeting (`version`, see hello.rs) as
/// memcached does, so what follows is what the test is about. A connection that goes
/// before it is greeted is passed over.
async fn accept_greeted(listener: &TcpListener) -> std::io::Result<tokio::net::TcpStream> {
    loop {
        let (mut stream, _) = listener.accept().await?;
        let mut hello = [0u8; memroute_protocol::auth::HELLO.len()];
        if stream.read_exact(&mut hello).await.is_err() {
            continue;
        }
        assert_eq!(&hello, memroute_protocol::auth::HELLO);
        if stream.write_all(b"VERSION fake\r\n").await.is_ok() {
            return Ok(stream);
        }
    }
}

/// A port on loopback that nobody listens on (bound, noted, released).
fn refused_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("local addr").to_string()
}

/// Bounds every wait in these tests: a hang is a failure, not a stuck CI job.
/// How a fake server (for faults a real memcached will not produce on demand) behaves.
enum Fake {
    /// Greets, then closes at the first request: each connection breaks without a reply.
    CloseAtOnce,
    /// Accepts, reads, never answers.
    Silent,
    /// Answers every read with this reply.
    Answer(&'static [u8]),
}

/// A fake that answers `END` to every `\r\n`-terminated line and records every byte
/// it received, for tests of what exactly went on the wire.
async fn recording_server() -> (String, Rc<RefCell<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("local addr").to_string();
    let received = Rc::new(RefCell::new(Vec::new()));
    let log = received.clone();
    tokio::task::spawn_local(async move {
        while let Ok(mut stream) = accept_greeted(&listener).await {
            let log = log.clone();
            tokio::task::spawn_local(async move {
                let mut request = [0u8; 4096];
                while let Ok(n) = stream.read(&mut request).await {
                    if n == 0 {
                        break;
                    }
                    log.borrow_mut().extend_from_slice(&request[..n]);
                    let lines = request[..n].windows(2).filter(|w| w == b"\r\n").count();
                    let _ = stream.write_all(&b"END\r\n".repeat(lines)).await;
                }
            });
        }
    });
    (address, received)
}

/// Starts a fake server on a free loopback port (on the current LocalSet); its address.
async fn fake_server(fake: Fake) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("local addr").to_string();
    tokio::task::spawn_local(async move {
        while let Ok(mut stream) = accept_greeted(&listener).await {
            let reply = match fake {
                Fake::CloseAtOnce => {
                    // Greeted (the connection is up), it breaks at its first request:
                    // read, then dropped without a reply.
                    let mut request = [0u8; 1024];
                    let _ = stream.read(&mut request).await;
                    continue;
                }
                Fake::Silent => None,
                Fake::Answer(reply) => Some(reply),
            };
            tokio::task::spawn_local(async move {
                let mut request = [0u8; 1024];
                while matches!(stream.read(&mut request).await, Ok(n) if n > 0) {
                    if let Some(reply) = reply {
                        let _ = stream.write_all(reply).await;
                    }
                }
            });
        }
    });
    address
}

async fn within<F: std::future::Future>(future: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(10), future)
        .await
        .expect("timed out waiting")
}

fn get(handle: &BackendHandle) -> ReplyReceiver {
    handle.send(
        RequestBytes::whole(Bytes::from_static(b"get key\r\n")),
        ReplyKind::Retrieval,
    )
}

#[tokio::test]
async fn requests_written_in_pieces_go_out_whole_and_in_order() {
    LocalSet::new()
        .run_until(async {
            let (address, received) = recording_server().await;
            let handle = spawn_connection(settings(&address, 3));
            let other = handle.clone();
            // A request built key by key, one sent whole, one with a closure, and one
            // started and then abandoned (its bytes must not reach the server).
            let mut multi = handle.writer();
            multi.append(b"get a");
            multi.append(b" b");
            assert_eq!(multi.len(), 7);
            multi.append(b"\r\n");
            let first = multi.finish(ReplyKind::Retrieval);
            let mut abandoned = other.writer();
            abandoned.append(b"get never");
            drop(abandoned);
            let second = other.send(
                RequestBytes {
                    head: Bytes::from_static(b"get c"),
                    tail: Some(Bytes::from_static(b"\r\n")),
                },
                ReplyKind::Retrieval,
            );
            let third = handle.send_with(ReplyKind::Retrieval, |buffer| {
                buffer.extend_from_slice(b"get d\r\n")
            });
            for reply in [first, second, third] {
                let reply = within(reply).await.expect("reply slot").expect("reply");
                assert_eq!(&reply[..], b"END\r\n");
            }
            // Three gets queued together go out as one command (coalesced).
            assert_eq!(&received.borrow()[..], b"get a b c d\r\n");
        })
        .await;
}

#[tokio::test]
async fn a_second_request_while_one_is_being_written_is_refused_not_interleaved() {
    LocalSet::new()
        .run_until(async {
            let (address, received) = recording_server().await;
            let handle = spawn_connection(settings(&address, 3));
            let mut open = handle.writer();
            open.append(b"get a");
            let error = within(get(&handle)).await.expect("reply slot");
            assert!(error.is_err());
            open.append(b"\r\n");
            within(open.finish(ReplyKind::Retrieval))
                .await
                .expect("reply slot")
                .expect("reply");
            assert_eq!(&received.borrow()[..], b"get a\r\n");
        })
        .await;
}

#[tokio::test]
async fn the_task_ends_when_every_handle_is_dropped() {
    LocalSet::new()
        .run_until(async {
            let (address, _received) = recording_server().await;
            let settings = settings(&address, 3);
            let health = settings.health.clone();
            let handle = spawn_connection(settings);
            let clone = handle.clone();
            within(get(&handle))
                .await
                .expect("reply slot")
                .expect("reply");
            assert_eq!(health.open_connections(), 1);
            drop(handle);
            // One handle left: still serving.
            within(get(&clone))
                .await
                .expect("reply slot")
                .expect("reply");
            drop(clone);
            within(async {
                while health.open_connections() != 0 {
                    tokio::task::yield_now().await;
                }
            })
            .await;
        })
        .await;
}

#[tokio::test]
async fn queued_requests_fail_unsent_when_the_server_is_marked_down_before_the_write() {
    LocalSet::new()
        .run_until(async {
            let (address, received) = recording_server().await;
            let settings = settings(&address, 3);
            let health = settings.health.clone();
            let handle = spawn_connection(settings);
            within(get(&handle))
                .await
                .expect("reply slot")
                .expect("reply");
            // Queued, then (before the writer runs) another worker marks it down.
            let queued = [get(&handle), get(&handle)];
            health.mark_down("timed out");
            for reply in queued {
                let error = within(reply).await.expect("reply slot").expect_err("down");
                assert!(matches!(error, BackendError::Down { .. }), "{error}");
                assert!(error.never_sent());
            }
            assert_eq!(&received.borrow()[..], b"get key\r\n");
        })
        .await;
}

#[tokio::test]
async fn a_refused_connect_marks_the_server_down_at_once() {
    LocalSet::new()
        .run_until(async {
            let settings = settings(&refused_address(), 3);
            let health = settings.health.clone();
            let _handle = spawn_connection(settings);
            within(health.wait_down()).await;
            assert_eq!(&*health.down_reason(), "connection refused");
            assert_eq!(health.marked_down_total(), 1);
        })
        .await;
}

#[tokio::test]
async fn a_refused_connect_marks_the_server_down_at_once_with_fast_open_on_too() {
    LocalSet::new()
        .run_until(async {
            // With TCP Fast Open a deferred connect is made by the first write, the
            // greeting's, and a refusal may show there (hello.rs maps it to a refused
            // connect); where the kernel connects at once, the connect itself is refused.
            // Either way: down at once, no failure counted first.
            let address = refused_address();
            let mut settings = settings(&address, 3);
            settings.connector = Arc::new(Connector::new(&address, None, true).expect("connector"));
            let health = settings.health.clone();
            let _handle = spawn_connection(settings);
            within(health.wait_down()).await;
            assert_eq!(&*health.down_reason(), "connection refused");
            assert_eq!(health.consecutive_failures(), 0, "no failure counted first");
        })
        .await;
}

#[tokio::test]
async fn send_to_a_down_server_fails_at_once_unsent() {
    LocalSet::new()
        .run_until(async {
            let settings = settings(&refused_address(), 3);
            let health = settings.health.clone();
            let handle = spawn_connection(settings);
            health.mark_down("timed out");
            // No await between send and the check: the error is there at once.
            let mut reply = get(&handle);
            let error = match reply.try_recv() {
                Ok(Err(error)) => error,
                other => panic!("expected an immediate error, got {other:?}"),
            };
            assert!(matches!(error, BackendError::Down { .. }), "{error}");
            assert!(error.never_sent());
            assert!(error.to_string().ends_with("is marked down: timed out"));
        })
        .await;
}

#[tokio::test]
async fn requests_during_backoff_fail_unsent() {
    LocalSet::new()
        .run_until(async {
            let address = fake_server(Fake::CloseAtOnce).await;
            let settings = settings(&address, 100);
            let health = settings.health.clone();
            let handle = spawn_connection(settings);
            // Whether it was written before the close was seen or not, it fails.
            let first = within(get(&handle)).await.expect("reply slot");
            assert!(first.is_err());
            // The connection is now in its (long) backoff.
            let error = within(get(&handle))
                .await
                .expect("reply slot")
                .expect_err("no connection");
            assert!(
                matches!(error, BackendError::NotConnected { .. }),
                "{error}"
            );
            assert!(error.never_sent());
            assert_eq!(health.consecutive_failures(), 1);
            assert!(!health.is_down());
        })
        .await;
}

#[tokio::test]
async fn a_timeout_counts_once_for_every_request_in_flight() {
    LocalSet::new()
        .run_until(async {
            let address = fake_server(Fake::Silent).await;
            let settings = settings(&address, 3);
            let health = settings.health.clone();
            let handle = spawn_connection(settings);
            let replies = [get(&handle), get(&handle), get(&handle)];
            for reply in replies {
                let error = within(reply)
                    .await
                    .expect("reply slot")
                    .expect_err("silent server");
                assert!(error.is_timeout(), "{error}");
                assert!(!error.never_sent());
            }
            assert_eq!(health.consecutive_failures(), 1);
            assert!(!health.is_down());
        })
        .await;
}

#[tokio::test]
async fn a_reply_resets_the_failure_count() {
    LocalSet::new()
        .run_until(async {
            let address = fake_server(Fake::Answer(b"VERSION 1.6.18\r\n")).await;
            let settings = settings(&address, 3);
            let health = settings.health.clone();
            let handle = spawn_connection(settings);
            health.record_failure("timed out");
            health.record_failure("timed out");
            let reply = handle.send(
                RequestBytes::whole(Bytes::from_static(b"version\r\n")),
                ReplyKind::Line,
            );
            let reply = within(reply).await.expect("reply slot").expect("reply");
            assert_eq!(&reply[..], b"VERSION 1.6.18\r\n");
            assert_eq!(health.consecutive_failures(), 0);
        })
        .await;
}

#[tokio::test]
async fn a_server_brought_back_up_is_reconnected_at_once() {
    LocalSet::new()
        .run_until(async {
            let address = refused_address();
            let settings = settings(&address, 3);
            let health = settings.health.clone();
            let _handle = spawn_connection(settings);
            within(health.wait_down()).await;
            // The server starts again on the same port; the connection is in a 60 s
            // backoff, so only the health going up can make it connect now.
            let listener = TcpListener::bind(&address).await.expect("rebind the port");
            health.mark_up();
            within(listener.accept()).await.expect("accept");
        })
        .await;
}

/// A fake memcached for coalescing tests: answers each `get`/`gets` line with a VALUE
/// block for every key of `items` in it, in order, and END (anything else: ERROR), and
/// records every byte it received.
async fn map_server(
    items: &'static [(&'static str, &'static str)],
) -> (String, Rc<RefCell<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("local addr").to_string();
    let received = Rc::new(RefCell::new(Vec::new()));
    let log = received.clone();
    tokio::task::spawn_local(async move {
        while let Ok(mut stream) = accept_greeted(&listener).await {
            let log = log.clone();
            tokio::task::spawn_local(async move {
                let mut pending = Vec::new();
                let mut chunk = [0u8; 4096];
                while let Ok(n) = stream.read(&mut chunk).await {
                    if n == 0 {
                        break;
                    }
                    log.borrow_mut().extend_from_slice(&chunk[..n]);
                    pending.extend_from_slice(&chunk[..n]);
                    let mut reply = Vec::new();
                    while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                        let line: Vec<u8> = pending.drain(..end + 1).collect();
                        let line = line.strip_suffix(b"\n").unwrap_or(&line);
                        let line = line.strip_suffix(b"\r").unwrap_or(line);
                        let line = std::str::from_utf8(line).expect("ascii");
                        let mut words = line.split(' ').filter(|w| !w.is_empty());
                        let gets = match words.next() {
                            Some("get") => false,
                            Some("gets") => true,
                            _ => {
                                reply.extend_from_slice(b"ERROR\r\n");
                                continue;
                            }
                        };
                        for key in words {
                            if let Some((_, value)) = items.iter().find(|(k, _)| *k == key) {
                                let cas = if gets { " 7" } else { "" };
                                reply.extend_from_slice(
                                    format!("VALUE {key} 0 {}{cas}\r\n{value}\r\n", value.len())
                                        .as_bytes(),
                                );
                            }
                        }
                        reply.extend_from_slice(b"END\r\n");
                    }
                    let _ = stream.write_all(&reply).await;
                }
            });
        }
    });
    (address, received)
}

fn send_line(handle: &BackendHandle, line: &'static [u8]) -> ReplyReceiver {
    handle.send(
        RequestBytes::whole(Bytes::from_static(line)),
        ReplyKind::Retrieval,
    )
}

/// The reply and its VALUE-block count.
async fn reply_of(receiver: ReplyReceiver) -> (Vec<u8>, Option<u32>) {
    let mut receiver = receiver;
    let reply = within(&mut receiver)
        .await
        .expect("reply slot")
        .expect("reply");
    (reply.to_vec(), receiver.value_blocks())
}

const ITEMS: &[(&str, &str)] = &[
    ("a", "1"),
    ("b", "22"),
    ("c", "333"),
    ("d", "END\r\nVALUE b 0 1"),
];

#[tokio::test]
async fn consecutive_gets_go_out_as_one_command_and_each_request_gets_its_own_reply() {
    LocalSet::new()
        .run_until(async {
            let (address, received) = map_server(ITEMS).await;
            let handle = spawn_connection(settings(&address, 3));
            // Queued before the connection's first write: one batch. A multi-key
            // request built in pieces, misses, a key twice, a key in two requests,
            // a value that looks like reply lines; `gets` breaks a run of `get`s and
            // starts its own; a line ending in a bare \n is sent as it came.
            let mut multi = handle.writer();
            multi.append(b"get a");
            multi.append_word(b"zz");
            multi.append_word(b"b");
            multi.append(b"\r\n");
            let replies = [
                multi.finish(ReplyKind::Retrieval),
                send_line(&handle, b"get c\r\n"),
                send_line(&handle, b"get zz\r\n"),
                send_line(&handle, b"get  a  a \r\n"),
                send_line(&handle, b"get d b\r\n"),
                send_line(&handle, b"gets a\r\n"),
                send_line(&handle, b"gets b\r\n"),
                send_line(&handle, b"get c\n"),
                send_line(&handle, b"get c\r\n"),
            ];
            let mut got = Vec::new();
            for reply in replies {
                got.push(reply_of(reply).await);
            }
            let value =
                |key: &str, value: &str| format!("VALUE {key} 0 {}\r\n{value}\r\n", value.len());
            let expected: Vec<(String, Option<u32>)> = vec![
                (
                    format!("{}{}END\r\n", value("a", "1"), value("b", "22")),
                    Some(2),
                ),
                (format!("{}END\r\n", value("c", "333")), Some(1)),
                ("END\r\n".to_string(), Some(0)),
                (
                    format!("{}{}END\r\n", value("a", "1"), value("a", "1")),
                    Some(2),
                ),
                (
                    format!(
                        "{}{}END\r\n",
                        value("d", "END\r\nVALUE b 0 1"),
                        value("b", "22")
                    ),
                    Some(2),
                ),
                ("VALUE a 0 1 7\r\n1\r\nEND\r\n".to_string(), Some(1)),
                ("VALUE b 0 2 7\r\n22\r\nEND\r\n".to_string(), Some(1)),
                (format!("{}END\r\n", value("c", "333")), Some(1)),
                (format!("{}END\r\n", value("c", "333")), Some(1)),
            ];
            for (i, ((reply, blocks), (want, want_blocks))) in got.iter().zip(&expected).enumerate()
            {
                assert_eq!(String::from_utf8_lossy(reply), *want, "reply {i}");
                assert_eq!(blocks, want_blocks, "block count of reply {i}");
            }
            assert_eq!(
                String::from_utf8_lossy(&received.borrow()),
                "get a zz b c zz  a  a  d b\r\ngets a b\r\nget c\nget c\r\n"
            );
        })
        .await;
}

#[tokio::test]
async fn a_coalesced_command_keeps_to_the_key_limit_and_coalescing_can_be_turned_off() {
    LocalSet::new()
        .run_until(async {
            let (address, received) = map_server(ITEMS).await;
            let mut three = settings(&address, 3);
            three.coalesce_keys = 3;
            let handle = spawn_connection(three);
            let replies = [
                send_line(&handle, b"get a b\r\n"),
                send_line(&handle, b"get c\r\n"),
                send_line(&handle, b"get d\r\n"),
                send_line(&handle, b"get a b c d\r\n"),
                send_line(&handle, b"get a\r\n"),
            ];
            for reply in replies {
                reply_of(reply).await;
            }
            let wire = String::from_utf8_lossy(&received.borrow()).into_owned();
            assert_eq!(wire, "get a b c\r\nget d\r\nget a b c d\r\nget a\r\n");
        })
        .await;
    LocalSet::new()
        .run_until(async {
            let (address, received) = map_server(ITEMS).await;
            let mut off = settings(&address, 3);
            off.coalesce_keys = 0;
            let handle = spawn_connection(off);
            let replies = [
                send_line(&handle, b"get a\r\n"),
                send_line(&handle, b"get b\r\n"),
            ];
            for reply in replies {
                reply_of(reply).await;
            }
            assert_eq!(&received.borrow()[..], b"get a\r\nget b\r\n");
        })
        .await;
}

#[tokio::test]
async fn a_coalesced_line_stays_under_its_byte_limit() {
    LocalSet::new()
        .run_until(async {
            let (address, received) = map_server(ITEMS).await;
            let handle = spawn_connection(settings(&address, 3));
            // 100-byte keys: 20 fit in a 2 KB line ("get" and a space before each).
            let key = |i: usize| format!("{i:0>100}");
            let replies: Vec<_> = (0..25)
                .map(|i| {
                    handle.send(
                        RequestBytes::whole(Bytes::from(format!("get {}\r\n", key(i)))),
                        ReplyKind::Retrieval,
                    )
                })
                .collect();
            for reply in replies {
                assert_eq!(reply_of(reply).await, (b"END\r\n".to_vec(), Some(0)));
            }
            let wire = received.borrow().clone();
            let lines: Vec<&[u8]> = wire
                .split(|&b| b == b'\n')
                .filter(|l| !l.is_empty())
                .collect();
            assert_eq!(lines.len(), 2, "25 keys: a full line and the rest");
            assert!(lines.iter().all(|line| line.len() < MAX_COALESCED_LINE));
            assert_eq!(lines[0].len() + 1, 3 + 20 * 101 + 2);
        })
        .await;
}

#[tokio::test]
async fn an_error_line_answers_every_request_of_a_run() {
    LocalSet::new()
        .run_until(async {
            let address = fake_server(Fake::Answer(b"SERVER_ERROR out of memory\r\n")).await;
            let handle = spawn_connection(settings(&address, 3));
            let replies = [
                send_line(&handle, b"get a\r\n"),
                send_line(&handle, b"get b c\r\n"),
            ];
            for reply in replies {
                assert_eq!(reply_of(reply).await.0, b"SERVER_ERROR out of memory\r\n");
            }
        })
        .await;
}

#[tokio::test]
async fn a_reply_that_does_not_match_the_keys_asked_is_out_of_step() {
    // A key nobody asked, and the keys' blocks out of order. Requests are answered as
    // their keys are settled, so the first one takes its miss (the block before it is
    // not its key's); the blocks left over when the last request is settled make the
    // reply out of step: that request fails with BadReply and the connection is
    // reset. No request gets a block for a key it did not ask.
    for answer in [
        &b"VALUE zz 0 1\r\nx\r\nEND\r\n"[..],
        &b"VALUE b 0 1\r\nx\r\nVALUE a 0 1\r\ny\r\nEND\r\n"[..],
    ] {
        LocalSet::new()
            .run_until(async {
                let address = fake_server(Fake::Answer(answer)).await;
                let handle = spawn_connection(settings(&address, 3));
                let first = send_line(&handle, b"get a\r\n");
                let last = send_line(&handle, b"get b\r\n");
                let first = within(first).await.expect("reply slot");
                assert_eq!(
                    first.as_deref().ok(),
                    Some(&b"END\r\n"[..]),
                    "{:?}",
                    String::from_utf8_lossy(answer)
                );
                let last = within(last).await.expect("reply slot");
                assert!(
                    matches!(last, Err(BackendError::BadReply { .. })),
                    "{:?} for {:?}",
                    last,
                    String::from_utf8_lossy(answer)
                );
            })
            .await;
    }
}

#[tokio::test]
async fn a_run_is_answered_request_by_request_as_its_blocks_arrive() {
    LocalSet::new()
        .run_until(async {
            // A server that answers the run's first blocks, then the rest when told.
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let address = listener.local_addr().expect("local addr").to_string();
            let (rest_tx, rest_rx) = tokio::sync::oneshot::channel::<()>();
            tokio::task::spawn_local(async move {
                let mut stream = accept_greeted(&listener).await.expect("accept");
                let mut request = [0u8; 1024];
                let n = stream.read(&mut request).await.expect("read");
                assert_eq!(&request[..n], b"get a b c\r\n");
                stream
                    .write_all(b"VALUE a 0 1\r\n1\r\nVALUE b 0 1\r\n2\r\nVAL")
                    .await
                    .expect("write");
                let _ = rest_rx.await;
                stream
                    .write_all(b"UE c 0 1\r\n3\r\nEND\r\n")
                    .await
                    .expect("write");
                let _ = stream.read(&mut request).await;
            });
            let handle = spawn_connection(settings(&address, 3));
            let a = send_line(&handle, b"get a\r\n");
            let b = send_line(&handle, b"get b\r\n");
            let mut c = send_line(&handle, b"get c\r\n");
            // a and b are settled by the blocks that came; c's block is still partial.
            assert_eq!(
                reply_of(a).await,
                (b"VALUE a 0 1\r\n1\r\nEND\r\n".to_vec(), Some(1))
            );
            assert_eq!(
                reply_of(b).await,
                (b"VALUE b 0 1\r\n2\r\nEND\r\n".to_vec(), Some(1))
            );
            assert_eq!(c.try_recv().err(), Some(TryRecvError::Empty));
            rest_tx.send(()).expect("server waiting");
            assert_eq!(
                reply_of(c).await,
                (b"VALUE c 0 1\r\n3\r\nEND\r\n".to_vec(), Some(1))
            );
        })
        .await;
}
