//! A deterministic simulator: a job's master and workers — your computables and the
//! `protocol` state machines that the runtime drives — run in one
//! thread on a virtual clock, with message order and faults drawn from a seed.
//!
//! Same seed, same run: the same messages in the same order, the same faults at the same
//! points, the same trace. A property test runs many seeds and, when one fails, prints it
//! with the command that replays it (see [`Simulation::check`]).
//!
//! The simulator drives the master's node the runtime ships — the same state machine
//! (`protocol::MasterNode`: the gate, the sync state, the recovery under the
//! [`FailurePolicy`](crate::FailurePolicy), the schedule, the drain) and the same runner of the master's code,
//! interceptors and checkpoints — built the way the runtime builds it, from the settings
//! and the newest checkpoint. The simulator only delivers messages, advances the clock and
//! injects faults: what a round, a recovery or the end of a job means is decided in the
//! node. Each worker is driven by the runtime's worker node (`protocol::WorkerNode`): it
//! acts on each master message once, in increasing order, skipping ahead when it is late,
//! waits for the job's first failure when it failed on its own, and says it is done when
//! it stops — its start-up, computes and timers taking virtual time. Every result crosses the wire encoding on its way, as between
//! processes. In barrier mode each worker's compute runs on a thread of its own, as in
//! the runtime, and its `barrier()` and `all_gather()` calls travel the simulated network
//! to the master's node and back (a large `all_gather`'s messages then around the ring of
//! workers, as across processes), and its collectives (`all_reduce`, `broadcast`, …, and
//! the fold among the workers of `Aggregation::Tree` and `Ring`) send their pieces to its
//! peers over connections between workers, with the network's latency, delays and
//! retransmissions; a worker that crashes breaks its peers' connections to it. The
//! simulator follows a compute until it waits or returns before it goes on, so one thread
//! runs at a time and a seed still replays one run.
//! Settings the runtime refuses (`JobConfig::validate`) fail the simulated job alike.
//!
//! The faults ([`Faults`]): a worker crashes during its compute (inside a collective,
//! when it makes one, while its peers wait for it) or right after its result left; the master's process crashes while it gathers, before its compute, or before,
//! during or after a checkpoint write; a message is delayed; a result is delivered twice,
//! or lost and retransmitted. Given as a schedule besides: a worker or the master crashes
//! during start-up, the master during the drain, or mid-write on storage that leaves the
//! checkpoint file torn (kept as the filesystem store keeps it — header, checksum, body —
//! and read back as it reads it, so a master started again skips the damaged file); the
//! network between the master and a worker is partitioned for a while (shorter than the
//! heartbeat timeout it only delays; longer, both ends hear silence and the worker is lost). A crashed worker is noticed after a heartbeat timeout; a
//! crashed master is restarted, and its workers reconnect with backoff and carry on in a
//! new attempt, so nothing of the old one is folded. Under
//! [`FailurePolicy::RestartAll`](crate::FailurePolicy::RestartAll) — and under `RestartWorker` in barrier mode, where a
//! replacement restarts every worker — every worker runs in the master's process, so they
//! die and start again with it; or, [`launched`](Simulation::launched) as
//! `superstep-launch` runs them, each rank in a process of its own (rank 0's in the
//! master's): each process replaces its own worker when the master's node restarts the
//! gang, or when its link reaches a master started again; a process's death takes its
//! peers' connections and the copies it kept with it (a peer may find the loss only once
//! its heartbeats stop, after the gang restarted), and the launcher starts it again while
//! its restarts last; a worker process that ends on its own failure while the job goes on
//! breaks an invariant (the master's node would have started it over). Under the other policies each worker
//! is a process of its own, as over TCP: its connection delivers in order, its loss is
//! noticed after everything it sent arrived, and under `RestartWorker` a launcher starts
//! a process that ended on a failure again, which joins in its rank's place.
//!
//! A simulation is built from the same [`JobBuilder`] the program runs
//! ([`Simulation::from_job`]: its master, workers, interceptors, combiner, coordinator,
//! input, checkpoint interval and settings) — the one way in, so that what is simulated is
//! the job that ships — and given its faults ([`Simulation::faults`],
//! [`Simulation::schedule`]).
//!
//! Faults are drawn from the seed with the probabilities of [`Faults`], or given as data
//! ([`Simulation::schedule`], a list of [`Fault`]s at given ranks, iterations and points):
//! a schedule is what a property test generates and shrinks (with the `proptest` feature,
//! `strategies` has the strategies), and a failing run's replay line runs its test again
//! with its seed — proptest runs the failing case it saved first
//! ([`SimRun::replay_command`], [`Simulation::try_check`]).
//!
//! ```
//! use superstep::checkpoint::MemoryCheckpointStore;
//! use superstep::prelude::*;
//! use superstep::sim::{Faults, Simulation};
//!
//! struct Rank1;
//! impl WorkerComputable for Rank1 {
//!     type MasterResult = u64;
//!     type WorkerResult = u64;
//!     fn compute(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
//!         Ok(ctx.last_master_result().copied().unwrap_or(0) + ctx.rank() as u64 + 1)
//!     }
//! }
//! struct Sum;
//! impl MasterComputable for Sum {
//!     type MasterResult = u64;
//!     type WorkerResult = u64;
//!     fn compute(&mut self, ctx: &mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> {
//!         Ok(Step::Continue(ctx.worker_results().iter().sum::<u64>() % 1_000_003))
//!     }
//! }
//!
//! /// How the program builds its job.
//! fn job() -> JobBuilder<u64, u64> {
//!     Job::builder(Sum, |_| Rank1).workers(3).iterations(8)
//! }
//!
//! let expected = Simulation::from_job(job).run(0).outcome.unwrap().result;
//! let faulty = Simulation::from_job(|| {
//!     job()
//!         .failure_policy(FailurePolicy::RestartWorker { max_restarts: 100 })
//!         .checkpoint(MemoryCheckpointStore::new(), 2)
//! })
//! .faults(Faults::crashes(0.1, 0.05));
//! faulty.check(0..50, |run| {
//!     let got = run.outcome.as_ref().map_err(|e| e.to_string())?;
//!     if *got.result != *expected {
//!         return Err(format!("{} instead of {expected}", got.result));
//!     }
//!     Ok(())
//! });
//! ```

#[cfg(feature = "proptest")]
pub mod strategies;

mod check;
mod faults;
mod store;
mod world;

use std::fmt;
use std::sync::Arc;

use crate::coordinator::{Coordinator, Input};
use crate::error::ConfigError;
use crate::ids::Iteration;
use crate::job::JobBuilder;
use crate::params::JobParams;
use crate::payload::Payload;
use crate::protocol::JobConfig;
use crate::runtime::{Combine, DynMaster, MasterHooks, WorkerFactory, WorkerHookFactory};

pub use check::{
    seeds_to_run, Checked, RunFailure, SimFailure, SimOutcome, SimRun, SimStats, SCHEDULE_VAR,
    SEEDS_VAR, SEED_VAR,
};
pub use faults::{CrashPoint, Fault, Faults};
use world::World;

/// A lock that a panic while it was held does not poison for the rest of the run.
fn lock<T>(task: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    task.lock().unwrap_or_else(|e| e.into_inner())
}

/// What one master's process is made of: the master's code, its interceptors, the job's
/// coordinator.
struct MasterMade<M, W> {
    master: DynMaster<M, W>,
    hooks: MasterHooks<M, W>,
    for_workers: Option<crate::runtime::ForWorkersFn<M>>,
    coordinator: Option<Box<dyn Coordinator>>,
}

type MasterFactory<M, W> = Arc<dyn Fn() -> MasterMade<M, W> + Send + Sync>;

/// A job to simulate, as the program builds it ([`Simulation::from_job`]), with the faults
/// to inject ([`faults`](Simulation::faults), [`schedule`](Simulation::schedule)).
pub struct Simulation<M, W> {
    /// Each master's process: the job built again, as a process started again builds it.
    master: MasterFactory<M, W>,
    workers: WorkerFactory<M, W>,
    combine: Option<Combine<M, W>>,
    worker_hooks: Vec<WorkerHookFactory<M, W>>,
    /// The job's input, sharded by each master's process as `run` shards it.
    input: Option<Input>,
    /// The program's own parameters (`JobBuilder::params`), or why they have no form.
    params: Result<JobParams, ConfigError>,
    /// The job's settings.
    job: Arc<JobConfig>,
    /// Every how many iterations the master saves a checkpoint (`JobBuilder::checkpoint`);
    /// to the simulator's store, which survives the master's crashes.
    checkpoint_every: Option<Iteration>,
    /// Whether the job's own checkpoint store outlives the master's host: the simulated
    /// store is then never lost with it.
    store_outlives_host: bool,
    /// The job's message type, when it has messages (`JobBuilder::messages`).
    messages: Option<&'static str>,
    /// Whether its workers run as `superstep-launch` starts them, and its restarts left
    /// (see [`launched`](Simulation::launched)).
    launched: Option<u32>,
    /// The most bytes of a piece between workers (see [`max_piece`](Simulation::max_piece)).
    max_piece: Option<usize>,
    faults: Faults,
    schedule: Vec<Fault>,
}

impl<M, W> Clone for Simulation<M, W> {
    fn clone(&self) -> Self {
        Simulation {
            master: Arc::clone(&self.master),
            workers: Arc::clone(&self.workers),
            combine: self.combine.clone(),
            worker_hooks: self.worker_hooks.clone(),
            input: self.input.clone(),
            params: self.params.clone(),
            job: Arc::clone(&self.job),
            checkpoint_every: self.checkpoint_every,
            store_outlives_host: self.store_outlives_host,
            messages: self.messages,
            launched: self.launched,
            max_piece: self.max_piece,
            faults: self.faults,
            schedule: self.schedule.clone(),
        }
    }
}

impl<M, W> fmt::Debug for Simulation<M, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Simulation")
            .field("job", &self.job)
            .field("checkpoint_every", &self.checkpoint_every)
            .field("faults", &self.faults)
            .field("schedule", &self.schedule)
            .finish_non_exhaustive()
    }
}

impl<M: Payload, W: Payload> Simulation<M, W> {
    /// A simulation of the job `make` builds — its master, workers, interceptors,
    /// combiner, coordinator, input, checkpoint interval and settings, as
    /// [`JobBuilder::run`] would run them — over the simulator's network, clock and
    /// checkpoint store (the builder's transport, store, events and cancel are not used),
    /// with no faults until [`faults`](Self::faults) or [`schedule`](Self::schedule) adds
    /// them. `make` is called again for each master's process, as a restarted process
    /// builds its job again; write it as the function your program builds its job with.
    ///
    /// ```
    /// use superstep::prelude::*;
    /// use superstep::sim::Simulation;
    ///
    /// struct Sum;
    /// impl MasterComputable for Sum {
    ///     type MasterResult = u64;
    ///     type WorkerResult = u64;
    ///     fn compute(&mut self, ctx: &mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> {
    ///         let last = ctx.last_master_result().copied().unwrap_or(0);
    ///         Ok(Step::Continue(last + ctx.worker_results().iter().sum::<u64>()))
    ///     }
    /// }
    /// struct One;
    /// impl WorkerComputable for One {
    ///     type MasterResult = u64;
    ///     type WorkerResult = u64;
    ///     fn compute(&mut self, _: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
    ///         Ok(1)
    ///     }
    /// }
    ///
    /// /// How the program builds its job.
    /// fn job() -> superstep::JobBuilder<u64, u64> {
    ///     Job::builder(Sum, |_| One).workers(4).iterations(5)
    /// }
    ///
    /// let run = Simulation::from_job(job).run(7);
    /// assert_eq!(*run.outcome.unwrap().result, 20);
    /// ```
    ///
    /// [`JobBuilder::run`]: crate::JobBuilder::run
    pub fn from_job(make: impl Fn() -> JobBuilder<M, W> + Send + Sync + 'static) -> Self {
        let first = make();
        let job = Arc::new(first.config.clone());
        let checkpoint_every = first.checkpoint.as_ref().map(|c| c.every);
        let store_outlives_host = first
            .checkpoint
            .as_ref()
            .is_some_and(|c| c.store.outlives_host());
        let (workers, combine, worker_hooks) = (
            Arc::clone(&first.workers),
            first.combine.clone(),
            first.worker_hooks.clone(),
        );
        let input = first.input.clone();
        let params = first.params.clone();
        let messages = first.messages;
        Simulation {
            master: Arc::new(move || {
                let built = make();
                MasterMade {
                    master: built.master,
                    hooks: built.master_hooks,
                    for_workers: built.for_workers,
                    coordinator: built.coordinator,
                }
            }),
            workers,
            combine,
            worker_hooks,
            input,
            params,
            job,
            checkpoint_every,
            store_outlives_host,
            messages,
            launched: None,
            max_piece: None,
            faults: Faults::none(),
            schedule: Vec::new(),
        }
    }

    /// Carries at most `bytes` in one piece between workers, as TCP carries at most a
    /// frame (`TcpSettings::max_frame`, less a frame's head): a superstep's batch of
    /// messages larger travels in several rounds of the exchange, with the faults drawn
    /// between them too; a piece of another collective larger fails its call
    /// ([`SyncError::TooLarge`](crate::SyncError::TooLarge)). No limit by default. A
    /// piece of messages has an 11-byte head, so a limit below a message and its head
    /// refuses every piece.
    pub fn max_piece(mut self, bytes: usize) -> Self {
        self.max_piece = Some(bytes);
        self
    }

    /// The faults to draw from each run's seed.
    pub fn faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    /// Faults at given points of the run, besides those drawn: a schedule a property test
    /// can generate and shrink (see [`Fault`]).
    pub fn schedule(mut self, schedule: Vec<Fault>) -> Self {
        self.schedule = schedule;
        self
    }

    /// Runs the job as `superstep-launch --restarts <restarts>` does: every rank in a
    /// process of its own, on a host of its own, rank 0's beside the master's node — also
    /// under a policy whose failures restart every worker
    /// ([`FailurePolicy::RestartAll`](crate::FailurePolicy::RestartAll), and
    /// `RestartWorker` in barrier mode), which otherwise runs every worker in the master's
    /// process. Then each process replaces its own worker when the master's node restarts
    /// the gang; a process that dies (a crash, or its worker ending on a failure) is
    /// started again by the launcher, joining in the attempt the master runs, while
    /// `restarts` last (the master's own restarts count, as the launcher counts them; a
    /// master's process that dies with none left ends the run with the master lost); the
    /// master's process takes rank 0's worker down with it, and the others' links reach
    /// the master started again, which starts them over. Under the other policies every
    /// worker is a process of its own already (rank 0's too): this adds the launcher's
    /// count. The launcher does not start again a process that ended well, so a master
    /// that dies once its workers ended waits for them in vain unless its newest
    /// checkpoint holds the job's end.
    pub fn launched(mut self, restarts: u32) -> Self {
        self.launched = Some(restarts);
        self
    }

    /// The job's settings, as the simulated runs use them (from its builder).
    pub fn settings(&self) -> &JobConfig {
        &self.job
    }

    /// What the job is as its checkpoints record it: its world size, input and
    /// parameters, as the runtime's `Plan::shape` says it.
    pub(crate) fn shape(&self) -> crate::checkpoint::JobShape {
        crate::checkpoint::JobShape::new(self.job.workers, self.input.as_ref())
            .with_params(self.params.clone().unwrap_or_default())
    }

    /// The settings the master's node runs by, checked and settled as a run settles them:
    /// the workers are processes of their own connected to each other, as over TCP — but
    /// under `RestartAll` (and `RestartWorker` in barrier mode), where they run in the
    /// master's process.
    pub(crate) fn node_config(&self) -> Result<crate::protocol::NodeConfig, ConfigError> {
        self.job.validate()?;
        crate::protocol::NodeConfig::new(Arc::clone(&self.job), &self.deployment())
    }

    /// Where the job runs, as the simulator models it: its workers processes of their own
    /// connected to each other, as over TCP — but under `RestartAll` (and `RestartWorker`
    /// in barrier mode), where they run in the master's process unless
    /// [`launched`](Self::launched); the job's own store's
    /// place (an object store outlives the master's host; another is lost with it).
    pub(crate) fn deployment(&self) -> crate::protocol::Deployment {
        let gang = crate::protocol::restarts_all(self.job.failure_policy, self.job.barrier_mode);
        let workers = if gang && self.launched.is_none() {
            crate::protocol::Workers::Together
        } else {
            crate::protocol::Workers::Connected
        };
        crate::protocol::Deployment {
            checkpoint_every: self.checkpoint_every,
            store_outlives_host: self.store_outlives_host,
            combining: crate::runtime::combining(self.combine.as_ref()),
            workers,
        }
    }

    /// Runs the job once with `seed`.
    pub fn run(&self, seed: u64) -> SimRun<M> {
        let mut run = World::new(self, seed).run();
        run.seed = seed;
        run
    }
}
