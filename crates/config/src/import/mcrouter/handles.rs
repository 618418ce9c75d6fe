//! Route handles: each mcrouter handle, inline or as a string, translated to a memroute route
//! (or its target), and the nearest equivalent with a NOTE for the handles memroute lacks.
use super::*;

pub(super) fn children_has(children: &[String], child: &str) -> bool {
    children.iter().any(|c| c == child)
}

/// A failover handle's `failover_errors` as memroute's line (none: every error). mcrouter
/// also takes separate lists for gets, updates and deletes (an object); memroute has one
/// list per route: their union, with a note.
pub(super) fn failover_errors(
    o: &Map<String, Value>,
    path: &str,
    notes: &mut Vec<String>,
) -> Option<String> {
    let at = join(path, "failover_errors");
    let names: Vec<String> = match o.get("failover_errors")? {
        Value::Array(items) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        Value::Object(by_kind) => {
            notes.push(format!("{at}: separate lists for gets, updates and deletes; memroute has one list per route: their union, for every request."));
            let mut all: Vec<String> = Vec::new();
            for list in by_kind.values().filter_map(Value::as_array) {
                for name in list.iter().filter_map(Value::as_str) {
                    if !all.iter().any(|n| n == name) {
                        all.push(name.to_string());
                    }
                }
            }
            all
        }
        other => {
            notes.push(format!(
                "{at}: {} is not a list of errors; not carried over.",
                compact(other)
            ));
            return None;
        }
    };
    let known: Vec<String> = names
        .into_iter()
        .filter(|name| {
            let ok = crate::ErrorClass::from_name(name).is_some();
            if !ok {
                notes.push(format!(
                    "{at}: \"{name}\" is not one of mcrouter's errors; left out."
                ));
            }
            ok
        })
        .collect();
    Some(format!("failover_errors = {}", list(&known)))
}

/// A `RoutingGroupRoute` as the `OperationSelectorRoute` it amounts to: each group
/// (`get_like`, `update_like`, `delete_like`, `arithmetic_like`) is its operations.
pub(super) fn routing_groups_as_operations(o: &Map<String, Value>) -> Map<String, Value> {
    const GROUPS: &[(&str, &[&str])] = &[
        ("get_like", &["get", "gets", "gat", "gats"]),
        (
            "update_like",
            &["set", "add", "replace", "append", "prepend", "cas", "touch"],
        ),
        ("delete_like", &["delete"]),
        ("arithmetic_like", &["incr", "decr"]),
    ];
    let mut policies = Map::new();
    if let Some(groups) = o.get("routing_group_policies").and_then(Value::as_object) {
        for (group, ops) in GROUPS {
            if let Some(route) = groups.get(*group) {
                for op in *ops {
                    policies.insert(op.to_string(), route.clone());
                }
            }
        }
    }
    let mut out = Map::new();
    out.insert("operation_policies".to_string(), Value::Object(policies));
    if let Some(default) = o.get("default_policy") {
        out.insert("default_policy".to_string(), default.clone());
    }
    out
}

/// What mcrouter's handle did, for the note on its nearest memroute equivalent.
pub(super) fn handle_note(kind: &str) -> &'static str {
    match kind {
        "AxonLogRoute" | "LoggingRoute" => "mcrouter logged the requests on the way; memroute's logs and metrics are in docs/operations.md.",
        "BigValueRoute" => "mcrouter split values above its threshold into chunks; memroute sends values whole (proxy.max_value_size bounds them).",
        "CarbonLookasideRoute" => "mcrouter answered some reads from a lookaside cache; memroute asks the route every time.",
        "DistributionRoute" | "SetDistributionTargetRoute" => "mcrouter also distributed writes to other regions; write to them with a replicated route.",
        "HashStopAllowListRoute" | "KeyParseRoute" => "mcrouter chose by parts of the key; use a prefix route for the same.",
        "HostIdRoute" | "OriginalClientHashRoute" | "LoadBalancerRoute" => "mcrouter picked one child per client (or by load); memroute tries them in order.",
        "KeySplitRoute" => "mcrouter spread a hot key's copies over several keys; memroute sends the key as it is.",
        "L1L2SizeSplitRoute" => "mcrouter kept large values in l2 behind a marker in l1; memroute keeps every value in l1.",
        "LatencyInjectionRoute" => "mcrouter added latency (a test aid); memroute adds none.",
        "MigrateRoute" => "mcrouter moved from \"from\" to \"to\" at start_time; memroute routes to \"to\" now (a resize window, docs/configuration.md, moves keys between pools).",
        "ModifyExptimeRoute" => "mcrouter changed the exptime on the way; memroute caps exptimes only on a failover route's failover children (failover_exptime).",
        "ModifyKeyRoute" => "mcrouter rewrote the key (routing prefix, key prefix); memroute sends it as the client did.",
        "RateLimitRoute" => "mcrouter rate-limited requests; memroute does not (proxy.max_client_pending bounds one client).",
        "SRRoute" => "mcrouter found servers through a service router, which memroute does not have; use DNS discovery (docs/configuration.md).",
        "StagingRoute" => "mcrouter also wrote to a staging route; a shadow route copies requests to another.",
        "McRefillRoute" => "mcrouter refilled misses from \"refill\"; memroute's warm-up route fills from another on a miss.",
        _ => "",
    }
}

/// A note for every key of `o` that is not in `known`.
pub(super) fn note_unknown_keys(
    o: &Map<String, Value>,
    known: &[&str],
    path: &str,
    notes: &mut Vec<String>,
) {
    for (key, value) in o {
        if !known.contains(&key.as_str()) {
            notes.push(format!(
                "{}: {} is not carried over.",
                join(path, key),
                compact(value)
            ));
        }
    }
}

impl Importer {
    /// Translates the route at `path`; returns the memroute target (pool or route name).
    /// `hint` names an anonymous route.
    pub(super) fn route(&mut self, v: &Value, path: &str, hint: &str) -> Option<String> {
        match v {
            Value::String(s) => self.route_string(s, path, hint),
            Value::Object(o) => {
                let Some(kind) = o.get("type").and_then(Value::as_str) else {
                    self.error(
                        ErrorKind::Missing,
                        &join(path, "type"),
                        "required (the route handle's name)",
                    );
                    return None;
                };
                match o.get("name").and_then(Value::as_str) {
                    // An inline named handle: translated once, under its name.
                    Some(name) => {
                        if let Some(done) = self.named_done.get(name) {
                            return Some(done.clone());
                        }
                        let target = self.route_object(kind, o, path, name)?;
                        self.named_done.insert(name.to_string(), target.clone());
                        Some(target)
                    }
                    None => self.route_object(kind, o, path, hint),
                }
            }
            Value::Array(_) => {
                self.error(
                    ErrorKind::WrongType,
                    path,
                    "expected one route here, found a list",
                );
                None
            }
            other => {
                self.error(
                    ErrorKind::WrongType,
                    path,
                    format!("expected a route, found {}", compact(other)),
                );
                None
            }
        }
    }

    pub(super) fn route_string(&mut self, s: &str, path: &str, hint: &str) -> Option<String> {
        if let Some(target) = self.named_done.get(s) {
            return Some(target.clone());
        }
        if let Some((handle, path_of_def)) = self.named.get(s).cloned() {
            if let Some(at) = self.resolving.iter().position(|n| n == s) {
                let chain = self.resolving[at..].join(" -> ");
                self.error(
                    ErrorKind::Circle,
                    path,
                    format!("named handle loop: {chain} -> {s}"),
                );
                return None;
            }
            self.resolving.push(s.to_string());
            let target = match handle.as_object() {
                Some(o) => match o.get("type").and_then(Value::as_str) {
                    Some(kind) => self.route_object(kind, o, &path_of_def, s),
                    None => {
                        self.error(ErrorKind::Missing, &join(&path_of_def, "type"), "required");
                        None
                    }
                },
                None => self.route(&handle, &path_of_def, s),
            };
            self.resolving.pop();
            if let Some(t) = &target {
                self.named_done.insert(s.to_string(), t.clone());
            }
            return target;
        }
        let (kind, arg) = match s.split_once('|') {
            Some((k, a)) => (k, Some(a)),
            None => (s, None),
        };
        match (kind, arg) {
            ("PoolRoute" | "Pool", Some(pool)) => self.pool_target(pool, None, path),
            ("HashRoute", Some(rest)) => match rest.strip_prefix("Pool|") {
                Some(pool) => self.pool_target(pool, None, path),
                None => {
                    self.error(
                        ErrorKind::Invalid,
                        path,
                        format!("cannot read \"{s}\" (expected HashRoute|Pool|NAME)"),
                    );
                    None
                }
            },
            ("NullRoute", None) => Some(self.simple_route(hint, "null", Vec::new())),
            ("ErrorRoute", message) => {
                let lines = message
                    .map(|m| vec![format!("message = {}", quote(&one_line(m)))])
                    .unwrap_or_default();
                Some(self.simple_route(hint, "error", lines))
            }
            // mcrouter's short form of a handle over its children: `AllSyncRoute|Pool|A`
            // is `{"type": "AllSyncRoute", "children": "Pool|A"}`.
            (_, Some(rest)) if HANDLES.contains(&kind) || OTHER_HANDLES.contains(&kind) => {
                let mut o = Map::new();
                o.insert("type".to_string(), Value::String(kind.to_string()));
                o.insert("children".to_string(), Value::String(rest.to_string()));
                self.route_object(kind, &o, path, hint)
            }
            // A handle with nothing to say (`DevNullRoute`), as an object.
            _ if OTHER_HANDLES.contains(&kind) => {
                let mut o = Map::new();
                o.insert("type".to_string(), Value::String(kind.to_string()));
                self.route_object(kind, &o, path, hint)
            }
            _ if HANDLES.contains(&kind) => {
                self.error(
                    ErrorKind::Invalid,
                    path,
                    format!("\"{s}\": this handle needs its settings (write it as an object)"),
                );
                None
            }
            _ => {
                self.error(
                    ErrorKind::UnknownTarget,
                    path,
                    format!("unknown route handle or named handle \"{s}\""),
                );
                None
            }
        }
    }

    pub(super) fn simple_route(
        &mut self,
        hint: &str,
        kind: &str,
        mut lines: Vec<String>,
    ) -> String {
        let name = self.fresh_name(hint, false);
        lines.insert(0, format!("type = \"{kind}\""));
        self.out_routes.insert(
            name.clone(),
            OutRoute {
                lines,
                notes: Vec::new(),
            },
        );
        name
    }

    /// Children of an All*/Failover/Random route: a list of routes, or `"Pool|NAME"` (one
    /// destination per server of the pool).
    pub(super) fn children(
        &mut self,
        o: &Map<String, Value>,
        path: &str,
        hint: &str,
    ) -> Option<Vec<String>> {
        self.children_at(o.get("children"), &join(path, "children"), hint)
    }

    /// A list of child handles at `children_path`: a list, a single child where a list is
    /// allowed, `"Pool|NAME"` or an inline `{"type": "Pool", ...}` (one child per server of
    /// the pool, in a list too).
    pub(super) fn children_at(
        &mut self,
        children: Option<&Value>,
        children_path: &str,
        hint: &str,
    ) -> Option<Vec<String>> {
        let children_path = children_path.to_string();
        match children {
            Some(Value::String(s)) if s.starts_with("Pool|") => {
                self.server_targets(&s["Pool|".len()..], &children_path)
            }
            Some(one @ (Value::String(_) | Value::Object(_))) => {
                self.children_at(Some(&Value::Array(vec![one.clone()])), &children_path, hint)
            }
            Some(Value::Array(items)) if !items.is_empty() => {
                let mut out = Vec::new();
                let mut ok = true;
                for (i, child) in items.iter().enumerate() {
                    let at = index(&children_path, i);
                    let pool = match child {
                        Value::String(s) => s.strip_prefix("Pool|").map(str::to_string),
                        Value::Object(p)
                            if p.get("type").and_then(Value::as_str) == Some("Pool") =>
                        {
                            self.inline_pool(p, &at)
                        }
                        _ => None,
                    };
                    let targets = match pool {
                        Some(pool) => self.server_targets(&pool, &at),
                        None => self
                            .route(child, &at, &format!("{hint}_{i}"))
                            .map(|t| vec![t]),
                    };
                    match targets {
                        Some(t) => out.extend(t),
                        None => ok = false,
                    }
                }
                // mcrouter takes a child twice (a failover that tries a pool again);
                // memroute asks each child once: the second is dropped.
                let mut seen = HashSet::new();
                let mut distinct = Vec::new();
                for t in out {
                    if seen.insert(t.clone()) {
                        distinct.push(t);
                    } else {
                        self.notes.push(format!("{children_path}: \"{t}\" is a child twice; memroute asks each child once, so the second is dropped."));
                    }
                }
                ok.then_some(distinct)
            }
            Some(Value::Array(_)) => {
                self.error(
                    ErrorKind::Missing,
                    &children_path,
                    "needs at least one child",
                );
                None
            }
            Some(other) => {
                self.error(
                    ErrorKind::WrongType,
                    &children_path,
                    format!(
                        "expected a list of routes or \"Pool|NAME\", found {}",
                        compact(other)
                    ),
                );
                None
            }
            None => {
                self.error(ErrorKind::Missing, &children_path, "required");
                None
            }
        }
    }

    /// An inline pool (`{"type": "Pool", "name": ..., "servers": [...]}`) read and kept
    /// under its name; the name, or `None` (reported) when it cannot be read.
    pub(super) fn inline_pool(&mut self, p: &Map<String, Value>, path: &str) -> Option<String> {
        let Some(name) = p.get("name").and_then(Value::as_str) else {
            self.error(ErrorKind::Missing, path, "an inline pool needs a \"name\"");
            return None;
        };
        let mut body = p.clone();
        body.remove("type");
        body.remove("name");
        let read = self.read_pool(&Value::Object(body), path)?;
        self.pools.insert(name.to_string(), read);
        Some(name.to_string())
    }

    /// A route handle written as an object, by its `type`.
    pub(super) fn route_object(
        &mut self,
        kind: &str,
        o: &Map<String, Value>,
        path: &str,
        hint: &str,
    ) -> Option<String> {
        let mut notes = Vec::new();
        let (built, known): (Built, &[&str]) = match kind {
            // These may wrap their target in shadow routes and note their own keys.
            "PoolRoute" => return self.pool_route(o, path, hint),
            "HashRoute" => return self.hash_route(o, path, hint),
            "ShadowRoute" => return self.shadow_route(o, path, hint),
            "PrefixSelectorRoute" => (
                self.prefix_selector(o, path, hint, &mut notes)?,
                &["type", "name", "policies", "wildcard"],
            ),
            "OperationSelectorRoute" => (
                self.operation_selector(o, path, hint, &mut notes)?,
                &["type", "name", "operation_policies", "default_policy"],
            ),
            "AllSyncRoute" | "AllAsyncRoute" | "AllInitialRoute" | "AllMajorityRoute"
            | "AllFastestRoute" => (
                self.all_route(kind, o, path, hint, &mut notes)?,
                &["type", "name", "children"],
            ),
            "FailoverWithExptimeRoute" => (
                self.failover_with_exptime(o, path, hint, &mut notes)?,
                &[
                    "type",
                    "name",
                    "normal",
                    "failover",
                    "failover_exptime",
                    "failover_errors",
                ],
            ),
            "FailoverRoute" | "MissFailoverRoute" | "LatestRoute" | "RandomRoute" => (
                self.list_route(kind, o, path, hint, &mut notes)?,
                &["type", "name", "children", "failover_errors"],
            ),
            "WarmUpRoute" => (
                self.warm_up_route(o, path, hint)?,
                &["type", "name", "cold", "warm", "exptime"],
            ),
            "NullRoute" => (
                Built::Route(vec!["type = \"null\"".to_string()]),
                &["type", "name"],
            ),
            "ErrorRoute" => {
                let mut lines = vec!["type = \"error\"".to_string()];
                if let Some(m) = o.get("response").and_then(Value::as_str) {
                    lines.push(format!("message = {}", quote(&one_line(m))));
                }
                (Built::Route(lines), &["type", "name", "response"])
            }
            // mcrouter's older name for OperationSelectorRoute.
            "PrefixPolicyRoute" => (
                self.operation_selector(o, path, hint, &mut notes)?,
                &["type", "name", "operation_policies", "default_policy"],
            ),
            "RoutingGroupRoute" => {
                let as_operations = routing_groups_as_operations(o);
                (
                    self.operation_selector(&as_operations, path, hint, &mut notes)?,
                    &["type", "name", "routing_group_policies", "default_policy"],
                )
            }
            "L1L2CacheRoute" => (
                self.l1_l2_cache(o, path, hint, &mut notes)?,
                &["type", "name", "l1", "l2", "upgradingL1Exptime"],
            ),
            other if OTHER_HANDLES.contains(&other) => {
                let built = self.nearest(other, o, path, hint, &mut notes)?;
                self.notes.extend(notes);
                return Some(built);
            }
            other => {
                let message = format!("unknown route handle \"{other}\"");
                self.error(ErrorKind::Invalid, &join(path, "type"), message);
                return None;
            }
        };
        note_unknown_keys(o, known, path, &mut notes);
        match built {
            Built::Target(target) => {
                // Nothing of its own to write (one child, no prefixes): its notes go to the
                // top of the file.
                self.notes.extend(notes);
                Some(target)
            }
            Built::Route(lines) => {
                let name = self.fresh_name(hint, false);
                self.out_routes
                    .insert(name.clone(), OutRoute { lines, notes });
                Some(name)
            }
        }
    }

    /// `L1L2CacheRoute`: reads from `l1`, on a miss from `l2`, filling `l1`: memroute's
    /// warm-up route (l1 cold, l2 warm). mcrouter also wrote to both; memroute writes to l1.
    pub(super) fn l1_l2_cache(
        &mut self,
        o: &Map<String, Value>,
        path: &str,
        hint: &str,
        notes: &mut Vec<String>,
    ) -> Option<Built> {
        let side = |me: &mut Self, key: &str| match o.get(key) {
            Some(r) => me.route(r, &join(path, key), &format!("{hint}_{key}")),
            None => {
                me.error(ErrorKind::Missing, &join(path, key), "required");
                None
            }
        };
        let l1 = side(self, "l1")?;
        let l2 = side(self, "l2")?;
        notes.push(format!("{path}: L1L2CacheRoute: memroute's warm-up route is the nearest (reads l1, then l2 on a miss, filling l1); mcrouter's writes to l2 and its upgradingL1Exptime are not carried over: writes go to l1."));
        if l1 == l2 {
            return Some(Built::Target(l1));
        }
        let ttl = o
            .get("upgradingL1Exptime")
            .and_then(Value::as_u64)
            .filter(|&t| t <= memroute_protocol::MAX_RELATIVE_EXPTIME)
            .unwrap_or(0);
        Some(Built::Route(vec![
            "type = \"warm-up\"".to_string(),
            format!("cold = {}", quote(&l1)),
            format!("warm = {}", quote(&l2)),
            format!("ttl = {ttl}"),
        ]))
    }

    /// A handle memroute has no equivalent of: its nearest, with a note. A handle that
    /// wraps one route (a `target`, `child`, `to`, ...) becomes that route (mcrouter's
    /// handle did something on the way that memroute does not); one over a list of children
    /// a failover route over them; one with no route to go on to an error route, so
    /// that nothing is answered as if it worked.
    pub(super) fn nearest(
        &mut self,
        kind: &str,
        o: &Map<String, Value>,
        path: &str,
        hint: &str,
        notes: &mut Vec<String>,
    ) -> Option<String> {
        const ONE: &[&str] = &[
            "target",
            "child",
            "destination",
            "default",
            "default_policy",
            "normal",
            "primary",
            "to",
            "warm",
            "l1",
            "from",
        ];
        let what = handle_note(kind);
        if matches!(kind, "DevNullRoute" | "BlackholeRoute") {
            notes.push(format!("{path}: {kind} has no memroute equivalent; the nearest is a null route (every request answered as a miss / not stored, nothing sent). {what}"));
            return Some(self.simple_route(hint, "null", Vec::new()));
        }
        if let Some(key) = ONE.iter().find(|k| o.contains_key(**k)) {
            notes.push(format!("{path}: {kind} has no memroute equivalent; its requests go to its \"{key}\" as they are. {what}"));
            return self.route(&o[*key], &join(path, key), &format!("{hint}_{key}"));
        }
        if o.contains_key("children") {
            let children = self.children(o, path, hint)?;
            notes.push(format!("{path}: {kind} has no memroute equivalent; the nearest is a failover route over its children, in order. {what}"));
            if let [only] = children.as_slice() {
                return Some(only.clone());
            }
            let lines = vec![
                "type = \"failover\"".to_string(),
                format!("children = {}", list(&children)),
            ];
            let name = self.fresh_name(hint, false);
            self.out_routes.insert(
                name.clone(),
                OutRoute {
                    lines,
                    notes: Vec::new(),
                },
            );
            return Some(name);
        }
        notes.push(format!("{path}: {kind} has no memroute equivalent and no route under it; it becomes an error route. {what}"));
        let message = format!("message = \"{kind} is not available in memroute\"");
        Some(self.simple_route(hint, "error", vec![message]))
    }

    /// `PoolRoute`: the pool, hashed as `hash` says (or by the pool's weights, or Ch3).
    pub(super) fn pool_route(
        &mut self,
        o: &Map<String, Value>,
        path: &str,
        hint: &str,
    ) -> Option<String> {
        let mut notes = Vec::new();
        let hash = match o.get("hash") {
            Some(h) => Some(self.hash_spec(h, &join(path, "hash"), &mut notes)?),
            None => None,
        };
        let pool_path = join(path, "pool");
        let pool = match o.get("pool") {
            Some(Value::String(p)) => self.pool_target(p, hash, &pool_path)?,
            Some(Value::Object(inline)) => {
                let Some(name) = inline.get("name").and_then(Value::as_str) else {
                    self.error(
                        ErrorKind::Missing,
                        &pool_path,
                        "an inline pool needs a \"name\"",
                    );
                    return None;
                };
                let read = self.read_pool(&Value::Object(inline.clone()), &pool_path)?;
                self.pools.insert(name.to_string(), read);
                self.pool_target(name, hash, &pool_path)?
            }
            _ => {
                self.error(ErrorKind::Missing, &pool_path, "required (a pool name)");
                return None;
            }
        };
        note_unknown_keys(
            o,
            &["type", "name", "pool", "hash", "shadows"],
            path,
            &mut notes,
        );
        self.notes.extend(notes);
        self.with_shadows(pool, o, path, hint)
    }

    /// `HashRoute` over `"Pool|NAME"`: the same as a PoolRoute of that pool. memroute hashes
    /// only over a pool's servers, so a HashRoute over other routes is an error.
    pub(super) fn hash_route(
        &mut self,
        o: &Map<String, Value>,
        path: &str,
        hint: &str,
    ) -> Option<String> {
        let mut notes = Vec::new();
        let mut spec = Map::new();
        for k in ["hash_func", "salt", "weights"] {
            if let Some(v) = o.get(k) {
                spec.insert(k.to_string(), v.clone());
            }
        }
        let hash = if spec.is_empty() {
            None
        } else {
            Some(self.hash_spec(&Value::Object(spec), path, &mut notes)?)
        };
        let children = o.get("children").and_then(Value::as_str);
        let Some(pool) = children.and_then(|s| s.strip_prefix("Pool|")) else {
            self.error(ErrorKind::Invalid,
                &join(path, "children"),
                "memroute hashes over a pool's servers only: expected \"Pool|NAME\" (a HashRoute over other routes has no memroute equivalent)",
            );
            return None;
        };
        let pool = self.pool_target(pool, hash, &join(path, "children"))?;
        let known = [
            "type",
            "name",
            "children",
            "hash_func",
            "salt",
            "weights",
            "shadows",
        ];
        note_unknown_keys(o, &known, path, &mut notes);
        self.notes.extend(notes);
        self.with_shadows(pool, o, path, hint)
    }

    /// `ShadowRoute`: its `children` (or `default`) answer; `shadows` get copies.
    pub(super) fn shadow_route(
        &mut self,
        o: &Map<String, Value>,
        path: &str,
        hint: &str,
    ) -> Option<String> {
        let key = if o.contains_key("default") {
            "default"
        } else {
            "children"
        };
        let Some(primary) = o.get(key) else {
            self.error(
                ErrorKind::Missing,
                &join(path, "children"),
                "required (the route that answers)",
            );
            return None;
        };
        let primary = self.route(primary, &join(path, key), &format!("{hint}_primary"))?;
        let mut notes = Vec::new();
        note_unknown_keys(
            o,
            &["type", "name", "children", "default", "shadows"],
            path,
            &mut notes,
        );
        self.notes.extend(notes);
        self.with_shadows(primary, o, path, hint)
    }

    /// `PrefixSelectorRoute` -> `type = "prefix"`.
    pub(super) fn prefix_selector(
        &mut self,
        o: &Map<String, Value>,
        path: &str,
        hint: &str,
        notes: &mut Vec<String>,
    ) -> Option<Built> {
        let mut prefixes = Vec::new();
        let policies_path = join(path, "policies");
        match o.get("policies") {
            Some(Value::Object(policies)) => {
                for (prefix, route) in policies {
                    let p = join(&policies_path, prefix);
                    if prefix.is_empty() {
                        self.error(ErrorKind::Invalid, &p, "an empty prefix; use \"wildcard\"");
                        continue;
                    }
                    if let Some(t) = self.route(route, &p, &format!("{hint}_{prefix}")) {
                        prefixes.push(format!("{} = {}", quote(prefix), quote(&t)));
                    }
                }
            }
            None => {}
            Some(_) => self.error(
                ErrorKind::WrongType,
                &policies_path,
                "expected an object of prefix -> route",
            ),
        }
        let default = self.default_or_error(o, "wildcard", path, hint, "key", notes)?;
        if prefixes.is_empty() {
            notes.push(format!(
                "{path}: no prefix policies; every key takes the wildcard."
            ));
            return Some(Built::Target(default));
        }
        Some(Built::Route(vec![
            "type = \"prefix\"".to_string(),
            format!("prefixes = {{ {} }}", prefixes.join(", ")),
            format!("default = {}", quote(&default)),
        ]))
    }

    /// `OperationSelectorRoute` -> `type = "operation"`.
    pub(super) fn operation_selector(
        &mut self,
        o: &Map<String, Value>,
        path: &str,
        hint: &str,
        notes: &mut Vec<String>,
    ) -> Option<Built> {
        let mut lines = vec!["type = \"operation\"".to_string()];
        let policies_path = join(path, "operation_policies");
        match o.get("operation_policies") {
            None => {}
            Some(Value::Object(policies)) => {
                for (op, route) in policies {
                    let p = join(&policies_path, op);
                    let Some((_, ours)) = OPERATIONS.iter().find(|(mc, _)| mc == op) else {
                        notes.push(format!(
                            "{p}: operation \"{op}\" has no memroute equivalent; it takes the default."
                        ));
                        continue;
                    };
                    if let Some(t) = self.route(route, &p, &format!("{hint}_{ours}")) {
                        lines.push(format!("{ours} = {}", quote(&t)));
                    }
                }
            }
            Some(_) => {
                self.error(
                    ErrorKind::WrongType,
                    &policies_path,
                    "expected an object of operation -> route",
                );
                return None;
            }
        }
        let default = self.default_or_error(o, "default_policy", path, hint, "operation", notes)?;
        if lines.len() == 1 {
            return Some(Built::Target(default));
        }
        lines.push(format!("default = {}", quote(&default)));
        Some(Built::Route(lines))
    }

    /// The route under `key` (a selector's default), or, when there is none, an error route
    /// (with a note): what the request would otherwise get is not known here.
    pub(super) fn default_or_error(
        &mut self,
        o: &Map<String, Value>,
        key: &str,
        path: &str,
        hint: &str,
        what: &str,
        notes: &mut Vec<String>,
    ) -> Option<String> {
        match o.get(key) {
            Some(route) => self.route(route, &join(path, key), &format!("{hint}_{key}")),
            None => {
                notes.push(format!(
                    "{path}: no \"{key}\"; a request whose {what} matches no policy gets an error."
                ));
                Some(self.simple_route(
                    &format!("{hint}_no_match"),
                    "error",
                    vec![format!("message = \"no route for this {what}\"")],
                ))
            }
        }
    }

    /// `AllSyncRoute` ... `AllFastestRoute` -> `type = "replicated"`.
    pub(super) fn all_route(
        &mut self,
        kind: &str,
        o: &Map<String, Value>,
        path: &str,
        hint: &str,
        notes: &mut Vec<String>,
    ) -> Option<Built> {
        let children = self.children(o, path, hint)?;
        let (writes, reads, difference) = match kind {
            "AllSyncRoute" => ("all-sync", "failover", "mcrouter also sent reads to every child and answered with the worst reply; memroute reads from the first child, then the next on an error"),
            "AllAsyncRoute" => ("all-async", "failover", "mcrouter answered reads at once as misses; memroute reads from the first child, then the next on an error"),
            "AllInitialRoute" => ("all-initial", "first", ""),
            "AllMajorityRoute" => ("all-majority", "failover", "mcrouter also sent reads to every child and answered with the majority's reply; memroute reads from the first child, then the next on an error"),
            _ => ("all-initial", "fastest", "mcrouter answered writes with the first reply that was not an error; memroute answers with the first child's reply"),
        };
        if !difference.is_empty() {
            notes.push(format!("{path}: {kind}: {difference}."));
        }
        Some(Built::Route(vec![
            "type = \"replicated\"".to_string(),
            format!("children = {}", list(&children)),
            format!("writes = \"{writes}\""),
            format!("reads = \"{reads}\""),
        ]))
    }

    /// Failover-like handles and `RandomRoute`: a list of children (one child is just that
    /// child).
    pub(super) fn list_route(
        &mut self,
        kind: &str,
        o: &Map<String, Value>,
        path: &str,
        hint: &str,
        notes: &mut Vec<String>,
    ) -> Option<Built> {
        let children = self.children(o, path, hint)?;
        if kind == "LatestRoute" {
            notes.push(format!("{path}: LatestRoute picked `failover_count` children at random per proxy and failed over among them; memroute fails over among all of them in order."));
        }
        if let [only] = children.as_slice() {
            return Some(Built::Target(only.clone()));
        }
        let errors = match kind {
            "RandomRoute" => None,
            _ => failover_errors(o, path, notes),
        };
        let kind_line = if kind == "RandomRoute" {
            "type = \"random\""
        } else {
            "type = \"failover\""
        };
        let mut lines = vec![
            kind_line.to_string(),
            format!("children = {}", list(&children)),
        ];
        if kind == "MissFailoverRoute" {
            lines.push("on = \"error-or-miss\"".to_string());
        }
        lines.extend(errors);
        Some(Built::Route(lines))
    }

    /// `FailoverWithExptimeRoute`: `normal`, then the `failover` children with their
    /// exptime capped at `failover_exptime` (mcrouter's default 60 s; 0 or below: no cap).
    pub(super) fn failover_with_exptime(
        &mut self,
        o: &Map<String, Value>,
        path: &str,
        hint: &str,
        notes: &mut Vec<String>,
    ) -> Option<Built> {
        let Some(normal) = o.get("normal") else {
            self.error(
                ErrorKind::Missing,
                &join(path, "normal"),
                "required (FailoverWithExptimeRoute: normal not found)",
            );
            return None;
        };
        let normal = self.route(normal, &join(path, "normal"), &format!("{hint}_normal"))?;
        let failover = match o.get("failover") {
            Some(f) => self.children_at(
                Some(f),
                &join(path, "failover"),
                &format!("{hint}_failover"),
            )?,
            None => Vec::new(),
        };
        let exptime = match o.get("failover_exptime") {
            None => 60,
            Some(v) => match v.as_i64() {
                Some(n) => n,
                None => {
                    self.error(
                        ErrorKind::WrongType,
                        &join(path, "failover_exptime"),
                        "FailoverWithExptimeRoute: failover_exptime is not an integer",
                    );
                    return None;
                }
            },
        };
        let mut children = vec![normal];
        for child in failover {
            if !children_has(&children, &child) {
                children.push(child);
            }
        }
        if children.len() == 1 {
            return Some(Built::Target(children.remove(0)));
        }
        let mut lines = vec![
            "type = \"failover\"".to_string(),
            format!("children = {}", list(&children)),
        ];
        lines.extend(failover_errors(o, path, notes));
        match exptime {
            n if n <= 0 => {}
            n if n as u64 > memroute_protocol::MAX_RELATIVE_EXPTIME => notes.push(format!(
                "{}: {n} s is more than 30 days, which memcached reads as a Unix time; memroute cannot cap at it, so failover writes keep the client's exptime.",
                join(path, "failover_exptime")
            )),
            n => lines.push(format!("failover_exptime = {n}")),
        }
        Some(Built::Route(lines))
    }

    /// `WarmUpRoute` -> `type = "warm-up"` (`exptime` is `ttl`).
    pub(super) fn warm_up_route(
        &mut self,
        o: &Map<String, Value>,
        path: &str,
        hint: &str,
    ) -> Option<Built> {
        let side = |me: &mut Self, key: &str| match o.get(key) {
            Some(r) => me.route(r, &join(path, key), &format!("{hint}_{key}")),
            None => {
                me.error(ErrorKind::Missing, &join(path, key), "required");
                None
            }
        };
        let (cold, warm) = (side(self, "cold"), side(self, "warm"));
        let (cold, warm) = (cold?, warm?);
        if cold == warm {
            self.error(
                ErrorKind::Conflict,
                path,
                "cold and warm are the same target",
            );
            return None;
        }
        let mut lines = vec![
            "type = \"warm-up\"".to_string(),
            format!("cold = {}", quote(&cold)),
            format!("warm = {}", quote(&warm)),
        ];
        if let Some(v) = o.get("exptime") {
            let Some(ttl) = v
                .as_u64()
                .filter(|&t| t <= memroute_protocol::MAX_RELATIVE_EXPTIME)
            else {
                self.error(
                    ErrorKind::OutOfRange,
                    &join(path, "exptime"),
                    "expected seconds, at most 30 days",
                );
                return None;
            };
            lines.push(format!("ttl = {ttl}"));
        }
        Some(Built::Route(lines))
    }

    /// mcrouter's `shadows` on PoolRoute, HashRoute and ShadowRoute: each becomes a
    /// memroute shadow route around the previous target, with the same key fraction range.
    pub(super) fn with_shadows(
        &mut self,
        mut target: String,
        o: &Map<String, Value>,
        path: &str,
        hint: &str,
    ) -> Option<String> {
        let Some(shadows) = o.get("shadows") else {
            return Some(target);
        };
        let shadows_path = join(path, "shadows");
        let Some(shadows) = shadows.as_array() else {
            self.error(
                ErrorKind::WrongType,
                &shadows_path,
                "expected an array of shadow settings",
            );
            return None;
        };
        for (i, shadow) in shadows.iter().enumerate() {
            let p = index(&shadows_path, i);
            let Some(s) = shadow.as_object() else {
                self.notes.push(format!(
                    "{p}: {} is not a shadow object with \"target\"; mcrouter skips it, and so does memroute.",
                    compact(shadow)
                ));
                continue;
            };
            let Some(t) = s.get("target") else {
                self.notes.push(format!(
                    "{p}: no \"target\"; mcrouter skips this shadow, and so does memroute."
                ));
                continue;
            };
            // mcrouter logs a shadow it cannot build and goes on without it.
            let errors_before = self.errs.len();
            let Some(shadow_target) =
                self.route(t, &join(&p, "target"), &format!("{hint}_shadow_{i}"))
            else {
                let why: Vec<String> = self
                    .errs
                    .drain(errors_before..)
                    .map(|e| e.to_string())
                    .collect();
                self.notes.push(format!(
                    "{p}: mcrouter skips this shadow ({}), and so does memroute.",
                    why.join("; ")
                ));
                continue;
            };
            let Some(range) = self.shadow_range(s, &p) else {
                continue;
            };
            let mut route_notes = vec![format!(
                "{p}: memroute picks the shadowed keys by xxh3 of the key, so the same fraction but not the same keys as mcrouter are shadowed."
            )];
            for (key, value) in s {
                if !matches!(key.as_str(), "target" | "key_fraction_range") {
                    route_notes.push(format!(
                        "{}: {} is not carried over.",
                        join(&p, key),
                        compact(value)
                    ));
                }
            }
            if shadow_target == target {
                self.error(
                    ErrorKind::Conflict,
                    &join(&p, "target"),
                    "shadows the route to itself",
                );
                return None;
            }
            let name = self.fresh_name(&format!("{hint}_shadowed_{i}"), false);
            self.out_routes.insert(
                name.clone(),
                OutRoute {
                    lines: vec![
                        "type = \"shadow\"".to_string(),
                        format!("primary = {}", quote(&target)),
                        format!("shadow = {}", quote(&shadow_target)),
                        format!("key_range = [{}, {}]", number(range[0]), number(range[1])),
                    ],
                    notes: route_notes,
                },
            );
            target = name;
        }
        Some(target)
    }

    /// A shadow's `key_fraction_range` (`[0, 1]` without one); `None`, with a note, for
    /// a range mcrouter would not take (it logs such a shadow and goes on without it).
    fn shadow_range(&mut self, shadow: &Map<String, Value>, p: &str) -> Option<[f64; 2]> {
        let Some(r) = shadow.get("key_fraction_range") else {
            return Some([0.0, 1.0]);
        };
        match r
            .as_array()
            .map(|a| a.iter().map(Value::as_f64).collect::<Vec<_>>())
            .as_deref()
        {
            Some([Some(a), Some(b)]) if 0.0 <= *a && a <= b && *b <= 1.0 => Some([*a, *b]),
            _ => {
                self.notes.push(format!(
                    "{}: {} is not [a, b] with 0 <= a <= b <= 1; mcrouter skips this shadow, and so does memroute.",
                    join(p, "key_fraction_range"),
                    compact(r)
                ));
                None
            }
        }
    }

    /// A hash spec: `"Ch3"`, `"WeightedCh3"`, `"Crc32"`, or an object with `hash_func`,
    /// `weights` and `salt`; with the salt (empty: none).
    pub(super) fn hash_spec(
        &mut self,
        v: &Value,
        path: &str,
        notes: &mut Vec<String>,
    ) -> Option<(Hash, String)> {
        let mut salt = String::new();
        let (func, weights, func_path) = match v {
            Value::String(s) => (s.as_str(), None, path.to_string()),
            Value::Object(o) => {
                match o.get("salt") {
                    None => {}
                    Some(Value::String(s)) => salt = s.clone(),
                    Some(other) => {
                        self.error(
                            ErrorKind::WrongType,
                            &join(path, "salt"),
                            format!("expected a string, found {}", compact(other)),
                        );
                        return None;
                    }
                }
                for (k, val) in o {
                    if !matches!(k.as_str(), "hash_func" | "weights" | "salt") {
                        notes.push(format!(
                            "{}: {} is not carried over.",
                            join(path, k),
                            compact(val)
                        ));
                    }
                }
                (
                    o.get("hash_func").and_then(Value::as_str).unwrap_or("Ch3"),
                    o.get("weights"),
                    join(path, "hash_func"),
                )
            }
            other => {
                self.error(
                    ErrorKind::WrongType,
                    path,
                    format!(
                        "expected a hash function name or object, found {}",
                        compact(other)
                    ),
                );
                return None;
            }
        };
        let hash = match func {
            "Ch3" => Some(Hash::Ch3),
            "Crc32" => Some(Hash::Crc32),
            "WeightedCh3" => match weights {
                Some(w) => {
                    let before = self.errs.len();
                    let w = self.read_weights(w, &join(path, "weights"));
                    (self.errs.len() == before).then_some(Hash::WeightedCh3(w))
                }
                // The pool's weights (a PoolRoute gives them to its hash), else mcrouter's
                // 0.5 for each server (`fit_weights`).
                None => Some(Hash::WeightedCh3(Vec::new())),
            },
            other => {
                notes.push(format!("{func_path}: hash function \"{other}\" has no memroute equivalent; the nearest is Ch3 (mcrouter's default): keys are spread over the same servers, but not placed where \"{other}\" placed them."));
                Some(Hash::Ch3)
            }
        };
        hash.map(|h| (h, salt))
    }
}
