//! What the latency benches measure of a job: its iterations past a warm-up.

use std::time::Duration;

use superstep::JobOutcome;

/// Iterations run and not counted, so the measured ones are in their steady state.
pub const WARMUP: u64 = 20;

/// The measured iterations' time, each from its broadcast to its master result: those of
/// the report past the first [`WARMUP`].
pub fn measured<M>(outcome: &JobOutcome<M>) -> Duration {
    outcome
        .report
        .iterations
        .iter()
        .skip(WARMUP as usize)
        .map(|i| i.elapsed)
        .sum()
}
