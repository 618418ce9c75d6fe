//! Criterion benches for the hot-path parsers: client request framing and
//! backend reply framing.
use bytes::BytesMut;
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use memroute_protocol::{parse_reply, parse_request, Limits, Parse, ReplyKind};

fn bench_request(c: &mut Criterion, name: &str, input: &[u8]) {
    let limits = Limits::default();
    // One buffer reused across iterations, refilled each time, as a session
    // reuses its read buffer.
    let mut buf = BytesMut::with_capacity(input.len() * 2);
    c.bench_function(name, |b| {
        b.iter(|| {
            buf.clear();
            buf.extend_from_slice(input);
            match parse_request(black_box(&mut buf), &limits) {
                Parse::Request(r) => black_box(r.keys.len()),
                other => panic!("bench input did not parse: {other:?}"),
            }
        })
    });
}

fn requests(c: &mut Criterion) {
    bench_request(c, "parse_request/get_1_key", b"get user:12345:profile\r\n");
    let keys: Vec<String> = (0..20).map(|i| format!("user:{i:05}:profile")).collect();
    let multi = format!("get {}\r\n", keys.join(" "));
    bench_request(c, "parse_request/get_20_keys", multi.as_bytes());
    let mut set = b"set user:12345:profile 0 300 64\r\n".to_vec();
    set.extend_from_slice(&[b'v'; 64]);
    set.extend_from_slice(b"\r\n");
    bench_request(c, "parse_request/set_64b", &set);
    bench_request(
        c,
        "parse_request/mg_flags",
        b"mg user:12345:profile v c f t k O123456 q\r\n",
    );
}

fn replies(c: &mut Criterion) {
    let limits = Limits::default();
    let mut hit = b"VALUE user:12345:profile 0 64\r\n".to_vec();
    hit.extend_from_slice(&[b'v'; 64]);
    hit.extend_from_slice(b"\r\nEND\r\n");
    c.bench_function("parse_reply/get_hit", |b| {
        b.iter(|| parse_reply(black_box(&hit), ReplyKind::Retrieval, &limits))
    });

    let mut multi = Vec::new();
    for i in 0..20 {
        multi.extend_from_slice(format!("VALUE user:{i:05}:profile 0 64\r\n").as_bytes());
        multi.extend_from_slice(&[b'v'; 64]);
        multi.extend_from_slice(b"\r\n");
    }
    multi.extend_from_slice(b"END\r\n");
    c.bench_function("parse_reply/get_20_values", |b| {
        b.iter(|| parse_reply(black_box(&multi), ReplyKind::Retrieval, &limits))
    });
}

criterion_group!(benches, requests, replies);
criterion_main!(benches);
