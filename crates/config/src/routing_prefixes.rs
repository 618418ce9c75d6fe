//! mcrouter's routing prefixes in the config: `routing_prefixes = ["/region/cluster/"]` on
//! a pool or route, `keep_routing_prefix` on a pool, the default `routing_prefix` of the
//! proxy and of each listener (mcrouter's `--route-prefix`), and how they pick a
//! listener's root.
//!
//! ```text
//!   [pools.X] / [routes.X] routing_prefixes ---> RoutingPrefixConfig::prefixes (prefix -> X)
//!   [pools.X] keep_routing_prefix ------------> RoutingPrefixConfig::keep
//!   [proxy] routing_prefix, listen[i].routing_prefix --> the listener's root: the target
//!        of its prefix when it names no route (resolve_roots)
//! ```
use std::collections::BTreeMap;

use memroute_routing::routing_prefix::is_valid;
use toml::{Table, Value};

use crate::checked::{pools_reached, ProxyConfig, RouteConfig, RoutingPrefixConfig};
use crate::walk::{get_bool, get_str, join, wrong_type, Errors};
use crate::ErrorKind;

/// The keys this module reads: taken out of a pool's or route's table before the
/// section's own key check (every pool and route type may carry them).
pub(crate) const TARGET_KEY: &str = "routing_prefixes";
pub(crate) const KEEP_KEY: &str = "keep_routing_prefix";
pub(crate) const DEFAULT_KEY: &str = "routing_prefix";

/// Takes `routing_prefixes` (and, for a pool, `keep_routing_prefix`) out of the table of
/// pool or route `name` at `path`, recording them; returns the table without them for the
/// section's own checks.
pub(crate) fn take_target_keys(
    table: &Table,
    name: &str,
    path: &str,
    is_pool: bool,
    config: &mut RoutingPrefixConfig,
    errs: &mut Errors,
) -> Table {
    let mut rest = table.clone();
    if let Some(value) = rest.remove(TARGET_KEY) {
        let key_path = join(path, TARGET_KEY);
        match value {
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    let item_path = format!("{key_path}[{i}]");
                    let Value::String(prefix) = item else {
                        wrong_type(errs, &item_path, "a string", item);
                        continue;
                    };
                    check_prefix(prefix, &item_path, errs);
                    if let Some(other) = config.prefixes.get(prefix) {
                        errs.push(
                            ErrorKind::Conflict,
                            &item_path,
                            format!("\"{prefix}\" is already a routing prefix of \"{other}\"; a prefix names one pool or route"),
                        );
                        continue;
                    }
                    config.prefixes.insert(prefix.clone(), name.to_string());
                }
            }
            other => wrong_type(
                errs,
                &key_path,
                "an array of \"/region/cluster/\" strings",
                &other,
            ),
        }
    }
    if is_pool {
        if let Some(value) = rest.remove(KEEP_KEY) {
            let mut one = Table::new();
            one.insert(KEEP_KEY.to_string(), value);
            if get_bool(&one, KEEP_KEY, path, false, errs) {
                config.keep.insert(name.to_string());
            }
        }
    }
    rest
}

/// A `routing_prefix` key of the proxy or a listener entry at `path`, checked.
pub(crate) fn default_prefix(table: &Table, path: &str, errs: &mut Errors) -> Option<String> {
    let prefix = get_str(table, DEFAULT_KEY, path, errs)?;
    check_prefix(prefix, &join(path, DEFAULT_KEY), errs);
    Some(prefix.to_string())
}

fn check_prefix(prefix: &str, path: &str, errs: &mut Errors) {
    if !is_valid(prefix) {
        errs.push(
            ErrorKind::Invalid,
            path,
            format!("\"{prefix}\" is not a routing prefix: expected \"/region/cluster/\" (two non-empty names, no \"*\")"),
        );
    }
}

/// Once pools and routes are known: every default routing prefix names a declared
/// prefix; a listener without a `route` of its own takes its prefix's target as its
/// root, and the proxy's default root is the proxy's prefix's target; a `route` naming
/// another target than its listener's (or the proxy's) prefix is an error. Every pool
/// reached from one prefix agrees on `keep_routing_prefix`.
pub(crate) fn resolve_roots(
    config: &RoutingPrefixConfig,
    proxy: &mut ProxyConfig,
    routes: &BTreeMap<String, RouteConfig>,
    errs: &mut Errors,
) {
    let target_of = |prefix: &str, path: &str, errs: &mut Errors| {
        let target = config.prefixes.get(prefix);
        if target.is_none() {
            errs.push(
                ErrorKind::UnknownTarget,
                path,
                format!("no pool or route carries the routing prefix \"{prefix}\" (add it to one's routing_prefixes)"),
            );
        }
        target.cloned()
    };
    if let Some(prefix) = &config.default {
        let path = join("proxy", DEFAULT_KEY);
        if let Some(target) = target_of(prefix, &path, errs) {
            if !proxy.route.is_empty() && proxy.route != target {
                errs.push(
                    ErrorKind::Conflict,
                    &path,
                    format!("\"{prefix}\" is the prefix of \"{target}\" but proxy.route is \"{}\"; give one of them", proxy.route),
                );
            }
            proxy.route = target;
        }
    }
    for (i, address) in proxy.listen.iter().enumerate() {
        let Some(prefix) = config.listeners.get(address) else {
            continue;
        };
        let path = format!("proxy.listen[{i}].{DEFAULT_KEY}");
        let Some(target) = target_of(prefix, &path, errs) else {
            continue;
        };
        match proxy.listen_routes.get(address) {
            Some(route) if *route != target => errs.push(
                ErrorKind::Conflict,
                &path,
                format!("\"{prefix}\" is the prefix of \"{target}\" but this listener's route is \"{route}\"; give one of them"),
            ),
            _ => {
                proxy.listen_routes.insert(address.clone(), target);
            }
        }
    }
    check_keep_agrees(config, routes, errs);
}

/// The pools reached from each prefix's target all keep the prefix or all strip it: one
/// request is sent with one key.
fn check_keep_agrees(
    config: &RoutingPrefixConfig,
    routes: &BTreeMap<String, RouteConfig>,
    errs: &mut Errors,
) {
    for (prefix, target) in &config.prefixes {
        let pools = pools_reached(target, routes);
        let (keep, strip): (Vec<&String>, Vec<&String>) =
            pools.iter().partition(|pool| config.keep.contains(*pool));
        if let (Some(kept), Some(stripped)) = (keep.first(), strip.first()) {
            let section = if routes.contains_key(target) {
                "routes"
            } else {
                "pools"
            };
            errs.push(
                ErrorKind::Conflict,
                &join(&join(section, target), TARGET_KEY),
                format!("the pools reached from \"{prefix}\" disagree on keep_routing_prefix (\"{kept}\" keeps the prefix, \"{stripped}\" does not); set it the same on every pool the route reaches"),
            );
        }
    }
}
