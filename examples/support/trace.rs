//! A job recorded as a Chrome / Perfetto trace (`examples/trace.rs`, `tests/trace.rs`).

use std::path::Path;
use std::thread::sleep;
use std::time::Duration;

use superstep::prelude::*;
use tracing_subscriber::layer::SubscriberExt;

/// The rank that computes five times as long as the others.
pub const STRAGGLER: usize = 2;

/// Works for a millisecond (the straggler for five), then waits for every rank.
pub struct Ranked;

impl WorkerComputable for Ranked {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        let ms = if ctx.rank() == STRAGGLER { 5 } else { 1 };
        sleep(Duration::from_millis(ms));
        ctx.barrier()?;
        Ok(ms)
    }
}

/// Folds the workers' times.
pub struct Fold;

impl MasterComputable for Fold {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> {
        Ok(Step::Continue(ctx.worker_results().iter().sum()))
    }
}

/// Runs a job of `workers` ranks for `iterations` in barrier mode — every rank on a
/// thread of its own, so each is a track of its own — and writes its trace to `out`.
/// The recorder is the process's global subscriber (the job's threads report to it), so
/// this runs once per process.
pub fn record(
    out: &Path,
    workers: usize,
    iterations: u64,
) -> Result<JobOutcome<u64>, Box<dyn std::error::Error>> {
    let (chrome, guard) = tracing_chrome::ChromeLayerBuilder::new()
        .file(out)
        .include_args(true)
        .build();
    // superstep's spans at DEBUG: the job, its iterations, every rank's compute and sync
    // waits, the master's fold.
    let subscriber = tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new("superstep=debug"))
        .with(chrome);
    tracing::subscriber::set_global_default(subscriber)?;
    let outcome = Job::builder(Fold, |_| Ranked)
        .job_id("traced")
        .workers(workers)
        .iterations(iterations)
        .barrier_mode(true)
        .run();
    // Writes the rest of the trace and closes the file.
    drop(guard);
    Ok(outcome?)
}
