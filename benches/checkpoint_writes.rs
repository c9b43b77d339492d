//! An iteration's time when every `EVERY`-th iteration is checkpointed to a slow store (one
//! whose every save sleeps `SLOW`, as a distant object store does), against the same job
//! with no checkpoints, measured in the same run. Each worker's compute takes `COMPUTE`, so
//! the store keeps up with the checkpoints (`SLOW` < `EVERY` × `COMPUTE`). The master hands
//! each checkpoint to a writer of its own and goes on: the slow store should cost an
//! iteration about the hand-off, not the write (`SLOW` / `EVERY` when written in place).
//!
//! ```text
//! cargo bench --bench checkpoint_writes
//! ```

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use superstep::checkpoint::{
    Checkpoint, CheckpointError, CheckpointStore, Loaded, MemoryCheckpointStore,
};
use superstep::prelude::*;

/// How long each save of the slow store takes.
const SLOW: Duration = Duration::from_millis(8);
/// Every how many iterations a checkpoint is saved.
const EVERY: u64 = 5;
/// How long each worker's compute takes.
const COMPUTE: Duration = Duration::from_millis(2);
const ITERATIONS: u64 = 50;

/// A store whose every save sleeps first.
struct Sleeping(MemoryCheckpointStore);

impl CheckpointStore for Sleeping {
    fn save(&mut self, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        std::thread::sleep(SLOW);
        self.0.save(checkpoint)
    }
    fn latest(&mut self) -> Result<Option<Loaded>, CheckpointError> {
        self.0.latest()
    }
}

struct Sum;
impl MasterComputable for Sum {
    type MasterResult = u64;
    type WorkerResult = u64;
    fn compute(&mut self, ctx: &mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> {
        Ok(Step::Continue(ctx.worker_results().iter().sum()))
    }
}

struct One;
impl WorkerComputable for One {
    type MasterResult = u64;
    type WorkerResult = u64;
    fn compute(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        std::thread::sleep(COMPUTE);
        Ok(ctx.last_master_result().copied().unwrap_or(0) % 7 + 1)
    }
}

/// The mean iteration of a job of 4 workers over `ITERATIONS`, checkpointed every `EVERY`
/// iterations to a sleeping store when `slow`.
fn mean_iteration(slow: bool) -> Duration {
    let job = Job::builder(Sum, |_| One)
        .workers(4)
        .iterations(ITERATIONS)
        .progress_interval(Duration::from_secs(3600));
    let job = if slow {
        job.checkpoint(Sleeping(MemoryCheckpointStore::new()), EVERY)
    } else {
        job
    };
    let outcome = job.run().expect("the job runs");
    outcome.report.iterating() / outcome.iterations as u32
}

fn checkpoint_writes(c: &mut Criterion) {
    let mut group = c.benchmark_group("iteration_with_a_slow_store");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10))
        .warm_up_time(Duration::from_millis(500));
    for (name, slow) in [
        ("no_checkpoints", false),
        ("every_5th_to_an_8ms_store", true),
    ] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| (0..iters).map(|_| mean_iteration(slow)).sum())
        });
    }
    group.finish();
}

criterion_group!(benches, checkpoint_writes);
criterion_main!(benches);
