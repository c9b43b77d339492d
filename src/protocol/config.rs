//! The settings the nodes run by, and the rules that follow from them alone.
//!
//! [`NodeConfig`] (the master's node) and [`WorkerConfig`] (a worker's) are built once,
//! when a process starts its job (`NodeConfig::new`, then `NodeConfig::worker`), and
//! shared by reference from then on. Each holds the job's [`JobConfig`] by reference, as
//! it was given, beside what follows from where the job runs: no layer keeps a copy of a
//! setting, nor a formula over settings, of its own. What follows from a setting —
//! which timeout a wait has, how long a failed job waits for code still running, whether
//! a worker's failure ends the job, when a checkpoint is due — is a method here, decided
//! once and unit-tested below.

use std::sync::Arc;
use std::time::Duration;

use super::{Envelope, FailurePolicy, GateConfig, HaltedBy, JobConfig, ToMaster};
use crate::error::{ConfigError, JobError, Waiting};
use crate::ids::{Aggregation, Attempt, FoldRoute, Iteration, Rank, ReduceOp};

/// How long a worker that failed on its own waits, once stopped, for the master to say
/// what the job's first failure was (normally its abort arrives within milliseconds).
pub(crate) const VERDICT_GRACE: Duration = Duration::from_secs(2);

/// How much longer than the sync timeout a worker's sync call waits for its answer: the
/// master's node answers first (with the epoch's timeout) unless it is gone or held up.
const SYNC_PATIENCE_MARGIN: Duration = Duration::from_secs(5);

/// From how many bytes an iteration's fold makes [`Aggregation::Auto`] fold the next
/// iteration's results along the ring of workers rather than at the master: below it a
/// result's bytes cost less than the steps along the ring.
pub(crate) const AUTO_RING_BYTES: usize = 64 * 1024;

/// What a job's way of combining its results allows its workers to fold among themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Combining {
    /// The job does not combine its results.
    No,
    /// By the user's fold of whole values.
    Whole,
    /// Element by element with this op (`JobBuilder::combine_by`): the ring carries it in
    /// chunks.
    Elementwise(ReduceOp),
}

/// Where a job's workers are, as far as folding among them goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Workers {
    /// In one process, each other's peers.
    Together,
    /// In several processes, connected to each other by the transport.
    Connected,
    /// Where they cannot reach each other: in other processes, with no peer links from
    /// the transport.
    Apart,
}

/// What the nodes' settings take from where a job runs, beside the job's own settings:
/// its checkpoint store, its way of combining results and where its workers are. The
/// runtime and the simulator each say it, and build the settings the same way from it
/// (`NodeConfig::new`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deployment {
    /// Every how many iterations the master saves a checkpoint; `None` without a store.
    pub(crate) checkpoint_every: Option<Iteration>,
    /// Whether the checkpoint store outlives the master's host (an object store): its
    /// checkpoints then need no copies on the workers unless the job asks for them.
    pub(crate) store_outlives_host: bool,
    pub(crate) combining: Combining,
    pub(crate) workers: Workers,
}

#[cfg(test)]
impl Deployment {
    /// A job without checkpoints whose workers run in one process, combining nothing.
    pub(crate) fn in_memory() -> Self {
        Deployment {
            checkpoint_every: None,
            store_outlives_host: false,
            combining: Combining::No,
            workers: Workers::Together,
        }
    }
}

/// The master's node's settings: the job's own, held by reference (declared once, in
/// [`JobConfig`]), and what follows from them where the job runs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NodeConfig {
    /// The job's settings, as they were given.
    pub(crate) job: Arc<JobConfig>,
    /// How the workers' results reach the master: the job's aggregation settled for where
    /// it runs (`Auto` only where the size decides; see
    /// [`NodeConfig::settle_aggregation`]).
    pub(crate) aggregation: Aggregation,
    /// Every how many iterations the master saves a checkpoint; `None` without a store.
    pub(crate) checkpoint_every: Option<Iteration>,
    /// Whether the checkpoint store outlives the master's host ([`Deployment`]).
    pub(crate) store_outlives_host: bool,
}

impl NodeConfig {
    /// The settings each node of `job` runs by, where it runs as `deployment` says: the
    /// job's settings, the store's place, and its aggregation settled for where its workers
    /// are and its way of combining (an aggregation that cannot fold there is an error).
    /// Built once when the job starts, the same way by the runtime and the simulator.
    pub(crate) fn new(job: Arc<JobConfig>, deployment: &Deployment) -> Result<Self, ConfigError> {
        let mut config = NodeConfig::unsettled(job, deployment);
        config.settle_aggregation(deployment.combining, deployment.workers)?;
        Ok(config)
    }

    /// As [`new`](Self::new), the aggregation as it was set.
    pub(crate) fn unsettled(job: Arc<JobConfig>, deployment: &Deployment) -> Self {
        NodeConfig {
            aggregation: job.aggregation,
            checkpoint_every: deployment.checkpoint_every,
            store_outlives_host: deployment.store_outlives_host,
            job,
        }
    }

    /// The fewest results a round completes with once `min_workers_timeout` passed:
    /// `ceil(min_workers_ratio × workers)`.
    pub(crate) fn quorum(&self) -> usize {
        self.job.quorum()
    }

    /// Once the job failed, how long its end waits for user code still running: the
    /// job's failure grace, and never past the shutdown timeout.
    pub(crate) fn failure_grace(&self) -> Duration {
        self.job.failure_grace.min(self.job.shutdown_timeout)
    }
}

/// Whether the master saves a checkpoint of an iteration ([`NodeConfig::checkpoint`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Save {
    /// It is due.
    Yes,
    /// Only if the master's compute halts the job: the last iteration is always saved, so
    /// that a master started again after the job ended ends at once.
    IfMasterHalts,
    /// Not due (or the job keeps no checkpoints).
    No,
}

/// How long the end of a job waits for a rank that may still connect (a worker reconnecting
/// to a master's node started again: its backoff is at most about a second), at most.
const RECONNECT_GRACE: Duration = Duration::from_secs(3);

impl NodeConfig {
    /// How long the end of a job waits for a rank that may still connect before it is not
    /// waited for: 3 s, and at most half the shutdown timeout — a rank long gone (a master
    /// started again after its job ended) must not time the shutdown out and fail the job
    /// whose result is known.
    pub(crate) fn reconnect_grace(&self) -> Duration {
        RECONNECT_GRACE.min(self.job.shutdown_timeout / 2)
    }

    /// Settles the aggregation for a job that combines as `combining` says, whose
    /// `workers` are where it says: `Tree` and `Ring` need a combining job and workers
    /// that reach each other; `Auto` folds among the workers only when they are in
    /// several processes connected to each other, in barrier mode, for an element-wise
    /// fold — otherwise it is the star.
    pub(crate) fn settle_aggregation(
        &mut self,
        combining: Combining,
        workers: Workers,
    ) -> Result<(), ConfigError> {
        let among = matches!(self.aggregation, Aggregation::Tree | Aggregation::Ring);
        if among && combining == Combining::No {
            return Err(ConfigError::new(
                "aggregation",
                self.aggregation,
                "needs a job that combines its results (JobBuilder::combine or combine_by): without one the master receives every worker's result",
            ));
        }
        if among && workers == Workers::Apart && self.job.workers > 1 {
            return Err(ConfigError::new(
                "aggregation",
                self.aggregation,
                "needs workers that reach each other: this job's transport connects no workers to each other; use Star or Auto",
            ));
        }
        let elementwise = matches!(combining, Combining::Elementwise(_));
        if self.aggregation == Aggregation::Auto
            && !(workers == Workers::Connected && self.job.barrier_mode && elementwise)
        {
            self.aggregation = Aggregation::Star;
        }
        Ok(())
    }

    /// How the workers fold their results of an iteration, given the encoded size of the
    /// fold of the iteration before, where it was measured.
    pub(crate) fn fold_route(&self, last_fold: Option<usize>) -> FoldRoute {
        if self.job.workers <= 1 {
            return FoldRoute::Star;
        }
        match self.aggregation {
            Aggregation::Star => FoldRoute::Star,
            Aggregation::Tree => FoldRoute::Tree,
            Aggregation::Ring => FoldRoute::Ring,
            Aggregation::Auto if last_fold.is_some_and(|b| b >= AUTO_RING_BYTES) => FoldRoute::Ring,
            Aggregation::Auto => FoldRoute::Star,
        }
    }

    /// Whether the master measures each fold's encoded size (for `Auto`'s choice).
    pub(crate) fn measures_folds(&self) -> bool {
        self.aggregation == Aggregation::Auto && self.job.workers > 1
    }

    /// Whether a worker's failure ends the job (`FailurePolicy::Fail`), rather than being
    /// recovered from.
    pub(crate) fn failure_ends_job(&self) -> bool {
        self.job.failure_policy == FailurePolicy::Fail
    }

    /// How long the wait `during` may last.
    pub(crate) fn timeout(&self, during: Waiting) -> Duration {
        match during {
            Waiting::Connection | Waiting::Registration => self.job.startup_timeout,
            Waiting::Iteration(_) => self.job.iteration_timeout,
            Waiting::Shutdown => self.job.shutdown_timeout,
        }
    }

    /// The gate's settings in `attempt`.
    pub(crate) fn gate(&self, attempt: Attempt) -> GateConfig {
        let job = &self.job;
        GateConfig::new(
            job.workers,
            attempt,
            [
                job.startup_timeout,
                job.iteration_timeout,
                job.shutdown_timeout,
            ],
        )
        .with_quorum(self.quorum(), job.min_workers_timeout)
    }

    /// How often a driver that checks deadlines on a tick (rather than arming a timer for
    /// each) should: a twentieth of the shortest timeout in use, between 1 ms and 100 ms.
    pub(crate) fn check_interval(&self) -> Duration {
        let job = &self.job;
        let mut shortest = job
            .startup_timeout
            .min(job.iteration_timeout)
            .min(job.shutdown_timeout);
        if job.barrier_mode {
            shortest = shortest.min(job.sync_timeout);
        }
        if self.quorum() < job.workers {
            shortest = shortest.min(job.min_workers_timeout);
        }
        (shortest / 20).clamp(Duration::from_millis(1), Duration::from_millis(100))
    }

    /// Whether a checkpoint of `iteration` is saved, given whether the job halts after it
    /// (the workers' votes, known before the master computes): every `checkpoint_every`
    /// iterations, and the job's last one.
    pub(crate) fn checkpoint(&self, iteration: Iteration, halted: Option<HaltedBy>) -> Save {
        let Some(every) = self.checkpoint_every else {
            return Save::No;
        };
        if iteration % every.max(1) == 0 || iteration >= self.job.iterations || halted.is_some() {
            Save::Yes
        } else {
            Save::IfMasterHalts
        }
    }

    /// The ranks whose processes keep a copy of each checkpoint, of those `keeps` allows:
    /// not `local` (its worker runs in the master's process, whose copy would go with it),
    /// those on another host first (`elsewhere`: `None` when not known), then the others,
    /// each in rank order; the first `checkpoint_replicas` of them — by default one when
    /// one may be on another host, none when every one is known to be on the master's or
    /// the store outlives the master's host. None in a job without checkpoints.
    pub(crate) fn replica_holders(
        &self,
        local: &[bool],
        keeps: impl Fn(Rank) -> bool,
        elsewhere: impl Fn(Rank) -> Option<bool>,
    ) -> Vec<Rank> {
        if self.checkpoint_every.is_none() {
            return Vec::new();
        }
        let mut holders: Vec<(Option<bool>, Rank)> = (0..self.job.workers)
            .filter(|&rank| !local.get(rank).copied().unwrap_or(false) && keeps(rank))
            .map(|rank| (elsewhere(rank), rank))
            .collect();
        holders.sort_unstable_by_key(|&(elsewhere, rank)| (elsewhere != Some(true), rank));
        let away = holders
            .iter()
            .any(|&(elsewhere, _)| elsewhere != Some(false));
        let count = self
            .job
            .checkpoint_replicas
            .unwrap_or(usize::from(away && !self.store_outlives_host));
        holders
            .into_iter()
            .take(count)
            .map(|(_, rank)| rank)
            .collect()
    }

    /// Whether the workers save what they need to resume ([`WorkerSave`](super::WorkerSave))
    /// for the checkpoint of `iteration`: every `checkpoint_every` iterations, and the
    /// job's last one, from which a job run again with more iterations goes on. (Not one
    /// that halted the job: that checkpoint ends a resumed job at once.)
    pub(crate) fn workers_save(&self, iteration: Iteration) -> bool {
        self.checkpoint_every
            .is_some_and(|every| iteration % every.max(1) == 0 || iteration >= self.job.iterations)
    }

    /// The settings each worker's node of the job runs by: the same job's, as a worker
    /// needs them.
    pub(crate) fn worker(&self) -> WorkerConfig {
        WorkerConfig {
            job: Arc::clone(&self.job),
            failure_ends_job: self.failure_ends_job(),
            gang: super::restarts_all(self.job.failure_policy, self.job.barrier_mode),
            failure_grace: self.failure_grace(),
            verdict_grace: VERDICT_GRACE,
            sync_patience: self
                .job
                .sync_timeout
                .checked_add(SYNC_PATIENCE_MARGIN)
                .unwrap_or(Duration::MAX),
        }
    }

    /// What a worker's message tells the master's process before its node has read it:
    /// under `Fail`, a worker's failure of the current `attempt` is the job's (named for
    /// the rank that sent it), so that no compute of this process starts after it even
    /// while user code holds the node's thread. `None` for any other message.
    pub(crate) fn ends_job_at_once<W>(
        &self,
        attempt: Attempt,
        env: &Envelope<ToMaster<W>>,
    ) -> Option<JobError> {
        match &env.msg {
            ToMaster::Failed { attempt: a, error } if self.failure_ends_job() && *a == attempt => {
                Some(error.clone().attributed_to(env.from))
            }
            _ => None,
        }
    }
}

/// A worker's node's settings: the job's, held by reference, and the rules a worker
/// takes from them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct WorkerConfig {
    /// The job's settings, as they were given (barrier mode, the shutdown timeout).
    pub(crate) job: Arc<JobConfig>,
    /// Whether the worker's own failure ends the job (`FailurePolicy::Fail`): its process
    /// then knows at once, on the thread that failed.
    pub(crate) failure_ends_job: bool,
    /// Whether a worker's failure restarts every worker (a gang restart): a worker's link
    /// that reaches a master's node again starts its worker over too.
    pub(crate) gang: bool,
    /// Once the job failed, how long the worker waits for its code still away.
    pub(crate) failure_grace: Duration,
    /// How long a worker stopped on its own failure waits for the master's word.
    pub(crate) verdict_grace: Duration,
    /// How long a sync call waits for its answer before it gives up on the master's node.
    pub(crate) sync_patience: Duration,
}

/// Whether what the master told the worker of `rank` ends the job for its process (no
/// compute of it starts from then on): an abort does, unless it carries this rank's own
/// recoverable failure — that dismisses only this worker. Returns the job's failure.
pub(crate) fn abort_ends_job<M>(rank: Rank, msg: &super::ToWorker<M>) -> Option<&JobError> {
    match msg {
        super::ToWorker::Abort { error, .. }
            if super::Recovery::recoverable(error) != Some(rank) =>
        {
            Some(error)
        }
        _ => None,
    }
}

#[cfg(test)]
impl NodeConfig {
    /// The settings of `job` run in one process without checkpoints, its aggregation as
    /// it was set.
    pub(crate) fn of(job: JobConfig) -> Self {
        NodeConfig::unsettled(Arc::new(job), &Deployment::in_memory())
    }

    /// The default job's settings ([`JobConfig::for_tests`]): 1 worker, 50 iterations,
    /// under `Fail`, no checkpoints.
    pub(crate) fn for_tests() -> Self {
        NodeConfig::of(JobConfig::for_tests())
    }
}

#[cfg(test)]
impl JobConfig {
    /// The default settings, as the star aggregates, for the job `test`.
    pub(crate) fn for_tests() -> Self {
        JobConfig {
            job_id: "test".into(),
            aggregation: Aggregation::Star,
            ..JobConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ToWorker;

    /// Four workers, ten iterations, a checkpoint every third.
    fn config() -> NodeConfig {
        config_with(|_| {})
    }

    /// As [`config`], its job's settings changed by `change`.
    fn config_with(change: impl FnOnce(&mut JobConfig)) -> NodeConfig {
        let mut job = JobConfig {
            workers: 4,
            iterations: 10,
            ..JobConfig::for_tests()
        };
        change(&mut job);
        NodeConfig {
            checkpoint_every: Some(3),
            ..NodeConfig::of(job)
        }
    }

    #[test]
    fn a_checkpoint_is_due_every_k_iterations_and_at_the_jobs_last() {
        let c = config();
        assert_eq!(c.checkpoint(3, None), Save::Yes);
        assert_eq!(c.checkpoint(6, None), Save::Yes);
        assert_eq!(c.checkpoint(4, None), Save::IfMasterHalts);
        assert_eq!(c.checkpoint(10, None), Save::Yes, "the last iteration");
        let workers = Some(HaltedBy::Workers);
        assert_eq!(
            c.checkpoint(4, workers),
            Save::Yes,
            "the workers halt the job"
        );
        let none = NodeConfig {
            checkpoint_every: None,
            ..config()
        };
        assert_eq!(none.checkpoint(3, Some(HaltedBy::Workers)), Save::No);
    }

    #[test]
    fn a_store_that_outlives_the_host_needs_no_copies_unless_asked() {
        let outliving = NodeConfig {
            store_outlives_host: true,
            ..config()
        };
        let local = [true, false, false, false];
        let elsewhere = |rank| Some(rank == 3);
        assert!(outliving
            .replica_holders(&local, |_| true, elsewhere)
            .is_empty());
        let asked = NodeConfig {
            store_outlives_host: true,
            ..config_with(|job| job.checkpoint_replicas = Some(1))
        };
        assert_eq!(asked.replica_holders(&local, |_| true, elsewhere), [3]);
        // Built from a job's settings where the store outlives the host, as the runtime
        // and the simulator build them.
        let deployment = Deployment {
            store_outlives_host: true,
            checkpoint_every: Some(2),
            ..Deployment::in_memory()
        };
        let built = NodeConfig::new(Arc::default(), &deployment).unwrap();
        assert!(built.store_outlives_host);
        assert_eq!(built.checkpoint_every, Some(2));
    }

    #[test]
    fn copies_of_checkpoints_go_to_workers_of_other_hosts_first_one_by_default() {
        let c = config();
        let everyone = |_| true;
        let unknown = |_| None;
        // Rank 0 runs in the master's process: its copy would go with it.
        let local = [true, false, false, false];
        assert_eq!(
            c.replica_holders(&local, everyone, unknown),
            [1],
            "one by default"
        );
        assert_eq!(
            c.replica_holders(&[true; 4], everyone, unknown),
            [0usize; 0],
            "every worker in the master's process"
        );
        // Ranks 1 and 2 share the master's host, rank 3 does not: it keeps the copy.
        let hosts = |rank| Some(rank == 3);
        assert_eq!(c.replica_holders(&local, everyone, hosts), [3]);
        let two = config_with(|job| job.checkpoint_replicas = Some(2));
        assert_eq!(
            two.replica_holders(&local, everyone, hosts),
            [3, 1],
            "then the others"
        );
        assert_eq!(
            two.replica_holders(&local, |rank| rank != 3, hosts),
            [1, 2],
            "a lost rank keeps none"
        );
        // Every worker on the master's host: none by default (the host's loss would take
        // them all), as many as asked for otherwise.
        let here = |_| Some(false);
        assert!(c.replica_holders(&local, everyone, here).is_empty());
        assert_eq!(two.replica_holders(&local, everyone, here), [1, 2]);
        let none = config_with(|job| job.checkpoint_replicas = Some(0));
        assert!(none.replica_holders(&local, everyone, hosts).is_empty());
        let without = NodeConfig {
            checkpoint_every: None,
            ..config()
        };
        assert!(
            without.replica_holders(&local, everyone, hosts).is_empty(),
            "no checkpoints"
        );
    }

    #[test]
    fn each_wait_has_its_own_timeout_and_the_grace_never_outlasts_the_shutdown() {
        let c = config();
        let job = &c.job;
        assert_eq!(c.timeout(Waiting::Registration), job.startup_timeout);
        assert_eq!(c.timeout(Waiting::Connection), job.startup_timeout);
        assert_eq!(c.timeout(Waiting::Iteration(3)), job.iteration_timeout);
        assert_eq!(c.timeout(Waiting::Shutdown), job.shutdown_timeout);
        let secs = Duration::from_secs;
        let graced = |grace, shutdown| {
            config_with(|job| {
                job.failure_grace = grace;
                job.shutdown_timeout = shutdown;
            })
            .failure_grace()
        };
        assert_eq!(graced(secs(5), secs(1)), secs(1));
        assert_eq!(graced(secs(1), secs(5)), secs(1));
        // Ranks that may still reconnect are not waited for past half the shutdown.
        let short = config_with(|job| job.shutdown_timeout = secs(2));
        assert_eq!(short.reconnect_grace(), secs(1));
        assert_eq!(c.reconnect_grace(), secs(3).min(job.shutdown_timeout / 2));
        // The worker's grace is the node's, clamped once; its settings are the job's own.
        let node = config_with(|job| {
            job.failure_grace = secs(5);
            job.shutdown_timeout = secs(1);
            job.sync_timeout = secs(2);
        });
        let w = node.worker();
        assert_eq!(w.failure_grace, secs(1));
        assert_eq!(w.sync_patience, secs(7));
        assert!(Arc::ptr_eq(&w.job, &node.job), "one copy of the settings");
        let unbounded = config_with(|job| job.sync_timeout = Duration::MAX);
        assert_eq!(unbounded.worker().sync_patience, Duration::MAX);
    }

    #[test]
    fn deadlines_are_checked_at_a_twentieth_of_the_shortest_timeout_in_use() {
        let ms = Duration::from_millis;
        let c = config_with(|job| job.shutdown_timeout = ms(400));
        assert_eq!(c.check_interval(), ms(20));
        // The sync timeout counts in barrier mode only; the min-workers timeout only with a
        // quorum below every worker.
        let short = |job: &mut JobConfig| {
            job.sync_timeout = ms(40);
            job.min_workers_timeout = ms(60);
        };
        assert_eq!(config_with(short).check_interval(), ms(100));
        let c = config_with(|job| {
            short(job);
            job.barrier_mode = true;
        });
        assert_eq!(c.check_interval(), ms(2));
        let c = config_with(|job| {
            short(job);
            job.min_workers_ratio = 0.5;
        });
        assert_eq!(c.quorum(), 2);
        assert_eq!(c.check_interval(), ms(3));
        let c = config_with(|job| job.startup_timeout = Duration::from_micros(1));
        assert_eq!(c.check_interval(), ms(1), "never below 1 ms");
    }

    #[test]
    fn under_fail_a_workers_failure_of_the_attempt_ends_the_job_at_once_named_for_its_sender() {
        let failed = |attempt, rank| Envelope {
            from: 2,
            msg: ToMaster::<u8>::Failed {
                attempt,
                error: JobError::WorkerLost {
                    rank,
                    reason: "gone".into(),
                },
            },
        };
        let c = config();
        assert_eq!(
            c.ends_job_at_once(1, &failed(1, 5)).and_then(|e| e.rank()),
            Some(2),
            "a worker cannot blame another"
        );
        assert_eq!(
            c.ends_job_at_once(1, &failed(0, 2)),
            None,
            "a stale attempt's"
        );
        let recovering = config_with(|job| {
            job.failure_policy = FailurePolicy::RestartWorker { max_restarts: 1 }
        });
        assert_eq!(recovering.ends_job_at_once(1, &failed(1, 2)), None);
        let registered = Envelope {
            from: 0,
            msg: ToMaster::<u8>::Registered { attempt: 1 },
        };
        assert_eq!(c.ends_job_at_once(1, &registered), None);
    }

    #[test]
    fn an_abort_ends_the_job_for_a_workers_process_unless_it_dismisses_that_worker_alone() {
        let abort = |error| ToWorker::<u8>::Abort { attempt: 0, error };
        let own = JobError::WorkerLost {
            rank: 3,
            reason: "gone".into(),
        };
        assert_eq!(abort_ends_job(3, &abort(own.clone())), None);
        assert_eq!(abort_ends_job(1, &abort(own.clone())), Some(&own));
        assert_eq!(
            abort_ends_job(3, &abort(JobError::Cancelled)),
            Some(&JobError::Cancelled)
        );
        let iterate = ToWorker::<u8>::Iterate {
            attempt: 0,
            iteration: 1,
            last: None,
            fold: crate::ids::FoldRoute::Star,
            save: false,
        };
        assert_eq!(abort_ends_job(3, &iterate), None);
    }

    #[test]
    fn auto_folds_among_workers_only_across_processes_in_barrier_mode_for_an_elementwise_fold() {
        let settled = |aggregation, barrier_mode, combining, workers| {
            let mut c = config_with(|job| {
                job.aggregation = aggregation;
                job.barrier_mode = barrier_mode;
            });
            c.settle_aggregation(combining, workers)
                .map(|()| c.aggregation)
        };
        use Aggregation::*;
        let sum = Combining::Elementwise(ReduceOp::Sum);
        assert_eq!(settled(Auto, true, sum, Workers::Connected), Ok(Auto));
        for (barrier, combining, workers) in [
            (false, sum, Workers::Connected),
            (true, Combining::Whole, Workers::Connected),
            (true, Combining::No, Workers::Connected),
            (true, sum, Workers::Together),
            (true, sum, Workers::Apart),
        ] {
            assert_eq!(settled(Auto, barrier, combining, workers), Ok(Star));
        }
        assert_eq!(
            settled(Ring, true, Combining::Whole, Workers::Together),
            Ok(Ring)
        );
        let error = settled(Tree, true, Combining::No, Workers::Connected).unwrap_err();
        assert!(
            error.to_string().contains("combines its results"),
            "{error}"
        );
        let error = settled(Ring, true, sum, Workers::Apart).unwrap_err();
        assert!(error.to_string().contains("reach each other"), "{error}");
        // The ring from the iteration after a fold of 64 KiB on; never with one worker.
        let auto = NodeConfig {
            aggregation: Auto,
            ..config()
        };
        assert_eq!(auto.fold_route(None), FoldRoute::Star);
        assert_eq!(auto.fold_route(Some(AUTO_RING_BYTES - 1)), FoldRoute::Star);
        assert_eq!(auto.fold_route(Some(AUTO_RING_BYTES)), FoldRoute::Ring);
        let one = NodeConfig {
            aggregation: Tree,
            ..config_with(|job| job.workers = 1)
        };
        assert_eq!(one.fold_route(None), FoldRoute::Star);
    }
}
