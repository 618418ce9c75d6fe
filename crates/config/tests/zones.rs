//! Zones: `zone` on pools, the proxy's own zone from `proxy.zone` or `MEMROUTE_ZONE`, and
//! replicated routes reading `nearest`.
use memroute_config::{
    parse, Config, ErrorKind, ProxyZone, ReadPolicy, RouteConfig, ZoneSource, ZONE_VARIABLE,
};

const TWO_ZONES: &str = r#"
[proxy]
route = "both"
[pools.in_a]
servers = ["10.0.0.1:11211"]
zone = "a"
[pools.in_b]
servers = ["10.0.0.2:11211"]
zone = "b"
[routes.both]
type = "replicated"
children = ["in_a", "in_b"]
reads = "nearest"
"#;

fn ok(text: &str) -> Config {
    parse(text).unwrap_or_else(|e| panic!("should parse:\n{e}"))
}

#[test]
fn pools_carry_a_zone_and_replicated_routes_read_nearest() {
    let config = ok(TWO_ZONES);
    assert_eq!(config.pools["in_a"].zone.as_deref(), Some("a"));
    assert_eq!(config.pools["in_b"].zone.as_deref(), Some("b"));
    let RouteConfig::Replicated { reads, .. } = &config.routes["both"] else {
        panic!("expected a replicated route");
    };
    assert_eq!(*reads, ReadPolicy::Nearest);
    // Parsing alone never reads the environment.
    assert_eq!(config.proxy.zone, None);
}

#[test]
fn the_environment_names_the_zone_when_the_file_does_not() {
    let mut config = ok(TWO_ZONES);
    config.resolve_zone(Some("b".to_string()));
    let zone = config.proxy.zone.clone().expect("a zone");
    assert_eq!(
        zone,
        ProxyZone {
            name: "b".to_string(),
            source: ZoneSource::Environment
        }
    );
    assert_eq!(zone.to_string(), format!("zone b (from {ZONE_VARIABLE})"));
}

#[test]
fn proxy_zone_in_the_file_wins_over_the_environment() {
    let text = TWO_ZONES.replace("route = \"both\"", "route = \"both\"\nzone = \"a\"");
    let mut config = ok(&text);
    config.resolve_zone(Some("b".to_string()));
    let zone = config.proxy.zone.clone().expect("a zone");
    assert_eq!((zone.name.as_str(), zone.source), ("a", ZoneSource::Config));
    assert_eq!(zone.to_string(), "zone a (from proxy.zone)");
}

#[test]
fn an_empty_environment_variable_is_no_zone() {
    let mut config = ok(TWO_ZONES);
    config.resolve_zone(Some("  ".to_string()));
    assert_eq!(config.proxy.zone, None);
    config.resolve_zone(None);
    assert_eq!(config.proxy.zone, None);
}

#[test]
fn nearest_is_allowed_without_any_zone() {
    let text = TWO_ZONES
        .replace("zone = \"a\"\n", "")
        .replace("zone = \"b\"\n", "");
    let config = ok(&text);
    assert_eq!(config.pools["in_a"].zone, None);
}

#[test]
fn a_bad_zone_is_reported_at_its_key_path() {
    let text = TWO_ZONES
        .replace("zone = \"a\"", "zone = \" a\"")
        .replace("zone = \"b\"", "zone = 3")
        .replace("route = \"both\"", "route = \"both\"\nzone = \"\"");
    let errors = parse(&text).expect_err("bad zones");
    assert_eq!(
        errors.kinds(),
        [
            ("proxy.zone", ErrorKind::Invalid),
            ("pools.in_a.zone", ErrorKind::Invalid),
            ("pools.in_b.zone", ErrorKind::WrongType),
        ],
        "{errors}"
    );
}

#[test]
fn a_route_has_the_zone_its_pools_share() {
    let text = format!(
        "{TWO_ZONES}\n[pools.also_a]\nservers = [\"10.0.0.3:11211\"]\nzone = \"a\"\n\
         [pools.none]\nservers = [\"10.0.0.4:11211\"]\n\
         [routes.a_only]\ntype = \"failover\"\nchildren = [\"in_a\", \"also_a\"]\n\
         [routes.mixed]\ntype = \"failover\"\nchildren = [\"in_a\", \"in_b\"]\n\
         [routes.partly]\ntype = \"failover\"\nchildren = [\"in_a\", \"none\"]\n"
    );
    let config = ok(&text);
    assert_eq!(config.zone_of("in_b"), Some("b"));
    assert_eq!(config.zone_of("a_only"), Some("a"));
    assert_eq!(config.zone_of("mixed"), None);
    assert_eq!(config.zone_of("partly"), None);
    assert_eq!(config.zone_of("none"), None);
}
