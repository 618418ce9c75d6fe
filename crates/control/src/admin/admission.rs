//! Which admin connections are kept. The admin port answers the kubelet's probes, which
//! come from the node's address, shared with everything else on the node that uses host
//! networking; so no address, the probe's own included, may be refused because others hold
//! connections open. The rule: a newcomer is always admitted, and when its peer address
//! already holds [`PER_PEER`] connections, or the port [`TOTAL`], the connection *idle
//! longest* is closed to make room (first among that peer's, else among all). Idle means
//! waiting for a request (from accept, or since the last answer), so a connection whose
//! request is being answered is never closed, and a newcomer that sends its request at once
//! is the youngest idle one, the last to go. Only when every connection in the way is busy
//! is the newcomer refused. Idle connections also close on their own when no request head
//! arrives within the header deadline (`HEADER_TIMEOUT`).
//!
//! ```text
//!   accept(peer) -> admit: peer at PER_PEER?  evict peer's longest-idle (or refuse: all busy)
//!                          port at TOTAL?     evict the port's longest-idle (or refuse)
//!                  -> slot { peer, idle_since, close: Notify }
//!   request head read  -> busy(slot)     answer sent -> idle(slot, now)
//!   evicted slot: its connection task sees `close` and drops the connection
//! ```
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::Notify;

/// Admin connections one peer address may hold open at once. A Prometheus server keeps
/// one, a person with a browser a handful; past this its idle-longest is closed.
pub(crate) const PER_PEER: usize = 16;
/// Admin connections open at once over all peers. Each idle one holds a task, a socket and
/// hyper's read buffer (about 8 KiB), so this bounds the admin port's memory to a few MiB
/// whoever connects; idle connections past it are closed, so it never refuses a probe.
pub(crate) const TOTAL: usize = 128;

/// Why a new connection was closed at once: every connection in its way was busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    PerPeer,
    Total,
}

impl Limit {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Limit::PerPeer => "per_peer",
            Limit::Total => "total",
        }
    }
}

/// What admitting one connection did.
#[derive(Debug)]
pub(crate) struct Admitted {
    pub slot: Slot,
    /// The limits for which an idle connection was closed to make room.
    pub evicted: Vec<Limit>,
}

/// The open admin connections.
#[derive(Debug, Default)]
pub(crate) struct Admission {
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    next_id: u64,
    slots: HashMap<u64, Entry>,
    per_peer: HashMap<IpAddr, usize>,
}

#[derive(Debug)]
struct Entry {
    peer: IpAddr,
    /// Waiting for a request since then; `None` while one is being answered.
    idle_since: Option<Instant>,
    /// Told when this connection is closed to make room.
    close: Arc<Notify>,
}

impl Open {
    /// The connection idle longest (of `peer`'s, or of all), if any is idle.
    fn longest_idle(&self, peer: Option<IpAddr>) -> Option<u64> {
        self.slots
            .iter()
            .filter(|(_, e)| peer.is_none_or(|p| e.peer == p))
            .filter_map(|(id, e)| Some((e.idle_since?, *id)))
            .min()
            .map(|(_, id)| id)
    }

    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.slots.remove(&id)?;
        if let Some(held) = self.per_peer.get_mut(&entry.peer) {
            *held -= 1;
            if *held == 0 {
                self.per_peer.remove(&entry.peer);
            }
        }
        Some(entry)
    }

    /// Closes the idle-longest connection (of `peer`, or of all) to make room.
    fn evict(&mut self, peer: Option<IpAddr>) -> bool {
        match self.longest_idle(peer).and_then(|id| self.remove(id)) {
            Some(entry) => {
                // A permit is kept if the task is not waiting yet: the close is never lost.
                entry.close.notify_one();
                true
            }
            None => false,
        }
    }
}

impl Admission {
    fn lock(&self) -> MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a new connection from `peer`, idle from now; held until the slot drops.
    /// Closes idle-longest connections to make room; refused only when those in the way
    /// are all answering a request.
    pub(crate) fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Admitted, Limit> {
        let mut open = self.lock();
        let mut evicted = Vec::new();
        if open.per_peer.get(&peer).copied().unwrap_or(0) >= PER_PEER {
            if !open.evict(Some(peer)) {
                return Err(Limit::PerPeer);
            }
            evicted.push(Limit::PerPeer);
        }
        if open.slots.len() >= TOTAL {
            if !open.evict(None) {
                return Err(Limit::Total);
            }
            evicted.push(Limit::Total);
        }
        let id = open.next_id;
        open.next_id += 1;
        let close = Arc::new(Notify::new());
        open.slots.insert(
            id,
            Entry {
                peer,
                idle_since: Some(Instant::now()),
                close: close.clone(),
            },
        );
        *open.per_peer.entry(peer).or_insert(0) += 1;
        Ok(Admitted {
            slot: Slot {
                admission: self.clone(),
                id,
                close,
            },
            evicted,
        })
    }

    #[cfg(test)]
    fn open(&self) -> usize {
        self.lock().slots.len()
    }
}

/// One admitted connection; gives its place back when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    admission: Arc<Admission>,
    id: u64,
    close: Arc<Notify>,
}

impl Slot {
    /// Resolves when this connection was closed to make room for a newer one.
    pub(crate) async fn evicted(&self) {
        self.close.notified().await
    }

    /// A request is being answered: this connection may not be closed to make room.
    pub(crate) fn busy(&self) {
        if let Some(entry) = self.admission.lock().slots.get_mut(&self.id) {
            entry.idle_since = None;
        }
    }

    /// The answer is sent: idle again, from now.
    pub(crate) fn idle(&self) {
        if let Some(entry) = self.admission.lock().slots.get_mut(&self.id) {
            entry.idle_since = Some(Instant::now());
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Already gone when it was evicted.
        self.admission.lock().remove(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(i: usize) -> IpAddr {
        IpAddr::from([10, 1, (i / 256) as u8, (i % 256) as u8])
    }

    #[test]
    fn a_full_peer_closes_its_own_idle_longest() {
        let admission = Arc::new(Admission::default());
        let node: IpAddr = "10.0.0.1".parse().expect("address");
        let other: IpAddr = "10.0.0.2".parse().expect("address");
        let theirs = admission.admit(other).expect("admitted").slot;
        let held: Vec<Slot> = (0..PER_PEER)
            .map(|_| admission.admit(node).expect("within the share").slot)
            .collect();
        // The probe from the same address is admitted; the first of the 16 makes room.
        let probe = admission
            .admit(node)
            .expect("never refused while one is idle");
        assert_eq!(probe.evicted, [Limit::PerPeer]);
        assert!(!admission.lock().slots.contains_key(&held[0].id));
        assert!(
            admission.lock().slots.contains_key(&theirs.id),
            "not another peer's"
        );
        assert_eq!(admission.open(), PER_PEER + 1);
        drop(held);
        assert_eq!(admission.open(), 2, "slots come back, an evicted one once");
    }

    #[test]
    fn busy_connections_are_never_closed_to_make_room() {
        let admission = Arc::new(Admission::default());
        let node: IpAddr = "10.0.0.1".parse().expect("address");
        let held: Vec<Slot> = (0..PER_PEER)
            .map(|_| admission.admit(node).expect("admitted").slot)
            .collect();
        for slot in &held {
            slot.busy();
        }
        assert_eq!(admission.admit(node).err(), Some(Limit::PerPeer));
        // One answered: it is the only one that may go.
        held[5].idle();
        let admitted = admission.admit(node).expect("room made");
        assert_eq!(admitted.evicted, [Limit::PerPeer]);
        assert!(!admission.lock().slots.contains_key(&held[5].id));
    }

    #[test]
    fn a_full_port_closes_the_idle_longest_of_all() {
        let admission = Arc::new(Admission::default());
        let held: Vec<Slot> = (0..TOTAL)
            .map(|i| admission.admit(address(i)).expect("within the total").slot)
            .collect();
        held[0].busy();
        let newcomer = admission.admit(address(TOTAL)).expect("room made");
        assert_eq!(newcomer.evicted, [Limit::Total]);
        // held[0] is busy: held[1] was idle longest.
        assert!(admission.lock().slots.contains_key(&held[0].id));
        assert!(!admission.lock().slots.contains_key(&held[1].id));
        assert_eq!(admission.open(), TOTAL);
        for slot in &held {
            slot.busy();
        }
        newcomer.slot.busy();
        assert_eq!(admission.admit(address(0)).err(), Some(Limit::Total));
    }

    #[tokio::test]
    async fn an_evicted_connection_is_told() {
        let admission = Arc::new(Admission::default());
        let node: IpAddr = "10.0.0.1".parse().expect("address");
        let first = admission.admit(node).expect("admitted").slot;
        let _rest: Vec<Slot> = (1..PER_PEER)
            .map(|_| admission.admit(node).expect("admitted").slot)
            .collect();
        let _probe = admission.admit(node).expect("admitted");
        // Told before it waited: the permit is kept.
        tokio::time::timeout(std::time::Duration::from_secs(5), first.evicted())
            .await
            .expect("the evicted connection is told");
    }
}
