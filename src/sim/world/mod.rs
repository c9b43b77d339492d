//! One simulated run: the world of the master's process and the workers' processes, the
//! network between them and virtual time. It only delivers, delays, drops and crashes —
//! what a message, a round or a failure means is decided by the nodes it drives, the
//! runtime's own (`protocol::MasterNode`, `protocol::WorkerNode`).
//!
//! - `clock.rs`: virtual time and the queue of events;
//! - `network.rs`: connections that deliver in order, with latency, delays, duplicates,
//!   drops, retransmits and partitions, and every message through the wire encoding;
//! - `master.rs`: the master's process — its node fed and its actions carried out, its
//!   code run, its crashes and restarts;
//! - `workers.rs`: the workers' processes — each worker's node driven, its code run (on a
//!   thread of its own in barrier mode), its crashes and relaunches.

mod clock;
mod master;
mod network;
mod workers;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::lock;
use super::store::SimStore;
use super::{Fault, SimOutcome, SimRun, SimStats, Simulation};
use crate::coordinator::Shard;
use crate::error::JobError;
use crate::ids::{Attempt, Iteration, Rank};
use crate::payload::Payload;
use crate::protocol::JobConfig;
use crate::protocol::{NodeConfig, ToMaster, ToWorker, Worked, WorkerConfig};

use clock::Clock;
use master::MasterProcess;
use network::HEARTBEAT_TIMEOUT;
use workers::Node;

/// The most events a run may take: more is a livelock, and the run fails saying so.
const MAX_EVENTS: u64 = 2_000_000;

/// A node's connection generation: a message sent over a connection that has since died
/// is lost with it.
type Generation = u32;

/// What happens at an instant of virtual time.
enum Event<M, W> {
    /// The start-up of a worker's code returned (its `init` took its time).
    WorkerStarted {
        rank: Rank,
        generation: Generation,
        worked: Worked<W>,
    },
    /// The time a compute of the worker of `rank` waits until came (its `wait`-th).
    ComputeWake {
        rank: Rank,
        generation: Generation,
        wait: u64,
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
        /// Whether its host's checkpoint store is lost with it.
        host: bool,
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
    /// The calls held back on the link of `rank`'s process `generation` have been held
    /// long enough: they go.
    CallsHeld {
        rank: Rank,
        generation: Generation,
    },
    /// A piece of a collective, or word of a peer lost, reaches the worker of `to` (of
    /// process `generation`).
    Peer {
        to: Rank,
        generation: Generation,
        event: crate::transport::PeerEvent,
    },
}

/// One run: the processes, the network, the clock, the store, and what the run found.
pub(super) struct World<'s, M: Payload, W: Payload> {
    sim: &'s Simulation<M, W>,
    job: Arc<JobConfig>,
    /// The settings the nodes run by, as the runtime builds them from the job's.
    node_config: Arc<NodeConfig>,
    worker_config: Arc<WorkerConfig>,
    rng: ChaCha8Rng,
    clock: Clock<Event<M, W>>,
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
    /// Per pair of ranks (from, to): when the last piece on their connection arrives
    /// (connections deliver in order).
    peer_arrivals: Vec<Vec<Duration>>,
    /// Per rank: the cut of the network between it and the master, if any: from when
    /// until when, and the generation of the rank's process whose connection it cut.
    cuts: Vec<Option<(Duration, Duration, Generation)>>,
    /// Each rank's shard of the job's input, as the master's process sharded it.
    shards: Option<Arc<Vec<Shard>>>,
    /// How many more times the launcher starts a dead process, when it counts
    /// ([`Simulation::launched`]).
    restarts_left: Option<u32>,
    /// Worker processes that ended on their worker's failure under a policy whose
    /// failures restart every worker, and why: the master's node would have started
    /// them over, so the job must not go on after one.
    ended_on_failure: Vec<String>,
}

impl<'s, M: Payload, W: Payload> World<'s, M, W> {
    pub(super) fn new(sim: &'s Simulation<M, W>, seed: u64) -> Self {
        let job = Arc::clone(&sim.job);
        let job_id: Arc<str> = Arc::from(job.job_id.as_str());
        // Checked before any run (`check`, which fails with the settings' error); a run
        // made directly (`run`) of settings that do not settle runs by them as they are.
        let node_config = Arc::new(sim.node_config().unwrap_or_else(|_| {
            crate::protocol::NodeConfig::unsettled(Arc::clone(&job), &sim.deployment())
        }));
        let workers = job.workers;
        // A compute's calls wait in virtual time (the simulator wakes them at the time
        // they wait until): their limits are the job's, as in the runtime.
        let worker_config = Arc::new(node_config.worker());
        let mut world = World {
            sim,
            job,
            node_config,
            worker_config,
            rng: ChaCha8Rng::seed_from_u64(seed),
            clock: Clock::new(),
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
            peer_arrivals: vec![vec![Duration::ZERO; workers]; workers],
            shards: None,
            restarts_left: sim.launched,
            ended_on_failure: Vec::new(),
        };
        let checkpoints = sim
            .checkpoint_every
            .map_or(Ok(()), crate::job::check_checkpoint_every);
        let messages = crate::job::check_messages(sim.messages, &world.job);
        let params = sim.params.as_ref().map(|_| ()).map_err(Clone::clone);
        if let Err(error) = world
            .job
            .validate()
            .and(checkpoints)
            .and(messages)
            .and(params)
        {
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
            world
                .clock
                .at(at, Event::MasterCrashNow { master: 0, when });
        }
        for rank in 0..workers {
            let node = world.spawn(rank, (0, 0), 0);
            world.nodes.push(node);
            world.start_worker(rank);
        }
        world.drive();
        world
    }

    fn log(&mut self, line: impl FnOnce() -> String) {
        let line = line();
        self.trace.push(format!(
            "{:>10.3} ms  {line}",
            self.clock.now.as_secs_f64() * 1e3
        ));
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

    pub(super) fn run(mut self) -> SimRun<M> {
        let mut handled = 0u64;
        while self.outcome.is_none() {
            let Some(event) = self.clock.next() else {
                let deadline = self
                    .master
                    .as_ref()
                    .and_then(|m| m.node.poll_timeout())
                    .map(|t| self.clock.since_start(t));
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
            self.handle(event);
            self.arm_timer();
        }
        if matches!(self.outcome, Some(Ok(_))) {
            // A process whose worker failed waits for the master's word: a gang restart
            // starts it over. One that ended instead cost the launcher a restart the job
            // did not need (and without one left, the job).
            for ended in std::mem::take(&mut self.ended_on_failure) {
                self.violations.push(format!(
                    "{ended}, under a policy that restarts every worker, and the job went on"
                ));
            }
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
                let now = self.clock.instant();
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
                let now = self.clock.instant();
                self.nodes[rank].worker.handle_timeout(now);
                self.drive_worker(rank);
            }
            Event::ComputeWake {
                rank,
                generation,
                wait,
            } => self.wake(rank, generation, wait),
            Event::CallsHeld { rank, generation } => {
                let node = &self.nodes[rank];
                if node.alive && node.pid == generation {
                    self.send_held(rank);
                }
            }
            Event::Peer {
                to,
                generation,
                event,
            } => {
                if self.process_current(to, generation) {
                    self.deliver_to_peer(to, event);
                }
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
                if !self.process_current(rank, generation) {
                    return;
                }
                self.stats.messages += 1;
                if let ToWorker::Replica(replica) = &msg {
                    let iteration = replica.iteration;
                    self.log(|| format!("worker {rank}'s process gets a copy of the checkpoint of iteration {iteration}"));
                }
                self.reach_process(rank, msg);
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
                let now = self.clock.instant();
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
                    || node.pid != generation
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
            Event::MasterCrash { master, host } => {
                let gathering = self
                    .master
                    .as_ref()
                    .is_some_and(|m| m.node.gathering().is_some());
                if gathering && master == self.master_generation {
                    if host {
                        self.lose_host();
                    }
                    self.crash_master("while it gathered results");
                }
            }
            Event::Silence {
                rank,
                generation,
                master,
            } => {
                // (Only the connection of the process it cut: a later one is another.)
                let same = self.nodes.get(rank).is_some_and(|n| n.pid == generation);
                if same && master == self.master_generation && self.master.is_some() {
                    self.log(|| format!("the master hears nothing from worker {rank}"));
                    self.lost(rank, "its heartbeats stopped (a network partition)");
                }
                if self.process_current(rank, generation) {
                    // Its transport gives up on the master it cannot hear, and tells it so
                    // (as a TCP worker without a reconnect timeout does).
                    let error = JobError::MasterLost {
                        reason: format!(
                            "worker {rank} heard nothing from the master for {HEARTBEAT_TIMEOUT:?}"
                        ),
                    };
                    self.log(|| format!("worker {rank} hears nothing from the master"));
                    let now = self.clock.instant();
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
                if self.nodes[rank].pid != generation || self.outcome.is_some() {
                    return;
                }
                let Some(m) = &self.master else {
                    // No master to connect to yet: the process keeps trying.
                    let retry = Duration::from_millis(10);
                    return self.clock.at(retry, Event::Relaunch { rank, generation });
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
                if !self.process_current(rank, generation) || self.nodes[rank].last_word {
                    return;
                }
                let attempt = m.node.attempt();
                self.nodes[rank].master = self.master_generation;
                self.log(|| format!("worker {rank} reaches the master again (attempt {attempt})"));
                // As a worker's transport tells its process after each handshake.
                self.reach_process(rank, ToWorker::Connected { attempt });
            }
        }
    }
}
