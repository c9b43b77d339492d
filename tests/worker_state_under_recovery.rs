//! A worker's state under recovery: derived from the master result (or loaded again by
//! `init`), a replaced or resumed worker is right — the simulator checks the example's job
//! under crashes with every recovering policy; kept in the worker alone from one iteration
//! to the next, it is lost with the worker, and the simulator finds the seed that shows it.
#![cfg(feature = "sim")]

#[path = "../examples/support/graph.rs"]
mod graph;
#[path = "../examples/support/labels.rs"]
mod labels;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use superstep::checkpoint::MemoryCheckpointStore;
use superstep::prelude::*;
use superstep::sim::{Faults, Simulation};
use superstep::FailurePolicy;

#[test]
fn label_propagation_gives_the_sequential_components_whatever_crashes_and_recovers() {
    let graph = labels::graph(400, 900, 3);
    let expected = labels::components(&graph);
    for policy in [
        FailurePolicy::RestartWorker { max_restarts: 100 },
        FailurePolicy::RestartAll { max_attempts: 100 },
    ] {
        let graph = Arc::clone(&graph);
        let expected = expected.clone();
        let recovered = AtomicU32::new(0);
        Simulation::from_job(move || {
            labels::job(Arc::clone(&graph), 4)
                .failure_policy(policy)
                .checkpoint(MemoryCheckpointStore::new(), 2)
        })
        .faults(Faults {
            worker_crash: 0.05,
            master_crash: 0.02,
            ..Faults::none()
        })
        .check(0..60, |run| {
            recovered.fetch_add(
                run.stats.worker_restarts + run.stats.new_attempts,
                Ordering::Relaxed,
            );
            match &run.outcome {
                Ok(o) if *o.result == expected => Ok(()),
                Ok(o) => Err(format!("other labels after {} iterations", o.iterations)),
                Err(e) => Err(e.to_string()),
            }
        });
        // The seeds did crash workers and masters, and every run recovered.
        assert!(
            recovered.into_inner() > 5,
            "{policy:?}: too few recoveries to tell"
        );
    }
}

/// Sums its shard every iteration into a running total it keeps — or derives it.
struct Running {
    derived: bool,
    total: u64,
}

impl WorkerComputable for Running {
    type MasterResult = Vec<u64>;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut WorkerContext<Vec<u64>, u64>) -> Result<u64, BoxError> {
        let shard = ctx.rank() as u64 + 1;
        self.total = if self.derived {
            // Right: last iteration's total is in the master result.
            ctx.last_master_result().map_or(0, |t| t[ctx.rank()]) + shard
        } else {
            // Wrong: a replaced worker starts again from 0.
            self.total + shard
        };
        Ok(self.total)
    }
}

/// Keeps every worker's running total, in rank order.
struct Totals;

impl MasterComputable for Totals {
    type MasterResult = Vec<u64>;
    type WorkerResult = u64;

    fn compute(
        &mut self,
        ctx: &mut MasterContext<Vec<u64>, u64>,
    ) -> Result<Step<Vec<u64>>, BoxError> {
        Ok(Step::Continue(ctx.worker_results().to_vec()))
    }
}

#[test]
fn state_kept_in_the_worker_alone_is_lost_with_it_and_the_simulator_says_so() {
    let running = |derived: bool| {
        Simulation::from_job(move || {
            Job::builder(Totals, move |_| Running { derived, total: 0 })
                .workers(3)
                .iterations(6)
                .failure_policy(FailurePolicy::RestartWorker { max_restarts: 100 })
        })
        .faults(Faults {
            worker_crash: 0.1,
            ..Faults::none()
        })
    };
    let expected: Vec<u64> = (1..=3).map(|shard| shard * 6).collect();
    let ends_right = |run: &superstep::sim::SimRun<Vec<u64>>| match &run.outcome {
        Ok(o) if *o.result == expected => Ok(()),
        other => Err(format!("{:?}", other.as_ref().map(|o| &o.result))),
    };
    running(true).check(0..100, ends_right);
    let failure = running(false)
        .try_check(0..100, ends_right)
        .expect_err("a replaced worker's lost total is found");
    assert!(
        failure.run().is_some_and(|r| r.stats.worker_restarts > 0),
        "{failure}"
    );
}
