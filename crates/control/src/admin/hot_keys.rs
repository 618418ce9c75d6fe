//! `GET /hotkeys`: the hottest keys of each pool, as JSON for scripts and the panel.
use serde_json::{json, Value};

use memroute_proxy::hot_keys::Report;
use memroute_proxy::stats::Metrics;

/// Keys listed per pool unless `?top=` asks for another number (at most the sketch size).
const DEFAULT_TOP: usize = 10;

/// `top` from the query (`top=N`), within 1..=CAPACITY.
pub(crate) fn top_of(query: &str) -> usize {
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix("top="))
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(DEFAULT_TOP)
        .clamp(1, memroute_proxy::hot_keys::CAPACITY)
}

/// ```json
/// { "sample_every": 16, "interval_seconds": 10, "span_seconds": 14.2,
///   "pools": [ { "pool": "main", "sampled": 5120, "collapsed_gets": 812,
///                "hot_cache_hits": 9000, "hot_cache_misses": 1000, "hot_cache_hit_share": 0.9,
///                "keys": [ { "key": "user:42", "share": 0.25, "rate": 2301.5,
///                            "server": "10.0.0.1:11211", "error": 0.0 } ] } ] }
/// ```
/// `share` is the key's fraction of the pool's sampled requests over `span_seconds`,
/// `rate` its estimated requests per second, `error` the most of `share` that may belong
/// to other keys. `collapsed_gets` counts the pool's gets since start that waited for an
/// identical get in flight (`memroute_collapsed_gets_total`); `hot_cache_*` the gets its
/// hot-key cache answered and did not, since start (`hot_cache_hit_share` is `null`
/// before the first: no `hot_cache`, or no cacheable get yet).
pub(crate) fn report(metrics: &Metrics, top: usize) -> Value {
    let mut report = metrics.hot_keys.report(top);
    // Every pool of the running config is listed, sampled in the span or not: its
    // collapsed gets and hot-cache counts are since start, not of the span.
    for pool in metrics.pool_names() {
        if !report.pools.iter().any(|listed| listed.pool == pool) {
            report.pools.push(memroute_proxy::hot_keys::PoolHotKeys {
                pool,
                samples: 0,
                keys: Vec::new(),
            });
        }
    }
    report.pools.sort_by(|a, b| a.pool.cmp(&b.pool));
    let pools: Vec<Value> = report
        .pools
        .iter()
        .map(|pool| {
            let keys: Vec<Value> = pool
                .keys
                .iter()
                .map(|key| {
                    json!({
                        "key": report.key_text(key),
                        "share": Report::share(pool, key),
                        "rate": report.rate(key),
                        "server": metrics.server_address(&pool.pool, key.server as usize),
                        "error": match pool.samples {
                            0 => 0.0,
                            n => key.error as f64 / n as f64,
                        },
                    })
                })
                .collect();
            let (hits, misses) = metrics.hot_cache_of(&pool.pool);
            let share = (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64);
            json!({
                "pool": pool.pool,
                "sampled": pool.samples,
                "collapsed_gets": metrics.collapsed_gets_of(&pool.pool),
                "hot_cache_hits": hits,
                "hot_cache_misses": misses,
                "hot_cache_hit_share": share,
                "keys": keys,
            })
        })
        .collect();
    json!({
        "sample_every": report.settings.sample_every,
        "interval_seconds": report.settings.interval.as_secs_f64(),
        "span_seconds": report.span.as_secs_f64(),
        "pools": pools,
    })
}
