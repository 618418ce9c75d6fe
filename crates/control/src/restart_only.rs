//! The settings a reload cannot change, and what the reload log says about each one a new
//! config changes anyway (the running value is kept, the rest of the file is applied).
//!
//! Listeners are bound once, by every worker, at start: a reload may change the route a
//! listener serves, and its certificate files, but not which addresses are bound, nor
//! whether one of them speaks TLS.
use std::collections::BTreeSet;

use memroute_config::{AdminConfig, Config, ListenAddress};

/// One restart-only setting a new config changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RestartOnly {
    /// The key, as the config spells it (`proxy.listen`).
    pub key: &'static str,
    /// What is kept, in words for the reload log.
    pub message: String,
}

const KEPT: &str = "this setting needs a restart to change; keeping the running value";

/// The restart-only settings that differ between the running config `old` and `new`.
pub(crate) fn changes(old: &Config, new: &Config) -> Vec<RestartOnly> {
    let mut changes = listen_changes(old, new);
    let kept = |key| RestartOnly {
        key,
        message: KEPT.to_string(),
    };
    if old.proxy.workers != new.proxy.workers {
        changes.push(kept("proxy.workers"));
    }
    if old.proxy.backlog != new.proxy.backlog {
        changes.push(kept("proxy.backlog"));
    }
    if old.proxy.io != new.proxy.io {
        changes.push(kept("proxy.io"));
    }
    if old.proxy.transport.fastopen != new.proxy.transport.fastopen {
        changes.push(kept("proxy.fastopen"));
    }
    match (&old.admin, &new.admin) {
        (Some(running), Some(wanted)) if running.listen != wanted.listen => {
            changes.push(kept("admin.listen"));
        }
        (Some(_), None) => changes.push(RestartOnly {
            key: "admin",
            message: "removing [admin] needs a restart; the admin endpoint keeps serving \
                      with its running settings (token included)"
                .to_string(),
        }),
        (None, Some(_)) => changes.push(RestartOnly {
            key: "admin",
            message: "adding [admin] needs a restart; no admin endpoint until then, and \
                      none of [admin] applies"
                .to_string(),
        }),
        _ => {}
    }
    changes
}

/// The `[admin]` table a reload serves: the file's, except what needs a restart. Every
/// key but `listen` applies (the token, `show_keys`, the hot-key settings,
/// `ready_fraction`: the admin endpoint and the workers read them from the generation
/// being served). The endpoint is bound once, so `listen` keeps its running value, and
/// adding or removing the whole table keeps the running one ([`changes`] names both):
/// a removed table must not drop the token of an endpoint that still serves.
pub(crate) fn admin_on_reload(
    running: Option<&AdminConfig>,
    wanted: Option<AdminConfig>,
) -> Option<AdminConfig> {
    match (running, wanted) {
        (Some(running), Some(mut wanted)) => {
            wanted.listen = running.listen.clone();
            Some(wanted)
        }
        (running, _) => running.cloned(),
    }
}

/// Listeners added or removed, and TLS turned on or off on a listener in both configs.
/// Order and routes are not compared: a listener's route follows the file on reload.
fn listen_changes(old: &Config, new: &Config) -> Vec<RestartOnly> {
    let addresses = |c: &Config| c.proxy.listen.iter().cloned().collect::<BTreeSet<_>>();
    let (running, wanted) = (addresses(old), addresses(new));
    let listed = |set: &mut dyn Iterator<Item = &ListenAddress>| {
        set.map(|a| a.to_string()).collect::<Vec<_>>().join(", ")
    };
    let mut changes = Vec::new();
    let not_bound = listed(&mut wanted.difference(&running));
    let not_closed = listed(&mut running.difference(&wanted));
    if !not_bound.is_empty() || !not_closed.is_empty() {
        let mut message = format!(
            "adding or removing a listener needs a restart; kept the running listeners ({})",
            listed(&mut old.proxy.listen.iter())
        );
        if !not_bound.is_empty() {
            message.push_str(&format!("; not bound: {not_bound}"));
        }
        if !not_closed.is_empty() {
            message.push_str(&format!("; still serving, with proxy.route: {not_closed}"));
        }
        changes.push(RestartOnly {
            key: "proxy.listen",
            message,
        });
    }
    let speaks_tls = |c: &Config, a: &ListenAddress| c.proxy.transport.listen_tls.contains_key(a);
    let switched = listed(
        &mut running
            .intersection(&wanted)
            .filter(|a| speaks_tls(old, a) != speaks_tls(new, a)),
    );
    if !switched.is_empty() {
        changes.push(RestartOnly {
            key: "proxy.listen",
            message: format!(
                "turning TLS on or off on a listener needs a restart; kept as running: {switched}"
            ),
        });
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(listen: &str) -> Config {
        memroute_config::parse(&format!(
            "[proxy]\nlisten = [{listen}]\nroute = \"a\"\n\
             [pools.a]\nservers = [\"127.0.0.1:1\"]\n[pools.b]\nservers = [\"127.0.0.1:2\"]\n"
        ))
        .expect("valid config")
    }

    #[test]
    fn a_listeners_route_and_the_order_of_listeners_need_no_restart() {
        let old = config(r#""127.0.0.1:1000", { address = "127.0.0.1:1001", route = "a" }"#);
        let new = config(r#"{ address = "127.0.0.1:1001", route = "b" }, "127.0.0.1:1000""#);
        assert_eq!(changes(&old, &new), []);
    }

    #[test]
    fn added_and_removed_listeners_are_named() {
        let old = config(r#""127.0.0.1:1000", "127.0.0.1:1001""#);
        let new = config(r#""127.0.0.1:1000", { address = "127.0.0.1:1002", route = "b" }"#);
        assert_eq!(
            changes(&old, &new),
            [RestartOnly {
                key: "proxy.listen",
                message: "adding or removing a listener needs a restart; kept the running \
                          listeners (127.0.0.1:1000, 127.0.0.1:1001); not bound: 127.0.0.1:1002; \
                          still serving, with proxy.route: 127.0.0.1:1001"
                    .to_string(),
            }]
        );
    }

    fn with_admin(admin: &str) -> Config {
        memroute_config::parse(&format!(
            "[proxy]\nlisten = [\"127.0.0.1:1000\"]\nroute = \"a\"\n\
             [pools.a]\nservers = [\"127.0.0.1:1\"]\n{admin}"
        ))
        .expect("valid config")
    }

    #[test]
    fn every_admin_key_but_listen_follows_the_file() {
        let old = with_admin("[admin]\nlisten = \"127.0.0.1:9150\"\n");
        let new = with_admin(
            "[admin]\nlisten = \"127.0.0.1:9150\"\ntoken = \"t\"\nshow_keys = false\n\
             hot_keys_sample = 4\nhot_keys_interval = \"3s\"\nready_fraction = 0.5\n",
        );
        assert_eq!(changes(&old, &new), []);
        assert_eq!(
            admin_on_reload(old.admin.as_ref(), new.admin.clone()),
            new.admin
        );
        let moved = with_admin("[admin]\nlisten = \"127.0.0.1:9151\"\ntoken = \"t\"\n");
        let keys: Vec<&str> = changes(&new, &moved).iter().map(|c| c.key).collect();
        assert_eq!(keys, ["admin.listen"]);
        let served = admin_on_reload(new.admin.as_ref(), moved.admin.clone()).expect("admin");
        assert_eq!(served.listen, "127.0.0.1:9150", "the bound address is kept");
        assert!(served.token.is_some() && served.show_keys);
    }

    #[test]
    fn adding_or_removing_the_admin_table_is_named_and_kept() {
        let without = with_admin("");
        let with = with_admin("[admin]\nlisten = \"127.0.0.1:9150\"\ntoken = \"t\"\n");
        for (old, new) in [(&without, &with), (&with, &without)] {
            let keys: Vec<&str> = changes(old, new).iter().map(|c| c.key).collect();
            assert_eq!(keys, ["admin"]);
            assert_eq!(
                admin_on_reload(old.admin.as_ref(), new.admin.clone()),
                old.admin
            );
        }
    }

    #[test]
    fn tls_switched_on_a_kept_listener_is_named() {
        let old = config(r#""127.0.0.1:1000""#);
        let new =
            config(r#"{ address = "127.0.0.1:1000", tls = { cert = "/c.pem", key = "/k.pem" } }"#);
        let found = changes(&old, &new);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].message.starts_with("turning TLS on or off"),
            "{found:?}"
        );
    }
}
