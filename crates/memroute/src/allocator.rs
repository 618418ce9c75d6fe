//! The process's global allocator: jemalloc, with background purging and a half-second
//! decay, unless the `jemalloc` feature is off (then the system's malloc).
//!
//! Chosen by measurement against glibc and mimalloc (docs/benchmarks.md, "Global
//! allocator"): a proxy's memory comes in storms (thousands of connections opening and
//! closing, slow clients holding megabytes of replies) and must go back to the system
//! after them. After ten slow readers left, glibc and mimalloc kept most of what they had
//! freed and jemalloc's background thread returned it (one run each). With the settings
//! below, RSS is 2.5-4.4 MiB above the start 1 s after such a storm (`scripts/bench-memory`,
//! docs/benchmarks.md "Memory after a storm"). Per connection it is also a little tighter
//! than glibc (0.79 KiB against 0.97 after traffic), and CPU per request is the same
//! within 1%.
//!
//! jemalloc reads its settings at its start from `MALLOC_CONF` below; an operator can still
//! override them with the `_RJEM_MALLOC_CONF` environment variable (same syntax).

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's startup options (a C string: `const char *malloc_conf`, under the prefix
/// tikv-jemalloc-sys gives its symbols). `background_thread`: a thread purges unused
/// pages, so memory returns even while the workers sleep (one is enough for a proxy's few
/// threads; jemalloc would start one per CPU). `dirty_decay_ms:500`: freed pages go back
/// within half a second rather than jemalloc's default ten, so a burst's memory is back
/// within a second (the workers' pools give theirs back within half a second, see
/// `TRIM_INTERVAL` in the proxy's worker). `muzzy_decay_ms:0`: a purge returns pages at
/// once (`MADV_DONTNEED`) rather than marking them lazily free first: lazily freed pages
/// still count in RSS until the kernel needs them, which kept a burst's memory in RSS for
/// a second more (muzzy_decay_ms:1000 before; scripts/bench-memory measures both).
#[allow(unsafe_code)] // a symbol export only: jemalloc reads these bytes, nothing is called
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: &[u8; 84] =
    b"background_thread:true,max_background_threads:1,dirty_decay_ms:500,muzzy_decay_ms:0\0";
