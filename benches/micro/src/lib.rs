//! memroute-microbench: criterion micro-benchmarks (in benches/); this library is empty.
//! `cargo bench -p memroute-microbench --bench parse|hash|multiget|tls_handshake`.
