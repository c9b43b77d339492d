//! What a user touches: build a job, choose its transport, run it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::checkpoint::CheckpointStore;
use crate::collective::ReduceOp;
use crate::compute::{MasterComputable, WorkerComputable};
use crate::coordinator::{Coordinator, Input, MalformedRows};
use crate::error::{ConfigError, JobError};
use crate::events::{Events, JobEvent};
use crate::ids::{Aggregation, Iteration, Rank};
use crate::interceptor::{MasterInterceptor, WorkerInterceptor};
use crate::messages::{ByKey, Mailbox, MakePost, MessageCombiner};
use crate::params::JobParams;
use crate::payload::{Element, Floats, Payload};
use crate::protocol::{Combining, JobOutcome};
use crate::protocol::{JobConfig, Placement};
use crate::runtime::{
    self, Cancel, Checkpointing, Combine, DynMaster, DynWorker, FlightRecorder, MasterHooks, Plan,
    Preempt, WorkerFactory, WorkerHookFactory,
};
use crate::transport::{Fingerprint, MemoryTransport, Transport};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// A job ready to run: a master, a factory of workers, settings, interceptors, event
/// subscribers and a transport. Made by [`Job::builder`].
///
/// `M` is the master's result type and `W` the workers'.
pub struct Job<M, W> {
    plan: Plan<M, W>,
}

impl<M: Payload, W: Payload> Job<M, W> {
    /// Starts building a job from its master and a factory that makes the worker of each
    /// rank (called once per rank, before the job starts; load data in
    /// [`init`](WorkerComputable::init), not here, so that start-up is timed and
    /// parallel).
    pub fn builder<MC, WC, F>(master: MC, workers: F) -> JobBuilder<M, W>
    where
        MC: MasterComputable<MasterResult = M, WorkerResult = W>,
        WC: WorkerComputable<MasterResult = M, WorkerResult = W>,
        F: Fn(Rank) -> WC + Send + Sync + 'static,
    {
        let master: DynMaster<M, W> = Box::new(master);
        let workers: WorkerFactory<M, W> =
            Arc::new(move |rank| -> DynWorker<M, W> { Box::new(workers(rank)) });
        JobBuilder {
            config: JobConfig::default(),
            master,
            workers,
            master_hooks: Vec::new(),
            worker_hooks: Vec::new(),
            events: Events::default(),
            transport: None,
            combine: None,
            for_workers: None,
            checkpoint: None,
            coordinator: None,
            input: None,
            cancel: None,
            preempt: None,
            flight: None,
            workers_set: false,
            rank: None,
            messages: None,
            params: Ok(JobParams::default()),
        }
    }

    /// The job's settings.
    pub fn config(&self) -> &JobConfig {
        &self.plan.config
    }

    /// What every process of this job must agree on — the versions, the worker count, the
    /// settings that change what a worker computes or how the protocol runs, the input,
    /// the result types — as its transport gets it ([`LinkSpec::fingerprint`]): over TCP,
    /// the master refuses a worker whose fingerprint differs, naming the field.
    ///
    /// [`LinkSpec::fingerprint`]: crate::transport::LinkSpec::fingerprint
    pub fn fingerprint(&self) -> Fingerprint {
        let plan = &self.plan;
        runtime::fingerprint::<M, W>(
            &plan.config,
            &plan.shape(),
            runtime::combining(plan.combine.as_ref()),
            plan.messages,
        )
    }

    /// Runs the job to its end and returns its outcome, or its first failure.
    ///
    /// Blocks the calling thread. The job runs on threads of its own (one for
    /// coordination, a compute pool), which have ended when this returns — unless user
    /// code outlived its deadline: it cannot be interrupted, so the job returns the
    /// timeout error and leaves that code's thread to end when the code returns. It may be
    /// called from inside an async runtime, though [`run_async`](Job::run_async) does not
    /// block one of its threads.
    pub fn run(self) -> Result<JobOutcome<M>, JobError> {
        runtime::execute(self.plan)
    }

    /// Runs the job to its end without blocking the calling async task.
    ///
    /// Cancel safety: dropping the future does not stop the job; it runs to its end on
    /// its own threads and its outcome is discarded.
    pub async fn run_async(self) -> Result<JobOutcome<M>, JobError> {
        runtime::execute_async(self.plan).await
    }
}

impl<M, W> fmt::Debug for Job<M, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job")
            .field("config", &self.plan.config)
            .field("master_interceptors", &self.plan.master_hooks.len())
            .field("worker_interceptors", &self.plan.worker_hooks.len())
            .field("events", &self.plan.events)
            .field("combine", &self.plan.combine.is_some())
            .field(
                "checkpoint",
                &self.plan.checkpoint.as_ref().map(|c| c.every),
            )
            .finish()
    }
}

/// Builds a [`Job`]. Every setting has a default (see [`JobConfig`]); [`build`](Self::build)
/// checks them.
pub struct JobBuilder<M, W> {
    // Read by `sim::Simulation::from_job` too.
    pub(crate) config: JobConfig,
    pub(crate) master: DynMaster<M, W>,
    pub(crate) workers: WorkerFactory<M, W>,
    pub(crate) master_hooks: MasterHooks<M, W>,
    pub(crate) worker_hooks: Vec<WorkerHookFactory<M, W>>,
    events: Events,
    transport: Option<Box<dyn Transport<M, W>>>,
    pub(crate) combine: Option<Combine<M, W>>,
    pub(crate) for_workers: Option<runtime::ForWorkersFn<M>>,
    pub(crate) checkpoint: Option<Checkpointing>,
    pub(crate) coordinator: Option<Box<dyn Coordinator>>,
    pub(crate) input: Option<Input>,
    cancel: Option<Cancel>,
    preempt: Option<Preempt>,
    flight: Option<FlightRecorder>,
    /// Whether the worker count was set ([`workers`](Self::workers) or
    /// [`config`](Self::config)), rather than left to its default.
    workers_set: bool,
    /// This process's rank in a cluster job (found by `cluster_from_env`).
    rank: Option<Rank>,
    /// The job's message type, when it has messages (`messages`).
    pub(crate) messages: Option<&'static str>,
    /// The program's own parameters (`params`), or why they have no form.
    pub(crate) params: Result<JobParams, ConfigError>,
}

impl<M: Payload, W: Payload> JobBuilder<M, W> {
    /// The number of workers. Default 1 — or, with a transport that knows its cluster's
    /// world size (TCP), that size; a different count is then refused with a
    /// [`ConfigError`] naming both.
    pub fn workers(mut self, workers: usize) -> Self {
        self.config.workers = workers;
        self.workers_set = true;
        self
    }

    /// The most iterations to run. Default 50.
    pub fn iterations(mut self, iterations: Iteration) -> Self {
        self.config.iterations = iterations;
        self
    }

    /// Halt when every worker votes to halt in one iteration
    /// ([`WorkerContext::vote_halt`](crate::WorkerContext::vote_halt)) — and, in a job with
    /// messages, no message is on its way (a message wakes the worker it is sent to).
    /// Default off.
    pub fn worker_halt(mut self, enabled: bool) -> Self {
        self.config.worker_halt = enabled;
        self
    }

    /// The job's id, for logs and spans. Default `"superstep"`.
    pub fn job_id(mut self, job_id: impl Into<String>) -> Self {
        self.config.job_id = job_id.into();
        self
    }

    /// The program's own parameters of the job — a generated data set's seed and size, a
    /// learning rate, a list of files: whatever the program was started with that makes
    /// this run another job than one with other values. Any serde value; a struct's
    /// fields are named ([`JobParams`]). Default: none.
    ///
    /// They are part of what the job is. Every process of the job must have the same
    /// ones: over TCP a process with others is refused at its handshake, naming the
    /// parameter and both values (its [`fingerprint`](Job::fingerprint) holds them as
    /// `params.<field>`). Every checkpoint records them, and the job never resumes from a
    /// checkpoint of other parameters: it fails at its start naming the parameter, both
    /// values and where the checkpoint is, rather than answer with another job's result.
    ///
    /// ```
    /// # use superstep::prelude::*;
    /// use superstep::checkpoint::MemoryCheckpointStore;
    /// # struct Sum; impl MasterComputable for Sum { type MasterResult = u64; type WorkerResult = u64;
    /// #   fn compute(&mut self, c: &mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> {
    /// #     Ok(Step::Continue(c.worker_results().iter().sum())) } }
    /// # struct Seeded(u64); impl WorkerComputable for Seeded { type MasterResult = u64; type WorkerResult = u64;
    /// #   fn compute(&mut self, _: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> { Ok(self.0) } }
    /// #[derive(serde::Serialize)]
    /// struct Args { seed: u64 }
    ///
    /// let store = MemoryCheckpointStore::new();
    /// let job = |seed: u64| {
    ///     Job::builder(Sum, move |_| Seeded(seed))
    ///         .workers(2)
    ///         .iterations(3)
    ///         .params(&Args { seed })
    ///         .checkpoint(store.clone(), 1)
    /// };
    /// assert_eq!(*job(7).run()?.result, 14);
    /// // The store holds seed 7's job, finished: seed 8's is refused, not answered with 14.
    /// let refused = job(8).run().unwrap_err().to_string();
    /// assert!(refused.contains("`seed` is 7 there and 8 in this job"), "{refused}");
    /// # Ok::<(), superstep::JobError>(())
    /// ```
    pub fn params(mut self, params: &impl Serialize) -> Self {
        self.params = JobParams::of(params);
        self
    }

    /// How long start-up (every `pre_application` and `init`) may take.
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.config.startup_timeout = timeout;
        self
    }

    /// How long one iteration may wait for the workers' results, and for the master's
    /// compute.
    pub fn iteration_timeout(mut self, timeout: Duration) -> Self {
        self.config.iteration_timeout = timeout;
        self
    }

    /// How long the end of the job (every `post_application`) may take.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.config.shutdown_timeout = timeout;
        self
    }

    /// Once the job failed, how long its end waits for workers still running user code
    /// before `run` returns the first failure (see [`JobConfig::failure_grace`]). Default
    /// 250 ms.
    pub fn failure_grace(mut self, grace: Duration) -> Self {
        self.config.failure_grace = grace;
        self
    }

    /// Where user code runs. Default [`Placement::Auto`].
    pub fn placement(mut self, placement: Placement) -> Self {
        self.config.placement = placement;
        self
    }

    /// Under [`Placement::Auto`], an iteration whose last run took less than this runs
    /// inline (see [`JobConfig::inline_threshold`]). Default 50 µs.
    pub fn inline_threshold(mut self, threshold: Duration) -> Self {
        self.config.inline_threshold = threshold;
        self
    }

    /// The number of compute threads. Default: one per available core.
    pub fn compute_threads(mut self, threads: usize) -> Self {
        self.config.compute_threads = Some(threads);
        self
    }

    /// Barrier mode: workers may call [`barrier`](crate::WorkerContext::barrier) and
    /// [`all_gather`](crate::WorkerContext::all_gather) in their compute. Every worker then
    /// computes on a thread of its own. Default off.
    pub fn barrier_mode(mut self, enabled: bool) -> Self {
        self.config.barrier_mode = enabled;
        self
    }

    /// How long a `barrier()` / `all_gather()` epoch may wait, from its first arrival.
    pub fn sync_timeout(mut self, timeout: Duration) -> Self {
        self.config.sync_timeout = timeout;
        self
    }

    /// Stragglers: once `timeout` has passed in an iteration, go on as soon as
    /// `ceil(ratio × workers)` results are in, leaving the slower ranks out of that
    /// iteration (see [`JobConfig::min_workers_ratio`]). The master's code learns which
    /// ranks reported from [`MasterContext::reported_ranks`](crate::MasterContext::reported_ranks).
    pub fn min_workers(mut self, ratio: f64, timeout: Duration) -> Self {
        self.config.min_workers_ratio = ratio;
        self.config.min_workers_timeout = timeout;
        self
    }

    /// What the job does when a worker fails (see [`FailurePolicy`](crate::FailurePolicy)
    /// and [`JobConfig::failure_policy`]): fail (the default), replace the worker, go on
    /// without it, or restart every worker from the newest checkpoint as a new attempt.
    ///
    /// A worker in this process is replaced by a new actor of the same rank; one in
    /// another process by a process that connects again with its rank (see
    /// `superstep-launch --restarts`).
    pub fn failure_policy(mut self, policy: crate::protocol::FailurePolicy) -> Self {
        self.config.failure_policy = policy;
        self
    }

    /// Sets the settings `config` names, and only those: the ones its settings document
    /// named, when it was read from one, and the ones changed from their defaults. The
    /// others stay as they were set on this builder, before or after — a document that
    /// names `iterations` changes the iterations and nothing else, whatever the order:
    ///
    /// ```
    /// # use superstep::prelude::*;
    /// # use superstep::{JobConfig, Placement};
    /// # struct M; impl MasterComputable for M { type MasterResult = u64; type WorkerResult = u64;
    /// #   fn compute(&mut self, _: &mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> { Ok(Step::Halt(1)) } }
    /// # struct W; impl WorkerComputable for W { type MasterResult = u64; type WorkerResult = u64;
    /// #   fn compute(&mut self, _: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> { Ok(1) } }
    /// let document: JobConfig = serde_json::from_str(
    ///     r#"{"iterations": 20, "placement": "auto",
    ///         "failure_policy": {"restart_worker": {"max_restarts": 3}}}"#,
    /// )?;
    /// let job = Job::builder(M, |_| W)
    ///     .workers(4)
    ///     .placement(Placement::Pool)
    ///     .config(document)
    ///     .build()?;
    /// assert_eq!(job.config().workers, 4); // set on the builder, not named by the document
    /// assert_eq!(job.config().iterations, 20);
    /// assert_eq!(job.config().placement, Placement::Auto); // named: its default, but named
    /// assert_eq!(
    ///     job.config().failure_policy,
    ///     FailurePolicy::RestartWorker { max_restarts: 3 }
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn config(mut self, config: JobConfig) -> Self {
        // A document that does not name `workers` leaves it to the cluster's world size,
        // as a builder that never set it does.
        let set = self.config.overlay(config);
        self.workers_set |= set.contains(&"workers");
        self
    }

    /// How often the master logs a completed iteration at INFO (see
    /// [`JobConfig::progress_interval`]). Default 1 s; zero logs every iteration.
    pub fn progress_interval(mut self, interval: Duration) -> Self {
        self.config.progress_interval = interval;
        self
    }

    /// How long a checkpoint's write may take before it is said at WARN, naming the store,
    /// and again each time as long while it lasts (see [`JobConfig::checkpoint_slow`]).
    /// Default 10 s.
    pub fn checkpoint_slow(mut self, after: Duration) -> Self {
        self.config.checkpoint_slow = after;
        self
    }

    /// How many of the last iterations the job report keeps in detail (see
    /// [`JobConfig::report_iterations`]). Default 1,000.
    pub fn report_iterations(mut self, iterations: usize) -> Self {
        self.config.report_iterations = iterations;
        self
    }

    /// Lets the job resume from a checkpoint of another world size or input, each worker
    /// starting from its `init` on its new shard (see [`JobConfig::reshard_on_resume`]).
    /// Default `false`: such a checkpoint is refused, naming both shapes.
    pub fn reshard_on_resume(mut self, enabled: bool) -> Self {
        self.config.reshard_on_resume = enabled;
        self
    }

    /// How many workers of other processes keep a copy of each checkpoint, so that a
    /// master started again on an empty checkpoint store resumes from the newest copy
    /// (see [`JobConfig::checkpoint_replicas`]). Default: 1 when the job spans two hosts
    /// or more, 0 when every process is on the master's host; 0 keeps none.
    pub fn checkpoint_replicas(mut self, replicas: usize) -> Self {
        self.config.checkpoint_replicas = Some(replicas);
        self
    }

    /// Lets the environment override the common settings set so far
    /// ([`JobConfig::with_env`]: `SUPERSTEP_ITERATIONS`, `SUPERSTEP_ITERATION_TIMEOUT`,
    /// …). Fails naming the variable whose value does not parse.
    pub fn settings_from_env(mut self) -> Result<Self, ConfigError> {
        let workers = self.config.workers;
        self.config = self.config.with_env()?;
        self.workers_set |= self.config.workers != workers;
        Ok(self)
    }

    /// Adds an interceptor to the master. Several nest like a call stack, in the order
    /// added (see [`interceptor`](crate::interceptor)).
    pub fn master_interceptor(mut self, interceptor: impl MasterInterceptor<M, W>) -> Self {
        self.master_hooks.push(Box::new(interceptor));
        self
    }

    /// Adds an interceptor to every worker: `make` is called once per rank to make that
    /// worker's instance.
    pub fn worker_interceptor<I, F>(mut self, make: F) -> Self
    where
        I: WorkerInterceptor<M, W>,
        F: Fn(Rank) -> I + Send + Sync + 'static,
    {
        self.worker_hooks.push(runtime::worker_hook_factory(make));
        self
    }

    /// Calls `subscriber` with every [`JobEvent`], in order, on the job's coordination
    /// thread: keep it cheap, or use [`events::channel`](crate::events::channel).
    pub fn on_event(mut self, subscriber: impl Fn(&JobEvent) + Send + Sync + 'static) -> Self {
        self.events.subscribe(Arc::new(subscriber));
        self
    }

    /// Combines the workers' results as they arrive instead of handing the master one per
    /// worker (Guagua's `Combinable`): `combine(&mut fold, next)` folds the result of
    /// rank `r` into the fold of ranks `0..r` as soon as those arrived, so the folding
    /// order — and a floating-point sum — is the same in every run. The master reads the
    /// fold with [`MasterContext::combined_result`](crate::MasterContext::combined_result)
    /// and [`worker_results`](crate::MasterContext::worker_results) is empty.
    ///
    /// The master's node then holds the fold and only the results that arrived ahead of a
    /// missing lower rank, not one per worker: for large results (a gradient, say) this is
    /// what bounds its memory; [`IterationReport::results_held`](crate::IterationReport)
    /// tells how many it held. `combine` runs on the coordination thread as results arrive,
    /// overlapping the slower workers' compute; a panic in it fails the job as the master's
    /// failure in [`Phase::Combine`](crate::Phase::Combine).
    ///
    /// Across processes the results can also be folded among the workers before they reach
    /// the master, so the master's link carries one result an iteration rather than one
    /// per worker: see [`aggregation`](Self::aggregation), and
    /// [`combine_by`](JobBuilder::combine_by) for a fold the workers carry in chunks. The
    /// workers then fold with their own process's `combine`: every process must build the
    /// job with the same one (a closure cannot be compared between processes; an
    /// element-wise fold's op is, and a process with another is refused).
    ///
    /// ```
    /// # use superstep::prelude::*;
    /// # struct Sum;
    /// # impl MasterComputable for Sum {
    /// #     type MasterResult = f64;
    /// #     type WorkerResult = Vec<f64>;
    /// #     fn compute(&mut self, ctx: &mut MasterContext<f64, Vec<f64>>) -> Result<Step<f64>, BoxError> {
    /// #         Ok(Step::Continue(ctx.combined_result().unwrap().iter().sum()))
    /// #     }
    /// # }
    /// # struct Part(usize);
    /// # impl WorkerComputable for Part {
    /// #     type MasterResult = f64;
    /// #     type WorkerResult = Vec<f64>;
    /// #     fn compute(&mut self, _: &mut WorkerContext<f64, Vec<f64>>) -> Result<Vec<f64>, BoxError> {
    /// #         Ok(vec![self.0 as f64; 4])
    /// #     }
    /// # }
    /// let outcome = Job::builder(Sum, Part)
    ///     .workers(3)
    ///     .iterations(2)
    ///     .combine(|fold: &mut Vec<f64>, next: Vec<f64>| {
    ///         fold.iter_mut().zip(next).for_each(|(a, b)| *a += b)
    ///     })
    ///     .run()?;
    /// assert_eq!(*outcome.result, 12.0); // (0 + 1 + 2) × 4
    /// assert!(outcome.report.iterations.iter().all(|i| i.results_held <= 3));
    /// # Ok::<(), superstep::JobError>(())
    /// ```
    pub fn combine(mut self, combine: impl Fn(&mut W, W) + Send + Sync + 'static) -> Self {
        let fold: runtime::CombineFn<W> = Arc::new(combine);
        let among = Arc::clone(&fold);
        self.combine = Some(Combine {
            fold,
            among: Arc::new(move |ctx, result, route| ctx.fold_whole(result, route, &*among)),
            combining: Combining::Whole,
        });
        self
    }

    /// What the workers get of the job's final result: made by `make` from the master's,
    /// once, where the master runs, and sent to every worker when the job completes — the
    /// result of the [`JobOutcome`] of a process without the master, and what the
    /// workers' interceptors' `post_application` sees. By default the master's final
    /// result itself. The master's process's outcome keeps the master's result.
    ///
    /// A final result larger than a frame (`TcpSettings::max_frame`) cannot be sent and
    /// fails the job as it ends; one that only the master's process needs can be sent
    /// smaller: a graph job ([`GraphBuilder::job`](crate::graph::GraphBuilder::job))
    /// sends its vertices' values to no worker. A panic in `make` fails the job as its
    /// master's compute would.
    pub fn result_for_worker_processes(
        mut self,
        make: impl Fn(&M) -> M + Send + Sync + 'static,
    ) -> Self {
        self.for_workers = Some(Arc::new(make));
        self
    }

    /// How the workers' results reach the master when the job combines them: each on its
    /// own, or folded among the workers first — see [`Aggregation`]. Default
    /// [`Aggregation::Auto`].
    pub fn aggregation(mut self, aggregation: Aggregation) -> Self {
        self.config.aggregation = aggregation;
        self
    }

    /// Saves a checkpoint to `store` after every `every`-th iteration and after the last —
    /// the iteration, the master result and the master computable's own state
    /// ([`save_state`](MasterComputable::save_state)) — and resumes from the newest usable
    /// one when the job starts (one of the job's last iteration ends it at once, with its
    /// result and without waiting for workers): the master restores its state
    /// ([`restore_state`](MasterComputable::restore_state)) and the job goes on with the
    /// iteration after the checkpoint's, the workers running `init` again and computing
    /// with the restored master result. With no checkpoint yet (a failure before the
    /// first), the job starts from the beginning.
    ///
    /// A checkpoint is saved on the thread that ran the master's compute, after its
    /// `post_iteration`. One that cannot be saved is logged and skipped, leaving the one
    /// before; checkpoints of another job, or a store that cannot be read, fail the start
    /// with [`JobError::Checkpoint`]. [`JobReport`](crate::JobReport) says where the job
    /// resumed from and which checkpoints it saved.
    ///
    /// ```
    /// # use superstep::prelude::*;
    /// use superstep::checkpoint::MemoryCheckpointStore;
    /// # struct Count;
    /// # impl MasterComputable for Count {
    /// #     type MasterResult = u64;
    /// #     type WorkerResult = u64;
    /// #     fn compute(&mut self, ctx: &mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> {
    /// #         Ok(Step::Continue(ctx.last_master_result().unwrap_or(&0) + ctx.worker_results().iter().sum::<u64>()))
    /// #     }
    /// # }
    /// # struct One;
    /// # impl WorkerComputable for One {
    /// #     type MasterResult = u64;
    /// #     type WorkerResult = u64;
    /// #     fn compute(&mut self, _: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> { Ok(1) }
    /// # }
    /// let store = MemoryCheckpointStore::new();
    /// let job = |iterations| {
    ///     Job::builder(Count, |_| One)
    ///         .workers(2)
    ///         .iterations(iterations)
    ///         .checkpoint(store.clone(), 3)
    /// };
    /// let first = job(7).run()?; // saves after iterations 3 and 6, and the last, 7
    /// assert_eq!(first.report.checkpoints, vec![3, 6, 7]);
    /// let resumed = job(10).run()?; // runs 8..=10 from the checkpoint of 7
    /// assert_eq!(resumed.report.resumed_from(), Some(7));
    /// assert_eq!(*resumed.result, 20);
    /// # Ok::<(), superstep::JobError>(())
    /// ```
    pub fn checkpoint(mut self, store: impl CheckpointStore, every: Iteration) -> Self {
        self.checkpoint = Some(Checkpointing {
            store: Box::new(store),
            every,
        });
        self
    }

    /// The job's coordinator: hooks run with the master before the job starts and when it
    /// ends — sharding, staging, merging or committing the output, cleaning up after a
    /// failure (see [`crate::coordinator`]; [`Composite`](crate::coordinator::Composite)
    /// runs several).
    pub fn coordinator(mut self, coordinator: impl Coordinator) -> Self {
        self.coordinator = Some(Box::new(coordinator));
        self
    }

    /// What the job reads: split into one shard per worker — by the coordinator's
    /// `prepare_shards` if it shards, else by [`Input::split`] — which each worker finds
    /// in [`WorkerContext::shard`](crate::WorkerContext::shard).
    pub fn input(mut self, input: Input) -> Self {
        self.input = Some(input);
        self
    }

    /// What a malformed CSV or JSONL row does (see [`JobConfig::malformed_rows`]).
    pub fn malformed_rows(mut self, policy: MalformedRows) -> Self {
        self.config.malformed_rows = policy;
        self
    }

    /// A handle that cancels the job from any thread: the job then fails with
    /// [`JobError::Cancelled`] — every worker is stopped, and the coordinator's `on_error`
    /// runs.
    pub fn cancel(mut self, cancel: Cancel) -> Self {
        self.cancel = Some(cancel);
        self
    }

    /// A handle that asks the job to stop for a preemption from any thread, as its
    /// preempt signal does ([`JobConfig::preempt_signal`]): the master checkpoints at the
    /// next iteration boundary and every process of the job ends with
    /// [`JobError::Preempted`], from which a run again resumes. For a program that handles
    /// the signal itself, or a scheduler's notice that comes another way (a spot
    /// instance's metadata, say).
    pub fn preempt(mut self, preempt: Preempt) -> Self {
        self.preempt = Some(preempt);
        self
    }

    /// A handle that asks the running job for a dump of every rank's flight recorder
    /// ([`superstep::flight`](crate::flight)) from any thread, as its dump signal does
    /// ([`JobConfig::dump_signal`]).
    pub fn flight_recorder(mut self, recorder: FlightRecorder) -> Self {
        self.flight = Some(recorder);
        self
    }

    /// The transport that connects master and workers. Default: [`MemoryTransport`].
    pub fn transport(mut self, transport: impl Transport<M, W>) -> Self {
        self.transport = Some(Box::new(transport));
        self
    }

    /// Runs the job as one process of a cluster job when this process's environment says
    /// it is one — `superstep-launch`, torchrun, Slurm, Open MPI, a Kubernetes indexed job
    /// ([`ClusterEnv`](crate::transport::ClusterEnv)) — over TCP, with one worker per
    /// process (the workers set to the world size); otherwise the job stays as built so
    /// far, in memory. The one line of glue a cluster binary needs:
    ///
    /// ```no_run
    /// # use superstep::prelude::*;
    /// # struct W; impl WorkerComputable for W { type MasterResult = u64; type WorkerResult = u64;
    /// #   fn compute(&mut self, _: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> { Ok(1) } }
    /// # struct M; impl MasterComputable for M { type MasterResult = u64; type WorkerResult = u64;
    /// #   fn compute(&mut self, _: &mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> { Ok(Step::Halt(1)) } }
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let outcome = Job::builder(M, |_| W)
    ///     .workers(4) // in memory; a cluster job has one worker per process
    ///     .cluster_from_env()?
    ///     .run()?;
    /// # Ok(()) }
    /// ```
    ///
    /// The same binary then runs alone (`cargo run`), and as every process of a cluster
    /// job (`superstep-launch --nproc 4 -- ./job`, `torchrun`, `srun`). A worker count set
    /// after this call must be the world size. Fails, naming the variable, when the
    /// environment describes a cluster wrongly (a rank outside the world size, no master
    /// address, a bad number).
    #[cfg(feature = "tcp")]
    pub fn cluster_from_env(mut self) -> Result<Self, crate::transport::TransportError> {
        let Some(transport) = crate::transport::TcpTransport::<M, W>::from_env()? else {
            return Ok(self);
        };
        let settings = transport.settings();
        self.rank = Some(settings.rank);
        self.config.workers = settings.world_size;
        self.workers_set = false;
        Ok(self.transport(transport))
    }

    /// This process's rank in a cluster job found by
    /// `cluster_from_env` (the `tcp` feature), or `None` when the job runs in this
    /// process alone.
    pub fn process_rank(&self) -> Option<Rank> {
        self.rank
    }

    /// Whether this process runs the master: always in memory; rank 0 of a cluster job.
    pub fn runs_master(&self) -> bool {
        self.rank.is_none_or(|r| r == 0)
    }

    /// The number of workers as set so far: the world size after
    /// `cluster_from_env` (the `tcp` feature) found a cluster.
    pub fn worker_count(&self) -> usize {
        self.config.workers
    }

    /// Checks the settings and makes the job.
    pub fn build(mut self) -> Result<Job<M, W>, ConfigError> {
        // One worker per process of the cluster, unless set otherwise — which is a
        // mistake, said here rather than as a transport's failure.
        if let Some(world) = self.transport.as_ref().and_then(|t| t.world_size()) {
            if self.workers_set && self.config.workers != world {
                return Err(ConfigError::new(
                    "workers",
                    self.config.workers,
                    &format!("must be the cluster's world size, {world} (one worker per process: SUPERSTEP_WORLD_SIZE or the launcher's), or left unset to take it"),
                ));
            }
            self.config.workers = world;
        }
        // One id for the job, in its logs, spans and thread names as in its handshakes: the
        // transport's when it names one (`SUPERSTEP_JOB_ID`, `SLURM_JOB_ID`), else the
        // builder's, which the transport then takes.
        if let Some(id) = self.transport.as_ref().and_then(|t| t.job_id()) {
            if self.config.job_id == JobConfig::default().job_id {
                self.config.job_id = id.to_string();
            } else if self.config.job_id != id {
                return Err(ConfigError::new(
                    "job_id",
                    &self.config.job_id,
                    &format!("must be the transport's job id `{id}` (from SUPERSTEP_JOB_ID or TcpSettings::job_id; a scheduler's id, such as SLURM_JOB_ID, is the run id and never conflicts), or left unset to take it"),
                ));
            }
        }
        self.config.validate()?;
        let params = self.params?;
        check_messages(self.messages, &self.config)?;
        if let Some(c) = &self.checkpoint {
            check_checkpoint_every(c.every)?;
        }
        Ok(Job {
            plan: Plan {
                config: self.config,
                master: self.master,
                master_hooks: self.master_hooks,
                workers: self.workers,
                worker_hooks: self.worker_hooks,
                events: self.events,
                combine: self.combine,
                for_workers: self.for_workers,
                checkpoint: self.checkpoint,
                coordinator: self.coordinator,
                input: self.input,
                cancel: self.cancel,
                preempt: self.preempt,
                flight: self.flight,
                messages: self.messages,
                params,
                transport: self
                    .transport
                    .unwrap_or_else(|| Box::new(MemoryTransport::new())),
            },
        })
    }

    /// Builds and runs the job: [`build`](Self::build) then [`Job::run`].
    pub fn run(self) -> Result<JobOutcome<M>, JobError> {
        self.build()?.run()
    }
}

impl<M: Payload, T: Element> JobBuilder<M, Floats<T>> {
    /// Combines the workers' results element by element with `op`, as
    /// [`combine`](Self::combine) with a fold of `a[i] = op(a[i], b[i])` does — the same
    /// rank order, the same bits — but a fold the workers can carry among themselves in
    /// chunks: with [`Aggregation::Ring`] (or [`Aggregation::Auto`] in barrier mode across
    /// processes, once results are large) the results travel along the ranks as a pipeline, each link
    /// carrying about one result whatever the number of workers, and the master receives
    /// one folded result an iteration.
    ///
    /// Every worker's result must have as many elements: results of different lengths fail
    /// the iteration naming the lengths.
    ///
    /// ```
    /// # use superstep::prelude::*;
    /// use superstep::collective::ReduceOp;
    /// # struct Total;
    /// # impl MasterComputable for Total {
    /// #     type MasterResult = f64;
    /// #     type WorkerResult = Floats;
    /// #     fn compute(&mut self, ctx: &mut MasterContext<f64, Floats>) -> Result<Step<f64>, BoxError> {
    /// #         Ok(Step::Continue(ctx.combined_result().unwrap().iter().sum()))
    /// #     }
    /// # }
    /// # struct Part(usize);
    /// # impl WorkerComputable for Part {
    /// #     type MasterResult = f64;
    /// #     type WorkerResult = Floats;
    /// #     fn compute(&mut self, _: &mut WorkerContext<f64, Floats>) -> Result<Floats, BoxError> {
    /// #         Ok(Floats::from(vec![self.0 as f64; 4]))
    /// #     }
    /// # }
    /// let outcome = Job::builder(Total, Part)
    ///     .workers(3)
    ///     .iterations(2)
    ///     .barrier_mode(true)
    ///     .aggregation(Aggregation::Ring)
    ///     .combine_by(ReduceOp::Sum)
    ///     .run()?;
    /// assert_eq!(*outcome.result, 12.0); // (0 + 1 + 2) × 4
    /// # Ok::<(), superstep::JobError>(())
    /// ```
    pub fn combine_by(mut self, op: ReduceOp) -> Self {
        self.combine = Some(Combine {
            fold: Arc::new(move |fold: &mut Floats<T>, next: Floats<T>| {
                assert!(
                    fold.len() == next.len(),
                    "results of different lengths cannot be combined element by element: {} and {} element(s)",
                    fold.len(),
                    next.len()
                );
                crate::collective::fold_into(fold, next.0.into_iter(), op, false);
            }),
            among: Arc::new(move |ctx, result, route| ctx.fold_elements(result, route, op)),
            combining: Combining::Elementwise(op),
        });
        self
    }
}

impl<M: Payload, W: Payload> JobBuilder<M, W> {
    /// Gives the job messages of type `G` between supersteps, Pregel's way: in compute a
    /// worker sends messages to ranks ([`WorkerContext::send`](crate::WorkerContext::send)),
    /// and in the next superstep each rank reads those sent to it
    /// ([`WorkerContext::messages`](crate::WorkerContext::messages)), in the order of the
    /// senders' ranks, then of their sends. They go from worker to worker over the peer
    /// mesh (in one process, handed over as values), never through the master; a job with
    /// messages runs in barrier mode, which this turns on.
    ///
    /// With [`worker_halt`](Self::worker_halt), the job ends when every worker voted to
    /// halt in one superstep and none of them sent a message: a message wakes the worker
    /// it is sent to, which computes the next superstep and votes again.
    /// [`IterationReport::messages`](crate::IterationReport::messages) counts each
    /// superstep's messages and bytes. Declared again, the last type counts.
    ///
    /// Every superstep ends in an exchange among all the ranks, with a collective's
    /// rules: a rank whose compute ends more than `sync_timeout` after the first one's
    /// fails the superstep, naming it. Across processes one rank's messages to another in
    /// one superstep travel in frames of at most the transport's largest
    /// (`TcpSettings::max_frame`, 256 MiB by default): a larger batch goes in several, one
    /// a round of the exchange, each round folded into the receiver's inbox before the
    /// next comes ([`MailCount::rounds`](crate::MailCount::rounds) counts them). One
    /// message larger than a frame fails its sender's superstep with
    /// [`SyncError::TooLarge`](crate::SyncError::TooLarge), naming both ranks, the size
    /// and the limit.
    ///
    /// ```
    /// # use superstep::prelude::*;
    /// # struct Last;
    /// # impl MasterComputable for Last {
    /// #     type MasterResult = Vec<u64>;
    /// #     type WorkerResult = Vec<u64>;
    /// #     fn compute(&mut self, ctx: &mut MasterContext<Vec<u64>, Vec<u64>>) -> Result<Step<Vec<u64>>, BoxError> {
    /// #         Ok(Step::Continue(ctx.worker_results().concat()))
    /// #     }
    /// # }
    /// /// Each rank sends the next one its rank; each keeps what it was sent.
    /// struct Pass;
    /// impl WorkerComputable for Pass {
    ///     type MasterResult = Vec<u64>;
    ///     type WorkerResult = Vec<u64>;
    ///     fn compute(&mut self, ctx: &mut WorkerContext<Vec<u64>, Vec<u64>>) -> Result<Vec<u64>, BoxError> {
    ///         let got = ctx.messages::<u64>()?.to_vec();
    ///         let next = (ctx.rank() + 1) % ctx.workers();
    ///         ctx.send(next, ctx.rank() as u64)?;
    ///         Ok(got)
    ///     }
    /// }
    /// let outcome = Job::builder(Last, |_| Pass)
    ///     .workers(3)
    ///     .iterations(2)
    ///     .messages::<u64>()
    ///     .run()?;
    /// assert_eq!(*outcome.result, vec![2, 0, 1]);
    /// # Ok::<(), superstep::JobError>(())
    /// ```
    pub fn messages<G>(self) -> Self
    where
        G: Serialize + DeserializeOwned + Send + 'static,
    {
        self.mailing::<G>(None, false)
    }

    /// As [`messages`](Self::messages), with a combiner (Giraph's `MessageCombiner`):
    /// messages to one rank whose `key` is the same — the vertex they are for, say — are
    /// folded into one by `fold` before they leave the sender for another process, in the
    /// order they were sent; and those from every sender again as they arrive, in the
    /// senders' rank order. A key's message stands where the first with that key did.
    ///
    /// As in Pregel and Giraph, combining is a saving, not a promise: between workers of
    /// one process, where messages are handed over without a copy, they are not combined
    /// (it would cost more than it saves), and each is read as it was sent. So the fold
    /// must be one the compute cannot tell from reading every message — commutative and
    /// associative, as a minimum or a sum (of floats: up to its last bits).
    ///
    /// ```no_run
    /// # use superstep::prelude::*;
    /// # fn job(b: JobBuilder<(), ()>) -> JobBuilder<(), ()> {
    /// // (vertex, label): the least label per vertex.
    /// b.combine_messages(|m: &(u32, u32)| m.0, |into, m| into.1 = into.1.min(m.1))
    /// # }
    /// ```
    pub fn combine_messages<G, K>(
        self,
        key: impl Fn(&G) -> K + Send + Sync + 'static,
        fold: impl Fn(&mut G, G) + Send + Sync + 'static,
    ) -> Self
    where
        G: Serialize + DeserializeOwned + Send + 'static,
        K: std::hash::Hash + Eq + Send + 'static,
    {
        self.combine_messages_with(key, fold, true)
    }

    /// As [`combine_messages`](Self::combine_messages), combined before they leave the
    /// sender and, if `arrivals`, again as they arrive (not where the receiver folds them
    /// into places of its own, as a graph job's workers do).
    pub(crate) fn combine_messages_with<G, K>(
        self,
        key: impl Fn(&G) -> K + Send + Sync + 'static,
        fold: impl Fn(&mut G, G) + Send + Sync + 'static,
        arrivals: bool,
    ) -> Self
    where
        G: Serialize + DeserializeOwned + Send + 'static,
        K: std::hash::Hash + Eq + Send + 'static,
    {
        let combiner: Arc<dyn MessageCombiner<G>> = Arc::new(ByKey::new(key, fold));
        self.mailing(Some(combiner), arrivals)
    }

    /// Makes every worker with a mailbox of `G`, combined by `combiner` (as they arrive
    /// too, if `arrivals`).
    fn mailing<G>(mut self, combiner: Option<Arc<dyn MessageCombiner<G>>>, arrivals: bool) -> Self
    where
        G: Serialize + DeserializeOwned + Send + 'static,
    {
        self.config.barrier_mode = true;
        self.messages = Some(std::any::type_name::<G>());
        let make: MakePost<M, W> = Arc::new(move |workers| {
            Box::new(Mailbox::<G>::new(workers, combiner.clone(), arrivals))
        });
        let inner = Arc::clone(&self.workers);
        self.workers = Arc::new(move |rank| -> DynWorker<M, W> {
            Box::new(WithMail {
                inner: inner(rank),
                make: Arc::clone(&make),
            })
        });
        self
    }
}

/// A worker made with its mailbox: given to its context before `init`, so that every
/// worker of the job — one started again included — has one of the job's type. The
/// outermost wins: a type declared again replaces the one before.
struct WithMail<M, W> {
    inner: DynWorker<M, W>,
    make: MakePost<M, W>,
}

impl<M: Payload, W: Payload> WorkerComputable for WithMail<M, W> {
    type MasterResult = M;
    type WorkerResult = W;

    fn init(
        &mut self,
        ctx: &mut crate::compute::WorkerContext<M, W>,
    ) -> Result<(), crate::error::BoxError> {
        if ctx.mail.is_none() {
            ctx.mail = Some((self.make)(ctx.workers));
        }
        self.inner.init(ctx)
    }

    fn compute(
        &mut self,
        ctx: &mut crate::compute::WorkerContext<M, W>,
    ) -> Result<W, crate::error::BoxError> {
        self.inner.compute(ctx)
    }

    fn save_state(&self) -> Result<Vec<u8>, crate::error::BoxError> {
        self.inner.save_state()
    }

    fn restore_state(&mut self, state: &[u8]) -> Result<(), crate::error::BoxError> {
        self.inner.restore_state(state)
    }
}

impl<M, W> fmt::Debug for JobBuilder<M, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobBuilder")
            .field("config", &self.config)
            .field("master_interceptors", &self.master_hooks.len())
            .field("worker_interceptors", &self.worker_hooks.len())
            .field("events", &self.events)
            .field("combine", &self.combine.is_some())
            .field("checkpoint", &self.checkpoint.as_ref().map(|c| c.every))
            .field("workers_set", &self.workers_set)
            .finish()
    }
}

/// The settings a job with messages of type `messages` needs: barrier mode.
pub(crate) fn check_messages(
    messages: Option<&'static str>,
    config: &JobConfig,
) -> Result<(), ConfigError> {
    let Some(messages) = messages else {
        return Ok(());
    };
    if !config.barrier_mode {
        return Err(ConfigError::new(
            "barrier_mode",
            false,
            &format!("must be on for a job with messages (of type {messages}): `messages` turns it on, and a later setting turned it off"),
        ));
    }
    Ok(())
}

/// A checkpoint every `every` iterations: at least 1.
pub(crate) fn check_checkpoint_every(every: Iteration) -> Result<(), ConfigError> {
    if every == 0 {
        return Err(ConfigError::new(
            "checkpoint",
            every,
            "a checkpoint every 1 or more iterations",
        ));
    }
    Ok(())
}
