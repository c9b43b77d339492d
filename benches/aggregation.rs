//! Aggregation throughput with 8 MB worker results (a `Vec<f64>` of 1,000,000), in memory
//! and over TCP, and beside it the floor: 8 MB as raw bytes over a loopback connection,
//! and as rmp-serde `Vec<f64>` (what serde's per-element encoding costs). Then the
//! master's fold of 8 ranks' 1 MB results over loopback TCP, three ways: the star (every
//! result to the master), the tree and the ring (folded among the workers,
//! `Aggregation::Tree` and `Ring`).
//!
//! ```text
//! cargo bench --bench aggregation
//! ```

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

#[path = "support/tcp.rs"]
mod tcp;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use superstep::prelude::*;
use superstep::{Floats, Payload};
use tcp::run_over_tcp;

const LEN: usize = 1_000_000;
const BYTES: u64 = (LEN * 8) as u64;
const WARMUP: u64 = 2;

/// Returns its 8 MB vector each iteration (a fresh copy, as real compute would produce).
struct Big<T>(T);
impl<T: Payload + Clone> WorkerComputable for Big<T> {
    type MasterResult = f64;
    type WorkerResult = T;
    fn compute(&mut self, _: &mut WorkerContext<f64, T>) -> Result<T, BoxError> {
        Ok(self.0.clone())
    }
}

/// Sums the workers' vectors, in rank order.
struct Sum<T>(std::marker::PhantomData<fn() -> T>);
impl<T: Payload + AsRef<[f64]>> MasterComputable for Sum<T> {
    type MasterResult = f64;
    type WorkerResult = T;
    fn compute(&mut self, ctx: &mut MasterContext<f64, T>) -> Result<Step<f64>, BoxError> {
        let mut total = 0.0;
        for v in ctx.worker_results() {
            total += v.as_ref().iter().sum::<f64>();
        }
        Ok(Step::Continue(total))
    }
}

fn shard<T: From<Vec<f64>>>(rank: usize) -> T {
    T::from(
        (0..LEN)
            .map(|i| (i + rank) as f64 * 0.5)
            .collect::<Vec<f64>>(),
    )
}

fn measured(outcome: &superstep::JobOutcome<f64>) -> Duration {
    outcome
        .report
        .iterations
        .iter()
        .skip(WARMUP as usize)
        .map(|i| i.elapsed)
        .sum()
}

fn job<T: Payload + Clone + AsRef<[f64]> + From<Vec<f64>>>(
    workers: usize,
    iters: u64,
) -> superstep::JobBuilder<f64, T> {
    Job::builder(Sum::<T>(std::marker::PhantomData), |rank| {
        Big(shard::<T>(rank))
    })
    .workers(workers)
    .iterations(iters + WARMUP)
    // Every iteration in the report: it keeps only the last 1,000 by default.
    .report_iterations((iters + WARMUP) as usize)
}

fn superstep_memory(workers: usize, iters: u64) -> Duration {
    measured(&job::<Vec<f64>>(workers, iters).run().expect("the job runs"))
}

fn superstep_tcp<T: Payload + Clone + AsRef<[f64]> + From<Vec<f64>>>(
    ranks: usize,
    iters: u64,
) -> Duration {
    measured(&run_over_tcp(ranks, move || job::<T>(ranks, iters)))
}

/// The floor: 8 MB of raw bytes written on one loopback connection and read on the other
/// side, with a one-byte acknowledgement per transfer.
fn raw_bytes_tcp(iters: u64) -> Duration {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let reader = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; BYTES as usize];
        while s.read_exact(&mut buf).is_ok() {
            if s.write_all(&[1]).is_err() {
                break;
            }
        }
    });
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let data = vec![7u8; BYTES as usize];
    let start = Instant::now();
    for _ in 0..iters {
        s.write_all(&data).unwrap();
        let mut ack = [0u8; 1];
        s.read_exact(&mut ack).unwrap();
    }
    let elapsed = start.elapsed();
    drop(s);
    let _ = reader.join();
    elapsed
}

/// For context: encoding and decoding a `Vec<f64>` of 1,000,000 with rmp-serde.
fn rmp_serde_round(iters: u64) -> Duration {
    let v: Vec<f64> = shard(0);
    let start = Instant::now();
    for _ in 0..iters {
        let bytes = rmp_serde::to_vec(&v).unwrap();
        let back: Vec<f64> = rmp_serde::from_slice(&bytes).unwrap();
        std::hint::black_box(back);
    }
    start.elapsed()
}

fn aggregation(c: &mut Criterion) {
    let mut group = c.benchmark_group("aggregate_8mb");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_millis(500));
    group.throughput(Throughput::Bytes(BYTES));
    group.bench_function("floor_raw_bytes_tcp", |b| b.iter_custom(raw_bytes_tcp));
    group.bench_function("rmp_serde_vec_f64", |b| b.iter_custom(rmp_serde_round));
    for ranks in [1usize, 2] {
        // Throughput per worker result: an iteration moves `ranks` results.
        group.throughput(Throughput::Bytes(BYTES * ranks as u64));
        group.bench_with_input(
            BenchmarkId::new("superstep_memory", ranks),
            &ranks,
            |b, &n| b.iter_custom(|iters| superstep_memory(n, iters)),
        );
        group.bench_with_input(
            BenchmarkId::new("superstep_tcp_vec_f64", ranks),
            &ranks,
            |b, &n| b.iter_custom(|iters| superstep_tcp::<Vec<f64>>(n, iters)),
        );
        group.bench_with_input(
            BenchmarkId::new("superstep_tcp_floats", ranks),
            &ranks,
            |b, &n| b.iter_custom(|iters| superstep_tcp::<Floats>(n, iters)),
        );
    }
    group.finish();
}

/// Sums the fold of the workers' results.
struct FoldSum;
impl MasterComputable for FoldSum {
    type MasterResult = f64;
    type WorkerResult = Floats;
    fn compute(&mut self, ctx: &mut MasterContext<f64, Floats>) -> Result<Step<f64>, BoxError> {
        let fold = ctx.combined_result().ok_or("a fold")?;
        Ok(Step::Continue(fold.iter().sum()))
    }
}

/// 1 MB of `f64` per rank.
const FOLD_LEN: usize = 125_000;

fn superstep_fold(ranks: usize, aggregation: Aggregation, iters: u64) -> Duration {
    let job = move || {
        Job::builder(FoldSum, |rank| {
            Big(Floats::from(vec![rank as f64 + 0.5; FOLD_LEN]))
        })
        .workers(ranks)
        .iterations(iters + WARMUP)
        .report_iterations((iters + WARMUP) as usize)
        .barrier_mode(true)
        .aggregation(aggregation)
        .combine_by(superstep::collective::ReduceOp::Sum)
    };
    measured(&run_over_tcp(ranks, job))
}

fn fold(c: &mut Criterion) {
    let mut group = c.benchmark_group("fold_1mb_tcp");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_millis(500));
    let ranks = 8;
    group.throughput(Throughput::Bytes((FOLD_LEN * 8 * ranks) as u64));
    for aggregation in [Aggregation::Star, Aggregation::Tree, Aggregation::Ring] {
        group.bench_with_input(
            BenchmarkId::new(aggregation.to_string().to_lowercase(), ranks),
            &aggregation,
            |b, &a| b.iter_custom(|iters| superstep_fold(ranks, a, iters)),
        );
    }
    group.finish();
}

criterion_group!(benches, aggregation, fold);
criterion_main!(benches);
