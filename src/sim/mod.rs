//! A deterministic simulator: a job's master and workers — your computables and the
//! [`protocol`](crate::protocol) state machines that the runtime drives — run in one
//! thread on a virtual clock, with message order and faults drawn from a seed.
//!
//! Same seed, same run: the same messages in the same order, the same faults at the same
//! points, the same trace. A property test runs many seeds and, when one fails, prints it
//! with the command that replays it (see [`Simulation::check`]).
//!
//! The simulator drives the same state machines as the actor runtime: the [`Gate`]
//! counts one result per rank of the current attempt and iteration and drops the rest;
//! the [`Schedule`] decides the next iteration; a worker's [`WorkerState`] acts on each
//! master message once, in increasing order, skipping ahead when it is late. The master
//! checkpoints every k iterations and the last (in the crate's encoding, as the runtime
//! does; every result also crosses that encoding on its way) and a restarted master
//! resumes from the newest one. The [`Recovery`] applies the [`FailurePolicy`], as the
//! actor runtime does.
//!
//! The faults ([`Faults`]): a worker crashes during its compute or right after its result
//! left; the master's process crashes while it gathers, before its compute, or before,
//! during or after a checkpoint write; a message is delayed; a result is delivered twice,
//! or lost and retransmitted. A crashed worker is noticed after a heartbeat timeout; a
//! crashed master is restarted, and its workers reconnect with backoff and carry on in a
//! new attempt, so nothing of the old one is folded.
//!
//! ```
//! use superstep::prelude::*;
//! use superstep::sim::{Faults, Simulation};
//! use superstep::FailurePolicy;
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
//! let sim = Simulation::new(|| Sum, |_| Rank1).workers(3).iterations(8);
//! let expected = sim.run(0).outcome.unwrap().result;
//! let faulty = sim
//!     .policy(FailurePolicy::RestartWorker { max_restarts: 100 })
//!     .checkpoint_every(2)
//!     .faults(Faults::crashes(0.1, 0.05));
//! faulty.check(0..50, |run| {
//!     let got = run.outcome.as_ref().map_err(|e| e.to_string())?;
//!     if *got.result != *expected {
//!         return Err(format!("{} instead of {expected}", got.result));
//!     }
//!     Ok(())
//! });
//! ```

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::checkpoint::{Checkpoint, CheckpointStore, MemoryCheckpointStore};
use crate::compute::{MasterComputable, MasterContext, Payload, WorkerComputable, WorkerContext};
use crate::error::{Cause, JobError, Phase};
use crate::protocol::{
    Attempt, Drops, Envelope, FailurePolicy, Gate, GateConfig, GateOutput, HaltedBy, Iteration,
    Next, Rank, Recover, Recovery, Report, Schedule, ToMaster, ToWorker, WorkerCommand,
    WorkerState,
};
use crate::runtime::{DynMaster, DynWorker};

/// The variable that replays one seed: `SUPERSTEP_SIM_SEED=<seed> cargo test <test>`.
pub const SEED_VAR: &str = "SUPERSTEP_SIM_SEED";
/// The variable that sets how many seeds [`Simulation::check`] runs, for long runs.
pub const SEEDS_VAR: &str = "SUPERSTEP_SIM_SEEDS";

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

/// The settings of a simulated job: those of [`JobConfig`](crate::JobConfig) that shape
/// the protocol, and the faults.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SimConfig {
    /// The number of workers. Default 3.
    pub workers: usize,
    /// The most iterations. Default 10.
    pub iterations: Iteration,
    /// Halt when every worker votes to halt. Default off.
    pub worker_halt: bool,
    /// What to do when a worker fails. Default [`FailurePolicy::Fail`].
    pub policy: FailurePolicy,
    /// Checkpoint every k iterations; `None` (the default) never.
    pub checkpoint_every: Option<Iteration>,
    /// As [`JobConfig::min_workers_ratio`](crate::JobConfig::min_workers_ratio). Default 1.0.
    pub min_workers_ratio: f64,
    /// As [`JobConfig::min_workers_timeout`](crate::JobConfig::min_workers_timeout), in
    /// virtual time. Default 50 ms.
    pub min_workers_timeout: Duration,
    /// How long an iteration may wait for its results, in virtual time. Default 10 s.
    pub iteration_timeout: Duration,
    /// How long start-up may take, in virtual time. Default 10 s.
    pub startup_timeout: Duration,
    /// The faults to draw. Default none.
    pub faults: Faults,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            workers: 3,
            iterations: 10,
            worker_halt: false,
            policy: FailurePolicy::Fail,
            checkpoint_every: None,
            min_workers_ratio: 1.0,
            min_workers_timeout: Duration::from_millis(50),
            iteration_timeout: Duration::from_secs(10),
            startup_timeout: Duration::from_secs(10),
            faults: Faults::default(),
        }
    }
}

impl SimConfig {
    fn quorum(&self) -> usize {
        crate::config::quorum(self.min_workers_ratio, self.workers)
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
}

impl<M> SimRun<M> {
    /// The command that replays this run in the current test.
    pub fn replay_command(&self) -> String {
        let test = std::thread::current()
            .name()
            .filter(|n| *n != "main")
            .map(|n| format!(" {n} -- --exact"))
            .unwrap_or_default();
        format!("{SEED_VAR}={} cargo test{test}", self.seed)
    }
}

type MasterFactory<M, W> = Arc<dyn Fn() -> DynMaster<M, W> + Send + Sync>;
type WorkerMaker<M, W> = Arc<dyn Fn(Rank) -> DynWorker<M, W> + Send + Sync>;

/// A job to simulate: a factory of its master (called again for a restarted master), a
/// factory of its workers (called again for a replaced worker), and its settings.
pub struct Simulation<M, W> {
    master: MasterFactory<M, W>,
    workers: WorkerMaker<M, W>,
    config: SimConfig,
}

impl<M, W> Clone for Simulation<M, W> {
    fn clone(&self) -> Self {
        Simulation {
            master: Arc::clone(&self.master),
            workers: Arc::clone(&self.workers),
            config: self.config.clone(),
        }
    }
}

impl<M, W> fmt::Debug for Simulation<M, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Simulation")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<M: Payload, W: Payload> Simulation<M, W> {
    /// A simulation of the job made of these factories, with the default [`SimConfig`].
    pub fn new<MC, WC>(
        master: impl Fn() -> MC + Send + Sync + 'static,
        workers: impl Fn(Rank) -> WC + Send + Sync + 'static,
    ) -> Self
    where
        MC: MasterComputable<MasterResult = M, WorkerResult = W>,
        WC: WorkerComputable<MasterResult = M, WorkerResult = W>,
    {
        Simulation {
            master: Arc::new(move || -> DynMaster<M, W> { Box::new(master()) }),
            workers: Arc::new(move |rank| -> DynWorker<M, W> { Box::new(workers(rank)) }),
            config: SimConfig::default(),
        }
    }

    /// The number of workers.
    pub fn workers(mut self, workers: usize) -> Self {
        self.config.workers = workers;
        self
    }

    /// The most iterations.
    pub fn iterations(mut self, iterations: Iteration) -> Self {
        self.config.iterations = iterations;
        self
    }

    /// Halt when every worker votes to halt.
    pub fn worker_halt(mut self, enabled: bool) -> Self {
        self.config.worker_halt = enabled;
        self
    }

    /// What to do when a worker fails.
    pub fn policy(mut self, policy: FailurePolicy) -> Self {
        self.config.policy = policy;
        self
    }

    /// Checkpoint every `every` iterations.
    pub fn checkpoint_every(mut self, every: Iteration) -> Self {
        self.config.checkpoint_every = Some(every.max(1));
        self
    }

    /// Stragglers: after `timeout` (virtual), go on with `ceil(ratio × workers)` results.
    pub fn min_workers(mut self, ratio: f64, timeout: Duration) -> Self {
        self.config.min_workers_ratio = ratio;
        self.config.min_workers_timeout = timeout;
        self
    }

    /// The faults to draw.
    pub fn faults(mut self, faults: Faults) -> Self {
        self.config.faults = faults;
        self
    }

    /// Replaces every setting.
    pub fn config(mut self, config: SimConfig) -> Self {
        self.config = config;
        self
    }

    /// The settings.
    pub fn settings(&self) -> &SimConfig {
        &self.config
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
        for seed in seeds_to_run(seeds) {
            let run = self.run(seed);
            let failure = if !run.violations.is_empty() {
                Some(format!("broke invariants: {}", run.violations.join("; ")))
            } else {
                property(&run).err()
            };
            if let Some(failure) = failure {
                let tail = run.trace.len().saturating_sub(40);
                panic!(
                    "simulation seed {seed} failed: {failure}\nstats: {:?}\nlast steps:\n  {}\nreplay: {}",
                    run.stats,
                    run.trace[tail..].join("\n  "),
                    run.replay_command()
                );
            }
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

/// `msg` as the receiving side of a wire gets it, if it carries a result: encoded and
/// decoded (always in the simulator: a result type that breaks over TCP breaks here); the
/// error is the one a TCP peer would report.
fn wire_copy<T: Payload>(
    msg: T,
    carries_result: bool,
    direction: impl FnOnce() -> String,
) -> Result<T, JobError> {
    if !carries_result {
        return Ok(msg);
    }
    crate::codec::through_wire(msg, direction).map_err(|u| u.sent_by("the simulated network"))
}

/// A node's connection generation: a message sent over a connection that has since died
/// is lost with it.
type Generation = u32;

enum Event<M, W> {
    WorkerStarted {
        rank: Rank,
        generation: Generation,
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
        sent: ToMaster<W>,
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
    MasterRestart,
    Reconnect {
        rank: Rank,
        generation: Generation,
    },
}

struct Node<M, W> {
    generation: Generation,
    alive: bool,
    ready: bool,
    busy: bool,
    attempt: Attempt,
    computable: DynWorker<M, W>,
    ctx: WorkerContext<M, W>,
    state: WorkerState,
    mailbox: VecDeque<ToWorker<M>>,
}

struct Master<M, W> {
    alive: bool,
    generation: Generation,
    gate: Gate<W>,
    schedule: Schedule,
    recovery: Recovery,
    computable: DynMaster<M, W>,
    ctx: MasterContext<M, W>,
    last: Option<Arc<M>>,
    resumed: Iteration,
    /// Whether the checkpoint resumed from halted the job.
    resumed_halted: bool,
    timer: Option<Instant>,
    /// The iteration the gate gathers, if it does.
    in_round: Option<Iteration>,
}

struct World<'s, M, W> {
    sim: &'s Simulation<M, W>,
    config: &'s SimConfig,
    rng: ChaCha8Rng,
    base: Instant,
    now: Duration,
    seq: u64,
    queue: BinaryHeap<Reverse<(Duration, u64)>>,
    events: std::collections::HashMap<u64, Event<M, W>>,
    master: Master<M, W>,
    nodes: Vec<Node<M, W>>,
    store: MemoryCheckpointStore,
    job_id: Arc<str>,
    highest_attempt: Attempt,
    worker_crashes: u32,
    outcome: Option<Result<SimOutcome<M>, JobError>>,
    stats: SimStats,
    trace: Vec<String>,
    violations: Vec<String>,
    /// Per rank: the (attempt, iteration) of each result it sent.
    sent: Vec<Vec<(Attempt, Iteration)>>,
}

const LATENCY_US: Range<u64> = 50..500;
const HEARTBEAT_TIMEOUT: Duration = Duration::from_millis(30);
const RETRANSMIT: Duration = Duration::from_millis(25);
const MAX_EVENTS: u64 = 2_000_000;

impl<'s, M: Payload, W: Payload> World<'s, M, W> {
    fn new(sim: &'s Simulation<M, W>, seed: u64) -> Self {
        let config = &sim.config;
        let base = Instant::now();
        let job_id: Arc<str> = Arc::from("sim");
        let master = Master {
            alive: true,
            generation: 0,
            gate: Gate::new(Self::gate_config(config, 0), base),
            schedule: Schedule::new(config.iterations, config.workers, config.worker_halt),
            recovery: Recovery::new(config.policy, config.workers, config.quorum(), 0),
            computable: (sim.master)(),
            ctx: MasterContext::new(config.workers, Arc::clone(&job_id), config.iterations),
            last: None,
            resumed: 0,
            resumed_halted: false,
            timer: None,
            in_round: None,
        };
        let mut world = World {
            sim,
            config,
            rng: ChaCha8Rng::seed_from_u64(seed),
            base,
            now: Duration::ZERO,
            seq: 0,
            queue: BinaryHeap::new(),
            events: std::collections::HashMap::new(),
            master,
            nodes: Vec::new(),
            store: MemoryCheckpointStore::new(),
            job_id,
            highest_attempt: 0,
            worker_crashes: 0,
            outcome: None,
            stats: SimStats::default(),
            trace: Vec::new(),
            violations: Vec::new(),
            sent: vec![Vec::new(); config.workers],
        };
        for rank in 0..config.workers {
            let node = world.spawn(rank, 0, 0);
            world.nodes.push(node);
        }
        world
    }

    fn gate_config(config: &SimConfig, attempt: Attempt) -> GateConfig {
        GateConfig::new(
            config.workers,
            attempt,
            [
                config.startup_timeout,
                config.iteration_timeout,
                Duration::from_secs(1),
            ],
        )
        .with_quorum(config.quorum(), config.min_workers_timeout)
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

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.random_bool(p.min(1.0))
    }

    fn latency(&mut self) -> Duration {
        let mut us = self.rng.random_range(LATENCY_US);
        if self.chance(self.config.faults.delay) {
            let max = self.config.faults.max_delay.as_micros().max(1) as u64;
            us += self.rng.random_range(0..max);
        }
        Duration::from_micros(us)
    }

    /// A new worker process for `rank`: its code runs `init`, then it registers.
    fn spawn(&mut self, rank: Rank, generation: Generation, attempt: Attempt) -> Node<M, W> {
        let mut computable = (self.sim.workers)(rank);
        let mut ctx = WorkerContext::new(
            rank,
            self.config.workers,
            Arc::clone(&self.job_id),
            self.config.iterations,
        );
        let init = computable.init(&mut ctx);
        let startup = Duration::from_micros(self.rng.random_range(500..5_000));
        match init {
            Ok(()) => self.at(startup, Event::WorkerStarted { rank, generation }),
            Err(e) => {
                let error = JobError::Worker {
                    rank,
                    iteration: 0,
                    phase: Phase::Init,
                    cause: Cause::from_error(e),
                };
                self.send_to_master(rank, ToMaster::Failed { attempt, error });
            }
        }
        Node {
            generation,
            alive: true,
            ready: false,
            busy: false,
            attempt,
            computable,
            ctx,
            state: WorkerState::new(attempt),
            mailbox: VecDeque::new(),
        }
    }

    fn send_to_master(&mut self, from: Rank, msg: ToMaster<W>) {
        let generation = self.master.generation;
        let latency = self.latency();
        let is_result = msg.carries_result();
        // Every result crosses the wire encoding, as it would between processes: what
        // arrives is the decoded copy, or the job fails as it would over TCP.
        let attempt = match &msg {
            ToMaster::Result(report) => report.attempt,
            _ => 0,
        };
        let msg = wire_copy(msg, is_result, || format!("worker {from} → master"))
            .unwrap_or_else(|error| ToMaster::Failed { attempt, error });
        if is_result && self.chance(self.config.faults.duplicate) {
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
        let latency = if is_result && self.chance(self.config.faults.drop) {
            latency + RETRANSMIT
        } else {
            latency
        };
        self.at(
            latency,
            Event::ToMaster {
                generation,
                from,
                msg,
            },
        );
    }

    fn send_to_worker(&mut self, rank: Rank, msg: ToWorker<M>) {
        let carries = msg.carries_result();
        let msg = match wire_copy(msg, carries, || format!("master → worker {rank}")) {
            Ok(msg) => msg,
            // The worker could not read it: the job fails, as over TCP.
            Err(error) => return self.on_failure(error),
        };
        let generation = self.nodes[rank].generation;
        let latency = self.latency();
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
                let gate = format!(
                    "{:?}",
                    self.master.gate.poll_timeout().map(|t| t - self.base)
                );
                self.violations.push(format!(
                    "the run stalled: nothing left to happen (gate deadline {gate})"
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
        let drops = self.master.gate.drops();
        self.stats.drops.stale += drops.stale;
        self.stats.drops.duplicate += drops.duplicate;
        self.stats.drops.unknown_rank += drops.unknown_rank;
        self.stats.lost = self.master.gate.lost();
        SimRun {
            seed: 0,
            outcome: self.outcome.expect("the loop ends with an outcome"),
            stats: self.stats,
            trace: self.trace,
            violations: self.violations,
        }
    }

    fn arm_timer(&mut self) {
        if !self.master.alive || self.outcome.is_some() {
            return;
        }
        let deadline = self.master.gate.poll_timeout();
        if deadline != self.master.timer {
            self.master.timer = deadline;
            if let Some(at) = deadline {
                let after = at.saturating_duration_since(self.instant());
                let master = self.master.generation;
                self.at(after, Event::Timer { master, at });
            }
        }
    }

    fn handle(&mut self, event: Event<M, W>) {
        match event {
            Event::WorkerStarted { rank, generation } => {
                if !self.is_current(rank, generation) {
                    return;
                }
                self.nodes[rank].ready = true;
                let attempt = self.nodes[rank].attempt;
                self.log(|| format!("worker {rank} started, registers in attempt {attempt}"));
                self.send_to_master(rank, ToMaster::Registered { attempt });
                self.work_mailbox(rank);
            }
            Event::ToMaster {
                generation,
                from,
                msg,
            } => {
                if !self.master.alive || generation != self.master.generation {
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
                self.nodes[rank].mailbox.push_back(msg);
                self.work_mailbox(rank);
            }
            Event::Computed {
                rank,
                generation,
                sent,
                then_crash,
            } => {
                if !self.is_current(rank, generation) {
                    return;
                }
                if let ToMaster::Result(r) = &sent {
                    self.sent[rank].push((r.attempt, r.iteration));
                }
                self.nodes[rank].busy = false;
                self.send_to_master(rank, sent);
                if then_crash {
                    self.crash_worker(rank, "right after its result left");
                } else {
                    self.work_mailbox(rank);
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
                if !self.master.alive
                    || master != self.master.generation
                    || node.generation != generation
                    || node.alive
                {
                    return;
                }
                self.log(|| format!("the master notices worker {rank} is gone"));
                self.on_failure(JobError::WorkerLost {
                    rank,
                    reason: "its heartbeats stopped (simulated crash)".into(),
                });
            }
            Event::Timer { master, at } => {
                if !self.master.alive
                    || master != self.master.generation
                    || self.master.timer != Some(at)
                {
                    return;
                }
                self.master.timer = None;
                let now = self.instant();
                if let Some(output) = self.master.gate.handle_timeout(now) {
                    self.on_gate(output);
                }
            }
            Event::MasterCrash { master } => {
                if self.master.alive && master == self.master.generation {
                    self.crash_master("while it gathered results");
                }
            }
            Event::MasterRestart => self.restart_master(),
            Event::Reconnect { rank, generation } => {
                if !self.is_current(rank, generation) || !self.master.alive {
                    return;
                }
                let attempt = self.master.gate.attempt();
                let node = &mut self.nodes[rank];
                node.mailbox.clear();
                // As a worker's transport tells it after each handshake; only a stopping
                // worker (whose job ended) does not register again.
                let connected = ToWorker::<M>::Connected { attempt };
                if node.state.on_message(&connected) != WorkerCommand::Register(attempt) {
                    return;
                }
                node.attempt = attempt;
                if !node.ready {
                    // Still starting: it registers in the new attempt once started.
                    return;
                }
                self.log(|| format!("worker {rank} reconnects, registers in attempt {attempt}"));
                self.send_to_master(rank, ToMaster::Registered { attempt });
            }
        }
    }

    fn is_current(&self, rank: Rank, generation: Generation) -> bool {
        let node = &self.nodes[rank];
        node.alive && node.generation == generation
    }

    /// Works through what arrived while the worker started or computed: acts on each
    /// message in order, and of several iterations computes only the newest.
    fn work_mailbox(&mut self, rank: Rank) {
        let node = &mut self.nodes[rank];
        if !node.ready || node.busy {
            return;
        }
        let mut compute = None;
        while let Some(msg) = node.mailbox.pop_front() {
            match node.state.on_message(&msg) {
                WorkerCommand::Compute(iteration) => {
                    if let ToWorker::Iterate { last, .. } = msg {
                        compute = Some((iteration, last));
                    }
                }
                WorkerCommand::Stop => {
                    node.mailbox.clear();
                    return;
                }
                // `Connected` comes with a reconnect, never through the mailbox.
                WorkerCommand::Answer
                | WorkerCommand::Register(_)
                | WorkerCommand::Proceed
                | WorkerCommand::Drop => {}
            }
        }
        if let Some((iteration, last)) = compute {
            self.compute(rank, iteration, last);
        }
    }

    fn compute(&mut self, rank: Rank, iteration: Iteration, last: Option<Arc<M>>) {
        let faults = self.config.faults;
        let slow = self.chance(faults.slow);
        let crash = self.worker_crashes < faults.max_crashes && self.chance(faults.worker_crash);
        let during = crash && self.rng.random_bool(0.5);
        let mut took = Duration::from_micros(self.rng.random_range(1_000..10_000));
        if slow {
            took *= 20;
        }
        let node = &mut self.nodes[rank];
        node.ctx.iteration = iteration;
        // `None` in iteration 1 — also when a restarted job starts over.
        node.ctx.last = last;
        node.ctx.result = None;
        node.ctx.halt_vote = false;
        let result = node.computable.compute(&mut node.ctx);
        let attempt = node.attempt;
        let generation = node.generation;
        let sent = match result {
            Ok(result) => ToMaster::Result(Report {
                attempt,
                iteration,
                result,
                halt_vote: node.ctx.halt_vote,
                elapsed: took,
            }),
            Err(e) => ToMaster::Failed {
                attempt,
                error: JobError::Worker {
                    rank,
                    iteration,
                    phase: Phase::Compute,
                    cause: Cause::from_error(e),
                },
            },
        };
        node.busy = true;
        self.log(|| {
            format!(
                "worker {rank} computes iteration {iteration} of attempt {attempt}{}",
                if slow { " (slowly)" } else { "" }
            )
        });
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
                    sent,
                    then_crash: crash,
                },
            );
        }
    }

    fn crash_worker(&mut self, rank: Rank, when: &str) {
        let node = &mut self.nodes[rank];
        node.alive = false;
        node.busy = false;
        node.mailbox.clear();
        let generation = node.generation;
        self.stats.worker_crashes += 1;
        self.log(|| format!("worker {rank} crashes {when}"));
        let master = self.master.generation;
        self.at(
            HEARTBEAT_TIMEOUT,
            Event::Noticed {
                rank,
                generation,
                master,
            },
        );
    }

    fn deliver_to_master(&mut self, from: Rank, msg: ToMaster<W>) {
        let now = self.instant();
        let checked = match &msg {
            ToMaster::Result(r) => Some((r.attempt, r.iteration)),
            _ => None,
        };
        let before = self.master.gate.drops().total();
        let output = self.master.gate.on_message(now, Envelope { from, msg });
        if let Some((attempt, iteration)) = checked {
            let kept = self.master.gate.drops().total() == before;
            let current = (self.master.gate.attempt(), self.master.gate_iteration());
            if kept && Some((attempt, iteration)) != current.1.map(|i| (current.0, i)) {
                self.violations.push(format!(
                    "a result of rank {from} for attempt {attempt} iteration {iteration} was kept while the gate was at {current:?}"
                ));
            }
        }
        if let Some(output) = output {
            self.on_gate(output);
        }
    }

    fn on_gate(&mut self, output: GateOutput<W>) {
        match output {
            GateOutput::AllRegistered => {
                self.master.recovery.all_registered();
                let attempt = self.master.gate.attempt();
                self.log(|| format!("every worker registered in attempt {attempt}"));
                let next = self.master.resumed + 1;
                if self.master.resumed >= self.config.iterations || self.master.resumed_halted {
                    let last = self.master.last.clone();
                    if let Some(last) = last {
                        let halted = self.master.resumed_halted;
                        self.finish(self.master.resumed, halted, last);
                        return;
                    }
                }
                self.begin(next);
            }
            GateOutput::RoundComplete {
                iteration,
                gathered,
            } => {
                self.master.in_round = None;
                self.stats.rounds += 1;
                let quorum = self.config.quorum();
                if gathered.reported.len() < quorum {
                    self.violations.push(format!(
                        "iteration {iteration} completed with ranks {:?}, short of its quorum {quorum}",
                        gathered.reported
                    ));
                }
                let attempt = self.master.gate.attempt();
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
                self.log(|| {
                    format!(
                        "iteration {iteration} complete with ranks {:?} (left out {:?})",
                        gathered.reported, gathered.left_out
                    )
                });
                self.master_compute(iteration, gathered);
            }
            GateOutput::Rejoined { rank, iteration } => {
                self.master.recovery.rejoined(rank);
                self.log(|| format!("worker {rank} rejoined"));
                if let Some(iteration) = iteration {
                    let msg = ToWorker::Iterate {
                        attempt: self.master.gate.attempt(),
                        iteration,
                        last: self.master.last.clone(),
                    };
                    self.send_to_worker(rank, msg);
                }
            }
            GateOutput::Failed(error) => self.on_failure(error),
            GateOutput::Drained { .. } => {}
        }
    }

    fn begin(&mut self, iteration: Iteration) {
        let now = self.instant();
        if !self.master.gate.open(now, iteration) {
            self.violations
                .push(format!("the gate would not open iteration {iteration}"));
            return;
        }
        self.master.in_round = Some(iteration);
        let attempt = self.master.gate.attempt();
        for rank in 0..self.config.workers {
            let msg = ToWorker::Iterate {
                attempt,
                iteration,
                last: self.master.last.clone(),
            };
            self.send_to_worker(rank, msg);
        }
        if self.master_may_crash() && self.rng.random_bool(0.5) {
            let at = Duration::from_micros(self.rng.random_range(0..10_000));
            let master = self.master.generation;
            self.at(at, Event::MasterCrash { master });
        }
    }

    fn master_may_crash(&mut self) -> bool {
        self.stats.master_crashes < self.config.faults.max_crashes
            && self.chance(self.config.faults.master_crash)
    }

    fn master_compute(&mut self, iteration: Iteration, gathered: crate::protocol::Gathered<W>) {
        // Where the master's process may crash once the results are in.
        let crash_at = if self.master_may_crash() {
            Some(self.rng.random_range(0..4u8))
        } else {
            None
        };
        if crash_at == Some(0) {
            return self.crash_master("before its compute");
        }
        let m = &mut self.master;
        m.ctx.enter(iteration, gathered);
        m.ctx.last = m.last.clone();
        let computed = m.computable.compute(&mut m.ctx);
        let step = match computed {
            Ok(step) => step,
            Err(e) => {
                let error = JobError::Master {
                    iteration,
                    phase: Phase::Compute,
                    cause: Cause::from_error(e),
                };
                self.log(|| format!("the master fails: {error}"));
                self.outcome = Some(Err(error));
                return;
            }
        };
        let (result, halt) = step.into_parts();
        let result = Arc::new(result);
        let m = &mut self.master;
        m.ctx.results = Vec::new();
        m.ctx.current = Some(Arc::clone(&result));
        m.last = Some(Arc::clone(&result));
        if crash_at == Some(1) {
            return self.crash_master("before its checkpoint write");
        }
        let votes = self.master.ctx.halt_votes;
        let next = self.master.schedule.decide(iteration, halt, votes);
        // Every k iterations, and the last one, as the runtime saves them.
        let last = matches!(next, Next::Finish { .. });
        let due = self
            .config
            .checkpoint_every
            .is_some_and(|k| iteration % k == 0 || last);
        if due {
            if crash_at == Some(2) {
                return self.crash_master("during its checkpoint write");
            }
            let halted = match next {
                Next::Finish { halted, .. } => halted,
                Next::Iterate(_) => None,
            };
            self.save_checkpoint(iteration, &result, halted);
        }
        if crash_at == Some(3) {
            return self.crash_master("after its checkpoint write");
        }
        match next {
            Next::Iterate(next) => self.begin(next),
            Next::Finish { iterations, halted } => {
                self.finish(iterations, halted.is_some(), result)
            }
        }
    }

    fn save_checkpoint(&mut self, iteration: Iteration, result: &M, halted: Option<HaltedBy>) {
        let encoded = match crate::codec::to_vec(result) {
            Ok(bytes) => bytes,
            Err(e) => {
                self.log(|| format!("checkpoint {iteration} skipped: {e}"));
                return;
            }
        };
        let state = match self.master.computable.save_state() {
            Ok(state) => state,
            Err(e) => {
                self.log(|| format!("checkpoint {iteration} skipped: {e}"));
                return;
            }
        };
        let checkpoint = Checkpoint {
            job_id: self.job_id.to_string(),
            iteration,
            attempt: self.master.gate.attempt(),
            master_result: encoded,
            master_state: state,
            halted,
        };
        match self.store.save(&checkpoint) {
            Ok(()) => {
                self.stats.checkpoints += 1;
                self.log(|| format!("checkpoint of iteration {iteration} saved"));
            }
            Err(e) => self.log(|| format!("checkpoint {iteration} not saved: {e}")),
        }
    }

    fn finish(&mut self, iterations: Iteration, halted: bool, result: Arc<M>) {
        self.log(|| format!("the job completes after {iterations} iterations"));
        let attempt = self.master.gate.attempt();
        for rank in 0..self.config.workers {
            let msg = ToWorker::Finish {
                attempt,
                iterations,
                halted,
                last: Arc::clone(&result),
            };
            self.send_to_worker(rank, msg);
        }
        self.outcome = Some(Ok(SimOutcome {
            result,
            iterations,
            halted,
        }));
    }

    fn on_failure(&mut self, error: JobError) {
        let Some(decision) = self.master.recovery.on_failure(error) else {
            return;
        };
        match decision {
            Recover::Fail(error) => {
                self.log(|| format!("the job fails: {error}"));
                self.outcome = Some(Err(error));
            }
            Recover::RestartWorker(rank) => {
                self.stats.worker_restarts += 1;
                self.master.gate.rejoin(rank);
                let attempt = self.master.gate.attempt();
                self.replace(rank, attempt);
                self.log(|| format!("worker {rank} is replaced"));
            }
            Recover::LeaveOut(rank) => {
                self.nodes[rank].alive = false;
                self.master.schedule.leave_out();
                self.log(|| format!("the job goes on without worker {rank}"));
                let now = self.instant();
                if let Some(output) = self.master.gate.lose(now, rank) {
                    self.on_gate(output);
                }
            }
            Recover::RestartAll(attempt) => {
                self.log(|| format!("every worker restarts as attempt {attempt}"));
                self.new_attempt(attempt, true);
                for rank in 0..self.config.workers {
                    self.replace(rank, attempt);
                }
            }
        }
    }

    /// A new process for `rank`, after the old one (if still running) was stopped.
    fn replace(&mut self, rank: Rank, attempt: Attempt) {
        let generation = self.nodes[rank].generation + 1;
        self.nodes[rank] = self.spawn(rank, generation, attempt);
    }

    /// Every node starts `attempt`: the gate fences off the old one, the master resumes
    /// from its newest checkpoint (a new computable when `fresh`).
    fn new_attempt(&mut self, attempt: Attempt, fresh: bool) {
        self.highest_attempt = self.highest_attempt.max(attempt);
        self.stats.new_attempts += 1;
        let drops = self.master.gate.drops();
        self.stats.drops.stale += drops.stale;
        self.stats.drops.duplicate += drops.duplicate;
        self.stats.drops.unknown_rank += drops.unknown_rank;
        let now = self.instant();
        self.master.gate = Gate::new(Self::gate_config(self.config, attempt), now);
        self.master.recovery.restarted(attempt);
        let c = self.config;
        self.master.schedule = Schedule::new(c.iterations, c.workers, c.worker_halt);
        self.master.timer = None;
        self.master.in_round = None;
        if fresh {
            self.master.computable = (self.sim.master)();
        }
        self.master.ctx = MasterContext::new(
            self.config.workers,
            Arc::clone(&self.job_id),
            self.config.iterations,
        );
        self.master.last = None;
        self.master.resumed = 0;
        self.master.resumed_halted = false;
        let latest = self.store.latest();
        if let Ok(Some(loaded)) = latest {
            let c = loaded.checkpoint;
            let last: Result<M, _> = crate::codec::from_slice(&c.master_result);
            match (last, self.master.computable.restore_state(&c.master_state)) {
                (Ok(last), Ok(())) => {
                    self.master.last = Some(Arc::new(last));
                    self.master.resumed = c.iteration;
                    self.master.resumed_halted = c.halted.is_some();
                    self.master.ctx.iteration = c.iteration;
                    self.log(|| {
                        format!(
                            "the master resumes from the checkpoint of iteration {}",
                            c.iteration
                        )
                    });
                }
                (Err(e), _) => {
                    self.outcome = Some(Err(JobError::Checkpoint {
                        message: format!("cannot decode the checkpoint's master result: {e}"),
                    }))
                }
                (_, Err(e)) => {
                    self.outcome = Some(Err(JobError::Master {
                        iteration: c.iteration,
                        phase: Phase::Checkpoint,
                        cause: Cause::from_error(e),
                    }))
                }
            }
        } else {
            self.log(|| "no checkpoint: the master starts from iteration 1".to_string());
        }
    }

    fn crash_master(&mut self, when: &str) {
        self.master.alive = false;
        self.master.generation += 1;
        self.stats.master_crashes += 1;
        self.log(|| format!("the master crashes {when}"));
        let after = Duration::from_micros(self.rng.random_range(20_000..100_000));
        self.at(after, Event::MasterRestart);
    }

    fn restart_master(&mut self) {
        // Workers tell the attempt they were in when they reconnect; the new master's
        // is past every one of them.
        let attempt = self.highest_attempt.max(self.master.gate.attempt()) + 1;
        self.log(|| format!("the master restarts as attempt {attempt}"));
        self.new_attempt(attempt, true);
        if self.outcome.is_some() {
            return;
        }
        self.master.alive = true;
        for rank in 0..self.config.workers {
            let node = &self.nodes[rank];
            if node.alive {
                let backoff = Duration::from_micros(self.rng.random_range(1_000..30_000));
                let generation = node.generation;
                self.at(backoff, Event::Reconnect { rank, generation });
            } else {
                self.on_failure(JobError::WorkerLost {
                    rank,
                    reason: "it did not reconnect to the restarted master (simulated crash)".into(),
                });
                if self.outcome.is_some() {
                    return;
                }
            }
        }
    }
}

impl<M, W> Master<M, W> {
    fn gate_iteration(&self) -> Option<Iteration> {
        self.in_round
    }
}
