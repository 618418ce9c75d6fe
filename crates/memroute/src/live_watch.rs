//! `memroute watch`: the admin port's `GET /watch` as a command. Connects to the admin
//! address (`--admin`, else `admin.listen` of `--config`), sends the token of the config
//! (`admin.token` or `admin.token_file`) or `--token`, and prints one line per sampled
//! request until `--limit` lines or Ctrl-C.
//!
//! ```text
//!   GET /watch?... HTTP/1.1 -> 200, chunked JSON lines -> one printed line each
//!   the admin port closes a connection after 60 s: the watch reconnects and goes on
//!   {"closed": ...} (dropped for reading too slowly) -> printed on stderr, exit 1
//! ```
//!
//! A plain blocking HTTP/1.1 client: one request, a chunked body, nothing else to speak.
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{bail, Context as _};

/// What to watch, as given on the command line.
#[derive(Debug)]
pub struct WatchArgs {
    pub admin: String,
    pub token: Option<String>,
    pub key_prefix: Option<String>,
    pub route: Option<String>,
    pub limit: Option<u64>,
    pub rate: Option<u32>,
    /// Print the JSON lines as they come rather than as columns.
    pub json: bool,
}

/// How one connection's stream ended.
enum Ended {
    /// The limit was reached.
    Done,
    /// The connection closed (the admin port's connection time limit): reconnect.
    Closed,
}

/// Runs the watch until its limit or an error.
pub fn run(args: &WatchArgs) -> anyhow::Result<()> {
    let mut left = args.limit;
    loop {
        match stream_once(args, &mut left)? {
            Ended::Done => return Ok(()),
            Ended::Closed => continue,
        }
    }
}

/// The admin address to connect to for one that listens on every address.
pub fn connect_address(listen: &str) -> String {
    if let Some(port) = listen.strip_prefix("0.0.0.0:") {
        return format!("127.0.0.1:{port}");
    }
    if let Some(port) = listen.strip_prefix("[::]:") {
        return format!("[::1]:{port}");
    }
    listen.to_string()
}

fn query(args: &WatchArgs, left: Option<u64>) -> String {
    let mut pairs = Vec::new();
    if let Some(prefix) = &args.key_prefix {
        pairs.push(format!("key_prefix={}", percent_encode(prefix)));
    }
    if let Some(route) = &args.route {
        pairs.push(format!("route={}", percent_encode(route)));
    }
    if let Some(limit) = left {
        pairs.push(format!("limit={limit}"));
    }
    if let Some(rate) = args.rate {
        pairs.push(format!("rate={rate}"));
    }
    pairs.join("&")
}

fn percent_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b':' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn stream_once(args: &WatchArgs, left: &mut Option<u64>) -> anyhow::Result<Ended> {
    let mut stream = TcpStream::connect(&args.admin)
        .with_context(|| format!("cannot connect to the admin port {}", args.admin))?;
    stream.set_nodelay(true).ok();
    let mut request = format!(
        "GET /watch?{} HTTP/1.1\r\nHost: {}\r\nAccept: application/x-ndjson\r\n",
        query(args, *left),
        args.admin
    );
    if let Some(token) = &args.token {
        request.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    request.push_str("Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes())?;
    // The head arrives at once; the body may be silent for long (nothing matches).
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(stream);
    let mut status = String::new();
    reader.read_line(&mut status)?;
    let code = status.split(' ').nth(1).unwrap_or("");
    let mut chunked = false;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
            break;
        }
        let lower = header.to_ascii_lowercase();
        chunked |= lower.starts_with("transfer-encoding:") && lower.contains("chunked");
    }
    if code != "200" {
        let mut body = String::new();
        let _ = reader.read_to_string(&mut body);
        bail!("{} answered {}: {}", args.admin, status.trim(), body.trim());
    }
    reader.get_ref().set_read_timeout(None)?;
    let mut lines = Lines::new(reader, chunked);
    while let Some(line) = lines.next_line()? {
        if line.is_empty() {
            continue;
        }
        let value: serde_json::Value = serde_json::from_str(&line)
            .with_context(|| format!("not a JSON line from /watch: {line}"))?;
        if let Some(reason) = value.get("closed").and_then(|c| c.as_str()) {
            bail!("the watch was closed: {reason}");
        }
        print_line(args, &line, &value);
        if let Some(n) = left {
            *n = n.saturating_sub(1);
            if *n == 0 {
                return Ok(Ended::Done);
            }
        }
    }
    Ok(Ended::Closed)
}

fn print_line(args: &WatchArgs, line: &str, value: &serde_json::Value) {
    let text = match args.json {
        true => format!("{line}\n"),
        false => {
            let field = |name: &str| match &value[name] {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Null => "-".to_string(),
                other => other.to_string(),
            };
            let keys = value["keys"].as_u64().unwrap_or(1);
            let more = match keys {
                0 | 1 => String::new(),
                n => format!(" (+{} keys)", n - 1),
            };
            format!(
                "{} {} {} {}{} route={} server={} {} {}us\n",
                field("time"),
                field("client"),
                field("command"),
                field("key"),
                more,
                field("route"),
                field("server"),
                field("result"),
                field("latency_us"),
            )
        }
    };
    let mut stdout = std::io::stdout().lock();
    // A closed stdout (`| head`) ends the watch as Ctrl-C would.
    if stdout.write_all(text.as_bytes()).is_err() || stdout.flush().is_err() {
        std::process::exit(0);
    }
}

/// The body's lines, through chunked transfer encoding when the answer uses it.
struct Lines<R> {
    reader: R,
    chunked: bool,
    /// Bytes of the current chunk not read yet.
    chunk_left: usize,
    partial: Vec<u8>,
}

impl<R: BufRead> Lines<R> {
    fn new(reader: R, chunked: bool) -> Self {
        Lines {
            reader,
            chunked,
            chunk_left: 0,
            partial: Vec::new(),
        }
    }

    /// The next whole line, or `None` at the body's end (or the connection's).
    fn next_line(&mut self) -> anyhow::Result<Option<String>> {
        loop {
            if let Some(at) = self.partial.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.partial.drain(..=at).collect();
                let line = String::from_utf8_lossy(&line).trim_end().to_string();
                return Ok(Some(line));
            }
            if !self.fill()? {
                return Ok(None);
            }
        }
    }

    /// Reads more of the body into `partial`; false at its end.
    fn fill(&mut self) -> anyhow::Result<bool> {
        if !self.chunked {
            let mut buf = [0u8; 4096];
            let n = read_or_end(&mut self.reader, &mut buf)?;
            self.partial.extend_from_slice(&buf[..n]);
            return Ok(n > 0);
        }
        if self.chunk_left == 0 {
            let mut size = String::new();
            if self.reader.read_line(&mut size)? == 0 {
                return Ok(false);
            }
            let size = size.trim();
            if size.is_empty() {
                // The CRLF after the previous chunk's data.
                return Ok(true);
            }
            let size = size.split(';').next().unwrap_or("");
            self.chunk_left = usize::from_str_radix(size, 16)
                .with_context(|| format!("bad chunk size {size:?}"))?;
            if self.chunk_left == 0 {
                return Ok(false);
            }
        }
        let mut buf = vec![0u8; self.chunk_left.min(64 * 1024)];
        let n = read_or_end(&mut self.reader, &mut buf)?;
        self.chunk_left -= n;
        self.partial.extend_from_slice(&buf[..n]);
        Ok(n > 0)
    }
}

/// A read where a connection reset is the end, as a close is.
fn read_or_end(reader: &mut impl Read, buf: &mut [u8]) -> anyhow::Result<usize> {
    match reader.read(buf) {
        Ok(n) => Ok(n),
        Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => Ok(0),
        Err(error) => Err(error.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_lines_are_joined_across_chunks() {
        let body = b"5\r\n{\"a\":\r\n3\r\n1}\n\r\n4\r\n{}\n\n\r\n0\r\n\r\n";
        let mut lines = Lines::new(&body[..], true);
        assert_eq!(
            lines.next_line().expect("line").as_deref(),
            Some("{\"a\":1}")
        );
        assert_eq!(lines.next_line().expect("line").as_deref(), Some("{}"));
        assert_eq!(lines.next_line().expect("line").as_deref(), Some(""));
        assert_eq!(lines.next_line().expect("end"), None);
    }

    #[test]
    fn wildcard_addresses_are_reached_on_loopback() {
        assert_eq!(connect_address("0.0.0.0:9150"), "127.0.0.1:9150");
        assert_eq!(connect_address("[::]:9150"), "[::1]:9150");
        assert_eq!(connect_address("10.0.0.1:9150"), "10.0.0.1:9150");
        assert_eq!(percent_encode("a b/c"), "a%20b%2Fc");
    }
}
