//! What a simulated run tells, and checking many: a run's outcome, its counts, its trace and
//! the invariants it broke; [`Simulation::check`] over many seeds, the failure it reports,
//! and the one line that replays it (its seed and its fault schedule, from the variables
//! read here).

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use super::{Fault, Simulation};
use crate::error::JobError;
use crate::ids::{Iteration, Rank};
use crate::payload::Payload;
use crate::protocol::Drops;

/// The variable that replays one seed: `SUPERSTEP_SIM_SEED=<seed> cargo test <test>`.
pub const SEED_VAR: &str = "SUPERSTEP_SIM_SEED";
/// The variable that sets how many seeds [`Simulation::check`] runs, for long runs.
pub const SEEDS_VAR: &str = "SUPERSTEP_SIM_SEEDS";
/// The variable that replays a fault schedule (JSON, as a failure prints it) in place of
/// the one [`Simulation::check`] would run.
pub const SCHEDULE_VAR: &str = "SUPERSTEP_SIM_SCHEDULE";

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

impl<M: Payload, W: Payload> Simulation<M, W> {
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
