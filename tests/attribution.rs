//! A failure names the code that failed: a panic in a result's `Drop` is the failure of
//! the side whose type it is, wherever the value was last held, and a panicking worker
//! factory is the factory's failure, not `init`'s.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{summing_master, FnWorker};
use serde::{Deserialize, Serialize};
use superstep::prelude::*;
use superstep::transport::MemoryTransport;
use superstep::Cause;

/// A value whose `Drop` panics when its number is the one armed, once.
#[derive(Debug, Serialize, Deserialize)]
struct Bomb {
    n: u64,
    #[serde(skip)]
    armed: Option<Arc<AtomicBool>>,
}

impl Drop for Bomb {
    fn drop(&mut self) {
        if let Some(armed) = &self.armed {
            if armed.swap(false, Ordering::SeqCst) && !std::thread::panicking() {
                panic!("dropping bomb {}", self.n);
            }
        }
    }
}

/// A master whose result of iteration 2 panics when it is dropped.
struct BombMaster {
    armed: Arc<AtomicBool>,
}

impl MasterComputable for BombMaster {
    type MasterResult = Bomb;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut MasterContext<Bomb, u64>) -> Result<Step<Bomb>, BoxError> {
        let n = ctx.iteration();
        let armed = (n == 2).then(|| Arc::clone(&self.armed));
        Ok(Step::Continue(Bomb { n, armed }))
    }
}

struct Plain;

impl WorkerComputable for Plain {
    type MasterResult = Bomb;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut WorkerContext<Bomb, u64>) -> Result<u64, BoxError> {
        Ok(ctx.last_master_result().map_or(0, |b| b.n))
    }
}

fn is_drop_panic(cause: &Cause, n: u64) -> bool {
    cause.is_panic() && cause.to_string().contains(&format!("dropping bomb {n}"))
}

#[test]
fn a_master_result_whose_drop_panics_fails_the_master_not_the_worker_that_held_it_last() {
    for placement in [Placement::Inline, Placement::Pool] {
        for wire_check in [false, true] {
            let err = Job::builder(
                BombMaster {
                    armed: Arc::new(AtomicBool::new(true)),
                },
                |_| Plain,
            )
            .workers(4)
            .iterations(5)
            .placement(placement)
            .transport(MemoryTransport::new().wire_check(wire_check))
            .run()
            .unwrap_err();
            match &err {
                JobError::Master {
                    phase: Phase::Drop,
                    cause,
                    ..
                } if is_drop_panic(cause, 2) => {}
                other => panic!("{placement:?}, wire check {wire_check}: {other}"),
            }
        }
    }
}

/// A master that sums its workers' bombs.
struct BombSum;

impl MasterComputable for BombSum {
    type MasterResult = u64;
    type WorkerResult = Bomb;

    fn compute(&mut self, ctx: &mut MasterContext<u64, Bomb>) -> Result<Step<u64>, BoxError> {
        Ok(Step::Continue(
            ctx.worker_results().iter().map(|b| b.n).sum(),
        ))
    }
}

#[test]
fn a_worker_result_whose_drop_panics_fails_that_worker_not_the_master() {
    for placement in [Placement::Inline, Placement::Pool] {
        let armed = Arc::new(AtomicBool::new(true));
        let err = Job::builder(BombSum, move |rank| {
            let armed = Arc::clone(&armed);
            FnWorkerOf {
                f: move |ctx: &mut WorkerContext<u64, Bomb>| {
                    let n = 10 * rank as u64 + ctx.iteration();
                    // Rank 2's result of iteration 1 panics when dropped.
                    let armed = (rank == 2 && ctx.iteration() == 1).then(|| Arc::clone(&armed));
                    Ok(Bomb { n, armed })
                },
            }
        })
        .workers(3)
        .iterations(3)
        .placement(placement)
        .transport(MemoryTransport::new().wire_check(false))
        .run()
        .unwrap_err();
        match &err {
            JobError::Worker {
                rank: 2,
                phase: Phase::Drop,
                cause,
                ..
            } if is_drop_panic(cause, 21) => {}
            other => panic!("{placement:?}: {other}"),
        }
    }
}

/// A worker of any result types whose compute is a closure.
struct FnWorkerOf<F> {
    f: F,
}

impl<F> WorkerComputable for FnWorkerOf<F>
where
    F: FnMut(&mut WorkerContext<u64, Bomb>) -> Result<Bomb, BoxError> + Send + 'static,
{
    type MasterResult = u64;
    type WorkerResult = Bomb;

    fn compute(&mut self, ctx: &mut WorkerContext<u64, Bomb>) -> Result<Bomb, BoxError> {
        (self.f)(ctx)
    }
}

#[test]
fn a_panicking_worker_factory_is_the_factory_s_failure_not_init_s() {
    let err = Job::builder(summing_master(), |rank| {
        if rank == 1 {
            panic!("no shard for rank 1");
        }
        FnWorker {
            f: |_: &mut WorkerContext<u64, u64>| Ok(1),
        }
    })
    .workers(2)
    .run()
    .unwrap_err();
    match &err {
        JobError::Worker {
            rank: 1,
            iteration: 0,
            phase: Phase::Create,
            cause,
        } if cause.is_panic() => {}
        other => panic!("{other}"),
    }
    assert!(
        err.to_string().contains("worker 1 failed in create"),
        "{err}"
    );
}

/// A worker result whose encoding panics: the wire check runs it where the result is
/// sent, as the wire would.
#[derive(Debug, Deserialize)]
struct Unencodable(u64);

impl Serialize for Unencodable {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0 == 12 {
            panic!("cannot encode {}", self.0);
        }
        s.serialize_u64(self.0)
    }
}

struct UnencodableSum;

impl MasterComputable for UnencodableSum {
    type MasterResult = u64;
    type WorkerResult = Unencodable;

    fn compute(
        &mut self,
        ctx: &mut MasterContext<u64, Unencodable>,
    ) -> Result<Step<u64>, BoxError> {
        Ok(Step::Continue(
            ctx.worker_results().iter().map(|u| u.0).sum(),
        ))
    }
}

struct Counting(u64);

impl WorkerComputable for Counting {
    type MasterResult = u64;
    type WorkerResult = Unencodable;

    fn compute(
        &mut self,
        ctx: &mut WorkerContext<u64, Unencodable>,
    ) -> Result<Unencodable, BoxError> {
        Ok(Unencodable(10 * self.0 + ctx.iteration()))
    }
}

/// The send of a result runs the user's encoding under the wire check: a panic there is
/// the send's failure, naming the worker and the iteration — the job fails, nothing
/// crashes or waits.
#[test]
fn a_worker_result_whose_encoding_panics_fails_the_send_naming_the_worker() {
    for placement in [Placement::Inline, Placement::Pool, Placement::Auto] {
        let err = Job::builder(UnencodableSum, |rank| Counting(rank as u64))
            .workers(3)
            .iterations(4)
            .placement(placement)
            .transport(MemoryTransport::new().wire_check(true))
            .run()
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("worker 1 could not send its result of iteration 2")
                && text.contains("cannot encode 12"),
            "{placement:?}: {text}"
        );
    }
}
