//! A root per listener: `proxy.listen` entries that name their route, the default root
//! for the others, and every mistake reported at once with its key path.
use memroute_config::{parse, ListenAddress};

fn errors(text: &str) -> Vec<String> {
    match parse(text) {
        Ok(_) => panic!("expected errors"),
        Err(e) => e.0.iter().map(|e| e.to_string()).collect(),
    }
}

fn tcp(address: &str) -> ListenAddress {
    ListenAddress::Tcp(address.to_string())
}

const TWO_POOLS: &str = r#"
[pools.main]
servers = ["10.0.0.1:11211"]
[pools.sessions]
servers = ["10.0.0.2:11211"]
[routes.by_prefix]
type = "prefix"
prefixes = { "s:" = "sessions" }
default = "main"
"#;

#[test]
fn a_listener_may_name_its_root_and_the_others_serve_proxy_route() {
    let c = parse(&format!(
        r#"
[proxy]
listen = [{{ address = "0.0.0.0:22121", route = "sessions" }},
          "0.0.0.0:22122",
          {{ address = "unix:/run/m.sock" }},
          {{ address = "0.0.0.0:22123", route = "by_prefix" }}]
route = "main"
{TWO_POOLS}"#
    ))
    .expect("valid");
    assert_eq!(c.proxy.route, "main");
    let roots: Vec<(String, &str)> = c
        .proxy
        .listener_roots()
        .map(|(address, root)| (address.to_string(), root))
        .collect();
    assert_eq!(
        roots,
        [
            ("0.0.0.0:22121".to_string(), "sessions"),
            ("0.0.0.0:22122".to_string(), "main"),
            ("unix:/run/m.sock".to_string(), "main"),
            ("0.0.0.0:22123".to_string(), "by_prefix"),
        ]
    );
    assert_eq!(c.proxy.route_of(&tcp("0.0.0.0:22121")), "sessions");
    assert_eq!(
        c.proxy.listen_routes.len(),
        2,
        "only the listeners that name one"
    );
    let spec = c.routing_spec();
    assert_eq!(spec.root, "main");
    assert_eq!(
        spec.listener_roots,
        ["sessions", "main", "main", "by_prefix"]
    );
}

#[test]
fn a_listener_with_tls_and_a_route() {
    let c = parse(&format!(
        r#"
[proxy]
listen = [{{ address = "0.0.0.0:22121", route = "sessions", tls = {{ cert = "/s.pem", key = "/s.key" }} }}]
route = "main"
{TWO_POOLS}"#
    ))
    .expect("valid");
    let address = tcp("0.0.0.0:22121");
    assert_eq!(c.proxy.route_of(&address), "sessions");
    assert_eq!(
        c.proxy.transport.listen_tls[&address].key_path,
        "proxy.listen[0].tls"
    );
}

#[test]
fn when_every_listener_names_its_root_proxy_route_defaults_to_the_first() {
    let c = parse(&format!(
        r#"
[proxy]
listen = [{{ address = "127.0.0.1:22121", route = "sessions" }},
          {{ address = "127.0.0.1:22122", route = "main" }}]
{TWO_POOLS}"#
    ))
    .expect("valid without proxy.route");
    assert_eq!(c.proxy.route, "sessions");
    assert_eq!(c.routing_spec().listener_roots, ["sessions", "main"]);
}

#[test]
fn bad_listener_routes_are_all_reported_with_their_key_paths() {
    let e = errors(&format!(
        r#"
[proxy]
listen = [{{ address = "0.0.0.0:22121", route = "x" }},
          "0.0.0.0:22122",
          {{ address = "0.0.0.0:22123", route = 7 }},
          {{ address = "nowhere", route = "y" }},
          {{ address = "0.0.0.0:22124", rout = "main" }}]
{TWO_POOLS}"#
    ));
    assert_eq!(
        e,
        [
            "proxy.listen[2].route: expected a string, found an integer",
            "proxy.listen[3].address: invalid address \"nowhere\" (expected host:port with a numeric port), or unix:/path",
            "proxy.listen[4].rout: unknown key (expected one of: address, route, tls, auth, routing_prefix)",
            "proxy.listen[0].route: unknown target \"x\" (no pool or route has that name)",
            "proxy.listen[3].route: unknown target \"y\" (no pool or route has that name)",
            "proxy.route: required when there is more than one pool (name the pool or route to send requests to)",
        ]
    );
}

#[test]
fn the_listeners_example_serves_each_pool_on_its_own_port() {
    let path =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../config/listeners.toml");
    let c = memroute_config::load(&path).expect("config/listeners.toml parses");
    let roots: Vec<(String, &str)> = c
        .proxy
        .listener_roots()
        .map(|(address, root)| (address.to_string(), root))
        .collect();
    assert_eq!(
        roots,
        [
            ("0.0.0.0:22121".to_string(), "sessions"),
            ("0.0.0.0:22122".to_string(), "feed"),
            ("0.0.0.0:22123".to_string(), "both"),
            ("127.0.0.1:22120".to_string(), "sessions"),
        ]
    );
}
