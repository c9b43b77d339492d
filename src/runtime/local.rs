//! The workers of this process: started when the job starts, and started again when a
//! failure policy replaces one of them or restarts them all.

use std::sync::Arc;

use actix::{Addr, AsyncContext, Context};

use super::pool::{guarded, ComputePool, Executor, Placer, PoolExits};
use super::watch::Watch;
use super::worker::{EndingReport, WorkerActor, WorkerTask};
use super::{OwnedEnding, WorkerFactory, WorkerHookFactory, WorkerHooks};
use crate::compute::{JobEnd, Payload};
use crate::config::{JobConfig, Placement};
use crate::coordinator::Shard;
use crate::error::{JobError, Phase};
use crate::protocol::{Attempt, FailurePolicy, Rank, ToWorker};
use crate::transport::{Transport, WorkerLink};

/// Everything it takes to start a worker of this process, and the actor of each rank
/// running here.
pub(crate) struct LocalWorkers<M: Payload, W: Payload> {
    parts: LocalParts<M, W>,
    /// By rank; `None` for a rank that runs in another process.
    actors: Vec<Option<Running<M, W>>>,
}

/// A worker actor running here, and its attempt.
type Running<M, W> = (Addr<WorkerActor<M, W>>, Attempt);

/// What it takes to start a worker of this process.
pub(crate) struct LocalParts<M: Payload, W: Payload> {
    pub(crate) config: Arc<JobConfig>,
    pub(crate) job_id: Arc<str>,
    pub(crate) factory: WorkerFactory<M, W>,
    pub(crate) hooks: Vec<WorkerHookFactory<M, W>>,
    pub(crate) transport: Box<dyn Transport<M, W>>,
    pub(crate) pool: Arc<ComputePool>,
    pub(crate) exits: PoolExits,
    pub(crate) watch: Arc<Watch>,
    pub(crate) ended: tokio::sync::mpsc::UnboundedSender<(Rank, OwnedEnding<M>)>,
    /// Each rank's shard of the input, if the job has one.
    pub(crate) shards: Option<Arc<Vec<Shard>>>,
    /// The job's failure as this process hears of it.
    pub(crate) end: JobEnd,
}

impl<M: Payload, W: Payload> LocalWorkers<M, W> {
    pub(crate) fn new(parts: LocalParts<M, W>) -> Self {
        let actors = (0..parts.config.workers).map(|_| None).collect();
        LocalWorkers { parts, actors }
    }

    /// Lets go of everything but the transport, which the workers' links need as long as
    /// they run: a process without the master restarts no worker, and learns the job's
    /// end from its workers' endings (whose channel closes once they are all gone).
    pub(crate) fn into_transport(self) -> Box<dyn Transport<M, W>> {
        self.parts.transport
    }

    /// Whether the worker of `rank` runs in this process.
    pub(crate) fn is_local(&self, rank: Rank) -> bool {
        self.actors.get(rank).is_some_and(Option::is_some)
    }

    /// Starts the worker of `rank` in `attempt`, for the first time.
    pub(crate) fn start(&mut self, rank: Rank, attempt: Attempt) -> Result<(), JobError> {
        let started = self.spawn(rank, attempt, false)?;
        self.actors[rank] = Some(started);
        Ok(())
    }

    /// Replaces the worker of `rank` by a new one in `attempt`: the new one's link closes
    /// the old one's, and the old one, if it still runs, is told to stop with `cause`.
    pub(crate) fn replace(
        &mut self,
        rank: Rank,
        attempt: Attempt,
        cause: &JobError,
    ) -> Result<(), JobError> {
        let spawned = self.spawn(rank, attempt, true);
        // Told to stop also when its replacement could not be made: the job fails then.
        self.retire(rank, cause);
        let new = spawned.map_err(|e| JobError::Runtime {
            message: format!("worker {rank} failed ({cause}) and could not be replaced: {e}"),
        })?;
        self.actors[rank] = Some(new);
        Ok(())
    }

    /// Replaces every worker of this process by a new one in `attempt`. If one cannot be
    /// made, every worker not yet replaced is still told to stop.
    pub(crate) fn replace_all(
        &mut self,
        attempt: Attempt,
        cause: &JobError,
    ) -> Result<(), JobError> {
        let ranks: Vec<Rank> = (0..self.actors.len())
            .filter(|&r| self.is_local(r))
            .collect();
        let mut first = Ok(());
        for rank in ranks {
            if first.is_ok() {
                first = self.replace(rank, attempt, cause);
            } else {
                self.retire(rank, cause);
            }
        }
        first
    }

    /// Tells the worker of `rank`, if it still runs, to stop with `cause`. A worker that
    /// failed is stopping already and drops this; one of an attempt that ended stops with
    /// the failure that ended it.
    fn retire(&mut self, rank: Rank, cause: &JobError) {
        if let Some((old, attempt)) = self.actors.get_mut(rank).and_then(Option::take) {
            old.do_send(ToWorker::Abort {
                attempt,
                error: cause.clone(),
            });
        }
    }

    /// Makes and starts a worker of `rank` in `attempt`: its code first, then its link
    /// (which, when it `replace`s, closes the old worker's), so that a factory that fails
    /// leaves the old link as it was.
    fn spawn(
        &mut self,
        rank: Rank,
        attempt: Attempt,
        replace: bool,
    ) -> Result<Running<M, W>, JobError> {
        let parts = &mut self.parts;
        let (factory, hooks) = (&parts.factory, &parts.hooks);
        let (computable, hooks) = guarded(|| {
            let hooks: WorkerHooks<M, W> = hooks.iter().map(|make| make(rank)).collect();
            Ok((factory(rank), hooks))
        })
        .map_err(|cause| JobError::Worker {
            rank,
            iteration: 0,
            phase: Phase::Init,
            cause,
        })?;
        let config = &parts.config;
        let worker_ctx = Context::<WorkerActor<M, W>>::new();
        let addr = worker_ctx.address();
        let inbox = {
            let addr = addr.clone();
            let end = parts.end.clone();
            Box::new(move |msg: ToWorker<M>| {
                // Here, on the transport's thread, even while user code holds the job's.
                super::worker::hear_abort(&end, rank, &msg);
                addr.do_send(msg)
            })
        };
        let link: Arc<dyn WorkerLink<W>> = Arc::from(if replace {
            parts.transport.reconnect_worker(rank, inbox)?
        } else {
            parts.transport.connect_worker(rank, inbox)?
        });
        let mut ctx = super::worker_context(
            config,
            &parts.job_id,
            rank,
            parts.shards.as_ref(),
            parts.end.clone(),
        );
        // In barrier mode every worker computes on a thread of its own, so that ranks can
        // wait for each other in sync calls.
        let (placement, sync_answers, executor) = if config.barrier_mode {
            let (sync, answers) = super::worker::sync_link(
                Arc::clone(&link),
                attempt,
                super::worker::sync_patience(config),
            );
            ctx.sync = Some(sync);
            let name = format!("superstep-{}-worker-{rank}", config.job_id);
            (
                Placement::Pool,
                Some(answers),
                Executor::own(name, &parts.exits)?,
            )
        } else if config.min_workers_ratio < 1.0 {
            // A straggler computing inline would hold the thread that is to go on
            // without it.
            (
                Placement::Pool,
                None,
                Executor::Pool(Arc::clone(&parts.pool)),
            )
        } else {
            (
                config.placement,
                None,
                Executor::Pool(Arc::clone(&parts.pool)),
            )
        };
        worker_ctx.run(WorkerActor::new(
            WorkerTask::new(computable, hooks, ctx, attempt)
                .failure_ends_job(config.failure_policy == FailurePolicy::Fail),
            link,
            sync_answers,
            executor,
            Placer::new(placement, config.inline_threshold),
            Arc::clone(&parts.watch),
            EndingReport {
                to: parts.ended.clone(),
                within: config.shutdown_timeout,
                grace: config.failure_grace.min(config.shutdown_timeout),
                end: parts.end.clone(),
                own_failure_ends_job: config.failure_policy == FailurePolicy::Fail,
            },
        ));
        Ok((addr, attempt))
    }
}
