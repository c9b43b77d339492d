//! What a simulated run tells, and checking many: a run's outcome, its counts, its trace and
//! the invariants it broke; [`Simulation::check`] over many seeds, the failure it reports,
//! and the one line that replays it (its seed and its fault schedule, from the variables
//! read here).

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use super::{Fault, Simulation};
use crate::error::{ConfigError, JobError};
use crate::ids::{Iteration, Rank};
use crate::payload::Payload;
use crate::protocol::Drops;

/// The variable that replays one seed: `SUPERSTEP_SIM_SEED=<seed> cargo test <test>`.
pub const SEED_VAR: &str = "SUPERSTEP_SIM_SEED";
/// The variable that sets how many seeds [`Simulation::check`] runs, for long runs. It
/// does not change [`Simulation::try_check`]: inside a property test, that runs once per
/// case, and the test's own case count is what to raise (`PROPTEST_CASES`).
pub const SEEDS_VAR: &str = "SUPERSTEP_SIM_SEEDS";
/// The variable that runs a fault schedule (JSON, as [`Fault`]s serialize) in place of
/// the one the simulation has, to try one by hand. A failure's replay line does not need
/// it: the schedule is the test's own, or its property test's saved failing case.
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
    /// Times the master's host was lost with its checkpoints
    /// ([`Fault::MasterHostLost`], [`Faults::host_lost`](super::Faults::host_lost)).
    pub hosts_lost: u32,
    /// Times a master started again resumed from a worker's copy of a checkpoint, newer
    /// than its own store had (`JobConfig::checkpoint_replicas`).
    pub resumed_from_copies: u32,
    /// Iterations computed by the master, over every attempt (redone ones included).
    pub rounds: u32,
    /// Arrivals the master's gates dropped (stale, duplicate).
    pub drops: Drops,
    /// Messages delivered (to the master, to workers, and between workers).
    pub messages: u64,
    /// Of those, the pieces delivered between workers: of collectives, barriers, folds
    /// among the workers and messages between supersteps.
    pub pieces: u64,
    /// The longest a worker's compute waited in one sync call or collective, in virtual
    /// time: a lost peer or a failed job releases every wait, so it stays within the
    /// job's bounds.
    pub longest_wait: std::time::Duration,
}

/// What a passing [`Simulation::check`] exercised, summed over its seeds, so that a run
/// that passes can be read: how many seeds, and the faults and recoveries they went
/// through (its `Display` is one line of them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Checked {
    /// Seeds run.
    pub seeds: u64,
    /// Workers that crashed.
    pub worker_crashes: u64,
    /// Times the master's process crashed.
    pub master_crashes: u64,
    /// Of those, times its host was lost with its checkpoints.
    pub hosts_lost: u64,
    /// Workers replaced (`FailurePolicy::RestartWorker`).
    pub worker_restarts: u64,
    /// Attempts started after the first (gang restarts and restarted masters).
    pub new_attempts: u64,
    /// Checkpoints saved.
    pub checkpoints: u64,
    /// Damaged checkpoints skipped for an older one.
    pub skipped_checkpoints: u64,
    /// Resumes from a worker's copy of a checkpoint.
    pub resumed_from_copies: u64,
    /// Iterations computed by the master, redone ones included.
    pub rounds: u64,
}

impl Checked {
    fn add(&mut self, stats: &SimStats) {
        self.seeds += 1;
        self.worker_crashes += u64::from(stats.worker_crashes);
        self.master_crashes += u64::from(stats.master_crashes);
        self.hosts_lost += u64::from(stats.hosts_lost);
        self.worker_restarts += u64::from(stats.worker_restarts);
        self.new_attempts += u64::from(stats.new_attempts);
        self.checkpoints += u64::from(stats.checkpoints);
        self.skipped_checkpoints += u64::from(stats.skipped_checkpoints);
        self.resumed_from_copies += u64::from(stats.resumed_from_copies);
        self.rounds += u64::from(stats.rounds);
    }
}

impl std::fmt::Display for Checked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} seeds: {} worker crashes, {} master crashes ({} with their host), {} workers replaced, {} new attempts, {} checkpoints ({} damaged ones skipped, {} resumes from a worker's copy), {} rounds",
            self.seeds,
            self.worker_crashes,
            self.master_crashes,
            self.hosts_lost,
            self.worker_restarts,
            self.new_attempts,
            self.checkpoints,
            self.skipped_checkpoints,
            self.resumed_from_copies,
            self.rounds
        )
    }
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
    /// The command that replays this run, to paste as it is: its seed, and `cargo test`
    /// of the package, profile, test target and test that ran it —
    /// `SUPERSTEP_SIM_SEED=4 cargo test -p app --release --test recovery my_test -- --exact`.
    /// The rest of the case comes back as it was made: the test's own schedule and
    /// settings, or — in a property test — the failing case proptest saved, which it runs
    /// first. A test of superstep itself gets the features it ran with (`--features
    /// sim,…`); another package's features are not known to its tests: a test that needs
    /// its own package's features needs them added.
    pub fn replay_command(&self) -> String {
        let exe = std::env::current_exe().ok();
        let package = std::env::var("CARGO_PKG_NAME").ok();
        let test = std::thread::current()
            .name()
            .filter(|n| *n != "main")
            .map(str::to_string);
        replay_line(
            self.seed,
            exe.as_deref(),
            package.as_deref(),
            test.as_deref(),
        )
    }
}

impl<M: Payload, W: Payload> Simulation<M, W> {
    /// Runs `seeds` (or only the seed in `SUPERSTEP_SIM_SEED`, or `0..SUPERSTEP_SIM_SEEDS`
    /// when set) and checks each run: it must break no invariant, and `property` must
    /// hold for it. On the first failure, panics with the seed, the end of its trace and
    /// the command that replays it; when every seed passes, returns what they exercised
    /// ([`Checked`]: a passing run can be read, `println!("{checked}")`).
    pub fn check(
        &self,
        seeds: Range<u64>,
        property: impl Fn(&SimRun<M>) -> Result<(), String>,
    ) -> Checked {
        match self.check_seeds(seeds_to_run(seeds), property) {
            Ok(checked) => checked,
            Err(failure) => panic!("{failure}"),
        }
    }

    /// Like [`check`](Simulation::check), but returns the first failure instead of
    /// panicking — for use inside `proptest!`, say, whose shrinking then looks for a
    /// smaller case. It runs `seeds`, or only the seed in `SUPERSTEP_SIM_SEED` (to replay
    /// a failure); `SUPERSTEP_SIM_SEEDS` does not multiply a property test's every case
    /// (raise `PROPTEST_CASES` for a longer run).
    ///
    /// Settings the job cannot run with fail at once as what they are
    /// ([`SimFailure::Settings`]), before any seed runs.
    pub fn try_check(
        &self,
        seeds: Range<u64>,
        property: impl Fn(&SimRun<M>) -> Result<(), String>,
    ) -> Result<(), Box<SimFailure>> {
        // `()`, not what it exercised: a property test's closure returns it as it is.
        self.check_seeds(replayed_seed(seeds), property).map(drop)
    }

    fn check_seeds(
        &self,
        seeds: Range<u64>,
        property: impl Fn(&SimRun<M>) -> Result<(), String>,
    ) -> Result<Checked, Box<SimFailure>> {
        let mut checked = Checked::default();
        if let Err(error) = self.node_config() {
            return Err(Box::new(SimFailure::Settings(error)));
        }
        let replayed;
        let sim = match schedule_to_replay() {
            Some(schedule) => {
                replayed = self.clone().schedule(schedule);
                &replayed
            }
            None => self,
        };
        for seed in seeds {
            let run = sim.run(seed);
            let failure = if !run.violations.is_empty() {
                Some(format!("broke invariants: {}", run.violations.join("; ")))
            } else {
                property(&run).err()
            };
            if let Some(failure) = failure {
                let tail = run.trace.len().saturating_sub(40);
                return Err(Box::new(SimFailure::Run(RunFailure {
                    seed,
                    failure,
                    stats: run.stats.clone(),
                    last_steps: run.trace[tail..].to_vec(),
                    replay: run.replay_command(),
                })));
            }
            checked.add(&run.stats);
        }
        Ok(checked)
    }
}

/// Why a [`Simulation::check`] failed: the job's settings, or a run.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum SimFailure {
    /// The job's settings are invalid: no seed ran (the same settings fail `Job::run`).
    Settings(ConfigError),
    /// A run broke an invariant or the property checked.
    Run(RunFailure),
}

impl SimFailure {
    /// The failed run, when a run failed.
    pub fn run(&self) -> Option<&RunFailure> {
        match self {
            SimFailure::Run(run) => Some(run),
            SimFailure::Settings(_) => None,
        }
    }
}

impl fmt::Display for SimFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimFailure::Settings(error) => {
                write!(f, "the simulated job's settings are invalid: {error}")
            }
            SimFailure::Run(run) => run.fmt(f),
        }
    }
}

impl std::error::Error for SimFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SimFailure::Settings(error) => Some(error),
            SimFailure::Run(_) => None,
        }
    }
}

/// A simulated run that broke an invariant or the property checked: its seed, what went
/// wrong, the command that replays it and the end of its trace. Its `Display` says all of
/// it, the replay line on a line of its own (a test harness that adds a period after the
/// message adds it elsewhere).
#[derive(Debug, Clone)]
pub struct RunFailure {
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

impl fmt::Display for RunFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "simulation seed {} failed: {}\nreplay with:\n    {}\nstats: {:?}\nlast steps:\n  {}\n",
            self.seed,
            self.failure,
            self.replay,
            self.stats,
            self.last_steps.join("\n  "),
        )
    }
}

/// `SUPERSTEP_SIM_SEED=<seed> cargo test …` for a test binary at `exe` (its name and
/// directory tell the target and the profile) of `package`, running `test`.
fn replay_line(
    seed: u64,
    exe: Option<&std::path::Path>,
    package: Option<&str>,
    test: Option<&str>,
) -> String {
    let mut line = format!("{SEED_VAR}={seed} cargo test");
    if let Some(package) = package {
        line.push_str(&format!(" -p {package}"));
    }
    // This crate's own tests need the features they ran with (their targets require
    // them); another package's superstep has the features its manifest gives it.
    let features = if package == Some(env!("CARGO_PKG_NAME")) {
        own_features()
    } else {
        String::new()
    };
    let dir = |p: Option<&std::path::Path>| {
        p.and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
            .map(str::to_string)
    };
    if let Some(exe) = exe {
        // Cargo's test binaries are in `target/<profile>/deps/`.
        let kind = exe.parent();
        let in_deps = dir(kind).as_deref() == Some("deps");
        match dir(kind.and_then(|d| d.parent())).as_deref() {
            _ if !in_deps => {}
            Some("debug") | None => {}
            Some("release") => line.push_str(" --release"),
            Some(other) => line.push_str(&format!(" --profile {other}")),
        }
        line.push_str(&features);
        // A test binary is `<target>-<16 hex digits>`, in `deps/`.
        let stem = exe.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        let target = match stem.rsplit_once('-') {
            Some((name, hash))
                if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) =>
            {
                Some(name)
            }
            _ => None,
        };
        let lib = package.map(|p| p.replace('-', "_"));
        match target {
            Some(name) if in_deps && Some(name) == lib.as_deref() => line.push_str(" --lib"),
            Some(name) if in_deps => line.push_str(&format!(" --test {name}")),
            _ => {}
        }
    }
    if let Some(test) = test {
        line.push_str(&format!(" {test} -- --exact"));
    }
    line
}

/// The features of this build of superstep beyond its default, as `cargo test` takes them:
/// ` --features sim,…` (and ` --no-default-features` without the default `tcp`).
fn own_features() -> String {
    let features = [
        ("sim", cfg!(feature = "sim")),
        ("pipeline", cfg!(feature = "pipeline")),
        ("proptest", cfg!(feature = "proptest")),
        ("launcher", cfg!(feature = "launcher")),
        ("metrics", cfg!(feature = "metrics")),
        ("object-store", cfg!(feature = "object-store")),
    ];
    let on: Vec<&str> = features
        .iter()
        .filter(|(_, on)| *on)
        .map(|(name, _)| *name)
        .collect();
    let mut flags = String::new();
    if !cfg!(feature = "tcp") {
        flags.push_str(" --no-default-features");
    }
    if !on.is_empty() {
        flags.push_str(&format!(" --features {}", on.join(",")));
    }
    flags
}

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

/// A variable's whole number, if set and one.
fn number_var(name: &str) -> Option<u64> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
}

/// The seed in `SUPERSTEP_SIM_SEED` alone, else `default`: what
/// [`Simulation::try_check`] runs.
fn replayed_seed(default: Range<u64>) -> Range<u64> {
    match number_var(SEED_VAR) {
        Some(seed) => seed..seed + 1,
        None => default,
    }
}

/// The seeds [`Simulation::check`] runs: the one in `SUPERSTEP_SIM_SEED`, else
/// `0..SUPERSTEP_SIM_SEEDS` (from `default`'s start), else `default`.
pub fn seeds_to_run(default: Range<u64>) -> Range<u64> {
    if number_var(SEED_VAR).is_some() {
        return replayed_seed(default);
    }
    match number_var(SEEDS_VAR) {
        Some(n) => default.start..default.start + n,
        None => default,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn the_replay_line_names_the_package_profile_target_and_test_and_ends_with_no_period() {
        let exe = Path::new("/w/target/debug/deps/sim_properties-0123456789abcdef");
        assert_eq!(
            replay_line(4, Some(exe), Some("my-app"), Some("a::case")),
            "SUPERSTEP_SIM_SEED=4 cargo test -p my-app --test sim_properties a::case -- --exact"
        );
        let lib = Path::new("/w/target/release/deps/my_app-0123456789abcdef");
        assert_eq!(
            replay_line(0, Some(lib), Some("my-app"), Some("sim::t")),
            "SUPERSTEP_SIM_SEED=0 cargo test -p my-app --release --lib sim::t -- --exact"
        );
        let custom = Path::new("/w/target/ci/deps/runs-fedcba9876543210");
        assert_eq!(
            replay_line(9, Some(custom), None, None),
            "SUPERSTEP_SIM_SEED=9 cargo test --profile ci --test runs"
        );
        // Not a test binary cargo made (a doctest's, say): no target, no guess.
        assert_eq!(
            replay_line(
                1,
                Some(Path::new("/tmp/rustdoctest/rust_out")),
                None,
                Some("t")
            ),
            "SUPERSTEP_SIM_SEED=1 cargo test t -- --exact"
        );
        // A test of superstep itself runs again with the features it ran with.
        let own = Path::new("/w/target/debug/deps/simulation-0123456789abcdef");
        assert_eq!(
            replay_line(3, Some(own), Some("superstep"), Some("t")),
            format!(
                "SUPERSTEP_SIM_SEED=3 cargo test -p superstep{} --test simulation t -- --exact",
                own_features()
            )
        );
        assert!(own_features().contains(" --features sim"));
    }
}
