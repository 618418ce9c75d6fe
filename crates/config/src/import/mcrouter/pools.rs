//! Pools: mcrouter's `pools` / `regional_pools` read (servers, weights, TLS, timeouts), and the
//! memroute pool each use of one becomes (by hash, salt and weights).
use super::*;

impl Importer {
    pub(super) fn read_pools(&mut self, top: &Map<String, Value>) {
        // mcrouter also reads pools from `regional_pools`, by the same names.
        for key in ["pools", "regional_pools"] {
            self.read_pools_at(top, key);
        }
    }

    pub(super) fn read_pools_at(&mut self, top: &Map<String, Value>, key: &str) {
        let Some(pools) = top.get(key) else {
            return;
        };
        let Some(pools) = pools.as_object() else {
            self.error(
                ErrorKind::WrongType,
                key,
                "expected an object of pools by name",
            );
            return;
        };
        for (name, pool) in pools {
            let path = join(key, name);
            match self.read_pool(pool, &path) {
                Some(pool) => {
                    self.pools.insert(name.clone(), pool);
                }
                None => {
                    self.bad_pools.insert(name.clone());
                }
            }
        }
    }

    pub(super) fn read_pool(&mut self, pool: &Value, path: &str) -> Option<McPool> {
        let Some(pool) = pool.as_object() else {
            self.error(
                ErrorKind::WrongType,
                path,
                "expected a pool object with \"servers\"",
            );
            return None;
        };
        let before = self.errs.len();
        let mut notes = Vec::new();
        let servers_path = join(path, "servers");
        let (mut servers, security) = self.read_servers(pool, &servers_path, &mut notes);
        let weights = pool
            .get("weights")
            .map(|w| self.read_weights(w, &join(path, "weights")));
        let timeout_ms = self.read_server_timeout(pool, path);
        for (key, value) in pool {
            match key.as_str() {
                "servers"
                | "weights"
                | "server_timeout"
                | "keep_routing_prefix"
                | "port_override" => {}
                "protocol" if value.as_str() == Some("ascii") => {}
                _ => notes.push(format!(
                    "{}: {} is not carried over",
                    join(path, key),
                    compact(value)
                )),
            }
        }
        // mcrouter takes a server twice in a pool (two shares of the hash space); memroute
        // needs each server once.
        let mut seen = HashSet::new();
        let before_dedup = servers.len();
        servers.retain(|server| seen.insert(server.clone()));
        if servers.len() < before_dedup {
            notes.push(format!("{servers_path}: a server is listed more than once; memroute lists each once, so keys are placed over the distinct servers (not where mcrouter placed them)."));
        }
        let tls = !security.is_empty() && security.iter().all(|&ssl| ssl);
        if !tls && security.contains(&true) {
            notes.push(format!(
                "{servers_path}: some servers are \":ssl\" and some plain; memroute speaks TLS to a whole pool or to none of it: this pool is plain. Split it to keep TLS."
            ));
        }
        (self.errs.len() == before).then_some(McPool {
            servers,
            weights,
            timeout_ms,
            tls,
            keep_prefix: pool.get("keep_routing_prefix").and_then(Value::as_bool) == Some(true),
            notes,
        })
    }

    /// A pool's `servers` (with `port_override` applied) and, for each, whether it is
    /// `:ssl`; what is not carried over (a protocol, a handle given as a server, port 0)
    /// goes into `notes`.
    fn read_servers(
        &mut self,
        pool: &Map<String, Value>,
        servers_path: &str,
        notes: &mut Vec<String>,
    ) -> (Vec<String>, Vec<bool>) {
        let mut servers = Vec::new();
        let mut security = Vec::new();
        match pool.get("servers") {
            Some(Value::Array(items)) if !items.is_empty() => {
                // `port_override`: every server's port (mcrouter lets them omit theirs).
                let port_override = pool.get("port_override").and_then(Value::as_u64);
                for (i, s) in items.iter().enumerate() {
                    let item_path = index(servers_path, i);
                    let with_port = |a: &str| match port_override {
                        Some(port) => {
                            let host = a.split_once(':').map_or(a, |(host, _)| host);
                            let rest = a.splitn(3, ':').nth(2).map(|r| format!(":{r}"));
                            format!("{host}:{port}{}", rest.unwrap_or_default())
                        }
                        None => a.to_string(),
                    };
                    match s.as_str().map(with_port).as_deref().map(split_server) {
                        Some(Ok((address, extra))) => {
                            match extra.as_deref() {
                                Some("ascii:ssl" | "ssl") => security.push(true),
                                Some(extra) => {
                                    notes.push(format!(
                                        "{item_path}: \"{extra}\" after the address (protocol/security) is not carried over; memroute speaks the ASCII protocol to servers"
                                    ));
                                    security.push(false);
                                }
                                None => security.push(false),
                            }
                            servers.push(address);
                        }
                        // Port 0: mcrouter reads it (and never reaches the server).
                        Some(Err(_)) if s.as_str().is_some_and(|a| a.ends_with(":0")) => {
                            notes.push(format!("{item_path}: {} has port 0, which no server listens on; left out.", compact(s)));
                        }
                        Some(Err(message)) => self.error(ErrorKind::Invalid, &item_path, message),
                        // mcrouter takes a route handle as a "server" (its requests go
                        // there); memroute's pools hold servers only.
                        None => notes.push(format!(
                            "{item_path}: {} is not a server; memroute's pools hold servers only, so it is left out (and the pool's keys are spread over the others).",
                            compact(s)
                        )),
                    }
                }
            }
            // mcrouter takes a pool without servers (its requests fail); so does the
            // importer: routes to it become error routes (`pool_target`).
            Some(Value::Array(_)) => {}
            Some(_) => self.error(
                ErrorKind::WrongType,
                servers_path,
                "expected an array of \"host:port\" strings",
            ),
            None => self.error(ErrorKind::Missing, servers_path, "required"),
        }
        (servers, security)
    }

    /// A pool's `server_timeout` in milliseconds (above 0).
    fn read_server_timeout(&mut self, pool: &Map<String, Value>, path: &str) -> Option<u64> {
        match pool.get("server_timeout") {
            None => None,
            Some(v) => match v.as_u64().filter(|&ms| ms > 0) {
                Some(ms) => Some(ms),
                None => {
                    self.error(
                        ErrorKind::OutOfRange,
                        &join(path, "server_timeout"),
                        "expected a positive number of milliseconds",
                    );
                    None
                }
            },
        }
    }

    /// WeightedCh3 weights: numbers in (0, 1].
    pub(super) fn read_weights(&mut self, v: &Value, path: &str) -> Vec<f64> {
        let Some(items) = v.as_array() else {
            self.error(
                ErrorKind::WrongType,
                path,
                "expected an array of weights between 0 and 1",
            );
            return Vec::new();
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, w) in items.iter().enumerate() {
            let item_path = index(path, i);
            match w.as_f64() {
                Some(x) if x > 0.0 && x <= 1.0 => out.push(x),
                // mcrouter takes 0: the server gets only the keys all 32 tries miss.
                // memroute's weights are above 0: the least weight is the nearest.
                Some(0.0) => {
                    self.notes.push(format!("{item_path}: weight 0 (mcrouter gives such a server only the keys all 32 WeightedCh3 tries miss) is written as 0.000001, memroute's nearest: about as few keys."));
                    out.push(0.000001);
                }
                Some(x) if x < 0.0 => {
                    self.error(ErrorKind::OutOfRange,
                        &item_path,
                        format!("weight {x} must be > 0 (a server that should get no keys belongs out of the pool; with weight 0 WeightedCh3 still gives it the keys all 32 tries miss)"),
                    );
                }
                // WeightedCh3 compares the weight with a number in [0, 1): above 1 is 1.
                Some(x) => {
                    self.notes.push(format!("{item_path}: weight {x} is above 1, which WeightedCh3 treats as 1: written as 1."));
                    out.push(1.0);
                }
                None => self.error(
                    ErrorKind::WrongType,
                    &item_path,
                    format!("expected a number, found {}", compact(w)),
                ),
            }
        }
        out
    }

    /// The pool mcrouter's config named `name`, or an error at `path` (once: a pool that
    /// failed to read was reported where it was defined).
    fn named_pool(&mut self, name: &str, path: &str) -> Option<McPool> {
        let Some(pool) = self.pools.get(name).cloned() else {
            if !self.bad_pools.contains(name) {
                self.error(
                    ErrorKind::UnknownTarget,
                    path,
                    format!("unknown pool \"{name}\""),
                );
            }
            return None;
        };
        Some(pool)
    }

    /// The memroute pool for mcrouter pool `name` placed by `hash`, created on first use.
    /// mcrouter's pools and memroute's pools are not one-to-one: the same servers hashed
    /// two ways are two memroute pools.
    pub(super) fn pool_target(
        &mut self,
        name: &str,
        hash: Option<(Hash, String)>,
        path: &str,
    ) -> Option<String> {
        let pool = self.named_pool(name, path)?;
        if pool.servers.is_empty() {
            return Some(self.empty_pool(name));
        }
        let (hash, salt) = match hash {
            Some(spec) => spec,
            None => match &pool.weights {
                Some(w) => (Hash::WeightedCh3(w.clone()), String::new()),
                None => (Hash::Ch3, String::new()),
            },
        };
        let hash = match hash {
            Hash::WeightedCh3(weights) if weights.is_empty() => {
                let weights = pool.weights.clone().unwrap_or_default();
                Hash::WeightedCh3(self.fit_weights(weights, pool.servers.len(), name))
            }
            Hash::WeightedCh3(weights) => {
                Hash::WeightedCh3(self.fit_weights(weights, pool.servers.len(), name))
            }
            other => other,
        };
        let key = (name.to_string(), hash.clone(), salt.clone());
        if let Some((_, out)) = self.pool_variants.iter().find(|(k, _)| *k == key) {
            return Some(out.clone());
        }
        let wanted = if self.pool_variants.iter().any(|((n, _, _), _)| n == name) {
            format!("{name}_{}", hash.distribution())
        } else {
            name.to_string()
        };
        let out = self.fresh_name(&wanted, true);
        self.pool_variants.push((key, out.clone()));
        self.out_pools.insert(
            out.clone(),
            OutPool {
                servers: pool.servers.clone(),
                hash,
                salt,
                timeout_ms: pool.timeout_ms,
                tls: pool.tls,
                keep_prefix: pool.keep_prefix,
                notes: pool.notes.clone(),
            },
        );
        Some(out)
    }

    /// A config whose routes reach no server (a NullRoute alone) still needs a pool in
    /// memroute: one no route uses, with a note.
    pub(super) fn placeholder_pool(&mut self) {
        if !self.out_pools.is_empty() {
            return;
        }
        let name = self.fresh_name("unused", true);
        let note = "memroute needs at least one pool and no route of this config reaches a server: this pool is a placeholder no route uses (memroute may still connect to and probe its server).".to_string();
        self.out_pools.insert(
            name,
            OutPool {
                servers: vec!["127.0.0.1:11211".to_string()],
                hash: Hash::Ch3,
                salt: String::new(),
                timeout_ms: None,
                tls: false,
                keep_prefix: false,
                notes: vec![note],
            },
        );
    }

    /// What a route to mcrouter pool `name`, which has no servers, becomes: an error route
    /// (one per pool), as mcrouter fails such a pool's requests.
    pub(super) fn empty_pool(&mut self, name: &str) -> String {
        let key = (format!("{name}\u{0}empty"), Hash::Ch3, String::new());
        if let Some((_, existing)) = self.pool_variants.iter().find(|(k, _)| *k == key) {
            return existing.clone();
        }
        self.notes.push(format!("pool \"{name}\" has no servers: mcrouter fails its requests; here its routes are an error route."));
        let message = format!("message = \"pool {name} has no servers\"");
        let route = self.simple_route(&format!("{name}_no_servers"), "error", vec![message]);
        self.pool_variants.push((key, route.clone()));
        route
    }

    /// mcrouter's rule for a weights list of the wrong length: extra weights are ignored,
    /// missing ones are 0.5. Written out explicitly, with a note.
    pub(super) fn fit_weights(
        &mut self,
        mut weights: Vec<f64>,
        servers: usize,
        pool: &str,
    ) -> Vec<f64> {
        if weights.len() != servers {
            self.notes.push(format!(
                "pools.{pool}: {} weights for {servers} servers; mcrouter {} (written out here).",
                weights.len(),
                if weights.len() > servers {
                    "ignores the extra ones"
                } else {
                    "gives the missing ones 0.5"
                }
            ));
            weights.resize(servers, 0.5);
        }
        weights
    }

    /// One single-server memroute pool per server of `name` (mcrouter's `Pool|NAME` as a
    /// list of children: one destination per server).
    pub(super) fn server_targets(&mut self, name: &str, path: &str) -> Option<Vec<String>> {
        let pool = self.named_pool(name, path)?;
        if pool.servers.is_empty() {
            return Some(vec![self.empty_pool(name)]);
        }
        let mut out = Vec::new();
        for (i, server) in pool.servers.iter().enumerate() {
            let key = (format!("{name}\u{0}{i}"), Hash::Ch3, String::new());
            if let Some((_, existing)) = self.pool_variants.iter().find(|(k, _)| *k == key) {
                out.push(existing.clone());
                continue;
            }
            let pool_name = self.fresh_name(&format!("{name}_{i}"), true);
            self.pool_variants.push((key, pool_name.clone()));
            self.out_pools.insert(
                pool_name.clone(),
                OutPool {
                    servers: vec![server.clone()],
                    hash: Hash::Ch3,
                    salt: String::new(),
                    timeout_ms: pool.timeout_ms,
                    tls: pool.tls,
                    keep_prefix: pool.keep_prefix,
                    notes: vec![format!("server {i} of mcrouter pool \"{name}\" ({path})")],
                },
            );
            out.push(pool_name);
        }
        Some(out)
    }
}

/// `host:port` and whatever mcrouter allows after it (`:protocol:security:...`).
pub(super) fn split_server(s: &str) -> Result<(String, Option<String>), String> {
    let (address, rest) = if let Some(after) = s.strip_prefix('[') {
        let Some(end) = after.find(']') else {
            return Err(format!("invalid address \"{s}\""));
        };
        let port_and_rest = &after[end + 1..];
        let port_and_rest = port_and_rest.strip_prefix(':').unwrap_or(port_and_rest);
        let (port, rest) = match port_and_rest.split_once(':') {
            Some((p, r)) => (p, Some(r)),
            None => (port_and_rest, None),
        };
        (format!("[{}]:{port}", &after[..end]), rest)
    } else {
        let mut parts = s.splitn(3, ':');
        let host = parts.next().unwrap_or_default();
        let port = parts.next().unwrap_or_default();
        (format!("{host}:{port}"), parts.next())
    };
    check_host_port(&address)?;
    let extra = rest.filter(|r| !matches!(*r, "ascii" | "ascii:plain" | "plain" | ""));
    Ok((address, extra.map(str::to_string)))
}
