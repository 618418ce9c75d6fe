//! The open loop (`--rate R`): requests are offered at scheduled times whatever the target's
//! replies do, and each one's latency runs from the time it was *due* to the end of its reply
//! (wrk2's correction for coordinated omission).
//!
//! ```text
//!   one thread (pinned by scripts/bench), one epoll set:
//!     timerfd armed at the next due time ──> send every request now due, each on an idle
//!                                            connection (write(2) right away), remember its
//!                                            due time in that connection's FIFO
//!     a connection readable ──────────────> read, parse replies, match each to the oldest
//!                                            due time of that connection, record the latency
//! ```
//!
//! Why not tokio here: its timer ticks in 1 ms, so every send due within a millisecond left
//! in one burst (~30 at 30k ops/s) and the generator measured its own queueing. A timerfd
//! with an absolute deadline wakes within the machine's timer latency instead, and one plain
//! event loop costs the generator fewer wake-ups per request than a task per connection.
//! How late each send left against its schedule is reported (`send_lateness_us`) so a reader
//! can see the pacing held; it is *included* in the latency, never subtracted.

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::time::Duration;

use memroute_benches::clock::{self, Timer};
use memroute_benches::hist::Histogram;
use memroute_benches::open_loop::{in_window, pick_connection, Arrival, InFlight, Schedule};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

use super::{
    parse_binary_reply, parse_reply, request, sample_cpu, Args, ConnStats, Kind, Measured, Plan,
    Reply, Rng,
};

const TIMER: Token = Token(usize::MAX);
/// Sends start this long after the connections are up, so the first due times are not late.
const LEAD_NS: u64 = 1_000_000;
/// How often outstanding requests are checked against `--reply-timeout`.
const TIMEOUT_CHECK_NS: u64 = 10_000_000;

/// How the open loop paced, for the JSON summary.
#[derive(Debug)]
pub struct Report {
    arrival: Arrival,
    offered_ops_per_sec: f64,
    /// Send time minus due time of every request due inside the window.
    lateness: Histogram,
}

impl Report {
    /// Appends the open loop's fields (`,"open":{...}`) and a percentile spectrum of the
    /// latency (for percentile plots) to the JSON object being written.
    pub fn write_json(&self, j: &mut String, latency: &Histogram) {
        let us = |h: &Histogram, q: f64| h.quantile(q) as f64 / 1000.0;
        let l = &self.lateness;
        let _ = write!(
            j,
            ",\"open\":{{\"arrival\":\"{}\",\"offered_ops_per_sec\":{:.1},\"latency_from\":\"due time\",\
\"send_lateness_us\":{{\"mean\":{:.2},\"p50\":{:.2},\"p90\":{:.2},\"p99\":{:.2},\"p999\":{:.2},\"max\":{:.2}}}}}",
            match self.arrival {
                Arrival::Uniform => "uniform",
                Arrival::Poisson => "poisson",
            },
            self.offered_ops_per_sec,
            l.mean() / 1000.0,
            us(l, 0.5),
            us(l, 0.9),
            us(l, 0.99),
            us(l, 0.999),
            l.max() as f64 / 1000.0,
        );
        j.push_str(",\"lat_percentiles_us\":[");
        for (i, q) in PERCENTILES.iter().enumerate() {
            let _ = write!(
                j,
                "{}[{},{:.1}]",
                if i > 0 { "," } else { "" },
                q,
                us(latency, q / 100.0)
            );
        }
        j.push(']');
    }
}

/// The percentiles reported for plots: dense up to the 99.99th.
const PERCENTILES: [f64; 17] = [
    1.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 97.5, 99.0, 99.5, 99.75, 99.9, 99.95, 99.975, 99.99,
    99.995, 100.0,
];

/// One connection of the open loop.
#[derive(Debug)]
struct Conn {
    stream: mio::net::TcpStream,
    /// Due times of the requests in flight, oldest first.
    in_flight: InFlight,
    /// Their kinds, in the same order (a reply is parsed as the kind of its request).
    kinds: std::collections::VecDeque<Kind>,
    /// Read buffer (fixed length, zeroed once) and how much of it holds unparsed bytes.
    inbuf: Vec<u8>,
    filled: usize,
    /// Bytes not yet accepted by the socket (normally empty: requests are small).
    unsent: Vec<u8>,
    /// Registered for WRITABLE too, while `unsent` is not empty.
    want_write: bool,
}

/// Writes as much of `c.unsent` as the socket takes now.
fn flush(c: &mut Conn) -> io::Result<()> {
    while !c.unsent.is_empty() {
        match c.stream.write(&c.unsent) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "write returned 0")),
            Ok(n) => {
                c.unsent.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Offers `--rate` ops/s for the warmup and the window, on this thread, and returns what the
/// window measured. CPU is sampled at the window's edges, as the closed loop does.
pub fn measure(args: &Args, plan: &Plan) -> Result<Measured, String> {
    let arrival = args.arrival;
    // Nothing this thread sleeps on should be rounded up by the default 50 µs slack.
    clock::set_min_timer_slack().map_err(|e| format!("prctl(PR_SET_TIMERSLACK): {e}"))?;
    let mut poll = Poll::new().map_err(|e| format!("epoll: {e}"))?;
    let mut conns = Vec::with_capacity(args.connections);
    for i in 0..args.connections {
        let addr = &plan.target.addr;
        let s = std::net::TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        s.set_nodelay(true)
            .and_then(|()| s.set_nonblocking(true))
            .map_err(|e| format!("socket options: {e}"))?;
        let mut stream = mio::net::TcpStream::from_std(s);
        poll.registry()
            .register(&mut stream, Token(i), Interest::READABLE)
            .map_err(|e| format!("epoll add: {e}"))?;
        conns.push(Conn {
            stream,
            in_flight: InFlight::default(),
            kinds: Default::default(),
            inbuf: vec![0; 64 * 1024],
            filled: 0,
            unsent: Vec::with_capacity(4096),
            want_write: false,
        });
    }
    let mut timer = Timer::new().map_err(|e| format!("timerfd: {e}"))?;
    poll.registry()
        .register(&mut SourceFd(&timer.as_raw_fd()), TIMER, Interest::READABLE)
        .map_err(|e| format!("epoll add timerfd: {e}"))?;

    let rng = Rng::new(1);
    let start = clock::monotonic_ns() + LEAD_NS;
    let warmup_end = start + args.warmup.as_nanos() as u64;
    let end = warmup_end + args.duration.as_nanos() as u64;
    let timeout_ns = args.reply_timeout.as_nanos() as u64;
    let spin_ns = args.spin.as_nanos() as u64;
    let mut schedule = Schedule::new(arrival, args.rate, start, 0x5EED);
    let mut cursor = 0;
    let mut total = ConnStats::default();
    let mut lateness = Histogram::default();
    let mut events = Events::with_capacity(256);
    let mut cpu_before = Vec::new();
    let mut cpu_after = None;
    let mut measuring = false;
    let mut next_timeout_check = start + TIMEOUT_CHECK_NS;
    let mut next_progress = start + 1_000_000_000;
    let mut completed_total: u64 = 0;
    let mut completed_last = 0;

    loop {
        let now = clock::monotonic_ns();
        if !measuring && now >= warmup_end {
            cpu_before = sample_cpu(&args.cpu, args.clk_tck)?;
            measuring = true;
            if !args.quiet {
                eprintln!("# measure start");
            }
        }
        if cpu_after.is_none() && now >= end {
            cpu_after = Some(sample_cpu(&args.cpu, args.clk_tck)?);
            if !args.quiet {
                eprintln!("# measure end");
            }
        }
        if now >= end && conns.iter().all(|c| c.in_flight.is_empty()) {
            break;
        }
        if now >= next_timeout_check {
            next_timeout_check = now + TIMEOUT_CHECK_NS;
            for (i, c) in conns.iter().enumerate() {
                if c.in_flight
                    .oldest_sent()
                    .is_some_and(|sent| now.saturating_sub(sent) > timeout_ns)
                {
                    return Err(format!(
                        "connection {i}: no reply within {:?} of sending a request",
                        args.reply_timeout
                    ));
                }
            }
        }
        if !args.quiet && now >= next_progress {
            next_progress += 1_000_000_000;
            eprintln!(
                "# t={:>5.1}s {} ops/s={} errors={}",
                now.saturating_sub(start) as f64 / 1e9,
                if measuring { "measure" } else { "warmup " },
                completed_total - completed_last,
                total.errors(),
            );
            completed_last = completed_total;
        }

        // Send everything that is due; each send reads the clock again for its lateness.
        while schedule.peek() <= now && schedule.peek() < end {
            let due = schedule.advance();
            let (i, next) = pick_connection(conns.len(), cursor, |c| conns[c].in_flight.is_empty());
            cursor = next;
            let c = &mut conns[i];
            let kind = request(&mut c.unsent, plan, &rng);
            c.kinds.push_back(kind);
            let sent_at = clock::monotonic_ns();
            c.in_flight.sent(due, sent_at);
            if in_window(due, warmup_end, end) {
                lateness.record(sent_at.saturating_sub(due));
            }
            flush(c).map_err(|e| format!("write: {e}"))?;
            if !c.unsent.is_empty() && !c.want_write {
                c.want_write = true;
                poll.registry()
                    .reregister(
                        &mut c.stream,
                        Token(i),
                        Interest::READABLE | Interest::WRITABLE,
                    )
                    .map_err(|e| format!("epoll mod: {e}"))?;
            }
        }

        // Wait for the next send, the next window edge or the next timeout check: within
        // `spin_ns` of it, poll without sleeping; otherwise sleep on the timer until then.
        let mut wake = next_timeout_check;
        if schedule.peek() < end {
            wake = wake.min(schedule.peek());
        }
        for edge in [warmup_end, end] {
            if edge > now {
                wake = wake.min(edge);
            }
        }
        let timeout = if wake.saturating_sub(clock::monotonic_ns()) <= spin_ns {
            Some(Duration::ZERO)
        } else {
            timer
                .arm_at(wake - spin_ns)
                .map_err(|e| format!("timerfd: {e}"))?;
            None
        };
        match poll.poll(&mut events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("epoll_wait: {e}")),
        }
        for ev in events.iter() {
            // The timer's event only wakes the loop: the clock says what is due. Re-arming
            // resets its expiry count, so it is never read.
            let Token(i) = ev.token();
            if ev.token() == TIMER {
                continue;
            }
            let Some(c) = conns.get_mut(i) else { continue };
            if ev.is_writable() {
                flush(c).map_err(|e| format!("write: {e}"))?;
                if c.unsent.is_empty() && c.want_write {
                    c.want_write = false;
                    poll.registry()
                        .reregister(&mut c.stream, Token(i), Interest::READABLE)
                        .map_err(|e| format!("epoll mod: {e}"))?;
                }
            }
            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                completed_total += read_replies(c, plan, &mut total, warmup_end, end)?;
            }
        }
    }
    Ok(Measured {
        total,
        cpu_before,
        cpu_after: cpu_after.unwrap_or_default(),
        hot_window: 0,
        open: Some(Report {
            arrival,
            offered_ops_per_sec: args.rate,
            lateness,
        }),
    })
}

/// Reads what the socket has and completes every whole reply in it. Returns how many.
fn read_replies(
    c: &mut Conn,
    plan: &Plan,
    total: &mut ConnStats,
    warmup_end: u64,
    end: u64,
) -> Result<u64, String> {
    let mut completed = 0;
    loop {
        if c.filled == c.inbuf.len() {
            // A reply larger than the buffer: make room (zeroed once, then reused).
            c.inbuf.resize(c.inbuf.len() * 2, 0);
        }
        let room = c.inbuf.len() - c.filled;
        let n = match c.stream.read(&mut c.inbuf[c.filled..]) {
            Ok(0) => return Err("connection closed by the target".into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(completed),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("read: {e}")),
        };
        c.filled += n;
        // Every reply in this read arrived by now.
        let now = clock::monotonic_ns();
        let mut pos = 0;
        while let Some(&kind) = c.kinds.front() {
            let buf = &c.inbuf[pos..c.filled];
            let parsed = if plan.binary {
                parse_binary_reply(buf, kind)?
            } else {
                parse_reply(buf, kind)?
            };
            let Reply::Done { consumed, outcome } = parsed else {
                break;
            };
            pos += consumed;
            c.kinds.pop_front();
            let Some((due, latency)) = c.in_flight.replied(now) else {
                return Err("a reply nobody asked for".into());
            };
            completed += 1;
            if in_window(due, warmup_end, end) {
                total.record(kind, &outcome, latency);
            }
        }
        // Keep the partial reply (if any) at the front.
        c.inbuf.copy_within(pos..c.filled, 0);
        c.filled -= pos;
        if c.kinds.is_empty() && c.filled > 0 {
            return Err("bytes from the target after every reply was in".into());
        }
        // Edge-triggered: a short read means the socket is empty now, and anything that
        // arrives later raises a new event; only a full buffer needs another read.
        if n < room {
            return Ok(completed);
        }
    }
}
