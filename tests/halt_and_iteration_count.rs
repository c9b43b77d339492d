//! Halt at iteration k stops every worker at k; the iteration count stops the job; a
//! unanimous worker vote halts it only when enabled.

mod common;

use std::sync::{Arc, Mutex};

use common::{FnMaster, FnWorker};
use superstep::prelude::*;
use superstep::{HaltedBy, Placement};

/// Runs a job whose master halts at `halt_at` (if any) and returns the outcome and the
/// iterations each worker computed.
fn run(
    workers: usize,
    iterations: u64,
    halt_at: Option<u64>,
    placement: Placement,
) -> (superstep::JobOutcome<u64>, Vec<Vec<u64>>) {
    let computed = Arc::new(Mutex::new(vec![Vec::new(); workers]));
    let seen = Arc::clone(&computed);
    let outcome = Job::builder(
        FnMaster {
            f: move |ctx: &mut MasterContext<u64, u64>| {
                let i = ctx.iteration();
                Ok(if Some(i) == halt_at {
                    Step::Halt(i * 100)
                } else {
                    Step::Continue(i * 100)
                })
            },
        },
        move |rank| {
            let seen = Arc::clone(&seen);
            FnWorker {
                f: move |ctx: &mut WorkerContext<u64, u64>| {
                    seen.lock().unwrap()[rank].push(ctx.iteration());
                    Ok(0)
                },
            }
        },
    )
    .workers(workers)
    .iterations(iterations)
    .placement(placement)
    .run()
    .unwrap();
    let computed = computed.lock().unwrap().clone();
    (outcome, computed)
}

#[test]
fn a_master_halt_at_iteration_k_stops_every_worker_at_k() {
    for placement in [Placement::Auto, Placement::Inline, Placement::Pool] {
        for k in [1, 3, 7] {
            let (outcome, computed) = run(5, 20, Some(k), placement);
            assert!(outcome.halted);
            assert_eq!(outcome.iterations, k);
            assert_eq!(
                *outcome.result,
                k * 100,
                "the halting result is the final one"
            );
            assert_eq!(outcome.report.halted_by, Some(HaltedBy::Master));
            for (rank, iterations) in computed.iter().enumerate() {
                assert_eq!(
                    iterations,
                    &(1..=k).collect::<Vec<_>>(),
                    "rank {rank} with {placement:?}"
                );
            }
        }
    }
}

#[test]
fn the_iteration_count_stops_the_job() {
    let (outcome, computed) = run(3, 4, None, Placement::Auto);
    assert!(!outcome.halted);
    assert_eq!(outcome.iterations, 4);
    assert_eq!(*outcome.result, 400);
    assert_eq!(outcome.report.iterations.len(), 4);
    assert!(computed.iter().all(|c| c == &vec![1, 2, 3, 4]));
}

#[test]
fn a_halt_at_the_last_iteration_is_reported_as_a_halt() {
    let (outcome, _) = run(2, 3, Some(3), Placement::Auto);
    assert!(outcome.halted);
    assert_eq!(outcome.iterations, 3);
}

fn voting_job(worker_halt: bool, unanimous: bool) -> superstep::JobOutcome<u64> {
    Job::builder(
        FnMaster {
            f: |ctx: &mut MasterContext<u64, u64>| Ok(Step::Continue(ctx.halt_votes() as u64)),
        },
        move |rank| FnWorker {
            f: move |ctx: &mut WorkerContext<u64, u64>| {
                if ctx.iteration() >= 3 && (unanimous || rank != 0) {
                    ctx.vote_halt();
                }
                Ok(0)
            },
        },
    )
    .workers(4)
    .iterations(10)
    .worker_halt(worker_halt)
    .run()
    .unwrap()
}

#[test]
fn a_unanimous_worker_vote_halts_the_job_after_the_master_computed_that_iteration() {
    let outcome = voting_job(true, true);
    assert!(outcome.halted);
    assert_eq!(outcome.iterations, 3);
    assert_eq!(*outcome.result, 4, "the master saw every vote");
    assert_eq!(outcome.report.halted_by, Some(HaltedBy::Workers));
}

#[test]
fn worker_votes_do_not_halt_when_not_unanimous_or_not_enabled() {
    let outcome = voting_job(true, false);
    assert!(!outcome.halted);
    assert_eq!(outcome.iterations, 10);
    assert_eq!(*outcome.result, 3);
    let outcome = voting_job(false, true);
    assert!(!outcome.halted);
    assert_eq!(outcome.iterations, 10);
}
