//! Who may hold the master's node's time before proving the secret, and what is said of
//! those turned away.
//!
//! - [`Unproven`]: the handshake slots. At most [`SLOTS`] connections may be in their
//!   handshake at once; a new connection that finds them full takes the slot of the
//!   *oldest* unauthenticated connection — of its own address when that address holds
//!   [`SLOTS_PER_PEER`] or more, so that one address flooding cannot push out another's. An authenticated worker's handshake
//!   takes two round trips, so idle or trickling connections — which can only grow old —
//!   are the ones dropped; a worker dropped anyway finds its connection closed without a
//!   refusal and tries again.
//! - [`Refusals`]: the log of refused connections, rate-limited — the first of each kind
//!   in an interval is logged as it happens, the rest are counted and summed up once per
//!   interval — and, by the rank each peer claimed, the latest refusals, for the master's
//!   waiting messages and the error that ends a start-up nobody completed.

use std::collections::{BTreeMap, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::ids::Rank;

/// How many connections may be in their handshake at once.
pub(super) const SLOTS: usize = 64;
/// How many of those one address may hold before, the slots being full, its new
/// connections make room among its own.
pub(super) const SLOTS_PER_PEER: usize = 16;
/// How often a summary of refused connections is logged, and at most how long a wait
/// goes on between two lines that say so.
pub(super) const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// How often a wait of at most `timeout` says it goes on: a quarter of it, at most every
/// [`LOG_INTERVAL`].
pub(super) fn log_every(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(100), LOG_INTERVAL)
}

/// The connections in their handshake, oldest first.
#[derive(Debug, Default)]
pub(super) struct Unproven {
    next: u64,
    slots: VecDeque<(u64, IpAddr, CancellationToken)>,
}

impl Unproven {
    /// Admits a new connection from `ip`: its id, and the token that is cancelled if a
    /// newer one takes its slot.
    pub(super) fn admit(&mut self, ip: IpAddr) -> (u64, CancellationToken) {
        if self.slots.len() >= SLOTS {
            let from_ip = self.slots.iter().filter(|(_, i, _)| *i == ip).count();
            let evict = if from_ip >= SLOTS_PER_PEER {
                self.slots.iter().position(|(_, i, _)| *i == ip)
            } else {
                Some(0)
            };
            if let Some((_, _, token)) = evict.and_then(|at| self.slots.remove(at)) {
                token.cancel();
            }
        }
        let id = self.next;
        self.next += 1;
        let token = CancellationToken::new();
        self.slots.push_back((id, ip, token.clone()));
        (id, token)
    }

    /// The connection `id` left its handshake (proven, refused, timed out or dropped).
    pub(super) fn leave(&mut self, id: u64) {
        if let Some(at) = self.slots.iter().position(|(i, _, _)| *i == id) {
            self.slots.remove(at);
        }
    }

    /// How many connections are in their handshake.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }
}

/// The latest refusal of a peer that claimed a rank.
#[derive(Debug, Clone)]
struct Noted {
    peer: String,
    reason: String,
    times: u64,
}

/// Refused connections: a rate-limited log, and the latest refusal by claimed rank.
#[derive(Debug)]
pub(super) struct Refusals {
    workers: usize,
    /// By kind: how many were refused since the last summary beyond the first (which was
    /// logged), and the latest example.
    counted: BTreeMap<&'static str, (u64, String)>,
    by_rank: BTreeMap<Rank, Noted>,
    since: Instant,
}

impl Refusals {
    pub(super) fn new(workers: usize, now: Instant) -> Self {
        Refusals {
            workers,
            counted: BTreeMap::new(),
            by_rank: BTreeMap::new(),
            since: now,
        }
    }

    /// A connection from `peer`, which claimed `rank` (if it got that far), was turned
    /// away for `reason`, of kind `kind`. Logged at once if it is the first of its kind in
    /// this interval; counted otherwise.
    pub(super) fn note(
        &mut self,
        peer: &str,
        rank: Option<Rank>,
        kind: &'static str,
        reason: &str,
    ) {
        if let Some(rank) = rank.filter(|&r| r < self.workers) {
            let times = self.by_rank.get(&rank).map_or(0, |n| n.times) + 1;
            let (peer, reason) = (peer.to_string(), reason.to_string());
            self.by_rank.insert(
                rank,
                Noted {
                    peer,
                    reason,
                    times,
                },
            );
        }
        match self.counted.get_mut(kind) {
            Some((count, example)) => {
                *count += 1;
                *example = format!("{peer}: {reason}");
            }
            None => {
                self.counted.insert(kind, (0, String::new()));
                match rank {
                    Some(rank) => tracing::warn!(%peer, rank, %reason, "refused a connection"),
                    None => tracing::warn!(%peer, %reason, "refused a connection"),
                }
            }
        }
    }

    /// Logs what was counted and not logged in the interval that ended, if it has; a new
    /// interval starts.
    pub(super) fn flush(&mut self, now: Instant) {
        if now.saturating_duration_since(self.since) < LOG_INTERVAL {
            return;
        }
        let interval = now.saturating_duration_since(self.since);
        self.since = now;
        let counted = std::mem::take(&mut self.counted);
        for (kind, (count, example)) in counted {
            if count > 0 {
                tracing::warn!(
                    count,
                    %kind,
                    latest = %example,
                    "refused {count} more connection(s) for {kind} in the last {interval:.0?}"
                );
            }
        }
    }

    /// The latest refusal of every peer that claimed one of `ranks`, as
    /// `rank 2 from 10.0.0.5:41722: wrong secret (3 times)`.
    pub(super) fn of(&self, ranks: &[Rank]) -> Vec<String> {
        ranks
            .iter()
            .filter_map(|rank| {
                let n = self.by_rank.get(rank)?;
                let times = match n.times {
                    1 => String::new(),
                    t => format!(" ({t} times)"),
                };
                Some(format!("rank {rank} from {}: {}{times}", n.peer, n.reason))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn a_full_table_drops_its_oldest_unproven_connection_first() {
        let mut u = Unproven::default();
        let mut tokens = Vec::new();
        for i in 0..SLOTS {
            // Spread over enough addresses to stay within each one's budget.
            let (_, token) = u.admit(ip((i % 8) as u8));
            tokens.push(token);
        }
        assert!(tokens.iter().all(|t| !t.is_cancelled()), "room for all");
        let (newest, _) = u.admit(ip(200));
        assert_eq!(u.len(), SLOTS);
        assert!(tokens[0].is_cancelled(), "the oldest made room");
        assert!(tokens[1..].iter().all(|t| !t.is_cancelled()));
        u.leave(newest);
        assert_eq!(u.len(), SLOTS - 1);
    }

    #[test]
    fn one_address_with_many_slots_makes_room_among_its_own_when_full() {
        let mut u = Unproven::default();
        let (_, other) = u.admit(ip(1));
        // Workers of one host connecting together: no one is dropped while there is room.
        let own: Vec<_> = (1..SLOTS).map(|_| u.admit(ip(2)).1).collect();
        assert!(own.iter().all(|t| !t.is_cancelled()));
        // Full: the flooding address gives up its own oldest, not the other's older one.
        u.admit(ip(2));
        assert!(own[0].is_cancelled(), "its own oldest made room");
        assert!(
            !other.is_cancelled(),
            "another address's older connection stays"
        );
        assert_eq!(u.len(), SLOTS);
    }

    #[test]
    fn refusals_are_counted_by_kind_and_remembered_by_rank() {
        let start = Instant::now();
        let mut r = Refusals::new(4, start);
        for _ in 0..3 {
            r.note("10.0.0.5:1", Some(2), "a wrong secret", "wrong secret");
        }
        r.note("10.0.0.6:1", Some(9), "a wrong secret", "wrong secret");
        r.note("10.0.0.7:1", None, "a broken handshake", "garbage");
        assert_eq!(r.counted["a wrong secret"].0, 3, "the first was logged");
        assert_eq!(
            r.of(&[1, 2]),
            vec!["rank 2 from 10.0.0.5:1: wrong secret (3 times)".to_string()]
        );
        r.flush(start + LOG_INTERVAL);
        assert!(r.counted.is_empty(), "a new interval");
        assert_eq!(
            r.of(&[2]).len(),
            1,
            "what each rank's peers were told stays"
        );
    }
}
