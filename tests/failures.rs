//! An error or a panic in any compute or interceptor fails the job at once with a typed
//! error naming the worker rank (or the master), the iteration, the phase and the cause;
//! every other actor is told, runs its post_application and stops.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{summing_master, FnMaster, FnWorker, WorkerFn};
use superstep::prelude::*;
use superstep::{ConfigError, Phase};

/// Generous timeouts: a test that waited them out would hang instead of passing.
const NEVER: Duration = Duration::from_secs(3600);

fn fails_at(rank: usize, iteration: u64, panic: bool) -> impl Fn(usize) -> FnWorker<WorkerFn> {
    move |r| FnWorker {
        f: Box::new(move |ctx: &mut WorkerContext<u64, u64>| {
            if r == rank && ctx.iteration() == iteration {
                if panic {
                    panic!("shard {r} is corrupt");
                }
                return Err(format!("shard {r} is corrupt").into());
            }
            Ok(1)
        }),
    }
}

fn job(
    workers: usize,
) -> impl FnOnce(superstep::JobBuilder<u64, u64>) -> superstep::JobBuilder<u64, u64> {
    move |b| {
        b.workers(workers)
            .iterations(10)
            .startup_timeout(NEVER)
            .iteration_timeout(NEVER)
            .shutdown_timeout(NEVER)
    }
}

#[test]
fn an_error_in_a_worker_compute_names_the_rank_the_iteration_and_the_cause() {
    let err = job(5)(Job::builder(summing_master(), fails_at(3, 4, false)))
        .run()
        .unwrap_err();
    match &err {
        JobError::Worker {
            rank,
            iteration,
            phase,
            cause,
        } => {
            assert_eq!((*rank, *iteration, *phase), (3, 4, Phase::Compute));
            assert_eq!(cause.message(), "shard 3 is corrupt");
            assert!(!cause.is_panic());
            let source = std::error::Error::source(cause).expect("the user's error is kept");
            assert_eq!(source.to_string(), "shard 3 is corrupt");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "worker 3 failed in compute at iteration 4: shard 3 is corrupt"
    );
}

#[test]
fn a_panic_in_a_worker_compute_fails_the_job_like_an_error() {
    let err = job(4)(Job::builder(summing_master(), fails_at(0, 1, true)))
        .run()
        .unwrap_err();
    match err {
        JobError::Worker {
            rank: 0,
            iteration: 1,
            phase: Phase::Compute,
            cause,
        } => {
            assert!(cause.is_panic());
            assert_eq!(cause.message(), "shard 0 is corrupt");
        }
        other => panic!("unexpected {other:?}"),
    }
}

struct FailingInit;
impl WorkerComputable for FailingInit {
    type MasterResult = u64;
    type WorkerResult = u64;
    fn init(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<(), BoxError> {
        if ctx.rank() == 1 {
            return Err("no such file: part-0001".into());
        }
        Ok(())
    }
    fn compute(&mut self, _: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        Ok(0)
    }
}

#[test]
fn an_error_in_init_names_the_rank_and_iteration_zero() {
    let err = job(3)(Job::builder(summing_master(), |_| FailingInit))
        .run()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "worker 1 failed in init at iteration 0: no such file: part-0001"
    );
}

#[test]
fn an_error_in_the_master_compute_names_the_master_and_the_iteration() {
    let master = FnMaster {
        f: |ctx: &mut MasterContext<u64, u64>| {
            if ctx.iteration() == 2 {
                return Err("diverged".into());
            }
            Ok(Step::Continue(0))
        },
    };
    let err = job(3)(Job::builder(master, fails_at(99, 0, false)))
        .run()
        .unwrap_err();
    assert_eq!(
        err,
        JobError::Master {
            iteration: 2,
            phase: Phase::Compute,
            cause: superstep::Cause::message_only(superstep::CauseKind::Error, "diverged"),
        }
    );
    assert_eq!(
        err.to_string(),
        "master failed in compute at iteration 2: diverged"
    );
}

struct FailIn {
    phase: Phase,
    iteration: u64,
}

impl FailIn {
    fn check(&self, phase: Phase, iteration: u64) -> Result<(), BoxError> {
        if phase == self.phase && iteration == self.iteration {
            panic!("interceptor gave up");
        }
        Ok(())
    }
}

impl WorkerInterceptor<u64, u64> for FailIn {
    fn pre_iteration(&mut self, ctx: &WorkerContext<u64, u64>) -> Result<(), BoxError> {
        self.check(Phase::PreIteration, ctx.iteration())
    }
    fn post_iteration(&mut self, ctx: &WorkerContext<u64, u64>) -> Result<(), BoxError> {
        self.check(Phase::PostIteration, ctx.iteration())
    }
}

impl MasterInterceptor<u64, u64> for FailIn {
    fn pre_iteration(&mut self, ctx: &MasterContext<u64, u64>) -> Result<(), BoxError> {
        self.check(Phase::PreIteration, ctx.iteration())
    }
    fn post_iteration(&mut self, ctx: &MasterContext<u64, u64>) -> Result<(), BoxError> {
        self.check(Phase::PostIteration, ctx.iteration())
    }
}

#[test]
fn a_panic_in_a_worker_interceptor_names_the_rank_the_iteration_and_the_phase() {
    for phase in [Phase::PreIteration, Phase::PostIteration] {
        let err = job(4)(Job::builder(summing_master(), fails_at(99, 0, false)))
            .worker_interceptor(move |rank| FailIn {
                phase,
                iteration: if rank == 2 { 5 } else { 0 },
            })
            .run()
            .unwrap_err();
        match err {
            JobError::Worker {
                rank: 2,
                iteration: 5,
                phase: p,
                cause,
            } => {
                assert_eq!(p, phase);
                assert!(cause.is_panic());
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn a_failure_in_a_master_interceptor_names_the_master_the_iteration_and_the_phase() {
    for phase in [Phase::PreIteration, Phase::PostIteration] {
        let err = job(2)(Job::builder(summing_master(), fails_at(99, 0, false)))
            .master_interceptor(FailIn {
                phase,
                iteration: 3,
            })
            .run()
            .unwrap_err();
        assert!(
            matches!(err, JobError::Master { iteration: 3, phase: p, .. } if p == phase),
            "{err:?}"
        );
    }
}

/// Who ran post_application, and the iterations it was told of or the failure.
type Recorded = Vec<(String, Result<u64, JobError>)>;

/// Records every post_application: who and how the job ended.
#[derive(Clone, Default)]
struct Endings(Arc<Mutex<Recorded>>);

impl Endings {
    fn record(&self, who: String, ending: Ending<'_>) {
        let how = match ending {
            Ending::Completed { iterations, .. } => Ok(iterations),
            Ending::Failed(e) => Err(e.clone()),
            Ending::Preempted { .. } => panic!("no job here is preempted"),
        };
        self.0.lock().unwrap().push((who, how));
    }
}

impl WorkerInterceptor<u64, u64> for Endings {
    fn post_application(
        &mut self,
        ctx: &WorkerContext<u64, u64>,
        ending: Ending<'_>,
    ) -> Result<(), BoxError> {
        self.record(format!("worker {}", ctx.rank()), ending);
        Ok(())
    }
}

impl MasterInterceptor<u64, u64> for Endings {
    fn post_application(
        &mut self,
        _: &MasterContext<u64, u64>,
        ending: Ending<'_>,
    ) -> Result<(), BoxError> {
        self.record("master".into(), ending);
        Ok(())
    }
}

#[test]
fn every_post_application_runs_on_failure_and_is_told_the_first_failure() {
    let endings = Endings::default();
    let workers = 6;
    let for_workers = endings.clone();
    let err = job(workers)(Job::builder(summing_master(), fails_at(4, 2, false)))
        .master_interceptor(endings.clone())
        .worker_interceptor(move |_| for_workers.clone())
        .run()
        .unwrap_err();
    assert_eq!(err.rank(), Some(4));
    let recorded = endings.0.lock().unwrap().clone();
    assert_eq!(recorded.len(), workers + 1, "{recorded:?}");
    assert_eq!(
        recorded.last().unwrap().0,
        "master",
        "the master cleans up last"
    );
    for (who, how) in &recorded {
        assert_eq!(
            how.as_ref().unwrap_err(),
            &err,
            "{who} was told the first failure"
        );
    }
}

#[test]
fn every_post_application_runs_on_completion_and_is_told_so() {
    let endings = Endings::default();
    let for_workers = endings.clone();
    Job::builder(summing_master(), fails_at(99, 0, false))
        .workers(3)
        .iterations(2)
        .master_interceptor(endings.clone())
        .worker_interceptor(move |_| for_workers.clone())
        .run()
        .unwrap();
    let recorded = endings.0.lock().unwrap().clone();
    assert_eq!(recorded.len(), 4);
    assert!(recorded.iter().all(|(_, how)| how == &Ok(2)));
}

#[test]
fn a_failure_in_post_application_after_completion_fails_the_job() {
    struct Fails;
    impl WorkerInterceptor<u64, u64> for Fails {
        fn post_application(
            &mut self,
            ctx: &WorkerContext<u64, u64>,
            _: Ending<'_>,
        ) -> Result<(), BoxError> {
            if ctx.rank() == 1 {
                return Err("could not flush output".into());
            }
            Ok(())
        }
    }
    let err = Job::builder(summing_master(), fails_at(99, 0, false))
        .workers(2)
        .iterations(2)
        .worker_interceptor(|_| Fails)
        .run()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "worker 1 failed in post_application at iteration 2: could not flush output"
    );
}

#[test]
fn an_invalid_setting_is_refused_before_the_job_starts_naming_the_setting() {
    let err = Job::builder(summing_master(), fails_at(99, 0, false))
        .workers(0)
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        ConfigError {
            setting: "workers".into(),
            value: "0".into(),
            requirement: "must be at least 1".into()
        }
    );
    let err = Job::builder(summing_master(), fails_at(99, 0, false))
        .iterations(0)
        .run()
        .unwrap_err();
    assert!(
        matches!(err, JobError::Config(ref c) if c.setting == "iterations"),
        "{err}"
    );
}

#[test]
fn a_worker_that_fails_after_the_abort_is_still_told_the_first_failure() {
    struct InitFails;
    impl WorkerComputable for InitFails {
        type MasterResult = u64;
        type WorkerResult = u64;
        fn init(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<(), BoxError> {
            if ctx.rank() == 1 {
                // Fails later than rank 0, after the abort has reached this worker.
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(format!("rank {} cannot load", ctx.rank()).into())
        }
        fn compute(&mut self, _: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
            Ok(0)
        }
    }
    let endings = Endings::default();
    let for_workers = endings.clone();
    let err = job(2)(Job::builder(summing_master(), |_| InitFails))
        .compute_threads(2)
        .worker_interceptor(move |_| for_workers.clone())
        .run()
        .unwrap_err();
    assert_eq!(err.rank(), Some(0), "{err}");
    let recorded = endings.0.lock().unwrap().clone();
    assert_eq!(recorded.len(), 2);
    for (who, how) in &recorded {
        assert_eq!(how.as_ref().unwrap_err(), &err, "{who}");
    }
}

#[test]
fn an_error_whose_display_panics_fails_the_job_instead_of_the_process() {
    #[derive(Debug)]
    struct Unprintable;
    impl std::fmt::Display for Unprintable {
        fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            panic!("cannot print this error")
        }
    }
    impl std::error::Error for Unprintable {}
    let err = job(2)(Job::builder(summing_master(), |_| FnWorker {
        f: |_: &mut WorkerContext<u64, u64>| Err(Box::new(Unprintable) as BoxError),
    }))
    .placement(superstep::Placement::Pool)
    .run()
    .unwrap_err();
    match err {
        JobError::Worker {
            phase: Phase::Compute,
            cause,
            ..
        } => {
            assert!(cause.is_panic());
            assert_eq!(cause.message(), "cannot print this error");
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_panicking_event_subscriber_does_not_break_the_job() {
    let outcome = Job::builder(summing_master(), |_| FnWorker {
        f: |_: &mut WorkerContext<u64, u64>| Ok(1),
    })
    .workers(2)
    .iterations(3)
    .on_event(|event| {
        if matches!(
            event,
            JobEvent::IterationCompleted(_) | JobEvent::WorkerDone { .. }
        ) {
            panic!("the progress bar broke");
        }
    })
    .run()
    .unwrap();
    assert_eq!(*outcome.result, 6);
}
