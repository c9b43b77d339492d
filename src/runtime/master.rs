//! The master actor: runs the master's computable and interceptors, and drives the
//! iteration loop ([`Schedule`]) from what the barrier reports.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, ActorContext, Addr, AsyncContext, Context, Handler, Message};
use tokio::sync::oneshot;

use super::barrier::{
    AbortJob, BarrierActor, FinishJob, FromGate, Open, Recovering, WorkerReports,
};
use super::coordination::Coordination;
use super::pool::{guarded, ComputePool, Placer};
use super::watch::{Watch, Who};
use super::{Checkpointing, DynMaster, MasterHooks, OwnedEnding, Resume};
use crate::checkpoint::Checkpoint;
use crate::compute::MasterContext;
use crate::compute::Payload;
use crate::config::JobConfig;
use crate::error::{Cause, Hook, JobError, Phase, Waiting};
use crate::events::{Events, JobEvent};
use crate::protocol::{
    Attempt, GateOutput, Gathered, HaltedBy, Iteration, Next, Rank, Recover, Schedule, Tally,
};
use crate::report::{IterationReport, JobOutcome, JobReport, Recovered};

/// The master's user code and context: moved to the pool and back as one value.
pub(crate) struct MasterTask<M, W> {
    computable: DynMaster<M, W>,
    interceptors: MasterHooks<M, W>,
    ctx: MasterContext<M, W>,
    entered: usize,
    checkpointing: Option<Checkpointing>,
    /// The computable's state to restore before the job starts, when it resumes.
    restore: Option<Vec<u8>>,
    /// Whether the checkpoint resumed from halted the job.
    resumed_halt: Option<HaltedBy>,
    /// Whether to keep the computable's state as it starts (`initial`), to start over
    /// from when every worker restarts without a checkpoint.
    keep_initial: bool,
    initial: Option<Vec<u8>>,
    attempt: Attempt,
}

/// What one iteration's master work produced.
struct Computed<M> {
    result: Arc<M>,
    halt: bool,
    /// Whether a checkpoint of this iteration was saved.
    checkpointed: bool,
}

enum Work<M, W> {
    Start,
    Iterate(Round<W>),
    Stop(OwnedEnding<M>),
}

/// One iteration's input to the master, and what the report needs of it.
struct Round<W> {
    iteration: Iteration,
    gathered: Gathered<W>,
    span: tracing::Span,
    /// Whether the workers' votes halt the job after this iteration (the master's own
    /// halt is known once it computed): a checkpoint of it says so.
    workers_halt: bool,
}

enum Worked<M> {
    Started(Result<(), JobError>),
    Iterated {
        iteration: Iteration,
        tally: Tally,
        left_out: Vec<Rank>,
        elapsed: Duration,
        result: Result<Computed<M>, JobError>,
    },
    Stopped(Result<(), JobError>),
}

impl<M: Payload, W: Payload> MasterTask<M, W> {
    pub(crate) fn new(
        computable: DynMaster<M, W>,
        interceptors: MasterHooks<M, W>,
        mut ctx: MasterContext<M, W>,
        checkpointing: Option<Checkpointing>,
        resume: Option<Resume<M>>,
        attempt: Attempt,
    ) -> Self {
        let (restore, resumed_halt) = match resume.map(|r| r.into_context(&mut ctx)) {
            Some((state, halted)) => (Some(state), halted),
            None => (None, None),
        };
        MasterTask {
            computable,
            interceptors,
            ctx,
            entered: 0,
            checkpointing,
            restore,
            resumed_halt,
            keep_initial: false,
            initial: None,
            attempt,
        }
    }

    /// Keeps the computable's state as the job starts, to start over from when every
    /// worker restarts before the first checkpoint (`FailurePolicy::RestartAll`).
    pub(crate) fn keeping_initial_state(mut self, keep: bool) -> Self {
        self.keep_initial = keep;
        self
    }

    /// Starts over as `attempt`, every worker having restarted: from the newest usable
    /// checkpoint, or from the start (the computable's state as the job started). Returns
    /// the checkpoint's iteration, if there was one (and whether it halted the job).
    fn restart(
        &mut self,
        attempt: Attempt,
    ) -> Result<Option<(Iteration, Option<HaltedBy>)>, JobError> {
        self.attempt = attempt;
        let ctx = &self.ctx;
        let mut fresh = MasterContext::new(ctx.workers, Arc::clone(&ctx.job_id), ctx.iterations);
        let resumed = match &mut self.checkpointing {
            Some(c) => super::resume::<M>(c.store.as_mut(), &fresh.job_id)?,
            None => None,
        };
        let (from, state) = match resumed {
            Some(resume) => {
                let iteration = resume.iteration;
                let (state, halted) = resume.into_context(&mut fresh);
                (Some((iteration, halted)), state)
            }
            None => (None, self.initial.clone().unwrap_or_default()),
        };
        self.ctx = fresh;
        self.restore_state(&state)?;
        Ok(from)
    }

    /// Restores the computable's own state (`MasterComputable::restore_state`).
    fn restore_state(&mut self, state: &[u8]) -> Result<(), JobError> {
        let computable = &mut self.computable;
        guarded(|| computable.restore_state(state))
            .map_err(|c| Self::fail(self.ctx.iteration, Phase::Checkpoint, c))
    }

    fn fail(iteration: Iteration, phase: Phase, cause: Cause) -> JobError {
        JobError::Master {
            iteration,
            phase,
            cause,
        }
    }

    /// Runs one unit of work; the outer guard catches what the per-call guards cannot (a
    /// user type's `Drop`, say).
    fn run(&mut self, work: Work<M, W>) -> Worked<M> {
        let (phase, iteration) = match &work {
            Work::Start => (Phase::PreApplication, 0),
            Work::Iterate(round) => (Phase::Compute, round.iteration),
            Work::Stop(_) => (Phase::PostApplication, self.ctx.iteration),
        };
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run_unguarded(work))) {
            Ok(worked) => worked,
            Err(payload) => {
                let error = Self::fail(iteration, phase, Cause::from_panic(payload));
                match phase {
                    Phase::PreApplication => Worked::Started(Err(error)),
                    Phase::Compute => Worked::Iterated {
                        iteration,
                        tally: Tally::default(),
                        left_out: Vec::new(),
                        elapsed: Duration::ZERO,
                        result: Err(error),
                    },
                    _ => Worked::Stopped(Err(error)),
                }
            }
        }
    }

    fn run_unguarded(&mut self, work: Work<M, W>) -> Worked<M> {
        match work {
            Work::Start => Worked::Started(self.start()),
            Work::Iterate(round) => {
                let started = Instant::now();
                let (iteration, tally) = (round.iteration, round.gathered.tally);
                let left_out = round.gathered.left_out.clone();
                let result = self.iterate(round);
                Worked::Iterated {
                    iteration,
                    tally,
                    left_out,
                    elapsed: started.elapsed(),
                    result,
                }
            }
            Work::Stop(ending) => Worked::Stopped(self.stop(&ending)),
        }
    }

    /// The checkpoint's iteration the task resumes from; known until it starts.
    fn resumed_from(&self) -> Option<Iteration> {
        self.restore.is_some().then_some(self.ctx.iteration)
    }

    fn start(&mut self) -> Result<(), JobError> {
        if let Some(state) = self.restore.take() {
            self.restore_state(&state)?;
        }
        if self.keep_initial {
            let computable = &self.computable;
            let state = guarded(|| computable.save_state())
                .map_err(|c| Self::fail(self.ctx.iteration, Phase::Checkpoint, c))?;
            self.initial = Some(state);
        }
        let ctx = &self.ctx;
        for (i, hook) in self.interceptors.iter_mut().enumerate() {
            self.entered = i + 1;
            guarded(|| hook.pre_application(ctx))
                .map_err(|c| Self::fail(0, Phase::PreApplication, c))?;
        }
        Ok(())
    }

    fn iterate(&mut self, round: Round<W>) -> Result<Computed<M>, JobError> {
        let _span = round.span.entered();
        let iteration = round.iteration;
        let workers_halt = round.workers_halt;
        self.ctx.enter(iteration, round.gathered);
        let ctx = &self.ctx;
        for hook in self.interceptors.iter_mut() {
            guarded(|| hook.pre_iteration(ctx))
                .map_err(|c| Self::fail(iteration, Phase::PreIteration, c))?;
        }
        let (computable, ctx) = (&mut self.computable, &mut self.ctx);
        let (result, halt) = guarded(|| computable.compute(ctx))
            .map_err(|c| Self::fail(iteration, Phase::Compute, c))?
            .into_parts();
        let result = Arc::new(result);
        self.ctx.current = Some(Arc::clone(&result));
        let ctx = &self.ctx;
        for hook in self.interceptors.iter_mut().rev() {
            guarded(|| hook.post_iteration(ctx))
                .map_err(|c| Self::fail(iteration, Phase::PostIteration, c))?;
        }
        // The workers' results are no longer needed: free them before the next round.
        self.ctx.results = Vec::new();
        self.ctx.combined = None;
        self.ctx.last = Some(Arc::clone(&result));
        let halted = if halt {
            Some(HaltedBy::Master)
        } else {
            workers_halt.then_some(HaltedBy::Workers)
        };
        // The last iteration is always saved: a master started again after it ends at once.
        let last = halted.is_some() || iteration >= self.ctx.iterations;
        let checkpointed = self.save_checkpoint(iteration, &result, halted, last);
        Ok(Computed {
            result,
            halt,
            checkpointed,
        })
    }

    /// Saves a checkpoint of `iteration` if one is due — every `every` iterations, and the
    /// `last` one. A checkpoint that cannot be made or written is logged and skipped: the
    /// job goes on, and the one before stays.
    fn save_checkpoint(
        &mut self,
        iteration: Iteration,
        result: &M,
        halted: Option<HaltedBy>,
        last: bool,
    ) -> bool {
        let Some(checkpointing) = &mut self.checkpointing else {
            return false;
        };
        if iteration % checkpointing.every != 0 && !last {
            return false;
        }
        let computable = &self.computable;
        let made = guarded(|| computable.save_state())
            .map_err(|cause| format!("save_state failed: {cause}"))
            .and_then(|master_state| {
                let master_result = crate::codec::to_vec(result)
                    .map_err(|e| format!("the master result could not be encoded: {e}"))?;
                Ok(Checkpoint {
                    job_id: self.ctx.job_id.to_string(),
                    iteration,
                    attempt: self.attempt,
                    master_result,
                    master_state,
                    halted,
                })
            });
        let saved = made.and_then(|c| checkpointing.store.save(&c).map_err(|e| e.to_string()));
        match saved {
            Ok(()) => {
                tracing::debug!(iteration, "checkpoint saved");
                true
            }
            Err(error) => {
                tracing::warn!(iteration, %error, "checkpoint skipped; the previous one stays");
                false
            }
        }
    }

    fn stop(&mut self, ending: &OwnedEnding<M>) -> Result<(), JobError> {
        let ending = ending.as_ending();
        let ctx = &self.ctx;
        let mut first = None;
        for hook in self.interceptors[..self.entered].iter_mut().rev() {
            if let Err(c) = guarded(|| hook.post_application(ctx, ending)) {
                first.get_or_insert(Self::fail(ctx.iteration, Phase::PostApplication, c));
            }
        }
        self.entered = 0;
        first.map_or(Ok(()), Err)
    }
}

/// A deadline on the master's own work while it is on the pool.
#[derive(Debug, Clone, Copy)]
struct Deadline {
    at: Instant,
    since: Instant,
    during: Waiting,
}

/// Drives the job: starts iterations, runs the master's code on each complete round,
/// decides what follows, and ends the job with its outcome.
pub(crate) struct MasterActor<M: Payload, W: Payload> {
    config: Arc<JobConfig>,
    task: Option<Box<MasterTask<M, W>>>,
    barrier: Addr<BarrierActor<M, W>>,
    pool: Arc<ComputePool>,
    placer: Placer,
    schedule: Schedule,
    events: Events,
    outcome: Option<oneshot::Sender<Result<JobOutcome<M>, JobError>>>,
    report: JobReport,
    started: Instant,
    iteration_started: Instant,
    span: Option<tracing::Span>,
    last: Option<Arc<M>>,
    master_ready: bool,
    workers_ready: bool,
    /// Set once the job completes or fails; the first failure wins.
    ending: Option<OwnedEnding<M>>,
    /// Every worker is done (or the shutdown timeout passed).
    drained: bool,
    stopping: bool,
    deadline: Option<Deadline>,
    /// The master's work outlived its deadline and may never come back.
    stuck: bool,
    watch: Arc<Watch>,
    /// The attempt under way: every worker restarts as a new one under
    /// `FailurePolicy::RestartAll`.
    attempt: Attempt,
    /// The checkpoint's iteration the current attempt starts after, if any.
    start_after: Option<Iteration>,
    /// Whether that checkpoint's iteration halted the job.
    resumed_halt: Option<HaltedBy>,
    /// Every worker restarted (as `attempt`) while the master's code was away on the
    /// pool: what it brings back is discarded, and the master starts over.
    pending_restart: bool,
    /// The job's coordinator: `on_finish` or `on_error` when the job ends.
    coordination: Option<Coordination>,
}

impl<M: Payload, W: Payload> MasterActor<M, W> {
    pub(crate) fn new(
        config: Arc<JobConfig>,
        task: MasterTask<M, W>,
        barrier: Addr<BarrierActor<M, W>>,
        pool: Arc<ComputePool>,
        events: Events,
        outcome: oneshot::Sender<Result<JobOutcome<M>, JobError>>,
        watch: Arc<Watch>,
    ) -> Self {
        let now = Instant::now();
        // A resumed task starts at its checkpoint's iteration and master result.
        let resumed_from = task.resumed_from();
        let resumed_halt = task.resumed_halt;
        let last = task.ctx.last.clone();
        let attempt = task.attempt;
        let report = JobReport {
            resumed_from,
            ..JobReport::default()
        };
        MasterActor {
            watch,
            placer: Placer::new(config.placement, config.inline_threshold),
            schedule: Schedule::new(config.iterations, config.workers, config.worker_halt),
            config,
            task: Some(Box::new(task)),
            barrier,
            pool,
            events,
            outcome: Some(outcome),
            report,
            started: now,
            iteration_started: now,
            span: None,
            last,
            master_ready: false,
            workers_ready: false,
            ending: None,
            drained: false,
            stopping: false,
            deadline: None,
            stuck: false,
            attempt,
            start_after: resumed_from,
            resumed_halt,
            pending_restart: false,
            coordination: None,
        }
    }

    /// With the job's coordinator, whose `on_finish` or `on_error` runs when the job ends.
    pub(crate) fn coordinated_by(mut self, coordination: Option<Coordination>) -> Self {
        self.coordination = coordination;
        self
    }

    fn dispatch(&mut self, ctx: &mut Context<Self>, work: Work<M, W>) {
        let Some(mut task) = self.task.take() else {
            // Unreachable by the protocol; fail loudly rather than drop the work.
            self.fail(JobError::Runtime {
                message: "work dispatched to the master while it was busy".into(),
            });
            return;
        };
        // The master's pre_application and post_application run inline: at those points
        // the coordination thread has nothing else to do, and they never queue behind
        // workers' compute on the pool.
        let (inline, during, timeout) = match &work {
            Work::Start => (true, Waiting::Registration, self.config.startup_timeout),
            Work::Iterate(round) => (
                self.placer.inline_iteration(),
                Waiting::Iteration(round.iteration),
                self.config.iteration_timeout,
            ),
            Work::Stop(_) => (true, Waiting::Shutdown, self.config.shutdown_timeout),
        };
        if inline {
            self.watch.enter(Who::Master, during);
            let worked = task.run(work);
            self.watch.exit();
            self.task = Some(task);
            self.on_worked(ctx, worked);
        } else {
            let now = Instant::now();
            // No deadline when the timeout is too long to add (`Duration::MAX`).
            self.deadline = now.checked_add(timeout).map(|at| Deadline {
                at,
                since: now,
                during,
            });
            let addr = ctx.address();
            self.pool.spawn(move || {
                let worked = task.run(work);
                addr.do_send(WorkDone { task, worked });
            });
        }
    }

    fn on_worked(&mut self, ctx: &mut Context<Self>, worked: Worked<M>) {
        match worked {
            Worked::Started(Ok(())) => {
                self.master_ready = true;
                self.maybe_begin();
            }
            Worked::Started(Err(e)) => self.fail(e),
            Worked::Iterated { result: Err(e), .. } => self.fail(e),
            Worked::Iterated {
                iteration,
                tally,
                left_out,
                elapsed,
                result:
                    Ok(Computed {
                        result,
                        halt,
                        checkpointed,
                    }),
            } => {
                if checkpointed {
                    self.report.checkpoints.push(iteration);
                }
                if elapsed > self.config.iteration_timeout {
                    // Inline work cannot be timed out while it runs (it holds the thread
                    // the timer would fire on); the deadline still holds once it returns.
                    self.fail(JobError::MasterTimedOut {
                        during: Waiting::Iteration(iteration),
                        waited: elapsed,
                    });
                } else if self.ending.is_none() {
                    self.placer.observe(elapsed);
                    self.iterated(iteration, tally, left_out, elapsed, result, halt);
                }
            }
            Worked::Stopped(result) => {
                if let Err(e) = result {
                    self.fail(e);
                }
                self.complete(ctx);
                return;
            }
        }
        self.maybe_stop(ctx);
    }

    fn maybe_begin(&mut self) {
        if !(self.master_ready && self.ending.is_none()) {
            return;
        }
        // The checkpoint covers every iteration, or its iteration halted: the job is
        // complete, and ends now with its result — no worker need register (a master
        // started again after its job ended would wait for workers long gone). With a
        // coordinator it waits for them: their reports are what it commits.
        let complete = self
            .start_after
            .is_some_and(|r| r >= self.config.iterations || self.resumed_halt.is_some());
        let at_once = self.coordination.is_none() || self.workers_ready;
        match (self.start_after, self.last.clone()) {
            (Some(resumed), Some(last)) if complete && at_once => {
                tracing::info!(
                    iteration = resumed,
                    "the newest checkpoint is the job's last: the job ends with its result"
                );
                self.finish(resumed, self.resumed_halt, last)
            }
            _ if !self.workers_ready => {}
            (Some(resumed), _) => self.begin(resumed + 1),
            (None, _) => self.begin(self.schedule.first()),
        }
    }

    fn begin(&mut self, iteration: Iteration) {
        self.iteration_started = Instant::now();
        let span = tracing::info_span!("iteration", job = %self.config.job_id, iteration);
        span.in_scope(|| tracing::debug!("iteration started"));
        self.span = Some(span);
        self.events
            .emit(|| JobEvent::IterationStarted { iteration });
        self.barrier.do_send(Open {
            attempt: self.attempt,
            iteration,
            last: self.last.clone(),
        });
    }

    fn iterated(
        &mut self,
        iteration: Iteration,
        tally: Tally,
        left_out: Vec<Rank>,
        master_elapsed: Duration,
        result: Arc<M>,
        halt: bool,
    ) {
        if !left_out.is_empty() {
            tracing::warn!(
                iteration,
                ?left_out,
                "the iteration went on without its stragglers (min-workers ratio)"
            );
        }
        let report = IterationReport {
            iteration,
            elapsed: self.iteration_started.elapsed(),
            master_elapsed,
            slowest: tally.slowest,
            results_held: tally.results_held,
            left_out,
        };
        if let Some(span) = self.span.take() {
            span.in_scope(|| tracing::debug!(elapsed = ?report.elapsed, "iteration completed"));
        }
        self.events
            .emit(|| JobEvent::IterationCompleted(report.clone()));
        self.report.iterations.push(report);
        self.last = Some(Arc::clone(&result));
        match self.schedule.decide(iteration, halt, tally.halt_votes) {
            Next::Iterate(next) => self.begin(next),
            Next::Finish { iterations, halted } => self.finish(iterations, halted, result),
        }
    }

    /// The job completed after `iterations`: tell the barrier to finish it.
    fn finish(&mut self, iterations: Iteration, halted: Option<HaltedBy>, result: Arc<M>) {
        self.report.halted_by = halted;
        if let Some(by) = halted {
            tracing::info!(iteration = iterations, ?by, "job halted");
            self.events.emit(|| JobEvent::Halted {
                iteration: iterations,
                by,
            });
        }
        self.ending = Some(OwnedEnding::Completed {
            iterations,
            halted: halted.is_some(),
            last: Arc::clone(&result),
        });
        self.barrier.do_send(FinishJob {
            iterations,
            halted: halted.is_some(),
            last: result,
        });
    }

    /// Fails the job: the first failure is kept and sent to every worker at once; later
    /// ones are logged.
    fn fail(&mut self, error: JobError) {
        match &self.ending {
            None => {
                tracing::error!(%error, "job failed");
                self.events.emit(|| JobEvent::Failed {
                    error: error.clone(),
                });
                self.ending = Some(OwnedEnding::Failed(error.clone()));
                self.barrier.do_send(AbortJob { error });
            }
            Some(OwnedEnding::Completed { .. }) => {
                // Every worker is stopping already; the job fails in its shutdown.
                tracing::error!(%error, "job failed during shutdown");
                self.events.emit(|| JobEvent::Failed {
                    error: error.clone(),
                });
                self.ending = Some(OwnedEnding::Failed(error));
            }
            Some(OwnedEnding::Failed(first)) => {
                tracing::debug!(%error, %first, "a further failure after the job failed");
            }
        }
    }

    fn maybe_stop(&mut self, ctx: &mut Context<Self>) {
        if !self.drained || self.stopping {
            return;
        }
        if self.task.is_some() {
            self.stopping = true;
            let ending = self.ending.clone().unwrap_or_else(|| {
                OwnedEnding::Failed(JobError::Runtime {
                    message: "the job drained without an ending".into(),
                })
            });
            self.dispatch(ctx, Work::Stop(ending));
        } else if self.stuck {
            tracing::warn!("the master's code is still running; its post_application is skipped");
            self.complete(ctx);
        }
    }

    fn on_tick(&mut self, ctx: &mut Context<Self>) {
        if !self.barrier.connected() {
            // Every wait for workers is the barrier's: without it nothing would end the job.
            self.fail(JobError::Runtime {
                message: "the barrier actor stopped".into(),
            });
            self.complete(ctx);
            return;
        }
        let Some(deadline) = self.deadline else {
            return;
        };
        let now = Instant::now();
        if now < deadline.at {
            return;
        }
        self.deadline = None;
        self.stuck = true;
        self.fail(JobError::MasterTimedOut {
            during: deadline.during,
            waited: now.saturating_duration_since(deadline.since),
        });
        self.maybe_stop(ctx);
    }

    fn complete(&mut self, ctx: &mut Context<Self>) {
        let Some(outcome) = self.outcome.take() else {
            return;
        };
        self.report.attempt = self.attempt;
        // Every worker stopped by now (or the shutdown timeout passed): the coordinator
        // commits only what every worker completed, and cleans up after anything else.
        let ending = match (self.ending.take(), self.coordination.as_mut()) {
            (Some(OwnedEnding::Completed { .. }), Some(c))
                if self.report.workers.len() < self.config.workers =>
            {
                let reported: Vec<Rank> = self.report.workers.iter().map(|w| w.rank).collect();
                let error = JobError::Coordinator {
                    hook: Hook::OnFinish,
                    cause: Cause::from_error(
                        format!(
                            "not run: only worker(s) {reported:?} of {} completed, so nothing is committed",
                            self.config.workers
                        )
                        .into(),
                    ),
                };
                c.fail(&error);
                Some(OwnedEnding::Failed(error))
            }
            (Some(completed @ OwnedEnding::Completed { .. }), Some(c)) => {
                match c.finish(&self.report.workers) {
                    Ok(()) => Some(completed),
                    Err(error) => Some(OwnedEnding::Failed(error)),
                }
            }
            (Some(OwnedEnding::Failed(error)), Some(c)) => {
                c.fail(&error);
                Some(OwnedEnding::Failed(error))
            }
            (ending, _) => ending,
        };
        self.report.elapsed = self.started.elapsed();
        let result = match ending {
            Some(OwnedEnding::Completed {
                iterations,
                halted,
                last,
            }) => {
                let elapsed = self.report.elapsed;
                tracing::info!(iterations, halted, ?elapsed, "job completed");
                self.events.emit(|| JobEvent::Completed {
                    iterations,
                    halted,
                    elapsed,
                });
                Ok(JobOutcome {
                    result: last,
                    iterations,
                    halted,
                    report: std::mem::take(&mut self.report),
                })
            }
            Some(OwnedEnding::Failed(error)) => Err(error),
            None => Err(JobError::Runtime {
                message: "the job ended without an outcome".into(),
            }),
        };
        // The receiver is gone only if the caller stopped waiting; nothing to tell then.
        let _ = outcome.send(result);
        ctx.stop();
    }

    fn on_gate(&mut self, ctx: &mut Context<Self>, output: GateOutput<W>) {
        match output {
            GateOutput::AllRegistered => {
                self.workers_ready = true;
                self.report.startup = self.started.elapsed();
                let elapsed = self.report.startup;
                tracing::debug!(?elapsed, "every worker registered");
                self.events.emit(|| JobEvent::Registered { elapsed });
                self.maybe_begin();
            }
            GateOutput::RoundComplete {
                iteration,
                gathered,
            } => {
                if self.ending.is_some() {
                    return;
                }
                let span = self.span.clone().unwrap_or_else(tracing::Span::none);
                let workers_halt = matches!(
                    self.schedule
                        .decide(iteration, false, gathered.tally.halt_votes),
                    Next::Finish {
                        halted: Some(HaltedBy::Workers),
                        ..
                    }
                );
                self.dispatch(
                    ctx,
                    Work::Iterate(Round {
                        iteration,
                        gathered,
                        span,
                        workers_halt,
                    }),
                );
            }
            // The barrier sent the replacement the iteration under way.
            GateOutput::Rejoined { .. } => {}
            GateOutput::Failed(error) => self.fail(error),
            GateOutput::Drained {
                missing,
                waited,
                drops,
            } => {
                self.report.drops = drops;
                if !missing.is_empty() {
                    let error = JobError::WorkersTimedOut {
                        during: Waiting::Shutdown,
                        missing,
                        waited,
                        refused: Vec::new(),
                    };
                    if matches!(self.ending, Some(OwnedEnding::Completed { .. })) {
                        self.fail(error);
                    } else {
                        tracing::warn!(%error, "workers did not stop in time");
                    }
                }
                self.drained = true;
                self.maybe_stop(ctx);
            }
        }
    }
}

impl<M: Payload, W: Payload> MasterActor<M, W> {
    /// The barrier recovers from a worker's failure: tell the user, and after a restart of
    /// every worker start over from the newest checkpoint.
    fn on_recovering(&mut self, recovering: Recovering) {
        let Recovering { cause, action } = recovering;
        tracing::warn!(%cause, ?action, "recovering from a worker's failure");
        let recovered = Recovered { cause, action };
        self.events.emit(|| JobEvent::Recovering(recovered.clone()));
        self.report.recoveries.push(recovered.clone());
        if let Recover::LeaveOut(_) = recovered.action {
            self.schedule.leave_out();
        }
        if let (Recover::RestartAll(attempt), None) = (&recovered.action, &self.ending) {
            let attempt = *attempt;
            // Every rank is back.
            let c = &self.config;
            self.schedule = Schedule::new(c.iterations, c.workers, c.worker_halt);
            self.attempt = attempt;
            self.workers_ready = false;
            self.span = None;
            if self.task.is_some() {
                self.restart();
            } else {
                self.master_ready = false;
                self.pending_restart = true;
            }
        }
    }

    /// Starts over as the current attempt once every worker registers again.
    fn restart(&mut self) {
        let attempt = self.attempt;
        let Some(task) = self.task.as_mut() else {
            return;
        };
        match task.restart(attempt) {
            Ok(from) => {
                tracing::info!(attempt, resumed_from = ?from.map(|(i, _)| i), "the job starts over as a new attempt");
                self.start_after = from.map(|(iteration, _)| iteration);
                self.resumed_halt = from.and_then(|(_, halted)| halted);
                self.last = task.ctx.last.clone();
                self.master_ready = true;
                self.maybe_begin();
            }
            Err(error) => self.fail(error),
        }
    }
}

impl<M: Payload, W: Payload> Handler<Recovering> for MasterActor<M, W> {
    type Result = ();

    fn handle(&mut self, msg: Recovering, _: &mut Context<Self>) {
        self.on_recovering(msg);
    }
}

impl<M: Payload, W: Payload> Actor for MasterActor<M, W> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let config = &self.config;
        self.events.emit(|| JobEvent::Started {
            job_id: config.job_id.clone(),
            workers: config.workers,
            iterations: config.iterations,
        });
        ctx.run_interval(super::tick(config), |act, ctx| act.on_tick(ctx));
        self.dispatch(ctx, Work::Start);
    }
}

impl<M: Payload, W: Payload> Handler<FromGate<W>> for MasterActor<M, W> {
    type Result = ();

    fn handle(&mut self, msg: FromGate<W>, ctx: &mut Context<Self>) {
        self.on_gate(ctx, msg.0);
    }
}

struct WorkDone<M, W> {
    task: Box<MasterTask<M, W>>,
    worked: Worked<M>,
}

impl<M: 'static, W: 'static> Message for WorkDone<M, W> {
    type Result = ();
}

impl<M: Payload, W: Payload> Handler<WorkDone<M, W>> for MasterActor<M, W> {
    type Result = ();

    fn handle(&mut self, done: WorkDone<M, W>, ctx: &mut Context<Self>) {
        self.deadline = None;
        if self.stuck {
            // It came back after all: the job already failed on its deadline.
            self.stuck = false;
        }
        self.task = Some(done.task);
        if std::mem::take(&mut self.pending_restart) && self.ending.is_none() {
            // The work was the old attempt's: discarded.
            self.restart();
            return;
        }
        self.on_worked(ctx, done.worked);
    }
}

impl<M: Payload, W: Payload> Handler<WorkerReports> for MasterActor<M, W> {
    type Result = ();

    fn handle(&mut self, reports: WorkerReports, _: &mut Context<Self>) {
        for worker in &reports.0 {
            self.report.rows.add(&worker.rows);
        }
        self.report.workers = reports.0;
    }
}
