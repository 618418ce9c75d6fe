//! memroute: a memcached routing proxy. The binary is thin: CLI, logging, signals, and
//! the config file watch (see `watch`).
//!
//! ```text
//!   memroute --config FILE            run in the foreground
//!   memroute --check --config FILE    validate, print what was understood, exit
//!   memroute import-twemproxy FILE    print the memroute TOML for a nutcracker.yml
//!   memroute import-mcrouter FILE     print the memroute TOML for an mcrouter JSON config
//!   memroute route --config FILE [--listen ADDRESS] KEY...
//!                                     print where each key goes (route path, server) for
//!                                     that listener's clients (default: the first listener)
//!   memroute watch [--config FILE | --admin ADDRESS] [--key-prefix P] [--route R] [--limit N]
//!                                     print sampled requests of a running memroute live
//!                                     (its admin port's GET /watch; see `live_watch`)
//! ```
// Denied rather than forbidden: the allocator's settings are one exported symbol.
#![deny(unsafe_code)]

#[cfg(feature = "jemalloc")]
mod allocator;
mod live_watch;
mod watch;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use memroute_config::{Config, RouteConfig};

#[derive(Debug, Parser)]
#[command(name = "memroute", version, about = "A memcached routing proxy")]
struct Cli {
    /// The TOML config file.
    #[arg(short, long)]
    config: Option<PathBuf>,
    /// Validate the config, print the pools and routes it defines, and exit.
    #[arg(long)]
    check: bool,
    /// Do not watch the config file's directory (reload on SIGHUP only).
    #[arg(long)]
    no_watch: bool,
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
    /// Print where each key goes under --config: the route path, the server and the
    /// target's role (primary, shadow copy, replica, failover, ...), one line per target.
    Route {
        /// The operation to route (get, set, delete, ... as in operation routes).
        #[arg(long, default_value = "get")]
        operation: String,
        /// The listener whose clients send the keys, as written in proxy.listen
        /// (default: the first listener).
        #[arg(long)]
        listen: Option<String>,
        /// The TOML config file (also accepted before `route`).
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// Keys to look up.
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// Print the memroute TOML equivalent of an mcrouter JSON config.
    ImportMcrouter {
        /// Path to the mcrouter config (JSON).
        file: PathBuf,
        /// mcrouter's --route-prefix: the default routing prefix (/REGION/CLUSTER/).
        #[arg(long)]
        route_prefix: Option<String>,
        /// mcrouter's --timeouts-until-tko: each pool's failure_limit.
        #[arg(long)]
        timeouts_until_tko: Option<u32>,
        /// mcrouter's --probe-timeout-initial (ms): each pool's probe_interval.
        #[arg(long)]
        probe_timeout_initial: Option<u64>,
        /// mcrouter's --max-client-outstanding-reqs: proxy.max_client_pending.
        #[arg(long)]
        max_client_outstanding_reqs: Option<u64>,
        /// mcrouter's --num-proxies: proxy.workers.
        #[arg(long)]
        num_proxies: Option<u32>,
        /// mcrouter's --config-params NAME:VALUE,...: %NAME% in the config.
        #[arg(long)]
        config_params: Option<String>,
        /// mcrouter's --pem-ca-path: tls.ca of pools whose servers are :ssl.
        #[arg(long)]
        pem_ca_path: Option<String>,
        /// mcrouter's --pem-cert-path: tls.cert of those pools.
        #[arg(long)]
        pem_cert_path: Option<String>,
        /// mcrouter's --pem-key-path: tls.key of those pools.
        #[arg(long)]
        pem_key_path: Option<String>,
    },
    /// Print requests of a running memroute as they are answered (sampled, at most --rate
    /// a second): time, client, command, key, route, server, result, latency. Reads the
    /// admin port's GET /watch; stops after --limit lines or Ctrl-C.
    Watch {
        /// The running memroute's config: its admin.listen and admin token are used.
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// The admin address to connect to (instead of the config's admin.listen).
        #[arg(long)]
        admin: Option<String>,
        /// The admin token (instead of the config's admin.token or admin.token_file).
        #[arg(long)]
        token: Option<String>,
        /// Only requests with a key that starts with this.
        #[arg(long)]
        key_prefix: Option<String>,
        /// Only requests routed to this route or pool (or taking it as their listener's root).
        #[arg(long)]
        route: Option<String>,
        /// Stop after this many lines.
        #[arg(long)]
        limit: Option<u64>,
        /// At most this many lines a second (the admin port's default: 100).
        #[arg(long)]
        rate: Option<u32>,
        /// Print the JSON lines as they come.
        #[arg(long)]
        json: bool,
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
    type Importer = fn(&str) -> Result<String, memroute_config::ConfigErrors>;
    let import = |file: PathBuf, import: Importer| {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        let toml =
            import(&text).map_err(|errors| anyhow::anyhow!("{}:\n{errors}", file.display()))?;
        write_stdout(&toml);
        Ok(())
    };
    let route_keys = match cli.command {
        Some(Command::ImportTwemproxy { file }) => {
            return import(file, memroute_config::import::twemproxy::import)
        }
        Some(Command::ImportMcrouter {
            file,
            route_prefix,
            timeouts_until_tko,
            probe_timeout_initial,
            max_client_outstanding_reqs,
            num_proxies,
            config_params,
            pem_ca_path,
            pem_cert_path,
            pem_key_path,
        }) => {
            let config_params = config_params
                .iter()
                .flat_map(|all| all.split(','))
                .filter(|pair| !pair.is_empty())
                .map(|pair| match pair.split_once(':') {
                    Some((name, value)) => Ok((name.to_string(), value.to_string())),
                    None => Err(anyhow::anyhow!(
                        "--config-params: \"{pair}\" is not NAME:VALUE"
                    )),
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let flags = memroute_config::import::mcrouter::Flags {
                route_prefix,
                timeouts_until_tko,
                probe_timeout_initial_ms: probe_timeout_initial,
                max_client_outstanding_reqs,
                num_proxies,
                config_params,
                pem_ca_path,
                pem_cert_path,
                pem_key_path,
            };
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let toml = memroute_config::import::mcrouter::import_file(&text, &file, &flags)
                .map_err(|errors| anyhow::anyhow!("{}:\n{errors}", file.display()))?;
            write_stdout(&toml);
            return Ok(());
        }
        Some(Command::Watch {
            config,
            admin,
            token,
            key_prefix,
            route,
            limit,
            rate,
            json,
        }) => {
            let (admin, token) = admin_of(config.or(cli.config), admin, token)?;
            return live_watch::run(&live_watch::WatchArgs {
                admin,
                token,
                key_prefix,
                route,
                limit,
                rate,
                json,
            });
        }
        Some(Command::Route {
            operation,
            listen,
            config,
            keys,
        }) => Some((operation, listen, keys, config)),
        None => None,
    };
    let route_config = route_keys.as_ref().and_then(|r| r.3.clone());
    let Some(path) = route_config.or(cli.config) else {
        anyhow::bail!("--config FILE is required (see --help)");
    };
    let bytes = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let text = std::str::from_utf8(&bytes)
        .with_context(|| format!("invalid config {}: not UTF-8", path.display()))?;
    let mut config = memroute_config::parse(text).map_err(|errors| {
        // The most common wrong file: an mcrouter (or twemproxy) config given as is.
        let hint = match text.trim_start().chars().next() {
            Some('{') => "\nthis looks like an mcrouter JSON config: convert it with `memroute import-mcrouter FILE > memroute.toml`",
            _ if text.contains("servers:") && text.contains("listen:") => "\nthis looks like a twemproxy YAML config: convert it with `memroute import-twemproxy FILE > memroute.toml`",
            _ => "",
        };
        anyhow::anyhow!("invalid config {}:\n{errors}{hint}", path.display())
    })?;
    config.resolve_paths(path.parent().unwrap_or(std::path::Path::new(".")));
    config.resolve_zone_from_environment();
    if let Some((operation, listen, keys, _)) = route_keys {
        return route(&config, &operation, listen.as_deref(), &keys);
    }
    if cli.check {
        write_stdout(&describe(&config));
        let (transport, mut errors) = memroute_control::check_transport(&config);
        write_stdout(&transport);
        let (logins, login_errors) = memroute_control::check_logins(&config);
        write_stdout(&logins);
        errors.extend(login_errors);
        if !errors.is_empty() {
            anyhow::bail!("invalid config {}:\n{}", path.display(), errors.join("\n"));
        }
        write_stdout(&format!("config {} is valid\n", path.display()));
        return Ok(());
    }
    serve(config, bytes, &path, !cli.no_watch)
}

/// The admin address and token `memroute watch` uses: as given, else from `config`'s
/// `[admin]` (`listen`; `token` or `token_file`).
fn admin_of(
    config: Option<PathBuf>,
    admin: Option<String>,
    token: Option<String>,
) -> anyhow::Result<(String, Option<String>)> {
    let table = match &config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let mut config = memroute_config::parse(&text).map_err(|errors| {
                anyhow::anyhow!("invalid config {}:\n{errors}", path.display())
            })?;
            config.resolve_paths(path.parent().unwrap_or(std::path::Path::new(".")));
            config.admin
        }
        None => None,
    };
    let address = match (admin, &table) {
        (Some(admin), _) => admin,
        (None, Some(table)) => live_watch::connect_address(&table.listen),
        (None, None) => anyhow::bail!(
            "--admin ADDRESS, or --config FILE with an [admin] table, is required (see --help)"
        ),
    };
    let token = match (token, table.and_then(|t| t.token)) {
        (Some(token), _) => Some(token),
        (None, Some(memroute_config::AdminToken::Inline(token))) => Some(token),
        (None, Some(memroute_config::AdminToken::File(path))) => Some(
            std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read admin.token_file {}", path.display()))?
                .trim_end_matches(['\r', '\n'])
                .to_string(),
        ),
        (None, None) => None,
    };
    Ok((address, token))
}

/// `memroute route`: where each key goes under `config` for the clients of `listen`.
fn route(
    config: &Config,
    operation: &str,
    listen: Option<&str>,
    keys: &[String],
) -> anyhow::Result<()> {
    let Some(operation) = memroute_control::operation_named(operation) else {
        anyhow::bail!("unknown --operation {operation:?} (get, set, delete, incr, ...)");
    };
    let listener = match listen {
        None => 0,
        Some(address) => memroute_control::listener_named(config, address).with_context(|| {
            format!(
                "no listener {address:?} in proxy.listen ({})",
                memroute_control::listener_list(config)
            )
        })?,
    };
    let mut out = String::new();
    // The pools the keys reached that keep a resize window (in the order first reached).
    let mut windowed: Vec<&str> = Vec::new();
    for key in keys {
        let targets = memroute_control::route_key(config, listener, operation, key.as_bytes())
            .context("cannot build the routes")?;
        out.push_str(&memroute_control::describe_routes(key, &targets));
        for pool in targets.iter().filter_map(|t| t.pool.as_deref()) {
            let Some((name, pool)) = config.pools.get_key_value(pool) else {
                continue;
            };
            if !pool.resize_window.is_zero() && !windowed.contains(&name.as_str()) {
                windowed.push(name);
            }
        }
    }
    write_stdout(&out);
    // Offline there is no running window: say once on stderr (stdout stays one line per
    // target, for scripts) that a running proxy may still read a key from its old owner.
    if !windowed.is_empty() {
        eprintln!(
            "pools {} keep a resize window after their servers change: during one, a running proxy's /route?key= also names a key's old owner",
            windowed.join(", ")
        );
    }
    Ok(())
}

/// What the main thread was woken for.
enum Event {
    Reload(memroute_control::ReloadTrigger),
    /// `POST /reload` on the admin endpoint: reload, then answer it.
    AdminReload(memroute_control::ReloadRequest),
    /// SIGINT: stop accepting now (someone at a terminal wants it gone).
    Stop,
    /// SIGTERM: drain first (an orchestrator is replacing this instance).
    Drain,
}

fn serve(config: Config, read: Vec<u8>, path: &std::path::Path, watch: bool) -> anyhow::Result<()> {
    let workers = config.proxy.workers;
    let pools = config.pools.len();
    // `zone=b (from MEMROUTE_ZONE)`: where nearest reads go first, and why.
    let zone = match &config.proxy.zone {
        Some(zone) => format!("{} (from {})", zone.name, zone.source.name()),
        None => "none".to_string(),
    };
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
    memroute_proxy::set_config_file(
        std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
    );
    let handle = memroute_control::start(config).context("cannot start")?;
    handle.loaded_from(read);
    let mut admin_reloads = handle.reload_requests();
    let (changed, mut changes) = tokio::sync::mpsc::unbounded_channel();
    // Started after the proxy (which needs no watch) and before `ready`, so an edit made
    // once a test or an orchestrator sees `ready` is never missed. A watch that cannot
    // start (no inotify instances left) leaves SIGHUP working: a warning, not an exit.
    let _watch = if watch {
        match watch::start(path, changed) {
            Ok(watch) => Some(watch),
            Err(error) => {
                tracing::warn!("{error:#}; reload with SIGHUP");
                None
            }
        }
    } else {
        None
    };
    let listen = handle.local_addresses.join(",");
    let admin = handle.admin_address.as_deref().unwrap_or("off");
    tracing::info!(listen = %listen, admin = %admin, workers, pools, zone = %zone, "memroute ready");
    loop {
        let event = runtime.block_on(async {
            tokio::select! {
                _ = interrupt.recv() => {
                    tracing::info!("SIGINT: shutting down");
                    Event::Stop
                }
                _ = terminate.recv() => {
                    tracing::info!("SIGTERM: shutting down");
                    Event::Drain
                }
                _ = hangup.recv() => Event::Reload(memroute_control::ReloadTrigger::Signal),
                Some(()) = changes.recv() => Event::Reload(memroute_control::ReloadTrigger::FileChanged),
                Some(request) = admin_reloads.recv() => Event::AdminReload(request),
            }
        });
        match event {
            Event::Stop => break,
            Event::Drain => {
                // Not ready at once, but keep accepting and serving for drain_delay: a
                // load balancer still sending clients here must not see refused connects.
                handle.start_draining();
                let delay = handle.drain_delay();
                let interrupted = runtime.block_on(async {
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => false,
                        _ = interrupt.recv() => true,
                        _ = terminate.recv() => true,
                    }
                });
                match interrupted {
                    true => tracing::warn!("second signal: ending the drain delay early"),
                    false => tracing::info!("drain delay over: no longer accepting; closing connections as they go idle"),
                }
                break;
            }
            Event::Reload(trigger) => {
                handle.reload_file(path, trigger);
            }
            Event::AdminReload(request) => {
                let outcome = handle.reload_file(path, memroute_control::ReloadTrigger::Admin);
                let _ = request.reply.send(match outcome {
                    memroute_control::ReloadOutcome::Applied { kept } if kept.is_empty() => {
                        Ok("applied".to_string())
                    }
                    memroute_control::ReloadOutcome::Applied { kept } => Ok(format!(
                        "applied, but these need a restart and keep their running values:\n{}",
                        kept.join("\n")
                    )),
                    memroute_control::ReloadOutcome::Unchanged => Ok(
                        "the file is unchanged since the running config was read from it"
                            .to_string(),
                    ),
                    memroute_control::ReloadOutcome::Rejected(reason) => Err(reason),
                });
            }
        }
    }
    // Load balancers see /ready fail from now on, while the listeners drain.
    handle.set_not_ready();
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

/// What `--check` prints: the pools and routes as memroute understood them.
fn describe(config: &Config) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let listen: Vec<String> = config.proxy.listen.iter().map(|l| l.to_string()).collect();
    let _ = writeln!(
        out,
        "proxy: listen {} workers {} io {} backlog {} route {}",
        listen.join(", "),
        config.proxy.workers,
        config.proxy.io.name(),
        config.proxy.backlog,
        config.proxy.route
    );
    for (address, root) in config.proxy.listener_roots() {
        match config.routing_prefixes.of_listener(address) {
            Some(prefix) => {
                let _ = writeln!(
                    out,
                    "listener {address}: route {root} (default routing prefix {prefix})"
                );
            }
            None => {
                let _ = writeln!(out, "listener {address}: route {root}");
            }
        }
    }
    let prefixes = &config.routing_prefixes;
    for (prefix, target) in &prefixes.prefixes {
        let key = match prefixes.keeps(target, &config.routes) {
            true => "kept in the key",
            false => "cut from the key",
        };
        let _ = writeln!(out, "routing prefix {prefix}: {target} (prefix {key})");
    }
    let _ = writeln!(
        out,
        "  (a reload may change a listener's route; adding or removing a listener, or TLS on one, needs a restart)"
    );
    match &config.proxy.zone {
        Some(zone) => {
            let _ = writeln!(out, "proxy: {zone}");
        }
        None => {
            let _ = writeln!(
                out,
                "proxy: no zone (neither proxy.zone nor {} is set)",
                memroute_config::ZONE_VARIABLE
            );
        }
    }
    if config.pools.values().any(|p| p.discovery.is_some()) {
        let nameservers = if config.discovery.nameservers.is_empty() {
            "from /etc/resolv.conf".to_string()
        } else {
            let listed: Vec<String> = config
                .discovery
                .nameservers
                .iter()
                .map(|a| a.to_string())
                .collect();
            listed.join(", ")
        };
        let hosts_file = config
            .discovery
            .hosts_file
            .as_ref()
            .map(|p| format!(", hosts file {}", p.display()))
            .unwrap_or_default();
        let _ = writeln!(out, "discovery: nameservers {nameservers}{hosts_file}");
    }
    for (name, pool) in &config.pools {
        if let Some(dns) = &pool.discovery {
            let source = match dns.kind {
                memroute_config::DnsKind::Address => format!("DNS {}:{}", dns.host, dns.port),
                memroute_config::DnsKind::Srv => format!("DNS SRV {}", dns.host),
            };
            let _ = writeln!(
                out,
                "pool {name}: servers from {source} every {:?} (sooner when the records' TTL is shorter)",
                dns.refresh
            );
        }
        let _ = writeln!(
            out,
            "pool {name}: {} servers, distribution {}, hash {}, timeout {:?}, connections {}, failure_limit {}, eject {}, resize_window {}",
            pool.servers.len(),
            pool.distribution.as_str(),
            pool.hash.as_str(),
            pool.timeout,
            pool.connections,
            pool.failure_limit,
            pool.eject,
            resize_window(pool)
        );
        if let Some(zone) = &pool.zone {
            let _ = writeln!(out, "  zone {zone}");
        }
        // mcrouter's placement settings (wch3, salted pools).
        if !pool.weights.is_empty() {
            let _ = writeln!(out, "  weights {:?}", pool.weights);
        }
        if !pool.salt.is_empty() {
            let _ = writeln!(out, "  salt {:?}", pool.salt);
        }
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
                if let RouteConfig::Replicated {
                    children, reads, ..
                } = other
                {
                    out.push_str(&memroute_control::describe_reads(config, children, *reads));
                }
            }
        }
    }
    out
}

/// A pool's `resize_window` as `--check` and `memroute route` print it.
fn resize_window(pool: &memroute_config::PoolConfig) -> String {
    match pool.resize_window.is_zero() {
        true => "off".to_string(),
        false => format!("{:?}", pool.resize_window),
    }
}

/// One line describing a route that is not a prefix route (for `--check`).
fn describe_route(route: &RouteConfig) -> String {
    use memroute_config::ShadowSelect;
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
            format!(
                "replicated over {}, writes {}, reads {}",
                children.join(", "),
                writes.as_str(),
                reads.as_str()
            )
        }
        RouteConfig::Failover {
            children,
            on,
            errors,
            exptime_cap,
        } => {
            format!(
                "failover over {} on {}{}",
                children.join(", "),
                on.as_str(),
                memroute_config::gutter_description(*errors, *exptime_cap)
            )
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
