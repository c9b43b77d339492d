//! The master's memory for N large worker results (8 MB each, a `Vec<f64>` of 1,000,000),
//! with and without combining them as they arrive (`JobBuilder::combine`): the peak heap
//! of the job above what was live before it, measured by a counting allocator, and the
//! most results the master's node held at once, from the job report.
//!
//! Workers hold no data: each makes its 8 MB result afresh in compute, so what the peak
//! shows is the results in flight and held, not the shards.
//!
//! ```text
//! cargo bench --bench master_memory
//! ```

use peak_alloc::PeakAlloc;
use superstep::prelude::*;

#[global_allocator]
static HEAP: PeakAlloc = PeakAlloc;

const LEN: usize = 1_000_000;
const MB: f64 = 1024.0 * 1024.0;

struct Make;
impl WorkerComputable for Make {
    type MasterResult = f64;
    type WorkerResult = Vec<f64>;
    fn compute(&mut self, ctx: &mut WorkerContext<f64, Vec<f64>>) -> Result<Vec<f64>, BoxError> {
        let base = (ctx.rank() as u64 + ctx.iteration()) as f64;
        Ok((0..LEN).map(|i| base + i as f64 * 1e-6).collect())
    }
}

struct Total;
impl MasterComputable for Total {
    type MasterResult = f64;
    type WorkerResult = Vec<f64>;
    fn compute(&mut self, ctx: &mut MasterContext<f64, Vec<f64>>) -> Result<Step<f64>, BoxError> {
        let total = match ctx.combined_result() {
            Some(sum) => sum.iter().sum(),
            None => ctx
                .worker_results()
                .iter()
                .map(|v| v.iter().sum::<f64>())
                .sum(),
        };
        Ok(Step::Continue(total))
    }
}

/// Runs the job and returns (its result, the peak heap above the start in MB, the most
/// results held in any iteration).
fn run(workers: usize, combine: bool) -> (f64, f64, usize) {
    let mut job = Job::builder(Total, |_| Make).workers(workers).iterations(5);
    if combine {
        job = job.combine(|fold: &mut Vec<f64>, next: Vec<f64>| {
            fold.iter_mut().zip(next).for_each(|(a, b)| *a += b)
        });
    }
    let before = HEAP.current_usage();
    HEAP.reset_peak_usage();
    let outcome = job.run().expect("the job runs");
    let peak = HEAP.peak_usage().saturating_sub(before) as f64 / MB;
    let held = outcome
        .report
        .iterations
        .iter()
        .map(|i| i.results_held)
        .max()
        .unwrap_or(0);
    (*outcome.result, peak, held)
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this once as a check.
    let quick = !std::env::args().any(|a| a == "--bench");
    let counts: &[usize] = if quick { &[2] } else { &[1, 4, 8, 16] };
    println!("master_memory: 8 MB worker results, peak heap above the start of the job");
    println!("| workers | kept until the fold | combined as they arrive | ratio | results held (kept / combined) |");
    println!("|---:|---:|---:|---:|---|");
    for &n in counts {
        let (kept, kept_mb, kept_held) = run(n, false);
        let (combined, combined_mb, combined_held) = run(n, true);
        let drift = (kept - combined).abs() / kept.abs().max(1.0);
        assert!(
            drift < 1e-9,
            "the same total either way: {kept} against {combined}"
        );
        println!(
            "| {n} | {kept_mb:.0} MB | {combined_mb:.0} MB | {:.2}× | {kept_held} / {combined_held} |",
            combined_mb / kept_mb
        );
    }
}
