//! A worker's user code — its computable, interceptors and context — as one unit that
//! runs where placement says (inline, on the pool, on a thread of its own) and hands back
//! what it did; the worker's driver (`runtime::worker`) decides nothing in it.

use std::sync::Arc;
use std::time::Instant;

use super::pool::guarded;
use super::{DynWorker, OwnedEnding, WorkerHooks};
use crate::collective::FoldAmong;
use crate::compute::{JobEnd, WorkerContext};
use crate::coordinator::Shard;
use crate::error::{drop_guarded, Cause, JobError, Phase, SyncError};
use crate::ids::{Attempt, FoldRoute, Rank};
use crate::interceptor::Ending;
use crate::payload::Payload;
use crate::protocol::JobConfig;
use crate::protocol::{
    Assignment, MailCount, Report, Share, ToMaster, Work, Worked, WorkerConfig, WorkerSave,
};

/// A worker's user code and context: moved to the pool and back as one value, so it is
/// only ever touched by one thread at a time.
pub(crate) struct WorkerTask<M, W> {
    computable: DynWorker<M, W>,
    interceptors: WorkerHooks<M, W>,
    pub(crate) ctx: WorkerContext<M, W>,
    pub(crate) attempt: Attempt,
    /// How many interceptors' `pre_application` ran: their `post_application` runs.
    entered: usize,
    /// The settings the worker's node runs by: whether a failure of this worker's code
    /// ends the job, which its process then knows at once, on the thread it failed on, so
    /// no compute starts after it.
    config: Arc<WorkerConfig>,
    /// Set by the worker's driver while the work away belongs to a master it left behind
    /// (its failure then ends nothing).
    pub(crate) stale: Arc<std::sync::atomic::AtomicBool>,
    /// When the unit of work under way started, then when its compute ended: one clock
    /// read per iteration.
    clock: Instant,
    /// The parent of the span of the unit of work under way (set by its driver): the
    /// iteration's span in the master's process, the job's elsewhere.
    pub(crate) parent: tracing::Span,
    /// The worker's part in folding results among the workers, when the job combines.
    fold_among: Option<FoldAmong<M, W>>,
}

/// Whether the spans a unit of a worker's code opens (`init`, `compute`,
/// `post_application`, all at DEBUG) may be recorded: only then does it need a parent
/// (`WorkerTask::parent`). A clone of a span that a subscriber records is a round trip
/// through its registry (and its drop another), which every worker would pay every round
/// for spans nobody records.
///
/// Asked of the subscribers' most verbose level, not of one callsite: a filter may enable
/// a span by its name or its fields (`[compute]=debug`), which a callsite of another name
/// does not match, and a span given no parent is a root, out of its iteration's trace.
#[inline]
pub(crate) fn spans_recorded() -> bool {
    tracing::level_enabled!(tracing::Level::DEBUG)
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
        config: Arc<WorkerConfig>,
    ) -> Self {
        WorkerTask {
            computable,
            interceptors,
            ctx,
            attempt,
            entered: 0,
            config,
            stale: Arc::default(),
            clock: Instant::now(),
            parent: tracing::Span::none(),
            fold_among: None,
        }
    }

    /// Folds results among the workers by `among` when an iteration says so.
    pub(crate) fn folding(mut self, among: Option<FoldAmong<M, W>>) -> Self {
        self.fold_among = among;
        self
    }

    /// The worker's report, once it stopped: what it read, wrote, rejected and attached
    /// over the job (its last message, unless it `awaits_word` on its own failure).
    pub(crate) fn done(&mut self, attempt: Attempt, awaits_word: bool) -> ToMaster<W> {
        ToMaster::Done {
            attempt,
            awaits_word,
            rows: std::mem::take(&mut self.ctx.rows),
            attachments: std::mem::take(&mut self.ctx.attachments),
        }
    }

    /// Whether the compute that just ended left calls it started unfinished.
    fn left_calls(&self) -> bool {
        self.ctx.sync.as_ref().is_some_and(|s| !s.flying.is_empty())
    }

    /// After a compute that left calls unfinished: they end with it, and — when it
    /// returned its result (`returned`) — fail it ([`SyncError::Unfinished`]): its peers
    /// would wait for its part. A compute that failed (of a call's error, say) fails of
    /// its own error.
    #[cold]
    fn unfinished(&mut self, returned: bool) -> Result<(), Cause> {
        let Some(sync) = self.ctx.sync.as_mut() else {
            return Ok(());
        };
        let calls = sync.flying.calls();
        sync.flying.clear();
        if !returned {
            return Ok(());
        }
        let error = SyncError::Unfinished {
            rank: self.ctx.rank,
            calls,
        };
        let result = self.ctx.note(Err(error.clone()));
        result.map_err(|_: SyncError| Cause::from_error(Box::new(error)))
    }

    fn fail(&self, phase: Phase, cause: Cause) -> JobError {
        // After a sync call or collective that broke the job's rules, the failure is the
        // program's, whatever error the code made of it.
        let cause = match &self.ctx.mistake {
            Some(broken) => cause.mistaken(broken.clone()),
            None => cause,
        };
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
        if let (Worked::Started(Err(error)) | Worked::Iterated(Err(error)), true) =
            (&worked, self.config.failure_ends_job)
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
                let error = Box::new(self.fail(phase, Cause::from_panic(payload)));
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
            Work::Start => Worked::Started(self.start().map_err(Box::new)),
            // Once the job failed, no compute starts: its result would not be used.
            Work::Iterate(..) if self.ctx.end.is_ended() => Worked::Skipped,
            Work::Iterate(step) => Worked::Iterated(self.iterate(step)),
            Work::Stop(ending) => Worked::Stopped(self.stop(&ending).map_err(Box::new)),
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

    fn iterate(&mut self, step: Assignment<M>) -> Result<Report<W>, Box<JobError>> {
        let Assignment {
            iteration,
            last,
            fold,
            save,
            restore,
        } = step;
        let (rank, attempt) = (self.ctx.rank, self.attempt);
        let _span = tracing::debug_span!(parent: &self.parent, "compute", rank, iteration, attempt)
            .entered();
        let started = self.clock;
        self.ctx.enter_iteration(iteration);
        if let Some(saved) = restore {
            self.restore(&saved)?;
        }
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
        let mut result = guarded(|| computable.compute(ctx));
        // The round's own exchanges (messages, the fold) are among every rank, whatever
        // context among a group the compute left behind (one forgotten, not dropped).
        self.ctx.scope = None;
        if self.left_calls() {
            result = self.unfinished(result.is_ok()).and(result);
        }
        let result = result.map_err(|c| self.fail(Phase::Compute, c))?;
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
        // The iteration's time is its hooks' and compute's; the messages' exchange and
        // the fold among the workers that follow wait for the others.
        self.clock = Instant::now();
        let mail = self.post()?;
        let saved = if save {
            Some(Box::new(self.save()?))
        } else {
            None
        };
        let result = self.share(result, fold)?;
        Ok(Report {
            attempt: self.attempt,
            iteration,
            result,
            halt_vote: self.ctx.halt_vote,
            mail,
            elapsed: self.clock.saturating_duration_since(started),
            saved,
            calls: self.ctx.epoch,
            group_calls: self.ctx.group_calls(),
        })
    }

    /// What the worker saves for the checkpoint of the iteration it computed: its own
    /// state, and the messages sent to it, which it reads in the next. A failure to save
    /// fails the worker in `Phase::Checkpoint`: a checkpoint without its state would
    /// resume another job.
    fn save(&mut self) -> Result<WorkerSave, JobError> {
        let computable = &self.computable;
        let state =
            guarded(|| computable.save_state()).map_err(|c| self.fail(Phase::Checkpoint, c))?;
        let messages = match &self.ctx.mail {
            Some(post) => post
                .save()
                .map_err(|e| self.fail(Phase::Checkpoint, Cause::from_error(e.into())))?,
            None => Vec::new(),
        };
        let iteration = self.ctx.iteration;
        self.ctx.record(|| crate::flight::What::Saved { iteration });
        Ok(WorkerSave { state, messages })
    }

    /// Restores what the worker saved for the checkpoint the attempt resumes from, before
    /// its first compute. A failure fails the worker in `Phase::Checkpoint`.
    fn restore(&mut self, saved: &WorkerSave) -> Result<(), JobError> {
        let computable = &mut self.computable;
        guarded(|| computable.restore_state(&saved.state))
            .map_err(|c| self.fail(Phase::Checkpoint, c))?;
        if let Some(post) = &mut self.ctx.mail {
            post.restore(&saved.messages)
                .map_err(|e| self.fail(Phase::Checkpoint, Cause::from_error(e.into())))?;
        }
        Ok(())
    }

    /// Sends the messages this compute sent to their ranks and takes in those sent to
    /// this one, when the job has messages.
    fn post(&mut self) -> Result<Option<Box<MailCount>>, JobError> {
        let Some(mut post) = self.ctx.mail.take() else {
            return Ok(None);
        };
        let _span = tracing::debug_span!("messages", rank = self.ctx.rank).entered();
        let ctx = &mut self.ctx;
        let posted = guarded(|| post.exchange(ctx).map_err(Into::into));
        self.ctx.mail = Some(post);
        posted
            .map(|mail| Some(Box::new(mail)))
            .map_err(|c| self.fail(Phase::Compute, c))
    }

    /// What the worker sends the master of its `result`: the result itself, or — when
    /// the iteration's results are folded among the workers — its part of the fold.
    #[inline]
    fn share(&mut self, result: W, fold: FoldRoute) -> Result<Share<W>, JobError> {
        if fold == FoldRoute::Star {
            return Ok(Share::Own(result));
        }
        self.share_among(result, fold)
    }

    /// [`share`](Self::share) where the workers fold their results among themselves.
    #[inline(never)]
    fn share_among(&mut self, result: W, fold: FoldRoute) -> Result<Share<W>, JobError> {
        let Some(among) = self.fold_among.clone() else {
            return Err(JobError::Runtime {
                message: format!(
                    "the master asked worker {} to fold its results by {fold:?} among the workers, but this process's job does not combine them (build it with the same combine as the master's)",
                    self.ctx.rank
                ),
            });
        };
        let _span = tracing::debug_span!("fold", rank = self.ctx.rank, route = ?fold).entered();
        let ctx = &mut self.ctx;
        guarded(|| among(ctx, result, fold).map_err(Into::into))
            .map_err(|c| self.fail(Phase::Combine, c))
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
        let ending = Ending::from(ending);
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
    let _ = task.run(Work::Stop(Box::new(OwnedEnding::Failed(error))));
}
