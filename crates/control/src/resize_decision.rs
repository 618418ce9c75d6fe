//! Resize windows, the controller's side: whether a new generation starts a pool's window,
//! keeps the running one or has none, when a window ends, and how many keys it moves (for
//! the log line). The window itself (the previous placement and its servers) is what the
//! data plane runs: memroute-proxy's `resize_window::Window`.
use std::time::{Duration, Instant};

use memroute_config::PoolConfig;
use memroute_routing::Placement;

/// What a new generation does with a pool's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// No window (off, nothing before, or the running one ended).
    None,
    /// The running window goes on unchanged.
    Keep,
    /// A new window from the placement in force just before this generation.
    Start,
}

/// Decides a pool's window for a new generation. `before`: the pool as the generation
/// being replaced served it (`None` when it had no such pool); `running_ends`: the end of
/// the window running now.
pub(crate) fn decide(
    before: Option<&PoolConfig>,
    after: &PoolConfig,
    running_ends: Option<Instant>,
    now: Instant,
) -> Decision {
    if after.resize_window.is_zero() {
        return Decision::None;
    }
    let Some(before) = before else {
        return Decision::None;
    };
    // Only what places keys counts: new timeouts or TLS settings move no key.
    if before.placement != after.placement && !before.servers.is_empty() {
        return Decision::Start;
    }
    match running_ends {
        Some(ends) if ends > now => Decision::Keep,
        _ => Decision::None,
    }
}

/// The share of keys whose owner differs between `before` and `after`, estimated from a
/// fixed sample of keys (cheap enough to compute once per window start). The sample keys
/// differ in every character, not only the last: with hashes that mix a key's last bytes
/// little (fnv1a under ketama), keys counting up in one suffix land on the ring side by
/// side and would measure one arc many times.
pub(crate) fn moved_share(before: &Placement, after: &Placement) -> f64 {
    const SAMPLE: u64 = 4096;
    let moved = (0..SAMPLE)
        .filter(|&i| {
            let key = format!("memroute-resize-sample-{:016x}", splitmix64(i));
            before.server_for(key.as_bytes()) != after.server_for(key.as_bytes())
        })
        .count();
    moved as f64 / SAMPLE as f64
}

/// A fixed, well-spread 64-bit number for each `i` (SplitMix64's output function).
fn splitmix64(i: u64) -> u64 {
    let mut z = i.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// When a window that starts `now` for `pool` ends.
pub(crate) fn end_of(pool: &PoolConfig, now: Instant) -> Instant {
    now + pool.resize_window.min(Duration::from_secs(365 * 24 * 3600))
}

#[cfg(test)]
mod tests {
    use super::*;
    use memroute_config::ServerConfig;

    fn pool(servers: &[&str], window: Duration) -> PoolConfig {
        let mut pool = PoolConfig::new(
            servers
                .iter()
                .map(|a| ServerConfig {
                    address: a.to_string(),
                    weight: 1,
                    name: None,
                })
                .collect(),
        );
        pool.resize_window = window;
        pool
    }

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn a_changed_server_list_starts_a_window() {
        let now = Instant::now();
        let four = pool(&["a:1", "b:1", "c:1", "d:1"], MINUTE);
        let five = pool(&["a:1", "b:1", "c:1", "d:1", "e:1"], MINUTE);
        assert_eq!(decide(Some(&four), &five, None, now), Decision::Start);
        assert_eq!(decide(Some(&five), &four, None, now), Decision::Start);
    }

    #[test]
    fn a_change_during_a_window_starts_a_new_one() {
        let now = Instant::now();
        let four = pool(&["a:1", "b:1", "c:1", "d:1"], MINUTE);
        let five = pool(&["a:1", "b:1", "c:1", "d:1", "e:1"], MINUTE);
        assert_eq!(
            decide(Some(&five), &four, Some(now + MINUTE), now),
            Decision::Start
        );
    }

    #[test]
    fn an_unchanged_placement_keeps_a_running_window_until_it_ends() {
        let now = Instant::now();
        let five = pool(&["a:1", "b:1", "c:1", "d:1", "e:1"], MINUTE);
        let mut slower = five.clone();
        slower.timeout = Duration::from_secs(1);
        assert_eq!(
            decide(Some(&five), &slower, Some(now + MINUTE), now),
            Decision::Keep
        );
        assert_eq!(decide(Some(&five), &slower, None, now), Decision::None);
        assert_eq!(decide(Some(&five), &five, Some(now), now), Decision::None);
    }

    #[test]
    fn no_window_when_off_new_or_empty_before() {
        let now = Instant::now();
        let four = pool(&["a:1", "b:1", "c:1", "d:1"], MINUTE);
        let off = pool(&["a:1", "b:1", "c:1", "d:1", "e:1"], Duration::ZERO);
        assert_eq!(
            decide(Some(&four), &off, Some(now + MINUTE), now),
            Decision::None
        );
        let five = pool(&["a:1", "b:1", "c:1", "d:1", "e:1"], MINUTE);
        assert_eq!(decide(None, &five, None, now), Decision::None);
        let empty = pool(&[], MINUTE);
        assert_eq!(decide(Some(&empty), &five, None, now), Decision::None);
    }

    #[test]
    fn adding_a_fifth_server_moves_about_a_fifth_of_the_keys() {
        let four = pool(&["a:1", "b:1", "c:1", "d:1"], MINUTE);
        let five = pool(&["a:1", "b:1", "c:1", "d:1", "e:1"], MINUTE);
        let before = Placement::new(&four.placement_spec());
        let after = Placement::new(&five.placement_spec());
        let share = moved_share(&before, &after);
        assert!((0.1..0.3).contains(&share), "{share}");
        assert_eq!(moved_share(&before, &before), 0.0);
    }
}
