//! An iteration's time when every iteration is checkpointed to a slow store (one whose
//! every save sleeps `SLOW`, as a distant or paused object store does), against the same
//! job with no checkpoints, measured in the same run. The master hands each checkpoint to
//! a writer of its own and goes on: the slow store should cost an iteration about the
//! hand-off, not the write.
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
const SLOW: Duration = Duration::from_millis(20);
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
        Ok(ctx.last_master_result().copied().unwrap_or(0) % 7 + 1)
    }
}

/// The mean iteration of a job of 4 workers over `ITERATIONS`, checkpointed every
/// iteration to a sleeping store when `slow`.
fn mean_iteration(slow: bool) -> Duration {
    let job = Job::builder(Sum, |_| One)
        .workers(4)
        .iterations(ITERATIONS)
        .progress_interval(Duration::from_secs(3600));
    let job = if slow {
        job.checkpoint(Sleeping(MemoryCheckpointStore::new()), 1)
            // The writes lag by design here: say it at the end only.
            .checkpoint_slow(Duration::from_secs(3600))
    } else {
        job
    };
    let outcome = job.run().expect("the job runs");
    outcome.report.iterating() / outcome.iterations as u32
}

fn checkpoint_writes(c: &mut Criterion) {
    // Every checkpoint but one a write's time skips or waits, which the job says at WARN:
    // not here, where the store lags by design.
    std::env::set_var("SUPERSTEP_LOG", "off");
    let mut group = c.benchmark_group("iteration_with_a_slow_store");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10))
        .warm_up_time(Duration::from_millis(500));
    for (name, slow) in [
        ("no_checkpoints", false),
        ("every_iteration_20ms_store", true),
    ] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| (0..iters).map(|_| mean_iteration(slow)).sum())
        });
    }
    group.finish();
}

criterion_group!(benches, checkpoint_writes);
criterion_main!(benches);
