//! memroute: a memcached routing proxy. The binary is thin: CLI, logging, signals.
//!
//! ```text
//!   memroute --config FILE            run in the foreground
//!   memroute --check --config FILE    validate, print what was understood, exit
//!   memroute import-twemproxy FILE    print the memroute TOML for a nutcracker.yml
//! ```
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use memroute_config::{Config, RouteConfig};

#[derive(Debug, Parser)]
#[command(name = "memroute", version, about = "A memcached routing proxy")]
struct Cli {
    /// The TOML config file.
    #[arg(short, long, global = true)]
    config: Option<PathBuf>,
    /// Validate the config, print the pools and routes it defines, and exit.
    #[arg(long)]
    check: bool,
    /// Log filter (tracing env-filter syntax); RUST_LOG overrides it.
    #[arg(long, default_value = "info")]
    log: String,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the memroute TOML equivalent of a twemproxy (nutcracker) YAML config.
    ImportTwemproxy {
        /// Path to nutcracker.yml.
        file: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&cli.log));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        // Colour codes only for a person at a terminal, not in files and log collectors.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("memroute: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    if let Some(Command::ImportTwemproxy { file }) = cli.command {
        let yaml = std::fs::read_to_string(&file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        let toml = memroute_config::twemproxy::import(&yaml)
            .map_err(|errors| anyhow::anyhow!("{}:\n{errors}", file.display()))?;
        write_stdout(&toml);
        return Ok(());
    }
    let Some(path) = cli.config else {
        anyhow::bail!("--config FILE is required (see --help)");
    };
    let config = memroute_config::load(&path)
        .map_err(|errors| anyhow::anyhow!("invalid config {}:\n{errors}", path.display()))?;
    if cli.check {
        write_stdout(&describe(&config));
        let (transport, errors) = memroute_proxy::check_transport(&config);
        write_stdout(&transport);
        if !errors.is_empty() {
            anyhow::bail!("invalid config {}:\n{}", path.display(), errors.join("\n"));
        }
        write_stdout(&format!("config {} is valid\n", path.display()));
        return Ok(());
    }
    serve(config, &path)
}

/// What the main thread was woken for.
enum Event {
    Reload,
    Stop,
}

fn serve(config: Config, path: &std::path::Path) -> anyhow::Result<()> {
    let workers = config.proxy.workers;
    let pools = config.pools.len();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("signal runtime")?;
    // Signal handlers exist before anyone is told we are ready: a SIGTERM right after
    // the ready line must mean a graceful stop, not the default action.
    let (mut interrupt, mut terminate, mut hangup) = runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        Ok::<_, std::io::Error>((
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
            signal(SignalKind::hangup())?,
        ))
    })?;
    let handle = memroute_proxy::start(config).context("cannot start")?;
    tracing::info!(listen = ?handle.local_addresses, admin = ?handle.admin_address, workers, pools, "memroute ready");
    loop {
        let event = runtime.block_on(async {
            tokio::select! {
                _ = interrupt.recv() => {
                    tracing::info!("SIGINT: shutting down");
                    Event::Stop
                }
                _ = terminate.recv() => {
                    tracing::info!("SIGTERM: shutting down");
                    Event::Stop
                }
                _ = hangup.recv() => Event::Reload,
            }
        });
        match event {
            Event::Stop => break,
            Event::Reload => reload(&handle, path),
        }
    }
    handle.shutdown();
    // Workers drain within proxy.shutdown_timeout; a second signal means "now".
    let forced = runtime.block_on(async {
        let join = tokio::task::spawn_blocking(move || handle.join());
        tokio::select! {
            _ = join => false,
            _ = interrupt.recv() => true,
            _ = terminate.recv() => true,
        }
    });
    if forced {
        tracing::warn!("second signal: exiting without waiting for in-flight requests");
        std::process::exit(1);
    }
    tracing::info!("memroute stopped");
    Ok(())
}

/// SIGHUP: re-reads the config file and hands it to the proxy. A config that does not
/// validate or cannot be routed is rejected with every reason logged; the running one stays.
fn reload(handle: &memroute_proxy::ProxyHandle, path: &std::path::Path) {
    tracing::info!(config = %path.display(), "SIGHUP: reloading the config");
    let config = match memroute_config::load(path) {
        Ok(config) => config,
        Err(errors) => {
            for error in &errors.0 {
                tracing::error!(config = %path.display(), "config error: {error}");
            }
            tracing::error!(
                config = %path.display(),
                errors = errors.0.len(),
                "config reload rejected: invalid config; keeping the running config"
            );
            return;
        }
    };
    let pools = config.pools.len();
    match handle.reload(config) {
        Ok(()) => tracing::info!(config = %path.display(), pools, "config reloaded"),
        Err(error) => tracing::error!(
            config = %path.display(),
            "config reload rejected: {error}; keeping the running config"
        ),
    }
}

/// What `--check` prints: the pools and routes as memroute understood them.
fn describe(config: &Config) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let listen: Vec<String> = config
        .proxy
        .listen
        .iter()
        .map(|l| match l {
            memroute_config::ListenAddress::Tcp(a) => a.clone(),
            memroute_config::ListenAddress::Unix(p) => format!("unix:{}", p.display()),
        })
        .collect();
    let _ = writeln!(
        out,
        "proxy: listen {} workers {} backlog {} route {}",
        listen.join(", "),
        config.proxy.workers,
        config.proxy.backlog,
        config.proxy.route
    );
    for (name, pool) in &config.pools {
        if let Some(dns) = &pool.discovery {
            let _ = writeln!(
                out,
                "pool {name}: servers from DNS {}:{} every {:?}",
                dns.host, dns.port, dns.refresh
            );
        }
        let _ = writeln!(
            out,
            "pool {name}: {} servers, distribution {}, hash {}, timeout {:?}, connections {}, failure_limit {}, eject {}",
            pool.servers.len(),
            pool.distribution.as_str(),
            pool.hash.as_str(),
            pool.timeout,
            pool.connections,
            pool.failure_limit,
            pool.eject
        );
        for server in &pool.servers {
            let name = server
                .name
                .as_deref()
                .map(|n| format!(" name {n}"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  server {} weight {}{name}",
                server.address, server.weight
            );
        }
    }
    for (name, route) in &config.routes {
        match route {
            RouteConfig::Prefix { prefixes, default } => {
                let _ = writeln!(out, "route {name}: prefix, default {default}");
                for (prefix, target) in prefixes {
                    let _ = writeln!(out, "  {prefix:?} -> {target}");
                }
            }
            other => {
                let _ = writeln!(out, "route {name}: {}", describe_route(other));
            }
        }
    }
    out
}

/// One line describing a route that is not a prefix route (for `--check`).
fn describe_route(route: &RouteConfig) -> String {
    use memroute_config::{FailoverOn, ReadPolicy, ShadowSelect, WritePolicy};
    match route {
        RouteConfig::Prefix { default, .. } => format!("prefix, default {default}"),
        RouteConfig::Operation {
            operations,
            default,
        } => {
            let named: Vec<String> = operations
                .iter()
                .map(|(op, target)| format!("{} -> {target}", op.as_str()))
                .collect();
            format!("operation, {}, default {default}", named.join(", "))
        }
        RouteConfig::Shadow {
            primary,
            shadow,
            select,
            max_in_flight,
        } => {
            let selected = match select {
                ShadowSelect::Fraction(f) => format!("fraction {f}"),
                ShadowSelect::KeyRange(a, b) => format!("key_range [{a}, {b})"),
            };
            format!("shadow, primary {primary}, shadow {shadow} ({selected}, max_in_flight {max_in_flight})")
        }
        RouteConfig::Replicated {
            children,
            writes,
            reads,
        } => {
            let writes = match writes {
                WritePolicy::AllSync => "all-sync",
                WritePolicy::AllAsync => "all-async",
                WritePolicy::AllInitial => "all-initial",
                WritePolicy::AllMajority => "all-majority",
            };
            let reads = match reads {
                ReadPolicy::First => "first",
                ReadPolicy::Failover => "failover",
                ReadPolicy::Random => "random",
                ReadPolicy::Fastest => "fastest",
            };
            format!(
                "replicated over {}, writes {writes}, reads {reads}",
                children.join(", ")
            )
        }
        RouteConfig::Failover { children, on } => {
            let on = match on {
                FailoverOn::Error => "error",
                FailoverOn::ErrorOrMiss => "error-or-miss",
            };
            format!("failover over {} on {on}", children.join(", "))
        }
        RouteConfig::WarmUp { cold, warm, ttl } => {
            format!("warm-up, cold {cold}, warm {warm}, ttl {ttl}s")
        }
        RouteConfig::Random { children } => format!("random over {}", children.join(", ")),
        RouteConfig::Null => "null".to_string(),
        RouteConfig::Error { message } => format!("error, message {message:?}"),
    }
}

/// Prints to stdout, ignoring a closed pipe (`memroute --check ... | head`): `print!`
/// would panic on it.
fn write_stdout(text: &str) {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
}
