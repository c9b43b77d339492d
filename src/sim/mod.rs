//! A deterministic simulator: a job's master and workers — your computables and the
//! [`protocol`](crate::protocol) state machines that the runtime drives — run in one
//! thread on a virtual clock, with message order and faults drawn from a seed.
//!
//! Same seed, same run: the same messages in the same order, the same faults at the same
//! points, the same trace. A property test runs many seeds and, when one fails, prints it
//! with the command that replays it (see [`Simulation::check`]).
//!
//! The simulator drives the master's node the runtime ships — the same state machine
//! (`protocol::MasterNode`: the gate, the sync state, the recovery under the
//! [`FailurePolicy`], the schedule, the drain) and the same runner of the master's code,
//! interceptors and checkpoints — built the way the runtime builds it, from the settings
//! and the newest checkpoint. The simulator only delivers messages, advances the clock and
//! injects faults: what a round, a recovery or the end of a job means is decided in the
//! node. Each worker is driven by the runtime's worker node (`protocol::WorkerNode`): it
//! acts on each master message once, in increasing order, skipping ahead when it is late,
//! waits for the job's first failure when it failed on its own, and says it is done when
//! it stops — its start-up, computes and timers taking virtual time. Every result crosses the wire encoding on its way, as between
//! processes. In barrier mode each worker's compute runs on a thread of its own, as in
//! the runtime, and its `barrier()` and `all_gather()` calls travel the simulated network
//! to the master's node and back; the simulator waits for a compute to call or return
//! before it goes on, so one thread runs at a time and a seed still replays one run.
//! Settings the runtime refuses (`JobConfig::validate`) fail the simulated job alike.
//!
//! The faults ([`Faults`]): a worker crashes during its compute or right after its result
//! left; the master's process crashes while it gathers, before its compute, or before,
//! during or after a checkpoint write; a message is delayed; a result is delivered twice,
//! or lost and retransmitted. Given as a schedule besides: a worker or the master crashes
//! during start-up, the master during the drain, or mid-write on storage that leaves the
//! checkpoint file torn (kept as the filesystem store keeps it — header, checksum, body —
//! and read back as it reads it, so a master started again skips the damaged file); the
//! network between the master and a worker is partitioned for a while (shorter than the
//! heartbeat timeout it only delays; longer, both ends hear silence and the worker is lost). A crashed worker is noticed after a heartbeat timeout; a
//! crashed master is restarted, and its workers reconnect with backoff and carry on in a
//! new attempt, so nothing of the old one is folded. Under
//! [`FailurePolicy::RestartAll`] every worker runs in the master's process (as the runtime
//! requires), so they die and start again with it. Under the other policies each worker
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
//! `strategies` has the strategies), and a failing run's replay line carries it
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

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::ops::Range;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::checkpoint::{Checkpoint, CheckpointError, CheckpointStore, Loaded};
use crate::compute::JobEnd;
use crate::config::JobConfig;
use crate::coordinator::{Coordinator, Input, JobInfo, Shard};
use crate::error::JobError;
use crate::ids::{Attempt, Iteration, Rank};
use crate::payload::Payload;
use crate::protocol::{
    Action, Drops, Envelope, FailurePolicy, MasterDone, MasterNode, MasterRound, MasterWork,
    NodeSettings, Reach, Report, ToMaster, ToWorker, Work, Worked, WorkerAction, WorkerNode,
};
use crate::protocol::{NodeConfig, Unsent, WorkerConfig};
use crate::runtime::coordination::Coordination;
use crate::runtime::master::MasterTask;
use crate::runtime::sync_calls::SyncAnswers;
use crate::runtime::worker_task::WorkerTask;
use crate::runtime::{
    CombineFn, DynMaster, MasterHooks, MasterParts, OwnedEnding, WorkerFactory, WorkerHookFactory,
};
use crate::transport::{TransportError, WorkerLink};
use crate::JobBuilder;

/// The variable that replays one seed: `SUPERSTEP_SIM_SEED=<seed> cargo test <test>`.
pub const SEED_VAR: &str = "SUPERSTEP_SIM_SEED";
/// The variable that sets how many seeds [`Simulation::check`] runs, for long runs.
pub const SEEDS_VAR: &str = "SUPERSTEP_SIM_SEEDS";
/// The variable that replays a fault schedule (JSON, as a failure prints it) in place of
/// the one [`Simulation::check`] would run.
pub const SCHEDULE_VAR: &str = "SUPERSTEP_SIM_SCHEDULE";

/// One fault at a point of a simulated run, given as data: a schedule of them
/// ([`Simulation::schedule`]) is what a property test generates, and what it shrinks to a
/// minimal failing one. Each fires once, the first time the run reaches its point (an
/// iteration redone after a recovery does not crash again).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum Fault {
    /// The worker of `rank` crashes in `iteration`: during its compute, or right after its
    /// result left (the result is then in flight). In iteration 0: during its start-up,
    /// before it registers.
    WorkerCrash {
        /// Its rank.
        rank: Rank,
        /// The iteration.
        iteration: Iteration,
        /// Whether it crashes after its result left, rather than during its compute.
        after_result: bool,
    },
    /// The worker of `rank` computes `iteration` twenty times as long (a straggler).
    Slow {
        /// Its rank.
        rank: Rank,
        /// The iteration.
        iteration: Iteration,
    },
    /// The result of `rank` for `iteration` is delivered twice.
    Duplicate {
        /// Its rank.
        rank: Rank,
        /// The iteration.
        iteration: Iteration,
    },
    /// The result of `rank` for `iteration` is lost on the way and retransmitted later.
    Drop {
        /// Its rank.
        rank: Rank,
        /// The iteration.
        iteration: Iteration,
    },
    /// The result of `rank` for `iteration` is delayed by `millis` beyond the usual
    /// latency.
    Delay {
        /// Its rank.
        rank: Rank,
        /// The iteration.
        iteration: Iteration,
        /// The extra delay, in milliseconds of virtual time.
        millis: u64,
    },
    /// The master's process crashes in `iteration`, at `point`. In iteration 0: during
    /// start-up, while its workers register (whatever the point).
    MasterCrash {
        /// The iteration.
        iteration: Iteration,
        /// Where in it.
        point: CrashPoint,
    },
    /// The master's process crashes once it told its workers how the job ended, before
    /// any of them said it stopped: during the drain.
    MasterCrashInDrain,
    /// The network between the master and the worker of `rank` is cut for `millis` of
    /// virtual time, from when the master begins `iteration`. Shorter than the heartbeat
    /// timeout (30 ms here), nothing is lost: every message sent across it arrives once it
    /// heals, in order. Longer, both ends hear silence: the master's node loses the worker
    /// (as over TCP, after the heartbeat timeout), whose process ends on the master's
    /// loss; what either sent meanwhile is lost. Under `RestartWorker` its launcher starts
    /// it again once the network heals; a process of the rank started during the cut (in
    /// the place of one that crashed) connects once it heals, and what it sent meanwhile
    /// goes then. (Not under `RestartAll`: its workers share the master's process.)
    Partition {
        /// The rank cut off.
        rank: Rank,
        /// The iteration it begins in.
        iteration: Iteration,
        /// How long it lasts, in milliseconds of virtual time.
        millis: u64,
    },
}

/// Where in an iteration the master's process crashes ([`Fault::MasterCrash`]).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum CrashPoint {
    /// While it gathers the workers' results.
    Gathering,
    /// Once the results are in, before its compute.
    BeforeCompute,
    /// After its compute, before its checkpoint write.
    BeforeCheckpoint,
    /// During its checkpoint write (which is then lost: the one before stays).
    DuringCheckpoint,
    /// After its checkpoint write.
    AfterCheckpoint,
    /// During its checkpoint write, on storage that keeps what was written (no atomic
    /// rename, say): the torn file stays as the newest, and the master started again must
    /// find it damaged and resume from the one before.
    TornCheckpoint,
}

/// Which faults a simulated run draws, and how often. Every probability is in `[0, 1]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Faults {
    /// That a worker crashes in an iteration it computes: during its compute, or right
    /// after its result left (the result is then in flight).
    pub worker_crash: f64,
    /// That the master's process crashes in an iteration: while it gathers results, or
    /// once they are in — before its compute, or before, during or after its checkpoint
    /// write.
    pub master_crash: f64,
    /// That a message is delayed by up to [`max_delay`](Faults::max_delay) beyond the
    /// usual latency, so messages overtake each other.
    pub delay: f64,
    /// That a worker's result is delivered twice.
    pub duplicate: f64,
    /// That a worker's result is lost on the way and retransmitted later.
    pub drop: f64,
    /// That a worker's compute takes twenty times as long (a straggler).
    pub slow: f64,
    /// The most crashes of each kind (workers, master) in one run.
    pub max_crashes: u32,
    /// The longest extra delay of a delayed message.
    pub max_delay: Duration,
}

impl Default for Faults {
    /// No faults.
    fn default() -> Self {
        Faults {
            worker_crash: 0.0,
            master_crash: 0.0,
            delay: 0.0,
            duplicate: 0.0,
            drop: 0.0,
            slow: 0.0,
            max_crashes: 3,
            max_delay: Duration::from_millis(20),
        }
    }
}

impl Faults {
    /// No faults.
    pub fn none() -> Self {
        Faults::default()
    }

    /// Crashes only: of a worker, and of the master, with these probabilities per
    /// iteration.
    pub fn crashes(worker: f64, master: f64) -> Self {
        Faults {
            worker_crash: worker,
            master_crash: master,
            ..Faults::default()
        }
    }

    /// Network faults only: delays, duplicates and drops, each with this probability.
    pub fn network(p: f64) -> Self {
        Faults {
            delay: p,
            duplicate: p,
            drop: p,
            ..Faults::default()
        }
    }

    /// Every fault, each with this probability.
    pub fn all(p: f64) -> Self {
        Faults {
            worker_crash: p,
            master_crash: p,
            slow: p,
            ..Faults::network(p)
        }
    }
}

/// How a simulated job ended, when it completed.
#[derive(Debug, Clone, PartialEq)]
pub struct SimOutcome<M> {
    /// The final master result.
    pub result: Arc<M>,
    /// How many iterations ran.
    pub iterations: Iteration,
    /// Whether it halted before its iteration count.
    pub halted: bool,
}

/// What happened in a simulated run, counted.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct SimStats {
    /// Workers that crashed.
    pub worker_crashes: u32,
    /// Times the master's process crashed.
    pub master_crashes: u32,
    /// Workers replaced (`FailurePolicy::RestartWorker`).
    pub worker_restarts: u32,
    /// Attempts started after the first (gang restarts and restarted masters).
    pub new_attempts: u32,
    /// Ranks the job went on without for good.
    pub lost: Vec<Rank>,
    /// Rounds that completed without some ranks (stragglers or lost workers).
    pub partial_rounds: u32,
    /// Checkpoints saved.
    pub checkpoints: u32,
    /// Damaged checkpoints a master started again skipped, resuming from an older one.
    pub skipped_checkpoints: u32,
    /// Iterations computed by the master, over every attempt (redone ones included).
    pub rounds: u32,
    /// Arrivals the master's gates dropped (stale, duplicate).
    pub drops: Drops,
    /// Messages delivered.
    pub messages: u64,
}

/// One simulated run: its seed, how it ended, what happened, and any invariant it broke.
#[derive(Debug)]
pub struct SimRun<M> {
    /// The seed it ran with.
    pub seed: u64,
    /// How the job ended.
    pub outcome: Result<SimOutcome<M>, JobError>,
    /// What happened, counted.
    pub stats: SimStats,
    /// Every step, one line each, with its virtual time.
    pub trace: Vec<String>,
    /// The invariants of the protocol this run broke; empty when it held them all: a
    /// result folded is of the round's attempt and iteration, one per rank; no round
    /// completes without its quorum; the run ends.
    pub violations: Vec<String>,
    /// The fault schedule it ran with ([`Simulation::schedule`]).
    pub schedule: Vec<Fault>,
}

impl<M> SimRun<M> {
    /// The command that replays this run in the current test.
    /// The command that replays this run in the current test: its seed, and its fault
    /// schedule when it has one — the whole case, on one line.
    pub fn replay_command(&self) -> String {
        let test = std::thread::current()
            .name()
            .filter(|n| *n != "main")
            .map(|n| format!(" {n} -- --exact"))
            .unwrap_or_default();
        let schedule = if self.schedule.is_empty() {
            String::new()
        } else {
            let json = serde_json::to_string(&self.schedule).unwrap_or_default();
            format!(" {SCHEDULE_VAR}='{json}'")
        };
        format!("{SEED_VAR}={}{schedule} cargo test{test}", self.seed)
    }
}

/// What one master's process is made of: the master's code, its interceptors, the job's
/// coordinator.
struct MasterMade<M, W> {
    master: DynMaster<M, W>,
    hooks: MasterHooks<M, W>,
    coordinator: Option<Box<dyn Coordinator>>,
}

type MasterFactory<M, W> = Arc<dyn Fn() -> MasterMade<M, W> + Send + Sync>;

/// A job to simulate, as the program builds it ([`Simulation::from_job`]), with the faults
/// to inject ([`faults`](Simulation::faults), [`schedule`](Simulation::schedule)).
pub struct Simulation<M, W> {
    /// Each master's process: the job built again, as a process started again builds it.
    master: MasterFactory<M, W>,
    workers: WorkerFactory<M, W>,
    combine: Option<CombineFn<W>>,
    worker_hooks: Vec<WorkerHookFactory<M, W>>,
    /// The job's input, sharded by each master's process as `run` shards it.
    input: Option<Input>,
    /// The job's settings.
    job: Arc<JobConfig>,
    /// Every how many iterations the master saves a checkpoint (`JobBuilder::checkpoint`);
    /// to the simulator's store, which survives the master's crashes.
    checkpoint_every: Option<Iteration>,
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
            job: Arc::clone(&self.job),
            checkpoint_every: self.checkpoint_every,
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
        let (workers, combine, worker_hooks) = (
            Arc::clone(&first.workers),
            first.combine.clone(),
            first.worker_hooks.clone(),
        );
        let input = first.input.clone();
        Simulation {
            master: Arc::new(move || {
                let built = make();
                MasterMade {
                    master: built.master,
                    hooks: built.master_hooks,
                    coordinator: built.coordinator,
                }
            }),
            workers,
            combine,
            worker_hooks,
            input,
            job,
            checkpoint_every,
            faults: Faults::none(),
            schedule: Vec::new(),
        }
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

    /// The job's settings, as the simulated runs use them (from its builder).
    pub fn settings(&self) -> &JobConfig {
        &self.job
    }

    /// Runs the job once with `seed`.
    pub fn run(&self, seed: u64) -> SimRun<M> {
        let mut run = World::new(self, seed).run();
        run.seed = seed;
        run
    }

    /// Runs `seeds` (or only the seed in `SUPERSTEP_SIM_SEED`, or `0..SUPERSTEP_SIM_SEEDS`
    /// when set) and checks each run: it must break no invariant, and `property` must
    /// hold for it. On the first failure, panics with the seed, the end of its trace and
    /// the command that replays it.
    pub fn check(&self, seeds: Range<u64>, property: impl Fn(&SimRun<M>) -> Result<(), String>) {
        if let Err(failure) = self.try_check(seeds, property) {
            panic!("{failure}");
        }
    }

    /// Like [`check`](Simulation::check), but returns the first failure instead of
    /// panicking — for use inside `proptest!`, say, whose shrinking then looks for a
    /// smaller case.
    pub fn try_check(
        &self,
        seeds: Range<u64>,
        property: impl Fn(&SimRun<M>) -> Result<(), String>,
    ) -> Result<(), Box<SimFailure>> {
        let replayed;
        let sim = match schedule_to_replay() {
            Some(schedule) => {
                replayed = self.clone().schedule(schedule);
                &replayed
            }
            None => self,
        };
        for seed in seeds_to_run(seeds) {
            let run = sim.run(seed);
            let failure = if !run.violations.is_empty() {
                Some(format!("broke invariants: {}", run.violations.join("; ")))
            } else {
                property(&run).err()
            };
            if let Some(failure) = failure {
                let tail = run.trace.len().saturating_sub(40);
                return Err(Box::new(SimFailure {
                    seed,
                    failure,
                    stats: run.stats.clone(),
                    last_steps: run.trace[tail..].to_vec(),
                    replay: run.replay_command(),
                }));
            }
        }
        Ok(())
    }
}

/// A simulated run that broke an invariant or the property checked: its seed, what went
/// wrong, the end of its trace and the command that replays it. Its `Display` says all of
/// it.
#[derive(Debug, Clone)]
pub struct SimFailure {
    /// The seed of the run.
    pub seed: u64,
    /// What went wrong.
    pub failure: String,
    /// What happened in the run, counted.
    pub stats: SimStats,
    /// The last steps of its trace.
    pub last_steps: Vec<String>,
    /// The command that replays it.
    pub replay: String,
}

impl fmt::Display for SimFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "simulation seed {} failed: {}\nstats: {:?}\nlast steps:\n  {}\nreplay: {}",
            self.seed,
            self.failure,
            self.stats,
            self.last_steps.join("\n  "),
            self.replay
        )
    }
}

impl std::error::Error for SimFailure {}

/// The schedule in `SUPERSTEP_SIM_SCHEDULE`, if set (and readable: an unreadable one is
/// said, and ignored).
fn schedule_to_replay() -> Option<Vec<Fault>> {
    let text = std::env::var(SCHEDULE_VAR).ok()?;
    match serde_json::from_str(&text) {
        Ok(schedule) => Some(schedule),
        Err(e) => {
            eprintln!("{SCHEDULE_VAR} is not a fault schedule ({e}); running the test's own");
            None
        }
    }
}

/// The seeds to run: the one in `SUPERSTEP_SIM_SEED`, else `0..SUPERSTEP_SIM_SEEDS`, else
/// `default`.
pub fn seeds_to_run(default: Range<u64>) -> Range<u64> {
    let var = |name| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    if let Some(seed) = var(SEED_VAR) {
        return seed..seed + 1;
    }
    match var(SEEDS_VAR) {
        Some(n) => default.start..default.start + n,
        None => default,
    }
}

/// `msg` as the receiving side of a wire gets it: encoded and decoded (every message, as
/// between processes: a type that breaks over TCP breaks here); the error is the one a TCP
/// peer would report.
fn wire_copy<T: Payload>(msg: T, direction: impl FnOnce() -> String) -> Result<T, JobError> {
    crate::codec::through_wire(msg, direction).map_err(|u| u.sent_by("the simulated network"))
}

/// A node's connection generation: a message sent over a connection that has since died
/// is lost with it.
type Generation = u32;

enum Event<M, W> {
    /// The start-up of a worker's code returned (its `init` took its time).
    WorkerStarted {
        rank: Rank,
        generation: Generation,
        worked: Worked<W>,
    },
    /// The deadline `at` of the worker node of `rank` passed.
    WorkerTimer {
        rank: Rank,
        generation: Generation,
        at: Instant,
    },
    ToMaster {
        generation: Generation,
        from: Rank,
        msg: ToMaster<W>,
    },
    ToWorker {
        rank: Rank,
        generation: Generation,
        msg: ToWorker<M>,
    },
    Computed {
        rank: Rank,
        generation: Generation,
        worked: Worked<W>,
        then_crash: bool,
    },
    WorkerCrash {
        rank: Rank,
        generation: Generation,
    },
    Noticed {
        rank: Rank,
        generation: Generation,
        master: Generation,
    },
    Timer {
        master: Generation,
        at: Instant,
    },
    MasterCrash {
        master: Generation,
    },
    /// A cut of the network has lasted the heartbeat timeout: both ends hear silence.
    Silence {
        rank: Rank,
        generation: Generation,
        master: Generation,
    },
    /// The master's process of `master` crashes, whatever it is doing.
    MasterCrashNow {
        master: Generation,
        when: &'static str,
    },
    MasterRestart,
    Reconnect {
        rank: Rank,
        generation: Generation,
    },
    /// The launcher starts a new process of `rank` in the place of `generation`, which
    /// ended.
    Relaunch {
        rank: Rank,
        generation: Generation,
    },
}

/// A worker's process.
struct Node<M, W> {
    generation: Generation,
    /// The master's generation it is connected to.
    master: Generation,
    alive: bool,
    /// The worker's node, as the runtime's worker actor drives it: every decision about
    /// the worker's lifecycle is its.
    worker: WorkerNode<M, W>,
    /// The worker's code, interceptors and context, as the runtime runs them (locked by
    /// the compute's own thread in barrier mode, while the simulator waits for it).
    task: Arc<Mutex<WorkerTask<M, W>>>,
    /// The job's failure as its process hears of it.
    end: JobEnd,
    /// In barrier mode: the ends of its sync calls.
    sync: Option<SimSync<W>>,
    /// In barrier mode: the compute under way on its own thread, parked in a sync call.
    parked: Option<Computing>,
    /// Whether it reported a failed ending: its process then ends (and may be started
    /// again by its launcher).
    failed: bool,
    /// Its node said it is done: it does nothing more.
    stopped: bool,
    /// It crashes right after its next result left.
    crash_after_send: bool,
    /// The deadline of its node its timer is set for.
    timer: Option<Instant>,
}

fn lock<T>(task: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    task.lock().unwrap_or_else(|e| e.into_inner())
}

/// A compute of barrier mode, on a thread of its own, says what it did: it made a sync
/// call (and waits for its answer), or it returned.
enum FromCompute<W> {
    Call(ToMaster<W>),
    Returned(Worked<W>),
}

/// A worker's sync calls, as its transport would carry them: to the simulator.
struct CallLink<W>(mpsc::Sender<FromCompute<W>>);

impl<W: Payload> WorkerLink<W> for CallLink<W> {
    fn send(&self, msg: ToMaster<W>) -> Result<(), TransportError> {
        self.0
            .send(FromCompute::Call(msg))
            .map_err(|_| TransportError::Closed)
    }
}

/// A worker's end of barrier mode in the simulator.
struct SimSync<W> {
    /// What its compute's thread says.
    from: mpsc::Receiver<FromCompute<W>>,
    to_sim: mpsc::Sender<FromCompute<W>>,
    /// Where the answers to its calls go (as the runtime's worker hands them over).
    answers: SyncAnswers,
    /// The thread of the compute under way, joined once it returned.
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How long (in real time) the simulator waits for a compute of barrier mode to call or
/// return before it gives up on it as hung.
const COMPUTE_PATIENCE: Duration = Duration::from_secs(60);

impl<W> SimSync<W> {
    /// What the compute's thread does next: a call, or its return (its thread then
    /// joined); `None` when it does neither within [`COMPUTE_PATIENCE`].
    fn next(&mut self) -> Option<FromCompute<W>> {
        let next = self.from.recv_timeout(COMPUTE_PATIENCE).ok()?;
        if let FromCompute::Returned(_) = next {
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
        Some(next)
    }
}

/// A compute under way: its iteration and the faults drawn for it.
#[derive(Debug, Clone, Copy)]
struct Computing {
    took: Duration,
    crash: bool,
    during: bool,
}

/// The master's process: the node the runtime drives, and the master's code as the
/// runtime runs it.
struct MasterProcess<M: Payload, W: Payload> {
    node: MasterNode<M, W>,
    task: Option<Box<MasterTask<M, W>>>,
    /// The job's coordinator, in the master's process.
    coordination: Option<Coordination>,
    timer: Option<Instant>,
    /// The job's failure as the master's process hears of it.
    end: JobEnd,
}

/// Where the master's process crashes around a checkpoint write, if it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteCrash {
    Before,
    During,
    /// During, leaving the file torn.
    Torn,
    After,
}

/// The checkpoint store of the simulated master: shared by every master process of the run,
/// and able to crash its process around a write. It keeps each checkpoint as its file
/// holds it (`checkpoint::encode`: header, checksum, body) and reads them back as the
/// filesystem store does, skipping damaged ones.
#[derive(Clone, Default)]
struct SimStore {
    /// By iteration: the bytes of each checkpoint's file.
    files: Arc<Mutex<Files>>,
    plan: Arc<Mutex<(Option<WriteCrash>, bool)>>,
    /// How many damaged checkpoints reads skipped.
    skipped: Arc<Mutex<u32>>,
}

/// Checkpoint files by iteration.
type Files = std::collections::BTreeMap<Iteration, Vec<u8>>;

impl SimStore {
    fn write(&self, iteration: Iteration, bytes: Vec<u8>) {
        lock(&self.files).insert(iteration, bytes);
    }
}

impl CheckpointStore for SimStore {
    fn save(&mut self, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        let bytes = crate::checkpoint::encode(checkpoint)?;
        let mut plan = lock(&self.plan);
        let crashed = || {
            Err(CheckpointError::io(
                "sim",
                std::io::Error::other("the process crashed"),
            ))
        };
        match plan.0.take() {
            // The process dies before the write is whole: the one before stays.
            Some(WriteCrash::Before | WriteCrash::During) => {
                plan.1 = true;
                crashed()
            }
            // It dies mid-write, and the storage keeps what was written.
            Some(WriteCrash::Torn) => {
                plan.1 = true;
                self.write(checkpoint.iteration, bytes[..bytes.len() / 2].to_vec());
                crashed()
            }
            Some(WriteCrash::After) => {
                plan.1 = true;
                self.write(checkpoint.iteration, bytes);
                Ok(())
            }
            None => {
                self.write(checkpoint.iteration, bytes);
                Ok(())
            }
        }
    }

    fn latest(&mut self) -> Result<Option<Loaded>, CheckpointError> {
        // Each file read as it is reached, newest first, as on disk.
        let files = lock(&self.files);
        let newest_first = files.iter().rev().map(|(iteration, bytes)| {
            let path = std::path::PathBuf::from(format!("sim/checkpoint-{iteration}"));
            (path, Ok(bytes.clone()))
        });
        let loaded = crate::checkpoint::newest_readable(newest_first);
        drop(files);
        *lock(&self.skipped) += loaded.as_ref().map_or(0, |l| l.skipped.len() as u32);
        Ok(loaded)
    }
}

/// A direction of a rank's connection.
#[derive(Debug, Clone, Copy)]
enum Way {
    ToMaster,
    ToWorker,
}

/// Which ranks the simulated network connects to the current master.
struct SimReach(Vec<bool>);

impl Reach for SimReach {
    fn is_connected(&self, rank: Rank) -> bool {
        self.0.get(rank).copied().unwrap_or(false)
    }
    fn may_reach(&self, rank: Rank) -> bool {
        self.is_connected(rank)
    }
    fn refusals(&self, _: &[Rank]) -> Vec<String> {
        Vec::new()
    }
}

struct World<'s, M: Payload, W: Payload> {
    sim: &'s Simulation<M, W>,
    job: Arc<JobConfig>,
    /// The settings the nodes run by, as the runtime builds them from the job's.
    node_config: Arc<NodeConfig>,
    worker_config: Arc<WorkerConfig>,
    rng: ChaCha8Rng,
    base: Instant,
    now: Duration,
    seq: u64,
    queue: BinaryHeap<Reverse<(Duration, u64)>>,
    events: std::collections::HashMap<u64, Event<M, W>>,
    /// The master's process; `None` while it is down.
    master: Option<MasterProcess<M, W>>,
    /// The master's process generation: messages to an earlier one are lost.
    master_generation: Generation,
    nodes: Vec<Node<M, W>>,
    store: SimStore,
    job_id: Arc<str>,
    worker_crashes: u32,
    outcome: Option<Result<SimOutcome<M>, JobError>>,
    stats: SimStats,
    trace: Vec<String>,
    violations: Vec<String>,
    /// Per rank: the (attempt, iteration) of each result it sent.
    sent: Vec<Vec<(Attempt, Iteration)>>,
    /// The scheduled faults that have not fired yet.
    pending: Vec<Fault>,
    /// Per rank: when the last message on its connection arrives, to the master and to
    /// the worker (connections deliver in order).
    arrivals: Vec<(Duration, Duration)>,
    /// Per rank: the cut of the network between it and the master, if any: from when
    /// until when, and the generation of the rank's process whose connection it cut.
    cuts: Vec<Option<(Duration, Duration, Generation)>>,
    /// Each rank's shard of the job's input, as the master's process sharded it.
    shards: Option<Arc<Vec<Shard>>>,
}

const LATENCY_US: Range<u64> = 50..500;
const HEARTBEAT_TIMEOUT: Duration = Duration::from_millis(30);
const RETRANSMIT: Duration = Duration::from_millis(25);
const MAX_EVENTS: u64 = 2_000_000;

impl<'s, M: Payload, W: Payload> World<'s, M, W> {
    fn new(sim: &'s Simulation<M, W>, seed: u64) -> Self {
        let job = Arc::clone(&sim.job);
        let job_id: Arc<str> = Arc::from(job.job_id.as_str());
        let node_config = Arc::new(job.node_config(sim.checkpoint_every));
        let workers = job.workers;
        let worker_config = Arc::new(WorkerConfig {
            // A call waits as long as it takes: the simulator answers it, or ends it, in
            // virtual time; a real-time limit would make a run depend on the machine.
            sync_patience: Duration::MAX,
            ..job.worker_config()
        });
        let mut world = World {
            sim,
            job,
            node_config,
            worker_config,
            rng: ChaCha8Rng::seed_from_u64(seed),
            base: Instant::now(),
            now: Duration::ZERO,
            seq: 0,
            queue: BinaryHeap::new(),
            events: std::collections::HashMap::new(),
            master: None,
            master_generation: 0,
            nodes: Vec::new(),
            store: SimStore::default(),
            job_id,
            worker_crashes: 0,
            outcome: None,
            stats: SimStats::default(),
            trace: Vec::new(),
            violations: Vec::new(),
            sent: vec![Vec::new(); workers],
            pending: sim.schedule.clone(),
            arrivals: vec![(Duration::ZERO, Duration::ZERO); workers],
            cuts: vec![None; workers],
            shards: None,
        };
        let checkpoints = sim
            .checkpoint_every
            .map_or(Ok(()), crate::job::check_checkpoint_every);
        if let Err(error) = world.job.validate().and(checkpoints) {
            // Settings the runtime refuses fail the simulated job too.
            world.outcome = Some(Err(error.into()));
            return world;
        }
        world.start_master(0);
        let in_startup = world
            .scheduled(|f| matches!(f, Fault::MasterCrash { iteration: 0, .. }))
            .is_some();
        if in_startup {
            // Before any worker can have registered (a start-up takes 500 µs at least).
            let at = Duration::from_micros(world.rng.random_range(0..400));
            let when = "during start-up, while its workers register";
            world.at(at, Event::MasterCrashNow { master: 0, when });
        }
        for rank in 0..workers {
            let node = world.spawn(rank, 0, 0);
            world.nodes.push(node);
            world.start_worker(rank);
        }
        world.drive();
        world
    }

    /// Starts the master's process, as the runtime does: the newest checkpoint read, the
    /// attempt chosen, the master's code and node built from them. `restarted`: how many
    /// processes died before this one.
    fn start_master(&mut self, restarted: u32) {
        let mut store = self.store.clone();
        let resumed = match crate::runtime::resume::<M>(&mut store, &self.job_id) {
            Ok(resumed) => resumed,
            Err(error) => {
                self.log(|| format!("the master cannot resume: {error}"));
                self.outcome = Some(Err(error));
                return;
            }
        };
        let skipped = std::mem::take(&mut *lock(&self.store.skipped));
        if skipped > 0 {
            self.stats.skipped_checkpoints += skipped;
            self.log(|| format!("the master skips {skipped} damaged checkpoint(s)"));
        }
        let attempt =
            crate::protocol::start_attempt(restarted, resumed.as_ref().map(|r| r.attempt));
        if let Some(r) = &resumed {
            let iteration = r.iteration;
            self.log(|| format!("the master resumes from the checkpoint of iteration {iteration}"));
        }
        let mut made = (self.sim.master)();
        // Sharded as every process shards, with the coordinator that then starts.
        let shards = crate::runtime::coordination::shards(
            made.coordinator.as_mut(),
            self.sim.input.as_ref(),
            self.job.workers,
        );
        match shards {
            Ok(shards) => self.shards = shards.map(Arc::new),
            Err(error) => {
                self.log(|| format!("the input cannot be sharded: {error}"));
                self.outcome = Some(Err(error));
                return;
            }
        }
        // The coordinator starts before anything else of the process, as in the runtime.
        let info = JobInfo::new(&*self.job_id, self.job.workers, attempt);
        let mut coordination = made.coordinator.map(|c| Coordination::new(c, info));
        if let Some(c) = &mut coordination {
            if let Err(error) = c.start() {
                self.log(|| format!("the coordinator cannot start: {error}"));
                self.outcome = Some(Err(error));
                return;
            }
        }
        let keeps = self.node_config.checkpoint_every.is_some();
        let store = keeps.then(|| Box::new(store) as Box<dyn CheckpointStore>);
        let end = JobEnd::default();
        let (task, node) = crate::runtime::master_process(
            MasterParts {
                master: made.master,
                hooks: made.hooks,
                combine: self.sim.combine.clone(),
                store,
                resumed,
                attempt,
                end: end.clone(),
            },
            Arc::clone(&self.node_config),
            NodeSettings {
                local: vec![self.gang(); self.job.workers],
                coordinated: coordination.is_some(),
                listening: false,
            },
            &self.job_id,
            self.instant(),
        );
        self.master = Some(MasterProcess {
            node,
            task: Some(Box::new(task)),
            coordination,
            timer: None,
            end,
        });
    }

    fn log(&mut self, line: impl FnOnce() -> String) {
        let line = line();
        self.trace
            .push(format!("{:>10.3} ms  {line}", self.now.as_secs_f64() * 1e3));
    }

    fn at(&mut self, after: Duration, event: Event<M, W>) {
        self.seq += 1;
        self.queue.push(Reverse((self.now + after, self.seq)));
        self.events.insert(self.seq, event);
    }

    fn instant(&self) -> Instant {
        self.base + self.now
    }

    /// Fires the first scheduled fault `matches` picks, if any (each fires once).
    fn scheduled(&mut self, matches: impl Fn(&Fault) -> bool) -> Option<Fault> {
        let at = self.pending.iter().position(matches)?;
        let fault = self.pending.remove(at);
        self.log(|| format!("scheduled fault: {fault:?}"));
        Some(fault)
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.random_bool(p.min(1.0))
    }

    fn latency(&mut self) -> Duration {
        let mut us = self.rng.random_range(LATENCY_US);
        if self.chance(self.sim.faults.delay) {
            let max = self.sim.faults.max_delay.as_micros().max(1) as u64;
            us += self.rng.random_range(0..max);
        }
        Duration::from_micros(us)
    }

    fn reach(&self) -> SimReach {
        SimReach(
            self.nodes
                .iter()
                .map(|n| n.alive && n.master == self.master_generation)
                .collect(),
        )
    }

    // ---- the master's node: fed, and its actions carried out ------------------------

    /// Feeds the master's node (if its process runs), then carries out what it asks.
    fn feed(&mut self, input: impl FnOnce(&mut MasterNode<M, W>, Instant, &SimReach)) {
        let reach = self.reach();
        let now = self.instant();
        let Some(master) = self.master.as_mut() else {
            return;
        };
        input(&mut master.node, now, &reach);
        self.drive();
    }

    fn drive(&mut self) {
        loop {
            let Some(action) = self.master.as_mut().and_then(|m| m.node.poll_action()) else {
                return;
            };
            self.carry_out(action);
        }
    }

    fn carry_out(&mut self, action: Action<M, W>) {
        match action {
            Action::Send { to, msg } => self.send_to_worker(to, msg),
            Action::Broadcast(msg) => {
                let begins = matches!(msg, ToWorker::Iterate { .. });
                if let (ToWorker::Iterate { iteration, .. }, false) = (&msg, self.gang()) {
                    let iteration = *iteration;
                    let cut = self.scheduled(
                        |f| matches!(f, Fault::Partition { iteration: i, .. } if *i == iteration),
                    );
                    if let Some(Fault::Partition { rank, millis, .. }) = cut {
                        self.cut(rank, millis);
                    }
                }
                let ends = matches!(msg, ToWorker::Finish { .. } | ToWorker::Abort { .. });
                if ends
                    && self
                        .scheduled(|f| *f == Fault::MasterCrashInDrain)
                        .is_some()
                {
                    // Before any worker's word that it stopped can be in: each way takes
                    // 50 µs at least.
                    let at = Duration::from_micros(self.rng.random_range(0..90));
                    let master = self.master_generation;
                    let when = "during the drain, before any worker said it stopped";
                    self.at(at, Event::MasterCrashNow { master, when });
                }
                for rank in 0..self.job.workers {
                    self.send_to_worker(rank, msg.clone());
                }
                // The master's process may crash while it gathers the round it began.
                let iteration = match msg {
                    ToWorker::Iterate { iteration, .. } => iteration,
                    _ => 0,
                };
                let scheduled = begins
                    && self
                        .scheduled(|f| {
                            *f == Fault::MasterCrash {
                                iteration,
                                point: CrashPoint::Gathering,
                            }
                        })
                        .is_some();
                if scheduled {
                    // Before the first result can be in (compute takes 1 ms at least).
                    let at = Duration::from_micros(self.rng.random_range(0..500));
                    let master = self.master_generation;
                    self.at(at, Event::MasterCrash { master });
                } else if begins && self.master_may_crash() && self.rng.random_bool(0.5) {
                    let at = Duration::from_micros(self.rng.random_range(0..10_000));
                    let master = self.master_generation;
                    self.at(at, Event::MasterCrash { master });
                }
            }
            Action::RunMaster(work) => self.run_master(work),
            Action::ReplaceWorker { rank, attempt, .. } => {
                self.stats.worker_restarts += 1;
                self.log(|| format!("worker {rank} is replaced"));
                self.replace(rank, attempt);
            }
            Action::ReplaceAll { attempt, .. } => {
                self.stats.new_attempts += 1;
                self.log(|| format!("every worker restarts as attempt {attempt}"));
                for rank in 0..self.job.workers {
                    self.replace(rank, attempt);
                }
            }
            Action::Event(_) => {}
            Action::EndJob(error) => {
                if let Some(master) = &self.master {
                    master.end.end(&error);
                }
            }
            Action::Report(report) => {
                if let Some(master) = self.master.as_mut() {
                    let attempt = master.node.attempt();
                    if let Some(c) = master.coordination.as_mut() {
                        c.worker_done(attempt, &report);
                    }
                }
            }
            Action::Commit(reports) => {
                let committed = match self.master.as_mut() {
                    Some(MasterProcess {
                        node,
                        coordination: Some(c),
                        ..
                    }) => c.finish(node.attempt(), &reports),
                    _ => Ok(()),
                };
                self.feed(|node, now, _| node.handle_committed(now, committed));
            }
            Action::CleanUp(error) => {
                if let Some(master) = self.master.as_mut() {
                    let attempt = master.node.attempt();
                    if let Some(c) = master.coordination.as_mut() {
                        c.fail(Some(attempt), &error);
                    }
                }
            }
            Action::Finished(outcome) => {
                if let Some(master) = &self.master {
                    self.stats.drops += master.node.drops();
                    self.stats.lost = master.node.lost();
                }
                self.log(|| match &outcome {
                    Ok(o) => format!("the job completes after {} iterations", o.iterations),
                    Err(e) => format!("the job fails: {e}"),
                });
                self.outcome = Some(outcome.map(|o| SimOutcome {
                    result: o.result,
                    iterations: o.iterations,
                    halted: o.halted,
                }));
            }
        }
    }

    /// Runs the master's code as the runtime does (its process may crash before its
    /// compute, or around its checkpoint write), and hands back what it did.
    fn run_master(&mut self, work: MasterWork<M, W>) {
        let mut crash = None;
        if let MasterWork::Iterate(round) = &work {
            self.check_round(round);
            let iteration = round.iteration;
            let scheduled = self.scheduled(|f| {
                matches!(f, Fault::MasterCrash { iteration: i, point } if *i == iteration && *point != CrashPoint::Gathering)
            });
            crash = match scheduled {
                Some(Fault::MasterCrash { point, .. }) => Some(match point {
                    CrashPoint::BeforeCompute | CrashPoint::Gathering => 0,
                    CrashPoint::BeforeCheckpoint => 1,
                    CrashPoint::DuringCheckpoint => 2,
                    CrashPoint::AfterCheckpoint => 3,
                    CrashPoint::TornCheckpoint => 4,
                }),
                _ if self.master_may_crash() => Some(self.rng.random_range(0..4u8)),
                _ => None,
            };
        }
        if crash == Some(0) {
            return self.crash_master("before its compute");
        }
        let write_crash = match crash {
            Some(1) => Some(WriteCrash::Before),
            Some(2) => Some(WriteCrash::During),
            Some(3) => Some(WriteCrash::After),
            Some(4) => Some(WriteCrash::Torn),
            _ => None,
        };
        *self.store.plan.lock().unwrap_or_else(|e| e.into_inner()) = (write_crash, false);
        let Some(mut task) = self.master.as_mut().and_then(|m| m.task.take()) else {
            self.violations
                .push("work handed to the master while it was busy".into());
            return;
        };
        let done = task.run(work);
        let (unused, crashed) = {
            let mut plan = self.store.plan.lock().unwrap_or_else(|e| e.into_inner());
            (plan.0.take(), std::mem::take(&mut plan.1))
        };
        if unused.is_some() {
            // No checkpoint was due: the process crashes once its compute is done.
            return self.crash_master("after its compute (no checkpoint was due)");
        }
        if crashed {
            let when = match write_crash {
                Some(WriteCrash::Before) => "before its checkpoint write",
                Some(WriteCrash::During) => "during its checkpoint write",
                Some(WriteCrash::Torn) => "during its checkpoint write, leaving the file torn",
                _ => "after its checkpoint write",
            };
            return self.crash_master(when);
        }
        if let MasterDone::Iterated {
            result: Ok(computed),
            iteration,
            ..
        } = &done
        {
            if computed.checkpointed {
                self.stats.checkpoints += 1;
                let iteration = *iteration;
                self.log(|| format!("checkpoint of iteration {iteration} saved"));
            }
        }
        if let Some(master) = self.master.as_mut() {
            master.task = Some(task);
        }
        self.feed(|node, now, reach| node.handle_master_done(now, done, reach));
    }

    /// The invariants of a round the master is handed: its quorum, and only results
    /// its ranks sent in its attempt.
    fn check_round(&mut self, round: &MasterRound<W>) {
        let iteration = round.iteration;
        let gathered = &round.gathered;
        self.stats.rounds += 1;
        let quorum = self.job.quorum();
        if gathered.reported.len() < quorum {
            self.violations.push(format!(
                "iteration {iteration} completed with ranks {:?}, short of its quorum {quorum}",
                gathered.reported
            ));
        }
        let attempt = self.master.as_ref().map_or(0, |m| m.node.attempt());
        for &rank in &gathered.reported {
            if !self.sent[rank].contains(&(attempt, iteration)) {
                self.violations.push(format!(
                    "iteration {iteration} folded a result rank {rank} never sent in attempt {attempt}"
                ));
            }
        }
        if !gathered.left_out.is_empty() {
            self.stats.partial_rounds += 1;
        }
        let (reported, left_out) = (gathered.reported.clone(), gathered.left_out.clone());
        self.log(|| {
            format!(
                "iteration {iteration} complete with ranks {reported:?} (left out {left_out:?})"
            )
        });
    }

    /// Whether every worker runs in the master's process (`RestartAll` restarts them
    /// there): then they die and start again with it. Otherwise they are processes of
    /// their own, which reconnect to a master started again.
    fn gang(&self) -> bool {
        matches!(self.job.failure_policy, FailurePolicy::RestartAll { .. })
    }

    fn master_may_crash(&mut self) -> bool {
        self.stats.master_crashes < self.sim.faults.max_crashes
            && self.chance(self.sim.faults.master_crash)
    }

    fn crash_master(&mut self, when: &str) {
        if let Some(master) = self.master.take() {
            self.stats.drops += master.node.drops();
        }
        self.master_generation += 1;
        self.stats.master_crashes += 1;
        self.log(|| format!("the master crashes {when}"));
        if self.gang() {
            // Every worker runs in the master's process (as `RestartAll` requires): they
            // die with it.
            for rank in 0..self.nodes.len() {
                self.settle(rank, &JobError::Cancelled);
                self.nodes[rank].alive = false;
            }
        }
        let after = Duration::from_micros(self.rng.random_range(20_000..100_000));
        self.at(after, Event::MasterRestart);
    }

    fn restart_master(&mut self) {
        self.stats.new_attempts += 1;
        self.start_master(self.stats.master_crashes);
        let Some(master) = &self.master else {
            return;
        };
        let attempt = master.node.attempt();
        self.log(|| format!("the master restarts as attempt {attempt}"));
        if self.gang() {
            // Its process starts its workers anew.
            for rank in 0..self.job.workers {
                self.replace(rank, attempt);
            }
            return self.drive();
        }
        self.drive();
        for rank in 0..self.job.workers {
            let node = &self.nodes[rank];
            if node.alive {
                let backoff = Duration::from_micros(self.rng.random_range(1_000..30_000));
                let generation = node.generation;
                self.at(backoff, Event::Reconnect { rank, generation });
            }
            // A rank whose process is gone connects when the launcher starts it again (or
            // never: the start-up timeout then names it).
        }
    }

    /// Whether a launcher starts a worker's process again when it ends on a failure
    /// (`superstep-launch --restarts`, under `RestartWorker`): the replacement of a rank
    /// of another process.
    fn relaunches(&self) -> bool {
        !self.gang() && matches!(self.job.failure_policy, FailurePolicy::RestartWorker { .. })
    }

    /// The process of `rank` ended on a failure (its own, or a crash): the launcher starts
    /// it again after `after`.
    fn process_ended(&mut self, rank: Rank, after: Duration) {
        if !self.relaunches() {
            return;
        }
        let generation = self.nodes[rank].generation;
        // Its new process connects once the old connection is gone: after everything on
        // it arrived.
        let after = after.max(self.until_delivered(rank))
            + Duration::from_micros(self.rng.random_range(1_000..20_000));
        self.at(after, Event::Relaunch { rank, generation });
    }

    /// How long until everything sent on the connection of `rank` has arrived.
    fn until_delivered(&self, rank: Rank) -> Duration {
        let (to_master, _) = self.arrivals[rank];
        to_master.saturating_sub(self.now) + Duration::from_micros(1)
    }

    /// The master's node hears that the worker of `rank` is gone, as a transport tells it.
    fn lost(&mut self, rank: Rank, reason: &str) {
        let reason = reason.to_string();
        self.feed(|node, now, reach| {
            let attempt = node.attempt();
            let error = JobError::WorkerLost { rank, reason };
            let msg = ToMaster::Failed { attempt, error };
            node.handle_message(now, Envelope { from: rank, msg }, reach)
        });
    }

    // ---- the network ------------------------------------------------------------------

    fn send_to_master(&mut self, from: Rank, msg: ToMaster<W>) {
        // Every message crosses the wire encoding, as it would between processes: what
        // arrives is the decoded copy, or the job fails as it would over TCP.
        let attempt = match &msg {
            ToMaster::Result(report) => report.attempt,
            ToMaster::Registered { attempt }
            | ToMaster::Failed { attempt, .. }
            | ToMaster::Done { attempt, .. }
            | ToMaster::Sync { attempt, .. } => *attempt,
        };
        let msg = wire_copy(msg, || format!("worker {from} → master"))
            .unwrap_or_else(|error| ToMaster::Failed { attempt, error });
        self.carry_to_master(from, msg);
    }

    /// Carries a message that crossed the wire encoding from `from` to the master, over
    /// the simulated network and its faults.
    fn carry_to_master(&mut self, from: Rank, msg: ToMaster<W>) {
        let generation = self
            .nodes
            .get(from)
            .map_or(self.master_generation, |n| n.master);
        let latency = self.latency();
        let is_result = msg.carries_result();
        let iteration = match &msg {
            ToMaster::Result(report) => Some(report.iteration),
            _ => None,
        };
        let on_result = |f: &Fault, kind: fn(Rank, Iteration) -> Fault| {
            iteration.is_some_and(|i| *f == kind(from, i))
        };
        let duplicate = self
            .scheduled(|f| on_result(f, |rank, iteration| Fault::Duplicate { rank, iteration }))
            .is_some();
        let dropped = self
            .scheduled(|f| on_result(f, |rank, iteration| Fault::Drop { rank, iteration }))
            .is_some();
        let delayed = match self.scheduled(|f| {
            matches!(f, Fault::Delay { rank, iteration: i, .. } if *rank == from && Some(*i) == iteration)
        }) {
            Some(Fault::Delay { millis, .. }) => Duration::from_millis(millis),
            _ => Duration::ZERO,
        };
        let latency = latency + delayed;
        // Across a cut of the network: held until it heals, or lost with the connection.
        let Some(latency) = self.across_cut(from, latency) else {
            return;
        };
        if duplicate || (is_result && self.chance(self.sim.faults.duplicate)) {
            // The copy a network delivers twice: the same bytes, decoded again.
            if let Ok(copy) = crate::codec::round_trip(&msg) {
                let again = self.latency() + latency;
                self.at(
                    again,
                    Event::ToMaster {
                        generation,
                        from,
                        msg: copy,
                    },
                );
            }
        }
        let latency = if dropped || (is_result && self.chance(self.sim.faults.drop)) {
            latency + RETRANSMIT
        } else {
            latency
        };
        let latency = self.in_order(from, Way::ToMaster, latency);
        self.at(
            latency,
            Event::ToMaster {
                generation,
                from,
                msg,
            },
        );
    }

    /// The latency of a message between the master and `rank` sent now, across the cut of
    /// the network there if any: it arrives once a short cut heals; across a long one
    /// (`None`) it is lost with the connection.
    fn across_cut(&mut self, rank: Rank, latency: Duration) -> Option<Duration> {
        let (from, heal, cut) = match self.cuts.get(rank).copied().flatten() {
            Some((from, heal, cut)) if from <= self.now && self.now < heal => (from, heal, cut),
            _ => return Some(latency),
        };
        // A process started during the cut has no connection yet: it connects once the
        // network heals (its tries before fail), and what it sends goes then.
        let connected_since_cut = self.nodes.get(rank).is_some_and(|n| n.generation != cut);
        if heal - from >= HEARTBEAT_TIMEOUT && !connected_since_cut {
            // The connection dies with the cut: nothing it carries from now arrives.
            return None;
        }
        Some(heal - self.now + latency)
    }

    /// The network between the master and `rank` is cut for `millis`, from now.
    fn cut(&mut self, rank: Rank, millis: u64) {
        let Some(slot) = self.cuts.get_mut(rank) else {
            return;
        };
        let lasts = Duration::from_millis(millis);
        let generation = self.nodes[rank].generation;
        *slot = Some((self.now, self.now + lasts, generation));
        self.log(|| format!("the network to worker {rank} is cut for {lasts:?}"));
        if lasts >= HEARTBEAT_TIMEOUT {
            let (generation, master) = (self.nodes[rank].generation, self.master_generation);
            let silence = Event::Silence {
                rank,
                generation,
                master,
            };
            self.at(HEARTBEAT_TIMEOUT, silence);
        }
    }

    /// A connection delivers in order, as TCP does: a message sent on it arrives after
    /// every one sent on it before (a delayed or retransmitted one holds up those behind
    /// it). Returns the latency that keeps the order.
    fn in_order(&mut self, rank: Rank, way: Way, latency: Duration) -> Duration {
        let Some(last) = self.arrivals.get_mut(rank) else {
            return latency;
        };
        let last = match way {
            Way::ToMaster => &mut last.0,
            Way::ToWorker => &mut last.1,
        };
        let at = (self.now + latency).max(*last + Duration::from_micros(1));
        *last = at;
        at - self.now
    }

    fn send_to_worker(&mut self, rank: Rank, msg: ToWorker<M>) {
        let msg = match wire_copy(msg, || format!("master → worker {rank}")) {
            Ok(msg) => msg,
            // The worker could not read it: the job fails, as over TCP.
            Err(error) => {
                return self.feed(|node, now, reach| node.handle_failure(now, error, reach))
            }
        };
        let node = &self.nodes[rank];
        if !node.alive || node.master != self.master_generation {
            // Not connected: nothing reaches it.
            return;
        }
        let generation = node.generation;
        let latency = self.latency();
        let Some(latency) = self.across_cut(rank, latency) else {
            return;
        };
        let latency = self.in_order(rank, Way::ToWorker, latency);
        self.at(
            latency,
            Event::ToWorker {
                rank,
                generation,
                msg,
            },
        );
    }

    fn run(mut self) -> SimRun<M> {
        let mut handled = 0u64;
        while self.outcome.is_none() {
            let Some(Reverse((at, seq))) = self.queue.pop() else {
                let deadline = self
                    .master
                    .as_ref()
                    .and_then(|m| m.node.poll_timeout())
                    .map(|t| t - self.base);
                self.violations.push(format!(
                    "the run stalled: nothing left to happen (the master's node's deadline {deadline:?})"
                ));
                self.outcome = Some(Err(JobError::Runtime {
                    message: "the simulation stalled".into(),
                }));
                break;
            };
            handled += 1;
            if handled > MAX_EVENTS {
                self.violations
                    .push(format!("the run did not end within {MAX_EVENTS} events"));
                self.outcome = Some(Err(JobError::Runtime {
                    message: "the simulation did not end".into(),
                }));
                break;
            }
            self.now = at;
            let event = self
                .events
                .remove(&seq)
                .expect("every queued event is stored");
            self.handle(event);
            self.arm_timer();
        }
        // No compute is left waiting in a sync call: its thread ends before the run does.
        for rank in 0..self.nodes.len() {
            self.settle(rank, &JobError::Cancelled);
        }
        SimRun {
            seed: 0,
            outcome: self.outcome.expect("the loop ends with an outcome"),
            stats: self.stats,
            trace: self.trace,
            violations: self.violations,
            schedule: self.sim.schedule.clone(),
        }
    }

    fn arm_timer(&mut self) {
        if self.outcome.is_some() {
            return;
        }
        let now = self.instant();
        let generation = self.master_generation;
        let Some(master) = self.master.as_mut() else {
            return;
        };
        let deadline = master.node.poll_timeout();
        if deadline != master.timer {
            master.timer = deadline;
            if let Some(at) = deadline {
                let after = at.saturating_duration_since(now);
                self.at(
                    after,
                    Event::Timer {
                        master: generation,
                        at,
                    },
                );
            }
        }
    }

    fn handle(&mut self, event: Event<M, W>) {
        match event {
            Event::WorkerStarted {
                rank,
                generation,
                worked,
            } => {
                if !self.is_current(rank, generation) {
                    return;
                }
                let attempt = self.nodes[rank].worker.attempt();
                self.log(|| format!("worker {rank} started in attempt {attempt}"));
                let now = self.instant();
                self.nodes[rank].worker.handle_worked(now, worked);
                self.drive_worker(rank);
            }
            Event::WorkerTimer {
                rank,
                generation,
                at,
            } => {
                if !self.is_current(rank, generation) || self.nodes[rank].timer != Some(at) {
                    return;
                }
                self.nodes[rank].timer = None;
                let now = self.instant();
                self.nodes[rank].worker.handle_timeout(now);
                self.drive_worker(rank);
            }
            Event::ToMaster {
                generation,
                from,
                msg,
            } => {
                if self.master.is_none() || generation != self.master_generation {
                    return;
                }
                self.stats.messages += 1;
                self.deliver_to_master(from, msg);
            }
            Event::ToWorker {
                rank,
                generation,
                msg,
            } => {
                if !self.is_current(rank, generation) {
                    return;
                }
                self.stats.messages += 1;
                // The process's inbox hears the job's failure (as the runtime's does).
                if let Some(error) = crate::protocol::abort_ends_job(rank, &msg) {
                    self.nodes[rank].end.end(error);
                }
                let now = self.instant();
                self.nodes[rank].worker.handle_message(now, msg);
                self.drive_worker(rank);
            }
            Event::Computed {
                rank,
                generation,
                worked,
                then_crash,
            } => {
                if !self.is_current(rank, generation) {
                    return;
                }
                // (The node knows an iteration of a master left behind for itself; the
                // task's flag is only for its own failure.)
                lock(&self.nodes[rank].task)
                    .stale
                    .store(false, std::sync::atomic::Ordering::Release);
                // It crashes right after its result left (or, without one, after what it
                // sends instead).
                self.nodes[rank].crash_after_send = then_crash;
                let now = self.instant();
                self.nodes[rank].worker.handle_worked(now, worked);
                self.drive_worker(rank);
                if std::mem::take(&mut self.nodes[rank].crash_after_send)
                    && self.is_current(rank, generation)
                {
                    self.crash_worker(rank, "right after its result left");
                }
            }
            Event::WorkerCrash { rank, generation } => {
                if self.is_current(rank, generation) {
                    self.crash_worker(rank, "during its compute");
                }
            }
            Event::Noticed {
                rank,
                generation,
                master,
            } => {
                let node = &self.nodes[rank];
                if self.master.is_none()
                    || master != self.master_generation
                    || node.generation != generation
                    || node.alive
                {
                    return;
                }
                self.log(|| format!("the master notices worker {rank} is gone"));
                self.lost(rank, "its heartbeats stopped (simulated crash)");
            }
            Event::Timer { master, at } => {
                let generation = self.master_generation;
                let Some(m) = self.master.as_mut() else {
                    return;
                };
                if master != generation || m.timer != Some(at) {
                    return;
                }
                m.timer = None;
                self.feed(|node, now, reach| node.handle_timeout(now, reach));
            }
            Event::MasterCrash { master } => {
                let gathering = self
                    .master
                    .as_ref()
                    .is_some_and(|m| m.node.gathering().is_some());
                if gathering && master == self.master_generation {
                    self.crash_master("while it gathered results");
                }
            }
            Event::Silence {
                rank,
                generation,
                master,
            } => {
                // (Only the connection of the process it cut: a later one is another.)
                let same = self
                    .nodes
                    .get(rank)
                    .is_some_and(|n| n.generation == generation);
                if same && master == self.master_generation && self.master.is_some() {
                    self.log(|| format!("the master hears nothing from worker {rank}"));
                    self.lost(rank, "its heartbeats stopped (a network partition)");
                }
                if self.is_current(rank, generation) {
                    // Its transport gives up on the master it cannot hear, and tells it so
                    // (as a TCP worker without a reconnect timeout does).
                    let error = JobError::MasterLost {
                        reason: format!(
                            "worker {rank} heard nothing from the master for {HEARTBEAT_TIMEOUT:?}"
                        ),
                    };
                    self.log(|| format!("worker {rank} hears nothing from the master"));
                    let now = self.instant();
                    let worker = &mut self.nodes[rank].worker;
                    let attempt = worker.attempt();
                    worker.handle_message(now, ToWorker::Abort { attempt, error });
                    self.drive_worker(rank);
                }
            }
            Event::MasterCrashNow { master, when } => {
                if self.master.is_some() && master == self.master_generation {
                    self.crash_master(when);
                }
            }
            Event::MasterRestart => self.restart_master(),
            Event::Relaunch { rank, generation } => {
                if self.nodes[rank].generation != generation || self.outcome.is_some() {
                    return;
                }
                let Some(m) = &self.master else {
                    // No master to connect to yet: the process keeps trying.
                    let retry = Duration::from_millis(10);
                    return self.at(retry, Event::Relaunch { rank, generation });
                };
                let attempt = m.node.attempt();
                self.stats.worker_restarts += 1;
                self.log(|| format!("the launcher starts worker {rank} again"));
                self.replace(rank, attempt);
            }
            Event::Reconnect { rank, generation } => {
                let Some(m) = &self.master else {
                    return;
                };
                if !self.is_current(rank, generation) {
                    return;
                }
                let attempt = m.node.attempt();
                self.nodes[rank].master = self.master_generation;
                self.log(|| format!("worker {rank} reaches the master again (attempt {attempt})"));
                // As a worker's transport tells it after each handshake.
                let connected = ToWorker::<M>::Connected { attempt };
                let now = self.instant();
                self.nodes[rank].worker.handle_message(now, connected);
                self.drive_worker(rank);
            }
        }
    }

    fn deliver_to_master(&mut self, from: Rank, msg: ToMaster<W>) {
        let checked = match &msg {
            ToMaster::Result(r) => Some((r.attempt, r.iteration)),
            _ => None,
        };
        let Some(master) = &self.master else {
            return;
        };
        let before = master.node.drops().total();
        let current = (master.node.attempt(), master.node.gathering());
        self.feed(|node, now, reach| node.handle_message(now, Envelope { from, msg }, reach));
        if let (Some((attempt, iteration)), Some(master)) = (checked, &self.master) {
            let kept = master.node.drops().total() == before;
            if kept && Some((attempt, iteration)) != current.1.map(|i| (current.0, i)) {
                self.violations.push(format!(
                    "a result of rank {from} for attempt {attempt} iteration {iteration} was kept while the master's node was at {current:?}"
                ));
            }
        }
    }

    // ---- the workers ------------------------------------------------------------------

    /// A new process for `rank`: its code starts (`init`), in `attempt`.
    fn spawn(&mut self, rank: Rank, generation: Generation, attempt: Attempt) -> Node<M, W> {
        let end = JobEnd::default();
        let mut ctx = crate::runtime::worker_context(
            &self.job,
            &self.job_id,
            rank,
            self.shards.as_ref(),
            end.clone(),
        );
        let sync = self.job.barrier_mode.then(|| {
            let (to_sim, from) = mpsc::channel();
            let link: Arc<dyn WorkerLink<W>> = Arc::new(CallLink(to_sim.clone()));
            let patience = self.worker_config.sync_patience;
            let (link, answers) = crate::runtime::sync_calls::sync_link(link, attempt, patience);
            ctx.sync = Some(link);
            SimSync {
                from,
                to_sim,
                answers,
                thread: None,
            }
        });
        let hooks = self
            .sim
            .worker_hooks
            .iter()
            .map(|make| make(rank))
            .collect();
        let config = Arc::clone(&self.worker_config);
        let task = WorkerTask::new(
            (self.sim.workers)(rank),
            hooks,
            ctx,
            attempt,
            Arc::clone(&config),
        );
        Node {
            generation,
            master: self.master_generation,
            alive: true,
            worker: WorkerNode::new(rank, attempt, config),
            task: Arc::new(Mutex::new(task)),
            end,
            sync,
            parked: None,
            failed: false,
            stopped: false,
            crash_after_send: false,
            timer: None,
        }
    }

    /// Starts the new process of `rank` (in place in `nodes`).
    fn start_worker(&mut self, rank: Rank) {
        self.nodes[rank].worker.start();
        self.drive_worker(rank);
    }

    /// A new process for `rank`, in the place of the old one (which stops).
    fn replace(&mut self, rank: Rank, attempt: Attempt) {
        self.settle(rank, &JobError::Cancelled);
        let generation = self.nodes[rank].generation + 1;
        self.nodes[rank] = self.spawn(rank, generation, attempt);
        self.start_worker(rank);
    }

    /// Whether the process of `generation` is the running worker of `rank`: alive, and
    /// not done.
    fn is_current(&self, rank: Rank, generation: Generation) -> bool {
        let node = &self.nodes[rank];
        node.alive && !node.stopped && node.generation == generation
    }

    /// Carries out what the worker's node of `rank` asks, in order, as the runtime's
    /// worker actor does — in virtual time.
    fn drive_worker(&mut self, rank: Rank) {
        loop {
            let node = &mut self.nodes[rank];
            if !node.alive || node.stopped {
                return;
            }
            let Some(action) = node.worker.poll_action() else {
                return self.arm(rank);
            };
            let attempt = node.worker.attempt();
            match action {
                WorkerAction::Run(Work::Start) => self.start_up(rank),
                WorkerAction::Run(Work::Iterate(iteration, last)) => {
                    self.compute(rank, iteration, last)
                }
                WorkerAction::Run(work @ Work::Stop(_)) => {
                    // `post_application` takes no time worth simulating.
                    let worked = {
                        let mut task = lock(&node.task);
                        task.attempt = attempt;
                        task.run(work)
                    };
                    node.worker.handle_worked(self.base + self.now, worked);
                }
                WorkerAction::Send(msg) => {
                    if let ToMaster::Registered { attempt } = msg {
                        self.log(|| format!("worker {rank} registers in attempt {attempt}"));
                    }
                    self.send_to_master(rank, msg);
                }
                WorkerAction::SendResult(report) => {
                    let iteration = report.iteration;
                    self.sent[rank].push((report.attempt, iteration));
                    // A result that does not survive the wire encoding is the worker's
                    // failure, as its transport reports it.
                    let direction = || format!("worker {rank} → master");
                    let sent = match crate::codec::through_wire(ToMaster::Result(report), direction)
                    {
                        Ok(copy) => {
                            self.carry_to_master(rank, copy);
                            Ok(())
                        }
                        Err(undecodable) => Err(Unsent::from(TransportError::from(undecodable))),
                    };
                    if std::mem::take(&mut self.nodes[rank].crash_after_send) {
                        return self.crash_worker(rank, "right after its result left");
                    }
                    let now = self.instant();
                    self.nodes[rank].worker.handle_sent(now, iteration, sent);
                }
                WorkerAction::SendDone => {
                    let done = lock(&node.task).done(attempt);
                    self.send_to_master(rank, done);
                }
                WorkerAction::Answer(epoch, result) => {
                    if let Some(sync) = &node.sync {
                        sync.answers.answer(epoch, result);
                    }
                    if let Some(computing) = node.parked.take() {
                        self.follow(rank, computing);
                    }
                }
                WorkerAction::Verdict(error) | WorkerAction::EndSync(error) => {
                    // A call waiting fails, and the compute goes on to return.
                    if let Some(sync) = &node.sync {
                        sync.answers.end(&error);
                    }
                    if let Some(computing) = node.parked.take() {
                        self.follow(rank, computing);
                    }
                }
                WorkerAction::EndJob(error) => node.end.end(&error),
                WorkerAction::MarkStale => {
                    let task = lock(&node.task);
                    task.stale.store(true, std::sync::atomic::Ordering::Release);
                }
                WorkerAction::Report(ending) => {
                    node.failed = matches!(ending, OwnedEnding::Failed(_));
                }
                WorkerAction::Stop => return self.worker_stopped(rank),
            }
        }
    }

    /// Sets the timer of the worker's node of `rank` for its next deadline, if it moved.
    fn arm(&mut self, rank: Rank) {
        let node = &mut self.nodes[rank];
        let next = node.worker.poll_timeout();
        let Some(at) = next.filter(|_| next != node.timer) else {
            return;
        };
        node.timer = next;
        let generation = node.generation;
        let after = at.saturating_duration_since(self.instant());
        self.at(
            after,
            Event::WorkerTimer {
                rank,
                generation,
                at,
            },
        );
    }

    /// The worker of `rank` is done. One that failed ends its process, which its launcher
    /// may start again once the network lets it connect.
    fn worker_stopped(&mut self, rank: Rank) {
        self.nodes[rank].stopped = true;
        if !self.nodes[rank].failed || self.gang() {
            return;
        }
        self.nodes[rank].alive = false;
        self.settle(rank, &JobError::Cancelled);
        let heals =
            self.cuts[rank].map_or(Duration::ZERO, |(_, heal, _)| heal.saturating_sub(self.now));
        self.process_ended(rank, heals);
    }

    /// The start-up of the worker of `rank` runs (`init`, interceptors'
    /// `pre_application`) and returns after its (virtual) time; it may crash meanwhile.
    fn start_up(&mut self, rank: Rank) {
        let node = &self.nodes[rank];
        let generation = node.generation;
        let worked = {
            let mut task = lock(&node.task);
            task.attempt = node.worker.attempt();
            task.run(Work::Start)
        };
        let startup = Duration::from_micros(self.rng.random_range(500..5_000));
        // A crash scheduled in iteration 0: during start-up, before it registers.
        let crashes = self
            .scheduled(
                |f| matches!(f, Fault::WorkerCrash { rank: r, iteration: 0, .. } if *r == rank),
            )
            .is_some();
        if crashes {
            self.worker_crashes += 1;
            self.at(startup / 2, Event::WorkerCrash { rank, generation });
        }
        self.at(
            startup,
            Event::WorkerStarted {
                rank,
                generation,
                worked,
            },
        );
    }

    /// Ends the compute of `rank` parked in a sync call, if any, as the runtime's worker
    /// does when the job fails: the call fails with `error`; the simulator waits for the
    /// compute to return (what it returns is of no use).
    fn settle(&mut self, rank: Rank, error: &JobError) {
        let Some(node) = self.nodes.get_mut(rank) else {
            return;
        };
        let (Some(sync), Some(_)) = (&mut node.sync, node.parked.take()) else {
            return;
        };
        sync.answers.end(error);
        // Every call after the end fails at once, without a word: the next is its return.
        loop {
            match sync.next() {
                Some(FromCompute::Returned(_)) => break,
                Some(FromCompute::Call(_)) => continue,
                None => {
                    self.violations.push(format!(
                        "worker {rank}'s compute did not return within {COMPUTE_PATIENCE:?} once its sync call failed"
                    ));
                    break;
                }
            }
        }
    }

    /// Waits for what the compute of `rank` (on its own thread, in barrier mode) does next:
    /// a sync call goes to the master and the compute parks; a return ends the compute.
    fn follow(&mut self, rank: Rank, computing: Computing) {
        let Some(sync) = &mut self.nodes[rank].sync else {
            return;
        };
        match sync.next() {
            Some(FromCompute::Call(msg)) => {
                self.nodes[rank].parked = Some(computing);
                self.send_to_master(rank, msg);
            }
            Some(FromCompute::Returned(worked)) => self.computed(rank, computing, worked),
            None => {
                self.violations.push(format!(
                    "worker {rank}'s compute neither called nor returned within {COMPUTE_PATIENCE:?}"
                ));
                let worked = Worked::Iterated(Err(JobError::Runtime {
                    message: format!("worker {rank}'s compute hung"),
                }));
                self.computed(rank, computing, worked);
            }
        }
    }

    fn compute(&mut self, rank: Rank, iteration: Iteration, last: Option<Arc<M>>) {
        let faults = self.sim.faults;
        let slow = self
            .scheduled(|f| *f == Fault::Slow { rank, iteration })
            .is_some()
            || self.chance(faults.slow);
        let scheduled = self.scheduled(|f| {
            matches!(f, Fault::WorkerCrash { rank: r, iteration: i, .. } if *r == rank && *i == iteration)
        });
        let (crash, during) = match scheduled {
            Some(Fault::WorkerCrash { after_result, .. }) => (true, !after_result),
            _ => {
                let crash =
                    self.worker_crashes < faults.max_crashes && self.chance(faults.worker_crash);
                (crash, crash && self.rng.random_bool(0.5))
            }
        };
        let mut took = Duration::from_micros(self.rng.random_range(1_000..10_000));
        if slow {
            took *= 20;
        }
        let node = &mut self.nodes[rank];
        let attempt = node.worker.attempt();
        lock(&node.task).attempt = attempt;
        self.log(|| {
            format!(
                "worker {rank} computes iteration {iteration} of attempt {attempt}{}",
                if slow { " (slowly)" } else { "" }
            )
        });
        let computing = Computing {
            took,
            crash,
            during,
        };
        let node = &self.nodes[rank];
        match &node.sync {
            // Interceptors and compute, as the runtime runs them.
            None => {
                let worked = lock(&node.task).run(Work::Iterate(iteration, last));
                self.computed(rank, computing, worked);
            }
            // On a thread of its own, as in the runtime; the simulator waits for it to
            // call or return, so one thread runs at a time.
            Some(sync) => {
                let (task, to_sim) = (Arc::clone(&node.task), sync.to_sim.clone());
                let spawned = std::thread::Builder::new()
                    .name(format!("superstep-sim-worker-{rank}"))
                    .spawn(move || {
                        let worked = lock(&task).run(Work::Iterate(iteration, last));
                        let _ = to_sim.send(FromCompute::Returned(worked));
                    });
                match spawned {
                    Ok(thread) => {
                        if let Some(sync) = &mut self.nodes[rank].sync {
                            sync.thread = Some(thread);
                        }
                    }
                    Err(e) => {
                        let worked = Worked::Iterated(Err(JobError::Runtime {
                            message: format!("could not start worker {rank}'s compute thread: {e}"),
                        }));
                        return self.computed(rank, computing, worked);
                    }
                }
                self.follow(rank, computing);
            }
        }
    }

    /// The compute of `rank` returned `worked`: its result leaves once its (virtual)
    /// compute time passed, unless it crashes first.
    fn computed(&mut self, rank: Rank, computing: Computing, worked: Worked<W>) {
        let Computing {
            took,
            crash,
            during,
        } = computing;
        let generation = self.nodes[rank].generation;
        let worked = match worked {
            Worked::Iterated(Ok(report)) => Worked::Iterated(Ok(Report {
                // Virtual time, so that a seed replays the same run.
                elapsed: took,
                ..report
            })),
            other => other,
        };
        if during {
            self.worker_crashes += 1;
            let at = Duration::from_micros(self.rng.random_range(0..took.as_micros() as u64));
            self.at(at, Event::WorkerCrash { rank, generation });
        } else {
            if crash {
                self.worker_crashes += 1;
            }
            self.at(
                took,
                Event::Computed {
                    rank,
                    generation,
                    worked,
                    then_crash: crash,
                },
            );
        }
    }

    fn crash_worker(&mut self, rank: Rank, when: &str) {
        self.settle(rank, &JobError::Cancelled);
        let node = &mut self.nodes[rank];
        node.alive = false;
        let generation = node.generation;
        self.stats.worker_crashes += 1;
        self.log(|| format!("worker {rank} crashes {when}"));
        let master = self.master_generation;
        // The loss is noticed after the heartbeat timeout, and after everything the
        // connection carried arrived (the transport reports it when its reading ends).
        let noticed = self.until_delivered(rank).max(HEARTBEAT_TIMEOUT);
        self.at(
            noticed,
            Event::Noticed {
                rank,
                generation,
                master,
            },
        );
        // A new process of the rank can connect once the old connection is gone.
        self.process_ended(rank, noticed);
    }
}
