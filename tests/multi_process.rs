//! Real processes on loopback, started by `superstep-launch`: the same result as in memory;
//! a worker process that dies or freezes is named as lost; and under
//! `FailurePolicy::RestartWorker` a worker process killed with SIGKILL — in its start-up,
//! during a compute, or with its result in flight — is started again by the launcher,
//! takes its rank back, and the job ends with the fault-free result. A master process
//! killed the same way — during its compute, during a checkpoint write (its own state
//! being saved, or the file half written), or with a worker's result in flight — is
//! started again, resumes from its newest usable checkpoint as a new attempt, the workers
//! reach it again, and the job ends with the fault-free result.
//!
//! A worker process killed inside a collective (in the user's fold, after every rank made
//! the call) fails the job on every rank, naming it — under `Fail`. Under
//! `FailurePolicy::RestartAll` the same kills (and a worker's failure, and the master's
//! kill) restart every worker: each live process replaces its own worker, the launcher
//! starts the dead one again, and the job ends with the fault-free result, in barrier mode
//! too.
//!
//! A master process with a coordinator killed after its commit is started again and ends
//! at once with the result, its workers gone. Under Open MPI's `mpirun` the README's
//! recipe runs the example on 4 processes, and a process killed ends the run, which a
//! requeue (mpirun again, with a restart count) resumes to the fault-free result.
//!
//! The processes are this test binary itself, running its ignored `child_process` test
//! (and the example, under mpirun).

mod common;
#[path = "../examples/support/lr.rs"]
mod lr;

use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use superstep::checkpoint::{
    Checkpoint, CheckpointError, CheckpointStore, FsCheckpointStore, Loaded,
};
use superstep::prelude::*;
use superstep::transport::ClusterEnv;
use superstep::FailurePolicy;

const BEHAVIOUR: &str = "SUPERSTEP_TEST_BEHAVIOUR";
/// The arguments that make this test binary run one process of a job: its ignored
/// `child_process` test, alone, its output not captured.
const CHILD: [&str; 6] = [
    "child_process",
    "--exact",
    "--ignored",
    "--nocapture",
    "--test-threads",
    "1",
];
const ROWS: usize = 6_000;
const FEATURES: usize = 4;
const ITERATIONS: u64 = 6;
/// The behaviours a job recovers from: its worker processes are started again.
const RECOVERED: [&str; 5] = [
    "kill-init",
    "kill-compute",
    "kill-in-flight",
    "kill-last",
    "fail",
];

/// The behaviours that kill the master's process; it is started again.
const MASTER_KILLED: [&str; 4] = [
    "kill-master-compute",
    "kill-master-checkpoint",
    "kill-master-torn-checkpoint",
    "kill-master-in-flight",
];
/// The master of a job in barrier mode is killed in its compute: its workers cannot carry
/// their sync calls over to the master started again, and fail instead of waiting.
const KILL_MASTER_BARRIER: &str = "kill-master-barrier";
/// A job in barrier mode whose rank 2 is killed inside a collective, in the user's fold —
/// a point certain to be after every rank made the call and before any could end it.
const KILL_IN_COLLECTIVE: &str = "kill-in-collective";
/// The behaviours run under `RestartAll` (a gang restart across processes): the name is
/// `gang-` and the fault; those of `GANG_BARRIER` in barrier mode, with a collective in
/// iteration 3.
const GANG: [&str; 4] = [
    "gang-kill-init",
    "gang-kill-compute",
    "gang-fail",
    "gang-kill-master-compute",
];
const GANG_BARRIER: [&str; 2] = ["gang-kill-in-collective", "gang-kill-master-barrier"];
/// Under `RestartAll`, rank 2's process killed in its compute of iteration 3, launched
/// without `--restarts`: no new process of it will come.
const GANG_NO_RESTARTS: &str = "gang-kill-compute-without-restarts";
/// Under `RestartAll`, a process killed by the test at a random point (`launch_killing`);
/// every compute takes `SLOW_BY`, so that the job lasts long enough to be hit.
const RANDOM_KILL: &str = "gang-random";
/// As `RANDOM_KILL`, in barrier mode with an `all_reduce` in every compute (the workers'
/// connections to each other in use when the kill comes), with one restart allowed
/// (`max_attempts: 2`), and a worker's process (rank 1 or 2) the one killed.
const RANDOM_KILL_IN_COLLECTIVES: &str = "gang-random-collectives";
/// Every compute takes `SLOW_BY` and makes an `all_reduce`, whose sum it checks.
/// Under `RestartAll`, in a job with Pregel messages (every rank sends each other one in
/// every superstep, and checks what it got): rank 2 kills the master's process just after
/// its messages of iteration 3 left — rank 0's worker dies with it, amid the exchange;
/// its compute of iteration 4 waits for that death, so the job cannot end before — and
/// every worker must start over with the master started again.
const KILL_MASTER_IN_MESSAGES: &str = "gang-kill-master-in-messages";
/// Every rank sends each other one a message in every superstep, and checks those it got.
const MESSAGES: &str = "messages";
const SLOW_COLLECTIVES: &str = "slow-collectives";
const SLOW: &str = "slow";
/// Every compute takes `SLOW_BY`; each rank writes its pid once its job computes (its
/// preempt signal taken), and the test sends one of them — or the launcher — SIGTERM.
const PREEMPT: &str = "preempt";
const SLOW_BY: Duration = Duration::from_millis(40);
/// The master's process, with a coordinator, is killed (SIGKILL) once its job committed,
/// before it could exit: the launcher starts it again, and it ends at once with the result
/// from the commit's record, its workers long gone.
const KILL_MASTER_AFTER_COMMIT: &str = "kill-master-after-commit";
/// The master's process is killed in its compute of `KILL_MASTER_AT` after its checkpoint
/// directory was emptied, as on a fresh host: started again, it resumes from the copy of
/// the newest checkpoint a worker's process keeps.
const KILL_MASTER_WIPED: &str = "kill-master-wiped";
/// Under `RestartAll`: rank 2's process killed in its compute of iteration 3 (every worker
/// restarts from the checkpoint of 2, as attempt 1), then the master's killed as in
/// `KILL_MASTER_WIPED`. Started again on an empty directory, the master runs an attempt
/// past any the lost one could run (no checkpoint says it ran 1), and every worker starts
/// over.
const GANG_KILL_COMPUTE_THEN_MASTER_WIPED: &str = "gang-kill-compute-then-master-wiped";
/// As `KILL_MASTER_WIPED`, with the job's default copies: none, every process being on the
/// master's host.
const KILL_MASTER_WIPED_ONE_HOST: &str = "kill-master-wiped-one-host";
/// Under `RestartAll`: the master's process is killed (SIGKILL) by rank 1's once that
/// rank's job ended with the result, while the master's is held in its `post_application`
/// (every worker done); the write of the job's last checkpoint never ends once that hook
/// is reached. Started again, the master finds the job's end in its store and ends at once
/// with the result — its workers are gone.
const KILL_MASTER_AT_END: &str = "gang-kill-master-at-end";
/// Set in the master's process as its `post_application` runs (`KILL_MASTER_AT_END`).
static AT_END: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Whether this process's worker failed already (`fail`).
static FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Every rank makes a collective in iteration 3 and checks its sum; with the killer, rank 2
/// dies inside it.
const COLLECTIVE: &str = "collective";
/// A fault-free job in barrier mode whose every rank makes the collective of iteration 3
/// (its peers' connections in use): nothing goes wrong, and nothing is said at WARN.
const QUIET: &str = "quiet-collective";
const COLLECTIVE_KILLER: &str = "collective-killer";
/// Where the master's checkpoints go, and the master's pid for a worker to kill it by.
const CHECKPOINTS: &str = "SUPERSTEP_TEST_CHECKPOINTS";
/// The iteration at which the master is killed, and every how many a checkpoint is saved.
const KILL_MASTER_AT: u64 = 4;
const CHECKPOINT_EVERY: u64 = 2;

fn data() -> Arc<lr::Dataset> {
    Arc::new(lr::Dataset::generate(ROWS, FEATURES, 5))
}

fn job(
    data: &Arc<lr::Dataset>,
    workers: usize,
    fault: Option<&'static str>,
) -> superstep::JobBuilder<lr::Model, lr::Gradient> {
    let ranges = lr::split(data.rows, workers);
    let shared = Arc::clone(data);
    Job::builder(
        FaultyMaster {
            inner: lr::LrMaster {
                features: FEATURES,
                rate: 0.5,
            },
            fault,
            iteration: 0,
        },
        move |rank| Faulty {
            inner: lr::LrWorker::new(Arc::clone(&shared), ranges[rank].clone()),
            fault,
        },
    )
    .workers(workers)
    .iterations(ITERATIONS)
    .iteration_timeout(Duration::from_secs(60))
    .shutdown_timeout(Duration::from_secs(2))
}

/// A worker that dies (as if killed) or freezes (as if hung) at iteration 3, on one rank;
/// or, in its process's first life, is killed (SIGKILL) at a point of its work, or fails.
struct Faulty {
    inner: lr::LrWorker,
    fault: Option<&'static str>,
}

/// Ends this process at once, as `kill -9` from outside would.
fn kill_self() {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
}

/// The master, which in its process's first life is killed in its compute or while its
/// checkpoint is made at iteration `KILL_MASTER_AT`.
struct FaultyMaster {
    inner: lr::LrMaster,
    fault: Option<&'static str>,
    /// The iteration it computed last: the one a checkpoint is saved for.
    iteration: u64,
}

impl MasterComputable for FaultyMaster {
    type MasterResult = lr::Model;
    type WorkerResult = lr::Gradient;

    fn compute(
        &mut self,
        ctx: &mut MasterContext<lr::Model, lr::Gradient>,
    ) -> Result<Step<lr::Model>, BoxError> {
        self.iteration = ctx.iteration();
        let killed = matches!(
            self.fault,
            Some("kill-master-compute" | KILL_MASTER_BARRIER)
        );
        if killed && self.iteration == KILL_MASTER_AT {
            kill_self();
        }
        if self.fault == Some(KILL_MASTER_WIPED) && self.iteration == KILL_MASTER_AT {
            // The host's disk is gone with it: the process started again finds an empty
            // directory. Emptied once the write of the last checkpoint due is over, so
            // that no write races the removal (none is due again before this compute ends).
            wait_for_checkpoint(KILL_MASTER_AT - CHECKPOINT_EVERY);
            let dir = std::env::var_os(CHECKPOINTS).unwrap();
            std::fs::remove_dir_all(&dir).unwrap();
            std::fs::create_dir(&dir).unwrap();
            kill_self();
        }
        if self.fault == Some("kill-master-torn-checkpoint") && self.iteration > KILL_MASTER_AT {
            // Checkpoints are written off the iteration's path: the job goes no further
            // until the write of `KILL_MASTER_AT`'s, which kills this process, is done —
            // its kill comes while the job runs, never after its workers were told the end.
            std::thread::sleep(Duration::from_secs(60));
            panic!("the torn checkpoint's write never killed the master's process");
        }
        if self.fault == Some("kill-in-flight") && self.iteration == 3 {
            // The job goes no further than iteration 3 until rank 2's first process is
            // dead: its kill comes while the job runs, never after it ended.
            wait_for_death_of(IN_FLIGHT_PID);
        }
        self.inner.compute(ctx)
    }

    fn save_state(&self) -> Result<Vec<u8>, BoxError> {
        if (self.fault, self.iteration) == (Some("kill-master-checkpoint"), KILL_MASTER_AT) {
            kill_self();
        }
        Ok(Vec::new())
    }
}

/// A filesystem store that, for `kill-master-torn-checkpoint`, dies in the middle of
/// writing the checkpoint of `KILL_MASTER_AT`: half a temporary file, and a torn file
/// where the checkpoint goes (as a disk that lost power may leave it).
struct DyingStore {
    inner: FsCheckpointStore,
    torn: bool,
    /// `KILL_MASTER_AT_END`, in the master's first life.
    last_held: bool,
}

impl CheckpointStore for DyingStore {
    fn save(&mut self, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        if self.last_held && checkpoint.iteration == ITERATIONS {
            // Written half a second on — unless the job's end is reached first (its workers
            // were told before its last checkpoint was in the store): then never, the
            // process being killed meanwhile.
            let deadline = Instant::now() + Duration::from_millis(500);
            while Instant::now() < deadline {
                if AT_END.load(std::sync::atomic::Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_secs(60));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        if self.torn && checkpoint.iteration == KILL_MASTER_AT {
            let dir = self.inner.dir().to_path_buf();
            std::fs::write(dir.join(".checkpoint-half"), b"half a checkp").unwrap();
            std::fs::write(self.inner.path_of(checkpoint.iteration), b"torn").unwrap();
            kill_self();
        }
        self.inner.save(checkpoint)?;
        SAVED.store(checkpoint.iteration, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    fn latest(&mut self) -> Result<Option<Loaded>, CheckpointError> {
        self.inner.latest()
    }
}

/// The iteration of the newest checkpoint this process's store wrote (and pruned after).
static SAVED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Waits (at most 60 s) until this process's store has written the checkpoint of
/// `iteration`: its writer, off the iteration's path, is then idle until the next is due.
fn wait_for_checkpoint(iteration: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while SAVED.load(std::sync::atomic::Ordering::SeqCst) < iteration {
        assert!(
            Instant::now() < deadline,
            "the checkpoint of {iteration} was not written in 60 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits (at most 60 s) until the checkpoint directory holds the checkpoint of `iteration`
/// or a later one, written whole (`checkpoint-<iteration>.ssck`, renamed in place once
/// written): from any process of the job.
fn wait_for_checkpoint_file(iteration: u64) {
    let Some(dir) = std::env::var_os(CHECKPOINTS) else {
        return;
    };
    let written = || {
        std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .any(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                name.strip_prefix("checkpoint-")
                    .and_then(|rest| rest.strip_suffix(".ssck"))
                    .and_then(|n| n.parse::<u64>().ok())
                    .is_some_and(|n| n >= iteration)
            })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !written() {
        assert!(
            Instant::now() < deadline,
            "the checkpoint of {iteration} was not written in 60 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Where rank 2's first process writes its pid before its result of iteration 3 goes out
/// (`kill-in-flight`).
const IN_FLIGHT_PID: &str = "in-flight.pid";

/// Waits (at most 60 s) until the process whose pid is in `file` of the checkpoint
/// directory has died.
fn wait_for_death_of(file: &str) {
    let Some(dir) = std::env::var_os(CHECKPOINTS) else {
        return;
    };
    let path = std::path::Path::new(&dir).join(file);
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(pid) = std::fs::read_to_string(&path).map(|p| p.trim().to_string()) {
            // Gone, or a zombie its launcher has not reaped yet.
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat.rsplit_once(") ").map(|(_, rest)| &rest[..1]);
            if matches!(state, None | Some("Z")) {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("the process in {path:?} did not die within 60 s");
}

/// Kills the master's process (whose pid its first life wrote) 300 µs from now, once.
fn kill_master_soon() {
    let Some(dir) = std::env::var_os(CHECKPOINTS) else {
        return;
    };
    let pid_file = std::path::Path::new(&dir).join("master.pid");
    let taken = pid_file.with_extension("killed");
    // Renamed first: a worker computing the iteration again kills nobody.
    if std::fs::rename(&pid_file, &taken).is_err() {
        return;
    }
    let pid: i32 = std::fs::read_to_string(&taken).unwrap().parse().unwrap();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_micros(300));
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    });
}

impl WorkerComputable for Faulty {
    type MasterResult = lr::Model;
    type WorkerResult = lr::Gradient;

    fn init(&mut self, ctx: &mut WorkerContext<lr::Model, lr::Gradient>) -> Result<(), BoxError> {
        if (self.fault, ctx.rank()) == (Some("kill-init"), 2) {
            kill_self();
        }
        self.inner.init(ctx)
    }

    fn compute(
        &mut self,
        ctx: &mut WorkerContext<lr::Model, lr::Gradient>,
    ) -> Result<lr::Gradient, BoxError> {
        if (self.fault, ctx.rank(), ctx.iteration()) == (Some("kill-last"), 2, ITERATIONS) {
            // Killed with its last result in flight, or just after: the job may already
            // be ending when the master learns of it.
            std::thread::spawn(|| {
                std::thread::sleep(Duration::from_micros(300));
                kill_self();
            });
        }
        if self.fault == Some(SLOW) {
            std::thread::sleep(SLOW_BY);
        }
        if self.fault == Some(PREEMPT) {
            // Its job runs, its signal taken: the test may send it now.
            let dir = std::env::var_os(CHECKPOINTS).unwrap();
            let path = std::path::Path::new(&dir).join(format!("rank{}.pid", ctx.rank()));
            if !path.exists() {
                std::fs::write(path, std::process::id().to_string()).unwrap();
            }
            std::thread::sleep(SLOW_BY);
        }
        if self.fault == Some(MESSAGES) {
            let (rank, workers) = (ctx.rank(), ctx.workers());
            let got: u64 = ctx.messages::<u64>()?.iter().sum();
            let want = (0..workers as u64).sum::<u64>() - rank as u64;
            if ctx.iteration() > 1 && got != want {
                return Err(format!(
                    "rank {rank} got messages adding up to {got} in iteration {}, not {want}",
                    ctx.iteration()
                )
                .into());
            }
            for to in (0..workers).filter(|&to| to != rank) {
                ctx.send(to, rank as u64)?;
            }
            if (rank, ctx.iteration()) == (2, 3) {
                let result = self.inner.compute(ctx);
                kill_master_soon();
                return result;
            }
            if (rank, ctx.iteration()) == (2, 4) {
                // The kill is certain to come before the job could end: on a loaded
                // machine the rest of the job takes less than its 300 µs.
                wait_for_death_of("master.killed");
            }
        }
        if self.fault == Some(SLOW_COLLECTIVES) {
            std::thread::sleep(SLOW_BY);
            let rank = ctx.rank() as u64;
            let sum = ctx.all_reduce_with(rank, |a: &mut u64, b: u64| *a += b)?;
            if sum != (0..ctx.workers() as u64).sum::<u64>() {
                return Err(format!("rank {rank} ended the collective with {sum}").into());
            }
        }
        if (self.fault, ctx.rank(), ctx.iteration()) == (Some("kill-master-in-flight"), 2, 4) {
            // The kill (300 µs after rank 2's result of iteration 3 left) is certain to come
            // before the job could end: on a quick machine the rest of the job takes less.
            wait_for_death_of("master.killed");
        }
        if ctx.iteration() == 3 {
            match (self.fault, ctx.rank()) {
                // The process ends at once, sockets and all, as a kill -9 would leave it.
                (Some("die"), 2) => std::process::abort(),
                // The whole process stops: no message, no heartbeat.
                (Some("freeze"), 1) => {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::this(),
                        nix::sys::signal::Signal::SIGSTOP,
                    );
                    // The stop takes effect when a thread of this process next runs, which
                    // on a loaded machine may be milliseconds away: this compute must not
                    // return meanwhile.
                    loop {
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
                (Some("kill-compute"), 2) => {
                    // After the checkpoint of 2, certainly: it is written off the
                    // iteration's path, in the master's process.
                    wait_for_checkpoint_file(2);
                    kill_self()
                }
                (Some("kill-in-flight"), 2) => {
                    // Killed just after the result is handed over: it may be queued, on
                    // the wire, or delivered — but the job waits in iteration 3 until this
                    // process is dead (see `FaultyMaster`).
                    if let Some(dir) = std::env::var_os(CHECKPOINTS) {
                        let path = std::path::Path::new(&dir).join(IN_FLIGHT_PID);
                        std::fs::write(path, std::process::id().to_string()).unwrap();
                    }
                    std::thread::spawn(|| {
                        std::thread::sleep(Duration::from_micros(300));
                        kill_self();
                    });
                }
                // Once per process: a worker its own process makes again computes on.
                (Some("fail"), 1) if !FAILED.swap(true, std::sync::atomic::Ordering::SeqCst) => {
                    return Err("worker 1 fails in iteration 3".into())
                }
                (Some(fault @ (COLLECTIVE | COLLECTIVE_KILLER)), rank) => {
                    let killer = fault == COLLECTIVE_KILLER && rank == 2;
                    let sum = ctx.all_reduce_with(rank as u64, move |a: &mut u64, b: u64| {
                        if killer {
                            kill_self();
                            std::process::abort();
                        }
                        *a += b;
                    })?;
                    let want = (0..ctx.workers() as u64).sum::<u64>();
                    if sum != want {
                        return Err(format!("rank {rank} ended the collective with {sum}").into());
                    }
                }
                (Some(KILL_IN_COLLECTIVE), rank) => {
                    // Recursive doubling (4 ranks): rank 2 folds its partner's value at
                    // the first step, and dies there — having sent its own to rank 3
                    // already, so ranks 1 and 3 may still finish (with every value), while
                    // rank 0, whose partner at the second step is rank 2, cannot.
                    let sum = ctx.all_reduce_with(rank as u64, move |a: &mut u64, b: u64| {
                        if rank == 2 {
                            kill_self();
                            std::process::abort();
                        }
                        *a += b;
                    })?;
                    if sum != 6 || rank == 0 {
                        return Err(format!("rank {rank} ended the collective with {sum}").into());
                    }
                }
                // The master dies with this result on its way to it.
                (Some("kill-master-in-flight"), 2) => {
                    let result = self.inner.compute(ctx);
                    kill_master_soon();
                    return result;
                }
                _ => {}
            }
        }
        self.inner.compute(ctx)
    }
}

fn bits(model: &lr::Model) -> String {
    model.bits()
}

#[test]
#[ignore = "one process of the multi-process tests, which start it"]
fn child_process() {
    let Some(env) = ClusterEnv::from_env().unwrap() else {
        return;
    };
    common::child_logs();
    let behaviour = std::env::var(BEHAVIOUR).unwrap_or_default();
    if let (Some(dir), RANDOM_KILL | RANDOM_KILL_IN_COLLECTIVES) =
        (std::env::var_os(CHECKPOINTS), behaviour.as_str())
    {
        let path = std::path::Path::new(&dir).join(format!("rank{}.pid", env.rank));
        std::fs::write(path, std::process::id().to_string()).unwrap();
    }
    let gang = behaviour.starts_with("gang-");
    let barrier = GANG_BARRIER.contains(&behaviour.as_str())
        || behaviour == RANDOM_KILL_IN_COLLECTIVES
        || behaviour == KILL_MASTER_IN_MESSAGES;
    let named = behaviour.strip_prefix("gang-").unwrap_or(&behaviour);
    // A process started again in the place of a killed one does not fail again.
    let fault = match named {
        // Every rank's compute of iteration 3 makes the collective, in every life; rank 2
        // dies in it in its first.
        "kill-in-collective" if gang && env.restart_count == 0 => Some(COLLECTIVE_KILLER),
        "kill-in-collective" if gang => Some(COLLECTIVE),
        "random" => Some(SLOW),
        PREEMPT => Some(PREEMPT),
        "random-collectives" => Some(SLOW_COLLECTIVES),
        // In every life: the master's pid is taken once (`kill_master_soon`).
        "kill-master-in-messages" => Some(MESSAGES),
        QUIET => Some(COLLECTIVE),
        "die" => Some("die"),
        "freeze" => Some("freeze"),
        _ if env.restart_count > 0 => None,
        "kill-init" => Some("kill-init"),
        "kill-compute" => Some("kill-compute"),
        "kill-in-flight" => Some("kill-in-flight"),
        "kill-last" => Some("kill-last"),
        "fail" => Some("fail"),
        KILL_MASTER_BARRIER => Some(KILL_MASTER_BARRIER),
        KILL_IN_COLLECTIVE => Some(KILL_IN_COLLECTIVE),
        KILL_MASTER_WIPED | KILL_MASTER_WIPED_ONE_HOST => Some(KILL_MASTER_WIPED),
        "kill-compute-then-master-wiped" if env.rank == 2 => Some("kill-compute"),
        "kill-compute-without-restarts" => Some("kill-compute"),
        "kill-compute-then-master-wiped" => Some(KILL_MASTER_WIPED),
        _ => MASTER_KILLED.iter().copied().find(|&b| b == named),
    };
    let policy = if behaviour == RANDOM_KILL_IN_COLLECTIVES {
        FailurePolicy::RestartAll { max_attempts: 2 }
    } else if gang {
        FailurePolicy::RestartAll { max_attempts: 3 }
    } else if RECOVERED.contains(&behaviour.as_str()) {
        FailurePolicy::RestartWorker { max_restarts: 1 }
    } else {
        FailurePolicy::Fail
    };
    // The heartbeats' settings come from the environment the test gave the launcher.
    let mut job = job(&data(), env.world_size, fault)
        .cluster_from_env()
        .unwrap()
        .failure_policy(policy)
        .barrier_mode(
            barrier
                || behaviour == KILL_MASTER_BARRIER
                || behaviour == KILL_IN_COLLECTIVE
                || behaviour == QUIET,
        );
    assert_eq!(job.process_rank(), Some(env.rank));
    if behaviour == KILL_MASTER_IN_MESSAGES {
        job = job.messages::<u64>();
    }
    if matches!(named, KILL_MASTER_WIPED | "kill-compute-then-master-wiped") {
        // Every process is on this host: a copy is kept only when asked for.
        job = job.checkpoint_replicas(1);
    }
    if behaviour == format!("gang-{KILL_MASTER_WIPED}") {
        // A worker made again runs its `init` as it starts, before what its route held
        // for it: the copy, offered as the route takes the master's `Connected`, still
        // reaches the master before it registers.
        job = job.placement(superstep::Placement::Inline);
    }
    if let (Some(dir), 0) = (std::env::var_os(CHECKPOINTS), env.rank) {
        if env.restart_count == 0 {
            std::fs::write(
                std::path::Path::new(&dir).join("master.pid"),
                std::process::id().to_string(),
            )
            .unwrap();
        }
        let held = behaviour == KILL_MASTER_AT_END && env.restart_count == 0;
        let store = DyingStore {
            inner: FsCheckpointStore::new(&dir, 3).unwrap(),
            torn: fault == Some("kill-master-torn-checkpoint"),
            last_held: held,
        };
        job = job.checkpoint(store, CHECKPOINT_EVERY);
        if held {
            job = job.master_interceptor(HeldAtEnd);
        }
        if behaviour == KILL_MASTER_AFTER_COMMIT {
            job = job.coordinator(Committing);
        }
    }
    let ran = job.run();
    if (behaviour.as_str(), env.rank, env.restart_count) == (KILL_MASTER_AFTER_COMMIT, 0, 0) {
        kill_self();
    }
    if (behaviour.as_str(), env.restart_count) == (KILL_MASTER_AT_END, 0) {
        match env.rank {
            // Ended with the job's result (or not): the master's process is killed.
            1 => {
                let dir = std::env::var_os(CHECKPOINTS).unwrap();
                let pid = std::fs::read_to_string(std::path::Path::new(&dir).join("master.pid"));
                let pid: i32 = pid.unwrap().trim().parse().unwrap();
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            // Held until then.
            0 => {
                std::thread::sleep(Duration::from_secs(60));
                panic!("rank 1's process never killed the master's");
            }
            _ => {}
        }
    }
    match ran {
        // A line of its own: the test harness prints the test's name before it.
        Ok(outcome) => println!(
            "\nRESULT {}\nATTEMPT {} RESUMED {:?}",
            bits(&outcome.result),
            outcome.report.attempt,
            outcome.report.resumed_from()
        ),
        Err(error) => {
            println!("\nFAILED {error}");
            // 75 when the job was preempted: the launcher passes it on.
            std::process::exit(if error.is_preempted() {
                i32::from(error.exit_code())
            } else {
                3
            });
        }
    }
}

/// Holds the master's `post_application` (every worker is done) until its process is
/// killed (`KILL_MASTER_AT_END`).
struct HeldAtEnd;

impl superstep::MasterInterceptor<lr::Model, lr::Gradient> for HeldAtEnd {
    fn post_application(
        &mut self,
        _: &superstep::MasterContext<lr::Model, lr::Gradient>,
        _: superstep::Ending<'_>,
    ) -> Result<(), superstep::BoxError> {
        AT_END.store(true, std::sync::atomic::Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(60));
        Err("rank 1's process never killed the master's".into())
    }
}

/// A coordinator whose every hook does nothing: its `on_finish` is the job's commit.
struct Committing;

impl superstep::coordinator::Coordinator for Committing {}

/// Runs `superstep-launch --nproc n` over this binary's child test, with a deadline; the
/// launcher (and through it every child) is interrupted if the deadline passes.
fn launch(n: usize, behaviour: &str) -> Output {
    launch_killing(n, behaviour, None)
}

/// [`launch`], killing (SIGKILL) the process of rank `victim` `after` every rank's process
/// wrote its pid (`gang-random`), once.
fn launch_killing(n: usize, behaviour: &str, kill: Option<(usize, Duration)>) -> Output {
    let restarts = if behaviour == GANG_KILL_COMPUTE_THEN_MASTER_WIPED {
        "2"
    } else if behaviour == GANG_NO_RESTARTS {
        "0"
    } else if RECOVERED.contains(&behaviour)
        || MASTER_KILLED.contains(&behaviour)
        || behaviour == KILL_MASTER_AFTER_COMMIT
        || behaviour == KILL_MASTER_WIPED
        || behaviour == KILL_MASTER_WIPED_ONE_HOST
        || behaviour == KILL_MASTER_BARRIER
        || behaviour.starts_with("gang-")
    {
        "1"
    } else {
        "0"
    };
    let checkpoints = tempfile::tempdir().unwrap();
    let strike = kill.map(|(target, after)| Strike {
        target,
        after,
        signal: nix::sys::signal::Signal::SIGKILL,
    });
    launch_striking(n, behaviour, restarts, checkpoints.path(), strike)
}

/// A signal sent once to the process of `target` (a rank; the world size: the launcher)
/// `after` every rank's process wrote its pid.
struct Strike {
    target: usize,
    after: Duration,
    signal: nix::sys::signal::Signal,
}

/// Runs `superstep-launch --nproc n --restarts restarts` over this binary's child test in
/// `behaviour`, its checkpoints and pids in `dir`, with a deadline (the launcher, and
/// through it every child, is interrupted if it passes); `strike` as it says.
fn launch_striking(
    n: usize,
    behaviour: &str,
    restarts: &str,
    dir: &std::path::Path,
    mut strike: Option<Strike>,
) -> Output {
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_superstep-launch"))
        .args(["--nproc", &n.to_string(), "--grace-secs", "3"])
        .args(["--restarts", restarts, "--"])
        .arg(std::env::current_exe().unwrap())
        .args(CHILD)
        .env(BEHAVIOUR, behaviour)
        .env(CHECKPOINTS, dir)
        .env("SUPERSTEP_HEARTBEAT_INTERVAL", "100ms")
        .env("SUPERSTEP_HEARTBEAT_TIMEOUT", "1s")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let pid_of = |rank: usize| std::fs::read_to_string(dir.join(format!("rank{rank}.pid"))).ok();
    let mut started: Option<Instant> = None;
    while launcher.try_wait().unwrap().is_none() {
        if let Some(Strike {
            target,
            after,
            signal,
        }) = strike
        {
            if started.is_none() && (0..n).all(|r| pid_of(r).is_some()) {
                started = Some(Instant::now());
            }
            if started.is_some_and(|at| at.elapsed() >= after) {
                let pid = match target {
                    launcher_ if launcher_ == n => launcher.id() as i32,
                    rank => pid_of(rank).unwrap().trim().parse().unwrap(),
                };
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
                strike = None;
            }
        }
        if Instant::now() > deadline {
            interrupt(&mut launcher);
            break;
        }
        std::thread::sleep(Duration::from_millis(if strike.is_some() { 1 } else { 20 }));
    }
    launcher.wait_with_output().unwrap()
}

/// Interrupts `child` (a launcher passes that on to every process it started), and kills
/// it if it has not ended 5 s later.
fn interrupt(child: &mut std::process::Child) {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
    std::thread::sleep(Duration::from_secs(5));
    let _ = child.kill();
}

/// Launches `n` processes in `behaviour` ([`launch`]), asserts that the launcher succeeded
/// and that every rank ended with `expected`, and gives their output and the launcher's
/// log.
fn launched_to(expected: &str, n: usize, behaviour: &str) -> (String, String) {
    let out = launch(n, behaviour);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{behaviour}: {stdout}\n{stderr}");
    assert_results(&stdout, 0..n, expected, behaviour);
    (stdout, stderr)
}

fn line_of<'a>(stdout: &'a str, prefix: &str) -> Option<&'a str> {
    stdout.lines().find_map(|l| l.strip_prefix(prefix))
}

/// Asserts that every rank of `ranks` printed `expected` as its result (in `behaviour`).
fn assert_results(stdout: &str, ranks: std::ops::Range<usize>, expected: &str, behaviour: &str) {
    for rank in ranks {
        let result = line_of(stdout, &format!("[{rank}] RESULT "))
            .unwrap_or_else(|| panic!("{behaviour}: no result from rank {rank}: {stdout}"));
        assert_eq!(result, expected, "{behaviour}: rank {rank}");
    }
}

#[test]
fn the_launchers_help_opens_with_what_it_does() {
    let out = Command::new(env!("CARGO_BIN_EXE_superstep-launch"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        help.lines().next(),
        Some("Start N local processes of a superstep job binary as one cluster job"),
        "{help}"
    );
}

#[test]
fn a_fault_free_job_of_four_processes_logs_no_warning_in_any_process() {
    // The children log at WARN and above to their standard error, which the launcher
    // prefixes with the rank: a line there is a warning of some process.
    let expected = bits(&job(&data(), 4, None).run().unwrap().result);
    for (run, behaviour) in ["normal", QUIET, "normal", QUIET, QUIET].iter().enumerate() {
        let (_, stderr) = launched_to(&expected, 4, behaviour);
        let warnings: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .collect();
        assert!(
            warnings.is_empty(),
            "run {run} ({behaviour}): {warnings:#?}"
        );
    }
}

#[test]
fn four_processes_on_loopback_end_with_the_in_memory_result_bit_for_bit() {
    let expected = job(&data(), 4, None).run().unwrap();
    let out = launch(4, "normal");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_results(&stdout, 0..4, &bits(&expected.result), "normal");
}

#[test]
fn a_worker_process_killed_at_any_point_is_started_again_and_the_job_ends_with_the_fault_free_result(
) {
    let expected = bits(&job(&data(), 3, None).run().unwrap().result);
    for behaviour in RECOVERED {
        let out = launch(3, behaviour);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{behaviour}: {stdout}\n{stderr}");
        // Killed after its last result, rank 2's new process may find the job over.
        let ranks = if behaviour == "kill-last" { 0..2 } else { 0..3 };
        assert_results(&stdout, ranks, &expected, behaviour);
        if behaviour == "kill-last" {
            continue;
        }
        let dead = if behaviour == "fail" { 1 } else { 2 };
        assert!(
            stderr.contains(&format!("rank {dead} exited with"))
                && stderr.contains("starting it again"),
            "{behaviour}: the launcher started rank {dead} again: {stderr}"
        );
    }
}

#[test]
fn a_master_process_killed_at_any_point_is_started_again_resumes_and_the_job_ends_with_the_fault_free_result(
) {
    let expected = bits(&job(&data(), 3, None).run().unwrap().result);
    for behaviour in MASTER_KILLED {
        let (stdout, stderr) = launched_to(&expected, 3, behaviour);
        assert!(
            stderr.contains("rank 0 exited with") && stderr.contains("starting it again"),
            "{behaviour}: the launcher started the master again: {stderr}"
        );
        // The checkpoint of 4 was never written whole: the master resumed from that of 2
        // (with its result in flight, the master may have died a little later) — or, the
        // checkpoints being written while the job goes on, from none if the one of 2 was
        // still being written when the master died (the result is the fault-free one all
        // the same).
        let resumed = line_of(&stdout, "[0] ATTEMPT ").unwrap_or_else(|| panic!("{stdout}"));
        let from_two = resumed == "1 RESUMED Some(2)";
        let in_flight_later =
            behaviour == "kill-master-in-flight" && resumed == "1 RESUMED Some(4)";
        let before_two_was_written = resumed == "1 RESUMED None";
        assert!(
            from_two || in_flight_later || before_two_was_written,
            "{behaviour}: {resumed}"
        );
        if behaviour == "kill-master-torn-checkpoint" {
            assert!(
                stderr.contains("is corrupt"),
                "{behaviour}: the torn checkpoint is named: {stderr}"
            );
        }
    }
}

#[test]
fn a_master_started_again_on_an_empty_checkpoint_directory_resumes_from_a_workers_copy() {
    let expected = bits(&job(&data(), 3, None).run().unwrap().result);
    // Under `Fail` the workers wait for the master; under `RestartAll` each live process
    // replaces its worker when the master started again reaches it, and the copy outlives
    // the worker that was sent it.
    let gang = format!("gang-{KILL_MASTER_WIPED}");
    for behaviour in [KILL_MASTER_WIPED, &gang] {
        let (stdout, stderr) = launched_to(&expected, 3, behaviour);
        assert!(
            stderr.contains("rank 0 exited with signal: 9") && stderr.contains("starting it again"),
            "{behaviour}: {stderr}"
        );
        // The checkpoint of 2 went with the master's directory; rank 1's process kept a
        // copy, and the master started again resumed from it, not from the start — in an
        // attempt past every one the lost master could run: 1 under `Fail`, 3 (its
        // `max_attempts`) under `RestartAll`.
        let resumed = line_of(&stdout, "[0] ATTEMPT ").unwrap_or_else(|| panic!("{stdout}"));
        let attempt = if behaviour == KILL_MASTER_WIPED { 1 } else { 3 };
        assert_eq!(
            resumed,
            format!("{attempt} RESUMED Some(2)"),
            "{behaviour}: {stderr}"
        );
    }
    // The lost master had run attempt 1 (rank 2's loss) when it died, which no checkpoint
    // records: the master started again runs attempt 3, past every one the lost one could
    // run, not 1 again. Rank 1's process, whose worker restarted once with rank 2's loss
    // (keeping the copy of 2 it was sent before), replaces it again.
    let (stdout, stderr) = launched_to(&expected, 3, GANG_KILL_COMPUTE_THEN_MASTER_WIPED);
    let resumed = line_of(&stdout, "[0] ATTEMPT ").unwrap_or_else(|| panic!("{stdout}"));
    assert_eq!(resumed, "3 RESUMED Some(2)", "{stderr}");
    let replaced = stderr
        .lines()
        .filter(|l| l.starts_with("[1]") && l.contains("this one is replaced"))
        .count();
    assert_eq!(replaced, 2, "{stderr}");
    // By default a job whose every process is on one host keeps no copy (the host's loss
    // would take them all): the master started again starts over, to the same result.
    let (stdout, stderr) = launched_to(&expected, 3, KILL_MASTER_WIPED_ONE_HOST);
    let resumed = line_of(&stdout, "[0] ATTEMPT ").unwrap_or_else(|| panic!("{stdout}"));
    assert_eq!(resumed, "1 RESUMED None", "{stderr}");
}

#[test]
fn workers_of_a_barrier_mode_job_whose_master_is_started_again_fail_saying_why() {
    let out = launch(3, KILL_MASTER_BARRIER);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    // Idle between iterations when their master died, they still end on their own rather
    // than waiting to be killed: the first to reach the new master fails saying why (one
    // reaching it after the job failed finds it ending, and ends as a lost master).
    let failed: Vec<&str> = (1..3)
        .map(|rank| {
            line_of(&stdout, &format!("[{rank}] FAILED ")).unwrap_or_else(|| {
                panic!("rank {rank} did not fail on its own: {stdout}\n{stderr}")
            })
        })
        .collect();
    assert!(
        failed.iter().any(|f| f.contains("barrier mode")),
        "{failed:?}"
    );
}

#[test]
fn a_master_process_killed_after_its_commit_is_started_again_and_ends_at_once_with_the_result() {
    let expected = bits(&job(&data(), 3, None).run().unwrap().result);
    let (stdout, stderr) = launched_to(&expected, 3, KILL_MASTER_AFTER_COMMIT);
    assert!(
        stderr.contains("rank 0 exited with signal: 9") && stderr.contains("starting it again"),
        "{stderr}"
    );
    // Its newest checkpoint is the last one, committed: nothing ran again.
    let resumed = line_of(&stdout, "[0] ATTEMPT ").unwrap_or_else(|| panic!("{stdout}"));
    assert!(resumed.ends_with("RESUMED Some(6)"), "{resumed}");
}

/// The job's end is told only once its last checkpoint is in the store: a master whose
/// process is lost after its workers ended with the result and left finds the end there
/// when started again, and ends with the result at once, waiting for none of them.
#[test]
fn a_master_process_killed_after_its_workers_ended_is_started_again_and_ends_with_the_result() {
    let expected = bits(&job(&data(), 3, None).run().unwrap().result);
    let (stdout, stderr) = launched_to(&expected, 3, KILL_MASTER_AT_END);
    assert!(
        stderr.contains("rank 0 exited with signal: 9") && stderr.contains("starting it again"),
        "{stderr}"
    );
    let resumed = line_of(&stdout, "[0] ATTEMPT ").unwrap_or_else(|| panic!("{stdout}"));
    assert!(resumed.ends_with("RESUMED Some(6)"), "{resumed}\n{stderr}");
}

#[test]
fn the_launcher_starts_again_a_master_killed_by_a_signal_but_not_one_that_exited() {
    let run = |script: &str| {
        Command::new(env!("CARGO_BIN_EXE_superstep-launch"))
            .args(["--nproc", "1", "--restarts", "1", "--", "sh", "-c", script])
            .output()
            .unwrap()
    };
    // Its job failed, its workers were told: starting it again would only wait for them.
    let exited = run("exit 3");
    let stderr = String::from_utf8_lossy(&exited.stderr);
    assert_eq!(exited.status.code(), Some(3), "{stderr}");
    assert!(!stderr.contains("starting it again"), "{stderr}");
    // Killed: started again, told it is its first restart.
    let killed = run(r#"[ "$SUPERSTEP_RESTART_COUNT" = 1 ] && exit 0; kill -9 $$"#);
    let stderr = String::from_utf8_lossy(&killed.stderr);
    assert!(killed.status.success(), "{stderr}");
    assert!(
        stderr.contains("rank 0 exited with signal: 9") && stderr.contains("starting it again"),
        "{stderr}"
    );
}

#[test]
fn a_worker_process_that_dies_is_named_as_lost() {
    let out = launch(3, "die");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(3),
        "the launcher exits with the master's code: {stdout}"
    );
    let failed = line_of(&stdout, "[0] FAILED ").unwrap_or_else(|| panic!("{stdout}"));
    assert!(failed.starts_with("worker 2 was lost"), "{failed}");
}

#[test]
fn a_worker_process_killed_inside_a_collective_fails_it_on_every_rank_naming_the_rank() {
    let out = launch(4, KILL_IN_COLLECTIVE);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Ended by the job, not by the test's deadline: the master's exit code.
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    // Every rank still alive ends with a failure that names rank 2: lost to the master, or
    // lost to a peer in the collective — never a wrong sum, never a wait for it (a rank
    // whose part needed nothing more of rank 2 may finish the collective, with the right
    // sum, and then fail with the job).
    for rank in [0, 1, 3] {
        let failed = line_of(&stdout, &format!("[{rank}] FAILED "))
            .unwrap_or_else(|| panic!("rank {rank} did not fail: {stdout}\n{stderr}"));
        assert!(
            failed.contains("worker 2 was lost") || failed.contains("connection to rank 2"),
            "rank {rank}: {failed}"
        );
    }
    assert!(!stdout.contains("ended the collective"), "{stdout}");
}

#[test]
fn a_frozen_worker_process_is_named_by_the_failure_detector() {
    let out = launch(3, "freeze");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{stdout}");
    let failed = line_of(&stdout, "[0] FAILED ").unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        failed.starts_with("worker 1 was lost: silent for 1s"),
        "{failed}"
    );
}

#[test]
fn under_restart_all_every_worker_process_restarts_from_the_checkpoint_and_the_job_ends_with_the_fault_free_result(
) {
    let expected = bits(&job(&data(), 3, None).run().unwrap().result);
    for behaviour in GANG {
        let (stdout, stderr) = launched_to(&expected, 3, behaviour);
        // Killed, a process is started again by the launcher; a failed worker's process
        // replaces its worker itself.
        let dead = match behaviour {
            "gang-fail" => None,
            "gang-kill-master-compute" => Some(0),
            _ => Some(2),
        };
        let restarted = |rank: usize| stderr.contains(&format!("rank {rank} exited with"));
        match dead {
            Some(rank) => assert!(restarted(rank), "{behaviour}: {stderr}"),
            None => assert!(!(0..3).any(restarted), "{behaviour}: {stderr}"),
        }
        // A new attempt: every worker started over, and a live worker process said so.
        // (Killed in its `init`, rank 2 may die before its connection was made: then its
        // new process is the rank's first, and nothing restarts.)
        let attempt = line_of(&stdout, "[0] ATTEMPT ").unwrap_or_else(|| panic!("{stdout}"));
        if behaviour == "gang-kill-init" && attempt.starts_with("0 ") {
            continue;
        }
        assert!(!attempt.starts_with("0 "), "{behaviour}: {attempt}");
        assert!(
            stderr.contains("every worker starts over"),
            "{behaviour}: a live worker process says its worker is replaced: {stderr}"
        );
    }
}

#[test]
fn under_restart_all_a_process_lost_with_no_restarts_left_fails_the_job_at_once_naming_restarts() {
    // Without the launcher's word, the master waited 30 minutes (the start-up timeout) for
    // a new process of rank 2 that nothing would start.
    let started = Instant::now();
    let out = launch(3, GANG_NO_RESTARTS);
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    let failed = line_of(&stdout, "[0] FAILED ").unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        failed.starts_with("worker 2 was lost")
            && failed.contains("no new process of it will come: its launcher has no restarts left")
            && failed.contains("--restarts"),
        "{failed}"
    );
    // The launcher says so too.
    assert!(
        stderr.contains("superstep-launch: rank 2 exited with signal")
            && stderr.contains("it is not started again: no restarts left (--restarts 0)"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

#[test]
fn under_restart_all_a_barrier_mode_job_recovers_from_a_kill_in_a_collective_and_of_its_master() {
    let expected = bits(&job(&data(), 4, None).run().unwrap().result);
    for behaviour in GANG_BARRIER {
        let (stdout, stderr) = launched_to(&expected, 4, behaviour);
        let dead = if behaviour == "gang-kill-in-collective" {
            2
        } else {
            0
        };
        assert!(
            stderr.contains(&format!("rank {dead} exited with")),
            "{behaviour}: {stderr}"
        );
        assert!(!stdout.contains("ended the collective"), "{stdout}");
    }
}

#[test]
fn under_restart_all_a_process_killed_at_a_random_point_leaves_the_fault_free_result() {
    random_kills(RANDOM_KILL, 0..3, 300, 6);
}

/// With one restart allowed, one worker's process killed at a random point — its peers'
/// connections to it in use in every iteration's collective — costs one attempt, never
/// two: its loss, found by a peer after the gang restart, is not the new attempt's.
/// (`SUPERSTEP_TEST_KILLS` runs more.)
#[test]
fn under_restart_all_one_worker_killed_amid_collectives_costs_one_attempt() {
    let runs = kills(4);
    random_kills(RANDOM_KILL_IN_COLLECTIVES, 1..3, 200, runs);
}

/// Under `RestartAll`, the master's process killed amid the workers' exchange of Pregel
/// messages (rank 0's worker dies with it): the workers that lose it as a peer keep their
/// failure for the master started again, which starts every worker over, and the job ends
/// with the fault-free result. (`SUPERSTEP_TEST_KILLS` runs more.)
#[test]
fn under_restart_all_a_master_killed_amid_a_message_exchange_is_recovered_from() {
    let runs = kills(3);
    let expected = bits(&job(&data(), 3, None).run().unwrap().result);
    for run in 0..runs {
        let out = launch(3, KILL_MASTER_IN_MESSAGES);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let point = format!("run {run}");
        assert!(out.status.success(), "{point}: {stdout}\n{stderr}");
        assert!(
            stderr.contains("rank 0 exited with signal: 9"),
            "{point}: the master's process was not killed: {stderr}"
        );
        assert_results(&stdout, 0..3, &expected, &point);
    }
}

/// Launches 4 processes in `PREEMPT` on the checkpoints of `dir` and, `after` every rank's
/// job computes, sends SIGTERM to the process of `target` (a rank; 4: the launcher, which
/// forwards it to every process).
fn launch_preempting(dir: &std::path::Path, target: usize, after: Duration) -> Output {
    for rank in 0..4 {
        let _ = std::fs::remove_file(dir.join(format!("rank{rank}.pid")));
    }
    let strike = Strike {
        target,
        after,
        signal: nix::sys::signal::Signal::SIGTERM,
    };
    launch_striking(4, PREEMPT, "0", dir, Some(strike))
}

#[test]
fn a_job_preempted_by_sigterm_at_random_points_resumes_to_the_fault_free_bits() {
    let expected = bits(&job(&data(), 4, None).run().unwrap().result);
    // A seed of its own each run, said on failure: the points differ from run to run.
    let seed0 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
        | 1;
    let mut seed = seed0;
    let mut next = move |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    let (mut landed, mut jobs) = (0, 0);
    while landed < kills(20) {
        jobs += 1;
        let dir = tempfile::tempdir().unwrap();
        let mut resumes_from = None;
        let mut launches = 0;
        loop {
            launches += 1;
            assert!(launches < 30, "seed {seed0}: the job never completes");
            let target = next(5) as usize;
            let after = Duration::from_millis(next(200));
            let point = format!(
                "seed {seed0}, job {jobs}, launch {launches}: SIGTERM to {} {after:?} after every rank computed",
                if target == 4 { "the launcher".to_string() } else { format!("rank {target}") }
            );
            let out = launch_preempting(dir.path(), target, after);
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            match out.status.code() {
                Some(75) => {
                    landed += 1;
                    // Every process stopped, saying where the job resumes from.
                    for rank in 0..4 {
                        let said =
                            line_of(&stdout, &format!("[{rank}] FAILED ")).unwrap_or_else(|| {
                                panic!("{point}: rank {rank} said nothing: {stdout}\n{stderr}")
                            });
                        assert!(
                            said.starts_with("the job was preempted (SIGTERM in rank "),
                            "{point}: {said}"
                        );
                        if target < 4 {
                            assert!(
                                said.contains(&format!("(SIGTERM in rank {target}'s process)")),
                                "{point}: {said}"
                            );
                        }
                    }
                    let said = line_of(&stdout, "[0] FAILED ").unwrap();
                    let (_, from) = said
                        .split_once("resumes from the checkpoint of iteration ")
                        .unwrap_or_else(|| panic!("{point}: {said}"));
                    let from: u64 = from.trim().parse().unwrap();
                    assert!(
                        resumes_from.is_none_or(|r| from > r),
                        "{point}: {from} after {resumes_from:?}"
                    );
                    resumes_from = Some(from);
                    eprintln!("preempted: {point}: resumes from {from}");
                }
                Some(0) => {
                    assert_results(&stdout, 0..1, &expected, &point);
                    let resumed = line_of(&stdout, "[0] ATTEMPT 0 RESUMED ")
                        .unwrap_or_else(|| panic!("{point}: {stdout}"));
                    // A job that ended before the signal was never preempted at the end.
                    if !resumed.contains(&format!("{resumes_from:?}")) {
                        assert_eq!(resumes_from, None, "{point}: {resumed}");
                    }
                    break;
                }
                // The signal came once the master's job had ended: it did its default.
                // Launched again, the job ends at once from its last checkpoint.
                Some(143) => {
                    eprintln!("after its end: {point}");
                    resumes_from = Some(ITERATIONS);
                }
                other => panic!("{point}: the launcher exited with {other:?}: {stdout}\n{stderr}"),
            }
        }
    }
}

/// How many runs a kill test makes: `SUPERSTEP_TEST_KILLS`, or `default`.
fn kills(default: usize) -> usize {
    std::env::var("SUPERSTEP_TEST_KILLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// `runs` times: launches 3 processes in `behaviour`, kills one of `victims` at a random
/// point in the first `within_ms` after they started, and asserts the fault-free result.
fn random_kills(behaviour: &str, victims: std::ops::Range<usize>, within_ms: u64, runs: usize) {
    let expected = bits(&job(&data(), 3, None).run().unwrap().result);
    // A seed of its own each run, said on failure: the points differ from run to run.
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
        | 1;
    let mut next = move |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    for _ in 0..runs {
        let victim = victims.start + next(victims.len() as u64) as usize;
        let after = Duration::from_millis(next(within_ms));
        let out = launch_killing(3, behaviour, Some((victim, after)));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let point = format!("rank {victim} killed {after:?} after every process started");
        assert!(out.status.success(), "{point}: {stdout}\n{stderr}");
        // (With --nocapture: whether the kill found the process alive, for a tally.)
        let landed = stderr.contains(&format!("rank {victim} exited with signal: 9"));
        eprintln!("random kill: {point}: landed {landed}");
        // The master ends with the fault-free result; so does every worker that ended with
        // one (a worker killed after its last result may find the job over when it comes
        // back).
        assert_results(&stdout, 0..1, &expected, &point);
        for rank in 1..3 {
            if let Some(result) = line_of(&stdout, &format!("[{rank}] RESULT ")) {
                assert_eq!(result, expected, "{point}: rank {rank}");
            }
        }
    }
}

/// Open MPI's `mpirun` for 4 processes on this host, their output tagged with their rank
/// (`[1,<rank>]<stdout>:`); `None`, said on stderr, when Open MPI is not installed — but in
/// CI (`CI` set), whose `.ci/run` installs it, its absence fails the test.
fn mpirun() -> Option<Command> {
    let installed = Command::new("mpirun")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        assert!(
            std::env::var_os("CI").is_none(),
            "mpirun is not installed; .ci/run installs Open MPI (apt-get install openmpi-bin)"
        );
        eprintln!("skipped: mpirun is not installed (apt-get install openmpi-bin to run this)");
        return None;
    }
    let mut mpirun = Command::new("mpirun");
    // Open MPI refuses to start as root unless told (containers, CI).
    mpirun
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args(["--oversubscribe", "--tag-output", "-np", "4"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Some(mpirun)
}

/// A free port on loopback for the master, as `host:port`.
fn free_loopback_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

/// Runs `command` to its end; past `limit` it is interrupted ([`interrupt`]).
fn output_within(command: &mut Command, limit: Duration) -> Output {
    let mut child = command.spawn().unwrap();
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            interrupt(&mut child);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// What rank `rank` printed after `prefix` under `mpirun --tag-output`.
fn mpi_line_of<'a>(stdout: &'a str, rank: usize, prefix: &str) -> Option<&'a str> {
    let tag = format!(",{rank}]<stdout>:{prefix}");
    stdout
        .lines()
        .find_map(|l| l.find(&tag).map(|at| &l[at + tag.len()..]))
}

/// The README's mpirun recipe, run: the example on 4 processes that Open MPI starts, each
/// finding its rank and the world size in `OMPI_COMM_WORLD_*`; the master's process checks
/// the result against the sequential implementation.
#[test]
fn under_mpirun_the_readmes_recipe_runs_the_example_on_four_processes() {
    let Some(mut mpirun) = mpirun() else {
        return;
    };
    // Built beside this test by `cargo test` (target/<profile>/examples).
    let exe = std::env::current_exe().unwrap();
    let example = exe.parent().unwrap().parent().unwrap();
    let example = example.join("examples").join("logistic_regression");
    assert!(
        example.exists(),
        "{} is built by cargo test",
        example.display()
    );
    let addr = free_loopback_addr();
    mpirun
        .args(["-x", &format!("SUPERSTEP_MASTER_ADDR={addr}")])
        .args(["-x", "SUPERSTEP_SECRET=change-me"])
        .arg(&example)
        .args(["--rows", "20000", "--features", "4", "--iterations", "5"]);
    let out = output_within(&mut mpirun, Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        mpi_line_of(&stdout, 0, "OK: equal to the sequential implementation").is_some(),
        "{stdout}"
    );
    for rank in 1..4 {
        let done = mpi_line_of(&stdout, rank, &format!("worker {rank} done: "));
        assert!(
            done.is_some_and(|d| d.starts_with("5 iterations")),
            "{stdout}"
        );
    }
}

/// MPI ends the whole run when one process dies; a scheduler that requeues it starts every
/// process again (here: `mpirun` again, with the restart count a requeue sets), and the
/// master resumes from its newest checkpoint to the fault-free result.
#[test]
fn under_mpirun_a_process_killed_ends_the_run_and_the_run_requeued_resumes_to_the_fault_free_result(
) {
    let Some(_) = mpirun() else {
        return;
    };
    let expected = bits(&job(&data(), 4, None).run().unwrap().result);
    let checkpoints = tempfile::tempdir().unwrap();
    let run = |restart_count: u32| {
        let mut mpirun = mpirun().unwrap();
        let dir = checkpoints.path().display();
        for var in [
            format!("SUPERSTEP_MASTER_ADDR={}", free_loopback_addr()),
            "SUPERSTEP_SECRET=change-me".to_string(),
            format!("SUPERSTEP_RESTART_COUNT={restart_count}"),
            format!("{BEHAVIOUR}=gang-kill-compute"),
            format!("{CHECKPOINTS}={dir}"),
            "SUPERSTEP_HEARTBEAT_INTERVAL=100ms".to_string(),
            "SUPERSTEP_HEARTBEAT_TIMEOUT=1s".to_string(),
        ] {
            mpirun.args(["-x", &var]);
        }
        mpirun.arg(std::env::current_exe().unwrap()).args(CHILD);
        let out = output_within(&mut mpirun, Duration::from_secs(120));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.success(), stdout, stderr)
    };
    // Rank 2 is killed (SIGKILL) in its compute of iteration 3, after the checkpoint of 2.
    let (succeeded, stdout, stderr) = run(0);
    assert!(!succeeded, "{stdout}\n{stderr}");
    // mpirun reports the first process it reaps: rank 2's signal 9, or, when the master
    // saw rank 2's connection close first and the others ended with the job's failure, one
    // of those; then the master's own log names the rank that was lost.
    assert!(
        (stderr.contains("rank 2") && stderr.contains("signal 9"))
            || stderr.contains("worker 2 was lost"),
        "the killed rank is named: {stderr}"
    );
    assert!(mpi_line_of(&stdout, 0, "RESULT ").is_none(), "{stdout}");
    // Requeued: every process again, none killed this time.
    let (succeeded, stdout, stderr) = run(1);
    assert!(succeeded, "{stdout}\n{stderr}");
    for rank in 0..4 {
        assert_eq!(
            mpi_line_of(&stdout, rank, "RESULT "),
            Some(expected.as_str()),
            "rank {rank}: {stdout}"
        );
    }
    assert_eq!(
        // Started again once under `RestartAll { max_attempts: 3 }`: attempt 3.
        mpi_line_of(&stdout, 0, "ATTEMPT "),
        Some("3 RESUMED Some(2)"),
        "{stdout}"
    );
}
