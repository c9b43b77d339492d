//! The master's `init` makes the first master result, computed once in the master and
//! broadcast with iteration 1; a job resumed from a checkpoint starts from the
//! checkpoint's result instead.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use superstep::checkpoint::MemoryCheckpointStore;
use superstep::prelude::*;

/// A model whose first version the master makes: each iteration adds the workers' sum.
struct Model {
    inits: Arc<AtomicU64>,
    /// Fails the master's compute at this iteration, once.
    fail_at: Option<u64>,
    init_fails: bool,
}

impl MasterComputable for Model {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn init(&mut self, ctx: &mut MasterContext<u64, u64>) -> Result<Option<u64>, BoxError> {
        assert_eq!(ctx.iteration(), 0);
        assert!(ctx.last_master_result().is_none());
        self.inits.fetch_add(1, Ordering::SeqCst);
        if self.init_fails {
            return Err("no initial model".into());
        }
        Ok(Some(1000))
    }

    fn compute(&mut self, ctx: &mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> {
        if self.fail_at == Some(ctx.iteration()) {
            self.fail_at = None;
            return Err("the master dies".into());
        }
        let last = *ctx
            .last_master_result()
            .ok_or("the master sees the initial model in iteration 1")?;
        Ok(Step::Continue(
            last + ctx.worker_results().iter().sum::<u64>(),
        ))
    }
}

/// Returns 1 plus what it saw as the last master result, recording it.
struct Reader {
    seen: Seen,
}

impl WorkerComputable for Reader {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        let last = ctx.last_master_result().copied();
        self.seen
            .lock()
            .unwrap()
            .push((ctx.rank(), ctx.iteration(), last));
        Ok(1)
    }
}

type Seen = Arc<Mutex<Vec<(usize, u64, Option<u64>)>>>;

fn job(model: Model, seen: &Seen) -> JobBuilder<u64, u64> {
    let seen = Arc::clone(seen);
    Job::builder(model, move |_| Reader {
        seen: Arc::clone(&seen),
    })
    .workers(3)
    .iterations(4)
}

fn model(inits: &Arc<AtomicU64>) -> Model {
    Model {
        inits: Arc::clone(inits),
        fail_at: None,
        init_fails: false,
    }
}

#[test]
fn the_master_s_init_result_is_what_every_worker_and_the_master_see_in_iteration_1() {
    let (inits, seen) = (Arc::new(AtomicU64::new(0)), Seen::default());
    let outcome = job(model(&inits), &seen).run().unwrap();
    assert_eq!(
        inits.load(Ordering::SeqCst),
        1,
        "computed once, in the master"
    );
    assert_eq!(*outcome.result, 1000 + 4 * 3);
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    let first: Vec<_> = seen.iter().filter(|(_, i, _)| *i == 1).collect();
    assert_eq!(
        first,
        [
            &(0, 1, Some(1000)),
            &(1, 1, Some(1000)),
            &(2, 1, Some(1000))
        ]
    );
    assert!(seen.contains(&(2, 2, Some(1003))), "{seen:?}");
}

#[test]
fn a_failed_init_fails_the_job_as_the_master_s_init() {
    let (inits, seen) = (Arc::new(AtomicU64::new(0)), Seen::default());
    let mut failing = model(&inits);
    failing.init_fails = true;
    let err = job(failing, &seen).run().unwrap_err();
    match &err {
        JobError::Master {
            iteration: 0,
            phase: Phase::Init,
            cause,
        } => assert_eq!(cause.to_string(), "no initial model"),
        other => panic!("{other}"),
    }
    assert!(seen.lock().unwrap().is_empty(), "no worker computed");
}

#[test]
fn a_job_resumed_from_a_checkpoint_starts_from_it_not_from_init() {
    let (inits, seen) = (Arc::new(AtomicU64::new(0)), Seen::default());
    let store = MemoryCheckpointStore::new();
    let mut dying = model(&inits);
    dying.fail_at = Some(3);
    job(dying, &seen)
        .checkpoint(store.clone(), 2)
        .run()
        .unwrap_err();
    assert_eq!(inits.load(Ordering::SeqCst), 1);
    seen.lock().unwrap().clear();
    let resumed = job(model(&inits), &seen)
        .checkpoint(store, 2)
        .run()
        .unwrap();
    assert_eq!(inits.load(Ordering::SeqCst), 1, "not called when resuming");
    assert_eq!(resumed.report.resumed_from(), Some(2));
    assert_eq!(
        *resumed.result,
        1000 + 4 * 3,
        "as a run without the failure"
    );
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().all(|&(_, i, last)| i >= 3 && last.is_some()),
        "{seen:?}"
    );
}

#[test]
fn without_init_the_first_iteration_has_no_master_result() {
    struct Plain;
    impl MasterComputable for Plain {
        type MasterResult = u64;
        type WorkerResult = u64;
        fn compute(&mut self, ctx: &mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> {
            Ok(Step::Continue(ctx.worker_results().iter().sum()))
        }
    }
    let seen = Seen::default();
    let shared = Arc::clone(&seen);
    Job::builder(Plain, move |_| Reader {
        seen: Arc::clone(&shared),
    })
    .workers(2)
    .iterations(2)
    .run()
    .unwrap();
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().all(|&(_, i, last)| (i == 1) == last.is_none()),
        "{seen:?}"
    );
}

/// Fails once, on rank 1 at iteration 2.
struct Flaky {
    rank: usize,
    failed: Arc<std::sync::atomic::AtomicBool>,
}

impl WorkerComputable for Flaky {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        if self.rank == 1 && ctx.iteration() == 2 && !self.failed.swap(true, Ordering::SeqCst) {
            return Err("flaky".into());
        }
        Ok(1)
    }
}

#[test]
fn a_job_that_starts_over_from_iteration_1_makes_its_first_result_again() {
    let inits = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let outcome = Job::builder(model(&inits), move |rank| Flaky {
        rank,
        failed: Arc::clone(&failed),
    })
    .workers(3)
    .iterations(4)
    .failure_policy(FailurePolicy::RestartAll { max_attempts: 2 })
    .run()
    .unwrap();
    assert_eq!(outcome.report.attempt, 1);
    assert_eq!(
        inits.load(Ordering::SeqCst),
        2,
        "once per start from iteration 1"
    );
    assert_eq!(*outcome.result, 1000 + 4 * 3);
}
