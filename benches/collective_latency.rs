//! The cost of one small call inside compute, in memory and in barrier mode: an iteration
//! of four workers that make no call (the round alone, the baseline measured in the same
//! run), one `barrier()`, or one `all_reduce` of a single `f64` — the call a training loop
//! makes for a loss or a count; and eight such values, each in a call of its own or all in
//! one `all_reduce_many`.
//!
//! ```text
//! cargo bench --bench collective_latency
//! ```

#[path = "support/timing.rs"]
mod timing;
#[path = "support/trivial.rs"]
#[allow(dead_code)] // its worker is the iteration benches'
mod trivial;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use superstep::collective::ReduceOp;
use superstep::prelude::*;
use timing::{measured, WARMUP};
use trivial::Fold;

/// What each worker's compute calls.
#[derive(Clone, Copy)]
enum Call {
    None,
    Barrier,
    AllReduce,
    /// Eight one-element values, each in its own `all_reduce`.
    EightCalls,
    /// The same eight values in one `all_reduce_many`.
    EightInOne,
}

struct Caller {
    rank: u64,
    call: Call,
}

impl WorkerComputable for Caller {
    type MasterResult = u64;
    type WorkerResult = u64;

    fn compute(&mut self, ctx: &mut WorkerContext<u64, u64>) -> Result<u64, BoxError> {
        match self.call {
            Call::None => {}
            Call::Barrier => ctx.barrier()?,
            Call::AllReduce => {
                let mut loss = Floats::from(vec![self.rank as f64]);
                ctx.all_reduce(&mut loss, ReduceOp::Sum)?;
                std::hint::black_box(&loss);
            }
            Call::EightCalls => {
                let mut values = eight(self.rank);
                for value in &mut values {
                    ctx.all_reduce(value, ReduceOp::Sum)?;
                }
                std::hint::black_box(&values);
            }
            Call::EightInOne => {
                let mut values = eight(self.rank);
                let mut each: Vec<&mut Floats> = values.iter_mut().collect();
                ctx.all_reduce_many(&mut each, ReduceOp::Sum)?;
                std::hint::black_box(&values);
            }
        }
        Ok(ctx.last_master_result().copied().unwrap_or(0) + self.rank)
    }
}

/// Eight one-element values: a loss, a count, and the like.
fn eight(rank: u64) -> Vec<Floats> {
    (0..8)
        .map(|k| Floats::from(vec![(rank + k) as f64]))
        .collect()
}

/// The measured iterations' time, each from its broadcast to its master result.
fn iterating(workers: usize, call: Call, iters: u64) -> Duration {
    let outcome = Job::builder(Fold, move |rank| Caller {
        rank: rank as u64,
        call,
    })
    .workers(workers)
    .barrier_mode(true)
    .iterations(iters + WARMUP)
    .report_iterations((iters + WARMUP) as usize)
    .run()
    .expect("the job runs");
    measured(&outcome)
}

fn in_memory(c: &mut Criterion) {
    let mut group = c.benchmark_group("collective/memory");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));
    let workers = 4;
    for (name, call) in [
        ("round_alone", Call::None),
        ("barrier", Call::Barrier),
        ("all_reduce_8_bytes", Call::AllReduce),
        ("eight_all_reduces", Call::EightCalls),
        ("one_all_reduce_many_of_eight", Call::EightInOne),
    ] {
        group.bench_with_input(BenchmarkId::new(name, workers), &workers, |b, &n| {
            b.iter_custom(|iters| iterating(n, call, iters))
        });
    }
    group.finish();
}

criterion_group!(benches, in_memory);
criterion_main!(benches);
