//! The job with trivial compute that the latency and allocation benches run: each worker
//! adds its rank to the last master result, the master sums them.

use superstep::prelude::*;

/// A worker: the last master result plus its own number.
pub struct Echo(pub u64);
impl WorkerComputable for Echo {
    type MasterResult = u64;
    type WorkerResult = u64;
    fn compute(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        Ok(ctx.last_master_result().copied().unwrap_or(0) + self.0)
    }
}

/// The master: the sum of the workers' results, modulo a prime.
pub struct Fold;
impl MasterComputable for Fold {
    type MasterResult = u64;
    type WorkerResult = u64;
    fn compute(&mut self, ctx: &mut MasterContext<u64, u64>) -> Result<Step<u64>, BoxError> {
        Ok(Step::Continue(
            ctx.worker_results().iter().sum::<u64>() % 1_000_003,
        ))
    }
}
