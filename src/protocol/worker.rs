//! A worker's view of the master's messages.

use super::ToWorker;

use crate::ids::{Attempt, Iteration};

/// Which of the master's messages a worker acts on.
///
/// A worker computes each iteration at most once, in increasing order, and stops once: an
/// `Iterate` of another attempt, of an iteration it computed already (or an earlier one),
/// or anything after it began to stop, is dropped and counted. It may skip ahead: a job
/// resumed from a checkpoint starts after the checkpoint's iteration, and each `Iterate`
/// carries the master result to compute with, so nothing in between is needed.
///
/// A worker whose link reaches a master's node again ([`ToWorker::Connected`] after the
/// first) — a master process started again, say — starts over in the attempt that node
/// runs: it registers again and computes whatever iteration it is sent next.
#[derive(Debug, Clone)]
pub struct WorkerState {
    attempt: Attempt,
    iteration: Iteration,
    stopping: bool,
    dropped: u64,
    connections: u32,
}

/// What a worker should do with a message from the master.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerCommand {
    /// Compute this iteration.
    Compute(Iteration),
    /// Run `post_application` and stop.
    Stop,
    /// Hand the answer to the compute waiting in its sync call (even while stopping: the
    /// compute may be waiting for exactly this).
    Answer,
    /// Register again, in this attempt, and drop any work under way: the link reached a
    /// master's node that has not seen this worker.
    Register(Attempt),
    /// Keep what the checkpoint the attempt resumes from holds for this worker, to
    /// restore before its next compute.
    Restore,
    /// Nothing to do: the link reached the master the worker started with, a gang
    /// restart into the attempt the worker runs in already, or the copy of a checkpoint
    /// (its process keeps it).
    Proceed,
    /// Drop the message: stale, duplicate, or after the worker began to stop.
    Drop,
}

impl WorkerState {
    /// A worker of `attempt` that has computed nothing yet.
    pub fn new(attempt: Attempt) -> Self {
        WorkerState {
            attempt,
            iteration: 0,
            stopping: false,
            dropped: 0,
            connections: 0,
        }
    }

    /// Decides what to do with `msg`.
    pub fn on_message<M>(&mut self, msg: &ToWorker<M>) -> WorkerCommand {
        let command = match *msg {
            ToWorker::SyncReply { attempt, .. } if attempt == self.attempt => WorkerCommand::Answer,
            ToWorker::SyncReply { .. } => WorkerCommand::Drop,
            // A gang restart: the worker's process replaced this worker by one of the new
            // attempt already (the master's node hosts it, or the transport's inbox did),
            // so this one runs in it. A worker of an older attempt still here was not
            // replaced: it drops the restart, and its messages stay stale.
            ToWorker::Restart { attempt, .. } if attempt <= self.attempt => WorkerCommand::Proceed,
            ToWorker::Restart { .. } => WorkerCommand::Drop,
            // Its process keeps the copy of a checkpoint, not the worker; its process
            // answers for its flight recorder.
            ToWorker::Replica(_) | ToWorker::Record => WorkerCommand::Proceed,
            // The transport's word, for the node: it changes nothing here.
            ToWorker::Reconnecting { .. } => WorkerCommand::Proceed,
            _ if self.stopping => WorkerCommand::Drop,
            ToWorker::Connected { attempt } => {
                self.connections += 1;
                if self.connections == 1 && attempt == self.attempt {
                    WorkerCommand::Proceed
                } else {
                    self.attempt = attempt;
                    self.iteration = 0;
                    WorkerCommand::Register(attempt)
                }
            }
            ToWorker::Iterate {
                attempt, iteration, ..
            } => {
                if self.takes(attempt, iteration) {
                    WorkerCommand::Compute(iteration)
                } else {
                    WorkerCommand::Drop
                }
            }
            // Before the attempt's first iteration, which it belongs to.
            ToWorker::Restore { attempt, .. } => {
                if attempt == self.attempt && self.iteration == 0 {
                    WorkerCommand::Restore
                } else {
                    WorkerCommand::Drop
                }
            }
            ToWorker::Finish { attempt, .. } | ToWorker::Abort { attempt, .. } => {
                if attempt == self.attempt {
                    self.stopping = true;
                    WorkerCommand::Stop
                } else {
                    WorkerCommand::Drop
                }
            }
        };
        if command == WorkerCommand::Drop {
            self.dropped += 1;
        }
        command
    }

    /// Whether the worker computes `iteration` of `attempt`, which the master sent it: of
    /// its attempt, later than any it was sent, and the worker not stopping. If so, it is
    /// the worker's iteration from now on. (An iteration it does not take is for
    /// [`on_message`](Self::on_message) to drop and count.)
    #[inline]
    pub fn takes(&mut self, attempt: Attempt, iteration: Iteration) -> bool {
        let takes = !self.stopping && attempt == self.attempt && iteration > self.iteration;
        if takes {
            self.iteration = iteration;
        }
        takes
    }

    /// Marks the worker as stopping on its own (its code failed).
    pub fn stop(&mut self) {
        self.stopping = true;
    }

    /// Whether the worker began to stop.
    pub fn is_stopping(&self) -> bool {
        self.stopping
    }

    /// The attempt the worker runs in.
    pub fn attempt(&self) -> Attempt {
        self.attempt
    }

    /// The last iteration the worker was told to compute.
    pub fn iteration(&self) -> Iteration {
        self.iteration
    }

    /// How many messages were dropped.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iterate(attempt: Attempt, iteration: Iteration) -> ToWorker<()> {
        ToWorker::Iterate {
            attempt,
            iteration,
            last: None,
            fold: crate::ids::FoldRoute::Star,
            save: false,
        }
    }

    #[test]
    fn iterations_are_computed_once_and_in_increasing_order() {
        let mut w = WorkerState::new(0);
        assert_eq!(w.on_message(&iterate(0, 1)), WorkerCommand::Compute(1));
        assert_eq!(w.on_message(&iterate(0, 1)), WorkerCommand::Drop);
        assert_eq!(w.on_message(&iterate(1, 2)), WorkerCommand::Drop);
        assert_eq!(w.on_message(&iterate(0, 2)), WorkerCommand::Compute(2));
        assert_eq!(
            w.on_message(&iterate(0, 5)),
            WorkerCommand::Compute(5),
            "skips ahead"
        );
        assert_eq!(
            w.on_message(&iterate(0, 4)),
            WorkerCommand::Drop,
            "never back"
        );
        assert_eq!(w.dropped(), 3);
    }

    #[test]
    fn a_worker_stops_once() {
        let mut w = WorkerState::new(0);
        let abort = ToWorker::<()>::Abort {
            attempt: 0,
            error: crate::JobError::Runtime {
                message: "x".into(),
            },
        };
        assert_eq!(w.on_message(&abort), WorkerCommand::Stop);
        assert_eq!(w.on_message(&abort), WorkerCommand::Drop);
        assert_eq!(w.on_message(&iterate(0, 1)), WorkerCommand::Drop);
    }

    #[test]
    fn a_worker_that_reaches_a_master_again_starts_over_in_its_attempt() {
        let mut w = WorkerState::new(0);
        let connected = |attempt| ToWorker::<()>::Connected { attempt };
        assert_eq!(w.on_message(&connected(0)), WorkerCommand::Proceed);
        assert_eq!(w.on_message(&iterate(0, 1)), WorkerCommand::Compute(1));
        assert_eq!(w.on_message(&iterate(0, 2)), WorkerCommand::Compute(2));
        // The master process was started again: attempt 1, from its checkpoint of 1.
        assert_eq!(w.on_message(&connected(1)), WorkerCommand::Register(1));
        assert_eq!(w.attempt(), 1);
        assert_eq!(
            w.on_message(&iterate(0, 3)),
            WorkerCommand::Drop,
            "old attempt"
        );
        assert_eq!(w.on_message(&iterate(1, 2)), WorkerCommand::Compute(2));
        // Reaching the same master again (a connection lost and made again) also starts over.
        assert_eq!(w.on_message(&connected(1)), WorkerCommand::Register(1));
        assert_eq!(w.on_message(&iterate(1, 2)), WorkerCommand::Compute(2));
        // A worker started in attempt 0 whose first master runs attempt 2.
        let mut late = WorkerState::new(0);
        assert_eq!(late.on_message(&connected(2)), WorkerCommand::Register(2));
        assert_eq!(late.on_message(&iterate(2, 5)), WorkerCommand::Compute(5));
        // A stopping worker registers nowhere.
        late.stop();
        assert_eq!(late.on_message(&connected(3)), WorkerCommand::Drop);
    }
}
