//! The root: `named_handles`, and `route` or every entry of `routes` (each alias a routing
//! prefix on its target).
use super::*;

impl Importer {
    pub(super) fn read_named_handles(&mut self, top: &Map<String, Value>) {
        let Some(handles) = top.get("named_handles") else {
            return;
        };
        let items: Vec<(String, Value, String)> = match handles {
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, h)| {
                    let name = h.get("name").and_then(Value::as_str).unwrap_or_default();
                    (name.to_string(), h.clone(), index("named_handles", i))
                })
                .collect(),
            Value::Object(o) => o
                .iter()
                .map(|(n, h)| (n.clone(), h.clone(), join("named_handles", n)))
                .collect(),
            _ => {
                self.error(
                    ErrorKind::WrongType,
                    "named_handles",
                    "expected an array of named route handles",
                );
                return;
            }
        };
        for (name, handle, path) in items {
            if name.is_empty() {
                self.error(ErrorKind::Missing, &path, "a named handle needs a \"name\"");
            } else {
                self.named.insert(name, (handle, path));
            }
        }
    }

    pub(super) fn read_root(&mut self, top: &Map<String, Value>) -> Option<String> {
        match (top.get("route"), top.get("routes")) {
            (Some(route), None) => {
                let root = self.route(route, "route", "root")?;
                // The one route serves the default prefix too.
                if let Some(prefix) = self.flags.route_prefix.clone() {
                    self.add_prefixes(&root, vec![prefix]);
                }
                Some(root)
            }
            (None, Some(Value::Array(routes))) if !routes.is_empty() => self.read_routes(routes),
            // mcrouter's short form: `"routes": {"/a/b/": ROUTE, ...}`.
            (None, Some(Value::Object(by_alias))) if !by_alias.is_empty() => {
                let routes: Vec<Value> = by_alias
                    .iter()
                    .map(|(alias, route)| serde_json::json!({"aliases": [alias], "route": route}))
                    .collect();
                self.read_routes(&routes)
            }
            (None, Some(_)) => {
                self.error(
                    ErrorKind::WrongType,
                    "routes",
                    "expected a non-empty array of {\"aliases\", \"route\"}",
                );
                None
            }
            (Some(_), Some(_)) => {
                self.error(
                    ErrorKind::Conflict,
                    "routes",
                    "write either \"route\" or \"routes\", not both",
                );
                None
            }
            (None, None) => {
                self.error(ErrorKind::Missing, "route", "required (or \"routes\")");
                None
            }
        }
    }

    /// mcrouter's `routes`: each entry's route, chosen by the routing prefixes in its
    /// `aliases` (`routing_prefixes` on its memroute target). The root (`proxy.route`) is
    /// the route of `--route-prefix`, else the first entry's.
    pub(super) fn read_routes(&mut self, routes: &[Value]) -> Option<String> {
        let mut root = None;
        for (i, entry) in routes.iter().enumerate() {
            let path = index("routes", i);
            let aliases: Vec<String> = match entry.get("aliases") {
                Some(Value::Array(items)) => items
                    .iter()
                    .filter_map(|a| a.as_str().map(str::to_string))
                    .collect(),
                Some(Value::String(one)) => vec![one.clone()],
                _ => Vec::new(),
            };
            if aliases.is_empty() {
                self.notes.push(format!(
                    "{path}: no \"aliases\"; no routing prefix selects this route."
                ));
            }
            let hint = aliases
                .first()
                .map_or_else(|| format!("routes_{i}"), |a| a.replace('/', "_"));
            let Some(route) = entry.get("route") else {
                self.error(ErrorKind::Missing, &join(&path, "route"), "required");
                continue;
            };
            let Some(target) = self.route(route, &join(&path, "route"), &hint) else {
                continue;
            };
            let is_default = match &self.flags.route_prefix {
                Some(prefix) => aliases.contains(prefix),
                None => i == 0,
            };
            if is_default && root.is_none() {
                root = Some(target.clone());
            }
            self.add_prefixes(&target, aliases);
        }
        match (&self.flags.route_prefix, &root) {
            (None, _) => self.notes.push(
                "mcrouter serves a key without a routing prefix by its --route-prefix flag; none was given to the importer, so proxy.route is routes[0]'s route. Give --route-prefix /REGION/CLUSTER/ to choose.".to_string(),
            ),
            (Some(prefix), None) => self.error(
                ErrorKind::UnknownTarget,
                "routes",
                format!("--route-prefix {prefix}: no entry of routes has it among its aliases (mcrouter would not start)"),
            ),
            _ => {}
        }
        root
    }

    /// Routing prefixes that select memroute target `target`.
    pub(super) fn add_prefixes(&mut self, target: &str, prefixes: Vec<String>) {
        if prefixes.is_empty() {
            return;
        }
        match self.prefixed.iter_mut().find(|(t, _)| t == target) {
            Some((_, have)) => have.extend(prefixes),
            None => self.prefixed.push((target.to_string(), prefixes)),
        }
    }

    pub(super) fn note_top_level_keys(&mut self, top: &Map<String, Value>) {
        for (key, value) in top {
            if !matches!(
                key.as_str(),
                "pools" | "regional_pools" | "route" | "routes" | "named_handles"
            ) {
                self.notes
                    .push(format!("{key}: {} is not carried over.", compact(value)));
            }
        }
    }
}
