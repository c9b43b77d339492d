//! What a user implements: the master's and the workers' computations, and the contexts
//! they see.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::coordinator::{Attachment, MalformedRows, RowCounts, Shard};
use crate::error::SyncError;
use crate::error::{BoxError, JobError};
use crate::ids::{Epoch, GroupId, Iteration, Rank, SyncKind};
use crate::payload::Payload;
use crate::protocol::{Gathered, SyncResult};
use crate::sync_link::{awaitable, block, in_span, Notice, SyncLink, Wait};

/// What the master's compute returns: its result of the iteration, and whether to go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step<M> {
    /// Broadcast the result and start the next iteration (unless the iteration count is
    /// reached).
    Continue(M),
    /// Broadcast the result as the final one and end the job after this iteration.
    Halt(M),
}

impl<M> Step<M> {
    /// The master result, and whether the master halts.
    pub fn into_parts(self) -> (M, bool) {
        match self {
            Step::Continue(m) => (m, false),
            Step::Halt(m) => (m, true),
        }
    }
}

/// A worker's computation: an init step that loads its shard, and one compute per
/// iteration.
///
/// One instance runs per worker, made by the factory given to
/// [`Job::builder`](crate::Job::builder). It is only ever called from one thread at a time,
/// but not always the same thread: it must be `Send`.
///
/// # State under recovery
///
/// A worker's state must be one of three kinds, so that a recovered job gives the
/// fault-free answer:
///
/// - **its shard**, loaded by [`init`](Self::init): a worker that replaces a failed one
///   (`FailurePolicy::RestartWorker`) or a gang restarted (`RestartAll`) is a new
///   instance, made by the factory again, and runs `init` again;
/// - **derived, every iteration, from the master result**
///   ([`last_master_result`](WorkerContext::last_master_result)): a replaced worker redoes
///   the iteration with the same master result the one it replaces had, and a job resumed
///   from a checkpoint resumes with the master result saved in it;
/// - **saved in the job's checkpoints** ([`save_state`](Self::save_state) and
///   [`restore_state`](Self::restore_state)): each checkpoint holds every worker's state
///   and the messages on their way to it (`JobBuilder::messages`), and a job resumed from
///   it — every worker restarted under `RestartAll`, the job or its master started again
///   — gives each worker its own back before the next compute. Under `RestartWorker` a
///   replacement redoes the iteration under way, which no checkpoint is of: it gets no
///   saved state, so keep to the first two kinds with that policy — except in barrier
///   mode (and so in a job with messages), where a replacement takes every rank back to
///   the last checkpoint, as `RestartAll` does, and each gets its saved state back.
///
/// What a worker carries from one iteration to the next in itself alone and does not save
/// — a running sum, an optimizer's momentum, labels it only sends changes of — is lost
/// with the worker (a new one starts from what the factory makes) and is not rolled back
/// to a checkpoint: save it, or put it in the master result, which every worker receives
/// and every checkpoint holds. The simulator finds a worker
/// that breaks this rule: `sim::Simulation` with worker crashes under `RestartWorker`
/// ends with another result than the fault-free run. `examples/recovery.rs` runs a job
/// written this way (connected components by label propagation) fault-free, with a
/// worker replaced and with every worker restarted from a checkpoint: the same answer.
///
/// ```
/// # use superstep::prelude::*;
/// /// Every worker's running total, in rank order: the master result holds it.
/// struct Running;
/// impl WorkerComputable for Running {
///     type MasterResult = Vec<u64>;
///     type WorkerResult = u64;
///     fn compute(&mut self, ctx: &mut WorkerContext<Vec<u64>, u64>) -> Result<u64, BoxError> {
///         let shard = ctx.rank() as u64 + 1;
///         // Not `self.total += shard`: a replaced worker would start again from 0.
///         let before = ctx.last_master_result().map_or(0, |totals| totals[ctx.rank()]);
///         Ok(before + shard)
///     }
/// }
/// ```
pub trait WorkerComputable: Send + 'static {
    /// The master's result type, broadcast to the workers.
    type MasterResult: Payload;
    /// This worker's result type, sent to the master each iteration.
    type WorkerResult: Payload;

    /// Runs once, before the first iteration: load the shard here. The context tells the
    /// rank and the number of workers. The default does nothing.
    fn init(
        &mut self,
        ctx: &mut WorkerContext<Self::MasterResult, Self::WorkerResult>,
    ) -> Result<(), BoxError> {
        let _ = ctx;
        Ok(())
    }

    /// Computes iteration [`ctx.iteration()`](WorkerContext::iteration) with the master
    /// result of the iteration before ([`ctx.last_master_result()`](WorkerContext::last_master_result),
    /// in iteration 1 the master's [`init`](MasterComputable::init) result, or `None`).
    ///
    /// An `Err` or a panic fails the job at once, naming this worker's rank and the
    /// iteration.
    fn compute(
        &mut self,
        ctx: &mut WorkerContext<Self::MasterResult, Self::WorkerResult>,
    ) -> Result<Self::WorkerResult, BoxError>;

    /// The worker's own state, beyond its shard and what it derives from the master
    /// result, for a checkpoint (see `JobBuilder::checkpoint`): called after the compute
    /// of each iteration a checkpoint is taken of (and before a fold among the workers).
    /// It is saved with the master's state and the messages on their way to this worker,
    /// and given back to [`restore_state`](Self::restore_state) when the job resumes from
    /// that checkpoint. The default saves nothing, for a worker whose state is its shard
    /// and the master result (see [State under recovery](Self#state-under-recovery)).
    ///
    /// An `Err` or a panic fails the worker in `Phase::Checkpoint`, which fails the job:
    /// a checkpoint without one worker's state would resume another job.
    fn save_state(&self) -> Result<Vec<u8>, BoxError> {
        Ok(Vec::new())
    }

    /// Restores what [`save_state`](Self::save_state) saved, when the job resumes from a
    /// checkpoint — started again, or every worker restarted under
    /// `FailurePolicy::RestartAll` (or under `RestartWorker` in barrier mode): called after
    /// `init`, before the compute of the iteration after the checkpoint's. Not called when
    /// the job starts from iteration 1, nor for a worker that replaces a failed one under
    /// `FailurePolicy::RestartWorker` outside barrier mode, which redoes an iteration with
    /// its shard and the master result alone.
    ///
    /// An `Err` or a panic fails the worker in `Phase::Checkpoint`, which fails the job.
    fn restore_state(&mut self, state: &[u8]) -> Result<(), BoxError> {
        let _ = state;
        Ok(())
    }
}

/// The master's computation: one fold of the workers' results per iteration.
pub trait MasterComputable: Send + 'static {
    /// The master's result type, broadcast to the workers.
    type MasterResult: Payload;
    /// The workers' result type.
    type WorkerResult: Payload;

    /// Makes the first master result — an initial model, say — broadcast to every worker
    /// with iteration 1 (their [`last_master_result`](WorkerContext::last_master_result))
    /// and seen by the master's own first compute, so that it is computed once, in the
    /// master, rather than in every worker. Runs after the interceptors'
    /// `pre_application`, before any worker computes. The default makes none: iteration 1
    /// then starts with no master result.
    ///
    /// Not called when the job resumes from a checkpoint, which has its master result; a
    /// job that starts over from iteration 1 (`FailurePolicy::RestartAll` before any
    /// checkpoint) calls it again.
    ///
    /// An `Err` or a panic fails the job as the master's, in [`Phase::Init`](crate::Phase::Init).
    fn init(
        &mut self,
        ctx: &mut MasterContext<Self::MasterResult, Self::WorkerResult>,
    ) -> Result<Option<Self::MasterResult>, BoxError> {
        let _ = ctx;
        Ok(None)
    }

    /// Folds the workers' results of [`ctx.iteration()`](MasterContext::iteration),
    /// given in rank order by [`ctx.worker_results()`](MasterContext::worker_results),
    /// into the master result, and says whether to continue or halt.
    ///
    /// An `Err` or a panic fails the job at once.
    fn compute(
        &mut self,
        ctx: &mut MasterContext<Self::MasterResult, Self::WorkerResult>,
    ) -> Result<Step<Self::MasterResult>, BoxError>;

    /// The computable's own state, beyond its master result, for a checkpoint (see
    /// `JobBuilder::checkpoint`): called after each checkpointed iteration's compute. The
    /// default saves nothing, for a master whose state is its result.
    ///
    /// An `Err` or a panic skips that checkpoint (logged), it does not fail the job —
    /// except where a failure restarts every worker (`FailurePolicy::RestartAll`, or
    /// `RestartWorker` in barrier mode), which also keeps the state as the job
    /// starts (after any restore) to start over from when no checkpoint was saved yet:
    /// a failure then fails the job in `Phase::Checkpoint`.
    fn save_state(&self) -> Result<Vec<u8>, BoxError> {
        Ok(Vec::new())
    }

    /// Restores what [`save_state`](MasterComputable::save_state) saved, when a job resumes
    /// from a checkpoint: called before `pre_application`, and before the first compute,
    /// which then runs the iteration after the checkpoint's with
    /// [`last_master_result`](MasterContext::last_master_result) restored. Under
    /// `FailurePolicy::RestartAll` (and `RestartWorker` in barrier mode) it is also called
    /// mid-job, when every worker restarts:
    /// with the newest checkpoint's state, or the state the job started with.
    ///
    /// An `Err` or a panic fails the job as the master's failure in `Phase::Checkpoint`.
    fn restore_state(&mut self, state: &[u8]) -> Result<(), BoxError> {
        let _ = state;
        Ok(())
    }
}

/// A job's messages as a worker's context holds them: its mailbox, of the job's message
/// type (`messages::Mailbox`), behind the context's untyped methods.
pub(crate) trait Post<M, W>: Send {
    fn as_any(&self) -> &dyn std::any::Any;
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
    /// The job's message type, for errors.
    fn type_name(&self) -> &'static str;
    /// Sends the superstep's messages to their ranks and takes in what every rank sent
    /// this one.
    fn exchange(
        &mut self,
        ctx: &mut WorkerContext<M, W>,
    ) -> Result<crate::protocol::MailCount, SyncError>;
    /// The messages sent to this rank that it reads in the next superstep, encoded, for a
    /// checkpoint.
    fn save(&self) -> Result<Vec<u8>, String>;
    /// Puts back the messages [`save`](Post::save) encoded, as those the next superstep
    /// reads.
    fn restore(&mut self, saved: &[u8]) -> Result<(), String>;
}

/// What a worker's code sees: who it is, which iteration, and the last master result.
pub struct WorkerContext<M, W> {
    pub(crate) rank: Rank,
    pub(crate) workers: usize,
    pub(crate) job_id: Arc<str>,
    pub(crate) iteration: Iteration,
    pub(crate) iterations: Iteration,
    pub(crate) last: Option<Arc<M>>,
    pub(crate) result: Option<W>,
    pub(crate) halt_vote: bool,
    /// This rank's count of sync calls and collectives among every rank so far: the epoch
    /// of its next call (a group's are counted in `groups`).
    pub(crate) epoch: Epoch,
    /// The epoch of the iteration's first call: calls are named by their number in it.
    pub(crate) iteration_epoch: Epoch,
    /// The group of ranks the collectives made now are among ([`WorkerContext::among`]):
    /// `None`, every rank.
    pub(crate) scope: Option<crate::group::Group>,
    /// Per group of ranks this rank made calls among, its count of them.
    pub(crate) groups: std::collections::BTreeMap<crate::ids::GroupId, crate::group::GroupCount>,
    /// The first sync call or collective of this worker that failed as a mistake in the
    /// program: its compute's failure then is one ([`Cause::is_mistake`]), carrying it.
    pub(crate) mistake: Option<SyncError>,
    pub(crate) sync: Option<SyncLink<W>>,
    /// This worker's part of the input, if the job has one.
    pub(crate) shard: Option<Shard>,
    /// What this worker read, wrote and rejected, reported when it stops.
    pub(crate) rows: RowCounts,
    /// What this worker attached to its report, in order.
    pub(crate) attachments: Vec<Attachment>,
    pub(crate) malformed_rows: MalformedRows,
    /// The job's end, as this process hears of it.
    pub(crate) end: JobEnd,
    /// The worker's messages, when the job has them (`JobBuilder::messages`).
    pub(crate) mail: Option<Box<dyn Post<M, W>>>,
}

/// The job's failure as the code of one process hears of it: set once, when the job
/// fails (or is cancelled) — by the master's node as it tells every worker, by a worker
/// of this process whose own failure ends the job, or by a worker that heard the master's
/// abort. From then on no compute starts, and a long one can stop early
/// ([`WorkerContext::check_cancelled`]). Cheap to read: one atomic load.
#[derive(Debug, Clone, Default)]
pub(crate) struct JobEnd(Arc<OnceLock<(JobError, Instant)>>);

impl JobEnd {
    /// The job fails with `error` (the first call's error is kept, with when it came).
    pub(crate) fn end(&self, error: &JobError) {
        if self.0.get().is_none() {
            let _ = self.0.set((error.clone(), Instant::now()));
        }
    }

    /// Whether the job failed.
    pub(crate) fn is_ended(&self) -> bool {
        self.0.get().is_some()
    }

    /// The first failure this process heard of, and when.
    pub(crate) fn first(&self) -> Option<&(JobError, Instant)> {
        self.0.get()
    }
}

/// `Err(Cancelled)` once `end` is set.
fn cancelled(end: &JobEnd) -> Result<(), Cancelled> {
    match end.first() {
        Some((error, _)) => Err(Cancelled {
            reason: error.to_string(),
        }),
        None => Ok(()),
    }
}

/// What [`WorkerContext::check_cancelled`] returns once the job is ending: a compute that
/// returns it with `?` stops early, and the job ends with its first failure (this is never
/// the job's error).
#[derive(Clone, PartialEq, thiserror::Error)]
#[error("the job is ending ({reason}): this compute stopped early")]
pub struct Cancelled {
    /// The job's first failure, as this process heard of it.
    pub reason: String,
}

crate::error::debug_as_sentence!(Cancelled);

impl<M, W> WorkerContext<M, W> {
    pub(crate) fn new(rank: Rank, workers: usize, job_id: Arc<str>, iterations: Iteration) -> Self {
        WorkerContext {
            rank,
            workers,
            job_id,
            iteration: 0,
            iterations,
            last: None,
            result: None,
            halt_vote: false,
            epoch: 0,
            iteration_epoch: 0,
            scope: None,
            groups: std::collections::BTreeMap::new(),
            mistake: None,
            sync: None,
            shard: None,
            rows: RowCounts::default(),
            attachments: Vec::new(),
            malformed_rows: MalformedRows::Fail,
            end: JobEnd::default(),
            mail: None,
        }
    }

    /// Whether the job is ending — it failed somewhere, or was cancelled — so that a long
    /// compute can stop early: its result would not be used. One atomic load; call it as
    /// often as you like. See [`check_cancelled`](Self::check_cancelled).
    pub fn is_cancelled(&self) -> bool {
        self.end.is_ended()
    }

    /// `Err(Cancelled)` once the job is ending, for `?` in a long compute:
    ///
    /// ```
    /// # use superstep::prelude::*;
    /// # struct Slow;
    /// # impl WorkerComputable for Slow {
    /// #     type MasterResult = u64;
    /// #     type WorkerResult = u64;
    /// fn compute(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
    ///     let mut sum = 0;
    ///     for chunk in 0..1_000u64 {
    ///         ctx.check_cancelled()?; // another worker failed: stop here
    ///         sum += chunk;
    ///     }
    ///     Ok(sum)
    /// }
    /// # }
    /// ```
    ///
    /// The job still ends with its first failure, not with this.
    pub fn check_cancelled(&self) -> Result<(), Cancelled> {
        cancelled(&self.end)
    }

    /// This worker's rank, `0..workers()`.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// The number of workers in the job.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The job's id.
    pub fn job_id(&self) -> &str {
        &self.job_id
    }

    /// The current iteration, from 1; 0 during start-up (`pre_application` and `init`).
    pub fn iteration(&self) -> Iteration {
        self.iteration
    }

    /// The most iterations the job runs.
    pub fn iterations(&self) -> Iteration {
        self.iterations
    }

    /// Whether this is the first iteration.
    pub fn is_first_iteration(&self) -> bool {
        self.iteration == 1
    }

    /// The master result of the previous iteration; in iteration 1 the master's
    /// [`init`](MasterComputable::init) result, or `None`. In
    /// `post_application` after a completed job, the final master result.
    pub fn last_master_result(&self) -> Option<&M> {
        self.last.as_deref()
    }

    /// This iteration's worker result, once compute returned it (in `post_iteration`).
    pub fn worker_result(&self) -> Option<&W> {
        self.result.as_ref()
    }

    /// Votes to halt the job after this iteration. The vote counts only when
    /// `worker_halt` is on and every worker votes in the same iteration.
    pub fn vote_halt(&mut self) {
        self.halt_vote = true;
    }

    /// Whether this worker voted to halt in this iteration.
    pub fn voted_halt(&self) -> bool {
        self.halt_vote
    }

    /// This worker's part of the job's input (`JobBuilder::input`, or a coordinator's
    /// `prepare_shards`); `None` when the job has no input.
    pub fn shard(&self) -> Option<&Shard> {
        self.shard.as_ref()
    }

    /// What this worker read, wrote and rejected so far. Count here as you go (or add
    /// a `RowSource`'s counts, with the `pipeline` feature): the worker reports it
    /// when it stops, and the job report totals every worker's
    /// ([`JobReport::rows`](crate::JobReport::rows)).
    pub fn rows(&mut self) -> &mut RowCounts {
        &mut self.rows
    }

    /// Attaches `value` to this worker's report, after what it attached before: for
    /// example a file it wrote, for the coordinator to commit
    /// ([`WorkerReport::attached`](crate::coordinator::WorkerReport::attached)). The
    /// report goes to the coordinator when the worker stops, across processes alike. A
    /// worker that is started again after a failure starts with no attachments: its
    /// replacement's are what the report carries.
    ///
    /// An error when `value` cannot be encoded.
    pub fn attach<T: serde::Serialize + ?Sized>(
        &mut self,
        value: &T,
    ) -> Result<(), crate::coordinator::AttachmentError> {
        let attachment =
            Attachment::new(value).map_err(|e| crate::coordinator::AttachmentError {
                rank: Some(self.rank),
                index: Some(self.attachments.len()),
                ..e
            })?;
        self.attachments.push(attachment);
        Ok(())
    }

    /// What this worker attached to its report so far.
    pub fn attachments(&self) -> &[Attachment] {
        &self.attachments
    }

    /// The job's policy for malformed rows (`JobBuilder::malformed_rows`), to open a
    /// `coordinator::RowSource` with (the `pipeline` feature).
    pub fn malformed_rows(&self) -> MalformedRows {
        self.malformed_rows
    }
}

impl<M, W: 'static> WorkerContext<M, W> {
    /// Waits until every rank has called `barrier()` as its call of the same number (its
    /// epoch: the n-th sync call of every rank meets the n-th of every other, counted
    /// across iterations). Spark's `BarrierTaskContext.barrier()`.
    ///
    /// Fails — every rank of the epoch, with the same error where the master's node says
    /// it — when ranks make different calls, when not every rank arrives within
    /// `sync_timeout` of the first, when a rank
    /// returns from its compute without the call, or when the job fails meanwhile (then
    /// with the job's first failure). Needs a job built with `barrier_mode(true)`; without
    /// it this fails at once with [`SyncError::NotEnabled`]. Only `compute` may call it
    /// (in `init` it fails with [`SyncError::OutsideCompute`]).
    ///
    /// Where the workers reach each other (in one process, or over TCP's peer mesh) the
    /// ranks meet among themselves, a dissemination barrier of log₂(ranks) steps: the call
    /// returns once what every rank sent reached this one, without a round trip through
    /// the master's node (which still hears of the call and holds the rules above). There
    /// it also fails as a collective does: when a peer is lost
    /// ([`SyncError::PeerLost`]) or stops sending ([`SyncError::CollectiveTimedOut`]).
    pub fn barrier(&mut self) -> Result<(), SyncError> {
        block(self.barrier_in(Wait::Block))
    }

    /// [`barrier`](Self::barrier) as a future, for a compute that runs an async runtime:
    /// while it waits, the runtime's other tasks run on the thread. Await it on a Tokio
    /// runtime with its timers (`enable_time` or `enable_all`), which bound the wait:
    /// outside a Tokio runtime it fails with [`SyncError::NoTimer`] (on one built without
    /// timers, Tokio panics). Await it to its end: the call is made when it is first
    /// polled, so a future dropped before it finishes leaves the other ranks to fail the
    /// call (as a rank that returned without it), and this rank's next calls out of step.
    pub async fn barrier_async(&mut self) -> Result<(), SyncError> {
        self.barrier_in(Wait::Await).await
    }

    /// Sends `message` to every rank and returns every rank's message of the same epoch, in
    /// rank order (index `r` is rank `r`'s, this rank's own included). Spark's
    /// `BarrierTaskContext.allGather()`, for any serde type — the same type on every rank
    /// — and for borrowed ones, which come back owned: a `&str` gathers `String`s, a
    /// `&[T]` gathers `Vec<T>`s.
    ///
    /// ```no_run
    /// # use superstep::prelude::*;
    /// # fn compute(ctx: &mut WorkerContext<(), ()>) -> Result<(), BoxError> {
    /// let addresses: Vec<String> = ctx.all_gather("10.0.0.7:7000")?;
    /// let counts: Vec<u64> = ctx.all_gather(&42u64)?;
    /// # Ok(()) }
    /// ```
    ///
    /// Where the workers reach each other, the messages go among them (log₂(ranks) steps;
    /// across processes a message of 64 KiB or more then around the ring of workers: see
    /// [`collective`](crate::collective)), the master's node checking the call but not on
    /// its way. Fails as [`barrier`](Self::barrier) does, and as a collective does: a peer
    /// lost ([`SyncError::PeerLost`]) or silent ([`SyncError::CollectiveTimedOut`]).
    pub fn all_gather<T>(&mut self, message: &T) -> Result<Vec<T::Owned>, SyncError>
    where
        T: Serialize + ToOwned + ?Sized,
        T::Owned: DeserializeOwned,
    {
        block(self.all_gather_in(message, Wait::Block))
    }

    /// [`all_gather`](Self::all_gather) as a future; see
    /// [`barrier_async`](Self::barrier_async).
    pub async fn all_gather_async<T>(&mut self, message: &T) -> Result<Vec<T::Owned>, SyncError>
    where
        T: Serialize + ToOwned + ?Sized,
        T::Owned: DeserializeOwned,
    {
        self.all_gather_in(message, Wait::Await).await
    }

    async fn all_gather_in<T>(
        &mut self,
        message: &T,
        wait: Wait,
    ) -> Result<Vec<T::Owned>, SyncError>
    where
        T: Serialize + ToOwned + ?Sized,
        T::Owned: DeserializeOwned,
    {
        let rank = self.rank;
        let bytes = crate::codec::to_vec(message).map_err(|e| {
            SyncError::Codec(format!(
                "rank {rank}'s all_gather message, a {}, does not encode: {e}",
                std::any::type_name::<T>()
            ))
        })?;
        let group = self.scope.clone();
        self.gather(bytes, wait)
            .await?
            .iter()
            .enumerate()
            .map(|(from, m)| {
                let from = group.as_ref().map_or(from, |g| g.ranks()[from]);
                crate::codec::from_slice(m).map_err(|e| {
                    SyncError::Codec(format!(
                        "rank {from}'s all_gather message does not decode as {} on rank {rank}: {e}",
                        std::any::type_name::<T::Owned>()
                    ))
                })
            })
            .collect()
    }

    /// How many sync calls and collectives among every rank this rank has made: the epoch
    /// of its next such call. Calls among a group ([`among`](Self::among)) are counted
    /// apart, each group's from 0.
    pub fn sync_epoch(&self) -> Epoch {
        self.epoch
    }

    /// Enters `iteration`: its calls are numbered from 1.
    pub(crate) fn enter_iteration(&mut self, iteration: Iteration) {
        self.iteration = iteration;
        self.iteration_epoch = self.epoch;
        self.record(|| crate::flight::What::Compute { iteration });
    }

    /// Records this superstep's message counts in the rank's flight recorder.
    pub(crate) fn record_mail(&self, count: &crate::protocol::MailCount) {
        let iteration = self.iteration;
        self.record(|| crate::flight::What::Messages {
            iteration,
            sent: count.sent,
            received: count.received,
        });
    }

    /// Records what `what` makes in the rank's flight recorder, where it keeps one (in
    /// barrier mode).
    pub(crate) fn record(&self, what: impl FnOnce() -> crate::flight::What) {
        if let Some(sync) = &self.sync {
            sync.recorder.record(what());
        }
    }

    /// Makes sync call `kind` with `message` and waits for the master's node's answer.
    pub(crate) async fn sync_call_in(
        &mut self,
        kind: SyncKind,
        message: Vec<u8>,
        wait: Wait,
    ) -> SyncResult {
        let result = self.sync_call_made(kind, message, wait).await;
        self.note(result)
    }

    /// Notes whether `result` is a mistake in the program ([`SyncError::is_mistake`]), so
    /// that the compute's failure is one however the code wraps or words the error.
    pub(crate) fn note<T>(&mut self, result: Result<T, SyncError>) -> Result<T, SyncError> {
        if let Err(error) = &result {
            if error.is_mistake() && self.mistake.is_none() {
                self.mistake = Some(error.clone());
            }
        }
        result
    }

    /// [`sync_call_in`](Self::sync_call_in), its failure not noted yet.
    async fn sync_call_made(&mut self, kind: SyncKind, message: Vec<u8>, wait: Wait) -> SyncResult {
        if wait == Wait::Await {
            awaitable()?;
        }
        let rank = self.rank;
        let sync = self.sync.as_mut().ok_or(SyncError::NotEnabled(kind))?;
        if self.iteration == 0 {
            return Err(SyncError::OutsideCompute(kind));
        }
        if self.scope.is_some() {
            return Err(SyncError::NoPeers(
                "a group's calls go among its ranks alone, and this job's transport gives them no way to each other".to_owned(),
            ));
        }
        if let Some(e) = sync.failure() {
            return Err(e);
        }
        let epoch = self.epoch;
        self.epoch += 1;
        let len = None;
        sync.call(
            (epoch, GroupId::ALL, &[]),
            (kind, len),
            message,
            Notice::Awaited,
        )?;
        let span = tracing::debug_span!("sync", rank, epoch, %kind);
        let result = in_span(span, sync.answer(epoch, wait)).await;
        sync.ended((epoch, GroupId::ALL), &result);
        result
    }
}

impl<M, W> fmt::Debug for WorkerContext<M, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerContext")
            .field("rank", &self.rank)
            .field("workers", &self.workers)
            .field("job_id", &self.job_id)
            .field("iteration", &self.iteration)
            .field("iterations", &self.iterations)
            .field("has_last_master_result", &self.last.is_some())
            .field("sync_epoch", &self.epoch)
            .finish()
    }
}

/// What the master's code sees: the iteration, every worker's result in rank order, and
/// the master result of the iteration before.
pub struct MasterContext<M, W> {
    pub(crate) workers: usize,
    pub(crate) job_id: Arc<str>,
    pub(crate) iteration: Iteration,
    pub(crate) iterations: Iteration,
    pub(crate) results: Vec<W>,
    pub(crate) combined: Option<W>,
    pub(crate) halt_votes: usize,
    pub(crate) reported: Vec<Rank>,
    pub(crate) left_out: Vec<Rank>,
    pub(crate) last: Option<Arc<M>>,
    pub(crate) current: Option<Arc<M>>,
    /// The job's end, as this process hears of it.
    pub(crate) end: JobEnd,
}

impl<M, W> MasterContext<M, W> {
    pub(crate) fn new(workers: usize, job_id: Arc<str>, iterations: Iteration) -> Self {
        MasterContext {
            workers,
            job_id,
            iteration: 0,
            iterations,
            results: Vec::new(),
            combined: None,
            halt_votes: 0,
            reported: Vec::new(),
            left_out: Vec::new(),
            last: None,
            current: None,
            end: JobEnd::default(),
        }
    }

    /// The same context, hearing of the job's end through `end`.
    pub(crate) fn ending_with(mut self, end: JobEnd) -> Self {
        self.end = end;
        self
    }

    /// Whether the job is ending — it failed or was cancelled while the master computes —
    /// so that a long master compute can stop early. One atomic load. See
    /// [`check_cancelled`](Self::check_cancelled).
    pub fn is_cancelled(&self) -> bool {
        self.end.is_ended()
    }

    /// `Err(Cancelled)` once the job is ending, for `?` in a long master compute (as
    /// [`WorkerContext::check_cancelled`]). The job still ends with its first failure.
    pub fn check_cancelled(&self) -> Result<(), Cancelled> {
        cancelled(&self.end)
    }

    /// Enters `iteration` with what its round gathered, before the master's hooks and
    /// compute see it. Returns the ranks of the round before, emptied: a buffer for the
    /// rounds to come.
    pub(crate) fn enter(&mut self, iteration: Iteration, gathered: Gathered<W>) -> Vec<Rank> {
        self.iteration = iteration;
        self.results = gathered.results;
        self.combined = gathered.combined;
        self.halt_votes = gathered.tally.halt_votes;
        let mut before = std::mem::replace(&mut self.reported, gathered.reported);
        before.clear();
        self.left_out = gathered.left_out;
        self.current = None;
        before
    }

    /// The number of workers in the job.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The job's id.
    pub fn job_id(&self) -> &str {
        &self.job_id
    }

    /// The current iteration, from 1; 0 during start-up.
    pub fn iteration(&self) -> Iteration {
        self.iteration
    }

    /// The most iterations the job runs.
    pub fn iterations(&self) -> Iteration {
        self.iterations
    }

    /// Whether this is the first iteration.
    pub fn is_first_iteration(&self) -> bool {
        self.iteration == 1
    }

    /// Every worker's result of this iteration, in rank order: index `r` is rank `r`'s —
    /// unless the iteration went on without some stragglers (see
    /// [`reported_ranks`](MasterContext::reported_ranks)), when index `i` is the result
    /// of `reported_ranks()[i]`. Empty before the first iteration and after an iteration completed; after a failed
    /// iteration, still that iteration's results. Empty too when the job combines results
    /// as they arrive: see [`combined_result`](MasterContext::combined_result).
    pub fn worker_results(&self) -> &[W] {
        &self.results
    }

    /// The workers' results, to take parts of without a copy (a graph job's values, as
    /// the job ends).
    pub(crate) fn worker_results_mut(&mut self) -> &mut [W] {
        &mut self.results
    }

    /// When the job combines results as they arrive (`JobBuilder::combine`): every
    /// worker's result of this iteration folded in rank order, `combine(combine(r0, r1),
    /// r2)…`, so the master never held one per worker. `None` when the job does not
    /// combine, and outside an iteration.
    pub fn combined_result(&self) -> Option<&W> {
        self.combined.as_ref()
    }

    /// Takes the [`combined_result`](MasterContext::combined_result) out of the context,
    /// to reuse it without a copy (it is dropped after the iteration anyway).
    pub fn take_combined_result(&mut self) -> Option<W> {
        self.combined.take()
    }

    /// The ranks whose results this iteration has, in rank order: every rank, unless the
    /// iteration completed with its quorum after the min-workers timeout
    /// (`JobBuilder::min_workers`) and left the stragglers out.
    pub fn reported_ranks(&self) -> &[Rank] {
        &self.reported
    }

    /// The ranks this iteration went on without, in rank order (see
    /// [`reported_ranks`](MasterContext::reported_ranks)); their late results are dropped.
    pub fn left_out_ranks(&self) -> &[Rank] {
        &self.left_out
    }

    /// How many workers voted to halt in this iteration.
    pub fn halt_votes(&self) -> usize {
        self.halt_votes
    }

    /// The master result of the previous iteration; in iteration 1 the one
    /// [`init`](MasterComputable::init) made, or `None`.
    pub fn last_master_result(&self) -> Option<&M> {
        self.last.as_deref()
    }

    /// The master result this iteration computed: set after compute returns, so readable
    /// in `post_iteration`; in `post_application`, the final master result if any.
    pub fn master_result(&self) -> Option<&M> {
        self.current.as_deref()
    }
}

impl<M, W> fmt::Debug for MasterContext<M, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MasterContext")
            .field("workers", &self.workers)
            .field("job_id", &self.job_id)
            .field("iteration", &self.iteration)
            .field("iterations", &self.iterations)
            .field("results", &self.results.len())
            .field("combined", &self.combined.is_some())
            .field("halt_votes", &self.halt_votes)
            .field("left_out", &self.left_out)
            .finish()
    }
}
