//! How a family is defined and registered. Metric names and label names are constants of
//! this module's callers: a bad one is a bug the first unit test shows, never something input
//! can cause.
use std::sync::{Mutex, MutexGuard};

use prometheus::core::Collector;
use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// Latency buckets in seconds: 25 µs .. 2.5 s, a 1-2.5-5 ladder (proxy overhead is tens of
/// microseconds, a backend timeout hundreds of milliseconds).
const LATENCY_BUCKETS: &[f64] = &[
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5,
];

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let counter = IntCounter::new(name, help).unwrap_or_else(|e| unreachable_metric(name, e));
    register(registry, counter.clone(), name);
    counter
}

pub(super) fn counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> IntCounterVec {
    let vec = IntCounterVec::new(Opts::new(name, help), labels)
        .unwrap_or_else(|e| unreachable_metric(name, e));
    register(registry, vec.clone(), name);
    vec
}

pub(super) fn gauge_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> IntGaugeVec {
    let vec = IntGaugeVec::new(Opts::new(name, help), labels)
        .unwrap_or_else(|e| unreachable_metric(name, e));
    register(registry, vec.clone(), name);
    vec
}

pub(super) fn histogram_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
    let vec = HistogramVec::new(opts, labels).unwrap_or_else(|e| unreachable_metric(name, e));
    register(registry, vec.clone(), name);
    vec
}

pub(super) fn register<C: Collector + 'static>(registry: &Registry, collector: C, name: &str) {
    if let Err(error) = registry.register(Box::new(collector)) {
        unreachable_metric(name, error);
    }
}

pub(super) fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let gauge = IntGauge::new(name, help).unwrap_or_else(|e| unreachable_metric(name, e));
    register(registry, gauge.clone(), name);
    gauge
}

pub(super) fn unreachable_metric(name: &str, error: prometheus::Error) -> ! {
    panic!("metric {name} cannot be defined: {error}")
}
