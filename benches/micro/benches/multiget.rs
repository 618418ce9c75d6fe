//! Criterion benches for the pure (socket-free) path of one 20-key multi-get over 4 servers,
//! scenario (b)'s shape: memroute-load's 14-byte keys, 64-byte values, every key a hit.
//!
//! `cargo bench -p memroute-microbench --bench multiget`
//!
//! - `multiget/parse_request`: the client's line into a request with its 20 key ranges.
//! - `multiget/place_and_write`: every key placed on the 4-server ketama pool
//!   (`Placement::servers_for`) and appended to its server's batch line, as
//!   `dispatch::split_multi_get` does through the backend connections' buffers.
//! - `multiget/frame_replies`: the 4 servers' replies framed (`parse_reply`), as each
//!   backend connection's reader does.
//! - `multiget/merge`: the client's reply built from the 4 replies in key order
//!   (`value_block_for` per key and a copy of its block), as `multiget::merge` does.
//! - `multiget/all`: the four in a row.
//!
//! The proxy's own bookkeeping around these (its plan's leg per key, pending entry, tasks)
//! is not in here: callgrind of the whole proxy (docs/benchmarks.md) counts that.
use std::hint::black_box;

use bytes::{BufMut, BytesMut};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use memroute_protocol::{
    parse_reply, parse_request, value_block_for, Limits, Parse, ReplyKind, ReplyParse,
};
use memroute_routing::{DistributionName, HashName, Placement, PoolSpec, ServerSpec};

const KEYS: usize = 20;
const SERVERS: usize = 4;

struct Fixture {
    line: Vec<u8>,
    keys: Vec<Vec<u8>>,
    placement: Placement,
    replies: Vec<Vec<u8>>,
    /// Per key, its server (the leg whose reply carries it).
    server_of: Vec<usize>,
}

fn fixture() -> Fixture {
    let keys: Vec<Vec<u8>> = (0..KEYS)
        .map(|i| format!("bench:{:08}", i * 7919 + 13).into_bytes())
        .collect();
    let line = [b"get ".to_vec(), keys.join(&b' '), b"\r\n".to_vec()].concat();
    let pool = PoolSpec {
        servers: (0..SERVERS)
            .map(|i| ServerSpec {
                address: format!("127.0.0.1:{}", 43201 + i),
                weight: 1,
                name: None,
            })
            .collect(),
        distribution: DistributionName::Ketama,
        hash: HashName::Fnv1a_64,
        ..PoolSpec::new(Vec::new())
    };
    let placement = Placement::new(&pool);
    let server_of: Vec<usize> = keys.iter().map(|k| placement.server_for(k)).collect();
    let mut replies = vec![Vec::new(); SERVERS];
    for (key, &server) in keys.iter().zip(&server_of) {
        let reply = &mut replies[server];
        reply.extend_from_slice(b"VALUE ");
        reply.extend_from_slice(key);
        reply.extend_from_slice(b" 0 64\r\n");
        reply.extend_from_slice(&[b'v'; 64]);
        reply.extend_from_slice(b"\r\n");
    }
    for reply in &mut replies {
        reply.extend_from_slice(b"END\r\n");
    }
    Fixture {
        line,
        keys,
        placement,
        replies,
        server_of,
    }
}

fn parse(f: &Fixture, input: &mut BytesMut, limits: &Limits) -> memroute_protocol::Request {
    input.clear();
    input.extend_from_slice(&f.line);
    match parse_request(input, limits) {
        Parse::Request(request) => request,
        other => panic!("bench input did not parse: {other:?}"),
    }
}

fn place_and_write(f: &Fixture, keys: &[&[u8]], lines: &mut [BytesMut; SERVERS]) {
    let mut servers = [0u32; KEYS];
    f.placement.servers_for(keys, &mut servers);
    for line in lines.iter_mut() {
        line.clear();
    }
    for (key, &server) in keys.iter().zip(&servers) {
        let line = &mut lines[server as usize];
        match line.is_empty() {
            true => line.put_slice(b"get "),
            false => line.put_u8(b' '),
        }
        line.put_slice(key);
    }
    for line in lines.iter_mut().filter(|l| !l.is_empty()) {
        line.put_slice(b"\r\n");
    }
}

fn frame(f: &Fixture, limits: &Limits) -> usize {
    f.replies
        .iter()
        .map(
            |reply| match parse_reply(reply, ReplyKind::Retrieval, limits) {
                Ok(ReplyParse::Complete(len)) => len,
                other => panic!("bench reply did not frame: {other:?}"),
            },
        )
        .sum()
}

fn merge(f: &Fixture, out: &mut BytesMut) {
    out.clear();
    let mut cursor = [0usize; SERVERS];
    for (key, &server) in f.keys.iter().zip(&f.server_of) {
        let reply = &f.replies[server];
        if let Some(block) = value_block_for(reply, cursor[server], key) {
            out.extend_from_slice(&reply[block.clone()]);
            cursor[server] = block.end;
        }
    }
    out.extend_from_slice(b"END\r\n");
}

fn bench_multiget(c: &mut Criterion) {
    let f = fixture();
    let limits = Limits::default();
    let keys: Vec<&[u8]> = f.keys.iter().map(|k| &k[..]).collect();
    let mut input = BytesMut::with_capacity(1024);
    let mut lines: [BytesMut; SERVERS] = std::array::from_fn(|_| BytesMut::with_capacity(1024));
    let mut out = BytesMut::with_capacity(4096);
    let mut group = c.benchmark_group("multiget");
    group.throughput(Throughput::Elements(1));
    group.bench_function("parse_request", |b| {
        b.iter(|| black_box(parse(&f, &mut input, &limits).keys.len()))
    });
    group.bench_function("place_and_write", |b| {
        b.iter(|| place_and_write(&f, black_box(&keys), &mut lines))
    });
    group.bench_function("frame_replies", |b| {
        b.iter(|| black_box(frame(black_box(&f), &limits)))
    });
    group.bench_function("merge", |b| b.iter(|| merge(black_box(&f), &mut out)));
    group.bench_function("all", |b| {
        b.iter(|| {
            let request = parse(&f, &mut input, &limits);
            // The keys as slices, on the stack (as the proxy's placement chunk is).
            let mut keys: [&[u8]; KEYS] = [&[]; KEYS];
            for (slot, key) in keys.iter_mut().zip(request.keys()) {
                *slot = key;
            }
            place_and_write(&f, &keys, &mut lines);
            black_box(frame(&f, &limits));
            merge(&f, &mut out);
        })
    });
    group.finish();
}

criterion_group!(benches, bench_multiget);
criterion_main!(benches);
