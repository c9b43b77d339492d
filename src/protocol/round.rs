//! One iteration's results: at most one per rank, in rank order.

use serde::{Deserialize, Serialize};

use super::{Attempt, Iteration, Rank};

/// What [`Round::offer`] did with an arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Kept; the round still misses some ranks.
    Accepted,
    /// Kept, and it was the last rank missing: the round is complete.
    Completed,
    /// Dropped: it belongs to another attempt or iteration, or the round is closed.
    Stale,
    /// Dropped: this rank already delivered a result in this round.
    Duplicate,
    /// Dropped: no worker has this rank.
    UnknownRank,
}

/// How many arrivals were dropped, and why. Never folded, always counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drops {
    /// Results of another attempt or iteration, or of a closed round.
    pub stale: u64,
    /// Second and later results of a rank in one round.
    pub duplicate: u64,
    /// Results from a rank outside `0..workers`.
    pub unknown_rank: u64,
}

impl Drops {
    /// All dropped arrivals.
    pub fn total(&self) -> u64 {
        self.stale + self.duplicate + self.unknown_rank
    }
}

/// The results of one iteration of one attempt.
///
/// Call order: [`open`](Round::open) an iteration, [`offer`](Round::offer) arrivals in any
/// order, then [`close`](Round::close) to take what arrived in rank order. While closed,
/// every arrival is stale.
#[derive(Debug, Clone)]
pub struct Round<T> {
    attempt: Attempt,
    iteration: Iteration,
    open: bool,
    slots: Vec<Option<T>>,
    filled: usize,
    drops: Drops,
}

impl<T> Round<T> {
    /// A closed round for `workers` ranks.
    pub fn new(workers: usize) -> Self {
        Round {
            attempt: 0,
            iteration: 0,
            open: false,
            slots: (0..workers).map(|_| None).collect(),
            filled: 0,
            drops: Drops::default(),
        }
    }

    /// Opens the round for `iteration` of `attempt`, forgetting anything not taken.
    pub fn open(&mut self, attempt: Attempt, iteration: Iteration) {
        self.attempt = attempt;
        self.iteration = iteration;
        self.open = true;
        self.slots.iter_mut().for_each(|s| *s = None);
        self.filled = 0;
    }

    /// Offers one arrival from `from`, tagged with the attempt and iteration it was
    /// computed for.
    pub fn offer(&mut self, from: Rank, attempt: Attempt, iteration: Iteration, item: T) -> Offer {
        if from >= self.slots.len() {
            self.drops.unknown_rank += 1;
            return Offer::UnknownRank;
        }
        if !self.open || attempt != self.attempt || iteration != self.iteration {
            self.drops.stale += 1;
            return Offer::Stale;
        }
        let slot = &mut self.slots[from];
        if slot.is_some() {
            self.drops.duplicate += 1;
            return Offer::Duplicate;
        }
        *slot = Some(item);
        self.filled += 1;
        if self.is_complete() {
            Offer::Completed
        } else {
            Offer::Accepted
        }
    }

    /// Whether the round is open.
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// The iteration the round is (or was last) open for.
    pub fn iteration(&self) -> Iteration {
        self.iteration
    }

    /// Whether every rank delivered.
    pub fn is_complete(&self) -> bool {
        self.filled == self.slots.len()
    }

    /// How many ranks delivered.
    pub fn filled(&self) -> usize {
        self.filled
    }

    /// The ranks that did not deliver yet, ascending.
    pub fn missing(&self) -> Vec<Rank> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_none())
            .map(|(r, _)| r)
            .collect()
    }

    /// Closes the round and takes what arrived, in rank order.
    pub fn close(&mut self) -> Vec<(Rank, T)> {
        self.open = false;
        self.filled = 0;
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(|(r, s)| s.take().map(|t| (r, t)))
            .collect()
    }

    /// What was dropped so far, over every iteration.
    pub fn drops(&self) -> Drops {
        self.drops
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_completes_when_every_rank_delivered_and_hands_them_in_rank_order() {
        let mut round = Round::new(3);
        round.open(0, 1);
        assert_eq!(round.offer(2, 0, 1, "c"), Offer::Accepted);
        assert_eq!(round.offer(0, 0, 1, "a"), Offer::Accepted);
        assert_eq!(round.missing(), vec![1]);
        assert_eq!(round.offer(1, 0, 1, "b"), Offer::Completed);
        assert_eq!(round.close(), vec![(0, "a"), (1, "b"), (2, "c")]);
    }

    #[test]
    fn stale_duplicate_and_unknown_arrivals_are_dropped_and_counted() {
        let mut round = Round::new(2);
        assert_eq!(round.offer(0, 0, 1, 1), Offer::Stale, "closed round");
        round.open(1, 5);
        assert_eq!(round.offer(0, 0, 5, 1), Offer::Stale, "old attempt");
        assert_eq!(round.offer(0, 1, 4, 1), Offer::Stale, "old iteration");
        assert_eq!(round.offer(0, 1, 6, 1), Offer::Stale, "future iteration");
        assert_eq!(round.offer(0, 1, 5, 1), Offer::Accepted);
        assert_eq!(round.offer(0, 1, 5, 2), Offer::Duplicate);
        assert_eq!(round.offer(9, 1, 5, 1), Offer::UnknownRank);
        assert_eq!(
            round.drops(),
            Drops {
                stale: 4,
                duplicate: 1,
                unknown_rank: 1
            }
        );
        assert_eq!(round.close(), vec![(0, 1)], "the first arrival wins");
    }
}
