//! Which child of a replicated route a read uses, as `--check`, `memroute route` and the
//! admin `/route?key=` say it. Offline (`--check`, `memroute route`): from the config alone,
//! so for `nearest` the order after the proxy's zone is the one a proxy starts with (config
//! order). A running proxy's `/route` passes what it measured (servers down, mean round
//! trips), and the order follows `read_order`'s rule over it.
use memroute_config::{Config, ReadPolicy};
use memroute_routing::{NodeId, RouteTable};

use memroute_proxy::read_order::{rank, Standing};

/// What a running proxy measured of a child: every server beneath it is down, and its
/// servers' mean round trip in seconds (`None` before any).
pub(crate) type Measured<'a> = &'a dyn Fn(NodeId) -> (bool, Option<f64>);

/// For a read through a replicated route over `children` (by name) reading `reads`: each
/// child's place in the order a read tries them (child index, its role), that order first.
fn read_plan(
    config: &Config,
    children: &[&str],
    reads: ReadPolicy,
    measured: Option<&dyn Fn(usize) -> (bool, Option<f64>)>,
) -> Vec<(usize, String)> {
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
        ReadPolicy::Nearest => match measured {
            None => nearest_plan(config, children),
            Some(measured) => measured_nearest_plan(config, children, measured),
        },
    }
}

/// `nearest` in a running proxy: the order a worker computes from what was measured (a
/// worker smooths the latest seconds; this is the mean since start, so right after a
/// latency change the two may differ until the next reorder).
fn measured_nearest_plan(
    config: &Config,
    children: &[&str],
    measured: &dyn Fn(usize) -> (bool, Option<f64>),
) -> Vec<(usize, String)> {
    let proxy_zone = config.proxy.zone.as_ref().map(|zone| zone.name.as_str());
    let zone_of = |i: usize| config.zone_of(children[i]);
    let standings: Vec<Standing> = (0..children.len())
        .map(|i| {
            let (down, latency) = measured(i);
            let local = proxy_zone.is_some() && zone_of(i) == proxy_zone;
            (down, local, latency)
        })
        .collect();
    rank(&standings)
        .iter()
        .enumerate()
        .map(|(place, &i)| {
            let zone = match zone_of(i) {
                Some(zone) => format!("zone {zone}"),
                None => "no zone".to_string(),
            };
            let (down, local, latency) = standings[i];
            let local = if local { "the proxy's zone: " } else { "" };
            let when = match place {
                0 => "read here first".to_string(),
                n => format!("read on failure {n}"),
            };
            let seen = match (down, latency) {
                (true, _) => "every server down".to_string(),
                (false, Some(seconds)) => format!("mean round trip {:.3} ms", seconds * 1e3),
                (false, None) => "not measured yet".to_string(),
            };
            (
                i,
                format!("replica, reads nearest ({zone}): {local}{when}, {seen}"),
            )
        })
        .collect()
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

/// [`read_plan`] for route table children: (child node, role), in read order; `measured`
/// in a running proxy, `None` offline.
pub(crate) fn read_roles(
    config: &Config,
    routes: &RouteTable,
    children: &[NodeId],
    reads: ReadPolicy,
    measured: Option<Measured>,
) -> Vec<(NodeId, String)> {
    let names: Vec<&str> = children.iter().map(|&c| routes.node_name(c)).collect();
    let by_index = measured.map(|m| move |i: usize| m(children[i]));
    let by_index = by_index
        .as_ref()
        .map(|f| f as &dyn Fn(usize) -> (bool, Option<f64>));
    read_plan(config, &names, reads, by_index)
        .into_iter()
        .map(|(i, role)| (children[i], role))
        .collect()
}

/// One line per child of a replicated route over `children` reading `reads`, in the order
/// a read tries them (for `--check`).
pub fn describe_reads(config: &Config, children: &[String], reads: ReadPolicy) -> String {
    let names: Vec<&str> = children.iter().map(String::as_str).collect();
    read_plan(config, &names, reads, None)
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
    fn a_running_proxy_orders_nearest_by_what_it_measured() {
        let mut config = memroute_config::parse(ZONES).expect("config");
        config.resolve_zone(Some("b".to_string()));
        let children = ["a", "plain", "b"];
        // a: 2 ms, plain: 0.5 ms, b (local): every server down.
        let measured = |i: usize| [(false, Some(0.002)), (false, Some(0.0005)), (true, None)][i];
        let plan = read_plan(&config, &children, ReadPolicy::Nearest, Some(&measured));
        let lines: Vec<String> = plan
            .iter()
            .map(|(i, role)| format!("{}: {role}", children[*i]))
            .collect();
        assert_eq!(
            lines,
            [
                "plain: replica, reads nearest (no zone): read here first, mean round trip 0.500 ms",
                "a: replica, reads nearest (zone a): read on failure 1, mean round trip 2.000 ms",
                "b: replica, reads nearest (zone b): the proxy's zone: read on failure 2, every server down",
            ]
        );
        // Up again and not measured yet: the proxy's zone first, then by latency.
        let measured = |i: usize| [(false, Some(0.002)), (false, None), (false, None)][i];
        let plan = read_plan(&config, &children, ReadPolicy::Nearest, Some(&measured));
        let order: Vec<&str> = plan.iter().map(|(i, _)| children[*i]).collect();
        assert_eq!(order, ["b", "a", "plain"]);
        assert!(plan[0]
            .1
            .ends_with("the proxy's zone: read here first, not measured yet"));
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
