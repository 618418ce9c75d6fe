//! The settings a reload cannot change, and what the reload log says about each one a new
//! config changes anyway (the running value is kept, the rest of the file is applied).
//!
//! Listeners are bound once, by every worker, at start: a reload may change the route a
//! listener serves, and its certificate files, but not which addresses are bound, nor
//! whether one of them speaks TLS.
use std::collections::BTreeSet;

use memroute_config::{Config, ListenAddress};

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
    if old.admin.as_ref().map(|a| &a.listen) != new.admin.as_ref().map(|a| &a.listen) {
        changes.push(kept("admin.listen"));
    }
    changes
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
