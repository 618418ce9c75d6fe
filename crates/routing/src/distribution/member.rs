//! What every distribution file builds on: the [`Distribution`] trait each one implements
//! (a key's *member position* among the servers it was built over), and twemproxy's
//! identity and order of those members, which ketama, ring and modula share. Below
//! mod.rs and the distributions, so each imports it without importing its parent.
use crate::hash::HashFn;
use crate::spec::ServerSpec;

/// What every distribution answers.
pub(crate) trait Distribution {
    /// Position, among the servers the distribution was built over (in config order), of
    /// the one owning `part` (the bytes of the key that are hashed). Called only with two
    /// or more servers.
    fn pick(&self, part: &[u8]) -> usize;
}

/// memcached's default port: twemproxy leaves it out of a server's ketama identity, for
/// compatibility with libmemcached.
const KETAMA_DEFAULT_PORT: u16 = 11211;

/// What a server is hashed as by ketama and ring: twemproxy uses the server's `name` when
/// given, else `host` when the port is 11211, else `host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerIdentity(pub String);

impl ServerIdentity {
    /// The identity twemproxy would give this server.
    pub fn of(server: &ServerSpec) -> ServerIdentity {
        if let Some(name) = &server.name {
            return ServerIdentity(name.clone());
        }
        // twemproxy compares the parsed port number, so "h:11211" is "h".
        match server.address.rsplit_once(':') {
            Some((host, port)) if port.parse::<u16>() == Ok(KETAMA_DEFAULT_PORT) => {
                ServerIdentity(host.to_string())
            }
            _ => ServerIdentity(server.address.clone()),
        }
    }
}

/// The key's hash as twemproxy's distributions see it; twemproxy hashes an empty key to 0.
#[inline]
pub(super) fn twemproxy_key_hash(hash: HashFn, part: &[u8]) -> u32 {
    if part.is_empty() {
        0
    } else {
        hash.hash(part)
    }
}

/// Member positions and identities of `servers`, in the order nutcracker keeps them:
/// sorted by identity length, then bytes (its `string_compare`). Stable, so duplicate
/// identities (which nutcracker would reject) keep config order.
pub(super) fn twemproxy_order(servers: &[&ServerSpec]) -> Vec<(usize, ServerIdentity)> {
    let mut order: Vec<(usize, ServerIdentity)> = servers
        .iter()
        .enumerate()
        .map(|(i, s)| (i, ServerIdentity::of(s)))
        .collect();
    order.sort_by(|(_, a), (_, b)| {
        a.0.len()
            .cmp(&b.0.len())
            .then_with(|| a.0.as_bytes().cmp(b.0.as_bytes()))
    });
    order
}
