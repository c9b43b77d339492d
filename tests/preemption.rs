//! A job asked to stop for a preemption (`Preempt::request`, as its preempt signal does)
//! checkpoints at the next iteration boundary and ends with `JobError::Preempted`; run
//! again, it resumes from there, and a job preempted again and again ends with the
//! fault-free result.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::summing_master;
use superstep::checkpoint::MemoryCheckpointStore;
use superstep::prelude::*;
use superstep::{Iteration, JobBuilder, Preempt, EXIT_PREEMPTED};

/// A worker whose state is its own (a running total of what its neighbour sent it, its
/// rank and the iteration), saved in checkpoints; it asks for a preemption when its rank
/// and iteration are `at`, and takes a few milliseconds an iteration, so that the request
/// lands while the job runs.
struct Running {
    total: u64,
    at: Option<(Rank, Iteration)>,
    preempt: Preempt,
}

use superstep::Rank;

impl WorkerComputable for Running {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        let (rank, i, n) = (ctx.rank(), ctx.iteration(), ctx.workers());
        if self.at == Some((rank, i)) {
            self.preempt.request();
            // The node's tick (every 20 ms) sees it before this iteration can end, however
            // busy the machine.
            std::thread::sleep(Duration::from_millis(300));
        }
        std::thread::sleep(Duration::from_millis(3));
        let told: u64 = ctx.messages::<u64>()?.iter().sum();
        self.total = self.total.wrapping_mul(3).wrapping_add(told) + rank as u64 + i;
        ctx.send((rank + 1) % n, self.total)?;
        Ok(self.total)
    }

    fn save_state(&self) -> Result<Vec<u8>, BoxError> {
        Ok(self.total.to_le_bytes().to_vec())
    }

    fn restore_state(&mut self, state: &[u8]) -> Result<(), BoxError> {
        self.total = u64::from_le_bytes(state.try_into()?);
        Ok(())
    }
}

const WORKERS: usize = 3;
const ITERATIONS: Iteration = 24;

fn running(at: Option<(Rank, Iteration)>, preempt: &Preempt) -> JobBuilder<u64, u64> {
    let handle = preempt.clone();
    Job::builder(summing_master(), move |_| Running {
        total: 0,
        at,
        preempt: handle.clone(),
    })
    .workers(WORKERS)
    .iterations(ITERATIONS)
    .messages::<u64>()
    .preempt(preempt.clone())
    // A short shutdown timeout makes the node's tick, which sees the request, 20 ms.
    .shutdown_timeout(Duration::from_millis(400))
}

fn fault_free() -> u64 {
    *running(None, &Preempt::new()).run().unwrap().result
}

#[test]
fn a_job_preempted_at_any_point_resumes_to_the_fault_free_result() {
    let want = fault_free();
    // The request from each rank at iterations across the job, every checkpoint interval
    // (a preemption in an iteration the job checkpoints ends after it; in another, after
    // the next one, whose workers save for it).
    let mut preemptions = 0;
    let cases = [
        (1, 4),
        (2, 5),
        (3, 4),
        (5, 3),
        (8, 5),
        (11, 4),
        (13, 7),
        (17, 5),
        (1, 1),
        (4, 2),
        (6, 6),
        (9, 3),
        (20, 4),
        (23, 5),
    ];
    for (case, every) in cases.into_iter().enumerate() {
        let store = MemoryCheckpointStore::new();
        let mut at = Some((case % WORKERS, every.0));
        let mut resumes_from = None;
        let outcome = loop {
            let preempt = Preempt::new();
            let run = running(at, &preempt)
                .checkpoint(store.clone(), every.1)
                .run();
            match run {
                Ok(outcome) => break outcome,
                Err(JobError::Preempted {
                    iteration,
                    checkpoint,
                    ref by,
                }) => {
                    preemptions += 1;
                    assert_eq!(by, "Preempt::request in this process");
                    let c = checkpoint.expect("a job with a store stops at a checkpoint");
                    assert_eq!(c, iteration, "it stops at the checkpoint it took");
                    assert!(
                        c >= at.unwrap().1,
                        "it stops after the iteration that asked, {at:?}: {c}"
                    );
                    assert!(
                        resumes_from.is_none_or(|r| c > r),
                        "every run gets further: {c} after {resumes_from:?}"
                    );
                    resumes_from = Some(c);
                    // Run again, it is asked to stop again some iterations later.
                    at = (c + 2 <= ITERATIONS).then(|| ((c as usize + 1) % WORKERS, c + 2));
                }
                Err(other) => panic!("{other}"),
            }
            assert!(preemptions < 100, "the job never completes");
        };
        assert_eq!(outcome.report.resumed_from(), resumes_from);
        assert_eq!(*outcome.result, want, "case {case}: {every:?}");
    }
    assert!(preemptions >= 20, "only {preemptions} preemptions");
}

#[test]
fn a_preempted_job_says_so_with_its_exit_code_and_to_its_interceptors() {
    /// Records how the master's and the workers' code saw the job end.
    #[derive(Clone, Default)]
    struct Endings(Arc<Mutex<Vec<String>>>);
    impl Endings {
        fn record(&self, ending: Ending<'_>) {
            self.0.lock().unwrap().push(match ending {
                Ending::Preempted {
                    iteration,
                    checkpoint,
                } => format!("preempted after {iteration}, resumes from {checkpoint:?}"),
                other => format!("{other:?}"),
            });
        }
    }
    impl WorkerInterceptor<u64, u64> for Endings {
        fn post_application(
            &mut self,
            _: &WorkerContext<u64, u64>,
            ending: Ending<'_>,
        ) -> Result<(), BoxError> {
            self.record(ending);
            Ok(())
        }
    }
    impl MasterInterceptor<u64, u64> for Endings {
        fn post_application(
            &mut self,
            _: &MasterContext<u64, u64>,
            ending: Ending<'_>,
        ) -> Result<(), BoxError> {
            self.record(ending);
            Ok(())
        }
    }
    let endings = Endings::default();
    let preempt = Preempt::new();
    let seen = endings.clone();
    let err = running(Some((0, 2)), &preempt)
        .checkpoint(MemoryCheckpointStore::new(), 4)
        .master_interceptor(endings.clone())
        .worker_interceptor(move |_| seen.clone())
        .run()
        .unwrap_err();
    let JobError::Preempted {
        iteration,
        checkpoint,
        ..
    } = err
    else {
        panic!("{err}")
    };
    assert_eq!(checkpoint, Some(iteration));
    assert_eq!(err.exit_code(), EXIT_PREEMPTED);
    assert!(err.is_preempted());
    assert!(
        err.to_string().contains(&format!(
            "run again, it resumes from the checkpoint of iteration {iteration}"
        )),
        "{err}"
    );
    let said = format!("preempted after {iteration}, resumes from Some({iteration})");
    assert_eq!(*endings.0.lock().unwrap(), vec![said; WORKERS + 1]);
}

#[test]
fn a_job_without_a_store_stops_at_the_next_boundary_and_says_it_starts_over() {
    let preempt = Preempt::new();
    let err = running(Some((1, 3)), &preempt).run().unwrap_err();
    let JobError::Preempted {
        iteration,
        checkpoint: None,
        ..
    } = err
    else {
        panic!("{err}")
    };
    assert!((3..ITERATIONS).contains(&iteration), "{iteration}");
    assert!(err.to_string().contains("starts over"), "{err}");
}

#[test]
fn a_job_asked_to_stop_before_it_starts_stops_before_its_first_iteration() {
    let preempt = Preempt::new();
    preempt.request();
    let store = MemoryCheckpointStore::new();
    let err = running(None, &preempt)
        .checkpoint(store.clone(), 2)
        .run()
        .unwrap_err();
    assert!(
        matches!(
            err,
            JobError::Preempted {
                iteration: 0,
                checkpoint: None,
                ..
            }
        ),
        "{err}"
    );
    // Nothing was lost: run again, the job completes as it would have.
    let outcome = running(None, &Preempt::new())
        .checkpoint(store, 2)
        .run()
        .unwrap();
    assert_eq!(*outcome.result, fault_free());
}
