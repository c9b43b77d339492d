//! What happened in a job, as the master's node tells it: the events its subscribers get
//! (`JobBuilder::on_event`).

use std::time::Duration;

use super::{HaltedBy, IterationReport, Recovered};
use crate::error::JobError;
use crate::ids::{Iteration, Rank};

/// Something that happened in a job.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum JobEvent {
    /// The job started.
    Started {
        /// The job's id.
        job_id: String,
        /// The number of workers.
        workers: usize,
        /// The most iterations it runs.
        iterations: Iteration,
    },
    /// Every worker registered (ran `pre_application` and `init`).
    Registered {
        /// Time since the job started.
        elapsed: Duration,
    },
    /// An iteration was broadcast to the workers.
    IterationStarted {
        /// The iteration.
        iteration: Iteration,
    },
    /// The master computed an iteration.
    IterationCompleted(IterationReport),
    /// The job halted before its iteration count.
    Halted {
        /// The last iteration.
        iteration: Iteration,
        /// Who halted it.
        by: HaltedBy,
    },
    /// The master's node took a worker's result of an iteration (one a round was waiting
    /// for: not stale, not a duplicate). [`IterationCompleted`](JobEvent::IterationCompleted)
    /// adds up every rank's; this is one rank's.
    WorkerReported {
        /// The worker's rank.
        rank: Rank,
        /// The iteration.
        iteration: Iteration,
        /// Its hooks and compute.
        elapsed: Duration,
        /// Its messages of the iteration (`JobBuilder::messages`; zero without): sent,
        /// left after combining, bytes, and received.
        messages: super::MailCount,
    },
    /// A worker ran its `post_application` and stopped.
    WorkerDone {
        /// The worker's rank.
        rank: Rank,
    },
    /// A worker failed and the job recovers from it under its failure policy: the worker
    /// is replaced, left out, or every worker restarts.
    Recovering(Recovered),
    /// The job completed.
    Completed {
        /// How many iterations ran.
        iterations: Iteration,
        /// Whether it halted before its iteration count.
        halted: bool,
        /// The whole job.
        elapsed: Duration,
    },
    /// The job failed; this is its first failure.
    Failed {
        /// Why.
        error: JobError,
    },
}
