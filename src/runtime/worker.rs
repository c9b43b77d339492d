//! The worker actor: runs one worker's computable and interceptors, one unit at a time.

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use actix::{Actor, ActorContext, AsyncContext, Context, Handler, Message};

use super::pool::{guarded, Executor, Placer};
use super::watch::{Watch, Who};
use super::{DynWorker, OwnedEnding, WorkerHooks};
use crate::compute::{JobEnd, Payload, SyncLink, WorkerContext};
use crate::config::JobConfig;
use crate::coordinator::Shard;
use crate::error::{Cause, JobError, Phase, Waiting};
use crate::protocol::{
    Attempt, Epoch, Iteration, Rank, Report, SyncError, SyncResult, ToMaster, ToWorker,
    WorkerCommand, WorkerState,
};
use crate::transport::{TransportError, WorkerLink};

/// A worker's user code and context: moved to the pool and back as one value, so it is
/// only ever touched by one thread at a time.
pub(crate) struct WorkerTask<M, W> {
    computable: DynWorker<M, W>,
    interceptors: WorkerHooks<M, W>,
    pub(crate) ctx: WorkerContext<M, W>,
    pub(crate) attempt: Attempt,
    /// How many interceptors' `pre_application` ran: their `post_application` runs.
    entered: usize,
    /// Whether a failure of this worker's code ends the job (`FailurePolicy::Fail`): it is
    /// then known to the process at once, on the thread it failed on, so no compute starts
    /// after it.
    failure_ends_job: bool,
    /// Set by the worker's actor while the work away belongs to a master it left behind
    /// (its failure then ends nothing).
    pub(crate) stale: Arc<std::sync::atomic::AtomicBool>,
}

/// The context of the worker of `rank` in a job: the job's settings, the rank's shard of
/// the input (if the job has one), the job's end as its process hears of it.
pub(crate) fn worker_context<M, W>(
    config: &JobConfig,
    job_id: &Arc<str>,
    rank: Rank,
    shards: Option<&Arc<Vec<Shard>>>,
    end: JobEnd,
) -> WorkerContext<M, W> {
    let mut ctx = WorkerContext::new(rank, config.workers, Arc::clone(job_id), config.iterations);
    ctx.shard = shards.map(|s| s[rank].clone());
    ctx.malformed_rows = config.malformed_rows;
    ctx.end = end;
    ctx
}

/// One unit of user work.
pub(crate) enum Work<M> {
    Start,
    Iterate(Iteration, Option<Arc<M>>),
    Stop(OwnedEnding<M>),
}

/// What a unit of user work ended with.
pub(crate) enum Worked<W> {
    Started(Result<(), JobError>),
    Iterated(Result<Report<W>, JobError>),
    /// The iteration was not computed: the job had failed by the time it would start.
    Skipped,
    Stopped(Result<(), JobError>),
}

impl<M: Payload, W: Payload> WorkerTask<M, W> {
    pub(crate) fn new(
        computable: DynWorker<M, W>,
        interceptors: WorkerHooks<M, W>,
        ctx: WorkerContext<M, W>,
        attempt: Attempt,
    ) -> Self {
        WorkerTask {
            computable,
            interceptors,
            ctx,
            attempt,
            entered: 0,
            failure_ends_job: false,
            stale: Arc::default(),
        }
    }

    /// The worker's last message, once it stopped: what it read, wrote, rejected and
    /// attached over the job.
    pub(crate) fn done(&mut self, attempt: Attempt) -> ToMaster<W> {
        ToMaster::Done {
            attempt,
            rows: std::mem::take(&mut self.ctx.rows),
            attachments: std::mem::take(&mut self.ctx.attachments),
        }
    }

    /// A failure of this worker's code ends the job (`FailurePolicy::Fail`).
    pub(crate) fn failure_ends_job(mut self, ends: bool) -> Self {
        self.failure_ends_job = ends;
        self
    }

    fn fail(&self, phase: Phase, cause: Cause) -> JobError {
        JobError::Worker {
            rank: self.ctx.rank,
            iteration: self.ctx.iteration,
            phase,
            cause,
        }
    }

    /// Runs one unit of work. Every call into user code is guarded; this outer guard
    /// catches what is left (a user type's `Drop`, say) so that no panic reaches the pool
    /// or the actor.
    pub(crate) fn run(&mut self, work: Work<M>) -> Worked<W> {
        let phase = match work {
            Work::Start => Phase::Init,
            Work::Iterate(..) => Phase::Compute,
            Work::Stop(_) => Phase::PostApplication,
        };
        let worked = self.run_guarded(work, phase);
        if let (true, Worked::Started(Err(error)) | Worked::Iterated(Err(error))) =
            (self.failure_ends_job, &worked)
        {
            let stale = self.stale.load(std::sync::atomic::Ordering::Acquire);
            if !stale && !self.ctx.end.is_ended() {
                self.ctx.end.end(error);
            }
        }
        worked
    }

    fn run_guarded(&mut self, work: Work<M>, phase: Phase) -> Worked<W> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run_unguarded(work))) {
            Ok(worked) => worked,
            Err(payload) => {
                let error = self.fail(phase, Cause::from_panic(payload));
                match phase {
                    Phase::Init => Worked::Started(Err(error)),
                    Phase::Compute => Worked::Iterated(Err(error)),
                    _ => Worked::Stopped(Err(error)),
                }
            }
        }
    }

    fn run_unguarded(&mut self, work: Work<M>) -> Worked<W> {
        match work {
            Work::Start => Worked::Started(self.start()),
            // Once the job failed, no compute starts: its result would not be used.
            Work::Iterate(..) if self.ctx.end.is_ended() => Worked::Skipped,
            Work::Iterate(iteration, last) => Worked::Iterated(self.iterate(iteration, last)),
            Work::Stop(ending) => Worked::Stopped(self.stop(&ending)),
        }
    }

    fn start(&mut self) -> Result<(), JobError> {
        let ctx = &self.ctx;
        for (i, hook) in self.interceptors.iter_mut().enumerate() {
            self.entered = i + 1;
            guarded(|| hook.pre_application(ctx)).map_err(|c| JobError::Worker {
                rank: ctx.rank,
                iteration: 0,
                phase: Phase::PreApplication,
                cause: c,
            })?;
        }
        let (computable, ctx) = (&mut self.computable, &mut self.ctx);
        guarded(|| computable.init(ctx)).map_err(|c| self.fail(Phase::Init, c))
    }

    fn iterate(
        &mut self,
        iteration: Iteration,
        last: Option<Arc<M>>,
    ) -> Result<Report<W>, JobError> {
        let _span = tracing::debug_span!("worker", rank = self.ctx.rank, iteration).entered();
        let started = Instant::now();
        self.ctx.iteration = iteration;
        // `None` in iteration 1 — also when a restarted job starts over.
        self.ctx.last = last;
        self.ctx.result = None;
        self.ctx.halt_vote = false;
        let ctx = &self.ctx;
        for hook in self.interceptors.iter_mut() {
            guarded(|| hook.pre_iteration(ctx)).map_err(|c| JobError::Worker {
                rank: ctx.rank,
                iteration,
                phase: Phase::PreIteration,
                cause: c,
            })?;
        }
        let (computable, ctx) = (&mut self.computable, &mut self.ctx);
        let result =
            guarded(|| computable.compute(ctx)).map_err(|c| self.fail(Phase::Compute, c))?;
        self.ctx.result = Some(result);
        let ctx = &self.ctx;
        for hook in self.interceptors.iter_mut().rev() {
            guarded(|| hook.post_iteration(ctx)).map_err(|c| JobError::Worker {
                rank: ctx.rank,
                iteration,
                phase: Phase::PostIteration,
                cause: c,
            })?;
        }
        let result = self.ctx.result.take().expect("the result was set above");
        Ok(Report {
            attempt: self.attempt,
            iteration,
            result,
            halt_vote: self.ctx.halt_vote,
            elapsed: started.elapsed(),
        })
    }

    fn stop(&mut self, ending: &OwnedEnding<M>) -> Result<(), JobError> {
        if let OwnedEnding::Completed { last, .. } = ending {
            self.ctx.last = Some(Arc::clone(last));
        }
        let ending = ending.as_ending();
        let ctx = &self.ctx;
        let mut first = None;
        for hook in self.interceptors[..self.entered].iter_mut().rev() {
            if let Err(c) = guarded(|| hook.post_application(ctx, ending)) {
                first.get_or_insert(JobError::Worker {
                    rank: ctx.rank,
                    iteration: ctx.iteration,
                    phase: Phase::PostApplication,
                    cause: c,
                });
            }
        }
        self.entered = 0;
        first.map_or(Ok(()), Err)
    }
}

/// In barrier mode: where the answers to the worker's sync calls go, to the compute
/// waiting for them, and where the job's first failure goes once the worker heard of it
/// (every sync call then fails with it at once).
pub(crate) struct SyncAnswers {
    to: mpsc::Sender<(Epoch, SyncResult)>,
    ended: Arc<std::sync::OnceLock<JobError>>,
}

impl SyncAnswers {
    /// The answer to call `epoch`, for the compute waiting in it (it may have given up
    /// waiting already; then nobody listens).
    pub(crate) fn answer(&self, epoch: Epoch, result: SyncResult) {
        let _ = self.to.send((epoch, result));
    }

    /// The job failed with `error`: the call waiting, and every later one, fails with it
    /// at once.
    pub(crate) fn end(&self, error: &JobError) {
        if self.ended.set(error.clone()).is_ok() {
            // Wakes a compute waiting in a sync call: not its epoch, so it looks.
            let failed = SyncError::JobFailed(Box::new(error.clone()));
            let _ = self.to.send((Epoch::MAX, Err(failed)));
        }
    }
}

/// A worker's end of barrier mode: the link its sync calls go out on, and where their
/// answers come in.
/// A call waits at most `patience` for its answer (`Duration::MAX`: until it comes).
pub(crate) fn sync_link<W>(
    link: Arc<dyn WorkerLink<W>>,
    attempt: Attempt,
    patience: Duration,
) -> (SyncLink<W>, SyncAnswers) {
    let (to, answers) = mpsc::channel();
    let ended = Arc::new(std::sync::OnceLock::new());
    let sync = SyncLink {
        link,
        answers,
        attempt,
        patience,
        ended: Arc::clone(&ended),
    };
    (sync, SyncAnswers { to, ended })
}

/// How long a sync call waits for its answer in a job with these settings: longer than
/// the barrier's own sync timeout, which normally answers first.
pub(crate) fn sync_patience(config: &JobConfig) -> Duration {
    config
        .sync_timeout
        .checked_add(Duration::from_secs(5))
        .unwrap_or(Duration::MAX)
}

/// Why a worker in barrier mode fails when it reaches a master's node started again: its
/// sync calls cannot be carried over to that node.
pub(crate) fn master_lost_in_barrier_mode(rank: Rank, attempt: Attempt) -> JobError {
    JobError::MasterLost {
        reason: format!(
            "worker {rank} reached a master started again (attempt {attempt}), and a job in barrier mode cannot carry its sync calls over to it"
        ),
    }
}

/// How long a worker that failed on its own waits, once stopped, for the master to say
/// what the job's first failure was (normally its abort arrives within milliseconds).
const VERDICT_GRACE: Duration = Duration::from_secs(2);

/// Where and within how long a worker reports how the job ended for it.
pub(crate) struct EndingReport<M> {
    pub(crate) to: tokio::sync::mpsc::UnboundedSender<(Rank, OwnedEnding<M>)>,
    pub(crate) within: Duration,
    /// Once the job failed, how long it waits for this worker's code still running.
    pub(crate) grace: Duration,
    /// The job's failure as this process hears of it.
    pub(crate) end: JobEnd,
    /// Whether a failure of this worker's ends the job (`FailurePolicy::Fail`): it says
    /// so to the workers of its process at once, before the master's node has heard.
    pub(crate) own_failure_ends_job: bool,
}

/// Drives one worker: feeds the master's messages into [`WorkerState`] and runs the units
/// of user work it calls for, inline or on the pool (see [`Placer`]).
pub(crate) struct WorkerActor<M: Payload, W: Payload> {
    rank: Rank,
    attempt: Attempt,
    /// `None` while the task is away on the pool.
    task: Option<Box<WorkerTask<M, W>>>,
    link: Arc<dyn WorkerLink<W>>,
    /// In barrier mode: where answers to sync calls go, to the compute waiting for them.
    sync_answers: Option<SyncAnswers>,
    /// The job's first failure, once the master (or the transport, for a lost master)
    /// said the job failed: the ending this worker reports when it failed too.
    verdict: Option<JobError>,
    /// This worker failed before hearing the job failed: once it stopped, it waits for the
    /// master's word (its abort) to report the job's first failure rather than its own,
    /// which may have come second — at most [`VERDICT_GRACE`].
    failed_first: bool,
    awaiting_verdict: Option<OwnedEnding<M>>,
    executor: Executor,
    placer: Placer,
    state: WorkerState,
    /// A stop that arrived while the task was away.
    pending_stop: Option<OwnedEnding<M>>,
    /// The newest iteration that arrived while the task was away: a straggler the job
    /// went on without skips to it, past any iteration it missed.
    pending_iterate: Option<(Iteration, Option<Arc<M>>)>,
    /// How the job ended for this worker, once it began to stop.
    ending: Option<OwnedEnding<M>>,
    /// Whether `init` returned: the worker registers (again) only after it.
    started: bool,
    /// Whether the work away on the pool is an iteration.
    iterating: bool,
    /// Where this worker reports its ending when it stops: a process without the master
    /// takes its outcome from its workers.
    ended: tokio::sync::mpsc::UnboundedSender<(Rank, OwnedEnding<M>)>,
    reported: bool,
    shutdown_timeout: Duration,
    stop_deadline_armed: bool,
    watch: Arc<Watch>,
    grace: Duration,
    end: JobEnd,
    own_failure_ends_job: bool,
    /// Whether the grace for the code away on the pool is armed.
    grace_armed: bool,
    /// The task's stale flag (see [`WorkerTask::stale`]): set while the iteration away
    /// belongs to a master this worker left behind (it registered with a master process
    /// started again meanwhile), whose outcome is dropped.
    stale: Arc<std::sync::atomic::AtomicBool>,
    /// The verdict, for code given up on after the grace: its `post_application` runs
    /// with it when it returns.
    heard: Arc<std::sync::OnceLock<JobError>>,
}

impl<M: Payload, W: Payload> WorkerActor<M, W> {
    pub(crate) fn new(
        task: WorkerTask<M, W>,
        link: Arc<dyn WorkerLink<W>>,
        sync_answers: Option<SyncAnswers>,
        executor: Executor,
        placer: Placer,
        watch: Arc<Watch>,
        ending: EndingReport<M>,
    ) -> Self {
        WorkerActor {
            ending: None,
            started: false,
            iterating: false,
            ended: ending.to,
            reported: false,
            shutdown_timeout: ending.within,
            stop_deadline_armed: false,
            grace: ending.grace,
            end: ending.end,
            own_failure_ends_job: ending.own_failure_ends_job,
            grace_armed: false,
            stale: Arc::clone(&task.stale),
            heard: Arc::default(),
            sync_answers,
            verdict: None,
            failed_first: false,
            awaiting_verdict: None,
            watch,
            rank: task.ctx.rank,
            attempt: task.attempt,
            state: WorkerState::new(task.attempt),
            task: Some(Box::new(task)),
            link,
            executor,
            placer,
            pending_stop: None,
            pending_iterate: None,
        }
    }

    fn try_send(&self, msg: ToMaster<W>) -> Result<(), TransportError> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.link.send(msg))) {
            Ok(sent) => sent,
            Err(payload) => Err(TransportError::Io(format!(
                "the transport panicked: {}",
                Cause::from_panic(payload)
            ))),
        }
    }

    fn send(&self, msg: ToMaster<W>) {
        match self.try_send(msg) {
            Ok(()) => {}
            // A replacement took this worker's rank: its link is closed on purpose.
            Err(TransportError::Replaced { .. }) => {
                tracing::debug!(rank = self.rank, "this worker's link is closed")
            }
            // The job ended for this worker (its link may be closed with it): nothing waits
            // for what it says now.
            Err(error) if self.verdict.is_some() || self.ending.is_some() => {
                tracing::debug!(rank = self.rank, %error, "could not reach the master")
            }
            // The master's node is gone: nothing is waiting for this worker any more.
            Err(error) => tracing::warn!(rank = self.rank, %error, "could not reach the master"),
        }
    }

    /// Fails this worker (and so the job): tells the master first, so every peer learns
    /// of it at once, then stops.
    fn fail(&mut self, error: JobError) {
        tracing::debug!(rank = self.rank, %error, "worker failed");
        let error = match &self.verdict {
            // The job had failed already (this failure may be its consequence: a sync call
            // that the job's end answered): the job's first failure is this worker's end.
            Some(first) => first.clone(),
            None => {
                if self.own_failure_ends_job {
                    // No compute of this process starts from now on.
                    self.end.end(&error);
                }
                self.send(ToMaster::Failed {
                    attempt: self.attempt,
                    error: error.clone(),
                });
                self.failed_first = true;
                error
            }
        };
        self.state.stop();
        // An abort that arrived meanwhile carries the job's first failure: keep it.
        self.pending_stop.get_or_insert(OwnedEnding::Failed(error));
    }

    /// The master (or the transport, for a lost master) says the job failed with
    /// `error`: the job's first failure. A sync call waiting, and every later one, fails
    /// with it at once; a worker that stopped waiting for this word reports it and ends.
    fn hear_verdict(&mut self, ctx: &mut Context<Self>, error: &JobError) {
        if self.verdict.is_none() {
            self.verdict = Some(error.clone());
            let _ = self.heard.set(error.clone());
            // (The process's `JobEnd` is not set here: an abort may only retire this
            // worker. The transport's inbox sets it for a job's failure.)
            self.give_up_on_code_away(ctx);
            if let Some(sync) = &self.sync_answers {
                sync.end(error);
            }
        }
        if self.awaiting_verdict.take().is_some() {
            self.report(OwnedEnding::Failed(error.clone()));
            ctx.stop();
        }
    }

    /// The job failed while this worker's code is away on the pool: it is given the failure
    /// grace to come back; then this worker ends with the job's failure, and the code is
    /// left to end on its own thread (it runs its interceptors' `post_application` there
    /// when it does).
    fn give_up_on_code_away(&mut self, ctx: &mut Context<Self>) {
        if self.task.is_some() || self.grace_armed {
            return;
        }
        self.grace_armed = true;
        ctx.run_later(self.grace, |act, ctx| {
            if act.task.is_some() || act.reported {
                return;
            }
            let Some(verdict) = act.verdict.clone() else {
                return;
            };
            tracing::warn!(
                rank = act.rank,
                "the job failed and this worker's code still runs after the failure grace: it is left to end on its own thread"
            );
            act.report(OwnedEnding::Failed(verdict));
            ctx.stop();
        });
    }

    /// A worker that stopped waiting for the master's verdict ends with its own failure
    /// (no verdict came, or the job finished without needing one). Returns whether it was
    /// waiting.
    fn end_unheard(&mut self, ctx: &mut Context<Self>) -> bool {
        match self.awaiting_verdict.take() {
            Some(own) => {
                self.report(own);
                ctx.stop();
                true
            }
            None => false,
        }
    }

    /// Reports this worker's ending, once: when it stopped, or when its code outlived the
    /// shutdown timeout (a process without the master must not wait for it forever).
    fn report(&mut self, ending: OwnedEnding<M>) {
        if !self.reported {
            self.reported = true;
            // Nobody listens only when the job is over already.
            let _ = self.ended.send((self.rank, ending));
        }
    }

    /// Once this worker begins to stop, its ending is reported within the shutdown timeout.
    fn arm_stop_deadline(&mut self, ctx: &mut Context<Self>) {
        if self.stop_deadline_armed || Instant::now().checked_add(self.shutdown_timeout).is_none() {
            return;
        }
        self.stop_deadline_armed = true;
        ctx.run_later(self.shutdown_timeout, |act, ctx| {
            // Stopped, it waited for the master's word: its own failure, then.
            if act.end_unheard(ctx) {
                return;
            }
            if !act.reported {
                tracing::warn!(
                    rank = act.rank,
                    "the worker's code outlived the shutdown timeout; giving up on it"
                );
                let ending = act
                    .ending
                    .clone()
                    .or_else(|| act.pending_stop.clone())
                    .unwrap_or_else(|| {
                        OwnedEnding::Failed(JobError::WorkersTimedOut {
                            during: Waiting::Shutdown,
                            missing: vec![act.rank],
                            waited: act.shutdown_timeout,
                            refused: Vec::new(),
                        })
                    });
                act.report(ending);
                ctx.stop();
            }
        });
    }

    fn dispatch(&mut self, ctx: &mut Context<Self>, work: Work<M>) {
        let Some(mut task) = self.task.take() else {
            // Unreachable by the protocol; fail loudly rather than drop the work.
            self.send(ToMaster::Failed {
                attempt: self.attempt,
                error: JobError::Runtime {
                    message: format!("work dispatched to worker {} while it was busy", self.rank),
                },
            });
            return;
        };
        self.iterating = matches!(work, Work::Iterate(..));
        let (inline, during) = match work {
            Work::Iterate(i, _) => (self.placer.inline_iteration(), Waiting::Iteration(i)),
            Work::Start => (self.placer.inline_lifecycle(), Waiting::Registration),
            Work::Stop(_) => (self.placer.inline_lifecycle(), Waiting::Shutdown),
        };
        if inline {
            self.watch.enter(Who::Worker(self.rank), during);
            let worked = task.run(work);
            self.watch.exit();
            self.task = Some(task);
            self.on_worked(ctx, worked);
        } else {
            // The pool thread owns the task until it sends it back with the outcome. If the
            // worker is gone by then (the job failed, and gave up on this code after its
            // grace), the code's interceptors still see the end, here.
            let addr = ctx.address();
            let (heard, end) = (Arc::clone(&self.heard), self.end.clone());
            self.executor.spawn(move || {
                let worked = task.run(work);
                if let Err(actix::dev::SendError::Closed(WorkDone { mut task, .. })) =
                    addr.try_send(WorkDone { task, worked })
                {
                    let error = heard
                        .get()
                        .cloned()
                        .or_else(|| end.first().map(|(e, _)| e.clone()))
                        .unwrap_or(JobError::Cancelled);
                    let _ = task.run(Work::Stop(OwnedEnding::Failed(error)));
                }
            });
        }
    }

    fn on_worked(&mut self, ctx: &mut Context<Self>, worked: Worked<W>) {
        if let Some(task) = &mut self.task {
            task.attempt = self.attempt;
        }
        self.iterating = false;
        let stale = self.stale.swap(false, std::sync::atomic::Ordering::AcqRel);
        if stale && matches!(worked, Worked::Iterated(_)) {
            tracing::debug!(
                rank = self.rank,
                "dropped the outcome of an iteration of the master this worker left behind"
            );
            return self.after_work(ctx);
        }
        match worked {
            Worked::Started(Ok(())) => {
                self.started = true;
                if self.pending_stop.is_none() {
                    self.send(ToMaster::Registered {
                        attempt: self.attempt,
                    });
                }
            }
            Worked::Iterated(Ok(report)) => {
                self.placer.observe(report.elapsed);
                let iteration = report.iteration;
                match self.try_send(ToMaster::Result(report)) {
                    Ok(()) => {}
                    // Replaced: its replacement redoes the iteration, and this worker is
                    // told to stop.
                    Err(TransportError::Replaced { .. }) => {
                        tracing::debug!(
                            rank = self.rank,
                            iteration,
                            "a replaced worker's result is dropped"
                        )
                    }
                    // A result that does not survive the wire encoding fails as the
                    // master would see it over a network.
                    Err(e @ TransportError::Undecodable { .. }) => self.fail(e.into()),
                    // A result that cannot be sent (too large for a frame, say) must not
                    // leave the master waiting for it.
                    Err(e) => self.fail(JobError::Transport {
                        message: format!(
                            "worker {} could not send its result of iteration {iteration}: {e}",
                            self.rank
                        ),
                    }),
                }
            }
            Worked::Started(Err(error)) | Worked::Iterated(Err(error)) => self.fail(error),
            Worked::Skipped => {
                tracing::debug!(
                    rank = self.rank,
                    "the job failed: the iteration is not computed"
                );
            }
            Worked::Stopped(result) => {
                let mut ending = self.ending.take();
                if let Err(error) = result {
                    self.send(ToMaster::Failed {
                        attempt: self.attempt,
                        error: error.clone(),
                    });
                    if !matches!(ending, Some(OwnedEnding::Failed(_))) {
                        ending = Some(OwnedEnding::Failed(error));
                    }
                }
                // A failed worker ends with the job's first failure, as the master knows it.
                if let (Some(OwnedEnding::Failed(_)), Some(first)) = (&ending, &self.verdict) {
                    ending = Some(OwnedEnding::Failed(first.clone()));
                }
                let done = match self.task.as_mut() {
                    Some(task) => task.done(self.attempt),
                    None => ToMaster::Done {
                        attempt: self.attempt,
                        rows: Default::default(),
                        attachments: Vec::new(),
                    },
                };
                self.send(done);
                match ending {
                    // Its own failure may not be the job's first: the master's abort says.
                    Some(failed @ OwnedEnding::Failed(_))
                        if self.failed_first && self.verdict.is_none() && !self.reported =>
                    {
                        self.awaiting_verdict = Some(failed);
                        ctx.run_later(VERDICT_GRACE, |act, ctx| {
                            act.end_unheard(ctx);
                        });
                        return;
                    }
                    Some(ending) => self.report(ending),
                    None => {}
                }
                ctx.stop();
                return;
            }
        }
        self.after_work(ctx);
    }

    /// Starts what waited for the task to come home: a stop, or the newest iteration.
    fn after_work(&mut self, ctx: &mut Context<Self>) {
        if let Some(ending) = self.pending_stop.take() {
            self.pending_iterate = None;
            self.ending = Some(ending.clone());
            self.arm_stop_deadline(ctx);
            self.dispatch(ctx, Work::Stop(ending));
        } else if let Some((iteration, last)) = self.pending_iterate.take() {
            self.dispatch(ctx, Work::Iterate(iteration, last));
        }
    }

    /// Registers with a master's node that has not seen this worker (a master process
    /// started again): in its attempt, keeping the shard `init` loaded, and dropping what
    /// was under way for the master left behind.
    fn register_again(&mut self, ctx: &mut Context<Self>, attempt: Attempt) {
        tracing::info!(
            rank = self.rank,
            attempt,
            "reached the master again; registering in its attempt"
        );
        self.attempt = attempt;
        self.pending_iterate = None;
        if self.sync_answers.is_some() {
            // A compute may be waiting in a sync call the new master never saw.
            self.fail(master_lost_in_barrier_mode(self.rank, attempt));
            // Idle between iterations, nothing else would start the stop.
            if self.task.is_some() {
                self.after_work(ctx);
            }
            return;
        }
        match &mut self.task {
            Some(task) => task.attempt = attempt,
            None => self
                .stale
                .store(self.iterating, std::sync::atomic::Ordering::Release),
        }
        if self.started {
            self.send(ToMaster::Registered { attempt });
        }
    }

    fn begin_stop(&mut self, ctx: &mut Context<Self>, ending: OwnedEnding<M>) {
        self.arm_stop_deadline(ctx);
        if self.task.is_some() {
            self.ending = Some(ending.clone());
            self.dispatch(ctx, Work::Stop(ending));
        } else {
            self.pending_stop = Some(ending);
        }
    }
}

impl<M: Payload, W: Payload> Actor for WorkerActor<M, W> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.dispatch(ctx, Work::Start);
    }
}

impl<M: 'static> Message for ToWorker<M> {
    type Result = ();
}

impl<M: Payload, W: Payload> Handler<ToWorker<M>> for WorkerActor<M, W> {
    type Result = ();

    fn handle(&mut self, msg: ToWorker<M>, ctx: &mut Context<Self>) {
        match &msg {
            ToWorker::Abort { attempt, error } if *attempt == self.attempt => {
                self.hear_verdict(ctx, error);
            }
            // The job completed without this worker's failure mattering (the policy went
            // on without it): its own failure is its ending.
            ToWorker::Finish { attempt, .. }
                if *attempt == self.attempt && self.awaiting_verdict.is_some() =>
            {
                self.end_unheard(ctx);
                return;
            }
            _ => {}
        }
        match self.state.on_message(&msg) {
            WorkerCommand::Compute(iteration) => {
                let ToWorker::Iterate { last, .. } = msg else {
                    unreachable!("only Iterate computes")
                };
                if self.task.is_some() {
                    self.dispatch(ctx, Work::Iterate(iteration, last));
                } else {
                    // Still computing an iteration the job went on without: skip to this
                    // one when it returns (its late result is dropped as stale).
                    if let Some((skipped, _)) = self.pending_iterate.replace((iteration, last)) {
                        tracing::debug!(
                            rank = self.rank,
                            skipped,
                            "a straggler skips an iteration"
                        );
                    }
                }
            }
            WorkerCommand::Stop => {
                let ending =
                    OwnedEnding::told(msg).expect("WorkerState stops only on Finish or Abort");
                self.begin_stop(ctx, ending);
            }
            WorkerCommand::Answer => {
                if let (ToWorker::SyncReply { epoch, result, .. }, Some(answers)) =
                    (msg, &self.sync_answers)
                {
                    answers.answer(epoch, result);
                }
            }
            WorkerCommand::Register(attempt) => self.register_again(ctx, attempt),
            WorkerCommand::Proceed => {}
            WorkerCommand::Drop => {
                tracing::trace!(rank = self.rank, %msg, "dropped a message from the master");
            }
        }
    }
}

/// A unit of work came back from the pool.
struct WorkDone<M, W> {
    task: Box<WorkerTask<M, W>>,
    worked: Worked<W>,
}

impl<M: 'static, W: 'static> Message for WorkDone<M, W> {
    type Result = ();
}

impl<M: Payload, W: Payload> Handler<WorkDone<M, W>> for WorkerActor<M, W> {
    type Result = ();

    fn handle(&mut self, done: WorkDone<M, W>, ctx: &mut Context<Self>) {
        self.task = Some(done.task);
        self.on_worked(ctx, done.worked);
    }
}
