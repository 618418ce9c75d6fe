//! uring-proxy: an experiment for issue 10 item 3, not part of memroute.
//!
//! A minimal single-threaded memcached text proxy (clients -> one pipelined connection to
//! one memcached, replies matched in order), written once as sans-I/O state (`core`) and
//! driven by two event loops of the same shape: `--mode epoll` (tokio current-thread, as
//! memroute's workers run) and `--mode uring` (io_uring via the `io-uring` crate: every
//! recv/send prepared in one wake-up submitted with the next wait, in one syscall).
//! `scripts/bench-uring` runs both, and memroute itself, under the same load.
use std::net::{SocketAddr, TcpListener};

use clap::{Parser, ValueEnum};
use memroute_uring_proxy::{epoll, uring};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Mode {
    Epoll,
    Uring,
}

#[derive(Debug, Parser)]
#[command(
    name = "uring-proxy",
    about = "epoll vs io_uring proxy loop experiment"
)]
struct Args {
    /// Address to listen on.
    #[arg(long)]
    listen: SocketAddr,
    /// The one memcached to forward to.
    #[arg(long)]
    backend: SocketAddr,
    #[arg(long, value_enum, default_value = "epoll")]
    mode: Mode,
    /// io_uring: create the ring without SINGLE_ISSUER | DEFER_TASKRUN.
    #[arg(long)]
    no_defer_taskrun: bool,
    /// io_uring: multishot recv over provided buffers instead of one recv per read.
    #[arg(long)]
    multishot_recv: bool,
}

fn main() {
    let args = Args::parse();
    let listener = match TcpListener::bind(args.listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("uring-proxy: bind {}: {e}", args.listen);
            std::process::exit(1);
        }
    };
    let result = match args.mode {
        Mode::Epoll => epoll::run(listener, args.backend),
        Mode::Uring => uring::run(
            listener,
            args.backend,
            uring::Options {
                defer_taskrun: !args.no_defer_taskrun,
                multishot_recv: args.multishot_recv,
            },
        ),
    };
    if let Err(e) = result {
        eprintln!("uring-proxy: {e}");
        std::process::exit(1);
    }
}
