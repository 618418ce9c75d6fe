//! Which admin connections are served. The admin port answers the kubelet's probes, so
//! nobody else who can reach it may crowd them out: each peer address holds at most
//! [`PER_PEER`] connections at once, and the whole port at most [`TOTAL`]. A client that
//! opens connections and sends nothing fills only its own share; a probe from another
//! address (the kubelet is the node's address) is still accepted and answered.
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Admin connections one peer address may hold open at once. A Prometheus server keeps
/// one, a person with a browser a handful.
pub(crate) const PER_PEER: usize = 16;
/// Admin connections open at once over all peers (each is a small task and a socket).
pub(crate) const TOTAL: usize = 1024;

/// Why a new connection was closed at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    PerPeer,
    Total,
}

impl Refused {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Refused::PerPeer => "per_peer",
            Refused::Total => "total",
        }
    }
}

/// The open admin connections, counted per peer address.
#[derive(Debug, Default)]
pub(crate) struct Admission {
    open: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
}

impl Admission {
    /// A slot for a connection from `peer`, held until the returned guard drops.
    pub(crate) fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Admitted, Refused> {
        let mut counts = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if counts.total >= TOTAL {
            return Err(Refused::Total);
        }
        let held = counts.per_peer.entry(peer).or_insert(0);
        if *held >= PER_PEER {
            return Err(Refused::PerPeer);
        }
        *held += 1;
        counts.total += 1;
        Ok(Admitted {
            admission: self.clone(),
            peer,
        })
    }
}

/// One admitted connection; gives its slot back when dropped.
#[derive(Debug)]
pub(crate) struct Admitted {
    admission: Arc<Admission>,
    peer: IpAddr,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut counts = self
            .admission
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        counts.total -= 1;
        if let Some(held) = counts.per_peer.get_mut(&self.peer) {
            *held -= 1;
            if *held == 0 {
                counts.per_peer.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_fills_only_its_own_share() {
        let admission = Arc::new(Admission::default());
        let greedy: IpAddr = "10.0.0.7".parse().expect("address");
        let kubelet: IpAddr = "10.0.0.1".parse().expect("address");
        let held: Vec<Admitted> = (0..PER_PEER)
            .map(|_| admission.admit(greedy).expect("within the share"))
            .collect();
        assert_eq!(admission.admit(greedy).err(), Some(Refused::PerPeer));
        assert!(admission.admit(kubelet).is_ok());
        drop(held);
        assert!(admission.admit(greedy).is_ok(), "slots come back");
        assert!(admission.open.lock().expect("lock").per_peer.len() <= 1);
    }

    #[test]
    fn the_port_has_a_total() {
        let admission = Arc::new(Admission::default());
        let held: Vec<Admitted> = (0..TOTAL)
            .map(|i| {
                let peer = IpAddr::from([10, 1, (i / 256) as u8, (i % 256) as u8]);
                admission.admit(peer).expect("within the total")
            })
            .collect();
        let other: IpAddr = "10.9.9.9".parse().expect("address");
        assert_eq!(admission.admit(other).err(), Some(Refused::Total));
        drop(held);
        assert!(admission.admit(other).is_ok());
    }
}
