use super::*;

fn ok(json: &str) -> (String, crate::Config) {
    let text = import(json).unwrap_or_else(|e| panic!("import failed:\n{e}"));
    let config = crate::parse(&text).expect("output parses");
    (text, config)
}

fn err(json: &str) -> Vec<String> {
    match import(json) {
        Ok(text) => panic!("expected an error, got:\n{text}"),
        Err(ConfigErrors(es)) => es.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn pool_route_keeps_servers_in_order_with_ch3() {
    let (text, config) = ok(r#"{
        "pools": {"A": {"servers": ["10.0.0.2:11211", "10.0.0.1:11211:ascii:plain"]}},
        "route": "PoolRoute|A"
    }"#);
    let pool = &config.pools["A"];
    assert_eq!(pool.distribution.as_str(), "ch3");
    let addresses: Vec<&str> = pool.servers.iter().map(|s| s.address.as_str()).collect();
    assert_eq!(addresses, ["10.0.0.2:11211", "10.0.0.1:11211"]);
    assert_eq!(config.proxy.route, "A");
    assert!(text.contains("# NOTE: mcrouter's listen port"), "{text}");
}

#[test]
fn weights_pick_wch3_and_are_fitted_by_mcrouters_rule() {
    let (text, config) = ok(r#"{
        "pools": {"A": {"servers": ["h1:1", "h2:2", "h3:3"], "weights": [1, 0.5]}},
        "route": {"type": "PoolRoute", "pool": "A"}
    }"#);
    assert_eq!(config.pools["A"].distribution.as_str(), "wch3");
    assert_eq!(config.pools["A"].weights, [1.0, 0.5, 0.5]);
    assert!(text.contains("gives the missing ones 0.5"), "{text}");
}

#[test]
fn salt_is_carried_over() {
    let (_, config) = ok(r#"{
        "pools": {"A": {"servers": ["h1:1", "h2:2"]}},
        "route": {"type": "HashRoute", "children": "Pool|A", "hash_func": "Crc32", "salt": "v2"}
    }"#);
    assert_eq!(config.pools["A"].salt, "v2");
    assert_eq!(config.pools["A"].distribution.as_str(), "crc32");
}

#[test]
fn one_pool_hashed_two_ways_is_two_pools() {
    let (_, config) = ok(r#"{
        "pools": {"A": {"servers": ["h1:1", "h2:2"]}},
        "route": {"type": "OperationSelectorRoute",
                  "operation_policies": {"get": {"type": "PoolRoute", "pool": "A", "hash": "Crc32"}},
                  "default_policy": "PoolRoute|A"}
    }"#);
    assert_eq!(config.pools["A"].distribution.as_str(), "crc32");
    assert_eq!(config.pools["A_ch3"].distribution.as_str(), "ch3");
}

#[test]
fn every_route_handle_maps() {
    let (text, config) = ok(r#"{
        "pools": {
            "A": {"servers": ["h1:1", "h2:2"]},
            "B": {"servers": ["h3:3"]},
            "C": {"servers": ["h4:4", "h5:5"]}
        },
        "named_handles": [
            {"type": "AllSyncRoute", "name": "both", "children": ["PoolRoute|A", "PoolRoute|B"]}
        ],
        "route": {
            "type": "PrefixSelectorRoute",
            "policies": {
                "a:": {"type": "AllAsyncRoute", "children": ["PoolRoute|A", "PoolRoute|B"]},
                "i:": {"type": "AllInitialRoute", "children": ["PoolRoute|A", "PoolRoute|B"]},
                "m:": {"type": "AllMajorityRoute", "children": ["PoolRoute|A", "PoolRoute|B", "PoolRoute|C"]},
                "f:": {"type": "AllFastestRoute", "children": ["PoolRoute|A", "PoolRoute|B"]},
                "s:": "both",
                "fo:": {"type": "FailoverRoute", "children": "Pool|C"},
                "mf:": {"type": "MissFailoverRoute", "children": ["PoolRoute|A", "PoolRoute|B"]},
                "w:": {"type": "WarmUpRoute", "cold": "PoolRoute|C", "warm": "PoolRoute|A", "exptime": 60},
                "sh:": {"type": "PoolRoute", "pool": "A",
                        "shadows": [{"target": "PoolRoute|C", "key_fraction_range": [0, 0.1]}]},
                "r:": {"type": "RandomRoute", "children": ["PoolRoute|A", "PoolRoute|B"]},
                "l:": {"type": "LatestRoute", "children": ["PoolRoute|A", "PoolRoute|B"], "failover_count": 2},
                "n:": "NullRoute",
                "e:": {"type": "ErrorRoute", "response": "go away"},
                "h:": {"type": "HashRoute", "children": "Pool|C", "hash_func": "Crc32"}
            },
            "wildcard": "PoolRoute|A"
        }
    }"#);
    let kinds: std::collections::BTreeSet<&str> = config
        .routes
        .values()
        .map(|r| match r {
            crate::RouteConfig::Prefix { .. } => "prefix",
            crate::RouteConfig::Operation { .. } => "operation",
            crate::RouteConfig::Shadow { .. } => "shadow",
            crate::RouteConfig::Replicated { .. } => "replicated",
            crate::RouteConfig::Failover { .. } => "failover",
            crate::RouteConfig::WarmUp { .. } => "warm-up",
            crate::RouteConfig::Random { .. } => "random",
            crate::RouteConfig::Null => "null",
            crate::RouteConfig::Error { .. } => "error",
        })
        .collect();
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        [
            "error",
            "failover",
            "null",
            "prefix",
            "random",
            "replicated",
            "shadow",
            "warm-up"
        ]
    );
    assert!(config.routes.contains_key("both"), "{text}");
    // Pool|C as failover children: one pool per server, in order.
    assert_eq!(config.pools["C_0"].servers[0].address, "h4:4");
    assert_eq!(config.pools["C_1"].servers[0].address, "h5:5");
    assert!(text.contains("failover_count"), "{text}");
    assert!(text.contains("on = \"error-or-miss\""), "{text}");
    assert!(text.contains("key_range = [0.0, 0.1]"), "{text}");
}

/// A config in the shape of a large prefix-routed deployment: routes chosen by routing prefix per DC, a
/// gutter (FailoverWithExptimeRoute on tko, 600 s), an OperationSelectorRoute whose set
/// and delete are AllSyncRoutes with inline children, ascii:plain servers locally and
/// ascii:ssl across DCs, comments and trailing commas, and --route-prefix.
#[test]
fn a_prefix_routed_config_with_a_gutter_imports_whole() {
    let json = r#"{
      // two DCs, one cluster each
      "pools": {
        "eqiad-wan": {"servers": ["10.0.0.1:11211:ascii:plain", "10.0.0.2:11211:ascii:plain"]},
        "eqiad-wan-failover": {"servers": ["10.0.1.1:11211:ascii:plain"]},
        "codfw-wan": {"servers": ["10.1.0.1:11214:ascii:ssl", "10.1.0.2:11214:ascii:ssl"]},
      },
      "routes": [
        {
          "aliases": ["/eqiad/wan/"],
          "route": {
            "type": "OperationSelectorRoute",
            "default_policy": {
              "type": "FailoverWithExptimeRoute",
              "normal": "PoolRoute|eqiad-wan",
              "failover": "PoolRoute|eqiad-wan-failover",
              "failover_errors": ["tko"],
              "failover_exptime": 600,
            },
            "operation_policies": {
              "set": {"type": "AllSyncRoute", "children": [
                {"type": "PoolRoute", "pool": "eqiad-wan"},
                {"type": "PoolRoute", "pool": "codfw-wan"},
              ]},
              "delete": {"type": "AllSyncRoute", "children": [
                "PoolRoute|eqiad-wan", "PoolRoute|codfw-wan",
              ]},
            },
          },
        },
        {"aliases": ["/codfw/wan/"], "route": "PoolRoute|codfw-wan"},
      ],
    }"#;
    let flags = Flags {
        route_prefix: Some("/eqiad/wan/".to_string()),
        pem_ca_path: Some("/etc/mcrouter/ca.pem".to_string()),
        ..Flags::default()
    };
    let text = translate(json, None, &flags).expect("translated");
    for line in [
        "routing_prefix = \"/eqiad/wan/\"",
        "routing_prefixes = [\"/eqiad/wan/\"]",
        "routing_prefixes = [\"/codfw/wan/\"]",
        "type = \"failover\"",
        "children = [\"eqiad-wan\", \"eqiad-wan-failover\"]",
        "failover_errors = [\"tko\"]",
        "failover_exptime = 600",
        "tls = { ca = \"/etc/mcrouter/ca.pem\" }",
        "servers = [\"10.0.0.1:11211\", \"10.0.0.2:11211\"]",
        "writes = \"all-sync\"",
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
    assert!(text.contains("--pem-ca-path"), "the TLS note: {text}");
    let config = crate::parse(&text).expect("loads, routing-prefix keys and all");
    assert_eq!(
        config.routing_prefixes.default.as_deref(),
        Some("/eqiad/wan/")
    );
    let root = &config.routes[&config.proxy.route];
    let crate::RouteConfig::Operation {
        operations,
        default,
    } = root
    else {
        panic!("root: {root:?}");
    };
    assert_eq!(operations.len(), 2, "{operations:?}");
    assert!(matches!(
        &config.routes[default],
        crate::RouteConfig::Failover {
            exptime_cap: Some(600),
            ..
        }
    ));
    assert!(config.pools["codfw-wan"].tls.is_some());
    assert!(config.pools["eqiad-wan"].tls.is_none());
    assert!(import_with(json, &flags).is_ok());
}

#[test]
fn mcrouters_flags_map_to_memroute_keys() {
    let flags = Flags {
        timeouts_until_tko: Some(5),
        probe_timeout_initial_ms: Some(250),
        max_client_outstanding_reqs: Some(64),
        num_proxies: Some(3),
        ..Flags::default()
    };
    let json = r#"{"pools": {"A": {"servers": ["h:1"]}}, "route": "PoolRoute|A"}"#;
    let text = import_with(json, &flags).expect("imports");
    let config = crate::parse(&text).expect("loads");
    assert_eq!(config.proxy.workers, 3);
    assert_eq!(config.proxy.max_client_pending, 64);
    assert_eq!(config.pools["A"].failure_limit, 5);
    assert_eq!(
        config.pools["A"].probe_interval,
        std::time::Duration::from_millis(250)
    );
}

#[test]
fn jsonm_built_ins_expand_as_mcrouters_preprocessor() {
    // A key is expanded too (a call or `%name%` in it); a number goes into a longer string
    // through `@str` and `merge` (mcrouter rejects a non-string `%i%` inside a string).
    let (text, config) = ok(r#"{
      "macros": {"pools_by_dc": {"type": "constDef", "result": {"eqiad": "main"}}},
      "pools": {"@select(%pools_by_dc%,eqiad)": {"servers": {"type": "foreach", "from": "@range(@int(1), @int(3))",
                "item": "i", "use": [{"type": "merge", "params": ["10.0.0.", "@str(%i%)", ":11211"]}]}}},
      "route": {"type": "if", "condition": {"type": "equals", "A": "a", "B": "a"},
                "is_true": "PoolRoute|main", "is_false": "NullRoute"}
    }"#);
    assert_eq!(
        config.pools["main"]
            .servers
            .iter()
            .map(|s| s.address.as_str())
            .collect::<Vec<_>>(),
        ["10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"],
        "{text}"
    );
    assert_eq!(config.proxy.route, "main");
    assert_eq!(
        err(r#"{"route": {"vars": {"i": 1}, "x": "10.0.0.%i%"}}"#),
        ["route.x: %i% is 1, not a string, inside \"10.0.0.%i%\""]
    );
}

#[test]
fn plain_macros_expand() {
    let (_, config) = ok(r#"{
        "macros": {
            "pool_of": {"type": "macroDef", "params": ["p"], "result": {"type": "PoolRoute", "pool": "%p%"}},
            "fail": {"type": "macroDef", "params": ["a", {"name": "b", "default": "B"}],
                     "result": {"type": "FailoverRoute", "children": ["@pool_of(%a%)", "@pool_of(%b%)"]}}
        },
        "pools": {"A": {"servers": ["h1:1"]}, "B": {"servers": ["h2:2"]}},
        "route": {"type": "fail", "a": "A"}
    }"#);
    assert!(matches!(
        &config.routes[&config.proxy.route],
        crate::RouteConfig::Failover { children, .. } if children == &["A", "B"]
    ));
}

#[test]
fn bad_input_is_an_error_with_its_json_path() {
    assert_eq!(
        err("{\"pools\": "),
        ["line 1, column 10: invalid JSON: EOF while parsing a value at line 1 column 10"]
    );
    assert_eq!(
        err(r#"{"pools": {"A": {"servers": ["h:1"]}}, "route": {"type": "FancyRoute"}}"#),
        ["route.type: unknown route handle \"FancyRoute\""]
    );
    assert_eq!(
        err(r#"{"pools": {"A": {"servers": ["h:1", "h:2"], "weights": [0, -1, "x"]}}, "route": "PoolRoute|A"}"#),
        [
            "pools.A.weights[1]: weight -1 must be > 0 (a server that should get no keys belongs out of the pool; with weight 0 WeightedCh3 still gives it the keys all 32 tries miss)",
            "pools.A.weights[2]: expected a number, found \"x\"",
        ]
    );
    assert_eq!(
        err(r#"{"pools": {"A": {"servers": ["h:1"]}},
                "named_handles": [{"name": "x", "type": "FailoverRoute", "children": ["y", "PoolRoute|A"]},
                                  {"name": "y", "type": "FailoverRoute", "children": ["x"]}],
                "route": "x"}"#),
        ["named_handles[1].children[0]: named handle loop: x -> y -> x"]
    );
    assert_eq!(
        err(r#"{"pools": {}, "route": "nothing"}"#),
        ["route: unknown route handle or named handle \"nothing\""]
    );
    assert_eq!(
        err(
            r#"{"pools": {"A": {"servers": ["h:1"]}}, "route": {"type": "PoolRoute", "pool": "A", "hash": {"hash_func": "Ch3", "salt": 7}}}"#
        ),
        ["route.hash.salt: expected a string, found 7"]
    );
    assert_eq!(err("[1]"), ["expected a JSON object (an mcrouter config)"]);
    assert_eq!(
        err(r#"{"macros": {"m": {"type": "macroDef", "result": "@m"}}, "route": "@m"}"#),
        ["route: macro expansion too deep (a macro that calls itself?)"]
    );
    assert_eq!(
        err(r#"{"route": "@merge(a)"}"#),
        ["route: @merge: params is not an array"]
    );
}

/// Every prefix of a realistic config, and the config with each byte replaced by each
/// of a few troublesome ones: import answers (Ok or errors) and never panics.
#[test]
fn never_panics_on_truncated_or_mangled_configs() {
    let config = r#"{"macros": {"m": {"type": "macroDef", "params": ["p"], "result": "PoolRoute|%p%"}},
        "pools": {"A": {"servers": ["h1:1", "[::1]:2"], "weights": [1, 0.5]}, "B": {"servers": ["h3:3"]}},
        "named_handles": [{"name": "n", "type": "FailoverRoute", "children": ["@m(A)", "Pool|B"]}],
        "route": {"type": "PrefixSelectorRoute", "policies": {"a": "n", "b": {"type": "WarmUpRoute", "cold": "PoolRoute|B", "warm": "PoolRoute|A", "exptime": 5}},
                  "wildcard": {"type": "PoolRoute", "pool": "A", "hash": {"hash_func": "WeightedCh3", "weights": [1]},
                               "shadows": [{"target": "PoolRoute|B", "key_fraction_range": [0, 0.5]}]}}}"#;
    assert!(import(config).is_ok(), "{:?}", import(config).err());
    for end in 0..config.len() {
        if config.is_char_boundary(end) {
            let _ = import(&config[..end]);
        }
    }
    for i in 0..config.len() {
        for b in ["\"", "[", "]", "{", "}", "|", "%", "@", "0", "-", ","] {
            if config.is_char_boundary(i) && config.is_char_boundary(i + 1) {
                let _ = import(&format!("{}{b}{}", &config[..i], &config[i + 1..]));
            }
        }
    }
}

#[test]
fn never_panics_on_odd_shapes() {
    for json in [
        "null", "{}", "{\"route\": null}", "{\"route\": []}", "{\"route\": {}}",
        "{\"pools\": [], \"route\": \"PoolRoute|A\"}", "{\"pools\": {\"A\": 1}, \"route\": \"PoolRoute|A\"}",
        "{\"pools\": {\"A\": {\"servers\": [1, \"[::1\", \"h:0\"]}}, \"route\": \"Pool|A\"}",
        "{\"routes\": [{\"aliases\": []}]}", "{\"route\": {\"type\": \"PrefixSelectorRoute\", \"policies\": {\"\": \"NullRoute\"}}}",
        "{\"route\": {\"type\": \"ShadowRoute\", \"children\": \"NullRoute\", \"shadows\": [{\"target\": \"NullRoute\", \"key_fraction_range\": [0.5, 0.1]}]}}",
        "{\"macros\": 3, \"route\": \"@x(\"}",
    ] {
        let _ = import(json);
    }
}

#[test]
fn keeping_is_turned_off_where_a_routing_prefix_reaches_pools_that_disagree() {
    // /a/a/ reaches A (cuts) and B (keeps): B must cut. Then /b/b/ reaches B (now cutting) and
    // C (keeps): C must cut too. /d/d/ reaches only D, which keeps: it still does.
    let (text, config) = ok(r#"{
      "pools": {
        "A": {"servers": ["10.0.0.1:11211"]},
        "B": {"servers": ["10.0.0.2:11211"], "keep_routing_prefix": true},
        "C": {"servers": ["10.0.0.3:11211"], "keep_routing_prefix": true},
        "D": {"servers": ["10.0.0.4:11211"], "keep_routing_prefix": true}
      },
      "routes": [
        {"aliases": ["/a/a/"], "route": {"type": "AllSyncRoute", "children": ["PoolRoute|A", "PoolRoute|B"]}},
        {"aliases": ["/b/b/"], "route": {"type": "AllSyncRoute", "children": ["PoolRoute|B", "PoolRoute|C"]}},
        {"aliases": ["/d/d/"], "route": "PoolRoute|D"}
      ]
    }"#);
    let keep: Vec<&str> = config
        .routing_prefixes
        .keep
        .iter()
        .map(String::as_str)
        .collect();
    assert_eq!(keep, ["D"], "{text}");
    let note_of = |pool: &str| {
        let before = text
            .split(&format!("[pools.{pool}]\n"))
            .next()
            .expect("split");
        before
            .rsplit("\n\n")
            .next()
            .expect("rsplit")
            .replace("\n#  ", "")
    };
    for (pool, prefixes) in [("B", "\"/a/a/\", \"/b/b/\""), ("C", "\"/b/b/\"")] {
        let note = note_of(pool);
        assert!(
            note.contains("mcrouter sent this pool's keys with their routing prefix")
                && note.contains(&format!("and {prefixes} also reach"))
                && note.contains("cold pool"),
            "{pool}: {note}"
        );
    }
    assert!(!note_of("A").contains("keep_routing_prefix"), "{text}");
    assert!(!note_of("D").contains("keep_routing_prefix"), "{text}");
}

/// What the preprocessor makes of `orig` with `macros` defined (no error allowed).
fn expanded(macros: Value, orig: Value) -> Value {
    let mut importer = Importer::default();
    let top = serde_json::json!({"macros": macros, "case": orig});
    let Value::Object(top) = top else {
        unreachable!("an object")
    };
    let mut out = importer.expand_macros(top);
    let errors: Vec<String> = importer.errs.iter().map(ToString::to_string).collect();
    assert!(errors.is_empty(), "{errors:?}");
    out.remove("case").unwrap_or_default()
}

/// Cases of mcrouter's own preprocessor test (`mcrouter/lib/config/test/
/// config_preprocessor_test_file.json`), each with the value mcrouter expands it to.
#[test]
fn hash_weighted_hash_shuffle_and_local_ip_as_mcrouters_preprocessor_test_expects() {
    use serde_json::json;
    let none = json!({});
    for (orig, expand) in [
        (json!("@hash(abcd)"), json!(6660178300034425268i64)),
        (json!("@hash(@int(2313))"), json!(-4996987850411076878i64)),
        (json!("@isLocalIp(::1)"), json!(true)),
        (json!("@isLocalIp(::0001)"), json!(true)),
        (json!("@isLocalIp(not an ip)"), json!(false)),
        (json!("@isLocalIp(127.0.0.1)"), json!(true)),
        (
            json!({"type": "weightedHash", "dictionary": {"a": 0.5}, "key": 2015}),
            json!("a"),
        ),
        (
            json!({"type": "weightedHash", "dictionary": {"a": 0, "b": 1}, "key": "hello world"}),
            json!("b"),
        ),
        (
            json!({"type": "define", "vars": {"weights": {"a": 0, "b": 1, "c": 0.5}},
                   "result": "@weightedHash(%weights%, @int(12345))"}),
            json!("b"),
        ),
        (json!({"type": "shuffle", "dictionary": []}), json!([])),
        (json!({"type": "shuffle", "dictionary": [1]}), json!([1])),
        (
            json!({"type": "shuffle", "dictionary": [1, 3], "seed": 11111111}),
            json!([1, 3]),
        ),
        (
            json!({"type": "shuffle", "dictionary": [1, 3], "seed": 123}),
            json!([3, 1]),
        ),
    ] {
        assert_eq!(expanded(none.clone(), orig.clone()), expand, "{orig}");
    }
    // Not a loopback address: the importer cannot know the host's, and says false.
    assert_eq!(expanded(none, json!("@isLocalIp(10.1.2.3)")), json!(false));
}

#[test]
fn process_vars_and_defined_as_mcrouters_preprocessor_test_expects() {
    use serde_json::json;
    let macros = json!({
        "indexof": {"type": "macroDef", "params": ["list", "x"], "result": {
            "type": "process", "initialValue": "@int(-1)", "dictionary": "%list%",
            "transform": {"type": "if",
                "condition": "@and(@equals(%value%,@int(-1)),@equals(%item%,%x%))",
                "is_true": "%key%", "is_false": "%value%"}}},
        "minEl": {"type": "macroDef", "params": ["list"], "result": {
            "type": "process", "initialValue": "@select(%list%,@int(0))",
            "dictionary": "@slice(%list%,@int(1),@size(%list%))",
            "transform": {"type": "if", "condition": "@less(%item%,%value%)",
                "is_true": "%item%", "is_false": "%value%"}}},
        "g": {"type": "constDef", "result": "test"},
        "myMacro": {"type": "macroDef", "params": ["a", "b"], "result": {
            "a": "@defined(a)", "c": "@defined(c)", "arg": "%a%"}}
    });
    for (orig, expand) in [
        (
            json!({"type": "indexof", "list": ["a", "b", "c", "d", "e"], "x": "d"}),
            json!(3),
        ),
        (json!({"type": "minEl", "list": [1, 3, 0, 4]}), json!(0)),
        (
            json!({"vars": {"a": "%b%", "b": "abacaba"}, "my_key": "%a%"}),
            json!({"my_key": "abacaba"}),
        ),
        (
            json!({"vars": {"fst": "a"}, "k1": {"vars": {"scnd": "b", "thrd": "%fst%%scnd%"},
                                                 "k2": "%fst%%scnd%%thrd%"}}),
            json!({"k1": {"k2": "abab"}}),
        ),
        (
            json!({"vars": {"a": "123"}, "type": "foreach", "from": ["a", "b"], "use": ["%item%%a%"]}),
            json!(["a123", "b123"]),
        ),
        (json!("@defined(g)"), json!(true)),
        (json!("@defined(name)"), json!(false)),
        (json!("%g%"), json!("test")),
        (
            json!({"type": "transform", "keyName": "my_key", "dictionary": [1, 2],
                   "itemTransform": "@and(@defined(my_key), @defined(item))"}),
            json!([true, true]),
        ),
        (
            json!({"type": "myMacro", "a": 1, "b": 2}),
            json!({"a": true, "c": false, "arg": 1}),
        ),
    ] {
        assert_eq!(expanded(macros.clone(), orig.clone()), expand, "{orig}");
    }
}

/// An importer set up as mcrouter's preprocessor test sets its preprocessor up
/// (`config_preprocessor_test.cpp`): the global params `testGlobal` and `templGlobal`, and
/// the files its mock import resolver answers for (`test`, `templ`; `do_not_exist` fails).
fn importer_as_mcrouters_test(tag: &str) -> Importer {
    let dir = std::env::temp_dir().join(format!("memroute-jsonm-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("test"), "\"mock_test\"").expect("write");
    let templ = "{ \"type\": \"macroDef\", \"result\": \"imported_macro\" }";
    std::fs::write(dir.join("templ"), templ).expect("write");
    let config_params = [("testGlobal", "test"), ("templGlobal", "templ")];
    let flags = Flags {
        config_params: config_params
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .into(),
        ..Flags::default()
    };
    Importer {
        flags,
        base: Some(dir),
        ..Importer::default()
    }
}

/// What the preprocessor makes of `top` (mcrouter's `getConfigWithoutMacros`): the expanded
/// object, or the errors.
fn preprocessed(top: Value, tag: &str) -> Result<Map<String, Value>, Vec<String>> {
    let mut importer = importer_as_mcrouters_test(tag);
    let Value::Object(top) = top else {
        return Err(vec!["not an object".to_string()]);
    };
    let out = importer.expand_macros(top);
    match importer.errs.is_empty() {
        true => Ok(out),
        false => Err(importer.errs.iter().map(ToString::to_string).collect()),
    }
}

/// mcrouter's preprocessor test file (`testdata/`, unchanged from mcrouter): every case of
/// every test expands to the value mcrouter's test expects (its `runCase`: the config
/// `{"consts", "macros", "orig"}`, `orig` compared with `expand`).
#[test]
fn every_case_of_mcrouters_preprocessor_test_file_expands_as_it_expects() {
    let file = json::parse(include_str!(
        "testdata/mcrouter_preprocessor_test_file.json"
    ));
    let Ok(Value::Object(tests)) = file else {
        panic!("the test file reads: {file:?}");
    };
    let (mut checked, mut failed) = (0, Vec::new());
    for (test, cases) in &tests {
        let consts = cases
            .get("consts")
            .cloned()
            .unwrap_or(Value::Array(Vec::new()));
        let macros = cases["macros"].clone();
        for (case, c) in cases["cases"].as_object().expect("cases") {
            let top = serde_json::json!({"consts": consts, "macros": macros, "orig": c["orig"]});
            match preprocessed(top, "file").map(|mut out| out.remove("orig")) {
                Ok(Some(got)) if got == c["expand"] => checked += 1,
                other => failed.push(format!(
                    "{test}:{case}: expected {}, got {other:?}",
                    c["expand"]
                )),
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
    assert_eq!(checked, 157, "cases run");
}

/// mcrouter's preprocessor error test file: every config in it is an error.
#[test]
fn every_config_of_mcrouters_preprocessor_error_file_is_an_error() {
    let file = json::parse(include_str!(
        "testdata/mcrouter_preprocessor_test_errors.json"
    ));
    let Ok(Value::Object(cases)) = file else {
        panic!("the test file reads: {file:?}");
    };
    let accepted: Vec<&String> = cases
        .iter()
        .filter(|(_, config)| preprocessed((*config).clone(), "errors").is_ok())
        .map(|(name, _)| name)
        .collect();
    assert!(accepted.is_empty(), "accepted: {accepted:?}");
    assert_eq!(cases.len(), 25);
}

/// The cases of mcrouter's test file that show a parameter bound as a value (an object, a
/// list, a boolean passed through `@name(...)` calls), nested calls split at the right
/// commas, an escaped comma in an argument, and keys expanded; each quoted from
/// `testdata/mcrouter_preprocessor_test_file.json` with the value mcrouter expects.
#[test]
fn parameters_are_values_calls_split_as_mcrouters_and_keys_expand() {
    use serde_json::json;
    let object_to_string = json!({"objectToString": {"type": "macroDef", "params": ["dictionary"],
        "result": {"type": "merge", "params": ["{", {"type": "process", "initialValue": "",
            "dictionary": "%dictionary%", "transform": {"type": "merge", "params": [
                "@if(@empty(%value%), %key%:, %value%\\,%key%:)",
                "@if(@isObject(%item%), @objectToString(%item%), %item%)"]}}, "}"]}}});
    let my_macro = json!({"myMacro": {"type": "macroDef", "params": ["a", "b"], "result": {
        "a": "@defined(a)", "b": "@defined(b)", "c": "@defined(c)", "params": "@defined(params)",
        "local": "@defined(local)", "myMacro": "@defined(myMacro)", "arg": "%a%"}}});
    let concat = json!({"concat": {"type": "macroDef", "params": ["a", "b"], "result": "%a%%b%"}});
    let cases = [
        (
            &object_to_string,
            json!({"type": "objectToString", "dictionary": {"a": {"b": "c"}}}),
            json!("{a:{b:c}}"),
        ),
        (
            &my_macro,
            json!({"vars": {"local": true}, "in_macro": "@myMacro(@defined(local),2)"}),
            json!({"in_macro": {"arg": true, "a": true, "b": true, "c": false, "local": false, "myMacro": false, "params": false}}),
        ),
        (
            &concat,
            json!({"type": "transform", "itemName": "list", "keyName": "listKey",
            "itemTransform": {"type": "transform", "dictionary": "%list%", "itemTransform": "@concat(%listKey%,@str(%item%))"},
            "dictionary": {"a": [1, 2, 3], "b": [4, 5, 6]}}),
            json!({"a": ["a1", "a2", "a3"], "b": ["b4", "b5", "b6"]}),
        ),
        (
            &concat,
            json!({"type": "foreach", "from": {"a": "b", "c": "d"},
            "use": {"vars": {"concat": "%key%%item%"}, "%key%": "%concat%"}}),
            json!({"a": "ab", "c": "cd"}),
        ),
        (
            &concat,
            json!({"type": "foreach", "from": [1, 2], "where": "@less(@int(1), %item%)",
            "use": {"@str(%key%)": "%item%"}}),
            json!({"1": 2}),
        ),
        (
            &concat,
            json!("@import(do_not_exist, Oops\\, something went wrong)"),
            json!("Oops, something went wrong"),
        ),
        (
            &concat,
            json!("@and(@not(@or(@bool(false),@bool(1))), @not(@bool(false)))"),
            json!(false),
        ),
    ];
    for (macros, orig, expand) in cases {
        let top = json!({"macros": macros, "orig": orig});
        let got = preprocessed(top, "values").map(|mut out| out.remove("orig"));
        assert_eq!(got, Ok(Some(expand)), "{orig}");
    }
}
