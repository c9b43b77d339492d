//! Job coordinators: what turns a parallel run into one coherent, all-or-nothing result.
//!
//! A [`Coordinator`] lives with the master. Before the job starts it may shard the input
//! ([`Coordinator::prepare_shards`]; by default [`Input::split`] does); `on_start` runs
//! before any worker starts; when the job ends, `on_finish` runs with every worker's report
//! if — and only if — every worker succeeded, and `on_error` otherwise (a failure, a
//! timeout, a cancellation), after every worker stopped or the shutdown timeout passed.
//! [`Composite`] runs several.
//!
//! Built in: [`FileMerge`] (the parts into one CSV or JSONL file, atomically) and
//! [`AtomicCommit`] (the parts into a new version of an output directory, switched by a
//! rename). Workers read their shard with [`RowSource`] (CSV and JSONL rows into serde
//! types, malformed rows handled by a [`MalformedRows`] policy) and count what they read,
//! wrote and rejected on their context ([`WorkerContext::rows`](crate::WorkerContext::rows));
//! the job report totals it ([`JobReport::rows`](crate::JobReport::rows)).
//!
//! Over TCP every process calls `prepare_shards` (each worker takes its own shard, so
//! sharding must give the same shards in every process: split what every process sees
//! alike), and only the master's process runs `on_start`, `on_finish` and `on_error`.

mod output;
mod rows;
mod shard;

use crate::error::{BoxError, JobError};
use crate::protocol::Rank;

pub use output::{AtomicCommit, CommitStep, FileMerge, Manifest, MergeFormat, Staging};
pub use rows::{
    MalformedRows, Rejected, RowCounts, RowError, RowFormat, RowSource, MAX_RECORDED_REJECTS,
};
pub use shard::{split_files, split_lines, split_rows, Input, LineRange, LineReader, Shard};

/// What one worker reported when it stopped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerReport {
    /// The worker's rank.
    pub rank: Rank,
    /// The rows it read, wrote and rejected.
    pub rows: RowCounts,
}

/// Hooks around a job's life, run with the master. Every hook has a default that does
/// nothing; an `Err` (or a panic) fails the job, naming the hook.
pub trait Coordinator: Send + 'static {
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

    /// When every worker succeeded, with their reports in rank order: merge, commit. A
    /// failure fails the job, and `on_error` runs.
    fn on_finish(&mut self, reports: &[WorkerReport]) -> Result<(), BoxError> {
        let _ = reports;
        Ok(())
    }

    /// When the job failed, timed out or was cancelled — after every worker stopped, or
    /// the shutdown timeout passed (a worker stuck in its code may still run then):
    /// clean up, roll back. It may run without `on_start` having run (a failure before the
    /// job started), so it must not assume what that created exists.
    fn on_error(&mut self, error: &JobError) -> Result<(), BoxError> {
        let _ = error;
        Ok(())
    }
}

/// Several coordinators as one: `prepare_shards` takes the first that shards, `on_start`
/// runs in order, `on_finish` in reverse (output before input), and `on_error` runs every
/// one, in reverse, even when some fail (the first failure is returned, the others
/// logged). A failed `on_start` stops the ones after it from starting.
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

impl Coordinator for Composite {
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
        self.parts.iter_mut().try_for_each(|p| p.on_start())
    }

    fn on_finish(&mut self, reports: &[WorkerReport]) -> Result<(), BoxError> {
        self.parts
            .iter_mut()
            .rev()
            .try_for_each(|p| p.on_finish(reports))
    }

    fn on_error(&mut self, error: &JobError) -> Result<(), BoxError> {
        let mut first = None;
        for part in self.parts.iter_mut().rev() {
            let failed = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                part.on_error(error)
            })) {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e,
                Err(panic) => crate::Cause::from_panic(panic).to_string().into(),
            };
            tracing::warn!(error = %failed, "a coordinator's on_error failed");
            first.get_or_insert(failed);
        }
        first.map_or(Ok(()), Err)
    }
}
