//! Each worker sums its shard, the master sums the workers.
//!
//! ```text
//! cargo run --example sum
//! ```

use superstep::prelude::*;

/// Sums the numbers of its shard, which it loads in `init`.
struct SumWorker {
    numbers: u64,
    shard: Vec<u64>,
}

impl WorkerComputable for SumWorker {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn init(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<(), BoxError> {
        // Rank r of n holds every n-th number starting at r + 1.
        let (rank, n) = (ctx.rank() as u64, ctx.workers() as u64);
        self.shard = (1..=self.numbers).filter(|i| i % n == rank).collect();
        Ok(())
    }

    fn compute(&mut self, _ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        Ok(self.shard.iter().sum())
    }
}

/// Sums the workers' sums.
struct SumMaster;

impl MasterComputable for SumMaster {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> {
        let total: u64 = ctx.worker_results().iter().sum();
        println!(
            "iteration {}: workers summed {:?} = {total}",
            ctx.iteration(),
            ctx.worker_results()
        );
        Ok(Step::Halt(total))
    }
}

fn main() -> Result<(), JobError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,superstep=info".into()),
        )
        // Log lines on standard error, the results on standard output.
        .with_writer(std::io::stderr)
        .init();
    let numbers = 1_000_000;
    let outcome = Job::builder(SumMaster, move |_rank| SumWorker {
        numbers,
        shard: Vec::new(),
    })
    .job_id("sum")
    .workers(4)
    .run()?;
    let expected: u64 = (1..=numbers).sum();
    println!(
        "sum of 1..={numbers} = {} (expected {expected}) in {:?}",
        outcome.result, outcome.report.elapsed
    );
    assert_eq!(*outcome.result, expected);
    Ok(())
}
