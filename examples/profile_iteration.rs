//! A job with trivial compute, for profiling the cost of an iteration itself.
//!
//! ```text
//! cargo build --release --example profile_iteration
//! valgrind --tool=callgrind --callgrind-out-file=cg.out target/release/examples/profile_iteration 16 20000
//! callgrind_annotate --inclusive=no cg.out | head -40
//! ```
//!
//! Arguments: workers (default 16), iterations (default 20,000), and `auto` to run under
//! the default placement (else `Placement::Inline`). Either way the whole job runs on its
//! coordination thread, as trivial compute does; under `auto` the inline threshold is
//! raised to a second, so that valgrind's slowdown does not move work to the pool. A
//! fourth argument, `traced`, runs the job under a `tracing` subscriber that records INFO
//! and above (what a service usually runs with), its output thrown away.

use superstep::prelude::*;
use superstep::Placement;

struct Echo(u64);
impl WorkerComputable for Echo {
    type MasterResult = u64;
    type WorkerResult = u64;
    fn compute(&mut self, _: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        Ok(self.0)
    }
}

struct Fold;
impl MasterComputable for Fold {
    type MasterResult = u64;
    type WorkerResult = u64;
    fn compute(&mut self, ctx: &mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> {
        Ok(Step::Continue(ctx.worker_results().iter().sum()))
    }
}

fn main() -> Result<(), JobError> {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<u64>());
    let workers = args.next().and_then(Result::ok).unwrap_or(16) as usize;
    let iterations = args.next().and_then(Result::ok).unwrap_or(20_000);
    let auto = std::env::args().nth(3).as_deref() == Some("auto");
    if std::env::args().nth(4).as_deref() == Some("traced") {
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_writer(std::io::sink)
            .init();
    }
    let job = Job::builder(Fold, |rank| Echo(rank as u64))
        .workers(workers)
        .iterations(iterations);
    let job = if auto {
        job.placement(Placement::Auto)
            .inline_threshold(std::time::Duration::from_secs(1))
    } else {
        job.placement(Placement::Inline)
    };
    let outcome = job.run()?;
    let mut times: Vec<_> = outcome
        .report
        .iterations
        .iter()
        .map(|i| i.elapsed)
        .collect();
    times.sort();
    println!(
        "{workers} workers, {iterations} iterations: median {:?}, p99 {:?}",
        times[times.len() / 2],
        times[times.len() * 99 / 100]
    );
    Ok(())
}
