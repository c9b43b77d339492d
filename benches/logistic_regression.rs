//! The logistic regression job's time per iteration against its sequential implementation
//! and against the same descent written with rayon (on as many threads as workers),
//! measured in the same run.
//!
//! ```text
//! cargo bench --bench logistic_regression
//! ```

#[path = "../examples/support/lr.rs"]
mod lr;

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

const ROWS: usize = 400_000;
const FEATURES: usize = 20;
const RATE: f64 = 0.5;

fn superstep(data: &Arc<lr::Dataset>, workers: usize, iters: u64) -> Duration {
    let outcome = lr::job(data, workers, RATE)
        .iterations(iters + 1)
        // Every iteration in the report: it keeps only the last 1,000 by default.
        .report_iterations((iters + 1) as usize)
        .run()
        .expect("the job runs");
    // The first iteration runs on the pool while placement is measured; count the rest.
    outcome
        .report
        .iterations
        .iter()
        .skip(1)
        .map(|i| i.elapsed)
        .sum()
}

fn sequential(data: &lr::Dataset, iters: u64) -> Duration {
    let start = Instant::now();
    std::hint::black_box(lr::sequential(data, iters, RATE));
    start.elapsed()
}

/// The peer: the same descent with rayon on a pool of `threads` threads.
fn rayon(pool: &rayon::ThreadPool, data: &lr::Dataset, iters: u64) -> Duration {
    pool.install(|| {
        let start = Instant::now();
        std::hint::black_box(lr::rayon(data, iters, RATE));
        start.elapsed()
    })
}

fn logistic_regression(c: &mut Criterion) {
    let data = Arc::new(lr::Dataset::generate(ROWS, FEATURES, 42));
    let mut group = c.benchmark_group("logistic_regression_iteration");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5))
        .warm_up_time(Duration::from_millis(500));
    group.bench_function("sequential", |b| {
        b.iter_custom(|iters| sequential(&data, iters))
    });
    // Every worker count the machine has cores for, beside rayon on as many threads.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut counts = vec![1usize, 2, 4, 8, 16];
    counts.retain(|&n| n <= cores.max(2));
    for workers in counts {
        group.bench_with_input(BenchmarkId::new("superstep", workers), &workers, |b, &n| {
            b.iter_custom(|iters| superstep(&data, n, iters))
        });
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(workers)
            .build()
            .expect("a rayon pool");
        group.bench_with_input(BenchmarkId::new("rayon", workers), &workers, |b, _| {
            b.iter_custom(|iters| rayon(&pool, &data, iters))
        });
    }
    group.finish();
}

criterion_group!(benches, logistic_regression);
criterion_main!(benches);
