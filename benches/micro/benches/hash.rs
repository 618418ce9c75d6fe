//! Criterion benchmarks for key hashing and server lookup (memroute-routing).
//!
//! `cargo bench -p memroute-microbench --bench hash`
//!
//! - `hash/<name>`: every hash function on one 20-byte key.
//! - `server_for/<distribution>/<servers>`: the whole per-key placement step
//!   (hash_tag check, hash, lookup) over a rotating set of keys, so the ring lookup
//!   is not served from one hot cache line.
//! - `route/select/...`: the route-table walk every request makes before placement
//!   (a plain pool, and a prefix route nested in an operation route).
//! - `multiget_split/<distribution>/<servers>`: placing the 20 keys of one multi-get and
//!   grouping them by server, as the proxy does before sending one batch per server.
//! - `multiget_place/{one_by_one,together}/ketama-<hash>/4`: the 20 keys of one multi-get
//!   over scenario (b)'s 4-server pool, placed one at a time or with `servers_for`.
//! - `route/with_live/ketama/50`: rebuilding a 50-server ketama ring without one server
//!   (what each worker does once when a server of an ejecting pool goes down or up).
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use memroute_routing::{
    DistributionName, HashFn, HashName, Operation, Placement, PoolSpec, RouteTable, ServerSpec,
};

const KEY: &[u8; 20] = b"user:1234567:profile";

fn bench_hashes(c: &mut Criterion) {
    let mut group = c.benchmark_group("hash");
    group.throughput(Throughput::Bytes(KEY.len() as u64));
    for name in HashName::ALL {
        let f = HashFn(name);
        group.bench_function(name.as_str(), |b| b.iter(|| f.hash(black_box(KEY))));
    }
    group.finish();
}

fn pool(servers: usize, distribution: DistributionName, hash: HashName) -> PoolSpec {
    PoolSpec {
        servers: (0..servers)
            .map(|i| ServerSpec {
                address: format!("10.0.{}.{}:11211", i / 250, i % 250 + 1),
                weight: 1,
                name: None,
            })
            .collect(),
        distribution,
        hash,
        // wch3 only: mostly full weights, a few servers at a share (as while draining).
        weights: (0..servers)
            .map(|i| if i % 10 == 3 { 0.5 } else { 1.0 })
            .collect(),
        ..PoolSpec::new(Vec::new())
    }
}

fn bench_server_for(c: &mut Criterion) {
    // 1024 distinct 20-byte keys, cycled through.
    let keys: Vec<Vec<u8>> = (0..1024)
        .map(|i| format!("user:{i:07}:profile").into_bytes())
        .collect();
    let cases = [
        (DistributionName::Ketama, HashName::Fnv1a_64, 10),
        (DistributionName::Ketama, HashName::Fnv1a_64, 50),
        (DistributionName::Ketama, HashName::Md5, 50),
        (DistributionName::Ring, HashName::Xxh3, 10),
        (DistributionName::Ring, HashName::Xxh3, 50),
        (DistributionName::Jump, HashName::Xxh3, 10),
        (DistributionName::Jump, HashName::Xxh3, 50),
        (DistributionName::Modula, HashName::Fnv1a_64, 10),
        // mcrouter's: the pool hash is not used (they hash the routing key their own way).
        (DistributionName::Ch3, HashName::Fnv1a_64, 10),
        (DistributionName::Ch3, HashName::Fnv1a_64, 50),
        (DistributionName::WeightedCh3, HashName::Fnv1a_64, 50),
        (DistributionName::Crc32, HashName::Fnv1a_64, 50),
    ];
    let mut group = c.benchmark_group("server_for");
    for (distribution, hash, servers) in cases {
        let placement = Placement::new(&pool(servers, distribution, hash));
        let id = format!("{}-{}/{servers}", distribution.as_str(), hash.as_str());
        group.bench_function(id, |b| {
            let mut i = 0usize;
            b.iter(|| {
                i = (i + 1) & 1023;
                placement.server_for(black_box(&keys[i]))
            })
        });
    }
    group.finish();
}

/// One 20-key multi-get: every key placed, then counted per server (the grouping the proxy
/// does before it sends one batch per server).
fn bench_multiget_split(c: &mut Criterion) {
    let keys: Vec<Vec<u8>> = (0..1024)
        .map(|i| format!("user:{i:07}:profile").into_bytes())
        .collect();
    let mut group = c.benchmark_group("multiget_split");
    group.throughput(Throughput::Elements(20));
    for distribution in [
        DistributionName::Ketama,
        DistributionName::Jump,
        DistributionName::Ch3,
        DistributionName::WeightedCh3,
    ] {
        let servers = 50;
        let placement = Placement::new(&pool(servers, distribution, HashName::Fnv1a_64));
        group.bench_function(format!("{}/{servers}", distribution.as_str()), |b| {
            let mut start = 0usize;
            let mut per_server = [0u8; 64];
            b.iter(|| {
                start = (start + 20) & 1023;
                per_server.fill(0);
                for key in keys.iter().cycle().skip(start).take(20) {
                    per_server[placement.server_for(black_box(key))] += 1;
                }
                black_box(&per_server);
            })
        });
    }
    group.finish();
}

/// The 20 keys of one multi-get (memroute-load's 14-byte keys) over a 4-server ketama pool
/// (scenario (b)'s), placed one
/// key at a time (`server_for`) and together (`servers_for`: twemproxy's fnv1a four keys
/// at a time, their multiply chains interleaved).
fn bench_multiget_place(c: &mut Criterion) {
    let names: Vec<Vec<u8>> = (0..1024)
        .map(|i| format!("bench:{i:08}").into_bytes())
        .collect();
    let keys: Vec<&[u8]> = names.iter().map(|k| &k[..]).collect();
    let mut group = c.benchmark_group("multiget_place");
    group.throughput(Throughput::Elements(20));
    for hash in [HashName::Fnv1a_64, HashName::Md5] {
        let placement = Placement::new(&pool(4, DistributionName::Ketama, hash));
        let id = format!("ketama-{}/4", hash.as_str());
        group.bench_function(format!("one_by_one/{id}"), |b| {
            let mut start = 0usize;
            let mut servers = [0u32; 20];
            b.iter(|| {
                start = (start + 20) & 1023;
                let batch = black_box(&keys[start.min(1004)..start.min(1004) + 20]);
                for (server, key) in servers.iter_mut().zip(batch) {
                    *server = placement.server_for(key) as u32;
                }
                black_box(&servers);
            })
        });
        group.bench_function(format!("together/{id}"), |b| {
            let mut start = 0usize;
            let mut servers = [0u32; 20];
            b.iter(|| {
                start = (start + 20) & 1023;
                let batch = black_box(&keys[start.min(1004)..start.min(1004) + 20]);
                placement.servers_for(batch, &mut servers);
                black_box(&servers);
            })
        });
    }
    group.finish();
}

fn bench_route(c: &mut Criterion) {
    let keys: Vec<Vec<u8>> = (0..1024)
        .map(|i| format!("{}:{i:07}:profile", ["user", "session", "feed"][i % 3]).into_bytes())
        .collect();
    let plain = memroute_config::parse(
        "[pools.main]\nservers = [\"10.0.0.1:11211\", \"10.0.0.2:11211\"]\n",
    )
    .expect("valid config");
    let nested = memroute_config::parse(
        "[proxy]\nroute = \"ops\"\n\
         [pools.main]\nservers = [\"10.0.0.1:11211\"]\n\
         [pools.sessions]\nservers = [\"10.0.0.2:11211\"]\n\
         [pools.writes]\nservers = [\"10.0.0.3:11211\"]\n\
         [routes.ops]\ntype = \"operation\"\ndelete = \"writes\"\ndefault = \"by_prefix\"\n\
         [routes.by_prefix]\ntype = \"prefix\"\nprefixes = { \"session:\" = \"sessions\", \"feed:\" = \"main\" }\ndefault = \"main\"\n",
    )
    .expect("valid config");
    let mut group = c.benchmark_group("route");
    for (name, config) in [("plain", &plain), ("operation-prefix", &nested)] {
        let table = RouteTable::build(&config.routing_spec()).expect("routable");
        group.bench_function(format!("select/{name}"), |b| {
            let mut i = 0usize;
            b.iter(|| {
                i = (i + 1) & 1023;
                table.select(table.root(), black_box(Operation::Get), black_box(&keys[i]))
            })
        });
    }
    let pool50 = pool(50, DistributionName::Ketama, HashName::Fnv1a_64);
    let mut live = vec![true; 50];
    live[17] = false;
    group.bench_function("with_live/ketama/50", |b| {
        b.iter(|| Placement::with_live(black_box(&pool50), black_box(&live)))
    });
    group.finish();
}

criterion_group!(
    benches,
    bench_hashes,
    bench_server_for,
    bench_multiget_split,
    bench_multiget_place,
    bench_route
);
criterion_main!(benches);
