//! Proptest strategies for simulated runs of your own job (feature `proptest`): fault
//! schedules, failure policies and settings. A fault schedule is data ([`Fault`]), so when
//! a property fails, proptest shrinks the schedule to a minimal failing one — fewer
//! faults, lower ranks, earlier iterations — and [`Simulation::try_check`] names the run
//! with the one line that replays it: the test again with the run's seed, which first
//! runs the failing case proptest saved.
//!
//! ```
//! use proptest::prelude::*;
//! use superstep::prelude::*;
//! use superstep::checkpoint::MemoryCheckpointStore;
//! use superstep::sim::{strategies, Simulation};
//!
//! struct Count;
//! impl WorkerComputable for Count {
//!     type MasterResult = u64;
//!     type WorkerResult = u64;
//!     fn compute(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
//!         Ok(ctx.last_master_result().copied().unwrap_or(0) + ctx.rank() as u64)
//!     }
//! }
//! struct Sum;
//! impl MasterComputable for Sum {
//!     type MasterResult = u64;
//!     type WorkerResult = u64;
//!     fn compute(&mut self, ctx: &mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> {
//!         Ok(Step::Continue(ctx.worker_results().iter().sum::<u64>() % 1_000_003))
//!     }
//! }
//!
//! /// How the program builds its job.
//! fn job() -> JobBuilder<u64, u64> {
//!     Job::builder(Sum, |_| Count)
//!         .workers(3)
//!         .iterations(6)
//!         .checkpoint(MemoryCheckpointStore::new(), 2)
//! }
//!
//! proptest! {
//!     #![proptest_config(ProptestConfig::with_cases(16))]
//!     // In your tests: `#[test]` on the function.
//!     fn recovers_from_any_fault_schedule(
//!         schedule in strategies::schedule(3, 6, 4),
//!         policy in strategies::recovering_policy(4),
//!     ) {
//!         let expected = Simulation::from_job(job).run(0).outcome.unwrap().result;
//!         Simulation::from_job(move || job().failure_policy(policy))
//!             .schedule(schedule)
//!             .try_check(0..2, |run| match &run.outcome {
//!                 Ok(o) if o.result == expected => Ok(()),
//!                 other => Err(format!("{other:?}")),
//!             })
//!             .map_err(|failure| TestCaseError::fail(failure.to_string()))?;
//!     }
//! }
//! # recovers_from_any_fault_schedule();
//! ```

use proptest::prelude::*;

#[cfg(doc)]
use super::Simulation;
use super::{CrashPoint, Fault};
use crate::checkpoint::MemoryCheckpointStore;
use crate::ids::Iteration;
use crate::job::JobBuilder;
use crate::payload::Payload;
use crate::protocol::FailurePolicy;

/// Where in an iteration the master's process crashes.
pub fn crash_point() -> impl Strategy<Value = CrashPoint> {
    prop_oneof![
        Just(CrashPoint::Gathering),
        Just(CrashPoint::BeforeCompute),
        Just(CrashPoint::BeforeCheckpoint),
        Just(CrashPoint::DuringCheckpoint),
        Just(CrashPoint::AfterCheckpoint),
        Just(CrashPoint::TornCheckpoint),
    ]
}

/// One fault of a run of `workers` workers and `iterations` iterations: a worker's crash,
/// a straggler, a duplicated, lost or delayed result, a crash of the master's process (in
/// start-up, in an iteration at any point, a torn checkpoint write included, or in the
/// drain), the loss of the master's host with its checkpoints, or a partition of the
/// network between the master and a worker.
pub fn fault(workers: usize, iterations: Iteration) -> impl Strategy<Value = Fault> {
    let rank = 0..workers.max(1);
    let iteration = 1..=iterations.max(1);
    prop_oneof![
        // Iteration 0: a crash during start-up.
        (rank.clone(), 0..=iterations.max(1), any::<bool>()).prop_map(
            |(rank, iteration, after_result)| Fault::WorkerCrash {
                rank,
                iteration,
                after_result,
            }
        ),
        (rank.clone(), iteration.clone())
            .prop_map(|(rank, iteration)| Fault::Slow { rank, iteration }),
        (rank.clone(), iteration.clone())
            .prop_map(|(rank, iteration)| Fault::Duplicate { rank, iteration }),
        (rank.clone(), iteration.clone())
            .prop_map(|(rank, iteration)| Fault::Drop { rank, iteration }),
        (rank, iteration.clone(), 1..200u64).prop_map(|(rank, iteration, millis)| {
            Fault::Delay {
                rank,
                iteration,
                millis,
            }
        }),
        // Iteration 0: a crash during start-up.
        (0..=iterations.max(1), crash_point())
            .prop_map(|(iteration, point)| Fault::MasterCrash { iteration, point }),
        Just(Fault::MasterCrashInDrain),
        iteration
            .clone()
            .prop_map(|iteration| Fault::MasterHostLost { iteration }),
        (0..workers.max(1), 1..=iterations.max(1), 1..100u64).prop_map(
            |(rank, iteration, millis)| Fault::Partition {
                rank,
                iteration,
                millis,
            }
        ),
    ]
}

/// A schedule of at most `max` different faults of a run of `workers` workers and
/// `iterations` iterations, in order. It shrinks by dropping faults and simplifying the
/// rest.
pub fn schedule(
    workers: usize,
    iterations: Iteration,
    max: usize,
) -> impl Strategy<Value = Vec<Fault>> {
    proptest::collection::btree_set(fault(workers, iterations), 0..=max)
        .prop_map(|faults| faults.into_iter().collect())
}

/// A failure policy that recovers from `faults` failures of workers and ends with the
/// fault-free result: a replacement per failure (`RestartWorker`), or a restart of every
/// worker (`RestartAll`). (`ContinueWithout` recovers too, but its result lacks the ranks
/// it left out.)
pub fn recovering_policy(faults: u32) -> impl Strategy<Value = FailurePolicy> {
    prop_oneof![
        Just(FailurePolicy::RestartWorker {
            max_restarts: faults.max(1),
        }),
        // Attempts are counted for each start of the master's process: as many as the
        // failures, with room to spare.
        Just(FailurePolicy::RestartAll {
            max_attempts: faults
                .saturating_mul(faults)
                .saturating_add(faults)
                .saturating_add(2),
        }),
    ]
}

/// Any failure policy, with up to `max` restarts or attempts.
pub fn policy(max: u32) -> impl Strategy<Value = FailurePolicy> {
    let max = max.max(1);
    prop_oneof![
        Just(FailurePolicy::Fail),
        (0..=max).prop_map(|max_restarts| FailurePolicy::RestartWorker { max_restarts }),
        Just(FailurePolicy::ContinueWithout),
        (1..=max).prop_map(|max_attempts| FailurePolicy::RestartAll { max_attempts }),
    ]
}

/// The shape of a job that a property test varies — its worker count, its iteration
/// count, a checkpoint every k iterations or none, whether the workers' votes halt it —
/// applied to the program's own builder with [`Shape::apply`]:
/// `Simulation::from_job(move || shape.apply(job()))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Shape {
    /// The number of workers.
    pub workers: usize,
    /// The most iterations.
    pub iterations: Iteration,
    /// A checkpoint every this many iterations; `None` leaves the builder's checkpoints
    /// as they are (none, unless it set them).
    pub checkpoint_every: Option<Iteration>,
    /// Whether the workers' unanimous vote halts the job.
    pub worker_halt: bool,
}

impl Shape {
    /// `job` in this shape. Its checkpoints go to a store in memory, which the simulator
    /// replaces by its own (that one survives the master's crashes).
    pub fn apply<M: Payload, W: Payload>(&self, job: JobBuilder<M, W>) -> JobBuilder<M, W> {
        let job = job
            .workers(self.workers)
            .iterations(self.iterations)
            .worker_halt(self.worker_halt);
        match self.checkpoint_every {
            Some(every) => job.checkpoint(MemoryCheckpointStore::new(), every),
            None => job,
        }
    }
}

/// Shapes of a job: 1 to `max_workers` workers, 1 to `max_iterations` iterations, a
/// checkpoint every k iterations or the builder's own, worker halt votes on or off.
pub fn shape(max_workers: usize, max_iterations: Iteration) -> impl Strategy<Value = Shape> {
    let max_iterations = max_iterations.max(1);
    (
        1..=max_workers.max(1),
        1..=max_iterations,
        proptest::option::of(1..=max_iterations),
        any::<bool>(),
    )
        .prop_map(
            |(workers, iterations, checkpoint_every, worker_halt)| Shape {
                workers,
                iterations,
                checkpoint_every,
                worker_halt,
            },
        )
}
