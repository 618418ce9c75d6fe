//! mcrouter's routing prefixes in the config: `routing_prefixes` on pools and routes,
//! `keep_routing_prefix`, the proxy's and listeners' default `routing_prefix` choosing
//! roots, and each mistake reported with its key path.
use memroute_config::{parse, Config, ErrorKind, ListenAddress};

/// Pools `east` (prefix /east/web/) and `west` (prefix /west/web/), then `extra`.
fn config(proxy: &str, extra: &str) -> String {
    format!(
        "[proxy]\n{proxy}\n[pools.east]\nservers = [\"10.0.0.1:11211\"]\nrouting_prefixes = [\"/east/web/\"]\n\
         [pools.west]\nservers = [\"10.0.0.2:11211\"]\nrouting_prefixes = [\"/west/web/\"]\n{extra}"
    )
}

fn ok(proxy: &str, extra: &str) -> Config {
    parse(&config(proxy, extra)).unwrap_or_else(|e| panic!("should parse:\n{e}"))
}

fn kinds(proxy: &str, extra: &str) -> Vec<(String, ErrorKind)> {
    match parse(&config(proxy, extra)) {
        Ok(c) => panic!("config should fail but parsed: {c:?}"),
        Err(e) => e
            .kinds()
            .into_iter()
            .map(|(path, kind)| (path.to_string(), kind))
            .collect(),
    }
}

#[test]
fn the_default_prefix_picks_the_root_and_every_prefix_its_target() {
    let c = ok(
        "routing_prefix = \"/west/web/\"\nlisten = [\"127.0.0.1:1\", { address = \"127.0.0.1:2\", routing_prefix = \"/east/web/\" }]",
        "[routes.both]\ntype = \"replicated\"\nchildren = [\"east\", \"west\"]\nrouting_prefixes = [\"/all/web/\", \"/any/web/\"]\n",
    );
    assert_eq!(c.proxy.route, "west");
    let second = ListenAddress::Tcp("127.0.0.1:2".to_string());
    assert_eq!(c.proxy.route_of(&second), "east");
    let prefixes = &c.routing_prefixes.prefixes;
    assert_eq!(prefixes["/east/web/"], "east");
    assert_eq!(prefixes["/all/web/"], "both");
    assert_eq!(prefixes["/any/web/"], "both");
    assert_eq!(c.routing_prefixes.of_listener(&second), Some("/east/web/"));
    let spec = c.routing_spec();
    assert_eq!(
        spec.listener_prefixes,
        [
            Some("/west/web/".to_string()),
            Some("/east/web/".to_string())
        ]
    );
    assert_eq!(spec.listener_roots, ["west", "east"]);
    assert!(memroute_routing::RouteTable::build(&spec).is_ok());
}

#[test]
fn a_config_without_prefixes_has_none() {
    let c = parse("[pools.a]\nservers = [\"10.0.0.1:11211\"]\n").expect("config");
    assert!(c.routing_prefixes.prefixes.is_empty());
    assert!(c.routing_spec().routing_prefixes.is_empty());
}

#[test]
fn keep_routing_prefix_is_a_pools_key() {
    let c = ok(
        "route = \"east\"",
        "[pools.kept]\nservers = [\"10.0.0.3:11211\"]\nrouting_prefixes = [\"/east/kept/\"]\nkeep_routing_prefix = true\n",
    );
    assert!(c.routing_prefixes.keep.contains("kept"));
    assert!(!c.routing_prefixes.keep.contains("east"));
}

#[test]
fn malformed_and_repeated_prefixes_are_named_by_key_path() {
    let found = kinds(
        "route = \"east\"",
        "[routes.r]\ntype = \"failover\"\nchildren = [\"east\"]\nrouting_prefixes = [\"/east/web/\", \"east/x/\", \"/a/*/\", \"/a/b/c/\", 3]\n\
         [pools.p]\nservers = [\"10.0.0.3:11211\"]\nrouting_prefixes = \"/p/q/\"\nkeep_routing_prefix = \"yes\"\n",
    );
    let expect = [
        ("routes.r.routing_prefixes[0]", ErrorKind::Conflict),
        ("routes.r.routing_prefixes[1]", ErrorKind::Invalid),
        ("routes.r.routing_prefixes[2]", ErrorKind::Invalid),
        ("routes.r.routing_prefixes[3]", ErrorKind::Invalid),
        ("routes.r.routing_prefixes[4]", ErrorKind::WrongType),
        ("pools.p.routing_prefixes", ErrorKind::WrongType),
        ("pools.p.keep_routing_prefix", ErrorKind::WrongType),
    ];
    for (path, kind) in expect {
        assert!(
            found.contains(&(path.to_string(), kind)),
            "{path} {kind:?} not in {found:?}"
        );
    }
}

#[test]
fn default_prefixes_must_name_a_declared_prefix_and_agree_with_route() {
    let found = kinds(
        "routing_prefix = \"/north/web/\"\nlisten = [{ address = \"127.0.0.1:2\", route = \"west\", routing_prefix = \"/east/web/\" }]",
        "",
    );
    assert!(
        found.contains(&("proxy.routing_prefix".to_string(), ErrorKind::UnknownTarget)),
        "{found:?}"
    );
    assert!(
        found.contains(&(
            "proxy.listen[0].routing_prefix".to_string(),
            ErrorKind::Conflict
        )),
        "{found:?}"
    );
    let found = kinds("route = \"east\"\nrouting_prefix = \"/west/web/\"", "");
    assert_eq!(
        found,
        [("proxy.routing_prefix".to_string(), ErrorKind::Conflict)]
    );
    let found = kinds("routing_prefix = \"bad\"", "");
    assert!(
        found.contains(&("proxy.routing_prefix".to_string(), ErrorKind::Invalid)),
        "{found:?}"
    );
}

#[test]
fn pools_reached_from_one_prefix_must_agree_on_keeping_it() {
    let found = kinds(
        "route = \"east\"",
        "[pools.kept]\nservers = [\"10.0.0.3:11211\"]\nkeep_routing_prefix = true\n\
         [routes.mixed]\ntype = \"replicated\"\nchildren = [\"east\", \"kept\"]\nrouting_prefixes = [\"/mix/web/\"]\n",
    );
    assert_eq!(
        found,
        [(
            "routes.mixed.routing_prefixes".to_string(),
            ErrorKind::Conflict
        )]
    );
}
