//! mcrouter's routing prefixes (`/region/cluster/KEY`): which routes a key's prefix
//! names, as mcrouter's RootRoute and RouteHandleMap choose them. Sans-I/O.
//!
//! ```text
//!   key --prefix_len--> None: no prefix (the listener's root, as without prefixes)
//!                       Some(n): key[..n] is "/region/cluster/" (mcrouter's Keys::update)
//!   RoutingPrefixes::targets(prefix, default):
//!     "/*/*/"            every route, the listener's default route first
//!     "/region/*/"       every route of that region (the default first if it is one)
//!     "/region/cluster/" that route; none: "/region/fallback/"; none: no target
//!     any other "*"      every route match_pattern matches (the default first)
//! ```
//!
//! A route reached by several prefixes (mcrouter's aliases) is one target: the lists hold
//! each route node once.
use smallvec::SmallVec;

/// The wildcard that names every route (mcrouter's `kBroadcastPrefix`).
pub const BROADCAST: &[u8] = b"/*/*/";

/// The length of `key`'s routing prefix, as mcrouter's `Keys::update` finds it: a key
/// starting with `/` that has two more `/` has the prefix up to and including the third
/// (the names between are not checked); any other key has none.
#[inline]
pub fn prefix_len(key: &[u8]) -> Option<usize> {
    if key.first() != Some(&b'/') {
        return None;
    }
    let second = 1 + key[1..].iter().position(|&b| b == b'/')?;
    let third = second + 1 + key[second + 1..].iter().position(|&b| b == b'/')?;
    Some(third + 1)
}

/// Whether `prefix` has mcrouter's form for a route's alias: `/region/cluster/`, both
/// names non-empty, no further `/` and no `*`.
pub fn is_valid(prefix: &str) -> bool {
    let Some(inner) = prefix
        .strip_prefix('/')
        .and_then(|rest| rest.strip_suffix('/'))
    else {
        return false;
    };
    let mut parts = inner.split('/');
    let (Some(region), Some(cluster), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    !region.is_empty() && !cluster.is_empty() && !prefix.contains('*')
}

/// mcrouter's `match_pattern_route`: `*` matches any run of characters other than `/`.
pub fn matches_pattern(pattern: &[u8], route: &[u8]) -> bool {
    let (mut p, mut r) = (0, 0);
    while p < pattern.len() {
        if r == route.len() {
            return false;
        }
        if pattern[p] == b'*' {
            while p < pattern.len() && pattern[p] == b'*' {
                p += 1;
            }
            if p == pattern.len() {
                // A terminating star matches any rest without a slash.
                return !route[r..].contains(&b'/');
            }
            if pattern[p] == b'/' {
                // Star then slash: on to the route's next slash.
                match route[r..].iter().position(|&b| b == b'/') {
                    Some(at) => r += at,
                    None => return false,
                }
            } else {
                // Try the star over every run up to the next slash.
                while r < route.len() && route[r] != b'/' {
                    if matches_pattern(&pattern[p..], &route[r..]) {
                        return true;
                    }
                    r += 1;
                }
                return false;
            }
        } else {
            if pattern[p] != route[r] {
                return false;
            }
            p += 1;
            r += 1;
        }
    }
    r == route.len()
}

/// One route reached by a routing prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// The route's node in its `RouteTable` (a `NodeId`; written as its type so that this
    /// module, which the table and the mcrouter hashes use, uses neither).
    pub node: u32,
    /// Whether the prefix is cut from the key sent to the servers (every pool the route
    /// reaches strips it unless they all keep it: `keep_routing_prefix`).
    pub strip: bool,
}

/// The routes a routing prefix names, in the order mcrouter sends to them: the first
/// answers the client, the others are sent to in the background.
pub type Targets = SmallVec<[Target; 1]>;

/// A config's routing prefixes (mcrouter's route aliases): each exact prefix with the
/// route it names, sorted by prefix.
#[derive(Debug, Clone, Default)]
pub struct RoutingPrefixes {
    entries: Vec<(Box<[u8]>, Target)>,
}

impl RoutingPrefixes {
    /// From (prefix, target) pairs; the config checked each prefix's form and that each
    /// appears once.
    pub fn new(mut entries: Vec<(Vec<u8>, Target)>) -> RoutingPrefixes {
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        RoutingPrefixes {
            entries: entries
                .into_iter()
                .map(|(prefix, target)| (prefix.into_boxed_slice(), target))
                .collect(),
        }
    }

    /// Whether the config declared any: without, keys are never looked at for a prefix.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The route an exact prefix names.
    pub fn exact(&self, prefix: &[u8]) -> Option<Target> {
        self.entries
            .binary_search_by(|(p, _)| (**p).cmp(prefix))
            .ok()
            .map(|at| self.entries[at].1)
    }

    /// Each (prefix, target), sorted by prefix.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Target)> {
        self.entries.iter().map(|(p, t)| (&p[..], *t))
    }

    /// The routes `prefix` (a key's routing prefix, `prefix_len`) sends to, as mcrouter's
    /// RouteHandleMap finds them, with `default` (the listener's default routing prefix)
    /// first when it is among them. Empty: no route (mcrouter's "No rh found").
    pub fn targets(&self, prefix: &[u8], default: Option<&[u8]>) -> Targets {
        let mut targets = Targets::new();
        if !prefix.contains(&b'*') {
            let fallback;
            let found = match self.exact(prefix) {
                Some(target) => Some(target),
                None => {
                    // The cluster is not in the config: mcrouter tries `/region/fallback/`.
                    fallback = fallback_of(prefix);
                    fallback.as_deref().and_then(|f| self.exact(f))
                }
            };
            targets.extend(found);
            return targets;
        }
        let region_wildcard = prefix.ends_with(b"/*/") && memchr_star(prefix) == prefix.len() - 2;
        let selects = |route: &[u8]| {
            if prefix == BROADCAST {
                true
            } else if region_wildcard {
                // `/region/*/`: the routes of that region (compared by name, as mcrouter's
                // byRegion map is, not as a pattern).
                region_of(route) == Some(&prefix[1..prefix.len() - 3])
            } else {
                matches_pattern(prefix, route)
            }
        };
        let mut add = |target: Target| {
            if !targets.iter().any(|t| t.node == target.node) {
                targets.push(target);
            }
        };
        if let Some(default) = default.filter(|d| selects(d)) {
            if let Some(target) = self.exact(default) {
                add(target);
            }
        }
        for (route, target) in &self.entries {
            if Some(&route[..]) != default && selects(route) {
                add(*target);
            }
        }
        targets
    }
}

fn memchr_star(prefix: &[u8]) -> usize {
    prefix
        .iter()
        .position(|&b| b == b'*')
        .unwrap_or(prefix.len())
}

/// The region of `/region/cluster/`.
fn region_of(prefix: &[u8]) -> Option<&[u8]> {
    let rest = prefix.strip_prefix(b"/")?;
    let end = rest.iter().position(|&b| b == b'/')?;
    Some(&rest[..end])
}

/// `/region/fallback/` for `/region/cluster/` (mcrouter's `kFallbackCluster`).
fn fallback_of(prefix: &[u8]) -> Option<Vec<u8>> {
    let region = region_of(prefix)?;
    let mut fallback = Vec::with_capacity(region.len() + 11);
    fallback.push(b'/');
    fallback.extend_from_slice(region);
    fallback.extend_from_slice(b"/fallback/");
    Some(fallback)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_len_follows_mcrouter_key_parsing() {
        assert_eq!(prefix_len(b"/a/b/k"), Some(5));
        assert_eq!(prefix_len(b"/a/b/"), Some(5));
        assert_eq!(prefix_len(b"//b/k"), Some(4));
        assert_eq!(prefix_len(b"/*/*/k"), Some(5));
        assert_eq!(prefix_len(b"/a/b/c/k"), Some(5));
        assert_eq!(prefix_len(b"/a/bk"), None);
        assert_eq!(prefix_len(b"a/b/c/"), None);
        assert_eq!(prefix_len(b"/"), None);
        assert_eq!(prefix_len(b""), None);
    }

    #[test]
    fn valid_prefixes_have_two_names() {
        assert!(is_valid("/eqiad/mw/"));
        for bad in [
            "eqiad/mw/",
            "/eqiad/mw",
            "//mw/",
            "/eqiad//",
            "/a/b/c/",
            "/*/mw/",
            "/a/b*/",
        ] {
            assert!(!is_valid(bad), "{bad}");
        }
    }

    #[test]
    fn patterns_match_as_mcrouter_matches_them() {
        assert!(matches_pattern(b"/*/mw/", b"/eqiad/mw/"));
        assert!(!matches_pattern(b"/*/mw/", b"/eqiad/mw2/"));
        assert!(matches_pattern(b"/eq*/mw/", b"/eqiad/mw/"));
        assert!(matches_pattern(b"/*ad/m*/", b"/eqiad/mw/"));
        assert!(!matches_pattern(b"/*ad/m*/", b"/codfw/mw/"));
        assert!(matches_pattern(b"/eqiad/*/", b"/eqiad/mw/"));
        assert!(!matches_pattern(b"/eqiad/*", b"/eqiad/mw/"));
    }

    fn table() -> RoutingPrefixes {
        let t = |node| Target { node, strip: true };
        RoutingPrefixes::new(vec![
            (b"/eqiad/mw/".to_vec(), t(1)),
            (b"/codfw/mw/".to_vec(), t(2)),
            (b"/eqiad/sessions/".to_vec(), t(3)),
            (b"/eqiad/mw-alias/".to_vec(), t(1)),
            (b"/codfw/fallback/".to_vec(), t(4)),
        ])
    }

    fn nodes(targets: Targets) -> Vec<u32> {
        targets.iter().map(|t| t.node).collect()
    }

    #[test]
    fn exact_prefixes_and_the_region_fallback() {
        let table = table();
        assert_eq!(nodes(table.targets(b"/eqiad/mw/", None)), [1]);
        assert_eq!(nodes(table.targets(b"/codfw/nope/", None)), [4]);
        assert!(table.targets(b"/esams/mw/", None).is_empty());
    }

    #[test]
    fn wildcards_put_the_default_first_and_each_route_once() {
        let table = table();
        let default = Some(&b"/codfw/mw/"[..]);
        assert_eq!(nodes(table.targets(b"/*/*/", default)), [2, 4, 1, 3]);
        assert_eq!(nodes(table.targets(b"/*/mw/", default)), [2, 1]);
        assert_eq!(nodes(table.targets(b"/*/mw/", None)), [2, 1]);
        assert_eq!(nodes(table.targets(b"/eqiad/*/", default)), [1, 3]);
        assert_eq!(nodes(table.targets(b"/codfw/*/", default)), [2, 4]);
        assert!(table.targets(b"/esams/*/", default).is_empty());
        assert!(table.targets(b"/*/nope/", default).is_empty());
    }
}
