//! One iteration's results: at most one per rank, in rank order.

use serde::{Deserialize, Serialize};

use crate::ids::{Attempt, Iteration, Rank};

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

impl std::ops::AddAssign for Drops {
    /// Counts `other`'s drops too, kind by kind.
    fn add_assign(&mut self, other: Drops) {
        self.stale += other.stale;
        self.duplicate += other.duplicate;
        self.unknown_rank += other.unknown_rank;
    }
}

/// One rank's place in a round.
#[derive(Debug, Clone)]
enum Slot<T> {
    /// Nothing arrived yet.
    Empty,
    /// Arrived and kept.
    Held(T),
    /// Arrived and already handed out by [`Round::take_next`].
    Taken,
    /// Left out of the round: not waited for, and an arrival from it is stale.
    Out,
}

/// The results of one iteration of one attempt.
///
/// Call order: [`open`](Round::open) an iteration, [`offer`](Round::offer) arrivals in any
/// order, then [`close`](Round::close) to take what arrived in rank order. While closed,
/// every arrival is stale. A driver that folds results as they arrive takes the ranks'
/// results in rank order with [`take_next`](Round::take_next) while the round is open:
/// rank `r` is handed out once ranks `0..r` were, so the round holds only the results that
/// arrived ahead of a missing lower rank.
#[derive(Debug, Clone)]
pub struct Round<T> {
    attempt: Attempt,
    iteration: Iteration,
    open: bool,
    slots: Vec<Slot<T>>,
    filled: usize,
    out: usize,
    held: usize,
    next: Rank,
    drops: Drops,
}

impl<T> Round<T> {
    /// A closed round for `workers` ranks.
    pub fn new(workers: usize) -> Self {
        Round {
            attempt: 0,
            iteration: 0,
            open: false,
            slots: (0..workers).map(|_| Slot::Empty).collect(),
            filled: 0,
            out: 0,
            held: 0,
            next: 0,
            drops: Drops::default(),
        }
    }

    /// Opens the round for `iteration` of `attempt`, forgetting anything not taken.
    pub fn open(&mut self, attempt: Attempt, iteration: Iteration) {
        self.attempt = attempt;
        self.iteration = iteration;
        self.open = true;
        self.slots.iter_mut().for_each(|s| *s = Slot::Empty);
        self.filled = 0;
        self.out = 0;
        self.held = 0;
        self.next = 0;
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
        if matches!(slot, Slot::Out) {
            self.drops.stale += 1;
            return Offer::Stale;
        }
        if !matches!(slot, Slot::Empty) {
            self.drops.duplicate += 1;
            return Offer::Duplicate;
        }
        *slot = Slot::Held(item);
        self.filled += 1;
        self.held += 1;
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
        self.filled + self.out == self.slots.len()
    }

    /// Leaves `rank` out of this round, if nothing arrived from it yet: the round no
    /// longer waits for it, [`take_next`](Round::take_next) passes over it, and its
    /// arrival is stale. Returns whether it was left out. A lost worker's rank is left
    /// out; so are the stragglers when a round completes with its quorum.
    pub fn leave_out(&mut self, rank: Rank) -> bool {
        match self.slots.get_mut(rank) {
            Some(slot @ Slot::Empty) => {
                *slot = Slot::Out;
                self.out += 1;
                true
            }
            _ => false,
        }
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
            .filter(|(_, s)| matches!(s, Slot::Empty))
            .map(|(r, _)| r)
            .collect()
    }

    /// How many arrivals the round holds now: delivered and not yet taken.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Whether the round holds `rank`'s arrival now: delivered and not yet taken.
    pub fn holds(&self, rank: Rank) -> bool {
        matches!(self.slots.get(rank), Some(Slot::Held(_)))
    }

    /// Takes the next rank's result in rank order, if it arrived and every lower rank's was
    /// taken before; `None` while that rank is missing or after the last rank.
    pub fn take_next(&mut self) -> Option<(Rank, T)> {
        while matches!(self.slots.get(self.next), Some(Slot::Out)) {
            self.next += 1;
        }
        let rank = self.next;
        let slot = self.slots.get_mut(rank)?;
        match std::mem::replace(slot, Slot::Taken) {
            Slot::Held(item) => {
                self.next += 1;
                self.held -= 1;
                Some((rank, item))
            }
            other => {
                *slot = other;
                None
            }
        }
    }

    /// Closes the round, handing what arrived and was not taken yet to `take`, in rank
    /// order; returns the ranks that delivered in the round (taken before or now) and
    /// those left out, each in rank order — one pass over the ranks.
    pub fn close_each(&mut self, take: impl FnMut(Rank, T)) -> (Vec<Rank>, Vec<Rank>) {
        let mut reported = Vec::new();
        let left_out = self.close_into(&mut reported, take);
        (reported, left_out)
    }

    /// As [`close_each`](Self::close_each), the ranks that delivered put in `reported`
    /// (emptied first): a buffer kept from round to round. Returns those left out.
    pub fn close_into(
        &mut self,
        reported: &mut Vec<Rank>,
        mut take: impl FnMut(Rank, T),
    ) -> Vec<Rank> {
        reported.clear();
        reported.reserve(self.filled);
        let mut left_out = Vec::new();
        self.open = false;
        self.filled = 0;
        self.out = 0;
        self.held = 0;
        for (rank, slot) in self.slots.iter_mut().enumerate() {
            match std::mem::replace(slot, Slot::Empty) {
                Slot::Held(item) => {
                    reported.push(rank);
                    take(rank, item);
                }
                Slot::Taken => reported.push(rank),
                Slot::Out => left_out.push(rank),
                Slot::Empty => {}
            }
        }
        left_out
    }

    /// Closes the round and takes what arrived and was not taken yet, in rank order.
    pub fn close(&mut self) -> Vec<(Rank, T)> {
        let mut held = Vec::with_capacity(self.held);
        self.close_each(|rank, item| held.push((rank, item)));
        held
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

    #[test]
    fn results_are_taken_in_rank_order_as_soon_as_every_lower_rank_was_taken() {
        let mut round = Round::new(4);
        round.open(0, 1);
        round.offer(1, 0, 1, "b");
        round.offer(3, 0, 1, "d");
        assert_eq!(round.take_next(), None, "rank 0 is missing");
        assert_eq!(round.held(), 2);
        round.offer(0, 0, 1, "a");
        assert_eq!(round.take_next(), Some((0, "a")));
        assert_eq!(round.take_next(), Some((1, "b")));
        assert_eq!(round.take_next(), None, "rank 2 is missing");
        assert_eq!(round.held(), 1);
        assert_eq!(
            round.offer(1, 0, 1, "b2"),
            Offer::Duplicate,
            "taken is delivered"
        );
        assert_eq!(round.offer(2, 0, 1, "c"), Offer::Completed);
        assert_eq!(round.take_next(), Some((2, "c")));
        assert_eq!(round.take_next(), Some((3, "d")));
        assert_eq!(round.take_next(), None, "past the last rank");
        assert_eq!(round.held(), 0);
        assert!(round.close().is_empty(), "everything was taken");
        round.open(0, 2);
        assert_eq!(
            round.take_next(),
            None,
            "a new round starts again at rank 0"
        );
        round.offer(0, 0, 2, "a");
        assert_eq!(round.take_next(), Some((0, "a")));
    }

    #[test]
    fn a_rank_left_out_is_not_waited_for_and_its_late_result_is_stale() {
        let mut round = Round::new(4);
        round.open(0, 1);
        round.offer(2, 0, 1, "c");
        round.offer(0, 0, 1, "a");
        assert!(round.leave_out(1));
        assert!(!round.leave_out(2), "rank 2 reported");
        assert_eq!(round.take_next(), Some((0, "a")));
        assert_eq!(round.take_next(), Some((2, "c")), "rank 1 is passed over");
        assert_eq!(round.take_next(), None);
        assert_eq!(round.missing(), vec![3]);
        assert_eq!(round.offer(1, 0, 1, "late"), Offer::Stale);
        assert_eq!(round.offer(3, 0, 1, "d"), Offer::Completed);
        let mut taken = Vec::new();
        let (reported, left_out) = round.close_each(|rank, item| taken.push((rank, item)));
        assert_eq!((reported, left_out), (vec![0, 2, 3], vec![1]));
        assert_eq!(taken, vec![(3, "d")]);
        round.open(0, 2);
        assert_eq!(
            round.missing(),
            vec![0, 1, 2, 3],
            "a new round waits for everyone"
        );
    }

    #[test]
    fn closing_in_one_pass_says_who_reported_who_was_left_out_and_hands_over_the_rest() {
        let fill = |round: &mut Round<&'static str>| {
            round.open(0, 1);
            round.offer(3, 0, 1, "d");
            round.offer(0, 0, 1, "a");
            assert!(round.leave_out(2));
            assert_eq!(round.take_next(), Some((0, "a")));
            round.offer(4, 0, 1, "e");
        };
        let (mut one, mut other) = (Round::new(6), Round::new(6));
        fill(&mut one);
        fill(&mut other);
        let mut taken = Vec::new();
        let (reported, left_out) = one.close_each(|rank, item| taken.push((rank, item)));
        assert_eq!(taken, other.close());
        assert_eq!(taken, vec![(3, "d"), (4, "e")]);
        assert_eq!((reported, left_out), (vec![0, 3, 4], vec![2]));
        assert!(!one.is_open());
        assert_eq!(one.offer(1, 0, 1, "late"), Offer::Stale, "closed");
    }
}
