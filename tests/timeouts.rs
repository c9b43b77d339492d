//! Every wait has a timeout, and its error names whom it was waiting for.

mod common;

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::sleep;
use std::time::Duration;

use common::{summing_master, FnMaster, FnWorker};
use superstep::prelude::*;
use superstep::{Placement, Waiting};

const SHORT: Duration = Duration::from_millis(300);
const SLOW: Duration = Duration::from_millis(1500);

/// Runs a job in which rank 1 is slow in iteration 2, with a short iteration timeout.
fn rank_1_slow_in_iteration_2(placement: Placement) -> JobError {
    Job::builder(summing_master(), |rank| FnWorker {
        f: move |ctx: &mut WorkerContext<u64, u64>| {
            if rank == 1 && ctx.iteration() == 2 {
                sleep(SLOW);
            }
            Ok(1)
        },
    })
    .workers(3)
    .iterations(5)
    .iteration_timeout(SHORT)
    .placement(placement)
    .run()
    .unwrap_err()
}

#[test]
fn an_iteration_timeout_names_the_ranks_whose_results_did_not_arrive() {
    match rank_1_slow_in_iteration_2(Placement::Pool) {
        JobError::WorkersTimedOut {
            during,
            missing,
            waited,
            ..
        } => {
            assert_eq!(during, Waiting::Iteration(2));
            assert_eq!(missing, vec![1]);
            assert!(waited >= SHORT);
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_compute_that_stalls_the_coordination_thread_still_ends_in_a_timeout() {
    // Inline compute shares the coordination thread: while it sleeps no timer can fire,
    // and the ranks queued behind it cannot deliver either. The deadline still holds when
    // the late results arrive, and the stalled rank is among those named.
    for placement in [Placement::Auto, Placement::Inline] {
        match rank_1_slow_in_iteration_2(placement) {
            JobError::WorkersTimedOut {
                during: Waiting::Iteration(2),
                missing,
                ..
            } => assert!(missing.contains(&1), "{missing:?} with {placement:?}"),
            other => panic!("unexpected {other:?} with {placement:?}"),
        }
    }
}

struct SlowInit(usize);
impl WorkerComputable for SlowInit {
    type MasterResult = u64;
    type WorkerResult = u64;
    fn init(&mut self, _: &mut WorkerContext<u64, u64>) -> Result<(), BoxError> {
        if self.0 == 2 {
            sleep(SLOW);
        }
        Ok(())
    }
    fn compute(&mut self, _: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        Ok(0)
    }
}

#[test]
fn a_startup_timeout_names_the_ranks_that_did_not_register() {
    let err = Job::builder(summing_master(), SlowInit)
        .workers(4)
        .startup_timeout(SHORT)
        .run()
        .unwrap_err();
    assert!(
        matches!(err, JobError::WorkersTimedOut { during: Waiting::Registration, ref missing, .. } if missing == &vec![2]),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("in registration waiting for worker(s) [2]"),
        "{err}"
    );
}

#[test]
fn a_master_compute_that_outlives_the_iteration_timeout_is_named() {
    // Iteration 1 runs on the pool (Auto has not measured it yet), iteration 3 inline.
    for slow_at in [1, 3] {
        let master = FnMaster {
            f: move |ctx: &mut MasterContext<u64, u64>| {
                if ctx.iteration() == slow_at {
                    sleep(SLOW);
                }
                Ok(Step::Continue(0))
            },
        };
        let err = Job::builder(master, |_| FnWorker {
            f: |_: &mut WorkerContext<u64, u64>| Ok(0),
        })
        .workers(2)
        .iteration_timeout(SHORT)
        .run()
        .unwrap_err();
        assert!(
            matches!(err, JobError::MasterTimedOut { during: Waiting::Iteration(i), .. } if i == slow_at),
            "{err:?}"
        );
    }
}

#[test]
fn a_shutdown_timeout_names_the_workers_that_did_not_finish() {
    struct SlowCleanup;
    impl WorkerInterceptor<u64, u64> for SlowCleanup {
        fn post_application(
            &mut self,
            ctx: &WorkerContext<u64, u64>,
            _: Ending<'_>,
        ) -> Result<(), BoxError> {
            if ctx.rank() == 0 {
                sleep(SLOW);
            }
            Ok(())
        }
    }
    let err = Job::builder(summing_master(), |_| FnWorker {
        f: |_: &mut WorkerContext<u64, u64>| Ok(0),
    })
    .workers(3)
    .iterations(2)
    .shutdown_timeout(SHORT)
    .worker_interceptor(|_| SlowCleanup)
    .run()
    .unwrap_err();
    assert!(
        matches!(err, JobError::WorkersTimedOut { during: Waiting::Shutdown, ref missing, .. } if missing == &vec![0]),
        "{err:?}"
    );
}

#[test]
fn inline_code_that_does_not_return_is_given_up_on_when_its_deadline_passes() {
    // The blocked code holds the job's only coordination thread, so only the watchdog on
    // the calling thread can end the job. The code is released after `run` returned, so a
    // run that waited for it would not end in this timeout.
    for master_blocks in [false, true] {
        let (release, released) = mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        let block = move || -> Result<(), BoxError> {
            match released
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(60))
            {
                Ok(()) => Ok(()),
                Err(_) => Err("nobody released me".into()),
            }
        };
        let for_master = block.clone();
        let master = FnMaster {
            f: move |ctx: &mut MasterContext<u64, u64>| {
                if master_blocks && ctx.iteration() == 2 {
                    for_master()?;
                }
                Ok(Step::Continue(0))
            },
        };
        let err = Job::builder(master, move |rank| {
            let block = block.clone();
            FnWorker {
                f: move |ctx: &mut WorkerContext<u64, u64>| {
                    if !master_blocks && rank == 1 && ctx.iteration() == 2 {
                        block()?;
                    }
                    Ok(1)
                },
            }
        })
        .workers(3)
        .iterations(5)
        .iteration_timeout(SHORT)
        .placement(Placement::Inline)
        .run()
        .unwrap_err();
        release.send(()).unwrap();
        if master_blocks {
            assert!(
                matches!(
                    err,
                    JobError::MasterTimedOut {
                        during: Waiting::Iteration(2),
                        ..
                    }
                ),
                "{err:?}"
            );
        } else {
            assert!(
                matches!(err, JobError::WorkersTimedOut { during: Waiting::Iteration(2), ref missing, .. } if missing == &vec![1]),
                "{err:?}"
            );
        }
    }
}

#[test]
fn an_endless_timeout_means_no_limit() {
    let outcome = Job::builder(summing_master(), |_| FnWorker {
        f: |_: &mut WorkerContext<u64, u64>| Ok(1),
    })
    .workers(3)
    .iterations(4)
    .startup_timeout(Duration::MAX)
    .iteration_timeout(Duration::MAX)
    .shutdown_timeout(Duration::MAX)
    .run()
    .unwrap();
    assert_eq!(*outcome.result, 12);
}

/// Sleeps in its `post_application`: the end of a worker that takes a while.
struct SlowEnd;

impl WorkerInterceptor<u64, u64> for SlowEnd {
    fn post_application(
        &mut self,
        _: &WorkerContext<u64, u64>,
        _: superstep::Ending<'_>,
    ) -> Result<(), BoxError> {
        sleep(Duration::from_millis(150));
        Ok(())
    }
}

#[test]
fn a_stop_run_inline_after_a_long_failed_compute_has_its_own_shutdown_deadline() {
    // The compute fails after longer than the shutdown timeout; the worker's stop then runs
    // inline, within the same broadcast. Its deadline starts with it, not with the
    // broadcast: the job fails with the compute's failure, not a shutdown timeout.
    let err = Job::builder(summing_master(), |rank| FnWorker {
        f: move |_: &mut WorkerContext<u64, u64>| {
            if rank == 0 {
                sleep(Duration::from_millis(600));
                return Err("gave up".into());
            }
            Ok(1)
        },
    })
    .workers(2)
    .iterations(3)
    .placement(Placement::Inline)
    .shutdown_timeout(SHORT)
    .worker_interceptor(|_| SlowEnd)
    .run()
    .unwrap_err();
    assert!(
        matches!(
            err,
            JobError::Worker {
                rank: 0,
                phase: superstep::Phase::Compute,
                ..
            }
        ),
        "{err:?}"
    );
}
