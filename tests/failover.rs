//! Failure policies in the runtime, with every worker in this process: a failed worker is
//! replaced (its `init` runs again and it redoes the iteration), left out for the rest of
//! the job, or every worker restarts from the newest checkpoint as a new attempt. Each
//! recovered job ends with the result of the run without the failure.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use superstep::checkpoint::MemoryCheckpointStore;
use superstep::interceptor::{Ending, WorkerInterceptor};
use superstep::prelude::*;
use superstep::Recover;
use superstep::{FailurePolicy, Iteration, JobBuilder, Phase, Placement, Rank};

const WORKERS: usize = 4;
const ITERATIONS: Iteration = 8;

/// Where a worker fails: its phase (`Init`, `PreIteration`, `Compute` or `PostIteration`)
/// and iteration, on one rank, in the first `times` workers of that rank.
#[derive(Clone, Copy, Debug)]
struct Fault {
    rank: Rank,
    iteration: Iteration,
    phase: Phase,
    /// A panic rather than an error.
    panic: bool,
    times: u64,
}

/// How many workers of each rank were made, shared by the factory and the test.
#[derive(Clone, Default)]
struct Made(Arc<Mutex<HashMap<Rank, u64>>>);

impl Made {
    fn next(&self, rank: Rank) -> u64 {
        let mut made = self.0.lock().unwrap();
        let n = made.entry(rank).or_default();
        *n += 1;
        *n
    }

    fn of(&self, rank: Rank) -> u64 {
        self.0.lock().unwrap().get(&rank).copied().unwrap_or(0)
    }
}

/// Loads its shard in `init`; computing without it is a bug the test would see.
struct Worker {
    rank: Rank,
    shard: Option<u64>,
    fault: Option<Fault>,
    incarnation: u64,
}

impl Worker {
    fn trip(&self, phase: Phase, iteration: Iteration) -> Result<(), BoxError> {
        match self.fault {
            Some(f)
                if f.rank == self.rank
                    && f.phase == phase
                    && f.iteration == iteration
                    && self.incarnation <= f.times =>
            {
                let message = format!(
                    "worker {} fails in {phase:?} of iteration {iteration}",
                    self.rank
                );
                if f.panic {
                    panic!("{message}");
                }
                Err(message.into())
            }
            _ => Ok(()),
        }
    }
}

impl WorkerComputable for Worker {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn init(&mut self, _: &mut WorkerContext<u64, u64>) -> Result<(), BoxError> {
        self.trip(Phase::Init, 0)?;
        self.shard = Some((self.rank as u64 + 1) * 1_000);
        Ok(())
    }

    fn compute(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        self.trip(Phase::Compute, ctx.iteration())?;
        let shard = self.shard.expect("init loaded the shard");
        let last = ctx.last_master_result().copied().unwrap_or(0);
        Ok(shard + (last % 997) * (self.rank as u64 + 1) + ctx.iteration())
    }
}

/// Trips the worker's fault in the phases around compute.
struct Hooks {
    rank: Rank,
    fault: Option<Fault>,
    incarnation: u64,
    endings: Arc<Mutex<Vec<(Rank, bool)>>>,
}

impl Hooks {
    fn trip(&self, phase: Phase, iteration: Iteration) -> Result<(), BoxError> {
        Worker {
            rank: self.rank,
            shard: None,
            fault: self.fault,
            incarnation: self.incarnation,
        }
        .trip(phase, iteration)
    }
}

impl WorkerInterceptor<u64, u64> for Hooks {
    fn pre_iteration(&mut self, ctx: &WorkerContext<u64, u64>) -> Result<(), BoxError> {
        self.trip(Phase::PreIteration, ctx.iteration())
    }

    fn post_iteration(&mut self, ctx: &WorkerContext<u64, u64>) -> Result<(), BoxError> {
        self.trip(Phase::PostIteration, ctx.iteration())
    }

    fn post_application(
        &mut self,
        _: &WorkerContext<u64, u64>,
        ending: Ending<'_>,
    ) -> Result<(), BoxError> {
        let completed = matches!(ending, Ending::Completed { .. });
        self.endings.lock().unwrap().push((self.rank, completed));
        Ok(())
    }
}

/// Folds every result into state of its own (saved in checkpoints): a master restored
/// wrongly ends with another result.
struct Master {
    folded: u64,
}

impl MasterComputable for Master {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> {
        for &r in ctx.worker_results() {
            self.folded = self.folded.wrapping_mul(31).wrapping_add(r);
        }
        Ok(Step::Continue(self.folded))
    }

    fn save_state(&self) -> Result<Vec<u8>, BoxError> {
        Ok(self.folded.to_le_bytes().to_vec())
    }

    fn restore_state(&mut self, state: &[u8]) -> Result<(), BoxError> {
        self.folded = u64::from_le_bytes(state.try_into()?);
        Ok(())
    }
}

struct Run {
    made: Made,
    endings: Arc<Mutex<Vec<(Rank, bool)>>>,
    job: JobBuilder<u64, u64>,
}

/// How many workers' `post_application` was told the job completed, and how many that it
/// failed.
fn endings(endings: &Mutex<Vec<(Rank, bool)>>) -> (usize, usize) {
    let endings = endings.lock().unwrap();
    let completed = endings.iter().filter(|(_, c)| *c).count();
    (completed, endings.len() - completed)
}

fn job(fault: Option<Fault>, policy: FailurePolicy) -> Run {
    let made = Made::default();
    let endings = Arc::new(Mutex::new(Vec::new()));
    let (m, h) = (made.clone(), Arc::clone(&endings));
    let job = Job::builder(Master { folded: 7 }, move |rank| Worker {
        rank,
        shard: None,
        fault,
        incarnation: m.next(rank),
    })
    .worker_interceptor({
        let made = made.clone();
        move |rank| Hooks {
            rank,
            fault,
            // Made just before this rank's worker: of the same incarnation.
            incarnation: made.of(rank) + 1,
            endings: Arc::clone(&h),
        }
    })
    .workers(WORKERS)
    .iterations(ITERATIONS)
    .job_id("failover")
    .iteration_timeout(Duration::from_secs(20))
    .shutdown_timeout(Duration::from_secs(5))
    .failure_policy(policy);
    Run { made, endings, job }
}

fn fault_free() -> u64 {
    *job(None, FailurePolicy::Fail).job.run().unwrap().result
}

fn fault(rank: Rank, phase: Phase, iteration: Iteration) -> Fault {
    Fault {
        rank,
        iteration,
        phase,
        panic: false,
        times: 1,
    }
}

#[test]
fn a_failed_worker_is_replaced_at_every_point_and_the_job_ends_with_the_fault_free_result() {
    let expected = fault_free();
    let mut points = vec![(Phase::Init, 0)];
    for iteration in [1, 4, ITERATIONS] {
        for phase in [Phase::PreIteration, Phase::Compute, Phase::PostIteration] {
            points.push((phase, iteration));
        }
    }
    for (i, (phase, iteration)) in points.into_iter().enumerate() {
        let placement = [Placement::Auto, Placement::Inline, Placement::Pool][i % 3];
        let mut f = fault(i % WORKERS, phase, iteration);
        f.panic = i % 2 == 0;
        let run = job(Some(f), FailurePolicy::RestartWorker { max_restarts: 1 });
        let outcome = run
            .job
            .placement(placement)
            .run()
            .unwrap_or_else(|e| panic!("{f:?} with {placement:?}: {e}"));
        assert_eq!(*outcome.result, expected, "{f:?} with {placement:?}");
        assert_eq!(outcome.iterations, ITERATIONS);
        let recoveries = &outcome.report.recoveries;
        assert_eq!(recoveries.len(), 1, "{recoveries:?}");
        assert_eq!(recoveries[0].action, Recover::RestartWorker(f.rank));
        assert!(
            matches!(recoveries[0].cause, JobError::Worker { rank, iteration, phase, .. }
                if rank == f.rank && iteration == f.iteration && phase == f.phase),
            "{:?}",
            recoveries[0].cause
        );
        assert_eq!(run.made.of(f.rank), 2, "one replacement, whose init ran");
        assert_eq!(
            endings(&run.endings),
            (WORKERS, 1),
            "every rank's live worker is told the job completed, the failed one it failed"
        );
    }
}

#[test]
fn replacements_are_counted_over_the_job_and_the_next_failure_fails_it() {
    let mut f = fault(2, Phase::Compute, 3);
    f.times = 3;
    let run = job(Some(f), FailurePolicy::RestartWorker { max_restarts: 2 });
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&events);
    let err = run
        .job
        .on_event(move |e| {
            if let JobEvent::Recovering(r) = e {
                seen.lock().unwrap().push(r.action.clone());
            }
        })
        .run()
        .unwrap_err();
    assert!(
        matches!(
            err,
            JobError::Worker {
                rank: 2,
                iteration: 3,
                phase: Phase::Compute,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        *events.lock().unwrap(),
        vec![Recover::RestartWorker(2), Recover::RestartWorker(2)]
    );
    assert_eq!(run.made.of(2), 3);
}

#[test]
fn the_report_keeps_the_last_recoveries_and_counts_them_all() {
    // Five replacements; the report keeps the last two, as it keeps iterations.
    let mut f = fault(2, Phase::Compute, 3);
    f.times = 5;
    let run = job(Some(f), FailurePolicy::RestartWorker { max_restarts: 5 });
    let outcome = run.job.report_iterations(2).run().unwrap();
    assert_eq!(outcome.report.recovered, 5);
    assert_eq!(outcome.report.recoveries.len(), 2);
    assert!(outcome
        .report
        .recoveries
        .iter()
        .all(|r| r.action == Recover::RestartWorker(2)));
}

#[test]
fn a_replacement_that_fails_too_is_a_new_failure() {
    let mut f = fault(3, Phase::Init, 0);
    f.times = 2;
    let run = job(Some(f), FailurePolicy::RestartWorker { max_restarts: 2 });
    let outcome = run.job.run().unwrap();
    assert_eq!(*outcome.result, fault_free());
    assert_eq!(outcome.report.recoveries.len(), 2);
    assert_eq!(run.made.of(3), 3);

    // One replacement allowed: the replacement's own failure is the job's error, at once
    // (not a start-up timeout).
    let err = job(Some(f), FailurePolicy::RestartWorker { max_restarts: 1 })
        .job
        .startup_timeout(Duration::from_secs(60))
        .run()
        .unwrap_err();
    assert!(
        matches!(
            err,
            JobError::Worker {
                rank: 3,
                phase: Phase::Init,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn the_job_goes_on_without_a_failed_worker_down_to_its_quorum() {
    let run = job(
        Some(fault(1, Phase::Compute, 3)),
        FailurePolicy::ContinueWithout,
    );
    let outcome = run
        .job
        .min_workers(0.75, Duration::from_secs(10))
        .run()
        .unwrap();
    assert_eq!(outcome.iterations, ITERATIONS);
    assert_eq!(outcome.report.recoveries.len(), 1);
    assert_eq!(outcome.report.recoveries[0].action, Recover::LeaveOut(1));
    for it in &outcome.report.iterations {
        let expected: Vec<Rank> = if it.iteration >= 3 { vec![1] } else { vec![] };
        assert_eq!(it.left_out, expected, "iteration {}", it.iteration);
    }
    assert_eq!(run.made.of(1), 1, "never replaced");

    // Two of four lost is below the quorum of three: the second failure fails the job.
    let run = job(
        Some(fault(1, Phase::Compute, 3)),
        FailurePolicy::ContinueWithout,
    );
    let err = run
        .job
        .min_workers(0.75, Duration::from_secs(10))
        .worker_interceptor(|rank| Dies { rank })
        .run()
        .unwrap_err();
    assert!(
        matches!(
            err,
            JobError::Worker {
                rank: 3,
                iteration: 5,
                ..
            }
        ),
        "{err}"
    );
}

/// Rank 3 fails in iteration 5.
struct Dies {
    rank: Rank,
}

impl WorkerInterceptor<u64, u64> for Dies {
    fn pre_iteration(&mut self, ctx: &WorkerContext<u64, u64>) -> Result<(), BoxError> {
        if self.rank == 3 && ctx.iteration() == 5 {
            return Err("rank 3 dies too".into());
        }
        Ok(())
    }
}

#[test]
fn every_worker_restarts_from_the_newest_checkpoint_as_a_new_attempt() {
    let expected = fault_free();
    for (every, fail_at, resumed) in [(2, 5, Some(4)), (3, 2, None), (4, ITERATIONS, Some(4))] {
        let store = MemoryCheckpointStore::new();
        let run = job(
            Some(fault(1, Phase::Compute, fail_at)),
            FailurePolicy::RestartAll { max_attempts: 2 },
        );
        let outcome = run
            .job
            .checkpoint(store.clone(), every)
            .run()
            .unwrap_or_else(|e| panic!("every {every}, failing at {fail_at}: {e}"));
        assert_eq!(
            *outcome.result, expected,
            "every {every}, failing at {fail_at}"
        );
        assert_eq!(outcome.report.recoveries.len(), 1);
        assert_eq!(outcome.report.recoveries[0].action, Recover::RestartAll(1));
        for rank in 0..WORKERS {
            assert_eq!(run.made.of(rank), 2, "rank {rank} restarted once");
        }
        let ran: Vec<Iteration> = outcome
            .report
            .iterations
            .iter()
            .map(|i| i.iteration)
            .collect();
        let redo_from = resumed.map_or(1, |r| r + 1);
        let mut expected_ran: Vec<Iteration> = (1..fail_at).collect();
        expected_ran.extend(redo_from..=ITERATIONS);
        assert_eq!(ran, expected_ran, "every {every}, failing at {fail_at}");
        assert_eq!(
            endings(&run.endings),
            (WORKERS, WORKERS),
            "every worker of the first attempt is told it failed, of the second it completed"
        );
    }
}

#[test]
fn restarts_of_every_worker_stop_at_the_most_attempts() {
    let mut f = fault(0, Phase::Compute, 2);
    f.times = 2;
    let err = job(Some(f), FailurePolicy::RestartAll { max_attempts: 2 })
        .job
        .run()
        .unwrap_err();
    assert!(
        matches!(
            err,
            JobError::Worker {
                rank: 0,
                iteration: 2,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn in_barrier_mode_every_worker_restarts_and_ranks_waiting_in_a_barrier_are_released() {
    let failed = Arc::new(AtomicU64::new(0));
    let f = Arc::clone(&failed);
    let outcome = Job::builder(Master { folded: 1 }, move |rank| Gang {
        rank,
        failed: Arc::clone(&f),
    })
    .workers(3)
    .iterations(4)
    .barrier_mode(true)
    .iteration_timeout(Duration::from_secs(20))
    .failure_policy(FailurePolicy::RestartAll { max_attempts: 3 })
    .run()
    .unwrap();
    assert_eq!(
        failed.load(Ordering::SeqCst),
        2,
        "rank 2 computed iteration 3 twice: failing, then in the new attempt"
    );
    assert_eq!(outcome.report.recoveries.len(), 1);
    let fault_free = Job::builder(Master { folded: 1 }, move |rank| Gang {
        rank,
        failed: Arc::new(AtomicU64::new(1)),
    })
    .workers(3)
    .iterations(4)
    .barrier_mode(true)
    .run()
    .unwrap();
    assert_eq!(outcome.result, fault_free.result);
}

/// Ranks 0 and 1 wait in a barrier while rank 2 fails, once, in iteration 3.
struct Gang {
    rank: Rank,
    failed: Arc<AtomicU64>,
}

impl WorkerComputable for Gang {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        if self.rank == 2 && ctx.iteration() == 3 && self.failed.fetch_add(1, Ordering::SeqCst) == 0
        {
            std::thread::sleep(Duration::from_millis(50));
            return Err("rank 2 fails while the others wait in the barrier".into());
        }
        ctx.barrier()?;
        Ok(ctx.iteration() * 10 + self.rank as u64 + ctx.last_master_result().unwrap_or(&0) % 5)
    }
}

#[test]
fn a_policy_that_cannot_apply_is_refused_naming_it() {
    let err = job(None, FailurePolicy::ContinueWithout)
        .job
        .build()
        .unwrap_err();
    assert_eq!(err.setting, "failure_policy");
    assert!(err.to_string().contains("min_workers_ratio"), "{err}");
    // In barrier mode a replacement restarts every worker from the checkpoint: allowed.
    job(None, FailurePolicy::RestartWorker { max_restarts: 1 })
        .job
        .barrier_mode(true)
        .build()
        .unwrap();
    // A ratio whose quorum is every worker leaves no one out.
    let err = job(None, FailurePolicy::ContinueWithout)
        .job
        .workers(2)
        .min_workers(0.9, Duration::from_secs(1))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("quorum"), "{err}");
    let err = job(None, FailurePolicy::RestartAll { max_attempts: 0 })
        .job
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("max_attempts"), "{err}");
}

/// Votes to halt from iteration 5; rank 1 fails in iteration 3.
struct Voter {
    rank: Rank,
}

impl WorkerComputable for Voter {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        if self.rank == 1 && ctx.iteration() == 3 {
            return Err("rank 1 fails".into());
        }
        if ctx.iteration() >= 5 {
            ctx.vote_halt();
        }
        Ok(1)
    }
}

#[test]
fn without_a_lost_worker_a_unanimous_halt_vote_is_that_of_the_workers_left() {
    let outcome = Job::builder(Master { folded: 0 }, |rank| Voter { rank })
        .workers(4)
        .iterations(ITERATIONS)
        .worker_halt(true)
        .min_workers(0.5, Duration::from_secs(10))
        .failure_policy(FailurePolicy::ContinueWithout)
        .run()
        .unwrap();
    assert_eq!((outcome.iterations, outcome.halted), (5, true));
    assert_eq!(outcome.report.halted_by, Some(superstep::HaltedBy::Workers));
}
