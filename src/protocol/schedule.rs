//! The master's loop: which iteration is next, and when the job ends.

use serde::{Deserialize, Serialize};

use crate::ids::Iteration;
use crate::protocol::Tally;

/// Who halted the job before its iteration count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum HaltedBy {
    /// The master's compute returned `Step::Halt`.
    Master,
    /// Every worker voted to halt, and `worker_halt` is on.
    Workers,
}

/// What the master does after computing an iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Broadcast the master result and start this iteration.
    Iterate(Iteration),
    /// The job is complete.
    Finish {
        /// How many iterations ran.
        iterations: Iteration,
        /// Who halted it, if it ended before its iteration count.
        halted: Option<HaltedBy>,
    },
}

/// The master's iteration loop.
///
/// Call order: [`new`](Schedule::new) when an attempt starts (a restart of every worker
/// builds a new one); [`first`](Schedule::first) is the iteration a job that resumed from
/// no checkpoint opens with; after the master computed iteration `i`,
/// [`decide`](Schedule::decide) with the master's own halt and the round's halt votes
/// says whether `i + 1` follows or the job ends; [`leave_out`](Schedule::leave_out) each
/// time a worker is gone for good, before the next `decide`. It holds no clock and no
/// result: the node keeps those.
#[derive(Debug, Clone)]
pub struct Schedule {
    iterations: Iteration,
    worker_halt: bool,
    workers: usize,
}

impl Schedule {
    /// A loop of at most `iterations` iterations over `workers` workers; `worker_halt`
    /// makes a unanimous worker vote halt the job.
    pub fn new(iterations: Iteration, workers: usize, worker_halt: bool) -> Self {
        Schedule {
            iterations,
            worker_halt,
            workers,
        }
    }

    /// The first iteration.
    pub fn first(&self) -> Iteration {
        1
    }

    /// A worker is gone for good (`FailurePolicy::ContinueWithout`): a unanimous halt vote
    /// is that of the workers left.
    pub fn leave_out(&mut self) {
        self.workers = self.workers.saturating_sub(1);
    }

    /// Whether halt votes count: `worker_halt` is on.
    pub fn counts_votes(&self) -> bool {
        self.worker_halt
    }

    /// Decides what follows `iteration`, given the master's own halt and the round's
    /// tally: the workers that voted to halt in it, and the messages they sent. A
    /// unanimous vote halts the job only when no message is on its way to the next
    /// iteration (Pregel's end: a message wakes the worker it is sent to).
    pub fn decide(&self, iteration: Iteration, master_halt: bool, tally: &Tally) -> Next {
        let halted = if master_halt {
            Some(HaltedBy::Master)
        } else if self.worker_halt
            && self.workers > 0
            && tally.halt_votes == self.workers
            && tally.mail.delivered == 0
        {
            Some(HaltedBy::Workers)
        } else {
            None
        };
        if halted.is_some() || iteration >= self.iterations {
            Next::Finish {
                iterations: iteration,
                halted,
            }
        } else {
            Next::Iterate(iteration + 1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn votes(halt_votes: usize) -> Tally {
        Tally {
            halt_votes,
            ..Tally::default()
        }
    }

    #[test]
    fn a_unanimous_vote_halts_only_once_no_message_is_on_its_way() {
        let s = Schedule::new(10, 2, true);
        let mut tally = votes(2);
        tally.mail.sent = 3;
        tally.mail.delivered = 1;
        assert_eq!(s.decide(4, false, &tally), Next::Iterate(5));
        tally.mail = Default::default();
        assert_eq!(
            s.decide(5, false, &tally),
            Next::Finish {
                iterations: 5,
                halted: Some(HaltedBy::Workers)
            }
        );
    }

    #[test]
    fn a_unanimous_vote_is_that_of_the_workers_left() {
        let mut s = Schedule::new(10, 3, true);
        assert_eq!(s.decide(2, false, &votes(2)), Next::Iterate(3));
        s.leave_out();
        assert_eq!(
            s.decide(2, false, &votes(2)),
            Next::Finish {
                iterations: 2,
                halted: Some(HaltedBy::Workers)
            }
        );
    }

    #[test]
    fn the_iteration_count_ends_the_loop() {
        let s = Schedule::new(3, 2, false);
        assert_eq!(s.decide(1, false, &votes(0)), Next::Iterate(2));
        assert_eq!(
            s.decide(3, false, &votes(0)),
            Next::Finish {
                iterations: 3,
                halted: None
            }
        );
    }

    #[test]
    fn the_master_halts_and_workers_halt_only_when_enabled_and_unanimous() {
        let off = Schedule::new(10, 2, false);
        assert_eq!(
            off.decide(2, true, &votes(0)),
            Next::Finish {
                iterations: 2,
                halted: Some(HaltedBy::Master)
            }
        );
        assert_eq!(off.decide(2, false, &votes(2)), Next::Iterate(3));
        let on = Schedule::new(10, 2, true);
        assert_eq!(on.decide(2, false, &votes(1)), Next::Iterate(3));
        assert_eq!(
            on.decide(2, false, &votes(2)),
            Next::Finish {
                iterations: 2,
                halted: Some(HaltedBy::Workers)
            }
        );
    }
}
