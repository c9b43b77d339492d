//! What a job returns: the typed outcome and a report of how it went.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Drops, HaltedBy, Recover, RowCounts, WorkerReport};
use crate::error::JobError;
use crate::ids::{Attempt, FoldRoute, Iteration, Rank};

/// How one iteration went.
#[derive(Debug, Clone, PartialEq)]
pub struct IterationReport {
    /// The iteration.
    pub iteration: Iteration,
    /// From the broadcast that started it to the master's result of it.
    pub elapsed: Duration,
    /// The master's part: its interceptors and compute.
    pub master_elapsed: Duration,
    /// The slowest worker (its rank and its hooks and compute time).
    pub slowest: Option<(Rank, Duration)>,
    /// The most worker results the master's node held at once, from their arrival until
    /// the master's compute: the worker count, unless results are combined as they arrive
    /// (`JobBuilder::combine`), when it is one (the fold) plus those that arrived ahead of
    /// a lower rank still missing.
    pub results_held: usize,
    /// The ranks this iteration went on without: stragglers still missing when it
    /// completed with its quorum after the min-workers timeout
    /// ([`JobConfig::min_workers_ratio`](crate::JobConfig::min_workers_ratio)). Empty when
    /// every rank reported.
    pub left_out: Vec<Rank>,
    /// How the workers' results reached the master: each on its own
    /// ([`FoldRoute::Star`]), or folded among the workers (see
    /// [`JobConfig::aggregation`](crate::JobConfig::aggregation)).
    pub aggregation: FoldRoute,
    /// The workers' messages of the iteration, added up (`JobBuilder::messages`): how
    /// many the computes sent, how many left their senders after combining, and the bytes
    /// of those that crossed to another process.
    pub messages: MailCount,
}

/// A duration's running total over many iterations, and the largest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DurationTotals {
    /// The sum.
    pub sum: Duration,
    /// The largest.
    pub max: Duration,
}

impl DurationTotals {
    fn add(&mut self, d: Duration) {
        self.sum = self.sum.saturating_add(d);
        self.max = self.max.max(d);
    }

    /// The mean over `count` of them (zero for none).
    pub fn mean(&self, count: u64) -> Duration {
        match u32::try_from(count) {
            Ok(0) => Duration::ZERO,
            Ok(n) => self.sum / n,
            Err(_) => Duration::from_secs_f64(self.sum.as_secs_f64() / count as f64),
        }
    }
}

/// Running totals over every iteration a job completed, however many of them the report
/// keeps in detail ([`JobReport::iterations`]).
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct IterationTotals {
    /// Iterations completed.
    pub count: u64,
    /// Their durations ([`IterationReport::elapsed`]).
    pub elapsed: DurationTotals,
    /// The master's part of them ([`IterationReport::master_elapsed`]).
    pub master_elapsed: DurationTotals,
    /// The slowest worker's time in each ([`IterationReport::slowest`]).
    pub slowest_worker: DurationTotals,
    /// The most worker results the master held at once in any of them.
    pub most_results_held: usize,
    /// Ranks left out of them, summed ([`IterationReport::left_out`]).
    pub left_out: u64,
    /// Their messages, summed ([`IterationReport::messages`]), and the most rounds one took.
    pub messages: MailCount,
}

impl IterationTotals {
    pub(crate) fn add(&mut self, r: &IterationReport) {
        self.count += 1;
        self.elapsed.add(r.elapsed);
        self.master_elapsed.add(r.master_elapsed);
        if let Some((_, slowest)) = r.slowest {
            self.slowest_worker.add(slowest);
        }
        self.most_results_held = self.most_results_held.max(r.results_held);
        self.left_out += r.left_out.len() as u64;
        self.messages.add(&r.messages);
    }
}

/// How a job went, as the master saw it. In a process without the master (a worker's
/// process over TCP) only `elapsed` is filled in.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobReport {
    /// From the start of the job until every worker registered.
    pub startup: Duration,
    /// The last iterations that completed, in order: at most
    /// [`JobConfig::report_iterations`](crate::JobConfig::report_iterations) of them
    /// (1,000 by default), so that a long job's report stays small; `totals` counts every
    /// one.
    pub iterations: Vec<IterationReport>,
    /// Running totals over every iteration that completed.
    pub totals: IterationTotals,
    /// The whole job, start-up and shutdown included.
    pub elapsed: Duration,
    /// Who halted the job, if it ended before its iteration count.
    pub halted_by: Option<HaltedBy>,
    /// Messages the barrier dropped (stale, duplicate, from an unknown rank).
    pub drops: Drops,
    /// The checkpoint the job resumed from, if it did: its iteration (the first the job
    /// ran is the one after), where it was, and whether the job had finished there.
    pub resumed: Option<ResumedFrom>,
    /// The iterations whose checkpoints were saved in this run: handed to the writer that
    /// writes them to the store while the job goes on (a write that then fails, or a
    /// checkpoint a newer one replaced while the store was still writing, is said at
    /// WARN).
    pub checkpoints: Vec<Iteration>,
    /// The worker failures the job recovered from under its failure policy
    /// ([`JobConfig::failure_policy`](crate::JobConfig::failure_policy)), in order: the
    /// last [`JobConfig::report_iterations`](crate::JobConfig::report_iterations) of them,
    /// as of iterations; `recovered` counts every one. An iteration redone after a
    /// restart of every worker appears again in `iterations`. A process refused at its
    /// handshake (another configuration) is no failure of its rank's worker, and not
    /// among them.
    pub recoveries: Vec<Recovered>,
    /// How many failures the job recovered from, those no longer in `recoveries`
    /// included.
    pub recovered: u64,
    /// The attempt the job ended in: 0 unless every worker was restarted
    /// ([`FailurePolicy::RestartAll`](crate::FailurePolicy::RestartAll)) or the master's
    /// process was started again in the place of one that died.
    pub attempt: Attempt,
    /// The rows every worker read, wrote and rejected, totalled (see
    /// [`WorkerContext::rows`](crate::WorkerContext::rows)); the rejected rows recorded.
    pub rows: RowCounts,
    /// What each worker reported when it stopped, in rank order (those that reported).
    pub workers: Vec<WorkerReport>,
}

/// A worker failure a job recovered from, and how.
#[derive(Debug, Clone, PartialEq)]
pub struct Recovered {
    /// The failure.
    pub cause: JobError,
    /// What the job did: replaced the worker, went on without it, or restarted every
    /// worker as a new attempt (never [`Recover::Fail`]).
    pub action: Recover,
}

impl JobReport {
    /// The sum of the iterations' durations.
    pub fn iterating(&self) -> Duration {
        self.totals.elapsed.sum
    }

    /// The iteration of the checkpoint the job resumed from, if it did
    /// ([`resumed`](Self::resumed)).
    pub fn resumed_from(&self) -> Option<Iteration> {
        self.resumed.as_ref().map(|r| r.iteration)
    }
}

/// The checkpoint a job resumed from ([`JobReport::resumed`]), as its master's log says
/// at INFO when it resumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumedFrom {
    /// The checkpoint's iteration: the job went on with the one after.
    pub iteration: Iteration,
    /// Where it was: `the newest checkpoint in <directory or URL>`, or `rank <r>'s copy
    /// of the checkpoint of iteration <i>`.
    pub source: String,
    /// Whether the job had finished there (the checkpoint covers its iteration count, or
    /// halted it): the job then ran nothing and returned the checkpoint's result.
    pub finished: bool,
}

/// What a completed job returns.
#[derive(Debug, Clone)]
pub struct JobOutcome<M> {
    /// The final master result.
    pub result: Arc<M>,
    /// How many iterations ran.
    pub iterations: Iteration,
    /// Whether the job halted before its iteration count.
    pub halted: bool,
    /// Timings and counters.
    pub report: JobReport,
}

/// What a worker's messages of one superstep came to, as it reports them to the master's
/// node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MailCount {
    /// Messages the compute sent.
    pub sent: u64,
    /// Messages that left the worker, after its combiner folded those with one key to one
    /// rank (its own rank's included).
    pub delivered: u64,
    /// Bytes of the messages that crossed to another process, encoded (in one process
    /// they are handed over as values: none).
    pub bytes: u64,
    /// Messages received from every rank (its own included), before they were combined
    /// on arrival.
    pub received: u64,
    /// The most rounds of the exchange one superstep's messages took: 1, or — where one
    /// rank's batch for a rank in another process was larger than a frame
    /// (`TcpSettings::max_frame`) — as many as the most frames one batch took (each round
    /// carries one frame from each rank to each). 0 where no messages were exchanged.
    pub rounds: u64,
}

impl MailCount {
    /// Adds `other`'s counts to these, and keeps the most rounds.
    pub(crate) fn add(&mut self, other: &MailCount) {
        self.sent += other.sent;
        self.delivered += other.delivered;
        self.bytes += other.bytes;
        self.received += other.received;
        self.rounds = self.rounds.max(other.rounds);
    }
}
