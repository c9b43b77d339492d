//! The first failure ends the job at once: `run` returns it within the failure grace of
//! the failure, whatever the other workers' compute is doing — in memory, with every
//! placement, and over TCP. Once the failure is known no compute starts; a compute that
//! checks `ctx.check_cancelled()` stops early; the coordinator's `on_error` runs once.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

#[cfg(feature = "tcp")]
use common::over_tcp;
use common::{summing_master, FnWorker, WorkerFn};
use superstep::coordinator::{Coordinator, WorkerReport};
use superstep::prelude::*;
use superstep::{Cancel, Phase, Placement};

/// How long the other workers compute in the failing iteration, not looking at the job.
const LONG: Duration = Duration::from_secs(10);
/// How soon after the failure `run` must return: the grace (250 ms) with room for a loaded
/// machine, and far below `LONG`.
const SOON: Duration = Duration::from_secs(3);

/// What the workers saw.
#[derive(Default)]
struct Seen {
    /// When rank 1 failed.
    failed_at: OnceLock<Instant>,
    /// When each long compute started, and whether the job had failed by then (as the
    /// compute saw it, on its first line).
    long_started: Mutex<Vec<(usize, Instant, bool)>>,
    /// Computes that stopped early, having checked for cancellation.
    stopped_early: AtomicUsize,
}

impl Seen {
    fn failed_at(&self) -> Instant {
        *self.failed_at.get().expect("rank 1 failed")
    }

    /// No long compute started once the failure was known: each started before rank 1
    /// failed, or — started by the runtime while rank 1's code was still returning its
    /// error, before the job could know it — saw the job not failed yet on its first line.
    fn assert_no_compute_started_after_the_failure(&self) {
        let failed = self.failed_at();
        for (rank, started, known) in self.long_started.lock().unwrap().iter() {
            assert!(
                *started <= failed || !known,
                "worker {rank}'s compute started {:?} after the failure was known",
                started.duration_since(failed)
            );
        }
    }
}

/// Rank 1 fails in iteration 3; every other rank computes for `LONG` there — looking at
/// the job (`check_cancelled`) when `cooperative`, not at all otherwise.
fn workers(seen: Arc<Seen>, cooperative: bool) -> impl Fn(usize) -> FnWorker<WorkerFn> {
    move |rank| {
        let seen = Arc::clone(&seen);
        FnWorker {
            f: Box::new(move |ctx: &mut WorkerContext<u64, u64>| {
                if ctx.iteration() != 3 {
                    return Ok(1);
                }
                if rank == 1 {
                    // Fails once every other rank's long compute started, or after a
                    // second — one still queued behind this one on the pool, or run after
                    // it inline, starts only once the failure is known, and must not. No
                    // compute is started by the runtime just as the failure is made.
                    let until = Instant::now() + Duration::from_secs(1);
                    while seen.long_started.lock().unwrap().len() + 1 < ctx.workers()
                        && Instant::now() < until
                    {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    let _ = seen.failed_at.set(Instant::now());
                    return Err("shard 1 is corrupt".into());
                }
                let (started, known) = (Instant::now(), ctx.is_cancelled());
                seen.long_started
                    .lock()
                    .unwrap()
                    .push((rank, started, known));
                let until = Instant::now() + LONG;
                while Instant::now() < until {
                    if cooperative {
                        if let Err(cancelled) = ctx.check_cancelled() {
                            seen.stopped_early.fetch_add(1, Ordering::SeqCst);
                            return Err(cancelled.into());
                        }
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(1)
            }),
        }
    }
}

fn assert_rank_1_failed_in_iteration_3(error: &JobError) {
    match error {
        JobError::Worker {
            rank: 1,
            iteration: 3,
            phase: Phase::Compute,
            cause,
        } => assert_eq!(cause.message(), "shard 1 is corrupt"),
        other => panic!("expected worker 1's failure in iteration 3, got {other}"),
    }
}

fn run_in_memory(placement: Placement, cooperative: bool) -> (JobError, Duration, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let error = Job::builder(summing_master(), workers(Arc::clone(&seen), cooperative))
        .workers(3)
        .iterations(10)
        .placement(placement)
        .run()
        .unwrap_err();
    let after = seen.failed_at().elapsed();
    (error, after, seen)
}

#[test]
fn in_memory_run_returns_the_first_failure_within_the_grace_whatever_the_others_compute() {
    for placement in [Placement::Auto, Placement::Pool, Placement::Inline] {
        let (error, after, seen) = run_in_memory(placement, false);
        assert_rank_1_failed_in_iteration_3(&error);
        assert!(
            after < SOON,
            "{placement:?}: run returned {after:?} after the failure"
        );
        seen.assert_no_compute_started_after_the_failure();
    }
}

#[test]
fn a_compute_that_checks_for_cancellation_stops_early() {
    let (error, after, seen) = run_in_memory(Placement::Pool, true);
    assert_rank_1_failed_in_iteration_3(&error);
    assert!(after < SOON, "run returned {after:?} after the failure");
    let started = seen.long_started.lock().unwrap().len();
    // Every long compute that started saw the cancellation (the pool's threads are free
    // again: they stopped, they were not given up on).
    let deadline = Instant::now() + SOON;
    while seen.stopped_early.load(Ordering::SeqCst) < started && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(seen.stopped_early.load(Ordering::SeqCst), started);
}

/// A coordinator that counts its hooks.
#[derive(Clone, Default)]
struct Counting(Arc<Mutex<Vec<String>>>);

impl Coordinator for Counting {
    fn on_finish(&mut self, _: &[WorkerReport]) -> Result<(), BoxError> {
        self.0.lock().unwrap().push("on_finish".into());
        Ok(())
    }
    fn on_error(&mut self, error: &JobError) -> Result<(), BoxError> {
        self.0.lock().unwrap().push(format!("on_error: {error}"));
        Ok(())
    }
}

#[test]
fn the_coordinator_cleans_up_once_before_run_returns_even_when_compute_holds_the_job_s_thread() {
    for placement in [Placement::Inline, Placement::Pool] {
        let seen = Arc::new(Seen::default());
        let hooks = Counting::default();
        let error = Job::builder(summing_master(), workers(Arc::clone(&seen), false))
            .workers(3)
            .iterations(10)
            .placement(placement)
            .coordinator(hooks.clone())
            .run()
            .unwrap_err();
        assert_rank_1_failed_in_iteration_3(&error);
        let called = hooks.0.lock().unwrap().clone();
        assert_eq!(called.len(), 1, "{placement:?}: {called:?}");
        assert!(called[0].starts_with("on_error: worker 1"), "{called:?}");
    }
}

#[cfg(feature = "tcp")]
#[test]
fn over_tcp_every_process_returns_the_first_failure_within_the_grace() {
    let seen = Arc::new(Seen::default());
    let job_seen = Arc::clone(&seen);
    let returned = Arc::new(Mutex::new(Vec::new()));
    let job_returned = Arc::clone(&returned);
    let outcomes = over_tcp::<u64, u64, _>(3, "first-failure", move |rank, transport| {
        let outcome = Job::builder(summing_master(), workers(Arc::clone(&job_seen), false))
            .iterations(10)
            .transport(transport)
            .run();
        job_returned.lock().unwrap().push((rank, Instant::now()));
        outcome
    });
    for (rank, outcome) in outcomes.iter().enumerate() {
        match outcome {
            Err(error) => assert_rank_1_failed_in_iteration_3(error),
            Ok(_) => panic!("rank {rank}'s process completed"),
        }
    }
    let failed = seen.failed_at();
    for (rank, at) in returned.lock().unwrap().iter() {
        let after = at.duration_since(failed);
        assert!(
            after < SOON,
            "rank {rank}'s process returned {after:?} after the failure"
        );
    }
}

/// A master interceptor whose `post_application` takes longer than the grace.
struct SlowEnd(Arc<Mutex<Option<bool>>>);

impl MasterInterceptor<u64, u64> for SlowEnd {
    fn post_application(
        &mut self,
        _: &MasterContext<u64, u64>,
        ending: Ending<'_>,
    ) -> Result<(), BoxError> {
        std::thread::sleep(Duration::from_millis(700));
        *self.0.lock().unwrap() = Some(matches!(ending, Ending::Failed(_)));
        Ok(())
    }
}

#[test]
fn the_end_of_a_failed_job_is_not_cut_short_by_the_grace() {
    // The master's `post_application` starts after the failure: it is the end itself, and
    // `run` waits for it, whatever the grace.
    let ended = Arc::new(Mutex::new(None));
    let error = Job::builder(summing_master(), |rank| FnWorker {
        f: Box::new(
            move |_: &mut WorkerContext<u64, u64>| -> Result<u64, BoxError> {
                if rank == 1 {
                    return Err("shard 1 is corrupt".into());
                }
                Ok(1)
            },
        ) as WorkerFn,
    })
    .workers(3)
    .master_interceptor(SlowEnd(Arc::clone(&ended)))
    .run()
    .unwrap_err();
    assert!(matches!(error, JobError::Worker { rank: 1, .. }), "{error}");
    assert_eq!(
        *ended.lock().unwrap(),
        Some(true),
        "post_application ran to its end"
    );
}

/// Runs a job whose master computes on the pool and, in iteration 2, cancels the job and
/// then runs `then`; returns the job's error.
fn cancelled_while_the_master_computes(
    then: impl Fn(&MasterContext<u64, u64>) -> Result<(), BoxError> + Send + 'static,
) -> JobError {
    let cancel = Cancel::new();
    let canceller = cancel.clone();
    Job::builder(
        common::FnMaster {
            f: move |ctx: &mut MasterContext<u64, u64>| -> Result<Step<u64>, BoxError> {
                if ctx.iteration() == 2 {
                    canceller.cancel();
                    then(ctx)?;
                }
                Ok(Step::Continue(1))
            },
        },
        |_| FnWorker {
            f: Box::new(|_: &mut WorkerContext<u64, u64>| Ok(1u64)) as WorkerFn,
        },
    )
    .workers(2)
    .iterations(5)
    .placement(Placement::Pool)
    .cancel(cancel)
    .run()
    .unwrap_err()
}

#[test]
fn a_cancelled_job_does_not_wait_for_the_master_s_long_compute_on_the_pool() {
    let started = Arc::new(OnceLock::new());
    let master_started = Arc::clone(&started);
    let begun = Instant::now();
    let error = cancelled_while_the_master_computes(move |_| {
        let _ = master_started.set(Instant::now());
        std::thread::sleep(LONG);
        Ok(())
    });
    assert_eq!(error, JobError::Cancelled);
    let after = started
        .get()
        .expect("the master computed iteration 2")
        .elapsed();
    assert!(
        after < SOON,
        "run returned {after:?} after the cancel ({:?} in all)",
        begun.elapsed()
    );
}

#[test]
fn a_master_compute_that_checks_for_cancellation_stops_early() {
    let stopped = Arc::new(OnceLock::new());
    let master_stopped = Arc::clone(&stopped);
    let error = cancelled_while_the_master_computes(move |ctx| {
        let cancelled_at = Instant::now();
        while cancelled_at.elapsed() < LONG {
            if let Err(cancelled) = ctx.check_cancelled() {
                let _ = master_stopped.set(cancelled_at.elapsed());
                return Err(cancelled.into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    });
    assert_eq!(
        error,
        JobError::Cancelled,
        "the job's first failure, not the compute's"
    );
    let stopped = stopped
        .get()
        .expect("the master's compute saw the cancellation");
    assert!(*stopped < SOON, "it stopped {stopped:?} after the cancel");
}
