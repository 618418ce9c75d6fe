//! `GET /watch?key_prefix=P&route=R&limit=N&rate=N`: sampled requests as they are answered,
//! one JSON object per line (`application/x-ndjson`, chunked), until `limit` lines, the
//! client goes, or the watcher is dropped for reading too slowly (`request_watch`).
//!
//! JSON lines rather than Server-Sent Events: `curl -N URL | jq` and a script's line reader
//! take them as they are, and a browser's EventSource, SSE's one advantage, cannot send the
//! `Authorization` header the watch needs when `admin.token` is set.
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hyper::body::{Body, Frame};
use serde_json::json;
use tokio::sync::mpsc;

use super::query::percent_decode;
use crate::controller::Controller;
use memroute_proxy::request_watch::{Filter, WatchHub, WatchLine, Watcher, DEFAULT_RATE, MAX_RATE};

/// Lines rendered into one chunk when several are waiting.
const LINES_PER_CHUNK: usize = 64;

/// The filter a `/watch` query asks for, or why it cannot be served (a 400's text).
pub(crate) fn filter_of(query: &str, controller: &Controller) -> Result<Filter, String> {
    let mut filter = Filter {
        rate: DEFAULT_RATE,
        ..Filter::default()
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(value).ok_or("bad percent-encoding in the query")?;
        let text = String::from_utf8_lossy(&value).into_owned();
        let number = || text.parse::<u64>().ok().filter(|n| *n > 0);
        match name {
            "key_prefix" => filter.key_prefix = value,
            "route" => filter.route = Some(text.clone()),
            "limit" => filter.limit = Some(number().ok_or("limit must be a number above 0")?),
            "rate" => {
                filter.rate = number()
                    .filter(|n| *n <= u64::from(MAX_RATE))
                    .ok_or(format!("rate must be 1..={MAX_RATE} lines a second"))?
                    as u32
            }
            _ => {
                return Err(format!(
                    "unknown parameter {name:?}: /watch takes key_prefix, route, limit and rate"
                ))
            }
        }
    }
    if let Some(route) = &filter.route {
        let generation = controller.current();
        let routes = &generation.routes;
        let names: Vec<&str> = (0..routes.node_count() as u32)
            .map(|node| routes.node_name(node))
            .collect();
        if !names.contains(&route.as_str()) {
            return Err(format!(
                "no route or pool {route:?} (there are: {})",
                names.join(", ")
            ));
        }
    }
    Ok(filter)
}

/// The body of a `/watch` answer: the watcher's lines as they come. Dropping it (the
/// client went, the connection closed) ends the watch.
pub(crate) struct WatchBody {
    hub: Arc<WatchHub>,
    watcher: Arc<Watcher>,
    lines: mpsc::Receiver<Arc<WatchLine>>,
    controller: Arc<Controller>,
    /// Lines still to send (`limit`).
    left: Option<u64>,
    ended: bool,
}

impl WatchBody {
    /// Opens a watch with `filter`; `None` when the most watchers are open already.
    pub(crate) fn open(
        hub: &Arc<WatchHub>,
        controller: Arc<Controller>,
        filter: Filter,
    ) -> Option<WatchBody> {
        let left = filter.limit;
        let (watcher, lines) = hub.watch(filter)?;
        Some(WatchBody {
            hub: hub.clone(),
            watcher,
            lines,
            controller,
            left,
            ended: false,
        })
    }

    fn show_keys(&self) -> bool {
        let generation = self.controller.current();
        generation.config.admin.as_ref().is_none_or(|a| a.show_keys)
    }

    /// Renders `line` and counts it against the limit.
    fn render(&mut self, line: &WatchLine, show_keys: bool, out: &mut String) {
        out.push_str(&render(line, show_keys));
        out.push('\n');
        if let Some(left) = &mut self.left {
            *left = left.saturating_sub(1);
        }
    }
}

impl Drop for WatchBody {
    fn drop(&mut self) {
        self.hub.close(&self.watcher);
    }
}

impl Body for WatchBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if this.ended || this.left == Some(0) {
            return Poll::Ready(None);
        }
        let first = match this.lines.poll_recv(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(line)) => line,
            Poll::Ready(None) => {
                // Every sender is gone: the watcher was dropped for being slow (the hub
                // keeps the sender for as long as the watch is open).
                this.ended = true;
                let notice = json!({
                    "closed": "dropped: this watcher read its lines more slowly than they came",
                });
                return Poll::Ready(Some(Ok(Frame::data(Bytes::from(format!("{notice}\n"))))));
            }
        };
        let show_keys = this.show_keys();
        let mut out = String::new();
        this.render(&first, show_keys, &mut out);
        for _ in 1..LINES_PER_CHUNK {
            if this.left == Some(0) {
                break;
            }
            match this.lines.try_recv() {
                Ok(line) => this.render(&line, show_keys, &mut out),
                Err(_) => break,
            }
        }
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))))
    }
}

/// One line: `{"time":"2026-11-27T06:40:01.123Z","client":"10.0.0.5:53122","command":"get",
/// "key":"user:42","keys":1,"route":"main","server":"10.0.0.1:11211","result":"hit",
/// "latency_us":182}`.
fn render(line: &WatchLine, show_keys: bool) -> String {
    let key = match show_keys {
        true => memroute_proxy::hot_keys::printable(&line.key),
        false => "<hidden>".to_string(),
    };
    // Built in this order (a JSON object's fields come out sorted otherwise): a person
    // reading the raw lines sees them as the columns `memroute watch` prints.
    let string = |value: &str| serde_json::Value::from(value).to_string();
    format!(
        "{{\"time\":{},\"client\":{},\"command\":{},\"key\":{},\"keys\":{},\"route\":{},\"server\":{},\"result\":{},\"latency_us\":{}}}",
        string(&utc(line.time)),
        string(&line.client),
        string(line.command),
        string(&key),
        line.keys,
        string(&line.route),
        string(&line.server),
        string(&line.result),
        line.latency.as_micros() as u64,
    )
}

/// `time` as RFC 3339 in UTC, to the millisecond.
fn utc(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's days_from_civil, inverted).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60,
        since.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn times_are_rfc3339_utc() {
        assert_eq!(utc(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let time = UNIX_EPOCH + Duration::from_millis(1_795_761_601_123);
        assert_eq!(utc(time), "2026-11-27T06:40:01.123Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(utc(leap), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn keys_are_hidden_when_asked() {
        let line = WatchLine {
            time: UNIX_EPOCH,
            client: "127.0.0.1:5000".into(),
            command: "get",
            key: b"user:1".to_vec(),
            keys: 1,
            route: "main".into(),
            server: "127.0.0.1:11211".into(),
            result: "hit".into(),
            latency: Duration::from_micros(250),
        };
        let shown: serde_json::Value = serde_json::from_str(&render(&line, true)).expect("json");
        assert_eq!(shown["key"], "user:1");
        assert_eq!(shown["latency_us"], 250);
        let hidden: serde_json::Value = serde_json::from_str(&render(&line, false)).expect("json");
        assert_eq!(hidden["key"], "<hidden>");
    }
}
