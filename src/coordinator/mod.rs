//! Job coordinators: what turns a parallel run into one coherent, all-or-nothing result.
//!
//! A [`Coordinator`] lives with the master. Before the job starts it may shard the input
//! ([`Coordinator::prepare_shards`]; by default [`Input::split`] does); `on_start` runs
//! before any worker starts; when the job ends, `on_finish` runs with every worker's report
//! if — and only if — every worker succeeded, and `on_error` otherwise (a failure, a
//! timeout, a cancellation), after every worker stopped or the shutdown timeout passed.
//! [`Composite`] runs several.
//!
//! Built in, with the `pipeline` feature: `FileMerge` (the parts into one CSV or JSONL
//! file, atomically) and `AtomicCommit` (the parts into a new version of an output
//! directory, switched by a rename). Workers read their shard with `RowSource` (CSV and
//! JSONL rows into serde
//! types, malformed rows handled by a [`MalformedRows`] policy) and count what they read,
//! wrote and rejected on their context ([`WorkerContext::rows`](crate::WorkerContext::rows));
//! the job report totals it ([`JobReport::rows`](crate::JobReport::rows)).
//!
//! Over TCP every process calls `prepare_shards` (each worker takes its own shard, so
//! sharding must give the same shards in every process: split what every process sees
//! alike), and only the master's process runs `on_start`, `on_finish` and `on_error`.

#[cfg(feature = "pipeline")]
mod output;
#[cfg(feature = "pipeline")]
mod rows;
mod shard;

use crate::error::{BoxError, JobError};
use crate::ids::Attempt;

pub use crate::protocol::{
    Attachment, AttachmentError, MalformedRows, Rejected, RowCounts, WorkerReport,
    MAX_RECORDED_REJECTS,
};
#[cfg(feature = "pipeline")]
pub use output::{AtomicCommit, CommitStep, FileMerge, Manifest, MergeFormat, Staging};
#[cfg(feature = "pipeline")]
pub use rows::{RowError, RowFormat, RowSource};
pub use shard::{split_files, split_lines, split_rows, Input, LineRange, LineReader, Shard};

/// The job a coordinator's hooks run for: given with every lifecycle message
/// ([`Coordinator::handle`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobInfo {
    /// The job's id (`JobBuilder::job_id`).
    pub job_id: String,
    /// How many workers the job has.
    pub workers: usize,
    /// The attempt the job is in: 0, then one more for each restart of every worker or of
    /// the master's process.
    pub attempt: Attempt,
}

impl JobInfo {
    /// A job's context: its id, its worker count, its attempt.
    pub fn new(job_id: impl Into<String>, workers: usize, attempt: Attempt) -> Self {
        JobInfo {
            job_id: job_id.into(),
            workers,
            attempt,
        }
    }
}

/// A message of a job's life, as its coordinator receives it ([`Coordinator::handle`]).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Lifecycle<'a> {
    /// Before any worker starts.
    Started,
    /// One worker stopped and reported, as it stopped: a live report. The job may still
    /// fail after it.
    WorkerDone(&'a WorkerReport),
    /// Every worker succeeded: their reports, in rank order.
    Finished(&'a [WorkerReport]),
    /// The job failed, timed out or was cancelled.
    Failed(&'a JobError),
}

/// Hooks around a job's life, run with the master. Every hook has a default that does
/// nothing; an `Err` (or a panic) fails the job, naming the hook.
///
/// A coordinator is an actor of the job: it runs on a thread of its own and receives the
/// job's life as typed messages, one at a time and in order ([`handle`](Self::handle)):
/// [`Started`] (`on_start`, before any worker starts), one [`WorkerDone`] for each worker
/// that completed its part, as it stops (`on_worker_done`, a live report: the job goes on
/// meanwhile; a failed or left-out rank sends none), then either [`Finished`]
/// (`on_finish`) or [`Failed`] (`on_error`), exactly once — `run` returns after it did.
/// `handle` gets the job's context ([`JobInfo`]: its id, its workers, its attempt) and
/// calls the hook of each message; override it where a hook needs the context.
///
/// [`Started`]: Lifecycle::Started
/// [`WorkerDone`]: Lifecycle::WorkerDone
/// [`Finished`]: Lifecycle::Finished
/// [`Failed`]: Lifecycle::Failed
///
/// ```
/// use superstep::coordinator::{Coordinator, JobInfo, Lifecycle};
/// use superstep::BoxError;
///
/// /// Commits every worker's files in one transaction, named after the job.
/// #[derive(Default)]
/// struct Catalog {
///     committed: Vec<(String, Vec<String>)>,
/// }
///
/// impl Coordinator for Catalog {
///     fn handle(&mut self, job: &JobInfo, event: Lifecycle<'_>) -> Result<(), BoxError> {
///         if let Lifecycle::Finished(reports) = event {
///             let mut files = Vec::new();
///             for report in reports {
///                 files.extend(report.attached::<String>()?);
///             }
///             self.committed.push((job.job_id.clone(), files));
///         }
///         Ok(())
///     }
/// }
/// ```
pub trait Coordinator: Send + 'static {
    /// Receives one message of the job's life with the job's context. The default calls
    /// the message's hook: `on_start`, `on_worker_done`, `on_finish` or `on_error`.
    fn handle(&mut self, job: &JobInfo, event: Lifecycle<'_>) -> Result<(), BoxError> {
        let _ = job;
        match event {
            Lifecycle::Started => self.on_start(),
            Lifecycle::WorkerDone(report) => self.on_worker_done(report),
            Lifecycle::Finished(reports) => self.on_finish(reports),
            Lifecycle::Failed(error) => self.on_error(error),
        }
    }

    /// One shard per worker of `input`, or `None` to leave sharding to others (a
    /// [`Composite`] takes the first that shards; without any, [`Input::split`] does).
    /// Called in every process of the job.
    fn prepare_shards(
        &mut self,
        input: &Input,
        workers: usize,
    ) -> Result<Option<Vec<Shard>>, BoxError> {
        let _ = (input, workers);
        Ok(None)
    }

    /// Before any worker starts: create the staging area, open a transaction. A failure
    /// stops the job before it starts, and `on_error` still runs (to undo a partial start).
    fn on_start(&mut self) -> Result<(), BoxError> {
        Ok(())
    }

    /// As each worker stops, with its report (rows and attachments), before the job's
    /// end is known: record progress, check what it wrote. A failure fails the job:
    /// `on_finish` does not run, and `on_error` does. A worker replaced after a failure
    /// reports once, as its replacement stops; one left out of the job does not report.
    fn on_worker_done(&mut self, report: &WorkerReport) -> Result<(), BoxError> {
        let _ = report;
        Ok(())
    }

    /// When every worker succeeded, with their reports in rank order: merge, commit. A
    /// failure fails the job, and `on_error` runs.
    fn on_finish(&mut self, reports: &[WorkerReport]) -> Result<(), BoxError> {
        let _ = reports;
        Ok(())
    }

    /// When the job failed, timed out, was cancelled or was preempted — after every worker
    /// stopped, or the shutdown timeout passed (a worker stuck in its code may still run
    /// then): clean up, roll back. It may run without `on_start` having run (a failure
    /// before the job started), so it must not assume what that created exists. A
    /// preempted job ([`JobError::Preempted`]) is run again and resumes from its
    /// checkpoint: its partial output goes, and the run that completes it commits.
    fn on_error(&mut self, error: &JobError) -> Result<(), BoxError> {
        let _ = error;
        Ok(())
    }
}

/// Several coordinators as one: `prepare_shards` takes the first that shards, `on_start`
/// and `on_worker_done` run in order, `on_finish` in reverse (output before input), and
/// `on_error` runs every one, in reverse, even when some fail (the first failure is
/// returned, the others logged). A failed `on_start` stops the ones after it from
/// starting. The job delivers each message through the composite's
/// [`handle`](Coordinator::handle), and each member receives it through its own `handle`,
/// with the job's context. (Calling a composite's `on_*` hooks directly calls each
/// member's `on_*` hook, without a context: a member that overrides only `handle` hears
/// nothing that way.)
///
/// Each member's `on_finish` is atomic on its own, but the members together are not: when
/// one fails, the ones that finished before it (those added after it) keep what they
/// committed, and `on_error` runs for every member. Put at most one committing coordinator
/// in a composite, or make the later ones tolerate an earlier one's commit.
#[derive(Default)]
pub struct Composite {
    parts: Vec<Box<dyn Coordinator>>,
}

impl std::fmt::Debug for Composite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Composite")
            .field("parts", &self.parts.len())
            .finish()
    }
}

impl Composite {
    /// None yet.
    pub fn new() -> Self {
        Composite::default()
    }

    /// Adds `coordinator` after those added before: it starts after them and finishes
    /// before them.
    pub fn with(mut self, coordinator: impl Coordinator) -> Self {
        self.parts.push(Box::new(coordinator));
        self
    }
}

impl Composite {
    /// Runs `hook` on each member, in order (`forward`) or in reverse, stopping at the first
    /// failure.
    fn each(
        &mut self,
        forward: bool,
        mut hook: impl FnMut(&mut dyn Coordinator) -> Result<(), BoxError>,
    ) -> Result<(), BoxError> {
        if forward {
            self.parts.iter_mut().try_for_each(|p| hook(p.as_mut()))
        } else {
            self.parts
                .iter_mut()
                .rev()
                .try_for_each(|p| hook(p.as_mut()))
        }
    }

    /// Runs `hook` on every member in reverse, even when some fail; returns the first
    /// failure (a panic included) and logs the others.
    fn every_reversed(
        &mut self,
        mut hook: impl FnMut(&mut dyn Coordinator) -> Result<(), BoxError>,
    ) -> Result<(), BoxError> {
        let mut first = None;
        for part in self.parts.iter_mut().rev() {
            let failed = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                hook(part.as_mut())
            })) {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e,
                Err(panic) => crate::error::Cause::from_panic(panic).to_string().into(),
            };
            tracing::warn!(error = %failed, "a coordinator's on_error failed");
            first.get_or_insert(failed);
        }
        first.map_or(Ok(()), Err)
    }
}

impl Coordinator for Composite {
    fn handle(&mut self, job: &JobInfo, event: Lifecycle<'_>) -> Result<(), BoxError> {
        match event {
            Lifecycle::Started | Lifecycle::WorkerDone(_) => {
                self.each(true, |p| p.handle(job, event))
            }
            Lifecycle::Finished(_) => self.each(false, |p| p.handle(job, event)),
            Lifecycle::Failed(_) => self.every_reversed(|p| p.handle(job, event)),
        }
    }

    fn prepare_shards(
        &mut self,
        input: &Input,
        workers: usize,
    ) -> Result<Option<Vec<Shard>>, BoxError> {
        for part in &mut self.parts {
            if let Some(shards) = part.prepare_shards(input, workers)? {
                return Ok(Some(shards));
            }
        }
        Ok(None)
    }

    fn on_start(&mut self) -> Result<(), BoxError> {
        self.each(true, |p| p.on_start())
    }

    fn on_worker_done(&mut self, report: &WorkerReport) -> Result<(), BoxError> {
        self.each(true, |p| p.on_worker_done(report))
    }

    fn on_finish(&mut self, reports: &[WorkerReport]) -> Result<(), BoxError> {
        self.each(false, |p| p.on_finish(reports))
    }

    fn on_error(&mut self, error: &JobError) -> Result<(), BoxError> {
        self.every_reversed(|p| p.on_error(error))
    }
}
