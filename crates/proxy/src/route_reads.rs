//! Which child of a replicated route a read uses, as `--check`, `memroute route` and the
//! admin `/route?key=` say it. Offline: from the config alone, so for `nearest` the order
//! after the proxy's zone is the one a proxy starts with (config order), which measured
//! latency then changes (`read_order`).
use memroute_config::{Config, ReadPolicy};
use memroute_routing::{NodeId, RouteTable};

/// For a read through a replicated route over `children` (by name) reading `reads`: each
/// child's place in the order a read tries them (child index, its role), that order first.
fn read_plan(config: &Config, children: &[&str], reads: ReadPolicy) -> Vec<(usize, String)> {
    match reads {
        // Config order says it: the first child is read (`first`), read first (`failover`),
        // or one of them (`random`, `fastest`).
        ReadPolicy::First | ReadPolicy::Failover | ReadPolicy::Random | ReadPolicy::Fastest => {
            let count = children.len();
            let policy = reads.as_str();
            (0..count)
                .map(|i| (i, format!("replica, reads {policy} {}/{count}", i + 1)))
                .collect()
        }
        ReadPolicy::Nearest => nearest_plan(config, children),
    }
}

/// `nearest`: the children in the proxy's zone first, then the others (config order
/// until latency is measured).
fn nearest_plan(config: &Config, children: &[&str]) -> Vec<(usize, String)> {
    let proxy_zone = config.proxy.zone.as_ref().map(|zone| zone.name.as_str());
    let zone_of = |i: usize| config.zone_of(children[i]);
    let local = |i: usize| proxy_zone.is_some() && zone_of(i) == proxy_zone;
    let mut order: Vec<usize> = (0..children.len()).filter(|&i| local(i)).collect();
    order.extend((0..children.len()).filter(|&i| !local(i)));
    let unmeasured = "latency order unknown until measured";
    order
        .iter()
        .enumerate()
        .map(|(place, &i)| {
            let zone = match zone_of(i) {
                Some(zone) => format!("zone {zone}"),
                None => "no zone".to_string(),
            };
            let when = match (place, local(i), proxy_zone) {
                (0, true, _) => "the proxy's zone: read here first".to_string(),
                (_, true, _) => format!("the proxy's zone: read on failure {place}, {unmeasured}"),
                (0, false, None) => format!("the proxy has no zone: read here first, {unmeasured}"),
                (0, false, Some(_)) => {
                    format!("no child in the proxy's zone: read here first, {unmeasured}")
                }
                (_, false, _) => format!("read on failure {place}, {unmeasured}"),
            };
            (i, format!("replica, reads nearest ({zone}): {when}"))
        })
        .collect()
}

/// [`read_plan`] for route table children: (child node, role), in read order.
pub(crate) fn read_roles(
    config: &Config,
    routes: &RouteTable,
    children: &[NodeId],
    reads: ReadPolicy,
) -> Vec<(NodeId, String)> {
    let names: Vec<&str> = children.iter().map(|&c| routes.node_name(c)).collect();
    read_plan(config, &names, reads)
        .into_iter()
        .map(|(i, role)| (children[i], role))
        .collect()
}

/// One line per child of a replicated route over `children` reading `reads`, in the order
/// a read tries them (for `--check`).
pub fn describe_reads(config: &Config, children: &[String], reads: ReadPolicy) -> String {
    let names: Vec<&str> = children.iter().map(String::as_str).collect();
    read_plan(config, &names, reads)
        .into_iter()
        .map(|(i, role)| format!("  read: {} ({role})\n", children[i]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ZONES: &str = r#"
        [proxy]
        route = "r"
        [pools.a]
        servers = ["127.0.0.1:1"]
        zone = "a"
        [pools.b]
        servers = ["127.0.0.1:2"]
        zone = "b"
        [pools.plain]
        servers = ["127.0.0.1:3"]
        [routes.r]
        type = "replicated"
        children = ["a", "plain", "b"]
        reads = "nearest"
    "#;

    fn describe(zone: Option<&str>) -> String {
        let mut config = memroute_config::parse(ZONES).expect("config");
        config.resolve_zone(zone.map(str::to_string));
        let children = ["a", "plain", "b"].map(String::from);
        describe_reads(&config, &children, ReadPolicy::Nearest)
    }

    #[test]
    fn nearest_reads_the_local_child_first_then_the_others() {
        assert_eq!(
            describe(Some("b")),
            "  read: b (replica, reads nearest (zone b): the proxy's zone: read here first)\n\
             \x20 read: a (replica, reads nearest (zone a): read on failure 1, latency order unknown until measured)\n\
             \x20 read: plain (replica, reads nearest (no zone): read on failure 2, latency order unknown until measured)\n"
        );
    }

    #[test]
    fn nearest_without_a_proxy_zone_says_so() {
        let text = describe(None);
        assert!(
            text.starts_with("  read: a (replica, reads nearest (zone a): the proxy has no zone"),
            "{text}"
        );
    }
}
