//! The master's user code — its computable, interceptors and checkpoints — as one unit
//! that runs where placement says and hands back what it did.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::pool::guarded;
use super::{DynMaster, MasterHooks, SharedStore};
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::checkpoint::{Resume, Resuming};
use crate::compute::MasterContext;
use crate::error::{drop_guarded, Cause, JobError, Phase};
use crate::ids::{Attempt, Iteration, Rank};
use crate::interceptor::Ending;
use crate::payload::Payload;
use crate::protocol::{
    Computed, HaltedBy, MasterDone, MasterRound, MasterWork, OwnedEnding, Replica, Resumed,
    ResumedFrom, Save, Spare, Tally, WorkerSave,
};

/// The master's user code and context: moved to the pool and back as one value.
pub(crate) struct MasterTask<M, W> {
    computable: DynMaster<M, W>,
    interceptors: MasterHooks<M, W>,
    ctx: MasterContext<M, W>,
    entered: usize,
    /// Where its checkpoints go, if the job keeps them.
    store: Option<SharedStore>,
    /// What a checkpoint must agree with to be resumed from; its shape is written into
    /// each checkpoint.
    resuming: Resuming,
    /// The computable's state to restore before the job starts, when it resumes.
    restore: Option<Vec<u8>>,
    /// Whether the checkpoint resumed from halted the job.
    resumed_halt: Option<HaltedBy>,
    /// The checkpoint resumed from, as the job's report says it.
    resumed_point: Option<ResumedFrom>,
    /// What each worker saved in the checkpoint resumed from, by rank.
    resumed_workers: Vec<Option<Arc<WorkerSave>>>,
    /// Whether to keep the computable's state as it starts (`initial`), to start over
    /// from when every worker restarts without a checkpoint.
    keep_initial: bool,
    initial: Option<Vec<u8>>,
    attempt: Attempt,
    /// The last round's buffers, emptied, on their way back to the gate.
    spare: Spare<W>,
}

impl<M: Payload, W: Payload> MasterTask<M, W> {
    pub(crate) fn new(
        computable: DynMaster<M, W>,
        interceptors: MasterHooks<M, W>,
        mut ctx: MasterContext<M, W>,
        store: Option<SharedStore>,
        resuming: Resuming,
        resume: Option<Resume<M>>,
        attempt: Attempt,
    ) -> Self {
        let (restore, resumed_halt, resumed_workers, resumed_point) =
            match resume.map(|r| r.into_context(&mut ctx)) {
                Some(r) => (Some(r.state), r.halted, r.workers, Some(r.point)),
                None => (None, None, Vec::new(), None),
            };
        MasterTask {
            computable,
            interceptors,
            ctx,
            entered: 0,
            store,
            resuming,
            restore,
            resumed_halt,
            resumed_workers,
            resumed_point,
            keep_initial: false,
            initial: None,
            attempt,
            spare: Spare::default(),
        }
    }

    /// Keeps the computable's state as the job starts, to start over from when every
    /// worker restarts before the first checkpoint (`FailurePolicy::RestartAll`, or
    /// `RestartWorker` in barrier mode).
    pub(crate) fn keeping_initial_state(mut self) -> Self {
        self.keep_initial = true;
        self
    }

    /// Starts over as `attempt`, every worker having restarted: from the newest usable
    /// checkpoint, or from the start (the computable's state as the job started). Returns
    /// what it resumed from.
    fn restart(&mut self, attempt: Attempt) -> Result<Resumed<M>, JobError> {
        let resumed = match &self.store {
            Some(store) => {
                // The newest is the one handed over last: written before it is read.
                store.flush();
                crate::checkpoint::resume::<M>(store.lock().as_mut(), &self.resuming)?
            }
            None => None,
        };
        self.restart_from(attempt, resumed)
    }

    /// Resumes from the copy of a checkpoint the worker of `from` kept, newer than what
    /// the master resumed from: checks its checksum, job and shape, saves it into the
    /// master's store (which lost it, or never had it) and starts over from it in the
    /// attempt under way. A damaged copy is logged and not taken (`None`).
    fn adopt(&mut self, from: Rank, replica: &Replica) -> Result<Option<Resumed<M>>, JobError> {
        let what = format!(
            "rank {from}'s copy of the checkpoint of iteration {}",
            replica.iteration
        );
        let decoded = crate::checkpoint::decode(Path::new(&what), &replica.bytes).and_then(|c| {
            // Ranked by the iteration it was offered as: it must be that one's.
            if c.iteration == replica.iteration {
                Ok(c)
            } else {
                Err(CheckpointError::Corrupt {
                    path: what.clone().into(),
                    reason: format!("it holds the checkpoint of iteration {}", c.iteration),
                })
            }
        });
        let checkpoint = match decoded {
            Ok(checkpoint) => checkpoint,
            Err(error) => {
                tracing::warn!(rank = from, %error, "a worker's copy of a checkpoint is damaged: the job goes on from what the master's store holds");
                return Ok(None);
            }
        };
        // Refused before the store keeps it; a copy is not cloned to be checked.
        crate::checkpoint::fit(&checkpoint, &what, &self.resuming)?;
        if let Some(store) = &self.store {
            store.flush();
            match store.lock().save(&checkpoint) {
                Ok(()) => tracing::info!(
                    rank = from,
                    iteration = replica.iteration,
                    "the master's store holds the checkpoint of iteration {} again, from worker {from}'s copy",
                    replica.iteration
                ),
                Err(error) => tracing::warn!(
                    rank = from,
                    %error,
                    "the master's store could not keep worker {from}'s copy of a checkpoint: the job resumes from the copy all the same"
                ),
            }
        }
        let resume = crate::checkpoint::resume_from::<M>(checkpoint, &what, &self.resuming)?;
        self.restart_from(self.attempt, Some(resume)).map(Some)
    }

    /// Starts over as `attempt` from `resumed`, or from the start without it.
    fn restart_from(
        &mut self,
        attempt: Attempt,
        resumed: Option<Resume<M>>,
    ) -> Result<Resumed<M>, JobError> {
        self.attempt = attempt;
        let ctx = &self.ctx;
        let mut fresh = MasterContext::new(ctx.workers, Arc::clone(&ctx.job_id), ctx.iterations);
        fresh.end = ctx.end.clone();
        let (from, state, workers, point) = match resumed {
            Some(resume) => {
                let iteration = resume.iteration;
                let restored = resume.into_context(&mut fresh);
                (
                    Some((iteration, restored.halted)),
                    restored.state,
                    restored.workers,
                    Some(restored.point),
                )
            }
            None => (
                None,
                self.initial.clone().unwrap_or_default(),
                Vec::new(),
                None,
            ),
        };
        // The old context's results go under a guard: their `Drop` is user code.
        let old = std::mem::replace(&mut self.ctx, fresh);
        drop_guarded(old).map_err(|c| Self::fail(self.ctx.iteration, Phase::Drop, c))?;
        self.restore_state(&state)?;
        if from.is_none() {
            // Starting over from iteration 1: its first master result again.
            self.init()?;
        }
        Ok(Resumed {
            from,
            point,
            last: self.ctx.last.clone(),
            workers,
        })
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
    pub(crate) fn run(&mut self, work: MasterWork<M, W>) -> MasterDone<M, W> {
        let (phase, iteration) = match &work {
            MasterWork::Start => (Phase::PreApplication, 0),
            MasterWork::Restart(_) | MasterWork::Adopt { .. } => {
                (Phase::Checkpoint, self.ctx.iteration)
            }
            MasterWork::Iterate(round) => (Phase::Compute, round.iteration),
            MasterWork::Stop(_) => (Phase::PostApplication, self.ctx.iteration),
        };
        let adopting = matches!(work, MasterWork::Adopt { .. });
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run_unguarded(work))) {
            Ok(worked) => worked,
            Err(payload) => {
                let error = Self::fail(iteration, phase, Cause::from_panic(payload));
                match phase {
                    Phase::PreApplication => MasterDone::Started(Err(error)),
                    Phase::Checkpoint if adopting => MasterDone::Adopted(Err(error)),
                    Phase::Checkpoint => MasterDone::Restarted(Err(error)),
                    Phase::Compute => MasterDone::Iterated {
                        iteration,
                        tally: Tally::default(),
                        left_out: Vec::new(),
                        elapsed: Duration::ZERO,
                        result: Err(error),
                        spare: Spare::default(),
                    },
                    _ => MasterDone::Stopped(Err(error)),
                }
            }
        }
    }

    fn run_unguarded(&mut self, work: MasterWork<M, W>) -> MasterDone<M, W> {
        match work {
            MasterWork::Start => MasterDone::Started(self.start()),
            MasterWork::Restart(attempt) => MasterDone::Restarted(self.restart(attempt)),
            MasterWork::Adopt { from, replica } => MasterDone::Adopted(self.adopt(from, &replica)),
            MasterWork::Iterate(round) => {
                let started = Instant::now();
                let (iteration, tally) = (round.iteration, round.gathered.tally);
                let left_out = round.gathered.left_out.clone();
                let (voted, timeout) = (round.halted.is_some(), round.timeout);
                let ends = round.ends;
                let mut result = self.iterate(round);
                let elapsed = started.elapsed();
                // The job's last checkpoint is written before its end is told anywhere: a
                // worker that ended with the result is gone, and a master started again
                // after its own process was lost must find the end in its store, not wait
                // for them. Not the compute's time; within the node's wait for it.
                // So is a preemption's, which a job run again resumes from: one not written
                // in time is not counted saved.
                let last = |c: &Computed<M>| {
                    c.checkpointed && (ends || voted || c.halt || iteration >= self.ctx.iterations)
                };
                if let (Some(store), Ok(computed)) = (&self.store, result.as_mut()) {
                    if last(computed) {
                        let written = store.flush_within(timeout.saturating_sub(elapsed) / 2);
                        computed.checkpointed &= written || !ends;
                    }
                }
                MasterDone::Iterated {
                    iteration,
                    tally,
                    left_out,
                    elapsed,
                    result,
                    spare: std::mem::take(&mut self.spare),
                }
            }
            MasterWork::Stop(ending) => MasterDone::Stopped(self.stop(&ending)),
        }
    }

    /// What the task resumes from (a checkpoint's iteration, whether it halted the job,
    /// and its master result); known until it starts.
    pub(crate) fn resumed(&self) -> Resumed<M> {
        Resumed {
            from: self
                .restore
                .is_some()
                .then_some((self.ctx.iteration, self.resumed_halt)),
            point: self.resumed_point.clone(),
            last: self.ctx.last.clone(),
            workers: self.resumed_workers.clone(),
        }
    }

    fn start(&mut self) -> Result<Option<Arc<M>>, JobError> {
        let _span = tracing::debug_span!("master_init", attempt = self.attempt).entered();
        let resumed = self.restore.is_some();
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
        // A job resumed from a checkpoint has its master result.
        if !resumed {
            self.init()?;
        }
        Ok(self.ctx.last.clone())
    }

    /// The computable's first master result, if it makes one: the last master result of
    /// iteration 1.
    fn init(&mut self) -> Result<(), JobError> {
        let (computable, ctx) = (&mut self.computable, &mut self.ctx);
        if let Some(first) =
            guarded(|| computable.init(ctx)).map_err(|c| Self::fail(0, Phase::Init, c))?
        {
            self.ctx.last = Some(Arc::new(first));
        }
        Ok(())
    }

    fn iterate(&mut self, round: MasterRound<W>) -> Result<Computed<M>, JobError> {
        let iteration = round.iteration;
        // A child of the iteration's span, which the node holds entered on its own thread
        // for the whole iteration: entering it here too would draw it twice there.
        let _span = tracing::debug_span!(
            parent: &round.span,
            "master_compute",
            iteration,
            attempt = self.attempt
        )
        .entered();
        let (voted, save, replicate) = (round.halted, round.save, round.replicate);
        let mut gathered = round.gathered;
        let saved = std::mem::take(&mut gathered.saved);
        self.spare.reported = self.ctx.enter(iteration, gathered);
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
        // The workers' results are no longer needed: free them before the next round —
        // each under a guard, as its `Drop` is its worker's code.
        // (Emptied, the buffer goes back to the gate for the next rounds.)
        let mut results = std::mem::take(&mut self.ctx.results);
        let ranks = std::mem::take(&mut self.ctx.reported);
        let mut dropped = Ok(());
        for (i, result) in results.drain(..).enumerate() {
            if let Err(cause) = drop_guarded(result) {
                let rank = ranks.get(i).copied().unwrap_or(i);
                dropped = dropped.and(Err(JobError::Worker {
                    rank,
                    iteration,
                    phase: Phase::Drop,
                    cause,
                }));
            }
        }
        self.ctx.reported = ranks;
        self.spare.results = results;
        dropped?;
        drop_guarded(self.ctx.combined.take())
            .map_err(|c| Self::fail(iteration, Phase::Drop, c))?;
        let previous = self.ctx.last.replace(Arc::clone(&result));
        drop_guarded(previous).map_err(|c| Self::fail(iteration, Phase::Drop, c))?;
        let halted = if halt { Some(HaltedBy::Master) } else { voted };
        let due = match save {
            Save::Yes => true,
            Save::IfMasterHalts => halt,
            Save::No => false,
        };
        let (checkpointed, replica) = if due {
            self.save_checkpoint(iteration, &result, halted, saved, replicate)
        } else {
            (false, None)
        };
        Ok(Computed {
            result,
            halt,
            checkpointed,
            replica,
        })
    }

    /// Saves a checkpoint of `iteration` (the node said one is due): hands it to the
    /// store's writer, which writes it while the job goes on. One that cannot be made (or,
    /// written in place, cannot be written) is logged and skipped: the job goes on, and
    /// the one before stays. Returns whether it was saved (handed over), and its bytes
    /// for the workers that keep copies if `replicate`.
    fn save_checkpoint(
        &mut self,
        iteration: Iteration,
        result: &M,
        halted: Option<HaltedBy>,
        workers: Vec<Option<WorkerSave>>,
        replicate: bool,
    ) -> (bool, Option<Replica>) {
        let Some(store) = self.store.as_ref() else {
            return (false, None);
        };
        let computable = &self.computable;
        let made = guarded(|| computable.save_state())
            .map_err(|cause| format!("save_state failed: {cause}"))
            .and_then(|master_state| {
                let master_result = crate::codec::to_vec(result).map_err(|e| {
                    format!(
                        "the master result of iteration {iteration}, a {}, does not encode: {e}",
                        std::any::type_name::<M>()
                    )
                })?;
                Ok(Checkpoint {
                    job_id: self.ctx.job_id.to_string(),
                    iteration,
                    attempt: self.attempt,
                    master_result,
                    master_state,
                    halted,
                    workers,
                    shape: Some(self.resuming.shape.clone()),
                    committed: false,
                })
            });
        // The copy's bytes are the checkpoint's before it is handed over (no clone).
        let mut replica = None;
        let saved = made.and_then(|c| {
            if replicate {
                replica = crate::checkpoint::encode(&c)
                    .inspect_err(|error| tracing::warn!(iteration, %error, "no worker keeps a copy of this checkpoint"))
                    .ok()
                    .map(|bytes| Replica {
                        iteration,
                        bytes: Arc::new(bytes),
                    });
            }
            store.save(c)
        });
        match saved {
            Ok(()) => (true, replica),
            Err(error) => {
                tracing::warn!(iteration, %error, "checkpoint skipped; the previous one stays");
                (false, None)
            }
        }
    }

    /// Waits until the checkpoints handed to the store's writer are written (as the job
    /// ends: a job run again reads them).
    pub(crate) fn flush_checkpoints(&self) {
        if let Some(store) = &self.store {
            store.flush();
        }
    }

    fn stop(&mut self, ending: &OwnedEnding<M>) -> Result<(), JobError> {
        let _span =
            tracing::debug_span!("master_post_application", attempt = self.attempt).entered();
        let ending = Ending::from(ending);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{JobShape, MemoryCheckpointStore};
    use crate::compute::{MasterComputable, Step};
    use crate::error::BoxError;
    use crate::protocol::JobConfig;

    /// A master whose result is the iteration, times ten.
    struct Tens;

    impl MasterComputable for Tens {
        type MasterResult = u64;
        type WorkerResult = u64;

        fn compute(&mut self, ctx: &mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> {
            Ok(Step::Continue(ctx.iteration() * 10))
        }
    }

    fn config() -> JobConfig {
        JobConfig {
            job_id: "copied".into(),
            workers: 2,
            iterations: 6,
            ..JobConfig::default()
        }
    }

    /// A started task of the job, whose store is `store`.
    fn task(store: &SharedStore) -> MasterTask<u64, u64> {
        let config = config();
        let resuming = Resuming::new(&config, JobShape::new(2, None));
        let ctx = MasterContext::new(2, Arc::from("copied"), 6);
        let mut task = MasterTask::new(
            Box::new(Tens),
            Vec::new(),
            ctx,
            Some(store.clone()),
            resuming,
            None,
            0,
        );
        assert!(matches!(
            task.run(MasterWork::Start),
            MasterDone::Started(Ok(_))
        ));
        task
    }

    /// A worker's copy of the checkpoint of `iteration` of job `job_id`.
    fn copy(job_id: &str, iteration: Iteration) -> Replica {
        let checkpoint = Checkpoint {
            job_id: job_id.into(),
            iteration,
            attempt: 0,
            master_result: crate::codec::to_vec(&(iteration * 10)).unwrap(),
            master_state: Vec::new(),
            halted: None,
            workers: Vec::new(),
            shape: Some(JobShape::new(2, None)),
            committed: false,
        };
        let bytes = crate::checkpoint::encode(&checkpoint).unwrap();
        Replica {
            iteration,
            bytes: Arc::new(bytes),
        }
    }

    fn newest(store: &SharedStore) -> Option<Iteration> {
        store
            .lock()
            .latest()
            .unwrap()
            .map(|l| l.checkpoint.iteration)
    }

    #[test]
    fn a_workers_copy_is_checked_saved_into_the_masters_store_and_resumed_from() {
        let store = SharedStore::new(Box::new(MemoryCheckpointStore::new()));
        let mut task = task(&store);
        let done = task.run(MasterWork::Adopt {
            from: 1,
            replica: copy("copied", 4),
        });
        let MasterDone::Adopted(Ok(Some(resumed))) = done else {
            panic!("not resumed from the copy");
        };
        assert_eq!(resumed.from, Some((4, None)));
        assert_eq!(resumed.last.as_deref(), Some(&40));
        assert_eq!(newest(&store), Some(4), "the store holds it again");
    }

    #[test]
    fn a_damaged_copy_or_one_of_another_iteration_is_not_taken_and_another_jobs_fails_naming_both()
    {
        let store = SharedStore::new(Box::new(MemoryCheckpointStore::new()));
        let mut task = task(&store);
        let mut damaged = copy("copied", 4);
        let mut bytes = damaged.bytes.to_vec();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        damaged.bytes = Arc::new(bytes);
        let done = task.run(MasterWork::Adopt {
            from: 1,
            replica: damaged,
        });
        assert!(matches!(done, MasterDone::Adopted(Ok(None))));
        assert_eq!(newest(&store), None, "nothing saved");
        // Offered as iteration 5, it holds 4: not the copy it claims to be.
        let claimed = Replica {
            iteration: 5,
            ..copy("copied", 4)
        };
        let done = task.run(MasterWork::Adopt {
            from: 1,
            replica: claimed,
        });
        assert!(matches!(done, MasterDone::Adopted(Ok(None))));
        assert_eq!(newest(&store), None);
        let done = task.run(MasterWork::Adopt {
            from: 2,
            replica: copy("another", 4),
        });
        let MasterDone::Adopted(Err(error)) = done else {
            panic!("another job's copy was taken");
        };
        let said = error.to_string();
        assert!(
            said.contains("rank 2's copy of the checkpoint of iteration 4")
                && said.contains("\"another\"")
                && said.contains("\"copied\""),
            "{said}"
        );
        assert_eq!(newest(&store), None);
    }
}
