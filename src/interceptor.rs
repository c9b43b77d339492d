//! Interceptors: code that runs around each application and each iteration, on the master
//! and on every worker.
//!
//! Several interceptors nest like a call stack: the `pre_*` hooks run in the order the
//! interceptors were added, the `post_*` hooks in reverse. For interceptors `a` then `b`:
//!
//! ```text
//! a.pre_application  b.pre_application
//!   a.pre_iteration  b.pre_iteration  compute  b.post_iteration  a.post_iteration   (each iteration)
//! b.post_application  a.post_application
//! ```
//!
//! `post_application` is where cleanup lives: it runs when the job fails too, and is told
//! how the job ended. It runs for every interceptor whose `pre_application` was called
//! (also the one whose `pre_application` failed), in reverse; when one fails the others
//! still run, and the first failure is reported. When an iteration fails, its
//! `post_iteration` hooks do not run (as a call stack that unwinds).
//!
//! On the master, `pre_iteration` runs once every worker's result of the iteration is in,
//! right before the master's compute; on a worker, right before its compute.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::compute::{MasterContext, WorkerContext};
use crate::error::{BoxError, JobError};
use crate::ids::{Iteration, Rank};
use crate::protocol::OwnedEnding;

/// How a job ended, as `post_application` is told.
#[derive(Debug, Clone, Copy)]
pub enum Ending<'a> {
    /// The job completed: it ran its iteration count or was halted.
    Completed {
        /// How many iterations ran.
        iterations: Iteration,
        /// Whether it halted before its iteration count.
        halted: bool,
    },
    /// The job stopped for a preemption ([`JobError::Preempted`]): run again, it resumes
    /// from `checkpoint`. Not a failure: nothing is wrong with the job, and its output
    /// comes with the run that completes it.
    Preempted {
        /// The last iteration the job completed.
        iteration: Iteration,
        /// The newest checkpoint saved, which a run again resumes from (`None`: none).
        checkpoint: Option<Iteration>,
    },
    /// The job failed with this error (the job's first failure).
    Failed(&'a JobError),
}

impl Ending<'_> {
    /// Whether the job completed.
    pub fn is_completed(&self) -> bool {
        matches!(self, Ending::Completed { .. })
    }
}

/// The ending the nodes carry, as interceptors see it.
impl<'a, M> From<&'a OwnedEnding<M>> for Ending<'a> {
    fn from(ending: &'a OwnedEnding<M>) -> Self {
        match ending {
            OwnedEnding::Completed {
                iterations, halted, ..
            } => Ending::Completed {
                iterations: *iterations,
                halted: *halted,
            },
            OwnedEnding::Failed(JobError::Preempted {
                iteration,
                checkpoint,
                ..
            }) => Ending::Preempted {
                iteration: *iteration,
                checkpoint: *checkpoint,
            },
            OwnedEnding::Failed(e) => Ending::Failed(e),
        }
    }
}

/// Hooks around the master's application and iterations. Every hook defaults to doing
/// nothing; an `Err` or a panic in one fails the job like one in compute.
#[allow(unused_variables)]
pub trait MasterInterceptor<M, W>: Send + 'static {
    /// Before the first iteration.
    fn pre_application(&mut self, ctx: &MasterContext<M, W>) -> Result<(), BoxError> {
        Ok(())
    }
    /// Before the master's compute of each iteration, with the workers' results in.
    fn pre_iteration(&mut self, ctx: &MasterContext<M, W>) -> Result<(), BoxError> {
        Ok(())
    }
    /// After the master's compute of each iteration, with its result in.
    fn post_iteration(&mut self, ctx: &MasterContext<M, W>) -> Result<(), BoxError> {
        Ok(())
    }
    /// At the end of the job, completed or failed.
    fn post_application(
        &mut self,
        ctx: &MasterContext<M, W>,
        ending: Ending<'_>,
    ) -> Result<(), BoxError> {
        Ok(())
    }
}

/// Hooks around a worker's application and iterations. Every hook defaults to doing
/// nothing; an `Err` or a panic in one fails the job like one in compute.
#[allow(unused_variables)]
pub trait WorkerInterceptor<M, W>: Send + 'static {
    /// Before `init`.
    fn pre_application(&mut self, ctx: &WorkerContext<M, W>) -> Result<(), BoxError> {
        Ok(())
    }
    /// Before the worker's compute of each iteration.
    fn pre_iteration(&mut self, ctx: &WorkerContext<M, W>) -> Result<(), BoxError> {
        Ok(())
    }
    /// After the worker's compute of each iteration, with its result in.
    fn post_iteration(&mut self, ctx: &WorkerContext<M, W>) -> Result<(), BoxError> {
        Ok(())
    }
    /// At the end of the job, completed or failed.
    fn post_application(
        &mut self,
        ctx: &WorkerContext<M, W>,
        ending: Ending<'_>,
    ) -> Result<(), BoxError> {
        Ok(())
    }
}

/// Which side an [`IterationTimer`] measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    /// The master.
    Master,
    /// The worker of this rank.
    Worker(Rank),
}

/// One measurement of an [`IterationTimer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IterationTime {
    /// Who was measured.
    pub side: Side,
    /// The iteration.
    pub iteration: Iteration,
    /// From the end of this side's `pre_iteration` to the start of its `post_iteration`
    /// (for the timer's own hooks): the compute and the interceptors nested inside the
    /// timer.
    pub elapsed: Duration,
}

/// An interceptor that records how long each iteration's compute took, on the master and
/// on every worker it is added to. Clones share their records.
///
/// ```
/// use superstep::IterationTimer;
/// let timer = IterationTimer::new();
/// // builder.master_interceptor(timer.clone())
/// //        .worker_interceptor({ let t = timer.clone(); move |_rank| t.clone() });
/// // after the run: timer.times()
/// assert!(timer.times().is_empty());
/// ```
#[derive(Debug, Default)]
pub struct IterationTimer {
    records: Arc<Mutex<Vec<IterationTime>>>,
    started: Option<Instant>,
}

impl Clone for IterationTimer {
    fn clone(&self) -> Self {
        IterationTimer {
            records: Arc::clone(&self.records),
            started: None,
        }
    }
}

impl IterationTimer {
    /// A timer with no records.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every record so far, in the order they were taken.
    pub fn times(&self) -> Vec<IterationTime> {
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The records of one side, in iteration order.
    pub fn times_of(&self, side: Side) -> Vec<IterationTime> {
        let mut times: Vec<_> = self
            .times()
            .into_iter()
            .filter(|t| t.side == side)
            .collect();
        times.sort_by_key(|t| t.iteration);
        times
    }

    fn stop(&mut self, side: Side, iteration: Iteration) {
        if let Some(started) = self.started.take() {
            let elapsed = started.elapsed();
            tracing::debug!(?side, iteration, ?elapsed, "iteration timed");
            self.records
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(IterationTime {
                    side,
                    iteration,
                    elapsed,
                });
        }
    }
}

impl<M, W> MasterInterceptor<M, W> for IterationTimer {
    fn pre_iteration(&mut self, _ctx: &MasterContext<M, W>) -> Result<(), BoxError> {
        self.started = Some(Instant::now());
        Ok(())
    }
    fn post_iteration(&mut self, ctx: &MasterContext<M, W>) -> Result<(), BoxError> {
        self.stop(Side::Master, ctx.iteration());
        Ok(())
    }
}

impl<M, W> WorkerInterceptor<M, W> for IterationTimer {
    fn pre_iteration(&mut self, _ctx: &WorkerContext<M, W>) -> Result<(), BoxError> {
        self.started = Some(Instant::now());
        Ok(())
    }
    fn post_iteration(&mut self, ctx: &WorkerContext<M, W>) -> Result<(), BoxError> {
        self.stop(Side::Worker(ctx.rank()), ctx.iteration());
        Ok(())
    }
}
