//! The worker actor: runs one worker's computable and interceptors, one unit at a time.

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use actix::{Actor, ActorContext, AsyncContext, Context, Handler, Message};

use super::pool::{guarded, Executor, Placer};
use super::watch::{Watch, Who};
use super::{DynWorker, OwnedEnding, WorkerHooks};
use crate::compute::{JobEnd, SyncLink, SyncSender, WorkerContext};
use crate::config::JobConfig;
use crate::coordinator::Shard;
use crate::error::SyncError;
use crate::error::{drop_guarded, Cause, JobError, Phase, Waiting};
use crate::ids::{Attempt, Epoch, Iteration, Rank};
use crate::payload::Payload;
use crate::protocol::{
    Recovery, Report, SyncResult, ToMaster, ToWorker, Work, Worked, WorkerAction, WorkerNode,
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
    /// Set by the worker's driver while the work away belongs to a master it left behind
    /// (its failure then ends nothing).
    pub(crate) stale: Arc<std::sync::atomic::AtomicBool>,
    /// When the unit of work under way started, then when its compute ended: one clock
    /// read per iteration.
    clock: Instant,
    /// The parent of the span of the unit of work under way (set by its driver): the
    /// iteration's span in the master's process, the job's elsewhere.
    pub(crate) parent: tracing::Span,
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
            clock: Instant::now(),
            parent: tracing::Span::none(),
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
        self.run_at(work, Instant::now()).0
    }

    /// Runs one unit of work that started at `started` (a clock read of the caller's,
    /// which units run back to back share): returns what it did and when it ended, from
    /// one clock read.
    pub(crate) fn run_at(&mut self, work: Work<M>, started: Instant) -> (Worked<W>, Instant) {
        self.clock = started;
        let worked = self.run_unclocked(work);
        let ended = match worked {
            // Its compute read the clock as it ended.
            Worked::Iterated(Ok(_)) => self.clock,
            _ => Instant::now(),
        };
        (worked, ended)
    }

    fn run_unclocked(&mut self, work: Work<M>) -> Worked<W> {
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
        let (rank, attempt) = (self.ctx.rank, self.attempt);
        let _span = tracing::debug_span!(parent: &self.parent, "init", rank, attempt).entered();
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
        let (rank, attempt) = (self.ctx.rank, self.attempt);
        let _span = tracing::debug_span!(parent: &self.parent, "compute", rank, iteration, attempt)
            .entered();
        let started = self.clock;
        self.ctx.iteration = iteration;
        // `None` in iteration 1 — also when a restarted job starts over. The result it
        // replaces may be the last reference to it: its `Drop` is the master's code.
        let previous = std::mem::replace(&mut self.ctx.last, last);
        drop_guarded(previous).map_err(|cause| JobError::Master {
            iteration,
            phase: Phase::Drop,
            cause,
        })?;
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
        self.clock = Instant::now();
        Ok(Report {
            attempt: self.attempt,
            iteration,
            result,
            halt_vote: self.ctx.halt_vote,
            elapsed: self.clock.saturating_duration_since(started),
        })
    }

    fn stop(&mut self, ending: &OwnedEnding<M>) -> Result<(), JobError> {
        let (rank, attempt) = (self.ctx.rank, self.attempt);
        let _span =
            tracing::debug_span!(parent: &self.parent, "post_application", rank, attempt).entered();
        // A failure to let go of the last master result is the master's; the worker's
        // interceptors still see the end.
        let mut first = None;
        if let OwnedEnding::Completed { last, .. } = ending {
            let previous = self.ctx.last.replace(Arc::clone(last));
            if let Err(cause) = drop_guarded(previous) {
                first = Some(JobError::Master {
                    iteration: self.ctx.iteration,
                    phase: Phase::Drop,
                    cause,
                });
            }
        }
        let ending = ending.as_ending();
        let ctx = &self.ctx;
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
/// What the master told the worker of `rank`, as its process hears it: an abort ends the
/// job for the process (no compute of it starts from now on), unless it carries this
/// rank's own failure, which dismisses only this worker.
pub(crate) fn hear_abort<M>(end: &JobEnd, rank: Rank, msg: &ToWorker<M>) {
    if let ToWorker::Abort { error, .. } = msg {
        if Recovery::recoverable(error) != Some(rank) {
            end.end(error);
        }
    }
}

/// A worker's link, as the way its sync calls go: a call that cannot go fails as the
/// transport's error.
struct LinkCalls<W>(Arc<dyn WorkerLink<W>>);

impl<W: Payload> SyncSender<W> for LinkCalls<W> {
    fn send_call(&self, call: ToMaster<W>) -> Result<(), JobError> {
        self.0.send(call).map_err(JobError::from)
    }
}

/// A call waits at most `patience` for its answer (`Duration::MAX`: until it comes).
pub(crate) fn sync_link<W: Payload>(
    link: Arc<dyn WorkerLink<W>>,
    attempt: Attempt,
    patience: Duration,
) -> (SyncLink<W>, SyncAnswers) {
    let (to, answers) = mpsc::channel();
    let ended = Arc::new(std::sync::OnceLock::new());
    let sync = SyncLink {
        link: Arc::new(LinkCalls(link)),
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

/// How long a worker that failed on its own waits, once stopped, for the master to say
/// what the job's first failure was (normally its abort arrives within milliseconds).
pub(crate) const VERDICT_GRACE: Duration = Duration::from_secs(2);

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

/// A timer a worker's node armed.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Timer {
    /// [`WorkerNode::handle_grace_over`].
    Grace,
    /// [`WorkerNode::handle_stop_deadline`], after this long.
    StopDeadline(Duration),
    /// [`WorkerNode::handle_verdict_over`].
    VerdictGrace,
}

/// A unit of a worker's code, back from the pool: handed to the worker's driver with
/// [`WorkerDriver::handle_done`].
pub(crate) struct WorkDone<M, W> {
    pub(crate) task: Box<WorkerTask<M, W>>,
    pub(crate) worked: Worked<W>,
}

/// How a unit of work done away gets home: called on the thread it ran on. It gives the
/// work back when nobody takes it (the worker is gone).
pub(crate) type Homeward<M, W> =
    Box<dyn FnOnce(WorkDone<M, W>) -> Result<(), WorkDone<M, W>> + Send>;

/// Where a worker's driver lives: its own actor (a worker reached through a transport), or
/// the master's node actor (a worker of the node's own process, stepped directly).
pub(crate) trait Host<M, W> {
    /// Sends `msg` to the master's node.
    fn send(&mut self, msg: ToMaster<W>) -> Result<(), TransportError>;
    /// Where a unit of work run on the pool comes back to.
    fn homeward(&mut self) -> Homeward<M, W>;
    /// Calls `timer` on this worker's driver after `after`.
    fn arm(&mut self, timer: Timer, after: Duration);
    /// The time now, for a unit of work that starts inline: a host that runs units back to
    /// back hands on when the last one ended ([`ran_until`](Self::ran_until)) instead of
    /// reading the clock again.
    fn now(&mut self) -> Instant {
        Instant::now()
    }
    /// A unit of work run inline ended at `at`.
    fn ran_until(&mut self, at: Instant) {
        let _ = at;
    }
    /// The watch entry the host made for a run of units back to back — what they wait
    /// for, and since when — if it made one: a unit of that kind then only says who runs,
    /// one of another kind enters the watch for itself and puts the host's entry back.
    /// The default: none — each unit enters the watch.
    fn watching(&self) -> Option<(Waiting, Instant)> {
        None
    }
    /// The worker is done: nothing more reaches its driver.
    fn stop(&mut self);
    /// The span a unit of the worker's code runs under, on whichever thread: the default
    /// is the current one (the job's span, on the job's thread).
    fn span(&self) -> tracing::Span {
        tracing::Span::current()
    }
}

/// Drives one worker's node ([`WorkerNode`]): feeds it the master's messages and what the
/// worker's code did, and carries out what it asks — running the code inline or on the
/// pool (see [`Placer`]), sending, answering sync calls, arming its timers, reporting —
/// through its [`Host`].
pub(crate) struct WorkerDriver<M: Payload, W: Payload> {
    rank: Rank,
    node: WorkerNode<M, W>,
    /// `None` while the task is away on the pool.
    task: Option<Box<WorkerTask<M, W>>>,
    /// In barrier mode: where answers to sync calls go, to the compute waiting for them.
    sync_answers: Option<SyncAnswers>,
    executor: Executor,
    placer: Placer,
    /// Where this worker reports its ending when it stops: a process without the master
    /// takes its outcome from its workers.
    ended: tokio::sync::mpsc::UnboundedSender<(Rank, OwnedEnding<M>)>,
    shutdown_timeout: Duration,
    watch: Arc<Watch>,
    grace: Duration,
    end: JobEnd,
    /// The task's stale flag (see [`WorkerTask::stale`]): set while the iteration away
    /// belongs to a master this worker left behind (it registered with a master process
    /// started again meanwhile), whose outcome is dropped.
    stale: Arc<std::sync::atomic::AtomicBool>,
    /// The verdict, for code given up on after the grace: its `post_application` runs
    /// with it when it returns.
    heard: Arc<std::sync::OnceLock<JobError>>,
}

impl<M: Payload, W: Payload> WorkerDriver<M, W> {
    pub(crate) fn new(
        task: WorkerTask<M, W>,
        sync_answers: Option<SyncAnswers>,
        executor: Executor,
        placer: Placer,
        watch: Arc<Watch>,
        ending: EndingReport<M>,
    ) -> Self {
        let barrier_mode = sync_answers.is_some();
        WorkerDriver {
            rank: task.ctx.rank,
            node: WorkerNode::new(
                task.ctx.rank,
                task.attempt,
                ending.own_failure_ends_job,
                barrier_mode,
            ),
            ended: ending.to,
            shutdown_timeout: ending.within,
            grace: ending.grace,
            end: ending.end,
            stale: Arc::clone(&task.stale),
            heard: Arc::default(),
            sync_answers,
            watch,
            task: Some(Box::new(task)),
            executor,
            placer,
        }
    }

    /// Starts the worker: its start-up runs.
    pub(crate) fn start(&mut self, host: &mut impl Host<M, W>) {
        self.node.start();
        self.drive(host);
    }

    /// A message from the master's node.
    pub(crate) fn handle_message(&mut self, msg: ToWorker<M>, host: &mut impl Host<M, W>) {
        self.node.handle_message(msg);
        self.drive(host);
    }

    /// A unit of work came back from the pool.
    pub(crate) fn handle_done(&mut self, done: WorkDone<M, W>, host: &mut impl Host<M, W>) {
        self.task = Some(done.task);
        self.worked(done.worked);
        self.drive(host);
    }

    /// A timer the node armed went off.
    pub(crate) fn handle_timer(&mut self, timer: Timer, host: &mut impl Host<M, W>) {
        match timer {
            Timer::Grace => self.node.handle_grace_over(),
            Timer::StopDeadline(within) => self.node.handle_stop_deadline(within),
            Timer::VerdictGrace => self.node.handle_verdict_over(),
        }
        self.drive(host);
    }

    fn try_send(host: &mut impl Host<M, W>, msg: ToMaster<W>) -> Result<(), TransportError> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| host.send(msg))) {
            Ok(sent) => sent,
            Err(payload) => Err(TransportError::Io(format!(
                "the transport panicked: {}",
                Cause::from_panic(payload)
            ))),
        }
    }

    fn send(&self, host: &mut impl Host<M, W>, msg: ToMaster<W>) {
        match Self::try_send(host, msg) {
            Ok(()) => {}
            // A replacement took this worker's rank: its link is closed on purpose.
            Err(TransportError::Replaced { .. }) => {
                tracing::debug!(rank = self.rank, "this worker's link is closed")
            }
            // The job ended for this worker (its link may be closed with it): nothing waits
            // for what it says now.
            Err(error) if self.node.has_ended() => {
                tracing::debug!(rank = self.rank, %error, "could not reach the master")
            }
            // The master's node is gone: nothing is waiting for this worker any more.
            Err(error) => tracing::warn!(rank = self.rank, %error, "could not reach the master"),
        }
    }

    /// Carries out every action the node queued, in order, feeding back what they did.
    fn drive(&mut self, host: &mut impl Host<M, W>) {
        while let Some(action) = self.node.poll_action() {
            match action {
                WorkerAction::Run(work) => self.run(host, work),
                WorkerAction::Send(msg) => self.send(host, msg),
                WorkerAction::SendResult(report) => {
                    let iteration = report.iteration;
                    let sent = Self::try_send(host, ToMaster::Result(report));
                    self.node.handle_sent(iteration, sent);
                }
                WorkerAction::SendDone => {
                    let attempt = self.node.attempt();
                    let done = match self.task.as_mut() {
                        Some(task) => task.done(attempt),
                        None => ToMaster::Done {
                            attempt,
                            rows: Default::default(),
                            attachments: Vec::new(),
                        },
                    };
                    self.send(host, done);
                }
                WorkerAction::Answer(epoch, result) => {
                    if let Some(answers) = &self.sync_answers {
                        answers.answer(epoch, result);
                    }
                }
                WorkerAction::Verdict(error) => {
                    // (The process's `JobEnd` is not set here: an abort may only retire
                    // this worker. The transport's inbox sets it for a job's failure.)
                    let _ = self.heard.set(error.clone());
                    if let Some(sync) = &self.sync_answers {
                        sync.end(&error);
                    }
                }
                WorkerAction::EndSync(error) => {
                    if let Some(sync) = &self.sync_answers {
                        sync.end(&error);
                    }
                }
                // No compute of this process starts from now on.
                WorkerAction::EndJob(error) => self.end.end(&error),
                WorkerAction::MarkStale => {
                    self.stale.store(true, std::sync::atomic::Ordering::Release)
                }
                WorkerAction::ArmGrace => host.arm(Timer::Grace, self.grace),
                WorkerAction::ArmStopDeadline => {
                    let within = self.shutdown_timeout;
                    if Instant::now().checked_add(within).is_some() {
                        host.arm(Timer::StopDeadline(within), within);
                    }
                }
                WorkerAction::ArmVerdictGrace => host.arm(Timer::VerdictGrace, VERDICT_GRACE),
                WorkerAction::Report(ending) => {
                    // Nobody listens only when the job is over already.
                    let _ = self.ended.send((self.rank, ending));
                }
                WorkerAction::Stop => host.stop(),
            }
        }
    }

    /// Runs one unit of the worker's code, inline or on the pool.
    fn run(&mut self, host: &mut impl Host<M, W>, work: Work<M>) {
        let Some(mut task) = self.task.take() else {
            // The node hands out work only while the code is here.
            tracing::error!(rank = self.rank, "work for a worker whose code is away");
            return;
        };
        task.attempt = self.node.attempt();
        task.parent = host.span();
        let (inline, during) = match work {
            Work::Iterate(i, _) => (self.placer.inline_iteration(), Waiting::Iteration(i)),
            Work::Start => (self.placer.inline_lifecycle(), Waiting::Registration),
            Work::Stop(_) => (self.placer.inline_lifecycle(), Waiting::Shutdown),
        };
        if inline {
            let started = host.now();
            let who = Who::Worker(self.rank);
            // A unit of the run's own kind shares its deadline; another (a stop after a
            // failure, say) has its own, from its own start.
            let watching = host.watching();
            let chained = watching.filter(|(kind, _)| {
                std::mem::discriminant(kind) == std::mem::discriminant(&during)
            });
            if chained.is_some() {
                self.watch.rename(who, during);
            } else {
                self.watch.enter_at(who, during, started);
            }
            let (worked, ended) = task.run_at(work, started);
            match (chained, watching) {
                (Some(_), _) => {}
                (None, Some((kind, since))) => self.watch.enter_at(who, kind, since),
                (None, None) => self.watch.exit(),
            }
            host.ran_until(ended);
            self.task = Some(task);
            self.worked(worked);
        } else {
            // The pool thread owns the task until it sends it back with the outcome. If the
            // worker is gone by then (the job failed, and gave up on this code after its
            // grace), the code's interceptors still see the end, here.
            let home = host.homeward();
            let (heard, end) = (Arc::clone(&self.heard), self.end.clone());
            self.executor.spawn(move || {
                let worked = task.run(work);
                if let Err(WorkDone { mut task, .. }) = home(WorkDone { task, worked }) {
                    stop_given_up(&mut task, heard.get().cloned(), &end);
                }
            });
        }
    }

    /// The worker's code is home with what it did.
    fn worked(&mut self, worked: Worked<W>) {
        let stale = self.stale.swap(false, std::sync::atomic::Ordering::AcqRel);
        // (An iteration of a master left behind tells nothing about the next one's time.)
        if let (Worked::Iterated(Ok(report)), false) = (&worked, stale) {
            self.placer.observe(report.elapsed);
        }
        self.node.handle_worked(worked, stale);
    }
}

/// Ends the code of a worker that ended without it (the job failed, and gave up on this
/// code after its grace): its interceptors' `post_application` runs with the verdict the
/// worker `heard`, else the process's first failure.
pub(crate) fn stop_given_up<M: Payload, W: Payload>(
    task: &mut WorkerTask<M, W>,
    heard: Option<JobError>,
    end: &JobEnd,
) {
    let error = heard
        .or_else(|| end.first().map(|(e, _)| e.clone()))
        .unwrap_or(JobError::Cancelled);
    let _ = task.run(Work::Stop(OwnedEnding::Failed(error)));
}

/// A worker reached through a transport (in a process without the master, or across a
/// network from it): its driver in an actor of its own, its messages to the master on its
/// link.
pub(crate) struct WorkerActor<M: Payload, W: Payload> {
    driver: WorkerDriver<M, W>,
    link: Arc<dyn WorkerLink<W>>,
}

impl<M: Payload, W: Payload> WorkerActor<M, W> {
    pub(crate) fn new(driver: WorkerDriver<M, W>, link: Arc<dyn WorkerLink<W>>) -> Self {
        WorkerActor { driver, link }
    }
}

/// The host of a worker in an actor of its own.
struct ActorHost<'a, M: Payload, W: Payload> {
    link: &'a Arc<dyn WorkerLink<W>>,
    ctx: &'a mut Context<WorkerActor<M, W>>,
}

impl<M: Payload, W: Payload> Host<M, W> for ActorHost<'_, M, W> {
    fn send(&mut self, msg: ToMaster<W>) -> Result<(), TransportError> {
        self.link.send(msg)
    }

    fn homeward(&mut self) -> Homeward<M, W> {
        let addr = self.ctx.address();
        Box::new(move |done| match addr.try_send(Home(done)) {
            Err(actix::dev::SendError::Closed(Home(done))) => Err(done),
            // An unbounded mailbox is never full.
            _ => Ok(()),
        })
    }

    fn arm(&mut self, timer: Timer, after: Duration) {
        self.ctx.run_later(after, move |act, ctx| {
            act.driver.handle_timer(
                timer,
                &mut ActorHost {
                    link: &act.link,
                    ctx,
                },
            );
        });
    }

    fn stop(&mut self) {
        self.ctx.stop();
    }
}

impl<M: Payload, W: Payload> Actor for WorkerActor<M, W> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let link = &self.link;
        self.driver.start(&mut ActorHost { link, ctx });
    }
}

impl<M: 'static> Message for ToWorker<M> {
    type Result = ();
}

impl<M: Payload, W: Payload> Handler<ToWorker<M>> for WorkerActor<M, W> {
    type Result = ();

    fn handle(&mut self, msg: ToWorker<M>, ctx: &mut Context<Self>) {
        let link = &self.link;
        self.driver
            .handle_message(msg, &mut ActorHost { link, ctx });
    }
}

/// A unit of work came back from the pool.
struct Home<M, W>(WorkDone<M, W>);

impl<M: 'static, W: 'static> Message for Home<M, W> {
    type Result = ();
}

impl<M: Payload, W: Payload> Handler<Home<M, W>> for WorkerActor<M, W> {
    type Result = ();

    fn handle(&mut self, Home(done): Home<M, W>, ctx: &mut Context<Self>) {
        let link = &self.link;
        self.driver.handle_done(done, &mut ActorHost { link, ctx });
    }
}
